//! The topology model: CPUs (NUMA nodes), the PCI tree under each, GPUs with
//! their NVLinks and peer-to-peer status, and NICs; its XML form (in the
//! spirit of NCCL's `NCCL_TOPO_DUMP_FILE` / `NCCL_TOPO_FILE`), the path
//! between two GPUs as `nvidia-smi topo -m` names it, and the ring order and
//! trees planned over the GPUs. Pure: built from sysfs ([`sysfs`], through
//! the caller's thin file access) and NVML ([`gpu_facts`]), or read from a
//! recorded file, so a recorded machine can be planned for on a laptop.
//!
//! XML shape (elements and attributes this reads; others are skipped, so a
//! file NCCL wrote loads too):
//!
//! ```text
//! <system version="1">
//!   <cpu numaid="0" affinity="0-31">
//!     <pci busid="0000:17:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16" acs="1">
//!       <pci busid="0000:18:00.0" class="0x030200" vendor="0x10de" device="0x2335" link_speed=".." link_width="16">
//!         <gpu dev="0" sm="90" rank="0" name="NVIDIA H200">
//!           <nvlink target="0000:19:00.0" count="18" tclass="0x030200"/>
//!           <p2p target="0000:19:00.0" status="ok"/>
//!         </gpu>
//!       </pci>
//!     </pci>
//!     <nic><net name="mlx5_0" dev="0" speed="400000" port="1"/></nic>
//!   </cpu>
//! </system>
//! ```
//!
//! `<p2p>` and `acs` are oxccl's additions (NVML's P2P status; ACS from the
//! bridge's PCI config space). An NVLink whose `tclass` is `0x068000` ends
//! at an NVSwitch: two GPUs that both reach NVSwitches talk at the smaller of
//! their link counts.

pub mod gpu_facts;
pub mod sysfs;
pub mod xml;

use std::fmt;

pub use gpu_facts::{NvmlGpu, NvmlReport, HIDDEN_SWITCH};
pub use sysfs::{read_topology, SysfsView};
pub use xml::{Element, XmlError};

/// PCI class of a GPU as NVLink targets record it (3D controller, 0x0302).
pub const GPU_CLASS: &str = "0x030200";

/// PCI class of an NVSwitch (a bridge of class "other", 0x0680).
pub const NVSWITCH_CLASS: &str = "0x068000";

/// A whole machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    pub cpus: Vec<Cpu>,
}

/// One NUMA node (a CPU socket, or a part of one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cpu {
    pub numaid: u32,
    /// Its CPUs as the kernel lists them (`0-31,64-95`).
    pub affinity: Option<String>,
    /// PCI devices whose upstream is this node's host bridges.
    pub pcis: Vec<Pci>,
    /// Network devices that are not (known to be) on a PCI device.
    pub nics: Vec<Nic>,
}

/// A PCI device: a bridge (with children), a GPU, a NIC, or something else.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pci {
    /// `dddd:bb:dd.f`, lower case.
    pub busid: String,
    /// `0x030200` (3D controller), `0x060400` (PCI bridge)...
    pub class: String,
    pub vendor: Option<String>,
    pub device: Option<String>,
    /// `32.0 GT/s PCIe` as sysfs writes it.
    pub link_speed: Option<String>,
    pub link_width: Option<u32>,
    /// ACS source validation or P2P redirection on (a bridge), when known.
    pub acs: Option<bool>,
    /// The IOMMU group, when known.
    pub iommu_group: Option<u32>,
    pub children: Vec<Pci>,
    pub gpu: Option<Gpu>,
    pub nics: Vec<Nic>,
}

/// A GPU (inside its PCI device).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gpu {
    /// CUDA/NVML device index.
    pub dev: u32,
    /// Compute capability × 10 (90 for Hopper).
    pub sm: Option<u32>,
    pub rank: Option<u32>,
    pub name: Option<String>,
    pub nvlinks: Vec<NvLink>,
    /// NVML's peer-to-peer read status towards other GPUs.
    pub p2p: Vec<P2p>,
}

/// A bonded set of NVLinks from a GPU to one target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvLink {
    pub target: String,
    pub count: u32,
    /// The target's PCI class (a GPU's `0x030200`, an NVSwitch's `0x068000`).
    pub tclass: String,
}

/// Peer-to-peer status towards one GPU, as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct P2p {
    pub target: String,
    pub status: P2pStatus,
}

/// NVML's `nvmlGpuP2PStatus_t`, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2pStatus {
    Ok,
    /// Chipset not supported: typically ACS redirecting peer traffic to the root complex.
    ChipsetNotSupported,
    GpuNotSupported,
    /// IOH topology not supported.
    TopologyNotSupported,
    DisabledByRegkey,
    NotSupported,
    Unknown,
}

impl P2pStatus {
    /// The XML / report name.
    pub fn name(self) -> &'static str {
        match self {
            P2pStatus::Ok => "ok",
            P2pStatus::ChipsetNotSupported => "cns",
            P2pStatus::GpuNotSupported => "gns",
            P2pStatus::TopologyNotSupported => "tns",
            P2pStatus::DisabledByRegkey => "disabled",
            P2pStatus::NotSupported => "ns",
            P2pStatus::Unknown => "unknown",
        }
    }
    pub fn from_name(s: &str) -> Option<P2pStatus> {
        Some(match s {
            "ok" => P2pStatus::Ok,
            "cns" => P2pStatus::ChipsetNotSupported,
            "gns" => P2pStatus::GpuNotSupported,
            "tns" => P2pStatus::TopologyNotSupported,
            "disabled" => P2pStatus::DisabledByRegkey,
            "ns" => P2pStatus::NotSupported,
            "unknown" => P2pStatus::Unknown,
            _ => return None,
        })
    }
    /// From NVML's enum value (`NVML_P2P_STATUS_OK` = 0 ...).
    pub fn from_nvml(v: u32) -> P2pStatus {
        match v {
            0 => P2pStatus::Ok,
            1 => P2pStatus::ChipsetNotSupported,
            2 => P2pStatus::GpuNotSupported,
            3 => P2pStatus::TopologyNotSupported,
            4 => P2pStatus::DisabledByRegkey,
            5 => P2pStatus::NotSupported,
            _ => P2pStatus::Unknown,
        }
    }
}

