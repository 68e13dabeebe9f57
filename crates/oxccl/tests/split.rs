//! `Communicator::split` (`ncclCommSplit`): membership by color, rank order by
//! key then parent rank, `None` color → no communicator, and collectives on
//! the new communicators (alongside the parent, which stays usable).

mod common;

use common::*;
use oxccl::{Communicator, DataType, RedOp};
use std::time::Duration;

/// Runs `split(color(r), key(r))` on every rank and checks membership and
/// order with collectives on the new communicators; returns them.
fn split_and_check(
    comms: &[Communicator],
    color: impl Fn(usize) -> Option<u32> + Sync,
    key: impl Fn(usize) -> i32 + Sync,
) -> Vec<Option<Communicator>> {
    let n = comms.len();
    on_ranks(comms, |c| {
        let me = c.rank();
        let sub = c.split(color(me), key(me)).unwrap();
        // Who should be with me, in which order.
        let mut members: Vec<(i32, usize)> = (0..n)
            .filter(|&r| color(r).is_some() && color(r) == color(me))
            .map(|r| (key(r), r))
            .collect();
        members.sort();
        let order: Vec<u64> = members.iter().map(|&(_, r)| r as u64).collect();
        match (&sub, color(me)) {
            (None, None) => {}
            (Some(s), Some(_)) => {
                assert_eq!(
                    s.size(),
                    order.len(),
                    "rank {me}: size of its new communicator"
                );
                assert_eq!(
                    order[s.rank()],
                    me as u64,
                    "rank {me}: its rank in the new communicator"
                );
                // The parent ranks of the members, gathered in new-rank order.
                let mut got = vec![0u64; s.size()];
                s.all_gather(&[me as u64], &mut got).unwrap();
                assert_eq!(got, order, "rank {me}: members in new-rank order");
                let mut sum = [me as u64 + 1];
                s.all_reduce_in_place(&mut sum, RedOp::Sum).unwrap();
                assert_eq!(sum[0], order.iter().map(|r| r + 1).sum::<u64>());
                // Every collective on the new communicator.
                for (i, coll) in Coll::ALL.into_iter().enumerate() {
                    let case = Case {
                        coll,
                        dtype: DataType::Float32,
                        op: RedOp::Sum,
                        count: 97,
                        root: i,
                        in_place: false,
                        seed: 5 + i as u64,
                    };
                    run_case(s, &case).unwrap_or_else(|e| panic!("rank {me}: {e}"));
                }
            }
            (got, want) => panic!(
                "rank {me}: color {want:?} gave {}",
                if got.is_some() {
                    "a communicator"
                } else {
                    "none"
                }
            ),
        }
        sub
    })
}

#[test]
fn split_by_color_and_key() {
    let _w = Watchdog::new("split_by_color_and_key", Duration::from_secs(120));
    let comms = init_threads(6, &test_config(|_| {})).unwrap();
    // Colors 0 and 1, rank 5 opts out; keys reverse the parent order.
    let subs = split_and_check(
        &comms,
        |r| if r == 5 { None } else { Some(r as u32 % 2) },
        |r| -(r as i32),
    );
    assert_eq!(subs.iter().filter(|s| s.is_some()).count(), 5);
    // Rank 4 is new rank 0 of color 0 (keys -4 < -2 < 0).
    assert_eq!(subs[4].as_ref().unwrap().rank(), 0);
    assert_eq!(subs[0].as_ref().unwrap().rank(), 2);
    // The parent still works, also while the children exist.
    on_ranks(&comms, |c| {
        let mut x = [1i32];
        c.all_reduce_in_place(&mut x, RedOp::Sum).unwrap();
        assert_eq!(x[0], 6);
    });
}

#[test]
fn split_equal_keys_keep_parent_order_and_colors_may_be_large() {
    let _w = Watchdog::new("split_equal_keys", Duration::from_secs(120));
    let comms = init_threads(5, &test_config(|_| {})).unwrap();
    split_and_check(&comms, |r| Some(if r < 3 { u32::MAX } else { 7 }), |_| 0);
    // One color for everyone: a copy of the parent.
    split_and_check(&comms, |_| Some(0), |_| 1);
    // Keys tie for some ranks only.
    split_and_check(&comms, |r| Some(r as u32 % 2), |r| (r / 2) as i32);
}

