//! NCCL-API libraries loaded with `dlopen(RTLD_LOCAL | RTLD_NOW)`: the
//! `--compare PATH` library (NVIDIA's libnccl.so.2, or an older oxccl's), run
//! on the same buffers as oxccl, interleaved with it size by size, and, for
//! `--backend cuda`, the measured library itself (oxccl's `libnccl.so`, or
//! `--lib PATH`). Each library loaded this way keeps its own symbols, so two
//! NCCL libraries live side by side in one process, each with its own
//! communicators and unique ids.
//!
//! Only the C API is used: `ncclGetVersion`, `ncclGetUniqueId`,
//! `ncclCommInitRank`, `ncclCommDestroy`, `ncclGetErrorString`,
//! `ncclGroupStart`/`ncclGroupEnd` and the collective's own function(s)
//! (`ncclCommAbort` when present). The CPU backend passes a null stream and
//! host buffers (oxccl's libnccl runs those on its host backend); the CUDA
//! backend passes device buffers and each rank's own stream ([`issue`]).

use super::coll::Coll;
use oxccl::raw::OpDesc;
use oxccl::{CollKind, RedOp};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    pub internal: [u8; 128],
}

type Comm = *mut c_void;
type Stream = *mut c_void;
type Res = c_int;

type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> Res;
type GetUniqueIdFn = unsafe extern "C" fn(*mut NcclUniqueId) -> Res;
type CommInitRankFn = unsafe extern "C" fn(*mut Comm, c_int, NcclUniqueId, c_int) -> Res;
type CommDestroyFn = unsafe extern "C" fn(Comm) -> Res;
type ErrorStringFn = unsafe extern "C" fn(Res) -> *const c_char;
type GroupFn = unsafe extern "C" fn() -> Res;
/// AllReduce, ReduceScatter: (send, recv, count, type, op, comm, stream).
type RedFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res;
/// Reduce: (send, recv, count, type, op, root, comm, stream).
type RootRedFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Comm,
    Stream,
) -> Res;
/// Broadcast, Gather, Scatter: (send, recv, count, type, root, comm, stream).
type RootFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res;
/// AllGather, AlltoAll: (send, recv, count, type, comm, stream).
type PlainFn = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> Res;
/// Send: (send, count, type, peer, comm, stream).
type SendFn = unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> Res;
/// Recv: (recv, count, type, peer, comm, stream).
type RecvFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> Res;

/// The collective's entry point(s).
#[derive(Clone, Copy, Debug)]
enum CollFns {
    AllReduce(RedFn),
    ReduceScatter(RedFn),
    Reduce(RootRedFn),
    Broadcast(RootFn),
    Gather(RootFn),
    Scatter(RootFn),
    AllGather(PlainFn),
    AllToAll(PlainFn),
    SendRecv(SendFn, RecvFn),
}

/// A loaded NCCL-API library (never unloaded: libraries with threads must not be).
#[derive(Clone, Debug)]
pub struct Lib {
    pub path: PathBuf,
    /// `ncclGetVersion`'s code, e.g. 22705.
    pub version: i32,
    get_unique_id: GetUniqueIdFn,
    init_rank: CommInitRankFn,
    destroy: CommDestroyFn,
    error_string: ErrorStringFn,
    group_start: GroupFn,
    group_end: GroupFn,
    /// `ncclCommAbort`, when the library has it.
    abort: Option<CommDestroyFn>,
    coll: CollFns,
}

/// The symbols a collective needs beyond the common ones.
pub fn needed(coll: Coll) -> &'static [&'static str] {
    match coll {
        Coll::AllReduce => &["ncclAllReduce"],
        Coll::ReduceScatter => &["ncclReduceScatter"],
        Coll::Reduce => &["ncclReduce"],
        Coll::Broadcast => &["ncclBroadcast"],
        Coll::Gather => &["ncclGather"],
        Coll::Scatter => &["ncclScatter"],
        Coll::AllGather => &["ncclAllGather"],
        Coll::AllToAll => &["ncclAlltoAll"],
        Coll::SendRecv => &["ncclSend", "ncclRecv"],
    }
}

const COMMON: [&str; 7] = [
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommDestroy",
    "ncclGetErrorString",
    "ncclGroupStart",
    "ncclGroupEnd",
];

/// `NNNNN` (or the old `NNNN`) as 2.27.5.
pub fn version_string(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// A symbol's address as the function pointer type `F`.
///
/// # Safety
/// `F` must be an `extern "C"` function pointer type with the symbol's signature.
unsafe fn fnptr<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked); the caller vouches for the signature.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libc.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

