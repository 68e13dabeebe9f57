//! What a rank learns about its own GPU's place in the machine at ring
//! setup, for the ring order and the channel count: the NUMA node and the
//! PCI bridges above it (the machine's topology from sysfs, the walk shared
//! with `oxccl topo`), its NVLinks (NVML, [`crate::nvml`], waited for at
//! most 5 s: a stuck driver means no NVLink facts, not a hang). The
//! record travels to every rank through the bootstrap ([`Record::encode`]);
//! the decisions on it are pure ([`oxccl_core::topo::rank_ring`],
//! [`crate::ring::topo_channels`]).

use oxccl_core::topo::{normalize_busid, GpuSite, NvLink, GPU_CLASS, NVSWITCH_CLASS};
use oxccl_core::{Error, Result};

/// One rank's record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    pub site: GpuSite,
    /// Whether NVML answered (without it, no NVLink is known, so an absent
    /// link proves nothing).
    pub nvml: bool,
    /// The lowest rank on this rank's host: the same number on every rank
    /// of one host, so every rank groups the hosts alike.
    pub host: u64,
    /// OXCCL_RING_ORDER as this rank read it (rank 0's is the one used, so
    /// every rank builds the same ring).
    pub forced_order: Vec<u32>,
}

/// Cap on names and lists in a record, so a bad record cannot ask for much.
const MAX_ITEMS: usize = 64;
/// Cap on a forced ring order's length (ranks).
const MAX_ORDER: usize = 1 << 16;

fn put_str(v: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(255)];
    v.push(b.len() as u8);
    v.extend_from_slice(b);
}

struct Rd<'a>(&'a [u8], usize);

impl Rd<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let b = self
            .0
            .get(self.1..self.1 + n)
            .ok_or_else(|| Error::remote("GPU topology record: cut short"))?;
        self.1 += n;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn str(&mut self) -> Result<String> {
        let n = self.u8()? as usize;
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| Error::remote("GPU topology record: a name is not UTF-8"))
    }
    fn count(&mut self) -> Result<usize> {
        let n = self.u8()? as usize;
        if n > MAX_ITEMS {
            return Err(Error::remote(format!(
                "GPU topology record: {n} items (at most {MAX_ITEMS})"
            )));
        }
        Ok(n)
    }
}

impl Record {
    /// Bytes for the bootstrap all-gather.
    pub fn encode(&self) -> Vec<u8> {
        let s = &self.site;
        let mut v = Vec::with_capacity(64);
        v.push(1); // version
        v.extend_from_slice(&self.host.to_le_bytes());
        v.push(self.nvml as u8);
        put_str(&mut v, &s.busid);
        v.extend_from_slice(&s.numaid.to_le_bytes());
        let nb = s.bridges.len().min(MAX_ITEMS);
        v.push(nb as u8);
        for b in &s.bridges[..nb] {
            put_str(&mut v, b);
        }
        let nl = s.nvlinks.len().min(MAX_ITEMS);
        v.push(nl as u8);
        for l in &s.nvlinks[..nl] {
            put_str(&mut v, &l.target);
            v.extend_from_slice(&l.count.to_le_bytes());
            v.push((l.tclass == NVSWITCH_CLASS) as u8);
        }
        let no = self.forced_order.len().min(MAX_ORDER);
        v.extend_from_slice(&(no as u32).to_le_bytes());
        for r in &self.forced_order[..no] {
            v.extend_from_slice(&r.to_le_bytes());
        }
        v
    }

    /// Reads `rank`'s record; anything malformed is a `Remote` error naming it.
    pub fn decode(b: &[u8], rank: usize) -> Result<Record> {
        let ctx = |e: Error| e.context(format!("from rank {rank}"));
        let mut r = Rd(b, 0);
        let ver = r.u8().map_err(ctx)?;
        if ver != 1 {
            return Err(ctx(Error::remote(format!(
                "GPU topology record version {ver} (this build reads 1)"
            ))));
        }
        let host = r.u64().map_err(ctx)?;
        let nvml = r.u8().map_err(ctx)? != 0;
        let busid = r.str().map_err(ctx)?;
        let numaid = r.u32().map_err(ctx)?;
        let nb = r.count().map_err(ctx)?;
        let mut bridges = Vec::with_capacity(nb);
        for _ in 0..nb {
            bridges.push(r.str().map_err(ctx)?);
        }
        let nl = r.count().map_err(ctx)?;
        let mut nvlinks = Vec::with_capacity(nl);
        for _ in 0..nl {
            let target = r.str().map_err(ctx)?;
            let count = r.u32().map_err(ctx)?;
            let switch = r.u8().map_err(ctx)? != 0;
            nvlinks.push(NvLink {
                target,
                count,
                tclass: if switch { NVSWITCH_CLASS } else { GPU_CLASS }.into(),
            });
        }
        let no = r.u32().map_err(ctx)? as usize;
        if no > MAX_ORDER {
            return Err(ctx(Error::remote(format!(
                "GPU topology record: a ring order of {no} ranks"
            ))));
        }
        let mut forced_order = Vec::with_capacity(no);
        for _ in 0..no {
            forced_order.push(r.u32().map_err(ctx)?);
        }
        if r.1 != b.len() {
            return Err(ctx(Error::remote("GPU topology record: trailing bytes")));
        }
        Ok(Record {
            site: GpuSite {
                busid,
                numaid,
                bridges,
                nvlinks,
            },
            nvml,
            host,
            forced_order,
        })
    }
}

