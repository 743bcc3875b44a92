//! The AVX2 (and AVX-512 VNNI) kernels behind [`super::Kernels`]: only called after
//! `Kernels::detect` found the features each function names.

use std::arch::x86_64::*;

use super::{Half, Q8Rows, QK, Unpacked};
use crate::ggml_type::GgmlType;

mod vnni_tile;

struct F16cHalf;

impl Half for F16cHalf {
    #[inline(always)]
    fn h2f(lo: u8, hi: u8) -> f32 {
        let bits = i32::from(u16::from_le_bytes([lo, hi]));
        // SAFETY: F16cHalf is only used by the functions below, which run only after
        // `Kernels::detect` found F16C.
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits))) }
    }
}

/// The largest of 8 lanes (of non-negative finite values: any order gives it).
#[target_feature(enable = "avx2")]
#[inline]
pub(in crate::ops) fn hmax(m: __m256) -> f32 {
    let m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)))
}

/// 32 quants in four registers of i32 (each within i8) stored as bytes in order at
/// `q`, and their sum.
///
/// # Safety
/// `q` valid for writing 32 bytes.
#[target_feature(enable = "avx2")]
#[inline]
pub(in crate::ops) unsafe fn store_quants(i: [__m256i; 4], q: *mut i8) -> i32 {
    let sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    let s4 = _mm_add_epi32(
        _mm256_castsi256_si128(sum),
        _mm256_extracti128_si256::<1>(sum),
    );
    let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b01_00_11_10>(s4));
    let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b10_11_00_01>(s4));
    // packs interleave 128-bit lanes; the permutation puts the 32 bytes back in order.
    let bytes = _mm256_packs_epi16(
        _mm256_packs_epi32(i[0], i[1]),
        _mm256_packs_epi32(i[2], i[3]),
    );
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: the caller's contract; unaligned store.
    unsafe { _mm256_storeu_si256(q.cast::<__m256i>(), bytes) };
    _mm_cvtsi128_si32(s4)
}

/// [`super::quantize_row_body`] as ggml's AVX2 `quantize_row_q8_0` / `_q8_1` compute it
/// (the same values: the max is exact in any order, the products and the ties-to-even
/// rounding are the same per element, the sum is of integers, f16 rounding is F16C's
/// round-to-nearest-even), 32 elements in four registers instead of one at a time.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let sign = _mm256_set1_ps(-0.0);
    let f16_round = |v: f32| {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(
            _mm_set_ss(v),
        )))
    };
    for (((x, q), d), s) in x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(QK))
        .zip(d.iter_mut())
        .zip(s.iter_mut())
    {
        // SAFETY: `x` holds 32 f32s and `q` 32 bytes; unaligned loads and store.
        unsafe {
            let p = x.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let amax = hmax(_mm256_max_ps(
                _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
            ));
            let scale = amax / 127.0;
            let inv = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let mut i = [_mm256_setzero_si256(); 4];
            for (i, v) in i.iter_mut().zip(v) {
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_mul_ps(v, inv),
                );
                *i = _mm256_cvtps_epi32(r);
            }
            let sum = store_quants(i, q.as_mut_ptr());
            *d = f16_round(scale);
            *s = f16_round(scale * sum as f32);
        }
    }
}

/// 32 bytes at `p`.
///
/// # Safety
/// `p` must be valid for reading 32 bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: the caller's contract; unaligned load.
    unsafe { _mm256_loadu_si256(p.cast::<__m256i>()) }
}

/// 16 packed nibble bytes at `p` as 32 bytes: low nibbles (elements 0..16), then high.
///
/// # Safety
/// `p` must be valid for reading 16 bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller's contract; unaligned load.
    let x = unsafe { _mm_loadu_si128(p.cast::<__m128i>()) };
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(x, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), m4);
    _mm256_set_m128i(hi, lo)
}

/// Bit `i` of `bits` as byte `i`: 0xff where set, 0 where clear (ggml's
/// `bytes_from_bits_32`).
#[target_feature(enable = "avx2")]
#[inline]
fn bytes_from_bits(bits: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
    let mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, mask), _mm256_set1_epi64x(-1))
}

#[target_feature(enable = "avx2")]
#[inline]
fn store(q: &mut [i8; QK], v: __m256i) {
    // SAFETY: 32 bytes; unaligned store.
    unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast::<__m256i>(), v) }
}

