//! Connections that stay bounded as ranks grow: beyond 8 ranks a rank is
//! connected at creation only to its ring and tree peers, the collectives
//! with a bounded fan-out never connect more, and all-to-all and send/recv
//! connect the peers they need on first use, with exact results, over every
//! host transport (threads over in-process rings, over shared memory, over
//! TCP). A first-use connection that the peer never answers ends at the
//! timeout or at an abort or revoke, naming the peer.
//!
//! With a pool of first-use connections smaller than the peers
//! (`OXCCL_P2P_MAX_PEERS`), a rank never holds more of them than the pool,
//! over threads and processes, through all-to-all, gather, scatter and
//! send/recv to every peer, with exact results; an abort or a dead peer
//! during a release ends it naming the peer.

mod common;

use common::*;
use oxccl::{Communicator, Config, ErrorKind, Group, RedOp, UniqueId};
use oxccl_core::peers::{init_peers, MAX_INIT_PEERS};
use std::time::{Duration, Instant};

/// More ranks than one-shot's bound (8): not every pair is connected at creation.
const N: usize = 12;

/// (name, NCCL_P2P_DISABLE, NCCL_SHM_DISABLE): how the threads are linked.
const LINKS: [(&str, bool, bool); 3] = [
    ("in-process", false, false),
    ("shared memory", true, false),
    ("TCP", true, true),
];

fn config(p2p_disable: bool, shm_disable: bool) -> Config {
    test_config(|h| {
        h.p2p_disable = p2p_disable;
        h.shm_disable = shm_disable;
    })
}

/// An exact float64 input: element `i` of rank `r`'s block for peer `q`.
fn val(r: usize, q: usize, i: usize) -> f64 {
    (r * 10_000 + q * 100 + i) as f64
}

fn check_bounded_collectives(c: &Communicator) {
    let r = c.rank();
    for count in [0usize, 1, 7, 1001] {
        let send: Vec<f64> = (0..count).map(|i| val(r, 0, i)).collect();
        let mut sum = vec![0.0; count];
        c.all_reduce(&send, &mut sum, RedOp::Sum).unwrap();
        for (i, v) in sum.iter().enumerate() {
            let want: f64 = (0..N).map(|q| val(q, 0, i)).sum();
            assert_eq!(*v, want, "all_reduce rank {r} count {count} [{i}]");
        }
        let mut all = vec![0.0; count * N];
        c.all_gather(&send, &mut all).unwrap();
        for (k, v) in all.iter().enumerate() {
            assert_eq!(
                *v,
                val(k / count.max(1), 0, k % count.max(1)),
                "all_gather rank {r}"
            );
        }
        let mut b = vec![0.0; count];
        c.broadcast(&send, &mut b, 5).unwrap();
        for (i, v) in b.iter().enumerate() {
            assert_eq!(*v, val(5, 0, i), "broadcast rank {r}");
        }
    }
}

#[test]
fn beyond_eight_ranks_only_ring_and_tree_peers_are_connected_until_first_use() {
    let _w = Watchdog::new("scale: bounded connections", Duration::from_secs(240));
    for (what, p2p, shm) in LINKS {
        let comms = init_threads(N, &config(p2p, shm)).unwrap();
        for c in &comms {
            let peers = c.connected_peers();
            assert_eq!(peers, init_peers(c.rank(), N), "{what}: rank {}", c.rank());
            assert!(
                peers.len() <= MAX_INIT_PEERS && peers.len() < N - 1,
                "{what}"
            );
        }
        on_ranks(&comms, check_bounded_collectives);
        for c in &comms {
            assert_eq!(c.connected_peers(), init_peers(c.rank(), N), "{what}");
        }
        // All-to-all connects every other peer on first use; a second call
        // reuses the connections.
        for round in 0..2 {
            on_ranks(&comms, |c| {
                let r = c.rank();
                for count in [0usize, 1, 5] {
                    let send: Vec<f64> = (0..N * count)
                        .map(|k| val(r, k / count, k % count))
                        .collect();
                    let mut recv = vec![-1.0; N * count];
                    c.all_to_all(&send, &mut recv).unwrap();
                    for (k, v) in recv.iter().enumerate() {
                        let q = k / count;
                        assert_eq!(
                            *v,
                            val(q, r, k % count),
                            "{what} round {round}: all_to_all rank {r} [{k}]"
                        );
                    }
                }
            });
            for c in &comms {
                assert_eq!(
                    c.connected_peers().len(),
                    N - 1,
                    "{what}: rank {}",
                    c.rank()
                );
            }
        }
        on_ranks(&comms, check_bounded_collectives);
    }
}

