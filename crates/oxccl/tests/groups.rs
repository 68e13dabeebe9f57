//! Groups (`ncclGroupStart/End`): send/recv pairs never deadlock whatever the
//! order they are posted in, several sends to one peer keep their order, one
//! thread can drive every rank of a communicator in one group, and argument
//! errors inside a group leave the communicators usable.

mod common;

use common::*;
use oxccl::{ErrorKind, Group, RedOp};
use std::time::Duration;

/// Rank r's message to rank q, element i (distinct for every (r, q, i)).
fn msg(r: usize, q: usize, i: usize) -> u32 {
    (r as u32) << 28 | (q as u32) << 24 | (i as u32 & 0xff_ffff)
}

/// Messages far larger than a ring (64 KiB): a blocking send would wait for
/// its peer's receive, which comes second in the group.
#[test]
fn recv_posted_before_send_to_the_same_peer() {
    let _w = Watchdog::new(
        "recv_posted_before_send_to_the_same_peer",
        Duration::from_secs(120),
    );
    let comms = init_threads(2, &test_config(|_| {})).unwrap();
    let count = (1 << 20) + 3;
    on_ranks(&comms, |c| {
        let me = c.rank();
        let peer = 1 - me;
        let send: Vec<u32> = (0..count).map(|i| msg(me, peer, i)).collect();
        let mut recv = vec![0u32; count];
        let mut g = Group::new();
        g.recv(c, &mut recv, peer).send(c, &send, peer);
        g.run().unwrap();
        assert!(recv.iter().enumerate().all(|(i, &v)| v == msg(peer, me, i)));
    });
}

/// A ring exchange on 5 ranks, every rank receiving first.
#[test]
fn ring_exchange_receive_first() {
    let _w = Watchdog::new("ring_exchange_receive_first", Duration::from_secs(120));
    let n = 5;
    let comms = init_threads(n, &test_config(|_| {})).unwrap();
    let count = 300_007;
    on_ranks(&comms, |c| {
        let me = c.rank();
        let (right, left) = ((me + 1) % n, (me + n - 1) % n);
        let send: Vec<u32> = (0..count).map(|i| msg(me, right, i)).collect();
        let mut recv = vec![0u32; count];
        let mut g = Group::new();
        g.recv(c, &mut recv, left).send(c, &send, right);
        g.run().unwrap();
        assert!(recv.iter().enumerate().all(|(i, &v)| v == msg(left, me, i)));
    });
}

fn size_of_msg(r: usize, q: usize, seed: u64) -> usize {
    match mix(seed ^ (r * 31 + q) as u64) % 5 {
        0 => 0,
        1 => 1,
        2 => 17,
        3 => 4099,
        _ => 70_001,
    }
}

/// Every rank sends to and receives from every rank (itself included) with
/// sizes that differ per pair, posting its operations in a shuffled order.
#[test]
fn all_pairs_with_varied_sizes_in_any_order() {
    let _w = Watchdog::new(
        "all_pairs_with_varied_sizes_in_any_order",
        Duration::from_secs(120),
    );
    for n in [3usize, 4] {
        let comms = init_threads(n, &test_config(|_| {})).unwrap();
        for seed in 0..4u64 {
            on_ranks(&comms, |c| {
                let me = c.rank();
                let sends: Vec<Vec<u32>> = (0..n)
                    .map(|q| {
                        (0..size_of_msg(me, q, seed))
                            .map(|i| msg(me, q, i))
                            .collect()
                    })
                    .collect();
                let mut recvs: Vec<Vec<u32>> = (0..n)
                    .map(|q| vec![0u32; size_of_msg(q, me, seed)])
                    .collect();
                // 2n operations in an order that depends on rank and seed.
                let mut order: Vec<usize> = (0..2 * n).collect();
                let mut z = mix(seed * 7 + me as u64);
                for i in (1..order.len()).rev() {
                    z = mix(z);
                    order.swap(i, (z % (i as u64 + 1)) as usize);
                }
                let mut recv_slots: Vec<Option<&mut Vec<u32>>> =
                    recvs.iter_mut().map(Some).collect();
                let mut g = Group::new();
                for k in order {
                    if k < n {
                        g.send(c, &sends[k], k);
                    } else {
                        let q = k - n;
                        g.recv(c, recv_slots[q].take().unwrap(), q);
                    }
                }
                g.run()
                    .unwrap_or_else(|e| panic!("n={n} seed={seed} rank {me}: {e}"));
                for (q, r) in recvs.iter().enumerate() {
                    assert!(
                        r.iter().enumerate().all(|(i, &v)| v == msg(q, me, i)),
                        "n={n} seed={seed}: rank {me} got wrong data from rank {q}"
                    );
                }
            });
        }
    }
}

