//! One GPU (its primary context and a stream), device memory from
//! `cuMemAlloc`, modules and launches, events. Calls go through
//! `crate::driver` after [`crate::loader::driver`] checked the library
//! and every symbol used here, and run behind a panic guard.

use std::ffi::{c_void, CString};

use oxccl_core::{Error, ErrorKind, Result};

use crate::driver::{self as cu, CUdevice_attribute, CUresult};
use crate::loader::{self, guarded};

/// Launches `f` on `blocks` blocks of `threads` threads on `stream` with
/// one by-value parameter, `args` (every oxccl kernel takes one repr(C)
/// argument struct); programmatic where `pdl` and [`pdl_enabled`] (see
/// [`launch_raw`]). The context that owns `f` and `stream` must be current.
///
/// # Safety
/// `T` must be laid out as the kernel's parameter, and every pointer in
/// `args` must be valid for what the kernel does with it.
pub(crate) unsafe fn launch_struct<T: Copy>(
    f: cu::CUfunction,
    blocks: u32,
    threads: u32,
    stream: cu::CUstream,
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
pub fn sm_count(dev: cu::CUdevice) -> Option<u32> {
    let n = cu::device_attribute(
        dev,
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )
    .ok()?;
    (n > 0).then_some(n as u32)
}

fn compute_major(ordinal: usize) -> Option<i32> {
    // The driver was probed by the caller.
    let dev = cu::device_get(ordinal as i32).ok()?;
    cu::device_attribute(
        dev,
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    )
    .ok()
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
    f: cu::CUfunction,
    blocks: u32,
    threads: u32,
    stream: cu::CUstream,
    params: &mut [*mut c_void],
    pdl: bool,
    what: &str,
) -> Result<()> {
    guarded("cuLaunchKernel", || {
        if pdl && pdl_enabled() {
            // SAFETY: an all-zero attribute is a valid value of the C union.
            let mut attr: cu::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let cfg = cu::CUlaunchConfig {
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
            let r = match unsafe { cu::launch_kernel_ex(&cfg, f, params) } {
                Err(e)
                    if matches!(
                        e.code,
                        CUresult::CUDA_ERROR_NOT_SUPPORTED | CUresult::CUDA_ERROR_INVALID_VALUE
                    ) =>
                {
                    e.code
                }
                r => return r.map_err(|e| e.context(what)),
            };
            // A driver or GPU that refuses the attribute (the checks at
            // start should have caught it): plain launches from now on.
            pdl_flag().store(false, std::sync::atomic::Ordering::Relaxed);
            oxccl_env::warn!(
                "{what}: the driver refused a programmatic dependent launch ({r:?}); launching without (set OXCCL_CUDA_PDL=0 to skip the attempt)"
            );
        }
        // SAFETY: params: the caller's contract.
        unsafe { cu::launch_kernel(f, blocks, threads, stream, params) }
            .map_err(|e| e.context(what))
    })
}

/// One GPU: its primary context (retained) and a non-blocking stream.
/// Not `Send`: use it from the thread that made it.
#[derive(Debug)]
pub struct Gpu {
    ordinal: usize,
    dev: cu::CUdevice,
    ctx: cu::CUcontext,
    stream: cu::CUstream,
}

impl Gpu {
    /// Number of GPUs; an error ("no CUDA driver", "no GPU") where there is none.
    pub fn count() -> Result<usize> {
        Ok(loader::driver()?.devices)
    }

    /// Opens GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<Gpu> {
        let info = loader::driver()?;
        info.check_ordinal(ordinal)?;
        guarded("opening a GPU", || {
            // The driver was initialised by the probe.
            let dev = cu::device_get(ordinal as i32)?;
            let ctx = cu::primary_ctx_retain(dev)?;
            // From here on, Drop releases the context on every error path.
            let mut gpu = Gpu {
                ordinal,
                dev,
                ctx,
                stream: std::ptr::null_mut(),
            };
            gpu.bind()?;
            // The context is current; 1 = CU_STREAM_NON_BLOCKING.
            gpu.stream = cu::stream_create(1)?;
            Ok(gpu)
        })
    }

    /// The ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The stream oxccl launches on.
    pub fn stream(&self) -> cu::CUstream {
        self.stream
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the life of `self`.
        Ok(unsafe { cu::ctx_set_current(self.ctx) }?)
    }

    fn attr(&self, a: CUdevice_attribute) -> Result<i32> {
        Ok(cu::device_attribute(self.dev, a)?)
    }

    /// Compute capability as major * 10 + minor (90 for an H100/H200).
    pub fn arch(&self) -> Result<u32> {
        guarded("cuDeviceGetAttribute", || {
            let major =
                self.attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor =
                self.attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            Ok((major * 10 + minor) as u32)
        })
    }

    /// Multiprocessor count.
    pub fn sm_count(&self) -> Result<u32> {
        guarded("cuDeviceGetAttribute", || {
            Ok(self.attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32)
        })
    }

    /// The device's name.
    pub fn name(&self) -> Result<String> {
        guarded("cuDeviceGetName", || Ok(cu::device_name(self.dev)?))
    }

    /// `cuDeviceCanAccessPeer(self -> peer)`.
    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool> {
        guarded("cuDeviceCanAccessPeer", || {
            Ok(cu::device_can_access_peer(self.dev, peer.dev)?)
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
            match unsafe { cu::ctx_enable_peer_access(peer.ctx) } {
                Err(e) if e.code == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
                r => Ok(r?),
            }
        })
    }

    /// `bytes` of device memory from `cuMemAlloc` (never the pooled async
    /// allocator: its memory cannot be shared across processes later).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer<'_>> {
        guarded("cuMemAlloc", || {
            self.bind()?;
            // A zero-byte request is rounded up.
            let ptr = cu::mem_alloc(bytes.max(1))?;
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
            // Our context is current.
            Ok(cu::ctx_synchronize()?)
        })
    }

    /// Loads a CUBIN.
    pub fn load_module(&self, image: &[u8]) -> Result<Module<'_>> {
        guarded("cuModuleLoadData", || {
            self.bind()?;
            // SAFETY: `image` is a complete CUBIN (ELF, self-delimiting) that outlives the call.
            let m = unsafe { cu::module_load_data(image) }?;
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
        f: cu::CUfunction,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        guarded("cuLaunchKernel", || {
            self.bind()?;
            // SAFETY: the caller vouches for `params`; `f` belongs to a module of this context.
            Ok(unsafe { cu::launch_kernel(f, grid, block, self.stream, params) }?)
        })
    }

    /// A timing event.
    pub fn event(&self) -> Result<Event<'_>> {
        guarded("cuEventCreate", || {
            self.bind()?;
            // Flags 0 = default (timing on).
            let e = cu::event_create(0)?;
            Ok(Event { gpu: self, ev: e })
        })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: the stream and the retained context are ours; errors are ignored in drop.
        unsafe {
            if cu::ctx_set_current(self.ctx).is_ok() {
                let _ = cu::ctx_synchronize();
                if !self.stream.is_null() {
                    let _ = cu::stream_destroy(self.stream);
                }
            }
            let _ = cu::primary_ctx_release(self.dev);
        }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer<'g> {
    gpu: &'g Gpu,
    ptr: cu::CUdeviceptr,
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
    /// stream is not ordered after the DMA (see bench_gpu's `write`).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.range(offset, src.len())?;
        self.gpu.synchronize()?;
        guarded("cuMemcpyHtoD", || {
            // SAFETY: the range is inside the allocation (checked); `src` is readable.
            Ok(unsafe {
                cu::memcpy_htod(
                    self.ptr + offset as u64,
                    src.as_ptr() as *const c_void,
                    src.len(),
                )
            }?)
        })?;
        self.gpu.synchronize()
    }

    /// Copies from byte `offset` into `dst` (waits for the GPU's queued work first).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.range(offset, dst.len())?;
        self.gpu.synchronize()?;
        guarded("cuMemcpyDtoH", || {
            // SAFETY: the range is inside the allocation (checked); `dst` is writable.
            Ok(unsafe {
                cu::memcpy_dtoh(
                    dst.as_mut_ptr() as *mut c_void,
                    self.ptr + offset as u64,
                    dst.len(),
                )
            }?)
        })
    }

    /// Sets every byte to `v`.
    pub fn fill(&self, v: u8) -> Result<()> {
        self.gpu.synchronize()?;
        guarded("cuMemsetD8", || {
            // SAFETY: the whole allocation.
            Ok(unsafe { cu::memset_d8(self.ptr, v, self.bytes) }?)
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
            if cu::ctx_set_current(self.gpu.ctx).is_ok() {
                let _ = cu::ctx_synchronize();
                let _ = cu::mem_free(self.ptr);
            }
        }
    }
}

