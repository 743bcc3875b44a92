//! Matrix products with weights left encoded in the file: `y[i][j] = W[j] · x[i]` for every
//! activation row `i` of a batch and weight row `j`, multithreaded over weight rows.
//!
//! Each weight row is read once per call and multiplied with every row of the batch (AVX2:
//! [`Kernels::dot_matrix`], decoding each block in registers for four activation rows at a
//! time; portable: [`Kernels::unpack`] then dots; [`MatmulMode::Exact`]: dequantized to
//! f32), so a prefill chunk of R tokens reads the weights once, not R times. Threads take chunks of weight rows from a
//! shared iterator (a machine shared with other work still keeps both threads busy) and
//! write them to a column-major buffer, whose chunks are disjoint `&mut` slices; the
//! caller's row-major outputs are filled from it afterwards. The value of `y[i][j]` does
//! not depend on the batch's other rows or on the thread count: a prompt computed in one
//! prefill or token by token gets the same bits.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::kernels::{Kernels, Q8Rows, Unpacked, has_q8_dot};
use super::math::Activation;
use super::pool::{Pool, PoolPanicked};
use crate::ggml_type::GgmlType;
use crate::quant;

/// How matrix products are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatmulMode {
    /// Activations quantized to 8-bit blocks and integer dots with the quantized weights
    /// (llama.cpp's way; the default). F32/F16/BF16 weights are multiplied in f32. The rest
    /// of the forward pass rounds where llama.cpp's CPU backend does
    /// ([`super::ggml_round`]).
    #[default]
    Quantized,
    /// Each weight row dequantized to f32 (bit-exact with ggml) and an f32 dot with the f32
    /// activations, and plain f32 everywhere else: slower, the reference that tests
    /// compare against.
    Exact,
}

/// A weight matrix as encoded in the file: `rows` rows of `cols` elements (GGUF dims
/// `[cols, rows]`).
#[derive(Debug, Clone, Copy)]
pub struct Weight<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    pub data: &'a [u8],
}

impl<'a> Weight<'a> {
    /// Row `j`'s encoded bytes (`j < rows`, `data` whole rows: checked when loaded).
    pub fn row(&self, j: usize) -> &'a [u8] {
        self.data
            .get(j * self.row_bytes..(j + 1) * self.row_bytes)
            .unwrap_or_default()
    }

    /// Whether this weight uses the quantized dot in `mode`.
    pub fn uses_q8(&self, mode: MatmulMode) -> bool {
        mode == MatmulMode::Quantized && has_q8_dot(self.ty)
    }
}

/// One thread's buffers, reused across calls.
#[derive(Debug, Default)]
pub struct ThreadScratch {
    pub unpacked: Unpacked,
    pub wrow: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// Attention: one K or V head, scores, running max and sum, accumulators.
    pub head: Vec<f32>,
    pub scores: Vec<f32>,
    pub max: Vec<f32>,
    pub sum: Vec<f32>,
    pub acc: Vec<f32>,
    /// Attention: query heads rounded to f16.
    pub qh: Vec<f32>,
}

/// A matmul's input: `rows` rows of `n` f32s, and their Q8 quantization when any weight
/// uses it.
#[derive(Debug, Clone, Copy)]
pub struct Input<'x> {
    pub x: &'x [f32],
    pub q8: &'x Q8Rows,
    pub rows: usize,
    pub n: usize,
}

/// What the workers share for one call.
pub struct Ctx<'p> {
    pub pool: &'p mut Pool,
    pub tls: &'p [Mutex<ThreadScratch>],
    pub kernels: Kernels,
    pub mode: MatmulMode,
}

/// Columns (weight rows) per chunk a thread takes at once.
fn chunk_columns(columns: usize, threads: usize) -> usize {
    columns.div_ceil(threads * 16).clamp(1, 256)
}

