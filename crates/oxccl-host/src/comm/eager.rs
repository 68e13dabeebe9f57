//! Small sends and receives between ranks of one host without the step
//! engine: a group of only `Send`/`Recv` operations of at most
//! [`EAGER_MAX_BYTES`] each, to peers already connected by rings (threads
//! of this process or processes of this host), is written straight into
//! the point-to-point rings and read straight out of them.
//!
//! The bytes on the wire are the step engine's, to the bit: per operation
//! a 24-byte [`Header`] (the stream's sequence number, the call) and the
//! data padded to 8 bytes, on the first point-to-point channel. So either
//! end may take either path (a peer with a larger group, a lazily
//! connected peer, TCP), headers still catch mismatched calls, and
//! operations on one stream keep issue order (each stream serves its
//! operations in the group's order; different streams progress together,
//! so pairs of sends and receives never deadlock whatever their order).
//!
//! Why: the generic path builds a program, an engine, hash sets and
//! message strings per call and polls through them; 2 ranks exchanging
//! 8 bytes took 5.8 us a call that way against Open MPI's 0.33 us on the
//! same machine, while the rings themselves cross in a few hundred ns
//! (a header and a data line, one release store each way).

use super::{HostComm, OpDesc};
use crate::transport::{LinkKind, RecvHalf, SendHalf};
use oxccl_core::engine::{check_header, Header, HEADER_BYTES};
use oxccl_core::schedule::{pad8, Shaped};
use oxccl_core::{CollKind, Error, ErrorKind, Result};
use oxccl_env::Subsys;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Largest send or receive the eager path takes, in bytes. Above it the
/// engine's per-call cost (a few us) is small beside the copy (64 KiB
/// crosses in about 5 us at the rings' 13 GB/s here), and large receives
/// want its cache-bypassing copy.
pub const EAGER_MAX_BYTES: usize = 64 << 10;

/// Most operations in one group the eager path takes (every pass looks at
/// each once, and each operation checks the ones before it for its stream).
pub const EAGER_MAX_OPS: usize = 32;

/// Polls before the wait first reads the clock: a peer that is on time
/// answers within a few hundred ns, and reading the clock costs tens.
const FREE_POLLS: u32 = 64;

/// After the spin, how long a waiting rank yields before it sleeps (as the
/// one-shot slots' wait: under load the peer needs this CPU).
const YIELD_FOR: Duration = Duration::from_millis(2);

/// Whether the eager path takes `ops` on `comm`: every operation a send or
/// receive of at most [`EAGER_MAX_BYTES`] to another rank that rings reach
/// and that is connected already, with its buffer non-NULL when it moves
/// bytes, and no receive buffer overlapping another buffer of the group.
/// Anything else (including the argument errors, which the generic path
/// reports) takes the generic path.
pub(super) fn takes(comm: &HostComm, ops: &[OpDesc]) -> bool {
    if ops.is_empty() || ops.len() > EAGER_MAX_OPS || comm.p2p_channels != 1 {
        return false;
    }
    let ch = comm.coll_channels;
    let fits = |op: &OpDesc| {
        let q = op.root;
        let bytes = op.count.checked_mul(op.dtype.size());
        let ptr_ok = match op.kind {
            CollKind::Send => !op.send.is_null(),
            CollKind::Recv => !op.recv.is_null(),
            _ => return false,
        };
        q < comm.nranks
            && q != comm.rank
            && bytes.is_some_and(|b| b <= EAGER_MAX_BYTES && (b == 0 || ptr_ok))
            && matches!(comm.kinds[q], Some(LinkKind::InProc | LinkKind::Shm))
            && comm.controls[q].is_some()
            && comm.tx[q].len() > ch
            && comm.rx[q].len() > ch
    };
    if !ops.iter().all(fits) {
        return false;
    }
    // A receive buffer overlapping any other buffer of the group is the
    // generic path's error to report.
    let range = |op: &OpDesc| {
        let b = op.count * op.dtype.size();
        match op.kind {
            CollKind::Send => (op.send as usize, b),
            _ => (op.recv as usize, b),
        }
    };
    for (i, a) in ops.iter().enumerate() {
        for b in &ops[..i] {
            let (a0, al) = range(a);
            let (b0, bl) = range(b);
            let written = a.kind == CollKind::Recv || b.kind == CollKind::Recv;
            if written && al > 0 && bl > 0 && a0 < b0 + bl && b0 < a0 + al {
                return false;
            }
        }
    }
    true
}

