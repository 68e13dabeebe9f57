//! `libnccl.so.2`: NCCL's C API over oxccl (see `docs/c-abi.md`).
//!
//! A shell and nothing else: every exported function is a panic boundary
//! around an implementation in `api` that checks its arguments, casts
//! handles through the registry in `handle.rs`, and calls the `oxccl` Rust
//! API. Errors become `ncclResult_t` values, a WARN line and the text of
//! `ncclGetLastError`.
//!
//! Each function is exported twice, as `ncclX` and as its profiling twin
//! `pncclX`, both calling the same implementation (NCCL's PMPI-style pair).
//!
//! Host buffers (and every buffer when there is no CUDA driver) go to the
//! host backend: the `cudaStream_t` argument is ignored and the operation has
//! completed when its call returns. Collectives and send/receive on device
//! buffers go to the communicator's GPU path (`oxccl::gpu`: routing, checks,
//! launches on the caller's stream); this crate never calls CUDA itself
//! (see `docs/c-abi.md`).

#![allow(non_snake_case)]

pub mod abi;
mod api;
mod config;
mod group;
mod handle;
mod limits;
mod team;
mod window;

use abi::*;
use oxccl::{CollKind, Error, ErrorKind, Result};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// Logs `e` for the call `name` (WARN, process and per-communicator last
/// error) and returns its `ncclResult_t`.
fn report(name: &str, e: &Error) -> ncclResult_t {
    let touched = handle::take_touched();
    if e.kind() == ErrorKind::InProgress {
        return ncclInProgress;
    }
    let text = if e.message().starts_with(name) {
        e.message().to_string()
    } else {
        format!("{name}: {}", e.message())
    };
    // The line that found the error, not this one (every error's WARN
    // would name this function otherwise).
    let at = e.origin();
    oxccl_env::log::log(
        oxccl_env::log::Level::Warn,
        oxccl_env::log::Subsys::ALL,
        at.file(),
        at.line(),
        format_args!("{text}"),
    );
    for c in touched {
        c.set_last_error(&text);
    }
    e.kind().code()
}

/// The panic boundary of a function returning `ncclResult_t`.
fn guard(name: &str, f: impl FnOnce() -> Result<()>) -> ncclResult_t {
    handle::clear_touched();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            handle::clear_touched();
            ncclSuccess
        }
        Ok(Err(e)) => report(name, &e),
        Err(p) => report(
            name,
            &Error::internal(format!("internal error (panic): {}", panic_text(&*p))),
        ),
    }
}

/// The panic boundary of a function returning something else: `fallback` on panic.
fn guard_value<R>(name: &str, fallback: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            report(
                name,
                &Error::internal(format!("internal error (panic): {}", panic_text(&*p))),
            );
            fallback
        }
    }
}

