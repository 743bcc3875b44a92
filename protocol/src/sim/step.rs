//! Delivering events to the machines and interpreting their effects.

use super::queue::{SimEvent, TimerKey};
use super::trace::{Endpoint, LinkAction, TraceEntry, TraceEvent};
use super::{Response, Simulation};
use crate::candidate::Tier;
use crate::ids::{AssignmentId, WorkerId};
use crate::router::{LocalRouterEffect, RouterEffect, RouterInput};
use crate::time::Millis;
use crate::time::ceil_ms;
use crate::wire::StopReason;
use crate::worker::{
    LocalWorkerEffect, Operation, OperationKind, OperationOutcome, WorkerEffect, WorkerInput,
};

impl Simulation {
    pub(super) fn deliver(&mut self, event: SimEvent) {
        match event {
            SimEvent::ToWorker { to, message } => {
                if self.is_blocked(|| (Endpoint::Router, Endpoint::Worker(to.clone()))) {
                    let (from, to) = (Endpoint::Router, Endpoint::Worker(to));
                    let kind = message.kind();
                    let assignment = message.assignment().clone();
                    self.drop_traced(from, to, kind, assignment);
                } else if !self.workers.contains_key(&to) {
                    self.push_trace(TraceEvent::MissingWorker { worker: to });
                } else if self.paused.contains(&to) {
                    let due = self.now + 1;
                    self.queue.push(due, SimEvent::ToWorker { to, message });
                } else {
                    self.worker_step(&to, message.into());
                }
            }
            SimEvent::ToRouter { from, message } => {
                if self.is_blocked(|| (Endpoint::Worker(from.clone()), Endpoint::Router)) {
                    let (from, to) = (Endpoint::Worker(from), Endpoint::Router);
                    let kind = message.kind();
                    let assignment = message.assignment().clone();
                    self.drop_traced(from, to, kind, assignment);
                } else {
                    self.router_step(message.into());
                }
            }
            SimEvent::Engine { worker, input } => {
                let chain = match &input {
                    WorkerInput::OperationDone {
                        assignment,
                        outcome: OperationOutcome::Prefilled,
                    } if !self.paused.contains(&worker) => self.chained.remove(assignment),
                    _ => None,
                };
                if !self.workers.contains_key(&worker) {
                    self.push_trace(TraceEvent::MissingWorker { worker });
                } else if self.paused.contains(&worker) {
                    let due = self.now + 1;
                    self.queue.push(due, SimEvent::Engine { worker, input });
                } else {
                    self.worker_step(&worker, input);
                    // The device goes on to the decode (`OperationKind::Prefill`).
                    if let Some(op) = chain {
                        self.schedule_decode(&op, self.now);
                    }
                }
            }
            SimEvent::Timer { input } => self.router_step(input),
        }
    }

    /// One router step: handle, trace, then interpret the effects.
    pub(super) fn router_step(&mut self, input: RouterInput) {
        let traced = self.config.trace.then(|| input.clone());
        let effects = self.router.handle(self.now, input);
        if let Some(input) = traced {
            self.push_trace(TraceEvent::Router {
                input,
                effects: effects.clone(),
            });
        }
        for effect in effects {
            self.apply_router_effect(effect);
        }
    }

    /// One worker step: handle, trace, then interpret the effects.
    pub(super) fn worker_step(&mut self, worker: &WorkerId, input: WorkerInput) {
        let traced = self.config.trace.then(|| input.clone());
        let Some(w) = self.workers.get_mut(worker) else {
            self.push_trace(TraceEvent::MissingWorker {
                worker: worker.clone(),
            });
            return;
        };
        let effects = w.handle(self.now, input);
        if let Some(input) = traced {
            self.push_trace(TraceEvent::Worker {
                worker: worker.clone(),
                input,
                effects: effects.clone(),
            });
        }
        for effect in effects {
            match effect {
                WorkerEffect::Send(message) => {
                    let event = SimEvent::ToRouter {
                        from: worker.clone(),
                        message,
                    };
                    self.send(event);
                }
                WorkerEffect::Local(LocalWorkerEffect::Start(op)) => self.schedule_operation(op),
                // Operations run to completion; the worker releases on their result.
                WorkerEffect::Local(LocalWorkerEffect::CancelOperation { .. }) => {}
                WorkerEffect::Local(LocalWorkerEffect::Released { .. }) => {}
            }
        }
    }

    fn apply_router_effect(&mut self, effect: RouterEffect) {
        match effect {
            RouterEffect::Send(out) => {
                let event = SimEvent::ToWorker {
                    to: out.to,
                    message: out.message,
                };
                self.send(event);
            }
            RouterEffect::Local(local) => match local {
                LocalRouterEffect::SetOfferTimer { assignment, at } => {
                    let key = TimerKey::Offer(assignment.clone());
                    let input = RouterInput::OfferTimeout { assignment };
                    self.queue.push_timer(key, at, SimEvent::Timer { input });
                }
                LocalRouterEffect::CancelOfferTimer { assignment } => {
                    self.queue.cancel_timer(&TimerKey::Offer(assignment));
                }
                LocalRouterEffect::SetDeadlineTimer { request, at } => {
                    let key = TimerKey::Deadline(request.clone());
                    let input = RouterInput::DeadlineExpired { request };
                    self.queue.push_timer(key, at, SimEvent::Timer { input });
                }
                LocalRouterEffect::CancelDeadlineTimer { request } => {
                    self.queue.cancel_timer(&TimerKey::Deadline(request));
                }
                LocalRouterEffect::Deliver(delivery) => {
                    if delivery.is_terminal() {
                        self.terminal
                            .insert(delivery.request.clone(), self.responses.len());
                    }
                    self.responses.push(Response {
                        at: self.now,
                        delivery,
                    });
                }
                LocalRouterEffect::Decision(_) => {}
            },
        }
    }

