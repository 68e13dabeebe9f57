//! Both ranks of a two-rank communicator in one launch: the pure part.
//!
//! When one group holds both ranks' calls of a 2-rank communicator whose
//! ranks live in this process (two ranks sharing a GPU; nccl-tests `-g 2`
//! with `OXCCL_CUDA_DUO_PEERS=1`), a small collective runs as one kernel on
//! rank 0's GPU (`oxccl_duo_*`, ring.cu `duo_run`) that reads rank 1's
//! input and writes rank 1's output (through the peer mapping on two GPUs),
//! and rank 1's stream is ordered around it with events (`capi.rs`,
//! `go_duo`). Why: an eager call is bound by the host's launches (~3.2-3.5
//! us each on the GPU machine's host, scripts/launch-probe.sh); two streams
//! of one H200 took 6.9-7.8 us per op for two empty launches against
//! 4.3-5.7 for one launch and an event each way. Measured with two ranks
//! sharing the H200, eager, 8 B-128 KB, rounds alternated with
//! `OXCCL_CUDA_DUO_MAX=0` (7 for all-reduce, all-gather and broadcast, 3
//! for reduce and reduce-scatter, over two device calls): a process's calls
//! settle in one of a few modes, ~4.6-5.6 or ~7.0-7.5 us with one launch,
//! ~6.3-7.2, ~8.6-9.7 or ~9.8-10.6 with two; the medians, one launch
//! against two: all-reduce 7.18 against 8.97 us, reduce 4.95 against 8.96,
//! reduce-scatter 6.49 against 9.36, all-gather 6.60 against 9.24,
//! broadcast 7.07 against 7.75 (docs/performance-gpu.md, session 15). On
//! two GPUs the events cross devices and rank 0's GPU reads rank 1's input
//! over NVLink: off there until timed (`OXCCL_CUDA_DUO_PEERS`).
//!
//! Here: which calls may take it ([`fits`]), which launches of a group pair
//! up ([`pair_up`]), the kernel's arguments ([`args`]) and grid
//! ([`blocks`]). No driver calls.

use oxccl_core::{DataType, RedOp};

use crate::ring::{RM_ALLGATHER, RM_ALLREDUCE, RM_BROADCAST, RM_REDUCE, RM_REDUCE_SCATTER};

/// `struct DuoArgs` of `ring.cu` (96 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DuoArgs {
    /// Each rank's input.
    pub input: [u64; 2],
    /// Each rank's output (0: none, a reduce's other rank).
    pub output: [u64; 2],
    /// Elements (all-gather, reduce-scatter: per rank).
    pub count: u64,
    /// Float avg / PreMulSum: each rank's multiplier.
    pub scale: [f64; 2],
    /// Integer PreMulSum: each rank's scalar's bits.
    pub iscale: [u64; 2],
    /// PreMulSum with a device scalar: each rank's scalar's address, else 0.
    pub scalar_ptr: [u64; 2],
    /// `RM_ALLREDUCE`, `RM_REDUCE_SCATTER`, `RM_ALLGATHER`, `RM_BROADCAST`
    /// or `RM_REDUCE`.
    pub mode: u32,
    /// A broadcast's or reduce's root rank.
    pub root: u32,
}

/// What both ranks' calls must agree on to run as one kernel: the
/// collective (`RM_*` of its Simple form), the kernel's type and op
/// (`DataType` and `RedOp::wire_code`; copies run as uint8 sum), elements
/// and root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub mode: u32,
    pub dtype: u8,
    pub op: u8,
    pub count: u64,
    pub root: u32,
}

/// One rank's side of a call that [`fits`]: its [`Key`], the kernel's
/// type and op, and its own buffers and scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Part {
    pub key: Key,
    pub dtype: DataType,
    pub op: RedOp,
    pub input: u64,
    pub output: u64,
    pub scale: f64,
    pub iscale: u64,
    pub scalar_ptr: u64,
}

