//! Shared helpers of oxccl's integration tests: communicators in threads,
//! child processes as ranks, a watchdog, deterministic inputs and a reference
//! for every collective, type and op.
//!
//! # Inputs and the reference
//!
//! Rank `r`'s element `i` of a case is a pure function of `(seed, r, i)`, so
//! every rank (thread or process) computes the inputs of the others and the
//! expected result by itself, without talking.
//!
//! - Integers: uniformly random bits; the reference works in the type with
//!   wrapping sum and product, `Avg` = wrapped sum / nranks truncated toward
//!   zero, `PreMulSum(s)` = Σ wrapping(x · s truncated to the width). Compared
//!   exactly.
//! - Floats: values from a small dyadic grid chosen so that every partial
//!   result of any reduction order is exactly representable in the storage
//!   type: `k/4` with `|k| <= 16` (float16, bfloat16, float32, float64; sums
//!   of 8 ranks stay within 8 significant bits), integers in `[-2, 2]` for fp8
//!   e4m3 (4 significant bits), in `[-1, 1]` for e5m2 (3 bits); products use
//!   `±2^j, j ∈ {-1, 0, 1}`. So sum, prod, max, min, `PreMulSum` by a power of
//!   two and `Avg` over a power-of-two rank count are compared *exactly*
//!   against an f64 reference, whatever order the schedule reduces in.
//!   "Noisy" cases (seed bit 63, float16/bfloat16/float32/float64) use random
//!   values on the storage grid instead.
//! - Float tolerance where rounding is inherent (`Avg` over 3, 5, 6, 7 ranks,
//!   `PreMulSum(1.5)`, noisy inputs). Any schedule rounds an element's value
//!   to the storage type after each operation on its path: the
//!   pre-multiplication, then n - 1 combines; the scalar itself is rounded to
//!   the accumulation type once. Counting one more for slack, `k = n + 2`
//!   roundings, each off by at most `u·|v|` (`u` the storage type's unit
//!   roundoff: 2^-53, 2^-24, 2^-11, 2^-8, 2^-4, 2^-3 for float64, float32,
//!   float16, bfloat16, e4m3, e5m2) where every partial `|v| <=
//!   Σ|s·x|·(1+u)^k`, or by the subnormal spacing `sub` near zero. So
//!   `tol = k·u·(1+u)^k·Σ|s·x| + k·sub + 2^-23·Σ|s·x|` (the last term: the
//!   scalar's rounding to f32). For fp8 on many ranks this bound is loose;
//!   fp8 correctness rests on the exact cases.
//! - All ranks of an all-reduce must hold the same bits: checked with an
//!   all-gather of a hash of each rank's result.
#![allow(dead_code)]

use oxccl::raw::OpDesc;
use oxccl::HostConfig;
use oxccl::{
    Bf16, Communicator, Config, DataType, Element, Error, ErrorKind, Group, RedOp, Scalar,
    UniqueId, F16, F8E4M3, F8E5M2,
};
use oxccl_core::float;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Watchdog and thread helpers
// ---------------------------------------------------------------------------

/// Aborts the whole test process if the test holding it runs past `limit`:
/// a library hang must fail the run, never stall CI. Dropping it disarms it.
pub struct Watchdog {
    _tx: mpsc::Sender<()>,
}

impl Watchdog {
    pub fn new(name: &str, limit: Duration) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        let name = name.to_string();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!(
                    "WATCHDOG: test `{name}` ran past {:.0} s: the library hangs; aborting the test process",
                    limit.as_secs_f64()
                );
                std::process::abort();
            }
        });
        Watchdog { _tx: tx }
    }
}

/// Settings every test communicator starts from: the environment's host
/// settings with smaller rings (64 KiB: more pipeline slices and wraps, and 28
/// pairs of 8 ranks stay small), and a library timeout that turns a hang into
/// an error well inside the watchdog.
pub fn test_host() -> HostConfig {
    let mut h = Config::default().host_settings();
    h.capacity = 64 << 10;
    h.timeout = Duration::from_secs(60);
    h
}

pub fn test_config(f: impl FnOnce(&mut HostConfig)) -> Config {
    let mut h = test_host();
    f(&mut h);
    Config {
        timeout: Some(Duration::from_secs(60)),
        init_timeout: Some(Duration::from_secs(60)),
        host: Some(h),
        ..Config::default()
    }
}

/// `n` ranks in this process, each made by its own thread, with `cfg`.
pub fn init_threads(n: usize, cfg: &Config) -> oxccl::Result<Vec<Communicator>> {
    let id = UniqueId::new()?;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let id = &id;
                let cfg = cfg.clone();
                s.spawn(move || Communicator::init_rank_config(n, id, r, cfg))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("init thread panicked"))
            .collect()
    })
}

