//! `den-fleet validate`: the fleet simulator against real agents.
//!
//! Takes a slice of a Mooncake-format trace, scales it (time compressed, every 512-token
//! hash block shortened; `den_fleet::scale`), and runs it twice:
//!
//! - **measured**: a real router and N real workers on loopback (child processes of
//!   `den-agent`, [`LocalCluster`]) running the synthetic engine with the costs and capacities
//!   of the profile; each request is sent at its scaled arrival through the router's
//!   `POST /v1/generate` with the expanded token ids, and its TTFT measured at the client
//!   (request sent → first streamed token). The completion line also carries the router's
//!   own prediction for the attempt that served it and the router's measured TTFT;
//! - **simulated**: the fleet simulator on the same scaled slice with the synthetic
//!   profile ([`SyntheticProfile`], the same flags; with `--model-file`, the step costs,
//!   pool and restore rate the real workers measured and reported) and den's policy (by default the
//!   estimate the real router computes, `--den router`), twice: with each worker's load
//!   as of its last heartbeat (what den-agent's router sees, [`Heartbeats`]), and with
//!   current loads (what the fleet study assumes); and a third time on the real
//!   router's choices ([`FollowRouter`]: same worker, same reuse), which measures the
//!   simulator's model of the workers without den's routing decisions.
//!
//! It reports, per request and summarised, how far the simulator's TTFT and the router's
//! prediction are from the measurement (median and p90 of |predicted − measured| /
//! measured), how often both sides chose the same worker, and the TTFT distributions.
//!
//! ```text
//! den-fleet validate [--trace FILE] [--start SECS] [--requests N | --window SECS]
//!                    [--time-scale X] [--length-scale Y] [--workers 3] [--policy den]
//!                    [--json] [--rows] [--agent PATH] [profile flags: --prefill-ms-per-token …]
//! ```
//!
//! The replay on the real agents is in `validate/measure.rs`, what the workers measured
//! of themselves (and the profile built from it) in `validate/calibration.rs`, the report
//! in `validate/report.rs`.

mod calibration;
mod follow;
mod measure;
mod report;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use den_agent::config::parse_bytes;
use den_agent::local_cluster::{LocalCluster, LocalClusterSpec};

use crate::simulate::DEFAULT_TRACE;
use crate::{
    DenOptions, FleetConfig, Heartbeats, PolicyKind, PolicyRun, Scale, ScaledTrace, SliceSpec,
    SyntheticProfile, Trace, run_policy, run_with, slice,
};

pub use self::calibration::{Moved, WorkerCalibration, measured_profile};
pub use self::follow::FollowRouter;
pub use self::measure::Measured;
pub use self::report::{Errors, Row, Summary, ValidationReport, worker_index};

