//! `Communicator::shrink` (`ncclCommShrink`): the ranks left after an
//! exclude list, in parent order, with every collective on the new
//! communicator; after `revoke` ended a collective waiting for a
//! rank that never came; after a rank was SIGKILLed (real processes, over
//! shared memory and over TCP), rank 0 included, followed by a grow
//! (`ncclCommGrow`) back to full size with a replacement process; and the
//! error when ranks pass different lists.

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

/// 3 ranks grow to 5: rank 1 holds the id, ranks 3 and 4 are new threads.
/// Old ranks keep their numbers; every collective runs on the result; the
/// parent still works.
#[test]
fn grow_keeps_the_ranks_and_adds_new_ones() {
    let _w = Watchdog::new(
        "grow_keeps_the_ranks_and_adds_new_ones",
        Duration::from_secs(120),
    );
    let cfg = test_config(|_| {});
    let comms = init_threads(3, &cfg).unwrap();
    let id = comms[1].grow_id().unwrap();
    let all: Vec<Communicator> = std::thread::scope(|s| {
        let old: Vec<_> = comms
            .iter()
            .map(|c| {
                let id = &id;
                s.spawn(move || c.grow(5, (c.rank() == 1).then_some(id)).unwrap())
            })
            .collect();
        let new: Vec<_> = (3..5)
            .map(|r| {
                let (id, cfg) = (&id, cfg.clone());
                s.spawn(move || Communicator::init_rank_config(5, id, r, cfg).unwrap())
            })
            .collect();
        old.into_iter()
            .chain(new)
            .map(|h| h.join().unwrap())
            .collect()
    });
    for (r, g) in all.iter().enumerate() {
        assert_eq!((g.rank(), g.size()), (r, 5));
    }
    on_ranks(&all, |g| {
        for (i, coll) in Coll::ALL.into_iter().enumerate() {
            let case = Case {
                coll,
                dtype: DataType::Int32,
                op: RedOp::Max,
                count: 1031,
                root: i % 5,
                in_place: i % 2 == 0,
                seed: 3 + i as u64,
            };
            run_case(g, &case).unwrap_or_else(|e| panic!("rank {}: {case}: {e}", g.rank()));
        }
    });
    on_ranks(&comms, |c| {
        let mut x = [1u32];
        c.all_reduce_in_place(&mut x, RedOp::Sum).unwrap();
        assert_eq!(x[0], 3);
    });
}

#[test]
fn grow_refuses_no_id_two_ids_and_no_new_rank() {
    let _w = Watchdog::new(
        "grow_refuses_no_id_two_ids_and_no_new_rank",
        Duration::from_secs(60),
    );
    let comms = init_threads(3, &test_config(|_| {})).unwrap();
    assert_err(
        &comms[0].grow(3, None),
        ErrorKind::InvalidArgument,
        &["nranks 3 must exceed the communicator's 3 ranks"],
    );
    for r in on_ranks(&comms, |c| c.grow(4, None)) {
        assert_err(&r, ErrorKind::InvalidUsage, &["no rank passed a unique id"]);
    }
    let ids: Vec<UniqueId> = (0..2).map(|_| comms[0].grow_id().unwrap()).collect();
    for r in on_ranks(&comms, |c| c.grow(4, ids.get(c.rank()))) {
        assert_err(
            &r,
            ErrorKind::InvalidUsage,
            &["ranks [0, 1] each passed a unique id"],
        );
    }
    // Nothing was created: the communicator still works.
    on_ranks(&comms, |c| {
        let mut x = [2i8];
        c.all_reduce_in_place(&mut x, RedOp::Sum).unwrap();
        assert_eq!(x[0], 6);
    });
}

// ---------------------------------------------------------------------------
// A rank SIGKILLed, the others shrink without it (real processes)
// ---------------------------------------------------------------------------

const TCP: &[(&str, &str)] = &[("NCCL_SHM_DISABLE", "1"), ("NCCL_SOCKET_IFNAME", "lo")];
const NRANKS: usize = 4;

