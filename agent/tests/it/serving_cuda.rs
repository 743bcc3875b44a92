//! A worker started with `--backend cuda` and a model file serves that model from the GPU,
//! its KV in the CUDA page pool: a router and such a worker in-process on loopback, fed
//! token prompts, against den-model's CPU path run here on the same file. Ignored unless
//! asked for (`--ignored`, as `agent/gpu-check` does, with `DEN_GPU_MODEL` naming the
//! SmolLM2 it cut to two blocks): then a missing driver or GPU is a failure.
//!
//! - One request at a time, greedy: each of the four prompts of the forward-pass parity
//!   test (`model/tests/it/gpu.rs`) gets exactly the CPU path's 32 tokens — the worker's
//!   64-row prefill steps, its pages and the device choosing the greedy token (only ids
//!   come back) change nothing the parity test does not already allow.
//! - Eight at once: every request completes with its 32 tokens, in steps that batch
//!   their decodes. How many also match the CPU path is printed, not asserted: a batch
//!   changes cuBLAS's product shapes, and so the rounding, which may flip a near tie.

use std::path::PathBuf;
use std::time::Duration;

use den_agent::model_file::ModelFile;
use den_agent::router::{RouterOptions, RouterServer};
use den_agent::serving::Submitter;
use den_agent::worker::{self, Backend, WorkerOptions};
use den_model::{HostKvPages, Model, Runner, RunnerOptions, Sequence};
use den_protocol::request::{GenerationRequest, Sampling};
use den_protocol::router::DeliveryKind;

const TOKENS: usize = 32;

fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("DEN_GPU_MODEL") {
        return p.into();
    }
    let dir = std::env::var_os("DEN_TEST_MODELS").expect("set DEN_GPU_MODEL or DEN_TEST_MODELS");
    PathBuf::from(dir).join("smollm2-135m-instruct-q4_1.gguf")
}

/// The parity test's prompts, for a vocabulary of `vocab`.
fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    vec![
        (1..24).collect(),
        (0..60).map(|i| (i * 131 + 7) % vocab).collect(),
        (0..9).map(|i| (i * 977 + 3) % vocab).collect(),
        (0..200).map(|i| (i * 37 + 1) % vocab).collect(),
    ]
}

/// den-model's CPU path: the greedy continuation of `prompt`, `TOKENS` long.
fn cpu_greedy(model: &Model<'_>, prompt: &[u32]) -> Vec<u32> {
    let mut runner = Runner::new(model, RunnerOptions::default()).unwrap();
    let total = (prompt.len() + TOKENS) as u32;
    let mut kv = HostKvPages::new(model.kv_layout(), 16, total.div_ceil(16)).unwrap();
    let mut seq = Sequence::new();
    kv.reserve(&mut seq, total).unwrap();
    let argmax = |l: &[f32]| den_model::sample::argmax(l).unwrap();
    let mut t = argmax(runner.prefill(prompt, &mut kv, &mut seq).unwrap());
    let mut out = vec![t];
    while out.len() < TOKENS {
        t = argmax(runner.decode(t, &mut kv, &mut seq).unwrap());
        out.push(t);
    }
    out
}

fn greedy_request(id: &str, model: &str, prompt: &[u32]) -> GenerationRequest {
    let mut r = GenerationRequest::new(id, model, prompt.to_vec(), TOKENS as u32).unwrap();
    r.sampling = Sampling {
        temperature: Some(0.0),
        ignore_eos: true,
        ..Sampling::default()
    };
    r
}

/// Submits `request` and waits for its result's tokens.
async fn generate(router: &impl Submitter, request: GenerationRequest) -> Vec<u32> {
    let id = request.id.clone();
    let mut deliveries = router.submit(request).unwrap();
    loop {
        let d = tokio::time::timeout(Duration::from_secs(60), deliveries.recv())
            .await
            .unwrap_or_else(|_| panic!("{id}: no result within 60 s"))
            .unwrap_or_else(|| panic!("{id}: the delivery stream ended"));
        match d.kind {
            DeliveryKind::Delta { .. } => {}
            DeliveryKind::Completed { result } => return result.tokens,
            other => panic!("{id}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an NVIDIA GPU: agent/gpu-check runs it"]
async fn a_cuda_worker_serves_the_model_from_the_gpu_with_the_cpus_greedy_tokens() {
    assert!(
        den_agent::memory::cuda::driver_present(),
        "no CUDA driver (libcuda) on this host"
    );
    let path = model_path();
    let file = ModelFile::open(&path, Some("gpu-check")).unwrap();
    let model_id = file.fingerprint().as_str().to_owned();
    let model = Model::load(&file.file).unwrap();
    let prompts = prompts(model.vocab() as u32);
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| cpu_greedy(&model, p)).collect();

    let listener = RouterServer::bind(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let server = RouterServer::start(RouterOptions {
        chunk_size: 16,
        ..RouterOptions::default()
    });
    let router = server.handle();
    tokio::spawn(server.serve(listener, std::future::pending()));

    let data = tempfile::tempdir().unwrap();
    let mut opts = WorkerOptions::new(format!("ws://{addr}"), "w-gpu", data.path());
    opts.backend = Backend::Cuda;
    opts.pages = 256;
    opts.chunk_size = 16;
    opts.opened_model = Some(file.clone());
    let worker = worker::start(opts).await.unwrap();
    let started = tokio::time::Instant::now();
    while router.workers().await.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the CUDA worker did not join the router"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    for (i, (prompt, want)) in prompts.iter().zip(&want).enumerate() {
        let got = generate(
            &router,
            greedy_request(&format!("alone-{i}"), &model_id, prompt),
        )
        .await;
        eprintln!("prompt {i}: cpu {want:?}\n          gpu {got:?}");
        assert_eq!(
            &got, want,
            "prompt {i}: the GPU worker's greedy tokens differ"
        );
    }

    let batch = (0..8).map(|i| {
        let prompt = &prompts[i % prompts.len()];
        generate(
            &router,
            greedy_request(&format!("batch-{i}"), &model_id, prompt),
        )
    });
    let results = futures_util::future::join_all(batch).await;
    let mut same = 0;
    for (i, got) in results.iter().enumerate() {
        assert_eq!(got.len(), TOKENS, "batch-{i}: {got:?}");
        same += usize::from(got == &want[i % want.len()]);
    }
    eprintln!("eight at once: {same} of 8 equal the CPU path's tokens");
    worker.shutdown().await;
}
