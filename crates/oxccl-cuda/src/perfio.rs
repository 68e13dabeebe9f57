//! Device plumbing for `oxccl perf`'s CUDA backend: a GPU's primary context,
//! streams, device memory with synchronous host copies, timing events, stream
//! capture into CUDA graphs, and waits that give up at a deadline.
//!
//! The benchmark drives collectives through an NCCL-API library it loads
//! (oxccl's `libnccl.so` or NVIDIA's), so all it needs from CUDA is what
//! nccl-tests takes from the runtime: `cudaSetDevice`, `cudaStreamCreate`,
//! `cudaMalloc`, `cudaMemcpy`, events and graphs. Here they are the driver's
//! calls (`cudarc::driver::sys`), each behind [`crate::loader::driver`]'s
//! probe, a check of the extra symbols this module uses ([`require`]), and a
//! panic guard.
//!
//! No wait blocks without bound: [`PerfStream::wait`] and
//! [`PerfEvent::wait`] poll `cuStreamQuery`/`cuEventQuery` until a deadline
//! and report a timeout as `Ok(false)`, so a collective that never completes
//! (a peer that never came) turns into a message, not a hang.
//!
//! Objects hold the GPU (an `Rc` of its retained primary context), so a
//! buffer, stream, event or graph can outlive the handle it came from and
//! the context is released last. None is `Send`: one thread drives its GPUs.

use std::ffi::{c_char, c_void, CStr};
use std::rc::Rc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUresult};
use oxccl_core::{Error, ErrorKind, Result};

use crate::device::check;
use crate::loader::{self, guarded};

/// Driver functions used here beyond those the loader's probe checked.
const EXTRA_SYMBOLS: &[&str] = &[
    "cuStreamQuery",
    "cuEventQuery",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// The driver, probed, with every symbol this module calls present; else the
/// error to report ("no CUDA driver", "no GPU", or the missing symbols).
pub fn require() -> Result<&'static loader::DriverInfo> {
    static EXTRA: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let info = loader::driver()?;
    let extra = EXTRA.get_or_init(|| {
        let missing: Vec<&str> = std::panic::catch_unwind(|| {
            EXTRA_SYMBOLS
                .iter()
                .copied()
                .filter(|name| {
                    // SAFETY: the probe opened the driver library, so culib()
                    // finds it; looking a symbol up has no side effect.
                    unsafe { sys::culib().get::<*const c_void>(name.as_bytes()).is_err() }
                })
                .collect()
        })
        .unwrap_or_else(|_| EXTRA_SYMBOLS.to_vec());
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the CUDA driver library {} lacks {} (a CUDA 13.0 driver, 580 or newer, has them)",
                info.path,
                missing.join(", ")
            ))
        }
    });
    match extra {
        Ok(()) => Ok(info),
        Err(m) => Err(Error::new(ErrorKind::UnhandledCuda, m.clone())),
    }
}

/// Visible GPUs (an error where there is none).
pub fn device_count() -> Result<usize> {
    Ok(require()?.devices)
}

/// What nccl-tests prints about a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    /// `cuDeviceGetName`, e.g. "NVIDIA H200".
    pub name: String,
    /// PCI domain, bus and device as `0000:18:00`.
    pub pci: String,
    /// Device memory in bytes (`cuDeviceTotalMem`).
    pub memory: u64,
}

/// Name and PCI address of GPU `ordinal`.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    let info = require()?;
    if ordinal >= info.devices {
        return Err(Error::invalid_argument(format!(
            "GPU {ordinal} does not exist ({} visible)",
            info.devices
        )));
    }
    guarded("cuDeviceGetName", || {
        let mut dev: sys::CUdevice = 0;
        let mut buf = [0 as c_char; 256];
        // SAFETY: out-pointers are valid; the buffer holds 256 chars and the
        // driver NUL-terminates what it writes.
        unsafe {
            check(sys::cuDeviceGet(&mut dev, ordinal as i32), "cuDeviceGet")?;
            check(
                sys::cuDeviceGetName(buf.as_mut_ptr(), 256, dev),
                "cuDeviceGetName",
            )?;
        }
        // SAFETY: NUL-terminated by the driver (and the buffer was zeroed).
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
            let mut v = 0;
            // SAFETY: writes one int for a valid device.
            unsafe {
                check(
                    sys::cuDeviceGetAttribute(&mut v, a, dev),
                    "cuDeviceGetAttribute",
                )?
            };
            Ok(v)
        };
        use sys::CUdevice_attribute as A;
        let pci = format!(
            "{:04x}:{:02x}:{:02x}",
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
        );
        let mut memory = 0usize;
        // SAFETY: writes one size for a valid device.
        unsafe {
            check(
                sys::cuDeviceTotalMem_v2(&mut memory, dev),
                "cuDeviceTotalMem",
            )?
        };
        Ok(DeviceInfo {
            ordinal,
            name,
            pci,
            memory: memory as u64,
        })
    })
}

