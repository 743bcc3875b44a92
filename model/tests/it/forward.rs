//! The forward pass on tiny synthetic models with the real architectures' shapes (llama
//! as SmolLM2: GQA, Q4_1 matrices, Q8_0 tied embeddings; gemma3: one KV head, Q5_0, Q8_0,
//! Q4_K, Q6_K, q/k norms, post norms, sliding-window and global layers), built in memory
//! as GGUF with seeded random weights, against a naive reference written here: weights
//! dequantized to f32, contiguous K/V (rounded to f16, as the cache stores them), every
//! position recomputed from scratch, a plain softmax over a mask.
//!
//! Tolerances: the paged forward in exact mode ([`MatmulMode::Exact`]) is within 1e-4 of
//! the reference, relative to the largest reference logit (at least 1): the two differ by
//! f32 summation order, and rarely by one f16 rounding of a K/V value that lands on the
//! other side of a rounding boundary. Paging (page sizes 1, 3, 16), batch splitting,
//! thread counts, token-by-token decoding and batching of several sequences change
//! nothing: those are compared bit for bit. The quantized mode (8-bit activations) is
//! within 2e-2 of the reference, same measure (measured: 8.6e-3 llama, 3.1e-3 gemma3;
//! exact mode 1.9e-7 and 2.3e-6).

use den_model::arch::{MatmulMode, Model};
use den_model::gguf::GgufFile;
use den_model::kv::{HostKvPages, KvLayout, Sequence};
use den_model::ops::f32_to_f16;
use den_model::quant::{dequantize, f16_to_f32};
use den_model::{BatchRow, GgmlType, ModelError, Runner, RunnerOptions};

use crate::gguf_reader::{Writer, f32_bytes, gstr};

// --- seeded random weights ----------------------------------------------------------------

pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub(crate) fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n)) as u32
    }
}

fn half(x: f32) -> [u8; 2] {
    f32_to_f16(x).to_le_bytes()
}

/// `rows × cols` random weights of `ty`, values of about `std` in magnitude.
fn random_tensor(ty: GgmlType, rows: usize, cols: usize, std: f32, rng: &mut Rng) -> Vec<u8> {
    let blocks = rows * cols / ty.block_size();
    let mut out = Vec::new();
    for _ in 0..blocks {
        let mut b: Vec<u8> = (0..ty.bytes_per_block())
            .map(|_| rng.next() as u8)
            .collect();
        let jitter = |rng: &mut Rng| 1.0 + 0.3 * rng.f();
        match ty {
            GgmlType::Q8_0 => b[..2].copy_from_slice(&half(std / 74.0 * jitter(rng))),
            GgmlType::Q4_0 => b[..2].copy_from_slice(&half(std / 4.6 * jitter(rng))),
            GgmlType::Q5_0 => b[..2].copy_from_slice(&half(std / 9.2 * jitter(rng))),
            GgmlType::Q4_1 => {
                let d = std / 4.6 * jitter(rng);
                b[..2].copy_from_slice(&half(d));
                b[2..4].copy_from_slice(&half(-7.5 * d * (1.0 + 0.02 * rng.f())));
            }
            GgmlType::Q4_K => {
                let d = std / (31.5 * 4.6) * jitter(rng);
                b[..2].copy_from_slice(&half(d));
                b[2..4].copy_from_slice(&half(7.5 * d));
            }
            GgmlType::Q6_K => b[208..210].copy_from_slice(&half(std / (74.0 * 18.5) * jitter(rng))),
            GgmlType::F32 => {
                return (0..rows * cols)
                    .flat_map(|_| (std * rng.f()).to_le_bytes())
                    .collect();
            }
            _ => panic!("no generator for {ty}"),
        }
        out.extend(b);
    }
    out
}

// --- tiny models --------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub arch: &'static str,
    pub layers: usize,
    pub embd: usize,
    pub ff: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub ctx: u32,
    pub window: Option<u32>,
    /// Types of: q, k, v, o, gate, up, down, embeddings.
    pub types: [GgmlType; 8],
}

