//! Small collectives between processes of one host take the one-shot
//! shared-memory slots (all-reduce, reduce, reduce-scatter, all-gather and
//! broadcast, each rank's input 1 byte to the largest that fits the slots): results
//! against the float64 or exact reference over ranks x collectives x counts
//! x datatypes x ops x roots (count 0, odd counts and both sides of the
//! slot bound included),
//! calls back to back (the slots are reused by parity), several in one
//! group beside operations on the rings, and calls that differ between
//! ranks, which must fail within seconds instead of hanging.
//!
//! Children are started as in `processes.rs` (`OXCCL_TEST_CHILD`).

mod common;

use common::*;
use oxccl::raw::OpDesc;
use oxccl::{CollKind, Communicator, DataType, ErrorKind, Group, RedOp, Scalar, UniqueId};
use oxccl_host::oneshot::{SlotCall, ONESHOT_MAX_BYTES};
use std::time::{Duration, Instant};

/// The reductions with every datatype and every op (PreMulSum with an
/// integral and a fractional scalar), the copies with every datatype;
/// odd counts, and counts around each collective's slot bound with every
/// datatype and with every op; roots varied.
fn small_cases(nranks: usize) -> Vec<Case> {
    let ops = [
        RedOp::Sum,
        RedOp::Prod,
        RedOp::Max,
        RedOp::Min,
        RedOp::Avg,
        RedOp::PreMulSum(Scalar::I64(3)),
        RedOp::PreMulSum(Scalar::F64(0.5)),
    ];
    let mut v = Vec::new();
    let mut seed = 0x5107_0000u64 + nranks as u64;
    let colls = [
        Coll::AllReduce,
        Coll::Reduce,
        Coll::ReduceScatter,
        Coll::AllGather,
        Coll::Broadcast,
    ];
    for coll in colls {
        for dtype in DataType::ALL {
            // The largest count that takes the slots.
            let kind = match coll {
                Coll::AllReduce => CollKind::AllReduce,
                Coll::Reduce => CollKind::Reduce,
                Coll::ReduceScatter => CollKind::ReduceScatter,
                Coll::AllGather => CollKind::AllGather,
                _ => CollKind::Broadcast,
            };
            let bound = SlotCall {
                kind,
                count: 0,
                dtype,
                op: RedOp::Sum,
                root: 0,
            }
            .largest_fitting_count(nranks, ONESHOT_MAX_BYTES);
            let ops: &[RedOp] = if coll.reduces() { &ops } else { &[RedOp::Sum] };
            for (oi, &op) in ops.iter().enumerate() {
                if matches!(op, RedOp::PreMulSum(Scalar::F64(_))) && !dtype.is_float() {
                    continue;
                }
                // Both sides of the bound with every datatype (Sum) and
                // every op (float32): each of these moves up to 64 KiB a
                // rank, and every datatype x op there made the 4-rank sweep
                // outlast its children's limit on a loaded 2-CPU machine.
                let at_bound = oi == 0 || dtype == DataType::Float32;
                let counts: &[usize] = if at_bound {
                    &[0, 1, 3, 13, 127, bound - 1, bound, bound + 1]
                } else {
                    &[0, 1, 3, 13, 127]
                };
                for &count in counts {
                    for in_place in [false, true] {
                        seed = mix(seed);
                        v.push(Case {
                            coll,
                            dtype,
                            op,
                            count,
                            root: oi + count,
                            in_place,
                            seed,
                        });
                    }
                }
            }
        }
    }
    v
}

/// Runs `test` as `n` processes, each a rank that runs `body` on its
/// communicator between init and destroy; every rank must succeed.
fn on_processes(test: &str, n: usize, body: impl FnOnce(&Communicator)) {
    if let Some(ctx) = child_ctx() {
        let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, test_config(|_| {}))
            .unwrap();
        body(&c);
        c.destroy().unwrap();
        return;
    }
    let _w = Watchdog::new(test, Duration::from_secs(200));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(test, n, &id, &[]);
    p.expect_success(Duration::from_secs(180));
}

