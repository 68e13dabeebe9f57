//! The C API's routing between the host backend and the GPU path.
//!
//! Without a GPU (CI): host pointers go to the host backend, `ncclMemAlloc`
//! returns host memory when no CUDA context is current, `ncclCommCuDevice`
//! reports the rank's index. With two GPUs (tests `#[ignore = "needs 2
//! GPUs: ..."]`, run by `scripts/gpu-test.sh` on the GPU machine; they fail
//! without them): nccl-tests' `-g 2` sequence (one thread, group
//! init with `cudaSetDevice`-style current contexts, `ncclMemAlloc`, grouped
//! all-reduces), in place and out of place, count 0, 30 calls back to back,
//! ungrouped calls, the refusal of mixed host/device buffers; every other
//! collective and send/receive on device buffers, PreMulSum (immediate and
//! device scalars); all-reduces and reduce-scatters of several types and ops
//! that take the copy engines when OXCCL_CUDA_CE_AR_MIN=1.

#![allow(clippy::needless_range_loop)] // ranks index several parallel arrays

use nccl::abi::*;
use nccl::*;
use oxccl_cuda::exec;
use std::ffi::c_void;
use std::ptr::null_mut;

const INT32: i32 = 2;
const INT64: i32 = 4;
const FLOAT32: i32 = 7;
const UINT8: i32 = 1;
const FLOAT64: i32 = 8;
const SUM: i32 = 0;
const PROD: i32 = 1;
const MAX: i32 = 2;
const MIN: i32 = 3;
const AVG: i32 = 4;

fn ok(r: ncclResult_t, what: &str) {
    // SAFETY: ncclGetLastError(NULL) returns a NUL-terminated string that stays valid until this
    // thread calls it again; it is copied at once.
    assert_eq!(r, ncclSuccess, "{what}: {:?}", unsafe {
        std::ffi::CStr::from_ptr(ncclGetLastError(null_mut()))
    });
}

fn init_all(n: i32) -> Vec<ncclComm_t> {
    let mut comms = vec![null_mut(); n as usize];
    ok(
        // SAFETY: `comms` has room for `n` handles; a NULL device list means devices 0..n.
        unsafe { ncclCommInitAll(comms.as_mut_ptr(), n, std::ptr::null()) },
        "ncclCommInitAll",
    );
    comms
}

#[test]
fn host_memory_without_a_cuda_context_runs_on_the_host_backend() {
    // A fresh thread has no current CUDA context, GPU machine or not.
    std::thread::spawn(|| {
        assert_eq!(exec::current_device(), None);
        let comms = init_all(2);
        let n = 1000usize;
        let mut bufs = Vec::new();
        for r in 0..2 {
            let mut p: *mut c_void = null_mut();
            // SAFETY: `p` is a writable pointer slot.
            ok(unsafe { ncclMemAlloc(&mut p, n * 4) }, "ncclMemAlloc");
            assert_eq!(exec::memory_of(p).unwrap(), exec::Memory::Host);
            // Host memory: writable from here.
            // SAFETY: without a current CUDA context ncclMemAlloc returned zeroed host memory of
            // n * 4 bytes (asserted just above), aligned for f32 and used by nothing else.
            let s = unsafe { std::slice::from_raw_parts_mut(p as *mut f32, n) };
            for (i, v) in s.iter_mut().enumerate() {
                *v = (i + r) as f32;
            }
            bufs.push(p);
        }
        // SAFETY: ncclGroupStart takes no arguments; it opens a group level on this thread.
        ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
        for r in 0..2 {
            ok(
                // SAFETY: `bufs[r]` is host memory of n floats; the all-reduce is in place;
                // `comms[r]` is live.
                unsafe { ncclAllReduce(bufs[r], bufs[r], n, FLOAT32, SUM, comms[r], null_mut()) },
                "ncclAllReduce",
            );
        }
        // SAFETY: the two queued all-reduces use `bufs` and `comms`, which outlive this call
        // (host memory: done when it returns).
        ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd");
        for p in &bufs {
            // SAFETY: `p` is host memory of n floats that no call uses any more (the group has
            // ended).
            let s = unsafe { std::slice::from_raw_parts(*p as *const f32, n) };
            for (i, v) in s.iter().enumerate() {
                assert_eq!(*v, (2 * i + 1) as f32);
            }
        }
        for (r, c) in comms.iter().enumerate() {
            let mut d = -1;
            // SAFETY: `c` is a live communicator; `d` is a writable int.
            ok(unsafe { ncclCommCuDevice(*c, &mut d) }, "ncclCommCuDevice");
            assert_eq!(d, r as i32);
        }
        for p in bufs {
            // SAFETY: `p` came from ncclMemAlloc, is freed once and not used afterwards.
            ok(unsafe { ncclMemFree(p) }, "ncclMemFree");
        }
        for c in comms {
            // SAFETY: `c` is a live communicator, destroyed once and not used afterwards.
            ok(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy");
        }
    })
    .join()
    .unwrap();
}

#[test]
fn stack_and_heap_pointers_are_host_memory() {
    let x = [0u8; 16];
    let v = vec![0u8; 1 << 20];
    assert_eq!(
        exec::memory_of(x.as_ptr() as *const c_void).unwrap(),
        exec::Memory::Host
    );
    assert_eq!(
        exec::memory_of(v.as_ptr() as *const c_void).unwrap(),
        exec::Memory::Host
    );
    assert_eq!(
        exec::memory_of(std::ptr::null()).unwrap(),
        exec::Memory::Host
    );
}

/// Panics unless the driver sees at least `need` GPUs: the GPU tests are
/// `#[ignore]`d and run where GPUs are (scripts/gpu-test.sh).
fn require_gpus(need: usize) {
    match oxccl_cuda::Gpu::count() {
        Ok(n) if n >= need => {}
        Ok(n) => panic!("needs {need} GPU(s), {n} visible"),
        Err(e) => panic!("needs {need} GPU(s): {}", e.message()),
    }
}

fn dev_alloc(ordinal: i32, bytes: usize) -> *mut c_void {
    exec::use_device(ordinal).unwrap();
    let mut p: *mut c_void = null_mut();
    // SAFETY: `p` is a writable pointer slot.
    ok(unsafe { ncclMemAlloc(&mut p, bytes) }, "ncclMemAlloc");
    assert_eq!(exec::memory_of(p).unwrap(), exec::Memory::Device(ordinal));
    p
}

fn put<T: Copy>(p: *mut c_void, v: &[T]) {
    let b =
        // SAFETY: `v` is a slice of plain `Copy` values: its bytes are initialised and
        // `size_of_val(v)` long.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) };
    exec::copy_to_device(p as u64, b).unwrap();
}

fn get<T: Copy + Default>(p: *mut c_void, n: usize) -> Vec<T> {
    let mut v = vec![T::default(); n];
    // SAFETY: `v` holds n initialised values of a plain `Copy` type, so its n * size_of::<T>()
    // bytes may be written with any bytes the device holds (the callers' types are integers and
    // floats).
    let b = unsafe {
        std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, n * std::mem::size_of::<T>())
    };
    exec::copy_from_device(b, p as u64).unwrap();
    v
}

