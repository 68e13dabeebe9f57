//! The implementations behind the exported functions. Each checks its
//! arguments first and returns an `oxccl::Error` whose message names the
//! parameter at fault; `lib.rs` turns that into an `ncclResult_t`, a WARN and
//! the text of `ncclGetLastError`.

#![allow(non_snake_case, non_upper_case_globals)]

use crate::abi::*;
use crate::config;
use crate::group::{self, Desc, OpSpec};
use crate::handle::{self, lock, null_arg, Comm, PreMul, State};
use oxccl::gpu::raw::{self as gpu_raw, DeviceOp, DeviceRedOp};
use oxccl::gpu::{self, GpuChoice};
use oxccl::{CollKind, Communicator, Config, DataType, Error, ErrorKind, RedOp, Result, UniqueId};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

fn in_progress() -> Error {
    Error::new(ErrorKind::InProgress, "")
}

fn dtype(v: c_int) -> Result<DataType> {
    DataType::from_raw(v).map_err(|_| {
        Error::invalid_argument(format!(
            "invalid datatype {v} (valid: 0..{})",
            ncclNumTypes - 1
        ))
    })
}

fn rank_arg(what: &str, v: c_int, nranks: usize) -> Result<usize> {
    if v < 0 || v as usize >= nranks {
        return Err(Error::invalid_argument(format!(
            "invalid {what} {v} (valid: 0..{} for a communicator of {nranks} ranks)",
            nranks.saturating_sub(1)
        )));
    }
    Ok(v as usize)
}

/// The reduction for an `ncclRedOp_t` value on `comm` for data of type `t`.
fn red_op(comm: &Comm, op: c_int, t: DataType) -> Result<OpSpec> {
    if (0..ncclNumOps).contains(&op) {
        return Ok(OpSpec::Builtin(RedOp::from_raw(op)?));
    }
    let slot = if op >= ncclNumOps {
        lock(&comm.ops)
            .get((op - ncclNumOps) as usize)
            .copied()
            .flatten()
    } else {
        None
    };
    let Some(p) = slot else {
        return Err(Error::invalid_argument(format!(
            "invalid reduction op {op} (valid: 0..{} or an op created on this communicator by ncclRedOpCreatePreMulSum)",
            ncclNumOps - 1
        )));
    };
    let (PreMul::Immediate(_, pt) | PreMul::Device(_, pt)) = p;
    if pt != t {
        return Err(Error::invalid_argument(format!(
            "reduction op {op} was created for datatype {} ({pt}) but the call uses {} ({t})",
            pt as i32, t as i32
        )));
    }
    Ok(OpSpec::from_premul(p))
}

