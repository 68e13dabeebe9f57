//! The tuner: picks an algorithm, a protocol and a channel count per call from
//! a cost model (latency + bytes / bandwidth), within what `NCCL_ALGO` and
//! `NCCL_PROTO` allow.
//!
//! The model is the usual pipeline formula. A schedule with `h` sequential hops
//! that moves its data in `k` slices of `s` bytes takes
//! `(k + h - 1) * (alpha + s * f / beta)`, where `alpha` is the fixed cost of one
//! slice crossing one hop (a flag or header observed by the peer), `beta` the
//! per-hop bandwidth and `f` the bytes a node must push per slice byte (2 for a
//! tree node feeding two children). For host transports the protocols differ
//! only in slice size: LL pipelines in 16 KiB slices (small fill time, more
//! per-slice overhead), LL128 in 128 KiB, Simple in half a stream buffer
//! (fewest slices; the deadlock bound of ADR 0001 caps it at capacity/2).

use crate::algo::{Algo, Proto, Selection};
use crate::error::{Error, Result};
use crate::schedule::Shaped;
use crate::types::CollKind;

/// What a hop between two ranks costs on a transport.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkModel {
    /// Fixed cost of one slice crossing one hop, microseconds.
    pub alpha_us: f64,
    /// Bytes per microsecond one hop moves (1 GB/s = 1000 B/µs).
    pub beta_bpus: f64,
    /// Channels worth using for large messages (more TCP sockets help; one
    /// host thread driving shared-memory rings gains nothing from more).
    pub useful_channels: usize,
}

impl LinkModel {
    /// Shared memory between processes: ~1 µs to see a peer's counter move
    /// (cache-line transfer plus polling), ~6 GB/s per copy stream on the 2-core
    /// development machine (a copy reads and writes every byte once).
    pub const SHM: LinkModel = LinkModel {
        alpha_us: 1.0,
        beta_bpus: 6000.0,
        useful_channels: 1,
    };
    /// Threads of one process: the same rings in the heap.
    pub const INPROC: LinkModel = LinkModel::SHM;
    /// TCP over loopback or a LAN: ~20 µs per message through the kernel,
    /// ~2.5 GB/s per socket; a few sockets per peer help.
    pub const TCP: LinkModel = LinkModel {
        alpha_us: 20.0,
        beta_bpus: 2500.0,
        useful_channels: 4,
    };
}

/// Everything the tuner decides from.
#[derive(Debug, Clone)]
pub struct TuneInput<'a> {
    pub kind: CollKind,
    /// The operation's size as nccl-tests counts it (all_reduce: the buffer; all_gather: the gathered total).
    pub bytes: usize,
    pub nranks: usize,
    /// The slowest link the schedule would cross.
    pub link: LinkModel,
    pub algos: &'a Selection<Algo>,
    pub protos: &'a Selection<Proto>,
    /// Stream capacity per channel in bytes (NCCL_BUFFSIZE).
    pub capacity: usize,
    /// NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS when set.
    pub min_channels: Option<usize>,
    pub max_channels: Option<usize>,
}

/// The tuner's decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    pub algo: Algo,
    pub proto: Proto,
    pub shaped: Shaped,
    pub nchannels: usize,
    /// Pipeline slice in bytes.
    pub slice: usize,
    /// The model's estimate, microseconds.
    pub est_us: f64,
}

/// Algorithms a host executor can run for a collective, with their schedule.
pub(crate) fn candidates(kind: CollKind) -> &'static [(Algo, Shaped)] {
    match kind {
        CollKind::AllReduce => &[
            (Algo::Ring, Shaped::Ring),
            (Algo::Tree, Shaped::Tree),
            (Algo::OneShot, Shaped::OneShot),
        ],
        // Rings and chains; point-to-point patterns have no algorithm choice and
        // report Ring.
        _ => &[(Algo::Ring, Shaped::Ring)],
    }
}

/// Slice size of a protocol for a stream of `capacity` bytes.
pub fn slice_for(proto: Proto, capacity: usize) -> usize {
    let cap_half = (capacity / 2).max(64) & !7;
    match proto {
        Proto::LL => (16 << 10).min(cap_half),
        Proto::LL128 => (128 << 10).min(cap_half),
        Proto::Simple => cap_half.min(4 << 20),
    }
}

fn log2_ceil(n: usize) -> f64 {
    (usize::BITS - (n.max(1) - 1).leading_zeros()) as f64
}

