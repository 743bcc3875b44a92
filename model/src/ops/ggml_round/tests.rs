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
fn dot_f16_simd_adds_in_the_lane_codes_order() {
    // Values of mixed sign and magnitude, so a different order of additions shows in
    // the last bits; lengths with and without a tail past the last 64.
    let v = |i: usize, s: f32| {
        ((i as f32 * s).sin() * 2f32.powi((i % 13) as i32 - 6)).mul_add(1.0, 0.0)
    };
    for len in [64, 128, 256, 261] {
        let x: Vec<f32> = (0..len).map(|i| r16(v(i, 0.917))).collect();
        let y: Vec<f32> = (0..len).map(|i| r16(v(i + 7, 1.303))).collect();
        let (got, want) = (
            dot_f16(Kernels::detect(), &x, &y),
            dot_f16(Kernels::scalar(), &x, &y),
        );
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "length {len}: {got} vs {want}"
        );
    }
}

#[test]
fn soft_max_simd_equals_the_lane_code() {
    // Ordinary scores, ones far below the maximum (subnormal and zero results, the
    // lane code's path) and masked ones, in a row whose length is not a multiple of 8.
    let mut row: Vec<f32> = (0..203).map(|i| (i as f32 * 0.731).sin() * 12.0).collect();
    row[5] = f32::NEG_INFINITY;
    row[17] = -80.0;
    row[18] = -130.0;
    row[40] = -300.0;
    let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    let mut want = row.clone();
    let want_sum = soft_max(Kernels::scalar(), &mut want, max);
    let mut got = row.clone();
    let got_sum = soft_max(Kernels::detect(), &mut got, max);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "lane {i}: {g} vs {w}");
    }
    assert_eq!(got_sum, want_sum);
    assert_eq!(got[5], 0.0);
    assert!(got[17] > 0.0 && got[17] < 1e-30);
}

/// The SIMD GeGLU gives the scalar one's bits: inputs across the table's range and
/// the clamps (±10 and beyond), with lengths that leave a tail.
#[test]
fn geglu_simd_equals_the_scalar_lookup() {
    let k = Kernels::detect();
    if !k.is_simd() {
        return;
    }
    for len in [8usize, 61, 4096] {
        let g: Vec<f32> = (0..len)
            .map(|i| match i % 97 {
                0 => -10.0,
                1 => 10.0,
                2 => -12.5,
                3 => 11.0,
                4 => -0.0,
                _ => ((i as f32) * 0.731).sin() * 11.0 * ((i % 7) as f32 / 7.0),
            })
            .collect();
        let u: Vec<f32> = (0..len).map(|i| ((i as f32) * 0.37).cos()).collect();
        let mut simd = vec![0.0f32; len];
        glu(k, Activation::GeluTanh, &g, &u, &mut simd);
        let scalar: Vec<u32> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| (gelu_f16(*g) * u).to_bits())
            .collect();
        let simd: Vec<u32> = simd.iter().map(|v| v.to_bits()).collect();
        assert_eq!(simd, scalar, "length {len}");
    }
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
fn f16_steps_agree_on_both_kernel_sets() {
    let (simd, scalar) = (Kernels::detect(), Kernels::scalar());
    let x: Vec<f32> = (0..83).map(|i| 0.1 + i as f32 * 0.013).collect();
    let y: Vec<f32> = (0..83).map(|i| 0.7 - i as f32 * 0.021).collect();
    for k in [simd, scalar] {
        let mut acc = vec![0.0f32; 83];
        axpy_f16(k, 0.37, &x, &mut acc);
        axpy_f16(k, 0.37, &x, &mut acc);
        scale_f16(k, 0.9, &mut acc);
        assert!(acc.iter().all(|v| *v == r16(*v)));
        let mut s = vec![0.0f32; 83];
        axpy_f16(scalar, 0.37, &x, &mut s);
        axpy_f16(scalar, 0.37, &x, &mut s);
        scale_f16(scalar, 0.9, &mut s);
        assert_eq!(acc, s);
        assert_eq!(dot_f16(k, &x, &y), dot_f16(scalar, &x, &y));
        let exact: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        assert!((f64::from(dot_f16(k, &x, &y)) - exact).abs() < 1e-4);
    }
}

#[test]
fn q8k_shares_one_scale_per_256() {
    let x: Vec<f32> = (0..512)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
        .collect();
    let (mut q, mut d, mut s) = (vec![0i8; 512], vec![0.0; 16], vec![0.0; 16]);
    quantize_row_q8k(Kernels::detect(), &x, &mut q, &mut d, &mut s);
    assert!(d[..8].iter().all(|v| *v == d[0]) && d[8..].iter().all(|v| *v == d[8]));
    for (i, (x, q)) in x.iter().zip(&q).enumerate() {
        assert!((f32::from(*q) * d[i / 32] - x).abs() <= d[i / 32].abs() * 0.5 + 1e-6);
    }
}

/// The SIMD q8_K quantizer gives the reference code's bytes and scales: random 256s,
/// one all zero, and 256s whose largest magnitude appears with both signs (the first
/// one's sign sets the scale's) or at the very end.
#[test]
fn q8k_simd_equals_the_reference_order() {
    let k = Kernels::detect();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let mut x: Vec<f32> = (0..256 * 8).map(|_| rnd() * 3.0).collect();
    x[256..512].fill(0.0);
    x[600] = -5.0;
    x[700] = 5.0;
    x[900] = 5.0;
    x[1000] = -5.0;
    x[1279] = -7.25;
    for v in &mut x[1280..1536] {
        *v *= 1e-20;
    }
    let run = |simd: bool| {
        let (mut q, mut d, mut s) = (vec![0i8; x.len()], vec![0.0; 64], vec![0.0; 64]);
        if simd {
            quantize_row_q8k(k, &x, &mut q, &mut d, &mut s);
        } else {
            quantize_row_q8k_lanes(&x, &mut q, &mut d, &mut s);
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        (q, bits(&d), bits(&s))
    };
    assert_eq!(run(true), run(false));
}
