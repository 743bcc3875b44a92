//! Paged attention against a plain f64 softmax over the same f16 K/V rows, and the tiled
//! path's promise that how rows fall into tiles (batch composition, threads) changes no
//! bit.

use std::sync::Mutex;

use den_model::kv::{HostKvPages, KvLayout, KvPages, Sequence};
use den_model::ops::attention::{AttnPath, AttnShape, Query, attention};
use den_model::ops::matmul::ThreadScratch;
use den_model::ops::pool::Pool;
use den_model::ops::{Kernels, f32_to_f16};
use den_model::quant::f16_to_f32;

use crate::forward::Rng;

fn random(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|_| rng.below(2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// Writes `k` and `v` (`len × kv_dim` values each, rounded to f16) as layer `layer`'s K
/// and V of positions `0..len` of `seq`, where the forward pass writes them.
pub(crate) fn write_kv(host: &mut HostKvPages, layer: usize, seq: &Sequence, k: &[f32], v: &[f32]) {
    let layout = host.layout();
    let kvd = layout.kv_dim();
    let (ko, vo) = (layout.k_offset(layer), layout.v_offset(layer));
    let ps = host.page_size();
    for (t, (kt, vt)) in k.chunks_exact(kvd).zip(v.chunks_exact(kvd)).enumerate() {
        let (p, slot) = seq.locate(t as u32, ps).unwrap();
        let row = host.row_mut(p, slot).unwrap();
        for (j, (kx, vx)) in kt.iter().zip(vt).enumerate() {
            row[ko + 2 * j..ko + 2 * j + 2].copy_from_slice(&f32_to_f16(*kx).to_le_bytes());
            row[vo + 2 * j..vo + 2 * j + 2].copy_from_slice(&f32_to_f16(*vx).to_le_bytes());
        }
    }
}

struct Fixture {
    layout: KvLayout,
    host: HostKvPages,
    seqs: Vec<Sequence>,
    /// Per sequence: K and V as the f32 values of the stored f16s, `len × kv_dim`.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

const PAGE: u32 = 16;
const LAYER: usize = 1;

fn fixture(lens: &[u32], nkv: usize, hd: usize, rng: &mut Rng) -> Fixture {
    let layout = KvLayout {
        layers: 2,
        kv_heads: nkv as u32,
        head_dim: hd as u32,
    };
    let pages: u32 = lens.iter().map(|l| l.div_ceil(PAGE)).sum();
    let mut host = HostKvPages::new(layout, PAGE, pages + 3).unwrap();
    let kvd = nkv * hd;
    let (mut seqs, mut ks, mut vs) = (vec![], vec![], vec![]);
    // A spare page taken first and given back: the sequences' pages are not in order.
    let mut spare = Sequence::new();
    host.reserve(&mut spare, 2 * PAGE).unwrap();
    for &len in lens {
        let mut seq = Sequence::new();
        host.reserve(&mut seq, len).unwrap();
        seq.set_len(len);
        // The values as the f16 cache holds them, so the reference sees what attention reads.
        let f16 = |x: f32| f16_to_f32(f32_to_f16(x));
        let k: Vec<f32> = random(len as usize * kvd, rng)
            .into_iter()
            .map(f16)
            .collect();
        let v: Vec<f32> = random(len as usize * kvd, rng)
            .into_iter()
            .map(f16)
            .collect();
        write_kv(&mut host, LAYER, &seq, &k, &v);
        seqs.push(seq);
        ks.push(k);
        vs.push(v);
        host.release(&mut spare);
        host.reserve(&mut spare, PAGE).unwrap();
    }
    Fixture {
        layout,
        host,
        seqs,
        k: ks,
        v: vs,
    }
}

/// softmax(q · K) · V in f64 for one query head.
#[allow(clippy::too_many_arguments)]
fn reference(
    fx: &Fixture,
    s: usize,
    pos: u32,
    window: Option<u32>,
    q: &[f32],
    kv_head: usize,
    hd: usize,
    nkv: usize,
) -> Vec<f64> {
    let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let kvd = nkv * hd;
    let at = |t: u32| t as usize * kvd + kv_head * hd;
    let scores: Vec<f64> = (lo..=pos)
        .map(|t| {
            (0..hd)
                .map(|d| f64::from(q[d]) * f64::from(fx.k[s][at(t) + d]))
                .sum()
        })
        .collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
    let sum: f64 = p.iter().sum();
    (0..hd)
        .map(|d| {
            (lo..=pos)
                .zip(&p)
                .map(|(t, p)| p * f64::from(fx.v[s][at(t) + d]))
                .sum::<f64>()
                / sum
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn run(
    fx: &Fixture,
    threads: usize,
    rows: &[(usize, u32)],
    shape: AttnShape,
    q: &[f32],
) -> Vec<f32> {
    let mut pool = Pool::new(threads).unwrap();
    let tls: Vec<_> = (0..threads)
        .map(|_| Mutex::new(ThreadScratch::default()))
        .collect();
    let mut out = vec![0f32; q.len()];
    let query = |i: usize| Query {
        pos: rows[i].1,
        seq: &fx.seqs[rows[i].0],
    };
    attention(
        &mut pool,
        &tls,
        Kernels::detect(),
        &fx.host,
        rows.len(),
        &query,
        shape,
        q,
        &mut out,
    )
    .unwrap();
    out
}

/// A batch as the worker builds one: a 90-row prefill chunk of one sequence deep in its
/// context (two row tiles, several key tiles, the chunk's own causal triangle), a late and
/// an early row of a second sequence, and a decode row of a third; with and without a
/// sliding window.
///
/// - [`AttnPath::F32`]: every query head within 1e-5 of the f64 softmax; 1 and 3 threads,
///   and each row computed alone, give the same bits as the whole batch.
/// - [`AttnPath::Tiled`]: the rows of sequences with several rows are the F32 path's bits;
///   the lone decode row is the one-row path's bits for that row alone (within 2e-3 of
///   f64: its V sum is kept in f16).
#[test]
fn tiled_attention_matches_f64_and_tiling_changes_no_bit() {
    let mut rng = Rng::new(17);
    let (nh, nkv, hd) = (6usize, 2usize, 64usize);
    let fx = fixture(&[300, 210, 150], nkv, hd, &mut rng);
    let mut rows: Vec<(usize, u32)> = (200..290).map(|p| (0, p)).collect();
    rows.push((1, 209));
    rows.push((1, 5));
    rows.push((2, 149));
    let lone = rows.len() - 1;
    let qd = nh * hd;
    let q = random(rows.len() * qd, &mut rng);
    let close = |got: &[f32], i: usize, window, tol: f64| {
        let (s, pos) = rows[i];
        for h in 0..nh {
            let qh = &q[i * qd + h * hd..i * qd + (h + 1) * hd];
            let want = reference(&fx, s, pos, window, qh, h / (nh / nkv), hd, nkv);
            let g = &got[i * qd + h * hd..i * qd + (h + 1) * hd];
            for (d, (g, w)) in g.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() < tol,
                    "window {window:?}, row {i} (pos {pos}), head {h}, dim {d}: {g} vs {w}"
                );
            }
        }
    };
    for window in [None, Some(70u32)] {
        let shape = |path| AttnShape {
            n_head: nh,
            n_kv: nkv,
            head_dim: hd,
            k_off: fx.layout.k_offset(LAYER),
            v_off: fx.layout.v_offset(LAYER),
            window,
            path,
        };
        let got = run(&fx, 1, &rows, shape(AttnPath::F32), &q);
        for i in 0..rows.len() {
            close(&got, i, window, 1e-5);
        }
        assert!(
            run(&fx, 3, &rows, shape(AttnPath::F32), &q) == got,
            "window {window:?}: three threads changed the result"
        );
        for (i, row) in rows.iter().enumerate() {
            let alone = run(
                &fx,
                1,
                &[*row],
                shape(AttnPath::F32),
                &q[i * qd..(i + 1) * qd],
            );
            assert!(
                alone[..] == got[i * qd..(i + 1) * qd],
                "window {window:?}: row {i} alone differs from the batch"
            );
        }
        for threads in [1, 3] {
            let tiled = run(&fx, threads, &rows, shape(AttnPath::Tiled), &q);
            assert!(
                tiled[..lone * qd] == got[..lone * qd],
                "window {window:?}, {threads} threads: the tiled path's multi-row sequences are not the f32 path's bits"
            );
            let one_row = run(
                &fx,
                1,
                &[rows[lone]],
                shape(AttnPath::OneRow),
                &q[lone * qd..],
            );
            assert!(
                tiled[lone * qd..] == one_row[..],
                "window {window:?}, {threads} threads: the lone row is not the one-row path's bits"
            );
            assert!(
                tiled[lone * qd..] != got[lone * qd..],
                "the lone row took the f32 path"
            );
            close(&tiled, lone, window, 2e-3);
        }
    }
}

/// 64 decode rows of 64 sequences at 1,024 tokens of context each, in SmolLM2's row
/// layout (30 layers: rows 23 KB apart), in one batch of 64 rows (as a worker's step of
/// 64 decodes takes it): milliseconds per layer, with every row as a tile of the f32 path
/// ([`AttnPath::F32`]), as the quantized mode runs them ([`AttnPath::Tiled`]: each lone
/// row on the one-row path) and as a batch under 64 rows would ([`AttnPath::OneRow`]).
/// `cargo test --release -p den-model --test it -- --ignored --nocapture
/// bench_tiled_attention_decode_rows`
#[test]
#[ignore = "a measurement, not a check; run with --release"]
fn bench_tiled_attention_decode_rows() {
    let (nh, nkv, hd, layers, ctx, seqs) = (9usize, 3usize, 64usize, 30u32, 1024u32, 64usize);
    let layout = KvLayout {
        layers,
        kv_heads: nkv as u32,
        head_dim: hd as u32,
    };
    let mut host = HostKvPages::new(layout, PAGE, seqs as u32 * ctx.div_ceil(PAGE)).unwrap();
    let mut rng = Rng::new(5);
    let (ko, vo) = (layout.k_offset(LAYER), layout.v_offset(LAYER));
    let kv = random(ctx as usize * nkv * hd, &mut rng);
    let mut all = Vec::new();
    for _ in 0..seqs {
        let mut seq = Sequence::new();
        host.reserve(&mut seq, ctx).unwrap();
        seq.set_len(ctx);
        write_kv(&mut host, LAYER, &seq, &kv, &kv);
        all.push(seq);
    }
    let q = random(seqs * nh * hd, &mut rng);
    let mut pool = Pool::new(1).unwrap();
    let tls = [Mutex::new(ThreadScratch::default())];
    let mut out = vec![0f32; q.len()];
    let query = |i: usize| Query {
        pos: ctx - 1,
        seq: &all[i],
    };
    for path in [AttnPath::F32, AttnPath::Tiled, AttnPath::OneRow] {
        let shape = AttnShape {
            n_head: nh,
            n_kv: nkv,
            head_dim: hd,
            k_off: ko,
            v_off: vo,
            window: None,
            path,
        };
        let mut times = Vec::new();
        for _ in 0..7 {
            let t = std::time::Instant::now();
            attention(
                &mut pool,
                &tls,
                Kernels::detect(),
                &host,
                seqs,
                &query,
                shape,
                &q,
                &mut out,
            )
            .unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        eprintln!(
            "{path:?} attention, {seqs} decode rows at {ctx} tokens of context, one thread: median {:.2} ms a layer",
            times[times.len() / 2]
        );
    }
}