/// The same values as `unpack_body`, 32 at a time.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn unpack(ty: GgmlType, bytes: &[u8], u: &mut Unpacked) -> bool {
    if !super::has_q8_dot(ty) {
        return false;
    }
    let n = bytes.len() / ty.bytes_per_block() * ty.block_size();
    u.prepare(n);
    let nb = n / QK;
    u.has_min = false;
    u.has_sub = false;
    let (q, _) = u.q[..n].as_chunks_mut::<QK>();
    let d = &mut u.d[..nb];
    let h = F16cHalf::h2f;
    let m4 = _mm256_set1_epi8(0x0f);
    match ty {
        GgmlType::Q8_0 => {
            for ((b, q), d) in bytes.as_chunks::<34>().0.iter().zip(q).zip(d) {
                *d = h(b[0], b[1]);
                // SAFETY: bytes 2..34 of a 34-byte block.
                store(q, unsafe { load32(b.as_ptr().add(2)) });
            }
        }
        GgmlType::Q4_0 => {
            let eight = _mm256_set1_epi8(8);
            for ((b, q), d) in bytes.as_chunks::<18>().0.iter().zip(q).zip(d) {
                *d = h(b[0], b[1]);
                // SAFETY: bytes 2..18 of an 18-byte block.
                let v = unsafe { nibbles(b.as_ptr().add(2)) };
                store(q, _mm256_sub_epi8(v, eight));
            }
        }
        GgmlType::Q4_1 => {
            u.has_min = true;
            let m = &mut u.m[..nb];
            for (((b, q), d), m) in bytes.as_chunks::<20>().0.iter().zip(q).zip(d).zip(m) {
                *d = h(b[0], b[1]);
                *m = h(b[2], b[3]);
                // SAFETY: bytes 4..20 of a 20-byte block.
                store(q, unsafe { nibbles(b.as_ptr().add(4)) });
            }
        }
        GgmlType::Q5_0 => {
            let f0 = _mm256_set1_epi8(0xf0u8 as i8);
            for ((b, q), d) in bytes.as_chunks::<22>().0.iter().zip(q).zip(d) {
                *d = h(b[0], b[1]);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                // SAFETY: bytes 6..22 of a 22-byte block.
                let v = unsafe { nibbles(b.as_ptr().add(6)) };
                // (nibble | bit << 4) - 16: where the bit is clear, nibble | 0xf0.
                let hi = _mm256_andnot_si256(bytes_from_bits(qh), f0);
                store(q, _mm256_or_si256(v, hi));
            }
        }
        GgmlType::Q4_K => {
            u.has_min = true;
            let m = &mut u.m[..nb];
            for (((b, q), d), m) in bytes
                .as_chunks::<144>()
                .0
                .iter()
                .zip(q.chunks_exact_mut(8))
                .zip(d.chunks_exact_mut(8))
                .zip(m.chunks_exact_mut(8))
            {
                let dd = h(b[0], b[1]);
                let dmin = h(b[2], b[3]);
                super::q4k_factors(b, dd, dmin, d, m);
                for c in 0..4 {
                    // SAFETY: bytes 16 + 32c .. 48 + 32c of a 144-byte block, c < 4.
                    let raw = unsafe { load32(b.as_ptr().add(16 + 32 * c)) };
                    store(&mut q[2 * c], _mm256_and_si256(raw, m4));
                    store(
                        &mut q[2 * c + 1],
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4),
                    );
                }
            }
        }
        GgmlType::Q6_K => {
            u.has_sub = true;
            let sc = &mut u.sc[..nb];
            let m2 = _mm256_set1_epi8(3);
            let k32 = _mm256_set1_epi8(32);
            for (((b, q), d), sc) in bytes
                .as_chunks::<210>()
                .0
                .iter()
                .zip(q.chunks_exact_mut(8))
                .zip(d.chunks_exact_mut(8))
                .zip(sc.chunks_exact_mut(8))
            {
                d.fill(h(b[208], b[209]));
                for n in 0..2 {
                    // SAFETY: ql at 64n .. 64n + 64 and qh at 128 + 32n .. 160 + 32n of
                    // a 210-byte block, n < 2.
                    let (ql0, ql1, qh) = unsafe {
                        (
                            load32(b.as_ptr().add(64 * n)),
                            load32(b.as_ptr().add(64 * n + 32)),
                            load32(b.as_ptr().add(128 + 32 * n)),
                        )
                    };
                    let hb = |shift: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(shift, m2));
                    let q0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), hb(qh));
                    let q1 =
                        _mm256_or_si256(_mm256_and_si256(ql1, m4), hb(_mm256_srli_epi16::<2>(qh)));
                    let q2 = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        hb(_mm256_srli_epi16::<4>(qh)),
                    );
                    let q3 = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        hb(_mm256_srli_epi16::<6>(qh)),
                    );
                    for (k, v) in [q0, q1, q2, q3].into_iter().enumerate() {
                        store(&mut q[4 * n + k], _mm256_sub_epi8(v, k32));
                        sc[4 * n + k] = [
                            i16::from(b[192 + 8 * n + 2 * k] as i8),
                            i16::from(b[192 + 8 * n + 2 * k + 1] as i8),
                        ];
                    }
                }
            }
        }
        _ => return false,
    }
    true
}

