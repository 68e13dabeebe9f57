//! Schedules: what one rank does for one operation, as lanes of steps over
//! byte streams to its peers. Pure: built from (request, plan), executed by an
//! executor that knows nothing of collectives.
//!
//! A [`Program`] is a set of [`Lane`]s. A lane is a sequence of [`Step`]s that
//! run one after another; lanes run concurrently (the executor polls them
//! round-robin, each step moving whatever bytes are ready). Every lane is
//! bound to one channel: the streams it touches are `(peer, lane.channel)`.
//! Two lanes of one program never use the same stream in the same direction,
//! so each stream carries the bytes of its single user in program order.
//!
//! Regions are byte ranges of the operation's send buffer, receive buffer or
//! a scratch buffer the executor allocates with [`Program::scratch_bytes`].
//!
//! Deadlock freedom of the pipelined rings and chains relies on
//! `slice <= stream capacity / 2` (see docs/adr/0001-host-architecture.md);
//! the builders take the slice size from the [`Shape`].

use crate::types::CollKind;

/// Which buffer a region lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The caller's send buffer (read only).
    Send,
    /// The caller's receive buffer.
    Recv,
    /// Executor-owned scratch space.
    Scratch,
}

/// A byte range of one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    pub buf: Buf,
    pub off: usize,
    pub len: usize,
}

impl Region {
    /// A region of `buf` at `off` of `len` bytes.
    pub fn new(buf: Buf, off: usize, len: usize) -> Region {
        Region { buf, off, len }
    }
    /// The sub-range `[start, start + len)` of this region, clamped to it.
    pub fn sub(self, start: usize, len: usize) -> Region {
        let s = start.min(self.len);
        let l = len.min(self.len - s);
        Region {
            buf: self.buf,
            off: self.off + s,
            len: l,
        }
    }
}

/// The local operand of a reduction step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// This rank's raw input: the op's pre-scaling applies to it.
    Raw(Region),
    /// A partial result already pre-scaled (an accumulator).
    Partial(Region),
}

impl Local {
    /// The region, whichever kind.
    pub fn region(self) -> Region {
        match self {
            Local::Raw(r) | Local::Partial(r) => r,
        }
    }
}

/// One step of a lane. Byte counts of stream steps are the region lengths;
/// on the wire every step is padded to a multiple of 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Send `src` to `to`; with `pre`, send the op's pre-scaling of it (raw input).
    Send { to: usize, src: Region, pre: bool },
    /// Receive from `from` into `dst`.
    Recv { from: usize, dst: Region },
    /// `dst = received ⊕ local`; `last` applies the op's finishing step.
    RecvReduce {
        from: usize,
        local: Local,
        dst: Region,
        last: bool,
    },
    /// Send `received ⊕ local` to `to` without storing it.
    RecvReduceSend {
        from: usize,
        to: usize,
        local: Local,
    },
    /// `dst = received ⊕ local`, and send `dst` to `to`; `last` finishes.
    RecvReduceCopySend {
        from: usize,
        to: usize,
        local: Local,
        dst: Region,
        last: bool,
    },
    /// `dst = received`, and send it on to `to`.
    RecvCopySend { from: usize, to: usize, dst: Region },
    /// Local: `dst = src` (plain copy).
    Copy { src: Region, dst: Region },
    /// Local: `dst = pre(src)`, finishing step if `last` (a reduction's first contribution).
    Start {
        src: Region,
        dst: Region,
        last: bool,
    },
    /// Local: `dst = dst ⊕ src` with both partials; finishing step if `last`.
    Combine {
        src: Region,
        dst: Region,
        last: bool,
    },
    /// Only the operation's header to `to`, no data: a rooted collective's
    /// rank that sends nothing to `to` otherwise, so that `to` can check the
    /// root it names (see [`close_root_check`]).
    SendHeader { to: usize },
    /// Only the operation's header from `from`, no data.
    RecvHeader { from: usize },
}

