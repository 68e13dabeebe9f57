//! Ranks as processes of this host: the test binary starts itself as child
//! ranks (`--exact <test>` with `OXCCL_TEST_CHILD=rank:nranks:id`), over
//! shared memory (the default between processes) and over TCP
//! (`NCCL_SHM_DISABLE=1`, `NCCL_SOCKET_IFNAME=lo`). Every child runs the
//! fixed sweep of every collective against the reference; the fault tests
//! SIGKILL a rank in the middle of a large all-reduce, or while its peers
//! wait for it, and require `ErrorKind::Remote` naming it within seconds.
//!
//! Children are killed when the test ends (a `Drop` guard), die with the
//! test thread (`PR_SET_PDEATHSIG`) and exit on their own after
//! `CHILD_LIMIT`.

mod common;

use common::*;
use oxccl::{Communicator, Config, ErrorKind, RedOp, UniqueId};
use std::time::{Duration, Instant};

const SHM: &[(&str, &str)] = &[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT")];
const TCP: &[(&str, &str)] = &[
    ("NCCL_SHM_DISABLE", "1"),
    ("NCCL_SOCKET_IFNAME", "lo"),
    ("NCCL_DEBUG", "INFO"),
    ("NCCL_DEBUG_SUBSYS", "INIT"),
];

/// The transport the INIT log of `rank` shows for its peers.
fn assert_transport(p: &Procs, rank: usize, label: &str) {
    let log = p.log(rank);
    assert!(
        log.contains(&format!("via {label}")),
        "rank {rank} did not connect via {label}:\n{log}"
    );
}

fn sweep(test: &str, n: usize, env: &[(&str, &str)], label: &str) {
    if let Some(ctx) = child_ctx() {
        child_sweep(&ctx, test_config(|_| {}));
        return;
    }
    let _w = Watchdog::new(test, Duration::from_secs(200));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(test, n, &id, env);
    p.expect_success(Duration::from_secs(180));
    for r in 0..n {
        assert_transport(&p, r, label);
    }
}

#[test]
fn shm_sweep_2() {
    sweep("shm_sweep_2", 2, SHM, "SHM");
}

#[test]
fn shm_sweep_3() {
    sweep("shm_sweep_3", 3, SHM, "SHM");
}

#[test]
fn shm_sweep_5() {
    sweep("shm_sweep_5", 5, SHM, "SHM");
}

#[test]
fn tcp_sweep_2() {
    sweep("tcp_sweep_2", 2, TCP, "NET/Socket");
}

#[test]
fn tcp_sweep_3() {
    sweep("tcp_sweep_3", 3, TCP, "NET/Socket");
}

// ---------------------------------------------------------------------------
// SIGKILL of a rank
// ---------------------------------------------------------------------------

const VICTIM: usize = 2;
const NRANKS: usize = 3;

/// How a victim is killed.
#[derive(Clone, Copy, PartialEq)]
enum When {
    /// While it moves data in a large all-reduce (stopped first, so the test
    /// can check that nobody finished before the kill).
    MidTransfer,
    /// While the survivors are blocked in the all-reduce waiting for it (it
    /// sleeps before its call).
    BeforeItsCall,
}

/// The child side: init, a small all-reduce as a barrier, then the big one.
/// Survivors must fail with Remote naming the victim.
fn kill_child(ctx: &ChildCtx, count: usize, when: When) {
    let cfg = Config {
        // A hang would end here (the test requires seconds, not this).
        timeout: Some(Duration::from_secs(60)),
        ..test_config(|h| h.capacity = 1 << 20)
    };
    let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, cfg).unwrap();
    c.all_reduce_in_place(&mut [1u8; 8], RedOp::Sum).unwrap();
    // Zeros: calloc'ed pages, so 1 GiB costs memory only where the
    // all-reduce has written by the time of the kill.
    let mut buf = vec![0.0f32; count];
    if ctx.rank == VICTIM && when == When::BeforeItsCall {
        event("started");
        std::thread::sleep(Duration::from_secs(120));
        unreachable!("the victim was to be killed");
    }
    event("started");
    let t = Instant::now();
    let r = c.all_reduce_in_place(&mut buf, RedOp::Sum);
    let took = t.elapsed();
    match r {
        Ok(()) => {
            event("completed");
            panic!(
                "rank {}: the all-reduce completed in {took:?} although rank {VICTIM} was killed",
                ctx.rank
            );
        }
        Err(e) => {
            println!("rank {}: after {took:?}: {e}", ctx.rank);
            assert_eq!(e.kind(), ErrorKind::Remote, "rank {}: {e}", ctx.rank);
            assert!(
                e.message().contains(&format!("rank {VICTIM}")),
                "rank {}: the error does not name rank {VICTIM}: {e}",
                ctx.rank
            );
            // The communicator is unusable now, and says so at once.
            let next = c.all_reduce_in_place(&mut [1u8], RedOp::Sum);
            assert_eq!(next.unwrap_err().kind(), ErrorKind::InvalidUsage);
            event("remote");
        }
    }
}

