//! The one layer over the CUDA driver's calls (what cudarc calls its
//! `result` layer): each function makes one `cu*` call of
//! `cudarc::driver::sys` and returns its outputs, or a [`DriverError`]
//! naming the call and CUDA's error code. The rest of the crate calls the
//! driver only through here (and [`crate::loader`], which checks that the
//! library and its symbols are there before anything is called).
//!
//! A function is `unsafe` where the driver trusts its arguments (handles
//! that must be live, pointers that must be valid for the bytes named);
//! one that only takes ordinals or values and writes its own outputs is
//! safe. Calls do not run behind the loader's panic guard here: callers
//! keep their `guarded` scopes, as one scope often spans several calls.

use std::ffi::{c_char, c_void, CStr};

use oxccl_core::{Error, ErrorKind};

use cudarc::driver::sys;
pub use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUfunction, CUgraph,
    CUgraphExec, CUipcMemHandle_st, CUipcMem_flags, CUlaunchAttribute, CUlaunchAttributeID,
    CUlaunchConfig, CUmemorytype, CUmodule, CUpointer_attribute, CUresult, CUstream,
    CUstreamCaptureMode, CUstreamCaptureStatus, CUstreamWaitValue_flags, CUstreamWriteValue_flags,
    CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTREGISTER_DEVICEMAP,
    CU_MEMHOSTREGISTER_PORTABLE,
};

/// A driver call that did not return `CUDA_SUCCESS`: which call, and the
/// code it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverError {
    /// The call, as the driver's documentation names it (`cuMemAlloc`).
    pub call: &'static str,
    /// What it returned.
    pub code: CUresult,
}

/// A driver call's outputs, or the call and code that failed.
pub type DriverResult<T> = std::result::Result<T, DriverError>;

impl DriverError {
    /// The error as oxccl reports it (`UnhandledCuda`), naming `what` (the
    /// call, or the call and what it was for) and the driver's error name
    /// and text.
    pub fn context(self, what: &str) -> Error {
        let r = self.code;
        let mut name: *const c_char = std::ptr::null();
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: both write a pointer to a static string (or leave it null).
        unsafe {
            sys::cuGetErrorName(r, &mut name);
            sys::cuGetErrorString(r, &mut text);
        }
        let s = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: the driver returns static NUL-terminated strings.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        Error::new(
            ErrorKind::UnhandledCuda,
            format!("{what} failed: {} ({}) [{r:?}]", s(name), s(text)),
        )
    }
}

impl From<DriverError> for Error {
    fn from(e: DriverError) -> Error {
        e.context(e.call)
    }
}

/// `Ok(v)` for `CUDA_SUCCESS`, else the error of `call`.
fn ok<T>(r: CUresult, call: &'static str, v: T) -> DriverResult<T> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(v)
    } else {
        Err(DriverError { call, code: r })
    }
}

// Devices.

/// `cuDeviceGet`: the device of ordinal `ordinal`.
pub fn device_get(ordinal: i32) -> DriverResult<CUdevice> {
    let mut dev: CUdevice = 0;
    // SAFETY: writes one int.
    let r = unsafe { sys::cuDeviceGet(&mut dev, ordinal) };
    ok(r, "cuDeviceGet", dev)
}

/// `cuDeviceGetAttribute`.
pub fn device_attribute(dev: CUdevice, attr: CUdevice_attribute) -> DriverResult<i32> {
    let mut v = 0;
    // SAFETY: writes one int.
    let r = unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) };
    ok(r, "cuDeviceGetAttribute", v)
}

/// `cuDeviceGetName`.
pub fn device_name(dev: CUdevice) -> DriverResult<String> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer holds 256 chars; the driver NUL-terminates.
    let r = unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), 256, dev) };
    ok(r, "cuDeviceGetName", ())?;
    // The last byte stays NUL whatever the driver wrote before it.
    buf[255] = 0;
    // SAFETY: NUL-terminated (above).
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// `cuDeviceTotalMem`: the device's memory in bytes.
pub fn device_total_mem(dev: CUdevice) -> DriverResult<usize> {
    let mut bytes = 0usize;
    // SAFETY: writes one size_t.
    let r = unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, dev) };
    ok(r, "cuDeviceTotalMem", bytes)
}

