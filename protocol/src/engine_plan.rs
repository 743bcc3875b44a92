//! A worker's engine plan, as its heartbeat reports it, and the replay that prices a
//! candidate against it: when each pending request will finish its prefill, with and
//! without one more request.
//!
//! A batching worker knows its scheduler state — the requests pending prefill in FCFS
//! order, how much of each is done and when each is ready to compute (its prefix loaded
//! and restored) — the rules it schedules by (chunked prefill: each step gives the token
//! budget left by the decoding sequences to the ready requests in FCFS order), and what
//! its steps cost ([`StepCosts`], measured by the worker). Replaying those rules predicts
//! the step sequence, so the router sees what a sum of pending work cannot: a request
//! that is not ready yet lets later ones run first, and a new request's first chunk
//! joins — and lengthens — the last step of the requests before it ([`price`]). Future
//! arrivals are not predicted.
//!
//! The router ([`crate::candidate_generation`]) and the fleet simulator's den policy
//! price through this one module.

use serde::{Deserialize, Serialize};

use crate::candidate::Candidate;

/// What one engine step costs, µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StepCosts {
    /// A batched step: every row (prefill token or decode sequence) costs `row_us` of
    /// compute, but a step never takes less than one pass over the weights
    /// (`weights_pass_us`, memory-bound); attention adds per (new token × earlier
    /// position) and per KV token the decoding sequences read.
    Batched {
        row_us: f64,
        weights_pass_us: f64,
        attention_us_per_position: f64,
        context_us_per_token: f64,
    },
    /// A CPU engine's steps as its worker measured them (den-model): a fixed cost per
    /// step (the weight pass and the threads' hand-offs), plus one per row, per causal
    /// attention position of the prompt rows and per KV token the decoding rows read — a
    /// least-squares fit of the worker's own recent steps. Linear, not floored like
    /// [`StepCosts::Batched`]: on a CPU a row's compute adds to the pass, it does not hide
    /// behind it (measured on SmolLM2, one thread: 66 ms + 2.7 ms/row + 8 µs/position
    /// described 203 steps of 1–64 rows within a median 3.5 %).
    Fitted {
        step_us: f64,
        row_us: f64,
        attention_us_per_position: f64,
        context_us_per_token: f64,
    },
    /// den's synthetic engine on the batching scheduler, at its declared costs: prompt
    /// rows cost `prefill_us_per_token` each; a step with decode rows takes at least one
    /// pass, `decode_us_per_step` whatever the batch, or `first_token_us` when it yields
    /// some decode's first token and that is dearer ([`StepCosts::first_token_floor_us`]).
    /// No floor for a step of prompt rows only: the declared prefill cost is per token.
    Synthetic {
        prefill_us_per_token: f64,
        decode_us_per_step: f64,
        first_token_us: f64,
    },
}

impl StepCosts {
    /// Duration of a step of `prefill_tokens` new prompt tokens whose causal attention
    /// covers `attention_positions` (Σ of their positions) and `decoding` sequences
    /// reading `decode_context` KV tokens, in whole µs (rounded up).
    pub fn step_us(
        &self,
        prefill_tokens: u64,
        attention_positions: f64,
        decoding: u64,
        decode_context: u64,
    ) -> u64 {
        match *self {
            StepCosts::Synthetic {
                prefill_us_per_token,
                decode_us_per_step,
                ..
            } => {
                let rows = (prefill_tokens + decoding) as f64;
                let pass = if decoding > 0 {
                    decode_us_per_step
                } else {
                    0.0
                };
                let us = (rows * prefill_us_per_token).max(pass);
                if us.is_finite() && us > 0.0 {
                    us.ceil() as u64
                } else {
                    0
                }
            }
            StepCosts::Batched {
                row_us,
                weights_pass_us,
                attention_us_per_position,
                context_us_per_token,
            } => {
                let rows = (prefill_tokens + decoding) as f64;
                let us = (row_us * rows).max(weights_pass_us)
                    + attention_us_per_position * attention_positions
                    + context_us_per_token * decode_context as f64;
                if us.is_finite() && us > 0.0 {
                    us.ceil() as u64
                } else {
                    0
                }
            }
            StepCosts::Fitted {
                step_us,
                row_us,
                attention_us_per_position,
                context_us_per_token,
            } => {
                let rows = (prefill_tokens + decoding) as f64;
                if rows == 0.0 {
                    return 0;
                }
                let us = step_us
                    + row_us * rows
                    + attention_us_per_position * attention_positions
                    + context_us_per_token * decode_context as f64;
                if us.is_finite() && us > 0.0 {
                    us.ceil() as u64
                } else {
                    0
                }
            }
        }
    }

