//! What NCCL's C API (`oxccl-nccl`, `libnccl.so.2`) needs from CUDA: where a
//! pointer lives, the calling thread's current device, `ncclMemAlloc`'s device
//! memory, and a communicator's GPU state ([`DevComm`]) that launches the
//! one-shot all-reduce on the caller's stream.
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

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys::{self, CUresult};
use oxccl_core::{DataType, Error, ErrorKind, RedOp, Result};

use crate::allreduce::{self, ArArgs, CpArgs, FLAG_BYTES};
use crate::device::{check, CtxScope};
use crate::kernels::KernelSource;
use crate::loader::{self, guarded};
use crate::ring::{self, Ring, RingBoot, RingConfig};
use crate::{ce, ce_reduce, compile, kernels};
use oxccl_core::algo::{Algo, Proto};
use oxccl_core::gpu::config::DeviceConfig;
use oxccl_core::gpu::{one_launch, two_process, Collective, PairKernel, RingKernel};

mod two_process_io;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// True when a CUDA driver with at least one GPU is usable (probed once).
pub fn available() -> bool {
    loader::probe_driver().is_ok()
}

/// The device (ordinal) of the calling thread's current context; `None`
/// without a driver or without a current context (a thread that never used
/// CUDA).
pub fn current_device() -> Option<i32> {
    loader::driver().ok()?;
    guarded("cuCtxGetCurrent", || {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle.
        unsafe { check(sys::cuCtxGetCurrent(&mut ctx), "cuCtxGetCurrent")? };
        if ctx.is_null() {
            return Ok(None);
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: a context is current; writes one int.
        unsafe { check(sys::cuCtxGetDevice(&mut dev), "cuCtxGetDevice")? };
        Ok(Some(dev))
    })
    .ok()
    .flatten()
}

/// Where a pointer's memory is, as the collectives need to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Host memory (pageable, pinned, or unknown to CUDA), or no driver.
    Host,
    /// Device memory of this device ordinal.
    Device(i32),
}

/// A device allocation's extent as the driver reports it: (base, size).
pub type Extent = Option<(u64, u64)>;

/// Where `ptr` is, and the extent of its allocation, in one driver call
/// (`cuPointerGetAttributes`: memory type, device ordinal, range start and
/// size; a collective asks this for two buffers on every call, and one call
/// per pointer instead of three saves ~4 driver calls per collective). A
/// pointer CUDA does not know (zeroed attributes, or
/// `CUDA_ERROR_INVALID_VALUE`), host/pinned memory, NULL, or no driver at
/// all is [`Memory::Host`].
pub fn locate(ptr: *const c_void) -> Result<(Memory, Extent)> {
    if ptr.is_null() || loader::driver().is_err() {
        return Ok((Memory::Host, None));
    }
    guarded("cuPointerGetAttributes", || {
        use sys::CUpointer_attribute as A;
        let (mut kind, mut ord, mut base, mut size) = (0u32, -1i32, 0u64, 0usize);
        let mut attrs = [
            A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        ];
        let mut data: [*mut c_void; 4] = [
            &mut kind as *mut u32 as *mut c_void,
            &mut ord as *mut i32 as *mut c_void,
            &mut base as *mut u64 as *mut c_void,
            &mut size as *mut usize as *mut c_void,
        ];
        // SAFETY: four attributes, each written into a value of its size
        // (a 32-bit enum, an int, a CUdeviceptr, a size_t).
        let r = unsafe {
            sys::cuPointerGetAttributes(
                4,
                attrs.as_mut_ptr(),
                data.as_mut_ptr(),
                ptr as sys::CUdeviceptr,
            )
        };
        if r == CUresult::CUDA_ERROR_INVALID_VALUE {
            return Ok((Memory::Host, None));
        }
        check(r, "cuPointerGetAttributes")?;
        if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Ok((Memory::Host, None));
        }
        let extent = (size > 0).then_some((base, size as u64));
        Ok((Memory::Device(ord), extent))
    })
}

/// [`locate`]'s memory kind alone.
pub fn memory_of(ptr: *const c_void) -> Result<Memory> {
    locate(ptr).map(|x| x.0)
}

/// Checks that `bytes` from the device pointer `ptr` lie inside the
/// allocation `extent` that [`locate`] reported for it in the same call, so
/// an overrunning count is an error naming the argument (`what`, e.g.
/// "recvbuff") instead of a fault in a kernel. Memory the driver cannot
/// place (no extent) passes: nothing to check against.
pub fn check_extent_in(ptr: u64, bytes: usize, extent: Extent, what: &str) -> Result<()> {
    let Some((base, size)) = extent else {
        return Ok(());
    };
    if bytes == 0 || ptr == 0 {
        return Ok(());
    }
    let end = ptr as u128 + bytes as u128;
    if end > base as u128 + size as u128 {
        return Err(Error::invalid_argument(format!(
            "{what}: {bytes} bytes from {ptr:#x} run {} bytes past the end of its device \
             allocation ({size} bytes at {base:#x}): count too large for the buffer",
            end - (base as u128 + size as u128)
        )));
    }
    Ok(())
}

/// `ncclMemAlloc`'s device allocations: address -> the context that owns it.
fn device_allocations() -> MutexGuard<'static, HashMap<u64, usize>> {
    static A: OnceLock<Mutex<HashMap<u64, usize>>> = OnceLock::new();
    lock(A.get_or_init(|| Mutex::new(HashMap::new())))
}

/// `cuMemAlloc` of `bytes` in the calling thread's current context; `None`
/// without a driver or a current context (the caller then uses host memory).
pub fn mem_alloc_current(bytes: usize) -> Result<Option<u64>> {
    if current_device().is_none() {
        return Ok(None);
    }
    guarded("cuMemAlloc", || {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: writes a handle and a pointer; a context is current.
        unsafe {
            check(sys::cuCtxGetCurrent(&mut ctx), "cuCtxGetCurrent")?;
            check(sys::cuMemAlloc_v2(&mut p, bytes.max(1)), "cuMemAlloc")?;
        }
        device_allocations().insert(p, ctx as usize);
        Ok(Some(p))
    })
}

