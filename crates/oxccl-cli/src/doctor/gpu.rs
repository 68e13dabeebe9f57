//! The GPU checks: topology (P2P matrix, NVLink counts, PCIe paths, NUMA,
//! ACS/IOMMU), PyTorch's view of CUDA and NCCL, and `--bench` (a short
//! all_reduce over CPU ranks, checked and timed against the tuner's model).
//! Deciding is pure ([`topology`], [`pytorch`], [`bench()`] take facts);
//! gathering ([`torch_facts`], [`run_bench`]) is thin and bounded in time.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use oxccl_core::topo::{self, P2pStatus, Path, Topology};

use super::{Check, Status};

const TOPO: &str = "GPU topology";
const TORCH: &str = "PyTorch";
const BENCH: &str = "Bench";

/// What one NVLink moves per direction on H100/H200 (NVLink 4: 26.5625 GB/s).
const NVLINK_GBPS: f64 = 26.5625;
/// Share of raw NVLink bandwidth a good all_reduce reaches as bus bandwidth
/// (NCCL on NV18 H100/H200: ~300–360 GB/s of 478 raw): 18 links → ≥ 300 GB/s.
const NVLINK_EFFICIENCY: f64 = 0.63;

/// What the topology check judges.
#[derive(Debug, Clone)]
pub struct TopoFacts {
    /// The topology, or why there is none (a bad NCCL_TOPO_FILE).
    pub topo: Result<Topology, String>,
    /// Where it came from.
    pub source: String,
    /// Where NVLink/P2P came from, or why they are unknown.
    pub nvml: Result<String, String>,
    /// The kernel command line (IOMMU settings), when readable.
    pub cmdline: Option<String>,
}

fn matrix_text(t: &Topology) -> String {
    let g = t.gpus();
    let m = t.matrix();
    let mut s = String::from("      ");
    for i in 0..g.len() {
        let _ = write!(s, "{:<6}", format!("GPU{i}"));
    }
    s.push_str("NUMA  P2P");
    for (i, gi) in g.iter().enumerate() {
        let _ = write!(s, "\n{:<6}", format!("GPU{i}"));
        for p in &m[i] {
            let _ = write!(s, "{:<6}", p.to_string());
        }
        let p2p: Vec<String> = (0..g.len())
            .filter(|&j| j != i)
            .filter_map(|j| t.p2p(i, j).map(|st| format!("{}:{}", j, st.name())))
            .collect();
        let _ = write!(
            s,
            "{:<6}{}",
            gi.numaid,
            if g.len() == 1 {
                // No other GPU to reach: nothing is unknown.
                "-".to_string()
            } else if p2p.is_empty() {
                "?".to_string()
            } else {
                p2p.join(" ")
            }
        );
    }
    s
}

