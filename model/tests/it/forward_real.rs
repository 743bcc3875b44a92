//! The forward pass on the real files: SmolLM2-135M-Instruct (llama, Q4_1) and Gemma 3
//! 270M (gemma3, Q4_K_M), with `DEN_TEST_MODELS` (see `dequant.rs` for the skip rule).
//!
//! - A prefix computed in one prefill gives the same logits as the same prefix computed
//!   by a prefill of its first tokens and then decode steps, one token each. Tolerance:
//!   1e-3 relative to the largest logit for SmolLM2 (its dots do not depend on the batch);
//!   for Gemma 3 [`GEMMA_BATCH_TOL`], and the same greedy token.
//! - Greedy decoding against llama.cpp (`tests/golden/llamacpp_<model>.json`, written by
//!   `tests/golden/llamacpp_golden.sh` from a llama.cpp build): see `golden_*` below.
//! - `bench_forward` (ignored): prefill and decode tokens/s with 2 threads.

use std::path::Path;
use std::time::Instant;

use den_model::arch::Model;
use den_model::gguf::GgufFile;
use den_model::kv::{HostKvPages, Sequence};
use den_model::{BatchRow, Runner, RunnerOptions};
use serde_json::Value as Json;

use crate::dequant::models_dir;
use crate::forward::rel_err;

/// An unoptimized build (the workspace's test profile): the real-model tests check less.
const DEBUG: bool = cfg!(debug_assertions);

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
fn prob(logits: &[f32], tok: u32) -> f64 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b));
    let z: f64 = logits.iter().map(|v| f64::from(v - m).exp()).sum();
    f64::from(logits[tok as usize] - m).exp() / z
}

/// Greedy decoding: `n` tokens after `prompt`, and the logits each was picked from.
fn greedy(r: &mut Runner<'_, '_>, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let m = r.model();
    let mut kv = HostKvPages::new(m.kv_layout(), 16, 16).unwrap();
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
/// (`model/src/ops/kdot.rs`), so a row's value depends on its batch, and Gemma 3 amplifies
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

// --- llama.cpp golden ---------------------------------------------------------------------

fn golden(file: &str) -> Option<Json> {
    let stem = file.trim_end_matches(".gguf");
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("llamacpp_{stem}.json"));
    let text = std::fs::read_to_string(&path).ok()?;
    Some(serde_json::from_str(&text).unwrap())
}

/// Logits at each of llama.cpp's 16 steps with llama.cpp's tokens as the context (teacher
/// forcing): one batched forward over prompt and continuation, logits for the last
/// prompt row and every continuation row but the last.
fn forced_steps(r: &mut Runner<'_, '_>, prompt: &[u32], cont: &[u32]) -> Vec<Vec<f32>> {
    let m = r.model();
    let all: Vec<u32> = prompt.iter().chain(cont).copied().collect();
    let mut kv = HostKvPages::new(m.kv_layout(), 16, 16).unwrap();
    let mut seq = Sequence::new();
    kv.reserve(&mut seq, all.len() as u32).unwrap();
    let rows: Vec<BatchRow<'_>> = all
        .iter()
        .enumerate()
        .map(|(i, t)| BatchRow {
            token: *t,
            pos: i as u32,
            seq: &seq,
            logits: i + 1 >= prompt.len() && i + 1 < all.len(),
        })
        .collect();
    let v = m.vocab();
    let out = r.forward(&rows, &mut kv).unwrap();
    out.chunks_exact(v).map(<[f32]>::to_vec).collect()
}

struct Case {
    name: String,
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    /// Per step: llama.cpp's top (id, p), or none (a token that ends no UTF-8 character).
    top: Vec<Option<Vec<(u32, f64)>>>,
}

fn cases(g: &Json) -> Vec<Case> {
    let ids = |v: &Json| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_owned(),
            prompt: ids(&c["prompt"]),
            tokens: ids(&c["tokens"]),
            top: c["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    t.as_array().map(|t| {
                        t.iter()
                            .map(|e| (e["id"].as_u64().unwrap() as u32, e["p"].as_f64().unwrap()))
                            .collect()
                    })
                })
                .collect(),
        })
        .collect()
}