#[target_feature(enable = "avx2,fma")]
#[inline]
fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0x55>(s, s));
    _mm_cvtss_f32(s)
}

/// 32 i8 weights times 32 i8 activations: eight i32 partial sums (ggml's sign trick:
/// |w| as u8 times x with w's sign, `maddubs` then `madd` by `scale`, i16 lanes).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn block_dot(w: &[i8; QK], x: &[i8; QK], scale: __m256i) -> __m256i {
    // SAFETY: both arrays are 32 bytes; unaligned loads.
    let (w, x) = unsafe {
        (
            _mm256_loadu_si256(w.as_ptr().cast::<__m256i>()),
            _mm256_loadu_si256(x.as_ptr().cast::<__m256i>()),
        )
    };
    let aw = _mm256_sign_epi8(w, w);
    let sx = _mm256_sign_epi8(x, w);
    let p16 = _mm256_maddubs_epi16(aw, sx);
    _mm256_madd_epi16(p16, scale)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q8(w: &Unpacked, xq: &[i8], xd: &[f32], xs: &[f32]) -> f32 {
    let n = w.n;
    let nb = n / QK;
    let (wq, _) = w.q[..n].as_chunks::<QK>();
    let (xq, _) = xq[..n].as_chunks::<QK>();
    let wd = &w.d[..nb];
    let xd = &xd[..nb];
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    if w.has_sub {
        let sc = &w.sc[..nb];
        for (((wq, x), sc), d) in wq.iter().zip(xq).zip(sc).zip(wd.iter().zip(xd)) {
            let s = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
            let p = _mm256_cvtepi32_ps(block_dot(wq, x, s));
            acc0 = _mm256_fmadd_ps(p, _mm256_set1_ps(d.0 * d.1), acc0);
        }
    } else {
        let ones = _mm256_set1_epi16(1);
        let mut it = wq.iter().zip(xq).zip(wd.iter().zip(xd));
        loop {
            match (it.next(), it.next()) {
                (Some(((w0, x0), d0)), Some(((w1, x1), d1))) => {
                    let p0 = _mm256_cvtepi32_ps(block_dot(w0, x0, ones));
                    let p1 = _mm256_cvtepi32_ps(block_dot(w1, x1, ones));
                    acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(d0.0 * d0.1), acc0);
                    acc1 = _mm256_fmadd_ps(p1, _mm256_set1_ps(d1.0 * d1.1), acc1);
                }
                (Some(((w0, x0), d0)), None) => {
                    let p0 = _mm256_cvtepi32_ps(block_dot(w0, x0, ones));
                    acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(d0.0 * d0.1), acc0);
                    break;
                }
                _ => break,
            }
        }
    }
    let mut sum = hsum(_mm256_add_ps(acc0, acc1));
    if w.has_min {
        sum += dot_f32(&w.m[..nb], &xs[..nb]);
    }
    sum
}

/// One decoded 32-weight block: the weights, their scale, their min (times the
/// activation block's Σ), and the `madd` multipliers (ones, or Q6_K's sub-scales).
#[derive(Clone, Copy)]
struct Dec {
    q: __m256i,
    d: f32,
    m: f32,
    sc: __m256i,
}

impl Dec {
    // SAFETY: all-zero bytes are valid __m256i values.
    const ZERO: Dec = Dec {
        q: unsafe { std::mem::transmute::<[u8; 32], __m256i>([0; 32]) },
        d: 0.0,
        m: 0.0,
        sc: unsafe { std::mem::transmute::<[u8; 32], __m256i>([0; 32]) },
    };
}

/// A weight format decoded a block at a time. `decode` fills `SUB` entries of `out`
/// from one encoded block of `BYTES` bytes.
trait Decoder {
    const BYTES: usize;
    const SUB: usize;
    const MIN: bool;
    /// Every entry's `sc` is 1 (the scale is in `d`).
    const UNIT_SCALE: bool = true;
    /// Every quant is non-negative (nibbles with a min term): the unsigned × signed
    /// byte product takes the weights as they are, without the sign trick signed
    /// weights need — the same integers, two instructions fewer a block.
    const UNSIGNED: bool = false;
    /// # Safety
    /// `b` must be valid for reading `BYTES` bytes, and the CPU must have AVX2 and
    /// F16C (only called from the `#[target_feature]` functions below).
    unsafe fn decode(b: *const u8, out: &mut [Dec; 8]) {
        // SAFETY: the same contract.
        out[0] = unsafe { Self::one(b) };
    }
    /// The block's only entry, for `SUB == 1`.
    ///
    /// # Safety
    /// As [`Decoder::decode`].
    unsafe fn one(b: *const u8) -> Dec;
    /// What [`Decoder::biased`] adds to every quant.
    const BIAS: u8 = 0;
    /// [`Decoder::one`] with [`Decoder::BIAS`] added to every quant, so that signed
    /// quants enter VNNI's unsigned × signed product as they are (`vnni_tile`).
    ///
    /// # Safety
    /// As [`Decoder::decode`].
    unsafe fn biased(b: *const u8) -> Dec {
        // SAFETY: the same contract; unsigned quants need no bias.
        unsafe { Self::one(b) }
    }
}

