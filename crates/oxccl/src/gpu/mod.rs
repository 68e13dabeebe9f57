//! Collectives on device memory: the communicator's GPU state, its setup,
//! the routing of buffers between the host backend and the CUDA executor,
//! and the typed API over cudarc's buffers and streams.
//!
//! Every rank of a communicator made with [`GpuChoice::Device`] or
//! [`GpuChoice::NoDevice`] takes part in the GPU setup (one bootstrap
//! all-gather; a second and the ring's setup when every rank has a GPU);
//! the C ABI makes every communicator that way. An
//! operation on device buffers is checked here (buffers on this rank's GPU,
//! counts inside their allocations), prepared by `oxccl-cuda` into a launch
//! and queued on the caller's stream; all-to-all, gather and scatter become
//! lists of sends and receives.

use crate::{Communicator, Error, ErrorKind, Inner, RedOp, Result};
use oxccl_core::gpu::rooted::RootedCall;
use oxccl_core::{params, CollKind, Scalar};
use oxccl_cuda::exec::{self as cuda, DevComm, Memory};
use oxccl_cuda::ring as cuda_ring;
use oxccl_env::Subsys;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub mod raw;
mod stream;
pub mod tools;

/// The cudarc this crate's device API takes (its version and features), for
/// programs that want the very same types.
pub use cudarc;
pub use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice,
};
use raw::{read_scalar, DeviceBuffers, DeviceLaunch, DeviceOp, DeviceRedOp};
pub use stream::{GpuGroup, StreamComm};

/// Whether and how a rank takes part in the GPU setup at creation
/// ([`crate::Config::gpu`]). Every rank of a communicator passes `Off`, or
/// every rank passes `Device` or `NoDevice`: the setup is collective (one
/// bootstrap all-gather, two when every rank has a GPU), and a rank that
/// skips it leaves the others waiting for it until the init timeout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GpuChoice {
    /// No GPU setup: host buffers only (the Rust API's default; no
    /// bootstrap round spent on it).
    #[default]
    Off,
    /// This rank's GPU (a CUDA device ordinal): collectives on device
    /// buffers of that GPU run there.
    Device(i32),
    /// This rank has no GPU but takes part in the setup, for communicators
    /// whose other ranks may have one (what the C ABI does for a thread
    /// without a current CUDA context).
    NoDevice,
}

/// A rank's GPU state: `None` when it has none (no setup, or no device);
/// `Some(Err)` when setting it up failed (reported by the first operation
/// on device buffers).
pub(crate) type GpuSlot = Mutex<Option<Result<Arc<DevComm>>>>;

fn lock(s: &GpuSlot) -> std::sync::MutexGuard<'_, Option<Result<Arc<DevComm>>>> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a CUDA driver with a GPU is usable in this process.
pub fn available() -> bool {
    cuda::available()
}

/// The device (ordinal) of the calling thread's current CUDA context;
/// `None` without a driver or a current context.
pub fn current_device() -> Option<i32> {
    cuda::current_device()
}

/// The GPU ring path's settings from the parameters and the communicator's timeout.
fn ring_config(
    comm: &Communicator,
    nranks: usize,
    timeout: Option<Duration>,
) -> cuda_ring::RingConfig {
    // NCCL_ALGO / NCCL_PROTO as the host path parsed them: one parse, one
    // meaning for both paths.
    let host = comm.inner.config.host_settings();
    cuda_ring::RingConfig::from_selections(
        oxccl_env::params(),
        &host.algos,
        &host.protos,
        nranks,
        timeout,
    )
}

