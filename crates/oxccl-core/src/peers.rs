//! Which peers a rank connects to when its communicator is created, and what
//! those connections cost: the pure half of the host communicator's
//! connection plan.
//!
//! A rank connects at creation only to the peers that the collectives with a
//! bounded fan-out talk to: its ring neighbours (ring all-reduce, all-gather,
//! reduce-scatter, the broadcast and reduce chains and the root check of
//! rooted collectives), its parent and children in both binary trees of the
//! double tree, and, while the communicator has at most
//! [`ONE_SHOT_MAX_RANKS`] ranks, every peer (one-shot all-reduce). That is at
//! most 8 peers whatever the rank count ([`MAX_INIT_PEERS`]). Peers of
//! all-to-all, gather, scatter and send/receive are connected by the
//! executor on first use.

use crate::schedule::tree_links;

/// One-shot all-reduce sends every rank's input to every peer: it is planned
/// only up to this many ranks, so the peers it needs stay bounded. (With the
/// host link model the tuner already prefers the tree from 9 ranks on for
/// small messages: 9 hops of one-shot against 3 + 2·(⌈log2 10⌉ - 1) = 9 of
/// the tree, which wins on bandwidth.)
pub const ONE_SHOT_MAX_RANKS: usize = 8;

/// The most peers [`init_peers`] returns for any rank count: 2 ring
/// neighbours and a parent and 2 children in each of 2 trees, or every peer
/// of a communicator of [`ONE_SHOT_MAX_RANKS`] ranks.
pub const MAX_INIT_PEERS: usize = 8;

/// The peers rank `rank` of `nranks` connects to at creation, ascending,
/// without itself. Symmetric: `q` is in `init_peers(r, n)` exactly when `r`
/// is in `init_peers(q, n)`, so both ends of a pair decide alike without
/// talking.
pub fn init_peers(rank: usize, nranks: usize) -> Vec<usize> {
    let n = nranks;
    if rank >= n {
        return Vec::new();
    }
    let mut v: Vec<usize> = if n <= ONE_SHOT_MAX_RANKS {
        (0..n).collect()
    } else {
        let mut v = vec![(rank + 1) % n, (rank + n - 1) % n];
        let forward: Vec<usize> = (0..n).collect();
        let mirrored: Vec<usize> = (0..n).rev().collect();
        for order in [&forward, &mirrored] {
            let (parent, children) = tree_links(order, rank);
            v.extend(parent);
            v.extend(children);
        }
        v
    };
    v.retain(|&q| q != rank);
    v.sort_unstable();
    v.dedup();
    v
}

/// What one rank's connections made at creation hold, for the docs' cost
/// formula and its test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitCost {
    /// Peers connected at creation.
    pub peers: usize,
    /// Rings this rank receives on (one per channel per peer); as many
    /// again are its sends, held by its peers.
    pub rings: usize,
    /// Bytes of those receive rings: `peers · channels · capacity`.
    pub ring_bytes: usize,
}

/// The cost of rank `rank`'s connections at creation with `channels` streams
/// per peer (collective plus point-to-point) of `capacity` bytes each.
pub fn init_cost(rank: usize, nranks: usize, channels: usize, capacity: usize) -> InitCost {
    let peers = init_peers(rank, nranks).len();
    InitCost {
        peers,
        rings: peers * channels,
        ring_bytes: peers * channels * capacity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{build, Request, Shape, Shaped};
    use crate::types::CollKind;

    #[test]
    fn init_peers_are_symmetric_and_bounded() {
        for n in (1..=40).chain([63, 64, 65, 127, 128, 1000, 1024]) {
            let all: Vec<Vec<usize>> = (0..n).map(|r| init_peers(r, n)).collect();
            for (r, ps) in all.iter().enumerate() {
                assert!(ps.len() <= MAX_INIT_PEERS, "n {n} rank {r}: {ps:?}");
                assert!(!ps.contains(&r));
                assert!(ps.windows(2).all(|w| w[0] < w[1]));
                for &q in ps {
                    assert!(all[q].contains(&r), "n {n}: {r} -> {q} but not back");
                }
            }
            if n <= ONE_SHOT_MAX_RANKS {
                assert!(all.iter().all(|p| p.len() == n - 1), "n {n}");
            }
        }
        assert!(init_peers(5, 4).is_empty());
    }

    #[test]
    fn every_bounded_collective_talks_only_to_init_peers() {
        let shape = Shape {
            nchannels: 2,
            slice: 64,
            elem: 4,
        };
        for n in [2usize, 3, 5, 8, 9, 16, 33, 100] {
            for r in 0..n {
                let peers = init_peers(r, n);
                let mut cases = vec![
                    (CollKind::AllReduce, Shaped::Ring, 0),
                    (CollKind::AllReduce, Shaped::Tree, 0),
                    (CollKind::AllGather, Shaped::Ring, 0),
                    (CollKind::ReduceScatter, Shaped::Ring, 0),
                ];
                if n <= ONE_SHOT_MAX_RANKS {
                    cases.push((CollKind::AllReduce, Shaped::OneShot, 0));
                }
                for root in [0, n / 2, n - 1] {
                    cases.push((CollKind::Broadcast, Shaped::Ring, root));
                    cases.push((CollKind::Reduce, Shaped::Ring, root));
                }
                for (kind, algo, root) in cases {
                    for count in [0usize, 1, 7, 1000] {
                        let req = Request {
                            kind,
                            count,
                            root,
                            rank: r,
                            nranks: n,
                            in_place: false,
                        };
                        let p = build(&req, algo, &shape);
                        let (tx, rx) = p.streams();
                        for (q, _) in tx.into_iter().chain(rx) {
                            assert!(
                                peers.contains(&q),
                                "{kind:?} {algo:?} n {n} rank {r} root {root} count {count} uses {q}, not in {peers:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn init_cost_does_not_grow_with_ranks() {
        // 3 channels of 1 MiB (the host defaults): at most 8 peers, 24 MiB of
        // receive rings, from 9 ranks to 8,192 (1,024 nodes x 8 GPUs).
        let mut worst = 0;
        for n in [9usize, 64, 1024, 8192] {
            for r in [0, 1, n / 2, n - 2, n - 1] {
                let c = init_cost(r, n, 3, 1 << 20);
                assert_eq!(c.rings, c.peers * 3);
                assert!(c.ring_bytes <= (MAX_INIT_PEERS * 3) << 20, "{c:?}");
                worst = worst.max(c.peers);
            }
        }
        assert!((4..=MAX_INIT_PEERS).contains(&worst), "{worst}");
    }
}
