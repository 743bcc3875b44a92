//! `den-fleet simulate`: replay a Mooncake-format trace through den's routing policy and
//! the baselines (round-robin, least-loaded, Dynamo, SGLang, llm-d) on the deterministic
//! fleet simulator of this crate ([`crate::replay`]), and print one comparison table per
//! fleet size (mean/p50/p99 TTFT, throughput, prefix hit rate, tokens recomputed, bytes
//! moved per tier, evictions, per-worker load spread).
//!
//! The simulation itself is pure (the rest of this crate); this module reads the trace
//! file, parses the options and runs the policies on two threads (each replay is
//! independent and deterministic, so the output does not depend on the threads).
//!
//! ```text
//! den-fleet simulate [--trace FILE] [--workers 8|4,8,16] [--policies all|den,dynamo,…]
//!                    [--json] [--limit N] [--no-object-store] [--explain K]
//!                    [--den router|v1…v6]
//!                    [--profile h100|synthetic|FILE.json]
//!                    [--time-scale X] [--length-scale Y]
//! ```
//!
//! `--profile synthetic` replaces the H100 deployment with den's own synthetic engine
//! (`den_fleet::synthetic`, den's batching scheduler at declared costs; what
//! `den-fleet validate` checks against real agents) at the trace's blocks.
//! `--profile FILE.json` is a deployment `den-fleet validate --save-profile FILE.json`
//! wrote: with `--model-file`, the step costs, pool and restore rate den's real-model
//! workers measured. `--time-scale` and `--length-scale` scale the trace as `validate`
//! does (a CPU worker's profile needs shorter prompts); a saved profile's chunk size must
//! be the scaled block size.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use clap::Args;
use serde::Serialize;

use crate::trace::MOONCAKE_BLOCK_TOKENS;
use crate::{
    Contrast, DenOptions, FleetConfig, FleetReport, PolicyKind, PolicyRun, Scale, ScaledTrace,
    SyntheticProfile, TimeSplit, Trace, Workload, contrasts, contrasts_text, parse_policies,
    report, run_policy, time_split, time_split_text,
};

/// The vendored Mooncake conversation trace, relative to the repository root.
pub const DEFAULT_TRACE: &str = "tests/fixtures/mooncake/conversation_trace.jsonl";

/// Threads the policies run on (the project machine has two cores).
const THREADS: usize = 2;

/// Options of `den-fleet simulate`.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct SimulateArgs {
    /// Mooncake-format trace: one JSON request per line with timestamp (ms),
    /// input_length, output_length and hash_ids. Defaults to the vendored conversation
    /// trace when run from the repository root.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Workers in the fleet: one number, or a comma-separated list for one table each.
    #[arg(long, value_name = "N|LIST", default_value = "8")]
    pub workers: String,
    /// Policies to compare: `all`, or a comma-separated list of den, round-robin,
    /// least-loaded, dynamo, sglang, llm-d.
    #[arg(long, value_name = "LIST|all", default_value = "all")]
    pub policies: String,
    /// Print the reports as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Replay only the first N requests (by arrival).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Remove the shared object-store tier (workers keep GPU, host RAM and SSD).
    #[arg(long)]
    pub no_object_store: bool,
    /// Also show den's decision records for its K biggest wins and K biggest losses
    /// against the best other policy.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub explain: usize,
    /// Which den policy: `router` (what den-agent's router runs, the default) or a study
    /// step v1 … v6 (the experiments BENCHMARKS.md lists; never what den-agent runs).
    #[arg(long, value_name = "VERSION", default_value = "router")]
    pub den: String,
    /// The deployment: `h100` (Llama-3.1-8B on H100s with batched chunked prefill),
    /// `synthetic` (den's synthetic engine on den's batching scheduler), or a JSON file
    /// `den-fleet validate --save-profile` wrote (a real model's measured costs).
    #[arg(long, value_name = "PROFILE", default_value = "h100")]
    pub profile: String,
    /// Compress arrival gaps by this factor (as `den-fleet validate`).
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub time_scale: f64,
    /// Shorten every 512-token block, prompt and output by this factor.
    #[arg(long, value_name = "Y", default_value_t = 1.0)]
    pub length_scale: f64,
    /// den-agent's router --max-waiting: how many requests may wait in it for KV pages
    /// no worker has free; 0 refuses them (503, Retry-After) and the simulated client
    /// sends them again a second later [default: den-agent's, 1024].
    #[arg(long, value_name = "N")]
    pub max_waiting: Option<usize>,
}

