//! Candidate generation from live observations and the chunk catalog (spec §6.1): the
//! alternatives of one request; [`crate::candidate`] estimates and ranks them.
//!
//! For one request and every live worker this builds the alternatives the router ranks:
//! recompute (tier `none`), one GPU alternative per planned chunk boundary the worker
//! advertises as resident, and one durable alternative per boundary of the longest
//! root-contiguous run of catalogued chunks the worker can load (from its own RAM/SSD
//! replicas, or from the object store). The lowest predicted TTFT wins later, not the
//! longest prefix, so every boundary is offered.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::HashMap;

use crate::candidate::{Candidate, Tier};
use crate::chunk::{ChunkDescriptor, PrefixHash, RESTORE_FETCH_WINDOW, plan_chunks};
use crate::chunk_catalog::{ChunkCatalog, ChunkEntry};
use crate::engine_plan::{EnginePlan, price, replay};
use crate::ids::{ModelFingerprint, RouteId};
use crate::observation::{GpuPrefix, Observation};
use crate::request::GenerationRequest;

/// Build every candidate for `request` from `observations` and `catalog`.
///
/// Offline workers and workers without the model still yield their alternatives (marked
/// offline / model-not-loaded) so the decision record can say why they were passed over;
/// ranking drops them.
pub fn candidates_for<'a>(
    request: &GenerationRequest,
    chunk_size: u32,
    observations: impl IntoIterator<Item = &'a Observation>,
    catalog: &ChunkCatalog,
) -> Vec<Candidate> {
    let plan = plan_chunks(request.processed_tokens(), chunk_size);
    let run = catalog.matched_run(&request.model, &plan);
    // Built on the first worker that advertises resident prefixes, once per request.
    let by_hash = OnceCell::new();
    let mut out = Vec::new();
    for obs in observations {
        let mut mine = worker_candidates(request, &plan, &by_hash, &run, obs, catalog);
        if let Some(engine) = &obs.engine {
            price_all(engine, request, &mut mine);
        }
        out.extend(mine);
    }
    out
}

/// Prices one worker's candidates against the engine plan it reports: its queue is the
/// replayed wait, its imposed delay what it adds to the worker's pending requests, and
/// its own prefill the plan's cost of the missing tokens (so the estimate is the
/// replayed finish whenever waiting, not the prefix load, comes first).
pub fn price_all(engine: &EnginePlan, request: &GenerationRequest, candidates: &mut [Candidate]) {
    let input = u32::try_from(request.tokens.len()).unwrap_or(u32::MAX);
    price_shape(engine, input, request.processed(), candidates);
}

/// [`price_all`] for a request shape: `input` prompt tokens, `processed` of them with
/// KV before the first token (the fleet simulator prices its requests with it).
pub fn price_shape(engine: &EnginePlan, input: u32, processed: u32, candidates: &mut [Candidate]) {
    let without = replay(engine, None).total_ms();
    for c in candidates.iter_mut().filter(|c| c.online && c.model_loaded) {
        let missing = processed.saturating_sub(c.cached_token_count);
        if missing > 0 {
            c.prefill_ms_per_token =
                engine.solo_ms(c.cached_token_count, input) / f64::from(missing);
        }
        price(engine, without, c, input, processed);
    }
}

fn worker_candidates(
    request: &GenerationRequest,
    plan: &[ChunkDescriptor],
    by_hash: &OnceCell<HashMap<PrefixHash, usize>>,
    run: &[(&ChunkDescriptor, &ChunkEntry)],
    obs: &Observation,
    catalog: &ChunkCatalog,
) -> Vec<Candidate> {
    let base = base_candidate(request, obs);
    if !base.model_loaded || !base.online {
        return vec![base];
    }
    // GPU residency is purely an observation: no catalog entry needed.
    let resident = resident_prefixes(request, plan, by_hash, &obs.gpu_prefixes);
    // The catalogued run from a chunk start, while this worker can load each chunk: from
    // the root it is the request's (matched once for every worker).
    let chunks_from = |start: u32| {
        let run: Cow<'_, [(&ChunkDescriptor, &ChunkEntry)]> = if start == 0 {
            Cow::Borrowed(run)
        } else {
            let from = plan.iter().position(|d| d.start == start);
            Cow::Owned(
                from.and_then(|i| plan.get(i..))
                    .map(|rest| catalog.matched_run(&request.model, rest))
                    .unwrap_or_default(),
            )
        };
        (0..run.len()).map_while(move |i| {
            let (d, entry) = *run.get(i)?;
            let (tier, fixed_ms, load_ms) = fastest_source(obs, catalog, &request.model, entry)?;
            Some(DurableChunk {
                end_tokens: d.end(),
                bytes: entry.bytes,
                tier,
                fixed_ms,
                load_ms,
                backlog_ms: obs.link_backlog_ms.get(&tier).copied().unwrap_or(0.0),
            })
        })
    };
    let rate = obs.gpu_restore_bytes_per_ms;
    let pcie_backlog = obs.link_backlog_ms.get(&Tier::Gpu).copied().unwrap_or(0.0);
    // The upload waits for the copies booked ahead of it, but those drain while its own
    // bytes are still being fetched: only what is left of the backlog then delays it.
    alternatives(base, resident, chunks_from, |bytes, load_ms| {
        (pcie_backlog - load_ms).max(0.0) + bytes as f64 / rate
    })
}

