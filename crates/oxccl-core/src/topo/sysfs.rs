//! The machine's topology from sysfs, read through [`SysfsView`] (the
//! caller's thin I/O: the machine itself, or a recorded tree under a
//! folder): NUMA nodes from /sys/devices/system/node, the PCI tree from
//! /sys/devices/pci*/ (each device folder named by its bus id, bridges
//! holding their children), GPUs (NVIDIA vendor 0x10de, class 0x0300xx or
//! 0x0302xx) with their link speed and width and their model from
//! /proc/driver/nvidia, NICs from the `net/` and `infiniband/` folders of
//! their PCI device, ACS from a bridge's config space and IOMMU groups from
//! the `iommu_group` link. A missing or unreadable file leaves a field
//! unknown. No I/O here: the walk is a function of what the view returns,
//! so recorded machines test it.

use super::{normalize_busid, Cpu, Gpu, Nic, Pci, Topology};

/// Read access to a machine's files, absolute paths as on the machine
/// (`/sys/devices/...`). Every method answers "nothing" rather than fail.
pub trait SysfsView {
    /// A file's text (`None`: missing, unreadable or not UTF-8).
    fn read(&self, path: &str) -> Option<String>;
    /// A file's bytes (a device's PCI config space).
    fn read_bytes(&self, path: &str) -> Option<Vec<u8>>;
    /// A folder's entry names, sorted (empty when it cannot be read).
    fn list(&self, dir: &str) -> Vec<String>;
    /// The last component of a symbolic link's target (`iommu_group` → `12`).
    fn link_name(&self, path: &str) -> Option<String>;
}

/// Deepest PCI nesting followed (real machines: root port, 2–3 switch levels).
const MAX_PCI_DEPTH: usize = 12;
/// Most device folders visited (a big server has a few hundred PCI functions).
const MAX_DEVICES: usize = 4096;

const NVIDIA: &str = "0x10de";

fn is_gpu_class(class: &str) -> bool {
    class.starts_with("0x0300") || class.starts_with("0x0302")
}

/// ACS control of a bridge from its PCI config space: `Some(true)` when
/// P2P request or completion redirect, or source validation, is on;
/// `None` when the extended space (offset 0x100+, root-only on most kernels)
/// is not readable or has no ACS capability.
pub fn acs_from_config(cfg: &[u8]) -> Option<bool> {
    // Extended capabilities: a chain of 32-bit headers from 0x100:
    // id (16 bits) | version (4) | next offset (12). ACS is id 0x000d; its
    // control register is the 16-bit word at +6 (bit 0 source validation,
    // bit 2 P2P request redirect, bit 3 P2P completion redirect).
    let mut off = 0x100usize;
    for _ in 0..64 {
        let h = cfg.get(off..off + 4)?;
        let hdr = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        if hdr == 0 || hdr == 0xffff_ffff {
            return None;
        }
        if hdr & 0xffff == 0x000d {
            let c = cfg.get(off + 6..off + 8)?;
            let ctl = u16::from_le_bytes([c[0], c[1]]);
            return Some(ctl & 0b1101 != 0);
        }
        let next = (hdr >> 20) as usize & 0xffc;
        if next < 0x100 {
            return None;
        }
        off = next;
    }
    None
}

/// `400 Gb/sec (4X NDR)` → Mb/s.
pub fn ib_rate_mbps(s: &str) -> Option<u64> {
    let mut it = s.split_whitespace();
    let v: f64 = it.next()?.parse().ok()?;
    let unit = it.next()?;
    let mult = if unit.starts_with("Gb") { 1000.0 } else { 1.0 };
    Some((v * mult) as u64)
}

struct Walk<'a> {
    sys: &'a dyn SysfsView,
    visited: usize,
}

