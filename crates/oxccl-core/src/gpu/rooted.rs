//! Agreement on the rooted collectives of a call on device buffers.
//!
//! On host buffers every rank of a broadcast, reduce, gather or scatter
//! passes the operation's header to its successor, so ranks that name
//! different roots are refused at the call. A kernel on device buffers runs
//! later, on the stream, and its peers' data carries no header: ranks that
//! each named themselves root would each "succeed" with a buffer of their
//! own. So before a group of device operations with rooted collectives is
//! queued, each rank trades one fixed-size record of them (see
//! [`RootedRecord`]) with every rank of that communicator over the host
//! transport, and every rank applies [`check`] to the same records: all
//! refuse together, or all queue.
//!
//! Only rooted collectives pay for it (one all-gather of [`RECORD_LEN`]
//! bytes per communicator and group): all-reduces, all-gathers and the
//! other collectives on device buffers queue as before.

use crate::{CollKind, DataType};

/// Bytes of one rank's record: the number of rooted calls (4), the first
/// call (kind 1, type 1, root 8, count 8) and a digest of all of them (8).
pub const RECORD_LEN: usize = 30;

/// One rooted collective of a group on device buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootedCall {
    pub kind: CollKind,
    pub dtype: DataType,
    pub root: usize,
    /// Elements, as NCCL counts them for `kind`.
    pub count: usize,
}

impl RootedCall {
    /// Whether a collective of `kind` has a root that ranks must agree on.
    pub fn is_rooted(kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
        )
    }

    fn describe(&self) -> String {
        format!(
            "{}(count={}, datatype={}, root={})",
            self.kind.snake_name(),
            self.count,
            self.dtype.name(),
            self.root
        )
    }
}

/// What one rank of a communicator traded: its rooted calls of the group,
/// the first one in full and the rest as a digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootedRecord {
    pub calls: u32,
    pub first: Option<RootedCall>,
    pub digest: u64,
}

fn kind_code(k: CollKind) -> u8 {
    CollKind::ALL.iter().position(|&x| x == k).unwrap_or(0) as u8
}

/// FNV-1a over the calls' fields, in order.
fn digest(calls: &[RootedCall]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= x as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for c in calls {
        eat(&[kind_code(c.kind), c.dtype as i32 as u8]);
        eat(&(c.root as u64).to_le_bytes());
        eat(&(c.count as u64).to_le_bytes());
    }
    h
}

/// This rank's record of `calls` (its rooted calls of one group on one
/// communicator, in the order they were added).
pub fn encode(calls: &[RootedCall]) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[0..4].copy_from_slice(&(calls.len() as u32).to_le_bytes());
    if let Some(c) = calls.first() {
        b[4] = kind_code(c.kind);
        b[5] = c.dtype as i32 as u8;
        b[6..14].copy_from_slice(&(c.root as u64).to_le_bytes());
        b[14..22].copy_from_slice(&(c.count as u64).to_le_bytes());
    }
    b[22..30].copy_from_slice(&digest(calls).to_le_bytes());
    b
}

/// A record a peer sent; `None` when its bytes name no collective or type
/// (a peer of another build: the caller reports it as a mismatch).
pub fn decode(b: &[u8]) -> Option<RootedRecord> {
    let b: &[u8; RECORD_LEN] = b.get(..RECORD_LEN)?.try_into().ok()?;
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    let calls = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let first = if calls == 0 {
        None
    } else {
        Some(RootedCall {
            kind: *CollKind::ALL.get(b[4] as usize)?,
            dtype: DataType::from_raw(b[5] as i32).ok()?,
            root: usize::try_from(u64_at(6)).ok()?,
            count: usize::try_from(u64_at(14)).ok()?,
        })
    };
    Some(RootedRecord {
        calls,
        first,
        digest: u64_at(22),
    })
}