impl Step {
    /// The peer this step receives from, if any.
    pub fn recv_peer(&self) -> Option<usize> {
        match *self {
            Step::Recv { from, .. }
            | Step::RecvReduce { from, .. }
            | Step::RecvReduceSend { from, .. }
            | Step::RecvReduceCopySend { from, .. }
            | Step::RecvCopySend { from, .. }
            | Step::RecvHeader { from } => Some(from),
            _ => None,
        }
    }
    /// The peer this step sends to, if any.
    pub fn send_peer(&self) -> Option<usize> {
        match *self {
            Step::Send { to, .. }
            | Step::RecvReduceSend { to, .. }
            | Step::RecvReduceCopySend { to, .. }
            | Step::RecvCopySend { to, .. }
            | Step::SendHeader { to } => Some(to),
            _ => None,
        }
    }
    /// Bytes this step moves (data bytes, before padding).
    pub fn len(&self) -> usize {
        match *self {
            Step::Send { src, .. } => src.len,
            Step::Recv { dst, .. } => dst.len,
            Step::RecvReduce { dst, .. } => dst.len,
            Step::RecvReduceSend { local, .. } => local.region().len,
            Step::RecvReduceCopySend { dst, .. } => dst.len,
            Step::RecvCopySend { dst, .. } => dst.len,
            Step::Copy { dst, .. } | Step::Start { dst, .. } | Step::Combine { dst, .. } => dst.len,
            Step::SendHeader { .. } | Step::RecvHeader { .. } => 0,
        }
    }
    /// True when the step moves no bytes and carries no header (it is left
    /// out of programs; both sides agree).
    pub fn is_empty(&self) -> bool {
        self.len() == 0 && !self.is_header_only()
    }
    /// A [`Step::SendHeader`] or [`Step::RecvHeader`].
    pub fn is_header_only(&self) -> bool {
        matches!(self, Step::SendHeader { .. } | Step::RecvHeader { .. })
    }
}

/// A sequence of steps on one channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lane {
    pub channel: usize,
    pub steps: Vec<Step>,
}

impl Lane {
    fn new(channel: usize) -> Lane {
        Lane {
            channel,
            steps: Vec::new(),
        }
    }
    fn push(&mut self, s: Step) {
        if !s.is_empty() {
            self.steps.push(s);
        }
    }
}

/// What one rank does for one operation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Program {
    /// Local steps run before any lane starts.
    pub prologue: Vec<Step>,
    pub lanes: Vec<Lane>,
    /// Bytes of scratch the executor must provide.
    pub scratch_bytes: usize,
}

impl Program {
    /// Total data bytes this program sends to `(peer, channel)` and receives from it:
    /// `(sent, received)`, each padded per step to 8 bytes as on the wire.
    pub fn wire_bytes(&self, peer: usize, channel: usize) -> (u64, u64) {
        let mut s = 0u64;
        let mut r = 0u64;
        for lane in self.lanes.iter().filter(|l| l.channel == channel) {
            for st in &lane.steps {
                let w = pad8(st.len()) as u64;
                if st.send_peer() == Some(peer) {
                    s += w;
                }
                if st.recv_peer() == Some(peer) {
                    r += w;
                }
            }
        }
        (s, r)
    }

    /// Every `(peer, channel)` stream used for sending, and for receiving.
    pub fn streams(&self) -> (Vec<StreamId>, Vec<StreamId>) {
        let mut s = Vec::new();
        let mut r = Vec::new();
        for lane in &self.lanes {
            for st in &lane.steps {
                if let Some(p) = st.send_peer() {
                    if !s.contains(&(p, lane.channel)) {
                        s.push((p, lane.channel));
                    }
                }
                if let Some(p) = st.recv_peer() {
                    if !r.contains(&(p, lane.channel)) {
                        r.push((p, lane.channel));
                    }
                }
            }
        }
        (s, r)
    }
}

