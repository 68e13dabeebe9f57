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

/// A job's layout for the scale model: `nodes` hosts of `ranks_per_node`
/// ranks each, numbered host by host (as launchers number them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Hosts.
    pub nodes: usize,
    /// Ranks on each host (GPUs per node).
    pub ranks_per_node: usize,
}

impl Layout {
    /// Ranks in all.
    pub fn nranks(&self) -> usize {
        self.nodes * self.ranks_per_node
    }

    /// The host of `rank`.
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node.max(1)
    }
}

/// Bytes of one rank's entry in the bootstrap's rank table, less its host
/// name: rank (4), host-name length (2), host hash (8), pid (4), process
/// token (8), two socket addresses (23 each).
pub const TABLE_ENTRY_BYTES: usize = 72;

/// Bytes of rank tables the bootstrap's root sends at most (one table when
/// a single table is larger). 128 MiB: every rank of a job up to 1,023
/// ranks (88-byte entries) gets its table from the root, as before the
/// tree, because on one host each level of the tree costs thread wake-ups:
/// 1,024 ranks as threads on 2 vCPUs took 5.0–5.4 s to the first
/// all-reduce with an 8 MiB budget (63 ranks served by the root) against
/// 3.9–4.1 s with every table from the root. At 8,192 ranks the root sends
/// 127 tables (92 MB) where every rank's was 5.9 GB.
pub const ROOT_TABLE_BUDGET: usize = 128 << 20;

/// How many ranks get the bootstrap's rank table (`table_len` bytes) from
/// the root itself: ranks `0..k`, the top levels of the binary tree rooted
/// at rank 0 (`k = 2^m - 1`) whose tables fit in [`ROOT_TABLE_BUDGET`], at
/// least 1 and at most `nranks`. Every other rank gets the table from its
/// parent in that tree. 1,000 ranks with 16-byte host names: all of them;
/// 1,024: 1,023; 8,192: 127.
pub fn table_direct_ranks(nranks: usize, table_len: usize) -> usize {
    table_direct_ranks_within(nranks, table_len, ROOT_TABLE_BUDGET)
}

/// [`table_direct_ranks`] with a budget of `budget` bytes of tables.
pub fn table_direct_ranks_within(nranks: usize, table_len: usize, budget: usize) -> usize {
    let fit = (budget / table_len.max(1)).max(1);
    // floor(log2(fit + 1)) levels.
    let levels = usize::BITS - (fit + 1).leading_zeros() - 1;
    ((1usize << levels) - 1).clamp(1, nranks.max(1))
}

/// Where rank `rank` of `nranks` gets the table when the root sends it to
/// `direct` ranks ([`table_direct_ranks`]): `None` from the root, `Some(p)`
/// from its parent `p` in the binary tree rooted at rank 0.
pub fn table_parent(rank: usize, nranks: usize, direct: usize) -> Option<usize> {
    (rank >= direct && rank < nranks && rank > 0).then(|| (rank - 1) / 2)
}

/// The ranks that rank `rank` of `nranks` forwards the table to: its
/// children in the binary tree rooted at rank 0 that do not have it from
/// the root.
pub fn table_children(rank: usize, nranks: usize, direct: usize) -> Vec<usize> {
    [2 * rank + 1, 2 * rank + 2]
        .into_iter()
        .filter(|&c| c < nranks && c >= direct)
        .collect()
}

/// What each rank of a job holds and what start-up costs, by model: the
/// figures behind the cost formulas of docs/architecture.md, for any
/// layout (1,024 nodes x 8 GPUs plans in a test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScalePlan {
    /// Ranks in all.
    pub nranks: usize,
    /// Most peers any rank connects to at creation ([`init_peers`]).
    pub init_peers: usize,
    /// Of those, most on other hosts (network connections of one rank).
    pub network_peers: usize,
    /// Most receive-ring bytes a rank holds for its creation peers:
    /// `init_peers · channels · capacity`.
    pub ring_bytes: usize,
    /// Bootstrap message channels a rank opens or accepts at most: parent
    /// and two children in the binary tree of its barrier and broadcast.
    pub bootstrap_peers: usize,
    /// Rounds of the bootstrap broadcast that checks every rank's settings
    /// against rank 0's: the tree's depth, `⌈log2(n+1)⌉ - 1`.
    pub broadcast_rounds: usize,
    /// Rounds of the final barrier: up and down the tree, twice the depth.
    pub barrier_rounds: usize,
    /// Connections the root accepts: one join per rank.
    pub root_joins: usize,
    /// Bytes of the rank table every rank receives:
    /// `n · (TABLE_ENTRY_BYTES + host name)`.
    pub table_bytes: usize,
    /// Ranks the root sends the whole table to ([`table_direct_ranks`]).
    pub root_tables: usize,
    /// Bytes of entries the root sends in all: the table to
    /// [`root_tables`](Self::root_tables) ranks (at most
    /// [`ROOT_TABLE_BUDGET`] of tables, or one), and every other rank its
    /// route (its parent's entry and its children's in the binary tree
    /// rooted at rank 0): linear in `n`.
    pub root_bytes: usize,
    /// Most bytes of table any rank forwards: the table to each of its (at
    /// most two) children in that tree.
    pub forward_bytes: usize,
    /// Rounds until the last rank has the table: the root to the top levels
    /// of the tree, then one per level below them (at most `⌈log2 n⌉ + 1`).
    pub table_rounds: usize,
}

