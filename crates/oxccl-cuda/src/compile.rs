//! NVRTC compilation with an on-disk cache of CUBINs.
//!
//! A program is compiled for one real architecture (`sm_90`: machine code, no
//! PTX, so the driver JIT is never involved) with `--std=c++17`, and the CUBIN
//! is stored under the cache folder as
//! `<program>-sm_<arch>-nvrtc<major>.<minor>-<hash>.cubin`, where the hash is
//! SHA-256 over the program's text, the headers' names and texts and the
//! options. A second process start finds the file and compiles nothing.
//!
//! The folder is `OXCCL_CACHE_DIR`, else `$XDG_CACHE_HOME/oxccl/kernels`,
//! else `$HOME/.cache/oxccl/kernels`; when none can be created the CUBIN is
//! only kept in memory. Files are written to a temporary name and renamed, so
//! concurrent processes never read half a file.
//!
//! Before any of that, [`compile`] looks in a read-only folder of *prebuilt*
//! kernels (`OXCCL_KERNEL_DIR`, else `oxccl-kernels/` beside the library or
//! program that holds this code), written by `oxccl kernels --out DIR` when
//! oxccl is packaged: `<program>-sm_<arch>-<hash>.cubin` and
//! `<program>-compute_<arch>-<hash>.ptx`, the hash without the NVRTC
//! version (which NVRTC made a CUBIN does not matter to load it). The order
//! ([`find_prebuilt`]): the CUBIN for the GPU's own architecture; a CUBIN
//! of the same major version and a lower minor one (machine code for 8.0
//! runs on 8.6 and 8.9, 10.0 on 10.3; not `allreduce.cu`'s sm_80 build on
//! sm_89, which lacks the fp8 kernels); PTX for the newest architecture not
//! above the GPU's (the driver compiles it at load and keeps the result in
//! its own cache); only then the disk cache and NVRTC. A process that finds
//! its kernels there starts as fast as a cached one and needs no NVRTC.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::nvrtc::sys;
use oxccl_core::{Error, ErrorKind, Result};
use sha2::{Digest, Sha256};

use crate::kernels::{KernelSource, HEADERS};
use crate::loader;

/// A compiled program.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The CUBIN.
    pub image: Arc<Vec<u8>>,
    /// Where it came from.
    pub origin: Origin,
    /// The cache file (read or written), if any.
    pub cache_file: Option<PathBuf>,
}

/// Where a compiled program came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Origin {
    /// Compiled by NVRTC now, taking this many milliseconds.
    Compiled(f64),
    /// Read from the disk cache.
    DiskCache,
    /// A CUBIN read from the prebuilt folder ([`prebuilt_dir`]).
    Prebuilt,
    /// PTX read from the prebuilt folder, for the driver to compile at load.
    PrebuiltPtx,
    /// Already compiled or read by this process.
    Memory,
}

/// The default cache folder (see the module docs).
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("OXCCL_CACHE_DIR").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(v));
    }
    if let Some(v) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(v).join("oxccl/kernels"));
    }
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(|h| PathBuf::from(h).join(".cache/oxccl/kernels"))
}

pub use crate::kernels::Target;

/// NVRTC options for a CUBIN of `arch` (e.g. 90 for sm_90).
pub fn options(arch: u32) -> Vec<String> {
    target_options(Target::Cubin(arch))
}

/// NVRTC options for `target`.
pub fn target_options(target: Target) -> Vec<String> {
    vec![
        format!("--gpu-architecture={}", target.tag()),
        "--std=c++17".into(),
    ]
}

/// The cache file name for `src` compiled for `arch` by NVRTC `version`.
pub fn cache_file_name(src: &KernelSource, arch: u32, version: (i32, i32)) -> String {
    let stem = src.name.trim_end_matches(".cu");
    format!(
        "{stem}-sm_{arch}-nvrtc{}.{}-{}.cubin",
        version.0,
        version.1,
        source_hash(src, Target::Cubin(arch))
    )
}

/// The prebuilt CUBIN's file name for `src` compiled for `arch` (see the
/// module docs).
pub fn prebuilt_file_name(src: &KernelSource, arch: u32) -> String {
    prebuilt_name(src, Target::Cubin(arch))
}