/// # Safety
/// `p` valid for 2 bytes; F16C.
#[inline(always)]
unsafe fn h_at(p: *const u8) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { F16cHalf::h2f(*p, *p.add(1)) }
}

struct DQ8_0;
impl Decoder for DQ8_0 {
    const BYTES: usize = 34;
    const SUB: usize = 1;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn one(b: *const u8) -> Dec {
        // SAFETY: the trait's contract: 34 readable bytes, AVX2.
        unsafe {
            Dec {
                q: load32(b.add(2)),
                d: h_at(b),
                m: 0.0,
                sc: _mm256_set1_epi16(1),
            }
        }
    }
    const BIAS: u8 = 128;
    #[inline(always)]
    unsafe fn biased(b: *const u8) -> Dec {
        // SAFETY: as `one`; q + 128 is q's bits with the top one flipped.
        unsafe {
            let mut d = Self::one(b);
            d.q = _mm256_xor_si256(d.q, _mm256_set1_epi8(i8::MIN));
            d
        }
    }
}

struct DQ4_0;
impl Decoder for DQ4_0 {
    const BYTES: usize = 18;
    const SUB: usize = 1;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn one(b: *const u8) -> Dec {
        // SAFETY: the trait's contract: 18 readable bytes, AVX2.
        unsafe {
            Dec {
                q: _mm256_sub_epi8(nibbles(b.add(2)), _mm256_set1_epi8(8)),
                d: h_at(b),
                m: 0.0,
                sc: _mm256_set1_epi16(1),
            }
        }
    }
    const BIAS: u8 = 8;
    #[inline(always)]
    unsafe fn biased(b: *const u8) -> Dec {
        // SAFETY: as `one`; the nibbles are q + 8.
        unsafe {
            Dec {
                q: nibbles(b.add(2)),
                d: h_at(b),
                m: 0.0,
                sc: _mm256_set1_epi16(1),
            }
        }
    }
}

struct DQ4_1;
impl Decoder for DQ4_1 {
    const BYTES: usize = 20;
    const SUB: usize = 1;
    const MIN: bool = true;
    const UNSIGNED: bool = true;
    #[inline(always)]
    unsafe fn one(b: *const u8) -> Dec {
        // SAFETY: the trait's contract: 20 readable bytes, AVX2.
        unsafe {
            Dec {
                q: nibbles(b.add(4)),
                d: h_at(b),
                m: h_at(b.add(2)),
                sc: _mm256_set1_epi16(1),
            }
        }
    }
}

struct DQ5_0;
impl Decoder for DQ5_0 {
    const BYTES: usize = 22;
    const SUB: usize = 1;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn one(b: *const u8) -> Dec {
        // SAFETY: the trait's contract: 22 readable bytes, AVX2.
        unsafe {
            let qh = u32::from_le_bytes([*b.add(2), *b.add(3), *b.add(4), *b.add(5)]);
            let hi = _mm256_andnot_si256(bytes_from_bits(qh), _mm256_set1_epi8(0xf0u8 as i8));
            Dec {
                q: _mm256_or_si256(nibbles(b.add(6)), hi),
                d: h_at(b),
                m: 0.0,
                sc: _mm256_set1_epi16(1),
            }
        }
    }
    const BIAS: u8 = 16;
    #[inline(always)]
    unsafe fn biased(b: *const u8) -> Dec {
        // SAFETY: as `one`; q + 16 is the nibble with the fifth bit as 16.
        unsafe {
            let qh = u32::from_le_bytes([*b.add(2), *b.add(3), *b.add(4), *b.add(5)]);
            let hi = _mm256_and_si256(bytes_from_bits(qh), _mm256_set1_epi8(0x10));
            Dec {
                q: _mm256_or_si256(nibbles(b.add(6)), hi),
                d: h_at(b),
                m: 0.0,
                sc: _mm256_set1_epi16(1),
            }
        }
    }
}

