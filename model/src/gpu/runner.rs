//! [`GpuRunner`]: a batch of rows through every layer on the device, as
//! [`crate::Runner::forward`] computes it on the CPU — the same rows ([`BatchRow`]: token,
//! position, the sequence whose page table holds it), the same checks, the same order of
//! operations — with K and V in a page arena in device memory ([`DeviceKv`]).
//!
//! Per call: the rows' tokens, positions and page tables are copied up; every layer runs
//! RMS norm → Q/K/V products → per-head norm and RoPE → K/V into the pages → paged
//! attention → output product → residual (with Gemma's post-norms) → the gated FFN; the
//! rows that want logits are normed and projected, and their logits copied back. One
//! stream; the call returns when the logits are on the host.
//!
//! Differences from the CPU path, by design: weights are f16 (the CPU multiplies the
//! quantized blocks with 8-bit activations), so logits agree within a tolerance and greedy
//! tokens agree, not bit for bit (`agent/gpu-check` measures both); the last layer's FFN
//! runs on every row, not only those that want logits (row-wise, so no result changes).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, result as blas, sys as blas_sys};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};

use super::GpuError;
use super::kernels::Kernels;
use super::libraries::{LoadedLibrary, check_libraries, loaded_libraries};
use super::weights::{DeviceMatrix, DeviceWeights};
use crate::arch::{Arch, BatchRow, Model, ModelError};
use crate::kv::{KvError, Sequence};
use crate::ops::math::{Activation, RopeStyle};

/// A page arena in device memory, as the runner reads and writes it: `bytes` at device
/// address `ptr`, pages of `page_size` rows of `row_bytes` (see [`crate::kv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceKv {
    pub ptr: u64,
    pub bytes: u64,
    pub page_size: u32,
    pub row_bytes: u64,
}

impl DeviceKv {
    fn pages(&self) -> u64 {
        let page = u64::from(self.page_size).saturating_mul(self.row_bytes);
        self.bytes.checked_div(page).unwrap_or(0)
    }
}

/// Threads per block of the row kernels.
const BLOCK: u32 = 256;
/// Threads per block of attention (a head of up to 4 × this many dims).
const ATTENTION_BLOCK: u32 = 128;
/// The widest head the kernels take (their shared buffers).
const MAX_HEAD_DIM: usize = 512;

/// Device buffers for up to `cap` rows, reused by every call.
#[derive(Debug)]
struct Buffers {
    cap: usize,
    x: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    o: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    /// f16 inputs of the products: normed rows, attention output, FFN activation.
    h16: CudaSlice<u16>,
    att16: CudaSlice<u16>,
    ff16: CudaSlice<u16>,
    logits: CudaSlice<f32>,
    tokens: CudaSlice<u32>,
    pos: CudaSlice<u32>,
    row_seq: CudaSlice<u32>,
    logit_rows: CudaSlice<u32>,
    pt_off: CudaSlice<u32>,
    pages: CudaSlice<u32>,
    argmax: CudaSlice<u32>,
}

/// Runs a [`Model`] on a GPU. One runner runs one batch at a time (`&mut self`).
pub struct GpuRunner<'m, 'a> {
    model: &'m Model<'a>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    k: Kernels,
    w: DeviceWeights,
    b: Buffers,
    logits: Vec<f32>,
    libraries: Vec<LoadedLibrary>,
    device_name: String,
}

impl std::fmt::Debug for GpuRunner<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRunner")
            .field("device", &self.device_name)
            .field("kernels", &self.k.origin)
            .field("weight_bytes", &self.w.bytes)
            .finish_non_exhaustive()
    }
}

fn dptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p
}

fn launch_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> GpuError + '_ {
    move |e| GpuError::call(&format!("launching {what}"), e)
}