impl Walk<'_> {
    fn read(&self, p: &str) -> Option<String> {
        self.sys.read(p).map(|s| s.trim().to_string())
    }

    fn nics(&self, dir: &str) -> Vec<Nic> {
        let mut v = Vec::new();
        for ib in self.sys.list(&format!("{dir}/infiniband")) {
            let ports = self.sys.list(&format!("{dir}/infiniband/{ib}/ports"));
            let port = ports.first().cloned();
            let speed = port.as_ref().and_then(|p| {
                self.read(&format!("{dir}/infiniband/{ib}/ports/{p}/rate"))
                    .and_then(|r| ib_rate_mbps(&r))
            });
            v.push(Nic {
                name: ib,
                dev: 0,
                speed,
                port: port.and_then(|p| p.parse().ok()),
            });
        }
        let mut net_dirs = vec![format!("{dir}/net")];
        for sub in self.sys.list(dir) {
            if sub.starts_with("virtio") {
                net_dirs.push(format!("{dir}/{sub}/net"));
            }
        }
        for nd in net_dirs {
            for n in self.sys.list(&nd) {
                let speed = self
                    .read(&format!("{nd}/{n}/speed"))
                    .and_then(|s| s.parse::<i64>().ok())
                    .filter(|&s| s > 0)
                    .map(|s| s as u64);
                v.push(Nic {
                    name: n,
                    dev: 0,
                    speed,
                    port: None,
                });
            }
        }
        v
    }

    /// The device at `dir` and what is below it; `None` when nothing of
    /// interest (NVIDIA devices, NICs) is there.
    fn device(&mut self, dir: &str, name: &str, depth: usize) -> Option<(Pci, Option<i64>)> {
        self.visited += 1;
        if depth > MAX_PCI_DEPTH || self.visited > MAX_DEVICES {
            return None;
        }
        let busid = normalize_busid(name)?;
        let class = self.read(&format!("{dir}/class")).unwrap_or_default();
        let vendor = self.read(&format!("{dir}/vendor"));
        let mut numa = self
            .read(&format!("{dir}/numa_node"))
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|&n| n >= 0);
        let mut children = Vec::new();
        for sub in self.sys.list(dir) {
            if sub.len() == 12 && normalize_busid(&sub).is_some() {
                if let Some((c, n)) = self.device(&format!("{dir}/{sub}"), &sub, depth + 1) {
                    numa = numa.or(n);
                    children.push(c);
                }
            }
        }
        let nics = if class.starts_with("0x02") {
            self.nics(dir)
        } else {
            Vec::new()
        };
        let nvidia = vendor.as_deref() == Some(NVIDIA);
        let gpu = (nvidia && is_gpu_class(&class)).then(Gpu::default);
        if children.is_empty() && nics.is_empty() && !nvidia {
            return None;
        }
        let acs = if class.starts_with("0x0604") {
            self.sys
                .read_bytes(&format!("{dir}/config"))
                .and_then(|c| acs_from_config(&c))
        } else {
            None
        };
        let iommu_group = self
            .sys
            .link_name(&format!("{dir}/iommu_group"))
            .and_then(|n| n.parse().ok());
        Some((
            Pci {
                busid,
                class,
                vendor,
                device: self.read(&format!("{dir}/device")),
                link_speed: self.read(&format!("{dir}/current_link_speed")),
                link_width: self
                    .read(&format!("{dir}/current_link_width"))
                    .and_then(|w| w.parse().ok())
                    .filter(|&w| w > 0),
                acs,
                iommu_group,
                children,
                gpu,
                nics,
            },
            numa,
        ))
    }
}

fn number_gpus(p: &mut Pci, busids: &[String], names: &dyn Fn(&str) -> Option<String>) {
    if let Some(g) = &mut p.gpu {
        g.dev = busids.iter().position(|b| *b == p.busid).unwrap_or(0) as u32;
        g.name = names(&p.busid);
    }
    for c in &mut p.children {
        number_gpus(c, busids, names);
    }
}

fn gpu_busids(p: &Pci, out: &mut Vec<String>) {
    if p.gpu.is_some() {
        out.push(p.busid.clone());
    }
    for c in &p.children {
        gpu_busids(c, out);
    }
}