/// The model's time for one (algorithm, slice, channels) choice:
/// `alpha * (slice steps on the busiest rank + pipeline depth)
///  + bytes the busiest rank moves / (beta * useful channels)
///  + pipeline fill (depth - 1 slices at beta)`.
pub fn estimate(
    kind: CollKind,
    shaped: Shaped,
    bytes: usize,
    n: usize,
    link: &LinkModel,
    slice: usize,
    nch: usize,
) -> f64 {
    let n_f = n as f64;
    let b = bytes as f64;
    // A local copy (one rank) reads and writes every byte once: ~4x a hop's speed.
    if n <= 1 {
        return b / (link.beta_bpus * 4.0);
    }
    let nch = nch.max(1);
    let beta = link.beta_bpus * nch.min(link.useful_channels.max(1)) as f64;
    let s = slice.max(8) as f64;
    // Slices a rank handles for `part` bytes split over the channels.
    let slices = |part: f64| nch as f64 * (part / nch as f64 / s).ceil().max(1.0);
    let fill = |depth: f64| (depth - 1.0).max(0.0) * s.min(b) / beta;
    match (kind, shaped) {
        (CollKind::AllReduce, Shaped::Ring) => {
            let h = 2.0 * (n_f - 1.0);
            link.alpha_us * (h * slices(b / n_f) + h) + h / n_f * b / beta + fill(h)
        }
        (CollKind::AllReduce, Shaped::Tree) => {
            // An interior node receives 2 children's data and the result, sends
            // its partial up and the result to 2 children: ~3x the data per link.
            let depth = 2.0 * (log2_ceil(n + 1) - 1.0).max(1.0);
            link.alpha_us * (3.0 * slices(b) + depth) + 3.0 * b / beta + fill(depth)
        }
        (CollKind::AllReduce, Shaped::OneShot) => {
            link.alpha_us * n_f + (n_f - 1.0) * b / beta + n_f * b / (4.0 * link.beta_bpus)
        }
        (CollKind::AllGather | CollKind::ReduceScatter, _) => {
            let h = n_f - 1.0;
            link.alpha_us * (h * slices(b / n_f) + h) + h / n_f * b / beta + fill(h)
        }
        (CollKind::Broadcast | CollKind::Reduce, _) => {
            let h = n_f - 1.0;
            link.alpha_us * (slices(b) + h) + b / beta + fill(h)
        }
        // Point-to-point patterns: one hop, everything streamed.
        _ => link.alpha_us * slices(b) + b / beta,
    }
}

/// The bus-bandwidth factor of a collective of `n` ranks (nccl-tests'):
/// the bytes a rank's busiest link carries per byte of the operation's size.
pub fn bus_factor(kind: CollKind, n: usize) -> f64 {
    let n_f = n.max(1) as f64;
    match kind {
        CollKind::AllReduce => 2.0 * (n_f - 1.0) / n_f,
        CollKind::AllGather
        | CollKind::ReduceScatter
        | CollKind::AllToAll
        | CollKind::Gather
        | CollKind::Scatter => (n_f - 1.0) / n_f,
        CollKind::Broadcast | CollKind::Reduce | CollKind::Send | CollKind::Recv => 1.0,
    }
}

/// Latency of one GPU collective before its bytes: a launch and an
/// all-reduce's first step (2-rank 8 B all-reduces took 7.6-9.6 us eager on
/// 2xH200, 2026-11-30), then ~1 us per further dependent step of the ring.
const GPU_ALPHA_US: f64 = 6.0;
const GPU_STEP_US: f64 = 1.0;
/// Bus bandwidth of a large GPU collective over NVLink, bytes per us: the
/// ring's 265 GB/s at 512 MB on 2xH200 (2026-11-30; NCCL 326-344 there).
const GPU_BUSBW_BPUS: f64 = 265e3;

/// The model's time of a GPU collective of `bytes` (nccl-tests' size) over
/// `n` ranks of one NVLink-connected host, microseconds: latency plus the
/// bus bytes at the measured bus bandwidth. What `ncclGroupSimulateEnd`
/// reports for device buffers; other topologies (PCIe, between hosts) are
/// not modelled apart.
pub fn gpu_estimate_us(kind: CollKind, bytes: usize, n: usize) -> f64 {
    if n <= 1 {
        // A local copy at most: launch cost plus ~2 TB/s of device memory.
        return GPU_ALPHA_US + bytes as f64 / 2e6;
    }
    let steps = match kind {
        CollKind::AllReduce => 2 * (n - 1),
        CollKind::Send | CollKind::Recv => 1,
        _ => n - 1,
    };
    GPU_ALPHA_US
        + GPU_STEP_US * steps.saturating_sub(1) as f64
        + bytes as f64 * bus_factor(kind, n) / GPU_BUSBW_BPUS
}

