//! Which GPU kernel runs a collective, as types: the collective, the
//! algorithm ([`Algo`]: ring, one-shot, two-shot) and the protocol
//! ([`Proto`]: Simple slots or LL lines) are separate axes, named as
//! `NCCL_ALGO` / `NCCL_PROTO` name them for the host path too;
//! [`RingKernel`] is one valid combination of the three for the ring program
//! (`kernels/ring.cu`), [`PairKernel`] one of the two-GPU kernels of one
//! process (`kernels/allreduce.cu`).
//!
//! The kernels take a plain integer `mode`; this module is the one place
//! where a typed choice becomes that integer ([`RingKernel::mode`],
//! [`PairKernel::mode`]) and where the table of what exists lives.

use std::fmt;

use crate::algo::{Algo, Choice, Proto};
use crate::types::CollKind;

/// A collective a GPU kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank ends with the reduction of every rank's buffer.
    AllReduce,
    /// Rank p ends with block p of the reduction.
    ReduceScatter,
    /// Every rank ends with every rank's block.
    AllGather,
    /// Every rank ends with the root's buffer.
    Broadcast,
    /// The root ends with the reduction of every rank's buffer.
    Reduce,
}

impl Collective {
    /// Every collective.
    pub const ALL: [Collective; 5] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
    ];

    /// NCCL's name for it (its TUNING log line).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "AllReduce",
            Collective::ReduceScatter => "ReduceScatter",
            Collective::AllGather => "AllGather",
            Collective::Broadcast => "Broadcast",
            Collective::Reduce => "Reduce",
        }
    }

    /// Whether it reduces (takes a reduction operator).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
        )
    }

    /// The same collective as the host path names it.
    pub fn kind(self) -> CollKind {
        match self {
            Collective::AllReduce => CollKind::AllReduce,
            Collective::ReduceScatter => CollKind::ReduceScatter,
            Collective::AllGather => CollKind::AllGather,
            Collective::Broadcast => CollKind::Broadcast,
            Collective::Reduce => CollKind::Reduce,
        }
    }

    /// Whether it has a root rank.
    pub fn rooted(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce)
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One kernel of the ring program (`kernels/ring.cu`): a collective, an
/// algorithm and a protocol that the program implements. Only the
/// combinations in [`RingKernel::ALL`] exist; build one with
/// [`RingKernel::new`], [`RingKernel::ring`] or [`RingKernel::from_mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RingKernel {
    collective: Collective,
    algorithm: Algo,
    protocol: Proto,
    mode: u32,
}

const fn rk(collective: Collective, algorithm: Algo, protocol: Proto, mode: u32) -> RingKernel {
    RingKernel {
        collective,
        algorithm,
        protocol,
        mode,
    }
}

impl RingKernel {
    /// Every kernel of the ring program, at the index of its `mode`
    /// (`RingArgs.mode` in ring.cu: keep the two in step).
    pub const ALL: [RingKernel; 16] = {
        use Algo::*;
        use Collective::*;
        use Proto::*;
        [
            rk(AllReduce, Ring, Simple, 0),
            rk(ReduceScatter, Ring, Simple, 1),
            rk(AllGather, Ring, Simple, 2),
            rk(Broadcast, Ring, Simple, 3),
            rk(Reduce, Ring, Simple, 4),
            rk(AllReduce, Ring, LL, 5),
            // Every rank's lines to every rank.
            rk(AllReduce, OneShot, LL, 6),
            // Across hosts (LL cannot cross the network proxies).
            rk(AllReduce, OneShot, Simple, 7),
            rk(AllGather, OneShot, LL, 8),
            // Block p of every rank to rank p.
            rk(ReduceScatter, OneShot, LL, 9),
            rk(Broadcast, OneShot, LL, 10),
            rk(Reduce, OneShot, LL, 11),
            // Block p of every rank to rank p, reduced there, sent to every rank.
            rk(AllReduce, TwoShot, LL, 12),
            // The direct kernels over Simple slots (3 to 8 ranks of a host).
            rk(AllGather, OneShot, Simple, 13),
            rk(ReduceScatter, OneShot, Simple, 14),
            rk(AllReduce, TwoShot, Simple, 15),
        ]
    };

