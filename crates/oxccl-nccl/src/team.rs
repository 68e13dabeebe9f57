//! Teams (`ncclTeamWorld`, `ncclTeamLsa`, `ncclTeamRail`): the device
//! API's views of a communicator as `{nRanks, rank, stride}`, a team rank
//! `t` being world rank `self + (t - rank) * stride`. LSA ("load-store
//! accessible") is the run of consecutive ranks on this rank's host; a rail
//! is the ranks with this rank's LSA index on every host, when every host
//! holds one such run of the same size (else the rail is this rank alone).

use crate::abi::ncclTeam_t;
use oxccl::{Error, Result};

/// The LSA run of `rank`: (first world rank, size), the consecutive ranks
/// around it whose host is its host.
pub(crate) fn lsa(rank: usize, hosts: &[u64]) -> (usize, usize) {
    let h = hosts[rank];
    let mut lo = rank;
    while lo > 0 && hosts[lo - 1] == h {
        lo -= 1;
    }
    let mut hi = rank + 1;
    while hi < hosts.len() && hosts[hi] == h {
        hi += 1;
    }
    (lo, hi - lo)
}

/// The world team.
pub(crate) fn world(rank: usize, n: usize) -> ncclTeam_t {
    ncclTeam_t {
        nRanks: n as i32,
        rank: rank as i32,
        stride: 1,
    }
}

/// The LSA team.
pub(crate) fn lsa_team(rank: usize, hosts: &[u64]) -> ncclTeam_t {
    let (base, size) = lsa(rank, hosts);
    ncclTeam_t {
        nRanks: size as i32,
        rank: (rank - base) as i32,
        stride: 1,
    }
}

/// The rail team: every host one block of `size` consecutive ranks, each
/// block on one host and no host twice; else this rank alone.
pub(crate) fn rail_team(rank: usize, hosts: &[u64]) -> ncclTeam_t {
    let n = hosts.len();
    let (_, size) = lsa(rank, hosts);
    let uniform =
        n.is_multiple_of(size) && hosts.chunks(size).all(|b| b.iter().all(|&h| h == b[0])) && {
            let mut firsts: Vec<u64> = hosts.chunks(size).map(|b| b[0]).collect();
            firsts.sort_unstable();
            firsts.windows(2).all(|w| w[0] != w[1])
        };
    if !uniform {
        return ncclTeam_t {
            nRanks: 1,
            rank: 0,
            stride: 1,
        };
    }
    ncclTeam_t {
        nRanks: (n / size) as i32,
        rank: (rank / size) as i32,
        stride: size as i32,
    }
}

/// World rank of team rank `t` of `team` (a team of rank `rank` of `n`).
pub(crate) fn to_world(rank: usize, n: usize, team: ncclTeam_t, t: i32) -> Result<usize> {
    if team.nRanks < 1 || team.stride < 1 || !(0..team.nRanks).contains(&team.rank) {
        return Err(Error::invalid_argument(format!(
            "team {{nRanks {}, rank {}, stride {}}} is not a team of this communicator",
            team.nRanks, team.rank, team.stride
        )));
    }
    if !(0..team.nRanks).contains(&t) {
        return Err(Error::invalid_argument(format!(
            "rank {t} is not in the team's 0..{}",
            team.nRanks
        )));
    }
    let w = rank as i64 + (i64::from(t) - i64::from(team.rank)) * i64::from(team.stride);
    if w < 0 || w >= n as i64 {
        return Err(Error::invalid_argument(format!(
            "team rank {t} lands on world rank {w}, outside 0..{n}: the team is not this communicator's"
        )));
    }
    Ok(w as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsa_is_the_run_of_this_host() {
        // Hosts A A B B B C.
        let h = [1, 1, 2, 2, 2, 3];
        assert_eq!(lsa(0, &h), (0, 2));
        assert_eq!(lsa(3, &h), (2, 3));
        assert_eq!(lsa(5, &h), (5, 1));
        // A host whose ranks are not consecutive: only the run around it.
        let h = [1, 2, 1, 2];
        assert_eq!(lsa(2, &h), (2, 1));
        let t = lsa_team(4, &[1, 1, 2, 2, 2, 3]);
        assert_eq!((t.nRanks, t.rank, t.stride), (3, 2, 1));
    }

    #[test]
    fn rails_need_equal_blocks_of_distinct_hosts() {
        // Two hosts of 3: rank 4 is LSA index 1 of host 2, rail {2, 1, 3}.
        let h = [7, 7, 7, 9, 9, 9];
        let r = rail_team(4, &h);
        assert_eq!((r.nRanks, r.rank, r.stride), (2, 1, 3));
        assert_eq!(to_world(4, 6, r, 0).unwrap(), 1);
        // One host: a rail of one... per index: {1, 0, n}.
        let r = rail_team(2, &[5, 5, 5]);
        assert_eq!((r.nRanks, r.rank, r.stride), (1, 0, 3));
        // Uneven hosts, or a host in two blocks: this rank alone.
        for h in [&[1, 1, 2, 2, 2, 3][..], &[1, 2, 1, 2], &[1, 1, 2, 2, 1, 1]] {
            let r = rail_team(0, h);
            assert_eq!((r.nRanks, r.rank, r.stride), (1, 0, 1), "{h:?}");
        }
    }

    #[test]
    fn team_ranks_map_to_world_ranks_and_bad_ones_are_refused() {
        let w = world(2, 5);
        for t in 0..5 {
            assert_eq!(to_world(2, 5, w, t).unwrap(), t as usize);
        }
        let lsa = lsa_team(4, &[1, 1, 2, 2, 2, 3]);
        assert_eq!(to_world(4, 6, lsa, 0).unwrap(), 2);
        assert!(to_world(4, 6, lsa, 3)
            .unwrap_err()
            .message()
            .contains("not in the team's 0..3"));
        let forged = ncclTeam_t {
            nRanks: 4,
            rank: 0,
            stride: 5,
        };
        assert!(to_world(1, 6, forged, 2)
            .unwrap_err()
            .message()
            .contains("outside 0..6"));
        let zero = ncclTeam_t::default();
        assert!(to_world(1, 6, zero, 0).is_err());
    }
}
