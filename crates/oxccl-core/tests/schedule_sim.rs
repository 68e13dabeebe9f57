//! Runs every collective's schedules through the step engine for 1..=8 ranks
//! over simulated streams of small capacity (so rings wrap and pipelines
//! stall), and checks the results against an exact reference. A schedule that
//! deadlocks makes the simulation stop with no progress, which fails the test.

use oxccl_core::engine::{Buffers, Engine, Header, RecvHalf, SendHalf, StreamSeqs};
use oxccl_core::schedule::{build, Request, Shape, Shaped};
use oxccl_core::{CollKind, DataType, RedOp, Reduction, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// A stream with a ring's shape: `cap` bytes in flight at most, and, like a
/// real ring, contiguous space and data only up to the wrap point (positions
/// are totals modulo `cap`), so headers and slices get split at the wrap.
struct Wire {
    q: VecDeque<u8>,
    inflight: usize,
    cap: usize,
    written: usize,
    consumed: usize,
}

struct SimTx {
    w: Arc<Mutex<Wire>>,
    stage: Vec<u8>,
}

struct SimRx {
    w: Arc<Mutex<Wire>>,
    local: Vec<u8>,
    start: usize,
    /// Largest peek returned (to exercise partial progress).
    granule: usize,
}

impl SendHalf for SimTx {
    fn reserve(&mut self) -> Result<&mut [u8]> {
        let w = self.w.lock().unwrap();
        let free = (w.cap - w.inflight).min(w.cap - w.written % w.cap);
        self.stage.resize(free, 0);
        Ok(&mut self.stage[..])
    }
    fn commit(&mut self, n: usize) {
        assert_eq!(n % 8, 0, "commit of {n} bytes");
        let mut w = self.w.lock().unwrap();
        assert!(w.inflight + n <= w.cap);
        w.inflight += n;
        w.written += n;
        w.q.extend(&self.stage[..n]);
    }
    fn flush(&mut self) -> Result<bool> {
        Ok(false)
    }
}

impl RecvHalf for SimRx {
    fn peek(&mut self) -> Result<&[u8]> {
        let mut w = self.w.lock().unwrap();
        self.local.drain(..self.start);
        self.start = 0;
        let take = w.q.len();
        self.local.extend(w.q.drain(..take));
        let to_wrap = w.cap - w.consumed % w.cap;
        let n = self.local.len().min(self.granule).min(to_wrap);
        Ok(&self.local[..n])
    }
    fn consume(&mut self, n: usize) {
        assert_eq!(n % 8, 0, "consume of {n} bytes");
        self.start += n;
        let mut w = self.w.lock().unwrap();
        w.inflight -= n;
        w.consumed += n;
    }
    fn fill(&mut self) -> Result<bool> {
        Ok(false)
    }
}

type Tx = Vec<Vec<Box<dyn SendHalf>>>;
type Rx = Vec<Vec<Box<dyn RecvHalf>>>;

fn mesh(n: usize, nch: usize, cap: usize, granule: usize) -> Vec<(Tx, Rx)> {
    let mut out: Vec<(Tx, Rx)> = (0..n)
        .map(|_| {
            (
                (0..n).map(|_| Vec::new()).collect(),
                (0..n).map(|_| Vec::new()).collect(),
            )
        })
        .collect();
    for a in 0..n {
        for b in 0..n {
            for _ in 0..nch {
                let w = Arc::new(Mutex::new(Wire {
                    q: VecDeque::new(),
                    inflight: 0,
                    cap,
                    written: 0,
                    consumed: 0,
                }));
                out[a].0[b].push(Box::new(SimTx {
                    w: w.clone(),
                    stage: Vec::new(),
                }));
                out[b].1[a].push(Box::new(SimRx {
                    w,
                    local: Vec::new(),
                    start: 0,
                    granule,
                }));
            }
        }
    }
    out
}

/// Input element i of rank r, as an i64 small enough for every type used.
fn val(r: usize, i: usize) -> i64 {
    ((r * 131 + i * 7) % 13) as i64 - 3
}

fn enc(t: DataType, v: i64) -> Vec<u8> {
    match t {
        DataType::Int32 => (v as i32).to_le_bytes().to_vec(),
        DataType::Int64 => v.to_le_bytes().to_vec(),
        DataType::Float32 => (v as f32).to_le_bytes().to_vec(),
        DataType::Float64 => (v as f64).to_le_bytes().to_vec(),
        _ => unreachable!(),
    }
}

fn reduce_ref(t: DataType, op: RedOp, vals: &[i64]) -> i64 {
    let n = vals.len() as i64;
    let r = match op {
        RedOp::Sum | RedOp::Avg => vals.iter().sum::<i64>(),
        RedOp::Prod => vals.iter().product(),
        RedOp::Max => *vals.iter().max().unwrap(),
        RedOp::Min => *vals.iter().min().unwrap(),
        RedOp::PreMulSum(_) => unreachable!(),
    };
    match (op, t) {
        (RedOp::Avg, DataType::Int32 | DataType::Int64) => r / n,
        _ => r,
    }
}

fn check_val(t: DataType, op: RedOp, got: &[u8], want: i64, n: usize, what: &str) {
    match t {
        DataType::Int32 => assert_eq!(
            i32::from_le_bytes(got.try_into().unwrap()) as i64,
            want,
            "{what}"
        ),
        DataType::Int64 => assert_eq!(i64::from_le_bytes(got.try_into().unwrap()), want, "{what}"),
        DataType::Float32 | DataType::Float64 => {
            let g = if t == DataType::Float32 {
                f32::from_le_bytes(got.try_into().unwrap()) as f64
            } else {
                f64::from_le_bytes(got.try_into().unwrap())
            };
            let w = if op == RedOp::Avg {
                want as f64 / n as f64
            } else {
                want as f64
            };
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{what}: got {g} want {w}"
            );
        }
        _ => unreachable!(),
    }
}

