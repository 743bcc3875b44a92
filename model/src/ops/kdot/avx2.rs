//! The x86 kernels (AVX2, FMA, F16C; with AVX-512 VNNI where the caller has it).

use std::arch::x86_64::*;

use super::super::kernels::{Q8Rows, prefetch_weights, q4k_scales};
use crate::ggml_type::{GgmlType, QK_K};

/// Activation rows from which llama.cpp's tiled K-quant matmul takes over from
/// `vec_dot` (`ggml_tiled_min_batch`).
const TILED_FROM_ROWS: usize = 8;

/// # Safety
/// `p` valid for 2 bytes; F16C.
#[inline(always)]
unsafe fn h(p: *const u8) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        let bits = i32::from(u16::from_le_bytes([*p, *p.add(1)]));
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
    }
}

/// # Safety
/// `p` valid for 32 bytes; AVX2.
#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: the caller's contract; unaligned load.
    unsafe { _mm256_loadu_si256(p.cast::<__m256i>()) }
}

#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: register-only intrinsics; AVX2 by the callers' target features.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// ggml's `hsum_float_8`: the halves added, then (x0 + x2) + (x1 + x3).
#[inline(always)]
unsafe fn hsum_ps(v: __m256) -> f32 {
    // SAFETY: register-only intrinsics; AVX by the callers' target features.
    unsafe {
        let s = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// Row starts of `NR` activation rows from `r0`: quants, the per-32 scales (constant
/// within each 256) and the sums of 16.
#[inline(always)]
unsafe fn rows<const NR: usize>(
    x: &Q8Rows,
    r0: usize,
) -> ([*const u8; NR], [*const f32; NR], [*const i16; NR]) {
    let n = x.n;
    // SAFETY: the caller checked `x` holds rows r0..r0 + NR.
    unsafe {
        (
            std::array::from_fn(|r| x.q.as_ptr().add((r0 + r) * n).cast::<u8>()),
            std::array::from_fn(|r| x.d.as_ptr().add((r0 + r) * (n / 32))),
            std::array::from_fn(|r| x.bs.as_ptr().add((r0 + r) * (n / 16))),
        )
    }
}

/// llama.cpp's Q4_K GEMV order, for the activation rows after the last whole group of
/// four (which [`q4k_four`] takes, in its GEMM order): per 256, one integer
/// `Σ_j sc_j·Σ q·x` and one `Σ_j m_j·Σ x`, each added by FMA with `d_w·d_x` and
/// `dmin_w·d_x`.
///
/// # Safety
/// AVX2, FMA, F16C; `w` a whole Q4_K row of `x.n`; `x` holds rows r0..r0 + NR.
#[inline(always)]
unsafe fn q4k<const NR: usize>(w: &[u8], x: &Q8Rows, r0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract; every offset below stays inside a 144-byte block
    // of `w` or a 256-element block of a row of `x`.
    unsafe {
        let (xq, xd, xb) = rows::<NR>(x, r0);
        let (mut acc, mut accm) = ([0.0f32; NR], [0.0f32; NR]);
        let m4 = _mm256_set1_epi8(0x0f);
        for b in 0..x.n / QK_K {
            let p = w.as_ptr().add(b * 144);
            let (dd, dmin) = (h(p), h(p.add(2)));
            let (scales, mins) = q4k_scales(&*p.cast::<[u8; 144]>());
            let mut sc = [_mm256_setzero_si256(); 8];
            for (v, s) in sc.iter_mut().zip(scales) {
                *v = _mm256_set1_epi16(i16::from(s));
            }
            let mut ia = [_mm256_setzero_si256(); NR];
            for c in 0..4 {
                let raw = load(p.add(16 + 32 * c));
                let lo = _mm256_and_si256(raw, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                for r in 0..NR {
                    let x0 = load(xq[r].add(b * QK_K + 64 * c));
                    let x1 = load(xq[r].add(b * QK_K + 64 * c + 32));
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), sc[2 * c]);
                    let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), sc[2 * c + 1]);
                    ia[r] = _mm256_add_epi32(ia[r], _mm256_add_epi32(p0, p1));
                }
            }
            for r in 0..NR {
                // Σ_j m_j × (Σx of the j-th 32), from the sums of 16.
                let bs = xb[r].add(b * 16);
                let m: i32 = (0..8)
                    .map(|j| {
                        i32::from(mins[j])
                            * (i32::from(*bs.add(2 * j)) + i32::from(*bs.add(2 * j + 1)))
                    })
                    .sum();
                let xd = *xd[r].add(b * 8);
                acc[r] = (hsum_i32(ia[r]) as f32).mul_add(dd * xd, acc[r]);
                accm[r] = (m as f32).mul_add(dmin * xd, accm[r]);
            }
        }
        for r in 0..NR {
            out[r0 + r] = acc[r] - accm[r];
        }
    }
}

