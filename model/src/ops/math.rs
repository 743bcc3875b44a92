//! Row-wise math of a transformer block, in f32, as ggml's CPU ops compute it.

/// `y = x / sqrt(mean(x²) + eps) × w` (ggml's `rms_norm` then `mul`; the sum of squares in
/// f64 like ggml's `ggml_float`).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let sum: f64 = x.iter().map(|v| f64::from(*v * *v)).sum();
    let mean = (sum / x.len().max(1) as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((y, x), w) in y.iter_mut().zip(x).zip(w) {
        *y = (x * scale) * w;
    }
}

/// [`rms_norm`] in place.
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let sum: f64 = x.iter().map(|v| f64::from(*v * *v)).sum();
    let mean = (sum / x.len().max(1) as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (x, w) in x.iter_mut().zip(w) {
        *x = (*x * scale) * w;
    }
}

/// Which elements RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])`: llama.cpp's rope type 0 ("NORM"), used with
    /// llama weights, whose Wq/Wk the GGUF converter permuted for it.
    Norm,
    /// Halves `(x[i], x[i + n/2])`: llama.cpp's NEOX type (Gemma).
    Neox,
}

/// `cos` and `sin` of `pos × base^(-2i/n_rot)` for `i < n_rot/2`, computed as ggml does (the
/// angle multiplied by `base^(-2/n_rot)` step by step, in f32).
pub fn rope_table(pos: u32, base: f32, n_rot: usize, cos: &mut [f32], sin: &mut [f32]) {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for (c, s) in cos.iter_mut().zip(sin.iter_mut()).take(n_rot / 2) {
        *c = theta.cos();
        *s = theta.sin();
        theta *= theta_scale;
    }
}

/// Rotates the first `2 × cos.len()` elements of one head `x` by the table, with the
/// FMAs GCC contracts ggml's `x0*cos - x1*sin` into (the same bits as llama.cpp).
pub fn rope(style: RopeStyle, x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    match style {
        RopeStyle::Norm => {
            for (pair, (c, s)) in x.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
                let (x0, x1) = (pair[0], pair[1]);
                pair[0] = x0.mul_add(*c, -(x1 * s));
                pair[1] = x0.mul_add(*s, x1 * c);
            }
        }
        RopeStyle::Neox => {
            let (a, b) = x[..2 * half].split_at_mut(half);
            for ((x0, x1), (c, s)) in a.iter_mut().zip(b.iter_mut()).zip(cos.iter().zip(sin)) {
                let (v0, v1) = (*x0, *x1);
                *x0 = v0.mul_add(*c, -(v1 * s));
                *x1 = v0.mul_add(*s, v1 * c);
            }
        }
    }
}

/// The gated FFN's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x × sigmoid(x)` (SwiGLU: llama).
    Silu,
    /// GELU, tanh approximation (GeGLU: Gemma).
    GeluTanh,
}

impl Activation {
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::GeluTanh => {
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                const A: f32 = 0.044_715;
                0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + A * x * x)).tanh())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rms() {
        let x = [3.0f32, -4.0, 0.0, 5.0];
        let mut y = [0.0; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut y);
        let rms = (y.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rope_rotates_pairs_by_position() {
        let mut c = [0.0; 2];
        let mut s = [0.0; 2];
        rope_table(3, 10_000.0, 4, &mut c, &mut s);
        assert!((c[0] - 3f32.cos()).abs() < 1e-6);
        assert!((s[1] - (3.0f32 * 0.01).sin()).abs() < 1e-6);
        let mut n = [1.0, 0.0, 1.0, 0.0];
        rope(RopeStyle::Norm, &mut n, &c, &s);
        assert!((n[0] - c[0]).abs() < 1e-6 && (n[1] - s[0]).abs() < 1e-6);
        let mut x = [1.0, 1.0, 0.0, 0.0];
        rope(RopeStyle::Neox, &mut x, &c, &s);
        assert!((x[0] - c[0]).abs() < 1e-6 && (x[2] - s[0]).abs() < 1e-6);
        // Position 0 is the identity.
        rope_table(0, 10_000.0, 4, &mut c, &mut s);
        let mut y = [0.3, -0.2, 0.7, 0.1];
        rope(RopeStyle::Neox, &mut y, &c, &s);
        assert_eq!(y, [0.3, -0.2, 0.7, 0.1]);
    }

    #[test]
    fn activations() {
        assert!((Activation::Silu.apply(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((Activation::GeluTanh.apply(1.0) - 0.841_192).abs() < 1e-5);
        assert_eq!(Activation::GeluTanh.apply(0.0), 0.0);
    }
}
