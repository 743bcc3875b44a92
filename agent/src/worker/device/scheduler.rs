//! The device thread's iteration-level batching scheduler, for both engines: a real model
//! (`model`: den-model's forward pass over the worker's page arena, on the CPU or the
//! GPU) and the synthetic one (`synthetic`: model-free rows and tokens, the declared
//! costs spent per step). What each step costs is fitted in `fit`.
//!
//! Each **step** is one weight pass over a batch of rows: one decode token for every
//! running decode, then prompt rows of assignments still filling — the repair of decodes
//! whose restore fell short before plain prefills — within the token budget
//! (`--batch-tokens`). A long prompt is so prefilled a budget at a time between the decode
//! steps of others, and decodes that arrive while one runs join the next step. Restores
//! and checkpoint captures are copies: they run between steps, whole.
//!
//! Every row goes through the pool's two-phase append: each participant's slots are
//! reserved (a shared tail copied first) before the pass, written in place by it through
//! the reservation's page table (`pages_after`), and committed after it; a failed pass
//! aborts every reservation of the step and fails its participants, leaving their routes
//! as they were. A cancelled assignment leaves at the next step boundary, when nothing of
//! it is pending: it is fenced at once and its pages are released at quiescence (the
//! worker machine releases them when the failure it is reported with arrives).
//!
//! Admission stays the worker machine's (pages are reserved for the projected context
//! before an offer is accepted), so a step never runs out of the pages it was promised.
//! Restored chunks of a real model are checked by the hash their tier stored, not by
//! recomputation: real KV is not bit-reproducible across batch shapes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use den_model::sample::{FinishReason, Generation};
use den_protocol::chunk::PrefixHash;
use den_protocol::engine_plan::{EnginePlan, PendingPrefill, StepCosts, prompt_room};
use den_protocol::observation::MAX_PLAN_PENDING;
use den_protocol::request::Token;
use den_protocol::wire::StopReason;
use den_protocol::worker::{Operation, OperationKind, OperationOutcome};

use super::queue::{JobReceiver, Polled};
use super::{Device, DeviceEvent, Job, PendingAppend, Stop, failed, stopped};
mod fit;
mod model;
mod synthetic;

pub use fit::{StepFit, StepSample};
pub use model::ModelEngine;

use crate::engine::context_hash;
use crate::model_file::generation_config;

/// A prefill or decode in the scheduler.
struct Active {
    job: u64,
    op: Operation,
    cancel: Arc<AtomicBool>,
    /// Set once a decode's prompt rows are all there.
    decoding: Option<Decoding>,
}

struct Decoding {
    generator: Generator,
    out: Vec<Token>,
    /// The token whose row the next step writes (the pending prompt token, then each
    /// generated one).
    consumed: Token,
}

/// Where a decode's tokens come from.
enum Generator {
    /// The real model's logits, sampled.
    Model(Box<Generation>),
    /// The synthetic engine's deterministic stream for this prompt.
    Synthetic { context: PrefixHash },
}

/// A decode row's sampled token and whether it ended the output, or why sampling failed.
type Sampled = Result<(Token, Option<FinishReason>), String>;

/// One participant of a step.
struct Part {
    active: usize,
    start: u32,
    count: u32,
    pending: Option<PendingAppend>,
}

impl Device<'_, '_> {
    /// Serves jobs until the queue closes and the last admitted one is done.
    pub(super) fn run_batched(&mut self, rx: &JobReceiver) {
        let mut active: Vec<Active> = Vec::new();
        let mut open = true;
        loop {
            if active.is_empty() {
                if !open {
                    return;
                }
                match rx.recv() {
                    Some(job) => self.admit(job, &mut active),
                    None => return,
                }
            }
            while open {
                match rx.try_recv() {
                    Polled::Job(job) => self.admit(job, &mut active),
                    Polled::Empty => break,
                    Polled::Closed => open = false,
                }
            }
            // A real model's restores write what they gathered before the step and
            // commit it after, so their copies overlap the step's compute.
            self.start_restores();
            if !active.is_empty() {
                self.step(&mut active);
            }
            self.settle_restores();
        }
    }