/// `[Σa, Σb, Σc, Σd]` of four registers of eight i32 lanes: integer sums, so the
/// same values as [`hsum_i32`] of each, in five instructions instead of twenty.
#[inline(always)]
unsafe fn hsum4_i32(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m128i {
    // SAFETY: register-only intrinsics; AVX2 by the callers' target features.
    unsafe {
        let t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
        _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t))
    }
}

/// Q4_K for a whole group of four activation rows in llama.cpp's GEMM order (as its
/// `ggml_gemm_q4_K_8x8_q8_K`): like [`q4k`], but the two integers are added by FMA per
/// two sub-blocks (64 elements), not per 256. The four rows sit in the lanes of one
/// register for the horizontal sums, scales, mins and FMAs.
///
/// # Safety
/// As [`q4k`], with `x` holding rows r0..r0 + 4.
#[inline(always)]
unsafe fn q4k_four<const VNNI: bool>(w: &[u8], x: &Q8Rows, r0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract; every offset below stays inside a 144-byte block
    // of `w`, a 256-element block of a row of `x`, or `out[r0..r0 + 4]` (checked).
    // No closures over intrinsics: they would not inherit the target features.
    unsafe {
        let (xq, xd, xb) = rows::<4>(x, r0);
        let (mut acc, mut accm) = (_mm_setzero_ps(), _mm_setzero_ps());
        let m4 = _mm256_set1_epi8(0x0f);
        // Byte pairs (2j, 2j + 1) in every i16: broadcasts i16 lane j of a register.
        let mut pick = [_mm256_setzero_si256(); 8];
        for (j, p) in pick.iter_mut().enumerate() {
            let j = j as i16;
            *p = _mm256_set1_epi16((2 * j) | ((2 * j + 1) << 8));
        }
        // Each min twice, to meet the sums of 16 in pairs.
        let twice = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        for b in 0..x.n / QK_K {
            let p = w.as_ptr().add(b * 144);
            let (dd, dmin) = (h(p), h(p.add(2)));
            let (scales, mins) = q4k_scales(&*p.cast::<[u8; 144]>());
            let sc16 = _mm256_cvtepu8_epi16(_mm_loadl_epi64(scales.as_ptr().cast()));
            let sc16 = _mm256_permute2x128_si256::<0x00>(sc16, sc16);
            let mn = _mm_loadl_epi64(mins.as_ptr().cast());
            let mn16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(mn, twice));
            // Lane j of row r: m_j × (Σx of the j-th 32), the integers of `q4k`'s `mins`.
            let mut mr = [_mm256_setzero_si256(); 4];
            for (r, m) in mr.iter_mut().enumerate() {
                *m = _mm256_madd_epi16(load(xb[r].add(b * 16).cast()), mn16);
            }
            // Per 128 bits, (row, pair of 32s): [r0 c0, r0 c1, r1 c0, r1 c1] below,
            // c2 and c3 above; likewise rows 2 and 3.
            let h01 = _mm256_hadd_epi32(mr[0], mr[1]);
            let h23 = _mm256_hadd_epi32(mr[2], mr[3]);
            let (l01, l23) = (
                _mm_castsi128_ps(_mm256_castsi256_si128(h01)),
                _mm_castsi128_ps(_mm256_castsi256_si128(h23)),
            );
            let (u01, u23) = (
                _mm_castsi128_ps(_mm256_extracti128_si256::<1>(h01)),
                _mm_castsi128_ps(_mm256_extracti128_si256::<1>(h23)),
            );
            // The four rows' mins of each pair c, one row a lane.
            let mins4 = [
                _mm_shuffle_ps::<0b10_00_10_00>(l01, l23),
                _mm_shuffle_ps::<0b11_01_11_01>(l01, l23),
                _mm_shuffle_ps::<0b10_00_10_00>(u01, u23),
                _mm_shuffle_ps::<0b11_01_11_01>(u01, u23),
            ];
            let xds = _mm_setr_ps(
                *xd[0].add(b * 8),
                *xd[1].add(b * 8),
                *xd[2].add(b * 8),
                *xd[3].add(b * 8),
            );
            let sd = _mm_mul_ps(_mm_set1_ps(dd), xds);
            let sm = _mm_mul_ps(_mm_set1_ps(dmin), xds);
            for (c, mins) in mins4.into_iter().enumerate() {
                let raw = load(p.add(16 + 32 * c));
                let lo = _mm256_and_si256(raw, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                let s0 = _mm256_shuffle_epi8(sc16, pick[2 * c]);
                let s1 = _mm256_shuffle_epi8(sc16, pick[2 * c + 1]);
                let mut ia = [_mm256_setzero_si256(); 4];
                for (r, i) in ia.iter_mut().enumerate() {
                    let x0 = load(xq[r].add(b * QK_K + 64 * c));
                    let x1 = load(xq[r].add(b * QK_K + 64 * c + 32));
                    let (u0, u1) = (_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
                    *i = if VNNI {
                        _mm256_dpwssd_epi32(_mm256_madd_epi16(u0, s0), u1, s1)
                    } else {
                        _mm256_add_epi32(_mm256_madd_epi16(u0, s0), _mm256_madd_epi16(u1, s1))
                    };
                }
                let i4 = hsum4_i32(ia[0], ia[1], ia[2], ia[3]);
                acc = _mm_fmadd_ps(_mm_cvtepi32_ps(i4), sd, acc);
                accm = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_castps_si128(mins)), sm, accm);
            }
        }
        let dst = &mut out[r0..r0 + 4];
        _mm_storeu_ps(dst.as_mut_ptr(), _mm_sub_ps(acc, accm));
    }
}

