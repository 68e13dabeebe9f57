//! NVLink and peer-to-peer status from NVML, which sysfs does not show.
//!
//! `libnvidia-ml.so.1` is loaded with dlopen in a child process
//! (`oxccl topo --probe-nvml`, killed after 5 s) that prints what it found as
//! JSON; the parent merges that into the sysfs topology. So a missing library
//! is "NVML not available", and a hanging or crashing driver costs 5 s, never
//! the tool. Under `--sysroot DIR` the same facts come from `DIR/topo.xml`
//! (written by `oxccl topo --dump` on the machine), since NVML cannot be
//! recorded as files.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use oxccl_core::topo::{normalize_busid, NvLink, P2p, P2pStatus, Pci, Topology, NVSWITCH_CLASS};

/// What NVML (or the recorded file) says about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvGpu {
    pub index: u32,
    pub busid: String,
    pub name: Option<String>,
    pub sm: Option<u32>,
    /// (remote bus id, links, remote is a GPU).
    pub links: Vec<(String, u32, bool)>,
    pub p2p: Vec<(String, P2pStatus)>,
}

/// NVML's view, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvSource {
    Nvml {
        driver: Option<String>,
        gpus: Vec<NvGpu>,
    },
    Recorded {
        file: String,
        gpus: Vec<NvGpu>,
    },
    Unavailable(String),
}

