//! Reduction kernels on byte slices: the arithmetic of every collective that
//! reduces, for every NCCL data type and op.
//!
//! Buffers are little-endian elements in `&[u8]`, with no alignment promise
//! (they may point into a shared-memory FIFO or at any offset of a user
//! buffer), so elements are read with `from_le_bytes` over `chunks_exact` and
//! never transmuted. Each public call dispatches once on (data type, op) to a
//! monomorphised loop: a generic loop over an element trait (`Elem`), fed a
//! closure that is the op (with the pre-multiplication and the finishing step
//! folded in), so there is no per-element dispatch.
//!
//! # Semantics (NCCL's)
//!
//! - Integers: wrapping sum and product; signed or unsigned max and min.
//! - float16, bfloat16 and both fp8 formats are decoded to `f32`, combined in
//!   `f32` and rounded back (nearest even; see [`crate::float`] for overflow and
//!   NaN). float32 works in `f32`, float64 in `f64`.
//! - Float max and min ignore a NaN operand (IEEE `maxNum`/`minNum`, like
//!   CUDA's `fmaxf`); the result of max/min of +0 and -0 is either zero.
//! - `PreMulSum(s)`: every rank's raw input is multiplied by `s` first (floats:
//!   in the accumulation type, the product rounded to the storage type;
//!   integers: wrapping multiply by `s.as_u64_bits()` truncated to the width).
//! - `Avg`: floats pre-multiply by `1/nranks` (rounded to the accumulation
//!   type); integers sum and the finishing step (`last`) divides by `nranks`,
//!   truncating toward zero.
//! - A pre-multiplication by exactly 1 (`Avg` with one rank, `PreMulSum(1)`) is
//!   skipped, so those calls move bits unchanged as `Sum` does.
//!
//! The operand order of the binary ops is fixed (`new ⊕ acc`, `out ⊕ acc`,
//! `a ⊕ b`), so `accumulate(out, local, acc)` gives the same bits as
//! `start(tmp, local); combine3(out, tmp, acc)` also where IEEE leaves a choice
//! (NaN payloads, the sign of a zero from max/min).
//!
//! # Vectorisation (checked on x86-64 at the SSE2 baseline, rustc 1.95, release)
//!
//! Each loop is its own `#[inline(never)]` function (`<BinOut as
//! BinRunner>::run::<E, F>` and friends), so it can be found in the assembly
//! (`cargo rustc --release -p oxccl-core --lib -- --emit asm -C
//! symbol-mangling-version=v0`) and in profiles. What the loops compile to,
//! counted per function (the `BinOut` and `BinInPlace` shapes are alike):
//!
//! | loop | packed instructions in the loop |
//! |------|---------------------------------|
//! | f32 sum | `movups` loads/stores, `addps` (unrolled ×2) |
//! | f32 prod | `mulps` |
//! | f32 max / min | `maxps`/`minps` + `cmpunordps` + `andps`/`andnps`/`orps` (the NaN-ignoring select of `f32::max`) |
//! | f32 premulsum/avg | `mulps` + `addps` |
//! | f64 sum / prod / max | `addpd` / `mulpd` / `maxpd` + `cmpunordpd` + blend |
//! | i32 sum | `paddd` |
//! | i32 max | `pcmpgtd` + `pand`/`pandn`/`por` (SSE2 has no `pmaxsd`) |
//! | i32 prod | `pmuludq` + `pshufd` (no `pmulld` before SSE4.1) |
//! | i8 sum / max / prod | `paddb` / `pcmpgtb` + blend / `pmullw` + `packuswb` |
//! | u8 max | `pmaxub` |
//! | u32, i64, u64 max | `pxor` sign flip + `pcmpgtd` (+ `pcmpeqd`/`pshufd` for 64-bit) + blend |
//! | i64 sum / prod | `paddq` / `pmuludq` + shifts |
//! | bf16 sum | `punpcklwd`/`punpckhwd` + `pslld` (decode), `addps`, `paddd`/`psrld`/`pcmpgtd` + blend (round to nearest even, NaN select), `psrad` + `packssdw` (narrow) |
//! | f16 sum / prod / max | as bf16, plus the subnormal path's `addps`, about 290 instructions per function: decode and encode are bit arithmetic and selects, fully packed |
//! | fp8 e4m3 / e5m2 sum / prod / max | `punpcklbw`/`punpcklwd` widening, the same bit-arithmetic decode and encode, `packuswb` narrowing: packed |
//! | integer avg, finishing step | not vectorised: a scalar `idiv`/`div` per element (only on the last step) |
//!
//! So every sum, product, max, min and pre-multiplied sum loop is packed at
//! the SSE2 baseline, the narrow floats included, because their conversions
//! ([`crate::float`]) are branch-free bit arithmetic rather than table lookups.

