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
