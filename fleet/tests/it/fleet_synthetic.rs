//! The synthetic-engine profile: den's batching scheduler at declared costs, checked on
//! hand-made timelines (every expected time below is worked out in the comments), plus
//! den's router estimate on that profile.

use den_fleet::policy::{FleetView, Policy, Route, RouteRequest};
use den_fleet::trace::BlockRequest;
use den_fleet::{
    DenOptions, FleetConfig, Heartbeats, PolicyKind, SyntheticProfile, Workload, run_policy,
    run_with, ttft_lower_bound_ms,
};
use den_protocol::engine_plan::StepCosts;

/// 0.1 ms per prefilled token, a decode step at least 1 ms (2 ms when it yields a first
/// token), 64 rows per step; 4-token blocks of 1000-byte rows; restores at 1 MB/s (4 ms
/// a block) + 0.5 ms per block.
fn profile(pool_blocks: u32) -> SyntheticProfile {
    SyntheticProfile {
        prefill_ms_per_token: 0.1,
        first_token_ms: 2.0,
        decode_ms_per_token: 1.0,
        pages: pool_blocks,
        page_size: 4,
        kv_bytes_per_token: 1000,
        ram_bytes: 1 << 20,
        ssd_bytes: 0,
        chunk_tokens: 4,
        batch_tokens: 64,
        restore_bytes_per_s: 1e6,
        restore_chunk_ms: 0.5,
        capture_bytes_per_s: 1e6,
        ssd_read_bytes_per_s: 1e6,
        measured: None,
        rates: Default::default(),
    }
}

/// (arrival µs, prompt tokens, output tokens, hash ids) at 4 tokens per block.
fn workload(requests: &[(u64, u32, u32, &[u64])]) -> Workload {
    Workload::from_blocks(
        requests
            .iter()
            .enumerate()
            .map(|(i, &(arrival_us, input, output, ids))| BlockRequest {
                arrival_us,
                input_tokens: input,
                output_tokens: output,
                hash_ids: ids,
                line: i + 1,
            }),
        4,
    )
}

/// Routes everything to worker 0, reusing what it holds, and records the queue it
/// reports at each arrival.
#[derive(Default)]
struct FirstWorker {
    queue_ms: Vec<f64>,
    waiting: Vec<u32>,
}

impl Policy for FirstWorker {
    fn name(&self) -> &'static str {
        "first-worker"
    }

    fn route(&mut self, _request: &RouteRequest, fleet: &FleetView) -> Route {
        let load = fleet.load(0);
        self.queue_ms.push(load.queue_ms);
        self.waiting.push(load.waiting);
        Route::to(0)
    }
}

fn config(pool_blocks: u32) -> FleetConfig {
    let mut c = FleetConfig::new(1);
    c.cost = profile(pool_blocks).cost_model();
    c.den = DenOptions::router();
    c
}

#[test]
fn decodes_batch_and_prompts_join_the_steps_of_others() {
    // A (t=0): 9 tokens in blocks 1,2,3, 3 out. B (t=0.5 ms): 5 tokens, 1 out.
    // C (t=10 ms): blocks 1,2 of A then its own, 10 tokens, 2 out.
    let w = workload(&[
        (0, 9, 3, &[1, 2, 3]),
        (500, 5, 1, &[4, 5]),
        (10_000, 10, 2, &[1, 2, 6]),
    ]);
    let mut policy = FirstWorker::default();
    let run = run_with(&w, &config(16), &mut policy);
    // Step 1, 0–0.8: A's processed prompt, 8 rows (B arrives meanwhile and waits for the
    // step boundary). Step 2, 0.8–2.8: A's first-token row and B's 4 prompt rows: 5 rows
    // are 0.5 ms, but a step with a first token takes 2: A's first token at 2.8. Step 3,
    // 2.8–4.8: A's next token and B's first (2 rows, a first token: 2 ms): B's first token
    // at 4.8, 4.3 after it arrived, and B is done. Step 4, 4.8–5.8: A's last token (1 ms).
    // C reuses A's resident blocks 1,2 (8 tokens): one prompt row (10–10.1), then its
    // first token (10.1–12.1): 2.1 ms.
    assert_eq!(run.ttft_us, vec![2_800, 4_300, 2_100]);
    assert_eq!(run.reused_tokens, vec![0, 0, 8]);
    assert_eq!(run.report.reused_tokens.gpu, 8);
    assert_eq!(policy.waiting, vec![0, 0, 0]);
    // Wait before the first prompt row ran: B waited for A's first step (0.3 ms).
    assert_eq!(run.wait_us, vec![0, 300, 0]);
    assert_eq!(run.report.overcommits, 0);
}

