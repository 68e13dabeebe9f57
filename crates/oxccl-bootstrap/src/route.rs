//! Who hands the rank table to whom: pure functions of (rank, nranks).
//!
//! The root sends the whole table to rank 0 only; every other rank gets
//! from the root a short route (its parent's and its children's entries)
//! and the table from its parent in the heap-ordered binary tree rooted at
//! rank 0, the same tree as the bootstrap's barrier and broadcast, so the
//! connections the table travels over serve them afterwards. Rank `r`
//! (`r > 0`) has its table `⌊log2(r+1)⌋ + 1` hops after the root sent it:
//! at most `⌊log2 N⌋ + 1` rounds in all, each rank sending at most two
//! tables and the root one.

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

/// Where rank `rank` of `nranks` gets the table: `None` from the root,
/// `Some(p)` from rank `p`.
pub(crate) fn table_parent(rank: usize, nranks: usize) -> Option<usize> {
    tree_of(rank, nranks, 0).0
}

/// The ranks that rank `rank` of `nranks` forwards the table to.
pub(crate) fn table_children(rank: usize, nranks: usize) -> Vec<usize> {
    tree_of(rank, nranks, 0).1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks the root sends the whole table to.
    const ROOT_TABLES: usize = 1;

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

    /// Simulates the hand-out round by round for many rank counts: every
    /// rank gets the table exactly once, only from a rank that already has
    /// it, within ⌈log2 N⌉ + 1 rounds; the root sends ROOT_TABLES tables and
    /// no rank more than two.
    #[test]
    fn every_rank_gets_the_table_once_within_log_rounds() {
        let sizes = (1..=300).chain([511, 512, 513, 1000, 1023, 1024, 1025, 4097, 8192]);
        for n in sizes {
            let mut got = vec![0usize; n];
            let mut round_of = vec![usize::MAX; n];
            let mut root_sent = 0;
            // Round 1: the root.
            let mut frontier: Vec<usize> =
                (0..n).filter(|&r| table_parent(r, n).is_none()).collect();
            for &r in &frontier {
                got[r] += 1;
                round_of[r] = 1;
                root_sent += 1;
            }
            let mut round = 1;
            while !frontier.is_empty() {
                round += 1;
                let mut next = Vec::new();
                for &r in &frontier {
                    let ch = table_children(r, n);
                    assert!(ch.len() <= 2, "n {n} rank {r} sends {}", ch.len());
                    for c in ch {
                        assert_eq!(table_parent(c, n), Some(r), "n {n} rank {c}");
                        got[c] += 1;
                        round_of[c] = round;
                        next.push(c);
                    }
                }
                frontier = next;
            }
            assert_eq!(root_sent, ROOT_TABLES, "n {n}");
            assert!(got.iter().all(|&k| k == 1), "n {n}: {got:?}");
            let rounds = *round_of.iter().max().unwrap();
            assert!(rounds <= ceil_log2(n) + 1, "n {n}: {rounds} rounds");
            for (r, &k) in round_of.iter().enumerate() {
                assert_eq!(k, table_hops(r), "n {n} rank {r}");
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
        assert_eq!(table_parent(0, 1), None);
        assert!(table_children(0, 1).is_empty());
        assert_eq!(table_children(0, 2), [1]);
        assert_eq!(table_children(1, 4), [3]);
        assert_eq!(table_parent(3, 4), Some(1));
    }
}