/// Every rank's record, in rank order (each rank checks the same list, so
/// all come to the same verdict): `Err` names the first rank whose rooted
/// calls differ from rank 0's, and both ranks' calls.
pub fn check(records: &[Vec<u8>]) -> Result<(), String> {
    let Some(r0) = records.first() else {
        return Ok(());
    };
    let Some(first) = decode(r0) else {
        return Err("rank 0 sent an unreadable record of its rooted calls".into());
    };
    for (q, b) in records.iter().enumerate().skip(1) {
        let Some(rec) = decode(b) else {
            return Err(format!(
                "rank {q} sent an unreadable record of its rooted calls"
            ));
        };
        if rec == first {
            continue;
        }
        let say = |r: &RootedRecord| match (r.first, r.calls) {
            (None, _) => "no rooted collective".to_string(),
            (Some(c), 1) => c.describe(),
            (Some(c), n) => format!("{n} rooted collectives, the first {}", c.describe()),
        };
        let (a, b) = (say(&first), say(&rec));
        let detail = if a == b {
            " (they differ in a later call of the group)"
        } else {
            ""
        };
        return Err(format!(
            "mismatched rooted collectives on device buffers: rank 0 called {a}, rank {q} {b}{detail}; every rank must name the same root, count and datatype"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bcast(root: usize, count: usize) -> RootedCall {
        RootedCall {
            kind: CollKind::Broadcast,
            dtype: DataType::Float32,
            root,
            count,
        }
    }

    #[test]
    fn records_round_trip() {
        for calls in [vec![], vec![bcast(3, 0)], vec![bcast(1, 7), bcast(0, 9)]] {
            let r = decode(&encode(&calls)).unwrap();
            assert_eq!(r.calls as usize, calls.len());
            assert_eq!(r.first, calls.first().copied());
        }
        assert!(decode(&[0u8; RECORD_LEN - 1]).is_none());
        let mut bad = encode(&[bcast(0, 1)]);
        bad[4] = 200;
        assert!(decode(&bad).is_none());
    }

    #[test]
    fn same_calls_agree() {
        let rec = encode(&[bcast(1, 64), bcast(0, 3)]).to_vec();
        assert_eq!(check(&[rec.clone(), rec.clone(), rec]), Ok(()));
        assert_eq!(check(&[]), Ok(()));
    }

    #[test]
    fn ranks_that_each_name_themselves_root_are_refused() {
        let recs: Vec<Vec<u8>> = (0..3).map(|r| encode(&[bcast(r, 64)]).to_vec()).collect();
        let e = check(&recs).unwrap_err();
        assert!(
            e.contains("rank 0 called broadcast(count=64, datatype=float, root=0)"),
            "{e}"
        );
        assert!(
            e.contains("rank 1 broadcast(count=64, datatype=float, root=1)"),
            "{e}"
        );
    }

    #[test]
    fn counts_types_later_calls_and_missing_calls_are_refused() {
        let a = encode(&[bcast(0, 64)]).to_vec();
        let e = check(&[a.clone(), encode(&[bcast(0, 65)]).to_vec()]).unwrap_err();
        assert!(e.contains("count=64") && e.contains("count=65"), "{e}");
        let mut d = bcast(0, 64);
        d.dtype = DataType::Int32;
        let e = check(&[a.clone(), encode(&[d]).to_vec()]).unwrap_err();
        assert!(e.contains("datatype=int32"), "{e}");
        let e = check(&[
            encode(&[bcast(0, 1), bcast(0, 2)]).to_vec(),
            encode(&[bcast(0, 1), bcast(1, 2)]).to_vec(),
        ])
        .unwrap_err();
        assert!(e.contains("differ in a later call"), "{e}");
        let e = check(&[a, encode(&[]).to_vec()]).unwrap_err();
        assert!(e.contains("rank 1 no rooted collective"), "{e}");
        let e = check(&[encode(&[]).to_vec(), vec![1, 2]]).unwrap_err();
        assert!(e.contains("rank 1 sent an unreadable record"), "{e}");
    }
}