#[test]
fn send_and_recv_connect_a_pair_on_first_use_either_way() {
    let _w = Watchdog::new("scale: send/recv on first use", Duration::from_secs(240));
    for (what, p2p, shm) in LINKS {
        let comms = init_threads(N, &config(p2p, shm)).unwrap();
        // Pairs that are not connected at creation, both orders of ranks.
        let pairs: Vec<(usize, usize)> = (0..N)
            .flat_map(|a| (0..N).map(move |b| (a, b)))
            .filter(|&(a, b)| a != b && !init_peers(a, N).contains(&b))
            .filter(|&(a, b)| (a + 2 * b) % 7 == 0)
            .collect();
        assert!(pairs.iter().any(|&(a, b)| a < b) && pairs.iter().any(|&(a, b)| a > b));
        for (from, to) in pairs {
            on_ranks(&comms, |c| {
                let r = c.rank();
                for count in [0usize, 3, 1001] {
                    if r == from {
                        let buf: Vec<f64> = (0..count).map(|i| val(from, to, i)).collect();
                        c.send(&buf, to).unwrap();
                    } else if r == to {
                        let mut buf = vec![-1.0; count];
                        c.recv(&mut buf, from).unwrap();
                        for (i, v) in buf.iter().enumerate() {
                            assert_eq!(*v, val(from, to, i), "{what}: {from} -> {to} [{i}]");
                        }
                    }
                }
            });
            assert!(comms[from].connected_peers().contains(&to), "{what}");
            assert!(comms[to].connected_peers().contains(&from), "{what}");
        }
    }
}

/// The highest rank that rank 0 is not connected to at creation: it waits
/// for rank 0's side of the first-use connection (the lower rank dials).
fn unconnected_peer_of_0() -> usize {
    (1..N)
        .rev()
        .find(|q| !init_peers(0, N).contains(q))
        .expect("a peer of 0 outside its creation set")
}

#[test]
fn a_first_use_connection_the_peer_never_answers_times_out_naming_it() {
    let _w = Watchdog::new("scale: first-use timeout", Duration::from_secs(240));
    for (what, p2p, shm) in LINKS.into_iter().skip(1) {
        let mut cfg = config(p2p, shm);
        cfg.timeout = Some(Duration::from_millis(1500));
        let comms = init_threads(N, &cfg).unwrap();
        let q = unconnected_peer_of_0();
        let t0 = Instant::now();
        let mut buf = vec![0.0f64; 4];
        let r = comms[q].recv(&mut buf, 0);
        let took = t0.elapsed();
        assert_err(&r, ErrorKind::Timeout, &["rank 0"]);
        assert!(took < Duration::from_secs(10), "{what}: {took:?}");
        assert!(comms[q].async_error().is_some(), "{what}");
    }
}

#[test]
fn abort_and_revoke_end_a_first_use_connection_in_progress() {
    let _w = Watchdog::new("scale: first-use abort", Duration::from_secs(240));
    for (what, p2p, shm) in LINKS.into_iter().skip(1) {
        for revoke in [false, true] {
            let comms = init_threads(N, &config(p2p, shm)).unwrap();
            let q = unconnected_peer_of_0();
            let c = comms[q].clone();
            let t0 = Instant::now();
            let r = std::thread::scope(|s| {
                let h = s.spawn(|| {
                    let mut buf = vec![0.0f64; 4];
                    c.recv(&mut buf, 0)
                });
                std::thread::sleep(Duration::from_millis(300));
                if revoke {
                    comms[q].revoke();
                } else {
                    comms[q].abort();
                }
                h.join().unwrap()
            });
            let took = t0.elapsed();
            let e = r.expect_err(what);
            assert!(e.message().contains("rank 0"), "{what}: {e}");
            assert!(
                took < Duration::from_secs(5),
                "{what} revoke {revoke}: {took:?}"
            );
        }
    }
}

