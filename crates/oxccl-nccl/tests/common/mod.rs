//! Helpers the C-API tests on host buffers share.

use nccl::abi::*;
use nccl::*;
use std::ffi::CStr;

/// Asserts success, printing the library's last error otherwise.
#[track_caller]
pub fn ok(r: ncclResult_t, what: &str) {
    assert_eq!(r, ncclSuccess, "{what}: {}", last(std::ptr::null_mut()));
}

/// `ncclGetLastError(c)` as a string.
pub fn last(c: ncclComm_t) -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string.
    unsafe { CStr::from_ptr(ncclGetLastError(c)) }
        .to_string_lossy()
        .into_owned()
}
