//! Finding and checking the CUDA driver (`libcuda`) and NVRTC before cudarc
//! touches them.
//!
//! cudarc 0.19.10 (with `dynamic-loading`) opens its libraries lazily through
//! `libloading`, trying the names of `cudarc::get_lib_name_candidates` in
//! order (`libcuda.so`, `libcuda64.so`, ..., `libcuda.so.13`, ...,
//! `libcuda.so.1`), and **panics** when none opens (`panic_no_lib_found`) or
//! when a function's symbol is missing (each `sys` function resolves its
//! symbol on first call). So before any cudarc call we:
//!
//! 1. open the same names in the same order with `dlopen` (the first that
//!    opens is the object cudarc will get: the dynamic loader answers a name
//!    it already loaded, or one matching a loaded object's SONAME, with that
//!    object);
//! 2. `dlsym` every driver function oxccl calls, so a missing symbol is an
//!    error naming it, not a panic;
//! 3. call `cuInit` through our own pointer: `CUDA_ERROR_STUB_LIBRARY` (34, the
//!    toolkit's `stubs/libcuda.so` found first) and `CUDA_ERROR_NO_DEVICE`
//!    (100) mean "no GPU", any other failure is an error.
//!
//! For NVRTC the library is usually outside the loader's path (a toolkit's
//! `targets/x86_64-linux/lib`, or pip's `nvidia/cu13/lib`), and changing
//! `LD_LIBRARY_PATH` after the process started has no effect on `dlopen`. So we
//! search the usual places, `dlopen` the file found by its full path (it stays
//! loaded), and then cudarc's `dlopen("libnvrtc.so.13")` is answered with it by
//! its SONAME.
//!
//! Handles are never closed, so what we checked stays what cudarc uses.

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use oxccl_core::{Error, ErrorKind, Result};

/// Driver functions oxccl calls (through `cudarc::driver::sys`), by the
/// symbol names cudarc resolves.
pub const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuPointerGetAttribute",
    "cuPointerGetAttributes",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyAsync",
    "cuStreamWaitEvent",
    "cuCtxSynchronize",
    "cuCtxEnablePeerAccess",
    "cuDeviceCanAccessPeer",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemsetD8_v2",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetPCIBusId",
    "cuDeviceGetByPCIBusId",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuStreamIsCapturing",
    "cuStreamGetCtx",
    // The copy-engine reduction's flags (copy_engine_reduce.rs), CUDA 11.7+.
    "cuStreamWriteValue32_v2",
    "cuStreamWaitValue32_v2",
];

/// NVRTC functions oxccl calls.
pub const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetErrorString",
];

/// The CUDA driver that cudarc will use, checked.
#[derive(Debug, Clone)]
pub struct DriverInfo {
    /// The file the loader opened (from `dladdr`).
    pub path: String,
    /// `cuDriverGetVersion`: 1000 * major + 10 * minor (13000 for CUDA 13.0).
    pub version: i32,
    /// `cuDeviceGetCount` (at least 1).
    pub devices: usize,
}

impl DriverInfo {
    /// `ordinal` as a GPU of this driver, or the error naming it.
    pub fn check_ordinal(&self, ordinal: usize) -> Result<()> {
        if ordinal >= self.devices {
            return Err(Error::invalid_argument(format!(
                "GPU {ordinal} does not exist ({} visible)",
                self.devices
            )));
        }
        Ok(())
    }
}

/// Why GPU work cannot run here.
#[derive(Debug, Clone)]
pub enum Unavailable {
    /// No `libcuda` could be opened.
    NoDriver {
        /// The names handed to the loader, in cudarc's order.
        tried: Vec<String>,
    },
    /// A driver library was found but there is no usable GPU (stub library,
    /// no device).
    NoGpu {
        /// The library opened.
        path: String,
        /// What the driver said.
        reason: String,
    },
    /// Something is broken (missing symbol, cuInit failed otherwise).
    Failed(Error),
}

impl Unavailable {
    /// True for "there is no GPU here" (no driver, stub driver, no device), as
    /// opposed to a broken installation.
    pub fn is_no_gpu(&self) -> bool {
        !matches!(self, Unavailable::Failed(_))
    }

