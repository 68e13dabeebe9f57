//! Copy-engine transfers for two GPUs in one process: which copies a pair of
//! matching calls makes, decided here without touching a GPU.
//!
//! Why: on 2×H200 (scripts/ce-probe.sh, docs/performance-gpu.md "Copy
//! engines") one `cuMemcpyAsync` from the peer's memory moves 389 GB/s each
//! way while both GPUs copy at once, against 348 GB/s for 32 SMs writing (333
//! for 32 SMs reading, what the copy kernel does), and it takes no SM from
//! the caller's kernels. It costs a fixed ~35 µs a call (two barrier
//! launches, the copy engine's start after a kernel, the join), so it is
//! taken from [`DEFAULT_MIN`] bytes per transfer.
//!
//! The copy engine needs both ranks' pointers when the copy is queued, and
//! each rank's launch knows only its own (the kernels trade them on the GPU,
//! through the mailbox). So a pair qualifies only when the host sees both
//! ranks' calls at once: one thread's group holding both ranks, as
//! nccl-tests `-g 2` and `ncclCommInitAll` programs make them. Every other
//! call keeps the copy kernel.
//!
//! Each rank's stream then runs: a barrier (the copy kernel with nothing to
//! copy: the peer's stream reached the same call, so its input is written
//! and its output free), the copies (pulls from the peer's buffers on this
//! stream, local copies on a side stream in parallel), a second barrier (the
//! peer finished reading this rank's input before the caller may change it).

/// The default bound ([`super::config::DEFAULT_CE_MIN`] says why).
pub use super::config::DEFAULT_CE_MIN as DEFAULT_MIN;

/// One copy: `bytes` from `src` to `dst` (device addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Xfer {
    /// Destination.
    pub dst: u64,
    /// Source.
    pub src: u64,
    /// Bytes.
    pub bytes: u64,
}

/// One rank's copies for one paired call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Both ends on this rank's GPU.
    pub local: Vec<Xfer>,
    /// One end on the peer's GPU: pulls by this rank's stream (a
    /// two-process all-gather pushes instead: [`super::two_process::plan`]).
    pub remote: Vec<Xfer>,
}

impl Plan {
    fn push_local(&mut self, dst: u64, src: u64, bytes: u64) {
        if bytes > 0 && dst != src {
            self.local.push(Xfer { dst, src, bytes });
        }
    }
    fn push_remote(&mut self, dst: u64, src: u64, bytes: u64) {
        if bytes > 0 {
            self.remote.push(Xfer { dst, src, bytes });
        }
    }
    /// The largest pull.
    pub fn largest_remote(&self) -> u64 {
        self.remote.iter().map(|x| x.bytes).max().unwrap_or(0)
    }
}

/// A copying collective as one rank called it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copying {
    /// All-gather of `bytes` per rank.
    AllGather {
        /// Send buffer.
        input: u64,
        /// Receive buffer (2 × bytes).
        output: u64,
        /// Bytes per rank.
        bytes: u64,
    },
    /// Broadcast of `bytes` from `root`.
    Broadcast {
        /// Send buffer (read on the root only).
        input: u64,
        /// Receive buffer.
        output: u64,
        /// Bytes.
        bytes: u64,
        /// The root rank.
        root: u32,
    },
}

/// The copies of a collective both ranks called (`ops[r]`: rank r's call),
/// or `None` when the two calls do not match (then the copy kernel runs
/// them as before and reports what it reports).
pub fn pair_collective(ops: [Copying; 2]) -> Option<[Plan; 2]> {
    let mut plans = [Plan::default(), Plan::default()];
    match ops {
        [Copying::AllGather {
            input: i0,
            output: o0,
            bytes: b0,
        }, Copying::AllGather {
            input: i1,
            output: o1,
            bytes: b1,
        }] if b0 == b1 => {
            let (inp, out) = ([i0, i1], [o0, o1]);
            for r in 0..2 {
                let q = 1 - r;
                plans[r].push_local(out[r] + r as u64 * b0, inp[r], b0);
                plans[r].push_remote(out[r] + q as u64 * b0, inp[q], b0);
            }
        }
        [Copying::Broadcast {
            input: i0,
            output: o0,
            bytes: b0,
            root: r0,
        }, Copying::Broadcast {
            input: i1,
            output: o1,
            bytes: b1,
            root: r1,
        }] if b0 == b1 && r0 == r1 && r0 < 2 => {
            let (inp, out, root) = ([i0, i1], [o0, o1], r0 as usize);
            plans[root].push_local(out[root], inp[root], b0);
            plans[1 - root].push_remote(out[1 - root], inp[root], b0);
        }
        _ => return None,
    }
    Some(plans)
}

