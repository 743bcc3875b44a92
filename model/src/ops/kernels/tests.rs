use super::*;
use crate::quant::dequantize;

/// xorshift64, for the kernel tests here and in `kdot/`.
pub(in crate::ops) struct Rng(pub(in crate::ops) u64);
impl Rng {
    pub(in crate::ops) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(in crate::ops) fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Random blocks of `ty` with sane f16 scales.
pub(in crate::ops) fn random_row(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let nb = n / ty.block_size();
    let mut out = Vec::new();
    for _ in 0..nb {
        let mut b: Vec<u8> = (0..ty.bytes_per_block())
            .map(|_| rng.next() as u8)
            .collect();
        let h = |rng: &mut Rng| super::super::half::f32_to_f16(rng.f() * 0.05).to_le_bytes();
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => {
                b[..2].copy_from_slice(&h(rng));
            }
            GgmlType::Q4_1 | GgmlType::Q4_K => {
                b[..2].copy_from_slice(&h(rng));
                b[2..4].copy_from_slice(&h(rng));
            }
            GgmlType::Q6_K => b[208..210].copy_from_slice(&h(rng)),
            _ => unreachable!(),
        }
        out.extend(b);
    }
    out
}

#[test]
fn quantized_dot_matches_dequantized_dot() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let n = 512;
    let x: Vec<f32> = (0..n).map(|_| rng.f()).collect();
    for k in [Kernels::scalar(), Kernels::detect()] {
        let mut xq = Q8Rows::default();
        xq.quantize(k, &x, 1, n);
        let (q, d, s) = xq.row(0);
        // The quantized activations are within half a step of x, plus the f16
        // rounding of the scale (at most 2^-11 relative, times |q| <= 127).
        for (i, v) in x.iter().enumerate() {
            let back = f32::from(q[i]) * d[i / QK];
            assert!((back - v).abs() <= d[i / QK] * (0.5 + 127.0 / 2048.0) + 1e-7);
        }
        // d and s are what ggml stores: f16 values.
        for (d, s) in d.iter().zip(s) {
            assert_eq!(f16_round(*d), *d);
            assert_eq!(f16_round(*s), *s);
        }
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let w = random_row(ty, n, &mut rng);
            let mut wf = vec![0.0; n];
            dequantize(ty, &w, n, &mut wf).unwrap();
            let mut u = Unpacked::with_capacity(16);
            assert!(k.unpack(ty, &w, &mut u));
            let mut us = Unpacked::with_capacity(n);
            assert!(Kernels::scalar().unpack(ty, &w, &mut us));
            let nb = n / QK;
            assert_eq!(u.q[..n], us.q[..n], "{ty}");
            assert_eq!(u.d[..nb], us.d[..nb], "{ty}");
            assert_eq!((u.has_min, u.has_sub), (us.has_min, us.has_sub), "{ty}");
            if u.has_min {
                assert_eq!(u.m[..nb], us.m[..nb], "{ty}");
            }
            if u.has_sub {
                assert_eq!(u.sc[..nb], us.sc[..nb], "{ty}");
            }
            // The unpacked row is the dequantized row, value for value.
            for i in 0..n {
                let b = i / QK;
                let sc = if u.has_sub {
                    f32::from(u.sc[b][usize::from(i % QK >= 16)])
                } else {
                    1.0
                };
                let m = if u.has_min { u.m[b] } else { 0.0 };
                let v = u.d[b] * sc * f32::from(u.q[i]) + m;
                assert!((v - wf[i]).abs() <= 1e-6 * (1.0 + wf[i].abs()), "{ty} {i}");
            }
            // Dot with the quantized activation equals the exact dot of the
            // dequantized weights with the dequantized activations...
            let xback: Vec<f32> = (0..n).map(|i| f32::from(q[i]) * d[i / QK]).collect();
            let exact: f64 = wf
                .iter()
                .zip(&xback)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let got = k.dot_q8(&u, q, d, s);
            let mag: f64 = wf
                .iter()
                .zip(&xback)
                .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                .sum();
            assert!(
                (f64::from(got) - exact).abs() <= 1e-5 * mag + 1e-6,
                "{ty} {k:?}: {got} vs {exact}"
            );
            // ...and the scalar path.
            let scalar = Kernels::scalar().dot_q8(&u, q, d, s);
            assert!((got - scalar).abs() <= 1e-5 * mag as f32 + 1e-6, "{ty}");
        }
    }
}

