//! Small collectives over one-shot slots (the host executor's
//! `oxccl_host::oneshot`): which calls take them, what each rank posts and
//! reads, and the word that lets ranks catch mismatched calls. Pure.

use crate::types::{CollKind, DataType, RedOp};

/// Bytes a rank may read from its peers' slots in one call. One-shot reads
/// whole inputs where the ring moves pipelined blocks, so it wins while the
/// reads stay small: on an Intel Xeon guest with 2 vCPUs (2026-12-03,
/// `oxccl perf --backend cpu`, one-shot against the ring in alternation),
/// 2 ranks all-reduce 64 KiB in 14-15 µs one-shot against 20-22 on the
/// ring, and 4 ranks (on the 2 vCPUs) all-reduce 16-32 KiB in 20-37 µs
/// against 36-63, all-gather and reduce-scatter to 64 KiB in 17-22 µs
/// against 32-63.
pub const READ_BUDGET: usize = 64 * 1024;

/// One collective as the slots run it.
#[derive(Debug, Clone, Copy)]
pub struct SlotCall {
    pub kind: CollKind,
    /// Elements, as NCCL counts them for `kind`.
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    pub root: usize,
}

impl SlotCall {
    /// Whether the slots take this call on `nranks` ranks: the collectives
    /// below, 1 element or more (count 0 moves nothing and takes the usual
    /// path), what any rank posts within a slot of `max` bytes and what any
    /// rank reads from its peers' slots within [`READ_BUDGET`]. The same on
    /// every rank.
    pub fn fits(&self, nranks: usize, max: usize) -> bool {
        if !matches!(
            self.kind,
            CollKind::AllReduce
                | CollKind::Reduce
                | CollKind::Broadcast
                | CollKind::AllGather
                | CollKind::ReduceScatter
        ) {
            return false;
        }
        let rooted = matches!(self.kind, CollKind::Reduce | CollKind::Broadcast);
        self.count > 0
            && (!rooted || self.root < nranks)
            && self.most_posted(nranks).is_some_and(|b| b <= max)
            && self.most_read(nranks).is_some_and(|b| b <= READ_BUDGET)
    }

    /// The most bytes a rank posts (None: past `usize`).
    fn most_posted(&self, nranks: usize) -> Option<usize> {
        let bytes = self.count.checked_mul(self.dtype.size())?;
        match self.kind {
            CollKind::ReduceScatter => bytes.checked_mul(nranks),
            _ => Some(bytes),
        }
    }

    /// The most bytes a rank reads from its peers' slots (None: past
    /// `usize`): every peer's input for an all-reduce, an all-gather and a
    /// reduce's root, every peer's block for a reduce-scatter, the root's
    /// input for a broadcast's receivers.
    fn most_read(&self, nranks: usize) -> Option<usize> {
        let bytes = self.count.checked_mul(self.dtype.size())?;
        match self.kind {
            CollKind::Broadcast => Some(bytes),
            _ => bytes.checked_mul(nranks.saturating_sub(1)),
        }
    }