/// One worker of a 16-block pool at a real model's fitted steps (1 ms a step, 0.1 ms a
/// row, 1 µs an attention position) with `batch_tokens` rows a step.
fn measured_config(batch_tokens: u32) -> FleetConfig {
    let mut p = profile(16);
    p.batch_tokens = batch_tokens;
    p.measured = Some(StepCosts::Fitted {
        step_us: 1_000.0,
        row_us: 100.0,
        attention_us_per_position: 1.0,
        context_us_per_token: 0.0,
    });
    let mut c = config(16);
    c.cost = p.cost_model();
    c
}

#[test]
fn a_worker_at_measured_step_costs_runs_the_same_schedule_at_those_costs() {
    // The steps of a real model as its worker fitted them: 1 ms a step, 0.1 ms a row,
    // 1 µs an attention position. A (t=0): 9 tokens, 2 out. B (t=0.5 ms): 5 tokens, 1 out.
    let c = measured_config(64);
    let w = workload(&[(0, 9, 2, &[1, 2, 3]), (500, 5, 1, &[4, 5])]);
    let run = run_with(&w, &c, &mut FirstWorker::default());
    // Step 1, 0–1.828: A's 8 processed rows, 1 + 0.8 ms + 28 positions. Step 2,
    // 1.828–3.334: A's first-token row and B's 4 prompt rows (6 positions), 1 + 0.5 ms +
    // 6 µs: A's first token at 3.334. Step 3, 3.334–4.534: A's last token and B's
    // first-token row, 1 + 0.2 ms: B's first token 4.034 after it arrived. No declared
    // first-token floor: the fit has none.
    assert_eq!(run.ttft_us, vec![3_334, 4_034]);
}

#[test]
fn the_lower_bound_is_a_lone_request_in_the_engines_steps() {
    // A measured engine with a per-step floor (1 ms a step, 0.1 ms a row, 1 µs an
    // attention position) and 4-row steps. A lone 9-token request prefills 8 prompt rows
    // in two steps, 1 + 0.4 ms + 6 positions and 1 + 0.4 ms + 22 positions, then its
    // first-token row (1.1 ms): 3.928 ms. Two such requests far apart, sharing nothing,
    // each take exactly that, so the mean is the lower bound; one step for the whole
    // prompt (1 + 0.8 ms + 28 µs, then 1.1) would claim 2.928 ms, which no policy reaches.
    let c = measured_config(4);
    let w = workload(&[(0, 9, 2, &[1, 2, 3]), (100_000, 9, 2, &[4, 5, 6])]);
    let run = run_with(&w, &c, &mut FirstWorker::default());
    assert_eq!(run.ttft_us, vec![3_928, 3_928]);
    assert!((c.cost.alone_ttft_ms(0, 9) - 3.928).abs() < 1e-9);
    let bound = ttft_lower_bound_ms(&w, &c.cost);
    assert!((bound - 3.928).abs() < 1e-9, "{bound}");
    let one_step = c.cost.solo_prefill_ms(0, 8) + c.cost.first_token_ms();
    assert!((one_step - 2.928).abs() < 1e-9, "{one_step}");
    // Reuse shortens it by whole steps: 4 tokens reused leave one step of 4 rows.
    assert!((c.cost.alone_ttft_ms(4, 9) - (1.422 + 1.1)).abs() < 1e-9);
}