/// SmolLM2's architecture at toy size.
pub(crate) fn tiny_llama() -> Shape {
    let q = GgmlType::Q4_1;
    Shape {
        arch: "llama",
        layers: 2,
        embd: 64,
        ff: 96,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        vocab: 40,
        ctx: 64,
        window: None,
        types: [q, q, q, q, q, q, q, GgmlType::Q8_0],
    }
}

/// Gemma 3's architecture at toy size: 6 layers (layer 5 global), window 4.
pub(crate) fn tiny_gemma(layers: usize) -> Shape {
    use GgmlType::*;
    Shape {
        arch: "gemma3",
        layers,
        embd: 64,
        ff: 256,
        heads: 4,
        kv_heads: 1,
        head_dim: 64,
        vocab: 48,
        ctx: 64,
        window: Some(4),
        types: [Q5_0, Q5_0, Q8_0, Q4_K, Q5_0, Q5_0, Q6_K, Q8_0],
    }
}

fn u32_kv(w: Writer, key: &str, v: usize) -> Writer {
    w.kv(key, 4, &(v as u32).to_le_bytes())
}

fn f32_kv(w: Writer, key: &str, v: f32) -> Writer {
    w.kv(key, 6, &v.to_le_bytes())
}

/// The GGUF bytes of a model of `shape` with weights from `seed`; `edit` may change the
/// writer before tensors are added (tests of errors).
pub(crate) fn build(shape: &Shape, seed: u64) -> Vec<u8> {
    writer(shape, seed).bytes()
}

