//! The places where llama.cpp's CPU backend rounds or approximates beyond plain f32, so
//! that den's default numerics follow the reference it is checked against (issue 12's
//! greedy agreement): a near-tie in a 135 M-parameter model flips on differences of a few
//! units in the fourth decimal, and every later token differs from there.
//!
//! - flash attention below 64 query rows (`ggml_compute_forward_flash_attn_ext_f16_one_
//!   chunk`): Q rounded to f16, scores by ggml's f16 dot ([`dot_f16`]), the V accumulator
//!   kept in f16 and rounded after every key ([`axpy_f16`], [`scale_f16`]);
//! - GELU through a table of f16 results indexed by the f16-rounded input
//!   (`GGML_GELU_FP16`): [`gelu_f16`];
//! - SiLU through ggml's vectorised `expf` (`ggml_v_expf`, AVX-512 form, ~1.5 ulp):
//!   [`silu`];
//! - activations of K-quant weights quantized per 256 with an f32 scale (`block_q8_K`):
//!   [`quantize_row_q8k`].

use std::sync::OnceLock;

use super::half::f32_to_f16;
use super::kernels::{Kernels, QK};
use super::math::Activation;
use crate::quant::f16_to_f32;

/// `x` rounded to the nearest f16, as f32.
#[inline(always)]
pub fn r16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// `x` rounded to f16 in place.
pub fn round_f16(k: Kernels, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if k.is_simd() {
        // SAFETY: `is_simd` means AVX2, FMA and F16C were detected.
        return unsafe { avx2::round_f16(x) };
    }
    let _ = k;
    for v in x.iter_mut() {
        *v = r16(*v);
    }
}

/// `y = f16(x × a + y)` elementwise, one rounding of the fused product (ggml's
/// `ggml_vec_mad_f16`); `y` holds f16 values.
pub fn axpy_f16(k: Kernels, a: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if k.is_simd() {
        // SAFETY: as in `round_f16`.
        return unsafe { avx2::axpy_f16(a, x, y) };
    }
    let _ = k;
    for (y, x) in y.iter_mut().zip(x) {
        *y = r16(x.mul_add(a, *y));
    }
}

/// `y = f16(y × a)` elementwise (ggml's `ggml_vec_scale_f16`).
pub fn scale_f16(k: Kernels, a: f32, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if k.is_simd() {
        // SAFETY: as in `round_f16`.
        return unsafe { avx2::scale_f16(a, y) };
    }
    let _ = k;
    for y in y.iter_mut() {
        *y = r16(*y * a);
    }
}

/// Σ x·y of f16 values (held as f32) in the order of ggml's `ggml_vec_dot_f16` on
/// AVX-512: four 16-lane FMA accumulators over steps of 64, summed pairwise (0+2, 1+3,
/// then the two), then GCC's `_mm512_reduce_add_ps` (halves, quarters, pairs); a tail past
/// the last 64 added one product at a time in f64.
pub fn dot_f16(k: Kernels, x: &[f32], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if k.is_simd() {
        // SAFETY: as in `round_f16`.
        return unsafe { avx2::dot_f16(x, y) };
    }
    let _ = k;
    dot_f16_body(x, y)
}

#[inline(always)]
fn dot_f16_body(x: &[f32], y: &[f32]) -> f32 {
    let len = x.len().min(y.len());
    let n = len / 64 * 64;
    let mut acc = [[0.0f32; 16]; 4];
    for i in (0..n).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, a) in a.iter_mut().enumerate() {
                let e = i + 16 * j + l;
                *a = x[e].mul_add(y[e], *a);
            }
        }
    }
    let mut c = [0.0f32; 16];
    for (l, c) in c.iter_mut().enumerate() {
        *c = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let t3: [f32; 8] = std::array::from_fn(|l| c[l + 8] + c[l]);
    let t6: [f32; 4] = std::array::from_fn(|l| t3[l + 4] + t3[l]);
    let mut r = f64::from((t6[0] + t6[2]) + (t6[1] + t6[3]));
    for e in n..len {
        r += f64::from(x[e] * y[e]);
    }
    r as f32
}

