//! The GPU forward pass (feature `cuda`).
//!
//! Here, without a GPU: the kernels compile with NVRTC for every architecture den targets
//! (NVRTC needs no GPU; `tests/run` installs it from PyPI), and the GPU path fails in one
//! line where the driver is missing. (What the kernels compute is checked against the CPU
//! path in an emulator: `gpu_emulated.rs`.)
//!
//! On a GPU (`#[ignore]`d; `agent/gpu-check` runs them with `--ignored`): the GPU against
//! den's CPU path, the reference that agrees with llama.cpp — on synthetic weights of the
//! real models' shapes (logits within tolerance, teacher-forced greedy tokens equal where
//! the CPU's top two differ clearly) and on a real model file (`DEN_GPU_MODEL`, default
//! SmolLM2 from `DEN_TEST_MODELS`: teacher-forced greedy tokens equal on clear steps, and
//! how far the free-running continuations agree, printed), and the throughput bench
//! (`DEN_GPU_REPORT` names a JSON file for the figures).

use std::time::Instant;

use den_model::gguf::GgufFile;
use den_model::gpu::{
    DeviceArena, GpuError, GpuRunner, compile_ptx, kernel_names, libraries::CudaLibraries,
    open_device, runner::GraphState,
};
use den_model::kv::{HostKvPages, Sequence};
use den_model::ops::matmul::MatmulMode;
use den_model::{BatchRow, GgmlType, Model, Runner, RunnerOptions};

use crate::forward::{Shape, build, rel_err, tiny_gemma, tiny_llama, top};

fn require_all() -> bool {
    std::env::var_os("DEN_TEST_REQUIRE_ALL").is_some_and(|v| v == "1")
}

#[test]
fn gpu_kernels_compile_with_nvrtc_for_every_target_architecture() {
    if !CudaLibraries::probe().nvrtc {
        assert!(
            !require_all(),
            "NVRTC (libnvrtc.so.13/.12) is not on the library path: tests/run installs it"
        );
        eprintln!("skipped: no NVRTC on the library path");
        return;
    }
    for arch in ["compute_70", "compute_80", "compute_90"] {
        let ptx = compile_ptx(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        for name in kernel_names() {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "{arch}: no entry {name} in the PTX"
            );
        }
        let target = format!(".target sm_{}", &arch["compute_".len()..]);
        assert!(ptx.contains(&target), "{arch}: PTX for another target");
    }
    // A bad architecture is one line, not a panic.
    let e = compile_ptx("compute_1").unwrap_err();
    assert!(matches!(e, GpuError::Compile(_)), "{e:?}");
    assert!(!e.to_string().contains('\n'), "{e}");
}

#[test]
fn without_a_driver_the_gpu_path_says_so_in_one_line() {
    if CudaLibraries::probe().driver {
        eprintln!("skipped: this host has a CUDA driver");
        return;
    }
    let e = open_device(0).unwrap_err();
    assert!(matches!(e, GpuError::Missing { .. }), "{e:?}");
    let line = e.to_string();
    assert!(
        line.contains("libcuda.so.1") && line.contains("--backend host"),
        "{line}"
    );
    assert!(!line.contains('\n'));
}

// --- on a GPU ---------------------------------------------------------------------------

/// SmolLM2-135M's shape (widths, heads, vocabulary) with `layers` layers.
fn smollm2_shape(layers: usize) -> Shape {
    let q = GgmlType::Q4_1;
    Shape {
        arch: "llama",
        layers,
        embd: 576,
        ff: 1536,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        vocab: 49152,
        ctx: 2048,
        window: None,
        types: [q, q, q, q, q, q, q, GgmlType::Q8_0],
    }
}

/// Gemma 3 270M's shape with `layers` layers (the sixth global, the others a 512 window).
fn gemma270m_shape(layers: usize) -> Shape {
    use GgmlType::*;
    Shape {
        arch: "gemma3",
        layers,
        embd: 640,
        ff: 2048,
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        vocab: 262_144,
        ctx: 2048,
        window: Some(512),
        types: [Q5_0, Q5_0, Q8_0, Q4_K, Q5_0, Q5_0, Q6_K, Q8_0],
    }
}