/// A loaded module.
#[derive(Debug)]
pub struct Module<'g> {
    gpu: &'g Gpu,
    module: cu::CUmodule,
}

impl Module<'_> {
    /// A kernel by its (extern "C") name.
    pub fn function(&self, name: &str) -> Result<cu::CUfunction> {
        let c = CString::new(name).map_err(|_| Error::invalid_argument("NUL in a kernel name"))?;
        guarded("cuModuleGetFunction", || {
            // SAFETY: the module is loaded.
            unsafe { cu::module_get_function(self.module, &c) }
                .map_err(|e| e.context(&format!("cuModuleGetFunction({name})")))
        })
    }
}

impl Drop for Module<'_> {
    fn drop(&mut self) {
        // SAFETY: loaded in this context, unloaded once; errors ignored in drop.
        unsafe {
            if cu::ctx_set_current(self.gpu.ctx).is_ok() {
                let _ = cu::ctx_synchronize();
                let _ = cu::module_unload(self.module);
            }
        }
    }
}

/// A CUDA event on a GPU's stream, for timing.
#[derive(Debug)]
pub struct Event<'g> {
    gpu: &'g Gpu,
    ev: cu::CUevent,
}

impl Event<'_> {
    /// Records the event on the GPU's stream.
    pub fn record(&self) -> Result<()> {
        guarded("cuEventRecord", || {
            // SAFETY: event and stream belong to the same context.
            Ok(unsafe { cu::event_record(self.ev, self.gpu.stream) }?)
        })
    }
    /// Milliseconds from `start` to `self`, waiting for `self` first.
    pub fn elapsed_ms_since(&self, start: &Event<'_>) -> Result<f32> {
        guarded("cuEventElapsedTime", || {
            // SAFETY: both events were recorded.
            unsafe {
                cu::event_synchronize(self.ev)?;
                Ok(cu::event_elapsed_ms(start.ev, self.ev)?)
            }
        })
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        unsafe {
            let _ = cu::event_destroy(self.ev);
        }
    }
}

/// Makes a context current for its lifetime; puts the previous one back.
pub(crate) struct CtxScope {
    saved: cu::CUcontext,
    /// Whether `enter` changed the current context (else drop has nothing
    /// to put back: one driver call less per launch, ~25 ns).
    changed: bool,
}

impl CtxScope {
    /// Makes `ctx` current (the driver must have been probed).
    pub(crate) fn enter(ctx: cu::CUcontext) -> Result<CtxScope> {
        guarded("cuCtxSetCurrent", || {
            let saved = cu::ctx_get_current()?;
            if saved != ctx {
                // SAFETY: the caller's context is retained.
                unsafe { cu::ctx_set_current(ctx) }?;
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
            let _ = cu::ctx_set_current(self.saved);
        }
    }
}
