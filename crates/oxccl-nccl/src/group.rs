//! `ncclGroupStart` / `ncclGroupEnd`: per-thread nesting, queued operations
//! and deferred communicator creation.
//!
//! Inside a group (depth > 0 on this thread) collectives and send/receive are
//! queued and communicator creations (`ncclCommInitRank*`, `ncclCommSplit`)
//! are deferred; the outermost `ncclGroupEnd` first runs the creations, one
//! thread each, all at once (so one thread can create the several ranks it
//! drives, as nccl-tests does), then every queued operation of every
//! communicator together through `oxccl::raw::run_group`.

use crate::handle::{touch, Comm, PreMul};
use oxccl::raw::OpDesc;
use oxccl::{CollKind, Communicator, DataType, Error, ErrorKind, RedOp, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// The reduction of a queued operation.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpSpec {
    Builtin(RedOp),
    /// A pre-multiplied sum whose scalar is read when the operation runs.
    DeviceScalar(usize, DataType),
}

impl OpSpec {
    pub fn from_premul(p: PreMul) -> OpSpec {
        match p {
            PreMul::Immediate(s, _) => OpSpec::Builtin(RedOp::PreMulSum(s)),
            PreMul::Device(a, t) => OpSpec::DeviceScalar(a, t),
        }
    }
}

/// One operation, checked and ready to run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Desc {
    pub kind: CollKind,
    pub send: *const u8,
    pub recv: *mut u8,
    pub count: usize,
    pub dtype: DataType,
    pub op: OpSpec,
    pub root: usize,
}

/// A creation to run at the outermost `ncclGroupEnd`.
pub(crate) type Job = Box<dyn FnOnce() -> Result<Option<Communicator>> + Send>;

struct Deferred {
    /// None for a split with `NCCL_SPLIT_NOCOLOR` (it takes part, makes nothing).
    target: Option<Arc<Comm>>,
    job: Job,
}

#[derive(Default)]
struct GroupState {
    depth: usize,
    ops: Vec<(Arc<Comm>, Desc)>,
    /// Operations on device buffers, checked, launched at the outermost end
    /// in issue order (before the host operations, which block).
    dev_ops: Vec<(Arc<Comm>, oxccl::gpu::raw::DeviceLaunch)>,
    inits: Vec<Deferred>,
    error: Option<Error>,
    /// What `ncclGroupSimulateEnd` estimates: each queued operation's kind,
    /// bytes of its `count` and whether it is on device buffers.
    sims: Vec<(Arc<Comm>, CollKind, usize, bool)>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

pub(crate) fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

pub(crate) fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

pub(crate) fn enqueue(comm: Arc<Comm>, d: Desc) {
    GROUP.with(|g| g.borrow_mut().ops.push((comm, d)));
}

/// Notes a queued operation for `ncclGroupSimulateEnd`.
pub(crate) fn note(comm: &Arc<Comm>, kind: CollKind, bytes: usize, device: bool) {
    GROUP.with(|g| {
        g.borrow_mut()
            .sims
            .push((comm.clone(), kind, bytes, device))
    });
}

pub(crate) fn enqueue_device(comm: Arc<Comm>, l: oxccl::gpu::raw::DeviceLaunch) {
    GROUP.with(|g| g.borrow_mut().dev_ops.push((comm, l)));
}

pub(crate) fn defer(target: Option<Arc<Comm>>, job: Job) {
    GROUP.with(|g| g.borrow_mut().inits.push(Deferred { target, job }));
}

/// Remembers the first error of a call made inside the group: `ncclGroupEnd`
/// returns it too, and drops the group's queued operations.
pub(crate) fn record_error(e: &Error) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.error.is_none() {
            g.error = Some(e.clone());
        }
    });
}

/// Leaves one group level; at the outermost one, takes what was queued.
fn pop() -> Result<Option<GroupState>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage(
                "called without a matching ncclGroupStart",
            ));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some(std::mem::take(&mut *g)))
    })
}

/// `ncclGroupEnd`.
pub(crate) fn end() -> Result<()> {
    let Some(st) = pop()? else {
        return Ok(());
    };
    let init_result = run_inits(st.inits);
    if let Some(e) = st.error {
        for (c, _) in &st.ops {
            touch(c);
        }
        for (c, _) in &st.dev_ops {
            touch(c);
        }
        return Err(Error::new(
            e.kind(),
            format!(
                "a call inside the group failed ({}); its operations were not run",
                e.message()
            ),
        ));
    }
    init_result?;
    // Device operations were checked when they were called; launching only
    // queues work on the callers' streams, so nothing here waits for a GPU.
    let mut launches = Vec::with_capacity(st.dev_ops.len());
    for (c, l) in st.dev_ops {
        touch(&c);
        launches.push(l);
    }
    oxccl::gpu::raw::launch_all(launches)?;
    if st.ops.is_empty() {
        return Ok(());
    }
    execute(st.ops)
}

