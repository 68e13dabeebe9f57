//! The checks: pure functions from facts (gathered by [`super::probe`]) to
//! findings. Nothing here touches the machine.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use oxccl_bootstrap::ifname::{self, Interface};
use oxccl_bootstrap::Family;
use oxccl_core::elf;
use oxccl_core::params::{self, Params};

use super::{Check, Status};

const ENV: &str = "Environment";
const SHM: &str = "Shared memory and limits";
const NET: &str = "Network";
const DRIVER: &str = "CUDA driver and NVRTC";
const NCCL: &str = "NCCL libraries";
const PEERS: &str = "Peers";

const MIB: u64 = 1 << 20;

/// `64.0 MiB`, `1.50 GiB`: the transport's own formatting, so the doctor and
/// the /dev/shm error speak the same units.
pub use oxccl_host::transport::shm::fmt_bytes;

// ---------------------------------------------------------------- environment

/// What the environment check looks at.
#[derive(Debug, Clone, Default)]
pub struct EnvFacts {
    /// Every environment variable (the check picks NCCL_*/OXCCL_*).
    pub vars: Vec<(String, String)>,
    /// Configuration files read, with their text, in precedence order.
    pub files: Vec<(String, String)>,
    /// NVIDIA GPUs the driver lists (/proc/driver/nvidia/gpus).
    pub gpus: usize,
    /// NVSwitch present (/proc/driver/nvidia-nvswitch or /dev/nvidia-nvswitch*).
    pub nvswitch: bool,
    /// InfiniBand devices (/sys/class/infiniband).
    pub ib_devices: Vec<String>,
}

/// Unknown names (with the nearest known one), malformed values and risky settings.
pub fn environment(f: &EnvFacts) -> Vec<Check> {
    let mut out = Vec::new();
    let mut vars: Vec<&(String, String)> = f
        .vars
        .iter()
        .filter(|(k, _)| params::is_checked_name(k))
        .collect();
    vars.sort();
    let mut good = Vec::new();
    for (name, value) in &vars {
        let id = format!("env.{name}");
        match params::lookup(name) {
            None => {
                let c = match params::closest(name) {
                    Some(near) => Check::new(
                        id,
                        ENV,
                        Status::Warn,
                        format!("{name} is not a known variable (ignored); did you mean {near}?"),
                    )
                    .fix(format!("rename it: export {near}={value}; unset {name}")),
                    None => Check::new(
                        id,
                        ENV,
                        Status::Warn,
                        format!("{name} is not a known variable (ignored)"),
                    )
                    .fix(format!(
                        "unset {name}, or see docs/env.md for the known names"
                    )),
                };
                out.push(c);
            }
            Some(info) => {
                if value.trim().is_empty() {
                    continue; // empty counts as unset
                }
                match info.check(value) {
                    Ok(()) => good.push(name.as_str()),
                    Err(expected) => {
                        let default = if info.default.is_empty() {
                            "unset (auto)".to_string()
                        } else {
                            info.default.to_string()
                        };
                        out.push(
                            Check::new(
                                id,
                                ENV,
                                Status::Fail,
                                format!(
                                    "{name}={} is malformed: expected {expected}; the default {default} is used instead",
                                    info.display_value(value)
                                ),
                            )
                            .fix(format!("set {name} to {expected}, or unset it")),
                        );
                    }
                }
            }
        }
    }
    let files: Vec<(&str, &str)> = f
        .files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    let no_env: &[(&str, &str)] = &[];
    if let Ok(p) = Params::from_sources(no_env, &files) {
        for w in p.warnings() {
            out.push(
                Check::new("env.conf_file", ENV, Status::Warn, w)
                    .fix("correct or remove that line of the configuration file"),
            );
        }
    }
    // Risky settings, judged on the values in effect.
    let p = Params::from_sources(&f.vars, &files).unwrap_or_default();
    if p.get(&params::P2P_DISABLE) && f.gpus >= 2 {
        let link = if f.nvswitch {
            "NVLink (NVSwitch)"
        } else {
            "NVLink or PCIe"
        };
        out.push(
            Check::new(
                "env.risky.P2P_DISABLE",
                ENV,
                Status::Warn,
                format!(
                    "NCCL_P2P_DISABLE=1 on a machine with {} GPUs: traffic between them goes through host memory instead of {link}",
                    f.gpus
                ),
            )
            .fix("unset NCCL_P2P_DISABLE unless it works around a known P2P problem here"),
        );
    }
    if p.get(&params::IB_DISABLE) == Some(0) && f.ib_devices.is_empty() {
        out.push(
            Check::new(
                "env.risky.IB_DISABLE",
                ENV,
                Status::Warn,
                "NCCL_IB_DISABLE=0 but there is no InfiniBand device (/sys/class/infiniband is empty): NCCL falls back to sockets".into(),
            )
            .fix("unset NCCL_IB_DISABLE, or run where the InfiniBand driver is loaded"),
        );
    }
    if p.get(&params::SHM_DISABLE) {
        out.push(
            Check::new(
                "env.risky.SHM_DISABLE",
                ENV,
                Status::Warn,
                "NCCL_SHM_DISABLE=1: ranks on one host talk over TCP instead of shared memory (slower)".into(),
            )
            .fix("unset NCCL_SHM_DISABLE unless /dev/shm cannot be used here"),
        );
    }
    if out.is_empty() {
        let detail = if good.is_empty() {
            "no NCCL_*/OXCCL_* variables set".to_string()
        } else {
            format!(
                "{} variable(s) set, all known and well-formed: {}",
                good.len(),
                good.join(", ")
            )
        };
        out.push(Check::new("env", ENV, Status::Ok, detail));
    }
    out
}

