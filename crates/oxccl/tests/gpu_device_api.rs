//! Every collective of the device API (`StreamComm`, `GpuGroup`) with two
//! ranks as threads of this process, each on a stream of its own (rank r
//! on GPU `r % device count`, so both may share one GPU), against float64
//! references, at count 0, 1, an odd count and one past the small-message
//! paths.
//!
//! The threads meet at a barrier after uploading and again after launching:
//! in one process sharing a GPU, a rank's pageable copy or wait on the GPU
//! holds the driver while the other rank's kernel, already running, waits
//! for a launch that thread cannot make until the timeout
//! (docs/rust-api.md, "Ranks of one process on one GPU").

use oxccl::gpu::{CudaContext, CudaStream, CudaView, CudaViewMut, GpuChoice, GpuGroup};
use oxccl::{Communicator, Config, RedOp, Result, StreamComm};
use std::sync::{Arc, Barrier};

const NRANKS: usize = 2;
const COUNTS: [usize; 4] = [0, 1, 1001, (1 << 20) + 3];

/// Rank `r`'s element `i`: small integers, whose sums f32 holds exactly.
fn v(r: usize, i: usize) -> f32 {
    ((r + 1) * (i % 7 + 1)) as f32
}

fn sum(i: usize) -> f64 {
    (0..NRANKS).map(|r| v(r, i) as f64).sum()
}

/// The ranks, each with its stream; panics without a GPU (the tests are
/// ignored there).
fn ranks() -> Vec<(Communicator, Arc<CudaStream>)> {
    assert!(oxccl::gpu::available(), "no CUDA driver with a GPU");
    let ndev = CudaContext::device_count().unwrap() as usize;
    let comms = Communicator::init_all_config(NRANKS, |r| Config {
        gpu: GpuChoice::Device((r % ndev) as i32),
        ..Config::default()
    })
    .unwrap();
    comms
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            assert_eq!(c.device(), Some((r % ndev) as i32), "rank {r}'s GPU setup");
            let s = CudaContext::new(r % ndev).unwrap().new_stream().unwrap();
            (c, s)
        })
        .collect()
}

type Run = dyn Fn(&StreamComm, &CudaView<f32>, &mut CudaViewMut<f32>, usize) -> Result<()> + Sync;

/// Runs `run` on every rank at each count: rank r sends `send_len(count)`
/// elements `v(r, i)` and receives `recv_len(count)`; element i of rank
/// r's result must be `want(r, i, count)` (`None`: not written there).
fn check(
    what: &str,
    send_len: impl Fn(usize) -> usize + Sync,
    recv_len: impl Fn(usize) -> usize + Sync,
    run: &Run,
    want: impl Fn(usize, usize, usize) -> Option<f64> + Sync,
) {
    let ranks = ranks();
    let meet = Barrier::new(ranks.len());
    for count in COUNTS {
        std::thread::scope(|s| {
            for (r, (comm, stream)) in ranks.iter().enumerate() {
                let (send_len, recv_len, want, meet) = (&send_len, &recv_len, &want, &meet);
                s.spawn(move || {
                    let (ns, nr) = (send_len(count), recv_len(count));
                    let host: Vec<f32> = (0..ns.max(1)).map(|i| v(r, i)).collect();
                    let send = stream.clone_htod(&host).unwrap();
                    let mut recv = stream.alloc_zeros::<f32>(nr.max(1)).unwrap();
                    stream.synchronize().unwrap();
                    meet.wait();
                    let launched = {
                        let sv = send.slice(0..ns);
                        let mut rv = recv.slice_mut(0..nr);
                        run(&comm.on_stream(stream), &sv, &mut rv, count)
                    };
                    // Every rank's call is queued before any thread copies
                    // back (a failed one too, so its peer is not left waiting here).
                    meet.wait();
                    launched.unwrap_or_else(|e| panic!("{what}, count {count}, rank {r}: {e}"));
                    let got: Vec<f32> = stream.clone_dtoh(&recv).unwrap();
                    assert!(comm.gpu_error().is_none(), "{what}: {:?}", comm.gpu_error());
                    for (i, &g) in got.iter().take(nr).enumerate() {
                        if let Some(w) = want(r, i, count) {
                            assert_eq!(g as f64, w, "{what}, count {count}: rank {r} element {i}");
                        }
                    }
                });
            }
        });
    }
    for (c, _) in ranks {
        c.destroy().unwrap();
    }
}

