//! The forward pass on the real files: SmolLM2-135M-Instruct (llama, Q4_1) and Gemma 3
//! 270M (gemma3, Q4_K_M), with `DEN_TEST_MODELS` (see `dequant.rs` for the skip rule).
//!
//! - A prefix computed in one prefill gives the same logits as the same prefix computed
//!   by a prefill of its first tokens and then decode steps, one token each. Tolerance:
//!   1e-3 relative to the largest logit for SmolLM2 (its dots do not depend on the batch);
//!   for Gemma 3 [`GEMMA_BATCH_TOL`], and the same greedy token.
//! - Greedy decoding against llama.cpp: `golden.rs`.
//! - `bench_forward` (ignored): prefill and decode tokens/s with 2 threads.

use std::path::Path;
use std::time::Instant;

use den_model::arch::Model;
use den_model::gguf::GgufFile;
use den_model::kv::{HostKvPages, Sequence};
use den_model::{Runner, RunnerOptions};

use crate::dequant::models_dir;
use crate::forward::rel_err;

/// An unoptimized build (the workspace's test profile): the real-model tests check less.
pub(crate) const DEBUG: bool = cfg!(debug_assertions);

pub(crate) const SMOL: &str = "smollm2-135m-instruct-q4_1.gguf";
pub(crate) const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

/// `dir/file`, opened (a missing file says how to fetch it). Also used by `dequant.rs`.
pub(crate) fn open(dir: &Path, file: &str) -> GgufFile {
    let path = dir.join(file);
    assert!(
        path.is_file(),
        "{} is missing: run tests/fetch-models (DEN_TEST_MODELS={})",
        path.display(),
        dir.display()
    );
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The first index of the largest value (llama.cpp's greedy sampler keeps the first).
pub(crate) fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Softmax probability of `tok`, and the top-1 probability.
pub(crate) fn prob(logits: &[f32], tok: u32) -> f64 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b));
    let z: f64 = logits.iter().map(|v| f64::from(v - m).exp()).sum();
    f64::from(logits[tok as usize] - m).exp() / z
}

/// Greedy decoding: `n` tokens after `prompt`, and the logits each was picked from.
pub(crate) fn greedy(
    r: &mut Runner<'_, '_>,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let m = r.model();
    let mut kv =
        HostKvPages::new(m.kv_layout(), 16, (prompt.len() + n).div_ceil(16) as u32).unwrap();
    let mut seq = Sequence::new();
    kv.reserve(&mut seq, (prompt.len() + n) as u32).unwrap();
    let mut logits = r.prefill(prompt, &mut kv, &mut seq).unwrap().to_vec();
    let mut out = Vec::new();
    let mut steps = Vec::new();
    for i in 0..n {
        let t = argmax(&logits);
        out.push(t);
        steps.push(logits);
        if i + 1 < n {
            logits = r.decode(t, &mut kv, &mut seq).unwrap().to_vec();
        } else {
            logits = Vec::new();
        }
    }
    (out, steps)
}

fn prefill_once(r: &mut Runner<'_, '_>, tokens: &[u32]) -> Vec<f32> {
    let m = r.model();
    let mut kv = HostKvPages::new(m.kv_layout(), 16, 16).unwrap();
    let mut seq = Sequence::new();
    kv.reserve(&mut seq, tokens.len() as u32).unwrap();
    r.prefill(tokens, &mut kv, &mut seq).unwrap().to_vec()
}

/// A few fixed prompts as token ids (so nothing here depends on the tokenizer):
/// "The capital of France is", "def fibonacci(n):" and a chat turn ("Hello", then the
/// assistant's header).
fn prompts(file: &str) -> Vec<Vec<u32>> {
    if file == SMOL {
        vec![
            vec![504, 3575, 282, 4649, 314],
            vec![1604, 3987, 46477, 24, 94, 727],
            vec![1, 4093, 198, 19556, 2, 198, 1, 520, 9531, 198],
        ]
    } else {
        vec![
            vec![2, 818, 5279, 529, 7001, 563],
            vec![2, 2063, 73368, 78113, 236769, 236749, 1473],
            vec![2, 105, 2364, 107, 9259, 106, 107, 105, 4368, 107],
        ]
    }
}

/// Gemma 3's logits after a prefix prefilled whole against the same prefix prefilled then
/// decoded: llama.cpp's Q4_K GEMM (rows in whole groups of 4) and its tiled Q6_K matmul
/// (from 8 rows) add in other orders than its one-row kernels, den mirrors them
/// (`model/src/ops/kdot/`), so a row's value depends on its batch, and Gemma 3 amplifies
/// those last-bit differences through its 18 layers (measured up to 4.6e-2 here).
const GEMMA_BATCH_TOL: f32 = 0.1;

#[test]
fn real_prefill_equals_prefill_then_decode() {
    let Some(dir) = models_dir("real_prefill_equals_prefill_then_decode") else {
        return;
    };
    for file in [SMOL, GEMMA] {
        let f = open(&dir, file);
        let m = Model::load(&f).unwrap_or_else(|e| panic!("{e}"));
        let mut r = Runner::new(&m, RunnerOptions::default()).unwrap();
        // An unoptimized build runs about 1 s per token row: one prompt, fewer tokens.
        let all = prompts(file);
        let take = if DEBUG { 1 } else { all.len() };
        for prompt in all.into_iter().take(take) {
            let n = if DEBUG { 4 } else { 16 };
            let (got, steps) = greedy(&mut r, &prompt, n);
            for k in [n / 2, n - 1] {
                let mut whole = prompt.clone();
                whole.extend(&got[..k]);
                let once = prefill_once(&mut r, &whole);
                let e = rel_err(&once, &steps[k]);
                eprintln!("{file} {prompt:?} + {k}: relative difference {e:e}");
                let tol = if file == GEMMA { GEMMA_BATCH_TOL } else { 1e-3 };
                assert!(e <= tol, "{file} {prompt:?} + {k}: {e:e} > {tol:e}");
                assert_eq!(argmax(&once), got[k], "{file} {prompt:?} + {k}");
            }
            eprintln!("{file} {prompt:?} -> {got:?}");
        }
    }
}

