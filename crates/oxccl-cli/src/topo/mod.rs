//! `oxccl topo`: the machine as collectives see it. CPUs (NUMA nodes), the
//! PCI tree with GPUs and NICs, NVLink counts and peer-to-peer status, as a
//! tree and as a matrix (`nvidia-smi topo -m`'s names), and the ring and
//! trees planned over the GPUs; `--dump FILE` writes it as XML and
//! `--file FILE` (or `NCCL_TOPO_FILE`) reads one instead of the machine, so a
//! recorded machine can be planned for anywhere.
//!
//! Detection is the library's (`oxccl::topo`: the one sysfs walk, pure in
//! the core over thin file access, and the one NVML loader, asked here in a
//! child process by [`source`]); the model, the path names, the ring search
//! and the XML live in the core's topology module (pure).

pub mod source;

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use oxccl::topo::{self, Path, Pci, Topology};

use crate::system::System;
use source::NvSource;

#[derive(Args)]
#[command(
    about = "Print the machine's topology (NUMA nodes, PCI tree, GPUs, NVLink, NICs) as a tree and a matrix, with the rings and trees planned on it",
    after_help = "Reads /sys (and NVML, in a child process, for NVLink and P2P), or a topology XML \
file given with --file or NCCL_TOPO_FILE. Under --sysroot DIR, NVLink and P2P come from DIR/topo.xml \
when it exists. Exit status: 0, 1 when a topology file cannot be read or written, 2 for a bad command line."
)]
pub struct TopoArgs {
    /// Read the topology from this XML file instead of the machine (default: NCCL_TOPO_FILE when set)
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Write the topology as XML to FILE ('-' for stdout, then nothing else is printed)
    #[arg(long, value_name = "FILE")]
    pub dump: Option<PathBuf>,
    /// Read /sys and /proc under DIR (a recorded machine); NVLink and P2P from DIR/topo.xml
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub sysroot: PathBuf,
    /// Internal: load NVML, print its NVLink and P2P view as JSON and exit
    #[arg(long, hide = true)]
    pub probe_nvml: bool,
}

/// Where the topology came from, for the report's first line.
pub struct Loaded {
    pub topo: Topology,
    pub source: String,
    pub nv: Option<NvSource>,
}