fn writer(s: &Shape, seed: u64) -> Writer {
    let mut rng = Rng::new(seed);
    let a = s.arch;
    let gemma = a == "gemma3";
    let mut w = Writer::new().kv("general.architecture", 8, &gstr(a));
    w = u32_kv(w, &format!("{a}.block_count"), s.layers);
    w = u32_kv(w, &format!("{a}.context_length"), s.ctx as usize);
    w = u32_kv(w, &format!("{a}.embedding_length"), s.embd);
    w = u32_kv(w, &format!("{a}.feed_forward_length"), s.ff);
    w = u32_kv(w, &format!("{a}.attention.head_count"), s.heads);
    w = u32_kv(w, &format!("{a}.attention.head_count_kv"), s.kv_heads);
    w = f32_kv(
        w,
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        if gemma { 1e-6 } else { 1e-5 },
    );
    w = f32_kv(
        w,
        &format!("{a}.rope.freq_base"),
        if gemma { 1e6 } else { 1e5 },
    );
    if gemma {
        w = u32_kv(w, &format!("{a}.attention.key_length"), s.head_dim);
        w = u32_kv(w, &format!("{a}.attention.value_length"), s.head_dim);
        w = u32_kv(
            w,
            &format!("{a}.attention.sliding_window"),
            s.window.unwrap_or(0) as usize,
        );
    } else {
        w = u32_kv(w, &format!("{a}.rope.dimension_count"), s.head_dim);
    }
    let [tq, tk, tv, to, tg, tu, td, te] = s.types;
    let (e, qd, kvd) = (s.embd, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let norm = |n: usize, rng: &mut Rng| -> Vec<u8> {
        f32_bytes(&(0..n).map(|_| 1.0 + 0.2 * rng.f()).collect::<Vec<_>>())
    };
    let mat = |ty, cols: usize, rows: usize, rng: &mut Rng| {
        random_tensor(ty, rows, cols, 1.0 / (cols as f32).sqrt(), rng)
    };
    w = w.tensor(
        "token_embd.weight",
        &[e as u64, s.vocab as u64],
        te,
        random_tensor(te, s.vocab, e, 1.0, &mut rng),
    );
    w = w.tensor(
        "output_norm.weight",
        &[e as u64],
        GgmlType::F32,
        norm(e, &mut rng),
    );
    for l in 0..s.layers {
        let n = |x: &str| format!("blk.{l}.{x}.weight");
        let d2 = |c: usize, r: usize| [c as u64, r as u64];
        w = w.tensor(
            &n("attn_norm"),
            &[e as u64],
            GgmlType::F32,
            norm(e, &mut rng),
        );
        w = w.tensor(&n("attn_q"), &d2(e, qd), tq, mat(tq, e, qd, &mut rng));
        w = w.tensor(&n("attn_k"), &d2(e, kvd), tk, mat(tk, e, kvd, &mut rng));
        w = w.tensor(&n("attn_v"), &d2(e, kvd), tv, mat(tv, e, kvd, &mut rng));
        w = w.tensor(&n("attn_output"), &d2(qd, e), to, mat(to, qd, e, &mut rng));
        w = w.tensor(
            &n("ffn_norm"),
            &[e as u64],
            GgmlType::F32,
            norm(e, &mut rng),
        );
        w = w.tensor(&n("ffn_gate"), &d2(e, s.ff), tg, mat(tg, e, s.ff, &mut rng));
        w = w.tensor(&n("ffn_up"), &d2(e, s.ff), tu, mat(tu, e, s.ff, &mut rng));
        w = w.tensor(&n("ffn_down"), &d2(s.ff, e), td, mat(td, s.ff, e, &mut rng));
        if gemma {
            let hd = s.head_dim as u64;
            w = w.tensor(
                &n("attn_q_norm"),
                &[hd],
                GgmlType::F32,
                norm(s.head_dim, &mut rng),
            );
            w = w.tensor(
                &n("attn_k_norm"),
                &[hd],
                GgmlType::F32,
                norm(s.head_dim, &mut rng),
            );
            w = w.tensor(
                &n("post_attention_norm"),
                &[e as u64],
                GgmlType::F32,
                norm(e, &mut rng),
            );
            w = w.tensor(
                &n("post_ffw_norm"),
                &[e as u64],
                GgmlType::F32,
                norm(e, &mut rng),
            );
        }
    }
    w
}

// --- the naive reference ------------------------------------------------------------------

fn deq(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap();
    let mut out = vec![0.0; t.n_elements() as usize];
    dequantize(t.ggml_type(), t.data(), out.len(), &mut out).unwrap();
    out
}

/// `W x` for `W` rows of `x.len()` (f64 sums).
fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks_exact(x.len())
        .map(|row| {
            row.iter()
                .zip(x)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum::<f64>() as f32
        })
        .collect()
}

fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + f64::from(eps)).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, w)| (f64::from(*v) * s) as f32 * w)
        .collect()
}

