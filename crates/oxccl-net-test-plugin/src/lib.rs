//! `libnccl-net-oxtest`: a network plugin for NCCL's `ncclNet` ABI over
//! plain TCP, written the way a third party would (its own copies of the C
//! layouts, only libc), so that oxccl's loader and plugin transport are
//! proven end to end on machines without InfiniBand.
//!
//! Exports `ncclNetPlugin_v12` down to `_v8` (feature `only-v8`: v8 only;
//! `only-v11`: v11 only). From v11 on, `init` returns a context that
//! `listen` and `connect` must be given back: they fail on any other.
//!
//! * Devices: the IPv4 interfaces that are up other than loopback, or
//!   loopback when there is no other (as NCCL's socket network picks).
//!   Properties say host memory only (`NCCL_PTR_HOST`), one receive per
//!   `irecv`, no PCI path.
//! * `listen` binds a non-blocking listener on the device's address; the
//!   handle carries a magic, the address and the port. `connect` returns
//!   NULL on its first call for a handle (so callers' retry loops are
//!   exercised) and connects on the next; `accept` returns NULL until the
//!   connection is there.
//! * Messages are framed on the stream: 16 bytes (`u64` length, `u32` tag,
//!   `u32` magic) then the payload. `isend`/`irecv` queue requests on their
//!   connection; `test` moves bytes with non-blocking reads and writes and
//!   completes requests in order. A send completes once the kernel took all
//!   of it; a receive once all of it arrived. A message longer than the
//!   posted receive or with another tag is an error, as is a connection
//!   closed or reset under a request.
//! * Registrations record the range; `isend`/`irecv` outside it fail, so a
//!   caller passing the wrong `mhandle` is caught.
//!
//! Test switches (environment, read by `init`): `OXTEST_NET_NAME` (the
//! network's name, default `oxtest`; `IB` makes oxccl apply `NCCL_IB_*`),
//! `OXTEST_NET_FAIL_INIT=1` (`init` logs a WARN and fails),
//! `OXTEST_NET_PTR` (`cuda` or `cuda,dmabuf`: the devices also declare
//! `NCCL_PTR_CUDA`, and `NCCL_PTR_DMABUF`), `OXTEST_NET_FORCE_FLUSH=1`
//! (v9+ properties say `forceFlush`), `OXTEST_NET_DEVICES=N` (N devices
//! `oxnic0`..`oxnicN-1`, 1 to 32, all on the first interface's address,
//! each with a PCI path of its own under `/sys/devices/pci0000:f0`, which
//! names no real device: several NICs on a machine with one),
//! `OXTEST_NET_TRACE` (also: every connection logs at close the device it
//! was made on, its tag and the bytes and messages it carried, as
//! `send closed: device D 'NAME' tag T: B bytes in M messages`).
//!
//! GPU memory (`OXTEST_NET_PTR`): `regMr` with `NCCL_PTR_CUDA` and
//! `regMrDmaBuf` check, through libcuda (loaded at run time), that the range
//! is device memory (and that the descriptor is open); a send from GPU
//! memory copies it out on a non-blocking stream of the caller's current
//! context when posted, a receive into GPU memory copies in when the bytes
//! are there: what a NIC's DMA would do, so the caller hands over GPU
//! memory and never stages it. `iflush` completes at once and is counted.
//! When a connection closes it logs (INFO) the bytes it moved from and into
//! GPU memory, its flushes and registrations, for tests to check.

#![allow(non_upper_case_globals)]
// The one-version builds leave the other versions' entries unused.
#![cfg_attr(any(feature = "only-v8", feature = "only-v11"), allow(dead_code))]

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_ulong, c_void, CString};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

type R = c_int;
const OK: R = 0;
const SYSTEM_ERROR: R = 2;
const INTERNAL_ERROR: R = 3;
const INVALID_ARGUMENT: R = 4;
const PTR_HOST: c_int = 1;
const PTR_CUDA: c_int = 2;
const PTR_DMABUF: c_int = 4;
const LOG_WARN: c_int = 2;
const LOG_INFO: c_int = 3;
const SUBSYS_INIT: c_ulong = 0x1;
const SUBSYS_NET: c_ulong = 0x10;
const HANDLE_MAGIC: &[u8; 4] = b"OXNT";
const FRAME_MAGIC: u32 = 0x4f58_4652;
/// NCCL's limit on outstanding requests per connection.
const MAX_REQUESTS: usize = 32;

type Logger = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);
type Vp = *mut c_void;
type Vpp = *mut *mut c_void;
type RegMrDmaBuf = unsafe extern "C" fn(Vp, Vp, usize, c_int, u64, c_int, Vpp) -> R;
type IFlush = unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, Vpp, Vpp) -> R;

// ------------------------------------------------------------------ layouts

#[repr(C)]
struct PropsV8 {
    name: *mut c_char,
    pci_path: *mut c_char,
    guid: u64,
    ptr_support: c_int,
    reg_is_global: c_int,
    speed: c_int,
    port: c_int,
    latency: f32,
    max_comms: c_int,
    max_recvs: c_int,
    net_device_type: c_int,
    net_device_version: c_int,
}

#[repr(C)]
struct PropsV9 {
    name: *mut c_char,
    pci_path: *mut c_char,
    guid: u64,
    ptr_support: c_int,
    reg_is_global: c_int,
    force_flush: c_int,
    speed: c_int,
    port: c_int,
    latency: f32,
    max_comms: c_int,
    max_recvs: c_int,
    net_device_type: c_int,
    net_device_version: c_int,
    vdev_ndevs: c_int,
    vdev_devs: [c_int; 4],
    max_p2p_bytes: usize,
    max_coll_bytes: usize,
}

#[repr(C)]
pub struct NetV8 {
    name: *const c_char,
    init: unsafe extern "C" fn(Logger) -> R,
    devices: unsafe extern "C" fn(*mut c_int) -> R,
    get_properties: unsafe extern "C" fn(c_int, *mut PropsV8) -> R,
    listen: unsafe extern "C" fn(c_int, Vp, Vpp) -> R,
    connect: unsafe extern "C" fn(c_int, Vp, Vpp, Vpp) -> R,
    accept: unsafe extern "C" fn(Vp, Vpp, Vpp) -> R,
    reg_mr: unsafe extern "C" fn(Vp, Vp, usize, c_int, Vpp) -> R,
    reg_mr_dma_buf: Option<RegMrDmaBuf>,
    dereg_mr: unsafe extern "C" fn(Vp, Vp) -> R,
    isend: unsafe extern "C" fn(Vp, Vp, c_int, c_int, Vp, Vpp) -> R,
    irecv: unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, *mut c_int, Vpp, Vpp) -> R,
    iflush: Option<IFlush>,
    test: unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> R,
    close_send: unsafe extern "C" fn(Vp) -> R,
    close_recv: unsafe extern "C" fn(Vp) -> R,
    close_listen: unsafe extern "C" fn(Vp) -> R,
    get_device_mr: Option<unsafe extern "C" fn()>,
    irecv_consumed: Option<unsafe extern "C" fn()>,
}