use crate::error::{Error, Result};
use crate::float;
use crate::types::{DataType, RedOp};

/// The combining operator, after `Avg` and `PreMulSum` were turned into sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Sum,
    Prod,
    Max,
    Min,
}

/// A reduction of `dtype` with `op` across `nranks` ranks.
#[derive(Debug, Clone, Copy)]
pub struct Reduction {
    dtype: DataType,
    op: Op,
    /// Pre-multiply every raw input (float `PreMulSum`/`Avg`, integer `PreMulSum`).
    pre: bool,
    /// The scalar for floats, already in f64 (converted to the accumulation type per loop).
    scale_f: f64,
    /// The scalar for integers: two's complement bits, truncated per type.
    scale_u: u64,
    /// Divide by `nranks` in the finishing step (integer `Avg`).
    post_div: bool,
    nranks: u64,
}

impl Reduction {
    /// A reduction of `dtype` with `op` across `nranks` ranks. Errors when
    /// `nranks` is 0 or, for a floating type, when the `PreMulSum` scalar is
    /// not finite in the accumulation type (`f32` for float32 and narrower).
    pub fn new(dtype: DataType, op: RedOp, nranks: usize) -> Result<Reduction> {
        if nranks == 0 {
            return Err(Error::invalid_argument(
                "reduction over 0 ranks (nranks must be at least 1)",
            ));
        }
        let mut r = Reduction {
            dtype,
            op: Op::Sum,
            pre: false,
            scale_f: 1.0,
            scale_u: 1,
            post_div: false,
            nranks: nranks as u64,
        };
        let is_float = dtype.is_float();
        match op {
            RedOp::Sum => {}
            RedOp::Prod => r.op = Op::Prod,
            RedOp::Max => r.op = Op::Max,
            RedOp::Min => r.op = Op::Min,
            RedOp::Avg => {
                if is_float {
                    r.scale_f = 1.0 / nranks as f64;
                    r.pre = nranks != 1;
                } else {
                    r.post_div = nranks != 1;
                }
            }
            RedOp::PreMulSum(s) => {
                if is_float {
                    let v = s.as_f64();
                    let fits = if dtype == DataType::Float64 {
                        v.is_finite()
                    } else {
                        (v as f32).is_finite()
                    };
                    if !fits {
                        return Err(Error::invalid_argument(format!(
                            "PreMulSum scalar {v} is not a finite value of the {} accumulation type",
                            if dtype == DataType::Float64 { "f64" } else { "f32" }
                        )));
                    }
                    r.scale_f = v;
                    r.pre = v != 1.0;
                } else {
                    r.scale_u = s.as_u64_bits();
                    // Truncated to the type's width, a scalar of 1 is a plain sum.
                    let mask = if dtype.size() == 8 {
                        u64::MAX
                    } else {
                        (1u64 << (8 * dtype.size())) - 1
                    };
                    r.pre = r.scale_u & mask != 1;
                }
            }
        }
        Ok(r)
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// `out = pre(local)`; with `last` also apply the finishing step (integer Avg: / nranks).
    pub fn start(&self, out: &mut [u8], local: &[u8], last: bool) {
        assert_eq!(
            out.len(),
            local.len(),
            "start: out and local lengths differ"
        );
        self.check_len(local.len());
        if self.unary_is_identity(last) {
            out.copy_from_slice(local);
            return;
        }
        with_elem!(self.dtype, E => self.unary::<E, _>(UnOut { out, a: local }, last));
    }

    /// `buf = pre(buf)`; finishing step if `last`.
    pub fn start_in_place(&self, buf: &mut [u8], last: bool) {
        self.check_len(buf.len());
        if self.unary_is_identity(last) {
            return;
        }
        with_elem!(self.dtype, E => self.unary::<E, _>(UnInPlace { buf }, last));
    }

    /// `out = acc ⊕ pre(local)` (`acc` is a partial result already pre-scaled);
    /// finishing step if `last`.
    pub fn accumulate(&self, out: &mut [u8], local: &[u8], acc: &[u8], last: bool) {
        assert!(
            out.len() == local.len() && out.len() == acc.len(),
            "accumulate: out, local and acc lengths differ"
        );
        self.check_len(out.len());
        with_elem!(self.dtype, E => self.binary::<E, _>(BinOut { out, a: local, b: acc }, true, last));
    }

    /// `buf = acc ⊕ pre(buf)`; finishing step if `last`.
    pub fn accumulate_in_place(&self, buf: &mut [u8], acc: &[u8], last: bool) {
        assert_eq!(
            buf.len(),
            acc.len(),
            "accumulate_in_place: buf and acc lengths differ"
        );
        self.check_len(buf.len());
        with_elem!(self.dtype, E => self.binary::<E, _>(BinInPlace { buf, b: acc }, true, last));
    }

    /// `out = out ⊕ acc`, both partials already pre-scaled (combining two
    /// partial results); finishing step if `last`.
    pub fn combine(&self, out: &mut [u8], acc: &[u8], last: bool) {
        assert_eq!(out.len(), acc.len(), "combine: out and acc lengths differ");
        self.check_len(out.len());
        with_elem!(self.dtype, E => self.binary::<E, _>(BinInPlace { buf: out, b: acc }, false, last));
    }

    /// `out = a ⊕ b`, both partials already pre-scaled; finishing step if `last`.
    pub fn combine3(&self, out: &mut [u8], a: &[u8], b: &[u8], last: bool) {
        assert!(
            out.len() == a.len() && out.len() == b.len(),
            "combine3: out, a and b lengths differ"
        );
        self.check_len(out.len());
        with_elem!(self.dtype, E => self.binary::<E, _>(BinOut { out, a, b }, false, last));
    }

    /// True when `start` with this `last` changes nothing (no pre-multiplication, no finishing step).
    #[inline(always)]
    fn unary_is_identity(&self, last: bool) -> bool {
        !(self.pre || (last && self.post_div))
    }

    #[inline(always)]
    fn check_len(&self, len: usize) {
        debug_assert_eq!(
            len % self.dtype.size(),
            0,
            "buffer length {len} is not a multiple of the {} element size",
            self.dtype
        );
    }

    /// Runs `r` with `pre` and (if `last`) the finishing step; the caller has
    /// already handled the case where both are the identity.
    #[inline(always)]
    fn unary<E: Elem, R: UnRunner>(&self, r: R, last: bool) {
        let s = E::scalar(self.scale_f, self.scale_u);
        let n = self.nranks;
        match (self.pre, E::HAS_FINISH && last && self.post_div) {
            (true, true) => r.run::<E, _>(move |x| E::finish(E::premul(x, s), n)),
            (true, false) => r.run::<E, _>(move |x| E::premul(x, s)),
            (false, _) => r.run::<E, _>(move |x| E::finish(x, n)),
        }
    }

    /// Runs `r` with the op; the first operand pre-multiplied if `pre_first`,
    /// the finishing step if `last`.
    #[inline(always)]
    fn binary<E: Elem, R: BinRunner>(&self, r: R, pre_first: bool, last: bool) {
        let s = E::scalar(self.scale_f, self.scale_u);
        let n = self.nranks;
        let fin = E::HAS_FINISH && last && self.post_div;
        match self.op {
            Op::Prod => r.run::<E, _>(E::A::mul),
            Op::Max => r.run::<E, _>(E::A::max),
            Op::Min => r.run::<E, _>(E::A::min),
            Op::Sum => match (pre_first && self.pre, fin) {
                (false, false) => r.run::<E, _>(E::A::add),
                (true, false) => r.run::<E, _>(move |x, y| E::A::add(E::premul(x, s), y)),
                (false, true) => r.run::<E, _>(move |x, y| E::finish(E::A::add(x, y), n)),
                (true, true) => {
                    r.run::<E, _>(move |x, y| E::finish(E::A::add(E::premul(x, s), y), n))
                }
            },
        }
    }
}

/// Dispatches on the data type to a block generic over the element type.
macro_rules! with_elem {
    ($dt:expr, $E:ident => $body:expr) => {
        match $dt {
            DataType::Int8 => {
                type $E = i8;
                $body
            }
            DataType::Uint8 => {
                type $E = u8;
                $body
            }
            DataType::Int32 => {
                type $E = i32;
                $body
            }
            DataType::Uint32 => {
                type $E = u32;
                $body
            }
            DataType::Int64 => {
                type $E = i64;
                $body
            }
            DataType::Uint64 => {
                type $E = u64;
                $body
            }
            DataType::Float16 => {
                type $E = F16;
                $body
            }
            DataType::Float32 => {
                type $E = f32;
                $body
            }
            DataType::Float64 => {
                type $E = f64;
                $body
            }
            DataType::Bfloat16 => {
                type $E = Bf16;
                $body
            }
            DataType::Float8e4m3 => {
                type $E = E4m3;
                $body
            }
            DataType::Float8e5m2 => {
                type $E = E5m2;
                $body
            }
        }
    };
}
use with_elem;

/// Arithmetic of an accumulation type.
trait Arith: Copy {
    fn add(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
}

/// A storage element: how it is read from and written to little-endian bytes,
/// in its accumulation type `A`.
trait Elem {
    const SIZE: usize;
    /// Whether the finishing step can do anything (integers); lets the float
    /// loops with a finishing step compile away.
    const HAS_FINISH: bool;
    type A: Arith;
    fn load(b: &[u8]) -> Self::A;
    fn store(v: Self::A, b: &mut [u8]);
    /// The pre-multiplication scalar in the accumulation type.
    fn scalar(f: f64, u: u64) -> Self::A;
    /// `x * s`, rounded to the storage type (what a `start` would store).
    fn premul(x: Self::A, s: Self::A) -> Self::A;
    /// The finishing step: `/ n` for integers, identity for floats.
    fn finish(x: Self::A, n: u64) -> Self::A;
}

macro_rules! int_elem {
    ($t:ty, $wide:ty) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                if a > b {
                    a
                } else {
                    b
                }
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                if a < b {
                    a
                } else {
                    b
                }
            }
        }
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            const HAS_FINISH: bool = true;
            type A = $t;
            #[inline(always)]
            fn load(b: &[u8]) -> $t {
                <$t>::from_le_bytes(b.try_into().unwrap())
            }
            #[inline(always)]
            fn store(v: $t, b: &mut [u8]) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            #[inline(always)]
            fn scalar(_f: f64, u: u64) -> $t {
                u as $t
            }
            #[inline(always)]
            fn premul(x: $t, s: $t) -> $t {
                x.wrapping_mul(s)
            }
            #[inline(always)]
            fn finish(x: $t, n: u64) -> $t {
                // In a wider type so that n never wraps; |x / n| <= |x| fits back.
                (x as $wide / n as $wide) as $t
            }
        }
    };
}