/// A stream: `(peer, channel)`.
pub type StreamId = (usize, usize);

/// `n` rounded up to a multiple of 8.
pub fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// How the data is cut: channels, pipeline slice, element size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Channels (independent lanes on separate streams) to spread the data over.
    pub nchannels: usize,
    /// Bytes per pipeline slice (rounded down to whole elements; at least one element).
    pub slice: usize,
    /// Bytes per element.
    pub elem: usize,
}

/// Splits `count` elements into `parts` contiguous, balanced parts:
/// `(first element, element count)` of part `i`. The first `count % parts`
/// parts have one element more.
pub fn split(count: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = count / parts;
    let extra = count % parts;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    (start, len)
}

/// The algorithm a program is built with (the executor-level subset of the
/// tuner's algorithms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shaped {
    /// Pipelined ring (or chain, for broadcast and reduce).
    Ring,
    /// Binary trees: reduce up, broadcast down; double tree with 2+ channels.
    Tree,
    /// Everyone sends everything to everyone and reduces in rank order (small all_reduce).
    OneShot,
}

/// An operation as one rank sees it, with the sizes the schedule needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub kind: CollKind,
    /// Elements per rank, as NCCL counts them (all_gather: sendcount; reduce_scatter: recvcount;
    /// alltoall/gather/scatter: elements per peer block).
    pub count: usize,
    /// Root for broadcast/reduce/gather/scatter; peer for send/recv.
    pub root: usize,
    pub rank: usize,
    pub nranks: usize,
    /// True when the caller passed the same buffer as send and receive buffer
    /// (the in-place form of the collective).
    pub in_place: bool,
}

/// Builds one rank's program.
pub fn build(req: &Request, algo: Shaped, shape: &Shape) -> Program {
    let n = req.nranks;
    let mut p = Program::default();
    match req.kind {
        CollKind::AllReduce => match algo {
            _ if n == 1 => single_all_reduce(req, shape, &mut p),
            Shaped::OneShot => one_shot_all_reduce(req, shape, &mut p),
            Shaped::Tree => tree_all_reduce(req, shape, &mut p),
            Shaped::Ring => ring_all_reduce(req, shape, &mut p),
        },
        CollKind::Broadcast => chain_broadcast(req, shape, &mut p),
        CollKind::Reduce => chain_reduce(req, shape, &mut p),
        CollKind::AllGather => ring_all_gather(req, shape, &mut p),
        CollKind::ReduceScatter => ring_reduce_scatter(req, shape, &mut p),
        CollKind::AllToAll => all_to_all(req, shape, &mut p),
        CollKind::Gather => gather(req, shape, &mut p),
        CollKind::Scatter => scatter(req, shape, &mut p),
        CollKind::Send => p2p(req, shape, true, &mut p),
        CollKind::Recv => p2p(req, shape, false, &mut p),
    }
    if matches!(
        req.kind,
        CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
    ) {
        ring_of_headers(req, &mut p);
    }
    p
}

/// Makes every rank of a rooted collective send the operation's header to
/// its ring successor and take one from its predecessor (on channel 0, as a
/// lane of its own; where data already flows on that stream the header is
/// the data's and these steps add nothing). Each rank then checks the root
/// its predecessor names against its own, so ranks that disagree on the
/// root are refused at the call: without it, ranks that each name
/// themselves root only send (broadcast, scatter) and all return success
/// with different buffers, or only receive (gather) and wait for the
/// timeout. One rank that sees the mismatch is enough: its error reaches
/// the others as a report on their control links. Costs at most one 24-byte
/// header each way per rank and call; none for count 0, which moves nothing.
fn ring_of_headers(req: &Request, p: &mut Program) {
    let n = req.nranks;
    if n < 2 || req.count == 0 {
        return;
    }
    let mut lane = Lane::new(0);
    lane.push(Step::SendHeader {
        to: (req.rank + 1) % n,
    });
    lane.push(Step::RecvHeader {
        from: (req.rank + n - 1) % n,
    });
    p.lanes.push(lane);
}