    fn admit(&mut self, job: Job, active: &mut Vec<Active>) {
        match job {
            Job::Op { job, op, cancel }
                if matches!(op.kind, OperationKind::Prefill | OperationKind::Decode) =>
            {
                crate::hops::mark(crate::hops::Hop::JobTaken);
                self.ctx.queue.start(job);
                if cancel.load(Ordering::Relaxed) {
                    self.finish(job, &op, failed(op.kind, "cancelled before it started"));
                } else if let Err(stop) = self.ensure_route(&op.work.route) {
                    self.finish(job, &op, stopped(op.kind, stop));
                } else {
                    active.push(Active {
                        job,
                        op,
                        cancel,
                        decoding: None,
                    });
                }
            }
            other => self.run(other),
        }
    }

    pub(super) fn finish(&mut self, job: u64, op: &Operation, outcome: OperationOutcome) {
        if let OperationOutcome::Decoded { tokens, .. } = &outcome {
            crate::hops::mark(crate::hops::Hop::Decoded);
            self.ctx.calibration.output(tokens.len());
        }
        self.publish_totals();
        self.ctx.queue.finish(job);
        let _ = self.ctx.events.send(DeviceEvent::Done {
            assignment: op.assignment().clone(),
            outcome,
        });
    }

    /// Removes `active[i]` and reports `outcome` for it.
    fn retire(&mut self, active: &mut Vec<Active>, i: usize, outcome: OperationOutcome) {
        let a = active.remove(i);
        self.finish(a.job, &a.op, outcome);
    }

