//! den-fleet: the fleet study. Routing policies compared on a production trace in a
//! deterministic fleet simulator, and that simulator checked against real agents.
//!
//! The claim that routing by predicted time to first token beats what operators run
//! today has to be measured side by side on a workload nobody here wrote. This crate
//! replays a Mooncake-format trace ([`trace`]) through N simulated workers ([`worker`],
//! costs and their sources in [`cost`], tiered block cache in [`cache`]) under each
//! routing policy ([`policy`]: den's TTFT policy in [`den`], Dynamo, SGLang and llm-d in
//! [`baselines`], round-robin and least-loaded), and reports TTFT, throughput, cache
//! reuse, bytes moved per tier, evictions and load spread ([`metrics`]); [`explain`]
//! splits where the time went and pulls den's decision records for its biggest wins
//! and losses. den's estimator replays each worker's engine plan ([`plan`]).
//!
//! The study is not what the router and worker run, so it lives beside `den-protocol`
//! rather than in it: it reads `den-protocol`'s candidates, estimates and calibration,
//! and nothing there depends on it. Everything above is pure (the caller reads the
//! trace file and passes its text in); the two commands of the `den-fleet` binary are
//! the runtimes: [`simulate`] (read a trace, compare the policies) and [`validate`]
//! (replay a slice on real `den-agent` processes and on the simulator, and compare).
//!
//! ```no_run
//! use den_fleet::{compare, parse_policies, FleetConfig, Trace, Workload};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let text = std::fs::read_to_string("tests/fixtures/mooncake/conversation_trace.jsonl")?;
//! let workload = Workload::from_trace(&Trace::parse(&text)?);
//! let report = compare(&workload, &FleetConfig::new(8), &parse_policies("all")?);
//! println!("{}", report.table());
//! # Ok(()) }
//! ```

pub mod baselines;
pub mod cache;
pub mod cli;
pub mod cost;
pub mod den;
pub mod explain;
pub mod heartbeat;
mod link;
pub mod load;
pub mod metrics;
pub mod plan;
pub mod policy;
pub mod replay;
pub mod scale;
pub mod simulate;
pub mod synthetic;
pub mod trace;
pub mod validate;
pub mod worker;

pub use cost::CostModel;
pub use den::{DenOptions, DenPolicy, QueueModel, StudyDecision};
pub use explain::{
    Contrast, TimeSplit, best_other, contrasts, contrasts_text, time_split, time_split_text,
};
pub use heartbeat::Heartbeats;
pub use load::WorkerLoad;
pub use metrics::{FleetReport, PolicyReport};
pub use policy::{FleetView, Policy, PolicyError, PolicyKind, Route, RouteRequest, parse_policies};
pub use replay::{FleetConfig, PolicyRun, run_policy, run_with};
pub use scale::{Scale, ScaleError, ScaledRequest, ScaledTrace, SliceSpec, slice};
pub use synthetic::{SyntheticEngine, SyntheticProfile};
pub use trace::{Trace, TraceError, TraceRequest, Workload, expand_blocks, expand_tokens};

/// Runs every policy in `policies` on the same workload and fleet, in order, and
/// collects their reports.
pub fn compare(workload: &Workload, config: &FleetConfig, policies: &[PolicyKind]) -> FleetReport {
    let runs = policies
        .iter()
        .map(|&k| run_policy(workload, config, k).report)
        .collect();
    report(workload, config, runs)
}

/// Assembles a [`FleetReport`] from policy reports produced elsewhere (e.g. on several
/// threads with [`run_policy`]).
pub fn report(
    workload: &Workload,
    config: &FleetConfig,
    policies: Vec<PolicyReport>,
) -> FleetReport {
    FleetReport {
        trace: workload.summary(),
        workers: config.workers,
        cost: config.cost.clone(),
        ttft_lower_bound_ms: ttft_lower_bound_ms(workload, &config.cost),
        policies,
    }
}

/// Mean TTFT no routing policy can beat: each request alone on an idle worker, in its
/// engine's steps ([`CostModel::alone_ttft_ms`]), reusing all of [`Workload::ideal_reuse`] for free ([`FleetReport::ttft_lower_bound_ms`]).
pub fn ttft_lower_bound_ms(workload: &Workload, cost: &CostModel) -> f64 {
    let reuse = workload.ideal_reuse();
    let n = workload.requests.len().max(1) as f64;
    let total: f64 = workload
        .requests
        .iter()
        .zip(&reuse)
        .map(|(r, &c)| cost.alone_ttft_ms(c, r.input_tokens))
        .sum();
    total / n
}
