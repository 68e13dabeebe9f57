//! Properties of the GPU path's pure decisions (`oxccl_core::gpu`), over
//! any size, rank count, channel count and setting a communicator can have:
//! every kernel the plan picks exists in the ring program and runs the
//! collective asked for, its blocks fit the window's channels, peers on
//! other hosts never get LL (the network proxies move whole slots), the
//! protocol never goes back to LL as the size grows, and the one-launch
//! grouping keeps every rank's calls in their order.

use std::time::Duration;

use oxccl_core::algo::{Algo, Proto};
use oxccl_core::gpu::one_launch;
use oxccl_core::gpu::ring::{
    coll_channels, ll_channels, p2p_blocks, p2p_channels, p2p_ll_channels, plan, small_kernel_fits,
    RingConfig, Thresholds, MAX_CHANNELS, P2P_MAX_BLOCKS, P2P_MAX_ITEMS,
};
use oxccl_core::gpu::{Collective, RingKernel};
use oxccl_core::{DataType, RedOp};
use proptest::prelude::*;

fn collective() -> impl Strategy<Value = Collective> {
    prop::sample::select(Collective::ALL.to_vec())
}

/// A configuration as the parameters can make it: channels 1..=32 or the
/// default, every bound 0, small, default or unbounded.
fn config(nranks: usize) -> impl Strategy<Value = RingConfig> {
    let bound = prop_oneof![Just(0u64), 1u64..(4 << 20), Just(u64::MAX)];
    (
        prop::option::of(1u32..=40),
        prop::option::of(bound.clone()),
        prop::option::of(bound.clone()),
        prop::option::of(bound.clone()),
        prop::option::of(bound),
    )
        .prop_map(move |(max_ch, ll, one, two, direct)| {
            let mut c =
                RingConfig::new(false, 4 << 20, None, max_ch, nranks, Duration::from_secs(1));
            if let Some(v) = ll {
                c.ll_max = v;
            }
            if let Some(v) = one {
                c.oneshot_max = v;
                c.oneshot_net_max = v;
            }
            if let Some(v) = two {
                c.twoshot_max = v;
            }
            if let Some(v) = direct {
                c.direct_max = v;
            }
            c
        })
}

fn setup() -> impl Strategy<Value = (usize, bool, RingConfig)> {
    (1usize..=12, any::<bool>()).prop_flat_map(|(n, cross)| (Just(n), Just(cross), config(n)))
}

