//! den's routing policy in the fleet simulator: the real router's machinery.
//!
//! For every worker the policy builds [`Candidate`]s exactly as spec §6.1 describes —
//! recompute, the GPU-resident prefix, and durable alternatives per chain boundary from
//! RAM, SSD or the object store — with costs from the worker's observation, then calls
//! [`rank_shape`] (the same `estimate`/`rank` the router and worker use) and takes the
//! first feasible candidate. The worker then executes that exact plan: the chosen
//! worker, reusing exactly the chosen prefix.
//!
//! Two documented extensions of §6.1, both inside the estimator's inputs:
//! - the durable walk treats GPU-resident blocks as a zero-cost source (a paged pool
//!   keeps them in place), so "GPU prefix + RAM/SSD suffix" is one alternative;
//! - boundaries that cannot win are pruned: within a run of blocks from one tier, the
//!   estimate as a function of the boundary is linear or concave on each side of the
//!   point where the load overtakes the queue (each block adds the same load and restore
//!   and saves at least as much attention as the one before), so its minimum lies at the
//!   run's first or last boundary or next to that crossing; only those are emitted, and
//!   the winner is the same as with every boundary.
//!
//! The queue estimate ([`QueueModel`]) is where den's load prediction lives; from v6 it
//! replays each worker's engine plan ([`crate::plan`]) with the request added.
//! From v5 the ranking is by *fleet cost*: the request's own predicted TTFT plus the
//! delay it would add to the requests already pending on that worker (mean TTFT is
//! their sum). The prediction reported and recorded stays the request's own.
//!
//! Layout: [`DenOptions`] (the iteration steps) in `options`, the candidate builder and
//! its pricing (queue, imposed delay, capacity wait) in `estimator`, the policy and the
//! ranking here.

mod estimator;
mod options;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cost::CostModel;
use super::load::WorkerLoad;
use super::policy::{FleetView, Policy, Route, RouteRequest};
use super::worker::{Reuse, Source};
use den_protocol::candidate::{Candidate, Scored, Tier, added_work_ms, offer_order, rank_shape};
use den_protocol::ids::WorkerId;

pub use estimator::{candidates, imposed_ms, prefill_ms_per_token, priced_candidates, queue_ms};
pub use options::{DenOptions, QueueModel};

/// One worker as den's candidate builder sees it for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct DenWorker {
    pub id: WorkerId,
    pub load: WorkerLoad,
    /// For each prompt block (root first), the fastest tier it can be reused from on this
    /// worker; `None` ends the reusable prefix.
    pub sources: Vec<Option<Source>>,
    /// For each prompt block, the fastest lower tier (RAM, SSD, object) it can be restored
    /// from, GPU residency aside: den's worker restores a lower-tier prefix whole.
    pub durable: Vec<Option<Source>>,
}

impl DenWorker {
    /// A worker whose GPU-resident blocks have no lower-tier copy.
    pub fn new(id: WorkerId, load: WorkerLoad, sources: Vec<Option<Source>>) -> DenWorker {
        let durable = sources
            .iter()
            .map(|s| s.filter(|s| *s != Source::Gpu))
            .collect();
        DenWorker {
            id,
            load,
            sources,
            durable,
        }
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

/// den's policy.
#[derive(Debug, Clone, Default)]
pub struct DenPolicy {
    pub options: DenOptions,
}

impl DenPolicy {
    pub fn new(options: DenOptions) -> DenPolicy {
        DenPolicy { options }
    }
}

impl Policy for DenPolicy {
    fn name(&self) -> &'static str {
        "den"
    }

    fn route(&mut self, request: &RouteRequest, fleet: &FleetView) -> Route {
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
                durable: if self.options.router_pricing {
                    request
                        .blocks
                        .iter()
                        .take(cap)
                        .map(|&b| fleet.durable_source(w, b))
                        .collect()
                } else {
                    Vec::new()
                },
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
            // den's own worker (the synthetic and measured profiles) restores a
            // lower-tier prefix whole; the H100 deployment's engine reuses whatever
            // its tiers hold, GPU blocks included, whatever the router priced.
            reuse: if self.options.router_pricing
                && fleet.cost.synthetic.is_some()
                && matches!(
                    decision.chosen.candidate.tier,
                    Tier::Ram | Tier::Ssd | Tier::Object
                ) {
                Reuse::Restore {
                    resident: blocks_for(
                        &block_tokens,
                        decision.chosen.candidate.resident_tokens(),
                    ),
                    blocks,
                }
            } else {
                Reuse::Blocks(blocks)
            },
            predicted_ttft_ms,
            added_work_ms,
            record,
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

/// Builds every worker's candidates, ranks them with [`rank_shape`] and picks the first
/// feasible one (or, when the pool is full everywhere, the best ignoring capacity).
/// `None` only when there are no workers.
pub fn decide(
    shape: &Shape,
    workers: &[DenWorker],
    cost: &CostModel,
    opts: &DenOptions,
) -> Option<Decision> {
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