/// Peer-to-peer, NVLink and PCIe findings.
pub fn topology(f: &TopoFacts) -> Vec<Check> {
    let t = match &f.topo {
        Ok(t) => t,
        Err(e) => {
            return vec![Check::new("gpu.topology", TOPO, Status::Fail, format!("the topology cannot be read: {e}"))
                .fix("correct the file (the error names the line), or unset NCCL_TOPO_FILE to detect the machine")]
        }
    };
    let g = t.gpus();
    if g.is_empty() {
        return vec![Check::new(
            "gpu.topology",
            TOPO,
            Status::Skip,
            format!("no NVIDIA GPUs ({})", f.source),
        )];
    }
    let m = t.matrix();
    let mut out = Vec::new();
    let numas: std::collections::BTreeSet<u32> = g.iter().map(|x| x.numaid).collect();
    let mut detail = format!(
        "{} GPU(s) on {} NUMA node(s) ({}; {})\n{}",
        g.len(),
        numas.len(),
        f.source,
        match &f.nvml {
            Ok(s) => s.clone(),
            Err(e) => format!("NVLink/P2P unknown: {e}"),
        },
        matrix_text(t)
    );
    let ring = topo::best_ring(&m);
    let names: Vec<String> = ring.iter().map(|i| format!("GPU{i}")).collect();
    let _ = write!(detail, "\nring: {}", names.join(" → "));
    out.push(Check::new("gpu.topology", TOPO, Status::Ok, detail));
    if g.len() >= 2 {
        if let Err(e) = &f.nvml {
            out.push(Check::new(
                "gpu.nvml",
                TOPO,
                Status::Skip,
                format!("NVLink counts and P2P status not checked: {e}"),
            ));
        }
    }
    // NVLink: asymmetric counts, or some GPUs with fewer links than the rest.
    let links: Vec<u32> = g
        .iter()
        .map(|x| x.gpu.nvlinks.iter().map(|l| l.count).sum())
        .collect();
    let most = links.iter().copied().max().unwrap_or(0);
    if most > 0 {
        let low: Vec<String> = links
            .iter()
            .enumerate()
            .filter(|(_, &n)| n < most)
            .map(|(i, n)| format!("GPU{i} has {n}"))
            .collect();
        if low.is_empty() {
            out.push(Check::new(
                "gpu.nvlink",
                TOPO,
                Status::Ok,
                format!("every GPU has {most} NVLinks up; all_reduce should reach ≥ {:.0} GB/s bus bandwidth", expected_nvlink_busbw(most)),
            ));
        } else {
            out.push(
                Check::new(
                    "gpu.nvlink",
                    TOPO,
                    Status::Warn,
                    format!("NVLinks down: {} (the others have {most}); rings through those GPUs run slower", low.join(", ")),
                )
                .fix("check `nvidia-smi nvlink -s` and `nvidia-smi -q | grep -i -A3 nvlink`; a reset (`nvidia-smi -r`) or the fabric manager (`systemctl status nvidia-fabricmanager` on NVSwitch systems) often brings them back"),
            );
        }
    }
    // P2P off between GPUs: behind one switch (ACS/IOMMU) is a failure with a fix.
    let mut acs_noted = false;
    for i in 0..g.len() {
        for j in i + 1..g.len() {
            let st = t.p2p(i, j).or(t.p2p(j, i));
            let acs = topo::acs_between(&g[i], &g[j]);
            let shared = g[i]
                .bridges
                .iter()
                .zip(&g[j].bridges)
                .take_while(|(a, b)| a.busid == b.busid)
                .last()
                .map(|(a, _)| a.busid.clone());
            let groups = match (g[i].pci.iommu_group, g[j].pci.iommu_group) {
                (Some(a), Some(b)) => format!("; IOMMU groups {a} and {b}"),
                _ => String::new(),
            };
            let iommu_on = f
                .cmdline
                .as_deref()
                .is_some_and(|c| c.contains("intel_iommu=on") || c.contains("amd_iommu=on"))
                && !f.cmdline.as_deref().is_some_and(|c| c.contains("iommu=pt"));
            match st {
                Some(P2pStatus::Ok) | None if acs.is_empty() => {}
                Some(P2pStatus::Ok) => {
                    // P2P reported fine, but ACS is on along the path.
                    if !acs_noted {
                        acs_noted = true;
                        out.push(Check::new(
                            "gpu.acs",
                            TOPO,
                            Status::Warn,
                            format!("ACS is on at {} between GPU{i} and GPU{j}, yet the driver reports P2P OK: traffic may detour through the root complex", acs.iter().map(|p| p.busid.as_str()).collect::<Vec<_>>().join(", ")),
                        ).fix("measure with `oxccl perf all_reduce --backend cuda`; if slow, disable ACS on those ports (see docs/doctor.md)"));
                    }
                }
                st => {
                    let st_name = st.map_or("unknown", |s| s.name());
                    let via = match &shared {
                        Some(b) => format!("although both sit behind PCIe bridge {b}"),
                        None => format!("(path {})", m[i][j]),
                    };
                    let acs_txt = if acs.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; ACS is on at {}",
                            acs.iter()
                                .map(|p| p.busid.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    };
                    let detail = format!("peer-to-peer is off between GPU{i} ({}) and GPU{j} ({}): status {st_name} {via}{acs_txt}{groups}{}", g[i].pci.busid, g[j].pci.busid,
                        if iommu_on { "; the kernel runs with the IOMMU on (no iommu=pt)" } else { "" });
                    let behind_switch = shared.is_some() && !m[i][j].is_nvlink();
                    if behind_switch || !acs.is_empty() {
                        let ports: Vec<&str> = acs.iter().map(|p| p.busid.as_str()).collect();
                        let setpci = if ports.is_empty() {
                            "the switch's downstream ports".to_string()
                        } else {
                            ports
                                .iter()
                                .map(|p| format!("`setpci -s {p} ECAP_ACS+6.w=0000`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        };
                        out.push(
                            Check::new(format!("gpu.p2p.{i}-{j}"), TOPO, Status::Fail, format!("{detail}: PCIe ACS (or the IOMMU) redirects peer traffic to the root complex, where NCCL hangs or falls back to host memory"))
                                .fix(format!("disable ACS as root after each boot: {setpci}; or disable it in the BIOS (\"ACS\"/\"PCIe ACS control\"); with the IOMMU on add `iommu=pt` to the kernel command line; until then NCCL_P2P_DISABLE=1 avoids hangs at a cost in bandwidth")),
                        );
                    } else {
                        out.push(
                            Check::new(format!("gpu.p2p.{i}-{j}"), TOPO, Status::Warn, format!("{detail}: traffic between them goes through host memory"))
                                .fix("expected across CPU sockets on some platforms; otherwise check the BIOS PCIe settings and `nvidia-smi topo -p2p r`"),
                        );
                    }
                }
            }
        }
    }
    // NUMA affinity: a rank should run on its GPU's node.
    if numas.len() > 1 {
        let per: Vec<String> = g
            .iter()
            .enumerate()
            .map(|(i, x)| format!("GPU{i}→node {}", x.numaid))
            .collect();
        let sys_pairs = m.iter().flatten().filter(|p| **p == Path::Sys).count() / 2;
        out.push(Check::new(
            "gpu.numa",
            TOPO,
            Status::Ok,
            format!("GPUs span NUMA nodes ({}); {sys_pairs} pair(s) cross the CPU interconnect without NVLink — pin each rank to its GPU's node (`numactl --cpunodebind=N`)", per.join(", ")),
        ));
    }
    out
}

/// Bus bandwidth an all_reduce should reach over `links` NVLinks, GB/s.
pub fn expected_nvlink_busbw(links: u32) -> f64 {
    f64::from(links) * NVLINK_GBPS * NVLINK_EFFICIENCY
}

// ---------------------------------------------------------------- PyTorch

/// How long importing torch may take in the child (cold imports take 5–15 s).
pub const TORCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Python that says which file a process's NCCL calls bind to, by the
/// dynamic loader's own answer: `ncclGetVersion` resolved through the global
/// scope (the program, LD_PRELOAD, RTLD_GLOBAL libraries: what every
/// library's calls bind to first), else through an already loaded library's
/// own dependencies (`nccl_binding(path)`), then `dladdr` names the file
/// that provides it. oxccl is known by content ([`crate::run::OXCCL_MARKER`]
/// in the file), not by its path.
pub const BINDING_PY: &str = r#"
import ctypes, mmap, os
class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
def is_oxccl_file(path):
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(b"oxccl version ") >= 0
    except (OSError, ValueError):
        return False
def nccl_binding(local=None):
    g = ctypes.CDLL(None)
    addr, how = None, None
    try:
        addr, how = ctypes.cast(g.ncclGetVersion, ctypes.c_void_p).value, "global scope"
    except AttributeError:
        pass
    if addr is None and local:
        try:
            h = ctypes.CDLL(local, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            addr, how = ctypes.cast(h.ncclGetVersion, ctypes.c_void_p).value, local
        except (OSError, AttributeError):
            pass
    if addr is None:
        return {"binding": None}
    dladdr = g.dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not dladdr(addr, ctypes.byref(info)) or not info.fname:
        return {"binding": None, "binding_error": "dladdr found no file"}
    f = os.path.realpath(info.fname.decode())
    return {"binding": f, "binding_via": how, "binding_oxccl": is_oxccl_file(f)}
"#;

/// The child's script: [`BINDING_PY`], then PyTorch's facts; one JSON line.
pub fn torch_script() -> String {
    format!("{BINDING_PY}\n{TORCH_PY}")
}

const TORCH_PY: &str = r#"
import json, sys
r = {}
try:
    import torch
except Exception as e:
    print(json.dumps({"absent": repr(e)})); sys.exit(0)
r["version"] = torch.__version__
r["cuda"] = torch.version.cuda
r["file"] = torch.__file__
try:
    v = torch.cuda.nccl.version()
    r["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as e:
    r["nccl_error"] = repr(e)
try:
    import torch.distributed as dist
    r["nccl_available"] = bool(dist.is_nccl_available())
except Exception as e:
    r["nccl_available_error"] = repr(e)
libs = []
for l in open("/proc/self/maps"):
    p = l.split()[-1] if len(l.split()) >= 6 else ""
    if ("libnccl" in p or "libtorch_cuda" in p) and p not in libs:
        libs.append(p)
r["loaded"] = libs
cuda_lib = next((p for p in libs if "libtorch_cuda" in p), None)
try:
    r.update(nccl_binding(cuda_lib))
except Exception as e:
    r["binding_error"] = repr(e)
print(json.dumps(r))
"#;

/// What the PyTorch child reported, or why it did not.
#[derive(Debug, Clone)]
pub enum TorchFacts {
    /// Not run (a fixture sysroot) or python3 missing.
    NotRun(String),
    Failed(String),
    Report(serde_json::Value),
}

pub fn pytorch(f: &TorchFacts, gpus: usize) -> Check {
    let v = match f {
        TorchFacts::NotRun(why) => return Check::new("torch", TORCH, Status::Skip, why.clone()),
        TorchFacts::Failed(e) => {
            return Check::new(
                "torch",
                TORCH,
                Status::Warn,
                format!("`python3 -c 'import torch'` gave no answer: {e}"),
            )
            .fix("run `python3 -c 'import torch; print(torch.__version__)'` to see the error")
        }
        TorchFacts::Report(v) => v,
    };
    if let Some(a) = v.get("absent").and_then(|x| x.as_str()) {
        return Check::new(
            "torch",
            TORCH,
            Status::Skip,
            format!("python3 has no torch ({a})"),
        );
    }
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("?").to_string();
    let loaded: Vec<String> = v
        .get("loaded")
        .and_then(|x| x.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let nccl_lib = loaded.iter().find(|p| p.contains("libnccl"));
    let cuda_lib = loaded.iter().find(|p| p.contains("libtorch_cuda"));
    let mut detail = format!(
        "PyTorch {} ({}), CUDA {}, NCCL {}, is_nccl_available={}",
        s("version"),
        s("file"),
        s("cuda"),
        v.get("nccl")
            .and_then(|x| x.as_str())
            .map_or_else(|| format!("unknown ({})", s("nccl_error")), str::to_string),
        v.get("nccl_available")
            .and_then(|x| x.as_bool())
            .map_or("?".to_string(), |b| if b {
                "True".into()
            } else {
                "False".into()
            })
    );
    let binding = v.get("binding").and_then(|x| x.as_str());
    let binding_oxccl = v.get("binding_oxccl").and_then(|x| x.as_bool()) == Some(true);
    match (binding, cuda_lib, nccl_lib) {
        (Some(b), _, _) => {
            let via = match v.get("binding_via").and_then(|x| x.as_str()) {
                Some("global scope") | None => {
                    "through the global scope: LD_PRELOAD or the program".to_string()
                }
                Some(lib) => format!("through {lib}'s own dependencies"),
            };
            let _ = write!(
                detail,
                "\nncclGetVersion binds to {b} ({via}): {}",
                if binding_oxccl {
                    "oxccl's"
                } else {
                    "not oxccl's; to use oxccl start the job with `oxccl run -- CMD` (or LD_PRELOAD oxccl's libnccl.so.2)"
                }
            );
        }
        (None, Some(c), Some(n)) => {
            let _ = write!(
                detail,
                "\n{c} loaded {n}, whose ncclGetVersion the loader did not show ({})",
                s("binding_error")
            );
        }
        (None, None, Some(n)) => {
            let _ = write!(detail, "\nlibnccl loaded from {n}");
        }
        (None, Some(c), None) => {
            let _ = write!(detail, "\n{c} loaded, no libnccl mapped after import (NCCL is linked statically or loaded lazily)");
        }
        (None, None, None) => detail.push_str("\nno libtorch_cuda.so loaded (a CPU-only build)"),
    }
    let cpu_only = s("cuda") == "?" || v.get("cuda").is_some_and(|c| c.is_null());
    if gpus > 0 && cpu_only {
        return Check::new("torch", TORCH, Status::Warn, format!("{detail}\na CPU-only PyTorch on a machine with {gpus} GPU(s)"))
            .fix("install a CUDA build: `pip install torch --index-url https://download.pytorch.org/whl/cu130` (match your driver)");
    }
    if gpus > 0 && v.get("nccl_available").and_then(|x| x.as_bool()) == Some(false) {
        return Check::new(
            "torch",
            TORCH,
            Status::Fail,
            format!("{detail}\ntorch.distributed has no NCCL backend"),
        )
        .fix(
            "install a PyTorch build with NCCL (the CUDA wheels from download.pytorch.org have it)",
        );
    }
    Check::new("torch", TORCH, Status::Ok, detail)
}

/// Runs `python3 -c` [`torch_script`] under [`TORCH_TIMEOUT`].
pub fn torch_facts() -> TorchFacts {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = match Command::new("python3")
        .arg("-c")
        .arg(torch_script())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return TorchFacts::NotRun(format!("python3 not found ({e})")),
    };
    let Some(mut so) = child.stdout.take() else {
        return TorchFacts::Failed("no output pipe".into());
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    let out = rx.recv_timeout(TORCH_TIMEOUT);
    let _ = child.kill();
    let _ = child.wait();
    match out {
        Err(_) => TorchFacts::Failed(format!(
            "did not finish within {} s (killed)",
            TORCH_TIMEOUT.as_secs()
        )),
        Ok(text) => match text
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        {
            Some(v) => TorchFacts::Report(v),
            None => TorchFacts::Failed(format!("unreadable output {:?}", text.trim())),
        },
    }
}

// ---------------------------------------------------------------- bench

/// One `--bench` run.
#[derive(Debug, Clone)]
pub struct BenchFacts {
    pub ranks: usize,
    pub bytes: usize,
    /// Average time per all_reduce, or the error.
    pub result: Result<Duration, String>,
    /// Elements that came out wrong (0 = correct).
    pub wrong: usize,
    /// The tuner's model time for the same call.
    pub model: Duration,
    /// GPUs on the machine whose bench did not run (0: none, or it ran).
    pub gpus: usize,
    /// Why the GPU bench did not run (when `gpus` > 0).
    pub gpu_skip: String,
    /// NVLinks per GPU (for the GPU expectation).
    pub nvlinks: u32,
}

/// Bus bandwidth of an all_reduce (nccl-tests' definition): S/t × 2(n−1)/n.
pub fn busbw(bytes: usize, n: usize, t: Duration) -> f64 {
    let algbw = bytes as f64 / t.as_secs_f64().max(1e-9) / 1e9;
    algbw * 2.0 * (n.saturating_sub(1)) as f64 / n.max(1) as f64
}

pub fn bench(f: &BenchFacts) -> Vec<Check> {
    let mut out = Vec::new();
    let size = super::checks::fmt_bytes(f.bytes as u64);
    match &f.result {
        Err(e) => out.push(
            Check::new("bench.cpu", BENCH, Status::Fail, format!("all_reduce of {size} over {} CPU ranks failed: {e}", f.ranks))
                .fix("run `oxccl perf all_reduce -t 2 -b 1M -e 1M` for details; check /dev/shm (above) and OXCCL_/NCCL_ settings"),
        ),
        Ok(_) if f.wrong > 0 => out.push(
            Check::new("bench.cpu", BENCH, Status::Fail, format!("all_reduce of {size} over {} CPU ranks gave {} wrong element(s)", f.ranks, f.wrong))
                .fix("report it with `oxccl perf all_reduce -t 2 -c 1` output; unset NCCL_ALGO/NCCL_PROTO to rule out a setting"),
        ),
        Ok(t) => {
            let bw = busbw(f.bytes, f.ranks, *t);
            let model_bw = busbw(f.bytes, f.ranks, f.model);
            let detail = format!(
                "all_reduce of {size} (f32 sum) over {} CPU ranks (threads): correct; {:.1} µs, bus bandwidth {bw:.2} GB/s (the tuner's model: {model_bw:.2} GB/s)",
                f.ranks,
                t.as_secs_f64() * 1e6
            );
            out.push(if bw < model_bw * 0.2 {
                Check::new("bench.cpu", BENCH, Status::Warn, format!("{detail}: under a fifth of the model"))
                    .fix("a busy machine (other jobs on the cores), or too few cores for the ranks; compare with `oxccl perf all_reduce -t 2`")
            } else {
                Check::new("bench.cpu", BENCH, Status::Ok, detail)
            });
        }
    }
    if f.gpus > 0 {
        out.push(Check::new(
            "bench.gpu",
            BENCH,
            Status::Skip,
            format!(
                "GPU bench not run: {}; by hand: `{}`{}",
                f.gpu_skip,
                GPU_BENCH_CMD,
                expectation_text(f.nvlinks)
            ),
        ));
    }
    out
}

/// A short all_reduce over `ranks` threads through the Rust API: 3 warm-up
/// and 10 timed calls of `bytes`, every rank's result checked.
pub fn run_bench(ranks: usize, bytes: usize) -> (Result<Duration, String>, usize) {
    let n = bytes / 4;
    let comms = match oxccl::Communicator::init_all(ranks) {
        Ok(c) => c,
        Err(e) => return (Err(e.to_string()), 0),
    };
    let results: Vec<(Result<Duration, String>, usize)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank();
                    // Small integers: the f32 sum is exact, so every rank must match bit for bit.
                    let send: Vec<f32> = (0..n).map(|i| ((i * 7 + r) % 64) as f32).collect();
                    let mut recv = vec![0f32; n];
                    for _ in 0..3 {
                        if let Err(e) = c.all_reduce(&send, &mut recv, oxccl::RedOp::Sum) {
                            return (Err(e.to_string()), 0);
                        }
                    }
                    let t0 = Instant::now();
                    const ITERS: u32 = 10;
                    for _ in 0..ITERS {
                        if let Err(e) = c.all_reduce(&send, &mut recv, oxccl::RedOp::Sum) {
                            return (Err(e.to_string()), 0);
                        }
                    }
                    let dt = t0.elapsed() / ITERS;
                    let nr = c.size();
                    let wrong = (0..n)
                        .filter(|&i| {
                            let want: usize = (0..nr).map(|q| (i * 7 + q) % 64).sum();
                            recv[i] != want as f32
                        })
                        .count();
                    (Ok(dt), wrong)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| (Err("a rank panicked".into()), 0))
            })
            .collect()
    });
    for c in comms {
        let _ = c.destroy();
    }
    let mut worst = Duration::ZERO;
    let mut wrong = 0;
    for (r, w) in results {
        match r {
            Ok(d) => worst = worst.max(d),
            Err(e) => return (Err(e), 0),
        }
        wrong += w;
    }
    (Ok(worst), wrong)
}

/// The tuner's estimate for the same all_reduce on in-process rings.
pub fn model_time(ranks: usize, bytes: usize) -> Duration {
    use oxccl_core::schedule::Shaped;
    use oxccl_core::tuner::{estimate, slice_for, LinkModel};
    let link = LinkModel::INPROC;
    let slice = slice_for(oxccl_core::algo::Proto::Simple, 1 << 20);
    let us = estimate(
        oxccl_core::CollKind::AllReduce,
        Shaped::Ring,
        bytes,
        ranks,
        &link,
        slice,
        1,
    );
    Duration::from_secs_f64(us.max(0.0) / 1e6)
}

// ---------------------------------------------------------------- GPU bench

/// The GPU bench, as `oxccl perf` runs it in a child process (plus `-J FILE`):
/// 64 MiB float sum over every visible GPU, 3 warm-up and 10 timed
/// iterations, checked once, communicators aborted after 30 s stuck.
pub const GPU_BENCH_ARGS: &[&str] = &[
    "all_reduce",
    "--backend",
    "cuda",
    "-b",
    "64M",
    "-e",
    "64M",
    "-n",
    "10",
    "-w",
    "3",
    "-c",
    "1",
    "-T",
    "30",
];
/// The same, for a person to type.
pub const GPU_BENCH_CMD: &str =
    "oxccl perf all_reduce --backend cuda -b 64M -e 64M -n 10 -w 3 -c 1";
/// How long the whole child may take: CUDA contexts, NVRTC (cold: tens of
/// seconds), 13 all_reduces of 64 MiB.
pub const GPU_BENCH_TIMEOUT: Duration = Duration::from_secs(120);

/// What `oxccl perf -J` wrote about the one 64 MiB line.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuBench {
    pub nranks: usize,
    pub bytes: u64,
    /// Out-of-place time (µs) and bus bandwidth (GB/s).
    pub time_us: f64,
    pub busbw: f64,
    /// In-place bus bandwidth.
    pub busbw_ip: Option<f64>,
    /// Wrong elements over both halves (None: not checked).
    pub wrong: Option<u64>,
    /// perf's own verdict (`ok`: no wrong results).
    pub ok: bool,
    /// The library measured (`oxccl 0.1.0`, `NCCL 2.28.9`...).
    pub library: String,
    pub devices: Vec<String>,
}