/// Picks the cheapest allowed (algorithm, protocol, channels) for a call.
pub fn choose(input: &TuneInput<'_>) -> Result<Plan> {
    let kind = input.kind;
    let max_ch = input
        .max_channels
        .unwrap_or(input.link.useful_channels)
        .clamp(1, 64);
    let min_ch = input.min_channels.unwrap_or(1).clamp(1, max_ch);
    let mut best: Option<Plan> = None;
    for &(algo, shaped) in candidates(kind) {
        if !input.algos.allows(kind, algo) {
            continue;
        }
        // One-shot moves (n-1)·S per rank: only worth it while latency dominates.
        // A cost rule, so it yields only to another allowed algorithm: with
        // NCCL_ALGO=allreduce:oneshot alone, calls over 256 KiB used to fail
        // with "no algorithm" although one-shot runs any size.
        let other_allowed = candidates(kind)
            .iter()
            .any(|&(a, s)| s != Shaped::OneShot && input.algos.allows(kind, a));
        if shaped == Shaped::OneShot && input.bytes > (256 << 10) && other_allowed {
            continue;
        }
        // Past ONE_SHOT_MAX_RANKS a rank is not connected to every peer at
        // creation (crate::peers): one-shot would connect them all on first
        // use, so it runs there only when nothing else is allowed.
        if shaped == Shaped::OneShot
            && input.nranks > crate::peers::ONE_SHOT_MAX_RANKS
            && other_allowed
        {
            continue;
        }
        for &proto in &[Proto::LL, Proto::LL128, Proto::Simple] {
            if !input.protos.allows(kind, proto) {
                continue;
            }
            let slice = slice_for(proto, input.capacity);
            for nch in min_ch..=max_ch {
                let est = estimate(
                    kind,
                    shaped,
                    input.bytes,
                    input.nranks,
                    &input.link,
                    slice,
                    nch,
                );
                let better = match &best {
                    None => true,
                    Some(b) => est < b.est_us,
                };
                if better {
                    best = Some(Plan {
                        algo,
                        proto,
                        shaped,
                        nchannels: nch,
                        slice,
                        est_us: est,
                    });
                }
            }
        }
    }
    best.ok_or_else(|| {
        Error::invalid_usage(format!(
            "NCCL_ALGO={} / NCCL_PROTO={} leave no algorithm and protocol for {kind} (this executor runs {} with LL, LL128 or Simple)",
            input.algos,
            input.protos,
            candidates(kind)
                .iter()
                .map(|(a, _)| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_estimate_meets_the_measured_anchors_and_grows() {
        // 2 ranks, 8 B all-reduce: 7.6-9.6 us measured (2xH200, eager).
        let small = gpu_estimate_us(CollKind::AllReduce, 8, 2);
        assert!((7.0..10.0).contains(&small), "{small}");
        // 512 MB all-reduce, 2 ranks: busbw 265 GB/s, so S / 265 GB/s.
        let big = gpu_estimate_us(CollKind::AllReduce, 512 << 20, 2);
        let want = (512u64 << 20) as f64 / 265e3;
        assert!((big - want).abs() < 10.0, "{big} vs {want}");
        for kind in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::Broadcast,
            CollKind::AllToAll,
            CollKind::Send,
        ] {
            for n in [1, 2, 3, 8] {
                let mut last = 0.0;
                for bytes in [0usize, 1, 4096, 1 << 20, 1 << 30] {
                    let t = gpu_estimate_us(kind, bytes, n);
                    assert!(
                        t.is_finite() && t > 0.0 && t >= last,
                        "{kind:?} n {n} bytes {bytes}: {t}"
                    );
                    last = t;
                }
            }
        }
        // More ranks: more steps, never less time for the same bytes.
        assert!(
            gpu_estimate_us(CollKind::AllReduce, 1 << 20, 8)
                > gpu_estimate_us(CollKind::AllReduce, 1 << 20, 2)
        );
    }

    #[test]
    fn bus_factors_are_nccl_tests() {
        assert_eq!(bus_factor(CollKind::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(CollKind::AllGather, 4), 0.75);
        assert_eq!(bus_factor(CollKind::Broadcast, 4), 1.0);
        assert_eq!(bus_factor(CollKind::AllReduce, 1), 0.0);
    }

    fn input<'a>(
        kind: CollKind,
        bytes: usize,
        n: usize,
        a: &'a Selection<Algo>,
        p: &'a Selection<Proto>,
    ) -> TuneInput<'a> {
        TuneInput {
            kind,
            bytes,
            nranks: n,
            link: LinkModel::SHM,
            algos: a,
            protos: p,
            capacity: 4 << 20,
            min_channels: None,
            max_channels: None,
        }
    }

    #[test]
    fn small_all_reduce_is_one_shot_large_is_ring() {
        let a = Selection::all();
        let p = Selection::all();
        let small = choose(&input(CollKind::AllReduce, 8, 2, &a, &p)).unwrap();
        assert_eq!(small.shaped, Shaped::OneShot);
        let large = choose(&input(CollKind::AllReduce, 128 << 20, 4, &a, &p)).unwrap();
        assert_eq!(large.shaped, Shaped::Ring);
        // The estimate respects the bandwidth floor 2(n-1)/n * S / beta and stays near it.
        let floor = 1.5 * (128 << 20) as f64 / LinkModel::SHM.beta_bpus;
        assert!(
            large.est_us >= floor && large.est_us < floor * 1.3,
            "{large:?} floor {floor}"
        );
    }

    #[test]
    fn one_shot_stays_within_the_peers_connected_at_creation() {
        let a = Selection::all();
        let p = Selection::all();
        let max = crate::peers::ONE_SHOT_MAX_RANKS;
        let t = choose(&input(CollKind::AllReduce, 8, max, &a, &p)).unwrap();
        assert_eq!(t.shaped, Shaped::OneShot);
        for n in [max + 1, 64, 1024] {
            let t = choose(&input(CollKind::AllReduce, 8, n, &a, &p)).unwrap();
            assert_ne!(t.shaped, Shaped::OneShot, "{n} ranks");
        }
        // Forced, it still runs (its peers are connected on first use).
        let only = Selection::parse("allreduce:oneshot").unwrap();
        let t = choose(&input(CollKind::AllReduce, 8, 64, &only, &p)).unwrap();
        assert_eq!(t.shaped, Shaped::OneShot);
    }

    #[test]
    fn tree_beats_ring_for_mid_sizes_at_scale() {
        let a = Selection::parse("ring,tree").unwrap();
        let p = Selection::all();
        let t = choose(&input(CollKind::AllReduce, 4096, 64, &a, &p)).unwrap();
        assert_eq!(t.shaped, Shaped::Tree);
    }

    #[test]
    fn env_grammar_restricts() {
        let a = Selection::parse("allreduce:tree").unwrap();
        let p = Selection::parse("simple").unwrap();
        let t = choose(&input(CollKind::AllReduce, 8, 2, &a, &p)).unwrap();
        assert_eq!((t.algo, t.proto), (Algo::Tree, Proto::Simple));
        let none = Selection::parse("^ring").unwrap();
        let e = choose(&input(CollKind::Broadcast, 8, 2, &none, &p)).unwrap_err();
        assert!(e.message().contains("NCCL_ALGO"), "{e}");
    }

    #[test]
    fn channel_bounds_are_honoured() {
        let a = Selection::all();
        let p = Selection::all();
        let mut i = input(CollKind::AllReduce, 64 << 20, 4, &a, &p);
        i.link = LinkModel::TCP;
        i.max_channels = Some(2);
        assert!(choose(&i).unwrap().nchannels <= 2);
        i.min_channels = Some(2);
        i.link = LinkModel::SHM;
        assert_eq!(choose(&i).unwrap().nchannels, 2);
    }

    #[test]
    fn slices_respect_the_deadlock_bound() {
        for cap in [64usize, 4096, 1 << 20, 4 << 20, 64 << 20] {
            for proto in [Proto::LL, Proto::LL128, Proto::Simple] {
                let s = slice_for(proto, cap);
                assert!(s * 2 <= cap.max(128), "{proto:?} {cap}");
                assert_eq!(s % 8, 0);
            }
        }
    }
}
