//! Bad input: wrong buffer lengths, counts whose byte size overflows, roots
//! and peers out of range, non-finite PreMulSum scalars, NULL and overlapping
//! buffers, use after destroy or abort, garbage and foreign unique ids. Each
//! must be a clear error (never a panic, never touching memory), and after an
//! argument error the communicator must stay usable.

mod common;

use common::*;
use oxccl::raw::OpDesc;
use oxccl::{
    Bf16, CollKind, Communicator, Config, DataType, ErrorKind, Group, RedOp, Scalar, UniqueId, F16,
};
use std::ptr::NonNull;
use std::time::Duration;

/// After the bad calls every rank makes, a valid all-reduce still works.
fn still_usable(comms: &[Communicator]) {
    let n = comms.len() as i64;
    on_ranks(comms, |c| {
        let mut x = vec![c.rank() as i64; 1001];
        c.all_reduce_in_place(&mut x, RedOp::Sum).unwrap();
        assert!(x.iter().all(|&v| v == n * (n - 1) / 2));
        let mut y = vec![0f32; 3 * comms.len()];
        c.all_gather(&[1.0f32, 2.0, 3.0], &mut y).unwrap();
        assert!(y.chunks(3).all(|b| b == [1.0, 2.0, 3.0]));
    });
}

#[test]
fn wrong_buffer_lengths() {
    let _w = Watchdog::new("wrong_buffer_lengths", Duration::from_secs(60));
    let comms = init_threads(3, &test_config(|_| {})).unwrap();
    on_ranks(&comms, |c| {
        let ia = ErrorKind::InvalidArgument;
        let s = vec![1.0f32; 12];
        let mut short = vec![0f32; 11];
        let mut long = vec![0f32; 13];
        assert_err(
            &c.all_reduce(&s, &mut short, RedOp::Sum),
            ia,
            &["all_reduce", "11", "12"],
        );
        assert_err(&c.all_reduce(&s, &mut long, RedOp::Sum), ia, &["13", "12"]);
        // all_gather: recv must be n * send.
        assert_err(
            &c.all_gather(&s[..4], &mut short),
            ia,
            &["all_gather", "11", "12"],
        );
        // reduce_scatter: send must be n * recv.
        assert_err(
            &c.reduce_scatter(&s[..11], &mut long[..4], RedOp::Sum),
            ia,
            &["reduce_scatter", "11", "12"],
        );
        assert_err(&c.all_to_all(&s, &mut short), ia, &["all_to_all"]);
        assert_err(
            &c.all_to_all(&s[..10], &mut long[..10]),
            ia,
            &["multiple of 3"],
        );
        assert_err(&c.all_gather_in_place(&mut short), ia, &["multiple of 3"]);
        assert_err(
            &c.reduce_scatter_in_place(&mut long, RedOp::Sum),
            ia,
            &["multiple of 3"],
        );
        // Rooted calls check the root's buffers on every rank's own view:
        // make every rank the root of its own bad call so nobody waits.
        let me = c.rank();
        assert_err(&c.broadcast(&s[..5], &mut short, me), ia, &["broadcast"]);
        assert_err(&c.reduce(&s, &mut short, RedOp::Max, me), ia, &["reduce"]);
        assert_err(&c.gather(&s[..4], &mut short, me), ia, &["gather"]);
        assert_err(&c.scatter(&s[..11], &mut long[..4], me), ia, &["scatter"]);
    });
    still_usable(&comms);
}