/// GELU (tanh form) as ggml's table gives it: 0 at or below -10, `x` at or above 10, else
/// the entry for the f16 rounding of `x`: GELU of that f16 value, rounded to f16.
#[inline]
pub fn gelu_f16(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16_to_f32(gelu_table()[usize::from(f32_to_f16(x))])
    }
}

/// ggml's `ggml_table_gelu_f16`: for every f16 bit pattern, GELU of it as f16. Built once
/// (128 KiB, ~1 ms), and no `tanh` per element after that. One entry of padding after
/// the last: the SIMD lookup gathers 4 bytes from each entry's start.
fn gelu_table() -> &'static GeluTable {
    static TABLE: OnceLock<Box<GeluTable>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0u16; GELU_TABLE_LEN]);
        for (h, v) in (0..=u16::MAX).zip(t.iter_mut()) {
            *v = f32_to_f16(gelu_f32(f16_to_f32(h)));
        }
        t
    })
}

/// Every f16 bit pattern and the padding entry.
const GELU_TABLE_LEN: usize = (1 << 16) + 1;
type GeluTable = [u16; GELU_TABLE_LEN];

/// ggml's `ggml_gelu_f32` as GCC compiles it: `1 + A·x·x` contracted into one FMA
/// (`-ffp-contract=fast`, GCC's default), which moves some table entries by an f16 step.
#[inline]
fn gelu_f32(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (A * x).mul_add(x, 1.0)).tanh())
}

/// `x / (1 + e^-x)` with ggml's vectorised exp.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(-x))
}

/// ggml's `ggml_v_expf` (AVX-512 form) for one lane: `e^x = 2^n × (1 + p(b))`, `n` the
/// nearest integer to `x / ln 2`, `b` the reduced argument. FMAs as in the vector code.
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // 0x1.715476p+0
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),                  // 0x1.7f7d1cp-20
        (-n).mul_add(f32::from_bits(0x3f31_7200), x), // 0x1.62e4p-1
    );
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010) // 0x1.0e4020p-7
        .mul_add(b, f32::from_bits(0x3d2b_9f17)) // 0x1.573e2ep-5
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)), // 0x1.555e66p-3, 0x1.fffdb6p-2
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0)); // 0x1.ffffecp-1
    scalef(j, n as i32)
}

