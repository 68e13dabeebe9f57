//! Conversions between `f32` and the narrow floating types NCCL reduces:
//! IEEE binary16 (`float16`), bfloat16, and the two OCP FP8 formats
//! (`e4m3`, the "fn" variant, and `e5m2`).
//!
//! All conversions are bit arithmetic on `u32` plus (for the subnormal range)
//! one `f32` addition or subtraction, written without branches (the `if`s are
//! value selects) so that the reduction loops that call them vectorise at the
//! x86-64 SSE2 baseline. The fp8 decoders are arithmetic too, not a table
//! lookup (SSE2 cannot gather); the tests check them against a 256-entry table
//! built by a `const fn` from the formats' definitions.
//!
//! Decoding is exact for every bit pattern. Encoding rounds to nearest, ties to
//! even, and treats out-of-range values and NaN as follows:
//!
//! | type     | above the largest finite value (±inf included)   | NaN                                   |
//! |----------|--------------------------------------------------|---------------------------------------|
//! | float16  | ±inf (values from 65520 up, the rounding boundary) | quiet NaN, sign and top payload bits kept |
//! | bfloat16 | ±inf (by rounding, as IEEE)                      | quiet NaN, sign and top payload bits kept |
//! | fp8 e4m3 | saturates to ±448 (`S.1111.110`)                 | `S.1111.111` (the only NaN of e4m3)   |
//! | fp8 e5m2 | saturates to ±57344 (`S.11110.11`)               | `S.11111.11`                          |
//!
//! The fp8 encoders follow NVIDIA's `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ..)`:
//! a value whose magnitude exceeds the largest finite value (infinity
//! included) becomes the largest finite value of the same sign, and NaN stays
//! NaN. So an e5m2 encode never produces an infinity, although the e5m2
//! infinity patterns (`0x7c`, `0xfc`) decode to ±inf.

/// Decodes an IEEE binary16 value (exact; NaN payloads are kept).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    decode_narrow(h as u32, &F16)
}

/// Decodes a bfloat16 value (exact: the top half of an f32).
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// The parameters of a narrow format for the shared encoder.
struct Narrow {
    /// Mantissa bits of the narrow format.
    mbits: u32,
    /// 127 minus the narrow exponent bias, i.e. what to subtract from an f32 exponent.
    rebias: u32,
    /// Bits of the f32 magnitude that values are clamped to before rounding.
    sat: u32,
    /// The narrow magnitude (sign excluded) that NaN encodes to, before the quiet payload.
    nan: u32,
    /// Whether the NaN payload's top mantissa bits are kept (IEEE-like formats).
    keep_payload: bool,
    /// IEEE-like specials (all-ones exponent is inf or NaN); otherwise only the
    /// all-ones pattern is NaN and there is no infinity (e4m3 "fn").
    has_inf: bool,
    /// Total width of the narrow format in bits (sign included).
    width: u32,
}

/// Narrow pattern (in the low `width` bits) -> f32, exact. Branch-free (selects only).
#[inline(always)]
fn decode_narrow(v: u32, p: &Narrow) -> f32 {
    let shift = 23 - p.mbits;
    let sign = ((v >> (p.width - 1)) & 1) << 31;
    let em = v & ((1 << (p.width - 1)) - 1);
    // Normal numbers: move exponent and mantissa up and re-bias.
    let normal = (em << shift) + (p.rebias << 23);
    // Zero and subnormals: em * step, computed exactly as
    // (min_normal + em * step) - min_normal in f32.
    let min_normal = (p.rebias + 1) << 23;
    let sub = (f32::from_bits(min_normal | (em << shift)) - f32::from_bits(min_normal)).to_bits();
    let mag = if em < (1 << p.mbits) { sub } else { normal };
    let max_em = (1 << (p.width - 1)) - 1;
    let mag = if p.has_inf {
        // All-ones exponent: infinity or NaN, payload kept.
        let exp_ones = max_em & !((1 << p.mbits) - 1);
        if em >= exp_ones {
            (em << shift) | 0x7f80_0000
        } else {
            mag
        }
    } else if em == max_em {
        0x7fc0_0000
    } else {
        mag
    };
    f32::from_bits(sign | mag)
}

