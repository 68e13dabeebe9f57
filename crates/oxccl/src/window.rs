//! Windows: every rank's buffer, registered together, and each peer's
//! buffer as an address this process can load from and store to where one
//! exists ("load-store accessible"): the same address for ranks of this
//! process, a CUDA IPC mapping for device buffers of other processes of
//! this host, none for other hosts or for host memory of another process.

use crate::{Communicator, Error, Result};
use oxccl_cuda::exec::{self as cuda, Memory};
use std::ffi::c_void;

/// One rank's record in the registration exchange: kind, ordinal, pid,
/// buffer, size, allocation base, whether a handle follows, the handle.
const REC: usize = 1 + 4 + 4 + 8 + 8 + 8 + 1 + 64;

/// A window of a communicator ([`Communicator::register_window`]). Dropping
/// it unmaps the peers' buffers it mapped (after the GPU finished what was
/// queued on this rank's device).
#[derive(Debug)]
pub struct Window {
    user: u64,
    /// Each rank's window size.
    sizes: Vec<u64>,
    /// Each rank's buffer as an address here, where one exists.
    peers: Vec<Option<u64>>,
    /// IPC mappings to release: (GPU ordinal, mapped base).
    imported: Vec<(i32, u64)>,
}

impl Window {
    /// This rank's buffer.
    pub fn user_ptr(&self) -> u64 {
        self.user
    }
    /// Ranks of the window.
    pub fn nranks(&self) -> usize {
        self.sizes.len()
    }
    /// The bytes rank `r` registered.
    pub fn size_of(&self, r: usize) -> Option<u64> {
        self.sizes.get(r).copied()
    }
    /// Rank `r`'s buffer as an address in this process, where loads and
    /// stores reach it (see the module docs).
    pub fn peer_ptr(&self, r: usize) -> Option<u64> {
        self.peers.get(r).copied().flatten()
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Some(&(ord, _)) = self.imported.first() {
            let _ = cuda::use_device(ord).and_then(|_| cuda::synchronize_current());
        }
        for &(ord, m) in &self.imported {
            cuda::release_allocation(ord, m);
        }
    }
}

impl Communicator {
    /// Registers `size` bytes at `buff` as this rank's part of a window
    /// (`ncclCommWindowRegister`). Collective: every rank calls it, in the
    /// same order relative to the other collectives. Device memory must lie
    /// inside one allocation.
    ///
    /// # Safety
    /// `buff..buff + size` is memory of this process (host or device) that
    /// stays allocated while the window lives.
    pub unsafe fn register_window(&self, buff: *mut c_void, size: usize) -> Result<Window> {
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
        let all = self.exchange(&mine)?;
        let me = self.rank();
        let mut w = Window {
            user,
            sizes: Vec::with_capacity(all.len()),
            peers: Vec::with_capacity(all.len()),
            imported: Vec::new(),
        };
        let u64_at =
            |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        for (p, rec) in all.iter().enumerate() {
            if rec.len() != REC {
                return Err(Error::internal(format!(
                    "window registration: rank {p} sent {} bytes, not {REC}",
                    rec.len()
                )));
            }
            let (pkind, pid) = (rec[0], u32::from_le_bytes(rec[5..9].try_into().expect("4")));
            let (pbuf, psize, pbase) = (u64_at(rec, 9), u64_at(rec, 17), u64_at(rec, 25));
            w.sizes.push(psize);
            let addr = if p == me {
                Some(user)
            } else if !self.is_same_host(p) {
                None
            } else if pid == std::process::id() {
                Some(pbuf)
            } else if pkind == 1 && kind == 1 && rec[33] == 1 {
                let h: [u8; 64] = rec[34..98].try_into().expect("64 bytes");
                // A failure drops `w`, which releases the mappings made so far.
                let m = cuda::use_device(ord)
                    .and_then(|_| cuda::import_allocation(ord, &h))
                    .map_err(|e| {
                        e.context(format!("window registration: mapping rank {p}'s buffer"))
                    })?;
                w.imported.push((ord, m));
                Some(m + (pbuf - pbase))
            } else {
                None
            };
            w.peers.push(addr);
        }
        Ok(w)
    }
}