/// A network device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nic {
    /// `mlx5_0`, `eth0`.
    pub name: String,
    pub dev: u32,
    /// Mb/s (NCCL's unit), when known.
    pub speed: Option<u64>,
    pub port: Option<u32>,
}

/// `00000000:1B:00.0` (NVML) or `0000:1b:00.0` → `0000:1b:00.0`; `None` when it is no bus id.
pub fn normalize_busid(s: &str) -> Option<String> {
    let s = s.trim();
    let (rest, func) = s.rsplit_once('.')?;
    let mut parts = rest.rsplit(':');
    let dev = parts.next()?;
    let bus = parts.next()?;
    let dom = parts.next().unwrap_or("0");
    if parts.next().is_some() || dev.len() > 2 || bus.len() > 2 || dom.len() > 8 || func.len() != 1
    {
        return None;
    }
    let h = |x: &str| u32::from_str_radix(x, 16).ok().filter(|_| !x.is_empty());
    let (dom, bus, dev, func) = (h(dom)?, h(bus)?, h(dev)?, h(func)?);
    if dom > 0xffff || dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{dom:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// How two GPUs reach each other, best first (the order of `nvidia-smi topo -m`'s legend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Path {
    /// The GPU itself.
    Itself,
    /// A bonded set of this many NVLinks (direct or through NVSwitches).
    Nv(u32),
    /// At most one PCIe bridge (one switch).
    Pix,
    /// Several PCIe bridges, not through the host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Between host bridges of one NUMA node.
    Node,
    /// Across NUMA nodes (the SMP interconnect).
    Sys,
}

impl Path {
    /// Whether the two ends talk over NVLink.
    pub fn is_nvlink(self) -> bool {
        matches!(self, Path::Nv(_))
    }
    /// A score for ring building: more is better. NVLink counts dominate
    /// (each link ~26 GB/s on H100/H200, against ~55 GB/s for a whole x16
    /// Gen5 PCIe path), then PCIe paths by how far they climb.
    fn score(self) -> u64 {
        match self {
            Path::Itself => 0,
            Path::Nv(n) => 1000 + 100 * u64::from(n),
            Path::Pix => 50,
            Path::Pxb => 40,
            Path::Phb => 30,
            Path::Node => 20,
            Path::Sys => 10,
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Itself => f.write_str("X"),
            Path::Nv(n) => write!(f, "NV{n}"),
            Path::Pix => f.write_str("PIX"),
            Path::Pxb => f.write_str("PXB"),
            Path::Phb => f.write_str("PHB"),
            Path::Node => f.write_str("NODE"),
            Path::Sys => f.write_str("SYS"),
        }
    }
}

/// A GPU with where it sits, flattened out of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuAt<'a> {
    pub pci: &'a Pci,
    pub gpu: &'a Gpu,
    pub numaid: u32,
    /// The bridges from the top of the CPU's tree down to the GPU (exclusive).
    pub bridges: Vec<&'a Pci>,
}

fn collect<'a>(pci: &'a Pci, numaid: u32, up: &mut Vec<&'a Pci>, out: &mut Vec<GpuAt<'a>>) {
    if let Some(g) = &pci.gpu {
        out.push(GpuAt {
            pci,
            gpu: g,
            numaid,
            bridges: up.clone(),
        });
    }
    up.push(pci);
    for c in &pci.children {
        collect(c, numaid, up, out);
    }
    up.pop();
}

impl Topology {
    /// Every GPU, ordered by device index (then bus id).
    pub fn gpus(&self) -> Vec<GpuAt<'_>> {
        let mut out = Vec::new();
        for c in &self.cpus {
            for p in &c.pcis {
                collect(p, c.numaid, &mut Vec::new(), &mut out);
            }
        }
        out.sort_by(|a, b| (a.gpu.dev, &a.pci.busid).cmp(&(b.gpu.dev, &b.pci.busid)));
        out
    }

    /// Every NIC with its NUMA node.
    pub fn nics(&self) -> Vec<(u32, &Nic)> {
        fn walk<'a>(p: &'a Pci, numa: u32, out: &mut Vec<(u32, &'a Nic)>) {
            out.extend(p.nics.iter().map(|n| (numa, n)));
            for c in &p.children {
                walk(c, numa, out);
            }
        }
        let mut out = Vec::new();
        for c in &self.cpus {
            out.extend(c.nics.iter().map(|n| (c.numaid, n)));
            for p in &c.pcis {
                walk(p, c.numaid, &mut out);
            }
        }
        out
    }

    /// The GPU-to-GPU path matrix, indexed like [`Topology::gpus`].
    pub fn matrix(&self) -> Vec<Vec<Path>> {
        let g = self.gpus();
        g.iter()
            .enumerate()
            .map(|(i, a)| {
                g.iter()
                    .enumerate()
                    .map(|(j, b)| if i == j { Path::Itself } else { path(a, b) })
                    .collect()
            })
            .collect()
    }

    /// NVML's P2P status from GPU `a` to GPU `b` (indices of [`Topology::gpus`]).
    pub fn p2p(&self, a: usize, b: usize) -> Option<P2pStatus> {
        let g = self.gpus();
        let (x, y) = (g.get(a)?, g.get(b)?);
        x.gpu
            .p2p
            .iter()
            .find(|p| p.target == y.pci.busid)
            .map(|p| p.status)
    }
}

/// One GPU as the path rule sees it: what a rank can learn about its own GPU
/// at run time (sysfs and NVML) and send to the others, or what
/// [`GpuAt::site`] reads out of a machine's tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuSite {
    /// `dddd:bb:dd.f`, lower case.
    pub busid: String,
    pub numaid: u32,
    /// Bus ids of the bridges from the top of the CPU's tree down to the GPU (exclusive).
    pub bridges: Vec<String>,
    pub nvlinks: Vec<NvLink>,
}

impl GpuAt<'_> {
    /// This GPU as [`site_path`] sees it.
    pub fn site(&self) -> GpuSite {
        GpuSite {
            busid: self.pci.busid.clone(),
            numaid: self.numaid,
            bridges: self.bridges.iter().map(|p| p.busid.clone()).collect(),
            nvlinks: self.gpu.nvlinks.clone(),
        }
    }
}

