//! Copy-engine all-reduce and reduce-scatter for two GPUs in one process:
//! which calls qualify, how the elements split, and the schedule of copies
//! and flags, decided here without touching a GPU (`oxccl_cuda::exec` only issues it).
//!
//! Why: on 2×H200 one copy engine pulls 390 GB/s from the peer each way
//! while both GPUs copy at once (docs/performance-gpu.md, "Large: copy engines, 2 processes"),
//! against 336–338 GB/s of bus bandwidth for the SM pair kernel's all-reduce
//! (NCCL: 326–344). An all-reduce of S bytes moves S/2 each way to reduce and
//! S/2 each way to gather, so at the engine's rate its bus bandwidth tends to
//! 390 GB/s less a fixed cost (three barriers, the first piece's copy before
//! any reduction can start: 64 MiB / 390 GB/s = 172 µs, the last piece's
//! reduction after the last copy), which is why it is taken only from
//! [`DEFAULT_AR_MIN`] bytes. A reduce-scatter moves half as much per rank (S/2
//! pulled, no gather) and needs no SM at all for the transfer, but it is only
//! the reducing phase, which ran at ~343 GB/s with one copy stream, no
//! faster than the SM kernel's 337, and at 340–360 with two: see
//! [`RS_FACTOR`].
//!
//! Measured (2×H200, nccl-tests' sizes, busbw, NCCL beside, 2026-11-30): one
//! copy stream: all-reduce 1 GiB 356 GB/s (SM kernel 336, NCCL 325), 4 GiB
//! 365 (338, 342); reduce-scatter 1 GiB 331 (SM 333), 4 GiB 343 (SM 337).
//! Two copy streams for `-g 2` (`oxccl_cuda::exec`'s `enqueue_copy_engine_reduce`):
//! all-reduce 1 GiB 361, 2 GiB 371, 4 GiB 376; reduce-scatter 1 GiB 341,
//! 2 GiB 355, 4 GiB 360 (SM 334–336).
//!
//! Rank r owns part r of the elements (all-reduce: a split at a 16-byte
//! boundary; reduce-scatter: block r, its output). Each rank's stream runs:
//!
//! 1. a barrier (both GPUs reached the call: inputs written, outputs free);
//! 2. phase 1: a copy stream pulls the peer's input part r into a ring of
//!    [`SLOTS`] slots of [`SLOT_BYTES`] on this GPU, piece by piece, each
//!    piece followed by a "landed" flag; one reduce kernel on the caller's
//!    stream waits for each piece, writes out[part r] = in[part r] op piece
//!    and raises a "consumed" flag, which the copy stream waits for before
//!    it puts another piece in that slot. The part is reduced once, on its
//!    owner, so both ranks end with the same bits;
//! 3. a barrier (both reductions done, and the peer no longer reads this
//!    rank's input);
//! 4. all-reduce only: the peer's out[part 1-r] pulled into out[part 1-r],
//!    then a barrier (the peer no longer reads this rank's output).
//!
//! In place (out == in) works because the peer's values go to the scratch
//! ring, never to out's other part before the peer has read it (step 3).
//!
//! Two processes with both calls out of place push instead ([`PushedPlan`]):
//! no scratch ring, the peer's values land in this rank's output part and
//! are reduced there, and no copy stream waits for the other rank. With
//! `OXCCL_CUDA_CE_PUSH_IN_PLACE`, calls in place on both ranks push too:
//! an all-reduce into the peer's scratch and then into the peer's copy of
//! this rank's part ([`plan_pushed_in_place`]), a reduce-scatter into the
//! peer's scratch ring ([`plan_pushed_ring`]); there a push may wait
//! (bounded) for the peer ([`PushedPlan::waits`]).
//!
//! Flags (32-bit words after the ring, zero between calls, so a replay of
//! the same work finds them as the first run did): `landed[s]` carries the
//! piece's number + 1 and is put back to 0 by the kernel that consumed it;
//! `consumed[s]` carries the consumed piece's number + 1 and is put back to 0
//! by the copy stream once it saw it; the copy stream ends by waiting for the
//! last piece of every slot it used, so it is done only when the kernel is.

use super::copy_engine::Xfer;
use crate::{DataType, RedOp};

/// The default bound ([`super::config::DEFAULT_CE_AR_MIN`] says why).
pub use super::config::DEFAULT_CE_AR_MIN as DEFAULT_AR_MIN;

/// A reduce-scatter (whose size is its whole input, as nccl-tests counts it)
/// takes the copy engines from `RS_FACTOR` times the all-reduce bound: it
/// has no gather phase for the engines to win. With two copy streams
/// (2×H200, `-g 2`, 2026-11-30) the engines took 1,576 µs at
/// 1 GiB against the SM kernel's 1,607 and 3,028 against 3,193 at 2 GiB,
/// but 846 against 811 at 512 MiB (with one stream: level only at
/// 1 GiB, factor 4).
pub const RS_FACTOR: u64 = 2;

/// Slots of the scratch ring. Four: the copy engine fills one while the
/// kernel reduces another, with two spare so neither waits on the other's
/// jitter (two slots of 64 MiB measured 352/362 GB/s at 1/4 GiB against
/// four's 356/365).
pub const SLOTS: u32 = 4;

/// Bytes of a slot (a piece). 64 MiB: each piece costs ~21 µs besides its
/// copy (the copy stream's wait for the slot, the copy's start, the flag),
/// measured as 16 MiB pieces reaching only 260 GB/s of pulls (43 µs of copy
/// per piece, 64 µs in all) and 310 GB/s all-reduce busbw at 1–8 GiB,
/// below the SM kernel. With 64 MiB the cost is ~11% of a piece's 172 µs.
/// The ring is then 256 MiB of device memory per GPU and communicator,
/// allocated only when a call takes this path (NCCL's communicator holds
/// 840 MiB; ours 142 without it).
pub const SLOT_BYTES: u64 = 64 << 20;

/// Byte offset of the flags after the slots, and their layout in 32-bit
/// words (`CER_*` in kernels/allreduce.cu): landed[SLOTS] at 0, consumed at
/// [`CONSUMED_WORD`], the kernel's per-slot block counter at [`DONE_WORD`].
pub const FLAGS_OFFSET: u64 = SLOTS as u64 * SLOT_BYTES;
/// First word of consumed[].
pub const CONSUMED_WORD: u32 = 16;
/// First word of the kernel's block counters.
pub const DONE_WORD: u32 = 32;
/// Bytes of the flags.
pub const FLAGS_BYTES: u64 = 256;
/// Bytes of the scratch a communicator's rank allocates on first use
/// (256 MiB + 256 B).
pub const SCRATCH_BYTES: u64 = FLAGS_OFFSET + FLAGS_BYTES;

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// All-reduce of `count` elements.
    AllReduce,
    /// Reduce-scatter of `count` elements per rank.
    ReduceScatter,
}

/// The ops the copy-engine path reduces; avg and PreMulSum (scalars per
/// rank, pre-multiplication) stay on the SM kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

impl Op {
    /// `op` if the copy-engine path does it.
    pub fn of(op: RedOp) -> Option<Op> {
        match op {
            RedOp::Sum => Some(Op::Sum),
            RedOp::Prod => Some(Op::Prod),
            RedOp::Max => Some(Op::Max),
            RedOp::Min => Some(Op::Min),
            RedOp::Avg | RedOp::PreMulSum(_) => None,
        }
    }

    /// The reduce kernel's op tag (`oxccl_cer_<type>_<op>`).
    pub fn tag(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Max => "max",
            Op::Min => "min",
        }
    }

    /// As a [`RedOp`].
    pub fn red_op(self) -> RedOp {
        match self {
            Op::Sum => RedOp::Sum,
            Op::Prod => RedOp::Prod,
            Op::Max => RedOp::Max,
            Op::Min => RedOp::Min,
        }
    }
}

/// One rank's call, as it made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// All-reduce or reduce-scatter.
    pub kind: Kind,
    /// Send buffer.
    pub input: u64,
    /// Receive buffer.
    pub output: u64,
    /// Elements (reduce-scatter: per rank).
    pub count: u64,
    /// Element type.
    pub dtype: DataType,
    /// Operator.
    pub op: Op,
}

impl Call {
    /// Bytes of the send buffer (what nccl-tests calls the size).
    pub fn bytes(&self) -> u64 {
        let per = self.count.saturating_mul(self.dtype.size() as u64);
        match self.kind {
            Kind::AllReduce => per,
            Kind::ReduceScatter => per.saturating_mul(2),
        }
    }
}

/// The scratch ring's shape (the constants above; tests shrink it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ring {
    /// Slots.
    pub slots: u32,
    /// Bytes per slot (a multiple of 16).
    pub slot_bytes: u64,
}

/// The ring the device uses.
pub const RING: Ring = Ring {
    slots: SLOTS,
    slot_bytes: SLOT_BYTES,
};

/// One operation of the copy stream, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Wait until `consumed[slot] == value` (`cuStreamWaitValue32`, EQ).
    WaitConsumed {
        /// Slot.
        slot: u32,
        /// The consumed piece's number + 1.
        value: u32,
    },
    /// `consumed[slot] = 0` (`cuStreamWriteValue32`).
    ClearConsumed {
        /// Slot.
        slot: u32,
    },
    /// A piece from the peer's input into a slot (`cuMemcpyAsync`).
    Pull {
        /// Slot (the copy's destination is inside it).
        slot: u32,
        /// The copy.
        xfer: Xfer,
    },
    /// `landed[slot] = value` (`cuStreamWriteValue32`, after the copy's writes).
    Land {
        /// Slot.
        slot: u32,
        /// The piece's number + 1.
        value: u32,
    },
}