struct Case {
    kind: CollKind,
    dtype: DataType,
    op: RedOp,
    n: usize,
    count: usize,
    root: usize,
    in_place: bool,
    shaped: Shaped,
    shape: Shape,
    cap: usize,
    granule: usize,
}

/// (send elements, recv elements) per rank for a collective.
fn sizes(kind: CollKind, count: usize, n: usize) -> (usize, usize) {
    match kind {
        CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => (count, count),
        CollKind::AllGather | CollKind::Gather => (count, count * n),
        CollKind::ReduceScatter | CollKind::Scatter => (count * n, count),
        CollKind::AllToAll => (count * n, count * n),
        CollKind::Send | CollKind::Recv => (count, count),
    }
}

fn run(c: &Case) {
    let e = c.dtype.size();
    let (sc, rc) = sizes(c.kind, c.count, c.n);
    let mut net = mesh(c.n, c.shape.nchannels, c.cap, c.granule);
    // Build inputs. In-place forms place the input inside the receive buffer as NCCL defines.
    let mut sends: Vec<Vec<u8>> = Vec::new();
    let mut recvs: Vec<Vec<u8>> = Vec::new();
    for r in 0..c.n {
        let s: Vec<u8> = (0..sc).flat_map(|i| enc(c.dtype, val(r, i))).collect();
        let mut rv = vec![0xAAu8; rc * e];
        if c.in_place {
            match c.kind {
                CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => rv = s.clone(),
                CollKind::AllGather => {
                    rv[r * c.count * e..(r + 1) * c.count * e].copy_from_slice(&s)
                }
                CollKind::ReduceScatter => rv = s.clone(),
                _ => {}
            }
        }
        sends.push(s);
        recvs.push(rv);
    }
    let mut engines = Vec::new();
    let mut scratch = Vec::new();
    for r in 0..c.n {
        let req = Request {
            kind: c.kind,
            count: c.count,
            root: c.root,
            rank: r,
            nranks: c.n,
            in_place: c.in_place,
        };
        let prog = build(&req, c.shaped, &c.shape);
        scratch.push(vec![0u8; prog.scratch_bytes]);
        let red = Reduction::new(c.dtype, c.op, c.n).unwrap();
        let h = Header {
            seq: 0,
            kind: c.kind,
            dtype: c.dtype,
            op: c.op.wire_code(),
            nchannels: c.shape.nchannels as u8,
            count: c.count as u64,
            root: c.root as u32,
            algo: 0,
        };
        let mut seqs = StreamSeqs::new(c.n, c.shape.nchannels);
        engines.push(Engine::new(prog, Some(red), h, r, &mut seqs));
    }
    let mut idle = 0;
    while !engines.iter().all(|e| e.is_done()) {
        let mut moved = false;
        for r in 0..c.n {
            let (tx, rx) = &mut net[r];
            let mut b = Buffers {
                send: if c.in_place { None } else { Some(&sends[r]) },
                recv: &mut recvs[r],
                scratch: &mut scratch[r],
            };
            moved |= engines[r].poll(&mut b, tx, rx).unwrap();
        }
        idle = if moved { 0 } else { idle + 1 };
        assert!(
            idle < 3,
            "deadlock: {:?} n={} count={} {:?}",
            c.kind,
            c.n,
            c.count,
            c.shaped
        );
    }
    // Check.
    let what = |r: usize, i: usize| {
        format!(
            "{:?} {:?} {:?} n={} count={} root={} in_place={} {:?} ch={} slice={} rank {r} elem {i}",
            c.kind, c.dtype, c.op, c.n, c.count, c.root, c.in_place, c.shaped, c.shape.nchannels, c.shape.slice
        )
    };
    let el = |v: &Vec<u8>, i: usize| v[i * e..(i + 1) * e].to_vec();
    for r in 0..c.n {
        match c.kind {
            CollKind::AllReduce => {
                for i in 0..c.count {
                    let vals: Vec<i64> = (0..c.n).map(|q| val(q, i)).collect();
                    check_val(
                        c.dtype,
                        c.op,
                        &el(&recvs[r], i),
                        reduce_ref(c.dtype, c.op, &vals),
                        c.n,
                        &what(r, i),
                    );
                }
                // Every rank holds the same bits.
                assert_eq!(recvs[r], recvs[0], "{}", what(r, 0));
            }
            CollKind::Reduce if r == c.root => {
                for i in 0..c.count {
                    let vals: Vec<i64> = (0..c.n).map(|q| val(q, i)).collect();
                    check_val(
                        c.dtype,
                        c.op,
                        &el(&recvs[r], i),
                        reduce_ref(c.dtype, c.op, &vals),
                        c.n,
                        &what(r, i),
                    );
                }
            }
            CollKind::Broadcast => {
                for i in 0..c.count {
                    assert_eq!(
                        el(&recvs[r], i),
                        enc(c.dtype, val(c.root, i)),
                        "{}",
                        what(r, i)
                    );
                }
            }
            CollKind::AllGather => {
                for q in 0..c.n {
                    for i in 0..c.count {
                        assert_eq!(
                            el(&recvs[r], q * c.count + i),
                            enc(c.dtype, val(q, i)),
                            "{}",
                            what(r, i)
                        );
                    }
                }
            }
            CollKind::ReduceScatter => {
                let base = if c.in_place { r * c.count } else { 0 };
                for i in 0..c.count {
                    let vals: Vec<i64> = (0..c.n).map(|q| val(q, r * c.count + i)).collect();
                    check_val(
                        c.dtype,
                        c.op,
                        &el(&recvs[r], base + i),
                        reduce_ref(c.dtype, c.op, &vals),
                        c.n,
                        &what(r, i),
                    );
                }
            }
            CollKind::AllToAll => {
                for q in 0..c.n {
                    for i in 0..c.count {
                        assert_eq!(
                            el(&recvs[r], q * c.count + i),
                            enc(c.dtype, val(q, r * c.count + i)),
                            "{}",
                            what(r, i)
                        );
                    }
                }
            }
            CollKind::Gather if r == c.root => {
                for q in 0..c.n {
                    for i in 0..c.count {
                        assert_eq!(
                            el(&recvs[r], q * c.count + i),
                            enc(c.dtype, val(q, i)),
                            "{}",
                            what(r, i)
                        );
                    }
                }
            }
            CollKind::Scatter => {
                for i in 0..c.count {
                    assert_eq!(
                        el(&recvs[r], i),
                        enc(c.dtype, val(c.root, r * c.count + i)),
                        "{}",
                        what(r, i)
                    );
                }
            }
            _ => {}
        }
    }
}