/// Where the new rank 0 of the shrunk communicator leaves the grow id for
/// the replacement process (hex, written whole by a rename).
const GROW_DIR: &str = "OXCCL_TEST_GROW_DIR";
/// Set in the replacement process.
const REPLACEMENT: &str = "OXCCL_TEST_REPLACEMENT";

/// Survivors: an all-reduce that fails with Remote naming the victim, a
/// shrink without it and the fixed sweep on the result; then a grow back to
/// NRANKS with a replacement process as the last rank, and the fixed sweep
/// on that.
fn survivor(ctx: &ChildCtx, victim: usize) {
    let cfg = Config {
        timeout: Some(Duration::from_secs(60)),
        ..test_config(|_| {})
    };
    let dir = std::path::PathBuf::from(std::env::var(GROW_DIR).unwrap());
    if std::env::var(REPLACEMENT).is_ok() {
        return replacement(&dir, cfg);
    }
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
    event("shrunk");
    // Grow back: the new rank 0 makes the id and leaves it for the replacement.
    let id = (me == 0).then(|| {
        let id = s.grow_id().unwrap();
        let tmp = dir.join("id.tmp");
        std::fs::write(&tmp, hex(id.as_bytes())).unwrap();
        std::fs::rename(&tmp, dir.join("id")).unwrap();
        id
    });
    let g = s
        .grow(NRANKS, id.as_ref())
        .unwrap_or_else(|e| panic!("rank {}: grow: {e}", ctx.rank));
    assert_eq!((g.rank(), g.size()), (me, NRANKS));
    for case in fixed_sweep(NRANKS) {
        if let Err(f) = run_case(&g, &case) {
            panic!("rank {}: after grow: {case}: {f}", ctx.rank);
        }
    }
    for x in [g, s, c] {
        x.destroy().unwrap();
    }
    event("grown");
}

/// The replacement: waits for the grow id, joins as the last rank, runs
/// the fixed sweep with the survivors.
fn replacement(dir: &std::path::Path, cfg: Config) {
    let t = Instant::now();
    let hexid = loop {
        if let Ok(h) = std::fs::read_to_string(dir.join("id")) {
            break h;
        }
        assert!(t.elapsed() < Duration::from_secs(90), "no grow id came");
        std::thread::sleep(Duration::from_millis(20));
    };
    let b: [u8; 128] = unhex(hexid.trim()).try_into().unwrap();
    let id = UniqueId::from_bytes(&b).unwrap();
    let g = Communicator::init_rank_config(NRANKS, &id, NRANKS - 1, cfg).unwrap();
    for case in fixed_sweep(NRANKS) {
        if let Err(f) = run_case(&g, &case) {
            panic!("replacement: {case}: {f}");
        }
    }
    g.destroy().unwrap();
    event("grown");
}

fn kill_and_shrink(test: &str, env: &[(&str, &str)], victim: usize) {
    if let Some(ctx) = child_ctx() {
        survivor(&ctx, victim);
        return;
    }
    let _w = Watchdog::new(test, Duration::from_secs(300));
    let dir = std::env::temp_dir().join(format!("oxccl-grow-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let mut env: Vec<(&str, &str)> = env.to_vec();
    env.push((GROW_DIR, d));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(test, NRANKS, &id, &env);
    env.push((REPLACEMENT, "1"));
    let mut fresh = Procs::spawn(test, 1, &id, &env);
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
            d.is_some() && p.status(r).is_some_and(|s| s.success()) && p.has(r, "grown"),
            "rank {r} did not shrink, grow and finish:\n{}\nreplacement:\n{}",
            p.all_logs(),
            fresh.all_logs()
        );
    }
    let e = fresh.wait_exit(&[0], Duration::from_secs(30));
    assert!(
        e[0].is_some() && fresh.status(0).is_some_and(|s| s.success()) && fresh.has(0, "grown"),
        "the replacement did not finish:\n{}",
        fresh.all_logs()
    );
    let _ = std::fs::remove_dir_all(&dir);
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
