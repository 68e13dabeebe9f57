//! The GPU ring's transports: how this rank's kernels reach a peer's ring
//! window, and how the window of a peer on another host is kept in step.
//!
//! Which transport serves a peer is decided purely
//! ([`oxccl_core::gpu::window::peer_path`], tested without a GPU); this
//! module acts on the decision. Each transport is a type of its own behind
//! one interface, as oxccl-host's transports are:
//!
//! - [`WindowMapping`]: a window mapped here, opened from the owner's
//!   descriptor and closed when dropped: [`PeerPointer`] (the owner's
//!   address is valid here, with peer access enabled where the GPUs
//!   differ), [`IpcMapping`] (CUDA IPC from another process of this host),
//!   [`HostMapping`] (host memory registered for the GPU: a peer's
//!   /dev/shm window, or an anonymous window the network proxies fill).
//! - [`NetworkLink`]: the proxy threads that carry a window's regions to a
//!   peer on another host and back, over oxccl's TCP path
//!   ([`crate::netproxy::Proxy`]) or an NCCL network plugin
//!   ([`crate::netplugin::PluginProxy`]).
//!
//! Every close needs the ring's context current (the ring's `Drop` makes it
//! so before it drops its mappings).

use std::ffi::{c_void, CString};
use std::time::Instant;

use oxccl_core::gpu::window::{PeerPath, WindowDescriptor};
use oxccl_core::{Error, Result};

use crate::driver::{self as cu, CUresult};
use crate::loader::guarded;

/// A ring window mapped here, held open until dropped.
pub(crate) trait WindowMapping: std::fmt::Debug + Send + Sync {
    /// The address this rank's kernels use for the window.
    fn device_addr(&self) -> u64;
    /// The window's host address, where it is host memory mapped here (the
    /// network proxies fill it); `None` for device memory.
    fn host_addr(&self) -> Option<usize> {
        None
    }
}

/// Opens peer `peer`'s window (`desc`, `len` bytes) as `path` says; `None`
/// for this rank's own window, which is not a mapping. `ordinal` is the
/// peer's device when `path` asks for peer access.
pub(crate) fn open_peer_window(
    path: PeerPath,
    desc: &WindowDescriptor,
    peer: usize,
    ordinal: i32,
    len: usize,
) -> Result<Option<Box<dyn WindowMapping>>> {
    Ok(Some(match path {
        PeerPath::Own => return Ok(None),
        PeerPath::Pointer { peer_access } => Box::new(PeerPointer::open(
            desc.addr,
            peer_access.then_some(ordinal),
        )?),
        PeerPath::Ipc => Box::new(IpcMapping::open(desc, peer)?),
        PeerPath::SharedMemory => {
            let name = CString::new(desc.shm_name.clone())
                .map_err(|_| Error::internal(format!("rank {peer}'s window name holds a NUL")))?;
            Box::new(HostMapping::register(shm_map(&name, len, false)?, len)?)
        }
        // A local shadow of the peer's window (netproxy.rs).
        PeerPath::Network => Box::new(HostMapping::anonymous(len)?),
    }))
}

/// A peer's window at an address valid in this context: same GPU, or
/// another GPU of this process reached by peer access, whose primary
/// context is retained until drop.
#[derive(Debug)]
pub(crate) struct PeerPointer {
    addr: u64,
    retained: Option<cu::CUdevice>,
}

impl PeerPointer {
    fn open(addr: u64, peer_access_to: Option<i32>) -> Result<PeerPointer> {
        let Some(ordinal) = peer_access_to else {
            return Ok(PeerPointer {
                addr,
                retained: None,
            });
        };
        // A device of this process (its ordinal is its device handle).
        let pctx = guarded("cuDevicePrimaryCtxRetain", || {
            Ok(cu::primary_ctx_retain(ordinal)?)
        })?;
        let me = PeerPointer {
            addr,
            retained: Some(ordinal),
        };
        guarded("cuCtxEnablePeerAccess", || {
            // SAFETY: the ring's context is current (setup's scope); pctx is
            // retained (released when `me` drops).
            match unsafe { cu::ctx_enable_peer_access(pctx) } {
                Err(e) if e.code == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
                r => Ok(r?),
            }
        })?;
        Ok(me)
    }
}

impl WindowMapping for PeerPointer {
    fn device_addr(&self) -> u64 {
        self.addr
    }
}

impl Drop for PeerPointer {
    fn drop(&mut self) {
        if let Some(d) = self.retained {
            // SAFETY: the retain this value took in `open`, released once.
            let _ = unsafe { cu::primary_ctx_release(d) };
        }
    }
}

/// A window of another process of this host, opened from its CUDA IPC handle.
#[derive(Debug)]
pub(crate) struct IpcMapping(u64);

impl IpcMapping {
    fn open(desc: &WindowDescriptor, peer: usize) -> Result<IpcMapping> {
        let h = cu::CUipcMemHandle_st {
            reserved: desc.ipc_handle.map(|c| c as std::ffi::c_char),
        };
        let p = guarded("cuIpcOpenMemHandle", || {
            // SAFETY: a handle from cuIpcGetMemHandle of another process on
            // this host; closed once, when this value drops.
            unsafe { cu::ipc_open_mem_handle(h) }
                .map_err(|e| e.context(&format!("cuIpcOpenMemHandle (rank {peer}'s window)")))
        })?;
        Ok(IpcMapping(p))
    }
}

impl WindowMapping for IpcMapping {
    fn device_addr(&self) -> u64 {
        self.0
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: our cuIpcOpenMemHandle pointer, closed once.
        let _ = unsafe { cu::ipc_close_mem_handle(self.0) };
    }
}

