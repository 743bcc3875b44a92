//! F32, F16 and BF16 tensors.

/// IEEE binary16 to f32, exactly (every f16 is an f32). NaN payloads are kept, as numpy's
/// and ggml's scalar conversions keep them (a signalling NaN stays signalling).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let exp = (h >> 10) & 0x1f;
    let mant = h & 0x3ff;
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: mant * 2^-24. Shift the leading one up to bit 10 (the implicit bit).
            let shift = mant.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | (((mant << shift) & 0x3ff) << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (mant << 13),
        _ => sign | ((exp + 112) << 23) | (mant << 13),
    };
    f32::from_bits(bits)
}

/// bfloat16 to f32: the top half of an f32.
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

pub(super) fn f32s(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.as_chunks::<4>().0.iter().zip(out) {
        *y = f32::from_le_bytes(*b);
    }
}

pub(super) fn f16s(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.as_chunks::<2>().0.iter().zip(out) {
        *y = f16_to_f32(u16::from_le_bytes(*b));
    }
}

pub(super) fn bf16s(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.as_chunks::<2>().0.iter().zip(out) {
        *y = bf16_to_f32(u16::from_le_bytes(*b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_landmarks() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x0400), 2f32.powi(-14));
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert_eq!(f16_to_f32(0x7c01).to_bits(), 0x7f80_2000);
        assert_eq!(f16_to_f32(0x7e00).to_bits(), 0x7fc0_0000);
    }

    #[test]
    fn f16_is_monotonic_and_exact() {
        // Every finite positive f16 is k * 2^-24 for an integer-valued mantissa scaled by its
        // exponent; check against that definition directly.
        for h in 0u16..0x7c00 {
            let exp = i32::from((h >> 10) & 0x1f);
            let mant = f64::from(h & 0x3ff);
            let want = if exp == 0 {
                mant * 2f64.powi(-24)
            } else {
                (1.0 + mant / 1024.0) * 2f64.powi(exp - 15)
            };
            assert_eq!(f64::from(f16_to_f32(h)), want, "{h:#06x}");
            assert_eq!(f16_to_f32(h | 0x8000), -f16_to_f32(h), "{h:#06x}");
        }
    }

    #[test]
    fn bf16() {
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(0xc040), -3.0);
    }
}