const ACCEPTS: &str = "accepted: the path of an NCCL-API library such as libnccl.so.2";

impl Lib {
    /// Loads `path` and checks it has every function `coll` needs; the error
    /// is one line naming `--compare`.
    pub fn load(path: &Path, coll: Coll) -> Result<Lib, String> {
        Lib::load_as(path, coll, "--compare")
    }

    /// As [`load`](Self::load), with errors naming `flag`.
    pub fn load_as(path: &Path, coll: Coll, flag: &str) -> Result<Lib, String> {
        let shown = path.display();
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("{flag} {shown}: the path contains a NUL byte ({ACCEPTS})"))?;
        // A bare name would make dlopen search the library path: load what was named.
        if !path.exists() {
            return Err(format!("{flag} {shown}: no such file ({ACCEPTS})"));
        }
        // SAFETY: `c` is a NUL-terminated path; loading runs the library's
        // initialisers, which is what loading a library means.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LOCAL | libc::RTLD_NOW) };
        if h.is_null() {
            let e = dlerror().replace('\n', " ");
            return Err(format!("{flag} {shown}: cannot be loaded ({e}; {ACCEPTS})"));
        }
        let sym = |name: &str| -> Option<*mut c_void> {
            let n = CString::new(name).expect("symbol name");
            // SAFETY: `h` is a live handle (never closed), `n` NUL-terminated.
            let p = unsafe { libc::dlsym(h, n.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let missing: Vec<&str> = COMMON
            .iter()
            .chain(needed(coll))
            .copied()
            .filter(|n| sym(n).is_none())
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "{flag} {shown}: not an NCCL library for {}: it lacks {} ({ACCEPTS}, exporting the NCCL C API)",
                coll.name(),
                missing.join(", ")
            ));
        }
        let get = |n: &str| sym(n).expect("checked above");
        // SAFETY: for every `fnptr` below, the symbol exists and, in an
        // NCCL-API library, has the C signature of nccl.h that the type spells.
        unsafe {
            let get_version: GetVersionFn = fnptr(get("ncclGetVersion"));
            let coll_fns = match coll {
                Coll::AllReduce => CollFns::AllReduce(fnptr(get("ncclAllReduce"))),
                Coll::ReduceScatter => CollFns::ReduceScatter(fnptr(get("ncclReduceScatter"))),
                Coll::Reduce => CollFns::Reduce(fnptr(get("ncclReduce"))),
                Coll::Broadcast => CollFns::Broadcast(fnptr(get("ncclBroadcast"))),
                Coll::Gather => CollFns::Gather(fnptr(get("ncclGather"))),
                Coll::Scatter => CollFns::Scatter(fnptr(get("ncclScatter"))),
                Coll::AllGather => CollFns::AllGather(fnptr(get("ncclAllGather"))),
                Coll::AllToAll => CollFns::AllToAll(fnptr(get("ncclAlltoAll"))),
                Coll::SendRecv => CollFns::SendRecv(fnptr(get("ncclSend")), fnptr(get("ncclRecv"))),
            };
            let mut v: c_int = 0;
            let r = get_version(&mut v);
            if r != 0 || v <= 0 {
                return Err(format!(
                    "{flag} {shown}: ncclGetVersion failed (result {r}) ({ACCEPTS})"
                ));
            }
            Ok(Lib {
                path: path.to_path_buf(),
                version: v,
                get_unique_id: fnptr(get("ncclGetUniqueId")),
                init_rank: fnptr(get("ncclCommInitRank")),
                destroy: fnptr(get("ncclCommDestroy")),
                error_string: fnptr(get("ncclGetErrorString")),
                group_start: fnptr(get("ncclGroupStart")),
                group_end: fnptr(get("ncclGroupEnd")),
                abort: sym("ncclCommAbort").map(|p| fnptr::<CommDestroyFn>(p)),
                coll: coll_fns,
            })
        }
    }

    /// The library's name for labels: its file name and NCCL version.
    pub fn label(&self) -> String {
        let file = self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        format!("{file} {}", version_string(self.version))
    }

    fn err(&self, what: &str, r: Res) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string (or null).
        let p = unsafe { (self.error_string)(r) };
        let m = if p.is_null() {
            String::new()
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        format!("{what} returned {r} ({m})")
    }

    /// A fresh `ncclUniqueId` (the library may start its rendezvous root in this process).
    pub fn unique_id(&self) -> Result<[u8; 128], String> {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is a writable ncclUniqueId.
        let r = unsafe { (self.get_unique_id)(&mut id) };
        if r != 0 {
            return Err(self.err("ncclGetUniqueId", r));
        }
        Ok(id.internal)
    }
}

