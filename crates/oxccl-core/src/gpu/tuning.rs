//! A tuner plugin's say on the GPU ring program (`NCCL_TUNER_PLUGIN`): the
//! cost table a ring collective offers the plugin's `getCollInfo`, and the
//! kernel and blocks that follow from its answer. The same exchange as the
//! host path's ([`crate::tuner_plugin`]), over the choices the ring program
//! has that NCCL can name: the Simple ring for every collective, the LL
//! ring for all-reduces while LL is allowed (`NCCL_PROTO`, within a host).
//!
//! oxccl's own plan may be a kernel NCCL has no id for (one-shot and
//! two-shot): a plugin that returns the table unchanged and no channel
//! count keeps it; one that changes any entry gets the lowest runnable one.
//! A channel count becomes the launch's blocks, clamped to the window's
//! channels. (The one-launch kernel of ranks in one process,
//! `OXCCL_CUDA_JOINT_MAX`, is chosen per group before this and is not in
//! the table.)

use super::kernel::{Collective, RingKernel};
use super::ring::{coll_channels, ll_channels, Thresholds};
use crate::algo::{Algo, Proto};
use crate::tuner_plugin::{
    algo_from_id, algo_id, changed, lowest_runnable, proto_from_id, proto_id,
};
use crate::tuner_plugin::{CostTable, Verdict};
use crate::tuner_plugin::{IGNORE, NUM_ALGORITHMS, NUM_PROTOCOLS};

/// The model's time (µs) for `collective` of `bytes` over the ring in
/// `proto`: [`crate::tuner::gpu_estimate_us`] for Simple; LL carries 8 data
/// bytes per 16-byte line (twice the bytes) but waits on flags instead of a
/// system fence per step (half the step latency). A ranking for the
/// plugin's table, not a measured figure.
pub fn ring_estimate_us(collective: Collective, proto: Proto, bytes: u64, nranks: u32) -> f64 {
    let kind = collective.kind();
    let n = nranks as usize;
    let simple = crate::tuner::gpu_estimate_us(kind, bytes as usize, n);
    match proto {
        Proto::Simple => simple,
        _ => {
            let base = crate::tuner::gpu_estimate_us(kind, 0, n);
            let steps = simple - crate::tuner::gpu_estimate_us(kind, 0, 1).min(base);
            let latency = base - steps.min(base) / 2.0;
            latency.max(0.0) + 2.0 * (simple - base)
        }
    }
}

/// The ring kernels of `collective` a plugin may pick, given the
/// communicator's thresholds (LL only while `ll_max` allows it).
fn runnable(collective: Collective, t: &Thresholds) -> Vec<(Proto, RingKernel)> {
    let mut v = vec![(Proto::Simple, RingKernel::ring(collective))];
    if t.ll_max > 0 {
        if let Some(k) = RingKernel::new(collective, Algo::Ring, Proto::LL) {
            v.push((Proto::LL, k));
        }
    }
    v
}

/// The table a plugin sees for `collective` of `bytes`: the model's time
/// for each ring kernel the program can run, [`IGNORE`] elsewhere.
pub fn cost_table(collective: Collective, bytes: u64, t: &Thresholds) -> CostTable {
    let mut table = [[IGNORE; NUM_PROTOCOLS]; NUM_ALGORITHMS];
    let ring = algo_id(Algo::Ring).unwrap_or(1);
    for (proto, _) in runnable(collective, t) {
        table[ring][proto_id(proto)] = ring_estimate_us(collective, proto, bytes, t.nranks) as f32;
    }
    table
}

