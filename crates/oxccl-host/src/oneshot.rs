//! Small collectives between the processes of one host, one-shot over
//! shared-memory slots: each rank writes its input (pre-scaled for a
//! reduction) and then a sequence number into a slot of its own segment,
//! and every rank takes what it needs from all ranks' slots: all-reduce
//! and reduce combine them in rank order, reduce-scatter its block of
//! each, all-gather every block, broadcast the root's (the other ranks
//! post no data, only the sequence number that lets the root reuse its
//! slot). One synchronisation,
//! no separate signal, no ring header, no allocation, lock or system call
//! on the way: the cost is one cache-line hand-off from every peer (plus the
//! data's lines), against the ring path's header, data and head/tail
//! updates through each peer's ring and the step engine around them.
//!
//! Slots and their reuse: a rank has two slots, used by sequence number
//! parity, and a call needs only the posts it reads: an all-reduce,
//! all-gather and reduce-scatter every rank's, a reduce's root every rank's
//! and the other ranks none, a broadcast's receivers the root's and the
//! root none. So ranks may be a call apart, and reuse has a rule of its
//! own: before posting call `s` a rank waits until every peer has posted
//! call `s - 1` ([`ShmOneShot::clear_to_post`]). A peer posts `s - 1` only
//! after it finished call `s - 2`, its last read of the slot that call `s`
//! rewrites, so a slot is never rewritten while a peer may still read it,
//! and no acknowledgement beyond the posts is needed. A broadcast root then
//! returns once its input is in its slot and waits, at its next call, only
//! for the receivers' posts of this one; back-to-back broadcasts overlap.
//! After a call that read every rank's post the wait costs nothing.
//!
//! Why two slots and not three: with three, a rank would wait only for the
//! peers' posts of `s - 2` and could run two calls ahead, but a peer's slot
//! `(s - 2) % 3` could then already hold `s + 1`, so the wait could no longer
//! compare the peers' record of call `s - 2` with its own, and mismatched
//! calls that the rank did not read (a broadcast root's view of the
//! receivers) would go unseen. With two, the slot a rank waits on holds
//! exactly `s - 1` or the older `s - 3` (a peer cannot post `s + 1` before
//! this rank posts `s`), so the check is exact; one call of slack is what
//! lets a root's return overlap its receivers' reads.
//!
//! Calls of one communicator must run one after another (the executor keeps
//! them in issue order).
//!
//! Slot layout (64-byte aligned, `stride` bytes each):
//!
//! ```text
//! 0   sequence number (u64, written last, with release)
//! 8   what was posted: count, root, collective, datatype, op (to catch mismatched calls)
//! 16  data (the first 48 bytes share the sequence number's cache line)
//! ```

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use oxccl_core::slots::describe_meta;
pub use oxccl_core::slots::SlotCall;
use oxccl_core::{CollKind, Error, Reduction, Result};

use crate::transport::ShmSegment;

/// The largest all-reduce, in bytes, that takes the slots. One-shot reads
/// every rank's whole input, so it loses to the ring's reduce-scatter +
/// all-gather as sizes grow; at 2 ranks, 4 KiB moves two 4 KiB inputs, a
/// few hundred ns at 20 GB/s, well under the ring path's fixed cost.
pub const ONESHOT_MAX_BYTES: usize = 4096;

const SLOT_HEAD: usize = 16;

/// Bytes between slots for inputs of up to `max` bytes.
pub fn slot_stride(max: usize) -> usize {
    (SLOT_HEAD + max).next_multiple_of(64)
}

/// Bytes of a rank's slot area (two slots, by parity).
pub fn area_bytes(max: usize) -> usize {
    2 * slot_stride(max)
}

/// One rank's view of every rank's slot area on this host.
pub struct ShmOneShot {
    rank: usize,
    /// Each rank's slot area as mapped here (this rank's included).
    areas: Vec<NonNull<u8>>,
    max: usize,
    stride: usize,
    /// The sequence number of the last call posted.
    seq: u64,
    /// Every peer is known to have posted calls up to this one.
    clear: u64,
    /// Keep the mappings alive.
    _segments: Vec<Arc<ShmSegment>>,
}

// SAFETY: the pointers are into shared mappings kept alive by `_segments`;
// a ShmOneShot is used by one thread at a time (it needs `&mut` to post).
unsafe impl Send for ShmOneShot {}

impl std::fmt::Debug for ShmOneShot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmOneShot")
            .field("rank", &self.rank)
            .field("nranks", &self.areas.len())
            .field("max", &self.max)
            .field("seq", &self.seq)
            .finish()
    }
}