/// One operation of the group as it crosses.
struct Eager {
    peer: usize,
    is_send: bool,
    /// The caller's bytes (send: read; receive: written).
    ptr: *mut u8,
    bytes: usize,
    /// This rank's view of the call, with the stream's sequence number.
    header: Header,
    /// Wire bytes moved so far, of `HEADER_BYTES + pad8(bytes)`.
    pos: usize,
    /// A receive's header bytes, until it is whole and checked.
    got: [u8; HEADER_BYTES],
}

impl Eager {
    fn total(&self) -> usize {
        HEADER_BYTES + pad8(self.bytes)
    }

    fn done(&self) -> bool {
        self.pos >= self.total()
    }
}

/// Runs `ops` (which [`takes`] accepted) to completion: assigns each its
/// stream's sequence number, then moves bytes until every operation is
/// done, waiting between passes (spin, yield, sleep) and observing abort,
/// the timeout and the liveness of the peers waited on. A failure puts the
/// communicator in its error state and tells the peers, as the generic
/// path does.
///
/// # Safety
/// As [`HostComm::run`].
pub(super) unsafe fn run(comm: &mut HostComm, ops: &[OpDesc]) -> Result<()> {
    let ch = comm.coll_channels;
    let mut work: Vec<Eager> = Vec::with_capacity(ops.len());
    for op in ops {
        let bytes = op.count * op.dtype.size();
        if bytes == 0 {
            // Count 0 moves nothing and sends no header (as the engine's
            // empty program).
            continue;
        }
        let is_send = op.kind == CollKind::Send;
        let q = op.root;
        let s = comm.seqs.take(q, ch, is_send);
        if oxccl_env::log::enabled(oxccl_env::log::Level::Info, Subsys::COLL) {
            oxccl_env::info!(
                Subsys::COLL,
                "{}: opCount {s:x} sendbuff {:p} recvbuff {:p} count {} datatype {} op 0 root {q} comm rank {} [nranks={}] -> Algo eager proto Simple nchannels 1",
                op.kind.nccl_name(),
                op.send,
                op.recv,
                op.count,
                op.dtype as i32,
                comm.rank,
                comm.nranks
            );
        }
        work.push(Eager {
            peer: q,
            is_send,
            ptr: if is_send { op.send.cast_mut() } else { op.recv },
            bytes,
            header: Header {
                seq: s,
                kind: op.kind,
                dtype: op.dtype,
                op: 0,
                nchannels: 1,
                count: op.count as u64,
                root: op.root as u32,
                algo: Shaped::Ring as u8,
            },
            pos: 0,
            got: [0; HEADER_BYTES],
        });
    }
    if let Err(e) = wait(comm, &mut work, ch) {
        let e = e.context(format!("rank {} of {}", comm.rank, comm.nranks));
        oxccl_env::warn!("{e}");
        comm.fail(&e);
        return Err(e);
    }
    Ok(())
}

