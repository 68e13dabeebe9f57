//! `Communicator::shrink` (`ncclCommShrink`): the ranks left after an
//! exclude list, in parent order, with every collective on the new
//! communicator; after `revoke` ended a collective waiting for a
//! rank that never came; after a rank was SIGKILLed (real processes, over
//! shared memory and over TCP), rank 0 included; and the error when ranks
//! pass different lists.

mod common;

use common::*;
use oxccl::{Communicator, Config, DataType, ErrorKind, RedOp, UniqueId};
use std::time::{Duration, Instant};

/// Shrinks `comms` without `exclude` (each survivor passes the list in its
/// own order, with a repeat), checks size, rank order and every collective
/// on the result; returns the new communicators (None for excluded ranks).
fn shrink_and_check(comms: &[Communicator], exclude: &[usize]) -> Vec<Option<Communicator>> {
    let keep: Vec<u64> = (0..comms.len())
        .filter(|r| !exclude.contains(r))
        .map(|r| r as u64)
        .collect();
    on_ranks(comms, |c| {
        let me = c.rank();
        if exclude.contains(&me) {
            return None;
        }
        let mut mine = exclude.to_vec();
        mine.rotate_left(me % exclude.len().max(1));
        mine.extend(exclude.first());
        let s = c.shrink(&mine).unwrap_or_else(|e| panic!("rank {me}: {e}"));
        assert_eq!(s.size(), keep.len(), "rank {me}: size");
        assert_eq!(keep[s.rank()], me as u64, "rank {me}: its new rank");
        let mut got = vec![0u64; s.size()];
        s.all_gather(&[me as u64], &mut got).unwrap();
        assert_eq!(got, keep, "rank {me}: members in new-rank order");
        for (i, coll) in Coll::ALL.into_iter().enumerate() {
            for count in [0, 1, 1031] {
                let case = Case {
                    coll,
                    dtype: DataType::Float64,
                    op: RedOp::Sum,
                    count,
                    root: i % s.size(),
                    in_place: i % 2 == 1,
                    seed: 11 + i as u64,
                };
                run_case(&s, &case).unwrap_or_else(|e| panic!("rank {me}: {case}: {e}"));
            }
        }
        Some(s)
    })
}

#[test]
fn shrink_keeps_the_others_in_parent_order() {
    let _w = Watchdog::new(
        "shrink_keeps_the_others_in_parent_order",
        Duration::from_secs(180),
    );
    let comms = init_threads(6, &test_config(|_| {})).unwrap();
    shrink_and_check(&comms, &[2, 5]);
    // Rank 0 excluded: the new rank 0 is parent rank 1.
    shrink_and_check(&comms, &[0]);
    // All but one: a communicator of one rank.
    let solo = shrink_and_check(&comms, &[0, 1, 2, 4, 5]);
    assert_eq!(solo[3].as_ref().unwrap().size(), 1);
    // A shrink that did not stop anything leaves the parent usable.
    on_ranks(&comms, |c| {
        let mut x = [c.rank() as i64];
        c.all_reduce_in_place(&mut x, RedOp::Sum).unwrap();
        assert_eq!(x[0], 15);
    });
    // A shrink of a shrink.
    let kids: Vec<Communicator> = shrink_and_check(&comms, &[1])
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(kids.len(), 5);
    shrink_and_check(&kids, &[0, 3]);
}

#[test]
fn shrink_refuses_bad_lists() {
    let _w = Watchdog::new("shrink_refuses_bad_lists", Duration::from_secs(60));
    let comms = init_threads(3, &test_config(|_| {})).unwrap();
    assert_err(
        &comms[1].shrink(&[1]),
        ErrorKind::InvalidArgument,
        &["this rank (1)", "excluded ranks must not call it"],
    );
    assert_err(
        &comms[0].shrink(&[2, 3]),
        ErrorKind::InvalidArgument,
        &["excluded rank 3 is out of range", "3 ranks"],
    );
    // Nothing was sent: the parent still works.
    on_ranks(&comms, |c| {
        let mut x = [1u8];
        c.all_reduce_in_place(&mut x, RedOp::Sum).unwrap();
        assert_eq!(x[0], 3);
    });
}

/// Ranks 0 and 1 exclude rank 3, rank 2 excludes ranks 1 and 3: rank 2 sees
/// the digest differ and says so; ranks 0 and 1 wait for a rank 2 that
/// never joins and time out at init, naming it.
#[test]
fn shrink_with_different_lists_fails_naming_the_mismatch() {
    let _w = Watchdog::new(
        "shrink_with_different_lists_fails_naming_the_mismatch",
        Duration::from_secs(60),
    );
    let cfg = Config {
        init_timeout: Some(Duration::from_secs(2)),
        ..test_config(|_| {})
    };
    let comms = init_threads(4, &cfg).unwrap();
    let t = Instant::now();
    let res = on_ranks(&comms, |c| match c.rank() {
        3 => None,
        2 => Some(c.shrink(&[1, 3])),
        _ => Some(c.shrink(&[3])),
    });
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert_err(
        res[2].as_ref().unwrap(),
        ErrorKind::InvalidUsage,
        &[
            "rank 0 (the new rank 0) keeps other ranks",
            "must exclude the same ranks",
        ],
    );
    for r in [0, 1] {
        assert_err(
            res[r].as_ref().unwrap(),
            ErrorKind::Timeout,
            &["rank 2 of 3"],
        );
    }
}