/// Iterates the slices of a part: `(offset in part, len)` in bytes, whole elements.
fn slices(part_bytes: usize, shape: &Shape) -> impl Iterator<Item = (usize, usize)> {
    let slice = (shape.slice / shape.elem).max(1) * shape.elem;
    (0..part_bytes.div_ceil(slice)).map(move |i| {
        let off = i * slice;
        (off, slice.min(part_bytes - off))
    })
}

/// Number of channels to use for `count` elements: never more than elements.
fn channels(shape: &Shape, count: usize) -> usize {
    shape.nchannels.clamp(1, count.max(1))
}

fn single_all_reduce(req: &Request, shape: &Shape, p: &mut Program) {
    let bytes = req.count * shape.elem;
    let mut lane = Lane::new(0);
    lane.push(Step::Start {
        src: Region::new(Buf::Send, 0, bytes),
        dst: Region::new(Buf::Recv, 0, bytes),
        last: true,
    });
    p.lanes.push(lane);
}

/// Ring all-reduce: 2(n-1) steps, each rank sends and receives 2(n-1)/n of the data.
/// Per slice: send chunk r; reduce-and-forward chunks r-1 .. r-n+2; at step n-1 the
/// chunk r+1 is final (stored and forwarded); then n-2 copy-and-forward steps and a
/// final receive.
fn ring_all_reduce(req: &Request, shape: &Shape, p: &mut Program) {
    let n = req.nranks;
    let r = req.rank;
    let e = shape.elem;
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    let nch = channels(shape, req.count);
    for ch in 0..nch {
        let (cstart, ccount) = split(req.count, nch, ch);
        let mut lane = Lane::new(ch);
        // Chunks of this channel's part, one per rank: (byte offset, byte len).
        let chunk = |c: usize| {
            let (s, l) = split(ccount, n, c);
            ((cstart + s) * e, l * e)
        };
        let max_chunk = chunk(0).1;
        for (soff, _) in slices(max_chunk, shape) {
            let slice_len = (shape.slice / e).max(1) * e;
            let piece = |c: usize| {
                let (off, len) = chunk(c);
                let s = soff.min(len);
                (off + s, slice_len.min(len - s))
            };
            let send_reg = |c: usize| {
                let (o, l) = piece(c);
                Region::new(Buf::Send, o, l)
            };
            let recv_reg = |c: usize| {
                let (o, l) = piece(c);
                Region::new(Buf::Recv, o, l)
            };
            let idx = |j: usize| (r + n * 2 - j) % n;
            lane.push(Step::Send {
                to: right,
                src: send_reg(idx(0)),
                pre: true,
            });
            for j in 1..n - 1 {
                lane.push(Step::RecvReduceSend {
                    from: left,
                    to: right,
                    local: Local::Raw(send_reg(idx(j))),
                });
            }
            lane.push(Step::RecvReduceCopySend {
                from: left,
                to: right,
                local: Local::Raw(send_reg(idx(n - 1))),
                dst: recv_reg(idx(n - 1)),
                last: true,
            });
            for j in n..2 * n - 2 {
                lane.push(Step::RecvCopySend {
                    from: left,
                    to: right,
                    dst: recv_reg(idx(j)),
                });
            }
            lane.push(Step::Recv {
                from: left,
                dst: recv_reg(idx(2 * n - 2)),
            });
        }
        p.lanes.push(lane);
    }
}