fn kill_parent(test: &str, env: &[(&str, &str)], when: When) {
    let _w = Watchdog::new(test, Duration::from_secs(300));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(test, NRANKS, &id, env);
    let all: Vec<usize> = (0..NRANKS).collect();
    let survivors: Vec<usize> = (0..NRANKS).filter(|&r| r != VICTIM).collect();
    if !p.wait_event(&all, "started", Duration::from_secs(90)) {
        panic!("the ranks did not start:\n{}", p.all_logs());
    }
    // Let the survivors get into the all-reduce (and, mid-transfer, move data).
    std::thread::sleep(Duration::from_millis(400));
    if when == When::MidTransfer {
        p.signal(VICTIM, libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(50));
    }
    let early: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&r| p.has(r, "completed") || p.has(r, "remote"))
        .collect();
    assert!(
        early.is_empty(),
        "ranks {early:?} finished before the kill: use a larger all-reduce\n{}",
        p.all_logs()
    );
    let t = Instant::now();
    p.signal(VICTIM, libc::SIGKILL);
    let exits = p.wait_exit(&survivors, Duration::from_secs(20));
    for (&r, d) in survivors.iter().zip(&exits) {
        let d =
            d.unwrap_or_else(|| panic!("rank {r} alive 20 s after the kill:\n{}", p.all_logs()));
        assert!(
            p.status(r).is_some_and(|s| s.success()),
            "rank {r} failed:\n{}",
            p.all_logs()
        );
        assert!(
            d < Duration::from_secs(5),
            "rank {r} took {d:?} (kill to exit) to report the dead peer"
        );
    }
    eprintln!("survivors exited {:?} after the kill", t.elapsed());
    // Nothing of the job stays in /dev/shm: the survivors unlink their own
    // segments and what the victim left (init_kill checks the same at init).
    let left = shm_segments_of(&p.pids);
    assert!(left.is_empty(), "left in /dev/shm after the job: {left:?}");
    if std::env::var("OXCCL_TEST_SHOW").is_ok() {
        eprintln!("{}", p.all_logs());
    }
}

/// Segments in /dev/shm made by any of `pids` (`oxccl-<pid>-*`).
fn shm_segments_of(pids: &[u32]) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|f| pids.iter().any(|p| f.starts_with(&format!("oxccl-{p}-"))))
        .collect()
}

fn kill_test(test: &str, env: &[(&str, &str)], count: usize, when: When) {
    if let Some(ctx) = child_ctx() {
        kill_child(&ctx, count, when);
        return;
    }
    kill_parent(test, env, when);
}

/// The "1 GiB all_reduce": 256 Mi floats per rank, in place, 3
/// ranks; the kill comes 0.4 s in, the victim stopped first so the test can
/// check that no rank had finished (it takes seconds in a debug build).
const GIB: usize = 256 << 20;

#[test]
fn shm_sigkill_mid_1gib_all_reduce() {
    kill_test(
        "shm_sigkill_mid_1gib_all_reduce",
        &[],
        GIB,
        When::MidTransfer,
    );
}

#[test]
fn tcp_sigkill_mid_1gib_all_reduce() {
    kill_test(
        "tcp_sigkill_mid_1gib_all_reduce",
        TCP,
        GIB,
        When::MidTransfer,
    );
}

