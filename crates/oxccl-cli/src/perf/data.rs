//! Check data: inputs made from (seed, rank, index) whose reduction over the
//! ranks is exactly predictable whatever order the library reduces in, the
//! expected results, and element-wise comparison.
//!
//! Every value is a small integer that the type represents exactly and every
//! partial result stays inside the type's exact-integer range `L` (float16
//! 2048, bfloat16 256, e4m3 16, e5m2 8, float 2^24, double 2^53, integers
//! their positive range), so any association of the reduction gives the same
//! bits:
//!
//! - sum: values in `[-K, K]` (`[0, K]` unsigned) with `K = L / A`, where `A`
//!   is the number of ranks that contribute a non-zero value to the element
//!   (all ranks while `n <= L`).
//! - prod: ±1 and ±2, with at most `log2 L` twos per element.
//! - max, min and the non-reducing collectives: any value in `[-L, L]`.
//! - avg on integers: values in `[0, K]`; the expected result is the exact
//!   sum divided by `n`, truncated (oxccl's and NCCL's sum-then-divide).
//! - avg on floats: one rank per element contributes `n * y`, the others 0;
//!   floats pre-multiply by `1/n`, so the result is `y` up to the rounding of
//!   `1/n`, and the comparison allows 2 ULP (as nccl-tests does for avg).
//!
//! Output buffers are filled with a value no generator produces (NaN for
//! floats, the most negative value for signed and all ones for unsigned
//! integers) before each checked call, so an element the call forgot to
//! write is counted as wrong.

use oxccl::{DataType, RedOp};
use oxccl_core::float;

/// The exact-integer limit `L` of a type (see the module docs). Unsigned 8-
/// and 32-bit types stop one short of all ones, the poison value.
pub fn limit(dt: DataType) -> i64 {
    match dt {
        DataType::Int8 => 127,
        DataType::Uint8 => 254,
        DataType::Int32 => i32::MAX as i64,
        DataType::Uint32 => u32::MAX as i64 - 1,
        DataType::Int64 | DataType::Uint64 => 1 << 62,
        DataType::Float16 => 2048,
        DataType::Bfloat16 => 256,
        DataType::Float8e4m3 => 16,
        DataType::Float8e5m2 => 8,
        DataType::Float32 => 1 << 24,
        DataType::Float64 => 1 << 53,
    }
}

fn has_negatives(dt: DataType) -> bool {
    dt.is_float() || dt.is_signed_int()
}

/// The bits of the exact integer `v` in `dt` (in the low `8 * size` bits).
pub fn encode(dt: DataType, v: i64) -> u64 {
    match dt {
        DataType::Int8 => v as i8 as u8 as u64,
        DataType::Uint8 => v as u8 as u64,
        DataType::Int32 => v as i32 as u32 as u64,
        DataType::Uint32 => v as u32 as u64,
        DataType::Int64 | DataType::Uint64 => v as u64,
        DataType::Float16 => float::f32_to_f16(v as f32) as u64,
        DataType::Bfloat16 => float::f32_to_bf16(v as f32) as u64,
        DataType::Float8e4m3 => float::f32_to_e4m3(v as f32) as u64,
        DataType::Float8e5m2 => float::f32_to_e5m2(v as f32) as u64,
        DataType::Float32 => (v as f32).to_bits() as u64,
        DataType::Float64 => (v as f64).to_bits(),
    }
}