struct DQ4K;
impl Decoder for DQ4K {
    const BYTES: usize = 144;
    const SUB: usize = 8;
    const MIN: bool = true;
    const UNSIGNED: bool = true;
    unsafe fn one(_: *const u8) -> Dec {
        Dec::ZERO
    }
    #[inline(always)]
    unsafe fn decode(b: *const u8, out: &mut [Dec; 8]) {
        // SAFETY: the trait's contract: 144 readable bytes, AVX2.
        unsafe {
            let dd = h_at(b);
            let dmin = h_at(b.add(2));
            let (mut d, mut m) = ([0.0f32; 8], [0.0f32; 8]);
            super::q4k_factors(&*b.cast::<[u8; 144]>(), dd, dmin, &mut d, &mut m);
            let m4 = _mm256_set1_epi8(0x0f);
            let ones = _mm256_set1_epi16(1);
            for c in 0..4 {
                let raw = load32(b.add(16 + 32 * c));
                for (j, q) in [
                    (2 * c, _mm256_and_si256(raw, m4)),
                    (2 * c + 1, _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4)),
                ] {
                    out[j] = Dec {
                        q,
                        d: d[j],
                        m: m[j],
                        sc: ones,
                    };
                }
            }
        }
    }
}

struct DQ6K;
impl Decoder for DQ6K {
    const BYTES: usize = 210;
    const SUB: usize = 8;
    const MIN: bool = false;
    const UNIT_SCALE: bool = false;
    unsafe fn one(_: *const u8) -> Dec {
        Dec::ZERO
    }
    #[inline(always)]
    unsafe fn decode(b: *const u8, out: &mut [Dec; 8]) {
        // SAFETY: the trait's contract: 210 readable bytes, AVX2.
        unsafe {
            let d = h_at(b.add(208));
            let m4 = _mm256_set1_epi8(0x0f);
            let m2 = _mm256_set1_epi8(3);
            let k32 = _mm256_set1_epi8(32);
            for n in 0..2 {
                let ql0 = load32(b.add(64 * n));
                let ql1 = load32(b.add(64 * n + 32));
                let qh = load32(b.add(128 + 32 * n));
                let hb = |x: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(x, m2));
                let qs = [
                    _mm256_or_si256(_mm256_and_si256(ql0, m4), hb(qh)),
                    _mm256_or_si256(_mm256_and_si256(ql1, m4), hb(_mm256_srli_epi16::<2>(qh))),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        hb(_mm256_srli_epi16::<4>(qh)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        hb(_mm256_srli_epi16::<6>(qh)),
                    ),
                ];
                for (k, q) in qs.into_iter().enumerate() {
                    let s0 = i16::from(*b.add(192 + 8 * n + 2 * k) as i8);
                    let s1 = i16::from(*b.add(192 + 8 * n + 2 * k + 1) as i8);
                    out[4 * n + k] = Dec {
                        q: _mm256_sub_epi8(q, k32),
                        d,
                        m: 0.0,
                        sc: _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0)),
                    };
                }
            }
        }
    }
}

/// Weight block `$dw` (a `Dec` of decoder `$D`) dotted with 32 activation bytes `$xv`:
/// the block's integer sums as f32 lanes. Non-negative quants enter the unsigned ×
/// signed byte product as they are; signed ones through the sign trick. A macro, not a
/// function: it expands inside the `#[target_feature]` function that uses it, so its
/// intrinsics inline (with VNNI's `vpdpbusd` where that function has it).
macro_rules! block_dot {
    ($D:ty, $vnni:expr, $dw:expr, $xv:expr) => {{
        let dw: &Dec = $dw;
        let xv: __m256i = $xv;
        let (aw, sx) = if <$D>::UNSIGNED {
            (dw.q, xv)
        } else {
            (_mm256_sign_epi8(dw.q, dw.q), _mm256_sign_epi8(xv, dw.q))
        };
        let i = if $vnni && <$D>::UNIT_SCALE {
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx)
        } else {
            _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), dw.sc)
        };
        _mm256_cvtepi32_ps(i)
    }};
}

