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
//! The queue estimate ([`QueueModel`]) is where den's load prediction lives.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cost::CostModel;
use super::load::WorkerLoad;
use super::plan::{PendingPrefill, replay};
use super::policy::{FleetView, Policy, Route, RouteRequest};
use super::worker::{Reuse, Source};
use crate::candidate::{
    Candidate, Scored, Tier, TransferCapabilities, offer_order, pages_for, rank_shape,
};
use crate::ids::{Epoch, WorkerId};

/// How a worker's `queue_ms` is predicted from its observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueModel {
    /// v1: prompt tokens pending prefill × measured prefill ms/token (one EWMA per
    /// worker); the request's own prefill likewise (`missing × ms/token`).
    PendingPrefill,
    /// v2: pending work priced by the roofline shape of [`CostModel::solo_prefill_ms`]
    /// (dense + causal attention, so long prompts cost superlinearly) over each pending
    /// request's remaining range, times the worker's measured/modelled calibration
    /// factor; the request's own prefill priced the same way per candidate.
    Calibrated,
}

/// Knobs of den's policy (each iteration step of the benchmark is one setting).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DenOptions {
    pub queue: QueueModel,
    /// v3: SSD and object loads wait for the worker's NVMe / NIC queue to drain, and the
    /// GPU restore for its PCIe queue (backlogs the worker reports).
    pub link_backlog: bool,
    /// v4: a worker whose pool is full right now is not infeasible but slower: it queues
    /// the request until running requests release enough blocks (the worker reports when
    /// it expects them to), and that wait joins `queue_ms`.
    pub capacity_wait: bool,
    /// v5: choose by the request's own predicted TTFT *plus* the delay it imposes on the
    /// requests already pending on the worker: its first chunk joins their last, partly
    /// filled prefill step and lengthens it (chunked prefill packs the token budget FCFS).
    /// The prediction reported stays the request's own.
    #[serde(default)]
    pub marginal_delay: bool,
    /// v6: each candidate's queue and the delay it imposes come from replaying the
    /// worker's engine plan with the request added ([`super::plan`]).
    #[serde(default)]
    pub replay: bool,
}

impl Default for DenOptions {
    fn default() -> Self {
        DenOptions::v6()
    }
}

impl DenOptions {
    /// The first version measured: v1 queue model, no link backlog.
    pub fn v1() -> DenOptions {
        DenOptions {
            queue: QueueModel::PendingPrefill,
            link_backlog: false,
            capacity_wait: false,
            marginal_delay: false,
            replay: false,
        }
    }

    /// v2: calibrated roofline queue and prefill model, no link backlog.
    pub fn v2() -> DenOptions {
        DenOptions {
            queue: QueueModel::Calibrated,
            ..DenOptions::v1()
        }
    }

    /// v3: v2 plus link backlogs.
    pub fn v3() -> DenOptions {
        DenOptions {
            link_backlog: true,
            ..DenOptions::v2()
        }
    }

    /// v4: v3 plus capacity wait.
    pub fn v4() -> DenOptions {
        DenOptions {
            capacity_wait: true,
            ..DenOptions::v3()
        }
    }

    /// v5: v4 plus the marginal delay on the worker's pending requests.
    pub fn v5() -> DenOptions {
        DenOptions {
            marginal_delay: true,
            ..DenOptions::v4()
        }
    }

    /// v6: v5 with queue and imposed delay from the replayed engine plan.
    pub fn v6() -> DenOptions {
        DenOptions {
            replay: true,
            ..DenOptions::v5()
        }
    }

    /// The named iteration step (`v1`, `v2`, …; `latest` is the default).
    pub fn preset(name: &str) -> Option<DenOptions> {
        match name {
            "v1" => Some(DenOptions::v1()),
            "v2" => Some(DenOptions::v2()),
            "v3" => Some(DenOptions::v3()),
            "v4" => Some(DenOptions::v4()),
            "v5" => Some(DenOptions::v5()),
            "v6" | "latest" => Some(DenOptions::v6()),
            _ => None,
        }
    }
}

