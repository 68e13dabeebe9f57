//! NVML, loaded at run time: each GPU's NVLinks (to which bus id, how many),
//! and optionally the peer-to-peer status between GPUs, which sysfs does not
//! show. The one NVML loader: it fills the core's
//! [`oxccl_core::topo::NvmlReport`], which joins the sysfs tree with
//! [`oxccl_core::topo::Topology::merge_nvml`].
//!
//! Two users: the library, in process, once per process, to learn its GPU's
//! links for the ring order and channel count ([`crate::topo`]); and `oxccl
//! topo`/`doctor`, which call [`probe`] in a child process under a timeout
//! (a hanging driver costs the tool 5 s, never a hang). `libnvidia-ml.so.1`
//! missing, or any call failing, is an `Err` naming what was missing: the
//! callers then go on without NVLink facts.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use oxccl_core::topo::gpu_facts::classify_links;
use oxccl_core::topo::{normalize_busid, NvmlGpu, NvmlReport, P2p, P2pStatus, HIDDEN_SWITCH};

/// NVLink ports a GPU may have (`NVML_NVLINK_MAX_LINKS`: 18 on Hopper and Blackwell).
const MAX_LINKS: c_uint = 18;

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

fn bus_id(p: &PciInfo) -> Option<String> {
    // SAFETY: NVML NUL-terminates busId within its 32 bytes; the buffer was
    // zeroed first, so a terminator exists even if NVML wrote nothing.
    let s = unsafe { CStr::from_ptr(p.bus_id.as_ptr()) }.to_string_lossy();
    normalize_busid(&s)
}

type Device = *mut c_void;