/// `cuDeviceGetPCIBusId`: the bus id, NUL-terminated within 16 chars.
pub fn device_pci_bus_id(dev: CUdevice) -> DriverResult<[c_char; 16]> {
    let mut b = [0 as c_char; 16];
    // SAFETY: writes at most 16 bytes, NUL-terminated.
    let r = unsafe { sys::cuDeviceGetPCIBusId(b.as_mut_ptr(), 16, dev) };
    ok(r, "cuDeviceGetPCIBusId", b)
}

/// `cuDeviceGetByPCIBusId`.
pub fn device_by_pci_bus_id(bus_id: &CStr) -> DriverResult<CUdevice> {
    let mut d: CUdevice = 0;
    // SAFETY: `bus_id` is NUL-terminated; writes one int.
    let r = unsafe { sys::cuDeviceGetByPCIBusId(&mut d, bus_id.as_ptr()) };
    ok(r, "cuDeviceGetByPCIBusId", d)
}

/// `cuDeviceCanAccessPeer(dev -> peer)`.
pub fn device_can_access_peer(dev: CUdevice, peer: CUdevice) -> DriverResult<bool> {
    let mut can = 0;
    // SAFETY: writes one int.
    let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer) };
    ok(r, "cuDeviceCanAccessPeer", can == 1)
}

// Contexts.

/// `cuDevicePrimaryCtxRetain`: the device's primary context, retained
/// (release it with [`primary_ctx_release`]).
pub fn primary_ctx_retain(dev: CUdevice) -> DriverResult<CUcontext> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle.
    let r = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) };
    ok(r, "cuDevicePrimaryCtxRetain", ctx)
}

/// `cuDevicePrimaryCtxRelease`.
///
/// # Safety
/// One release per [`primary_ctx_retain`]; nothing of the context is used
/// by the caller after its last release.
pub unsafe fn primary_ctx_release(dev: CUdevice) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
    ok(r, "cuDevicePrimaryCtxRelease", ())
}

/// `cuCtxGetCurrent`: the calling thread's current context (null: none).
pub fn ctx_get_current() -> DriverResult<CUcontext> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle.
    let r = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    ok(r, "cuCtxGetCurrent", ctx)
}

/// `cuCtxGetDevice`: the device of the current context.
pub fn ctx_get_device() -> DriverResult<CUdevice> {
    let mut dev: CUdevice = 0;
    // SAFETY: writes one int.
    let r = unsafe { sys::cuCtxGetDevice(&mut dev) };
    ok(r, "cuCtxGetDevice", dev)
}

/// `cuCtxSetCurrent`.
///
/// # Safety
/// `ctx` is a live context (retained), or null (unbinds the thread).
pub unsafe fn ctx_set_current(ctx: CUcontext) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuCtxSetCurrent(ctx) };
    ok(r, "cuCtxSetCurrent", ())
}

/// `cuCtxSynchronize`: waits for the current context's queued work.
pub fn ctx_synchronize() -> DriverResult<()> {
    // SAFETY: no arguments; the driver waits on the current context.
    let r = unsafe { sys::cuCtxSynchronize() };
    ok(r, "cuCtxSynchronize", ())
}

/// `cuCtxEnablePeerAccess(peer, 0)` from the current context (an error
/// with `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` when it was).
///
/// # Safety
/// `peer` is a live (retained) context.
pub unsafe fn ctx_enable_peer_access(peer: CUcontext) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuCtxEnablePeerAccess(peer, 0) };
    ok(r, "cuCtxEnablePeerAccess", ())
}

// Memory.

/// `cuMemAlloc`: `bytes` of device memory in the current context.
pub fn mem_alloc(bytes: usize) -> DriverResult<CUdeviceptr> {
    let mut p: CUdeviceptr = 0;
    // SAFETY: writes one pointer.
    let r = unsafe { sys::cuMemAlloc_v2(&mut p, bytes) };
    ok(r, "cuMemAlloc", p)
}

/// `cuMemFree`.
///
/// # Safety
/// `p` came from [`mem_alloc`], is freed once, and no queued work uses it.
pub unsafe fn mem_free(p: CUdeviceptr) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuMemFree_v2(p) };
    ok(r, "cuMemFree", ())
}