/// The fused kernels of this CPU, or `None` (the test says it skipped) without AVX2.
fn fused_kernels() -> Option<Kernels> {
    let k = Kernels::detect();
    if !k.is_fused() {
        eprintln!("skipped: no AVX2 here");
        return None;
    }
    Some(k)
}

/// `rows` rows of `n` of `x` quantized for the fused dots.
fn q8(k: Kernels, x: &[f32], rows: usize, n: usize) -> Q8Rows {
    let mut q = Q8Rows::default();
    q.quantize(k, x, rows, n);
    q
}

/// Every weight type the fused dots take.
const FUSED_TYPES: [GgmlType; 6] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// The fused multi-row dot: the unpacked dot's value (to f32 rounding), and the same
/// bits for a row whether computed alone or with 6 others.
#[test]
fn fused_rows_match_unpacked_and_ignore_the_batch() {
    let Some(k) = fused_kernels() else {
        return;
    };
    let mut rng = Rng(99);
    let n = 512;
    let rows = 7;
    let x: Vec<f32> = (0..n * rows).map(|_| rng.f()).collect();
    let xq = q8(k, &x, rows, n);
    for ty in FUSED_TYPES {
        let w = random_row(ty, n, &mut rng);
        let mut all = vec![0.0; rows];
        assert!(k.dot_rows(ty, &w, &xq, rows, &mut all));
        let mut u = Unpacked::with_capacity(n);
        assert!(k.unpack(ty, &w, &mut u));
        for i in 0..rows {
            let (q, d, s) = xq.row(i);
            let want = k.with_fused(false).dot_q8(&u, q, d, s);
            assert!(
                (all[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{ty} row {i}"
            );
        }
        let mut one = vec![0.0; 1];
        assert!(k.dot_rows(ty, &w, &xq, 1, &mut one));
        assert_eq!(one[0].to_bits(), all[0].to_bits(), "{ty}");
        let mut three = vec![0.0; 3];
        assert!(k.dot_rows(ty, &w, &xq, 3, &mut three));
        assert_eq!(three, all[..3], "{ty}");
    }
    assert!(!k.dot_rows(GgmlType::F16, &[0; 64], &xq, 1, &mut [0.0]));
}

/// A one-row decode's matrix (weight rows in fours, then the rest) gives each weight
/// row the bits that row gets alone and in a batch, and so does a batch's matrix:
/// with and without VNNI.
#[test]
fn one_row_matrix_equals_each_weight_row_alone() {
    let Some(k) = fused_kernels() else {
        return;
    };
    let mut rng = Rng(7);
    let n = 256;
    let x: Vec<f32> = (0..n * 7).map(|_| rng.f()).collect();
    let (x1, xq, x7) = (q8(k, &x, 1, n), q8(k, &x, 4, n), q8(k, &x, 7, n));
    for ty in FUSED_TYPES {
        let rows: Vec<Vec<u8>> = (0..11).map(|_| random_row(ty, n, &mut rng)).collect();
        let w: Vec<u8> = rows.concat();
        for kk in [k, Kernels { vnni: false, ..k }] {
            let mut got = vec![0.0; rows.len()];
            assert!(kk.dot_matrix(ty, &w, rows[0].len(), &x1, 1, &mut got));
            for (j, r) in rows.iter().enumerate() {
                let mut alone = [0.0];
                assert!(kk.dot_rows(ty, r, &x1, 1, &mut alone));
                let mut batch = [0.0; 4];
                assert!(kk.dot_rows(ty, r, &xq, 4, &mut batch));
                assert_eq!(got[j].to_bits(), alone[0].to_bits(), "{ty} row {j}");
                assert_eq!(got[j].to_bits(), batch[0].to_bits(), "{ty} row {j}");
            }
            // A batch of seven activation rows over the same matrix: each weight
            // row's column has the bits of that row alone.
            let mut got = vec![0.0; rows.len() * 7];
            assert!(kk.dot_matrix(ty, &w, rows[0].len(), &x7, 7, &mut got));
            for (j, r) in rows.iter().enumerate() {
                let mut alone = [0.0; 7];
                assert!(kk.dot_rows(ty, r, &x7, 7, &mut alone));
                let got: Vec<u32> = got[j * 7..(j + 1) * 7]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                let want: Vec<u32> = alone.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{ty} weight row {j} over 7 rows");
            }
        }
    }
}

#[test]
fn f32_dot_axpy_and_f16_rows_agree_across_paths() {
    let mut rng = Rng(77);
    let a: Vec<f32> = (0..259).map(|_| rng.f()).collect();
    let b: Vec<f32> = (0..259).map(|_| rng.f()).collect();
    let s = Kernels::scalar();
    let k = Kernels::detect();
    let want: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    for k in [s, k] {
        assert!((f64::from(k.dot_f32(&a, &b)) - want).abs() < 1e-5);
        let mut y = b.clone();
        k.axpy(0.5, &a, &mut y);
        for i in 0..259 {
            assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
        }
    }
    let xs: Vec<f32> = (0..1000).map(|_| rng.f() * 100.0).collect();
    let mut h1 = vec![0u8; 2000];
    let mut h2 = vec![0u8; 2000];
    s.f32_to_f16(&xs, &mut h1);
    k.f32_to_f16(&xs, &mut h2);
    assert_eq!(h1, h2);
    let mut f1 = vec![0.0; 1000];
    let mut f2 = vec![0.0; 1000];
    s.f16_to_f32(&h1, &mut f1);
    k.f16_to_f32(&h1, &mut f2);
    assert_eq!(f1, f2);
}

#[test]
fn gemm_acc_adds_the_product_on_every_path_and_shape() {
    let mut rng = Rng(91);
    // Rows past a multiple of six and columns past a multiple of 16 take the
    // remainder paths; C starts non-zero (it accumulates).
    for (m, k, n) in [(13, 64, 64), (1, 7, 16), (6, 64, 40), (2, 3, 5)] {
        let a: Vec<f32> = (0..m * k).map(|_| rng.f()).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.f()).collect();
        let c0: Vec<f32> = (0..m * n).map(|_| rng.f()).collect();
        for kern in [Kernels::scalar(), Kernels::detect()] {
            let mut c = c0.clone();
            kern.gemm_acc(&mut c, &a, &b, m, k, n);
            for i in 0..m {
                for j in 0..n {
                    let want = f64::from(c0[i * n + j])
                        + (0..k)
                            .map(|t| f64::from(a[i * k + t]) * f64::from(b[t * n + j]))
                            .sum::<f64>();
                    let got = f64::from(c[i * n + j]);
                    assert!(
                        (got - want).abs() < 1e-5,
                        "{m}x{k}x{n} ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// The SIMD quantizer gives the portable one's bytes and scales, bit for bit: blocks of
/// mixed signs, one all zero, one with a single non-zero, one of exact halves (ties),
/// tiny and huge magnitudes.
#[test]
fn simd_quantize_row_equals_the_portable_one() {
    let k = Kernels::detect();
    if !k.is_simd() {
        return;
    }
    let mut rng = Rng(99);
    let mut x: Vec<f32> = (0..32 * 40).map(|_| rng.f() * 4.0).collect();
    x[32..64].fill(0.0);
    x[64..96].fill(0.0);
    x[70] = -3.5;
    for (i, v) in x[96..128].iter_mut().enumerate() {
        // With 15.875 the largest, 127 / 15.875 = 8: each element scales to k + 0.5.
        *v = (i as f32 - 16.0) * 0.125 + 0.0625;
    }
    x[127] = 15.875;
    for v in &mut x[128..160] {
        *v *= 1e-30;
    }
    for v in &mut x[160..192] {
        *v *= 1e30;
    }
    let nb = x.len() / 32;
    let run = |k: Kernels| {
        let (mut q, mut d, mut s) = (vec![0i8; x.len()], vec![0.0f32; nb], vec![0.0f32; nb]);
        k.quantize_row(&x, &mut q, &mut d, &mut s);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        (q, bits(&d), bits(&s))
    };
    let (simd, scalar) = (run(k), run(Kernels::scalar()));
    assert_eq!(simd.0, scalar.0, "quants");
    assert_eq!(simd.1, scalar.1, "scales");
    assert_eq!(simd.2, scalar.2, "sums");
}