/// NVLinks from `a` that end at `b` directly, or at NVSwitches when `b` reaches them too.
fn nvlinks(a: &GpuSite, b: &GpuSite) -> u32 {
    let direct: u32 = a
        .nvlinks
        .iter()
        .filter(|l| l.target == b.busid)
        .map(|l| l.count)
        .sum();
    if direct > 0 {
        return direct;
    }
    let sw = |g: &GpuSite| -> u32 {
        g.nvlinks
            .iter()
            .filter(|l| l.tclass == NVSWITCH_CLASS)
            .map(|l| l.count)
            .sum()
    };
    sw(a).min(sw(b))
}

/// The path between two GPUs (see [`Path`]).
pub fn path(a: &GpuAt<'_>, b: &GpuAt<'_>) -> Path {
    site_path(&a.site(), &b.site())
}

/// The path between two GPUs given as sites; one GPU (two ranks sharing
/// it) is [`Path::Itself`].
pub fn site_path(a: &GpuSite, b: &GpuSite) -> Path {
    if a.busid == b.busid {
        return Path::Itself;
    }
    let nv = nvlinks(a, b).max(nvlinks(b, a));
    if nv > 0 {
        return Path::Nv(nv);
    }
    if a.numaid != b.numaid {
        return Path::Sys;
    }
    let common = a
        .bridges
        .iter()
        .zip(&b.bridges)
        .take_while(|(x, y)| x == y)
        .count();
    if common == 0 {
        // Different top-level devices of one node: different root ports or host bridges.
        let top = |g: &GpuSite| g.bridges.first().unwrap_or(&g.busid).clone();
        let root_bus = |s: String| s.get(..7).map(str::to_string);
        return if root_bus(top(a)) == root_bus(top(b)) {
            Path::Phb
        } else {
            Path::Node
        };
    }
    // Bridges crossed below the common one: a switch's downstream ports
    // (one per side) and nothing else is "one switch" (PIX).
    let below = (a.bridges.len() - common) + (b.bridges.len() - common);
    if common == 1 && a.bridges.len() == 1 && b.bridges.len() == 1 {
        // Both directly under one root port.
        Path::Pix
    } else if common == 1 {
        // Only the root port is shared: the traffic turns at the host bridge.
        Path::Phb
    } else if below <= 2 {
        Path::Pix
    } else {
        Path::Pxb
    }
}

/// A PCI device given by its sysfs path (a network plugin's `pciPath`,
/// e.g. `/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0`) as a site:
/// the last PCI address in the path is the device, the ones before it the
/// bridges above it; `None` when the path names no PCI address. Compared
/// with a GPU's site by [`site_path`], this is the GPU-to-NIC distance.
pub fn pci_path_site(path: &str, numaid: u32) -> Option<GpuSite> {
    let mut ids: Vec<String> = path.split('/').filter_map(normalize_busid).collect();
    let busid = ids.pop()?;
    Some(GpuSite {
        busid,
        numaid,
        bridges: ids,
        nvlinks: Vec::new(),
    })
}

/// `NCCL_CROSS_NIC`: whether the two ends of a channel's network
/// connection may use NICs of different indices on their hosts. On a
/// rail-optimised fabric NIC i of every host hangs off switch i (rail i),
/// and a connection from NIC i to NIC j != i crosses rails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CrossNic {
    /// `0`: channel `c` uses the same NIC index on every host (the `c`-th
    /// usable NIC, modulo their number), however near each is: rails are
    /// never crossed.
    Aligned,
    /// `1`: each rank takes the NICs nearest to it, channel `c` on the
    /// `(local + c)`-th of them; the two ends may use different indices.
    Allowed,
    /// `2` (the default): rail-aligned when that costs no distance (every
    /// usable NIC is as near as the nearest), otherwise as `1`.
    #[default]
    PreferAligned,
}

impl CrossNic {
    /// The `NCCL_CROSS_NIC` value: 0, 1 or 2.
    pub fn value(self) -> u8 {
        match self {
            CrossNic::Aligned => 0,
            CrossNic::Allowed => 1,
            CrossNic::PreferAligned => 2,
        }
    }
}

/// Which NIC each of a rank's `nch` channels uses, by `cross`
/// ([`CrossNic`]). `site` is where the rank sits (its GPU, or for host
/// buffers its NUMA node); `nics`: (device index, site or `None`), the same
/// list in the same order on every host. Distances are [`site_path`]'s; a
/// NIC without a known place counts as the farthest (`Sys`).
///
/// Rail-aligned (`0`, and `2` when every NIC is equally near): channel `c`
/// on `nics[c % nics.len()]`, so both ends of a channel's connection use
/// the same index. Otherwise the NICs nearest to the rank, channel `c` on
/// the `(first + c)`-th of them, where `first` is `local` (the rank's index
/// among its host's ranks) modulo their number, so ranks sharing a set of
/// equally near NICs start on different ones and each rank's channels
/// spread over all of them. Empty when `nics` is.
pub fn nic_per_channel(
    site: &GpuSite,
    nics: &[(usize, Option<GpuSite>)],
    local: usize,
    nch: u32,
    cross: CrossNic,
) -> Vec<usize> {
    let dist = |s: &Option<GpuSite>| s.as_ref().map_or(Path::Sys, |n| site_path(site, n));
    let Some(best) = nics.iter().map(|(_, s)| dist(s)).min() else {
        return Vec::new();
    };
    let near: Vec<usize> = nics
        .iter()
        .filter(|(_, s)| dist(s) == best)
        .map(|(d, _)| *d)
        .collect();
    let aligned = match cross {
        CrossNic::Aligned => true,
        CrossNic::Allowed => false,
        CrossNic::PreferAligned => near.len() == nics.len(),
    };
    if aligned {
        return (0..nch as usize).map(|c| nics[c % nics.len()].0).collect();
    }
    let first = local % near.len();
    (0..nch as usize)
        .map(|c| near[(first + c) % near.len()])
        .collect()
}