/// Reads `oxccl perf -J`'s JSON (the first result line).
pub fn parse_perf_json(text: &str) -> Result<GpuBench, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("unreadable perf JSON ({e})"))?;
    let r = v
        .get("results")
        .and_then(|r| r.as_array())
        .and_then(|r| r.first())
        .ok_or("perf JSON without results")?;
    let oop = r
        .get("out_of_place")
        .ok_or("perf JSON without out_of_place")?;
    let num = |h: &serde_json::Value, k: &str| h.get(k).and_then(|x| x.as_f64());
    let wrong = |h: &serde_json::Value| h.get("wrong").and_then(|x| x.as_u64());
    let ip = r.get("in_place").filter(|h| !h.is_null());
    let wrong = match (wrong(oop), ip.and_then(wrong)) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    let busbw = num(oop, "busbw_gbps").ok_or("perf JSON without busbw_gbps")?;
    Ok(GpuBench {
        nranks: v["config"]["nranks"].as_u64().unwrap_or(0) as usize,
        bytes: r.get("size").and_then(|x| x.as_u64()).unwrap_or(0),
        time_us: num(oop, "time_us").unwrap_or(0.0),
        busbw,
        busbw_ip: ip.and_then(|h| num(h, "busbw_gbps")),
        wrong,
        ok: v.get("ok").and_then(|x| x.as_bool()).unwrap_or(false),
        library: format!(
            "{} {}",
            v["library"].as_str().unwrap_or("?"),
            v["library_version"].as_str().unwrap_or("")
        )
        .trim()
        .to_string(),
        devices: v["ranks"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|r| r["device_name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// What the GPU bench verdict looks at.
#[derive(Debug, Clone)]
pub struct GpuBenchFacts {
    /// The run, or why it gave no result.
    pub run: Result<GpuBench, String>,
    /// NVLinks of the GPU with the fewest (0: none; no expectation).
    pub nvlinks: u32,
}

fn expectation_text(nvlinks: u32) -> String {
    if nvlinks > 0 {
        format!(
            "; with {nvlinks} NVLinks per GPU expect ≥ {:.0} GB/s bus bandwidth",
            expected_nvlink_busbw(nvlinks)
        )
    } else {
        String::new()
    }
}

/// Correctness and bus bandwidth of the GPU bench against what the links should give.
pub fn gpu_bench(f: &GpuBenchFacts) -> Check {
    let id = "bench.gpu";
    let b = match &f.run {
        Err(e) => {
            return Check::new(id, BENCH, Status::Warn, format!("the GPU bench gave no result: {e}; the CPU bench ran instead"))
                .fix(format!("run `{GPU_BENCH_CMD}` to see the whole error; oxccl's libnccl.so.2 must sit next to the oxccl executable or in ../lib beside its folder (`cargo xtask build` or `cargo xtask install --prefix DIR` puts it there) or be named with --lib"))
        }
        Ok(b) => b,
    };
    let size = super::checks::fmt_bytes(b.bytes);
    let devs = if b.devices.is_empty() {
        String::new()
    } else {
        let mut d = b.devices.clone();
        d.dedup();
        format!(" ({})", d.join(", "))
    };
    let ip = b
        .busbw_ip
        .map_or(String::new(), |x| format!(", in place {x:.1}"));
    let what = format!(
        "all_reduce of {size} (float sum) over {} GPU(s){devs} with {}",
        b.nranks, b.library
    );
    if b.wrong.is_some_and(|w| w > 0) || !b.ok {
        return Check::new(id, BENCH, Status::Fail, format!("{what}: {} wrong element(s)", b.wrong.map_or("some".to_string(), |w| w.to_string())))
            .fix(format!("rerun `{GPU_BENCH_CMD}`; unset NCCL_ALGO/NCCL_PROTO/NCCL_P2P_DISABLE to rule out a setting, and report it with that output"));
    }
    let detail = format!(
        "{what}: correct; {:.1} µs, bus bandwidth {:.1} GB/s{ip}",
        b.time_us, b.busbw
    );
    if b.nranks < 2 {
        return Check::new(
            id,
            BENCH,
            Status::Ok,
            format!("{detail} (one GPU: no link between GPUs to measure)"),
        );
    }
    if f.nvlinks == 0 {
        return Check::new(
            id,
            BENCH,
            Status::Ok,
            format!("{detail} (no NVLink: no bandwidth expectation)"),
        );
    }
    let expect = expected_nvlink_busbw(f.nvlinks);
    if b.busbw < expect {
        return Check::new(
            id,
            BENCH,
            Status::Warn,
            format!("{detail}: under the ≥ {expect:.0} GB/s that {} NVLinks per GPU should give", f.nvlinks),
        )
        .fix("look for other work on the GPUs (`nvidia-smi`), links down (`nvidia-smi nvlink -s`), NCCL_P2P_DISABLE or NCCL_P2P_LEVEL settings, and compare with `oxccl perf all_reduce --backend cuda -b 1G -e 1G`");
    }
    Check::new(
        id,
        BENCH,
        Status::Ok,
        format!(
            "{detail} (≥ {expect:.0} GB/s expected from {} NVLinks per GPU)",
            f.nvlinks
        ),
    )
}

/// Runs the GPU bench in a child (`oxccl perf ... -J FILE`) under
/// [`GPU_BENCH_TIMEOUT`] and reads its JSON; or why there is none.
pub fn run_gpu_bench() -> Result<GpuBench, String> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let json = std::env::temp_dir().join(format!("oxccl-doctor-bench-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&json);
    let mut child = Command::new(exe)
        .arg("perf")
        .args(GPU_BENCH_ARGS)
        .arg("-J")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start oxccl perf: {e}"))?;
    let mut se = child.stderr.take();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = se.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        let _ = tx.send(s);
    });
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Ok(st),
            Ok(None) if t0.elapsed() >= GPU_BENCH_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!(
                    "oxccl perf did not finish within {} s (killed)",
                    GPU_BENCH_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => break Err(format!("waiting for oxccl perf: {e}")),
        }
    };
    let stderr = rx.recv_timeout(Duration::from_secs(2)).unwrap_or_default();
    let text = std::fs::read_to_string(&json);
    let _ = std::fs::remove_file(&json);
    let status = status?;
    match text {
        Ok(t) => parse_perf_json(&t),
        Err(_) => {
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no message")
                .trim()
                .to_string();
            Err(format!(
                "oxccl perf exited with {} and wrote no JSON: {last}",
                status
                    .code()
                    .map_or("a signal".to_string(), |c| format!("status {c}"))
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERF_JSON: &str = r#"{
  "tool": "oxccl perf", "library": "oxccl", "library_version": "0.1.0",
  "config": {"nranks": 2},
  "ranks": [{"rank": 0, "device_name": "NVIDIA H200"}, {"rank": 1, "device_name": "NVIDIA H200"}],
  "results": [{"size": 67108864, "count": 16777216, "type": "float", "redop": "sum", "root": -1,
    "out_of_place": {"time_us": 212.0, "algbw_gbps": 316.6, "busbw_gbps": 316.6, "wrong": 0},
    "in_place": {"time_us": 210.0, "algbw_gbps": 319.6, "busbw_gbps": 319.6, "wrong": 0}}],
  "out_of_bounds": 0, "avg_busbw_gbps": 318.1, "ok": true
}"#;

    fn facts(json: &str, nvlinks: u32) -> GpuBenchFacts {
        GpuBenchFacts {
            run: parse_perf_json(json),
            nvlinks,
        }
    }

    #[test]
    fn one_gpu_has_no_unknown_peer_column() {
        let one = Topology::from_xml(
            "<system><cpu numaid='0'><pci busid='0000:06:00.0' class='0x030200'>\
             <gpu dev='0' sm='90' name='NVIDIA H200'/></pci></cpu></system>",
        )
        .unwrap();
        let text = matrix_text(&one);
        let row = text.lines().nth(1).unwrap();
        assert!(row.ends_with('-') && !text.contains('?'), "{text}");
        // Two GPUs with no P2P facts: unknown, said so.
        let two = Topology::from_xml(
            "<system><cpu numaid='0'><pci busid='0000:06:00.0' class='0x030200'>\
             <gpu dev='0' sm='90'/></pci><pci busid='0000:07:00.0' class='0x030200'>\
             <gpu dev='1' sm='90'/></pci></cpu></system>",
        )
        .unwrap();
        assert!(matrix_text(&two).lines().nth(1).unwrap().ends_with('?'));
    }

    #[test]
    fn perf_json_is_read() {
        let b = parse_perf_json(PERF_JSON).unwrap();
        assert_eq!(b.nranks, 2);
        assert_eq!(b.bytes, 64 << 20);
        assert_eq!(b.wrong, Some(0));
        assert!(b.ok);
        assert_eq!(b.library, "oxccl 0.1.0");
        assert!((b.busbw - 316.6).abs() < 1e-9);
        assert_eq!(b.busbw_ip, Some(319.6));
        assert!(parse_perf_json("{").is_err());
        assert!(parse_perf_json(r#"{"results": []}"#).is_err());
        assert!(parse_perf_json(r#"{"results": [{"out_of_place": {}}]}"#).is_err());
    }

    #[test]
    fn verdicts() {
        // NV18 at 316 GB/s: fine.
        let c = gpu_bench(&facts(PERF_JSON, 18));
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(
            c.detail.contains("316.6 GB/s") && c.detail.contains("≥ 301"),
            "{c:?}"
        );
        // Below what NV18 should give: a warning naming the expectation.
        let slow = PERF_JSON.replace("316.6", "150.2");
        let c = gpu_bench(&facts(&slow, 18));
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(
            c.detail.contains("under the ≥ 301 GB/s that 18 NVLinks"),
            "{c:?}"
        );
        assert!(c.fix.is_some());
        // No NVLink: no expectation.
        assert_eq!(gpu_bench(&facts(&slow, 0)).status, Status::Ok);
        // Wrong results fail, whatever the speed.
        let wrong = PERF_JSON
            .replacen(r#""wrong": 0"#, r#""wrong": 12"#, 1)
            .replace(r#""ok": true"#, r#""ok": false"#);
        let c = gpu_bench(&facts(&wrong, 18));
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(c.detail.contains("12 wrong"), "{c:?}");
        // No result: a warning with the way to see the error.
        let c = gpu_bench(&GpuBenchFacts {
            run: Err("oxccl perf exited with status 2 and wrote no JSON: no libnccl.so.2".into()),
            nvlinks: 18,
        });
        assert_eq!(c.status, Status::Warn);
        assert!(c
            .fix
            .unwrap()
            .contains("oxccl perf all_reduce --backend cuda"));
    }

    /// ✘ paths of PyTorch and the CPU bench, on the facts.
    #[test]
    fn torch_and_cpu_bench_failures() {
        let v = serde_json::json!({"version": "2.9.0", "cuda": "13.0", "nccl_available": false, "loaded": []});
        let c = pytorch(&TorchFacts::Report(v), 2);
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(c.fix.is_some());
        let base = BenchFacts {
            ranks: 4,
            bytes: 8 << 20,
            result: Ok(Duration::from_millis(4)),
            wrong: 0,
            model: Duration::from_millis(3),
            gpus: 0,
            gpu_skip: String::new(),
            nvlinks: 0,
        };
        assert_eq!(bench(&base)[0].status, Status::Ok);
        let wrong = bench(&BenchFacts {
            wrong: 3,
            ..base.clone()
        });
        assert_eq!(wrong[0].status, Status::Fail);
        assert!(wrong[0].detail.contains("3 wrong"));
        let err = bench(&BenchFacts {
            result: Err("no shm".into()),
            ..base
        });
        assert_eq!(err[0].status, Status::Fail);
        assert!(err[0].fix.is_some());
    }

    /// The verdict follows the loader's binding and the file's content, not
    /// the first libnccl mapped or a path that looks like oxccl's.
    #[test]
    fn torch_binding_decides_by_symbol_and_content() {
        let nv = "/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2";
        let ox = "/opt/x/libnccl.so.2";
        let report = |binding: &str, via: &str, oxccl: bool| {
            serde_json::json!({"version": "2.9.0", "cuda": "13.0", "nccl": "2.28.9",
                "nccl_available": true,
                "loaded": ["/venv/torch/lib/libtorch_cuda.so", nv, ox],
                "binding": binding, "binding_via": via, "binding_oxccl": oxccl})
        };
        // Preloaded oxccl, mapped after NVIDIA's copy: oxccl's.
        let c = pytorch(&TorchFacts::Report(report(ox, "global scope", true)), 2);
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.contains(&format!("ncclGetVersion binds to {ox} (through the global scope: LD_PRELOAD or the program): oxccl's")), "{c:?}");
        // NVIDIA's through libtorch_cuda's dependencies: not oxccl's, with the way to change it.
        let c = pytorch(
            &TorchFacts::Report(report(nv, "/venv/torch/lib/libtorch_cuda.so", false)),
            2,
        );
        assert!(c.detail.contains(&format!("binds to {nv} (through /venv/torch/lib/libtorch_cuda.so's own dependencies): not oxccl's")), "{c:?}");
        assert!(c.detail.contains("oxccl run -- CMD"), "{c:?}");
        // A path naming oxccl proves nothing.
        let c = pytorch(
            &TorchFacts::Report(report(
                "/home/u/oxccl/target-x/libnccl.so.2",
                "global scope",
                false,
            )),
            2,
        );
        assert!(c.detail.contains("not oxccl's"), "{c:?}");
    }

    #[test]
    fn nv18_expectation_is_300() {
        let e = expected_nvlink_busbw(18);
        assert!((300.0..305.0).contains(&e), "{e}");
    }
}