/// How far a wait has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Peer `waiting_for` has not posted call `seq` yet.
    Waiting { waiting_for: usize, seq: u64 },
    /// Every post waited for is there.
    Ready,
}

/// Whether `rank` reads `q`'s post of `call` (`q != rank`): reductions to
/// every rank and gathers read every post, a reduce's root every post, a
/// broadcast's receivers the root's; a reduce's other ranks and a
/// broadcast's root read none.
pub fn reads(call: &SlotCall, rank: usize, q: usize) -> bool {
    match call.kind {
        CollKind::Broadcast => rank != call.root && q == call.root,
        CollKind::Reduce => rank == call.root,
        _ => true,
    }
}

impl ShmOneShot {
    /// `segments[q]`: rank q's segment (this rank's own, or a peer's as
    /// mapped here), each made with a slot area of [`area_bytes`]`(max)`.
    pub fn new(rank: usize, segments: Vec<Arc<ShmSegment>>, max: usize) -> Result<ShmOneShot> {
        let mut areas = Vec::with_capacity(segments.len());
        for (q, s) in segments.iter().enumerate() {
            let (p, len) = s.slot_area().ok_or_else(|| {
                Error::internal(format!(
                    "one-shot slots: rank {q}'s segment has no slot area"
                ))
            })?;
            if len < area_bytes(max) {
                return Err(Error::internal(format!(
                    "one-shot slots: rank {q}'s slot area has {len} bytes, {} needed",
                    area_bytes(max)
                )));
            }
            areas.push(p);
        }
        if rank >= areas.len() {
            return Err(Error::internal(format!(
                "one-shot slots: rank {rank} of {}",
                areas.len()
            )));
        }
        Ok(ShmOneShot {
            rank,
            areas,
            max,
            stride: slot_stride(max),
            seq: 0,
            clear: 0,
            _segments: segments,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The largest input, in bytes.
    pub fn max_bytes(&self) -> usize {
        self.max
    }

    /// Ranks.
    pub fn nranks(&self) -> usize {
        self.areas.len()
    }

    /// The sequence number the next call posts.
    pub fn next_seq(&self) -> u64 {
        self.seq + 1
    }

    fn slot(&self, q: usize, seq: u64) -> *mut u8 {
        // SAFETY: the offset lies within rank q's slot area (two slots of
        // `stride` bytes, checked in `new`).
        unsafe { self.areas[q].as_ptr().add((seq % 2) as usize * self.stride) }
    }

    fn words(&self, q: usize, seq: u64) -> &[AtomicU64; 2] {
        // SAFETY: the slot is 64-byte aligned, mapped as long as self, and
        // its first 16 bytes are only accessed through atomics in every
        // process.
        unsafe { &*self.slot(q, seq).cast::<[AtomicU64; 2]>() }
    }

    /// Posts this rank's input for the next call: `input` (pre-scaled by
    /// `red` for a reduction) into its slot, then the sequence number.
    /// Returns the call's sequence number. `input.len()` must be
    /// `call.posted_bytes(rank, nranks)`, at most the maximum.
    pub fn post(&mut self, call: &SlotCall, input: &[u8], red: Option<&Reduction>) -> Result<u64> {
        let want = call.posted_bytes(self.rank, self.areas.len());
        if input.len() > self.max || input.len() != want {
            return Err(Error::internal(format!(
                "one-shot {}: {} bytes posted, {want} expected, at most {}",
                call.kind.snake_name(),
                input.len(),
                self.max
            )));
        }
        let seq = self.seq + 1;
        if self.clear < self.seq {
            return Err(Error::internal(format!(
                "one-shot {}: call {seq} posted before every peer posted call {}",
                call.kind.snake_name(),
                self.seq
            )));
        }
        // SAFETY: the data part of this rank's slot `seq % 2`, inside the
        // area; no peer reads it now (every peer posted call `seq - 1`, so
        // finished call `seq - 2`, checked above; see the module's notes)
        // and it does not overlap the atomic words.
        let data = unsafe {
            std::slice::from_raw_parts_mut(self.slot(self.rank, seq).add(SLOT_HEAD), input.len())
        };
        match red {
            Some(red) => red.start(data, input, false),
            None => data.copy_from_slice(input),
        }
        let w = self.words(self.rank, seq);
        w[1].store(call.meta(), Ordering::Relaxed);
        w[0].store(seq, Ordering::Release);
        self.seq = seq;
        Ok(seq)
    }

    /// Whether this rank may post its next call: every peer has posted the
    /// call before it (see the module's notes), or one it is waiting for,
    /// looking at `from` first. A peer whose record of that call differs
    /// from this rank's is an error naming both.
    pub fn clear_to_post(&mut self, from: usize) -> Result<Progress> {
        let last = self.seq;
        if self.clear >= last {
            return Ok(Progress::Ready);
        }
        let n = self.areas.len();
        let mine = self.words(self.rank, last)[1].load(Ordering::Relaxed);
        for i in 0..n {
            let q = (from + i) % n;
            if q == self.rank {
                continue;
            }
            if !self.posted(q, last) {
                return Ok(Progress::Waiting {
                    waiting_for: q,
                    seq: last,
                });
            }
            self.check_post(q, last, mine)?;
        }
        self.clear = last;
        Ok(Progress::Ready)
    }

    /// Whether every peer whose post of call `seq` this rank reads
    /// ([`reads`]) posted it, or one it is waiting for, looking at `from`
    /// first; a peer that posted a different call is an error naming both.
    /// Then [`ShmOneShot::finish`] takes the result.
    pub fn progress(&mut self, seq: u64, call: &SlotCall, from: usize) -> Result<Progress> {
        let n = self.areas.len();
        let mine = self.words(self.rank, seq)[1].load(Ordering::Relaxed);
        let mut all = true;
        for i in 0..n {
            let q = (from + i) % n;
            if q == self.rank {
                continue;
            }
            if !reads(call, self.rank, q) {
                all = false;
                continue;
            }
            if !self.posted(q, seq) {
                return Ok(Progress::Waiting {
                    waiting_for: q,
                    seq,
                });
            }
            self.check_post(q, seq, mine)?;
        }
        if all {
            self.clear = self.clear.max(seq);
        }
        Ok(Progress::Ready)
    }

    /// An error if peer `q`'s post of call `seq` (seen posted) records
    /// another call than `mine`.
    fn check_post(&self, q: usize, seq: u64, mine: u64) -> Result<()> {
        let theirs = self.words(q, seq)[1].load(Ordering::Relaxed);
        if theirs != mine {
            return Err(Error::invalid_usage(format!(
                "mismatched collectives: rank {q} called {}, rank {} {} \
                 (every rank must call the same collectives in the same order, with \
                 the same count, datatype, op and root)",
                describe_meta(theirs),
                self.rank,
                describe_meta(mine)
            )));
        }
        Ok(())
    }

    /// Whether peer `q` posted call `seq`.
    pub fn posted(&self, q: usize, seq: u64) -> bool {
        self.words(q, seq)[0].load(Ordering::Acquire) == seq
    }

    /// Takes this rank's result of call `seq` from every rank's slot into
    /// `out` (`call.output_bytes(rank, nranks)` bytes; ignored when 0).
    /// Reductions combine the slots in rank order, so every rank gets the
    /// same bits. Only after [`ShmOneShot::progress`] said
    /// [`Progress::Ready`] for it.
    pub fn finish(&self, seq: u64, call: &SlotCall, out: &mut [u8], red: Option<&Reduction>) {
        let n = self.areas.len();
        let e = call.dtype.size();
        let blk = call.count * e;
        let want = call.output_bytes(self.rank, n);
        if want == 0 {
            return;
        }
        let out = &mut out[..want];
        // SAFETY: bytes `off..off + len` of the data part of rank q's slot
        // `seq % 2`, which q posted (seen with acquire in `progress`; only
        // the slots of peers `reads` names are read below) and does not
        // rewrite before this rank posts `seq + 1` (see the module's notes);
        // `off + len` is within what q posted.
        let data = |q: usize, off: usize, len: usize| unsafe {
            std::slice::from_raw_parts(self.slot(q, seq).add(SLOT_HEAD + off).cast_const(), len)
        };
        let off = if call.kind == CollKind::ReduceScatter {
            self.rank * blk
        } else {
            0
        };
        match (call.kind, red) {
            (CollKind::AllGather, _) => {
                for (q, dst) in out.chunks_exact_mut(blk).enumerate() {
                    dst.copy_from_slice(data(q, 0, blk));
                }
            }
            (CollKind::Broadcast, _) => out.copy_from_slice(data(call.root, 0, blk)),
            (_, Some(red)) if n >= 2 => {
                red.combine3(out, data(0, off, blk), data(1, off, blk), n == 2);
                for q in 2..n {
                    red.combine(out, data(q, off, blk), q == n - 1);
                }
            }
            // One rank: its input, posted pre-scaled, with no finishing step.
            _ => out.copy_from_slice(data(0, off, blk)),
        }
    }
}
