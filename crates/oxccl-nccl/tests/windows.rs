//! `ncclCommWindowRegister` and friends through the C API, ranks as
//! threads of this process on host memory: every peer's buffer is reachable
//! at its own address (same process), at the offset asked; the bad calls
//! are refused naming the argument; an all-reduce on window buffers works;
//! deregistering twice is refused. (Device buffers of other processes, by
//! CUDA IPC: `gpu_procs::windows_reach_every_peer_of_the_host`.)

mod common;

use common::{last, ok};
use nccl::abi::*;
use nccl::*;
use std::ffi::c_void;
use std::ptr::null_mut;

const N: usize = 3;
const LEN: usize = 1000;

#[test]
fn windows_of_host_buffers_between_threads() {
    // A failed assertion in one thread leaves the others in a collective:
    // let them end in 30 s, not the default 10 minutes. This binary's only
    // test, before its first call reads the settings.
    std::env::set_var("OXCCL_TIMEOUT_MS", "30000");
    let mut id = ncclUniqueId::default();
    // SAFETY: a valid output pointer.
    ok(unsafe { ncclGetUniqueId(&mut id) }, "ncclGetUniqueId");
    // Every rank's buffer, made here so every thread can check the others'.
    let mut bufs: Vec<Vec<u64>> = (0..N)
        .map(|r| (0..LEN).map(|i| (r * 100_000 + i) as u64).collect())
        .collect();
    let addrs: Vec<usize> = bufs.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
    std::thread::scope(|s| {
        for (r, &addr) in addrs.iter().enumerate() {
            let addrs = &addrs;
            s.spawn(move || {
                let mut c: ncclComm_t = null_mut();
                let buf = addr as *mut c_void;
                let mut win: ncclWindow_t = null_mut();
                // SAFETY: valid pointers; each buffer outlives the scope and
                // holds LEN u64s; every rank makes the same collective calls.
                unsafe {
                    ok(ncclCommInitRank(&mut c, N as i32, id, r as i32), "init");
                    // Bad calls, each refused before anything is exchanged.
                    assert_eq!(
                        ncclCommWindowRegister(c, buf, 8 * LEN, &mut win, 4),
                        ncclInvalidArgument
                    );
                    assert!(last(c).contains("winFlags 0x4"), "{}", last(c));
                    assert_eq!(
                        ncclCommWindowRegister(c, null_mut(), 8, &mut win, 0),
                        ncclInvalidArgument
                    );
                    assert!(last(c).contains("buff is NULL"), "{}", last(c));
                    assert_eq!(
                        ncclCommWindowRegister(c, buf, 0, &mut win, 0),
                        ncclInvalidArgument
                    );
                    assert_eq!(
                        ncclCommWindowRegister(c, buf, 8, null_mut(), 0),
                        ncclInvalidArgument
                    );
                    assert!(win.is_null());
                    ok(
                        ncclCommWindowRegister(c, buf, 8 * LEN, &mut win, 1),
                        "ncclCommWindowRegister",
                    );
                    let mut up: *mut c_void = null_mut();
                    ok(ncclWinGetUserPtr(c, win, &mut up), "ncclWinGetUserPtr");
                    assert_eq!(up, buf);
                    for (p, &pa) in addrs.iter().enumerate() {
                        let mut pp: *mut c_void = null_mut();
                        ok(
                            ncclGetPeerDevicePointer(win, 8 * 17, p as i32, &mut pp),
                            "peer pointer",
                        );
                        assert_eq!(pp as usize, pa + 8 * 17, "rank {r}: rank {p}'s buffer");
                        assert_eq!(*(pp as *const u64), (p * 100_000 + 17) as u64);
                    }
                    // One host, consecutive ranks: the LSA team is everyone,
                    // and LSA rank p is world rank p.
                    let lsa = ncclTeamLsa(c);
                    assert_eq!((lsa.nRanks, lsa.rank, lsa.stride), (N as i32, r as i32, 1));
                    for p in 0..N {
                        let (mut a, mut b): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
                        ok(
                            ncclGetLsaDevicePointer(win, 8, p as i32, &mut a),
                            "lsa pointer",
                        );
                        let w = ncclTeamRankToWorld(c, lsa, p as i32);
                        ok(ncclGetPeerDevicePointer(win, 8, w, &mut b), "peer pointer");
                        assert_eq!(a, b);
                    }
                    let mut q: *mut c_void = null_mut();
                    assert_eq!(
                        ncclGetLsaDevicePointer(win, 0, N as i32, &mut q),
                        ncclInvalidArgument
                    );
                    assert!(
                        last(null_mut()).contains("invalid lsaRank 3"),
                        "{}",
                        last(null_mut())
                    );
                    let mut pp: *mut c_void = null_mut();
                    assert_eq!(
                        ncclGetPeerDevicePointer(win, 8 * LEN, 0, &mut pp),
                        ncclInvalidArgument
                    );
                    assert!(
                        last(null_mut()).contains("past rank 0's window of 8000 bytes"),
                        "{}",
                        last(null_mut())
                    );
                    assert_eq!(
                        ncclGetPeerDevicePointer(win, 0, N as i32, &mut pp),
                        ncclInvalidArgument
                    );
                    assert_eq!(
                        ncclGetPeerDevicePointer(8 as ncclWindow_t, 0, 0, &mut pp),
                        ncclInvalidArgument
                    );
                    assert!(pp.is_null());
                    // Everyone has read every buffer before any is reduced into.
                    let mut one = 1u64;
                    let o = &mut one as *mut u64 as *mut c_void;
                    ok(ncclAllReduce(o, o, 1, 5, 0, c, null_mut()), "barrier");
                    // A collective on the window buffers (u64 sum, in place).
                    ok(
                        ncclAllReduce(buf, buf, LEN, 5, 0, c, null_mut()),
                        "ncclAllReduce",
                    );
                    let got = std::slice::from_raw_parts(buf as *const u64, LEN);
                    for (i, &v) in got.iter().enumerate() {
                        assert_eq!(v, (300_000 + 3 * i) as u64, "element {i}");
                    }
                    ok(ncclCommWindowDeregister(c, win), "ncclCommWindowDeregister");
                    assert_eq!(ncclCommWindowDeregister(c, win), ncclInvalidArgument);
                    assert!(last(c).contains("not a registered window"), "{}", last(c));
                    ok(ncclCommDestroy(c), "ncclCommDestroy");
                }
            });
        }
    });
}