/// Plans `layout` with `channels` streams per peer of `capacity` bytes each
/// and host names of `hostname_len` bytes. Every rank's creation peers are
/// listed (O(n) each, O(n²) in all: a few seconds for 8,192 ranks).
pub fn plan_scale(
    layout: Layout,
    channels: usize,
    capacity: usize,
    hostname_len: usize,
) -> ScalePlan {
    let n = layout.nranks();
    let (mut init, mut network) = (0, 0);
    for r in 0..n {
        let peers = init_peers(r, n);
        let remote = peers
            .iter()
            .filter(|&&q| layout.node_of(q) != layout.node_of(r))
            .count();
        init = init.max(peers.len());
        network = network.max(remote);
    }
    // Depth of the heap-ordered binary tree of n ranks: ⌈log2(n+1)⌉ - 1.
    let depth = if n == 0 {
        0
    } else {
        (usize::BITS - n.leading_zeros()) as usize - 1
    };
    let entry = TABLE_ENTRY_BYTES + hostname_len;
    let table_bytes = n * entry;
    let direct = table_direct_ranks(n, table_bytes);
    // Each rank below the root's: a route of its parent and children; a
    // hop more than its parent.
    let (mut route_entries, mut most_children) = (0, 0);
    let mut hops = vec![1usize; n];
    for r in 0..n {
        let ch = table_children(r, n, direct);
        most_children = most_children.max(ch.len());
        if let Some(p) = table_parent(r, n, direct) {
            route_entries += 1 + ch.len();
            hops[r] = hops[p] + 1;
        }
    }
    ScalePlan {
        nranks: n,
        init_peers: init,
        network_peers: network,
        ring_bytes: init * channels * capacity,
        bootstrap_peers: 3.min(n.saturating_sub(1)),
        broadcast_rounds: depth,
        barrier_rounds: 2 * depth,
        root_joins: n,
        table_bytes,
        root_tables: direct.min(n),
        root_bytes: direct.min(n) * table_bytes + route_entries * entry,
        forward_bytes: most_children * table_bytes,
        table_rounds: hops.iter().copied().max().unwrap_or(0),
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

    /// The bounds docs/architecture.md states, for 1,024 nodes x 8 GPUs
    /// with the host defaults (3 channels of 1 MiB) and 16-byte host names.
    #[test]
    fn plan_of_1024_nodes_of_8_stays_within_the_documented_bounds() {
        let layout = Layout {
            nodes: 1024,
            ranks_per_node: 8,
        };
        let p = plan_scale(layout, 3, 1 << 20, 16);
        assert_eq!(p.nranks, 8192);
        // Connections and rings per rank do not grow with the job: 2 ring
        // neighbours and the links of both trees make at most 6 peers here
        // (within MAX_INIT_PEERS), 5 of them on other hosts, 18 MiB of rings.
        assert_eq!((p.init_peers, p.network_peers), (6, 5), "{p:?}");
        assert!(p.init_peers <= MAX_INIT_PEERS);
        assert_eq!(p.ring_bytes, (6 * 3) << 20);
        assert_eq!(p.bootstrap_peers, 3);
        // ⌈log2(8193)⌉ - 1 = 13 rounds of broadcast, 26 of barrier.
        assert_eq!((p.broadcast_rounds, p.barrier_rounds), (13, 26));
        // The root: one join per rank, the 8192 · 88-byte table to ranks
        // 0..127 (the 128 MiB budget holds 186: 7 whole levels) and a route
        // (parent and children entries) to each other rank: 93 MB, where a
        // table to every rank was 5.9 GB. Ranks 127..254 have children
        // 2·r+1, 2·r+2 ≥ 255 and a parent: routes of 3 entries, as every
        // rank with two children.
        assert_eq!(p.root_joins, 8192);
        assert_eq!(p.table_bytes, 8192 * 88);
        assert_eq!(p.root_tables, 127);
        let routes = (8192 - 127) + (8191 - 254);
        assert_eq!(p.root_bytes, 127 * 8192 * 88 + routes * 88);
        assert!(p.root_bytes < 200 * p.table_bytes);
        assert!(p.root_bytes <= ROOT_TABLE_BUDGET + 3 * 8192 * 88);
        // A rank forwards at most two tables; the root reaches 7 levels,
        // 7 more below them: 8 rounds (within ⌈log2 8192⌉ + 1 = 14).
        assert_eq!(p.forward_bytes, 2 * 8192 * 88);
        assert_eq!(p.table_rounds, 8);
        // Against a job 8 times smaller: the same per-rank cost, a tree 3
        // rounds shallower.
        let small = plan_scale(
            Layout {
                nodes: 128,
                ranks_per_node: 8,
            },
            3,
            1 << 20,
            16,
        );
        assert_eq!(small.init_peers, p.init_peers);
        assert_eq!(small.ring_bytes, p.ring_bytes);
        assert_eq!(small.broadcast_rounds + 3, p.broadcast_rounds);
        // 1,024 ranks: 1,023 from the root (10 levels), rank 1,023 below.
        assert_eq!((small.root_tables, small.table_rounds), (1023, 2));
    }

    /// The root's bytes grow linearly and the table's rounds as ⌈log2 n⌉ + 1
    /// at most, for every rank count up to 64 and a few beyond.
    #[test]
    fn the_root_sends_linear_bytes_and_the_table_takes_log_rounds() {
        for n in (1..=64).chain([127, 128, 129, 1000, 1024, 1025, 4097]) {
            let p = plan_scale(
                Layout {
                    nodes: n,
                    ranks_per_node: 1,
                },
                1,
                1,
                8,
            );
            let entry = TABLE_ENTRY_BYTES + 8;
            let tables = p.root_tables * p.table_bytes;
            assert!(
                tables <= ROOT_TABLE_BUDGET.max(p.table_bytes),
                "n {n}: {p:?}"
            );
            assert!(p.root_bytes <= tables + 3 * n * entry, "n {n}: {p:?}");
            assert!(p.root_bytes >= p.table_bytes, "n {n}");
            assert!(p.forward_bytes <= 2 * p.table_bytes, "n {n}");
            let ceil_log2 = (usize::BITS - (n - 1).leading_zeros()) as usize;
            assert!(p.table_rounds <= ceil_log2 + 1, "n {n}: {p:?}");
            assert!(p.table_rounds <= p.broadcast_rounds + 1, "n {n}");
        }
    }

    #[test]
    fn plan_of_small_jobs() {
        let one = |nodes, per| {
            plan_scale(
                Layout {
                    nodes,
                    ranks_per_node: per,
                },
                2,
                1000,
                0,
            )
        };
        // One rank: nothing to connect, no rounds.
        let p = one(1, 1);
        assert_eq!(
            (
                p.init_peers,
                p.network_peers,
                p.bootstrap_peers,
                p.broadcast_rounds
            ),
            (0, 0, 0, 0)
        );
        assert_eq!(p.root_bytes, TABLE_ENTRY_BYTES);
        assert_eq!((p.forward_bytes, p.table_rounds), (0, 1));
        // 8 ranks on one host: every peer (one-shot), none over the network.
        let p = one(1, 8);
        assert_eq!((p.init_peers, p.network_peers), (7, 0));
        assert_eq!(p.ring_bytes, 7 * 2 * 1000);
        assert_eq!((p.broadcast_rounds, p.barrier_rounds), (3, 6));
        // 8 hosts of one rank: the same peers, all over the network.
        let p = one(8, 1);
        assert_eq!((p.init_peers, p.network_peers), (7, 7));
        // 0 ranks: an empty plan.
        assert_eq!(one(0, 8).nranks, 0);
        assert_eq!(one(0, 8).broadcast_rounds, 0);
    }
}
