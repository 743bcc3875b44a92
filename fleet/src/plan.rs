//! Replaying a worker's prefill plan: when each pending request will finish its prefill,
//! with and without one more request.
//!
//! A worker knows its scheduler state — the requests pending prefill in FCFS order, how
//! much of each is done and when each is ready to compute (its prefix loaded and
//! restored) — and the rules its engine schedules by (chunked prefill: each step gives
//! the token budget left by the decoding sequences to the ready requests in FCFS order).
//! Replaying those rules with the cost model predicts the step sequence, so the router
//! sees what a sum of pending work cannot: a request that is not ready yet lets later
//! ones run first, and a new request's first chunk joins — and lengthens — the last step
//! of the requests before it. Future arrivals are not predicted.

use super::cost::{CostModel, positions};

/// One request pending prefill on a worker, as the worker reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PendingPrefill {
    /// When its prefix is on the GPU and it can compute, ms from now (0: ready).
    pub ready_in_ms: f64,
    /// Prompt tokens with KV already (reused or computed, including the step in flight).
    pub done_tokens: u32,
    pub input_tokens: u32,
}

impl PendingPrefill {
    pub fn left(&self) -> u32 {
        self.input_tokens.saturating_sub(self.done_tokens)
    }
}

/// What a worker's engine is doing, enough to replay its next steps.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EnginePlan {
    /// Pending prefills in FCFS order (admitted first, then waiting).
    pub pending: Vec<PendingPrefill>,
    /// Sequences decoding now.
    pub decoding: u32,
    /// KV tokens the decoding sequences read per step.
    pub decode_context_tokens: u64,
    /// Until the step in flight ends, ms.
    pub step_remaining_ms: f64,
    /// Measured / modelled duration of this worker's steps.
    pub step_calibration: f64,
}

impl EnginePlan {
    /// The prefill token budget per step that the decoding sequences leave.
    pub fn step_budget(&self, cost: &CostModel) -> u32 {
        cost.max_batched_tokens.saturating_sub(self.decoding).max(1)
    }

    /// Packs the pending prefill (FCFS, ignoring ready times) into steps of the budget:
    /// the tokens in the last, partly filled step and how many requests finish in it.
    /// Nothing pending, or a full last step, gives `(0, 0)`.
    pub fn tail_step(&self, cost: &CostModel) -> (u32, u32) {
        let budget = self.step_budget(cost) as u64;
        let mut cum = 0u64;
        let mut last_step = 0u64;
        let mut finishers = 0u32;
        for r in self.pending.iter().filter(|r| r.left() > 0) {
            cum += r.left() as u64;
            let step = cum.div_ceil(budget);
            if step == last_step {
                finishers += 1;
            } else {
                last_step = step;
                finishers = 1;
            }
        }
        let fill = cum - last_step.saturating_sub(1) * budget;
        if cum == 0 || fill >= budget {
            return (0, 0);
        }
        (u32::try_from(fill).unwrap_or(u32::MAX), finishers)
    }
}

/// Finish times of a replay, ms from now.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Replay {
    /// Per pending request (same order); 0 for a request with nothing left.
    pub finish_ms: Vec<f64>,
    /// The added request's, when one was added.
    pub joiner_finish_ms: Option<f64>,
}

impl Replay {
    /// Sum of the pending requests' finish times.
    pub fn total_ms(&self) -> f64 {
        self.finish_ms.iter().sum()
    }
}

/// Upper bound on replayed steps (a full 131 k-token context is 16 steps; a queue of
/// many such requests stays far below this). Past it the replay stops and unfinished
/// requests finish "at the end", which only happens for absurd inputs.
const MAX_STEPS: usize = 100_000;

/// Replays `plan` with `joiner` (if any) appended last in FCFS order.
pub fn replay(plan: &EnginePlan, cost: &CostModel, joiner: Option<PendingPrefill>) -> Replay {
    let mut reqs: Vec<PendingPrefill> = plan.pending.clone();
    if let Some(j) = joiner {
        reqs.push(j);
    }
    let mut finish = vec![0.0; reqs.len()];
    // Requests finishing their prefill start decoding too, but for how long is unknown
    // (a worker knows its mean output length, not this request's); their decode adds
    // well under a millisecond per 8 k-token step, so the decode set is held fixed.
    let decoding = plan.decoding;
    let context = plan.decode_context_tokens;
    let calibration = if plan.step_calibration > 0.0 {
        plan.step_calibration
    } else {
        1.0
    };
    let mut t = plan.step_remaining_ms.max(0.0);
    let mut left: usize = reqs.iter().filter(|r| r.left() > 0).count();
    let mut chunks: Vec<(usize, u32)> = Vec::new();
    for _ in 0..MAX_STEPS {
        if left == 0 {
            break;
        }
        let mut budget = plan.step_budget(cost);
        chunks.clear();
        let mut next_ready = f64::INFINITY;
        let (mut tokens, mut attention) = (0u64, 0.0);
        for (i, r) in reqs.iter().enumerate() {
            let rest = r.left();
            if rest == 0 {
                continue;
            }
            if r.ready_in_ms > t {
                next_ready = next_ready.min(r.ready_in_ms);
                continue;
            }
            if budget == 0 {
                break;
            }
            let take = budget.min(rest);
            attention += positions(r.done_tokens, r.done_tokens + take);
            tokens += take as u64;
            budget -= take;
            chunks.push((i, take));
        }
        if chunks.is_empty() {
            if !next_ready.is_finite() {
                break;
            }
            // Decode-only steps run until a boundary at or after the next ready time.
            let step = if decoding > 0 {
                cost.step_us(0, 0.0, decoding as u64, context) as f64 / 1e3 * calibration
            } else {
                0.0
            };
            t = if step > 0.0 {
                t + ((next_ready - t) / step).ceil().max(1.0) * step
            } else {
                next_ready
            };
            continue;
        }
        t += cost.step_us(tokens, attention, decoding as u64, context) as f64 / 1e3 * calibration;
        for &(i, take) in &chunks {
            let Some(r) = reqs.get_mut(i) else { continue };
            r.done_tokens += take;
            if r.left() == 0 {
                if let Some(f) = finish.get_mut(i) {
                    *f = t;
                }
                left -= 1;
            }
        }
    }
    for (f, r) in finish.iter_mut().zip(&reqs) {
        if r.left() > 0 {
            *f = t;
        }
    }
    let joiner_finish_ms = joiner.and_then(|_| finish.pop());
    Replay {
        finish_ms: finish,
        joiner_finish_ms,
    }
}