/// This rank's record for the GPU at `busid` (as `cuDeviceGetPCIBusId`
/// writes it); `host` and `forced_order` as in [`Record`]. Where the GPU
/// sits comes from the machine's topology (the one sysfs walk,
/// [`oxccl_env::sysfs::machine_topology`]) with NVML's links merged in; a
/// GPU the walk did not find sits on NUMA node 0 under no bridge.
pub fn local_record(busid: &str, host: u64, forced_order: Vec<u32>) -> Record {
    let busid = normalize_busid(busid).unwrap_or_else(|| busid.to_ascii_lowercase());
    let mut machine = oxccl_env::sysfs::machine_topology().clone();
    let nvml = crate::nvml::links_within(crate::nvml::NVML_WAIT).ok();
    if let Some(r) = &nvml {
        machine.merge_nvml(r);
    }
    let site = match machine.gpus().iter().find(|g| g.pci.busid == busid) {
        Some(g) => g.site(),
        None => GpuSite {
            nvlinks: nvml
                .as_ref()
                .and_then(|r| r.gpu(&busid))
                .map(|g| g.nvlinks.clone())
                .unwrap_or_default(),
            busid,
            ..GpuSite::default()
        },
    };
    Record {
        site,
        nvml: nvml.is_some(),
        host,
        forced_order,
    }
}

/// The ring order rank 0 asked for (`OXCCL_RING_ORDER`), checked: a
/// permutation of `0..nranks`. Every rank reaches the same verdict from the
/// same record.
pub fn forced_order(rank0: &Record, nranks: usize) -> Result<Option<Vec<usize>>> {
    let o = &rank0.forced_order;
    if o.is_empty() {
        return Ok(None);
    }
    let mut seen = vec![false; nranks];
    let ok = o.len() == nranks
        && o.iter().all(|&r| {
            let r = r as usize;
            r < nranks && !std::mem::replace(&mut seen[r], true)
        });
    if !ok {
        let list: Vec<String> = o
            .iter()
            .map(|&r| {
                if r == u32::MAX {
                    "?".into()
                } else {
                    r.to_string()
                }
            })
            .collect();
        return Err(Error::invalid_argument(format!(
            "OXCCL_RING_ORDER={} (rank 0's): not an order of all {nranks} ranks (each of 0..{} once)",
            list.join(","),
            nranks.saturating_sub(1)
        )));
    }
    Ok(Some(o.iter().map(|&r| r as usize).collect()))
}

pub use oxccl_core::gpu::config::parse_ring_order;

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> Record {
        Record {
            site: GpuSite {
                busid: "0000:1b:00.0".into(),
                numaid: 1,
                bridges: vec!["0000:00:01.0".into(), "0000:16:00.0".into()],
                nvlinks: vec![
                    NvLink {
                        target: "0000:2a:00.0".into(),
                        count: 4,
                        tclass: "0x030200".into(),
                    },
                    NvLink {
                        target: "ffff:ff:1f.7".into(),
                        count: 18,
                        tclass: NVSWITCH_CLASS.into(),
                    },
                ],
            },
            nvml: true,
            host: 4,
            forced_order: vec![1, 0, 2],
        }
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_errors() {
        let r = rec();
        let b = r.encode();
        assert_eq!(Record::decode(&b, 3).unwrap(), r);
        assert_eq!(
            Record::decode(&Record::default().encode(), 0).unwrap(),
            Record::default()
        );
        // Every cut and every extra byte is an error naming the rank, never a panic.
        for n in 0..b.len() {
            let e = Record::decode(&b[..n], 3).unwrap_err();
            assert!(e.message().contains("rank 3"), "{e}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(Record::decode(&long, 3).is_err());
        let mut ver = b.clone();
        ver[0] = 2;
        assert!(Record::decode(&ver, 3)
            .unwrap_err()
            .message()
            .contains("version 2"));
        // A list longer than the cap is refused before anything is read for it.
        let mut many = b[..23].to_vec(); // version, host, nvml, bus id
        many.extend_from_slice(&r.site.numaid.to_le_bytes());
        many.push(200);
        assert!(Record::decode(&many, 1)
            .unwrap_err()
            .message()
            .contains("200 items"));
        // Arbitrary bytes never panic.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..200usize {
            let _ = Record::decode(&crate::testutil::noise(&mut x, len), 0);
        }
    }

    #[test]
    fn forced_orders_are_checked() {
        let mut r = Record::default();
        assert_eq!(forced_order(&r, 3).unwrap(), None);
        r.forced_order = vec![2, 0, 1];
        assert_eq!(forced_order(&r, 3).unwrap(), Some(vec![2, 0, 1]));
        assert_eq!(parse_ring_order(" 0, 2,1 ,3,"), vec![0, 2, 1, 3]);
        r.forced_order = parse_ring_order("0,x,1");
        let e = forced_order(&r, 3).unwrap_err();
        assert!(e.message().starts_with("OXCCL_RING_ORDER=0,?,1 "), "{e}");
        for bad in [vec![0, 1], vec![0, 1, 1], vec![0, 1, 3], vec![0, 1, 2, 3]] {
            r.forced_order = bad.clone();
            let e = forced_order(&r, 3).unwrap_err();
            assert_eq!(e.kind(), oxccl_core::ErrorKind::InvalidArgument, "{bad:?}");
            assert!(e.message().starts_with("OXCCL_RING_ORDER="), "{e}");
        }
    }
}