/// One rank's communicator of the compared library.
pub struct CmpComm {
    lib: Lib,
    comm: Comm,
}

impl CmpComm {
    /// `ncclCommInitRank` (blocks until every rank has joined).
    pub fn init(lib: &Lib, nranks: usize, id: &[u8; 128], rank: usize) -> Result<CmpComm, String> {
        let mut comm: Comm = std::ptr::null_mut();
        let id = NcclUniqueId { internal: *id };
        // SAFETY: `comm` is writable; the id is passed by value as nccl.h declares.
        let r = unsafe { (lib.init_rank)(&mut comm, nranks as c_int, id, rank as c_int) };
        if r != 0 || comm.is_null() {
            return Err(lib.err("ncclCommInitRank", r));
        }
        Ok(CmpComm {
            lib: lib.clone(),
            comm,
        })
    }

    /// Communicators for the ranks `ranks` of `nranks`, created by this
    /// thread: `ncclCommInitRank` for each, inside one group when there are
    /// several (nccl-tests' `-g`: one thread, several GPUs). `select(i)` runs
    /// before the i-th creation (it makes that rank's GPU current, as
    /// `cudaSetDevice` does: the library reads the device at the call).
    pub fn init_all(
        lib: &Lib,
        nranks: usize,
        id: &[u8; 128],
        ranks: &[usize],
        mut select: impl FnMut(usize) -> Result<(), String>,
    ) -> Result<Vec<CmpComm>, String> {
        let grouped = ranks.len() > 1;
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); ranks.len()];
        // SAFETY: nccl.h's signatures (checked by name at load); each
        // `ncclComm_t` slot is writable and outlives the group.
        unsafe {
            if grouped {
                let r = (lib.group_start)();
                if r != 0 {
                    return Err(lib.err("ncclGroupStart", r));
                }
            }
            let mut first_err = None;
            for (i, &rank) in ranks.iter().enumerate() {
                if let Err(e) = select(i) {
                    first_err.get_or_insert(e);
                    break;
                }
                let id = NcclUniqueId { internal: *id };
                let r = (lib.init_rank)(&mut comms[i], nranks as c_int, id, rank as c_int);
                if r != 0 {
                    first_err.get_or_insert(lib.err(&format!("ncclCommInitRank (rank {rank})"), r));
                    break;
                }
            }
            if grouped {
                let r = (lib.group_end)();
                if r != 0 && first_err.is_none() {
                    first_err = Some(lib.err("ncclGroupEnd (creating communicators)", r));
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
        }
        if comms.iter().any(|c| c.is_null()) {
            return Err("ncclCommInitRank returned success but no communicator".into());
        }
        Ok(comms
            .into_iter()
            .map(|comm| CmpComm {
                lib: lib.clone(),
                comm,
            })
            .collect())
    }

    /// `ncclCommAbort` where the library has it (else nothing): stops what
    /// the communicator's kernels wait for. The communicator is not
    /// destroyed again on drop.
    pub fn abort(mut self) {
        if let Some(f) = self.lib.abort {
            // SAFETY: a live communicator, aborted once; afterwards it is gone.
            unsafe {
                f(self.comm);
            }
            self.comm = std::ptr::null_mut();
        }
    }

    /// Runs `ops` with a null stream (one call, or a group when there are several).
    ///
    /// # Safety
    /// Every pointer in `ops` must be valid for the counts it is used with,
    /// as for [`oxccl::raw::run`].
    pub unsafe fn run(&self, ops: &[OpDesc]) -> Result<(), String> {
        let items: Vec<(&CmpComm, Stream, &OpDesc)> = ops
            .iter()
            .map(|d| (self, std::ptr::null_mut(), d))
            .collect();
        // SAFETY: the caller vouches for the pointers.
        unsafe { issue(&self.lib, &items) }
    }
}

/// Destroys `comms`, each on its own thread when there are several: a
/// library may make `ncclCommDestroy` wait for the other ranks of the
/// communicator (an implicit `ncclCommFinalize`), and one thread destroying
/// its ranks one after another would then wait for itself.
pub fn destroy_all(comms: Vec<CmpComm>) {
    if comms.len() <= 1 {
        drop(comms);
        return;
    }
    /// A communicator handed to another thread.
    struct Owned(CmpComm);
    // SAFETY: an ncclComm_t is a handle that NCCL's API lets any thread use
    // (one at a time); it moves to exactly one thread, which destroys it.
    unsafe impl Send for Owned {}
    impl Owned {
        fn destroy(self) {
            drop(self.0);
        }
    }
    std::thread::scope(|sc| {
        for c in comms {
            let c = Owned(c);
            sc.spawn(move || c.destroy());
        }
    });
}

