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
const DRIVER: &str = "CUDA driver, runtimes and NVRTC";
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
                    // oxccl's own variables (the perf launcher's, test hooks)
                    // are not the user's settings.
                    Ok(()) if info.internal => {}
                    Ok(()) => good.push(name.as_str()),
                    Err(expected) => out.push(malformed_value(id, info, value, &expected)),
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

/// The ✘ for a value `info` cannot parse: what was expected, the default
/// used instead and, as the fix, the value to set: the nearest valid one
/// where the grammar is enumerated (`set NCCL_ALGO=Ring (or unset it)`),
/// else the form expected.
fn malformed_value(id: String, info: &params::ParamInfo, value: &str, expected: &str) -> Check {
    let name = info.name;
    // (what is used instead, the fix's way back to it)
    let (instead, or_unset) = if info.default.is_empty() {
        (
            "it is treated as unset (oxccl chooses)".to_string(),
            "or unset it: oxccl then chooses".to_string(),
        )
    } else {
        (
            format!("the default {} is used instead", info.default),
            format!("or unset it for the default, {}", info.default),
        )
    };
    let suggestion = info.suggest(value);
    let hint = match &suggestion {
        Some(v) => format!(" (did you mean {name}={v}?)"),
        None => String::new(),
    };
    let fix = match &suggestion {
        Some(v) => format!("set {name}={v} ({or_unset})"),
        None => format!("set {name} to {expected} ({or_unset})"),
    };
    Check::new(
        id,
        ENV,
        Status::Fail,
        format!(
            "{name}={} is malformed: expected {expected}{hint}; {instead}",
            info.display_value(value)
        ),
    )
    .fix(fix)
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

/// Which container the marker files, `/proc/1/cgroup`, `/proc/self/mountinfo`
/// and `KUBERNETES_SERVICE_HOST` point at.
pub fn detect_container(
    dockerenv: bool,
    containerenv: bool,
    cgroup: Option<&str>,
    mountinfo: Option<&str>,
    kubernetes_service_host: Option<&str>,
) -> Option<(String, String)> {
    if dockerenv {
        return Some(("docker".into(), "/.dockerenv exists".into()));
    }
    if containerenv {
        return Some(("podman".into(), "/run/.containerenv exists".into()));
    }
    if let Some(cg) = cgroup {
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
    }
    if let Some(h) = kubernetes_service_host.filter(|h| !h.trim().is_empty()) {
        return Some((
            "kubernetes".into(),
            format!("KUBERNETES_SERVICE_HOST={} is set", h.trim()),
        ));
    }
    // cgroup v2 shows `0::/` inside a container; the bind mounts of
    // /etc/hostname and /etc/resolv.conf still name the runtime's folders.
    let mi = mountinfo?;
    for (needle, kind) in [
        ("/kubelet/pods/", "kubernetes"),
        ("/docker/containers/", "docker"),
        ("/containerd/", "containerd"),
        ("/containers/storage/", "podman"),
    ] {
        if let Some(line) = mi.lines().find(|l| l.contains(needle)) {
            let mount = line.split_whitespace().nth(4).unwrap_or("?");
            return Some((
                kind.into(),
                format!("/proc/self/mountinfo: {mount} comes from {needle}"),
            ));
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
    /// OXCCL_BOOTSTRAP_IFNAME as set (the bootstrap's own interface).
    pub bootstrap_ifname: Option<String>,
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

/// What `setting` (value `spec`) selects for `what`, as the library's own
/// `ifname::select_for` decides it.
fn ifname_check(
    f: &NetFacts,
    id: &'static str,
    setting: &str,
    spec: Option<&str>,
    what: &str,
) -> Check {
    match ifname::select_for(setting, &f.addrs, spec, f.family) {
        Ok(sel) => {
            let i = &sel.iface;
            let detail = format!("{what} would use {} {}: it {}", i.name, i.addr, sel.reason);
            if is_local_only(&i.name, &i.addr) {
                Check::new(id, NET, Status::Warn, format!("{detail}; other hosts cannot reach it"))
                    .fix(format!("for several hosts, set {setting} to the interface of the network between them (e.g. {setting}=eth0)"))
            } else {
                Check::new(id, NET, Status::Ok, detail)
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
            let fix = match spec {
                Some(_) => format!(
                    "set {setting} to one of the interfaces that are up ({}) — a prefix such as `eth`, `=name` for an exact name, `^name` to exclude — or unset it",
                    if names.is_empty() { "none".to_string() } else { names.join(", ") }
                ),
                None => "bring a network interface up with an address".into(),
            };
            Check::new(id, NET, Status::Fail, e.message().to_string()).fix(fix)
        }
    }
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
    // What NCCL_SOCKET_IFNAME (and OXCCL_BOOTSTRAP_IFNAME) select.
    if f.addrs_from.is_ok() {
        match &f.bootstrap_ifname {
            None => out.push(ifname_check(
                f,
                "net.ifname",
                "NCCL_SOCKET_IFNAME",
                f.ifname.as_deref(),
                "bootstrap and TCP",
            )),
            Some(b) => {
                out.push(ifname_check(
                    f,
                    "net.ifname",
                    "NCCL_SOCKET_IFNAME",
                    f.ifname.as_deref(),
                    "TCP data connections",
                ));
                out.push(ifname_check(
                    f,
                    "net.bootstrap_ifname",
                    "OXCCL_BOOTSTRAP_IFNAME",
                    Some(b),
                    "the bootstrap",
                ));
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

// ---------------------------------------------------------------- CUDA runtimes

/// A CUDA version as far as it is known: `13` from a `libcudart.so.13` name,
/// `12.4` from `cudaRuntimeGetVersion` or `libcudart.so.12.4.127`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaVer {
    pub major: u32,
    pub minor: Option<u32>,
}

impl CudaVer {
    /// From the driver's encoding (major × 1000 + minor × 10).
    pub fn from_code(code: i64) -> CudaVer {
        CudaVer {
            major: (code / 1000).max(0) as u32,
            minor: Some(((code % 1000) / 10).max(0) as u32),
        }
    }
}

impl std::fmt::Display for CudaVer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.minor {
            Some(m) => write!(f, "{}.{m}", self.major),
            None => write!(f, "{}", self.major),
        }
    }
}

/// One `libcudart.so*` file that a process could load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudartLib {
    /// As found (machine path).
    pub path: String,
    /// What it resolves to (symlinks followed), machine path.
    pub target: String,
    /// Why it is visible (`LD_LIBRARY_PATH`, `pip (nvidia-cuda-runtime)`...).
    pub origin: String,
    /// The version as written, as parsed, and how it was learned; or why unknown.
    pub version: Result<(String, CudaVer, &'static str), String>,
}

/// What the CUDA runtime check looks at.
#[derive(Debug, Clone, Default)]
pub struct CudartFacts {
    /// Every candidate, loader-path ones first.
    pub libs: Vec<CudartLib>,
    /// Places searched (for the report when nothing is found).
    pub searched: usize,
    /// The newest CUDA the driver supports and where that came from
    /// (`cuDriverGetVersion`, or the kernel module's version and NVIDIA's table).
    pub driver: Option<(CudaVer, String)>,
}

/// `libcudart.so.12.4.127` → `12.4.127` (12.4), `libcudart.so.13` → `13` (major only).
pub fn cudart_version_from_name(name: &str) -> Option<(String, CudaVer)> {
    let v = name.rsplit('/').next()?.strip_prefix("libcudart.so.")?;
    let parts: Vec<&str> = v.split('.').collect();
    if parts.len() > 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let major = parts[0].parse().ok()?;
    let minor = match parts.get(1) {
        Some(m) => Some(m.parse().ok()?),
        None => None,
    };
    Some((v.to_string(), CudaVer { major, minor }))
}

/// The lowest Linux driver of each CUDA release (NVIDIA's release notes,
/// "CUDA Toolkit and Corresponding Driver Versions", GA column), newest first.
/// (CUDA major, minor) and the driver (major, minor, patch) it needs.
type DriverRow = ((u32, u32), (u32, u32, u32));

const DRIVER_TABLE: &[DriverRow] = &[
    ((13, 1), (590, 44, 1)),
    ((13, 0), (580, 65, 6)),
    ((12, 9), (575, 51, 3)),
    ((12, 8), (570, 26, 0)),
    ((12, 6), (560, 28, 3)),
    ((12, 5), (555, 42, 2)),
    ((12, 4), (550, 54, 14)),
    ((12, 3), (545, 23, 6)),
    ((12, 2), (535, 54, 3)),
    ((12, 1), (530, 30, 2)),
    ((12, 0), (525, 60, 13)),
    ((11, 8), (520, 61, 5)),
    ((11, 7), (515, 43, 4)),
    ((11, 6), (510, 39, 1)),
    ((11, 5), (495, 29, 5)),
    ((11, 4), (470, 42, 1)),
    ((11, 3), (465, 19, 1)),
    ((11, 2), (460, 27, 3)),
    ((11, 1), (455, 23, 0)),
    ((11, 0), (450, 36, 6)),
    ((10, 2), (440, 33, 0)),
];

fn parse_driver_triple(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.split('.');
    let a = it.next()?.parse().ok()?;
    let b = it.next().map_or(Some(0), |x| x.parse().ok())?;
    let c = it.next().map_or(Some(0), |x| x.parse().ok())?;
    Some((a, b, c))
}

/// The newest CUDA a kernel driver version (`570.124.06`) supports, by
/// NVIDIA's table (what `cuDriverGetVersion` would say).
pub fn driver_cuda_for(kernel_driver: &str) -> Option<CudaVer> {
    let d = parse_driver_triple(kernel_driver)?;
    DRIVER_TABLE
        .iter()
        .find(|(_, min)| d >= *min)
        .map(|((major, minor), _)| CudaVer {
            major: *major,
            minor: Some(*minor),
        })
}

/// The lowest driver for a CUDA version (`580.65.06`), when the table knows it.
pub fn min_driver_for(v: CudaVer) -> Option<String> {
    let minor = v.minor.unwrap_or(0);
    DRIVER_TABLE
        .iter()
        .filter(|((ma, mi), _)| *ma == v.major && *mi <= minor)
        .map(|(_, (a, b, c))| {
            if *c == 0 {
                format!("{a}.{b:02}")
            } else {
                format!("{a}.{b:02}.{c:02}")
            }
        })
        .next()
}

/// The kernel module's version from `/proc/driver/nvidia/version`
/// (`NVRM version: NVIDIA UNIX ... Kernel Module  580.159.04  Release Build ...`).
pub fn parse_nvrm_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version"))?;
    line.split_whitespace()
        .find(|t| {
            t.contains('.')
                && t.starts_with(|c: char| c.is_ascii_digit())
                && t.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        })
        .map(str::to_string)
}

/// How a runtime stands against the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    Ok,
    /// Same major, newer minor: runs by minor version compatibility, with limits.
    NewerMinor,
    /// Newer major (or a pre-11.1 runtime newer than the driver): cudaErrorInsufficientDriver.
    TooNew,
}

fn fit(rt: CudaVer, drv: CudaVer) -> Fit {
    let dmin = drv.minor.unwrap_or(0);
    if rt.major > drv.major {
        return Fit::TooNew;
    }
    match rt.minor {
        Some(m) if rt.major == drv.major && m > dmin => {
            // Minor version compatibility exists from CUDA 11.1 on.
            if rt.major < 11 || (rt.major == 11 && m == 0) {
                Fit::TooNew
            } else {
                Fit::NewerMinor
            }
        }
        _ => Fit::Ok,
    }
}

/// The pip package that holds a CUDA runtime of `v`.
fn cudart_pip(v: CudaVer) -> String {
    let ver = match v.minor {
        Some(m) => format!("{}.{m}.*", v.major),
        None => format!("{}.*", v.major),
    };
    if v.major >= 13 {
        format!("nvidia-cuda-runtime=={ver}")
    } else {
        format!("nvidia-cuda-runtime-cu{}=={ver}", v.major)
    }
}

/// Every CUDA runtime a process could load, its version, and whether the driver is new enough.
pub fn cuda_runtimes(f: &CudartFacts) -> Vec<Check> {
    let id = "cudart";
    if f.libs.is_empty() {
        return vec![Check::new(
            id,
            DRIVER,
            Status::Skip,
            format!(
                "no CUDA runtime (libcudart.so*) found ({} places searched)",
                f.searched
            ),
        )];
    }
    let mut lines = Vec::new();
    let mut too_new: Vec<(CudaVer, &str)> = Vec::new();
    let mut newer_minor: Vec<(CudaVer, &str)> = Vec::new();
    let mut majors: Vec<(u32, &str)> = Vec::new();
    for l in &f.libs {
        let target = if l.target != l.path {
            format!(" -> {}", l.target)
        } else {
            String::new()
        };
        let (v, verdict) = match &l.version {
            Ok((text, v, how)) => {
                if !majors.iter().any(|(m, _)| *m == v.major) {
                    majors.push((v.major, l.path.as_str()));
                }
                let verdict = match &f.driver {
                    Some((d, _)) => match fit(*v, *d) {
                        Fit::Ok => String::new(),
                        Fit::NewerMinor => {
                            newer_minor.push((*v, l.path.as_str()));
                            format!(": newer than the driver's CUDA {d} (runs by minor version compatibility)")
                        }
                        Fit::TooNew => {
                            too_new.push((*v, l.path.as_str()));
                            format!(": too new for the driver's CUDA {d}")
                        }
                    },
                    None => String::new(),
                };
                let shown = if v.minor.is_none() {
                    format!("CUDA {text} (minor unknown)")
                } else {
                    format!("CUDA {text}")
                };
                (format!("{shown} ({how})"), verdict)
            }
            Err(e) => (format!("version unknown: {e}"), String::new()),
        };
        lines.push(format!("{}{target}: {v} [{}]{verdict}", l.path, l.origin));
    }
    let drv_txt = match &f.driver {
        Some((d, from)) => format!("the driver supports CUDA ≤ {d} ({from})"),
        None => "no driver to compare with".to_string(),
    };
    let list = lines.join("\n");
    let mut out = Vec::new();
    let upgrade = |need: CudaVer, d: CudaVer| {
        let min = min_driver_for(need).map_or(String::new(), |m| format!(" ≥ {m}"));
        format!(
            "upgrade the driver to{min} (CUDA {need}'s minimum), or use a runtime no newer than the driver's CUDA {d} (e.g. `pip install {}`, or a PyTorch/framework build for CUDA {d})",
            cudart_pip(d)
        )
    };
    let c = if let (Some(&(v, p)), Some((d, _))) = (too_new.first(), &f.driver) {
        let newest = too_new
            .iter()
            .map(|(v, _)| *v)
            .max_by_key(|v| (v.major, v.minor))
            .unwrap_or(v);
        Check::new(
            id,
            DRIVER,
            Status::Fail,
            format!(
                "CUDA runtime {v} ({p}) is newer than the driver supports (CUDA {d}): programs using it fail with \"CUDA driver version is insufficient for CUDA runtime version\"; {drv_txt}\n{list}"
            ),
        )
        .fix(upgrade(newest, *d))
    } else if let (Some(&(v, p)), Some((d, _))) = (newer_minor.first(), &f.driver) {
        Check::new(
            id,
            DRIVER,
            Status::Warn,
            format!(
                "CUDA runtime {v} ({p}) is newer than the driver's CUDA {d}: it runs by minor version compatibility, but PTX newer than the driver does not load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION) and newer calls fail (cudaErrorCallRequiresNewerDriver); {drv_txt}\n{list}"
            ),
        )
        .fix(upgrade(v, *d))
    } else {
        Check::new(
            id,
            DRIVER,
            Status::Ok,
            format!("{} CUDA runtime file(s); {drv_txt}\n{list}", f.libs.len()),
        )
    };
    out.push(c);
    if majors.len() > 1 {
        let l: Vec<String> = majors.iter().map(|(m, p)| format!("{m} ({p})")).collect();
        out.push(
            Check::new(
                "cudart.majors",
                DRIVER,
                Status::Warn,
                format!(
                    "several CUDA runtime major versions are visible: {}; a library built for one major needs that runtime's SONAME (libcudart.so.MAJOR), so mixed installs load two runtimes or fail with a missing library",
                    l.join(", ")
                ),
            )
            .fix("keep one CUDA major per environment: uninstall the other (`pip list | grep nvidia-cuda-runtime`), or put the folder of the one you use first in LD_LIBRARY_PATH"),
        );
    }
    out
}

// ---------------------------------------------------------------- container GPUs

/// What the container GPU check looks at.
#[derive(Debug, Clone, Default)]
pub struct ContainerGpuFacts {
    /// The container, when in one (from [`detect_container`]).
    pub kind: Option<String>,
    /// Indices of the `/dev/nvidiaN` device nodes.
    pub dev_gpus: Vec<u32>,
    pub dev_ctl: bool,
    pub dev_uvm: bool,
    /// Where `libcuda.so.1` is (the driver library the toolkit mounts), if anywhere.
    pub driver_lib: Option<String>,
    /// Whether library folders could be looked at (a recorded machine may
    /// have none: then a missing `libcuda.so.1` proves nothing).
    pub libs_known: bool,
    /// GPUs the driver reports (`cuDeviceGetCount`, real root only).
    pub driver_devices: Option<i64>,
    pub nvidia_visible_devices: Option<String>,
    pub nvidia_driver_capabilities: Option<String>,
    pub cuda_visible_devices: Option<String>,
}

/// Whether we run in a container and whether its GPUs are visible; nothing outside one.
pub fn container_gpus(f: &ContainerGpuFacts) -> Vec<Check> {
    let Some(kind) = &f.kind else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let nvd = f
        .nvidia_visible_devices
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty());
    let nvd_requested = nvd.is_some_and(|v| !matches!(v, "void" | "none"));
    let nvd_txt = nvd.map_or("NVIDIA_VISIBLE_DEVICES unset".to_string(), |v| {
        format!("NVIDIA_VISIBLE_DEVICES={v}")
    });
    let run_with_gpus = "run the container with its GPUs: `docker run --gpus all ...` (the NVIDIA Container Toolkit on the host: `sudo nvidia-ctk runtime configure --runtime=docker` and restart docker), podman `--device nvidia.com/gpu=all` (CDI), Kubernetes `resources.limits: {nvidia.com/gpu: N}` with the NVIDIA device plugin";
    if f.dev_gpus.is_empty() {
        let mut why = Vec::new();
        if let Some(l) = &f.driver_lib {
            why.push(format!("the driver library {l} is there"));
        }
        let no_lib = if f.libs_known {
            "no libcuda.so.1"
        } else {
            "library folders not recorded"
        };
        if nvd_requested {
            why.push(format!("{nvd_txt} asks for GPUs"));
        }
        if why.is_empty() {
            out.push(Check::new(
                "container.gpus",
                SHM,
                Status::Skip,
                format!("{kind} container without NVIDIA GPUs (no /dev/nvidia*, {no_lib}, {nvd_txt}): host collectives only"),
            ));
        } else {
            out.push(
                Check::new(
                    "container.gpus",
                    SHM,
                    Status::Fail,
                    format!(
                        "container without GPUs: no /dev/nvidia0 (no GPU device node at all) in this {kind} container, although {}",
                        why.join(" and ")
                    ),
                )
                .fix(run_with_gpus),
            );
        }
        return out;
    }
    let nodes: Vec<String> = f
        .dev_gpus
        .iter()
        .map(|i| format!("/dev/nvidia{i}"))
        .collect();
    let n = f.dev_gpus.len();
    let mut missing = Vec::new();
    if !f.dev_ctl {
        missing.push("/dev/nvidiactl");
    }
    if !f.dev_uvm {
        missing.push("/dev/nvidia-uvm");
    }
    let caps = f
        .nvidia_driver_capabilities
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty());
    let caps_lack_compute =
        caps.is_some_and(|c| !c.split(',').any(|x| matches!(x.trim(), "compute" | "all")));
    if !missing.is_empty() {
        out.push(
            Check::new(
                "container.gpus",
                SHM,
                Status::Fail,
                format!(
                    "{kind} container has {} but not {}: CUDA cannot initialise without it (device nodes passed one by one with --device?)",
                    nodes.join(", "),
                    missing.join(" or ")
                ),
            )
            .fix(format!("pass {} too, or better {run_with_gpus}", missing.join(" and "))),
        );
    } else if f.driver_lib.is_none() && f.libs_known {
        let why = if caps_lack_compute {
            format!(
                "NVIDIA_DRIVER_CAPABILITIES={} lacks `compute`, so the toolkit does not mount libcuda.so.1",
                caps.unwrap_or("")
            )
        } else {
            "started with --device instead of the NVIDIA runtime?".to_string()
        };
        out.push(
            Check::new(
                "container.gpus",
                SHM,
                Status::Fail,
                format!(
                    "{kind} container has {} but no driver library (libcuda.so.1 not found): {why}",
                    nodes.join(", ")
                ),
            )
            .fix(format!("set NVIDIA_DRIVER_CAPABILITIES=compute,utility (or unset it), and {run_with_gpus} (the toolkit mounts libcuda.so.1 with the device nodes)")),
        );
    } else {
        out.push(Check::new(
            "container.gpus",
            SHM,
            Status::Ok,
            format!(
                "{n} GPU(s) visible in the {kind} container: {} with /dev/nvidiactl and /dev/nvidia-uvm; driver library {}; {nvd_txt}{}",
                nodes.join(", "),
                f.driver_lib.as_deref().unwrap_or("not recorded"),
                match f.driver_devices {
                    Some(d) => format!("; the driver reports {d}"),
                    None => String::new(),
                }
            ),
        ));
    }
    // NVIDIA_VISIBLE_DEVICES is read by the runtime when the container starts.
    if let Some(v) = nvd.filter(|_| nvd_requested) {
        if v != "all" {
            let k = v.split(',').filter(|x| !x.trim().is_empty()).count();
            if k != n {
                out.push(
                    Check::new(
                        "container.visible",
                        SHM,
                        Status::Warn,
                        format!(
                            "NVIDIA_VISIBLE_DEVICES={v} names {k} GPU(s) but the container has {n} ({}): the container runtime reads it only when the container starts, so changing it inside does nothing",
                            nodes.join(", ")
                        ),
                    )
                    .fix("to use fewer GPUs inside the container set CUDA_VISIBLE_DEVICES (numbered from 0 here); for other GPUs restart it with `--gpus '\"device=0,1\"'`"),
                );
            }
        }
    }
    // CUDA_VISIBLE_DEVICES indices count from 0 inside the container.
    if let Some(cvd) = f
        .cuda_visible_devices
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty() && *v != "-1")
    {
        let entries: Vec<&str> = cvd.split(',').map(str::trim).collect();
        let bad = entries
            .iter()
            .position(|e| e.parse::<usize>().is_ok_and(|i| i >= n));
        if let Some(pos) = bad {
            let fix = format!(
                "GPUs are numbered 0 to {} inside this container, whatever their numbers on the host: use CUDA_VISIBLE_DEVICES={} (or unset it)",
                n - 1,
                (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",")
            );
            let (st, what) = if pos == 0 {
                (Status::Fail, "CUDA sees no GPU".to_string())
            } else {
                (
                    Status::Warn,
                    format!(
                        "CUDA uses only {} (it stops at the first index that does not exist)",
                        entries[..pos].join(",")
                    ),
                )
            };
            out.push(
                Check::new(
                    "container.visible",
                    SHM,
                    st,
                    format!(
                        "CUDA_VISIBLE_DEVICES={cvd}: index {} does not exist in this container ({n} GPU(s)): {what}",
                        entries[pos]
                    ),
                )
                .fix(fix),
            );
        }
    }
    out
}

// ---------------------------------------------------------------- peers

/// The port a `--peers` entry without one uses: NCCL_COMM_ID's, else 29500.
pub fn default_peer_port(comm_id: Option<&str>) -> u16 {
    comm_id
        .and_then(|c| c.rsplit_once(':'))
        .and_then(|(_, p)| p.trim().parse().ok())
        .unwrap_or(29500)
}

/// Whether a `--peers` peer connected back to this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Back {
    /// The connect failed: nothing more was tried.
    NotTried,
    /// No `oxccl doctor --listen` answered the probe (a plain listener, or too slow).
    NoAnswer(String),
    /// The peer connected back to `to` (this host as it saw it) in `took`.
    Ok { to: String, took: Duration },
    /// The peer says it connected, but nothing with our nonce arrived here.
    Unverified { to: String },
    /// The peer tried to connect back to `to` and could not.
    Failed { to: String, why: String },
}