struct Pair<'m, 'a> {
    cpu: Runner<'m, 'a>,
    gpu: GpuRunner<'m, 'a>,
    host: HostKvPages,
    arena: DeviceArena,
}

fn pair<'m, 'a>(m: &'m Model<'a>, pages: u32) -> Pair<'m, 'a> {
    let ctx = open_device(0).unwrap();
    let gpu = GpuRunner::new(m, &ctx, 64).unwrap();
    let layout = m.kv_layout();
    let stream = ctx.default_stream();
    let arena = DeviceArena::new(&stream, 16, pages, layout.row_bytes() as u64).unwrap();
    Pair {
        cpu: Runner::new(m, RunnerOptions::default()).unwrap(),
        gpu,
        host: HostKvPages::new(layout, 16, pages).unwrap(),
        arena,
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: agent/gpu-check runs it"]
fn gpu_matches_cpu_on_synthetic_weights_of_the_real_shapes() {
    for (shape, name) in [
        (tiny_llama(), "tiny llama"),
        (tiny_gemma(6), "tiny gemma3"),
        (smollm2_shape(4), "SmolLM2 shape, 4 layers"),
        (gemma270m_shape(6), "Gemma 3 270M shape, 6 layers"),
    ] {
        let f = GgufFile::from_bytes(format!("{name}.gguf"), build(&shape, 7)).unwrap();
        let m = Model::load(&f).unwrap();
        let mut p = pair(&m, 64);
        let vocab = shape.vocab as u32;
        let prompt: Vec<u32> = (0..40).map(|i| (i * 7919 + 13) % vocab).collect();
        let (mut cs, mut gs) = (Sequence::new(), Sequence::with_pages((0..64).collect(), 0));
        p.host.reserve(&mut cs, 200).unwrap();
        let kv = p.arena.kv();
        let c = p
            .cpu
            .prefill(&prompt, &mut p.host, &mut cs)
            .unwrap()
            .to_vec();
        let g = p.gpu.prefill(&prompt, &kv, &mut gs).unwrap().to_vec();
        let mut worst = rel_err(&g, &c);
        let (mut agree, mut clear) = (0, 0);
        // Teacher-forced: both sides take the CPU's greedy token.
        let mut next = top(&c).0 as u32;
        for _ in 0..32 {
            let c = p.cpu.decode(next, &mut p.host, &mut cs).unwrap().to_vec();
            let g = p.gpu.prefill(&[next], &kv, &mut gs).unwrap().to_vec();
            worst = worst.max(rel_err(&g, &c));
            let (ct, margin) = top(&c);
            if margin > 0.05 {
                clear += 1;
                if top(&g).0 == ct {
                    agree += 1;
                }
            }
            next = ct as u32;
        }
        eprintln!(
            "{name}: worst relative logit error {worst:e}; greedy {agree}/{clear} clear steps"
        );
        assert!(worst < 3e-2, "{name}: logits differ by {worst:e}");
        assert_eq!(agree, clear, "{name}: greedy tokens differ on clear steps");
    }
}

/// The real model to check: `DEN_GPU_MODEL`, else SmolLM2 from `DEN_TEST_MODELS`.
fn real_model_path() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("DEN_GPU_MODEL") {
        return Some(p.into());
    }
    let dir = std::env::var_os("DEN_TEST_MODELS")?;
    Some(std::path::Path::new(&dir).join("smollm2-135m-instruct-q4_1.gguf"))
}

/// The greedy continuation of `prompt`, `n` tokens, from `step` (which appends rows and
/// returns the last one's logits), and each step's top-two margin.
fn continuation(
    prompt: &[u32],
    n: usize,
    mut step: impl FnMut(&[u32]) -> Vec<f32>,
) -> Vec<(u32, f32)> {
    let (t, m) = top(&step(prompt));
    let mut out = vec![(t as u32, m)];
    while out.len() < n {
        let (t, m) = top(&step(&[out[out.len() - 1].0]));
        out.push((t as u32, m));
    }
    out
}

/// Where two continuations first part, if they do.
fn parts(a: &[(u32, f32)], b: &[(u32, f32)]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x.0 != y.0)
}