/// Options of `den-fleet validate`.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct ValidateArgs {
    /// Mooncake-format trace (default: the vendored conversation trace, from the
    /// repository root).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Skip the requests that arrive before this many seconds into the trace.
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    pub start: f64,
    /// Replay this many requests (the default, 40, when --window is not given either).
    #[arg(long, value_name = "N")]
    pub requests: Option<usize>,
    /// Replay the requests arriving within this many seconds of --start (trace time).
    #[arg(long, value_name = "SECS")]
    pub window: Option<f64>,
    /// Compress arrival gaps by this factor (2 replays twice as fast).
    #[arg(long, value_name = "X", default_value_t = 4.0)]
    pub time_scale: f64,
    /// Shorten every 512-token block, prompt and output by this factor (8: 64-token
    /// blocks, which is also the agents' chunk size).
    #[arg(long, value_name = "Y", default_value_t = 8.0)]
    pub length_scale: f64,
    /// Workers in the real cluster and in the simulated fleet.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub workers: usize,
    /// The routing policy compared: the real router runs den, so only `den`.
    #[arg(long, value_name = "POLICY", default_value = "den")]
    pub policy: String,
    /// Which den estimate the simulator runs: `router` (what den-agent's router
    /// computes from heartbeats) or an iteration step of the fleet study (v1 … v6).
    #[arg(long, value_name = "VERSION", default_value = "router")]
    pub den: String,
    /// Workers' --prefill-ms-per-token (and the simulator's).
    #[arg(long, value_name = "MS", default_value_t = 0.1)]
    pub prefill_ms_per_token: f64,
    /// Workers' --first-token-ms (and the simulator's).
    #[arg(long, value_name = "MS", default_value_t = 5.0)]
    pub first_token_ms: f64,
    /// Workers' --decode-ms-per-token (and the simulator's).
    #[arg(long, value_name = "MS", default_value_t = 2.0)]
    pub decode_ms_per_token: f64,
    /// Workers' --pages (and the simulator's pool) [default: 8192 on the synthetic
    /// engine; with --model-file, the worker's own default unless given].
    #[arg(long, value_name = "N")]
    pub pages: Option<u32>,
    /// Workers' --kv-bytes-per-token (and the simulator's block bytes).
    #[arg(long, value_name = "BYTES", default_value = "256", value_parser = parse_bytes)]
    pub kv_bytes_per_token: u64,
    /// Workers' --ram-bytes (and the simulator's RAM tier).
    #[arg(long, value_name = "BYTES", default_value = "1GiB", value_parser = parse_bytes)]
    pub ram_bytes: u64,
    /// Workers' --ssd-bytes (and the simulator's SSD tier); 0: none. Each worker's SSD
    /// tier lives under its data directory in the system's temporary directory. With a
    /// RAM tier smaller than the slice's KV, restores read from it, and `--save-profile`
    /// records the read rate the workers measured.
    #[arg(long, value_name = "BYTES", default_value = "0", value_parser = parse_bytes)]
    pub ssd_bytes: u64,
    /// The router's --heartbeat-interval, ms: how stale its view of each worker's queue
    /// may be (den-agent's default is 1000).
    #[arg(long, value_name = "MS", default_value_t = 100)]
    pub heartbeat_ms: u64,
    /// The router's --max-waiting (and the simulated router's): how many requests may
    /// wait in it for KV pages no worker has free; 0 refuses them (503, Retry-After) and
    /// the client sends them again a second later [default: den-agent's, 1024].
    #[arg(long, value_name = "N")]
    pub max_waiting: Option<usize>,
    /// Print the report as JSON (per-request rows and the summary).
    #[arg(long)]
    pub json: bool,
    /// Also print one line per request in the text report.
    #[arg(long)]
    pub rows: bool,
    /// Keep the router's and workers' logs in this directory.
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// The `den-agent` binary started as the router and the workers (default: the
    /// `den-agent` beside this binary, where cargo builds and installs both).
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// Run the workers on this real GGUF model instead of the synthetic engine: the
    /// router prices them by the engine plans and step costs they measure and report,
    /// and the report's router-vs-measured error is that prediction's. The simulator's
    /// workers take the step costs, pool and restore rate the real workers measured and
    /// reported at the end of the run.
    #[arg(long, value_name = "FILE.gguf")]
    pub model_file: Option<PathBuf>,
    /// Write the simulated deployment (with `--model-file`: the real workers' measured
    /// step costs, pool and restore rate) to this JSON file, for `den-fleet simulate
    /// --profile FILE`.
    #[arg(long, value_name = "FILE.json")]
    pub save_profile: Option<PathBuf>,
    /// Forward-pass threads of each real-model worker (default 1: the workers share
    /// this machine's cores).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub model_threads: usize,
}

impl Default for ValidateArgs {
    fn default() -> Self {
        ValidateArgs {
            trace: None,
            start: 0.0,
            requests: None,
            window: None,
            time_scale: 4.0,
            length_scale: 8.0,
            workers: 3,
            policy: "den".into(),
            den: "router".into(),
            prefill_ms_per_token: 0.1,
            first_token_ms: 5.0,
            decode_ms_per_token: 2.0,
            pages: None,
            kv_bytes_per_token: 256,
            ram_bytes: 1 << 30,
            ssd_bytes: 0,
            heartbeat_ms: 100,
            max_waiting: None,
            json: false,
            rows: false,
            log_dir: None,
            agent: None,
            model_file: None,
            save_profile: None,
            model_threads: 1,
        }
    }
}

/// Requests replayed when neither `--requests` nor `--window` is given.
pub const DEFAULT_REQUESTS: usize = 40;

/// The synthetic engine's pool when `--pages` is not given.
const SYNTHETIC_PAGES: u32 = 8192;

/// Token rows per page of the workers (their default; the simulator counts blocks).
const PAGE_SIZE: u32 = 16;

