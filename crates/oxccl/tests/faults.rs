//! Faults with ranks as threads: abort, timeout, mismatched calls across
//! ranks, a peer that goes away, a rank that never arrives at init. Each test
//! is bounded (watchdog and library timeouts) and asserts the error kind, how
//! fast it came and that the message names the peer or the cause.
//! (Killed processes: see `processes.rs`.)

mod common;

use common::*;
use oxccl::{Communicator, Config, ErrorKind, Group, RedOp, UniqueId};
use std::time::{Duration, Instant};

fn with_timeout(t: Duration) -> Config {
    let mut c = test_config(|_| {});
    c.timeout = Some(t);
    c
}

#[test]
fn abort_unblocks_a_rank_waiting_for_a_peer_that_never_comes() {
    let _w = Watchdog::new("abort_unblocks", Duration::from_secs(60));
    let comms = init_threads(2, &test_config(|_| {})).unwrap();
    let c0 = comms[0].clone();
    let waiter = std::thread::spawn(move || {
        let mut x = vec![1.0f32; 1000];
        let r = c0.all_reduce_in_place(&mut x, RedOp::Sum);
        (r, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !waiter.is_finished(),
        "all_reduce returned with its peer absent"
    );
    let t = Instant::now();
    comms[0].abort();
    let (r, done) = waiter.join().unwrap();
    let took = done.saturating_duration_since(t);
    assert!(
        took < Duration::from_secs(2),
        "the waiting call returned {took:?} after abort"
    );
    assert_err(&r, ErrorKind::InvalidUsage, &["abort"]);
    // Later calls on the aborted rank: InvalidUsage, at once.
    let mut y = vec![0u8; 4];
    assert_err(
        &comms[0].all_reduce_in_place(&mut y, RedOp::Sum),
        ErrorKind::InvalidUsage,
        &["aborted"],
    );
    assert_err(&comms[0].send(&y, 1), ErrorKind::InvalidUsage, &["aborted"]);
    assert!(comms[0].async_error().is_some());
    // The peer now makes the same call: rank 0's input may already be in its
    // ring (then the call can complete), else it learns that rank 0 is gone;
    // never a hang. Its next call cannot complete and must say why.
    let t = Instant::now();
    let mut x = vec![1.0f32; 1000];
    match comms[1].all_reduce_in_place(&mut x, RedOp::Sum) {
        Ok(()) => assert!(x.iter().all(|&v| v == 2.0)),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
            assert!(e.message().contains("rank 0"), "{e}");
        }
    }
    let r = comms[1].all_reduce_in_place(&mut y, RedOp::Sum);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "peer of an aborted rank took {:?}",
        t.elapsed()
    );
    assert_err(&r, ErrorKind::Remote, &["rank 0"]);
    assert!(r.unwrap_err().message().contains("abort"));
}

#[test]
fn abort_unblocks_a_group_send_never_received() {
    let _w = Watchdog::new("abort_unblocks_group", Duration::from_secs(60));
    let comms = init_threads(3, &test_config(|_| {})).unwrap();
    let c2 = comms[2].clone();
    let waiter = std::thread::spawn(move || {
        // Far more than a ring holds: the send blocks on rank 0, which never receives.
        let big = vec![3u64; 1 << 20];
        let mut r = vec![0u64; 10];
        let mut g = Group::new();
        g.send(&c2, &big, 0).recv(&c2, &mut r, 1);
        g.run()
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished());
    let t = Instant::now();
    comms[2].abort();
    let r = waiter.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_err(&r, ErrorKind::InvalidUsage, &["abort"]);
    // Aborting twice, or an idle communicator, is harmless.
    comms[2].abort();
    comms[0].abort();
}

#[test]
fn timeout_names_the_rank_waited_on() {
    let _w = Watchdog::new("timeout_names_the_rank", Duration::from_secs(60));
    let comms = init_threads(2, &with_timeout(Duration::from_millis(500))).unwrap();
    let t = Instant::now();
    let mut x = vec![1i32; 100];
    let r = comms[0].all_reduce_in_place(&mut x, RedOp::Sum);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(2000),
        "timeout of 500 ms took {took:?}"
    );
    assert_err(&r, ErrorKind::Timeout, &["rank 1", "0.5 s"]);
    // The communicator is now in an error state.
    assert_err(
        &comms[0].all_reduce_in_place(&mut x, RedOp::Sum),
        ErrorKind::InvalidUsage,
        &["error state"],
    );
}

