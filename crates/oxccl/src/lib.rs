//! oxccl: collective communication with NCCL's semantics, in Rust.
//!
//! A [`Communicator`] is one rank of a group of ranks (threads of one process,
//! processes of one host, or hosts) that run collectives together: all-reduce,
//! broadcast, reduce, all-gather, reduce-scatter, all-to-all, gather, scatter,
//! send and receive, on host memory and (module [`gpu`]) on device memory
//! given as cudarc's buffers and streams. Ranks meet through a [`UniqueId`]
//! made by one of them and passed to the others (or through `NCCL_COMM_ID`).
//!
//! ```
//! let comms = oxccl::Communicator::init_all(2).unwrap();
//! std::thread::scope(|s| {
//!     for c in &comms {
//!         s.spawn(move || {
//!             let mut x = vec![c.rank() as f32 + 1.0; 4];
//!             c.all_reduce_in_place(&mut x, oxccl::RedOp::Sum).unwrap();
//!             assert_eq!(x, vec![3.0; 4]);
//!         });
//!     }
//! });
//! ```
//!
//! Every call on host buffers blocks until its data has moved (calls on
//! device buffers are queued on their stream); every wait observes
//! [`Communicator::abort`] and the timeout (`OXCCL_TIMEOUT_MS`), and a peer
//! that dies turns into [`ErrorKind::Remote`] on the ranks waiting for it.

pub use oxccl_core::algo::{Algo, Proto, Selection};
/// The parameter registry (`NCCL_*` / `OXCCL_*` variables, typed).
pub use oxccl_core::params;
pub use oxccl_core::{CollKind, DataType, Error, ErrorKind, RedOp, Result, Scalar};
// `Config::host` is public: its type must be nameable without depending on
// oxccl-host directly.
pub use oxccl_host::HostConfig;
use oxccl_host::OpDesc;

pub mod gpu;
pub mod topo;
mod window;
pub use gpu::{GpuChoice, GpuGroup, StreamComm};
pub use window::Window;

use oxccl_bootstrap::{Bootstrap, BootstrapConfig, Family};
use oxccl_core::params::{Params, SocketFamily};
use oxccl_env::Subsys;
use oxccl_host::HostComm;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The version of oxccl.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// An element type of a buffer. Implemented for the Rust numeric types NCCL
/// has and for the 16- and 8-bit float newtypes.
pub trait Element: Copy + Send + Sync + 'static {
    /// The NCCL data type of this element.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: DataType = DataType::$d; })*
    };
}
element!(i8 => Int8, u8 => Uint8, i32 => Int32, u32 => Uint32, i64 => Int64, u64 => Uint64, f32 => Float32, f64 => Float64);

/// IEEE float16, as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct F16(pub u16);
/// bfloat16, as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct Bf16(pub u16);
/// fp8 e4m3 (OCP "fn"), as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);
/// fp8 e5m2, as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct F8E5M2(pub u8);
element!(F16 => Float16, Bf16 => Bfloat16, F8E4M3 => Float8e4m3, F8E5M2 => Float8e5m2);

macro_rules! device_repr {
    ($($t:ty),*) => {
        $(
        // SAFETY: `repr(transparent)` over an integer, which cudarc copies
        // to and from the device as plain bytes.
        unsafe impl cudarc::driver::DeviceRepr for $t {}
        // SAFETY: all-zero bits of these integers are a valid value (+0.0).
        unsafe impl cudarc::driver::ValidAsZeroBits for $t {}
        )*
    };
}
device_repr!(F16, Bf16, F8E4M3, F8E5M2);

/// A unique id: the root's address and a random secret; made once, given to every rank.
#[derive(Clone)]
pub struct UniqueId(oxccl_bootstrap::UniqueId);

impl UniqueId {
    /// Makes an id and starts the rendezvous root in this process (`ncclGetUniqueId`).
    pub fn new() -> Result<UniqueId> {
        Ok(UniqueId(oxccl_bootstrap::UniqueId::generate(
            &bootstrap_config(oxccl_env::params(), Arc::new(AtomicBool::new(false))),
        )?))
    }
    /// An id for a communicator made from another (split, shrink): its root
    /// in this process, never at `NCCL_COMM_ID`, which names the parent's
    /// rendezvous (a fixed address: on another host than the new rank 0 it
    /// could not be bound there).
    fn for_child() -> Result<UniqueId> {
        let mut cfg = bootstrap_config(oxccl_env::params(), Arc::new(AtomicBool::new(false)));
        cfg.comm_id = None;
        Ok(UniqueId(oxccl_bootstrap::UniqueId::generate(&cfg)?))
    }
    /// The 128 bytes to pass to the other ranks.
    pub fn as_bytes(&self) -> &[u8; 128] {
        self.0.as_bytes()
    }
    /// An id from its 128 bytes; an error if they are not an oxccl id.
    pub fn from_bytes(b: &[u8; 128]) -> Result<UniqueId> {
        Ok(UniqueId(oxccl_bootstrap::UniqueId::from_bytes(b)?))
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

/// Per-communicator settings beyond the environment (`ncclConfig_t`'s role).
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Overrides `OXCCL_TIMEOUT_MS` for this communicator.
    pub timeout: Option<Duration>,
    /// Overrides `OXCCL_INIT_TIMEOUT_MS`.
    pub init_timeout: Option<Duration>,
    /// Overrides the host settings derived from the environment.
    pub host: Option<HostConfig>,
    /// A name for logs.
    pub name: Option<String>,
    /// Whether this rank takes part in the GPU setup, and with which GPU
    /// (collectives on device buffers need it; see [`GpuChoice`] for the
    /// rule that every rank chooses alike).
    pub gpu: GpuChoice,
}

impl Config {
    /// The host transport settings this config gives: [`Config::host`], or
    /// those the environment asks for.
    pub fn host_settings(&self) -> HostConfig {
        self.host
            .clone()
            .unwrap_or_else(|| host_config(oxccl_env::params()))
    }