    /// Is the directed link (built only when some link is blocked) partitioned?
    fn is_blocked(&self, link: impl FnOnce() -> (Endpoint, Endpoint)) -> bool {
        !self.blocked.is_empty() && self.blocked.contains(&link())
    }

    /// Put a message on its directed link, applying the next one-shot fault for that
    /// link. (The link's endpoints are only built when a fault is pending.)
    fn send(&mut self, event: SimEvent) {
        let mut delay = self.config.network_delay;
        if self.link_faults.is_empty() {
            self.queue.push(self.now + delay, event);
            return;
        }
        let (from, to) = match &event {
            SimEvent::ToWorker { to, .. } => (Endpoint::Router, Endpoint::Worker(to.clone())),
            SimEvent::ToRouter { from, .. } => (Endpoint::Worker(from.clone()), Endpoint::Router),
            // Only messages travel on links.
            SimEvent::Engine { .. } | SimEvent::Timer { .. } => {
                self.queue.push(self.now + delay, event);
                return;
            }
        };
        let fault = self
            .link_faults
            .iter()
            .position(|f| f.from == from && f.to == to);
        if let Some(i) = fault {
            let f = self.link_faults.remove(i);
            let (kind, assignment) = describe(&event);
            match f.action {
                LinkAction::Drop => {
                    self.drop_traced(from, to, kind, assignment);
                    return;
                }
                LinkAction::Delay(extra_ms) => {
                    delay += extra_ms;
                    self.push_trace(TraceEvent::NetworkDelay {
                        from,
                        to,
                        message: kind,
                        assignment,
                        extra_ms,
                    });
                }
                LinkAction::Duplicate => {
                    self.push_trace(TraceEvent::NetworkDuplicate {
                        from,
                        to,
                        message: kind,
                        assignment,
                    });
                    self.queue.push(self.now + delay, event.clone());
                }
            }
        }
        self.queue.push(self.now + delay, event);
    }

    /// The simulated engine: schedule an operation's result (and a decode's tokens) after
    /// its declared cost.
    fn schedule_operation(&mut self, op: Operation) {
        let worker = op.worker.clone();
        let assignment = op.work.assignment.clone();
        let c = &op.work.candidate;
        let missing = op.work.estimate.missing.max(0) as f64;
        let overlap = c.queue_ms.max(c.prefix_load_ms);
        let engine = |input| SimEvent::Engine {
            worker: worker.clone(),
            input,
        };
        match op.kind {
            OperationKind::Restore => {
                let due = self.now + ceil_ms(overlap + c.gpu_restore_ms);
                let outcome = OperationOutcome::Restored {
                    cached_token_count: Some(c.cached_token_count),
                };
                self.queue.push(due, engine(done(assignment, outcome)));
            }
            OperationKind::Prefill => {
                let wait = if c.tier == Tier::Gpu || c.cached_token_count == 0 {
                    overlap
                } else {
                    0.0
                };
                let due = self.now + ceil_ms(wait + missing * c.prefill_ms_per_token);
                self.queue.push(
                    due,
                    engine(done(assignment.clone(), OperationOutcome::Prefilled)),
                );
                self.chained.insert(assignment, op);
            }
            OperationKind::Decode => self.schedule_decode(&op, self.now),
        }
    }

    /// A decode's tokens and result, starting at `start` (now, or when the prefill it
    /// continues ends: `OperationKind::Prefill` chains into it).
    fn schedule_decode(&mut self, op: &Operation, start: Millis) {
        let engine = |input| SimEvent::Engine {
            worker: op.worker.clone(),
            input,
        };
        let assignment = op.work.assignment.clone();
        let request = &op.work.request;
        let max_new = request.max_new_tokens as usize;
        let tokens: Vec<u32> = match &request.simulated_output {
            Some(out) => out.iter().copied().take(max_new).collect(),
            None => (0..request.max_new_tokens)
                .map(|i| 1_000_000u32.saturating_add(i))
                .collect(),
        };
        let first = op.work.candidate.first_token_ms;
        let per_token = self.config.decode_ms_per_token;
        let mut last = start + ceil_ms(first);
        for (i, token) in tokens.iter().enumerate() {
            last = start + ceil_ms(first + i as f64 * per_token);
            let input = WorkerInput::Token {
                assignment: assignment.clone(),
                token: *token,
                index: i as u32,
            };
            self.queue.push(last, engine(input));
        }
        let stop = StopReason::Length;
        let outcome = OperationOutcome::Decoded { tokens, stop };
        self.queue.push(last, engine(done(assignment, outcome)));
    }

    pub(super) fn push_trace(&mut self, event: TraceEvent) {
        if self.config.trace {
            self.trace.push(TraceEntry {
                at: self.now,
                event,
            });
        }
    }

    fn drop_traced(
        &mut self,
        from: Endpoint,
        to: Endpoint,
        message: &'static str,
        assignment: AssignmentId,
    ) {
        self.push_trace(TraceEvent::NetworkDrop {
            from,
            to,
            message,
            assignment,
        });
    }
}

fn done(assignment: AssignmentId, outcome: OperationOutcome) -> WorkerInput {
    WorkerInput::OperationDone {
        assignment,
        outcome,
    }
}

fn describe(event: &SimEvent) -> (&'static str, AssignmentId) {
    match event {
        SimEvent::ToWorker { message, .. } => (message.kind(), message.assignment().clone()),
        SimEvent::ToRouter { message, .. } => (message.kind(), message.assignment().clone()),
        // Only messages travel on links; these arms keep the function total.
        SimEvent::Engine { .. } | SimEvent::Timer { .. } => ("local", AssignmentId::new("", 0)),
    }
}
