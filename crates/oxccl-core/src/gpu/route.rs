//! Which path a device operation with peers takes: the two-GPU pair
//! kernels of one process, or the ring path (its kernels over peer or host
//! windows). Every rank of a communicator decides alike from the same
//! facts, so the ranks' kernels meet.

use super::kernel::Collective;
use super::ring::{plan, Thresholds};
use crate::algo::{Algo, Proto};

/// Where a communicator's ranks are, as far as the path depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Ranks of the communicator.
    pub nranks: usize,
    /// Every operation with peers is forced onto the ring
    /// (`NCCL_P2P_DISABLE=1`, `NCCL_ALGO` without OneShot/TwoShot,
    /// `OXCCL_CUDA_RING=1`).
    pub ring_only: bool,
    /// Both ranks of a 2-rank communicator are in this process on two GPUs.
    pub pair: bool,
}

impl Placement {
    /// Whether operations with peers take the ring path whatever the call:
    /// more than two ranks, the peer in another process or on this rank's
    /// own GPU (the pair kernels and copy engines need two GPUs; the ring's
    /// windows work within one), or the ring forced.
    pub fn ring_always(&self) -> bool {
        self.nranks > 2 || self.ring_only || !self.pair
    }

    /// Whether an operation on a stream takes the ring path: [`Self::ring_always`],
    /// or the stream is being captured into a CUDA graph (`capturing`, asked
    /// only when the answer depends on it: it is a driver call). The pair
    /// kernels take barrier values from a host counter, which a replay
    /// would repeat; the ring's counters live on the GPU. Every rank must
    /// capture the same operations, as every rank must make the same calls.
    pub fn ring_for(&self, capturing: impl FnOnce() -> bool) -> bool {
        self.ring_always() || capturing()
    }
}

/// Whether an all-reduce of `bytes` that could take the two-GPU pair
/// kernel takes the ring's one-shot LL kernel instead: one NVLink crossing
/// (every rank writes its lines into the other's slots) against the pair
/// kernel's three (entry barrier, the peer read, exit barrier). One thread
/// driving both GPUs (nccl-tests -g 2, eager), 8 B-128 KB: 7.6-9.6 us
/// against 8.6-11.7 (2xH200, 2026-11-30, one job; NCCL 14-19); on a slower
/// host both were bound by the two launches at 10.5-12.3 (NCCL 19-22),
/// neither ahead. Both ranks decide from the same byte count and the same
/// ring settings (`ring`); without a ring (not set up) the pair kernel
/// stays.
pub fn one_shot_on_ring(bytes: u64, ring: Option<&Thresholds>) -> bool {
    ring.is_some_and(|t| {
        let (kernel, _) = plan(Collective::AllReduce, bytes, t);
        (kernel.algorithm(), kernel.protocol()) == (Algo::OneShot, Proto::LL)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ring::RingConfig;
    use std::time::Duration;

    #[test]
    fn the_ring_unless_two_gpus_of_one_process_take_the_pair() {
        let pair = Placement {
            nranks: 2,
            ring_only: false,
            pair: true,
        };
        assert!(!pair.ring_always());
        assert!(Placement { nranks: 3, ..pair }.ring_always());
        assert!(Placement {
            ring_only: true,
            ..pair
        }
        .ring_always());
        assert!(Placement {
            pair: false,
            ..pair
        }
        .ring_always());
        // Capture puts the pair on the ring; asked only when it matters.
        assert!(pair.ring_for(|| true));
        assert!(!pair.ring_for(|| false));
        let asked = std::cell::Cell::new(0);
        assert!(Placement { nranks: 4, ..pair }.ring_for(|| {
            asked.set(asked.get() + 1);
            false
        }));
        assert_eq!(asked.get(), 0);
    }

    #[test]
    fn small_all_reduces_of_a_pair_take_the_ring_one_shot() {
        let cfg = RingConfig::new(false, 4 << 20, None, None, 2, Duration::from_secs(1));
        let t = Thresholds::of(&cfg, 2, false);
        assert!(one_shot_on_ring(8, Some(&t)));
        assert!(one_shot_on_ring(256 << 10, Some(&t)));
        assert!(!one_shot_on_ring((256 << 10) + 1, Some(&t)));
        assert!(!one_shot_on_ring(8, None));
        // Without OneShot (NCCL_ALGO) or across hosts: never.
        let mut no = cfg.clone();
        no.oneshot_max = 0;
        assert!(!one_shot_on_ring(8, Some(&Thresholds::of(&no, 2, false))));
        assert!(!one_shot_on_ring(8, Some(&Thresholds::of(&cfg, 2, true))));
    }
}