    /// The host transport settings that the parameters `p` ask for (what
    /// [`Config::host_settings`] gives without an override, from the
    /// process's parameters): for tools that judge another set, such as a
    /// recorded machine's configuration files.
    pub fn host_settings_from(p: &params::Params) -> HostConfig {
        host_config(p)
    }
}

fn bootstrap_config(p: &Params, abort: Arc<AtomicBool>) -> BootstrapConfig {
    BootstrapConfig {
        ifname: p.get(&params::SOCKET_IFNAME),
        bootstrap_ifname: p.get(&params::BOOTSTRAP_IFNAME),
        family: p.get(&params::SOCKET_FAMILY).map(|f| match f {
            SocketFamily::Inet => Family::V4,
            SocketFamily::Inet6 => Family::V6,
        }),
        comm_id: p.get(&params::COMM_ID),
        auth_secret: p.get(&params::AUTH_SECRET),
        auth_secret_file: p.get(&params::AUTH_SECRET_FILE).map(Into::into),
        auth_required: p.get(&params::AUTH_REQUIRED),
        host_id: p.get(&params::HOSTID),
        init_timeout: p.get(&params::INIT_TIMEOUT_MS),
        timeout: p.get(&params::TIMEOUT_MS),
        abort,
        ..BootstrapConfig::default()
    }
}

/// The host settings the environment asks for.
pub(crate) fn host_config(p: &Params) -> HostConfig {
    let capacity = match p.source(&params::BUFFSIZE) {
        // Host rings default to 1 MiB: NCCL's 4 MiB default is sized for GPU
        // links; 1 MiB already pipelines in 512 KiB slices and keeps 8 local ranks
        // within 8 * 7 * 3 channels * 1 MiB = 168 MiB of /dev/shm.
        params::Source::Default => 1 << 20,
        _ => p.get(&params::BUFFSIZE).min(1 << 30) as usize,
    };
    HostConfig {
        shm_disable: p.get(&params::SHM_DISABLE),
        p2p_disable: p.get(&params::P2P_DISABLE),
        algos: p.get(&params::ALGO).unwrap_or_default(),
        protos: p.get(&params::PROTO).unwrap_or_default(),
        capacity,
        min_channels: p.get(&params::MIN_NCHANNELS).map(|v| v as usize),
        max_channels: p.get(&params::MAX_NCHANNELS).map(|v| v as usize),
        nchannels: p.get(&params::HOST_NCHANNELS).map(|v| v as usize),
        timeout: p.get(&params::TIMEOUT_MS),
        link_timeout: p.get(&params::LINK_TIMEOUT_MS),
        spin: Duration::from_micros(p.get(&params::SPIN_US)),
        net: oxccl_net::NetSettings {
            plugin: p.get(&params::NET_PLUGIN),
            net: p.get(&params::NET),
            ib_disable: p.get(&params::IB_DISABLE).is_some_and(|v| v != 0),
            ib_hca: p.get(&params::IB_HCA),
            cross_nic: p.get(&params::CROSS_NIC),
        },
        tuner_plugin: p.get(&params::TUNER_PLUGIN),
        profiler_plugin: p.get(&params::PROFILER_PLUGIN),
    }
}

struct Inner {
    rank: usize,
    nranks: usize,
    /// Set by [`Communicator::abort`]: every wait, the bootstrap's too.
    abort: Arc<AtomicBool>,
    /// What the host operations' waits observe: set by `abort` and by
    /// [`Communicator::revoke`], which keeps the bootstrap usable for a
    /// split or a shrink.
    stop: Arc<AtomicBool>,
    /// `None` once destroyed or aborted.
    comm: Mutex<Option<HostComm>>,
    /// Whether `comm` has a profiler plugin (set once at creation): the GPU
    /// path's launches look here, not behind the lock.
    profiled: bool,
    /// The GPU state (`gpu` module), set once at creation.
    gpu: gpu::GpuSlot,
    config: Config,
}

/// One rank of a communicator. Cheap to clone (clones share the rank).
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {})",
            self.inner.rank, self.inner.nranks
        )
    }
}

impl Communicator {
    /// Joins as `rank` of `nranks` (`ncclCommInitRank`).
    pub fn init_rank(nranks: usize, id: &UniqueId, rank: usize) -> Result<Communicator> {
        Self::init_rank_config(nranks, id, rank, Config::default())
    }

    /// Joins as `rank` of `nranks` with settings (`ncclCommInitRankConfig`).
    pub fn init_rank_config(
        nranks: usize,
        id: &UniqueId,
        rank: usize,
        config: Config,
    ) -> Result<Communicator> {
        if nranks == 0 {
            return Err(Error::invalid_argument("nranks must be at least 1 (got 0)"));
        }
        if rank >= nranks {
            return Err(Error::invalid_argument(format!(
                "rank {rank} is out of range for nranks {nranks} (valid: 0..={})",
                nranks - 1
            )));
        }
        let t0 = Instant::now();
        let p = oxccl_env::params();
        oxccl_env::set_device(rank as i32);
        static VERSION_ONCE: std::sync::Once = std::sync::Once::new();
        VERSION_ONCE.call_once(|| {
            oxccl_env::version!("oxccl version {VERSION} (NCCL API, host collectives)")
        });
        let abort = Arc::new(AtomicBool::new(false));
        let mut bcfg = bootstrap_config(p, abort.clone());
        if let Some(t) = config.init_timeout {
            bcfg.init_timeout = t;
        }
        if let Some(t) = config.timeout {
            bcfg.timeout = t;
        }
        let mut hcfg = config.host_settings();
        if let Some(t) = config.timeout {
            hcfg.timeout = t;
        }
        let comm_id = id.0.run_id();
        oxccl_env::info!(
            Subsys::INIT,
            "ncclCommInitRank comm rank {rank} nranks {nranks} cudaDev -1 busId 0 commId {comm_id:#x} - Init START"
        );
        let bs = Bootstrap::init(&id.0, nranks, rank, &bcfg)?;
        let stop = Arc::new(AtomicBool::new(false));
        let comm = HostComm::init(bs, hcfg, stop.clone())?;
        oxccl_env::info!(
            Subsys::INIT,
            "ncclCommInitRank comm rank {rank} nranks {nranks} cudaDev -1 busId 0 commId {comm_id:#x} - Init COMPLETE"
        );
        oxccl_env::info!(
            Subsys::INIT,
            "Init timings - ncclCommInitRank: rank {rank} nranks {nranks} total {:.2}",
            t0.elapsed().as_secs_f64()
        );
        let (choice, timeout) = (config.gpu, config.timeout);
        let c = Communicator {
            inner: Arc::new(Inner {
                rank,
                nranks,
                abort,
                stop,
                profiled: comm.has_profiler(),
                comm: Mutex::new(Some(comm)),
                gpu: Mutex::new(None),
                config,
            }),
        };
        gpu::setup(&c, choice, timeout);
        if let Some(path) = oxccl_env::sysfs::topology_dump_path(p, rank) {
            topo::dump(
                &path,
                !matches!(choice, GpuChoice::Off | GpuChoice::NoDevice),
            );
        }
        Ok(c)
    }