/// Defines `ncclX` and `pncclX`, both running `$body` behind [`guard`].
macro_rules! nccl_api {
    ($(#[$doc:meta])* $name:ident / $pname:ident ( $($a:ident : $t:ty),* $(,)? ) $body:block) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Pointer arguments as NCCL's API requires (NULL is checked, not dereferenced).
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> ncclResult_t {
            guard(stringify!($name), || $body)
        }
        #[doc = concat!("Profiling twin of [`", stringify!($name), "`].")]
        ///
        /// # Safety
        #[doc = concat!("As [`", stringify!($name), "`].")]
        #[no_mangle]
        pub unsafe extern "C" fn $pname($($a: $t),*) -> ncclResult_t {
            guard(stringify!($name), || $body)
        }
    };
}

/// If `arg` is a live communicator handle, its last-error text gets this call's error.
fn touch_if_comm(arg: &dyn std::any::Any) {
    if let Some(&h) = arg.downcast_ref::<ncclComm_t>() {
        if let Some(c) = handle::peek(h) {
            handle::touch(&c);
        }
    }
}

/// An exported function that refuses every call, whatever its arguments.
#[derive(Debug, Clone, Copy)]
pub struct Refusal {
    /// The function (its `pnccl` twin refuses the same way).
    pub name: &'static str,
    /// What every call returns.
    pub result: ncclResult_t,
    /// The WARN line's and `ncclGetLastError`'s text.
    pub message: &'static str,
}

/// The text of a refused call to `$name`.
macro_rules! refusal_text {
    ($name:ident) => {
        concat!(stringify!($name), " is not supported by oxccl yet")
    };
}

/// Defines not-yet-supported function pairs (`ncclInvalidUsage`, a WARN and
/// a last-error text) and [`REFUSED`], the list of them that
/// `docs/compatibility.md` is generated from.
macro_rules! nccl_unsupported {
    ($($name:ident / $pname:ident ( $($a:ident : $t:ty),* $(,)? );)*) => {
        /// Every exported function that refuses all calls (`docs/compatibility.md`).
        pub const REFUSED: &[Refusal] = &[$(Refusal {
            name: stringify!($name),
            result: ncclInvalidUsage,
            message: refusal_text!($name),
        }),*];
        $(nccl_api! {
            #[doc = concat!("Not supported by oxccl yet: returns `ncclInvalidUsage` (`", stringify!($name), "`).")]
            $name / $pname ($($a: $t),*) {
                $(touch_if_comm(&$a);)*
                Err(Error::invalid_usage(refusal_text!($name)))
            }
        })*
    };
}

// ---- version, errors ---------------------------------------------------------

nccl_api! {
    /// The library version, `NCCL_VERSION_CODE` of `include/nccl.h` (22705).
    ncclGetVersion / pncclGetVersion(version: *mut c_int) {
        // SAFETY: `version` is NULL (refused) or a writable int, as nccl.h requires.
        unsafe { api::get_version(version) }
    }
}

/// NCCL's text for a result code ("unknown result code" for others).
pub fn error_string(code: ncclResult_t) -> &'static CStr {
    match code {
        0 => c"no error",
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the NCCL developers",
        4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        8 => c"timeout",
        _ => c"unknown result code",
    }
}

/// `ncclGetErrorString`: a static string for every value.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    error_string(result).as_ptr()
}
/// Profiling twin of [`ncclGetErrorString`].
#[no_mangle]
pub extern "C" fn pncclGetErrorString(result: ncclResult_t) -> *const c_char {
    error_string(result).as_ptr()
}

thread_local! {
    static LAST_ERROR_BUF: RefCell<CString> = RefCell::new(CString::default());
}

fn last_error(comm: ncclComm_t) -> *const c_char {
    guard_value("ncclGetLastError", c"".as_ptr(), || {
        let per_comm = if comm.is_null() {
            None
        } else {
            handle::peek(comm).and_then(|c| handle::lock(&c.last_error).clone())
        };
        let text = per_comm.or_else(oxccl_env::last_error).unwrap_or_default();
        let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
        // The text stays valid until this thread calls ncclGetLastError again.
        LAST_ERROR_BUF.with(|b| {
            *b.borrow_mut() = c;
            b.borrow().as_ptr()
        })
    })
}

/// `ncclGetLastError`: the last error reported on `comm` (NULL: on the
/// calling thread, or in this process when that thread has seen none). The
/// string stays valid until the calling thread calls it again.
///
/// # Safety
/// `comm` is NULL or any pointer (unknown handles fall back to the process's text).
#[no_mangle]
pub unsafe extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    last_error(comm)
}
/// Profiling twin of [`ncclGetLastError`].
///
/// # Safety
/// As [`ncclGetLastError`].
#[no_mangle]
pub unsafe extern "C" fn pncclGetLastError(comm: ncclComm_t) -> *const c_char {
    last_error(comm)
}

/// `ncclResetDebugInit` (deprecated in NCCL): nothing to reset here.
#[no_mangle]
pub extern "C" fn ncclResetDebugInit() {}
/// Profiling twin of [`ncclResetDebugInit`].
#[no_mangle]
pub extern "C" fn pncclResetDebugInit() {}

// ---- communicators -------------------------------------------------------------

