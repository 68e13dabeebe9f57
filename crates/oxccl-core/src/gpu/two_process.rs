//! Copy-engine collectives between two processes of one host, one GPU each
//! (the way PyTorch runs): what the two ranks tell each other per call, how
//! they agree, and which peer mappings to keep, decided here without
//! touching a GPU (`oxccl_cuda::exec` does the driver calls and the socket I/O).
//!
//! Why: with one process per GPU every collective ran on the ring kernels,
//! which move ~255–325 GB/s of bus bandwidth at 1 GB (all-gather 254 against
//! NCCL's 271, all-reduce 320–325 against 326–344: docs/performance-gpu.md,
//! 2×H200, 2026-11-30), while one copy engine pulls ~390 GB/s from the peer each
//! way and takes no SM (scripts/ce-probe.sh). Two GPUs driven by one process
//! already use the engines ([`super::copy_engine`], [`super::copy_engine_reduce`]) because
//! that process knows both ranks' pointers; two processes do not. So per
//! qualifying call (large enough for the engines: the same bounds as `-g 2`)
//! each rank sends the other one [`Msg`]: the call, and for its send and
//! receive buffers the allocation's CUDA IPC handle, its unique buffer id
//! and the pointer's offset in it. Each rank opens the peer's allocations
//! (kept per buffer id in a [`Cache`], so a training loop's buffers are
//! opened once), answers whether that worked, and when both did, both
//! queue the plans of `-g 2` (the peer's pointers are its mapped ones;
//! all-gathers, sends and the all-reduce's gather push instead of pull, and
//! out-of-place reductions push their reducing phase too, see [`plan`] and
//! [`pushable`]), with a barrier kernel
//! on the ring's device counters between the phases
//! (`oxccl_ring_barrier`, which observes abort and the timeout).
//!
//! Measured (2×H200, 2026-11-30, `oxccl perf --ranks 2 --compare`, NCCL
//! 2.28.9 beside it on the same machine): all-gather 1.32–1.47× NCCL from 128 MB to
//! 4 GB (379–388 GB/s from 1 GB; the ring kernels 298–301), all-reduce
//! 1.03–1.08× from 256 MB (the ring 0.90–0.99×), reduce-scatter 1.15–1.27×
//! from 256 MB (the ring 0.94–1.14×), broadcast 1.02–1.04× from 128 MB (the
//! ring 0.91–0.92×); see docs/performance-gpu.md. With the all-reduce's
//! gather pushed: 356 / 362 / 366 GB/s at 1 / 2 / 4 GiB
//! (1.07–1.09× NCCL). With out-of-place reductions pushed (the last
//! piece halved): all-reduce 373–380 GB/s from 1 GiB (1.09–1.12×),
//! reduce-scatter 1.29–1.37× from 256 MiB to 1 GiB, 1.24–1.25× at 2–4 GiB.
//!
//! Both ranks decide every step from what both sent, so they always take
//! the same path: the engines, or the ring kernel when either buffer cannot
//! be exported (a VMM allocation: `cuMemCreate`, PyTorch's expandable
//! segments, `ncclMemAlloc`), either open failed, or the calls differ (an
//! error naming both calls: a mismatched collective would hang the ring).

use super::copy_engine::{self as ce, Plan};
use super::copy_engine_reduce as ce_reduce;
use crate::{DataType, Error, Result};

/// The bootstrap connection index of the per-call channel (the network
/// path uses 0..16 with peers of other hosts; this one is with a peer of
/// this host).
pub const STREAM_INDEX: u32 = 0xF0;

/// Peer allocations kept open per communicator. A training loop passes a
/// handful of buffers (PyTorch's caching allocator hands out pieces of a
/// few large segments); past this the least recently used is closed, after
/// the context is synchronised.
pub const CACHE_SLOTS: usize = 64;

/// The byte bounds of one pair of ranks: copies as `OXCCL_CUDA_CE_MIN`
/// ([`ce::worth_it`]: per pull, twice that one way), all-reduces and
/// reduce-scatters (send buffer bytes) apart. 0: never.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Copying collectives.
    pub copy: u64,
    /// All-reduce: from here a call goes to the engines when both ranks
    /// push ([`declined`] sends a pulled one below `pull_ar` back).
    pub ar: u64,
    /// Reduce-scatter, as `ar`.
    pub rs: u64,
    /// Bytes per pushed piece of a reduction whose calls are both out of
    /// place ([`pushable`], [`ce_reduce::plan_pushed`]); 0: reductions pull.
    pub push: u64,
    /// All-reduce pulled through the scratch ring (in place, or `push` 0):
    /// at least `ar`.
    pub pull_ar: u64,
    /// Reduce-scatter pulled, as `pull_ar`.
    pub pull_rs: u64,
    /// Copy streams a pushed reduction's pieces alternate on (1 or 2:
    /// [`ce_reduce::PushedPlan::streams`], `OXCCL_CUDA_CE_PUSH_STREAMS`).
    pub push_streams: u64,
}

impl Bounds {
    /// Never the engines.
    pub const OFF: Bounds = Bounds {
        copy: 0,
        ar: 0,
        rs: 0,
        push: 0,
        pull_ar: 0,
        pull_rs: 0,
        push_streams: 1,
    };
}

/// The default bound ([`super::config::DEFAULT_CE_PUSH_PIECE`] says why).
pub use super::config::DEFAULT_CE_PUSH_PIECE as PUSH_PIECE;

/// Least bytes per pushed piece unless the setting is lower.
pub const PUSH_PIECE_MIN: u64 = 16 << 20;

/// Bytes per pushed piece for a call whose larger part is `part` bytes, at
/// most `max` (the setting): a quarter of the part, between
/// [`PUSH_PIECE_MIN`] and `max`. Below 1 GiB the pipeline's fill (the
/// first piece's copy before any reduction) shows: 256 MiB all-reduces and
/// reduce-scatters (128 MiB parts) moved 341 / 313 GB/s in 32 MiB pieces
/// against 331–332 / 301 in 64 MiB ones (same machine and day as [`PUSH_PIECE`]).
pub fn push_piece(part: u64, max: u64) -> u64 {
    (part / 4).max(PUSH_PIECE_MIN).min(max)
}

/// All-reduces of two processes take the engines from 256 MiB by default
/// (`-g 2`: 512 MiB, [`ce_reduce::DEFAULT_AR_MIN`]): what they would run
/// instead is the ring kernel, slower than `-g 2`'s pair kernel. 2×H200,
/// 2026-11-30: 256 MiB 840 µs on the engines against 888-907 on
/// the ring (NCCL ~890), 128 MiB 472 against 456-471 (even), 512 MiB 1,583
/// against 1,752.
pub const XP_AR_MIN: u64 = 256 << 20;

/// Reduce-scatters of two processes take the engines from 256 MiB of send
/// buffer (`-g 2`: 2 × 512 MiB): the ring kernel's reduce-scatter stays at
/// ~270-285 GB/s from 256 MiB while the engines reach 291 (256 MiB) to 346
/// (4 GiB); 128 MiB is even (265 against 261 µs), 64 MiB the ring's (143
/// against 157). 2×H200, 2026-11-30.
pub const XP_RS_MIN: u64 = 256 << 20;

/// All-reduces and reduce-scatters (send buffer bytes) of two processes
/// whose buffers are apart on both ranks, pushed ([`ce_reduce::plan_pushed`]),
/// take the engines from 128 MiB by default: 2×H200, 2026-11-30,
/// two rounds, 128 MiB all-reduces 426-432 µs pushed against 455-458 on the
/// ring kernel (NCCL ~471), reduce-scatters 241-245 against 262-267 (NCCL
/// ~297); at 64 MiB pushes were even with the ring.
/// Pulled (in place) they lost at 128 MiB (all-reduces 470-477 against
/// 455-462, reduce-scatters 283-284 against 262-265), so those keep
/// [`XP_AR_MIN`] / [`XP_RS_MIN`] ([`declined`]).
pub const XP_PUSH_MIN: u64 = 128 << 20;

const MAGIC: u32 = 0x5058_584f; // "OXXP"
/// Bytes of an encoded [`Msg`].
pub const MSG_LEN: usize = 4 + 8 + 4 + 4 + 8 + 8 + 3 * BUF_LEN + 8 * DEAD_MAX;

/// Freed allocations a message can report (ids; see [`Exports`]).
pub const DEAD_MAX: usize = 4;
const BUF_LEN: usize = 8 + 8 + 8 + 8 + 8 + 64;

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    /// All-gather, `count` bytes per rank.
    AllGather,
    /// Broadcast of `count` bytes from `root`.
    Broadcast {
        /// The root rank.
        root: u32,
    },
    /// All-reduce of `count` elements.
    AllReduce,
    /// Reduce-scatter of `count` elements per rank.
    ReduceScatter,
    /// A group's send of `count` bytes to the peer and receive of `recv`
    /// bytes from it (either may be 0: one way).
    SendRecv {
        /// Bytes received.
        recv: u64,
    },
}

impl Coll {
    fn code(self) -> (u8, u32, u64) {
        match self {
            Coll::AllGather => (1, 0, 0),
            Coll::Broadcast { root } => (2, root, 0),
            Coll::AllReduce => (3, 0, 0),
            Coll::ReduceScatter => (4, 0, 0),
            Coll::SendRecv { recv } => (5, 0, recv),
        }
    }
    fn of(code: u8, root: u32, extra: u64) -> Option<Coll> {
        Some(match code {
            1 => Coll::AllGather,
            2 => Coll::Broadcast { root },
            3 => Coll::AllReduce,
            4 => Coll::ReduceScatter,
            5 => Coll::SendRecv { recv: extra },
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Coll::AllGather => "all_gather",
            Coll::Broadcast { .. } => "broadcast",
            Coll::AllReduce => "all_reduce",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::SendRecv { .. } => "send/receive",
        }
    }
}

/// One rank's call as it made it (its own pointers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// Which collective.
    pub coll: Coll,
    /// Bytes (copying collectives) or elements (reductions); per rank for
    /// all-gather and reduce-scatter.
    pub count: u64,
    /// Element type (copying collectives: `Uint8`).
    pub dtype: DataType,
    /// Operator (copying collectives: `Sum`).
    pub op: ce_reduce::Op,
    /// Send buffer.
    pub input: u64,
    /// Receive buffer.
    pub output: u64,
}

