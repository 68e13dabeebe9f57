//! Where `oxccl topo` gets NVLink and peer-to-peer facts, which sysfs does
//! not show: NVML (the library's one loader, `oxccl::topo::nvml`), asked
//! in a child process (`oxccl topo --probe-nvml`, killed after 5 s) that
//! prints what it found as JSON, so a missing library is "NVML not
//! available" and a hanging or crashing driver costs 5 s, never the tool.
//! Under `--sysroot DIR` the same facts come from `DIR/topo.xml` (written
//! by `oxccl topo --dump` on the machine), since NVML cannot be recorded as
//! files. The facts join the sysfs tree in the core
//! (`Topology::merge_nvml`).

use oxccl::topo::{normalize_busid, NvLink, NvmlGpu, NvmlReport, P2p, P2pStatus};

/// NVML's view, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvSource {
    Nvml(NvmlReport),
    Recorded { file: String, report: NvmlReport },
    Unavailable(String),
}

impl NvSource {
    /// The facts to merge (none when unavailable).
    pub fn report(&self) -> Option<&NvmlReport> {
        match self {
            NvSource::Nvml(r) | NvSource::Recorded { report: r, .. } => Some(r),
            NvSource::Unavailable(_) => None,
        }
    }
    pub fn describe(&self) -> String {
        match self {
            NvSource::Nvml(r) => format!(
                "NVLink and P2P from NVML{}",
                r.driver
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

/// Parses the child's JSON.
pub fn parse_report(text: &str) -> NvSource {
    let v: serde_json::Value = match serde_json::from_str(text.trim()) {
        Ok(v) => v,
        Err(e) => return NvSource::Unavailable(format!("unreadable probe output ({e})")),
    };
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return NvSource::Unavailable(e.to_string());
    }
    let busid = |x: &serde_json::Value, k: &str| {
        x.get(k).and_then(|x| x.as_str()).and_then(normalize_busid)
    };
    let mut gpus = Vec::new();
    for g in v
        .get("gpus")
        .and_then(|g| g.as_array())
        .into_iter()
        .flatten()
    {
        let Some(id) = busid(g, "busid") else {
            continue;
        };
        let list = |k: &str| g.get(k).and_then(|l| l.as_array()).into_iter().flatten();
        let nvlinks = list("nvlinks")
            .filter_map(|l| {
                Some(NvLink {
                    target: busid(l, "target")?,
                    count: l.get("count").and_then(|x| x.as_u64()).unwrap_or(0) as u32,
                    tclass: l.get("tclass")?.as_str()?.to_string(),
                })
            })
            .collect();
        let p2p = list("p2p")
            .filter_map(|p| {
                Some(P2p {
                    target: busid(p, "target")?,
                    status: P2pStatus::from_name(p.get("status")?.as_str()?)?,
                })
            })
            .collect();
        gpus.push(NvmlGpu {
            index: g.get("index").and_then(|x| x.as_u64()).unwrap_or(0) as u32,
            busid: id,
            name: g.get("name").and_then(|x| x.as_str()).map(str::to_string),
            sm: g.get("sm").and_then(|x| x.as_u64()).map(|x| x as u32),
            nvlinks,
            p2p,
        });
    }
    NvSource::Nvml(NvmlReport {
        driver: v.get("driver").and_then(|d| d.as_str()).map(str::to_string),
        gpus,
    })
}

/// Runs the NVML probe in a child process.
pub fn probe() -> NvSource {
    match crate::child::run_sub(
        "topo",
        &["--probe-nvml".as_ref()],
        crate::child::CHILD_TIMEOUT,
    ) {
        Ok(out) => parse_report(&out),
        Err(e) => NvSource::Unavailable(e),
    }
}

// ---------------------------------------------------------------- the child

/// `oxccl topo --probe-nvml`: what NVML says (the library's loader), as one
/// JSON line.
pub fn probe_child() -> i32 {
    let v = match oxccl::topo::nvml(true) {
        Ok(r) => serde_json::json!({
            "driver": r.driver,
            "gpus": r.gpus.iter().map(|g| serde_json::json!({
                "index": g.index, "busid": g.busid, "name": g.name, "sm": g.sm,
                "nvlinks": g.nvlinks.iter().map(|l| serde_json::json!({
                    "target": l.target, "count": l.count, "tclass": l.tclass,
                })).collect::<Vec<_>>(),
                "p2p": g.p2p.iter().map(|p| serde_json::json!({
                    "target": p.target, "status": p.status.name(),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }),
        Err(e) => serde_json::json!({ "error": e }),
    };
    println!("{v}");
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl::topo::{GPU_CLASS, HIDDEN_SWITCH, NVSWITCH_CLASS};

    #[test]
    fn report_parsing() {
        let r = parse_report(
            r#"{"driver":"580.1","gpus":[{"index":0,"busid":"00000000:00:06.0","name":"H200","sm":90,
            "nvlinks":[{"target":"00000000:00:07.0","count":18,"tclass":"0x030200"},
                       {"target":"ffff:ff:1f.7","count":2,"tclass":"0x068000"}],
            "p2p":[{"target":"00000000:00:07.0","status":"cns"},{"target":"00000000:00:08.0","status":"?"}]}]}"#,
        );
        let NvSource::Nvml(rep) = &r else {
            panic!("{r:?}")
        };
        let g = &rep.gpus[0];
        assert_eq!(rep.driver.as_deref(), Some("580.1"));
        assert_eq!(g.busid, "0000:00:06.0");
        assert_eq!(g.nvlinks[0].target, "0000:00:07.0");
        assert_eq!(
            (g.nvlinks[0].count, g.nvlinks[0].tclass.as_str()),
            (18, GPU_CLASS)
        );
        assert_eq!(g.nvlinks[1].target, HIDDEN_SWITCH);
        assert_eq!(g.nvlinks[1].tclass, NVSWITCH_CLASS);
        // An unknown status name is left out, not guessed.
        assert_eq!(g.p2p.len(), 1);
        assert_eq!(g.p2p[0].status, P2pStatus::ChipsetNotSupported);
        assert!(matches!(
            parse_report(r#"{"error":"x"}"#),
            NvSource::Unavailable(_)
        ));
        assert!(matches!(parse_report("garbage"), NvSource::Unavailable(_)));
    }
}