fn rope_ref(x: &mut [f32], pos: u32, base: f64, neox: bool) {
    let n = x.len();
    for i in 0..n / 2 {
        let theta = f64::from(pos) * base.powf(-2.0 * i as f64 / n as f64);
        let (c, s) = (theta.cos(), theta.sin());
        let (a, b) = if neox {
            (i, i + n / 2)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (f64::from(x[a]), f64::from(x[b]));
        x[a] = (x0 * c - x1 * s) as f32;
        x[b] = (x0 * s + x1 * c) as f32;
    }
}

fn f16_round(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// Logits at every position of `tokens`, recomputed from scratch with contiguous K/V.
pub(crate) fn reference(f: &GgufFile, s: &Shape, tokens: &[u32]) -> Vec<Vec<f32>> {
    let gemma = s.arch == "gemma3";
    let eps = if gemma { 1e-6 } else { 1e-5 };
    let (e, hd) = (s.embd, s.head_dim);
    let group = s.heads / s.kv_heads;
    let embd = deq(f, "token_embd.weight");
    let t_n = tokens.len();
    let mut x: Vec<Vec<f32>> = tokens
        .iter()
        .map(|t| {
            let row = &embd[*t as usize * e..(*t as usize + 1) * e];
            let scale = if gemma { (e as f32).sqrt() } else { 1.0 };
            row.iter().map(|v| v * scale).collect()
        })
        .collect();
    for l in 0..s.layers {
        let w = |n: &str| deq(f, &format!("blk.{l}.{n}.weight"));
        let (wq, wk, wv, wo) = (w("attn_q"), w("attn_k"), w("attn_v"), w("attn_output"));
        let (gate, up, down) = (w("ffn_gate"), w("ffn_up"), w("ffn_down"));
        let (an, fnorm) = (w("attn_norm"), w("ffn_norm"));
        let local = gemma && l % 6 < 5;
        let base = if gemma {
            if local { 1e4 } else { 1e6 }
        } else {
            1e5
        };
        let window = if local { s.window } else { None };
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (t, xt) in x.iter().enumerate() {
            let h = rmsnorm(xt, &an, eps);
            let (mut q, mut k, v) = (matvec(&wq, &h), matvec(&wk, &h), matvec(&wv, &h));
            for (heads, norm) in [(&mut q, "attn_q_norm"), (&mut k, "attn_k_norm")] {
                for head in heads.chunks_exact_mut(hd) {
                    if gemma {
                        let n = rmsnorm(head, &w(norm), eps);
                        head.copy_from_slice(&n);
                    }
                    rope_ref(head, t as u32, base, gemma);
                }
            }
            ks.push(k.iter().map(|v| f16_round(*v)).collect::<Vec<f32>>());
            vs.push(v.iter().map(|v| f16_round(*v)).collect::<Vec<f32>>());
            qs.push(q);
        }
        let scale = 1.0 / (hd as f64).sqrt();
        for t in 0..t_n {
            let mut att = vec![0.0f32; s.heads * hd];
            for h in 0..s.heads {
                let g = h / group;
                let q = &qs[t][h * hd..(h + 1) * hd];
                let visible: Vec<usize> = (0..=t)
                    .filter(|p| window.is_none_or(|w| t - p < w as usize))
                    .collect();
                let scores: Vec<f64> = visible
                    .iter()
                    .map(|p| {
                        let k = &ks[*p][g * hd..(g + 1) * hd];
                        q.iter()
                            .zip(k)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = scores.iter().map(|v| (v - m).exp()).collect();
                let z: f64 = ex.iter().sum();
                for (p, e) in visible.iter().zip(&ex) {
                    let v = &vs[*p][g * hd..(g + 1) * hd];
                    for (a, v) in att[h * hd..(h + 1) * hd].iter_mut().zip(v) {
                        *a += (e / z * f64::from(*v)) as f32;
                    }
                }
            }
            let mut o = matvec(&wo, &att);
            if gemma {
                o = rmsnorm(&o, &w("post_attention_norm"), eps);
            }
            for (x, o) in x[t].iter_mut().zip(&o) {
                *x += o;
            }
            let h = rmsnorm(&x[t], &fnorm, eps);
            let (g, u) = (matvec(&gate, &h), matvec(&up, &h));
            let act: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| {
                    let g = f64::from(*g);
                    let a = if gemma {
                        0.5 * g
                            * (1.0
                                + ((2.0 / std::f64::consts::PI).sqrt()
                                    * (g + 0.044715 * g * g * g))
                                    .tanh())
                    } else {
                        g / (1.0 + (-g).exp())
                    };
                    (a * f64::from(*u)) as f32
                })
                .collect();
            let mut o = matvec(&down, &act);
            if gemma {
                o = rmsnorm(&o, &w("post_ffw_norm"), eps);
            }
            for (x, o) in x[t].iter_mut().zip(&o) {
                *x += o;
            }
        }
    }
    let on = deq(f, "output_norm.weight");
    x.iter()
        .map(|xt| matvec(&embd, &rmsnorm(xt, &on, eps)))
        .collect()
}

// --- helpers ------------------------------------------------------------------------------

pub(crate) fn opts(mode: MatmulMode) -> RunnerOptions {
    RunnerOptions {
        threads: 2,
        max_batch: 64,
        mode,
        force_scalar: false,
        fused: true,
    }
}

/// Relative error: max |a - b| over max(1, max |b|).
pub(crate) fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

fn layout(m: &Model<'_>) -> KvLayout {
    m.kv_layout()
}

/// Logits at every position: one prefill per position would re-run the prompt, so decode
/// token by token, keeping each step's logits.
fn logits_each_step(runner: &mut Runner<'_, '_>, tokens: &[u32], page_size: u32) -> Vec<Vec<f32>> {
    let m = runner.model();
    let mut kv = HostKvPages::new(layout(m), page_size, 64u32.div_ceil(page_size) + 1).unwrap();
    let mut seq = Sequence::new();
    kv.reserve(&mut seq, tokens.len() as u32).unwrap();
    tokens
        .iter()
        .map(|t| runner.decode(*t, &mut kv, &mut seq).unwrap().to_vec())
        .collect()
}

/// Last-token logits of one prefill with `page_size` pages.
fn prefill_last(runner: &mut Runner<'_, '_>, tokens: &[u32], page_size: u32) -> Vec<f32> {
    let m = runner.model();
    let mut kv = HostKvPages::new(layout(m), page_size, 64u32.div_ceil(page_size) + 1).unwrap();
    let mut seq = Sequence::new();
    kv.reserve(&mut seq, tokens.len() as u32).unwrap();
    let out = runner.prefill(tokens, &mut kv, &mut seq).unwrap().to_vec();
    assert_eq!(seq.len(), tokens.len() as u32);
    out
}

fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.below(vocab as u32)).collect()
}

fn model_file(shape: &Shape, seed: u64) -> GgufFile {
    GgufFile::from_bytes(format!("tiny-{}.gguf", shape.arch), build(shape, seed)).unwrap()
}

// --- tests --------------------------------------------------------------------------------

#[test]
fn paged_forward_matches_the_naive_reference() {
    for shape in [tiny_llama(), tiny_gemma(6)] {
        let f = model_file(&shape, 1);
        let m = Model::load(&f).unwrap();
        let toks = tokens(13, shape.vocab, 2);
        let want = reference(&f, &shape, &toks);
        for mode in [MatmulMode::Exact, MatmulMode::Quantized] {
            let mut r = Runner::new(&m, opts(mode)).unwrap();
            let steps = logits_each_step(&mut r, &toks, 3);
            let tol = if mode == MatmulMode::Exact {
                1e-4
            } else {
                2e-2
            };
            let mut worst = 0.0f32;
            for (t, (got, want)) in steps.iter().zip(&want).enumerate() {
                let e = rel_err(got, want);
                worst = worst.max(e);
                assert!(
                    e <= tol,
                    "{} {mode:?} position {t}: error {e:e} > {tol:e}",
                    shape.arch
                );
            }
            eprintln!("{} {mode:?}: worst relative error {worst:e}", shape.arch);
            let last = prefill_last(&mut r, &toks, 16);
            assert_eq!(
                &last,
                steps.last().unwrap(),
                "{} {mode:?}: prefill vs decode",
                shape.arch
            );
        }
    }
}

#[test]
fn paging_batching_and_threads_change_no_bit() {
    for shape in [tiny_llama(), tiny_gemma(6)] {
        let f = model_file(&shape, 3);
        let m = Model::load(&f).unwrap();
        let toks = tokens(21, shape.vocab, 4);
        let mut r = Runner::new(&m, opts(MatmulMode::Quantized)).unwrap();
        let base = prefill_last(&mut r, &toks, 16);
        for ps in [1, 3, 16] {
            assert_eq!(
                prefill_last(&mut r, &toks, ps),
                base,
                "{} page size {ps}",
                shape.arch
            );
            assert_eq!(
                logits_each_step(&mut r, &toks, ps).last().unwrap(),
                &base,
                "{} page size {ps}, token by token",
                shape.arch
            );
        }
        for (threads, max_batch) in [(1, 64), (3, 5), (2, 1)] {
            let o = RunnerOptions {
                threads,
                max_batch,
                ..opts(MatmulMode::Quantized)
            };
            let mut r = Runner::new(&m, o).unwrap();
            assert_eq!(
                prefill_last(&mut r, &toks, 3),
                base,
                "{} threads {threads}, max_batch {max_batch}",
                shape.arch
            );
        }
        // Scalar kernels sum in another order: in exact mode that is all; quantized, an
        // activation that lands the other side of a rounding step moves a quant by one,
        // and a GELU input the other side of an f16 step (ggml's GELU table) moves its
        // output by 2^-11 (measured: llama 3e-8, gemma3 1.8e-3).
        for (mode, tol) in [(MatmulMode::Exact, 1e-4), (MatmulMode::Quantized, 5e-3)] {
            let mut simd = Runner::new(&m, opts(mode)).unwrap();
            let want = prefill_last(&mut simd, &toks, 3);
            let o = RunnerOptions {
                force_scalar: true,
                ..opts(mode)
            };
            let mut r = Runner::new(&m, o).unwrap();
            let e = rel_err(&prefill_last(&mut r, &toks, 3), &want);
            eprintln!("{} {mode:?}: scalar vs simd {e:e}", shape.arch);
            assert!(e < tol, "{} {mode:?}: scalar vs simd {e:e}", shape.arch);
        }
    }
}

/// Two sequences in one batch (a prefill chunk of one and a decode step of the other,
/// then decode steps of both) equal each run alone; with a shared arena.
#[test]
fn sequences_share_weight_passes() {
    for shape in [tiny_llama(), tiny_gemma(6)] {
        let f = model_file(&shape, 5);
        let m = Model::load(&f).unwrap();
        let a = tokens(9, shape.vocab, 6);
        let b = tokens(7, shape.vocab, 7);
        let mut r = Runner::new(&m, opts(MatmulMode::Quantized)).unwrap();
        let alone_a = logits_each_step(&mut r, &a, 4);
        let alone_b = logits_each_step(&mut r, &b, 4);

        let mut kv = HostKvPages::new(m.kv_layout(), 4, 8).unwrap();
        let (mut sa, mut sb) = (Sequence::new(), Sequence::new());
        kv.reserve(&mut sa, 9).unwrap();
        kv.reserve(&mut sb, 7).unwrap();
        // Step 1: a's first 5 tokens as a chunk, with b's first token.
        let mut rows: Vec<BatchRow<'_>> = (0..5)
            .map(|i| BatchRow {
                token: a[i],
                pos: i as u32,
                seq: &sa,
                logits: i == 4,
            })
            .collect();
        rows.push(BatchRow {
            token: b[0],
            pos: 0,
            seq: &sb,
            logits: true,
        });
        let out = r.forward(&rows, &mut kv).unwrap().to_vec();
        let v = shape.vocab;
        assert_eq!(&out[..v], &alone_a[4][..]);
        assert_eq!(&out[v..], &alone_b[0][..]);
        sa.set_len(5);
        sb.set_len(1);
        // Then one decode step of both at a time.
        for step in 0..4 {
            let (pa, pb) = (5 + step, 1 + step);
            let rows = [
                BatchRow {
                    token: a[pa],
                    pos: pa as u32,
                    seq: &sa,
                    logits: true,
                },
                BatchRow {
                    token: b[pb],
                    pos: pb as u32,
                    seq: &sb,
                    logits: true,
                },
            ];
            let out = r.forward(&rows, &mut kv).unwrap().to_vec();
            assert_eq!(&out[..v], &alone_a[pa][..], "step {step}");
            assert_eq!(&out[v..], &alone_b[pb][..], "step {step}");
            sa.set_len(pa as u32 + 1);
            sb.set_len(pb as u32 + 1);
        }
    }
}

/// With only sliding-window layers (window 4, two layers), position t sees tokens
/// t-6..=t at most: a change at position 0 leaves logits from position 7 on unchanged, bit
/// for bit, and changes earlier ones. With a global layer (6 layers) it reaches the end.
#[test]
fn sliding_window_masks_old_positions() {
    let shape = tiny_gemma(2);
    let f = model_file(&shape, 8);
    let m = Model::load(&f).unwrap();
    assert!(m.config().layers.iter().all(|l| l.window == Some(4)));
    let toks = tokens(12, shape.vocab, 9);
    let mut other = toks.clone();
    other[0] = (toks[0] + 1) % shape.vocab as u32;
    let mut r = Runner::new(&m, opts(MatmulMode::Exact)).unwrap();
    let a = logits_each_step(&mut r, &toks, 3);
    let b = logits_each_step(&mut r, &other, 3);
    for t in 0..12 {
        if t >= 7 {
            assert_eq!(a[t], b[t], "position {t} sees position 0");
        } else {
            assert_ne!(a[t], b[t], "position {t} should see position 0");
        }
    }
    let want = reference(&f, &shape, &toks);
    for t in 0..12 {
        assert!(rel_err(&a[t], &want[t]) <= 1e-4, "position {t}");
    }

    let shape = tiny_gemma(6);
    let f = model_file(&shape, 8);
    let m = Model::load(&f).unwrap();
    assert_eq!(m.config().layers[5].window, None);
    assert_eq!(m.config().layers[4].window, Some(4));
    let mut r = Runner::new(&m, opts(MatmulMode::Exact)).unwrap();
    let a = prefill_last(&mut r, &toks, 3);
    let b = prefill_last(&mut r, &other, 3);
    assert_ne!(a, b, "the global layer sees position 0");
}

// --- errors -------------------------------------------------------------------------------

fn load_err(bytes: Vec<u8>) -> String {
    let f = GgufFile::from_bytes("bad.gguf", bytes).unwrap();
    Model::load(&f).unwrap_err().to_string()
}

#[test]
fn load_errors_are_one_line_naming_the_file() {
    let mut s = tiny_llama();
    s.arch = "mamba";
    let e = load_err(build(&s, 1));
    assert_eq!(
        e,
        "bad.gguf: unknown architecture \"mamba\" (den-model runs llama and gemma3)"
    );

    let mut s = tiny_llama();
    s.types[0] = GgmlType::F32;
    let mut w = writer(&s, 1);
    // A Q5_1 tensor where a matrix is expected: rebuild with the q weight's type changed.
    w = w.kv("general.name", 8, &gstr("x"));
    let bytes = w.bytes();
    assert!(Model::load(&GgufFile::from_bytes("f32.gguf", bytes).unwrap()).is_ok());

    // Unsupported type: Q5_1 (sizes are known, dequantizing is not).
    let s = tiny_llama();
    let mut w = writer_without(&s, "blk.1.attn_q.weight");
    w = w.tensor(
        "blk.1.attn_q.weight",
        &[64, 64],
        GgmlType::Q5_1,
        vec![0; 64 * 64 / 32 * 24],
    );
    let e = load_err(w.bytes());
    assert_eq!(
        e,
        "bad.gguf: tensor \"blk.1.attn_q.weight\" is Q5_1, which den-model cannot multiply (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K)"
    );

    // Wrong shape.
    let mut w = writer_without(&s, "blk.0.ffn_up.weight");
    w = w.tensor(
        "blk.0.ffn_up.weight",
        &[64, 64],
        GgmlType::F32,
        vec![0; 64 * 64 * 4],
    );
    let e = load_err(w.bytes());
    assert_eq!(
        e,
        "bad.gguf: tensor \"blk.0.ffn_up.weight\" has shape [64, 64], expected [64, 96] (embedding_length × feed_forward_length)"
    );

    // Missing tensor, missing key.
    let e = load_err(writer_without(&s, "blk.1.ffn_down.weight").bytes());
    assert_eq!(e, "bad.gguf: no tensor named \"blk.1.ffn_down.weight\"");
    let mut w = Writer::new().kv("general.architecture", 8, &gstr("gemma3"));
    w = u32_kv(w, "gemma3.block_count", 6);
    w = w.tensor(
        "token_embd.weight",
        &[64, 48],
        GgmlType::Q8_0,
        random_tensor(GgmlType::Q8_0, 48, 64, 1.0, &mut Rng::new(1)),
    );
    let e = load_err(w.bytes());
    assert_eq!(
        e,
        "bad.gguf: missing metadata key \"gemma3.embedding_length\""
    );
    assert!(!e.contains('\n'));
}

/// The model's tensors with one left out.
fn writer_without(s: &Shape, skip: &str) -> Writer {
    let full = GgufFile::from_bytes("x", build(s, 1)).unwrap();
    let mut w = Writer::new();
    for (k, _) in full.metadata().iter() {
        if k == "general.architecture" {
            w = w.kv(k, 8, &gstr(full.get_str(k).unwrap()));
        } else if let Ok(v) = full.get_u32(k) {
            w = w.kv(k, 4, &v.to_le_bytes());
        } else if let Ok(v) = full.get_f32(k) {
            w = w.kv(k, 6, &v.to_le_bytes());
        }
    }
    for t in full.tensor_views() {
        if t.name() != skip {
            w = w.tensor(t.name(), t.dims(), t.ggml_type(), t.data().to_vec());
        }
    }
    w
}

#[test]
fn run_errors_are_one_line() {
    let s = tiny_llama();
    let f = model_file(&s, 1);
    let m = Model::load(&f).unwrap();
    let mut r = Runner::new(&m, opts(MatmulMode::Quantized)).unwrap();
    let mut kv = HostKvPages::new(m.kv_layout(), 4, 2).unwrap();
    let mut seq = Sequence::new();
    kv.reserve(&mut seq, 8).unwrap();
    let e = r.prefill(&[1, 2, 40], &mut kv, &mut seq).unwrap_err();
    assert_eq!(e.to_string(), "token 40 is past the vocabulary (40 tokens)");
    assert!(matches!(
        r.prefill(&[], &mut kv, &mut seq),
        Err(ModelError::Input(_))
    ));
    let e = r.prefill(&[1; 9], &mut kv, &mut seq).unwrap_err();
    assert_eq!(
        e.to_string(),
        "position 8 has no KV row: the sequence has 2 pages of 4 rows"
    );
    assert_eq!(
        seq.len(),
        0,
        "a failed prefill does not advance the sequence"
    );
    let mut other = HostKvPages::new(
        KvLayout {
            layers: 1,
            ..m.kv_layout()
        },
        4,
        2,
    )
    .unwrap();
    let e = r.prefill(&[1], &mut other, &mut seq).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a KV row is 128 bytes, the model's layout needs 256"
    );
    // Past the context (64).
    let mut big = HostKvPages::new(m.kv_layout(), 16, 5).unwrap();
    let mut seq = Sequence::new();
    big.reserve(&mut seq, 80).unwrap();
    let e = r.prefill(&[1; 65], &mut big, &mut seq).unwrap_err();
    assert_eq!(
        e.to_string(),
        "position 64 is past the model's context (64 positions)"
    );
}

/// The largest logit's index, and its margin over the runner-up.
pub(crate) fn top(logits: &[f32]) -> (usize, f32) {
    let mut best = (0usize, f32::NEG_INFINITY);
    let mut second = f32::NEG_INFINITY;
    for (i, v) in logits.iter().enumerate() {
        if *v > best.1 {
            second = best.1;
            best = (i, *v);
        } else if *v > second {
            second = *v;
        }
    }
    (best.0, best.1 - second)
}