impl Call {
    /// Bytes the call reads from its send buffer and writes to its receive
    /// buffer (what each must hold).
    pub fn lengths(&self) -> (u64, u64) {
        let sz = self.dtype.size() as u64;
        let n = self.count.saturating_mul(sz);
        match self.coll {
            Coll::AllGather => (n, n.saturating_mul(2)),
            Coll::Broadcast { .. } | Coll::AllReduce => (n, n),
            Coll::ReduceScatter => (n.saturating_mul(2), n),
            Coll::SendRecv { recv } => (self.count, recv),
        }
    }

    fn describe(&self) -> String {
        if let Coll::SendRecv { recv } = self.coll {
            return format!("send/receive (sends {} bytes, receives {recv})", self.count);
        }
        let (i, _) = self.lengths();
        let root = match self.coll {
            Coll::Broadcast { root } => format!(" from root {root}"),
            _ => String::new(),
        };
        format!(
            "{} of {} bytes ({} x {}, {}){root}",
            self.coll.name(),
            i,
            self.count,
            self.dtype.name(),
            self.op.tag()
        )
    }

    /// Whether `o` (the peer's call) meets this one: the same call, or for
    /// send/receive the mirror (what one sends the other receives).
    fn same_shape(&self, o: &Call) -> bool {
        match (self.coll, o.coll) {
            (Coll::SendRecv { recv: a }, Coll::SendRecv { recv: b }) => {
                a == o.count && b == self.count
            }
            _ => {
                self.coll == o.coll
                    && self.count == o.count
                    && self.dtype == o.dtype
                    && self.op == o.op
            }
        }
    }

    /// Which of its buffers a rank's call shares with the peer: both, or
    /// for send/receive the receive buffer when it receives (the sender
    /// pushes into it).
    fn shared(&self) -> [bool; 2] {
        match self.coll {
            Coll::SendRecv { recv } => [false, recv > 0],
            _ => [true, true],
        }
    }

    fn ce_reduce(&self) -> Option<ce_reduce::Call> {
        let kind = match self.coll {
            Coll::AllReduce => ce_reduce::Kind::AllReduce,
            Coll::ReduceScatter => ce_reduce::Kind::ReduceScatter,
            _ => return None,
        };
        Some(ce_reduce::Call {
            kind,
            input: self.input,
            output: self.output,
            count: self.count,
            dtype: self.dtype,
            op: self.op,
        })
    }

    fn copying(&self) -> Option<ce::Copying> {
        match self.coll {
            Coll::AllGather => Some(ce::Copying::AllGather {
                input: self.input,
                output: self.output,
                bytes: self.count,
            }),
            Coll::Broadcast { root } => Some(ce::Copying::Broadcast {
                input: self.input,
                output: self.output,
                bytes: self.count,
                root,
            }),
            _ => None,
        }
    }
}

/// Whether a call of this shape goes to the engines when both buffers can
/// be shared: the `-g 2` bounds ([`ce::worth_it`] with `min` for copies,
/// [`ce_reduce::qualifies`] with `ar_min` for reductions). It depends on the
/// call's shape only, so both ranks of a matching pair decide alike before
/// they talk.
pub fn eligible(call: &Call, b: &Bounds) -> bool {
    // Stand-in pointers: only the shape matters here.
    let mut c = [*call, *call];
    c[1].input = 1 << 40;
    c[1].output = 1 << 41;
    if let Some(x) = c[0].ce_reduce() {
        let y = c[1].ce_reduce().unwrap_or(x);
        return ce_reduce::qualifies_with(&[x, y], b.ar, b.rs);
    }
    if let Coll::SendRecv { recv } = call.coll {
        // The transfers as plans (one per direction), judged as -g 2's are.
        let way = |bytes: u64| Plan {
            local: Vec::new(),
            remote: (bytes > 0)
                .then_some(ce::Xfer {
                    dst: 0,
                    src: 0,
                    bytes,
                })
                .into_iter()
                .collect(),
        };
        return ce::worth_it(&[way(call.count), way(recv)], b.copy);
    }
    match (c[0].copying(), c[1].copying()) {
        (Some(x), Some(y)) => ce::pair_collective([x, y]).is_some_and(|p| ce::worth_it(&p, b.copy)),
        _ => false,
    }
}

/// A group's transfers with `peer` as one send/receive call for the copy
/// engines (`sends` and `recvs`: (rank, pointer, bytes)), or `None`: more
/// than one send to or receive from the peer, or a transfer with a third
/// rank. Transfers of this rank with itself are left out (they run beside
/// the engines): both ranks must judge the same thing, and what passes
/// between them each sees alike (one's send is the other's receive),
/// while only a scatter's or gather's root copies to itself. Judged with
/// its copy, the root stayed on the ring kernel while its peer waited on
/// the engines (2 processes, 128 MiB or more to the peer, 2×H200, 2026-11-30).
pub fn p2p_call(
    sends: &[(usize, u64, usize)],
    recvs: &[(usize, u64, usize)],
    rank: usize,
    peer: usize,
) -> Option<Call> {
    let with_peer = |v: &[(usize, u64, usize)]| -> Option<Option<(u64, u64)>> {
        let mut it = v.iter().filter(|x| x.0 != rank);
        let first = it.next();
        if it.next().is_some() || first.is_some_and(|x| x.0 != peer) {
            return None;
        }
        Some(first.map(|x| (x.1, x.2 as u64)))
    };
    let (input, count) = with_peer(sends)?.unwrap_or((0, 0));
    let (output, recv) = with_peer(recvs)?.unwrap_or((0, 0));
    Some(Call {
        coll: Coll::SendRecv { recv },
        count,
        dtype: DataType::Uint8,
        op: ce_reduce::Op::Sum,
        input,
        output,
    })
}

