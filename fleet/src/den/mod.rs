//! den's routing policy in the fleet simulator.
//!
//! `--den router` (the default) is den-agent's router itself: its [`RouterNode`] driven
//! by the simulated workers' frames ([`NodePolicy`], in `node`). Nothing about that
//! decision is written twice: the node builds, prices and ranks the candidates, keeps
//! the in-flight ledger and the speculative prefixes, and makes the offer.
//!
//! The study steps (`--den v1` … `v6`, experiments, never what den-agent runs) keep
//! their own estimator: for every worker they build [`Candidate`]s as spec §6.1
//! describes — recompute, the GPU-resident prefix, and durable alternatives per chain
//! boundary from RAM, SSD or the object store — with costs from the worker's load, then
//! call [`rank_shape`] and take the first feasible candidate. Two extensions of §6.1 in
//! the study's estimator inputs:
//! - the durable walk treats GPU-resident blocks as a zero-cost source, so "GPU prefix +
//!   RAM/SSD suffix" is one alternative;
//! - boundaries that cannot win are pruned: within a run of blocks from one tier, the
//!   estimate as a function of the boundary is linear or concave on each side of the
//!   point where the load overtakes the queue, so its minimum lies at the run's first or
//!   last boundary or next to that crossing; only those are emitted.
//!
//! The study's queue estimate ([`QueueModel`]) is where its load prediction lives; from
//! v6 it replays each worker's engine plan ([`crate::plan`]) with the request added.
//! From v5 the ranking is by *fleet cost*: the request's own predicted TTFT plus the
//! delay it would add to the requests already pending on that worker.
//!
//! Layout: [`DenOptions`] (the iteration steps) in `options`, the study's candidate
//! builder and pricing in `estimator`, den-agent's router node in `node`, the policy and
//! the study's ranking here.
//!
//! [`RouterNode`]: den_protocol::router_node::RouterNode

mod estimator;
mod node;
mod options;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cost::{CostModel, Micros};
use super::load::WorkerLoad;
use super::policy::{FleetView, Policy, Route, RouteRequest};
use super::worker::{Reuse, Source};
use den_protocol::candidate::{Candidate, Scored, added_work_ms, offer_order, rank_shape};
use den_protocol::ids::WorkerId;

pub use estimator::{candidates, imposed_ms, prefill_ms_per_token, priced_candidates, queue_ms};
pub use node::NodePolicy;
pub use options::{DenOptions, QueueModel};

/// One worker as a study step's candidate builder sees it for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct DenWorker {
    pub id: WorkerId,
    pub load: WorkerLoad,
    /// For each prompt block (root first), the fastest tier it can be reused from on this
    /// worker; `None` ends the reusable prefix.
    pub sources: Vec<Option<Source>>,
}

impl DenWorker {
    pub fn new(id: WorkerId, load: WorkerLoad, sources: Vec<Option<Source>>) -> DenWorker {
        DenWorker { id, load, sources }
    }
}

/// The shape of the request being routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape<'a> {
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Tokens of each prompt block, root first.
    pub block_tokens: &'a [u32],
}

impl Shape<'_> {
    /// Tokens with KV once processed (the last prompt token is pending).
    pub fn processed(&self) -> u32 {
        self.input_tokens.saturating_sub(1)
    }
}

/// A routing decision of the fleet study with everything needed to explain it (spec
/// §6.5): the candidates in offer order, the choice, and — filled in after the run —
/// what happened. The real router's record is `den_protocol::decision::DecisionRecord`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StudyDecision {
    pub request: usize,
    pub line: usize,
    pub at_ms: f64,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub chosen: Scored,
    /// Each worker's best feasible candidate, in offer order (the chosen one first).
    pub ranked: Vec<Scored>,
    /// For each of `ranked`: the delay choosing it would add to the worker's pending
    /// requests, ms (v5 on; empty in older records).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub imposed_ms: Vec<f64>,
    pub candidates: usize,
    pub infeasible: usize,
    /// No candidate was feasible (pool full everywhere): ranked again ignoring page
    /// capacity, so the request queues at the best worker.
    pub capacity_fallback: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_ttft_ms: Option<f64>,
}

/// den's policy: den-agent's router node ([`NodePolicy`]) with the default options
/// (`--den router`), or a study step's estimator (`--den v1` … `v6`).
#[derive(Debug, Default)]
pub struct DenPolicy {
    pub options: DenOptions,
    /// `Some` exactly when `options` are den-agent's router's.
    node: Option<NodePolicy>,
}

impl DenPolicy {
    pub fn new(options: DenOptions) -> DenPolicy {
        let node = options
            .router_pricing
            .then(|| NodePolicy::with_max_waiting(options.max_waiting));
        DenPolicy { options, node }
    }

    /// den-agent's router node, when this policy is it (after the first request).
    pub fn node(&self) -> Option<&den_protocol::router_node::RouterNode> {
        self.node.as_ref().and_then(NodePolicy::node)
    }
}