/// The fill of output buffers: a pattern no generator produces.
pub fn poison(dt: DataType) -> u64 {
    let bits = dt.size() * 8;
    if dt.is_signed_int() {
        1u64 << (bits - 1)
    } else if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The generator of one checked call: type, op (None for the collectives that
/// do not reduce), rank count and seed.
#[derive(Clone, Copy, Debug)]
pub struct Gen {
    pub dt: DataType,
    pub op: Option<RedOp>,
    pub n: usize,
    pub seed: u64,
    lim: i64,
    /// Ranks that contribute non-zero values to one element (sum and integer avg).
    active: usize,
    /// Twos allowed per element (prod).
    twos: usize,
}

impl Gen {
    pub fn new(dt: DataType, op: Option<RedOp>, n: usize, seed: u64) -> Gen {
        let lim = limit(dt);
        let active = n.min(lim as usize).max(1);
        let twos = (63 - lim.leading_zeros()) as usize;
        Gen {
            dt,
            op,
            n,
            seed,
            lim,
            active,
            twos,
        }
    }

    fn hash(&self, r: usize, i: usize) -> u64 {
        splitmix(
            splitmix(self.seed ^ ((r as u64) << 40)).wrapping_add(i as u64) ^ 0x5a5a_0f0f_3c3c_9696,
        )
    }

    fn in_range(&self, h: u64, k: i64) -> i64 {
        let k = k.max(0) as u64;
        if has_negatives(self.dt) {
            (h % (2 * k + 1)) as i64 - k as i64
        } else {
            (h % (k + 1)) as i64
        }
    }

    fn is_active(&self, r: usize, i: usize) -> bool {
        self.active >= self.n || (r + i) % self.n < self.active
    }

    /// Rank `r`'s input element `i`.
    pub fn value(&self, r: usize, i: usize) -> i64 {
        let h = self.hash(r, i);
        match self.op {
            None | Some(RedOp::Max) | Some(RedOp::Min) | Some(RedOp::PreMulSum(_)) => {
                self.in_range(h, self.lim)
            }
            Some(RedOp::Sum) => {
                if self.is_active(r, i) {
                    self.in_range(h, self.lim / self.active as i64)
                } else {
                    0
                }
            }
            Some(RedOp::Prod) => {
                let two = (r + i) % self.n < self.twos && h & 1 == 1;
                let m = if two { 2 } else { 1 };
                if has_negatives(self.dt) && h & 2 == 2 {
                    -m
                } else {
                    m
                }
            }
            Some(RedOp::Avg) if self.dt.is_float() => {
                let c = (i + self.seed as usize) % self.n;
                if r == c {
                    let k = self.lim / self.n as i64;
                    self.n as i64 * ((h >> 8) % (k as u64 + 1)) as i64
                } else {
                    0
                }
            }
            Some(RedOp::Avg) => {
                if self.is_active(r, i) {
                    ((h >> 8) % ((self.lim / self.active as i64) as u64 + 1)) as i64
                } else {
                    0
                }
            }
        }
    }

    /// The reduction over all ranks of element `i` (only for reducing generators).
    pub fn reduced(&self, i: usize) -> i64 {
        let vals = (0..self.n).map(|r| self.value(r, i) as i128);
        let v: i128 = match self.op {
            Some(RedOp::Prod) => vals.product(),
            Some(RedOp::Max) => vals.max().unwrap_or(0),
            Some(RedOp::Min) => vals.min().unwrap_or(0),
            Some(RedOp::Avg) => vals.sum::<i128>() / self.n as i128,
            _ => vals.sum(),
        };
        v as i64
    }

    /// ULPs of difference accepted (2 for float avg, else exact bits).
    pub fn tolerance(&self) -> u64 {
        if self.op == Some(RedOp::Avg) && self.dt.is_float() {
            2
        } else {
            0
        }
    }
}

/// Writes `count` elements from element `start` of `buf`: element `start + k`
/// gets the low bits of `f(k)`.
pub fn write(buf: &mut [u8], dt: DataType, start: usize, count: usize, f: impl Fn(usize) -> u64) {
    let es = dt.size();
    let region = &mut buf[start * es..(start + count) * es];
    match es {
        1 => region
            .iter_mut()
            .enumerate()
            .for_each(|(k, b)| *b = f(k) as u8),
        2 => region
            .chunks_exact_mut(2)
            .enumerate()
            .for_each(|(k, c)| c.copy_from_slice(&(f(k) as u16).to_le_bytes())),
        4 => region
            .chunks_exact_mut(4)
            .enumerate()
            .for_each(|(k, c)| c.copy_from_slice(&(f(k) as u32).to_le_bytes())),
        _ => region
            .chunks_exact_mut(8)
            .enumerate()
            .for_each(|(k, c)| c.copy_from_slice(&f(k).to_le_bytes())),
    }
}

/// Fills `count` elements from `start` with the poison pattern.
pub fn write_poison(buf: &mut [u8], dt: DataType, start: usize, count: usize) {
    let p = poison(dt);
    write(buf, dt, start, count, |_| p);
}

/// Sign-magnitude bits to an ordered integer (for ULP distances).
fn ordered(bits: u64, width: usize) -> i128 {
    let sign = 1u64 << (width * 8 - 1);
    if bits & sign != 0 {
        -((bits & !sign) as i128)
    } else {
        bits as i128
    }
}

/// Counts the elements from `start` (of `count`) whose bits differ from
/// `want(k)`, allowing `tol` ULPs for floats when `tol > 0`.
pub fn count_wrong(
    buf: &[u8],
    dt: DataType,
    start: usize,
    count: usize,
    tol: u64,
    want: impl Fn(usize) -> u64,
) -> u64 {
    let es = dt.size();
    let region = &buf[start * es..(start + count) * es];
    let mut wrong = 0u64;
    for (k, c) in region.chunks_exact(es).enumerate() {
        let mut b = [0u8; 8];
        b[..es].copy_from_slice(c);
        let got = u64::from_le_bytes(b);
        let exp = want(k);
        let ok = if tol == 0 {
            got == exp
        } else {
            (ordered(got, es) - ordered(exp, es)).unsigned_abs() <= tol as u128
        };
        wrong += u64::from(!ok);
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(dt: DataType, bits: u64) -> f64 {
        match dt {
            DataType::Float16 => float::f16_to_f32(bits as u16) as f64,
            DataType::Bfloat16 => float::bf16_to_f32(bits as u16) as f64,
            DataType::Float8e4m3 => float::e4m3_to_f32(bits as u8) as f64,
            DataType::Float8e5m2 => float::e5m2_to_f32(bits as u8) as f64,
            DataType::Float32 => f32::from_bits(bits as u32) as f64,
            DataType::Float64 => f64::from_bits(bits),
            _ => unreachable!(),
        }
    }

    #[test]
    fn float_values_and_partial_results_are_exact() {
        for dt in DataType::ALL.into_iter().filter(|d| d.is_float()) {
            for n in [1, 2, 3, 4, 7, 8, 16] {
                for op in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg] {
                    let g = Gen::new(dt, Some(op), n, 3);
                    for i in 0..200 {
                        let mut partial: i128 = if op == RedOp::Prod { 1 } else { 0 };
                        for r in 0..n {
                            let v = g.value(r, i);
                            assert_eq!(decode(dt, encode(dt, v)), v as f64, "{dt} {op} {v}");
                            match op {
                                RedOp::Sum | RedOp::Avg => partial += v as i128,
                                RedOp::Prod => partial *= v as i128,
                                _ => {}
                            }
                            assert!(
                                partial.unsigned_abs() <= limit(dt) as u128,
                                "{dt} {op} n={n}"
                            );
                        }
                        let e = g.reduced(i);
                        assert_eq!(decode(dt, encode(dt, e)), e as f64);
                    }
                }
            }
        }
    }

    #[test]
    fn integer_values_fit() {
        for dt in DataType::ALL.into_iter().filter(|d| !d.is_float()) {
            for n in [2, 3, 8] {
                for op in [RedOp::Sum, RedOp::Prod, RedOp::Avg] {
                    let g = Gen::new(dt, Some(op), n, 1);
                    for i in 0..100 {
                        let e = g.reduced(i) as i128;
                        assert!(e.unsigned_abs() <= limit(dt) as u128);
                        assert_ne!(encode(dt, e as i64), poison(dt));
                    }
                }
            }
        }
    }

    #[test]
    fn compare_counts_and_tolerates() {
        let dt = DataType::Float32;
        let mut buf = vec![0u8; 16];
        write(&mut buf, dt, 0, 4, |k| (k as f32).to_bits() as u64);
        assert_eq!(
            count_wrong(&buf, dt, 0, 4, 0, |k| (k as f32).to_bits() as u64),
            0
        );
        assert_eq!(
            count_wrong(&buf, dt, 1, 3, 0, |k| (k as f32).to_bits() as u64),
            3
        );
        let one = 1f32.to_bits() as u64;
        write(&mut buf, dt, 0, 1, |_| one + 2);
        assert_eq!(count_wrong(&buf, dt, 0, 1, 2, |_| one), 0);
        assert_eq!(count_wrong(&buf, dt, 0, 1, 1, |_| one), 1);
        write_poison(&mut buf, DataType::Int32, 0, 1);
        assert_eq!(&buf[..4], &[0, 0, 0, 0x80]);
    }
}