    /// The kernel of (`collective`, `algorithm`, `protocol`), if the ring
    /// program has one.
    pub fn new(collective: Collective, algorithm: Algo, protocol: Proto) -> Option<RingKernel> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| (k.collective, k.algorithm, k.protocol) == (collective, algorithm, protocol))
    }

    /// The ring over Simple slots, which every collective has.
    pub const fn ring(collective: Collective) -> RingKernel {
        match collective {
            Collective::AllReduce => Self::ALL[0],
            Collective::ReduceScatter => Self::ALL[1],
            Collective::AllGather => Self::ALL[2],
            Collective::Broadcast => Self::ALL[3],
            Collective::Reduce => Self::ALL[4],
        }
    }

    /// The kernel the integer `mode` selects, if any.
    pub fn from_mode(mode: u32) -> Option<RingKernel> {
        Self::ALL.get(mode as usize).copied()
    }

    /// The integer the kernels take (`RingArgs.mode`, `OneLaunchArgs.mode`).
    pub const fn mode(self) -> u32 {
        self.mode
    }

    /// Its collective.
    pub const fn collective(self) -> Collective {
        self.collective
    }

    /// Its algorithm (ring, one-shot or two-shot).
    pub const fn algorithm(self) -> Algo {
        self.algorithm
    }

    /// Its protocol (Simple or LL).
    pub const fn protocol(self) -> Proto {
        self.protocol
    }

    /// Its algorithm and protocol as NCCL's TUNING log line names them
    /// (`oxccl_core::logfmt::tuning_line`).
    pub fn tuning_names(self) -> (&'static str, &'static str) {
        (self.algorithm.name(), self.protocol.name())
    }

    /// Whether it is a one-shot over LL lines (what the small kernel,
    /// `oxccl_small_*`, may run: [`crate::gpu::ring::small_kernel_fits`]).
    pub fn is_one_shot_ll(self) -> bool {
        self.algorithm == Algo::OneShot && self.protocol == Proto::LL
    }
}

impl fmt::Display for RingKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{}",
            self.collective,
            self.algorithm.name(),
            self.protocol.name()
        )
    }
}

/// One of the two-GPU kernels of one process (`kernels/allreduce.cu`):
/// `oxccl_ar_*` reduces, `oxccl_pcopy` copies and serves sends and
/// receives. Each is one synchronised pass over peer-mapped memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PairKernel {
    /// `oxccl_ar_*`: all-reduce.
    AllReduce,
    /// `oxccl_ar_*`: reduce-scatter.
    ReduceScatter,
    /// `oxccl_ar_*`: reduce to a root.
    Reduce,
    /// `oxccl_pcopy`: all-gather.
    AllGather,
    /// `oxccl_pcopy`: broadcast.
    Broadcast,
    /// `oxccl_pcopy`: sends and receives (each side pulls the peer's send
    /// buffer).
    SendRecv,
}

impl PairKernel {
    /// The pair kernel of a collective.
    pub fn of(c: Collective) -> PairKernel {
        match c {
            Collective::AllReduce => PairKernel::AllReduce,
            Collective::ReduceScatter => PairKernel::ReduceScatter,
            Collective::Reduce => PairKernel::Reduce,
            Collective::AllGather => PairKernel::AllGather,
            Collective::Broadcast => PairKernel::Broadcast,
        }
    }