/// Runs `f` on every rank in its own thread; a panic in any rank is re-raised.
pub fn on_ranks<R: Send>(comms: &[Communicator], f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter()
            .map(|h| match h.join() {
                Ok(v) => v,
                Err(p) => std::panic::resume_unwind(p),
            })
            .collect()
    })
}

/// Asserts the kind of an error and that its message contains every needle.
#[track_caller]
pub fn assert_err(r: &oxccl::Result<impl fmt::Debug>, kind: ErrorKind, needles: &[&str]) {
    match r {
        Ok(v) => panic!("expected a {kind:?} error, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(e.kind(), kind, "wrong kind: {e}");
            for n in needles {
                assert!(
                    e.message().contains(n),
                    "error message lacks {n:?}: {}",
                    e.message()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Deterministic inputs
// ---------------------------------------------------------------------------

pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Random bits of rank `rank`'s element `i`.
#[inline]
pub fn rnd(seed: u64, rank: usize, i: usize) -> u64 {
    mix(seed ^ ((rank as u64) << 40) ^ (i as u64).wrapping_mul(0x2545_F491_4F6C_DD1D))
}

/// What an element should be.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// These exact bits (integers, data movement).
    Bits(u64),
    /// Within `tol` of `v` (floating reductions).
    Near(f64, f64),
}

/// Test-side knowledge of an element type.
pub trait TElem: Element + fmt::Debug + PartialEq {
    /// Rank `rank`'s element `i` for a case with `op`.
    fn gen(seed: u64, rank: usize, i: usize, op: RedOp) -> Self;
    /// A value the library never writes by accident (for "untouched" checks).
    fn sentinel(i: usize) -> Self;
    fn bits(self) -> u64;
    /// The expected reduction of one element across ranks (`xs[r]` from rank r).
    fn reduce(op: RedOp, xs: &[Self], noisy: bool) -> Expect;
    fn matches(self, e: &Expect) -> bool {
        match *e {
            Expect::Bits(b) => self.bits() == b,
            Expect::Near(v, tol) => {
                let g = self.to_f64();
                g == v || (g - v).abs() <= tol
            }
        }
    }
    fn to_f64(self) -> f64;
}

macro_rules! int_telem {
    ($($t:ty),*) => {$(
        impl TElem for $t {
            fn gen(seed: u64, rank: usize, i: usize, _op: RedOp) -> Self {
                rnd(seed, rank, i) as $t
            }
            fn sentinel(i: usize) -> Self {
                rnd(0x5e47_1e11, 4242, i) as $t
            }
            fn bits(self) -> u64 {
                self as u64
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn reduce(op: RedOp, xs: &[Self], _noisy: bool) -> Expect {
                let n = xs.len();
                let sum = || xs.iter().fold(0 as $t, |a, &x| a.wrapping_add(x));
                let v: $t = match op {
                    RedOp::Sum => sum(),
                    RedOp::Prod => xs.iter().fold(1 as $t, |a, &x| a.wrapping_mul(x)),
                    RedOp::Max => *xs.iter().max().unwrap(),
                    RedOp::Min => *xs.iter().min().unwrap(),
                    // Sum in the type (wrapping), then divide truncating toward zero.
                    RedOp::Avg => ((sum() as i128) / n as i128) as $t,
                    RedOp::PreMulSum(s) => {
                        let s = s.as_u64_bits() as $t;
                        xs.iter().fold(0 as $t, |a, &x| a.wrapping_add(x.wrapping_mul(s)))
                    }
                };
                Expect::Bits(v as u64)
            }
        }
    )*};
}
int_telem!(i8, u8, i32, u32, i64, u64);

/// How a float type is generated and how precise it is.
struct FloatSpec {
    /// Unit roundoff of the storage type.
    u: f64,
    /// Subnormal spacing of the storage type.
    sub: f64,
    /// Grid: `k * step`, `|k| <= kmax`.
    kmax: i64,
    step: f64,
    /// Whether noisy cases apply (fp8 stays on its exact grid).
    noisy_ok: bool,
}

fn float_gen(spec: &FloatSpec, r: u64, op: RedOp, noisy: bool) -> f64 {
    if matches!(op, RedOp::Prod) {
        let sign = if r & 1 == 1 { -1.0 } else { 1.0 };
        let j = ((r >> 1) % 3) as i32 - 1;
        return sign * 2f64.powi(j);
    }
    if noisy && spec.noisy_ok {
        // Uniform in [-4, 4); the caller rounds it to the storage type.
        return ((r >> 11) as f64 / (1u64 << 53) as f64) * 8.0 - 4.0;
    }
    let k = ((r >> 8) % (2 * spec.kmax as u64 + 1)) as i64 - spec.kmax;
    k as f64 * spec.step
}

fn is_pow2(x: f64) -> bool {
    x != 0.0 && x.is_finite() && {
        let a = x.abs();
        a == 2f64.powi(a.log2().round() as i32)
    }
}

fn float_reduce(spec: &FloatSpec, op: RedOp, xs: &[f64], noisy: bool) -> Expect {
    let n = xs.len();
    let (v, s_eff) = match op {
        RedOp::Sum => (xs.iter().sum(), 1.0),
        RedOp::Prod => (xs.iter().product(), 1.0),
        RedOp::Max => (xs.iter().copied().fold(f64::NEG_INFINITY, f64::max), 1.0),
        RedOp::Min => (xs.iter().copied().fold(f64::INFINITY, f64::min), 1.0),
        RedOp::Avg => (xs.iter().sum::<f64>() / n as f64, 1.0 / n as f64),
        RedOp::PreMulSum(s) => {
            let s = s.as_f64();
            (xs.iter().map(|x| x * s).sum(), s)
        }
    };
    let exact = match op {
        RedOp::Max | RedOp::Min => true,
        RedOp::Prod => true,
        RedOp::Sum => !(noisy && spec.noisy_ok),
        RedOp::Avg => !(noisy && spec.noisy_ok) && n.is_power_of_two(),
        RedOp::PreMulSum(s) => !(noisy && spec.noisy_ok) && is_pow2(s.as_f64()),
    };
    if exact {
        return Expect::Near(v, 0.0);
    }
    let k = (n + 2) as f64;
    let mag: f64 = xs.iter().map(|x| (x * s_eff).abs()).sum();
    let tol = k * spec.u * (1.0 + spec.u).powf(k) * mag + k * spec.sub + mag * 2f64.powi(-23);
    Expect::Near(v, tol)
}

macro_rules! float_telem {
    ($t:ty, $spec:expr, $to:expr, $from:expr, $bits:expr) => {
        impl TElem for $t {
            fn gen(seed: u64, rank: usize, i: usize, op: RedOp) -> Self {
                let noisy = seed >> 63 == 1;
                let v = float_gen(&$spec, rnd(seed, rank, i), op, noisy);
                $from(v)
            }
            fn sentinel(_i: usize) -> Self {
                $from(37.0)
            }
            fn bits(self) -> u64 {
                $bits(self)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn reduce(op: RedOp, xs: &[Self], noisy: bool) -> Expect {
                let v: Vec<f64> = xs.iter().map(|&x| $to(x)).collect();
                float_reduce(&$spec, op, &v, noisy)
            }
        }
    };
}

const SPEC_F64: FloatSpec = FloatSpec {
    u: 1.1102230246251565e-16, // 2^-53
    sub: 5e-324,
    kmax: 16,
    step: 0.25,
    noisy_ok: true,
};
const SPEC_F32: FloatSpec = FloatSpec {
    u: 5.960464477539063e-8, // 2^-24
    sub: 1.401298464324817e-45,
    kmax: 16,
    step: 0.25,
    noisy_ok: true,
};
const SPEC_F16: FloatSpec = FloatSpec {
    u: 0.00048828125,          // 2^-11
    sub: 5.960464477539063e-8, // 2^-24
    kmax: 16,
    step: 0.25,
    noisy_ok: true,
};
const SPEC_BF16: FloatSpec = FloatSpec {
    u: 0.00390625, // 2^-8
    sub: 9.183549615799121e-41,
    kmax: 16,
    step: 0.25,
    noisy_ok: true,
};
const SPEC_E4M3: FloatSpec = FloatSpec {
    u: 0.0625,        // 2^-4
    sub: 0.001953125, // 2^-9
    kmax: 2,
    step: 1.0,
    noisy_ok: false,
};
const SPEC_E5M2: FloatSpec = FloatSpec {
    u: 0.125,              // 2^-3
    sub: 1.52587890625e-5, // 2^-16
    kmax: 1,
    step: 1.0,
    noisy_ok: false,
};

float_telem!(f64, SPEC_F64, |x: f64| x, |v: f64| v, |x: f64| x.to_bits());
float_telem!(
    f32,
    SPEC_F32,
    |x: f32| x as f64,
    |v: f64| v as f32,
    |x: f32| x.to_bits() as u64
);
float_telem!(
    F16,
    SPEC_F16,
    |x: F16| float::f16_to_f32(x.0) as f64,
    |v: f64| F16(float::f32_to_f16(v as f32)),
    |x: F16| x.0 as u64
);
float_telem!(
    Bf16,
    SPEC_BF16,
    |x: Bf16| float::bf16_to_f32(x.0) as f64,
    |v: f64| Bf16(float::f32_to_bf16(v as f32)),
    |x: Bf16| x.0 as u64
);
float_telem!(
    F8E4M3,
    SPEC_E4M3,
    |x: F8E4M3| float::e4m3_to_f32(x.0) as f64,
    |v: f64| F8E4M3(float::f32_to_e4m3(v as f32)),
    |x: F8E4M3| x.0 as u64
);
float_telem!(
    F8E5M2,
    SPEC_E5M2,
    |x: F8E5M2| float::e5m2_to_f32(x.0) as f64,
    |v: f64| F8E5M2(float::f32_to_e5m2(v as f32)),
    |x: F8E5M2| x.0 as u64
);

/// Runs `$body` with `$T` the element type of a `DataType`.
#[macro_export]
macro_rules! with_type {
    ($dt:expr, $T:ident => $body:expr) => {
        match $dt {
            oxccl::DataType::Int8 => {
                type $T = i8;
                $body
            }
            oxccl::DataType::Uint8 => {
                type $T = u8;
                $body
            }
            oxccl::DataType::Int32 => {
                type $T = i32;
                $body
            }
            oxccl::DataType::Uint32 => {
                type $T = u32;
                $body
            }
            oxccl::DataType::Int64 => {
                type $T = i64;
                $body
            }
            oxccl::DataType::Uint64 => {
                type $T = u64;
                $body
            }
            oxccl::DataType::Float16 => {
                type $T = oxccl::F16;
                $body
            }
            oxccl::DataType::Float32 => {
                type $T = f32;
                $body
            }
            oxccl::DataType::Float64 => {
                type $T = f64;
                $body
            }
            oxccl::DataType::Bfloat16 => {
                type $T = oxccl::Bf16;
                $body
            }
            oxccl::DataType::Float8e4m3 => {
                type $T = oxccl::F8E4M3;
                $body
            }
            oxccl::DataType::Float8e5m2 => {
                type $T = oxccl::F8E5M2;
                $body
            }
        }
    };
}

/// A PreMulSum scalar suited to the type (integers take integer scalars).
pub fn premul(dtype: DataType, pick: usize) -> RedOp {
    if dtype.is_float() {
        const F: [f64; 8] = [0.5, 2.0, -1.0, 0.25, 1.0, 1.5, -0.3, 3.0];
        RedOp::PreMulSum(Scalar::F64(F[pick % F.len()]))
    } else {
        const I: [Scalar; 6] = [
            Scalar::I64(3),
            Scalar::I64(-1),
            Scalar::U64(u64::MAX - 6),
            Scalar::I64(1),
            Scalar::I64(0),
            Scalar::I64(0x1_0000_0101),
        ];
        RedOp::PreMulSum(I[pick % I.len()])
    }
}

// ---------------------------------------------------------------------------
// One collective, one rank, against the reference
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    SendRecv,
}

impl Coll {
    pub const ALL: [Coll; 9] = [
        Coll::AllReduce,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::AllToAll,
        Coll::Gather,
        Coll::Scatter,
        Coll::SendRecv,
    ];
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
    }
}

/// One case: every rank runs the same case (with its own rank).
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub coll: Coll,
    pub dtype: DataType,
    pub op: RedOp,
    /// Elements per rank as NCCL counts them (per block for all_gather,
    /// reduce_scatter, all_to_all, gather, scatter; per message for send/recv).
    pub count: usize,
    /// Root, or the send/recv distance (peer = rank + 1 + root % (n - 1)).
    pub root: usize,
    pub in_place: bool,
    pub seed: u64,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}({}, {:?}, count {}, root {}, {}, seed {:#x})",
            self.coll,
            self.dtype,
            self.op,
            self.count,
            self.root,
            if self.in_place {
                "in place"
            } else {
                "out of place"
            },
            self.seed
        )
    }
}

/// Why a case failed on one rank.
#[derive(Debug)]
pub enum Failure {
    /// The library returned an error.
    Lib(Error),
    /// Wrong data.
    Data(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Lib(e) => write!(f, "library error: {e}"),
            Failure::Data(s) => f.write_str(s),
        }
    }
}

/// Runs `case` as this rank and checks the result against the reference.
pub fn run_case(c: &Communicator, case: &Case) -> Result<(), Failure> {
    let r = with_type!(case.dtype, T => run_typed::<T>(c, case));
    r.map_err(|f| match f {
        Failure::Data(s) => {
            Failure::Data(format!("rank {} of {}: {case}: {s}", c.rank(), c.size()))
        }
        l => l,
    })
}

struct Checker {
    bad: Vec<String>,
    nbad: usize,
}

impl Checker {
    fn new() -> Checker {
        Checker {
            bad: Vec::new(),
            nbad: 0,
        }
    }
    fn check<T: TElem>(&mut self, what: &str, i: usize, got: T, e: &Expect) {
        if !got.matches(e) {
            self.nbad += 1;
            if self.bad.len() < 5 {
                self.bad.push(format!(
                    "{what}[{i}] = {got:?} ({}), expected {e:?}",
                    got.to_f64()
                ));
            }
        }
    }
    fn same<T: TElem>(&mut self, what: &str, i: usize, got: T, want: T) {
        self.check(what, i, got, &Expect::Bits(want.bits()));
    }
    fn finish(self) -> Result<(), Failure> {
        if self.nbad == 0 {
            Ok(())
        } else {
            Err(Failure::Data(format!(
                "{} wrong elements: {}",
                self.nbad,
                self.bad.join("; ")
            )))
        }
    }
}

fn lib<T>(r: oxccl::Result<T>) -> Result<T, Failure> {
    r.map_err(Failure::Lib)
}

fn bytes_of<T>(v: &[T]) -> &[u8] {
    // SAFETY: every test element type is plain old data without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn hash_bytes(b: &[u8]) -> u64 {
    b.chunks(8).fold(0x1234_5678u64, |h, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        mix(h ^ u64::from_le_bytes(w))
    })
}

