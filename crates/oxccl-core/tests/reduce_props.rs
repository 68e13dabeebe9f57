//! Properties of the reduction kernels (`oxccl_core::reduce`) and of the
//! narrow float conversions (`oxccl_core::float`).
//!
//! Reductions are checked the way an executor drives them: a ring chain
//! (`start` at one rank, then `accumulate` at each next rank, the finishing
//! step on the last), alternating the in-place and out-of-place variants, and a
//! two-level tree (two ring chains combined with `combine`/`combine3`). Results
//! are compared with a reference:
//!
//! - integers: exact, computed in i128 and wrapped to the type's width
//!   (avg: the wrapped sum divided by nranks, truncating toward zero);
//! - floats, max and min: exact (inputs are representable, and rounding is
//!   monotone so max/min never round);
//! - floats, sum/avg/premulsum/prod: `|got - ref| <= tol` with
//!   `tol = M * ((1 + u)^m - 1) + m * d`, where
//!   `u = u_s + u_a` is the relative error of one combine (`u_s = 2^-p` the
//!   unit roundoff of the storage type with `p` significand bits, `u_a` that of
//!   the accumulation type, f32 or f64: the f32 op rounds, then the store
//!   rounds), `m = 2 * nranks + 1` bounds the roundings on any path (one
//!   pre-multiplication rounding per rank plus the scalar's own rounding, one
//!   combine per rank), `d` is the smallest positive subnormal of the storage
//!   type (a rounding in the subnormal range errs by up to `d / 2` absolutely),
//!   and `M` is `Σ|s * x_i|` for sums (the classic recursive-summation bound)
//!   and `|Π x_i|` for products.
//!
//! Inputs are drawn so no result saturates or overflows: float values are
//! drawn in a per-type range and rounded through the type; products use
//! magnitudes in [0.75, 1.5] so no partial product leaves the normal range.

use oxccl_core::float::{
    bf16_to_f32, e4m3_to_f32, e5m2_to_f32, f16_to_f32, f32_to_bf16, f32_to_e4m3, f32_to_e5m2,
    f32_to_f16,
};
use oxccl_core::reduce::reference_f64;
use oxccl_core::{DataType, RedOp, Reduction, Scalar};
use proptest::prelude::*;

/// A small deterministic generator (xorshift64*), so a case is a seed.
struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn bits(dt: DataType) -> u32 {
    8 * dt.size() as u32
}

/// `v` reduced modulo 2^bits and sign- or zero-extended as the type says.
fn wrap(dt: DataType, v: i128) -> i128 {
    let b = bits(dt);
    let m = v & ((1i128 << b) - 1);
    if dt.is_signed_int() && m >= 1i128 << (b - 1) {
        m - (1i128 << b)
    } else {
        m
    }
}

/// Rounds an f64 through the storage type (the value it would hold).
fn round_to(dt: DataType, v: f64) -> f64 {
    let f = v as f32;
    match dt {
        DataType::Float16 => f16_to_f32(f32_to_f16(f)) as f64,
        DataType::Bfloat16 => bf16_to_f32(f32_to_bf16(f)) as f64,
        DataType::Float8e4m3 => e4m3_to_f32(f32_to_e4m3(f)) as f64,
        DataType::Float8e5m2 => e5m2_to_f32(f32_to_e5m2(f)) as f64,
        DataType::Float32 => f as f64,
        DataType::Float64 => v,
        _ => unreachable!(),
    }
}

fn encode_float(dt: DataType, vals: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * dt.size());
    for &v in vals {
        let f = v as f32;
        match dt {
            DataType::Float16 => out.extend_from_slice(&f32_to_f16(f).to_le_bytes()),
            DataType::Bfloat16 => out.extend_from_slice(&f32_to_bf16(f).to_le_bytes()),
            DataType::Float8e4m3 => out.push(f32_to_e4m3(f)),
            DataType::Float8e5m2 => out.push(f32_to_e5m2(f)),
            DataType::Float32 => out.extend_from_slice(&f.to_le_bytes()),
            DataType::Float64 => out.extend_from_slice(&v.to_le_bytes()),
            _ => unreachable!(),
        }
    }
    out
}