/// The reduce kernel's work (`struct CerArgs`): `out[i] = x0[i] op x1[i]` for
/// the part's `count` elements, piece k (elements k·piece ..) from slot
/// k mod slots once `landed[slot] == k + 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reduce {
    /// This rank's input, at its part.
    pub input: u64,
    /// This rank's output, at its part.
    pub output: u64,
    /// Elements of the part (0: no kernel).
    pub count: u64,
    /// Elements per piece (= slot bytes / element size).
    pub piece: u64,
    /// Slots.
    pub slots: u32,
    /// 0 or 1: whether this rank's input is x0 (rank 0's) or x1.
    pub rank: u32,
    /// Halvings of the last piece (pushed plans: [`push_taper`]; the slot
    /// ring's kernel takes whole pieces, 0).
    pub taper: u32,
    /// Bytes per element (the halvings keep whole 16-byte units).
    pub elem: u64,
}

/// What a pushed plan's last piece is halved down to: a 64 MiB last piece
/// goes as 32, 16, 8, 4 and 4 MiB, so what is left to reduce after the last
/// copy lands is 4 MiB (~10 µs for the 32-block kernel at ~1.2 TB/s of this
/// GPU's memory) instead of 64 (~170 µs: the difference between the pushes'
/// 512 MiB / 390 GB/s = 1,376 µs and the 1,523–1,558 µs a 1 GiB
/// reduce-scatter took; 2×H200, 2026-11-30).
pub const PUSH_TAPER_LAST: u64 = 4 << 20;

/// Halvings of a pushed plan's last piece of `piece_bytes` (at most a
/// piece): 4 (measured on 2×H200, 2026-11-30), and more until it is at most
/// [`PUSH_TAPER_LAST`] (pieces over 64 MiB, `OXCCL_CUDA_CE_PUSH`).
pub fn push_taper(piece_bytes: u64) -> u32 {
    let mut t = 4;
    while piece_bytes.div_ceil(1 << t) > PUSH_TAPER_LAST {
        t += 1;
    }
    t
}

/// A piece as the kernel sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Its number (landed/consumed carry number + 1).
    pub k: u64,
    /// Slot.
    pub slot: u32,
    /// Element range inside the part.
    pub lo: u64,
    /// End of it.
    pub hi: u64,
}

impl Reduce {
    /// The pieces in the order the kernel takes them (kernels/allreduce.cu
    /// `ce_reduce` and `ce_reduce_pushed` walk the same loops): `piece`
    /// elements each, the last one (s elements) cut into s/2, s/4, ...
    /// (`taper` halvings, each whole 16-byte units) and what remains.
    pub fn pieces(&self) -> impl Iterator<Item = Piece> + '_ {
        let unit = (16 / self.elem.max(1)).max(1);
        let (mut lo, mut s, mut j, mut k) = (0u64, 0u64, 0u32, 0u64);
        std::iter::from_fn(move || {
            if self.piece == 0 || lo >= self.count {
                return None;
            }
            let rest = self.count - lo;
            let mut n = rest;
            if rest > self.piece {
                n = self.piece;
            } else {
                if s == 0 {
                    s = rest;
                }
                if j < self.taper {
                    let h = (s >> (j + 1)) / unit * unit;
                    if h >= unit && h < rest {
                        n = h;
                    }
                }
                j += 1;
            }
            let p = Piece {
                k,
                slot: (k % self.slots.max(1) as u64) as u32,
                lo,
                hi: lo + n,
            };
            lo += n;
            k += 1;
            Some(p)
        })
    }
}

/// One rank's half of a paired call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlan {
    /// Collective (all-reduce has a gather phase).
    pub kind: Kind,
    /// Element type.
    pub dtype: DataType,
    /// Operator.
    pub op: Op,
    /// The reduce kernel.
    pub reduce: Reduce,
    /// The copy stream's operations.
    pub steps: Vec<Step>,
    /// Phase 2: pulls of the peer's reduced part (empty for reduce-scatter).
    pub gather: Vec<Xfer>,
}

/// Whether both calls match and the pair goes to the copy engines: same
/// collective, count, type and op, and at least `min` bytes (a
/// reduce-scatter: [`RS_FACTOR`] x `min`; 0: never).
pub fn qualifies(calls: &[Call; 2], min: u64) -> bool {
    qualifies_with(calls, min, min.saturating_mul(RS_FACTOR))
}

/// [`qualifies`] with the reduce-scatter bound given apart (`rs_min`
/// bytes of send buffer; 0: never).
pub fn qualifies_with(calls: &[Call; 2], ar_min: u64, rs_min: u64) -> bool {
    let [a, b] = calls;
    let min = match a.kind {
        Kind::AllReduce => ar_min,
        Kind::ReduceScatter => rs_min,
    };
    min > 0
        && a.kind == b.kind
        && a.count == b.count
        && a.dtype == b.dtype
        && a.op == b.op
        && a.bytes() >= min
        // piece numbers travel in 32-bit flags
        && a.count / (SLOT_BYTES / a.dtype.size() as u64) < u32::MAX as u64 - 1
}

/// Bytes of the larger of the two parts (all-reduce parts differ by less
/// than 16 bytes; a reduce-scatter's are equal).
pub fn largest_part_bytes(kind: Kind, count: u64, dtype: DataType) -> u64 {
    let (lo, hi) = part(kind, count, dtype, 0);
    (hi - lo).max(count - (hi - lo)) * dtype.size() as u64
}

/// Part r's element range in the send buffer's elements.
pub fn part(kind: Kind, count: u64, dtype: DataType, r: usize) -> (u64, u64) {
    match kind {
        Kind::AllReduce => {
            // Split at a 16-byte boundary: both parts' vector loops start
            // aligned when the buffers are.
            let n = (16 / dtype.size() as u64).max(1);
            let half = count / n / 2 * n;
            if r == 0 {
                (0, half)
            } else {
                (half, count)
            }
        }
        Kind::ReduceScatter => (r as u64 * count, (r as u64 + 1) * count),
    }
}

/// Both ranks' plans (`calls[r]`: rank r's call; `scratch[r]`: rank r's
/// ring), or `None` when the pair does not qualify ([`qualifies`]).
pub fn pair(calls: [Call; 2], scratch: [u64; 2], min: u64) -> Option<[RankPlan; 2]> {
    qualifies(&calls, min).then(|| plan_pair(calls, scratch, RING))
}

/// [`pair`] with the reduce-scatter bound given apart ([`qualifies_with`]).
pub fn pair_with(
    calls: [Call; 2],
    scratch: [u64; 2],
    ar_min: u64,
    rs_min: u64,
) -> Option<[RankPlan; 2]> {
    qualifies_with(&calls, ar_min, rs_min).then(|| plan_pair(calls, scratch, RING))
}

/// [`pair`] for a given ring, without the size check.
pub fn plan_pair(calls: [Call; 2], scratch: [u64; 2], ring: Ring) -> [RankPlan; 2] {
    [0, 1].map(|r| plan_rank(&calls, scratch[r], ring, r))
}

fn plan_rank(calls: &[Call; 2], scratch: u64, ring: Ring, r: usize) -> RankPlan {
    let q = 1 - r;
    let c = calls[r];
    let sz = c.dtype.size() as u64;
    let (lo, hi) = part(c.kind, c.count, c.dtype, r);
    let out_part = match c.kind {
        Kind::AllReduce => c.output + lo * sz,
        Kind::ReduceScatter => c.output,
    };
    let reduce = Reduce {
        input: c.input + lo * sz,
        output: out_part,
        count: hi - lo,
        piece: ring.slot_bytes / sz,
        slots: ring.slots,
        rank: r as u32,
        taper: 0,
        elem: sz,
    };
    let peer_src = calls[q].input + lo * sz;
    let mut steps = Vec::new();
    let mut last_in_slot: Vec<Option<u64>> = vec![None; ring.slots as usize];
    for p in reduce.pieces() {
        if let Some(prev) = last_in_slot[p.slot as usize] {
            steps.push(Step::WaitConsumed {
                slot: p.slot,
                value: prev as u32 + 1,
            });
            steps.push(Step::ClearConsumed { slot: p.slot });
        }
        steps.push(Step::Pull {
            slot: p.slot,
            xfer: Xfer {
                dst: scratch + p.slot as u64 * ring.slot_bytes,
                src: peer_src + p.lo * sz,
                bytes: (p.hi - p.lo) * sz,
            },
        });
        steps.push(Step::Land {
            slot: p.slot,
            value: p.k as u32 + 1,
        });
        last_in_slot[p.slot as usize] = Some(p.k);
    }
    // The copy stream ends after the kernel consumed every piece (so a
    // join on it means the ring is free and every flag is back to 0).
    for (s, last) in last_in_slot.iter().enumerate() {
        if let Some(k) = last {
            steps.push(Step::WaitConsumed {
                slot: s as u32,
                value: *k as u32 + 1,
            });
            steps.push(Step::ClearConsumed { slot: s as u32 });
        }
    }
    let mut gather = Vec::new();
    if c.kind == Kind::AllReduce {
        let (qlo, qhi) = part(c.kind, c.count, c.dtype, q);
        if qhi > qlo {
            gather.push(Xfer {
                dst: c.output + qlo * sz,
                src: calls[q].output + qlo * sz,
                bytes: (qhi - qlo) * sz,
            });
        }
    }
    RankPlan {
        kind: c.kind,
        dtype: c.dtype,
        op: c.op,
        reduce,
        steps,
        gather,
    }
}