#[test]
fn a_prefix_evicted_from_the_pool_is_restored_from_ram_first() {
    // A pool of 4 blocks. A (t=0, blocks 1,2,3) completes at 4.8 ms and is checkpointed
    // into RAM. E (t=20 ms) needs all 4 blocks: A's three are evicted (RAM already holds
    // them). F (t=40 ms) wants A's blocks 1,2 back: a restore of 2 blocks (4 ms of bytes
    // + 0.5 ms each = 9 ms, 40–49), one prompt row (49–49.1), its first token in the next
    // step (2 ms): 51.1 ms, 11.1 after it arrived.
    let w = workload(&[
        (0, 9, 3, &[1, 2, 3]),
        (20_000, 13, 3, &[7, 8, 9, 10]),
        (40_000, 10, 2, &[1, 2, 11]),
    ]);
    let mut policy = FirstWorker::default();
    let run = run_with(&w, &config(4), &mut policy);
    // A: 8 prompt rows (0.8 ms) + a first-token step (2); E: 12 rows (1.2 ms) + 2.
    assert_eq!(run.ttft_us, vec![2_800, 3_200, 11_100]);
    assert_eq!(run.reused_tokens, vec![0, 0, 8]);
    let r = &run.report;
    assert_eq!((r.reused_tokens.gpu, r.reused_tokens.ram), (0, 8));
    assert_eq!(r.tiers.ram_to_gpu_bytes, 8 * 1000);
    assert!(r.tiers.gpu_evictions >= 3, "{:?}", r.tiers);
    assert_eq!(r.overcommits, 0);
}

#[test]
fn den_predicts_from_the_replayed_plan() {
    // The workload of the batching test under den's router estimate on one worker: den
    // picks the same plans (C reuses the resident prefix), so the TTFTs are the same. Its
    // predictions replay the reported plan (prefill of the prompt, 0.1 ms a row) and add
    // the first-token cost: A 0.9 + 2 = 2.9 (measured 2.8: the last prompt token is the
    // first-token step's row), B after A's pending prefill 0.3 + 0.5 + 2 = 2.8 (measured
    // 4.3: the replay does not know A's first token will set the floor of B's steps), C
    // 0.2 + 2 = 2.2 (measured 2.1).
    let w = workload(&[
        (0, 9, 3, &[1, 2, 3]),
        (500, 5, 1, &[4, 5]),
        (10_000, 10, 2, &[1, 2, 6]),
    ]);
    let run = run_policy(&w, &config(16), PolicyKind::Den);
    assert_eq!(run.ttft_us, vec![2_800, 4_300, 2_100]);
    assert_eq!(run.reused_tokens, vec![0, 0, 8]);
    let predicted: Vec<f64> = run.predicted_ttft_ms.iter().map(|p| p.unwrap()).collect();
    for (got, want) in predicted.iter().zip([2.9, 2.8, 2.2]) {
        assert!((got - want).abs() < 1e-6, "{predicted:?}");
    }
}

#[test]
fn a_router_that_counts_its_own_work_spreads_a_burst_between_heartbeats() {
    // Two 9-token requests at the same instant on two idle workers. With current loads
    // den sends the second to the other worker (the first one's work queues there). With
    // heartbeat-lagged loads both workers still look idle in their heartbeats, but the
    // router adds the 2.9 ms (0.9 of prefill in the replay + 2 for the first-token step)
    // it just sent w00 to every w00 candidate's queue, so the second request goes to w01
    // as well: the same placement and TTFTs as with current loads, both predicted from
    // the idle heartbeats.
    let w = workload(&[(0, 9, 3, &[1, 2, 3]), (0, 9, 3, &[4, 5, 6])]);
    let mut fresh = config(16);
    fresh.workers = 2;
    let run = run_policy(&w, &fresh, PolicyKind::Den);
    assert_eq!(run.worker, vec![0, 1]);
    assert_eq!(run.ttft_us, vec![2_800, 2_800]);

    let mut lagged = fresh.clone();
    lagged.heartbeats = Some(Heartbeats::den(1_000));
    let run = run_policy(&w, &lagged, PolicyKind::Den);
    assert_eq!(run.worker, vec![0, 1]);
    assert_eq!(run.ttft_us, vec![2_800, 2_800]);
    for p in &run.predicted_ttft_ms {
        assert!(
            (p.unwrap() - 2.9).abs() < 1e-9,
            "{:?}",
            run.predicted_ttft_ms
        );
    }

    // Three at once on two workers: the third sees 2.9 ms counted on each worker and
    // queues behind one of them: predicted 2.9 + 2.9 = 5.8, its first token later than
    // the others'.
    let w = workload(&[
        (0, 9, 3, &[1, 2, 3]),
        (0, 9, 3, &[4, 5, 6]),
        (0, 9, 3, &[7, 8, 9]),
    ]);
    let run = run_policy(&w, &lagged, PolicyKind::Den);
    assert_eq!(run.worker[..2], [0, 1]);
    let third = run.predicted_ttft_ms[2].unwrap();
    assert!((third - 5.8).abs() < 1e-9, "{:?}", run.predicted_ttft_ms);
    assert!(run.ttft_us[2] > 2_800, "{:?}", run.ttft_us);
}