/// One-shot all-reduce: one round; every rank sends its (pre-scaled) input to every
/// peer and reduces the n contributions in rank order, so all ranks compute the same
/// bits. Latency: one hop; bytes sent per rank: (n-1)·S. For small messages only.
fn one_shot_all_reduce(req: &Request, shape: &Shape, p: &mut Program) {
    let n = req.nranks;
    let r = req.rank;
    let bytes = req.count * shape.elem;
    let all_send = Region::new(Buf::Send, 0, bytes);
    let dst = Region::new(Buf::Recv, 0, bytes);
    // The pre-scaled input goes to scratch first (the prologue): peers are sent that
    // copy, and with the in-place form the receive buffer may be overwritten by
    // rank 0's contribution before this rank's own input is used.
    let local = Region::new(Buf::Scratch, 0, bytes);
    p.scratch_bytes = bytes;
    p.prologue.push(Step::Start {
        src: all_send,
        dst: local,
        last: false,
    });
    let mut main = Lane::new(0);
    for q in 0..n {
        if q == r {
            continue;
        }
        let mut lane = Lane::new(0);
        lane.push(Step::Send {
            to: q,
            src: local,
            pre: false,
        });
        p.lanes.push(lane);
    }
    for q in 0..n {
        let last = q == n - 1;
        if q == 0 {
            if r == 0 {
                main.push(Step::Copy { src: local, dst });
            } else {
                main.push(Step::Recv { from: 0, dst });
            }
        } else if q == r {
            main.push(Step::Combine {
                src: local,
                dst,
                last,
            });
        } else {
            main.push(Step::RecvReduce {
                from: q,
                local: Local::Partial(dst),
                dst,
                last,
            });
        }
    }
    p.lanes.insert(0, main);
}

/// Binary-tree positions of rank `r` in a heap-ordered tree over `order`:
/// returns (parent, children) as ranks.
pub(crate) fn tree_links(order: &[usize], r: usize) -> (Option<usize>, Vec<usize>) {
    let pos = order.iter().position(|&x| x == r).unwrap_or(0);
    let parent = if pos == 0 {
        None
    } else {
        Some(order[(pos - 1) / 2])
    };
    let children = [2 * pos + 1, 2 * pos + 2]
        .into_iter()
        .filter(|&c| c < order.len())
        .map(|c| order[c])
        .collect();
    (parent, children)
}

/// Tree all-reduce: reduce up a binary tree, broadcast the result down, slice by
/// slice; with 2+ channels the data is halved over two trees whose interior nodes
/// are mostly each other's leaves (the second tree is the first mirrored), so both
/// directions of every link carry data. Latency: 2·log2(n) hops instead of 2(n-1).
/// Each tree uses two lanes (up and down) on its own channel: up moves child→parent
/// streams, down parent→child streams, so they never share a stream.
fn tree_all_reduce(req: &Request, shape: &Shape, p: &mut Program) {
    let n = req.nranks;
    let r = req.rank;
    let e = shape.elem;
    let ntrees = if channels(shape, req.count) >= 2 {
        2
    } else {
        1
    };
    for t in 0..ntrees {
        let order: Vec<usize> = if t == 0 {
            (0..n).collect()
        } else {
            (0..n).rev().collect()
        };
        let (parent, children) = tree_links(&order, r);
        let (pstart, pcount) = split(req.count, ntrees, t);
        let part = Region::new(Buf::Send, pstart * e, pcount * e);
        let out = Region::new(Buf::Recv, pstart * e, pcount * e);
        let mut up = Lane::new(t);
        let mut down = Lane::new(t);
        for (soff, slen) in slices(part.len, shape) {
            let src = part.sub(soff, slen);
            let dst = out.sub(soff, slen);
            let is_root = parent.is_none();
            if children.is_empty() {
                if let Some(pa) = parent {
                    up.push(Step::Send {
                        to: pa,
                        src,
                        pre: true,
                    });
                }
            } else {
                for (i, &c) in children.iter().enumerate() {
                    let last_child = i + 1 == children.len();
                    let local = if i == 0 {
                        Local::Raw(src)
                    } else {
                        Local::Partial(dst)
                    };
                    if is_root || !last_child {
                        up.push(Step::RecvReduce {
                            from: c,
                            local,
                            dst,
                            last: is_root && last_child,
                        });
                    } else if let Some(pa) = parent {
                        up.push(Step::RecvReduceCopySend {
                            from: c,
                            to: pa,
                            local,
                            dst,
                            last: false,
                        });
                    }
                }
            }
            // Down: the root sends the final slice (after its up lane made it; the
            // executor orders that with the `after` rule below), others receive it.
            let mut targets = children.iter().copied();
            if is_root {
                for c in targets.by_ref() {
                    up.push(Step::Send {
                        to: c,
                        src: dst,
                        pre: false,
                    });
                }
            } else if let Some(pa) = parent {
                match targets.next() {
                    None => down.push(Step::Recv { from: pa, dst }),
                    Some(c0) => {
                        down.push(Step::RecvCopySend {
                            from: pa,
                            to: c0,
                            dst,
                        });
                        for c in targets {
                            down.push(Step::Send {
                                to: c,
                                src: dst,
                                pre: false,
                            });
                        }
                    }
                }
            }
        }
        p.lanes.push(up);
        if !down.steps.is_empty() {
            p.lanes.push(down);
        }
    }
}