/// Computes `input.rows` dots of weight row `j` of `w` into `out`.
fn column(
    k: Kernels,
    mode: MatmulMode,
    w: &Weight<'_>,
    j: usize,
    input: &Input<'_>,
    ts: &mut ThreadScratch,
    out: &mut [f32],
) -> bool {
    let bytes = w.row(j);
    if w.uses_q8(mode) && k.is_fused() && k.dot_rows(w.ty, bytes, input.q8, input.rows, out) {
        return true;
    }
    if w.uses_q8(mode) && k.unpack(w.ty, bytes, &mut ts.unpacked) {
        for (i, y) in out.iter_mut().enumerate().take(input.rows) {
            let (q, d, s) = input.q8.row(i);
            *y = k.dot_q8(&ts.unpacked, q, d, s);
        }
        return true;
    }
    if ts.wrow.len() < w.cols {
        ts.wrow.resize(w.cols, 0.0);
    }
    let wrow = &mut ts.wrow[..w.cols];
    if quant::dequantize(w.ty, bytes, w.cols, wrow).is_err() {
        return false;
    }
    for (i, y) in out.iter_mut().enumerate().take(input.rows) {
        *y = k.dot_f32(wrow, &input.x[i * input.n..(i + 1) * input.n]);
    }
    true
}

/// Weight rows `j0..j0 + out.len() / rows` of `w` into `out`, column-major.
#[allow(clippy::too_many_arguments)]
fn column_run(
    k: Kernels,
    mode: MatmulMode,
    w: &Weight<'_>,
    j0: usize,
    input: &Input<'_>,
    ts: &mut ThreadScratch,
    out: &mut [f32],
) -> bool {
    let r = input.rows.max(1);
    let n = out.len() / r;
    if w.uses_q8(mode)
        && k.is_fused()
        && let Some(bytes) = w.data.get(j0 * w.row_bytes..(j0 + n) * w.row_bytes)
        && k.dot_matrix(w.ty, bytes, w.row_bytes, input.q8, input.rows, out)
    {
        return true;
    }
    out.chunks_mut(r)
        .enumerate()
        .all(|(c, out)| column(k, mode, w, j0 + c, input, ts, out))
}

/// A matmul failed: a thread panicked, or a weight row did not decode (checked at load,
/// so neither happens).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatmulError {
    #[error(transparent)]
    Panicked(#[from] PoolPanicked),
    #[error("tensor {0:?}: a row failed to dequantize")]
    Decode(String),
}

