//! Every rank of a communicator in one launch: the pure part.
//!
//! When one group holds every rank's calls of a communicator whose ranks
//! all live in this process (ranks sharing a GPU; nccl-tests `-g N` with
//! `OXCCL_CUDA_JOINT_PEERS=1`), a small collective runs as one kernel on
//! rank 0's GPU (`oxccl_one_launch_*`, ring.cu `one_launch_run`) that reads every
//! rank's input and writes every rank's output (through the peer mappings
//! across GPUs), and the other ranks' streams are ordered around it with
//! events (oxccl-cuda's `exec.rs`, `launch_one_launch`). Why: an eager call is bound by the
//! host's launches (~3.2-3.5 us each on the GPU machine's host,
//! scripts/launch-probe.sh); two streams of one H200 took 6.9-7.8 us per op
//! for two empty launches against 4.3-5.7 for one launch and an event each
//! way. Measured with two ranks sharing the H200, eager, 8 B-128 KB, rounds
//! alternated with `OXCCL_CUDA_JOINT_MAX=0` (7 for all-reduce, all-gather
//! and broadcast, 3 for reduce and reduce-scatter, over two device calls):
//! a process's calls settle in one of a few modes, ~4.6-5.6 or ~7.0-7.5 us
//! with one launch, ~6.3-7.2, ~8.6-9.7 or ~9.8-10.6 with two; the medians,
//! one launch against two: all-reduce 7.18 against 8.97 us, reduce 4.95
//! against 8.96, reduce-scatter 6.49 against 9.36, all-gather 6.60 against
//! 9.24, broadcast 7.07 against 7.75; a third call, 16 alternated pairs of
//! all-reduces: one launch faster in all 16, 0.54-0.87x; four ranks
//! sharing it, 8 B-32 KB, three rounds: all-reduces 7.3-8.0 us against
//! 17.2-19.3, all-gathers 10.7-11.4 against 17.8-18.7, broadcasts 7.6-11.1
//! against 17.0-17.4 (one H200, 2026-12-01; docs/performance-gpu.md). On several GPUs the events cross
//! devices and rank 0's GPU reads the others' inputs over NVLink: off there
//! until timed (`OXCCL_CUDA_JOINT_PEERS`).
//!
//! Here: which calls may take it ([`may_take`], [`fits`]), which launches
//! of a group go together ([`group_up`]), the kernel's arguments ([`args`]) and grid
//! ([`blocks`]). No driver calls.

use super::kernel::{Collective, RingKernel};
use crate::types::{DataType, RedOp};

/// Most ranks one launch takes (`ONE_LAUNCH_MAX_RANKS` of ring.cu).
pub const MAX_RANKS: usize = 8;

/// `struct OneLaunchArgs` of `ring.cu` (344 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OneLaunchArgs {
    /// Each rank's input.
    pub input: [u64; MAX_RANKS],
    /// Each rank's output (0: none, a reduce's non-roots).
    pub output: [u64; MAX_RANKS],
    /// Float avg / PreMulSum: each rank's multiplier.
    pub scale: [f64; MAX_RANKS],
    /// Integer PreMulSum: each rank's scalar's bits.
    pub iscale: [u64; MAX_RANKS],
    /// PreMulSum with a device scalar: each rank's scalar's address, else 0.
    pub scalar_ptr: [u64; MAX_RANKS],
    /// Elements (all-gather, reduce-scatter: per rank).
    pub count: u64,
    /// The collective's Simple ring kernel ([`RingKernel::mode`]).
    pub mode: u32,
    /// A broadcast's or reduce's root rank.
    pub root: u32,
    /// Ranks (2..=[`MAX_RANKS`]).
    pub nranks: u32,
    pad: u32,
}

/// What every rank's call must agree on to run in one kernel
/// ([`RankCall::key`]): the collective, the kernel's type and op (by
/// `DataType` and `RedOp::wire_code`: a PreMulSum's scalar is each rank's
/// own), elements and root.
pub type Key = (Collective, u8, u8, u64, u32);

