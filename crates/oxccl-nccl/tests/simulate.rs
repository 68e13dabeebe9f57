//! `ncclGroupSimulateEnd` on host buffers: the group's operations are not
//! run (the receive buffers keep their bytes), the estimate is the host
//! tuner's sum over them (positive, growing with size), and the misuses are
//! refused: NULL, a struct without the magic, an inner group level, a group
//! with a failed call. (Device buffers take the GPU model: `gpu_procs`.)

mod common;

use common::ok;
use nccl::abi::*;
use nccl::*;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

fn sim_info() -> ncclSimInfo_t {
    ncclSimInfo_t {
        size: std::mem::size_of::<ncclSimInfo_t>(),
        magic: NCCL_SIM_INFO_MAGIC,
        version: NCCL_VERSION_CODE as u32,
        estimatedTime: -1.0,
    }
}

/// Two ranks of this process driven by this thread (as nccl-tests -g 2):
/// an all-reduce of `count` floats on each inside a simulated group.
fn simulate(comms: &[ncclComm_t; 2], count: usize) -> f32 {
    let send = vec![1.0f32; count];
    let mut recv = [vec![7.0f32; count], vec![7.0f32; count]];
    let mut info = sim_info();
    // SAFETY: the buffers hold `count` floats; the ops are never run.
    unsafe {
        ok(ncclGroupStart(), "ncclGroupStart");
        for (c, r) in comms.iter().zip(recv.iter_mut()) {
            let (s, d) = (
                send.as_ptr() as *const c_void,
                r.as_mut_ptr() as *mut c_void,
            );
            ok(
                ncclAllReduce(s, d, count, 7, 0, *c, null_mut()),
                "ncclAllReduce",
            );
        }
        ok(ncclGroupSimulateEnd(&mut info), "ncclGroupSimulateEnd");
    }
    assert!(
        recv.iter().all(|r| r.iter().all(|&v| v == 7.0)),
        "a simulated all-reduce ran"
    );
    info.estimatedTime
}

#[test]
fn simulate_estimates_without_running() {
    let mut comms: [ncclComm_t; 2] = [null_mut(); 2];
    // SAFETY: room for two handles.
    ok(
        unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) },
        "ncclCommInitAll",
    );
    let mut last_t = 0.0;
    for count in [1usize, 1024, 1 << 20, 16 << 20] {
        let t = simulate(&comms, count);
        assert!(t.is_finite() && t > 0.0, "count {count}: {t}");
        assert!(t > last_t, "count {count}: {t} after {last_t}");
        last_t = t;
    }
    // SAFETY: valid pointers and handles throughout.
    unsafe {
        // Misuses: NULL, no magic, an inner level, a failed call inside.
        assert_eq!(ncclGroupSimulateEnd(null_mut()), ncclInvalidArgument);
        let mut bad = sim_info();
        bad.magic = 1;
        assert_eq!(ncclGroupSimulateEnd(&mut bad), ncclInvalidArgument);
        assert!(
            common::last(null_mut()).contains("NCCL_SIM_INFO_INITIALIZER"),
            "{}",
            common::last(null_mut())
        );
        let mut info = sim_info();
        ok(ncclGroupStart(), "outer");
        ok(ncclGroupStart(), "inner");
        assert_eq!(ncclGroupSimulateEnd(&mut info), ncclInvalidUsage);
        assert!(
            common::last(null_mut()).contains("outermost group only"),
            "{}",
            common::last(null_mut())
        );
        // The inner level closed: the outer one ends normally.
        ok(ncclGroupEnd(), "outer end");
        ok(ncclGroupStart(), "start");
        let x = [0f32; 4];
        let bad_type: c_int = 42;
        let p = x.as_ptr() as *const c_void;
        assert_eq!(
            ncclAllReduce(p, p as *mut c_void, 4, bad_type, 0, comms[0], null_mut()),
            ncclInvalidArgument
        );
        assert_eq!(ncclGroupSimulateEnd(&mut info), ncclInvalidArgument);
        assert!(
            common::last(null_mut()).contains("nothing was simulated"),
            "{}",
            common::last(null_mut())
        );
        // Nothing is left open: a plain group works, and runs.
        let send = [2.0f32; 8];
        let mut recv = [[0f32; 8]; 2];
        ok(ncclGroupStart(), "start");
        for (c, r) in comms.iter().zip(recv.iter_mut()) {
            ok(
                ncclAllReduce(
                    send.as_ptr() as *const c_void,
                    r.as_mut_ptr() as *mut c_void,
                    8,
                    7,
                    0,
                    *c,
                    null_mut(),
                ),
                "ncclAllReduce",
            );
        }
        ok(ncclGroupEnd(), "ncclGroupEnd");
        assert_eq!(recv, [[4.0f32; 8]; 2]);
        for c in comms {
            ok(ncclCommDestroy(c), "ncclCommDestroy");
        }
    }
}