/// den against llama.cpp (`tests/golden/llamacpp_<model>.json`).
///
/// How close can two correct implementations be? llama.cpp against itself, flash
/// attention off against its default (on: Q rounded to f16, V summed in f16), at the same
/// contexts: top-1 probabilities differ by up to 0.145 (mean 0.016) on both models, a
/// token flips where llama.cpp's own top two are within 0.055, and free-running greedy
/// continuations of SmolLM2 agree on all 16 tokens for only 3 of the 10 prompts (a flipped
/// near-tie, and from there the contexts differ). So free-running agreement is reported,
/// not asserted; what is asserted, with llama.cpp's tokens as the context at every step
/// (teacher forcing), against llama.cpp's default build and settings:
///
/// - on at least 9 of 10 prompts den's greedy token is llama.cpp's at every step, ties
///   aside: steps where llama.cpp gives den's pick a probability within [`TIE`] of its
///   top 1 (steps for which llama-server gave no probabilities, a token ending no UTF-8
///   character, are not judged); at every step of every prompt, den's pick is within
///   [`NEAR_TIE`] of llama.cpp's top 1;
/// - den's probability of llama.cpp's token is within [`TOP1_TOL`] of llama.cpp's at
///   every step, and within [`TOP1_MEAN_TOL`] on average.
///
/// Measured (quantized mode, the default, against goldens from llama.cpp built natively on
/// an AVX-512 host): SmolLM2 teacher-forced agreement 10/10, free-running 10/10, |Δp| worst
/// 0.033, mean 0.001 (den computes SmolLM2's types in ggml's order); Gemma 3 10/10, 6/10,
/// 0.105, 0.015. For scale: the same llama.cpp source built on another machine agrees with
/// these goldens free-running on 3/10 SmolLM2 prompts, and `-fa off` against its own
/// default on 3/10 and 7/10; a rerun of one build reproduces every bit.
/// `DEN_GOLDEN_EXACT=1` runs den's exact mode instead.
const TOP1_TOL: f64 = 0.2;
const TOP1_MEAN_TOL: f64 = 0.03;
const TIE: f64 = 0.06;
const NEAR_TIE: f64 = 0.1;