/// The machine `sys` shows, without NVLink or P2P (NVML adds those:
/// [`Topology::merge_nvml`]).
pub fn read_topology(sys: &dyn SysfsView) -> Topology {
    let mut cpus: Vec<Cpu> = Vec::new();
    for n in sys.list("/sys/devices/system/node") {
        if let Some(id) = n.strip_prefix("node").and_then(|i| i.parse::<u32>().ok()) {
            cpus.push(Cpu {
                numaid: id,
                affinity: sys
                    .read(&format!("/sys/devices/system/node/{n}/cpulist"))
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty()),
                ..Cpu::default()
            });
        }
    }
    cpus.sort_by_key(|c| c.numaid);
    if cpus.is_empty() {
        cpus.push(Cpu::default());
    }
    let mut w = Walk { sys, visited: 0 };
    for root in sys.list("/sys/devices") {
        if !root.starts_with("pci") {
            continue;
        }
        let rdir = format!("/sys/devices/{root}");
        for sub in sys.list(&rdir) {
            if sub.len() != 12 || normalize_busid(&sub).is_none() {
                continue;
            }
            if let Some((pci, numa)) = w.device(&format!("{rdir}/{sub}"), &sub, 0) {
                // A device with no NUMA node (-1: one node, or a VM) goes to the first.
                let at = numa
                    .and_then(|n| cpus.iter().position(|c| i64::from(c.numaid) == n))
                    .unwrap_or(0);
                cpus[at].pcis.push(pci);
            }
        }
    }
    // CUDA and NVML number GPUs in PCI bus id order.
    let mut busids = Vec::new();
    for c in &cpus {
        for p in &c.pcis {
            gpu_busids(p, &mut busids);
        }
    }
    busids.sort();
    let names = |b: &str| {
        sys.read(&format!("/proc/driver/nvidia/gpus/{b}/information"))
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("Model:").map(|m| m.trim().to_string()))
            })
    };
    for c in &mut cpus {
        for p in &mut c.pcis {
            number_gpus(p, &busids, &names);
        }
    }
    // NIC device numbers in tree order.
    let mut k = 0u32;
    fn renumber(p: &mut Pci, k: &mut u32) {
        for n in &mut p.nics {
            n.dev = *k;
            *k += 1;
        }
        for c in &mut p.children {
            renumber(c, k);
        }
    }
    for c in &mut cpus {
        for p in &mut c.pcis {
            renumber(p, &mut k);
        }
    }
    Topology { cpus }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A machine as a map of files (and links), folders implied by the paths.
    #[derive(Default)]
    struct Files {
        text: BTreeMap<String, String>,
        bytes: BTreeMap<String, Vec<u8>>,
        links: BTreeMap<String, String>,
    }

    impl Files {
        fn file(&mut self, path: &str, text: &str) {
            self.text.insert(path.into(), text.into());
        }
        fn device(&mut self, dir: &str, class: &str, vendor: &str, numa: &str) {
            self.file(&format!("{dir}/class"), &format!("{class}\n"));
            self.file(&format!("{dir}/vendor"), vendor);
            self.file(&format!("{dir}/numa_node"), numa);
        }
    }

    impl SysfsView for Files {
        fn read(&self, path: &str) -> Option<String> {
            self.text.get(path).cloned()
        }
        fn read_bytes(&self, path: &str) -> Option<Vec<u8>> {
            self.bytes.get(path).cloned()
        }
        fn list(&self, dir: &str) -> Vec<String> {
            let pre = format!("{dir}/");
            let mut v: Vec<String> = (self.text.keys())
                .chain(self.bytes.keys())
                .chain(self.links.keys())
                .filter_map(|k| k.strip_prefix(&pre)?.split('/').next())
                .map(str::to_string)
                .collect();
            v.sort();
            v.dedup();
            v
        }
        fn link_name(&self, path: &str) -> Option<String> {
            self.links.get(path).cloned()
        }
    }

    #[test]
    fn a_two_node_machine_from_its_files() {
        let mut f = Files::default();
        f.file("/sys/devices/system/node/node0/cpulist", "0-7\n");
        f.file("/sys/devices/system/node/node1/cpulist", "8-15\n");
        let root = "/sys/devices/pci0000:00";
        // A bridge on node 1 with a GPU below it, ACS on.
        let br = format!("{root}/0000:00:01.0");
        f.device(&br, "0x060400", "0x8086", "1");
        let mut cfg = vec![0u8; 4096];
        cfg[0x100..0x104].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
        cfg[0x106] = 0b0100;
        f.bytes.insert(format!("{br}/config"), cfg);
        let g1 = format!("{br}/0000:01:00.0");
        f.device(&g1, "0x030200", "0x10de", "1");
        f.file(&format!("{g1}/current_link_speed"), "32.0 GT/s PCIe\n");
        f.file(&format!("{g1}/current_link_width"), "16\n");
        f.links.insert(format!("{g1}/iommu_group"), "17".into());
        f.file(
            "/proc/driver/nvidia/gpus/0000:01:00.0/information",
            "Model: \t NVIDIA H200\nIRQ: 5\n",
        );
        // A GPU with no NUMA node (-1) right under the host bridge: the first
        // node; lower bus id, so device 0.
        f.device(&format!("{root}/0000:00:05.0"), "0x030000", "0x10de", "-1");
        // A NIC with a port of unknown speed and an InfiniBand device.
        let nic = format!("{root}/0000:00:08.0");
        f.device(&nic, "0x020000", "0x15b3", "0");
        f.file(&format!("{nic}/net/eth0/speed"), "-1");
        f.file(
            &format!("{nic}/infiniband/mlx5_0/ports/1/rate"),
            "400 Gb/sec (4X NDR)",
        );
        // A device of no interest (not NVIDIA, no NIC, no children): left out.
        f.device(&format!("{root}/0000:00:09.0"), "0x010802", "0x144d", "0");
        // Not bus ids: skipped.
        f.file(&format!("{root}/power/control"), "auto");

        let t = read_topology(&f);
        assert_eq!(t.cpus.len(), 2);
        assert_eq!(t.cpus[0].affinity.as_deref(), Some("0-7"));
        let busids =
            |c: usize| -> Vec<&str> { t.cpus[c].pcis.iter().map(|p| p.busid.as_str()).collect() };
        assert_eq!(busids(0), ["0000:00:05.0", "0000:00:08.0"]);
        assert_eq!(busids(1), ["0000:00:01.0"]);
        let bridge = &t.cpus[1].pcis[0];
        assert_eq!(bridge.acs, Some(true));
        let gpu = &bridge.children[0];
        assert_eq!(gpu.gpu.as_ref().unwrap().dev, 1);
        assert_eq!(
            gpu.gpu.as_ref().unwrap().name.as_deref(),
            Some("NVIDIA H200")
        );
        assert_eq!(gpu.link_width, Some(16));
        assert_eq!(gpu.iommu_group, Some(17));
        assert_eq!(t.cpus[0].pcis[0].gpu.as_ref().unwrap().dev, 0);
        let nics = &t.cpus[0].pcis[1].nics;
        assert_eq!(
            nics.iter()
                .map(|n| (n.name.as_str(), n.dev, n.speed, n.port))
                .collect::<Vec<_>>(),
            [
                ("mlx5_0", 0, Some(400_000), Some(1)),
                ("eth0", 1, None, None)
            ]
        );
        let sites: Vec<_> = t.gpus().iter().map(|g| g.site()).collect();
        assert_eq!(sites[1].numaid, 1);
        assert_eq!(sites[1].bridges, ["0000:00:01.0"]);
        // Nothing readable: one node, no devices.
        let empty = read_topology(&Files::default());
        assert_eq!(empty.cpus.len(), 1);
        assert!(empty.gpus().is_empty());
    }

    #[test]
    fn acs_capability() {
        let mut cfg = vec![0u8; 4096];
        // AER at 0x100 pointing to ACS at 0x148.
        cfg[0x100..0x104].copy_from_slice(&(0x0001u32 | (1 << 16) | (0x148 << 20)).to_le_bytes());
        cfg[0x148..0x14c].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
        assert_eq!(acs_from_config(&cfg), Some(false));
        cfg[0x14e] = 0b0001_1101;
        assert_eq!(acs_from_config(&cfg), Some(true));
        assert_eq!(acs_from_config(&cfg[..256]), None);
        // A loop in the chain ends.
        let mut lp = vec![0u8; 4096];
        lp[0x100..0x104].copy_from_slice(&(0x0001u32 | (0x100 << 20)).to_le_bytes());
        assert_eq!(acs_from_config(&lp), None);
    }

    #[test]
    fn ib_rate() {
        assert_eq!(ib_rate_mbps("400 Gb/sec (4X NDR)"), Some(400_000));
        assert_eq!(ib_rate_mbps("junk"), None);
    }
}