// ---------------------------------------------------------------- shared memory

/// What the /dev/shm check looks at.
#[derive(Debug, Clone)]
pub struct ShmFacts {
    /// (free, total) bytes of /dev/shm, or why they are unknown.
    pub space: Result<(u64, u64), String>,
    /// Where `space` came from.
    pub space_from: String,
    /// Ranks on this host, and where the number came from.
    pub ranks: u64,
    pub ranks_from: String,
    /// Collective + point-to-point channels per peer (the host default, or the settings).
    pub channels: u64,
    /// Data bytes of each ring (NCCL_BUFFSIZE, host default 1 MiB).
    pub capacity: u64,
    /// NCCL_SHM_DISABLE=1.
    pub disabled: bool,
    /// Running in a container (the fix differs).
    pub container: bool,
}

/// Bytes of /dev/shm `ranks` ranks on one host need: each rank's segment holds
/// one ring per (other local rank, channel), laid out as the transport does
/// (`oxccl_host::transport::ShmRingLayout`).
pub fn shm_need(ranks: u64, channels: u64, capacity: u64) -> u64 {
    let layout = oxccl_host::transport::ShmRingLayout {
        npeers: ranks.saturating_sub(1) as usize,
        nchannels: channels as usize,
        capacity: capacity as usize,
    };
    ranks.saturating_mul(layout.segment_size() as u64)
}

/// Bytes of one ring with its header, as the transport lays it out.
fn ring_bytes(capacity: u64) -> u64 {
    oxccl_host::transport::ring::ring_footprint(capacity as usize) as u64
}

pub fn shared_memory(f: &ShmFacts) -> Vec<Check> {
    let id = "shm.size";
    if f.disabled {
        return vec![Check::new(
            id,
            SHM,
            Status::Skip,
            "NCCL_SHM_DISABLE=1: the shared-memory transport is off".into(),
        )];
    }
    let (free, total) = match &f.space {
        Ok(s) => *s,
        Err(why) => {
            return vec![Check::new(
                id,
                SHM,
                Status::Skip,
                format!("/dev/shm size unknown: {why}"),
            )]
        }
    };
    let need = shm_need(f.ranks, f.channels, f.capacity);
    let formula = format!(
        "need {} = {} ranks × {} peers × {} channels × {} ring ({} NCCL_BUFFSIZE + headers); ranks {}",
        fmt_bytes(need),
        f.ranks,
        f.ranks.saturating_sub(1),
        f.channels,
        fmt_bytes(ring_bytes(f.capacity)),
        fmt_bytes(f.capacity),
        f.ranks_from
    );
    let have = format!(
        "/dev/shm: {} free of {} ({})",
        fmt_bytes(free),
        fmt_bytes(total),
        f.space_from
    );
    let suggest_gib = (need + total.saturating_sub(free)).div_ceil(1 << 30).max(1) + 1;
    let fix = if f.container {
        format!(
            "start the container with `docker run --shm-size={suggest_gib}g ...` (or `--ipc=host`); on Kubernetes mount an emptyDir with `medium: Memory` at /dev/shm; or lower NCCL_BUFFSIZE"
        )
    } else {
        format!(
            "enlarge it: `sudo mount -o remount,size={suggest_gib}G /dev/shm`; or lower NCCL_BUFFSIZE"
        )
    };
    let detail = format!("{have}\n{formula}");
    let c = if total < need {
        Check::new(
            id,
            SHM,
            Status::Fail,
            format!("/dev/shm is too small for {} ranks: {detail}", f.ranks),
        )
        .fix(fix)
    } else if free < need {
        Check::new(
            id,
            SHM,
            Status::Warn,
            format!(
                "/dev/shm is large enough but too full for {} ranks: {detail}",
                f.ranks
            ),
        )
        .fix("remove stale segments (`ls -l /dev/shm`), or ".to_string() + &fix)
    } else if f.container && total <= 64 * MIB {
        Check::new(
            id,
            SHM,
            Status::Warn,
            format!(
                "/dev/shm is the container default of {}: enough for {} host ranks, but NCCL on GPUs and data-loader workers need more: {detail}",
                fmt_bytes(total),
                f.ranks
            ),
        )
        .fix(fix)
    } else {
        Check::new(
            id,
            SHM,
            Status::Ok,
            format!("/dev/shm is large enough for {} ranks: {detail}", f.ranks),
        )
    };
    vec![c]
}

/// `Max locked memory` of the limits file: (soft, hard) as written.
pub fn parse_memlock(limits: &str) -> Option<(String, String)> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    let mut it = line["Max locked memory".len()..].split_whitespace();
    Some((it.next()?.to_string(), it.next()?.to_string()))
}

