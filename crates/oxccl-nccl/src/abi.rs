//! The C types and constants of `include/nccl.h`, as Rust sees them.
//!
//! Enums cross the boundary as plain `c_int`s (`ncclRedOp_t` values made by
//! `ncclRedOpCreatePreMulSum` lie outside the enum, and a caller may pass any
//! integer), so every value is checked before use.

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::ffi::{c_char, c_int};

/// `ncclResult_t`.
pub type ncclResult_t = c_int;
/// `ncclDataType_t`.
pub type ncclDataType_t = c_int;
/// `ncclRedOp_t`.
pub type ncclRedOp_t = c_int;
/// `ncclScalarResidence_t`.
pub type ncclScalarResidence_t = c_int;
/// `ncclCommMemStat_t`.
pub type ncclCommMemStat_t = c_int;

/// The struct behind `ncclComm_t`. Never dereferenced: a handle is only a key
/// into the registry of live communicators (see `handle.rs`).
#[repr(C)]
pub struct ncclComm {
    _opaque: [u8; 0],
}
/// `ncclComm_t`.
pub type ncclComm_t = *mut ncclComm;

/// The struct behind `ncclWindow_t` (opaque: a window handle is a registry key).
#[repr(C)]
pub struct ncclWindow_vidmem {
    _opaque: [u8; 0],
}
/// `ncclWindow_t`.
pub type ncclWindow_t = *mut ncclWindow_vidmem;

/// `cudaStream_t`: accepted and ignored on the host backend.
pub type cudaStream_t = *mut std::ffi::c_void;

pub const ncclSuccess: ncclResult_t = 0;
pub const ncclUnhandledCudaError: ncclResult_t = 1;
pub const ncclSystemError: ncclResult_t = 2;
pub const ncclInternalError: ncclResult_t = 3;
pub const ncclInvalidArgument: ncclResult_t = 4;
pub const ncclInvalidUsage: ncclResult_t = 5;
pub const ncclRemoteError: ncclResult_t = 6;
pub const ncclInProgress: ncclResult_t = 7;
pub const ncclTimeout: ncclResult_t = 8;
pub const ncclNumResults: ncclResult_t = 9;

pub const ncclNumOps: c_int = 5;
pub const ncclNumTypes: c_int = 12;
pub const ncclScalarDevice: c_int = 0;
pub const ncclScalarHostImmediate: c_int = 1;

pub const NCCL_MAJOR: c_int = 2;
pub const NCCL_MINOR: c_int = 27;
pub const NCCL_PATCH: c_int = 5;
/// `NCCL_VERSION(2, 27, 5)`: what the header claims and `ncclGetVersion` returns.
pub const NCCL_VERSION_CODE: c_int = nccl_version(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);

/// `NCCL_VERSION(X, Y, Z)`.
pub const fn nccl_version(x: c_int, y: c_int, z: c_int) -> c_int {
    if x <= 2 && y <= 8 {
        x * 1000 + y * 100 + z
    } else {
        x * 10000 + y * 100 + z
    }
}

pub const NCCL_UNIQUE_ID_BYTES: usize = 128;
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `ncclCommShrink` flags: shrink only; first stop the parent's operations.
pub const NCCL_SHRINK_DEFAULT: c_int = 0;
pub const NCCL_SHRINK_ABORT: c_int = 1;
/// `ncclCommRevoke`'s only flag value.
pub const NCCL_REVOKE_DEFAULT: c_int = 0;
pub const NCCL_API_MAGIC: u32 = 0xcafe_beef;
pub const NCCL_SIM_INFO_MAGIC: u32 = 0x7468_5283;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl Default for ncclUniqueId {
    fn default() -> Self {
        ncclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        }
    }
}

/// `ncclConfig_t` as `include/nccl.h` declares it (NCCL 2.27's layout, 72 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
}

impl Default for ncclConfig_t {
    /// `NCCL_CONFIG_INITIALIZER`.
    fn default() -> Self {
        ncclConfig_t {
            size: std::mem::size_of::<ncclConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE as u32,
            blocking: NCCL_CONFIG_UNDEF_INT,
            cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
            minCTAs: NCCL_CONFIG_UNDEF_INT,
            maxCTAs: NCCL_CONFIG_UNDEF_INT,
            netName: std::ptr::null(),
            splitShare: NCCL_CONFIG_UNDEF_INT,
            trafficClass: NCCL_CONFIG_UNDEF_INT,
            commName: std::ptr::null(),
            collnetEnable: NCCL_CONFIG_UNDEF_INT,
            CTAPolicy: NCCL_CONFIG_UNDEF_INT,
            shrinkShare: NCCL_CONFIG_UNDEF_INT,
            nvlsCTAs: NCCL_CONFIG_UNDEF_INT,
        }
    }
}

/// The longest `ncclConfig_t` the library understands: NCCL 2.30.5+'s layout
/// (96 bytes), a superset of the header's. Callers built against newer NCCL
/// headers (torch 2.15: 2.30.7) pass this; the extra fields are read and
/// validated, and ignored where they mean nothing on the host.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConfigV23005 {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
    pub graphUsageMode: c_int,
    pub numRmaCtx: c_int,
    pub maxP2pPeers: c_int,
    pub graphStreamOrdering: c_int,
}

impl ConfigV23005 {
    /// Every field undefined (what a field absent from the caller's struct reads as).
    pub fn undefined() -> Self {
        let u = NCCL_CONFIG_UNDEF_INT;
        ConfigV23005 {
            size: 0,
            magic: 0,
            version: 0,
            blocking: u,
            cgaClusterSize: u,
            minCTAs: u,
            maxCTAs: u,
            netName: std::ptr::null(),
            splitShare: u,
            trafficClass: u,
            commName: std::ptr::null(),
            collnetEnable: u,
            CTAPolicy: u,
            shrinkShare: u,
            nvlsCTAs: u,
            nChannelsPerNetPeer: u,
            nvlinkCentricSched: u,
            graphUsageMode: u,
            numRmaCtx: u,
            maxP2pPeers: u,
            graphStreamOrdering: u,
        }
    }
}

/// `ncclSimInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub estimatedTime: f32,
}

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclWaitSignalDesc_t {
    pub opCnt: c_int,
    pub peer: c_int,
    pub sigIdx: c_int,
    pub ctx: c_int,
}

/// `ncclTeam_t`, returned by value by the team functions.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ncclTeam_t {
    pub nRanks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}

/// Opaque device-API types (only pointers to them cross the boundary).
#[repr(C)]
pub struct ncclDevComm_t {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ncclDevCommRequirements_t {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ncclCommProperties_t {
    _opaque: [u8; 0],
}

const _: () = {
    assert!(std::mem::size_of::<ncclConfig_t>() == 72);
    assert!(std::mem::size_of::<ConfigV23005>() == 96);
    assert!(std::mem::size_of::<ncclUniqueId>() == 128);
    assert!(NCCL_VERSION_CODE == 22705);
};