    /// The largest count of this call's collective and datatype that
    /// [`fits`](Self::fits) (0: none).
    pub fn largest_fitting_count(&self, nranks: usize, max: usize) -> usize {
        // fits() is monotone in the count from 1 up: bisect.
        let fits = |count| SlotCall { count, ..*self }.fits(nranks, max);
        let (mut lo, mut hi) = (0usize, max + 1);
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Whether it reduces.
    pub fn reduces(&self) -> bool {
        matches!(
            self.kind,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
        )
    }

    /// Bytes `rank` posts.
    pub fn posted_bytes(&self, rank: usize, nranks: usize) -> usize {
        let e = self.dtype.size();
        match self.kind {
            CollKind::Broadcast if rank != self.root => 0,
            CollKind::ReduceScatter => nranks * self.count * e,
            _ => self.count * e,
        }
    }

    /// Bytes of `rank`'s output (0: it has none).
    pub fn output_bytes(&self, rank: usize, nranks: usize) -> usize {
        let e = self.dtype.size();
        match self.kind {
            CollKind::Reduce if rank != self.root => 0,
            CollKind::AllGather => nranks * self.count * e,
            _ => self.count * e,
        }
    }

    /// What a slot's second word says about the call (bits: op 0-7,
    /// datatype 8-15, collective 16-19, root 20-39, count 40-63).
    pub fn meta(&self) -> u64 {
        let root = match self.kind {
            CollKind::Reduce | CollKind::Broadcast => self.root as u64 & 0xf_ffff,
            _ => 0,
        };
        ((self.count as u64) << 40)
            | (root << 20)
            | ((self.kind.wire_code() as u64 & 0xf) << 16)
            | ((self.dtype as i32 as u64 & 0xff) << 8)
            | self.op.wire_code() as u64
    }
}

/// A meta word ([`SlotCall::meta`]) in words, for mismatch reports.
pub fn describe_meta(meta: u64) -> String {
    let kind = CollKind::ALL
        .get(((meta >> 16) & 0xf) as usize)
        .map_or("?", |k| k.snake_name());
    let dtype = DataType::ALL
        .iter()
        .find(|d| **d as i32 as u64 == (meta >> 8) & 0xff)
        .map_or("?", |d| d.name());
    format!(
        "{kind} (count {}, {dtype}, op {}, root {})",
        meta >> 40,
        meta & 0xff,
        (meta >> 20) & 0xf_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(kind: CollKind, count: usize, dtype: DataType, root: usize) -> SlotCall {
        SlotCall {
            kind,
            count,
            dtype,
            op: RedOp::Sum,
            root,
        }
    }

    #[test]
    fn which_calls_fit() {
        let f32 = DataType::Float32;
        // A slot of 4 KiB bounds what is posted; 3 ranks read twice that.
        for kind in [
            CollKind::AllReduce,
            CollKind::Reduce,
            CollKind::Broadcast,
            CollKind::AllGather,
        ] {
            assert!(call(kind, 1024, f32, 0).fits(3, 4096), "{kind:?}");
            assert!(!call(kind, 1025, f32, 0).fits(3, 4096), "{kind:?}");
            assert!(!call(kind, 0, f32, 0).fits(3, 4096), "{kind:?}: count 0");
        }
        // A reduce-scatter posts every rank's block.
        assert!(call(CollKind::ReduceScatter, 341, f32, 0).fits(3, 4096));
        assert!(!call(CollKind::ReduceScatter, 342, f32, 0).fits(3, 4096));
        // A root out of range is the usual path's error to report.
        assert!(!call(CollKind::Broadcast, 1, f32, 3).fits(3, 4096));
        assert!(call(CollKind::AllReduce, 1, f32, 3).fits(3, 4096));
        for kind in [
            CollKind::Send,
            CollKind::Recv,
            CollKind::AllToAll,
            CollKind::Gather,
            CollKind::Scatter,
        ] {
            assert!(!call(kind, 1, f32, 0).fits(3, 4096), "{kind:?}");
        }
        assert!(!call(CollKind::AllReduce, usize::MAX, f32, 0).fits(2, 4096));
        assert!(!call(CollKind::ReduceScatter, usize::MAX / 4, f32, 0).fits(2, 1 << 20));
    }

    #[test]
    fn the_read_budget_bounds_what_a_rank_reads() {
        let f32 = DataType::Float32;
        let slot = 64 * 1024;
        let ar = call(CollKind::AllReduce, 0, f32, 0);
        // 2 ranks read one peer's input: the whole slot.
        assert_eq!(ar.largest_fitting_count(2, slot), slot / 4);
        // 4 ranks read three: a third of the budget each.
        assert_eq!(ar.largest_fitting_count(4, slot), READ_BUDGET / 3 / 4);
        // 8 ranks gather seven blocks.
        let ag = call(CollKind::AllGather, 0, f32, 0);
        assert_eq!(ag.largest_fitting_count(8, slot), READ_BUDGET / 7 / 4);
        // A reduce-scatter reads one block of each peer but posts them all:
        // the slot bounds it.
        let rs = call(CollKind::ReduceScatter, 0, f32, 0);
        assert_eq!(rs.largest_fitting_count(4, slot), slot / 4 / 4);
        // A broadcast's receivers read the root's input only.
        let bc = call(CollKind::Broadcast, 0, f32, 7);
        assert_eq!(bc.largest_fitting_count(8, slot), slot / 4);
        // A single rank reads nothing; the slot still bounds it.
        assert_eq!(ar.largest_fitting_count(1, slot), slot / 4);
        assert_eq!(
            call(CollKind::Send, 0, f32, 0).largest_fitting_count(2, slot),
            0
        );
        // Every count up to the largest fits, the next does not.
        for n in 1..=8 {
            for kind in [
                CollKind::AllReduce,
                CollKind::Reduce,
                CollKind::Broadcast,
                CollKind::AllGather,
                CollKind::ReduceScatter,
            ] {
                for dtype in DataType::ALL {
                    let c = call(kind, 0, dtype, 0);
                    let m = c.largest_fitting_count(n, slot);
                    assert!(m > 0, "{kind:?} {dtype:?} {n}");
                    for count in [1, m / 2 + 1, m] {
                        assert!(SlotCall { count, ..c }.fits(n, slot), "{kind:?} {count}");
                    }
                    assert!(
                        !SlotCall { count: m + 1, ..c }.fits(n, slot),
                        "{kind:?} {m}"
                    );
                }
            }
        }
    }

    #[test]
    fn posted_and_output_bytes() {
        let f64 = DataType::Float64;
        let bc = call(CollKind::Broadcast, 5, f64, 1);
        assert_eq!((bc.posted_bytes(1, 3), bc.posted_bytes(0, 3)), (40, 0));
        assert_eq!((bc.output_bytes(0, 3), bc.output_bytes(1, 3)), (40, 40));
        let red = call(CollKind::Reduce, 5, f64, 2);
        assert_eq!((red.output_bytes(2, 3), red.output_bytes(0, 3)), (40, 0));
        let ag = call(CollKind::AllGather, 5, f64, 0);
        assert_eq!((ag.posted_bytes(0, 3), ag.output_bytes(0, 3)), (40, 120));
        let rs = call(CollKind::ReduceScatter, 5, f64, 0);
        assert_eq!((rs.posted_bytes(0, 3), rs.output_bytes(0, 3)), (120, 40));
        assert!(rs.reduces() && red.reduces() && !ag.reduces() && !bc.reduces());
    }

    #[test]
    fn calls_that_differ_have_different_words() {
        let base = call(CollKind::AllReduce, 7, DataType::Int32, 0);
        let others = [
            SlotCall { count: 8, ..base },
            SlotCall {
                dtype: DataType::Uint32,
                ..base
            },
            SlotCall {
                op: RedOp::Max,
                ..base
            },
            SlotCall {
                kind: CollKind::Reduce,
                ..base
            },
            call(CollKind::Broadcast, 7, DataType::Int32, 1),
            call(CollKind::Broadcast, 7, DataType::Int32, 2),
        ];
        let mut words: Vec<u64> = others.iter().map(SlotCall::meta).collect();
        words.push(base.meta());
        let n = words.len();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), n);
        // The root of an all-reduce is not part of the call.
        assert_eq!(SlotCall { root: 5, ..base }.meta(), base.meta());
        assert_eq!(
            describe_meta(call(CollKind::Broadcast, 7, DataType::Int32, 2).meta()),
            "broadcast (count 7, int32, op 0, root 2)"
        );
    }
}