/// One rank's side of a call that [`fits`]: the collective, elements (per rank: all-gather, reduce-scatter), root,
/// the kernel's type and op (copies run as uint8 sum), and its own buffers
/// and scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankCall {
    /// The collective.
    pub collective: Collective,
    /// Elements (all-gather, reduce-scatter: per rank).
    pub count: u64,
    /// A broadcast's or reduce's root rank.
    pub root: u32,
    /// The kernel's type.
    pub dtype: DataType,
    /// The kernel's op (a PreMulSum's scalar is this rank's).
    pub op: RedOp,
    /// This rank's input.
    pub input: u64,
    /// This rank's output (0: none, a reduce's non-roots).
    pub output: u64,
    /// Float avg / PreMulSum: this rank's multiplier.
    pub scale: f64,
    /// Integer PreMulSum: this rank's scalar's bits.
    pub iscale: u64,
    /// PreMulSum with a device scalar: its address, else 0.
    pub scalar_ptr: u64,
}

impl RankCall {
    /// What the other ranks' calls must match ([`Key`]).
    pub fn key(&self) -> Key {
        (
            self.collective,
            self.dtype as u8,
            self.op.wire_code(),
            self.count,
            self.root,
        )
    }
}

/// Whether a call of `nranks` ranks whose larger buffer per rank (input or
/// output) holds `bytes` takes the one-launch kernel under the bound `max`
/// (`OXCCL_CUDA_JOINT_MAX`; 0: never). Nothing to move (0 bytes) never
/// does; nor one rank (nothing to join) or more than [`MAX_RANKS`].
pub fn fits(nranks: usize, bytes: u64, max: u64) -> bool {
    (2..=MAX_RANKS).contains(&nranks) && bytes > 0 && bytes <= max
}

/// What a communicator brings to the choice ([`may_take`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eligibility {
    /// Ranks of the communicator.
    pub nranks: usize,
    /// Its ranks that live in this process.
    pub local_ranks: usize,
    /// Whether those ranks are on more than one GPU.
    pub spread: bool,
    /// `OXCCL_CUDA_JOINT_PEERS`: across GPUs too.
    pub peers: bool,
    /// Every call takes the ring (`NCCL_P2P_DISABLE=1`, `NCCL_ALGO`
    /// without OneShot/TwoShot, `OXCCL_CUDA_RING=1`).
    pub ring_only: bool,
    /// `OXCCL_CUDA_JOINT_MAX`.
    pub max: u64,
}

/// Whether a call of `collective` whose larger buffer per rank holds `bytes`
/// may take the one-launch kernel under `s`, with `ce_bound` the
/// copy-engine bound of its kind of call (0: none; one set below `s.max`
/// wins, as tests set 1 to put every call of two GPUs on the engines).
/// The caller still keeps captured calls off it (asked last: a driver
/// call): each rank's stream may be captured into a graph of its own
/// (nccl-tests -G with -g 2), and a capture cannot wait for another's
/// event (`oxccl perf -g 2 --share-gpus -G 2` failed so with "unhandled
/// cuda error", one H200, 2026-12-01).
pub fn may_take(s: &Eligibility, bytes: u64, ce_bound: u64) -> bool {
    fits(s.nranks, bytes, s.max)
        && s.local_ranks == s.nranks
        && (!s.spread || s.peers)
        && !s.ring_only
        && !(ce_bound > 0 && bytes >= ce_bound)
}

/// The copy-engine bound that applies to a call of `collective`: `ce_min`
/// for all-gathers and broadcasts, `ce_ar_min` for all-reduces and
/// reduce-scatters, none for reduces.
pub fn ce_bound(collective: Collective, ce_min: u64, ce_ar_min: u64) -> u64 {
    match collective {
        Collective::AllGather | Collective::Broadcast => ce_min,
        Collective::AllReduce | Collective::ReduceScatter => ce_ar_min,
        Collective::Reduce => 0,
    }
}

