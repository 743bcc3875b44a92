//! The 256-element K-quant super-blocks (ggml-common.h).
//!
//! Q4_K (144 bytes): `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]`. Eight sub-blocks
//! of 32 with 6-bit scales and mins packed in `scales` (see [`scale_min`]); sub-block pair
//! `c` (elements `64c..64c+64`) reads `qs[32c..32c+32]`, low nibbles first then high
//! nibbles. Value: `(d * sc) * q - dmin * m`.
//!
//! Q6_K (210 bytes): `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`. Two halves of
//! 128; in half `n`, element `l + 32k` (k = 0..4, l = 0..32) takes its low 4 bits from
//! `ql[64n + l + 32(k & 1)]` (low nibble for k < 2, high for k >= 2), its top 2 bits from
//! `qh[32n + l] >> 2k`, and scale `scales[8n + l / 16 + 2k]`. Value: `(d * scale) * (q - 32)`.

use super::half;

/// Q4_K's scale and min of sub-block `j` (ggml's `get_scale_min_k4`): 6 bits each; for
/// `j < 4` the low 6 bits of bytes `j` and `j + 4`; for `j >= 4` a nibble of byte `j + 4`
/// plus the top 2 bits of bytes `j - 4` (scale) and `j` (min).
#[inline]
pub(crate) fn scale_min(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// All 8 of [`scale_min`] at once, as llama.cpp's kernels unpack them: with shifts and
/// masks over three words instead of per sub-block (the SIMD kernels' form).
#[inline(always)]
pub(crate) fn scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (u0, u1, u2) = (w(0), w(1), w(2));
    let sc_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let mn_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let join = |a: u32, b: u32| {
        let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    };
    (join(u0 & KMASK1, sc_hi), join(u1 & KMASK1, mn_hi))
}

pub(super) fn q4_k(b: &[u8; 144], y: &mut [f32; 256]) {
    let d = half(b[0], b[1]);
    let dmin = half(b[2], b[3]);
    let mut scales = [0u8; 12];
    scales.copy_from_slice(&b[4..16]);
    let qs = &b[16..];
    for (c, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min(2 * c, &scales);
        let (sc2, m2) = scale_min(2 * c + 1, &scales);
        let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let (lo, hi) = y.split_at_mut(32);
        for ((q, lo), hi) in q.iter().zip(lo).zip(hi) {
            *lo = d1 * f32::from(q & 0x0f) - m1;
            *hi = d2 * f32::from(q >> 4) - m2;
        }
    }
}

pub(super) fn q6_k(b: &[u8; 210], y: &mut [f32; 256]) {
    let (ql, rest) = b.split_at(128);
    let (qh, rest) = rest.split_at(64);
    let sc = &rest[..16];
    let d = half(b[208], b[209]);
    for (n, y) in y.chunks_exact_mut(128).enumerate() {
        let ql = &ql[64 * n..64 * n + 64];
        let qh = &qh[32 * n..32 * n + 32];
        let sc = &sc[8 * n..8 * n + 8];
        for l in 0..32 {
            let is = l / 16;
            let h = qh[l];
            let q1 = i16::from((ql[l] & 0x0f) | ((h & 3) << 4)) - 32;
            let q2 = i16::from((ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4)) - 32;
            let q3 = i16::from((ql[l] >> 4) | (((h >> 4) & 3) << 4)) - 32;
            let q4 = i16::from((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) - 32;
            let s = |k: usize| d * f32::from(sc[is + 2 * k] as i8);
            y[l] = s(0) * f32::from(q1);
            y[l + 32] = s(1) * f32::from(q2);
            y[l + 64] = s(2) * f32::from(q3);
            y[l + 96] = s(3) * f32::from(q4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packed unpacking is the per-sub-block one, for every value of each byte in
    /// every position (the bits of one byte never reach another's field but its own).
    #[test]
    fn scales_mins_equal_scale_min_for_every_byte() {
        for pos in 0..12 {
            for v in 0..=255u8 {
                let mut s = [0x5au8; 12];
                s[pos] = v;
                let (sc, mn) = scales_mins(&s);
                for j in 0..8 {
                    assert_eq!((sc[j], mn[j]), scale_min(j, &s), "byte {pos} = {v}, j {j}");
                }
            }
        }
    }
}