/// One rank's half of a reduction whose pieces the peer pushes (two
/// processes, both calls out of place: two_process.rs). Rank r's copy stream writes
/// the peer's part of r's input straight into the peer's output at that
/// part, piece by piece, each followed by the piece's number + 1 in the
/// peer's landed counter; the peer's kernel reduces its output in place
/// (out = in op out) as pieces land. No scratch ring, so no slot to wait
/// for: neither copy stream ever waits on the other rank, and the only
/// wait on the peer (the kernel's, for a piece) is bounded like every ring
/// wait (kernels/allreduce.cu, `ce_reduce_pushed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedPlan {
    /// Collective.
    pub kind: Kind,
    /// Element type.
    pub dtype: DataType,
    /// Operator.
    pub op: Op,
    /// The reduce kernel over this rank's part (`input` its input there,
    /// `output` its output there, which the peer's pushes fill first;
    /// `piece` the peer's piece; `slots` unused, 1).
    pub reduce: Reduce,
    /// This rank's pushes, in order: piece k of the peer's part (k + 1 goes
    /// to the peer's counter after it).
    pub pushes: Vec<Xfer>,
    /// All-reduce: this rank's reduced part into the peer's output, queued
    /// after this rank's kernel and before the call's last barrier (the
    /// peer writes and reads only its own part of its output meanwhile).
    /// In place ([`PushedPlan::landing`] set) after a barrier too: the
    /// peer's part of the peer's buffer held this rank's pieces until the
    /// peer's kernel was done with them.
    pub gather: Vec<Xfer>,
    /// In place ([`plan_pushed_in_place`], [`plan_pushed_ring`]): where the
    /// peer's pieces land in this rank's memory (the kernel reads them
    /// there); `None`: in this rank's output part, out of place.
    pub landing: Option<Landing>,
    /// Per push (in place): what must have happened on the peer before it
    /// starts (0: nothing), counted as [`PushedPlan::wait_on`] says;
    /// empty out of place.
    pub waits: Vec<u32>,
    /// What [`PushedPlan::waits`] count.
    pub wait_on: WaitOn,
    /// Copy streams the pushes alternate on (1 or 2; push k on stream
    /// k mod `streams`): each stream counts its own landed pieces in its
    /// half of the counter ([`counter_slot`]), so the kernel and the waits
    /// follow each piece whatever order the streams finish in.
    pub streams: u32,
}

/// What an in-place push waits for on the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOn {
    /// The peer's pushes of this call that landed (in this rank's counter,
    /// [`counter_slot`]): the piece lands where a push of the peer's read.
    PeerPushes,
    /// Pieces the peer's kernel has reduced (written into this rank's
    /// window by that kernel): the piece lands in a scratch slot that an
    /// earlier piece used.
    PeerConsumed,
}

/// Where push `k` of a plan with `streams` copy streams is counted: the
/// counter's 32-bit half (stream k mod `streams`, 0 or 1) and the value
/// that half holds once the push landed (its place on that stream + 1).
/// kernels/allreduce.cu's `ce_reduce_pushed` waits the same way.
pub fn counter_slot(k: u64, streams: u32) -> (u32, u32) {
    let s = streams.clamp(1, 2) as u64;
    ((k % s) as u32, (k / s) as u32 + 1)
}

/// Where an in-place pushed all-reduce's pieces land on a rank: piece 0
/// (elements below the piece size) in the rank's scratch, every later one
/// in the rank's own copy of the peer's part, `piece` elements before its
/// place: the rank's pushes have sent those values on by then (the pusher
/// waits for that: [`PushedPlan::waits`]). No element of the buffer is free
/// before the first push, hence the scratch for the first piece.
///
/// With `slots` > 0 ([`plan_pushed_ring`]) every piece lands in the scratch
/// instead, piece k in slot k mod `slots` of `piece` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landing {
    /// The rank's scratch (piece 0 at its start).
    pub scratch: u64,
    /// The rank's buffer at the peer's part (element `piece + i` of the
    /// rank's part lands at element `i` here); unused with slots.
    pub zone: u64,
    /// Slots of the scratch ring (0: the zone).
    pub slots: u32,
}

impl Landing {
    /// Address of piece `k`'s pushed values, the piece starting at element
    /// `lo` of the part (`piece` elements per piece, `sz` bytes each): the
    /// kernel's rule (kernels/allreduce.cu, `ce_reduce_pushed`).
    pub fn piece_at(&self, k: u64, lo: u64, piece: u64, sz: u64) -> u64 {
        if self.slots > 0 {
            self.scratch + (k % self.slots as u64) * piece * sz
        } else if lo < piece {
            self.scratch + lo * sz
        } else {
            self.zone + (lo - piece) * sz
        }
    }
}

/// [`PushedPlan`] of rank `r` (`calls[i]`: rank i's call, its pointers as
/// rank r reaches them), pieces of `piece_bytes` (rounded down to 16
/// bytes, at least 16). Both ranks' kernels and pushes cut the same
/// pieces: the pusher walks the peer's [`Reduce::pieces`].
pub fn plan_pushed(calls: &[Call; 2], r: usize, piece_bytes: u64) -> PushedPlan {
    let q = 1 - r;
    let c = calls[r];
    let sz = c.dtype.size() as u64;
    let piece = pushed_piece(&c, piece_bytes);
    let reduce_of = |i: usize| pushed_reduce(calls, i, piece);
    let theirs = reduce_of(q);
    let (qlo, _) = part(c.kind, c.count, c.dtype, q);
    let pushes = theirs
        .pieces()
        .map(|p| Xfer {
            dst: theirs.output + p.lo * sz,
            src: c.input + (qlo + p.lo) * sz,
            bytes: (p.hi - p.lo) * sz,
        })
        .collect();
    let mine = reduce_of(r);
    let gather = pushed_gather(calls, r, &mine);
    PushedPlan {
        kind: c.kind,
        dtype: c.dtype,
        op: c.op,
        reduce: mine,
        pushes,
        gather,
        landing: None,
        waits: Vec::new(),
        wait_on: WaitOn::PeerPushes,
        streams: 1,
    }
}

/// Rank i's reduction of a pushed plan, pieces of `piece` elements: its
/// part of its input, and its output there (a reduce-scatter's output is
/// the part).
fn pushed_reduce(calls: &[Call; 2], i: usize, piece: u64) -> Reduce {
    let c = calls[i];
    let sz = c.dtype.size() as u64;
    let (lo, hi) = part(c.kind, c.count, c.dtype, i);
    Reduce {
        input: c.input + lo * sz,
        output: match c.kind {
            Kind::AllReduce => c.output + lo * sz,
            Kind::ReduceScatter => c.output,
        },
        count: hi - lo,
        piece,
        slots: 1,
        rank: i as u32,
        taper: push_taper(piece * sz),
        elem: sz,
    }
}

/// An all-reduce's gather of a pushed plan: rank r's reduced part `mine`
/// into the peer's output at the same place (nothing for a reduce-scatter
/// or an empty part).
fn pushed_gather(calls: &[Call; 2], r: usize, mine: &Reduce) -> Vec<Xfer> {
    let c = calls[r];
    if c.kind != Kind::AllReduce || mine.count == 0 {
        return Vec::new();
    }
    vec![Xfer {
        dst: calls[1 - r].output + (mine.output - c.output),
        src: mine.output,
        bytes: mine.count * mine.elem,
    }]
}

/// Elements per pushed piece of `c` for a setting of `piece_bytes`:
/// rounded down to 16 bytes, at least 16, and at most 2^31 pieces of a
/// part (their counts travel in a 32-bit word).
fn pushed_piece(c: &Call, piece_bytes: u64) -> u64 {
    let most = largest_part_bytes(c.kind, c.count, c.dtype);
    (piece_bytes / 16 * 16)
        .max(16)
        .max(most.div_ceil(1 << 31).next_multiple_of(16))
        / c.dtype.size() as u64
}

/// [`PushedPlan`] of rank `r` for an all-reduce both ranks call in place
/// (`input == output`), or `None` when the call is not that, a piece does
/// not fit `scratch_bytes`, or the pieces cannot land without a push
/// waiting on one of the peer's that is not earlier (the parts differ by
/// less than 32 bytes, so only 16-byte pieces can meet that; checked, not
/// assumed).
/// `scratch[i]`: rank i's scratch as rank r reaches it.
///
/// Why: in place there is no free output to push into, so pulls through
/// the scratch ring ran instead, 5-9% below the out-of-place pushes
/// (1 GiB: 355-357 GB/s against 373; 2xH200, 2026-12-01). Here piece k > 0
/// of rank r's part lands in r's copy of the peer's part, where piece k - 1
/// of the peer's part was: r's own push k - 1 sent those values on, and
/// the peer's push waits on r's counter for exactly that. A push then waits
/// only on the other rank's previous one, and both ranks push at the same
/// rate, so a wait should find its count already there (not yet timed on
/// two GPUs: `OXCCL_CUDA_CE_PUSH_IN_PLACE` is off until it is).
pub fn plan_pushed_in_place(
    calls: &[Call; 2],
    r: usize,
    piece_bytes: u64,
    scratch: [u64; 2],
    scratch_bytes: u64,
) -> Option<PushedPlan> {
    let c = calls[r];
    if c.kind != Kind::AllReduce || calls.iter().any(|x| x.input != x.output) {
        return None;
    }
    let q = 1 - r;
    let sz = c.dtype.size() as u64;
    let piece = pushed_piece(&c, piece_bytes);
    if piece * sz > scratch_bytes {
        return None;
    }
    let reduce_of = |i: usize| pushed_reduce(calls, i, piece);
    let landing_of = |i: usize| {
        let (lo, _) = part(c.kind, c.count, c.dtype, 1 - i);
        Landing {
            scratch: scratch[i],
            zone: calls[i].input + lo * sz,
            slots: 0,
        }
    };
    // Rank i's pushes (pieces of the other part into the other rank) and
    // their waits, or None where one cannot land; judged for both ranks,
    // so both reach the same answer.
    let pushes_of = |i: usize| -> Option<(Vec<Xfer>, Vec<u32>)> {
        let (to, from) = (reduce_of(1 - i), reduce_of(i));
        let at = landing_of(1 - i);
        // The other rank's pushes, in order, cut rank i's part: its push m
        // has sent the values of i's part below ends[m].
        let ends: Vec<u64> = from.pieces().map(|p| p.hi).collect();
        let (olo, _) = part(c.kind, c.count, c.dtype, 1 - i);
        let mut pushes = Vec::new();
        let mut waits = Vec::new();
        for (k, p) in to.pieces().enumerate() {
            let wait = if p.lo < piece {
                if p.hi > piece {
                    return None;
                }
                0
            } else {
                // Lands on the other rank's elements [lo - piece, hi -
                // piece) of i's part: free once its pushes sent them.
                let last = p.hi - piece;
                if last > from.count {
                    return None;
                }
                let m = ends.iter().position(|&e| e >= last)?;
                if m >= k {
                    return None;
                }
                m as u32 + 1
            };
            pushes.push(Xfer {
                dst: at.piece_at(p.k, p.lo, piece, sz),
                src: calls[i].input + (olo + p.lo) * sz,
                bytes: (p.hi - p.lo) * sz,
            });
            waits.push(wait);
        }
        Some((pushes, waits))
    };
    pushes_of(q)?;
    let (pushes, waits) = pushes_of(r)?;
    let mine = reduce_of(r);
    let gather = pushed_gather(calls, r, &mine);
    Some(PushedPlan {
        kind: c.kind,
        dtype: c.dtype,
        op: c.op,
        reduce: mine,
        pushes,
        gather,
        landing: Some(landing_of(r)),
        waits,
        wait_on: WaitOn::PeerPushes,
        streams: 1,
    })
}

