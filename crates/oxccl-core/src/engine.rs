//! The step engine: runs one rank's [`Program`] over byte streams, moving
//! whatever bytes are ready each time it is polled. Pure: the streams are
//! traits (shared-memory rings, TCP sockets, in-memory queues in tests), and
//! waiting, timeouts, abort and liveness belong to the executor that polls.
//!
//! Every operation's bytes on a stream start with a [`Header`]; the receiver
//! checks it against its own call so that mismatched calls across ranks are an
//! `InvalidUsage` error naming both calls, never silent corruption.

use crate::error::{Error, Result};
use crate::reduce::Reduction;
use crate::schedule::{pad8, Buf, Local, Program, Region, Step};
use crate::types::{CollKind, DataType};

/// The sending half of a stream to one peer on one channel.
pub trait SendHalf: Send {
    /// Contiguous free space (empty when full). Err when the stream is known dead.
    fn reserve(&mut self) -> Result<&mut [u8]>;
    /// Publish the first `n` bytes of the last reservation (`n` a multiple of 8).
    fn commit(&mut self, n: usize);
    /// Move buffered bytes towards the peer; Ok(true) if anything moved.
    fn flush(&mut self) -> Result<bool>;
    /// Committed bytes not yet handed to the wire (TCP's user-space buffer);
    /// an operation is complete only when this is 0.
    fn unflushed(&self) -> usize {
        0
    }
}

/// The receiving half of a stream from one peer on one channel.
pub trait RecvHalf: Send {
    /// Contiguous received, unconsumed bytes (empty when none).
    fn peek(&mut self) -> Result<&[u8]>;
    /// Drop the first `n` bytes of the last peek (`n` a multiple of 8).
    fn consume(&mut self, n: usize);
    /// Pull bytes from the wire; Ok(true) if anything moved.
    fn fill(&mut self) -> Result<bool>;
}

/// Bytes of a [`Header`] on the wire.
pub const HEADER_BYTES: usize = 24;

/// What an operation announces at the start of its bytes on a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// How many operations this stream carried before this one.
    pub seq: u32,
    pub kind: CollKind,
    pub dtype: DataType,
    /// `RedOp::wire_code` (0 for data movement).
    pub op: u8,
    /// Channels the sender spread the operation over.
    pub nchannels: u8,
    /// Elements per rank, as the caller counted them.
    pub count: u64,
    /// Root or peer, as the caller gave it.
    pub root: u32,
    /// Algorithm code (see `schedule::Shaped`), so ranks with different tunings are caught.
    pub algo: u8,
}

impl Header {
    /// The 24 wire bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&self.seq.to_le_bytes());
        b[4] = self.kind.wire_code();
        b[5] = self.dtype as i32 as u8;
        b[6] = self.op;
        b[7] = self.nchannels;
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..20].copy_from_slice(&self.root.to_le_bytes());
        b[20] = self.algo;
        b[21] = 0x0c; // marker: catches a stream that is out of step
        b
    }

    /// Decodes a header; `None` when the bytes are not a header at all.
    pub fn decode(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER_BYTES || b[21] != 0x0c {
            return None;
        }
        let kind = *CollKind::ALL.get(b[4] as usize)?;
        let dtype = DataType::from_raw(b[5] as i32).ok()?;
        Some(Header {
            seq: u32::from_le_bytes(b[0..4].try_into().ok()?),
            kind,
            dtype,
            op: b[6],
            nchannels: b[7],
            count: u64::from_le_bytes(b[8..16].try_into().ok()?),
            root: u32::from_le_bytes(b[16..20].try_into().ok()?),
            algo: b[20],
        })
    }

    fn describe(&self) -> String {
        format!(
            "{}(count={}, {}, op={}, root/peer={}, algo={}, channels={}) #{}",
            self.kind,
            self.count,
            self.dtype,
            self.op,
            self.root,
            self.algo,
            self.nchannels,
            self.seq
        )
    }
}

