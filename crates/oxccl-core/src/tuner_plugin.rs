//! NCCL's tuner-plugin interface as pure data: NCCL's ids for collectives,
//! algorithms and protocols, the cost table oxccl hands a plugin's
//! `getCollInfo`, and the plan that follows from what the plugin returns.
//!
//! The exchange, as NCCL 2.30 runs it: the core fills
//! `collCostTable[algo][proto]` (`NCCL_NUM_ALGORITHMS` x `NCCL_NUM_PROTOCOLS`
//! floats) with its own time estimates, `-1.0` (`NCCL_ALGO_PROTO_IGNORE`)
//! where a combination is impossible; the plugin may lower or raise entries
//! (a plugin that wants one choice sets it to 0) and may set `nChannels`;
//! the core then takes the lowest entry that is not ignored. Here a
//! combination is possible when oxccl's executor runs it and `NCCL_ALGO` /
//! `NCCL_PROTO` allow it, and its estimate is that of [`crate::tuner`].
//!
//! oxccl has algorithms NCCL has no id for (one-shot all-reduce): a plugin
//! cannot name them. So a plugin that returns the table as given and no
//! channel count leaves oxccl's own plan, whatever it is; any change makes
//! the lowest entry the choice.

use crate::algo::{Algo, Proto};
use crate::tuner::{candidates, choose, estimate, slice_for, Plan, TuneInput};
use crate::types::CollKind;

/// `NCCL_NUM_ALGORITHMS` (Tree, Ring, CollnetDirect, CollnetChain, NVLS,
/// NVLSTree, PAT) in the table of tuner v3 to v6.
pub const NUM_ALGORITHMS: usize = 7;
/// `NCCL_NUM_PROTOCOLS` (LL, LL128, Simple).
pub const NUM_PROTOCOLS: usize = 3;
/// `NCCL_ALGO_PROTO_IGNORE`: an impossible combination.
pub const IGNORE: f32 = -1.0;

/// `float collCostTable[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS]`.
pub type CostTable = [[f32; NUM_PROTOCOLS]; NUM_ALGORITHMS];

/// NCCL's `NCCL_ALGO_*` id of an algorithm (`None`: oxccl's own, which NCCL
/// does not know).
pub fn algo_id(a: Algo) -> Option<usize> {
    match a {
        Algo::Tree => Some(0),
        Algo::Ring => Some(1),
        Algo::CollnetDirect => Some(2),
        Algo::CollnetChain => Some(3),
        Algo::Nvls => Some(4),
        Algo::NvlsTree => Some(5),
        Algo::Pat => Some(6),
        Algo::OneShot | Algo::TwoShot => None,
    }
}

/// The algorithm of an `NCCL_ALGO_*` id.
pub fn algo_from_id(id: usize) -> Option<Algo> {
    [
        Algo::Tree,
        Algo::Ring,
        Algo::CollnetDirect,
        Algo::CollnetChain,
        Algo::Nvls,
        Algo::NvlsTree,
        Algo::Pat,
    ]
    .get(id)
    .copied()
}

/// NCCL's `NCCL_PROTO_*` id of a protocol.
pub fn proto_id(p: Proto) -> usize {
    match p {
        Proto::LL => 0,
        Proto::LL128 => 1,
        Proto::Simple => 2,
    }
}

/// The protocol of an `NCCL_PROTO_*` id.
pub fn proto_from_id(id: usize) -> Option<Proto> {
    [Proto::LL, Proto::LL128, Proto::Simple].get(id).copied()
}

/// NCCL's `ncclFunc_t` value of a collective.
pub fn func_id(k: CollKind) -> i32 {
    match k {
        CollKind::Broadcast => 0,
        CollKind::Reduce => 1,
        CollKind::AllGather => 2,
        CollKind::ReduceScatter => 3,
        CollKind::AllReduce => 4,
        CollKind::Send => 6,
        CollKind::Recv => 7,
        CollKind::AllToAll => 8,
        CollKind::Scatter => 9,
        CollKind::Gather => 10,
    }
}

/// The channel counts [`choose`] considers for `input`.
fn channel_range(input: &TuneInput<'_>) -> (usize, usize) {
    let max_ch = input
        .max_channels
        .unwrap_or(input.link.useful_channels)
        .clamp(1, 64);
    let min_ch = input.min_channels.unwrap_or(1).clamp(1, max_ch);
    (min_ch, max_ch)
}

/// The best plan for one algorithm and protocol (`nchannels`: the
/// plugin's count, else the fastest count by the model).
fn plan_for(input: &TuneInput<'_>, algo: Algo, proto: Proto, nchannels: Option<usize>) -> Plan {
    let shaped = candidates(input.kind)
        .iter()
        .find(|(a, _)| *a == algo)
        .map(|(_, s)| *s)
        .unwrap_or(crate::schedule::Shaped::Ring);
    let slice = slice_for(proto, input.capacity);
    let (min_ch, max_ch) = channel_range(input);
    let est = |nch| {
        estimate(
            input.kind,
            shaped,
            input.bytes,
            input.nranks,
            &input.link,
            slice,
            nch,
        )
    };
    let nch = match nchannels {
        Some(n) => n.clamp(min_ch, max_ch),
        None => (min_ch..=max_ch)
            .min_by(|a, b| est(*a).total_cmp(&est(*b)))
            .unwrap_or(min_ch),
    };
    Plan {
        algo,
        proto,
        shaped,
        nchannels: nch,
        slice,
        est_us: est(nch),
    }
}