/// A collective or send/receive: checks, then queues (inside a group) or runs.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn collective(
    kind: CollKind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: c_int,
    op: Option<c_int>,
    root: Option<c_int>,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> Result<()> {
    let r = (|| {
        let c = handle::lookup(comm, "comm")?;
        c.check_not_stopped()?;
        let t = dtype(datatype)?;
        let spec = match op {
            Some(o) => red_op(&c, o, t)?,
            None => OpSpec::Builtin(RedOp::Sum),
        };
        let (rank, nranks) = match c.dims() {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::InProgress && !group::in_group() => {
                c.wait()?;
                c.dims()?
            }
            Err(e) if e.kind() == ErrorKind::InProgress => {
                return Err(Error::invalid_usage(
                    "the communicator is still being created; call ncclGroupEnd (and wait for ncclCommGetAsyncError to return ncclSuccess) before using it",
                ))
            }
            Err(e) => return Err(e),
        };
        let root = match root {
            Some(r) => {
                let what = if matches!(kind, CollKind::Send | CollKind::Recv) {
                    "peer"
                } else {
                    "root"
                };
                rank_arg(what, r, nranks)?
            }
            None => 0,
        };
        let is_root = rank == root;
        let (need_s, need_r) = match kind {
            CollKind::Broadcast | CollKind::Scatter => (is_root, true),
            CollKind::Reduce | CollKind::Gather => (true, is_root),
            CollKind::Send => (true, false),
            CollKind::Recv => (false, true),
            _ => (true, true),
        };
        if count > 0 && need_s && send.is_null() {
            return Err(Error::invalid_argument(format!(
                "sendbuff is NULL with count {count}"
            )));
        }
        if count > 0 && need_r && recv.is_null() {
            return Err(Error::invalid_argument(format!(
                "recvbuff is NULL with count {count}"
            )));
        }
        // A collective of 0 elements has nothing to move or meet: checked
        // (above), then done, as NCCL does (measured on 2xH200: an empty
        // all-to-all took 1.5-5 µs through the routing, NCCL's 0.5).
        // Sends and receives of 0 still go through (they pair up in groups).
        if count == 0 && !matches!(kind, CollKind::Send | CollKind::Recv) {
            return Ok(());
        }
        if let Some(bufs) = gpu_raw::locate_buffers(send, recv)? {
            let comm = match c.ready_now() {
                Some(x) => x,
                None if group::in_group() => {
                    return Err(Error::invalid_usage(
                        "the communicator is still being created; call ncclGroupEnd (and wait for ncclCommGetAsyncError to return ncclSuccess) before using it",
                    ))
                }
                None => c.wait()?,
            };
            let op = DeviceOp {
                kind,
                send: send as u64,
                recv: recv as u64,
                count,
                dtype: t,
                op: match spec {
                    OpSpec::Builtin(o) => DeviceRedOp::Op(o),
                    OpSpec::DeviceScalar(a, st) => DeviceRedOp::PreMulSumAt(a, st),
                },
                root,
                stream: stream as usize,
            };
            // SAFETY: the C caller keeps the buffers valid until the
            // operation has run on its stream (NCCL's contract), a
            // ncclScalarDevice scalar while the op is used, and passes a
            // stream of the buffers' device.
            let launch = unsafe { comm.prepare_device(&op, &bufs) }?;
            if group::in_group() {
                group::note(&c, kind, count.saturating_mul(t.size()), true);
                group::enqueue_device(c, launch);
                return Ok(());
            }
            return launch.launch();
        }
        let d = Desc {
            kind,
            send: send.cast(),
            recv: recv.cast(),
            count,
            dtype: t,
            op: spec,
            root,
        };
        if group::in_group() {
            group::note(&c, kind, count.saturating_mul(t.size()), false);
            group::enqueue(c, d);
            Ok(())
        } else {
            group::execute(vec![(c, d)])
        }
    })();
    if let Err(e) = &r {
        group::record_error(e);
    }
    r
}

pub(crate) unsafe fn get_version(version: *mut c_int) -> Result<()> {
    if version.is_null() {
        return Err(null_arg("version"));
    }
    // SAFETY: checked non-NULL; the caller passes a writable int.
    unsafe { version.write(NCCL_VERSION_CODE) };
    Ok(())
}

pub(crate) unsafe fn get_unique_id(out: *mut ncclUniqueId) -> Result<()> {
    if out.is_null() {
        return Err(null_arg("uniqueId"));
    }
    // SAFETY: checked non-NULL; the caller passes a writable ncclUniqueId.
    unsafe { out.write(to_nccl_id(&UniqueId::new()?)) };
    Ok(())
}

fn to_nccl_id(id: &UniqueId) -> ncclUniqueId {
    let mut u = ncclUniqueId::default();
    for (d, s) in u.internal.iter_mut().zip(id.as_bytes()) {
        *d = *s as _;
    }
    u
}

/// `ncclCommGetUniqueId`: a fresh id to grow `comm` with, its root in this
/// process. One at a time per communicator: a second call before a grow
/// used the first is refused (NCCL's rule).
pub(crate) unsafe fn comm_get_unique_id(comm: ncclComm_t, out: *mut ncclUniqueId) -> Result<()> {
    let c = handle::lookup(comm, "comm")?;
    if out.is_null() {
        return Err(null_arg("uniqueId"));
    }
    let mut pending = lock(&c.grow_id);
    if pending.is_some() {
        return Err(Error::invalid_usage(
            "the unique id of an earlier ncclCommGetUniqueId on this comm was not consumed by ncclCommGrow yet",
        ));
    }
    let id = c.wait()?.grow_id()?;
    *pending = Some(*id.as_bytes());
    // SAFETY: checked non-NULL; the caller passes a writable ncclUniqueId.
    unsafe { out.write(to_nccl_id(&id)) };
    Ok(())
}

