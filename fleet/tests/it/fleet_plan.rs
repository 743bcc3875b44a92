//! The engine-plan replay den's v6 estimator uses, and the fleet cost (own TTFT plus the
//! delay imposed on pending requests) that v5/v6 rank by.

use den_fleet::cost::positions;
use den_fleet::den::{DenWorker, Shape, decide, imposed_ms, priced_candidates};
use den_fleet::load::WorkerLoad;
use den_fleet::plan::{EnginePlan, PendingPrefill, replay};
use den_fleet::worker::Source;
use den_fleet::{CostModel, DenOptions, FleetConfig, PolicyKind, run_policy};
use den_protocol::candidate::Tier;
use den_protocol::ids::WorkerId;

fn ready(input_tokens: u32) -> PendingPrefill {
    PendingPrefill {
        ready_in_ms: 0.0,
        done_tokens: 0,
        input_tokens,
    }
}

fn step_ms(cost: &CostModel, tokens: u64, attention: f64) -> f64 {
    cost.step_us(tokens, attention, 0, 0) as f64 / 1e3
}

#[test]
fn an_idle_engine_prefills_a_request_in_budget_sized_steps() {
    let cost = CostModel::default();
    let plan = cost.idle_plan();
    let r = replay(&plan, Some(ready(10_000)));
    // 8,192 tokens, then the remaining 1,808, each step priced by the roofline.
    let expected =
        step_ms(&cost, 8192, positions(0, 8192)) + step_ms(&cost, 1808, positions(8192, 10_000));
    let got = r.joiner_finish_ms.unwrap();
    assert!((got - expected).abs() < 1e-9, "{got} vs {expected}");
    assert!(r.finish_ms.is_empty());
    // The step in flight comes first.
    let busy = EnginePlan {
        step_remaining_ms: 7.0,
        ..cost.idle_plan()
    };
    let later = replay(&busy, Some(ready(10_000)));
    assert!((later.joiner_finish_ms.unwrap() - expected - 7.0).abs() < 1e-9);
}

#[test]
fn a_new_request_joins_the_last_step_and_delays_the_requests_finishing_in_it() {
    let cost = CostModel::default();
    let plan = EnginePlan {
        pending: vec![ready(1_000)],
        ..cost.idle_plan()
    };
    let alone = replay(&plan, None);
    let joined = replay(&plan, Some(ready(20_000)));
    let pending_alone = alone.finish_ms[0];
    let pending_joined = joined.finish_ms[0];
    assert!((pending_alone - step_ms(&cost, 1_000, positions(0, 1_000))).abs() < 1e-9);
    // Its only step now also carries the newcomer's first 7,192 tokens.
    let shared = step_ms(&cost, 8_192, positions(0, 1_000) + positions(0, 7_192));
    assert!((pending_joined - shared).abs() < 1e-9);
    assert!(pending_joined > 5.0 * pending_alone);
    assert!(joined.joiner_finish_ms.unwrap() > pending_joined);
    // A newcomer that waits for its prefix longer than the pending work lasts imposes
    // nothing.
    let late = PendingPrefill {
        ready_in_ms: 1_000.0,
        ..ready(20_000)
    };
    let joined_late = replay(&plan, Some(late));
    assert_eq!(joined_late.finish_ms, alone.finish_ms);
    assert!(joined_late.joiner_finish_ms.unwrap() > 1_000.0);
}

#[test]
fn a_pending_request_still_loading_lets_a_ready_one_run_first() {
    let cost = CostModel::default();
    let plan = EnginePlan {
        pending: vec![PendingPrefill {
            ready_in_ms: 2_000.0,
            done_tokens: 30_000,
            input_tokens: 31_000,
        }],
        ..cost.idle_plan()
    };
    let r = replay(&plan, Some(ready(4_000)));
    let own = step_ms(&cost, 4_000, positions(0, 4_000));
    assert!((r.joiner_finish_ms.unwrap() - own).abs() < 1e-9);
    // FCFS resumes once the loader is ready: it finishes after its ready time.
    assert!(r.finish_ms[0] > 2_000.0);
}

