//! Gathering facts: files under the sysroot, and on the real root the OS
//! calls that stand for files (statvfs, getifaddrs) and child processes that
//! load libraries (`--probe-nccl`, `--probe-driver`) under a timeout. Nothing
//! here decides; nothing here panics or waits without a bound.

use std::ffi::{CStr, CString};
use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use oxccl_bootstrap::ifname::Interface;
use oxccl_bootstrap::Family;
use oxccl_core::params::{self, Params, SocketFamily};

use super::checks::{
    self, ContainerFacts, ContainerGpuFacts, CudaVer, CudartFacts, CudartLib, DriverFacts,
    EnvFacts, NcclFacts, NcclLib, NetFacts, NetIf, ProbeDriver, ShmFacts,
};
use crate::child::{run_sub, CHILD_TIMEOUT};
use crate::system::System;

use super::search::{conda_prefixes, is_elf, ld_so_conf_dirs, nccl_version, python_prefixes};

/// Everything the checks look at.
pub struct Facts {
    pub env: EnvFacts,
    pub shm: ShmFacts,
    pub limits: Result<String, String>,
    pub container: ContainerFacts,
    pub net: NetFacts,
    pub driver: DriverFacts,
    pub cudart: CudartFacts,
    pub container_gpus: ContainerGpuFacts,
    pub nccl: NcclFacts,
}

fn config_files(sys: &System) -> Vec<(String, String)> {
    let mut paths = Vec::new();
    match sys.var("NCCL_CONF_FILE").filter(|v| !v.trim().is_empty()) {
        Some(p) => paths.push(p.to_string()),
        None => {
            if let Some(h) = sys.var("HOME") {
                paths.push(format!("{h}/.nccl.conf"));
            }
            paths.push("/etc/nccl.conf".into());
        }
    }
    paths
        .into_iter()
        .filter_map(|p| sys.read(&p).map(|t| (p, t)))
        .collect()
}

pub fn gather(sys: &System, ranks: Option<u64>) -> Facts {
    let files = config_files(sys);
    let p = Params::from_sources(&sys.env, &files).unwrap_or_default();
    let ib_devices = sys.list("/sys/class/infiniband");
    let gpus = sys.list("/proc/driver/nvidia/gpus").len();
    let nvswitch = sys.exists("/proc/driver/nvidia-nvswitch")
        || sys
            .list("/dev")
            .iter()
            .any(|n| n.starts_with("nvidia-nvswitch"));
    let container = ContainerFacts {
        kind: checks::detect_container(
            sys.exists("/.dockerenv"),
            sys.exists("/run/.containerenv"),
            sys.read("/proc/1/cgroup").as_deref(),
            sys.read("/proc/self/mountinfo").as_deref(),
            sys.var("KUBERNETES_SERVICE_HOST"),
        ),
    };
    let env = EnvFacts {
        vars: sys.env.clone(),
        files: files.clone(),
        gpus,
        nvswitch,
        ib_devices: ib_devices.clone(),
    };
    let shm = gather_shm(sys, &p, ranks, container.kind.is_some());
    let limits = sys
        .read("/proc/self/limits")
        .ok_or_else(|| "/proc/self/limits cannot be read".to_string());
    let net = gather_net(sys, &p, ib_devices);
    let driver = gather_driver(sys);
    let cudart = gather_cudart(sys, &driver);
    let container_gpus =
        gather_container_gpus(sys, container.kind.as_ref().map(|k| k.0.as_str()), &driver);
    let nccl = gather_nccl(sys);
    Facts {
        env,
        shm,
        limits,
        container,
        net,
        driver,
        cudart,
        container_gpus,
        nccl,
    }
}

// ---------------------------------------------------------------- shm

fn statvfs(path: &Path) -> Result<(u64, u64), String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "statvfs({}): {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    let fr = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * fr, st.f_blocks as u64 * fr))
}

/// The fixture stand-in for statvfs: `/dev/shm.statvfs` with `total BYTES` and `free BYTES`.
fn shm_fixture(text: &str) -> Option<(u64, u64)> {
    let mut total = None;
    let mut free = None;
    for l in text.lines() {
        let mut it = l.split_whitespace();
        match (it.next(), it.next().and_then(|v| v.parse::<u64>().ok())) {
            (Some("total"), Some(v)) => total = Some(v),
            (Some("free"), Some(v)) => free = Some(v),
            _ => {}
        }
    }
    let total = total?;
    Some((free.unwrap_or(total), total))
}