#[test]
#[ignore = "needs a GPU: device-buffer collectives"]
fn all_reduce_reduce_and_broadcast() {
    let same = |c: usize| c;
    check(
        "all_reduce",
        same,
        same,
        &|on, s, r, _| on.all_reduce(s, r, RedOp::Sum),
        |_, i, _| Some(sum(i)),
    );
    check(
        "reduce to rank 1",
        same,
        same,
        &|on, s, r, _| on.reduce(s, r, RedOp::Max, 1),
        |rank, i, _| (rank == 1).then(|| v(NRANKS - 1, i) as f64),
    );
    check(
        "broadcast from rank 1",
        same,
        same,
        &|on, s, r, _| on.broadcast(s, r, 1),
        |_, i, _| Some(v(1, i) as f64),
    );
}

#[test]
#[ignore = "needs a GPU: device-buffer collectives"]
fn all_gather_reduce_scatter_and_all_to_all() {
    let n = NRANKS;
    check(
        "all_gather",
        |c| c,
        move |c| c * n,
        &|on, s, r, _| on.all_gather(s, r),
        |_, i, c| Some(v(i / c.max(1), i % c.max(1)) as f64),
    );
    check(
        "reduce_scatter",
        move |c| c * n,
        |c| c,
        &|on, s, r, _| on.reduce_scatter(s, r, RedOp::Sum),
        |rank, i, c| Some(sum(rank * c + i)),
    );
    check(
        "all_to_all",
        move |c| c * n,
        move |c| c * n,
        &|on, s, r, _| on.all_to_all(s, r),
        // Block q of rank r's result is block r of rank q's send.
        |rank, i, c| Some(v(i / c.max(1), rank * c + i % c.max(1)) as f64),
    );
}

#[test]
#[ignore = "needs a GPU: device-buffer collectives"]
fn gather_scatter_and_a_ring_of_sends() {
    let n = NRANKS;
    check(
        "gather to rank 0",
        |c| c,
        move |c| c * n,
        &|on, s, r, _| on.gather(s, r, 0),
        |rank, i, c| (rank == 0).then(|| v(i / c.max(1), i % c.max(1)) as f64),
    );
    check(
        "scatter from rank 1",
        move |c| c * n,
        |c| c,
        &|on, s, r, _| on.scatter(s, r, 1),
        |rank, i, c| Some(v(1, rank * c + i) as f64),
    );
    // Each rank sends to the next and receives from the previous, the
    // receive added first: one group, one launch, no deadlock.
    check(
        "send/recv ring in a group",
        |c| c,
        |c| c,
        &|on, s, r, _| {
            let (me, n) = (on.comm().rank(), on.comm().size());
            let mut g = GpuGroup::new();
            g.recv(on, r, (me + n - 1) % n)?;
            g.send(on, s, (me + 1) % n)?;
            g.run()
        },
        move |rank, i, _| Some(v((rank + n - 1) % n, i) as f64),
    );
}

#[test]
#[ignore = "needs a GPU: device-buffer argument checks"]
fn short_buffers_and_bad_roots_are_refused_before_any_launch() {
    let ranks = ranks();
    let (comm, stream) = &ranks[0];
    let on = comm.on_stream(stream);
    let send = stream.alloc_zeros::<f32>(8).unwrap();
    let mut recv = stream.alloc_zeros::<f32>(8).unwrap();
    // all_gather needs 2 x 8 elements of recv.
    let e = on.all_gather(&send, &mut recv).unwrap_err();
    assert_eq!(e.kind(), oxccl::ErrorKind::InvalidArgument);
    assert!(
        e.message()
            .contains("recv has 8 elements; this call needs 16"),
        "{e}"
    );
    let e = on.broadcast(&send, &mut recv, NRANKS).unwrap_err();
    assert_eq!(e.kind(), oxccl::ErrorKind::InvalidArgument);
    assert!(e.message().contains("invalid root 2"), "{e}");
}

/// One rank's call: its rank, its communicator on its stream, the stream.
type RankCall = dyn Fn(usize, &StreamComm, &Arc<CudaStream>) -> Result<()> + Sync;