/// Frees a pointer of [`mem_alloc_current`]; `false` if it is not one.
pub fn mem_free(ptr: u64) -> Result<bool> {
    let Some(ctx) = device_allocations().remove(&ptr) else {
        return Ok(false);
    };
    let _scope = CtxScope::enter(ctx as sys::CUcontext)?;
    guarded("cuMemFree", || {
        // SAFETY: allocated by cuMemAlloc in this context, freed once (removed above).
        unsafe { check(sys::cuMemFree_v2(ptr), "cuMemFree")? };
        Ok(true)
    })
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
    let mut can = 0;
    guarded("cuDeviceCanAccessPeer", || {
        // SAFETY: writes one int; both are valid device ordinals.
        unsafe {
            check(
                sys::cuDeviceCanAccessPeer(&mut can, from.ordinal, to.ordinal),
                "cuDeviceCanAccessPeer",
            )
        }
    })?;
    if can == 0 {
        return Err(Error::new(
            ErrorKind::UnhandledCuda,
            format!(
                "GPU {} cannot access GPU {} (cuDeviceCanAccessPeer = 0: no NVLink/PCIe peer path, or ACS blocks it)",
                from.ordinal, to.ordinal
            ),
        ));
    }
    let _scope = CtxScope::enter(from.ctx as sys::CUcontext)?;
    guarded("cuCtxEnablePeerAccess", || {
        // SAFETY: `from`'s context is current; `to`'s context is retained by its DevComm.
        let r = unsafe { sys::cuCtxEnablePeerAccess(to.ctx as sys::CUcontext, 0) };
        if r == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(r, "cuCtxEnablePeerAccess")
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
    fn raw(self) -> sys::CUfunction {
        self.0 as sys::CUfunction
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

/// One rank's GPU state: its device's primary context (retained), a flags
/// buffer from `cuMemAlloc` (flags + mailbox, zeroed), the barrier sequence.
#[derive(Debug)]
pub struct DevComm {
    key: Vec<u8>,
    rank: usize,
    nranks: usize,
    ordinal: i32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    flags: u64,
    /// The first barrier value of the next call (only grows).
    seq: Mutex<u64>,
    /// The ring path ([`DevComm::setup_ring`]); unset for a rank that never
    /// set it up (one rank, or ranks without GPUs).
    ring: OnceLock<std::result::Result<Ring, Error>>,
    /// Every operation with peers takes the ring path (NCCL_P2P_DISABLE=1,
    /// `NCCL_ALGO` without OneShot/TwoShot, or `OXCCL_CUDA_RING=1`: see
    /// `RingConfig::force`).
    ring_only: std::sync::atomic::AtomicBool,
    /// Whether both ranks are in this process on two GPUs (its clique's
    /// `pair`): a call asks this instead of the process-wide clique table,
    /// whose lock and hash of the 128-byte key cost ~0.1 us of the ~1 us a
    /// call spent around its launch (one H200, 2026-12-01).
    pair: Arc<std::sync::atomic::AtomicBool>,
    /// Its clique's ranks in this process and their GPUs (`local`).
    local: Arc<Local>,
    /// The settings read from the parameters when it was created (the
    /// small kernel, the one-launch kernel, the pair kernels' blocks, the
    /// copy engines' bounds).
    config: DeviceConfig,
    /// The event that orders the ranks' streams around a one-launch kernel
    /// ([`enqueue_joint`]; 0: not created yet).
    joint_event: Mutex<usize>,
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
    /// The copy-engine path's side stream and its fork/join events
    /// (created at its first use; see [`crate::ce`]).
    ce_side: Mutex<[Option<CeSide>; 2]>,
    /// The copy-engine reduction's scratch ring and flags
    /// ([`ce_reduce::SCRATCH_BYTES`], 256 MiB + 256 B of this GPU's memory,
    /// allocated at the first such call, freed with the communicator).
    ce_scratch: Mutex<Option<u64>>,
    /// The copy-engine channel with a peer in another process of this host
    /// (2 ranks; set up with the ring: [`two_process`]).
    xp: OnceLock<two_process_io::XpState>,
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

/// What a launch needs, checked; [`Launch::go`] launches it.
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
    joint: Option<one_launch::RankCall>,
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
        xp: Option<two_process::Call>,
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
            let mut dev: sys::CUdevice = 0;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: out-pointers are valid; the driver was probed.
            unsafe {
                check(sys::cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
                check(
                    sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                    "cuDevicePrimaryCtxRetain",
                )?;
            }
            Ok((dev, ctx))
        })?;
        let mut me = DevComm {
            key: key.to_vec(),
            rank,
            nranks,
            ordinal,
            dev,
            ctx,
            flags: 0,
            seq: Mutex::new(1),
            ring: OnceLock::new(),
            ring_only: std::sync::atomic::AtomicBool::new(false),
            pair: Arc::default(),
            local: Arc::default(),
            config: DeviceConfig::from_params(oxccl_env::params()),
            joint_event: Mutex::new(0),
            typed: std::array::from_fn(|_| std::sync::atomic::AtomicUsize::new(0)),
            checked_stream: std::sync::atomic::AtomicUsize::new(0),
            ce_side: Mutex::new([None; 2]),
            ce_scratch: Mutex::new(None),
            xp: OnceLock::new(),
        };
        {
            let _scope = CtxScope::enter(ctx)?;
            // The whole flag buffer starts at zero (barrier values only grow).
            let flags = alloc_zeroed(FLAG_BYTES, 0, FLAG_BYTES, "flags")?;
            me.flags = flags;
        } // Drop of `me` from here on frees the flags and releases the context.
        let m = Member {
            rank,
            ordinal,
            ctx: ctx as usize,
            flags: me.flags,
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
                me.pair = clique.pair.clone();
                me.local = clique.local.clone();
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
        if stream <= 2 || self.checked_stream.load(Relaxed) == stream {
            return Ok(());
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        let r = guarded("cuStreamGetCtx", || {
            // SAFETY: the caller's stream handle; writes one handle.
            unsafe {
                check(
                    sys::cuStreamGetCtx(stream as sys::CUstream, &mut ctx),
                    "cuStreamGetCtx",
                )
            }
        });
        match r {
            Ok(()) if !ctx.is_null() && ctx != self.ctx => Err(Error::invalid_argument(format!(
                "stream {stream:#x} belongs to another CUDA context than this communicator's \
                 (GPU {}): pass a stream created on GPU {}",
                self.ordinal, self.ordinal
            ))),
            Ok(()) => {
                self.checked_stream.store(stream, Relaxed);
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
        self.ordinal
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
        if p.ordinal == self.ordinal {
            return Err(Error::invalid_usage(format!(
                "both ranks of this communicator use GPU {}: two ranks on one GPU are not \
                 supported by oxccl's GPU path yet",
                self.ordinal
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
        let slot = &self.typed[typed_slot(family, t, op)];
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
        let key = (self.ordinal, src.name);
        if let std::collections::hash_map::Entry::Vacant(slot) = mods.entry(key) {
            let arch = guarded("cuDeviceGetAttribute", || {
                let (mut major, mut minor) = (0, 0);
                // SAFETY: each writes one int for a valid device.
                unsafe {
                    check(
                        sys::cuDeviceGetAttribute(
                            &mut major,
                            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                            self.dev,
                        ),
                        "cuDeviceGetAttribute",
                    )?;
                    check(
                        sys::cuDeviceGetAttribute(
                            &mut minor,
                            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                            self.dev,
                        ),
                        "cuDeviceGetAttribute",
                    )?;
                }
                Ok((major * 10 + minor) as u32)
            })?;
            let img = compile::compile(src, arch)?;
            let _scope = CtxScope::enter(self.ctx)?;
            let module = guarded("cuModuleLoadData", || {
                let mut m: sys::CUmodule = std::ptr::null_mut();
                // SAFETY: a complete CUBIN that outlives the call; our context is current.
                unsafe {
                    check(
                        sys::cuModuleLoadData(&mut m, img.image.as_ptr() as *const c_void),
                        "cuModuleLoadData",
                    )?
                };
                Ok(m)
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
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: the module is loaded (never unloaded); `c` is NUL-terminated.
            unsafe {
                check(
                    sys::cuModuleGetFunction(&mut f, l.module as sys::CUmodule, c.as_ptr()),
                    &format!("cuModuleGetFunction({name})"),
                )?
            };
            Ok(f as usize)
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
            joint: None,
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
        l.joint = self.joint_part(
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
    fn joint_part(
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
            local_ranks: self.local.ranks.load(Acquire),
            spread: self.local.spread.load(Acquire),
            peers: self.config.joint_peers,
            ring_only: self.ring_only.load(Relaxed),
            max: self.config.joint_max,
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
                    l.set_xp(two_process::Call {
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
            self.flags,
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
        l.joint = self.joint_part(
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
                l.set_xp(two_process::Call {
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
                            my_flags: self.flags,
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
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    guarded("cuStreamIsCapturing", || {
        // SAFETY: a stream handle of the caller's; writes one enum.
        unsafe {
            check(
                sys::cuStreamIsCapturing(stream as sys::CUstream, &mut st),
                "cuStreamIsCapturing",
            )
        }
    })
    .is_ok()
        && st == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
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

/// Launches operations in order, except that the point-to-point launches of
/// each communicator are merged into one (after the others), so sends and
/// receives of one group meet their peers' whatever order they were called in.
/// Where both ranks of a two-GPU in-process communicator are in `launches`,
/// their large copies go to the copy engines (`pair_for_copy_engines`).
pub fn launch_all(launches: Vec<Launch>) -> Result<()> {
    let used = |l: &Launch| StreamUse {
        clique: Arc::as_ptr(&l.comm.pair) as usize,
        rank: l.comm.rank,
        ctx: l.comm.ctx as usize,
        stream: l.stream,
    };
    if let Some((a, b)) = shared_stream(&launches, used) {
        let (c, s) = (&launches[a].comm, launches[a].stream);
        return Err(Error::invalid_usage(format!(
            "ranks {} and {} of one communicator were given the same stream {s:#x} on GPU {}: \
             each rank's kernel would wait for the other's, queued behind it, until the \
             timeout; give every rank its own stream",
            c.rank, launches[b].comm.rank, c.ordinal
        )));
    }
    if let Some(calls) = joint_groups(&launches) {
        return enqueue_joint(&launches, &calls);
    }
    let mut ops: Vec<Launch> = Vec::with_capacity(launches.len());
    let mut p2p: Vec<Launch> = Vec::new();
    for l in launches {
        match l.kind {
            LaunchKind::P2p { .. } => {
                let key = Arc::as_ptr(&l.comm);
                if let Some(m) = p2p.iter_mut().find(|m| Arc::as_ptr(&m.comm) == key) {
                    if let (
                        LaunchKind::P2p { f, sends, recvs },
                        LaunchKind::P2p {
                            f: f2,
                            sends: s2,
                            recvs: r2,
                        },
                    ) = (&mut m.kind, l.kind)
                    {
                        if *f == KernelFn::NONE {
                            *f = f2;
                        }
                        sends.extend(s2);
                        recvs.extend(r2);
                    }
                } else {
                    p2p.push(l);
                }
            }
            _ => ops.push(l),
        }
    }
    ops.extend(p2p);
    // Every rank sets the same bounds (the parameters say so): the first
    // launch's communicator speaks for the group.
    if let Some(cfg) = ops.first().map(|l| l.comm.config.clone()) {
        pair_for_copy_engines(&mut ops, cfg.ce_min, cfg.ce_ar_min());
    }
    for l in ops {
        l.go()?;
    }
    Ok(())
}

/// Whether a group runs as one-launch kernels of every rank
/// ([`one_launch::group_up`]), and its calls' launches, rank 0's first.
fn joint_groups(ls: &[Launch]) -> Option<Vec<Vec<usize>>> {
    // Most groups have a launch that cannot: no list built for them.
    if ls.len() < 2 || ls.iter().any(|l| l.joint.is_none()) {
        return None;
    }
    let parts: Vec<_> = ls
        .iter()
        .map(|l| (Arc::as_ptr(&l.comm.pair) as usize, l.comm.rank, l.joint))
        .collect();
    one_launch::group_up(&parts, ls[0].comm.nranks)
}

/// Runs each call (its launches, rank 0's first) as one `oxccl_joint_*`
/// kernel on rank 0's stream: every other rank's stream records its event,
/// which rank 0's stream waits for (every input is ready); the kernel
/// runs; every other rank's stream waits for an event recorded after it
/// (every output is written). Returns without waiting for the GPUs.
fn enqueue_joint(ls: &[Launch], calls: &[Vec<usize>]) -> Result<()> {
    for call in calls {
        let l0 = &ls[call[0]];
        let c0 = &l0.comm;
        let mut parts = Vec::with_capacity(call.len());
        for &i in call {
            ls[i].comm.healthy()?;
            let p = ls[i]
                .joint
                .ok_or_else(|| Error::internal("a one-launch call without every rank's part"))?;
            parts.push(p);
        }
        let p0 = parts[0];
        let f = c0.typed_function(Family::Joint, p0.dtype, p0.op, || {
            c0.function_in(
                &kernels::ring_variant(p0.dtype, p0.op),
                &ring::joint_kernel_name(p0.dtype, p0.op),
            )
        })?;
        let n = call.len();
        let elem = p0.dtype.size() as u64;
        let blocks =
            one_launch::blocks(one_launch::largest_buffer(p0.collective, p0.count, elem, n));
        let s0 = l0.stream as sys::CUstream;
        let mut ready = Vec::with_capacity(n - 1);
        for &i in &call[1..] {
            let l = &ls[i];
            let _scope = CtxScope::enter(l.comm.ctx)?;
            let e = l.comm.joint_event()?;
            record_event(e, l.stream as sys::CUstream)?;
            ready.push(e);
        }
        let e0 = {
            let _scope = CtxScope::enter(c0.ctx)?;
            for &e in &ready {
                wait_event(s0, e)?;
            }
            // SAFETY: every part comes from a checked call of this group
            // (joint_part: every rank in this process, so each rank's
            // buffers are on rank 0's GPU or on a peer that it can access,
            // enabled when the communicator was created); `f` is of rank
            // 0's context, current here.
            unsafe { ring::launch_joint(f.raw(), blocks, s0, one_launch::args(&parts))? };
            JOINT_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let e = c0.joint_event()?;
            record_event(e, s0)?;
            e
        };
        for &i in &call[1..] {
            let l = &ls[i];
            let _scope = CtxScope::enter(l.comm.ctx)?;
            wait_event(l.stream as sys::CUstream, e0)?;
        }
        c0.log_tuning(l0.what, "Joint", "Simple", blocks);
    }
    Ok(())
}

/// `cuEventRecord(e, stream)`; the event's context is current.
fn record_event(e: sys::CUevent, stream: sys::CUstream) -> Result<()> {
    guarded("cuEventRecord", || {
        // SAFETY: the callers pass an event of the current context
        // (DevComm::joint_event, ce_side) and a stream of it (check_stream
        // at prepare, or ce_side's own).
        unsafe { check(sys::cuEventRecord(e, stream), "cuEventRecord") }
    })
}

/// `cuStreamWaitEvent(stream, e)`; the stream's context is current (the
/// event may be another's).
fn wait_event(stream: sys::CUstream, e: sys::CUevent) -> Result<()> {
    guarded("cuStreamWaitEvent", || {
        // SAFETY: a stream of the current context and a live event.
        unsafe { check(sys::cuStreamWaitEvent(stream, e, 0), "cuStreamWaitEvent") }
    })
}

/// A launch's communicator (its clique's identity), rank, context and stream.
#[derive(Clone, Copy, Debug)]
struct StreamUse {
    clique: usize,
    rank: usize,
    ctx: usize,
    stream: usize,
}

/// Two launches of a group (indices) that put different ranks of one
/// communicator on the same stream of one context (two ranks sharing a GPU,
/// one thread, one stream: the first rank's kernel waits for the second's,
/// which the stream holds back behind it). `use_of` reads each item's use,
/// so a group's launch path builds no list for the check.
fn shared_stream<T>(ls: &[T], use_of: impl Fn(&T) -> StreamUse) -> Option<(usize, usize)> {
    (0..ls.len()).find_map(|i| {
        (i + 1..ls.len())
            .find(|&j| {
                let (a, b) = (use_of(&ls[i]), use_of(&ls[j]));
                a.clique == b.clique && a.rank != b.rank && a.ctx == b.ctx && a.stream == b.stream
            })
            .map(|j| (i, j))
    })
}

/// Queues `x` on `on` (context current).
///
/// # Safety
/// Both ranges must be device memory this context can reach, live until the
/// copy ran.
unsafe fn copy_async(x: &ce::Xfer, on: sys::CUstream) -> Result<()> {
    guarded("cuMemcpyAsync", || {
        // SAFETY: the caller's contract.
        unsafe {
            check(
                sys::cuMemcpyAsync(x.dst, x.src, x.bytes as usize, on),
                "cuMemcpyAsync",
            )
        }
    })
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

/// Rank calls that went to the copy engines in this process (each rank's
/// half counts once): what tests read to know the path was taken.
static CE_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Peer allocations this process holds open for the copy engines between
/// processes (`xp`): what tests read to see that freed ones are let go.
pub fn peer_mappings() -> usize {
    two_process_io::open_mappings()
}

/// How many calls of this process ran as one-launch kernels of every rank
/// so far (every rank's call counts once together; [`oxccl_core::gpu::one_launch`]).
pub fn joint_calls() -> u64 {
    JOINT_CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

static JOINT_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many rank calls of this process took the copy engines so far.
pub fn ce_calls() -> u64 {
    CE_CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Of [`ce_calls`], the in-place reductions whose pieces were pushed
/// ([`crate::ce_reduce::plan_pushed_in_place`], [`crate::ce_reduce::plan_pushed_ring`]).
static CE_IN_PLACE_PUSHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many rank calls of this process pushed an in-place all-reduce or
/// reduce-scatter.
pub fn ce_in_place_pushes() -> u64 {
    CE_IN_PLACE_PUSHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Of [`ce_in_place_pushes`], those through the peer's scratch ring
/// (reduce-scatters, [`crate::ce_reduce::plan_pushed_ring`]).
static CE_RING_PUSHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many rank calls of this process pushed into the peer's scratch ring.
pub fn ce_ring_pushes() -> u64 {
    CE_RING_PUSHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether a launch may take part in the copy-engine pairing (copies when
/// `min` > 0, reductions when `ar_min` > 0): not a ring launch, not a
/// reduction the copy-engine path does not do, not nothing to do.
fn ce_candidate(l: &Launch, min: u64, ar_min: u64) -> bool {
    let c = &l.comm;
    if c.nranks != 2 {
        return false;
    }
    match &l.kind {
        LaunchKind::Pcopy { args, .. } => min > 0 && args.mode != PairKernel::SendRecv.mode(),
        LaunchKind::P2p { f, .. } => min > 0 && *f != KernelFn::NONE && !c.ring_for(l.stream),
        LaunchKind::Half { ce, .. } => ar_min > 0 && ce.is_some(),
        _ => false,
    }
}

/// Rewrites matching copy launches of both ranks of a communicator into
/// copy-engine launches ([`crate::ce`]; who meets whom: [`ce::match_pairs`]),
/// and matching all-reduces / reduce-scatters into copy-engine reductions
/// ([`crate::ce_reduce`]). A communicator whose candidates do not line up
/// keeps its kernels, as does any pair whose largest transfer is below `min`
/// (a reduction: whose size is below `ar_min`). Both ranks of a pair change
/// together, and a copy-engine launch takes the same barrier values on both.
fn pair_for_copy_engines(ops: &mut [Launch], min: u64, ar_min: u64) {
    if min == 0 && ar_min == 0 {
        return;
    }
    let pairs = {
        let cands: Vec<Option<(&[u8], usize)>> = ops
            .iter()
            .map(|l| ce_candidate(l, min, ar_min).then(|| (l.comm.key.as_slice(), l.comm.rank)))
            .collect();
        ce::match_pairs(&cands)
    };
    for (i, j) in pairs {
        if let (LaunchKind::Half { ce: Some(a), .. }, LaunchKind::Half { ce: Some(b), .. }) =
            (&ops[i].kind, &ops[j].kind)
        {
            let (a, b) = (*a, *b);
            if let Some((k0, k1)) = reduce_pair(&ops[i].comm, &ops[j].comm, [a, b], ar_min) {
                ops[i].kind = k0;
                ops[j].kind = k1;
            }
            continue;
        }
        let plans = match (&ops[i].kind, &ops[j].kind) {
            (LaunchKind::Pcopy { args: x, .. }, LaunchKind::Pcopy { args: y, .. }) => {
                ce::pair_collective([copying(x), copying(y)])
            }
            (
                LaunchKind::P2p {
                    sends: s0,
                    recvs: r0,
                    ..
                },
                LaunchKind::P2p {
                    sends: s1,
                    recvs: r1,
                    ..
                },
            ) => ce::pair_p2p([
                ce::P2pSide {
                    sends: s0,
                    recvs: r0,
                },
                ce::P2pSide {
                    sends: s1,
                    recvs: r1,
                },
            ]),
            _ => None,
        };
        let Some([p0, p1]) = plans.filter(|p| ce::worth_it(p, min)) else {
            continue;
        };
        let (Ok(f0), Ok(f1)) = (
            ops[i].comm.function("oxccl_pcopy"),
            ops[j].comm.function("oxccl_pcopy"),
        ) else {
            continue;
        };
        ops[i].kind = LaunchKind::Ce { f: f0, plan: p0 };
        ops[j].kind = LaunchKind::Ce { f: f1, plan: p1 };
    }
}

/// The copy-engine reduction launches of a matching pair of reductions
/// (rank 0's comm `c0` and call first), or `None` to keep the SM kernels:
/// the calls do not qualify ([`ce_reduce::qualifies`]), or a scratch ring
/// or a kernel could not be had (an INFO line says why; the SM path runs
/// the call correctly either way).
fn reduce_pair(
    c0: &Arc<DevComm>,
    c1: &Arc<DevComm>,
    calls: [ce_reduce::Call; 2],
    ar_min: u64,
) -> Option<(LaunchKind, LaunchKind)> {
    if !ce_reduce::qualifies(&calls, ar_min) {
        return None;
    }
    let build = || -> Result<(LaunchKind, LaunchKind)> {
        // Before any launch of this group (launch_all pairs first): the
        // first allocation synchronises this rank's context, which would
        // wait forever on a pair kernel of this group whose partner is not
        // launched yet.
        let scratch = [c0.ce_scratch()?, c1.ce_scratch()?];
        let [p0, p1] = ce_reduce::pair(calls, scratch, ar_min)
            .ok_or_else(|| Error::internal("ce_reduce::pair refused a qualifying pair"))?;
        let src = kernels::ce_reduce_variant(calls[0].dtype, calls[0].op);
        let name = kernels::ce_reduce_kernel(calls[0].dtype, calls[0].op);
        Ok((
            LaunchKind::CeReduce {
                f: c0.function("oxccl_pcopy")?,
                fr: c0.function_in(&src, &name)?,
                plan: p0,
            },
            LaunchKind::CeReduce {
                f: c1.function("oxccl_pcopy")?,
                fr: c1.function_in(&src, &name)?,
                plan: p1,
            },
        ))
    };
    match build() {
        Ok(k) => Some(k),
        Err(e) => {
            oxccl_env::info!(
                oxccl_env::log::Subsys::COLL,
                "copy-engine reduction not taken, the SM kernel runs it: {}",
                e.message()
            );
            None
        }
    }
}

/// A copy kernel launch's collective, for [`ce::pair_collective`].
fn copying(a: &CpArgs) -> ce::Copying {
    if a.mode == PairKernel::Broadcast.mode() {
        ce::Copying::Broadcast {
            input: a.input,
            output: a.output,
            bytes: a.bytes,
            root: a.root,
        }
    } else {
        ce::Copying::AllGather {
            input: a.input,
            output: a.output,
            bytes: a.bytes,
        }
    }
}

impl Launch {
    /// Launches on the stream (this rank's context made current for the
    /// call); returns without waiting for the GPU.
    pub fn go(self) -> Result<()> {
        let c = &self.comm;
        let stream = self.stream as sys::CUstream;
        let tune =
            |algo: &str, proto: &str, blocks: u32| c.log_tuning(self.what, algo, proto, blocks);
        match &self.kind {
            LaunchKind::Half { blocks, .. } | LaunchKind::Pcopy { blocks, .. } => {
                tune("Pair", "Simple", *blocks)
            }
            LaunchKind::Ring {
                kernel,
                blocks,
                xp: None,
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
                let _scope = CtxScope::enter(c.ctx)?;
                guarded("cuMemcpyDtoDAsync", || {
                    // SAFETY: both ranges are device memory of this GPU (checked by the caller).
                    unsafe {
                        check(
                            sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream),
                            "cuMemcpyDtoDAsync",
                        )
                    }
                })
            }
            LaunchKind::Scale { f, blocks, args } => {
                let _scope = CtxScope::enter(c.ctx)?;
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
                let _scope = CtxScope::enter(c.ctx)?;
                let mut seq = lock(&c.seq);
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
                let _scope = CtxScope::enter(c.ctx)?;
                let mut seq = lock(&c.seq);
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
                xp,
            } => {
                if let Some(x) = xp {
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
                let _scope = CtxScope::enter(c.ctx)?;
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
                    let _scope = CtxScope::enter(c.ctx)?;
                    // The copies to itself by SMs on a side stream of
                    // their own (the engines' work uses the stream and side
                    // stream 0), forked before it. Queued after it, they
                    // waited for it (2-process scatters of 256 MB-2 GB out
                    // of place 0.87-0.92x NCCL, in place 1.05-1.08x); on a
                    // copy engine beside it, 0.94-0.96x (2xH200, 2026-11-30).
                    let side = if selfs.is_empty() {
                        None
                    } else {
                        Some(c.ce_side_at(1)?)
                    };
                    if let Some(sd) = side {
                        c.fork_side(sd, stream)?;
                        c.copy_kernels(&selfs, sd.stream as sys::CUstream, SELF_COPY_XP_BLOCKS)?;
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
    /// ([`DevComm::xp_call`] decides whether the call may take them).
    fn set_xp(&mut self, call: two_process::Call) {
        let x = self.comm.xp_call(call, self.stream);
        if let LaunchKind::Ring { xp, .. } = &mut self.kind {
            *xp = x;
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
        let r = Ring::setup(self.dev, self.ctx, self.rank, self.nranks, cfg, boot);
        let out = r.as_ref().map(|_| ()).map_err(Clone::clone);
        let _ = self.ring.set(r);
        out?;
        if let Some(Ok(x)) = self.ring.get() {
            // The pair kernels' waits now observe the ring's abort word and
            // report a timeout through its error word (allreduce::CTL_WORD).
            let timeout = x.timeout_ns();
            let mut b = x.ctrl_device().to_le_bytes().to_vec();
            b.extend_from_slice(&timeout.to_le_bytes());
            let _scope = CtxScope::enter(self.ctx)?;
            copy_to_device(self.flags + 8 * allreduce::CTL_WORD as u64, &b)?;
        }
        if let Err(e) = self.setup_xp(boot) {
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

    /// Whether an operation on `stream` takes the ring path: [`Self::use_ring`],
    /// or the stream is being captured into a CUDA graph (the one-shot
    /// kernels take barrier values from a host counter, which a replay
    /// would repeat; the ring's counters live on the GPU). Every rank must
    /// capture the same operations, as every rank must make the same calls.
    fn ring_for(&self, stream: usize) -> bool {
        self.use_ring() || capturing(stream)
    }

    /// Whether an all-reduce of `bytes` that could take the two-GPU pair
    /// kernel takes the ring's one-shot LL kernel instead: one NVLink
    /// crossing (every rank writes its lines into the other's slots) against
    /// the pair kernel's three (entry barrier, the peer read, exit barrier).
    /// One thread driving both GPUs (nccl-tests -g 2, eager), 8 B-128 KB:
    /// 7.6-9.6 us against 8.6-11.7 (2xH200, 2026-11-30, one job; NCCL
    /// 14-19); on a slower host both were bound by the two launches at
    /// 10.5-12.3 (NCCL 19-22), neither ahead. Both
    /// ranks decide from the same byte count and the same ring settings;
    /// without a ring (not set up) the pair kernel stays.
    fn one_shot_on_ring(&self, bytes: u64) -> bool {
        match self.ring.get() {
            Some(Ok(r)) => {
                let (kernel, _) = ring::plan(Collective::AllReduce, bytes, &r.thresholds());
                (kernel.algorithm(), kernel.protocol()) == (Algo::OneShot, Proto::LL)
            }
            _ => false,
        }
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

    /// Whether operations with peers take the ring path: more than two
    /// ranks, the peer in another process or on this rank's own GPU (the
    /// pair kernels and copy engines need two GPUs; the ring's windows work
    /// within one), or the ring forced.
    fn use_ring(&self) -> bool {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        self.nranks > 2 || self.ring_only.load(Relaxed) || !self.pair.load(Acquire)
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
        let (kernel, blocks) = ring::plan(collective, link_bytes, &r.thresholds());
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
                xp: None,
            },
            stream,
        )
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
        stream: sys::CUstream,
    ) -> Result<()> {
        let selfs = self.self_xfers(&sends, &recvs)?;
        let _scope = CtxScope::enter(self.ctx)?;
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
    fn self_copies(&self, selfs: &[ce::Xfer], stream: sys::CUstream) -> Result<Option<CeSide>> {
        if selfs.is_empty() {
            return Ok(None);
        }
        if selfs.iter().any(|x| x.bytes >= SELF_COPY_SIDE_MIN) {
            let sd = self.ce_side()?;
            self.fork_side(sd, stream)?;
            for x in selfs {
                // SAFETY: both ranges are this GPU's device memory of
                // x.bytes (checked by the caller's prepare).
                unsafe { copy_async(x, sd.stream as sys::CUstream)? };
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
        stream: sys::CUstream,
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
    fn fork_side(&self, sd: CeSide, stream: sys::CUstream) -> Result<()> {
        // An event and a stream of this context (made current by the
        // caller), created by ce_side.
        record_event(sd.fork as sys::CUevent, stream)?;
        wait_event(sd.stream as sys::CUstream, sd.fork as sys::CUevent)
    }

    /// `stream` waits for the side stream's operations so far.
    fn join_side(&self, sd: CeSide, stream: sys::CUstream) -> Result<()> {
        record_event(sd.join as sys::CUevent, sd.stream as sys::CUstream)?;
        wait_event(stream, sd.join as sys::CUevent)
    }

    /// The transfers with other ranks of [`Self::enqueue_p2p`] (none of 0
    /// bytes), and `self_copy` done by the same launch.
    fn enqueue_p2p_peers(
        &self,
        f: KernelFn,
        sends: &[(usize, u64, usize)],
        recvs: &[(usize, u64, usize)],
        self_copy: Option<ce::Xfer>,
        stream: sys::CUstream,
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
            let mut seq = lock(&self.seq);
            let args = CpArgs {
                input,
                output,
                my_flags: self.flags,
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

impl DevComm {
    /// A barrier with the peer on `stream`: the copy kernel with nothing to
    /// copy, one block (the peer launches the same), barrier values from the
    /// shared counter like every pair kernel.
    fn ce_barrier(&self, f: KernelFn, peer_flags: u64, stream: sys::CUstream) -> Result<()> {
        let mut seq = lock(&self.seq);
        let args = CpArgs {
            input: 0,
            output: 0,
            my_flags: self.flags,
            peer_flags,
            bytes: 0,
            seq: *seq,
            mode: PairKernel::SendRecv.mode(),
            rank: self.rank as u32,
            root: 0,
            pad: 0,
            ..Default::default()
        };
        // SAFETY: no buffers (nothing is copied); both flag buffers are live
        // FLAG_BYTES buffers with peer access; the peer's matching launch of
        // the same pair (made by the same launch_all) has one block too.
        unsafe { allreduce::launch_copy(f.raw(), 1, stream, args)? };
        *seq += allreduce::BUDGET;
        Ok(())
    }

    /// The side stream and events, created on first use (context current).
    fn ce_side(&self) -> Result<CeSide> {
        self.ce_side_at(0)
    }

    /// The event of [`enqueue_joint`], created on first use (this rank's context
    /// current).
    fn joint_event(&self) -> Result<sys::CUevent> {
        let mut e = lock(&self.joint_event);
        if *e == 0 {
            *e = guarded("cuEventCreate", || {
                let mut ev: sys::CUevent = std::ptr::null_mut();
                // SAFETY: this rank's context is current (the caller's
                // scope); writes one handle. 2: CU_EVENT_DISABLE_TIMING.
                unsafe { check(sys::cuEventCreate(&mut ev, 2), "cuEventCreate")? };
                Ok(ev as usize)
            })?;
        }
        Ok(*e as sys::CUevent)
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

    /// Side stream `i` (0 or 1) and its events, created on first use.
    fn ce_side_at(&self, i: usize) -> Result<CeSide> {
        let mut sides = lock(&self.ce_side);
        let side = &mut sides[i];
        if let Some(sd) = *side {
            return Ok(sd);
        }
        let sd = guarded("cuStreamCreate", || {
            let mut st: sys::CUstream = std::ptr::null_mut();
            let mut ev = [std::ptr::null_mut(); 2];
            // SAFETY: this rank's context is current (the caller's scope);
            // each call writes one handle; on a failure the ones made are
            // destroyed before returning.
            unsafe {
                // 1: CU_STREAM_NON_BLOCKING (no implicit sync with stream 0).
                check(sys::cuStreamCreate(&mut st, 1), "cuStreamCreate")?;
                for e in ev.iter_mut() {
                    // 2: CU_EVENT_DISABLE_TIMING (ordering only).
                    if let Err(err) = check(sys::cuEventCreate(e, 2), "cuEventCreate") {
                        for made in ev.iter().filter(|x| !x.is_null()) {
                            sys::cuEventDestroy_v2(*made);
                        }
                        sys::cuStreamDestroy_v2(st);
                        return Err(err);
                    }
                }
            }
            Ok(CeSide {
                stream: st as usize,
                fork: ev[0] as usize,
                join: ev[1] as usize,
            })
        })?;
        *side = Some(sd);
        Ok(sd)
    }

    /// Runs this rank's half of a copy-engine call on `stream`: barrier,
    /// the local copies on the side stream beside the pulls from the peer on
    /// `stream`, join, barrier. Returns without waiting.
    fn enqueue_copy_engine(
        &self,
        f: KernelFn,
        plan: &ce::Plan,
        stream: sys::CUstream,
    ) -> Result<()> {
        let peer = self.peer()?;
        let _scope = CtxScope::enter(self.ctx)?;
        self.queue_ce(&|| self.ce_barrier(f, peer.flags, stream), plan, stream)
    }

    /// Queues a copy-engine plan on `stream` between two `barrier`s (this
    /// rank's context current): the pulls on `stream`, the local copies on
    /// the side stream beside them.
    fn queue_ce(
        &self,
        barrier: &dyn Fn() -> Result<()>,
        plan: &ce::Plan,
        stream: sys::CUstream,
    ) -> Result<()> {
        barrier()?;
        let copy = |x: &ce::Xfer, on: sys::CUstream| {
            // SAFETY: the plan's ranges were checked by both ranks' prepare
            // calls to be device memory of their GPUs, which have peer
            // access to each other (unified addressing routes the copy); the
            // barrier before keeps both buffers live.
            unsafe { copy_async(x, on) }
        };
        // A copy between two devices issued into the legacy default stream
        // waits for everything issued before it to either device and holds
        // back everything issued after it to either: the peer's first
        // barrier, issued after this copy, could then never start, and this
        // stream's barrier waits for it (the first device run hung there).
        // So on a default stream (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD)
        // the pulls go to the side stream as well.
        let pulls_on_side = (stream as usize) <= 2;
        let side = if plan.local.is_empty() && !pulls_on_side {
            None
        } else {
            Some(self.ce_side()?)
        };
        if let Some(sd) = side {
            let st = sd.stream as sys::CUstream;
            self.fork_side(sd, stream)?;
            for x in &plan.local {
                copy(x, st)?;
            }
            if pulls_on_side {
                for x in &plan.remote {
                    copy(x, st)?;
                }
            }
        }
        if !pulls_on_side {
            for x in &plan.remote {
                copy(x, stream)?;
            }
        }
        if let Some(sd) = side {
            self.join_side(sd, stream)?;
        }
        barrier()?;
        CE_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl DevComm {
    /// The copy-engine reduction's scratch ring and zeroed flags
    /// ([`ce_reduce::SCRATCH_BYTES`]), allocated on first use. Call it
    /// before the group launches anything (it synchronises the context).
    fn ce_scratch(&self) -> Result<u64> {
        let mut sc = lock(&self.ce_scratch);
        if let Some(p) = *sc {
            return Ok(p);
        }
        let _scope = CtxScope::enter(self.ctx)?;
        // Only the flags must start at zero; the slots are written before read.
        let p = alloc_zeroed(
            ce_reduce::SCRATCH_BYTES as usize,
            ce_reduce::FLAGS_OFFSET,
            ce_reduce::FLAGS_BYTES as usize,
            "copy-engine reduction scratch",
        )?;
        *sc = Some(p);
        Ok(p)
    }

    /// Runs this rank's half of a copy-engine reduction on `stream`
    /// ([`ce_reduce`]): barrier; the reduce kernel on `stream` beside the
    /// copy stream (the side stream) that feeds it; join; barrier; for an
    /// all-reduce the pull of the peer's part and a last barrier. Returns
    /// without waiting.
    fn enqueue_copy_engine_reduce(
        &self,
        f: KernelFn,
        fr: KernelFn,
        plan: &ce_reduce::RankPlan,
        stream: sys::CUstream,
    ) -> Result<()> {
        let peer = self.peer()?;
        let _scope = CtxScope::enter(self.ctx)?;
        // Two copy streams (odd slots on the second): 2 GiB all-reduce 5,794
        // µs against 5,939 with one (370.7 against 361.6 GB/s busbw), 4 GiB
        // 375.9 against 364.4, 1 GiB 361.1 against 355.4; reduce-scatter
        // 4 GiB 359.9 against 342.3 (2xH200, -g 2, 2026-11-30, one machine):
        // a piece's copy starts while the one before lands, instead of
        // after its flag write.
        self.queue_ce_reduce(
            &|| self.ce_barrier(f, peer.flags, stream),
            fr,
            plan,
            stream,
            true,
        )
    }

    /// Queues a copy-engine reduction on `stream` (this rank's context
    /// current), `barrier` between its phases; `two_streams`: the odd
    /// slots' copies and flags on a second side stream.
    fn queue_ce_reduce(
        &self,
        barrier: &dyn Fn() -> Result<()>,
        fr: KernelFn,
        plan: &ce_reduce::RankPlan,
        stream: sys::CUstream,
        two_streams: bool,
    ) -> Result<()> {
        let scratch = (*lock(&self.ce_scratch))
            .ok_or_else(|| Error::internal("copy-engine reduction without its scratch"))?;
        let sd = self.ce_side()?;
        let side = sd.stream as sys::CUstream;
        let flags = scratch + ce_reduce::FLAGS_OFFSET;
        let word = |w: u32| flags + 4 * w as u64;
        barrier()?;
        let r = &plan.reduce;
        if r.count > 0 {
            self.fork_side(sd, stream)?;
            // Each slot's steps stay in order on one stream (its waits,
            // copies and flags), so the schedule holds with two.
            let sd2 = if two_streams {
                let s2 = self.ce_side_at(1)?;
                self.fork_side(s2, stream)?;
                Some(s2)
            } else {
                None
            };
            let side_of = |slot: u32| match sd2 {
                Some(s2) if slot % 2 == 1 => s2.stream as sys::CUstream,
                _ => side,
            };
            // The kernel is queued before the copies it waits for: were the
            // two streams to share a hardware queue, the copies behind a
            // kernel still run, a kernel behind a waiting copy would not.
            let args = allreduce::CerArgs {
                input: r.input,
                output: r.output,
                scratch,
                flags,
                count: r.count,
                piece: r.piece,
                slots: r.slots,
                rank: r.rank,
                ..Default::default()
            };
            // SAFETY: the part's ranges are this GPU's device memory (checked
            // by prepare); the scratch is this communicator's live ring of
            // SCRATCH_BYTES; the steps queued next fill it as the kernel
            // expects (ce_reduce's schedule for this very Reduce).
            unsafe { allreduce::launch_cer(fr.raw(), stream, args)? };
            for st in &plan.steps {
                match *st {
                    ce_reduce::Step::WaitConsumed { slot, value } => {
                        // SAFETY: a flag word inside the live scratch.
                        unsafe {
                            stream_wait32(
                                side_of(slot),
                                word(ce_reduce::CONSUMED_WORD + slot),
                                value,
                            )?
                        }
                    }
                    ce_reduce::Step::ClearConsumed { slot } => {
                        // SAFETY: as above.
                        unsafe {
                            stream_write32(side_of(slot), word(ce_reduce::CONSUMED_WORD + slot), 0)?
                        }
                    }
                    // SAFETY: the peer's input part (checked by its prepare,
                    // live until the barrier after the join) into this GPU's
                    // slot; peer access is enabled both ways.
                    ce_reduce::Step::Pull { xfer, slot } => unsafe {
                        copy_async(&xfer, side_of(slot))?
                    },
                    ce_reduce::Step::Land { slot, value } => {
                        // SAFETY: a flag word inside the live scratch.
                        unsafe { stream_write32(side_of(slot), word(slot), value)? }
                    }
                }
            }
            self.join_side(sd, stream)?;
            if let Some(s2) = sd2 {
                self.join_side(s2, stream)?;
            }
        }
        barrier()?;
        // SAFETY: the peer's output part, written by its kernel before the
        // barrier above, into this GPU's output (`-g 2`), or this rank's
        // part into the peer's mapped output (two processes, two_process::plan; the
        // peer no longer reads that range); both checked by prepare, the
        // barrier after keeps them live.
        unsafe { self.queue_gather(&plan.gather, stream, sd)? };
        if plan.kind == ce_reduce::Kind::AllReduce {
            barrier()?;
        }
        CE_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Queues an all-reduce's gather copies in `stream`'s order (on the
    /// side stream `sd` when `stream` is a default stream: a copy between
    /// devices must not be on one, as in enqueue_copy_engine).
    ///
    /// # Safety
    /// Every copy's ranges are live device memory that nothing else touches
    /// until the stream's next barrier.
    unsafe fn queue_gather(
        &self,
        gather: &[ce::Xfer],
        stream: sys::CUstream,
        sd: CeSide,
    ) -> Result<()> {
        if gather.is_empty() {
            return Ok(());
        }
        let on_side = (stream as usize) <= 2;
        let on = if on_side {
            self.fork_side(sd, stream)?;
            sd.stream as sys::CUstream
        } else {
            stream
        };
        for x in gather {
            // SAFETY: the caller's contract.
            unsafe { copy_async(x, on)? };
        }
        if on_side {
            self.join_side(sd, stream)?;
        }
        Ok(())
    }

    /// Queues this rank's half of a reduction with pushed pieces
    /// ([`ce_reduce::PushedPlan`], two processes) on `stream`: barrier (both
    /// outputs free, both inputs ready); the reduce kernel on `stream`,
    /// whose waits for the peer's pieces are bounded by the ring's abort
    /// word and timeout, beside this rank's pushes into the peer's output on
    /// the side stream, each followed by its count in the peer's landed
    /// counter; join; an all-reduce's gather push (this rank's part is
    /// reduced once the kernel ends, and the peer never touches that part
    /// of its output); a last barrier for an all-reduce (the peer's gather
    /// into this output is done). A reduce-scatter needs none: once the
    /// kernel has seen every piece, nothing of the peer touches this rank's
    /// memory, and the next call pushes only after its first barrier.
    /// Returns without waiting.
    fn queue_pushed(
        &self,
        barrier: &dyn Fn() -> Result<()>,
        fr: KernelFn,
        plan: &ce_reduce::PushedPlan,
        stream: sys::CUstream,
        ring: &ring::Ring,
        peer: usize,
    ) -> Result<()> {
        let no_word = || {
            Error::internal(format!(
                "no window word of the pushed reduction with rank {peer}"
            ))
        };
        // Landing in this rank's copy of the peer's part (an in-place
        // all-reduce), the counter is the other word (plan_pushed_in_place):
        // the copy stream waits on it too, so the kernel does not reset it.
        // Landing in a slot ring (an in-place reduce-scatter), the copy
        // stream waits on the peer kernel's consumed count instead.
        let zone = plan.landing.filter(|l| l.slots == 0);
        let slots = plan.landing.filter(|l| l.slots > 0);
        let word = |owner, other| match zone {
            Some(_) => ring.ce_pushed_word(owner, other),
            None => ring.ce_landed_word(owner, other),
        };
        let mine = word(self.rank, peer).ok_or_else(no_word)?;
        let theirs = word(peer, self.rank).ok_or_else(no_word)?;
        let consumed = [
            ring.ce_consumed_word(self.rank, peer).ok_or_else(no_word)?,
            ring.ce_consumed_word(peer, self.rank).ok_or_else(no_word)?,
        ];
        let fw = match plan.landing {
            Some(_) => self.function_in(
                &kernels::ce_reduce_variant(plan.dtype, plan.op),
                "oxccl_cer_wait",
            )?,
            None => KernelFn::NONE,
        };
        // Pushes alternate on `streams` side streams (ce_reduce::counter_slot).
        let sides = (0..plan.streams.clamp(1, 2) as usize)
            .map(|i| self.ce_side_at(i))
            .collect::<Result<Vec<_>>>()?;
        let sd = sides[0];
        barrier()?;
        if slots.is_some() {
            // The peer's kernel wrote its last count of the previous such
            // call before this barrier, and writes the next one only after
            // this rank's first push lands, queued after this write.
            // SAFETY: this rank's own word in its ring window.
            unsafe { stream_write32(stream, consumed[0], 0)? };
        }
        // The side streams fork here, before the kernel: forked after it, the
        // pushes would wait for this rank's kernel, which waits for the
        // peer's pushes, which wait for the peer's kernel (a deadlock the
        // first device run found).
        let pushing = !plan.pushes.is_empty();
        if pushing {
            for s in &sides {
                self.fork_side(*s, stream)?;
            }
        }
        let r = &plan.reduce;
        if r.count > 0 {
            let args = allreduce::CerArgs {
                input: r.input,
                output: r.output,
                scratch: plan.landing.map_or(0, |l| l.scratch),
                // The slot ring's per-slot block counters (the scratch's
                // flag words, 0 between uses).
                flags: slots.map_or(0, |l| l.scratch + ce_reduce::FLAGS_OFFSET),
                count: r.count,
                piece: r.piece,
                slots: slots.map_or(r.slots, |l| l.slots),
                rank: r.rank,
                landed_at: mine,
                ctrl: ring.ctrl_device(),
                timeout_ns: ring.timeout_ns(),
                peer: peer as u32,
                taper: r.taper,
                zone: zone.map_or(0, |l| l.zone),
                streams: plan.streams,
                consumed_at: slots.map_or(0, |_| consumed[1]),
            };
            // SAFETY: the part's ranges are this GPU's device memory (checked
            // by prepare), the counter and the control words are the live
            // ring's; the peer queues the matching pushes (same plan from the
            // same messages), and a peer that does not is met by the
            // kernel's bounded wait.
            unsafe { allreduce::launch_cer(fr.raw(), stream, args)? };
        }
        if pushing {
            // Queued after the kernel, as in queue_ce_reduce.
            for (k, x) in plan.pushes.iter().enumerate() {
                let (h, v) = ce_reduce::counter_slot(k as u64, plan.streams);
                let side = sides[h as usize].stream as sys::CUstream;
                if let Some(&w) = plan.waits.get(k).filter(|&&w| w > 0) {
                    // In place: this piece lands on values the peer's own
                    // push w - 1 reads, or in a slot whose piece the peer's
                    // kernel must have reduced (its w-th); wait (bounded).
                    let (at, value) = match plan.wait_on {
                        ce_reduce::WaitOn::PeerPushes => {
                            let (wh, wv) = ce_reduce::counter_slot(w as u64 - 1, plan.streams);
                            (mine + 4 * wh as u64, wv)
                        }
                        ce_reduce::WaitOn::PeerConsumed => (consumed[0], w),
                    };
                    let args = allreduce::CerArgs {
                        landed_at: at,
                        count: value as u64,
                        ctrl: ring.ctrl_device(),
                        timeout_ns: ring.timeout_ns(),
                        peer: peer as u32,
                        ..Default::default()
                    };
                    // SAFETY: the live ring's counter and control words;
                    // `fw` is oxccl_cer_wait of this context.
                    unsafe { allreduce::launch_cer_wait(fw.raw(), side, args)? };
                }
                // SAFETY: this rank's input (checked by prepare) into the
                // peer's mapped output part (checked by the peer's prepare,
                // free since the barrier above: the peer's kernel reads it
                // only after this piece's count lands), or in place into the
                // peer's scratch (its first piece) or the part of the peer's
                // buffer that the wait above found sent.
                unsafe { copy_async(x, side)? };
                // This stream's half of the counter (plan_pushed keeps the
                // pieces under 2^31), with the 32-bit write the pulls
                // already use.
                // SAFETY: the peer's landed counter in its mapped window,
                // live as long as the ring.
                unsafe { stream_write32(side, theirs + 4 * h as u64, v)? };
            }
            for s in &sides {
                self.join_side(*s, stream)?;
            }
        }
        if zone.is_some() {
            // In place the peer's kernel reads this rank's pieces from the
            // peer's own part of its buffer, which the gather overwrites:
            // both kernels end first.
            barrier()?;
        }
        // SAFETY: this rank's reduced part (complete in stream order) into
        // the peer's mapped output at the same part, which the peer neither
        // reads nor writes in this call (in place: any more, after the
        // barrier above); live until the barrier below.
        unsafe { self.queue_gather(&plan.gather, stream, sd)? };
        if plan.kind == ce_reduce::Kind::AllReduce {
            barrier()?;
        }
        if zone.is_some() {
            // Back to 0 for the next call: the peer wrote its last count
            // before this rank's kernel ended, and writes the next one only
            // after the next call's first barrier, which this rank reaches
            // after this write.
            for h in 0..sides.len() as u64 {
                // SAFETY: this rank's own counter in its ring window.
                unsafe { stream_write32(stream, mine + 4 * h, 0)? };
            }
        }
        if plan.landing.is_some() {
            CE_IN_PLACE_PUSHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if slots.is_some() {
            CE_RING_PUSHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        CE_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: the caller made a context current; writes one pointer; the
        // memset stays inside the allocation (zero_at + zero_len <= bytes,
        // the callers' constants); the synchronize makes it complete.
        unsafe {
            check(
                sys::cuMemAlloc_v2(&mut p, bytes),
                &format!("cuMemAlloc({what}, {bytes} bytes)"),
            )?;
            let r = check(sys::cuMemsetD8_v2(p + zero_at, 0, zero_len), "cuMemsetD8")
                .and_then(|_| check(sys::cuCtxSynchronize(), "cuCtxSynchronize"));
            if let Err(e) = r {
                sys::cuMemFree_v2(p);
                return Err(e);
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
unsafe fn stream_wait32(stream: sys::CUstream, addr: u64, value: u32) -> Result<()> {
    guarded("cuStreamWaitValue32", || {
        // SAFETY: the caller's contract.
        unsafe {
            check(
                sys::cuStreamWaitValue32_v2(
                    stream,
                    addr,
                    value,
                    sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32,
                ),
                "cuStreamWaitValue32",
            )
        }
    })
}

/// `cuStreamWriteValue32`: `stream` writes `value` to the 32-bit word at
/// `addr` after its earlier work's writes are visible (context current).
///
/// # Safety
/// As [`stream_wait32`].
unsafe fn stream_write32(stream: sys::CUstream, addr: u64, value: u32) -> Result<()> {
    guarded("cuStreamWriteValue32", || {
        // SAFETY: the caller's contract.
        unsafe {
            check(
                sys::cuStreamWriteValue32_v2(
                    stream,
                    addr,
                    value,
                    sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
                ),
                "cuStreamWriteValue32",
            )
        }
    })
}

/// The kernel families with one kernel per (type, op).
#[derive(Debug, Clone, Copy)]
enum Family {
    /// `oxccl_ar1_*` (two GPUs of one process).
    Pair = 0,
    /// `oxccl_ring_*`.
    Ring = 1,
    /// `oxccl_ll1_*` (the small one-shot all-reduce, in the ring's program).
    Small = 2,
    /// `oxccl_scale_*` (a one-rank PreMulSum, in the ring's program).
    Scale = 3,
    /// `oxccl_joint_*` (every rank of a group of one process in one
    /// launch, in the ring's program).
    Joint = 4,
}

/// Reduction ops per type in [`typed_slot`]'s table (sum, prod, max, min,
/// avg, PreMulSum: the scalar travels in the launch's arguments).
const TYPED_OPS: usize = 6;
const TYPED_SLOTS: usize = 5 * DataType::ALL.len() * TYPED_OPS;

/// Where (family, type, op)'s kernel sits in `DevComm::typed`.
fn typed_slot(family: Family, t: DataType, op: RedOp) -> usize {
    (family as usize * DataType::ALL.len() + t as usize) * TYPED_OPS + op.wire_code() as usize
}

impl Drop for DevComm {
    fn drop(&mut self) {
        // The ring first, while this rank still holds its context reference
        // (fields drop after this body, which releases it: the ring's frees
        // would then run in a context that may be gone).
        drop(self.ring.take());
        if let Some(clique) = cliques().get_mut(&self.key) {
            clique.members.retain(|m| m.flags != self.flags);
            clique.update_pair();
        }
        // SAFETY: our flags and our retained context, freed/released once;
        // errors are ignored in drop.
        unsafe {
            let mut saved: sys::CUcontext = std::ptr::null_mut();
            sys::cuCtxGetCurrent(&mut saved);
            if self.flags != 0 && sys::cuCtxSetCurrent(self.ctx) == CUresult::CUDA_SUCCESS {
                sys::cuCtxSynchronize();
                self.close_xp();
                sys::cuMemFree_v2(self.flags);
                if let Some(p) = lock(&self.ce_scratch).take() {
                    sys::cuMemFree_v2(p);
                }
                let e = std::mem::take(&mut *lock(&self.joint_event));
                if e != 0 {
                    sys::cuEventDestroy_v2(e as sys::CUevent);
                }
                for sd in lock(&self.ce_side).iter_mut().filter_map(Option::take) {
                    sys::cuEventDestroy_v2(sd.fork as sys::CUevent);
                    sys::cuEventDestroy_v2(sd.join as sys::CUevent);
                    sys::cuStreamDestroy_v2(sd.stream as sys::CUstream);
                }
            }
            sys::cuCtxSetCurrent(saved);
            sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
        let mut cl = cliques();
        if cl.get(&self.key).is_some_and(|c| c.members.is_empty()) {
            cl.remove(&self.key);
        }
    }
}

/// What `cudaSetDevice(ordinal)` does for the driver API: retains the
/// device's primary context and makes it current on the calling thread (for
/// tests and tools that drive the C API without the CUDA runtime). The
/// reference is kept for the life of the process.
pub fn use_device(ordinal: i32) -> Result<()> {
    loader::driver()?;
    guarded("cuDevicePrimaryCtxRetain", || {
        let mut dev: sys::CUdevice = 0;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointers are valid; the driver was probed.
        unsafe {
            check(sys::cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
            check(
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
            check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        }
    })
}

/// Copies host bytes to device memory (ordered after the legacy default
/// stream's work), landed when it returns: from pageable memory
/// cuMemcpyHtoD returns once the bytes are staged, before the DMA lands, and
/// kernels on non-blocking streams are not ordered after it (CUDA's "API
/// synchronization behavior"), hence the context's synchronize.
pub fn copy_to_device(dst: u64, src: &[u8]) -> Result<()> {
    loader::driver()?;
    guarded("cuMemcpyHtoD", || {
        // SAFETY: the caller passes device memory of at least src.len() bytes.
        unsafe {
            check(
                sys::cuMemcpyHtoD_v2(dst, src.as_ptr() as *const c_void, src.len()),
                "cuMemcpyHtoD",
            )?;
            check(sys::cuCtxSynchronize(), "cuCtxSynchronize")
        }
    })
}

/// Copies device memory to host bytes (synchronous, as [`copy_to_device`]).
pub fn copy_from_device(dst: &mut [u8], src: u64) -> Result<()> {
    loader::driver()?;
    guarded("cuMemcpyDtoH", || {
        // SAFETY: the caller passes device memory of at least dst.len() bytes.
        unsafe {
            check(
                sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len()),
                "cuMemcpyDtoH",
            )
        }
    })
}

/// Waits for all work of the calling thread's current context.
/// The IPC handle of the device allocation starting at `base`, for
/// another process of this host to map it (`ncclCommWindowRegister`);
/// `None` when the allocation cannot be exported (VMM, other allocators).
pub fn export_allocation(base: u64) -> Option<[u8; 64]> {
    two_process_io::ipc_handle(base)
}

/// Maps (or takes another reference to) another process's allocation of
/// `handle` into GPU `ordinal`'s context, which must be current; its
/// address here. Released with [`release_allocation`].
pub fn import_allocation(ordinal: i32, handle: &[u8; 64]) -> Result<u64> {
    two_process_io::import(ordinal, handle)
}

/// Drops a reference from [`import_allocation`]; the last one unmaps it.
/// No queued work may use it (synchronise the context first).
pub fn release_allocation(ordinal: i32, mapped: u64) {
    two_process_io::release(ordinal, mapped)
}

pub fn synchronize_current() -> Result<()> {
    loader::driver()?;
    // SAFETY: no arguments.
    guarded("cuCtxSynchronize", || unsafe {
        check(sys::cuCtxSynchronize(), "cuCtxSynchronize")
    })
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
        let ops = [
            RedOp::Sum,
            RedOp::Prod,
            RedOp::Max,
            RedOp::Min,
            RedOp::Avg,
            RedOp::PreMulSum(oxccl_core::Scalar::F64(2.0)),
        ];
        let mut seen = std::collections::HashSet::new();
        for f in [
            Family::Pair,
            Family::Ring,
            Family::Small,
            Family::Scale,
            Family::Joint,
        ] {
            for t in DataType::ALL {
                for op in ops {
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