/// Rank 2 of 3 never calls; ranks 0 and 1 wait for it in an all-reduce
/// until another thread revokes their communicators. Then they shrink
/// without it and work on; the revoked parent refuses operations but still
/// splits (with rank 2, which was not revoked).
#[test]
fn shrink_after_revoke() {
    let _w = Watchdog::new("shrink_after_revoke", Duration::from_secs(60));
    let comms = init_threads(3, &test_config(|_| {})).unwrap();
    let live = &comms[..2];
    std::thread::scope(|s| {
        let waiters: Vec<_> = live
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let t = Instant::now();
                    let r = c.all_reduce_in_place(&mut vec![1.0f32; 4096], RedOp::Sum);
                    (r, t.elapsed())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        for c in live {
            c.revoke();
        }
        for w in waiters {
            let (r, took) = w.join().unwrap();
            // Its own revoke, or the peer's revoke ending the collective
            // first (Remote, as for ncclCommAbort).
            let e = r.unwrap_err();
            assert!(
                (e.kind() == ErrorKind::InvalidUsage && e.message().contains("ncclCommRevoke"))
                    || e.kind() == ErrorKind::Remote,
                "{e}"
            );
            // The 60 s timeout would be the other way out.
            assert!(took < Duration::from_secs(5), "{took:?}");
        }
    });
    for c in live {
        assert_err(
            &c.all_reduce_in_place(&mut [1u8], RedOp::Sum),
            ErrorKind::InvalidUsage,
            &["revoked", "only split, shrink, destroy or abort it"],
        );
    }
    let kids = shrink_and_check(&comms, &[2]);
    assert!(kids[..2].iter().all(|k| k.as_ref().unwrap().size() == 2));
    on_ranks(&comms, |c| {
        let s = c.split(Some(0), 0).unwrap().unwrap();
        let mut x = [c.rank() as u32 + 1];
        s.all_reduce_in_place(&mut x, RedOp::Sum).unwrap();
        assert_eq!(x[0], 6);
    });
}

// ---------------------------------------------------------------------------
// A rank SIGKILLed, the others shrink without it (real processes)
// ---------------------------------------------------------------------------

const TCP: &[(&str, &str)] = &[("NCCL_SHM_DISABLE", "1"), ("NCCL_SOCKET_IFNAME", "lo")];
const NRANKS: usize = 4;

/// Survivors: an all-reduce that fails with Remote naming the victim, then
/// a shrink without it and the fixed sweep of every collective on the result.
fn survivor(ctx: &ChildCtx, victim: usize) {
    let cfg = Config {
        timeout: Some(Duration::from_secs(60)),
        ..test_config(|_| {})
    };
    let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, cfg).unwrap();
    c.all_reduce_in_place(&mut [1u8; 8], RedOp::Sum).unwrap();
    event("started");
    if ctx.rank == victim {
        std::thread::sleep(Duration::from_secs(120));
        unreachable!("the victim was to be killed");
    }
    let e = c
        .all_reduce_in_place(&mut vec![1.0f32; 1 << 16], RedOp::Sum)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote, "rank {}: {e}", ctx.rank);
    assert!(e.message().contains(&format!("rank {victim}")), "{e}");
    let t = Instant::now();
    let s = c
        .shrink(&[victim])
        .unwrap_or_else(|e| panic!("rank {}: shrink: {e}", ctx.rank));
    println!("rank {}: shrink took {:?}", ctx.rank, t.elapsed());
    let me = ctx.rank - usize::from(ctx.rank > victim);
    assert_eq!((s.rank(), s.size()), (me, NRANKS - 1));
    for case in fixed_sweep(s.size()) {
        if let Err(f) = run_case(&s, &case) {
            panic!("rank {}: {case}: {f}", ctx.rank);
        }
    }
    s.destroy().unwrap();
    c.destroy().unwrap();
    event("shrunk");
}

fn kill_and_shrink(test: &str, env: &[(&str, &str)], victim: usize) {
    if let Some(ctx) = child_ctx() {
        survivor(&ctx, victim);
        return;
    }
    let _w = Watchdog::new(test, Duration::from_secs(300));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(test, NRANKS, &id, env);
    let all: Vec<usize> = (0..NRANKS).collect();
    let survivors: Vec<usize> = all.iter().copied().filter(|&r| r != victim).collect();
    if !p.wait_event(&all, "started", Duration::from_secs(90)) {
        panic!("the ranks did not start:\n{}", p.all_logs());
    }
    // Let the survivors get into the all-reduce that waits for the victim.
    std::thread::sleep(Duration::from_millis(300));
    p.signal(victim, libc::SIGKILL);
    let exits = p.wait_exit(&survivors, Duration::from_secs(120));
    for (&r, d) in survivors.iter().zip(&exits) {
        assert!(
            d.is_some() && p.status(r).is_some_and(|s| s.success()) && p.has(r, "shrunk"),
            "rank {r} did not shrink and finish:\n{}",
            p.all_logs()
        );
    }
}

#[test]
fn shm_shrink_after_a_rank_is_killed() {
    kill_and_shrink("shm_shrink_after_a_rank_is_killed", &[], 2);
}

/// Rank 0 dies: the new rank 0, which makes the new id, is parent rank 1.
#[test]
fn shm_shrink_after_rank_0_is_killed() {
    kill_and_shrink("shm_shrink_after_rank_0_is_killed", &[], 0);
}

#[test]
fn tcp_shrink_after_a_rank_is_killed() {
    kill_and_shrink("tcp_shrink_after_a_rank_is_killed", TCP, 3);
}