/// The memlock limit: unlimited is what RDMA wants; a limit only matters with InfiniBand.
pub fn memlock(limits: &Result<String, String>, have_ib: bool) -> Check {
    let id = "limits.memlock";
    let text = match limits {
        Ok(t) => t,
        Err(why) => {
            return Check::new(
                id,
                SHM,
                Status::Skip,
                format!("memlock limit unknown: {why}"),
            )
        }
    };
    let Some((soft, hard)) = parse_memlock(text) else {
        return Check::new(
            id,
            SHM,
            Status::Skip,
            "memlock limit unknown: no 'Max locked memory' line in /proc/self/limits".into(),
        );
    };
    if soft == "unlimited" {
        return Check::new(id, SHM, Status::Ok, "memlock limit: unlimited".into());
    }
    let shown = match soft.parse::<u64>() {
        Ok(b) => fmt_bytes(b),
        Err(_) => soft.clone(),
    };
    let hard = match hard.parse::<u64>() {
        Ok(b) => fmt_bytes(b),
        Err(_) => hard,
    };
    let detail = format!("memlock limit: {shown} (hard {hard})");
    if have_ib {
        Check::new(
            id,
            SHM,
            Status::Warn,
            format!("{detail}: InfiniBand registration of large buffers needs it unlimited"),
        )
        .fix("`ulimit -l unlimited` (hard limit in /etc/security/limits.conf); in Docker `--ulimit memlock=-1`")
    } else {
        Check::new(
            id,
            SHM,
            Status::Ok,
            format!("{detail} (matters only for InfiniBand/RDMA)"),
        )
    }
}

/// Evidence of a container.
#[derive(Debug, Clone, Default)]
pub struct ContainerFacts {
    /// `docker`, `podman`, `kubernetes`, `containerd`, `lxc` and why, or none.
    pub kind: Option<(String, String)>,
}

pub fn container(f: &ContainerFacts) -> Check {
    match &f.kind {
        Some((k, why)) => Check::new(
            "container",
            SHM,
            Status::Ok,
            format!("running in a container ({k}: {why}); /dev/shm and limits are the container's"),
        ),
        None => Check::new(
            "container",
            SHM,
            Status::Ok,
            "no container detected (/.dockerenv, /run/.containerenv, /proc/1/cgroup)".into(),
        ),
    }
}

/// Which container `/proc/1/cgroup` and marker files point at.
pub fn detect_container(
    dockerenv: bool,
    containerenv: bool,
    cgroup: Option<&str>,
) -> Option<(String, String)> {
    if dockerenv {
        return Some(("docker".into(), "/.dockerenv exists".into()));
    }
    if containerenv {
        return Some(("podman".into(), "/run/.containerenv exists".into()));
    }
    let cg = cgroup?;
    for (needle, kind) in [
        ("kubepods", "kubernetes"),
        ("docker", "docker"),
        ("containerd", "containerd"),
        ("libpod", "podman"),
        ("lxc", "lxc"),
    ] {
        if let Some(line) = cg.lines().find(|l| l.contains(needle)) {
            return Some((kind.into(), format!("/proc/1/cgroup: {}", line.trim())));
        }
    }
    None
}

// ---------------------------------------------------------------- network

/// One interface from /sys/class/net.
#[derive(Debug, Clone, Default)]
pub struct NetIf {
    pub name: String,
    pub operstate: Option<String>,
    pub mtu: Option<u32>,
    pub mac: Option<String>,
}

#[derive(Debug, Clone)]
pub struct NetFacts {
    /// /sys/class/net entries.
    pub ifaces: Vec<NetIf>,
    /// Addresses (getifaddrs on the real root; the fixtures' `ip` files otherwise).
    pub addrs: Vec<Interface>,
    /// Where `addrs` came from, or why they are missing.
    pub addrs_from: Result<String, String>,
    /// NCCL_SOCKET_IFNAME and NCCL_SOCKET_FAMILY as set.
    pub ifname: Option<String>,
    pub family: Option<Family>,
    /// /sys/class/infiniband entries, with their ports' states.
    pub ib_devices: Vec<String>,
    pub ib_ports: Vec<String>,
    /// NCCL_IB_DISABLE as in effect.
    pub ib_disable: Option<i64>,
}

fn is_local_only(name: &str, addr: &IpAddr) -> bool {
    addr.is_loopback()
        || name.starts_with("lo")
        || name.starts_with("docker")
        || name.starts_with("virbr")
        || name.starts_with("veth")
        || name.starts_with("br-")
}