/// First-use connections a rank may keep in the pool tests.
const POOL: usize = 2;

fn pool_config(p2p_disable: bool, shm_disable: bool) -> Config {
    pool_config_of(p2p_disable, shm_disable, POOL)
}

fn pool_config_of(p2p_disable: bool, shm_disable: bool, pool: usize) -> Config {
    test_config(|h| {
        h.p2p_disable = p2p_disable;
        h.shm_disable = shm_disable;
        h.max_peers = pool;
    })
}

/// Asserts that `c` never held more first-use connections than the pool.
fn assert_bound(c: &Communicator, n: usize, after: &str) {
    assert_bound_of(c, n, POOL, after);
}

/// Asserts that `c` never held more first-use connections than `pool`.
fn assert_bound_of(c: &Communicator, n: usize, pool: usize, after: &str) {
    let r = c.rank();
    let creation = init_peers(r, n);
    let now = c
        .connected_peers()
        .iter()
        .filter(|q| !creation.contains(q))
        .count();
    assert!(
        now <= pool && c.first_use_peak() <= pool,
        "rank {r} after {after}: {now} first-use connections now, {} at most, bound {pool}",
        c.first_use_peak()
    );
    // Those of creation are never released.
    for q in creation {
        assert!(
            c.connected_peers().contains(&q),
            "rank {r} after {after}: {q}"
        );
    }
}

/// All-to-all, gather, scatter and send/recv to every peer, `reps` times,
/// counts 0 and odd, each result checked exactly and the bound after each.
fn pooled_workload(c: &Communicator, n: usize, reps: usize, what: &str) {
    pooled_workload_of(c, n, POOL, reps, what);
}

/// [`pooled_workload`] with a pool of `pool`.
fn pooled_workload_of(c: &Communicator, n: usize, pool: usize, reps: usize, what: &str) {
    let assert_bound = |c: &Communicator, n: usize, after: &str| assert_bound_of(c, n, pool, after);
    let r = c.rank();
    for rep in 0..reps {
        for count in [0usize, 1, 7, 1001] {
            let send: Vec<f64> = (0..n * count)
                .map(|k| val(r, k / count, k % count))
                .collect();
            let mut recv = vec![-1.0; n * count];
            c.all_to_all(&send, &mut recv).unwrap();
            for (k, v) in recv.iter().enumerate() {
                let want = val(k / count, r, k % count);
                assert_eq!(
                    *v, want,
                    "{what} rep {rep}: all_to_all rank {r} count {count} [{k}]"
                );
            }
            assert_bound(c, n, "all_to_all");

            let root = (rep * 5 + count) % n;
            let mine: Vec<f64> = (0..count).map(|i| val(r, root, i)).collect();
            let mut all = vec![-1.0; if r == root { n * count } else { 0 }];
            c.gather(&mine, &mut all, root).unwrap();
            if r == root {
                for (k, v) in all.iter().enumerate() {
                    let want = val(k / count, root, k % count);
                    assert_eq!(
                        *v, want,
                        "{what} rep {rep}: gather to {root} count {count} [{k}]"
                    );
                }
            }
            assert_bound(c, n, "gather");

            let root = (rep * 3 + count + 1) % n;
            let blocks: Vec<f64> = if r == root {
                (0..n * count)
                    .map(|k| val(root, k / count, k % count))
                    .collect()
            } else {
                Vec::new()
            };
            let mut part = vec![-1.0; count];
            c.scatter(&blocks, &mut part, root).unwrap();
            for (i, v) in part.iter().enumerate() {
                assert_eq!(
                    *v,
                    val(root, r, i),
                    "{what} rep {rep}: scatter from {root} count {count} [{i}]"
                );
            }
            assert_bound(c, n, "scatter");
        }
        // Send/recv to every peer, one partner a step (each step its own
        // group; sizes change with the step: odd, past a 64 KiB ring, 0).
        for step in 0..oxccl_core::peers::rounds(n) {
            let Some(p) = oxccl_core::peers::round_partner(r, n, step) else {
                continue;
            };
            let count = [3usize, 1001, 8193, 0][step % 4];
            let out: Vec<f64> = (0..count).map(|i| val(r, p, i + rep)).collect();
            let mut inb = vec![-1.0; count];
            let mut g = Group::new();
            g.recv(c, &mut inb, p);
            g.send(c, &out, p);
            g.run().unwrap();
            for (i, v) in inb.iter().enumerate() {
                assert_eq!(
                    *v,
                    val(p, r, i + rep),
                    "{what} rep {rep}: step {step} with {p} [{i}]"
                );
            }
            assert_bound(c, n, "send/recv with one partner");
        }
    }
    // A rank outside any call answers offers only at its next call: the
    // early ones wait here, inside one, for the others.
    barrier(c);
}

