//! Communicator handles are never reused: a destroyed communicator's handle
//! is refused even after later communicators were created, whatever memory
//! they took. (When handles were the communicator's address, a new
//! communicator allocated where a destroyed one had been made the old handle
//! drive it silently.)

mod common;

use common::ok;
use nccl::abi::*;
use nccl::*;
use std::collections::HashSet;
use std::ptr::null_mut;

fn init_one() -> ncclComm_t {
    let mut c: ncclComm_t = null_mut();
    // SAFETY: room for one handle.
    ok(
        unsafe { ncclCommInitAll(&mut c, 1, std::ptr::null()) },
        "ncclCommInitAll",
    );
    c
}

fn count(c: ncclComm_t) -> ncclResult_t {
    let mut n = -1;
    // SAFETY: n is writable; c may be stale, which is what is checked.
    unsafe { ncclCommCount(c, &mut n) }
}

#[test]
fn destroyed_handles_stay_refused_after_new_communicators() {
    // 64 create/destroy rounds of the same size: with address handles the
    // allocator hands the same memory back, and so the same handle.
    let mut old = Vec::new();
    for _ in 0..64 {
        let c = init_one();
        old.push(c);
        // SAFETY: a live handle, destroyed once.
        ok(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy");
    }
    let live = init_one();
    let distinct: HashSet<usize> = old.iter().map(|&c| c as usize).collect();
    assert_eq!(distinct.len(), old.len(), "a handle was given twice");
    for &c in &old {
        assert_ne!(
            c, live,
            "the live communicator got a destroyed one's handle"
        );
        assert_eq!(count(c), ncclInvalidUsage, "destroyed handle {c:p}");
        // SAFETY: NULL asks for the process's last error.
        let msg = unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(null_mut())) };
        assert!(
            msg.to_string_lossy()
                .contains("already destroyed or aborted"),
            "{msg:?}"
        );
    }
    assert_eq!(count(live), ncclSuccess);
    // A pointer this library never made is a bad argument, not a stale one.
    let mut x = 0u64;
    assert_eq!(count(&mut x as *mut u64 as ncclComm_t), ncclInvalidArgument);
    // SAFETY: live, destroyed once.
    ok(unsafe { ncclCommDestroy(live) }, "ncclCommDestroy");
    assert_eq!(count(live), ncclInvalidUsage);
}