/// The 128 six-bit quants of half `half` of a Q6_K block at `p`, unsigned (0..64), as
/// four registers of 32: elements 0..32, 32..64, 64..96, 96..128 of the half.
///
/// # Safety
/// `p` valid for a 210-byte block; AVX2.
#[inline(always)]
unsafe fn q6k_half(p: *const u8, half: usize) -> [__m256i; 4] {
    // SAFETY: the caller's contract; offsets within the block.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        let ql0 = load(p.add(64 * half));
        let ql1 = load(p.add(64 * half + 32));
        let qh = load(p.add(128 + 32 * half));
        [
            _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(3))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(12))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_and_si256(qh, _mm256_set1_epi8(48)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(-64))),
            ),
        ]
    }
}

/// For sub-block `t` of 32 (mod 4) of a Q6_K half: shuffles that broadcast i16 lane 2t
/// of a register's lower 128 bits into the lower 128 and lane 2t + 1 into the upper
/// (the two scales of the sub-block's two sixteens).
#[inline(always)]
unsafe fn q6k_scale_picks() -> [__m256i; 4] {
    // SAFETY: register-only intrinsics; AVX by the callers' target features.
    unsafe {
        let mut pick = [_mm256_setzero_si256(); 4];
        for (t, p) in pick.iter_mut().enumerate() {
            let pair = |l: i16| (2 * l) | ((2 * l + 1) << 8);
            let (lo, hi) = (pair(2 * t as i16), pair(2 * t as i16 + 1));
            *p = _mm256_setr_epi16(
                lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi,
            );
        }
        pick
    }
}