/// The planned boundaries `advertised` holds, in plan order, each with the first
/// advertisement of exactly that boundary (model, hash and length). One pass over the
/// advertisements: a worker with a large pool advertises thousands of boundaries, and
/// a lookup per planned chunk made candidate building quadratic in them.
fn resident_prefixes(
    request: &GenerationRequest,
    plan: &[ChunkDescriptor],
    by_hash: &OnceCell<HashMap<PrefixHash, usize>>,
    advertised: &[GpuPrefix],
) -> Vec<ResidentPrefix> {
    if advertised.is_empty() {
        return Vec::new();
    }
    let by_hash =
        by_hash.get_or_init(|| plan.iter().enumerate().map(|(i, d)| (d.hash, i)).collect());
    let mut found: Vec<Option<&GpuPrefix>> = vec![None; plan.len()];
    for p in advertised {
        let Some(&i) = by_hash.get(&p.prefix_hash) else {
            continue;
        };
        if let (Some(slot @ None), Some(d)) = (found.get_mut(i), plan.get(i))
            && p.token_count == d.end()
            && p.model == request.model
        {
            *slot = Some(p);
        }
    }
    plan.iter()
        .zip(found)
        .filter_map(|(d, p)| {
            let p = p?;
            Some(ResidentPrefix {
                end_tokens: d.end(),
                bytes: p.bytes,
                continuation_id: Some(p.continuation_id.clone()),
            })
        })
        .collect()
}

/// A prefix boundary whose KV is resident in a worker's GPU pool.
#[derive(Debug, Clone, PartialEq)]
pub struct ResidentPrefix {
    /// Prompt tokens up to the boundary.
    pub end_tokens: u32,
    pub bytes: u64,
    /// The resident route holding it, when the worker names one.
    pub continuation_id: Option<RouteId>,
}

/// One chunk of the root-contiguous prefix a worker can restore from a lower tier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DurableChunk {
    /// Prompt tokens up to the end of this chunk.
    pub end_tokens: u32,
    pub bytes: u64,
    /// The tier it loads from (its fastest source).
    pub tier: Tier,
    /// A fetch's latency from `tier`, ms (the worker's reported `tier_fixed_ms`). The
    /// worker keeps [`RESTORE_FETCH_WINDOW`] fetches of a restore in flight, so a walk pays
    /// it once before the bytes stream, or once per window when latency dominates.
    pub fixed_ms: f64,
    /// What streaming this chunk's bytes into host RAM adds, ms (0 from RAM).
    pub load_ms: f64,
    /// Transfers already booked on `tier`'s link that this load waits behind, ms (the
    /// worker's reported `link_backlog_ms`).
    pub backlog_ms: f64,
}

/// One worker's alternatives for a request (spec §6.1), the one builder the router and
/// the fleet simulator share: recompute (`base`); one per resident boundary; one per
/// boundary of the lower-tier chunks `chunks_from(0)` yields, restored whole; and one per
/// boundary of those `chunks_from(end)` yields after the deepest resident boundary — the
/// resident head forked as it is, only the tail restored. `chunks_from(start)` gives the
/// worker's loadable chunks from that chunk start, in order, until the first it cannot
/// load. Bytes and load accumulate along a walk, labelled by its slowest tier, the GPU
/// upload priced by `restore_ms(bytes, load_ms)` (it starts once the bytes are in host
/// RAM, `load_ms` after placement). Every boundary is offered: the lowest predicted TTFT
/// wins, not the longest prefix.
pub fn alternatives<T: IntoIterator<Item = DurableChunk>>(
    base: Candidate,
    resident: impl IntoIterator<Item = ResidentPrefix>,
    chunks_from: impl Fn(u32) -> T,
    restore_ms: impl Fn(u64, f64) -> f64,
) -> Vec<Candidate> {
    let mut out = vec![base.clone()];
    let mut head: Option<ResidentPrefix> = None;
    for p in resident {
        out.push(Candidate {
            tier: Tier::Gpu,
            cached_token_count: p.end_tokens,
            cached_bytes: p.bytes,
            source_continuation_id: p.continuation_id.clone(),
            ..base.clone()
        });
        if head.as_ref().is_none_or(|h| p.end_tokens > h.end_tokens) {
            head = Some(p);
        }
    }
    walk(&mut out, &base, None, chunks_from(0), &restore_ms);
    if let Some(h) = head {
        let tail = chunks_from(h.end_tokens);
        walk(&mut out, &base, Some(h), tail, &restore_ms);
    }
    out
}

