//! `oxccl doctor`: what is wrong with this machine for collective
//! communication, and how to fix it.
//!
//! Every check reads the machine through a [`System`] rooted at `--sysroot`
//! (default `/`) and decides in pure code ([`checks`]); the few OS calls that
//! have no file to stand for them (statvfs, getifaddrs, dlopen, connect) live
//! in [`probe`] and run only on the real root; [`peers`] talks TCP to other
//! hosts (`--peers`, `--listen`), every wait bounded. Library loads run in a child
//! process (`oxccl doctor --probe-nccl PATH`, `--probe-driver`) with a 5 s
//! timeout, so a broken or hanging library cannot take the doctor down.
//!
//! Exit status: 0 when nothing failed, 1 when any check failed (✘), 2 for a
//! bad command line.

mod checks;
mod gpu;
mod loader;
mod peers;
mod probe;
mod search;

use std::path::PathBuf;

use clap::Args;

use crate::system::System;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Ok,
    Warn,
    Fail,
    Skip,
}

impl Status {
    fn symbol(self) -> &'static str {
        match self {
            Status::Ok => "✔",
            Status::Warn => "⚠",
            Status::Fail => "✘",
            Status::Skip => "–",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Stable machine-readable id (`shm.size`, `env.NCCL_SOCKET_IFNAM`).
    pub id: String,
    /// The section it belongs to (`Shared memory`).
    pub title: &'static str,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// How to fix it (every ✘ has one).
    pub fix: Option<String>,
}

impl Check {
    pub fn new(id: impl Into<String>, title: &'static str, status: Status, detail: String) -> Self {
        Check {
            id: id.into(),
            title,
            status,
            detail,
            fix: None,
        }
    }
    pub fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

#[derive(Args)]
#[command(
    about = "Find what is wrong with this machine for collective communication, and say how to fix it",
    after_help = "Checks: environment variables, shared memory and limits, container and its GPUs, network \
interfaces and NCCL_SOCKET_IFNAME, InfiniBand, CUDA driver, runtimes and NVRTC, NCCL libraries, GPU \
topology (P2P, NVLink, PCIe, NUMA, ACS), PyTorch, TCP reachability of --peers both ways (with \
`oxccl doctor --listen PORT` on the peer), which \
libnccl.so.2 a --program loads and why, and with --bench a short all_reduce. Exit status: 0 when no check failed, 1 when any did (✘), 2 for a \
bad command line."
)]
pub struct DoctorArgs {
    /// Print the checks as JSON instead of text
    #[arg(long)]
    pub json: bool,
    /// Read /sys, /proc, /etc, /dev/shm and library folders under DIR (recorded fixtures)
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub sysroot: PathBuf,
    /// Ranks that will run on this host (for the /dev/shm need); default: the number of CPUs
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub ranks: Option<u64>,
    /// Peers to test TCP reachability of, both ways: `host[:port],...` (port default: NCCL_COMM_ID's, else 29500); where `oxccl doctor --listen` runs, the peer also connects back
    #[arg(long, value_name = "HOST[:PORT],...", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// Listen on `[ADDR:]PORT` for other hosts' `--peers` probes, answer them and connect back to each (until --expect probes arrived or --listen-timeout passed)
    #[arg(long, value_name = "[ADDR:]PORT")]
    pub listen: Option<String>,
    /// With --listen: the probes to wait for (default: the number of --peers, else 1)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub expect: Option<u64>,
    /// With --listen: stop waiting for probes after SECS seconds
    #[arg(long, value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub listen_timeout: u64,
    /// Also run a short all_reduce, checked and timed: on the GPUs through `oxccl perf --backend cuda` (against what the NVLinks should give) when 2 or more are usable, else over CPU ranks (against the tuner's model)
    #[arg(long)]
    pub bench: bool,
    /// Say which libnccl.so.2 this program (executable or shared library) would load, and by which loader rule; default: PyTorch's libtorch_cuda.so when pip or conda has it
    #[arg(long, value_name = "PATH")]
    pub program: Option<PathBuf>,
    /// Internal: dlopen PATH, print its ncclGetVersion and exit
    #[arg(long, value_name = "PATH", hide = true)]
    pub probe_nccl: Option<PathBuf>,
    /// Internal: dlopen PATH, print its cudaRuntimeGetVersion and exit
    #[arg(long, value_name = "PATH", hide = true)]
    pub probe_cudart: Option<PathBuf>,
    /// Internal: probe the CUDA driver and NVRTC, print the result and exit
    #[arg(long, hide = true)]
    pub probe_driver: bool,
}

