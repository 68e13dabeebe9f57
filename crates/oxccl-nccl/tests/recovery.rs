//! Going on without a rank through the C API, ranks as threads on host
//! buffers: `ncclCommRevoke` ends an all-reduce waiting for a rank that
//! never calls (from another thread, as a watchdog would), later operations
//! are refused naming it, `ncclCommGetAsyncError` reports the revoke
//! complete, a second revoke and `ncclCommFinalize` are refused; the revoked
//! communicators shrink without the absent rank (`ncclCommShrink`), the
//! result grows back to three with a new rank (`ncclCommGetUniqueId`,
//! `ncclCommGrow`), and the revoked ones still split with the absent rank.

mod common;

use common::{last, ok};
use nccl::abi::*;
use nccl::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

/// Handles as integers, to cross threads.
fn init(n: usize) -> Vec<usize> {
    let mut id = ncclUniqueId::default();
    // SAFETY: a valid output pointer.
    ok(unsafe { ncclGetUniqueId(&mut id) }, "ncclGetUniqueId");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                s.spawn(move || {
                    let mut c: ncclComm_t = null_mut();
                    // SAFETY: valid pointers; every rank calls.
                    ok(
                        unsafe { ncclCommInitRank(&mut c, n as i32, id, r as i32) },
                        "ncclCommInitRank",
                    );
                    c as usize
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A float all-reduce of `count` on host memory; the sum, or the error.
fn all_reduce(c: usize, count: usize, v: f32) -> Result<f32, ncclResult_t> {
    let mut x = vec![v; count];
    let p = x.as_mut_ptr() as *mut c_void;
    // SAFETY: `x` holds `count` floats (ncclFloat32 = 7, ncclSum = 0); in place.
    let r = unsafe { ncclAllReduce(p, p, count, 7, 0, c as ncclComm_t, null_mut()) };
    if r == ncclSuccess {
        Ok(x[0])
    } else {
        Err(r)
    }
}

#[test]
fn revoke_shrink_grow_and_split() {
    let comms = init(3);
    let live = &comms[..2];
    std::thread::scope(|s| {
        let waiters: Vec<_> = live
            .iter()
            .map(|&c| {
                s.spawn(move || {
                    let t = Instant::now();
                    (all_reduce(c, 4096, 1.0), t.elapsed())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        for &c in live {
            // SAFETY: a live handle.
            ok(
                unsafe { ncclCommRevoke(c as ncclComm_t, 0) },
                "ncclCommRevoke",
            );
        }
        for w in waiters {
            let (r, took) = w.join().unwrap();
            // Its own revoke, or the peer's ending the collective first.
            assert!(
                matches!(r, Err(e) if e == ncclInvalidUsage || e == ncclRemoteError),
                "{r:?}"
            );
            // Rank 2 never calls: without the revoke this waits 10 min (OXCCL_TIMEOUT_MS).
            assert!(took < Duration::from_secs(5), "{took:?}");
        }
    });
    for &c in live {
        let h = c as ncclComm_t;
        let mut e = ncclInProgress;
        // SAFETY: live handles, valid output pointers.
        unsafe {
            ok(ncclCommGetAsyncError(h, &mut e), "ncclCommGetAsyncError");
            assert_eq!(e, ncclSuccess, "a revoked, quiescent communicator");
            assert_eq!(all_reduce(c, 1, 1.0), Err(ncclInvalidUsage));
            assert!(last(h).contains("comm was revoked"), "{}", last(h));
            assert_eq!(ncclCommRevoke(h, 0), ncclInvalidArgument);
            assert!(last(h).contains("already revoked"), "{}", last(h));
            assert_eq!(ncclCommFinalize(h), ncclInvalidUsage);
            assert!(last(h).contains("after ncclCommRevoke"), "{}", last(h));
        }
    }
    // NULL is a no-op (NCCL's rule); other flags are refused.
    // SAFETY: NULL and a live handle.
    unsafe {
        assert_eq!(ncclCommRevoke(null_mut(), 0), ncclSuccess);
        assert_eq!(
            ncclCommRevoke(comms[2] as ncclComm_t, 1),
            ncclInvalidArgument
        );
        assert!(last(comms[2] as ncclComm_t).contains("revokeFlags 0x1"));
    }
    // The two revoked ranks shrink without rank 2.
    let kids: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = live
            .iter()
            .map(|&c| {
                s.spawn(move || {
                    let mut ex = [2i32];
                    let mut k: ncclComm_t = null_mut();
                    // SAFETY: valid pointers; both survivors call.
                    ok(
                        unsafe {
                            ncclCommShrink(
                                c as ncclComm_t,
                                ex.as_mut_ptr(),
                                1,
                                &mut k,
                                null_mut(),
                                0,
                            )
                        },
                        "ncclCommShrink",
                    );
                    assert_eq!(all_reduce(k as usize, 1000, 2.0), Ok(4.0));
                    k as usize
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    grow_back(&kids);
    // All three split (rank 2 was never revoked).
    std::thread::scope(|s| {
        for &c in &comms {
            s.spawn(move || {
                let mut k: ncclComm_t = null_mut();
                // SAFETY: valid pointers; every rank calls.
                ok(
                    unsafe { ncclCommSplit(c as ncclComm_t, 0, 0, &mut k, null_mut()) },
                    "ncclCommSplit",
                );
                assert_eq!(all_reduce(k as usize, 7, 1.0), Ok(3.0));
                // SAFETY: live handles.
                unsafe {
                    ok(ncclCommDestroy(k), "ncclCommDestroy");
                    ok(ncclCommDestroy(c as ncclComm_t), "ncclCommDestroy");
                }
            });
        }
    });
}

/// The two-rank child grows to three with a new rank: child rank 0 makes
/// the id (a second one before the grow is refused), both pass rank -1, the
/// new thread passes NULL, the id and rank 2. Bad calls first.
fn grow_back(kids: &[usize]) {
    let k0 = kids[0] as ncclComm_t;
    let mut id = ncclUniqueId::default();
    let mut g: ncclComm_t = null_mut();
    // SAFETY: live handles and valid pointers throughout.
    unsafe {
        ok(ncclCommGetUniqueId(k0, &mut id), "ncclCommGetUniqueId");
        let mut again = ncclUniqueId::default();
        assert_eq!(ncclCommGetUniqueId(k0, &mut again), ncclInvalidUsage);
        assert!(last(k0).contains("not consumed"), "{}", last(k0));
        assert_eq!(
            ncclCommGrow(k0, 3, &id, 0, &mut g, null_mut()),
            ncclInvalidArgument
        );
        assert!(last(k0).contains("passes -1"), "{}", last(k0));
        assert_eq!(
            ncclCommGrow(k0, 2, &id, -1, &mut g, null_mut()),
            ncclInvalidArgument
        );
        assert!(last(k0).contains("must exceed"), "{}", last(k0));
        assert_eq!(
            ncclCommGrow(null_mut(), 3, std::ptr::null(), 2, &mut g, null_mut()),
            ncclInvalidArgument
        );
        assert!(g.is_null());
    }
    let grown: Vec<usize> = std::thread::scope(|s| {
        let mut hs: Vec<_> = kids
            .iter()
            .enumerate()
            .map(|(i, &k)| {
                s.spawn(move || {
                    let mut g: ncclComm_t = null_mut();
                    let idp = if i == 0 {
                        &id as *const _
                    } else {
                        std::ptr::null()
                    };
                    // SAFETY: valid pointers; every existing rank calls.
                    ok(
                        unsafe { ncclCommGrow(k as ncclComm_t, 3, idp, -1, &mut g, null_mut()) },
                        "ncclCommGrow (existing rank)",
                    );
                    g as usize
                })
            })
            .collect();
        hs.push(s.spawn(move || {
            let mut g: ncclComm_t = null_mut();
            // SAFETY: valid pointers; the new rank.
            ok(
                unsafe { ncclCommGrow(null_mut(), 3, &id, 2, &mut g, null_mut()) },
                "ncclCommGrow (new rank)",
            );
            g as usize
        }));
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    std::thread::scope(|s| {
        for (r, &g) in grown.iter().enumerate() {
            s.spawn(move || {
                let (mut n, mut me) = (0, 0);
                // SAFETY: live handles, valid pointers.
                unsafe {
                    ok(ncclCommCount(g as ncclComm_t, &mut n), "ncclCommCount");
                    ok(
                        ncclCommUserRank(g as ncclComm_t, &mut me),
                        "ncclCommUserRank",
                    );
                }
                assert_eq!((n, me), (3, r as i32));
                assert_eq!(all_reduce(g, 513, r as f32 + 1.0), Ok(6.0));
                // SAFETY: live handles.
                unsafe {
                    ok(ncclCommDestroy(g as ncclComm_t), "ncclCommDestroy");
                    if let Some(&k) = kids.get(r) {
                        ok(ncclCommDestroy(k as ncclComm_t), "ncclCommDestroy");
                    }
                }
            });
        }
    });
}