/// Counts whose byte size overflows: dangling (non-null, unbacked) pointers
/// through `run_raw`; the library must refuse before touching memory.
#[test]
fn counts_that_overflow_are_refused_before_touching_memory() {
    let _w = Watchdog::new("counts_that_overflow", Duration::from_secs(60));
    let comms = init_threads(2, &test_config(|_| {})).unwrap();
    on_ranks(&comms, |c| {
        let p = NonNull::<u64>::dangling().as_ptr() as *mut u8;
        let multiplies = |k: CollKind| {
            matches!(
                k,
                CollKind::AllGather
                    | CollKind::ReduceScatter
                    | CollKind::AllToAll
                    | CollKind::Gather
                    | CollKind::Scatter
            )
        };
        for kind in CollKind::ALL {
            for (count, dtype) in [
                (usize::MAX, DataType::Uint64),
                (usize::MAX / 8 + 1, DataType::Float64),
                (usize::MAX / 4, DataType::Float32),
                (usize::MAX, DataType::Uint8),
                // Byte size fits usize but exceeds isize::MAX.
                ((isize::MAX as usize) / 2 + 1, DataType::Float16),
                (isize::MAX as usize + 1, DataType::Int8),
                // Fits per rank, not times the 2 ranks (block collectives only:
                // elsewhere this is a possible size, and the pointers dangle).
                (usize::MAX / 3, DataType::Uint8),
            ] {
                if count == usize::MAX / 3 && !multiplies(kind) {
                    continue;
                }
                let op = OpDesc {
                    kind,
                    send: p,
                    recv: p,
                    count,
                    dtype,
                    op: RedOp::Sum,
                    root: 0,
                };
                // SAFETY: the pointers are dangling on purpose: the call must
                // be refused for its count before it touches them.
                let r = unsafe { oxccl::raw::run(c, &[op]) };
                let e = r.expect_err("an impossible count was accepted");
                assert_eq!(
                    e.kind(),
                    ErrorKind::InvalidArgument,
                    "{kind:?} {count}: {e}"
                );
                assert!(
                    e.message().contains("overflow")
                        || e.message().contains("larger than any buffer"),
                    "{kind:?} {count}: {e}"
                );
            }
        }
    });
    still_usable(&comms);
}

#[test]
fn roots_and_peers_out_of_range() {
    let _w = Watchdog::new("roots_and_peers_out_of_range", Duration::from_secs(60));
    let comms = init_threads(2, &test_config(|_| {})).unwrap();
    on_ranks(&comms, |c| {
        let ia = ErrorKind::InvalidArgument;
        let mut b = vec![1u8; 8];
        let s = b.clone();
        assert_err(
            &c.broadcast_in_place(&mut b, 2),
            ia,
            &["root 2", "out of range", "0..=1"],
        );
        assert_err(
            &c.reduce_in_place(&mut b, RedOp::Sum, usize::MAX),
            ia,
            &["root", "out of range"],
        );
        assert_err(&c.gather(&s, &mut [], 5), ia, &["root 5"]);
        assert_err(&c.scatter(&[], &mut b, 2), ia, &["root 2"]);
        assert_err(&c.send(&s, 2), ia, &["peer 2", "out of range"]);
        assert_err(&c.recv(&mut b, 99), ia, &["peer 99"]);
        // An empty collective is checked before it is discarded.
        let mut empty: Vec<u8> = Vec::new();
        assert_err(&c.broadcast_in_place(&mut empty, 2), ia, &["root 2"]);
        assert_err(
            &c.reduce_in_place(&mut empty, RedOp::Sum, usize::MAX),
            ia,
            &["root", "out of range"],
        );
    });
    still_usable(&comms);
}

/// A collective of 0 elements concerns only the rank that calls it (NCCL
/// discards it): here only rank 0 makes empty calls (every collective, alone
/// and in a group); it neither waits for the others nor puts its calls out
/// of step with theirs at the next real call.
#[test]
fn empty_collectives_are_done_at_once() {
    let _w = Watchdog::new(
        "empty_collectives_are_done_at_once",
        Duration::from_secs(60),
    );
    let comms = init_threads(3, &test_config(|_| {})).unwrap();
    on_ranks(&comms, |c| {
        if c.rank() == 0 {
            let mut e: Vec<f32> = Vec::new();
            c.all_reduce_in_place(&mut e, RedOp::Sum).unwrap();
            c.broadcast_in_place(&mut e, 2).unwrap();
            c.reduce_in_place(&mut e, RedOp::Max, 1).unwrap();
            c.all_gather(&[], &mut e).unwrap();
            c.reduce_scatter(&[], &mut e, RedOp::Sum).unwrap();
            c.all_to_all(&[], &mut e).unwrap();
            c.gather(&[], &mut e, 0).unwrap();
            c.scatter(&[], &mut e, 1).unwrap();
            let (mut e1, mut e2): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
            let mut g = Group::new();
            g.all_reduce_in_place(c, &mut e1, RedOp::Sum);
            g.all_reduce(c, &[], &mut e2, RedOp::Max).unwrap();
            g.run().unwrap();
        }
        let mut x = vec![c.rank() as i64 + 1; 7];
        c.all_reduce_in_place(&mut x, RedOp::Sum).unwrap();
        assert_eq!(x, vec![6; 7]);
    });
    still_usable(&comms);
}