    /// One step: leave what was cancelled, move filled assignments on, run one pass.
    fn step(&mut self, active: &mut Vec<Active>) {
        for i in (0..active.len()).rev() {
            if active[i].cancel.load(Ordering::Relaxed) {
                let kind = active[i].op.kind;
                self.retire(active, i, failed(kind, "cancelled"));
                continue;
            }
            if active[i].decoding.is_none() {
                let processed = active[i].op.work.request.processed();
                if self.route_len(&active[i].op.work.route) >= processed {
                    if active[i].op.kind == OperationKind::Prefill {
                        // The prompt is in: say so, and go on into the decode in this
                        // very step (`OperationKind::Prefill` chains them), not a step
                        // later after a round trip through the worker actor.
                        let _ = self.ctx.events.send(DeviceEvent::Done {
                            assignment: active[i].op.work.assignment.clone(),
                            outcome: OperationOutcome::Prefilled,
                        });
                        active[i].op.kind = OperationKind::Decode;
                    }
                    match self.filled(&active[i]) {
                        // The synthetic engine produces exactly `max_new_tokens`; a model
                        // samples at least one (its generation's own limit).
                        Ok(d)
                            if matches!(d.generator, Generator::Synthetic { .. })
                                && active[i].op.work.request.max_new_tokens == 0 =>
                        {
                            let done = OperationOutcome::Decoded {
                                tokens: Vec::new(),
                                stop: StopReason::Length,
                            };
                            self.retire(active, i, done);
                        }
                        Ok(d) => active[i].decoding = Some(d),
                        Err(stop) => {
                            let kind = active[i].op.kind;
                            self.retire(active, i, stopped(kind, stop));
                        }
                    }
                }
            }
        }
        if active.is_empty() {
            self.publish_plan(active);
            return;
        }
        let mut parts = self.plan(active);
        let mut outcomes: Vec<(usize, OperationOutcome)> = Vec::new();
        // Reserve every participant's rows before the pass.
        for p in &mut parts {
            let a = &active[p.active];
            let Device { memory, ctx, .. } = &mut *self;
            match PendingAppend::begin(
                &ctx.pool,
                memory.as_mut(),
                &a.op.work.route,
                p.start,
                p.count,
            ) {
                Ok(pending) => p.pending = Some(pending),
                Err(stop) => outcomes.push((p.active, stopped(a.op.kind, stop))),
            }
        }
        parts.retain(|p| p.pending.is_some());
        self.count_step(active, &parts);
        let rows: u32 = parts.iter().map(|p| p.count).sum();
        let t0 = Instant::now();
        let sampled = self.pass(active, &parts);
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if sampled.is_ok() {
            let (mut positions, mut context) = (0.0, 0u64);
            for p in &parts {
                if active[p.active].decoding.is_some() {
                    context += u64::from(p.start);
                } else {
                    positions += den_protocol::engine_plan::positions(p.start, p.start + p.count);
                }
            }
            self.fit.observe(StepSample {
                rows,
                positions,
                context,
                ms,
            });
        }
        match sampled {
            Err(stop) => {
                for p in parts {
                    if let Some(pending) = p.pending {
                        pending.abort(&self.ctx.pool);
                    }
                    let kind = active[p.active].op.kind;
                    outcomes.push((p.active, stopped(kind, stop.clone())));
                }
            }
            Ok(tokens) => {
                let mut filled = 0;
                let mut next = tokens.into_iter();
                for p in parts {
                    let committed = match p.pending {
                        Some(pending) => pending.commit(&self.ctx.pool),
                        None => continue,
                    };
                    let a = &mut active[p.active];
                    if let Err(stop) = committed {
                        outcomes.push((p.active, stopped(a.op.kind, stop)));
                        continue;
                    }
                    let Some(d) = a.decoding.as_mut() else {
                        filled += p.count;
                        continue;
                    };
                    let Some(step) = next.next() else {
                        outcomes.push((p.active, failed(a.op.kind, "no logits for a decode row")));
                        continue;
                    };
                    match step {
                        Ok((token, finish)) => {
                            let index = d.out.len() as u32;
                            d.out.push(token);
                            d.consumed = token;
                            if index == 0 {
                                self.ctx.calibration.first_token(ms);
                            } else {
                                self.ctx.calibration.decode_step(ms);
                            }
                            let _ = self.ctx.events.send(DeviceEvent::Token {
                                assignment: a.op.work.assignment.clone(),
                                token,
                                index,
                            });
                            if let Some(reason) = finish {
                                let max = a.op.work.request.max_new_tokens as usize;
                                let stop = match reason {
                                    FinishReason::Stop => StopReason::Eos,
                                    FinishReason::Length if d.out.len() < max => {
                                        StopReason::Capacity
                                    }
                                    FinishReason::Length => StopReason::Length,
                                };
                                let tokens = std::mem::take(&mut d.out);
                                outcomes
                                    .push((p.active, OperationOutcome::Decoded { tokens, stop }));
                            }
                        }
                        Err(detail) => outcomes.push((p.active, failed(a.op.kind, &detail))),
                    }
                }
                if filled > 0 {
                    self.ctx.calibration.prefill(ms, filled);
                    self.ctx.metrics.counter_add(
                        "den_recomputed_tokens_total",
                        "Prompt tokens whose KV was computed (not reused from a cache).",
                        &[],
                        f64::from(filled),
                    );
                }
            }
        }
        outcomes.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        outcomes.dedup_by_key(|(i, _)| *i);
        for (i, outcome) in outcomes {
            self.retire(active, i, outcome);
        }
        self.publish_plan(active);
    }

    /// The scheduler's state for the heartbeat: prompts still filling (FCFS, as the
    /// planner serves them), the decoding set and its context, the measured costs.
    /// The plan of an idle model (nothing pending, nothing decoding), when costs are known.
    pub(super) fn publish_idle_plan(&self) {
        self.publish_plan(&[]);
    }