/// The prebuilt file name for `src` compiled to `target`.
pub fn prebuilt_name(src: &KernelSource, target: Target) -> String {
    let stem = src.name.trim_end_matches(".cu");
    format!(
        "{stem}-{}-{}.{}",
        target.tag(),
        source_hash(src, target),
        target.extension()
    )
}

/// 16 hex digits of SHA-256 over the program's name and text, the headers'
/// names and texts, and the options for `target`.
fn source_hash(src: &KernelSource, target: Target) -> String {
    let mut h = Sha256::new();
    h.update(src.name.as_bytes());
    h.update([0]);
    h.update(src.source.as_bytes());
    for (name, text) in HEADERS {
        h.update([0]);
        h.update(name.as_bytes());
        h.update([0]);
        h.update(text.as_bytes());
    }
    for o in target_options(target) {
        h.update([0]);
        h.update(o.as_bytes());
    }
    let digest = h.finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The prebuilt kernels' folder: `OXCCL_KERNEL_DIR`, else `oxccl-kernels`
/// beside the shared object or program this code is in, when it exists.
pub fn prebuilt_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = oxccl_env::params().get(&oxccl_core::params::KERNEL_DIR) {
            return Some(PathBuf::from(d.as_str()));
        }
        let d = this_object()?.parent()?.join("oxccl-kernels");
        d.is_dir().then_some(d)
    })
    .clone()
}

/// The file this code was loaded from (`libnccl.so.2`, the `oxccl` program).
fn this_object() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: dladdr only reads the address (a function of this object) and
    // fills `info`; dli_fname, when set, points at a NUL-terminated name the
    // loader keeps while the object is loaded (we copy it at once).
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        let here = this_object as fn() -> Option<PathBuf> as *const libc::c_void;
        if libc::dladdr(here, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        let name = std::ffi::CStr::from_ptr(info.dli_fname);
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
    }
}

/// `src` for `arch` from the prebuilt folder `dir`, if it is there (an ELF
/// file under the prebuilt name); kept in memory like the rest.
pub fn from_prebuilt(src: &KernelSource, arch: u32, dir: &Path) -> Option<Compiled> {
    read_prebuilt(src, Target::Cubin(arch), dir)
}

fn read_prebuilt(src: &KernelSource, target: Target, dir: &Path) -> Option<Compiled> {
    let name = prebuilt_name(src, target);
    let path = dir.join(&name);
    let (arch, accept, origin): (u32, Accept, Origin) = match target {
        Target::Cubin(a) => (a, is_cubin, Origin::Prebuilt),
        Target::Ptx(a) => (a, is_ptx, Origin::PrebuiltPtx),
    };
    let key = (name, arch, Some(dir.to_path_buf()));
    remembered_or_read(&key, Some(path), accept, origin)
}

/// Whether a file's bytes are what its name says.
type Accept = fn(&[u8]) -> bool;

fn is_cubin(b: &[u8]) -> bool {
    b.starts_with(b"\x7fELF")
}

/// PTX as NVRTC writes it: text with a `.version` line, NUL-terminated
/// (cuModuleLoadData reads it as a C string).
fn is_ptx(b: &[u8]) -> bool {
    b.last() == Some(&0) && b.windows(9).take(4096).any(|w| w == b".version ")
}