/// `ncclGroupSimulateEnd`: leaves the group level without running its
/// operations (creations still run, their handles were handed out) and
/// returns the model's time for them, microseconds: the sum of each
/// operation's (device buffers: [`Communicator::estimate_device_us`]; host
/// buffers: the host tuner's). Only the outermost level simulates.
pub(crate) fn end_simulate() -> Result<f64> {
    let Some(st) = pop()? else {
        return Err(Error::invalid_usage(
            "ncclGroupSimulateEnd closes the outermost group only (this level closed; its operations stay queued for the outer ncclGroupEnd)",
        ));
    };
    run_inits(st.inits)?;
    if let Some(e) = st.error {
        return Err(Error::new(
            e.kind(),
            format!(
                "a call inside the group failed ({}); nothing was simulated",
                e.message()
            ),
        ));
    }
    let mut total = 0.0;
    for (c, kind, count_bytes, device) in st.sims {
        touch(&c);
        let comm = c.wait()?;
        // The size as nccl-tests counts it: `count` is per rank for these.
        let per_rank = matches!(
            kind,
            CollKind::AllGather
                | CollKind::ReduceScatter
                | CollKind::AllToAll
                | CollKind::Gather
                | CollKind::Scatter
        );
        let bytes = count_bytes.saturating_mul(if per_rank { comm.size() } else { 1 });
        total += if device {
            comm.estimate_device_us(kind, bytes)
        } else {
            comm.estimate_us(kind, bytes)?
        };
    }
    Ok(total)
}

/// Runs deferred creations, a thread each. Blocking ones are joined and the
/// first failure returned; if any is non-blocking none is joined and the
/// result is `ncclInProgress` (poll `ncclCommGetAsyncError`).
fn run_inits(inits: Vec<Deferred>) -> Result<()> {
    if inits.is_empty() {
        return Ok(());
    }
    let blocking = inits
        .iter()
        .all(|d| d.target.as_ref().is_none_or(|c| c.blocking));
    let mut threads = Vec::with_capacity(inits.len());
    let mut targets = Vec::with_capacity(inits.len());
    for (i, d) in inits.into_iter().enumerate() {
        let target = d.target.clone();
        targets.push(d.target);
        let job = d.job;
        let t = std::thread::Builder::new()
            .name(format!("oxccl-init-{i}"))
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                    .unwrap_or_else(|_| Err(Error::internal("communicator creation panicked")));
                match target {
                    Some(c) => {
                        let e = r.as_ref().err().cloned();
                        c.finish(r);
                        e
                    }
                    None => r.err(),
                }
            })
            .map_err(|e| Error::system(format!("cannot start an init thread: {e}")))?;
        threads.push(t);
    }
    if !blocking {
        return Err(Error::new(ErrorKind::InProgress, ""));
    }
    let mut first = None;
    for (t, target) in threads.into_iter().zip(targets) {
        let err = t
            .join()
            .unwrap_or_else(|_| Some(Error::internal("init thread panicked")));
        if let (Some(e), None) = (err, &first) {
            if let Some(c) = &target {
                touch(c);
            }
            first = Some(e);
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Runs operations now, all communicators together; waits for communicators
/// still initialising. Operations complete before this returns.
pub(crate) fn execute(ops: Vec<(Arc<Comm>, Desc)>) -> Result<()> {
    let mut owned: Vec<(Communicator, OpDesc)> = Vec::with_capacity(ops.len());
    for (c, d) in &ops {
        touch(c);
        let comm = c.wait()?;
        let op = match d.op {
            OpSpec::Builtin(o) => o,
            OpSpec::DeviceScalar(a, t) => {
                // SAFETY: the caller of ncclRedOpCreatePreMulSum(ncclScalarDevice)
                // keeps the scalar valid while the op is used.
                let scalar = unsafe { oxccl::gpu::raw::read_scalar(a, t) };
                RedOp::PreMulSum(scalar)
            }
        };
        owned.push((
            comm,
            OpDesc {
                kind: d.kind,
                send: d.send,
                recv: d.recv,
                count: d.count,
                dtype: d.dtype,
                op,
                root: d.root,
            },
        ));
    }
    let refs: Vec<(&Communicator, OpDesc)> = owned.iter().map(|(c, o)| (c, *o)).collect();
    // SAFETY: the C caller guarantees the buffers are valid for the operations
    // until they complete, and they complete before this returns.
    unsafe { oxccl::raw::run_group(&refs) }
}
