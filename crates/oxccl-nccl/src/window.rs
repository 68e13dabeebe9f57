//! Windows (`ncclCommWindowRegister`): every rank's buffer, registered
//! together, and each peer's buffer as an address this process can load
//! from and store to where one exists ("load-store accessible"): the same
//! address for ranks of this process, a CUDA IPC mapping for device
//! buffers of other processes of this host, none for other hosts or for
//! host memory of another process.
//!
//! Collectives on window buffers run as on any buffer (correct results;
//! `NCCL_WIN_COLL_SYMMETRIC` is a hint oxccl takes no speed from yet).
//! Like communicators, a window handle is a number from
//! [`handle::next_handle`] looked up in a registry, never an address.

use crate::abi::*;
use crate::api::null_arg;
use crate::handle::{self, lock, Comm};
use oxccl::{Error, Result};
use oxccl_cuda::capi::{self as cuda, Memory};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// `NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING`.
const WIN_FLAGS: c_int = 0x3;
/// One rank's record in the registration exchange: kind, ordinal, pid,
/// buffer, size, allocation base, whether a handle follows, the handle.
const REC: usize = 1 + 4 + 4 + 8 + 8 + 8 + 1 + 64;

pub(crate) struct Window {
    /// The communicator it belongs to (its handle).
    comm: usize,
    user: u64,
    /// Each rank's window size.
    sizes: Vec<u64>,
    /// Each rank's buffer as an address here, where one exists.
    peers: Vec<Option<u64>>,
    /// IPC mappings to release: (GPU ordinal, mapped base).
    imported: Vec<(i32, u64)>,
    /// This rank's LSA team at registration: (first world rank, size).
    lsa: (usize, usize),
}

fn registry() -> MutexGuard<'static, HashMap<usize, Arc<Window>>> {
    static R: OnceLock<Mutex<HashMap<usize, Arc<Window>>>> = OnceLock::new();
    lock(R.get_or_init(Default::default))
}

fn lookup(win: ncclWindow_t) -> Result<Arc<Window>> {
    if win.is_null() {
        return Err(null_arg("window"));
    }
    registry().get(&(win as usize)).cloned().ok_or_else(|| {
        let why = if handle::was_made_here(win as usize) {
            " (it was deregistered)"
        } else {
            ""
        };
        Error::invalid_argument(format!("window {win:p} is not a registered window{why}"))
    })
}

fn of_comm(comm: ncclComm_t, win: ncclWindow_t) -> Result<(Arc<Comm>, Arc<Window>)> {
    let c = handle::lookup(comm, "comm")?;
    let w = lookup(win)?;
    if w.comm != comm as usize {
        return Err(Error::invalid_argument(format!(
            "window {win:p} was registered on another communicator"
        )));
    }
    Ok((c, w))
}

/// `ncclCommWindowRegister`: collective; every rank passes its buffer.
pub(crate) unsafe fn register(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    out: *mut ncclWindow_t,
    flags: c_int,
) -> Result<()> {
    if !out.is_null() {
        // SAFETY: checked non-NULL; the caller passes a writable ncclWindow_t.
        unsafe { out.write(std::ptr::null_mut()) };
    }
    let c = handle::lookup(comm, "comm")?;
    if out.is_null() {
        return Err(null_arg("win"));
    }
    c.check_not_stopped()?;
    if flags & !WIN_FLAGS != 0 {
        return Err(Error::invalid_argument(format!(
            "winFlags {flags:#x} has bits other than NCCL_WIN_COLL_SYMMETRIC (1) and NCCL_WIN_STRICT_ORDERING (2)"
        )));
    }
    if buff.is_null() {
        return Err(null_arg("buff"));
    }
    if size == 0 {
        return Err(Error::invalid_argument(
            "size is 0: a window holds at least one byte",
        ));
    }
    let user = buff as u64;
    let (mem, ext) = cuda::locate(buff)?;
    let (kind, ord, base) = match (mem, ext) {
        (Memory::Device(o), Some((b, len))) => {
            if user.saturating_add(size as u64) > b.saturating_add(len) {
                return Err(Error::invalid_argument(format!(
                    "buff {buff:p} + size {size} runs past its allocation ({len} bytes from {b:#x})"
                )));
            }
            (1u8, o, b)
        }
        _ => (0u8, -1, user),
    };
    let handle = if kind == 1 {
        cuda::export_allocation(base)
    } else {
        None
    };
    let mut mine = Vec::with_capacity(REC);
    mine.push(kind);
    mine.extend_from_slice(&ord.to_le_bytes());
    mine.extend_from_slice(&std::process::id().to_le_bytes());
    for v in [user, size as u64, base] {
        mine.extend_from_slice(&v.to_le_bytes());
    }
    mine.push(u8::from(handle.is_some()));
    mine.extend_from_slice(&handle.unwrap_or([0; 64]));
    let comm_h = c.wait()?;
    let all = comm_h.exchange(&mine)?;
    let me = comm_h.rank();
    let mut w = Window {
        comm: comm as usize,
        user,
        sizes: Vec::with_capacity(all.len()),
        peers: Vec::with_capacity(all.len()),
        imported: Vec::new(),
        lsa: crate::team::lsa(me, &comm_h.hosts()?),
    };
    let u64_at =
        |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let mut failure = None;
    for (p, rec) in all.iter().enumerate() {
        if rec.len() != REC {
            failure = Some(Error::internal(format!(
                "window registration: rank {p} sent {} bytes, not {REC}",
                rec.len()
            )));
            break;
        }
        let (pkind, pid) = (rec[0], u32::from_le_bytes(rec[5..9].try_into().expect("4")));
        let (pbuf, psize, pbase) = (u64_at(rec, 9), u64_at(rec, 17), u64_at(rec, 25));
        w.sizes.push(psize);
        let addr = if p == me {
            Some(user)
        } else if !comm_h.is_same_host(p) {
            None
        } else if pid == std::process::id() {
            Some(pbuf)
        } else if pkind == 1 && kind == 1 && rec[33] == 1 {
            let h: [u8; 64] = rec[34..98].try_into().expect("64 bytes");
            match cuda::use_device(ord).and_then(|_| cuda::import_allocation(ord, &h)) {
                Ok(m) => {
                    w.imported.push((ord, m));
                    Some(m + (pbuf - pbase))
                }
                Err(e) => {
                    failure =
                        Some(e.context(format!("window registration: mapping rank {p}'s buffer")));
                    break;
                }
            }
        } else {
            None
        };
        w.peers.push(addr);
    }
    if let Some(e) = failure {
        release(&w);
        return Err(e);
    }
    let h = handle::next_handle();
    registry().insert(h, Arc::new(w));
    // SAFETY: checked non-NULL above.
    unsafe { out.write(h as ncclWindow_t) };
    Ok(())
}

