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
//! Slots and their reuse: a rank has [`SLOTS`] slots, used in turn by
//! sequence number, and a call needs only the posts it reads: an
//! all-reduce, all-gather and reduce-scatter every rank's, a reduce's root
//! every rank's and the other ranks none, a broadcast's receivers the
//! root's and the root none. So ranks may be several calls apart, and reuse
//! has a rule of its own: before posting call `s` a rank waits until every
//! peer has posted call `s - SLOTS + 1` ([`ShmOneShot::clear_to_post`]). A
//! peer posts that call only after it finished call `s - SLOTS`, its last
//! read of the slot that call `s` rewrites, so a slot is never rewritten
//! while a peer may still read it, and no acknowledgement beyond the posts
//! is needed. A broadcast root therefore returns once its input is in its
//! slot and runs up to `SLOTS - 1` calls ahead of its receivers, as an MPI
//! root runs ahead through its eager buffers; after a call that read every
//! rank's post the wait costs nothing.
//!
//! Mismatched calls a rank did not read (two ranks that both think they
//! are a broadcast's root) are caught through each rank's call record: a
//! ring of [`RECORDS`] (sequence number, call) pairs after its slots,
//! written before the post. A rank compares its peers' records of the calls
//! it has not checked yet at the next call that reads every rank, and at
//! the latest when it reuses a slot. Why records of their own and not the
//! slots' headers: a peer may run up to `SLOTS - 1` calls ahead, so the
//! header of a call `SLOTS - 1` back may be rewritten while it is compared
//! (tried with three slots: false mismatch reports); a record is rewritten
//! `RECORDS` = 2 × `SLOTS` calls later, which no peer can reach before this
//! rank posts again.
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
//!
//! After a rank's slots, a cache line of its own counts the peers that
//! sleep on its posts ([`ShmOneShot::sleep_until_posted`]): a peer whose
//! wait outlasted its spin and yields counts itself there and sleeps in the
//! kernel (futex) on the sequence number it awaits, and a post that finds
//! the count non-zero wakes the sleepers on the word it wrote. The call
//! records follow it, 16 bytes each.

use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use oxccl_core::slots::describe_meta;
pub use oxccl_core::slots::SlotCall;
use oxccl_core::{CollKind, Error, Reduction, Result};

use crate::transport::ShmSegment;

/// Bytes of one slot: the most a rank posts in a call that takes the slots
/// (every rank's block for a reduce-scatter, the input otherwise). What a
/// rank may read from its peers is bounded apart
/// (`oxccl_core::slots::READ_BUDGET`, also 64 KiB): a 2-rank all-reduce of
/// up to 64 KiB takes the slots, a 4-rank one up to 21 KiB. [`SLOTS`] slots
/// a rank, mapped by every rank of the host (at most 8): 8 MiB of mappings
/// a rank at most, of which small calls touch a page a slot.
pub const ONESHOT_MAX_BYTES: usize = 64 * 1024;

const SLOT_HEAD: usize = 16;

/// Slots per rank, used in turn by sequence number: a broadcast root may run
/// `SLOTS - 1` calls ahead of its receivers (the module's notes). 2 ranks as
/// processes, 8 B broadcasts back to back: 0.40 µs a call with 2 slots,
/// where Open MPI takes 0.15-0.19; with 4 ranks on 2 vCPUs 4.6-5 µs
/// against 0.25-0.65 (Intel Xeon guest, 2026-12-03).
pub const SLOTS: u64 = 16;

/// Call records per rank: twice the slots, so that no peer can rewrite a
/// record this rank may still compare (the module's notes).
pub const RECORDS: u64 = 2 * SLOTS;

/// Bytes between slots for inputs of up to `max` bytes.
pub fn slot_stride(max: usize) -> usize {
    (SLOT_HEAD + max).next_multiple_of(64)
}