    /// The error a GPU call returns for this.
    pub fn to_error(&self) -> Error {
        match self {
            Unavailable::NoDriver { tried } => Error::new(
                ErrorKind::UnhandledCuda,
                format!(
                    "no CUDA driver: looked for libcuda.so.1 in the dynamic loader's path \
                     (LD_LIBRARY_PATH={}, /etc/ld.so.cache, /lib, /usr/lib) under the names {}; \
                     install the NVIDIA driver or put the folder holding libcuda.so.1 in LD_LIBRARY_PATH",
                    std::env::var("LD_LIBRARY_PATH").unwrap_or_default(),
                    tried.join(", ")
                ),
            ),
            Unavailable::NoGpu { path, reason } => Error::new(
                ErrorKind::UnhandledCuda,
                format!("no GPU: {reason} (driver library {path})"),
            ),
            Unavailable::Failed(e) => e.clone(),
        }
    }
}

/// A `dlopen` handle. It has no `Drop`: oxccl never calls `dlclose`, so every
/// object it opened stays loaded for the life of the process.
struct Handle(*mut c_void);
// SAFETY: a dlopen handle is a process-wide token; dlsym on it is thread-safe.
unsafe impl Send for Handle {}
// SAFETY: as above; the handle is never closed.
unsafe impl Sync for Handle {}

fn dlerror_string() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libc,
    // valid until the next dl* call on this thread; we copy it at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            String::from("unknown dlopen error")
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

fn dlopen(name: &str, flags: c_int) -> std::result::Result<Handle, String> {
    let c = CString::new(name).map_err(|_| format!("{name}: NUL in name"))?;
    // SAFETY: `c` is a valid NUL-terminated string; dlopen has no other preconditions.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    if h.is_null() {
        Err(dlerror_string())
    } else {
        Ok(Handle(h))
    }
}