fn gather_shm(sys: &System, p: &Params, ranks: Option<u64>, container: bool) -> ShmFacts {
    let (space, space_from) = if sys.is_real() {
        (statvfs(Path::new("/dev/shm")), "statvfs".to_string())
    } else {
        match sys.read("/dev/shm.statvfs") {
            Some(t) => (
                shm_fixture(&t).ok_or_else(|| "/dev/shm.statvfs has no 'total BYTES' line".into()),
                "/dev/shm.statvfs under --sysroot".to_string(),
            ),
            None => (
                Err("no /dev/shm.statvfs under --sysroot".into()),
                String::new(),
            ),
        }
    };
    let (ranks, ranks_from) = match ranks {
        Some(r) => (r, "from --ranks".to_string()),
        None => {
            let cpus = if sys.is_real() {
                std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
            } else {
                sys.read("/proc/cpuinfo").map_or(1, |t| {
                    (t.lines().filter(|l| l.starts_with("processor")).count() as u64).max(1)
                })
            };
            (cpus, "= CPUs (--ranks to change)".to_string())
        }
    };
    // The host transport's own rules (oxccl_host::comm): NCCL_BUFFSIZE via
    // oxccl::Config::host_settings_from (1 MiB default for host rings) and the
    // channel count of a communicator whose local peers talk over shared memory.
    let cfg = oxccl::Config::host_settings_from(p);
    let (coll, p2p) = oxccl_host::comm::host_channels(&cfg, false);
    ShmFacts {
        space,
        space_from,
        ranks,
        ranks_from,
        channels: (coll + p2p) as u64,
        capacity: oxccl_host::comm::ring_capacity(&cfg) as u64,
        disabled: cfg.shm_disable,
        container,
    }
}

// ---------------------------------------------------------------- network

fn getifaddrs() -> Result<Vec<Interface>, String> {
    oxccl_bootstrap::interfaces().map_err(|e| e.to_string())
}

fn gather_net(sys: &System, p: &Params, ib_devices: Vec<String>) -> NetFacts {
    let mut ifaces = Vec::new();
    for name in sys.list("/sys/class/net") {
        let base = format!("/sys/class/net/{name}");
        let rd = |f: &str| {
            sys.read(&format!("{base}/{f}"))
                .map(|s| s.trim().to_string())
        };
        ifaces.push(NetIf {
            operstate: rd("operstate"),
            mtu: rd("mtu").and_then(|m| m.parse().ok()),
            mac: rd("address").filter(|m| !m.is_empty() && m != "00:00:00:00:00:00"),
            name,
        });
    }
    let (addrs, addrs_from) = if sys.is_real() {
        match getifaddrs() {
            Ok(a) => (a, Ok("getifaddrs".to_string())),
            Err(e) => (Vec::new(), Err(e)),
        }
    } else {
        // Fixture stand-in: /sys/class/net/<if>/ip, one address per line.
        let mut v = Vec::new();
        for i in &ifaces {
            let up = i.operstate.as_deref() != Some("down");
            for l in sys
                .read(&format!("/sys/class/net/{}/ip", i.name))
                .unwrap_or_default()
                .lines()
            {
                if let Ok(addr) = l.trim().parse::<IpAddr>() {
                    v.push(Interface {
                        name: i.name.clone(),
                        addr,
                        scope_id: 0,
                        up,
                    });
                }
            }
        }
        (v, Ok("/sys/class/net/*/ip under --sysroot".to_string()))
    };
    let mut ib_ports = Vec::new();
    for dev in &ib_devices {
        for port in sys.list(&format!("/sys/class/infiniband/{dev}/ports")) {
            if let Some(st) = sys.read(&format!("/sys/class/infiniband/{dev}/ports/{port}/state")) {
                ib_ports.push(format!("{dev}:{port} {}", st.trim()));
            }
        }
    }
    NetFacts {
        ifaces,
        addrs,
        addrs_from,
        ifname: p.get(&params::SOCKET_IFNAME),
        bootstrap_ifname: p.get(&params::BOOTSTRAP_IFNAME),
        family: p.get(&params::SOCKET_FAMILY).map(|f| match f {
            SocketFamily::Inet => Family::V4,
            SocketFamily::Inet6 => Family::V6,
        }),
        ib_devices,
        ib_ports,
        ib_disable: p.get(&params::IB_DISABLE),
    }
}

// ---------------------------------------------------------------- children

