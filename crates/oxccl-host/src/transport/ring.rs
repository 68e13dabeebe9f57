//! The single-producer single-consumer byte ring under the in-process and
//! shared-memory streams.
//!
//! Memory layout of one ring (it does not own this memory; an owner kept alive
//! by an `Arc` in both halves does):
//!
//! ```text
//! base +   0: head  u64  consumer position (bytes consumed, ever increasing)
//! base +  64: tail  u64  producer position (bytes produced, ever increasing)
//! base + 128: capacity data bytes; stream byte `p` lives at `p % capacity`
//! ```
//!
//! `head` and `tail` sit on separate 64-byte lines so that the producer's
//! stores and the consumer's stores do not bounce one line between cores.
//! Producer: `free = capacity - (tail - head)`, head read with Acquire (the
//! consumer is done with those bytes), data written, tail published with
//! Release. Consumer: `avail = tail - head`, tail read with Acquire (the bytes
//! are written), data read, head published with Release. Each side keeps a
//! cached copy of the other side's counter and re-reads the shared line only
//! when the cached view leaves less than a quarter of the ring usable, so a
//! stream in steady state touches the other side's line about four times per
//! ring's worth of bytes instead of once per call.
//!
//! The index protocol ([`ProducerIndex`], [`ConsumerIndex`]) is generic over
//! the atomic counter type ([`RingCounter`]) so that `tests/loom_ring.rs` runs
//! the very same code over `loom` atomics and loom-tracked data cells.
//!
//! A counter written by another process is untrusted input: every value read
//! from the other side is checked (monotonic, `0 <= tail - head <= capacity`)
//! before it is used to form a slice, so a corrupt or hostile peer cannot make
//! this process touch memory outside the ring.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use oxccl_core::{Error, Result};

use super::{RecvHalf, SendHalf};

/// Bytes of the ring header (two 64-byte lines) before the data bytes.
pub const RING_HEADER_BYTES: usize = 128;
/// Smallest capacity a ring may have.
pub const MIN_CAPACITY: usize = 64;

/// An atomic u64 counter as the ring protocol needs it; implemented for the
/// std atomic here and for loom's in the model check.
pub trait RingCounter: Sync {
    /// Atomic load.
    fn load(&self, order: Ordering) -> u64;
    /// Atomic store.
    fn store(&self, value: u64, order: Ordering);
}

impl RingCounter for AtomicU64 {
    #[inline]
    fn load(&self, order: Ordering) -> u64 {
        AtomicU64::load(self, order)
    }
    #[inline]
    fn store(&self, value: u64, order: Ordering) {
        AtomicU64::store(self, value, order)
    }
}

/// The other side's counter was inconsistent with this side's (went
/// backwards, or claims more than `capacity` bytes in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt {
    /// This side's position.
    pub mine: u64,
    /// The other side's position as read.
    pub theirs: u64,
}

impl Corrupt {
    fn into_error(self, what: &str) -> Error {
        Error::internal(format!(
            "{what}: shared ring counters are inconsistent (own position {}, peer position {}); \
             the ring memory was corrupted or is used by more than one producer or consumer",
            self.mine, self.theirs
        ))
    }
}

/// Refresh threshold: re-read the other side's counter when the cached view
/// allows fewer bytes than this (a quarter of the ring, at least 8).
fn refresh_below(capacity: u64) -> u64 {
    ((capacity / 4) & !7).max(8)
}

/// Returns an error unless `capacity` is a multiple of 8 and at least
/// [`MIN_CAPACITY`].
pub fn check_capacity(capacity: usize) -> Result<()> {
    if capacity < MIN_CAPACITY || capacity % 8 != 0 {
        return Err(Error::invalid_argument(format!(
            "ring capacity {capacity} must be a multiple of 8 and at least {MIN_CAPACITY}"
        )));
    }
    Ok(())
}

/// The producer's side of the index protocol: which bytes it may write.
#[derive(Debug)]
pub struct ProducerIndex {
    capacity: u64,
    tail: u64,
    head_cache: u64,
    reserved: u64,
    refresh_below: u64,
}