#[test]
fn heartbeats_report_the_plan_as_of_when_they_were_sent() {
    // A at 0 on w00: its 8 prompt rows run 0–0.8 ms, its first-token row 0.8–2.8. B
    // arrives at 1 ms, mid-step: with current loads the plan shows A decoding; with
    // heartbeats every second the router still holds the idle plan of the heartbeat at 0.
    let w = workload(&[(0, 9, 3, &[1, 2, 3]), (1_000, 5, 1, &[4, 5])]);
    let mut c = config(16);
    let mut fresh = PlanSeen::default();
    run_with(&w, &c, &mut fresh);
    assert_eq!(fresh.seen, vec![(0, 0), (0, 1)]);
    c.heartbeats = Some(Heartbeats::den(1_000));
    let mut lagged = PlanSeen::default();
    run_with(&w, &c, &mut lagged);
    assert_eq!(lagged.seen, vec![(0, 0), (0, 0)]);
}

/// Routes everything to worker 0 and records its plan at each arrival: (pending
/// prefills, decoding sequences).
#[derive(Default)]
struct PlanSeen {
    seen: Vec<(usize, u32)>,
}

impl Policy for PlanSeen {
    fn name(&self) -> &'static str {
        "plan-seen"
    }

    fn route(&mut self, _request: &RouteRequest, fleet: &FleetView) -> Route {
        let plan = fleet.load(0).plan;
        self.seen.push((plan.pending.len(), plan.decoding));
        Route::to(0)
    }
}

#[test]
fn a_lagged_router_ledgers_offered_and_finished_work_as_den_agents_router_does() {
    // A: 400 prompt tokens (40 ms of prefill) and 2 out on w00, which the router says
    // adds 10 ms; probes of one token every millisecond on w01 record what the router
    // holds for w00 beyond its last heartbeat (heartbeats every 10 ms, w00's at 10, 20,
    // …). Expected, in order: +10 until the heartbeat at 10 ms counts A; 0 while A runs;
    // −10 from A's completion (that heartbeat's plan still shows A) until w00's next
    // heartbeat; 0 after. den_protocol's `Unreflected`, the router's own ledger.
    let a_blocks: Vec<u64> = (1..=100).collect();
    let probes: Vec<Vec<u64>> = (0..80u64).map(|i| vec![1_000 + i]).collect();
    let mut requests: Vec<(u64, u32, u32, &[u64])> = vec![(0, 400, 2, &a_blocks)];
    for (i, p) in probes.iter().enumerate() {
        requests.push((1_000 * (i as u64 + 1) + 500, 1, 1, p));
    }
    let w = workload(&requests);
    let mut c = config(256);
    c.workers = 2;
    c.heartbeats = Some(Heartbeats::den(10));
    let mut ledger = Ledger::default();
    let run = run_with(&w, &c, &mut ledger);
    let first_ms = run.ttft_us[0] as f64 / 1000.0;
    assert!(
        first_ms > 40.0 && first_ms < 75.0,
        "A's first token at {first_ms} ms"
    );
    // Collapse runs of equal values: the phases in order.
    let mut phases: Vec<f64> = Vec::new();
    for &(_, extra) in &ledger.seen {
        if phases.last() != Some(&extra) {
            phases.push(extra);
        }
    }
    assert_eq!(phases, vec![10.0, 0.0, -10.0, 0.0], "{:?}", ledger.seen);
    let first_negative = ledger.seen.iter().find(|(_, e)| *e < 0.0).map(|(t, _)| *t);
    // It completes a decode step after its first token.
    assert!(
        first_negative.is_some_and(|t| t > first_ms),
        "{:?}",
        ledger.seen
    );
}