/// [`PushedPlan`] of rank `r` for a reduce-scatter both ranks call in
/// place (`output == input` + r × count elements), or `None` when it is
/// not that or a piece is larger than a slot of `ring`: every piece lands
/// in the peer's scratch ring, piece k in slot k mod `ring.slots`, and
/// push k ≥ slots waits until the peer's kernel has reduced piece
/// k − slots (it writes its count into this rank's window).
/// `scratch[i]`: rank i's scratch as rank r reaches it.
///
/// Why: in place the send buffer outside the receive part must stay as it
/// was (NCCL's `sendbuff` is const), so no part of it can take the peer's
/// pieces, as an in-place all-reduce's does ([`plan_pushed_in_place`]);
/// pulls through the scratch ring reached 1.18-1.25x NCCL where the
/// out-of-place pushes reach 1.27-1.39x (2xH200, 2026-12-01). A slot wait
/// should find its count already there while the peer's kernel keeps up
/// with the copy engine (it then runs ~3 pieces ahead of need with 4
/// slots); not yet timed on two GPUs.
pub fn plan_pushed_ring(
    calls: &[Call; 2],
    r: usize,
    piece_bytes: u64,
    scratch: [u64; 2],
    ring: Ring,
) -> Option<PushedPlan> {
    let c = calls[r];
    let sz = c.dtype.size() as u64;
    let in_place = |i: usize| calls[i].output == calls[i].input + i as u64 * c.count * sz;
    if c.kind != Kind::ReduceScatter || !in_place(0) || !in_place(1) || ring.slots == 0 {
        return None;
    }
    let piece = pushed_piece(&c, piece_bytes);
    // The kernel counts a slot's blocks in a u32 and the pieces reduced in
    // another: well under 2^26 pieces keeps both far from wrapping.
    if piece * sz > ring.slot_bytes || c.count / piece > 1 << 26 {
        return None;
    }
    let q = 1 - r;
    let landing_of = |i: usize| Landing {
        scratch: scratch[i],
        zone: 0,
        slots: ring.slots,
    };
    let theirs = pushed_reduce(calls, q, piece);
    let at = landing_of(q);
    let (qlo, _) = part(c.kind, c.count, c.dtype, q);
    let mut pushes = Vec::new();
    let mut waits = Vec::new();
    for p in theirs.pieces() {
        pushes.push(Xfer {
            dst: at.piece_at(p.k, p.lo, piece, sz),
            src: c.input + (qlo + p.lo) * sz,
            bytes: (p.hi - p.lo) * sz,
        });
        // The slot's previous piece, k - slots, reduced.
        waits.push(p.k.saturating_sub(ring.slots as u64 - 1) as u32);
    }
    Some(PushedPlan {
        kind: c.kind,
        dtype: c.dtype,
        op: c.op,
        reduce: pushed_reduce(calls, r, piece),
        pushes,
        gather: Vec::new(),
        landing: Some(landing_of(r)),
        waits,
        wait_on: WaitOn::PeerConsumed,
        streams: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(kind: Kind, input: u64, output: u64, count: u64, dtype: DataType, op: Op) -> Call {
        Call {
            kind,
            input,
            output,
            count,
            dtype,
            op,
        }
    }

    #[test]
    fn matching_calls_from_the_bound_qualify() {
        let c = call(Kind::AllReduce, 0, 0, 64 << 20, DataType::Float32, Op::Sum);
        assert!(qualifies(&[c, c], 256 << 20));
        assert!(!qualifies(&[c, c], (256 << 20) + 1));
        assert!(!qualifies(&[c, c], 0));
        let mut d = c;
        d.count -= 1;
        assert!(!qualifies(&[c, d], 1));
        let mut d = c;
        d.op = Op::Max;
        assert!(!qualifies(&[c, d], 1));
        let mut d = c;
        d.dtype = DataType::Int32;
        assert!(!qualifies(&[c, d], 1));
        let mut d = c;
        d.kind = Kind::ReduceScatter;
        assert!(!qualifies(&[c, d], 1));
        // A reduce-scatter's size is its whole input, and its bound is
        // RS_FACTOR times the all-reduce's.
        let rs = call(
            Kind::ReduceScatter,
            0,
            0,
            32 << 20,
            DataType::Float32,
            Op::Sum,
        );
        assert!(qualifies(&[rs, rs], (256 << 20) / RS_FACTOR));
        assert!(!qualifies(&[rs, rs], (256 << 20) / RS_FACTOR + 1));
        assert!(!qualifies(&[rs, rs], 256 << 20));
        // Avg and PreMulSum stay on the SM kernels.
        assert_eq!(Op::of(RedOp::Avg), None);
        assert_eq!(Op::of(RedOp::PreMulSum(crate::Scalar::F64(2.0))), None);
        assert_eq!(Op::of(RedOp::Min), Some(Op::Min));
    }

    #[test]
    fn parts_split_at_16_bytes_and_cover_everything() {
        for dtype in DataType::ALL {
            let n = 16 / dtype.size() as u64;
            for count in [0u64, 1, 2, 15, 16, 17, 33, 1000, 1 << 20, (1 << 20) + 7] {
                let (a0, a1) = part(Kind::AllReduce, count, dtype, 0);
                let (b0, b1) = part(Kind::AllReduce, count, dtype, 1);
                assert_eq!((a0, a1, b1), (0, b0, count), "{dtype:?} {count}");
                assert_eq!(a1 % n, 0);
                assert!(b1 - b0 >= a1 - a0 && b1 - b0 - (a1 - a0) <= 2 * n);
            }
        }
        assert_eq!(part(Kind::ReduceScatter, 10, DataType::Int8, 1), (10, 20));
    }

    #[test]
    fn the_schedule_waits_before_every_reuse_and_ends_consumed() {
        let c = call(
            Kind::AllReduce,
            0x1000,
            0x1000,
            1000,
            DataType::Float32,
            Op::Sum,
        );
        let ring = Ring {
            slots: 2,
            slot_bytes: 64,
        };
        let [p0, _] = plan_pair([c, c], [0x9000, 0xa000], ring);
        // Part 0: 500 elements, 16 per piece: 32 pieces over 2 slots, the
        // last one of 4 elements.
        assert_eq!(p0.reduce.count, 500);
        assert_eq!(p0.reduce.pieces().count(), 32);
        assert_eq!(p0.reduce.pieces().last().unwrap().hi - 496, 4);
        let s = &p0.steps;
        assert!(matches!(s[0], Step::Pull { slot: 0, .. }));
        assert_eq!(s[1], Step::Land { slot: 0, value: 1 });
        assert!(matches!(s[2], Step::Pull { slot: 1, .. }));
        assert_eq!(s[4], Step::WaitConsumed { slot: 0, value: 1 });
        assert_eq!(s[5], Step::ClearConsumed { slot: 0 });
        assert!(matches!(s[6], Step::Pull { slot: 0, .. }));
        assert_eq!(s[7], Step::Land { slot: 0, value: 3 });
        // The tail: the last piece of each slot (30 in slot 0, 31 in 1).
        let n = s.len();
        assert_eq!(
            &s[n - 4..],
            &[
                Step::WaitConsumed { slot: 0, value: 31 },
                Step::ClearConsumed { slot: 0 },
                Step::WaitConsumed { slot: 1, value: 32 },
                Step::ClearConsumed { slot: 1 },
            ]
        );
        // An odd count: part 1 takes the odd element.
        let c = call(Kind::AllReduce, 0, 0, 1001, DataType::Float32, Op::Sum);
        let [_, p1] = plan_pair([c, c], [0, 0], ring);
        let last = p1.reduce.pieces().last().unwrap();
        assert_eq!((last.k, last.lo, last.hi), (31, 496, 501));
        // Nothing to reduce: no steps, no kernel.
        let c = call(Kind::AllReduce, 0, 0, 3, DataType::Float32, Op::Sum);
        let [p0, p1] = plan_pair([c, c], [0, 0], ring);
        assert_eq!(p0.reduce.count, 0);
        assert!(p0.steps.is_empty());
        assert_eq!(p1.reduce.count, 3);
        assert_eq!(p0.gather.len(), 1);
        assert!(p1.gather.is_empty());
    }

    // ---- A simulation of both ranks in one address space ----

    /// Typed element values for the simulation.
    fn encode(dtype: DataType, v: f64) -> Vec<u8> {
        match dtype {
            DataType::Float32 => (v as f32).to_le_bytes().to_vec(),
            DataType::Float64 => v.to_le_bytes().to_vec(),
            DataType::Int32 => (v as i32).to_le_bytes().to_vec(),
            DataType::Uint8 => vec![v as i64 as u8],
            _ => unreachable!(),
        }
    }
    fn decode(dtype: DataType, b: &[u8]) -> f64 {
        match dtype {
            DataType::Float32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            DataType::Float64 => f64::from_le_bytes(b.try_into().unwrap()),
            DataType::Int32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
            DataType::Uint8 => b[0] as f64,
            _ => unreachable!(),
        }
    }
    /// x0 op x1 as the kernel computes it, in the element type.
    fn reduce_elem(dtype: DataType, op: Op, x0: &[u8], x1: &[u8]) -> Vec<u8> {
        match dtype {
            DataType::Float32 => {
                let (a, b) = (
                    f32::from_le_bytes(x0.try_into().unwrap()),
                    f32::from_le_bytes(x1.try_into().unwrap()),
                );
                let r = match op {
                    Op::Sum => a + b,
                    Op::Prod => a * b,
                    Op::Max => a.max(b),
                    Op::Min => a.min(b),
                };
                r.to_le_bytes().to_vec()
            }
            DataType::Float64 | DataType::Int32 => {
                let (a, b) = (decode(dtype, x0), decode(dtype, x1));
                let r = match op {
                    Op::Sum => a + b,
                    Op::Prod => a * b,
                    Op::Max => a.max(b),
                    Op::Min => a.min(b),
                };
                encode(dtype, r)
            }
            DataType::Uint8 => {
                let (a, b) = (x0[0], x1[0]);
                vec![match op {
                    Op::Sum => a.wrapping_add(b),
                    Op::Prod => a.wrapping_mul(b),
                    Op::Max => a.max(b),
                    Op::Min => a.min(b),
                }]
            }
            _ => unreachable!(),
        }
    }
    /// The reference, from the inputs' values in float64 (or exact integers).
    fn reference(dtype: DataType, op: Op, a: f64, b: f64) -> f64 {
        let r = match op {
            Op::Sum => a + b,
            Op::Prod => a * b,
            Op::Max => a.max(b),
            Op::Min => a.min(b),
        };
        match dtype {
            // f32 of an exact f64 sum/product of two f32s: correctly rounded.
            DataType::Float32 => r as f32 as f64,
            DataType::Uint8 => (r as i64).rem_euclid(256) as f64,
            _ => r,
        }
    }

    /// SetupRecord moves when both a rank's copy stream and its kernel can.
    #[derive(Clone, Copy, Debug)]
    enum Policy {
        CopiesFirst,
        KernelFirst,
        Random(u64),
    }

    /// One rank's state in the simulation.
    struct Side {
        plan: RankPlan,
        /// Next copy-stream step.
        pc: usize,
        /// Next piece of the kernel.
        next: usize,
        landed: Vec<u32>,
        consumed: Vec<u32>,
        /// Which piece each slot holds, and whether the kernel consumed it.
        holds: Vec<Option<(u64, bool)>>,
    }

    struct Mem(Vec<u8>);
    impl Mem {
        fn get(&self, at: u64, len: u64) -> Vec<u8> {
            self.0[at as usize..(at + len) as usize].to_vec()
        }
        fn put(&mut self, at: u64, v: &[u8]) {
            self.0[at as usize..at as usize + v.len()].copy_from_slice(v);
        }
    }

    /// Runs phase 1 of both ranks (copy streams and kernels interleaved by
    /// `policy`), checks the slot discipline, then phase 2. Panics on a
    /// slot reused before it was consumed, on a kernel reading a slot that
    /// does not hold its piece, and on a deadlock.
    fn simulate(mem: &mut Mem, plans: [RankPlan; 2], ring: Ring, policy: Policy) {
        let mut sides: Vec<Side> = plans
            .into_iter()
            .map(|plan| Side {
                plan,
                pc: 0,
                next: 0,
                landed: vec![0; ring.slots as usize],
                consumed: vec![0; ring.slots as usize],
                holds: vec![None; ring.slots as usize],
            })
            .collect();
        let mut rng = match policy {
            Policy::Random(s) => s | 1,
            _ => 1,
        };
        loop {
            let mut moved = false;
            for side in sides.iter_mut() {
                let pieces: Vec<Piece> = side.plan.reduce.pieces().collect();
                let copy_ready = side.pc < side.plan.steps.len()
                    && match side.plan.steps[side.pc] {
                        Step::WaitConsumed { slot, value } => side.consumed[slot as usize] == value,
                        _ => true,
                    };
                let kernel_ready = side.next < pieces.len() && {
                    let p = pieces[side.next];
                    side.landed[p.slot as usize] == p.k as u32 + 1
                };
                if !copy_ready && !kernel_ready {
                    continue;
                }
                let copy_turn = match (copy_ready, kernel_ready) {
                    (true, false) => true,
                    (false, true) => false,
                    _ => match policy {
                        Policy::CopiesFirst => true,
                        Policy::KernelFirst => false,
                        Policy::Random(_) => {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            rng & 1 == 0
                        }
                    },
                };
                moved = true;
                if copy_turn {
                    match side.plan.steps[side.pc] {
                        Step::WaitConsumed { .. } => {}
                        Step::ClearConsumed { slot } => side.consumed[slot as usize] = 0,
                        Step::Pull { slot, xfer } => {
                            let h = &mut side.holds[slot as usize];
                            assert!(
                                h.is_none_or(|(_, consumed)| consumed),
                                "slot {slot} reused before it was consumed ({h:?})"
                            );
                            assert!(xfer.bytes <= ring.slot_bytes);
                            // The piece this copy carries: the next one the
                            // copy stream has not landed yet, in this slot.
                            let k = side.plan.steps[side.pc..]
                                .iter()
                                .find_map(|s| match s {
                                    Step::Land { slot: ls, value } if *ls == slot => {
                                        Some(*value as u64 - 1)
                                    }
                                    _ => None,
                                })
                                .expect("a pull is followed by its landed flag");
                            *h = Some((k, false));
                            let v = mem.get(xfer.src, xfer.bytes);
                            mem.put(xfer.dst, &v);
                        }
                        Step::Land { slot, value } => side.landed[slot as usize] = value,
                    }
                    side.pc += 1;
                } else {
                    let p = pieces[side.next];
                    let r = &side.plan.reduce;
                    let sz = side.plan.dtype.size() as u64;
                    assert_eq!(
                        side.holds[p.slot as usize],
                        Some((p.k, false)),
                        "the kernel's piece {} is not in slot {}",
                        p.k,
                        p.slot
                    );
                    // The slot's address: where every pull into it goes.
                    let slot_base = side
                        .plan
                        .steps
                        .iter()
                        .find_map(|s| match s {
                            Step::Pull { slot, xfer } if *slot == p.slot => Some(xfer.dst),
                            _ => None,
                        })
                        .expect("the slot was pulled into");
                    for i in p.lo..p.hi {
                        let mine = mem.get(r.input + i * sz, sz);
                        let theirs = mem.get(slot_base + (i - p.lo) * sz, sz);
                        let (x0, x1) = if r.rank == 0 {
                            (mine, theirs)
                        } else {
                            (theirs, mine)
                        };
                        let o = reduce_elem(side.plan.dtype, side.plan.op, &x0, &x1);
                        mem.put(r.output + i * sz, &o);
                    }
                    side.holds[p.slot as usize] = Some((p.k, true));
                    side.landed[p.slot as usize] = 0;
                    side.consumed[p.slot as usize] = p.k as u32 + 1;
                    side.next += 1;
                }
            }
            if !moved {
                break;
            }
        }
        for (r, side) in sides.iter().enumerate() {
            let n = side.plan.reduce.pieces().count();
            assert!(
                side.pc == side.plan.steps.len() && side.next == n,
                "rank {r} deadlocked: copy step {}/{}, piece {}/{n}",
                side.pc,
                side.plan.steps.len(),
                side.next
            );
            // Every flag back to 0 (a replay finds them as the first run did).
            assert!(side
                .landed
                .iter()
                .chain(side.consumed.iter())
                .all(|&f| f == 0));
        }
        // Middle barrier passed; phase 2.
        for side in &sides {
            for x in &side.plan.gather {
                let v = mem.get(x.src, x.bytes);
                mem.put(x.dst, &v);
            }
        }
    }

    /// The pieces tile the part in order, every piece but the last is whole
    /// 16-byte units, the last piece's halvings come out as s/2, s/4, ...
    #[test]
    fn pieces_tile_the_part_and_the_last_one_tapers() {
        for elem in [1u64, 2, 4, 8] {
            let unit = 16 / elem;
            for piece_units in [1u64, 3, 64] {
                let piece = piece_units * unit;
                for count in [0u64, 1, 15, 16, 17, 255, 256, 1000, 4097] {
                    for taper in [0u32, 1, 4] {
                        let r = Reduce {
                            input: 0,
                            output: 0,
                            count,
                            piece,
                            slots: 1,
                            rank: 0,
                            taper,
                            elem,
                        };
                        let ps: Vec<Piece> = r.pieces().collect();
                        let ctx = format!("elem {elem} piece {piece} count {count} taper {taper}");
                        let mut at = 0;
                        for (i, p) in ps.iter().enumerate() {
                            assert_eq!((p.k, p.lo), (i as u64, at), "{ctx}");
                            assert!(p.hi > p.lo, "{ctx}: empty piece");
                            if i + 1 < ps.len() {
                                assert_eq!((p.hi - p.lo) % unit, 0, "{ctx}");
                            }
                            at = p.hi;
                        }
                        assert_eq!(at, count, "{ctx}");
                        let whole = count.div_ceil(piece) as usize;
                        assert!(ps.len() <= whole + taper as usize, "{ctx}");
                        if taper == 0 {
                            assert_eq!(ps.len(), whole, "{ctx}");
                        }
                    }
                }
            }
        }
        // A 64 MiB last piece of float32 goes as 32, 16, 8, 4, 4 MiB.
        let mib = (1u64 << 20) / 4;
        let r = Reduce {
            input: 0,
            output: 0,
            count: 128 * mib,
            piece: 64 * mib,
            slots: 1,
            rank: 0,
            taper: 4,
            elem: 4,
        };
        let sizes: Vec<u64> = r.pieces().map(|p| (p.hi - p.lo) / mib).collect();
        assert_eq!(sizes, [64, 32, 16, 8, 4, 4]);
        // Larger pieces taper down to 4 MiB too; smaller ones keep 4 halvings.
        assert_eq!(push_taper(64 << 20), 4);
        assert_eq!(push_taper(256 << 20), 6);
        assert_eq!((256u64 << 20) >> push_taper(256 << 20), 4 << 20);
        assert_eq!(push_taper((256 << 20) + 16), 7);
        assert_eq!(push_taper(16 << 20), 4);
        assert_eq!(push_taper(0), 4);
    }

    /// Runs both ranks' pushed plans, one action at a time in an order drawn
    /// from `seed` (0: always the first ready action, rank 0's pushes
    /// first): a push (once the peer's counter reached its wait; then the
    /// peer's counter grows), a kernel piece (only once the rank's counter
    /// reached it), the gather (only after the rank's kernel; in place after
    /// both kernels, the barrier before it). Panics on a deadlock.
    fn simulate_pushed(mem: &mut Mem, plans: &[PushedPlan; 2], seed: u64) {
        let mut rng = seed | 1;
        // Per rank, per copy stream: pushes landed (the counter's halves,
        // as the peer sees them) and the stream's next push.
        let mut half = [[0u32; 2]; 2];
        let mut at = [[0usize, 1]; 2];
        let mut next = [0usize; 2];
        let mut gathered = [false; 2];
        let pieces: Vec<Vec<Piece>> = plans.iter().map(|p| p.reduce.pieces().collect()).collect();
        let landed = |half: &[[u32; 2]; 2], r: usize, k: usize| {
            let (h, v) = counter_slot(k as u64, plans[r].streams);
            half[r][h as usize] >= v
        };
        loop {
            let mut ready = Vec::new();
            let reduced = |r: usize, next: &[usize; 2]| next[r] == pieces[r].len();
            for r in 0..2 {
                let q = 1 - r;
                let p = &plans[r];
                let streams = p.streams.clamp(1, 2) as usize;
                for (s, &k) in at[r].iter().enumerate().take(streams) {
                    let waited = p.waits.get(k).is_none_or(|&w| {
                        w == 0
                            || match p.wait_on {
                                WaitOn::PeerPushes => landed(&half, q, w as usize - 1),
                                WaitOn::PeerConsumed => next[q] >= w as usize,
                            }
                    });
                    if k < p.pushes.len() && waited {
                        ready.push((r, 3 + s));
                    }
                }
                if next[r] < pieces[r].len() && landed(&half, q, next[r]) {
                    ready.push((r, 1));
                }
                let gather_ok = if p.landing.is_some() {
                    reduced(0, &next) && reduced(1, &next)
                } else {
                    reduced(r, &next)
                };
                if gather_ok && !gathered[r] {
                    ready.push((r, 2));
                }
            }
            if ready.is_empty() {
                break;
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let pick = if seed == 0 {
                0
            } else {
                (rng % ready.len() as u64) as usize
            };
            let (r, what) = ready[pick];
            let p = &plans[r];
            match what {
                3 | 4 => {
                    let s = what - 3;
                    let k = at[r][s];
                    let x = p.pushes[k];
                    let v = mem.get(x.src, x.bytes);
                    mem.put(x.dst, &v);
                    let (h, val) = counter_slot(k as u64, p.streams);
                    half[r][h as usize] = val;
                    at[r][s] += p.streams.clamp(1, 2) as usize;
                }
                1 => {
                    let pc = pieces[r][next[r]];
                    let red = &p.reduce;
                    let sz = p.dtype.size() as u64;
                    for i in pc.lo..pc.hi {
                        let mine = mem.get(red.input + i * sz, sz);
                        let at = match p.landing {
                            Some(l) => l.piece_at(pc.k, pc.lo, red.piece, sz) + (i - pc.lo) * sz,
                            None => red.output + i * sz,
                        };
                        let theirs = mem.get(at, sz);
                        let (x0, x1) = if red.rank == 0 {
                            (mine, theirs)
                        } else {
                            (theirs, mine)
                        };
                        mem.put(red.output + i * sz, &reduce_elem(p.dtype, p.op, &x0, &x1));
                    }
                    next[r] += 1;
                }
                _ => {
                    for x in &p.gather {
                        let v = mem.get(x.src, x.bytes);
                        mem.put(x.dst, &v);
                    }
                    gathered[r] = true;
                }
            }
        }
        for r in 0..2 {
            let n = plans[r].pushes.len();
            let all = (0..n).all(|k| landed(&half, r, k));
            assert!(
                all && next[r] == pieces[r].len() && gathered[r],
                "rank {r} deadlocked: pushes done {all} of {n}, pieces {}/{}",
                next[r],
                pieces[r].len()
            );
        }
    }

    /// The (type, op) pairs the pushed simulations run: float rounding,
    /// products, integer order, 8-byte and 1-byte elements (wrapping).
    const PUSHED_CASES: [(DataType, Op); 6] = [
        (DataType::Float32, Op::Sum),
        (DataType::Float32, Op::Prod),
        (DataType::Int32, Op::Max),
        (DataType::Float64, Op::Min),
        (DataType::Uint8, Op::Prod),
        (DataType::Uint8, Op::Sum),
    ];

    /// Writes both ranks' `n` input elements at `at[r]` (values whose
    /// reductions are exact, bytes wrapping for uint8) and returns them as
    /// the reference reads them.
    fn fill_pushed_inputs(mem: &mut Mem, at: [u64; 2], n: u64, dtype: DataType) -> [Vec<f64>; 2] {
        let sz = dtype.size() as u64;
        [0usize, 1].map(|r| {
            (0..n)
                .map(|i| {
                    let v = match dtype {
                        DataType::Uint8 => ((i * 7 + r as u64 * 3) % 256) as f64,
                        _ => (i as f64 * 3.0 + 1.0) * if r == 0 { 0.75 } else { -1.5 },
                    };
                    let e = encode(dtype, v);
                    mem.put(at[r] + i * sz, &e);
                    decode(dtype, &e)
                })
                .collect()
        })
    }

    /// Pushed plans (out of place) for every (collective, type, op, count,
    /// piece size, interleaving) against a float64/exact reference, inputs
    /// left as they were, both all-reduce outputs equal bits; the pushes of
    /// a rank cut exactly the peer kernel's pieces.
    #[test]
    // Ranks index several parallel arrays (inputs, outputs, expectations).
    #[allow(clippy::needless_range_loop)]
    fn pushed_schedules_compute_the_collectives_in_a_simulated_space() {
        const IN: [u64; 2] = [0, 100_000];
        const OUT: [u64; 2] = [200_000, 300_000];
        for kind in [Kind::AllReduce, Kind::ReduceScatter] {
            for (dtype, op) in PUSHED_CASES {
                let sz = dtype.size() as u64;
                for count in [1u64, 5, 17, 64, 257, 1001] {
                    for piece_bytes in [1u64, 16, 48, 100, 4096] {
                        for (seed, streams) in [(1u64, 1), (0x9e37_79b9, 1), (77, 2), (5, 2)] {
                            let ctx = format!(
                                "{kind:?} {dtype:?} {op:?} count={count} piece={piece_bytes} \
                                 seed={seed} streams={streams}"
                            );
                            let in_elems = match kind {
                                Kind::AllReduce => count,
                                Kind::ReduceScatter => 2 * count,
                            };
                            let mut mem = Mem(vec![0xee; 400_000]);
                            let vals = fill_pushed_inputs(&mut mem, IN, in_elems, dtype);
                            let inputs = [0, 1].map(|r| mem.get(IN[r], in_elems * sz));
                            let calls = [0, 1].map(|r| Call {
                                kind,
                                input: IN[r],
                                output: OUT[r],
                                count,
                                dtype,
                                op,
                            });
                            let plans = [0, 1].map(|r| PushedPlan {
                                streams,
                                ..plan_pushed(&calls, r, piece_bytes)
                            });
                            for r in 0..2 {
                                let theirs: Vec<(u64, u64)> = plans[1 - r]
                                    .reduce
                                    .pieces()
                                    .map(|p| {
                                        ((p.hi - p.lo) * sz, plans[1 - r].reduce.output + p.lo * sz)
                                    })
                                    .collect();
                                let mine: Vec<(u64, u64)> =
                                    plans[r].pushes.iter().map(|x| (x.bytes, x.dst)).collect();
                                assert_eq!(mine, theirs, "{ctx}: rank {r}'s pushes");
                            }
                            simulate_pushed(&mut mem, &plans, seed);
                            for r in 0..2 {
                                assert_eq!(
                                    mem.get(IN[r], in_elems * sz),
                                    inputs[r],
                                    "{ctx}: input {r}"
                                );
                                let (lo, n) = match kind {
                                    Kind::AllReduce => (0, count),
                                    Kind::ReduceScatter => (r as u64 * count, count),
                                };
                                for i in 0..n {
                                    let got = decode(dtype, &mem.get(OUT[r] + i * sz, sz));
                                    let e = (lo + i) as usize;
                                    let want = reference(dtype, op, vals[0][e], vals[1][e]);
                                    assert_eq!(got, want, "{ctx} rank {r} [{i}]");
                                }
                            }
                            if kind == Kind::AllReduce {
                                assert_eq!(
                                    mem.get(OUT[0], count * sz),
                                    mem.get(OUT[1], count * sz),
                                    "{ctx}: ranks differ"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// In-place pushed all-reduces ([`plan_pushed_in_place`]) for every
    /// (type, op, count, piece size, interleaving) against a float64/exact
    /// reference: both buffers end with the same bits, equal to the
    /// reference, and nothing outside the buffers and the scratches'
    /// first piece is written. Counts include parts that straddle a piece
    /// boundary (one part a whole number of pieces, the other 16 bytes
    /// more), where the last pieces land across the peer's.
    #[test]
    #[allow(clippy::needless_range_loop)]
    fn in_place_pushed_all_reduces_compute_in_a_simulated_space() {
        const BUF: [u64; 2] = [0, 100_000];
        const SCRATCH: [u64; 2] = [200_000, 300_000];
        let mut planned = 0;
        for (dtype, op) in PUSHED_CASES {
            let sz = dtype.size() as u64;
            let unit = (16 / sz).max(1);
            for piece_bytes in [1u64, 16, 48, 100, 4096] {
                let piece = (piece_bytes / 16 * 16).max(16) / sz;
                // Parts of exactly 4 pieces and 4 pieces + 16 bytes.
                let straddle = 8 * piece + unit;
                for count in [1u64, 5, 17, 64, 257, 1001, straddle, straddle + unit] {
                    for (seed, streams) in [(0u64, 1), (1, 1), (0x9e37_79b9, 2), (77, 2), (0, 2)] {
                        let ctx = format!(
                            "{dtype:?} {op:?} count={count} piece={piece_bytes} seed={seed} \
                             streams={streams}"
                        );
                        let mut mem = Mem(vec![0xee; 400_000]);
                        let vals = fill_pushed_inputs(&mut mem, BUF, count, dtype);
                        let calls = [0, 1].map(|r| Call {
                            kind: Kind::AllReduce,
                            input: BUF[r],
                            output: BUF[r],
                            count,
                            dtype,
                            op,
                        });
                        let plans = [0, 1]
                            .map(|r| plan_pushed_in_place(&calls, r, piece_bytes, SCRATCH, 4096));
                        let [Some(p0), Some(p1)] = plans else {
                            // Parts differ by up to 2 x 16 bytes less one
                            // element: with 16-byte pieces the longer part's
                            // last piece can overhang the shorter one.
                            assert!(plans.iter().all(|p| p.is_none()), "{ctx}: one rank only");
                            assert_eq!(piece, unit, "{ctx}: no in-place plan");
                            continue;
                        };
                        let plans = [p0, p1].map(|p| PushedPlan { streams, ..p });
                        planned += 1;
                        for r in 0..2 {
                            // Every push waits only on an earlier one of the
                            // peer's, and lands where the peer's kernel reads.
                            let p = &plans[r];
                            assert_eq!(p.waits.len(), p.pushes.len(), "{ctx}");
                            for (k, &w) in p.waits.iter().enumerate() {
                                assert!(w as usize <= k, "{ctx}: rank {r} push {k} waits {w}");
                            }
                            let other = &plans[1 - r];
                            let l = other.landing.expect("in place");
                            let want: Vec<(u64, u64)> = other
                                .reduce
                                .pieces()
                                .map(|pc| {
                                    ((pc.hi - pc.lo) * sz, l.piece_at(pc.k, pc.lo, piece, sz))
                                })
                                .collect();
                            let got: Vec<(u64, u64)> =
                                p.pushes.iter().map(|x| (x.bytes, x.dst)).collect();
                            assert_eq!(got, want, "{ctx}: rank {r}'s pushes");
                        }
                        simulate_pushed(&mut mem, &plans, seed);
                        for r in 0..2 {
                            for i in 0..count {
                                let got = decode(dtype, &mem.get(BUF[r] + i * sz, sz));
                                let want =
                                    reference(dtype, op, vals[0][i as usize], vals[1][i as usize]);
                                assert_eq!(got, want, "{ctx} rank {r} [{i}]");
                            }
                            // Past the buffer and the scratch's first piece:
                            // untouched.
                            let tail = BUF[r] + count * sz;
                            assert!(mem.get(tail, 1000).iter().all(|&b| b == 0xee), "{ctx}");
                            let past = SCRATCH[r] + piece * sz;
                            assert!(mem.get(past, 1000).iter().all(|&b| b == 0xee), "{ctx}");
                        }
                        assert_eq!(
                            mem.get(BUF[0], count * sz),
                            mem.get(BUF[1], count * sz),
                            "{ctx}: ranks differ"
                        );
                    }
                }
            }
        }
        assert!(planned > 900);
    }

    #[test]
    fn pushes_count_in_their_stream_half() {
        let one: Vec<_> = (0..4).map(|k| counter_slot(k, 1)).collect();
        assert_eq!(one, [(0, 1), (0, 2), (0, 3), (0, 4)]);
        let two: Vec<_> = (0..5).map(|k| counter_slot(k, 2)).collect();
        assert_eq!(two, [(0, 1), (1, 1), (0, 2), (1, 2), (0, 3)]);
        // 0 and more than 2 streams: clamped, as the host and kernel do.
        assert_eq!(counter_slot(3, 0), (0, 4));
        assert_eq!(counter_slot(3, 7), (1, 2));
    }

    /// In-place reduce-scatters pushed through the peer's scratch ring
    /// ([`plan_pushed_ring`]) for every (type, op, count, piece size, ring,
    /// interleaving) against a float64/exact reference: each rank's output
    /// part is the reference, the rest of its send buffer as it was, and
    /// nothing past the scratch's slots is written. Without the slot
    /// waits, rank 0 pushing ahead overwrites pieces rank 1 has not reduced.
    #[test]
    #[allow(clippy::needless_range_loop)]
    fn in_place_reduce_scatters_push_through_the_scratch_ring() {
        const BUF: [u64; 2] = [0, 100_000];
        const SCRATCH: [u64; 2] = [200_000, 300_000];
        let mut corrupted = 0;
        for (dtype, op) in PUSHED_CASES {
            let sz = dtype.size() as u64;
            for count in [1u64, 5, 17, 64, 257, 1001] {
                for piece_bytes in [16u64, 48, 100, 4096] {
                    for slots in [1u32, 2, 4] {
                        let ring = Ring {
                            slots,
                            slot_bytes: 4096,
                        };
                        for (seed, strip) in [(0u64, false), (1, false), (77, false), (0, true)] {
                            let ctx = format!(
                                "{dtype:?} {op:?} count={count} piece={piece_bytes} \
                                 slots={slots} seed={seed} strip={strip}"
                            );
                            let mut mem = Mem(vec![0xee; 400_000]);
                            let vals = fill_pushed_inputs(&mut mem, BUF, 2 * count, dtype);
                            let inputs = [0, 1].map(|r| mem.get(BUF[r], 2 * count * sz));
                            let calls = [0, 1].map(|r| Call {
                                kind: Kind::ReduceScatter,
                                input: BUF[r],
                                output: BUF[r] + r as u64 * count * sz,
                                count,
                                dtype,
                                op,
                            });
                            let plans = [0, 1].map(|r| {
                                let mut p = plan_pushed_ring(&calls, r, piece_bytes, SCRATCH, ring)
                                    .unwrap_or_else(|| panic!("{ctx}: no ring plan"));
                                if strip {
                                    p.waits.iter_mut().for_each(|w| *w = 0);
                                }
                                p
                            });
                            simulate_pushed(&mut mem, &plans, seed);
                            let mut wrong = 0;
                            for r in 0..2 {
                                for i in 0..count {
                                    let e = (r as u64 * count + i) as usize;
                                    let at = calls[r].output + i * sz;
                                    let got = decode(dtype, &mem.get(at, sz));
                                    if got != reference(dtype, op, vals[0][e], vals[1][e]) {
                                        wrong += 1;
                                    }
                                }
                                // The peer's part of the send buffer: as it was.
                                let q = 1 - r;
                                let (lo, n) = (q as u64 * count * sz, count * sz);
                                assert_eq!(
                                    mem.get(BUF[r] + lo, n),
                                    inputs[r][lo as usize..(lo + n) as usize].to_vec(),
                                    "{ctx}: rank {r}'s send buffer"
                                );
                                let past = SCRATCH[r] + slots as u64 * 4096;
                                assert!(mem.get(past, 1000).iter().all(|&b| b == 0xee), "{ctx}");
                            }
                            if strip {
                                corrupted += (wrong > 0) as u32;
                            } else {
                                assert_eq!(wrong, 0, "{ctx}");
                            }
                        }
                    }
                }
            }
        }
        assert!(corrupted > 0, "stripped slot waits went unnoticed");
        // Refused: out of place, an all-reduce, a piece over a slot.
        let rs = |o1: u64| {
            [0u64, 1].map(|r| Call {
                kind: Kind::ReduceScatter,
                input: BUF[r as usize],
                output: if r == 1 { o1 } else { BUF[0] },
                count: 1000,
                dtype: DataType::Float32,
                op: Op::Sum,
            })
        };
        let ring = Ring {
            slots: 4,
            slot_bytes: 4096,
        };
        assert!(plan_pushed_ring(&rs(BUF[1] + 4000), 0, 4096, SCRATCH, ring).is_some());
        assert!(plan_pushed_ring(&rs(BUF[1]), 0, 4096, SCRATCH, ring).is_none());
        assert!(plan_pushed_ring(&rs(BUF[1] + 4000), 0, 8192, SCRATCH, ring).is_none());
        let mut ar = rs(BUF[1] + 4000);
        ar.iter_mut().for_each(|c| c.kind = Kind::AllReduce);
        assert!(plan_pushed_ring(&ar, 0, 4096, SCRATCH, ring).is_none());
    }

    /// The waits are what keeps an in-place push off values the peer has
    /// not sent yet: without them, rank 0 pushing ahead of rank 1 (the
    /// simulation's first-ready order) corrupts the result.
    #[test]
    fn in_place_pushes_without_their_waits_corrupt_the_result() {
        let (dtype, op, count, piece_bytes) = (DataType::Float32, Op::Sum, 1001u64, 100u64);
        let calls = [0u64, 100_000].map(|b| Call {
            kind: Kind::AllReduce,
            input: b,
            output: b,
            count,
            dtype,
            op,
        });
        let run = |strip: bool| {
            let mut mem = Mem(vec![0; 400_000]);
            for r in 0..2u64 {
                for i in 0..count {
                    mem.put(
                        r * 100_000 + i * 4,
                        &encode(dtype, (i + 1) as f64 * (r + 1) as f64),
                    );
                }
            }
            let plans = [0, 1].map(|r| {
                let mut p =
                    plan_pushed_in_place(&calls, r, piece_bytes, [200_000, 300_000], 4096).unwrap();
                if strip {
                    p.waits.iter_mut().for_each(|w| *w = 0);
                }
                p
            });
            simulate_pushed(&mut mem, &plans, 0);
            (0..count)
                .filter(|&i| decode(dtype, &mem.get(i * 4, 4)) != (i + 1) as f64 * 3.0)
                .count()
        };
        assert_eq!(run(false), 0);
        assert!(run(true) > 0, "stripped waits went unnoticed");
    }

    /// What the in-place plan refuses: out of place on either rank, a
    /// reduce-scatter, a piece larger than the scratch.
    #[test]
    fn in_place_plans_only_for_in_place_all_reduces_that_fit() {
        let c = |input: u64, output: u64, kind| Call {
            kind,
            input,
            output,
            count: 1 << 20,
            dtype: DataType::Float32,
            op: Op::Sum,
        };
        let ar = Kind::AllReduce;
        let ok = [c(0, 0, ar), c(1 << 30, 1 << 30, ar)];
        let p = plan_pushed_in_place(&ok, 0, 1 << 20, [5 << 30, 6 << 30], 1 << 20).unwrap();
        // 2 MiB parts in 1 MiB pieces: the second piece lands on the first
        // of the peer's part, after the peer's first push.
        assert_eq!(p.pushes.len(), 2 + push_taper(1 << 20) as usize);
        assert_eq!(p.waits[..2], [0, 1]);
        assert_eq!(p.pushes[0].dst, 6 << 30);
        assert_eq!(p.pushes[1].dst, 1 << 30);
        assert!(plan_pushed_in_place(&ok, 1, 1 << 20, [0, 0], (1 << 20) - 16).is_none());
        let oop = [c(0, 1 << 29, ar), c(1 << 30, 1 << 30, ar)];
        assert!(plan_pushed_in_place(&oop, 0, 1 << 20, [0, 0], 1 << 20).is_none());
        let rs = Kind::ReduceScatter;
        let rs = [c(0, 0, rs), c(1 << 30, 1 << 30, rs)];
        assert!(plan_pushed_in_place(&rs, 0, 1 << 20, [0, 0], 1 << 20).is_none());
    }

    /// Every (collective, type, op, count, placement, ring, policy) in the
    /// simulated address space against a float64/exact reference: odd
    /// counts, counts that no piece size divides, fewer elements than a
    /// piece, in place and out of place; both ranks' outputs equal bits.
    #[test]
    // Ranks index several parallel arrays (inputs, outputs, expectations).
    #[allow(clippy::needless_range_loop)]
    fn schedules_compute_the_collectives_in_a_simulated_space() {
        const IN: [u64; 2] = [0, 100_000];
        const OUT: [u64; 2] = [200_000, 300_000];
        const SCRATCH: [u64; 2] = [400_000, 450_000];
        let cases = [
            (DataType::Float32, Op::Sum),
            (DataType::Float32, Op::Prod),
            (DataType::Int32, Op::Max),
            (DataType::Float64, Op::Min),
            (DataType::Uint8, Op::Prod),
        ];
        let rings = [
            Ring {
                slots: 4,
                slot_bytes: 64,
            },
            Ring {
                slots: 1,
                slot_bytes: 16,
            },
            Ring {
                slots: 3,
                slot_bytes: 48,
            },
        ];
        let policies = [
            Policy::CopiesFirst,
            Policy::KernelFirst,
            Policy::Random(0x9e37_79b9),
        ];
        for kind in [Kind::AllReduce, Kind::ReduceScatter] {
            for (dtype, op) in cases {
                let sz = dtype.size() as u64;
                for count in [1u64, 5, 17, 64, 257, 1001] {
                    for in_place in [false, true] {
                        for ring in rings {
                            for policy in policies {
                                let ctx = format!(
                                    "{kind:?} {dtype:?} {op:?} count={count} in_place={in_place} {ring:?} {policy:?}"
                                );
                                let in_elems = match kind {
                                    Kind::AllReduce => count,
                                    Kind::ReduceScatter => 2 * count,
                                };
                                let mut mem = Mem(vec![0xee; 500_000]);
                                let input = |r: usize| if in_place { OUT[r] } else { IN[r] };
                                // Rank r's input: values whose reductions are
                                // exact checks of order and rounding.
                                let val = |r: usize, i: u64| -> f64 {
                                    match dtype {
                                        DataType::Uint8 => ((i * 7 + r as u64 * 3) % 256) as f64,
                                        DataType::Int32 => {
                                            (i as f64 * 37.0 - 5000.0)
                                                * if r == 0 { 1.0 } else { -1.0 }
                                        }
                                        _ => {
                                            (i as f64 + 0.1) * if r == 0 { 1.25 } else { -0.3 }
                                                + (i % 3) as f64
                                        }
                                    }
                                };
                                let mut vals = [vec![], vec![]];
                                for r in 0..2 {
                                    for i in 0..in_elems {
                                        let e = encode(dtype, val(r, i));
                                        vals[r].push(decode(dtype, &e));
                                        mem.put(input(r) + i * sz, &e);
                                    }
                                }
                                let calls = [0, 1].map(|r| Call {
                                    kind,
                                    input: input(r),
                                    output: match (kind, in_place) {
                                        (Kind::ReduceScatter, true) => {
                                            input(r) + r as u64 * count * sz
                                        }
                                        _ => OUT[r],
                                    },
                                    count,
                                    dtype,
                                    op,
                                });
                                let plans = plan_pair(calls, SCRATCH, ring);
                                simulate(&mut mem, plans, ring, policy);
                                for r in 0..2 {
                                    let (lo, n) = match kind {
                                        Kind::AllReduce => (0, count),
                                        Kind::ReduceScatter => (r as u64 * count, count),
                                    };
                                    for i in 0..n {
                                        let got =
                                            decode(dtype, &mem.get(calls[r].output + i * sz, sz));
                                        let e = (lo + i) as usize;
                                        let want = reference(dtype, op, vals[0][e], vals[1][e]);
                                        assert_eq!(got, want, "{ctx} rank {r} [{i}]");
                                    }
                                }
                                if kind == Kind::AllReduce {
                                    assert_eq!(
                                        mem.get(calls[0].output, count * sz),
                                        mem.get(calls[1].output, count * sz),
                                        "{ctx}: ranks differ"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The checker catches a schedule that reuses a slot before the kernel
    /// consumed it: the device ring's plan without its waits, with the copy
    /// stream running ahead.
    #[test]
    #[should_panic(expected = "reused before it was consumed")]
    fn a_slot_reused_before_it_is_consumed_is_caught() {
        let ring = Ring {
            slots: 2,
            slot_bytes: 16,
        };
        let c = call(Kind::ReduceScatter, 0, 1000, 40, DataType::Float32, Op::Sum);
        let c1 = Call {
            input: 2000,
            output: 3000,
            ..c
        };
        let mut plans = plan_pair([c, c1], [5000, 6000], ring);
        for p in plans.iter_mut() {
            p.steps
                .retain(|s| !matches!(s, Step::WaitConsumed { .. } | Step::ClearConsumed { .. }));
        }
        let mut mem = Mem(vec![0; 8000]);
        simulate(&mut mem, plans, ring, Policy::CopiesFirst);
    }

    /// And the real schedule never does, whoever runs ahead, for the
    /// device's ring shape too (scaled addresses, no data checked).
    #[test]
    fn the_device_ring_schedule_keeps_the_slot_discipline() {
        let c = call(
            Kind::AllReduce,
            0,
            0,
            (SLOT_BYTES * 9 + 12) / 4,
            DataType::Float32,
            Op::Sum,
        );
        let [p0, p1] = plan_pair([c, c], [0, 0], RING);
        for p in [&p0, &p1] {
            let pulls = p
                .steps
                .iter()
                .filter(|s| matches!(s, Step::Pull { .. }))
                .count();
            assert_eq!(pulls, p.reduce.pieces().count());
            // Every pull after the first SLOTS waits for the piece SLOTS before it.
            let mut seen = 0u32;
            for (i, s) in p.steps.iter().enumerate() {
                if let Step::Pull { slot, xfer } = s {
                    assert!(xfer.bytes <= SLOT_BYTES && xfer.bytes % 4 == 0);
                    if seen >= SLOTS {
                        assert_eq!(
                            p.steps[i - 1],
                            Step::ClearConsumed { slot: *slot },
                            "pull {seen}"
                        );
                        assert_eq!(
                            p.steps[i - 2],
                            Step::WaitConsumed {
                                slot: *slot,
                                value: seen - SLOTS + 1
                            }
                        );
                    }
                    seen += 1;
                }
            }
        }
        // The gather pulls the peer's part into the same place.
        assert_eq!(p0.gather[0].dst, p1.reduce.output);
    }
}