/// Runs `oxccl doctor ARGS`, waits at most `timeout`; its stdout, or why not.
fn run_child(args: &[&std::ffi::OsStr], timeout: Duration) -> Result<String, String> {
    run_sub("doctor", args, timeout)
}

/// `oxccl doctor --probe-nccl PATH`: dlopen it, call ncclGetVersion, print the code.
pub fn probe_nccl_child(path: &Path) -> i32 {
    probe_version_child(path, c"ncclGetVersion")
}

/// `oxccl doctor --probe-cudart PATH`: dlopen it, call cudaRuntimeGetVersion
/// (which needs no driver), print the code (12040 for 12.4).
pub fn probe_cudart_child(path: &Path) -> i32 {
    probe_version_child(path, c"cudaRuntimeGetVersion")
}

/// dlopen `path`, call `int SYMBOL(int *version)` (0 = success), print the version.
fn probe_version_child(path: &Path, symbol: &CStr) -> i32 {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        println!("path contains NUL");
        return 1;
    };
    // SAFETY: `c` is a valid C string. Loading runs the library's initialisers,
    // which is why this runs in a child process under a timeout.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a valid C string or null.
        let e = unsafe { libc::dlerror() };
        let msg = if e.is_null() {
            "dlopen failed".to_string()
        } else {
            // SAFETY: non-null dlerror text is NUL-terminated.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        };
        println!("dlopen: {msg}");
        return 1;
    }
    // SAFETY: `h` is a live handle and the name a valid C string.
    let sym = unsafe { libc::dlsym(h, symbol.as_ptr()) };
    if sym.is_null() {
        println!("no {} symbol", symbol.to_string_lossy());
        return 1;
    }
    // SAFETY: both ncclGetVersion and cudaRuntimeGetVersion are C functions
    // `int f(int *)` returning 0 on success.
    let f: extern "C" fn(*mut libc::c_int) -> libc::c_int = unsafe { std::mem::transmute(sym) };
    let mut v: libc::c_int = 0;
    let rc = f(&mut v);
    if rc != 0 {
        println!("{} returned {rc}", symbol.to_string_lossy());
        return 1;
    }
    println!("{v}");
    0
}

/// `oxccl doctor --probe-driver`: the driver and NVRTC probes, as one JSON line.
pub fn probe_driver_child() -> i32 {
    use oxccl::gpu::tools::{nvrtc, probe_driver, Unavailable};
    let mut v = match probe_driver() {
        Ok(d) => serde_json::json!({
            "state": "ok", "path": d.path, "version": d.version, "devices": d.devices,
        }),
        Err(Unavailable::NoDriver { tried }) => serde_json::json!({
            "state": "no_driver", "message": format!("tried {}", tried.join(", ")),
        }),
        Err(Unavailable::NoGpu { path, reason }) => serde_json::json!({
            "state": "no_gpu", "path": path, "message": reason,
        }),
        Err(Unavailable::Failed(e)) => serde_json::json!({
            "state": "failed", "message": e.to_string(),
        }),
    };
    match nvrtc() {
        Ok(n) => {
            v["nvrtc_path"] = n.path.clone().into();
            v["nvrtc_version"] = format!("{}.{}", n.version.0, n.version.1).into();
        }
        Err(e) => v["nvrtc_error"] = e.to_string().into(),
    }
    println!("{v}");
    0
}

fn parse_driver_report(text: &str) -> Result<ProbeDriver, String> {
    let v: serde_json::Value =
        serde_json::from_str(text.trim()).map_err(|e| format!("unreadable probe output ({e})"))?;
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    Ok(ProbeDriver {
        state: s("state").unwrap_or_default(),
        path: s("path"),
        version: v.get("version").and_then(|x| x.as_i64()),
        devices: v.get("devices").and_then(|x| x.as_i64()),
        message: s("message"),
        nvrtc: match (s("nvrtc_path"), s("nvrtc_version")) {
            (Some(p), Some(ver)) => Ok((p, ver)),
            _ => Err(s("nvrtc_error").unwrap_or_else(|| "not reported".into())),
        },
    })
}