impl<'m, 'a> GpuRunner<'m, 'a> {
    /// A runner for `model` on `ctx` (the context that owns the page arena it will be
    /// given): the libraries checked, the kernels compiled and loaded, the weights
    /// uploaded, buffers for `max_batch` rows allocated.
    pub fn new(
        model: &'m Model<'a>,
        ctx: &Arc<CudaContext>,
        max_batch: usize,
    ) -> Result<GpuRunner<'m, 'a>, GpuError> {
        check_libraries(super::kernels::ptx_file().is_none())?;
        let c = model.config();
        if c.head_dim > MAX_HEAD_DIM || c.n_rot > c.head_dim || c.head_dim == 0 {
            return Err(GpuError::Unsupported(format!(
                "head_dim {} (rotated {}): the kernels take heads of 1 to {MAX_HEAD_DIM} dims",
                c.head_dim, c.n_rot
            )));
        }
        if c.n_head_kv == 0 || !c.n_head.is_multiple_of(c.n_head_kv) {
            return Err(GpuError::Unsupported(format!(
                "{} query heads over {} KV heads",
                c.n_head, c.n_head_kv
            )));
        }
        let device_name = ctx.name().unwrap_or_else(|_| "GPU".into());
        let stream = ctx
            .new_stream()
            .map_err(|e| GpuError::call("creating a stream", e))?;
        let blas =
            CudaBlas::new(Arc::clone(&stream)).map_err(|e| GpuError::call("starting cuBLAS", e))?;
        let k = Kernels::load(ctx)?;
        let w = DeviceWeights::upload(model, &stream)?;
        let b = Buffers::new(&stream, model, max_batch.max(1), 1)?;
        stream
            .synchronize()
            .map_err(|e| GpuError::call("uploading the weights", e))?;
        Ok(GpuRunner {
            model,
            stream,
            blas,
            k,
            w,
            b,
            logits: Vec::new(),
            libraries: loaded_libraries(),
            device_name,
        })
    }

    pub fn model(&self) -> &'m Model<'a> {
        self.model
    }

    /// The CUDA libraries loaded when the runner started, and their files.
    pub fn libraries(&self) -> &[LoadedLibrary] {
        &self.libraries
    }

    /// Where the kernels came from (`nvrtc compute_90`, or a PTX file).
    pub fn kernels_origin(&self) -> &str {
        &self.k.origin
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.w.bytes
    }