/// Runs the doctor; the process exit status.
pub fn main(a: &DoctorArgs) -> i32 {
    if let Some(p) = &a.probe_nccl {
        return probe::probe_nccl_child(p);
    }
    if let Some(p) = &a.probe_cudart {
        return probe::probe_cudart_child(p);
    }
    if a.probe_driver {
        return probe::probe_driver_child();
    }
    if let Some(l) = &a.listen {
        if let Err(e) = peers::parse_listen(l) {
            eprintln!("oxccl doctor: {e}");
            return 2;
        }
    }
    if !a.sysroot.is_dir() {
        eprintln!(
            "oxccl doctor: --sysroot {}: not a folder (see 'oxccl doctor --help')",
            a.sysroot.display()
        );
        return 2;
    }
    // Canonical, so that library symlinks resolved under it map back to machine paths.
    let root = std::fs::canonicalize(&a.sysroot).unwrap_or_else(|_| a.sysroot.clone());
    let sys = System::new(root);
    let all = run_all(&sys, a);
    if a.json {
        println!("{}", to_json(&sys, &all));
    } else {
        print!("{}", to_text(&sys, &all));
    }
    exit_code(&all)
}

/// 1 when any check failed, else 0.
pub fn exit_code(all: &[Check]) -> i32 {
    i32::from(all.iter().any(|c| c.status == Status::Fail))
}