    /// Whether it is the reducing kernel (`oxccl_ar_*`, `ArArgs`), else the
    /// copy kernel (`oxccl_pcopy`, `CpArgs`).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            PairKernel::AllReduce | PairKernel::ReduceScatter | PairKernel::Reduce
        )
    }

    /// The integer its kernel takes (`ArArgs.mode` or `CpArgs.mode` of
    /// allreduce.cu: keep the two in step).
    pub fn mode(self) -> u32 {
        match self {
            PairKernel::AllReduce => 0,
            PairKernel::ReduceScatter => 1,
            PairKernel::Reduce => 2,
            PairKernel::AllGather => 0,
            PairKernel::Broadcast => 1,
            PairKernel::SendRecv => 2,
        }
    }

    /// The copy kernel's collective for its `CpArgs.mode`, if any.
    pub fn from_copy_mode(mode: u32) -> Option<PairKernel> {
        [
            PairKernel::AllGather,
            PairKernel::Broadcast,
            PairKernel::SendRecv,
        ]
        .into_iter()
        .find(|k| k.mode() == mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ring_kernel_sits_at_its_mode_once() {
        for (i, k) in RingKernel::ALL.iter().enumerate() {
            assert_eq!(k.mode() as usize, i, "{k}");
            assert_eq!(RingKernel::from_mode(i as u32), Some(*k));
            assert_eq!(
                RingKernel::new(k.collective(), k.algorithm(), k.protocol()),
                Some(*k)
            );
            // No combination twice.
            let same = RingKernel::ALL
                .iter()
                .filter(|o| {
                    (o.collective(), o.algorithm(), o.protocol())
                        == (k.collective(), k.algorithm(), k.protocol())
                })
                .count();
            assert_eq!(same, 1, "{k}");
        }
        assert_eq!(RingKernel::from_mode(16), None);
        assert_eq!(RingKernel::from_mode(u32::MAX), None);
    }

    #[test]
    fn every_collective_has_its_simple_ring() {
        for c in Collective::ALL {
            let k = RingKernel::ring(c);
            assert_eq!(
                (k.collective(), k.algorithm(), k.protocol()),
                (c, Algo::Ring, Proto::Simple)
            );
            assert!(k.mode() < 5);
        }
        assert_eq!(RingKernel::ring(Collective::AllReduce).mode(), 0);
        assert_eq!(RingKernel::ring(Collective::Reduce).mode(), 4);
    }

    #[test]
    fn combinations_the_program_lacks_are_refused() {
        use Algo::*;
        use Collective::*;
        use Proto::*;
        assert_eq!(RingKernel::new(AllGather, TwoShot, LL), None);
        assert_eq!(RingKernel::new(Broadcast, OneShot, Simple), None);
        assert_eq!(RingKernel::new(Reduce, Ring, LL), None);
        // Of every collective x algorithm x protocol, 16 exist; no LL128, no tree.
        let mut n = 0;
        for c in Collective::ALL {
            for &a in Algo::ALL {
                for &p in Proto::ALL {
                    n += RingKernel::new(c, a, p).is_some() as usize;
                }
            }
        }
        assert_eq!(n, RingKernel::ALL.len());
    }

    #[test]
    fn names_and_one_shot_ll() {
        let k = RingKernel::new(Collective::Broadcast, Algo::OneShot, Proto::LL).unwrap();
        assert!(k.is_one_shot_ll());
        assert_eq!(k.to_string(), "Broadcast OneShot/LL");
        assert_eq!(k.tuning_names(), ("OneShot", "LL"));
        assert_eq!(
            RingKernel::ring(Collective::Reduce).tuning_names(),
            ("Ring", "Simple")
        );
        assert_eq!(Collective::ReduceScatter.kind(), CollKind::ReduceScatter);
        assert!(!RingKernel::ring(Collective::AllReduce).is_one_shot_ll());
        assert_eq!(
            RingKernel::ALL
                .iter()
                .filter(|k| k.is_one_shot_ll())
                .count(),
            5
        );
        assert!(Collective::Reduce.reduces() && Collective::Reduce.rooted());
        assert!(!Collective::AllGather.reduces() && !Collective::AllGather.rooted());
    }

    #[test]
    fn pair_kernel_modes() {
        let modes: Vec<_> = Collective::ALL
            .iter()
            .map(|&c| (PairKernel::of(c).reduces(), PairKernel::of(c).mode()))
            .collect();
        assert_eq!(
            modes,
            [(true, 0), (true, 1), (false, 0), (false, 1), (true, 2)]
        );
        assert_eq!(PairKernel::SendRecv.mode(), 2);
        for k in [
            PairKernel::AllGather,
            PairKernel::Broadcast,
            PairKernel::SendRecv,
        ] {
            assert_eq!(PairKernel::from_copy_mode(k.mode()), Some(k));
        }
        assert_eq!(PairKernel::from_copy_mode(3), None);
    }
}
