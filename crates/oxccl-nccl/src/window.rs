//! Windows (`ncclCommWindowRegister`): handles over
//! [`oxccl::Window`], which registers every rank's buffer together and
//! maps each peer's buffer where this process can load from and store to
//! it ("load-store accessible").
//!
//! Collectives on window buffers run as on any buffer (correct results;
//! `NCCL_WIN_COLL_SYMMETRIC` is a hint oxccl takes no speed from yet).
//! Like communicators, a window handle is a number from
//! [`handle::next_handle`] looked up in a registry, never an address.

use crate::abi::*;
use crate::handle::null_arg;
use crate::handle::{self, lock, Comm};
use oxccl::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// `NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING`.
const WIN_FLAGS: c_int = 0x3;
pub(crate) struct Window {
    /// The communicator it belongs to (its handle).
    comm: usize,
    /// The registration: each rank's size and address here; dropping it
    /// unmaps the peers' buffers.
    win: oxccl::Window,
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
    let comm_h = c.wait()?;
    // SAFETY: the caller registers memory of this process that stays
    // allocated until it deregisters the window (NCCL's contract).
    let win = unsafe { comm_h.register_window(buff, size) }?;
    let w = Window {
        comm: comm as usize,
        win,
        lsa: crate::team::lsa(comm_h.rank(), &oxccl::abi_support::hosts(&comm_h)?),
    };
    let h = handle::next_handle();
    registry().insert(h, Arc::new(w));
    // SAFETY: checked non-NULL above.
    unsafe { out.write(h as ncclWindow_t) };
    Ok(())
}

/// `ncclCommWindowDeregister`.
pub(crate) fn deregister(comm: ncclComm_t, win: ncclWindow_t) -> Result<()> {
    of_comm(comm, win)?;
    let w = registry().remove(&(win as usize));
    // Dropping the last reference (outside the registry's lock) unmaps the
    // peers' buffers.
    drop(w);
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
    drop(gone);
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
    unsafe { out.write(w.win.user_ptr() as *mut c_void) };
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
    let n = w.win.nranks();
    if peer < 0 || peer as usize >= n {
        return Err(Error::invalid_argument(format!(
            "invalid peer {peer} (valid: 0..{} for a window of {n} ranks)",
            n.saturating_sub(1)
        )));
    }
    let p = peer as usize;
    let size = w.win.size_of(p).unwrap_or(0);
    if offset as u64 >= size {
        return Err(Error::invalid_argument(format!(
            "offset {offset} is past rank {p}'s window of {size} bytes"
        )));
    }
    if let Some(a) = w.win.peer_ptr(p) {
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