#[repr(C)]
pub struct NetV9 {
    name: *const c_char,
    init: unsafe extern "C" fn(Logger) -> R,
    devices: unsafe extern "C" fn(*mut c_int) -> R,
    get_properties: unsafe extern "C" fn(c_int, *mut PropsV9) -> R,
    listen: unsafe extern "C" fn(c_int, Vp, Vpp) -> R,
    connect: unsafe extern "C" fn(c_int, Vp, Vpp, Vpp) -> R,
    accept: unsafe extern "C" fn(Vp, Vpp, Vpp) -> R,
    reg_mr: unsafe extern "C" fn(Vp, Vp, usize, c_int, Vpp) -> R,
    reg_mr_dma_buf: Option<RegMrDmaBuf>,
    dereg_mr: unsafe extern "C" fn(Vp, Vp) -> R,
    isend: unsafe extern "C" fn(Vp, Vp, usize, c_int, Vp, Vpp) -> R,
    irecv: unsafe extern "C" fn(Vp, c_int, Vpp, *mut usize, *mut c_int, Vpp, Vpp) -> R,
    iflush: Option<IFlush>,
    test: unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> R,
    close_send: unsafe extern "C" fn(Vp) -> R,
    close_recv: unsafe extern "C" fn(Vp) -> R,
    close_listen: unsafe extern "C" fn(Vp) -> R,
    get_device_mr: Option<unsafe extern "C" fn()>,
    irecv_consumed: Option<unsafe extern "C" fn()>,
    make_vdevice: Option<unsafe extern "C" fn()>,
}

#[repr(C)]
pub struct NetV10 {
    name: *const c_char,
    init: unsafe extern "C" fn(Logger, Vp) -> R,
    devices: unsafe extern "C" fn(*mut c_int) -> R,
    get_properties: unsafe extern "C" fn(c_int, *mut PropsV9) -> R,
    listen: unsafe extern "C" fn(c_int, Vp, Vpp) -> R,
    connect: unsafe extern "C" fn(c_int, Vp, Vp, Vpp, Vpp) -> R,
    accept: unsafe extern "C" fn(Vp, Vpp, Vpp) -> R,
    reg_mr: unsafe extern "C" fn(Vp, Vp, usize, c_int, Vpp) -> R,
    reg_mr_dma_buf: Option<RegMrDmaBuf>,
    dereg_mr: unsafe extern "C" fn(Vp, Vp) -> R,
    isend: unsafe extern "C" fn(Vp, Vp, usize, c_int, Vp, Vp, Vpp) -> R,
    irecv: unsafe extern "C" fn(Vp, c_int, Vpp, *mut usize, *mut c_int, Vpp, Vpp, Vpp) -> R,
    iflush: Option<IFlush>,
    test: unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> R,
    close_send: unsafe extern "C" fn(Vp) -> R,
    close_recv: unsafe extern "C" fn(Vp) -> R,
    close_listen: unsafe extern "C" fn(Vp) -> R,
    get_device_mr: Option<unsafe extern "C" fn()>,
    irecv_consumed: Option<unsafe extern "C" fn()>,
    make_vdevice: Option<unsafe extern "C" fn()>,
}

#[repr(C)]
pub struct PropsV12 {
    v9: PropsV9Head,
    vdev_ndevs: c_int,
    vdev_devs: [c_int; 8],
    max_p2p_bytes: usize,
    max_coll_bytes: usize,
    max_multi_request_size: c_int,
    rail_id: i16,
    plane_id: i16,
}

/// The fields every property struct from v9 on starts with.
#[repr(C)]
pub struct PropsV9Head {
    name: *mut c_char,
    pci_path: *mut c_char,
    guid: u64,
    ptr_support: c_int,
    reg_is_global: c_int,
    force_flush: c_int,
    speed: c_int,
    port: c_int,
    latency: f32,
    max_comms: c_int,
    max_recvs: c_int,
    net_device_type: c_int,
    net_device_version: c_int,
}

#[repr(C)]
pub struct PropsV11 {
    v9: PropsV9Head,
    vdev_ndevs: c_int,
    vdev_devs: [c_int; 4],
    max_p2p_bytes: usize,
    max_coll_bytes: usize,
    max_multi_request_size: c_int,
}

/// `ncclNet_v11_t` and `ncclNet_v12_t` (they differ in `P`, the properties).
#[repr(C)]
pub struct NetCtx<P> {
    name: *const c_char,
    init: unsafe extern "C" fn(Vpp, u64, Vp, Logger, Vp) -> R,
    devices: unsafe extern "C" fn(*mut c_int) -> R,
    get_properties: unsafe extern "C" fn(c_int, *mut P) -> R,
    listen: unsafe extern "C" fn(Vp, c_int, Vp, Vpp) -> R,
    connect: unsafe extern "C" fn(Vp, c_int, Vp, Vpp, Vpp) -> R,
    accept: unsafe extern "C" fn(Vp, Vpp, Vpp) -> R,
    reg_mr: unsafe extern "C" fn(Vp, Vp, usize, c_int, Vpp) -> R,
    reg_mr_dma_buf: Option<RegMrDmaBuf>,
    dereg_mr: unsafe extern "C" fn(Vp, Vp) -> R,
    isend: unsafe extern "C" fn(Vp, Vp, usize, c_int, Vp, Vp, Vpp) -> R,
    irecv: unsafe extern "C" fn(Vp, c_int, Vpp, *mut usize, *mut c_int, Vpp, Vpp, Vpp) -> R,
    iflush: Option<IFlush>,
    test: unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> R,
    close_send: unsafe extern "C" fn(Vp) -> R,
    close_recv: unsafe extern "C" fn(Vp) -> R,
    close_listen: unsafe extern "C" fn(Vp) -> R,
    get_device_mr: Option<unsafe extern "C" fn()>,
    irecv_consumed: Option<unsafe extern "C" fn()>,
    make_vdevice: Option<unsafe extern "C" fn()>,
    finalize: unsafe extern "C" fn(Vp) -> R,
    set_net_attr: Option<unsafe extern "C" fn()>,
}

// SAFETY: the tables are never written; their pointers are to statics.
unsafe impl<P> Sync for NetCtx<P> {}
// SAFETY: as above.
unsafe impl Sync for NetV8 {}
// SAFETY: as above.
unsafe impl Sync for NetV9 {}
// SAFETY: as above.
unsafe impl Sync for NetV10 {}

/// The network's name: written once by `init` (before the caller reads the
/// name for use), read through the tables' `name` pointer.
struct NameBuf(UnsafeCell<[u8; 32]>);
// SAFETY: written only in `init`, which callers run once before anything else.
unsafe impl Sync for NameBuf {}
static NAME: NameBuf = NameBuf(UnsafeCell::new(
    *b"oxtest\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
));

#[cfg(not(feature = "only-v11"))]
#[no_mangle]
pub static ncclNetPlugin_v8: NetV8 = NetV8 {
    name: NAME.0.get() as *const c_char,
    init: init_v8,
    devices,
    get_properties: get_properties_v8,
    listen,
    connect: connect_v8,
    accept,
    reg_mr,
    reg_mr_dma_buf: Some(reg_mr_dma_buf),
    dereg_mr,
    isend: isend_v8,
    irecv: irecv_v8,
    iflush: Some(iflush),
    test,
    close_send,
    close_recv,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
};

