//! Paged attention: for a query at position `t`, the K and V rows of positions `0..=t`
//! (or the last `window` of them) are read through the sequence's page table, one f16 head
//! at a time, with an online softmax (running max and sum, as flash attention does), so no
//! buffer grows with the context.
//!
//! Grouped-query attention: the `n_head / n_kv_head` query heads of a KV head are one task,
//! so each K and V head is converted from f16 once for all of them. Tasks are (batch row,
//! KV head) pairs, spread over the threads.

use std::sync::Mutex;

use super::kernels::Kernels;
use super::matmul::ThreadScratch;
use super::pool::{Pool, PoolPanicked};
use crate::kv::{KV_ELEM_BYTES, KvError, KvPages, Sequence};

/// Positions scored per step of the online softmax.
const STEP: usize = 64;

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
}

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
    let group = shape.n_head / shape.n_kv.max(1);
    let qdim = shape.n_head * hd;
    let tasks = Mutex::new(out[..rows * qdim].chunks_mut(group * hd).enumerate());
    let failed: Mutex<Option<KvError>> = Mutex::new(None);
    pool.run(&|thread| {
        let Some(ts) = tls.get(thread) else { return };
        let Ok(mut ts) = ts.lock() else { return };
        let ts = &mut *ts;
        ts.head.resize(hd, 0.0);
        ts.scores.resize(group * STEP, 0.0);
        ts.max.resize(group, 0.0);
        ts.sum.resize(group, 0.0);
        ts.acc.resize(group * hd, 0.0);
        loop {
            let next = tasks.lock().ok().and_then(|mut t| t.next());
            let Some((task, out)) = next else { break };
            let (i, g) = (task / shape.n_kv, task % shape.n_kv);
            if i >= rows {
                break;
            }
            let query = queries(i);
            let qs = &q[i * qdim + g * group * hd..i * qdim + (g + 1) * group * hd];
            if let Err(e) = head_group(k, kv, &query, shape, g, group, qs, ts, out)
                && let Ok(mut f) = failed.lock()
            {
                *f = Some(e);
            }
        }
    })?;
    if let Some(e) = failed.into_inner().ok().flatten() {
        return Err(e.into());
    }
    Ok(())
}

/// One (query row, KV head) task: the `group` query heads `qs` of KV head `g`.
#[allow(clippy::too_many_arguments)]
fn head_group<K: KvPages>(
    k: Kernels,
    kv: &K,
    query: &Query<'_>,
    shape: AttnShape,
    g: usize,
    group: usize,
    qs: &[f32],
    ts: &mut ThreadScratch,
    out: &mut [f32],
) -> Result<(), KvError> {
    let hd = shape.head_dim;
    let ps = kv.page_size();
    let head_bytes = hd * KV_ELEM_BYTES;
    let k_at = shape.k_off + g * head_bytes;
    let v_at = shape.v_off + g * head_bytes;
    ts.max[..group].fill(f32::NEG_INFINITY);
    ts.sum[..group].fill(0.0);
    ts.acc[..group * hd].fill(0.0);
    let row = |t: u32| -> Result<&[u8], KvError> {
        let (page, slot) = query.seq.locate_or_err(t, ps)?;
        kv.row(page, slot).ok_or(KvError::NoRow { page, slot })
    };
    let lo = first_visible(query.pos, shape.window);
    let mut t0 = lo;
    while t0 <= query.pos {
        let n = ((query.pos - t0) as usize + 1).min(STEP);
        // Scores of this step, per head.
        for s in 0..n {
            let r = row(t0 + s as u32)?;
            let kh = r.get(k_at..k_at + head_bytes).ok_or(KvError::RowSize {
                got: r.len(),
                expected: k_at + head_bytes,
            })?;
            k.f16_to_f32(kh, &mut ts.head[..hd]);
            for h in 0..group {
                ts.scores[h * STEP + s] = k.dot_f32(&qs[h * hd..(h + 1) * hd], &ts.head[..hd]);
            }
        }
        // Online softmax update.
        for h in 0..group {
            let sc = &mut ts.scores[h * STEP..h * STEP + n];
            let m_new = sc.iter().fold(ts.max[h], |m, v| m.max(*v));
            let rescale = (ts.max[h] - m_new).exp();
            if rescale != 1.0 {
                ts.sum[h] *= rescale;
                for a in &mut ts.acc[h * hd..(h + 1) * hd] {
                    *a *= rescale;
                }
            }
            let mut add = 0.0f32;
            for v in sc.iter_mut() {
                *v = (*v - m_new).exp();
                add += *v;
            }
            ts.sum[h] += add;
            ts.max[h] = m_new;
        }
        for s in 0..n {
            let r = row(t0 + s as u32)?;
            let vh = r.get(v_at..v_at + head_bytes).ok_or(KvError::RowSize {
                got: r.len(),
                expected: v_at + head_bytes,
            })?;
            k.f16_to_f32(vh, &mut ts.head[..hd]);
            for h in 0..group {
                let p = ts.scores[h * STEP + s];
                k.axpy(p, &ts.head[..hd], &mut ts.acc[h * hd..(h + 1) * hd]);
            }
        }
        t0 += n as u32;
    }
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
    Ok(())
}