/// `ncclCommGrow`. A new rank passes `comm` NULL, the id and its rank (as
/// `ncclCommInitRankConfig`); an existing rank passes `comm`, rank -1 and
/// the id if it made it with `ncclCommGetUniqueId` (exactly one does), else
/// NULL, and keeps its rank in the new communicator.
pub(crate) unsafe fn comm_grow(
    comm: ncclComm_t,
    nranks: c_int,
    id: *const ncclUniqueId,
    rank: c_int,
    out: *mut ncclComm_t,
    cfg: *const u8,
) -> Result<()> {
    if out.is_null() {
        return Err(null_arg("newcomm"));
    }
    if comm.is_null() {
        if id.is_null() {
            return Err(Error::invalid_argument(
                "uniqueId is NULL: a new rank (comm NULL) passes the id from ncclCommGetUniqueId",
            ));
        }
        // SAFETY: checked non-NULL; forwarded.
        return unsafe { init_rank_config(out, nranks, *id, rank, cfg) };
    }
    // SAFETY: forwarded.
    let parent = unsafe { child_parent(comm, out) }?;
    let (me, n) = ready_dims(&parent)?;
    if rank != -1 {
        return Err(Error::invalid_argument(format!(
            "rank {rank}: an existing rank passes -1 (it keeps its rank, {me})"
        )));
    }
    if nranks < 0 || nranks as usize <= n {
        return Err(Error::invalid_argument(format!(
            "nRanks {nranks} must exceed the communicator's {n} ranks"
        )));
    }
    let uid = if id.is_null() {
        None
    } else {
        // SAFETY: checked non-NULL.
        let bytes = id_bytes(unsafe { &*id });
        Some(UniqueId::from_bytes(&bytes).map_err(|e| {
            Error::invalid_argument(format!(
                "uniqueId is not an id from ncclCommGetUniqueId: {}",
                e.message()
            ))
        })?)
    };
    // SAFETY: forwarded.
    let (ocfg, blocking) = unsafe { child_config(&parent, cfg) }?;
    if uid.is_some() {
        // Consumed (NCCL's rule), whether or not the grow succeeds.
        *lock(&parent.grow_id) = None;
    }
    let total = nranks as usize;
    // SAFETY: forwarded.
    unsafe {
        make_child(&parent, ocfg, blocking, out, move |p| {
            p.grow(total, uid.as_ref()).map(Some)
        })
    }
}

fn id_bytes(id: &ncclUniqueId) -> [u8; 128] {
    let mut b = [0u8; 128];
    for (d, s) in b.iter_mut().zip(id.internal.iter()) {
        *d = *s as u8;
    }
    b
}

/// The rank's index among the ranks this process created for the same unique id
/// (what `ncclCommCuDevice` reports on the host).
fn local_index(id: &[u8; 128]) -> i32 {
    static SEEN: OnceLock<Mutex<HashMap<[u8; 128], i32>>> = OnceLock::new();
    let mut m = lock(SEEN.get_or_init(|| Mutex::new(HashMap::new())));
    let e = m.entry(*id).or_insert(0);
    let v = *e;
    *e += 1;
    v
}