/// `cuMemGetHandleForAddressRange` for a DMA-BUF: a file descriptor of
/// `bytes` device bytes at `p` (both multiples of the host page), which the
/// caller closes.
///
/// # Safety
/// `p..p + bytes` lies in one live allocation of the current context.
pub unsafe fn dmabuf_fd(p: CUdeviceptr, bytes: usize) -> DriverResult<i32> {
    let mut fd: i32 = -1;
    // SAFETY: writes one int; the range is the caller's contract.
    let r = unsafe {
        sys::cuMemGetHandleForAddressRange(
            (&mut fd as *mut i32).cast(),
            p,
            bytes,
            sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    ok(r, "cuMemGetHandleForAddressRange", fd)
}

/// `cuMemsetD8`: `bytes` bytes at `p` set to `v`.
///
/// # Safety
/// `p..p + bytes` is device memory the caller may write.
pub unsafe fn memset_d8(p: CUdeviceptr, v: u8, bytes: usize) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuMemsetD8_v2(p, v, bytes) };
    ok(r, "cuMemsetD8", ())
}

/// `cuMemcpyHtoD`: `bytes` from host `src` to device `dst`.
///
/// # Safety
/// `src` is readable and `dst` writable for `bytes`.
pub unsafe fn memcpy_htod(dst: CUdeviceptr, src: *const c_void, bytes: usize) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuMemcpyHtoD_v2(dst, src, bytes) };
    ok(r, "cuMemcpyHtoD", ())
}

/// `cuMemcpyDtoH`: `bytes` from device `src` to host `dst`.
///
/// # Safety
/// `src` is readable and `dst` writable for `bytes`.
pub unsafe fn memcpy_dtoh(dst: *mut c_void, src: CUdeviceptr, bytes: usize) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuMemcpyDtoH_v2(dst, src, bytes) };
    ok(r, "cuMemcpyDtoH", ())
}

/// `cuMemcpyDtoDAsync` on `stream`.
///
/// # Safety
/// Both ranges are device memory valid until the copy has run on
/// `stream`, a live stream of the current context.
pub unsafe fn memcpy_dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream) };
    ok(r, "cuMemcpyDtoDAsync", ())
}

/// `cuMemcpyAsync` (unified addressing: either side may be any memory the
/// driver knows) on `stream`.
///
/// # Safety
/// As [`memcpy_dtod_async`].
pub unsafe fn memcpy_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream) };
    ok(r, "cuMemcpyAsync", ())
}

/// `cuMemHostAlloc`: `bytes` of pinned host memory with `flags`
/// (`CU_MEMHOSTALLOC_*`).
pub fn mem_host_alloc(bytes: usize, flags: u32) -> DriverResult<*mut c_void> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: writes one pointer.
    let r = unsafe { sys::cuMemHostAlloc(&mut p, bytes, flags) };
    ok(r, "cuMemHostAlloc", p)
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `p` came from [`mem_host_alloc`], is freed once and is not used after.
pub unsafe fn mem_free_host(p: *mut c_void) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuMemFreeHost(p) };
    ok(r, "cuMemFreeHost", ())
}

/// `cuMemHostRegister`: pins `bytes` of host memory at `p` with `flags`
/// (`CU_MEMHOSTREGISTER_*`).
///
/// # Safety
/// `p..p + bytes` is mapped host memory that stays mapped until
/// [`mem_host_unregister`].
pub unsafe fn mem_host_register(p: *mut c_void, bytes: usize, flags: u32) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuMemHostRegister_v2(p, bytes, flags) };
    ok(r, "cuMemHostRegister", ())
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// `p` was registered by [`mem_host_register`] and no queued work uses it.
pub unsafe fn mem_host_unregister(p: *mut c_void) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuMemHostUnregister(p) };
    ok(r, "cuMemHostUnregister", ())
}

/// `cuMemHostGetDevicePointer`: the device address of mapped pinned memory.
///
/// # Safety
/// `p` is pinned, device-mapped host memory.
pub unsafe fn mem_host_device_pointer(p: *mut c_void) -> DriverResult<CUdeviceptr> {
    let mut d: CUdeviceptr = 0;
    // SAFETY: the caller's contract; writes one pointer.
    let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) };
    ok(r, "cuMemHostGetDevicePointer", d)
}