const COUNTS: [usize; 7] = [0, 1, 2, 3, 17, 64, 257];

#[test]
fn every_collective_every_rank_count() {
    let kinds = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::Gather,
        CollKind::Scatter,
    ];
    for kind in kinds {
        for n in 1..=8usize {
            for &count in &COUNTS {
                for in_place in [false, true] {
                    if in_place
                        && matches!(
                            kind,
                            CollKind::AllToAll | CollKind::Gather | CollKind::Scatter
                        )
                    {
                        continue;
                    }
                    for (nch, slice) in [(1usize, 32usize), (2, 64), (3, 8)] {
                        let shapeds: &[Shaped] = if kind == CollKind::AllReduce {
                            &[Shaped::Ring, Shaped::Tree, Shaped::OneShot]
                        } else {
                            &[Shaped::Ring]
                        };
                        for &shaped in shapeds {
                            run(&Case {
                                kind,
                                dtype: DataType::Int32,
                                op: RedOp::Sum,
                                n,
                                count,
                                root: (count + n / 2) % n,
                                in_place,
                                shaped,
                                shape: Shape {
                                    nchannels: nch,
                                    slice,
                                    elem: 4,
                                },
                                // Capacity: header + 2 slices, the deadlock bound's edge.
                                cap: 24 + 2 * slice.max(8) + 8,
                                granule: 40,
                            });
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn reductions_through_schedules() {
    for dtype in [
        DataType::Int32,
        DataType::Int64,
        DataType::Float32,
        DataType::Float64,
    ] {
        for op in RedOp::BUILTIN {
            for n in [1usize, 2, 3, 5, 8] {
                for shaped in [Shaped::Ring, Shaped::Tree, Shaped::OneShot] {
                    for kind in [
                        CollKind::AllReduce,
                        CollKind::Reduce,
                        CollKind::ReduceScatter,
                    ] {
                        if kind != CollKind::AllReduce && shaped != Shaped::Ring {
                            continue;
                        }
                        run(&Case {
                            kind,
                            dtype,
                            op,
                            n,
                            count: 37,
                            root: n - 1,
                            in_place: n % 2 == 1,
                            shaped,
                            shape: Shape {
                                nchannels: 2,
                                slice: 48,
                                elem: dtype.size(),
                            },
                            cap: 256,
                            granule: 1 << 20,
                        });
                    }
                }
            }
        }
    }
}

#[test]
fn mismatched_counts_are_invalid_usage() {
    let mut net = mesh(2, 1, 1024, 1 << 20);
    let shape = Shape {
        nchannels: 1,
        slice: 64,
        elem: 4,
    };
    let mut engines: Vec<Engine> = (0..2)
        .map(|r| {
            let count = if r == 0 { 10 } else { 11 };
            let req = Request {
                kind: CollKind::AllReduce,
                count,
                root: 0,
                rank: r,
                nranks: 2,
                in_place: false,
            };
            let h = Header {
                seq: 0,
                kind: CollKind::AllReduce,
                dtype: DataType::Float32,
                op: 0,
                nchannels: 1,
                count: count as u64,
                root: 0,
                algo: 0,
            };
            let mut seqs = StreamSeqs::new(2, 1);
            Engine::new(
                build(&req, Shaped::Ring, &shape),
                Reduction::new(DataType::Float32, RedOp::Sum, 2).ok(),
                h,
                r,
                &mut seqs,
            )
        })
        .collect();
    let send = [0u8; 44];
    let mut recv = [vec![0u8; 44], vec![0u8; 44]];
    let mut errs = Vec::new();
    for _ in 0..4 {
        for r in 0..2 {
            let (tx, rx) = &mut net[r];
            let mut b = Buffers {
                send: Some(&send[..if r == 0 { 40 } else { 44 }]),
                recv: &mut recv[r][..],
                scratch: &mut [],
            };
            if let Err(e) = engines[r].poll(&mut b, tx, rx) {
                errs.push((r, e));
            }
        }
        if !errs.is_empty() {
            break;
        }
    }
    assert!(!errs.is_empty());
    for (_, e) in &errs {
        assert_eq!(e.kind(), oxccl_core::ErrorKind::InvalidUsage);
        assert!(
            e.message().contains("count=10") && e.message().contains("count=11"),
            "{e}"
        );
    }
}

/// Many operations on the same streams: headers and slices start at every
/// offset of a small ring, including 8 and 16 bytes before its wrap point
/// (where a 24-byte header cannot be written or read in one piece).
#[test]
fn consecutive_ops_cross_wrap_points() {
    for n in [2usize, 3] {
        let cap = 64;
        let mut net = mesh(n, 1, cap, 1 << 20);
        let mut seqs: Vec<StreamSeqs> = (0..n).map(|_| StreamSeqs::new(n, 1)).collect();
        for op_i in 0..60usize {
            let count = 1 + op_i % 5;
            let shape = Shape {
                nchannels: 1,
                slice: 16,
                elem: 4,
            };
            let sends: Vec<Vec<u8>> = (0..n)
                .map(|r| {
                    (0..count)
                        .flat_map(|i| ((r + i + op_i) as i32).to_le_bytes())
                        .collect()
                })
                .collect();
            let mut recvs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; count * 4]).collect();
            let mut engines: Vec<Engine> = (0..n)
                .map(|r| {
                    let req = Request {
                        kind: CollKind::AllReduce,
                        count,
                        root: 0,
                        rank: r,
                        nranks: n,
                        in_place: false,
                    };
                    let h = Header {
                        seq: 0,
                        kind: CollKind::AllReduce,
                        dtype: DataType::Int32,
                        op: 0,
                        nchannels: 1,
                        count: count as u64,
                        root: 0,
                        algo: 0,
                    };
                    let red = Reduction::new(DataType::Int32, RedOp::Sum, n).ok();
                    Engine::new(build(&req, Shaped::Ring, &shape), red, h, r, &mut seqs[r])
                })
                .collect();
            let mut idle = 0;
            while !engines.iter().all(|e| e.is_done()) {
                let mut moved = false;
                for r in 0..n {
                    let (tx, rx) = &mut net[r];
                    let mut b = Buffers {
                        send: Some(&sends[r]),
                        recv: &mut recvs[r],
                        scratch: &mut [],
                    };
                    moved |= engines[r].poll(&mut b, tx, rx).unwrap();
                }
                idle = if moved { 0 } else { idle + 1 };
                assert!(idle < 3, "deadlock at op {op_i} (n={n}, count={count})");
            }
            for (r, recv) in recvs.iter().enumerate() {
                for i in 0..count {
                    let want: i32 = (0..n).map(|q| (q + i + op_i) as i32).sum();
                    let got = i32::from_le_bytes(recv[i * 4..i * 4 + 4].try_into().unwrap());
                    assert_eq!(got, want, "op {op_i} rank {r} elem {i}");
                }
            }
        }
    }
}