pub(crate) unsafe fn init_rank_config(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    cfg: *const u8,
) -> Result<()> {
    if out.is_null() {
        return Err(null_arg("comm (the output pointer)"));
    }
    // SAFETY: checked non-NULL; the caller passes a writable ncclComm_t.
    unsafe { out.write(std::ptr::null_mut()) };
    if nranks < 1 {
        return Err(Error::invalid_argument(format!(
            "invalid nranks {nranks} (must be at least 1)"
        )));
    }
    let rank = rank_arg("rank", rank, nranks as usize)?;
    let nranks = nranks as usize;
    // SAFETY: forwarded: config is NULL or an initialised ncclConfig_t.
    let parsed = unsafe { config::parse(cfg) }?;
    let bytes = id_bytes(&id);
    let uid = UniqueId::from_bytes(&bytes).map_err(|e| {
        Error::invalid_argument(format!(
            "commId is not a unique id from ncclGetUniqueId: {}",
            e.message()
        ))
    })?;
    let blocking = config::blocking(parsed.blocking);
    // The calling thread's current CUDA device (cudaSetDevice), read here:
    // creation inside a group runs on other threads.
    let cuda_dev = gpu::current_device();
    let index = local_index(&bytes);
    let device = cuda_dev.unwrap_or(index);
    // Every communicator of the C ABI takes part in the GPU setup, with
    // this thread's device or without one.
    let ocfg = Config {
        gpu: cuda_dev.map_or(GpuChoice::NoDevice, GpuChoice::Device),
        ..parsed.config
    };
    if group::in_group() || !blocking {
        let c = Comm::new(
            Some((rank, nranks)),
            device,
            blocking,
            ocfg.clone(),
            State::Pending,
        );
        let h = handle::register(c.clone());
        // SAFETY: as above.
        unsafe { out.write(h) };
        let job: group::Job = Box::new(move || {
            let comm = Communicator::init_rank_config(nranks, &uid, rank, ocfg)?;
            Ok(Some(comm))
        });
        if group::in_group() {
            group::defer(Some(c), job);
            return Ok(());
        }
        spawn_init(c, job)?;
        return Err(in_progress());
    }
    let comm = Communicator::init_rank_config(nranks, &uid, rank, ocfg.clone())?;
    let c = Comm::ready(comm, device, blocking, ocfg);
    let h = handle::register(c);
    // SAFETY: as above.
    unsafe { out.write(h) };
    Ok(())
}

/// Runs a non-blocking creation on its own thread.
fn spawn_init(c: Arc<Comm>, job: group::Job) -> Result<()> {
    let target = c.clone();
    std::thread::Builder::new()
        .name("oxccl-init".into())
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                .unwrap_or_else(|_| Err(Error::internal("communicator creation panicked")));
            target.finish(r);
        })
        .map_err(|e| {
            c.finish(Err(Error::system(format!(
                "cannot start an init thread: {e}"
            ))));
            Error::system(format!("cannot start an init thread: {e}"))
        })?;
    Ok(())
}

pub(crate) unsafe fn init_rank_scalable(
    out: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    n_id: c_int,
    ids: *const ncclUniqueId,
    cfg: *const u8,
) -> Result<()> {
    if n_id < 1 {
        return Err(Error::invalid_argument(format!(
            "invalid nId {n_id} (must be at least 1)"
        )));
    }
    if ids.is_null() {
        return Err(null_arg("commIds"));
    }
    // Every rank holds the same nId ids; oxccl needs one root, so all ranks
    // meet at the first id's root.
    // SAFETY: checked non-NULL; the caller passes nId >= 1 ids.
    let id = unsafe { ids.read() };
    // SAFETY: forwarded.
    unsafe { init_rank_config(out, nranks, id, myrank, cfg) }
}

