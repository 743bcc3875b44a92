//! Replays a Mooncake-format trace through the routing policies and prints one table per
//! fleet size (what `den-agent simulate` will wrap).
//!
//! ```text
//! cargo run --release -p den-protocol --example fleet -- \
//!     [--trace tests/fixtures/mooncake/conversation_trace.jsonl] [--workers 4,8,16] \
//!     [--policies all|den,dynamo,...] [--limit N] [--json] [--explain K] \
//!     [--den v1|v2|v3|v4] [--no-object-store]
//! ```
//! - `--explain K` prints den's decision records for the K requests where den beat the
//!   best other policy by the most and the K where it lost by the most.
//! - `--den vN` selects one of the iteration steps of den's policy (default: latest).
//! - `--no-object-store` removes the shared object store tier (local tiers only).

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::Instant;

use den_protocol::fleet::{
    DenOptions, FleetConfig, PolicyKind, PolicyRun, Trace, Workload, parse_policies, report,
    run_policy,
};

struct Args {
    trace: String,
    workers: Vec<usize>,
    policies: Vec<PolicyKind>,
    limit: Option<usize>,
    json: bool,
    explain: usize,
    den: DenOptions,
    object_store: bool,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let text = std::fs::read_to_string(&args.trace)
        .map_err(|e| format!("cannot read {}: {e}", args.trace))?;
    let mut trace = Trace::parse(&text).map_err(|e| e.to_string())?;
    if let Some(n) = args.limit {
        trace = trace.truncated(n);
    }
    let workload = Workload::from_trace(&trace);
    let mut reports = Vec::new();
    for &n in &args.workers {
        let mut config = FleetConfig::new(n);
        config.den = args.den.clone();
        if !args.object_store {
            config.cost.object_store = None;
        }
        let started = Instant::now();
        let runs = run_all(&workload, &config, &args.policies);
        let elapsed = started.elapsed();
        let fleet = report(
            &workload,
            &config,
            runs.iter().map(|r| r.report.clone()).collect(),
        );
        if args.json {
            reports.push(fleet);
            continue;
        }
        println!("{}", fleet.table());
        breakdown(&workload, &config, &runs);
        println!(
            "({} policies replayed in {:.1} s wall)\n",
            runs.len(),
            elapsed.as_secs_f64()
        );
        if args.explain > 0 {
            explain(&workload, &config, &runs, args.explain);
        }
    }
    if args.json {
        let s = serde_json::to_string_pretty(&reports).map_err(|e| e.to_string())?;
        println!("{s}");
    }
    Ok(())
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        trace: "tests/fixtures/mooncake/conversation_trace.jsonl".into(),
        workers: vec![8],
        policies: PolicyKind::ALL.to_vec(),
        limit: None,
        json: false,
        explain: 0,
        den: DenOptions::default(),
        object_store: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--trace" => args.trace = value()?,
            "--workers" => {
                args.workers = value()?
                    .split(',')
                    .map(|w| w.trim().parse().map_err(|e| format!("--workers {w}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--policies" => args.policies = parse_policies(&value()?).map_err(|e| e.to_string())?,
            "--limit" => args.limit = Some(value()?.parse().map_err(|e| format!("--limit: {e}"))?),
            "--explain" => {
                args.explain = value()?.parse().map_err(|e| format!("--explain: {e}"))?
            }
            "--den" => {
                let v = value()?;
                args.den = DenOptions::preset(&v)
                    .ok_or_else(|| format!("--den {v}: use v1, v2, v3, v4 or latest"))?
            }
            "--no-object-store" => args.object_store = false,
            "--json" => args.json = true,
            other => {
                return Err(format!(
                    "unknown argument {other}; see the example's doc comment"
                ));
            }
        }
    }
    Ok(args)
}

/// Runs the policies on two threads (the project machine has two cores).
fn run_all(workload: &Workload, config: &FleetConfig, policies: &[PolicyKind]) -> Vec<PolicyRun> {
    let mut slots: Vec<Option<PolicyRun>> = vec![None; policies.len()];
    std::thread::scope(|s| {
        let (even, odd): (Vec<_>, Vec<_>) = slots
            .iter_mut()
            .zip(policies)
            .enumerate()
            .partition(|(i, _)| i % 2 == 0);
        for half in [even, odd] {
            s.spawn(move || {
                for (_, (slot, &kind)) in half {
                    *slot = Some(run_policy(workload, config, kind));
                }
            });
        }
    });
    slots.into_iter().flatten().collect()
}

/// Splits each policy's mean TTFT into the request's own prefill (alone on an idle GPU,
/// with the reuse it got), the wait before its prefill began, and the slowdown while
/// prefilling (sharing steps with other requests).
fn breakdown(workload: &Workload, config: &FleetConfig, runs: &[PolicyRun]) {
    let n = workload.requests.len().max(1) as f64;
    for run in runs {
        let (mut own, mut wait, mut slow) = (0.0, 0.0, 0.0);
        for (i, req) in workload.requests.iter().enumerate() {
            let reused = run.reused_tokens.get(i).copied().unwrap_or(0);
            let o = config.cost.solo_prefill_ms(reused, req.input_tokens);
            let w = run.wait_us.get(i).copied().unwrap_or(0) as f64 / 1e3;
            own += o;
            wait += w;
            slow += run.ttft_us.get(i).copied().unwrap_or(0) as f64 / 1e3 - o - w;
        }
        println!(
            "  {:<13} mean TTFT = own prefill {:>4.0} + wait (queue, load, restore) {:>4.0} + slowdown {:>4.0} ms",
            run.report.policy,
            own / n,
            wait / n,
            slow / n
        );
    }
}

/// Prints den's decision records where it won and lost most against the best baseline.
fn explain(workload: &Workload, config: &FleetConfig, runs: &[PolicyRun], k: usize) {
    let Some(den) = runs.iter().find(|r| r.report.policy == "den") else {
        return;
    };
    let Some(best) = runs
        .iter()
        .filter(|r| r.report.policy != "den")
        .min_by(|a, b| a.report.ttft_ms.mean.total_cmp(&b.report.ttft_ms.mean))
    else {
        return;
    };
    let mut diffs: Vec<(i64, usize)> = den
        .ttft_us
        .iter()
        .zip(&best.ttft_us)
        .enumerate()
        .map(|(i, (&d, &b))| (b as i64 - d as i64, i))
        .collect();
    diffs.sort();
    let losses: Vec<usize> = diffs.iter().take(k).map(|d| d.1).collect();
    let wins: Vec<usize> = diffs.iter().rev().take(k).map(|d| d.1).collect();
    // The replay is deterministic: the same run again, recording these decisions.
    let mut cfg = config.clone();
    cfg.explain = wins.iter().chain(&losses).copied().collect::<BTreeSet<_>>();
    let rerun = run_policy(workload, &cfg, PolicyKind::Den);
    let ms = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0) as f64 / 1e3;
    for (label, set) in [("WIN", &wins), ("LOSS", &losses)] {
        for &i in set {
            let Some(d) = rerun.decisions.iter().find(|d| d.request == i) else {
                continue;
            };
            println!(
                "{label} request #{i} (line {}, t={:.3} s, prompt {} tokens): den {:.0} ms on w{:02} reusing {}; {} {:.0} ms on w{:02} reusing {}",
                d.line,
                d.at_ms / 1e3,
                d.input_tokens,
                ms(&den.ttft_us, i),
                den.worker.get(i).copied().unwrap_or(0),
                den.reused_tokens.get(i).copied().unwrap_or(0),
                best.report.policy,
                ms(&best.ttft_us, i),
                best.worker.get(i).copied().unwrap_or(0),
                best.reused_tokens.get(i).copied().unwrap_or(0),
            );
            for s in &d.ranked {
                let c = &s.candidate;
                println!(
                    "    {} {:<6} cached {:>6}  queue {:>7.1}  load {:>7.1}  restore {:>6.1}  prefill {:>7.1}  first {:>4.1}  => {:>7.1} ms",
                    c.worker_id,
                    c.tier.as_str(),
                    c.cached_token_count,
                    c.queue_ms,
                    c.prefix_load_ms,
                    c.gpu_restore_ms,
                    s.estimate.missing as f64 * c.prefill_ms_per_token,
                    c.first_token_ms,
                    s.estimate.ttft_ms
                );
            }
        }
    }
    println!();
}