/// Several sends to one peer in one group arrive in the order they were
/// posted, matched with the receives in the order those were posted.
#[test]
fn sends_to_one_peer_keep_their_order() {
    let _w = Watchdog::new(
        "sends_to_one_peer_keep_their_order",
        Duration::from_secs(120),
    );
    for over_shm in [false, true] {
        // Threads over shared memory too: a different transport, same rule.
        let comms = init_threads(2, &test_config(|h| h.p2p_disable = over_shm)).unwrap();
        let sizes = [5usize, 0, 100_003, 1, 64];
        on_ranks(&comms, |c| {
            if c.rank() == 0 {
                let bufs: Vec<Vec<u32>> = sizes
                    .iter()
                    .enumerate()
                    .map(|(k, &s)| (0..s).map(|i| msg(k, 9, i)).collect())
                    .collect();
                let mut g = Group::new();
                for b in &bufs {
                    g.send(c, b, 1);
                }
                g.run().unwrap();
            } else {
                let mut bufs: Vec<Vec<u32>> = sizes.iter().map(|&s| vec![0; s]).collect();
                let mut g = Group::new();
                for b in bufs.iter_mut() {
                    g.recv(c, b, 0);
                }
                g.run().unwrap();
                for (k, b) in bufs.iter().enumerate() {
                    assert!(
                        b.iter().enumerate().all(|(i, &v)| v == msg(k, 9, i)),
                        "message {k} out of order or wrong"
                    );
                }
            }
        });
    }
}

/// One thread drives every rank of `init_threads(n)` in one group: each
/// rank's all-reduce plus a ring of sends and receives.
#[test]
fn one_thread_drives_every_rank() {
    let _w = Watchdog::new("one_thread_drives_every_rank", Duration::from_secs(120));
    for n in [2usize, 3, 8] {
        let comms = init_threads(n, &test_config(|_| {})).unwrap();
        let count = 20_011;
        let ar_send: Vec<Vec<f32>> = (0..n)
            .map(|r| (0..count).map(|i| (r * 3 + i % 11) as f32).collect())
            .collect();
        let mut ar_recv: Vec<Vec<f32>> = vec![vec![0.0; count]; n];
        let mut inplace: Vec<Vec<i64>> = (0..n).map(|r| vec![r as i64 + 1; 33]).collect();
        let p2p_send: Vec<Vec<u32>> = (0..n)
            .map(|r| (0..count).map(|i| msg(r, (r + 1) % n, i)).collect())
            .collect();
        let mut p2p_recv: Vec<Vec<u32>> = vec![vec![0; count]; n];
        let mut g = Group::new();
        for ((((c, s), r), ip), (ps, pr)) in comms
            .iter()
            .zip(&ar_send)
            .zip(ar_recv.iter_mut())
            .zip(inplace.iter_mut())
            .zip(p2p_send.iter().zip(p2p_recv.iter_mut()))
        {
            let me = c.rank();
            g.recv(c, pr, (me + n - 1) % n);
            g.all_reduce(c, s, r, RedOp::Sum).unwrap();
            g.send(c, ps, (me + 1) % n);
            g.all_reduce_in_place(c, ip, RedOp::Prod);
        }
        g.run().unwrap();
        for me in 0..n {
            for i in 0..count {
                let want: f32 = (0..n).map(|r| (r * 3 + i % 11) as f32).sum();
                assert_eq!(ar_recv[me][i], want, "n={n} rank {me} all_reduce[{i}]");
                assert_eq!(p2p_recv[me][i], msg((me + n - 1) % n, me, i));
            }
            let prod: i64 = (1..=n as i64).product();
            assert!(inplace[me].iter().all(|&v| v == prod));
        }
    }
}

/// Several collectives of one rank in one group share streams: they keep
/// their order on every rank (each rank its own thread).
#[test]
fn collectives_and_p2p_mixed_in_one_group() {
    let _w = Watchdog::new(
        "collectives_and_p2p_mixed_in_one_group",
        Duration::from_secs(120),
    );
    let n = 4;
    let comms = init_threads(n, &test_config(|_| {})).unwrap();
    on_ranks(&comms, |c| {
        let me = c.rank();
        let a: Vec<i32> = (0..1000).map(|i| i + me as i32).collect();
        let mut ra = vec![0i32; 1000];
        let b: Vec<f64> = vec![me as f64; 77];
        let mut rb = vec![0f64; 77];
        let s: Vec<u8> = vec![me as u8; 5000];
        let mut r = vec![0u8; 5000];
        let mut g = Group::new();
        g.all_reduce(c, &a, &mut ra, RedOp::Max).unwrap();
        g.send(c, &s, (me + 2) % n);
        g.all_reduce(c, &b, &mut rb, RedOp::Sum).unwrap();
        g.recv(c, &mut r, (me + 2) % n);
        g.run().unwrap();
        assert!(ra.iter().enumerate().all(|(i, &v)| v == i as i32 + 3));
        assert!(rb.iter().all(|&v| v == 6.0));
        assert!(r.iter().all(|&v| v as usize == (me + 2) % n));
    });
}