/// Sets up a rank's GPU state, right after its host communicator. Collective:
/// every rank of a new communicator calls it (unless all chose
/// [`GpuChoice::Off`]), with its device or none, so the bootstrap exchanges
/// stay in step. Round 1 agrees on a clique key (rank 0's process nonce and
/// counter: the same on every rank, new for every communicator) and whether
/// every rank has a GPU; then the rank's [`DevComm`]; then, when every rank
/// has one, the ring path ([`DevComm::setup_ring`]). A failure WARNs: the
/// communicator still works on host buffers, and device buffers get the error.
pub(crate) fn setup(comm: &Communicator, choice: GpuChoice, timeout: Option<Duration>) {
    let ordinal = match choice {
        GpuChoice::Off => return,
        GpuChoice::Device(o) => Some(o),
        GpuChoice::NoDevice => None,
    };
    let (rank, nranks) = (comm.rank(), comm.size());
    let slot = &comm.inner.gpu;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut mine = vec![ordinal.is_some() as u8];
    mine.extend_from_slice(&std::process::id().to_le_bytes());
    mine.extend_from_slice(
        &NEXT
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_le_bytes(),
    );
    let all = if nranks > 1 {
        match comm.exchange(&mine) {
            Ok(a) => a,
            Err(e) => {
                oxccl_env::warn!(
                    "rank {rank}/{nranks}: GPU setup exchange failed, device buffers will be refused on this communicator: {}",
                    e.message()
                );
                if ordinal.is_some() {
                    *lock(slot) = Some(Err(e));
                }
                return;
            }
        }
    } else {
        vec![mine]
    };
    let Some(ordinal) = ordinal else {
        return;
    };
    let mut key = b"oxccl-gpu:".to_vec();
    key.extend_from_slice(all[0].get(1..).unwrap_or_default());
    let every_gpu = all.iter().all(|b| b.first() == Some(&1));
    let r = DevComm::new(ordinal, &key, rank, nranks);
    if nranks > 1 && every_gpu {
        // Round 2 (inside setup_ring's agreement): the ring, when every rank
        // made its DevComm; a rank whose DevComm failed still takes part.
        let ok = r.is_ok() as u8;
        match comm.exchange(&[ok]) {
            Ok(v) if v.iter().all(|b| b.first() == Some(&1)) => {
                if let Ok(dev) = &r {
                    let cfg = ring_config(comm, nranks, timeout);
                    let net = comm.net_plugin();
                    let boot = cuda_ring::RingBoot {
                        exchange: &|b| comm.exchange(b),
                        same_host: (0..nranks).map(|r| comm.is_same_host(r)).collect(),
                        stream: &|p, s| comm.peer_stream(p, TAG_GPU_NET + s),
                        net: net.clone(),
                    };
                    match dev.setup_ring(&cfg, &boot) {
                        Ok(()) => {
                            if let Some(t) = comm.tuner() {
                                dev.set_tuner(t);
                            }
                            log_ring(dev, rank, nranks, net.as_ref());
                            watch_peers(
                                Arc::downgrade(&comm.inner),
                                Arc::downgrade(dev),
                                rank,
                                nranks,
                            );
                        }
                        Err(e) => oxccl_env::warn!(
                            "rank {rank}/{nranks}: GPU {ordinal}: the ring path could not be set up ({}); device buffers need it for this communicator",
                            e.message()
                        ),
                    }
                }
            }
            Ok(_) => {}
            Err(e) => oxccl_env::warn!(
                "rank {rank}/{nranks}: GPU setup exchange failed: {}",
                e.message()
            ),
        }
    }
    match &r {
        Ok(_) => oxccl_env::info!(
            Subsys::INIT,
            "rank {rank}/{nranks}: GPU {ordinal} ready (collectives on device buffers run on the GPU)"
        ),
        Err(e) => oxccl_env::warn!(
            "rank {rank}/{nranks}: GPU {ordinal} setup failed, device buffers will be refused on this communicator: {}",
            e.message()
        ),
    }
    *lock(slot) = Some(r);
}

/// The bootstrap tag of the GPU network path's connections ("GPN"), plus
/// the connection's index (0..16) so both ends pair them alike.
const TAG_GPU_NET: u32 = 0x4750_4e00;

/// How often the GPU watchdog looks at the peers' control connections.
const WATCH_PERIOD: Duration = Duration::from_millis(50);

/// Watches the peers of a rank with a GPU ring: GPU kernels waiting for a
/// peer see nothing of its death (the data never comes), so a thread looks
/// at the host transports' control connections every 50 ms and, when a
/// peer is gone, stops this rank's kernels with that peer's error (they
/// report it through [`Communicator::gpu_error`] within about 50 ms instead
/// of at the timeout). Ends when the rank is destroyed, aborted or dropped
/// (it holds neither alive).
fn watch_peers(comm: Weak<Inner>, dev: Weak<DevComm>, rank: usize, nranks: usize) {
    let r = std::thread::Builder::new()
        .name("oxccl-gpu-watch".into())
        .spawn(move || loop {
            std::thread::sleep(WATCH_PERIOD);
            let (Some(d), Some(inner)) = (dev.upgrade(), comm.upgrade()) else {
                return;
            };
            match (Communicator { inner }).check_peers() {
                Err(_) => return,
                Ok(None) => {}
                Ok(Some(e)) => {
                    oxccl_env::warn!(
                        "rank {rank}/{nranks}: {}; stopping this rank's GPU operations",
                        e.message()
                    );
                    d.fail_peer(Error::new(
                        ErrorKind::Remote,
                        format!("GPU operations stopped: {}", e.message()),
                    ));
                    return;
                }
            }
        });
    if let Err(e) = r {
        oxccl_env::warn!("rank {rank}/{nranks}: no GPU watchdog thread ({e}): a dead peer is seen only at the timeout");
    }
}

