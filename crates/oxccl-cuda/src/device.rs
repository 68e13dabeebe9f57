//! One GPU (its primary context and a stream), device memory from
//! `cuMemAlloc`, modules and launches, events. Calls go to
//! `cudarc::driver::sys` after [`crate::loader::driver`] checked the library
//! and every symbol used here, and run behind a panic guard.

use std::ffi::{c_char, c_void, CString};

use cudarc::driver::sys::{self, CUresult};
use oxccl_core::{Error, ErrorKind, Result};

use crate::loader::{self, guarded};

/// `Ok` for `CUDA_SUCCESS`, else an `UnhandledCuda` error naming the call and
/// the driver's error name and text.
pub(crate) fn check(r: CUresult, what: &str) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const c_char = std::ptr::null();
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: both write a pointer to a static string (or leave it null).
    unsafe {
        sys::cuGetErrorName(r, &mut name);
        sys::cuGetErrorString(r, &mut text);
    }
    let s = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: the driver returns static NUL-terminated strings.
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        }
    };
    Err(Error::new(
        ErrorKind::UnhandledCuda,
        format!("{what} failed: {} ({}) [{r:?}]", s(name), s(text)),
    ))
}

/// Launches `f` on `blocks` blocks of `threads` threads on `stream` with
/// one by-value parameter, `args` (every oxccl kernel takes one repr(C)
/// argument struct); programmatic where `pdl` and [`pdl_enabled`] (see
/// [`launch_raw`]). The context that owns `f` and `stream` must be current.
///
/// # Safety
/// `T` must be laid out as the kernel's parameter, and every pointer in
/// `args` must be valid for what the kernel does with it.
pub(crate) unsafe fn launch_struct<T: Copy>(
    f: sys::CUfunction,
    blocks: u32,
    threads: u32,
    stream: sys::CUstream,
    args: &T,
    pdl: bool,
    what: &str,
) -> Result<()> {
    // The driver copies the parameter at launch, so a local copy suffices.
    let mut a = *args;
    let mut params = [&mut a as *mut T as *mut c_void];
    // SAFETY: one parameter of T's layout (the caller's contract); the
    // array and `a` outlive the call.
    unsafe { launch_raw(f, blocks, threads, stream, &mut params, pdl, what) }
}

/// Whether oxccl's kernels are launched as programmatic dependent launches
/// (`OXCCL_CUDA_PDL`, default on): every kernel begins with
/// `kernel_entry()` (kernels/common.cuh), which waits for the kernel before
/// it, so the launch may start while that kernel still runs. Needs compute
/// capability 9.0 on every GPU and a driver of CUDA 12.3 or newer (the
/// first whose stream capture records programmatic launches in a graph).
static PDL: std::sync::OnceLock<std::sync::atomic::AtomicBool> = std::sync::OnceLock::new();

fn pdl_flag() -> &'static std::sync::atomic::AtomicBool {
    PDL.get_or_init(|| {
        let on = oxccl_env::params().get(&oxccl_core::params::CUDA_PDL)
            && loader::driver().is_ok_and(|d| {
                d.version >= 12030 && (0..d.devices).all(|i| compute_major(i) >= Some(9))
            });
        std::sync::atomic::AtomicBool::new(on)
    })
}

/// Whether launches are programmatic now (see `launch_raw`).
pub fn pdl_enabled() -> bool {
    pdl_flag().load(std::sync::atomic::Ordering::Relaxed)
}

/// The SMs of `dev` (None when the driver does not answer).
pub fn sm_count(dev: sys::CUdevice) -> Option<u32> {
    let mut n = 0;
    // SAFETY: an out-pointer to a local; `dev` came from the driver.
    let r = unsafe {
        sys::cuDeviceGetAttribute(
            &mut n,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            dev,
        )
    };
    (r == CUresult::CUDA_SUCCESS && n > 0).then_some(n as u32)
}