/// Chain order starting at `root`: root, root+1, ..., root-1.
fn chain_pos(req: &Request) -> usize {
    (req.rank + req.nranks - req.root) % req.nranks
}

/// Broadcast along a pipelined chain from the root: every link carries S once.
fn chain_broadcast(req: &Request, shape: &Shape, p: &mut Program) {
    let n = req.nranks;
    let e = shape.elem;
    let pos = chain_pos(req);
    let next = (req.rank + 1) % n;
    let prev = (req.rank + n - 1) % n;
    let nch = channels(shape, req.count);
    for ch in 0..nch {
        let (s, l) = split(req.count, nch, ch);
        let part = (s * e, l * e);
        let mut lane = Lane::new(ch);
        if pos == 0 && !req.in_place {
            lane.push(Step::Copy {
                src: Region::new(Buf::Send, part.0, part.1),
                dst: Region::new(Buf::Recv, part.0, part.1),
            });
        }
        if n > 1 {
            for (soff, slen) in slices(part.1, shape) {
                let src = Region::new(Buf::Send, part.0 + soff, slen);
                let dst = Region::new(Buf::Recv, part.0 + soff, slen);
                if pos == 0 {
                    lane.push(Step::Send {
                        to: next,
                        src,
                        pre: false,
                    });
                } else if pos == n - 1 {
                    lane.push(Step::Recv { from: prev, dst });
                } else {
                    lane.push(Step::RecvCopySend {
                        from: prev,
                        to: next,
                        dst,
                    });
                }
            }
        }
        p.lanes.push(lane);
    }
}

/// Reduce along a pipelined chain ending at the root: root+1 starts, each rank adds
/// its input and forwards, the root finishes into its receive buffer.
fn chain_reduce(req: &Request, shape: &Shape, p: &mut Program) {
    let n = req.nranks;
    let e = shape.elem;
    let pos = chain_pos(req); // root is 0; the chain goes 1 -> 2 -> ... -> n-1 -> 0
    let next = (req.rank + 1) % n;
    let prev = (req.rank + n - 1) % n;
    let nch = channels(shape, req.count);
    for ch in 0..nch {
        let (s, l) = split(req.count, nch, ch);
        let part = (s * e, l * e);
        let mut lane = Lane::new(ch);
        if n == 1 {
            lane.push(Step::Start {
                src: Region::new(Buf::Send, part.0, part.1),
                dst: Region::new(Buf::Recv, part.0, part.1),
                last: true,
            });
        } else {
            for (soff, slen) in slices(part.1, shape) {
                let src = Region::new(Buf::Send, part.0 + soff, slen);
                let dst = Region::new(Buf::Recv, part.0 + soff, slen);
                if pos == 1 {
                    lane.push(Step::Send {
                        to: next,
                        src,
                        pre: true,
                    });
                } else if pos == 0 {
                    lane.push(Step::RecvReduce {
                        from: prev,
                        local: Local::Raw(src),
                        dst,
                        last: true,
                    });
                } else {
                    lane.push(Step::RecvReduceSend {
                        from: prev,
                        to: next,
                        local: Local::Raw(src),
                    });
                }
            }
        }
        p.lanes.push(lane);
    }
}