/// The table oxccl gives a plugin for `input`: its estimate (microseconds)
/// for each combination it can run and the settings allow, [`IGNORE`]
/// elsewhere.
pub fn cost_table(input: &TuneInput<'_>) -> CostTable {
    let mut t = [[IGNORE; NUM_PROTOCOLS]; NUM_ALGORITHMS];
    for &(algo, _) in candidates(input.kind) {
        let Some(a) = algo_id(algo) else { continue };
        if !input.algos.allows(input.kind, algo) {
            continue;
        }
        for proto in [Proto::LL, Proto::LL128, Proto::Simple] {
            if input.protos.allows(input.kind, proto) {
                // f32 holds microseconds to 7 digits: plenty for a ranking.
                t[a][proto_id(proto)] = plan_for(input, algo, proto, None).est_us as f32;
            }
        }
    }
    t
}

/// Where the plan came from, for the `TUNING` log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The plugin returned the table as given and no channel count.
    Unchanged,
    /// The lowest entry (and the plugin's channel count, if set) was used.
    Applied,
    /// The plugin only set a channel count: oxccl's algorithm and protocol.
    ChannelsOnly,
    /// Every entry oxccl can run was ignored or negative: oxccl's own plan.
    NothingRunnable,
}

/// Whether the plugin wrote anything into the table it was given.
pub fn changed(given: &CostTable, returned: &CostTable) -> bool {
    given
        .iter()
        .flatten()
        .zip(returned.iter().flatten())
        .any(|(a, b)| a.to_bits() != b.to_bits())
}

/// The (algorithm, protocol) ids of the lowest entry of `returned` that
/// `given` offered (not [`IGNORE`]d there); NaN and negative costs are "not
/// this one", as in NCCL. `None` when no offered entry is left.
pub fn lowest_runnable(given: &CostTable, returned: &CostTable) -> Option<(usize, usize)> {
    let mut best: Option<(f32, usize, usize)> = None;
    for (a, row) in returned.iter().enumerate() {
        for (p, &cost) in row.iter().enumerate() {
            if given[a][p] < 0.0 || cost.is_nan() || cost < 0.0 {
                continue;
            }
            if best.is_none_or(|(c, _, _)| cost < c) {
                best = Some((cost, a, p));
            }
        }
    }
    best.map(|(_, a, p)| (a, p))
}

