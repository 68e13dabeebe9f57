//! NCCL's plugins for oxccl: the `ncclNet` ABI (versions 6 to 12) behind a
//! Rust trait, the loader that finds a plugin the way NCCL does, the choice
//! of network for peers on other hosts, and NCCL's tuner plugins.
//!
//! * [`ffi`]: the C tables and property structs of each ABI version.
//! * [`loader`]: `dlopen` by `NCCL_NET_PLUGIN`'s rules, the newest
//!   `ncclNetPlugin_vN` symbol the library exports, `init` with a logger that
//!   routes the plugin's lines into oxccl's `NCCL_DEBUG` log, and
//!   [`loader::Plugin`], which implements [`Net`] for every version.
//! * [`mod@choose`]: `NCCL_NET`, `NCCL_IB_DISABLE`, `NCCL_IB_HCA`, the device
//!   picked, and the INFO/WARN lines that say what was chosen and why; any
//!   failure falls back to oxccl's own sockets.
//! * [`tuner`]: `NCCL_TUNER_PLUGIN`, `ncclTunerPlugin_v6` down to `_v2`, a
//!   context per communicator and `getCollInfo` over oxccl's cost table.
//! * [`profiler`]: `NCCL_PROFILER_PLUGIN`, `ncclProfiler_v6` down to `_v1`, a
//!   context per communicator and its events.
//!
//! Why a crate of its own: the host executor (`oxccl-host`) uses plugins for
//! host buffers now and the CUDA executor's proxy will use the same loader
//! for device buffers; neither should depend on the other. The crate also
//! holds the only C in the workspace (the variadic logger shim, see
//! `build.rs`) and its `unsafe` (every call into the plugin) stays here
//! behind a safe interface.
//!
//! The data path ([`Net::isend`], [`Net::irecv`]) stays `unsafe`: the plugin
//! reads or writes the buffer asynchronously until the request completes,
//! which no borrow can express. Everything else is safe to call.

use std::fmt;

use oxccl_core::Result;

pub mod choose;
pub mod ffi;
pub mod loader;
pub mod profiler;
pub mod profiler_group;
pub mod testing;
pub mod tuner;

pub use choose::{choose, library_candidates, usable_devices, HcaSpec, NetSettings, Network};
pub use loader::{load, LoadOutcome, Plugin, Version};

/// The opaque connection handle (`NCCL_NET_HANDLE_MAXSIZE` bytes) that
/// `listen` fills and the peer's `connect` reads.
pub type Handle = [u8; ffi::NCCL_NET_HANDLE_MAXSIZE];

macro_rules! opaque {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug)]
        pub struct $name(std::ptr::NonNull<std::ffi::c_void>);

        // SAFETY: NCCL uses a plugin's objects from a thread other than the
        // one that made them (its proxy thread), so plugins must allow it;
        // this handle is not `Sync`, so calls on one object never overlap.
        unsafe impl Send for $name {}

        impl $name {
            /// The plugin's pointer.
            pub fn as_ptr(&self) -> *mut std::ffi::c_void {
                self.0.as_ptr()
            }
            /// Wraps a pointer a plugin returned (None for NULL).
            pub fn from_raw(p: *mut std::ffi::c_void) -> Option<$name> {
                std::ptr::NonNull::new(p).map($name)
            }
        }
    };
}

opaque!(
    /// A listening object (`listenComm`).
    ListenComm
);
opaque!(
    /// The sending end of a connection (`sendComm`).
    SendComm
);
opaque!(
    /// The receiving end of a connection (`recvComm`).
    RecvComm
);
opaque!(
    /// A memory registration (`mhandle`).
    MrHandle
);
opaque!(
    /// An outstanding `isend` or `irecv` (`request`); the plugin frees it
    /// when `test` reports it done.
    Request
);

/// Which end of a connection a registration belongs to.
#[derive(Debug, Clone, Copy)]
pub enum CommRef<'a> {
    Send(&'a SendComm),
    Recv(&'a RecvComm),
}

impl CommRef<'_> {
    fn as_ptr(self) -> *mut std::ffi::c_void {
        match self {
            CommRef::Send(c) => c.as_ptr(),
            CommRef::Recv(c) => c.as_ptr(),
        }
    }
}

/// The outcome of [`Net::test`].
#[derive(Debug)]
pub enum Poll {
    /// Complete: bytes sent or received. The request is gone.
    Done(usize),
    /// Still in flight: test it again later.
    Pending(Request),
}

/// A device's properties, the same whatever the ABI version (fields a
/// version lacks take the value NCCL assumes for it).
#[derive(Debug, Clone, PartialEq)]
pub struct Properties {
    pub name: String,
    pub pci_path: Option<String>,
    pub guid: u64,
    /// `NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF` bits.
    pub ptr_support: i32,
    pub speed_mbps: i32,
    pub port: i32,
    pub latency_us: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    /// Largest single transfer (v9+; before: NCCL's 1 GiB default).
    pub max_p2p_bytes: usize,
    /// The device needs a flush after every receive into GPU memory
    /// (`forceFlush`, v9+; before: false).
    pub force_flush: bool,
}

