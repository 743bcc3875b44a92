//! den against llama.cpp on the real files: greedy continuations and their probabilities
//! (`tests/golden/llamacpp_<model>.json` and `llamacpp_long_<model>.json`, written by
//! `tests/golden/llamacpp_golden.sh` from a llama.cpp build), with `DEN_TEST_MODELS`.

use std::path::Path;

use den_model::arch::Model;
use den_model::kv::{HostKvPages, Sequence};
use den_model::{BatchRow, Runner, RunnerOptions};
use serde_json::Value as Json;

use crate::dequant::models_dir;
use crate::forward_real::{DEBUG, GEMMA, SMOL, argmax, greedy, open, prob};

/// Which goldens, and how den computes the logits llama.cpp's are compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Set {
    /// Ten prompts of 5–45 tokens; teacher-forced as one batch of prompt and continuation
    /// (under 64 rows: llama.cpp's f16 flash attention throughout).
    Short,
    /// Five prompts of 98–246 tokens, in llama-server's shapes: the prompt prefilled in
    /// one batch (64 rows or more: the tiled f32 attention), then one decode step per
    /// token of llama.cpp's continuation.
    Long,
}

impl Set {
    fn file(self, model: &str) -> String {
        let stem = model.trim_end_matches(".gguf");
        match self {
            Set::Short => format!("llamacpp_{stem}.json"),
            Set::Long => format!("llamacpp_long_{stem}.json"),
        }
    }

    /// The logits at each of llama.cpp's steps with llama.cpp's tokens as the context
    /// (teacher forcing): for the last prompt row and every continuation row but the last.
    fn steps(self, r: &mut Runner<'_, '_>, prompt: &[u32], cont: &[u32]) -> Vec<Vec<f32>> {
        let m = r.model();
        let all: Vec<u32> = prompt.iter().chain(cont).copied().collect();
        let mut kv = HostKvPages::new(m.kv_layout(), 16, all.len().div_ceil(16) as u32).unwrap();
        let mut seq = Sequence::new();
        kv.reserve(&mut seq, all.len() as u32).unwrap();
        if self == Set::Long {
            let mut steps = vec![r.prefill(prompt, &mut kv, &mut seq).unwrap().to_vec()];
            for t in &cont[..cont.len().saturating_sub(1)] {
                steps.push(r.decode(*t, &mut kv, &mut seq).unwrap().to_vec());
            }
            return steps;
        }
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
}

fn golden(set: Set, model: &str) -> Json {
    let name = set.file(model);
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(&name);
    let Ok(text) = std::fs::read_to_string(&path) else {
        panic!("tests/golden/{name} is missing: run tests/golden/llamacpp_golden.sh");
    };
    serde_json::from_str(&text).unwrap()
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
/// Long prompts ([`Set::Long`], same build): SmolLM2 5/5, 3/5, 0.072, 0.013; Gemma 3 5/5,
/// 4/5, 0.089, 0.013 (with the one-head-at-a-time f32 attention den had before its tiled
/// path: 5/5, 3/5, mean 0.014, and 5/5, 3/5, 0.017). Not as close as the short prompts,
/// and not for the attention path: den's step-0 probabilities read the same to four
/// decimals with its prompt in 32-row chunks (the f16 path) as in one batch. llama.cpp
/// moves as much against itself: the same server with `-ub 32` gives the golden's first
/// token a probability 0.000–0.030 away (mean 0.008) on SmolLM2's five prompts and
/// 0.000–0.025 (mean 0.015) on Gemma 3's, where den is 0.003–0.041 (mean 0.014) and
/// 0.000–0.036 (mean 0.020) away.
/// `DEN_GOLDEN_EXACT=1` runs den's exact mode instead.
const TOP1_TOL: f64 = 0.2;
const TOP1_MEAN_TOL: f64 = 0.03;
const TIE: f64 = 0.06;
const NEAR_TIE: f64 = 0.1;

fn check(set: Set) {
    let Some(dir) = models_dir(match set {
        Set::Short => "golden_matches_llama_cpp",
        Set::Long => "golden_long_prompts_match_llama_cpp",
    }) else {
        return;
    };
    for file in [SMOL, GEMMA] {
        let g = golden(set, file);
        let f = open(&dir, file);
        let m = Model::load(&f).unwrap_or_else(|e| panic!("{e}"));
        let mode = if std::env::var_os("DEN_GOLDEN_EXACT").is_some() {
            den_model::arch::MatmulMode::Exact
        } else {
            den_model::arch::MatmulMode::Quantized
        };
        // A long prompt is one batch, as llama-server's (one ubatch of up to 512 rows).
        let max_batch = match set {
            Set::Short => RunnerOptions::default().max_batch,
            Set::Long => 512,
        };
        let opts = RunnerOptions {
            mode,
            max_batch,
            ..RunnerOptions::default()
        };
        let mut r = Runner::new(&m, opts).unwrap();
        let mut cases = cases(&g);
        if DEBUG {
            // Unoptimized test builds check less: the two shortest prompts, teacher-forced
            // only. `--release` checks them all.
            cases.sort_by_key(|c| c.prompt.len());
            cases.truncate(2);
            eprintln!(
                "{file}: unoptimized build: 2 of {} prompts, teacher-forced only (use --release for all)",
                cases.len()
            );
        }
        judge(set, file, &mut r, &cases);
    }
}

/// The assertions of [`check`] for one model's cases.
fn judge(set: Set, file: &str, r: &mut Runner<'_, '_>, cases: &[Case]) {
    let (mut forced_ok, mut free_ok) = (0, 0);
    let (mut worst_p, mut sum_p, mut n_p) = (0.0f64, 0.0f64, 0usize);
    let mut bad_p = 0;
    for c in cases {
        let steps = set.steps(r, &c.prompt, &c.tokens);
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
            let (free, _) = greedy(r, &c.prompt, c.tokens.len());
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

#[test]
fn golden_matches_llama_cpp() {
    check(Set::Short);
}

/// The same judgement on prompts long enough that llama.cpp (and den) prefill them with
/// the tiled f32 attention, which the short prompts never reach.
#[test]
fn golden_long_prompts_match_llama_cpp() {
    check(Set::Long);
}