/// One rank's merged sends and receives of a group: `(peer, pointer, bytes)`.
#[derive(Debug, Clone, Copy)]
pub struct P2pSide<'a> {
    /// Sends in call order.
    pub sends: &'a [(usize, u64, usize)],
    /// Receives in call order.
    pub recvs: &'a [(usize, u64, usize)],
}

/// The copies of both ranks' sends and receives (`sides[r]`: rank r's):
/// the i-th receive of r from its peer pulls the peer's i-th send to r, the
/// i-th send to itself fills the i-th receive from itself. `None` when they
/// do not match one for one with equal sizes (the copy kernel's path then
/// reports or tolerates it as before).
pub fn pair_p2p(sides: [P2pSide<'_>; 2]) -> Option<[Plan; 2]> {
    let mut plans = [Plan::default(), Plan::default()];
    let pick = |v: &[(usize, u64, usize)], peer: usize| -> Vec<(u64, u64)> {
        v.iter()
            .filter(|x| x.0 == peer)
            .map(|x| (x.1, x.2 as u64))
            .collect()
    };
    for r in 0..2 {
        let q = 1 - r;
        let (s, side) = (&sides[r], &sides[q]);
        if s.sends.iter().chain(s.recvs.iter()).any(|x| x.0 > 1) {
            return None;
        }
        let (self_sends, self_recvs) = (pick(s.sends, r), pick(s.recvs, r));
        if self_sends.len() != self_recvs.len() {
            return None;
        }
        for ((src, sb), (dst, rb)) in self_sends.into_iter().zip(self_recvs) {
            if sb != rb {
                return None;
            }
            plans[r].push_local(dst, src, rb);
        }
        let (theirs, mine) = (pick(side.sends, r), pick(s.recvs, q));
        if theirs.len() != mine.len() {
            return None;
        }
        for ((src, sb), (dst, rb)) in theirs.into_iter().zip(mine) {
            if sb != rb {
                return None;
            }
            plans[r].push_remote(dst, src, rb);
        }
    }
    Some(plans)
}

/// Which launches of a group meet: `cands[i]` is `Some((communicator,
/// rank))` for a launch that may take the copy engines, `None` for one that
/// cannot. Rank 0's k-th candidate of a communicator meets rank 1's k-th
/// (each rank's calls in the order it made them, the order their kernels
/// would have met in); a communicator whose two ranks have different
/// numbers of candidates pairs none. Returns (rank 0's index, rank 1's).
pub fn match_pairs<K: PartialEq + Copy>(cands: &[Option<(K, usize)>]) -> Vec<(usize, usize)> {
    let mut keys: Vec<K> = Vec::new();
    for (k, _) in cands.iter().flatten() {
        if !keys.contains(k) {
            keys.push(*k);
        }
    }
    let mut pairs = Vec::new();
    for key in keys {
        let of = |rank: usize| -> Vec<usize> {
            (0..cands.len())
                .filter(|&i| cands[i].is_some_and(|(k, r)| k == key && r == rank))
                .collect()
        };
        let (a, b) = (of(0), of(1));
        if a.len() == b.len() {
            pairs.extend(a.into_iter().zip(b));
        }
    }
    pairs
}

/// Whether a pair of plans goes to the copy engines: some pull of at least
/// `min` bytes when both ranks pull, of at least 2 × `min` when one does
/// (`min` 0: never; see [`DEFAULT_MIN`]).
pub fn worth_it(plans: &[Plan; 2], min: u64) -> bool {
    let largest = plans.iter().map(Plan::largest_remote).max().unwrap_or(0);
    let both_ways = plans.iter().all(|p| !p.remote.is_empty());
    let need = if both_ways {
        min
    } else {
        min.saturating_mul(2)
    };
    min > 0 && largest > 0 && largest >= need
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(dst: u64, src: u64, bytes: u64) -> Xfer {
        Xfer { dst, src, bytes }
    }

    #[test]
    fn all_gather_pulls_the_peer_block_and_copies_its_own() {
        let ops = [
            Copying::AllGather {
                input: 0x1000,
                output: 0x9000,
                bytes: 100,
            },
            Copying::AllGather {
                input: 0x2000,
                output: 0xa000,
                bytes: 100,
            },
        ];
        let [p0, p1] = pair_collective(ops).unwrap();
        assert_eq!(p0.local, vec![x(0x9000, 0x1000, 100)]);
        assert_eq!(p0.remote, vec![x(0x9000 + 100, 0x2000, 100)]);
        assert_eq!(p1.local, vec![x(0xa000 + 100, 0x2000, 100)]);
        assert_eq!(p1.remote, vec![x(0xa000, 0x1000, 100)]);
        // In place (the input is the rank's block of the output): no local copy.
        let ops = [
            Copying::AllGather {
                input: 0x9000,
                output: 0x9000,
                bytes: 8,
            },
            Copying::AllGather {
                input: 0xa008,
                output: 0xa000,
                bytes: 8,
            },
        ];
        let [p0, p1] = pair_collective(ops).unwrap();
        assert!(p0.local.is_empty() && p1.local.is_empty());
        assert_eq!(p1.remote, vec![x(0xa000, 0x9000, 8)]);
        // Mismatched sizes: not paired.
        let mut bad = ops;
        bad[1] = Copying::AllGather {
            input: 0xa008,
            output: 0xa000,
            bytes: 16,
        };
        assert!(pair_collective(bad).is_none());
    }

    #[test]
    fn broadcast_pulls_from_the_root_only() {
        let b = |input, output, root| Copying::Broadcast {
            input,
            output,
            bytes: 64,
            root,
        };
        let [p0, p1] = pair_collective([b(0x10, 0x20, 1), b(0x30, 0x40, 1)]).unwrap();
        assert_eq!(p0.remote, vec![x(0x20, 0x30, 64)]);
        assert!(p0.local.is_empty());
        assert_eq!(p1.local, vec![x(0x40, 0x30, 64)]);
        assert!(p1.remote.is_empty());
        // The root in place copies nothing.
        let [_, p1] = pair_collective([b(0x10, 0x20, 1), b(0x40, 0x40, 1)]).unwrap();
        assert!(p1.local.is_empty());
        assert!(pair_collective([b(0x10, 0x20, 0), b(0x30, 0x40, 1)]).is_none());
        assert!(pair_collective([b(0x10, 0x20, 2), b(0x30, 0x40, 2)]).is_none());
        let ag = Copying::AllGather {
            input: 0,
            output: 0,
            bytes: 64,
        };
        assert!(pair_collective([b(0x10, 0x20, 0), ag]).is_none());
    }

    #[test]
    fn sends_meet_receives_in_order_and_self_copies_stay_local() {
        // An all-to-all of 3 blocks... of two ranks: each sends block p to p.
        let s0 = [(0usize, 0x100u64, 8usize), (1, 0x108, 8)];
        let r0 = [(0usize, 0x200u64, 8usize), (1, 0x208, 8)];
        let s1 = [(0usize, 0x300u64, 8usize), (1, 0x308, 8)];
        let r1 = [(0usize, 0x400u64, 8usize), (1, 0x408, 8)];
        let [p0, p1] = pair_p2p([
            P2pSide {
                sends: &s0,
                recvs: &r0,
            },
            P2pSide {
                sends: &s1,
                recvs: &r1,
            },
        ])
        .unwrap();
        assert_eq!(p0.local, vec![x(0x200, 0x100, 8)]);
        assert_eq!(p0.remote, vec![x(0x208, 0x300, 8)]);
        assert_eq!(p1.local, vec![x(0x408, 0x308, 8)]);
        assert_eq!(p1.remote, vec![x(0x400, 0x108, 8)]);
        // Two sends from 0 to 1 meet 1's two receives in order; 1 sends nothing.
        let s0 = [(1usize, 0x100u64, 4usize), (1, 0x500, 12)];
        let r1 = [(0usize, 0x400u64, 4usize), (0, 0x600, 12)];
        let [p0, p1] = pair_p2p([
            P2pSide {
                sends: &s0,
                recvs: &[],
            },
            P2pSide {
                sends: &[],
                recvs: &r1,
            },
        ])
        .unwrap();
        assert_eq!(p0, Plan::default());
        assert_eq!(p1.remote, vec![x(0x400, 0x100, 4), x(0x600, 0x500, 12)]);
        // A size mismatch, a missing receive, a third rank: not paired.
        let r1bad = [(0usize, 0x400u64, 4usize), (0, 0x600, 16)];
        let side = |s, r| P2pSide { sends: s, recvs: r };
        assert!(pair_p2p([side(&s0, &[]), side(&[], &r1bad)]).is_none());
        assert!(pair_p2p([side(&s0, &[]), side(&[], &r1[..1])]).is_none());
        let third = [(2usize, 0x1u64, 4usize)];
        assert!(pair_p2p([side(&third, &[]), side(&[], &[])]).is_none());
        // Zero-byte transfers are nothing to copy.
        let z0 = [(1usize, 0x100u64, 0usize)];
        let z1 = [(0usize, 0x400u64, 0usize)];
        let [p0, p1] = pair_p2p([side(&z0, &[]), side(&[], &z1)]).unwrap();
        assert!(p0.remote.is_empty() && p1.remote.is_empty());
    }

    /// One rank's sends and receives of a group: `(peer, address, bytes)`.
    type Group = (Vec<(usize, u64, usize)>, Vec<(usize, u64, usize)>);

    /// One address space for both GPUs (unified addressing): a byte per
    /// address from 0. Runs both ranks' plans (locals and pulls are all
    /// copies in it), the copies of a plan in any order: they never overlap.
    struct Space(Vec<u8>);
    impl Space {
        fn fill(&mut self, at: u64, len: u64, seed: u8) {
            for i in 0..len {
                self.0[(at + i) as usize] = seed.wrapping_mul(31).wrapping_add(i as u8);
            }
        }
        fn get(&self, at: u64, len: u64) -> Vec<u8> {
            self.0[at as usize..(at + len) as usize].to_vec()
        }
        fn run(&mut self, plans: &[Plan; 2]) {
            for p in plans {
                for x in p.local.iter().chain(p.remote.iter()) {
                    let v = self.get(x.src, x.bytes);
                    self.0[x.dst as usize..(x.dst + x.bytes) as usize].copy_from_slice(&v);
                }
            }
        }
    }

    /// Every collective the pairing builds, against what NCCL defines, in a
    /// simulated address space: sizes 0..1000, both roots, in and out of
    /// place. Input of rank r at IN[r], output at OUT[r] (in place: inside
    /// the output where NCCL puts the rank's block).
    #[test]
    // Ranks index several parallel arrays (inputs, outputs, expectations).
    #[allow(clippy::needless_range_loop)]
    fn plans_compute_what_the_collectives_define() {
        const IN: [u64; 2] = [0, 10_000];
        const OUT: [u64; 2] = [20_000, 30_000];
        for b in [0u64, 1, 7, 64, 999] {
            for in_place in [false, true] {
                // All-gather: rank q's input lands in block q of every output.
                let mut m = Space(vec![0; 40_000]);
                let inp = |r: usize| {
                    if in_place {
                        OUT[r] + r as u64 * b
                    } else {
                        IN[r]
                    }
                };
                for r in 0..2 {
                    m.fill(inp(r), b, r as u8 + 1);
                }
                let want: Vec<Vec<u8>> = (0..2).map(|r| m.get(inp(r), b)).collect();
                let ops = [0, 1].map(|r| Copying::AllGather {
                    input: inp(r),
                    output: OUT[r],
                    bytes: b,
                });
                m.run(&pair_collective(ops).unwrap());
                for r in 0..2 {
                    for q in 0..2 {
                        assert_eq!(
                            m.get(OUT[r] + q as u64 * b, b),
                            want[q],
                            "ag b={b} r={r} q={q}"
                        );
                    }
                }
                // Broadcast from each root.
                for root in 0..2u32 {
                    let mut m = Space(vec![0; 40_000]);
                    let inp = |r: usize| if in_place { OUT[r] } else { IN[r] };
                    m.fill(inp(root as usize), b, 9);
                    let want = m.get(inp(root as usize), b);
                    let ops = [0, 1].map(|r| Copying::Broadcast {
                        input: inp(r),
                        output: OUT[r],
                        bytes: b,
                        root,
                    });
                    m.run(&pair_collective(ops).unwrap());
                    for r in 0..2 {
                        assert_eq!(m.get(OUT[r], b), want, "bcast b={b} root={root} r={r}");
                    }
                }
            }
            // All-to-all (as NCCL builds it from sends and receives: block q
            // of rank r's input to block r of rank q's output), gather to
            // each root and scatter from each root.
            let mut m = Space(vec![0; 40_000]);
            for r in 0..2 {
                m.fill(IN[r], 2 * b, 3 + r as u8);
            }
            let blk = |base: u64, q: usize| base + q as u64 * b;
            let a2a: Vec<Group> = (0..2)
                .map(|r| {
                    let s = (0..2).map(|q| (q, blk(IN[r], q), b as usize)).collect();
                    let v = (0..2).map(|q| (q, blk(OUT[r], q), b as usize)).collect();
                    (s, v)
                })
                .collect();
            let want: Vec<Vec<u8>> = (0..2)
                .map(|r| [m.get(blk(IN[0], r), b), m.get(blk(IN[1], r), b)].concat())
                .collect();
            let sides = [0, 1].map(|r| P2pSide {
                sends: &a2a[r].0,
                recvs: &a2a[r].1,
            });
            m.run(&pair_p2p(sides).unwrap());
            for r in 0..2 {
                assert_eq!(m.get(OUT[r], 2 * b), want[r], "a2a b={b} r={r}");
            }
            for root in 0..2 {
                let mut m = Space(vec![0; 40_000]);
                for r in 0..2 {
                    m.fill(IN[r], 2 * b, 5 + r as u8);
                }
                // Gather: every rank sends its input; the root receives block q from q.
                let g: Vec<Group> = (0..2)
                    .map(|r| {
                        let s = vec![(root, IN[r], b as usize)];
                        let v = if r == root {
                            (0..2).map(|q| (q, blk(OUT[r], q), b as usize)).collect()
                        } else {
                            vec![]
                        };
                        (s, v)
                    })
                    .collect();
                let want = [m.get(IN[0], b), m.get(IN[1], b)].concat();
                let sides = [0, 1].map(|r| P2pSide {
                    sends: &g[r].0,
                    recvs: &g[r].1,
                });
                m.run(&pair_p2p(sides).unwrap());
                assert_eq!(m.get(OUT[root], 2 * b), want, "gather b={b} root={root}");
                // Scatter: the root sends block q to q; every rank receives one.
                let sc: Vec<Group> = (0..2)
                    .map(|r| {
                        let s = if r == root {
                            (0..2).map(|q| (q, blk(IN[r], q), b as usize)).collect()
                        } else {
                            vec![]
                        };
                        (s, vec![(root, OUT[r], b as usize)])
                    })
                    .collect();
                let sides = [0, 1].map(|r| P2pSide {
                    sends: &sc[r].0,
                    recvs: &sc[r].1,
                });
                m.run(&pair_p2p(sides).unwrap());
                for r in 0..2 {
                    assert_eq!(
                        m.get(OUT[r], b),
                        m.get(blk(IN[root], r), b),
                        "scatter b={b} root={root} r={r}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_kth_candidates_of_each_communicator_meet() {
        // Communicators 'a' and 'b' interleaved, a non-candidate between.
        let c = [
            Some(('a', 0)),
            Some(('b', 0)),
            None,
            Some(('a', 1)),
            Some(('a', 0)),
            Some(('b', 1)),
            Some(('a', 1)),
        ];
        assert_eq!(match_pairs(&c), vec![(0, 3), (4, 6), (1, 5)]);
        // Rank 1 of 'a' has one candidate fewer: 'a' pairs none, 'b' still does.
        let c = [
            Some(('a', 0)),
            Some(('a', 0)),
            Some(('a', 1)),
            Some(('b', 1)),
            Some(('b', 0)),
        ];
        assert_eq!(match_pairs(&c), vec![(4, 3)]);
        // One rank alone in the group (threads per GPU): nothing.
        assert!(match_pairs(&[Some(('a', 0)), Some(('a', 0))]).is_empty());
        assert!(match_pairs::<char>(&[None, None]).is_empty());
    }

    #[test]
    fn the_largest_pull_decides() {
        let plan = |b| Plan {
            local: vec![x(0, 0, 1 << 30)],
            remote: vec![x(0, 0, b)],
        };
        // Both ways: from `min`; one way: from twice it.
        assert!(worth_it(&[plan(16 << 20), plan(1)], 16 << 20));
        assert!(!worth_it(&[plan((16 << 20) - 1), plan(1)], 16 << 20));
        assert!(!worth_it(&[plan(16 << 20), Plan::default()], 16 << 20));
        assert!(!worth_it(
            &[Plan::default(), plan((32 << 20) - 1)],
            16 << 20
        ));
        assert!(worth_it(&[Plan::default(), plan(32 << 20)], 16 << 20));
        assert!(worth_it(&[plan(1), plan(1)], 1));
        assert!(!worth_it(&[plan(1 << 30), plan(1 << 30)], 0));
        // Local copies alone never qualify.
        let local_only = Plan {
            local: vec![x(0, 0, 1 << 30)],
            remote: vec![],
        };
        assert!(!worth_it(&[local_only.clone(), local_only], 1));
    }
}
