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
mod tests {
    use super::*;
    use crate::candidate::{Infeasible, rank};
    use crate::chunk::PrefixHash;
    use crate::observation::GpuPrefix;

    const MODEL: &str = "gemma/test";

    /// The candidates-test fixture of spec §7.3: tokens [1..7] ⇒ P 6, chunk 2 ⇒ 3 chunks
    /// of 200 bytes; page 2, prefill 10, first 1, GPU 1000 B/ms, ssd 1000 B/ms, object 1 B/ms.
    fn fixture() -> (GenerationRequest, Observation, ChunkCatalog) {
        let request = GenerationRequest::new("r", MODEL, (1..=7).collect(), 1).unwrap();
        let mut obs = Observation::new("w", "node-w");
        obs.models.insert(MODEL.into());
        obs.page_size = 2;
        obs.free_pages = 100;
        obs.prefill_ms_per_token = 10.0;
        obs.first_token_ms = 1.0;
        obs.gpu_restore_bytes_per_ms = 1000.0;
        obs.tier_throughput_bytes_per_ms.insert(Tier::Ssd, 1000.0);
        obs.tier_throughput_bytes_per_ms.insert(Tier::Object, 1.0);
        let catalog = catalogued(&request, true);
        (request, obs, catalog)
    }

    /// Every chunk of `request` (chunks of 2 tokens, 200 bytes) in a catalog, with an
    /// object-store copy or none.
    fn catalogued(request: &GenerationRequest, object: bool) -> ChunkCatalog {
        let mut catalog = ChunkCatalog::default();
        for d in plan_chunks(request.processed_tokens(), 2) {
            catalog.publish(ChunkEntry {
                model: MODEL.into(),
                hash: d.hash,
                parent: d.parent,
                start: d.start,
                token_count: d.token_count,
                bytes: 200,
                object,
            });
        }
        catalog
    }

    #[test]
    fn a_worker_reporting_its_engine_plan_is_priced_by_replaying_it() {
        use crate::engine_plan::{EnginePlan, PendingPrefill, StepCosts};
        let (request, mut busy, catalog) = fixture();
        busy.worker_id = "busy".into();
        busy.queue_ms = 0.0; // stale or unused: the plan decides
        let costs = StepCosts::Batched {
            row_us: 1_000.0,
            weights_pass_us: 2_000.0,
            attention_us_per_position: 0.0,
            context_us_per_token: 0.0,
        };
        busy.engine = Some(EnginePlan {
            pending: vec![PendingPrefill {
                ready_in_ms: 0.0,
                done_tokens: 0,
                input_tokens: 10,
            }],
            ..EnginePlan::idle(8, costs)
        });
        let mut idle = busy.clone();
        idle.worker_id = "idle".into();
        idle.engine = Some(EnginePlan::idle(8, costs));
        let all = candidates_for(&request, 2, [&busy, &idle], &catalog);
        let recompute = |w: &str| {
            all.iter()
                .find(|c| c.worker_id.as_str() == w && c.tier == Tier::None)
                .unwrap()
                .clone()
        };
        // Idle: 7 prompt rows in one step of 7 ms, which samples the first token.
        let i = recompute("idle");
        let e = crate::candidate::estimate(&request, &i);
        assert!((e.ttft_ms - 7.0).abs() < 1e-9, "{}", e.ttft_ms);
        assert_eq!(i.imposed_ms, 0.0);
        // Busy (budget 8): 8 pending rows (8 ms); its last 2 with 6 of the newcomer's
        // (8 ms, ending the pending prefill at 16 instead of 10 ms alone); the
        // newcomer's last row (the 2 ms weight pass): 18 ms, and 6 ms imposed.
        let b = recompute("busy");
        let e = crate::candidate::estimate(&request, &b);
        assert!((e.ttft_ms - 18.0).abs() < 1e-9, "{}", e.ttft_ms);
        assert!((b.imposed_ms - 6.0).abs() < 1e-9, "{}", b.imposed_ms);
        let ranked = rank(&request, all);
        assert_eq!(ranked.feasible[0].candidate.worker_id.as_str(), "idle");
    }

    fn ssd_replicas(catalog: &mut ChunkCatalog, request: &GenerationRequest, chunks: usize) {
        for d in plan_chunks(request.processed_tokens(), 2)
            .into_iter()
            .take(chunks)
        {
            catalog.add_replica("node-w".into(), MODEL.into(), d.hash, Tier::Ssd);
        }
    }