    /// The least a step that yields a decode's first token takes, µs: the synthetic
    /// engine's declared first-token cost (0 for a measured batched engine, whose first
    /// token is one more row).
    pub fn first_token_floor_us(&self) -> f64 {
        match *self {
            StepCosts::Synthetic { first_token_us, .. } => first_token_us,
            StepCosts::Batched { .. } | StepCosts::Fitted { .. } => 0.0,
        }
    }

    /// What the step that samples a first token takes when it carries little else, ms:
    /// one pass over the weights (at least one row), or the synthetic engine's declared
    /// first-token floor.
    pub fn first_token_step_ms(&self) -> f64 {
        let us = match *self {
            StepCosts::Synthetic {
                prefill_us_per_token,
                decode_us_per_step,
                first_token_us,
            } => prefill_us_per_token
                .max(decode_us_per_step)
                .max(first_token_us),
            StepCosts::Batched {
                row_us,
                weights_pass_us,
                ..
            } => row_us.max(weights_pass_us),
            StepCosts::Fitted {
                step_us, row_us, ..
            } => step_us + row_us,
        };
        if us.is_finite() {
            us.max(0.0) / 1e3
        } else {
            0.0
        }
    }

    /// [`StepCosts::step_us`] of a step that yields at least one first token when
    /// `first_token` (the synthetic engine's worker and the fleet simulator's charge it).
    pub fn step_us_with_first(
        &self,
        prefill_tokens: u64,
        attention_positions: f64,
        decoding: u64,
        decode_context: u64,
        first_token: bool,
    ) -> u64 {
        let us = self.step_us(
            prefill_tokens,
            attention_positions,
            decoding,
            decode_context,
        );
        let floor = self.first_token_floor_us();
        if first_token && floor.is_finite() && floor > us as f64 {
            floor.ceil() as u64
        } else {
            us
        }
    }
}

/// Σ of the causal attention positions of tokens `[start, end)`.
pub fn positions(start: u32, end: u32) -> f64 {
    if end <= start {
        return 0.0;
    }
    let (s, e) = (start as f64, end as f64);
    (e * (e - 1.0) - s * (s - 1.0)) / 2.0
}

/// One request pending prefill on a worker.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnginePlan {
    /// Rows of one step (prefill tokens plus decode sequences).
    pub max_batched_tokens: u32,
    pub costs: StepCosts,
    /// Pending prefills in FCFS order (admitted first, then waiting).
    #[serde(default)]
    pub pending: Vec<PendingPrefill>,
    /// Sequences decoding now.
    #[serde(default)]
    pub decoding: u32,
    /// KV tokens the decoding sequences read per step.
    #[serde(default)]
    pub decode_context_tokens: u64,
    /// Until the step in flight ends, ms.
    #[serde(default)]
    pub step_remaining_ms: f64,
    /// Measured ÷ predicted step duration (1: the costs are exact).
    #[serde(default = "one")]
    pub step_calibration: f64,
    /// The first token comes from a step after the prefill's last (den's scheduler: the
    /// last prompt token is the row of the decode step that samples it), not from the
    /// prefill's last step itself (as in vLLM); the estimate then adds that step
    /// ([`StepCosts::first_token_step_ms`]).
    #[serde(default)]
    pub first_token_step: bool,
    /// The mean output length of the worker's finished requests (an EWMA), tokens: a
    /// request that finishes its prefill decodes about this many steps, each a row of
    /// every step after it ([`replay`]). 0 while unknown.
    #[serde(default)]
    pub mean_output_tokens: f64,
}