struct GpuInner {
    ordinal: usize,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

impl GpuInner {
    fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the life of `self`.
        unsafe { check(sys::cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent") }
    }
}

impl Drop for GpuInner {
    fn drop(&mut self) {
        // SAFETY: the primary context was retained once by `PerfGpu::open`
        // and is released once here; errors are ignored in drop.
        unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

/// One GPU's primary context, retained (what `cudaSetDevice` selects, so an
/// NCCL library that asks the runtime for the current device sees this one).
#[derive(Clone)]
pub struct PerfGpu(Rc<GpuInner>);

impl std::fmt::Debug for PerfGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PerfGpu({})", self.0.ordinal)
    }
}

impl PerfGpu {
    /// Retains GPU `ordinal`'s primary context and makes it current here.
    pub fn open(ordinal: usize) -> Result<PerfGpu> {
        let info = require()?;
        if ordinal >= info.devices {
            return Err(Error::invalid_argument(format!(
                "GPU {ordinal} does not exist ({} visible)",
                info.devices
            )));
        }
        guarded("cuDevicePrimaryCtxRetain", || {
            let mut dev: sys::CUdevice = 0;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: out-pointers are valid; the driver was initialised by the probe.
            unsafe {
                check(sys::cuDeviceGet(&mut dev, ordinal as i32), "cuDeviceGet")?;
                check(
                    sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                    "cuDevicePrimaryCtxRetain",
                )?;
            }
            let g = PerfGpu(Rc::new(GpuInner { ordinal, dev, ctx }));
            g.0.bind()?;
            Ok(g)
        })
    }

    pub fn ordinal(&self) -> usize {
        self.0.ordinal
    }

    /// Makes this GPU's context current on the calling thread (`cudaSetDevice`).
    pub fn make_current(&self) -> Result<()> {
        guarded("cuCtxSetCurrent", || self.0.bind())
    }

    /// A new non-blocking stream (`cudaStreamNonBlocking`: no implicit
    /// ordering with the legacy default stream).
    pub fn stream(&self) -> Result<PerfStream> {
        guarded("cuStreamCreate", || {
            self.0.bind()?;
            let mut s: sys::CUstream = std::ptr::null_mut();
            // SAFETY: the context is current; 1 = CU_STREAM_NON_BLOCKING.
            unsafe { check(sys::cuStreamCreate(&mut s, 1), "cuStreamCreate")? };
            Ok(PerfStream {
                gpu: self.0.clone(),
                raw: s,
            })
        })
    }

    /// `bytes` of device memory from `cuMemAlloc` (not zeroed).
    pub fn alloc(&self, bytes: usize) -> Result<PerfMem> {
        guarded("cuMemAlloc", || {
            self.0.bind()?;
            let mut p: sys::CUdeviceptr = 0;
            // SAFETY: writes one pointer; a zero-byte request is rounded up to 1.
            let r = unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1)) };
            if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                return Err(Error::new(
                    ErrorKind::UnhandledCuda,
                    format!(
                        "cuMemAlloc of {bytes} bytes on GPU {} failed: out of device memory (lower -e/--maxbytes or -m/--agg_iters)",
                        self.0.ordinal
                    ),
                ));
            }
            check(r, "cuMemAlloc")?;
            Ok(PerfMem {
                gpu: self.0.clone(),
                ptr: p,
                bytes,
            })
        })
    }

    /// A timing event.
    pub fn event(&self) -> Result<PerfEvent> {
        guarded("cuEventCreate", || {
            self.0.bind()?;
            let mut e: sys::CUevent = std::ptr::null_mut();
            // SAFETY: writes one handle; flags 0 = default (timing enabled).
            unsafe { check(sys::cuEventCreate(&mut e, 0), "cuEventCreate")? };
            Ok(PerfEvent {
                gpu: self.0.clone(),
                raw: e,
            })
        })
    }
}