    /// What a step costs: a model's fitted from its steps, the synthetic engine's
    /// declared ([`super::synthetic`] spends exactly these).
    fn step_costs(&self) -> Option<StepCosts> {
        match &self.model {
            Some(_) => self.fit.costs(),
            None => Some(synthetic::step_costs(&self.ctx.config.costs)),
        }
    }

    fn publish_plan(&self, active: &[Active]) {
        let Some(costs) = self.step_costs() else {
            return;
        };
        let Ok(mut slot) = self.ctx.engine_plan.lock() else {
            return;
        };
        // Refilled in place: no allocation per step once the list has grown.
        let plan = slot.get_or_insert_with(EnginePlan::default);
        plan.max_batched_tokens = self.ctx.config.batch_tokens.max(1);
        plan.costs = costs;
        // The last prompt token is the row of the decode step that samples the first.
        plan.first_token_step = true;
        plan.mean_output_tokens = self.ctx.calibration.snapshot().output_tokens.or(0.0);
        plan.pending.clear();
        plan.decoding = 0;
        plan.decode_context_tokens = 0;
        for a in active {
            let len = self.route_len(&a.op.work.route);
            if a.decoding.is_some() {
                plan.decoding += 1;
                plan.decode_context_tokens += u64::from(len);
            } else if plan.pending.len() < MAX_PLAN_PENDING {
                plan.pending.push(PendingPrefill {
                    ready_in_ms: 0.0,
                    done_tokens: len,
                    input_tokens: u32::try_from(a.op.work.request.tokens.len()).unwrap_or(u32::MAX),
                });
            }
        }
    }

    /// `den_model_steps_total` and the rows of each kind, so the mean batch is visible.
    fn count_step(&self, active: &[Active], parts: &[Part]) {
        let decodes = parts
            .iter()
            .filter(|p| active[p.active].decoding.is_some())
            .count();
        let prompt: u32 = parts
            .iter()
            .filter(|p| active[p.active].decoding.is_none())
            .map(|p| p.count)
            .sum();
        let m = &self.ctx.metrics;
        m.counter_add(
            "den_model_steps_total",
            "Batched steps of the engine (a real model's forward passes, or the synthetic engine's).",
            &[],
            1.0,
        );
        if decodes > 0 {
            m.counter_add(
                "den_model_decode_steps_total",
                "Batched engine steps with at least one decode row.",
                &[],
                1.0,
            );
        }
        for (kind, rows) in [("decode", decodes as f64), ("prompt", f64::from(prompt))] {
            m.counter_add(
                "den_model_step_rows_total",
                "Rows of the engine's batched steps, by kind (decode tokens, prompt rows).",
                &[("kind", kind)],
                rows,
            );
        }
    }

    /// A decode whose prompt rows are all there starts generating.
    fn filled(&self, a: &Active) -> Result<Decoding, Stop> {
        let request = &a.op.work.request;
        let consumed = request
            .tokens
            .last()
            .copied()
            .ok_or_else(|| Stop::Failed("a request has at least one token".into()))?;
        let generator = match &self.model {
            None => Generator::Synthetic {
                context: context_hash(&request.tokens),
            },
            Some(engine) => {
                let context = engine.model().config().context_length as usize;
                let config =
                    generation_config(&request.sampling, &request.id, request.max_new_tokens);
                let generation = Generation::new(
                    &engine.text.tokenizer,
                    config,
                    request.tokens.len(),
                    context,
                )
                .map_err(|e| Stop::Failed(format!("generation: {e}")))?;
                Generator::Model(Box::new(generation))
            }
        };
        Ok(Decoding {
            generator,
            out: Vec::with_capacity((request.max_new_tokens as usize).min(4096)),
            consumed,
        })
    }