fn sweep(test: &str, n: usize) {
    on_processes(test, n, |c| {
        for case in small_cases(c.size()) {
            if let Err(f) = run_case(c, &case) {
                panic!("rank {}: {case}: {f}", c.rank());
            }
        }
    });
}

#[test]
fn shm_small_all_reduce_sweep_2() {
    sweep("shm_small_all_reduce_sweep_2", 2);
}

#[test]
fn shm_small_all_reduce_sweep_3() {
    sweep("shm_small_all_reduce_sweep_3", 3);
}

#[test]
fn shm_small_all_reduce_sweep_4() {
    sweep("shm_small_all_reduce_sweep_4", 4);
}

/// Back to back: 1,001 calls (odd, so both slots end in use), each a
/// different value, every result exact.
#[test]
fn shm_small_all_reduces_back_to_back() {
    const TEST: &str = "shm_small_all_reduces_back_to_back";
    if let Some(ctx) = child_ctx() {
        let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, test_config(|_| {}))
            .unwrap();
        let n = ctx.nranks as i64;
        for i in 0..1001i64 {
            let mine = [i * 10 + ctx.rank as i64, -i];
            let mut out = [0i64; 2];
            c.all_reduce(&mine, &mut out, RedOp::Sum).unwrap();
            assert_eq!(out, [n * i * 10 + n * (n - 1) / 2, -n * i], "call {i}");
        }
        c.destroy().unwrap();
        return;
    }
    let _w = Watchdog::new(TEST, Duration::from_secs(120));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(TEST, 3, &id, &[]);
    p.expect_success(Duration::from_secs(100));
}

/// Several small all-reduces in one group, around a large one and a
/// send/receive pair on the rings: each keeps its place, results exact.
#[test]
fn shm_small_all_reduces_in_one_group() {
    const TEST: &str = "shm_small_all_reduces_in_one_group";
    if let Some(ctx) = child_ctx() {
        let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, test_config(|_| {}))
            .unwrap();
        let (me, n) = (ctx.rank, ctx.nranks);
        for round in 0..5i32 {
            let a = [me as i32 + round; 3];
            let mut ra = [0i32; 3];
            let big: Vec<f32> = (0..100_001).map(|i| (i % 7) as f32 + me as f32).collect();
            let mut rbig = vec![0f32; big.len()];
            let b = [me as f64; 511];
            let mut rb = [0f64; 511];
            let s = vec![me as u8; 777];
            let mut r = vec![0u8; 777];
            let mut g = Group::new();
            g.all_reduce(&c, &a, &mut ra, RedOp::Max).unwrap();
            g.all_reduce(&c, &big, &mut rbig, RedOp::Sum).unwrap();
            g.send(&c, &s, (me + 1) % n);
            g.all_reduce(&c, &b, &mut rb, RedOp::Sum).unwrap();
            g.recv(&c, &mut r, (me + n - 1) % n);
            g.run().unwrap();
            assert_eq!(ra, [n as i32 - 1 + round; 3]);
            let ranks = (n * (n - 1) / 2) as f32;
            for (i, v) in rbig.iter().enumerate() {
                assert_eq!(*v, (i % 7) as f32 * n as f32 + ranks, "element {i}");
            }
            assert!(rb.iter().all(|&v| v == (n * (n - 1) / 2) as f64));
            assert!(r.iter().all(|&v| v as usize == (me + n - 1) % n));
        }
        c.destroy().unwrap();
        return;
    }
    let _w = Watchdog::new(TEST, Duration::from_secs(120));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(TEST, 3, &id, &[]);
    p.expect_success(Duration::from_secs(100));
}