impl ProducerIndex {
    /// A producer of a fresh ring (both counters zero). `capacity` must be a
    /// non-zero multiple of 8.
    pub fn new(capacity: usize) -> ProducerIndex {
        assert!(
            capacity > 0 && capacity % 8 == 0,
            "ring capacity {capacity}"
        );
        let capacity = capacity as u64;
        ProducerIndex {
            capacity,
            tail: 0,
            head_cache: 0,
            reserved: 0,
            refresh_below: refresh_below(capacity),
        }
    }

    fn span(&self) -> u64 {
        let free = self.capacity - (self.tail - self.head_cache);
        free.min(self.capacity - self.tail % self.capacity)
    }

    /// The contiguous free region as `(offset into the data bytes, length)`;
    /// length 0 when the ring is full. Reads `head` (Acquire) only when the
    /// cached head leaves less than a quarter of the ring.
    pub fn reserve<C: RingCounter + ?Sized>(
        &mut self,
        head: &C,
    ) -> std::result::Result<(usize, usize), Corrupt> {
        let mut span = self.span();
        if span < self.refresh_below {
            let h = head.load(Ordering::Acquire);
            if h < self.head_cache || h > self.tail || self.tail - h > self.capacity {
                return Err(Corrupt {
                    mine: self.tail,
                    theirs: h,
                });
            }
            self.head_cache = h;
            span = self.span();
        }
        self.reserved = span;
        Ok(((self.tail % self.capacity) as usize, span as usize))
    }

    /// Publishes the first `n` bytes of the last reservation (Release store of
    /// `tail`). Panics if `n` is not a multiple of 8 or exceeds the reservation.
    pub fn commit<C: RingCounter + ?Sized>(&mut self, n: usize, tail: &C) {
        let n = n as u64;
        assert!(
            n <= self.reserved && n % 8 == 0,
            "ring commit of {n} bytes: reserved {}, must be a multiple of 8",
            self.reserved
        );
        self.reserved = 0;
        if n == 0 {
            return;
        }
        self.tail += n;
        tail.store(self.tail, Ordering::Release);
    }

    /// Bytes produced so far.
    pub fn position(&self) -> u64 {
        self.tail
    }
}

/// The consumer's side of the index protocol: which bytes it may read.
#[derive(Debug)]
pub struct ConsumerIndex {
    capacity: u64,
    head: u64,
    tail_cache: u64,
    peeked: u64,
    refresh_below: u64,
}

impl ConsumerIndex {
    /// A consumer of a fresh ring (both counters zero). `capacity` must be a
    /// non-zero multiple of 8.
    pub fn new(capacity: usize) -> ConsumerIndex {
        assert!(
            capacity > 0 && capacity % 8 == 0,
            "ring capacity {capacity}"
        );
        let capacity = capacity as u64;
        ConsumerIndex {
            capacity,
            head: 0,
            tail_cache: 0,
            peeked: 0,
            refresh_below: refresh_below(capacity),
        }
    }

    fn span(&self) -> u64 {
        let avail = self.tail_cache - self.head;
        avail.min(self.capacity - self.head % self.capacity)
    }

    /// The contiguous readable region as `(offset into the data bytes,
    /// length)`; length 0 when empty. Reads `tail` (Acquire) only when the
    /// cached tail leaves less than a quarter of the ring to read.
    pub fn peek<C: RingCounter + ?Sized>(
        &mut self,
        tail: &C,
    ) -> std::result::Result<(usize, usize), Corrupt> {
        let mut span = self.span();
        if span < self.refresh_below {
            let t = tail.load(Ordering::Acquire);
            if t < self.tail_cache || t - self.head > self.capacity {
                return Err(Corrupt {
                    mine: self.head,
                    theirs: t,
                });
            }
            self.tail_cache = t;
            span = self.span();
        }
        self.peeked = span;
        Ok(((self.head % self.capacity) as usize, span as usize))
    }

