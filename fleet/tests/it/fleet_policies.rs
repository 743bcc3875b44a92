//! Each policy's selection rule on small hand-made situations.

use den_fleet::baselines::{
    DynamoInput, LlmdInput, LlmdPolicy, SglangInput, SglangMode, SglangPolicy, dynamo_choose,
    dynamo_cost,
};
use den_fleet::den::{DenWorker, Shape, candidates, decide};
use den_fleet::load::WorkerLoad;
use den_fleet::plan::PendingPrefill;
use den_fleet::worker::Source;
use den_fleet::{
    CostModel, DenOptions, FleetConfig, PolicyKind, Trace, TraceRequest, Workload, parse_policies,
    run_policy,
};
use den_protocol::candidate::Tier;
use den_protocol::ids::WorkerId;

#[test]
fn dynamo_picks_the_documented_worked_example_w2() {
    // kv_cache_routing.md: W1 8 prefill + 10 decode = 18, W2 5 + 5 = 10, W3 2 + 9 = 11.
    let workers = [
        DynamoInput {
            prefill_blocks: 8.0,
            decode_blocks: 10.0,
        },
        DynamoInput {
            prefill_blocks: 5.0,
            decode_blocks: 5.0,
        },
        DynamoInput {
            prefill_blocks: 2.0,
            decode_blocks: 9.0,
        },
    ];
    let costs: Vec<f64> = workers.iter().map(|w| dynamo_cost(1.0, w)).collect();
    assert_eq!(costs, vec![18.0, 10.0, 11.0]);
    assert_eq!(dynamo_choose(1.0, &workers), 1);
    // A larger overlap weight favours the worker with the most cached prefix (least
    // prefill); weight 0 is pure decode-load balancing.
    assert_eq!(dynamo_choose(3.0, &workers), 2);
    assert_eq!(dynamo_choose(0.0, &workers), 1);
}

#[test]
fn sglang_follows_the_longest_match_above_the_cache_threshold() {
    let p = SglangPolicy::default();
    let w = [
        SglangInput {
            load: 3,
            matched_tokens: 400,
        },
        SglangInput {
            load: 1,
            matched_tokens: 0,
        },
        SglangInput {
            load: 9,
            matched_tokens: 600,
        },
    ];
    assert_eq!(p.choose(&w, 1000), (2, SglangMode::CacheHit), "60% match");
    // 30% is not above the threshold: least-loaded.
    let w = [
        SglangInput {
            load: 3,
            matched_tokens: 300,
        },
        SglangInput {
            load: 1,
            matched_tokens: 0,
        },
    ];
    assert_eq!(p.choose(&w, 1000), (1, SglangMode::CacheMiss));
}

#[test]
fn sglang_switches_to_least_loaded_only_when_the_gap_exceeds_64_and_1_5x() {
    let p = SglangPolicy::default();
    let matched = |load, m| SglangInput {
        load,
        matched_tokens: m,
    };
    // Gap 70 > 64 and 100 > 1.5 × 30: least-loaded, although worker 0 holds the prefix.
    assert_eq!(
        p.choose(&[matched(100, 900), matched(30, 0)], 1000),
        (1, SglangMode::Imbalanced)
    );
    // Gap 64 is not > 64: stays cache-aware.
    assert_eq!(
        p.choose(&[matched(94, 900), matched(30, 0)], 1000),
        (0, SglangMode::CacheHit)
    );
    // Gap 70 > 64 but 300 < 1.5 × 230: stays cache-aware.
    assert_eq!(
        p.choose(&[matched(300, 900), matched(230, 0)], 1000),
        (0, SglangMode::CacheHit)
    );
}

#[test]
fn llmd_weighs_queue_kv_utilisation_and_prefix_2_2_3() {
    let p = LlmdPolicy::default();
    let w = [
        LlmdInput {
            waiting: 4,
            kv_usage: 0.5,
            prefix_fraction: 0.9,
        },
        LlmdInput {
            waiting: 0,
            kv_usage: 0.1,
            prefix_fraction: 0.0,
        },
        LlmdInput {
            waiting: 2,
            kv_usage: 0.5,
            prefix_fraction: 0.5,
        },
    ];
    let s = p.scores(&w);
    // queue: min-max normalised waiting (1, 0.5 or 0); kv: 1 − usage; prefix: fraction.
    assert!((s[0] - (2.0 * 0.0 + 2.0 * 0.5 + 3.0 * 0.9)).abs() < 1e-12);
    assert!((s[1] - (2.0 * 1.0 + 2.0 * 0.9 + 3.0 * 0.0)).abs() < 1e-12);
    assert!((s[2] - (2.0 * 0.5 + 2.0 * 0.5 + 3.0 * 0.5)).abs() < 1e-12);
    assert_eq!(p.choose(&w), 1);
    // Equal queues score 1 for everyone; a full prefix then wins; ties take the lowest index.
    let eq = [
        LlmdInput {
            waiting: 1,
            kv_usage: 0.2,
            prefix_fraction: 0.0,
        },
        LlmdInput {
            waiting: 1,
            kv_usage: 0.2,
            prefix_fraction: 1.0,
        },
    ];
    assert_eq!(p.choose(&eq), 1);
    assert_eq!(p.choose(&[eq[0], eq[0]]), 0);
}

