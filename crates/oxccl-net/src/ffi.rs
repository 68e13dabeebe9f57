//! The C layouts of NCCL's `ncclNet_vN` plugin tables (v6 to v12), written
//! from the public facts of NCCL's `ext-net` headers: field order and types,
//! the property structs, and the constants below. Every function pointer is
//! an `Option` because a plugin may leave optional entries NULL (DMA-BUF
//! registration, flush, device offload); the loader checks the ones it needs.
//!
//! What changed between versions (the reason each version has its own table):
//!
//! | version | change |
//! | --- | --- |
//! | v6 | properties without offload fields; `connect(dev, handle, &send)`, `accept(listen, &recv)`; `int` sizes |
//! | v7 | properties gain `netDeviceType`/`netDeviceVersion`; connect/accept take a device-offload handle; `getDeviceMr`, `irecvConsumed` |
//! | v8 | properties gain `regIsGlobal` (after `ptrSupport`); `regMr` takes a `size_t` size |
//! | v9 | properties gain `forceFlush`, virtual-device props, `maxP2pBytes`/`maxCollBytes`; `isend`/`irecv` sizes are `size_t`; `makeVDevice` |
//! | v10 | `init` also takes a profiler callback; `connect` takes a `ncclNetCommConfig_v10_t*` first; `isend`/`irecv` take profiler handles |
//! | v11 | `init(&ctx, commId, config, logger, profiler)` makes a context that `listen` and `connect` take first (the config moves from `connect` to `init`); properties gain `maxMultiRequestSize`; `finalize(ctx)` and `setNetAttr(ctx, attr)` |
//! | v12 | virtual devices hold up to 8 devices (4 before); properties gain `railId`/`planeId` (`int16_t`) |
//!
//! `test` reports sizes as `int` in every version.

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// `ncclResult_t`.
pub type NcclResult = c_int;
pub const NCCL_SUCCESS: NcclResult = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
pub const NCCL_INVALID_USAGE: NcclResult = 5;
pub const NCCL_REMOTE_ERROR: NcclResult = 6;
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// Bytes of the opaque connection handle that `listen` fills and the peer's
/// `connect` reads (exchanged out of band).
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
/// `ptrSupport` / `regMr` type: host memory.
pub const NCCL_PTR_HOST: c_int = 0x1;
/// `ptrSupport` / `regMr` type: CUDA device memory.
pub const NCCL_PTR_CUDA: c_int = 0x2;
/// `ptrSupport`: DMA-BUF registration.
pub const NCCL_PTR_DMABUF: c_int = 0x4;
/// Devices per virtual NIC in v9 and v10 (`NCCL_NET_MAX_DEVS_PER_NIC` then).
pub const NCCL_NET_MAX_DEVS_PER_NIC_V9: usize = 4;
/// Devices per virtual NIC in v12 (`NCCL_NET_MAX_DEVS_PER_NIC_V12`).
pub const NCCL_NET_MAX_DEVS_PER_NIC_V12: usize = 8;
/// `ncclNetCommConfig_v10_t::trafficClass` when unset.
pub const NCCL_NET_TRAFFIC_CLASS_UNDEF: c_int = -1;

/// `ncclDebugLogLevel` values a plugin passes to the logger.
pub const NCCL_LOG_VERSION: c_int = 1;
pub const NCCL_LOG_WARN: c_int = 2;
pub const NCCL_LOG_INFO: c_int = 3;
pub const NCCL_LOG_ABORT: c_int = 4;
pub const NCCL_LOG_TRACE: c_int = 5;

/// `ncclDebugLogger_t`: `void (*)(ncclDebugLogLevel, unsigned long flags,
/// const char* file, int line, const char* fmt, ...)`.
pub type Logger = unsafe extern "C" fn(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    ...
);

/// `ncclProfilerCallback_t` (v10's `init`).
pub type ProfilerCallback = unsafe extern "C" fn(
    e_handle: *mut *mut c_void,
    kind: c_int,
    p_handle: *mut c_void,
    plugin_id: i64,
    ext_data: *mut c_void,
) -> NcclResult;

/// `ncclNetDeviceHandle_v7_t` (the same through v10): device offload of a
/// connection. oxccl never asks for offload: it passes a pointer to NULL.
#[repr(C)]
pub struct DeviceHandle {
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needs_proxy_progress: c_int,
}

/// `ncclNetProperties_v6_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropsV6 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
}

/// `ncclNetProperties_v7_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropsV7 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetProperties_v8_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropsV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetVDeviceProps_v9_t` / `_v10_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VDeviceProps {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC_V9],
}

/// `ncclNetProperties_v9_t`, also `ncclNetProperties_v10_t` (same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropsV9 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDeviceProps,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

