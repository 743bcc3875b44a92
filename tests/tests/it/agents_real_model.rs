//! A real model served end to end: `den-agent router --model-file` and `den-agent worker
//! --model-file` on loopback, with SmolLM2-135M (llama) and Gemma 3 270M (gemma3) from
//! `tests/fetch-models`.
//!
//! - Greedy continuations through the whole stack are exactly den-model's own, run in this
//!   process (prefill in 16-token pieces, then one token per step, where the worker
//!   prefills 64 rows a step): den-model's CPU kernels compute each row on its own, so
//!   batch shapes do not change a bit, and the worker's pages, two-phase appends and
//!   sampling change nothing. Eight requests at once are batched (steps with several
//!   decode rows) and each gets exactly the tokens it gets alone. Against
//!   llama.cpp on the same file (`model/tests/golden/llamacpp_*.json`, made by
//!   `llamacpp_golden.sh`) a free-running continuation may part at a near tie, as
//!   llama.cpp's own builds do with each other (3 of 10 prompts agree on all 16 tokens
//!   between two of them: see `model/tests/it/forward_real.rs`); where den's first differs,
//!   llama.cpp's probabilities of the two tokens must be within 0.1. The per-step
//!   agreement with llama.cpp, teacher-forced, is den-model's own test.
//! - The OpenAI ingress streams the model's text (the deltas add up to the non-streamed
//!   answer), reports the worker's reused prefix as `cached_tokens`, applies stop strings,
//!   seeds, and refuses a prompt longer than the context with a 400 naming the limit.
//! - A prefix evicted from the worker's pages is restored from its RAM tier into other
//!   pages, and the continuation after it is the same as after computing it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use den_tests::agents::{Router, client, start_router, start_worker};
use den_tests::environment::model_file;
use den_tests::workspace_dir;

const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";
const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