/// Everything decided before anything runs: the scaled slice, the profile, the
/// simulator's configuration.
#[derive(Debug, Clone)]
pub struct Plan {
    pub trace_path: PathBuf,
    pub slice: ScaledTrace,
    pub profile: SyntheticProfile,
    /// The simulated fleet, with heartbeat-lagged observations like the real router.
    pub fleet: FleetConfig,
    /// The real model the workers run (`--model-file`), if any.
    pub model: Option<RealModel>,
}

/// A real model for the workers.
#[derive(Debug, Clone, PartialEq)]
pub struct RealModel {
    pub path: PathBuf,
    /// Prompt token ids are the trace's expansion modulo this (the model's vocabulary).
    pub vocab: u32,
}

impl Plan {
    /// The same fleet with current observations (the fleet study's ideal router).
    pub fn fresh(&self) -> FleetConfig {
        FleetConfig {
            heartbeats: None,
            ..self.fleet.clone()
        }
    }
}

/// The two simulations of a slice.
#[derive(Debug, Clone)]
pub struct Simulated {
    /// Heartbeat-lagged observations (what den-agent's router sees).
    pub lagged: PolicyRun,
    /// Current observations.
    pub fresh: PolicyRun,
    /// Every request on the worker the real router chose, reusing what the real worker
    /// reused ([`FollowRouter`]): the simulator's model of the workers alone.
    pub followed: PolicyRun,
}

/// Checks the options, reads and scales the trace. Errors are one line saying what to
/// change.
pub fn plan(args: &ValidateArgs) -> Result<Plan, String> {
    let kind: PolicyKind = args.policy.parse().map_err(|e| format!("--policy: {e}"))?;
    if kind != PolicyKind::Den {
        return Err(format!(
            "--policy {kind}: the real router runs den, so den is the only policy that can be validated against it"
        ));
    }
    let mut den = DenOptions::preset(args.den.trim()).ok_or_else(|| {
        format!(
            "unknown --den {:?}: use router (what den-agent's router computes), or v1 … v6",
            args.den
        )
    })?;
    if let Some(n) = args.max_waiting {
        den.max_waiting = n;
    }
    if args.workers == 0 {
        return Err("--workers 0: give at least one worker".into());
    }
    if args.requests == Some(0) {
        return Err("--requests 0 replays nothing: give at least 1".into());
    }
    for (name, v) in [
        ("--prefill-ms-per-token", args.prefill_ms_per_token),
        ("--first-token-ms", args.first_token_ms),
        ("--decode-ms-per-token", args.decode_ms_per_token),
    ] {
        if !v.is_finite() || v < 0.0 {
            return Err(format!("{name} {v}: give a finite number of ms ≥ 0"));
        }
    }
    if args.pages == Some(0) || args.kv_bytes_per_token == 0 {
        return Err("--pages and --kv-bytes-per-token must be positive".into());
    }
    let path = match &args.trace {
        Some(p) => p.clone(),
        None if Path::new(DEFAULT_TRACE).is_file() => PathBuf::from(DEFAULT_TRACE),
        None => {
            return Err(format!(
                "--trace FILE is required here ({DEFAULT_TRACE} is not under the current directory)"
            ));
        }
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
    let trace = Trace::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let spec = SliceSpec {
        start_s: args.start,
        requests: match (args.requests, args.window) {
            (None, None) => Some(DEFAULT_REQUESTS),
            (n, _) => n,
        },
        window_s: args.window,
    };
    let sliced = slice(&trace, &spec).map_err(|e| format!("{}: {e}", path.display()))?;
    let scaled = ScaledTrace::new(
        &sliced,
        Scale {
            time: args.time_scale,
            length: args.length_scale,
        },
    )
    .map_err(|e| e.to_string())?;
    let profile = SyntheticProfile {
        prefill_ms_per_token: args.prefill_ms_per_token,
        first_token_ms: args.first_token_ms,
        decode_ms_per_token: args.decode_ms_per_token,
        pages: args.pages.unwrap_or(SYNTHETIC_PAGES),
        page_size: PAGE_SIZE,
        kv_bytes_per_token: args.kv_bytes_per_token,
        ram_bytes: args.ram_bytes,
        ssd_bytes: args.ssd_bytes,
        chunk_tokens: scaled.block_tokens,
        ..SyntheticProfile::default()
    };
    let longest = scaled
        .requests
        .iter()
        .map(|r| r.input_tokens as u64 + r.output_tokens as u64)
        .max()
        .unwrap_or(0);
    if longest > profile.pool_tokens() {
        return Err(format!(
            "the slice's longest request needs {longest} tokens of KV but --pages {} holds {}: raise --pages or --length-scale",
            profile.pages,
            profile.pool_tokens()
        ));
    }
    let model = match &args.model_file {
        None => None,
        Some(path) => {
            let m = den_agent::model_file::ModelFile::open(path, None)?;
            let context = u64::from(m.text.context_length);
            if longest > context {
                return Err(format!(
                    "the slice's longest request needs {longest} tokens but {} holds {context}: raise --length-scale",
                    path.display()
                ));
            }
            Some(RealModel {
                path: path.clone(),
                vocab: u32::try_from(m.text.tokenizer.n_vocab())
                    .unwrap_or(u32::MAX)
                    .max(1),
            })
        }
    };
    if args.model_threads == 0 {
        return Err("--model-threads 0: give at least one thread".into());
    }
    let mut fleet = FleetConfig::new(args.workers);
    fleet.cost = profile.cost_model();
    fleet.den = den;
    fleet.heartbeats = Some(Heartbeats::den(args.heartbeat_ms));
    Ok(Plan {
        trace_path: path,
        slice: scaled,
        profile,
        fleet,
        model,
    })
}

/// The `den-agent` binary to start: `given`, else the one beside the running binary.
pub fn agent_binary(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this binary to locate den-agent: {e}"))?;
    let beside = exe.with_file_name(format!("den-agent{}", std::env::consts::EXE_SUFFIX));
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(format!(
            "no den-agent at {}: build it (`cargo build -p den-agent`) or give --agent PATH",
            beside.display()
        ))
    }
}