/// Both ranks' result of one call made on each rank's own thread.
fn on_each_rank(ranks: &[(Communicator, Arc<CudaStream>)], call: &RankCall) -> Vec<Result<()>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(r, (comm, stream))| s.spawn(move || call(r, &comm.on_stream(stream), stream)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn assert_mismatch(res: &[Result<()>], what: &str, want: &[&str]) {
    for (r, x) in res.iter().enumerate() {
        let e = x
            .as_ref()
            .expect_err(&format!("{what}: rank {r} was not refused"));
        assert_eq!(
            e.kind(),
            oxccl::ErrorKind::InvalidUsage,
            "{what}, rank {r}: {e}"
        );
        for w in want {
            assert!(e.message().contains(w), "{what}, rank {r}: no {w:?} in {e}");
        }
    }
}

/// Ranks that name different roots (each itself) for a broadcast, reduce,
/// gather or scatter on device buffers are all refused at the call, before
/// anything is queued (the receive buffers keep their zeros), as on host
/// buffers; so are different counts. A thread driving both ranks in one
/// group is refused too; the communicators then still run a broadcast that
/// agrees.
#[test]
#[ignore = "needs a GPU: root agreement on device buffers"]
fn ranks_that_name_different_roots_are_all_refused_at_the_call() {
    let ranks = ranks();
    let calls: [(&str, &RankCall); 5] = [
        ("broadcast", &|r, on, st| {
            let send = st.clone_htod(&[7.0f32; 64]).unwrap();
            let mut recv = st.alloc_zeros::<f32>(64).unwrap();
            let res = on.broadcast(&send, &mut recv, r);
            assert_eq!(st.clone_dtoh(&recv).unwrap(), vec![0.0; 64]);
            res
        }),
        ("reduce", &|r, on, st| {
            let send = st.clone_htod(&[1.0f32; 5]).unwrap();
            let mut recv = st.alloc_zeros::<f32>(5).unwrap();
            let res = on.reduce(&send, &mut recv, RedOp::Sum, r);
            assert_eq!(st.clone_dtoh(&recv).unwrap(), vec![0.0; 5]);
            res
        }),
        ("gather", &|r, on, st| {
            let send = st.clone_htod(&[1.0f32; 3]).unwrap();
            let mut recv = st.alloc_zeros::<f32>(3 * NRANKS).unwrap();
            on.gather(&send, &mut recv, r)
        }),
        ("scatter", &|r, on, st| {
            let send = st.clone_htod(&[1.0f32; 3 * NRANKS]).unwrap();
            let mut recv = st.alloc_zeros::<f32>(3).unwrap();
            on.scatter(&send, &mut recv, r)
        }),
        ("broadcast counts", &|r, on, st| {
            let mut buf = st.alloc_zeros::<f32>(10 + r).unwrap();
            on.broadcast_in_place(&mut buf, 0)
        }),
    ];
    for (what, call) in calls {
        let t = std::time::Instant::now();
        let res = on_each_rank(&ranks, call);
        let want: &[&str] = if what == "broadcast counts" {
            &["mismatched rooted collectives", "count=10,", "count=11,"]
        } else {
            &["mismatched rooted collectives", "root=0)", "root=1)"]
        };
        assert_mismatch(&res, what, want);
        // Refused at the call, not at the 600 s operation timeout (a first
        // call of each collective also loads its kernels: 6-20 s where
        // NVRTC compiles them).
        let bound = std::time::Duration::from_secs(60);
        assert!(t.elapsed() < bound, "{what} took {:?}", t.elapsed());
    }
    // One thread, both ranks in one group (as ranks sharing a GPU are
    // driven: docs/rust-api.md): refused, nothing queued; then a broadcast
    // that agrees runs.
    let ons: Vec<_> = ranks.iter().map(|(c, s)| c.on_stream(s)).collect();
    let host: Vec<Vec<f32>> = (0..NRANKS)
        .map(|r| (0..64).map(|i| v(r, i)).collect())
        .collect();
    let mut bufs: Vec<_> = ranks
        .iter()
        .zip(&host)
        .map(|((_, s), h)| s.clone_htod(h).unwrap())
        .collect();
    let mut g = GpuGroup::new();
    for (r, b) in bufs.iter_mut().enumerate() {
        g.broadcast_in_place(&ons[r], b, r).unwrap();
    }
    let e = g.run().unwrap_err();
    assert_eq!(e.kind(), oxccl::ErrorKind::InvalidUsage, "{e}");
    assert!(e.message().contains("mismatched rooted collectives"), "{e}");
    let mut g = GpuGroup::new();
    for (r, b) in bufs.iter_mut().enumerate() {
        g.broadcast_in_place(&ons[r], b, 1).unwrap();
    }
    g.run().unwrap();
    for ((_, s), b) in ranks.iter().zip(&bufs) {
        assert_eq!(s.clone_dtoh(b).unwrap(), host[1]);
    }
    for (c, _) in ranks {
        assert!(c.gpu_error().is_none(), "{:?}", c.gpu_error());
        c.destroy().unwrap();
    }
}