/// Rank 1 calls something else than rank 0's small all-reduce: every rank
/// must fail (an InvalidUsage or, told by a peer, a Remote error) within
/// seconds, long before the 60 s timeout.
fn mismatch(test: &str, other: fn(&Communicator) -> oxccl::Result<()>, says: &str) {
    if let Some(ctx) = child_ctx() {
        let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, test_config(|_| {}))
            .unwrap();
        c.all_reduce_in_place(&mut [1u8; 8], RedOp::Sum).unwrap();
        let t = Instant::now();
        let r = if ctx.rank == 1 {
            other(&c)
        } else {
            c.all_reduce_in_place(&mut [1f32; 2], RedOp::Sum)
        };
        let e = r.expect_err("mismatched calls succeeded");
        assert!(
            matches!(e.kind(), ErrorKind::InvalidUsage | ErrorKind::Remote),
            "rank {}: {e}",
            ctx.rank
        );
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "rank {}: took {:?}: {e}",
            ctx.rank,
            t.elapsed()
        );
        eprintln!("rank {}: {e}", ctx.rank);
        return;
    }
    let _w = Watchdog::new(test, Duration::from_secs(120));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(test, 2, &id, &[]);
    p.expect_success(Duration::from_secs(100));
    assert!(
        p.all_logs().contains(says),
        "no rank said {says:?}:\n{}",
        p.all_logs()
    );
}

#[test]
fn shm_small_all_reduces_of_different_counts_fail() {
    mismatch(
        "shm_small_all_reduces_of_different_counts_fail",
        |c| c.all_reduce_in_place(&mut [1f32; 3], RedOp::Sum),
        "mismatched collectives: rank",
    );
}

#[test]
fn shm_small_all_reduce_against_a_ring_collective_fails() {
    mismatch(
        "shm_small_all_reduce_against_a_ring_collective_fails",
        |c| {
            let send = vec![1f32; 50_000];
            let mut recv = vec![0f32; 100_000];
            c.all_gather(&send, &mut recv)
        },
        "started another collective while this rank waits in a small one",
    );
}

/// Every collective the slots take, in one group (one `run_raw` call),
/// in place and out of place, beside a large all-reduce on the rings:
/// the executor's task path of the slots; results exact.
#[test]
fn shm_small_collectives_of_every_kind_in_one_group() {
    const TEST: &str = "shm_small_collectives_of_every_kind_in_one_group";
    if let Some(ctx) = child_ctx() {
        let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, test_config(|_| {}))
            .unwrap();
        let (me, n) = (ctx.rank, ctx.nranks);
        let d = |kind, send: *const i32, recv: *mut i32, count, op, root| OpDesc {
            kind,
            send: send.cast(),
            recv: recv.cast(),
            count,
            dtype: DataType::Int32,
            op,
            root,
        };
        for round in 0..4usize {
            let blk = 5 + round;
            let v = |r: usize, i: usize| (r * 100 + i + round) as i32;
            // all_gather in place: this rank's block at its place.
            let mut ag = vec![-1i32; n * blk];
            for i in 0..blk {
                ag[me * blk + i] = v(me, i);
            }
            // reduce_scatter in place: n blocks, the result in this rank's.
            let mut rs: Vec<i32> = (0..n * blk).map(|i| v(me, i)).collect();
            // broadcast out of place from rank 1, reduce out of place to rank 2 % n.
            let bsend: Vec<i32> = (0..blk).map(|i| v(me, i)).collect();
            let mut brecv = vec![0i32; blk];
            let rsend: Vec<i32> = (0..blk).map(|i| v(me, i)).collect();
            let mut rrecv = vec![0i32; blk];
            let big: Vec<i32> = (0..50_000).map(|i| i + me as i32).collect();
            let mut rbig = vec![0i32; big.len()];
            let agp = ag.as_mut_ptr();
            let rsp = rs.as_mut_ptr();
            // SAFETY: within `ag` (n blocks): this rank's block.
            let ag_mine = unsafe { agp.add(me * blk) };
            // SAFETY: within `rs` (n blocks): this rank's block.
            let rs_mine = unsafe { rsp.add(me * blk) };
            let ops = [
                d(CollKind::AllGather, ag_mine, agp, blk, RedOp::Sum, 0),
                d(
                    CollKind::AllReduce,
                    big.as_ptr(),
                    rbig.as_mut_ptr(),
                    big.len(),
                    RedOp::Sum,
                    0,
                ),
                d(CollKind::ReduceScatter, rsp, rs_mine, blk, RedOp::Max, 0),
                d(
                    CollKind::Broadcast,
                    bsend.as_ptr(),
                    brecv.as_mut_ptr(),
                    blk,
                    RedOp::Sum,
                    1,
                ),
                d(
                    CollKind::Reduce,
                    rsend.as_ptr(),
                    rrecv.as_mut_ptr(),
                    blk,
                    RedOp::Sum,
                    2 % n,
                ),
            ];
            // SAFETY: every buffer is valid for its operation and unused
            // elsewhere until the call returns.
            unsafe { oxccl::raw::run(&c, &ops) }.unwrap();
            for r in 0..n {
                for i in 0..blk {
                    assert_eq!(ag[r * blk + i], v(r, i), "all_gather {r}/{i}");
                }
            }
            for i in 0..blk {
                let want = (0..n).map(|r| v(r, me * blk + i)).max().unwrap();
                assert_eq!(rs[me * blk + i], want, "reduce_scatter {i}");
                assert_eq!(brecv[i], v(1, i), "broadcast {i}");
                if me == 2 % n {
                    let want: i32 = (0..n).map(|r| v(r, i)).sum();
                    assert_eq!(rrecv[i], want, "reduce {i}");
                }
            }
            let ranks = (n * (n - 1) / 2) as i32;
            for (i, x) in rbig.iter().enumerate() {
                assert_eq!(*x, i as i32 * n as i32 + ranks, "big {i}");
            }
        }
        c.destroy().unwrap();
        return;
    }
    let _w = Watchdog::new(TEST, Duration::from_secs(120));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(TEST, 3, &id, &[]);
    p.expect_success(Duration::from_secs(100));
}