/// An argument error in the middle of a group (after valid operations were
/// prepared) fails the group on every rank and leaves the communicators
/// usable: the next valid calls must match up across ranks (the operations
/// prepared before the faulty one must not have used up sequence numbers).
#[test]
fn argument_error_inside_a_group_leaves_the_communicator_usable() {
    let _w = Watchdog::new("argument_error_inside_a_group", Duration::from_secs(120));
    let n = 3;
    let comms = init_threads(n, &test_config(|_| {})).unwrap();
    on_ranks(&comms, |c| {
        let me = c.rank();
        let a = vec![1.0f32; 100];
        let mut ra = vec![0f32; 100];
        let s = vec![7u8; 10];
        let check = |round: &str| {
            let mut ra = vec![0f32; 100];
            let mut r = vec![0u8; 10];
            let mut g = Group::new();
            g.all_reduce(c, &a, &mut ra, RedOp::Sum).unwrap();
            g.send(c, &s, (me + 1) % n)
                .recv(c, &mut r, (me + n - 1) % n);
            g.run()
                .unwrap_or_else(|e| panic!("rank {me}, after {round}: {e}"));
            assert!(ra.iter().all(|&v| v == 3.0));
            assert_eq!(r, s);
        };
        // A valid all-reduce and send, then a send to a peer that does not exist.
        let mut g = Group::new();
        g.all_reduce(c, &a, &mut ra, RedOp::Sum).unwrap();
        g.send(c, &s, (me + 1) % n);
        g.send(c, &s, n + 4);
        let e = g.run();
        assert_err(&e, ErrorKind::InvalidArgument, &["peer 7", "out of range"]);
        check("a bad peer");
        // Receive buffers overlapping inside a group: refused after every
        // operation of the group was prepared.
        let mut buf = vec![0u8; 20];
        let (p, len) = (buf.as_mut_ptr(), buf.len());
        let ops = [
            (
                c,
                raw(
                    oxccl::CollKind::AllReduce,
                    a.as_ptr(),
                    ra.as_mut_ptr(),
                    a.len(),
                    RedOp::Sum,
                    0,
                ),
            ),
            (
                c,
                raw(
                    oxccl::CollKind::Recv,
                    std::ptr::null::<u8>(),
                    p,
                    len,
                    RedOp::Sum,
                    (me + n - 1) % n,
                ),
            ),
            (
                c,
                raw(
                    oxccl::CollKind::Recv,
                    std::ptr::null::<u8>(),
                    p.wrapping_add(4),
                    8,
                    RedOp::Sum,
                    (me + 1) % n,
                ),
            ),
        ];
        // SAFETY: the receives point into `buf` and the all-reduce into `a`
        // and `ra`, all alive until this returns; the library must refuse
        // the overlapping receives before touching any.
        let r = unsafe { oxccl::raw::run_group(&ops) };
        assert_err(&r, ErrorKind::InvalidArgument, &["overlaps"]);
        check("overlapping buffers");
        let mut x = vec![me as u64; 9];
        c.all_reduce_in_place(&mut x, RedOp::Sum).unwrap();
        assert!(x.iter().all(|&v| v == 3));
    });
}

/// A send to itself needs its receive in the same group; alone it is an
/// error that leaves the communicator usable.
#[test]
fn send_to_self() {
    let _w = Watchdog::new("send_to_self", Duration::from_secs(60));
    let comms = init_threads(2, &test_config(|_| {})).unwrap();
    on_ranks(&comms, |c| {
        let me = c.rank();
        let s: Vec<u32> = (0..1000).map(|i| i as u32 ^ me as u32).collect();
        let mut r = vec![0u32; 1000];
        assert_err(&c.send(&s, me), ErrorKind::InvalidUsage, &["itself"]);
        let mut g = Group::new();
        g.send(c, &s, me).recv(c, &mut r[..999], me);
        assert_err(&g.run(), ErrorKind::InvalidUsage, &["1000", "999"]);
        let mut g = Group::new();
        g.recv(c, &mut r, me).send(c, &s, me);
        g.run().unwrap();
        assert_eq!(r, s);
        let mut y = vec![1i8; 3];
        c.all_reduce_in_place(&mut y, RedOp::Sum).unwrap();
        assert_eq!(y, vec![2i8; 3]);
    });
}