/// Moves what is ready of every operation that is first on its stream
/// among those not done; Ok(true) if any byte moved.
///
/// # Safety
/// Every operation's `ptr` is valid for its `bytes` (reads for a send,
/// exclusive writes for a receive) for the whole call.
unsafe fn pass(
    work: &mut [Eager],
    tx: &mut [Vec<Box<dyn SendHalf>>],
    rx: &mut [Vec<Box<dyn RecvHalf>>],
    ch: usize,
    rank: usize,
) -> Result<bool> {
    let mut moved = false;
    for i in 0..work.len() {
        let (before, rest) = work.split_at_mut(i);
        let w = &mut rest[0];
        if w.done()
            || before
                .iter()
                .any(|b| !b.done() && b.peer == w.peer && b.is_send == w.is_send)
        {
            continue;
        }
        // SAFETY: `w` is one of the operations of this function's contract.
        moved |= unsafe { step(w, tx, rx, ch, rank) }.map_err(|e| {
            e.context(format!(
                "{}(count {}, {}) {} rank {}",
                w.header.kind.snake_name(),
                w.header.count,
                w.header.dtype,
                if w.is_send { "to" } else { "from" },
                w.peer
            ))
        })?;
    }
    Ok(moved)
}

/// Moves what is ready of one operation; Ok(true) if any byte moved.
///
/// # Safety
/// As [`pass`], for `w`.
unsafe fn step(
    w: &mut Eager,
    tx: &mut [Vec<Box<dyn SendHalf>>],
    rx: &mut [Vec<Box<dyn RecvHalf>>],
    ch: usize,
    rank: usize,
) -> Result<bool> {
    let mut moved = false;
    if w.is_send {
        let hdr = w.header.encode();
        // SAFETY: by this function's contract (read-only use).
        let data = unsafe { std::slice::from_raw_parts(w.ptr.cast_const(), w.bytes) };
        let s = &mut tx[w.peer][ch];
        while !w.done() {
            let out = s.reserve()?;
            let n = (out.len() & !7).min(w.total() - w.pos);
            if n == 0 {
                break;
            }
            put_wire(&mut out[..n], w.pos, &hdr, data);
            s.commit(n);
            w.pos += n;
            moved = true;
        }
    } else {
        let s = &mut rx[w.peer][ch];
        while !w.done() {
            let inp = s.peek()?;
            let n = (inp.len() & !7).min(w.total() - w.pos);
            if n == 0 {
                break;
            }
            let mut off = 0;
            if w.pos < HEADER_BYTES {
                let k = (HEADER_BYTES - w.pos).min(n);
                w.got[w.pos..w.pos + k].copy_from_slice(&inp[..k]);
                off = k;
                if w.pos + k == HEADER_BYTES {
                    check_header(&w.got, &w.header, rank, w.peer, ch)?;
                }
            }
            let start = (w.pos + off).saturating_sub(HEADER_BYTES);
            let k = w.bytes.saturating_sub(start).min(n - off);
            if k > 0 {
                // SAFETY: `start + k <= bytes`, inside the receive
                // buffer, which is ours alone by this function's
                // contract; the ring's bytes are a different mapping.
                unsafe { std::ptr::copy_nonoverlapping(inp[off..].as_ptr(), w.ptr.add(start), k) };
            }
            s.consume(n);
            w.pos += n;
            moved = true;
        }
    }
    Ok(moved)
}

/// Writes wire bytes `pos..pos + out.len()` of one send (the header, the
/// data, zeros to the next multiple of 8) into `out`.
fn put_wire(out: &mut [u8], pos: usize, hdr: &[u8; HEADER_BYTES], data: &[u8]) {
    let mut off = 0;
    let mut p = pos;
    if p < HEADER_BYTES {
        let k = (HEADER_BYTES - p).min(out.len());
        out[..k].copy_from_slice(&hdr[p..p + k]);
        off = k;
        p += k;
    }
    if off < out.len() && p - HEADER_BYTES < data.len() {
        let d = p - HEADER_BYTES;
        let k = (data.len() - d).min(out.len() - off);
        out[off..off + k].copy_from_slice(&data[d..d + k]);
        off += k;
    }
    out[off..].fill(0);
}

