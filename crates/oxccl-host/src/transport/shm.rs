//! Shared memory between the processes of one host.
//!
//! Every rank creates one segment holding its *incoming* rings, one per
//! (sending peer, channel): `npeers * nchannels` rings. To send to peer Q a
//! rank writes into Q's segment, at the slot Q assigned it; to receive from Q
//! it reads its own segment at the slot it assigned Q. Segment layout:
//!
//! ```text
//! 0                     128-byte segment header: magic, version, npeers, nchannels, capacity
//! 128 + i * stride      ring i = slot * nchannels + channel (stride = ring_footprint(capacity))
//! segment_size()         the slot area (`slot_bytes`, 0 without one): this rank's
//!                        outgoing one-shot slots, read by every peer (crate::oneshot)
//! ```
//!
//! Setup, as the executor does it:
//! 1. `let mine = ShmSegment::create_rings(layout)?` (headers zeroed, layout written);
//! 2. exchange `mine.name()` through the bootstrap;
//! 3. `let theirs = ShmSegment::open_rings(&peer_name, peer_layout)?` for every shm peer;
//! 4. a bootstrap barrier, then `mine.unlink()` and [`unlink_name`] of every
//!    peer's (the mappings stay valid, and nothing is left in /dev/shm if a
//!    process is killed later, even one killed before its own unlink);
//! 5. `shm_link(peer, &mine, slot_of_peer_in_mine, &theirs, my_slot_in_theirs, control)`.
//!
//! Segment names are `/oxccl-<pid>-<hint>-<16 hex digits>`. A segment this
//! process created is unlinked at the latest when it is dropped; one whose
//! creator was killed first is unlinked by the peers that survive it
//! ([`unlink_segments_of`]).

use std::collections::HashSet;
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use oxccl_core::{Error, Result};

use super::control::PeerControl;
use super::ring::{check_capacity, init_header, ring_footprint, RingReceiver, RingSender};
use super::{LinkKind, PeerLink, RecvHalf, SendHalf};

const SEG_MAGIC: u64 = u64::from_le_bytes(*b"OXCCLSHM");
const SEG_VERSION: u64 = 2;
/// Bytes of the segment header before the first ring.
pub const SEG_HEADER_BYTES: usize = 128;
const GIB: u64 = 1 << 30;

/// Names of segments this process created and has not unlinked yet.
static LINKED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn linked() -> std::sync::MutexGuard<'static, Vec<String>> {
    LINKED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Names (with the leading '/') of the segments this process created and
/// that are still linked in /dev/shm.
pub fn linked_segments() -> Vec<String> {
    linked().clone()
}

/// Unlinks `name` (with the leading '/'), a segment made by any process; a
/// name already gone is not an error. Mappings of it stay valid.
pub fn unlink_name(name: &str) -> Result<()> {
    let c = cname(name)?;
    // SAFETY: `c` is a valid C string.
    if unsafe { libc::shm_unlink(c.as_ptr()) } != 0 {
        let e = errno();
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(Error::system(format!(
                "cannot unlink shared-memory segment {name}: {e}"
            )));
        }
    }
    linked().retain(|n| n != name);
    Ok(())
}

/// Unlinks every segment that process `pid` created with `hint`
/// (`/dev/shm/oxccl-<pid>-<hint>-*`) and returns their names: what a rank
/// killed between creating its segment and unlinking it leaves behind.
pub fn unlink_segments_of(pid: u32, hint: &str) -> Vec<String> {
    let prefix = format!("oxccl-{pid}-{}-", sanitize_hint(hint));
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    let mut gone = Vec::new();
    for entry in dir.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        if file.starts_with(&prefix) {
            let name = format!("/{file}");
            if unlink_name(&name).is_ok() {
                gone.push(name);
            }
        }
    }
    gone
}

/// The rings inside one rank's segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmRingLayout {
    /// Number of peers that send into this segment (slots).
    pub npeers: usize,
    /// Channels (rings per peer).
    pub nchannels: usize,
    /// Data bytes of each ring (a multiple of 8, at least 64).
    pub capacity: usize,
}

impl ShmRingLayout {
    /// Bytes of a segment with this layout (what this rank needs in /dev/shm).
    pub fn segment_size(&self) -> usize {
        SEG_HEADER_BYTES + self.npeers * self.nchannels * ring_footprint(self.capacity)
    }