/// The largest buffer per rank of a collective of `count` elements of
/// `elem` bytes over `nranks` ranks: all-gathers write and reduce-scatters
/// read every rank's part.
pub fn largest_buffer(collective: Collective, count: u64, elem: u64, nranks: usize) -> u64 {
    let b = count.saturating_mul(elem);
    match collective {
        Collective::AllGather | Collective::ReduceScatter => b.saturating_mul(nranks as u64),
        _ => b,
    }
}

/// Blocks of 512 threads for a call whose largest buffer holds `bytes`:
/// one 16-byte pack per thread in one pass (8 KiB a block), so every load
/// is in flight at once, at most 32 (256 KiB; the default bound).
pub fn blocks(bytes: u64) -> u32 {
    bytes.div_ceil(8 << 10).clamp(1, 32) as u32
}

/// Which launches of a group run as one-launch kernels: `parts[i]` is launch
/// i's communicator (any identity: its clique), rank and [`RankCall`] (`None`:
/// it cannot), for a communicator of `nranks` ranks. Some(one list per
/// call, rank 0's launch first: the k-th call of every rank together) only
/// when every launch is of one communicator, every rank made the same
/// number of calls, and every k-th call has a part on every rank with
/// equal keys; else None, and the group launches as it would without this
/// path. All or nothing, so no rank's calls change order on its stream.
pub fn group_up(
    parts: &[(usize, usize, Option<RankCall>)],
    nranks: usize,
) -> Option<Vec<Vec<usize>>> {
    let first = parts.first()?;
    if !(2..=MAX_RANKS).contains(&nranks)
        || parts
            .iter()
            .any(|p| p.0 != first.0 || p.1 >= nranks || p.2.is_none())
    {
        return None;
    }
    let of = |r: usize| -> Vec<usize> { (0..parts.len()).filter(|&i| parts[i].1 == r).collect() };
    let by_rank: Vec<Vec<usize>> = (0..nranks).map(of).collect();
    let calls = by_rank[0].len();
    if by_rank.iter().any(|v| v.len() != calls) {
        return None;
    }
    let key = |i: usize| parts[i].2.map(|p| p.key());
    let mut out = Vec::with_capacity(calls);
    for k in 0..calls {
        let call: Vec<usize> = by_rank.iter().map(|v| v[k]).collect();
        if call.iter().any(|&i| key(i) != key(call[0])) {
            return None;
        }
        out.push(call);
    }
    Some(out)
}