#[cfg(not(any(feature = "only-v8", feature = "only-v11")))]
#[no_mangle]
pub static ncclNetPlugin_v9: NetV9 = NetV9 {
    name: NAME.0.get() as *const c_char,
    init: init_v8,
    devices,
    get_properties: get_properties_v9,
    listen,
    connect: connect_v8,
    accept,
    reg_mr,
    reg_mr_dma_buf: Some(reg_mr_dma_buf),
    dereg_mr,
    isend: isend_v9,
    irecv: irecv_v9,
    iflush: Some(iflush),
    test,
    close_send,
    close_recv,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_vdevice: None,
};

#[cfg(not(any(feature = "only-v8", feature = "only-v11")))]
#[no_mangle]
pub static ncclNetPlugin_v10: NetV10 = NetV10 {
    name: NAME.0.get() as *const c_char,
    init: init_v10,
    devices,
    get_properties: get_properties_v9,
    listen,
    connect: connect_v10,
    accept,
    reg_mr,
    reg_mr_dma_buf: Some(reg_mr_dma_buf),
    dereg_mr,
    isend: isend_v10,
    irecv: irecv_v10,
    iflush: Some(iflush),
    test,
    close_send,
    close_recv,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_vdevice: None,
};

#[cfg(not(feature = "only-v8"))]
#[no_mangle]
pub static ncclNetPlugin_v11: NetCtx<PropsV11> = NetCtx {
    name: NAME.0.get() as *const c_char,
    init: init_v11,
    devices,
    get_properties: get_properties_v11,
    listen: listen_v11,
    connect: connect_v11,
    accept,
    reg_mr,
    reg_mr_dma_buf: Some(reg_mr_dma_buf),
    dereg_mr,
    isend: isend_v10,
    irecv: irecv_v10,
    iflush: Some(iflush),
    test,
    close_send,
    close_recv,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_vdevice: None,
    finalize,
    set_net_attr: None,
};

#[cfg(not(any(feature = "only-v8", feature = "only-v11")))]
#[no_mangle]
pub static ncclNetPlugin_v12: NetCtx<PropsV12> = NetCtx {
    name: NAME.0.get() as *const c_char,
    init: init_v11,
    devices,
    get_properties: get_properties_v12,
    listen: listen_v11,
    connect: connect_v11,
    accept,
    reg_mr,
    reg_mr_dma_buf: Some(reg_mr_dma_buf),
    dereg_mr,
    isend: isend_v10,
    irecv: irecv_v10,
    iflush: Some(iflush),
    test,
    close_send,
    close_recv,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_vdevice: None,
    finalize,
    set_net_attr: None,
};

// ------------------------------------------------------------------ state

struct Dev {
    name: CString,
    addr: Ipv4Addr,
    /// A sysfs PCI path (`OXTEST_NET_DEVICES`), or none.
    pci_path: Option<CString>,
}

static DEVS: OnceLock<Vec<Dev>> = OnceLock::new();
static LOGGER: OnceLock<usize> = OnceLock::new();

/// Logs one line through the caller's logger (a C format with one `%s`).
fn log(level: c_int, text: &str) {
    let Some(&f) = LOGGER.get() else { return };
    // SAFETY: stored from the `Logger` that init received.
    let f: Logger = unsafe { std::mem::transmute::<usize, Logger>(f) };
    let msg = CString::new(text.replace('\0', " ")).unwrap_or_default();
    let file = c"oxtest/lib.rs";
    // SAFETY: a printf-style call with one %s and a matching C string.
    unsafe {
        f(
            level,
            SUBSYS_NET | SUBSYS_INIT,
            file.as_ptr(),
            line!() as c_int,
            c"NET/oxtest: %s".as_ptr(),
            msg.as_ptr(),
        )
    };
}

static PTR_SUPPORT: AtomicI32 = AtomicI32::new(PTR_HOST);
static FORCE_FLUSH: AtomicBool = AtomicBool::new(false);

fn ptr_support() -> c_int {
    PTR_SUPPORT.load(Ordering::Relaxed)
}

/// The few libcuda entries GPU memory needs, loaded on first use.
struct Cuda {
    pointer_get_attribute: unsafe extern "C" fn(Vp, c_int, u64) -> c_int,
    stream_create: unsafe extern "C" fn(Vpp, u32) -> c_int,
    stream_destroy: unsafe extern "C" fn(Vp) -> c_int,
    stream_synchronize: unsafe extern "C" fn(Vp) -> c_int,
    memcpy_dtoh_async: unsafe extern "C" fn(Vp, u64, usize, Vp) -> c_int,
    memcpy_htod_async: unsafe extern "C" fn(u64, *const c_void, usize, Vp) -> c_int,
    mem_host_alloc: unsafe extern "C" fn(Vpp, usize, u32) -> c_int,
    mem_free_host: unsafe extern "C" fn(Vp) -> c_int,
}