/// The targets in `names` (a folder's file names) that hold `src` and can
/// run on a GPU of `arch`, best first (see the module docs): its own
/// CUBIN, CUBINs of the same major version with a lower minor one
/// (highest first), then PTX not newer than `arch` (newest first).
pub fn prebuilt_candidates<'a>(
    src: &KernelSource,
    arch: u32,
    names: impl IntoIterator<Item = &'a str>,
) -> Vec<Target> {
    let stem = src.name.trim_end_matches(".cu");
    let mut found: Vec<Target> = names
        .into_iter()
        .filter_map(|n| {
            let rest = n.strip_prefix(stem)?.strip_prefix('-')?;
            let (tag, _) = rest.split_once('-')?;
            let t = if let Some(a) = tag.strip_prefix("sm_") {
                Target::Cubin(a.parse().ok()?)
            } else {
                Target::Ptx(tag.strip_prefix("compute_")?.parse().ok()?)
            };
            // The hash decides: another program with this stem as a prefix,
            // or a stale file of an older source, does not match.
            (prebuilt_name(src, t) == n).then_some(t)
        })
        .filter(|t| {
            // Not an sm_80 build (CUBIN or PTX) of a program that leaves
            // its fp8 kernels out below sm_89 on an sm_89 or newer GPU; the
            // other programs are the same for both.
            let (Target::Cubin(a) | Target::Ptx(a)) = *t;
            let fp8 = crate::kernels::FP8_MIN_ARCH;
            let whole = a >= fp8 || arch < fp8 || !crate::kernels::gates_fp8_by_arch(src);
            whole
                && match *t {
                    Target::Cubin(a) => a / 10 == arch / 10 && a <= arch,
                    Target::Ptx(a) => a <= arch,
                }
        })
        .collect();
    found.sort_by_key(|t| match *t {
        Target::Cubin(a) => (0, u32::MAX - a),
        Target::Ptx(a) => (1, u32::MAX - a),
    });
    found.dedup();
    found
}

/// `src` for a GPU of `arch` from the prebuilt folder `dir`: the first of
/// [`prebuilt_candidates`] that reads back as what its name says.
pub fn find_prebuilt(src: &KernelSource, arch: u32, dir: &Path) -> Option<Compiled> {
    if let Some(c) = from_prebuilt(src, arch, dir) {
        return Some(c);
    }
    let names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    prebuilt_candidates(src, arch, names.iter().map(String::as_str))
        .into_iter()
        .find_map(|t| read_prebuilt(src, t, dir))
}

/// `key`'s image from this process's memory, else read from `path` when
/// `accept` takes the file's bytes (then remembered, as coming from
/// `origin`): what the disk cache and the prebuilt folder share.
fn remembered_or_read(
    key: &MemKey,
    path: Option<PathBuf>,
    accept: Accept,
    origin: Origin,
) -> Option<Compiled> {
    let mem = MEMORY.get_or_init(Default::default);
    if let Some(img) = mem.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
        return Some(Compiled {
            image: img.clone(),
            origin: Origin::Memory,
            cache_file: path,
        });
    }
    let bytes = std::fs::read(path.as_ref()?).ok().filter(|b| accept(b))?;
    let img = Arc::new(bytes);
    mem.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key.clone(), img.clone());
    Some(Compiled {
        image: img,
        origin,
        cache_file: path,
    })
}

/// Writes every kernel in `sources` for `arch` into `dir` under its
/// prebuilt name (compiled through the disk cache `cache_dir`, so a warm
/// cache makes this quick); the files written and their sizes.
pub fn write_prebuilt(
    dir: &Path,
    arch: u32,
    sources: &[KernelSource],
    cache_dir: Option<&Path>,
) -> Result<Vec<(PathBuf, usize)>> {
    let jobs: Vec<_> = sources.iter().map(|s| (*s, Target::Cubin(arch))).collect();
    Ok(prebuild(dir, &jobs, 1, cache_dir)?
        .into_iter()
        .map(|b| (b.path, b.bytes))
        .collect())
}

/// One file [`prebuild`] wrote.
#[derive(Debug, Clone)]
pub struct Built {
    /// The program.
    pub name: &'static str,
    /// What it was compiled to.
    pub target: Target,
    /// The file.
    pub path: PathBuf,
    /// Its size.
    pub bytes: usize,
    /// Seconds NVRTC took (0 when it came from the disk cache).
    pub seconds: f64,
}