/// One worker as den's candidate builder sees it for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct DenWorker {
    pub id: WorkerId,
    pub load: WorkerLoad,
    /// For each prompt block (root first), the fastest tier it can be reused from on this
    /// worker; `None` ends the reusable prefix.
    pub sources: Vec<Option<Source>>,
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

/// A routing decision with everything needed to explain it (spec §6.5): the candidates
/// in offer order, the choice, and — filled in after the run — what happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
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
        let record = request.explain.then(|| DecisionRecord {
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
        Route {
            worker,
            reuse: Reuse::Blocks(blocks),
            predicted_ttft_ms,
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

/// One worker's candidates for a request: recompute, then one per useful boundary of
/// the reusable prefix (module docs).
pub fn candidates(
    shape: &Shape,
    w: &DenWorker,
    cost: &CostModel,
    opts: &DenOptions,
) -> Vec<Candidate> {
    priced_candidates(shape, w, cost, opts)
        .into_iter()
        .map(|(c, _)| c)
        .collect()
}

/// [`candidates`], each with the delay choosing it imposes on the worker's pending
/// requests (v5/v6; 0 without `marginal_delay`).
pub fn priced_candidates(
    shape: &Shape,
    w: &DenWorker,
    cost: &CostModel,
    opts: &DenOptions,
) -> Vec<(Candidate, f64)> {
    let pricer = Pricer::new(shape, &w.load, cost, opts);
    let mut base = base_candidate(shape, w.id.clone(), &w.load, cost, opts);
    let base_delay = pricer.price(&mut base);
    let queue = base.queue_ms;
    let mut walk = Walk::default();
    let mut steps: Vec<(Walk, Option<Source>)> = Vec::new();
    for (i, src) in w.sources.iter().enumerate() {
        let Some(src) = *src else { break };
        let tokens = shape.block_tokens.get(i).copied().unwrap_or(0);
        walk.add(src, tokens, cost);
        steps.push((walk, Some(src)));
    }
    let mut out = Vec::with_capacity(steps.len().min(8) + 1);
    for (k, &(at, src)) in steps.iter().enumerate() {
        let next = steps.get(k + 1);
        let prev = k.checked_sub(1).and_then(|p| steps.get(p));
        let run_end = next.and_then(|s| s.1) != src;
        let run_start = prev.and_then(|s| s.1) != src;
        let backlog = opts.link_backlog.then_some(&w.load);
        let load_k = at.load_ms(cost, backlog);
        let crossing = load_k <= queue && next.is_some_and(|s| s.0.load_ms(cost, backlog) > queue);
        let after_crossing =
            prev.is_some_and(|s| s.0.load_ms(cost, backlog) <= queue) && load_k > queue;
        if run_end || run_start || crossing || after_crossing {
            let mut c = at.candidate(&base, shape, &w.load, cost, opts);
            let delay = pricer.price(&mut c);
            out.push((c, delay));
        }
    }
    out.insert(0, (base, base_delay));
    if opts.capacity_wait {
        for (c, _) in &mut out {
            apply_capacity_wait(c, shape, &w.load);
        }
    }
    out
}

/// Prices one worker's candidates for one request: v6 replays the engine plan with the
/// request added (queue and imposed delay), v5 uses the last-step model, older versions
/// neither.
struct Pricer<'a> {
    shape: &'a Shape<'a>,
    load: &'a WorkerLoad,
    cost: &'a CostModel,
    opts: &'a DenOptions,
    /// v6: Σ of the pending requests' finish times without this request.
    without_ms: Option<f64>,
}

impl<'a> Pricer<'a> {
    fn new(
        shape: &'a Shape<'a>,
        load: &'a WorkerLoad,
        cost: &'a CostModel,
        opts: &'a DenOptions,
    ) -> Pricer<'a> {
        let without_ms = opts
            .replay
            .then(|| replay(&load.plan, cost, None).total_ms());
        Pricer {
            shape,
            load,
            cost,
            opts,
            without_ms,
        }
    }

    /// Sets `c.queue_ms` from the replay (v6) and returns the delay `c` imposes.
    fn price(&self, c: &mut Candidate) -> f64 {
        let Some(without) = self.without_ms else {
            return if self.opts.marginal_delay {
                imposed_ms(self.shape, c.cached_token_count, self.load, self.cost)
            } else {
                0.0
            };
        };
        let joiner = PendingPrefill {
            ready_in_ms: c.prefix_load_ms + c.gpu_restore_ms,
            done_tokens: c.cached_token_count,
            input_tokens: self.shape.input_tokens,
        };
        let with = replay(&self.load.plan, self.cost, Some(joiner));
        if let Some(finish) = with.joiner_finish_ms {
            // Everything before its own compute: waiting for other work and for its
            // prefix (the load overlaps it), so `estimate` gives back `finish`.
            let own = self.shape.processed().saturating_sub(c.cached_token_count) as f64
                * c.prefill_ms_per_token;
            c.queue_ms = (finish - c.gpu_restore_ms - own).max(0.0);
        }
        if self.opts.marginal_delay {
            (with.total_ms() - without).max(0.0)
        } else {
            0.0
        }
    }
}

/// v5: the delay a request reusing `cached` tokens imposes on the worker's pending
/// requests: its first chunk fills the rest of their last prefill step, which then takes
/// longer by that chunk's compute, for every request finishing in that step.
pub fn imposed_ms(shape: &Shape, cached: u32, load: &WorkerLoad, cost: &CostModel) -> f64 {
    let (fill, finishers) = load.plan.tail_step(cost);
    if finishers == 0 {
        return 0.0;
    }
    let room = load.plan.step_budget(cost).saturating_sub(fill);
    let take = room.min(shape.input_tokens.saturating_sub(cached));
    let chunk = cost.solo_prefill_ms(cached, cached + take) * load.prefill_calibration;
    chunk * finishers as f64
}

/// v4: when the pool cannot take the request now, the candidate stays feasible if the
/// worker's running requests will release enough blocks, and the wait for them is part
/// of its queue time.
fn apply_capacity_wait(c: &mut Candidate, shape: &Shape, load: &WorkerLoad) {
    let target = shape.processed() as u64 + shape.output_tokens as u64;
    let resident = if c.tier == Tier::Gpu {
        pages_for(c.cached_token_count as u64, c.page_size)
    } else {
        0
    };
    let required =
        pages_for(target, c.page_size).saturating_sub(resident) + load.waiting_blocks as u64;
    let mut available = c.free_pages as u64 + c.evictable_pages as u64;
    if required <= available {
        return;
    }
    for &(at_ms, blocks) in &load.releases {
        available += blocks as u64;
        if required <= available {
            c.queue_ms = c.queue_ms.max(at_ms);
            c.evictable_pages = u32::try_from(available - c.free_pages as u64).unwrap_or(u32::MAX);
            return;
        }
    }
}

fn base_candidate(
    shape: &Shape,
    id: WorkerId,
    load: &WorkerLoad,
    cost: &CostModel,
    opts: &DenOptions,
) -> Candidate {
    Candidate {
        worker_id: id,
        worker_epoch: Epoch(0),
        tier: Tier::None,
        cached_token_count: 0,
        cached_bytes: 0,
        queue_ms: queue_ms(load, opts),
        prefix_load_ms: 0.0,
        gpu_restore_ms: 0.0,
        prefill_ms_per_token: prefill_ms_per_token(shape, 0, load, cost, opts),
        // The engine samples the first token at the end of the prefill's last step; the
        // replay (v6) ends there, so a further decode step would double count it.
        first_token_ms: if opts.replay {
            0.0
        } else {
            load.decode_step_ms
        },
        page_size: cost.block_tokens,
        free_pages: load.free_blocks,
        evictable_pages: load.evictable_blocks,
        max_context: cost.max_context,
        online: true,
        model_loaded: true,
        exact: true,
        source_continuation_id: None,
        transfer: TransferCapabilities::default(),
    }
}

/// The predicted wait before this request's prefill starts on a worker.
pub fn queue_ms(load: &WorkerLoad, opts: &DenOptions) -> f64 {
    match opts.queue {
        QueueModel::PendingPrefill => {
            load.pending_prefill_tokens as f64 * load.prefill_ms_per_token
        }
        QueueModel::Calibrated => load.pending_prefill_model_ms * load.prefill_calibration,
    }
}

/// The per-token prefill cost to put in a candidate reusing `cached` tokens, such that
/// `missing × per_token` is the predicted prefill time of the rest of the prompt.
pub fn prefill_ms_per_token(
    shape: &Shape,
    cached: u32,
    load: &WorkerLoad,
    cost: &CostModel,
    opts: &DenOptions,
) -> f64 {
    match opts.queue {
        QueueModel::PendingPrefill => load.prefill_ms_per_token,
        QueueModel::Calibrated => {
            let missing = shape.processed().saturating_sub(cached).max(1);
            load.prefill_calibration * cost.solo_prefill_ms(cached, shape.input_tokens)
                / missing as f64
        }
    }
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

/// Cumulative state of the durable walk up to a boundary.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Walk {
    tokens: u32,
    gpu_tokens: u32,
    ram_bytes: u64,
    ssd_bytes: u64,
    object_bytes: u64,
    slowest: Option<Source>,
}

impl Walk {
    fn add(&mut self, src: Source, tokens: u32, cost: &CostModel) {
        let bytes = cost.kv_bytes(tokens as u64);
        self.tokens += tokens;
        match src {
            Source::Gpu => self.gpu_tokens += tokens,
            Source::Ram => self.ram_bytes += bytes,
            Source::Ssd => self.ssd_bytes += bytes,
            Source::Object => self.object_bytes += bytes,
        }
        if self.slowest.is_none_or(|s| src > s) {
            self.slowest = Some(src);
        }
    }

    /// Lower tier → host RAM, ms: per tier its fixed cost once plus bytes / throughput,
    /// summed (sequential, spec §6.1); with `backlog`, after the link's queue drains.
    fn load_ms(&self, cost: &CostModel, backlog: Option<&WorkerLoad>) -> f64 {
        let mut ms = 0.0;
        if self.ssd_bytes > 0 {
            ms += cost.nvme_us(self.ssd_bytes) as f64 / 1000.0
                + backlog.map_or(0.0, |l| l.nvme_backlog_ms);
        }
        if self.object_bytes > 0 {
            ms += cost
                .object_us(self.object_bytes)
                .map_or(f64::INFINITY, |us| us as f64 / 1000.0)
                + backlog.map_or(0.0, |l| l.object_backlog_ms);
        }
        ms
    }

    fn restore_bytes(&self) -> u64 {
        self.ram_bytes + self.ssd_bytes + self.object_bytes
    }

    fn candidate(
        &self,
        base: &Candidate,
        shape: &Shape,
        load: &WorkerLoad,
        cost: &CostModel,
        opts: &DenOptions,
    ) -> Candidate {
        let backlog = opts.link_backlog.then_some(load);
        let restore_bytes = self.restore_bytes();
        let mut restore_ms = cost.pcie_us(restore_bytes) as f64 / 1000.0;
        if restore_bytes > 0
            && let Some(l) = backlog
        {
            // The copy queue drains while the request waits for its load or queue.
            let overlap = base.queue_ms.max(self.load_ms(cost, backlog));
            restore_ms += (l.pcie_backlog_ms - overlap).max(0.0);
        }
        let tier = match self.slowest {
            Some(Source::Gpu) | None => Tier::Gpu,
            Some(Source::Ram) => Tier::Ram,
            Some(Source::Ssd) => Tier::Ssd,
            Some(Source::Object) => Tier::Object,
        };
        Candidate {
            tier,
            cached_token_count: self.tokens,
            cached_bytes: cost.kv_bytes(self.tokens as u64),
            prefix_load_ms: self.load_ms(cost, backlog),
            gpu_restore_ms: restore_ms,
            prefill_ms_per_token: prefill_ms_per_token(shape, self.tokens, load, cost, opts),
            ..base.clone()
        }
    }
}