int_elem!(i8, i64);
int_elem!(u8, u64);
int_elem!(i32, i64);
int_elem!(u32, u64);
int_elem!(i64, i128);
int_elem!(u64, u64);

macro_rules! float_arith {
    ($t:ty) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a + b
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a * b
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                a.max(b)
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                a.min(b)
            }
        }
    };
}
float_arith!(f32);
float_arith!(f64);

macro_rules! wide_float_elem {
    ($t:ty) => {
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            const HAS_FINISH: bool = false;
            type A = $t;
            #[inline(always)]
            fn load(b: &[u8]) -> $t {
                <$t>::from_le_bytes(b.try_into().unwrap())
            }
            #[inline(always)]
            fn store(v: $t, b: &mut [u8]) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            #[inline(always)]
            fn scalar(f: f64, _u: u64) -> $t {
                f as $t
            }
            #[inline(always)]
            fn premul(x: $t, s: $t) -> $t {
                x * s
            }
            #[inline(always)]
            fn finish(x: $t, _n: u64) -> $t {
                x
            }
        }
    };
}
wide_float_elem!(f32);
wide_float_elem!(f64);

/// float16 storage, f32 accumulation.
struct F16;
/// bfloat16 storage, f32 accumulation.
struct Bf16;
/// fp8 e4m3 storage, f32 accumulation.
struct E4m3;
/// fp8 e5m2 storage, f32 accumulation.
struct E5m2;