/// Compiles each (program, target) of `jobs` on `threads` threads (NVRTC
/// compiles distinct programs concurrently) and writes it into `dir` under
/// its prebuilt name; CUBINs go through the disk cache `cache_dir`. The
/// files in the order of `jobs`; the first error stops the rest.
pub fn prebuild(
    dir: &Path,
    jobs: &[(KernelSource, Target)],
    threads: usize,
    cache_dir: Option<&Path>,
) -> Result<Vec<Built>> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::system(format!("cannot create {}: {e}", dir.display())))?;
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let done: Mutex<Vec<Option<Result<Built>>>> = Mutex::new(vec![None; jobs.len()]);
    let one = |(src, target): &(KernelSource, Target)| -> Result<Built> {
        let t = Instant::now();
        let (image, fresh) = match *target {
            Target::Cubin(arch) => {
                let c = compile_cached(src, arch, cache_dir)?;
                let fresh = matches!(c.origin, Origin::Compiled(_));
                (c.image, fresh)
            }
            Target::Ptx(arch) => (Arc::new(compile_ptx_now(src, arch)?), true),
        };
        let path = dir.join(prebuilt_name(src, *target));
        store(dir, &path, &image)
            .map_err(|e| Error::system(format!("cannot write {}: {e}", path.display())))?;
        Ok(Built {
            name: src.name,
            target: *target,
            path,
            bytes: image.len(),
            seconds: if fresh {
                t.elapsed().as_secs_f64()
            } else {
                0.0
            },
        })
    };
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs.len() || failed.load(Ordering::Relaxed) {
                    break;
                }
                let r = one(&jobs[i]);
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    let done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::with_capacity(jobs.len());
    for r in done.into_iter().flatten() {
        out.push(r?);
    }
    Ok(out)
}

type MemKey = (String, u32, Option<PathBuf>);
static MEMORY: OnceLock<Mutex<HashMap<MemKey, Arc<Vec<u8>>>>> = OnceLock::new();

/// The CUBIN of `src` for `arch`: from this process's memory, else the disk
/// cache in `cache_dir` (None: no disk cache), else compiled by NVRTC (and
/// stored).
pub fn compile_cached(src: &KernelSource, arch: u32, cache_dir: Option<&Path>) -> Result<Compiled> {
    let info = loader::nvrtc()?;
    let file_name = cache_file_name(src, arch, info.version);
    let key = (file_name.clone(), arch, cache_dir.map(Path::to_path_buf));
    let path = cache_dir.map(|d| d.join(&file_name));
    if let Some(c) = remembered_or_read(&key, path.clone(), |b| !b.is_empty(), Origin::DiskCache) {
        return Ok(c);
    }
    let mem = MEMORY.get_or_init(Default::default);
    let t = Instant::now();
    let bytes = compile_now(src, arch)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let img = Arc::new(bytes);
    let mut stored = None;
    if let (Some(dir), Some(p)) = (cache_dir, &path) {
        if store(dir, p, &img).is_ok() {
            stored = Some(p.clone());
        }
    }
    mem.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, img.clone());
    Ok(Compiled {
        image: img,
        origin: Origin::Compiled(ms),
        cache_file: stored,
    })
}

/// `src` for a GPU of `arch`: from the prebuilt folder when it has something
/// that runs there ([`find_prebuilt`]), else through
/// the default cache folder (compiled by NVRTC when missing there too).
pub fn compile(src: &KernelSource, arch: u32) -> Result<Compiled> {
    let c = match prebuilt_dir().and_then(|d| find_prebuilt(src, arch, &d)) {
        Some(c) => c,
        None => compile_cached(src, arch, default_cache_dir().as_deref())?,
    };
    // One INFO line per program and process: with NCCL_DEBUG=INFO it shows
    // whether a packaged folder left anything to compile.
    let from = match c.origin {
        Origin::Memory => None,
        Origin::Prebuilt => Some("a prebuilt CUBIN".to_string()),
        Origin::PrebuiltPtx => Some("prebuilt PTX (the driver compiles it)".to_string()),
        Origin::DiskCache => Some("the kernel cache".to_string()),
        Origin::Compiled(ms) => Some(format!("NVRTC, {ms:.0} ms")),
    };
    if let Some(from) = from {
        oxccl_env::info!(
            oxccl_env::log::Subsys::INIT,
            "GPU kernels {} for sm_{arch} from {from}{}",
            src.name,
            c.cache_file
                .as_ref()
                .map(|f| format!(" ({})", f.display()))
                .unwrap_or_default()
        );
    }
    Ok(c)
}

fn store(dir: &Path, path: &Path, img: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("kernel"),
        std::process::id()
    ));
    std::fs::write(&tmp, img)?;
    std::fs::rename(&tmp, path)
}