fn dlsym(h: &Handle, name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: `h.0` is a live handle from dlopen (never closed), `c` is NUL-terminated.
    let p = unsafe { libc::dlsym(h.0, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// The file an address belongs to, from `dladdr`.
fn object_path(addr: *mut c_void) -> String {
    // SAFETY: Dl_info is plain old data; zeroed is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address and fills `info`.
    let ok = unsafe { libc::dladdr(addr as *const c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return String::from("(unknown path)");
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader, valid while the object is loaded (forever here).
    unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned()
}

/// cudarc's library names for `lib`, behind a panic guard.
fn cudarc_names(libs: &[&str]) -> Vec<String> {
    std::panic::catch_unwind(|| {
        libs.iter()
            .flat_map(|l| cudarc::get_lib_name_candidates(l))
            .collect::<Vec<_>>()
    })
    .unwrap_or_default()
}

/// Opens the first of `names` that the loader finds, as libloading would
/// (`RTLD_LAZY | RTLD_LOCAL`).
fn first_opening(names: &[String]) -> Option<Handle> {
    names
        .iter()
        .find_map(|n| dlopen(n, libc::RTLD_LAZY | libc::RTLD_LOCAL).ok())
}

const CUDA_SUCCESS: c_int = 0;
const CUDA_ERROR_STUB_LIBRARY: c_int = 34;
const CUDA_ERROR_NO_DEVICE: c_int = 100;

fn probe_driver_uncached() -> std::result::Result<DriverInfo, Unavailable> {
    let names = cudarc_names(&["cuda", "nvcuda"]);
    let Some(h) = first_opening(&names) else {
        return Err(Unavailable::NoDriver { tried: names });
    };
    let mut missing = Vec::new();
    for s in DRIVER_SYMBOLS {
        if dlsym(&h, s).is_none() {
            missing.push(*s);
        }
    }
    let init = dlsym(&h, "cuInit");
    let path = init
        .map(object_path)
        .unwrap_or_else(|| "(unknown path)".into());
    if !missing.is_empty() {
        return Err(Unavailable::Failed(Error::new(
            ErrorKind::UnhandledCuda,
            format!(
                "the CUDA driver library {path} lacks {} (oxccl needs a CUDA 13.0 driver, 580 or newer)",
                missing.join(", ")
            ),
        )));
    }
    type Init = unsafe extern "C" fn(u32) -> c_int;
    type GetInt = unsafe extern "C" fn(*mut c_int) -> c_int;
    // SAFETY: the symbols were found above; these are their C signatures in cuda.h
    // (CUresult is a C enum, an int).
    let (cu_init, cu_version, cu_count) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Init>(init.unwrap_or(std::ptr::null_mut())),
            std::mem::transmute::<*mut c_void, GetInt>(
                dlsym(&h, "cuDriverGetVersion").unwrap_or(std::ptr::null_mut()),
            ),
            std::mem::transmute::<*mut c_void, GetInt>(
                dlsym(&h, "cuDeviceGetCount").unwrap_or(std::ptr::null_mut()),
            ),
        )
    };
    // SAFETY: cuInit(0) has no preconditions.
    let r = unsafe { cu_init(0) };
    match r {
        CUDA_SUCCESS => {}
        CUDA_ERROR_STUB_LIBRARY => {
            return Err(Unavailable::NoGpu {
                path: path.clone(),
                reason: format!(
                    "cuInit returned CUDA_ERROR_STUB_LIBRARY: {path} is the CUDA toolkit's stub, \
                     found before the real driver; take the toolkit's stubs folder out of LD_LIBRARY_PATH"
                ),
            })
        }
        CUDA_ERROR_NO_DEVICE => {
            return Err(Unavailable::NoGpu {
                path,
                reason: "cuInit returned CUDA_ERROR_NO_DEVICE: no CUDA-capable device is visible \
                         (check CUDA_VISIBLE_DEVICES and nvidia-smi)"
                    .into(),
            })
        }
        e => {
            return Err(Unavailable::Failed(Error::new(
                ErrorKind::UnhandledCuda,
                format!("cuInit failed with CUresult {e} (driver library {path})"),
            )))
        }
    }
    let (mut version, mut count) = (0, 0);
    // SAFETY: both write one int through a valid pointer.
    let (rv, rc) = unsafe { (cu_version(&mut version), cu_count(&mut count)) };
    if rv != CUDA_SUCCESS || rc != CUDA_SUCCESS {
        return Err(Unavailable::Failed(Error::new(
            ErrorKind::UnhandledCuda,
            format!("cuDriverGetVersion/cuDeviceGetCount failed ({rv}/{rc}) on {path}"),
        )));
    }
    if count <= 0 {
        return Err(Unavailable::NoGpu {
            path,
            reason: "cuDeviceGetCount found 0 devices".into(),
        });
    }
    let _kept = h; // no Drop impl: the object stays loaded and cudarc will get it
    Ok(DriverInfo {
        path,
        version,
        devices: count as usize,
    })
}

static DRIVER: OnceLock<std::result::Result<DriverInfo, Unavailable>> = OnceLock::new();

/// Finds and checks the driver once per process (see the module docs). After
/// `Ok`, cudarc's driver functions that oxccl calls can load without panicking.
pub fn probe_driver() -> std::result::Result<&'static DriverInfo, &'static Unavailable> {
    DRIVER
        .get_or_init(|| {
            std::panic::catch_unwind(probe_driver_uncached).unwrap_or_else(|_| {
                Err(Unavailable::Failed(Error::internal(
                    "panic while probing the CUDA driver",
                )))
            })
        })
        .as_ref()
}

/// The checked driver, or the error every GPU call returns without one.
pub fn driver() -> Result<&'static DriverInfo> {
    probe_driver().map_err(Unavailable::to_error)
}

/// NVRTC as cudarc will use it, checked.
#[derive(Debug, Clone)]
pub struct NvrtcInfo {
    /// The file the loader opened.
    pub path: String,
    /// `nvrtcVersion`: (major, minor).
    pub version: (i32, i32),
}

/// The folders searched for `libnvrtc.so.13`, in order: `OXCCL_NVRTC` (a file
/// or a folder), `LD_LIBRARY_PATH`, CUDA toolkits under `/usr/local`, and the
/// `nvidia/cu13/lib` or `nvidia/cuda_nvrtc/lib` folders of Python
/// site-packages (pip's `nvidia-cuda-nvrtc` wheel).
pub fn nvrtc_search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("OXCCL_NVRTC") {
        let p = PathBuf::from(v);
        if p.is_file() {
            dirs.push(p.parent().map(Path::to_path_buf).unwrap_or_default());
        } else {
            dirs.push(p);
        }
    }
    if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()));
    }
    let mut toolkits: Vec<PathBuf> = std::fs::read_dir("/usr/local")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("cuda"))
                })
                .collect()
        })
        .unwrap_or_default();
    toolkits.sort();
    toolkits.reverse(); // cuda-13.0 before cuda-12.x; plain "cuda" (a link) last
    for t in &toolkits {
        dirs.push(t.join("targets/x86_64-linux/lib"));
        dirs.push(t.join("lib64"));
    }
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        prefixes.push(PathBuf::from(v).join("lib"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(h).join(".local/lib"));
    }
    for p in ["/opt/torch/.venv/lib", "/usr/local/lib", "/usr/lib"] {
        prefixes.push(PathBuf::from(p));
    }
    for pre in prefixes {
        let Ok(rd) = std::fs::read_dir(&pre) else {
            continue;
        };
        let mut pys: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pys.sort();
        for py in pys {
            for sp in ["site-packages", "dist-packages"] {
                dirs.push(py.join(sp).join("nvidia/cu13/lib"));
                dirs.push(py.join(sp).join("nvidia/cuda_nvrtc/lib"));
            }
        }
    }
    dirs
}

