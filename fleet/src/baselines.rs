//! What operators run today: Dynamo's KV router, SGLang's cache-aware router and the
//! llm-d inference scheduler, each reduced to its documented selection rule.
//!
//! Each rule is a pure function over a few numbers per worker (testable on hand-made
//! situations), wrapped in a [`Policy`] that reads those numbers from the [`FleetView`].
//! All three are given *exact* GPU residency — the "precise" modes fed by engine KV
//! events (Dynamo's default `KvIndexer`; SGLang's event-built `PositionalIndexer`;
//! llm-d's `precise-prefix-cache-scorer`) — rather than their approximate, routed-request
//! indexes. That is the strongest version of each, so a win against them is not a win
//! against a strawman. None of them sees host RAM, SSD or object-store contents (the
//! routers index device KV events); the *workers* still reuse whatever those tiers hold.

use serde::{Deserialize, Serialize};

use super::policy::{FleetView, Policy, Route, RouteRequest, argmin_u32};

/// Dynamo's KV router [src: ai-dynamo/dynamo `docs/architecture/kv_cache_routing.md`,
/// "Cost Calculation"]: per worker
/// `cost = overlap_score_weight × prefill_blocks + decode_blocks`, lowest wins
/// (`--router-temperature 0`, the default: deterministic argmin).
/// - `prefill_blocks` = (prompt tokens the worker has yet to prefill + this request's
///   tokens not in its device cache) / block size;
/// - `decode_blocks` = KV blocks of the worker's active sequences.
///
/// `overlap_score_weight` defaults to 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DynamoPolicy {
    pub overlap_score_weight: f64,
}

impl Default for DynamoPolicy {
    fn default() -> Self {
        DynamoPolicy {
            overlap_score_weight: 1.0,
        }
    }
}

/// Dynamo's per-worker inputs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DynamoInput {
    pub prefill_blocks: f64,
    pub decode_blocks: f64,
}

/// Dynamo's cost of one worker.
pub fn dynamo_cost(weight: f64, w: &DynamoInput) -> f64 {
    weight * w.prefill_blocks + w.decode_blocks
}

/// Dynamo's choice: the lowest cost, the lowest index on ties.
pub fn dynamo_choose(weight: f64, workers: &[DynamoInput]) -> usize {
    let mut best = 0;
    let mut best_cost = f64::INFINITY;
    for (i, w) in workers.iter().enumerate() {
        let c = dynamo_cost(weight, w);
        if c < best_cost {
            best = i;
            best_cost = c;
        }
    }
    best
}

impl Policy for DynamoPolicy {
    fn name(&self) -> &'static str {
        "dynamo"
    }

    fn route(&mut self, request: &RouteRequest, fleet: &FleetView) -> Route {
        let block = fleet.cost.block_tokens.max(1) as f64;
        let inputs: Vec<DynamoInput> = (0..fleet.worker_count())
            .map(|w| {
                let load = fleet.load(w);
                let overlap: u32 = request
                    .blocks
                    .iter()
                    .take(fleet.gpu_prefix(w, request.blocks) as usize)
                    .map(|&b| fleet.block_tokens(b))
                    .sum();
                let new_tokens = request.input_tokens.saturating_sub(overlap) as f64;
                DynamoInput {
                    prefill_blocks: (load.pending_prefill_tokens as f64 + new_tokens) / block,
                    decode_blocks: load.active_blocks as f64,
                }
            })
            .collect();
        Route::to(dynamo_choose(self.overlap_score_weight, &inputs))
    }
}

/// SGLang's cache-aware router (sgl-router, now SMG) [src: lightseekorg/smg
/// `docs/concepts/routing/cache-aware.md`; `anchors.md` §5]:
/// 1. if `max_load − min_load > balance_abs_threshold` (64) **and**
///    `max_load > balance_rel_threshold × min_load` (1.5): route to the least-loaded
///    worker (load = requests in flight);
/// 2. otherwise take the worker with the longest prefix match; if its match ratio
///    (matched / prompt tokens) exceeds `cache_threshold` (0.3) route there;
/// 3. otherwise route to the least-loaded worker (the load-aware miss fallback of sglang
///    PR #14305, rather than the older smallest-tree rule that caused a "death spiral").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SglangPolicy {
    pub cache_threshold: f64,
    pub balance_abs_threshold: u32,
    pub balance_rel_threshold: f64,
}

impl Default for SglangPolicy {
    fn default() -> Self {
        SglangPolicy {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
        }
    }
}

/// SGLang's per-worker inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SglangInput {
    /// Requests in flight on the worker.
    pub load: u32,
    /// Prompt tokens matched by the worker's cached prefix.
    pub matched_tokens: u32,
}

/// Which branch of the SGLang rule decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SglangMode {
    /// The load gap exceeded both thresholds.
    Imbalanced,
    /// The longest match was above the cache threshold.
    CacheHit,
    /// No match good enough: least-loaded.
    CacheMiss,
}