/// A buffer as its owner shares it: the allocation's IPC handle, id, base
/// and size, and the pointer's offset in it. `ok` false: it cannot be
/// shared (not exportable), the other fields are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    /// Exportable.
    pub ok: bool,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID` (unique per allocation in the
    /// owner's process for its lifetime; never 0 for a real one).
    pub id: u64,
    /// The allocation's base address in the owner's process.
    pub base: u64,
    /// The allocation's size.
    pub size: u64,
    /// The pointer's offset from `base`.
    pub offset: u64,
    /// `cuIpcGetMemHandle`'s bytes.
    pub handle: [u8; 64],
}

impl Buf {
    /// A buffer that cannot be shared.
    pub const NONE: Buf = Buf {
        ok: false,
        id: 0,
        base: 0,
        size: 0,
        offset: 0,
        handle: [0; 64],
    };
}

/// What a rank sends per qualifying call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg {
    /// Which qualifying call of the communicator this is (0, 1, ...): both
    /// ranks count alike, so a difference means they got out of step.
    pub seq: u64,
    /// The call's shape (pointers zero: they mean nothing to the peer).
    pub call: Call,
    /// Send and receive buffer.
    pub bufs: [Buf; 2],
    /// This rank's copy-engine scratch, shared for an in-place all-reduce
    /// or reduce-scatter whose pieces the peer may push
    /// ([`in_place_pushable`], `OXCCL_CUDA_CE_PUSH_IN_PLACE`), else
    /// [`Buf::NONE`].
    pub stage: Buf,
    /// Ids of this rank's allocations, shared by earlier calls, that it
    /// has freed since (0: none): the peer closes its mappings of them.
    pub dead: [u64; DEAD_MAX],
}

fn op_code(op: ce_reduce::Op) -> u8 {
    match op {
        ce_reduce::Op::Sum => 0,
        ce_reduce::Op::Prod => 1,
        ce_reduce::Op::Max => 2,
        ce_reduce::Op::Min => 3,
    }
}

fn op_of(c: u8) -> Option<ce_reduce::Op> {
    Some(match c {
        0 => ce_reduce::Op::Sum,
        1 => ce_reduce::Op::Prod,
        2 => ce_reduce::Op::Max,
        3 => ce_reduce::Op::Min,
        _ => return None,
    })
}

impl Msg {
    /// Fixed-length little-endian bytes ([`MSG_LEN`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(MSG_LEN);
        let (code, root, extra) = self.call.coll.code();
        v.extend_from_slice(&MAGIC.to_le_bytes());
        v.extend_from_slice(&self.seq.to_le_bytes());
        v.extend_from_slice(&[code, self.call.dtype as i32 as u8, op_code(self.call.op), 0]);
        v.extend_from_slice(&root.to_le_bytes());
        v.extend_from_slice(&self.call.count.to_le_bytes());
        v.extend_from_slice(&extra.to_le_bytes());
        for b in self.bufs.iter().chain([&self.stage]) {
            v.extend_from_slice(&(b.ok as u64).to_le_bytes());
            v.extend_from_slice(&b.id.to_le_bytes());
            v.extend_from_slice(&b.base.to_le_bytes());
            v.extend_from_slice(&b.size.to_le_bytes());
            v.extend_from_slice(&b.offset.to_le_bytes());
            v.extend_from_slice(&b.handle);
        }
        for d in &self.dead {
            v.extend_from_slice(&d.to_le_bytes());
        }
        debug_assert_eq!(v.len(), MSG_LEN);
        v
    }

    /// The message in `b`, or an error naming what is wrong with it.
    pub fn decode(b: &[u8]) -> Result<Msg> {
        let bad = |what: &str| {
            Error::internal(format!(
                "copy-engine exchange: the peer's message is malformed ({what})"
            ))
        };
        if b.len() != MSG_LEN {
            return Err(bad(&format!("{} bytes, expected {MSG_LEN}", b.len())));
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
        if u32_at(0) != MAGIC {
            return Err(bad("no magic"));
        }
        let seq = u64_at(4);
        let coll = Coll::of(b[12], u32_at(16), u64_at(28)).ok_or_else(|| bad("collective"))?;
        let dtype = DataType::from_raw(b[13] as i32).map_err(|_| bad("datatype"))?;
        let op = op_of(b[14]).ok_or_else(|| bad("op"))?;
        let count = u64_at(20);
        let mut bufs = [Buf::NONE; 3];
        for (i, buf) in bufs.iter_mut().enumerate() {
            let o = 36 + i * BUF_LEN;
            let mut handle = [0u8; 64];
            handle.copy_from_slice(&b[o + 40..o + 104]);
            *buf = Buf {
                ok: u64_at(o) == 1,
                id: u64_at(o + 8),
                base: u64_at(o + 16),
                size: u64_at(o + 24),
                offset: u64_at(o + 32),
                handle,
            };
        }
        let mut dead = [0u64; DEAD_MAX];
        for (i, d) in dead.iter_mut().enumerate() {
            *d = u64_at(36 + 3 * BUF_LEN + 8 * i);
        }
        let [b0, b1, stage] = bufs;
        Ok(Msg {
            seq,
            dead,
            stage,
            call: Call {
                coll,
                count,
                dtype,
                op,
                input: 0,
                output: 0,
            },
            bufs: [b0, b1],
        })
    }
}

/// What the first message says about the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Both buffers of both ranks can be shared: open the peer's.
    Engines,
    /// Some buffer cannot: both ranks run the ring kernel.
    Kernel,
}

/// Checks the peer's message against this rank's (`peer`: its rank, for
/// the error). Calls that differ, or a peer out of step, are errors that
/// name both calls; a buffer that cannot be shared is [`Verdict::Kernel`]; a
/// shared range past its allocation is an error (never mapped).
pub fn check(mine: &Msg, theirs: &Msg, peer: usize) -> Result<Verdict> {
    if mine.seq != theirs.seq {
        return Err(Error::internal(format!(
            "copy-engine exchange out of step with rank {peer}: this rank is at its call {}, \
             rank {peer} at {}",
            mine.seq, theirs.seq
        )));
    }
    if !mine.call.same_shape(&theirs.call) {
        return Err(Error::invalid_usage(format!(
            "rank {peer} called {} where this rank called {}: every rank must make the same \
             collective calls in the same order",
            theirs.call.describe(),
            mine.call.describe()
        )));
    }
    let needed = |m: &Msg| {
        let sh = m.call.shared();
        m.bufs.iter().zip(sh).all(|(b, need)| b.ok || !need)
    };
    if !needed(mine) || !needed(theirs) {
        return Ok(Verdict::Kernel);
    }
    // Both messages, so both ranks reach the same verdict (one erring while
    // the other went on would leave the other waiting for its answer).
    for (m, who) in [
        (theirs, format!("rank {peer}'s")),
        (mine, "this rank's".to_string()),
    ] {
        let (inl, outl) = m.call.lengths();
        let sh = m.call.shared();
        for (b, len, what, need) in [
            (&m.bufs[0], inl, "sendbuff", sh[0]),
            (&m.bufs[1], outl, "recvbuff", sh[1]),
        ] {
            let end = b.offset as u128 + len as u128;
            if need && (b.id == 0 || end > b.size as u128) {
                return Err(Error::internal(format!(
                    "copy-engine exchange: {who} {what} ({len} bytes at offset {} of an \
                     allocation of {} bytes, id {}) does not fit its allocation",
                    b.offset, b.size, b.id
                )));
            }
        }
    }
    Ok(Verdict::Engines)
}

/// This rank's plan for a checked pair: `mine` with this rank's pointers,
/// `peer_call` with the peer's pointers as mapped here; `rank` this rank's
/// (0 or 1); `scratch` this rank's copy-engine reduction ring (reductions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankPlan {
    /// Barrier, copies, barrier ([`ce::Plan`]).
    Copy(Plan),
    /// The copy-engine reduction ([`ce_reduce::RankPlan`]).
    Reduce(ce_reduce::RankPlan),
    /// The reduction with pushed pieces ([`ce_reduce::PushedPlan`]).
    Pushed(ce_reduce::PushedPlan),
}

/// Whether a pair's reduction may take pushed pieces: on both ranks the
/// send and receive buffers do not overlap (different allocations, or
/// disjoint ranges of one), since the peer writes this rank's input part
/// values into its output before it reads its input. In place (PyTorch's
/// all_reduce, nccl-tests' in-place half) keeps the pulls through the
/// scratch ring. Both ranks decide from both messages, so alike.
pub fn pushable(mine: &Msg, theirs: &Msg) -> bool {
    [mine, theirs].iter().all(|m| {
        let [i, o] = &m.bufs;
        let (li, lo) = m.call.lengths();
        i.ok && o.ok && (i.id != o.id || i.offset + li <= o.offset || o.offset + lo <= i.offset)
    })
}

/// Whether a pair's reduction, in place on both ranks, pushes its pieces
/// ([`ce_reduce::plan_pushed_in_place`] for an all-reduce,
/// [`ce_reduce::plan_pushed_ring`] for a reduce-scatter): on both ranks the
/// receive buffer is the send buffer at the rank's part (NCCL's in place)
/// and both shared their scratch (which each does only with
/// `OXCCL_CUDA_CE_PUSH_IN_PLACE` set, [`in_place`]). `rank`: this rank's
/// (0 or 1). Both decide from both messages, so alike.
pub fn in_place_pushable(mine: &Msg, theirs: &Msg, rank: usize) -> bool {
    [(mine, rank), (theirs, 1 - rank.min(1))]
        .iter()
        .all(|(m, r)| m.stage.ok && in_place(&m.call, &m.bufs, *r))
}

/// Whether rank `rank`'s all-reduce or reduce-scatter is in place as NCCL
/// defines it: the receive buffer is the send buffer (all-reduce) or the
/// send buffer at the rank's part (reduce-scatter), both shared.
pub fn in_place(call: &Call, bufs: &[Buf; 2], rank: usize) -> bool {
    let [i, o] = bufs;
    let part = match call.coll {
        Coll::AllReduce => 0,
        Coll::ReduceScatter => call.count.saturating_mul(call.dtype.size() as u64),
        _ => return false,
    };
    i.ok && o.ok && i.id == o.id && o.offset == i.offset.saturating_add(part * rank as u64)
}

/// A reduction that went to the engines by its shape ([`eligible`], from
/// the pushed bounds) but whose buffers make it pull ([`pushable`] and
/// [`in_place_pushable`] fail, or pushes are off), below the pulled bounds:
/// both ranks run the ring kernel instead (both decide alike from the two
/// messages). `rank`: this rank's.
pub fn declined(mine: &Msg, theirs: &Msg, b: &Bounds, rank: usize) -> bool {
    let pushed = b.push > 0 && (pushable(mine, theirs) || in_place_pushable(mine, theirs, rank));
    if mine.call.ce_reduce().is_none() || pushed {
        return false;
    }
    let pulled = Bounds {
        ar: b.pull_ar,
        rs: b.pull_rs,
        ..*b
    };
    !eligible(&mine.call, &pulled)
}

/// The plans of a checked pair, or `None` when the shape does not go to
/// the engines after all (never, when [`eligible`] said it did).
/// `push`: [`pushable`] held (reductions then push when `b.push` > 0);
/// `stage`: [`in_place_pushable`] held, with this rank's scratch and the
/// peer's as mapped here (an in-place reduction then pushes when pushes
/// are on, `b.push` above 0, and its pieces can land:
/// [`ce_reduce::plan_pushed_in_place`], [`ce_reduce::plan_pushed_ring`]).
pub fn plan(
    mine: &Call,
    peer_call: &Call,
    rank: usize,
    scratch: u64,
    b: &Bounds,
    push: bool,
    stage: Option<[u64; 2]>,
) -> Option<RankPlan> {
    if rank > 1 {
        return None;
    }
    let mut calls = [*mine, *peer_call];
    if rank == 1 {
        calls.swap(0, 1);
    }
    if let Coll::SendRecv { .. } = mine.coll {
        // Push what this rank sends into the peer's receive buffer (as the
        // all-gather below); a rank that only receives copies nothing.
        if !eligible(mine, b) {
            return None;
        }
        let mut p = Plan::default();
        if mine.count > 0 {
            p.remote.push(ce::Xfer {
                dst: peer_call.output,
                src: mine.input,
                bytes: mine.count,
            });
        }
        return Some(RankPlan::Copy(p));
    }
    if let (Some(a), Some(c)) = (calls[0].ce_reduce(), calls[1].ce_reduce()) {
        let streams = b.push_streams.clamp(1, 2) as u32;
        if let (Some([s_mine, s_peer]), true) = (stage, b.push > 0) {
            let both = if rank == 0 {
                [s_mine, s_peer]
            } else {
                [s_peer, s_mine]
            };
            let part = ce_reduce::largest_part_bytes(a.kind, a.count, a.dtype);
            let piece = push_piece(part, b.push);
            let planned = match a.kind {
                ce_reduce::Kind::AllReduce => ce_reduce::plan_pushed_in_place(
                    &[a, c],
                    rank,
                    piece,
                    both,
                    ce_reduce::FLAGS_OFFSET,
                ),
                ce_reduce::Kind::ReduceScatter => {
                    ce_reduce::plan_pushed_ring(&[a, c], rank, piece, both, ce_reduce::RING)
                }
            };
            if let Some(p) = planned {
                if !ce_reduce::qualifies_with(&[a, c], b.ar, b.rs) {
                    return None;
                }
                return Some(RankPlan::Pushed(ce_reduce::PushedPlan { streams, ..p }));
            }
        }
        if push && b.push > 0 {
            if !ce_reduce::qualifies_with(&[a, c], b.ar, b.rs) {
                return None;
            }
            // Pushing the reducing phase too, as the all-gather and the
            // gather below do: see ce_reduce::PushedPlan for why no wait of
            // one rank's stream is on the other's.
            let part = ce_reduce::largest_part_bytes(a.kind, a.count, a.dtype);
            return Some(RankPlan::Pushed(ce_reduce::PushedPlan {
                streams,
                ..ce_reduce::plan_pushed(&[a, c], rank, push_piece(part, b.push))
            }));
        }
        let [p0, p1] = ce_reduce::pair_with([a, c], [scratch, scratch], b.pull_ar, b.pull_rs)?;
        let mut p = if rank == 0 { p0 } else { p1 };
        // An all-reduce's gather pushes this rank's reduced part into the
        // peer's output instead of pulling the peer's part (as the
        // all-gather below): 356 / 362 / 366 GB/s at 1 / 2 / 4 GiB against
        // pulls' 348 / 354 / 358 (2 processes, 2xH200, 2026-11-30, two
        // rounds each). After the middle barrier that range of
        // the peer's output is free: the peer's kernel writes only its own
        // part, and this rank's pulls from the peer's input there (the same
        // memory when in place) are done.
        if a.kind == ce_reduce::Kind::AllReduce {
            let sz = a.dtype.size() as u64;
            let (lo, hi) = ce_reduce::part(a.kind, a.count, a.dtype, rank);
            p.gather = vec![ce::Xfer {
                dst: peer_call.output + lo * sz,
                src: mine.output + lo * sz,
                bytes: (hi - lo) * sz,
            }];
            p.gather.retain(|x| x.bytes > 0);
        }
        return Some(RankPlan::Reduce(p));
    }
    let plans = ce::pair_collective([calls[0].copying()?, calls[1].copying()?])?;
    if !ce::worth_it(&plans, b.copy) {
        return None;
    }
    let [p0, p1] = plans;
    let mut p = if rank == 0 { p0 } else { p1 };
    if mine.coll == Coll::AllGather {
        // Push instead of pull: this rank's engine writes its input into
        // the peer's output. Same bytes over the same links, but two
        // processes pulling while their local copies write the same
        // output moved 346-351 GB/s at 1-4 GB out of place (371 in place,
        // no local copy), pushing 380-388 (2xH200, 2026-11-30;
        // `-g 2`'s pulls reach 378-387 and keep pulling).
        p.remote = vec![ce::Xfer {
            dst: peer_call.output + rank as u64 * mine.count,
            src: mine.input,
            bytes: mine.count,
        }];
    }
    Some(RankPlan::Copy(p))
}

/// The peer's call with its pointers translated into this process:
/// `mapped[i]` is where the peer's allocation of `theirs.bufs[i]` is mapped
/// here.
pub fn translate(theirs: &Msg, mapped: [u64; 2]) -> Call {
    let mut c = theirs.call;
    c.input = mapped[0] + theirs.bufs[0].offset;
    c.output = mapped[1] + theirs.bufs[1].offset;
    c
}

/// The peer allocations open in this process, by the peer's buffer id,
/// least recently used first out.
#[derive(Debug)]
pub struct Cache {
    cap: usize,
    tick: u64,
    entries: Vec<(u64, u64, u64)>, // (id, mapped base, last use)
}

impl Cache {
    /// Empty, holding at most `cap` (≥ 1).
    pub fn new(cap: usize) -> Cache {
        Cache {
            cap: cap.max(1),
            tick: 0,
            entries: Vec::new(),
        }
    }

    /// Where allocation `id` is mapped, marking it used.
    pub fn get(&mut self, id: u64) -> Option<u64> {
        self.tick += 1;
        let t = self.tick;
        self.entries.iter_mut().find(|e| e.0 == id).map(|e| {
            e.2 = t;
            e.1
        })
    }

    /// Whether the cache is full (an insert would evict).
    pub fn full(&self) -> bool {
        self.entries.len() >= self.cap
    }

    /// Records `id` mapped at `mapped`; returns the evicted mapping (to
    /// close) when the cache was full.
    pub fn insert(&mut self, id: u64, mapped: u64) -> Option<u64> {
        self.tick += 1;
        let mut out = None;
        if self.full() {
            if let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].2) {
                out = Some(self.entries.swap_remove(i).1);
            }
        }
        self.entries.push((id, mapped, self.tick));
        out
    }

    /// Forgets allocation `id`; its mapping (to close), if it was held.
    pub fn remove(&mut self, id: u64) -> Option<u64> {
        let i = self.entries.iter().position(|e| e.0 == id)?;
        Some(self.entries.swap_remove(i).1)
    }

    /// Every mapping (to close them all).
    pub fn drain(&mut self) -> Vec<u64> {
        self.entries.drain(..).map(|e| e.1).collect()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// This rank's allocations as shared with the peer: per buffer id, the
/// allocation's base and its IPC handle (`None`: not exportable), and the
/// ids found freed since, to report.
///
/// Why: the peer keeps a mapping of every allocation it opened ([`Cache`]),
/// and CUDA leaves freeing an exported allocation before the importer
/// closes it undefined (the physical memory may stay held by the mapping).
/// So each call this rank looks whether the allocations it shared are
/// still there (the buffer id at their base, [`Exports::sweep`]) and tells
/// the peer which are gone ([`Msg::dead`]); the peer closes those. A freed
/// allocation is no longer used by any call of the peer: this rank's free
/// came after the call's last barrier on its stream, which the peer passes
/// only once its copies are done.
#[derive(Debug, Default)]
pub struct Exports {
    entries: std::collections::HashMap<u64, (u64, Option<[u8; 64]>)>,
    dead: std::collections::VecDeque<u64>,
}

impl Exports {
    /// Most entries kept: past this (a program that frees nothing it
    /// shared is rare), the book starts over (its entries are only a
    /// cache of handles; the peer's mappings are unaffected).
    pub const MAX: usize = 4096;

    /// The handle of allocation `id`, when known.
    pub fn get(&self, id: u64) -> Option<Option<[u8; 64]>> {
        self.entries.get(&id).map(|e| e.1)
    }

    /// Records allocation `id` at `base` and its handle.
    pub fn insert(&mut self, id: u64, base: u64, handle: Option<[u8; 64]>) {
        if self.entries.len() >= Self::MAX {
            self.entries.clear();
        }
        self.entries.insert(id, (base, handle));
    }

    /// Looks at every allocation shared so far: `alive(base)` gives the id
    /// of the allocation at `base` now (`None`: none). One with another id,
    /// or none, was freed: it leaves the book, and a shared one (with a
    /// handle) is queued for the peer.
    pub fn sweep(&mut self, alive: impl Fn(u64) -> Option<u64>) {
        let gone: Vec<(u64, bool)> = self
            .entries
            .iter()
            .filter(|(id, e)| alive(e.0) != Some(**id))
            .map(|(id, e)| (*id, e.1.is_some()))
            .collect();
        for (id, shared) in gone {
            self.entries.remove(&id);
            if shared && !self.dead.contains(&id) {
                self.dead.push_back(id);
            }
        }
    }

    /// Up to [`DEAD_MAX`] freed ids for the next message (0: none); the
    /// rest wait for later calls.
    pub fn take_dead(&mut self) -> [u64; DEAD_MAX] {
        let mut out = [0u64; DEAD_MAX];
        for o in out.iter_mut() {
            match self.dead.pop_front() {
                Some(id) => *o = id,
                None => break,
            }
        }
        out
    }

    /// Allocations in the book.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the book is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The bounds both ranks use, agreed at setup: a rank's own bounds when
/// the peer's are the same, else none (the engines off for the pair, and a
/// line saying so): a rank that took the engines where its peer did not
/// would wait for it at a barrier until the timeout.
pub fn agree_bounds(mine: Bounds, theirs: Bounds) -> Bounds {
    if mine == theirs {
        mine
    } else {
        Bounds::OFF
    }
}

impl Bounds {
    /// [`Bounds::LEN`] little-endian bytes.
    pub fn encode(&self) -> Vec<u8> {
        [
            self.copy,
            self.ar,
            self.rs,
            self.push,
            self.pull_ar,
            self.pull_rs,
            self.push_streams,
        ]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
    }

    /// Bytes of [`Bounds::encode`].
    pub const LEN: usize = 56;

    /// From [`Bounds::encode`]'s bytes (`None`: not [`Bounds::LEN`] of them).
    pub fn decode(b: &[u8]) -> Option<Bounds> {
        if b.len() != Self::LEN {
            return None;
        }
        let at = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        Some(Bounds {
            copy: at(0),
            ar: at(1),
            rs: at(2),
            push: at(3),
            pull_ar: at(4),
            pull_rs: at(5),
            push_streams: at(6),
        })
    }

    /// The bounds from the settings: `copy` is `OXCCL_CUDA_CE_MIN`'s value;
    /// `ar_set` `OXCCL_CUDA_CE_AR_MIN` when set (then reduce-scatters from
    /// [`ce_reduce::RS_FACTOR`] times it, as for `-g 2`, pushed or pulled),
    /// else pulled from [`XP_AR_MIN`] and [`XP_RS_MIN`], pushed from
    /// [`XP_PUSH_MIN`] when `push` (`OXCCL_CUDA_CE_PUSH`'s) is not 0.
    pub fn from_settings(copy: u64, ar_set: Option<u64>, push: u64) -> Bounds {
        match ar_set {
            Some(v) => {
                let rs = v.saturating_mul(ce_reduce::RS_FACTOR);
                Bounds {
                    copy,
                    ar: v,
                    rs,
                    push,
                    pull_ar: v,
                    pull_rs: rs,
                    push_streams: 1,
                }
            }
            None => {
                let pushed = |pulled: u64| {
                    if push > 0 {
                        XP_PUSH_MIN.min(pulled)
                    } else {
                        pulled
                    }
                };
                Bounds {
                    copy,
                    ar: pushed(XP_AR_MIN),
                    rs: pushed(XP_RS_MIN),
                    push,
                    pull_ar: XP_AR_MIN,
                    pull_rs: XP_RS_MIN,
                    push_streams: 1,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` pseudo-random bytes (xorshift64 from `*state`, which advances):
    /// for decoders that must refuse any input without panicking.
    fn noise(state: &mut u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                *state ^= *state << 13;
                *state ^= *state >> 7;
                *state ^= *state << 17;
                *state as u8
            })
            .collect()
    }

    fn call(coll: Coll, count: u64, dtype: DataType, op: ce_reduce::Op) -> Call {
        Call {
            coll,
            count,
            dtype,
            op,
            input: 0x7000_0000,
            output: 0x9000_0000,
        }
    }

    fn buf(id: u64, size: u64, offset: u64) -> Buf {
        let mut handle = [0u8; 64];
        for (i, h) in handle.iter_mut().enumerate() {
            *h = (i as u8).wrapping_mul(7).wrapping_add(id as u8);
        }
        Buf {
            ok: true,
            id,
            base: 0x1_0000_0000 * id,
            size,
            offset,
            handle,
        }
    }

    /// A call of this rank and the peer's matching one (its pointers as
    /// mapped here).
    fn mine_and_peer(coll: Coll, count: u64) -> (Call, Call) {
        let mine = Call {
            input: 0x1000,
            output: 0x10_0000,
            ..call(coll, count, DataType::Uint8, ce_reduce::Op::Sum)
        };
        let peer = Call {
            input: 0x7f00_0000_0000,
            output: 0x7f10_0000_0000,
            ..mine
        };
        (mine, peer)
    }

    /// Rank 0's and rank 1's all-reduce of 1 GiB of float32 with `op`, at
    /// addresses apart.
    fn all_reduce_pair(op: ce_reduce::Op) -> (Call, Call) {
        let a = Call {
            input: 0x1000_0000,
            output: 0x2000_0000,
            ..call(Coll::AllReduce, GIB / 4, DataType::Float32, op)
        };
        let b = Call {
            input: 0x7000_0000_0000,
            output: 0x7100_0000_0000,
            ..a
        };
        (a, b)
    }

    fn msg(seq: u64, c: Call, bufs: [Buf; 2]) -> Msg {
        let mut c = c;
        c.input = 0;
        c.output = 0;
        Msg {
            seq,
            call: c,
            bufs,
            stage: Buf::NONE,
            dead: [0; DEAD_MAX],
        }
    }

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn messages_round_trip_for_every_collective_type_and_op() {
        let colls = [
            Coll::AllGather,
            Coll::Broadcast { root: 1 },
            Coll::AllReduce,
            Coll::ReduceScatter,
            Coll::SendRecv { recv: 1 << 33 },
        ];
        let ops = [
            ce_reduce::Op::Sum,
            ce_reduce::Op::Prod,
            ce_reduce::Op::Max,
            ce_reduce::Op::Min,
        ];
        for (i, coll) in colls.into_iter().enumerate() {
            for t in DataType::ALL {
                for op in ops {
                    let m = msg(
                        i as u64 * 1000 + 17,
                        call(coll, 12345 + i as u64, t, op),
                        [buf(3, GIB, 64), Buf::NONE],
                    );
                    let b = m.encode();
                    assert_eq!(b.len(), MSG_LEN);
                    assert_eq!(Msg::decode(&b).unwrap(), m);
                }
            }
        }
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        let m = msg(
            0,
            call(Coll::AllGather, 8, DataType::Uint8, ce_reduce::Op::Sum),
            [buf(1, 64, 0); 2],
        );
        let good = m.encode();
        assert!(Msg::decode(&good[..MSG_LEN - 1]).is_err());
        let mut b = good.clone();
        b[0] ^= 1;
        assert!(Msg::decode(&b).unwrap_err().message().contains("magic"));
        let mut b = good.clone();
        b[12] = 9;
        assert!(Msg::decode(&b)
            .unwrap_err()
            .message()
            .contains("collective"));
        let mut b = good.clone();
        b[13] = 12;
        assert!(Msg::decode(&b).unwrap_err().message().contains("datatype"));
        let mut b = good;
        b[14] = 4;
        assert!(Msg::decode(&b).unwrap_err().message().contains("op"));
        // Any byte string of the right length decodes or errs.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let _ = Msg::decode(&noise(&mut x, MSG_LEN));
        }
    }

    #[test]
    fn eligibility_follows_the_one_process_bounds() {
        let (min, ar) = (ce::DEFAULT_MIN, ce_reduce::DEFAULT_AR_MIN);
        let b = |copy, ar| Bounds::from_settings(copy, Some(ar), 0);
        let ag = |n| call(Coll::AllGather, n, DataType::Uint8, ce_reduce::Op::Sum);
        assert!(eligible(&ag(min), &b(min, ar)));
        assert!(!eligible(&ag(min - 1), &b(min, ar)));
        assert!(!eligible(&ag(min), &b(0, ar)));
        // A broadcast pulls one way: twice the bound.
        let bc = |n| {
            call(
                Coll::Broadcast { root: 0 },
                n,
                DataType::Uint8,
                ce_reduce::Op::Sum,
            )
        };
        assert!(!eligible(&bc(min), &b(min, ar)));
        assert!(eligible(&bc(2 * min), &b(min, ar)));
        let red = |coll, n| call(coll, n, DataType::Float32, ce_reduce::Op::Sum);
        assert!(eligible(&red(Coll::AllReduce, ar / 4), &b(min, ar)));
        assert!(!eligible(&red(Coll::AllReduce, ar / 4 - 1), &b(min, ar)));
        assert!(!eligible(&red(Coll::AllReduce, ar / 4), &b(min, 0)));
        // Reduce-scatter: count per rank, RS_FACTOR times a set bound in all.
        let rs_count = ar * ce_reduce::RS_FACTOR / 2 / 4;
        assert!(eligible(&red(Coll::ReduceScatter, rs_count), &b(min, ar)));
        assert!(!eligible(
            &red(Coll::ReduceScatter, rs_count - 1),
            &b(min, ar)
        ));
        // Unset: the two-process defaults, reduce-scatters at the same bound.
        let d = Bounds::from_settings(min, None, 0);
        assert!(eligible(&red(Coll::AllReduce, XP_AR_MIN / 4), &d));
        assert!(!eligible(&red(Coll::AllReduce, XP_AR_MIN / 4 - 1), &d));
        assert!(eligible(&red(Coll::ReduceScatter, XP_RS_MIN / 8), &d));
        assert!(!eligible(&red(Coll::ReduceScatter, XP_RS_MIN / 8 - 1), &d));
    }

    #[test]
    fn check_agrees_refuses_and_names_mismatches() {
        let c = call(
            Coll::AllReduce,
            GIB / 4,
            DataType::Float32,
            ce_reduce::Op::Sum,
        );
        let a = msg(5, c, [buf(1, GIB, 0), buf(2, 2 * GIB, GIB)]);
        let b = msg(5, c, [buf(7, GIB, 0), buf(7, GIB, 0)]);
        assert_eq!(check(&a, &b, 1).unwrap(), Verdict::Engines);
        assert_eq!(check(&b, &a, 0).unwrap(), Verdict::Engines);
        // Either rank's unexportable buffer: both take the kernel.
        let mut nb = b;
        nb.bufs[1] = Buf::NONE;
        assert_eq!(check(&a, &nb, 1).unwrap(), Verdict::Kernel);
        assert_eq!(check(&nb, &a, 0).unwrap(), Verdict::Kernel);
        // Out of step.
        let late = msg(6, c, b.bufs);
        let e = check(&a, &late, 1).unwrap_err();
        assert!(e.message().contains("out of step") && e.message().contains("rank 1"));
        // Another call: both named.
        let other = msg(
            5,
            call(Coll::AllGather, GIB, DataType::Uint8, ce_reduce::Op::Sum),
            b.bufs,
        );
        let e = check(&a, &other, 1).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidUsage);
        assert!(e.message().contains("all_gather") && e.message().contains("all_reduce"));
        // A range past the peer's allocation is never mapped, and both
        // ranks say so.
        let short = msg(5, c, [buf(7, GIB - 16, 0), buf(8, GIB, 0)]);
        assert!(check(&a, &short, 1)
            .unwrap_err()
            .message()
            .contains("rank 1's sendbuff"));
        assert!(check(&short, &a, 0)
            .unwrap_err()
            .message()
            .contains("this rank's sendbuff"));
        let off = msg(5, c, [buf(7, GIB, 0), buf(8, GIB, 16)]);
        assert!(check(&a, &off, 1)
            .unwrap_err()
            .message()
            .contains("recvbuff"));
    }

    #[test]
    fn pushed_pieces_are_a_quarter_of_the_part_within_the_bounds() {
        assert_eq!(push_piece(128 * MIB, PUSH_PIECE), 32 * MIB);
        assert_eq!(push_piece(256 * MIB, PUSH_PIECE), 64 * MIB);
        assert_eq!(push_piece(2 * GIB, PUSH_PIECE), 64 * MIB);
        assert_eq!(push_piece(MIB, PUSH_PIECE), PUSH_PIECE_MIN);
        // A lower setting wins (the tests' 100,000 bytes).
        assert_eq!(push_piece(2 * GIB, 100_000), 100_000);
        assert_eq!(push_piece(MIB, 100_000), 100_000);
        // Through plan: a 256 MiB all-reduce pushes 32 MiB pieces, the last
        // one halved four times (ce_reduce::push_taper).
        let a = Call {
            input: 0x1000_0000,
            output: 0x2000_0000,
            ..call(
                Coll::AllReduce,
                64 * MIB,
                DataType::Float32,
                ce_reduce::Op::Sum,
            )
        };
        let bd = Bounds::from_settings(0, None, PUSH_PIECE);
        let Some(RankPlan::Pushed(p)) = plan(&a, &a, 0, 0, &bd, true, None) else {
            panic!("a pushed plan")
        };
        let sizes: Vec<u64> = p.pushes.iter().map(|x| x.bytes / MIB).collect();
        assert_eq!(sizes, [32, 32, 32, 16, 8, 4, 2, 2]);
    }

    #[test]
    fn in_place_all_reduces_push_when_both_share_their_scratch() {
        let c = call(
            Coll::AllReduce,
            GIB / 4,
            DataType::Float32,
            ce_reduce::Op::Sum,
        );
        let same = [buf(3, 2 * GIB, 64), buf(3, 2 * GIB, 64)];
        let apart = [buf(1, GIB, 0), buf(2, GIB, 0)];
        let with = |bufs: [Buf; 2], stage: Buf| Msg {
            stage,
            ..msg(0, c, bufs)
        };
        let scratch = buf(9, 256 * MIB, 0);
        // The message carries the scratch both ways.
        let m = with(same, scratch);
        assert_eq!(Msg::decode(&m.encode()).unwrap(), m);
        assert_eq!(m.encode().len(), MSG_LEN);
        // Both in place with their scratch: pushed in place; either one
        // without its scratch, or out of place: not.
        assert!(in_place_pushable(&m, &m, 0));
        assert!(!in_place_pushable(&m, &with(same, Buf::NONE), 0));
        assert!(!in_place_pushable(&with(same, Buf::NONE), &m, 0));
        assert!(!in_place_pushable(&with(apart, scratch), &m, 0));
        let shifted = [buf(3, 2 * GIB, 0), buf(3, 2 * GIB, 64)];
        assert!(!in_place_pushable(&with(shifted, scratch), &m, 0));
        // A reduce-scatter is in place when the receive buffer is the send
        // buffer at the rank's part: rank 0 at its start, rank 1 a part on.
        let rc = call(
            Coll::ReduceScatter,
            GIB / 8,
            DataType::Float32,
            ce_reduce::Op::Sum,
        );
        let rs = |bufs: [Buf; 2]| Msg {
            call: msg(0, rc, bufs).call,
            ..with(bufs, scratch)
        };
        let (r0, r1) = (
            rs(same),
            rs([buf(3, 2 * GIB, 64), buf(3, 2 * GIB, 64 + GIB / 2)]),
        );
        assert!(in_place_pushable(&r0, &r1, 0) && in_place_pushable(&r1, &r0, 1));
        assert!(!in_place_pushable(&r0, &r0, 0) && !in_place_pushable(&r1, &r1, 1));
        assert!(!in_place_pushable(&r1, &r0, 0));
        // Through plan: a 1 GiB in-place all-reduce pushes 64 MiB pieces,
        // the first into the peer's scratch, the later ones into the peer's
        // buffer at this rank's part, each after the peer's previous push.
        let (a, b) = all_reduce_pair(ce_reduce::Op::Sum);
        let (a, b) = (
            Call {
                output: a.input,
                ..a
            },
            Call {
                output: b.input,
                ..b
            },
        );
        let bd = Bounds::from_settings(0, None, PUSH_PIECE);
        for rank in 0..2 {
            let (mine, peer) = if rank == 0 { (a, b) } else { (b, a) };
            let stage = Some([0x5_0000_0000, 0x6_0000_0000]);
            let Some(RankPlan::Pushed(p)) =
                plan(&mine, &peer, rank, 0x5_0000_0000, &bd, false, stage)
            else {
                panic!("an in-place pushed plan")
            };
            let l = p.landing.expect("in place");
            assert_eq!(l.scratch, 0x5_0000_0000);
            let half = GIB / 2;
            let (my_zone, peer_zone) = if rank == 0 {
                (mine.input + half, peer.input)
            } else {
                (mine.input, peer.input + half)
            };
            assert_eq!(l.zone, my_zone);
            assert_eq!(p.pushes[0].dst, 0x6_0000_0000);
            assert_eq!(p.pushes[1].dst, peer_zone);
            assert_eq!(p.pushes[1].bytes, 64 * MIB);
            assert_eq!(p.waits[..3], [0, 1, 2]);
            assert_eq!(p.gather.len(), 1);
            assert_eq!(p.streams, 1);
            // Two copy streams: the plan says so, for the kernel's waits.
            let two = Bounds {
                push_streams: 2,
                ..bd
            };
            let Some(RankPlan::Pushed(p2)) = plan(&mine, &peer, rank, 0, &two, false, stage) else {
                panic!("an in-place pushed plan")
            };
            assert_eq!((p2.streams, p2.pushes), (2, p.pushes.clone()));
            let out = Call {
                output: mine.input ^ (1 << 44),
                ..mine
            };
            let pc = Call {
                output: peer.input ^ (1 << 44),
                ..peer
            };
            let Some(RankPlan::Pushed(p3)) = plan(&out, &pc, rank, 0, &two, true, None) else {
                panic!("a pushed plan")
            };
            assert_eq!(p3.streams, 2);
            // The push setting 0, or no scratch shared: pulled.
            let off = Bounds { push: 0, ..bd };
            assert!(matches!(
                plan(&mine, &peer, rank, 0x5_0000_0000, &off, false, stage),
                Some(RankPlan::Reduce(_))
            ));
            assert!(matches!(
                plan(&mine, &peer, rank, 0x5_0000_0000, &bd, false, None),
                Some(RankPlan::Reduce(_))
            ));
        }
    }

    #[test]
    fn in_place_reduce_scatters_push_into_the_peer_scratch_ring() {
        // 1 GiB of send buffer per rank: 512 MiB parts, 64 MiB pieces, each
        // into slot k mod 4 of the peer's scratch, push k >= 4 after the
        // peer's kernel reduced piece k - 4.
        let count = GIB / 8;
        let c = |input: u64, rank: u64| Call {
            input,
            output: input + rank * count * 4,
            ..call(
                Coll::ReduceScatter,
                count,
                DataType::Float32,
                ce_reduce::Op::Sum,
            )
        };
        let bd = Bounds::from_settings(0, None, PUSH_PIECE);
        let (s0, s1) = (0x5_0000_0000u64, 0x6_0000_0000u64);
        for rank in 0..2u64 {
            let (mine, peer) = (
                c(0x1000_0000 * (rank + 1), rank),
                c(0x7000_0000_0000, 1 - rank),
            );
            let Some(RankPlan::Pushed(p)) =
                plan(&mine, &peer, rank as usize, s0, &bd, false, Some([s0, s1]))
            else {
                panic!("a slot-ring plan")
            };
            assert_eq!(p.wait_on, ce_reduce::WaitOn::PeerConsumed);
            assert_eq!(p.landing.map(|l| (l.scratch, l.slots)), Some((s0, 4)));
            let dsts: Vec<u64> = p.pushes.iter().take(6).map(|x| x.dst).collect();
            let slot = 64 * MIB;
            assert_eq!(
                dsts,
                [s1, s1 + slot, s1 + 2 * slot, s1 + 3 * slot, s1, s1 + slot]
            );
            assert_eq!(p.waits[..6], [0, 0, 0, 0, 1, 2]);
            assert!(p.gather.is_empty());
            assert_eq!(p.reduce.output, mine.output);
        }
    }

    #[test]
    fn pushed_only_where_both_ranks_are_out_of_place() {
        let c = call(
            Coll::AllReduce,
            GIB / 4,
            DataType::Float32,
            ce_reduce::Op::Sum,
        );
        let apart = msg(0, c, [buf(1, GIB, 0), buf(2, GIB, 0)]);
        // One allocation: disjoint halves push, the same range or any
        // overlap pulls (in place).
        let halves = msg(0, c, [buf(3, 2 * GIB, 0), buf(3, 2 * GIB, GIB)]);
        let same = msg(0, c, [buf(3, 2 * GIB, 0), buf(3, 2 * GIB, 0)]);
        let overlap = msg(0, c, [buf(3, 2 * GIB, 0), buf(3, 2 * GIB, GIB - 4)]);
        let below = msg(0, c, [buf(3, 2 * GIB, GIB), buf(3, 2 * GIB, 0)]);
        assert!(pushable(&apart, &apart));
        assert!(pushable(&apart, &halves) && pushable(&below, &apart));
        assert!(!pushable(&apart, &same) && !pushable(&same, &apart));
        assert!(!pushable(&overlap, &apart) && !pushable(&apart, &overlap));
        // A reduce-scatter reads twice what it writes: its in-place output
        // (input + rank x count) overlaps.
        let rs = call(
            Coll::ReduceScatter,
            GIB / 8,
            DataType::Float32,
            ce_reduce::Op::Sum,
        );
        let rs_in_place = msg(0, rs, [buf(4, GIB, 0), buf(4, GIB, GIB / 2)]);
        let rs_after = msg(0, rs, [buf(4, 2 * GIB, 0), buf(4, 2 * GIB, GIB)]);
        assert!(!pushable(&rs_in_place, &rs_after));
        assert!(pushable(&rs_after, &rs_after));
        // A buffer that cannot be shared never pushes.
        let unshared = msg(0, c, [Buf::NONE, buf(2, GIB, 0)]);
        assert!(!pushable(&unshared, &apart));
    }

    #[test]
    fn both_ends_of_a_group_judge_the_same_transfers() {
        let d = Bounds::from_settings(ce::DEFAULT_MIN, None, PUSH_PIECE);
        for n in [0usize, 1, 64 << 20, (128 << 20) - 1, 128 << 20, 1 << 30] {
            // Scatter from rank 0 and gather to rank 0: the root also
            // copies to itself, its peer only receives or sends.
            let root_scatter = p2p_call(&[(1, 0xa0, n), (0, 0xb0, n)], &[(0, 0xc0, n)], 0, 1);
            let peer_scatter = p2p_call(&[], &[(0, 0xd0, n)], 1, 0);
            let root_gather = p2p_call(&[(0, 0xb0, n)], &[(1, 0xe0, n), (0, 0xc0, n)], 0, 1);
            let peer_gather = p2p_call(&[(0, 0xf0, n)], &[], 1, 0);
            // All-to-all: one transfer each way plus the copy to itself.
            let a2a = |r: usize| {
                p2p_call(
                    &[(1 - r, 1, n), (r, 2, n)],
                    &[(1 - r, 3, n), (r, 4, n)],
                    r,
                    1 - r,
                )
            };
            for (x, y) in [
                (root_scatter, peer_scatter),
                (root_gather, peer_gather),
                (a2a(0), a2a(1)),
            ] {
                let (x, y) = (
                    x.expect("one transfer with the peer"),
                    y.expect("its other end"),
                );
                assert_eq!(
                    eligible(&x, &d),
                    eligible(&y, &d),
                    "{n} bytes: {x:?} / {y:?}"
                );
            }
            let x = root_scatter.unwrap();
            assert_eq!((x.count, x.input), (n as u64, 0xa0));
            assert_eq!(x.coll, Coll::SendRecv { recv: 0 });
            let y = peer_scatter.unwrap();
            assert_eq!((y.count, y.output), (0, 0xd0));
            assert_eq!(y.coll, Coll::SendRecv { recv: n as u64 });
        }
        // The bound (twice OXCCL_CUDA_CE_MIN one way) holds on both ends.
        let one_way = |n: usize| p2p_call(&[], &[(0, 1, n)], 1, 0).unwrap();
        assert!(eligible(&one_way(2 * ce::DEFAULT_MIN as usize), &d));
        assert!(!eligible(&one_way(2 * ce::DEFAULT_MIN as usize - 1), &d));
        // Two sends to the peer, or a third rank: not one call.
        assert!(p2p_call(&[(1, 1, 8), (1, 2, 8)], &[], 0, 1).is_none());
        assert!(p2p_call(&[(2, 1, 8)], &[], 0, 1).is_none());
        assert!(p2p_call(&[], &[(2, 1, 8)], 0, 1).is_none());
    }

    #[test]
    fn reductions_between_the_bounds_take_the_engines_only_when_pushed() {
        let d = Bounds::from_settings(0, None, PUSH_PIECE);
        assert_eq!((d.ar, d.rs), (XP_PUSH_MIN, XP_PUSH_MIN));
        assert_eq!((d.pull_ar, d.pull_rs), (XP_AR_MIN, XP_RS_MIN));
        // Pushes off, or the bound set: one bound, pushed or pulled.
        let off = Bounds::from_settings(0, None, 0);
        assert_eq!((off.ar, off.pull_ar), (XP_AR_MIN, XP_AR_MIN));
        let set = Bounds::from_settings(0, Some(64 * MIB), PUSH_PIECE);
        assert_eq!((set.ar, set.pull_ar), (64 * MIB, 64 * MIB));
        assert_eq!((set.rs, set.pull_rs), (128 * MIB, 128 * MIB));
        for (coll, count) in [
            (Coll::AllReduce, XP_PUSH_MIN / 4),
            (Coll::ReduceScatter, XP_PUSH_MIN / 8),
        ] {
            let c = call(coll, count, DataType::Float32, ce_reduce::Op::Sum);
            assert!(eligible(&c, &d), "{coll:?} at the pushed bound");
            let lower = call(coll, count - 1, DataType::Float32, ce_reduce::Op::Sum);
            assert!(!eligible(&lower, &d));
            let bytes = XP_PUSH_MIN;
            let apart = msg(0, c, [buf(1, bytes, 0), buf(2, bytes, 0)]);
            let same = msg(0, c, [buf(3, bytes, 0), buf(3, bytes, 0)]);
            // Both apart: pushed; either in place: pulled, so back to the
            // ring kernel on both ranks (each sees both messages).
            assert!(!declined(&apart, &apart, &d, 0));
            assert!(declined(&apart, &same, &d, 0) && declined(&same, &apart, &d, 0));
            assert!(declined(&same, &same, &d, 0));
            // In place pushed (both shared their scratch): an all-reduce
            // takes the engines from the pushed bound too.
            let staged = Msg {
                stage: buf(9, 256 * MIB, 0),
                ..same
            };
            assert_eq!(
                declined(&staged, &staged, &d, 0),
                coll != Coll::AllReduce,
                "{coll:?}"
            );
            assert!(declined(&staged, &same, &d, 0) && declined(&same, &staged, &d, 0));
            let no_push = Bounds { push: 0, ..d };
            assert!(declined(&apart, &apart, &no_push, 0));
            // From the pulled bound nothing is declined.
            let big = call(coll, count * 2, DataType::Float32, ce_reduce::Op::Sum);
            let big_same = msg(0, big, [buf(3, 2 * bytes, 0), buf(3, 2 * bytes, 0)]);
            assert!(!declined(&big_same, &big_same, &d, 0));
        }
        // Copies are never declined.
        let ag = call(
            Coll::AllGather,
            256 * MIB,
            DataType::Int8,
            ce_reduce::Op::Sum,
        );
        let m = msg(0, ag, [buf(1, GIB, 0), buf(1, GIB, 0)]);
        assert!(!declined(&m, &m, &d, 0));
    }

    #[test]
    fn pushed_reductions_follow_the_push_setting_and_the_bounds() {
        let (a, b) = all_reduce_pair(ce_reduce::Op::Sum);
        let bd = Bounds::from_settings(0, Some(ce_reduce::DEFAULT_AR_MIN), PUSH_PIECE);
        for rank in 0..2 {
            let (mine, peer) = if rank == 0 { (a, b) } else { (b, a) };
            let want = ce_reduce::plan_pushed(
                &[a.ce_reduce().unwrap(), b.ce_reduce().unwrap()],
                rank,
                PUSH_PIECE,
            );
            assert_eq!(
                plan(&mine, &peer, rank, 0, &bd, true, None),
                Some(RankPlan::Pushed(want.clone()))
            );
            // 1 GiB: 512 MiB per part in 64 MiB pieces (the last halved),
            // pushed to the peer's output at its part, then this rank's part
            // gathered there.
            assert_eq!(push_piece(512 * MIB, PUSH_PIECE), PUSH_PIECE);
            let sizes: Vec<u64> = want.pushes.iter().map(|x| x.bytes / MIB).collect();
            assert_eq!(sizes, [64, 64, 64, 64, 64, 64, 64, 32, 16, 8, 4, 4]);
            assert_eq!(want.gather.len(), 1);
            assert_eq!(
                want.gather[0].dst - peer.output,
                want.gather[0].src - mine.output
            );
            // Not pushable, or pushing off: the pulls through the scratch ring.
            assert!(matches!(
                plan(&mine, &peer, rank, 0x5_0000_0000, &bd, false, None),
                Some(RankPlan::Reduce(_))
            ));
            let off = Bounds { push: 0, ..bd };
            assert!(matches!(
                plan(&mine, &peer, rank, 0x5_0000_0000, &off, true, None),
                Some(RankPlan::Reduce(_))
            ));
            // Below the bound: no plan at all.
            let high = Bounds { ar: GIB + 1, ..bd };
            assert_eq!(plan(&mine, &peer, rank, 0, &high, true, None), None);
        }
    }

    #[test]
    fn plans_are_the_one_process_plans_with_the_mapped_pointers() {
        // All-gather: rank r pushes its input into the peer's (mapped)
        // out[r], and copies it into its own out[r].
        for rank in 0..2usize {
            let (mine, peer) = mine_and_peer(Coll::AllGather, 128 * MIB);
            let p = plan(
                &mine,
                &peer,
                rank,
                0,
                &Bounds::from_settings(ce::DEFAULT_MIN, Some(0), 0),
                false,
                None,
            )
            .unwrap();
            let RankPlan::Copy(p) = p else {
                panic!("a copy plan")
            };
            assert_eq!(
                p.remote,
                vec![ce::Xfer {
                    dst: peer.output + rank as u64 * 128 * MIB,
                    src: mine.input,
                    bytes: 128 * MIB
                }]
            );
            assert_eq!(
                p.local,
                vec![ce::Xfer {
                    dst: mine.output + rank as u64 * 128 * MIB,
                    src: mine.input,
                    bytes: 128 * MIB
                }]
            );
        }
        // Broadcast: the non-root pulls the root's input (one way).
        let (bc, peer) = mine_and_peer(Coll::Broadcast { root: 0 }, 256 * MIB);
        let bd = Bounds::from_settings(ce::DEFAULT_MIN, None, 0);
        let RankPlan::Copy(p) = plan(&bc, &peer, 1, 0, &bd, false, None).unwrap() else {
            panic!("a copy plan")
        };
        assert_eq!(
            p.remote,
            vec![ce::Xfer {
                dst: bc.output,
                src: peer.input,
                bytes: 256 * MIB
            }]
        );
        assert!(p.local.is_empty());
        // All-reduce: the same RankPlan as ce_reduce::pair gives rank r.
        let (a, b) = all_reduce_pair(ce_reduce::Op::Max);
        let scratch = 0x5_0000_0000;
        for rank in 0..2 {
            let (mine, peer) = if rank == 0 { (a, b) } else { (b, a) };
            let bd = Bounds::from_settings(0, Some(ce_reduce::DEFAULT_AR_MIN), 0);
            let got = plan(&mine, &peer, rank, scratch, &bd, false, None).unwrap();
            let want = ce_reduce::pair(
                [a.ce_reduce().unwrap(), b.ce_reduce().unwrap()],
                [scratch, scratch],
                ce_reduce::DEFAULT_AR_MIN,
            )
            .unwrap();
            // The one-process plan, but the gather pushes this rank's part
            // into the peer's output instead of pulling the peer's.
            let mut want = want[rank].clone();
            let (lo, hi) = ce_reduce::part(ce_reduce::Kind::AllReduce, a.count, a.dtype, rank);
            let sz = a.dtype.size() as u64;
            assert_eq!(want.gather.len(), 1);
            want.gather = vec![ce::Xfer {
                dst: peer.output + lo * sz,
                src: mine.output + lo * sz,
                bytes: (hi - lo) * sz,
            }];
            assert_eq!(got, RankPlan::Reduce(want));
        }
        // A reduce-scatter has no gather.
        let rs = Call {
            coll: Coll::ReduceScatter,
            count: a.count / 2,
            ..a
        };
        let rs_peer = Call {
            input: b.input,
            output: b.output,
            ..rs
        };
        let bd = Bounds::from_settings(0, Some(1), 0);
        let Some(RankPlan::Reduce(p)) = plan(&rs, &rs_peer, 0, scratch, &bd, false, None) else {
            panic!("a reduction plan")
        };
        assert!(p.gather.is_empty());
        // Below the bound: no plan.
        let small = Call { count: 1024, ..a };
        let bd = Bounds::from_settings(0, Some(ce_reduce::DEFAULT_AR_MIN), 0);
        assert!(plan(&small, &small, 0, scratch, &bd, false, None).is_none());
        assert!(plan(&a, &b, 2, scratch, &bd, false, None).is_none());
    }

    #[test]
    fn send_receive_mirrors_pushes_and_goes_one_way() {
        let min = ce::DEFAULT_MIN;
        let bd = Bounds::from_settings(min, None, 0);
        let sr = |send: u64, recv: u64| Call {
            input: 0x1000,
            output: 0x9000_0000,
            ..call(
                Coll::SendRecv { recv },
                send,
                DataType::Uint8,
                ce_reduce::Op::Sum,
            )
        };
        // Both ways from the bound, one way from twice it.
        assert!(eligible(&sr(min, min), &bd));
        assert!(eligible(&sr(min, 1), &bd));
        assert!(!eligible(&sr(min - 1, min - 1), &bd));
        assert!(!eligible(&sr(min, 0), &bd));
        assert!(eligible(&sr(2 * min, 0), &bd));
        assert!(eligible(&sr(0, 2 * min), &bd));
        assert!(!eligible(&sr(0, 0), &bd));
        // The peer's call mirrors this one's.
        let a = msg(3, sr(2 * GIB, GIB), [buf(1, 2 * GIB, 0), buf(2, GIB, 0)]);
        let b = msg(3, sr(GIB, 2 * GIB), [buf(3, GIB, 0), buf(4, 2 * GIB, 0)]);
        assert_eq!(check(&a, &b, 1).unwrap(), Verdict::Engines);
        let same = msg(3, sr(2 * GIB, GIB), b.bufs);
        let e = check(&a, &same, 1).unwrap_err();
        assert!(e.message().contains("send/receive"), "{}", e.message());
        // One way: the sender's receive buffer is not needed.
        let s = msg(4, sr(4 * GIB, 0), [buf(1, 4 * GIB, 0), Buf::NONE]);
        let r = msg(4, sr(0, 4 * GIB), [Buf::NONE, buf(9, 4 * GIB, 0)]);
        assert_eq!(check(&s, &r, 1).unwrap(), Verdict::Engines);
        assert_eq!(check(&r, &s, 0).unwrap(), Verdict::Engines);
        // A receiver that cannot share its buffer: both take the kernel.
        let rn = msg(4, sr(0, 4 * GIB), [Buf::NONE, Buf::NONE]);
        assert_eq!(check(&s, &rn, 1).unwrap(), Verdict::Kernel);
        assert_eq!(check(&rn, &s, 0).unwrap(), Verdict::Kernel);
        // Plans: push into the peer's receive buffer; a receiver copies nothing.
        let mine = sr(4 * GIB, 0);
        let peer = Call {
            input: 0,
            output: 0x7f00_0000_0000,
            ..sr(0, 4 * GIB)
        };
        let RankPlan::Copy(p) = plan(&mine, &peer, 0, 0, &bd, false, None).unwrap() else {
            panic!("a copy plan")
        };
        assert_eq!(
            p.remote,
            vec![ce::Xfer {
                dst: peer.output,
                src: mine.input,
                bytes: 4 * GIB
            }]
        );
        let RankPlan::Copy(q) = plan(&peer, &mine, 1, 0, &bd, false, None).unwrap() else {
            panic!("a copy plan")
        };
        assert!(q.remote.is_empty() && q.local.is_empty());
    }

    #[test]
    fn translate_offsets_into_the_mapping() {
        let c = call(Coll::AllReduce, 1024, DataType::Float32, ce_reduce::Op::Sum);
        let m = msg(0, c, [buf(1, GIB, 4096), buf(2, GIB, 64)]);
        let t = translate(&m, [0x7000, 0x9000]);
        assert_eq!((t.input, t.output), (0x7000 + 4096, 0x9000 + 64));
        assert!(t.same_shape(&c));
    }

    #[test]
    fn freed_allocations_are_reported_once_and_a_few_per_message() {
        let mut e = Exports::default();
        let h = Some([1u8; 64]);
        // Ids 1..=6 shared at bases 0x1000 * id; 7 not exportable.
        for id in 1..=6u64 {
            e.insert(id, 0x1000 * id, h);
        }
        e.insert(7, 0x7000, None);
        assert_eq!(e.get(3), Some(h));
        assert_eq!(e.get(7), Some(None));
        assert_eq!(e.get(8), None);
        // All alive: nothing to report.
        e.sweep(|base| Some(base / 0x1000));
        assert_eq!(e.take_dead(), [0; DEAD_MAX]);
        assert_eq!(e.len(), 7);
        // 2, 3, 4, 5, 6 freed (5 and 6: another allocation at the same
        // base); 7 freed too but never shared: not reported.
        e.sweep(|base| match base / 0x1000 {
            1 => Some(1),
            5 | 6 => Some(99),
            _ => None,
        });
        assert_eq!(e.len(), 1);
        let mut first = e.take_dead().to_vec();
        let mut second = e.take_dead().to_vec();
        assert_eq!(second[1..], [0; DEAD_MAX - 1]);
        first.append(&mut second);
        first.retain(|x| *x != 0);
        first.sort();
        assert_eq!(first, vec![2, 3, 4, 5, 6]);
        assert_eq!(e.take_dead(), [0; DEAD_MAX]);
        // A sweep that finds them gone again reports nothing more.
        e.sweep(|_| None);
        let d = e.take_dead();
        assert_eq!(d, [1, 0, 0, 0]);
        assert!(e.is_empty());
        // The dead ids travel in the message.
        let m = Msg {
            dead: [5, 9, 0, 0],
            ..msg(
                1,
                call(Coll::AllGather, 8, DataType::Uint8, ce_reduce::Op::Sum),
                [Buf::NONE; 2],
            )
        };
        assert_eq!(Msg::decode(&m.encode()).unwrap().dead, [5, 9, 0, 0]);
    }

    #[test]
    fn the_cache_evicts_the_least_recently_used() {
        let mut c = Cache::new(3);
        assert!(c.is_empty());
        assert_eq!(c.insert(1, 0x100), None);
        assert_eq!(c.insert(2, 0x200), None);
        assert_eq!(c.insert(3, 0x300), None);
        assert!(c.full());
        assert_eq!(c.get(1), Some(0x100)); // 2 is now the oldest
        assert_eq!(c.insert(4, 0x400), Some(0x200));
        assert_eq!(c.get(2), None);
        assert_eq!(c.get(3), Some(0x300));
        assert_eq!(c.insert(5, 0x500), Some(0x100));
        assert_eq!(c.len(), 3);
        assert_eq!(c.remove(4), Some(0x400));
        assert_eq!(c.remove(4), None);
        assert_eq!(c.insert(4, 0x400), None);
        let mut all = c.drain();
        all.sort();
        assert_eq!(all, vec![0x300, 0x400, 0x500]);
        assert!(Cache::new(0).insert(1, 1).is_none());
    }

    #[test]
    fn bounds_agree_only_when_equal() {
        let x = Bounds::from_settings(1, Some(2), 0);
        let y = Bounds::from_settings(1, None, 0);
        assert_eq!(agree_bounds(x, x), x);
        assert_eq!(agree_bounds(x, y), Bounds::OFF);
        assert_eq!(agree_bounds(Bounds::OFF, x), Bounds::OFF);
        assert_eq!(Bounds::decode(&y.encode()), Some(y));
        assert_eq!(Bounds::decode(&[0; 23]), None);
        assert_eq!((x.ar, x.rs), (2, 2 * ce_reduce::RS_FACTOR));
    }
}