/// `ncclNetCommConfig_v10_t`, also `_v11_t` and `_v12_t` (same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CommConfigV10 {
    pub traffic_class: c_int,
}

/// `ncclNetProperties_v11_t`: v9's fields, then `maxMultiRequestSize`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropsV11 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDeviceProps,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
}

/// `ncclNetVDeviceProps_v12_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VDevicePropsV12 {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC_V12],
}

/// `ncclNetProperties_v12_t`: v11's with 8-device virtual NICs, then the
/// rail and plane of the device.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropsV12 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDevicePropsV12,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
    pub rail_id: i16,
    pub plane_id: i16,
}

type Vp = *mut c_void;
type Vpp = *mut *mut c_void;
type DevHandlePP = *mut *mut DeviceHandle;

/// `ncclNet_v6_t`.
#[repr(C)]
pub struct NetV6 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(Logger) -> NcclResult>,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut PropsV6) -> NcclResult>,
    pub listen: Option<unsafe extern "C" fn(c_int, Vp, Vpp) -> NcclResult>,
    pub connect: Option<unsafe extern "C" fn(c_int, Vp, Vpp) -> NcclResult>,
    pub accept: Option<unsafe extern "C" fn(Vp, Vpp) -> NcclResult>,
    pub reg_mr: Option<unsafe extern "C" fn(Vp, Vp, c_int, c_int, Vpp) -> NcclResult>,
    pub reg_mr_dma_buf:
        Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, u64, c_int, Vpp) -> NcclResult>,
    pub dereg_mr: Option<unsafe extern "C" fn(Vp, Vp) -> NcclResult>,
    pub isend: Option<unsafe extern "C" fn(Vp, Vp, c_int, c_int, Vp, Vpp) -> NcclResult>,
    pub irecv: Option<
        unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, *mut c_int, Vpp, Vpp) -> NcclResult,
    >,
    pub iflush: Option<unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, Vpp, Vpp) -> NcclResult>,
    pub test: Option<unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> NcclResult>,
    pub close_send: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_recv: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_listen: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
}

/// `ncclNet_v7_t`.
#[repr(C)]
pub struct NetV7 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(Logger) -> NcclResult>,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut PropsV7) -> NcclResult>,
    pub listen: Option<unsafe extern "C" fn(c_int, Vp, Vpp) -> NcclResult>,
    pub connect: Option<unsafe extern "C" fn(c_int, Vp, Vpp, DevHandlePP) -> NcclResult>,
    pub accept: Option<unsafe extern "C" fn(Vp, Vpp, DevHandlePP) -> NcclResult>,
    pub reg_mr: Option<unsafe extern "C" fn(Vp, Vp, c_int, c_int, Vpp) -> NcclResult>,
    pub reg_mr_dma_buf:
        Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, u64, c_int, Vpp) -> NcclResult>,
    pub dereg_mr: Option<unsafe extern "C" fn(Vp, Vp) -> NcclResult>,
    pub isend: Option<unsafe extern "C" fn(Vp, Vp, c_int, c_int, Vp, Vpp) -> NcclResult>,
    pub irecv: Option<
        unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, *mut c_int, Vpp, Vpp) -> NcclResult,
    >,
    pub iflush: Option<unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, Vpp, Vpp) -> NcclResult>,
    pub test: Option<unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> NcclResult>,
    pub close_send: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_recv: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_listen: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub get_device_mr: Option<unsafe extern "C" fn(Vp, Vp, Vpp) -> NcclResult>,
    pub irecv_consumed: Option<unsafe extern "C" fn(Vp, c_int, Vp) -> NcclResult>,
}

/// `ncclNet_v8_t`.
#[repr(C)]
pub struct NetV8 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(Logger) -> NcclResult>,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut PropsV8) -> NcclResult>,
    pub listen: Option<unsafe extern "C" fn(c_int, Vp, Vpp) -> NcclResult>,
    pub connect: Option<unsafe extern "C" fn(c_int, Vp, Vpp, DevHandlePP) -> NcclResult>,
    pub accept: Option<unsafe extern "C" fn(Vp, Vpp, DevHandlePP) -> NcclResult>,
    pub reg_mr: Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, Vpp) -> NcclResult>,
    pub reg_mr_dma_buf:
        Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, u64, c_int, Vpp) -> NcclResult>,
    pub dereg_mr: Option<unsafe extern "C" fn(Vp, Vp) -> NcclResult>,
    pub isend: Option<unsafe extern "C" fn(Vp, Vp, c_int, c_int, Vp, Vpp) -> NcclResult>,
    pub irecv: Option<
        unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, *mut c_int, Vpp, Vpp) -> NcclResult,
    >,
    pub iflush: Option<unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, Vpp, Vpp) -> NcclResult>,
    pub test: Option<unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> NcclResult>,
    pub close_send: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_recv: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_listen: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub get_device_mr: Option<unsafe extern "C" fn(Vp, Vp, Vpp) -> NcclResult>,
    pub irecv_consumed: Option<unsafe extern "C" fn(Vp, c_int, Vp) -> NcclResult>,
}