fn gather_driver(sys: &System) -> DriverFacts {
    if !sys.is_real() {
        let mut files = Vec::new();
        for f in ["/proc/driver/nvidia/version", "/dev/nvidiactl"] {
            if sys.exists(f) {
                files.push(f.to_string());
            }
        }
        for g in sys.list("/dev").iter().filter(|n| {
            n.strip_prefix("nvidia")
                .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
        }) {
            files.push(format!("/dev/{g}"));
        }
        return DriverFacts::Fixture(files);
    }
    DriverFacts::Probed {
        driver: run_child(&["--probe-driver".as_ref()], CHILD_TIMEOUT)
            .and_then(|t| parse_driver_report(&t)),
        cuda_visible_devices: sys.var("CUDA_VISIBLE_DEVICES").map(str::to_string),
    }
}

// ---------------------------------------------------------------- NCCL

/// `ldconfig -p`'s entries for `stem` (real root only), bounded by a timeout.
fn ldconfig_libs(stem: &str) -> Result<Vec<String>, String> {
    let mut child = Command::new("ldconfig")
        .arg("-p")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .or_else(|_| {
            Command::new("/sbin/ldconfig")
                .arg("-p")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
        })
        .map_err(|e| format!("ldconfig not available ({e}); the loader cache was read from /etc/ld.so.conf instead"))?;
    let mut so = child.stdout.take().ok_or("no ldconfig output")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    let out = rx.recv_timeout(CHILD_TIMEOUT);
    let _ = child.kill();
    let _ = child.wait();
    let text = out.map_err(|_| "ldconfig -p did not finish in time".to_string())?;
    Ok(text
        .lines()
        .filter(|l| l.trim_start().starts_with(stem))
        .filter_map(|l| l.rsplit_once("=> ").map(|(_, p)| p.trim().to_string()))
        .collect())
}

/// The `e_machine` of this build (what the loader cache entries must fit).
fn host_machine() -> u16 {
    if cfg!(target_arch = "aarch64") {
        oxccl_core::elf::EM_AARCH64
    } else {
        oxccl_core::elf::EM_X86_64
    }
}

/// One library file found by [`find_libs`].
pub(super) struct Found {
    /// As found (machine path).
    pub path: String,
    /// Under the root, symlinks resolved.
    pub canon: PathBuf,
    /// `canon` as a machine path.
    pub target: String,
    pub origin: String,
    pub on_loader_path: bool,
}

