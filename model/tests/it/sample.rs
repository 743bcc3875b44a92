//! Sampling on crafted logits, and the generation state machine on the tiny byte-level
//! tokenizer (tokens forced by one-hot logits under greedy sampling).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use den_model::sample::{
    FinishReason, Generation, GenerationConfig, GenerationError, Rng, Sampler, SamplerConfig, Step,
    argmax,
};
use den_model::tokenizer::Tokenizer;

use crate::tiny::{self, bl_byte};

// --- counting allocations on this thread --------------------------------------------------

/// The system allocator, counting each thread's allocations (other tests' threads do not
/// disturb a count).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call goes straight to `System`; the counter is a const-initialised
// thread-local `Cell`, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// --- the sampler ------------------------------------------------------------------------

fn config(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        seed,
    }
}

/// Varied logits over 1,000 tokens, the same every run.
fn varied_logits() -> Vec<f32> {
    let mut r = Rng::seeded(42);
    (0..1000)
        .map(|_| (r.next_f64() * 8.0 - 4.0) as f32)
        .collect()
}

fn draws(cfg: SamplerConfig, logits: &[f32], n: usize) -> Vec<u32> {
    let mut s = Sampler::new(cfg);
    (0..n).map(|_| s.sample(logits).unwrap()).collect()
}

/// How often each id came up, as fractions.
fn frequencies(ids: &[u32], n_vocab: usize) -> Vec<f64> {
    let mut f = vec![0.0; n_vocab];
    for &i in ids {
        f[i as usize] += 1.0 / ids.len() as f64;
    }
    f
}

fn ln(p: &[f64]) -> Vec<f32> {
    p.iter().map(|&x| x.ln() as f32).collect()
}

#[test]
fn the_same_seed_and_logits_give_the_same_tokens() {
    let logits = varied_logits();
    for cfg in [
        config(1.0, 0, 1.0, 0.0, 7),
        config(0.7, 40, 0.9, 0.0, 7),
        config(1.3, 0, 0.95, 0.05, 7),
    ] {
        let a = draws(cfg.clone(), &logits, 300);
        let b = draws(cfg.clone(), &logits, 300);
        assert_eq!(a, b, "{cfg:?}");
        let other = draws(
            SamplerConfig {
                seed: 8,
                ..cfg.clone()
            },
            &logits,
            300,
        );
        assert_ne!(a, other, "another seed, another stream: {cfg:?}");
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(distinct.len() > 5, "it does sample: {cfg:?}");
    }
}

#[test]
fn greedy_takes_the_most_likely_token() {
    let logits = varied_logits();
    let best = argmax(&logits).unwrap();
    assert!(
        draws(SamplerConfig::greedy(), &logits, 20)
            .iter()
            .all(|&i| i == best)
    );
    assert!(
        draws(config(1.0, 1, 1.0, 0.0, 3), &logits, 50)
            .iter()
            .all(|&i| i == best)
    );
    assert!(
        draws(config(1.0, 0, 0.0, 0.0, 3), &logits, 50)
            .iter()
            .all(|&i| i == best)
    );
    assert!(
        draws(config(1e-4, 0, 1.0, 0.0, 3), &logits, 50)
            .iter()
            .all(|&i| i == best)
    );
}

#[test]
fn top_k_keeps_exactly_the_k_most_likely_in_proportion() {
    let logits = [0.0, 1.0, 2.0, 3.0, 4.0, 3.5];
    let ids = draws(config(1.0, 2, 1.0, 0.0, 11), &logits, 20_000);
    let f = frequencies(&ids, logits.len());
    assert_eq!(f[0] + f[1] + f[2] + f[3], 0.0, "{f:?}");
    // Renormalised over {4, 5}: e^4 / (e^4 + e^3.5) = 0.6225.
    let want = 1.0 / (1.0 + (-0.5f64).exp());
    assert!((f[4] - want).abs() < 0.015, "{f:?} want {want}");
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let logits = ln(&[0.05, 0.5, 0.15, 0.3]);
    let kept = |top_p: f32| {
        let ids = draws(config(1.0, 0, top_p, 0.0, 5), &logits, 5000);
        let mut set: Vec<u32> = ids
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        set.sort();
        set
    };
    assert_eq!(kept(0.49), vec![1]);
    assert_eq!(kept(0.79), vec![1, 3]);
    assert_eq!(kept(0.81), vec![1, 2, 3]);
    assert_eq!(kept(0.96), vec![0, 1, 2, 3]);
    // In proportion within the kept set: 0.5 / 0.8 and 0.3 / 0.8.
    let f = frequencies(&draws(config(1.0, 0, 0.79, 0.0, 9), &logits, 20_000), 4);
    assert!(
        (f[1] - 0.625).abs() < 0.015 && (f[3] - 0.375).abs() < 0.015,
        "{f:?}"
    );
}