/// A Q6_K block's sixteen scales (`sc16`, sign-extended) as the two registers the
/// halves pick from: scales 0..8 in both 128-bit lanes, then 8..16.
#[inline(always)]
unsafe fn q6k_scale_halves(sc16: __m256i) -> [__m256i; 2] {
    // SAFETY: register-only intrinsics; AVX2 by the callers' target features.
    unsafe {
        [
            _mm256_permute2x128_si256::<0x00>(sc16, sc16),
            _mm256_permute2x128_si256::<0x11>(sc16, sc16),
        ]
    }
}

/// # Safety
/// As [`q4k`], for Q6_K.
///
/// `TILED`: as llama.cpp's tiled K-quant matmul (`ggml-cpu/tiled`, taken from 8
/// activation rows on): per 256 the whole integer, times `d_w`, added by FMA with
/// `d_x` (GCC contracts its multiply and add); otherwise as its `vec_dot` (lanes).
#[inline(always)]
unsafe fn q6k<const NR: usize, const TILED: bool>(
    w: &[u8],
    x: &Q8Rows,
    r0: usize,
    out: &mut [f32],
) {
    // SAFETY: as in `q4k`, with 210-byte blocks.
    unsafe {
        let (xq, xd, xb) = rows::<NR>(x, r0);
        let mut acc = [_mm256_setzero_ps(); NR];
        let mut tacc = [0.0f32; NR];
        let pick = q6k_scale_picks();
        for b in 0..x.n / QK_K {
            let p = w.as_ptr().add(b * 210);
            let d = h(p.add(208));
            let sp = p.add(192).cast::<i8>();
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sp.cast::<__m128i>()));
            let mut si = [_mm256_setzero_si256(); NR];
            for (half, scs) in q6k_scale_halves(sc16).into_iter().enumerate() {
                for (t, q) in q6k_half(p, half).into_iter().enumerate() {
                    let blk = 4 * half + t;
                    let s = _mm256_shuffle_epi8(scs, pick[t]);
                    for r in 0..NR {
                        let xv = load(xq[r].add(b * QK_K + 32 * blk));
                        let pr = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), s);
                        si[r] = _mm256_add_epi32(si[r], pr);
                    }
                }
            }
            for r in 0..NR {
                let bs = _mm256_loadu_si256(xb[r].add(b * 16).cast::<__m256i>());
                let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, sc16));
                let lanes = _mm256_sub_epi32(si[r], off);
                let xd = *xd[r].add(b * 8);
                if TILED {
                    tacc[r] = ((hsum_i32(lanes) as f32) * d).mul_add(xd, tacc[r]);
                } else {
                    let dv = _mm256_set1_ps(xd * d);
                    acc[r] = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(lanes), acc[r]);
                }
            }
        }
        for r in 0..NR {
            out[r0 + r] = if TILED { tacc[r] } else { hsum_ps(acc[r]) };
        }
    }
}

