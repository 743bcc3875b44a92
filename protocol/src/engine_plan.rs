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
mod tests {
    use super::*;

    fn costs() -> StepCosts {
        // 10 µs a row, at least 1 ms a step, no attention or context terms.
        StepCosts::Batched {
            row_us: 10.0,
            weights_pass_us: 1_000.0,
            attention_us_per_position: 0.0,
            context_us_per_token: 0.0,
        }
    }

    fn pending(done: u32, input: u32) -> PendingPrefill {
        PendingPrefill {
            ready_in_ms: 0.0,
            done_tokens: done,
            input_tokens: input,
        }
    }

    #[test]
    fn a_joiner_rides_in_the_last_partly_filled_step_and_lengthens_it() {
        // Budget 1000 rows: the pending 1500 tokens take two steps (10 ms, then 5 ms
        // for 500 rows); a 400-token joiner fits the second step, making it 9 ms.
        let plan = EnginePlan {
            pending: vec![pending(0, 1500)],
            ..EnginePlan::idle(1000, costs())
        };
        assert_eq!(plan.tail_step(), (500, 1));
        let alone = replay(&plan, None);
        assert_eq!(alone.finish_ms, vec![15.0]);
        let with = replay(&plan, Some(pending(0, 400)));
        assert_eq!(with.finish_ms, vec![19.0]);
        assert_eq!(with.joiner_finish_ms, Some(19.0));
    }

    #[test]
    fn decodes_never_take_a_steps_last_prompt_rows() {
        assert_eq!(prompt_room(64, 8), 56);
        assert_eq!(prompt_room(64, 60), MIN_PROMPT_ROWS);
        assert_eq!(prompt_room(64, 1_000), MIN_PROMPT_ROWS);
        assert_eq!(prompt_room(8, 100), 8);
        assert_eq!(prompt_room(0, 0), 1);
        // The replay packs a step as the scheduler does: beside 60 decodes in a 64-row
        // budget, a 32-token prompt takes two steps of 16 rows, not eight of 4.
        let costs = StepCosts::Fitted {
            step_us: 1_000.0,
            row_us: 10.0,
            attention_us_per_position: 0.0,
            context_us_per_token: 0.0,
        };
        let plan = EnginePlan {
            decoding: 60,
            ..EnginePlan::idle(64, costs)
        };
        assert_eq!(plan.step_budget(), MIN_PROMPT_ROWS);
        let r = replay(&plan, Some(pending(0, 32)));
        let one = plan.step_ms(16, 0.0, 60, 0);
        assert_eq!(r.joiner_finish_ms, Some(2.0 * one));
    }

    #[test]
    fn a_request_ahead_decodes_in_the_steps_after_its_prefill() {
        // 1 ms a step + 10 µs a row, budget 64 rows. A (64 tokens) fills step 1; with a
        // mean output of 4 tokens it then decodes for 3 steps, one row each, so the
        // 128-token joiner gets 63 rows a step: 63, 63, 2 over steps 2–4
        // (1.64 + 1.64 + 1.64 + 1.03 ms). Without the mean it gets 64, 64: 4.92 ms.
        let costs = StepCosts::Fitted {
            step_us: 1_000.0,
            row_us: 10.0,
            attention_us_per_position: 0.0,
            context_us_per_token: 0.0,
        };
        let mut plan = EnginePlan {
            pending: vec![pending(0, 64)],
            ..EnginePlan::idle(64, costs)
        };
        let without = replay(&plan, Some(pending(0, 128)));
        assert_eq!(without.joiner_finish_ms, Some(4.92));
        plan.mean_output_tokens = 4.0;
        let with = replay(&plan, Some(pending(0, 128)));
        let j = with.joiner_finish_ms.unwrap_or(0.0);
        assert!((j - 5.95).abs() < 1e-9, "{j}");
        // A's own finish is unchanged: its decodes come after its prefill.
        assert_eq!(with.finish_ms, vec![1.64]);
        // What comes from the network is bounded: a huge or broken mean is capped.
        for mean in [f64::NAN, f64::INFINITY, -3.0, 1e12] {
            plan.mean_output_tokens = mean;
            let r = replay(&plan, Some(pending(0, 128)));
            assert!(r.joiner_finish_ms.is_some_and(f64::is_finite), "{mean}");
        }
    }

    #[test]
    fn a_request_not_ready_lets_later_ones_run_first() {
        let mut late = pending(0, 500);
        late.ready_in_ms = 100.0;
        let plan = EnginePlan {
            pending: vec![late],
            ..EnginePlan::idle(1000, costs())
        };
        let with = replay(&plan, Some(pending(0, 500)));
        // The joiner runs at once (5 ms); the late one at 100 ms.
        assert_eq!(with.joiner_finish_ms, Some(5.0));
        assert_eq!(with.finish_ms, vec![105.0]);
    }