macro_rules! narrow_float_elem {
    ($t:ty, $bits:ty, $dec:path, $enc:path) => {
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$bits>();
            const HAS_FINISH: bool = false;
            type A = f32;
            #[inline(always)]
            fn load(b: &[u8]) -> f32 {
                $dec(<$bits>::from_le_bytes(b.try_into().unwrap()))
            }
            #[inline(always)]
            fn store(v: f32, b: &mut [u8]) {
                b.copy_from_slice(&$enc(v).to_le_bytes());
            }
            #[inline(always)]
            fn scalar(f: f64, _u: u64) -> f32 {
                f as f32
            }
            #[inline(always)]
            fn premul(x: f32, s: f32) -> f32 {
                $dec($enc(x * s))
            }
            #[inline(always)]
            fn finish(x: f32, _n: u64) -> f32 {
                x
            }
        }
    };
}
narrow_float_elem!(F16, u16, float::f16_to_f32, float::f32_to_f16);
narrow_float_elem!(Bf16, u16, float::bf16_to_f32, float::f32_to_bf16);
narrow_float_elem!(E4m3, u8, float::e4m3_to_f32, float::f32_to_e4m3);
narrow_float_elem!(E5m2, u8, float::e5m2_to_f32, float::f32_to_e5m2);

/// A unary loop shape: `out = f(a)` or `buf = f(buf)`.
trait UnRunner {
    fn run<E: Elem, F: Fn(E::A) -> E::A>(self, f: F);
}
/// A binary loop shape: `out = f(a, b)` or `buf = f(buf, b)`.
trait BinRunner {
    fn run<E: Elem, F: Fn(E::A, E::A) -> E::A>(self, f: F);
}