pub fn network(f: &NetFacts) -> Vec<Check> {
    let mut out = Vec::new();
    // Interfaces.
    let mut lines = Vec::new();
    for i in &f.ifaces {
        let addrs: Vec<String> = f
            .addrs
            .iter()
            .filter(|a| a.name == i.name)
            .map(|a| a.addr.to_string())
            .collect();
        lines.push(format!(
            "{}: {}, mtu {}{}, {}",
            i.name,
            i.operstate.as_deref().unwrap_or("state unknown"),
            i.mtu.map_or("?".into(), |m| m.to_string()),
            i.mac
                .as_deref()
                .map(|m| format!(", {m}"))
                .unwrap_or_default(),
            if addrs.is_empty() {
                "no address".to_string()
            } else {
                addrs.join(" ")
            }
        ));
    }
    let from = match &f.addrs_from {
        Ok(s) => format!("addresses from {s}"),
        Err(e) => format!("addresses unknown: {e}"),
    };
    if f.ifaces.is_empty() && f.addrs.is_empty() {
        out.push(Check::new(
            "net.interfaces",
            NET,
            Status::Skip,
            format!("no interfaces found in /sys/class/net; {from}"),
        ));
    } else {
        let usable = f
            .addrs
            .iter()
            .filter(|a| a.up && !is_local_only(&a.name, &a.addr))
            .count();
        let st = if usable > 0 || f.addrs.is_empty() {
            Status::Ok
        } else {
            Status::Warn
        };
        let mut c = Check::new(
            "net.interfaces",
            NET,
            st,
            format!(
                "{} interface(s) ({from})\n{}",
                f.ifaces.len(),
                lines.join("\n")
            ),
        );
        if st == Status::Warn {
            c = c.fix("only loopback or container-bridge interfaces are up: fine on one host, but other hosts cannot reach this one; run with a real network (in Docker `--network=host`)");
        }
        out.push(c);
    }
    // What NCCL_SOCKET_IFNAME selects.
    if f.addrs_from.is_ok() {
        match ifname::select(&f.addrs, f.ifname.as_deref(), f.family) {
            Ok(sel) => {
                let i = &sel.iface;
                let detail = format!(
                    "bootstrap and TCP would use {} {}: it {}",
                    i.name, i.addr, sel.reason
                );
                if is_local_only(&i.name, &i.addr) {
                    out.push(
                        Check::new("net.ifname", NET, Status::Warn, format!("{detail}; other hosts cannot reach it"))
                            .fix("for several hosts, set NCCL_SOCKET_IFNAME to the interface of the network between them (e.g. NCCL_SOCKET_IFNAME=eth0)"),
                    );
                } else {
                    out.push(Check::new("net.ifname", NET, Status::Ok, detail));
                }
            }
            Err(e) => {
                let mut names: Vec<&str> = f
                    .addrs
                    .iter()
                    .filter(|a| a.up)
                    .map(|a| a.name.as_str())
                    .collect();
                names.dedup();
                let fix = match &f.ifname {
                    Some(_) => format!(
                        "set NCCL_SOCKET_IFNAME to one of the interfaces that are up ({}) — a prefix such as `eth`, `=name` for an exact name, `^name` to exclude — or unset it",
                        if names.is_empty() { "none".to_string() } else { names.join(", ") }
                    ),
                    None => "bring a network interface up with an address".into(),
                };
                out.push(
                    Check::new("net.ifname", NET, Status::Fail, e.message().to_string()).fix(fix),
                );
            }
        }
    }
    // InfiniBand.
    if f.ib_devices.is_empty() {
        out.push(Check::new(
            "net.ib",
            NET,
            Status::Ok,
            "no InfiniBand devices (/sys/class/infiniband): hosts talk over TCP".into(),
        ));
    } else {
        let detail = format!(
            "InfiniBand devices: {}{}",
            f.ib_devices.join(", "),
            if f.ib_ports.is_empty() {
                String::new()
            } else {
                format!(" (ports: {})", f.ib_ports.join(", "))
            }
        );
        if f.ib_disable.is_some_and(|v| v != 0) {
            out.push(
                Check::new(
                    "net.ib",
                    NET,
                    Status::Warn,
                    format!("{detail}; but NCCL_IB_DISABLE={}: NCCL uses TCP instead", f.ib_disable.unwrap_or(1)),
                )
                .fix("unset NCCL_IB_DISABLE to use InfiniBand (oxccl itself talks TCP between hosts for now)"),
            );
        } else {
            out.push(Check::new("net.ib", NET, Status::Ok, detail));
        }
    }
    out
}

// ---------------------------------------------------------------- driver

/// What the driver probe (a child process) reported.
#[derive(Debug, Clone)]
pub enum DriverFacts {
    /// Under a fixture sysroot: what NVIDIA files exist there.
    Fixture(Vec<String>),
    /// The child's report, or why it gave none.
    Probed {
        driver: Result<ProbeDriver, String>,
        cuda_visible_devices: Option<String>,
    },
}

/// The child's view of the driver and NVRTC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeDriver {
    /// `ok`, `no_driver`, `no_gpu`, `failed`.
    pub state: String,
    pub path: Option<String>,
    pub version: Option<i64>,
    pub devices: Option<i64>,
    pub message: Option<String>,
    /// NVRTC: path and version, or the error.
    pub nvrtc: Result<(String, String), String>,
}