/// Every `STEM` / `STEM.*` file (`libnccl.so`, `libcudart.so`) a process
/// could load, in the loader's order: LD_PRELOAD, LD_LIBRARY_PATH, the
/// loader cache (or `ldconfig -p`), ld.so.conf's folders, the default
/// folders; then, off the loader's path, /usr/local, the CUDA toolkits,
/// conda and pip's `PACKAGE/lib` folders (`nvidia/nccl`, the oxccl wheel's `oxccl`). One entry per file (a symlink
/// and its target are one). Also: how many places were searched, and notes.
pub(super) fn find_libs(
    sys: &System,
    stem: &str,
    pip: &[(&str, &str)],
) -> (Vec<Found>, usize, Vec<String>) {
    let base = stem.trim_end_matches(".so");
    // (folder or file, origin, on the loader's path), in the loader's order.
    let mut places: Vec<(String, String, bool)> = Vec::new();
    let mut notes = Vec::new();
    for f in sys
        .var("LD_PRELOAD")
        .unwrap_or("")
        .split([' ', ':'])
        .filter(|f| f.rsplit('/').next().is_some_and(|n| n.starts_with(base)))
    {
        places.push((f.to_string(), "LD_PRELOAD".into(), true));
    }
    for d in sys.var("LD_LIBRARY_PATH").unwrap_or("").split(':') {
        if !d.is_empty() {
            places.push((d.to_string(), "LD_LIBRARY_PATH".into(), true));
        }
    }
    // The loader cache itself (under the root), else `ldconfig -p` on the real root.
    match super::loader::read_cache(sys) {
        Ok(entries) => {
            for e in entries
                .iter()
                .filter(|e| e.name.starts_with(stem) && e.fits(host_machine()))
            {
                places.push((
                    e.path.clone(),
                    "loader cache (/etc/ld.so.cache)".into(),
                    true,
                ));
            }
        }
        Err(_) if sys.is_real() => match ldconfig_libs(stem) {
            Ok(files) => {
                for f in files {
                    places.push((f, "loader cache (ldconfig -p)".into(), true));
                }
            }
            Err(e) => notes.push(e),
        },
        Err(_) => {}
    }
    let mut conf = Vec::new();
    ld_so_conf_dirs(sys, "/etc/ld.so.conf", 0, &mut conf);
    for d in conf {
        places.push((d, "loader cache (/etc/ld.so.conf)".into(), true));
    }
    for d in ["/lib", "/usr/lib", "/lib64", "/usr/lib64"] {
        places.push((d.into(), "loader default folders".into(), true));
    }
    // Not on the loader's path: where NCCL and CUDA get installed.
    for pat in [
        "/usr/local/lib",
        "/usr/local/cuda*/lib64",
        "/usr/local/cuda*/targets/*/lib",
        "/usr/local/nccl*/lib",
        "/opt/nccl*/lib",
    ] {
        for d in sys.glob(pat) {
            places.push((d, "/usr/local or /opt".into(), false));
        }
    }
    for c in &conda_prefixes(sys) {
        places.push((format!("{c}/lib"), "conda".into(), false));
    }
    for prefix in &python_prefixes(sys) {
        for sp in ["site-packages", "dist-packages"] {
            for (sub, origin) in pip {
                for d in sys.glob(&format!("{prefix}/lib/python3*/{sp}/{sub}/lib")) {
                    places.push((d, format!("pip ({origin})"), false));
                }
            }
        }
    }
    let searched = places.len();
    let dot = format!("{stem}.");
    let mut found: Vec<Found> = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for (place, origin, on_path) in &places {
        let rooted = sys.path(place);
        let files: Vec<String> = if rooted.is_file() {
            vec![place.clone()]
        } else {
            let mut names: Vec<String> = sys
                .list(place)
                .into_iter()
                .filter(|n| n == stem || n.starts_with(&dot))
                .collect();
            names.sort_by_key(|n| (soname_first(n, stem), n.clone()));
            names
                .into_iter()
                .map(|n| format!("{}/{n}", place.trim_end_matches('/')))
                .collect()
        };
        for f in files {
            let rp = sys.path(&f);
            let canon = std::fs::canonicalize(&rp).unwrap_or_else(|_| rp.clone());
            // One entry per file: a symlink and its target (libnccl.so.2 ->
            // libnccl.so.2.21.5, libnccl.so -> libnccl.so.2) are the same
            // library; the first name found stays, and `soname_first` puts
            // the name programs load first.
            if seen.contains(&canon) {
                continue;
            }
            seen.push(canon.clone());
            found.push(Found {
                path: f,
                target: sys.unroot(&canon),
                canon,
                origin: origin.clone(),
                on_loader_path: *on_path,
            });
        }
    }
    (found, searched, notes)
}

/// Where a library file name sorts among the names of one folder: the
/// SONAME form (`libnccl.so.2`, `libcudart.so.13`: the stem and one number,
/// the name programs load) first, then fuller versions (`libnccl.so.2.21.5`),
/// then the bare link-time name (`libnccl.so`), so that a folder laid out as
/// NCCL's packages and `cargo xtask install` lay it out (`libnccl.so ->
/// libnccl.so.2`) is reported under the name the loader looks for.
fn soname_first(name: &str, stem: &str) -> u8 {
    match name.strip_prefix(stem).and_then(|v| v.strip_prefix('.')) {
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => 0,
        Some(_) => 1,
        None => 2,
    }
}

fn gather_nccl(sys: &System) -> NcclFacts {
    let (found, searched, notes) = find_libs(
        sys,
        "libnccl.so",
        &[("nvidia/nccl", "nvidia-nccl"), ("oxccl", "oxccl wheel")],
    );
    let libs = found
        .into_iter()
        .map(|f| NcclLib {
            version: nccl_version(&f.canon, &f.path, &f.target),
            path: f.path,
            target: f.target,
            origin: f.origin,
            on_loader_path: f.on_loader_path,
        })
        .collect();
    NcclFacts {
        libs,
        searched,
        notes,
    }
}

// ---------------------------------------------------------------- CUDA runtimes

/// The newest CUDA the driver supports: the probe's `cuDriverGetVersion`, else
/// the kernel module's version (`/proc/driver/nvidia/version`) by NVIDIA's table.
fn driver_cuda(sys: &System, driver: &DriverFacts) -> Option<(CudaVer, String)> {
    if let DriverFacts::Probed { driver: Ok(d), .. } = driver {
        if let (Some(v), "ok") = (d.version, d.state.as_str()) {
            return Some((CudaVer::from_code(v), "cuDriverGetVersion".into()));
        }
    }
    let kernel = checks::parse_nvrm_version(&sys.read("/proc/driver/nvidia/version")?)?;
    let v = checks::driver_cuda_for(&kernel)?;
    Some((
        v,
        format!("kernel module {kernel} in /proc/driver/nvidia/version, by NVIDIA's table of minimum drivers"),
    ))
}