/// Whether a call whose larger buffer per rank (input or output) holds
/// `bytes` takes the one-launch kernel under the bound `max`
/// (`OXCCL_CUDA_DUO_MAX`; 0: never). Nothing to move (0 bytes) never does.
pub fn fits(bytes: u64, max: u64) -> bool {
    bytes > 0 && bytes <= max
}

/// The largest buffer per rank of a collective of `count` elements of
/// `elem` bytes (`mode` as [`Key::mode`]): all-gathers write and
/// reduce-scatters read both ranks' parts.
pub fn largest_buffer(mode: u32, count: u64, elem: u64) -> u64 {
    let b = count.saturating_mul(elem);
    match mode {
        RM_ALLGATHER | RM_REDUCE_SCATTER => b.saturating_mul(2),
        _ => b,
    }
}

/// Blocks of 512 threads for a call whose largest buffer holds `bytes`:
/// one 16-byte pack per thread in one pass (8 KiB a block), so every load
/// is in flight at once, at most 32 (256 KiB; the default bound).
pub fn blocks(bytes: u64) -> u32 {
    bytes.div_ceil(8 << 10).clamp(1, 32) as u32
}

/// Which launches of a group run as duo kernels: `parts[i]` is launch i's
/// communicator (any identity: its clique), rank and [`Part`] (`None`: it
/// cannot). Some(pairs of indices, rank 0's then rank 1's, the k-th call
/// of each rank together) only when every launch is of one communicator,
/// each of ranks 0 and 1 made the same number of calls, and every k-th
/// pair has a part on both sides with equal keys; else None, and the group
/// launches as it would without this path. All or nothing, so no rank's
/// calls change order on its stream.
pub fn pair_up(parts: &[(usize, usize, Option<Part>)]) -> Option<Vec<(usize, usize)>> {
    let first = parts.first()?;
    if parts
        .iter()
        .any(|p| p.0 != first.0 || p.1 > 1 || p.2.is_none())
    {
        return None;
    }
    let of = |r: usize| -> Vec<usize> { (0..parts.len()).filter(|&i| parts[i].1 == r).collect() };
    let (r0, r1) = (of(0), of(1));
    if r0.len() != r1.len() {
        return None;
    }
    let key = |i: usize| parts[i].2.map(|p| p.key);
    if r0.iter().zip(&r1).any(|(&a, &b)| key(a) != key(b)) {
        return None;
    }
    Some(r0.into_iter().zip(r1).collect())
}

/// The kernel's arguments from rank 0's and rank 1's parts (equal keys).
pub fn args(p0: &Part, p1: &Part) -> DuoArgs {
    DuoArgs {
        input: [p0.input, p1.input],
        output: [p0.output, p1.output],
        count: p0.key.count,
        scale: [p0.scale, p1.scale],
        iscale: [p0.iscale, p1.iscale],
        scalar_ptr: [p0.scalar_ptr, p1.scalar_ptr],
        mode: p0.key.mode,
        root: p0.key.root,
    }
}