fn cuda() -> Option<&'static Cuda> {
    static CUDA: OnceLock<Option<Cuda>> = OnceLock::new();
    CUDA.get_or_init(|| {
        // SAFETY: dlopen/dlsym with NUL-terminated names; each symbol is
        // cast to its documented C signature.
        unsafe {
            let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
            if h.is_null() {
                return None;
            }
            macro_rules! sym {
                ($n:literal, $t:ty) => {{
                    let p = libc::dlsym(h, $n.as_ptr());
                    if p.is_null() {
                        return None;
                    }
                    std::mem::transmute::<*mut c_void, $t>(p)
                }};
            }
            type Attr = unsafe extern "C" fn(Vp, c_int, u64) -> c_int;
            type Create = unsafe extern "C" fn(Vpp, u32) -> c_int;
            type OnStream = unsafe extern "C" fn(Vp) -> c_int;
            type DtoH = unsafe extern "C" fn(Vp, u64, usize, Vp) -> c_int;
            type HtoD = unsafe extern "C" fn(u64, *const c_void, usize, Vp) -> c_int;
            type HostAlloc = unsafe extern "C" fn(Vpp, usize, u32) -> c_int;
            Some(Cuda {
                pointer_get_attribute: sym!(c"cuPointerGetAttribute", Attr),
                stream_create: sym!(c"cuStreamCreate", Create),
                stream_destroy: sym!(c"cuStreamDestroy_v2", OnStream),
                stream_synchronize: sym!(c"cuStreamSynchronize", OnStream),
                memcpy_dtoh_async: sym!(c"cuMemcpyDtoHAsync_v2", DtoH),
                memcpy_htod_async: sym!(c"cuMemcpyHtoDAsync_v2", HtoD),
                mem_host_alloc: sym!(c"cuMemHostAlloc", HostAlloc),
                mem_free_host: sym!(c"cuMemFreeHost", OnStream),
            })
        }
    })
    .as_ref()
}

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` and `CU_MEMORYTYPE_DEVICE`.
const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
const CU_MEMORYTYPE_DEVICE: u32 = 2;

/// Both ends of the range are device memory.
fn check_device_range(p: u64, size: usize) -> Result<(), String> {
    let cu = cuda().ok_or("libcuda.so.1 could not be loaded")?;
    for a in [p, p + size.saturating_sub(1) as u64] {
        let mut t: u32 = 0;
        // SAFETY: writes one unsigned int.
        let rc = unsafe {
            (cu.pointer_get_attribute)(
                (&mut t as *mut u32).cast(),
                CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                a,
            )
        };
        if rc != 0 || t != CU_MEMORYTYPE_DEVICE {
            return Err(format!(
                "{a:#x} is not device memory (cuPointerGetAttribute {rc}, type {t})"
            ));
        }
    }
    Ok(())
}

/// A pinned host buffer of `len` bytes (at least one), the NIC-side copy
/// of a GPU-memory registration. Made when the memory is registered, before
/// the caller's kernels run: allocating pinned memory while they run can
/// wait for them to finish, and a kernel waiting for this very transfer
/// never does.
fn alloc_pinned(len: usize) -> Result<Pinned, String> {
    let cu = cuda().ok_or("libcuda.so.1 could not be loaded")?;
    let len = len.max(1);
    let mut p: Vp = std::ptr::null_mut();
    // SAFETY: writes one pointer; flags 0.
    let rc = unsafe { (cu.mem_host_alloc)(&mut p, len, 0) };
    if rc != 0 {
        return Err(format!("cuMemHostAlloc of {len} bytes returned {rc}"));
    }
    Ok(Pinned { ptr: p.cast() })
}

/// Copies `size` bytes between GPU memory at `dev` and `host`, into the
/// GPU when `to_gpu`, on the connection's non-blocking stream (never the
/// legacy stream, which would wait for the caller's running kernels).
fn gpu_copy(
    c: &mut Conn,
    to_gpu: bool,
    dev: u64,
    host: *mut u8,
    size: usize,
) -> Result<(), String> {
    let cu = cuda().ok_or("libcuda.so.1 could not be loaded")?;
    if std::env::var("OXTEST_NET_TRACE").is_ok() {
        log(
            LOG_INFO,
            &format!(
                "copy of {size} bytes {} starts",
                if to_gpu { "in" } else { "out" }
            ),
        );
    }
    if c.stream == 0 {
        let mut s: Vp = std::ptr::null_mut();
        // SAFETY: writes one stream; CU_STREAM_NON_BLOCKING is 1.
        let rc = unsafe { (cu.stream_create)(&mut s, 1) };
        if rc != 0 {
            return Err(format!(
                "cuStreamCreate returned {rc} (no current context in the caller's thread?)"
            ));
        }
        c.stream = s as usize;
    }
    let s = c.stream as Vp;
    let t0 = std::time::Instant::now();
    // SAFETY: `host` holds `size` bytes; `dev` is registered device memory
    // the caller keeps valid; the synchronize ends the copy before return.
    let rc = unsafe {
        let r = if to_gpu {
            (cu.memcpy_htod_async)(dev, host as *const c_void, size, s)
        } else {
            (cu.memcpy_dtoh_async)(host.cast(), dev, size, s)
        };
        if r != 0 {
            r
        } else {
            (cu.stream_synchronize)(s)
        }
    };
    if rc != 0 {
        return Err(format!("GPU copy of {size} bytes returned {rc}"));
    }
    static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let k = COPIES.fetch_add(1, Ordering::Relaxed);
    let dt = t0.elapsed();
    if std::env::var("OXTEST_NET_TRACE").is_ok() && (dt.as_millis() > 50 || k % 256 == 0) {
        log(
            LOG_INFO,
            &format!(
                "copy {k}: {size} bytes {} in {dt:?}",
                if to_gpu { "in" } else { "out" }
            ),
        );
    }
    Ok(())
}

fn interfaces() -> Vec<Dev> {
    let mut out: Vec<Dev> = Vec::new();
    let mut lo: Vec<Dev> = Vec::new();
    let mut ifa: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free below.
    if unsafe { libc::getifaddrs(&mut ifa) } != 0 {
        return out;
    }
    let mut p = ifa;
    while !p.is_null() {
        // SAFETY: p walks the list getifaddrs returned.
        let a = unsafe { &*p };
        p = a.ifa_next;
        if a.ifa_addr.is_null() || a.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-NULL and points at a sockaddr.
        if c_int::from(unsafe { (*a.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(a.ifa_addr as *const libc::sockaddr_in) };
        let addr = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        // SAFETY: ifa_name is a NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr(a.ifa_name) }.to_owned();
        let d = Dev {
            name,
            addr,
            pci_path: None,
        };
        if a.ifa_flags & libc::IFF_LOOPBACK as u32 != 0 {
            lo.push(d);
        } else {
            out.push(d);
        }
    }
    // SAFETY: the list from getifaddrs above.
    unsafe { libc::freeifaddrs(ifa) };
    if out.is_empty() {
        out.extend(lo);
    }
    out
}

/// The devices: the interfaces, or `OXTEST_NET_DEVICES` copies of the first.
fn device_list() -> Vec<Dev> {
    let ifs = interfaces();
    let n = std::env::var("OXTEST_NET_DEVICES")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| (1..=32).contains(n));
    match (n, ifs.first()) {
        (Some(n), Some(first)) => (0..n)
            .map(|i| Dev {
                name: CString::new(format!("oxnic{i}")).unwrap_or_default(),
                addr: first.addr,
                pci_path: CString::new(format!(
                    "/sys/devices/pci0000:f0/0000:f0:{i:02x}.0/0000:{:02x}:00.0",
                    0xf1 + i
                ))
                .ok(),
            })
            .collect(),
        _ => ifs,
    }
}

fn devs() -> &'static [Dev] {
    DEVS.get_or_init(device_list)
}

fn pci_path_ptr(dv: &Dev) -> *mut c_char {
    dv.pci_path
        .as_ref()
        .map_or(std::ptr::null_mut(), |p| p.as_ptr() as *mut c_char)
}

unsafe extern "C" fn init_v8(logger: Logger) -> R {
    let _ = LOGGER.set(logger as usize);
    if std::env::var("OXTEST_NET_FAIL_INIT").is_ok_and(|v| v == "1") {
        log(LOG_WARN, "init fails on purpose (OXTEST_NET_FAIL_INIT=1)");
        return SYSTEM_ERROR;
    }
    let ptr = std::env::var("OXTEST_NET_PTR").unwrap_or_default();
    let mut bits = PTR_HOST;
    for w in ptr.split(',').map(str::trim) {
        match w {
            "cuda" => bits |= PTR_CUDA,
            "dmabuf" => bits |= PTR_DMABUF,
            _ => {}
        }
    }
    PTR_SUPPORT.store(bits, Ordering::Relaxed);
    FORCE_FLUSH.store(
        std::env::var("OXTEST_NET_FORCE_FLUSH").is_ok_and(|v| v == "1"),
        Ordering::Relaxed,
    );
    if let Ok(name) = std::env::var("OXTEST_NET_NAME") {
        let b = name.as_bytes();
        let n = b.len().min(31);
        // SAFETY: init runs before anyone reads the name for use, once.
        let buf = unsafe { &mut *NAME.0.get() };
        buf.fill(0);
        buf[..n].copy_from_slice(&b[..n]);
    }
    let list: Vec<String> = devs()
        .iter()
        .map(|d| format!("{} {}", d.name.to_string_lossy(), d.addr))
        .collect();
    log(
        LOG_INFO,
        &format!("{} device(s): {}", list.len(), list.join(", ")),
    );
    OK
}

unsafe extern "C" fn init_v10(logger: Logger, _profiler: Vp) -> R {
    // SAFETY: forwarded.
    unsafe { init_v8(logger) }
}

/// The context v11's `init` hands out: its address is what `listen` and
/// `connect` check they are given back.
static CONTEXT: u8 = 0;

fn context() -> Vp {
    std::ptr::addr_of!(CONTEXT) as Vp
}

unsafe extern "C" fn init_v11(ctx: Vpp, _comm_id: u64, _config: Vp, logger: Logger, _p: Vp) -> R {
    // SAFETY: forwarded.
    let rc = unsafe { init_v8(logger) };
    if rc == OK {
        // SAFETY: caller's out-pointer.
        unsafe { *ctx = context() };
    }
    rc
}

unsafe extern "C" fn finalize(ctx: Vp) -> R {
    if ctx == context() {
        OK
    } else {
        INVALID_ARGUMENT
    }
}

fn check_context(ctx: Vp, call: &str) -> bool {
    if ctx == context() {
        return true;
    }
    log(
        LOG_WARN,
        &format!("{call}: context {ctx:p} is not the one init returned"),
    );
    false
}

unsafe extern "C" fn listen_v11(ctx: Vp, d: c_int, handle: Vp, out: Vpp) -> R {
    if !check_context(ctx, "listen") {
        return INVALID_ARGUMENT;
    }
    // SAFETY: forwarded.
    unsafe { listen(d, handle, out) }
}

unsafe extern "C" fn connect_v11(ctx: Vp, d: c_int, handle: Vp, out: Vpp, _dev: Vpp) -> R {
    if !check_context(ctx, "connect") {
        return INVALID_ARGUMENT;
    }
    // SAFETY: forwarded.
    unsafe { connect_common(d, handle, out) }
}

unsafe extern "C" fn devices(n: *mut c_int) -> R {
    // SAFETY: caller's out-pointer.
    unsafe { *n = devs().len() as c_int };
    OK
}

fn dev(d: c_int) -> Option<&'static Dev> {
    usize::try_from(d).ok().and_then(|d| devs().get(d))
}

unsafe extern "C" fn get_properties_v8(d: c_int, p: *mut PropsV8) -> R {
    let Some(dv) = dev(d) else {
        return INVALID_ARGUMENT;
    };
    // SAFETY: caller's out-pointer to a v8 struct.
    unsafe {
        p.write(PropsV8 {
            name: dv.name.as_ptr() as *mut c_char,
            pci_path: pci_path_ptr(dv),
            guid: d as u64,
            ptr_support: ptr_support(),
            reg_is_global: 0,
            speed: 10_000,
            port: 1,
            latency: 0.0,
            max_comms: 65_536,
            max_recvs: 1,
            net_device_type: 0,
            net_device_version: 0,
        })
    };
    OK
}

fn props_v9_head(d: c_int, dv: &Dev) -> PropsV9Head {
    PropsV9Head {
        name: dv.name.as_ptr() as *mut c_char,
        pci_path: pci_path_ptr(dv),
        guid: d as u64,
        ptr_support: ptr_support(),
        reg_is_global: 0,
        force_flush: FORCE_FLUSH.load(Ordering::Relaxed) as c_int,
        speed: 10_000,
        port: 1,
        latency: 0.0,
        max_comms: 65_536,
        max_recvs: 1,
        net_device_type: 0,
        net_device_version: 0,
    }
}

unsafe extern "C" fn get_properties_v11(d: c_int, p: *mut PropsV11) -> R {
    let Some(dv) = dev(d) else {
        return INVALID_ARGUMENT;
    };
    // SAFETY: caller's out-pointer to a v11 struct.
    unsafe {
        p.write(PropsV11 {
            v9: props_v9_head(d, dv),
            vdev_ndevs: 1,
            vdev_devs: [d, 0, 0, 0],
            max_p2p_bytes: 1 << 30,
            max_coll_bytes: 1 << 30,
            max_multi_request_size: 1,
        })
    };
    OK
}

unsafe extern "C" fn get_properties_v12(d: c_int, p: *mut PropsV12) -> R {
    let Some(dv) = dev(d) else {
        return INVALID_ARGUMENT;
    };
    // SAFETY: caller's out-pointer to a v12 struct.
    unsafe {
        p.write(PropsV12 {
            v9: props_v9_head(d, dv),
            vdev_ndevs: 1,
            vdev_devs: [d, 0, 0, 0, 0, 0, 0, 0],
            max_p2p_bytes: 1 << 30,
            max_coll_bytes: 1 << 30,
            max_multi_request_size: 1,
            rail_id: -1,
            plane_id: -1,
        })
    };
    OK
}

unsafe extern "C" fn get_properties_v9(d: c_int, p: *mut PropsV9) -> R {
    let Some(dv) = dev(d) else {
        return INVALID_ARGUMENT;
    };
    // SAFETY: caller's out-pointer to a v9/v10 struct.
    unsafe {
        p.write(PropsV9 {
            name: dv.name.as_ptr() as *mut c_char,
            pci_path: pci_path_ptr(dv),
            guid: d as u64,
            ptr_support: ptr_support(),
            reg_is_global: 0,
            force_flush: FORCE_FLUSH.load(Ordering::Relaxed) as c_int,
            speed: 10_000,
            port: 1,
            latency: 0.0,
            max_comms: 65_536,
            max_recvs: 1,
            net_device_type: 0,
            net_device_version: 0,
            vdev_ndevs: 1,
            vdev_devs: [d, 0, 0, 0],
            max_p2p_bytes: 1 << 30,
            max_coll_bytes: 1 << 30,
        })
    };
    OK
}

struct Listen {
    sock: TcpListener,
    dev: c_int,
}

unsafe extern "C" fn listen(d: c_int, handle: Vp, out: Vpp) -> R {
    let Some(dv) = dev(d) else {
        return INVALID_ARGUMENT;
    };
    let sock = match TcpListener::bind(SocketAddrV4::new(dv.addr, 0)) {
        Ok(s) => s,
        Err(e) => {
            log(LOG_WARN, &format!("listen on {}: {e}", dv.addr));
            return SYSTEM_ERROR;
        }
    };
    let port = match sock.local_addr() {
        Ok(a) => a.port(),
        Err(_) => return SYSTEM_ERROR,
    };
    if sock.set_nonblocking(true).is_err() {
        return SYSTEM_ERROR;
    }
    // SAFETY: the caller's handle is 128 writable bytes.
    let h = unsafe { std::slice::from_raw_parts_mut(handle.cast::<u8>(), 128) };
    h.fill(0);
    h[..4].copy_from_slice(HANDLE_MAGIC);
    h[4..8].copy_from_slice(&dv.addr.octets());
    h[8..10].copy_from_slice(&port.to_be_bytes());
    // SAFETY: caller's out-pointer.
    unsafe { *out = Box::into_raw(Box::new(Listen { sock, dev: d })).cast() };
    OK
}

// ------------------------------------------------------------------ connections

struct Req {
    recv: bool,
    data: *mut u8,
    /// Send: bytes to send. Receive: capacity, then bytes received.
    size: usize,
    tag: u32,
    /// Header bytes moved (0..16), then payload bytes moved.
    hdr: [u8; 16],
    hdr_done: usize,
    done_bytes: usize,
    done: bool,
    comm: *mut Conn,
    /// GPU memory: the caller's device address (`data` then points at the
    /// same offset of the registration's pinned mirror: a receive copies
    /// the bytes from there into GPU memory, a send copied them out).
    dev: u64,
}

/// A pinned host buffer from `cuMemHostAlloc`.
struct Pinned {
    ptr: *mut u8,
}

struct Mr {
    start: usize,
    len: usize,
    /// Registered as GPU memory: the pinned host buffer of `len` bytes
    /// the device's transfers go through (made at registration). Pinned:
    /// a copy from pageable memory may wait on the legacy stream, where
    /// the caller's kernels run.
    mirror: Option<Pinned>,
}

struct Conn {
    sock: TcpStream,
    recv: bool,
    queue: VecDeque<*mut Req>,
    /// Set after an I/O error: every later test fails.
    failed: Option<String>,
    /// Non-blocking stream for GPU copies (0: none yet).
    stream: usize,
    /// Bytes moved from (sends) or into (receives) GPU memory.
    gpu_bytes: u64,
    flushes: u64,
    regs_address: u64,
    regs_dmabuf: u64,
    /// The device it was made on (connect's, or the listen's).
    dev: c_int,
    /// The tag of its first message, bytes and messages completed.
    tag: Option<u32>,
    bytes: u64,
    msgs: u64,
}

unsafe fn connect_common(d: c_int, handle: Vp, out: Vpp) -> R {
    // SAFETY: the caller's handle is 128 bytes, kept between retries.
    let h = unsafe { std::slice::from_raw_parts_mut(handle.cast::<u8>(), 128) };
    // SAFETY: caller's out-pointer.
    unsafe { *out = std::ptr::null_mut() };
    if &h[..4] != HANDLE_MAGIC || dev(d).is_none() {
        log(LOG_WARN, "connect: not an oxtest handle or no such device");
        return INVALID_ARGUMENT;
    }
    // First call for this handle: "not yet" (byte 127 remembers), so the
    // caller's retry loop is used for real.
    if h[127] == 0 {
        h[127] = 1;
        return OK;
    }
    let addr = SocketAddr::from(SocketAddrV4::new(
        Ipv4Addr::new(h[4], h[5], h[6], h[7]),
        u16::from_be_bytes([h[8], h[9]]),
    ));
    // The listener exists (its handle came from listen), so the kernel
    // completes the handshake at once; the bound keeps a bad handle from
    // blocking long.
    let sock = match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(s) => s,
        Err(e) => {
            log(LOG_WARN, &format!("connect to {addr}: {e}"));
            return SYSTEM_ERROR;
        }
    };
    if sock.set_nodelay(true).is_err() || sock.set_nonblocking(true).is_err() {
        return SYSTEM_ERROR;
    }
    let c = Conn {
        sock,
        recv: false,
        queue: VecDeque::new(),
        failed: None,
        stream: 0,
        gpu_bytes: 0,
        flushes: 0,
        regs_address: 0,
        regs_dmabuf: 0,
        dev: d,
        tag: None,
        bytes: 0,
        msgs: 0,
    };
    // SAFETY: caller's out-pointer.
    unsafe { *out = Box::into_raw(Box::new(c)).cast() };
    OK
}

unsafe extern "C" fn connect_v8(d: c_int, handle: Vp, out: Vpp, _dev: Vpp) -> R {
    // SAFETY: forwarded.
    unsafe { connect_common(d, handle, out) }
}

unsafe extern "C" fn connect_v10(d: c_int, _cfg: Vp, handle: Vp, out: Vpp, _dev: Vpp) -> R {
    // SAFETY: forwarded.
    unsafe { connect_common(d, handle, out) }
}

unsafe extern "C" fn accept(l: Vp, out: Vpp, _dev: Vpp) -> R {
    // SAFETY: a listen object made by `listen`.
    let l = unsafe { &*(l as *const Listen) };
    // SAFETY: caller's out-pointer.
    unsafe { *out = std::ptr::null_mut() };
    match l.sock.accept() {
        Ok((sock, _)) => {
            if sock.set_nodelay(true).is_err() || sock.set_nonblocking(true).is_err() {
                return SYSTEM_ERROR;
            }
            let c = Conn {
                sock,
                recv: true,
                queue: VecDeque::new(),
                failed: None,
                stream: 0,
                gpu_bytes: 0,
                flushes: 0,
                regs_address: 0,
                regs_dmabuf: 0,
                dev: l.dev,
                tag: None,
                bytes: 0,
                msgs: 0,
            };
            // SAFETY: caller's out-pointer.
            unsafe { *out = Box::into_raw(Box::new(c)).cast() };
            OK
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => OK,
        Err(e) => {
            log(LOG_WARN, &format!("accept: {e}"));
            SYSTEM_ERROR
        }
    }
}

unsafe extern "C" fn reg_mr(comm: Vp, data: Vp, size: usize, kind: c_int, out: Vpp) -> R {
    let device = match kind {
        PTR_HOST => false,
        PTR_CUDA if ptr_support() & PTR_CUDA != 0 => {
            if let Err(e) = check_device_range(data as u64, size) {
                log(LOG_WARN, &format!("regMr(NCCL_PTR_CUDA): {e}"));
                return INVALID_ARGUMENT;
            }
            true
        }
        _ => {
            log(
                LOG_WARN,
                &format!("regMr: type {kind} is not a memory type this device declared"),
            );
            return INTERNAL_ERROR;
        }
    };
    if device && !comm.is_null() {
        // SAFETY: a connection made by connect/accept.
        unsafe { (*(comm as *mut Conn)).regs_address += 1 };
    }
    let mirror = if device {
        match alloc_pinned(size) {
            Ok(m) => Some(m),
            Err(e) => {
                log(LOG_WARN, &format!("regMr(NCCL_PTR_CUDA): {e}"));
                return SYSTEM_ERROR;
            }
        }
    } else {
        None
    };
    let mr = Mr {
        start: data as usize,
        len: size,
        mirror,
    };
    // SAFETY: caller's out-pointer.
    unsafe { *out = Box::into_raw(Box::new(mr)).cast() };
    OK
}

unsafe extern "C" fn reg_mr_dma_buf(
    comm: Vp,
    data: Vp,
    size: usize,
    kind: c_int,
    _offset: u64,
    fd: c_int,
    out: Vpp,
) -> R {
    if ptr_support() & PTR_DMABUF == 0 || kind != PTR_CUDA {
        log(
            LOG_WARN,
            &format!("regMrDmaBuf: type {kind}, and the device declared no NCCL_PTR_DMABUF"),
        );
        return INTERNAL_ERROR;
    }
    // SAFETY: fcntl on a caller's descriptor only reads its flags.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        log(
            LOG_WARN,
            &format!("regMrDmaBuf: descriptor {fd} is not open"),
        );
        return INVALID_ARGUMENT;
    }
    if let Err(e) = check_device_range(data as u64, size) {
        log(LOG_WARN, &format!("regMrDmaBuf: {e}"));
        return INVALID_ARGUMENT;
    }
    if !comm.is_null() {
        // SAFETY: a connection made by connect/accept.
        unsafe { (*(comm as *mut Conn)).regs_dmabuf += 1 };
    }
    let mirror = match alloc_pinned(size) {
        Ok(m) => m,
        Err(e) => {
            log(LOG_WARN, &format!("regMrDmaBuf: {e}"));
            return SYSTEM_ERROR;
        }
    };
    let mr = Mr {
        start: data as usize,
        len: size,
        mirror: Some(mirror),
    };
    // SAFETY: caller's out-pointer.
    unsafe { *out = Box::into_raw(Box::new(mr)).cast() };
    OK
}

/// Completes at once (this device's copies are done when a receive is),
/// counted on the connection.
unsafe extern "C" fn iflush(
    comm: Vp,
    n: c_int,
    _data: Vpp,
    _sizes: *mut c_int,
    mhs: Vpp,
    out: Vpp,
) -> R {
    // SAFETY: caller's out-pointer.
    unsafe { *out = std::ptr::null_mut() };
    if comm.is_null() || n != 1 {
        return INVALID_ARGUMENT;
    }
    // SAFETY: a connection made by connect/accept.
    let c = unsafe { &mut *(comm as *mut Conn) };
    // SAFETY: one registration, made by reg_mr or reg_mr_dma_buf.
    let mh = unsafe { *mhs };
    // SAFETY: as above (non-NULL checked first).
    if !c.recv || mh.is_null() || unsafe { &*(mh as *const Mr) }.mirror.is_none() {
        log(LOG_WARN, "iflush: not a receive into GPU memory");
        return INVALID_ARGUMENT;
    }
    c.flushes += 1;
    let r = Box::new(Req {
        recv: true,
        data: std::ptr::null_mut(),
        size: 0,
        tag: 0,
        hdr: [0; 16],
        hdr_done: 16,
        done_bytes: 0,
        done: true,
        comm: c,
        dev: 0,
    });
    // SAFETY: caller's out-pointer; `test` frees it.
    unsafe { *out = Box::into_raw(r).cast() };
    OK
}

unsafe extern "C" fn dereg_mr(_comm: Vp, mh: Vp) -> R {
    if !mh.is_null() {
        // SAFETY: made by reg_mr or reg_mr_dma_buf.
        let mr = unsafe { Box::from_raw(mh.cast::<Mr>()) };
        if let (Some(m), Some(cu)) = (mr.mirror, cuda()) {
            // SAFETY: allocated by cuMemHostAlloc, freed once; no request
            // uses it after deregistration (the caller's contract).
            unsafe { (cu.mem_free_host)(m.ptr.cast()) };
        }
    }
    OK
}

/// Whether `data..data+size` lies in the registration: `None` if not,
/// else `Some(None)` for host memory and `Some(Some(p))` for GPU memory,
/// `p` the same offset of the registration's pinned mirror.
fn in_mr(mh: Vp, data: *const u8, size: usize) -> Option<Option<*mut u8>> {
    if mh.is_null() {
        return None;
    }
    // SAFETY: made by reg_mr and not yet deregistered (caller's contract).
    let mr = unsafe { &*(mh as *const Mr) };
    let a = data as usize;
    (a >= mr.start && a.saturating_add(size) <= mr.start + mr.len).then(|| {
        mr.mirror
            .as_ref()
            // SAFETY: `a - start + size <= len`, inside the mirror.
            .map(|m| unsafe { m.ptr.add(a - mr.start) })
    })
}

unsafe fn post(comm: Vp, recv: bool, data: Vp, size: usize, tag: c_int, mh: Vp, out: Vpp) -> R {
    // SAFETY: caller's out-pointer.
    unsafe { *out = std::ptr::null_mut() };
    // SAFETY: a connection made by connect/accept.
    let c = unsafe { &mut *(comm as *mut Conn) };
    if c.recv != recv {
        log(
            LOG_WARN,
            "isend on a receiving end or irecv on a sending end",
        );
        return INVALID_ARGUMENT;
    }
    let Some(mirror) = in_mr(mh, data as *const u8, size) else {
        log(
            LOG_WARN,
            &format!(
                "{} of {size} bytes at {data:p} outside its registration",
                if recv { "irecv" } else { "isend" }
            ),
        );
        return INVALID_ARGUMENT;
    };
    if c.queue.len() >= MAX_REQUESTS {
        // No room: the caller tries again later.
        return OK;
    }
    let mut r = Box::new(Req {
        recv,
        data: data.cast(),
        size,
        tag: tag as u32,
        hdr: [0; 16],
        hdr_done: 0,
        done_bytes: 0,
        done: false,
        comm: c,
        dev: 0,
    });
    if let Some(m) = mirror {
        r.dev = data as u64;
        r.data = m;
        if !recv && size > 0 {
            // What the NIC would read now: the caller may reuse the memory
            // only once the send completes, and it has not yet.
            if let Err(e) = gpu_copy(c, false, r.dev, r.data, size) {
                log(LOG_WARN, &format!("isend from GPU memory: {e}"));
                return SYSTEM_ERROR;
            }
            c.gpu_bytes += size as u64;
        }
    }
    if !recv {
        r.hdr[..8].copy_from_slice(&(size as u64).to_le_bytes());
        r.hdr[8..12].copy_from_slice(&(tag as u32).to_le_bytes());
        r.hdr[12..].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    }
    let p = Box::into_raw(r);
    c.queue.push_back(p);
    // SAFETY: caller's out-pointer.
    unsafe { *out = p.cast() };
    OK
}

unsafe extern "C" fn isend_v8(c: Vp, d: Vp, size: c_int, tag: c_int, mh: Vp, out: Vpp) -> R {
    let Ok(size) = usize::try_from(size) else {
        return INVALID_ARGUMENT;
    };
    // SAFETY: forwarded.
    unsafe { post(c, false, d, size, tag, mh, out) }
}

unsafe extern "C" fn isend_v9(c: Vp, d: Vp, size: usize, tag: c_int, mh: Vp, out: Vpp) -> R {
    // SAFETY: forwarded.
    unsafe { post(c, false, d, size, tag, mh, out) }
}

unsafe extern "C" fn isend_v10(
    c: Vp,
    d: Vp,
    size: usize,
    tag: c_int,
    mh: Vp,
    _ph: Vp,
    out: Vpp,
) -> R {
    // SAFETY: forwarded.
    unsafe { post(c, false, d, size, tag, mh, out) }
}

unsafe extern "C" fn irecv_v8(
    c: Vp,
    n: c_int,
    d: Vpp,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhs: Vpp,
    out: Vpp,
) -> R {
    if n != 1 {
        return INVALID_ARGUMENT;
    }
    // SAFETY: one element in each array (n == 1).
    let (data, size, tag, mh) = unsafe { (*d, *sizes, *tags, *mhs) };
    let Ok(size) = usize::try_from(size) else {
        return INVALID_ARGUMENT;
    };
    // SAFETY: forwarded.
    unsafe { post(c, true, data, size, tag, mh, out) }
}

unsafe extern "C" fn irecv_v9(
    c: Vp,
    n: c_int,
    d: Vpp,
    sizes: *mut usize,
    tags: *mut c_int,
    mhs: Vpp,
    out: Vpp,
) -> R {
    if n != 1 {
        return INVALID_ARGUMENT;
    }
    // SAFETY: one element in each array (n == 1).
    let (data, size, tag, mh) = unsafe { (*d, *sizes, *tags, *mhs) };
    // SAFETY: forwarded.
    unsafe { post(c, true, data, size, tag, mh, out) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn irecv_v10(
    c: Vp,
    n: c_int,
    d: Vpp,
    sizes: *mut usize,
    tags: *mut c_int,
    mhs: Vpp,
    _phs: Vpp,
    out: Vpp,
) -> R {
    // SAFETY: forwarded.
    unsafe { irecv_v9(c, n, d, sizes, tags, mhs, out) }
}

/// Moves bytes for the oldest unfinished requests of `c` until the socket
/// would block. Err: the connection failed (the text says how).
fn progress(c: &mut Conn) -> Result<(), String> {
    if let Some(e) = &c.failed {
        return Err(e.clone());
    }
    let res = progress_inner(c);
    if let Err(e) = &res {
        c.failed = Some(e.clone());
    }
    res
}

fn progress_inner(c: &mut Conn) -> Result<(), String> {
    for i in 0..c.queue.len() {
        let p = c.queue[i];
        // SAFETY: queued requests are live until test frees them.
        let r = unsafe { &mut *p };
        if r.done {
            continue;
        }
        loop {
            if r.hdr_done < 16 {
                let n = if r.recv {
                    (&c.sock).read(&mut r.hdr[r.hdr_done..])
                } else {
                    (&c.sock).write(&r.hdr[r.hdr_done..])
                };
                match n {
                    Ok(0) => return Err("connection closed by peer".into()),
                    Ok(n) => {
                        r.hdr_done += n;
                        if r.hdr_done == 16 && r.recv {
                            let len = u64::from_le_bytes(r.hdr[..8].try_into().unwrap()) as usize;
                            let tag = u32::from_le_bytes(r.hdr[8..12].try_into().unwrap());
                            let magic = u32::from_le_bytes(r.hdr[12..].try_into().unwrap());
                            if magic != FRAME_MAGIC {
                                return Err("stream out of step (bad frame magic)".into());
                            }
                            if tag != r.tag {
                                return Err(format!(
                                    "message with tag {tag} met a receive with tag {}",
                                    r.tag
                                ));
                            }
                            if len > r.size {
                                return Err(format!(
                                    "message of {len} bytes is larger than the posted receive of {} bytes",
                                    r.size
                                ));
                            }
                            r.size = len;
                        }
                        continue;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.to_string()),
                }
            }
            if r.done_bytes == r.size {
                if r.recv && r.dev != 0 && r.size > 0 {
                    gpu_copy(c, true, r.dev, r.data, r.size)?;
                    c.gpu_bytes += r.size as u64;
                }
                r.done = true;
                break;
            }
            let left = r.size - r.done_bytes;
            // SAFETY: the request's buffer is valid for `size` bytes until it
            // completes (the caller's contract for isend/irecv).
            let n = unsafe {
                let at = r.data.add(r.done_bytes);
                if r.recv {
                    (&c.sock).read(std::slice::from_raw_parts_mut(at, left))
                } else {
                    (&c.sock).write(std::slice::from_raw_parts(at, left))
                }
            };
            match n {
                Ok(0) => return Err("connection closed by peer".into()),
                Ok(n) => r.done_bytes += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    Ok(())
}

unsafe extern "C" fn test(req: Vp, done: *mut c_int, size: *mut c_int) -> R {
    let p = req.cast::<Req>();
    // SAFETY: a live request from isend/irecv; its connection outlives it.
    let c = unsafe { &mut *(*p).comm };
    // A request that completed stays complete even when the connection
    // failed after it (a peer's last message, then its close).
    // SAFETY: as above.
    if let Err(e) = progress(c).or_else(|e| if unsafe { (*p).done } { Ok(()) } else { Err(e) }) {
        log(
            LOG_WARN,
            &format!("{}: {e}", if c.recv { "receive" } else { "send" }),
        );
        return SYSTEM_ERROR;
    }
    // SAFETY: as above.
    let r = unsafe { &*p };
    if !r.done {
        // SAFETY: caller's out-pointer.
        unsafe { *done = 0 };
        return OK;
    }
    let n = r.size;
    if r.hdr_done == 16 && !r.data.is_null() {
        c.tag.get_or_insert(r.tag);
        c.bytes += n as u64;
        c.msgs += 1;
    }
    c.queue.retain(|&q| q != p);
    // SAFETY: made by Box::into_raw in post; no longer queued.
    drop(unsafe { Box::from_raw(p) });
    // SAFETY: caller's out-pointers (size may be NULL).
    unsafe {
        *done = 1;
        if !size.is_null() {
            *size = n as c_int;
        }
    }
    OK
}

unsafe fn close_conn(c: Vp) -> R {
    if c.is_null() {
        return OK;
    }
    // SAFETY: a connection from connect/accept; its requests die with it.
    let c = unsafe { Box::from_raw(c.cast::<Conn>()) };
    if std::env::var("OXTEST_NET_TRACE").is_ok() {
        let name = dev(c.dev).map_or("?".into(), |d| d.name.to_string_lossy().into_owned());
        log(
            LOG_INFO,
            &format!(
                "{} closed: device {} '{name}' tag {}: {} bytes in {} messages",
                if c.recv { "receive" } else { "send" },
                c.dev,
                c.tag.map_or("-".into(), |t| t.to_string()),
                c.bytes,
                c.msgs
            ),
        );
    }
    if c.gpu_bytes > 0 || c.regs_address > 0 || c.regs_dmabuf > 0 {
        log(
            LOG_INFO,
            &format!(
                "{} closed: {} bytes {} GPU memory, {} flushes, {} DMA-BUF and {} address registrations of GPU memory",
                if c.recv { "receive" } else { "send" },
                c.gpu_bytes,
                if c.recv { "into" } else { "from" },
                c.flushes,
                c.regs_dmabuf,
                c.regs_address
            ),
        );
    }
    if let Some(cu) = cuda() {
        if c.stream != 0 {
            // SAFETY: a stream this connection created; its copies ended.
            unsafe { (cu.stream_destroy)(c.stream as Vp) };
        }
    }
    for p in c.queue.iter() {
        // SAFETY: queued requests were made by Box::into_raw.
        drop(unsafe { Box::from_raw(*p) });
    }
    OK
}

unsafe extern "C" fn close_send(c: Vp) -> R {
    // SAFETY: forwarded.
    unsafe { close_conn(c) }
}

unsafe extern "C" fn close_recv(c: Vp) -> R {
    // SAFETY: forwarded.
    unsafe { close_conn(c) }
}

unsafe extern "C" fn close_listen(l: Vp) -> R {
    if !l.is_null() {
        // SAFETY: made by listen.
        drop(unsafe { Box::from_raw(l.cast::<Listen>()) });
    }
    OK
}