/// `outs[s] = segs[s] · input` for each segment (all of width `input.n`): the
/// concatenation of the segments' rows is split among the threads, so one call computes,
/// say, Q, K and V. `outs[s]` is `input.rows × segs[s].rows`, row-major. `t` is scratch.
pub fn matmul(
    cx: &mut Ctx<'_>,
    input: &Input<'_>,
    segs: &[Weight<'_>],
    outs: &mut [&mut [f32]],
    t: &mut Vec<f32>,
) -> Result<(), MatmulError> {
    let r = input.rows;
    let columns: usize = segs.iter().map(|w| w.rows).sum();
    if t.len() < columns * r {
        t.resize(columns * r, 0.0);
    }
    let cs = chunk_columns(columns, cx.pool.threads());
    let chunks = Mutex::new(t[..columns * r].chunks_mut(cs * r).enumerate());
    let failed: Mutex<Option<String>> = Mutex::new(None);
    let (k, mode, tls) = (cx.kernels, cx.mode, cx.tls);
    cx.pool.run(&|thread| {
        let Some(ts) = tls.get(thread) else { return };
        let Ok(mut ts) = ts.lock() else { return };
        loop {
            let next = chunks.lock().ok().and_then(|mut c| c.next());
            let Some((ci, chunk)) = next else { break };
            // The chunk's columns, split where a segment ends.
            let (mut g, mut rest) = (ci * cs, chunk);
            while !rest.is_empty() {
                let mut j = g;
                let mut seg = None;
                for w in segs {
                    if j < w.rows {
                        seg = Some(w);
                        break;
                    }
                    j -= w.rows;
                }
                let Some(w) = seg else { break };
                let n = (w.rows - j).min(rest.len() / r);
                let (now, later) = rest.split_at_mut(n * r);
                if !column_run(k, mode, w, j, input, &mut ts, now)
                    && let Ok(mut f) = failed.lock()
                {
                    *f = Some(w.name.to_owned());
                }
                g += n;
                rest = later;
            }
        }
    })?;
    if let Some(name) = failed.into_inner().ok().flatten() {
        return Err(MatmulError::Decode(name));
    }
    let mut off = 0;
    for (w, out) in segs.iter().zip(outs.iter_mut()) {
        scatter(&t[off * r..(off + w.rows) * r], r, w.rows, out);
        off += w.rows;
    }
    Ok(())
}

/// `out = act(gate · input) × (up · input)`, elementwise (a gated FFN's first half).
pub fn matmul_glu(
    cx: &mut Ctx<'_>,
    input: &Input<'_>,
    gate: &Weight<'_>,
    up: &Weight<'_>,
    act: Activation,
    out: &mut [f32],
    t: &mut Vec<f32>,
) -> Result<(), MatmulError> {
    let r = input.rows;
    let columns = gate.rows;
    if t.len() < columns * r {
        t.resize(columns * r, 0.0);
    }
    let cs = chunk_columns(columns, cx.pool.threads());
    let chunks = Mutex::new(t[..columns * r].chunks_mut(cs * r).enumerate());
    let failed = AtomicBool::new(false);
    let (k, mode, tls) = (cx.kernels, cx.mode, cx.tls);
    cx.pool.run(&|thread| {
        let Some(ts) = tls.get(thread) else { return };
        let Ok(mut ts) = ts.lock() else { return };
        let ts = &mut *ts;
        if ts.gate.len() < cs * r {
            ts.gate.resize(cs * r, 0.0);
            ts.up.resize(cs * r, 0.0);
        }
        let mut g = std::mem::take(&mut ts.gate);
        let mut u = std::mem::take(&mut ts.up);
        loop {
            let next = chunks.lock().ok().and_then(|mut c| c.next());
            let Some((ci, chunk)) = next else { break };
            let len = chunk.len();
            let ok = column_run(k, mode, gate, ci * cs, input, ts, &mut g[..len])
                && column_run(k, mode, up, ci * cs, input, ts, &mut u[..len]);
            if !ok {
                failed.store(true, Ordering::Relaxed);
            }
            if mode == MatmulMode::Quantized {
                super::ggml_round::glu(k, act, &g[..len], &u[..len], chunk);
            } else {
                for ((y, g), u) in chunk.iter_mut().zip(&g[..len]).zip(&u[..len]) {
                    *y = act.apply(*g) * u;
                }
            }
        }
        ts.gate = g;
        ts.up = u;
    })?;
    if failed.load(Ordering::Relaxed) {
        return Err(MatmulError::Decode(gate.name.to_owned()));
    }
    scatter(&t[..columns * r], r, columns, out);
    Ok(())
}

/// Column-major `t` (`cols` columns of `rows`) into row-major `out`.
fn scatter(t: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    if rows == 1 {
        out[..cols].copy_from_slice(&t[..cols]);
        return;
    }
    // In bands of 8 rows: 8 output rows fill in step, each a cache line at a time,
    // where a whole column at once would touch `rows` lines per column. Not 16: rows
    // `cols` floats apart (8 KiB for Gemma 3's 2,048) fall in one L1 set, and 16 lines
    // of one set overflow its 12 ways (measured on a Gemma 3 prefill: a whole column
    // 5 %, bands of 16 rows under 1 % at first and 6 % after the products got faster,
    // bands of 8 rows 2 %).
    const BAND: usize = 8;
    for i0 in (0..rows).step_by(BAND) {
        let i1 = (i0 + BAND).min(rows);
        let band = &mut out[i0 * cols..i1 * cols];
        for (j, col) in t.chunks_exact(rows).enumerate().take(cols) {
            for (k, v) in col[i0..i1].iter().enumerate() {
                band[k * cols + j] = *v;
            }
        }
    }
}