    /// Makes `n` ranks in this process, one communicator each (`ncclCommInitAll`).
    /// Drive them from different threads, or from one thread with a [`Group`].
    pub fn init_all(n: usize) -> Result<Vec<Communicator>> {
        Self::init_all_config(n, |_| Config::default())
    }

    /// [`Communicator::init_all`] with each rank's settings, `config(rank)`
    /// (a GPU per rank: [`Config::gpu`]).
    pub fn init_all_config(
        n: usize,
        config: impl Fn(usize) -> Config + Sync,
    ) -> Result<Vec<Communicator>> {
        if n == 0 {
            return Err(Error::invalid_argument("init_all: n must be at least 1"));
        }
        let id = UniqueId::new()?;
        let results: Vec<Result<Communicator>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|r| {
                    let (id, config) = (&id, &config);
                    s.spawn(move || Communicator::init_rank_config(n, id, r, config(r)))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::internal("init thread panicked")))
                })
                .collect()
        });
        results.into_iter().collect()
    }

    /// This rank (`ncclCommUserRank`).
    pub fn rank(&self) -> usize {
        self.inner.rank
    }
    /// Ranks in the communicator (`ncclCommCount`).
    pub fn size(&self) -> usize {
        self.inner.nranks
    }

    /// The error that put the communicator in its error state, if any
    /// (`ncclCommGetAsyncError`). Host operations complete before returning,
    /// so this is the last operation's failure.
    pub fn async_error(&self) -> Option<Error> {
        if self.inner.abort.load(Ordering::Acquire) {
            return Some(Error::invalid_usage("communicator aborted"));
        }
        match self.inner.comm.try_lock() {
            Ok(g) => match g.as_ref() {
                Some(c) => c.async_error().cloned(),
                None => Some(Error::invalid_usage("communicator destroyed")),
            },
            Err(_) => None,
        }
    }

    /// The peers this rank holds a host connection to, ascending: at
    /// creation only those of the collectives with a bounded fan-out (ring
    /// neighbours, tree links, every peer up to 8 ranks), others from the
    /// first operation that talks to them. Empty once destroyed or aborted.
    pub fn connected_peers(&self) -> Vec<usize> {
        match self.inner.comm.lock() {
            Ok(g) => g.as_ref().map(|c| c.connected_peers()).unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// Whether every peer is still there, for watchers of work outside the
    /// host collectives (GPU kernels): `Ok(None)` all there (or an operation
    /// holds the communicator right now: it checks them itself), `Ok(Some(e))`
    /// a peer died or failed, `Err` this rank was destroyed or aborted. A peer
    /// that destroyed its communicator (said goodbye) is not an error here:
    /// the others may still work with each other (a wait on it still fails).
    pub fn check_peers(&self) -> Result<Option<Error>> {
        if self.inner.abort.load(Ordering::Acquire) {
            return Err(Error::invalid_usage("communicator aborted"));
        }
        match self.inner.comm.try_lock() {
            Ok(mut g) => match g.as_mut() {
                Some(c) => Ok(c.check_peers_alive().err()),
                None => Err(Error::invalid_usage("communicator destroyed")),
            },
            Err(std::sync::TryLockError::WouldBlock) => Ok(None),
            Err(std::sync::TryLockError::Poisoned(_)) => {
                Err(Error::internal("communicator lock poisoned by a panic"))
            }
        }
    }

    /// Stops every operation of this rank, now, from any thread
    /// (`ncclCommAbort`): waits return, GPU kernels leave theirs, the
    /// transports close (peers see a remote error), and later calls fail
    /// with `InvalidUsage`. The GPU state is left allocated (a kernel may
    /// still wait on the GPU for a peer that never comes; freeing it would
    /// wait for that kernel).
    pub fn abort(&self) {
        self.inner.abort.store(true, Ordering::Release);
        self.inner.stop.store(true, Ordering::Release);
        if let Ok(mut g) = self.inner.comm.lock() {
            g.take();
        }
        self.abandon_gpu();
        oxccl_env::info!(
            Subsys::INIT,
            "comm rank {} nranks {} - Abort COMPLETE",
            self.inner.rank,
            self.inner.nranks
        );
    }

    /// Ends this rank's operations in flight (host waits return an error
    /// within ~200 us; GPU kernels leave their waits within about a
    /// millisecond) and refuses later ones, keeping the bootstrap so
    /// that [`Communicator::split`] and [`Communicator::shrink`] still run
    /// on it (`ncclCommRevoke`; the first half of `ncclCommShrink` with
    /// `NCCL_SHRINK_ABORT`). Returns once no operation of this rank runs.
    /// Why never usable again: operations that ended midway leave the ranks'
    /// sequence numbers and ring positions disagreeing, so a later
    /// collective on it could pair the wrong messages.
    pub fn revoke(&self) {
        self.stop_gpu();
        self.inner.stop.store(true, Ordering::Release);
        // An operation in flight holds the lock until its wait has seen the
        // flag; taking it here is the "quiescent" NCCL's revoke waits for.
        drop(self.inner.comm.lock());
    }

    /// Releases the rank's resources (`ncclCommDestroy`); dropping the last clone does the same.
    pub fn destroy(self) -> Result<()> {
        self.free_gpu();
        let mut g = self.lock_raw()?;
        if let Some(c) = g.as_mut() {
            // Peers still working with each other must not take this
            // rank's closing connections for a death.
            c.goodbye();
        }
        g.take();
        Ok(())
    }

    /// A child's settings (split, shrink, grow): this one's, with the GPU
    /// it has ([`Communicator::device`]).
    fn child_config(&self) -> Config {
        Config {
            gpu: self.child_gpu(),
            ..self.inner.config.clone()
        }
    }

    fn lock_raw(&self) -> Result<MutexGuard<'_, Option<HostComm>>> {
        self.inner
            .comm
            .lock()
            .map_err(|_| Error::internal("communicator lock poisoned by a panic"))
    }

    /// Refuses an operation on a rank that was aborted or revoked.
    fn check_not_stopped(&self) -> Result<()> {
        if self.inner.abort.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(format!(
                "rank {}: the communicator was aborted",
                self.inner.rank
            )));
        }
        if self.inner.stop.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(format!(
                "rank {}: the communicator was revoked (ncclCommRevoke, or ncclCommShrink with NCCL_SHRINK_ABORT): only split, shrink, destroy or abort it",
                self.inner.rank
            )));
        }
        Ok(())
    }

    fn with_comm<R>(&self, f: impl FnOnce(&mut HostComm) -> Result<R>) -> Result<R> {
        self.check_not_stopped()?;
        let mut g = self.lock_raw()?;
        let c = g.as_mut().ok_or_else(|| {
            Error::invalid_usage(format!(
                "rank {}: the communicator was destroyed or aborted",
                self.inner.rank
            ))
        })?;
        f(c)
    }

    /// The tuner's time for an operation of `bytes` (nccl-tests' size) on
    /// this communicator's host transports, microseconds: its cost model
    /// (latency and bandwidth per hop, `oxccl_core::tuner`).
    pub fn estimate_us(&self, kind: CollKind, bytes: usize) -> Result<f64> {
        self.with_comm(|c| c.plan(kind, bytes).map(|p| p.est_us))
    }

    /// The plan the host path would run for an operation of `bytes`
    /// (nccl-tests' size): algorithm, protocol and channels, after a tuner
    /// plugin (`NCCL_TUNER_PLUGIN`) had its say.
    pub fn host_plan(&self, kind: CollKind, bytes: usize) -> Result<oxccl_core::tuner::Plan> {
        self.with_comm(|c| c.plan(kind, bytes))
    }

    /// The GPU time model's time for an operation of `bytes` (nccl-tests'
    /// size) on device buffers of this communicator, microseconds
    /// (`oxccl_core::tuner::gpu_estimate_us`: latency plus bus bytes at the
    /// bus bandwidth measured on one NVLink-connected host).
    pub fn estimate_device_us(&self, kind: CollKind, bytes: usize) -> f64 {
        oxccl_core::tuner::gpu_estimate_us(kind, bytes, self.size())
    }

    /// Every rank's `mine`, in rank order, through the bootstrap (a
    /// collective: every rank must call it, in the same order relative to
    /// the other collectives). For setup exchanges of layers above the host
    /// collectives, such as the GPU path's IPC handles.
    pub(crate) fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.with_comm(|c| c.bootstrap().allgather(mine))
    }

    /// Whether rank `r` runs on this host (the bootstrap's verdict, which
    /// honours `NCCL_HOSTID`).
    pub(crate) fn is_same_host(&self, r: usize) -> bool {
        self.with_comm(|c| Ok(c.bootstrap().is_same_host(r)))
            .unwrap_or(false)
    }

    /// Each rank's host as a number, equal for ranks of one host (the
    /// bootstrap's host hash, which honours `NCCL_HOSTID`). Works on a
    /// revoked communicator.
    pub(crate) fn hosts(&self) -> Result<Vec<u64>> {
        let g = self.lock_raw()?;
        let c = g
            .as_ref()
            .ok_or_else(|| Error::invalid_usage("the communicator was destroyed or aborted"))?;
        Ok(c.bootstrap().peers().iter().map(|p| p.host_hash).collect())
    }

    /// The network plugin (and device) this communicator uses for peers on
    /// other hosts, if it chose one (`NCCL_NET_PLUGIN`).
    pub(crate) fn net_plugin(&self) -> Option<(Arc<dyn oxccl_net::Net>, usize)> {
        self.with_comm(|c| Ok(c.net_plugin())).ok().flatten()
    }

    /// The tuner plugin's context, if one loaded (`NCCL_TUNER_PLUGIN`).
    pub(crate) fn tuner(&self) -> Option<oxccl_cuda::exec::Tuner> {
        self.with_comm(|c| Ok(c.tuner())).ok().flatten()
    }

    /// A TCP connection to `peer` through the bootstrap, for a layer above
    /// the host collectives (the GPU network path): both ranks call it for
    /// each other with the same `tag`; the lower rank connects.
    pub(crate) fn peer_stream(&self, peer: usize, tag: u32) -> Result<std::net::TcpStream> {
        self.with_comm(|c| {
            let b = c.bootstrap();
            if b.rank() < peer {
                b.connect_peer(peer, tag)
            } else {
                b.accept_peer(peer, tag)
            }
        })
    }

    /// Runs raw operations as one group.
    ///
    /// # Safety
    /// As [`oxccl_host::HostComm::run`]: every pointer valid for its operation.
    pub(crate) unsafe fn run_raw(&self, ops: &[OpDesc]) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        self.with_comm(|c| unsafe { c.run(ops) })
    }

    fn run_one(&self, op: OpDesc) -> Result<()> {
        // SAFETY: every caller builds `op` from live slices whose lengths it
        // checked against the collective's extents, borrowed for this call.
        unsafe { self.run_raw(&[op]) }
    }

    fn check_len(&self, what: &str, got: usize, want: usize) -> Result<()> {
        if got != want {
            return Err(Error::invalid_argument(format!(
                "{what} has {got} elements; this call needs {want}"
            )));
        }
        Ok(())
    }

    /// `recv = op over ranks of send` (`ncclAllReduce`).
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: RedOp) -> Result<()> {
        self.check_len("all_reduce: recv", recv.len(), send.len())?;
        self.run_one(desc::<T>(
            CollKind::AllReduce,
            send.as_ptr(),
            recv.as_mut_ptr(),
            send.len(),
            op,
            0,
        ))
    }
    /// In-place all-reduce.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: RedOp) -> Result<()> {
        let p = buf.as_mut_ptr();
        self.run_one(desc::<T>(CollKind::AllReduce, p, p, buf.len(), op, 0))
    }
    /// Root's `send` to every rank's `recv` (`ncclBroadcast`); `send` is read on the root only.
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        if self.rank() == root {
            self.check_len("broadcast: send", send.len(), recv.len())?;
        }
        self.run_one(desc::<T>(
            CollKind::Broadcast,
            send.as_ptr(),
            recv.as_mut_ptr(),
            recv.len(),
            RedOp::Sum,
            root,
        ))
    }
    /// In-place broadcast (`ncclBcast`).
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let p = buf.as_mut_ptr();
        self.run_one(desc::<T>(
            CollKind::Broadcast,
            p,
            p,
            buf.len(),
            RedOp::Sum,
            root,
        ))
    }
    /// `recv` on the root = op over ranks of `send` (`ncclReduce`); `recv` is written on the root only.
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        if self.rank() == root {
            self.check_len("reduce: recv", recv.len(), send.len())?;
        }
        self.run_one(desc::<T>(
            CollKind::Reduce,
            send.as_ptr(),
            recv.as_mut_ptr(),
            send.len(),
            op,
            root,
        ))
    }
    /// In-place reduce.
    pub fn reduce_in_place<T: Element>(&self, buf: &mut [T], op: RedOp, root: usize) -> Result<()> {
        let p = buf.as_mut_ptr();
        self.run_one(desc::<T>(CollKind::Reduce, p, p, buf.len(), op, root))
    }
    /// Every rank's `send` into block `rank` of every `recv` (`ncclAllGather`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.check_len(
            "all_gather: recv",
            recv.len(),
            send.len().saturating_mul(self.size()),
        )?;
        self.run_one(desc::<T>(
            CollKind::AllGather,
            send.as_ptr(),
            recv.as_mut_ptr(),
            send.len(),
            RedOp::Sum,
            0,
        ))
    }
    /// In-place all-gather: this rank's block of `buf` is its input.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let n = self.size();
        if buf.len() % n != 0 {
            return Err(Error::invalid_argument(format!(
                "all_gather_in_place: buffer of {} elements is not a multiple of {n} ranks",
                buf.len()
            )));
        }
        let count = buf.len() / n;
        let p = buf.as_mut_ptr();
        // SAFETY: pointer arithmetic only; the block lies inside `buf`.
        let s = p.wrapping_add(self.rank() * count);
        self.run_one(desc::<T>(CollKind::AllGather, s, p, count, RedOp::Sum, 0))
    }
    /// Block `rank` of op over ranks of `send` into `recv` (`ncclReduceScatter`).
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: RedOp) -> Result<()> {
        self.check_len(
            "reduce_scatter: send",
            send.len(),
            recv.len().saturating_mul(self.size()),
        )?;
        self.run_one(desc::<T>(
            CollKind::ReduceScatter,
            send.as_ptr(),
            recv.as_mut_ptr(),
            recv.len(),
            op,
            0,
        ))
    }
    /// In-place reduce-scatter: the result lands in this rank's block of `buf`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: RedOp) -> Result<()> {
        let n = self.size();
        if buf.len() % n != 0 {
            return Err(Error::invalid_argument(format!(
                "reduce_scatter_in_place: buffer of {} elements is not a multiple of {n} ranks",
                buf.len()
            )));
        }
        let count = buf.len() / n;
        let p = buf.as_mut_ptr();
        let r = p.wrapping_add(self.rank() * count);
        self.run_one(desc::<T>(CollKind::ReduceScatter, p, r, count, op, 0))
    }
    /// Block q of `send` to rank q, block q of `recv` from rank q (`ncclAlltoAll`).
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.size();
        self.check_len("all_to_all: recv", recv.len(), send.len())?;
        if send.len() % n != 0 {
            return Err(Error::invalid_argument(format!(
                "all_to_all: buffer of {} elements is not a multiple of {n} ranks",
                send.len()
            )));
        }
        self.run_one(desc::<T>(
            CollKind::AllToAll,
            send.as_ptr(),
            recv.as_mut_ptr(),
            send.len() / n,
            RedOp::Sum,
            0,
        ))
    }
    /// Every rank's `send` into block `rank` of the root's `recv` (`ncclGather`).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        if self.rank() == root {
            self.check_len(
                "gather: recv",
                recv.len(),
                send.len().saturating_mul(self.size()),
            )?;
        }
        self.run_one(desc::<T>(
            CollKind::Gather,
            send.as_ptr(),
            recv.as_mut_ptr(),
            send.len(),
            RedOp::Sum,
            root,
        ))
    }
    /// Block `rank` of the root's `send` into every `recv` (`ncclScatter`).
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        if self.rank() == root {
            self.check_len(
                "scatter: send",
                send.len(),
                recv.len().saturating_mul(self.size()),
            )?;
        }
        self.run_one(desc::<T>(
            CollKind::Scatter,
            send.as_ptr(),
            recv.as_mut_ptr(),
            recv.len(),
            RedOp::Sum,
            root,
        ))
    }
    /// Sends `buf` to `peer` (`ncclSend`); pairs with the peer's [`Communicator::recv`].
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.run_one(desc::<T>(
            CollKind::Send,
            buf.as_ptr(),
            std::ptr::null_mut(),
            buf.len(),
            RedOp::Sum,
            peer,
        ))
    }
    /// Receives into `buf` from `peer` (`ncclRecv`).
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.run_one(desc::<T>(
            CollKind::Recv,
            std::ptr::null(),
            buf.as_mut_ptr(),
            buf.len(),
            RedOp::Sum,
            peer,
        ))
    }

    /// A new communicator of the ranks that pass the same `color` (`ncclCommSplit`),
    /// ordered by `key` then by rank here; `None` as color joins none and returns `None`.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        const TAG_SPLIT: u32 = 0x5b1;
        let me = self.rank();
        let (members, new_rank) = {
            let g = self.lock_raw()?;
            let c = g.as_ref().ok_or_else(|| {
                Error::invalid_usage("split: the communicator was destroyed or aborted")
            })?;
            let mut mine = Vec::with_capacity(9);
            mine.push(u8::from(color.is_some()));
            mine.extend_from_slice(&color.unwrap_or(0).to_le_bytes());
            mine.extend_from_slice(&key.to_le_bytes());
            let all = c.bootstrap().allgather(&mine)?;
            let mut members: Vec<(i32, usize)> = Vec::new();
            for (r, b) in all.iter().enumerate() {
                if b.len() != 9 {
                    return Err(Error::internal(format!(
                        "split: rank {r} sent {} bytes",
                        b.len()
                    )));
                }
                let has = b[0] == 1;
                let col = u32::from_le_bytes([b[1], b[2], b[3], b[4]]);
                let k = i32::from_le_bytes([b[5], b[6], b[7], b[8]]);
                if has && Some(col) == color {
                    members.push((k, r));
                }
            }
            let Some(c0) = color else {
                return Ok(None);
            };
            let _ = c0;
            members.sort();
            let new_rank = members.iter().position(|&(_, r)| r == me).unwrap_or(0);
            // The new rank 0 makes the id and hands it to the others.
            if new_rank == 0 {
                let id = UniqueId::for_child()?;
                for &(_, r) in &members[1..] {
                    c.bootstrap().send(r, TAG_SPLIT, id.as_bytes())?;
                }
                drop(g);
                return Communicator::init_rank_config(members.len(), &id, 0, self.child_config())
                    .map(Some);
            }
            let b = c.bootstrap().recv(members[0].1, TAG_SPLIT)?;
            let arr: [u8; 128] = b
                .as_slice()
                .try_into()
                .map_err(|_| Error::internal("split: the new root sent a short unique id"))?;
            (members.len(), (new_rank, UniqueId::from_bytes(&arr)?))
        };
        let (nr, id) = new_rank;
        Communicator::init_rank_config(members, &id, nr, self.child_config()).map(Some)
    }

    /// A new communicator of this one's ranks without `exclude`
    /// (`ncclCommShrink`): every rank not excluded calls it with the same
    /// list (in any order, repeats allowed); the excluded ones do not (they
    /// may be dead). New ranks keep the parent order. It works on a
    /// communicator in an error state (a peer died) or revoked
    /// ([`Communicator::revoke`]), through the parent's bootstrap
    /// links to the survivors only: the lowest surviving rank makes the new
    /// id and sends it, with a digest of the survivor list, to the others,
    /// which refuse it if their list differs.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        const TAG_SHRINK: u32 = 0x5b2;
        let me = self.rank();
        let survivors = shrink_members(self.size(), me, exclude)?;
        let new_rank = survivors.iter().position(|&r| r == me).unwrap_or(0);
        let digest = members_digest(&survivors);
        let cfg = self.child_config();
        let (n, root) = (survivors.len(), survivors[0]);
        oxccl_env::info!(
            Subsys::INIT,
            "ncclCommShrink comm rank {me} nranks {} excluding {} ranks - new rank {new_rank} nranks {n}",
            self.size(),
            self.size() - n
        );
        let closed = || Error::invalid_usage("shrink: the communicator was destroyed or aborted");
        if new_rank == 0 {
            let id = UniqueId::for_child()?;
            let mut msg = id.as_bytes().to_vec();
            msg.extend_from_slice(&digest.to_le_bytes());
            {
                let g = self.lock_raw()?;
                let c = g.as_ref().ok_or_else(closed)?;
                for &r in &survivors[1..] {
                    c.bootstrap().send(r, TAG_SHRINK, &msg)?;
                }
            }
            return Communicator::init_rank_config(n, &id, 0, cfg);
        }
        let b = {
            let g = self.lock_raw()?;
            let c = g.as_ref().ok_or_else(closed)?;
            c.bootstrap().recv(root, TAG_SHRINK)?
        };
        // The id's 128 bytes and the 8 of the digest.
        if b.len() != 128 + 8 {
            return Err(Error::internal(format!(
                "shrink: rank {root} (the new rank 0) sent {} bytes, not 136",
                b.len()
            )));
        }
        let theirs = u64::from_le_bytes(b[128..].try_into().expect("8 bytes"));
        if theirs != digest {
            return Err(Error::invalid_usage(format!(
                "shrink: rank {root} (the new rank 0) keeps other ranks than this rank ({me}), which keeps {survivors:?}: every remaining rank must exclude the same ranks"
            )));
        }
        let arr: [u8; 128] = b[..128].try_into().expect("128 bytes");
        Communicator::init_rank_config(n, &UniqueId::from_bytes(&arr)?, new_rank, cfg)
    }

    /// A fresh id to grow this communicator with (`ncclCommGetUniqueId`):
    /// its rendezvous root runs in this process. Pass it to this rank's
    /// [`Communicator::grow`] and to the new ranks.
    pub fn grow_id(&self) -> Result<UniqueId> {
        self.check_not_stopped()?;
        UniqueId::for_child()
    }

    /// This rank's side of `ncclCommGrow`: a communicator of `nranks` ranks
    /// in which every rank of this one keeps its rank and ranks
    /// `size()..nranks` are new (they join with
    /// `Communicator::init_rank_config(nranks, &id, rank, ..)`). Every rank
    /// of this communicator calls it; exactly one passes the id (from
    /// [`Communicator::grow_id`]), the others `None`: an all-gather over the
    /// bootstrap hands it to them and refuses none or several.
    pub fn grow(&self, nranks: usize, id: Option<&UniqueId>) -> Result<Communicator> {
        let n = self.size();
        if nranks <= n {
            return Err(Error::invalid_argument(format!(
                "grow: nranks {nranks} must exceed the communicator's {n} ranks"
            )));
        }
        self.check_not_stopped()?;
        let mut mine = vec![u8::from(id.is_some())];
        if let Some(i) = id {
            mine.extend_from_slice(i.as_bytes());
        }
        let all = {
            let g = self.lock_raw()?;
            let c = g.as_ref().ok_or_else(|| {
                Error::invalid_usage("grow: the communicator was destroyed or aborted")
            })?;
            c.bootstrap().allgather(&mine)?
        };
        let holders: Vec<usize> = (0..n).filter(|&r| all[r].first() == Some(&1)).collect();
        let h = match holders[..] {
            [h] => h,
            [] => {
                return Err(Error::invalid_usage(
                    "grow: no rank passed a unique id: exactly one existing rank passes the id from ncclCommGetUniqueId, the others NULL",
                ))
            }
            _ => {
                return Err(Error::invalid_usage(format!(
                    "grow: ranks {holders:?} each passed a unique id: exactly one existing rank passes it, the others NULL"
                )))
            }
        };
        let bytes: [u8; 128] = all[h]
            .get(1..129)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| Error::internal(format!("grow: rank {h} sent a short unique id")))?;
        let gid = UniqueId::from_bytes(&bytes)?;
        oxccl_env::info!(
            Subsys::INIT,
            "ncclCommGrow comm rank {} nranks {n} - new nranks {nranks} (the id from rank {h})",
            self.rank()
        );
        Communicator::init_rank_config(nranks, &gid, self.rank(), self.child_config())
    }
}