fn one() -> f64 {
    1.0
}

impl Default for EnginePlan {
    /// An idle engine whose steps cost nothing (a placeholder to fill in).
    fn default() -> Self {
        EnginePlan::idle(
            1,
            StepCosts::Batched {
                row_us: 0.0,
                weights_pass_us: 0.0,
                attention_us_per_position: 0.0,
                context_us_per_token: 0.0,
            },
        )
    }
}

impl EnginePlan {
    /// An idle engine.
    pub fn idle(max_batched_tokens: u32, costs: StepCosts) -> EnginePlan {
        EnginePlan {
            max_batched_tokens,
            costs,
            pending: Vec::new(),
            decoding: 0,
            decode_context_tokens: 0,
            step_remaining_ms: 0.0,
            step_calibration: 1.0,
            first_token_step: false,
            mean_output_tokens: 0.0,
        }
    }

    /// The prefill token budget per step that the decoding sequences leave.
    pub fn step_budget(&self) -> u32 {
        prompt_room(self.max_batched_tokens, self.decoding)
    }

    /// Packs the pending prefill (FCFS, ignoring ready times) into steps of the budget:
    /// the tokens in the last, partly filled step and how many requests finish in it.
    /// Nothing pending, or a full last step, gives `(0, 0)`.
    pub fn tail_step(&self) -> (u32, u32) {
        let budget = self.step_budget() as u64;
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

    /// Prefilling tokens `[done, input)` alone, budget-sized steps with no decode rows,
    /// ms: a request's own compute on this engine.
    pub fn solo_ms(&self, done: u32, input: u32) -> f64 {
        let budget = self.max_batched_tokens.max(1);
        let mut at = done;
        let mut ms = 0.0;
        while at < input {
            let take = budget.min(input - at);
            ms += self.step_ms(u64::from(take), positions(at, at + take), 0, 0);
            at += take;
        }
        ms
    }

    fn step_ms(&self, tokens: u64, attention: f64, decoding: u64, context: u64) -> f64 {
        let calibration = if self.step_calibration > 0.0 && self.step_calibration.is_finite() {
            self.step_calibration
        } else {
            1.0
        };
        self.costs.step_us(tokens, attention, decoding, context) as f64 / 1e3 * calibration
    }
}

/// Finish times of a replay, ms from now.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Replay {
    /// Per pending request (same order); 0 for a request with nothing left.
    pub finish_ms: Vec<f64>,
    /// The added request's, when one was added.
    pub joiner_finish_ms: Option<f64>,
    /// Requests looked at over the replayed steps (the work it cost).
    visits: usize,
}

impl Replay {
    /// Sum of the pending requests' finish times.
    pub fn total_ms(&self) -> f64 {
        self.finish_ms.iter().sum()
    }
}

/// Upper bound on replayed steps (a full 131 k-token context is 16 steps; a queue of
/// many such requests stays far below this).
const MAX_STEPS: usize = 100_000;

/// Upper bound on request visits over a whole replay (requests looked at, step by
/// step): a plan comes from the network, and the router replays it for every candidate,
/// so a hostile one (a thousand pending prompts of billions of tokens in one-row steps)
/// must not cost more than an honest busy worker's.
const MAX_VISITS: usize = 200_000;

