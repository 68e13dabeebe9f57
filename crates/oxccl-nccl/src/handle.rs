//! Communicator handles: what an `ncclComm_t` points at, and the registry
//! that decides whether a pointer is one.
//!
//! A handle is a number from [`next_handle`], never an address and never
//! reused, so a destroyed communicator's handle stays refused even after
//! another communicator takes its memory. Every call looks the handle up in
//! a process-wide map of live communicators and works on the `Arc` it finds
//! there. A garbage or foreign pointer is not in the map and gets
//! `ncclInvalidArgument`; the handle of a communicator this process
//! destroyed gets `ncclInvalidUsage`, never a wild read.

use crate::abi::ncclComm_t;
use oxccl::{Communicator, Config, DataType, Error, ErrorKind, Result, Scalar};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};

/// Stamped into every communicator; checked after each lookup.
pub(crate) const COMM_MAGIC: u64 = 0x6f78_6363_6c5f_636d; // "oxccl_cm"

/// A reduction op made by `ncclRedOpCreatePreMulSum`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PreMul {
    /// `ncclScalarHostImmediate`: the scalar read at creation.
    Immediate(Scalar, DataType),
    /// `ncclScalarDevice`: the scalar's address, read at every operation.
    Device(usize, DataType),
}

pub(crate) enum State {
    /// Initialisation still running (non-blocking init, or deferred in a group).
    Pending,
    Ready(Communicator),
    Failed(Error),
    /// Destroyed or aborted.
    Closed,
}