/// Issues `items` — (communicator, `cudaStream_t`, operation) — as one call,
/// or as one group when there are several (several ranks of this thread, or
/// `-m` operations).
///
/// # Safety
/// Every pointer in the operations must be valid for the counts it is used
/// with, on the memory the library expects (host memory with a null stream;
/// device memory of the communicator's GPU with that GPU's stream), and each
/// stream must be a live stream (or null).
pub unsafe fn issue(l: &Lib, items: &[(&CmpComm, Stream, &OpDesc)]) -> Result<(), String> {
    // SAFETY: the caller vouches for the pointers and streams (above); the
    // function pointers have nccl.h's signatures (checked by name at load),
    // and each communicator is live until its drop.
    unsafe {
        {
            let grouped = items.len() > 1;
            if grouped {
                let r = (l.group_start)();
                if r != 0 {
                    return Err(l.err("ncclGroupStart", r));
                }
            }
            let mut first_err = None;
            for &(cc, stream, d) in items {
                let comm = cc.comm;
                let (s, rv, n, t) = (
                    d.send as *const c_void,
                    d.recv as *mut c_void,
                    d.count,
                    d.dtype as c_int,
                );
                let op = match d.op {
                    RedOp::Sum => 0,
                    RedOp::Prod => 1,
                    RedOp::Max => 2,
                    RedOp::Min => 3,
                    RedOp::Avg => 4,
                    RedOp::PreMulSum(_) => 0,
                };
                let root = d.root as c_int;
                let (name, r) = match (l.coll, d.kind) {
                    (CollFns::AllReduce(f), _) => {
                        ("ncclAllReduce", f(s, rv, n, t, op, comm, stream))
                    }
                    (CollFns::ReduceScatter(f), _) => {
                        ("ncclReduceScatter", f(s, rv, n, t, op, comm, stream))
                    }
                    (CollFns::Reduce(f), _) => {
                        ("ncclReduce", f(s, rv, n, t, op, root, comm, stream))
                    }
                    (CollFns::Broadcast(f), _) => {
                        ("ncclBroadcast", f(s, rv, n, t, root, comm, stream))
                    }
                    (CollFns::Gather(f), _) => ("ncclGather", f(s, rv, n, t, root, comm, stream)),
                    (CollFns::Scatter(f), _) => ("ncclScatter", f(s, rv, n, t, root, comm, stream)),
                    (CollFns::AllGather(f), _) => ("ncclAllGather", f(s, rv, n, t, comm, stream)),
                    (CollFns::AllToAll(f), _) => ("ncclAlltoAll", f(s, rv, n, t, comm, stream)),
                    (CollFns::SendRecv(f, _), CollKind::Send) => {
                        ("ncclSend", f(s, n, t, root, comm, stream))
                    }
                    (CollFns::SendRecv(_, f), _) => ("ncclRecv", f(rv, n, t, root, comm, stream)),
                };
                if r != 0 && first_err.is_none() {
                    first_err = Some(l.err(name, r));
                }
            }
            if grouped {
                let r = (l.group_end)();
                if r != 0 && first_err.is_none() {
                    first_err = Some(l.err("ncclGroupEnd", r));
                }
            }
            first_err.map_or(Ok(()), Err)
        }
    }
}

impl Drop for CmpComm {
    fn drop(&mut self) {
        if self.comm.is_null() {
            return; // aborted
        }
        // SAFETY: `comm` came from ncclCommInitRank and is destroyed once.
        unsafe {
            (self.lib.destroy)(self.comm);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_like_nccl() {
        assert_eq!(version_string(22705), "2.27.5");
        assert_eq!(version_string(22809), "2.28.9");
        assert_eq!(version_string(2408), "2.4.8");
    }

    #[test]
    fn libraries_without_the_api_are_refused() {
        let e = Lib::load(Path::new("/nonexistent/libnccl.so.2"), Coll::AllReduce).unwrap_err();
        assert!(
            e.starts_with("--compare /nonexistent/libnccl.so.2: no such file"),
            "{e}"
        );
        // libc loads but is no NCCL library.
        let libc = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/libc.so.6",
            "/usr/lib/libc.so.6",
        ]
        .into_iter()
        .find(|p| Path::new(p).exists());
        if let Some(p) = libc {
            let e = Lib::load(Path::new(p), Coll::SendRecv).unwrap_err();
            assert!(e.contains("not an NCCL library"), "{e}");
            assert!(e.contains("ncclSend, ncclRecv"), "{e}");
        }
    }
}
