//! The synthetic-engine profile: one operation at a time in FIFO order, checked on
//! hand-made timelines (every expected time below is worked out in the comments), plus
//! den's router estimate on that profile.

use den_fleet::policy::{FleetView, Policy, Route, RouteRequest};
use den_fleet::trace::BlockRequest;
use den_fleet::{
    DenOptions, FleetConfig, Heartbeats, PolicyKind, SyntheticProfile, Workload, run_policy,
    run_with,
};

/// 0.1 ms per prefilled token, 2 ms to the first token, 1 ms per further token; 4-token
/// blocks of 1000-byte rows; restores at 1 MB/s (4 ms a block) + 0.5 ms per block,
/// captures at 1 MB/s.
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
        restore_bytes_per_s: 1e6,
        restore_chunk_ms: 0.5,
        capture_bytes_per_s: 1e6,
        ssd_read_bytes_per_s: 1e6,
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
fn operations_run_one_at_a_time_in_fifo_order() {
    // A (t=0): 9 tokens in blocks 1,2,3 → prefills 8 (0.8 ms), decodes 3 tokens (4 ms).
    // B (t=0.5 ms): 5 tokens → prefills 4 (0.4 ms), decodes 1 (2 ms).
    // C (t=10 ms): blocks 1,2 of A then its own: reuses 8 resident tokens, prefills 1.
    let w = workload(&[
        (0, 9, 3, &[1, 2, 3]),
        (500, 5, 1, &[4, 5]),
        (10_000, 10, 2, &[1, 2, 6]),
    ]);
    let mut policy = FirstWorker::default();
    let run = run_with(&w, &config(16), &mut policy);
    // 0–0.8 A prefill; B's prefill was queued at 0.5, so it runs 0.8–1.2 before A's
    // decode (queued at 0.8); A decodes 1.2–5.2: first token at 3.2 ms.
    // B's decode was queued at 1.2, behind A's: 5.2–7.2, first token at 7.2 (6.7 after
    // it arrived). A's capture (9 tokens × 1000 B at 1 MB/s = 9 ms) was queued at 5.2,
    // B's (5 ms) at 7.2: they run 7.2–16.2 and 16.2–21.2.
    // C reuses A's resident blocks 1,2 (8 tokens) and prefills 1 token behind both
    // captures: 21.2–21.3, decode 21.3–24.3, first token at 23.3 (13.3 after arrival).
    assert_eq!(run.ttft_us, vec![3_200, 6_700, 13_300]);
    assert_eq!(run.reused_tokens, vec![0, 0, 8]);
    assert_eq!(run.report.reused_tokens.gpu, 8);
    // What the worker reported: at 0.5 ms, 0.3 ms of A's prefill left plus the 4 ms
    // decode A will queue after it (as den's worker counts what accepted requests will
    // still queue); at 10 ms, 6.2 ms of A's capture and all of B's (5 ms).
    assert_eq!(policy.queue_ms.len(), 3);
    for (got, want) in policy.queue_ms.iter().zip([0.0, 4.3, 11.2]) {
        assert!((got - want).abs() < 1e-9, "{:?}", policy.queue_ms);
    }
    assert_eq!(policy.waiting, vec![0, 0, 0]);
    // Wait before the first operation started: B waited 0.3 ms, C 11.2 ms.
    assert_eq!(run.wait_us, vec![0, 300, 11_200]);
    assert_eq!(run.report.overcommits, 0);
}

#[test]
fn a_prefix_evicted_from_the_pool_is_restored_from_ram_first() {
    // A pool of 4 blocks. A (t=0, blocks 1,2,3) completes at 4.8 ms and is captured into
    // RAM 4.8–13.8 ms. E (t=20 ms) needs all 4 blocks: A's three are evicted (RAM
    // already holds them). F (t=40 ms) wants A's blocks 1,2 back: a restore of 2 blocks
    // (4 ms of bytes + 0.5 ms each = 9 ms, 40–49), a prefill of 1 token (49–49.1), the
    // first token 2 ms later: 51.1 ms, 11.1 after it arrived.
    let w = workload(&[
        (0, 9, 3, &[1, 2, 3]),
        (20_000, 13, 3, &[7, 8, 9, 10]),
        (40_000, 10, 2, &[1, 2, 11]),
    ]);
    let mut policy = FirstWorker::default();
    let run = run_with(&w, &config(4), &mut policy);
    // A: 0.8 prefill + 2; E: 12 tokens (1.2 ms) + 2; E's capture (13 ms) ran 25.2–38.2.
    assert_eq!(run.ttft_us, vec![2_800, 3_200, 11_100]);
    assert_eq!(run.reused_tokens, vec![0, 0, 8]);
    let r = &run.report;
    assert_eq!((r.reused_tokens.gpu, r.reused_tokens.ram), (0, 8));
    assert_eq!(r.tiers.ram_to_gpu_bytes, 8 * 1000);
    assert!(r.tiers.gpu_evictions >= 3, "{:?}", r.tiers);
    assert_eq!(r.overcommits, 0);
}