/// Host memory mapped here and registered for the GPU: a peer's /dev/shm
/// window, or an anonymous one (the network path's shadows and window).
#[derive(Debug)]
pub(crate) struct HostMapping {
    addr: usize,
    len: usize,
    dev: u64,
}

impl HostMapping {
    /// `len` bytes of zeroed anonymous memory, registered.
    pub(crate) fn anonymous(len: usize) -> Result<HostMapping> {
        HostMapping::register(anon_map(len)?, len)
    }

    /// Registers the `len` bytes mapped at `addr` (ours from here on:
    /// unmapped at drop, or now when registration fails).
    fn register(addr: usize, len: usize) -> Result<HostMapping> {
        match host_register(addr, len) {
            Ok(dev) => Ok(HostMapping { addr, len, dev }),
            Err(e) => {
                // SAFETY: our mapping of `len` bytes, unused.
                unsafe { libc::munmap(addr as *mut c_void, len) };
                Err(e)
            }
        }
    }
}

impl WindowMapping for HostMapping {
    fn device_addr(&self) -> u64 {
        self.dev
    }
    fn host_addr(&self) -> Option<usize> {
        Some(self.addr)
    }
}

impl Drop for HostMapping {
    fn drop(&mut self) {
        // SAFETY: our registration and mapping of `len` bytes at `addr`,
        // undone once; the kernels and proxies that used them have stopped
        // (the ring synchronizes and stops its proxies first).
        unsafe {
            let _ = cu::mem_host_unregister(self.addr as *mut c_void);
            libc::munmap(self.addr as *mut c_void, self.len);
        }
    }
}

/// The proxy threads of one peer on another host (one connection's worth).
pub(crate) trait NetworkLink: std::fmt::Debug + Send + Sync {
    /// Waits until `deadline` for everything the finished kernels wrote to
    /// have left; false when it had not.
    fn drain(&self, deadline: Instant) -> bool;
    /// From now on a closing connection is not reported (both ends of a
    /// link being torn down close it).
    fn halt(&self);
    /// Stops and joins the threads.
    fn stop(&mut self);
}

impl NetworkLink for crate::netproxy::Proxy {
    fn drain(&self, deadline: Instant) -> bool {
        crate::netproxy::Proxy::drain(self, deadline)
    }
    fn halt(&self) {
        crate::netproxy::Proxy::halt(self)
    }
    fn stop(&mut self) {
        crate::netproxy::Proxy::stop(self)
    }
}

impl NetworkLink for crate::netplugin::PluginProxy {
    fn drain(&self, deadline: Instant) -> bool {
        crate::netplugin::PluginProxy::drain(self, deadline)
    }
    fn halt(&self) {
        crate::netplugin::PluginProxy::halt(self)
    }
    fn stop(&mut self) {
        crate::netplugin::PluginProxy::stop(self)
    }
}

/// Maps `len` bytes of the shm file `name` (created when `create`) read-write.
pub(crate) fn shm_map(name: &CString, len: usize, create: bool) -> Result<usize> {
    let flags = if create {
        libc::O_RDWR | libc::O_CREAT | libc::O_EXCL
    } else {
        libc::O_RDWR
    };
    let show = name.to_string_lossy();
    // SAFETY: NUL-terminated name; plain flags.
    let fd = unsafe { libc::shm_open(name.as_ptr(), flags, 0o600) };
    if fd < 0 {
        return Err(Error::system(format!(
            "shm_open(/dev/shm{show}): {}",
            std::io::Error::last_os_error()
        )));
    }
    let r = (|| {
        if create {
            // SAFETY: fd is ours; reserves the blocks so a full /dev/shm fails
            // here, not with SIGBUS on first touch.
            let e = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
            if e != 0 {
                return Err(Error::system(format!(
                    "cannot reserve {len} bytes in /dev/shm for the GPU ring's host window ({}): \
                     /dev/shm is too small (containers: --shm-size or --ipc=host)",
                    std::io::Error::from_raw_os_error(e)
                )));
            }
        }
        // SAFETY: maps a file we hold open; len is its size.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::system(format!(
                "mmap of /dev/shm{show} ({len} bytes): {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(p as usize)
    })();
    // SAFETY: fd is ours; the mapping (if any) stays valid after close.
    unsafe { libc::close(fd) };
    if r.is_err() && create {
        // SAFETY: NUL-terminated name of the file we created.
        unsafe { libc::shm_unlink(name.as_ptr()) };
    }
    r
}

/// `len` bytes of zeroed anonymous memory.
fn anon_map(len: usize) -> Result<usize> {
    // SAFETY: a fresh private anonymous mapping; no file, no fixed address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::system(format!(
            "mmap of {len} bytes for the GPU network path's window: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(p as usize)
}

/// Registers host memory with CUDA (portable, device-mapped); its device address.
pub(crate) fn host_register(addr: usize, len: usize) -> Result<u64> {
    guarded("cuMemHostRegister", || {
        // SAFETY: [addr, addr+len) is a live mapping we own; registered once
        // in this process (peers in this process use the owner's address).
        unsafe {
            cu::mem_host_register(
                addr as *mut c_void,
                len,
                cu::CU_MEMHOSTREGISTER_PORTABLE | cu::CU_MEMHOSTREGISTER_DEVICEMAP,
            )?;
            match cu::mem_host_device_pointer(addr as *mut c_void) {
                Ok(d) => Ok(d),
                Err(e) => {
                    let _ = cu::mem_host_unregister(addr as *mut c_void);
                    Err(e.into())
                }
            }
        }
    })
}