#[test]
fn shm_sigkill_while_peers_wait() {
    kill_test(
        "shm_sigkill_while_peers_wait",
        &[],
        1 << 20,
        When::BeforeItsCall,
    );
}

/// The same while the survivors wait in a small all-reduce (8 bytes: the
/// one-shot slots, whose wait checks the peers' liveness itself).
#[test]
fn shm_sigkill_while_peers_wait_in_a_small_all_reduce() {
    kill_test(
        "shm_sigkill_while_peers_wait_in_a_small_all_reduce",
        &[],
        2,
        When::BeforeItsCall,
    );
}

#[test]
fn tcp_sigkill_while_peers_wait() {
    kill_test(
        "tcp_sigkill_while_peers_wait",
        TCP,
        1 << 20,
        When::BeforeItsCall,
    );
}

// ---------------------------------------------------------------------------
// Init: the root names the rank that never came
// ---------------------------------------------------------------------------

/// One child with OXCCL_INIT_TIMEOUT_MS=1000 makes the id (so its root gives
/// up after 1 s) and runs ranks 0 and 1 of 3; rank 2 never comes. Both must
/// fail with Timeout naming rank 2, in about a second.
#[test]
fn init_missing_rank_is_named() {
    if child_ctx().is_some() {
        let id = UniqueId::new().unwrap();
        let t = Instant::now();
        let res: Vec<oxccl::Result<Communicator>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let id = &id;
                    s.spawn(move || Communicator::init_rank(3, id, r))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "took {:?}",
            t.elapsed()
        );
        for r in &res {
            assert_err(r, ErrorKind::Timeout, &["rank 2 of 3", "never connected"]);
        }
        return;
    }
    let _w = Watchdog::new("init_missing_rank_is_named", Duration::from_secs(60));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(
        "init_missing_rank_is_named",
        1,
        &id,
        &[("OXCCL_INIT_TIMEOUT_MS", "1000")],
    );
    p.expect_success(Duration::from_secs(30));
}

// ---------------------------------------------------------------------------
// A rank that leaves normally is not a dead rank
// ---------------------------------------------------------------------------

/// Rank 2 of 3 destroys its communicator after a first all-reduce and
/// exits. The others' liveness check (what the GPU watchdog polls, which
/// used to stop a rank's GPU work with "rank 2 closed its connection") must
/// not report it: it said goodbye. A collective that needs it still fails
/// at once with `Remote` naming it.
fn leaver(test: &str, env: &[(&str, &str)]) {
    if let Some(ctx) = child_ctx() {
        let cfg = Config {
            timeout: Some(Duration::from_secs(60)),
            ..test_config(|_| {})
        };
        let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, cfg).unwrap();
        c.all_reduce_in_place(&mut [1u8; 8], RedOp::Sum).unwrap();
        if ctx.rank == 2 {
            c.destroy().unwrap();
            event("left");
            return;
        }
        // Rank 2 leaves right after the all-reduce; give its goodbye time
        // to arrive, checking all along that it is never taken for a death.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(1500) {
            let r = c.check_peers().unwrap();
            assert!(r.is_none(), "rank {}: {r:?}", ctx.rank);
            std::thread::sleep(Duration::from_millis(20));
        }
        let t = Instant::now();
        let e = c
            .all_reduce_in_place(&mut [1u8; 8], RedOp::Sum)
            .unwrap_err();
        println!("rank {}: after {:?}: {e}", ctx.rank, t.elapsed());
        assert_eq!(e.kind(), ErrorKind::Remote, "rank {}: {e}", ctx.rank);
        assert!(e.message().contains("rank 2"), "rank {}: {e}", ctx.rank);
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        event("ok");
        return;
    }
    let _w = Watchdog::new(test, Duration::from_secs(120));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(test, 3, &id, env);
    p.expect_success(Duration::from_secs(90));
}

#[test]
fn shm_a_rank_that_destroys_its_communicator_is_not_dead() {
    leaver("shm_a_rank_that_destroys_its_communicator_is_not_dead", SHM);
}

#[test]
fn tcp_a_rank_that_destroys_its_communicator_is_not_dead() {
    leaver("tcp_a_rank_that_destroys_its_communicator_is_not_dead", TCP);
}