    #[test]
    fn pricing_sets_the_queue_to_what_precedes_its_own_compute_and_the_imposed_delay() {
        let plan = EnginePlan {
            pending: vec![pending(0, 1500)],
            ..EnginePlan::idle(1000, costs())
        };
        let without = replay(&plan, None).total_ms();
        let mut c = crate::candidate::tests::router_fixture("w", crate::candidate::Tier::None, 0);
        c.prefill_ms_per_token = 0.01;
        price(&plan, without, &mut c, 400, 399);
        // Finish 19 ms; own compute 399 × 0.01 = 3.99 ms.
        assert!((c.queue_ms - 15.01).abs() < 1e-9, "{}", c.queue_ms);
        assert_eq!(c.first_token_ms, 0.0);
        assert!((c.imposed_ms - 4.0).abs() < 1e-9, "{}", c.imposed_ms);
        let e = crate::candidate::estimate_shape(399, 16, &c);
        assert!((e.ttft_ms - 19.0).abs() < 1e-9, "{}", e.ttft_ms);
    }

    #[test]
    fn a_hostile_plan_is_replayed_in_bounded_work() {
        let plan = EnginePlan {
            pending: vec![pending(0, u32::MAX); 1024],
            ..EnginePlan::idle(1, costs())
        };
        let r = replay(&plan, Some(pending(0, 10)));
        // One-row steps over 4 billion tokens each: the replay stops at its visit bound
        // and extrapolates, so the work stays bounded and the times finite and in order.
        assert!(r.visits <= MAX_VISITS + 1025, "{}", r.visits);
        let end = r.joiner_finish_ms.unwrap();
        assert!(end.is_finite(), "{end}");
        assert!(r.finish_ms.windows(2).all(|w| w[0] < w[1]));
        assert!(r.finish_ms.last().is_some_and(|f| *f < end));
    }

    #[test]
    fn a_longer_queue_past_the_bound_still_prices_later() {
        // Past the visit bound the rest is extrapolated, never dropped: a worker with
        // more queued work must never look less loaded than one with less.
        let queue = |n: usize| EnginePlan {
            pending: vec![pending(0, 4_000); n],
            ..EnginePlan::idle(64, costs())
        };
        let mut last = 0.0;
        for n in [100, 400, 1_000, 3_000] {
            let r = replay(&queue(n), Some(pending(0, 100)));
            let end = r.joiner_finish_ms.unwrap();
            assert!(end > last, "{n} pending: {end} ms after {last} ms");
            last = end;
        }
        // 3 000 × 4 000 tokens in 64-row steps (1 ms each: the pass floor) is far past
        // the bound, and the extrapolation stays near the exact 187 500 steps + 2 for
        // the joiner (it prices the joiner's part step as a fraction).
        let r = replay(&queue(3_000), Some(pending(0, 100)));
        let exact = 187_502.0;
        let end = r.joiner_finish_ms.unwrap();
        assert!((end - exact).abs() / exact < 1e-3, "{end} vs {exact}");
    }

    #[test]
    fn finished_requests_cost_no_visits() {
        // A long queue of finished requests ahead of one pending costs a few visits.
        let mut pending_list = vec![pending(10, 10); 10_000];
        pending_list.push(pending(0, 5_000));
        let plan = EnginePlan {
            pending: pending_list,
            ..EnginePlan::idle(1_000, costs())
        };
        let r = replay(&plan, None);
        assert_eq!(r.finish_ms.last().copied(), Some(50.0));
        assert!(r.visits < 20, "{}", r.visits);
    }

    #[test]
    fn synthetic_steps_cost_their_rows_or_one_pass() {
        let s = StepCosts::Synthetic {
            prefill_us_per_token: 500.0,
            decode_us_per_step: 5_000.0,
            first_token_us: 8_000.0,
        };
        // Prompt rows only: per token, no pass floor.
        assert_eq!(s.step_us(4, 123.0, 0, 99), 2_000);
        // Eight decodes cost one pass, not eight.
        assert_eq!(s.step_us(0, 0.0, 8, 99), 5_000);
        assert_eq!(s.step_us_with_first(0, 0.0, 8, 99, true), 8_000);
        // Enough rows and the compute dominates, first token or not.
        assert_eq!(s.step_us_with_first(63, 0.0, 1, 0, true), 32_000);
        // A measured engine's first token is one more row.
        let b = StepCosts::Batched {
            row_us: 10.0,
            weights_pass_us: 100.0,
            attention_us_per_position: 0.0,
            context_us_per_token: 0.0,
        };
        assert_eq!(b.step_us_with_first(0, 0.0, 1, 0, true), 100);
    }

    #[test]
    fn fitted_steps_add_their_rows_and_attention_to_the_fixed_cost() {
        let f = StepCosts::Fitted {
            step_us: 60_000.0,
            row_us: 2_500.0,
            attention_us_per_position: 8.0,
            context_us_per_token: 20.0,
        };
        // 64 prompt rows over 10 000 positions, two decodes reading 3 000 KV tokens.
        assert_eq!(
            f.step_us(64, 10_000.0, 2, 3_000),
            60_000 + 165_000 + 80_000 + 60_000
        );
        // Rows add to the pass (a CPU's compute does not hide behind it).
        assert!(f.step_us(16, 0.0, 0, 0) > f.step_us(1, 0.0, 0, 0));
        assert_eq!(f.step_us(0, 0.0, 0, 0), 0, "no rows, no step");
        assert_eq!(f.first_token_floor_us(), 0.0);
        assert!((f.first_token_step_ms() - 62.5).abs() < 1e-9);
        // On the wire as the other variants, by tag.
        let json = serde_json::to_string(&f).unwrap();
        assert!(json.contains("\"kind\":\"fitted\""), "{json}");
        assert_eq!(serde_json::from_str::<StepCosts>(&json).unwrap(), f);
    }
}