/// Where the simulated workers' costs come from.
enum Deployment {
    H100,
    Synthetic,
    Saved(SyntheticProfile),
}

fn deployment(profile: &str) -> Result<Deployment, String> {
    match profile.trim() {
        "h100" => Ok(Deployment::H100),
        "synthetic" => Ok(Deployment::Synthetic),
        path if path.ends_with(".json") => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read --profile {path}: {e}"))?;
            let p: SyntheticProfile = serde_json::from_str(&text).map_err(|e| {
                format!("--profile {path} is not a saved deployment ({e}): write one with den-fleet validate --save-profile")
            })?;
            Ok(Deployment::Saved(p))
        }
        other => Err(format!(
            "unknown --profile {other:?}: use h100, synthetic or a FILE.json from den-fleet validate --save-profile"
        )),
    }
}

impl Default for SimulateArgs {
    fn default() -> Self {
        SimulateArgs {
            trace: None,
            workers: "8".into(),
            policies: "all".into(),
            json: false,
            limit: None,
            no_object_store: false,
            explain: 0,
            den: "router".into(),
            profile: "h100".into(),
            time_scale: 1.0,
            length_scale: 1.0,
            max_waiting: None,
        }
    }
}

/// One fleet size's results, as `--json` prints them.
#[derive(Debug, Clone, Serialize)]
pub struct FleetOutput {
    pub report: FleetReport,
    pub time_split: Vec<TimeSplit>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub explained: Vec<Contrast>,
}

