//! What the GPU driver's management library (NVML) says about each GPU and
//! sysfs does not: its NVLinks (to which bus id, how many) and the
//! peer-to-peer status towards the other GPUs. The loader that asks NVML is
//! oxccl-cuda's `nvml` module; here are the facts and how they join the
//! sysfs tree ([`Topology::merge_nvml`]) or come back out of a recorded
//! one ([`NvmlReport::from_topology`], for a machine recorded with
//! `oxccl topo --dump`, where NVML cannot be asked).

use super::{NvLink, P2p, Pci, Topology, GPU_CLASS, NVSWITCH_CLASS};

/// The target recorded for NVLinks to a switch NVML does not name (virtual
/// machines hide NVSwitches): a bus id no real device has (domain ffff,
/// bus ff, device 1f, function 7).
pub const HIDDEN_SWITCH: &str = "ffff:ff:1f.7";

/// What NVML says about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlGpu {
    /// NVML's (and CUDA's, in PCI order) device index.
    pub index: u32,
    /// Normalised bus id (`0000:1b:00.0`).
    pub busid: String,
    pub name: Option<String>,
    /// Compute capability × 10.
    pub sm: Option<u32>,
    /// Bonded NVLinks: to another GPU, an NVSwitch, or [`HIDDEN_SWITCH`].
    pub nvlinks: Vec<NvLink>,
    /// Peer-to-peer read status towards the other GPUs, when asked for.
    pub p2p: Vec<P2p>,
}

/// NVML's view of the machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlReport {
    /// The driver version (`580.95.05`), when NVML says.
    pub driver: Option<String>,
    pub gpus: Vec<NvmlGpu>,
}

/// NVLinks counted per target (`(bus id, active links)`, as NVML lists
/// them link by link) with each target's class: a GPU when it is one of
/// `gpus` (bus ids), else an NVSwitch.
pub fn classify_links(links: &[(String, u32)], gpus: &[&str]) -> Vec<NvLink> {
    links
        .iter()
        .map(|(target, count)| NvLink {
            target: target.clone(),
            count: *count,
            tclass: if gpus.contains(&target.as_str()) {
                GPU_CLASS
            } else {
                NVSWITCH_CLASS
            }
            .into(),
        })
        .collect()
}

impl NvmlReport {
    /// The GPU at `busid` (normalised).
    pub fn gpu(&self, busid: &str) -> Option<&NvmlGpu> {
        self.gpus.iter().find(|g| g.busid == busid)
    }

    /// The NVML part of a recorded topology: every GPU's index, name,
    /// links and P2P status (no driver version: files do not record one).
    pub fn from_topology(t: &Topology) -> NvmlReport {
        NvmlReport {
            driver: None,
            gpus: t
                .gpus()
                .iter()
                .map(|g| NvmlGpu {
                    index: g.gpu.dev,
                    busid: g.pci.busid.clone(),
                    name: g.gpu.name.clone(),
                    sm: g.gpu.sm,
                    nvlinks: g.gpu.nvlinks.clone(),
                    p2p: g.gpu.p2p.clone(),
                })
                .collect(),
        }
    }
}

fn merge_pci(p: &mut Pci, nv: &NvmlReport) {
    if let Some(g) = &mut p.gpu {
        if let Some(n) = nv.gpu(&p.busid) {
            g.dev = n.index;
            g.name = n.name.clone().or(g.name.take());
            g.sm = n.sm.or(g.sm);
            g.nvlinks = n.nvlinks.clone();
            g.p2p = n.p2p.clone();
        }
    }
    for c in &mut p.children {
        merge_pci(c, nv);
    }
}

impl Topology {
    /// Adds NVML's device numbers, names, links and P2P status to the GPUs
    /// sysfs found (matched by bus id; GPUs NVML does not list keep what
    /// sysfs said).
    pub fn merge_nvml(&mut self, nv: &NvmlReport) {
        for c in &mut self.cpus {
            for p in &mut c.pcis {
                merge_pci(p, nv);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::{Cpu, Gpu, P2pStatus};

    fn gpu_pci(busid: &str, dev: u32) -> Pci {
        Pci {
            busid: busid.into(),
            class: GPU_CLASS.into(),
            gpu: Some(Gpu {
                dev,
                name: Some("from sysfs".into()),
                ..Gpu::default()
            }),
            ..Pci::default()
        }
    }

    #[test]
    fn links_are_classified_and_merged_by_bus_id() {
        let a = "0000:00:06.0";
        let b = "0000:00:07.0";
        let links = classify_links(&[(b.into(), 18), (HIDDEN_SWITCH.into(), 4)], &[a, b]);
        assert_eq!(links[0].tclass, GPU_CLASS);
        assert_eq!(links[1].tclass, NVSWITCH_CLASS);
        let bridge = Pci {
            busid: "0000:00:01.0".into(),
            class: "0x060400".into(),
            children: vec![gpu_pci(b, 0)],
            ..Pci::default()
        };
        let mut t = Topology {
            cpus: vec![Cpu {
                pcis: vec![gpu_pci(a, 0), bridge],
                ..Cpu::default()
            }],
        };
        let nv = NvmlReport {
            driver: Some("580.1".into()),
            gpus: vec![NvmlGpu {
                index: 1,
                busid: b.into(),
                name: Some("NVIDIA H200".into()),
                sm: Some(90),
                nvlinks: links.clone(),
                p2p: vec![P2p {
                    target: a.into(),
                    status: P2pStatus::Ok,
                }],
            }],
        };
        t.merge_nvml(&nv);
        let g = t.gpus();
        // The GPU NVML did not list keeps sysfs's facts; the other (under a
        // bridge) takes NVML's index, name, links and P2P.
        assert_eq!(g[0].pci.busid, a);
        assert_eq!(g[0].gpu.name.as_deref(), Some("from sysfs"));
        assert!(g[0].gpu.nvlinks.is_empty());
        assert_eq!(g[1].gpu.dev, 1);
        assert_eq!(g[1].gpu.sm, Some(90));
        assert_eq!(g[1].gpu.nvlinks, links);
        assert_eq!(t.p2p(1, 0), Some(P2pStatus::Ok));
        // Back out of the tree: what a recorded file gives in NVML's place.
        let back = NvmlReport::from_topology(&t);
        assert_eq!(back.driver, None);
        assert_eq!(back.gpus[1], nv.gpus[0]);
    }
}