#[test]
fn golden_matches_llama_cpp() {
    let Some(dir) = models_dir("golden_matches_llama_cpp") else {
        return;
    };
    for file in [SMOL, GEMMA] {
        let Some(g) = golden(file) else {
            panic!(
                "tests/golden/llamacpp_{}.json is missing: run tests/golden/llamacpp_golden.sh",
                file.trim_end_matches(".gguf")
            );
        };
        let f = open(&dir, file);
        let m = Model::load(&f).unwrap_or_else(|e| panic!("{e}"));
        let mode = if std::env::var_os("DEN_GOLDEN_EXACT").is_some() {
            den_model::arch::MatmulMode::Exact
        } else {
            den_model::arch::MatmulMode::Quantized
        };
        let opts = RunnerOptions {
            mode,
            ..RunnerOptions::default()
        };
        let mut r = Runner::new(&m, opts).unwrap();
        let mut cases = cases(&g);
        if DEBUG {
            // About 1 s per token row unoptimized: the two shortest prompts, teacher-forced
            // only. `--release` checks all ten.
            cases.sort_by_key(|c| c.prompt.len());
            cases.truncate(2);
            eprintln!(
                "{file}: unoptimized build: 2 of 10 prompts, teacher-forced only (use --release for all)"
            );
        }
        let (mut forced_ok, mut free_ok) = (0, 0);
        let (mut worst_p, mut sum_p, mut n_p) = (0.0f64, 0.0f64, 0usize);
        let mut bad_p = 0;
        for c in &cases {
            let steps = forced_steps(&mut r, &c.prompt, &c.tokens);
            assert_eq!(steps.len(), c.tokens.len());
            let mut mismatches = Vec::new();
            for (i, (logits, want)) in steps.iter().zip(&c.tokens).enumerate() {
                let got = argmax(logits);
                let top = c.top[i].as_deref();
                if let Some(top) = top {
                    let p_ref = top.iter().find(|e| e.0 == *want).map_or(0.0, |e| e.1);
                    let p = prob(logits, *want);
                    let d = (p - p_ref).abs();
                    worst_p = worst_p.max(d);
                    sum_p += d;
                    n_p += 1;
                    if d > TOP1_TOL {
                        eprintln!(
                            "{file} {} step {i}: p(llama.cpp's token) {p:.4}, llama.cpp {p_ref:.4}",
                            c.name
                        );
                        bad_p += 1;
                    }
                }
                if got != *want {
                    // How far below llama.cpp's top-1 den's pick is, in llama.cpp's own
                    // probabilities (absent from its top 8: at least its 8th).
                    let gap = top.map(|t| {
                        let p1 = t.first().map_or(0.0, |e| e.1);
                        let pg = t
                            .iter()
                            .find(|e| e.0 == got)
                            .or(t.last())
                            .map_or(0.0, |e| e.1);
                        p1 - pg
                    });
                    if gap.is_some_and(|g| g > NEAR_TIE) {
                        eprintln!(
                            "{file} {} step {i}: den picks {got}, {gap:?} below llama.cpp's top 1 {top:?}",
                            c.name
                        );
                        bad_p += 1;
                    }
                    mismatches.push((i, got, *want, gap));
                }
            }
            if mismatches
                .iter()
                .all(|(_, _, _, g)| g.is_none_or(|g| g <= TIE))
            {
                forced_ok += 1;
            }
            let same = if DEBUG {
                0
            } else {
                let (free, _) = greedy(&mut r, &c.prompt, c.tokens.len());
                free.iter()
                    .zip(&c.tokens)
                    .take_while(|(a, b)| a == b)
                    .count()
            };
            if same == c.tokens.len() {
                free_ok += 1;
            }
            eprintln!(
                "{file} {}: forced mismatches (step, den, llama.cpp, gap in llama.cpp's p) {mismatches:?}; free-running: {same}/{} agree",
                c.name,
                c.tokens.len()
            );
        }
        eprintln!(
            "{file}: teacher-forced agreement on {forced_ok}/{n} prompts, free-running on {free_ok}/{n}; |Δp| worst {worst_p:.4}, mean {:.4}",
            sum_p / n_p.max(1) as f64,
            n = cases.len(),
        );
        assert_eq!(bad_p, 0, "{file}: {bad_p} steps off (see above)");
        let mean = sum_p / n_p.max(1) as f64;
        assert!(
            mean <= TOP1_MEAN_TOL,
            "{file}: mean |Δp| {mean:.4} > {TOP1_MEAN_TOL}"
        );
        assert!(
            forced_ok * 10 >= cases.len() * 9,
            "{file}: teacher-forced agreement on only {forced_ok} of {} prompts",
            cases.len()
        );
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
/// bench_forward_long_context` (`DEN_BENCH_THREADS`, default 1); beside llama.cpp's
/// `llama-bench -m FILE -t 1 -fa 1 -p 0 -n 16 -d 512,2048` (see BENCHMARKS.md).
#[test]
#[ignore = "a measurement, not a check; run with --release"]
fn bench_forward_long_context() {
    let Some(dir) = models_dir("bench_forward_long_context") else {
        return;
    };
    let threads = bench_threads(1);
    let f = open(&dir, SMOL);
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
            "{SMOL} ({threads} threads) at {context} tokens of context: prefill {:.1} tok/s, decode {:.2} ms/token ({:.1} tok/s)",
            context as f64 / prefill,
            decode * 1e3,
            1.0 / decode
        );
    }
}