impl Policy for DenPolicy {
    fn name(&self) -> &'static str {
        "den"
    }

    fn route(&mut self, request: &RouteRequest, fleet: &FleetView) -> Route {
        if let Some(node) = &mut self.node {
            return node.route(request, fleet);
        }
        let cap = request.blocks.len().saturating_sub(1);
        let block_tokens: Vec<u32> = request
            .blocks
            .iter()
            .map(|&b| fleet.block_tokens(b))
            .collect();
        let workers: Vec<DenWorker> = (0..fleet.worker_count())
            .map(|w| DenWorker {
                id: FleetView::worker_id(w),
                load: fleet.load(w),
                sources: request
                    .blocks
                    .iter()
                    .take(cap)
                    .map(|&b| fleet.source(w, b))
                    .collect(),
            })
            .collect();
        let shape = Shape {
            input_tokens: request.input_tokens,
            output_tokens: request.output_tokens,
            block_tokens: &block_tokens,
        };
        let Some(decision) = decide(&shape, &workers, fleet.cost, &self.options) else {
            return Route::to(0);
        };
        let worker = workers
            .iter()
            .position(|w| w.id == decision.chosen.candidate.worker_id)
            .unwrap_or(0);
        let blocks = blocks_for(&block_tokens, decision.chosen.candidate.cached_token_count);
        let record = request.explain.then(|| StudyDecision {
            request: request.index,
            line: request.line,
            at_ms: fleet.now as f64 / 1000.0,
            input_tokens: request.input_tokens,
            output_tokens: request.output_tokens,
            chosen: decision.chosen.clone(),
            ranked: decision.ranked,
            imposed_ms: decision.imposed_ms,
            candidates: decision.candidates,
            infeasible: decision.infeasible,
            capacity_fallback: decision.capacity_fallback,
            measured_ttft_ms: None,
        });
        let predicted_ttft_ms = Some(decision.chosen.estimate.ttft_ms);
        let added_work_ms = Some(added_work_ms(
            &decision.chosen.candidate,
            &decision.chosen.estimate,
        ));
        Route {
            worker,
            reuse: Reuse::Blocks(blocks),
            predicted_ttft_ms,
            added_work_ms,
            record,
            retry_after_us: None,
            held: false,
        }
    }

    fn heartbeat(&mut self, w: usize, fleet: &FleetView) {
        if let Some(node) = &mut self.node {
            node.heartbeat(w, fleet);
        }
    }

    fn finished(&mut self, w: usize, r: usize, now: Micros) {
        if let Some(node) = &mut self.node {
            node.finished(w, r, now);
        }
    }

    fn admitted(&mut self, fleet: &FleetView) -> Vec<(usize, Route)> {
        match &mut self.node {
            Some(node) => node.admitted(fleet),
            None => Vec::new(),
        }
    }
}

/// The outcome of ranking one request's candidates.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub chosen: Scored,
    pub ranked: Vec<Scored>,
    /// For each of `ranked`: the delay it would add to the worker's pending requests, ms.
    pub imposed_ms: Vec<f64>,
    pub candidates: usize,
    pub infeasible: usize,
    pub capacity_fallback: bool,
}

/// A study step's decision: builds every worker's candidates with the study estimator,
/// ranks them with [`rank_shape`] and picks the first feasible one (or, when the pool is
/// full everywhere, the best ignoring capacity). `None` when there are no workers — and
/// for [`DenOptions::router`], whose decisions only den-agent's router node makes
/// ([`NodePolicy`]): there is no second estimate of the shipped policy.
pub fn decide(
    shape: &Shape,
    workers: &[DenWorker],
    cost: &CostModel,
    opts: &DenOptions,
) -> Option<Decision> {
    if opts.router_pricing {
        return None;
    }
    let mut imposed: BTreeMap<(WorkerId, u32), f64> = BTreeMap::new();
    let mut all: Vec<Candidate> = Vec::new();
    for w in workers {
        for (c, delay) in priced_candidates(shape, w, cost, opts) {
            imposed.insert((c.worker_id.clone(), c.cached_token_count), delay);
            all.push(c);
        }
    }
    let count = all.len();
    let ranking = rank_shape(shape.processed(), shape.output_tokens, all.clone());
    let infeasible = ranking.infeasible.len();
    let (ranking, capacity_fallback) = if ranking.feasible.is_empty() {
        let relaxed = all
            .into_iter()
            .map(|c| Candidate {
                free_pages: u32::MAX / 2,
                ..c
            })
            .collect();
        (
            rank_shape(shape.processed(), shape.output_tokens, relaxed),
            true,
        )
    } else {
        (ranking, false)
    };
    let delay_of = |s: &Scored| {
        imposed
            .get(&(
                s.candidate.worker_id.clone(),
                s.candidate.cached_token_count,
            ))
            .copied()
            .unwrap_or(0.0)
    };
    let mut feasible = ranking.feasible;
    if opts.marginal_delay {
        // Fleet cost: the request's own TTFT plus what it adds to the pending requests'
        // (mean TTFT is their sum); offer order breaks ties.
        feasible.sort_by(|a, b| {
            (a.estimate.ttft_ms + delay_of(a))
                .total_cmp(&(b.estimate.ttft_ms + delay_of(b)))
                .then_with(|| offer_order(a, b))
        });
    }
    // The record keeps the best candidate of every worker (in offer order), so it shows
    // what each worker could have offered, not only the top of one worker's list.
    let mut seen = std::collections::BTreeSet::new();
    let ranked: Vec<Scored> = feasible
        .into_iter()
        .filter(|s| seen.insert(s.candidate.worker_id.clone()))
        .collect();
    let imposed_ms = ranked.iter().map(delay_of).collect();
    let chosen = ranked.first()?.clone();
    Some(Decision {
        chosen,
        ranked,
        imposed_ms,
        candidates: count,
        infeasible,
        capacity_fallback,
    })
}

/// Blocks covering exactly `tokens` reused tokens (boundaries are block-aligned).
fn blocks_for(block_tokens: &[u32], tokens: u32) -> u32 {
    let mut sum = 0u32;
    let mut n = 0u32;
    for &t in block_tokens {
        if sum >= tokens {
            break;
        }
        sum += t;
        n += 1;
    }
    n
}
