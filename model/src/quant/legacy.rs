//! The 32-element block formats (ggml-common.h):
//!
//! | type | layout (bytes)                          | value                        |
//! |------|-----------------------------------------|------------------------------|
//! | Q4_0 | d: f16, qs: [u8; 16]                    | d * (nibble - 8)             |
//! | Q4_1 | d: f16, m: f16, qs: [u8; 16]            | d * nibble + m               |
//! | Q5_0 | d: f16, qh: u32 (LE), qs: [u8; 16]      | d * ((nibble | hbit << 4) - 16) |
//! | Q8_0 | d: f16, qs: [i8; 32]                    | d * q                        |
//!
//! In the nibble formats element `j < 16` is the low nibble of `qs[j]` and element `j + 16`
//! its high nibble; Q5_0's fifth bit of element `i` is bit `i` of `qh`.

use super::half;

pub(super) fn q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = half(b[0], b[1]);
    let (lo, hi) = y.split_at_mut(16);
    for ((q, lo), hi) in b[2..].iter().zip(lo).zip(hi) {
        *lo = f32::from(i16::from(q & 0x0f) - 8) * d;
        *hi = f32::from(i16::from(q >> 4) - 8) * d;
    }
}

pub(super) fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let d = half(b[0], b[1]);
    let m = half(b[2], b[3]);
    let (lo, hi) = y.split_at_mut(16);
    for ((q, lo), hi) in b[4..].iter().zip(lo).zip(hi) {
        *lo = f32::from(q & 0x0f) * d + m;
        *hi = f32::from(q >> 4) * d + m;
    }
}

pub(super) fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = half(b[0], b[1]);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let (lo, hi) = y.split_at_mut(16);
    for (j, ((q, lo), hi)) in b[6..].iter().zip(lo).zip(hi).enumerate() {
        let h0 = ((qh >> j) & 1) as u8;
        let h1 = ((qh >> (j + 16)) & 1) as u8;
        *lo = f32::from(i16::from((q & 0x0f) | (h0 << 4)) - 16) * d;
        *hi = f32::from(i16::from((q >> 4) | (h1 << 4)) - 16) * d;
    }
}

pub(super) fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = half(b[0], b[1]);
    for (q, y) in b[2..].iter().zip(y) {
        *y = f32::from(*q as i8) * d;
    }
}