fn decode_float(dt: DataType, b: &[u8]) -> Vec<f64> {
    b.chunks_exact(dt.size())
        .map(|c| match dt {
            DataType::Float16 => f16_to_f32(u16::from_le_bytes([c[0], c[1]])) as f64,
            DataType::Bfloat16 => bf16_to_f32(u16::from_le_bytes([c[0], c[1]])) as f64,
            DataType::Float8e4m3 => e4m3_to_f32(c[0]) as f64,
            DataType::Float8e5m2 => e5m2_to_f32(c[0]) as f64,
            DataType::Float32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
            DataType::Float64 => f64::from_le_bytes(c.try_into().unwrap()),
            _ => unreachable!(),
        })
        .collect()
}

fn encode_int(dt: DataType, vals: &[i128]) -> Vec<u8> {
    vals.iter()
        .flat_map(|v| v.to_le_bytes()[..dt.size()].to_vec())
        .collect()
}

fn decode_int(dt: DataType, b: &[u8]) -> Vec<i128> {
    b.chunks_exact(dt.size())
        .map(|c| {
            let mut w = [0u8; 16];
            w[..c.len()].copy_from_slice(c);
            wrap(dt, i128::from_le_bytes(w))
        })
        .collect()
}

/// Significand bits (implicit bit included) of the storage type.
fn precision(dt: DataType) -> i32 {
    match dt {
        DataType::Float16 => 11,
        DataType::Bfloat16 => 8,
        DataType::Float8e4m3 => 4,
        DataType::Float8e5m2 => 3,
        DataType::Float32 => 24,
        DataType::Float64 => 53,
        _ => unreachable!(),
    }
}

/// Smallest positive subnormal of the storage type.
fn tiny(dt: DataType) -> f64 {
    match dt {
        DataType::Float16 => 2f64.powi(-24),
        DataType::Bfloat16 | DataType::Float32 => 2f64.powi(-149),
        DataType::Float8e4m3 => 2f64.powi(-9),
        DataType::Float8e5m2 => 2f64.powi(-16),
        DataType::Float64 => 2f64.powi(-1074),
        _ => unreachable!(),
    }
}

/// The range float inputs are drawn from, so that no sum of 8 ranks times a
/// scalar of magnitude up to 2 saturates.
fn range(dt: DataType) -> f64 {
    match dt {
        DataType::Float8e4m3 => 16.0,
        DataType::Float8e5m2 | DataType::Float16 => 1024.0,
        DataType::Bfloat16 => 1e4,
        _ => 1e6,
    }
}

/// The ops tested for a type: the five built-ins and three pre-multiplied sums.
fn ops(dt: DataType) -> Vec<RedOp> {
    let mut v = RedOp::BUILTIN.to_vec();
    if dt.is_float() {
        for s in [0.5, -2.0, 0.3] {
            v.push(RedOp::PreMulSum(Scalar::F64(s)));
        }
    } else if dt.is_signed_int() {
        for s in [3, -1, -77] {
            v.push(RedOp::PreMulSum(Scalar::I64(s)));
        }
    } else {
        for s in [3, u64::MAX, 0x1_0000_0101] {
            v.push(RedOp::PreMulSum(Scalar::U64(s)));
        }
    }
    v
}

/// One rank's input of `len` elements.
fn gen_input(dt: DataType, op: RedOp, len: usize, rng: &mut Rng) -> Vec<u8> {
    if dt.is_float() {
        let vals: Vec<f64> = (0..len)
            .map(|_| {
                let v = if op == RedOp::Prod {
                    let m = 0.75 + 0.75 * rng.unit();
                    if rng.next() & 1 == 0 {
                        m
                    } else {
                        -m
                    }
                } else {
                    match rng.next() % 16 {
                        0 => 0.0,
                        1 => tiny(dt) * (rng.next() % 8) as f64,
                        _ => (2.0 * rng.unit() - 1.0) * range(dt),
                    }
                };
                round_to(dt, v)
            })
            .collect();
        encode_float(dt, &vals)
    } else {
        let vals: Vec<i128> = (0..len).map(|_| wrap(dt, rng.next() as i128)).collect();
        encode_int(dt, &vals)
    }
}