fn run_typed<T: TElem>(c: &Communicator, k: &Case) -> Result<(), Failure> {
    let n = c.size();
    let me = c.rank();
    let cnt = k.count;
    let root = k.root % n;
    let noisy = k.seed >> 63 == 1;
    let x = |r: usize, i: usize| T::gen(k.seed, r, i, k.op);
    let mine = |len: usize| -> Vec<T> { (0..len).map(|i| x(me, i)).collect() };
    let sent = |len: usize| -> Vec<T> { (0..len).map(T::sentinel).collect() };
    // The reduction over ranks of element i of block `blk` (offset blk*cnt).
    let mut xs: Vec<T> = Vec::with_capacity(n);
    let mut red = |i: usize| -> Expect {
        xs.clear();
        xs.extend((0..n).map(|r| x(r, i)));
        T::reduce(k.op, &xs, noisy)
    };
    let mut ck = Checker::new();
    match k.coll {
        Coll::AllReduce => {
            let out = if k.in_place {
                let mut buf = mine(cnt);
                lib(c.all_reduce_in_place(&mut buf, k.op))?;
                buf
            } else {
                let send = mine(cnt);
                let mut recv = sent(cnt);
                lib(c.all_reduce(&send, &mut recv, k.op))?;
                for (i, &v) in send.iter().enumerate() {
                    ck.same("send (must stay unchanged)", i, v, x(me, i));
                }
                recv
            };
            for (i, &g) in out.iter().enumerate() {
                ck.check("recv", i, g, &red(i));
            }
            // Every rank must hold the same bits.
            let h = [hash_bytes(bytes_of(&out))];
            let mut all = vec![0u64; n];
            lib(c.all_gather(&h, &mut all))?;
            if all.iter().any(|&v| v != h[0]) {
                return Err(Failure::Data(format!(
                    "ranks disagree on the all_reduce result (hashes {all:x?})"
                )));
            }
        }
        Coll::Broadcast => {
            let out = if k.in_place {
                let mut buf = if me == root { mine(cnt) } else { sent(cnt) };
                lib(c.broadcast_in_place(&mut buf, root))?;
                buf
            } else {
                // Non-roots pass an empty send buffer half of the time: it is not read.
                let send = if me == root || k.seed & 1 == 0 {
                    mine(cnt)
                } else {
                    Vec::new()
                };
                let mut recv = sent(cnt);
                lib(c.broadcast(&send, &mut recv, root))?;
                recv
            };
            for (i, &g) in out.iter().enumerate() {
                ck.same("recv", i, g, x(root, i));
            }
        }
        Coll::Reduce => {
            if k.in_place {
                let mut buf = mine(cnt);
                lib(c.reduce_in_place(&mut buf, k.op, root))?;
                for (i, &g) in buf.iter().enumerate() {
                    if me == root {
                        ck.check("recv", i, g, &red(i));
                    } else {
                        ck.same("non-root buffer (must stay unchanged)", i, g, x(me, i));
                    }
                }
            } else {
                let send = mine(cnt);
                // Non-roots pass an empty receive buffer half of the time.
                let mut recv = if me == root || k.seed & 1 == 0 {
                    sent(cnt)
                } else {
                    Vec::new()
                };
                lib(c.reduce(&send, &mut recv, k.op, root))?;
                for (i, &g) in recv.iter().enumerate() {
                    if me == root {
                        ck.check("recv", i, g, &red(i));
                    } else {
                        ck.same("non-root recv (must stay unchanged)", i, g, T::sentinel(i));
                    }
                }
            }
        }
        Coll::AllGather => {
            let out = if k.in_place {
                let mut buf = sent(cnt * n);
                for i in 0..cnt {
                    buf[me * cnt + i] = x(me, i);
                }
                lib(c.all_gather_in_place(&mut buf))?;
                buf
            } else {
                let send = mine(cnt);
                let mut recv = sent(cnt * n);
                lib(c.all_gather(&send, &mut recv))?;
                recv
            };
            for q in 0..n {
                for i in 0..cnt {
                    ck.same("recv", q * cnt + i, out[q * cnt + i], x(q, i));
                }
            }
        }
        Coll::ReduceScatter => {
            let (out, off) = if k.in_place {
                let mut buf = mine(cnt * n);
                lib(c.reduce_scatter_in_place(&mut buf, k.op))?;
                (buf, me * cnt)
            } else {
                let send = mine(cnt * n);
                let mut recv = sent(cnt);
                lib(c.reduce_scatter(&send, &mut recv, k.op))?;
                (recv, 0)
            };
            for i in 0..cnt {
                ck.check("recv", off + i, out[off + i], &red(me * cnt + i));
            }
        }
        Coll::AllToAll => {
            let send = mine(cnt * n);
            let mut recv = sent(cnt * n);
            lib(c.all_to_all(&send, &mut recv))?;
            for q in 0..n {
                for i in 0..cnt {
                    ck.same("recv", q * cnt + i, recv[q * cnt + i], x(q, me * cnt + i));
                }
            }
        }
        Coll::Gather => {
            let out = if k.in_place && me == root {
                // NCCL's in-place gather: sendbuff is the root's block of recvbuff.
                let mut buf = sent(cnt * n);
                for i in 0..cnt {
                    buf[root * cnt + i] = x(me, i);
                }
                let p = buf.as_mut_ptr();
                let op = raw(
                    oxccl::CollKind::Gather,
                    p.wrapping_add(root * cnt) as *const T,
                    p,
                    cnt,
                    RedOp::Sum,
                    root,
                );
                // SAFETY: both pointers lie in `buf`, alive and exclusive for the call.
                lib(unsafe { oxccl::raw::run(c, &[op]) })?;
                buf
            } else {
                let send = mine(cnt);
                let mut recv = if me == root {
                    sent(cnt * n)
                } else {
                    Vec::new()
                };
                lib(c.gather(&send, &mut recv, root))?;
                recv
            };
            if me == root {
                for q in 0..n {
                    for i in 0..cnt {
                        ck.same("recv", q * cnt + i, out[q * cnt + i], x(q, i));
                    }
                }
            }
        }
        Coll::Scatter => {
            let (out, off) = if k.in_place && me == root {
                let mut buf: Vec<T> = (0..cnt * n).map(|i| x(root, i)).collect();
                let p = buf.as_mut_ptr();
                let op = raw(
                    oxccl::CollKind::Scatter,
                    p as *const T,
                    p.wrapping_add(root * cnt),
                    cnt,
                    RedOp::Sum,
                    root,
                );
                // SAFETY: both pointers lie in `buf`, alive and exclusive for the call.
                lib(unsafe { oxccl::raw::run(c, &[op]) })?;
                (buf, root * cnt)
            } else {
                let send: Vec<T> = if me == root {
                    (0..cnt * n).map(|i| x(root, i)).collect()
                } else {
                    Vec::new()
                };
                let mut recv = sent(cnt);
                lib(c.scatter(&send, &mut recv, root))?;
                (recv, 0)
            };
            for i in 0..cnt {
                ck.same("recv", off + i, out[off + i], x(root, me * cnt + i));
            }
        }
        Coll::SendRecv => {
            // Everyone sends to rank+d and receives from rank-d, in one group
            // (d = 0 is a rank sending to itself, the only choice with 1 rank).
            let d = if n == 1 { 0 } else { 1 + k.root % (n - 1) };
            let to = (me + d) % n;
            let from = (me + n - d) % n;
            let send = mine(cnt);
            let mut recv = sent(cnt);
            let mut g = Group::new();
            if k.seed & 2 == 0 {
                g.send(c, &send, to).recv(c, &mut recv, from);
            } else {
                g.recv(c, &mut recv, from).send(c, &send, to);
            }
            lib(g.run())?;
            for (i, &v) in recv.iter().enumerate() {
                ck.same("recv", i, v, x(from, i));
            }
        }
    }
    ck.finish()
}

