//! A tuner plugin (`NCCL_TUNER_PLUGIN`) decides the GPU ring program's
//! kernel and blocks where NCCL can name the choice: the C test tuner of
//! oxccl-net forces the Simple ring, then the LL ring, with two channels;
//! two ranks as threads sharing GPU 0 (on two GPUs of one process a pair of
//! ranks takes the pair kernels, which the plugin has no say on) run
//! all-reduces and all-gathers of device buffers through
//! `oxccl::Communicator`, every result exact, and every call must have run
//! the forced kernel (`oxccl::gpu::tools::tuned_calls`). Sizes are past the
//! one-launch kernel's bound (256 KiB), which is chosen per group before
//! the plugin is asked.

mod common;

use common::*;
use oxccl::gpu::{CudaContext, CudaStream, GpuChoice};
use oxccl::{Algo, Communicator, Proto, RedOp};
use oxccl_core::gpu::{Collective, RingKernel};
use oxccl_net::testing::{build_c_plugin, tuner_source};
use std::sync::{Arc, Barrier};

const NRANKS: usize = 2;
/// Elements per rank: 1.2 MB of f32 and an odd count.
const COUNTS: [usize; 2] = [300_001, 262_147];

fn ranks(tuner: String) -> Vec<(Communicator, Arc<CudaStream>)> {
    assert!(oxccl::gpu::available(), "no CUDA driver with a GPU");
    let comms = Communicator::init_all_config(NRANKS, |_| {
        let mut cfg = test_config(|h| h.tuner_plugin = Some(tuner.clone()));
        cfg.gpu = GpuChoice::Device(0);
        cfg
    })
    .unwrap();
    comms
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            assert_eq!(c.device(), Some(0), "rank {r}'s GPU setup");
            let s = CudaContext::new(0).unwrap().new_stream().unwrap();
            (c, s)
        })
        .collect()
}

/// Rank `r`'s element `i`: small integers, whose sums f32 holds exactly.
fn v(r: usize, i: usize) -> f32 {
    ((r + 1) * (i % 13 + 1)) as f32
}

/// Runs an all-reduce (sum) and an all-gather of `count` elements per rank
/// on every rank and checks every element.
fn run_and_check(ranks: &[(Communicator, Arc<CudaStream>)], count: usize) {
    let meet = Barrier::new(ranks.len());
    std::thread::scope(|s| {
        for (r, (comm, stream)) in ranks.iter().enumerate() {
            let meet = &meet;
            s.spawn(move || {
                let host: Vec<f32> = (0..count).map(|i| v(r, i)).collect();
                let send = stream.clone_htod(&host).unwrap();
                let mut sum = stream.alloc_zeros::<f32>(count).unwrap();
                let mut all = stream.alloc_zeros::<f32>(count * NRANKS).unwrap();
                stream.synchronize().unwrap();
                // Every rank's calls are queued before any thread copies
                // back (ranks of one process sharing a GPU: rust-api.md).
                meet.wait();
                let sc = comm.on_stream(stream);
                sc.all_reduce(&send, &mut sum, RedOp::Sum).unwrap();
                sc.all_gather(&send, &mut all).unwrap();
                meet.wait();
                let got = stream.clone_dtoh(&sum).unwrap();
                for (i, x) in got.iter().enumerate() {
                    let want: f32 = (0..NRANKS).map(|q| v(q, i)).sum();
                    assert_eq!(*x, want, "rank {r}: all-reduce element {i} of {count}");
                }
                let got = stream.clone_dtoh(&all).unwrap();
                for (i, x) in got.iter().enumerate() {
                    assert_eq!(
                        *x,
                        v(i / count, i % count),
                        "rank {r}: all-gather element {i}"
                    );
                }
            });
        }
    });
}

#[test]
#[ignore = "needs a GPU: a tuner plugin forces the GPU ring kernels"]
fn a_tuner_plugin_forces_the_gpu_ring_kernels() {
    let _w = Watchdog::new("GPU tuner forcing", std::time::Duration::from_secs(300));
    // NCCL_ALGO_RING = 1; NCCL_PROTO_LL = 0, NCCL_PROTO_SIMPLE = 2.
    for (p, proto) in [(2, Proto::Simple), (0, Proto::LL)] {
        let so = build_c_plugin(
            &tuner_source(),
            &[
                "TUNER_VERSION=6",
                "FORCE_ALGO=1",
                &format!("FORCE_PROTO={p}"),
                "FORCE_NCH=2",
            ],
            &format!("oxccl-gpu-tuner-{p}"),
            "libnccl-tuner-oxtest.so",
        );
        let ranks = ranks(so.to_str().unwrap().to_string());
        let ar = RingKernel::new(Collective::AllReduce, Algo::Ring, proto).unwrap();
        let ag = RingKernel::ring(Collective::AllGather);
        for count in COUNTS {
            let before = (
                oxccl::gpu::tools::tuned_calls(ar),
                oxccl::gpu::tools::tuned_calls(ag),
            );
            run_and_check(&ranks, count);
            let after = (
                oxccl::gpu::tools::tuned_calls(ar),
                oxccl::gpu::tools::tuned_calls(ag),
            );
            assert_eq!(
                after.0 - before.0,
                NRANKS as u64,
                "{proto:?}: every rank's all-reduce of {count} ran {ar}"
            );
            if proto == Proto::Simple {
                assert_eq!(after.1 - before.1, NRANKS as u64, "all-gathers ran {ag}");
            } else {
                // All-gather has no LL ring: the plugin's table for it
                // offered only the Simple ring, which it left as given.
                assert_eq!(after.1, before.1, "an all-gather's plan stays oxccl's");
            }
        }
    }
}
