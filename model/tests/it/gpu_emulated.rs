//! den's CUDA kernels (`model/src/gpu/kernels.cu`) against den's CPU path, on a machine
//! without a GPU: the kernel source compiled as C++ with `g++` into a CPU emulator of the
//! CUDA execution model (`gpu_emulator.cpp`: an OS thread per GPU thread, barriers for
//! `__syncthreads` and warp shuffles). This is the mock the house rules allow where no real
//! part can run: no GPU is lent here. It checks what a GPU would compute with these
//! kernels — indexing, page-table walks, the row layout, reductions, the online softmax —
//! not the PTX or cuBLAS (`agent/gpu-check` runs the real thing on a GPU).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use den_model::gguf::GgufFile;
use den_model::gpu_plan::{self, Arg, BatchTable, Buffer, HostData, PassShape, Step};
use den_model::kv::{HostKvPages, KvLayout, Sequence};
use den_model::ops::attention::{AttnPath, AttnShape, Query, attention};
use den_model::ops::ggml_round::glu;
use den_model::ops::math::{Activation, RopeStyle, rms_norm, rms_norm_in_place, rope, rope_table};
use den_model::ops::matmul::ThreadScratch;
use den_model::ops::pool::Pool;
use den_model::ops::{Kernels, f32_to_f16};
use den_model::quant::f16_to_f32;
use den_model::{BatchRow, Model, Runner, RunnerOptions};

use crate::attention::write_kv;
use crate::forward::{Rng, build, rel_err as rel, tiny_gemma, tiny_llama, top};

/// The emulator, built once per test process (`None`: no C++ compiler here).
fn emulator() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let here = Path::new(env!("CARGO_MANIFEST_DIR"));
            let kernels = here.join("src/gpu/kernels.cu");
            let source = here.join("tests/it/gpu_emulator.cpp");
            let dir = std::env::temp_dir().join(format!("den-gpu-emulator-{}", std::process::id()));
            std::fs::create_dir_all(&dir).ok()?;
            let exe = dir.join("emulator");
            let out = Command::new("g++")
                .args(["-std=c++20", "-O2", "-pthread", "-DDEN_EMULATE", "-w"])
                .arg(format!("-DDEN_KERNELS=\"{}\"", kernels.display()))
                .arg(&source)
                .arg("-o")
                .arg(&exe)
                .output()
                .ok()?;
            assert!(
                out.status.success(),
                "the kernels do not compile for the emulator:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(exe)
        })
        .as_deref()
}

/// Runs one emulator command on `input`; `None` when there is no compiler.
fn run(cmd: &str, input: &[u8]) -> Option<Vec<u8>> {
    let Some(exe) = emulator() else {
        assert!(
            std::env::var_os("DEN_TEST_REQUIRE_ALL").is_none_or(|v| v != "1"),
            "g++ is needed to emulate the CUDA kernels"
        );
        eprintln!("skipped: no g++ to emulate the CUDA kernels");
        return None;
    };
    // One emulation at a time: each spawns a thread per emulated GPU thread.
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = Command::new(exe)
        .arg(cmd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "emulator {cmd} failed");
    Some(out.stdout)
}

#[derive(Default)]
struct Input(Vec<u8>);