fn sync_both() {
    sync_on(&[0, 1]);
}

/// Waits for all work on each of these GPUs.
fn sync_on(ords: &[i32]) {
    for &d in ords {
        exec::use_device(d).unwrap();
        exec::synchronize_current().unwrap();
    }
}

/// A communicator of `ords.len()` ranks, rank r on GPU `ords[r]`, created
/// as nccl-tests -g N does: grouped ncclCommInitRankConfig calls from one
/// thread, each rank's GPU current (ncclCommInitAll refuses a GPU twice).
fn init_grouped(ords: &[i32]) -> Vec<ncclComm_t> {
    let n = ords.len() as i32;
    let mut id = ncclUniqueId::default();
    // SAFETY: `id` is a writable ncclUniqueId.
    ok(unsafe { ncclGetUniqueId(&mut id) }, "ncclGetUniqueId");
    let mut comms = vec![null_mut(); ords.len()];
    // SAFETY: ncclGroupStart takes no arguments; it opens a group level on this thread.
    ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
    for (r, &o) in ords.iter().enumerate() {
        exec::use_device(o).unwrap();
        let mut cfg = ncclConfig_t::default();
        ok(
            // SAFETY: `comms[r]` and `cfg` are writable locals that outlive the group (creation
            // completes at ncclGroupEnd below).
            unsafe { ncclCommInitRankConfig(&mut comms[r], n, id, r as i32, &mut cfg) },
            "ncclCommInitRankConfig",
        );
    }
    // SAFETY: the group holds only communicator creations, whose handle slots (`comms`) outlive
    // this call.
    ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd (init)");
    comms
}