/// A runtime's version: asked in a child (`cudaRuntimeGetVersion`) when the
/// file is ELF, else from its name, else from its SONAME.
fn cudart_version(f: &Found) -> Result<(String, CudaVer, &'static str), String> {
    let by_name = checks::cudart_version_from_name(&f.target)
        .or_else(|| checks::cudart_version_from_name(&f.path));
    let mut err = None;
    if is_elf(&f.canon) {
        match run_child(
            &["--probe-cudart".as_ref(), f.canon.as_os_str()],
            CHILD_TIMEOUT,
        ) {
            Ok(out) => match out.trim().parse::<i64>() {
                Ok(code) if code > 0 => {
                    let v = CudaVer::from_code(code);
                    return Ok((v.to_string(), v, "cudaRuntimeGetVersion"));
                }
                _ => err = Some(format!("unreadable probe output {:?}", out.trim())),
            },
            Err(e) => err = Some(e),
        }
    }
    if let Some((t, v)) = by_name {
        return Ok((t, v, "file name"));
    }
    if let Some(soname) = super::loader::soname(&f.canon) {
        if let Some((t, v)) = checks::cudart_version_from_name(&soname) {
            return Ok((t, v, "SONAME"));
        }
    }
    Err(err.unwrap_or_else(|| "not a loadable library and no version in its name".into()))
}

fn gather_cudart(sys: &System, driver: &DriverFacts) -> CudartFacts {
    let (found, searched, _) = find_libs(
        sys,
        "libcudart.so",
        &[
            ("nvidia/cuda_runtime", "nvidia-cuda-runtime"),
            ("nvidia/cu13", "nvidia-cuda-runtime, CUDA 13"),
        ],
    );
    CudartFacts {
        libs: found
            .iter()
            .map(|f| CudartLib {
                path: f.path.clone(),
                target: f.target.clone(),
                origin: f.origin.clone(),
                version: cudart_version(f),
            })
            .collect(),
        searched,
        driver: driver_cuda(sys, driver),
    }
}

// ---------------------------------------------------------------- container GPUs

fn gather_container_gpus(
    sys: &System,
    kind: Option<&str>,
    driver: &DriverFacts,
) -> ContainerGpuFacts {
    let dev = sys.list("/dev");
    let mut dev_gpus: Vec<u32> = dev
        .iter()
        .filter_map(|n| n.strip_prefix("nvidia")?.parse().ok())
        .collect();
    dev_gpus.sort_unstable();
    // The driver library: the probe's (real root), else a libcuda.so.1 on the loader's path.
    let probed = match driver {
        DriverFacts::Probed { driver: Ok(d), .. } if d.state == "ok" => d.path.clone(),
        _ => None,
    };
    let driver_devices = match driver {
        DriverFacts::Probed { driver: Ok(d), .. } if d.state == "ok" => d.devices,
        _ => None,
    };
    let driver_lib = probed.or_else(|| {
        find_libs(sys, "libcuda.so", &[])
            .0
            .into_iter()
            .find(|f| {
                f.on_loader_path && f.path.ends_with("/libcuda.so.1") && !f.path.contains("/stubs")
            })
            .map(|f| f.path)
    });
    ContainerGpuFacts {
        kind: kind.map(str::to_string),
        dev_gpus,
        dev_ctl: dev.iter().any(|n| n == "nvidiactl"),
        dev_uvm: dev.iter().any(|n| n == "nvidia-uvm"),
        driver_lib,
        libs_known: sys.is_real()
            || sys.var("LD_LIBRARY_PATH").is_some_and(|v| !v.is_empty())
            || [
                "/etc/ld.so.cache",
                "/etc/ld.so.conf",
                "/lib",
                "/usr/lib",
                "/lib64",
                "/usr/lib64",
            ]
            .iter()
            .any(|p| sys.exists(p)),
        driver_devices,
        nvidia_visible_devices: sys.var("NVIDIA_VISIBLE_DEVICES").map(str::to_string),
        nvidia_driver_capabilities: sys.var("NVIDIA_DRIVER_CAPABILITIES").map(str::to_string),
        cuda_visible_devices: sys.var("CUDA_VISIBLE_DEVICES").map(str::to_string),
    }
}