#[test]
fn timeout_with_three_ranks_one_absent() {
    let _w = Watchdog::new("timeout_three_ranks", Duration::from_secs(60));
    let comms = init_threads(3, &with_timeout(Duration::from_millis(500))).unwrap();
    let t = Instant::now();
    let res = on_ranks(&comms[..2], |c| {
        let mut x = vec![c.rank() as f64; 5000];
        c.all_reduce_in_place(&mut x, RedOp::Sum)
    });
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    for r in &res {
        // Either its own timeout or the other waiting rank's report of it.
        assert_err(r, ErrorKind::Timeout, &["rank 2"]);
    }
}

/// Every rank runs its own call; every rank that waits for a peer must fail
/// with InvalidUsage naming both sides' calls, quickly (the library timeout
/// is 60 s). A rank whose part only sends (a broadcast root whose data fits
/// in the ring: NCCL's eager sends) may complete; its next call must then
/// fail with the peers' report.
fn mismatch(n: usize, f: impl Fn(&Communicator) -> oxccl::Result<()> + Sync, needles: &[&str]) {
    mismatch_eager(n, f, needles, false)
}

/// As [`mismatch`]; with `eager_ok`, ranks that only send may complete.
fn mismatch_eager(
    n: usize,
    f: impl Fn(&Communicator) -> oxccl::Result<()> + Sync,
    needles: &[&str],
    eager_ok: bool,
) {
    let comms = init_threads(n, &test_config(|_| {})).unwrap();
    let t = Instant::now();
    // Then every rank goes on with a next call, as a program would.
    let res = on_ranks(&comms, |c| match f(c) {
        Ok(()) if !eager_ok => panic!("rank {}: a mismatched call succeeded", c.rank()),
        Ok(()) => match c.all_reduce_in_place(&mut [0u8], RedOp::Sum) {
            Ok(()) => panic!(
                "rank {}: a mismatched call and the next one succeeded",
                c.rank()
            ),
            Err(e) => {
                // The peers' report, or the peer's stale bytes of the
                // mismatched call seen as a mismatch with this one.
                assert_eq!(e.kind(), ErrorKind::InvalidUsage, "rank {}: {e}", c.rank());
                assert!(e.message().contains("mismatched"), "rank {}: {e}", c.rank());
                Ok(())
            }
        },
        Err(e) => {
            let next = c.all_reduce_in_place(&mut [0u8], RedOp::Sum);
            assert_err(&next, ErrorKind::InvalidUsage, &["error state"]);
            Err(e)
        }
    });
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "mismatch took {:?}",
        t.elapsed()
    );
    assert!(res.iter().any(|r| r.is_err()));
    for (r, e) in res.iter().enumerate() {
        match e {
            Ok(()) => {}
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::InvalidUsage, "rank {r}: {e}");
                for nd in needles {
                    assert!(
                        e.message().contains(nd),
                        "rank {r}: message lacks {nd:?}: {e}"
                    );
                }
            }
        }
    }
}

#[test]
fn mismatched_counts() {
    let _w = Watchdog::new("mismatched_counts", Duration::from_secs(60));
    mismatch(
        2,
        |c| {
            let n = 10 + c.rank();
            let s = vec![1.0f32; n];
            let mut r = vec![0.0f32; n];
            c.all_reduce(&s, &mut r, RedOp::Sum)
        },
        &["count=10", "count=11", "rank 0", "rank 1"],
    );
    // Far larger than a ring: still caught before any data is misread.
    mismatch(
        3,
        |c| {
            let mut x = vec![1u8; 100_000 + usize::from(c.rank() == 2)];
            c.all_reduce_in_place(&mut x, RedOp::Max)
        },
        &["count=100000", "count=100001"],
    );
}