/// Polls `query` (a `cuStreamQuery`/`cuEventQuery`) until it is not
/// `CUDA_ERROR_NOT_READY` or `deadline` passes: `Ok(true)` done, `Ok(false)`
/// timed out. Sleeps grow from 0 to 1 ms so short waits stay short.
fn poll(what: &str, deadline: Instant, mut query: impl FnMut() -> CUresult) -> Result<bool> {
    let mut nap = Duration::ZERO;
    loop {
        let r = guarded(what, || Ok(query()))?;
        if r != CUresult::CUDA_ERROR_NOT_READY {
            guarded(what, || check(r, what))?;
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        if nap.is_zero() {
            std::thread::yield_now();
            nap = Duration::from_micros(10);
        } else {
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }
}

/// A stream of one GPU.
pub struct PerfStream {
    gpu: Rc<GpuInner>,
    raw: sys::CUstream,
}

impl PerfStream {
    /// The handle, as the `cudaStream_t` an NCCL call takes.
    pub fn raw(&self) -> *mut c_void {
        self.raw as *mut c_void
    }

    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.gpu.ordinal
    }

    /// Waits until everything queued so far has run: `Ok(false)` if it had
    /// not by `deadline`.
    pub fn wait(&self, deadline: Instant) -> Result<bool> {
        let s = self.raw;
        // SAFETY: the stream is live until drop.
        poll("cuStreamQuery", deadline, || unsafe {
            sys::cuStreamQuery(s)
        })
    }

    /// Starts capturing the work queued on this stream into a graph
    /// (thread-local mode: only this thread's unsafe calls are refused while
    /// capturing, so other ranks' threads are unaffected).
    pub fn begin_capture(&self) -> Result<()> {
        guarded("cuStreamBeginCapture", || {
            self.gpu.bind()?;
            // SAFETY: the stream is live; the mode is a valid enum value.
            unsafe {
                check(
                    sys::cuStreamBeginCapture_v2(
                        self.raw,
                        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                    ),
                    "cuStreamBeginCapture",
                )
            }
        })
    }

    /// Ends the capture begun by [`begin_capture`](Self::begin_capture);
    /// the graph is instantiated by [`PerfGraph::instantiate`], once every
    /// stream of this thread has ended its capture (instantiating is refused
    /// while a thread-local capture is still open: with two GPUs driven by
    /// one thread, instantiating the first graph before the second capture
    /// ended failed with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, for NCCL's
    /// library as for oxccl's). Always ends the capture, so the stream is
    /// usable again even when the capture failed.
    pub fn end_capture(&self) -> Result<PerfGraph> {
        guarded("cuStreamEndCapture", || {
            self.gpu.bind()?;
            let mut g: sys::CUgraph = std::ptr::null_mut();
            // SAFETY: the stream is live and capturing; writes one handle.
            let r = unsafe { sys::cuStreamEndCapture(self.raw, &mut g) };
            if let Err(e) = check(
                r,
                "cuStreamEndCapture (the library's calls could not be captured)",
            ) {
                if !g.is_null() {
                    // SAFETY: a graph handed back with an error is still ours to destroy.
                    unsafe { sys::cuGraphDestroy(g) };
                }
                return Err(e);
            }
            Ok(PerfGraph {
                gpu: self.gpu.clone(),
                graph: g,
                exec: std::ptr::null_mut(),
            })
        })
    }
}

impl Drop for PerfStream {
    fn drop(&mut self) {
        // SAFETY: created once by cuStreamCreate, destroyed once; the driver
        // lets queued work finish first. Errors are ignored in drop.
        unsafe {
            if sys::cuCtxSetCurrent(self.gpu.ctx) == CUresult::CUDA_SUCCESS {
                sys::cuStreamDestroy_v2(self.raw);
            }
        }
    }
}

/// An instantiated graph of captured work.
pub struct PerfGraph {
    gpu: Rc<GpuInner>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl PerfGraph {
    /// Makes the captured graph launchable (once; after every capture of
    /// this thread has ended).
    pub fn instantiate(&mut self) -> Result<()> {
        if !self.exec.is_null() {
            return Ok(());
        }
        guarded("cuGraphInstantiate", || {
            self.gpu.bind()?;
            let mut exec: sys::CUgraphExec = std::ptr::null_mut();
            // SAFETY: `graph` is a complete graph from a capture; writes one handle.
            let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, self.graph, 0) };
            check(r, "cuGraphInstantiate")?;
            self.exec = exec;
            Ok(())
        })
    }

    /// Queues one replay on `stream` (returns at once).
    pub fn launch(&self, stream: &PerfStream) -> Result<()> {
        if self.exec.is_null() {
            return Err(Error::invalid_usage("graph launched before instantiate"));
        }
        guarded("cuGraphLaunch", || {
            self.gpu.bind()?;
            // SAFETY: the executable graph and the stream are live and belong
            // to the same context.
            unsafe { check(sys::cuGraphLaunch(self.exec, stream.raw), "cuGraphLaunch") }
        })
    }
}