#[test]
fn split_everyone_opts_out() {
    let _w = Watchdog::new("split_everyone_opts_out", Duration::from_secs(60));
    let comms = init_threads(3, &test_config(|_| {})).unwrap();
    let subs = split_and_check(&comms, |_| None, |r| r as i32);
    assert!(subs.iter().all(|s| s.is_none()));
}

#[test]
fn split_of_a_split() {
    let _w = Watchdog::new("split_of_a_split", Duration::from_secs(120));
    let comms = init_threads(7, &test_config(|_| {})).unwrap();
    let subs = split_and_check(&comms, |r| Some((r % 2) as u32), |r| r as i32);
    // Evens (4 ranks: parent 0, 2, 4, 6) split again into pairs.
    let evens: Vec<Communicator> = subs.into_iter().step_by(2).map(|s| s.unwrap()).collect();
    assert_eq!(evens.len(), 4);
    let pairs = split_and_check(&evens, |r| Some((r / 2) as u32), |r| -(r as i32));
    assert!(pairs.iter().all(|p| p.as_ref().unwrap().size() == 2));
}

/// A communicator and its copy (split with one color) used at the same time
/// by two threads of every rank: independent streams, no interference.
#[test]
fn parent_and_child_used_concurrently() {
    let _w = Watchdog::new(
        "parent_and_child_used_concurrently",
        Duration::from_secs(120),
    );
    let n = 3;
    let comms = init_threads(n, &test_config(|_| {})).unwrap();
    let kids: Vec<Communicator> = on_ranks(&comms, |c| c.split(Some(1), 0).unwrap().unwrap());
    std::thread::scope(|s| {
        for (parent, kid) in comms.iter().zip(&kids) {
            for (k, c) in [parent, kid].into_iter().enumerate() {
                s.spawn(move || {
                    for i in 0..60usize {
                        let mut x = vec![(c.rank() + k + i) as u64; 1 + i * 37];
                        c.all_reduce_in_place(&mut x, RedOp::Sum).unwrap();
                        let want = (0..n).map(|r| (r + k + i) as u64).sum::<u64>();
                        assert!(x.iter().all(|&v| v == want), "comm {k} round {i}");
                    }
                });
            }
        }
    });
}

/// One group holding operations of a communicator and of its split, on
/// every rank (each rank locks both; the lock order must not deadlock).
#[test]
fn one_group_over_a_communicator_and_its_split() {
    let _w = Watchdog::new(
        "one_group_over_a_communicator_and_its_split",
        Duration::from_secs(120),
    );
    let n = 4;
    let comms = init_threads(n, &test_config(|_| {})).unwrap();
    let kids: Vec<Option<Communicator>> =
        on_ranks(&comms, |c| c.split(Some(c.rank() as u32 % 2), 0).unwrap());
    std::thread::scope(|s| {
        for (c, kid) in comms.iter().zip(&kids) {
            let kid = kid.as_ref().unwrap();
            s.spawn(move || {
                let a = vec![1i32; 5000];
                let mut ra = vec![0i32; 5000];
                let b = vec![c.rank() as f64; 10];
                let mut rb = vec![0f64; 10];
                // The child first on even ranks, the parent first on odd ones.
                let mut g = oxccl::Group::new();
                if c.rank() % 2 == 0 {
                    g.all_reduce(kid, &b, &mut rb, RedOp::Max).unwrap();
                    g.all_reduce(c, &a, &mut ra, RedOp::Sum).unwrap();
                } else {
                    g.all_reduce(c, &a, &mut ra, RedOp::Sum).unwrap();
                    g.all_reduce(kid, &b, &mut rb, RedOp::Max).unwrap();
                }
                g.run().unwrap();
                assert!(ra.iter().all(|&v| v == n as i32));
                let top = if c.rank() % 2 == 0 { n - 2 } else { n - 1 };
                assert!(rb.iter().all(|&v| v == top as f64));
            });
        }
    });
}