impl NvSource {
    pub fn gpus(&self) -> &[NvGpu] {
        match self {
            NvSource::Nvml { gpus, .. } | NvSource::Recorded { gpus, .. } => gpus,
            NvSource::Unavailable(_) => &[],
        }
    }
    pub fn describe(&self) -> String {
        match self {
            NvSource::Nvml { driver, .. } => format!(
                "NVLink and P2P from NVML{}",
                driver
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

/// The NVML part of a recorded topology (`topo.xml`): every GPU's links and P2P.
pub fn from_topology(t: &Topology) -> Vec<NvGpu> {
    let gpus = t.gpus();
    gpus.iter()
        .map(|g| NvGpu {
            index: g.gpu.dev,
            busid: g.pci.busid.clone(),
            name: g.gpu.name.clone(),
            sm: g.gpu.sm,
            links: g
                .gpu
                .nvlinks
                .iter()
                .map(|l| (l.target.clone(), l.count, l.tclass != NVSWITCH_CLASS))
                .collect(),
            p2p: g
                .gpu
                .p2p
                .iter()
                .map(|p| (p.target.clone(), p.status))
                .collect(),
        })
        .collect()
}

fn merge_pci(p: &mut Pci, nv: &[NvGpu]) {
    if let Some(g) = &mut p.gpu {
        if let Some(n) = nv.iter().find(|n| n.busid == p.busid) {
            g.dev = n.index;
            g.name = n.name.clone().or(g.name.take());
            g.sm = n.sm.or(g.sm);
            g.nvlinks = n
                .links
                .iter()
                .map(|(t, c, is_gpu)| NvLink {
                    target: t.clone(),
                    count: *c,
                    tclass: if *is_gpu {
                        "0x030200".into()
                    } else {
                        NVSWITCH_CLASS.into()
                    },
                })
                .collect();
            g.p2p = n
                .p2p
                .iter()
                .map(|(t, s)| P2p {
                    target: t.clone(),
                    status: *s,
                })
                .collect();
        }
    }
    for c in &mut p.children {
        merge_pci(c, nv);
    }
}

/// Adds NVML's links and P2P status to the GPUs sysfs found (matched by bus id).
pub fn merge(t: &mut Topology, nv: &[NvGpu]) {
    for c in &mut t.cpus {
        for p in &mut c.pcis {
            merge_pci(p, nv);
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
    let mut gpus = Vec::new();
    for g in v
        .get("gpus")
        .and_then(|g| g.as_array())
        .into_iter()
        .flatten()
    {
        let s = |k: &str| g.get(k).and_then(|x| x.as_str()).map(str::to_string);
        let Some(busid) = s("busid").and_then(|b| normalize_busid(&b)) else {
            continue;
        };
        let mut links: Vec<(String, u32, bool)> = Vec::new();
        for l in g
            .get("links")
            .and_then(|l| l.as_array())
            .into_iter()
            .flatten()
        {
            let Some(t) = l
                .get("target")
                .and_then(|x| x.as_str())
                .and_then(normalize_busid)
            else {
                continue;
            };
            let c = l.get("count").and_then(|x| x.as_u64()).unwrap_or(0) as u32;
            let is_gpu = l.get("gpu").and_then(|x| x.as_bool()).unwrap_or(true);
            links.push((t, c, is_gpu));
        }
        let mut p2p = Vec::new();
        for p in g
            .get("p2p")
            .and_then(|l| l.as_array())
            .into_iter()
            .flatten()
        {
            if let (Some(t), Some(st)) = (
                p.get("target")
                    .and_then(|x| x.as_str())
                    .and_then(normalize_busid),
                p.get("status").and_then(|x| x.as_u64()),
            ) {
                p2p.push((t, P2pStatus::from_nvml(st as u32)));
            }
        }
        gpus.push(NvGpu {
            index: g.get("index").and_then(|x| x.as_u64()).unwrap_or(0) as u32,
            busid,
            name: s("name"),
            sm: g.get("sm").and_then(|x| x.as_u64()).map(|x| x as u32),
            links,
            p2p,
        });
    }
    NvSource::Nvml {
        driver: v.get("driver").and_then(|d| d.as_str()).map(str::to_string),
        gpus,
    }
}

/// Runs the NVML probe in a child process.
pub fn probe() -> NvSource {
    match crate::doctor::run_sub(
        "topo",
        &["--probe-nvml".as_ref()],
        crate::doctor::CHILD_TIMEOUT,
    ) {
        Ok(out) => parse_report(&out),
        Err(e) => NvSource::Unavailable(e),
    }
}

// ---------------------------------------------------------------- the child

/// `nvmlPciInfo_t` (v3): the layout NVML's header gives.
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// The target recorded for NVLinks to a switch NVML does not name (VMs hide
/// NVSwitches): a bus id no real device has (domain ffff, bus ff, device 1f, function 7).
pub const HIDDEN_SWITCH: &str = "ffff:ff:1f.7";

/// NVLink ports a GPU may have (`NVML_NVLINK_MAX_LINKS`: 18 on Hopper and Blackwell).
const MAX_LINKS: c_uint = 18;

type Device = *mut c_void;

struct Nvml {
    lib: *mut c_void,
}

impl Nvml {
    /// A function of the library, or `None`.
    fn sym(&self, name: &CStr) -> Option<*mut c_void> {
        // SAFETY: `lib` is a live dlopen handle and `name` a C string.
        let p = unsafe { libc::dlsym(self.lib, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

fn bus_id(p: &PciInfo) -> Option<String> {
    // SAFETY: NVML NUL-terminates busId within its 32 bytes; the buffer was
    // zeroed first, so a terminator exists even if NVML wrote nothing.
    let s = unsafe { CStr::from_ptr(p.bus_id.as_ptr()) }.to_string_lossy();
    normalize_busid(&s)
}

fn zeroed_pci() -> PciInfo {
    PciInfo {
        bus_id_legacy: [0; 16],
        domain: 0,
        bus: 0,
        device: 0,
        pci_device_id: 0,
        pci_sub_system_id: 0,
        bus_id: [0; 32],
    }
}

/// `oxccl topo --probe-nvml`: what NVML says, as one JSON line.
pub fn probe_child() -> i32 {
    let v = match probe_inner() {
        Ok(v) => v,
        Err(e) => serde_json::json!({ "error": e }),
    };
    println!("{v}");
    0
}

fn probe_inner() -> Result<serde_json::Value, String> {
    // SAFETY: a constant C string; loading runs the library's initialisers,
    // which is why this runs in a child process under a timeout.
    let lib = unsafe {
        libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if lib.is_null() {
        return Err("libnvidia-ml.so.1 not found".into());
    }
    let n = Nvml { lib };
    let need = |name: &CStr| {
        n.sym(name)
            .ok_or_else(|| format!("libnvidia-ml.so.1 has no {}", name.to_string_lossy()))
    };
    // SAFETY (all transmutes below): each symbol is cast to the C signature
    // NVML's header gives for it; handles and out-pointers are valid for the call.
    let init: extern "C" fn() -> c_int = unsafe { std::mem::transmute(need(c"nvmlInit_v2")?) };
    let count: extern "C" fn(*mut c_uint) -> c_int =
        unsafe { std::mem::transmute(need(c"nvmlDeviceGetCount_v2")?) };
    let by_index: extern "C" fn(c_uint, *mut Device) -> c_int =
        unsafe { std::mem::transmute(need(c"nvmlDeviceGetHandleByIndex_v2")?) };
    let pci_info: extern "C" fn(Device, *mut PciInfo) -> c_int =
        unsafe { std::mem::transmute(need(c"nvmlDeviceGetPciInfo_v3")?) };
    let link_state: Option<extern "C" fn(Device, c_uint, *mut c_int) -> c_int> = n
        .sym(c"nvmlDeviceGetNvLinkState")
        .map(|p| unsafe { std::mem::transmute(p) });
    let link_remote: Option<extern "C" fn(Device, c_uint, *mut PciInfo) -> c_int> = n
        .sym(c"nvmlDeviceGetNvLinkRemotePciInfo_v2")
        .map(|p| unsafe { std::mem::transmute(p) });
    let p2p: Option<extern "C" fn(Device, Device, c_int, *mut c_int) -> c_int> = n
        .sym(c"nvmlDeviceGetP2PStatus")
        .map(|p| unsafe { std::mem::transmute(p) });
    let name_fn: Option<extern "C" fn(Device, *mut c_char, c_uint) -> c_int> = n
        .sym(c"nvmlDeviceGetName")
        .map(|p| unsafe { std::mem::transmute(p) });
    let cc_fn: Option<extern "C" fn(Device, *mut c_int, *mut c_int) -> c_int> = n
        .sym(c"nvmlDeviceGetCudaComputeCapability")
        .map(|p| unsafe { std::mem::transmute(p) });
    let drv_fn: Option<extern "C" fn(*mut c_char, c_uint) -> c_int> = n
        .sym(c"nvmlSystemGetDriverVersion")
        .map(|p| unsafe { std::mem::transmute(p) });

    let rc = init();
    if rc != 0 {
        return Err(format!(
            "nvmlInit_v2 returned {rc} (no driver loaded, or no GPU)"
        ));
    }
    let mut ndev: c_uint = 0;
    let rc = count(&mut ndev);
    if rc != 0 {
        return Err(format!("nvmlDeviceGetCount_v2 returned {rc}"));
    }
    let mut devs = Vec::new();
    for i in 0..ndev.min(256) {
        let mut d: Device = std::ptr::null_mut();
        if by_index(i, &mut d) != 0 {
            continue;
        }
        let mut pi = zeroed_pci();
        if pci_info(d, &mut pi) != 0 {
            continue;
        }
        if let Some(b) = bus_id(&pi) {
            devs.push((i, d, b));
        }
    }
    let gpu_ids: Vec<&String> = devs.iter().map(|(_, _, b)| b).collect();
    let mut out = Vec::new();
    for (i, d, b) in &devs {
        let mut links: Vec<(String, u32)> = Vec::new();
        if let (Some(st), Some(rem)) = (link_state, link_remote) {
            for l in 0..MAX_LINKS {
                let mut active: c_int = 0;
                if st(*d, l, &mut active) != 0 || active == 0 {
                    continue;
                }
                let mut pi = zeroed_pci();
                if rem(*d, l, &mut pi) != 0 {
                    continue;
                }
                // A virtual machine given part of an NVSwitch board sees the
                // switches' bus id as FFFFFFFF:FF:FF.0 (nvidia-smi nvlink -R
                // says the same): a switch NVML does not name.
                let t = bus_id(&pi)
                    .or_else(|| (pi.domain == 0xffff_ffff).then(|| HIDDEN_SWITCH.to_string()));
                if let Some(t) = t {
                    match links.iter_mut().find(|(x, _)| *x == t) {
                        Some(e) => e.1 += 1,
                        None => links.push((t, 1)),
                    }
                }
            }
        }
        let mut p2ps = Vec::new();
        if let Some(f) = p2p {
            for (_, d2, b2) in &devs {
                if b2 == b {
                    continue;
                }
                let mut s: c_int = -1;
                // NVML_P2P_CAPS_INDEX_READ = 0.
                if f(*d, *d2, 0, &mut s) == 0 {
                    p2ps.push(serde_json::json!({ "target": b2, "status": s }));
                }
            }
        }
        let mut name = [0 as c_char; 96];
        let name = name_fn
            .filter(|f| f(*d, name.as_mut_ptr(), 96) == 0)
            // SAFETY: NVML NUL-terminates within the 96 bytes it was given.
            .map(|_| {
                unsafe { CStr::from_ptr(name.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            });
        let (mut ma, mut mi) = (0, 0);
        let sm = cc_fn
            .filter(|f| f(*d, &mut ma, &mut mi) == 0)
            .map(|_| ma * 10 + mi);
        out.push(serde_json::json!({
            "index": i, "busid": b, "name": name, "sm": sm,
            "links": links.iter().map(|(t, c)| serde_json::json!({
                "target": t, "count": c, "gpu": gpu_ids.contains(&t),
            })).collect::<Vec<_>>(),
            "p2p": p2ps,
        }));
    }
    let mut drv = [0 as c_char; 96];
    let driver = drv_fn
        .filter(|f| f(drv.as_mut_ptr(), 96) == 0)
        // SAFETY: NUL-terminated within the buffer.
        .map(|_| {
            unsafe { CStr::from_ptr(drv.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        });
    Ok(serde_json::json!({ "driver": driver, "gpus": out }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_parsing() {
        let r = parse_report(
            r#"{"driver":"580.1","gpus":[{"index":0,"busid":"00000000:00:06.0","name":"H200","sm":90,
            "links":[{"target":"00000000:00:07.0","count":18,"gpu":true}],"p2p":[{"target":"00000000:00:07.0","status":1}]}]}"#,
        );
        let NvSource::Nvml { gpus, .. } = &r else {
            panic!("{r:?}")
        };
        assert_eq!(gpus[0].busid, "0000:00:06.0");
        assert_eq!(gpus[0].links, vec![("0000:00:07.0".into(), 18, true)]);
        assert_eq!(gpus[0].p2p[0].1, P2pStatus::ChipsetNotSupported);
        assert!(matches!(
            parse_report(r#"{"error":"x"}"#),
            NvSource::Unavailable(_)
        ));
        assert!(matches!(parse_report("garbage"), NvSource::Unavailable(_)));
    }
}