/// Sends the first request to w00 with 10 ms of offered work and every other to w01,
/// recording (arrival ms, w00's unreflected work) at each.
#[derive(Default)]
struct Ledger {
    seen: Vec<(f64, f64)>,
}

impl Policy for Ledger {
    fn name(&self) -> &'static str {
        "ledger"
    }

    fn route(&mut self, request: &RouteRequest, fleet: &FleetView) -> Route {
        if request.index == 0 {
            let mut r = Route::to(0);
            r.added_work_ms = Some(10.0);
            return r;
        }
        self.seen
            .push((fleet.now as f64 / 1000.0, fleet.load(0).unreflected_ms));
        Route::to(1)
    }
}

#[test]
fn a_lower_tier_reuse_restores_the_whole_prefix_as_dens_worker_does() {
    // A (t=0, blocks 1,2,3) completes at 4.8 ms, checkpointed into RAM and still resident
    // in the pool. C (t=10 ms) reuses blocks 1,2. As a GPU reuse it takes them as they are
    // (2.1 ms, as in the first test). As a RAM reuse — what den's worker does with a
    // lower-tier alternative — it restores both from RAM although they are resident:
    // 2 blocks over PCIe (4 ms of bytes + 0.5 ms each = 9 ms, 10–19), one prompt row
    // (19–19.1), its first token (19.1–21.1): 11.1 ms.
    use den_fleet::worker::Reuse;
    let w = workload(&[(0, 9, 3, &[1, 2, 3]), (10_000, 10, 2, &[1, 2, 6])]);
    let c = config(16);
    let mut gpu = WithReuse(Reuse::Blocks(2));
    let run = run_with(&w, &c, &mut gpu);
    assert_eq!(run.ttft_us[1], 2_100);
    assert_eq!(run.report.reused_tokens.gpu, 8);
    let mut restore = WithReuse(Reuse::Restore {
        resident: 0,
        blocks: 2,
    });
    let run = run_with(&w, &c, &mut restore);
    assert_eq!(run.report.reused_tokens.gpu, 0);
    assert_eq!(run.report.reused_tokens.ram, 8);
    assert_eq!(run.ttft_us[1], 11_100);
    // Forking the resident head (block 1) and restoring only block 2: one block over
    // PCIe (4.5 ms, 10–14.5), the prompt row, the first token: 6.6 ms.
    let mut mixed = WithReuse(Reuse::Restore {
        resident: 1,
        blocks: 2,
    });
    let run = run_with(&w, &c, &mut mixed);
    assert_eq!(run.report.reused_tokens.gpu, 4);
    assert_eq!(run.report.reused_tokens.ram, 4);
    assert_eq!(run.ttft_us[1], 6_600);
}

/// Routes everything to worker 0 with one reuse plan.
struct WithReuse(den_fleet::worker::Reuse);

impl Policy for WithReuse {
    fn name(&self) -> &'static str {
        "with-reuse"
    }

    fn route(&mut self, _request: &RouteRequest, _fleet: &FleetView) -> Route {
        let mut r = Route::to(0);
        r.reuse = self.0;
        r
    }
}

