//! Connections that stay bounded as ranks grow: beyond 8 ranks a rank is
//! connected at creation only to its ring and tree peers, the collectives
//! with a bounded fan-out never connect more, and all-to-all and send/recv
//! connect the peers they need on first use, with exact results, over every
//! host transport (threads over in-process rings, over shared memory, over
//! TCP). A first-use connection that the peer never answers ends at the
//! timeout or at an abort or revoke, naming the peer.

mod common;

use common::*;
use oxccl::{Communicator, Config, ErrorKind, RedOp};
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