/// f32 -> narrow magnitude with sign, round to nearest even, as a u32 holding
/// `width` bits. Branch-free (selects only).
#[inline(always)]
fn encode_narrow(x: f32, p: &Narrow) -> u32 {
    let bits = x.to_bits();
    let sign = (bits >> 31) << (p.width - 1);
    let a = bits & 0x7fff_ffff;
    let is_nan = a > 0x7f80_0000;
    let c = if a > p.sat { p.sat } else { a };
    let shift = 23 - p.mbits;
    // Normal range: re-bias the exponent, then round the dropped `shift` bits to
    // nearest even; a carry out of the mantissa correctly bumps the exponent.
    let r = c.wrapping_sub(p.rebias << 23);
    let normal = (r
        .wrapping_add((1 << (shift - 1)) - 1)
        .wrapping_add((r >> shift) & 1))
        >> shift;
    // Subnormal range: adding 2^(emin_sub + 23) makes the f32 adder round the
    // value to a multiple of the narrow format's smallest subnormal (ties to
    // even); the low mantissa bits of the sum are then the narrow encoding.
    // The narrow minimum normal exponent is 1 - bias = 1 + rebias - 127, the
    // subnormal step 2^(1 + rebias - 127 - mbits); the magic number is that
    // step times 2^23, i.e. exponent field (1 + rebias - mbits + 23).
    let magic_bits = (1 + p.rebias - p.mbits + 23) << 23;
    let sub = (f32::from_bits(c) + f32::from_bits(magic_bits))
        .to_bits()
        .wrapping_sub(magic_bits);
    let min_normal = (p.rebias + 1) << 23;
    let mag = if c < min_normal { sub } else { normal };
    let nan = if p.keep_payload {
        p.nan | ((a >> shift) & ((1 << p.mbits) - 1))
    } else {
        p.nan
    };
    let mag = if is_nan { nan } else { mag };
    sign | mag
}

const F16: Narrow = Narrow {
    mbits: 10,
    rebias: 112,
    // 65536.0: every value from 65520 (the halfway point above 65504) up rounds to inf.
    sat: 0x4780_0000,
    nan: 0x7e00,
    keep_payload: true,
    has_inf: true,
    width: 16,
};

const E4M3: Narrow = Narrow {
    mbits: 3,
    rebias: 120,
    // 448.0 = 1.75 * 2^8, the largest finite e4m3.
    sat: 0x43e0_0000,
    nan: 0x7f,
    keep_payload: false,
    has_inf: false,
    width: 8,
};

const E5M2: Narrow = Narrow {
    mbits: 2,
    rebias: 112,
    // 57344.0 = 1.75 * 2^15, the largest finite e5m2.
    sat: 0x4760_0000,
    nan: 0x7f,
    keep_payload: false,
    has_inf: true,
    width: 8,
};

/// Encodes an f32 as IEEE binary16: round to nearest even, overflow to ±inf,
/// NaN to a quiet NaN with the sign and the top 10 payload bits kept.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    encode_narrow(x, &F16) as u16
}

/// Encodes an f32 as bfloat16: round to nearest even (overflow to ±inf as IEEE
/// rounding gives), NaN to a quiet NaN with the sign and top payload bits kept.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff).wrapping_add((bits >> 16) & 1) >> 16;
    let nan = (bits >> 16) | 0x0040;
    let is_nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
    (if is_nan { nan } else { rounded }) as u16
}

/// Encodes an f32 as OCP fp8 e4m3 ("fn": no infinities), round to nearest even,
/// with NVIDIA's `__NV_SATFINITE` behaviour: magnitudes above 448 (±inf
/// included) become ±448, NaN becomes `S.1111.111`.
#[inline(always)]
pub fn f32_to_e4m3(x: f32) -> u8 {
    encode_narrow(x, &E4M3) as u8
}