#[test]
fn den_predicts_the_reported_queue_plus_its_own_work() {
    // The workload of the FIFO test under den's router estimate on one worker: den picks
    // the same plans (C reuses the resident prefix), so the TTFTs are the same, and its
    // predictions are queue + restore + prefill + first token as reported at arrival:
    // A 0 + 0.8 + 2 = 2.8 (measured 3.2: B's prefill ran in between), B (0.3 of A's
    // prefill + A's 4 ms decode still to queue) + 0.4 + 2 = 6.7 (exact: A's decode ran
    // first), C 11.2 + 0.1 + 2 = 13.3 (exact).
    let w = workload(&[
        (0, 9, 3, &[1, 2, 3]),
        (500, 5, 1, &[4, 5]),
        (10_000, 10, 2, &[1, 2, 6]),
    ]);
    let run = run_policy(&w, &config(16), PolicyKind::Den);
    assert_eq!(run.ttft_us, vec![3_200, 6_700, 13_300]);
    let predicted: Vec<f64> = run.predicted_ttft_ms.iter().map(|p| p.unwrap()).collect();
    for (got, want) in predicted.iter().zip([2.8, 6.7, 13.3]) {
        assert!((got - want).abs() < 1e-9, "{predicted:?}");
    }
}

#[test]
fn a_router_that_counts_its_own_work_spreads_a_burst_between_heartbeats() {
    // Two 9-token requests at the same instant on two idle workers. With current loads
    // den sends the second to the other worker (the first one's work queues there). With
    // heartbeat-lagged loads both workers still look idle in their heartbeats, but the
    // router adds the 2.8 ms (0.8 prefill + 2 first token) it just sent w00 to w00's
    // reported queue, so the second request goes to w01 as well: the same placement and
    // TTFTs as with current loads, both predicted from the idle heartbeats.
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
            (p.unwrap() - 2.8).abs() < 1e-9,
            "{:?}",
            run.predicted_ttft_ms
        );
    }

    // Three at once on two workers: the third sees 2.8 ms counted on each worker and
    // queues behind one of them: predicted 2.8 + 2.8 = 5.6, its first token later than
    // the others'.
    let w = workload(&[
        (0, 9, 3, &[1, 2, 3]),
        (0, 9, 3, &[4, 5, 6]),
        (0, 9, 3, &[7, 8, 9]),
    ]);
    let run = run_policy(&w, &lagged, PolicyKind::Den);
    assert_eq!(run.worker[..2], [0, 1]);
    let third = run.predicted_ttft_ms[2].unwrap();
    assert!((third - 5.6).abs() < 1e-9, "{:?}", run.predicted_ttft_ms);
    assert!(run.ttft_us[2] > 2_800, "{:?}", run.ttft_us);
}

#[test]
fn heartbeats_report_the_queue_as_of_when_they_were_sent() {
    // A at 0 on w00 (0.8 ms prefill, 4 ms decode, done at 4.8, its 9 ms capture 4.8–13.8).
    // The completion triggers an eager heartbeat 5 ms later (9.8): it reports 4 ms of
    // capture left. B arriving at 12 ms is priced with that report (queue 4 ms), not with
    // the 1.8 ms really left; a periodic heartbeat at 1 s changes nothing before.
    let w = workload(&[(0, 9, 3, &[1, 2, 3]), (12_000, 5, 1, &[4, 5])]);
    let mut c = config(16);
    c.heartbeats = Some(Heartbeats::den(1_000));
    let mut policy = FirstWorker::default();
    run_with(&w, &c, &mut policy);
    assert_eq!(policy.queue_ms.len(), 2);
    assert_eq!(policy.queue_ms[0], 0.0);
    assert!(
        (policy.queue_ms[1] - 4.0).abs() < 1e-9,
        "{:?}",
        policy.queue_ms
    );
}