/// Runs the simulation described by `args` and returns what to print: the tables (or
/// JSON). Errors are one line naming what was wrong.
pub fn run(args: &SimulateArgs) -> Result<String, String> {
    let path = trace_path(args.trace.as_deref(), Path::new(DEFAULT_TRACE))?;
    let workers = parse_workers(&args.workers)?;
    let policies = parse_policies(&args.policies).map_err(|e| e.to_string())?;
    let mut den = DenOptions::preset(args.den.trim()).ok_or_else(|| {
        format!(
            "unknown --den {:?}: use router (den-agent's, the default) or a study step v1 … v6",
            args.den
        )
    })?;
    if let Some(n) = args.max_waiting {
        den.max_waiting = n;
    }
    let deployment = deployment(&args.profile)?;
    if args.limit == Some(0) {
        return Err("--limit 0 replays nothing: give at least 1".into());
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
    let mut trace = Trace::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(n) = args.limit {
        trace = trace.truncated(n);
    }
    let scale = Scale {
        time: args.time_scale,
        length: args.length_scale,
    };
    let (workload, block_tokens) = if scale.time == 1.0 && scale.length == 1.0 {
        (Workload::from_trace(&trace), MOONCAKE_BLOCK_TOKENS)
    } else {
        let scaled = ScaledTrace::new(&trace, scale).map_err(|e| e.to_string())?;
        (scaled.workload(), scaled.block_tokens)
    };
    if matches!(deployment, Deployment::H100) && block_tokens != MOONCAKE_BLOCK_TOKENS {
        return Err(format!(
            "--length-scale {}: the h100 profile is sized in the trace's 512-token blocks; scale lengths with --profile synthetic or a saved profile",
            args.length_scale
        ));
    }
    if let Deployment::Saved(p) = &deployment
        && p.chunk_tokens != block_tokens
    {
        return Err(format!(
            "--profile {}: its workers' chunks are {} tokens but the trace's blocks are {block_tokens}: give --length-scale {}",
            args.profile.trim(),
            p.chunk_tokens,
            MOONCAKE_BLOCK_TOKENS as f64 / p.chunk_tokens.max(1) as f64
        ));
    }
    let configs: Vec<FleetConfig> = workers
        .iter()
        .map(|&n| {
            let mut config = FleetConfig::new(n);
            config.den = den.clone();
            match &deployment {
                Deployment::H100 => {}
                Deployment::Synthetic => {
                    config.cost = SyntheticProfile::validation(block_tokens).cost_model();
                }
                Deployment::Saved(p) => config.cost = p.cost_model(),
            }
            if args.no_object_store {
                config.cost.object_store = None;
            }
            config
        })
        .collect();
    let started = Instant::now();
    let runs = run_all(&workload, &configs, &policies);
    let elapsed = started.elapsed().as_secs_f64();
    let outputs: Vec<FleetOutput> = configs
        .iter()
        .zip(runs)
        .map(|(config, runs)| FleetOutput {
            report: report(
                &workload,
                config,
                runs.iter().map(|r| r.report.clone()).collect(),
            ),
            time_split: runs
                .iter()
                .map(|r| time_split(&workload, config, r))
                .collect(),
            explained: contrasts(&workload, config, &runs, args.explain),
        })
        .collect();
    if args.json {
        return serde_json::to_string_pretty(&outputs)
            .map_err(|e| format!("cannot encode the reports as JSON: {e}"));
    }
    let mut out = String::new();
    if policies.contains(&PolicyKind::Den) {
        out.push_str(den.describe());
        out.push_str("\n\n");
    }
    for o in &outputs {
        out.push_str(&o.report.table());
        out.push_str(&time_split_text(&o.time_split));
        if !o.explained.is_empty() {
            out.push('\n');
            out.push_str(&contrasts_text(&o.explained));
        }
        out.push('\n');
    }
    out.push_str(&format!(
        "({} fleet size(s) × {} policies replayed in {elapsed:.1} s wall)\n",
        configs.len(),
        policies.len()
    ));
    Ok(out)
}

/// The trace to read: `given`, or `default` when it exists (relative to the current
/// directory).
fn trace_path(given: Option<&Path>, default: &Path) -> Result<PathBuf, String> {
    match given {
        Some(p) => Ok(p.to_path_buf()),
        None if default.is_file() => Ok(default.to_path_buf()),
        None => Err(format!(
            "--trace FILE is required here ({} is not under the current directory)",
            default.display()
        )),
    }
}

/// `8` or `4,8,16`: positive worker counts, duplicates dropped, order kept.
pub fn parse_workers(list: &str) -> Result<Vec<usize>, String> {
    let bad = || {
        format!(
            "--workers {list:?}: expected a positive number of workers or a comma-separated list such as 4,8,16"
        )
    };
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let n: usize = part.parse().map_err(|_| bad())?;
        if n == 0 {
            return Err(bad());
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

/// Replays every (fleet size, policy) pair on [`THREADS`] threads, each taking the next
/// job in turn; results come back in input order.
fn run_all(
    workload: &Workload,
    configs: &[FleetConfig],
    policies: &[PolicyKind],
) -> Vec<Vec<PolicyRun>> {
    let jobs: Vec<(usize, PolicyKind)> = (0..configs.len())
        .flat_map(|c| policies.iter().map(move |&p| (c, p)))
        .collect();
    let slots: Vec<Mutex<Option<PolicyRun>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..THREADS.min(jobs.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let (Some(&(c, kind)), Some(slot)) = (jobs.get(i), slots.get(i)) else {
                        break;
                    };
                    let Some(config) = configs.get(c) else { break };
                    let run = run_policy(workload, config, kind);
                    if let Ok(mut slot) = slot.lock() {
                        *slot = Some(run);
                    }
                }
            });
        }
    });
    let mut out: Vec<Vec<PolicyRun>> = configs.iter().map(|_| Vec::new()).collect();
    for (&(c, _), slot) in jobs.iter().zip(slots) {
        let run = slot.into_inner().ok().flatten();
        if let (Some(list), Some(run)) = (out.get_mut(c), run) {
            list.push(run);
        }
    }
    out
}

#[cfg(test)]
mod tests;
