//! NVLink and peer-to-peer status from NVML, which sysfs does not show.
//!
//! `libnvidia-ml.so.1` is loaded with dlopen in a child process
//! (`oxccl topo --probe-nvml`, killed after 5 s) that prints what it found as
//! JSON; the parent merges that into the sysfs topology. So a missing library
//! is "NVML not available", and a hanging or crashing driver costs 5 s, never
//! the tool. Under `--sysroot DIR` the same facts come from `DIR/topo.xml`
//! (written by `oxccl topo --dump` on the machine), since NVML cannot be
//! recorded as files.

use oxccl_core::topo::{normalize_busid, NvLink, P2p, P2pStatus, Pci, Topology, NVSWITCH_CLASS};

/// What NVML (or the recorded file) says about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvGpu {
    pub index: u32,
    pub busid: String,
    pub name: Option<String>,
    pub sm: Option<u32>,
    /// (remote bus id, links, remote is a GPU).
    pub links: Vec<(String, u32, bool)>,
    pub p2p: Vec<(String, P2pStatus)>,
}

/// NVML's view, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvSource {
    Nvml {
        driver: Option<String>,
        gpus: Vec<NvGpu>,
    },
    Recorded {
        file: String,
        gpus: Vec<NvGpu>,
    },
    Unavailable(String),
}

impl NvSource {
    pub fn gpus(&self) -> &[NvGpu] {
        match self {
            NvSource::Nvml { gpus, .. } | NvSource::Recorded { gpus, .. } => gpus,
            NvSource::Unavailable(_) => &[],
        }
    }
    pub fn describe(&self) -> String {
        match self {
            NvSource::Nvml { driver, .. } => format!(
                "NVLink and P2P from NVML{}",
                driver
                    .as_ref()
                    .map(|d| format!(" (driver {d})"))
                    .unwrap_or_default()
            ),
            NvSource::Recorded { file, .. } => format!("NVLink and P2P recorded in {file}"),
            NvSource::Unavailable(why) => {
                format!("NVML not available ({why}): no NVLink or P2P information")
            }
        }
    }
}

/// The NVML part of a recorded topology (`topo.xml`): every GPU's links and P2P.
pub fn from_topology(t: &Topology) -> Vec<NvGpu> {
    let gpus = t.gpus();
    gpus.iter()
        .map(|g| NvGpu {
            index: g.gpu.dev,
            busid: g.pci.busid.clone(),
            name: g.gpu.name.clone(),
            sm: g.gpu.sm,
            links: g
                .gpu
                .nvlinks
                .iter()
                .map(|l| (l.target.clone(), l.count, l.tclass != NVSWITCH_CLASS))
                .collect(),
            p2p: g
                .gpu
                .p2p
                .iter()
                .map(|p| (p.target.clone(), p.status))
                .collect(),
        })
        .collect()
}

fn merge_pci(p: &mut Pci, nv: &[NvGpu]) {
    if let Some(g) = &mut p.gpu {
        if let Some(n) = nv.iter().find(|n| n.busid == p.busid) {
            g.dev = n.index;
            g.name = n.name.clone().or(g.name.take());
            g.sm = n.sm.or(g.sm);
            g.nvlinks = n
                .links
                .iter()
                .map(|(t, c, is_gpu)| NvLink {
                    target: t.clone(),
                    count: *c,
                    tclass: if *is_gpu {
                        "0x030200".into()
                    } else {
                        NVSWITCH_CLASS.into()
                    },
                })
                .collect();
            g.p2p = n
                .p2p
                .iter()
                .map(|(t, s)| P2p {
                    target: t.clone(),
                    status: *s,
                })
                .collect();
        }
    }
    for c in &mut p.children {
        merge_pci(c, nv);
    }
}

/// Adds NVML's links and P2P status to the GPUs sysfs found (matched by bus id).
pub fn merge(t: &mut Topology, nv: &[NvGpu]) {
    for c in &mut t.cpus {
        for p in &mut c.pcis {
            merge_pci(p, nv);
        }
    }
}