/// Runs the validation and returns what to print (text or JSON). `agent` is the
/// `den-agent` binary, started as the router and the workers.
pub async fn run(args: &ValidateArgs, agent: PathBuf) -> Result<String, String> {
    let plan = plan(args)?;
    let data = std::env::temp_dir().join(format!("den-validate-{}", std::process::id()));
    std::fs::create_dir_all(&data).map_err(|e| format!("cannot create {}: {e}", data.display()))?;
    let logs = args.log_dir.clone().unwrap_or_else(|| data.join("logs"));
    let spec = local_cluster_spec(args, &plan, agent, &data, &logs);
    let cluster = match LocalCluster::start(&spec).await {
        Ok(c) => c,
        Err(e) => {
            return Err(format!(
                "the cluster did not start: {e} (logs in {})",
                logs.display()
            ));
        }
    };
    let started = std::time::Instant::now();
    let vocab = plan.model.as_ref().map(|m| m.vocab);
    // A real model's workers refit their steps as they run (recent steps weigh most):
    // their heartbeats are sampled through the run, so the simulated workers cost the
    // mean of those fits, not the last one alone.
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sampler = plan.model.is_some().then(|| {
        tokio::spawn(calibration::sample_observations(
            cluster.router_url.clone(),
            samples.clone(),
        ))
    });
    let measured = measure::replay(&cluster.router_url, &plan.slice, vocab).await;
    let wall_s = started.elapsed().as_secs_f64();
    let observations = calibration::observations(&cluster.router_url).await;
    let workers =
        calibration::calibration(&observations, &calibration::moved(&cluster.workers).await);
    if let Some(task) = sampler {
        task.abort();
    }
    let mut samples = samples
        .lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default();
    cluster.stop().await;
    let mut plan = plan;
    if plan.model.is_some() {
        // The simulated workers are these workers: their measured steps, pool and
        // restore rate (the profile's declared costs are not the model's).
        samples.extend(observations.iter().cloned());
        plan.profile = calibration::measured_profile(&plan.profile, &samples, &workers)?;
        plan.fleet.cost = plan.profile.cost_model();
    }
    if let Some(path) = &args.save_profile {
        let json = serde_json::to_string_pretty(&plan.profile)
            .map_err(|e| format!("cannot encode the profile: {e}"))?;
        std::fs::write(path, json + "\n")
            .map_err(|e| format!("cannot write --save-profile {}: {e}", path.display()))?;
    }
    let sim = {
        let (slice, lagged, fresh) = (
            as_sent(&plan.slice, &measured),
            plan.fleet.clone(),
            plan.fresh(),
        );
        let mut follow = FollowRouter::new(&measured, slice.block_tokens, worker_index);
        tokio::task::spawn_blocking(move || {
            let w = slice.workload();
            Simulated {
                lagged: run_policy(&w, &lagged, PolicyKind::Den),
                followed: run_with(&w, &lagged, &mut follow),
                fresh: run_policy(&w, &fresh, PolicyKind::Den),
            }
        })
        .await
        .map_err(|e| format!("the simulation failed: {e}"))?
    };
    let mut report = ValidationReport::new(args, &plan, &sim, &measured, wall_s);
    report.calibration = workers;
    if report.summary.failed > 0 {
        // Keep the logs: they say why.
        if args.json {
            return encode(&report);
        }
        return Err(format!(
            "{} of {} requests failed on the real cluster (first: {}); logs in {}",
            report.summary.failed,
            report.rows.len(),
            report.first_error().unwrap_or("?"),
            logs.display()
        ));
    }
    if args.log_dir.is_none() {
        let _ = std::fs::remove_dir_all(&data);
    } else {
        let _ = std::fs::remove_dir_all(data.join("workers"));
    }
    if args.json {
        encode(&report)
    } else {
        Ok(report.text(args.rows))
    }
}

