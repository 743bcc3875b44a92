//! The forward pass: a batch of (token, position, sequence) rows through every layer, K
//! and V written to each row's page slot, attention read back through the page tables.

use std::sync::Mutex;

use super::{Arch, Model, ModelError};
use crate::ggml_type::GgmlType;
use crate::kv::{KV_ELEM_BYTES, KvPages, Sequence};
use crate::ops::attention::{self, AttnError, AttnPath, AttnShape, Query};
use crate::ops::kernels::{Kernels, Q8Rows};
use crate::ops::math::{rms_norm, rms_norm_in_place, rope, rope_table};
use crate::ops::matmul::{self, Ctx, Input, MatmulError, MatmulMode, ThreadScratch, Weight};
use crate::ops::pool::Pool;
use crate::quant;

/// How a [`Runner`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerOptions {
    /// Threads, the caller's included (at least 1).
    pub threads: usize,
    /// Rows per weight pass: longer batches are split into passes of this many rows.
    pub max_batch: usize,
    pub mode: MatmulMode,
    /// Use the portable kernels even where SIMD ones exist (tests).
    pub force_scalar: bool,
    /// SIMD: decode weight blocks in registers for 4 rows at a time (the default) rather
    /// than unpacking each weight row to memory and then taking dots (for measuring).
    pub fused: bool,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            threads: 2,
            max_batch: 64,
            mode: MatmulMode::Quantized,
            force_scalar: false,
            fused: true,
        }
    }
}

/// One row of a batch: `token` at position `pos` of `seq`. Its K and V are written to
/// `seq`'s slot for `pos`; its attention reads positions `0..=pos` of `seq` (those before
/// `pos` written earlier, or by rows before this one in the same batch).
#[derive(Debug, Clone, Copy)]
pub struct BatchRow<'s> {
    pub token: u32,
    pub pos: u32,
    pub seq: &'s Sequence,
    /// Whether to compute this row's logits.
    pub logits: bool,
}

/// Buffers for up to `cap` rows, reused by every call.
#[derive(Debug, Default)]
struct Scratch {
    cap: usize,
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    ff: Vec<f32>,
    q8: Q8Rows,
    t: Vec<f32>,
    /// Per rope variant (index into `Runner::ropes`): cos and sin, `cap × n_rot/2`.
    cos: Vec<Vec<f32>>,
    sin: Vec<Vec<f32>>,
    kv16: Vec<u8>,
    /// Final-norm rows of the rows that want logits.
    hl: Vec<f32>,
    logits: Vec<f32>,
}

/// Runs a [`Model`]: its threads, kernels and scratch. One runner runs one batch at a time
/// (`&mut self`); the model can be shared by several runners.
pub struct Runner<'m, 'a> {
    model: &'m Model<'a>,
    opts: RunnerOptions,
    kernels: Kernels,
    pool: Pool,
    tls: Vec<Mutex<ThreadScratch>>,
    s: Scratch,
    /// Distinct (rope base, scale) pairs, and each layer's index into them.
    ropes: Vec<(f32, f32)>,
    layer_rope: Vec<usize>,
}

impl std::fmt::Debug for Runner<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("opts", &self.opts)
            .field("kernels", &self.kernels)
            .finish_non_exhaustive()
    }
}

fn internal(e: impl std::fmt::Display) -> ModelError {
    ModelError::Internal(e.to_string())
}

impl From<MatmulError> for ModelError {
    fn from(e: MatmulError) -> Self {
        internal(e)
    }
}

impl From<AttnError> for ModelError {
    fn from(e: AttnError) -> Self {
        match e {
            AttnError::Kv(e) => ModelError::Kv(e),
            AttnError::Panicked(p) => internal(p),
        }
    }
}