pub fn driver(f: &DriverFacts) -> Vec<Check> {
    let (d, cvd) = match f {
        DriverFacts::Fixture(files) => {
            let detail = if files.is_empty() {
                "not probed under --sysroot; no NVIDIA driver files there".to_string()
            } else {
                format!("not probed under --sysroot; present: {}", files.join(", "))
            };
            return vec![Check::new("driver", DRIVER, Status::Skip, detail)];
        }
        DriverFacts::Probed {
            driver,
            cuda_visible_devices,
        } => (driver, cuda_visible_devices),
    };
    let d = match d {
        Ok(d) => d,
        Err(why) => {
            return vec![Check::new(
                "driver",
                DRIVER,
                Status::Fail,
                format!("the driver probe gave no answer: {why}"),
            )
            .fix("a hanging or crashing libcuda.so.1: check `nvidia-smi`, and reinstall the driver if it hangs too")]
        }
    };
    let mut out = Vec::new();
    let cvd_txt = match cvd {
        Some(v) => format!("; CUDA_VISIBLE_DEVICES={v}"),
        None => String::new(),
    };
    let msg = d.message.clone().unwrap_or_default();
    match d.state.as_str() {
        "ok" => {
            let v = d.version.unwrap_or(0);
            out.push(Check::new(
                "driver",
                DRIVER,
                Status::Ok,
                format!(
                    "{}: CUDA driver {}.{}, {} GPU(s) visible{cvd_txt}",
                    d.path.as_deref().unwrap_or("libcuda"),
                    v / 1000,
                    (v % 1000) / 10,
                    d.devices.unwrap_or(0)
                ),
            ));
        }
        "no_driver" => out.push(Check::new(
            "driver",
            DRIVER,
            Status::Skip,
            format!("no CUDA driver (libcuda.so.1 not found): host collectives only{cvd_txt}"),
        )),
        "no_gpu" if msg.contains("STUB") || d.path.as_deref().is_some_and(|p| p.contains("stubs")) => out.push(
            Check::new(
                "driver",
                DRIVER,
                Status::Fail,
                format!("{} is the CUDA toolkit's stub library, found before the real driver", d.path.as_deref().unwrap_or("libcuda")),
            )
            .fix("take the toolkit's `stubs` folder out of LD_LIBRARY_PATH (it is for linking only)"),
        ),
        "no_gpu" => {
            let hidden = cvd.as_deref().is_some_and(|v| v.trim().is_empty() || v.trim() == "-1");
            let c = Check::new(
                "driver",
                DRIVER,
                if hidden { Status::Warn } else { Status::Skip },
                format!("{}: no usable GPU: {msg}{cvd_txt}", d.path.as_deref().unwrap_or("libcuda")),
            );
            out.push(if hidden {
                c.fix("CUDA_VISIBLE_DEVICES hides every GPU: unset it or list the GPUs to use (e.g. 0,1)")
            } else {
                c
            });
        }
        _ => out.push(
            Check::new("driver", DRIVER, Status::Fail, format!("the CUDA driver is broken: {msg}"))
                .fix("check `nvidia-smi`; a driver/library version mismatch needs a reboot or a driver reinstall"),
        ),
    }
    let drv = d.version.filter(|_| d.state == "ok");
    out.push(match &d.nvrtc {
        Ok((path, v)) => match (drv, nvrtc_code(v)) {
            (Some(dv), Some(nv)) if nv > dv => Check::new(
                "nvrtc",
                DRIVER,
                Status::Fail,
                format!(
                    "NVRTC {v} ({path}) is newer than the driver's CUDA {}.{}: the PTX it writes does not load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
                    dv / 1000,
                    (dv % 1000) / 10
                ),
            )
            .fix(format!(
                "use an NVRTC no newer than the driver (e.g. `pip install nvidia-cuda-nvrtc=={}.{}.*` and point OXCCL_NVRTC at its lib folder), or upgrade the driver",
                dv / 1000,
                (dv % 1000) / 10
            )),
            _ => Check::new("nvrtc", DRIVER, Status::Ok, format!("NVRTC {v}: {path}")),
        },
        Err(e) if d.state != "ok" => Check::new(
            "nvrtc",
            DRIVER,
            Status::Skip,
            e.strip_prefix("CUDA error: ").unwrap_or(e).to_string(),
        ),
        Err(e) => Check::new("nvrtc", DRIVER, Status::Fail, format!("NVRTC not found (GPU kernels cannot be compiled): {e}"))
            .fix("`pip install nvidia-cuda-nvrtc-cu13`, install the CUDA toolkit, or point OXCCL_NVRTC at libnvrtc.so.13"),
    });
    out
}

/// `13.0` → 13000, the driver's version encoding (major × 1000 + minor × 10).
pub fn nvrtc_code(v: &str) -> Option<i64> {
    let (maj, min) = v.trim().split_once('.')?;
    let min = min.split('.').next()?;
    Some(maj.parse::<i64>().ok()? * 1000 + min.parse::<i64>().ok()? * 10)
}

// ---------------------------------------------------------------- NCCL

/// One `libnccl.so*` file that a process could load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclLib {
    /// As found (machine path).
    pub path: String,
    /// What it resolves to (symlinks followed), machine path.
    pub target: String,
    /// Why it is visible (`LD_LIBRARY_PATH`, `loader cache`, `pip`...).
    pub origin: String,
    /// On the dynamic loader's search path (LD_PRELOAD, LD_LIBRARY_PATH, cache, defaults).
    pub on_loader_path: bool,
    /// The version, and how it was learned; or why it is unknown.
    pub version: Result<(String, &'static str), String>,
}

#[derive(Debug, Clone, Default)]
pub struct NcclFacts {
    /// Every candidate, in the loader's search order (loader-path ones first).
    pub libs: Vec<NcclLib>,
    /// Where was looked, for the report when nothing is found.
    pub searched: usize,
    /// Notes on what could not be read (ldconfig missing...).
    pub notes: Vec<String>,
}

