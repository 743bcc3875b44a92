//! Four weight rows by four activation rows of a one-block format (Q8_0, Q4_0, Q4_1,
//! Q5_0) per pass over their blocks, with AVX-512 VNNI: the prefill products.
//!
//! Each (weight row, activation row) pair keeps its own accumulator and takes exactly
//! [`super::fused`]'s steps — per 32, the block's integer lanes converted, times
//! `d_w·d_x` rounded to f32, added by FMA; the min term by a scalar-order FMA; the
//! lanes summed at the end — so a value has the same bits whatever tile computed it
//! (`one_row_matrix_equals_each_weight_row_alone` in `kernels/tests.rs`, its batch of
//! seven rows).
//!
//! What the tile saves is the work around that: a weight block is decoded once for four
//! activation rows and an activation block loaded once for four weight rows; and signed
//! quants enter `vpdpbusd` as `q + BIAS` (unsigned) with `BIAS·Σx` of each lane taken off
//! once per activation block ([`super::Decoder::biased`]) — the same integers as ggml's
//! sign trick (`|q|` times `x` with `q`'s sign), which costs two instructions a pair.

use std::arch::x86_64::*;

use super::super::{Q8Rows, QK};
use super::{Dec, Decoder, hsum, load32};

/// Weight rows and activation rows of a tile.
pub(super) const TILE: usize = 4;

/// `out[m × rows + r0 + r] = w[m] · x[r0 + r]` for m, r < [`TILE`].
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 VNNI and VL (only inlined into `dot_matrix_vnni`);
/// `D::SUB == 1`; each `w[m]` whole blocks of `D` covering `x.n`; `x` holds rows
/// r0..r0 + TILE; `out` at least `(TILE - 1) × rows + r0 + TILE` long.
#[inline(always)]
pub(super) unsafe fn tile<D: Decoder>(
    w: [&[u8]; TILE],
    x: &Q8Rows,
    r0: usize,
    rows: usize,
    out: &mut [f32],
) {
    let n = x.n;
    let nb = n / QK;
    // SAFETY: the caller's contract; every pointer below is inside a block of a weight
    // row or a row of `x` the contract names.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); TILE]; TILE];
        let mut accm = [_mm_setzero_ps(); TILE];
        let xq: [*const u8; TILE] =
            std::array::from_fn(|r| x.q.as_ptr().add((r0 + r) * n).cast::<u8>());
        let xd: [*const f32; TILE] = std::array::from_fn(|r| x.d.as_ptr().add((r0 + r) * nb));
        let xs: [*const f32; TILE] = std::array::from_fn(|r| x.s.as_ptr().add((r0 + r) * nb));
        let bias = _mm256_set1_epi8(D::BIAS as i8);
        for b in 0..nb {
            let mut dw = [Dec::ZERO; TILE];
            for m in 0..TILE {
                dw[m] = D::biased(w[m].as_ptr().add(b * D::BYTES));
            }
            // `d_w·d_x` of the sixteen pairs, four multiplies; each pair then broadcasts
            // its own from memory (a load, where a multiply and a shuffle a pair were
            // most of the work around the product).
            let dws = _mm_setr_ps(dw[0].d, dw[1].d, dw[2].d, dw[3].d);
            let mut scales = [0.0f32; TILE * TILE];
            for (row, xd) in scales.chunks_exact_mut(TILE).zip(xd) {
                _mm_storeu_ps(row.as_mut_ptr(), _mm_mul_ps(dws, _mm_set1_ps(*xd.add(b))));
            }
            if D::MIN {
                let xsv = _mm_setr_ps(*xs[0].add(b), *xs[1].add(b), *xs[2].add(b), *xs[3].add(b));
                for m in 0..TILE {
                    accm[m] = _mm_fmadd_ps(_mm_set1_ps(dw[m].m), xsv, accm[m]);
                }
            }
            for r in 0..TILE {
                let xv = load32(xq[r].add(b * QK));
                // −BIAS × (Σx of each lane's four), the lanes' starting value.
                let base = if D::BIAS == 0 {
                    _mm256_setzero_si256()
                } else {
                    let zero = _mm256_setzero_si256();
                    _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, bias, xv))
                };
                for m in 0..TILE {
                    let lanes = _mm256_dpbusd_epi32(base, dw[m].q, xv);
                    let scale = _mm256_broadcast_ss(&scales[r * TILE + m]);
                    acc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, acc[m][r]);
                }
            }
        }
        for m in 0..TILE {
            let mut ms = [0.0f32; TILE];
            _mm_storeu_ps(ms.as_mut_ptr(), accm[m]);
            for r in 0..TILE {
                out[m * rows + r0 + r] = hsum(acc[m][r]) + ms[r];
            }
        }
    }
}