/// Bytes of a rank's slot area: its slots, the line that counts the peers
/// sleeping on its posts, and its call records.
pub fn area_bytes(max: usize) -> usize {
    SLOTS as usize * slot_stride(max) + 64 + RECORDS as usize * 16
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
    /// Every peer is known to have posted calls up to this one, each the
    /// same call as this rank's.
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

    /// The call every peer must have posted before this rank posts its next
    /// one (0: none).
    fn must_be_clear(&self) -> u64 {
        (self.seq + 2).saturating_sub(SLOTS)
    }

    /// Rank q's record of call `seq`: (sequence number, call).
    fn record(&self, q: usize, seq: u64) -> &[AtomicU64; 2] {
        // SAFETY: the records follow the slots and the sleepers' line within
        // rank q's area (area_bytes, checked in `new`), 16-byte aligned,
        // mapped as long as self and only accessed through atomics in every
        // process.
        unsafe {
            &*self.areas[q]
                .as_ptr()
                .add(SLOTS as usize * self.stride + 64 + (seq % RECORDS) as usize * 16)
                .cast::<[AtomicU64; 2]>()
        }
    }

    /// Compares every peer's records of calls from `self.clear + 1` with
    /// this rank's and counts them checked: every call up to `need` (every
    /// peer has posted it), then further, up to `limit` (at most this
    /// rank's last post), as long as every peer has posted the call. An
    /// error names the first peer whose call differs. Looking past `need`
    /// is what spares a rank that reads nothing of its peers (a broadcast
    /// receiver, whose root is ahead) a look at every call: it clears up
    /// to its own last post at once and looks again `SLOTS - 1` calls
    /// later, reading the records four to a cache line.
    fn check_records(&mut self, need: u64, limit: u64) -> Result<()> {
        let n = self.areas.len();
        let mut seq = self.clear + 1;
        while seq <= limit {
            let mine = self.record(self.rank, seq)[1].load(Ordering::Relaxed);
            for q in (0..n).filter(|&q| q != self.rank) {
                let r = self.record(q, seq);
                // A peer that posted `seq` wrote its record first; the record
                // is not rewritten before this rank posts again (the
                // module's notes).
                if r[0].load(Ordering::Acquire) == seq {
                    self.mismatch(q, r[1].load(Ordering::Relaxed), mine)?;
                } else if seq > need {
                    // Not posted yet: cleared so far.
                    return Ok(());
                }
            }
            self.clear = seq;
            seq += 1;
        }
        self.clear = self.clear.max(need);
        Ok(())
    }

    /// The sequence number the next call posts.
    pub fn next_seq(&self) -> u64 {
        self.seq + 1
    }

    fn slot(&self, q: usize, seq: u64) -> *mut u8 {
        // SAFETY: the offset lies within rank q's slot area (SLOTS slots of
        // `stride` bytes, checked in `new`).
        unsafe {
            self.areas[q]
                .as_ptr()
                .add((seq % SLOTS) as usize * self.stride)
        }
    }

    fn words(&self, q: usize, seq: u64) -> &[AtomicU64; 2] {
        // SAFETY: the slot is 64-byte aligned, mapped as long as self, and
        // its first 16 bytes are only accessed through atomics in every
        // process.
        unsafe { &*self.slot(q, seq).cast::<[AtomicU64; 2]>() }
    }

    /// How many peers sleep on rank q's posts (the line after its slots).
    fn sleepers(&self, q: usize) -> &AtomicU32 {
        // SAFETY: the line after the slots lies within rank q's area
        // (area_bytes, checked in `new`), is 64-byte aligned, mapped as long
        // as self and only accessed through atomics in every process.
        unsafe {
            &*self.areas[q]
                .as_ptr()
                .add(SLOTS as usize * self.stride)
                .cast::<AtomicU32>()
        }
    }

    /// Sleeps until peer `q` posts call `seq`, it is woken for another
    /// reason, or `limit` passes, whichever comes first; returns at once if
    /// the post is there. The caller looks again ([`ShmOneShot::posted`]).
    pub fn sleep_until_posted(&self, q: usize, seq: u64, limit: Duration) {
        let sleepers = self.sleepers(q);
        let word = &self.words(q, seq)[0];
        // With the poster's fence between its store of the sequence number
        // and its read of the count: either this load sees the post, or the
        // poster sees this rank counted and wakes it (and a post between this
        // load and the sleep changes the word, which the kernel compares).
        sleepers.fetch_add(1, Ordering::SeqCst);
        let now = word.load(Ordering::SeqCst);
        if now < seq {
            futex::wait(word, now, limit);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
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
        let need = self.must_be_clear();
        if self.clear < need {
            return Err(Error::internal(format!(
                "one-shot {}: call {seq} posted before every peer posted call {need}",
                call.kind.snake_name(),
            )));
        }
        // SAFETY: the data part of this rank's slot `seq % SLOTS`, inside
        // the area; no peer reads it now (every peer posted call
        // `seq - SLOTS + 1`, so finished call `seq - SLOTS`, checked above;
        // see the module's notes) and it does not overlap the atomic words.
        let data = unsafe {
            std::slice::from_raw_parts_mut(self.slot(self.rank, seq).add(SLOT_HEAD), input.len())
        };
        match red {
            Some(red) => red.start(data, input, false),
            None => data.copy_from_slice(input),
        }
        // The record first: a peer that sees the post may compare it.
        let meta = call.meta();
        let r = self.record(self.rank, seq);
        r[1].store(meta, Ordering::Relaxed);
        r[0].store(seq, Ordering::Release);
        let w = self.words(self.rank, seq);
        w[1].store(meta, Ordering::Relaxed);
        w[0].store(seq, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.sleepers(self.rank).load(Ordering::Relaxed) != 0 {
            futex::wake(&w[0]);
        }
        self.seq = seq;
        Ok(seq)
    }

    /// Whether this rank may post its next call: every peer has posted the
    /// call `SLOTS - 1` before it (see the module's notes), or one it is
    /// waiting for, looking at `from` first. A peer whose record of a call
    /// up to that one differs from this rank's is an error naming both.
    pub fn clear_to_post(&mut self, from: usize) -> Result<Progress> {
        let last = self.must_be_clear();
        if self.clear >= last {
            return Ok(Progress::Ready);
        }
        let n = self.areas.len();
        for i in 0..n {
            let q = (from + i) % n;
            if q != self.rank && !self.posted(q, last) {
                return Ok(Progress::Waiting {
                    waiting_for: q,
                    seq: last,
                });
            }
        }
        self.check_records(last, self.seq)?;
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
            self.mismatch(q, self.words(q, seq)[1].load(Ordering::Relaxed), mine)?;
        }
        if all {
            // Every peer posted this call (compared above), so every call
            // before it: the ones not read (rooted calls) are compared now,
            // from the records (none after a call that read every rank).
            self.check_records(seq - 1, seq - 1)?;
            self.clear = seq;
        }
        Ok(Progress::Ready)
    }

    /// An error if peer `q`'s call `theirs` is another than `mine`.
    #[inline]
    fn mismatch(&self, q: usize, theirs: u64, mine: u64) -> Result<()> {
        if theirs != mine {
            return Err(self.mismatch_error(q, theirs, mine));
        }
        Ok(())
    }

    /// [`ShmOneShot::mismatch`]'s error, out of the line of every call.
    #[cold]
    #[inline(never)]
    fn mismatch_error(&self, q: usize, theirs: u64, mine: u64) -> Error {
        Error::invalid_usage(format!(
            "mismatched collectives: rank {q} called {}, rank {} {} \
             (every rank must call the same collectives in the same order, with \
             the same count, datatype, op and root)",
            describe_meta(theirs),
            self.rank,
            describe_meta(mine)
        ))
    }

    /// Whether peer `q` posted call `seq` (its slot for `seq` holds it or,
    /// where the peer is ahead, a later call; never one past the call this
    /// rank is in).
    pub fn posted(&self, q: usize, seq: u64) -> bool {
        self.words(q, seq)[0].load(Ordering::Acquire) >= seq
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
        // `seq % SLOTS`, which q posted (seen with acquire in `progress`; only
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

/// Sleeping on a sequence number in shared memory until its writer wakes
/// the sleepers: Linux futexes on the word's low 32 bits, shared between
/// processes (no private flag: the mappings' addresses differ).
mod futex {
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    #[cfg(target_os = "linux")]
    fn low_half(word: &AtomicU64) -> *const u32 {
        let p = word.as_ptr().cast::<u32>();
        if cfg!(target_endian = "big") {
            // SAFETY: the second half of the same 8-byte word.
            unsafe { p.add(1) }
        } else {
            p
        }
    }

    /// Sleeps while `word` holds `seen`, at most `limit`.
    #[cfg(target_os = "linux")]
    pub fn wait(word: &AtomicU64, seen: u64, limit: Duration) {
        let ts = libc::timespec {
            tv_sec: limit.as_secs() as libc::time_t,
            tv_nsec: limit.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a futex wait on an aligned u32 inside a live shared
        // mapping, with a relative timeout; it only reads the word. Its
        // result (woken, timed out, interrupted, the value already changed)
        // does not matter: the caller looks at the word again.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                low_half(word),
                libc::FUTEX_WAIT,
                seen as u32,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    /// Wakes every sleeper on `word`.
    #[cfg(target_os = "linux")]
    pub fn wake(word: &AtomicU64) {
        // SAFETY: a futex wake on an aligned u32 inside a live shared
        // mapping; it does not touch the memory.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                low_half(word),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    /// Without futexes: a short sleep; the caller looks again.
    #[cfg(not(target_os = "linux"))]
    pub fn wait(_word: &AtomicU64, _seen: u64, limit: Duration) {
        std::thread::sleep(limit.min(Duration::from_micros(50)));
    }

    #[cfg(not(target_os = "linux"))]
    pub fn wake(_word: &AtomicU64) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::ShmRingLayout;
    use oxccl_core::{DataType, RedOp};
    use std::sync::atomic::AtomicBool;

    const MAX: usize = 256;

    /// `n` ranks' views of `n` slot segments (one segment per rank, all
    /// shared by the views, as the mappings of processes would be).
    fn views(n: usize) -> Vec<ShmOneShot> {
        let layout = ShmRingLayout {
            npeers: 0,
            nchannels: 1,
            capacity: 64,
        };
        let segs: Vec<_> = (0..n)
            .map(|_| {
                ShmSegment::create_rings_and_slots(layout, "oneshot-test", area_bytes(MAX)).unwrap()
            })
            .collect();
        (0..n)
            .map(|r| ShmOneShot::new(r, segs.clone(), MAX).unwrap())
            .collect()
    }

    fn bcast(count: usize, root: usize) -> SlotCall {
        SlotCall {
            kind: CollKind::Broadcast,
            count,
            dtype: DataType::Uint8,
            op: RedOp::Sum,
            root,
        }
    }

    /// Runs one call on view `v`: waits until it may post, posts, waits for
    /// what it reads, takes its result (yielding: there may be more
    /// threads than CPUs). Gives up when `failed` is set: a peer failed and
    /// will not post again.
    fn run(v: &mut ShmOneShot, call: &SlotCall, input: &[u8], out: &mut [u8], failed: &AtomicBool) {
        let me = v.rank();
        let give_up = || assert!(!failed.load(Ordering::Relaxed), "rank {me}: a peer failed");
        while v.clear_to_post(0).unwrap() != Progress::Ready {
            give_up();
            std::thread::yield_now();
        }
        let seq = v.post(call, input, None).unwrap();
        while v.progress(seq, call, 0).unwrap() != Progress::Ready {
            give_up();
            std::thread::yield_now();
        }
        v.finish(seq, call, out, None);
    }

    #[test]
    fn who_reads_whom() {
        let b = bcast(1, 1);
        assert!(reads(&b, 0, 1) && reads(&b, 2, 1));
        assert!(!reads(&b, 0, 2) && !reads(&b, 1, 0) && !reads(&b, 1, 2));
        let r = SlotCall {
            kind: CollKind::Reduce,
            ..b
        };
        assert!(reads(&r, 1, 0) && reads(&r, 1, 2));
        assert!(!reads(&r, 0, 1) && !reads(&r, 2, 0));
        for kind in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::ReduceScatter,
        ] {
            let c = SlotCall { kind, ..b };
            assert!(
                reads(&c, 0, 1) && reads(&c, 1, 0) && reads(&c, 2, 1),
                "{kind:?}"
            );
        }
    }

    /// A broadcast root posts and is done without its receivers, up to
    /// `SLOTS - 1` calls ahead; its next post waits until every receiver
    /// posted the first of them.
    #[test]
    fn a_root_runs_slots_minus_one_calls_ahead_and_no_further() {
        let mut v = views(3);
        let call = bcast(4, 0);
        let mut out = [0u8; 4];
        for k in 1..SLOTS {
            assert_eq!(v[0].clear_to_post(1).unwrap(), Progress::Ready, "call {k}");
            let input = [k as u8; 4];
            let seq = v[0].post(&call, &input, None).unwrap();
            assert_eq!(seq, k);
            assert_eq!(v[0].progress(seq, &call, 0).unwrap(), Progress::Ready);
            v[0].finish(seq, &call, &mut out, None);
            assert_eq!(out, input);
        }
        // Call SLOTS reuses call 1's slot: it waits for rank 1, then rank
        // 2, to post call 1.
        assert_eq!(
            v[0].clear_to_post(1).unwrap(),
            Progress::Waiting {
                waiting_for: 1,
                seq: 1
            }
        );
        assert!(
            v[0].post(&call, &[5; 4], None).is_err(),
            "posted over a slot a peer may read"
        );
        // The receivers read each call's own bytes, all still there.
        let mut got = [0u8; 4];
        for k in 1..SLOTS {
            assert_eq!(v[1].clear_to_post(0).unwrap(), Progress::Ready);
            let s1 = v[1].post(&call, &[], None).unwrap();
            assert_eq!(v[1].progress(s1, &call, 0).unwrap(), Progress::Ready);
            v[1].finish(s1, &call, &mut got, None);
            assert_eq!(got, [k as u8; 4], "call {k}");
            if k == 1 {
                assert_eq!(
                    v[0].clear_to_post(1).unwrap(),
                    Progress::Waiting {
                        waiting_for: 2,
                        seq: 1
                    }
                );
            }
        }
        v[2].post(&call, &[], None).unwrap();
        assert_eq!(v[0].clear_to_post(1).unwrap(), Progress::Ready);
        // A receiver waits for the root only.
        let s2 = v[2].next_seq();
        assert_eq!(v[2].clear_to_post(0).unwrap(), Progress::Ready);
        v[2].post(&call, &[], None).unwrap();
        assert_eq!(v[2].progress(s2, &call, 0).unwrap(), Progress::Ready);
        let s3 = v[1].next_seq();
        assert_eq!(s3, SLOTS);
        assert_eq!(v[1].clear_to_post(0).unwrap(), Progress::Ready);
        v[1].post(&call, &[], None).unwrap();
        assert_eq!(
            v[1].progress(s3, &call, 2).unwrap(),
            Progress::Waiting {
                waiting_for: 0,
                seq: SLOTS
            }
        );
    }

    /// A rank that reads nothing of its peers (a broadcast root) clears
    /// every call up to its own last post in one look, as far as its peers
    /// posted them, and looks again only when it would reuse a slot past
    /// those.
    #[test]
    fn a_root_clears_as_far_as_every_peer_posted() {
        let mut v = views(2);
        let call = bcast(1, 0);
        let mut out = [0u8; 1];
        for k in 1..=2 * SLOTS {
            assert_eq!(
                v[0].clear_to_post(1).unwrap(),
                Progress::Ready,
                "root, call {k}"
            );
            v[0].post(&call, &[k as u8], None).unwrap();
            // Calls 1 .. SLOTS - 1 need no look; call SLOTS clears up to
            // SLOTS - 1, the root's last post then; the next look is at
            // call 2 SLOTS - 1.
            let want = if k < SLOTS {
                0
            } else if k < 2 * SLOTS - 1 {
                SLOTS - 1
            } else {
                2 * SLOTS - 2
            };
            assert_eq!(v[0].clear, want, "after call {k}");
            assert_eq!(v[1].clear_to_post(0).unwrap(), Progress::Ready, "call {k}");
            let s = v[1].post(&call, &[], None).unwrap();
            assert_eq!(v[1].progress(s, &call, 0).unwrap(), Progress::Ready);
            v[1].finish(s, &call, &mut out, None);
            assert_eq!(out, [k as u8]);
        }
    }

    /// Two ranks that both think they are a broadcast's root read nothing
    /// of each other; the mismatch is caught at the latest when a slot is
    /// reused, from the records.
    #[test]
    fn roots_that_differ_are_caught_when_a_slot_is_reused() {
        let mut v = views(2);
        for k in 1..SLOTS {
            for (r, x) in v.iter_mut().enumerate() {
                let call = bcast(2, r);
                assert_eq!(x.clear_to_post(0).unwrap(), Progress::Ready, "call {k}");
                let seq = x.post(&call, &[r as u8; 2], None).unwrap();
                assert_eq!(x.progress(seq, &call, 0).unwrap(), Progress::Ready);
            }
        }
        for x in v.iter_mut() {
            let e = x.clear_to_post(0).unwrap_err();
            assert!(e.message().contains("mismatched collectives"), "{e}");
        }
    }

    /// ... and at once at the next call that reads every rank.
    #[test]
    fn roots_that_differ_are_caught_at_the_next_call_that_reads_every_rank() {
        let mut v = views(2);
        for (r, x) in v.iter_mut().enumerate() {
            let call = bcast(2, r);
            let seq = x.post(&call, &[r as u8; 2], None).unwrap();
            assert_eq!(x.progress(seq, &call, 0).unwrap(), Progress::Ready);
        }
        let ar = SlotCall {
            kind: CollKind::AllGather,
            ..bcast(2, 0)
        };
        for (r, x) in v.iter_mut().enumerate() {
            assert_eq!(x.clear_to_post(0).unwrap(), Progress::Ready);
            x.post(&ar, &[r as u8; 2], None).unwrap();
        }
        for x in v.iter_mut() {
            let e = x.progress(2, &ar, 0).unwrap_err();
            assert!(e.message().contains("mismatched collectives"), "{e}");
            assert!(e.message().contains("broadcast"), "{e}");
        }
    }

    /// Sets the flag when its thread panics, so that the other threads stop
    /// waiting for posts that will not come.
    struct TellPeers<'a>(&'a AtomicBool);

    impl Drop for TellPeers<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Threads run thousands of broadcasts back to back, the root moving
    /// and the size changing every call, each value naming its call: a
    /// slot rewritten while a peer still reads it shows as another call's
    /// bytes.
    #[test]
    fn back_to_back_broadcasts_read_their_own_call() {
        for n in 2..=4usize {
            let views = views(n);
            let failed = &AtomicBool::new(false);
            std::thread::scope(|s| {
                for mut v in views {
                    s.spawn(move || {
                        let _tell = TellPeers(failed);
                        let me = v.rank();
                        for i in 0..3000usize {
                            let count = 1 + (i * 31) % MAX;
                            let root = (i / 2 + i % 3) % n;
                            let byte = |j: usize| (i * 7 + j * 13 + root) as u8;
                            let input: Vec<u8> = (0..count).map(byte).collect();
                            let call = bcast(count, root);
                            let posted = if me == root { &input[..] } else { &[][..] };
                            let mut out = vec![0u8; count];
                            run(&mut v, &call, posted, &mut out, failed);
                            for (j, x) in out.iter().enumerate() {
                                if *x != byte(j) {
                                    panic!(
                                        "rank {me} of {n}, call {i}: byte {j} is {x}, not {}",
                                        byte(j)
                                    );
                                }
                            }
                        }
                    });
                }
            });
        }
    }

    /// A peer asleep on a post is woken by it, however long its limit.
    #[test]
    fn a_post_wakes_its_sleepers() {
        let mut v = views(3);
        let call = bcast(1, 0);
        let root = v.remove(0);
        std::thread::scope(|s| {
            let mut root = root;
            let sleepers: Vec<_> = v
                .into_iter()
                .map(|x| {
                    s.spawn(move || {
                        while !x.posted(0, 1) {
                            x.sleep_until_posted(0, 1, Duration::from_secs(3600));
                        }
                    })
                })
                .collect();
            while root.sleepers(0).load(Ordering::SeqCst) < 2 {
                std::thread::yield_now();
            }
            root.post(&call, &[9], None).unwrap();
            for h in sleepers {
                h.join().unwrap();
            }
        });
    }
}