struct UnOut<'a> {
    out: &'a mut [u8],
    a: &'a [u8],
}
struct UnInPlace<'a> {
    buf: &'a mut [u8],
}
struct BinOut<'a> {
    out: &'a mut [u8],
    a: &'a [u8],
    b: &'a [u8],
}
struct BinInPlace<'a> {
    buf: &'a mut [u8],
    b: &'a [u8],
}

impl UnRunner for UnOut<'_> {
    #[inline(never)]
    fn run<E: Elem, F: Fn(E::A) -> E::A>(self, f: F) {
        for (o, a) in self
            .out
            .chunks_exact_mut(E::SIZE)
            .zip(self.a.chunks_exact(E::SIZE))
        {
            E::store(f(E::load(a)), o);
        }
    }
}

impl UnRunner for UnInPlace<'_> {
    #[inline(never)]
    fn run<E: Elem, F: Fn(E::A) -> E::A>(self, f: F) {
        for o in self.buf.chunks_exact_mut(E::SIZE) {
            let v = f(E::load(o));
            E::store(v, o);
        }
    }
}

impl BinRunner for BinOut<'_> {
    #[inline(never)]
    fn run<E: Elem, F: Fn(E::A, E::A) -> E::A>(self, f: F) {
        for ((o, a), b) in self
            .out
            .chunks_exact_mut(E::SIZE)
            .zip(self.a.chunks_exact(E::SIZE))
            .zip(self.b.chunks_exact(E::SIZE))
        {
            E::store(f(E::load(a), E::load(b)), o);
        }
    }
}