/// `NR` rows starting at `r0`: one accumulator per row, blocks in order (so a row's
/// value is the same whatever `NR` it was computed in).
///
/// # Safety
/// AVX2, FMA, F16C; `w` whole blocks of `D`, `x` rows of at least `w`'s width.
#[inline(always)]
unsafe fn fused<D: Decoder, const NR: usize, const VNNI: bool>(
    w: &[u8],
    x: &Q8Rows,
    r0: usize,
    out: &mut [f32],
) {
    let n = x.n;
    let nb = n / QK;
    let blocks = w.len() / D::BYTES;
    // SAFETY: the caller's contract (CPU features); every pointer below is checked by
    // the slicing that makes it.
    unsafe {
        // One accumulator per row, block by block, and the min term by FMA: ggml's
        // float order, so the same bits as its dots (`model/src/ops/ggml_round.rs`).
        let mut acc = [_mm256_setzero_ps(); NR];
        let mut accm = [0.0f32; NR];
        // Row starts; the caller checked `x` holds rows r0..r0 + NR of n.
        let xq: [*const i8; NR] = std::array::from_fn(|r| x.q.as_ptr().add((r0 + r) * n));
        let xd: [*const f32; NR] = std::array::from_fn(|r| x.d.as_ptr().add((r0 + r) * nb));
        let xs: [*const f32; NR] = std::array::from_fn(|r| x.s.as_ptr().add((r0 + r) * nb));
        // A macro, not a closure: a closure would not inherit the target features, and
        // its intrinsics would be calls.
        macro_rules! block {
            ($b:expr, $dw:expr) => {{
                let b: usize = $b;
                let dw: &Dec = $dw;
                for r in 0..NR {
                    let xv = load32(xq[r].add(b * QK).cast::<u8>());
                    let p = block_dot!(D, VNNI, dw, xv);
                    acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw.d * *xd[r].add(b)), acc[r]);
                    if D::MIN {
                        accm[r] = dw.m.mul_add(*xs[r].add(b), accm[r]);
                    }
                }
            }};
        }
        let blocks = blocks.min(nb / D::SUB);
        if D::SUB == 1 {
            for b in 0..blocks {
                block!(b, &D::one(w.as_ptr().add(b * D::BYTES)));
            }
        } else {
            let mut dec = [Dec::ZERO; 8];
            for bi in 0..blocks {
                D::decode(w.as_ptr().add(bi * D::BYTES), &mut dec);
                for (s, dw) in dec.iter().enumerate().take(D::SUB) {
                    block!(bi * D::SUB + s, dw);
                }
            }
        }
        for r in 0..NR {
            out[r0 + r] = hsum(acc[r]) + accm[r];
        }
    }
}

/// `MW` weight rows against activation row `r0`, for one-block decoders: each weight
/// row's blocks in [`fused`]'s order and arithmetic (the same bits), the rows' chains
/// interleaved. A one-row decode is otherwise one serial chain of FMAs per weight row,
/// each block waiting for the last; `MW` independent chains hide that latency, and
/// the activation block is loaded once for all of them.
///
/// # Safety
/// AVX2, FMA, F16C; `D::SUB == 1`; each `w[m]` whole blocks of `D`, `x` a row `r0` of at
/// least their width; `out` at least `MW` long.
#[inline(always)]
unsafe fn fused_wide<D: Decoder, const MW: usize, const VNNI: bool>(
    w: [&[u8]; MW],
    x: &Q8Rows,
    r0: usize,
    out: &mut [f32],
) {
    let n = x.n;
    let nb = n / QK;
    let blocks = w
        .iter()
        .map(|r| r.len() / D::BYTES)
        .min()
        .unwrap_or(0)
        .min(nb);
    // SAFETY: the caller's contract; every pointer is within the slices checked by
    // the caller (`matrix_of`).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); MW];
        let mut accm = [0.0f32; MW];
        let xq = x.q.as_ptr().add(r0 * n);
        let xd = x.d.as_ptr().add(r0 * nb);
        let xs = x.s.as_ptr().add(r0 * nb);
        for b in 0..blocks {
            let xv = load32(xq.add(b * QK).cast::<u8>());
            let (xdb, xsb) = (*xd.add(b), *xs.add(b));
            for m in 0..MW {
                let dw = D::one(w[m].as_ptr().add(b * D::BYTES));
                let p = block_dot!(D, VNNI, &dw, xv);
                acc[m] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw.d * xdb), acc[m]);
                if D::MIN {
                    accm[m] = dw.m.mul_add(xsb, accm[m]);
                }
            }
        }
        for m in 0..MW {
            out[m] = hsum(acc[m]) + accm[m];
        }
    }
}