/// Passes until every operation is done, waiting between idle passes.
fn wait(comm: &mut HostComm, work: &mut [Eager], ch: usize) -> Result<()> {
    let (timeout, spin) = (comm.cfg.timeout, comm.cfg.spin);
    let mut polls = 0u32;
    let mut start: Option<Instant> = None;
    let mut idle: Option<Instant> = None;
    let mut last_check: Option<Instant> = None;
    loop {
        // SAFETY: the pointers come from the caller's operations, valid for
        // their bytes for the whole call (HostComm::run's contract).
        let moved = unsafe { pass(work, &mut comm.tx, &mut comm.rx, ch, comm.rank)? };
        if work.iter().all(Eager::done) {
            return Ok(());
        }
        if moved {
            polls = 0;
            idle = None;
            continue;
        }
        // Ranks that outnumber the CPUs (no spin) yield from the first
        // miss: the peer they wait for may need this very CPU.
        if polls < FREE_POLLS && !spin.is_zero() {
            polls += 1;
            std::hint::spin_loop();
            continue;
        }
        let now = Instant::now();
        let t0 = *start.get_or_insert(now);
        let i0 = *idle.get_or_insert(now);
        // Abort, liveness and the timeout every 200 us of waiting, the
        // first after 200 us too (a liveness check is a system call per
        // peer, see the one-shot slots' wait).
        let l = *last_check.get_or_insert(now);
        if now.duration_since(l) >= Duration::from_micros(200) {
            last_check = Some(now);
            check(comm, work, ch)?;
            if now.duration_since(t0) >= timeout {
                return Err(Error::timeout(format!(
                    "operation did not complete within {:.1} s (OXCCL_TIMEOUT_MS): {}",
                    timeout.as_secs_f64(),
                    waiting_for(work)
                )));
            }
        }
        let waited = now.duration_since(i0);
        if waited < spin {
            std::hint::spin_loop();
        } else if waited < spin + YIELD_FOR {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Abort, and the liveness of every peer an unfinished operation waits on.
/// A peer that said goodbye is no failure while its bytes for a receive
/// are still in the ring (it wrote them before leaving).
fn check(comm: &mut HostComm, work: &[Eager], ch: usize) -> Result<()> {
    if comm.abort.load(Ordering::Acquire) {
        return Err(Error::new(
            ErrorKind::InvalidUsage,
            "operation aborted (ncclCommAbort or ncclCommRevoke)",
        ));
    }
    for w in work.iter().filter(|w| !w.done()) {
        let q = w.peer;
        let Some(Some(c)) = comm.controls.get_mut(q) else {
            continue;
        };
        if let Err(e) = c.check_while_waiting() {
            let unread =
                !w.is_send && c.left() && comm.rx[q][ch].peek().is_ok_and(|b| !b.is_empty());
            if !unread {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// What the unfinished operations wait for, for the timeout's message.
fn waiting_for(work: &[Eager]) -> String {
    let parts: Vec<String> = work
        .iter()
        .filter(|w| !w.done())
        .map(|w| {
            if w.is_send {
                format!("room to send to rank {}", w.peer)
            } else {
                format!("data from rank {}", w.peer)
            }
        })
        .collect();
    format!("send/recv waiting for {}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_bytes_are_header_data_and_zero_padding() {
        let hdr = [0xaau8; HEADER_BYTES];
        let data: Vec<u8> = (1..=13).collect();
        let total = HEADER_BYTES + pad8(data.len());
        let mut whole = vec![0xffu8; total];
        put_wire(&mut whole, 0, &hdr, &data);
        assert_eq!(&whole[..HEADER_BYTES], &hdr);
        assert_eq!(&whole[HEADER_BYTES..HEADER_BYTES + 13], &data[..]);
        assert_eq!(&whole[HEADER_BYTES + 13..], &[0, 0, 0]);
        // In pieces of 8 (a ring near its wrap point): the same bytes.
        let mut pieces = vec![0xffu8; total];
        for p in (0..total).step_by(8) {
            put_wire(&mut pieces[p..p + 8], p, &hdr, &data);
        }
        assert_eq!(pieces, whole);
        // No data: the header alone.
        let mut h = [0u8; HEADER_BYTES];
        put_wire(&mut h, 0, &hdr, &[]);
        assert_eq!(h, hdr);
    }
}
