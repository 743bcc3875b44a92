//! Paged attention: for a query at position `t`, the K and V rows of positions `0..=t`
//! (or the last `window` of them) are read through the sequence's page table, one f16 head
//! at a time, with an online softmax (running max and sum, as flash attention does), so no
//! buffer grows with the context.
//!
//! Grouped-query attention: the `n_head / n_kv_head` query heads of a KV head are one task,
//! so each K and V head is converted from f16 once for all of them. Below 64 query rows
//! (llama.cpp's f16 path) tasks are (batch row, run of KV heads); from there on
//! (`tiled.rs`) they are (tile of one sequence's rows, KV head), a sequence's lone row
//! going the one-row way ([`AttnPath`]).

mod tiled;

use tiled::RowTile;

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::ggml_round;
use super::kernels::{Kernels, prefetch};
use super::matmul::ThreadScratch;
use super::pool::{Pool, PoolPanicked};
use crate::kv::{KV_ELEM_BYTES, KvError, KvPages, Sequence};

/// One layer's attention geometry.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    /// Byte offsets of this layer's K and V in a row.
    pub k_off: usize,
    pub v_off: usize,
    /// Keys with `t - key_pos >= window` are masked (llama.cpp's standard SWA).
    pub window: Option<u32>,
    /// Which of llama.cpp's computations, or den's f32 reference.
    pub path: AttnPath,
}

/// How attention rounds and walks the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnPath {
    /// Every row as llama.cpp's one-row flash attention with an f16 cache
    /// (`heads_f16`): what it runs below 64 query rows.
    OneRow,
    /// llama.cpp's tiled f32 path (`tiled.rs`), which it runs from 64 query rows on; but a
    /// sequence with a single row in the batch (a decode step) still takes the one-row
    /// path. So a decode step's numerics never depend on what it is batched with, and a
    /// lone row is not paid for as a tile (64 decode rows at 1,024 tokens of context cost
    /// about 2× as tiles, `bench_tiled_attention_decode_rows`). A golden check cannot
    /// tell: llama.cpp batches one sequence.
    Tiled,
    /// f32 throughout in tiles, every row (den's exact mode, the reference).
    F32,
}

/// How many keys ahead attention asks for a key's K and V ([`prefetch_ahead`]).
const PREFETCH_KEYS: u32 = 8;

/// The batch size (query rows) from which llama.cpp's CPU flash attention takes its
/// tiled f32 path (`GGML_FA_TILE_Q`).
pub const TILED_FROM_ROWS: usize = 64;

/// A query row: its position and its sequence.
#[derive(Debug, Clone, Copy)]
pub struct Query<'s> {
    pub pos: u32,
    pub seq: &'s Sequence,
}