/// The plan for `input` after a plugin returned `returned` (from `given`,
/// made by [`cost_table`]) and `nchannels` (0 or less: unset). Entries that
/// `given` ignored stay impossible whatever the plugin wrote there.
pub fn apply(
    input: &TuneInput<'_>,
    given: &CostTable,
    returned: &CostTable,
    nchannels: i32,
) -> crate::error::Result<(Plan, Verdict)> {
    let own = choose(input)?;
    let channels = usize::try_from(nchannels).ok().filter(|&n| n > 0);
    if !changed(given, returned) {
        return Ok(match channels {
            None => (own, Verdict::Unchanged),
            Some(n) => (
                plan_for(input, own.algo, own.proto, Some(n)),
                Verdict::ChannelsOnly,
            ),
        });
    }
    let Some((a, p)) = lowest_runnable(given, returned) else {
        return Ok((own, Verdict::NothingRunnable));
    };
    let (Some(algo), Some(proto)) = (algo_from_id(a), proto_from_id(p)) else {
        return Ok((own, Verdict::NothingRunnable));
    };
    Ok((plan_for(input, algo, proto, channels), Verdict::Applied))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Selection;
    use crate::tuner::LinkModel;

    fn input<'a>(
        kind: CollKind,
        bytes: usize,
        algos: &'a Selection<Algo>,
        protos: &'a Selection<Proto>,
    ) -> TuneInput<'a> {
        TuneInput {
            kind,
            bytes,
            nranks: 4,
            link: LinkModel::TCP,
            algos,
            protos,
            capacity: 1 << 20,
            min_channels: None,
            max_channels: Some(4),
        }
    }

    #[test]
    fn ids_are_nccls() {
        assert_eq!(algo_id(Algo::Tree), Some(0));
        assert_eq!(algo_id(Algo::Ring), Some(1));
        assert_eq!(algo_id(Algo::Pat), Some(6));
        assert_eq!(algo_id(Algo::OneShot), None);
        assert_eq!(proto_id(Proto::LL), 0);
        assert_eq!(proto_id(Proto::LL128), 1);
        assert_eq!(proto_id(Proto::Simple), 2);
        assert_eq!(func_id(CollKind::AllReduce), 4);
        assert_eq!(func_id(CollKind::Broadcast), 0);
        for a in 0..NUM_ALGORITHMS {
            assert_eq!(algo_from_id(a).and_then(algo_id), Some(a));
        }
        for p in 0..NUM_PROTOCOLS {
            assert_eq!(proto_from_id(p).map(proto_id), Some(p));
        }
        assert_eq!(algo_from_id(7), None);
        assert_eq!(proto_from_id(3), None);
    }

    #[test]
    fn table_marks_what_oxccl_runs() {
        let (a, p) = (Selection::all(), Selection::all());
        let t = cost_table(&input(CollKind::AllReduce, 1 << 20, &a, &p));
        for proto in 0..NUM_PROTOCOLS {
            assert!(t[0][proto] > 0.0, "Tree {proto}: {t:?}");
            assert!(t[1][proto] > 0.0, "Ring {proto}: {t:?}");
            for row in &t[2..] {
                assert_eq!(row[proto], IGNORE);
            }
        }
        // All-gather runs on rings only.
        let t = cost_table(&input(CollKind::AllGather, 1 << 20, &a, &p));
        assert_eq!(t[0], [IGNORE; 3]);
        assert!(t[1].iter().all(|&c| c > 0.0));
        // NCCL_PROTO=Simple and NCCL_ALGO=Tree leave one entry.
        let a = Selection::<Algo>::parse("Tree").unwrap();
        let p = Selection::<Proto>::parse("Simple").unwrap();
        let t = cost_table(&input(CollKind::AllReduce, 1 << 20, &a, &p));
        let live: Vec<(usize, usize)> = (0..NUM_ALGORITHMS)
            .flat_map(|x| (0..NUM_PROTOCOLS).map(move |y| (x, y)))
            .filter(|&(x, y)| t[x][y] >= 0.0)
            .collect();
        assert_eq!(live, vec![(0, 2)]);
    }

    #[test]
    fn unchanged_table_keeps_oxccls_plan() {
        let (a, p) = (Selection::all(), Selection::all());
        // 8 bytes on 4 ranks: oxccl's own choice is one-shot, which NCCL
        // cannot name; an untouched table must not take it away.
        let i = input(CollKind::AllReduce, 8, &a, &p);
        let t = cost_table(&i);
        let (plan, v) = apply(&i, &t, &t, 0).unwrap();
        assert_eq!(v, Verdict::Unchanged);
        assert_eq!(plan, choose(&i).unwrap());
        assert_eq!(plan.algo, Algo::OneShot);
        let (plan, v) = apply(&i, &t, &t, 3).unwrap();
        assert_eq!(v, Verdict::ChannelsOnly);
        assert_eq!((plan.algo, plan.nchannels), (Algo::OneShot, 3));
    }

    #[test]
    fn each_forced_choice_is_taken() {
        let (a, p) = (Selection::all(), Selection::all());
        for bytes in [0usize, 8, 1 << 20, 3 << 24] {
            let i = input(CollKind::AllReduce, bytes, &a, &p);
            let t = cost_table(&i);
            for (algo, proto) in [Algo::Tree, Algo::Ring]
                .into_iter()
                .flat_map(|a| [Proto::LL, Proto::LL128, Proto::Simple].map(|p| (a, p)))
            {
                let mut r = t;
                r[algo_id(algo).unwrap()][proto_id(proto)] = 0.0;
                let (plan, v) = apply(&i, &t, &r, 0).unwrap();
                assert_eq!(v, Verdict::Applied);
                assert_eq!((plan.algo, plan.proto), (algo, proto), "{bytes} bytes");
                let (plan, _) = apply(&i, &t, &r, 2).unwrap();
                assert_eq!(plan.nchannels, 2);
                // A count beyond NCCL_MAX_NCHANNELS is capped.
                let (plan, _) = apply(&i, &t, &r, 99).unwrap();
                assert_eq!(plan.nchannels, 4);
            }
        }
    }

    #[test]
    fn ignored_entries_stay_impossible() {
        let (a, p) = (Selection::all(), Selection::all());
        let i = input(CollKind::AllGather, 4096, &a, &p);
        let t = cost_table(&i);
        // A plugin that "chooses" NVLS and PAT, which oxccl cannot run.
        let mut r = t;
        r[4][2] = 0.0;
        r[6][0] = 0.0;
        r[1][1] = 5.0;
        r[1][0] = 9.0;
        r[1][2] = f32::NAN;
        let (plan, v) = apply(&i, &t, &r, 0).unwrap();
        assert_eq!(v, Verdict::Applied);
        assert_eq!((plan.algo, plan.proto), (Algo::Ring, Proto::LL128));
        // Everything runnable marked ignored: oxccl's own.
        let mut r = t;
        r[1] = [IGNORE; 3];
        let (plan, v) = apply(&i, &t, &r, 0).unwrap();
        assert_eq!(v, Verdict::NothingRunnable);
        assert_eq!(plan, choose(&i).unwrap());
    }
}