/// Parses the child's JSON.
pub fn parse_report(text: &str) -> NvSource {
    let v: serde_json::Value = match serde_json::from_str(text.trim()) {
        Ok(v) => v,
        Err(e) => return NvSource::Unavailable(format!("unreadable probe output ({e})")),
    };
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return NvSource::Unavailable(e.to_string());
    }
    let mut gpus = Vec::new();
    for g in v
        .get("gpus")
        .and_then(|g| g.as_array())
        .into_iter()
        .flatten()
    {
        let s = |k: &str| g.get(k).and_then(|x| x.as_str()).map(str::to_string);
        let Some(busid) = s("busid").and_then(|b| normalize_busid(&b)) else {
            continue;
        };
        let mut links: Vec<(String, u32, bool)> = Vec::new();
        for l in g
            .get("links")
            .and_then(|l| l.as_array())
            .into_iter()
            .flatten()
        {
            let Some(t) = l
                .get("target")
                .and_then(|x| x.as_str())
                .and_then(normalize_busid)
            else {
                continue;
            };
            let c = l.get("count").and_then(|x| x.as_u64()).unwrap_or(0) as u32;
            let is_gpu = l.get("gpu").and_then(|x| x.as_bool()).unwrap_or(true);
            links.push((t, c, is_gpu));
        }
        let mut p2p = Vec::new();
        for p in g
            .get("p2p")
            .and_then(|l| l.as_array())
            .into_iter()
            .flatten()
        {
            if let (Some(t), Some(st)) = (
                p.get("target")
                    .and_then(|x| x.as_str())
                    .and_then(normalize_busid),
                p.get("status").and_then(|x| x.as_u64()),
            ) {
                p2p.push((t, P2pStatus::from_nvml(st as u32)));
            }
        }
        gpus.push(NvGpu {
            index: g.get("index").and_then(|x| x.as_u64()).unwrap_or(0) as u32,
            busid,
            name: s("name"),
            sm: g.get("sm").and_then(|x| x.as_u64()).map(|x| x as u32),
            links,
            p2p,
        });
    }
    NvSource::Nvml {
        driver: v.get("driver").and_then(|d| d.as_str()).map(str::to_string),
        gpus,
    }
}

/// Runs the NVML probe in a child process.
pub fn probe() -> NvSource {
    match crate::doctor::run_sub(
        "topo",
        &["--probe-nvml".as_ref()],
        crate::doctor::CHILD_TIMEOUT,
    ) {
        Ok(out) => parse_report(&out),
        Err(e) => NvSource::Unavailable(e),
    }
}

// ---------------------------------------------------------------- the child

/// The target recorded for NVLinks to a switch NVML does not name.
pub use oxccl_cuda::nvml::HIDDEN_SWITCH;

/// `oxccl topo --probe-nvml`: what NVML says (oxccl-cuda's loader, the one
/// the library uses), as one JSON line.
pub fn probe_child() -> i32 {
    let v = match oxccl_cuda::nvml::probe(true) {
        Ok(r) => {
            let ids: Vec<&String> = r.gpus.iter().map(|g| &g.busid).collect();
            serde_json::json!({
                "driver": r.driver,
                "gpus": r.gpus.iter().map(|g| serde_json::json!({
                    "index": g.index, "busid": g.busid, "name": g.name, "sm": g.sm,
                    "links": g.links.iter().map(|(t, c)| serde_json::json!({
                        "target": t, "count": c, "gpu": ids.contains(&t),
                    })).collect::<Vec<_>>(),
                    "p2p": g.p2p.iter().map(|(t, s)| serde_json::json!({
                        "target": t, "status": s,
                    })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })
        }
        Err(e) => serde_json::json!({ "error": e }),
    };
    println!("{v}");
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_parsing() {
        let r = parse_report(
            r#"{"driver":"580.1","gpus":[{"index":0,"busid":"00000000:00:06.0","name":"H200","sm":90,
            "links":[{"target":"00000000:00:07.0","count":18,"gpu":true}],"p2p":[{"target":"00000000:00:07.0","status":1}]}]}"#,
        );
        let NvSource::Nvml { gpus, .. } = &r else {
            panic!("{r:?}")
        };
        assert_eq!(gpus[0].busid, "0000:00:06.0");
        assert_eq!(gpus[0].links, vec![("0000:00:07.0".into(), 18, true)]);
        assert_eq!(gpus[0].p2p[0].1, P2pStatus::ChipsetNotSupported);
        assert!(matches!(
            parse_report(r#"{"error":"x"}"#),
            NvSource::Unavailable(_)
        ));
        assert!(matches!(parse_report("garbage"), NvSource::Unavailable(_)));
    }
}