/// A raw operation on typed pointers.
pub fn raw<T: Element>(
    kind: oxccl::CollKind,
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

/// Runs `case` on every rank (threads) and panics with every rank's failure.
#[track_caller]
pub fn run_case_threads(comms: &[Communicator], case: &Case) {
    let res = on_ranks(comms, |c| run_case(c, case));
    let errs: Vec<String> = res
        .iter()
        .enumerate()
        .filter_map(|(r, e)| e.as_ref().err().map(|e| format!("rank {r}: {e}")))
        .collect();
    assert!(
        errs.is_empty(),
        "{case} on {} ranks:\n{}",
        comms.len(),
        errs.join("\n")
    );
}

/// The fixed sweep the multi-process tests run in every rank: every
/// collective, in and out of place, several roots, counts from 0 to 65537,
/// a few (type, op) pairs chosen to cover every element size, integer
/// wrapping, narrow floats and every op.
pub fn fixed_sweep(nranks: usize) -> Vec<Case> {
    let reducing = [
        (DataType::Float32, RedOp::Sum),
        (DataType::Bfloat16, RedOp::Avg),
        (DataType::Int64, RedOp::Max),
        (DataType::Uint8, RedOp::PreMulSum(Scalar::I64(3))),
        (DataType::Float8e4m3, RedOp::Min),
        (DataType::Float64, RedOp::Prod),
        (DataType::Int32, RedOp::Sum),
        (DataType::Float16, RedOp::PreMulSum(Scalar::F64(1.5))),
    ];
    let moving = [
        DataType::Int8,
        DataType::Bfloat16,
        DataType::Float32,
        DataType::Uint64,
    ];
    let counts = [0usize, 1, 13, 1021, 65537];
    let mut v = Vec::new();
    let mut seed = 0x51ee_7000u64 + nranks as u64;
    for coll in Coll::ALL {
        for (ci, &count) in counts.iter().enumerate() {
            for in_place in [false, true] {
                if in_place && matches!(coll, Coll::AllToAll | Coll::SendRecv) {
                    continue;
                }
                let pairs: Vec<(DataType, RedOp)> = if coll.reduces() {
                    reducing.to_vec()
                } else {
                    moving.iter().map(|&d| (d, RedOp::Sum)).collect()
                };
                for (pi, &(dtype, op)) in pairs.iter().enumerate() {
                    // The biggest count only for every other pair, to keep the run short.
                    if count > 5000 && pi % 2 == 1 {
                        continue;
                    }
                    seed = mix(seed);
                    v.push(Case {
                        coll,
                        dtype,
                        op,
                        count,
                        root: ci + pi,
                        in_place,
                        seed,
                    });
                }
            }
        }
    }
    v
}

// ---------------------------------------------------------------------------
// Ranks as child processes
// ---------------------------------------------------------------------------

/// Set in a child: `rank:nranks:unique-id-hex`.
pub const CHILD_ENV: &str = "OXCCL_TEST_CHILD";
/// How long a child may live at most (a second line of defence).
pub const CHILD_LIMIT: Duration = Duration::from_secs(150);

/// A child's view: its rank, the rank count and the unique id.
pub struct ChildCtx {
    pub rank: usize,
    pub nranks: usize,
    pub id: UniqueId,
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// `Some` when this process is a child rank started by [`Procs::spawn`].
pub fn child_ctx() -> Option<ChildCtx> {
    let v = std::env::var(CHILD_ENV).ok()?;
    let mut it = v.split(':');
    let rank = it.next()?.parse().ok()?;
    let nranks = it.next()?.parse().ok()?;
    let b: [u8; 128] = unhex(it.next()?).try_into().ok()?;
    let id = UniqueId::from_bytes(&b).expect("child: unique id");
    // Never outlive a test that lost track of us.
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIMIT);
        eprintln!("child: ran past {} s; exiting", CHILD_LIMIT.as_secs());
        std::process::exit(99);
    });
    Some(ChildCtx { rank, nranks, id })
}