pub(crate) unsafe fn init_all(
    out: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> Result<()> {
    if out.is_null() {
        return Err(null_arg("comms"));
    }
    if ndev < 1 {
        return Err(Error::invalid_argument(format!(
            "invalid ndev {ndev} (must be at least 1)"
        )));
    }
    let n = ndev as usize;
    let mut devs: Vec<i32> = (0..ndev).collect();
    if !devlist.is_null() {
        // SAFETY: a non-NULL devlist has ndev entries (NCCL's contract).
        let d = unsafe { std::slice::from_raw_parts(devlist, n) };
        for (i, &v) in d.iter().enumerate() {
            if v < 0 {
                return Err(Error::invalid_argument(format!(
                    "devlist[{i}] = {v} is not a device index"
                )));
            }
            if d[..i].contains(&v) {
                return Err(Error::invalid_argument(format!(
                    "devlist[{i}] = {v} appears twice"
                )));
            }
        }
        devs = d.to_vec();
    }
    // Every rank is a set of threads, sockets and rings in this process:
    // 10000 ranks once ran for minutes toward 12,000 threads before failing.
    let ring_bytes = Config::default().host_settings().capacity as u64;
    crate::limits::check_init_all(n as u64, ring_bytes, crate::limits::room())?;
    let blocking = config::blocking(None);
    let has_gpu = gpu::available();
    let comms = Communicator::init_all_config(n, |i| Config {
        gpu: if has_gpu {
            GpuChoice::Device(devs[i])
        } else {
            GpuChoice::NoDevice
        },
        ..Config::default()
    })?;
    let ready: Vec<Arc<Comm>> = comms
        .into_iter()
        .enumerate()
        .map(|(i, c)| Comm::ready(c, devs[i], blocking, oxccl::Config::default()))
        .collect();
    for (i, comm) in ready.into_iter().enumerate() {
        let h = handle::register(comm);
        // SAFETY: a non-NULL comms has ndev writable entries (NCCL's contract).
        unsafe { out.add(i).write(h) };
    }
    Ok(())
}

pub(crate) unsafe fn comm_split(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    out: *mut ncclComm_t,
    cfg: *const u8,
) -> Result<()> {
    // SAFETY: forwarded.
    let parent = unsafe { child_parent(comm, out) }?;
    if color < NCCL_SPLIT_NOCOLOR {
        return Err(Error::invalid_argument(format!(
            "invalid color {color} (must be >= 0 or NCCL_SPLIT_NOCOLOR)"
        )));
    }
    let col = (color >= 0).then_some(color as u32);
    // SAFETY: forwarded.
    let (ocfg, blocking) = unsafe { child_config(&parent, cfg) }?;
    if col.is_none() {
        // Takes part in the split (it is collective) but makes no communicator.
        let job = child_job(&parent, move |p| p.split(None, key));
        if group::in_group() {
            group::defer(None, job);
            return Ok(());
        }
        return job().map(|_| ());
    }
    // SAFETY: forwarded.
    unsafe { make_child(&parent, ocfg, blocking, out, move |p| p.split(col, key)) }
}

/// `ncclCommShrink`: the ranks of `comm` without `excludeRanksList`, in
/// parent order. The list is read, never reordered (NCCL sorts the caller's
/// array in place). `NCCL_SHRINK_ABORT` first stops the parent's operations
/// in flight, host and GPU, which then stay refused (see
/// [`oxccl::Communicator::revoke`] for why).
pub(crate) unsafe fn comm_shrink(
    comm: ncclComm_t,
    exclude: *const c_int,
    count: c_int,
    out: *mut ncclComm_t,
    cfg: *const u8,
    flags: c_int,
) -> Result<()> {
    // SAFETY: forwarded.
    let parent = unsafe { child_parent(comm, out) }?;
    if exclude.is_null() {
        return Err(null_arg("excludeRanksList"));
    }
    if count <= 0 {
        return Err(Error::invalid_argument(format!(
            "excludeRanksCount {count} must be at least 1"
        )));
    }
    if flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT {
        return Err(Error::invalid_argument(format!(
            "shrinkFlags {flags:#x} is not NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)"
        )));
    }
    // SAFETY: the caller passes `count` ints at `exclude` (checked non-NULL).
    let list = unsafe { std::slice::from_raw_parts(exclude, count as usize) };
    let (rank, nranks) = ready_dims(&parent)?;
    let mut ranks = Vec::with_capacity(list.len());
    for (i, &r) in list.iter().enumerate() {
        if r < 0 || r as usize >= nranks {
            return Err(Error::invalid_argument(format!(
                "excludeRanksList[{i}] = {r} is not a rank of this communicator (0..{nranks})"
            )));
        }
        if r as usize == rank {
            return Err(Error::invalid_argument(format!(
                "excludeRanksList[{i}] = {r} is this rank: excluded ranks must not call ncclCommShrink"
            )));
        }
        ranks.push(r as usize);
    }
    // SAFETY: forwarded.
    let (ocfg, blocking) = unsafe { child_config(&parent, cfg) }?;
    if flags == NCCL_SHRINK_ABORT {
        parent.stop_operations();
    }
    // SAFETY: forwarded.
    unsafe {
        make_child(&parent, ocfg, blocking, out, move |p| {
            p.shrink(&ranks).map(Some)
        })
    }
}

/// The parent of a child creation (split, shrink, grow), with `*out` set
/// to NULL first, so that it is NULL on every failure, the parent's too.
unsafe fn child_parent(comm: ncclComm_t, out: *mut ncclComm_t) -> Result<Arc<Comm>> {
    if !out.is_null() {
        // SAFETY: checked non-NULL; the caller passes a writable ncclComm_t.
        unsafe { out.write(std::ptr::null_mut()) };
    }
    let parent = handle::lookup(comm, "comm")?;
    if out.is_null() {
        return Err(null_arg("newcomm"));
    }
    Ok(parent)
}

/// (rank, nranks) of a parent that must be ready (shrink, grow need them
/// before anything runs).
fn ready_dims(parent: &Comm) -> Result<(usize, usize)> {
    parent.dims().map_err(|e| match e.kind() {
        ErrorKind::InProgress => Error::invalid_usage(
            "comm is still being created (ncclCommGetAsyncError says ncclInProgress): wait for it to be ready first",
        ),
        _ => e,
    })
}

/// A child's settings: the parent's when `cfg` is NULL.
unsafe fn child_config(parent: &Comm, cfg: *const u8) -> Result<(Config, bool)> {
    if cfg.is_null() {
        return Ok((parent.config.clone(), parent.blocking));
    }
    // SAFETY: forwarded.
    let p = unsafe { config::parse(cfg) }?;
    let b = config::blocking(p.blocking.or(Some(parent.blocking)));
    Ok((p.config, b))
}

/// The work that makes a child of `parent` (split, shrink, grow) once the
/// parent is ready. The child gets the parent's GPU (the same device, a
/// ring of its own): `oxccl::Communicator` passes it on.
fn child_job(
    parent: &Arc<Comm>,
    make: impl FnOnce(Communicator) -> Result<Option<Communicator>> + Send + 'static,
) -> group::Job {
    let p = parent.clone();
    Box::new(move || make(p.wait()?))
}

/// Makes a child communicator and its handle: at once when blocking;
/// deferred to `ncclGroupEnd` inside a group; on a thread otherwise
/// (`ncclInProgress`, the handle pending until it ends).
unsafe fn make_child(
    parent: &Arc<Comm>,
    cfg: Config,
    blocking: bool,
    out: *mut ncclComm_t,
    make: impl FnOnce(Communicator) -> Result<Option<Communicator>> + Send + 'static,
) -> Result<()> {
    let c = Comm::new(None, parent.device, blocking, cfg, State::Pending);
    let job = child_job(parent, make);
    if group::in_group() || !blocking {
        let h = handle::register(c.clone());
        // SAFETY: the callers checked `out` non-NULL.
        unsafe { out.write(h) };
        if group::in_group() {
            group::defer(Some(c), job);
            return Ok(());
        }
        spawn_init(c, job)?;
        return Err(in_progress());
    }
    match job()? {
        Some(nc) => {
            c.finish(Ok(Some(nc)));
            // SAFETY: the callers checked `out` non-NULL.
            unsafe { out.write(handle::register(c)) };
            Ok(())
        }
        None => Err(Error::internal("a child with a color made no communicator")),
    }
}

pub(crate) fn comm_finalize(comm: ncclComm_t) -> Result<()> {
    let c = handle::lookup(comm, "comm")?;
    if c.is_revoked() {
        return Err(Error::invalid_usage(
            "comm was revoked: ncclCommFinalize after ncclCommRevoke is invalid (destroy or abort it)",
        ));
    }
    c.wait().map(|_| ())
}

/// `ncclCommRevoke`: stops the rank's operations in flight, host and GPU,
/// and refuses later ones; split, shrink, destroy and abort still work.
/// Returns once no host operation of the rank runs (GPU kernels leave
/// their waits within about a millisecond). NULL is a no-op, as in NCCL.
pub(crate) fn comm_revoke(comm: ncclComm_t, flags: c_int) -> Result<()> {
    if comm.is_null() {
        return Ok(());
    }
    let c = handle::lookup(comm, "comm")?;
    if flags != NCCL_REVOKE_DEFAULT {
        return Err(Error::invalid_argument(format!(
            "revokeFlags {flags:#x} must be NCCL_REVOKE_DEFAULT (0)"
        )));
    }
    c.revoke()
}

pub(crate) fn comm_destroy(comm: ncclComm_t) -> Result<()> {
    let c = handle::unregister(comm, "comm")?;
    crate::window::drop_comm(comm);
    c.destroy()
}

pub(crate) fn comm_abort(comm: ncclComm_t) -> Result<()> {
    if comm.is_null() {
        // NCCL accepts a NULL communicator here and does nothing.
        return Ok(());
    }
    let c = handle::unregister(comm, "comm")?;
    c.abort();
    Ok(())
}

pub(crate) unsafe fn comm_get_async_error(comm: ncclComm_t, out: *mut ncclResult_t) -> Result<()> {
    let c = handle::lookup(comm, "comm")?;
    if out.is_null() {
        return Err(null_arg("asyncError"));
    }
    // SAFETY: checked non-NULL.
    unsafe { out.write(c.async_code()) };
    Ok(())
}

pub(crate) unsafe fn comm_count(comm: ncclComm_t, out: *mut c_int) -> Result<()> {
    let c = handle::lookup(comm, "comm")?;
    if out.is_null() {
        return Err(null_arg("count"));
    }
    let (_, n) = c.dims()?;
    // SAFETY: checked non-NULL.
    unsafe { out.write(n as c_int) };
    Ok(())
}

pub(crate) unsafe fn comm_user_rank(comm: ncclComm_t, out: *mut c_int) -> Result<()> {
    let c = handle::lookup(comm, "comm")?;
    if out.is_null() {
        return Err(null_arg("rank"));
    }
    let (r, _) = c.dims()?;
    // SAFETY: checked non-NULL.
    unsafe { out.write(r as c_int) };
    Ok(())
}

pub(crate) unsafe fn comm_cu_device(comm: ncclComm_t, out: *mut c_int) -> Result<()> {
    let c = handle::lookup(comm, "comm")?;
    if out.is_null() {
        return Err(null_arg("device"));
    }
    // SAFETY: checked non-NULL.
    unsafe { out.write(c.device) };
    Ok(())
}

pub(crate) unsafe fn red_op_create_pre_mul_sum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: c_int,
    residence: c_int,
    comm: ncclComm_t,
) -> Result<()> {
    let c = handle::lookup(comm, "comm")?;
    if op.is_null() {
        return Err(null_arg("op"));
    }
    if scalar.is_null() {
        return Err(null_arg("scalar"));
    }
    let t = dtype(datatype)?;
    let p = match residence {
        ncclScalarHostImmediate => {
            // SAFETY: the caller passes a readable value of type `datatype`.
            PreMul::Immediate(unsafe { gpu_raw::read_scalar(scalar as usize, t) }, t)
        }
        ncclScalarDevice => PreMul::Device(scalar as usize, t),
        _ => {
            return Err(Error::invalid_argument(format!(
            "invalid residence {residence} (valid: 0 ncclScalarDevice, 1 ncclScalarHostImmediate)"
        )))
        }
    };
    let mut ops = lock(&c.ops);
    let i = match ops.iter().position(Option::is_none) {
        Some(i) => {
            ops[i] = Some(p);
            i
        }
        None => {
            if ops.len() >= (c_int::MAX - ncclNumOps) as usize {
                return Err(Error::invalid_usage(
                    "too many reduction ops on this communicator",
                ));
            }
            ops.push(Some(p));
            ops.len() - 1
        }
    };
    // SAFETY: checked non-NULL.
    unsafe { op.write(ncclNumOps + i as c_int) };
    Ok(())
}

