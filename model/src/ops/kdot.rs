//! Q4_K and Q6_K weight rows times activations quantized as ggml's `block_q8_K` (one f32
//! scale per 256, [`Q8Rows::per_256`]), added in the order llama.cpp's x86 build adds
//! them, so a dot has its bits:
//!
//! - **Q4_K** as the repacked `block_q4_Kx8` kernels (`ggml_gemv_q4_K_8x8_q8_K` and
//!   `ggml_gemm_q4_K_8x8_q8_K`, which llama.cpp uses for every Q4_K matrix whose row count
//!   is a multiple of 8 on an AVX2 CPU): per 256, one integer `Σ_j sc_j·Σ q·x` and one
//!   `Σ_j m_j·Σ x`, each added to its own f32 accumulator by FMA with `d_w·d_x` and
//!   `dmin_w·d_x`; the dot is the first accumulator minus the second.
//! - **Q6_K** below 8 activation rows as `ggml_vec_dot_q6_K_q8_K` (AVX2; x86 has no
//!   repacked Q6_K): eight i32 lanes per 256 (lane k: elements 4k..4k+3 of each 32, times
//!   their 16-element scale, with the 6-bit quants unsigned), minus `32 × Σ sc·bsum` of
//!   the k-th 32 in lane k, converted and added lane by lane by FMA with `d_w·d_x`; the
//!   lanes are summed at the end. From 8 rows on, as llama.cpp's tiled K-quant matmul
//!   (`ggml-cpu/tiled`, its AVX-512 VNNI microkernel): the whole 256 as one integer,
//!   times `d_w`, added by FMA with `d_x`.
//!
//! So, as in llama.cpp, a row's value depends on the batch it is computed in (which group
//! of 4 it falls in for Q4_K, whether the batch has 8 rows for Q6_K); the differences are
//! in the last bits.
//!
//! Keeping the whole 256 in integers is also cheaper than the per-32 float steps the other
//! formats take: one conversion and FMA per 256 instead of eight.
//!
//! Only with [`Q8Rows::per_256`] activations (which the forward pass uses where every
//! weight reading an input is a K-quant); otherwise the per-32 kernels in `kernels/`
//! run, as before.

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use super::super::kernels::{Q8Rows, scale_min_k4};
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

    /// # Safety
    /// AVX2, FMA, F16C; `w` a whole Q4_K row of `x.n`; `x` holds rows r0..r0 + NR.
    ///
    /// `PER_64`: one FMA per two sub-blocks (64 elements) instead of one per 256, as
    /// llama.cpp's GEMM adds for the activation rows in whole groups of 4; the rows after
    /// the last whole group go through its GEMV, one FMA per 256.
    #[inline(always)]
    unsafe fn q4k<const NR: usize, const PER_64: bool>(
        w: &[u8],
        x: &Q8Rows,
        r0: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the caller's contract; every offset below stays inside a 144-byte block
        // of `w` or a 256-element block of a row of `x`.
        unsafe {
            let (xq, xd, xb) = rows::<NR>(x, r0);
            let (mut acc, mut accm) = ([0.0f32; NR], [0.0f32; NR]);
            let m4 = _mm256_set1_epi8(0x0f);
            for b in 0..x.n / QK_K {
                let p = w.as_ptr().add(b * 144);
                let (dd, dmin) = (h(p), h(p.add(2)));
                let scales = &*p.add(4).cast::<[u8; 12]>();
                let mut sc = [_mm256_setzero_si256(); 8];
                let mut mn = [0i32; 8];
                for j in 0..8 {
                    let (s, m) = scale_min_k4(j, scales);
                    sc[j] = _mm256_set1_epi16(i16::from(s));
                    mn[j] = i32::from(m);
                }
                // Σ m_j × Σx over sub-blocks j0..j1 of row r.
                let mins = |r: usize, j0: usize, j1: usize| {
                    let bs = xb[r].add(b * 16);
                    let sum = |j: usize| i32::from(*bs.add(2 * j)) + i32::from(*bs.add(2 * j + 1));
                    (j0..j1)
                        .zip(&mn[j0..j1])
                        .map(|(j, m)| m * sum(j))
                        .sum::<i32>()
                };
                let xds: [f32; NR] = std::array::from_fn(|r| *xd[r].add(b * 8));
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
                    if PER_64 {
                        for r in 0..NR {
                            let i = hsum_i32(ia[r]);
                            ia[r] = _mm256_setzero_si256();
                            acc[r] = (i as f32).mul_add(dd * xds[r], acc[r]);
                            let m = mins(r, 2 * c, 2 * c + 2);
                            accm[r] = (m as f32).mul_add(dmin * xds[r], accm[r]);
                        }
                    }
                }
                if !PER_64 {
                    for r in 0..NR {
                        acc[r] = (hsum_i32(ia[r]) as f32).mul_add(dd * xds[r], acc[r]);
                        accm[r] = (mins(r, 0, 8) as f32).mul_add(dmin * xds[r], accm[r]);
                    }
                }
            }
            for r in 0..NR {
                out[r0 + r] = acc[r] - accm[r];
            }
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
            let m4 = _mm256_set1_epi8(0x0f);
            let m3 = _mm256_set1_epi8(3);
            for b in 0..x.n / QK_K {
                let p = w.as_ptr().add(b * 210);
                let d = h(p.add(208));
                let sp = p.add(192).cast::<i8>();
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sp.cast::<__m128i>()));
                let mut si = [_mm256_setzero_si256(); NR];
                for half in 0..2 {
                    let ql0 = load(p.add(64 * half));
                    let ql1 = load(p.add(64 * half + 32));
                    let qh = load(p.add(128 + 32 * half));
                    let qs = [
                        _mm256_or_si256(
                            _mm256_and_si256(ql0, m4),
                            _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3)),
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
                    ];
                    for (t, q) in qs.into_iter().enumerate() {
                        let blk = 4 * half + t;
                        let s = _mm256_set_m128i(
                            _mm_set1_epi16(i16::from(*sp.add(2 * blk + 1))),
                            _mm_set1_epi16(i16::from(*sp.add(2 * blk))),
                        );
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

    /// `out[j × rows + i] = w_j · x[i]` for the weight rows of `row_bytes` in `w`; false
    /// (nothing written) unless `ty` is Q4_K or Q6_K, `x` is [`Q8Rows::per_256`] and the
    /// sizes agree.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::ops) fn matrix(
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
                for (wr, out) in w
                    .chunks_exact(row_bytes)
                    .zip(out.chunks_exact_mut(rows.max(1)))
                {
                    let mut r = 0;
                    // SAFETY: this function's target features; sizes checked above.
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
            tile!(q4k::<4, true>, q4k::<2, false>, q4k::<1, false>);
        } else if rows >= TILED_FROM_ROWS {
            tile!(q6k::<4, true>, q6k::<2, true>, q6k::<1, true>);
        } else {
            tile!(q6k::<4, false>, q6k::<2, false>, q6k::<1, false>);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    //! The kernels against a scalar transcription of the same llama.cpp order (bit for
    //! bit), and that order against the exact dot of the dequantized weights (so the
    //! integers are right, not just consistently wrong).

    use super::super::kernels::tests::{Rng, random_row};
    use super::super::kernels::{Kernels, Q8Rows, scale_min_k4};
    use crate::ggml_type::GgmlType;
    use crate::quant::{dequantize, f16_to_f32};

    /// Block `b`'s 256 quants (unsigned) and their scale index per 16 (Q6_K) or 32 (Q4_K).
    fn quants(ty: GgmlType, blk: &[u8]) -> [i32; 256] {
        let mut q = [0i32; 256];
        if ty == GgmlType::Q4_K {
            for c in 0..4 {
                for l in 0..32 {
                    q[64 * c + l] = i32::from(blk[16 + 32 * c + l] & 15);
                    q[64 * c + 32 + l] = i32::from(blk[16 + 32 * c + l] >> 4);
                }
            }
        } else {
            for h in 0..2 {
                for l in 0..32 {
                    let (ql, qh) = (&blk[64 * h..], blk[128 + 32 * h + l]);
                    q[128 * h + l] = i32::from((ql[l] & 15) | ((qh & 3) << 4));
                    q[128 * h + l + 32] = i32::from((ql[l + 32] & 15) | (((qh >> 2) & 3) << 4));
                    q[128 * h + l + 64] = i32::from((ql[l] >> 4) | (((qh >> 4) & 3) << 4));
                    q[128 * h + l + 96] = i32::from((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4));
                }
            }
        }
        q
    }

    fn h(b: &[u8]) -> f32 {
        f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
    }

    /// llama.cpp's order for one weight row and one activation row of a batch of
    /// `batch` whose index is `i` (see the module comment).
    fn reference(ty: GgmlType, w: &[u8], x: &Q8Rows, i: usize, batch: usize) -> f32 {
        let n = x.n;
        let xq = &x.q[i * n..(i + 1) * n];
        let in_group = i < batch - batch % 4;
        let (mut acc, mut accm, mut lanes_acc) = (0.0f32, 0.0f32, [0.0f32; 8]);
        for b in 0..n / 256 {
            let xd = x.d[i * n / 32 + b * 8];
            let xs = &xq[b * 256..(b + 1) * 256];
            let dot = |q: &[i32; 256], lo: usize, hi: usize| -> i32 {
                (lo..hi).map(|e| q[e] * i32::from(xs[e])).sum()
            };
            let xsum = |lo: usize, hi: usize| -> i32 { (lo..hi).map(|e| i32::from(xs[e])).sum() };
            if ty == GgmlType::Q4_K {
                let blk = &w[b * 144..(b + 1) * 144];
                let (dd, dmin) = (h(blk), h(&blk[2..]));
                let q = quants(ty, blk);
                let sm: Vec<(i32, i32)> = (0..8)
                    .map(|j| {
                        let (s, m) = scale_min_k4(j, &blk[4..16]);
                        (i32::from(s), i32::from(m))
                    })
                    .collect();
                let part = |j0: usize, j1: usize| -> (i32, i32) {
                    (j0..j1).fold((0, 0), |(a, m), j| {
                        let (lo, hi) = (32 * j, 32 * j + 32);
                        (a + sm[j].0 * dot(&q, lo, hi), m + sm[j].1 * xsum(lo, hi))
                    })
                };
                let steps: &[(usize, usize)] = if in_group {
                    &[(0, 2), (2, 4), (4, 6), (6, 8)]
                } else {
                    &[(0, 8)]
                };
                for &(j0, j1) in steps {
                    let (a, m) = part(j0, j1);
                    acc = (a as f32).mul_add(dd * xd, acc);
                    accm = (m as f32).mul_add(dmin * xd, accm);
                }
            } else {
                let blk = &w[b * 210..(b + 1) * 210];
                let d = h(&blk[208..]);
                let sc = |e: usize| i32::from(blk[192 + e / 16] as i8);
                let q = quants(ty, blk);
                let mut lanes = [0i32; 8];
                for (k, lane) in lanes.iter_mut().enumerate() {
                    for blk32 in 0..8 {
                        let lo = 32 * blk32 + 4 * k;
                        *lane += sc(lo) * dot(&q, lo, lo + 4);
                    }
                    let (a, c) = (32 * k, 32 * k + 16);
                    *lane -= 32 * (sc(a) * xsum(a, a + 16) + sc(c) * xsum(c, c + 16));
                }
                if batch >= 8 {
                    let s: i32 = lanes.iter().sum();
                    acc = ((s as f32) * d).mul_add(xd, acc);
                } else {
                    for (a, l) in lanes_acc.iter_mut().zip(lanes) {
                        *a = (xd * d).mul_add(l as f32, *a);
                    }
                }
            }
        }
        if ty == GgmlType::Q4_K {
            acc - accm
        } else if batch >= 8 {
            acc
        } else {
            let a = lanes_acc;
            ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
        }
    }

    #[test]
    fn k_quant_dots_add_in_llama_cpps_order() {
        let k = Kernels::detect();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let n = 512;
            let wrows = 3;
            let w: Vec<u8> = (0..wrows)
                .flat_map(|_| random_row(ty, n, &mut rng))
                .collect();
            let rb = w.len() / wrows;
            for batch in 1..=9 {
                let xf: Vec<f32> = (0..batch * n).map(|_| rng.f() * 3.0).collect();
                let mut x = Q8Rows::default();
                x.quantize_as(k, &xf, batch, n, true);
                let mut out = vec![0.0f32; wrows * batch];
                let ran = k.dot_matrix(ty, &w, rb, &x, batch, &mut out);
                for j in 0..wrows {
                    let wr = &w[j * rb..(j + 1) * rb];
                    let mut deq = vec![0.0f32; n];
                    dequantize(ty, wr, n, &mut deq).unwrap();
                    for i in 0..batch {
                        let want = reference(ty, wr, &x, i, batch);
                        // The order transcribed right: within rounding of the exact dot.
                        let exact: f64 = (0..n)
                            .map(|e| {
                                f64::from(deq[e])
                                    * f64::from(x.q[i * n + e])
                                    * f64::from(x.d[(i * n + e) / 32])
                            })
                            .sum();
                        let scale: f64 = (0..n)
                            .map(|e| f64::from(deq[e]).abs() * f64::from(xf[i * n + e]).abs())
                            .sum();
                        assert!(
                            (f64::from(want) - exact).abs() <= 1e-5 * scale.max(1.0),
                            "{ty:?} batch {batch} row {i}: {want} vs exact {exact}"
                        );
                        if ran {
                            assert_eq!(
                                out[j * batch + i].to_bits(),
                                want.to_bits(),
                                "{ty:?} batch {batch} weight row {j} activation row {i}"
                            );
                        }
                    }
                }
            }
        }
    }
}