impl BinRunner for BinInPlace<'_> {
    #[inline(never)]
    fn run<E: Elem, F: Fn(E::A, E::A) -> E::A>(self, f: F) {
        for (o, b) in self
            .buf
            .chunks_exact_mut(E::SIZE)
            .zip(self.b.chunks_exact(E::SIZE))
        {
            let v = f(E::load(o), E::load(b));
            E::store(v, o);
        }
    }
}

/// The expected result, in f64, of reducing `inputs` (one f64 per rank) with
/// `op`: exact arithmetic up to f64 rounding, summed in rank order. `Avg` is
/// the plain mean (no integer truncation); `PreMulSum(s)` is `s * Σ inputs`.
/// An empty `inputs` gives the op's identity (0, 1, -inf, +inf).
pub fn reference_f64(op: RedOp, inputs: &[f64]) -> f64 {
    match op {
        RedOp::Sum => inputs.iter().sum(),
        RedOp::Prod => inputs.iter().product(),
        RedOp::Max => inputs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        RedOp::Min => inputs.iter().copied().fold(f64::INFINITY, f64::min),
        RedOp::Avg => {
            if inputs.is_empty() {
                0.0
            } else {
                inputs.iter().sum::<f64>() / inputs.len() as f64
            }
        }
        RedOp::PreMulSum(s) => inputs.iter().map(|x| x * s.as_f64()).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Scalar;

    #[test]
    fn errors() {
        assert!(Reduction::new(DataType::Float32, RedOp::Sum, 0).is_err());
        let inf = RedOp::PreMulSum(Scalar::F64(f64::INFINITY));
        assert!(Reduction::new(DataType::Float32, inf, 2).is_err());
        let nan = RedOp::PreMulSum(Scalar::F64(f64::NAN));
        assert!(Reduction::new(DataType::Float64, nan, 2).is_err());
        let big = RedOp::PreMulSum(Scalar::F64(1e300));
        assert!(Reduction::new(DataType::Float16, big, 2).is_err());
        assert!(Reduction::new(DataType::Float64, big, 2).is_ok());
        // Integers take any scalar bits.
        assert!(Reduction::new(DataType::Int32, inf, 2).is_ok());
    }

    #[test]
    fn int_avg_divides_on_last_only() {
        let r = Reduction::new(DataType::Int32, RedOp::Avg, 3).unwrap();
        let a: Vec<u8> = [-7i32, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        let b: Vec<u8> = [-1i32, 1].iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = vec![0u8; 8];
        r.combine3(&mut out, &a, &b, false);
        assert_eq!(&out[..4], &(-8i32).to_le_bytes());
        r.combine3(&mut out, &a, &b, true);
        assert_eq!(&out[..4], &(-2i32).to_le_bytes());
        assert_eq!(&out[4..], &3i32.to_le_bytes());
        // i8 with more ranks than i8::MAX divides correctly.
        let r = Reduction::new(DataType::Int8, RedOp::Avg, 200).unwrap();
        let mut buf = [100u8];
        r.start_in_place(&mut buf, true);
        assert_eq!(buf, [0]);
        let mut buf = [(-100i8) as u8];
        let r = Reduction::new(DataType::Int8, RedOp::Avg, 30).unwrap();
        r.start_in_place(&mut buf, true);
        assert_eq!(buf[0] as i8, -3);
    }
}