/// Checks the header `buf` received from `peer` on channel `ch` against
/// `expect`, this rank's view of the call (with the stream's `seq`): a
/// mismatch is an `InvalidUsage` error naming both calls. The receiving side
/// of a point-to-point pair announces Recv, the sender Send; everything else
/// must be equal.
pub fn check_header(
    buf: &[u8; HEADER_BYTES],
    expect: &Header,
    rank: usize,
    peer: usize,
    ch: usize,
) -> Result<()> {
    let got = Header::decode(buf);
    let ok = match got {
        Some(g) => {
            let kinds_match = g.kind == expect.kind
                || (g.kind == CollKind::Send && expect.kind == CollKind::Recv);
            let root_match = match expect.kind {
                CollKind::Recv => g.root as usize == rank,
                _ => g.root == expect.root,
            };
            kinds_match
                && root_match
                && g.seq == expect.seq
                && g.dtype == expect.dtype
                && g.op == expect.op
                && g.count == expect.count
                && g.nchannels == expect.nchannels
                && g.algo == expect.algo
        }
        None => false,
    };
    if ok {
        return Ok(());
    }
    let theirs = got
        .map(|g| g.describe())
        .unwrap_or_else(|| "bytes that are not an operation header".to_string());
    Err(Error::invalid_usage(format!(
        "mismatched operations between rank {rank} and rank {peer} (channel {ch}): rank {rank} called {}, rank {peer} sent {theirs}",
        expect.describe()
    )))
}

/// The caller's buffers for one operation. With `send == None` the operation is
/// in place: regions of [`Buf::Send`] are read from the receive buffer.
pub struct Buffers<'a> {
    pub send: Option<&'a [u8]>,
    pub recv: &'a mut [u8],
    pub scratch: &'a mut [u8],
}

/// Per-stream operation counters of a communicator, by peer and channel,
/// each direction in one flat array: a group saves them before preparing
/// its operations, so a copy is two allocations whatever the rank count
/// (a vector per peer made it 2 N + 1 a call).
#[derive(Debug, Clone, Default)]
pub struct StreamSeqs {
    nchannels: usize,
    tx: Vec<u32>,
    rx: Vec<u32>,
}

impl StreamSeqs {
    /// Counters for `nranks` peers and `nchannels` channels, all zero.
    pub fn new(nranks: usize, nchannels: usize) -> StreamSeqs {
        StreamSeqs {
            nchannels,
            tx: vec![0; nranks * nchannels],
            rx: vec![0; nranks * nchannels],
        }
    }

    /// The sequence number of the next operation on the stream to
    /// (`is_send`) or from `peer` on `channel`, counted.
    pub fn take(&mut self, peer: usize, channel: usize, is_send: bool) -> u32 {
        let i = peer * self.nchannels + channel;
        let v = if is_send { &mut self.tx } else { &mut self.rx };
        let s = v[i];
        v[i] = s.wrapping_add(1);
        s
    }

    /// Operations sent on every stream so far (NCCL's `opCount` in logs).
    pub fn sent(&self) -> u32 {
        self.tx.iter().fold(0, |a, &s| a.wrapping_add(s))
    }
}

/// How far a stream's header has crossed. Rings hand out contiguous space
/// only up to their wrap point, so when a stream's position is 8 or 16 bytes
/// before the wrap, the 24-byte header must cross in 8-byte pieces: waiting
/// for 24 contiguous bytes there waits forever (a deadlock found by the
/// oxccl integration tests once enough small operations had wrapped a ring).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeaderState {
    /// Bytes moved so far; a receiver keeps them until the header is whole.
    Pending(usize, [u8; HEADER_BYTES]),
    Done,
}

#[derive(Debug, Clone)]
struct LaneState {
    idx: usize,
    /// Wire bytes of the current step done.
    pos: usize,
}

/// Copies received bytes into the caller's receive buffer. The executor may
/// supply one that bypasses the caches for large operations (a destination
/// that won't be read soon costs a read-for-ownership per line otherwise:
/// 3 bytes of memory traffic per byte placed instead of 2).
pub type BulkCopy = fn(&mut [u8], &[u8]);