impl<'m, 'a> Runner<'m, 'a> {
    /// A runner for `model`, its threads started and its buffers sized for
    /// `opts.max_batch` rows.
    pub fn new(model: &'m Model<'a>, opts: RunnerOptions) -> Result<Runner<'m, 'a>, ModelError> {
        let opts = RunnerOptions {
            threads: opts.threads.max(1),
            max_batch: opts.max_batch.max(1),
            ..opts
        };
        let pool = Pool::new(opts.threads)
            .map_err(|e| ModelError::Internal(format!("cannot start a thread: {e}")))?;
        let kernels = if opts.force_scalar {
            Kernels::scalar()
        } else {
            Kernels::detect().with_fused(opts.fused)
        };
        let mut ropes: Vec<(f32, f32)> = Vec::new();
        let mut layer_rope = Vec::new();
        for l in &model.config.layers {
            let key = (l.rope_base, l.rope_scale);
            let i = match ropes.iter().position(|r| *r == key) {
                Some(i) => i,
                None => {
                    ropes.push(key);
                    ropes.len() - 1
                }
            };
            layer_rope.push(i);
        }
        let tls = (0..opts.threads)
            .map(|_| Mutex::new(ThreadScratch::default()))
            .collect();
        let mut r = Runner {
            model,
            opts,
            kernels,
            pool,
            tls,
            s: Scratch::default(),
            ropes,
            layer_rope,
        };
        r.size_scratch(opts.max_batch);
        Ok(r)
    }

    pub fn model(&self) -> &'m Model<'a> {
        self.model
    }

    pub fn options(&self) -> RunnerOptions {
        self.opts
    }

    /// Whether SIMD kernels are in use.
    pub fn simd(&self) -> bool {
        self.kernels.is_simd()
    }

    fn size_scratch(&mut self, cap: usize) {
        let c = &self.model.config;
        let s = &mut self.s;
        s.cap = cap;
        let qd = c.n_head * c.head_dim;
        let kvd = c.n_head_kv * c.head_dim;
        s.x = vec![0.0; cap * c.n_embd];
        s.h = vec![0.0; cap * c.n_embd];
        s.q = vec![0.0; cap * qd];
        s.k = vec![0.0; cap * kvd];
        s.v = vec![0.0; cap * kvd];
        s.att = vec![0.0; cap * qd];
        s.o = vec![0.0; cap * c.n_embd];
        s.ff = vec![0.0; cap * c.n_ff];
        let widest = c.n_embd.max(c.n_ff).max(qd).next_multiple_of(32);
        s.q8 = Q8Rows::with_capacity(cap, widest);
        let tallest = (qd + 2 * kvd).max(c.n_ff).max(c.n_embd);
        s.t = vec![0.0; cap * tallest];
        let half = c.n_rot / 2;
        s.cos = vec![vec![0.0; cap * half]; self.ropes.len()];
        s.sin = vec![vec![0.0; cap * half]; self.ropes.len()];
        s.kv16 = vec![0; kvd * KV_ELEM_BYTES];
        s.hl = vec![0.0; c.n_embd];
        s.logits = vec![0.0; c.vocab];
        for t in &self.tls {
            if let Ok(mut t) = t.lock() {
                t.unpacked = crate::ops::kernels::Unpacked::with_capacity(widest);
                t.wrow = vec![0.0; widest];
            }
        }
    }