/// Rank 1 comes 3 s late to a small all-reduce. With `abort`, rank 0's
/// communicator is aborted from another thread after 300 ms; without, its
/// timeout is 1 s. Either way rank 0's wait must end within about a
/// second of that, with InvalidUsage (aborted) or Timeout, and rank 1,
/// arriving later, must not hang: its next call fails.
fn late_peer(test: &str, abort: bool) {
    if let Some(ctx) = child_ctx() {
        let limit = if abort {
            Duration::from_secs(60)
        } else {
            Duration::from_secs(1)
        };
        let cfg = oxccl::Config {
            timeout: Some(limit),
            ..test_config(|h| h.timeout = limit)
        };
        let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, cfg).unwrap();
        c.all_reduce_in_place(&mut [1u8; 8], RedOp::Sum).unwrap();
        if ctx.rank == 1 {
            std::thread::sleep(Duration::from_secs(3));
            // Rank 0 posted its input before giving up, so this call may
            // complete (with the right sum) or fail; the next one, which
            // rank 0 never joins, must fail within seconds.
            let mut x = [1f32; 2];
            if c.all_reduce_in_place(&mut x, RedOp::Sum).is_ok() {
                assert_eq!(x, [2.0; 2]);
            }
            let t = Instant::now();
            let r = c.all_reduce_in_place(&mut [1f32; 2], RedOp::Sum);
            assert!(
                r.is_err(),
                "rank 1: its peer gave up, yet the call succeeded"
            );
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "rank 1: {:?}",
                t.elapsed()
            );
            return;
        }
        let t = Instant::now();
        let aborter = abort.then(|| {
            let c2 = c.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                c2.abort();
            })
        });
        let e = c
            .all_reduce_in_place(&mut [1f32; 2], RedOp::Sum)
            .expect_err("rank 0: the call succeeded without its peer");
        let took = t.elapsed();
        let (kind, at) = if abort {
            (ErrorKind::InvalidUsage, Duration::from_millis(300))
        } else {
            (ErrorKind::Timeout, Duration::from_secs(1))
        };
        assert_eq!(e.kind(), kind, "rank 0: {e}");
        assert!(
            took >= at && took < at + Duration::from_millis(1500),
            "rank 0: took {took:?}: {e}"
        );
        if let Some(h) = aborter {
            h.join().unwrap();
        }
        return;
    }
    let _w = Watchdog::new(test, Duration::from_secs(60));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(test, 2, &id, &[]);
    p.expect_success(Duration::from_secs(50));
}

#[test]
fn shm_small_all_reduce_observes_abort() {
    late_peer("shm_small_all_reduce_observes_abort", true);
}

#[test]
fn shm_small_all_reduce_observes_its_timeout() {
    late_peer("shm_small_all_reduce_observes_its_timeout", false);
}