impl SglangPolicy {
    /// The SGLang choice for a prompt of `input_tokens` tokens.
    pub fn choose(&self, workers: &[SglangInput], input_tokens: u32) -> (usize, SglangMode) {
        let loads: Vec<u32> = workers.iter().map(|w| w.load).collect();
        let max = loads.iter().copied().max().unwrap_or(0);
        let min = loads.iter().copied().min().unwrap_or(0);
        let least = argmin_u32(&loads);
        if max - min > self.balance_abs_threshold
            && max as f64 > self.balance_rel_threshold * min as f64
        {
            return (least, SglangMode::Imbalanced);
        }
        let mut best = 0;
        for (i, w) in workers.iter().enumerate() {
            let Some(b) = workers.get(best) else { break };
            if w.matched_tokens > b.matched_tokens
                || (w.matched_tokens == b.matched_tokens && w.load < b.load)
            {
                best = i;
            }
        }
        let matched = workers.get(best).map_or(0, |w| w.matched_tokens);
        let ratio = matched as f64 / input_tokens.max(1) as f64;
        if ratio > self.cache_threshold {
            (best, SglangMode::CacheHit)
        } else {
            (least, SglangMode::CacheMiss)
        }
    }
}

impl Policy for SglangPolicy {
    fn name(&self) -> &'static str {
        "sglang"
    }

    fn route(&mut self, request: &RouteRequest, fleet: &FleetView) -> Route {
        let inputs: Vec<SglangInput> = (0..fleet.worker_count())
            .map(|w| SglangInput {
                load: fleet.load(w).in_flight(),
                matched_tokens: request
                    .blocks
                    .iter()
                    .take(fleet.gpu_prefix(w, request.blocks) as usize)
                    .map(|&b| fleet.block_tokens(b))
                    .sum(),
            })
            .collect();
        Route::to(self.choose(&inputs, request.input_tokens).0)
    }
}

/// The llm-d inference scheduler's default profile [src: llm-d "intelligent inference
/// scheduling" well-lit path, `EndpointPickerConfig` with `queue-scorer` weight 2,
/// `kv-cache-utilization-scorer` weight 2, `prefix-cache-scorer` weight 3 and the
/// `max-score-picker`; scorer definitions from the Gateway API Inference Extension]:
/// - queue: `(max_waiting − waiting) / (max_waiting − min_waiting)` over candidates, 1 when
///   all are equal (min-max normalised waiting-queue length);
/// - KV utilisation: `1 − kv_cache_usage`;
/// - prefix: matched blocks / prompt blocks.
///
/// Highest weighted sum wins; the lowest index on ties (deterministic, as llm-d-router
/// PR #2515 asks, instead of random).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LlmdPolicy {
    pub queue_weight: f64,
    pub kv_weight: f64,
    pub prefix_weight: f64,
}

impl Default for LlmdPolicy {
    fn default() -> Self {
        LlmdPolicy {
            queue_weight: 2.0,
            kv_weight: 2.0,
            prefix_weight: 3.0,
        }
    }
}

/// llm-d's per-worker inputs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LlmdInput {
    pub waiting: u32,
    pub kv_usage: f64,
    /// Matched prompt blocks / prompt blocks.
    pub prefix_fraction: f64,
}

impl LlmdPolicy {
    /// Weighted score of every worker.
    pub fn scores(&self, workers: &[LlmdInput]) -> Vec<f64> {
        let max = workers.iter().map(|w| w.waiting).max().unwrap_or(0);
        let min = workers.iter().map(|w| w.waiting).min().unwrap_or(0);
        workers
            .iter()
            .map(|w| {
                let queue = if max == min {
                    1.0
                } else {
                    (max - w.waiting) as f64 / (max - min) as f64
                };
                let kv = (1.0 - w.kv_usage).clamp(0.0, 1.0);
                let prefix = w.prefix_fraction.clamp(0.0, 1.0);
                self.queue_weight * queue + self.kv_weight * kv + self.prefix_weight * prefix
            })
            .collect()
    }

    /// The highest score, the lowest index on ties.
    pub fn choose(&self, workers: &[LlmdInput]) -> usize {
        let mut best = 0;
        let mut best_score = f64::NEG_INFINITY;
        for (i, s) in self.scores(workers).into_iter().enumerate() {
            if s > best_score {
                best = i;
                best_score = s;
            }
        }
        best
    }
}

impl Policy for LlmdPolicy {
    fn name(&self) -> &'static str {
        "llm-d"
    }

    fn route(&mut self, request: &RouteRequest, fleet: &FleetView) -> Route {
        let blocks = request.blocks.len().max(1) as f64;
        let inputs: Vec<LlmdInput> = (0..fleet.worker_count())
            .map(|w| {
                let load = fleet.load(w);
                LlmdInput {
                    waiting: load.waiting,
                    kv_usage: load.kv_usage(),
                    prefix_fraction: fleet.gpu_prefix(w, request.blocks) as f64 / blocks,
                }
            })
            .collect();
        Route::to(self.choose(&inputs))
    }
}