/// nccl-tests' `-g 2` sequence through the C API, on two GPUs.
#[test]
#[ignore = "needs 2 GPUs: two GPUs one thread like NCCL tests"]
fn two_gpus_one_thread_like_nccl_tests() {
    require_gpus(2);
    std::thread::spawn(|| {
        let comms = init_grouped(&[0, 1]);
        for (r, c) in comms.iter().enumerate() {
            let mut d = -1;
            // SAFETY: `c` is a live communicator; `d` is a writable int.
            ok(unsafe { ncclCommCuDevice(*c, &mut d) }, "ncclCommCuDevice");
            assert_eq!(d, r as i32);
        }

        // Out of place and in place, float sum and int32 max, odd counts.
        for &n in &[1usize, 3, 17, 1000, 4099, 1 << 20, (1 << 20) + 5] {
            let send: Vec<_> = (0..2).map(|r| dev_alloc(r, n * 4)).collect();
            let recv: Vec<_> = (0..2).map(|r| dev_alloc(r, n * 4)).collect();
            for r in 0..2 {
                let v: Vec<f32> = (0..n)
                    .map(|i| ((i % 1000) as f32) * (r as f32 + 1.0))
                    .collect();
                put(send[r], &v);
            }
            // SAFETY: ncclGroupStart takes no arguments; it opens a group level on this thread.
            ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
            for r in 0..2 {
                ok(
                    // SAFETY: `send[r]` and `recv[r]` are device allocations of n * 4 bytes on
                    // rank r's GPU, freed only after the GPUs are synchronised.
                    unsafe {
                        ncclAllReduce(send[r], recv[r], n, FLOAT32, SUM, comms[r], null_mut())
                    },
                    "ncclAllReduce float sum",
                );
            }
            // SAFETY: the calls queued since ncclGroupStart name live communicators and device
            // buffers that are freed only after the GPUs are synchronised.
            ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd");
            sync_both();
            for r in 0..2 {
                let got: Vec<f32> = get(recv[r], n);
                for (i, g) in got.iter().enumerate() {
                    assert_eq!(*g, ((i % 1000) as f32) * 3.0, "n={n} rank {r} [{i}]");
                }
            }
            // In place, int32 max, ungrouped (each call launches at once).
            for r in 0..2 {
                let v: Vec<i32> = (0..n)
                    .map(|i| {
                        if (i + r) % 2 == 0 {
                            i as i32
                        } else {
                            -(i as i32)
                        }
                    })
                    .collect();
                put(send[r], &v);
            }
            for r in 0..2 {
                ok(
                    // SAFETY: `send[r]` is a device allocation of n * 4 bytes (n int32, in
                    // place), freed only after the GPUs are synchronised.
                    unsafe { ncclAllReduce(send[r], send[r], n, INT32, MAX, comms[r], null_mut()) },
                    "ncclAllReduce int32 max in place",
                );
            }
            sync_both();
            for r in 0..2 {
                let got: Vec<i32> = get(send[r], n);
                for (i, g) in got.iter().enumerate() {
                    assert_eq!(*g, i as i32, "n={n} rank {r} [{i}]");
                }
            }
            for p in send.into_iter().chain(recv) {
                // SAFETY: `p` came from ncclMemAlloc and is freed once; the GPUs were synchronised,
                // so no work uses it any more.
                ok(unsafe { ncclMemFree(p) }, "ncclMemFree");
            }
        }

        // 30 in-place sums back to back: each doubles the value; a flag of an
        // earlier call must never satisfy a later one.
        let n = 4096 + 3;
        let bufs: Vec<_> = (0..2).map(|r| dev_alloc(r, n * 8)).collect();
        for b in &bufs {
            put(*b, &vec![1i64; n]);
        }
        for _ in 0..30 {
            // SAFETY: ncclGroupStart takes no arguments; it opens a group level on this thread.
            ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
            for r in 0..2 {
                ok(
                    // SAFETY: `bufs[r]` is a device allocation of n * 8 bytes (n int64, in
                    // place), freed only after the GPUs are synchronised.
                    unsafe { ncclAllReduce(bufs[r], bufs[r], n, INT64, SUM, comms[r], null_mut()) },
                    "ncclAllReduce i64 sum",
                );
            }
            // SAFETY: the calls queued since ncclGroupStart name live communicators and device
            // buffers that are freed only after the GPUs are synchronised.
            ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd");
        }
        sync_both();
        for b in &bufs {
            assert!(get::<i64>(*b, n).iter().all(|v| *v == 1 << 30));
        }

        // Count 0: nothing runs, success.
        // SAFETY: ncclGroupStart takes no arguments; it opens a group level on this thread.
        ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
        for r in 0..2 {
            ok(
                // SAFETY: count 0 reads and writes nothing; `bufs[r]` is a live device allocation
                // anyway.
                unsafe { ncclAllReduce(bufs[r], bufs[r], 0, FLOAT32, SUM, comms[r], null_mut()) },
                "ncclAllReduce count 0",
            );
        }
        // SAFETY: the calls queued since ncclGroupStart name live communicators and device buffers
        // that are freed only after the GPUs are synchronised.
        ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd");

        // Refusals: mixed host/device buffers.
        exec::use_device(0).unwrap();
        let mut host = vec![0f32; 16];
        // SAFETY: `bufs[0]` is a device allocation of n * 8 bytes and `host` 16 floats: both
        // valid for 16 floats; the call is refused before any access.
        let r = unsafe {
            ncclAllReduce(
                bufs[0],
                host.as_mut_ptr() as *mut c_void,
                16,
                FLOAT32,
                SUM,
                comms[0],
                null_mut(),
            )
        };
        assert_eq!(r, ncclInvalidArgument);
        // The caller's current device is left as it was.
        exec::use_device(1).unwrap();
        // SAFETY: ncclGroupStart takes no arguments; it opens a group level on this thread.
        ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
        for r in 0..2 {
            ok(
                // SAFETY: `bufs[r]` is a device allocation of n * 8 bytes (n int64, in place),
                // freed only after the GPUs are synchronised.
                unsafe { ncclAllReduce(bufs[r], bufs[r], n, INT64, SUM, comms[r], null_mut()) },
                "ncclAllReduce",
            );
        }
        // SAFETY: the calls queued since ncclGroupStart name live communicators and device buffers
        // that are freed only after the GPUs are synchronised.
        ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd");
        assert_eq!(exec::current_device(), Some(1));
        sync_both();

        for p in bufs {
            // SAFETY: `p` came from ncclMemAlloc and is freed once; the GPUs were synchronised, so
            // no work uses it any more.
            ok(unsafe { ncclMemFree(p) }, "ncclMemFree");
        }
        for c in comms {
            // SAFETY: `c` is a live communicator of this test, destroyed once and not used
            // afterwards.
            ok(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy");
        }
    })
    .join()
    .unwrap();
}

/// `ncclCommInitAll` on two GPUs: float sum in one group.
#[test]
#[ignore = "needs 2 GPUs: two GPUs init all"]
fn two_gpus_init_all() {
    require_gpus(2);
    std::thread::spawn(|| {
        let comms = init_all(2);
        let n = 12345;
        let bufs: Vec<_> = (0..2).map(|r| dev_alloc(r, n * 4)).collect();
        for (r, b) in bufs.iter().enumerate() {
            put(*b, &vec![r as f32 + 1.0; n]);
        }
        // SAFETY: ncclGroupStart takes no arguments; it opens a group level on this thread.
        ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
        for r in 0..2 {
            ok(
                // SAFETY: `bufs[r]` is a device allocation of n * 4 bytes (n floats, in place),
                // freed only after the GPUs are synchronised.
                unsafe { ncclAllReduce(bufs[r], bufs[r], n, FLOAT32, SUM, comms[r], null_mut()) },
                "ncclAllReduce",
            );
        }
        // SAFETY: the calls queued since ncclGroupStart name live communicators and device buffers
        // that are freed only after the GPUs are synchronised.
        ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd");
        sync_both();
        for b in &bufs {
            assert!(get::<f32>(*b, n).iter().all(|v| *v == 3.0));
        }
        for p in bufs {
            // SAFETY: `p` came from ncclMemAlloc and is freed once; the GPUs were synchronised, so
            // no work uses it any more.
            ok(unsafe { ncclMemFree(p) }, "ncclMemFree");
        }
        for c in comms {
            // SAFETY: `c` is a live communicator of this test, destroyed once and not used
            // afterwards.
            ok(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy");
        }
    })
    .join()
    .unwrap();
}

/// A device buffer of `n` i32 with `off` bytes of slack in front (`off` = 4
/// makes every pointer misaligned for 16-byte packs).
fn dev_i32(ordinal: i32, n: usize, off: usize) -> (*mut c_void, *mut c_void) {
    let base = dev_alloc(ordinal, n * 4 + 16);
    // SAFETY: `off` is at most 16, and the allocation has 16 bytes of slack in front, so `base +
    // off` stays inside it.
    (base, unsafe { (base as *mut u8).add(off) } as *mut c_void)
}

fn val(r: usize, i: usize) -> i32 {
    (i as i32 % 9973) * 10 + r as i32 + 1
}

/// Every collective and send/receive on device buffers of two GPUs, int32,
/// odd counts, aligned and misaligned pointers, in place and out of place;
/// PreMulSum with an immediate and a device scalar (float).
#[test]
#[ignore = "needs 2 GPUs: every collective on device buffers of two GPUs"]
fn two_gpus_every_collective() {
    require_gpus(2);
    every_collective([0, 1]);
}

/// The same with both ranks of the communicator on GPU 0 (one thread
/// driving both, as `oxccl perf -g 2 --share-gpus`): the pair kernels and
/// copy engines need two GPUs, so every call takes the ring path (this was
/// `ncclInvalidUsage` "two ranks on one GPU" for all but small all-reduces).
#[test]
#[ignore = "needs a GPU: every collective with both ranks on GPU 0"]
fn two_ranks_on_one_gpu_every_collective() {
    require_gpus(1);
    every_collective([0, 0]);
}

/// [`two_gpus_every_collective`]'s calls with rank r on GPU `ords[r]`.
fn every_collective(ords: [i32; 2]) {
    std::thread::spawn(move || {
        let comms = init_grouped(&ords);
        // A stream per rank: sharing one GPU, ranks on one stream would
        // wait for each other (refused: launch_all's shared_stream).
        let gpus: Vec<_> = ords
            .iter()
            .map(|&o| oxccl_cuda::bench_gpu::PerfGpu::open(o as usize).unwrap())
            .collect();
        let streams: Vec<_> = gpus.iter().map(|g| g.stream().unwrap()).collect();
        let st: Vec<*mut c_void> = streams.iter().map(|x| x.raw()).collect();
        let group = |f: &dyn Fn(usize) -> ncclResult_t, what: &str| {
            // SAFETY: ncclGroupStart takes no arguments; it opens a group level on this thread.
            ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
            for r in 0..2 {
                ok(f(r), what);
            }
            // SAFETY: the calls queued since ncclGroupStart name live communicators and device
            // buffers that are freed only after the GPUs are synchronised.
            ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd");
            sync_on(&ords);
        };
        // gpu-test.sh's gpu_abi_ce row sets OXCCL_CUDA_CE_MIN=1: then every
        // copying call below pairs both ranks on the copy engines (one count
        // per rank); otherwise (these sizes stay under the default 64 MiB,
        // or the ring rows take no pair path, or both ranks share a GPU)
        // none does.
        let expect_ce =
            std::env::var("OXCCL_CUDA_CE_MIN").as_deref() == Ok("1") && ords[0] != ords[1];
        // Calls of at most 256 KiB per rank buffer run as one launch of both
        // ranks (oxccl_core::gpu::one_launch) by default on one GPU, on two with
        // OXCCL_CUDA_JOINT_PEERS=1; never with it off or the ring forced.
        let set = |v: &str| std::env::var(v).ok();
        let peers = set("OXCCL_CUDA_JOINT_PEERS").as_deref() == Some("1");
        let expect_joint = if set("OXCCL_CUDA_JOINT_MAX").as_deref() == Some("0")
            || set("OXCCL_CUDA_RING").as_deref() == Some("1")
            || set("NCCL_P2P_DISABLE").as_deref() == Some("1")
            || (ords[0] != ords[1] && !peers)
        {
            Some(false)
        } else if set("OXCCL_CUDA_JOINT_MAX").is_none() && set("NCCL_ALGO").is_none() {
            Some(true)
        } else {
            None
        };
        let joint_before = exec::one_launch_calls();
        let ce_group = |f: &dyn Fn(usize) -> ncclResult_t, what: &str| {
            let before = exec::ce_calls();
            group(f, what);
            assert_eq!(
                exec::ce_calls() - before,
                if expect_ce { 2 } else { 0 },
                "{what}: rank calls through the copy engines"
            );
        };
        for &n in &[1usize, 5, 4099, (1 << 20) + 3] {
            for &off in &[0usize, 4] {
                let ctx = format!("n={n} off={off}");
                // 2n-element send and receive buffers per rank.
                let sb: Vec<_> = (0..2).map(|r| dev_i32(ords[r], 2 * n, off)).collect();
                let rb: Vec<_> = (0..2).map(|r| dev_i32(ords[r], 2 * n, off)).collect();
                let (s, d): (Vec<_>, Vec<_>) = (
                    sb.iter().map(|x| x.1).collect(),
                    rb.iter().map(|x| x.1).collect(),
                );
                let fill = || {
                    for r in 0..2 {
                        let v: Vec<i32> = (0..2 * n).map(|i| val(r, i)).collect();
                        put(s[r], &v);
                        put(d[r], &vec![-7i32; 2 * n]);
                    }
                };
                // SAFETY: callers pass `k` within the 2n-element buffers, so the offset stays
                // inside the allocation.
                let at =
                    |p: *mut c_void, k: usize| unsafe { (p as *mut i32).add(k) } as *mut c_void;

                // all-gather, out of place then in place
                fill();
                ce_group(
                    // SAFETY: `s[r]` and `d[r]` hold 2n int32 on rank r's GPU (dev_i32): n to
                    // send, 2n to gather; `st[r]` is a live stream of that GPU.
                    &|r| unsafe { ncclAllGather(s[r], d[r], n, INT32, comms[r], st[r]) },
                    "ncclAllGather",
                );
                for r in 0..2 {
                    let g: Vec<i32> = get(d[r], 2 * n);
                    for q in 0..2 {
                        for i in 0..n {
                            assert_eq!(
                                g[q * n + i],
                                val(q, i),
                                "{ctx} allgather rank {r} block {q} [{i}]"
                            );
                        }
                    }
                }
                fill();
                for r in 0..2 {
                    put(
                        at(d[r], r * n),
                        &(0..n).map(|i| val(r, i)).collect::<Vec<i32>>(),
                    );
                }
                ce_group(
                    // SAFETY: rank r's block of `d[r]` (2n int32) starts at r * n, inside it;
                    // `st[r]` is a live stream of rank r's GPU.
                    &|r| unsafe { ncclAllGather(at(d[r], r * n), d[r], n, INT32, comms[r], st[r]) },
                    "ncclAllGather in place",
                );
                for r in 0..2 {
                    let g: Vec<i32> = get(d[r], 2 * n);
                    for q in 0..2 {
                        for i in 0..n {
                            assert_eq!(
                                g[q * n + i],
                                val(q, i),
                                "{ctx} allgather in place rank {r} [{q}][{i}]"
                            );
                        }
                    }
                }

                // reduce-scatter sum, out of place then in place
                fill();
                group(
                    // SAFETY: `s[r]` holds 2n int32 (ranks x n) and `d[r]` at least n, on rank
                    // r's GPU; `st[r]` is a live stream there.
                    &|r| unsafe { ncclReduceScatter(s[r], d[r], n, INT32, SUM, comms[r], st[r]) },
                    "ncclReduceScatter",
                );
                for r in 0..2 {
                    let g: Vec<i32> = get(d[r], n);
                    for i in 0..n {
                        assert_eq!(
                            g[i],
                            val(0, r * n + i) + val(1, r * n + i),
                            "{ctx} reducescatter rank {r} [{i}]"
                        );
                    }
                }
                fill();
                group(
                    // SAFETY: `s[r]` holds 2n int32 and its block r (n elements at r * n) lies
                    // inside it; `st[r]` is a live stream of rank r's GPU.
                    &|r| unsafe {
                        ncclReduceScatter(s[r], at(s[r], r * n), n, INT32, MAX, comms[r], st[r])
                    },
                    "ncclReduceScatter in place",
                );
                for r in 0..2 {
                    let g: Vec<i32> = get(at(s[r], r * n), n);
                    for i in 0..n {
                        assert_eq!(
                            g[i],
                            val(1, r * n + i),
                            "{ctx} reducescatter in place rank {r} [{i}]"
                        );
                    }
                }

                // broadcast from each root, out of place and in place
                for root in 0..2 {
                    fill();
                    ce_group(
                        // SAFETY: `s[r]` and `d[r]` hold 2n int32 (n are sent or received) on
                        // rank r's GPU; `st[r]` is a live stream there.
                        &|r| unsafe {
                            ncclBroadcast(s[r], d[r], n, INT32, root as i32, comms[r], st[r])
                        },
                        "ncclBroadcast",
                    );
                    for r in 0..2 {
                        let g: Vec<i32> = get(d[r], n);
                        for i in 0..n {
                            assert_eq!(
                                g[i],
                                val(root, i),
                                "{ctx} broadcast root {root} rank {r} [{i}]"
                            );
                        }
                    }
                    fill();
                    ce_group(
                        // SAFETY: `s[r]` holds 2n int32 (n broadcast in place) on rank r's GPU;
                        // `st[r]` is a live stream there.
                        &|r| unsafe {
                            ncclBroadcast(s[r], s[r], n, INT32, root as i32, comms[r], st[r])
                        },
                        "ncclBroadcast in place",
                    );
                    for r in 0..2 {
                        let g: Vec<i32> = get(s[r], n);
                        for i in 0..n {
                            assert_eq!(
                                g[i],
                                val(root, i),
                                "{ctx} broadcast in place root {root} rank {r} [{i}]"
                            );
                        }
                    }
                }

                // reduce (sum) to each root; the other rank's output is untouched
                for root in 0..2 {
                    fill();
                    group(
                        // SAFETY: `s[r]` and `d[r]` hold 2n int32 (n reduced) on rank r's GPU;
                        // `st[r]` is a live stream there.
                        &|r| unsafe {
                            ncclReduce(s[r], d[r], n, INT32, SUM, root as i32, comms[r], st[r])
                        },
                        "ncclReduce",
                    );
                    for r in 0..2 {
                        let g: Vec<i32> = get(d[r], n);
                        for i in 0..n {
                            let want = if r == root { val(0, i) + val(1, i) } else { -7 };
                            assert_eq!(g[i], want, "{ctx} reduce root {root} rank {r} [{i}]");
                        }
                    }
                }

                // send/receive both ways in one group (sendrecv_perf)
                fill();
                ce_group(
                    // SAFETY: `s[r]` and `d[r]` hold 2n int32 (n sent, n received) on rank r's
                    // GPU; the peer 1 - r is a rank; `st[r]` is a live stream.
                    &|r| unsafe {
                        let a = ncclSend(s[r], n, INT32, (1 - r) as i32, comms[r], st[r]);
                        if a != ncclSuccess {
                            return a;
                        }
                        ncclRecv(d[r], n, INT32, (1 - r) as i32, comms[r], st[r])
                    },
                    "ncclSend/ncclRecv",
                );
                for r in 0..2 {
                    let g: Vec<i32> = get(d[r], n);
                    for i in 0..n {
                        assert_eq!(g[i], val(1 - r, i), "{ctx} sendrecv rank {r} [{i}]");
                    }
                }

                // all-to-all, gather to 0, scatter from 1
                fill();
                ce_group(
                    // SAFETY: `s[r]` and `d[r]` hold 2n int32 (ranks x n, the all-to-all's size)
                    // on rank r's GPU; `st[r]` is a live stream there.
                    &|r| unsafe { ncclAlltoAll(s[r], d[r], n, INT32, comms[r], st[r]) },
                    "ncclAlltoAll",
                );
                for r in 0..2 {
                    let g: Vec<i32> = get(d[r], 2 * n);
                    for q in 0..2 {
                        for i in 0..n {
                            assert_eq!(
                                g[q * n + i],
                                val(q, r * n + i),
                                "{ctx} alltoall rank {r} [{q}][{i}]"
                            );
                        }
                    }
                }
                fill();
                ce_group(
                    // SAFETY: `s[r]` holds n int32 to send and `d[0]` 2n for the root's gather,
                    // on each rank's GPU; `st[r]` is a live stream.
                    &|r| unsafe { ncclGather(s[r], d[r], n, INT32, 0, comms[r], st[r]) },
                    "ncclGather",
                );
                let g: Vec<i32> = get(d[0], 2 * n);
                for q in 0..2 {
                    for i in 0..n {
                        assert_eq!(g[q * n + i], val(q, i), "{ctx} gather [{q}][{i}]");
                    }
                }
                fill();
                ce_group(
                    // SAFETY: `s[1]` holds 2n int32 for the root's scatter and `d[r]` n, on each
                    // rank's GPU; `st[r]` is a live stream.
                    &|r| unsafe { ncclScatter(s[r], d[r], n, INT32, 1, comms[r], st[r]) },
                    "ncclScatter",
                );
                for r in 0..2 {
                    let g: Vec<i32> = get(d[r], n);
                    for i in 0..n {
                        assert_eq!(g[i], val(1, r * n + i), "{ctx} scatter rank {r} [{i}]");
                    }
                }

                // PreMulSum, float: immediate scalars that differ per rank
                // (1 and 2, as nccl-tests passes) for an in-place all-reduce,
                // and a device scalar 2.0 for a reduce-scatter.
                let mut ops = [0i32; 2];
                let mut dops = [0i32; 2];
                let mine = [1.0f32, 2.0f32];
                let two: Vec<_> = (0..2).map(|r| dev_alloc(ords[r], 4)).collect();
                for r in 0..2 {
                    put(two[r], &[2.0f32]);
                    ok(
                        // SAFETY: `ops[r]` is writable; the scalar `mine[r]` is a host float read
                        // at once (ncclScalarHostImmediate); `comms[r]` is live.
                        unsafe {
                            ncclRedOpCreatePreMulSum(
                                &mut ops[r],
                                &mine[r] as *const f32 as *mut c_void,
                                FLOAT32,
                                ncclScalarHostImmediate,
                                comms[r],
                            )
                        },
                        "ncclRedOpCreatePreMulSum",
                    );
                    ok(
                        // SAFETY: `dops[r]` is writable; `two[r]` is a 4-byte device allocation
                        // holding one float that outlives the op; `comms[r]` is live.
                        unsafe {
                            ncclRedOpCreatePreMulSum(
                                &mut dops[r],
                                two[r],
                                FLOAT32,
                                ncclScalarDevice,
                                comms[r],
                            )
                        },
                        "ncclRedOpCreatePreMulSum device",
                    );
                }
                for r in 0..2 {
                    put(
                        s[r],
                        &(0..2 * n)
                            .map(|i| (i % 100) as f32 + r as f32)
                            .collect::<Vec<f32>>(),
                    );
                }
                group(
                    // SAFETY: `s[r]` holds 2n floats (4-byte elements like int32) on rank r's
                    // GPU; `ops[r]` is this rank's live PreMulSum; `st[r]` is a live stream.
                    &|r| unsafe {
                        ncclAllReduce(s[r], s[r], 2 * n, FLOAT32, ops[r], comms[r], st[r])
                    },
                    "ncclAllReduce premulsum",
                );
                for r in 0..2 {
                    let g: Vec<f32> = get(s[r], 2 * n);
                    for i in 0..2 * n {
                        let x = (i % 100) as f32;
                        assert_eq!(g[i], x + 2.0 * (x + 1.0), "{ctx} premulsum rank {r} [{i}]");
                    }
                }
                group(
                    // SAFETY: `s[r]` holds 2n floats and `d[r]` at least n, on rank r's GPU;
                    // `dops[r]` is this rank's live PreMulSum; `st[r]` is a live stream.
                    &|r| unsafe {
                        ncclReduceScatter(s[r], d[r], n, FLOAT32, dops[r], comms[r], st[r])
                    },
                    "ncclReduceScatter premulsum device",
                );
                for r in 0..2 {
                    let g: Vec<f32> = get(d[r], n);
                    for i in 0..n {
                        let x = ((r * n + i) % 100) as f32;
                        assert_eq!(
                            g[i],
                            4.0 * (3.0 * x + 2.0),
                            "{ctx} premulsum device rank {r} [{i}]"
                        );
                    }
                }
                for r in 0..2 {
                    ok(
                        // SAFETY: `ops[r]` was created on `comms[r]` above and is destroyed once,
                        // after its last call.
                        unsafe { ncclRedOpDestroy(ops[r], comms[r]) },
                        "ncclRedOpDestroy",
                    );
                    ok(
                        // SAFETY: `dops[r]` was created on `comms[r]` above and is destroyed
                        // once, after its last call.
                        unsafe { ncclRedOpDestroy(dops[r], comms[r]) },
                        "ncclRedOpDestroy",
                    );
                }
                for p in two
                    .into_iter()
                    .chain(sb.iter().map(|x| x.0))
                    .chain(rb.iter().map(|x| x.0))
                {
                    // SAFETY: `p` came from ncclMemAlloc and is freed once; the GPUs were
                    // synchronised, so no work uses it any more.
                    ok(unsafe { ncclMemFree(p) }, "ncclMemFree");
                }
            }
        }
        let joint = exec::one_launch_calls() - joint_before;
        if let Some(e) = expect_joint {
            assert_eq!(
                joint > 0,
                e,
                "{joint} calls ran as one launch of both ranks"
            );
        }
        for c in comms {
            // SAFETY: `c` is a live communicator of this test, destroyed once and not used
            // afterwards.
            ok(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy");
        }
    })
    .join()
    .unwrap();
}

/// An element of `dtype` (uint8, int32, float32, float64) as bytes.
fn enc(dtype: i32, v: f64) -> Vec<u8> {
    match dtype {
        UINT8 => vec![v as i64 as u8],
        INT32 => (v as i32).to_le_bytes().to_vec(),
        FLOAT32 => (v as f32).to_le_bytes().to_vec(),
        FLOAT64 => v.to_le_bytes().to_vec(),
        _ => unreachable!(),
    }
}

fn dec(dtype: i32, b: &[u8]) -> f64 {
    match dtype {
        UINT8 => b[0] as f64,
        INT32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        FLOAT32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        FLOAT64 => f64::from_le_bytes(b.try_into().unwrap()),
        _ => unreachable!(),
    }
}

fn elem_size(dtype: i32) -> usize {
    match dtype {
        UINT8 => 1,
        INT32 | FLOAT32 => 4,
        _ => 8,
    }
}

/// x0 op x1 from float64 (exact for these values and ops), in the type.
fn want(dtype: i32, op: i32, a: f64, b: f64) -> f64 {
    let r = match op {
        SUM => a + b,
        PROD => a * b,
        MAX => a.max(b),
        MIN => a.min(b),
        AVG => a * 0.5 + b * 0.5,
        _ => unreachable!(),
    };
    match dtype {
        UINT8 => (r as i64).rem_euclid(256) as f64,
        FLOAT32 => r as f32 as f64,
        _ => r,
    }
}

/// Rank r's input element i: small integers and quarters, so sums,
/// products and averages are exact in every type here.
fn cval(dtype: i32, r: usize, i: usize) -> f64 {
    match dtype {
        UINT8 => ((i * 7 + r * 3) % 256) as f64,
        INT32 => (i % 10007) as f64 * if r == 0 { 3.0 } else { -2.0 } + 11.0,
        _ => ((i % 4093) as f64 * 0.25 + 1.0) * if r == 0 { 1.0 } else { -1.5 },
    }
}

/// All-reduces and reduce-scatters through the copy engines: gpu-test.sh's
/// gpu_abi_ce_ar row sets OXCCL_CUDA_CE_AR_MIN=1, and then every call here
/// but the avg and the all-reduces of the one-shot LL range (up to 128 KiB,
/// which take the ring's one-shot kernel) pairs both ranks on the copy
/// engines (one count per rank); otherwise only the largest case does (over
/// the default 512 MiB), none in the ring rows (no pair path), and the same
/// results are checked on the SM kernels. Float sum, int32 max, uint8 prod, float64 min; in place and
/// out of place; odd counts, and a float count whose part fills the
/// 4 × 64 MiB scratch ring more than once (slots reused); avg stays on the
/// SM kernel.
#[test]
#[ignore = "needs 2 GPUs: two GPUs copy engine reductions"]
fn two_gpus_copy_engine_reductions() {
    require_gpus(2);
    std::thread::spawn(|| {
        let comms = init_all(2);
        let env = |k: &str| std::env::var(k).unwrap_or_default();
        let ring_rows = env("OXCCL_CUDA_RING") == "1" || env("NCCL_P2P_DISABLE") == "1";
        let bound = if env("OXCCL_CUDA_CE_AR_MIN") == "1" {
            1
        } else {
            oxccl_cuda::ce_reduce::DEFAULT_AR_MIN
        };
        // Whether a call moving `bytes` (a reduce-scatter: its send buffer)
        // goes to the copy engines; 128 KiB: the one-shot LL bound of 2 ranks.
        let takes_ce = |allreduce: bool, bytes: usize| {
            let b = bytes as u64;
            !ring_rows
                && if allreduce {
                    b > 128 << 10 && b >= bound
                } else {
                    b >= bound * oxccl_cuda::ce_reduce::RS_FACTOR
                }
        };
        let group = |f: &dyn Fn(usize) -> ncclResult_t, what: &str, ce: bool| {
            let before = exec::ce_calls();
            // SAFETY: ncclGroupStart takes no arguments; it opens a group level on this thread.
            ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
            for r in 0..2 {
                ok(f(r), what);
            }
            // SAFETY: the calls queued since ncclGroupStart name live communicators and device
            // buffers that are freed only after the GPUs are synchronised.
            ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd");
            sync_both();
            assert_eq!(
                exec::ce_calls() - before,
                if ce { 2 } else { 0 },
                "{what}: rank calls through the copy engines"
            );
        };
        // 5 pieces in each rank's part (the ring has 4 slots): 640 MiB of
        // float32 per buffer, so only float32 sum takes it (a uint8 one
        // would hold 5 GiB of float64 reference values per rank here).
        let ring_wrap = |sz: usize| (5 * oxccl_cuda::ce_reduce::SLOT_BYTES as usize * 2) / sz + 3;
        let cases = [
            (FLOAT32, SUM, true),
            (INT32, MAX, false),
            (UINT8, PROD, false),
            (FLOAT64, MIN, false),
            (FLOAT32, AVG, false),
        ];
        for (dtype, op, big) in cases {
            let sz = elem_size(dtype);
            let mut counts = vec![1usize, 5, 4099, (1 << 20) + 3];
            if big {
                counts.push(ring_wrap(sz));
            }
            let ce = op != AVG;
            for n in counts {
                // All-reduce of n elements; reduce-scatter of n / 2 + 1 per rank.
                let rs = n / 2 + 1;
                let elems = n.max(2 * rs);
                let s: Vec<_> = (0..2).map(|r| dev_alloc(r, elems * sz)).collect();
                let d: Vec<_> = (0..2).map(|r| dev_alloc(r, elems * sz)).collect();
                let input: Vec<Vec<u8>> = (0..2)
                    .map(|r| {
                        (0..elems)
                            .flat_map(|i| enc(dtype, cval(dtype, r, i)))
                            .collect()
                    })
                    .collect();
                let vals: Vec<Vec<f64>> = (0..2)
                    .map(|r| {
                        (0..elems)
                            .map(|i| dec(dtype, &enc(dtype, cval(dtype, r, i))))
                            .collect()
                    })
                    .collect();
                let fill = || {
                    for r in 0..2 {
                        exec::copy_to_device(s[r] as u64, &input[r]).unwrap();
                        exec::copy_to_device(d[r] as u64, &vec![0xa5u8; elems * sz]).unwrap();
                    }
                };
                let check = |p: *mut c_void, lo: usize, len: usize, ctx: &str| {
                    let mut g = vec![0u8; len * sz];
                    exec::copy_from_device(&mut g, p as u64).unwrap();
                    for i in 0..len {
                        let got = dec(dtype, &g[i * sz..(i + 1) * sz]);
                        let w = want(dtype, op, vals[0][lo + i], vals[1][lo + i]);
                        assert_eq!(got, w, "{ctx} [{i}]");
                    }
                };
                // SAFETY: callers pass `k` up to 2 * rs, within the `elems`-element buffers
                // (elems >= 2 * rs), so the offset stays inside the allocation.
                let at =
                    |p: *mut c_void, k: usize| unsafe { (p as *mut u8).add(k * sz) } as *mut c_void;
                let ctx = format!("type {dtype} op {op} n={n}");
                for in_place in [false, true] {
                    fill();
                    let out = |r: usize| if in_place { s[r] } else { d[r] };
                    group(
                        // SAFETY: `s[r]` and `d[r]` hold `elems` >= n elements of `dtype` on rank
                        // r's GPU, freed only after the GPUs are synchronised.
                        &|r| unsafe {
                            ncclAllReduce(s[r], out(r), n, dtype, op, comms[r], null_mut())
                        },
                        &format!("{ctx} ncclAllReduce in_place={in_place}"),
                        ce && takes_ce(true, n * sz),
                    );
                    for r in 0..2 {
                        check(
                            out(r),
                            0,
                            n,
                            &format!("{ctx} allreduce in_place={in_place} rank {r}"),
                        );
                    }
                    fill();
                    let rout = |r: usize| if in_place { at(s[r], r * rs) } else { d[r] };
                    group(
                        // SAFETY: `s[r]` holds `elems` >= 2 * rs elements (ranks x rs) and
                        // `rout(r)` at least rs inside `s[r]` or `d[r]`, on rank r's GPU.
                        &|r| unsafe {
                            ncclReduceScatter(s[r], rout(r), rs, dtype, op, comms[r], null_mut())
                        },
                        &format!("{ctx} ncclReduceScatter in_place={in_place}"),
                        ce && takes_ce(false, 2 * rs * sz),
                    );
                    for r in 0..2 {
                        check(
                            rout(r),
                            r * rs,
                            rs,
                            &format!("{ctx} reducescatter in_place={in_place} rank {r}"),
                        );
                    }
                }
                for p in s.into_iter().chain(d) {
                    // SAFETY: `p` came from ncclMemAlloc and is freed once; the GPUs were
                    // synchronised, so no work uses it any more.
                    ok(unsafe { ncclMemFree(p) }, "ncclMemFree");
                }
            }
        }
        for c in comms {
            // SAFETY: `c` is a live communicator of this test, destroyed once and not used
            // afterwards.
            ok(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy");
        }
    })
    .join()
    .unwrap();
}

/// A pair kernel whose partner never comes ends at the timeout instead of
/// spinning forever: rank 0 of a `-g 2` communicator makes an all-reduce
/// (4 MiB: the pair kernel, not the ring's one-shot) that rank 1 never
/// makes. The timeout is read once per process, so the test runs its body
/// in a child process of this binary with OXCCL_TIMEOUT_MS=2000
/// (OXCCL_TEST_PAIR_TIMEOUT=1 marks the child).
#[test]
#[ignore = "needs 2 GPUs: a pair kernel whose partner never comes ends at the timeout"]
fn two_gpus_a_missing_partner_times_out() {
    require_gpus(2);
    if std::env::var("OXCCL_TEST_PAIR_TIMEOUT").is_err() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "--nocapture"])
            .arg("two_gpus_a_missing_partner_times_out")
            .env("OXCCL_TEST_PAIR_TIMEOUT", "1")
            .env("OXCCL_TIMEOUT_MS", "2000")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "the child failed: {:?}", out.status);
        assert!(text.contains("1 passed"), "the child ran no test");
        return;
    }
    let comms = init_all(2);
    let n = 1 << 20;
    let buf = dev_alloc(0, n * 4);
    exec::use_device(0).unwrap();
    let t = std::time::Instant::now();
    ok(
        // SAFETY: `buf` is a device allocation of n * 4 bytes on GPU 0 (n floats, in place);
        // `comms[0]` is live.
        unsafe { ncclAllReduce(buf, buf, n, FLOAT32, SUM, comms[0], null_mut()) },
        "ncclAllReduce",
    );
    // The kernel gives up at the timeout and records why: the launch's
    // context synchronises (a kernel still spinning would hang here, and
    // the row's own timeout would fail it).
    exec::synchronize_current().unwrap();
    let took = t.elapsed();
    let mut err = ncclSuccess;
    ok(
        // SAFETY: `comms[0]` is live; `err` is a writable ncclResult_t.
        unsafe { ncclCommGetAsyncError(comms[0], &mut err) },
        "ncclCommGetAsyncError",
    );
    // SAFETY: ncclGetLastError returns a NUL-terminated string that stays valid until this thread
    // calls it again; it is copied at once.
    let last = unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(comms[0])) }
        .to_string_lossy()
        .into_owned();
    println!("a missing partner ended after {took:?}: {err:?}: {last}");
    assert_ne!(err, ncclSuccess, "no error after the partner never came");
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    assert!(last.contains("rank 1"), "{last}");
    // ncclCommAbort, as NCCL's users do after an asynchronous error.
    for c in comms {
        // SAFETY: `c` is a live communicator of this test, aborted once and not used afterwards.
        ok(unsafe { ncclCommAbort(c) }, "ncclCommAbort");
    }
    // SAFETY: `buf` came from ncclMemAlloc and is freed once; its kernel has ended (the context
    // was synchronised above).
    unsafe { ncclMemFree(buf) };
}