impl Properties {
    /// Whether the device can send from and receive into host memory.
    pub fn supports_host(&self) -> bool {
        self.ptr_support & ffi::NCCL_PTR_HOST != 0
    }
    /// Whether the device can send from and receive into GPU memory
    /// (GPUDirect RDMA, `NCCL_PTR_CUDA`).
    pub fn supports_cuda(&self) -> bool {
        self.ptr_support & ffi::NCCL_PTR_CUDA != 0
    }
    /// Whether the device registers GPU memory from a DMA-BUF file
    /// descriptor (`NCCL_PTR_DMABUF`).
    pub fn supports_dmabuf(&self) -> bool {
        self.ptr_support & ffi::NCCL_PTR_DMABUF != 0
    }
}

/// GPU memory to register with [`Net::reg_mr_device`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceMemory {
    /// By address (`regMr` with `NCCL_PTR_CUDA`).
    Address,
    /// Through a DMA-BUF file descriptor of the range (`regMrDmaBuf`):
    /// `offset` is where the range starts in the exported buffer.
    DmaBuf { fd: i32, offset: u64 },
}

/// An error a plugin call returned: which call, and its `ncclResult_t`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub call: &'static str,
    pub code: i32,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} returned {} ({})",
            self.call,
            self.code,
            ffi::result_name(self.code)
        )
    }
}

/// A network: NCCL's `ncclNet` operations, whatever the plugin's ABI version.
///
/// Connection setup never blocks: `connect` and `accept` return `None` until
/// the connection is established and are called again. Requests complete in
/// any order the plugin likes; `test` drives them.
pub trait Net: Send + Sync {
    /// The network's name as the plugin gives it ("IB", "Socket", ...).
    fn name(&self) -> &str;
    /// Number of devices (NICs).
    fn devices(&self) -> Result<usize>;
    /// Properties of device `dev`.
    fn properties(&self, dev: usize) -> Result<Properties>;
    /// A listening object on `dev` and the handle a peer connects to.
    fn listen(&self, dev: usize) -> Result<(Handle, ListenComm)>;
    /// Connects from `dev` to a peer's handle; `None`: not yet, call again
    /// with the same handle (plugins keep connection state in it).
    fn connect(&self, dev: usize, handle: &mut Handle) -> Result<Option<SendComm>>;
    /// Accepts the connection made to `listen`'s handle; `None`: not yet.
    fn accept(&self, listen: &ListenComm) -> Result<Option<RecvComm>>;
    /// Registers host memory for transfers on `comm`.
    ///
    /// # Safety
    /// `data` must stay valid for `len` bytes until [`Net::dereg_mr`].
    unsafe fn reg_mr(&self, comm: CommRef<'_>, data: *mut u8, len: usize) -> Result<MrHandle>;
    /// Registers GPU memory for transfers on `comm` (GPUDirect RDMA). A
    /// network without it answers with an error.
    ///
    /// # Safety
    /// `data` must be device memory valid for `len` bytes until
    /// [`Net::dereg_mr`]; a DMA-BUF descriptor must describe that range.
    unsafe fn reg_mr_device(
        &self,
        comm: CommRef<'_>,
        data: *mut u8,
        len: usize,
        how: DeviceMemory,
    ) -> Result<MrHandle> {
        let _ = (comm, data, len, how);
        Err(oxccl_core::Error::internal(format!(
            "NET/{}: no GPU memory registration",
            self.name()
        )))
    }
    /// Whether the plugin exports `iflush`.
    fn has_iflush(&self) -> bool {
        false
    }
    /// Starts a flush of a completed receive into GPU memory (`iflush`),
    /// so the GPU reads what the NIC wrote; `None`: nothing to wait for
    /// (the plugin has no flush, or needed none).
    ///
    /// # Safety
    /// `data..data+len` is a completed receive's buffer, registered as `mr`.
    unsafe fn iflush(
        &self,
        comm: &RecvComm,
        data: *mut u8,
        len: usize,
        mr: &MrHandle,
    ) -> Result<Option<Request>> {
        let _ = (comm, data, len, mr);
        Ok(None)
    }
    /// Releases a registration.
    fn dereg_mr(&self, comm: CommRef<'_>, mr: MrHandle) -> Result<()>;
    /// Starts sending `len` bytes at `data`; `None`: the plugin cannot take
    /// it now (no credit), try again later.
    ///
    /// # Safety
    /// `data..data+len` lies in the memory registered as `mr` and is neither
    /// written nor freed until the request completes or `comm` is closed.
    unsafe fn isend(
        &self,
        comm: &SendComm,
        data: *const u8,
        len: usize,
        tag: i32,
        mr: &MrHandle,
    ) -> Result<Option<Request>>;
    /// Posts a receive of at most `len` bytes into `data`; `None`: not now.
    ///
    /// # Safety
    /// `data..data+len` lies in the memory registered as `mr` and is neither
    /// read, written nor freed until the request completes or `comm` is closed.
    unsafe fn irecv(
        &self,
        comm: &RecvComm,
        data: *mut u8,
        len: usize,
        tag: i32,
        mr: &MrHandle,
    ) -> Result<Option<Request>>;
    /// Tests a request: `Done(bytes)` or the request back.
    fn test(&self, req: Request) -> Result<Poll>;
    /// Closes a sending end (outstanding requests die with it).
    fn close_send(&self, comm: SendComm) -> Result<()>;
    /// Closes a receiving end (outstanding requests die with it).
    fn close_recv(&self, comm: RecvComm) -> Result<()>;
    /// Closes a listening object.
    fn close_listen(&self, comm: ListenComm) -> Result<()>;
}