    fn best(
        request: &GenerationRequest,
        obs: &Observation,
        catalog: &ChunkCatalog,
    ) -> (Tier, u32, u64, f64) {
        let r = rank(request, candidates_for(request, 2, [obs], catalog));
        let b = &r.feasible[0];
        (
            b.candidate.tier,
            b.candidate.cached_token_count,
            b.candidate.cached_bytes,
            b.estimate.ttft_ms,
        )
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn p_1_ssd_replicas_give_the_best_candidate() {
        let (request, obs, mut catalog) = fixture();
        ssd_replicas(&mut catalog, &request, 2);
        let (tier, cached, bytes, ttft) = best(&request, &obs, &catalog);
        assert_eq!((tier, cached, bytes), (Tier::Ssd, 4, 400));
        assert!(close(ttft, 21.8), "{ttft}");
    }

    #[test]
    fn p_2_shorter_local_prefix_beats_longer_object_prefix() {
        let (request, mut obs, mut catalog) = fixture();
        obs.object_store = true;
        ssd_replicas(&mut catalog, &request, 1);
        let all = rank(&request, candidates_for(&request, 2, [&obs], &catalog));
        let (tier, cached, _, ttft) = best(&request, &obs, &catalog);
        assert_eq!((tier, cached), (Tier::Ssd, 2));
        assert!(close(ttft, 41.4), "{ttft}");
        let object4 = all
            .feasible
            .iter()
            .find(|s| s.candidate.tier == Tier::Object && s.candidate.cached_token_count == 4)
            .map(|s| s.estimate.ttft_ms);
        assert!(object4.is_some_and(|t| close(t, 221.6)), "{object4:?}");
    }

    /// A request of `tokens` tokens whose first `chunks` 2-token chunks the fixture's
    /// worker holds on SSD, at 10 ms a fetch.
    fn on_ssd(tokens: u32, chunks: usize) -> (GenerationRequest, Observation, ChunkCatalog) {
        let request = GenerationRequest::new("r", MODEL, (1..=tokens).collect(), 1).unwrap();
        let (_, mut obs, _) = fixture();
        obs.tier_fixed_ms.insert(Tier::Ssd, 10.0);
        let mut catalog = catalogued(&request, false);
        ssd_replicas(&mut catalog, &request, chunks);
        (request, obs, catalog)
    }

    #[test]
    fn a_tiers_fetch_latency_overlaps_a_window_of_concurrent_fetches() {
        // 70 chunks on SSD at 10 ms a fetch + 0.2 ms of bytes each. The worker keeps 32
        // fetches in flight: boundary k loads in max(10 + 0.2 k, 10 ⌈k / 32⌉) ms — the
        // latency once while the bytes keep the link busy, once per window when they do
        // not — never 10.2 k.
        let (request, obs, catalog) = on_ssd(141, 70);
        let all = candidates_for(&request, 2, [&obs], &catalog);
        let load = |chunks: u32| {
            all.iter()
                .find(|c| c.tier == Tier::Ssd && c.cached_token_count == 2 * chunks)
                .map(|c| c.prefix_load_ms)
        };
        for (k, want) in [(1, 10.2), (32, 16.4), (33, 20.0), (64, 22.8), (65, 30.0)] {
            let got = load(k);
            assert!(
                got.is_some_and(|g| close(g, want)),
                "{k} chunks: {got:?}, want {want}"
            );
        }
    }

    #[test]
    fn a_load_waits_behind_what_its_tiers_link_has_booked() {
        // The same 4 SSD chunks, with the worker's SSD link busy for 25 ms and its
        // host→device copies for 3 ms: the SSD walk starts 25 ms later; the copies drain
        // while it fetches, so its upload is not delayed; a GPU-resident prefix pays
        // neither.
        let (request, mut obs, catalog) = on_ssd(9, 4);
        let plan = plan_chunks(request.processed_tokens(), 2);
        obs.gpu_prefixes.push(GpuPrefix {
            model: MODEL.into(),
            prefix_hash: plan[0].hash,
            continuation_id: "resident".into(),
            token_count: 2,
            bytes: 200,
        });
        let ssd = |obs: &Observation| {
            let all = candidates_for(&request, 2, [obs], &catalog);
            let walk = all
                .iter()
                .find(|c| {
                    c.tier == Tier::Ssd && c.cached_token_count == 8 && c.resident_token_count == 0
                })
                .map(|c| (c.prefix_load_ms, c.gpu_restore_ms));
            let gpu = all
                .iter()
                .find(|c| c.tier == Tier::Gpu)
                .map(|c| (c.prefix_load_ms, c.gpu_restore_ms));
            (walk, gpu)
        };
        let (idle, idle_gpu) = ssd(&obs);
        obs.link_backlog_ms.insert(Tier::Ssd, 25.0);
        obs.link_backlog_ms.insert(Tier::Gpu, 3.0);
        obs.link_backlog_ms.insert(Tier::Object, 1000.0);
        let (busy, busy_gpu) = ssd(&obs);
        let (Some(idle), Some(busy)) = (idle, busy) else {
            panic!("no SSD walk: {idle:?} {busy:?}");
        };
        assert!(close(busy.0, idle.0 + 25.0), "{busy:?} vs {idle:?}");
        assert!(close(busy.1, idle.1), "{busy:?} vs {idle:?}");
        assert_eq!(idle_gpu, busy_gpu, "a resident prefix moves no bytes");
        assert!(idle_gpu.is_some());
    }

    #[test]
    fn an_upload_waits_only_for_the_copies_its_fetch_has_not_outlasted() {
        // 4 chunks of 200 B on SSD at 1000 B/ms (0.8 ms streaming + 10 ms latency): the
        // upload of 800 B at 1000 B/ms starts after the fetch or after the copies booked
        // ahead of it, whichever ends later. A 3 ms copy backlog ends before the fetch
        // (no delay); a 50 ms one delays the upload by what is left of it.
        let (request, mut obs, catalog) = on_ssd(9, 4);
        let walk = |obs: &Observation| {
            candidates_for(&request, 2, [obs], &catalog)
                .into_iter()
                .find(|c| c.tier == Tier::Ssd && c.cached_token_count == 8)
                .map(|c| (c.prefix_load_ms, c.gpu_restore_ms))
        };
        let Some((load, idle)) = walk(&obs) else {
            panic!("no SSD walk");
        };
        assert!(load > 3.0 && load < 50.0, "{load}");
        obs.link_backlog_ms.insert(Tier::Gpu, 3.0);
        assert_eq!(walk(&obs), Some((load, idle)));
        obs.link_backlog_ms.insert(Tier::Gpu, 50.0);
        let Some((_, late)) = walk(&obs) else {
            panic!("no SSD walk");
        };
        assert!(
            close(late, idle + 50.0 - load),
            "{late} vs {idle} + 50 − {load}"
        );
    }

    #[test]
    fn withdrawn_object_copy_is_no_longer_a_source() {
        let (request, mut obs, mut catalog) = fixture();
        obs.object_store = true;
        let plan = plan_chunks(request.processed_tokens(), 2);
        let object = |c: &ChunkCatalog| {
            candidates_for(&request, 2, [&obs], c)
                .iter()
                .filter(|c| c.tier == Tier::Object)
                .count()
        };
        assert_eq!(object(&catalog), 3);
        catalog.withdraw_object(&MODEL.into(), plan[1].hash);
        // The run stops at the withdrawn chunk: only the first boundary is left.
        assert_eq!(object(&catalog), 1);
    }

    #[test]
    fn p_3_gpu_prefix_is_offered_with_its_source_route() {
        let (request, mut obs, catalog) = fixture();
        let plan = plan_chunks(request.processed_tokens(), 2);
        obs.gpu_prefixes.push(GpuPrefix {
            model: MODEL.into(),
            prefix_hash: plan[1].hash,
            continuation_id: "resident-prefix".into(),
            token_count: 4,
            bytes: 400,
        });
        let r = rank(&request, candidates_for(&request, 2, [&obs], &catalog));
        let b = &r.feasible[0];
        assert_eq!(
            (b.candidate.tier, b.candidate.cached_token_count),
            (Tier::Gpu, 4)
        );
        assert_eq!(
            b.candidate.source_continuation_id,
            Some("resident-prefix".into())
        );
        assert!(close(b.estimate.ttft_ms, 21.0));
    }

    #[test]
    fn p_4_gpu_and_ssd_alternatives_per_boundary() {
        let (request, mut obs, mut catalog) = fixture();
        let plan = plan_chunks(request.processed_tokens(), 2);
        obs.gpu_prefixes.push(GpuPrefix {
            model: MODEL.into(),
            prefix_hash: plan[1].hash,
            continuation_id: "resident-prefix".into(),
            token_count: 4,
            bytes: 400,
        });
        ssd_replicas(&mut catalog, &request, 2);
        let r = rank(&request, candidates_for(&request, 2, [&obs], &catalog));
        let tiers: Vec<_> = r.feasible.iter().map(|s| s.candidate.tier).collect();
        let counts: Vec<_> = r
            .feasible
            .iter()
            .map(|s| s.candidate.cached_token_count)
            .collect();
        assert_eq!(tiers, [Tier::Gpu, Tier::Ssd, Tier::Ssd, Tier::None]);
        assert_eq!(counts, [4, 4, 2, 0]);
    }

    #[test]
    fn a_resident_head_with_a_lower_tier_tail_is_one_alternative() {
        // Chunk 1 (tokens 1–2) is resident in route "head"; chunks 2 and 3 are on SSD only.
        // No walk from the root exists (chunk 1 has no lower-tier copy), so before the
        // mixed alternative the best was the GPU head alone: 4 missing × 10 + 1 = 41 ms.
        // Forking the head and restoring the tail: 2 × 200 B at 1000 B/ms (0.4 ms), the
        // 400 B upload (0.4 ms), no prompt left, the first token (1 ms): 1.8 ms.
        let (request, mut obs, mut catalog) = fixture();
        let plan = plan_chunks(request.processed_tokens(), 2);
        obs.gpu_prefixes.push(GpuPrefix {
            model: MODEL.into(),
            prefix_hash: plan[0].hash,
            continuation_id: "head".into(),
            token_count: 2,
            bytes: 200,
        });
        for d in &plan[1..] {
            catalog.add_replica("node-w".into(), MODEL.into(), d.hash, Tier::Ssd);
        }
        let r = rank(&request, candidates_for(&request, 2, [&obs], &catalog));
        let b = &r.feasible[0].candidate;
        assert_eq!((b.tier, b.cached_token_count), (Tier::Ssd, 6));
        assert_eq!(b.resident_tokens(), 2);
        assert_eq!(b.source_continuation_id, Some("head".into()));
        assert_eq!(b.cached_bytes, 600);
        assert!(close(b.prefix_load_ms, 0.4), "{}", b.prefix_load_ms);
        assert!(close(b.gpu_restore_ms, 0.4), "{}", b.gpu_restore_ms);
        assert!(close(r.feasible[0].estimate.ttft_ms, 1.8));
        // The head's page is shared: with 3 free pages (of the 4 that 7 tokens take) the
        // mixed alternative fits and the same prefix restored whole does not.
        let tight = Candidate {
            free_pages: 3,
            evictable_pages: 0,
            ..b.clone()
        };
        let whole = Candidate {
            resident_token_count: 0,
            ..tight.clone()
        };
        assert!(crate::candidate::estimate(&request, &tight).feasible());
        assert_eq!(
            crate::candidate::estimate(&request, &whole).infeasible,
            Some(Infeasible::InsufficientPages)
        );
        // Its tail boundaries are offered too: 4 and 6 tokens.
        let mixed: Vec<u32> = r
            .feasible
            .iter()
            .filter(|s| s.candidate.resident_tokens() == 2 && s.candidate.tier == Tier::Ssd)
            .map(|s| s.candidate.cached_token_count)
            .collect();
        assert_eq!(mixed, [6, 4]);
    }

    #[test]
    fn p_5_offline_worker_or_missing_model_yields_no_feasible_candidate() {
        let (request, mut obs, mut catalog) = fixture();
        ssd_replicas(&mut catalog, &request, 2);
        obs.online = false;
        let r = rank(&request, candidates_for(&request, 2, [&obs], &catalog));
        assert!(r.feasible.is_empty());
        assert_eq!(
            r.infeasible[0].estimate.infeasible,
            Some(Infeasible::WorkerOffline)
        );
        obs.online = true;
        obs.models.clear();
        let r = rank(&request, candidates_for(&request, 2, [&obs], &catalog));
        assert!(r.feasible.is_empty());
        assert_eq!(
            r.infeasible[0].estimate.infeasible,
            Some(Infeasible::ModelNotLoaded)
        );
        obs.models.insert(MODEL.into());
        obs.draining = true;
        assert!(
            rank(&request, candidates_for(&request, 2, [&obs], &catalog))
                .feasible
                .is_empty()
        );
    }

    #[test]
    fn a_corrupt_middle_entry_stops_the_run() {
        let (request, mut obs, mut catalog) = fixture();
        obs.object_store = true;
        let plan = plan_chunks(request.processed_tokens(), 2);
        // Re-publish chunk 2 under a wrong parent: chunk 3 must not become loadable.
        let mut bad = ChunkCatalog::default();
        for (i, d) in plan.iter().enumerate() {
            let parent = if i == 1 { PrefixHash::ROOT } else { d.parent };
            bad.publish(ChunkEntry {
                model: MODEL.into(),
                hash: d.hash,
                parent,
                start: d.start,
                token_count: d.token_count,
                bytes: 200,
                object: true,
            });
        }
        assert_eq!(bad.matched_run(&MODEL.into(), &plan).len(), 1);
        assert_eq!(catalog.matched_run(&MODEL.into(), &plan).len(), 3);
        catalog.remove_node(&"node-w".into());
        let max_cached = candidates_for(&request, 2, [&obs], &bad)
            .iter()
            .map(|c| c.cached_token_count)
            .max();
        assert_eq!(max_cached, Some(2));
    }

    #[test]
    fn sim_7_database_derived_candidates_rank_as_the_spec_derives() {
        // 4 catalogued 64-token chunks of 1 MiB; warm-ssd has SSD replicas of the first 3;
        // busy-gpu advertises the full 256-token prefix, queue 45.
        let mib = 1024 * 1024;
        let request = GenerationRequest::new("request-1", MODEL, (0..=256).collect(), 8).unwrap();
        let plan = plan_chunks(request.processed_tokens(), 64);
        let mut catalog = ChunkCatalog::default();
        for d in &plan {
            catalog.publish(ChunkEntry {
                model: MODEL.into(),
                hash: d.hash,
                parent: d.parent,
                start: d.start,
                token_count: d.token_count,
                bytes: mib,
                object: false,
            });
        }
        let mk = |id: &str| {
            let mut o = Observation::new(id, id);
            o.models.insert(MODEL.into());
            o.page_size = 16;
            o.free_pages = 64;
            o.max_context = 1024;
            o.prefill_ms_per_token = 0.2;
            o.first_token_ms = 2.0;
            o.gpu_restore_bytes_per_ms = mib as f64;
            o.tier_throughput_bytes_per_ms.insert(Tier::Ssd, mib as f64);
            o.tier_fixed_ms.insert(Tier::Ssd, 0.0);
            o
        };
        let mut warm = mk("warm-ssd");
        warm.queue_ms = 0.0;
        for d in plan.iter().take(3) {
            catalog.add_replica("warm-ssd".into(), MODEL.into(), d.hash, Tier::Ssd);
        }
        let mut busy = mk("busy-gpu");
        busy.queue_ms = 45.0;
        busy.gpu_prefixes.push(GpuPrefix {
            model: MODEL.into(),
            prefix_hash: plan[3].hash,
            continuation_id: "busy-route".into(),
            token_count: 256,
            bytes: 4 * mib,
        });
        let r = rank(
            &request,
            candidates_for(&request, 64, [&warm, &busy], &catalog),
        );
        let got: Vec<_> = r
            .feasible
            .iter()
            .map(|s| {
                (
                    s.candidate.worker_id.as_str(),
                    s.candidate.tier,
                    s.candidate.cached_token_count,
                    s.estimate.ttft_ms,
                )
            })
            .collect();
        let want = [
            ("warm-ssd", Tier::Ssd, 192, 20.8),
            ("warm-ssd", Tier::Ssd, 128, 31.6),
            ("warm-ssd", Tier::Ssd, 64, 42.4),
            ("busy-gpu", Tier::Gpu, 256, 47.0),
            ("warm-ssd", Tier::None, 0, 53.2),
            ("busy-gpu", Tier::None, 0, 98.2),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!((g.0, g.1, g.2), (w.0, w.1, w.2));
            assert!(close(g.3, w.3), "{g:?} vs {w:?}");
        }
    }
}
