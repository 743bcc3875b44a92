//! The places where llama.cpp's CPU backend rounds or approximates beyond plain f32, so
//! that den's default numerics follow the reference it is checked against (issue 12's
//! greedy agreement): a near-tie in a 135 M-parameter model flips on differences of a few
//! units in the fourth decimal, and every later token differs from there.
//!
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
/// (128 KiB, ~1 ms), and no `tanh` per element after that.
fn gelu_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|h| f32_to_f16(gelu_f32(f16_to_f32(h))))
            .collect()
    })
}

/// ggml's `ggml_gelu_f32`.
#[inline]
fn gelu_f32(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + A * x * x)).tanh())
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
            let table = gelu_table();
            for ((y, g), u) in out.iter_mut().zip(g).zip(u) {
                *y = if *g <= -10.0 {
                    0.0
                } else if *g >= 10.0 {
                    g * u
                } else {
                    f16_to_f32(table[usize::from(f32_to_f16(*g))]) * u
                };
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

/// Quantizes one row (a multiple of 256 long) as ggml's `quantize_row_q8_K_ref`, written in
/// den's per-32 layout: every block of a 256 gets the 256's f32 scale `d` and `s = d × Σq`.
pub fn quantize_row_q8k(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
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
                let v = ((iscale * x).round_ties_even() as i32).min(127);
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
    /// The scalar lane code compiled with FMA instructions.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) {
        for ((y, g), u) in out.iter_mut().zip(g).zip(u) {
            *y = super::silu(*g) * u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_expf_is_within_two_ulp_of_exp() {
        for i in -2000..2000 {
            let x = i as f32 * 0.043;
            let (got, want) = (expf(x), x.exp());
            let ulp = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulp <= 2, "expf({x}) = {got}, exp = {want}");
        }
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(200.0), f32::INFINITY);
    }

    #[test]
    fn gelu_table_rounds_to_f16() {
        assert_eq!(gelu_f16(-11.0), 0.0);
        assert_eq!(gelu_f16(12.5), 12.5);
        let g = gelu_f16(1.0);
        assert_eq!(g, r16(gelu_f32(1.0)));
        assert!((g - 0.841_192).abs() < 1e-3);
        let x = 0.123_456_7;
        assert_eq!(gelu_f16(x), r16(gelu_f32(r16(x))));
    }

    #[test]
    fn q8k_shares_one_scale_per_256() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
            .collect();
        let (mut q, mut d, mut s) = (vec![0i8; 512], vec![0.0; 16], vec![0.0; 16]);
        quantize_row_q8k(&x, &mut q, &mut d, &mut s);
        assert!(d[..8].iter().all(|v| *v == d[0]) && d[8..].iter().all(|v| *v == d[8]));
        for (i, (x, q)) in x.iter().zip(&q).enumerate() {
            assert!((f32::from(*q) * d[i / 32] - x).abs() <= d[i / 32].abs() * 0.5 + 1e-6);
        }
    }
}