// --- speed ----------------------------------------------------------------------------------

/// This process's CPU time (user + system) in seconds, from /proc (0 elsewhere): on a
/// shared machine, wall time says little, CPU seconds per token say what the code costs.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which is in parentheses): utime is 14th, stime 15th.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// The benches' thread count: `DEN_BENCH_THREADS`, else `default`.
fn bench_threads(default: usize) -> usize {
    std::env::var("DEN_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `cargo test --release -p den-model --test it -- --ignored --nocapture bench_forward`
#[test]
#[ignore = "a measurement, not a check; run with --release"]
fn bench_forward() {
    let Some(dir) = models_dir("bench_forward") else {
        return;
    };
    let threads = bench_threads(2);
    let fused = std::env::var("DEN_BENCH_UNFUSED").is_err();
    for file in [SMOL, GEMMA] {
        let f = open(&dir, file);
        let m = Model::load(&f).unwrap();
        let opts = RunnerOptions {
            threads,
            max_batch: 128,
            fused,
            ..RunnerOptions::default()
        };
        let mut r = Runner::new(&m, opts).unwrap();
        let mut rng = crate::forward::Rng::new(42);
        let prompt: Vec<u32> = (0..128).map(|_| rng.below(m.vocab() as u32)).collect();
        let mut kv = HostKvPages::new(m.kv_layout(), 16, 16).unwrap();
        // Warm-up: page the weights in.
        let mut seq = Sequence::new();
        kv.reserve(&mut seq, 200).unwrap();
        r.prefill(&prompt, &mut kv, &mut seq).unwrap();
        let mut best_prefill = f64::MAX;
        let mut best_decode = f64::MAX;
        let (mut cpu_prefill, mut cpu_decode) = (0.0, 0.0);
        let rounds = 3;
        for _ in 0..rounds {
            seq.truncate(0);
            let (t, c) = (Instant::now(), cpu_seconds());
            let mut tok = argmax(r.prefill(&prompt, &mut kv, &mut seq).unwrap());
            best_prefill = best_prefill.min(t.elapsed().as_secs_f64());
            cpu_prefill += cpu_seconds() - c;
            let (t, c) = (Instant::now(), cpu_seconds());
            for _ in 0..32 {
                tok = argmax(r.decode(tok, &mut kv, &mut seq).unwrap());
            }
            best_decode = best_decode.min(t.elapsed().as_secs_f64());
            cpu_decode += cpu_seconds() - c;
        }
        eprintln!(
            "{file} ({threads} threads, simd {}, fused {fused}): prefill 128 tokens {:.1} tok/s ({:.2} CPU ms/token), decode 32 tokens {:.1} tok/s ({:.2} CPU ms/token)",
            r.simd(),
            128.0 / best_prefill,
            cpu_prefill * 1e3 / (128.0 * rounds as f64),
            32.0 / best_decode,
            cpu_decode * 1e3 / (32.0 * rounds as f64),
        );
    }
}

/// Decode at long context: prefill a prompt of 512, then 2,048 tokens, and decode 64 after
/// each. `cargo test --release -p den-model --test it -- --ignored --nocapture
/// bench_forward_long_context` (`DEN_BENCH_THREADS`, default 1; `DEN_BENCH_MODEL`, a file in
/// `DEN_TEST_MODELS`, default SmolLM2); beside llama.cpp's
/// `llama-bench -m FILE -t 1 -fa 1 -p 0 -n 16 -d 512,2048` (see BENCHMARKS.md).
#[test]
#[ignore = "a measurement, not a check; run with --release"]
fn bench_forward_long_context() {
    let Some(dir) = models_dir("bench_forward_long_context") else {
        return;
    };
    let threads = bench_threads(1);
    let file = std::env::var("DEN_BENCH_MODEL").unwrap_or_else(|_| SMOL.to_string());
    let f = open(&dir, &file);
    let m = Model::load(&f).unwrap();
    let opts = RunnerOptions {
        threads,
        ..RunnerOptions::default()
    };
    let mut r = Runner::new(&m, opts).unwrap();
    let vocab = m.vocab() as u32;
    for context in [512usize, 2048] {
        let mut kv =
            HostKvPages::new(m.kv_layout(), 16, (context as u32 + 80).div_ceil(16)).unwrap();
        let mut seq = Sequence::new();
        kv.reserve(&mut seq, context as u32 + 80).unwrap();
        let prompt: Vec<u32> = (0..context as u32).map(|i| (i * 37 + 1) % vocab).collect();
        let t = Instant::now();
        let mut tok = argmax(r.prefill(&prompt, &mut kv, &mut seq).unwrap());
        let prefill = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..64 {
            tok = argmax(r.decode(tok, &mut kv, &mut seq).unwrap());
        }
        let decode = t.elapsed().as_secs_f64() / 64.0;
        eprintln!(
            "{file} ({threads} threads) at {context} tokens of context: prefill {:.1} tok/s, decode {:.2} ms/token ({:.1} tok/s)",
            context as f64 / prefill,
            decode * 1e3,
            1.0 / decode
        );
    }
}
