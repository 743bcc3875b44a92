//! The kernels against a scalar transcription of the same llama.cpp order (bit for
//! bit), and that order against the exact dot of the dequantized weights (so the
//! integers are right, not just consistently wrong).

use super::super::kernels::tests::{Rng, random_row};
use super::super::kernels::{Kernels, Q8Rows};
use crate::ggml_type::GgmlType;
use crate::quant::kquants::scale_min;
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
                    let scales: &[u8; 12] = blk[4..16].try_into().unwrap();
                    let (s, m) = scale_min(j, scales);
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
            // With and without VNNI (`vpdpwssd` in the four-row tiles).
            let mut outs = [vec![0.0f32; wrows * batch], vec![0.0f32; wrows * batch]];
            let mut ran = true;
            for (kk, out) in [k, k.without_vnni()].into_iter().zip(&mut outs) {
                ran &= kk.dot_matrix(ty, &w, rb, &x, batch, out);
            }
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
                    for (path, out) in ["vnni", "avx2"].iter().zip(&outs) {
                        if ran {
                            assert_eq!(
                                out[j * batch + i].to_bits(),
                                want.to_bits(),
                                "{ty:?} {path} batch {batch} weight row {j} activation row {i}"
                            );
                        }
                    }
                }
            }
        }
    }
}