/// The kernel's arguments from every rank's part, rank order (equal keys;
/// at most [`MAX_RANKS`], as [`group_up`] and [`fits`] ensure).
pub fn args(parts: &[RankCall]) -> OneLaunchArgs {
    let mut a = OneLaunchArgs::default();
    for (r, p) in parts.iter().take(MAX_RANKS).enumerate() {
        a.input[r] = p.input;
        a.output[r] = p.output;
        a.scale[r] = p.scale;
        a.iscale[r] = p.iscale;
        a.scalar_ptr[r] = p.scalar_ptr;
    }
    if let Some(p) = parts.first() {
        a.count = p.count;
        a.mode = RingKernel::ring(p.collective).mode();
        a.root = p.root;
    }
    a.nranks = parts.len().min(MAX_RANKS) as u32;
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use Collective::{AllGather, AllReduce, Broadcast, Reduce, ReduceScatter};

    fn part(collective: Collective, count: u64) -> RankCall {
        RankCall {
            collective,
            count,
            root: 0,
            dtype: DataType::Float32,
            op: RedOp::Sum,
            input: 0x1000,
            output: 0x2000,
            scale: 0.5,
            iscale: 0,
            scalar_ptr: 0,
        }
    }

    #[test]
    fn args_match_the_kernels_layout() {
        // ring.cu's OneLaunchArgs: 5 arrays of 8 eight-byte words, the count,
        // then four u32s.
        assert_eq!(std::mem::size_of::<OneLaunchArgs>(), 344);
        assert_eq!(std::mem::align_of::<OneLaunchArgs>(), 8);
        assert_eq!(std::mem::offset_of!(OneLaunchArgs, count), 320);
        assert_eq!(std::mem::offset_of!(OneLaunchArgs, nranks), 336);
    }

    #[test]
    fn one_call_per_rank_goes_together_in_any_order() {
        let p = Some(part(AllReduce, 10));
        assert_eq!(group_up(&[(9, 0, p), (9, 1, p)], 2), Some(vec![vec![0, 1]]));
        assert_eq!(group_up(&[(9, 1, p), (9, 0, p)], 2), Some(vec![vec![1, 0]]));
        let g = [(9, 2, p), (9, 0, p), (9, 3, p), (9, 1, p)];
        assert_eq!(group_up(&g, 4), Some(vec![vec![1, 3, 0, 2]]));
        // PreMulSum: each rank's own scalar, one kernel
        let pm = |x: f64| {
            Some(RankCall {
                op: RedOp::PreMulSum(crate::Scalar::F64(x)),
                ..part(AllReduce, 10)
            })
        };
        assert_eq!(
            group_up(&[(1, 0, pm(1.0)), (1, 1, pm(2.0))], 2),
            Some(vec![vec![0, 1]])
        );
    }

    #[test]
    fn the_kth_calls_of_every_rank_go_together() {
        let a = Some(part(AllReduce, 10));
        let b = Some(part(AllGather, 3));
        // rank-major (one thread looping over ranks, several calls each)
        let g = [(1, 0, a), (1, 0, b), (1, 1, a), (1, 1, b)];
        assert_eq!(group_up(&g, 2), Some(vec![vec![0, 2], vec![1, 3]]));
        // call-major, three ranks
        let g = [
            (1, 0, a),
            (1, 1, a),
            (1, 2, a),
            (1, 0, b),
            (1, 1, b),
            (1, 2, b),
        ];
        assert_eq!(group_up(&g, 3), Some(vec![vec![0, 1, 2], vec![3, 4, 5]]));
    }

    #[test]
    fn anything_else_launches_as_before() {
        let p = Some(part(AllReduce, 10));
        assert_eq!(group_up(&[], 2), None);
        // one rank only (the other rank's thread groups its own call)
        assert_eq!(group_up(&[(1, 0, p)], 2), None);
        // a rank missing of three
        assert_eq!(group_up(&[(1, 0, p), (1, 1, p)], 3), None);
        // two communicators
        assert_eq!(group_up(&[(1, 0, p), (2, 1, p)], 2), None);
        // a call that does not fit (too large, count 0, a send)
        assert_eq!(group_up(&[(1, 0, p), (1, 1, None)], 2), None);
        // ranks disagree on the count (a usage error the ring reports)
        let q = Some(part(AllReduce, 11));
        assert_eq!(group_up(&[(1, 0, p), (1, 1, q)], 2), None);
        // uneven calls per rank
        assert_eq!(group_up(&[(1, 0, p), (1, 0, p), (1, 1, p)], 2), None);
        // a rank beyond the communicator's
        assert_eq!(group_up(&[(1, 0, p), (1, 2, p)], 2), None);
        // one rank, or more than the kernel takes
        assert_eq!(group_up(&[(1, 0, p)], 1), None);
        let nine: Vec<_> = (0..9).map(|r| (1, r, p)).collect();
        assert_eq!(group_up(&nine, 9), None);
        // one partial mismatch spoils the group: all or nothing
        let b = Some(part(Broadcast, 10));
        let g = [(1, 0, p), (1, 0, b), (1, 1, p), (1, 1, p)];
        assert_eq!(group_up(&g, 2), None);
    }

    #[test]
    fn each_rank_keeps_its_own_buffers_and_scalar() {
        let mut p = [part(Reduce, 4); 3];
        for (r, x) in p.iter_mut().enumerate() {
            x.root = 1;
            x.input = 0x1000 * (r as u64 + 1);
            x.output = if r == 1 { 0x9000 } else { 0 };
            x.scale = r as f64;
        }
        p[2].scalar_ptr = 0x4000;
        let a = args(&p);
        assert_eq!(&a.input[..3], &[0x1000, 0x2000, 0x3000]);
        assert_eq!(&a.output[..3], &[0, 0x9000, 0]);
        assert_eq!(&a.scale[..3], &[0.0, 1.0, 2.0]);
        assert_eq!(&a.scalar_ptr[..3], &[0, 0, 0x4000]);
        assert_eq!(a.input[3..], [0; 5]);
        assert_eq!((a.mode, a.root, a.count, a.nranks), (4, 1, 4, 3));
    }

    #[test]
    fn who_may_take_it() {
        let ok = Eligibility {
            nranks: 2,
            local_ranks: 2,
            spread: false,
            peers: false,
            ring_only: false,
            max: 256 << 10,
        };
        assert!(may_take(&ok, 8, 0));
        assert!(may_take(&ok, 256 << 10, 64 << 20));
        // too large, nothing to move
        assert!(!may_take(&ok, (256 << 10) + 1, 0));
        assert!(!may_take(&ok, 0, 0));
        // a rank in another process
        assert!(!may_take(
            &Eligibility {
                local_ranks: 1,
                ..ok
            },
            8,
            0
        ));
        // across GPUs: only with the peers setting
        let spread = Eligibility { spread: true, ..ok };
        assert!(!may_take(&spread, 8, 0));
        assert!(may_take(
            &Eligibility {
                peers: true,
                ..spread
            },
            8,
            0
        ));
        // the ring forced, the setting off
        assert!(!may_take(
            &Eligibility {
                ring_only: true,
                ..ok
            },
            8,
            0
        ));
        assert!(!may_take(&Eligibility { max: 0, ..ok }, 8, 0));
        // eight ranks, not nine
        let eight = Eligibility {
            nranks: 8,
            local_ranks: 8,
            ..ok
        };
        assert!(may_take(&eight, 8, 0));
        assert!(!may_take(
            &Eligibility {
                nranks: 9,
                local_ranks: 9,
                ..ok
            },
            8,
            0
        ));
        // a copy-engine bound set below the call's size wins
        assert!(!may_take(&ok, 8, 1));
        assert!(may_take(&ok, 8, 9));
        assert_eq!(ce_bound(AllGather, 5, 7), 5);
        assert_eq!(ce_bound(Broadcast, 5, 7), 5);
        assert_eq!(ce_bound(AllReduce, 5, 7), 7);
        assert_eq!(ce_bound(ReduceScatter, 5, 7), 7);
        assert_eq!(ce_bound(Reduce, 5, 7), 0);
    }

    #[test]
    fn bounds_and_grid() {
        assert!(!fits(2, 0, 256 << 10));
        assert!(fits(2, 1, 256 << 10) && fits(8, 256 << 10, 256 << 10));
        assert!(!fits(2, (256 << 10) + 1, 256 << 10));
        assert!(!fits(2, 8, 0));
        assert!(!fits(1, 8, 256 << 10) && !fits(9, 8, 256 << 10));
        assert_eq!(largest_buffer(AllGather, 100, 4, 2), 800);
        assert_eq!(largest_buffer(ReduceScatter, 100, 4, 4), 1600);
        assert_eq!(largest_buffer(AllReduce, 100, 4, 8), 400);
        assert_eq!(largest_buffer(Broadcast, u64::MAX, 8, 2), u64::MAX);
        assert_eq!(blocks(1), 1);
        assert_eq!(blocks(8 << 10), 1);
        assert_eq!(blocks((8 << 10) + 1), 2);
        assert_eq!(blocks(256 << 10), 32);
        assert_eq!(blocks(u64::MAX), 32);
    }
}