nccl_api! {
    /// A new unique id; this process runs the rendezvous root for it.
    ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut ncclUniqueId) {
        // SAFETY: `uniqueId` is NULL (refused) or a writable ncclUniqueId, as nccl.h requires.
        unsafe { api::get_unique_id(uniqueId) }
    }
}
nccl_api! {
    /// Joins rank `rank` of `nranks` (blocking).
    ncclCommInitRank / pncclCommInitRank(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int) {
        // SAFETY: `comm` is NULL (refused) or a writable handle slot; a NULL config means the
        // defaults.
        unsafe { api::init_rank_config(comm, nranks, commId, rank, std::ptr::null()) }
    }
}
nccl_api! {
    /// Joins with a config (`blocking = 0`: returns `ncclInProgress`, poll `ncclCommGetAsyncError`).
    ncclCommInitRankConfig / pncclCommInitRankConfig(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t) {
        // SAFETY: `comm` is NULL (refused) or a writable handle slot; `config` is NULL or an
        // ncclConfig_t whose `size` field bounds what is read.
        unsafe { api::init_rank_config(comm, nranks, commId, rank, config as *const u8) }
    }
}
nccl_api! {
    /// Joins with several root ids: all ranks meet at the first one's root.
    ncclCommInitRankScalable / pncclCommInitRankScalable(newcomm: *mut ncclComm_t, nranks: c_int, myrank: c_int, nId: c_int, commIds: *mut ncclUniqueId, config: *mut ncclConfig_t) {
        // SAFETY: `newcomm` is NULL (refused) or writable; `commIds` points at `nId` readable ids;
        // `config` is NULL or a sized ncclConfig_t.
        unsafe { api::init_rank_scalable(newcomm, nranks, myrank, nId, commIds, config as *const u8) }
    }
}
nccl_api! {
    /// `ndev` ranks of one communicator in this process.
    ncclCommInitAll / pncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) {
        // SAFETY: `comm` has room for `ndev` handles; `devlist` is NULL or `ndev` readable ints
        // (nccl.h's contract).
        unsafe { api::init_all(comm, ndev, devlist) }
    }
}
nccl_api! {
    /// Waits for pending work (initialisation) to finish.
    ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) {
        api::comm_finalize(comm)
    }
}
nccl_api! {
    /// Frees the communicator; the handle is invalid afterwards.
    ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) {
        api::comm_destroy(comm)
    }
}
nccl_api! {
    /// Stops the communicator's operations now and frees it.
    ncclCommAbort / pncclCommAbort(comm: ncclComm_t) {
        api::comm_abort(comm)
    }
}
nccl_api! {
    /// A new communicator of the ranks with the same `color` (`NCCL_SPLIT_NOCOLOR`: `*newcomm = NULL`).
    ncclCommSplit / pncclCommSplit(comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) {
        // SAFETY: `newcomm` is NULL (refused) or writable; `config` is NULL or a sized
        // ncclConfig_t; `comm` is looked up, never dereferenced.
        unsafe { api::comm_split(comm, color, key, newcomm, config as *const u8) }
    }
}
nccl_api! {
    /// Registers every rank's buffer together (collective); peers' buffers become reachable where they can be.
    ncclCommWindowRegister / pncclCommWindowRegister(comm: ncclComm_t, buff: *mut c_void, size: usize, win: *mut ncclWindow_t, winFlags: c_int) {
        // SAFETY: `win` is NULL (refused) or writable; `buff` is only compared and exported,
        // `size` bytes as the caller registered them.
        unsafe { window::register(comm, buff, size, win, winFlags) }
    }
}
nccl_api! {
    /// Forgets a window and unmaps its peers' buffers.
    ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) {
        window::deregister(comm, win)
    }
}
nccl_api! {
    /// LSA rank `lsaRank`'s window at `offset` as an address here (a rank of this rank's host).
    ncclGetLsaDevicePointer / pncclGetLsaDevicePointer(window: ncclWindow_t, offset: usize, lsaRank: c_int, outPtr: *mut *mut c_void) {
        // SAFETY: `outPtr` is NULL (refused) or writable; `window` is looked up in the registry,
        // never dereferenced.
        unsafe { window::lsa_ptr(window, offset, lsaRank, outPtr) }
    }
}
nccl_api! {
    /// The buffer this rank registered in `win`.
    ncclWinGetUserPtr / pncclWinGetUserPtr(comm: ncclComm_t, win: ncclWindow_t, outUserPtr: *mut *mut c_void) {
        // SAFETY: `outUserPtr` is NULL (refused) or writable; `comm` and `win` are looked up,
        // never dereferenced.
        unsafe { window::user_ptr(comm, win, outUserPtr) }
    }
}
nccl_api! {
    /// Rank `peer`'s window at `offset` as an address here, NULL where it cannot be reached by loads and stores.
    ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(window: ncclWindow_t, offset: usize, peer: c_int, outPtr: *mut *mut c_void) {
        // SAFETY: `outPtr` is NULL (refused) or writable; `window` is looked up in the registry,
        // never dereferenced.
        unsafe { window::peer_ptr(window, offset, peer, outPtr) }
    }
}
nccl_api! {
    /// A fresh id to grow `comm` with (one at a time).
    ncclCommGetUniqueId / pncclCommGetUniqueId(comm: ncclComm_t, uniqueId: *mut ncclUniqueId) {
        // SAFETY: `uniqueId` is NULL (refused) or a writable ncclUniqueId; `comm` is looked up,
        // never dereferenced.
        unsafe { api::comm_get_unique_id(comm, uniqueId) }
    }
}
nccl_api! {
    /// Adds ranks: existing ones pass `comm` and rank -1 (one of them the id), new ones NULL, the id and their rank.
    ncclCommGrow / pncclCommGrow(comm: ncclComm_t, nRanks: c_int, uniqueId: *const ncclUniqueId, rank: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) {
        // SAFETY: `newcomm` is NULL (refused) or writable; `uniqueId` is NULL or a readable id;
        // `config` is NULL or a sized ncclConfig_t.
        unsafe { api::comm_grow(comm, nRanks, uniqueId, rank, newcomm, config as *const u8) }
    }
}
nccl_api! {
    /// Stops the rank's operations in flight and refuses later ones (split, shrink, destroy, abort still work).
    ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) {
        api::comm_revoke(comm, revokeFlags)
    }
}
nccl_api! {
    /// A new communicator of the ranks not in `excludeRanksList`, in parent order (they call it; the excluded do not).
    ncclCommShrink / pncclCommShrink(comm: ncclComm_t, excludeRanksList: *mut c_int, excludeRanksCount: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, shrinkFlags: c_int) {
        // SAFETY: `excludeRanksList` holds `excludeRanksCount` readable ints (only read);
        // `newcomm` is NULL (refused) or writable; `config` is NULL or sized.
        unsafe { api::comm_shrink(comm, excludeRanksList, excludeRanksCount, newcomm, config as *const u8, shrinkFlags) }
    }
}
nccl_api! {
    /// `ncclSuccess`, `ncclInProgress` while initialising, or the error the communicator is in.
    ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) {
        // SAFETY: `asyncError` is NULL (refused) or a writable ncclResult_t.
        unsafe { api::comm_get_async_error(comm, asyncError) }
    }
}
nccl_api! {
    /// Number of ranks.
    ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) {
        // SAFETY: `count` is NULL (refused) or a writable int.
        unsafe { api::comm_count(comm, count) }
    }
}
nccl_api! {
    /// The CUDA device current at creation; without one, the rank's index among this process's ranks.
    ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) {
        // SAFETY: `device` is NULL (refused) or a writable int.
        unsafe { api::comm_cu_device(comm, device) }
    }
}
nccl_api! {
    /// This rank.
    ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) {
        // SAFETY: `rank` is NULL (refused) or a writable int.
        unsafe { api::comm_user_rank(comm, rank) }
    }
}