#[test]
fn mismatched_types_ops_roots_and_collectives() {
    let _w = Watchdog::new("mismatched_types", Duration::from_secs(60));
    mismatch(
        2,
        |c| {
            if c.rank() == 0 {
                c.all_reduce_in_place(&mut [1.0f32; 10], RedOp::Sum)
            } else {
                c.all_reduce_in_place(&mut [1i32; 10], RedOp::Sum)
            }
        },
        &["float", "int32"],
    );
    mismatch(
        2,
        |c| {
            let op = if c.rank() == 0 {
                RedOp::Sum
            } else {
                RedOp::Max
            };
            c.all_reduce_in_place(&mut [1.0f64; 10], op)
        },
        &["op=0", "op=2"],
    );
    mismatch_eager(
        2,
        |c| {
            let mut x = [1u32; 10];
            if c.rank() == 0 {
                c.all_reduce_in_place(&mut x, RedOp::Sum)
            } else {
                c.broadcast_in_place(&mut x, 1)
            }
        },
        &["all_reduce(count=10", "broadcast(count=10"],
        true,
    );
    mismatch(
        2,
        |c| {
            let mut x = [1u32; 10];
            if c.rank() == 0 {
                c.all_reduce_in_place(&mut x, RedOp::Sum)
            } else {
                c.broadcast_in_place(&mut x, 0)
            }
        },
        &["all_reduce(count=10", "broadcast(count=10"],
    );
    mismatch_eager(
        3,
        |c| {
            let root = usize::from(c.rank() == 1);
            c.broadcast_in_place(&mut [7u64; 64], root)
        },
        &["root/peer=0", "root/peer=1"],
        true,
    );
}

/// A receive shorter than the matching send (NCCL's "message truncated").
/// A send that fits in the ring completes before the receiver looks (as
/// NCCL's eager sends do); the receiver fails, and so does the sender's
/// next call, with the receiver's report. A send larger than the ring fails
/// on both sides at once.
#[test]
fn receive_shorter_than_send() {
    let _w = Watchdog::new("receive_shorter_than_send", Duration::from_secs(60));
    let comms = init_threads(2, &test_config(|_| {})).unwrap();
    let t = Instant::now();
    let res = on_ranks(&comms, |c| {
        if c.rank() == 0 {
            c.send(&vec![1u32; 100], 1)
        } else {
            c.recv(&mut [0u32; 50], 0)
        }
    });
    assert_err(&res[1], ErrorKind::InvalidUsage, &["count=100", "count=50"]);
    if res[0].is_err() {
        assert_err(&res[0], ErrorKind::InvalidUsage, &["count=100", "count=50"]);
    } else {
        let r = comms[0].all_reduce_in_place(&mut [1u8], RedOp::Sum);
        assert_err(
            &r,
            ErrorKind::InvalidUsage,
            &["rank 1 reported", "count=100", "count=50"],
        );
    }
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    mismatch(
        2,
        |c| {
            if c.rank() == 0 {
                c.send(&vec![1u32; 1 << 20], 1)
            } else {
                c.recv(&mut vec![0u32; (1 << 20) - 1], 0)
            }
        },
        &["count=1048576", "count=1048575"],
    );
}

/// Two ranks whose data parts both only wait (root of a gather, non-root of
/// a scatter): the ring of headers every rooted collective carries crosses
/// anyway, so both are refused at once, long before the 60 s timeout.
#[test]
fn mismatch_where_no_data_crosses_is_caught_by_the_headers() {
    let _w = Watchdog::new("mismatch_no_data_crosses", Duration::from_secs(60));
    mismatch(
        2,
        |c| {
            let mut r = vec![0f32; 20];
            if c.rank() == 0 {
                c.gather(&[1.0f32; 10], &mut r, 0)
            } else {
                c.scatter(&[], &mut r[..10], 0)
            }
        },
        &["gather(count=10", "scatter(count=10"],
    );
}

/// Every rank names itself root: each only sends (broadcast, scatter) or
/// only receives (gather), or the chain never closes (reduce). Each rank's
/// predecessor's header names another root, so every rank is refused at the
/// call, none returns success with a buffer of its own (as all did when a
/// root only sent).
#[test]
fn ranks_that_each_name_themselves_root_are_all_refused() {
    let _w = Watchdog::new("self_roots", Duration::from_secs(120));
    for n in [2, 3, 4] {
        mismatch(
            n,
            |c| c.broadcast_in_place(&mut [7u64; 64], c.rank()),
            &["root/peer="],
        );
        mismatch(
            n,
            |c| {
                let mut r = [0i32; 5];
                c.reduce(&[1i32; 5], &mut r, RedOp::Sum, c.rank())
            },
            &["root/peer="],
        );
        mismatch(
            n,
            |c| {
                let mut r = vec![0u8; 3 * c.size()];
                c.gather(&[1u8; 3], &mut r, c.rank())
            },
            &["root/peer="],
        );
        mismatch(
            n,
            |c| {
                let s = vec![1u32; 3 * c.size()];
                c.scatter(&s, &mut [0u32; 3], c.rank())
            },
            &["root/peer="],
        );
    }
}