/// Reads a topology file (bounded: files over the parser's limit are refused unread).
pub fn read_file(path: &std::path::Path) -> Result<Topology, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.len() > topo::xml::MAX_INPUT as u64 {
        return Err(format!(
            "{}: {} bytes, larger than the {} accepted",
            path.display(),
            meta.len(),
            topo::xml::MAX_INPUT
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Topology::from_xml(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The machine under `sys`: sysfs, plus NVML (real root) or `topo.xml` (a sysroot).
pub fn detect(sys: &System) -> Loaded {
    let mut t = topo::read_sysfs(&sys.root);
    let nv = if sys.is_real() {
        source::probe()
    } else {
        let f = sys.path("/topo.xml");
        if f.is_file() {
            match read_file(&f) {
                Ok(rec) => NvSource::Recorded {
                    file: f.display().to_string(),
                    report: topo::NvmlReport::from_topology(&rec),
                },
                Err(e) => NvSource::Unavailable(e),
            }
        } else {
            NvSource::Unavailable("no topo.xml under --sysroot".into())
        }
    };
    if let Some(r) = nv.report() {
        t.merge_nvml(r);
    }
    Loaded {
        topo: t,
        source: format!("sysfs under {}", sys.root.display()),
        nv: Some(nv),
    }
}

/// The topology `oxccl topo` (and doctor) would use: `--file`, else NCCL_TOPO_FILE, else the machine.
pub fn load(sys: &System, file: Option<&std::path::Path>) -> Result<Loaded, String> {
    let env_file = sys.var("NCCL_TOPO_FILE").filter(|v| !v.trim().is_empty());
    let (path, why) = match (file, env_file) {
        (Some(f), _) => (Some(f.to_path_buf()), "--file"),
        (None, Some(e)) => (Some(PathBuf::from(e)), "NCCL_TOPO_FILE"),
        (None, None) => (None, ""),
    };
    match path {
        Some(p) => Ok(Loaded {
            topo: read_file(&p).map_err(|e| format!("{why} {e}"))?,
            source: format!("{} ({why})", p.display()),
            nv: None,
        }),
        None => Ok(detect(sys)),
    }
}

pub fn main(a: &TopoArgs) -> i32 {
    if a.probe_nvml {
        return source::probe_child();
    }
    if !a.sysroot.is_dir() {
        eprintln!(
            "oxccl topo: --sysroot {}: not a folder (see 'oxccl topo --help')",
            a.sysroot.display()
        );
        return 2;
    }
    let root = std::fs::canonicalize(&a.sysroot).unwrap_or_else(|_| a.sysroot.clone());
    let sys = System::new(root);
    let l = match load(&sys, a.file.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("oxccl topo: {e}");
            return 1;
        }
    };
    if let Some(d) = &a.dump {
        let x = l.topo.to_xml();
        if d.as_os_str() == "-" {
            print!("{x}");
            return 0;
        }
        if let Err(e) = std::fs::write(d, &x) {
            eprintln!("oxccl topo: --dump {}: {e}", d.display());
            return 1;
        }
    }
    print!("{}", report(&l));
    if let Some(d) = &a.dump {
        println!("\nWrote {}", d.display());
    }
    0
}

fn fmt_speed(mbps: Option<u64>) -> String {
    match mbps {
        Some(m) if m >= 1000 => format!(", {} Gb/s", m / 1000),
        Some(m) => format!(", {m} Mb/s"),
        None => String::new(),
    }
}

fn pci_line(p: &Pci, gpu_index: &dyn Fn(&str) -> Option<usize>) -> String {
    let link = match (&p.link_speed, p.link_width) {
        (Some(s), Some(w)) => format!(", {} x{w}", s.trim_end_matches(" PCIe")),
        (Some(s), None) => format!(", {s}"),
        _ => String::new(),
    };
    let extra = {
        let mut v = Vec::new();
        if p.acs == Some(true) {
            v.push("ACS on".to_string());
        }
        if let Some(g) = p.iommu_group {
            v.push(format!("IOMMU group {g}"));
        }
        if v.is_empty() {
            String::new()
        } else {
            format!(" [{}]", v.join(", "))
        }
    };
    if let Some(g) = &p.gpu {
        let idx = gpu_index(&p.busid).unwrap_or(0);
        format!(
            "GPU{idx} {}{}{}{link}{extra}",
            p.busid,
            g.name.as_ref().map(|n| format!(" {n}")).unwrap_or_default(),
            g.sm.map(|s| format!(" (sm_{s})")).unwrap_or_default()
        )
    } else if p.class.starts_with("0x0604") {
        format!("PCI bridge {}{link}{extra}", p.busid)
    } else if p.class == topo::NVSWITCH_CLASS {
        format!("NVSwitch {}{link}", p.busid)
    } else if !p.nics.is_empty() {
        format!("NIC {} ({}){link}", p.busid, p.class)
    } else {
        format!("PCI {} ({}){link}{extra}", p.busid, p.class)
    }
}

fn tree_lines(
    p: &Pci,
    prefix: &str,
    last: bool,
    out: &mut String,
    gpu_index: &dyn Fn(&str) -> Option<usize>,
    busids: &[String],
) {
    let _ = writeln!(
        out,
        "{prefix}{}{}",
        if last { "└─ " } else { "├─ " },
        pci_line(p, gpu_index)
    );
    let inner = format!("{prefix}{}", if last { "   " } else { "│  " });
    if let Some(g) = &p.gpu {
        for l in &g.nvlinks {
            let to = match busids.iter().position(|b| *b == l.target) {
                Some(i) => format!("GPU{i} ({})", l.target),
                None if l.target == topo::HIDDEN_SWITCH => {
                    "NVSwitch (not visible: a VM's share of an NVSwitch board)".to_string()
                }
                None if l.tclass == topo::NVSWITCH_CLASS => format!("NVSwitch {}", l.target),
                None => l.target.clone(),
            };
            let _ = writeln!(out, "{inner}   NVLink ×{} → {to}", l.count);
        }
    }
    for n in &p.nics {
        let _ = writeln!(
            out,
            "{inner}   NIC{} {}{}{}",
            n.dev,
            n.name,
            n.port.map(|p| format!(" port {p}")).unwrap_or_default(),
            fmt_speed(n.speed)
        );
    }
    for (i, c) in p.children.iter().enumerate() {
        tree_lines(c, &inner, i + 1 == p.children.len(), out, gpu_index, busids);
    }
}

/// The whole human report: source, tree, matrix, P2P, rings and trees.
pub fn report(l: &Loaded) -> String {
    let t = &l.topo;
    let mut s = String::new();
    let _ = writeln!(s, "oxccl topo {} ({})", oxccl::VERSION, l.source);
    if let Some(nv) = &l.nv {
        let _ = writeln!(s, "{}", nv.describe());
    }
    let gpus = t.gpus();
    let busids: Vec<String> = gpus.iter().map(|g| g.pci.busid.clone()).collect();
    let gpu_index = |b: &str| busids.iter().position(|x| x == b);
    let _ = writeln!(s, "\nTree");
    let _ = writeln!(s, "System");
    for (i, c) in t.cpus.iter().enumerate() {
        let last = i + 1 == t.cpus.len();
        let _ = writeln!(
            s,
            "{}NUMA node {}{}",
            if last { "└─ " } else { "├─ " },
            c.numaid,
            c.affinity
                .as_ref()
                .map(|a| format!(" (CPUs {a})"))
                .unwrap_or_default()
        );
        let pre = if last { "   " } else { "│  " };
        for (j, p) in c.pcis.iter().enumerate() {
            tree_lines(
                p,
                pre,
                j + 1 == c.pcis.len() && c.nics.is_empty(),
                &mut s,
                &gpu_index,
                &busids,
            );
        }
        for n in &c.nics {
            let _ = writeln!(s, "{pre}└─ NIC{} {}{}", n.dev, n.name, fmt_speed(n.speed));
        }
    }
    if gpus.is_empty() {
        let _ = writeln!(s, "\nNo NVIDIA GPUs: nothing to plan rings and trees over.");
        return s;
    }
    let m = t.matrix();
    let _ = writeln!(s, "\nMatrix");
    let mut head = String::from("       ");
    for i in 0..gpus.len() {
        let _ = write!(head, "{:<7}", format!("GPU{i}"));
    }
    let _ = writeln!(s, "{head}CPU Affinity    NUMA");
    for (i, g) in gpus.iter().enumerate() {
        let mut row = format!("{:<7}", format!("GPU{i}"));
        for p in &m[i] {
            let _ = write!(row, "{:<7}", p.to_string());
        }
        let aff = t
            .cpus
            .iter()
            .find(|c| c.numaid == g.numaid)
            .and_then(|c| c.affinity.clone())
            .unwrap_or_else(|| "?".into());
        let _ = writeln!(s, "{row}{aff:<16}{}", g.numaid);
    }
    let _ = writeln!(
        s,
        "\n  X = self, NV# = # bonded NVLinks (direct or through NVSwitch), PIX = at most one PCIe bridge,\n  PXB = several PCIe bridges, PHB = through a PCIe host bridge (CPU), NODE = between host bridges\n  of one NUMA node, SYS = across NUMA nodes"
    );
    let any_p2p = gpus.iter().any(|g| !g.gpu.p2p.is_empty());
    if any_p2p {
        let _ = writeln!(s, "\nP2P read status (NVML)");
        let _ = writeln!(s, "{head}");
        for i in 0..gpus.len() {
            let mut row = format!("{:<7}", format!("GPU{i}"));
            for j in 0..gpus.len() {
                let c = if i == j {
                    "X".to_string()
                } else {
                    t.p2p(i, j).map_or("?".into(), |p| p.name().to_uppercase())
                };
                let _ = write!(row, "{c:<7}");
            }
            let _ = writeln!(s, "{row}");
        }
        let _ = writeln!(
            s,
            "\n  OK = peer-to-peer works, CNS = chipset not supported (often ACS), GNS = GPU not supported,\n  TNS = topology not supported, NS = not supported, DISABLED = disabled by the driver"
        );
    }
    // The library's own choices for one rank per GPU (ring setup's
    // `rank_ring` and `ring_channels`), so the answer is the library's.
    let sites: Vec<topo::GpuSite> = t.gpus().iter().map(|g| g.site()).collect();
    let ring = topo::rank_ring(&sites, &vec![0; sites.len()]);
    let default_channels = oxccl_core::gpu::ring::RingConfig::new(
        false,
        4 << 20,
        None,
        None,
        sites.len(),
        std::time::Duration::from_secs(1),
    )
    .channels;
    let channels = oxccl_core::gpu::ring::ring_channels(&sites, &ring, default_channels);
    let _ = writeln!(
        s,
        "\nPlan (rank r = GPU ring[r]; the ring and trees the schedules build over those ranks)"
    );
    let hops: Vec<Path> = (0..ring.len())
        .map(|i| m[ring[i]][ring[(i + 1) % ring.len()]])
        .collect();
    let names: Vec<String> = ring.iter().map(|g| format!("GPU{g}")).collect();
    let nv = hops.iter().filter(|p| p.is_nvlink()).count();
    let slowest = hops.iter().max().copied().unwrap_or(Path::Itself);
    let _ = writeln!(
        s,
        "  ring:    {} → {}   ({nv} of {} hops on NVLink; slowest hop {slowest})",
        names.join(" → "),
        names.first().cloned().unwrap_or_default(),
        hops.len()
    );
    let _ = writeln!(
        s,
        "  GPU ring: {channels} channels (blocks) per collective from the slowest hop (of {default_channels} for {} ranks; NCCL_MIN/MAX_NCHANNELS override)",
        sites.len()
    );
    let rev: Vec<usize> = ring.iter().rev().copied().collect();
    for (k, order) in [(0, &ring), (1, &rev)] {
        let mut parts = Vec::new();
        for pos in 0..order.len() {
            let (_, children) = topo::tree_links(order, pos);
            if !children.is_empty() {
                let ch: Vec<String> = children.iter().map(|c| format!("GPU{c}")).collect();
                parts.push(format!("GPU{} → {}", order[pos], ch.join(", ")));
            }
        }
        let _ = writeln!(
            s,
            "  tree {k}:  root GPU{}{}{}",
            order.first().copied().unwrap_or(0),
            if parts.is_empty() { "" } else { "; " },
            parts.join("; ")
        );
    }
    s
}