/// One rank of a communicator, as the C API sees it.
pub(crate) struct Comm {
    magic: u64,
    /// (rank, nranks): known at the call for init, after the split for a split.
    dims: OnceLock<(usize, usize)>,
    /// What `ncclCommCuDevice` reports: the current CUDA device when the
    /// communicator was created, else the rank's index among this process's ranks.
    pub device: i32,
    /// Blocking (default) or not (`config.blocking = 0`, or `NCCL_COMM_BLOCKING=0`).
    pub blocking: bool,
    pub config: Config,
    state: Mutex<State>,
    cv: Condvar,
    aborted: AtomicBool,
    /// `ncclCommRevoke` was called: a second revoke and `ncclCommFinalize`
    /// are refused.
    revoked: AtomicBool,
    /// Revoked, or the parent of a shrink with `NCCL_SHRINK_ABORT`:
    /// operations are refused; split, shrink, destroy and abort work.
    stopped: AtomicBool,
    /// The GPU async error was logged (once).
    gpu_error_logged: AtomicBool,
    /// Ops made by `ncclRedOpCreatePreMulSum`: slot i is op `ncclNumOps + i`.
    pub ops: Mutex<Vec<Option<PreMul>>>,
    /// The id `ncclCommGetUniqueId` made, until `ncclCommGrow` uses it.
    pub grow_id: Mutex<Option<[u8; 128]>>,
    /// Dummy registration handles of `ncclCommRegister` (address -> (buff, size)).
    pub regs: Mutex<HashMap<usize, Box<(usize, usize)>>>,
    /// The last error reported on this communicator, for `ncclGetLastError(comm)`.
    pub last_error: Mutex<Option<String>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Comm {
    pub fn new(
        dims: Option<(usize, usize)>,
        device: i32,
        blocking: bool,
        config: Config,
        state: State,
    ) -> Arc<Comm> {
        let d = OnceLock::new();
        if let Some(x) = dims {
            let _ = d.set(x);
        }
        Arc::new(Comm {
            magic: COMM_MAGIC,
            dims: d,
            device,
            blocking,
            config,
            state: Mutex::new(state),
            cv: Condvar::new(),
            aborted: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            gpu_error_logged: AtomicBool::new(false),
            ops: Mutex::new(Vec::new()),
            grow_id: Mutex::new(None),
            regs: Mutex::new(HashMap::new()),
            last_error: Mutex::new(None),
        })
    }

    /// A communicator whose initialisation has finished.
    pub fn ready(c: Communicator, device: i32, blocking: bool, config: Config) -> Arc<Comm> {
        let dims = (c.rank(), c.size());
        Comm::new(Some(dims), device, blocking, config, State::Ready(c))
    }

    /// Records the outcome of a pending initialisation and wakes the waiters.
    /// A communicator aborted meanwhile is aborted as soon as it exists.
    pub fn finish(&self, r: Result<Option<Communicator>>) {
        let mut st = lock(&self.state);
        let new = match r {
            Ok(Some(c)) => {
                let _ = self.dims.set((c.rank(), c.size()));
                if self.aborted.load(Ordering::Acquire) {
                    c.abort();
                    State::Closed
                } else {
                    State::Ready(c)
                }
            }
            Ok(None) => State::Failed(Error::internal(
                "initialisation ended without a communicator",
            )),
            Err(e) => {
                if self.aborted.load(Ordering::Acquire) {
                    State::Closed
                } else {
                    State::Failed(e)
                }
            }
        };
        *st = new;
        drop(st);
        self.cv.notify_all();
    }

    /// (rank, nranks) without waiting: `ncclInProgress` while a split is still running.
    pub fn dims(&self) -> Result<(usize, usize)> {
        if let Some(d) = self.dims.get() {
            return Ok(*d);
        }
        match &*lock(&self.state) {
            State::Failed(e) => Err(init_failed(e)),
            State::Closed => Err(Error::invalid_usage("the communicator was aborted")),
            _ => Err(Error::new(ErrorKind::InProgress, "")),
        }
    }

    /// Waits for initialisation to end; the communicator, or why there is none.
    pub fn wait(&self) -> Result<Communicator> {
        let mut st = lock(&self.state);
        loop {
            match &*st {
                State::Pending => {
                    st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                State::Ready(c) => return Ok(c.clone()),
                State::Failed(e) => return Err(init_failed(e)),
                State::Closed => {
                    return Err(Error::invalid_usage(
                        "the communicator was destroyed or aborted",
                    ))
                }
            }
        }
    }

    /// `ncclCommGetAsyncError`'s answer, as an `ncclResult_t`.
    pub fn async_code(&self) -> i32 {
        match &*lock(&self.state) {
            State::Pending => ErrorKind::InProgress.code(),
            State::Failed(e) => e.kind().code(),
            // Revoked and quiescent (what NCCL reports once its revoke has
            // ended): the failed operations' errors were its purpose.
            State::Ready(_) if self.revoked.load(Ordering::Acquire) => 0,
            State::Ready(c) => c
                .async_error()
                .or_else(|| self.gpu_async_error(c))
                .map(|e| e.kind().code())
                .unwrap_or(0),
            State::Closed => ErrorKind::InvalidUsage.code(),
        }
    }

    /// An error a GPU operation ended with (a peer that never came, a
    /// timeout), logged once as a WARN naming it.
    fn gpu_async_error(&self, c: &Communicator) -> Option<Error> {
        let e = c.gpu_error()?;
        if !self.gpu_error_logged.swap(true, Ordering::AcqRel) {
            oxccl_env::warn!("{}", e.message());
            self.set_last_error(e.message());
        }
        Some(e)
    }

    /// `ncclCommDestroy`: waits for a pending initialisation, then frees the rank.
    pub fn destroy(&self) -> Result<()> {
        let _ = self.wait();
        let old = std::mem::replace(&mut *lock(&self.state), State::Closed);
        self.cv.notify_all();
        match old {
            State::Ready(c) => c.destroy(),
            _ => Ok(()),
        }
    }

    /// `ncclCommAbort`: returns at once; a pending initialisation is aborted
    /// when it completes.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        let mut st = lock(&self.state);
        if let State::Ready(c) = &*st {
            c.abort();
            *st = State::Closed;
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Ends this rank's operations in flight, host ones (their waits
    /// return) and GPU ones (the kernels leave their waits on the abort word
    /// within about a millisecond), keeping the bootstrap for a split or a
    /// shrink; later operations are refused. `ncclCommRevoke`, and the first
    /// half of `ncclCommShrink(NCCL_SHRINK_ABORT)`.
    pub fn stop_operations(&self) {
        self.stopped.store(true, Ordering::Release);
        let c = match &*lock(&self.state) {
            State::Ready(c) => Some(c.clone()),
            _ => None,
        };
        // Outside the state lock: revoke waits for an operation in flight.
        if let Some(c) = c {
            c.revoke();
        }
    }

    /// `ncclCommRevoke`: [`Comm::stop_operations`], once.
    pub fn revoke(&self) -> Result<()> {
        if self.revoked.swap(true, Ordering::AcqRel) {
            return Err(Error::invalid_argument(
                "comm was already revoked (ncclCommRevoke may be called once)",
            ));
        }
        self.stop_operations();
        Ok(())
    }

    /// Whether `ncclCommRevoke` was called.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// Refuses an operation on a rank whose operations were stopped.
    pub fn check_not_stopped(&self) -> Result<()> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(
                "comm was revoked (ncclCommRevoke, or ncclCommShrink with NCCL_SHRINK_ABORT): only split, shrink, destroy or abort it",
            ));
        }
        Ok(())
    }