/// One `--peers` entry's outcome.
#[derive(Debug, Clone)]
pub struct PeerResult {
    pub target: String,
    /// The address connected to and the connect time, or why not.
    pub result: Result<(SocketAddr, Duration), String>,
    /// Round trip of the probe's hello and the peer's answer.
    pub rtt: Option<Duration>,
    /// The reverse direction.
    pub back: Back,
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

const FIREWALL_FIX: &str = "check that a process listens there (rank 0 listens on NCCL_COMM_ID's port; `oxccl doctor --listen PORT` answers these probes) and that no firewall drops TCP between the hosts (`nc -vz HOST PORT`; e.g. `sudo ufw allow from <peer subnet>`); NCCL also connects on ephemeral ports, so allow the whole range between the nodes";

pub fn peers(results: &[PeerResult]) -> Vec<Check> {
    results
        .iter()
        .map(|r| {
            let id = format!("peers.{}", r.target);
            let (addr, connect) = match &r.result {
                Ok(x) => x,
                Err(e) => {
                    return Check::new(id, PEERS, Status::Fail, format!("{} cannot be reached: {e}", r.target))
                        .fix(FIREWALL_FIX)
                }
            };
            let rtt = r.rtt.map_or(String::new(), |d| format!(", round trip {}", ms(d)));
            let fwd = format!("{} ({addr}) accepts TCP: connect took {}{rtt}", r.target, ms(*connect));
            let port = addr.port();
            match &r.back {
                Back::Ok { to, took } => Check::new(
                    id,
                    PEERS,
                    Status::Ok,
                    format!("{fwd}; it connected back to this host ({to}) in {}: reachable both ways", ms(*took)),
                ),
                Back::NotTried => Check::new(id, PEERS, Status::Ok, fwd),
                Back::NoAnswer(why) => Check::new(
                    id,
                    PEERS,
                    Status::Warn,
                    format!("{fwd}; {why}: whether it can connect back to this host is unknown"),
                )
                .fix(format!("run `oxccl doctor --listen {port}` on {} first (it answers the probe and connects back), then this command again", addr.ip())),
                Back::Unverified { to } => Check::new(
                    id,
                    PEERS,
                    Status::Warn,
                    format!("{fwd}; it says it connected back to {to}, but that connection did not arrive here (a NAT or proxy between the hosts?)"),
                )
                .fix("make the hosts reach each other's addresses directly (NCCL ranks connect to the addresses they exchange), or set NCCL_SOCKET_IFNAME to the interface of the network between them"),
                Back::Failed { to, why } => Check::new(
                    id,
                    PEERS,
                    Status::Fail,
                    format!("{fwd}; but it cannot connect back to this host at {to}: {why}"),
                )
                .fix(format!("allow incoming TCP from {} on this host (NCCL's ranks connect to each other on ephemeral ports, so open the range: e.g. `sudo ufw allow from {}` or `sudo iptables -I INPUT -s {} -p tcp -j ACCEPT`); if {to} is not this host's address, a NAT is in between", addr.ip(), addr.ip(), addr.ip())),
            }
        })
        .collect()
}

/// One probe `oxccl doctor --listen` answered.
#[derive(Debug, Clone)]
pub struct Answered {
    /// Where the probe came from.
    pub from: SocketAddr,
    /// Where it asked to be called back.
    pub back_to: SocketAddr,
    /// How long connecting back took, or why it failed.
    pub result: Result<Duration, String>,
}

/// What `--listen` saw.
#[derive(Debug, Clone)]
pub struct ListenFacts {
    /// The address listened on, or why it could not be.
    pub bound: Result<SocketAddr, String>,
    /// What was asked for (`--listen`).
    pub asked: String,
    /// How long it listened.
    pub waited: Duration,
    pub timeout: Duration,
    pub expect: usize,
    pub probes: Vec<Answered>,
}

pub fn listen(f: &ListenFacts) -> Vec<Check> {
    let addr = match &f.bound {
        Ok(a) => a,
        Err(e) => {
            return vec![Check::new("listen", PEERS, Status::Fail, format!("cannot listen on {}: {e}", f.asked))
                .fix("pick a free port (`ss -ltnp` shows which process holds one), or a port of 1024 or more when not root")]
        }
    };
    let mut out = Vec::new();
    let n = f.probes.len();
    if n >= f.expect {
        out.push(Check::new(
            "listen",
            PEERS,
            Status::Ok,
            format!(
                "listened on {addr} for {:.1} s: {n} probe(s) answered",
                f.waited.as_secs_f64()
            ),
        ));
    } else {
        out.push(
            Check::new(
                "listen",
                PEERS,
                Status::Warn,
                format!(
                    "listened on {addr} for {:.0} s: {n} of {} expected probe(s) arrived",
                    f.timeout.as_secs_f64(),
                    f.expect
                ),
            )
            .fix(format!("on the other hosts run `oxccl doctor --peers THIS_HOST:{}` while this one listens; if they report it unreachable, a firewall on this host drops the port (e.g. `sudo ufw allow {}/tcp`)", addr.port(), addr.port())),
        );
    }
    for p in &f.probes {
        let id = format!("listen.{}", p.from);
        out.push(match &p.result {
            Ok(took) => Check::new(
                id,
                PEERS,
                Status::Ok,
                format!("{} probed this host; connecting back to {} took {}: reachable both ways", p.from.ip(), p.back_to, ms(*took)),
            ),
            Err(why) => Check::new(
                id,
                PEERS,
                Status::Fail,
                format!("{} probed this host, but connecting back to {} failed: {why}", p.from.ip(), p.back_to),
            )
            .fix(format!("a firewall on {} (or between) drops TCP from this host: allow it there (NCCL's ranks connect both ways on ephemeral ports)", p.from.ip())),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_checks(vars: &[(&str, &str)]) -> Vec<Check> {
        environment(&EnvFacts {
            vars: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })
    }

    #[test]
    fn a_bad_value_s_fix_names_the_value_to_set() {
        let cases = [
            (
                "NCCL_ALGO",
                "rign",
                "set NCCL_ALGO=Ring (or unset it: oxccl then chooses)",
            ),
            (
                "NCCL_PROTO",
                "^ll128,simpel",
                "set NCCL_PROTO=^ll128,Simple (or unset it",
            ),
            (
                "NCCL_DEBUG",
                "INOF",
                "set NCCL_DEBUG=INFO (or unset it for the default, NONE)",
            ),
            (
                "NCCL_DEBUG_SUBSYS",
                "INIT,NETT",
                "set NCCL_DEBUG_SUBSYS=INIT,NET (or unset it",
            ),
            (
                "NCCL_SOCKET_FAMILY",
                "AF_INT",
                "set NCCL_SOCKET_FAMILY=AF_INET (or unset it",
            ),
        ];
        for (name, bad, fix) in cases {
            let c = env_checks(&[(name, bad)]);
            assert_eq!(c.len(), 1, "{c:?}");
            assert_eq!(c[0].status, Status::Fail);
            assert!(c[0].fix.as_deref().unwrap().starts_with(fix), "{:?}", c[0]);
            assert!(c[0].detail.contains("did you mean"), "{:?}", c[0]);
        }
        // Nothing near: the fix says the form to write, never the error text.
        let c = env_checks(&[("NCCL_BUFFSIZE", "lots")]);
        assert_eq!(
            c[0].fix.as_deref(),
            Some(
                "set NCCL_BUFFSIZE to a byte count such as 4194304, 512K, 4M or 1G \
                 (or unset it for the default, 4M)"
            )
        );
        let c = env_checks(&[("NCCL_ALGO", "mesh")]);
        let fix = c[0].fix.as_deref().unwrap();
        assert!(
            fix.starts_with("set NCCL_ALGO to algorithm names (Tree, Ring"),
            "{fix}"
        );
        assert!(!fix.contains("unknown"), "{fix}");
    }

    #[test]
    fn oxccl_s_own_variables_are_not_findings() {
        let c = env_checks(&[("OXCCL_PERF_RANK", "1"), ("OXCCL_PERF_ID", "ab")]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].status, Status::Ok);
        assert_eq!(c[0].detail, "no NCCL_*/OXCCL_* variables set");
    }

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
    fn cuda_versions_and_driver_table() {
        let v = |s| cudart_version_from_name(s).map(|(_, v)| v.to_string());
        assert_eq!(v("/x/libcudart.so.12.4.127").as_deref(), Some("12.4"));
        assert_eq!(v("libcudart.so.13").as_deref(), Some("13"));
        assert_eq!(v("libcudart.so"), None);
        assert_eq!(v("libcudart.so.12.x"), None);
        assert_eq!(driver_cuda_for("580.159.04").unwrap().to_string(), "13.0");
        assert_eq!(driver_cuda_for("570.124.06").unwrap().to_string(), "12.8");
        assert_eq!(driver_cuda_for("535.54.03").unwrap().to_string(), "12.2");
        assert_eq!(driver_cuda_for("535.54.02").unwrap().to_string(), "12.1");
        assert_eq!(driver_cuda_for("390.1"), None);
        let c = |maj, min| CudaVer {
            major: maj,
            minor: min,
        };
        assert_eq!(min_driver_for(c(12, Some(8))).as_deref(), Some("570.26"));
        assert_eq!(min_driver_for(c(12, Some(7))).as_deref(), Some("560.28.03"));
        assert_eq!(min_driver_for(c(13, None)).as_deref(), Some("580.65.06"));
        assert_eq!(
            parse_nvrm_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (x@)\n").as_deref(),
            Some("580.159.04")
        );
        assert_eq!(fit(c(13, Some(0)), c(12, Some(8))), Fit::TooNew);
        assert_eq!(fit(c(12, Some(8)), c(12, Some(2))), Fit::NewerMinor);
        assert_eq!(fit(c(11, Some(0)), c(10, Some(2))), Fit::TooNew);
        assert_eq!(fit(c(12, None), c(12, Some(2))), Fit::Ok);
        assert_eq!(fit(c(11, Some(8)), c(12, Some(2))), Fit::Ok);
        assert_eq!(
            cudart_pip(c(12, Some(8))),
            "nvidia-cuda-runtime-cu12==12.8.*"
        );
        assert_eq!(cudart_pip(c(13, Some(0))), "nvidia-cuda-runtime==13.0.*");
    }

    /// The driver probe's version (real root only) is what the runtimes are judged against.
    #[test]
    fn runtimes_against_a_probed_driver() {
        let lib = |p: &str, v: &str| CudartLib {
            path: p.into(),
            target: p.into(),
            origin: "LD_LIBRARY_PATH".into(),
            version: cudart_version_from_name(v)
                .map(|(t, v)| (t, v, "file name"))
                .ok_or_else(|| "?".to_string()),
        };
        let f = CudartFacts {
            libs: vec![lib("/a/libcudart.so.13", "libcudart.so.13.0.48")],
            searched: 1,
            driver: Some((CudaVer::from_code(12080), "cuDriverGetVersion".into())),
        };
        let c = cuda_runtimes(&f);
        assert_eq!(c[0].status, Status::Fail, "{c:?}");
        assert!(c[0]
            .fix
            .as_deref()
            .unwrap()
            .contains("nvidia-cuda-runtime-cu12==12.8.*"));
        let f = CudartFacts { driver: None, ..f };
        assert_eq!(cuda_runtimes(&f)[0].status, Status::Ok);
    }

    #[test]
    fn containers() {
        let k = detect_container(
            false,
            false,
            Some("0::/\n"),
            Some("1 2 0:1 /var/lib/docker/containers/abc/hostname /etc/hostname rw - ext4 x rw\n"),
            None,
        );
        assert_eq!(k.unwrap().0, "docker");
        let k = detect_container(false, false, Some("0::/\n"), None, Some("10.0.0.1"));
        assert_eq!(k.unwrap().0, "kubernetes");
        assert!(detect_container(false, false, Some("0::/init.scope\n"), Some(""), None).is_none());
        // The probed driver's GPU count is reported beside the nodes.
        let f = ContainerGpuFacts {
            kind: Some("docker".into()),
            dev_gpus: vec![0],
            dev_ctl: true,
            dev_uvm: true,
            driver_lib: Some("/usr/lib/libcuda.so.1".into()),
            libs_known: true,
            driver_devices: Some(1),
            ..Default::default()
        };
        let c = container_gpus(&f);
        assert_eq!(c[0].status, Status::Ok);
        assert!(c[0].detail.contains("the driver reports 1"));
        assert!(container_gpus(&ContainerGpuFacts::default()).is_empty());
    }

    #[test]
    fn ports() {
        assert_eq!(default_peer_port(Some("10.0.0.1:1234")), 1234);
        assert_eq!(default_peer_port(None), 29500);
    }
}