/// [`q6k`] `TILED` for four activation rows: the same integers and bits per row, the
/// four rows' sums and FMAs done in the lanes of one register.
///
/// # Safety
/// As [`q6k`], with `x` holding rows r0..r0 + 4.
#[inline(always)]
unsafe fn q6k_four_tiled<const VNNI: bool>(w: &[u8], x: &Q8Rows, r0: usize, out: &mut [f32]) {
    // SAFETY: as in `q6k`, and `out[r0..r0 + 4]` (checked). No closures over
    // intrinsics (they would not inherit the target features).
    unsafe {
        let (xq, xd, xb) = rows::<4>(x, r0);
        let mut tacc = _mm_setzero_ps();
        let pick = q6k_scale_picks();
        for b in 0..x.n / QK_K {
            let p = w.as_ptr().add(b * 210);
            let d = _mm_set1_ps(h(p.add(208)));
            let sp = p.add(192).cast::<i8>();
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sp.cast::<__m128i>()));
            let mut si = [_mm256_setzero_si256(); 4];
            for (half, scs) in q6k_scale_halves(sc16).into_iter().enumerate() {
                for (t, q) in q6k_half(p, half).into_iter().enumerate() {
                    let blk = 4 * half + t;
                    let s = _mm256_shuffle_epi8(scs, pick[t]);
                    for (r, acc) in si.iter_mut().enumerate() {
                        let xv = load(xq[r].add(b * QK_K + 32 * blk));
                        let u = _mm256_maddubs_epi16(q, xv);
                        *acc = if VNNI {
                            _mm256_dpwssd_epi32(*acc, u, s)
                        } else {
                            _mm256_add_epi32(*acc, _mm256_madd_epi16(u, s))
                        };
                    }
                }
            }
            for (r, acc) in si.iter_mut().enumerate() {
                let bs = _mm256_loadu_si256(xb[r].add(b * 16).cast::<__m256i>());
                let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, sc16));
                *acc = _mm256_sub_epi32(*acc, off);
            }
            let xds = _mm_setr_ps(
                *xd[0].add(b * 8),
                *xd[1].add(b * 8),
                *xd[2].add(b * 8),
                *xd[3].add(b * 8),
            );
            let i4 = _mm_cvtepi32_ps(hsum4_i32(si[0], si[1], si[2], si[3]));
            tacc = _mm_fmadd_ps(_mm_mul_ps(i4, d), xds, tacc);
        }
        let dst = &mut out[r0..r0 + 4];
        _mm_storeu_ps(dst.as_mut_ptr(), tacc);
    }
}

/// `out[j × rows + i] = w_j · x[i]` for the weight rows of `row_bytes` in `w`; false
/// (nothing written) unless `ty` is Q4_K or Q6_K, `x` is [`Q8Rows::per_256`] and the
/// sizes agree.
///
/// With `VNNI`, AVX-512 VNNI's `vpdpwssd` adds the scaled sums of the four-row tiles
/// (`madd` then `add`: the same integers in one instruction).
///
/// # Safety
/// AVX2, FMA, F16C, and with `VNNI` AVX-512 VNNI and VL (inlined into
/// `kernels::avx2::dot_matrix{,_vnni}`, which have them).
#[inline(always)]
pub(in crate::ops) unsafe fn matrix<const VNNI: bool>(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    x: &Q8Rows,
    rows: usize,
    out: &mut [f32],
) -> bool {
    let bpb = match ty {
        GgmlType::Q4_K => 144,
        GgmlType::Q6_K => 210,
        _ => return false,
    };
    let n = x.n;
    if !x.per_256
        || row_bytes == 0
        || !row_bytes.is_multiple_of(bpb)
        || row_bytes / bpb * QK_K != n
        || !w.len().is_multiple_of(row_bytes)
        || x.q.len() < rows * n
        || x.d.len() < rows * (n / 32)
        || x.bs.len() < rows * (n / 16)
        || out.len() < rows * (w.len() / row_bytes)
    {
        return false;
    }
    // Rows in whole groups of 4 as llama.cpp's GEMM adds them, the rest as its GEMV
    // (for Q6_K the two are the same).
    macro_rules! tile {
        ($four:expr, $rest2:expr, $rest1:expr) => {
            for (j, (wr, out)) in w
                .chunks_exact(row_bytes)
                .zip(out.chunks_exact_mut(rows.max(1)))
                .enumerate()
            {
                prefetch_weights(w, j * row_bytes, row_bytes);
                let mut r = 0;
                // SAFETY: the caller's target features; sizes checked above.
                unsafe {
                    while r + 4 <= rows {
                        $four(wr, x, r, out);
                        r += 4;
                    }
                    if r + 2 <= rows {
                        $rest2(wr, x, r, out);
                        r += 2;
                    }
                    if r < rows {
                        $rest1(wr, x, r, out);
                    }
                }
            }
        };
    }
    if ty == GgmlType::Q4_K {
        tile!(q4k_four::<VNNI>, q4k::<2>, q4k::<1>);
    } else if rows >= TILED_FROM_ROWS {
        tile!(q6k_four_tiled::<VNNI>, q6k::<2, true>, q6k::<1, true>);
    } else {
        tile!(q6k::<4, false>, q6k::<2, false>, q6k::<1, false>);
    }
    true
}