// ---- memory and registration ---------------------------------------------------

nccl_api! {
    /// Device memory of the current CUDA context (`cuMemAlloc`); without one, zeroed host memory aligned to 4096 bytes.
    ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) {
        // SAFETY: `ptr` is NULL (refused) or a writable pointer slot.
        unsafe { api::mem_alloc(ptr, size) }
    }
}
nccl_api! {
    /// Frees memory of `ncclMemAlloc` (NULL: nothing).
    ncclMemFree / pncclMemFree(ptr: *mut c_void) {
        api::mem_free(ptr)
    }
}
nccl_api! {
    /// Host memory needs no registration: returns a handle for `ncclCommDeregister`.
    ncclCommRegister / pncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: usize, handle: *mut *mut c_void) {
        // SAFETY: `handle` is NULL (refused) or a writable pointer slot; `buff` is recorded, not
        // dereferenced.
        unsafe { api::comm_register(comm, buff, size, handle) }
    }
}
nccl_api! {
    /// Forgets a handle of `ncclCommRegister`.
    ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) {
        api::comm_deregister(comm, handle)
    }
}

// ---- reduction ops ---------------------------------------------------------------

nccl_api! {
    /// A pre-multiplied sum: `ncclScalarHostImmediate` reads `*scalar` now,
    /// `ncclScalarDevice` at every operation (host memory here).
    ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(op: *mut ncclRedOp_t, scalar: *mut c_void, datatype: ncclDataType_t, residence: ncclScalarResidence_t, comm: ncclComm_t) {
        // SAFETY: `op` is NULL (refused) or writable; `scalar` points at one element of `datatype`
        // (host memory, or device memory for ncclScalarDevice).
        unsafe { api::red_op_create_pre_mul_sum(op, scalar, datatype, residence, comm) }
    }
}
nccl_api! {
    /// Frees an op of `ncclRedOpCreatePreMulSum`.
    ncclRedOpDestroy / pncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) {
        api::red_op_destroy(op, comm)
    }
}

