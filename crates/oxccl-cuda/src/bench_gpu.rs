//! Device plumbing for `oxccl perf`'s CUDA backend: a GPU's primary context,
//! streams, device memory with synchronous host copies, timing events, stream
//! capture into CUDA graphs, and waits that give up at a deadline.
//!
//! The benchmark drives collectives through an NCCL-API library it loads
//! (oxccl's `libnccl.so` or NVIDIA's), so all it needs from CUDA is what
//! nccl-tests takes from the runtime: `cudaSetDevice`, `cudaStreamCreate`,
//! `cudaMalloc`, `cudaMemcpy`, events and graphs. Here they are the driver's
//! calls (`crate::driver`), each behind [`crate::loader::driver`]'s
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

use std::ffi::c_void;
use std::rc::Rc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use oxccl_core::{Error, ErrorKind, Result};

use crate::driver::{self as cu, CUdevice_attribute, CUresult, DriverResult};
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
                    // SAFETY: the probe opened the driver library.
                    unsafe { !cu::has_symbol(name) }
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
        let dev = cu::device_get(ordinal as i32)?;
        let name = cu::device_name(dev)?;
        let attr = |a: CUdevice_attribute| cu::device_attribute(dev, a);
        use CUdevice_attribute as A;
        let pci = format!(
            "{:04x}:{:02x}:{:02x}",
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
        );
        let memory = cu::device_total_mem(dev)?;
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
    dev: cu::CUdevice,
    ctx: cu::CUcontext,
}

impl GpuInner {
    fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the life of `self`.
        Ok(unsafe { cu::ctx_set_current(self.ctx) }?)
    }
}

impl Drop for GpuInner {
    fn drop(&mut self) {
        // SAFETY: the primary context was retained once by `PerfGpu::open`
        // and is released once here; errors are ignored in drop.
        unsafe {
            let _ = cu::primary_ctx_release(self.dev);
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
        info.check_ordinal(ordinal)?;
        guarded("cuDevicePrimaryCtxRetain", || {
            // The driver was initialised by the probe.
            let dev = cu::device_get(ordinal as i32)?;
            let ctx = cu::primary_ctx_retain(dev)?;
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
            // The context is current; 1 = CU_STREAM_NON_BLOCKING.
            let s = cu::stream_create(1)?;
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
            // A zero-byte request is rounded up to 1.
            let r = cu::mem_alloc(bytes.max(1));
            if r.is_err_and(|e| e.code == CUresult::CUDA_ERROR_OUT_OF_MEMORY) {
                return Err(Error::new(
                    ErrorKind::UnhandledCuda,
                    format!(
                        "cuMemAlloc of {bytes} bytes on GPU {} failed: out of device memory (lower -e/--maxbytes or -m/--agg_iters)",
                        self.0.ordinal
                    ),
                ));
            }
            let p = r?;
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
            // Flags 0 = default (timing enabled).
            let e = cu::event_create(0)?;
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
fn poll(
    what: &str,
    deadline: Instant,
    mut query: impl FnMut() -> DriverResult<()>,
) -> Result<bool> {
    let mut nap = Duration::ZERO;
    loop {
        let r = guarded(what, || Ok(query()))?;
        if !r.is_err_and(|e| e.code == CUresult::CUDA_ERROR_NOT_READY) {
            r.map_err(|e| e.context(what))?;
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
    raw: cu::CUstream,
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
        poll("cuStreamQuery", deadline, || unsafe { cu::stream_query(s) })
    }

    /// Starts capturing the work queued on this stream into a graph
    /// (thread-local mode: only this thread's unsafe calls are refused while
    /// capturing, so other ranks' threads are unaffected).
    pub fn begin_capture(&self) -> Result<()> {
        guarded("cuStreamBeginCapture", || {
            self.gpu.bind()?;
            // SAFETY: the stream is live; the mode is a valid enum value.
            Ok(unsafe {
                cu::stream_begin_capture(
                    self.raw,
                    cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            }?)
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
            // SAFETY: the stream is live and capturing.
            let g = match unsafe { cu::stream_end_capture(self.raw) } {
                Ok(g) => g,
                Err((e, g)) => {
                    if !g.is_null() {
                        // SAFETY: a graph handed back with an error is still ours to destroy.
                        let _ = unsafe { cu::graph_destroy(g) };
                    }
                    return Err(e.context(
                        "cuStreamEndCapture (the library's calls could not be captured)",
                    ));
                }
            };
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
            if cu::ctx_set_current(self.gpu.ctx).is_ok() {
                let _ = cu::stream_destroy(self.raw);
            }
        }
    }
}

/// An instantiated graph of captured work.
pub struct PerfGraph {
    gpu: Rc<GpuInner>,
    graph: cu::CUgraph,
    exec: cu::CUgraphExec,
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
            // SAFETY: `graph` is a complete graph from a capture.
            self.exec = unsafe { cu::graph_instantiate(self.graph) }?;
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
            Ok(unsafe { cu::graph_launch(self.exec, stream.raw) }?)
        })
    }
}

impl Drop for PerfGraph {
    fn drop(&mut self) {
        // SAFETY: both handles were made once by end_capture and are
        // destroyed once; errors are ignored in drop.
        unsafe {
            if cu::ctx_set_current(self.gpu.ctx).is_ok() {
                if !self.exec.is_null() {
                    let _ = cu::graph_exec_destroy(self.exec);
                }
                let _ = cu::graph_destroy(self.graph);
            }
        }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
pub struct PerfMem {
    gpu: Rc<GpuInner>,
    ptr: cu::CUdeviceptr,
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
                cu::memcpy_htod(
                    self.ptr + offset as u64,
                    src.as_ptr() as *const c_void,
                    src.len(),
                )
            }?;
            Ok(cu::ctx_synchronize()?)
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
            Ok(unsafe {
                cu::memcpy_dtoh(
                    dst.as_mut_ptr() as *mut c_void,
                    self.ptr + offset as u64,
                    dst.len(),
                )
            }?)
        })
    }
}

impl Drop for PerfMem {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in this context, freed once; errors
        // are ignored in drop.
        unsafe {
            if cu::ctx_set_current(self.gpu.ctx).is_ok() {
                let _ = cu::mem_free(self.ptr);
            }
        }
    }
}

/// A timing event.
pub struct PerfEvent {
    gpu: Rc<GpuInner>,
    raw: cu::CUevent,
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
            Ok(unsafe { cu::event_record(self.raw, stream.raw) }?)
        })
    }

    /// Waits until the event has happened: `Ok(false)` if not by `deadline`.
    pub fn wait(&self, deadline: Instant) -> Result<bool> {
        let e = self.raw;
        // SAFETY: the event is live until drop.
        poll("cuEventQuery", deadline, || unsafe { cu::event_query(e) })
    }

    /// Milliseconds from `start` to `self`; both must have happened (see
    /// [`wait`](Self::wait)).
    pub fn elapsed_ms_since(&self, start: &PerfEvent) -> Result<f32> {
        guarded("cuEventElapsedTime", || {
            // SAFETY: both events are live and recorded.
            Ok(unsafe { cu::event_elapsed_ms(start.raw, self.raw) }?)
        })
    }
}

impl Drop for PerfEvent {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once; errors are ignored in drop.
        unsafe {
            let _ = cu::event_destroy(self.raw);
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