/// The ranks of `nranks` left after `exclude`, ascending (the new rank
/// order of a shrink); refuses ranks out of range and `me` excluded.
fn shrink_members(nranks: usize, me: usize, exclude: &[usize]) -> Result<Vec<usize>> {
    if let Some(&r) = exclude.iter().find(|&&r| r >= nranks) {
        return Err(Error::invalid_argument(format!(
            "shrink: excluded rank {r} is out of range (the communicator has {nranks} ranks)"
        )));
    }
    if exclude.contains(&me) {
        return Err(Error::invalid_argument(format!(
            "shrink: this rank ({me}) is in the exclude list: excluded ranks must not call it"
        )));
    }
    Ok((0..nranks).filter(|r| !exclude.contains(r)).collect())
}

/// FNV-1a over the survivors' ranks: what ranks compare to find a rank
/// that passed another exclude list.
fn members_digest(members: &[usize]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &r in members {
        for b in (r as u64).to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn desc<T: Element>(
    kind: CollKind,
    send: *const T,
    recv: *mut T,
    count: usize,
    op: RedOp,
    root: usize,
) -> OpDesc {
    OpDesc {
        kind,
        send: send as *const u8,
        recv: recv as *mut u8,
        count,
        dtype: T::DTYPE,
        op,
        root,
    }
}

/// Operations issued together (`ncclGroupStart` / `ncclGroupEnd`): sends and
/// receives in a group never deadlock whatever their order, and one thread can
/// drive several communicators (ranks) in one group.
#[derive(Default)]
pub struct Group<'a> {
    ops: Vec<(&'a Communicator, OpDesc)>,
}

impl<'a> Group<'a> {
    /// An empty group.
    pub fn new() -> Group<'a> {
        Group { ops: Vec::new() }
    }
    /// Adds a send of `buf` to `peer` on `comm`.
    pub fn send<T: Element>(
        &mut self,
        comm: &'a Communicator,
        buf: &'a [T],
        peer: usize,
    ) -> &mut Self {
        self.ops.push((
            comm,
            desc::<T>(
                CollKind::Send,
                buf.as_ptr(),
                std::ptr::null_mut(),
                buf.len(),
                RedOp::Sum,
                peer,
            ),
        ));
        self
    }
    /// Adds a receive into `buf` from `peer` on `comm`.
    pub fn recv<T: Element>(
        &mut self,
        comm: &'a Communicator,
        buf: &'a mut [T],
        peer: usize,
    ) -> &mut Self {
        self.ops.push((
            comm,
            desc::<T>(
                CollKind::Recv,
                std::ptr::null(),
                buf.as_mut_ptr(),
                buf.len(),
                RedOp::Sum,
                peer,
            ),
        ));
        self
    }
    /// Adds an all-reduce on `comm`.
    pub fn all_reduce<T: Element>(
        &mut self,
        comm: &'a Communicator,
        send: &'a [T],
        recv: &'a mut [T],
        op: RedOp,
    ) -> Result<&mut Self> {
        comm.check_len("all_reduce: recv", recv.len(), send.len())?;
        self.ops.push((
            comm,
            desc::<T>(
                CollKind::AllReduce,
                send.as_ptr(),
                recv.as_mut_ptr(),
                send.len(),
                op,
                0,
            ),
        ));
        Ok(self)
    }
    /// Adds an in-place all-reduce on `comm`.
    pub fn all_reduce_in_place<T: Element>(
        &mut self,
        comm: &'a Communicator,
        buf: &'a mut [T],
        op: RedOp,
    ) -> &mut Self {
        let p = buf.as_mut_ptr();
        self.ops
            .push((comm, desc::<T>(CollKind::AllReduce, p, p, buf.len(), op, 0)));
        self
    }
    /// Issues every operation and waits for all (`ncclGroupEnd`).
    pub fn run(self) -> Result<()> {
        // SAFETY: every pointer came from a slice borrowed for 'a, which outlives self.
        unsafe { run_group_raw(&self.ops) }
    }
}

/// Runs raw operations on several communicators as one group.
///
/// # Safety
/// Every pointer valid for its operation until this returns.
pub(crate) unsafe fn run_group_raw(ops: &[(&Communicator, OpDesc)]) -> Result<()> {
    // SAFETY: forwarded from this function's contract.
    unsafe { run_group_raw_with(ops, true) }
}

/// [`run_group_raw`]; `profiled` false for the library's own exchanges,
/// which a profiler plugin does not see ([`oxccl_host::run_group_unprofiled`]).
///
/// # Safety
/// As [`run_group_raw`].
pub(crate) unsafe fn run_group_raw_with(
    ops: &[(&Communicator, OpDesc)],
    profiled: bool,
) -> Result<()> {
    // One entry per distinct communicator, in first-use order; lock them in
    // address order so two threads grouping the same communicators can't deadlock.
    let mut comms: Vec<&Communicator> = Vec::new();
    for (c, _) in ops {
        if !comms.iter().any(|x| Arc::ptr_eq(&x.inner, &c.inner)) {
            comms.push(c);
        }
    }
    let mut order: Vec<usize> = (0..comms.len()).collect();
    order.sort_by_key(|&i| Arc::as_ptr(&comms[i].inner) as usize);
    let mut guards: Vec<Option<MutexGuard<'_, Option<HostComm>>>> =
        (0..comms.len()).map(|_| None).collect();
    for &i in &order {
        let c = comms[i];
        c.check_not_stopped()?;
        guards[i] = Some(c.lock_raw()?);
    }
    let per: Vec<Vec<OpDesc>> = comms
        .iter()
        .map(|c| {
            ops.iter()
                .filter(|(x, _)| Arc::ptr_eq(&x.inner, &c.inner))
                .map(|(_, o)| *o)
                .collect()
        })
        .collect();
    let mut items: Vec<(&mut HostComm, &[OpDesc])> = Vec::with_capacity(comms.len());
    for (g, o) in guards.iter_mut().zip(per.iter()) {
        let hc = g.as_mut().and_then(|g| g.as_mut()).ok_or_else(|| {
            Error::invalid_usage("group: a communicator was destroyed or aborted")
        })?;
        items.push((hc, o.as_slice()));
    }
    // No panic crosses the API: a panic inside the executor (a bug) becomes an
    // internal error. The communicators involved are left in their error state.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            if profiled {
                oxccl_host::run_group(&mut items)
            } else {
                oxccl_host::run_group_unprofiled(&mut items)
            }
        }
    }));
    r.unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Error::internal(format!(
            "panic in the host executor: {what}"
        )))
    })
}

