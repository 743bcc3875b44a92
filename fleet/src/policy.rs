//! Routing policies as a trait, the fleet view they decide on, and the two plain
//! baselines (round-robin, least-loaded).
//!
//! Every policy runs on the same simulator and sees the same, current observations
//! ([`FleetView`]): per-worker load ([`WorkerLoad`]) and cache contents. What each policy
//! *uses* of that view follows the system it models (see [`super::baselines`] and
//! [`super::den`]).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::baselines::{DynamoPolicy, LlmdPolicy, SglangPolicy};
use super::cache::Level;
use super::cost::{CostModel, Micros};
use super::den::{DenOptions, DenPolicy, StudyDecision};
use super::load::WorkerLoad;
use super::worker::{Reuse, Shared, Source, Worker, source_of};
use den_protocol::ids::WorkerId;

/// The request being routed, as a router sees it.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// Index in replay order.
    pub index: usize,
    /// 1-based line in the trace file.
    pub line: usize,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Prompt blocks, root first (dense block indices of the workload).
    pub blocks: &'a [u32],
    /// Keep a decision record for this request (policies that can explain themselves).
    pub explain: bool,
    /// How often the policy refused it before (its client retries a refusal).
    pub attempt: u32,
}

/// A routing decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub worker: usize,
    pub reuse: Reuse,
    /// The policy's own TTFT prediction, for policies that make one (den).
    pub predicted_ttft_ms: Option<f64>,
    /// The work the policy expects this request to add to the worker's queue, ms
    /// ([`den_protocol::candidate::added_work_ms`]): with heartbeat-lagged observations it is
    /// added to the worker's reported queue until its next heartbeat, as den-agent's
    /// router does with the work it offered.
    pub added_work_ms: Option<f64>,
    pub record: Option<StudyDecision>,
    /// `Some`: the policy refused the request now (den's router answers 503 with
    /// `Retry-After` when no worker can hold it), and its client submits it again this
    /// many µs later; the request's TTFT still counts from its first arrival.
    pub retry_after_us: Option<Micros>,
    /// The policy keeps the request and routes it later, from [`Policy::admitted`]
    /// (den's router: no worker has its KV pages now, and it waits FCFS for them).
    pub held: bool,
}

impl Route {
    /// Send to `worker`, which reuses whatever it has cached.
    pub fn to(worker: usize) -> Route {
        Route {
            worker,
            reuse: Reuse::Longest,
            predicted_ttft_ms: None,
            added_work_ms: None,
            record: None,
            retry_after_us: None,
            held: false,
        }
    }
}

/// A routing policy: picks a worker (and optionally a reuse plan) for each request.
pub trait Policy {
    fn name(&self) -> &'static str;
    fn route(&mut self, request: &RouteRequest, fleet: &FleetView) -> Route;
    /// Worker `w` sent a heartbeat (heartbeat-lagged runs only): `fleet.load(w)` is what
    /// it reported, and its tiers are as of `fleet.now`.
    fn heartbeat(&mut self, _w: usize, _fleet: &FleetView) {}
    /// Requests the policy held ([`Route::held`]) that it routes now, by replay index:
    /// asked after every worker event that finished requests and every heartbeat. A
    /// route may still refuse ([`Route::retry_after_us`]).
    fn admitted(&mut self, _fleet: &FleetView) -> Vec<(usize, Route)> {
        Vec::new()
    }
    /// Worker `w` produced the last token of request `r` (replay index) at `now`.
    fn finished(&mut self, _w: usize, _r: usize, _now: Micros) {}
}

/// What a router observes of the fleet at one instant.
pub struct FleetView<'a> {
    pub now: Micros,
    pub cost: &'a CostModel,
    workers: &'a [Worker],
    shared: &'a Shared<'a>,
    /// Heartbeat-lagged loads ([`super::heartbeat`]); `None`: current loads.
    reported: Option<&'a [WorkerLoad]>,
}