    /// The step's rows ([`plan_step`] over the scheduler's state).
    fn plan(&self, active: &[Active]) -> Vec<Part> {
        let mut decodes = Vec::new();
        let mut fillers = Vec::new();
        for (i, a) in active.iter().enumerate() {
            match &a.decoding {
                Some(d) => decodes.push((i, a.op.work.request.processed() + d.out.len() as u32)),
                None => {
                    let have = self.route_len(&a.op.work.route);
                    fillers.push(Filler {
                        active: i,
                        repair: a.op.kind == OperationKind::Decode,
                        have,
                        need: a.op.work.request.processed().saturating_sub(have),
                    });
                }
            }
        }
        plan_step(&decodes, &fillers, self.ctx.config.batch_tokens)
            .into_iter()
            .map(|(active, start, count)| Part {
                active,
                start,
                count,
                pending: None,
            })
            .collect()
    }

    /// Runs the step's rows through the engine and samples each decode's next token (in
    /// the order of the decode parts). Nothing is committed here.
    fn pass(&mut self, active: &mut [Active], parts: &[Part]) -> Result<Vec<Sampled>, Stop> {
        if self.model.is_none() {
            return self.synthetic_pass(active, parts);
        }
        self.model_pass(active, parts)
    }
}

/// An assignment still writing prompt rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Filler {
    pub active: usize,
    /// A decode repairing a short restore (ahead of plain prefills).
    pub repair: bool,
    /// Rows the route holds; the next prompt row goes at `have`.
    pub have: u32,
    pub need: u32,
}

/// One step's rows as (active index, first position, rows): every decode's next token
/// (`decodes`: index and position, one row each), then prompt rows — repairs before
/// prefills, each in arrival order — while `budget` lasts, and at least
/// `MIN_PROMPT_ROWS` of them whatever the decodes took ([`prompt_room`]) (spec §3: decode before repair
/// before prefill, then arrival; prefill chunked).
pub(super) fn plan_step(
    decodes: &[(usize, u32)],
    fillers: &[Filler],
    budget: u32,
) -> Vec<(usize, u32, u32)> {
    let mut out: Vec<(usize, u32, u32)> = decodes.iter().map(|(i, pos)| (*i, *pos, 1)).collect();
    let mut room = prompt_room(budget, decodes.len() as u32);
    let mut order: Vec<&Filler> = fillers.iter().collect();
    order.sort_by_key(|f| (!f.repair, f.active));
    for f in order {
        if room == 0 {
            break;
        }
        let count = f.need.min(room);
        if count == 0 {
            continue;
        }
        out.push((f.active, f.have, count));
        room -= count;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use den_protocol::engine_plan::MIN_PROMPT_ROWS;

    fn filler(active: usize, repair: bool, have: u32, need: u32) -> Filler {
        Filler {
            active,
            repair,
            have,
            need,
        }
    }

    #[test]
    fn decodes_first_then_bounded_prefill() {
        // The spec's case: two decodes and a long prefill in a 66-row budget: [1 1 64].
        let plan = plan_step(&[(0, 40), (1, 7)], &[filler(2, false, 0, 500)], 66);
        assert_eq!(plan, vec![(0, 40, 1), (1, 7, 1), (2, 0, 64)]);
    }

    #[test]
    fn repairs_before_prefills_then_arrival_and_the_budget_is_shared() {
        let fillers = [
            filler(0, false, 0, 30),
            filler(1, true, 16, 10),
            filler(2, false, 0, 30),
        ];
        let plan = plan_step(&[], &fillers, 50);
        assert_eq!(plan, vec![(1, 16, 10), (0, 0, 30), (2, 0, 10)]);
        // Nothing left to write is skipped.
        assert_eq!(plan_step(&[], &[filler(0, false, 8, 0)], 64), vec![]);
    }

    #[test]
    fn decodes_never_starve_prefill() {
        let decodes: Vec<(usize, u32)> = (0..80).map(|i| (i, 100)).collect();
        let plan = plan_step(&decodes, &[filler(80, false, 0, 1000)], 64);
        assert_eq!(plan.len(), 81, "every decode runs");
        assert_eq!(plan[80], (80, 0, MIN_PROMPT_ROWS));
    }
}