#[test]
fn the_router_node_holds_what_no_pool_can_hold_now_until_the_pages_free() {
    // One worker, a 4-page pool (16 tokens). A (t=0): 13 tokens + 3 out holds all 4
    // pages while it decodes. B (t=0.1 ms): 9 + 3 needs 3 pages, none free and nothing
    // evictable: den-agent's router node makes no offer now, and B waits in the node
    // (FCFS) instead of being refused. A's result and the worker's next heartbeat show
    // the pages free, and the node offers B then, not a second later as a refused
    // client's retry would. B's TTFT counts from its arrival.
    let w = workload(&[(0, 13, 3, &[1, 2, 3, 4]), (100, 9, 3, &[5, 6, 7])]);
    let run = run_policy(&w, &config(4), PolicyKind::Den);
    assert_eq!(run.report.refused_requests, 0, "{:?}", run.report);
    assert_eq!(run.report.waited_requests, 1, "{:?}", run.report);
    assert_eq!(run.report.gave_up, 0);
    assert!(run.ttft_us[0] < 10_000, "{:?}", run.ttft_us);
    assert!(
        run.ttft_us[1] > run.ttft_us[0] && run.ttft_us[1] < 100_000,
        "B starts once A is done: {:?}",
        run.ttft_us
    );
    assert!(run.report.mean_wait_ms > 0.0);
    assert_eq!(run.report.overcommits, 0);
}

#[test]
fn the_router_node_refuses_what_no_pool_could_ever_hold_and_the_client_retries() {
    // One worker, a 4-page pool; B needs 5 pages (17 tokens + 3 out): waiting would never
    // help, so the node refuses it (503, Retry-After: 1) every time its client retries,
    // until the replay gives up and sends it to the least-loaded worker.
    let w = workload(&[(0, 5, 3, &[1, 2]), (100, 17, 3, &[5, 6, 7, 8, 9])]);
    let run = run_policy(&w, &config(4), PolicyKind::Den);
    assert_eq!(run.report.waited_requests, 0, "{:?}", run.report);
    assert_eq!(run.report.refused_requests, 1, "{:?}", run.report);
    assert_eq!(
        run.report.client_retries,
        u64::from(den_fleet::replay::MAX_CLIENT_RETRIES) + 1
    );
    assert_eq!(run.report.gave_up, 1);
}

#[test]
fn dens_row_is_the_router_node_itself_fed_by_the_simulated_workers_frames() {
    // Two workers; C repeats A's prefix after A is done. Every decision the replay
    // carries out is one den-agent's RouterNode made: the node holds a decision record
    // per request whose one attempt names the worker the request ran on and the prefix it
    // reused, each request completed at the node (the workers' result frames), and C's
    // record shows the resident prefix the heartbeats advertised.
    use den_fleet::DenPolicy;
    use den_protocol::candidate::Tier;
    use den_protocol::ids::RequestId;
    let w = workload(&[
        (0, 13, 3, &[1, 2, 3, 4]),
        (100, 9, 2, &[5, 6, 7]),
        (50_000, 17, 2, &[1, 2, 3, 8, 9]),
    ]);
    let mut c = config(16);
    c.workers = 2;
    let mut policy = DenPolicy::new(DenOptions::router());
    let run = run_with(&w, &c, &mut policy);
    let node = policy.node().expect("den's router node routed the replay");
    for (i, worker) in run.worker.iter().enumerate() {
        let record = node
            .router()
            .record(&RequestId::new(format!("r{i}")))
            .unwrap_or_else(|| panic!("no decision record for request {i}"));
        assert_eq!(record.attempts.len(), 1, "{record:?}");
        let attempt = &record.attempts[0];
        assert_eq!(
            attempt.worker.as_str(),
            format!("w{worker:02}"),
            "{record:?}"
        );
        assert_eq!(attempt.cached_tokens, run.reused_tokens[i], "{record:?}");
        assert!(
            record.outcome.is_some(),
            "request {i} never completed at the node"
        );
    }
    for w in 0..2 {
        let id = den_fleet::policy::FleetView::worker_id(w);
        assert_eq!(node.router().in_flight_on(&id).count(), 0, "{id:?}");
    }
    // C went where A's 12 prefix tokens were resident and reused them from the GPU.
    assert_eq!(run.worker[2], run.worker[0]);
    let c_record = node.router().record(&RequestId::new("r2")).unwrap();
    assert_eq!(c_record.attempts[0].tier, Tier::Gpu);
    assert_eq!(run.reused_tokens[2], 12);
}
