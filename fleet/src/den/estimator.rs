//! The study steps' candidates and the inputs of their estimate (v1 … v6): their own
//! walk over a prefix that mixes tiers, with the queue (pending-work sum or a replay of
//! the engine plan), the imposed delay, the capacity wait and link backlogs. What
//! den-agent runs (`--den router`) builds nothing here: it is den-agent's router node
//! itself ([`super::NodePolicy`]).

use super::{DenOptions, DenWorker, QueueModel, Shape};
use crate::cost::CostModel;
use crate::load::WorkerLoad;
use crate::plan::replay;
use crate::worker::Source;
use den_protocol::candidate::{Candidate, Tier, TransferCapabilities, pages_for};
use den_protocol::engine_plan::price;
use den_protocol::ids::{Epoch, WorkerId};

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
        let without_ms = opts.replay.then(|| replay(&load.plan, None).total_ms());
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
        // The router's pricing, the same function (den_protocol::engine_plan::price).
        price(
            &self.load.plan,
            without,
            c,
            self.shape.input_tokens,
            self.shape.processed(),
        );
        if !self.opts.marginal_delay {
            c.imposed_ms = 0.0;
        }
        c.imposed_ms
    }
}

/// v5: the delay a request reusing `cached` tokens imposes on the worker's pending
/// requests: its first chunk fills the rest of their last prefill step, which then takes
/// longer by that chunk's compute, for every request finishing in that step.
pub fn imposed_ms(shape: &Shape, cached: u32, load: &WorkerLoad, cost: &CostModel) -> f64 {
    let (fill, finishers) = load.plan.tail_step();
    if finishers == 0 {
        return 0.0;
    }
    let room = load.plan.step_budget().saturating_sub(fill);
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
        resident_token_count: 0,
        transfer: TransferCapabilities::default(),
        imposed_ms: 0.0,
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
            // The copy queue drains while the request waits for its load or queue. v6
            // also counts the copies that requests ahead of it in the admission queue
            // will book.
            let overlap = base.queue_ms.max(self.load_ms(cost, backlog));
            let queued = if opts.replay { l.pcie_queued_ms } else { 0.0 };
            restore_ms += (l.pcie_backlog_ms + queued - overlap).max(0.0);
        }
        let tier = self.slowest.map_or(Tier::Gpu, tier_of);
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

fn tier_of(src: Source) -> Tier {
    match src {
        Source::Gpu => Tier::Gpu,
        Source::Ram => Tier::Ram,
        Source::Ssd => Tier::Ssd,
        Source::Object => Tier::Object,
    }
}