pub(crate) fn red_op_destroy(op: ncclRedOp_t, comm: ncclComm_t) -> Result<()> {
    let c = handle::lookup(comm, "comm")?;
    if (0..ncclNumOps).contains(&op) {
        return Err(Error::invalid_argument(format!(
            "op {op} is a built-in reduction op and cannot be destroyed"
        )));
    }
    let mut ops = lock(&c.ops);
    let slot = if op >= ncclNumOps {
        ops.get_mut((op - ncclNumOps) as usize)
    } else {
        None
    };
    match slot {
        Some(s @ Some(_)) => {
            *s = None;
            while ops.last().is_some_and(Option::is_none) {
                ops.pop();
            }
            Ok(())
        }
        _ => Err(Error::invalid_argument(format!(
            "op {op} is not a reduction op created on this communicator"
        ))),
    }
}

/// Host allocations of `ncclMemAlloc`: address -> layout.
fn allocations() -> std::sync::MutexGuard<'static, HashMap<usize, std::alloc::Layout>> {
    static A: OnceLock<Mutex<HashMap<usize, std::alloc::Layout>>> = OnceLock::new();
    lock(A.get_or_init(|| Mutex::new(HashMap::new())))
}

/// Alignment of `ncclMemAlloc` buffers (a page; NCCL's window alignment).
pub(crate) const MEM_ALIGN: usize = 4096;

