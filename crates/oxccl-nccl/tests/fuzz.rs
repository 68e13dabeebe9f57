//! Calls the exported functions with random handles, sizes, enum values and
//! NULL pointers: every call must return an error code, and nothing may
//! crash. Random handles never reach memory: the registry rejects them.

use nccl::abi::*;
use nccl::*;
use proptest::prelude::*;
use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

/// A live one-rank communicator (its address is the only handle that is valid).
fn live() -> usize {
    static C: OnceLock<usize> = OnceLock::new();
    *C.get_or_init(|| {
        let mut id = ncclUniqueId::default();
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid output pointers.
        unsafe {
            assert_eq!(ncclGetUniqueId(&mut id), ncclSuccess);
            assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), ncclSuccess);
        }
        comm as usize
    })
}

/// A handle: NULL, garbage (never the live one), or the live communicator.
#[derive(Debug, Clone, Copy)]
enum H {
    Null,
    Garbage(usize),
    Live,
}

impl H {
    fn get(self) -> ncclComm_t {
        match self {
            H::Null => std::ptr::null_mut(),
            H::Garbage(a) if a == live() || a == 0 => 8 as ncclComm_t,
            H::Garbage(a) => a as ncclComm_t,
            H::Live => live() as ncclComm_t,
        }
    }
}

fn handle() -> impl Strategy<Value = H> {
    prop_oneof![
        Just(H::Null),
        any::<usize>().prop_map(H::Garbage),
        (1usize..4096).prop_map(|a| H::Garbage(a * 8)),
        Just(H::Live),
    ]
}

fn bad_dtype() -> impl Strategy<Value = c_int> {
    prop_oneof![Just(-1), 12..c_int::MAX, c_int::MIN..-1]
}

fn bad_op() -> impl Strategy<Value = c_int> {
    prop_oneof![Just(-1), 5..c_int::MAX, c_int::MIN..-1]
}

fn is_error(r: ncclResult_t) -> bool {
    r != ncclSuccess && r != ncclInProgress && (1..ncclNumResults).contains(&r)
}

/// One call that must fail. `wrong` picks which argument is wrong when the
/// handle is the live communicator (buffers are then NULL with count > 0, or
/// a datatype, op or root out of range), so nothing touches memory.
#[derive(Debug, Clone)]
struct Call {
    f: u8,
    h: H,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
    wrong: u8,
    int: c_int,
    addr: usize,
}

fn call() -> impl Strategy<Value = Call> {
    (
        0u8..33,
        handle(),
        1usize..usize::MAX,
        prop_oneof![0..12, bad_dtype()],
        prop_oneof![0..5, bad_op()],
        any::<c_int>(),
        0u8..4,
        any::<c_int>(),
        any::<usize>(),
    )
        .prop_map(|(f, h, count, dtype, op, root, wrong, int, addr)| Call {
            f,
            h,
            count,
            dtype,
            op,
            root,
            wrong,
            int,
            addr,
        })
}