/// `cuPointerGetAttribute` of an attribute that is an unsigned 64-bit value
/// (`CU_POINTER_ATTRIBUTE_BUFFER_ID`, ...).
///
/// # Safety
/// `attr` is one whose value is 8 bytes.
pub unsafe fn pointer_attribute_u64(
    attr: CUpointer_attribute,
    p: CUdeviceptr,
) -> DriverResult<u64> {
    let mut v: u64 = 0;
    // SAFETY: the caller's contract: the value fits `v`.
    let r = unsafe { sys::cuPointerGetAttribute(&mut v as *mut u64 as *mut c_void, attr, p) };
    ok(r, "cuPointerGetAttribute", v)
}

/// `cuPointerGetAttributes`: `attrs[i]`'s value written at `data[i]`.
///
/// # Safety
/// `attrs` and `data` have the same length, and `data[i]` points at a
/// value of the size of `attrs[i]`'s.
pub unsafe fn pointer_attributes(
    attrs: &mut [CUpointer_attribute],
    data: &mut [*mut c_void],
    p: CUdeviceptr,
) -> DriverResult<()> {
    debug_assert_eq!(attrs.len(), data.len());
    // SAFETY: the caller's contract.
    let r = unsafe {
        sys::cuPointerGetAttributes(attrs.len() as u32, attrs.as_mut_ptr(), data.as_mut_ptr(), p)
    };
    ok(r, "cuPointerGetAttributes", ())
}

// Inter-process memory.

/// `cuIpcGetMemHandle` of the allocation at `p`.
///
/// # Safety
/// `p` is the start of a `cuMemAlloc` allocation.
pub unsafe fn ipc_get_mem_handle(p: CUdeviceptr) -> DriverResult<CUipcMemHandle_st> {
    let mut h = CUipcMemHandle_st { reserved: [0; 64] };
    // SAFETY: the caller's contract; writes one handle.
    let r = unsafe { sys::cuIpcGetMemHandle(&mut h, p) };
    ok(r, "cuIpcGetMemHandle", h)
}

/// `cuIpcOpenMemHandle` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`: the
/// address of another process's allocation in the current context.
///
/// # Safety
/// `h` came from [`ipc_get_mem_handle`] in another process of this host.
pub unsafe fn ipc_open_mem_handle(h: CUipcMemHandle_st) -> DriverResult<CUdeviceptr> {
    let mut p: CUdeviceptr = 0;
    // SAFETY: the caller's contract; writes one pointer.
    let r = unsafe {
        sys::cuIpcOpenMemHandle_v2(
            &mut p,
            h,
            CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
        )
    };
    ok(r, "cuIpcOpenMemHandle", p)
}

/// `cuIpcCloseMemHandle`.
///
/// # Safety
/// `p` came from [`ipc_open_mem_handle`], is closed once and no queued
/// work uses it.
pub unsafe fn ipc_close_mem_handle(p: CUdeviceptr) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuIpcCloseMemHandle(p) };
    ok(r, "cuIpcCloseMemHandle", ())
}

// Modules and launches.

/// `cuModuleLoadData` into the current context.
///
/// # Safety
/// `image` is a complete CUBIN or PTX image (self-delimiting: the driver
/// reads what its headers say).
pub unsafe fn module_load_data(image: &[u8]) -> DriverResult<CUmodule> {
    let mut m: CUmodule = std::ptr::null_mut();
    // SAFETY: the caller's contract; writes one handle.
    let r = unsafe { sys::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void) };
    ok(r, "cuModuleLoadData", m)
}

/// `cuModuleGetFunction`: a kernel of `module` by its (extern "C") name.
///
/// # Safety
/// `module` is loaded.
pub unsafe fn module_get_function(module: CUmodule, name: &CStr) -> DriverResult<CUfunction> {
    let mut f: CUfunction = std::ptr::null_mut();
    // SAFETY: the caller's contract; `name` is NUL-terminated.
    let r = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
    ok(r, "cuModuleGetFunction", f)
}

/// `cuModuleUnload`.
///
/// # Safety
/// `module` is loaded, unloaded once, and none of its kernels is queued.
pub unsafe fn module_unload(module: CUmodule) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuModuleUnload(module) };
    ok(r, "cuModuleUnload", ())
}