/// # Safety
/// AVX2, FMA, F16C.
#[inline(always)]
unsafe fn matrix_of<D: Decoder, const VNNI: bool>(
    w: &[u8],
    row_bytes: usize,
    x: &Q8Rows,
    rows: usize,
    out: &mut [f32],
) -> bool {
    if row_bytes == 0
        || !row_bytes.is_multiple_of(D::BYTES)
        || (row_bytes / D::BYTES) * D::SUB * QK != x.n
        || !w.len().is_multiple_of(row_bytes)
        || x.q.len() < rows * x.n
        || x.d.len() < rows * (x.n / QK)
        || x.s.len() < rows * (x.n / QK)
        || out.len() < rows * (w.len() / row_bytes)
    {
        return false;
    }
    // SAFETY: the caller's contract; sizes checked above.
    unsafe {
        if rows == 1 && D::SUB == 1 {
            // A one-row decode: four weight rows' chains at a time.
            let mut ws = w.chunks_exact(row_bytes);
            let mut outs = out.chunks_exact_mut(4);
            let whole = (w.len() / row_bytes) / 4;
            for g in 0..whole {
                super::prefetch_weights(w, g * 4 * row_bytes, 4 * row_bytes);
                let (Some(a), Some(b), Some(c), Some(d), Some(o)) =
                    (ws.next(), ws.next(), ws.next(), ws.next(), outs.next())
                else {
                    break;
                };
                fused_wide::<D, 4, VNNI>([a, b, c, d], x, 0, o);
            }
            let done = whole * 4;
            for (i, (wr, o)) in ws.zip(out[done..].chunks_exact_mut(1)).enumerate() {
                super::prefetch_weights(w, (done + i) * row_bytes, row_bytes);
                fused::<D, 1, VNNI>(wr, x, 0, o);
            }
            return true;
        }
        // With VNNI, whole tiles of four weight rows by four activation rows first
        // (`vnni_tile`: the same bits as `fused`); what is left row by row.
        let tiled_w = if VNNI && D::SUB == 1 && rows >= vnni_tile::TILE {
            (w.len() / row_bytes) / vnni_tile::TILE * vnni_tile::TILE
        } else {
            0
        };
        let tiled_x = rows / vnni_tile::TILE * vnni_tile::TILE;
        for j in (0..tiled_w).step_by(vnni_tile::TILE) {
            super::prefetch_weights(w, j * row_bytes, vnni_tile::TILE * row_bytes);
            let ws: [&[u8]; vnni_tile::TILE] =
                std::array::from_fn(|m| &w[(j + m) * row_bytes..(j + m + 1) * row_bytes]);
            for r in (0..tiled_x).step_by(vnni_tile::TILE) {
                vnni_tile::tile::<D>(ws, x, r, rows, &mut out[j * rows..]);
            }
        }
        for (j, (wr, out)) in w
            .chunks_exact(row_bytes)
            .zip(out.chunks_exact_mut(rows.max(1)))
            .enumerate()
        {
            let mut r = if j < tiled_w { tiled_x } else { 0 };
            if r < rows {
                super::prefetch_weights(w, j * row_bytes, row_bytes);
            }
            while r + 4 <= rows {
                fused::<D, 4, VNNI>(wr, x, r, out);
                r += 4;
            }
            if r + 2 <= rows {
                fused::<D, 2, VNNI>(wr, x, r, out);
                r += 2;
            }
            if r < rows {
                fused::<D, 1, VNNI>(wr, x, r, out);
            }
        }
    }
    true
}