/// Replays `plan` with `joiner` (if any) appended last in FCFS order.
///
/// Past either bound the rest is extrapolated, not dropped: each unfinished request, in
/// FCFS order, takes its remaining tokens in full-budget steps after the ones before
/// it. Stopping there instead ("everything left finishes now") made a worker with more
/// queued work reach the bound sooner and so look *less* loaded — under overload the
/// router then herded onto the longest queues.
pub fn replay(plan: &EnginePlan, joiner: Option<PendingPrefill>) -> Replay {
    let mut reqs: Vec<PendingPrefill> = plan.pending.clone();
    if let Some(j) = joiner {
        reqs.push(j);
    }
    let mut finish = vec![0.0; reqs.len()];
    // The sequences decoding now are held fixed (how long each has left is unknown). A
    // request that finishes its prefill joins them for the worker's mean output length:
    // a decode row in every step after it, with its context growing. On a GPU that row
    // is nearly free; on a CPU it costs as much as a prompt row plus its context, and a
    // request queued behind a few others prefills beside their decodes.
    let decode_steps = mean_output_steps(plan.mean_output_tokens);
    let mut joined: Vec<(u32, u64)> = Vec::new();
    let mut t = plan.step_remaining_ms.max(0.0);
    let mut left: usize = reqs.iter().filter(|r| r.left() > 0).count();
    // Every request before `head` is finished: a step scans from there, so finished
    // requests cost nothing and a step costs the requests it looks at.
    let mut head = 0usize;
    let mut chunks: Vec<(usize, u32)> = Vec::new();
    let mut visits = 0usize;
    let mut steps = 0usize;
    while left > 0 && steps < MAX_STEPS && visits < MAX_VISITS {
        steps += 1;
        while reqs.get(head).is_some_and(|r| r.left() == 0) {
            head += 1;
        }
        let decoding = plan.decoding.saturating_add(joined.len() as u32);
        let context = plan.decode_context_tokens + joined.iter().map(|j| j.1).sum::<u64>();
        visits += joined.len();
        let mut budget = prompt_room(plan.max_batched_tokens, decoding);
        chunks.clear();
        let mut next_ready = f64::INFINITY;
        let (mut tokens, mut attention) = (0u64, 0.0);
        for (i, r) in reqs.iter().enumerate().skip(head) {
            if budget == 0 {
                break;
            }
            visits += 1;
            let rest = r.left();
            if rest == 0 {
                continue;
            }
            if r.ready_in_ms > t {
                next_ready = next_ready.min(r.ready_in_ms);
                continue;
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
            // Decode-only steps run until a boundary at or after the next ready time (the
            // joined decodes are taken to last that long: a wait outlasts a few steps).
            let step = if decoding > 0 {
                plan.step_ms(0, 0.0, decoding as u64, context)
            } else {
                0.0
            };
            t = if step > 0.0 {
                let n = ((next_ready - t) / step).ceil().max(1.0);
                let n_steps = n.min(f64::from(u32::MAX)) as u32;
                age(&mut joined, n_steps);
                t + n * step
            } else {
                next_ready
            };
            continue;
        }
        t += plan.step_ms(tokens, attention, decoding as u64, context);
        age(&mut joined, 1);
        for &(i, take) in &chunks {
            let Some(r) = reqs.get_mut(i) else { continue };
            r.done_tokens += take;
            if r.left() == 0 {
                if let Some(f) = finish.get_mut(i) {
                    *f = t;
                }
                left -= 1;
                if decode_steps > 0 {
                    joined.push((decode_steps, u64::from(r.input_tokens)));
                }
            }
        }
    }
    if left > 0 {
        extrapolate(plan, &reqs, &mut finish, t);
    }
    let joiner_finish_ms = joiner.and_then(|_| finish.pop());
    Replay {
        finish_ms: finish,
        joiner_finish_ms,
        visits,
    }
}

/// Prompt rows den's scheduler gives a step even when decodes fill its budget, so a
/// long queue of decodes never starves a prefill.
pub const MIN_PROMPT_ROWS: u32 = 16;

/// Prompt rows a step of `budget` rows has room for beside `decode_rows` decodes: what
/// they leave, and at least [`MIN_PROMPT_ROWS`] (within the budget). The one rule of the
/// worker's scheduler, the fleet simulator's worker and [`replay`].
pub fn prompt_room(budget: u32, decode_rows: u32) -> u32 {
    let budget = budget.max(1);
    budget
        .saturating_sub(decode_rows)
        .max(MIN_PROMPT_ROWS.min(budget))
}

/// Decode steps a request that finishes its prefill is replayed for: the mean output
/// length less the token its last prefill step samples, within 0..=4096 (a plan comes
/// from the network).
fn mean_output_steps(mean_output_tokens: f64) -> u32 {
    if !mean_output_tokens.is_finite() || mean_output_tokens <= 1.0 {
        return 0;
    }
    (mean_output_tokens - 1.0).round().min(4096.0) as u32
}

/// `n` steps of the joined decodes: each reads one more token of context per step, and
/// leaves when its steps are done.
fn age(joined: &mut Vec<(u32, u64)>, n: u32) {
    joined.retain_mut(|(steps, context)| {
        let done = (*steps).min(n);
        *context += u64::from(done);
        *steps -= done;
        *steps > 0
    });
}

/// Finishes the unfinished requests of a replay cut short at `t`, in FCFS order, each
/// in full-budget steps of its own rows after the ones before it (and not before it is
/// ready): one pass, finite for any input, and later for every request added ahead.
fn extrapolate(plan: &EnginePlan, reqs: &[PendingPrefill], finish: &mut [f64], mut t: f64) {
    let budget = f64::from(plan.step_budget());
    let (decoding, context) = (plan.decoding as u64, plan.decode_context_tokens);
    for (f, r) in finish.iter_mut().zip(reqs) {
        let rest = r.left();
        if rest == 0 {
            continue;
        }
        let rest_f = f64::from(rest);
        let steps = rest_f / budget;
        // One step's share of its causal positions; linear costs make the sum exact.
        let attention = positions(r.done_tokens, r.input_tokens) / steps;
        let step = plan.step_ms(budget as u64, attention, decoding, context);
        t = t.max(r.ready_in_ms) + steps * step;
        *f = t;
    }
}

/// Prices candidate `c` of a request of `input_tokens` prompt tokens (`processed` of
/// them with KV before the first token) on a worker reporting `plan`, whose pending
/// requests finish at `without_ms` in total without it ([`replay`]`(plan, None)`):
/// `c.queue_ms` becomes everything before its own compute in the replay with it added —
/// waiting for other work and for its prefix, which overlap — so [`crate::candidate::estimate`]
/// gives back its replayed finish; its first token is sampled in that last prefill step
/// (`first_token_ms` 0); and `c.imposed_ms` becomes the delay it adds to the pending
/// requests' finish times (rank by own TTFT + imposed delay: mean TTFT is their sum).
pub fn price(
    plan: &EnginePlan,
    without_ms: f64,
    c: &mut Candidate,
    input_tokens: u32,
    processed: u32,
) {
    let joiner = PendingPrefill {
        ready_in_ms: c.prefix_load_ms + c.gpu_restore_ms,
        done_tokens: c.cached_token_count,
        input_tokens,
    };
    let with = replay(plan, Some(joiner));
    if let Some(finish) = with.joiner_finish_ms {
        let own = processed.saturating_sub(c.cached_token_count) as f64 * c.prefill_ms_per_token;
        c.queue_ms = (finish - c.gpu_restore_ms - own).max(0.0);
    }
    // The replay ends with the prefill's last step: that step yields the first token, or
    // (den's scheduler) the next one does.
    c.first_token_ms = if plan.first_token_step {
        let k = plan.step_calibration;
        plan.costs.first_token_step_ms() * if k > 0.0 && k.is_finite() { k } else { 1.0 }
    } else {
        0.0
    };
    c.imposed_ms = (with.total_ms() - without_ms).max(0.0);
}

#[cfg(test)]
mod tests;