/// NCCL-style INFO lines for the ring: the channels and each link's transport.
fn log_ring(
    dev: &DevComm,
    rank: usize,
    nranks: usize,
    net: Option<&(Arc<dyn oxccl_net::Net>, usize)>,
) {
    let Some((kind, nch, bytes, ring)) = dev.ring_info() else {
        return;
    };
    let order: String = ring.iter().map(|r| format!(" {r:>3}")).collect();
    let pos = ring.iter().position(|&r| r == rank).unwrap_or(rank);
    let next = ring.get((pos + 1) % nranks.max(1)).copied().unwrap_or(rank);
    // A peer on another host is the network path's, named as NCCL names
    // its network transports (the plugin's network and device, else its
    // sockets), whatever the window kind; "/GDRDMA" where the plugin reads
    // the sends from GPU memory (GPUDirect RDMA), as NCCL marks it.
    let via = if dev.same_host(next) {
        kind.transport(dev.same_process(next)).to_string()
    } else {
        match net {
            Some((n, d)) => format!(
                "NET/{}/{d}{}",
                n.name(),
                if dev.gpu_direct().0 { "/GDRDMA" } else { "" }
            ),
            None => "NET/Socket/0".to_string(),
        }
    };
    for ch in 0..nch {
        oxccl_env::info!(Subsys::INIT, "Channel {ch:02}/{nch:02} :{order}");
    }
    for ch in 0..nch {
        oxccl_env::info!(
            Subsys::INIT,
            "Channel {ch:02}/0 : {rank}[{}] -> {next}[{next}] via {via}",
            dev.ordinal()
        );
    }
    oxccl_env::info!(
        Subsys::INIT,
        "rank {rank}/{nranks}: GPU ring: {nch} channels, {:.1} MiB of connection buffers ({})",
        bytes as f64 / (1 << 20) as f64,
        match kind {
            cuda_ring::WindowKind::Device => "device memory",
            cuda_ring::WindowKind::Host => "pinned host memory",
        }
    );
}