#[test]
fn top_p_over_a_large_vocabulary() {
    // 50,000 tokens: 10 likely ones hold ~90% of the mass, the rest share 10%.
    let mut p = vec![0.1 / 49_990.0; 50_000];
    for i in 0..10 {
        p[i * 4999] = 0.09;
    }
    let logits = ln(&p);
    let ids = draws(config(1.0, 0, 0.85, 0.0, 1), &logits, 400);
    assert!(
        ids.iter().all(|&i| i % 4999 == 0 && i < 49_991),
        "only the likely ten"
    );
    let distinct: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), 10);
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_best() {
    let logits = ln(&[0.5, 0.3, 0.15, 0.05]);
    let ids = draws(config(1.0, 0, 1.0, 0.5, 2), &logits, 5000);
    let f = frequencies(&ids, 4);
    assert!(
        f[2] == 0.0 && f[3] == 0.0 && f[0] > 0.0 && f[1] > 0.0,
        "{f:?}"
    );
}

#[test]
fn temperature_reshapes_the_distribution() {
    let logits = ln(&[0.5, 0.3, 0.2]);
    let f = frequencies(&draws(config(1.0, 0, 1.0, 0.0, 4), &logits, 40_000), 3);
    for (got, want) in f.iter().zip([0.5, 0.3, 0.2]) {
        assert!((got - want).abs() < 0.01, "{f:?}");
    }
    // T = 0.5 squares the probabilities: 0.25, 0.09, 0.04 over 0.38.
    let f = frequencies(&draws(config(0.5, 0, 1.0, 0.0, 4), &logits, 40_000), 3);
    for (got, want) in f.iter().zip([0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38]) {
        assert!((got - want).abs() < 0.01, "{f:?}");
    }
}

#[test]
fn nan_and_negative_infinity_are_never_chosen() {
    let logits = [f32::NAN, f32::NEG_INFINITY, 0.0, f32::NAN, -1.0];
    for cfg in [
        SamplerConfig::greedy(),
        config(1.0, 0, 1.0, 0.0, 1),
        config(2.0, 3, 0.9, 0.0, 1),
    ] {
        let ids = draws(cfg, &logits, 500);
        assert!(ids.iter().all(|&i| i == 2 || i == 4), "{ids:?}");
    }
    let mut s = Sampler::new(config(1.0, 0, 1.0, 0.0, 1));
    assert_eq!(s.sample(&[f32::NAN, f32::NEG_INFINITY]), None);
    assert_eq!(s.sample(&[]), None);
    assert_eq!(s.sample(&[f32::INFINITY, 0.0]), Some(0));
}

#[test]
fn sampling_allocates_nothing_once_warm() {
    let logits = varied_logits();
    for cfg in [
        SamplerConfig::greedy(),
        config(1.0, 0, 1.0, 0.0, 1),
        config(0.8, 40, 0.95, 0.05, 1),
        config(1.0, 0, 0.9, 0.0, 1),
    ] {
        let mut s = Sampler::new(cfg.clone());
        s.sample(&logits).unwrap();
        let before = allocations();
        for _ in 0..100 {
            s.sample(&logits).unwrap();
        }
        assert_eq!(allocations() - before, 0, "{cfg:?}");
    }
}

// --- the generation state machine -------------------------------------------------------

fn one_hot(t: &Tokenizer, id: u32) -> Vec<f32> {
    let mut l = vec![0.0; t.n_vocab()];
    l[id as usize] = 1.0;
    l
}

fn greedy_config() -> GenerationConfig {
    GenerationConfig {
        sampler: SamplerConfig::greedy(),
        ..GenerationConfig::default()
    }
}

/// Owned copy of a step, to compare.
#[derive(Debug, PartialEq)]
enum S {
    T(u32, String),
    F(FinishReason, u32, String),
}

fn own(step: Step<'_>) -> S {
    match step {
        Step::Token { id, text } => S::T(id, text.to_owned()),
        Step::Finished { reason, id, text } => S::F(reason, id, text.to_owned()),
    }
}

/// Feeds `ids` (as one-hot logits) until the generation finishes.
fn run(t: &Tokenizer, config: GenerationConfig, ids: &[u32]) -> Vec<S> {
    let mut g = Generation::new(t, config, 10, 4096).unwrap();
    let mut out = Vec::new();
    for &id in ids {
        let s = own(g.step(t, &one_hot(t, id)).unwrap());
        let done = matches!(s, S::F(..));
        out.push(s);
        if done {
            assert!(g.finished().is_some());
            assert_eq!(
                g.step(t, &one_hot(t, id)),
                Err(GenerationError::AlreadyFinished)
            );
            break;
        }
    }
    out
}