/// Asks NVML for every GPU, its links and (with `with_p2p`) the P2P status
/// towards every other GPU. Loads `libnvidia-ml.so.1` (kept loaded: NVML's
/// own state lives as long as the process, as NCCL's does).
pub fn probe(with_p2p: bool) -> Result<NvmlReport, String> {
    // SAFETY: a constant C string; loading runs the library's initialisers.
    let lib = unsafe {
        libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if lib.is_null() {
        return Err("libnvidia-ml.so.1 not found".into());
    }
    let sym = |name: &CStr| {
        // SAFETY: `lib` is a live dlopen handle and `name` a C string.
        let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    };
    let need = |name: &CStr| {
        sym(name).ok_or_else(|| format!("libnvidia-ml.so.1 has no {}", name.to_string_lossy()))
    };
    // Each symbol is cast to the C signature NVML's header gives for it;
    // handles and out-pointers are valid for each call.
    // SAFETY: nvmlInit_v2's signature is `nvmlReturn_t (void)`.
    let init: extern "C" fn() -> c_int = unsafe { std::mem::transmute(need(c"nvmlInit_v2")?) };
    // SAFETY: `nvmlReturn_t (unsigned int *)`.
    let count: extern "C" fn(*mut c_uint) -> c_int =
        unsafe { std::mem::transmute(need(c"nvmlDeviceGetCount_v2")?) };
    // SAFETY: `nvmlReturn_t (unsigned int, nvmlDevice_t *)`.
    let by_index: extern "C" fn(c_uint, *mut Device) -> c_int =
        unsafe { std::mem::transmute(need(c"nvmlDeviceGetHandleByIndex_v2")?) };
    // SAFETY: `nvmlReturn_t (nvmlDevice_t, nvmlPciInfo_t *)`, `PciInfo` its layout.
    let pci_info: extern "C" fn(Device, *mut PciInfo) -> c_int =
        unsafe { std::mem::transmute(need(c"nvmlDeviceGetPciInfo_v3")?) };
    let link_state: Option<extern "C" fn(Device, c_uint, *mut c_int) -> c_int> =
        sym(c"nvmlDeviceGetNvLinkState").map(|p| {
            // SAFETY: `nvmlReturn_t (nvmlDevice_t, unsigned int, nvmlEnableState_t *)`.
            unsafe { std::mem::transmute(p) }
        });
    let link_remote: Option<extern "C" fn(Device, c_uint, *mut PciInfo) -> c_int> =
        sym(c"nvmlDeviceGetNvLinkRemotePciInfo_v2").map(|p| {
            // SAFETY: `nvmlReturn_t (nvmlDevice_t, unsigned int, nvmlPciInfo_t *)`.
            unsafe { std::mem::transmute(p) }
        });
    let p2p: Option<extern "C" fn(Device, Device, c_int, *mut c_int) -> c_int> =
        sym(c"nvmlDeviceGetP2PStatus").map(|p| {
            // SAFETY: `nvmlReturn_t (nvmlDevice_t, nvmlDevice_t, nvmlGpuP2PCapsIndex_t,
            // nvmlGpuP2PStatus_t *)`, both enums C ints.
            unsafe { std::mem::transmute(p) }
        });
    let name_fn: Option<extern "C" fn(Device, *mut c_char, c_uint) -> c_int> =
        sym(c"nvmlDeviceGetName").map(|p| {
            // SAFETY: `nvmlReturn_t (nvmlDevice_t, char *, unsigned int)`.
            unsafe { std::mem::transmute(p) }
        });
    let cc_fn: Option<extern "C" fn(Device, *mut c_int, *mut c_int) -> c_int> =
        sym(c"nvmlDeviceGetCudaComputeCapability").map(|p| {
            // SAFETY: `nvmlReturn_t (nvmlDevice_t, int *, int *)`.
            unsafe { std::mem::transmute(p) }
        });
    let drv_fn: Option<extern "C" fn(*mut c_char, c_uint) -> c_int> =
        sym(c"nvmlSystemGetDriverVersion").map(|p| {
            // SAFETY: `nvmlReturn_t (char *, unsigned int)`.
            unsafe { std::mem::transmute(p) }
        });

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
    let gpu_busids: Vec<&str> = devs.iter().map(|(_, _, b)| b.as_str()).collect();
    let mut gpus = Vec::new();
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
        if let (true, Some(f)) = (with_p2p, p2p) {
            for (_, d2, b2) in &devs {
                if b2 == b {
                    continue;
                }
                let mut s: c_int = -1;
                // NVML_P2P_CAPS_INDEX_READ = 0.
                if f(*d, *d2, 0, &mut s) == 0 {
                    p2ps.push(P2p {
                        target: b2.clone(),
                        // Negative (never written) is out of NVML's range: unknown.
                        status: P2pStatus::from_nvml(u32::try_from(s).unwrap_or(u32::MAX)),
                    });
                }
            }
        }
        let mut name = [0 as c_char; 96];
        let name = name_fn
            .filter(|f| f(*d, name.as_mut_ptr(), 96) == 0)
            .map(|_| {
                // SAFETY: NVML NUL-terminates within the 96 bytes it was given.
                unsafe { CStr::from_ptr(name.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            });
        let (mut ma, mut mi) = (0, 0);
        let sm = cc_fn
            .filter(|f| f(*d, &mut ma, &mut mi) == 0)
            .map(|_| (ma * 10 + mi) as u32);
        gpus.push(NvmlGpu {
            index: *i,
            busid: b.clone(),
            name,
            sm,
            nvlinks: classify_links(&links, &gpu_busids),
            p2p: p2ps,
        });
    }
    let mut drv = [0 as c_char; 96];
    let driver = drv_fn.filter(|f| f(drv.as_mut_ptr(), 96) == 0).map(|_| {
        // SAFETY: NVML NUL-terminates within the 96 bytes it was given.
        unsafe { CStr::from_ptr(drv.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    });
    Ok(NvmlReport { driver, gpus })
}

/// How long ring setup waits for NVML before going on without it.
pub const NVML_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

type Answer = (
    std::sync::Mutex<Option<Result<NvmlReport, String>>>,
    std::sync::Condvar,
);

/// [`probe`] without P2P, once per process, on a thread of its own: what the
/// library uses. Waits at most `limit`; a driver that never answers costs
/// this call `limit` (then "NVML did not answer"), never a hang, and later
/// calls wait for the same answer again.
pub fn links_within(limit: std::time::Duration) -> Result<NvmlReport, String> {
    static ANSWER: std::sync::OnceLock<std::sync::Arc<Answer>> = std::sync::OnceLock::new();
    let a = ANSWER.get_or_init(|| {
        let a: std::sync::Arc<Answer> = Default::default();
        let b = a.clone();
        let spawned = std::thread::Builder::new()
            .name("oxccl-nvml".into())
            .spawn(move || {
                let r = probe(false);
                *b.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                b.1.notify_all();
            });
        if let Err(e) = spawned {
            *a.0.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(Err(format!("cannot start a thread for NVML: {e}")));
        }
        a
    });
    let g = a.0.lock().unwrap_or_else(|p| p.into_inner());
    let (g, _) =
        a.1.wait_timeout_while(g, limit, |r| r.is_none())
            .unwrap_or_else(|p| p.into_inner());
    match &*g {
        Some(r) => r.clone(),
        None => Err(format!(
            "NVML did not answer within {} s (going on without NVLink facts)",
            limit.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_or_a_reason_within_the_limit() {
        // No GPU here (CI): an error naming what is missing, quickly; on a
        // GPU machine a report. Either way no hang, and the same answer twice.
        let t = std::time::Instant::now();
        let a = links_within(NVML_WAIT);
        assert!(t.elapsed() <= NVML_WAIT + std::time::Duration::from_secs(1));
        if let Err(e) = &a {
            assert!(!e.is_empty());
        }
        assert_eq!(links_within(NVML_WAIT), a);
    }
}