/// Tells the parent something happened ("@@ <word>" on stdout).
pub fn event(word: &str) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "@@ {word}");
    let _ = o.flush();
}

/// Child ranks of one test; killed and reaped on drop, so none outlives it.
pub struct Procs {
    children: Vec<Option<Child>>,
    status: Vec<Option<ExitStatus>>,
    events: mpsc::Receiver<(usize, String)>,
    seen: Vec<Vec<String>>,
    logs: Vec<Arc<Mutex<String>>>,
    pub pids: Vec<u32>,
}

impl Procs {
    /// Starts `n` copies of this test binary running only `test`, as ranks
    /// of `id`, with `env` added to their environment.
    pub fn spawn(test: &str, n: usize, id: &UniqueId, env: &[(&str, &str)]) -> Procs {
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe().expect("current_exe");
        let (tx, events) = mpsc::channel();
        let mut children = Vec::new();
        let mut logs = Vec::new();
        let mut pids = Vec::new();
        for rank in 0..n {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "--exact",
                test,
                "--nocapture",
                "--test-threads=1",
                "--include-ignored",
            ])
            .env(CHILD_ENV, format!("{rank}:{n}:{}", hex(id.as_bytes())))
            .env_remove("RUST_TEST_THREADS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            for (k, v) in env {
                cmd.env(k, v);
            }
            // SAFETY: prctl is async-signal-safe; the child dies with this thread.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let mut child = cmd.spawn().expect("spawn child rank");
            pids.push(child.id());
            let log = Arc::new(Mutex::new(String::new()));
            let out = child.stdout.take().unwrap();
            let err = child.stderr.take().unwrap();
            {
                let log = log.clone();
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(out).lines() {
                        let Ok(line) = line else { break };
                        // libtest may have printed "test name ... " first.
                        if let Some(pos) = line.find("@@ ") {
                            let _ = tx.send((rank, line[pos + 3..].trim().to_string()));
                        }
                        let mut l = log.lock().unwrap();
                        l.push_str(&line);
                        l.push('\n');
                    }
                });
            }
            {
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut s = String::new();
                    let _ = BufReader::new(err).read_to_string(&mut s);
                    log.lock().unwrap().push_str(&s);
                });
            }
            children.push(Some(child));
            logs.push(log);
        }
        Procs {
            children,
            status: vec![None; n],
            events,
            seen: vec![Vec::new(); n],
            logs,
            pids,
        }
    }

    fn pump(&mut self, wait: Duration) {
        if let Ok((r, w)) = self.events.recv_timeout(wait) {
            self.seen[r].push(w);
        }
        while let Ok((r, w)) = self.events.try_recv() {
            self.seen[r].push(w);
        }
    }

    /// Whether `rank` has reported `word` (without waiting).
    pub fn has(&mut self, rank: usize, word: &str) -> bool {
        self.pump(Duration::ZERO);
        self.seen[rank].iter().any(|w| w == word)
    }

    /// Waits until every rank in `ranks` reported `word`; false on timeout.
    pub fn wait_event(&mut self, ranks: &[usize], word: &str, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        loop {
            if ranks
                .iter()
                .all(|&r| self.seen[r].iter().any(|w| w == word))
            {
                return true;
            }
            let now = Instant::now();
            if now >= end {
                return false;
            }
            self.pump((end - now).min(Duration::from_millis(20)));
        }
    }

    /// Sends `sig` to `rank`.
    pub fn signal(&mut self, rank: usize, sig: i32) {
        // SAFETY: plain syscall on a pid we own and have not reaped.
        unsafe {
            libc::kill(self.pids[rank] as i32, sig);
        }
    }

    /// Waits for `ranks` to exit; returns each one's exit time from now, or
    /// None for those still running at `limit`.
    pub fn wait_exit(&mut self, ranks: &[usize], limit: Duration) -> Vec<Option<Duration>> {
        let start = Instant::now();
        let mut done: Vec<Option<Duration>> = vec![None; ranks.len()];
        loop {
            for (j, &r) in ranks.iter().enumerate() {
                if done[j].is_some() {
                    continue;
                }
                if let Some(st) = self.status[r] {
                    let _ = st;
                    done[j] = Some(start.elapsed());
                    continue;
                }
                if let Some(ch) = self.children[r].as_mut() {
                    if let Ok(Some(st)) = ch.try_wait() {
                        self.status[r] = Some(st);
                        done[j] = Some(start.elapsed());
                    }
                }
            }
            if done.iter().all(|d| d.is_some()) || start.elapsed() >= limit {
                return done;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn status(&self, rank: usize) -> Option<ExitStatus> {
        self.status[rank]
    }

    /// Everything `rank` printed so far.
    pub fn log(&self, rank: usize) -> String {
        self.logs[rank].lock().unwrap().clone()
    }

    pub fn all_logs(&self) -> String {
        (0..self.logs.len())
            .map(|r| format!("----- rank {r} -----\n{}", self.log(r)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits for every rank to exit successfully within `limit`; panics with
    /// every rank's output otherwise.
    pub fn expect_success(&mut self, limit: Duration) {
        let all: Vec<usize> = (0..self.children.len()).collect();
        let t = self.wait_exit(&all, limit);
        let ok = t.iter().all(|d| d.is_some())
            && all
                .iter()
                .all(|&r| self.status[r].is_some_and(|s| s.success()));
        if !ok {
            // Let the readers catch up with the last lines.
            std::thread::sleep(Duration::from_millis(100));
            let st: Vec<String> = all
                .iter()
                .map(|&r| match self.status[r] {
                    Some(s) => format!("rank {r}: {s}"),
                    None => format!("rank {r}: still running after {:.0} s", limit.as_secs_f64()),
                })
                .collect();
            panic!("child ranks failed: {}\n{}", st.join(", "), self.all_logs());
        }
        self.expect_ran();
    }

    /// Every child ran its one test (a misspelt test name runs none and exits 0).
    pub fn expect_ran(&self) {
        std::thread::sleep(Duration::from_millis(50));
        for r in 0..self.logs.len() {
            let log = self.log(r);
            assert!(
                log.contains("1 passed"),
                "rank {r} did not run its test:\n{log}"
            );
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for ch in self.children.iter_mut().flatten() {
            let _ = ch.kill();
            let _ = ch.wait();
        }
    }
}

/// Runs the fixed sweep as this child rank with `cfg`; panics on a failure.
pub fn child_sweep(ctx: &ChildCtx, cfg: Config) {
    let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, cfg)
        .unwrap_or_else(|e| panic!("rank {}: init: {e}", ctx.rank));
    for case in fixed_sweep(ctx.nranks) {
        if let Err(f) = run_case(&c, &case) {
            panic!("rank {}: {case}: {f}", ctx.rank);
        }
    }
    c.destroy().unwrap();
}