/// The CPUs of a kernel CPU list (`0-3,8,10-11`, as in
/// `/sys/devices/system/node/node0/cpulist`); `None` when malformed.
pub fn parse_cpulist(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// The NUMA node that holds every CPU a process may run on (`affinity`),
/// among `nodes` (node id, its CPUs); `None` when the CPUs span several
/// nodes, or some CPU is in none, or nothing is known.
pub fn numa_node_of(affinity: &[u32], nodes: &[(u32, Vec<u32>)]) -> Option<u32> {
    let first = *affinity.first()?;
    let (id, cpus) = nodes.iter().find(|(_, c)| c.contains(&first))?;
    affinity.iter().all(|c| cpus.contains(c)).then_some(*id)
}

/// Host memory on NUMA node `numaid` as a site for [`nic_per_channel`]: a
/// NIC on that node is `Node` away, one on another node `Sys`.
pub fn numa_site(numaid: u32) -> GpuSite {
    GpuSite {
        numaid,
        ..GpuSite::default()
    }
}

/// The INFO line (subsystem NET) that says which device each channel of
/// `who` ("GPU 0000:19:00.0", "rank 3") uses on network `net`: the GPU
/// ring and the host path print the same words.
pub fn nic_channels_line(who: &str, net: &str, devs: &[usize], cross: CrossNic) -> String {
    let mut used: Vec<usize> = devs.to_vec();
    used.sort_unstable();
    used.dedup();
    let list = |v: &[usize], sep: &str| {
        v.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(sep)
    };
    format!(
        "{who} ({} channels) uses NET/{net} device{} {}; by channel: {} (NCCL_CROSS_NIC={})",
        devs.len(),
        if used.len() == 1 { "" } else { "s" },
        list(&used, ", "),
        list(devs, " "),
        cross.value()
    )
}

/// The ring order over ranks whose GPUs are `sites`, with `host[r]` naming
/// rank r's host: hosts in the order of their first rank, each host's ranks
/// together (one network crossing per host boundary), and within a host the
/// order [`best_ring`] picks from the path matrix, starting at the host's
/// first rank. Two ranks sharing a GPU count as the farthest pair (`Sys`),
/// so a ring puts real links between neighbours where it can.
pub fn rank_ring(sites: &[GpuSite], host: &[u64]) -> Vec<usize> {
    let n = sites.len().min(host.len());
    let mut hosts: Vec<u64> = Vec::new();
    for &h in &host[..n] {
        if !hosts.contains(&h) {
            hosts.push(h);
        }
    }
    let mut order = Vec::with_capacity(n);
    for h in hosts {
        let ranks: Vec<usize> = (0..n).filter(|&r| host[r] == h).collect();
        let m: Vec<Vec<Path>> = ranks
            .iter()
            .map(|&a| {
                ranks
                    .iter()
                    .map(|&b| match site_path(&sites[a], &sites[b]) {
                        Path::Itself if a != b => Path::Sys,
                        p => p,
                    })
                    .collect()
            })
            .collect();
        order.extend(best_ring(&m).into_iter().map(|i| ranks[i]));
    }
    order
}

/// Bridges with ACS on that lie on the path between two GPUs of one PCI tree
/// (below their common ancestor, or the ancestor itself): these redirect
/// peer-to-peer traffic up to the root complex.
pub fn acs_between<'a>(a: &GpuAt<'a>, b: &GpuAt<'a>) -> Vec<&'a Pci> {
    let common = a
        .bridges
        .iter()
        .zip(&b.bridges)
        .take_while(|(x, y)| x.busid == y.busid)
        .count();
    if common == 0 {
        return Vec::new();
    }
    let mut v: Vec<&Pci> = Vec::new();
    for p in a.bridges[common - 1..].iter().chain(&b.bridges[common..]) {
        if p.acs == Some(true) && !v.iter().any(|q| q.busid == p.busid) {
            v.push(p);
        }
    }
    v
}

/// A ring over `n` GPUs (indices of the matrix) that maximises the sum of
/// link scores between neighbours (NVLink first). Exact for up to 9 GPUs
/// (8! = 40,320 orders with the first fixed), greedy from GPU 0 beyond; ties
/// keep the lower indices first, so the identity wins when all links are equal.
pub fn best_ring(m: &[Vec<Path>]) -> Vec<usize> {
    let n = m.len();
    if n <= 2 {
        return (0..n).collect();
    }
    let score = |a: usize, b: usize| {
        m.get(a)
            .and_then(|r| r.get(b))
            .map_or(0, |p| p.score())
            .min(m.get(b).and_then(|r| r.get(a)).map_or(0, |p| p.score()))
    };
    let ring_score = |o: &[usize]| -> u64 {
        (0..o.len())
            .map(|i| score(o[i], o[(i + 1) % o.len()]))
            .sum()
    };
    if n <= 9 {
        let mut best: Vec<usize> = (0..n).collect();
        let mut best_s = ring_score(&best);
        let mut cur: Vec<usize> = (0..n).collect();
        // Heap's algorithm over positions 1..n (GPU 0 stays first: rotations
        // of a ring are the same ring).
        let m = n - 1;
        let mut c = vec![0usize; m];
        let mut i = 1;
        while i < m {
            if c[i] < i {
                let k = if i % 2 == 0 { 0 } else { c[i] };
                cur.swap(1 + k, 1 + i);
                let s = ring_score(&cur);
                if s > best_s {
                    best_s = s;
                    best.clone_from(&cur);
                }
                c[i] += 1;
                i = 1;
            } else {
                c[i] = 0;
                i += 1;
            }
        }
        return best;
    }
    let mut order = vec![0usize];
    let mut left: Vec<usize> = (1..n).collect();
    while !left.is_empty() {
        let last = *order.last().unwrap_or(&0);
        let (k, _) = left
            .iter()
            .enumerate()
            .max_by_key(|(k, &j)| (score(last, j), std::cmp::Reverse(*k)))
            .unwrap_or((0, &0));
        order.push(left.remove(k));
    }
    order
}

/// Parent and children of rank position `pos` in the heap-ordered binary
/// tree over `order` that the tree schedule builds
/// (`schedule::Shaped::Tree`: node k's children are 2k+1 and 2k+2; the
/// second tree of the double tree is the same over the reversed order).
pub fn tree_links(order: &[usize], pos: usize) -> (Option<usize>, Vec<usize>) {
    let parent = (pos > 0 && pos < order.len()).then(|| order[(pos - 1) / 2]);
    let children = [2 * pos + 1, 2 * pos + 2]
        .into_iter()
        .filter(|&c| c < order.len())
        .map(|c| order[c])
        .collect();
    (parent, children)
}

// ---------------------------------------------------------------- XML

/// A bad topology file: XML syntax, or an element missing what it needs.
pub type TopoError = XmlError;

fn bad(e: &Element, msg: impl fmt::Display) -> TopoError {
    XmlError {
        line: e.line,
        msg: format!("<{}>: {msg}", e.name),
    }
}

fn req<'a>(e: &'a Element, k: &str) -> Result<&'a str, TopoError> {
    e.attr(k)
        .ok_or_else(|| bad(e, format!("missing attribute '{k}'")))
}

