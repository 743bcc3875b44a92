//! The replay end to end: determinism, a slice of the real Mooncake trace through every
//! policy, decision records, and the report formats.

use std::collections::BTreeSet;

use den_fleet::{
    FleetConfig, FleetReport, PolicyKind, Trace, Workload, compare, report, run_policy,
    ttft_lower_bound_ms,
};

/// The first `n` requests of the vendored conversation trace.
fn mooncake_slice(n: usize) -> Workload {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/mooncake/conversation_trace.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("the vendored Mooncake trace");
    let head: String = text.lines().take(n).map(|l| format!("{l}\n")).collect();
    Workload::from_trace(&Trace::parse(&head).expect("valid trace lines"))
}

#[test]
fn the_same_input_gives_the_same_result_byte_for_byte() {
    let w = mooncake_slice(300);
    let mut config = FleetConfig::new(4);
    config.explain = [3, 50, 299].into_iter().collect();
    for kind in PolicyKind::ALL {
        let a = serde_json::to_string(&run_policy(&w, &config, kind)).unwrap();
        let b = serde_json::to_string(&run_policy(&w, &config, kind)).unwrap();
        assert_eq!(a, b, "{kind}");
    }
    let a = serde_json::to_string(&compare(&w, &config, &PolicyKind::ALL)).unwrap();
    let b = serde_json::to_string(&compare(&w, &config, &PolicyKind::ALL)).unwrap();
    assert_eq!(a, b);
}

#[test]
fn a_slice_of_the_real_trace_gives_sane_metrics_for_every_policy() {
    let w = mooncake_slice(800);
    let config = FleetConfig::new(4);
    let bound = ttft_lower_bound_ms(&w, &config.cost);
    let summary = w.summary();
    let kv = config.cost.kv_bytes_per_token;
    for kind in PolicyKind::ALL {
        let run = run_policy(&w, &config, kind);
        let r = &run.report;
        assert_eq!(r.policy, kind.as_str());
        assert_eq!((r.requests, run.ttft_us.len()), (800, 800));
        assert!(
            run.ttft_us.iter().all(|&t| t > 0),
            "{kind}: every request got a first token"
        );
        let t = &r.ttft_ms;
        assert!(
            t.p50 <= t.p90 && t.p90 <= t.p99 && t.p99 <= t.max,
            "{kind}: {t:?}"
        );
        assert!(
            t.mean >= bound * 0.999,
            "{kind}: mean {} below the lower bound {bound}",
            t.mean
        );
        assert!(
            r.prefix_hit_rate > 0.0 && r.prefix_hit_rate <= summary.ideal_hit_rate + 1e-9,
            "{kind}"
        );
        assert_eq!(
            r.tokens_recomputed + r.reused_tokens.total(),
            r.prompt_tokens
        );
        assert!(r.throughput.requests_per_s > 0.0 && r.throughput.output_tokens_per_s > 0.0);
        // Every reused block from below the GPU crossed PCIe; SSD and object reads match
        // their share of reuse exactly; every prefilled block was uploaded once.
        let below = r.reused_tokens.ram + r.reused_tokens.ssd + r.reused_tokens.object;
        assert_eq!(r.tiers.ram_to_gpu_bytes, below * kv, "{kind}");
        assert_eq!(r.tiers.ssd_read_bytes, r.reused_tokens.ssd * kv, "{kind}");
        assert_eq!(
            r.tiers.object_read_bytes,
            r.reused_tokens.object * kv,
            "{kind}"
        );
        assert!(r.tiers.object_write_bytes > 0);
        let routed: u32 = r.load_spread.requests_per_worker.iter().sum();
        assert_eq!(routed, 800);
        assert!(r.load_spread.requests_max_over_mean >= 1.0);
        assert_eq!(r.prediction.is_some(), kind == PolicyKind::Den);
    }
}

#[test]
fn den_records_its_decisions_with_the_measured_outcome() {
    let w = mooncake_slice(400);
    let mut config = FleetConfig::new(4);
    config.explain = [10, 200, 399].into_iter().collect::<BTreeSet<_>>();
    let run = run_policy(&w, &config, PolicyKind::Den);
    let requests: Vec<usize> = run.decisions.iter().map(|d| d.request).collect();
    assert_eq!(requests, vec![10, 200, 399]);
    for d in &run.decisions {
        assert_eq!(d.ranked.first(), Some(&d.chosen));
        let ids: BTreeSet<_> = d
            .ranked
            .iter()
            .map(|s| s.candidate.worker_id.clone())
            .collect();
        assert_eq!(ids.len(), d.ranked.len(), "one best candidate per worker");
        // Ranked by what the router minimises: own TTFT plus the delay imposed on the
        // worker's pending requests (`fleet_cost_ms`), not by TTFT alone.
        assert!(
            d.ranked
                .windows(2)
                .all(|p| p[0].cost_ms() <= p[1].cost_ms())
        );
        let measured = d.measured_ttft_ms.unwrap();
        assert_eq!(measured, run.ttft_us[d.request] as f64 / 1000.0);
        assert_eq!(
            run.predicted_ttft_ms[d.request],
            Some(d.chosen.estimate.ttft_ms)
        );
        let worker = d
            .chosen
            .candidate
            .worker_id
            .as_str()
            .trim_start_matches('w')
            .parse::<u32>()
            .unwrap();
        assert_eq!(run.worker[d.request], worker);
    }
    // Baselines make no predictions and keep no records.
    let dynamo = run_policy(&w, &config, PolicyKind::Dynamo);
    assert!(dynamo.decisions.is_empty() && dynamo.predicted_ttft_ms.iter().all(Option::is_none));
}

#[test]
fn the_report_prints_one_table_and_round_trips_as_json() {
    let w = mooncake_slice(200);
    let config = FleetConfig::new(2);
    let runs: Vec<_> = [PolicyKind::Den, PolicyKind::Sglang]
        .into_iter()
        .map(|k| run_policy(&w, &config, k).report)
        .collect();
    let fleet = report(&w, &config, runs);
    let table = fleet.table();
    for needle in [
        "den ",
        "sglang ",
        "TTFT ms",
        "p99",
        "hit%",
        "evict",
        "lower bound",
    ] {
        assert!(table.contains(needle), "missing {needle:?} in\n{table}");
    }
    let (best, x) = fleet.den_speedup().unwrap();
    assert_eq!(best, "sglang");
    assert!(x > 0.0);
    let json = serde_json::to_string(&fleet).unwrap();
    let back: FleetReport = serde_json::from_str(&json).unwrap();
    // Equal up to float parsing (serde_json parses floats to within an ulp or so).
    assert_eq!(back.policies.len(), 2);
    for (a, b) in back.policies.iter().zip(&fleet.policies) {
        assert_eq!(
            (&a.policy, a.requests, a.reused_tokens, a.tiers),
            (&b.policy, b.requests, b.reused_tokens, b.tiers)
        );
        assert!((a.ttft_ms.mean - b.ttft_ms.mean).abs() < 1e-6);
    }
    assert_eq!(back.cost, fleet.cost);
}