/// Pushes one alternative per chunk of `chunks`, after the resident `head` if any.
fn walk(
    out: &mut Vec<Candidate>,
    base: &Candidate,
    head: Option<ResidentPrefix>,
    chunks: impl IntoIterator<Item = DurableChunk>,
    restore_ms: &impl Fn(u64, f64) -> f64,
) {
    let (resident_tokens, head_bytes, continuation) = match head {
        Some(h) => (h.end_tokens, h.bytes, h.continuation_id),
        None => (0, 0, None),
    };
    let mut bytes = 0u64;
    let mut slowest = Tier::Ram;
    // Per tier (by `Tier::lower_rank`): chunks fetched, their streaming time, the tier's
    // latency and its link's backlog.
    let mut tiers = [TierLoad::default(); 6];
    for chunk in chunks {
        if let Some(t) = tiers.get_mut(usize::from(chunk.tier.lower_rank())) {
            t.count += 1;
            t.streaming_ms += chunk.load_ms;
            t.fixed_ms = chunk.fixed_ms;
            t.backlog_ms = chunk.backlog_ms;
        }
        let load_ms: f64 = tiers.iter().map(|t| tier_load_ms(*t)).sum();
        bytes += chunk.bytes;
        if chunk.tier.lower_rank() > slowest.lower_rank() {
            slowest = chunk.tier;
        }
        out.push(Candidate {
            tier: slowest,
            cached_token_count: chunk.end_tokens,
            cached_bytes: head_bytes + bytes,
            prefix_load_ms: load_ms,
            gpu_restore_ms: restore_ms(bytes, load_ms),
            source_continuation_id: continuation.clone(),
            resident_token_count: resident_tokens,
            ..base.clone()
        });
    }
}

/// A walk's fetches from one tier.
#[derive(Debug, Clone, Copy, Default)]
struct TierLoad {
    count: usize,
    streaming_ms: f64,
    fixed_ms: f64,
    backlog_ms: f64,
}

/// How long a worker takes to fetch `count` chunks from one tier whose bytes stream in
/// `streaming_ms` with a latency of `fixed_ms` per fetch, [`RESTORE_FETCH_WINDOW`] fetches
/// in flight, after the `backlog_ms` already booked on the tier's link: the latency once
/// before the bytes stream (a window keeps the link busy), but never less than one
/// latency per window's worth of chunks (a latency-bound tier).
fn tier_load_ms(t: TierLoad) -> f64 {
    if t.count == 0 {
        return 0.0;
    }
    let windows = t.count.div_ceil(RESTORE_FETCH_WINDOW) as f64;
    t.backlog_ms + (t.fixed_ms + t.streaming_ms).max(windows * t.fixed_ms)
}

fn base_candidate(request: &GenerationRequest, obs: &Observation) -> Candidate {
    Candidate {
        worker_id: obs.worker_id.clone(),
        worker_epoch: obs.epoch,
        tier: Tier::None,
        cached_token_count: 0,
        cached_bytes: 0,
        queue_ms: obs.queue_ms,
        prefix_load_ms: 0.0,
        gpu_restore_ms: 0.0,
        prefill_ms_per_token: obs.prefill_ms_per_token,
        first_token_ms: obs.first_token_ms,
        page_size: obs.page_size,
        free_pages: obs.free_pages,
        evictable_pages: obs.evictable_pages,
        max_context: obs.max_context,
        // A draining worker takes no new offers: it is offline for routing purposes.
        online: obs.online && !obs.draining,
        model_loaded: obs.models.contains(&request.model),
        exact: true,
        source_continuation_id: None,
        resident_token_count: 0,
        transfer: obs.transfer,
        imposed_ms: 0.0,
    }
}

/// The fastest usable source of one chunk for this worker: a ready RAM/SSD replica on
/// its node, or the object store if the worker has one and the chunk is there. A tier
/// without a throughput figure is unusable; ties prefer ram < ssd < object.
fn fastest_source(
    obs: &Observation,
    catalog: &ChunkCatalog,
    model: &ModelFingerprint,
    entry: &ChunkEntry,
) -> Option<(Tier, f64, f64)> {
    let mut sources: Vec<Tier> = catalog
        .local_tiers(&obs.node, model, entry.hash)
        .map(|t| {
            t.iter()
                .copied()
                .filter(|t| matches!(t, Tier::Ram | Tier::Ssd))
                .collect()
        })
        .unwrap_or_default();
    if obs.object_store && entry.object {
        sources.push(Tier::Object);
    }
    sources
        .into_iter()
        .filter_map(|tier| {
            let throughput = *obs.tier_throughput_bytes_per_ms.get(&tier)?;
            let fixed = obs.tier_fixed_ms.get(&tier).copied().unwrap_or(0.0);
            Some((tier, fixed, entry.bytes as f64 / throughput))
        })
        // One chunk alone: a tier's latency counts in full.
        .min_by(|a, b| {
            (a.1 + a.2)
                .total_cmp(&(b.1 + b.2))
                .then_with(|| a.0.lower_rank().cmp(&b.0.lower_rank()))
        })
}

#[cfg(test)]
mod tests;