/// `y = e^(y - max)` in place through ggml's exp, returning their sum in f64: a row of
/// llama.cpp's tiled flash attention (`ggml_vec_soft_max_f32`).
pub fn soft_max(k: Kernels, y: &mut [f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if k.is_simd() {
        // SAFETY: `is_simd` means AVX2, FMA and F16C were detected.
        return unsafe { avx2::soft_max(y, max) };
    }
    let _ = k;
    let mut sum = 0.0f64;
    for v in y {
        *v = expf(*v - max);
        sum += f64::from(*v);
    }
    sum
}

/// `j × 2^n` with one rounding (`_mm512_scalef_ps` for integral `n`).
#[inline(always)]
fn scalef(j: f32, n: i32) -> f32 {
    if (-126..=127).contains(&n) {
        return j * f32::from_bits(((n + 127) as u32) << 23);
    }
    // Outside the normal exponents: through f64, exact, then one rounding to f32.
    (f64::from(j) * 2f64.powi(n)) as f32
}

/// `out = act(g) × u` as ggml computes the gated FFN's activation (`ggml_vec_swiglu_f32`,
/// `ggml_vec_geglu_f32`).
pub fn glu(k: Kernels, act: Activation, g: &[f32], u: &[f32], out: &mut [f32]) {
    match act {
        Activation::GeluTanh => {
            #[cfg(target_arch = "x86_64")]
            if k.is_simd() {
                // SAFETY: `is_simd` means AVX2, FMA and F16C were detected.
                return unsafe { avx2::geglu(gelu_table(), g, u, out) };
            }
            for ((y, g), u) in out.iter_mut().zip(g).zip(u) {
                *y = gelu_f16(*g) * u;
            }
        }
        Activation::Silu => {
            #[cfg(target_arch = "x86_64")]
            if k.is_simd() {
                // SAFETY: `is_simd` means AVX2, FMA and F16C were detected.
                return unsafe { avx2::swiglu(g, u, out) };
            }
            let _ = k;
            for ((y, g), u) in out.iter_mut().zip(g).zip(u) {
                *y = silu(*g) * u;
            }
        }
    }
}

/// ggml's `nearest_int`: round to nearest, ties to even, by the float adder (|f| < 2²²),
/// without a call to `rintf` (this function is not compiled with SSE4.1).
#[inline(always)]
fn nearest_int(f: f32) -> i32 {
    let v = f + 12_582_912.0;
    (v.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// Quantizes one row (a multiple of 256 long) as ggml's `quantize_row_q8_K_ref`, written in
/// den's per-32 layout: every block of a 256 gets the 256's f32 scale `d` and `s = d × Σq`.
pub fn quantize_row_q8k(k: Kernels, x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if k.is_simd() {
        // SAFETY: `is_simd` means AVX2, FMA and F16C were detected.
        return unsafe { avx2::quantize_row_q8k(x, q, d, s) };
    }
    let _ = k;
    quantize_row_q8k_lanes(x, q, d, s);
}

/// [`quantize_row_q8k`] an element at a time: ggml's reference code as written.
fn quantize_row_q8k_lanes(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    const QK_K: usize = 256;
    let per = QK_K / QK;
    for (((x, q), d), s) in x
        .chunks_exact(QK_K)
        .zip(q.chunks_exact_mut(QK_K))
        .zip(d.chunks_exact_mut(per))
        .zip(s.chunks_exact_mut(per))
    {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = *v;
            }
        }
        if amax == 0.0 {
            q.fill(0);
            d.fill(0.0);
            s.fill(0.0);
            continue;
        }
        let iscale = -127.0 / max;
        let scale = 1.0 / iscale;
        for (b, (q, x)) in q.chunks_exact_mut(QK).zip(x.chunks_exact(QK)).enumerate() {
            let mut sum = 0i32;
            for (q, x) in q.iter_mut().zip(x) {
                let v = nearest_int(iscale * x).min(127);
                *q = v as i8;
                sum += v;
            }
            d[b] = scale;
            s[b] = scale * sum as f32;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::kernels::avx2::{hmax, store_quants};

    /// [`super::quantize_row_q8k_lanes`] in registers, the same values: the largest
    /// magnitude is exact in any order and its first element found by comparison; the
    /// products, the ties-to-even rounding (`nearest_int`'s, for these magnitudes) and
    /// the clamp are per element; the sums are of integers.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn quantize_row_q8k(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
        const QK_K: usize = 256;
        let per = QK_K / super::QK;
        let sign = _mm256_set1_ps(-0.0);
        for (((x, q), d), s) in x
            .chunks_exact(QK_K)
            .zip(q.chunks_exact_mut(QK_K))
            .zip(d.chunks_exact_mut(per))
            .zip(s.chunks_exact_mut(per))
        {
            let (xc, _) = x.as_chunks::<8>();
            // SAFETY (every block below): 8 f32s a chunk, 32 bytes a store into `q`'s 256.
            let mut m = _mm256_setzero_ps();
            for c in xc {
                let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
            }
            let amax = hmax(m);
            if amax == 0.0 {
                q.fill(0);
                d.fill(0.0);
                s.fill(0.0);
                continue;
            }
            // The reference keeps the first element of that magnitude, with its sign.
            let want = _mm256_set1_ps(amax);
            let mut max = amax;
            for c in xc {
                let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
                let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
                    _mm256_andnot_ps(sign, v),
                    want,
                ));
                if hit != 0 {
                    max = c[hit.trailing_zeros() as usize];
                    break;
                }
            }
            let iscale = -127.0 / max;
            let scale = 1.0 / iscale;
            let mul = _mm256_set1_ps(iscale);
            let top = _mm256_set1_epi32(127);
            for (b, (q, x)) in q.chunks_exact_mut(32).zip(x.chunks_exact(32)).enumerate() {
                let mut i = [_mm256_setzero_si256(); 4];
                for (k, i) in i.iter_mut().enumerate() {
                    let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * k)) };
                    let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                        _mm256_mul_ps(mul, v),
                    );
                    *i = _mm256_min_epi32(_mm256_cvtps_epi32(r), top);
                }
                // SAFETY: `q` is this 32's bytes.
                let sum = unsafe { store_quants(i, q.as_mut_ptr()) };
                d[b] = scale;
                s[b] = scale * sum as f32;
            }
        }
    }

    /// f32 lanes rounded to f16 and back.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn round8(v: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn round_f16(x: &mut [f32]) {
        let (c, r) = x.as_chunks_mut::<8>();
        for c in c {
            // SAFETY: 8 f32s; unaligned load and store.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), round8(_mm256_loadu_ps(c.as_ptr()))) };
        }
        for v in r {
            *v = super::r16(*v);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn axpy_f16(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let (x, y) = (&x[..n], &mut y[..n]);
        let va = _mm256_set1_ps(a);
        let (xc, xr) = x.as_chunks::<8>();
        let (yc, yr) = y.as_chunks_mut::<8>();
        for (x, y) in xc.iter().zip(yc) {
            // SAFETY: 8 f32s each; unaligned loads and store.
            unsafe {
                let v =
                    _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr()), va, _mm256_loadu_ps(y.as_ptr()));
                _mm256_storeu_ps(y.as_mut_ptr(), round8(v));
            }
        }
        for (x, y) in xr.iter().zip(yr) {
            *y = super::r16(x.mul_add(a, *y));
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn scale_f16(a: f32, y: &mut [f32]) {
        let va = _mm256_set1_ps(a);
        let (yc, yr) = y.as_chunks_mut::<8>();
        for y in yc {
            // SAFETY: 8 f32s; unaligned load and store.
            unsafe {
                let v = _mm256_mul_ps(_mm256_loadu_ps(y.as_ptr()), va);
                _mm256_storeu_ps(y.as_mut_ptr(), round8(v));
            }
        }
        for y in yr {
            *y = super::r16(*y * a);
        }
    }

    /// [`super::expf`] on eight lanes, and which lanes it holds for: those whose `n`
    /// is a normal exponent (the rest, -inf among them, go through the lane code).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn expf8(x: __m256) -> (__m256, i32) {
        let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
        let r = c(0x4b40_0000);
        let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
        );
        let ok = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(n, _mm256_set1_ps(-126.0)),
            _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_set1_ps(127.0)),
        );
        let ni = _mm256_cvtps_epi32(_mm256_and_ps(n, ok));
        let pow = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            ni,
            _mm256_set1_epi32(127),
        )));
        (_mm256_mul_ps(j, pow), _mm256_movemask_ps(ok))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn soft_max(y: &mut [f32], max: f32) -> f64 {
        let vmax = _mm256_set1_ps(max);
        let mut sum = 0.0f64;
        let (c, r) = y.as_chunks_mut::<8>();
        for c in c {
            // SAFETY: 8 f32s; unaligned load and store.
            let x = unsafe { _mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), vmax) };
            let (e, ok) = expf8(x);
            let mut xs = [0.0f32; 8];
            // SAFETY: 8 f32s each; unaligned stores.
            unsafe {
                _mm256_storeu_ps(xs.as_mut_ptr(), x);
                _mm256_storeu_ps(c.as_mut_ptr(), e);
            }
            for (l, (v, x)) in c.iter_mut().zip(xs).enumerate() {
                if ok & (1 << l) == 0 {
                    *v = super::expf(x);
                }
                sum += f64::from(*v);
            }
        }
        for v in r {
            *v = super::expf(*v - max);
            sum += f64::from(*v);
        }
        sum
    }

    /// [`super::dot_f16_body`] in registers: each 16-lane accumulator as two of 8, the
    /// same FMAs and the same reduction order (float addition commutes, so `hi + lo`
    /// is `lo + hi`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn dot_f16(x: &[f32], y: &[f32]) -> f32 {
        let len = x.len().min(y.len());
        let n = len / 64 * 64;
        let (xc, _) = x[..n].as_chunks::<64>();
        let (yc, _) = y[..n].as_chunks::<64>();
        let mut acc = [_mm256_setzero_ps(); 8];
        for (x, y) in xc.iter().zip(yc) {
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: 8 f32s at 8i within each 64-element chunk; unaligned loads.
                unsafe {
                    let xv = _mm256_loadu_ps(x.as_ptr().add(8 * i));
                    let yv = _mm256_loadu_ps(y.as_ptr().add(8 * i));
                    *a = _mm256_fmadd_ps(xv, yv, *a);
                }
            }
        }
        // acc[2j] holds lanes 0..8 of accumulator j, acc[2j + 1] lanes 8..16.
        let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        let t3 = _mm256_add_ps(hi, lo);
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        let u = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
        let s = _mm_add_ss(u, _mm_movehdup_ps(u));
        let mut r = f64::from(_mm_cvtss_f32(s));
        for e in n..len {
            r += f64::from(x[e] * y[e]);
        }
        r as f32
    }

    /// [`super::gelu_f16`]`(g) × u` eight at a time: F16C's round-to-nearest-even
    /// conversion (the software one's), the table gathered, the same ±10 clamps, the same
    /// product.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn geglu(table: &super::GeluTable, g: &[f32], u: &[f32], out: &mut [f32]) {
        let n = out.len().min(g.len()).min(u.len());
        let (gc, gr) = g[..n].as_chunks::<8>();
        let (uc, ur) = u[..n].as_chunks::<8>();
        let (oc, or) = out[..n].as_chunks_mut::<8>();
        let lo = _mm256_set1_ps(-10.0);
        let hi = _mm256_set1_ps(10.0);
        let low16 = _mm256_set1_epi32(0xffff);
        for ((g, u), y) in gc.iter().zip(uc).zip(oc) {
            // SAFETY: 8 f32s each; the gather reads 4 bytes at entry `h` ≤ 65,535 of a
            // table of 65,537 u16s (its type), inside it.
            unsafe {
                let x = _mm256_loadu_ps(g.as_ptr());
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                let idx = _mm256_cvtepu16_epi32(h);
                let t = _mm256_i32gather_epi32::<2>(table.as_ptr().cast::<i32>(), idx);
                let t = _mm256_and_si256(t, low16);
                let t = _mm256_packus_epi32(t, t);
                let t = _mm256_permute4x64_epi64::<0b00_00_10_00>(t);
                let v = _mm256_cvtph_ps(_mm256_castsi256_si128(t));
                // x ≥ 10 keeps x; x ≤ −10 gives 0 (the scalar code's order of tests).
                let v = _mm256_blendv_ps(v, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
                let v = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, lo), v);
                let r = _mm256_mul_ps(v, _mm256_loadu_ps(u.as_ptr()));
                _mm256_storeu_ps(y.as_mut_ptr(), r);
            }
        }
        for ((y, g), u) in or.iter_mut().zip(gr).zip(ur) {
            *y = super::gelu_f16(*g) * u;
        }
    }

    /// The scalar lane code compiled with FMA instructions.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) {
        for ((y, g), u) in out.iter_mut().zip(g).zip(u) {
            *y = super::silu(*g) * u;
        }
    }
}

#[cfg(test)]
mod tests;