/// One rank's part of a run of rooted calls back to back: broadcasts (in
/// place and out of place) and reduces whose root moves, all-gathers and
/// all-reduces between them, and every ninth step a group of three
/// broadcasts from different roots and a reduce. Every value names its call,
/// rank and element, and every result is checked exactly. A broadcast root
/// and a reduce's other ranks return once their input is posted and may be
/// a call ahead of their peers, so a slot rewritten while a peer still reads
/// it shows here as another call's value (or as a wait on a sequence number
/// that was overwritten, which fails at the timeout). Now and then one rank
/// sleeps, so that the others run ahead and wait before reusing a slot.
fn rooted_mix(c: &Communicator, calls: u64) -> Result<(), String> {
    let (me, n) = (c.rank(), c.size());
    let e = |what: &str, err: oxccl::Error| format!("rank {me}: {what}: {err}");
    for i in 0..calls {
        let count = 1 + ((i * 37) % 500) as usize;
        let root = ((i * 5 + i / 3) % n as u64) as usize;
        let v = |r: usize, j: usize| i as i64 * 1_000_003 + r as i64 * 10_007 + j as i64;
        let mine: Vec<i64> = (0..count).map(|j| v(me, j)).collect();
        let ctx = |what: &str| format!("rank {me}, call {i} ({what}, count {count}, root {root})");
        match i % 9 {
            0..=3 => {
                let mut out = vec![-1i64; count];
                if i % 2 == 0 {
                    c.broadcast(&mine, &mut out, root)
                        .map_err(|x| e(&ctx("broadcast"), x))?;
                } else {
                    if me == root {
                        out.copy_from_slice(&mine);
                    }
                    c.broadcast_in_place(&mut out, root)
                        .map_err(|x| e(&ctx("broadcast in place"), x))?;
                }
                for (j, x) in out.iter().enumerate() {
                    if *x != v(root, j) {
                        return Err(format!(
                            "{}: element {j} is {x}, not {}",
                            ctx("broadcast"),
                            v(root, j)
                        ));
                    }
                }
            }
            4 | 5 => {
                let mut out = vec![-1i64; count];
                c.reduce(&mine, &mut out, RedOp::Sum, root)
                    .map_err(|x| e(&ctx("reduce"), x))?;
                for (j, x) in out.iter().enumerate() {
                    let want = if me == root {
                        (0..n).map(|r| v(r, j)).sum()
                    } else {
                        -1
                    };
                    if *x != want {
                        return Err(format!("{}: element {j} is {x}, not {want}", ctx("reduce")));
                    }
                }
            }
            6 => {
                let blk = count.min(4096 / 8 / n);
                let mut out = vec![-1i64; n * blk];
                c.all_gather(&mine[..blk], &mut out)
                    .map_err(|x| e(&ctx("all_gather"), x))?;
                for (k, x) in out.iter().enumerate() {
                    if *x != v(k / blk, k % blk) {
                        return Err(format!("{}: element {k} is {x}", ctx("all_gather")));
                    }
                }
            }
            7 => {
                let mut out = vec![-1i64; count];
                c.all_reduce(&mine, &mut out, RedOp::Sum)
                    .map_err(|x| e(&ctx("all_reduce"), x))?;
                for (j, x) in out.iter().enumerate() {
                    let want: i64 = (0..n).map(|r| v(r, j)).sum();
                    if *x != want {
                        return Err(format!(
                            "{}: element {j} is {x}, not {want}",
                            ctx("all_reduce")
                        ));
                    }
                }
            }
            _ => {
                let roots = [root, (root + 1) % n, (root + 2) % n];
                let mut outs = [vec![-1i64; count], vec![-2i64; count], vec![-3i64; count]];
                let mut red = vec![-1i64; count];
                let red_root = (root + n - 1) % n;
                let d = |kind, recv: *mut i64, root| OpDesc {
                    kind,
                    send: mine.as_ptr().cast(),
                    recv: recv.cast(),
                    count,
                    dtype: DataType::Int64,
                    op: RedOp::Sum,
                    root,
                };
                let [o0, o1, o2] = &mut outs;
                let ops = [
                    d(CollKind::Broadcast, o0.as_mut_ptr(), roots[0]),
                    d(CollKind::Broadcast, o1.as_mut_ptr(), roots[1]),
                    d(CollKind::Reduce, red.as_mut_ptr(), red_root),
                    d(CollKind::Broadcast, o2.as_mut_ptr(), roots[2]),
                ];
                // SAFETY: every buffer is valid for its operation (count
                // elements) and unused elsewhere until the call returns.
                unsafe { oxccl::raw::run(c, &ops) }.map_err(|x| e(&ctx("group"), x))?;
                for (out, &r) in outs.iter().zip(&roots) {
                    for (j, x) in out.iter().enumerate() {
                        if *x != v(r, j) {
                            return Err(format!(
                                "{}: root {r}, element {j} is {x}",
                                ctx("grouped broadcast")
                            ));
                        }
                    }
                }
                if me == red_root {
                    for (j, x) in red.iter().enumerate() {
                        let want: i64 = (0..n).map(|r| v(r, j)).sum();
                        if *x != want {
                            return Err(format!(
                                "{}: element {j} is {x}, not {want}",
                                ctx("grouped reduce")
                            ));
                        }
                    }
                }
            }
        }
        if i % 61 == (me as u64 * 17) % 61 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok(())
}

fn rooted_back_to_back(test: &str, n: usize) {
    on_processes(test, n, |c| rooted_mix(c, 3000).unwrap());
}

#[test]
fn shm_small_rooted_calls_back_to_back_2() {
    rooted_back_to_back("shm_small_rooted_calls_back_to_back_2", 2);
}

#[test]
fn shm_small_rooted_calls_back_to_back_3() {
    rooted_back_to_back("shm_small_rooted_calls_back_to_back_3", 3);
}

#[test]
fn shm_small_rooted_calls_back_to_back_4() {
    rooted_back_to_back("shm_small_rooted_calls_back_to_back_4", 4);
}

/// The same with ranks as threads of one process forced onto shared
/// memory (NCCL_P2P_DISABLE), which take the slots too.
#[test]
fn shm_small_rooted_calls_back_to_back_threads() {
    let _w = Watchdog::new(
        "shm_small_rooted_calls_back_to_back_threads",
        Duration::from_secs(200),
    );
    for n in 2..=4 {
        let comms = init_threads(n, &test_config(|h| h.p2p_disable = true)).unwrap();
        std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| s.spawn(move || rooted_mix(c, 2000)))
                .collect();
            for h in hs {
                h.join().unwrap().unwrap();
            }
        });
        for c in comms {
            c.destroy().unwrap();
        }
    }
}