    /// Frees the first `n` bytes of the last peek (Release store of `head`).
    /// Panics if `n` is not a multiple of 8 or exceeds the peeked length.
    pub fn consume<C: RingCounter + ?Sized>(&mut self, n: usize, head: &C) {
        let n = n as u64;
        assert!(
            n <= self.peeked && n % 8 == 0,
            "ring consume of {n} bytes: peeked {}, must be a multiple of 8",
            self.peeked
        );
        self.peeked = 0;
        if n == 0 {
            return;
        }
        self.head += n;
        head.store(self.head, Ordering::Release);
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> u64 {
        self.head
    }
}

/// The two counters of a ring, on separate cache lines. All-zero bytes are a
/// valid header (both counters zero).
#[repr(C, align(64))]
pub struct RingHeader {
    head: AtomicU64,
    _pad0: [u64; 7],
    tail: AtomicU64,
    _pad1: [u64; 7],
}

const _: () = assert!(std::mem::size_of::<RingHeader>() == RING_HEADER_BYTES);

/// Bytes a ring of `capacity` takes (header plus data), rounded up to 64 so
/// that rings laid end to end keep their headers line-aligned.
pub fn ring_footprint(capacity: usize) -> usize {
    RING_HEADER_BYTES + capacity.div_ceil(64) * 64
}

/// Sets both counters of the ring at `base` to zero.
///
/// # Safety
/// `base` must be 64-byte aligned and valid for writes of
/// [`RING_HEADER_BYTES`], and no ring half may use this ring yet.
pub unsafe fn init_header(base: NonNull<u8>) {
    // SAFETY: the caller guarantees the header memory is valid, aligned and not
    // yet in use; writing a fresh RingHeader over it is a plain initialisation.
    unsafe {
        base.cast::<RingHeader>().as_ptr().write(RingHeader {
            head: AtomicU64::new(0),
            _pad0: [0; 7],
            tail: AtomicU64::new(0),
            _pad1: [0; 7],
        })
    };
}

/// A reason a ring's peer may be gone (in-process: the peer dropped its link
/// or poisoned it). Asked only when a ring is full (sender) or empty (receiver).
pub trait Liveness: Send + Sync {
    /// `Err` when the other end is known dead or poisoned.
    fn status(&self) -> Result<()>;
}

type Owner = Arc<dyn Send + Sync>;

/// The producer half of a ring.
pub struct RingSender {
    header: NonNull<RingHeader>,
    data: NonNull<u8>,
    idx: ProducerIndex,
    liveness: Option<Arc<dyn Liveness>>,
    _owner: Owner,
}

// SAFETY: the raw pointers point into memory kept alive by `_owner` (which is
// Send + Sync); the half is the ring's only producer, so moving it to another
// thread moves the producer role with it, and all shared state is accessed
// through atomics (header) or the SPSC ownership protocol (data).
unsafe impl Send for RingSender {}

/// The consumer half of a ring.
pub struct RingReceiver {
    header: NonNull<RingHeader>,
    data: NonNull<u8>,
    idx: ConsumerIndex,
    liveness: Option<Arc<dyn Liveness>>,
    _owner: Owner,
}

// SAFETY: as for RingSender, with the consumer role.
unsafe impl Send for RingReceiver {}

impl RingSender {
    /// The producer half of the ring at `base`.
    ///
    /// # Safety
    /// - `base` is 64-byte aligned and valid for reads and writes of
    ///   `ring_footprint(capacity)` bytes for as long as `owner` lives;
    /// - the header was initialised ([`init_header`] or zeroed memory) before
    ///   any half was made, and the ring has not been used before;
    /// - over the ring's whole life (in every process mapping it) at most one
    ///   `RingSender` exists for it, and nothing else writes its data bytes or
    ///   its `tail`.
    pub unsafe fn new(
        base: NonNull<u8>,
        capacity: usize,
        owner: Owner,
        liveness: Option<Arc<dyn Liveness>>,
    ) -> RingSender {
        assert!(capacity >= MIN_CAPACITY && capacity % 8 == 0);
        RingSender {
            header: base.cast(),
            // SAFETY: the caller guarantees the region covers header + capacity.
            data: unsafe { base.add(RING_HEADER_BYTES) },
            idx: ProducerIndex::new(capacity),
            liveness,
            _owner: owner,
        }
    }
}

impl RingReceiver {
    /// The consumer half of the ring at `base`.
    ///
    /// # Safety
    /// As for [`RingSender::new`], with "at most one `RingReceiver`, and
    /// nothing else writes its `head`".
    pub unsafe fn new(
        base: NonNull<u8>,
        capacity: usize,
        owner: Owner,
        liveness: Option<Arc<dyn Liveness>>,
    ) -> RingReceiver {
        assert!(capacity >= MIN_CAPACITY && capacity % 8 == 0);
        RingReceiver {
            header: base.cast(),
            // SAFETY: the caller guarantees the region covers header + capacity.
            data: unsafe { base.add(RING_HEADER_BYTES) },
            idx: ConsumerIndex::new(capacity),
            liveness,
            _owner: owner,
        }
    }