#[test]
fn premulsum_with_non_finite_scalars() {
    let _w = Watchdog::new("premulsum_non_finite", Duration::from_secs(60));
    let comms = init_threads(2, &test_config(|_| {})).unwrap();
    on_ranks(&comms, |c| {
        let ia = ErrorKind::InvalidArgument;
        for s in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let op = RedOp::PreMulSum(Scalar::F64(s));
            assert_err(
                &c.all_reduce_in_place(&mut [1.0f32; 4], op),
                ia,
                &["PreMulSum"],
            );
            assert_err(
                &c.all_reduce_in_place(&mut [1.0f64; 4], op),
                ia,
                &["PreMulSum"],
            );
            assert_err(
                &c.reduce_scatter_in_place(&mut [F16(0); 4], op),
                ia,
                &["PreMulSum"],
            );
            assert_err(
                &c.reduce_in_place(&mut [Bf16(0); 4], op, 0),
                ia,
                &["PreMulSum"],
            );
        }
        // Finite in f64 but not in the f32 accumulation type of float16.
        let big = RedOp::PreMulSum(Scalar::F64(1e300));
        assert_err(
            &c.all_reduce_in_place(&mut [F16(0); 4], big),
            ia,
            &["PreMulSum", "f32"],
        );
        // ... while float64 takes it.
        let mut x = [1e-300f64; 4];
        c.all_reduce_in_place(&mut x, big).unwrap();
        assert!(x.iter().all(|&v| (v - 2.0).abs() < 1e-12), "{x:?}");
    });
    still_usable(&comms);
}

#[test]
fn null_and_overlapping_buffers() {
    let _w = Watchdog::new("null_and_overlapping_buffers", Duration::from_secs(60));
    let comms = init_threads(2, &test_config(|_| {})).unwrap();
    on_ranks(&comms, |c| {
        let ia = ErrorKind::InvalidArgument;
        let mut buf = vec![0f32; 64];
        let p = buf.as_mut_ptr();
        let null = std::ptr::null_mut::<f32>();
        let cases: Vec<(OpDesc, &str)> = vec![
            (
                raw(CollKind::AllReduce, null, p, 8, RedOp::Sum, 0),
                "sendbuff is NULL",
            ),
            (
                raw(CollKind::AllReduce, p, null, 8, RedOp::Sum, 0),
                "recvbuff is NULL",
            ),
            (
                raw(CollKind::Send, null, null, 8, RedOp::Sum, 1 - c.rank()),
                "NULL",
            ),
            // Overlapping, but not the in-place layout: send one element into recv.
            (
                raw(CollKind::AllReduce, p, p.wrapping_add(1), 8, RedOp::Sum, 0),
                "overlap",
            ),
            // all_to_all has no in-place form.
            (raw(CollKind::AllToAll, p, p, 8, RedOp::Sum, 0), "overlap"),
            // all_gather in place is send == recv + rank*count, not recv itself (rank 1).
            (
                raw(CollKind::AllGather, p.wrapping_add(3), p, 8, RedOp::Sum, 0),
                "overlap",
            ),
        ];
        for (op, needle) in cases {
            // SAFETY: non-null pointers are inside `buf` and its 64 elements
            // cover every extent used; the call must refuse them anyway.
            let r = unsafe { oxccl::raw::run(c, &[op]) };
            assert_err(&r, ia, &[needle]);
        }
        // A NULL buffer with count 0 is fine (NCCL allows it).
        // SAFETY: nothing is read or written for count 0.
        unsafe {
            oxccl::raw::run(c, &[raw(CollKind::AllReduce, null, null, 0, RedOp::Sum, 0)]).unwrap();
        }
        drop(buf);
    });
    still_usable(&comms);
}

#[test]
fn use_after_destroy_and_abort() {
    let _w = Watchdog::new("use_after_destroy_and_abort", Duration::from_secs(60));
    let comms = init_threads(2, &test_config(|_| {})).unwrap();
    // A clone outlives destroy(): every call on it is InvalidUsage.
    let keep = comms[0].clone();
    let mut it = comms.into_iter();
    let c0 = it.next().unwrap();
    let c1 = it.next().unwrap();
    c0.destroy().unwrap();
    let iu = ErrorKind::InvalidUsage;
    let mut x = [1u8; 4];
    assert_err(
        &keep.all_reduce_in_place(&mut x, RedOp::Sum),
        iu,
        &["destroyed"],
    );
    assert_err(&keep.send(&x, 1), iu, &["destroyed"]);
    assert_err(&keep.split(Some(0), 0), iu, &["destroyed"]);
    assert!(keep.async_error().is_some());
    let _ = keep.clone().destroy(); // a second destroy: no panic, whatever it returns
                                    // Abort after destroy, destroy after abort: harmless.
    keep.abort();
    c1.abort();
    assert_err(&c1.all_reduce_in_place(&mut x, RedOp::Sum), iu, &["abort"]);
    assert_err(&c1.split(None, 0), iu, &[]);
    c1.destroy().ok();
}

