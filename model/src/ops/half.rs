//! f32 → f16 rounding (the KV cache's element type); f16 → f32 is [`crate::quant::f16_to_f32`].

/// IEEE binary16 nearest to `x`, ties to even (what F16C's `vcvtps2ph` with rounding mode
/// 0 and ggml's `GGML_FP32_TO_FP16` produce). Overflow goes to ±infinity, NaN stays NaN
/// (quiet, its top payload bits kept).
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let mant = b & 0x7f_ffff;
    if exp == 0xff {
        let nan = if mant != 0 {
            0x200 | (mant >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    // The f16 biased exponent.
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e >= 1 {
        let h = ((e as u32) << 10) | (mant >> 13);
        let rest = mant & 0x1fff;
        // A carry out of the mantissa bumps the exponent (and 0x7bff + 1 is infinity).
        let h = if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
            h + 1
        } else {
            h
        };
        return sign | h as u16;
    }
    // Subnormal (or zero): units of 2^-24. value / 2^-24 = m24 × 2^(e - 14).
    let shift = (14 - e) as u32;
    if shift > 25 {
        return sign;
    }
    let m24 = mant | 0x80_0000;
    let q = m24 >> shift;
    let rest = m24 & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let q = if rest > half || (rest == half && q & 1 == 1) {
        q + 1
    } else {
        q
    };
    sign | q as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::f16_to_f32;

    #[test]
    fn every_f16_round_trips() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                assert!(f16_to_f32(f32_to_f16(x)).is_nan(), "{h:#06x}");
            } else {
                assert_eq!(f32_to_f16(x), h, "{h:#06x}");
            }
        }
    }

    #[test]
    fn rounds_to_nearest_even() {
        // Midway between 1.0 (0x3c00) and the next f16 (0x3c01): ties to even, down.
        let one = 1.0f32;
        let ulp = 2f32.powi(-10);
        assert_eq!(f32_to_f16(one + ulp / 2.0), 0x3c00);
        assert_eq!(f32_to_f16(one + 3.0 * ulp / 2.0), 0x3c02);
        assert_eq!(f32_to_f16(one + ulp / 2.0 + 2f32.powi(-20)), 0x3c01);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0);
        assert_eq!(f32_to_f16(2f32.powi(-25) * 1.5), 1);
        assert_eq!(f32_to_f16(2f32.powi(-24) * 1.5), 2);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        assert_eq!(f32_to_f16(1e-30), 0);
        assert_eq!(f32_to_f16(f32::NEG_INFINITY), 0xfc00);
        // Largest subnormal rounding up into the smallest normal.
        assert_eq!(f32_to_f16(2f32.powi(-14) - 2f32.powi(-26)), 0x0400);
    }

    /// Between consecutive f16s, the scalar rounding agrees with a direct nearest search.
    #[test]
    fn agrees_with_nearest_search() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = f32::from_bits(state as u32);
            if !x.is_finite() || x.abs() >= 65504.0 {
                continue;
            }
            let h = f32_to_f16(x);
            let y = f64::from(f16_to_f32(h));
            let d = (y - f64::from(x)).abs();
            for n in [h.wrapping_sub(1), h.wrapping_add(1)] {
                let z = f64::from(f16_to_f32(n));
                if z.is_finite() && (n & 0x7fff) < 0x7c00 && (n & 0x8000) == (h & 0x8000) {
                    assert!(d <= (z - f64::from(x)).abs(), "{x:e}: {h:#06x} vs {n:#06x}");
                }
            }
        }
    }
}