/// Operations on untyped buffers whose data type is chosen at run time
/// (the shape of NCCL's own interface), for callers that hold raw pointers:
/// the C ABI, or a benchmark sweeping data types. Typed slices go through
/// [`Communicator`] and [`Group`], which check lengths for the caller.
pub mod raw {
    use super::{Communicator, Result};

    pub use oxccl_host::OpDesc;

    /// Runs `ops` on one communicator as one group; returns when their data
    /// has moved. Lengths and ranks are checked (typed errors), the pointers
    /// cannot be.
    ///
    /// # Safety
    /// Every pointer of `ops` valid for its operation (`count` elements of
    /// `dtype`, as the collective's extents need) until this returns.
    pub unsafe fn run(comm: &Communicator, ops: &[OpDesc]) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { comm.run_raw(ops) }
    }

    /// Runs `ops` on several communicators as one group (`ncclGroupEnd`).
    ///
    /// # Safety
    /// As [`run`], for every operation.
    pub unsafe fn run_group(ops: &[(&Communicator, OpDesc)]) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { super::run_group_raw(ops) }
    }
}

/// What the C ABI crate (oxccl-nccl, `libnccl.so.2`) needs beyond the Rust
/// API: the ranks' hosts for its teams, and NCCL's blocking mode. Not part
/// of the Rust API and without its stability.
#[doc(hidden)]
pub mod abi_support {
    use super::{Communicator, Result};