impl Input {
    fn i(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn f(mut self, v: f32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn fs(mut self, v: &[f32]) -> Self {
        v.iter()
            .for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
        self
    }
    fn u(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn q(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    fn us(mut self, v: &[u32]) -> Self {
        v.iter()
            .for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
        self
    }
}

fn halves(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn random(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|_| rng.below(2001) as f32 / 1000.0 - 1.0)
        .collect()
}

#[test]
fn emulated_rms_norm_equals_the_cpu_norm_rounded_to_f16_and_gathers_rows() {
    let mut rng = Rng::new(3);
    let (rows, e, eps) = (3usize, 96usize, 1e-5f32);
    let x = random(rows * e, &mut rng);
    let w = random(e, &mut rng);
    let gather = [2u32, 0];
    let input = Input::default()
        .i(rows as i32)
        .i(gather.len() as i32)
        .i(e as i32)
        .f(eps)
        .fs(&x)
        .fs(&w)
        .us(&gather);
    let Some(out) = run("rms_norm_h", &input.0) else {
        return;
    };
    let got = halves(&out);
    for (j, &src) in gather.iter().enumerate() {
        let mut want = vec![0f32; e];
        let r = src as usize;
        rms_norm(&x[r * e..(r + 1) * e], &w, eps, &mut want);
        let want: Vec<f32> = want.iter().map(|v| f16_to_f32(f32_to_f16(*v))).collect();
        assert!(
            rel(&got[j * e..(j + 1) * e], &want) < 1e-3,
            "row {j} (source {src}) differs"
        );
    }
}

#[test]
fn emulated_qk_norm_and_rope_equal_the_cpus_in_both_styles_and_land_k_and_v_in_the_pages() {
    for (style, neox, qk_norm) in [(RopeStyle::Norm, 0, 0), (RopeStyle::Neox, 1, 1)] {
        let mut rng = Rng::new(5);
        let (rows, nh, nkv, hd) = (3usize, 4usize, 2usize, 32usize);
        let (base, attn, eps) = (10000f32, 0.125f32, 1e-6f32);
        let q = random(rows * nh * hd, &mut rng);
        let k = random(rows * nkv * hd, &mut rng);
        let v = random(rows * nkv * hd, &mut rng);
        let qn = random(hd, &mut rng);
        let kn = random(hd, &mut rng);
        let pos = [0u32, 7, 1234];
        let input = Input::default()
            .i(rows as i32)
            .i(nh as i32)
            .i(nkv as i32)
            .i(hd as i32)
            .i(hd as i32)
            .i(neox)
            .f(base)
            .f(1.0)
            .f(attn)
            .i(qk_norm)
            .f(eps)
            .fs(&q)
            .fs(&k)
            .fs(&v)
            .fs(&qn)
            .fs(&kn)
            .us(&pos);
        let Some(out) = run("qk_rope_append", &input.0) else {
            return;
        };
        let kvd = nkv * hd;
        let (got, slots) = out.split_at((q.len() + k.len()) * 4);
        let got = floats(got);
        let (gq, gk) = got.split_at(q.len());
        let half = hd / 2;
        let (mut cos, mut sin) = (vec![0f32; half], vec![0f32; half]);
        let mut wq = q.clone();
        let mut wk = k.clone();
        for (i, &p) in pos.iter().enumerate() {
            rope_table(p, base, hd, &mut cos, &mut sin);
            for head in wq[i * nh * hd..(i + 1) * nh * hd].chunks_exact_mut(hd) {
                if qk_norm == 1 {
                    rms_norm_in_place(head, &qn, eps);
                }
                rope(style, head, &cos, &sin);
                head.iter_mut().for_each(|v| *v *= attn);
            }
            for head in wk[i * nkv * hd..(i + 1) * nkv * hd].chunks_exact_mut(hd) {
                if qk_norm == 1 {
                    rms_norm_in_place(head, &kn, eps);
                }
                rope(style, head, &cos, &sin);
            }
        }
        assert!(
            rel(gq, &wq) < 1e-4,
            "{style:?}: q differs by {}",
            rel(gq, &wq)
        );
        assert!(
            rel(gk, &wk) < 1e-4,
            "{style:?}: k differs by {}",
            rel(gk, &wk)
        );
        // Each row's page slot (found through a scrambled page table) holds its rotated K
        // and its V as f16, K before V, in the CPU's row layout.
        for (r, slot) in slots.chunks_exact(kvd * 4).enumerate() {
            let want: Vec<u8> = wk[r * kvd..(r + 1) * kvd]
                .iter()
                .chain(&v[r * kvd..(r + 1) * kvd])
                .flat_map(|x| f32_to_f16(*x).to_le_bytes())
                .collect();
            let got_k = halves(&slot[..kvd * 2]);
            assert!(
                rel(&got_k, &wk[r * kvd..(r + 1) * kvd]) < 1e-3,
                "{style:?}: row {r}'s K in its page slot differs"
            );
            assert_eq!(
                slot[kvd * 2..],
                want[kvd * 2..],
                "{style:?}: row {r}'s V in its page slot differs"
            );
        }
        assert_eq!(slots.len(), rows * kvd * 4);
    }
}

#[test]
fn emulated_residual_add_with_post_norm_then_next_norm_equals_the_cpus() {
    for (post, norm) in [(true, true), (false, true), (true, false)] {
        let mut rng = Rng::new(11);
        let (rows, e, eps) = (3usize, 200usize, 1e-6f32);
        let x = random(rows * e, &mut rng);
        let o = random(rows * e, &mut rng);
        let pw = random(e, &mut rng);
        let nw = random(e, &mut rng);
        let input = Input::default()
            .i(rows as i32)
            .i(e as i32)
            .f(eps)
            .i(i32::from(post))
            .i(i32::from(norm))
            .fs(&x)
            .fs(&o)
            .fs(&pw)
            .fs(&nw);
        let Some(out) = run("add_norm", &input.0) else {
            return;
        };
        let (gx, gh) = out.split_at(rows * e * 4);
        let (gx, gh) = (floats(gx), halves(gh));
        for r in 0..rows {
            let span = r * e..(r + 1) * e;
            let mut add = o[span.clone()].to_vec();
            if post {
                rms_norm_in_place(&mut add, &pw, eps);
            }
            let wx: Vec<f32> = x[span.clone()]
                .iter()
                .zip(&add)
                .map(|(a, b)| a + b)
                .collect();
            assert!(
                rel(&gx[span.clone()], &wx) < 1e-6,
                "post {post}, norm {norm}: row {r}'s residual differs"
            );
            if norm {
                let mut wh = vec![0f32; e];
                rms_norm(&wx, &nw, eps, &mut wh);
                let wh: Vec<f32> = wh.iter().map(|v| f16_to_f32(f32_to_f16(*v))).collect();
                assert!(
                    rel(&gh[span.clone()], &wh) < 1e-3,
                    "post {post}, norm {norm}: row {r}'s normed row differs"
                );
            } else {
                assert!(
                    gh[span].iter().all(|v| *v == 0.0),
                    "without a next norm nothing is written to h16"
                );
            }
        }
    }
}

#[test]
fn emulated_gated_activation_reads_gate_and_up_from_one_product() {
    for act in [Activation::Silu, Activation::GeluTanh] {
        let mut rng = Rng::new(13);
        let (rows, n_ff) = (3usize, 300usize);
        let gu = random(rows * 2 * n_ff, &mut rng);
        let input = Input::default()
            .i(rows as i32)
            .i(n_ff as i32)
            .i(i32::from(act == Activation::GeluTanh))
            .fs(&gu);
        let Some(out) = run("glu", &input.0) else {
            return;
        };
        let got = halves(&out);
        for r in 0..rows {
            let row = &gu[r * 2 * n_ff..(r + 1) * 2 * n_ff];
            let mut want = vec![0f32; n_ff];
            glu(
                Kernels::detect(),
                act,
                &row[..n_ff],
                &row[n_ff..],
                &mut want,
            );
            let e = rel(&got[r * n_ff..(r + 1) * n_ff], &want);
            assert!(e < 5e-3, "{act:?}: row {r} differs by {e}");
        }
    }
}

#[test]
fn emulated_paged_attention_writes_the_cpu_row_layout_and_attends_as_the_cpu_does() {
    // Grouped heads; a head as wide as Gemma 3's (256: each thread owns two output dims)
    // and a narrow one; pages of 4 rows in scrambled order; with and without a window;
    // layer 1 of 2, so K/V land at the layer's offsets in the row.
    for (hd, window) in [(16usize, None), (256, Some(3u32)), (64, Some(40))] {
        let mut rng = Rng::new(hd as u64);
        let (nh, nkv, layers, layer, page) = (4usize, 2usize, 2u32, 1usize, 4u32);
        let len = 29u32;
        let pages: Vec<u32> = vec![5, 2, 7, 0, 3, 6, 1, 4];
        let kvd = nkv * hd;
        let k = random(len as usize * kvd, &mut rng);
        let v = random(len as usize * kvd, &mut rng);
        let qpos = [0u32, 3, 17, 28];
        let q = random(qpos.len() * nh * hd, &mut rng);
        let input = Input::default()
            .i(len as i32)
            .i(qpos.len() as i32)
            .i(nh as i32)
            .i(nkv as i32)
            .i(hd as i32)
            .i(layers as i32)
            .i(layer as i32)
            .i(page as i32)
            .i(pages.len() as i32)
            .i(window.map_or(0, |w| w as i32))
            .us(&pages)
            .fs(&k)
            .fs(&v)
            .us(&qpos)
            .fs(&q);
        let Some(out) = run("attention", &input.0) else {
            return;
        };
        // The CPU's pages with the same rows written where the CPU forward writes them.
        let layout = KvLayout {
            layers,
            kv_heads: nkv as u32,
            head_dim: hd as u32,
        };
        let mut host = HostKvPages::new(layout, page, pages.len() as u32).unwrap();
        let seq = Sequence::with_pages(pages.clone(), len);
        write_kv(&mut host, layer, &seq, &k, &v);
        let arena_bytes = host.bytes().len();
        assert_eq!(out.len(), arena_bytes + qpos.len() * nh * hd * 2);
        assert!(
            out[..arena_bytes] == *host.bytes(),
            "head_dim {hd}: the kernel's K/V rows are not the CPU's row layout"
        );
        let got = halves(&out[arena_bytes..]);
        let mut want = vec![0f32; q.len()];
        let mut pool = Pool::new(1).unwrap();
        let tls = [Mutex::new(ThreadScratch::default())];
        let shape = AttnShape {
            n_head: nh,
            n_kv: nkv,
            head_dim: hd,
            k_off: layout.k_offset(layer),
            v_off: layout.v_offset(layer),
            window,
            path: AttnPath::F32,
        };
        let query = |i: usize| Query {
            pos: qpos[i],
            seq: &seq,
        };
        attention(
            &mut pool,
            &tls,
            Kernels::detect(),
            &host,
            qpos.len(),
            &query,
            shape,
            &q,
            &mut want,
        )
        .unwrap();
        let e = rel(&got, &want);
        assert!(
            e < 2e-3,
            "head_dim {hd}, window {window:?}: attention differs by {e}"
        );
    }
}

#[test]
fn emulated_argmax_takes_the_first_of_equal_maxima() {
    // A third row of NaN has nothing to choose: u32::MAX, which the runner turns into
    // `None` (the host path's "no token can be sampled"), never a token.
    let vocab = 1000usize;
    let mut logits = vec![0f32; 3 * vocab];
    logits[17] = 3.0;
    logits[900] = 3.0;
    logits[vocab + 999] = -0.5;
    logits[vocab..vocab + 999]
        .iter_mut()
        .for_each(|v| *v = -1.0);
    logits[2 * vocab..].iter_mut().for_each(|v| *v = f32::NAN);
    let input = Input::default().i(3).i(vocab as i32).fs(&logits);
    let Some(out) = run("argmax", &input.0) else {
        return;
    };
    let got: Vec<u32> = out
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(got, [17, 999, u32::MAX]);
}

// --- the whole pass -----------------------------------------------------------------

/// den's GPU pass as the runner runs it — [`gpu_plan::plan`]'s steps over buffers sized
/// by [`gpu_plan::buffer_len`], weights from [`gpu_plan::host_tensors`], each batch's
/// tables from [`BatchTable`] — executed by the emulator (cuBLAS's products as plain f32
/// dot products of the f16 operands). Passes are queued, then run in one emulator process
/// so the page arena carries K/V from one pass to the next.
struct EmulatedGpu<'m, 'a> {
    model: &'m Model<'a>,
    ids: HashMap<Buffer, u32>,
    arena_pages: u64,
    page_size: u32,
    input: Input,
    passes: Input,
    queued: Vec<(usize, bool)>,
}

impl<'m, 'a> EmulatedGpu<'m, 'a> {
    fn new(model: &'m Model<'a>, cap: usize, arena_pages: u32, page_size: u32) -> Self {
        let mut ids = HashMap::new();
        let mut buffers: Vec<(u32, Vec<u8>)> = Vec::new();
        let mut add = |b: Buffer, bytes: Vec<u8>| {
            let id = ids.len() as u32;
            ids.insert(b, id);
            buffers.push((id, bytes));
        };
        for (b, elem) in gpu_plan::BUFFERS {
            let len = gpu_plan::buffer_len(model, b, cap, arena_pages as usize);
            add(b, vec![0; len * elem.bytes()]);
        }
        let row_bytes = model.kv_layout().row_bytes();
        add(
            Buffer::Arena,
            vec![0; arena_pages as usize * page_size as usize * row_bytes],
        );
        gpu_plan::host_tensors(model, |t, h| {
            let bytes = match h.data {
                HostData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            };
            add(Buffer::Weight(t), bytes);
            Ok::<(), gpu_plan::WeightError>(())
        })
        .unwrap();
        let mut input = Input::default().u(buffers.len() as u32);
        for (id, bytes) in buffers {
            input = input.u(id).q(bytes.len() as u64).bytes(&bytes);
        }
        EmulatedGpu {
            model,
            ids,
            arena_pages: u64::from(arena_pages),
            page_size,
            input,
            passes: Input::default(),
            queued: Vec::new(),
        }
    }

    /// Queues the pass over `rows`; its logits (and with `greedy` its argmax) come back
    /// from [`EmulatedGpu::run`].
    fn pass(&mut self, rows: &[BatchRow<'_>], greedy: bool) {
        let table = BatchTable::of(rows, self.arena_pages).unwrap();
        let id = |b: Buffer| self.ids[&b];
        let mut p = std::mem::take(&mut self.passes);
        let uploads = table.uploads();
        p = p.u(uploads.len() as u32);
        for (b, v) in uploads {
            p = p.u(id(b)).q(v.len() as u64 * 4).us(v);
        }
        let shape = PassShape {
            rows: rows.len(),
            wanted: table.logit_rows.len(),
            greedy,
            row_bytes: self.model.kv_layout().row_bytes() as u64,
            page_size: self.page_size,
        };
        let steps = gpu_plan::plan(self.model, shape);
        p = p.u(steps.len() as u32);
        for s in &steps {
            match s {
                Step::Launch {
                    kernel,
                    grid,
                    block,
                    args,
                } => {
                    let name = kernel.name();
                    p = p.u(0).u(name.len() as u32).bytes(name.as_bytes());
                    p = p.u(grid.0).u(grid.1).u(*block).u(args.len() as u32);
                    for a in args {
                        p = match a {
                            Arg::Ptr(b) => p.u(0).q(u64::from(id(*b))),
                            Arg::Null => p.u(1).q(0),
                            Arg::I32(v) => p.u(2).q(u64::from(*v as u32)),
                            Arg::U64(v) => p.u(3).q(*v),
                            Arg::F32(v) => p.u(4).q(u64::from(v.to_bits())),
                        };
                    }
                }
                Step::Gemm {
                    input,
                    weight,
                    out,
                    rows,
                    m,
                    k,
                } => {
                    p = p
                        .u(1)
                        .u(id(*input))
                        .u(id(Buffer::Weight(*weight)))
                        .u(id(*out));
                    p = p.u(*rows).u(*m).u(*k);
                }
            }
        }
        let wanted = table.logit_rows.len();
        let vocab = self.model.config().vocab;
        p = p.u(1 + u32::from(greedy));
        p = p.u(id(Buffer::Logits)).q((wanted * vocab * 4) as u64);
        if greedy {
            p = p.u(id(Buffer::Argmax)).q((wanted * 4) as u64);
        }
        self.passes = p;
        self.queued.push((wanted, greedy));
    }

    /// Runs every queued pass: each one's logits, and argmax tokens when greedy.
    fn run(self) -> Option<Vec<(Vec<f32>, Vec<u32>)>> {
        let vocab = self.model.config().vocab;
        let input = self.input.u(self.queued.len() as u32).bytes(&self.passes.0);
        let out = run("pass", &input.0)?;
        let mut at = 0;
        let mut results = Vec::new();
        for (wanted, greedy) in self.queued {
            let logits = floats(&out[at..at + wanted * vocab * 4]);
            at += wanted * vocab * 4;
            let mut tokens = Vec::new();
            if greedy {
                tokens = out[at..at + wanted * 4]
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                at += wanted * 4;
            }
            results.push((logits, tokens));
        }
        assert_eq!(
            at,
            out.len(),
            "the emulator wrote more than the passes' outputs"
        );
        Some(results)
    }
}

/// `rows` of `seq` at `start..start + tokens.len()`, the last wanting logits (or all).
fn chunk<'s>(seq: &'s Sequence, start: u32, tokens: &[u32], all: bool) -> Vec<BatchRow<'s>> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| BatchRow {
            token: *t,
            pos: start + i as u32,
            seq,
            logits: all || i + 1 == tokens.len(),
        })
        .collect()
}

#[test]
fn emulated_gpu_pass_follows_its_plan_and_agrees_with_the_cpu_runner() {
    // Two sequences on scrambled pages of one arena; prefills, a batch mixing a decode of
    // one with a chunk of the other (greedy on the device), then a chunk long enough to
    // pass Gemma's window of 4, every row wanting logits.
    for (shape, name) in [(tiny_llama(), "tiny llama"), (tiny_gemma(6), "tiny gemma3")] {
        let f = GgufFile::from_bytes(format!("{name}.gguf"), build(&shape, 7)).unwrap();
        let m = Model::load(&f).unwrap();
        let (page, pages) = (4u32, 16u32);
        let mut cpu = Runner::new(&m, RunnerOptions::default()).unwrap();
        let mut host = HostKvPages::new(m.kv_layout(), page, pages).unwrap();
        let mut gpu = EmulatedGpu::new(&m, 8, pages, page);
        let mut a = Sequence::with_pages(vec![9, 2, 14, 5], 0);
        let mut b = Sequence::with_pages(vec![0, 11, 7, 3], 0);
        let vocab = shape.vocab as u32;
        let toks =
            |n: usize, k: u32| -> Vec<u32> { (0..n as u32).map(|i| (i * 7 + k) % vocab).collect() };
        let mut want = Vec::new();
        let mut step = |rows: &[BatchRow<'_>], greedy: bool, gpu: &mut EmulatedGpu<'_, '_>| {
            want.push(cpu.forward(rows, &mut host).unwrap().to_vec());
            gpu.pass(rows, greedy);
        };
        step(&chunk(&a, 0, &toks(6, 1), false), false, &mut gpu);
        a.set_len(6);
        step(&chunk(&b, 0, &toks(3, 5), false), false, &mut gpu);
        b.set_len(3);
        let mut mixed = chunk(&a, 6, &toks(1, 2), false);
        mixed.extend(chunk(&b, 3, &toks(2, 9), false));
        step(&mixed, true, &mut gpu);
        a.set_len(7);
        b.set_len(5);
        step(&chunk(&a, 7, &toks(5, 3), true), false, &mut gpu);
        let Some(got) = gpu.run() else {
            return;
        };
        for (i, ((logits, tokens), want)) in got.iter().zip(&want).enumerate() {
            let e = rel(logits, want);
            assert!(e < 3e-2, "{name}: pass {i}'s logits differ by {e}");
            for (r, t) in tokens.iter().enumerate() {
                let row = &want[r * vocab as usize..(r + 1) * vocab as usize];
                let (best, margin) = top(row);
                if margin > 0.05 {
                    assert_eq!(*t as usize, best, "{name}: pass {i} row {r}'s greedy token");
                }
            }
        }
        assert_eq!(
            got[2].1.len(),
            2,
            "{name}: the mixed batch wants two tokens"
        );
    }
}

#[test]
fn a_pass_is_nine_steps_a_layer_and_skips_what_no_logit_needs() {
    let shape = tiny_llama();
    let f = GgufFile::from_bytes("plan.gguf".to_string(), build(&shape, 7)).unwrap();
    let m = Model::load(&f).unwrap();
    let layers = shape.layers;
    let pass = |rows, wanted, greedy| {
        gpu_plan::plan(
            &m,
            PassShape {
                rows,
                wanted,
                greedy,
                row_bytes: m.kv_layout().row_bytes() as u64,
                page_size: 16,
            },
        )
    };
    // Embedding and the first norm, 9 a layer, the gathered norm and the logits product.
    assert_eq!(pass(3, 1, false).len(), 2 + 9 * layers + 2);
    // Greedy adds the argmax; a prefill chunk wanting no logits stops after the last
    // layer's K/V are written (its product and the per-head kernel).
    assert_eq!(pass(3, 1, true).len(), 2 + 9 * layers + 3);
    assert_eq!(pass(3, 0, false).len(), 2 + 9 * (layers - 1) + 2);
    assert!(pass(0, 0, false).is_empty());
    let launches = |steps: &[Step]| {
        steps
            .iter()
            .filter(|s| matches!(s, Step::Launch { .. }))
            .count()
    };
    // Of a layer's 9, 4 are cuBLAS products (Q/K/V, output, gate/up, down).
    assert_eq!(launches(&pass(3, 1, false)), 2 + 5 * layers + 1);
}