/// Reduces ranks `order` with a ring chain: `start` on the first, then
/// `accumulate` on each next, alternating in-place and out-of-place. The
/// finishing step is applied on the last step when `last`.
fn ring_chain(r: &Reduction, inputs: &[Vec<u8>], order: &[usize], last: bool) -> Vec<u8> {
    let len = inputs[0].len();
    let n = order.len();
    let mut acc = vec![0u8; len];
    if order[0] & 1 == 0 {
        r.start(&mut acc, &inputs[order[0]], last && n == 1);
    } else {
        acc.copy_from_slice(&inputs[order[0]]);
        r.start_in_place(&mut acc, last && n == 1);
    }
    for (i, &rank) in order.iter().enumerate().skip(1) {
        let is_last = last && i == n - 1;
        let mut out = vec![0u8; len];
        if i & 1 == 1 {
            r.accumulate(&mut out, &inputs[rank], &acc, is_last);
            // The executor's other path must give the same bits.
            let mut tmp = vec![0u8; len];
            let mut out2 = vec![0u8; len];
            r.start(&mut tmp, &inputs[rank], false);
            r.combine3(&mut out2, &tmp, &acc, is_last);
            assert_eq!(out, out2, "accumulate != start + combine3");
        } else {
            out.copy_from_slice(&inputs[rank]);
            r.accumulate_in_place(&mut out, &acc, is_last);
        }
        acc = out;
    }
    acc
}

/// Reduces with a two-level tree: two ring chains, combined at the end.
fn tree(r: &Reduction, inputs: &[Vec<u8>]) -> Vec<u8> {
    let n = inputs.len();
    if n == 1 {
        return ring_chain(r, inputs, &[0], true);
    }
    let h = n / 2;
    let left: Vec<usize> = (0..h).collect();
    let right: Vec<usize> = (h..n).rev().collect();
    let a = ring_chain(r, inputs, &left, false);
    let b = ring_chain(r, inputs, &right, false);
    let mut out = vec![0u8; a.len()];
    r.combine3(&mut out, &a, &b, true);
    let mut out2 = a.clone();
    r.combine(&mut out2, &b, true);
    assert_eq!(out, out2, "combine != combine3");
    out
}

/// Checks `got` against the reference of `op` over `inputs`.
fn check(dt: DataType, op: RedOp, inputs: &[Vec<u8>], got: &[u8], what: &str) {
    let n = inputs.len();
    if dt.is_float() {
        let cols: Vec<Vec<f64>> = inputs.iter().map(|b| decode_float(dt, b)).collect();
        let got = decode_float(dt, got);
        let u = 2f64.powi(-precision(dt))
            + if dt == DataType::Float64 {
                2f64.powi(-53)
            } else {
                2f64.powi(-24)
            };
        let m = (2 * n + 1) as i32;
        let growth = (1.0 + u).powi(m) - 1.0;
        for (i, g) in got.iter().enumerate() {
            let xs: Vec<f64> = cols.iter().map(|c| c[i]).collect();
            let want = reference_f64(op, &xs);
            let scale = match op {
                RedOp::Avg => 1.0 / n as f64,
                RedOp::PreMulSum(s) => s.as_f64().abs(),
                _ => 1.0,
            };
            let tol = match op {
                RedOp::Max | RedOp::Min => 0.0,
                RedOp::Prod => want.abs() * growth + m as f64 * tiny(dt),
                _ => {
                    xs.iter().map(|x| (x * scale).abs()).sum::<f64>() * growth + m as f64 * tiny(dt)
                }
            };
            assert!(
                (g - want).abs() <= tol,
                "{what}: {dt} {op} n={n} element {i}: got {g}, want {want} (tol {tol}), inputs {xs:?}"
            );
        }
    } else {
        let cols: Vec<Vec<i128>> = inputs.iter().map(|b| decode_int(dt, b)).collect();
        let got = decode_int(dt, got);
        for (i, &g) in got.iter().enumerate() {
            let xs: Vec<i128> = cols.iter().map(|c| c[i]).collect();
            let sum = |s: i128| {
                xs.iter()
                    .fold(0i128, |a, &x| wrap(dt, a + wrap(dt, x.wrapping_mul(s))))
            };
            let want = match op {
                RedOp::Sum => sum(1),
                RedOp::Prod => xs.iter().fold(1i128, |a, &x| wrap(dt, a.wrapping_mul(x))),
                RedOp::Max => *xs.iter().max().unwrap(),
                RedOp::Min => *xs.iter().min().unwrap(),
                RedOp::Avg => sum(1) / n as i128,
                RedOp::PreMulSum(s) => sum(wrap(dt, s.as_u64_bits() as i128)),
            };
            assert_eq!(
                g, want,
                "{what}: {dt} {op} n={n} element {i}, inputs {xs:?}"
            );
        }
    }
}