    #[cfg(test)]
    fn header(&self) -> &RingHeader {
        // SAFETY: valid and aligned per `new`'s contract while `_owner` lives
        // (it lives as long as self); only atomics are accessed through it.
        unsafe { self.header.as_ref() }
    }
}

impl SendHalf for RingSender {
    fn reserve(&mut self) -> Result<&mut [u8]> {
        // SAFETY: the header is valid and aligned per `new`'s contract while
        // `_owner` lives (as long as self) and only accessed through atomics;
        // the reference does not borrow `self`, so `self.idx` can be borrowed
        // mutably beside it.
        let header = unsafe { &*self.header.as_ptr() };
        let (off, len) = self
            .idx
            .reserve(&header.head)
            .map_err(|c| c.into_error("ring (sender)"))?;
        if len == 0 {
            if let Some(l) = &self.liveness {
                l.status()?;
            }
        }
        // SAFETY: `off + len <= capacity` (ProducerIndex checks the peer's head
        // and clamps to the wrap point), so the slice is inside the data bytes.
        // Bytes [tail, head + capacity) belong to the single producer: the
        // consumer read them before publishing `head` (Acquire above pairs
        // with its Release) and will not touch them before we publish `tail`.
        // `&mut self` keeps the slice unique on this side until commit.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.data.as_ptr().add(off), len) })
    }

    fn commit(&mut self, n: usize) {
        // SAFETY: see reserve.
        let header = unsafe { &*self.header.as_ptr() };
        self.idx.commit(n, &header.tail);
    }

    fn flush(&mut self) -> Result<bool> {
        Ok(false)
    }
}

impl RecvHalf for RingReceiver {
    fn peek(&mut self) -> Result<&[u8]> {
        // SAFETY: as in RingSender::reserve (valid header, atomics only,
        // lifetime not tied to `self`).
        let header = unsafe { &*self.header.as_ptr() };
        let (mut off, mut len) = self
            .idx
            .peek(&header.tail)
            .map_err(|c| c.into_error("ring (receiver)"))?;
        if len == 0 {
            if let Some(l) = &self.liveness {
                if let Err(e) = l.status() {
                    // The producer may have committed its last bytes and then
                    // died; its Release of tail happened before the death we
                    // just observed (Acquire), so one more read sees them.
                    (off, len) = self
                        .idx
                        .peek(&header.tail)
                        .map_err(|c| c.into_error("ring (receiver)"))?;
                    if len == 0 {
                        return Err(e);
                    }
                }
            }
        }
        // SAFETY: `off + len <= capacity` (ConsumerIndex checks the peer's tail
        // and clamps to the wrap point). Bytes [head, tail) were written by the
        // single producer before its Release of `tail`, which our Acquire
        // observed, and it will not write them again before we publish `head`.
        Ok(unsafe { std::slice::from_raw_parts(self.data.as_ptr().add(off), len) })
    }

    fn consume(&mut self, n: usize) {
        // SAFETY: see RingReceiver::peek.
        let header = unsafe { &*self.header.as_ptr() };
        self.idx.consume(n, &header.head);
    }