impl Communicator {
    /// The GPU state, or why an operation on GPU `ordinal` cannot have it.
    fn dev_comm(&self, kind: CollKind, ordinal: i32) -> Result<Arc<DevComm>> {
        self.check_not_stopped()?;
        let name = kind.nccl_name();
        let dev = match lock(&self.inner.gpu).clone() {
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                return Err(Error::new(
                    e.kind(),
                    format!(
                        "{name} on device buffers: this communicator's GPU setup failed when it was created: {}",
                        e.message()
                    ),
                ))
            }
            None if self.lock_raw()?.is_none() => {
                return Err(Error::invalid_usage(format!(
                    "rank {}: the communicator was destroyed or aborted",
                    self.rank()
                )))
            }
            None => {
                return Err(Error::invalid_usage(format!(
                    "{name} on device buffers (GPU {ordinal}): this communicator has no GPU state; it was created without a GPU (Config::gpu; through the C ABI: without a current CUDA context, call cudaSetDevice before ncclCommInitRank*), or split or shrunk from such a communicator"
                )))
            }
        };
        if dev.ordinal() != ordinal {
            return Err(Error::invalid_argument(format!(
                "the buffers are on GPU {ordinal} but the communicator's device is GPU {}",
                dev.ordinal()
            )));
        }
        Ok(dev)
    }

    /// Checks an operation on device buffers (found by [`raw::locate_buffers`])
    /// and prepares its launch: the counts against the buffers'
    /// allocations, the root or peer, the reduction's scalar; all-to-all,
    /// gather and scatter become lists of sends and receives.
    ///
    /// # Safety
    /// `op`'s addresses are `bufs`' buffers, valid on the GPU until the
    /// operation has run on its stream; a `PreMulSumAt` scalar in host
    /// memory is readable now; `op.stream` is a stream of the buffers'
    /// context (or 0, the legacy default stream).
    pub unsafe fn prepare_device(
        &self,
        op: &DeviceOp,
        bufs: &DeviceBuffers,
    ) -> Result<DeviceLaunch> {
        let dev = self.dev_comm(op.kind, bufs.ordinal)?;
        // SAFETY: forwarded from this function's contract.
        let launch = unsafe { prepare(&dev, op, bufs.extents) }?;
        let rooted = (RootedCall::is_rooted(op.kind)
            && self.size() > 1
            && oxccl_env::params().get(&params::CHECK_ROOTS))
        .then(|| {
            let call = RootedCall {
                kind: op.kind,
                dtype: op.dtype,
                root: op.root,
                count: op.count,
            };
            (self.clone(), call)
        });
        // With no profiler plugin, the usual case: this one branch.
        let profile = self.inner.profiled.then(|| {
            let p = launch.profile();
            Box::new(raw::Profiled {
                comm: self.clone(),
                graph_captured: p.graph_captured,
                op: oxccl_net::profiler_group::OpEvent {
                    kind: op.kind,
                    send: op.send as *const c_void,
                    recv: op.recv as *mut c_void,
                    count: op.count,
                    dtype: op.dtype,
                    root: op.root,
                    algo: p.algo,
                    proto: p.proto,
                    n_channels: p.blocks as usize,
                    n_warps: p.warps as usize,
                    stream: op.stream as *mut c_void,
                },
            })
        });
        Ok(DeviceLaunch {
            launch,
            rooted,
            profile,
        })
    }

    /// This rank's GPU (the device ordinal its GPU state was set up on);
    /// `None` without one, or when its setup failed.
    pub fn device(&self) -> Option<i32> {
        match &*lock(&self.inner.gpu) {
            Some(Ok(d)) => Some(d.ordinal()),
            _ => None,
        }
    }

    /// The error an operation on device buffers ended with on the GPU (a
    /// peer that never came or died, a timeout, an abort); device
    /// operations are asynchronous, so their failures surface here rather
    /// than from the call that queued them.
    pub fn gpu_error(&self) -> Option<Error> {
        match &*lock(&self.inner.gpu) {
            Some(Ok(d)) => d.async_error(),
            _ => None,
        }
    }

    /// The GPU choice a child (split, shrink, grow) inherits: this rank's
    /// GPU when it has one, a setup without a device when it took part in
    /// the setup without one (or its setup failed), none when it skipped it.
    pub(crate) fn child_gpu(&self) -> GpuChoice {
        match (&*lock(&self.inner.gpu), self.inner.config.gpu) {
            (_, GpuChoice::Off) => GpuChoice::Off,
            (Some(Ok(d)), _) => GpuChoice::Device(d.ordinal()),
            _ => GpuChoice::NoDevice,
        }
    }

    /// Stops this rank's GPU operations: ring kernels leave their waits on
    /// the abort word within about a millisecond.
    pub(crate) fn stop_gpu(&self) {
        if let Some(Ok(d)) = &*lock(&self.inner.gpu) {
            d.abort();
        }
    }

    /// Abort: stops the GPU operations and lets go of the GPU state without
    /// freeing it: a one-shot kernel of this rank may wait on the GPU for a
    /// peer that will never come, and freeing synchronises the context.
    pub(crate) fn abandon_gpu(&self) {
        if let Some(g) = lock(&self.inner.gpu).take() {
            if let Ok(d) = &g {
                d.abort();
            }
            std::mem::forget(g);
        }
    }

    /// Destroy: frees the GPU state (flags, clique membership, context reference).
    pub(crate) fn free_gpu(&self) {
        let g = lock(&self.inner.gpu).take();
        drop(g);
    }

    /// This rank's collectives on device buffers, queued on `stream`.
    pub fn on_stream<'a>(&'a self, stream: &'a CudaStream) -> StreamComm<'a> {
        StreamComm { comm: self, stream }
    }
}

/// Why `root` (the peer of a send or receive) is not a rank of a
/// communicator of `nranks`; `None` when it is.
pub(crate) fn bad_root(kind: CollKind, root: usize, nranks: usize) -> Option<String> {
    if root < nranks {
        return None;
    }
    let what = if matches!(kind, CollKind::Send | CollKind::Recv) {
        "peer"
    } else {
        "root"
    };
    Some(format!(
        "invalid {what} {root} (valid: 0..{} for a communicator of {nranks} ranks)",
        nranks.saturating_sub(1)
    ))
}

/// The lengths a collective's buffers must have on this rank, in units of
/// `count` (elements or bytes): (send, recv) for `count` per rank on
/// `nranks` ranks, this rank the root or not (NCCL's extents).
pub(crate) fn lengths(
    kind: CollKind,
    count: usize,
    nranks: usize,
    is_root: bool,
) -> (usize, usize) {
    let all = count.saturating_mul(nranks);
    match kind {
        CollKind::AllReduce => (count, count),
        CollKind::ReduceScatter => (all, count),
        CollKind::AllGather => (count, all),
        CollKind::Broadcast => (if is_root { count } else { 0 }, count),
        CollKind::Reduce => (count, if is_root { count } else { 0 }),
        CollKind::AllToAll => (all, all),
        CollKind::Gather => (count, if is_root { all } else { 0 }),
        CollKind::Scatter => (if is_root { all } else { 0 }, count),
        CollKind::Send => (count, 0),
        CollKind::Recv => (0, count),
    }
}