/// Broadcasts whose roots differ between ranks: each rank is the root in
/// its own view, so neither reads the other's post and both may return;
/// the next call must then fail on every rank with the mismatch (the record
/// of the call before is compared before a slot is reused), not wait for
/// the timeout.
#[test]
fn shm_small_broadcasts_with_different_roots_fail_at_the_next_call() {
    const TEST: &str = "shm_small_broadcasts_with_different_roots_fail_at_the_next_call";
    if let Some(ctx) = child_ctx() {
        let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, test_config(|_| {}))
            .unwrap();
        c.all_reduce_in_place(&mut [1u8; 8], RedOp::Sum).unwrap();
        let mut b = [ctx.rank as u32; 4];
        let r = c
            .broadcast_in_place(&mut b, ctx.rank)
            .and_then(|()| c.all_reduce_in_place(&mut [1f32; 2], RedOp::Sum));
        let e = r.expect_err("mismatched broadcasts and the call after succeeded");
        assert!(
            matches!(e.kind(), ErrorKind::InvalidUsage | ErrorKind::Remote),
            "rank {}: {e}",
            ctx.rank
        );
        eprintln!("rank {}: {e}", ctx.rank);
        return;
    }
    let _w = Watchdog::new(TEST, Duration::from_secs(120));
    let id = UniqueId::new().unwrap();
    let mut p = Procs::spawn(TEST, 2, &id, &[]);
    p.expect_success(Duration::from_secs(100));
    assert!(
        p.all_logs().contains("mismatched collectives: rank"),
        "no rank named the mismatch:\n{}",
        p.all_logs()
    );
}
