//! The CUDA executor's device communicator: a rank's GPU state
//! ([`DevComm`]) that checks a collective into a [`Launch`] and queues it on
//! the caller's stream, and what `oxccl::gpu` asks of CUDA besides (where a
//! pointer lives, the calling thread's current device, `ncclMemAlloc`'s
//! device memory).
//!
//! Contexts: the caller's CUDA runtime keeps its current device as the
//! driver's current context (the device's primary context after
//! `cudaSetDevice` and a first runtime call). oxccl works in the same primary
//! contexts, and every function here that needs a context makes it current
//! through a scope guard (`device::CtxScope`), which puts the caller's context back when it ends,
//! so the runtime's current device never changes under the caller.
//!
//! Two GPUs in one process (nccl-tests `-g 2`, `ncclCommInitAll`): each rank's
//! [`DevComm`] allocates a flags buffer (flags + mailbox, see
//! `kernels/allreduce.cu`) with `cuMemAlloc` at init and joins its *clique* (the
//! ranks of the same communicator created in this process); the member that
//! completes a pair enables peer access both ways. A call launches this rank's
//! half on the caller's stream and returns: the two halves find each other on
//! the GPUs (the n-th call of one rank meets the n-th call of the other), so
//! there is no host synchronisation and no host matching of calls.
//!
//! By concern: [`memory`] (where a pointer lives, `ncclMemAlloc`, IPC of
//! allocations), `group` (a group's launches, one launch for every local
//! rank, the copy-engine pairing), `copy_engine_io` (the copy-engine paths
//! of one process as queued work), `two_process_io` (the copy engines
//! between two processes); the decisions all of them act on are
//! `oxccl_core::gpu`'s.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use oxccl_core::{DataType, Error, ErrorKind, RedOp, Result};

use crate::allreduce::{self, ArArgs, CpArgs, FLAG_BYTES};
use crate::device::CtxScope;
use crate::driver::{self as cu, CUdevice_attribute, CUresult};
use crate::kernels::KernelSource;
use crate::loader::{self, guarded};
use crate::ring::{self, Ring, RingBoot, RingConfig};
use crate::{ce, ce_reduce, compile, kernels};
use oxccl_core::gpu::config::DeviceConfig;
use oxccl_core::gpu::{one_launch, route, two_process, Collective, PairKernel, RingKernel};

mod copy_engine_io;
mod group;
pub mod memory;
mod two_process_io;

pub use group::*;
pub use memory::*;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// True when a CUDA driver with at least one GPU is usable (probed once).
pub fn available() -> bool {
    loader::probe_driver().is_ok()
}

/// One rank's entry in its clique.
#[derive(Clone, Copy, Debug)]
struct Member {
    rank: usize,
    ordinal: i32,
    ctx: usize,
    flags: u64,
}

/// The ranks of one communicator in this process.
#[derive(Default)]
struct Clique {
    members: Vec<Member>,
    /// Whether the members are two ranks on two GPUs (what the in-process
    /// pair kernels and copy engines need), written under the cliques' lock
    /// whenever the members change, read without it by each member's calls
    /// ([`DevComm::use_ring`]).
    pair: Arc<std::sync::atomic::AtomicBool>,
    /// How many ranks are members, and whether they are on more than one
    /// GPU (with peer access between every two: what the one-launch kernel
    /// needs, [`oxccl_core::gpu::one_launch`]), kept as `pair` is.
    local: Arc<Local>,
}

impl Clique {
    fn update_pair(&self) {
        use std::sync::atomic::Ordering::Release;
        let m = &self.members;
        let pair = m.len() == 2 && m[0].ordinal != m[1].ordinal;
        self.pair.store(pair, Release);
        self.local.ranks.store(m.len(), Release);
        let spread = m.iter().any(|x| x.ordinal != m[0].ordinal);
        self.local.spread.store(spread, Release);
    }
}

/// A clique's members as the one-launch kernel asks ([`Clique::local`]).
#[derive(Default, Debug)]
struct Local {
    ranks: std::sync::atomic::AtomicUsize,
    spread: std::sync::atomic::AtomicBool,
}

/// Cliques by key (the communicator's unique id bytes).
fn cliques() -> MutexGuard<'static, HashMap<Vec<u8>, Clique>> {
    static C: OnceLock<Mutex<HashMap<Vec<u8>, Clique>>> = OnceLock::new();
    lock(C.get_or_init(|| Mutex::new(HashMap::new())))
}

/// Enables `from`'s context to read `to`'s memory (once: already enabled is fine).
fn enable_peer(from: &Member, to: &Member) -> Result<()> {
    // Both are valid device ordinals (an ordinal is its device handle).
    let can = guarded("cuDeviceCanAccessPeer", || {
        Ok(cu::device_can_access_peer(from.ordinal, to.ordinal)?)
    })?;
    if !can {
        return Err(Error::new(
            ErrorKind::UnhandledCuda,
            format!(
                "GPU {} cannot access GPU {} (cuDeviceCanAccessPeer = 0: no NVLink/PCIe peer path, or ACS blocks it)",
                from.ordinal, to.ordinal
            ),
        ));
    }
    let _scope = CtxScope::enter(from.ctx as cu::CUcontext)?;
    guarded("cuCtxEnablePeerAccess", || {
        // SAFETY: `from`'s context is current; `to`'s context is retained by its DevComm.
        match unsafe { cu::ctx_enable_peer_access(to.ctx as cu::CUcontext) } {
            Err(e) if e.code == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            r => Ok(r?),
        }
    })
}

/// A kernel loaded in this process (a `CUfunction`; modules stay loaded
/// for the life of the process, so it never dangles), or [`KernelFn::NONE`]
/// where a launch needs none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KernelFn(usize);

impl KernelFn {
    /// No kernel (a send/receive launch whose every peer is this rank).
    const NONE: KernelFn = KernelFn(0);

    /// The driver's handle.
    fn raw(self) -> cu::CUfunction {
        self.0 as cu::CUfunction
    }
}

/// Loaded all-reduce modules, one per device, for the life of the process.
struct Loaded {
    module: usize,
    functions: HashMap<String, usize>,
}