fn visible(steps: &[S]) -> String {
    steps
        .iter()
        .map(|s| match s {
            S::T(_, t) | S::F(_, _, t) => t.as_str(),
        })
        .collect()
}

#[test]
fn a_stop_string_split_across_tokens_ends_the_generation_before_it() {
    let t = tiny::byte_level();
    let id = |s: &str| t.token_id(s).unwrap();
    let cfg = GenerationConfig {
        stop: vec!["lo wo".into()],
        ..greedy_config()
    };
    let steps = run(&t, cfg, &[id("hello"), id("Ġwor"), id("ld")]);
    assert_eq!(
        steps,
        vec![
            S::T(id("hello"), "hel".into()),
            S::F(FinishReason::Stop, id("Ġwor"), "".into()),
        ]
    );
    // A held-back prefix that does not become the stop string is released.
    let cfg = GenerationConfig {
        stop: vec!["lo!".into(), "xyz".into()],
        ..greedy_config()
    };
    let steps = run(&t, cfg, &[id("hello"), id("Ġwor"), id("ld"), 2]);
    assert_eq!(
        steps,
        vec![
            S::T(id("hello"), "hel".into()),
            S::T(id("Ġwor"), "lo wor".into()),
            S::T(id("ld"), "ld".into()),
            S::F(FinishReason::Stop, 2, "".into()),
        ]
    );
    // The stop string inside one token: the text before it comes out.
    let cfg = GenerationConfig {
        stop: vec!["ell".into()],
        ..greedy_config()
    };
    assert_eq!(
        run(&t, cfg, &[id("hello")]),
        vec![S::F(FinishReason::Stop, id("hello"), "h".into())]
    );
}

#[test]
fn a_multibyte_stop_string_over_byte_tokens() {
    let t = tiny::byte_level();
    let cfg = GenerationConfig {
        stop: vec!["b€".into()],
        ..greedy_config()
    };
    let ids = [
        bl_byte(b'a'),
        bl_byte(b'b'),
        bl_byte(0xE2),
        bl_byte(0x82),
        bl_byte(0xAC),
        bl_byte(b'c'),
    ];
    let steps = run(&t, cfg, &ids);
    assert_eq!(visible(&steps), "a");
    assert_eq!(
        steps.last(),
        Some(&S::F(FinishReason::Stop, bl_byte(0xAC), "".into()))
    );
    // Without the stop: the character comes out whole, on its last byte.
    let steps = run(&t, greedy_config(), &ids);
    let texts: Vec<&str> = steps
        .iter()
        .map(|s| match s {
            S::T(_, t) | S::F(_, _, t) => t.as_str(),
        })
        .collect();
    assert_eq!(texts, vec!["a", "b", "", "", "€", "c"]);
}

#[test]
fn eos_and_stop_ids_stop_and_release_the_held_text() {
    let t = tiny::byte_level();
    let id = |s: &str| t.token_id(s).unwrap();
    let stop_lo = || vec!["lo!".to_owned()];
    // EOS (<|im_end|>, 2) and <|endoftext|> (0) both end it.
    for eog in [2, 0] {
        let cfg = GenerationConfig {
            stop: stop_lo(),
            ..greedy_config()
        };
        assert_eq!(
            run(&t, cfg, &[id("hello"), eog]),
            vec![
                S::T(id("hello"), "hel".into()),
                S::F(FinishReason::Stop, eog, "lo".into())
            ]
        );
    }
    // A stop token id.
    let cfg = GenerationConfig {
        stop_token_ids: vec![id("ld")],
        ..greedy_config()
    };
    assert_eq!(
        run(&t, cfg, &[id("hello"), id("ld")]),
        vec![
            S::T(id("hello"), "hello".into()),
            S::F(FinishReason::Stop, id("ld"), "".into())
        ]
    );
    // ignore_eos: EOS is just a (hidden) token.
    let cfg = GenerationConfig {
        ignore_eos: true,
        max_tokens: Some(3),
        ..greedy_config()
    };
    assert_eq!(
        run(&t, cfg, &[id("hello"), 2, id("ld")]),
        vec![
            S::T(id("hello"), "hello".into()),
            S::T(2, "".into()),
            S::F(FinishReason::Length, id("ld"), "ld".into()),
        ]
    );
    // skip_special off: control tokens show.
    let cfg = GenerationConfig {
        ignore_eos: true,
        skip_special: false,
        max_tokens: Some(2),
        ..greedy_config()
    };
    assert_eq!(visible(&run(&t, cfg, &[1, 2])), "<|im_start|><|im_end|>");
}