    /// Byte offset of the ring for (`slot`, `channel`) in the segment.
    pub fn ring_offset(&self, slot: usize, channel: usize) -> usize {
        assert!(slot < self.npeers && channel < self.nchannels);
        SEG_HEADER_BYTES + (slot * self.nchannels + channel) * ring_footprint(self.capacity)
    }

    /// [`ShmRingLayout::validate`], where a segment with a slot area may
    /// hold no rings (the one-shot slots' own segment).
    fn validate_with_slots(&self, slot_bytes: usize) -> Result<()> {
        if self.npeers == 0 && slot_bytes > 0 {
            return check_capacity(self.capacity);
        }
        self.validate()
    }

    fn validate(&self) -> Result<()> {
        check_capacity(self.capacity)?;
        if self.npeers == 0 || self.nchannels == 0 {
            return Err(Error::invalid_argument(format!(
                "shared-memory layout with {} peers and {} channels",
                self.npeers, self.nchannels
            )));
        }
        self.npeers
            .checked_mul(self.nchannels)
            .and_then(|r| r.checked_mul(ring_footprint(self.capacity)))
            .and_then(|b| b.checked_add(SEG_HEADER_BYTES))
            .ok_or_else(|| {
                Error::invalid_argument(format!("shared-memory layout {self:?} overflows"))
            })?;
        Ok(())
    }
}

/// A mapped POSIX shared-memory segment.
pub struct ShmSegment {
    name: String,
    base: NonNull<u8>,
    size: usize,
    creator: bool,
    unlinked: AtomicBool,
    layout: Option<ShmRingLayout>,
    /// Bytes of the slot area after the rings (0: none).
    slot_bytes: usize,
    /// Rings this process made halves for: (ring index, is sender).
    claimed: Mutex<HashSet<(usize, bool)>>,
}

// SAFETY: the mapping is process-wide memory valid until Drop; ShmSegment only
// hands out raw pointers and accesses its header through atomics.
unsafe impl Send for ShmSegment {}
// SAFETY: as above; shared access from threads goes through atomics or the
// ring protocol, and `claimed` is behind a Mutex.
unsafe impl Sync for ShmSegment {}

impl std::fmt::Debug for ShmSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmSegment")
            .field("name", &self.name)
            .field("size", &self.size)
            .field("creator", &self.creator)
            .field("layout", &self.layout)
            .finish()
    }
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// `1.50 GiB`, `64.0 MiB`, `512 KiB`, `100 B`.
pub fn fmt_bytes(n: u64) -> String {
    let f = n as f64;
    if n >= GIB {
        format!("{:.2} GiB", f / GIB as f64)
    } else if n >= 1 << 20 {
        format!("{:.1} MiB", f / (1u64 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.0} KiB", f / 1024.0)
    } else {
        format!("{n} B")
    }
}

/// Free and total bytes of /dev/shm, if it can be queried.
pub fn dev_shm_space() -> Option<(u64, u64)> {
    let path = CString::new("/dev/shm").ok()?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `st` a valid out-pointer.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    if rc != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize))
}

fn too_small(size: usize, free: Option<(u64, u64)>) -> Error {
    let size = size as u64;
    let (have, suggest) = match free {
        Some((free, total)) => {
            let need_total = total.saturating_sub(free) + size;
            (
                format!(
                    "/dev/shm has only {} free (of {})",
                    fmt_bytes(free),
                    fmt_bytes(total)
                ),
                need_total.div_ceil(GIB).max(1) + 1,
            )
        }
        None => (
            "/dev/shm is full".to_string(),
            size.div_ceil(GIB).max(1) + 1,
        ),
    };
    Error::system(format!(
        "/dev/shm is too small: this rank needs {size} bytes ({}) of shared memory for its \
         incoming rings (every rank on this host needs about as much), but {have}. \
         Containers get 64 MiB by default: run with `docker run --shm-size={suggest}g ...` \
         (or `--ipc=host`); on Kubernetes mount an emptyDir with `medium: Memory` at /dev/shm; \
         or lower NCCL_BUFFSIZE to make the rings smaller",
        fmt_bytes(size)
    ))
}