/// Loads `libnvrtc-builtins.so.*` (not the `.alt` variant) from `dir`.
fn preload_builtins(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let n = e.file_name();
        let n = n.to_string_lossy();
        if n.starts_with("libnvrtc-builtins.so.") {
            if let Ok(h) = dlopen(
                &e.path().to_string_lossy(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            ) {
                let _kept = h; // no Drop impl: never dlclose()d, stays loaded
            }
        }
    }
}

fn probe_nvrtc_uncached() -> Result<NvrtcInfo> {
    let dirs = nvrtc_search_dirs();
    // Preload the first libnvrtc.so.13 found by full path (see the module docs).
    let mut preload_errors = Vec::new();
    for d in &dirs {
        let f = d.join("libnvrtc.so.13");
        if f.is_file() {
            match dlopen(&f.to_string_lossy(), libc::RTLD_NOW | libc::RTLD_LOCAL) {
                Ok(h) => {
                    let _kept = h; // no Drop impl: never dlclose()d, stays loaded
                                   // NVRTC dlopens `libnvrtc-builtins.so.13.<minor>` by name
                                   // at compile time; pip's folder is not on the loader's path,
                                   // so load it by full path too (answered by SONAME later).
                    preload_builtins(d);
                    break;
                }
                Err(e) => preload_errors.push(e),
            }
        }
    }
    let names = cudarc_names(&["nvrtc"]);
    let Some(h) = first_opening(&names) else {
        let mut msg = format!(
            "NVRTC not found: looked for libnvrtc.so.13 in {}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !preload_errors.is_empty() {
            msg.push_str(&format!(
                " (found but not loadable: {})",
                preload_errors.join("; ")
            ));
        }
        msg.push_str(
            "; install the CUDA 13.0 toolkit or `pip install nvidia-cuda-nvrtc==13.0.88`, \
             or set OXCCL_NVRTC to the folder holding libnvrtc.so.13",
        );
        return Err(Error::new(ErrorKind::UnhandledCuda, msg));
    };
    let missing: Vec<&str> = NVRTC_SYMBOLS
        .iter()
        .copied()
        .filter(|s| dlsym(&h, s).is_none())
        .collect();
    let ver = dlsym(&h, "nvrtcVersion");
    let path = ver
        .map(object_path)
        .unwrap_or_else(|| "(unknown path)".into());
    if !missing.is_empty() {
        return Err(Error::new(
            ErrorKind::UnhandledCuda,
            format!("NVRTC at {path} lacks {}", missing.join(", ")),
        ));
    }
    type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
    // SAFETY: nvrtcVersion(int*, int*) -> nvrtcResult, found above.
    let f =
        unsafe { std::mem::transmute::<*mut c_void, Version>(ver.unwrap_or(std::ptr::null_mut())) };
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints through valid pointers.
    let r = unsafe { f(&mut major, &mut minor) };
    if r != 0 {
        return Err(Error::new(
            ErrorKind::UnhandledCuda,
            format!("nvrtcVersion failed ({r}) on {path}"),
        ));
    }
    let _kept = h; // no Drop impl: never dlclose()d, stays loaded
    if let Some(dir) = Path::new(&path).parent() {
        preload_builtins(dir);
    }
    Ok(NvrtcInfo {
        path,
        version: (major, minor),
    })
}

static NVRTC: OnceLock<Result<NvrtcInfo>> = OnceLock::new();

/// Finds, loads and checks NVRTC once per process. After `Ok`, cudarc's NVRTC
/// functions that oxccl calls load without panicking.
pub fn nvrtc() -> Result<&'static NvrtcInfo> {
    NVRTC
        .get_or_init(|| {
            std::panic::catch_unwind(probe_nvrtc_uncached)
                .unwrap_or_else(|_| Err(Error::internal("panic while probing NVRTC")))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs `f` (which calls into cudarc) behind a panic guard: the second line of
/// defence after the probes above.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            Err(Error::new(
                ErrorKind::UnhandledCuda,
                format!("{what}: the CUDA library call panicked: {msg}"),
            ))
        }
    }
}
