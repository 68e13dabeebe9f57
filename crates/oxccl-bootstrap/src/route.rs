//! Who hands the rank table to whom: pure functions of (rank, nranks, the
//! table's length), in `oxccl_core::peers` beside the cost model that
//! counts them.
//!
//! The root sends the whole table to the top levels of the heap-ordered
//! binary tree rooted at rank 0, as many as fit in 8 MiB of tables (all
//! ranks of a small job, 63 of 1,024, 7 of 8,192, at least rank 0); every
//! other rank gets from the root a short route (its parent's and its
//! children's entries) and the table from its parent in that tree, the
//! same tree as the bootstrap's barrier and broadcast, so the connections
//! the table travels over serve them afterwards. The last rank has its
//! table at most `⌈log2 N⌉ + 1` rounds after the root started sending;
//! each rank forwards at most two tables.

/// Rank `rank`'s parent and children in the heap-ordered binary tree of
/// `nranks` ranks rooted at `root` (positions counted from the root).
pub(crate) fn tree_of(rank: usize, nranks: usize, root: usize) -> (Option<usize>, Vec<usize>) {
    let n = nranks.max(1);
    let pos = (rank + n - root % n) % n;
    let at = |p: usize| (p + root) % n;
    let parent = (pos > 0).then(|| at((pos - 1) / 2));
    let children = [2 * pos + 1, 2 * pos + 2]
        .into_iter()
        .filter(|&c| c < n)
        .map(at)
        .collect();
    (parent, children)
}

#[cfg(test)]
use oxccl_core::peers::table_direct_ranks;
pub(crate) use oxccl_core::peers::{table_children, table_direct_ranks_within, table_parent};

#[cfg(test)]
mod tests {
    use super::*;

    /// Hops from the root to rank `rank`: 1 for rank 0, one more per level.
    fn table_hops(rank: usize) -> usize {
        (usize::BITS - (rank + 1).leading_zeros()) as usize
    }

    fn ceil_log2(n: usize) -> usize {
        (usize::BITS - (n.max(1) - 1).leading_zeros()) as usize
    }

    #[test]
    fn trees_cover_every_rank_once_with_at_most_3_peers() {
        for n in [1usize, 2, 3, 7, 8, 100, 1024] {
            for root in [0, n / 2, n - 1] {
                let mut reached = vec![0; n];
                let mut depth = 0;
                for r in 0..n {
                    let (p, ch) = tree_of(r, n, root);
                    assert_eq!(p.is_none(), r == root, "n {n} root {root} rank {r}");
                    assert!(ch.len() <= 2);
                    for c in ch {
                        assert_eq!(tree_of(c, n, root).0, Some(r));
                        reached[c] += 1;
                    }
                    let (mut x, mut d) = (r, 0);
                    while let Some(p) = tree_of(x, n, root).0 {
                        x = p;
                        d += 1;
                    }
                    depth = depth.max(d);
                }
                reached[root] += 1;
                assert!(reached.iter().all(|&k| k == 1), "n {n} root {root}");
                // ⌈log2(n+1)⌉ - 1 levels below the root.
                let levels = (usize::BITS - n.leading_zeros()) as usize - 1;
                assert_eq!(depth, levels, "n {n}");
            }
        }
    }

    /// Simulates the hand-out round by round for many rank counts and
    /// numbers of ranks the root serves: every rank gets the table exactly
    /// once, only from a rank that already has it and is its parent in the
    /// barrier's tree, within ⌈log2 N⌉ + 1 rounds; the root sends `direct`
    /// tables and no rank more than two.
    #[test]
    fn every_rank_gets_the_table_once_within_log_rounds() {
        let sizes = (1..=300).chain([511, 512, 513, 1000, 1023, 1024, 1025, 4097, 8192]);
        for n in sizes {
            let entry = 88;
            for direct in [1, 3, 7, 63, n, table_direct_ranks(n, n * entry)] {
                let direct = direct.clamp(1, n);
                let mut got = vec![0usize; n];
                let mut round_of = vec![usize::MAX; n];
                // Round 1: the root.
                let mut frontier: Vec<usize> = (0..n)
                    .filter(|&r| table_parent(r, n, direct).is_none())
                    .collect();
                assert_eq!(frontier, (0..direct).collect::<Vec<_>>(), "n {n}");
                for &r in &frontier {
                    got[r] += 1;
                    round_of[r] = 1;
                }
                let mut round = 1;
                while !frontier.is_empty() {
                    round += 1;
                    let mut next = Vec::new();
                    for &r in &frontier {
                        let ch = table_children(r, n, direct);
                        assert!(ch.len() <= 2, "n {n} rank {r} sends {}", ch.len());
                        for c in ch {
                            assert_eq!(table_parent(c, n, direct), Some(r), "n {n} rank {c}");
                            assert_eq!(tree_of(c, n, 0).0, Some(r), "n {n} rank {c}");
                            got[c] += 1;
                            round_of[c] = round;
                            next.push(c);
                        }
                    }
                    frontier = next;
                }
                assert!(
                    got.iter().all(|&k| k == 1),
                    "n {n} direct {direct}: {got:?}"
                );
                let rounds = *round_of.iter().max().unwrap();
                assert!(rounds <= ceil_log2(n) + 1, "n {n}: {rounds} rounds");
                if direct == 1 {
                    for (r, &k) in round_of.iter().enumerate() {
                        assert_eq!(k, table_hops(r), "n {n} rank {r}");
                    }
                }
            }
        }
    }

    /// The root's tables fit in the budget (128 MiB; or are one table),
    /// and are the top levels of the tree.
    #[test]
    fn the_root_sends_at_most_its_budget_of_tables() {
        for (n, len, want) in [
            (1, 88, 1),
            (64, 64 * 88, 64),
            (1000, 1000 * 88, 1000),
            (1024, 1024 * 88, 1023),
            (8192, 8192 * 88, 127),
            (100_000, 100_000 * 88, 15),
            (1_000_000, 1_000_000 * 88, 1),
            (5, 0, 5),
        ] {
            assert_eq!(table_direct_ranks(n, len), want, "n {n}");
        }
        for n in 1..2000 {
            for entry in [72, 88, 200, 400] {
                let k = table_direct_ranks(n, n * entry);
                assert!(k >= 1 && k <= n);
                assert!(k == 1 || k * n * entry <= 128 << 20, "n {n}");
                assert!(k == n || (k + 1).is_power_of_two(), "n {n}: {k}");
            }
        }
    }

    #[test]
    fn hops_by_rank() {
        assert_eq!(
            (0..8).map(table_hops).collect::<Vec<_>>(),
            [1, 2, 2, 3, 3, 3, 3, 4]
        );
        assert_eq!(table_hops(8191), 14);
        assert_eq!(table_parent(0, 1, 1), None);
        assert!(table_children(0, 1, 1).is_empty());
        assert_eq!(table_children(0, 2, 1), [1]);
        assert_eq!(table_children(1, 4, 1), [3]);
        assert_eq!(table_parent(3, 4, 1), Some(1));
        assert_eq!(table_parent(3, 4, 3), Some(1));
        assert_eq!(table_parent(3, 4, 4), None);
        assert_eq!(table_children(0, 7, 3), Vec::<usize>::new());
        assert_eq!(table_children(1, 7, 3), [3, 4]);
    }
}