fn random_hex() -> Result<String> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).map_err(|e| Error::system(format!("random segment name: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn sanitize_hint(hint: &str) -> String {
    hint.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(24)
        .collect()
}

fn cname(name: &str) -> Result<CString> {
    CString::new(name)
        .map_err(|_| Error::invalid_argument(format!("shared-memory name {name:?} contains NUL")))
}

impl ShmSegment {
    /// Creates, sizes, allocates (`posix_fallocate`, so a too-small /dev/shm
    /// fails here and not with SIGBUS later) and maps a new zeroed segment of
    /// `size` bytes named `/oxccl-<pid>-<hint>-<random hex>`.
    pub fn create(name_hint: &str, size: usize) -> Result<ShmSegment> {
        if size == 0 {
            return Err(Error::invalid_argument("shared-memory segment of 0 bytes"));
        }
        let space = dev_shm_space();
        if let Some((free, _)) = space {
            if size as u64 > free {
                return Err(too_small(size, space));
            }
        }
        let hint = sanitize_hint(name_hint);
        let pid = std::process::id();
        let mut attempt = 0;
        let (name, c, fd) = loop {
            let name = if hint.is_empty() {
                format!("/oxccl-{pid}-{}", random_hex()?)
            } else {
                format!("/oxccl-{pid}-{hint}-{}", random_hex()?)
            };
            let c = cname(&name)?;
            // SAFETY: `c` is a valid C string; shm_open has no other preconditions.
            let fd = unsafe {
                libc::shm_open(
                    c.as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                    0o600,
                )
            };
            if fd >= 0 {
                break (name, c, fd);
            }
            let e = errno();
            attempt += 1;
            if e.raw_os_error() == Some(libc::EEXIST) && attempt < 8 {
                continue;
            }
            return Err(Error::system(format!(
                "cannot create shared-memory segment {name}: shm_open: {e}"
            )));
        };
        linked().push(name.clone());
        let fail = |msg: String| -> Error {
            // SAFETY: `fd` is the descriptor shm_open returned and is closed
            // exactly once here; `c` names the object we just created.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(c.as_ptr());
            }
            linked().retain(|n| n != &name);
            Error::system(msg)
        };
        // SAFETY: `fd` is a valid descriptor we own.
        if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            let e = errno();
            return Err(fail(format!(
                "cannot size shared-memory segment {name} to {size} bytes: ftruncate: {e}"
            )));
        }
        loop {
            // SAFETY: `fd` is a valid descriptor we own.
            let rc = unsafe { libc::posix_fallocate(fd, 0, size as libc::off_t) };
            match rc {
                0 => break,
                libc::EINTR => continue,
                libc::ENOSPC | libc::ENOMEM => {
                    let e = too_small(size, dev_shm_space());
                    return Err(fail(e.message().to_string()));
                }
                libc::EOPNOTSUPP | libc::EINVAL => {
                    oxccl_env::warn!(
                        "shared-memory segment {name}: posix_fallocate is not supported here; \
                         a full /dev/shm would show as SIGBUS later"
                    );
                    break;
                }
                _ => {
                    let e = std::io::Error::from_raw_os_error(rc);
                    return Err(fail(format!(
                        "cannot allocate {size} bytes for shared-memory segment {name}: \
                         posix_fallocate: {e}"
                    )));
                }
            }
        }
        // SAFETY: mapping a fresh shared object of `size` bytes we just sized;
        // no existing memory is affected (addr is null).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = errno();
            return Err(fail(format!(
                "cannot map shared-memory segment {name} ({size} bytes): mmap: {e}"
            )));
        }
        // SAFETY: the mapping keeps the object alive; the descriptor is ours.
        unsafe { libc::close(fd) };
        oxccl_env::info!(
            oxccl_env::Subsys::SHM,
            "created shared-memory segment {name} of {}",
            fmt_bytes(size as u64)
        );
        Ok(ShmSegment {
            name,
            base: NonNull::new(p.cast()).expect("mmap returned null"),
            size,
            creator: true,
            unlinked: AtomicBool::new(false),
            layout: None,
            slot_bytes: 0,
            claimed: Mutex::new(HashSet::new()),
        })
    }

    /// Maps the existing segment `name` (created by a peer), which must be at
    /// least `size` bytes.
    pub fn open(name: &str, size: usize) -> Result<ShmSegment> {
        let c = cname(name)?;
        // SAFETY: `c` is a valid C string.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if fd < 0 {
            let e = errno();
            let why = if e.raw_os_error() == Some(libc::ENOENT) {
                " (its creator exited, or unlinked it before every peer opened it)"
            } else {
                ""
            };
            return Err(Error::system(format!(
                "cannot open shared-memory segment {name}: shm_open: {e}{why}"
            )));
        }
        // SAFETY: stat is plain old data; all-zero is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is valid and `st` a valid out-pointer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || (st.st_size as u64) < size as u64 {
            let e = errno();
            // SAFETY: closing the descriptor we own, once.
            unsafe { libc::close(fd) };
            return Err(Error::system(format!(
                "shared-memory segment {name} is {} bytes, expected at least {size} ({e})",
                st.st_size
            )));
        }
        // SAFETY: mapping `size` bytes of an object at least that large; addr null.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        let e = errno();
        // SAFETY: the mapping (if any) keeps the object alive; the fd is ours.
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            return Err(Error::system(format!(
                "cannot map shared-memory segment {name} ({size} bytes): mmap: {e}"
            )));
        }
        Ok(ShmSegment {
            name: name.to_string(),
            base: NonNull::new(p.cast()).expect("mmap returned null"),
            size,
            creator: false,
            unlinked: AtomicBool::new(false),
            layout: None,
            slot_bytes: 0,
            claimed: Mutex::new(HashSet::new()),
        })
    }

    /// Creates this rank's segment for incoming rings: sized by
    /// `layout.segment_size()`, every ring header zeroed and the layout written
    /// into the segment header, all before the name can be published.
    pub fn create_rings(layout: ShmRingLayout) -> Result<Arc<ShmSegment>> {
        ShmSegment::create_rings_named(layout, "rx")
    }

    /// [`ShmSegment::create_rings`] with `hint` in the name (ASCII letters
    /// and digits, at most 24): a communicator puts its key there, so its
    /// ranks can find and remove each other's segments
    /// ([`unlink_segments_of`]) when a rank dies before unlinking its own.
    pub fn create_rings_named(layout: ShmRingLayout, hint: &str) -> Result<Arc<ShmSegment>> {
        ShmSegment::create_rings_and_slots(layout, hint, 0)
    }

    /// [`ShmSegment::create_rings_named`] with a slot area of `slot_bytes`
    /// (a multiple of 64; 0: none) after the rings, zeroed.
    pub fn create_rings_and_slots(
        layout: ShmRingLayout,
        hint: &str,
        slot_bytes: usize,
    ) -> Result<Arc<ShmSegment>> {
        layout.validate_with_slots(slot_bytes)?;
        let size = segment_size_with_slots(layout, slot_bytes)?;
        let mut seg = ShmSegment::create(hint, size)?;
        for slot in 0..layout.npeers {
            for ch in 0..layout.nchannels {
                let off = layout.ring_offset(slot, ch);
                // SAFETY: off + ring_footprint <= segment_size (layout math),
                // the offset is 64-byte aligned (header 128, stride multiple of
                // 64, mmap page-aligned) and no ring half exists yet.
                unsafe { init_header(seg.base.add(off)) };
            }
        }
        let h = seg.header_words();
        h[1].store(SEG_VERSION, Ordering::Relaxed);
        h[2].store(layout.npeers as u64, Ordering::Relaxed);
        h[3].store(layout.nchannels as u64, Ordering::Relaxed);
        h[4].store(layout.capacity as u64, Ordering::Relaxed);
        h[5].store(slot_bytes as u64, Ordering::Relaxed);
        h[0].store(SEG_MAGIC, Ordering::Release);
        seg.layout = Some(layout);
        seg.slot_bytes = slot_bytes;
        Ok(Arc::new(seg))
    }

    /// Opens a peer's ring segment and checks that it has `layout`.
    pub fn open_rings(name: &str, layout: ShmRingLayout) -> Result<Arc<ShmSegment>> {
        ShmSegment::open_rings_and_slots(name, layout, 0)
    }

    /// [`ShmSegment::open_rings`] of a segment made with a slot area of
    /// `slot_bytes` ([`ShmSegment::create_rings_and_slots`]).
    pub fn open_rings_and_slots(
        name: &str,
        layout: ShmRingLayout,
        slot_bytes: usize,
    ) -> Result<Arc<ShmSegment>> {
        layout.validate_with_slots(slot_bytes)?;
        let size = segment_size_with_slots(layout, slot_bytes)?;
        let mut seg = ShmSegment::open(name, size)?;
        let h = seg.header_words();
        let found = [
            h[0].load(Ordering::Acquire),
            h[1].load(Ordering::Relaxed),
            h[2].load(Ordering::Relaxed),
            h[3].load(Ordering::Relaxed),
            h[4].load(Ordering::Relaxed),
            h[5].load(Ordering::Relaxed),
        ];
        let want = [
            SEG_MAGIC,
            SEG_VERSION,
            layout.npeers as u64,
            layout.nchannels as u64,
            layout.capacity as u64,
            slot_bytes as u64,
        ];
        if found != want {
            return Err(Error::invalid_usage(format!(
                "shared-memory segment {name} has layout (version {}, {} peers, {} channels, \
                 {}-byte rings, {}-byte slots), expected (version {}, {} peers, {} channels, \
                 {}-byte rings, {}-byte slots): ranks on this host run with different settings \
                 (NCCL_BUFFSIZE, channels, NCCL_ALGO) or different oxccl versions",
                found[1],
                found[2],
                found[3],
                found[4],
                found[5],
                want[1],
                want[2],
                want[3],
                want[4],
                want[5]
            )));
        }
        seg.layout = Some(layout);
        seg.slot_bytes = slot_bytes;
        Ok(Arc::new(seg))
    }

    /// The slot area after the rings: its first byte (64-byte aligned) and
    /// length, for segments made or opened with one.
    pub fn slot_area(&self) -> Option<(NonNull<u8>, usize)> {
        let layout = self.layout?;
        if self.slot_bytes == 0 {
            return None;
        }
        // SAFETY: segment_size() + slot_bytes is the mapped size (checked at
        // create/open), so the offset stays inside the mapping.
        let p = unsafe { self.base.as_ptr().add(layout.segment_size()) };
        NonNull::new(p).map(|p| (p, self.slot_bytes))
    }

    fn header_words(&self) -> &[AtomicU64; 6] {
        assert!(self.size >= SEG_HEADER_BYTES);
        // SAFETY: the mapping is at least SEG_HEADER_BYTES long (asserted;
        // every ring segment is), page-aligned, lives as long as self, and the
        // header is only accessed through atomics in every process.
        unsafe { &*self.base.as_ptr().cast::<[AtomicU64; 6]>() }
    }

    /// The segment's name (with the leading '/'), to send to peers.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Mapped bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The ring layout (for segments made by `create_rings`/`open_rings`).
    pub fn ring_layout(&self) -> Option<ShmRingLayout> {
        self.layout
    }

    /// Removes the name from /dev/shm (the mapping stays valid). The creator
    /// calls this once every peer has opened the segment. Idempotent.
    pub fn unlink(&self) -> Result<()> {
        if self.unlinked.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        linked().retain(|n| n != &self.name);
        let c = cname(&self.name)?;
        // SAFETY: `c` is a valid C string.
        if unsafe { libc::shm_unlink(c.as_ptr()) } != 0 {
            let e = errno();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(Error::system(format!(
                    "cannot unlink shared-memory segment {}: {e}",
                    self.name
                )));
            }
        }
        Ok(())
    }

    fn claim(&self, ring: usize, sender: bool) -> Result<()> {
        let mut c = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        if !c.insert((ring, sender)) {
            return Err(Error::invalid_usage(format!(
                "shared-memory segment {}: ring {ring} already has a {} in this process",
                self.name,
                if sender { "sender" } else { "receiver" }
            )));
        }
        Ok(())
    }
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        // SAFETY: base/size are exactly the mapping made in create/open, and
        // no ring half outlives the segment (they hold an Arc to it).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.size) };
        if self.creator {
            if let Err(e) = self.unlink() {
                oxccl_env::warn!("{e}");
            }
        }
    }
}