/// `ncclNet_v9_t`.
#[repr(C)]
pub struct NetV9 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(Logger) -> NcclResult>,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut PropsV9) -> NcclResult>,
    pub listen: Option<unsafe extern "C" fn(c_int, Vp, Vpp) -> NcclResult>,
    pub connect: Option<unsafe extern "C" fn(c_int, Vp, Vpp, DevHandlePP) -> NcclResult>,
    pub accept: Option<unsafe extern "C" fn(Vp, Vpp, DevHandlePP) -> NcclResult>,
    pub reg_mr: Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, Vpp) -> NcclResult>,
    pub reg_mr_dma_buf:
        Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, u64, c_int, Vpp) -> NcclResult>,
    pub dereg_mr: Option<unsafe extern "C" fn(Vp, Vp) -> NcclResult>,
    pub isend: Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, Vp, Vpp) -> NcclResult>,
    pub irecv: Option<
        unsafe extern "C" fn(Vp, c_int, Vpp, *mut usize, *mut c_int, Vpp, Vpp) -> NcclResult,
    >,
    pub iflush: Option<unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, Vpp, Vpp) -> NcclResult>,
    pub test: Option<unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> NcclResult>,
    pub close_send: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_recv: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_listen: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub get_device_mr: Option<unsafe extern "C" fn(Vp, Vp, Vpp) -> NcclResult>,
    pub irecv_consumed: Option<unsafe extern "C" fn(Vp, c_int, Vp) -> NcclResult>,
    pub make_vdevice: Option<unsafe extern "C" fn(*mut c_int, *mut VDeviceProps) -> NcclResult>,
}

/// `ncclNet_v10_t`.
#[repr(C)]
pub struct NetV10 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(Logger, Option<ProfilerCallback>) -> NcclResult>,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut PropsV9) -> NcclResult>,
    pub listen: Option<unsafe extern "C" fn(c_int, Vp, Vpp) -> NcclResult>,
    pub connect:
        Option<unsafe extern "C" fn(c_int, *mut CommConfigV10, Vp, Vpp, DevHandlePP) -> NcclResult>,
    pub accept: Option<unsafe extern "C" fn(Vp, Vpp, DevHandlePP) -> NcclResult>,
    pub reg_mr: Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, Vpp) -> NcclResult>,
    pub reg_mr_dma_buf:
        Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, u64, c_int, Vpp) -> NcclResult>,
    pub dereg_mr: Option<unsafe extern "C" fn(Vp, Vp) -> NcclResult>,
    pub isend: Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, Vp, Vp, Vpp) -> NcclResult>,
    pub irecv: Option<
        unsafe extern "C" fn(Vp, c_int, Vpp, *mut usize, *mut c_int, Vpp, Vpp, Vpp) -> NcclResult,
    >,
    pub iflush: Option<unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, Vpp, Vpp) -> NcclResult>,
    pub test: Option<unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> NcclResult>,
    pub close_send: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_recv: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_listen: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub get_device_mr: Option<unsafe extern "C" fn(Vp, Vp, Vpp) -> NcclResult>,
    pub irecv_consumed: Option<unsafe extern "C" fn(Vp, c_int, Vp) -> NcclResult>,
    pub make_vdevice: Option<unsafe extern "C" fn(*mut c_int, *mut VDeviceProps) -> NcclResult>,
}

/// `ncclNet_v11_t` and `ncclNet_v12_t`: the same entries, over their own
/// property and virtual-device structs (`P`, `V`). `setNetAttr` takes an
/// `ncclNetAttr_vN_t*`, which oxccl never passes (it is optional), so it is
/// typed as `void*` here.
#[repr(C)]
pub struct NetCtx<P, V> {
    pub name: *const c_char,
    pub init: Option<
        unsafe extern "C" fn(
            Vpp,
            u64,
            *mut CommConfigV10,
            Logger,
            Option<ProfilerCallback>,
        ) -> NcclResult,
    >,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut P) -> NcclResult>,
    pub listen: Option<unsafe extern "C" fn(Vp, c_int, Vp, Vpp) -> NcclResult>,
    pub connect: Option<unsafe extern "C" fn(Vp, c_int, Vp, Vpp, DevHandlePP) -> NcclResult>,
    pub accept: Option<unsafe extern "C" fn(Vp, Vpp, DevHandlePP) -> NcclResult>,
    pub reg_mr: Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, Vpp) -> NcclResult>,
    pub reg_mr_dma_buf:
        Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, u64, c_int, Vpp) -> NcclResult>,
    pub dereg_mr: Option<unsafe extern "C" fn(Vp, Vp) -> NcclResult>,
    pub isend: Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, Vp, Vp, Vpp) -> NcclResult>,
    pub irecv: Option<
        unsafe extern "C" fn(Vp, c_int, Vpp, *mut usize, *mut c_int, Vpp, Vpp, Vpp) -> NcclResult,
    >,
    pub iflush: Option<unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, Vpp, Vpp) -> NcclResult>,
    pub test: Option<unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> NcclResult>,
    pub close_send: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_recv: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub close_listen: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub get_device_mr: Option<unsafe extern "C" fn(Vp, Vp, Vpp) -> NcclResult>,
    pub irecv_consumed: Option<unsafe extern "C" fn(Vp, c_int, Vp) -> NcclResult>,
    pub make_vdevice: Option<unsafe extern "C" fn(*mut c_int, *mut V) -> NcclResult>,
    pub finalize: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub set_net_attr: Option<unsafe extern "C" fn(Vp, Vp) -> NcclResult>,
}

