//! Attention in f32 tiles, as llama.cpp's CPU flash attention computes 64 query rows and
//! more (`ggml_compute_forward_flash_attn_ext_tiled`), over den's paged rows.
//!
//! A task is a tile of query rows of one sequence and one KV head. It walks the keys in
//! tiles of [`KV_TILE`] positions aligned to position 0, converting each tile's K
//! (transposed) and V from f16 once for all the task's query heads; the scores are one
//! small matrix product, the online softmax runs per query head, and V is summed by a
//! second product. Keys a query must not see are masked to -inf, so they add exactly
//! nothing. A query head's arithmetic depends only on its own position and the absolute
//! key tiles, never on the rows it shares a task with: how rows fall into tiles (batch
//! composition, thread count) changes no bit. With `AttnPath::Tiled` a sequence with a
//! single row in the batch (a decode step) is not a tile: it takes the one-row path
//! (`super::heads_f16`), as it would in a smaller batch.
//!
//! Before this path each (row, KV head) walked every key alone, converting K and V per
//! row and scoring by one dot product at a time: 62 tokens/s of prefill at 2,048 tokens
//! of context on SmolLM2 against llama.cpp's 120 (BENCHMARKS.md).

use super::{AttnShape, Query, first_visible, key_runs, prefetch_ahead};
use crate::kv::{KV_ELEM_BYTES, KvError, KvPages};
use crate::ops::ggml_round;
use crate::ops::kernels::Kernels;
use crate::ops::matmul::ThreadScratch;

/// Key positions per tile (`GGML_FA_TILE_KV`).
const KV_TILE: usize = 64;
/// The most query rows a task takes (`GGML_FA_TILE_Q`).
const Q_TILE: usize = 64;

/// Rows `first..first + len` of the batch: one sequence's.
#[derive(Debug, Clone, Copy)]
pub(super) struct RowTile {
    pub(super) first: usize,
    pub(super) len: usize,
    /// The sequence has this one row in the batch (a decode step): with
    /// `AttnPath::Tiled` it takes the one-row path.
    pub(super) lone: bool,
}

/// The batch's rows cut into tiles: each run of consecutive rows of one sequence in
/// pieces of at most `size` rows (one with `single`: the one-row path's tasks). With
/// several threads and few tasks the tiles shrink so every thread has work.
pub(super) fn row_tiles<'s>(
    rows: usize,
    queries: &(dyn Fn(usize) -> Query<'s> + Sync),
    n_kv: usize,
    threads: usize,
    single: bool,
) -> Vec<RowTile> {
    let size = if single {
        1
    } else if threads > 1 {
        (rows * n_kv / (4 * threads)).clamp(8, Q_TILE)
    } else {
        Q_TILE
    };
    let mut tiles: Vec<RowTile> = Vec::new();
    let mut first = 0;
    while first < rows {
        let seq = queries(first).seq;
        let mut end = first + 1;
        while end < rows && std::ptr::eq(queries(end).seq, seq) {
            end += 1;
        }
        let lone = end - first == 1;
        let mut at = first;
        while at < end {
            let len = (end - at).min(size);
            tiles.push(RowTile {
                first: at,
                len,
                lone,
            });
            at += len;
        }
        first = end;
    }
    tiles
}