impl<'a> FleetView<'a> {
    pub(crate) fn new(
        now: Micros,
        workers: &'a [Worker],
        shared: &'a Shared<'a>,
        reported: Option<&'a [WorkerLoad]>,
    ) -> FleetView<'a> {
        FleetView {
            now,
            cost: shared.cost,
            workers,
            shared,
            reported,
        }
    }

    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// The stable id of worker `w` (`w00`, `w01`, …; sorts like the index).
    pub fn worker_id(w: usize) -> WorkerId {
        WorkerId(format!("w{w:02}"))
    }

    /// Worker `w`'s load: current, or as of its last heartbeat when observations are
    /// heartbeat-lagged ([`super::FleetConfig::heartbeats`]).
    pub fn load(&self, w: usize) -> WorkerLoad {
        if let Some(reported) = self.reported {
            return reported.get(w).cloned().unwrap_or_default();
        }
        self.workers
            .get(w)
            .map(|x| x.load(self.now, self.shared))
            .unwrap_or_default()
    }

    /// Leading blocks of `chain` resident on worker `w`'s GPU (what KV events report).
    pub fn gpu_prefix(&self, w: usize, chain: &[u32]) -> u32 {
        self.workers
            .get(w)
            .map_or(0, |x| x.cache.gpu_prefix(chain) as u32)
    }

    /// The fastest tier worker `w` could reuse block `b` from now (GPU, its RAM or SSD,
    /// or the shared object store once the block's upload finished).
    pub fn source(&self, w: usize, b: u32) -> Option<Source> {
        let worker = self.workers.get(w)?;
        source_of(&worker.cache, &self.shared.published_at, self.now, b)
    }

    pub fn block_tokens(&self, b: u32) -> u32 {
        self.shared.workload.block_tokens(b)
    }

    /// Distinct blocks of the workload (block indices are below this).
    pub fn block_count(&self) -> usize {
        self.shared.workload.block_count()
    }

    /// Whether worker `w`'s `level` holds block `b` now.
    pub fn holds(&self, w: usize, level: Level, b: u32) -> bool {
        self.workers.get(w).is_some_and(|x| x.cache.has(level, b))
    }

    /// Blocks on worker `w`'s GPU now, in index order.
    pub fn gpu_blocks(&self, w: usize) -> Vec<u32> {
        self.workers
            .get(w)
            .map(|x| x.cache.gpu_blocks())
            .unwrap_or_default()
    }

    /// Whether block `b`'s upload to the shared object store has finished.
    pub fn uploaded(&self, b: u32) -> bool {
        self.shared
            .published_at
            .get(b as usize)
            .is_some_and(|t| *t <= self.now)
    }

    /// Whether loads are as of each worker's last heartbeat ([`Self::load`]).
    pub fn lagged(&self) -> bool {
        self.reported.is_some()
    }
}

/// The policies this crate implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// den: lowest predicted TTFT over (worker × cache alternative) candidates.
    Den,
    RoundRobin,
    LeastLoaded,
    Dynamo,
    Sglang,
    LlmD,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Den,
        PolicyKind::RoundRobin,
        PolicyKind::LeastLoaded,
        PolicyKind::Dynamo,
        PolicyKind::Sglang,
        PolicyKind::LlmD,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Den => "den",
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::LeastLoaded => "least-loaded",
            PolicyKind::Dynamo => "dynamo",
            PolicyKind::Sglang => "sglang",
            PolicyKind::LlmD => "llm-d",
        }
    }

    /// A fresh policy of this kind (den with `den` options).
    pub fn build(self, den: &DenOptions) -> Box<dyn Policy> {
        match self {
            PolicyKind::Den => Box::new(DenPolicy::new(den.clone())),
            PolicyKind::RoundRobin => Box::new(RoundRobin::default()),
            PolicyKind::LeastLoaded => Box::new(LeastLoaded),
            PolicyKind::Dynamo => Box::new(DynamoPolicy::default()),
            PolicyKind::Sglang => Box::new(SglangPolicy::default()),
            PolicyKind::LlmD => Box::new(LlmdPolicy::default()),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy list that names an unknown policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown policy {0:?}: use `all` or a comma-separated list of den, round-robin, least-loaded, dynamo, sglang, llm-d"
)]
pub struct PolicyError(pub String);

impl std::str::FromStr for PolicyKind {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        let kind = match norm.as_str() {
            "den" | "ttft" => PolicyKind::Den,
            "round-robin" | "rr" | "roundrobin" => PolicyKind::RoundRobin,
            "least-loaded" | "queue" | "leastloaded" => PolicyKind::LeastLoaded,
            "dynamo" => PolicyKind::Dynamo,
            "sglang" | "sgl" => PolicyKind::Sglang,
            "llm-d" | "llmd" => PolicyKind::LlmD,
            _ => return Err(PolicyError(s.to_owned())),
        };
        Ok(kind)
    }
}

/// Parses `all` or a comma-separated list (duplicates dropped, order kept).
pub fn parse_policies(list: &str) -> Result<Vec<PolicyKind>, PolicyError> {
    if list.trim().eq_ignore_ascii_case("all") {
        return Ok(PolicyKind::ALL.to_vec());
    }
    let mut out = Vec::new();
    for part in list.split(',').filter(|p| !p.trim().is_empty()) {
        let kind: PolicyKind = part.parse()?;
        if !out.contains(&kind) {
            out.push(kind);
        }
    }
    if out.is_empty() {
        return Err(PolicyError(list.to_owned()));
    }
    Ok(out)
}

/// Round-robin: worker `i mod N` for the i-th request. What a Kubernetes Service (or any
/// L4 balancer) does; the baseline every LLM router paper starts from.
#[derive(Debug, Clone, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn route(&mut self, _request: &RouteRequest, fleet: &FleetView) -> Route {
        let n = fleet.worker_count().max(1);
        let w = self.next % n;
        self.next = (w + 1) % n;
        Route::to(w)
    }
}

/// Least-loaded: fewest requests in flight (queued + running), lowest index on ties.
/// The "least request" balancer of Envoy and SGLang's fallback mode.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeastLoaded;

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least-loaded"
    }

    fn route(&mut self, _request: &RouteRequest, fleet: &FleetView) -> Route {
        let loads: Vec<u32> = (0..fleet.worker_count())
            .map(|w| fleet.load(w).in_flight())
            .collect();
        Route::to(argmin_u32(&loads))
    }
}

/// Index of the smallest value, the lowest index on ties (0 for an empty slice).
pub fn argmin_u32(values: &[u32]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if values.get(best).is_some_and(|b| v < b) {
            best = i;
        }
    }
    best
}