/// Encodes an f32 as OCP fp8 e5m2, round to nearest even, with NVIDIA's
/// `__NV_SATFINITE` behaviour: magnitudes above 57344 (±inf included) become
/// ±57344 (never an infinity), NaN becomes `S.11111.11`.
#[inline(always)]
pub fn f32_to_e5m2(x: f32) -> u8 {
    encode_narrow(x, &E5M2) as u8
}

/// Decodes an fp8 e4m3 value (exact; `S.1111.111` is NaN, there is no infinity).
#[inline(always)]
pub fn e4m3_to_f32(v: u8) -> f32 {
    decode_narrow(v as u32, &E4M3)
}

/// Decodes an fp8 e5m2 value (exact; `S.11111.00` is ±inf, `S.11111.xx` NaN).
#[inline(always)]
pub fn e5m2_to_f32(v: u8) -> f32 {
    decode_narrow(v as u32, &E5M2)
}

/// An independent decoder for the tests: every fp8 pattern decoded from the
/// format's definition into a 256-entry table at compile time.
#[cfg(test)]
mod table {
    /// Decodes one fp8 pattern with `mbits` mantissa bits and exponent bias `bias`
    /// (used at compile time to build the tables).
    const fn decode_fp8(v: u8, mbits: u32, bias: i32, has_inf: bool) -> f32 {
        let sign = ((v as u32) >> 7) << 31;
        let ebits = 7 - mbits;
        let e = ((v as u32) >> mbits) & ((1 << ebits) - 1);
        let m = (v as u32) & ((1 << mbits) - 1);
        let emax = (1 << ebits) - 1;
        let mag = if e == emax && (has_inf || m == (1 << mbits) - 1) {
            if has_inf && m == 0 {
                0x7f80_0000
            } else {
                0x7fc0_0000
            }
        } else if e == 0 {
            if m == 0 {
                0
            } else {
                // m * 2^(1 - bias - mbits): normalise m into an f32.
                let mut exp = 1 - bias - mbits as i32;
                let mut mm = m;
                while mm & (1 << mbits) == 0 {
                    mm <<= 1;
                    exp -= 1;
                }
                // Now mm = 1.xxx * 2^mbits, value = 1.xxx * 2^(exp + mbits).
                let fexp = (exp + mbits as i32 + 127) as u32;
                (fexp << 23) | ((mm & ((1 << mbits) - 1)) << (23 - mbits))
            }
        } else {
            let fexp = (e as i32 - bias + 127) as u32;
            (fexp << 23) | (m << (23 - mbits))
        };
        f32::from_bits(sign | mag)
    }

    const fn fp8_table(mbits: u32, bias: i32, has_inf: bool) -> [f32; 256] {
        let mut t = [0.0f32; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = decode_fp8(i as u8, mbits, bias, has_inf);
            i += 1;
        }
        t
    }

    /// Every e4m3 pattern decoded.
    pub(super) static E4M3_TABLE: [f32; 256] = fp8_table(3, 7, false);
    /// Every e5m2 pattern decoded.
    pub(super) static E5M2_TABLE: [f32; 256] = fp8_table(2, 15, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_arithmetic_decode_matches_the_table() {
        for v in 0..=255u8 {
            for (got, want) in [
                (e4m3_to_f32(v), table::E4M3_TABLE[v as usize]),
                (e5m2_to_f32(v), table::E5M2_TABLE[v as usize]),
            ] {
                if want.is_nan() {
                    assert!(got.is_nan() && got.is_sign_negative() == want.is_sign_negative());
                } else {
                    assert_eq!(got.to_bits(), want.to_bits(), "{v:#04x}");
                }
            }
        }
    }

    #[test]
    fn spot_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
        assert_eq!(f32_to_f16(-f32::INFINITY), 0xfc00);
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert!(e4m3_to_f32(0x7f).is_nan());
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e5m2_to_f32(0x7b), 57344.0);
        assert_eq!(e5m2_to_f32(0x7c), f32::INFINITY);
        assert!(e5m2_to_f32(0x7d).is_nan());
        assert_eq!(e5m2_to_f32(0x01), 2f32.powi(-16));
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
    }
}