/// Why attention stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttnError {
    #[error(transparent)]
    Panicked(#[from] PoolPanicked),
    #[error(transparent)]
    Kv(#[from] KvError),
}

/// The first key position a query at `pos` sees.
pub fn first_visible(pos: u32, window: Option<u32>) -> u32 {
    match window {
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    }
}

/// `out[i] = softmax(q[i] · K) · V` per head, for each query row `i`. `q` holds the
/// queries (already scaled), `rows × n_head × head_dim`; `out` the same shape.
#[allow(clippy::too_many_arguments)]
pub fn attention<'s, K: KvPages + Sync>(
    pool: &mut Pool,
    tls: &[Mutex<ThreadScratch>],
    k: Kernels,
    kv: &K,
    rows: usize,
    queries: &(dyn Fn(usize) -> Query<'s> + Sync),
    shape: AttnShape,
    q: &[f32],
    out: &mut [f32],
) -> Result<(), AttnError> {
    let hd = shape.head_dim;
    let n_kv = shape.n_kv.max(1);
    let group = shape.n_head / n_kv;
    let qdim = shape.n_head * hd;
    let threads = pool.threads();
    let one_row = |tile: &RowTile| match shape.path {
        AttnPath::OneRow => true,
        AttnPath::Tiled => tile.lone,
        AttnPath::F32 => false,
    };
    let tiles = tiled::row_tiles(rows, queries, n_kv, threads, shape.path == AttnPath::OneRow);
    // A tile's task takes one KV head. A one-row task takes a run of them, walked together
    // key by key, so each key's row is visited once per run rather than once per head
    // (the row layout puts a key's heads side by side and its next key 23 KB further on
    // for SmolLM2); runs are as long as the threads allow.
    let run = n_kv.div_ceil(threads.div_ceil(rows.max(1)).clamp(1, n_kv));
    let tasks: Vec<(RowTile, Range<usize>)> = tiles
        .iter()
        .flat_map(|tile| {
            let step = if one_row(tile) { run } else { 1 };
            (0..n_kv)
                .step_by(step)
                .map(move |g| (*tile, g..(g + step).min(n_kv)))
        })
        .collect();
    let next = AtomicUsize::new(0);
    let out = Mutex::new(out);
    let failed = Failure::default();
    pool.run(&|thread| {
        let Some(ts) = tls.get(thread) else { return };
        let Ok(mut ts) = ts.lock() else { return };
        let ts = &mut *ts;
        let mut one = Vec::new();
        while let Some((tile, heads)) = tasks.get(next.fetch_add(1, Ordering::Relaxed)) {
            let (tile, heads) = (*tile, heads.clone());
            let done = if one_row(&tile) {
                let len = heads.len() * group * hd;
                let at = tile.first * qdim + heads.start * group * hd;
                one.resize(len, 0.0);
                grow(ts, heads.len(), group, hd);
                let query = queries(tile.first);
                heads_f16(
                    k,
                    kv,
                    &query,
                    shape,
                    heads.clone(),
                    group,
                    &q[at..at + len],
                    ts,
                    &mut one,
                )
                .map(|()| write_out(&out, &shape, tile, heads, &one))
            } else {
                tiled::tile_task(k, kv, queries, shape, tile, heads.start, q, ts)
                    .map(|()| write_out(&out, &shape, tile, heads, &ts.acc))
            };
            failed.record(done);
        }
    })?;
    failed.into_result()
}

/// The scratch [`heads_f16`] needs for `kv_heads` KV heads' `group` query heads each.
fn grow(ts: &mut ThreadScratch, kv_heads: usize, group: usize, hd: usize) {
    let at_least = |v: &mut Vec<f32>, n: usize| {
        if v.len() < n {
            v.resize(n, 0.0);
        }
    };
    let heads = kv_heads * group;
    at_least(&mut ts.head, 2 * kv_heads * hd);
    at_least(&mut ts.qh, heads * hd);
    at_least(&mut ts.acc, heads * hd);
    at_least(&mut ts.max, heads);
    at_least(&mut ts.sum, heads);
}

/// Copies a finished task's rows (`src`, row by row: the query heads of KV heads
/// `kv_heads`) into their places in `out`.
fn write_out(
    out: &Mutex<&mut [f32]>,
    shape: &AttnShape,
    tile: RowTile,
    kv_heads: Range<usize>,
    src: &[f32],
) {
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_kv.max(1);
    let qdim = shape.n_head * hd;
    let len = kv_heads.len() * group * hd;
    let Ok(mut out) = out.lock() else { return };
    for r in 0..tile.len {
        let at = (tile.first + r) * qdim + kv_heads.start * group * hd;
        out[at..at + len].copy_from_slice(&src[r * len..(r + 1) * len]);
    }
}

/// The first KV error any task of a call met (the call's other tasks run on).
#[derive(Default)]
struct Failure(Mutex<Option<KvError>>);

impl Failure {
    fn record(&self, done: Result<(), KvError>) {
        if let Err(e) = done
            && let Ok(mut f) = self.0.lock()
        {
            f.get_or_insert(e);
        }
    }

    fn into_result(self) -> Result<(), AttnError> {
        match self.0.into_inner().ok().flatten() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// Attention as `ggml_compute_forward_flash_attn_ext_f16_one_chunk` computes it, for
/// the query heads of KV heads `kv_heads` together: each query head rounded to f16; per
/// key in position order (the run's K and V heads converted from one read of the row)
/// the score (ggml's f16 dot order), a new maximum rescales that head's f16 accumulator,
/// `V × e^(s - max)` is added with one rounding to f16, and the sum is updated by one
/// FMA. Each head's arithmetic is its own, so walking several at once changes no bit:
/// llama.cpp's on an AVX-512 build.
#[allow(clippy::too_many_arguments)]
fn heads_f16<K: KvPages>(
    k: Kernels,
    kv: &K,
    query: &Query<'_>,
    shape: AttnShape,
    kv_heads: Range<usize>,
    group: usize,
    qs: &[f32],
    ts: &mut ThreadScratch,
    out: &mut [f32],
) -> Result<(), KvError> {
    let hd = shape.head_dim;
    let n = kv_heads.len();
    let heads = n * group;
    let run_bytes = n * hd * KV_ELEM_BYTES;
    let head_bytes = hd * KV_ELEM_BYTES;
    let k_at = shape.k_off + kv_heads.start * head_bytes;
    let v_at = shape.v_off + kv_heads.start * head_bytes;
    ts.qh[..heads * hd].copy_from_slice(&qs[..heads * hd]);
    ggml_round::round_f16(k, &mut ts.qh[..heads * hd]);
    ts.max[..heads].fill(f32::NEG_INFINITY);
    ts.sum[..heads].fill(0.0);
    ts.acc[..heads * hd].fill(0.0);
    for t in first_visible(query.pos, shape.window)..=query.pos {
        prefetch_ahead(kv, query.seq, t, query.pos, [k_at, v_at], run_bytes);
        let (kb, vb) = key_runs(kv, query.seq, t, [k_at, v_at], run_bytes)?;
        let (kf, vf) = ts.head.split_at_mut(n * hd);
        k.f16_to_f32(kb, kf);
        k.f16_to_f32(vb, &mut vf[..n * hd]);
        for h in 0..heads {
            let g = h / group;
            let kg = &kf[g * hd..(g + 1) * hd];
            let vg = &vf[g * hd..(g + 1) * hd];
            let s = ggml_round::dot_f16(k, &ts.qh[h * hd..(h + 1) * hd], kg);
            let acc = &mut ts.acc[h * hd..(h + 1) * hd];
            let (ms, vs) = if s > ts.max[h] {
                let ms = (ts.max[h] - s).exp();
                ts.max[h] = s;
                ggml_round::scale_f16(k, ms, acc);
                (ms, 1.0)
            } else {
                (1.0, (s - ts.max[h]).exp())
            };
            ggml_round::axpy_f16(k, vs, vg, acc);
            ts.sum[h] = ts.sum[h].mul_add(ms, vs);
        }
    }
    normalise(ts, heads, hd, out);
    Ok(())
}

/// Asks for the K and V bytes (`len` from each of `at`) of the key [`PREFETCH_KEYS`] after
/// `t`, if it is at most `last`: keys lie a row apart (23 KB for SmolLM2), a stride the
/// hardware prefetchers do not follow.
/// Key `t`'s K and V bytes (`len` each, at `at[0]` and `at[1]` of its row).
fn key_runs<'k, K: KvPages>(
    kv: &'k K,
    seq: &Sequence,
    t: u32,
    at: [usize; 2],
    len: usize,
) -> Result<(&'k [u8], &'k [u8]), KvError> {
    let (page, slot) = seq.locate_or_err(t, kv.page_size())?;
    let r = kv.row(page, slot).ok_or(KvError::NoRow { page, slot })?;
    let size = || KvError::RowSize {
        got: r.len(),
        expected: at[0].max(at[1]) + len,
    };
    let kb = r.get(at[0]..at[0] + len).ok_or_else(size)?;
    let vb = r.get(at[1]..at[1] + len).ok_or_else(size)?;
    Ok((kb, vb))
}

fn prefetch_ahead<K: KvPages>(
    kv: &K,
    seq: &Sequence,
    t: u32,
    last: u32,
    at: [usize; 2],
    len: usize,
) {
    let ahead = t + PREFETCH_KEYS;
    if ahead > last {
        return;
    }
    if let Some(r) = seq
        .locate(ahead, kv.page_size())
        .and_then(|(page, slot)| kv.row(page, slot))
    {
        for a in at {
            prefetch(r.get(a..a + len).unwrap_or_default());
        }
    }
}

/// `out = acc / sum` per head.
fn normalise(ts: &ThreadScratch, group: usize, hd: usize, out: &mut [f32]) {
    for h in 0..group {
        let inv = if ts.sum[h] > 0.0 {
            1.0 / ts.sum[h]
        } else {
            0.0
        };
        for (o, a) in out[h * hd..(h + 1) * hd]
            .iter_mut()
            .zip(&ts.acc[h * hd..(h + 1) * hd])
        {
            *o = a * inv;
        }
    }
}