/// # Safety
/// AVX2, FMA, F16C, and with `VNNI` AVX-512 VNNI and VL.
#[inline(always)]
unsafe fn dot_matrix_body<const VNNI: bool>(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    x: &Q8Rows,
    rows: usize,
    out: &mut [f32],
) -> bool {
    // SAFETY: the caller's contract.
    unsafe {
        if x.per_256 && matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
            return super::super::kdot::avx2::matrix::<VNNI>(ty, w, row_bytes, x, rows, out);
        }
        match ty {
            GgmlType::Q8_0 => matrix_of::<DQ8_0, VNNI>(w, row_bytes, x, rows, out),
            GgmlType::Q4_0 => matrix_of::<DQ4_0, VNNI>(w, row_bytes, x, rows, out),
            GgmlType::Q4_1 => matrix_of::<DQ4_1, VNNI>(w, row_bytes, x, rows, out),
            GgmlType::Q5_0 => matrix_of::<DQ5_0, VNNI>(w, row_bytes, x, rows, out),
            GgmlType::Q4_K => matrix_of::<DQ4K, VNNI>(w, row_bytes, x, rows, out),
            GgmlType::Q6_K => matrix_of::<DQ6K, VNNI>(w, row_bytes, x, rows, out),
            _ => false,
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_matrix(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    x: &Q8Rows,
    rows: usize,
    out: &mut [f32],
) -> bool {
    // SAFETY: this function's target features are the body's contract.
    unsafe { dot_matrix_body::<false>(ty, w, row_bytes, x, rows, out) }
}

/// [`dot_matrix`] with AVX-512 VNNI's `vpdpbusd` for the block dots (the same
/// integers as `maddubs` then `madd`, in one instruction, as llama.cpp's `updot` with
/// `__AVX512VNNI__`).
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(super) fn dot_matrix_vnni(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    x: &Q8Rows,
    rows: usize,
    out: &mut [f32],
) -> bool {
    // SAFETY: this function's target features are the body's contract.
    unsafe { dot_matrix_body::<true>(ty, w, row_bytes, x, rows, out) }
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let (ac, ar) = a.as_chunks::<16>();
    let (bc, br) = b.as_chunks::<16>();
    for (x, y) in ac.iter().zip(bc) {
        // SAFETY: each chunk is 16 f32s; unaligned loads of 8 at offsets 0 and 8.
        unsafe {
            let x0 = _mm256_loadu_ps(x.as_ptr());
            let x1 = _mm256_loadu_ps(x.as_ptr().add(8));
            let y0 = _mm256_loadu_ps(y.as_ptr());
            let y1 = _mm256_loadu_ps(y.as_ptr().add(8));
            acc0 = _mm256_fmadd_ps(x0, y0, acc0);
            acc1 = _mm256_fmadd_ps(x1, y1, acc1);
        }
    }
    let mut sum = hsum(_mm256_add_ps(acc0, acc1));
    for (x, y) in ar.iter().zip(br) {
        sum += x * y;
    }
    sum
}

/// Six rows of `C` by 16 columns in twelve registers, `k` FMAs each; the rows left
/// over one at a time, the columns past a multiple of 16 in the portable body.
#[target_feature(enable = "avx2,fma")]
pub(super) fn gemm_acc(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
    let n16 = n / 16 * 16;
    let mut i = 0;
    while i + 6 <= m {
        // SAFETY: rows i..i + 6 are in range; `gemm_block` reads A's rows and B's
        // first `n16` columns and writes C's within the slices' shapes.
        unsafe { gemm_block::<6>(c, a, b, i, k, n, n16) };
        i += 6;
    }
    while i < m {
        // SAFETY: as above, row i alone.
        unsafe { gemm_block::<1>(c, a, b, i, k, n, n16) };
        i += 1;
    }
    super::gemm_acc_body(c, a, b, m, k, n, n16);
}

/// Rows `i..i + R` of `C`, columns `0..n16`.
///
/// # Safety
/// `i + R <= m`, `n16 <= n`, a multiple of 16, and `c`, `a`, `b` hold `m × n`,
/// `m × k`, `k × n` values.
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_block<const R: usize>(
    c: &mut [f32],
    a: &[f32],
    b: &[f32],
    i: usize,
    k: usize,
    n: usize,
    n16: usize,
) {
    let (cp, ap, bp) = (c.as_mut_ptr(), a.as_ptr(), b.as_ptr());
    let mut j = 0;
    while j < n16 {
        // SAFETY: every offset below is within the shapes of the contract.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for (r, acc) in acc.iter_mut().enumerate() {
                let p = cp.add((i + r) * n + j);
                acc[0] = _mm256_loadu_ps(p);
                acc[1] = _mm256_loadu_ps(p.add(8));
            }
            for kk in 0..k {
                let q = bp.add(kk * n + j);
                let b0 = _mm256_loadu_ps(q);
                let b1 = _mm256_loadu_ps(q.add(8));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av = _mm256_set1_ps(*ap.add((i + r) * k + kk));
                    acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let p = cp.add((i + r) * n + j);
                _mm256_storeu_ps(p, acc[0]);
                _mm256_storeu_ps(p.add(8), acc[1]);
            }
        }
        j += 16;
    }
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    let va = _mm256_set1_ps(a);
    let (xc, xr) = x.as_chunks::<8>();
    let (yc, yr) = y.as_chunks_mut::<8>();
    for (x, y) in xc.iter().zip(yc) {
        // SAFETY: 8 f32s each; unaligned loads and store.
        unsafe {
            let v = _mm256_fmadd_ps(va, _mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr()));
            _mm256_storeu_ps(y.as_mut_ptr(), v);
        }
    }
    for (x, y) in xr.iter().zip(yr) {
        *y += a * x;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let (sc, sr) = src[..2 * n].as_chunks::<16>();
    let (dc, dr) = dst[..n].as_chunks_mut::<8>();
    for (s, d) in sc.iter().zip(dc) {
        // SAFETY: 16 bytes in, 8 f32s out; unaligned.
        unsafe {
            let h = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    for (s, d) in sr.as_chunks::<2>().0.iter().zip(dr) {
        *d = F16cHalf::h2f(s[0], s[1]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f32_to_f16(src: &[f32], dst: &mut [u8]) {
    let n = src.len().min(dst.len() / 2);
    let (sc, sr) = src[..n].as_chunks::<8>();
    let (dc, dr) = dst[..2 * n].as_chunks_mut::<16>();
    for (s, d) in sc.iter().zip(dc) {
        // SAFETY: 8 f32s in, 16 bytes out; unaligned.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
            _mm_storeu_si128(d.as_mut_ptr().cast::<__m128i>(), h);
        }
    }
    for (s, d) in sr.iter().zip(dr.as_chunks_mut::<2>().0) {
        *d = super::super::half::f32_to_f16(*s).to_le_bytes();
    }
}