/// Runs one case: generates inputs, reduces in ring order from every start
/// rank's point of view (one rotation chosen by the seed) and as a tree.
fn run_case(dt: DataType, op: RedOp, n: usize, len: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let r = Reduction::new(dt, op, n).unwrap();
    assert_eq!(r.dtype(), dt);
    let inputs: Vec<Vec<u8>> = (0..n).map(|_| gen_input(dt, op, len, &mut rng)).collect();
    let first = (rng.next() % n as u64) as usize;
    let order: Vec<usize> = (0..n).map(|i| (first + i) % n).collect();
    let ring = ring_chain(&r, &inputs, &order, true);
    check(dt, op, &inputs, &ring, "ring");
    let t = tree(&r, &inputs);
    check(dt, op, &inputs, &t, "tree");
}

#[test]
fn every_type_op_and_rank_count() {
    let mut seed = 1;
    for dt in DataType::ALL {
        for op in ops(dt) {
            for n in 1..=8 {
                for len in [0, 1, 2, 3, 5, 7, 13, 31, 67] {
                    seed += 1;
                    run_case(dt, op, n, len, seed);
                }
            }
        }
    }
}

fn any_dtype() -> impl Strategy<Value = DataType> {
    (0..DataType::ALL.len()).prop_map(|i| DataType::ALL[i])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random type, op, rank count and length (primes and a few thousand).
    #[test]
    fn random_cases(
        dt in any_dtype(),
        op_i in 0usize..8,
        n in 1usize..=8,
        len in prop_oneof![Just(0usize), Just(1), Just(17), Just(509), Just(1021), Just(4099), 0usize..3000],
        seed in any::<u64>(),
    ) {
        let op = ops(dt)[op_i];
        run_case(dt, op, n, len, seed);
    }

    /// Arbitrary bit patterns (NaN, inf, subnormals, ±0 included): the paths an
    /// executor may take give identical bits, whatever the values.
    #[test]
    fn paths_agree_bitwise(dt in any_dtype(), op_i in 0usize..8, n in 1usize..=8, len in 0usize..200, seed in any::<u64>()) {
        let op = ops(dt)[op_i];
        let r = Reduction::new(dt, op, n).unwrap();
        let mut rng = Rng::new(seed);
        let bytes = len * dt.size();
        let mut gen = || (0..bytes).map(|_| rng.next() as u8).collect::<Vec<u8>>();
        let (local, acc) = (gen(), gen());
        for last in [false, true] {
            let mut out = vec![0u8; bytes];
            r.accumulate(&mut out, &local, &acc, last);
            let mut tmp = vec![0u8; bytes];
            r.start(&mut tmp, &local, false);
            let mut out2 = vec![0u8; bytes];
            r.combine3(&mut out2, &tmp, &acc, last);
            prop_assert_eq!(&out, &out2);
            let mut inpl = local.clone();
            r.accumulate_in_place(&mut inpl, &acc, last);
            prop_assert_eq!(&out, &inpl);
            let mut c = tmp.clone();
            r.combine(&mut c, &acc, last);
            prop_assert_eq!(&out, &c);
            let mut s1 = vec![0u8; bytes];
            r.start(&mut s1, &local, last);
            let mut s2 = local.clone();
            r.start_in_place(&mut s2, last);
            prop_assert_eq!(&s1, &s2);
        }
    }
}

// ---- conversions ----

/// The value of a narrow pattern with `ebits`/`mbits`, from the definition.
fn narrow_value(v: u32, ebits: u32, mbits: u32, bias: i32) -> f64 {
    let sign = if v >> (ebits + mbits) & 1 == 1 {
        -1.0
    } else {
        1.0
    };
    let e = (v >> mbits) & ((1 << ebits) - 1);
    let m = (v & ((1 << mbits) - 1)) as f64;
    let scale = 2f64.powi(mbits as i32);
    if e == 0 {
        sign * m / scale * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + m / scale) * 2f64.powi(e as i32 - bias)
    }
}

#[test]
fn f16_every_pattern_decodes_and_round_trips() {
    for h in 0..=u16::MAX {
        let f = f16_to_f32(h);
        let e = (h >> 10) & 0x1f;
        if e == 0x1f {
            if h & 0x3ff == 0 {
                assert!(f.is_infinite() && f.is_sign_negative() == (h >> 15 == 1));
                assert_eq!(f32_to_f16(f), h);
            } else {
                assert!(f.is_nan());
                let back = f32_to_f16(f);
                assert!(f16_to_f32(back).is_nan() && back & 0x8000 == h & 0x8000);
                assert_ne!(back & 0x0200, 0, "NaN encodes quiet");
            }
        } else {
            assert_eq!(f as f64, narrow_value(h as u32, 5, 10, 15), "{h:#06x}");
            assert_eq!(f32_to_f16(f), h, "{h:#06x}");
        }
    }
}