// ---- collectives -----------------------------------------------------------------

nccl_api! {
    /// `recvbuff` on `root` = op over ranks of `sendbuff` (in place: `sendbuff == recvbuff`).
    ncclReduce / pncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        // SAFETY: the buffers hold `count` elements of `datatype` (the receive buffer on `root`),
        // valid until the stream reaches the operation (NCCL's contract).
        unsafe { api::collective(CollKind::Reduce, sendbuff, recvbuff, count, datatype, Some(op), Some(root), comm, stream) }
    }
}
nccl_api! {
    /// In-place broadcast of `buff` from `root`.
    ncclBcast / pncclBcast(buff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        // SAFETY: `buff` holds `count` elements of `datatype`, valid until the stream reaches the
        // operation (NCCL's contract).
        unsafe { api::collective(CollKind::Broadcast, buff, buff, count, datatype, None, Some(root), comm, stream) }
    }
}
nccl_api! {
    /// `root`'s `sendbuff` into every `recvbuff`.
    ncclBroadcast / pncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        // SAFETY: `sendbuff` (on `root`) and `recvbuff` hold `count` elements of `datatype`, valid
        // until the stream reaches the operation.
        unsafe { api::collective(CollKind::Broadcast, sendbuff, recvbuff, count, datatype, None, Some(root), comm, stream) }
    }
}
nccl_api! {
    /// `recvbuff` = op over ranks of `sendbuff` (device buffers: on the GPUs, on `stream`).
    ncclAllReduce / pncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) {
        // SAFETY: both buffers hold `count` elements of `datatype`, valid until the stream reaches
        // the operation (NCCL's contract).
        unsafe { api::collective(CollKind::AllReduce, sendbuff, recvbuff, count, datatype, Some(op), None, comm, stream) }
    }
}
nccl_api! {
    /// Block `rank` of the reduction into `recvbuff` (in place: `recvbuff == sendbuff + rank*recvcount`).
    ncclReduceScatter / pncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) {
        // SAFETY: `sendbuff` holds ranks x `recvcount` elements and `recvbuff` `recvcount`, valid
        // until the stream reaches the operation.
        unsafe { api::collective(CollKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, Some(op), None, comm, stream) }
    }
}
nccl_api! {
    /// Every rank's `sendbuff` into block `rank` of `recvbuff` (in place: `sendbuff == recvbuff + rank*sendcount`).
    ncclAllGather / pncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) {
        // SAFETY: `sendbuff` holds `sendcount` elements and `recvbuff` ranks x `sendcount`, valid
        // until the stream reaches the operation.
        unsafe { api::collective(CollKind::AllGather, sendbuff, recvbuff, sendcount, datatype, None, None, comm, stream) }
    }
}
nccl_api! {
    /// Block q of `sendbuff` to rank q; `count` elements per peer.
    ncclAlltoAll / pncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) {
        // SAFETY: both buffers hold ranks x `count` elements of `datatype`, valid until the stream
        // reaches the operation.
        unsafe { api::collective(CollKind::AllToAll, sendbuff, recvbuff, count, datatype, None, None, comm, stream) }
    }
}
nccl_api! {
    /// Every rank's `sendbuff` into block `rank` of `root`'s `recvbuff`.
    ncclGather / pncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        // SAFETY: `sendbuff` holds `count` elements, `recvbuff` on `root` ranks x `count`, valid
        // until the stream reaches the operation.
        unsafe { api::collective(CollKind::Gather, sendbuff, recvbuff, count, datatype, None, Some(root), comm, stream) }
    }
}
nccl_api! {
    /// Block `rank` of `root`'s `sendbuff` into every `recvbuff`.
    ncclScatter / pncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        // SAFETY: `sendbuff` on `root` holds ranks x `count` elements, `recvbuff` `count`, valid
        // until the stream reaches the operation.
        unsafe { api::collective(CollKind::Scatter, sendbuff, recvbuff, count, datatype, None, Some(root), comm, stream) }
    }
}
nccl_api! {
    /// Sends `count` elements to `peer`.
    ncclSend / pncclSend(sendbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        // SAFETY: `sendbuff` holds `count` elements of `datatype`, readable until the stream
        // reaches the send; no receive buffer.
        unsafe { api::collective(CollKind::Send, sendbuff, std::ptr::null_mut(), count, datatype, None, Some(peer), comm, stream) }
    }
}
nccl_api! {
    /// Receives `count` elements from `peer`.
    ncclRecv / pncclRecv(recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        // SAFETY: `recvbuff` holds `count` elements of `datatype`, writable until the stream
        // reaches the receive; no send buffer.
        unsafe { api::collective(CollKind::Recv, std::ptr::null(), recvbuff, count, datatype, None, Some(peer), comm, stream) }
    }
}