/// Checks an operation on device buffers and prepares its launch.
///
/// # Safety
/// As [`Communicator::prepare_device`].
unsafe fn prepare(
    dev: &Arc<DevComm>,
    o: &DeviceOp,
    ext: [cuda::Extent; 2],
) -> Result<cuda::Launch> {
    let (kind, count, t, root) = (o.kind, o.count, o.dtype, o.root);
    // A PreMulSum scalar in device memory is read by the kernel; one in host
    // memory (ncclScalarDevice with a host pointer) is read now.
    let (op, scalar_ptr) = match o.op {
        DeviceRedOp::Op(op) => (op, None),
        DeviceRedOp::PreMulSumAt(a, st) => match cuda::memory_of(a as *const c_void)? {
            Memory::Device(_) => (RedOp::PreMulSum(Scalar::F64(0.0)), Some(a as u64)),
            // SAFETY: the caller keeps a host scalar readable (this function's contract).
            Memory::Host => (RedOp::PreMulSum(unsafe { read_scalar(a, st) }), None),
        },
    };
    let bytes = count
        .checked_mul(t.size())
        .ok_or_else(|| Error::invalid_argument(format!("count {count} is too large")))?;
    let (s, r, st) = (o.send, o.recv, o.stream);
    let (rank, nranks) = (dev.rank(), dev.nranks());
    if let Some(why) = bad_root(kind, root, nranks) {
        return Err(Error::invalid_argument(why));
    }
    // The bytes each buffer must hold on this rank (NCCL's extents).
    let (sx, rx) = lengths(kind, bytes, nranks, rank == root);
    cuda::check_extent_in(s, sx, ext[0], "sendbuff")?;
    cuda::check_extent_in(r, rx, ext[1], "recvbuff")?;
    let others = || (0..nranks).filter(move |&p| p != rank);
    match kind {
        CollKind::AllReduce => dev.prepare_reduce(
            cuda::Reduction::AllReduce,
            s,
            r,
            count,
            t,
            op,
            scalar_ptr,
            st,
        ),
        CollKind::ReduceScatter => dev.prepare_reduce(
            cuda::Reduction::ReduceScatter,
            s,
            r,
            count,
            t,
            op,
            scalar_ptr,
            st,
        ),
        CollKind::Reduce => dev.prepare_reduce(
            cuda::Reduction::Reduce { root },
            s,
            r,
            count,
            t,
            op,
            scalar_ptr,
            st,
        ),
        CollKind::AllGather => dev.prepare_copy(cuda::CopyKind::AllGather, s, r, bytes, st),
        CollKind::Broadcast => {
            dev.prepare_copy(cuda::CopyKind::Broadcast { root }, s, r, bytes, st)
        }
        CollKind::Send => dev.prepare_p2p(vec![(root, s, bytes)], vec![], st),
        CollKind::Recv => dev.prepare_p2p(vec![], vec![(root, r, bytes)], st),
        CollKind::AllToAll => {
            let at = |b: u64, p: usize| b + (p * bytes) as u64;
            let mut sends = vec![(rank, at(s, rank), bytes)];
            let mut recvs = vec![(rank, at(r, rank), bytes)];
            for p in others() {
                sends.push((p, at(s, p), bytes));
                recvs.push((p, at(r, p), bytes));
            }
            dev.prepare_p2p(sends, recvs, st)
        }
        CollKind::Gather => {
            if rank == root {
                let mut recvs = vec![(rank, r + (rank * bytes) as u64, bytes)];
                recvs.extend(others().map(|p| (p, r + (p * bytes) as u64, bytes)));
                dev.prepare_p2p(vec![(rank, s, bytes)], recvs, st)
            } else {
                dev.prepare_p2p(vec![(root, s, bytes)], vec![], st)
            }
        }
        CollKind::Scatter => {
            if rank == root {
                let mut sends = vec![(rank, s + (rank * bytes) as u64, bytes)];
                sends.extend(others().map(|p| (p, s + (p * bytes) as u64, bytes)));
                dev.prepare_p2p(sends, vec![(rank, r, bytes)], st)
            } else {
                dev.prepare_p2p(vec![], vec![(root, r, bytes)], st)
            }
        }
    }
}