/// Unmaps a window's IPC mappings, after the GPU finished what used them.
fn release(w: &Window) {
    if let Some(&(ord, _)) = w.imported.first() {
        let _ = cuda::use_device(ord).and_then(|_| cuda::synchronize_current());
    }
    for &(ord, m) in &w.imported {
        cuda::release_allocation(ord, m);
    }
}

/// `ncclCommWindowDeregister`.
pub(crate) fn deregister(comm: ncclComm_t, win: ncclWindow_t) -> Result<()> {
    let (_, w) = of_comm(comm, win)?;
    registry().remove(&(win as usize));
    release(&w);
    Ok(())
}

/// Deregisters every window of a communicator being destroyed.
pub(crate) fn drop_comm(comm: ncclComm_t) {
    let gone: Vec<Arc<Window>> = {
        let mut r = registry();
        let keys: Vec<usize> = r
            .iter()
            .filter(|(_, w)| w.comm == comm as usize)
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter().filter_map(|k| r.remove(&k)).collect()
    };
    for w in gone {
        release(&w);
    }
}

/// `ncclWinGetUserPtr`: the buffer this rank registered.
pub(crate) unsafe fn user_ptr(
    comm: ncclComm_t,
    win: ncclWindow_t,
    out: *mut *mut c_void,
) -> Result<()> {
    let (_, w) = of_comm(comm, win)?;
    if out.is_null() {
        return Err(null_arg("outUserPtr"));
    }
    // SAFETY: checked non-NULL.
    unsafe { out.write(w.user as *mut c_void) };
    Ok(())
}

/// `ncclGetPeerDevicePointer`: rank `peer`'s window at `offset` as an
/// address here, or NULL where that rank's buffer cannot be reached by
/// loads and stores from this process (another host; host memory of
/// another process; memory that could not be exported).
pub(crate) unsafe fn peer_ptr(
    win: ncclWindow_t,
    offset: usize,
    peer: c_int,
    out: *mut *mut c_void,
) -> Result<()> {
    if !out.is_null() {
        // SAFETY: checked non-NULL.
        unsafe { out.write(std::ptr::null_mut()) };
    }
    let w = lookup(win)?;
    if out.is_null() {
        return Err(null_arg("outPtr"));
    }
    let n = w.peers.len();
    if peer < 0 || peer as usize >= n {
        return Err(Error::invalid_argument(format!(
            "invalid peer {peer} (valid: 0..{} for a window of {n} ranks)",
            n.saturating_sub(1)
        )));
    }
    let p = peer as usize;
    if offset as u64 >= w.sizes[p] {
        return Err(Error::invalid_argument(format!(
            "offset {offset} is past rank {p}'s window of {} bytes",
            w.sizes[p]
        )));
    }
    if let Some(a) = w.peers[p] {
        // SAFETY: checked non-NULL.
        unsafe { out.write((a + offset as u64) as *mut c_void) };
    }
    Ok(())
}

/// `ncclGetLsaDevicePointer`: [`peer_ptr`] of the rank `lsaRank` places
/// after the first of this rank's LSA team (the consecutive ranks of its
/// host).
pub(crate) unsafe fn lsa_ptr(
    win: ncclWindow_t,
    offset: usize,
    lsa_rank: c_int,
    out: *mut *mut c_void,
) -> Result<()> {
    if !out.is_null() {
        // SAFETY: checked non-NULL.
        unsafe { out.write(std::ptr::null_mut()) };
    }
    let (base, size) = lookup(win)?.lsa;
    if lsa_rank < 0 || lsa_rank as usize >= size {
        return Err(Error::invalid_argument(format!(
            "invalid lsaRank {lsa_rank} (valid: 0..{} for this rank's LSA team of {size})",
            size - 1
        )));
    }
    // SAFETY: forwarded.
    unsafe { peer_ptr(win, offset, (base + lsa_rank as usize) as c_int, out) }
}