/// A rank's thread destroys its communicator while its peer waits on it.
#[test]
fn peer_destroyed_while_waited_on() {
    let _w = Watchdog::new("peer_destroyed", Duration::from_secs(60));
    let mut comms = init_threads(2, &test_config(|_| {})).unwrap();
    let c1 = comms.pop().unwrap();
    let c0 = comms.pop().unwrap();
    let waiter = std::thread::spawn(move || {
        let mut x = vec![1.0f32; 100_000];
        c0.all_reduce_in_place(&mut x, RedOp::Sum)
    });
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    c1.destroy().unwrap();
    let r = waiter.join().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    assert_err(&r, ErrorKind::Remote, &["rank 1"]);
}

/// The strict form of the requirement: with only `Config::init_timeout` set
/// (the id creator's default is 120 s), the root learns the ranks' timeout
/// from their join messages and names the missing rank in time.
#[test]
fn init_fails_naming_the_rank_that_never_arrives() {
    let _w = Watchdog::new("init_missing_rank", Duration::from_secs(60));
    let id = UniqueId::new().unwrap();
    let cfg = Config {
        init_timeout: Some(Duration::from_secs(1)),
        ..test_config(|_| {})
    };
    let t = Instant::now();
    let res: Vec<oxccl::Result<Communicator>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (id, cfg) = (&id, cfg.clone());
                s.spawn(move || Communicator::init_rank_config(3, id, r, cfg))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "init with a 1 s timeout took {took:?}"
    );
    for r in &res {
        assert_err(r, ErrorKind::Timeout, &["rank 2"]);
    }
}

/// Ranks whose settings differ (ring size, channel count, NCCL_PROTO,
/// NCCL_ALGO) fail at init, all of them, naming the settings: over
/// in-process rings, shared memory and TCP (threads with NCCL_P2P_DISABLE,
/// plus NCCL_SHM_DISABLE). Before, a different ring size gave silently wrong
/// all-reduce results over TCP and a hang between threads.
#[test]
fn ranks_with_different_settings_fail_at_init() {
    let _w = Watchdog::new("ranks_with_different_settings", Duration::from_secs(120));
    type Tweak = fn(&mut oxccl::HostConfig);
    let tweaks: [(&str, Tweak); 5] = [
        ("1048576-byte rings", |h| h.capacity = 1 << 20),
        ("3+", |h| h.nchannels = Some(3)),
        ("NCCL_PROTO=Simple", |h| {
            h.protos = oxccl::Selection::parse("simple").unwrap()
        }),
        ("NCCL_ALGO=Ring", |h| {
            h.algos = oxccl::Selection::parse("ring").unwrap()
        }),
        // Rank 1 alone flips its transport choice.
        ("NCCL_P2P_DISABLE=", |h| h.p2p_disable = !h.p2p_disable),
    ];
    for (p2p_disable, shm_disable) in [(false, false), (true, false), (true, true)] {
        for (needle, tweak) in tweaks {
            let id = UniqueId::new().unwrap();
            let t = Instant::now();
            let res: Vec<oxccl::Result<Communicator>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..3)
                    .map(|r| {
                        let id = &id;
                        let cfg = Config {
                            init_timeout: Some(Duration::from_secs(20)),
                            ..test_config(|h| {
                                h.p2p_disable = p2p_disable;
                                h.shm_disable = shm_disable;
                                if r == 1 {
                                    tweak(h);
                                }
                            })
                        };
                        s.spawn(move || Communicator::init_rank_config(3, id, r, cfg))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "took {:?}",
                t.elapsed()
            );
            for (r, res) in res.iter().enumerate() {
                let what = format!(
                    "p2p_disable={p2p_disable} shm_disable={shm_disable} {needle}: rank {r}"
                );
                match res {
                    Ok(_) => panic!("{what}: init succeeded"),
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{what}: {e}");
                        assert!(e.message().contains(needle), "{what}: {e}");
                        assert!(
                            e.message().contains("every rank needs the same"),
                            "{what}: {e}"
                        );
                    }
                }
            }
        }
    }
}