#[test]
fn bf16_every_pattern_round_trips() {
    for b in 0..=u16::MAX {
        let f = bf16_to_f32(b);
        assert_eq!(f.to_bits(), (b as u32) << 16);
        let back = f32_to_bf16(f);
        if f.is_nan() {
            assert!(bf16_to_f32(back).is_nan() && back & 0x8000 == b & 0x8000);
            assert_ne!(back & 0x0040, 0);
        } else {
            assert_eq!(back, b, "{b:#06x}");
        }
    }
}

#[test]
fn fp8_every_pattern_decodes_and_round_trips() {
    for v in 0..=u8::MAX {
        // e4m3: S.1111.111 is NaN, everything else finite.
        let f = e4m3_to_f32(v);
        if v & 0x7f == 0x7f {
            assert!(f.is_nan());
            assert_eq!(f32_to_e4m3(f), v);
        } else {
            assert_eq!(f as f64, narrow_value(v as u32, 4, 3, 7), "e4m3 {v:#04x}");
            assert_eq!(f32_to_e4m3(f), v, "e4m3 {v:#04x}");
        }
        // e5m2: S.11111.00 is inf, S.11111.xx NaN.
        let f = e5m2_to_f32(v);
        if v & 0x7c == 0x7c {
            if v & 3 == 0 {
                assert!(f.is_infinite());
                // Saturating encode: inf becomes the largest finite value.
                assert_eq!(f32_to_e5m2(f), (v & 0x80) | 0x7b);
            } else {
                assert!(f.is_nan());
                assert_eq!(f32_to_e5m2(f), (v & 0x80) | 0x7f);
            }
        } else {
            assert_eq!(f as f64, narrow_value(v as u32, 5, 2, 15), "e5m2 {v:#04x}");
            assert_eq!(f32_to_e5m2(f), v, "e5m2 {v:#04x}");
        }
    }
}

fn next_up(f: f32) -> f32 {
    f32::from_bits(f.to_bits() + 1)
}
fn next_down(f: f32) -> f32 {
    f32::from_bits(f.to_bits() - 1)
}

/// For every pair of adjacent positive patterns `k`, `k + 1` (up to `top`),
/// the midpoint rounds to the even one and the f32s either side of it to the
/// nearer one; the same for the negated values.
fn check_halfway(top: u32, sign: u32, dec: impl Fn(u32) -> f32, enc: impl Fn(f32) -> u32) {
    for k in 0..top {
        let (lo, hi) = (dec(k), dec(k + 1));
        let mid = ((lo as f64 + hi as f64) / 2.0) as f32;
        assert_eq!(
            mid as f64,
            (lo as f64 + hi as f64) / 2.0,
            "midpoint exact in f32"
        );
        let even = if k & 1 == 0 { k } else { k + 1 };
        assert_eq!(enc(mid), even, "halfway between {lo} and {hi}");
        assert_eq!(enc(next_down(mid)), k, "just below halfway {lo}..{hi}");
        assert_eq!(enc(next_up(mid)), k + 1, "just above halfway {lo}..{hi}");
        assert_eq!(enc(-mid), sign | even);
        assert_eq!(enc(-next_up(mid)), sign | (k + 1));
    }
}

#[test]
fn round_to_nearest_even_at_every_halfway_point() {
    // Up to the largest finite value and, for f16 and bf16, the step to inf.
    check_halfway(
        0x7c00 - 1,
        0x8000,
        |k| f16_to_f32(k as u16),
        |f| f32_to_f16(f) as u32,
    );
    check_halfway(
        0x7f80 - 1,
        0x8000,
        |k| bf16_to_f32(k as u16),
        |f| f32_to_bf16(f) as u32,
    );
    check_halfway(
        0x7e,
        0x80,
        |k| e4m3_to_f32(k as u8),
        |f| f32_to_e4m3(f) as u32,
    );
    check_halfway(
        0x7b,
        0x80,
        |k| e5m2_to_f32(k as u8),
        |f| f32_to_e5m2(f) as u32,
    );
    // A few by hand.
    assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00); // tie, to even
    assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02); // tie, to even (up)
    assert_eq!(f32_to_f16(2f32.powi(-25)), 0x0000); // half the smallest subnormal
    assert_eq!(f32_to_f16(next_up(2f32.powi(-25))), 0x0001);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
    assert_eq!(f32_to_e4m3(2f32.powi(-10)), 0x00);
    assert_eq!(f32_to_e4m3(3.0 * 2f32.powi(-10)), 0x02);
}