fn modules() -> MutexGuard<'static, HashMap<(i32, &'static str), Loaded>> {
    static M: OnceLock<Mutex<HashMap<(i32, &'static str), Loaded>>> = OnceLock::new();
    lock(M.get_or_init(|| Mutex::new(HashMap::new())))
}

/// One rank's GPU state, by concern: its GPU and context
/// (`GpuContext`), what its launches carry between calls
/// (`LaunchState`), its peers in this process (`InProcessPeers`), the
/// ring path (windows, peers' mappings, network proxies: [`Ring`]), the
/// copy engines (`CopyEngineState`) and the channel with a peer process
/// (`two_process_io`).
#[derive(Debug)]
pub struct DevComm {
    key: Vec<u8>,
    rank: usize,
    nranks: usize,
    /// Its GPU and the primary context it retained.
    gpu: GpuContext,
    /// What its launches carry from one call to the next.
    launches: LaunchState,
    /// Its clique's state that every call reads (the ranks of its
    /// communicator in this process).
    in_process: InProcessPeers,
    /// The ring path ([`DevComm::setup_ring`]): windows, the kernels' peers,
    /// network proxies; unset for a rank that never set it up (one rank, or
    /// ranks without GPUs).
    ring: OnceLock<std::result::Result<Ring, Error>>,
    /// Every operation with peers takes the ring path (NCCL_P2P_DISABLE=1,
    /// `NCCL_ALGO` without OneShot/TwoShot, or `OXCCL_CUDA_RING=1`: see
    /// `RingConfig::force`).
    ring_only: std::sync::atomic::AtomicBool,
    /// The settings read from the parameters when it was created (the
    /// small kernel, the one-launch kernel, the pair kernels' blocks, the
    /// copy engines' bounds).
    config: DeviceConfig,
    /// The copy engines' streams and scratch in this process.
    copy_engines: CopyEngineState,
    /// The copy-engine channel with a peer in another process of this host
    /// (2 ranks; set up with the ring: [`two_process`]).
    two_process: OnceLock<two_process_io::TwoProcessChannel>,
    /// The communicator's tuner plugin (`NCCL_TUNER_PLUGIN`), which has a
    /// say on ring collectives ([`oxccl_core::gpu::tuning`]).
    tuner: OnceLock<Tuner>,
}

/// Ring launches whose kernel a tuner plugin's answer chose, by
/// [`RingKernel::mode`] (for tests: which kernel the plugin's choice ran).
static TUNED_CALLS: [std::sync::atomic::AtomicU64; RingKernel::ALL.len()] =
    [const { std::sync::atomic::AtomicU64::new(0) }; RingKernel::ALL.len()];

/// Ring launches in this process whose kernel, `kernel`, a tuner plugin's
/// answer chose.
pub fn tuned_calls(kernel: RingKernel) -> u64 {
    TUNED_CALLS
        .get(kernel.mode() as usize)
        .map_or(0, |n| n.load(std::sync::atomic::Ordering::Relaxed))
}

/// A tuner plugin's context as the GPU path asks it.
pub type Tuner = std::sync::Arc<std::sync::Mutex<oxccl_net::tuner::TunerComm>>;

/// A rank's GPU: its ordinal, device and primary context (retained by
/// [`DevComm::new`], released by its drop).
#[derive(Debug)]
struct GpuContext {
    ordinal: i32,
    dev: cu::CUdevice,
    ctx: cu::CUcontext,
}

/// What a rank's launches carry from one call to the next: the pair
/// kernels' flags, the barrier sequence, and what a call looked up once.
#[derive(Debug)]
struct LaunchState {
    /// The pair kernels' flags buffer (flags + mailbox, zeroed; see
    /// `kernels/allreduce.cu`), from `cuMemAlloc`.
    flags: u64,
    /// The first barrier value of the next call (only grows).
    seq: Mutex<u64>,
    /// The event that orders the ranks' streams around a one-launch kernel
    /// ([`enqueue_one_launch`]; 0: not created yet).
    one_launch_event: Mutex<usize>,
    /// The last stream found to belong to this communicator's context
    /// (calls on one stream, the usual case, ask the driver once; a
    /// destroyed stream's handle reused on another context is caught by
    /// the launch itself, as an error).
    checked_stream: std::sync::atomic::AtomicUsize,
    /// The typed kernels this communicator launched, by (family, type, op)
    /// ([`typed_slot`]; 0: not looked up yet). A call then skips the kernel
    /// name's formatting and the process-wide module table (lock, string
    /// hashing), part of the 0.77 us that preparing a launch took of the
    /// 1.84 us a call spent before its launch (2xH200, a host profile,
    /// 2026-11-30; the lookup's own share was not measured apart).
    typed: [std::sync::atomic::AtomicUsize; TYPED_SLOTS],
}

impl LaunchState {
    /// Frees the flags buffer and destroys the one-launch event.
    ///
    /// # Safety
    /// This rank's context is current and synchronised, nothing queued uses
    /// them any more, and this runs once (the communicator's drop).
    unsafe fn release(&self) {
        // SAFETY: the caller's contract.
        unsafe {
            let _ = cu::mem_free(self.flags);
            let e = std::mem::take(&mut *lock(&self.one_launch_event));
            if e != 0 {
                let _ = cu::event_destroy(e as cu::CUevent);
            }
        }
    }
}

/// A rank's view of its clique (the ranks of its communicator in this
/// process), shared with the clique table.
#[derive(Debug, Default)]
struct InProcessPeers {
    /// Whether both ranks are in this process on two GPUs (its clique's
    /// `pair`): a call asks this instead of the process-wide clique table,
    /// whose lock and hash of the 128-byte key cost ~0.1 us of the ~1 us a
    /// call spent around its launch (one H200, 2026-12-01).
    pair: Arc<std::sync::atomic::AtomicBool>,
    /// Its clique's ranks in this process and their GPUs (`local`).
    local: Arc<Local>,
}

/// The copy engines' state of a rank (created at first use, freed with
/// the communicator).
#[derive(Debug)]
struct CopyEngineState {
    /// The copy-engine path's side streams and their fork/join events
    /// (see [`crate::ce`]).
    side: Mutex<[Option<CeSide>; 2]>,
    /// The copy-engine reduction's scratch ring and flags
    /// ([`ce_reduce::SCRATCH_BYTES`], 256 MiB + 256 B of this GPU's memory).
    scratch: Mutex<Option<u64>>,
}

/// A non-blocking stream of this rank's context for the local copies of a
/// copy-engine call, and the two events that fork it from the caller's
/// stream and join it back (raw driver handles).
#[derive(Debug, Clone, Copy)]
struct CeSide {
    stream: usize,
    fork: usize,
    join: usize,
}

// SAFETY: the handles are process-wide driver objects; every use makes the
// context current on the calling thread first (CtxScope), and the sequence
// counter is behind a mutex.
unsafe impl Send for DevComm {}
// SAFETY: as above.
unsafe impl Sync for DevComm {}

/// What a launch needs, checked; [`Launch::enqueue`] queues it on the stream.
#[derive(Debug)]
pub struct Launch {
    comm: Arc<DevComm>,
    kind: LaunchKind,
    stream: usize,
    /// The collective as NCCL's TUNING line names it, and its bytes (count
    /// times the type's size; per rank for all-gather and reduce-scatter).
    what: Option<(&'static str, u64)>,
    /// This rank's side of the call as the one-launch kernel would take it
    /// with the other ranks' ([`launch_all`], [`one_launch`]).
    one_launch: Option<one_launch::RankCall>,
}

#[derive(Debug)]
enum LaunchKind {
    /// Nothing to do (count 0, or one rank in place).
    Nothing,
    /// One rank, out of place: a device-to-device copy.
    Copy { dst: u64, src: u64, bytes: usize },
    /// One rank, PreMulSum: `oxccl_scale_*` (the output is the input times
    /// the scalar).
    Scale {
        f: KernelFn,
        blocks: u32,
        args: ring::RingArgs,
    },
    /// This rank's half of a reducing kernel; `ce`: the call as the
    /// copy-engine reduction would take it (an all-reduce or reduce-scatter
    /// with an op it does), for the pairing in [`launch_all`].
    Half {
        f: KernelFn,
        blocks: u32,
        budget: u64,
        args: ArArgs,
        ce: Option<ce_reduce::Call>,
    },
    /// This rank's half of the copy kernel.
    Pcopy {
        f: KernelFn,
        blocks: u32,
        args: CpArgs,
    },
    /// A ring collective.
    Ring {
        f: KernelFn,
        /// The kernel [`ring::plan`] chose (`args.mode` is its integer).
        kernel: RingKernel,
        blocks: u32,
        args: ring::RingArgs,
        /// The call as the copy engines with a peer process would take it
        /// ([`DevComm::enqueue_two_process`]; the kernel runs it when they do not).
        two_process: Option<two_process::Call>,
    },
    /// A copy-engine call (paired with the peer's by [`launch_all`]): a
    /// barrier (`f` is `oxccl_pcopy`, copying nothing), the plan's copies,
    /// a second barrier.
    Ce { f: KernelFn, plan: ce::Plan },
    /// A copy-engine reduction (paired with the peer's by [`launch_all`]):
    /// `f` is `oxccl_pcopy` (the barriers), `fr` the reduce kernel.
    CeReduce {
        f: KernelFn,
        fr: KernelFn,
        plan: ce_reduce::RankPlan,
    },
    /// Sends and receives `(peer, pointer, bytes)`; `f` is `oxccl_pcopy`
    /// (0 when every peer is this rank).
    P2p {
        f: KernelFn,
        sends: Vec<(usize, u64, usize)>,
        recvs: Vec<(usize, u64, usize)>,
    },
}

impl DevComm {
    /// Sets up rank `rank` of `nranks` on GPU `ordinal` and joins the clique
    /// `key`: retains the primary context, allocates and zeroes the flags,
    /// and enables peer access with every member already there.
    pub fn new(ordinal: i32, key: &[u8], rank: usize, nranks: usize) -> Result<Arc<DevComm>> {
        let info = loader::driver()?;
        if ordinal < 0 || ordinal as usize >= info.devices {
            return Err(Error::invalid_argument(format!(
                "GPU {ordinal} does not exist ({} visible)",
                info.devices
            )));
        }
        let (dev, ctx) = guarded("cuDevicePrimaryCtxRetain", || {
            // The driver was probed.
            let dev = cu::device_get(ordinal)?;
            let ctx = cu::primary_ctx_retain(dev)?;
            Ok((dev, ctx))
        })?;
        let mut me = DevComm {
            key: key.to_vec(),
            rank,
            nranks,
            gpu: GpuContext { ordinal, dev, ctx },
            launches: LaunchState {
                flags: 0,
                seq: Mutex::new(1),
                one_launch_event: Mutex::new(0),
                checked_stream: std::sync::atomic::AtomicUsize::new(0),
                typed: std::array::from_fn(|_| std::sync::atomic::AtomicUsize::new(0)),
            },
            in_process: InProcessPeers::default(),
            ring: OnceLock::new(),
            tuner: OnceLock::new(),
            ring_only: std::sync::atomic::AtomicBool::new(false),
            config: DeviceConfig::from_params(oxccl_env::params()),
            copy_engines: CopyEngineState {
                side: Mutex::new([None; 2]),
                scratch: Mutex::new(None),
            },
            two_process: OnceLock::new(),
        };
        {
            let _scope = CtxScope::enter(ctx)?;
            // The whole flag buffer starts at zero (barrier values only grow).
            let flags = alloc_zeroed(FLAG_BYTES, 0, FLAG_BYTES, "flags")?;
            me.launches.flags = flags;
        } // Drop of `me` from here on frees the flags and releases the context.
        let m = Member {
            rank,
            ordinal,
            ctx: ctx as usize,
            flags: me.launches.flags,
        };
        let joined = {
            let mut cl = cliques();
            let clique = cl.entry(me.key.clone()).or_default();
            let mut r = Ok(());
            if clique.members.iter().any(|x| x.rank == rank) {
                r = Err(Error::invalid_usage(format!(
                    "rank {rank} of this communicator was already created in this process"
                )));
            }
            for other in clique.members.iter() {
                if r.is_ok() && other.ordinal != ordinal {
                    r = enable_peer(&m, other).and_then(|_| enable_peer(other, &m));
                }
            }
            if r.is_ok() {
                clique.members.push(m);
                clique.update_pair();
                me.in_process.pair = clique.pair.clone();
                me.in_process.local = clique.local.clone();
            }
            r
        }; // the clique lock is released before `me` can drop
        joined.map(|_| Arc::new(me))
    }

    /// A stream of another context (another GPU's) is refused here, by
    /// name, instead of failing inside cuLaunchKernel. The legacy and
    /// per-thread default streams (0, 1, 2) belong to whatever is current.
    fn check_stream(&self, stream: usize) -> Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        if stream <= 2 || self.launches.checked_stream.load(Relaxed) == stream {
            return Ok(());
        }
        let r = guarded("cuStreamGetCtx", || {
            // SAFETY: the caller's stream handle.
            Ok(unsafe { cu::stream_get_ctx(stream as cu::CUstream) }?)
        });
        match r {
            Ok(ctx) if !ctx.is_null() && ctx != self.gpu.ctx => {
                Err(Error::invalid_argument(format!(
                    "stream {stream:#x} belongs to another CUDA context than this communicator's \
                 (GPU {}): pass a stream created on GPU {}",
                    self.gpu.ordinal, self.gpu.ordinal
                )))
            }
            Ok(_) => {
                self.launches.checked_stream.store(stream, Relaxed);
                Ok(())
            }
            Err(e) => Err(Error::invalid_argument(format!(
                "stream {stream:#x} is not a usable CUDA stream: {}",
                e.message()
            ))),
        }
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.gpu.ordinal
    }

    /// The peer rank's entry, for two ranks in this process.
    fn peer(&self) -> Result<Member> {
        let cl = cliques();
        let members = cl
            .get(&self.key)
            .map(|c| c.members.as_slice())
            .unwrap_or(&[]);
        let Some(p) = members.iter().find(|m| m.rank != self.rank) else {
            return Err(Error::invalid_usage(format!(
                "device buffers across processes are not supported by oxccl yet: rank {} of this \
                 2-rank communicator is not in this process (CUDA IPC is not done; use host \
                 buffers, or one process driving both GPUs)",
                1 - self.rank
            )));
        };
        if p.ordinal == self.gpu.ordinal {
            return Err(Error::invalid_usage(format!(
                "both ranks of this communicator use GPU {}: two ranks on one GPU are not \
                 supported by oxccl's GPU path yet",
                self.gpu.ordinal
            )));
        }
        Ok(*p)
    }

    /// Loads (once per device) the all-reduce module and returns kernel `name`.
    /// `load()`'s kernel for (`family`, `t`, `op`), looked up once per
    /// communicator (see `typed`).
    fn typed_function(
        &self,
        family: Family,
        t: DataType,
        op: RedOp,
        load: impl FnOnce() -> Result<KernelFn>,
    ) -> Result<KernelFn> {
        use std::sync::atomic::Ordering::Relaxed;
        let slot = &self.launches.typed[typed_slot(family, t, op)];
        match slot.load(Relaxed) {
            0 => {
                let f = load()?;
                slot.store(f.0, Relaxed);
                Ok(f)
            }
            f => Ok(KernelFn(f)),
        }
    }

    fn function(&self, name: &str) -> Result<KernelFn> {
        self.function_in(&kernels::ALLREDUCE, name)
    }

    /// Loads (once per device) the module of `src` and returns kernel `name`.
    fn function_in(&self, src: &KernelSource, name: &str) -> Result<KernelFn> {
        let mut mods = modules();
        let key = (self.gpu.ordinal, src.name);
        let first_on_device = !mods.keys().any(|(o, _)| *o == self.gpu.ordinal);
        if let std::collections::hash_map::Entry::Vacant(slot) = mods.entry(key) {
            let arch = guarded("cuDeviceGetAttribute", || {
                let major = cu::device_attribute(
                    self.gpu.dev,
                    CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                )?;
                let minor = cu::device_attribute(
                    self.gpu.dev,
                    CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                )?;
                Ok((major * 10 + minor) as u32)
            })?;
            let img = compile::compile(src, arch)?;
            // The table outlives every communicator, so it holds the device's
            // primary context for the process (the CUDA runtime does the same):
            // when the last holder released it, the driver reset the context,
            // its modules went with it and the next communicator's launches of
            // these cached handles failed with CUDA_ERROR_INVALID_HANDLE. The
            // retain is never released.
            if first_on_device {
                guarded("cuDevicePrimaryCtxRetain", || {
                    cu::primary_ctx_retain(self.gpu.dev).map_err(Into::into)
                })?;
            }
            let _scope = CtxScope::enter(self.gpu.ctx)?;
            let module = guarded("cuModuleLoadData", || {
                // SAFETY: a complete CUBIN that outlives the call; our context is current.
                Ok(unsafe { cu::module_load_data(&img.image) }?)
            })?;
            slot.insert(Loaded {
                module: module as usize,
                functions: HashMap::new(),
            });
        }
        let l = mods
            .get_mut(&key)
            .ok_or_else(|| Error::internal("module table"))?;
        if let Some(f) = l.functions.get(name) {
            return Ok(KernelFn(*f));
        }
        let c = std::ffi::CString::new(name)
            .map_err(|_| Error::invalid_argument("NUL in a kernel name"))?;
        let f = guarded("cuModuleGetFunction", || {
            // SAFETY: the module is loaded (never unloaded).
            unsafe { cu::module_get_function(l.module as cu::CUmodule, &c) }
                .map(|f| f as usize)
                .map_err(|e| e.context(&format!("cuModuleGetFunction({name})")))
        })?;
        l.functions.insert(name.to_string(), f);
        Ok(KernelFn(f))
    }

    fn launch(self: &Arc<Self>, kind: LaunchKind, stream: usize) -> Result<Launch> {
        self.check_stream(stream)?;
        Ok(Launch {
            comm: self.clone(),
            kind,
            stream,
            what: None,
            one_launch: None,
        })
    }

    /// Checks an all-reduce of `count` elements of `t` from `send` to `recv`
    /// (device pointers of this rank's GPU) on `stream`, and prepares its
    /// launch. Nothing is launched and no barrier value is taken, so a group
    /// can check all its operations before launching any.
    pub fn prepare_all_reduce(
        self: &Arc<Self>,
        send: u64,
        recv: u64,
        count: usize,
        t: DataType,
        op: RedOp,
        stream: usize,
    ) -> Result<Launch> {
        self.prepare_reduce(Reduction::AllReduce, send, recv, count, t, op, None, stream)
    }

    /// A reducing collective (all-reduce, reduce-scatter with `count`
    /// elements per rank, reduce to a root) on device buffers; `scalar_ptr`:
    /// a PreMulSum's device-resident scalar (then `op`'s scalar is ignored).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_reduce(
        self: &Arc<Self>,
        what: Reduction,
        send: u64,
        recv: u64,
        count: usize,
        t: DataType,
        op: RedOp,
        scalar_ptr: Option<u64>,
        stream: usize,
    ) -> Result<Launch> {
        let name = match what {
            Reduction::AllReduce => "AllReduce",
            Reduction::ReduceScatter => "ReduceScatter",
            Reduction::Reduce { .. } => "Reduce",
        };
        let mut l = self.prepare_reduction(what, send, recv, count, t, op, scalar_ptr, stream)?;
        let root = what.root();
        let output = if what.collective() == Collective::Reduce && root != self.rank {
            0
        } else {
            recv
        };
        l.one_launch = self.one_launch_call(
            what.collective(),
            t,
            op,
            count as u64,
            root,
            send,
            output,
            scalar_ptr,
            stream,
        );
        Ok(l.labeled(name, (count as u64).saturating_mul(t.size() as u64)))
    }

    /// This rank's side of a call for the one-launch kernel of every rank
    /// ([`oxccl_core::gpu::one_launch`]), when this communicator and the call allow it.
    #[allow(clippy::too_many_arguments)]
    fn one_launch_call(
        &self,
        collective: Collective,
        t: DataType,
        op: RedOp,
        count: u64,
        root: usize,
        input: u64,
        output: u64,
        scalar_ptr: Option<u64>,
        stream: usize,
    ) -> Option<one_launch::RankCall> {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        let bytes = one_launch::largest_buffer(collective, count, t.size() as u64, self.nranks);
        let eligibility = one_launch::Eligibility {
            nranks: self.nranks,
            local_ranks: self.in_process.local.ranks.load(Acquire),
            spread: self.in_process.local.spread.load(Acquire),
            peers: self.config.one_launch_peers,
            ring_only: self.ring_only.load(Relaxed),
            max: self.config.one_launch_max,
        };
        let ce = one_launch::ce_bound(collective, self.config.ce_min, self.config.ce_ar_min());
        // Captured calls never (one_launch::may_take says why); asked last.
        if !one_launch::may_take(&eligibility, bytes, ce) || capturing(stream) {
            return None;
        }
        // As the ring's arguments (Ring::args): float avg pre-multiplies by
        // 1/nranks, PreMulSum by the rank's own scalar.
        let (scale, iscale) = match op {
            RedOp::PreMulSum(s) => (s.as_f64(), s.as_u64_bits()),
            _ => (1.0 / self.nranks as f64, 0),
        };
        Some(one_launch::RankCall {
            collective,
            count,
            root: root as u32,
            dtype: t,
            op,
            input,
            output,
            scale,
            iscale,
            scalar_ptr: scalar_ptr.unwrap_or(0),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare_reduction(
        self: &Arc<Self>,
        what: Reduction,
        send: u64,
        recv: u64,
        count: usize,
        t: DataType,
        op: RedOp,
        scalar_ptr: Option<u64>,
        stream: usize,
    ) -> Result<Launch> {
        let bytes = count
            .checked_mul(t.size())
            .ok_or_else(|| Error::invalid_argument(format!("count {count} is too large")))?;
        if count == 0 {
            return self.launch(LaunchKind::Nothing, stream);
        }
        let root = what.root();
        let in_bytes = match what {
            Reduction::ReduceScatter => bytes.saturating_mul(self.nranks),
            Reduction::AllReduce | Reduction::Reduce { .. } => bytes,
        };
        let rs_inplace = what == Reduction::ReduceScatter
            && recv == send.wrapping_add((self.rank * bytes) as u64);
        if send != recv
            && !rs_inplace
            && send.checked_add(in_bytes as u64).is_some_and(|e| recv < e)
            && recv.checked_add(bytes as u64).is_some_and(|e| send < e)
        {
            return Err(Error::invalid_argument(
                "sendbuff and recvbuff overlap without being the same buffer",
            ));
        }
        let nonroot_reduce = matches!(what, Reduction::Reduce { root } if root != self.rank);
        match self.nranks {
            1 if scalar_ptr.is_some() || matches!(op, RedOp::PreMulSum(_)) => {
                // out = in x scalar, in NCCL's rounding (the scalar in the
                // accumulation type, one product per element).
                let f = self.typed_function(Family::Scale, t, op, || {
                    self.function_in(
                        &kernels::ring_variant(t, op),
                        &ring::scale_kernel_name(t, op),
                    )
                })?;
                let (scale, iscale) = match op {
                    RedOp::PreMulSum(s) => (s.as_f64(), s.as_u64_bits()),
                    _ => (1.0, 1),
                };
                let args = ring::scale_args(
                    send,
                    recv,
                    count as u64,
                    scale,
                    iscale,
                    scalar_ptr.unwrap_or(0),
                );
                self.launch(
                    LaunchKind::Scale {
                        f,
                        blocks: ring::scale_blocks(count as u64),
                        args,
                    },
                    stream,
                )
            }
            1 if send == recv => self.launch(LaunchKind::Nothing, stream),
            1 => self.launch(
                LaunchKind::Copy {
                    dst: recv,
                    src: send,
                    bytes,
                },
                stream,
            ),
            _ if self.ring_for(stream)
                || (what == Reduction::AllReduce && self.one_shot_on_ring(bytes as u64)) =>
            {
                let out = if nonroot_reduce { 0 } else { recv };
                let mut l = self.ring_launch(
                    what.collective(),
                    t,
                    op,
                    send,
                    out,
                    count,
                    bytes as u64,
                    root,
                    scalar_ptr,
                    stream,
                )?;
                let coll = match what {
                    Reduction::AllReduce => Some(two_process::Coll::AllReduce),
                    Reduction::ReduceScatter => Some(two_process::Coll::ReduceScatter),
                    Reduction::Reduce { .. } => None,
                };
                if let (Some(coll), Some(op), None) = (coll, ce_reduce::Op::of(op), scalar_ptr) {
                    l.set_two_process_call(two_process::Call {
                        coll,
                        count: count as u64,
                        dtype: t,
                        op,
                        input: send,
                        output: recv,
                    });
                }
                Ok(l)
            }
            2 => {
                let peer = self.peer()?;
                let f = self.typed_function(Family::Pair, t, op, || {
                    let name = allreduce::kernel_name(t, op).ok_or_else(|| {
                        Error::invalid_usage(format!("no GPU kernel for op {}", op.name()))
                    })?;
                    self.function(&name)
                })?;
                let (blocks, budget) =
                    allreduce::reduce_grid(count as u64, t, self.config.pair_blocks);
                let kernel = PairKernel::of(what.collective());
                let mut args =
                    self.reduce_args(send, recv, count, peer.flags, op, scalar_ptr, kernel);
                args.root = root as u32;
                if nonroot_reduce {
                    args.output = 0;
                }
                let kind = match what {
                    Reduction::AllReduce => Some(ce_reduce::Kind::AllReduce),
                    Reduction::ReduceScatter => Some(ce_reduce::Kind::ReduceScatter),
                    Reduction::Reduce { .. } => None,
                };
                let ce = match (kind, ce_reduce::Op::of(op), scalar_ptr) {
                    (Some(kind), Some(op), None) => Some(ce_reduce::Call {
                        kind,
                        input: send,
                        output: recv,
                        count: count as u64,
                        dtype: t,
                        op,
                    }),
                    _ => None,
                };
                self.launch(
                    LaunchKind::Half {
                        f,
                        blocks,
                        budget,
                        args,
                        ce,
                    },
                    stream,
                )
            }
            n => Err(too_many(n)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce_args(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        peer_flags: u64,
        op: RedOp,
        scalar_ptr: Option<u64>,
        kernel: PairKernel,
    ) -> ArArgs {
        let mut args = ArArgs::all_reduce(
            send,
            recv,
            self.launches.flags,
            peer_flags,
            count as u64,
            self.rank as u32,
        );
        allreduce::set_scalar(&mut args, op);
        args.scalar_ptr = scalar_ptr.unwrap_or(0);
        args.mode = kernel.mode();
        if kernel == PairKernel::AllReduce && self.config.pair_two_shot(count as u64) {
            args.bits |= allreduce::BIT_TWO_SHOT;
        }
        args
    }

    /// A copying collective on device buffers: all-gather (`bytes` per
    /// rank) or broadcast from `root` (`bytes` in all).
    pub fn prepare_copy(
        self: &Arc<Self>,
        what: CopyKind,
        send: u64,
        recv: u64,
        bytes: usize,
        stream: usize,
    ) -> Result<Launch> {
        let name = match what {
            CopyKind::AllGather => "AllGather",
            CopyKind::Broadcast { .. } => "Broadcast",
        };
        let mut l = self.prepare_copying(what, send, recv, bytes, stream)?;
        let root = what.root();
        l.one_launch = self.one_launch_call(
            what.collective(),
            DataType::Uint8,
            RedOp::Sum,
            bytes as u64,
            root,
            send,
            recv,
            None,
            stream,
        );
        Ok(l.labeled(name, bytes as u64))
    }

    fn prepare_copying(
        self: &Arc<Self>,
        what: CopyKind,
        send: u64,
        recv: u64,
        bytes: usize,
        stream: usize,
    ) -> Result<Launch> {
        if bytes == 0 {
            return self.launch(LaunchKind::Nothing, stream);
        }
        let (kernel, root) = (PairKernel::of(what.collective()), what.root());
        match self.nranks {
            1 if send == recv => self.launch(LaunchKind::Nothing, stream),
            1 => self.launch(
                LaunchKind::Copy {
                    dst: recv,
                    src: send,
                    bytes,
                },
                stream,
            ),
            _ if self.ring_for(stream) => {
                let (t, count) = copy_elements(bytes, send, recv);
                let mut l = self.ring_launch(
                    what.collective(),
                    t,
                    RedOp::Sum,
                    send,
                    recv,
                    count,
                    bytes as u64,
                    root,
                    None,
                    stream,
                )?;
                let coll = match what {
                    CopyKind::AllGather => two_process::Coll::AllGather,
                    CopyKind::Broadcast { root } => {
                        two_process::Coll::Broadcast { root: root as u32 }
                    }
                };
                l.set_two_process_call(two_process::Call {
                    coll,
                    count: bytes as u64,
                    dtype: DataType::Uint8,
                    op: ce_reduce::Op::Sum,
                    input: send,
                    output: recv,
                });
                Ok(l)
            }
            2 => {
                let peer = self.peer()?;
                let f = self.function("oxccl_pcopy")?;
                let blocks = allreduce::copy_blocks(bytes as u64, self.config.pair_blocks);
                self.launch(
                    LaunchKind::Pcopy {
                        f,
                        blocks,
                        args: CpArgs {
                            input: send,
                            output: recv,
                            my_flags: self.launches.flags,
                            peer_flags: peer.flags,
                            bytes: bytes as u64,
                            seq: 0,
                            mode: kernel.mode(),
                            rank: self.rank as u32,
                            root: root as u32,
                            pad: 0,
                            ..Default::default()
                        },
                    },
                    stream,
                )
            }
            n => Err(too_many(n)),
        }
    }

    /// Point-to-point operations of this rank (sends and receives, each
    /// `(peer rank, device pointer, bytes)`), launched together: the i-th
    /// send to a peer meets the peer's i-th receive from this rank. Inside a
    /// group, [`launch_all`] merges every p2p launch of a communicator into one.
    pub fn prepare_p2p(
        self: &Arc<Self>,
        sends: Vec<(usize, u64, usize)>,
        recvs: Vec<(usize, u64, usize)>,
        stream: usize,
    ) -> Result<Launch> {
        for &(p, _, _) in sends.iter().chain(recvs.iter()) {
            if p >= self.nranks {
                return Err(Error::invalid_argument(format!("peer {p} does not exist")));
            }
        }
        let ring = self.ring_for(stream);
        if self.nranks > 2 && !ring {
            return Err(too_many(self.nranks));
        }
        let f = if sends.iter().chain(recvs.iter()).any(|x| x.0 != self.rank) {
            if ring {
                self.ring()?;
                self.function_in(&kernels::ring_p2p(), "oxccl_ring_p2p")?
            } else {
                self.peer()?;
                self.function("oxccl_pcopy")?
            }
        } else {
            KernelFn::NONE
        };
        self.launch(LaunchKind::P2p { f, sends, recvs }, stream)
    }
}

/// Whether `stream` is capturing into a CUDA graph (false for the legacy
/// stream, which cannot capture, and when the driver cannot tell).
fn capturing(stream: usize) -> bool {
    if stream == 0 {
        return false;
    }
    matches!(
        guarded("cuStreamIsCapturing", || {
            // SAFETY: a stream handle of the caller's.
            Ok(unsafe { cu::stream_is_capturing(stream as cu::CUstream) }?)
        }),
        Ok(cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
    )
}

/// The element type a copying collective of `bytes` per rank moves through
/// the ring: 8-byte words when the size and both buffers allow, else bytes.
/// (The LL kernels move a line's 8 bytes element by element: as bytes, 8
/// loads and 8 stores; as one word, 1 of each. The Simple ring packs 16
/// bytes either way.)
pub fn copy_elements(bytes: usize, send: u64, recv: u64) -> (DataType, usize) {
    if bytes % 8 == 0 && send % 8 == 0 && recv % 8 == 0 {
        (DataType::Uint64, bytes / 8)
    } else {
        (DataType::Uint8, bytes)
    }
}

fn too_many(n: usize) -> Error {
    Error::invalid_usage(format!(
        "device buffers on a communicator of {n} ranks are not supported by oxccl yet \
         (the GPU path covers 1 or 2 ranks in one process)"
    ))
}

/// Which reducing collective ([`DevComm::prepare_reduce`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// All-reduce.
    AllReduce,
    /// Reduce-scatter (`count` per rank).
    ReduceScatter,
    /// Reduce to `root`.
    Reduce {
        /// The rank that gets the result.
        root: usize,
    },
}

impl Reduction {
    /// The collective.
    pub fn collective(self) -> Collective {
        match self {
            Reduction::AllReduce => Collective::AllReduce,
            Reduction::ReduceScatter => Collective::ReduceScatter,
            Reduction::Reduce { .. } => Collective::Reduce,
        }
    }

    /// The root rank (0 where the collective has none).
    pub fn root(self) -> usize {
        match self {
            Reduction::Reduce { root } => root,
            _ => 0,
        }
    }
}

/// Which copying collective ([`DevComm::prepare_copy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// All-gather.
    AllGather,
    /// Broadcast from `root`.
    Broadcast {
        /// The rank whose send buffer is copied.
        root: usize,
    },
}

impl CopyKind {
    /// The collective.
    pub fn collective(self) -> Collective {
        match self {
            CopyKind::AllGather => Collective::AllGather,
            CopyKind::Broadcast { .. } => Collective::Broadcast,
        }
    }

    /// The root rank (0 where the collective has none).
    pub fn root(self) -> usize {
        match self {
            CopyKind::Broadcast { root } => root,
            CopyKind::AllGather => 0,
        }
    }
}

/// What a launch tells a profiler plugin about the work it queues
/// ([`Launch::profile`]): the algorithm and protocol names (NCCL's where
/// the GPU path runs NCCL's algorithm, oxccl's own otherwise: `Pair` for
/// the two-GPU kernels, `CopyEngine` for the copy engines), the thread
/// blocks it launches (NCCL's channels) and the warps of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchProfile {
    pub algo: &'static std::ffi::CStr,
    pub proto: &'static std::ffi::CStr,
    pub blocks: u32,
    pub warps: u32,
    /// Whether the stream is capturing into a CUDA graph.
    pub graph_captured: bool,
}

impl Launch {
    /// What this launch runs, for a profiler's descriptor: the kernel it
    /// was planned with, before a group pairs it for the copy engines or
    /// joins it into one launch with other ranks' calls (a ring call that
    /// the copy engines with a peer process take at launch reports its
    /// ring kernel). Asks the driver whether the stream is capturing:
    /// called only when a profiler is loaded.
    pub fn profile(&self) -> LaunchProfile {
        use oxccl_core::profiler_plugin::{algo_name, proto_name};
        let warps = |blocks: u32, threads: u32| if blocks == 0 { 0 } else { threads / 32 };
        let (algo, proto, blocks, threads) = match &self.kind {
            // Nothing, or one rank's copy: no kernel (NCCL too runs a
            // lone rank's call as a ring of one).
            LaunchKind::Nothing | LaunchKind::Copy { .. } => (c"Ring", c"Simple", 1, 0),
            LaunchKind::Scale { blocks, .. } => {
                (c"Ring", c"Simple", *blocks, oxccl_core::gpu::ring::THREADS)
            }
            LaunchKind::Half { blocks, .. } | LaunchKind::Pcopy { blocks, .. } => {
                (c"Pair", c"Simple", *blocks, oxccl_core::gpu::pair::THREADS)
            }
            LaunchKind::Ring { kernel, blocks, .. } => (
                algo_name(kernel.algorithm()),
                proto_name(kernel.protocol()),
                *blocks,
                oxccl_core::gpu::ring::THREADS,
            ),
            LaunchKind::Ce { .. } => (c"CopyEngine", c"Simple", 1, 0),
            LaunchKind::CeReduce { .. } => (
                c"CopyEngine",
                c"Simple",
                allreduce::CER_BLOCKS,
                oxccl_core::gpu::pair::THREADS,
            ),
            LaunchKind::P2p { sends, recvs, .. } => {
                // The most channels any of its transfers with another rank
                // takes (a copy to itself runs beside them, on one).
                let ring = self.comm.ring().ok();
                let nch = sends
                    .iter()
                    .chain(recvs)
                    .filter(|x| x.0 != self.comm.rank && x.2 > 0)
                    .map(|x| ring.map_or(1, |r| r.p2p_op_channels(x.2)))
                    .max()
                    .unwrap_or(1);
                (c"Ring", c"Simple", nch, oxccl_core::gpu::ring::THREADS)
            }
        };
        LaunchProfile {
            algo,
            proto,
            blocks,
            warps: warps(blocks, threads),
            graph_captured: capturing(self.stream),
        }
    }

    /// The `CUstream` this launch is queued on.
    pub fn stream(&self) -> usize {
        self.stream
    }
}

impl Launch {
    /// Launches on the stream (this rank's context made current for the
    /// call); returns without waiting for the GPU.
    pub fn enqueue(self) -> Result<()> {
        let c = &self.comm;
        let stream = self.stream as cu::CUstream;
        let tune =
            |algo: &str, proto: &str, blocks: u32| c.log_tuning(self.what, algo, proto, blocks);
        match &self.kind {
            LaunchKind::Half { blocks, .. } | LaunchKind::Pcopy { blocks, .. } => {
                tune("Pair", "Simple", *blocks)
            }
            LaunchKind::Ring {
                kernel,
                blocks,
                two_process: None,
                ..
            } => {
                let (algo, proto) = kernel.tuning_names();
                tune(algo, proto, *blocks)
            }
            LaunchKind::Ce { .. } => tune("CopyEngine", "Simple", 0),
            LaunchKind::CeReduce { .. } => tune("CopyEngine", "Simple", allreduce::CER_BLOCKS),
            // Copies of one rank, sends and receives (NCCL prints no line
            // for them), and rings that may take the engines (below).
            _ => {}
        }
        match self.kind {
            LaunchKind::Nothing => Ok(()),
            LaunchKind::Copy { dst, src, bytes } => {
                let _scope = CtxScope::enter(c.gpu.ctx)?;
                guarded("cuMemcpyDtoDAsync", || {
                    // SAFETY: both ranges are device memory of this GPU (checked by the caller).
                    Ok(unsafe { cu::memcpy_dtod_async(dst, src, bytes, stream) }?)
                })
            }
            LaunchKind::Scale { f, blocks, args } => {
                let _scope = CtxScope::enter(c.gpu.ctx)?;
                // SAFETY: the buffers were checked to be this GPU's device
                // memory of `count` elements; the kernel reads only the
                // buffers and the scalar fields of `args`.
                unsafe { ring::launch_ring(f.raw(), blocks, stream, args, c.may_pdl(blocks)) }
            }
            LaunchKind::Half {
                f,
                blocks,
                budget,
                mut args,
                ..
            } => {
                let _scope = CtxScope::enter(c.gpu.ctx)?;
                let mut seq = lock(&c.launches.seq);
                args.seq = *seq;
                // SAFETY: the pointers were checked to be this GPU's device
                // memory, the flags are both ranks' FLAG_BYTES buffers with
                // peer access enabled at init, and the peer's n-th call
                // computes the same grid and sequence from the same count/type.
                unsafe { allreduce::launch_half(f.raw(), blocks, stream, args)? };
                *seq += budget;
                Ok(())
            }
            LaunchKind::Pcopy {
                f,
                blocks,
                mut args,
            } => {
                let _scope = CtxScope::enter(c.gpu.ctx)?;
                let mut seq = lock(&c.launches.seq);
                args.seq = *seq;
                // SAFETY: as for Half: this GPU's buffers (checked by the
                // caller), both flag buffers with peer access; the peer's
                // n-th call computes the same grid from the same bytes.
                unsafe { allreduce::launch_copy(f.raw(), blocks, stream, args)? };
                *seq += allreduce::BUDGET;
                Ok(())
            }
            LaunchKind::Ring {
                f,
                kernel,
                blocks,
                args,
                two_process,
            } => {
                if let Some(x) = two_process {
                    if c.enqueue_two_process(&x, self.stream)? {
                        let reduction = matches!(
                            x.coll,
                            two_process::Coll::AllReduce | two_process::Coll::ReduceScatter
                        );
                        let sms = if reduction { allreduce::CER_BLOCKS } else { 0 };
                        tune("CopyEngine", "Simple", sms);
                        return Ok(());
                    }
                    let (algo, proto) = kernel.tuning_names();
                    tune(algo, proto, blocks);
                }
                let pdl = c.ring()?.may_pdl(blocks);
                let _scope = CtxScope::enter(c.gpu.ctx)?;
                // SAFETY: the buffers were checked to be this GPU's device
                // memory of the sizes the mode uses; the ring is live (held
                // by `c`), and every rank makes the matching call.
                unsafe { ring::launch_ring(f.raw(), blocks, stream, args, pdl) }
            }
            LaunchKind::P2p { f, sends, recvs } => {
                // Both ranks judge the transfers between them only
                // (two_process::p2p_call); a copy to itself runs beside.
                if let Some(x) = c.xp_p2p(&sends, &recvs, self.stream) {
                    let selfs = c.self_xfers(&sends, &recvs)?;
                    let _scope = CtxScope::enter(c.gpu.ctx)?;
                    // The copies to itself by SMs on a side stream of
                    // their own (the engines' work uses the stream and side
                    // stream 0), forked before it. Queued after it, they
                    // waited for it (2-process scatters of 256 MB-2 GB out
                    // of place 0.87-0.92x NCCL, in place 1.05-1.08x); on a
                    // copy engine beside it, 0.94-0.96x (2xH200, 2026-11-30).
                    let side = if selfs.is_empty() {
                        None
                    } else {
                        Some(c.copy_engines.side_at(1)?)
                    };
                    if let Some(sd) = side {
                        c.fork_side(sd, stream)?;
                        c.copy_kernels(&selfs, sd.stream as cu::CUstream, SELF_COPY_XP_BLOCKS)?;
                    }
                    let went = c.enqueue_two_process(&x, self.stream);
                    if let Some(sd) = side {
                        c.join_side(sd, stream)?;
                    }
                    if went? {
                        return Ok(());
                    }
                    // Declined by both: the ring kernel moves what goes to
                    // and from the peer; the copies to itself are queued.
                    let peer_only = |v: Vec<(usize, u64, usize)>| -> Vec<(usize, u64, usize)> {
                        v.into_iter().filter(|x| x.0 != c.rank).collect()
                    };
                    return c.enqueue_p2p(f, peer_only(sends), peer_only(recvs), stream);
                }
                c.enqueue_p2p(f, sends, recvs, stream)
            }
            LaunchKind::Ce { f, plan } => c.enqueue_copy_engine(f, &plan, stream),
            LaunchKind::CeReduce { f, fr, plan } => {
                c.enqueue_copy_engine_reduce(f, fr, &plan, stream)
            }
        }
    }
}

impl Launch {
    /// This launch with the collective's name and bytes for the TUNING line.
    fn labeled(mut self, op: &'static str, bytes: u64) -> Launch {
        self.what = Some((op, bytes));
        self
    }

    /// Offers a ring launch to the copy engines with a peer process
    /// ([`DevComm::two_process_call`] decides whether the call may take them).
    fn set_two_process_call(&mut self, call: two_process::Call) {
        let x = self.comm.two_process_call(call, self.stream);
        if let LaunchKind::Ring { two_process, .. } = &mut self.kind {
            *two_process = x;
        }
    }

    /// Whether this is a send/receive launch (merged by [`launch_all`]).
    pub fn is_p2p(&self) -> bool {
        matches!(self.kind, LaunchKind::P2p { .. })
    }
}

impl DevComm {
    /// Sets up the ring path (collective: every rank of the communicator
    /// calls it, in the same order relative to other bootstrap traffic).
    /// A failure is kept: operations that need the ring return it.
    pub fn setup_ring(&self, cfg: &RingConfig, boot: &RingBoot) -> Result<()> {
        if cfg.p2p_disable || cfg.force {
            self.ring_only
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let r = Ring::setup(
            self.gpu.dev,
            self.gpu.ctx,
            self.rank,
            self.nranks,
            cfg,
            boot,
        );
        let out = r.as_ref().map(|_| ()).map_err(Clone::clone);
        let _ = self.ring.set(r);
        out?;
        if let Some(Ok(x)) = self.ring.get() {
            // The pair kernels' waits now observe the ring's abort word and
            // report a timeout through its error word (allreduce::CTL_WORD).
            let timeout = x.timeout_ns();
            let mut b = x.ctrl_device().to_le_bytes().to_vec();
            b.extend_from_slice(&timeout.to_le_bytes());
            let _scope = CtxScope::enter(self.gpu.ctx)?;
            copy_to_device(self.launches.flags + 8 * allreduce::CTL_WORD as u64, &b)?;
        }
        if let Err(e) = self.setup_two_process(boot) {
            // Both ranks' channel setups fail together (one's failure
            // closes the connection the other reads), and without it every
            // call keeps the ring kernels.
            oxccl_env::warn!(
                "rank {}: no copy engines with the peer process ({}): the ring kernels run \
                 every collective",
                self.rank,
                e.message()
            );
        }
        Ok(())
    }

    /// The ring, or why there is none.
    fn ring(&self) -> Result<&Ring> {
        match self.ring.get() {
            Some(Ok(r)) => {
                if r.aborted() {
                    return Err(r.abort_reason());
                }
                if let Some(e) = r.error() {
                    return Err(e);
                }
                Ok(r)
            }
            Some(Err(e)) => Err(Error::new(
                e.kind(),
                format!(
                    "the GPU ring of this communicator could not be set up: {}",
                    e.message()
                ),
            )),
            None => Err(Error::invalid_usage(format!(
                "device buffers on this {}-rank communicator need the GPU ring path, which was \
                 not set up (not every rank had a CUDA device current at creation)",
                self.nranks
            ))),
        }
    }

    /// The ring's window kind and whether rank `r` shares this process
    /// (for INFO lines), when the ring is set up.
    pub fn ring_info(&self) -> Option<(ring::WindowKind, u32, u64, Vec<usize>)> {
        match self.ring.get() {
            Some(Ok(r)) => Some((r.kind(), r.channels(), r.footprint(), r.order().to_vec())),
            _ => None,
        }
    }

    /// Whether rank `r` runs in this process (per the ring setup).
    pub fn same_process(&self, r: usize) -> bool {
        match self.ring.get() {
            Some(Ok(x)) => x.same_process(r),
            _ => false,
        }
    }

    /// GPUDirect RDMA on the ring's plugin path: (sends read GPU memory,
    /// receives land in it); (false, false) without a ring or a plugin.
    pub fn gpu_direct(&self) -> (bool, bool) {
        match self.ring.get() {
            Some(Ok(x)) => x.gpu_direct(),
            _ => (false, false),
        }
    }

    /// Whether rank `r` is on this rank's host (true without a ring).
    pub fn same_host(&self, r: usize) -> bool {
        match self.ring.get() {
            Some(Ok(x)) => x.same_host(r),
            _ => true,
        }
    }

    /// An error a GPU operation of this rank ended with (a peer that never
    /// came, an abort), for `ncclCommGetAsyncError`.
    pub fn async_error(&self) -> Option<Error> {
        match self.ring.get() {
            Some(Ok(r)) => r.error(),
            _ => None,
        }
    }

    /// Stops this rank's GPU operations because a peer failed (`why`, from
    /// the host transports' liveness checks): ring kernels leave their waits
    /// and report `why`. False when there is no ring.
    pub fn fail_peer(&self, why: Error) -> bool {
        match self.ring.get() {
            Some(Ok(r)) => {
                r.fail_peer(why);
                true
            }
            _ => false,
        }
    }

    /// Stops this rank's GPU operations (`ncclCommAbort`): ring kernels
    /// leave their waits within about a millisecond.
    pub fn abort(&self) {
        if let Some(Ok(r)) = self.ring.get() {
            r.abort();
        }
    }

    /// Whether an operation on `stream` takes the ring path
    /// ([`route::Placement::ring_for`]).
    fn ring_for(&self, stream: usize) -> bool {
        self.placement().ring_for(|| capturing(stream))
    }

    /// Whether an all-reduce of `bytes` that could take the two-GPU pair
    /// kernel takes the ring's one-shot LL kernel instead
    /// ([`route::one_shot_on_ring`]).
    fn one_shot_on_ring(&self, bytes: u64) -> bool {
        let t = match self.ring.get() {
            Some(Ok(r)) => Some(r.thresholds()),
            _ => None,
        };
        route::one_shot_on_ring(bytes, t.as_ref())
    }

    /// Whether a launch of `blocks` blocks on this rank's streams may be
    /// programmatic: [`Ring::may_pdl`] once the ring is set up (ranks
    /// sharing this GPU limit it), else yes (one rank per GPU).
    fn may_pdl(&self, blocks: u32) -> bool {
        match self.ring.get() {
            Some(Ok(r)) => r.may_pdl(blocks),
            _ => true,
        }
    }

    /// The error that stops this rank's operations (an abort, a failed
    /// peer, a kernel's timeout), if its ring has one; calls that do not
    /// use the ring ask this before launching.
    fn healthy(&self) -> Result<()> {
        if let Some(Ok(r)) = self.ring.get() {
            if r.aborted() {
                return Err(r.abort_reason());
            }
            if let Some(e) = r.error() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Where this communicator's ranks are, for [`route`]'s choices.
    fn placement(&self) -> route::Placement {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        route::Placement {
            nranks: self.nranks,
            ring_only: self.ring_only.load(Relaxed),
            pair: self.in_process.pair.load(Acquire),
        }
    }

    /// A ring collective's launch.
    #[allow(clippy::too_many_arguments)]
    fn ring_launch(
        self: &Arc<Self>,
        collective: Collective,
        t: DataType,
        op: RedOp,
        send: u64,
        recv: u64,
        count: usize,
        link_bytes: u64,
        root: usize,
        scalar_ptr: Option<u64>,
        stream: usize,
    ) -> Result<Launch> {
        let r = self.ring()?;
        let f = self.typed_function(Family::Ring, t, op, || {
            self.function_in(&kernels::ring_variant(t, op), &ring::kernel_name(t, op))
        })?;
        let thresholds = r.thresholds();
        let own = ring::plan(collective, link_bytes, &thresholds);
        let (kernel, blocks) = self.tuned(collective, link_bytes, &thresholds, own);
        let mut args = r.args(kernel, send, recv, count as u64, root as u32);
        if let RedOp::PreMulSum(s) = op {
            args.scale = s.as_f64();
            args.iscale = s.as_u64_bits();
        }
        args.scalar_ptr = scalar_ptr.unwrap_or(0);
        let f = if self.config.small_kernel
            && ring::small_kernel_fits(
                kernel,
                count as u64,
                t.size() as u64,
                self.nranks as u32,
                blocks,
            ) {
            self.typed_function(Family::Small, t, op, || {
                self.function_in(
                    &kernels::ring_variant(t, op),
                    &ring::small_kernel_name(t, op),
                )
            })?
        } else {
            f
        };
        self.launch(
            LaunchKind::Ring {
                f,
                kernel,
                blocks,
                args,
                two_process: None,
            },
            stream,
        )
    }

    /// Gives the communicator's tuner plugin a say on ring collectives
    /// (once, after [`DevComm::setup_ring`]).
    pub fn set_tuner(&self, tuner: Tuner) {
        let _ = self.tuner.set(tuner);
    }

    /// The kernel and blocks of a ring collective after the tuner plugin,
    /// if there is one, answered on `own` (oxccl's plan): rank 0 logs the
    /// plugin's verdict on `TUNING`; a failing plugin call leaves `own`.
    fn tuned(
        &self,
        collective: Collective,
        bytes: u64,
        t: &ring::Thresholds,
        own: (RingKernel, u32),
    ) -> (RingKernel, u32) {
        use oxccl_core::gpu::tuning;
        use oxccl_core::tuner_plugin::Verdict;
        use oxccl_env::log::Subsys;
        let Some(tuner) = self.tuner.get() else {
            return own;
        };
        let given = tuning::cost_table(collective, bytes, t);
        let mut returned = given;
        let mut plugin = tuner.lock().unwrap_or_else(|p| p.into_inner());
        let func = oxccl_core::tuner_plugin::func_id(collective.kind());
        let nch = match plugin.get_coll_info(func, bytes as usize, &mut returned) {
            Ok(n) => n,
            Err(why) => {
                oxccl_env::info!(Subsys::TUNING, "{why}: oxccl's own plan");
                return own;
            }
        };
        let (chosen, verdict) = tuning::apply(collective, bytes, t, own, &given, &returned, nch);
        if self.rank == 0 {
            let (algo, proto) = chosen.0.tuning_names();
            oxccl_env::info!(
                Subsys::TUNING,
                "{} (GPU, tuner {}: {verdict:?})",
                oxccl_core::logfmt::tuning_line(
                    collective.kind().nccl_name(),
                    bytes,
                    algo,
                    proto,
                    chosen.1
                ),
                plugin.lib().name()
            );
        }
        if verdict == Verdict::Applied {
            if let Some(n) = TUNED_CALLS.get(chosen.0.mode() as usize) {
                n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        chosen
    }

    /// This rank's index in its communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// NCCL's TUNING line for a collective this rank launches (rank 0 only,
    /// as NCCL; `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING`): which algorithm,
    /// protocol and how many blocks (SMs) took the call.
    fn log_tuning(&self, what: Option<(&'static str, u64)>, algo: &str, proto: &str, blocks: u32) {
        use oxccl_env::log::{enabled, Level, Subsys};
        if let (0, Some((op, bytes))) = (self.rank, what) {
            if enabled(Level::Info, Subsys::TUNING) {
                oxccl_env::info!(
                    Subsys::TUNING,
                    "{}",
                    oxccl_core::logfmt::tuning_line(op, bytes, algo, proto, blocks)
                );
            }
        }
    }

    /// Ranks in the communicator.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// A group's copies of this rank to itself: its k-th send to itself
    /// paired with its k-th receive from itself (0-byte and same-buffer ones
    /// dropped). Errors: the counts or the sizes do not pair up.
    fn self_xfers(
        &self,
        sends: &[(usize, u64, usize)],
        recvs: &[(usize, u64, usize)],
    ) -> Result<Vec<ce::Xfer>> {
        let mine = |v: &[(usize, u64, usize)]| -> Vec<(u64, usize)> {
            v.iter()
                .filter(|x| x.0 == self.rank)
                .map(|x| (x.1, x.2))
                .collect()
        };
        let (ss, rs) = (mine(sends), mine(recvs));
        if ss.len() != rs.len() {
            return Err(Error::invalid_usage(format!(
                "rank {}: {} send(s) to itself but {} receive(s) from itself in this group",
                self.rank,
                ss.len(),
                rs.len()
            )));
        }
        let mut selfs: Vec<ce::Xfer> = Vec::new();
        for ((src, sb), (dst, rb)) in ss.into_iter().zip(rs) {
            if sb != rb {
                return Err(Error::invalid_usage(format!(
                    "rank {}: a send to itself of {sb} bytes meets a receive of {rb} bytes",
                    self.rank
                )));
            }
            if src != dst && sb > 0 {
                selfs.push(ce::Xfer {
                    dst,
                    src,
                    bytes: sb as u64,
                });
            }
        }
        Ok(selfs)
    }

    /// Runs one rank's merged sends and receives: those to itself are
    /// device-to-device copies (the i-th send to self fills the i-th receive
    /// from self); with the peer, the k-th copy kernel carries this rank's
    /// k-th send and k-th receive (both sides launch max(sends, receives)
    /// kernels, the same number).
    fn enqueue_p2p(
        &self,
        f: KernelFn,
        sends: Vec<(usize, u64, usize)>,
        recvs: Vec<(usize, u64, usize)>,
        stream: cu::CUstream,
    ) -> Result<()> {
        let selfs = self.self_xfers(&sends, &recvs)?;
        let _scope = CtxScope::enter(self.gpu.ctx)?;
        // Transfers of 0 bytes move nothing (the peer's matching one is
        // empty too, so both sides drop the same ones) and launch nothing.
        let others = |v: &[(usize, u64, usize)]| -> Vec<(usize, u64, usize)> {
            v.iter()
                .filter(|x| x.0 != self.rank && x.2 > 0)
                .copied()
                .collect()
        };
        let (os, or) = (others(&sends), others(&recvs));
        // One copy to itself (gather, scatter, all-to-all) rides in the
        // launch with the peers: an extra launch costs ~4 µs (measured:
        // 2-process gathers of 512 B took 12.9 µs out of place with a copy
        // kernel, against 7.2 in place; 6.95 once the launch carried the
        // copy). The ring's launch gives it blocks of its own beside the
        // transfers, at any size (ring::p2p_launch_args). The pair kernel's
        // grid follows the peers' sizes (both ranks must launch the same)
        // and its blocks copy after their transfers, so there the copy must
        // be below SELF_COPY_SIDE_MIN and at most twice the largest transfer;
        // a larger one runs on the side stream by the copy engine, several
        // small ones by copy kernels.
        let largest_peer = os.iter().chain(or.iter()).map(|x| x.2 as u64).max();
        let fits = |b: u64| {
            self.ring_for(stream as usize)
                || (b < SELF_COPY_SIDE_MIN
                    && largest_peer.is_some_and(|p| b <= 2 * p.max(64 << 10)))
        };
        let in_kernel = match selfs.as_slice() {
            [x] if f != KernelFn::NONE && largest_peer.is_some() && fits(x.bytes) => Some(*x),
            _ => None,
        };
        if os.is_empty() && or.is_empty() {
            // Copies to itself only (one rank, or a group without peers):
            // nothing to run beside, so the large ones go on the stream
            // itself without the side stream's fork and join. One H200,
            // one rank, under graphs, two rounds: all-to-alls of 32 / 64 /
            // 128 MiB took 17.2 / 33.0 / 64.1 µs this way against 18.9 /
            // 35.0 / 66.2 through the side stream (NCCL 17.2 / 33.0 /
            // 64.1-64.5); gathers alike (2026-12-01).
            let (big, small): (Vec<ce::Xfer>, Vec<ce::Xfer>) =
                selfs.iter().partition(|x| x.bytes >= SELF_COPY_SIDE_MIN);
            for x in &big {
                // SAFETY: both ranges are this GPU's device memory of
                // x.bytes (checked by the caller's prepare).
                unsafe { copy_async(x, stream)? };
            }
            return self.copy_kernels(&small, stream, u32::MAX);
        }
        let side = self.self_copies(if in_kernel.is_some() { &[] } else { &selfs }, stream)?;
        let r = self.enqueue_p2p_peers(f, &os, &or, in_kernel, stream);
        match side {
            Some(sd) => r.and(self.join_side(sd, stream)),
            None => r,
        }
    }

    /// The self copies of a send/receive group (see [`Self::enqueue_p2p`]):
    /// forked onto the side stream when one is at least
    /// [`SELF_COPY_SIDE_MIN`] (the returned side must be joined), else
    /// copy kernels on `stream`.
    fn self_copies(&self, selfs: &[ce::Xfer], stream: cu::CUstream) -> Result<Option<CeSide>> {
        if selfs.is_empty() {
            return Ok(None);
        }
        if selfs.iter().any(|x| x.bytes >= SELF_COPY_SIDE_MIN) {
            let sd = self.copy_engines.side_at(0)?;
            self.fork_side(sd, stream)?;
            for x in selfs {
                // SAFETY: both ranges are this GPU's device memory of
                // x.bytes (checked by the caller's prepare).
                unsafe { copy_async(x, sd.stream as cu::CUstream)? };
            }
            return Ok(Some(sd));
        }
        self.copy_kernels(selfs, stream, u32::MAX)?;
        Ok(None)
    }

    /// The copy kernel on `stream` for each of `selfs` (this GPU's memory),
    /// on at most `max_blocks` blocks.
    fn copy_kernels(
        &self,
        selfs: &[ce::Xfer],
        stream: cu::CUstream,
        max_blocks: u32,
    ) -> Result<()> {
        let f = self.function_in(&kernels::COPY, "oxccl_copy")?;
        for x in selfs {
            let (mut d, mut s, mut n) = (x.dst, x.src, x.bytes);
            let blocks = allreduce::copy_kernel_blocks(n).min(max_blocks);
            let mut params = [
                &mut d as *mut u64 as *mut c_void,
                &mut s as *mut u64 as *mut c_void,
                &mut n as *mut u64 as *mut c_void,
            ];
            // SAFETY: oxccl_copy(void*, const void*, u64): three 8-byte
            // values that outlive the call; both ranges are this GPU's
            // device memory (checked by the caller's prepare).
            unsafe {
                crate::device::launch_raw(
                    f.raw(),
                    blocks,
                    allreduce::THREADS,
                    stream,
                    &mut params,
                    self.may_pdl(blocks),
                    "cuLaunchKernel(oxccl_copy)",
                )?;
            }
        }
        Ok(())
    }

    /// `stream`'s work so far, then the side stream's next operations.
    fn fork_side(&self, sd: CeSide, stream: cu::CUstream) -> Result<()> {
        // An event and a stream of this context (made current by the
        // caller), created by ce_side.
        record_event(sd.fork as cu::CUevent, stream)?;
        wait_event(sd.stream as cu::CUstream, sd.fork as cu::CUevent)
    }

    /// `stream` waits for the side stream's operations so far.
    fn join_side(&self, sd: CeSide, stream: cu::CUstream) -> Result<()> {
        record_event(sd.join as cu::CUevent, sd.stream as cu::CUstream)?;
        wait_event(stream, sd.join as cu::CUevent)
    }

    /// The transfers with other ranks of [`Self::enqueue_p2p`] (none of 0
    /// bytes), and `self_copy` done by the same launch.
    fn enqueue_p2p_peers(
        &self,
        f: KernelFn,
        sends: &[(usize, u64, usize)],
        recvs: &[(usize, u64, usize)],
        self_copy: Option<ce::Xfer>,
        stream: cu::CUstream,
    ) -> Result<()> {
        if sends.is_empty() && recvs.is_empty() {
            return Ok(());
        }
        if self.ring_for(stream as usize) {
            let r = self.ring()?;
            for (blocks, args) in r.p2p_launches(sends, recvs, self_copy)? {
                // SAFETY: this GPU's buffers of the given sizes (checked by
                // the caller); the ring is live; the peers' launch of the
                // same index carries the matching operations.
                unsafe { ring::launch_p2p(f.raw(), blocks, stream, &args, r.may_pdl(blocks))? };
            }
            return Ok(());
        }
        // `sends`/`recvs` hold only the peer's transfers (see enqueue_p2p).
        let ptrs = |v: &[(usize, u64, usize)]| -> Vec<(u64, usize)> {
            v.iter().map(|x| (x.1, x.2)).collect()
        };
        let (ps, pr) = (ptrs(sends), ptrs(recvs));
        let n = ps.len().max(pr.len());
        let peer = self.peer()?;
        for k in 0..n {
            let (input, sb) = ps.get(k).copied().unwrap_or((0, 0));
            let (output, rb) = pr.get(k).copied().unwrap_or((0, 0));
            let blocks = allreduce::copy_blocks(sb.max(rb) as u64, self.config.pair_blocks);
            let own = self_copy.filter(|_| k == 0).unwrap_or(ce::Xfer {
                dst: 0,
                src: 0,
                bytes: 0,
            });
            let mut seq = lock(&self.launches.seq);
            let args = CpArgs {
                input,
                output,
                my_flags: self.launches.flags,
                peer_flags: peer.flags,
                bytes: rb as u64,
                seq: *seq,
                mode: PairKernel::SendRecv.mode(),
                rank: self.rank as u32,
                root: 0,
                pad: 0,
                self_dst: own.dst,
                self_src: own.src,
                self_bytes: own.bytes,
            };
            // SAFETY: this GPU's buffers (the self copy's too); the peer's
            // k-th kernel of its batch carries the matching receive/send,
            // with the same grid (from the transfers' sizes alone).
            unsafe { allreduce::launch_copy(f.raw(), blocks, stream, args)? };
            *seq += allreduce::BUDGET;
        }
        Ok(())
    }
}

/// `bytes` of device memory in the current context whose `zero_len` bytes
/// from `zero_at` are zero and visible to every stream when this returns
/// (the context is synchronised); freed again if that fails. `what` names
/// the buffer in errors.
fn alloc_zeroed(bytes: usize, zero_at: u64, zero_len: usize, what: &str) -> Result<u64> {
    debug_assert!(zero_at as usize + zero_len <= bytes);
    guarded("cuMemAlloc", || {
        // The caller made a context current.
        let p = cu::mem_alloc(bytes)
            .map_err(|e| e.context(&format!("cuMemAlloc({what}, {bytes} bytes)")))?;
        // SAFETY: the memset stays inside the allocation (zero_at + zero_len
        // <= bytes, the callers' constants); the synchronize makes it
        // complete; on failure it is freed once, with nothing queued.
        unsafe {
            let r = cu::memset_d8(p + zero_at, 0, zero_len).and_then(|_| cu::ctx_synchronize());
            if let Err(e) = r {
                let _ = cu::mem_free(p);
                return Err(e.into());
            }
        }
        Ok(p)
    })
}

/// `cuStreamWaitValue32`: `stream` waits until the 32-bit word at `addr`
/// equals `value` (context current).
///
/// # Safety
/// `addr` must be a live device word of this context until the wait ran.
unsafe fn stream_wait32(stream: cu::CUstream, addr: u64, value: u32) -> Result<()> {
    guarded("cuStreamWaitValue32", || {
        // SAFETY: the caller's contract.
        Ok(unsafe { cu::stream_wait_value32(stream, addr, value) }?)
    })
}

/// `cuStreamWriteValue32`: `stream` writes `value` to the 32-bit word at
/// `addr` after its earlier work's writes are visible (context current).
///
/// # Safety
/// As [`stream_wait32`].
unsafe fn stream_write32(stream: cu::CUstream, addr: u64, value: u32) -> Result<()> {
    guarded("cuStreamWriteValue32", || {
        // SAFETY: the caller's contract.
        Ok(unsafe { cu::stream_write_value32(stream, addr, value) }?)
    })
}

/// The kernel families with one kernel per (type, op).
#[derive(Debug, Clone, Copy)]
enum Family {
    /// `oxccl_ar1_*` (two GPUs of one process).
    Pair = 0,
    /// `oxccl_ring_*`.
    Ring = 1,
    /// `oxccl_small_*` (the small one-shot all-reduce, in the ring's program).
    Small = 2,
    /// `oxccl_scale_*` (a one-rank PreMulSum, in the ring's program).
    Scale = 3,
    /// `oxccl_one_launch_*` (every rank of a group of one process in one
    /// launch, in the ring's program).
    OneLaunch = 4,
}

/// Reduction ops per type in [`typed_slot`]'s table (sum, prod, max, min,
/// avg, PreMulSum: the scalar travels in the launch's arguments).
const TYPED_OPS: usize = 6;
const TYPED_SLOTS: usize = 5 * DataType::ALL.len() * TYPED_OPS;

/// Where (family, type, op)'s kernel sits in `DevComm::typed`.
fn typed_slot(family: Family, t: DataType, op: RedOp) -> usize {
    (family as usize * DataType::ALL.len() + t as usize) * TYPED_OPS + op.wire_code() as usize
}

/// On the pair kernel (two GPUs of one process), a send to itself of at
/// least this many bytes is copied by the copy engine on a side stream,
/// beside the transfers with the peers; a smaller single one by the launch
/// with the peers, after its transfers. Measured on 2xH200 with the bound
/// at 1 MiB: all-to-alls of 2 MB (1 MiB to itself) took 20-32 µs against
/// NCCL's 16-25, the side stream's fork, join and the copy engine's start
/// after a kernel costing ~15 µs, while the grid copies 1 MiB in ~1 µs
/// (~1.5 TB/s). At 32 MiB the grid's ~20 µs after the transfers match that
/// cost; beyond, the side stream hides the copy. The ring's launch copies
/// on blocks of its own beside the transfers at every size instead: with
/// the side stream from 32 MiB, 2-process scatters of 64 MB took 119-120 µs
/// out of place against 103 in place (NCCL 0.90-0.93x; 2xH200, 2026-11-30).
const SELF_COPY_SIDE_MIN: u64 = 32 << 20;

/// Blocks of the copy kernel that copies a rank to itself beside the copy
/// engines' transfers with a peer process: 32 blocks copy ~1 TB/s (~30 GB/s
/// each), so a copy as large as the transfer ends well within it (the
/// engine pushes ~390 GB/s), on a quarter of the SMs for that while.
const SELF_COPY_XP_BLOCKS: u32 = 32;

impl Drop for DevComm {
    fn drop(&mut self) {
        // The ring first, while this rank still holds its context reference
        // (fields drop after this body, which releases it: the ring's frees
        // would then run in a context that may be gone).
        drop(self.ring.take());
        if let Some(clique) = cliques().get_mut(&self.key) {
            clique.members.retain(|m| m.flags != self.launches.flags);
            clique.update_pair();
        }
        // SAFETY: our flags, copy-engine objects and retained context, each
        // freed or released once, the frees after our context was made
        // current and synchronised (the releases' contract); errors are
        // ignored in drop.
        unsafe {
            let saved = cu::ctx_get_current().unwrap_or(std::ptr::null_mut());
            if self.launches.flags != 0 && cu::ctx_set_current(self.gpu.ctx).is_ok() {
                let _ = cu::ctx_synchronize();
                self.close_two_process();
                self.launches.release();
                self.copy_engines.release();
            }
            let _ = cu::ctx_set_current(saved);
            let _ = cu::primary_ctx_release(self.gpu.dev);
        }
        let mut cl = cliques();
        if cl.get(&self.key).is_some_and(|c| c.members.is_empty()) {
            cl.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_ranks_on_one_stream_are_found() {
        let shared_stream_of = |ls: &[StreamUse]| shared_stream(ls, |u| *u);
        let u = |clique, rank, ctx, stream| StreamUse {
            clique,
            rank,
            ctx,
            stream,
        };
        // Two GPUs (two contexts): the legacy stream 0 of each is its own.
        assert_eq!(shared_stream_of(&[u(1, 0, 10, 0), u(1, 1, 11, 0)]), None);
        // Two ranks on one GPU, one stream (or both on stream 0).
        assert_eq!(
            shared_stream_of(&[u(1, 0, 10, 0), u(1, 1, 10, 0)]),
            Some((0, 1))
        );
        assert_eq!(
            shared_stream_of(&[u(1, 0, 10, 5), u(1, 1, 10, 6), u(1, 0, 10, 6)]),
            Some((1, 2))
        );
        // Streams of their own; one rank twice on its stream; other communicators.
        assert_eq!(shared_stream_of(&[u(1, 0, 10, 5), u(1, 1, 10, 6)]), None);
        assert_eq!(shared_stream_of(&[u(1, 0, 10, 5), u(1, 0, 10, 5)]), None);
        assert_eq!(shared_stream_of(&[u(1, 0, 10, 5), u(2, 1, 10, 5)]), None);
        assert_eq!(shared_stream_of(&[]), None);
    }

    #[test]
    fn every_typed_kernel_has_its_own_slot() {
        let premul = RedOp::PreMulSum(oxccl_core::Scalar::F64(2.0));
        let ops = || RedOp::BUILTIN.into_iter().chain([premul]);
        let mut seen = std::collections::HashSet::new();
        for f in [
            Family::Pair,
            Family::Ring,
            Family::Small,
            Family::Scale,
            Family::OneLaunch,
        ] {
            for t in DataType::ALL {
                for op in ops() {
                    let s = typed_slot(f, t, op);
                    assert!(s < TYPED_SLOTS, "{f:?} {t:?} {op:?}: slot {s}");
                    assert!(seen.insert(s), "{f:?} {t:?} {op:?}: slot {s} taken twice");
                }
            }
        }
        assert_eq!(seen.len(), TYPED_SLOTS);
        // PreMulSum's scalar is an argument of the launch, not of the kernel.
        assert_eq!(
            typed_slot(
                Family::Ring,
                DataType::Float32,
                RedOp::PreMulSum(oxccl_core::Scalar::F64(0.5))
            ),
            typed_slot(
                Family::Ring,
                DataType::Float32,
                RedOp::PreMulSum(oxccl_core::Scalar::F64(3.0))
            )
        );
    }

    #[test]
    fn copies_move_words_where_size_and_buffers_allow() {
        assert_eq!(copy_elements(64, 0x1000, 0x2000), (DataType::Uint64, 8));
        assert_eq!(copy_elements(8, 0x1008, 0x2010), (DataType::Uint64, 1));
        // An odd size, or a buffer off an 8-byte boundary: bytes.
        assert_eq!(copy_elements(60, 0x1000, 0x2000), (DataType::Uint8, 60));
        assert_eq!(copy_elements(64, 0x1004, 0x2000), (DataType::Uint8, 64));
        assert_eq!(copy_elements(64, 0x1000, 0x2001), (DataType::Uint8, 64));
        assert_eq!(copy_elements(0, 0x1000, 0x2000), (DataType::Uint64, 0));
    }

    #[test]
    fn extent_checks_name_the_argument_and_the_overrun() {
        let ext = Some((0x1000, 256));
        // Inside, to the last byte, and nothing to check.
        assert!(check_extent_in(0x1000, 256, ext, "sendbuff").is_ok());
        assert!(check_extent_in(0x10ff, 1, ext, "sendbuff").is_ok());
        assert!(check_extent_in(0x1000, 0, ext, "sendbuff").is_ok());
        assert!(check_extent_in(0x1000, 1 << 40, None, "sendbuff").is_ok());
        // One byte past, and a count whose end overflows 64 bits.
        let e = check_extent_in(0x1080, 129, ext, "recvbuff").unwrap_err();
        assert_eq!(e.kind(), oxccl_core::ErrorKind::InvalidArgument);
        assert!(
            e.message().contains("recvbuff") && e.message().contains("1 bytes past"),
            "{}",
            e.message()
        );
        let e = check_extent_in(
            u64::MAX - 4,
            usize::MAX,
            Some((u64::MAX - 8, 8)),
            "recvbuff",
        );
        assert!(e.is_err());
    }
}
