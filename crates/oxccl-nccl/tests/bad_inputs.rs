//! Inputs that once were taken without a word or ran away, through the C ABI:
//! `ncclCommInitAll` with more ranks than the process can run,
//! `NCCL_BUFFSIZE=64G`, and timeouts of 0 (which failed every init at once;
//! 0 now means no timeout). The settings are this test binary's environment,
//! set before the first call reads it.

mod common;

use common::ok;
use nccl::abi::*;
use nccl::*;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

const FLOAT32: i32 = 7;
const SUM: i32 = 0;

fn set_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: set once, before any thread of the library reads the environment.
        unsafe {
            std::env::set_var("NCCL_BUFFSIZE", "64G");
            std::env::set_var("OXCCL_TIMEOUT_MS", "0");
            std::env::set_var("OXCCL_INIT_TIMEOUT_MS", "0");
        }
    });
}

/// Two ranks in one thread: init, a checked all-reduce, destroy.
fn two_ranks_all_reduce() {
    let mut comms = [null_mut(); 2];
    // SAFETY: room for two handles.
    ok(
        unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) },
        "ncclCommInitAll",
    );
    let n = 100_003;
    let mut bufs: Vec<Vec<f32>> = (0..2).map(|r| vec![r as f32 + 1.0; n]).collect();
    // SAFETY: ncclGroupStart takes no arguments; it only opens a group level on this thread.
    ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
    for (r, b) in bufs.iter_mut().enumerate() {
        let p = b.as_mut_ptr().cast();
        // SAFETY: host buffers of n floats, live until the group ends.
        ok(
            unsafe { ncclAllReduce(p, p, n, FLOAT32, SUM, comms[r], null_mut()) },
            "ncclAllReduce",
        );
    }
    // SAFETY: the group holds the two all-reduces queued above, whose buffers (`bufs`) and
    // communicators stay alive until it ends here.
    ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd");
    for b in &bufs {
        assert!(b.iter().all(|&v| v == 3.0));
    }
    for c in comms {
        // SAFETY: live handles, destroyed once.
        ok(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy");
    }
}

#[test]
fn zero_timeouts_mean_no_timeout_and_a_huge_buffsize_is_refused() {
    set_env();
    let p = oxccl_env::params();
    // 0 is no timeout (it used to fail every init at once).
    assert_eq!(
        p.get(&oxccl_core::params::TIMEOUT_MS),
        oxccl_core::params::NO_TIMEOUT
    );
    assert_eq!(
        p.get(&oxccl_core::params::INIT_TIMEOUT_MS),
        oxccl_core::params::NO_TIMEOUT
    );
    // 64G is refused with a warning naming the range; the default is used.
    assert_eq!(p.get(&oxccl_core::params::BUFFSIZE), 4 << 20);
    let w = p.warnings();
    assert!(
        w.iter()
            .any(|w| w.contains("'64G' for NCCL_BUFFSIZE") && w.contains("4K to 1G")),
        "{w:?}"
    );
    two_ranks_all_reduce();
}

#[test]
fn init_all_with_more_ranks_than_the_process_can_run_is_refused() {
    set_env();
    let n = 10_000;
    let mut comms = vec![null_mut(); n];
    let t0 = Instant::now();
    // SAFETY: room for n handles.
    let r = unsafe { ncclCommInitAll(comms.as_mut_ptr(), n as i32, std::ptr::null()) };
    assert_eq!(r, ncclInvalidArgument);
    // Refused before any rank starts (it used to run for minutes).
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(comms.iter().all(|c| c.is_null()));
    // SAFETY: a NULL comm asks for the process's last error.
    let msg = unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned();
    assert!(
        msg.contains("ndev 10000") && msg.contains("more ranks than this process can run"),
        "{msg}"
    );
}