/// Ring all-gather: n-1 steps; rank r's block travels the ring once.
fn ring_all_gather(req: &Request, shape: &Shape, p: &mut Program) {
    let n = req.nranks;
    let r = req.rank;
    let e = shape.elem;
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    let block = req.count * e;
    let nch = channels(shape, req.count);
    for ch in 0..nch {
        let (s, l) = split(req.count, nch, ch);
        let (poff, plen) = (s * e, l * e);
        let mut lane = Lane::new(ch);
        if !req.in_place {
            lane.push(Step::Copy {
                src: Region::new(Buf::Send, poff, plen),
                dst: Region::new(Buf::Recv, r * block + poff, plen),
            });
        }
        if n > 1 {
            for (soff, slen) in slices(plen, shape) {
                let blk = |c: usize| Region::new(Buf::Recv, c * block + poff + soff, slen);
                lane.push(Step::Send {
                    to: right,
                    src: if req.in_place {
                        blk(r)
                    } else {
                        Region::new(Buf::Send, poff + soff, slen)
                    },
                    pre: false,
                });
                for j in 1..n - 1 {
                    lane.push(Step::RecvCopySend {
                        from: left,
                        to: right,
                        dst: blk((r + n - j) % n),
                    });
                }
                lane.push(Step::Recv {
                    from: left,
                    dst: blk((r + 1) % n),
                });
            }
        }
        p.lanes.push(lane);
    }
}

/// Ring reduce-scatter: n-1 steps; at step j rank r forwards the partial of block
/// r-j-1; the partial of its own block r arrives complete at step n-1.
fn ring_reduce_scatter(req: &Request, shape: &Shape, p: &mut Program) {
    let n = req.nranks;
    let r = req.rank;
    let e = shape.elem;
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    let block = req.count * e;
    let nch = channels(shape, req.count);
    for ch in 0..nch {
        let (s, l) = split(req.count, nch, ch);
        let (poff, plen) = (s * e, l * e);
        let mut lane = Lane::new(ch);
        for (soff, slen) in slices(plen, shape) {
            let blk = |c: usize| Region::new(Buf::Send, c * block + poff + soff, slen);
            // In place, the receive buffer is block r of the send buffer.
            let base = if req.in_place { r * block } else { 0 };
            let dst = Region::new(Buf::Recv, base + poff + soff, slen);
            if n == 1 {
                lane.push(Step::Start {
                    src: blk(0),
                    dst,
                    last: true,
                });
                continue;
            }
            lane.push(Step::Send {
                to: right,
                src: blk((r + n - 1) % n),
                pre: true,
            });
            for j in 1..n - 1 {
                lane.push(Step::RecvReduceSend {
                    from: left,
                    to: right,
                    local: Local::Raw(blk((r + 2 * n - j - 1) % n)),
                });
            }
            lane.push(Step::RecvReduce {
                from: left,
                local: Local::Raw(blk(r)),
                dst,
                last: true,
            });
        }
        p.lanes.push(lane);
    }
}

/// Pushes lanes moving `bytes` from `src` to peer `q` (split over channels) .
fn send_lanes(p: &mut Program, shape: &Shape, q: usize, src: Region, count: usize) {
    let nch = channels(shape, count);
    for ch in 0..nch {
        let (s, l) = split(count, nch, ch);
        let mut lane = Lane::new(ch);
        lane.push(Step::Send {
            to: q,
            src: src.sub(s * shape.elem, l * shape.elem),
            pre: false,
        });
        p.lanes.push(lane);
    }
}