#[test]
fn decoding_sequences_lengthen_every_step() {
    let cost = CostModel::default();
    let idle = replay(&cost.idle_plan(), Some(ready(10_000)));
    let decoding = EnginePlan {
        decoding: 64,
        decode_context_tokens: 300_000,
        ..cost.idle_plan()
    };
    let busy = replay(&decoding, Some(ready(10_000)));
    assert!(busy.joiner_finish_ms.unwrap() > idle.joiner_finish_ms.unwrap());
}

fn worker(id: &str, load: WorkerLoad, sources: Vec<Option<Source>>) -> DenWorker {
    DenWorker::new(WorkerId::from(id), load, sources)
}

#[test]
fn v6_keeps_a_long_prompt_off_a_worker_whose_pending_request_it_would_delay() {
    let cost = CostModel::default();
    let tokens = [512u32; 40];
    let shape = Shape {
        input_tokens: 40 * 512,
        output_tokens: 16,
        block_tokens: &tokens,
    };
    // "short" has one 600-token request pending: joining it is nearly free for the new
    // request but lengthens that request's only step ~14×. "decoding" is 40 ms from the
    // end of a step in flight and decoding 8 sequences.
    let mut short = WorkerLoad::idle(cost.gpu_kv_blocks, &cost);
    short.plan.pending = vec![ready(600)];
    let mut decoding = WorkerLoad::idle(cost.gpu_kv_blocks, &cost);
    decoding.plan.decoding = 8;
    decoding.plan.decode_context_tokens = 40_000;
    decoding.plan.step_remaining_ms = 40.0;
    let workers = [
        worker("short", short, vec![Some(Source::Gpu)]),
        worker("decoding", decoding, vec![Some(Source::Gpu)]),
    ];
    let d = decide(&shape, &workers, &cost, &DenOptions::v6()).unwrap();
    assert_eq!(d.chosen.candidate.worker_id.as_str(), "decoding");
    // The shipped router's decisions come only from its router node: no study-side
    // estimate of it.
    assert_eq!(DenOptions::default(), DenOptions::router());
    assert!(decide(&shape, &workers, &cost, &DenOptions::default()).is_none());
    assert_eq!(d.imposed_ms.len(), d.ranked.len());
    assert_eq!(d.imposed_ms[0], 0.0, "nothing pending on the chosen worker");
    assert!(d.imposed_ms[1] > 200.0, "{:?}", d.imposed_ms);
    // Its own TTFT alone would have preferred "short" (no step in flight): the choice
    // is the fleet cost, and the record keeps the request's own prediction.
    assert!(d.ranked[1].estimate.ttft_ms < d.ranked[0].estimate.ttft_ms);
    // Without the marginal delay (v4) the own estimate decides.
    let mut v4_short = WorkerLoad::idle(cost.gpu_kv_blocks, &cost);
    v4_short.pending_prefill_model_ms = 0.1;
    let mut v4_decoding = WorkerLoad::idle(cost.gpu_kv_blocks, &cost);
    v4_decoding.pending_prefill_model_ms = 6.0;
    let v4_workers = [
        worker("short", v4_short, vec![Some(Source::Gpu)]),
        worker("decoding", v4_decoding, vec![Some(Source::Gpu)]),
    ];
    let d4 = decide(&shape, &v4_workers, &cost, &DenOptions::v4()).unwrap();
    assert_eq!(d4.chosen.candidate.worker_id.as_str(), "short");
}

#[test]
fn v6_queue_skips_a_pending_request_that_is_still_loading() {
    let cost = CostModel::default();
    let tokens = [512u32; 8];
    let shape = Shape {
        input_tokens: 8 * 512,
        output_tokens: 16,
        block_tokens: &tokens,
    };
    let mut load = WorkerLoad::idle(cost.gpu_kv_blocks, &cost);
    // 60 k tokens of someone else's prompt, still 3 s from ready (an object-store load).
    load.plan.pending = vec![PendingPrefill {
        ready_in_ms: 3_000.0,
        done_tokens: 0,
        input_tokens: 60_000,
    }];
    load.pending_prefill_model_ms = cost.solo_prefill_ms(0, 60_000);
    let w = worker("w", load, vec![Some(Source::Gpu); 7]);
    let v6 = priced_candidates(&shape, &w, &cost, &DenOptions::v6());
    let gpu = v6
        .iter()
        .find(|(c, _)| c.tier == Tier::Gpu && c.cached_token_count == 7 * 512)
        .unwrap();
    assert!(
        gpu.0.queue_ms < 1.0,
        "runs before the loader: {}",
        gpu.0.queue_ms
    );
    assert_eq!(gpu.1, 0.0, "and is done before the loader is ready");
    let v5 = priced_candidates(&shape, &w, &cost, &DenOptions::v5());
    let gpu5 = v5
        .iter()
        .find(|(c, _)| c.tier == Tier::Gpu && c.cached_token_count == 7 * 512)
        .unwrap();
    assert!(
        gpu5.0.queue_ms > 2_000.0,
        "v5 queues behind the pending sum"
    );
}