#[test]
fn overflow_and_saturation() {
    // float16: overflow to inf from 65520 (the tie above 65504 goes to even = inf).
    assert_eq!(f32_to_f16(65504.0), 0x7bff);
    assert_eq!(f32_to_f16(next_down(65520.0)), 0x7bff);
    assert_eq!(f32_to_f16(65520.0), 0x7c00);
    assert_eq!(f32_to_f16(1e30), 0x7c00);
    assert_eq!(f32_to_f16(-1e30), 0xfc00);
    assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
    // bfloat16: overflow to inf.
    assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
    assert_eq!(f32_to_bf16(-f32::INFINITY), 0xff80);
    // e4m3: saturates to ±448 (SATFINITE), inf included; NaN stays NaN.
    for x in [448.0, 463.9, 464.0, 480.0, 1e6, f32::MAX, f32::INFINITY] {
        assert_eq!(f32_to_e4m3(x), 0x7e, "{x}");
        assert_eq!(f32_to_e4m3(-x), 0xfe, "{x}");
    }
    assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
    assert_eq!(f32_to_e4m3(-f32::NAN), 0xff);
    // e5m2: saturates to ±57344, inf included; NaN stays NaN.
    for x in [57344.0, 61439.0, 61440.0, 65536.0, 1e9, f32::INFINITY] {
        assert_eq!(f32_to_e5m2(x), 0x7b, "{x}");
        assert_eq!(f32_to_e5m2(-x), 0xfb, "{x}");
    }
    assert!(e5m2_to_f32(f32_to_e5m2(f32::NAN)).is_nan());
    // Quiet NaN with payload kept where the format can.
    assert_eq!(f32_to_f16(f32::from_bits(0x7f80_0001)) & 0x7e00, 0x7e00);
    assert_eq!(f32_to_bf16(f32::from_bits(0xff80_0001)), 0xffc0);
}

/// A reduction that saturates in fp8 and overflows in f16, end to end.
#[test]
fn reductions_saturate_like_the_conversions() {
    let r = Reduction::new(DataType::Float8e4m3, RedOp::Sum, 2).unwrap();
    let (a, b) = ([f32_to_e4m3(448.0)], [f32_to_e4m3(448.0)]);
    let mut out = [0u8];
    r.combine3(&mut out, &a, &b, true);
    assert_eq!(out, [0x7e]);
    let r = Reduction::new(DataType::Float16, RedOp::Sum, 2).unwrap();
    let h = f32_to_f16(60000.0).to_le_bytes();
    let mut out = [0u8; 2];
    r.combine3(&mut out, &h, &h, true);
    assert_eq!(u16::from_le_bytes(out), 0x7c00);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any finite f32 in range encodes to a value at least as near as either
    /// neighbour of it.
    #[test]
    fn encoders_pick_the_nearest(x in -60000f32..60000f32) {
        let near = |got: f64, nb: [f64; 2]| nb.iter().all(|v| (got - x as f64).abs() <= (v - x as f64).abs());
        let h = f32_to_f16(x);
        prop_assert!(near(f16_to_f32(h) as f64, [f16_to_f32(h.wrapping_add(1)) as f64, f16_to_f32(h.wrapping_sub(1)) as f64]));
        let b = f32_to_bf16(x);
        prop_assert!(near(bf16_to_f32(b) as f64, [bf16_to_f32(b.wrapping_add(1)) as f64, bf16_to_f32(b.wrapping_sub(1)) as f64]));
        let e = f32_to_e5m2(x);
        if e & 0x7f != 0 && e & 0x7f < 0x7b {
            prop_assert!(near(e5m2_to_f32(e) as f64, [e5m2_to_f32(e + 1) as f64, e5m2_to_f32(e - 1) as f64]));
        }
        let y = x / 128.0;
        let e = f32_to_e4m3(y);
        if e & 0x7f != 0 && e & 0x7f < 0x7e {
            let near = |got: f64, nb: [f64; 2]| nb.iter().all(|v| (got - y as f64).abs() <= (v - y as f64).abs());
            prop_assert!(near(e4m3_to_f32(e) as f64, [e4m3_to_f32(e + 1) as f64, e4m3_to_f32(e - 1) as f64]));
        }
    }
}