pub(crate) unsafe fn mem_alloc(ptr: *mut *mut c_void, size: usize) -> Result<()> {
    if ptr.is_null() {
        return Err(null_arg("ptr"));
    }
    // Device memory of the current CUDA device when a context is current.
    if let Some(p) = gpu_raw::alloc_on_current_device(size)? {
        // SAFETY: checked non-NULL.
        unsafe { ptr.write(p as *mut c_void) };
        return Ok(());
    }
    let layout = std::alloc::Layout::from_size_align(size.max(1), MEM_ALIGN).map_err(|_| {
        Error::invalid_argument(format!("size {size} is larger than any allocation can be"))
    })?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(Error::system(format!(
            "cannot allocate {size} bytes of host memory"
        )));
    }
    allocations().insert(p as usize, layout);
    // SAFETY: checked non-NULL.
    unsafe { ptr.write(p.cast()) };
    Ok(())
}

pub(crate) fn mem_free(ptr: *mut c_void) -> Result<()> {
    if ptr.is_null() {
        return Ok(());
    }
    let host = allocations().remove(&(ptr as usize));
    let Some(layout) = host else {
        if gpu_raw::free_device_allocation(ptr as u64)? {
            return Ok(());
        }
        return Err(Error::invalid_argument(format!(
            "ptr {ptr:p} was not allocated by ncclMemAlloc (or was already freed)"
        )));
    };
    // SAFETY: `ptr` came from alloc_zeroed with this layout and is freed once
    // (it was just removed from the table).
    unsafe { std::alloc::dealloc(ptr.cast(), layout) };
    Ok(())
}