fn barrier(c: &Communicator) {
    let mut one = [1.0f64];
    c.all_reduce_in_place(&mut one, RedOp::Sum).unwrap();
    assert_eq!(one[0], c.size() as f64);
}

/// Send/recv to every peer in shifts: step s sends to r + s and receives
/// from r - s, so a pair carries a message each way, many steps apart, and
/// a fast rank's send may wait in its peer's ring for steps. Such a
/// connection cannot be released until its message is received: a call
/// that needs two new peers then goes past the pool by at most those two
/// (`pool.rs`). Exact results, and that bound.
fn shifted_sends(c: &Communicator, n: usize, reps: usize, what: &str) {
    let r = c.rank();
    for rep in 0..reps {
        for s in 1..n {
            let to = (r + s) % n;
            let from = (r + n - s) % n;
            let count = [3usize, 1001, 8193, 0][s % 4];
            let out: Vec<f64> = (0..count).map(|i| val(r, to, i + rep)).collect();
            let mut inb = vec![-1.0; count];
            let mut g = Group::new();
            g.send(c, &out, to);
            g.recv(c, &mut inb, from);
            g.run().unwrap();
            for (i, v) in inb.iter().enumerate() {
                assert_eq!(
                    *v,
                    val(from, r, i + rep),
                    "{what} rep {rep}: step {s} from {from} [{i}]"
                );
            }
            assert!(
                c.first_use_peak() <= POOL + 2,
                "{what}: rank {r} held {} first-use connections",
                c.first_use_peak()
            );
        }
    }
    barrier(c);
    eprintln!(
        "{what}: rank {r}: at most {} first-use connections",
        c.first_use_peak()
    );
}

#[test]
fn a_small_pool_bounds_first_use_connections_with_exact_results_threads() {
    let _w = Watchdog::new("scale: pool of 2, threads", Duration::from_secs(400));
    // 13: odd, so every round of the all-to-all leaves one rank out.
    let n = 13;
    for (what, p2p, shm) in LINKS {
        let comms = init_threads(n, &pool_config(p2p, shm)).unwrap();
        on_ranks(&comms, |c| pooled_workload(c, n, 2, what));
        // The bounded collectives still run on the connections of creation.
        on_ranks(&comms, |c| {
            let send = [c.rank() as f64];
            let mut sum = [0.0];
            c.all_reduce(&send, &mut sum, RedOp::Sum).unwrap();
            assert_eq!(sum[0], (n * (n - 1) / 2) as f64, "{what}");
            assert_bound(c, n, "all_reduce");
        });
        on_ranks(&comms, |c| shifted_sends(c, n, 2, what));
        for c in comms {
            c.destroy().unwrap();
        }
    }
}