#[test]
fn v5_prices_the_join_from_the_reported_last_step() {
    let cost = CostModel::default();
    let tokens = [512u32; 4];
    let shape = Shape {
        input_tokens: 4 * 512,
        output_tokens: 16,
        block_tokens: &tokens,
    };
    let mut load = WorkerLoad::idle(cost.gpu_kv_blocks, &cost);
    assert_eq!(imposed_ms(&shape, 0, &load, &cost), 0.0, "nothing pending");
    // 10,192 pending tokens: a full first step, then 2,000 in the second, where both
    // requests finish.
    load.plan.pending = vec![ready(9_000), ready(1_192)];
    assert_eq!(load.plan.tail_step(), (2_000, 2));
    let one = cost.solo_prefill_ms(512, 512 + 4 * 512 - 512);
    assert!((imposed_ms(&shape, 512, &load, &cost) - 2.0 * one).abs() < 1e-9);
    // Exactly full: no room, no delay.
    load.plan.pending = vec![ready(8_192)];
    assert_eq!(imposed_ms(&shape, 0, &load, &cost), 0.0);
    load.plan.pending = vec![ready(8_000), ready(100)];
    assert_eq!(load.plan.tail_step(), (8_100, 2));
    // 92 tokens fit in the last step; both of its finishers wait for them.
    let one = cost.solo_prefill_ms(512, 512 + 92);
    assert!((imposed_ms(&shape, 512, &load, &cost) - 2.0 * one).abs() < 1e-9);
}

#[test]
fn den_records_the_delay_each_offer_would_impose() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/mooncake/conversation_trace.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("the vendored Mooncake trace");
    let head: String = text.lines().take(200).map(|l| format!("{l}\n")).collect();
    let trace = den_fleet::Trace::parse(&head).unwrap();
    let w = den_fleet::Workload::from_trace(&trace);
    let mut config = FleetConfig::new(2);
    config.explain = (0..200).collect();
    let run = run_policy(&w, &config, PolicyKind::Den);
    assert_eq!(run.decisions.len(), 200);
    for d in &run.decisions {
        assert_eq!(d.imposed_ms.len(), d.ranked.len());
        assert!(d.imposed_ms.iter().all(|x| x.is_finite() && *x >= 0.0));
    }
    assert!(
        run.decisions
            .iter()
            .any(|d| d.imposed_ms.iter().any(|&x| x > 0.0)),
        "two workers and 200 requests: some offer would have delayed someone"
    );
}

#[test]
fn v6_restores_wait_for_the_copies_of_requests_ahead_in_the_admission_queue() {
    let cost = CostModel::default();
    let tokens = [512u32; 8];
    let shape = Shape {
        input_tokens: 8 * 512,
        output_tokens: 16,
        block_tokens: &tokens,
    };
    let mut load = WorkerLoad::idle(cost.gpu_kv_blocks, &cost);
    // A request waiting for admission will copy ~61 ms of KV over PCIe first.
    load.pcie_queued_ms = 61.0;
    let w = worker("w", load, vec![Some(Source::Ram); 7]);
    let own_copy = cost.pcie_us(7 * 512 * cost.kv_bytes_per_token) as f64 / 1e3;
    let ram = |opts: &DenOptions| {
        priced_candidates(&shape, &w, &cost, opts)
            .into_iter()
            .map(|(c, _)| c)
            .find(|c| c.tier == Tier::Ram && c.cached_token_count == 7 * 512)
            .unwrap()
    };
    assert!((ram(&DenOptions::v5()).gpu_restore_ms - own_copy).abs() < 1e-9);
    let v6 = ram(&DenOptions::v6());
    assert!(
        (v6.gpu_restore_ms - own_copy - 61.0).abs() < 1e-9,
        "{}",
        v6.gpu_restore_ms
    );
}