/// Runs `c`; returns its result.
fn exec(c: &Call) -> ncclResult_t {
    let comm = c.h.get();
    let live = matches!(c.h, H::Live);
    // With the live communicator, make exactly the chosen argument wrong.
    let (mut dtype, mut op, mut root) = (c.dtype, c.op, c.root);
    let null: *mut c_void = std::ptr::null_mut();
    if live {
        match c.wrong {
            0 => {} // NULL buffers with count > 0
            1 => {
                dtype = if (0..12).contains(&dtype) {
                    12 + dtype
                } else {
                    dtype
                }
            }
            2 => op = if (0..5).contains(&op) { 99 } else { op },
            _ => root = if root == 0 { 1 } else { root },
        }
    }
    let mut out_int: c_int = 0;
    let mut out_comm: ncclComm_t = std::ptr::null_mut();
    let mut out_ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: every pointer passed is NULL, a valid local, or never
    // dereferenced because another argument is rejected first.
    unsafe {
        match c.f {
            0 => ncclAllReduce(null, null, c.count, dtype, op, comm, null),
            1 => ncclBroadcast(null, null, c.count, dtype, root, comm, null),
            2 => ncclBcast(null, c.count, dtype, root, comm, null),
            3 => ncclReduce(null, null, c.count, dtype, op, root, comm, null),
            4 => ncclAllGather(null, null, c.count, dtype, comm, null),
            5 => ncclReduceScatter(null, null, c.count, dtype, op, comm, null),
            6 => ncclAlltoAll(null, null, c.count, dtype, comm, null),
            7 => ncclGather(null, null, c.count, dtype, root, comm, null),
            8 => ncclScatter(null, null, c.count, dtype, root, comm, null),
            9 => ncclSend(null, c.count, dtype, root, comm, null),
            10 => ncclRecv(null, c.count, dtype, root, comm, null),
            11 if live => ncclCommCount(comm, std::ptr::null_mut()),
            11 => ncclCommCount(comm, &mut out_int),
            12 if live => ncclCommUserRank(comm, std::ptr::null_mut()),
            12 => ncclCommUserRank(comm, &mut out_int),
            13 if live => ncclCommGetAsyncError(comm, std::ptr::null_mut()),
            13 => ncclCommGetAsyncError(comm, &mut out_int),
            14 if live => ncclCommCuDevice(comm, std::ptr::null_mut()),
            14 => ncclCommCuDevice(comm, &mut out_int),
            15 if live => ncclRedOpDestroy(
                if (0..5).contains(&c.op) {
                    c.op
                } else {
                    c.op.max(1000)
                },
                comm,
            ),
            15 => ncclRedOpDestroy(c.op, comm),
            16 if live => ncclCommRegister(comm, null, c.count, &mut out_ptr),
            16 => ncclCommRegister(comm, null, 0, &mut out_ptr),
            17 => ncclCommDeregister(comm, c.addr.max(1) as *mut c_void),
            18 if live => {
                ncclCommSplit(comm, c.int.min(-2), 0, &mut out_comm, std::ptr::null_mut())
            }
            18 => ncclCommSplit(comm, c.int, 0, &mut out_comm, std::ptr::null_mut()),
            19 if live => ncclRedOpCreatePreMulSum(&mut out_int, null, dtype, c.int, comm),
            19 => ncclRedOpCreatePreMulSum(
                &mut out_int,
                &mut out_ptr as *mut _ as *mut c_void,
                0,
                1,
                comm,
            ),
            20 if live => ncclCommFinalize(std::ptr::null_mut()),
            20 => ncclCommFinalize(comm),
            21 if live => ncclCommDestroy(8 as ncclComm_t),
            21 => ncclCommDestroy(comm),
            22 if live => ncclCommAbort(16 as ncclComm_t),
            22 => ncclCommAbort(if comm.is_null() {
                24 as ncclComm_t
            } else {
                comm
            }),
            23 => ncclMemFree((c.addr | 1) as *mut c_void),
            24 => ncclCommShrink(
                comm,
                std::ptr::null_mut(),
                c.int,
                &mut out_comm,
                std::ptr::null_mut(),
                0,
            ),
            // Live: its only rank (own) or one out of range.
            25 => {
                let mut list = [c.int];
                ncclCommShrink(
                    comm,
                    list.as_mut_ptr(),
                    1,
                    &mut out_comm,
                    std::ptr::null_mut(),
                    0,
                )
            }
            // Live: no id anywhere, a rank other than -1 or too few ranks.
            26 => ncclCommGrow(
                comm,
                c.int,
                std::ptr::null(),
                c.root,
                &mut out_comm,
                std::ptr::null_mut(),
            ),
            // Live: a flag other than 0 (revoking it would end the fuzzing);
            // NULL is NCCL's no-op, so a garbage handle instead.
            27 if live => ncclCommRevoke(comm, c.int | 1),
            27 => ncclCommRevoke(
                if comm.is_null() {
                    40 as ncclComm_t
                } else {
                    comm
                },
                0,
            ),
            28 => ncclCommGetUniqueId(comm, std::ptr::null_mut()),
            29 => ncclWinGetUserPtr(comm, c.addr as ncclWindow_t, &mut out_ptr),
            30 => ncclGetPeerDevicePointer(c.addr as ncclWindow_t, c.count, c.root, &mut out_ptr),
            31 => ncclCommWindowDeregister(comm, c.addr as ncclWindow_t),
            _ => {
                let e = ncclGetLastError(comm);
                assert!(!e.is_null());
                let _ = CStr::from_ptr(e).to_bytes().len();
                ncclCommWindowRegister(comm, null, c.count, std::ptr::null_mut(), c.int)
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_bad_call_returns_an_error(c in call()) {
        let r = exec(&c);
        prop_assert!(is_error(r), "{c:?} returned {r}");
        // The live communicator survives every bad call.
        let mut n: c_int = 0;
        // SAFETY: a valid output pointer.
        prop_assert_eq!(unsafe { ncclCommCount(live() as ncclComm_t, &mut n) }, ncclSuccess);
        prop_assert_eq!(n, 1);
    }

    #[test]
    fn error_strings_are_total(code in any::<c_int>()) {
        let s = ncclGetErrorString(code);
        prop_assert!(!s.is_null());
        // SAFETY: the library returns static NUL-terminated strings.
        let t = unsafe { CStr::from_ptr(s) }.to_str().unwrap();
        if (0..ncclNumResults).contains(&code) {
            prop_assert_ne!(t, "unknown result code");
        } else {
            prop_assert_eq!(t, "unknown result code");
        }
    }

    #[test]
    fn teams_are_zeroed(a in any::<usize>()) {
        let t = ncclTeamWorld(a as ncclComm_t);
        prop_assert_eq!(t, ncclTeam_t::default());
        prop_assert_eq!(ncclTeamRankToWorld(a as ncclComm_t, t, 0), -1);
    }
}

#[test]
fn a_live_communicator_works_after_the_fuzzing() {
    let comm = live() as ncclComm_t;
    let mut x = [1.5f32; 16];
    let p = x.as_mut_ptr() as *mut c_void;
    // SAFETY: x is valid for 16 floats for the call.
    let r = unsafe { ncclAllReduce(p, p, 16, 7, 0, comm, std::ptr::null_mut()) };
    assert_eq!(r, ncclSuccess);
    assert_eq!(x, [1.5f32; 16]);
    let mut v = 0;
    // SAFETY: valid output pointer.
    assert_eq!(unsafe { ncclGetVersion(&mut v) }, ncclSuccess);
    assert_eq!(v, NCCL_VERSION_CODE);
}