/// Pools of 1 (one round at a time, each batch's releases awaited before
/// the next) and 5 (batches of two rounds, whose releases are answered
/// while the next batch runs) over 14 ranks (even: no rank sits a round
/// out), and 7 over 17 (three rounds a batch, the last batch shorter):
/// exact results and the bound after every call.
#[test]
fn pools_of_other_sizes_run_all_to_all_in_batches_threads() {
    let _w = Watchdog::new(
        "scale: pools of 1, 5 and 7, threads",
        Duration::from_secs(400),
    );
    for (n, pool) in [(14, 1), (14, 5), (17, 7)] {
        for (what, p2p, shm) in LINKS {
            let what = format!("{what}, {n} ranks, pool of {pool}");
            let comms = init_threads(n, &pool_config_of(p2p, shm, pool)).unwrap();
            on_ranks(&comms, |c| pooled_workload_of(c, n, pool, 1, &what));
            for c in comms {
                c.destroy().unwrap();
            }
        }
    }
}

/// Child side of the process test: one rank with OXCCL_P2P_MAX_PEERS=2
/// from the environment (the parameter registry's path).
#[test]
#[ignore = "child rank of a_small_pool_bounds_first_use_connections_processes"]
fn pool_child() {
    let Some(ctx) = child_ctx() else {
        panic!("run only as a child of a_small_pool_bounds_first_use_connections_processes");
    };
    let cfg = Config {
        timeout: Some(Duration::from_secs(60)),
        init_timeout: Some(Duration::from_secs(60)),
        ..Config::default()
    };
    assert_eq!(cfg.host_settings().max_peers, POOL, "OXCCL_P2P_MAX_PEERS");
    let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, cfg)
        .unwrap_or_else(|e| panic!("rank {}: init: {e}", ctx.rank));
    pooled_workload(&c, ctx.nranks, 2, "processes");
    shifted_sends(&c, ctx.nranks, 1, "processes");
    c.destroy().unwrap();
}

#[test]
fn a_small_pool_bounds_first_use_connections_processes() {
    if child_ctx().is_some() {
        return;
    }
    let _w = Watchdog::new("scale: pool of 2, processes", Duration::from_secs(400));
    for (n, shm_disable) in [(12, "0"), (9, "1")] {
        let id = UniqueId::new().unwrap();
        let mut p = Procs::spawn(
            "pool_child",
            n,
            &id,
            &[
                ("OXCCL_P2P_MAX_PEERS", "2"),
                ("NCCL_BUFFSIZE", "65536"),
                ("NCCL_SHM_DISABLE", shm_disable),
            ],
        );
        p.expect_success(Duration::from_secs(300));
    }
}

/// Rank 0 of `n` threads with a pool of 1: the first-use peers of rank 0
/// (outside its creation set), ascending.
fn first_use_peers_of_0(n: usize) -> Vec<usize> {
    (1..n).filter(|q| !init_peers(0, n).contains(q)).collect()
}

/// Rank 0 of 12 threads with a pool of 1 sends to `a`, then to `b` (both
/// first-use peers): `a` makes no call, so rank 0's offer to release their
/// pair stays pending, and rank 0 connects `b` past the bound (logged).
/// Returns `(a, b)`.
fn offer_left_pending(comms: &[Communicator], what: &str) -> (usize, usize) {
    let far = first_use_peers_of_0(comms.len());
    let (a, b) = (far[0], far[1]);
    for q in [a, b] {
        on_ranks(comms, |c| {
            let buf = vec![q as f64 + 0.5; 5];
            if c.rank() == 0 {
                c.send(&buf, q).unwrap();
            } else if c.rank() == q {
                let mut got = vec![0.0f64; 5];
                c.recv(&mut got, 0).unwrap();
                assert_eq!(got, buf, "{what}");
            }
        });
    }
    assert_eq!(comms[0].first_use_peak(), 2, "{what}");
    (a, b)
}