fn compute_major(ordinal: usize) -> Option<i32> {
    let mut dev: sys::CUdevice = 0;
    let mut major = 0;
    // SAFETY: out-pointers are valid; the driver was probed by the caller.
    unsafe {
        (sys::cuDeviceGet(&mut dev, ordinal as i32) == CUresult::CUDA_SUCCESS).then_some(())?;
        (sys::cuDeviceGetAttribute(
            &mut major,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            dev,
        ) == CUresult::CUDA_SUCCESS)
            .then_some(major)
    }
}

/// Launches `f` with the parameter array `params` on `stream`: a
/// programmatic dependent launch when `pdl` (the caller's: whether the
/// launch's blocks may wait on SMs early, e.g. [`crate::ring::pdl_fits`])
/// and [`pdl_enabled`] (`cuLaunchKernelEx` with programmatic stream
/// serialization), else `cuLaunchKernel`. Only kernels that begin with
/// `kernel_entry()` may come here.
///
/// # Safety
/// `params` must match the kernel's parameters (see [`launch_struct`]).
pub(crate) unsafe fn launch_raw(
    f: sys::CUfunction,
    blocks: u32,
    threads: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
    pdl: bool,
    what: &str,
) -> Result<()> {
    guarded("cuLaunchKernel", || {
        if pdl && pdl_enabled() {
            // SAFETY: an all-zero attribute is a valid value of the C union.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let cfg = sys::CUlaunchConfig {
                gridDimX: blocks,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: threads,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                hStream: stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: `cfg` and `attr` outlive the call; params: the caller's contract.
            let r = unsafe {
                sys::cuLaunchKernelEx(&cfg, f, params.as_mut_ptr(), std::ptr::null_mut())
            };
            if !matches!(
                r,
                CUresult::CUDA_ERROR_NOT_SUPPORTED | CUresult::CUDA_ERROR_INVALID_VALUE
            ) {
                return check(r, what);
            }
            // A driver or GPU that refuses the attribute (the checks at
            // start should have caught it): plain launches from now on.
            pdl_flag().store(false, std::sync::atomic::Ordering::Relaxed);
            oxccl_env::warn!(
                "{what}: the driver refused a programmatic dependent launch ({r:?}); launching without (set OXCCL_CUDA_PDL=0 to skip the attempt)"
            );
        }
        // SAFETY: params: the caller's contract.
        unsafe {
            check(
                sys::cuLaunchKernel(
                    f,
                    blocks,
                    1,
                    1,
                    threads,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
                what,
            )
        }
    })
}

/// One GPU: its primary context (retained) and a non-blocking stream.
/// Not `Send`: use it from the thread that made it.
#[derive(Debug)]
pub struct Gpu {
    ordinal: usize,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
}

impl Gpu {
    /// Number of GPUs; an error ("no CUDA driver", "no GPU") where there is none.
    pub fn count() -> Result<usize> {
        Ok(loader::driver()?.devices)
    }

    /// Opens GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<Gpu> {
        let info = loader::driver()?;
        if ordinal >= info.devices {
            return Err(Error::invalid_argument(format!(
                "GPU {ordinal} does not exist ({} visible)",
                info.devices
            )));
        }
        guarded("opening a GPU", || {
            let mut dev: sys::CUdevice = 0;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            let mut stream: sys::CUstream = std::ptr::null_mut();
            // SAFETY: out-pointers are valid; the driver was initialised by the probe.
            unsafe {
                check(sys::cuDeviceGet(&mut dev, ordinal as i32), "cuDeviceGet")?;
                check(
                    sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                    "cuDevicePrimaryCtxRetain",
                )?;
            }
            // From here on, Drop releases the context on every error path.
            let mut gpu = Gpu {
                ordinal,
                dev,
                ctx,
                stream: std::ptr::null_mut(),
            };
            gpu.bind()?;
            // SAFETY: the context is current; 1 = CU_STREAM_NON_BLOCKING.
            unsafe { check(sys::cuStreamCreate(&mut stream, 1), "cuStreamCreate")? };
            gpu.stream = stream;
            Ok(gpu)
        })
    }

    /// The ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The stream oxccl launches on.
    pub fn stream(&self) -> sys::CUstream {
        self.stream
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the life of `self`.
        unsafe { check(sys::cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent") }
    }

    fn attr(&self, a: sys::CUdevice_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        unsafe {
            check(
                sys::cuDeviceGetAttribute(&mut v, a, self.dev),
                "cuDeviceGetAttribute",
            )?
        };
        Ok(v)
    }

    /// Compute capability as major * 10 + minor (90 for an H100/H200).
    pub fn arch(&self) -> Result<u32> {
        guarded("cuDeviceGetAttribute", || {
            let major =
                self.attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor =
                self.attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            Ok((major * 10 + minor) as u32)
        })
    }

    /// Multiprocessor count.
    pub fn sm_count(&self) -> Result<u32> {
        guarded("cuDeviceGetAttribute", || {
            Ok(
                self.attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
                    as u32,
            )
        })
    }

    /// The device's name.
    pub fn name(&self) -> Result<String> {
        guarded("cuDeviceGetName", || {
            let mut buf = [0 as c_char; 256];
            // SAFETY: the buffer holds 256 chars; the driver NUL-terminates.
            unsafe {
                check(
                    sys::cuDeviceGetName(buf.as_mut_ptr(), 256, self.dev),
                    "cuDeviceGetName",
                )?
            };
            // SAFETY: NUL-terminated by the driver.
            Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned())
        })
    }

    /// `cuDeviceCanAccessPeer(self -> peer)`.
    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool> {
        guarded("cuDeviceCanAccessPeer", || {
            let mut v = 0;
            // SAFETY: writes one int; both devices are valid.
            unsafe {
                check(
                    sys::cuDeviceCanAccessPeer(&mut v, self.dev, peer.dev),
                    "cuDeviceCanAccessPeer",
                )?
            };
            Ok(v != 0)
        })
    }

    /// Lets kernels on `self` dereference `peer`'s device pointers. Already
    /// enabled counts as success.
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<()> {
        if !self.can_access_peer(peer)? {
            return Err(Error::new(
                ErrorKind::UnhandledCuda,
                format!(
                    "GPU {} cannot access GPU {} (cuDeviceCanAccessPeer = 0: no NVLink/PCIe peer path, or ACS blocks it)",
                    self.ordinal, peer.ordinal
                ),
            ));
        }
        guarded("cuCtxEnablePeerAccess", || {
            self.bind()?;
            // SAFETY: our context is current; the peer's context is retained.
            let r = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) };
            if r == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                return Ok(());
            }
            check(r, "cuCtxEnablePeerAccess")
        })
    }

    /// `bytes` of device memory from `cuMemAlloc` (never the pooled async
    /// allocator: its memory cannot be shared across processes later).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer<'_>> {
        guarded("cuMemAlloc", || {
            self.bind()?;
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: writes one pointer; a zero-byte request is rounded up.
            unsafe { check(sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)), "cuMemAlloc")? };
            Ok(DeviceBuffer {
                gpu: self,
                ptr,
                bytes,
            })
        })
    }

    /// Waits for everything queued on this GPU's context.
    pub fn synchronize(&self) -> Result<()> {
        guarded("cuCtxSynchronize", || {
            self.bind()?;
            // SAFETY: our context is current.
            unsafe { check(sys::cuCtxSynchronize(), "cuCtxSynchronize") }
        })
    }

    /// Loads a CUBIN.
    pub fn load_module(&self, image: &[u8]) -> Result<Module<'_>> {
        guarded("cuModuleLoadData", || {
            self.bind()?;
            let mut m: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: `image` is a complete CUBIN (ELF, self-delimiting) that outlives the call.
            unsafe {
                check(
                    sys::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void),
                    "cuModuleLoadData",
                )?
            };
            Ok(Module {
                gpu: self,
                module: m,
            })
        })
    }

    /// Launches `f` on this GPU's stream.
    ///
    /// # Safety
    /// `params` must point at values whose types and layout match the
    /// kernel's parameters, and every pointer they hold must be valid for what
    /// the kernel does with it.
    pub unsafe fn launch(
        &self,
        f: sys::CUfunction,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        guarded("cuLaunchKernel", || {
            self.bind()?;
            // SAFETY: the caller vouches for `params`; `f` belongs to a module of this context.
            unsafe {
                check(
                    sys::cuLaunchKernel(
                        f,
                        grid,
                        1,
                        1,
                        block,
                        1,
                        1,
                        0,
                        self.stream,
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    ),
                    "cuLaunchKernel",
                )
            }
        })
    }

    /// A timing event.
    pub fn event(&self) -> Result<Event<'_>> {
        guarded("cuEventCreate", || {
            self.bind()?;
            let mut e: sys::CUevent = std::ptr::null_mut();
            // SAFETY: writes one handle; flags 0 = default (timing on).
            unsafe { check(sys::cuEventCreate(&mut e, 0), "cuEventCreate")? };
            Ok(Event { gpu: self, ev: e })
        })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: the stream and the retained context are ours; errors are ignored in drop.
        unsafe {
            if sys::cuCtxSetCurrent(self.ctx) == CUresult::CUDA_SUCCESS {
                sys::cuCtxSynchronize();
                if !self.stream.is_null() {
                    sys::cuStreamDestroy_v2(self.stream);
                }
            }
            sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer<'g> {
    gpu: &'g Gpu,
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceBuffer<'_> {
    /// The device address (valid on peers that enabled access to its GPU).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }
    /// True when zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    /// The GPU it lives on.
    pub fn gpu(&self) -> &Gpu {
        self.gpu
    }

    /// Copies `src` to byte `offset` (waits for the GPU's queued work
    /// first), landed when it returns: from pageable memory cuMemcpyHtoD
    /// returns once the bytes are staged, and a kernel on a non-blocking
    /// stream is not ordered after the DMA (see perfio's `write`).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.range(offset, src.len())?;
        self.gpu.synchronize()?;
        guarded("cuMemcpyHtoD", || {
            // SAFETY: the range is inside the allocation (checked); `src` is readable.
            unsafe {
                check(
                    sys::cuMemcpyHtoD_v2(
                        self.ptr + offset as u64,
                        src.as_ptr() as *const c_void,
                        src.len(),
                    ),
                    "cuMemcpyHtoD",
                )
            }
        })?;
        self.gpu.synchronize()
    }

    /// Copies from byte `offset` into `dst` (waits for the GPU's queued work first).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.range(offset, dst.len())?;
        self.gpu.synchronize()?;
        guarded("cuMemcpyDtoH", || {
            // SAFETY: the range is inside the allocation (checked); `dst` is writable.
            unsafe {
                check(
                    sys::cuMemcpyDtoH_v2(
                        dst.as_mut_ptr() as *mut c_void,
                        self.ptr + offset as u64,
                        dst.len(),
                    ),
                    "cuMemcpyDtoH",
                )
            }
        })
    }

    /// Sets every byte to `v`.
    pub fn fill(&self, v: u8) -> Result<()> {
        self.gpu.synchronize()?;
        guarded("cuMemsetD8", || {
            // SAFETY: the whole allocation.
            unsafe { check(sys::cuMemsetD8_v2(self.ptr, v, self.bytes), "cuMemsetD8") }
        })
    }

    fn range(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(Error::invalid_argument(format!(
                "bytes {offset}..{} are outside a device buffer of {} bytes",
                offset.saturating_add(len),
                self.bytes
            )));
        }
        Ok(())
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in this context, freed once; errors ignored in drop.
        unsafe {
            if sys::cuCtxSetCurrent(self.gpu.ctx) == CUresult::CUDA_SUCCESS {
                sys::cuCtxSynchronize();
                sys::cuMemFree_v2(self.ptr);
            }
        }
    }
}