proptest! {
    #[test]
    fn every_plan_is_a_kernel_of_the_program_for_the_collective(
        (n, cross, cfg) in setup(),
        c in collective(),
        bytes in prop_oneof![0u64..(1 << 16), 0u64..(64 << 20), Just(u64::MAX)],
    ) {
        let t = Thresholds::of(&cfg, n, cross);
        let (k, blocks) = plan(c, bytes, &t);
        prop_assert_eq!(k.collective(), c);
        prop_assert_eq!(RingKernel::from_mode(k.mode()), Some(k));
        prop_assert!(blocks >= 1 && blocks <= cfg.channels.max(1), "{} blocks", blocks);
        prop_assert!(blocks <= MAX_CHANNELS);
        // Across hosts: never LL, and only the all-reduce's one-shot over
        // Simple slots besides the ring.
        if cross {
            prop_assert_eq!(k.protocol(), Proto::Simple);
            prop_assert!(k.algorithm() == Algo::Ring || c == Collective::AllReduce);
        }
        // Past 8 ranks the one-shot and two-shot kernels (at most 8) are out.
        if n > 8 {
            prop_assert_eq!(k.algorithm(), Algo::Ring);
        }
        // NCCL_PROTO without LL: nothing takes LL.
        if cfg.ll_max == 0 {
            prop_assert_eq!(k.protocol(), Proto::Simple);
        }
        // The small kernel only runs LL kernels.
        for elem in [1u64, 2, 4, 8] {
            if small_kernel_fits(k, bytes / elem, elem, n as u32, blocks) {
                prop_assert_eq!(k.protocol(), Proto::LL);
            }
        }
    }

    #[test]
    fn larger_messages_never_go_back_to_ll(
        (n, cross, cfg) in setup(),
        c in collective(),
        a in 0u64..(16 << 20),
        b in 0u64..(16 << 20),
    ) {
        // LL's bounds are upper bounds on the size: once a size takes Simple,
        // every larger one does too.
        let t = Thresholds::of(&cfg, n, cross);
        let (lo, hi) = (a.min(b), a.max(b));
        if plan(c, lo, &t).0.protocol() == Proto::Simple {
            prop_assert_eq!(plan(c, hi, &t).0.protocol(), Proto::Simple);
        }
    }

    #[test]
    fn channel_counts_stay_in_range_and_grow_with_the_size(
        channels in 0u32..=40,
        chunk in 0u64..(1 << 20),
        a in any::<u64>(),
        b in any::<u64>(),
    ) {
        let (lo, hi) = (a.min(b), a.max(b));
        let most = channels.max(1);
        for f in [
            |x: u64, ch: u32, chunk: u64| coll_channels(x, ch, chunk),
            |x: u64, ch: u32, _| ll_channels(x, ch),
            |x: u64, ch: u32, _| p2p_ll_channels(x, ch),
            |x: u64, ch: u32, chunk: u64| p2p_channels(x, ch, chunk),
        ] {
            let (l, h) = (f(lo, channels, chunk), f(hi, channels, chunk));
            prop_assert!(l >= 1 && h <= most, "{} then {} of {}", l, h, most);
            prop_assert!(l <= h, "{} then {}", l, h);
        }
    }

    #[test]
    fn p2p_blocks_hold_every_item(items in 0u32..5000, resident in 0u32..300) {
        let b = p2p_blocks(items, resident);
        prop_assert!((1..=P2P_MAX_BLOCKS).contains(&b));
        // Unless the items need more than the largest launch holds.
        if items <= P2P_MAX_BLOCKS * P2P_MAX_ITEMS {
            prop_assert!(items.div_ceil(b) <= P2P_MAX_ITEMS);
        }
    }

    #[test]
    fn one_launch_groups_keep_each_ranks_calls_in_order(
        nranks in 1usize..=10,
        calls in 1usize..5,
        shuffle in any::<u64>(),
        spoil in prop::option::of(any::<usize>()),
    ) {
        // Every rank makes `calls` calls (call k: an all-reduce of k + 1
        // elements), queued in an order mixed by `shuffle`; `spoil` drops
        // one call's part.
        let call = |k: usize| one_launch::RankCall {
            collective: Collective::AllReduce,
            count: k as u64 + 1,
            root: 0,
            dtype: DataType::Float32,
            op: RedOp::Sum,
            input: 0,
            output: 0,
            scale: 1.0,
            iscale: 0,
            scalar_ptr: 0,
        };
        let mut order: Vec<(usize, usize)> =
            (0..calls).flat_map(|k| (0..nranks).map(move |r| (r, k))).collect();
        // Interleave ranks but keep each rank's calls in order: a stable
        // sort by a per-rank key.
        order.sort_by_key(|&(r, k)| (k, (r as u64).wrapping_mul(shuffle | 1) % 7));
        let mut parts: Vec<_> = order.iter().map(|&(r, k)| (5usize, r, Some(call(k)))).collect();
        if let Some(i) = spoil {
            let i = i % parts.len();
            parts[i].2 = None;
        }
        match one_launch::group_up(&parts, nranks) {
            Some(groups) => {
                prop_assert!(spoil.is_none() && (2..=one_launch::MAX_RANKS).contains(&nranks));
                prop_assert_eq!(groups.len(), calls);
                for (k, g) in groups.iter().enumerate() {
                    // Rank order, one launch per rank, the k-th call of each.
                    prop_assert_eq!(g.len(), nranks);
                    for (r, &i) in g.iter().enumerate() {
                        prop_assert_eq!(parts[i].1, r);
                        prop_assert_eq!(parts[i].2.map(|p| p.count), Some(k as u64 + 1));
                    }
                }
            }
            None => prop_assert!(spoil.is_some() || !(2..=one_launch::MAX_RANKS).contains(&nranks)),
        }
    }
}