fn nvrtc_err(what: &str, r: sys::nvrtcResult) -> Error {
    Error::new(ErrorKind::UnhandledCuda, format!("{what} failed: {r:?}"))
}

/// Compiles without any cache. Errors carry NVRTC's log.
pub fn compile_now(src: &KernelSource, arch: u32) -> Result<Vec<u8>> {
    loader::nvrtc()?;
    loader::guarded("NVRTC", || compile_inner(src, Target::Cubin(arch)))
}

/// PTX of `src` for `compute_<arch>`, NUL-terminated, without any cache.
pub fn compile_ptx_now(src: &KernelSource, arch: u32) -> Result<Vec<u8>> {
    loader::nvrtc()?;
    loader::guarded("NVRTC", || compile_inner(src, Target::Ptx(arch)))
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::internal("NUL byte in a kernel source or option"))
}

fn compile_inner(src: &KernelSource, target: Target) -> Result<Vec<u8>> {
    let text = cstring(src.source)?;
    let name = cstring(src.name)?;
    let hdr_texts: Vec<CString> = HEADERS
        .iter()
        .map(|h| cstring(h.1))
        .collect::<Result<_>>()?;
    let hdr_names: Vec<CString> = HEADERS
        .iter()
        .map(|h| cstring(h.0))
        .collect::<Result<_>>()?;
    let hdr_text_ptrs: Vec<*const c_char> = hdr_texts.iter().map(|c| c.as_ptr()).collect();
    let hdr_name_ptrs: Vec<*const c_char> = hdr_names.iter().map(|c| c.as_ptr()).collect();
    let opts: Vec<CString> = target_options(target)
        .iter()
        .map(|o| cstring(o))
        .collect::<Result<_>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is a live NUL-terminated string; the arrays hold
    // `HEADERS.len()` entries each; nvrtc copies what it needs.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            text.as_ptr(),
            name.as_ptr(),
            hdr_text_ptrs.len() as i32,
            hdr_text_ptrs.as_ptr(),
            hdr_name_ptrs.as_ptr(),
        )
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcCreateProgram", r));
    }
    struct Prog(sys::nvrtcProgram);
    impl Drop for Prog {
        fn drop(&mut self) {
            // SAFETY: created above, destroyed once.
            unsafe {
                sys::nvrtcDestroyProgram(&mut self.0);
            }
        }
    }
    let prog = Prog(prog);
    // SAFETY: `prog` is live; `opt_ptrs` holds `opts.len()` live strings.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        let log = program_log(prog.0);
        return Err(Error::new(
            ErrorKind::UnhandledCuda,
            format!(
                "NVRTC could not compile {} for {} ({r:?}):\n{log}",
                src.name,
                target.tag()
            ),
        ));
    }
    let (size_of, get): (SizeFn, GetFn) = match target {
        Target::Cubin(_) => (sys::nvrtcGetCUBINSize, sys::nvrtcGetCUBIN),
        Target::Ptx(_) => (sys::nvrtcGetPTXSize, sys::nvrtcGetPTX),
    };
    let mut size = 0usize;
    // SAFETY: `prog` compiled; writes one usize.
    let r = unsafe { size_of(prog.0, &mut size) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcGet(CUBIN|PTX)Size", r));
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` has the `size` bytes nvrtc asked for (PTX: with its NUL).
    let r = unsafe { get(prog.0, buf.as_mut_ptr() as *mut c_char) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcGet(CUBIN|PTX)", r));
    }
    if buf.iter().all(|&b| b == 0) {
        return Err(Error::new(
            ErrorKind::UnhandledCuda,
            format!("NVRTC produced an empty {} for {}", target.tag(), src.name),
        ));
    }
    Ok(buf)
}

type SizeFn = unsafe fn(sys::nvrtcProgram, *mut usize) -> sys::nvrtcResult;
type GetFn = unsafe fn(sys::nvrtcProgram, *mut c_char) -> sys::nvrtcResult;

fn program_log(prog: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: `prog` is live; writes one usize.
    if unsafe { sys::nvrtcGetProgramLogSize(prog, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS {
        return String::from("(no log)");
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: `buf` holds the `size` bytes nvrtc asked for.
    if unsafe { sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char) }
        != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return String::from("(no log)");
    }
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .to_string()
}