    /// Each rank's host as a number, equal for ranks of one host (the
    /// bootstrap's host hash, which honours `NCCL_HOSTID`). Works on a
    /// revoked communicator.
    pub fn hosts(comm: &Communicator) -> Result<Vec<u64>> {
        comm.hosts()
    }

    /// Whether a communicator's calls block: `NCCL_COMM_BLOCKING` when set,
    /// else what its config asked for (`requested`), else blocking.
    pub fn blocking(requested: Option<bool>) -> bool {
        oxccl_env::params()
            .get(&oxccl_core::params::COMM_BLOCKING)
            .or(requested)
            .unwrap_or(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrink_keeps_the_others_in_parent_order() {
        assert_eq!(shrink_members(5, 0, &[3, 1]).unwrap(), vec![0, 2, 4]);
        // Repeats and order do not matter; nothing excluded keeps everyone.
        assert_eq!(shrink_members(5, 4, &[1, 3, 1]).unwrap(), vec![0, 2, 4]);
        assert_eq!(shrink_members(3, 1, &[]).unwrap(), vec![0, 1, 2]);
        // Every other rank gone: a communicator of one.
        assert_eq!(shrink_members(4, 2, &[0, 1, 3]).unwrap(), vec![2]);
    }

    #[test]
    fn shrink_refuses_a_rank_out_of_range_and_excluding_itself() {
        let e = shrink_members(4, 0, &[1, 4]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(
            e.message().contains("excluded rank 4 is out of range"),
            "{e}"
        );
        assert!(e.message().contains("4 ranks"), "{e}");
        let e = shrink_members(4, 2, &[2]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("this rank (2)"), "{e}");
    }

    #[test]
    fn members_digest_tells_lists_apart() {
        let a = members_digest(&[0, 2, 3]);
        assert_eq!(a, members_digest(&[0, 2, 3]));
        for other in [&[0, 2][..], &[0, 3, 2], &[0, 2, 3, 4], &[1, 2, 3], &[]] {
            assert_ne!(a, members_digest(other), "{other:?}");
        }
    }
}