/// `cuLaunchKernel`: `f` on `blocks` blocks of `threads` threads (1-D, no
/// dynamic shared memory) on `stream`.
///
/// # Safety
/// `params` matches the kernel's parameters and every pointer in them is
/// valid for what the kernel does; `f` and `stream` belong to the current
/// context.
pub unsafe fn launch_kernel(
    f: CUfunction,
    blocks: u32,
    threads: u32,
    stream: CUstream,
    params: &mut [*mut c_void],
) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe {
        sys::cuLaunchKernel(
            f,
            blocks,
            1,
            1,
            threads,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    ok(r, "cuLaunchKernel", ())
}

/// `cuLaunchKernelEx` with the launch configuration `cfg`.
///
/// # Safety
/// As [`launch_kernel`]; `cfg`'s attributes are valid for the call.
pub unsafe fn launch_kernel_ex(
    cfg: &CUlaunchConfig,
    f: CUfunction,
    params: &mut [*mut c_void],
) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuLaunchKernelEx(cfg, f, params.as_mut_ptr(), std::ptr::null_mut()) };
    ok(r, "cuLaunchKernelEx", ())
}

// Events.

/// `cuEventCreate` with `flags` (`CU_EVENT_*`: 0 times, 2 does not).
pub fn event_create(flags: u32) -> DriverResult<CUevent> {
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: writes one handle.
    let r = unsafe { sys::cuEventCreate(&mut e, flags) };
    ok(r, "cuEventCreate", e)
}

/// `cuEventDestroy`.
///
/// # Safety
/// `e` is live and destroyed once.
pub unsafe fn event_destroy(e: CUevent) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuEventDestroy_v2(e) };
    ok(r, "cuEventDestroy", ())
}

/// `cuEventRecord` on `stream`.
///
/// # Safety
/// `e` and `stream` are live and of the same context.
pub unsafe fn event_record(e: CUevent, stream: CUstream) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuEventRecord(e, stream) };
    ok(r, "cuEventRecord", ())
}

/// `cuEventSynchronize`.
///
/// # Safety
/// `e` is live.
pub unsafe fn event_synchronize(e: CUevent) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuEventSynchronize(e) };
    ok(r, "cuEventSynchronize", ())
}

/// `cuEventQuery`: an error with `CUDA_ERROR_NOT_READY` while pending.
///
/// # Safety
/// `e` is live.
pub unsafe fn event_query(e: CUevent) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuEventQuery(e) };
    ok(r, "cuEventQuery", ())
}

/// `cuEventElapsedTime`: milliseconds from `start` to `end`.
///
/// # Safety
/// Both events are live and have been recorded.
pub unsafe fn event_elapsed_ms(start: CUevent, end: CUevent) -> DriverResult<f32> {
    let mut ms = 0f32;
    // SAFETY: the caller's contract; writes one float.
    let r = unsafe { sys::cuEventElapsedTime_v2(&mut ms, start, end) };
    ok(r, "cuEventElapsedTime", ms)
}

// Streams and graphs.

/// `cuStreamCreate` in the current context with `flags` (1: non-blocking).
pub fn stream_create(flags: u32) -> DriverResult<CUstream> {
    let mut s: CUstream = std::ptr::null_mut();
    // SAFETY: writes one handle.
    let r = unsafe { sys::cuStreamCreate(&mut s, flags) };
    ok(r, "cuStreamCreate", s)
}

/// `cuStreamDestroy`.
///
/// # Safety
/// `s` is live, destroyed once and not used after.
pub unsafe fn stream_destroy(s: CUstream) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuStreamDestroy_v2(s) };
    ok(r, "cuStreamDestroy", ())
}

/// `cuStreamQuery`: an error with `CUDA_ERROR_NOT_READY` while work is
/// queued.
///
/// # Safety
/// `s` is live.
pub unsafe fn stream_query(s: CUstream) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuStreamQuery(s) };
    ok(r, "cuStreamQuery", ())
}

/// `cuStreamWaitEvent`: work queued on `s` after this waits for `e`.
///
/// # Safety
/// `s` and `e` are live.
pub unsafe fn stream_wait_event(s: CUstream, e: CUevent) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuStreamWaitEvent(s, e, 0) };
    ok(r, "cuStreamWaitEvent", ())
}