fn run_all(sys: &System, a: &DoctorArgs) -> Vec<Check> {
    // Listen first, so that peers' probes are answered while the checks run.
    let listening = a.listen.as_deref().map(|l| {
        let expect = a.expect.map_or_else(
            || {
                a.peers
                    .iter()
                    .filter(|p| !p.trim().is_empty())
                    .count()
                    .max(1)
            },
            |n| n as usize,
        );
        peers::start_listen(l, expect, std::time::Duration::from_secs(a.listen_timeout))
    });
    let facts = probe::gather(sys, a.ranks);
    let mut all = Vec::new();
    all.extend(checks::environment(&facts.env));
    all.extend(checks::shared_memory(&facts.shm));
    all.push(checks::memlock(
        &facts.limits,
        !facts.net.ib_devices.is_empty(),
    ));
    all.push(checks::container(&facts.container));
    all.extend(checks::container_gpus(&facts.container_gpus));
    all.extend(checks::network(&facts.net));
    all.extend(checks::driver(&facts.driver));
    all.extend(checks::cuda_runtimes(&facts.cudart));
    all.extend(checks::nccl_libraries(&facts.nccl));
    let program = match &a.program {
        Some(p) => Some(loader::program_facts(sys, &p.display().to_string(), true)),
        None => loader::default_program(sys).map(|p| loader::program_facts(sys, &p, false)),
    };
    if let Some(p) = program {
        all.push(checks::nccl_program(&p));
    }
    // GPU topology: the same detection as `oxccl topo` (NCCL_TOPO_FILE honoured).
    let loaded = crate::topo::load(sys, None);
    let (topo, source, nvml) = match loaded {
        Ok(l) => {
            let nvml = match &l.nv {
                Some(crate::topo::source::NvSource::Unavailable(e)) => Err(e.clone()),
                Some(nv) => Ok(nv.describe()),
                None => Ok("NVLink and P2P as recorded in the file".to_string()),
            };
            (Ok(l.topo), l.source, nvml)
        }
        Err(e) => (Err(e), String::new(), Err("no topology".to_string())),
    };
    let ngpus = topo.as_ref().map_or(0, |t| t.gpus().len());
    // NVLinks of the GPU with the fewest: what bounds a ring through all of them.
    let nvlinks = topo.as_ref().map_or(0, |t| {
        t.gpus()
            .iter()
            .map(|g| g.gpu.nvlinks.iter().map(|l| l.count).sum::<u32>())
            .min()
            .unwrap_or(0)
    });
    all.extend(gpu::topology(&gpu::TopoFacts {
        topo,
        source,
        nvml,
        cmdline: sys.read("/proc/cmdline"),
    }));
    let torch = if sys.is_real() {
        gpu::torch_facts()
    } else {
        gpu::TorchFacts::NotRun("not run under --sysroot (it asks python3 on this machine)".into())
    };
    all.push(gpu::pytorch(&torch, ngpus));
    if a.bench {
        // GPUs usable: the driver probe (real root only) found 2 or more.
        let usable = match &facts.driver {
            checks::DriverFacts::Probed { driver: Ok(d), .. } if d.state == "ok" => {
                d.devices.unwrap_or(0).max(0) as usize
            }
            _ => 0,
        };
        let mut gpu_skip = String::new();
        let mut run_cpu = true;
        if usable >= 2 {
            let run = gpu::run_gpu_bench();
            run_cpu = run.is_err();
            all.push(gpu::gpu_bench(&gpu::GpuBenchFacts { run, nvlinks }));
        } else if ngpus > 0 {
            gpu_skip = if sys.is_real() {
                format!("{usable} GPU(s) usable through the driver (2 needed)")
            } else {
                "not run under --sysroot".to_string()
            };
        }
        if run_cpu {
            // 4 ranks (fewer on small machines) × 8 MiB: ~100 ms on two cores.
            let ranks = std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .clamp(2, 4);
            let bytes = 8 << 20;
            let (result, wrong) = gpu::run_bench(ranks, bytes);
            all.extend(gpu::bench(&gpu::BenchFacts {
                ranks,
                bytes,
                result,
                wrong,
                model: gpu::model_time(ranks, bytes),
                gpus: if usable >= 2 { 0 } else { ngpus },
                gpu_skip,
                nvlinks,
            }));
        }
    }
    if !a.peers.is_empty() {
        let default_port = checks::default_peer_port(sys.var("NCCL_COMM_ID"));
        let results = peers::reach_peers(&a.peers, default_port);
        all.extend(checks::peers(&results));
    }
    if let Some(l) = listening {
        all.extend(checks::listen(&l.finish()));
    }
    all
}

fn to_text(sys: &System, all: &[Check]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "oxccl doctor {} (root {})",
        oxccl::VERSION,
        sys.root.display()
    );
    let mut last = "";
    for c in all {
        if c.title != last {
            let _ = writeln!(s, "\n{}", c.title);
            last = c.title;
        }
        let mut lines = c.detail.lines();
        let _ = writeln!(s, "  {} {}", c.status.symbol(), lines.next().unwrap_or(""));
        for l in lines {
            let _ = writeln!(s, "    {l}");
        }
        if let Some(f) = &c.fix {
            let _ = writeln!(s, "    fix: {f}");
        }
    }
    let n = |st: Status| all.iter().filter(|c| c.status == st).count();
    let _ = writeln!(
        s,
        "\n{} ok, {} warning(s), {} failed, {} skipped",
        n(Status::Ok),
        n(Status::Warn),
        n(Status::Fail),
        n(Status::Skip)
    );
    s
}

fn to_json(sys: &System, all: &[Check]) -> String {
    let n = |st: Status| all.iter().filter(|c| c.status == st).count();
    let checks: Vec<serde_json::Value> = all
        .iter()
        .map(|c| {
            serde_json::json!({
                "id": c.id,
                "title": c.title,
                "status": c.status.name(),
                "detail": c.detail,
                "fix": c.fix,
            })
        })
        .collect();
    let v = serde_json::json!({
        "tool": "oxccl doctor",
        "version": oxccl::VERSION,
        "root": sys.root.display().to_string(),
        "checks": checks,
        "summary": {
            "ok": n(Status::Ok),
            "warn": n(Status::Warn),
            "fail": n(Status::Fail),
            "skip": n(Status::Skip),
        },
        "exit": exit_code(all),
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}