    /// Appends `tokens` to `seq` (positions `seq.len()..`), writing their KV rows into
    /// `seq`'s pages (which must cover them), and returns the last token's logits.
    pub fn prefill<K: KvPages + Sync>(
        &mut self,
        tokens: &[u32],
        kv: &mut K,
        seq: &mut Sequence,
    ) -> Result<&[f32], ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::Input("prefill of no tokens".into()));
        }
        let start = seq.len();
        let n = u32::try_from(tokens.len())
            .ok()
            .filter(|n| start.checked_add(*n).is_some())
            .ok_or_else(|| ModelError::Input("prompt too long".into()))?;
        // Everything is checked before anything is written.
        let last = start + n - 1;
        if last >= self.model.config.context_length {
            return Err(ModelError::Input(format!(
                "position {last} is past the model's context ({} positions)",
                self.model.config.context_length
            )));
        }
        seq.locate_or_err(last, kv.page_size())?;
        let cap = self.opts.max_batch;
        let seq_ref: &Sequence = seq;
        for (ci, chunk) in tokens.chunks(cap).enumerate() {
            let base = start + (ci * cap) as u32;
            let last = base + chunk.len() as u32 == start + n;
            self.forward_chunk(
                chunk.len(),
                |i| BatchRow {
                    token: chunk[i],
                    pos: base + i as u32,
                    seq: seq_ref,
                    logits: last && i + 1 == chunk.len(),
                },
                kv,
                0,
                tokens.len(),
            )?;
        }
        seq.set_len(start + n);
        Ok(&self.s.logits[..self.model.config.vocab])
    }

    /// Appends one token to `seq` and returns its logits.
    pub fn decode<K: KvPages + Sync>(
        &mut self,
        token: u32,
        kv: &mut K,
        seq: &mut Sequence,
    ) -> Result<&[f32], ModelError> {
        self.prefill(&[token], kv, seq)
    }

    /// Runs `rows` (any mix of sequences: a prefill chunk, one decode step of many
    /// sequences, or both) and returns the logits of the rows with `logits` set, in order,
    /// `vocab` each. Rows of one sequence must come in increasing position order (a
    /// longer batch is run `max_batch` rows at a time). Sequences' lengths are not
    /// changed: the caller marks the rows written ([`Sequence::set_len`]).
    pub fn forward<K: KvPages + Sync>(
        &mut self,
        rows: &[BatchRow<'_>],
        kv: &mut K,
    ) -> Result<&[f32], ModelError> {
        let vocab = self.model.config.vocab;
        let wanted = rows.iter().filter(|r| r.logits).count();
        if self.s.logits.len() < wanted * vocab {
            self.s.logits.resize(wanted * vocab, 0.0);
        }
        let mut done = 0;
        for chunk in rows.chunks(self.opts.max_batch) {
            self.forward_chunk(chunk.len(), |i| chunk[i], kv, done, rows.len())?;
            done += chunk.iter().filter(|r| r.logits).count();
        }
        Ok(&self.s.logits[..wanted * vocab])
    }

    fn check_rows<'s, K: KvPages>(
        &self,
        n: usize,
        row: &impl Fn(usize) -> BatchRow<'s>,
        kv: &K,
    ) -> Result<(), ModelError> {
        let c = &self.model.config;
        let want = self.model.kv_layout().row_bytes();
        if kv.row_bytes() != want {
            return Err(crate::kv::KvError::RowSize {
                got: kv.row_bytes(),
                expected: want,
            }
            .into());
        }
        for i in 0..n {
            let r = row(i);
            check_row(c, &r)?;
            r.seq.locate_or_err(r.pos, kv.page_size())?;
        }
        Ok(())
    }

    /// One weight pass over `n ≤ cap` rows of a batch of `batch` rows; logits of wanting
    /// rows go to `logits` rows `logit_base..`.
    fn forward_chunk<'s, K: KvPages + Sync>(
        &mut self,
        n: usize,
        row: impl Fn(usize) -> BatchRow<'s> + Sync,
        kv: &mut K,
        logit_base: usize,
        batch: usize,
    ) -> Result<(), ModelError> {
        if n > self.s.cap {
            self.size_scratch(n);
        }
        self.check_rows(n, &row, kv)?;
        let m = self.model;
        let c = &m.config;
        let (e, hd) = (c.n_embd, c.head_dim);
        let qd = c.n_head * hd;
        let kvd = c.n_head_kv * hd;
        let half = c.n_rot / 2;
        let k = self.kernels;
        let mode = self.opts.mode;
        let ps = kv.page_size();
        let layout = m.kv_layout();
        let s = &mut self.s;

        // Embeddings.
        for i in 0..n {
            let x = &mut s.x[i * e..(i + 1) * e];
            quant::dequantize(
                m.token_embd.ty,
                m.token_embd.row(row(i).token as usize),
                e,
                x,
            )
            .map_err(internal)?;
            if c.arch == Arch::Gemma3 {
                for v in x.iter_mut() {
                    *v *= c.embd_scale;
                }
            }
        }
        // RoPE tables per variant.
        for (ri, (base, scale)) in self.ropes.iter().enumerate() {
            for i in 0..n {
                let pos = row(i).pos;
                rope_table_scaled(
                    pos,
                    *base,
                    *scale,
                    c.n_rot,
                    &mut s.cos[ri][i * half..(i + 1) * half],
                    &mut s.sin[ri][i * half..(i + 1) * half],
                );
            }
        }

        let mut cx = Ctx {
            pool: &mut self.pool,
            tls: &self.tls,
            kernels: k,
            mode,
        };
        for (li, layer) in m.layers.iter().enumerate() {
            let lc = c.layers[li];
            // Attention.
            for i in 0..n {
                rms_norm(
                    &s.x[i * e..(i + 1) * e],
                    &layer.attn_norm,
                    c.eps,
                    &mut s.h[i * e..(i + 1) * e],
                );
            }
            let segs = [layer.wq, layer.wk, layer.wv];
            quantize_for(k, mode, &segs, &s.h, n, e, &mut s.q8);
            matmul::matmul(
                &mut cx,
                &Input {
                    x: &s.h,
                    q8: &s.q8,
                    rows: n,
                    n: e,
                },
                &segs,
                &mut [&mut s.q[..n * qd], &mut s.k[..n * kvd], &mut s.v[..n * kvd]],
                &mut s.t,
            )?;
            let ri = self.layer_rope[li];
            for i in 0..n {
                let cos = &s.cos[ri][i * half..(i + 1) * half];
                let sin = &s.sin[ri][i * half..(i + 1) * half];
                for head in s.q[i * qd..(i + 1) * qd].chunks_exact_mut(hd) {
                    if c.qk_norm {
                        rms_norm_in_place(head, &layer.q_norm, c.eps);
                    }
                    rope(c.rope_style, head, cos, sin);
                    for v in head.iter_mut() {
                        *v *= c.attn_scale;
                    }
                }
                for head in s.k[i * kvd..(i + 1) * kvd].chunks_exact_mut(hd) {
                    if c.qk_norm {
                        rms_norm_in_place(head, &layer.k_norm, c.eps);
                    }
                    rope(c.rope_style, head, cos, sin);
                }
            }
            // K and V into the rows' slots.
            let (k_off, v_off) = (layout.k_offset(li), layout.v_offset(li));
            let nbytes = kvd * KV_ELEM_BYTES;
            for i in 0..n {
                let r = row(i);
                let (page, slot) = r.seq.locate_or_err(r.pos, ps)?;
                let dst = kv
                    .row_mut(page, slot)
                    .ok_or(crate::kv::KvError::NoRow { page, slot })?;
                k.f32_to_f16(&s.k[i * kvd..(i + 1) * kvd], &mut s.kv16);
                dst[k_off..k_off + nbytes].copy_from_slice(&s.kv16);
                k.f32_to_f16(&s.v[i * kvd..(i + 1) * kvd], &mut s.kv16);
                dst[v_off..v_off + nbytes].copy_from_slice(&s.kv16);
            }
            // A chunk no row of which wants logits needs nothing of the last layer but
            // its K and V.
            if li + 1 == m.layers.len() && !(0..n).any(|i| row(i).logits) {
                break;
            }
            attention::attention(
                cx.pool,
                cx.tls,
                k,
                &*kv,
                n,
                &|i| {
                    let r = row(i);
                    Query {
                        pos: r.pos,
                        seq: r.seq,
                    }
                },
                AttnShape {
                    n_head: c.n_head,
                    n_kv: c.n_head_kv,
                    head_dim: hd,
                    k_off,
                    v_off,
                    window: lc.window,
                    // llama.cpp's flash attention rounds through f16 below 64 query rows
                    // of a batch (its tiled f32 path from there on).
                    path: match mode {
                        MatmulMode::Exact => AttnPath::F32,
                        MatmulMode::Quantized if batch < attention::TILED_FROM_ROWS => {
                            AttnPath::OneRow
                        }
                        MatmulMode::Quantized => AttnPath::Tiled,
                    },
                },
                &s.q[..n * qd],
                &mut s.att[..n * qd],
            )?;
            let wo = [layer.wo];
            quantize_for(k, mode, &wo, &s.att, n, qd, &mut s.q8);
            matmul::matmul(
                &mut cx,
                &Input {
                    x: &s.att,
                    q8: &s.q8,
                    rows: n,
                    n: qd,
                },
                &wo,
                &mut [&mut s.o[..n * e]],
                &mut s.t,
            )?;
            // As llama.cpp does (`inp_out_ids`): after the last layer's attention only the
            // rows that want logits go on, so its FFN runs on those rows alone (and each
            // matmul sees the batch llama.cpp's does).
            let mut live = n;
            if li + 1 == m.layers.len() {
                live = 0;
                for i in 0..n {
                    if row(i).logits {
                        if live != i {
                            s.o.copy_within(i * e..(i + 1) * e, live * e);
                            s.x.copy_within(i * e..(i + 1) * e, live * e);
                        }
                        live += 1;
                    }
                }
                if live == 0 {
                    break;
                }
            }
            for i in 0..live {
                let o = &mut s.o[i * e..(i + 1) * e];
                if c.post_norms {
                    rms_norm_in_place(o, &layer.post_attn_norm, c.eps);
                }
                for (x, o) in s.x[i * e..(i + 1) * e].iter_mut().zip(o.iter()) {
                    *x += o;
                }
            }
            // FFN.
            for i in 0..live {
                rms_norm(
                    &s.x[i * e..(i + 1) * e],
                    &layer.ffn_norm,
                    c.eps,
                    &mut s.h[i * e..(i + 1) * e],
                );
            }
            quantize_for(k, mode, &[layer.gate, layer.up], &s.h, live, e, &mut s.q8);
            matmul::matmul_glu(
                &mut cx,
                &Input {
                    x: &s.h,
                    q8: &s.q8,
                    rows: live,
                    n: e,
                },
                &layer.gate,
                &layer.up,
                c.activation,
                &mut s.ff[..live * c.n_ff],
                &mut s.t,
            )?;
            let down = [layer.down];
            quantize_for(k, mode, &down, &s.ff, live, c.n_ff, &mut s.q8);
            matmul::matmul(
                &mut cx,
                &Input {
                    x: &s.ff,
                    q8: &s.q8,
                    rows: live,
                    n: c.n_ff,
                },
                &down,
                &mut [&mut s.o[..live * e]],
                &mut s.t,
            )?;
            for i in 0..live {
                let o = &mut s.o[i * e..(i + 1) * e];
                if c.post_norms {
                    rms_norm_in_place(o, &layer.post_ffn_norm, c.eps);
                }
                for (x, o) in s.x[i * e..(i + 1) * e].iter_mut().zip(o.iter()) {
                    *x += o;
                }
            }
        }

        // Logits of the rows that want them.
        // The last layer left the rows that want logits first in `s.x`.
        let wanted: usize = (0..n).filter(|i| row(*i).logits).count();
        if wanted == 0 {
            return Ok(());
        }
        if s.hl.len() < wanted * e {
            s.hl.resize(wanted * e, 0.0);
        }
        for j in 0..wanted {
            rms_norm(
                &s.x[j * e..(j + 1) * e],
                &m.output_norm,
                c.eps,
                &mut s.hl[j * e..(j + 1) * e],
            );
        }
        let out = [m.output];
        quantize_for(k, mode, &out, &s.hl, wanted, e, &mut s.q8);
        let vocab = c.vocab;
        let need = (logit_base + wanted) * vocab;
        if s.logits.len() < need {
            s.logits.resize(need, 0.0);
        }
        matmul::matmul(
            &mut cx,
            &Input {
                x: &s.hl,
                q8: &s.q8,
                rows: wanted,
                n: e,
            },
            &out,
            &mut [&mut s.logits[logit_base * vocab..need]],
            &mut s.t,
        )?;
        Ok(())
    }
}