fn plain_copy(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

/// One rank's running operation.
pub struct Engine {
    bulk: BulkCopy,
    program: Program,
    red: Option<Reduction>,
    header: Header,
    rank: usize,
    lanes: Vec<LaneState>,
    /// Header state per used stream: ((peer, channel), state, seq).
    tx_hdr: Vec<((usize, usize), HeaderState, u32)>,
    rx_hdr: Vec<((usize, usize), HeaderState, u32)>,
    prologue_done: bool,
}

impl Engine {
    /// An engine for `program`; `header` is this rank's view of the call (its
    /// `seq` is ignored: each stream's own counter is used). `seqs` is advanced
    /// for every stream the program uses.
    pub fn new(
        program: Program,
        red: Option<Reduction>,
        header: Header,
        rank: usize,
        seqs: &mut StreamSeqs,
    ) -> Engine {
        let (tx, rx) = program.streams();
        let tx_hdr = tx
            .into_iter()
            .map(|(p, c)| {
                let s = seqs.take(p, c, true);
                ((p, c), HeaderState::Pending(0, [0; HEADER_BYTES]), s)
            })
            .collect();
        let rx_hdr = rx
            .into_iter()
            .map(|(p, c)| {
                let s = seqs.take(p, c, false);
                ((p, c), HeaderState::Pending(0, [0; HEADER_BYTES]), s)
            })
            .collect();
        let lanes = vec![LaneState { idx: 0, pos: 0 }; program.lanes.len()];
        Engine {
            bulk: plain_copy,
            program,
            red,
            header,
            rank,
            lanes,
            tx_hdr,
            rx_hdr,
            prologue_done: false,
        }
    }

    /// Uses `f` to place received bytes in the receive buffer.
    pub fn set_bulk_copy(&mut self, f: BulkCopy) {
        self.bulk = f;
    }

    /// True when every lane has finished.
    pub fn is_done(&self) -> bool {
        self.prologue_done
            && self
                .lanes
                .iter()
                .zip(&self.program.lanes)
                .all(|(s, l)| s.idx >= l.steps.len())
    }

    /// The program this engine runs.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Where lane `li` of the program is: (index of its current step, wire
    /// bytes of that step done); the index is the lane's step count once it
    /// finished. For observers of progress (the profiler's proxy steps).
    pub fn lane_cursor(&self, li: usize) -> (usize, usize) {
        self.lanes.get(li).map_or((0, 0), |s| (s.idx, s.pos))
    }

    /// The streams still waited on, for messages: (peer, channel, is_send).
    pub fn waiting_on(&self) -> Vec<(usize, usize, bool)> {
        let mut v = Vec::new();
        for (st, lane) in self.lanes.iter().zip(&self.program.lanes) {
            if let Some(step) = lane.steps.get(st.idx) {
                if let Some(p) = step.recv_peer() {
                    v.push((p, lane.channel, false));
                } else if let Some(p) = step.send_peer() {
                    v.push((p, lane.channel, true));
                }
            }
        }
        v
    }

    /// Moves every byte that is ready. Ok(true) if anything moved.
    pub fn poll(
        &mut self,
        bufs: &mut Buffers<'_>,
        tx: &mut [Vec<Box<dyn SendHalf>>],
        rx: &mut [Vec<Box<dyn RecvHalf>>],
    ) -> Result<bool> {
        let mut moved = false;
        if !self.prologue_done {
            for step in self.program.prologue.clone() {
                self.local_step(bufs, &step)?;
            }
            self.prologue_done = true;
            moved = true;
        }
        for li in 0..self.lanes.len() {
            loop {
                let lane = &self.program.lanes[li];
                let Some(&step) = lane.steps.get(self.lanes[li].idx) else {
                    break;
                };
                let ch = lane.channel;
                let total = pad8(step.len());
                let pos = self.lanes[li].pos;
                let w = self.step(bufs, tx, rx, &step, ch, pos, total)?;
                if w == 0 {
                    break;
                }
                moved = true;
                let st = &mut self.lanes[li];
                st.pos += w;
                if st.pos >= total {
                    st.idx += 1;
                    st.pos = 0;
                }
            }
        }
        Ok(moved)
    }

    fn local_step(&self, bufs: &mut Buffers<'_>, step: &Step) -> Result<()> {
        match *step {
            Step::Copy { src, dst } => with_pair(bufs, src, dst, 0, dst.len, |p| match p {
                Pair::Same(_) => {}
                Pair::Split(s, d) => d.copy_from_slice(s),
            }),
            Step::Start { src, dst, last } => {
                let red = self.reduction()?;
                with_pair(bufs, src, dst, 0, dst.len, |p| match p {
                    Pair::Same(d) => red.start_in_place(d, last),
                    Pair::Split(s, d) => red.start(d, s, last),
                })
            }
            Step::Combine { src, dst, last } => {
                let red = self.reduction()?;
                with_pair(bufs, src, dst, 0, dst.len, |p| match p {
                    Pair::Same(_) => {}
                    Pair::Split(s, d) => red.combine(d, s, last),
                })
            }
            _ => Err(Error::internal("a stream step in a program's prologue")),
        }
    }

    fn reduction(&self) -> Result<&Reduction> {
        self.red
            .as_ref()
            .ok_or_else(|| Error::internal("reduction step in a program without a reduction"))
    }

    /// Ensures the header of `(peer, ch)` is written; Ok(false) if no room yet.
    fn send_header(
        &mut self,
        tx: &mut [Vec<Box<dyn SendHalf>>],
        peer: usize,
        ch: usize,
    ) -> Result<bool> {
        let Some(ent) = self.tx_hdr.iter_mut().find(|e| e.0 == (peer, ch)) else {
            return Err(Error::internal(
                "send on a stream the program did not declare",
            ));
        };
        let HeaderState::Pending(done, _) = ent.1 else {
            return Ok(true);
        };
        let h = Header {
            seq: ent.2,
            ..self.header
        };
        let s = stream(tx, peer, ch)?;
        let out = s.reserve()?;
        let w = round8(out.len()).min(HEADER_BYTES - done);
        if w == 0 {
            return Ok(false);
        }
        out[..w].copy_from_slice(&h.encode()[done..done + w]);
        s.commit(w);
        if done + w < HEADER_BYTES {
            ent.1 = HeaderState::Pending(done + w, [0; HEADER_BYTES]);
            return Ok(false);
        }
        ent.1 = HeaderState::Done;
        Ok(true)
    }

    /// Ensures the header of `(peer, ch)` was received and matches; Ok(false) if not here yet.
    fn recv_header(
        &mut self,
        rx: &mut [Vec<Box<dyn RecvHalf>>],
        peer: usize,
        ch: usize,
    ) -> Result<bool> {
        let rank = self.rank;
        let mine = self.header;
        let Some(ent) = self.rx_hdr.iter_mut().find(|e| e.0 == (peer, ch)) else {
            return Err(Error::internal(
                "receive on a stream the program did not declare",
            ));
        };
        let HeaderState::Pending(done, mut buf) = ent.1 else {
            return Ok(true);
        };
        let s = stream(rx, peer, ch)?;
        let inp = s.peek()?;
        let w = round8(inp.len()).min(HEADER_BYTES - done);
        if w == 0 {
            return Ok(false);
        }
        buf[done..done + w].copy_from_slice(&inp[..w]);
        s.consume(w);
        if done + w < HEADER_BYTES {
            ent.1 = HeaderState::Pending(done + w, buf);
            return Ok(false);
        }
        check_header(&buf, &Header { seq: ent.2, ..mine }, rank, peer, ch)?;
        ent.1 = HeaderState::Done;
        Ok(true)
    }

    /// Advances one step by up to what is ready; returns wire bytes moved.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        bufs: &mut Buffers<'_>,
        tx: &mut [Vec<Box<dyn SendHalf>>],
        rx: &mut [Vec<Box<dyn RecvHalf>>],
        step: &Step,
        ch: usize,
        pos: usize,
        total: usize,
    ) -> Result<usize> {
        if let Some(p) = step.recv_peer() {
            if !self.recv_header(rx, p, ch)? {
                return Ok(0);
            }
        }
        if let Some(p) = step.send_peer() {
            if !self.send_header(tx, p, ch)? {
                return Ok(0);
            }
        }
        let len = step.len();
        let rem = total - pos;
        let red = self.red;
        match *step {
            Step::Copy { .. } | Step::Start { .. } | Step::Combine { .. } => {
                self.local_step(bufs, step)?;
                Ok(total.max(8))
            }
            // Its header went out or was checked above: nothing else to move.
            Step::SendHeader { .. } | Step::RecvHeader { .. } => Ok(HEADER_BYTES),
            Step::Send { to, src, pre } => {
                let s = stream(tx, to, ch)?;
                let out = s.reserve()?;
                let w = round8(out.len()).min(rem);
                if w == 0 {
                    return Ok(0);
                }
                let d = w.min(len - pos.min(len));
                let data = read_region(bufs, src, pos, d)?;
                if pre {
                    red.ok_or_else(|| Error::internal("pre-scaled send without a reduction"))?
                        .start(&mut out[..d], data, false);
                } else {
                    out[..d].copy_from_slice(data);
                }
                out[d..w].fill(0);
                s.commit(w);
                Ok(w)
            }
            Step::Recv { from, dst } => {
                let s = stream(rx, from, ch)?;
                let inp = s.peek()?;
                let w = round8(inp.len()).min(rem);
                if w == 0 {
                    return Ok(0);
                }
                let d = w.min(len - pos.min(len));
                (self.bulk)(write_region(bufs, dst, pos, d)?, &inp[..d]);
                s.consume(w);
                Ok(w)
            }
            Step::RecvReduce {
                from,
                local,
                dst,
                last,
            } => {
                let red = red.ok_or_else(|| Error::internal("reduce step without a reduction"))?;
                let s = stream(rx, from, ch)?;
                let inp = s.peek()?;
                let w = round8(inp.len()).min(rem);
                if w == 0 {
                    return Ok(0);
                }
                let d = w.min(len - pos.min(len));
                reduce_into(bufs, &red, local, dst, pos, d, &inp[..d], last)?;
                s.consume(w);
                Ok(w)
            }
            Step::RecvReduceSend { from, to, local } => {
                let red = red.ok_or_else(|| Error::internal("reduce step without a reduction"))?;
                let (si, so) = two_streams(rx, tx, from, to, ch)?;
                let inp = si.peek()?;
                let out = so.reserve()?;
                let w = round8(inp.len()).min(round8(out.len())).min(rem);
                if w == 0 {
                    return Ok(0);
                }
                let d = w.min(len - pos.min(len));
                let l = read_region(bufs, local.region(), pos, d)?;
                reduce_to(&red, local, &mut out[..d], l, &inp[..d], false);
                out[d..w].fill(0);
                so.commit(w);
                si.consume(w);
                Ok(w)
            }
            Step::RecvReduceCopySend {
                from,
                to,
                local,
                dst,
                last,
            } => {
                let red = red.ok_or_else(|| Error::internal("reduce step without a reduction"))?;
                let (si, so) = two_streams(rx, tx, from, to, ch)?;
                let inp = si.peek()?;
                let out = so.reserve()?;
                let w = round8(inp.len()).min(round8(out.len())).min(rem);
                if w == 0 {
                    return Ok(0);
                }
                let d = w.min(len - pos.min(len));
                // Reduce into the outgoing stream (cache-resident), then place
                // the same bytes in the receive buffer: one pass over the
                // inputs, and the buffer write can bypass the caches.
                let l = read_region(bufs, local.region(), pos, d)?;
                reduce_to(&red, local, &mut out[..d], l, &inp[..d], last);
                (self.bulk)(write_region(bufs, dst, pos, d)?, &out[..d]);
                out[d..w].fill(0);
                so.commit(w);
                si.consume(w);
                Ok(w)
            }
            Step::RecvCopySend { from, to, dst } => {
                let (si, so) = two_streams(rx, tx, from, to, ch)?;
                let inp = si.peek()?;
                let out = so.reserve()?;
                let w = round8(inp.len()).min(round8(out.len())).min(rem);
                if w == 0 {
                    return Ok(0);
                }
                let d = w.min(len - pos.min(len));
                out[..w].copy_from_slice(&inp[..w]);
                (self.bulk)(write_region(bufs, dst, pos, d)?, &inp[..d]);
                so.commit(w);
                si.consume(w);
                Ok(w)
            }
        }
    }
}