/// One task: the query heads of KV head `g` for the rows of `tile`; their normalised
/// outputs are left in `ts.acc`, row by row.
#[allow(clippy::too_many_arguments)]
pub(super) fn tile_task<'s, K: KvPages>(
    k: Kernels,
    kv: &K,
    queries: &(dyn Fn(usize) -> Query<'s> + Sync),
    shape: AttnShape,
    tile: RowTile,
    g: usize,
    q: &[f32],
    ts: &mut ThreadScratch,
) -> Result<(), KvError> {
    let hd = shape.head_dim;
    let n_kv = shape.n_kv.max(1);
    let group = shape.n_head / n_kv;
    let qdim = shape.n_head * hd;
    let heads = tile.len * group;
    let head_bytes = hd * KV_ELEM_BYTES;
    let k_at = shape.k_off + g * head_bytes;
    let v_at = shape.v_off + g * head_bytes;

    ts.qh.resize(heads * hd, 0.0);
    ts.scores.resize(heads * KV_TILE, 0.0);
    ts.acc.resize(heads * hd, 0.0);
    ts.max.resize(heads, 0.0);
    ts.sum.resize(heads, 0.0);
    ts.head.resize(2 * KV_TILE * hd + hd, 0.0);
    for r in 0..tile.len {
        let at = (tile.first + r) * qdim + g * group * hd;
        ts.qh[r * group * hd..(r + 1) * group * hd].copy_from_slice(&q[at..at + group * hd]);
    }
    ts.acc[..heads * hd].fill(0.0);
    ts.max[..heads].fill(f32::NEG_INFINITY);
    ts.sum[..heads].fill(0.0);

    let seq = queries(tile.first).seq;
    let span = |r: usize| {
        let pos = queries(tile.first + r).pos;
        (first_visible(pos, shape.window), pos)
    };
    let (mut lo, mut hi) = (u32::MAX, 0);
    for r in 0..tile.len {
        let (a, b) = span(r);
        lo = lo.min(a);
        hi = hi.max(b);
    }
    let mut c0 = lo as usize / KV_TILE * KV_TILE;
    while c0 <= hi as usize {
        let kt = (hi as usize + 1 - c0).min(KV_TILE);
        // K transposed (hd × KV_TILE) and V (KV_TILE × hd), zero past the last key.
        let (kt_buf, rest) = ts.head.split_at_mut(KV_TILE * hd);
        let (v_buf, one) = rest.split_at_mut(KV_TILE * hd);
        if kt < KV_TILE {
            kt_buf.fill(0.0);
            v_buf[kt * hd..].fill(0.0);
        }
        for tk in 0..kt {
            prefetch_ahead(kv, seq, (c0 + tk) as u32, hi, [k_at, v_at], head_bytes);
            let (kb, vb) = key_runs(kv, seq, (c0 + tk) as u32, [k_at, v_at], head_bytes)?;
            k.f16_to_f32(kb, &mut one[..hd]);
            for (d, x) in one[..hd].iter().enumerate() {
                kt_buf[d * KV_TILE + tk] = *x;
            }
            k.f16_to_f32(vb, &mut v_buf[tk * hd..(tk + 1) * hd]);
        }
        let scores = &mut ts.scores[..heads * KV_TILE];
        scores.fill(0.0);
        k.gemm_acc(scores, &ts.qh[..heads * hd], kt_buf, heads, hd, KV_TILE);
        for r in 0..tile.len {
            let (a, b) = span(r);
            // This row's visible keys within the tile, as offsets in it.
            let from = (a as usize).saturating_sub(c0).min(KV_TILE);
            let to = (b as usize + 1).saturating_sub(c0).min(kt);
            for h in r * group..(r + 1) * group {
                let row = &mut scores[h * KV_TILE..(h + 1) * KV_TILE];
                if from >= to {
                    row.fill(0.0);
                    continue;
                }
                row[..from].fill(f32::NEG_INFINITY);
                row[to..].fill(f32::NEG_INFINITY);
                let tile_max = row[from..to]
                    .iter()
                    .fold(f32::NEG_INFINITY, |m, v| m.max(*v));
                let m_old = ts.max[h];
                let m_new = m_old.max(tile_max);
                if m_new > m_old {
                    let ms = (m_old - m_new).exp();
                    for x in &mut ts.acc[h * hd..(h + 1) * hd] {
                        *x *= ms;
                    }
                    ts.sum[h] *= ms;
                }
                ts.max[h] = m_new;
                ts.sum[h] += ggml_round::soft_max(k, row, m_new) as f32;
            }
        }
        k.gemm_acc(&mut ts.acc[..heads * hd], scores, v_buf, heads, KV_TILE, hd);
        c0 += KV_TILE;
    }
    for h in 0..heads {
        let inv = if ts.sum[h] > 0.0 {
            1.0 / ts.sum[h]
        } else {
            0.0
        };
        for x in &mut ts.acc[h * hd..(h + 1) * hd] {
            *x *= inv;
        }
    }
    Ok(())
}
