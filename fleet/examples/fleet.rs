//! Replays a Mooncake-format trace through the routing policies and prints one table per
//! fleet size (what `den-fleet simulate` wraps).
//!
//! ```text
//! cargo run --release -p den-fleet --example fleet -- \
//!     [--trace tests/fixtures/mooncake/conversation_trace.jsonl] [--workers 4,8,16] \
//!     [--policies all|den,dynamo,...] [--limit N] [--json] [--explain K] \
//!     [--den v1|v2|v3|v4|v5|v6] [--no-object-store]
//! ```
//! - `--explain K` prints den's decision records for the K requests where den beat the
//!   best other policy by the most and the K where it lost by the most.
//! - `--den vN` selects one of the iteration steps of den's policy (default: latest).
//! - `--no-object-store` removes the shared object store tier (local tiers only).

use std::process::ExitCode;
use std::time::Instant;

use den_fleet::{
    DenOptions, FleetConfig, PolicyKind, PolicyRun, TimeSplit, Trace, Workload, contrasts,
    contrasts_text, parse_policies, report, run_policy, time_split, time_split_text,
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
        let splits: Vec<TimeSplit> = runs
            .iter()
            .map(|r| time_split(&workload, &config, r))
            .collect();
        print!("{}", time_split_text(&splits));
        println!(
            "({} policies replayed in {:.1} s wall)\n",
            runs.len(),
            elapsed.as_secs_f64()
        );
        if args.explain > 0 {
            println!(
                "{}",
                contrasts_text(&contrasts(&workload, &config, &runs, args.explain))
            );
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
                    .ok_or_else(|| format!("--den {v}: use v1, v2, v3, v4, v5, v6 or latest"))?
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