fn round8(n: usize) -> usize {
    n & !7
}

fn stream<T: ?Sized>(v: &mut [Vec<Box<T>>], peer: usize, ch: usize) -> Result<&mut T> {
    v.get_mut(peer)
        .and_then(|c| c.get_mut(ch))
        .map(|b| &mut **b)
        .ok_or_else(|| Error::internal(format!("no stream to rank {peer} on channel {ch}")))
}

fn two_streams<'a>(
    rx: &'a mut [Vec<Box<dyn RecvHalf>>],
    tx: &'a mut [Vec<Box<dyn SendHalf>>],
    from: usize,
    to: usize,
    ch: usize,
) -> Result<(&'a mut dyn RecvHalf, &'a mut dyn SendHalf)> {
    Ok((stream(rx, from, ch)?, stream(tx, to, ch)?))
}

enum Pair<'a> {
    /// Source and destination are the same bytes.
    Same(&'a mut [u8]),
    Split(&'a [u8], &'a mut [u8]),
}

fn bad_region(r: Region, start: usize, len: usize) -> Error {
    Error::internal(format!(
        "region {:?}+{}..{} outside its buffer",
        r, start, len
    ))
}

fn read_region<'a>(bufs: &'a Buffers<'_>, r: Region, start: usize, len: usize) -> Result<&'a [u8]> {
    let base: &[u8] = match r.buf {
        Buf::Send => bufs.send.unwrap_or(&*bufs.recv),
        Buf::Recv => bufs.recv,
        Buf::Scratch => bufs.scratch,
    };
    let a = r.off + start;
    base.get(a..a + len)
        .ok_or_else(|| bad_region(r, start, len))
}