// ---- groups --------------------------------------------------------------------------

nccl_api! {
    /// Opens a group level on this thread.
    ncclGroupStart / pncclGroupStart() {
        api::group_start()
    }
}
nccl_api! {
    /// Closes a group level; the outermost runs deferred creations, then the queued operations.
    ncclGroupEnd / pncclGroupEnd() {
        api::group_end()
    }
}
nccl_api! {
    /// Closes a group level without running its operations; the estimate is not supported yet.
    ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) {
        // SAFETY: `simInfo` is NULL (refused) or an initialised ncclSimInfo_t (its magic
        // is checked before anything is written).
        unsafe { api::group_simulate_end(simInfo) }
    }
}

// ---- not supported yet -------------------------------------------------------------

nccl_unsupported! {
    ncclCommSuspend / pncclCommSuspend(comm: ncclComm_t, flags: c_int);
    ncclCommResume / pncclCommResume(comm: ncclComm_t);
    ncclCommMemStats / pncclCommMemStats(comm: ncclComm_t, stat: ncclCommMemStat_t, value: *mut u64);
    ncclPutSignal / pncclPutSignal(localbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int, peerWin: ncclWindow_t, peerWinOffset: usize, sigIdx: c_int, ctx: c_int, flags: u32, comm: ncclComm_t, stream: cudaStream_t);
    ncclSignal / pncclSignal(peer: c_int, sigIdx: c_int, ctx: c_int, flags: u32, comm: ncclComm_t, stream: cudaStream_t);
    ncclWaitSignal / pncclWaitSignal(nDesc: c_int, signalDescs: *mut ncclWaitSignalDesc_t, comm: ncclComm_t, stream: cudaStream_t);
    ncclCommQueryProperties / pncclCommQueryProperties(comm: ncclComm_t, props: *mut ncclCommProperties_t);
    ncclDevCommCreate / pncclDevCommCreate(comm: ncclComm_t, reqs: *const ncclDevCommRequirements_t, outDevComm: *mut ncclDevComm_t);
    ncclDevCommDestroy / pncclDevCommDestroy(comm: ncclComm_t, devComm: *const ncclDevComm_t);
    ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(window: ncclWindow_t, offset: usize, outPtr: *mut *mut c_void);
}

/// This rank and every rank's host, for the teams.
fn comm_hosts(comm: ncclComm_t) -> Result<(usize, Vec<u64>)> {
    let c = handle::lookup(comm, "comm")?.wait()?;
    Ok((c.rank(), oxccl::abi_support::hosts(&c)?))
}