impl Drop for PerfGraph {
    fn drop(&mut self) {
        // SAFETY: both handles were made once by end_capture and are
        // destroyed once; errors are ignored in drop.
        unsafe {
            if sys::cuCtxSetCurrent(self.gpu.ctx) == CUresult::CUDA_SUCCESS {
                if !self.exec.is_null() {
                    sys::cuGraphExecDestroy(self.exec);
                }
                sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
pub struct PerfMem {
    gpu: Rc<GpuInner>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl PerfMem {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
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

    /// Copies `src` to byte `offset`, landed when it returns. Work still
    /// queued on a non-blocking stream is not waited for: wait for the
    /// stream first.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.range(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        guarded("cuMemcpyHtoD", || {
            self.gpu.bind()?;
            // SAFETY: the range is inside the allocation (checked); `src` is
            // readable. Why the synchronize: from pageable memory
            // cuMemcpyHtoD returns once the bytes are staged, before the DMA
            // lands (CUDA's "API synchronization behavior"), and a kernel on
            // a non-blocking stream is not ordered after it: a 1 MiB in-place
            // all-reduce check read the timed loop's results once in four
            // (2xH200, 2026-12-01).
            unsafe {
                check(
                    sys::cuMemcpyHtoD_v2(
                        self.ptr + offset as u64,
                        src.as_ptr() as *const c_void,
                        src.len(),
                    ),
                    "cuMemcpyHtoD",
                )?;
                check(sys::cuCtxSynchronize(), "cuCtxSynchronize")
            }
        })
    }

    /// Copies from byte `offset` into `dst` (synchronous, as [`write`](Self::write)).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.range(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        guarded("cuMemcpyDtoH", || {
            self.gpu.bind()?;
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
}

impl Drop for PerfMem {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in this context, freed once; errors
        // are ignored in drop.
        unsafe {
            if sys::cuCtxSetCurrent(self.gpu.ctx) == CUresult::CUDA_SUCCESS {
                sys::cuMemFree_v2(self.ptr);
            }
        }
    }
}

/// A timing event.
pub struct PerfEvent {
    gpu: Rc<GpuInner>,
    raw: sys::CUevent,
}

impl PerfEvent {
    /// Records the event on `stream` (a stream of the same GPU).
    pub fn record(&self, stream: &PerfStream) -> Result<()> {
        if self.gpu.ordinal != stream.gpu.ordinal {
            return Err(Error::invalid_argument(format!(
                "an event of GPU {} recorded on a stream of GPU {}",
                self.gpu.ordinal, stream.gpu.ordinal
            )));
        }
        guarded("cuEventRecord", || {
            self.gpu.bind()?;
            // SAFETY: the event and the stream are live, of the same device.
            unsafe { check(sys::cuEventRecord(self.raw, stream.raw), "cuEventRecord") }
        })
    }

    /// Waits until the event has happened: `Ok(false)` if not by `deadline`.
    pub fn wait(&self, deadline: Instant) -> Result<bool> {
        let e = self.raw;
        // SAFETY: the event is live until drop.
        poll("cuEventQuery", deadline, || unsafe { sys::cuEventQuery(e) })
    }

    /// Milliseconds from `start` to `self`; both must have happened (see
    /// [`wait`](Self::wait)).
    pub fn elapsed_ms_since(&self, start: &PerfEvent) -> Result<f32> {
        guarded("cuEventElapsedTime", || {
            let mut ms = 0f32;
            // SAFETY: both events are live and recorded; writes one float.
            unsafe {
                check(
                    sys::cuEventElapsedTime_v2(&mut ms, start.raw, self.raw),
                    "cuEventElapsedTime",
                )?
            };
            Ok(ms)
        })
    }
}

impl Drop for PerfEvent {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once; errors are ignored in drop.
        unsafe {
            sys::cuEventDestroy_v2(self.raw);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a GPU every call is an error; with one, the count agrees
    /// with the driver's probe.
    #[test]
    fn without_a_gpu_everything_is_an_error_not_a_panic() {
        match loader::probe_driver() {
            Ok(info) => assert_eq!(device_count().unwrap(), info.devices),
            Err(_) => {
                assert!(require().is_err());
                assert!(device_count().is_err());
                assert!(device_info(0).is_err());
                assert!(PerfGpu::open(0).is_err());
            }
        }
    }
}