/// Whether `mode` is one the kernel runs.
pub fn runs(mode: u32) -> bool {
    matches!(
        mode,
        RM_ALLREDUCE | RM_REDUCE_SCATTER | RM_ALLGATHER | RM_BROADCAST | RM_REDUCE
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(mode: u32, count: u64) -> Part {
        Part {
            key: Key {
                mode,
                dtype: 7,
                op: 0,
                count,
                root: 0,
            },
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
        // ring.cu's DuoArgs: 4 + 1 + 6 eight-byte words, then two u32s.
        assert_eq!(std::mem::size_of::<DuoArgs>(), 96);
        assert_eq!(std::mem::align_of::<DuoArgs>(), 8);
    }

    #[test]
    fn one_call_per_rank_pairs_in_either_order() {
        let p = Some(part(RM_ALLREDUCE, 10));
        assert_eq!(pair_up(&[(9, 0, p), (9, 1, p)]), Some(vec![(0, 1)]));
        assert_eq!(pair_up(&[(9, 1, p), (9, 0, p)]), Some(vec![(1, 0)]));
    }

    #[test]
    fn the_kth_calls_of_each_rank_pair_up() {
        let a = Some(part(RM_ALLREDUCE, 10));
        let b = Some(part(RM_ALLGATHER, 3));
        // rank-major (one thread looping over ranks, several calls each)
        let g = [(1, 0, a), (1, 0, b), (1, 1, a), (1, 1, b)];
        assert_eq!(pair_up(&g), Some(vec![(0, 2), (1, 3)]));
        // call-major
        let g = [(1, 0, a), (1, 1, a), (1, 0, b), (1, 1, b)];
        assert_eq!(pair_up(&g), Some(vec![(0, 1), (2, 3)]));
    }

    #[test]
    fn anything_else_launches_as_before() {
        let p = Some(part(RM_ALLREDUCE, 10));
        assert_eq!(pair_up(&[]), None);
        // one rank only (the other rank's thread groups its own call)
        assert_eq!(pair_up(&[(1, 0, p)]), None);
        // two communicators
        assert_eq!(pair_up(&[(1, 0, p), (2, 1, p)]), None);
        // a call that does not fit (too large, count 0, a send)
        assert_eq!(pair_up(&[(1, 0, p), (1, 1, None)]), None);
        // ranks disagree on the count (a usage error the ring reports)
        let q = Some(part(RM_ALLREDUCE, 11));
        assert_eq!(pair_up(&[(1, 0, p), (1, 1, q)]), None);
        // uneven calls per rank
        assert_eq!(pair_up(&[(1, 0, p), (1, 0, p), (1, 1, p)]), None);
        // rank 2 of a larger communicator
        assert_eq!(pair_up(&[(1, 0, p), (1, 2, p)]), None);
        // one partial mismatch spoils the group: all or nothing
        let b = Some(part(RM_BROADCAST, 10));
        assert_eq!(pair_up(&[(1, 0, p), (1, 0, b), (1, 1, p), (1, 1, p)]), None);
    }

    #[test]
    fn each_rank_keeps_its_own_buffers_and_scalar() {
        let mut p0 = part(RM_REDUCE, 4);
        let mut p1 = p0;
        p0.key.root = 1;
        p1.key.root = 1;
        p1.input = 0x3000;
        p1.output = 0;
        p1.scale = 2.0;
        p1.scalar_ptr = 0x4000;
        let a = args(&p0, &p1);
        assert_eq!(a.input, [0x1000, 0x3000]);
        assert_eq!(a.output, [0x2000, 0]);
        assert_eq!(a.scale, [0.5, 2.0]);
        assert_eq!(a.scalar_ptr, [0, 0x4000]);
        assert_eq!((a.mode, a.root, a.count), (RM_REDUCE, 1, 4));
    }

    #[test]
    fn bounds_and_grid() {
        assert!(!fits(0, 256 << 10));
        assert!(fits(1, 256 << 10) && fits(256 << 10, 256 << 10));
        assert!(!fits((256 << 10) + 1, 256 << 10));
        assert!(!fits(8, 0));
        assert_eq!(largest_buffer(RM_ALLGATHER, 100, 4), 800);
        assert_eq!(largest_buffer(RM_REDUCE_SCATTER, 100, 4), 800);
        assert_eq!(largest_buffer(RM_ALLREDUCE, 100, 4), 400);
        assert_eq!(largest_buffer(RM_BROADCAST, u64::MAX, 8), u64::MAX);
        assert_eq!(blocks(1), 1);
        assert_eq!(blocks(8 << 10), 1);
        assert_eq!(blocks((8 << 10) + 1), 2);
        assert_eq!(blocks(256 << 10), 32);
        assert_eq!(blocks(u64::MAX), 32);
        assert!(runs(RM_ALLREDUCE) && runs(RM_BROADCAST) && !runs(crate::ring::RM_ALLREDUCE_LL1));
    }
}