    /// The communicator if its initialisation has finished, without waiting.
    pub fn ready_now(&self) -> Option<Communicator> {
        match &*lock(&self.state) {
            State::Ready(c) => Some(c.clone()),
            _ => None,
        }
    }

    pub fn set_last_error(&self, text: &str) {
        *lock(&self.last_error) = Some(text.to_string());
    }
}

fn init_failed(e: &Error) -> Error {
    Error::new(
        e.kind(),
        format!("the communicator's initialisation failed: {}", e.message()),
    )
}

/// The first handle value. Bits 48-63 set make it a non-canonical x86-64
/// (and AArch64) address: a caller that dereferences a handle faults at
/// once instead of reading someone's memory.
const HANDLE_BASE: usize = 0x0cc1_0000_0000_0000;
/// Handles step by 16, so they look like aligned pointers to code that checks.
const HANDLE_STEP: usize = 16;
/// Handles made so far, communicators and windows alike (one sequence, so a
/// window's handle passed as a communicator is "not a live communicator").
static HANDLES_MADE: AtomicUsize = AtomicUsize::new(0);

/// A fresh opaque handle value: `HANDLE_BASE + 16 n` for the n-th handle of
/// this process; 2^44 handles before the sequence could wrap.
pub(crate) fn next_handle() -> usize {
    HANDLE_BASE + HANDLE_STEP * HANDLES_MADE.fetch_add(1, Ordering::Relaxed)
}

/// Whether `h` is a handle this process made (live or not).
pub(crate) fn was_made_here(h: usize) -> bool {
    let made = HANDLES_MADE.load(Ordering::Relaxed);
    let off = h.wrapping_sub(HANDLE_BASE);
    h >= HANDLE_BASE && off & (HANDLE_STEP - 1) == 0 && off / HANDLE_STEP < made
}

struct Registry {
    live: HashMap<usize, Arc<Comm>>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    lock(R.get_or_init(|| {
        Mutex::new(Registry {
            live: HashMap::new(),
        })
    }))
}

/// Makes a handle for `c`.
pub(crate) fn register(c: Arc<Comm>) -> ncclComm_t {
    let h = next_handle();
    registry().live.insert(h, c);
    h as ncclComm_t
}

thread_local! {
    /// Communicators the current API call touched: its error text goes to each.
    static TOUCHED: RefCell<Vec<Weak<Comm>>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn touch(c: &Arc<Comm>) {
    TOUCHED.with(|t| t.borrow_mut().push(Arc::downgrade(c)));
}

/// Forgets the communicators touched so far, keeping the list's room (a
/// call that succeeds never needs them; taking the list instead made every
/// call's first touch allocate it again).
pub(crate) fn clear_touched() {
    TOUCHED.with(|t| t.borrow_mut().clear());
}

pub(crate) fn take_touched() -> Vec<Arc<Comm>> {
    TOUCHED.with(|t| {
        std::mem::take(&mut *t.borrow_mut())
            .into_iter()
            .filter_map(|w| w.upgrade())
            .collect()
    })
}

fn check(h: ncclComm_t, what: &str, r: &Registry) -> Result<Arc<Comm>> {
    if h.is_null() {
        return Err(Error::invalid_argument(format!("{what} is NULL")));
    }
    let addr = h as usize;
    match r.live.get(&addr) {
        Some(c) if c.magic == COMM_MAGIC => Ok(c.clone()),
        Some(_) => Err(Error::internal(format!(
            "{what} {h:p}: registry entry without the communicator magic"
        ))),
        None if was_made_here(addr) => Err(Error::invalid_usage(format!(
            "{what} {h:p} was already destroyed or aborted"
        ))),
        None => Err(Error::invalid_argument(format!(
            "{what} {h:p} is not a live communicator of this library"
        ))),
    }
}

/// The communicator behind a handle; `what` names the parameter in errors.
pub(crate) fn lookup(h: ncclComm_t, what: &str) -> Result<Arc<Comm>> {
    let c = check(h, what, &registry())?;
    touch(&c);
    Ok(c)
}

/// The communicator behind a handle, without recording it for error text.
pub(crate) fn peek(h: ncclComm_t) -> Option<Arc<Comm>> {
    check(h, "comm", &registry()).ok()
}

/// Removes a handle (destroy/abort): later uses of it are rejected.
pub(crate) fn unregister(h: ncclComm_t, what: &str) -> Result<Arc<Comm>> {
    let mut r = registry();
    let c = check(h, what, &r)?;
    r.live.remove(&(h as usize));
    drop(r);
    touch(&c);
    Ok(c)
}

/// The error for a NULL pointer argument `what`.
pub(crate) fn null_arg(what: &str) -> Error {
    Error::invalid_argument(format!("{what} is NULL"))
}
