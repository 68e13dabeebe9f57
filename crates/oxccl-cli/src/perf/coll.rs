//! The collectives `oxccl perf` measures: buffer extents, bytes and bus-bandwidth
//! factors as nccl-tests defines them (so tables compare line by line).

use oxccl::CollKind;

/// A collective under test. `SendRecv` is nccl-tests' ring exchange: every
/// rank sends to `rank + 1` and receives from `rank - 1`, in one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    AllGather,
    Broadcast,
    Reduce,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    SendRecv,
}

/// Element counts of one call: what each rank sends, receives, and the
/// `count` argument of the call (nccl-tests' "count" column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub send: usize,
    pub recv: usize,
    pub param: usize,
}

impl Coll {
    pub const ALL: [Coll; 9] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::ReduceScatter,
        Coll::AllToAll,
        Coll::Gather,
        Coll::Scatter,
        Coll::SendRecv,
    ];

    /// The name used on the command line and in output.
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllToAll => "alltoall",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::SendRecv => "sendrecv",
        }
    }

    /// Accepts oxccl's names, nccl-tests' binary names (`all_reduce_perf`) and
    /// the names without separators (`allreduce`), in any case.
    pub fn parse(s: &str) -> Option<Coll> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.strip_suffix("_perf").unwrap_or(&t);
        let k: String = t.chars().filter(|c| *c != '_' && *c != '-').collect();
        Some(match k.as_str() {
            "allreduce" => Coll::AllReduce,
            "allgather" => Coll::AllGather,
            "broadcast" | "bcast" => Coll::Broadcast,
            "reduce" => Coll::Reduce,
            "reducescatter" => Coll::ReduceScatter,
            "alltoall" | "all2all" => Coll::AllToAll,
            "gather" => Coll::Gather,
            "scatter" => Coll::Scatter,
            "sendrecv" => Coll::SendRecv,
            _ => return None,
        })
    }

    /// Whether the collective takes a reduction op (otherwise the redop column says `none`).
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
    }

    /// Whether the collective has a root (otherwise the root column says -1).
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        )
    }

    /// Whether oxccl has an in-place form. All-to-all has none (NCCL leaves it
    /// undefined) and a send and a receive of one buffer in one group overlap,
    /// which oxccl rejects; their in-place columns print N/A.
    pub fn has_in_place(self) -> bool {
        !matches!(self, Coll::AllToAll | Coll::SendRecv)
    }

    /// Whether `-m` operations go into one group (otherwise they run one after another).
    pub fn groups_agg(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::SendRecv)
    }

    /// Ranks started when `--ranks` is not given.
    pub fn default_ranks(self) -> usize {
        if self == Coll::SendRecv {
            2
        } else {
            4
        }
    }

    /// The library's kind (the first of the pair for send/receive).
    pub fn kind(self) -> CollKind {
        match self {
            Coll::AllReduce => CollKind::AllReduce,
            Coll::AllGather => CollKind::AllGather,
            Coll::Broadcast => CollKind::Broadcast,
            Coll::Reduce => CollKind::Reduce,
            Coll::ReduceScatter => CollKind::ReduceScatter,
            Coll::AllToAll => CollKind::AllToAll,
            Coll::Gather => CollKind::Gather,
            Coll::Scatter => CollKind::Scatter,
            Coll::SendRecv => CollKind::Send,
        }
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        oxccl_core::tuner::bus_factor(self.kind(), n)
    }

    /// Counts for a nominal size of `bytes` (nccl-tests' `getCollByteCount`):
    /// collectives with per-rank blocks round the block down so its byte size
    /// is a multiple of 16.
    pub fn counts(self, bytes: u64, esize: usize, n: usize) -> Counts {
        let count = (bytes / esize as u64) as usize;
        let base = (count / n) & !(16 / esize - 1);
        match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => Counts {
                send: count,
                recv: count,
                param: count,
            },
            Coll::AllGather | Coll::Gather => Counts {
                send: base,
                recv: base * n,
                param: base,
            },
            Coll::ReduceScatter | Coll::Scatter => Counts {
                send: base * n,
                recv: base,
                param: base,
            },
            Coll::AllToAll => Counts {
                send: base * n,
                recv: base * n,
                param: base,
            },
        }
    }

    /// The bytes algbw divides by the time (nccl-tests' `*GetBw`).
    pub fn alg_bytes(self, param: usize, esize: usize, n: usize) -> f64 {
        let b = (param * esize) as f64;
        match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => b,
            _ => b * n as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_aliases() {
        for c in Coll::ALL {
            assert_eq!(Coll::parse(c.name()), Some(c));
            assert_eq!(Coll::parse(&format!("{}_perf", c.name())), Some(c));
        }
        assert_eq!(Coll::parse("allreduce"), Some(Coll::AllReduce));
        assert_eq!(Coll::parse("All-Gather"), Some(Coll::AllGather));
        assert_eq!(Coll::parse("alltoall_perf"), Some(Coll::AllToAll));
        assert_eq!(Coll::parse("allreduce2"), None);
    }

    #[test]
    fn counts_follow_nccl_tests() {
        // all_gather of 1 KiB floats on 3 ranks: 256 / 3 = 85, rounded down to 84 (16 B).
        let c = Coll::AllGather.counts(1024, 4, 3);
        assert_eq!(
            c,
            Counts {
                send: 84,
                recv: 252,
                param: 84
            }
        );
        let c = Coll::ReduceScatter.counts(1024, 1, 3);
        assert_eq!(c.param, 336);
        assert_eq!(c.send, 1008);
        let c = Coll::AllReduce.counts(8, 4, 4);
        assert_eq!(c.param, 2);
        assert_eq!(Coll::AllToAll.counts(64, 8, 4).param, 2);
        assert!((Coll::AllReduce.bus_factor(4) - 1.5).abs() < 1e-12);
        assert!((Coll::AllGather.bus_factor(4) - 0.75).abs() < 1e-12);
        assert_eq!(Coll::SendRecv.bus_factor(2), 1.0);
    }
}