/// The slice with each arrival moved to when the client really sent the request (its
/// scheduled arrival + the client's lag), so the simulator replays exactly what the
/// router received and client delays are not counted as prediction errors. Sends are
/// sequential, so arrivals stay in order.
pub fn as_sent(slice: &ScaledTrace, measured: &[Measured]) -> ScaledTrace {
    let mut out = slice.clone();
    let mut floor = 0;
    for (r, m) in out.requests.iter_mut().zip(measured) {
        let lag_us = (m.send_lag_ms.max(0.0) * 1e3).round() as u64;
        r.arrival_us = (r.arrival_us + lag_us).max(floor);
        floor = r.arrival_us;
    }
    out
}

fn encode(report: &ValidationReport) -> Result<String, String> {
    serde_json::to_string_pretty(report).map_err(|e| format!("cannot encode the report: {e}"))
}

/// The router and the workers, configured like the profile.
fn local_cluster_spec(
    args: &ValidateArgs,
    plan: &Plan,
    agent: PathBuf,
    data: &Path,
    logs: &Path,
) -> LocalClusterSpec {
    let p = &plan.profile;
    let mut spec = LocalClusterSpec::new(agent, args.workers, data.join("workers"));
    spec.chunk_size = p.chunk_tokens;
    spec.log_dir = Some(logs.to_path_buf());
    spec.startup_timeout = Duration::from_secs(60);
    spec.router_args = vec![
        "--heartbeat-interval".into(),
        format!("{}ms", args.heartbeat_ms.max(1)),
        "--request-deadline".into(),
        "10m".into(),
    ];
    if let Some(n) = args.max_waiting {
        spec.router_args
            .extend(["--max-waiting".to_owned(), n.to_string()]);
    }
    spec.worker_args = worker_flags(p);
    if let Some(m) = &plan.model {
        let file = m.path.display().to_string();
        spec.router_args
            .extend(["--model-file".to_owned(), file.clone()]);
        // The model sets its own costs (measured per step) and KV rows; the profile's
        // synthetic-engine flags do not apply.
        spec.worker_args = vec![
            "--model-file".into(),
            file,
            "--model-threads".into(),
            args.model_threads.to_string(),
            "--ram-bytes".into(),
            p.ram_bytes.to_string(),
            "--ssd-bytes".into(),
            p.ssd_bytes.to_string(),
        ];
        if let Some(pages) = args.pages {
            spec.worker_args
                .extend(["--pages".to_owned(), pages.to_string()]);
        }
        spec.startup_timeout = Duration::from_secs(120);
    }
    spec
}

/// The `den-agent worker` flags of a profile (module docs of
/// `den_fleet::synthetic` map each to the simulator).
pub fn worker_flags(p: &SyntheticProfile) -> Vec<String> {
    [
        ("--prefill-ms-per-token", p.prefill_ms_per_token.to_string()),
        ("--first-token-ms", p.first_token_ms.to_string()),
        ("--decode-ms-per-token", p.decode_ms_per_token.to_string()),
        ("--pages", p.pages.to_string()),
        ("--page-size", p.page_size.to_string()),
        ("--kv-bytes-per-token", p.kv_bytes_per_token.to_string()),
        ("--ram-bytes", p.ram_bytes.to_string()),
        ("--ssd-bytes", p.ssd_bytes.to_string()),
    ]
    .into_iter()
    .flat_map(|(k, v)| [k.to_owned(), v])
    .collect()
}

#[cfg(test)]
mod tests;
