//! What a router observes of one worker: the per-worker load every policy reads.

use super::cost::CostModel;
use super::plan::EnginePlan;

/// A worker's load as a router observes it (all policies see the same, current values).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkerLoad {
    /// Routed here, not yet admitted (vLLM's `num_requests_waiting`).
    pub waiting: u32,
    /// Admitted: prefilling or decoding (vLLM's `num_requests_running`).
    pub running: u32,
    /// Prompt tokens still to be computed by waiting and prefilling requests.
    pub pending_prefill_tokens: u64,
    /// Modelled solo prefill time of that pending work, ms ([`CostModel::solo_prefill_ms`]
    /// over each request's remaining range); multiply by `prefill_calibration`.
    pub pending_prefill_model_ms: f64,
    /// Measured / modelled prefill time (EWMA over completed prefills): how much slower
    /// than the roofline this worker's prefills really run (decode interference, batching).
    pub prefill_calibration: f64,
    /// Time until the worker's NVMe read queue drains, ms.
    pub nvme_backlog_ms: f64,
    /// Time until the worker's object-store download queue drains, ms.
    pub object_backlog_ms: f64,
    /// Time until the worker's host → GPU copy queue drains, ms.
    pub pcie_backlog_ms: f64,
    /// Host → GPU copy time that requests waiting for admission will book when admitted
    /// (FCFS, so before any request routed now), ms.
    pub pcie_queued_ms: f64,
    /// KV blocks held or reserved by requests routed here and not finished.
    pub active_blocks: u32,
    pub capacity_blocks: u32,
    pub free_blocks: u32,
    pub evictable_blocks: u32,
    /// Measured prefill cost (EWMA of per-request prefill wall time / tokens), ms.
    pub prefill_ms_per_token: f64,
    /// Measured duration of a decode step (EWMA), ms: the cost of the first token.
    pub decode_step_ms: f64,
    /// Time until the step in progress ends, ms.
    pub step_remaining_ms: f64,
    /// Pool blocks the waiting requests (ahead of a new one, FCFS) still need.
    pub waiting_blocks: u32,
    /// For each running request: expected ms until it finishes and the blocks it then
    /// releases, soonest first (remaining prefill at the calibrated rate, then the
    /// worker's mean output length so far — not the request's true length, which a real
    /// worker cannot know — at the measured decode step).
    pub releases: Vec<(f64, u32)>,
    /// The engine's pending prefills and decode state, to replay its next steps.
    pub plan: EnginePlan,
    /// The worker's reported `queue_ms`: 0 here (every simulated engine reports a plan,
    /// which the router replays instead), plus [`WorkerLoad::unreflected_ms`].
    pub queue_ms: f64,
    /// With heartbeat-lagged observations: the work the router offered this worker since
    /// its last heartbeat, ms, which den's router adds to every candidate's queue after
    /// pricing it against the plan (`den_protocol::router_node::inflight`).
    pub unreflected_ms: f64,
}

impl WorkerLoad {
    /// An idle worker with an empty pool of `capacity_blocks` and the seed calibration of
    /// `cost` (for tests and tools that build observations by hand).
    pub fn idle(capacity_blocks: u32, cost: &CostModel) -> WorkerLoad {
        WorkerLoad {
            capacity_blocks,
            free_blocks: capacity_blocks,
            prefill_calibration: 1.0,
            prefill_ms_per_token: cost.solo_prefill_ms(0, 4096) / 4096.0,
            decode_step_ms: cost.step_us(0, 0.0, 1, 4096) as f64 / 1000.0,
            plan: cost.idle_plan(),
            ..WorkerLoad::default()
        }
    }

    /// Requests routed here and not finished.
    pub fn in_flight(&self) -> u32 {
        self.waiting + self.running
    }

    /// Fraction of the pool held by requests (cached, unpinned blocks count as free, as
    /// in vLLM's `kv_cache_usage`).
    pub fn kv_usage(&self) -> f64 {
        if self.capacity_blocks == 0 {
            return 1.0;
        }
        let used = self
            .capacity_blocks
            .saturating_sub(self.free_blocks + self.evictable_blocks);
        used as f64 / self.capacity_blocks as f64
    }
}