    fn fill(&mut self) -> Result<bool> {
        Ok(false)
    }
}

/// A zeroed, page-aligned region that rings of one process live in: an
/// anonymous mapping, so a page costs memory only once a ring's bytes reach
/// it (a ring that carries 8-byte messages holds one page, not its
/// capacity; `alloc_zeroed` with 64-byte alignment wrote every byte, 1 MiB
/// per ring).
pub struct HeapRegion {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; concurrent access to
// its contents is governed by the ring protocol, not by HeapRegion.
unsafe impl Send for HeapRegion {}
// SAFETY: as above; HeapRegion itself hands out only a raw pointer.
unsafe impl Sync for HeapRegion {}

impl HeapRegion {
    /// A zeroed region of `bytes` bytes (at least 64), page-aligned.
    pub fn new_zeroed(bytes: usize) -> Result<HeapRegion> {
        let len = bytes.max(64);
        // SAFETY: an anonymous private mapping at an address the kernel
        // picks touches no existing memory; the result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::system(format!(
                "cannot map {bytes} bytes for in-process rings: {}",
                std::io::Error::last_os_error()
            )));
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| Error::system("mmap returned a null mapping for in-process rings"))?;
        Ok(HeapRegion { ptr, len })
    }

    /// The region's first byte.
    pub fn base(&self) -> NonNull<u8> {
        self.ptr
    }
}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in new_zeroed, unmapped once; no
        // ring half outlives the region (they hold an Arc to it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A heap-backed ring of `capacity` bytes and its two halves. The `liveness`
/// hooks are asked when the sender finds the ring full / the receiver finds it
/// empty (each half gets the view of its own side).
pub fn heap_ring(
    capacity: usize,
    sender_liveness: Option<Arc<dyn Liveness>>,
    receiver_liveness: Option<Arc<dyn Liveness>>,
) -> Result<(RingSender, RingReceiver)> {
    check_capacity(capacity)?;
    let region = Arc::new(HeapRegion::new_zeroed(ring_footprint(capacity))?);
    let base = region.base();
    let owner: Owner = region;
    // SAFETY: the region is zeroed (valid header with zero counters), 64-byte
    // aligned, ring_footprint(capacity) long and kept alive by `owner`, held
    // by both halves; exactly one sender and one receiver are made here and
    // nothing else can reach the region.
    unsafe {
        Ok((
            RingSender::new(base, capacity, owner.clone(), sender_liveness),
            RingReceiver::new(base, capacity, owner, receiver_liveness),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_reports_contiguous_spans() {
        let (mut tx, mut rx) = heap_ring(64, None, None).unwrap();
        assert_eq!(tx.reserve().unwrap().len(), 64);
        tx.reserve().unwrap()[..48].fill(1);
        tx.commit(48);
        assert_eq!(tx.reserve().unwrap().len(), 16);
        assert_eq!(rx.peek().unwrap().len(), 48);
        rx.consume(40);
        // Producer at 48: 16 bytes to the wrap point.
        let s = tx.reserve().unwrap();
        assert_eq!(s.len(), 16);
        s.fill(2);
        tx.commit(16);
        // Now at the wrap point: 40 bytes free at the start.
        assert_eq!(tx.reserve().unwrap().len(), 40);
        tx.reserve().unwrap()[..8].fill(3);
        tx.commit(8);
        let p = rx.peek().unwrap();
        assert_eq!(
            p,
            &[1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
        );
        rx.consume(24);
        assert_eq!(rx.peek().unwrap(), &[3; 8]);
        rx.consume(8);
        assert!(rx.peek().unwrap().is_empty());
    }

    #[test]
    #[should_panic]
    fn commit_beyond_reservation_panics() {
        let (mut tx, _rx) = heap_ring(64, None, None).unwrap();
        tx.reserve().unwrap();
        tx.commit(72);
    }

    #[test]
    fn corrupt_counter_is_an_error_not_a_bad_slice() {
        let (_tx, mut rx) = heap_ring(64, None, None).unwrap();
        // Pretend a peer published tail far beyond head + capacity.
        rx.header().tail.store(1 << 20, Ordering::Release);
        assert!(rx.peek().is_err());
    }

    #[test]
    fn bad_capacity_rejected() {
        assert!(heap_ring(60, None, None).is_err());
        assert!(heap_ring(32, None, None).is_err());
    }
}