/// The kernel and blocks after a plugin returned `returned` (from `given`,
/// made by [`cost_table`]) and `nchannels` (0 or less: unset); `own` is
/// [`super::ring::plan`]'s choice. Entries `given` ignored stay impossible.
pub fn apply(
    collective: Collective,
    bytes: u64,
    t: &Thresholds,
    own: (RingKernel, u32),
    given: &CostTable,
    returned: &CostTable,
    nchannels: i32,
) -> ((RingKernel, u32), Verdict) {
    let channels = u32::try_from(nchannels)
        .ok()
        .filter(|&n| n > 0)
        .map(|n| n.min(t.channels.max(1)));
    if !changed(given, returned) {
        return match channels {
            None => (own, Verdict::Unchanged),
            Some(n) => ((own.0, n), Verdict::ChannelsOnly),
        };
    }
    let picked = lowest_runnable(given, returned).and_then(|(a, p)| {
        let (algo, proto) = (algo_from_id(a)?, proto_from_id(p)?);
        let k = RingKernel::new(collective, algo, proto)?;
        runnable(collective, t)
            .iter()
            .any(|(_, r)| *r == k)
            .then_some(k)
    });
    let Some(k) = picked else {
        return (own, Verdict::NothingRunnable);
    };
    let blocks = channels.unwrap_or_else(|| match k.protocol() {
        Proto::Simple => coll_channels(bytes, t.channels, t.coll_chunk),
        _ => ll_channels(bytes, t.channels),
    });
    ((k, blocks), Verdict::Applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ring::RingConfig;

    fn thresholds(nranks: usize, cross: bool) -> Thresholds {
        let cfg = RingConfig::from_params(&crate::params::Params::default(), nranks, None);
        Thresholds::of(&cfg, nranks, cross)
    }

    fn forced(a: usize, p: usize) -> impl Fn(&CostTable) -> CostTable {
        move |given| {
            let mut t = *given;
            t[a][p] = 0.0;
            t
        }
    }

    #[test]
    fn the_table_offers_the_rings_the_program_has() {
        let t = thresholds(4, false);
        let ar = cost_table(Collective::AllReduce, 1 << 20, &t);
        assert!(ar[1][2] > 0.0 && ar[1][0] > 0.0, "{ar:?}");
        assert_eq!(ar[1][1], IGNORE, "no LL128 kernel");
        for (i, row) in ar.iter().enumerate().filter(|(i, _)| *i != 1) {
            assert_eq!(*row, [IGNORE; 3], "algorithm {i}");
        }
        // Only all-reduce has an LL ring; across hosts there is no LL.
        let ag = cost_table(Collective::AllGather, 1 << 20, &t);
        assert_eq!(ag[1], [IGNORE, IGNORE, ag[1][2]]);
        assert!(ag[1][2] > 0.0);
        let net = cost_table(Collective::AllReduce, 1 << 20, &thresholds(4, true));
        assert_eq!(net[1][0], IGNORE);
        // LL wins small messages in the model, Simple large ones.
        let small = cost_table(Collective::AllReduce, 1 << 10, &t);
        let large = cost_table(Collective::AllReduce, 1 << 30, &t);
        assert!(small[1][0] < small[1][2], "{small:?}");
        assert!(large[1][0] > large[1][2], "{large:?}");
    }

    #[test]
    fn an_unchanged_answer_keeps_oxccls_plan_and_channels_alone_are_taken() {
        let t = thresholds(4, false);
        for c in Collective::ALL {
            for bytes in [0, 8, 4096, 1 << 20, 1 << 28] {
                let own = super::super::ring::plan(c, bytes, &t);
                let given = cost_table(c, bytes, &t);
                assert_eq!(
                    apply(c, bytes, &t, own, &given, &given, 0),
                    (own, Verdict::Unchanged)
                );
                assert_eq!(
                    apply(c, bytes, &t, own, &given, &given, 3),
                    ((own.0, 3), Verdict::ChannelsOnly)
                );
                // More channels than the window has: clamped.
                let ((_, b), _) = apply(c, bytes, &t, own, &given, &given, 1000);
                assert_eq!(b, t.channels);
            }
        }
    }

    /// The ring kernel of the lowest runnable entry of `table`.
    fn cheapest(c: Collective, table: &CostTable) -> RingKernel {
        let (p, _) = table[1]
            .iter()
            .enumerate()
            .filter(|(_, &x)| x >= 0.0)
            .min_by(|a, b| a.1.total_cmp(b.1))
            .unwrap();
        RingKernel::new(c, Algo::Ring, proto_from_id(p).unwrap()).unwrap()
    }

    #[test]
    fn each_forced_ring_is_taken_where_it_exists() {
        for cross in [false, true] {
            let t = thresholds(4, cross);
            for c in Collective::ALL {
                for bytes in [8u64, 4096, 1 << 20, (1 << 26) + 5] {
                    let own = super::super::ring::plan(c, bytes, &t);
                    let given = cost_table(c, bytes, &t);
                    for (p, proto) in [(0, Proto::LL), (1, Proto::LL128), (2, Proto::Simple)] {
                        let ((k, blocks), v) =
                            apply(c, bytes, &t, own, &given, &forced(1, p)(&given), 2);
                        let exists = given[1][p] >= 0.0;
                        if exists {
                            assert_eq!(v, Verdict::Applied, "{c} {bytes} {proto:?}");
                            assert_eq!(k, RingKernel::new(c, Algo::Ring, proto).unwrap());
                            assert_eq!(blocks, 2);
                        } else {
                            // A changed table whose forced entry cannot run:
                            // its lowest runnable entry, as NCCL takes it.
                            assert_eq!((k, v), (cheapest(c, &given), Verdict::Applied));
                        }
                    }
                    // Tree, NVLS, PAT: nothing the ring program runs, so
                    // the lowest ring entry.
                    for a in [0, 4, 6] {
                        let ((k, _), v) =
                            apply(c, bytes, &t, own, &given, &forced(a, 2)(&given), 0);
                        assert_eq!(
                            (k, v),
                            (cheapest(c, &given), Verdict::Applied),
                            "{c} algo {a}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_forced_ring_without_channels_takes_the_programs_blocks() {
        let t = thresholds(8, false);
        let c = Collective::AllReduce;
        let bytes = 64 << 20;
        let own = super::super::ring::plan(c, bytes, &t);
        let given = cost_table(c, bytes, &t);
        let ((k, b), _) = apply(c, bytes, &t, own, &given, &forced(1, 0)(&given), 0);
        assert_eq!(k.protocol(), Proto::LL);
        assert_eq!(b, ll_channels(bytes, t.channels));
        let ((k, b), _) = apply(c, bytes, &t, own, &given, &forced(1, 2)(&given), -1);
        assert_eq!(k, RingKernel::ring(c));
        assert_eq!(b, coll_channels(bytes, t.channels, t.coll_chunk));
        // NaN and negative answers are not choices.
        let mut nan = given;
        nan[1][2] = f32::NAN;
        nan[1][0] = -5.0;
        assert_eq!(
            apply(c, bytes, &t, own, &given, &nan, 0),
            (own, Verdict::NothingRunnable)
        );
    }
}