/// A loaded module.
#[derive(Debug)]
pub struct Module<'g> {
    gpu: &'g Gpu,
    module: sys::CUmodule,
}

impl Module<'_> {
    /// A kernel by its (extern "C") name.
    pub fn function(&self, name: &str) -> Result<sys::CUfunction> {
        let c = CString::new(name).map_err(|_| Error::invalid_argument("NUL in a kernel name"))?;
        guarded("cuModuleGetFunction", || {
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: the module is loaded; `c` is NUL-terminated.
            unsafe {
                check(
                    sys::cuModuleGetFunction(&mut f, self.module, c.as_ptr()),
                    &format!("cuModuleGetFunction({name})"),
                )?
            };
            Ok(f)
        })
    }
}

impl Drop for Module<'_> {
    fn drop(&mut self) {
        // SAFETY: loaded in this context, unloaded once; errors ignored in drop.
        unsafe {
            if sys::cuCtxSetCurrent(self.gpu.ctx) == CUresult::CUDA_SUCCESS {
                sys::cuCtxSynchronize();
                sys::cuModuleUnload(self.module);
            }
        }
    }
}

/// A CUDA event on a GPU's stream, for timing.
#[derive(Debug)]
pub struct Event<'g> {
    gpu: &'g Gpu,
    ev: sys::CUevent,
}