fn recv_lanes(p: &mut Program, shape: &Shape, q: usize, dst: Region, count: usize) {
    let nch = channels(shape, count);
    for ch in 0..nch {
        let (s, l) = split(count, nch, ch);
        let mut lane = Lane::new(ch);
        lane.push(Step::Recv {
            from: q,
            dst: dst.sub(s * shape.elem, l * shape.elem),
        });
        p.lanes.push(lane);
    }
}

/// All-to-all: block q of the send buffer goes to rank q, block q of the receive
/// buffer comes from rank q; every pair concurrently (one lane per stream).
fn all_to_all(req: &Request, shape: &Shape, p: &mut Program) {
    let b = req.count * shape.elem;
    for q in 0..req.nranks {
        let src = Region::new(Buf::Send, q * b, b);
        let dst = Region::new(Buf::Recv, q * b, b);
        if q == req.rank {
            let mut lane = Lane::new(0);
            lane.push(Step::Copy { src, dst });
            p.lanes.push(lane);
        } else {
            send_lanes(p, shape, q, src, req.count);
            recv_lanes(p, shape, q, dst, req.count);
        }
    }
}

/// Gather: every rank sends its block to the root, which stores block q from rank q.
fn gather(req: &Request, shape: &Shape, p: &mut Program) {
    let b = req.count * shape.elem;
    if req.rank == req.root {
        for q in 0..req.nranks {
            let dst = Region::new(Buf::Recv, q * b, b);
            if q == req.rank {
                if !req.in_place {
                    let mut lane = Lane::new(0);
                    lane.push(Step::Copy {
                        src: Region::new(Buf::Send, 0, b),
                        dst,
                    });
                    p.lanes.push(lane);
                }
            } else {
                recv_lanes(p, shape, q, dst, req.count);
            }
        }
    } else {
        send_lanes(p, shape, req.root, Region::new(Buf::Send, 0, b), req.count);
    }
}

/// Scatter: the root sends block q of its send buffer to rank q.
fn scatter(req: &Request, shape: &Shape, p: &mut Program) {
    let b = req.count * shape.elem;
    if req.rank == req.root {
        for q in 0..req.nranks {
            let src = Region::new(Buf::Send, q * b, b);
            if q == req.rank {
                if !req.in_place {
                    let mut lane = Lane::new(0);
                    lane.push(Step::Copy {
                        src,
                        dst: Region::new(Buf::Recv, 0, b),
                    });
                    p.lanes.push(lane);
                }
            } else {
                send_lanes(p, shape, q, src, req.count);
            }
        }
    } else {
        recv_lanes(p, shape, req.root, Region::new(Buf::Recv, 0, b), req.count);
    }
}

/// A point-to-point send (`is_send`) or receive with `req.root` as the peer.
fn p2p(req: &Request, shape: &Shape, is_send: bool, p: &mut Program) {
    let b = req.count * shape.elem;
    if is_send {
        send_lanes(p, shape, req.root, Region::new(Buf::Send, 0, b), req.count);
    } else {
        recv_lanes(p, shape, req.root, Region::new(Buf::Recv, 0, b), req.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_balanced_and_covers() {
        for count in [0usize, 1, 2, 7, 64, 1001] {
            for parts in 1..=9 {
                let mut next = 0;
                for i in 0..parts {
                    let (s, l) = split(count, parts, i);
                    assert_eq!(s, next);
                    assert!(l == count / parts || l == count / parts + 1);
                    next = s + l;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn region_sub_clamps() {
        let r = Region::new(Buf::Recv, 100, 10);
        assert_eq!(r.sub(4, 100), Region::new(Buf::Recv, 104, 6));
        assert_eq!(r.sub(20, 5).len, 0);
    }
}