    /// Runs `rows` (any mix of sequences) and returns the logits of the rows with `logits`
    /// set, in order, `vocab` each, as [`crate::Runner::forward`] does.
    pub fn forward(&mut self, rows: &[BatchRow<'_>], kv: &DeviceKv) -> Result<&[f32], ModelError> {
        let wanted = self.run(rows, kv)?;
        let vocab = self.model.config().vocab;
        let need = wanted * vocab;
        self.logits.resize(need, 0.0);
        if need > 0 {
            let view = self.b.logits.slice(0..need);
            self.stream
                .memcpy_dtoh(&view, &mut self.logits[..need])
                .map_err(|e| GpuError::call("copying logits back", e))?;
        }
        self.stream
            .synchronize()
            .map_err(|e| GpuError::call("finishing the pass", e))?;
        Ok(&self.logits[..need])
    }

    /// Appends `tokens` to `seq` (positions `seq.len()..`, its pages covering them) and
    /// returns the last token's logits, as [`crate::Runner::prefill`] does.
    pub fn prefill(
        &mut self,
        tokens: &[u32],
        kv: &DeviceKv,
        seq: &mut Sequence,
    ) -> Result<&[f32], ModelError> {
        let start = seq.len();
        let n = u32::try_from(tokens.len())
            .ok()
            .filter(|n| *n > 0 && start.checked_add(*n).is_some())
            .ok_or_else(|| ModelError::Input("a prefill of no tokens, or too many".into()))?;
        let seq_ref: &Sequence = seq;
        let rows: Vec<BatchRow<'_>> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| BatchRow {
                token: *t,
                pos: start + i as u32,
                seq: seq_ref,
                logits: i + 1 == tokens.len(),
            })
            .collect();
        self.forward(&rows, kv)?;
        seq.set_len(start + n);
        Ok(&self.logits)
    }

    /// Runs `rows` and returns the greedy token of each row with `logits` set, chosen on
    /// the device (only the token ids are copied back).
    pub fn forward_greedy(
        &mut self,
        rows: &[BatchRow<'_>],
        kv: &DeviceKv,
    ) -> Result<Vec<u32>, ModelError> {
        let wanted = self.run(rows, kv)?;
        let mut out = vec![0u32; wanted];
        if wanted > 0 {
            let (logits, argmax) = (
                dptr(&self.b.logits, &self.stream),
                dptr(&self.b.argmax, &self.stream),
            );
            let vocab = self.model.config().vocab as i32;
            // den_argmax's block is 256 threads (its shared arrays).
            launch(
                &self.stream,
                &self.k.argmax,
                grid(wanted, 1, 256),
                "den_argmax",
                |l| {
                    l.arg(&logits).arg(&argmax).arg(&vocab);
                },
            )?;
            let view = self.b.argmax.slice(0..wanted);
            self.stream
                .memcpy_dtoh(&view, &mut out[..])
                .map_err(|e| GpuError::call("copying tokens back", e))?;
        }
        self.stream
            .synchronize()
            .map_err(|e| GpuError::call("finishing the pass", e))?;
        Ok(out)
    }

    /// Launches an empty kernel `n` times and waits: launch overhead, for `gpu-check`.
    pub fn launch_noops(&self, n: usize) -> Result<(), GpuError> {
        for _ in 0..n {
            launch(
                &self.stream,
                &self.k.noop,
                grid(1, 1, 32),
                "den_noop",
                |_| {},
            )?;
        }
        self.stream
            .synchronize()
            .map_err(|e| GpuError::call("waiting for no-ops", e))
    }

    /// Checks `rows` against the model and the arena (before anything is written).
    fn check(&self, rows: &[BatchRow<'_>], kv: &DeviceKv) -> Result<(), ModelError> {
        let c = self.model.config();
        let want = self.model.kv_layout().row_bytes() as u64;
        if kv.row_bytes != want {
            return Err(KvError::RowSize {
                got: kv.row_bytes as usize,
                expected: want as usize,
            }
            .into());
        }
        let pages = kv.pages();
        for r in rows {
            crate::arch::forward::check_row(c, r)?;
            let (page, _) = r.seq.locate_or_err(r.pos, kv.page_size)?;
            if u64::from(page) >= pages {
                return Err(ModelError::Input(format!(
                    "page {page} is past the device arena ({pages} pages)"
                )));
            }
        }
        Ok(())
    }

    /// The pass up to the logits on the device; returns how many rows want logits.
    fn run(&mut self, rows: &[BatchRow<'_>], kv: &DeviceKv) -> Result<usize, ModelError> {
        self.check(rows, kv)?;
        let n = rows.len();
        if n == 0 {
            return Ok(0);
        }
        // Sequences by identity, each with its page table once.
        let mut seq_index: HashMap<*const Sequence, u32> = HashMap::new();
        let mut pt_off: Vec<u32> = Vec::new();
        let mut pages: Vec<u32> = Vec::new();
        let mut row_seq = Vec::with_capacity(n);
        for r in rows {
            let key: *const Sequence = r.seq;
            let i = match seq_index.get(&key) {
                Some(i) => *i,
                None => {
                    let i = pt_off.len() as u32;
                    pt_off.push(pages.len() as u32);
                    if let Some(p) = r.seq.pages().iter().find(|p| u64::from(**p) >= kv.pages()) {
                        return Err(ModelError::Input(format!(
                            "page {p} is past the device arena ({} pages)",
                            kv.pages()
                        )));
                    }
                    pages.extend_from_slice(r.seq.pages());
                    seq_index.insert(key, i);
                    i
                }
            };
            row_seq.push(i);
        }
        pt_off.push(pages.len() as u32);
        let tokens: Vec<u32> = rows.iter().map(|r| r.token).collect();
        let pos: Vec<u32> = rows.iter().map(|r| r.pos).collect();
        let logit_rows: Vec<u32> = (0..n as u32).filter(|i| rows[*i as usize].logits).collect();
        if n > self.b.cap || pages.len() > self.b.pages.len() {
            self.b = Buffers::new(&self.stream, self.model, n.max(self.b.cap), pages.len())?;
        }
        let up = |host: &[u32], dev: &mut CudaSlice<u32>, stream: &Arc<CudaStream>| {
            if host.is_empty() {
                return Ok(());
            }
            let mut view = dev.slice_mut(0..host.len());
            stream
                .memcpy_htod(host, &mut view)
                .map_err(|e| GpuError::call("copying the batch up", e))
        };
        up(&tokens, &mut self.b.tokens, &self.stream)?;
        up(&pos, &mut self.b.pos, &self.stream)?;
        up(&row_seq, &mut self.b.row_seq, &self.stream)?;
        up(&pt_off, &mut self.b.pt_off, &self.stream)?;
        up(&pages, &mut self.b.pages, &self.stream)?;
        up(&logit_rows, &mut self.b.logit_rows, &self.stream)?;
        self.layers(n, &logit_rows, kv)?;
        Ok(logit_rows.len())
    }

    fn layers(&self, n: usize, logit_rows: &[u32], kv: &DeviceKv) -> Result<(), GpuError> {
        let m = self.model;
        let c = m.config();
        let s = &self.stream;
        let b = &self.b;
        let (e, hd) = (c.n_embd as i32, c.head_dim as i32);
        let kvd = c.n_head_kv * c.head_dim;
        let layout = m.kv_layout();
        let rows_cfg = |threads: u32| grid(n, 1, threads);
        let (x, q, k, v, o) = (
            dptr(&b.x, s),
            dptr(&b.q, s),
            dptr(&b.k, s),
            dptr(&b.v, s),
            dptr(&b.o, s),
        );
        let (gate, up) = (dptr(&b.gate, s), dptr(&b.up, s));
        let (h16, att16, ff16) = (dptr(&b.h16, s), dptr(&b.att16, s), dptr(&b.ff16, s));
        let (tokens, pos, row_seq) = (dptr(&b.tokens, s), dptr(&b.pos, s), dptr(&b.row_seq, s));
        let (pt_off, pages, lrows) = (
            dptr(&b.pt_off, s),
            dptr(&b.pages, s),
            dptr(&b.logit_rows, s),
        );
        let null = 0u64;
        let eps = c.eps;

        // Embeddings.
        let table = dptr(&self.w.token_embd.data, s);
        let scale = if c.arch == Arch::Gemma3 {
            c.embd_scale
        } else {
            1.0
        };
        launch(s, &self.k.embed, rows_cfg(BLOCK), "den_embed", |l| {
            l.arg(&table).arg(&tokens).arg(&x).arg(&e).arg(&scale);
        })?;

        // Every row normed by `w` into `h16`, the next product's input.
        let norm_rows = |w: &CudaSlice<f32>| {
            let w = dptr(w, s);
            launch(
                s,
                &self.k.rms_norm_h,
                rows_cfg(BLOCK),
                "den_rms_norm_h",
                |l| {
                    l.arg(&x).arg(&w).arg(&h16).arg(&null).arg(&e).arg(&eps);
                },
            )
        };
        // x += o, o normed first by Gemma's post-norm `w`.
        let add_rows = |w: Option<&CudaSlice<f32>>| {
            let w = if c.post_norms {
                w.map_or(0, |t| dptr(t, s))
            } else {
                0
            };
            launch(s, &self.k.post_add, rows_cfg(BLOCK), "den_post_add", |l| {
                l.arg(&x).arg(&o).arg(&w).arg(&e).arg(&eps);
            })
        };
        let last = m.layers.len().saturating_sub(1);
        for (li, (layer, lc)) in self.w.layers.iter().zip(&c.layers).enumerate() {
            // Attention.
            norm_rows(&layer.attn_norm)?;
            self.gemm(h16, &layer.wq, q, n)?;
            self.gemm(h16, &layer.wk, k, n)?;
            self.gemm(h16, &layer.wv, v, n)?;
            let qn = layer.q_norm.as_ref().map_or(0, |t| dptr(t, s));
            let kn = layer.k_norm.as_ref().map_or(0, |t| dptr(t, s));
            let qk_norm = i32::from(c.qk_norm && qn != 0 && kn != 0);
            let (n_head, n_kv) = (c.n_head as i32, c.n_head_kv as i32);
            let n_rot = c.n_rot as i32;
            let neox = i32::from(c.rope_style == RopeStyle::Neox);
            let (base, rope_scale, attn_scale) = (lc.rope_base, lc.rope_scale, c.attn_scale);
            let heads_cfg = grid(n, c.n_head + c.n_head_kv, 128);
            launch(s, &self.k.qk_rope, heads_cfg, "den_qk_rope", |l| {
                l.arg(&q).arg(&k).arg(&qn).arg(&kn).arg(&pos);
                l.arg(&n_head).arg(&n_kv).arg(&hd).arg(&n_rot).arg(&neox);
                l.arg(&base)
                    .arg(&rope_scale)
                    .arg(&attn_scale)
                    .arg(&qk_norm)
                    .arg(&eps);
            })?;
            let (k_off, v_off) = (layout.k_offset(li) as u64, layout.v_offset(li) as u64);
            let kvd_i = kvd as i32;
            let (arena, row_bytes, page_size) = (kv.ptr, kv.row_bytes, kv.page_size as i32);
            launch(
                s,
                &self.k.kv_append,
                rows_cfg(BLOCK),
                "den_kv_append",
                |l| {
                    l.arg(&k)
                        .arg(&v)
                        .arg(&arena)
                        .arg(&row_seq)
                        .arg(&pos)
                        .arg(&pt_off);
                    l.arg(&pages)
                        .arg(&kvd_i)
                        .arg(&row_bytes)
                        .arg(&page_size)
                        .arg(&k_off)
                        .arg(&v_off);
                },
            )?;
            if li == last && logit_rows.is_empty() {
                break;
            }
            let window = lc.window.map_or(0, |w| w.min(i32::MAX as u32) as i32);
            let att_cfg = grid(n, c.n_head, ATTENTION_BLOCK);
            launch(s, &self.k.attention, att_cfg, "den_attention", |l| {
                l.arg(&q)
                    .arg(&att16)
                    .arg(&arena)
                    .arg(&row_seq)
                    .arg(&pos)
                    .arg(&pt_off);
                l.arg(&pages)
                    .arg(&n_head)
                    .arg(&n_kv)
                    .arg(&hd)
                    .arg(&row_bytes);
                l.arg(&page_size).arg(&k_off).arg(&v_off).arg(&window);
            })?;
            self.gemm(att16, &layer.wo, o, n)?;
            add_rows(layer.post_attn_norm.as_ref())?;
            // FFN.
            norm_rows(&layer.ffn_norm)?;
            self.gemm(h16, &layer.gate, gate, n)?;
            self.gemm(h16, &layer.up, up, n)?;
            let elements = (n * c.n_ff) as u64;
            let gelu = i32::from(c.activation == Activation::GeluTanh);
            let glu_cfg = grid(elements.div_ceil(u64::from(BLOCK)) as usize, 1, BLOCK);
            launch(s, &self.k.glu, glu_cfg, "den_glu", |l| {
                l.arg(&gate).arg(&up).arg(&ff16).arg(&elements).arg(&gelu);
            })?;
            self.gemm(ff16, &layer.down, o, n)?;
            add_rows(layer.post_ffn_norm.as_ref())?;
        }
        let wanted = logit_rows.len();
        if wanted == 0 {
            return Ok(());
        }
        // The rows that want logits, normed into h16's first rows, then projected.
        let norm = dptr(&self.w.output_norm, s);
        launch(
            s,
            &self.k.rms_norm_h,
            grid(wanted, 1, BLOCK),
            "den_rms_norm_h",
            |l| {
                l.arg(&x).arg(&norm).arg(&h16).arg(&lrows).arg(&e).arg(&eps);
            },
        )?;
        let logits = dptr(&self.b.logits, s);
        self.gemm(h16, self.w.output(), logits, wanted)
    }

    /// `out[n × w.rows] (f32) = input[n × w.cols] (f16) · wᵀ`: in cuBLAS's column-major
    /// terms `outᵀ = op(W) · inputᵀ` with W read transposed.
    fn gemm(&self, input: u64, w: &DeviceMatrix, out: u64, n: usize) -> Result<(), GpuError> {
        let alpha = 1.0f32;
        let beta = 0.0f32;
        let weights = dptr(&w.data, &self.stream);
        let (m, k) = (w.rows as i32, w.cols as i32);
        // SAFETY: `weights` holds rows × cols f16, `input` at least n × cols f16 and `out`
        // at least n × rows f32 (the buffers are sized for the batch and the model); the
        // handle runs on this runner's stream.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                m,
                n as i32,
                k,
                (&alpha) as *const f32 as *const _,
                weights as *const _,
                blas_sys::cudaDataType_t::CUDA_R_16F,
                k,
                input as *const _,
                blas_sys::cudaDataType_t::CUDA_R_16F,
                k,
                (&beta) as *const f32 as *const _,
                out as *mut _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                m,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| GpuError::call(&format!("cuBLAS GemmEx ({m} × {k} by {n} rows)"), e))
    }
}

/// `x × y` blocks of `threads` threads.
fn grid(x: usize, y: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x as u32, y as u32, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches `f` with the arguments `args` pushes.
fn launch<'a>(
    stream: &'a Arc<CudaStream>,
    f: &'a CudaFunction,
    cfg: LaunchConfig,
    what: &str,
    args: impl FnOnce(&mut cudarc::driver::LaunchArgs<'a>),
) -> Result<(), GpuError> {
    let mut l = stream.launch_builder(f);
    args(&mut l);
    // SAFETY: each call site pushes exactly the kernel's parameters, in order and of the
    // kernel's types (pointers as u64 device addresses, ints as i32, sizes as u64), and
    // every buffer is sized for the batch it launches over.
    unsafe { l.launch(cfg) }.map_err(launch_err(what))?;
    Ok(())
}

impl Buffers {
    fn new(
        stream: &Arc<CudaStream>,
        model: &Model<'_>,
        cap: usize,
        pages: usize,
    ) -> Result<Buffers, GpuError> {
        let c = model.config();
        let qd = c.n_head * c.head_dim;
        let kvd = c.n_head_kv * c.head_dim;
        let widest = c.n_embd.max(qd).max(c.n_ff);
        let f32s = |len: usize| {
            stream
                .alloc_zeros::<f32>(len.max(1))
                .map_err(|e| GpuError::call("allocating activations", e))
        };
        let u16s = |len: usize| {
            stream
                .alloc_zeros::<u16>(len.max(1))
                .map_err(|e| GpuError::call("allocating activations", e))
        };
        let u32s = |len: usize| {
            stream
                .alloc_zeros::<u32>(len.max(1))
                .map_err(|e| GpuError::call("allocating batch tables", e))
        };
        Ok(Buffers {
            cap,
            x: f32s(cap * c.n_embd)?,
            q: f32s(cap * qd)?,
            k: f32s(cap * kvd)?,
            v: f32s(cap * kvd)?,
            o: f32s(cap * c.n_embd)?,
            gate: f32s(cap * c.n_ff)?,
            up: f32s(cap * c.n_ff)?,
            h16: u16s(cap * widest)?,
            att16: u16s(cap * qd)?,
            ff16: u16s(cap * c.n_ff)?,
            logits: f32s(cap * c.vocab)?,
            tokens: u32s(cap)?,
            pos: u32s(cap)?,
            row_seq: u32s(cap)?,
            logit_rows: u32s(cap)?,
            pt_off: u32s(cap + 1)?,
            pages: u32s(pages.max(cap))?,
            argmax: u32s(cap)?,
        })
    }
}