pub(crate) unsafe fn comm_register(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle_out: *mut *mut c_void,
) -> Result<()> {
    let c = handle::lookup(comm, "comm")?;
    if handle_out.is_null() {
        return Err(null_arg("handle"));
    }
    if buff.is_null() && size > 0 {
        return Err(Error::invalid_argument(format!(
            "buff is NULL with size {size}"
        )));
    }
    // Host memory needs no registration: the handle only identifies the call.
    let b = Box::new((buff as usize, size));
    let key = &*b as *const (usize, usize) as usize;
    lock(&c.regs).insert(key, b);
    // SAFETY: checked non-NULL.
    unsafe { handle_out.write(key as *mut c_void) };
    Ok(())
}

pub(crate) fn comm_deregister(comm: ncclComm_t, h: *mut c_void) -> Result<()> {
    let c = handle::lookup(comm, "comm")?;
    if h.is_null() {
        return Err(null_arg("handle"));
    }
    let removed = lock(&c.regs).remove(&(h as usize));
    match removed {
        Some(_) => Ok(()),
        None => Err(Error::invalid_argument(format!(
            "handle {h:p} is not a registration of this communicator"
        ))),
    }
}

pub(crate) fn group_start() -> Result<()> {
    group::start();
    Ok(())
}

pub(crate) fn group_end() -> Result<()> {
    group::end()
}

pub(crate) unsafe fn group_simulate_end(info: *mut ncclSimInfo_t) -> Result<()> {
    if info.is_null() {
        return Err(null_arg("simInfo"));
    }
    // SAFETY: checked non-NULL; the caller passes an initialised ncclSimInfo_t.
    let magic = unsafe { std::ptr::addr_of!((*info).magic).read_unaligned() };
    if magic != NCCL_SIM_INFO_MAGIC {
        return Err(Error::invalid_argument(format!(
            "ncclSimInfo_t argument not initialized via NCCL_SIM_INFO_INITIALIZER (magic 0x{magic:x})"
        )));
    }
    // The group level is closed (its operations are dropped, not run) so the
    // caller's group nesting stays balanced.
    let us = group::end_simulate()?;
    // SAFETY: checked non-NULL; the magic says it is an ncclSimInfo_t, whose
    // estimatedTime every version since the magic has.
    unsafe { std::ptr::addr_of_mut!((*info).estimatedTime).write_unaligned(us as f32) };
    Ok(())
}