/// Bytes of a segment with `layout`'s rings and a slot area of `slot_bytes`.
fn segment_size_with_slots(layout: ShmRingLayout, slot_bytes: usize) -> Result<usize> {
    if slot_bytes % 64 != 0 {
        return Err(Error::invalid_argument(format!(
            "shared-memory slot area of {slot_bytes} bytes (a multiple of 64 is needed)"
        )));
    }
    layout
        .segment_size()
        .checked_add(slot_bytes)
        .ok_or_else(|| {
            Error::invalid_argument(format!("shared-memory layout {layout:?} overflows"))
        })
}

/// A link to `peer` over shared memory: send halves on the rings at
/// `my_slot_in_theirs` in the peer's segment `theirs`, receive halves on the
/// rings at `peer_slot_in_mine` in this rank's segment `mine`. Both segments
/// must come from `create_rings`/`open_rings` with the same channel count.
/// Each ring may get one sender and one receiver per process (a second claim
/// is an `InvalidUsage` error).
pub fn shm_link(
    peer: usize,
    mine: &Arc<ShmSegment>,
    peer_slot_in_mine: usize,
    theirs: &Arc<ShmSegment>,
    my_slot_in_theirs: usize,
    control: PeerControl,
) -> Result<PeerLink> {
    let (Some(ml), Some(tl)) = (mine.layout, theirs.layout) else {
        return Err(Error::invalid_usage(
            "shm_link needs segments made by ShmSegment::create_rings / open_rings",
        ));
    };
    if ml.nchannels != tl.nchannels {
        return Err(Error::invalid_usage(format!(
            "shm link to rank {peer}: {} channels here, {} in its segment",
            ml.nchannels, tl.nchannels
        )));
    }
    if peer_slot_in_mine >= ml.npeers || my_slot_in_theirs >= tl.npeers {
        return Err(Error::invalid_usage(format!(
            "shm link to rank {peer}: slot {peer_slot_in_mine} of {} here or {my_slot_in_theirs} of {} there out of range",
            ml.npeers, tl.npeers
        )));
    }
    let mut send: Vec<Box<dyn SendHalf>> = Vec::with_capacity(ml.nchannels);
    let mut recv: Vec<Box<dyn RecvHalf>> = Vec::with_capacity(ml.nchannels);
    for ch in 0..ml.nchannels {
        let ring = my_slot_in_theirs * tl.nchannels + ch;
        theirs.claim(ring, true)?;
        let off = tl.ring_offset(my_slot_in_theirs, ch);
        // SAFETY: `off` is 64-aligned and the ring's footprint lies within the
        // mapping (layout checked against the segment header, and the mapping
        // is segment_size bytes); the creator zeroed the header before
        // publishing the name; `claim` makes this the only sender for the ring
        // in this process, and the slot assignment (each peer its own slot)
        // makes it the only one across processes; the Arc keeps the mapping.
        let tx =
            unsafe { RingSender::new(theirs.base.add(off), tl.capacity, theirs.clone(), None) };
        send.push(Box::new(tx));
        let ring = peer_slot_in_mine * ml.nchannels + ch;
        mine.claim(ring, false)?;
        let off = ml.ring_offset(peer_slot_in_mine, ch);
        // SAFETY: as above, for the single receiver of our own incoming ring.
        let rx = unsafe { RingReceiver::new(mine.base.add(off), ml.capacity, mine.clone(), None) };
        recv.push(Box::new(rx));
    }
    oxccl_env::info!(
        oxccl_env::Subsys::SHM,
        "connected to rank {peer} via SHM: {} channels, {} rings",
        ml.nchannels,
        fmt_bytes(ml.capacity as u64)
    );
    Ok(PeerLink {
        peer,
        kind: LinkKind::Shm,
        send,
        recv,
        control,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_math() {
        let l = ShmRingLayout {
            npeers: 3,
            nchannels: 2,
            capacity: 1000,
        };
        assert_eq!(ring_footprint(1000), 128 + 1024);
        assert_eq!(l.segment_size(), 128 + 6 * 1152);
        assert_eq!(l.ring_offset(1, 1), 128 + 3 * 1152);
        assert_eq!(l.ring_offset(1, 1) % 64, 0);
    }

    #[test]
    fn fmt_bytes_units() {
        assert_eq!(fmt_bytes(100), "100 B");
        assert_eq!(fmt_bytes(64 << 20), "64.0 MiB");
        assert_eq!(fmt_bytes(3 << 29), "1.50 GiB");
    }
}