/// A row's token and position against the model (the CPU and GPU passes check the same).
pub(crate) fn check_row(c: &super::Config, r: &BatchRow<'_>) -> Result<(), ModelError> {
    if r.token as usize >= c.vocab {
        return Err(ModelError::Input(format!(
            "token {} is past the vocabulary ({} tokens)",
            r.token, c.vocab
        )));
    }
    if r.pos >= c.context_length {
        return Err(ModelError::Input(format!(
            "position {} is past the model's context ({} positions)",
            r.pos, c.context_length
        )));
    }
    Ok(())
}

/// Quantizes the input rows when any of `ws` uses the quantized dot.
fn quantize_for(
    k: Kernels,
    mode: MatmulMode,
    ws: &[Weight<'_>],
    x: &[f32],
    rows: usize,
    n: usize,
    q8: &mut Q8Rows,
) {
    let q8_users = || ws.iter().filter(|w| w.uses_q8(mode));
    if q8_users().next().is_some() {
        // llama.cpp quantizes a K-quant's activations per 256 (`block_q8_K`); den's dots
        // take either layout, so a mixed group keeps the per-32 one.
        let per_256 = n.is_multiple_of(256)
            && q8_users().all(|w| matches!(w.ty, GgmlType::Q4_K | GgmlType::Q6_K));
        q8.quantize_as(k, x, rows, n, per_256);
    }
}

fn rope_table_scaled(
    pos: u32,
    base: f32,
    scale: f32,
    n_rot: usize,
    cos: &mut [f32],
    sin: &mut [f32],
) {
    if scale == 1.0 {
        rope_table(pos, base, n_rot, cos, sin);
        return;
    }
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32 * scale;
    for (c, s) in cos.iter_mut().zip(sin.iter_mut()) {
        *c = theta.cos();
        *s = theta.sin();
        theta *= theta_scale;
    }
}