fn den_worker(id: &str, load: WorkerLoad, sources: Vec<Option<Source>>) -> DenWorker {
    DenWorker::new(WorkerId::from(id), load, sources)
}

#[test]
fn den_prefers_a_warm_ram_prefix_on_an_idle_worker_to_a_busy_gpu() {
    // SIM-6 in spirit: the GPU copy sits behind a long queue; a RAM copy on an idle
    // worker is restored over PCIe in ~ms and wins.
    let cost = CostModel::default();
    let tokens = [512u32; 16];
    let shape = Shape {
        input_tokens: 16 * 512,
        output_tokens: 64,
        block_tokens: &tokens,
    };
    let mut busy = WorkerLoad::idle(cost.gpu_kv_blocks, &cost);
    // ~2 s of someone else's prefill ahead, as the pending sum (v2–v5 read it) and as
    // the engine plan (v6 replays it).
    busy.pending_prefill_model_ms = 2000.0;
    busy.plan.pending = vec![PendingPrefill {
        ready_in_ms: 0.0,
        done_tokens: 0,
        input_tokens: 40_000,
    }];
    let idle = WorkerLoad::idle(cost.gpu_kv_blocks, &cost);
    let workers = [
        den_worker("busy", busy, vec![Some(Source::Gpu); 15]),
        den_worker("warm", idle, vec![Some(Source::Ram); 15]),
    ];
    let d = decide(&shape, &workers, &cost, &DenOptions::v6()).unwrap();
    assert_eq!(d.chosen.candidate.worker_id.as_str(), "warm");
    assert_eq!(d.chosen.candidate.tier, Tier::Ram);
    assert_eq!(d.chosen.candidate.cached_token_count, 15 * 512);
    // The record shows each worker's best alternative, in offer order.
    assert_eq!(d.ranked.len(), 2);
    assert_eq!(d.ranked[1].candidate.worker_id.as_str(), "busy");
    assert!(d.ranked[0].estimate.ttft_ms < d.ranked[1].estimate.ttft_ms);
    // Idle both: the GPU copy (no restore) wins.
    let workers = [
        den_worker(
            "gpu",
            WorkerLoad::idle(cost.gpu_kv_blocks, &cost),
            vec![Some(Source::Gpu); 15],
        ),
        den_worker(
            "warm",
            WorkerLoad::idle(cost.gpu_kv_blocks, &cost),
            vec![Some(Source::Ram); 15],
        ),
    ];
    let d = decide(&shape, &workers, &cost, &DenOptions::v6()).unwrap();
    assert_eq!(d.chosen.candidate.worker_id.as_str(), "gpu");
}

#[test]
fn den_candidates_cover_recompute_gpu_and_each_tier_run() {
    let cost = CostModel::default();
    let tokens = [512u32; 12];
    let shape = Shape {
        input_tokens: 12 * 512,
        output_tokens: 8,
        block_tokens: &tokens,
    };
    let sources = vec![
        Some(Source::Gpu),
        Some(Source::Gpu),
        Some(Source::Ram),
        Some(Source::Ram),
        Some(Source::Ram),
        Some(Source::Ssd),
        Some(Source::Ssd),
        None,
        Some(Source::Gpu),
    ];
    let w = den_worker("w", WorkerLoad::idle(cost.gpu_kv_blocks, &cost), sources);
    // The study steps' walk (v1 … v6): the reused prefix mixes tiers.
    let cs = candidates(&shape, &w, &cost, &DenOptions::v6());
    let got: Vec<(Tier, u32)> = cs
        .iter()
        .map(|c| (c.tier, c.cached_token_count / 512))
        .collect();
    // Recompute; each run's first and last boundary; the walk stops at the first gap.
    assert_eq!(
        got,
        vec![
            (Tier::None, 0),
            (Tier::Gpu, 1),
            (Tier::Gpu, 2),
            (Tier::Ram, 3),
            (Tier::Ram, 5),
            (Tier::Ssd, 6),
            (Tier::Ssd, 7),
        ]
    );
    let ram = &cs[4];
    assert_eq!(
        ram.prefix_load_ms, 0.0,
        "RAM needs no load, only the PCIe restore"
    );
    let restore_bytes = 3 * 512 * cost.kv_bytes_per_token;
    assert_eq!(
        ram.gpu_restore_ms,
        cost.pcie_us(restore_bytes) as f64 / 1000.0
    );
    let ssd = &cs[6];
    assert_eq!(
        ssd.prefix_load_ms,
        cost.nvme_us(2 * 512 * cost.kv_bytes_per_token) as f64 / 1000.0
    );
}