/// A team of `comm` made by `f` from (rank, hosts); a zeroed team and a
/// WARN (and the last-error text) when `comm` is not a ready communicator.
fn team_of(name: &str, comm: ncclComm_t, f: fn(usize, &[u64]) -> ncclTeam_t) -> ncclTeam_t {
    guard_value(name, ncclTeam_t::default(), || {
        handle::clear_touched();
        match comm_hosts(comm) {
            Ok((rank, hosts)) => f(rank, &hosts),
            Err(e) => {
                report(name, &e);
                ncclTeam_t::default()
            }
        }
    })
}

fn team_world(name: &str, comm: ncclComm_t) -> ncclTeam_t {
    team_of(name, comm, |r, h| team::world(r, h.len()))
}

fn team_lsa(name: &str, comm: ncclComm_t) -> ncclTeam_t {
    team_of(name, comm, team::lsa_team)
}

fn team_rail(name: &str, comm: ncclComm_t) -> ncclTeam_t {
    team_of(name, comm, team::rail_team)
}

/// A team rank as a world rank, or (`lsa`) as an LSA rank; -1 with a WARN
/// for a bad communicator, team or rank, and -1 without one for a rank
/// outside this rank's LSA team (an answer, not an error).
fn team_rank(name: &str, comm: ncclComm_t, t: ncclTeam_t, r: c_int, lsa: bool) -> c_int {
    guard_value(name, -1, || {
        handle::clear_touched();
        let w = comm_hosts(comm).and_then(|(rank, hosts)| {
            let w = team::to_world(rank, hosts.len(), t, r)?;
            Ok((w, team::lsa(rank, &hosts)))
        });
        match w {
            Ok((w, _)) if !lsa => w as c_int,
            Ok((w, (base, size))) if (base..base + size).contains(&w) => (w - base) as c_int,
            Ok(_) => -1,
            Err(e) => {
                report(name, &e);
                -1
            }
        }
    })
}

fn team_to_world(name: &str, comm: ncclComm_t, t: ncclTeam_t, r: c_int) -> c_int {
    team_rank(name, comm, t, r, false)
}

fn team_to_lsa(name: &str, comm: ncclComm_t, t: ncclTeam_t, r: c_int) -> c_int {
    team_rank(name, comm, t, r, true)
}

/// Defines the team functions (they return by value: errors are a WARN,
/// the last-error text and a zeroed team or -1).
macro_rules! nccl_team {
    ($($(#[$doc:meta])* $name:ident / $pname:ident ( $($a:ident : $t:ty),* ) -> $ret:ty = $f:ident;)*) => {
        $(
            $(#[$doc])*
            #[no_mangle]
            pub extern "C" fn $name($($a: $t),*) -> $ret {
                $f(stringify!($name), $($a),*)
            }
            #[doc = concat!("Profiling twin of [`", stringify!($name), "`].")]
            #[no_mangle]
            pub extern "C" fn $pname($($a: $t),*) -> $ret {
                $f(stringify!($name), $($a),*)
            }
        )*
    };
}

nccl_team! {
    /// Every rank: `{nRanks, rank, 1}`.
    ncclTeamWorld / pncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t = team_world;
    /// The consecutive ranks on this rank's host.
    ncclTeamLsa / pncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t = team_lsa;
    /// This rank's LSA index on every host (equal blocks of distinct hosts), else this rank alone.
    ncclTeamRail / pncclTeamRail(comm: ncclComm_t) -> ncclTeam_t = team_rail;
    /// The world rank of team rank `rank`.
    ncclTeamRankToWorld / pncclTeamRankToWorld(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int = team_to_world;
    /// The LSA rank of team rank `rank`, -1 outside this rank's LSA team.
    ncclTeamRankToLsa / pncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int = team_to_lsa;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_internal_error_with_a_message() {
        let r = guard("ncclTestPanic", || panic!("boom"));
        assert_eq!(r, ncclInternalError);
        let text = oxccl_env::last_error().unwrap_or_default();
        assert!(
            text.contains("ncclTestPanic") && text.contains("boom"),
            "{text}"
        );
        assert_eq!(guard_value("ncclTestPanic", 7, || panic!("again")), 7);
    }

    #[test]
    fn in_progress_is_not_an_error_report() {
        let r = guard("ncclTestInProgress", || {
            Err(Error::new(ErrorKind::InProgress, ""))
        });
        assert_eq!(r, ncclInProgress);
    }
}