fn num<T: std::str::FromStr>(e: &Element, k: &str) -> Result<Option<T>, TopoError> {
    match e.attr(k) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| bad(e, format!("attribute {k}=\"{v}\" is not a number"))),
    }
}

fn busid_attr(e: &Element, k: &str) -> Result<String, TopoError> {
    let v = req(e, k)?;
    normalize_busid(v)
        .ok_or_else(|| bad(e, format!("{k}=\"{v}\" is not a PCI bus id (dddd:bb:dd.f)")))
}

fn nic_from(e: &Element, out: &mut Vec<Nic>) -> Result<(), TopoError> {
    for n in e.children.iter().filter(|c| c.name == "net") {
        out.push(Nic {
            name: req(n, "name")?.to_string(),
            dev: num(n, "dev")?.unwrap_or(out.len() as u32),
            speed: num(n, "speed")?,
            port: num(n, "port")?,
        });
    }
    Ok(())
}

fn gpu_from(e: &Element) -> Result<Gpu, TopoError> {
    let mut g = Gpu {
        dev: num(e, "dev")?.ok_or_else(|| bad(e, "missing attribute 'dev'"))?,
        sm: num(e, "sm")?,
        rank: num(e, "rank")?,
        name: e.attr("name").map(str::to_string),
        ..Gpu::default()
    };
    for c in &e.children {
        match c.name.as_str() {
            "nvlink" => g.nvlinks.push(NvLink {
                target: busid_attr(c, "target")?,
                count: num(c, "count")?.ok_or_else(|| bad(c, "missing attribute 'count'"))?,
                tclass: c.attr("tclass").unwrap_or(GPU_CLASS).to_string(),
            }),
            "p2p" => {
                let s = req(c, "status")?;
                g.p2p.push(P2p {
                    target: busid_attr(c, "target")?,
                    status: P2pStatus::from_name(s).ok_or_else(|| {
                        bad(c, format!("status=\"{s}\" is not one of ok, cns, gns, tns, disabled, ns, unknown"))
                    })?,
                });
            }
            _ => {}
        }
    }
    Ok(g)
}

fn pci_from(e: &Element) -> Result<Pci, TopoError> {
    let mut p = Pci {
        busid: busid_attr(e, "busid")?,
        class: e.attr("class").unwrap_or("").to_string(),
        vendor: e.attr("vendor").map(str::to_string),
        device: e.attr("device").map(str::to_string),
        link_speed: e.attr("link_speed").map(str::to_string),
        link_width: num(e, "link_width")?,
        acs: match e.attr("acs") {
            None => None,
            Some("1") => Some(true),
            Some("0") => Some(false),
            Some(v) => return Err(bad(e, format!("acs=\"{v}\" is not 0 or 1"))),
        },
        iommu_group: num(e, "iommu_group")?,
        ..Pci::default()
    };
    for c in &e.children {
        match c.name.as_str() {
            "pci" => p.children.push(pci_from(c)?),
            "gpu" => {
                if p.gpu.is_some() {
                    return Err(bad(c, "a second <gpu> in one <pci>"));
                }
                p.gpu = Some(gpu_from(c)?);
            }
            "nic" => nic_from(c, &mut p.nics)?,
            _ => {}
        }
    }
    Ok(p)
}

impl Topology {
    /// Reads a topology file.
    pub fn from_xml(text: &str) -> Result<Topology, TopoError> {
        let root = xml::parse(text)?;
        if root.name != "system" {
            return Err(bad(&root, "the root element must be <system>"));
        }
        let mut t = Topology::default();
        for c in root.children.iter().filter(|c| c.name == "cpu") {
            let mut cpu = Cpu {
                numaid: num(c, "numaid")?.unwrap_or(t.cpus.len() as u32),
                affinity: c.attr("affinity").map(str::to_string),
                ..Cpu::default()
            };
            for k in &c.children {
                match k.name.as_str() {
                    "pci" => cpu.pcis.push(pci_from(k)?),
                    "nic" => nic_from(k, &mut cpu.nics)?,
                    _ => {}
                }
            }
            t.cpus.push(cpu);
        }
        // Device indices and bus ids must be unique for the matrix to mean anything.
        let g = t.gpus();
        for w in g.windows(2) {
            if w[0].gpu.dev == w[1].gpu.dev {
                return Err(XmlError {
                    line: 1,
                    msg: format!(
                        "two GPUs with dev=\"{}\" ({} and {})",
                        w[0].gpu.dev, w[0].pci.busid, w[1].pci.busid
                    ),
                });
            }
        }
        Ok(t)
    }