impl Event<'_> {
    /// Records the event on the GPU's stream.
    pub fn record(&self) -> Result<()> {
        guarded("cuEventRecord", || {
            // SAFETY: event and stream belong to the same context.
            unsafe {
                check(
                    sys::cuEventRecord(self.ev, self.gpu.stream),
                    "cuEventRecord",
                )
            }
        })
    }
    /// Milliseconds from `start` to `self`, waiting for `self` first.
    pub fn elapsed_ms_since(&self, start: &Event<'_>) -> Result<f32> {
        guarded("cuEventElapsedTime", || {
            let mut ms = 0f32;
            // SAFETY: both events were recorded; writes one float.
            unsafe {
                check(sys::cuEventSynchronize(self.ev), "cuEventSynchronize")?;
                check(
                    sys::cuEventElapsedTime_v2(&mut ms, start.ev, self.ev),
                    "cuEventElapsedTime_v2",
                )?;
            }
            Ok(ms)
        })
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        unsafe {
            sys::cuEventDestroy_v2(self.ev);
        }
    }
}

/// Makes a context current for its lifetime; puts the previous one back.
pub(crate) struct CtxScope {
    saved: sys::CUcontext,
    /// Whether `enter` changed the current context (else drop has nothing
    /// to put back: one driver call less per launch, ~25 ns).
    changed: bool,
}

impl CtxScope {
    /// Makes `ctx` current (the driver must have been probed).
    pub(crate) fn enter(ctx: sys::CUcontext) -> Result<CtxScope> {
        guarded("cuCtxSetCurrent", || {
            let mut saved: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: writes one handle; then sets a retained context current.
            unsafe {
                check(sys::cuCtxGetCurrent(&mut saved), "cuCtxGetCurrent")?;
                if saved != ctx {
                    check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
                }
            }
            Ok(CtxScope {
                saved,
                changed: saved != ctx,
            })
        })
    }
}

impl Drop for CtxScope {
    fn drop(&mut self) {
        if !self.changed {
            return;
        }
        // SAFETY: `saved` was current before (or NULL, which unbinds); errors ignored in drop.
        unsafe {
            sys::cuCtxSetCurrent(self.saved);
        }
    }
}