/// `ncclNet_v11_t`.
pub type NetV11 = NetCtx<PropsV11, VDeviceProps>;
/// `ncclNet_v12_t`.
pub type NetV12 = NetCtx<PropsV12, VDevicePropsV12>;

/// The name of an `ncclResult_t`, for messages.
pub fn result_name(r: NcclResult) -> &'static str {
    match r {
        NCCL_SUCCESS => "ncclSuccess",
        NCCL_UNHANDLED_CUDA_ERROR => "ncclUnhandledCudaError",
        NCCL_SYSTEM_ERROR => "ncclSystemError",
        NCCL_INTERNAL_ERROR => "ncclInternalError",
        NCCL_INVALID_ARGUMENT => "ncclInvalidArgument",
        NCCL_INVALID_USAGE => "ncclInvalidUsage",
        NCCL_REMOTE_ERROR => "ncclRemoteError",
        NCCL_IN_PROGRESS => "ncclInProgress",
        _ => "unknown ncclResult_t",
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    // Sizes and offsets by C's rules on LP64, counted by hand from the field
    // lists: a wrong field order or type shows up here, not as a crash.
    #[test]
    fn property_layouts() {
        assert_eq!(size_of::<PropsV6>(), 48); // 3 pointer-sized fields + 6 ints (latency is a 4-byte float)
        assert_eq!(size_of::<PropsV7>(), 56);
        assert_eq!(offset_of!(PropsV8, reg_is_global), 28);
        assert_eq!(offset_of!(PropsV8, net_device_version), 56);
        assert_eq!(size_of::<PropsV8>(), 64);
        assert_eq!(offset_of!(PropsV9, force_flush), 32);
        assert_eq!(offset_of!(PropsV9, v_props), 64);
        assert_eq!(offset_of!(PropsV9, max_p2p_bytes), 88);
        assert_eq!(size_of::<PropsV9>(), 104);
        assert_eq!(size_of::<DeviceHandle>(), 32);
        // v11: v9's 104 bytes + maxMultiRequestSize, padded to 8.
        assert_eq!(offset_of!(PropsV11, max_multi_request_size), 104);
        assert_eq!(size_of::<PropsV11>(), 112);
        // v12: the 8-device vProps (36 bytes at 64) pushes maxP2pBytes to 104.
        assert_eq!(offset_of!(PropsV12, max_p2p_bytes), 104);
        assert_eq!(offset_of!(PropsV12, max_multi_request_size), 120);
        assert_eq!(offset_of!(PropsV12, rail_id), 124);
        assert_eq!(offset_of!(PropsV12, plane_id), 126);
        assert_eq!(size_of::<PropsV12>(), 128);
    }

    #[test]
    fn table_layouts() {
        // name + one pointer per function: 16 in v6, +getDeviceMr and
        // irecvConsumed in v7/v8, +makeVDevice in v9/v10.
        assert_eq!(size_of::<NetV6>(), 8 * 17);
        assert_eq!(size_of::<NetV7>(), 8 * 19);
        assert_eq!(size_of::<NetV8>(), 8 * 19);
        assert_eq!(size_of::<NetV9>(), 8 * 20);
        assert_eq!(size_of::<NetV10>(), 8 * 20);
        assert_eq!(offset_of!(NetV10, test), 8 * 13);
        assert_eq!(offset_of!(NetV9, make_vdevice), 8 * 19);
        // v11/v12: v10's entries + finalize and setNetAttr.
        assert_eq!(size_of::<NetV11>(), 8 * 22);
        assert_eq!(size_of::<NetV12>(), 8 * 22);
        assert_eq!(offset_of!(NetV12, test), 8 * 13);
        assert_eq!(offset_of!(NetV12, set_net_attr), 8 * 21);
    }
}