#[test]
fn max_tokens_and_the_context_bound_the_length() {
    let t = tiny::byte_level();
    let id = |s: &str| t.token_id(s).unwrap();
    let cfg = GenerationConfig {
        max_tokens: Some(2),
        stop: vec!["lo!".into()],
        ..greedy_config()
    };
    assert_eq!(
        run(&t, cfg, &[id("hello"), id("Ġwor"), id("ld")]),
        vec![
            S::T(id("hello"), "hel".into()),
            S::F(FinishReason::Length, id("Ġwor"), "lo wor".into()),
        ]
    );
    // Default max_tokens: the rest of the context.
    let g = Generation::new(&t, greedy_config(), 100, 160).unwrap();
    assert_eq!(g.limit(), 60);
    let g = Generation::new(
        &t,
        GenerationConfig {
            max_tokens: Some(500),
            ..greedy_config()
        },
        100,
        160,
    )
    .unwrap();
    assert_eq!(g.limit(), 60);
    let mut g = Generation::new(&t, greedy_config(), 158, 160).unwrap();
    assert!(matches!(
        g.step(&t, &one_hot(&t, id("ld"))).unwrap(),
        Step::Token { .. }
    ));
    assert!(matches!(
        g.step(&t, &one_hot(&t, id("ld"))).unwrap(),
        Step::Finished {
            reason: FinishReason::Length,
            ..
        }
    ));
    assert_eq!(g.produced(), 2);
    // An incomplete character at the limit comes out as U+FFFD.
    let cfg = GenerationConfig {
        max_tokens: Some(2),
        ..greedy_config()
    };
    assert_eq!(
        visible(&run(&t, cfg, &[bl_byte(b'a'), bl_byte(0xE2)])),
        "a\u{FFFD}"
    );
}

#[test]
fn generation_errors_are_typed() {
    let t = tiny::byte_level();
    assert_eq!(
        Generation::new(&t, greedy_config(), 100, 100).unwrap_err(),
        GenerationError::PromptFillsContext {
            prompt: 100,
            context: 100
        }
    );
    let cfg = GenerationConfig {
        max_tokens: Some(0),
        ..greedy_config()
    };
    assert_eq!(
        Generation::new(&t, cfg, 1, 100).unwrap_err(),
        GenerationError::ZeroMaxTokens
    );
    let mut g = Generation::new(&t, greedy_config(), 1, 100).unwrap();
    assert_eq!(
        g.step(&t, &[f32::NAN; 4]),
        Err(GenerationError::NoCandidates)
    );
    assert_eq!(
        GenerationError::PromptFillsContext {
            prompt: 9,
            context: 8
        }
        .to_string(),
        "the prompt's 9 tokens leave no room in the context of 8"
    );
}

#[test]
fn seeded_generation_repeats_and_steps_allocate_nothing() {
    let t = tiny::byte_level();
    let logits: Vec<f32> = (0..t.n_vocab())
        .map(|i| ((i * 37 % 101) as f32) / 25.0)
        .collect();
    let cfg = GenerationConfig {
        sampler: config(0.9, 50, 0.95, 0.0, 1234),
        stop: vec!["never appears \u{1}".into()],
        ignore_eos: true,
        ..GenerationConfig::default()
    };
    let collect = || {
        let mut g = Generation::new(&t, cfg.clone(), 1, 1000).unwrap();
        (0..200)
            .map(|_| own(g.step(&t, &logits).unwrap()))
            .collect::<Vec<_>>()
    };
    assert_eq!(collect(), collect());

    let mut g = Generation::new(&t, cfg.clone(), 1, 1000).unwrap();
    for _ in 0..20 {
        let _ = g.step(&t, &logits).unwrap();
    }
    let before = allocations();
    for _ in 0..200 {
        let _ = g.step(&t, &logits).unwrap();
    }
    assert_eq!(allocations() - before, 0, "allocations in 200 steps");
}

#[test]
fn ending_from_outside_releases_the_held_text_once() {
    let t = tiny::byte_level();
    let id = |s: &str| t.token_id(s).unwrap();
    let cfg = GenerationConfig {
        stop: vec!["lo!".into()],
        ..greedy_config()
    };
    let mut g = Generation::new(&t, cfg, 10, 4096).unwrap();
    assert_eq!(
        own(g.accept(&t, id("hello")).unwrap()),
        S::T(id("hello"), "hel".into())
    );
    // "lo" might begin "lo!": held back until the generation ends from outside.
    assert_eq!(g.end(), "lo");
    assert_eq!(g.finished(), Some(FinishReason::Length));
    assert_eq!(g.end(), "", "nothing twice");
    assert_eq!(
        g.accept(&t, id("hello")),
        Err(GenerationError::AlreadyFinished)
    );
}