/// The version in a file name: `libnccl.so.2.28.9` → `2.28.9`.
pub fn version_from_name(name: &str) -> Option<String> {
    let v = name.rsplit('/').next()?.strip_prefix("libnccl.so.")?;
    let parts: Vec<&str> = v.split('.').collect();
    (parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
    .then(|| v.to_string())
}

/// `ncclGetVersion`'s code as major.minor.patch (codes below 10000 are NCCL < 2.9's).
pub fn decode_nccl_version(code: i64) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

pub fn nccl_libraries(f: &NcclFacts) -> Vec<Check> {
    let mut out = Vec::new();
    if f.libs.is_empty() {
        let mut d = format!("no libnccl.so* found ({} folders searched)", f.searched);
        for n in &f.notes {
            d.push('\n');
            d.push_str(n);
        }
        out.push(Check::new("nccl.libs", NCCL, Status::Skip, d));
        return out;
    }
    // Distinct files (by target), with their versions.
    let mut lines = Vec::new();
    let mut versions: Vec<(String, String)> = Vec::new(); // (version, first path)
    for l in &f.libs {
        let v = match &l.version {
            Ok((v, how)) => {
                if !versions.iter().any(|(x, _)| x == v) {
                    versions.push((v.clone(), l.path.clone()));
                }
                format!("{v} ({how})")
            }
            Err(e) => format!("version unknown: {e}"),
        };
        let target = if l.target != l.path {
            format!(" -> {}", l.target)
        } else {
            String::new()
        };
        lines.push(format!("{}{target}: {v} [{}]", l.path, l.origin));
    }
    let chosen = f.libs.iter().find(|l| {
        l.on_loader_path && (l.origin == "LD_PRELOAD" || l.path.ends_with("/libnccl.so.2"))
    });
    let load = match chosen {
        Some(l) => format!(
            "a program linked with -lnccl (libnccl.so.2) and no RPATH/RUNPATH would load {} ({}{}); `--program PATH` answers for a given one",
            l.path,
            match l.origin.as_str() {
                "LD_PRELOAD" => "LD_PRELOAD names it".to_string(),
                o => format!("first libnccl.so.2 in the loader's search order: {o}"),
            },
            match &l.version {
                Ok((v, _)) => format!(", version {v}"),
                Err(_) => String::new(),
            }
        ),
        None => "no libnccl.so.2 on the dynamic loader's path: only programs that name a folder (PyTorch's RPATH to pip's nvidia/nccl/lib) load one".into(),
    };
    let mut detail_tail = lines.join("\n");
    for n in &f.notes {
        detail_tail.push('\n');
        detail_tail.push_str(n);
    }
    if versions.len() > 1 {
        let list: Vec<String> = versions.iter().map(|(v, p)| format!("{v} ({p})")).collect();
        out.push(
            Check::new(
                "nccl.versions",
                NCCL,
                Status::Warn,
                format!("several NCCL versions are visible: {}\n{load}\n{detail_tail}", list.join(", ")),
            )
            .fix("make the one you mean come first: put its folder first in LD_LIBRARY_PATH, or LD_PRELOAD its full path; remove copies you do not use"),
        );
    } else {
        out.push(Check::new(
            "nccl.versions",
            NCCL,
            Status::Ok,
            format!(
                "{} NCCL library file(s), {}\n{load}\n{detail_tail}",
                f.libs.len(),
                match versions.first() {
                    Some((v, _)) => format!("version {v}"),
                    None => "version unknown".into(),
                }
            ),
        ));
    }
    out
}

/// Which libnccl.so.2 one program would load ([`super::loader::program_facts`]).
#[derive(Debug, Clone)]
pub struct ProgramFacts {
    /// The program (machine path, symlinks resolved once read).
    pub program: String,
    /// Named by `--program` (else found: PyTorch's libtorch_cuda.so).
    pub given: bool,
    /// What it says and the search, or why it cannot be read.
    pub result: Result<(elf::Dynamic, elf::Lookup), String>,
    /// The loaded library's version, when one is loaded.
    pub version: Option<Result<(String, &'static str), String>>,
    /// Why the loader cache was not read (its folders came from /etc/ld.so.conf).
    pub cache_note: Option<String>,
}

fn step_line(st: &elf::Step) -> String {
    let via = if st.written == st.path || st.written == "libnccl.so.2" {
        String::new()
    } else {
        format!("{} → ", st.written)
    };
    match &st.outcome {
        elf::Outcome::Loaded => format!("✔ {}: {via}{} (loaded)", st.rule.name(), st.path),
        elf::Outcome::Shadowed => format!(
            "· {}: {via}{} (there too, not loaded)",
            st.rule.name(),
            st.path
        ),
        elf::Outcome::Skipped(why) => {
            format!("✗ {}: {via}{}: passed over: {why}", st.rule.name(), st.path)
        }
        elf::Outcome::Missing => format!("  {}: {via}{} (missing)", st.rule.name(), st.path),
    }
}

/// Which `libnccl.so.2` a program would load, by which rule, and what it shadows.
pub fn nccl_program(f: &ProgramFacts) -> Check {
    let id = "nccl.program";
    let what = if f.given { "--program" } else { "PyTorch's" };
    let (d, l) = match &f.result {
        Ok(x) => x,
        Err(e) if f.given => {
            return Check::new(id, NCCL, Status::Fail, format!("{what} {} cannot be read as an ELF program: {e}", f.program))
                .fix("pass the path of an executable or shared library (for Python: the extension or library that links NCCL, e.g. torch/lib/libtorch_cuda.so)")
        }
        Err(e) => {
            return Check::new(
                id,
                NCCL,
                Status::Skip,
                format!("{what} {} cannot be read: {e}", f.program),
            )
        }
    };
    let prog = &f.program;
    if !d.dynamic {
        return Check::new(
            id,
            NCCL,
            Status::Ok,
            format!("{prog} is statically linked: it loads no libnccl.so.2"),
        );
    }
    let r = &l.resolution;
    let name = &r.name;
    // The search, without the folders that do not have it.
    let mut lines: Vec<String> = Vec::new();
    let mut absent = 0;
    for st in &r.steps {
        if st.outcome == elf::Outcome::Missing && st.rule != elf::Rule::Preload {
            absent += 1;
        } else {
            lines.push(format!("  {}", step_line(st)));
        }
    }
    if absent > 0 {
        lines.push(format!(
            "  ({absent} other place(s) searched do not have it)"
        ));
    }
    let needer = if l.dlopen {
        format!(
            "{prog} does not need {name} ({} object(s) mapped); if it dlopens {name} by name",
            l.objects
        )
    } else if l.chain.len() == 1 {
        format!("{prog} needs {name} directly")
    } else {
        format!("{prog} needs {name} through {}", l.chain[1..].join(" → "))
    };
    let mut tail = format!(
        "
search order: LD_PRELOAD, DT_RPATH (only without DT_RUNPATH), LD_LIBRARY_PATH, DT_RUNPATH, loader cache, default folders
{}",
        lines.join("
")
    );
    if let Some(n) = &f.cache_note {
        tail.push_str(&format!(
            "
(loader cache not read: {n})"
        ));
    }
    if !l.missing.is_empty() {
        let m: Vec<String> = l
            .missing
            .iter()
            .take(5)
            .map(|(n, by)| format!("{n} (needed by {by})"))
            .collect();
        tail.push_str(&format!(
            "
dependencies not found on the way: {}{}",
            m.join(", "),
            if l.missing.len() > 5 { ", ..." } else { "" }
        ));
    }
    let Some(chosen) = r.loaded() else {
        if l.dlopen {
            return Check::new(
                id,
                NCCL,
                Status::Skip,
                format!("{needer}, the loader would find none{tail}"),
            );
        }
        return Check::new(id, NCCL, Status::Fail, format!("{needer}, and the loader finds none: it would not start (\"error while loading shared libraries: {name}\"){tail}"))
            .fix(format!("put the folder holding {name} in LD_LIBRARY_PATH, or LD_PRELOAD its full path (oxccl's libnccl.so.2 works), or install NCCL (`pip install nvidia-nccl-cu13`)"));
    };
    let version = match &f.version {
        Some(Ok((v, how))) => format!(", version {v} ({how})"),
        Some(Err(e)) => format!(", version unknown: {e}"),
        None => String::new(),
    };
    let rule_txt = match &chosen.rule {
        elf::Rule::Rpath { .. } | elf::Rule::Runpath { .. } | elf::Rule::LdLibraryPath => {
            format!("{} entry {}", chosen.rule.name(), chosen.written)
        }
        other => other.name(),
    };
    let head = format!(
        "{needer}, the loader takes {}{version}: {rule_txt}; {}",
        chosen.path,
        chosen.rule.why()
    );
    // LD_LIBRARY_PATH's copy is ignored because DT_RPATH comes first: the classic surprise.
    let llp_shadowed = r
        .steps
        .iter()
        .find(|s| s.rule == elf::Rule::LdLibraryPath && s.outcome == elf::Outcome::Shadowed);
    if let (elf::Rule::Rpath { of }, Some(s)) = (&chosen.rule, llp_shadowed) {
        return Check::new(
            id,
            NCCL,
            Status::Warn,
            format!("{head}
LD_LIBRARY_PATH's {} is not used: DT_RPATH of {of} is searched first{tail}", s.path),
        )
        .fix(format!("LD_PRELOAD={} loads it (LD_PRELOAD beats DT_RPATH); or relink with -Wl,--enable-new-dtags (DT_RUNPATH, which LD_LIBRARY_PATH beats), or `patchelf --remove-rpath`", s.path));
    }
    let bad_preload = r.steps.iter().find(|s| {
        s.rule == elf::Rule::Preload
            && !matches!(s.outcome, elf::Outcome::Loaded | elf::Outcome::Shadowed)
    });
    if let Some(p) = bad_preload {
        let why = match &p.outcome {
            elf::Outcome::Skipped(w) => w.clone(),
            _ => "not found".into(),
        };
        return Check::new(
            id,
            NCCL,
            Status::Warn,
            format!("{head}
LD_PRELOAD entry {} does not stand in for {name}: {why}{tail}", p.written),
        )
        .fix(format!("LD_PRELOAD the full path of a library whose SONAME is {name} (oxccl's libnccl.so.2 has it); check with `readelf -d FILE | grep SONAME`"));
    }
    Check::new(id, NCCL, Status::Ok, format!("{head}{tail}"))
}

// ---------------------------------------------------------------- peers

/// The port a `--peers` entry without one uses: NCCL_COMM_ID's, else 29500.
pub fn default_peer_port(comm_id: Option<&str>) -> u16 {
    comm_id
        .and_then(|c| c.rsplit_once(':'))
        .and_then(|(_, p)| p.trim().parse().ok())
        .unwrap_or(29500)
}

/// One `--peers` entry's outcome.
#[derive(Debug, Clone)]
pub struct PeerResult {
    pub target: String,
    pub result: Result<(SocketAddr, Duration), String>,
}

pub fn peers(results: &[PeerResult]) -> Vec<Check> {
    results
        .iter()
        .map(|r| {
            let id = format!("peers.{}", r.target);
            match &r.result {
                Ok((addr, rtt)) => Check::new(
                    id,
                    PEERS,
                    Status::Ok,
                    format!(
                        "{} ({addr}) accepts TCP: connect took {:.2} ms",
                        r.target,
                        rtt.as_secs_f64() * 1e3
                    ),
                ),
                Err(e) => Check::new(id, PEERS, Status::Fail, format!("{} cannot be reached: {e}", r.target)).fix(
                    "check that a process listens there (rank 0 listens on NCCL_COMM_ID's port) and that no firewall drops TCP between the hosts (`nc -vz HOST PORT`; e.g. `sudo ufw allow from <peer subnet>`); NCCL also connects on ephemeral ports, so allow the whole range between the nodes",
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_need_formula() {
        // 8 ranks, 3 channels, 1 MiB rings: 8 × (128 + 7 × 3 × (128 + 1 MiB)).
        assert_eq!(shm_need(8, 3, MIB), 8 * (128 + 7 * 3 * (128 + MIB)));
        assert_eq!(shm_need(1, 3, MIB), 128);
    }

    #[test]
    fn versions() {
        assert_eq!(
            version_from_name("/x/libnccl.so.2.28.9").as_deref(),
            Some("2.28.9")
        );
        assert_eq!(version_from_name("libnccl.so.2"), None);
        assert_eq!(decode_nccl_version(22809), "2.28.9");
        assert_eq!(decode_nccl_version(2708), "2.7.8");
    }

    #[test]
    fn memlock_line() {
        let t = "Limit Soft Limit Hard Limit Units\nMax locked memory         8388608              8388608              bytes\n";
        assert_eq!(parse_memlock(t), Some(("8388608".into(), "8388608".into())));
    }

    fn probed(
        state: &str,
        path: &str,
        version: i64,
        nvrtc: Result<(String, String), String>,
    ) -> Vec<Check> {
        driver(&DriverFacts::Probed {
            driver: Ok(ProbeDriver {
                state: state.into(),
                path: Some(path.into()),
                version: Some(version),
                devices: Some(2),
                message: Some(if state == "no_gpu" {
                    "CUDA_ERROR_STUB_LIBRARY".into()
                } else {
                    "boom".into()
                }),
                nvrtc,
            }),
            cuda_visible_devices: None,
        })
    }

    /// The driver section's ✘ paths (the probe runs only on the real root, so
    /// they are proved here on the facts).
    #[test]
    fn driver_failures() {
        let nv = || Ok(("/x/libnvrtc.so.13".to_string(), "13.0".to_string()));
        let c = probed("ok", "/usr/lib/libcuda.so.1", 13000, nv());
        assert_eq!(
            (c[0].status, c[1].status),
            (Status::Ok, Status::Ok),
            "{c:?}"
        );
        // The toolkit's stub found first.
        let c = probed(
            "no_gpu",
            "/usr/local/cuda/lib64/stubs/libcuda.so.1",
            13000,
            nv(),
        );
        assert_eq!(c[0].status, Status::Fail);
        assert!(c[0].fix.as_deref().unwrap().contains("stubs"));
        // A broken driver.
        let c = probed("failed", "/usr/lib/libcuda.so.1", 0, nv());
        assert_eq!(c[0].status, Status::Fail);
        assert!(c[0].fix.is_some());
        // NVRTC missing while the driver works.
        let c = probed(
            "ok",
            "/usr/lib/libcuda.so.1",
            13000,
            Err("not found".into()),
        );
        assert_eq!(c[1].status, Status::Fail);
        assert!(c[1].fix.as_deref().unwrap().contains("OXCCL_NVRTC"));
        // NVRTC newer than the driver.
        let c = probed("ok", "/usr/lib/libcuda.so.1", 12080, nv());
        assert_eq!(c[1].status, Status::Fail, "{c:?}");
        assert!(
            c[1].detail.contains("newer than the driver's CUDA 12.8"),
            "{c:?}"
        );
        assert!(c[1]
            .fix
            .as_deref()
            .unwrap()
            .contains("nvidia-cuda-nvrtc==12.8.*"));
        // A probe that hung or crashed.
        let c = driver(&DriverFacts::Probed {
            driver: Err("loading it did not finish within 5 s (killed)".into()),
            cuda_visible_devices: None,
        });
        assert_eq!(c[0].status, Status::Fail);
        assert!(c[0].fix.is_some());
        assert_eq!(nvrtc_code("13.0"), Some(13000));
        assert_eq!(nvrtc_code("12.8.93"), Some(12080));
        assert_eq!(nvrtc_code("x"), None);
    }

    #[test]
    fn ports() {
        assert_eq!(default_peer_port(Some("10.0.0.1:1234")), 1234);
        assert_eq!(default_peer_port(None), 29500);
    }
}