#[test]
#[ignore = "needs an NVIDIA GPU: agent/gpu-check runs it"]
fn gpu_greedy_continuations_follow_the_cpus_on_a_real_model() {
    // The reference is den's f32 CPU path (`MatmulMode::Exact`: weights dequantized, f32
    // activations), which the GPU's f16 products approximate; the default CPU path
    // quantizes activations to 8-bit blocks as llama.cpp does. On SmolLM2 cut to two
    // blocks the two CPU paths themselves part within 32 greedy tokens on three of these
    // four prompts (at tokens 9, 14 and 9; measured on the CPU, 2026-12-07): the cut
    // model's top two are often within 0.03 of each other. So what is asserted is the
    // teacher-forced rule of the synthetic-weights test — along the reference's
    // continuation the GPU picks the reference's token wherever its top two differ by
    // more than 0.05 — and the free-running agreement (the parity figure: equal
    // for the first 32 tokens) is printed for each prompt beside the two CPU paths'.
    let path = real_model_path().expect("set DEN_GPU_MODEL or DEN_TEST_MODELS");
    let f = GgufFile::open(&path).unwrap();
    let m = Model::load(&f).unwrap();
    let vocab = m.vocab() as u32;
    let ctx = open_device(0).unwrap();
    let mut gpu = GpuRunner::new(&m, &ctx, 256).unwrap();
    let layout = m.kv_layout();
    let arena =
        DeviceArena::new(&ctx.default_stream(), 16, 128, layout.row_bytes() as u64).unwrap();
    let kv = arena.kv();
    let prompts: [Vec<u32>; 4] = [
        (1..24).collect(),
        (0..60).map(|i| (i * 131 + 7) % vocab).collect(),
        (0..9).map(|i| (i * 977 + 3) % vocab).collect(),
        (0..200).map(|i| (i * 37 + 1) % vocab).collect(),
    ];
    let cpu = |mode: MatmulMode, prompt: &[u32]| {
        let mut r = Runner::new(
            &m,
            RunnerOptions {
                mode,
                ..RunnerOptions::default()
            },
        )
        .unwrap();
        let mut host = HostKvPages::new(layout, 16, 128).unwrap();
        let mut s = Sequence::new();
        host.reserve(&mut s, 260).unwrap();
        continuation(prompt, 32, |t| {
            r.prefill(t, &mut host, &mut s).unwrap().to_vec()
        })
    };
    let mut all_equal = 0;
    for (i, prompt) in prompts.iter().enumerate() {
        let exact = cpu(MatmulMode::Exact, prompt);
        let quantized = cpu(MatmulMode::Quantized, prompt);
        let mut gs = Sequence::with_pages((0..128).collect(), 0);
        let free = continuation(prompt, 32, |t| {
            gpu.prefill(t, &kv, &mut gs).unwrap().to_vec()
        });
        // Teacher-forced along the reference.
        let mut gs = Sequence::with_pages((0..128).collect(), 0);
        let mut forced = vec![top(gpu.prefill(prompt, &kv, &mut gs).unwrap()).0 as u32];
        for (t, _) in &exact[..31] {
            forced.push(top(gpu.prefill(&[*t], &kv, &mut gs).unwrap()).0 as u32);
        }
        let (mut clear, mut agree) = (0, 0);
        for (k, (t, margin)) in exact.iter().enumerate() {
            if *margin > 0.05 {
                clear += 1;
                agree += usize::from(forced[k] == *t);
            }
        }
        let gpu_vs_exact = parts(&free, &exact);
        all_equal += usize::from(gpu_vs_exact.is_none());
        eprintln!(
            "prompt {i}: GPU greedy parts from the f32 CPU path at {gpu_vs_exact:?} and from the quantized one at {:?} (the two CPU paths: {:?}); teacher-forced {agree}/{clear} clear steps",
            parts(&free, &quantized),
            parts(&quantized, &exact),
        );
        assert_eq!(
            agree, clear,
            "prompt {i}: the GPU's greedy token differs on a clear step"
        );
    }
    eprintln!(
        "parity: {all_equal} of {} prompts' first 32 greedy tokens equal the f32 CPU path's; libraries: {}",
        prompts.len(),
        den_model::gpu::libraries::describe(gpu.libraries())
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: agent/gpu-check runs it"]
fn gpu_passes_replay_as_cuda_graphs_with_the_eager_passs_results() {
    let shape = smollm2_shape(4);
    let f = GgufFile::from_bytes("graphs.gguf".to_string(), build(&shape, 3)).unwrap();
    let m = Model::load(&f).unwrap();
    let mut p = pair(&m, 64);
    let kv = p.arena.kv();
    let prompt: Vec<u32> = (0..20)
        .map(|i| (i * 131 + 7) % shape.vocab as u32)
        .collect();
    // The same steps twice from the same state: graphs on (the decode shape runs eagerly
    // once, is captured the second time and replayed after), then off.
    let mut runs = Vec::new();
    for graphs in [true, false] {
        p.gpu.set_graphs(graphs);
        let mut s = Sequence::with_pages((0..64).collect(), 0);
        let mut logits = p.gpu.prefill(&prompt, &kv, &mut s).unwrap().to_vec();
        for t in 0..6u32 {
            logits.extend_from_slice(p.gpu.prefill(&[t + 1], &kv, &mut s).unwrap());
        }
        runs.push(logits);
        if graphs {
            match p.gpu.graphs() {
                GraphState::On { captured } => assert_eq!(captured, 1, "one decode shape"),
                other => panic!("graphs are not replayed: {other:?}"),
            }
        }
    }
    let e = rel_err(&runs[0], &runs[1]);
    assert!(e < 1e-5, "graph replay differs from eager launches by {e}");
}

#[test]
#[ignore = "a benchmark on an NVIDIA GPU: agent/gpu-check runs it"]
fn bench_gpu_forward() {
    let path = real_model_path().expect("set DEN_GPU_MODEL or DEN_TEST_MODELS");
    let f = GgufFile::open(&path).unwrap();
    let m = Model::load(&f).unwrap();
    let ctx = open_device(0).unwrap();
    let stream = ctx.default_stream();
    let mut gpu = GpuRunner::new(&m, &ctx, 512).unwrap();
    let layout = m.kv_layout();
    let (page, seq_pages) = (16u32, 32u32);
    let arena = DeviceArena::new(&stream, page, 64 * seq_pages, layout.row_bytes() as u64).unwrap();
    let kv = arena.kv();
    let vocab = m.vocab() as u32;
    // HBM bandwidth as this run measures it: a device-to-device copy of 1 GiB.
    let bw = {
        let n = 1usize << 30;
        let a = stream.alloc_zeros::<u8>(n).unwrap();
        let mut b = stream.alloc_zeros::<u8>(n).unwrap();
        stream.memcpy_dtod(&a, &mut b).unwrap();
        stream.synchronize().unwrap();
        let t = Instant::now();
        for _ in 0..5 {
            stream.memcpy_dtod(&a, &mut b).unwrap();
        }
        stream.synchronize().unwrap();
        // A copy reads and writes every byte.
        (2 * 5 * n) as f64 / t.elapsed().as_secs_f64()
    };
    let weight_bytes = gpu.weight_bytes() as f64;
    let roofline_tok_s = bw / weight_bytes;
    let mut report = serde_json::Map::new();
    report.insert("device".into(), gpu.device_name().into());
    report.insert(
        "libraries".into(),
        den_model::gpu::libraries::describe(gpu.libraries()).into(),
    );
    report.insert("kernels".into(), gpu.kernels_origin().into());
    report.insert("weight_bytes".into(), weight_bytes.into());
    report.insert("hbm_copy_bytes_per_s".into(), bw.into());
    report.insert("roofline_decode_tok_s".into(), roofline_tok_s.into());
    let t = Instant::now();
    gpu.launch_noops(1000).unwrap();
    report.insert(
        "launch_us".into(),
        (t.elapsed().as_secs_f64() * 1e6 / 1000.0).into(),
    );
    for batch in [1usize, 8, 64] {
        let mut seqs: Vec<Sequence> = (0..batch as u32)
            .map(|s| Sequence::with_pages((s * seq_pages..(s + 1) * seq_pages).collect(), 0))
            .collect();
        // Prefill: 128 tokens per sequence, all sequences in one pass of batch × 128 rows
        // (at most 512 rows a pass).
        let prompt: Vec<u32> = (0..128).map(|i| (i * 131 + 7) % vocab).collect();
        let t = Instant::now();
        for group in seqs.chunks_mut(4) {
            let plen = prompt.len();
            let prompt = &prompt;
            let rows: Vec<BatchRow<'_>> = group
                .iter()
                .flat_map(|s| {
                    prompt.iter().enumerate().map(move |(i, tok)| BatchRow {
                        token: *tok,
                        pos: i as u32,
                        seq: s,
                        logits: i + 1 == plen,
                    })
                })
                .collect();
            gpu.forward_greedy(&rows, &kv).unwrap();
            for s in group.iter_mut() {
                s.set_len(128);
            }
        }
        let prefill = (batch * 128) as f64 / t.elapsed().as_secs_f64();
        // Decode: 64 steps of one token per sequence, greedy on the device; replayed as a
        // CUDA graph (the default), then launched kernel by kernel, from the same state.
        let start: Vec<u32> = seqs.iter().map(|s| s.len()).collect();
        for graphs in [true, false] {
            gpu.set_graphs(graphs);
            for (s, len) in seqs.iter_mut().zip(&start) {
                s.set_len(*len);
            }
            let mut next = vec![1u32; batch];
            let steps = 64;
            // Two untimed steps first: the second captures the step's graph.
            let mut t = Instant::now();
            for step in 0..steps + 2 {
                if step == 2 {
                    t = Instant::now();
                }
                let rows: Vec<BatchRow<'_>> = seqs
                    .iter()
                    .zip(&next)
                    .map(|(s, tok)| BatchRow {
                        token: *tok,
                        pos: s.len(),
                        seq: s,
                        logits: true,
                    })
                    .collect();
                next = gpu
                    .forward_greedy(&rows, &kv)
                    .unwrap()
                    .into_iter()
                    .map(|t| t.expect("a token for every row"))
                    .collect();
                for s in seqs.iter_mut() {
                    s.set_len(s.len() + 1);
                }
            }
            let secs = t.elapsed().as_secs_f64();
            let decode = (batch * steps) as f64 / secs;
            let mode = if graphs { "graph" } else { "eager" };
            eprintln!(
                "batch {batch}: prefill {prefill:.0} tok/s, decode ({mode}) {decode:.0} tok/s \
                 ({:.2} ms a step)",
                secs * 1e3 / steps as f64
            );
            let key = if graphs {
                format!("decode_tok_s_batch_{batch}")
            } else {
                format!("decode_eager_tok_s_batch_{batch}")
            };
            report.insert(key, decode.into());
        }
        gpu.set_graphs(true);
        report.insert(format!("prefill_tok_s_batch_{batch}"), prefill.into());
    }
    report.insert("graphs".into(), format!("{:?}", gpu.graphs()).into());
    let d1 = report["decode_tok_s_batch_1"].as_f64().unwrap_or(0.0);
    let d64 = report["decode_tok_s_batch_64"].as_f64().unwrap_or(0.0);
    report.insert(
        "decode_batch_1_of_roofline".into(),
        (d1 / roofline_tok_s).into(),
    );
    report.insert("decode_batch_64_over_1".into(), (d64 / d1.max(1e-9)).into());
    let text = serde_json::to_string_pretty(&report).unwrap();
    eprintln!("{text}");
    if let Some(out) = std::env::var_os("DEN_GPU_REPORT") {
        std::fs::write(out, text).unwrap();
    }
}
