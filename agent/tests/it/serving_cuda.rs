//! A worker started with `--backend cuda` and a model file serves that model from the GPU,
//! its KV in the CUDA page pool: a router and such a worker in-process on loopback, fed
//! token prompts. Ignored unless asked for (`--ignored`, as `agent/gpu-check` does, with
//! `DEN_GPU_MODEL` naming the SmolLM2 it cut to two blocks): then a missing driver or GPU
//! is a failure.
//!
//! - One request at a time, greedy: each of the four prompts of the forward-pass parity
//!   test (`model/tests/it/gpu.rs`) gets exactly the tokens den-model's GPU runner gives
//!   in this process on its own pages, run in the worker's shapes (the prompt but its last
//!   token in `BATCH`-row steps, then one row a step): the worker's pages, its scheduler
//!   and the device choosing the greedy token (only ids come back) change nothing. How
//!   many also equal den's f32 CPU path is printed; parity with the CPU is `gpu.rs`'s to
//!   check (a cut model has near ties that another rounding may flip).
//! - Eight at once: every request completes with its 32 tokens, in steps that batch their
//!   decodes (other shapes than alone, so only completion is asserted; how many equal
//!   their tokens alone is printed).

use std::path::PathBuf;
use std::time::Duration;

use den_agent::model_file::ModelFile;
use den_agent::router::{RouterOptions, RouterServer};
use den_agent::serving::Submitter;
use den_agent::worker::{self, Backend, WorkerOptions};
use den_model::gpu::{DeviceArena, GpuRunner, open_device};
use den_model::ops::matmul::MatmulMode;
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

/// Rows of one worker step (`WorkerOptions::batch_tokens`).
const BATCH: usize = 64;

/// A request's greedy continuation computed in the shapes a worker runs it alone: the
/// processed prompt (all but its last token) in `BATCH`-row steps, then one row a step
/// from the last prompt token on. `rows` appends rows and returns the last one's logits.
fn in_worker_shapes(prompt: &[u32], mut rows: impl FnMut(&[u32]) -> Vec<f32>) -> Vec<u32> {
    let (last, processed) = prompt.split_last().unwrap();
    for chunk in processed.chunks(BATCH) {
        rows(chunk);
    }
    let mut t = *last;
    let mut out = Vec::with_capacity(TOKENS);
    while out.len() < TOKENS {
        t = den_model::sample::argmax(&rows(&[t])).unwrap();
        out.push(t);
    }
    out
}

/// den-model's f32 CPU path (`MatmulMode::Exact`, the reference the GPU's f16 products
/// approximate) on `prompt`, in the worker's shapes.
fn cpu_greedy(model: &Model<'_>, prompt: &[u32]) -> Vec<u32> {
    let options = RunnerOptions {
        mode: MatmulMode::Exact,
        ..RunnerOptions::default()
    };
    let mut runner = Runner::new(model, options).unwrap();
    let total = (prompt.len() + TOKENS) as u32;
    let mut kv = HostKvPages::new(model.kv_layout(), 16, total.div_ceil(16)).unwrap();
    let mut seq = Sequence::new();
    kv.reserve(&mut seq, total).unwrap();
    in_worker_shapes(prompt, |t| {
        runner.prefill(t, &mut kv, &mut seq).unwrap().to_vec()
    })
}

/// den-model's GPU runner on `prompt` in this process, on its own arena, in the worker's
/// shapes.
fn gpu_greedy(model: &Model<'_>, prompt: &[u32]) -> Vec<u32> {
    let ctx = open_device(0).unwrap();
    let mut runner = GpuRunner::new(model, &ctx, BATCH).unwrap();
    let pages = (prompt.len() + TOKENS).div_ceil(16) as u32;
    let row_bytes = model.kv_layout().row_bytes() as u64;
    let arena = DeviceArena::new(&ctx.default_stream(), 16, pages, row_bytes).unwrap();
    let kv = arena.kv();
    let mut seq = Sequence::with_pages((0..pages).collect(), 0);
    in_worker_shapes(prompt, |t| {
        runner.prefill(t, &kv, &mut seq).unwrap().to_vec()
    })
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
async fn a_cuda_worker_serves_the_model_from_the_gpu_as_the_gpu_runner_computes_it() {
    assert!(
        den_agent::memory::cuda::driver_present(),
        "no CUDA driver (libcuda) on this host"
    );
    let path = model_path();
    let file = ModelFile::open(&path, Some("gpu-check")).unwrap();
    let model_id = file.fingerprint().as_str().to_owned();
    let model = Model::load(&file.file).unwrap();
    let prompts = prompts(model.vocab() as u32);
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| gpu_greedy(&model, p)).collect();
    let cpu: Vec<Vec<u32>> = prompts.iter().map(|p| cpu_greedy(&model, p)).collect();

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
    opts.batch_tokens = BATCH as u32;
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

    let mut as_cpu = 0;
    for (i, (prompt, want)) in prompts.iter().zip(&want).enumerate() {
        let got = generate(
            &router,
            greedy_request(&format!("alone-{i}"), &model_id, prompt),
        )
        .await;
        eprintln!("prompt {i}: worker {got:?}\n          cpu    {:?}", cpu[i]);
        assert_eq!(
            &got, want,
            "prompt {i}: the GPU worker's greedy tokens differ from den-model's GPU runner's"
        );
        as_cpu += usize::from(got == cpu[i]);
    }
    eprintln!(
        "alone: {as_cpu} of {} equal den's CPU path's tokens",
        prompts.len()
    );

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
    eprintln!("eight at once: {same} of 8 equal the tokens each gets alone");
    worker.shutdown().await;
}