fn write_region<'a>(
    bufs: &'a mut Buffers<'_>,
    r: Region,
    start: usize,
    len: usize,
) -> Result<&'a mut [u8]> {
    let base: &mut [u8] = match r.buf {
        Buf::Send if bufs.send.is_none() => bufs.recv,
        Buf::Send => return Err(Error::internal("write to the send buffer")),
        Buf::Recv => bufs.recv,
        Buf::Scratch => bufs.scratch,
    };
    let a = r.off + start;
    base.get_mut(a..a + len)
        .ok_or_else(|| bad_region(r, start, len))
}

/// Which physical buffer a region resolves to: 0 send, 1 recv, 2 scratch.
fn phys(bufs: &Buffers<'_>, b: Buf) -> u8 {
    match b {
        Buf::Send if bufs.send.is_some() => 0,
        Buf::Send | Buf::Recv => 1,
        Buf::Scratch => 2,
    }
}

/// Gives `f` the bytes `[start, start+len)` of `src` (read) and `dst` (write).
fn with_pair<R>(
    bufs: &mut Buffers<'_>,
    src: Region,
    dst: Region,
    start: usize,
    len: usize,
    f: impl FnOnce(Pair<'_>) -> R,
) -> Result<R> {
    let ps = phys(bufs, src.buf);
    let pd = phys(bufs, dst.buf);
    let (sa, da) = (src.off + start, dst.off + start);
    if ps == pd {
        let base: &mut [u8] = match pd {
            1 => bufs.recv,
            2 => bufs.scratch,
            _ => return Err(Error::internal("write to the send buffer")),
        };
        if base.len() < sa.max(da) + len {
            return Err(bad_region(dst, start, len));
        }
        if sa == da {
            return Ok(f(Pair::Same(&mut base[da..da + len])));
        }
        if sa + len <= da {
            let (lo, hi) = base.split_at_mut(da);
            return Ok(f(Pair::Split(&lo[sa..sa + len], &mut hi[..len])));
        }
        if da + len <= sa {
            let (lo, hi) = base.split_at_mut(sa);
            return Ok(f(Pair::Split(&hi[..len], &mut lo[da..da + len])));
        }
        return Err(Error::internal(format!(
            "overlapping regions {src:?} and {dst:?} in one step"
        )));
    }
    let (s, d): (&[u8], &mut [u8]) = match (ps, pd) {
        (0, 1) => (bufs.send.unwrap_or(&[]), &mut *bufs.recv),
        (0, 2) => (bufs.send.unwrap_or(&[]), &mut *bufs.scratch),
        (1, 2) => (&*bufs.recv, &mut *bufs.scratch),
        (2, 1) => (&*bufs.scratch, &mut *bufs.recv),
        _ => return Err(Error::internal("write to the send buffer")),
    };
    let s = s
        .get(sa..sa + len)
        .ok_or_else(|| bad_region(src, start, len))?;
    let d = d
        .get_mut(da..da + len)
        .ok_or_else(|| bad_region(dst, start, len))?;
    Ok(f(Pair::Split(s, d)))
}

/// `dst[pos..pos+d] = inp ⊕ local[pos..pos+d]`.
/// `out = inp ⊕ l`, where `l` holds the bytes of `local`: pre-scaled first
/// when they are raw input, combined as they are when already a partial.
fn reduce_to(red: &Reduction, local: Local, out: &mut [u8], l: &[u8], inp: &[u8], last: bool) {
    match local {
        Local::Raw(_) => red.accumulate(out, l, inp, last),
        Local::Partial(_) => red.combine3(out, l, inp, last),
    }
}

#[allow(clippy::too_many_arguments)]
fn reduce_into(
    bufs: &mut Buffers<'_>,
    red: &Reduction,
    local: Local,
    dst: Region,
    pos: usize,
    d: usize,
    inp: &[u8],
    last: bool,
) -> Result<()> {
    let raw = matches!(local, Local::Raw(_));
    with_pair(bufs, local.region(), dst, pos, d, |p| match (p, raw) {
        (Pair::Same(b), true) => red.accumulate_in_place(b, inp, last),
        (Pair::Same(b), false) => red.combine(b, inp, last),
        (Pair::Split(l, o), _) => reduce_to(red, local, o, l, inp, last),
    })
}