#[test]
fn den_waits_for_a_full_pool_to_drain_instead_of_giving_up_on_it() {
    let cost = CostModel::default();
    let tokens = [512u32; 8];
    let shape = Shape {
        input_tokens: 8 * 512,
        output_tokens: 100,
        block_tokens: &tokens,
    };
    let mut full = WorkerLoad::idle(cost.gpu_kv_blocks, &cost);
    full.free_blocks = 0;
    full.evictable_blocks = 1;
    full.releases = vec![(40.0, 3), (90.0, 20)];
    let w = den_worker("full", full, vec![Some(Source::Gpu); 7]);
    let v3 = candidates(&shape, &w, &cost, &DenOptions::v3());
    let v4 = candidates(&shape, &w, &cost, &DenOptions::v4());
    let d3 = decide(&shape, std::slice::from_ref(&w), &cost, &DenOptions::v3()).unwrap();
    assert!(
        d3.capacity_fallback,
        "v3: no candidate fits the pool right now"
    );
    assert!(v3.iter().all(|c| c.queue_ms == 0.0));
    let d4 = decide(&shape, std::slice::from_ref(&w), &cost, &DenOptions::v4()).unwrap();
    assert!(!d4.capacity_fallback);
    // The GPU candidate needs 9 − 7 = 2 blocks: after the first release (1 + 3 ≥ 2), so
    // it queues 40 ms. Recompute needs all 9: after the second (1 + 3 + 20 ≥ 9), 90 ms.
    let gpu = v4
        .iter()
        .find(|c| c.tier == Tier::Gpu && c.cached_token_count == 7 * 512)
        .unwrap();
    assert_eq!(gpu.queue_ms, 40.0);
    assert_eq!(d4.chosen.candidate.tier, Tier::Gpu);
    let none = v4.iter().find(|c| c.tier == Tier::None).unwrap();
    assert_eq!(none.queue_ms, 90.0);
}

fn tiny_trace(n: usize) -> Trace {
    let requests: Vec<TraceRequest> = (0..n)
        .map(|i| TraceRequest {
            timestamp: 0,
            input_length: 600,
            output_length: 4,
            hash_ids: vec![1000 + i as u64, 2000 + i as u64],
        })
        .collect();
    Trace {
        lines: (1..=n).collect(),
        requests,
    }
}

#[test]
fn round_robin_cycles_and_least_loaded_takes_the_emptiest() {
    let w = Workload::from_trace(&tiny_trace(7));
    let config = FleetConfig::new(3);
    let rr = run_policy(&w, &config, PolicyKind::RoundRobin);
    assert_eq!(rr.worker, vec![0, 1, 2, 0, 1, 2, 0]);
    // All arrive at once: in-flight counts climb evenly, ties to the lowest index.
    let ll = run_policy(&w, &config, PolicyKind::LeastLoaded);
    assert_eq!(ll.worker, vec![0, 1, 2, 0, 1, 2, 0]);
    assert_eq!(ll.report.load_spread.requests_per_worker, vec![3, 2, 2]);
}

#[test]
fn policy_lists_parse_and_unknown_names_are_explained() {
    assert_eq!(parse_policies("all").unwrap(), PolicyKind::ALL.to_vec());
    assert_eq!(
        parse_policies("den, Dynamo,llm_d,den").unwrap(),
        vec![PolicyKind::Den, PolicyKind::Dynamo, PolicyKind::LlmD]
    );
    let err = parse_policies("den,magic").unwrap_err().to_string();
    assert!(
        err.contains("\"magic\"") && err.contains("round-robin"),
        "{err}"
    );
    assert!(parse_policies(" , ").is_err());
}