/// `cuStreamGetCtx`: the context `s` belongs to.
///
/// # Safety
/// `s` is a stream handle (the legacy or per-thread default included).
pub unsafe fn stream_get_ctx(s: CUstream) -> DriverResult<CUcontext> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the caller's contract; writes one handle.
    let r = unsafe { sys::cuStreamGetCtx(s, &mut ctx) };
    ok(r, "cuStreamGetCtx", ctx)
}

/// `cuStreamIsCapturing`.
///
/// # Safety
/// `s` is a stream handle.
pub unsafe fn stream_is_capturing(s: CUstream) -> DriverResult<CUstreamCaptureStatus> {
    let mut st = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the caller's contract; writes one enum.
    let r = unsafe { sys::cuStreamIsCapturing(s, &mut st) };
    ok(r, "cuStreamIsCapturing", st)
}

/// `cuStreamWaitValue32` with `CU_STREAM_WAIT_VALUE_EQ`: work queued on
/// `s` after this waits until the word at `addr` equals `value`.
///
/// # Safety
/// `s` is live; `addr` is a device-visible word that stays valid until the
/// wait has run.
pub unsafe fn stream_wait_value32(s: CUstream, addr: CUdeviceptr, value: u32) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe {
        sys::cuStreamWaitValue32_v2(
            s,
            addr,
            value,
            CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32,
        )
    };
    ok(r, "cuStreamWaitValue32", ())
}

/// `cuStreamWriteValue32`: writes `value` at `addr` in `s`'s order.
///
/// # Safety
/// As [`stream_wait_value32`].
pub unsafe fn stream_write_value32(s: CUstream, addr: CUdeviceptr, value: u32) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe {
        sys::cuStreamWriteValue32_v2(
            s,
            addr,
            value,
            CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
        )
    };
    ok(r, "cuStreamWriteValue32", ())
}

/// `cuStreamBeginCapture` in `mode`.
///
/// # Safety
/// `s` is live.
pub unsafe fn stream_begin_capture(s: CUstream, mode: CUstreamCaptureMode) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuStreamBeginCapture_v2(s, mode) };
    ok(r, "cuStreamBeginCapture", ())
}

/// `cuStreamEndCapture`: the captured graph, or the error and the graph
/// the driver handed back with it (null or not: a non-null one is the
/// caller's to destroy).
///
/// # Safety
/// `s` is live and capturing.
pub unsafe fn stream_end_capture(
    s: CUstream,
) -> std::result::Result<CUgraph, (DriverError, CUgraph)> {
    let mut g: CUgraph = std::ptr::null_mut();
    // SAFETY: the caller's contract; writes one handle.
    let r = unsafe { sys::cuStreamEndCapture(s, &mut g) };
    ok(r, "cuStreamEndCapture", ())
        .map(|_| g)
        .map_err(|e| (e, g))
}

/// `cuGraphInstantiateWithFlags(graph, 0)`.
///
/// # Safety
/// `graph` is live.
pub unsafe fn graph_instantiate(graph: CUgraph) -> DriverResult<CUgraphExec> {
    let mut exec: CUgraphExec = std::ptr::null_mut();
    // SAFETY: the caller's contract; writes one handle.
    let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
    ok(r, "cuGraphInstantiate", exec)
}

/// `cuGraphLaunch` on `stream`.
///
/// # Safety
/// `exec` and `stream` are live.
pub unsafe fn graph_launch(exec: CUgraphExec, stream: CUstream) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuGraphLaunch(exec, stream) };
    ok(r, "cuGraphLaunch", ())
}

/// `cuGraphDestroy`.
///
/// # Safety
/// `graph` is live and destroyed once.
pub unsafe fn graph_destroy(graph: CUgraph) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuGraphDestroy(graph) };
    ok(r, "cuGraphDestroy", ())
}

/// `cuGraphExecDestroy`.
///
/// # Safety
/// `exec` is live, destroyed once, and no launch of it is queued.
pub unsafe fn graph_exec_destroy(exec: CUgraphExec) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuGraphExecDestroy(exec) };
    ok(r, "cuGraphExecDestroy", ())
}

/// Whether the driver library exports `name` (looked up, not called).
///
/// # Safety
/// The driver library was opened (the loader's probe succeeded).
pub unsafe fn has_symbol(name: &str) -> bool {
    // SAFETY: the caller's contract; looking a symbol up has no side effect.
    unsafe { sys::culib().get::<*const c_void>(name.as_bytes()).is_ok() }
}