#[test]
fn an_abort_ends_a_release_the_peer_does_not_answer_naming_it() {
    let _w = Watchdog::new("scale: abort during a release", Duration::from_secs(240));
    let n = 12;
    for ((what, p2p, shm), revoke) in LINKS.into_iter().zip([false, true, false]) {
        let cfg = test_config(|h| {
            h.p2p_disable = p2p;
            h.shm_disable = shm;
            h.max_peers = 1;
        });
        let comms = init_threads(n, &cfg).unwrap();
        let (a, _) = offer_left_pending(&comms, what);
        // The pair with `a` must be settled before a call uses it: the
        // send waits for `a`'s answer until the abort or revoke.
        let c0 = comms[0].clone();
        let r = std::thread::scope(|s| {
            let h = s.spawn(move || c0.send(&[2.0f64; 3], a));
            std::thread::sleep(Duration::from_millis(300));
            if revoke {
                comms[0].revoke();
            } else {
                comms[0].abort();
            }
            h.join().unwrap()
        });
        let e = r.expect_err(what);
        assert!(
            e.message().contains(&format!("rank {a}")) && e.message().contains("releas"),
            "{what} revoke {revoke}: the error names the peer asked to release: {e}"
        );
        for c in comms.into_iter().skip(1) {
            c.destroy().unwrap();
        }
    }
}

#[test]
fn a_release_the_peer_does_not_answer_times_out_naming_it() {
    let _w = Watchdog::new("scale: release timeout", Duration::from_secs(240));
    let n = 12;
    let mut cfg = test_config(|h| {
        h.p2p_disable = true;
        h.max_peers = 1;
    });
    cfg.timeout = Some(Duration::from_millis(2500));
    let comms = init_threads(n, &cfg).unwrap();
    let (a, _) = offer_left_pending(&comms, "shared memory");
    let r = comms[0].send(&[2.0f64], a);
    assert_err(&r, ErrorKind::Timeout, &[&format!("rank {a}"), "release"]);
    assert!(comms[0].async_error().is_some());
}

/// A peer that answers at its next call: the pending offer settles then,
/// both ends drop the pair, and the next send between them connects anew.
#[test]
fn a_pending_release_settles_at_the_peers_next_call() {
    let _w = Watchdog::new("scale: pending release", Duration::from_secs(240));
    let n = 12;
    for (what, p2p, shm) in LINKS {
        let cfg = test_config(|h| {
            h.p2p_disable = p2p;
            h.shm_disable = shm;
            h.max_peers = 1;
        });
        let comms = init_threads(n, &cfg).unwrap();
        let (a, b) = offer_left_pending(&comms, what);
        // Rank 0 and `a` exchange again: `a` answers the offer at the
        // start of its call, both drop the pair, then connect it anew.
        on_ranks(&comms, |c| {
            if c.rank() == 0 {
                let mut got = vec![0.0f64; 1001];
                c.recv(&mut got, a).unwrap();
                assert!(
                    got.iter().enumerate().all(|(i, v)| *v == i as f64),
                    "{what}"
                );
            } else if c.rank() == a {
                let buf: Vec<f64> = (0..1001).map(|i| i as f64).collect();
                c.send(&buf, 0).unwrap();
                assert!(!c.connected_peers().is_empty());
            }
        });
        assert!(comms[0].connected_peers().contains(&a), "{what}");
        assert!(comms[a].connected_peers().contains(&0), "{what}");
        // `b` was released to make room for `a` (an offer `b` answers at
        // its next call: an all-reduce, which every rank makes).
        // The answer crosses a socket (or a slot) beside the all-reduce's
        // data: rank 0 reads it at one of its next calls.
        let mut rounds = 0;
        while comms[0].connected_peers().contains(&b) {
            rounds += 1;
            assert!(rounds <= 1000, "{what}: rank 0 still holds rank {b}");
            on_ranks(&comms, |c| {
                let mut one = [1.0f64];
                c.all_reduce_in_place(&mut one, RedOp::Sum).unwrap();
                assert_eq!(one[0], n as f64, "{what}");
            });
        }
        assert!(!comms[b].connected_peers().contains(&0), "{what}");
        for c in comms {
            c.destroy().unwrap();
        }
    }
}