#[test]
fn bad_unique_ids_and_init_arguments() {
    let _w = Watchdog::new("bad_unique_ids", Duration::from_secs(60));
    let ia = ErrorKind::InvalidArgument;
    assert_err(&UniqueId::from_bytes(&[0u8; 128]), ia, &["magic"]);
    let mut junk = [0u8; 128];
    for (i, b) in junk.iter_mut().enumerate() {
        *b = mix(i as u64) as u8;
    }
    assert_err(&UniqueId::from_bytes(&junk), ia, &["unique id"]);
    let good = UniqueId::new().unwrap();
    let mut b = *good.as_bytes();
    b[10] = 9;
    assert_err(&UniqueId::from_bytes(&b), ia, &["family"]);
    let mut b = *good.as_bytes();
    b[100] = 1;
    assert_err(&UniqueId::from_bytes(&b), ia, &["reserved"]);
    assert_err(&Communicator::init_rank(0, &good, 0), ia, &["nranks"]);
    assert_err(
        &Communicator::init_rank(2, &good, 2),
        ia,
        &["rank 2", "out of range"],
    );
    assert_err(&Communicator::init_all(0), ia, &[]);

    // The id of another run: same root address and layout, another secret.
    let mut b = *good.as_bytes();
    b[48] ^= 0x01;
    let foreign = UniqueId::from_bytes(&b).expect("a well-formed id");
    let cfg = Config {
        init_timeout: Some(Duration::from_secs(3)),
        ..test_config(|_| {})
    };
    let t = std::time::Instant::now();
    let res: Vec<oxccl::Result<Communicator>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (id, cfg) = (&foreign, cfg.clone());
                s.spawn(move || Communicator::init_rank_config(2, id, r, cfg))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        t.elapsed() < Duration::from_secs(6),
        "took {:?}",
        t.elapsed()
    );
    for r in &res {
        assert_err(r, ErrorKind::InvalidUsage, &["another run"]);
    }
    // The genuine id still works after the impostors were turned away.
    let ok: Vec<oxccl::Result<Communicator>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (id, cfg) = (&good, cfg.clone());
                s.spawn(move || Communicator::init_rank_config(2, id, r, cfg))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let comms: Vec<Communicator> = ok.into_iter().map(|r| r.unwrap()).collect();
    still_usable(&comms);
}

/// Two operations of one group writing the same bytes: refused before anything
/// is sent (checked on the raw addresses), and the communicator stays usable.
#[test]
fn overlapping_receive_buffers_in_one_group() {
    let _w = Watchdog::new(
        "overlapping_receive_buffers_in_one_group",
        Duration::from_secs(60),
    );
    let comms = Communicator::init_all(2).unwrap();
    let mut buf = vec![0f32; 16];
    let p = buf.as_mut_ptr() as *mut u8;
    let recv = |dst: *mut u8| OpDesc {
        kind: CollKind::Recv,
        send: std::ptr::null(),
        recv: dst,
        count: 8,
        dtype: DataType::Float32,
        op: RedOp::Sum,
        root: 1,
    };
    // The second receive starts 16 bytes into the first one's 32.
    let ops = [(&comms[0], recv(p)), (&comms[0], recv(p.wrapping_add(16)))];
    // SAFETY: both pointers lie inside `buf`, alive for the call; the call must
    // fail before touching them.
    let r = unsafe { oxccl::raw::run_group(&ops) };
    assert_err(&r, ErrorKind::InvalidArgument, &["overlaps another buffer"]);
    // Still usable: a disjoint pair of receives matched by sends on rank 1.
    on_ranks(&comms, |c| {
        let mut a = vec![0f32; 8];
        let mut b = vec![0f32; 8];
        let src = vec![c.rank() as f32 + 1.0; 8];
        let mut g = oxccl::Group::new();
        if c.rank() == 0 {
            g.recv(c, &mut a, 1).recv(c, &mut b, 1);
        } else {
            g.send(c, &src, 0).send(c, &src, 0);
        }
        g.run().unwrap();
        if c.rank() == 0 {
            assert_eq!(a, vec![2.0; 8]);
            assert_eq!(b, vec![2.0; 8]);
        }
    });
    drop(buf);
}