    /// The topology as an XML document.
    pub fn to_xml(&self) -> String {
        fn nic_el(nics: &[Nic]) -> Element {
            let mut e = Element::new("nic");
            for n in nics {
                let mut x = Element::new("net").with("name", &n.name).with("dev", n.dev);
                if let Some(s) = n.speed {
                    x = x.with("speed", s);
                }
                if let Some(p) = n.port {
                    x = x.with("port", p);
                }
                e.children.push(x);
            }
            e
        }
        fn pci_el(p: &Pci) -> Element {
            let mut e = Element::new("pci")
                .with("busid", &p.busid)
                .with("class", &p.class);
            if let Some(v) = &p.vendor {
                e = e.with("vendor", v);
            }
            if let Some(v) = &p.device {
                e = e.with("device", v);
            }
            if let Some(v) = &p.link_speed {
                e = e.with("link_speed", v);
            }
            if let Some(v) = p.link_width {
                e = e.with("link_width", v);
            }
            if let Some(v) = p.acs {
                e = e.with("acs", u8::from(v));
            }
            if let Some(v) = p.iommu_group {
                e = e.with("iommu_group", v);
            }
            if let Some(g) = &p.gpu {
                let mut ge = Element::new("gpu").with("dev", g.dev);
                if let Some(v) = g.sm {
                    ge = ge.with("sm", v);
                }
                if let Some(v) = g.rank {
                    ge = ge.with("rank", v);
                }
                if let Some(v) = &g.name {
                    ge = ge.with("name", v);
                }
                for l in &g.nvlinks {
                    ge.children.push(
                        Element::new("nvlink")
                            .with("target", &l.target)
                            .with("count", l.count)
                            .with("tclass", &l.tclass),
                    );
                }
                for q in &g.p2p {
                    ge.children.push(
                        Element::new("p2p")
                            .with("target", &q.target)
                            .with("status", q.status.name()),
                    );
                }
                e.children.push(ge);
            }
            if !p.nics.is_empty() {
                e.children.push(nic_el(&p.nics));
            }
            for c in &p.children {
                e.children.push(pci_el(c));
            }
            e
        }
        let mut root = Element::new("system").with("version", 1);
        for c in &self.cpus {
            let mut ce = Element::new("cpu").with("numaid", c.numaid);
            if let Some(a) = &c.affinity {
                ce = ce.with("affinity", a);
            }
            for p in &c.pcis {
                ce.children.push(pci_el(p));
            }
            if !c.nics.is_empty() {
                ce.children.push(nic_el(&c.nics));
            }
            root.children.push(ce);
        }
        xml::write(&root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_pci(bus: &str, dev: u32, links: &[(&str, u32, &str)]) -> Pci {
        Pci {
            busid: bus.into(),
            class: "0x030200".into(),
            gpu: Some(Gpu {
                dev,
                nvlinks: links
                    .iter()
                    .map(|(t, c, k)| NvLink {
                        target: (*t).into(),
                        count: *c,
                        tclass: (*k).into(),
                    })
                    .collect(),
                ..Gpu::default()
            }),
            ..Pci::default()
        }
    }

    fn bridge(bus: &str, acs: bool, children: Vec<Pci>) -> Pci {
        Pci {
            busid: bus.into(),
            class: "0x060400".into(),
            acs: Some(acs),
            children,
            ..Pci::default()
        }
    }

    #[test]
    fn busids() {
        assert_eq!(
            normalize_busid("00000000:1B:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(normalize_busid("1b:00.0").as_deref(), Some("0000:1b:00.0"));
        assert_eq!(normalize_busid("0000:1b:00"), None);
        assert_eq!(normalize_busid("0000:1b:20.0"), None);
        assert_eq!(normalize_busid("x:y:z.w"), None);
    }

    #[test]
    fn nv18_pair_and_ring() {
        let t = Topology {
            cpus: vec![Cpu {
                numaid: 0,
                pcis: vec![
                    gpu_pci("0000:00:06.0", 0, &[("0000:00:07.0", 18, "0x030200")]),
                    gpu_pci("0000:00:07.0", 1, &[("0000:00:06.0", 18, "0x030200")]),
                ],
                ..Cpu::default()
            }],
        };
        let m = t.matrix();
        assert_eq!(m[0][1], Path::Nv(18));
        assert_eq!(m[1][1], Path::Itself);
        assert_eq!(best_ring(&m), vec![0, 1]);
        let back = Topology::from_xml(&t.to_xml()).unwrap();
        assert_eq!(back, t);
    }

    fn site(bus: &str, numa: u32, bridges: &[&str], links: &[(&str, u32)]) -> GpuSite {
        GpuSite {
            busid: bus.into(),
            numaid: numa,
            bridges: bridges.iter().map(|b| (*b).into()).collect(),
            nvlinks: links
                .iter()
                .map(|(t, c)| NvLink {
                    target: (*t).into(),
                    count: *c,
                    tclass: "0x030200".into(),
                })
                .collect(),
        }
    }

    #[test]
    fn rank_rings_follow_the_links() {
        // Two PCIe switches of two GPUs each; ranks alternate between them,
        // so the rank-order ring would cross the host bridge at every hop.
        let a0 = site(
            "0000:13:00.0",
            0,
            &["0000:00:01.0", "0000:10:00.0", "0000:11:00.0"],
            &[],
        );
        let a1 = site(
            "0000:14:00.0",
            0,
            &["0000:00:01.0", "0000:10:00.0", "0000:12:00.0"],
            &[],
        );
        let b0 = site(
            "0000:23:00.0",
            0,
            &["0000:00:02.0", "0000:20:00.0", "0000:21:00.0"],
            &[],
        );
        let b1 = site(
            "0000:24:00.0",
            0,
            &["0000:00:02.0", "0000:20:00.0", "0000:22:00.0"],
            &[],
        );
        assert_eq!(site_path(&a0, &a1), Path::Pix);
        assert_eq!(site_path(&a0, &b0), Path::Phb);
        let sites = [a0.clone(), b0.clone(), a1.clone(), b1.clone()];
        let o = rank_ring(&sites, &[7; 4]);
        assert_eq!(o[0], 0);
        let adjacent = |x: usize, y: usize| {
            let i = o.iter().position(|&r| r == x).unwrap();
            o[(i + 1) % 4] == y || o[(i + 3) % 4] == y
        };
        assert!(adjacent(0, 2) && adjacent(1, 3), "{o:?}");
        // NVLink between the switches' GPUs beats the switch itself.
        let mut c = [a0.clone(), b0.clone(), a1.clone(), b1.clone()];
        c[0].nvlinks.push(NvLink {
            target: b0.busid.clone(),
            count: 4,
            tclass: "0x030200".into(),
        });
        c[1].nvlinks.push(NvLink {
            target: a0.busid.clone(),
            count: 4,
            tclass: "0x030200".into(),
        });
        let o = rank_ring(&c, &[7; 4]);
        assert!(o[1] == 1 || o[3] == 1, "{o:?}");
        // Two hosts: each host's ranks together, hosts in order of first rank.
        assert_eq!(rank_ring(&sites, &[5, 9, 5, 9]), vec![0, 2, 1, 3]);
        assert_eq!(rank_ring(&sites, &[9, 5, 9, 5]), vec![0, 2, 1, 3]);
        // Two ranks per GPU of an NV18 pair (rank r on GPU r % 2): every hop
        // of the rank-order ring is NVLink, so it stays.
        let g0 = site("0000:00:06.0", 0, &[], &[("0000:00:07.0", 18)]);
        let g1 = site("0000:00:07.0", 0, &[], &[("0000:00:06.0", 18)]);
        assert_eq!(site_path(&g0, &g0.clone()), Path::Itself);
        let shared = [g0.clone(), g1.clone(), g0, g1];
        assert_eq!(rank_ring(&shared, &[1; 4]), vec![0, 1, 2, 3]);
        assert_eq!(rank_ring(&shared[..1], &[1]), vec![0]);
        assert!(rank_ring(&[], &[]).is_empty());
    }

    #[test]
    fn pcie_paths_and_acs() {
        // Switch A (upstream 0000:10, downstream 11 and 12) holds GPUs 0 and 1;
        // GPU 2 is alone under another root port; GPU 3 on the other socket.
        let sw = bridge(
            "0000:10:00.0",
            false,
            vec![
                bridge("0000:11:00.0", true, vec![gpu_pci("0000:13:00.0", 0, &[])]),
                bridge("0000:12:00.0", false, vec![gpu_pci("0000:14:00.0", 1, &[])]),
            ],
        );
        let t = Topology {
            cpus: vec![
                Cpu {
                    numaid: 0,
                    pcis: vec![
                        bridge("0000:00:01.0", false, vec![sw]),
                        bridge("0000:00:02.0", false, vec![gpu_pci("0000:20:00.0", 2, &[])]),
                    ],
                    ..Cpu::default()
                },
                Cpu {
                    numaid: 1,
                    pcis: vec![bridge(
                        "0000:80:01.0",
                        false,
                        vec![gpu_pci("0000:81:00.0", 3, &[])],
                    )],
                    ..Cpu::default()
                },
            ],
        };
        let m = t.matrix();
        assert_eq!(m[0][1], Path::Pix);
        assert_eq!(m[0][2], Path::Phb);
        assert_eq!(m[0][3], Path::Sys);
        let g = t.gpus();
        let acs = acs_between(&g[0], &g[1]);
        assert_eq!(acs.len(), 1);
        assert_eq!(acs[0].busid, "0000:11:00.0");
        assert!(acs_between(&g[0], &g[3]).is_empty());
        assert_eq!(Topology::from_xml(&t.to_xml()).unwrap(), t);
    }

    #[test]
    fn nvswitch_and_ring_prefers_nvlink() {
        let sw = |b: &str, d| gpu_pci(b, d, &[("0000:ff:00.0", 18, NVSWITCH_CLASS)]);
        let t = Topology {
            cpus: vec![Cpu {
                pcis: (0..8)
                    .map(|i| sw(&format!("0000:{:02x}:00.0", i + 1), i))
                    .collect(),
                ..Cpu::default()
            }],
        };
        let m = t.matrix();
        assert!(m.iter().enumerate().all(|(i, r)| r
            .iter()
            .enumerate()
            .all(|(j, p)| (i == j) || *p == Path::Nv(18))));
        assert_eq!(best_ring(&m), (0..8).collect::<Vec<_>>());
        // 4 GPUs where 0-2 and 1-3 are NVLinked, others PCIe: the ring pairs them.
        let mut m = vec![vec![Path::Phb; 4]; 4];
        for (i, row) in m.iter_mut().enumerate() {
            row[i] = Path::Itself;
        }
        for (a, b) in [(0, 2), (1, 3), (2, 1), (3, 0)] {
            m[a][b] = Path::Nv(4);
            m[b][a] = Path::Nv(4);
        }
        let r = best_ring(&m);
        for i in 0..4 {
            assert!(m[r[i]][r[(i + 1) % 4]].is_nvlink(), "{r:?}");
        }
    }

    #[test]
    fn trees() {
        let order = [3, 1, 2, 0];
        assert_eq!(tree_links(&order, 0), (None, vec![1, 2]));
        assert_eq!(tree_links(&order, 1), (Some(3), vec![0]));
        assert_eq!(tree_links(&order, 3), (Some(1), vec![]));
    }

    #[test]
    fn strict_model_errors() {
        let e =
            Topology::from_xml("<system>\n<cpu>\n<pci class='x'/>\n</cpu></system>").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.msg.contains("<pci>: missing attribute 'busid'"), "{e}");
        let e = Topology::from_xml(
            "<system><cpu><pci busid='0000:01:00.0'><gpu dev='a'/></pci></cpu></system>",
        )
        .unwrap_err();
        assert!(e.msg.contains("dev=\"a\" is not a number"), "{e}");
        assert!(Topology::from_xml("<topo/>")
            .unwrap_err()
            .msg
            .contains("<system>"));
        // Unknown elements (NCCL's own) are skipped.
        let t = Topology::from_xml("<system version='1'><cpu numaid='0'><pcilink/><pci busid='0000:01:00.0' class='0x030200'><gpu dev='0'/></pci></cpu></system>").unwrap();
        assert_eq!(t.gpus().len(), 1);
    }

    #[test]
    fn nic_sites_from_sysfs_paths() {
        let gpu = GpuSite {
            busid: "0000:19:00.0".into(),
            numaid: 0,
            bridges: vec![
                "0000:16:01.0".into(),
                "0000:17:00.0".into(),
                "0000:18:00.0".into(),
            ],
            nvlinks: Vec::new(),
        };
        let nic = |p: &str| pci_path_site(p, 0).unwrap();
        // Under the same switch as the GPU.
        let same =
            nic("/sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:01.0/0000:1a:00.0");
        assert_eq!(same.busid, "0000:1a:00.0");
        assert_eq!(same.bridges.len(), 3);
        assert_eq!(site_path(&gpu, &same), Path::Pix);
        // Another root port of the same host bridge: through the CPU.
        let far = nic("/sys/devices/pci0000:16/0000:16:02.0/0000:40:00.0");
        assert_eq!(site_path(&gpu, &far), Path::Phb);
        // Another NUMA node.
        let other = pci_path_site("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", 1).unwrap();
        assert_eq!(site_path(&gpu, &other), Path::Sys);
        assert_eq!(pci_path_site("/sys/devices/virtual/net/lo", 0), None);
        assert_eq!(pci_path_site("", 0), None);
    }

    #[test]
    fn channels_take_the_nearest_nics_spread() {
        let site = |bus: &str, bridges: &[&str], numa: u32| GpuSite {
            busid: bus.into(),
            numaid: numa,
            bridges: bridges.iter().map(|b| b.to_string()).collect(),
            nvlinks: Vec::new(),
        };
        // Two GPUs, each with a NIC under its own switch, one NIC on the
        // other NUMA node, one whose place is unknown.
        let g0 = site(
            "0000:19:00.0",
            &["0000:16:01.0", "0000:17:00.0", "0000:18:00.0"],
            0,
        );
        let g1 = site(
            "0000:29:00.0",
            &["0000:26:01.0", "0000:27:00.0", "0000:28:00.0"],
            0,
        );
        let nics = vec![
            (
                0,
                Some(site(
                    "0000:1a:00.0",
                    &["0000:16:01.0", "0000:17:00.0", "0000:18:01.0"],
                    0,
                )),
            ),
            (
                1,
                Some(site(
                    "0000:2a:00.0",
                    &["0000:26:01.0", "0000:27:00.0", "0000:28:01.0"],
                    0,
                )),
            ),
            (2, Some(site("0000:81:00.0", &["0000:80:01.0"], 1))),
            (3, None),
        ];
        use CrossNic::{Aligned, Allowed, PreferAligned};
        for cross in [Allowed, PreferAligned] {
            // The nearest NIC whatever the index: the others are farther.
            assert_eq!(nic_per_channel(&g0, &nics, 0, 4, cross), vec![0, 0, 0, 0]);
            assert_eq!(nic_per_channel(&g1, &nics, 1, 3, cross), vec![1, 1, 1]);
        }
        // Rail-aligned: channel c on the c-th NIC on every host, near or
        // not, whatever the local rank.
        assert_eq!(
            nic_per_channel(&g0, &nics, 0, 6, Aligned),
            vec![0, 1, 2, 3, 0, 1]
        );
        assert_eq!(nic_per_channel(&g1, &nics, 1, 3, Aligned), vec![0, 1, 2]);
        // Two equally near NICs (a dual-port card under the GPU's switch):
        // channels alternate, and the second local rank starts on the other.
        let mut two = nics.clone();
        two.push((
            4,
            Some(site(
                "0000:1b:00.0",
                &["0000:16:01.0", "0000:17:00.0", "0000:18:01.0"],
                0,
            )),
        ));
        for cross in [Allowed, PreferAligned] {
            assert_eq!(nic_per_channel(&g0, &two, 0, 4, cross), vec![0, 4, 0, 4]);
            assert_eq!(nic_per_channel(&g0, &two, 1, 3, cross), vec![4, 0, 4]);
        }
        assert_eq!(nic_per_channel(&g0, &two, 1, 3, Aligned), vec![0, 1, 2]);
        // Nothing known about any NIC: all equally far. Cross allowed:
        // spread by local rank; otherwise rail-aligned (it costs nothing).
        let unknown = vec![(0, None), (1, None), (2, None)];
        assert_eq!(
            nic_per_channel(&g0, &unknown, 0, 4, Allowed),
            vec![0, 1, 2, 0]
        );
        assert_eq!(nic_per_channel(&g0, &unknown, 4, 2, Allowed), vec![1, 2]);
        for cross in [Aligned, PreferAligned] {
            assert_eq!(
                nic_per_channel(&g0, &unknown, 0, 4, cross),
                vec![0, 1, 2, 0]
            );
            assert_eq!(nic_per_channel(&g0, &unknown, 4, 2, cross), vec![0, 1]);
            assert_eq!(
                nic_per_channel(&g1, &unknown, 1, 5, cross),
                vec![0, 1, 2, 0, 1]
            );
        }
        // Device indices, not positions: a list with gaps (NCCL_IB_HCA).
        let gaps = vec![(1, None), (3, None)];
        assert_eq!(nic_per_channel(&g0, &gaps, 1, 3, Allowed), vec![3, 1, 3]);
        assert_eq!(
            nic_per_channel(&g0, &gaps, 1, 3, PreferAligned),
            vec![1, 3, 1]
        );
        // One NIC: every value gives it to every channel.
        for cross in [Aligned, Allowed, PreferAligned] {
            assert_eq!(
                nic_per_channel(&g0, &[(2, None)], 3, 3, cross),
                vec![2, 2, 2]
            );
            assert!(nic_per_channel(&g0, &[], 0, 4, cross).is_empty());
            assert!(nic_per_channel(&g0, &unknown, 0, 0, cross).is_empty());
        }
    }

    #[test]
    fn host_sites_by_numa_node() {
        assert_eq!(
            parse_cpulist("0-3,8, 10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("a"), None);
        let nodes = vec![(0, vec![0, 1, 2, 3]), (1, vec![4, 5, 6, 7])];
        assert_eq!(numa_node_of(&[5, 6], &nodes), Some(1));
        assert_eq!(numa_node_of(&[3, 4], &nodes), None);
        assert_eq!(numa_node_of(&[9], &nodes), None);
        assert_eq!(numa_node_of(&[], &nodes), None);
        // NICs on the rank's node are nearer than those on the other node
        // and those whose place is unknown.
        let nic = |b: &str, numa| Some(site(b, numa, &["0000:80:01.0"], &[]));
        let nics = vec![
            (0, nic("0000:81:00.0", 1)),
            (1, nic("0000:82:00.0", 0)),
            (2, None),
            (3, nic("0000:83:00.0", 0)),
        ];
        let on0 = numa_site(0);
        assert_eq!(
            nic_per_channel(&on0, &nics, 0, 3, CrossNic::Allowed),
            vec![1, 3, 1]
        );
        assert_eq!(
            nic_per_channel(&on0, &nics, 1, 3, CrossNic::PreferAligned),
            vec![3, 1, 3]
        );
        assert_eq!(
            nic_per_channel(&on0, &nics, 1, 3, CrossNic::Aligned),
            vec![0, 1, 2]
        );
        assert_eq!(
            nic_per_channel(&numa_site(1), &nics, 1, 2, CrossNic::Allowed),
            vec![0, 0]
        );
    }

    #[test]
    fn nic_line_names_every_channel() {
        assert_eq!(
            nic_channels_line("rank 3", "IB", &[1, 0, 1, 0], CrossNic::Allowed),
            "rank 3 (4 channels) uses NET/IB devices 0, 1; by channel: 1 0 1 0 (NCCL_CROSS_NIC=1)"
        );
        assert_eq!(
            nic_channels_line("GPU 0000:19:00.0", "oxtest", &[2, 2], CrossNic::default()),
            "GPU 0000:19:00.0 (2 channels) uses NET/oxtest device 2; by channel: 2 2 (NCCL_CROSS_NIC=2)"
        );
    }
}