fn golden(file: &str) -> Value {
    let stem = file.strip_suffix(".gguf").unwrap();
    let path = workspace_dir().join(format!("model/tests/golden/llamacpp_{stem}.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

/// A router and one worker serving `path` as `id` (chunks of 16 tokens, 16-row pages).
fn serve(path: &Path, id: &str, worker_extra: &[&str]) -> (Router, den_tests::agents::Worker) {
    let spec = format!("{id}={}", path.display());
    let router = start_router(None, &["--model-file", &spec]);
    let file = path.display().to_string();
    let mut args = vec!["--model-file", file.as_str(), "--model", id];
    args.extend_from_slice(worker_extra);
    let worker = start_worker(&router, "w-real", true, &args);
    (router, worker)
}

async fn generate(router: &Router, body: Value) -> Value {
    router.generate(body).await.terminal
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// Where den's greedy tokens first leave llama.cpp's, if they do, checked to be a near tie
/// (a step llama-server gave no probabilities for, a token ending no UTF-8 character, is
/// not judged).
fn divergence(name: &str, den: &[u64], case: &Value) -> Option<usize> {
    let want = ids(&case["tokens"]);
    assert_eq!(
        den.len(),
        want.len(),
        "{name}: {den:?} vs llama.cpp {want:?}"
    );
    let at = den.iter().zip(&want).position(|(a, b)| a != b)?;
    let Some(top) = case["top"][at].as_array() else {
        return Some(at);
    };
    let p = |id: u64| {
        top.iter()
            .find(|e| e["id"].as_u64() == Some(id))
            .and_then(|e| e["p"].as_f64())
    };
    let (best, ours) = (p(want[at]), p(den[at]));
    match (best, ours) {
        (Some(b), Some(o)) if b - o <= 0.1 => Some(at),
        _ => panic!(
            "{name}: den's token {} at step {at} is not a near tie in llama.cpp's probabilities (its {} has p {best:?}, den's {ours:?}); den {den:?}, llama.cpp {want:?}",
            den[at], want[at]
        ),
    }
}

async fn agrees_with_llama_cpp(file: &str) {
    let Some(path) = model_file(file) else {
        return;
    };
    let (router, _worker) = serve(&path, "m", &[]);
    router.wait_workers(&["w-real"]).await;
    let g = golden(file);
    let cases = g["prompts"].as_array().unwrap();
    assert_eq!(cases.len(), 10);
    let reference = InProcess::open(&path);
    let mut exact = 0;
    for (i, case) in cases.iter().enumerate() {
        let name = case["name"].as_str().unwrap();
        let prompt: Vec<u64> = ids(&case["prompt"]);
        let done = generate(
            &router,
            json!({"id": format!("golden-{i}"), "model": "m", "tokens": prompt,
                   "max_new_tokens": 16, "temperature": 0, "ignore_eos": true}),
        )
        .await;
        assert_eq!(done["type"], "completed", "{name}: {done}");
        let served = ids(&done["tokens"]);
        assert_eq!(
            served,
            reference.greedy(&prompt, 16),
            "{file} {name}: served tokens vs den-model in process"
        );
        match divergence(name, &served, case) {
            None => exact += 1,
            Some(at) => eprintln!("{file} {name}: parts from llama.cpp at step {at}"),
        }
    }
    eprintln!("{file}: {exact} of 10 free-running continuations equal llama.cpp's 16 tokens");
}

/// den-model run directly, with the worker's batch shapes.
pub(crate) struct InProcess {
    file: den_model::GgufFile,
}

impl InProcess {
    pub(crate) fn open(path: &Path) -> InProcess {
        InProcess {
            file: den_model::GgufFile::open(path).unwrap(),
        }
    }

    /// Greedy: every prompt token but the last prefilled 16 at a time (the worker's chunk
    /// size here), then one token per step from the last prompt token on.
    pub(crate) fn greedy(&self, prompt: &[u64], n: usize) -> Vec<u64> {
        use den_model::{HostKvPages, Model, Runner, RunnerOptions, Sequence};
        let model = Model::load(&self.file).unwrap();
        let mut runner = Runner::new(&model, RunnerOptions::default()).unwrap();
        let total = (prompt.len() + n) as u32;
        let mut kv = HostKvPages::new(model.kv_layout(), 16, total.div_ceil(16)).unwrap();
        let mut seq = Sequence::new();
        kv.reserve(&mut seq, total).unwrap();
        let prompt: Vec<u32> = prompt.iter().map(|t| *t as u32).collect();
        let (head, last) = prompt.split_at(prompt.len() - 1);
        for piece in head.chunks(16) {
            runner.prefill(piece, &mut kv, &mut seq).unwrap();
        }
        let mut next = last[0];
        let mut out = Vec::new();
        for _ in 0..n {
            let logits = runner.decode(next, &mut kv, &mut seq).unwrap();
            next = den_model::sample::argmax(logits).unwrap();
            out.push(u64::from(next));
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_real_smollm2_greedy_agrees_with_llama_cpp() {
    agrees_with_llama_cpp(SMOLLM2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_real_gemma3_greedy_agrees_with_llama_cpp() {
    agrees_with_llama_cpp(GEMMA3).await;
}

/// Spec §7 K-3 on a real model: concurrent requests on one batched worker all complete,
/// with their deltas, and steps carry several of them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_real_model_batches_concurrent_requests_without_changing_them() {
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    let (router, worker) = serve(&path, "m", &[]);
    router.wait_workers(&["w-real"]).await;
    let g = golden(SMOLLM2);
    let prompts: Vec<Vec<u64>> = g["prompts"].as_array().unwrap()[..8]
        .iter()
        .map(|c| ids(&c["prompt"]))
        .collect();
    let body = |i: usize, p: &[u64]| {
        json!({"id": format!("alone-{i}"), "model": "m", "tokens": p, "max_new_tokens": 12,
               "temperature": 0, "ignore_eos": true})
    };
    let mut alone = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let done = generate(&router, body(i, p)).await;
        alone.push(ids(&done["tokens"]));
    }
    worker.wait_idle().await;
    worker.fault("/fault/evict-resident").await;
    let before = worker.metrics_text().await;
    let together = futures_util::future::join_all(prompts.iter().enumerate().map(|(i, p)| {
        let mut b = body(i, p);
        b["id"] = json!(format!("together-{i}"));
        // Distinct from the first round's ids: a new request each.
        let router = &router;
        async move { generate(router, b).await }
    }))
    .await;
    for (i, done) in together.iter().enumerate() {
        assert_eq!(done["type"], "completed", "{done}");
        assert_eq!(
            ids(&done["tokens"]),
            alone[i],
            "prompt {i} batched vs alone"
        );
    }
    let after = worker.metrics_text().await;
    let delta = |name: &str, labels: &[(&str, &str)]| {
        den_tests::agents::metric(&after, name, labels)
            - den_tests::agents::metric(&before, name, labels)
    };
    let rows = delta("den_model_step_rows_total", &[("kind", "decode")]);
    let steps = delta("den_model_decode_steps_total", &[]);
    assert!(rows >= 8.0 * 12.0, "{rows} decode rows");
    assert!(
        rows >= 2.0 * steps,
        "decodes shared steps: {rows} decode rows in {steps} steps"
    );
    // The worker reports its engine plan with the step costs it measured, which the
    // router prices its candidates with (den_protocol::engine_plan).
    let observed = router.workers().await;
    let w = observed
        .iter()
        .find(|w| w["worker_id"] == "w-real")
        .expect("the worker's observation");
    let engine = &w["engine"];
    // Fitted by least squares over its steps: a fixed cost per step and one per row.
    assert_eq!(engine["costs"]["kind"], "fitted", "{w}");
    let row_us = engine["costs"]["row_us"].as_f64().unwrap_or(0.0);
    let step_us = engine["costs"]["step_us"].as_f64().unwrap_or(0.0);
    assert!(row_us > 0.0 && step_us > 0.0, "{engine}");
    assert_eq!(engine["max_batched_tokens"], 64, "{engine}");
}

/// The SSE `data:` payloads of a streamed answer.
fn sse_events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

async fn post(router: &Router, path: &str, body: &Value) -> (u16, String) {
    let resp = client()
        .post(format!("{}{path}", router.url))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_real_model_streams_reuses_stops_seeds_and_restores() {
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    let (router, worker) = serve(&path, "smollm2", &[]);
    router.wait_workers(&["w-real"]).await;
    let chat = json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Name three colours of the rainbow."}],
        "temperature": 0, "max_tokens": 24,
    });

    // Not streamed, then streamed: the same greedy text; the second reuses the prompt.
    let (status, first) = post(&router, "/v1/chat/completions", &chat).await;
    assert_eq!(status, 200, "{first}");
    let first: Value = serde_json::from_str(&first).unwrap();
    let text = first["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty(), "{first}");
    assert_eq!(first["model"], "smollm2");
    assert!(
        first["system_fingerprint"]
            .as_str()
            .unwrap()
            .starts_with("smollm2@")
    );
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    worker.wait_idle().await;
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, body) = post(&router, "/v1/chat/completions", &streamed).await;
    assert_eq!(status, 200, "{body}");
    let events = sse_events(&body);
    let joined: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(joined, text, "streamed deltas vs the whole answer");
    assert!(
        events
            .iter()
            .filter(|e| e["choices"][0]["delta"]["content"].is_string())
            .count()
            > 3,
        "the text came in several deltas"
    );
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"].as_u64(), Some(prompt_tokens));
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= prompt_tokens - 16 && cached < prompt_tokens,
        "the repeated prompt reused its prefix: {cached} of {prompt_tokens}"
    );

    // A stop string: the text ends before it, finish_reason "stop".
    let mut stopped = chat.clone();
    let word = text.split_whitespace().nth(2).unwrap_or(text).to_owned();
    stopped["stop"] = json!([word.clone()]);
    let (_, body) = post(&router, "/v1/chat/completions", &stopped).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let cut = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{body}");
    assert!(
        !cut.contains(&word),
        "{cut:?} still holds the stop {word:?}"
    );
    assert!(text.starts_with(cut), "{cut:?} is a prefix of {text:?}");

    // Sampling: the same seed gives the same text; the seeds do not all agree.
    let sampled = |seed: u64| {
        json!({"model": "smollm2", "prompt": "My favourite food is", "max_tokens": 12,
               "temperature": 1.0, "seed": seed})
    };
    let mut texts = Vec::new();
    for seed in [7, 7, 8, 9] {
        let (status, body) = post(&router, "/v1/completions", &sampled(seed)).await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        texts.push(v["choices"][0]["text"].as_str().unwrap().to_owned());
    }
    assert_eq!(texts[0], texts[1], "seed 7 twice");
    assert!(
        texts[1] != texts[2] || texts[2] != texts[3],
        "three seeds, one text: {texts:?}"
    );

    // Longer than the context (the pool's 256 × 16 rows, under the model's 8192): a 400.
    let long = "word ".repeat(5000);
    let (status, body) = post(
        &router,
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": long, "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("context_length_exceeded") && body.contains("4096"),
        "{body}"
    );

    // /tokenize equals llama-tokenize on the same file; /detokenize inverts it.
    let golden_tokens: Value = serde_json::from_slice(
        &std::fs::read(workspace_dir().join("model/tests/golden/tokens_smollm2.json")).unwrap(),
    )
    .unwrap();
    let mut checked = 0;
    for case in golden_tokens["cases"].as_array().unwrap() {
        if case["parse_special"] != true {
            continue;
        }
        let (status, body) = post(
            &router,
            "/tokenize",
            &json!({"model": "smollm2", "prompt": case["text"], "add_special_tokens": case["add_special"]}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["tokens"], case["ids"], "{}: {body}", case["name"]);
        assert_eq!(
            v["count"].as_u64(),
            case["ids"].as_array().map(|a| a.len() as u64)
        );
        if case["round_trip"] == true {
            let (_, back) = post(
                &router,
                "/detokenize",
                &json!({"model": "smollm2", "tokens": case["ids"]}),
            )
            .await;
            let back: Value = serde_json::from_str(&back).unwrap();
            assert_eq!(back["prompt"], case["text"], "{}", case["name"]);
        }
        checked += 1;
    }
    assert!(checked >= 10, "{checked} tokenization cases");
    let (status, body) = post(
        &router,
        "/tokenize",
        &json!({"model": "smollm2", "messages": chat["messages"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["count"].as_u64(),
        Some(prompt_tokens),
        "the chat as submitted"
    );
    let (status, body) = post(
        &router,
        "/detokenize",
        &json!({"model": "smollm2", "tokens": [49152]}),
    )
    .await;
    assert_eq!(status, 400, "a token past the vocabulary: {body}");

    // Restore: a 200-token prompt computed, its pages evicted, served again from RAM.
    let g = golden(SMOLLM2);
    let mut prompt: Vec<u64> = Vec::new();
    for case in g["prompts"].as_array().unwrap() {
        prompt.extend(ids(&case["prompt"]));
    }
    prompt.truncate(200);
    let body = |id: &str| {
        json!({"id": id, "model": "smollm2", "tokens": prompt, "max_new_tokens": 12,
               "temperature": 0, "ignore_eos": true})
    };
    let computed = generate(&router, body("computed")).await;
    assert_eq!(computed["tier"], "none", "{computed}");
    worker.wait_idle().await;
    worker.fault("/fault/evict-resident").await;
    den_tests::agents::wait_for(
        "the eviction to be advertised",
        Duration::from_secs(10),
        || async {
            let obs = router.observation("w-real").await?;
            obs["gpu_prefixes"].as_array()?.is_empty().then_some(())
        },
    )
    .await;
    let restored = generate(&router, body("restored")).await;
    assert_eq!(restored["tier"], "ram", "{restored}");
    assert!(
        restored["cached_tokens"].as_u64().unwrap() >= 192,
        "{restored}"
    );
    assert_eq!(
        ids(&restored["tokens"]),
        ids(&computed["tokens"]),
        "the continuation after a restored prefix"
    );
    let metrics = worker.metrics_text().await;
    let restored_ram =
        |m: &str| den_tests::agents::metric(m, "den_restored_tokens_total", &[("tier", "ram")]);
    assert!(restored_ram(&metrics) >= 192.0, "{metrics}");

    // A resident head with only its tail restored: evict again, bring back the first 70
    // tokens (their whole chunks restored from RAM; that route stays resident), then the
    // whole prompt: the head is forked, only the chunks after it are restored, and the
    // continuation is the one computed from scratch.
    worker.wait_idle().await;
    worker.fault("/fault/evict-resident").await;
    den_tests::agents::wait_for(
        "the second eviction to be advertised",
        Duration::from_secs(10),
        || async {
            let obs = router.observation("w-real").await?;
            obs["gpu_prefixes"].as_array()?.is_empty().then_some(())
        },
    )
    .await;
    let head_body = json!({"id": "head", "model": "smollm2", "tokens": &prompt[..70],
                           "max_new_tokens": 4, "temperature": 0, "ignore_eos": true});
    let head = generate(&router, head_body).await;
    assert_eq!(head["tier"], "ram", "{head}");
    let head_cached = head["cached_tokens"].as_u64().unwrap();
    assert!(head_cached > 0, "{head}");
    worker.wait_idle().await;
    den_tests::agents::wait_for(
        "the head to be advertised",
        Duration::from_secs(10),
        || async {
            let obs = router.observation("w-real").await?;
            (!obs["gpu_prefixes"].as_array()?.is_empty()).then_some(())
        },
    )
    .await;
    let before = restored_ram(&worker.metrics_text().await);
    let again = generate(&router, body("head-and-tail")).await;
    assert_eq!(again["tier"], "ram", "{again}");
    let again_cached = again["cached_tokens"].as_u64().unwrap();
    assert_eq!(
        restored_ram(&worker.metrics_text().await) - before,
        (again_cached - head_cached) as f64,
        "only the tail after the resident head is restored: {again}"
    );
    assert_eq!(
        ids(&again["tokens"]),
        ids(&computed["tokens"]),
        "the continuation after a forked head and a restored tail"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_real_model_bad_files_are_one_line_and_tokenizerless_routers_say_so() {
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A truncated copy: the worker refuses to start, in one line naming the file.
    let bytes = std::fs::read(&path).unwrap();
    let cut: PathBuf = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    let out = std::process::Command::new(den_tests::agents::agent_binary())
        .args(["worker", "--router", "ws://127.0.0.1:9", "--model-file"])
        .arg(&cut)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().last().unwrap_or_default();
    assert!(line.contains("cut.gguf"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // A router without the model's file answers text requests with what to do, and still
    // serves token ids.
    let router = start_router(None, &[]);
    let file = path.display().to_string();
    let _w = start_worker(
        &router,
        "w-real",
        false,
        &["--model-file", file.as_str(), "--model", "smollm2"],
    );
    router.wait_workers(&["w-real"]).await;
    let (status, body) = post(
        &router,
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("tokenizer_unavailable") && body.contains("--model-file"),
        "{body}"
    );
    let done = generate(
        &router,
        json!({"model": "smollm2", "tokens": [1, 2, 3], "max_new_tokens": 2, "temperature": 0}),
    )
    .await;
    assert_eq!(done["type"], "completed", "{done}");
    assert!(done["text"].is_null(), "no tokenizer, no text: {done}");
}

/// `den demo` serves the real model when given one, and says in one line when it runs the
/// synthetic engine instead, with how to fetch the model.
#[test]
fn den_demo_serves_the_real_model_or_says_it_is_synthetic() {
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    let den = den_tests::process::binary("den").unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&den)
            .args(args)
            .env_remove("DEN_CONFIG")
            .env_remove("DEN_TOKEN")
            .env("DEN_MODEL_FILE", "")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let file = path.display().to_string();
    let (out, err) = run(&[
        "--no-record",
        "demo",
        "--headless",
        "--duration",
        "6s",
        "--workers",
        "1",
        "--model-file",
        file.as_str(),
    ]);
    assert!(
        err.contains("real model") && err.contains(file.as_str()),
        "{err}"
    );
    let completed: u64 = out
        .split_whitespace()
        .skip_while(|w| *w != "requests:")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(completed >= 1, "the real model answered: {out}");
    let (_, err) = run(&[
        "--no-record",
        "demo",
        "--headless",
        "--duration",
        "1s",
        "--synthetic",
    ]);
    let banner: Vec<&str> = err.lines().filter(|l| l.contains("SYNTHETIC")).collect();
    assert_eq!(banner.len(), 1, "{err}");
    assert!(banner[0].contains("tests/fetch-models"), "{err}");
}

/// Benchmark (BENCHMARKS.md "Restoring a real prefix"): TTFT of a 1,024-token prompt whose
/// prefix is recomputed, resident in the worker's pages, or restored from the RAM, SSD or
/// object tier, with SmolLM2 on the CPU, chunks of 256 tokens (the default). Medians over
/// five distinct prompts per tier, the router's measured TTFT, one new token.
///
/// `cargo build --release -p den-agent && DEN_TEST_MODELS=~/.cache/den/models cargo test
/// --release -p den-tests --test it -- --ignored --nocapture bench_real_restore_ttft`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run it by hand (see BENCHMARKS.md)"]
async fn bench_real_restore_ttft() {
    use den_tests::agents::{Proc, Worker};
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = path.display().to_string();
    let args = |v: &[&str]| -> Vec<String> { v.iter().map(|s| s.to_string()).collect() };
    let mut router_proc = Proc::spawn(
        "router",
        dir.path(),
        &args(&[
            "router",
            "--listen",
            "127.0.0.1:0",
            "--model-file",
            &format!("smollm2={file}"),
        ]),
        &[],
    );
    let url = router_proc.wait_line("den-agent router listening on ", Duration::from_secs(30));
    let router = Router {
        proc: router_proc,
        url,
        token: None,
        dir: tempfile::tempdir().unwrap(),
        ca: None,
    };
    let objects = format!("file://{}/objects", dir.path().display());
    let tiers: [(&str, Vec<&str>); 3] = [
        ("ram", vec!["--ram-bytes", "1GiB"]),
        ("ssd", vec!["--ram-bytes", "0", "--ssd-bytes", "1GiB"]),
        (
            "object",
            vec!["--ram-bytes", "0", "--object-store", &objects],
        ),
    ];
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut rows = Vec::new();
    for (t, (tier, extra)) in tiers.iter().enumerate() {
        let name = format!("w-{tier}");
        let data = dir.path().join(&name);
        let mut a = args(&[
            "worker",
            "--router",
            &router.url,
            "--name",
            &name,
            "--data-dir",
            &data.display().to_string(),
            "--model-file",
            &file,
            "--model",
            "smollm2",
            "--pages",
            "512",
            "--metrics-listen",
            "127.0.0.1:0",
            "--fault-admin",
            "127.0.0.1:0",
        ]);
        a.extend(extra.iter().map(|s| s.to_string()));
        let mut proc = Proc::spawn(&name, dir.path(), &a, &[]);
        let metrics = proc.wait_line("den-agent worker metrics on ", Duration::from_secs(60));
        let fault = proc.wait_line("den-agent worker fault-admin on ", Duration::from_secs(60));
        let worker = Worker {
            proc,
            name: name.clone(),
            metrics,
            fault: Some(fault),
            data_dir: data,
        };
        router.wait_workers(&[name.as_str()]).await;
        let (mut cold, mut resident, mut restored) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..5u64 {
            // 1,025 distinct tokens: 1,024 processed (four chunks), one pending.
            let prompt: Vec<u64> = (0..1025u64)
                .map(|k| 300 + (k * 7919 + i * 104_729 + t as u64 * 15_485_863) % 40_000)
                .collect();
            let body = |id: String| {
                json!({"id": id, "model": "smollm2", "tokens": prompt, "max_new_tokens": 1,
                       "temperature": 0})
            };
            let ttft = |v: &Value| v["ttft_ms"].as_f64().unwrap();
            let c = generate(&router, body(format!("{tier}-{i}-cold"))).await;
            assert_eq!(c["tier"], "none", "{c}");
            cold.push(ttft(&c));
            worker.wait_idle().await;
            let r = generate(&router, body(format!("{tier}-{i}-resident"))).await;
            assert_eq!(r["tier"], "gpu", "{r}");
            resident.push(ttft(&r));
            worker.wait_idle().await;
            worker.fault("/fault/evict-resident").await;
            den_tests::agents::wait_for("the eviction", Duration::from_secs(10), || async {
                let obs = router.observation(&name).await?;
                obs["gpu_prefixes"].as_array()?.is_empty().then_some(())
            })
            .await;
            let s = generate(&router, body(format!("{tier}-{i}-restored"))).await;
            assert_eq!(s["tier"], *tier, "{s}");
            assert_eq!(s["cached_tokens"], 1024, "{s}");
            restored.push(ttft(&s));
        }
        rows.push((
            tier.to_string(),
            median(cold),
            median(resident),
            median(restored),
        ));
        drop(worker);
    }
    println!(
        "| tier | recomputed TTFT (ms) | resident in pages (ms) | restored (ms) | restored / recomputed |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (tier, cold, resident, restored) in rows {
        println!(
            "| {tier} | {cold:.0} | {resident:.0} | {restored:.0} | {:.3} |",
            restored / cold
        );
    }
}
