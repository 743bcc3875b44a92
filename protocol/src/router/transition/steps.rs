//! The steps the transition handlers share: offering the next candidate, ending an
//! attempt, finishing a request, and the effects they emit.

use std::sync::Arc;

use super::super::record::Entry;
use super::super::{
    Delivery, DeliveryKind, Index, LocalRouterEffect, Phase, RouterConfig, RouterEffect,
    RouterError,
};
use crate::decision::{
    AttemptOutcome, AttemptRecord, DecisionEvent, DecisionEventKind, TerminalOutcome,
};
use crate::ids::{AssignmentId, RequestId, WorkerId};
use crate::time::Millis;
use crate::wire::{Cancel, Offer, OutboundToWorker, RouterMessage, WorkerResult};

pub(super) type Out = Vec<RouterEffect>;

/// How a request ends, with what the client receives.
pub(super) enum Terminal {
    Completed(Box<WorkerResult>),
    Failed(RouterError),
    Cancelled,
}

/// offer-next (§2.4): offer the next ranked candidate, or fail with no-feasible-worker.
pub(super) fn offer_next(
    cfg: &RouterConfig,
    idx: &mut Index,
    e: &mut Entry,
    now: Millis,
    out: &mut Out,
) {
    let rank = e.offered;
    let next = e.next_candidate();
    let Some((i, (candidate, estimate))) =
        next.and_then(|i| e.record.candidates.get(i).map(|ce| (i, ce)))
    else {
        let summary = e.no_feasible();
        let error = RouterError::NoFeasibleWorker { summary };
        finish(cfg, idx, e, now, Terminal::Failed(error), out);
        return;
    };
    let (candidate, estimate) = (candidate.clone(), estimate.clone());
    e.offered += 1;
    e.attempt += 1;
    e.current = Some(i);
    let assignment = AssignmentId {
        request: e.request.id.clone(),
        attempt: e.attempt,
    };
    set_phase(idx, e, Phase::Offered);
    match idx.in_flight.get_mut(&candidate.worker_id) {
        Some(set) => {
            set.insert(assignment.clone());
        }
        None => {
            let set = [assignment.clone()].into_iter().collect();
            idx.in_flight.insert(candidate.worker_id.clone(), set);
        }
    }
    e.record.attempts.push(AttemptRecord {
        attempt: e.attempt,
        worker: candidate.worker_id.clone(),
        tier: candidate.tier,
        cached_tokens: candidate.cached_token_count,
        resident_tokens: candidate.resident_head(),
        predicted_ttft_ms: estimate.ttft_ms,
        rank,
        offered_at: now,
        accepted_at: None,
        ended_at: None,
        outcome: AttemptOutcome::Pending,
    });
    let offered = DecisionEventKind::Offered {
        attempt: e.attempt,
        worker: candidate.worker_id.clone(),
        tier: candidate.tier,
        cached_tokens: candidate.cached_token_count,
        predicted_ttft_ms: estimate.ttft_ms,
    };
    out.push(RouterEffect::Send(OutboundToWorker {
        to: candidate.worker_id.clone(),
        message: RouterMessage::Offer(Box::new(Offer {
            assignment: assignment.clone(),
            worker_epoch: candidate.worker_epoch,
            request: Arc::clone(&e.request),
            candidate,
            estimate,
        })),
    }));
    out.push(local(LocalRouterEffect::SetOfferTimer {
        assignment: assignment.clone(),
        at: now + cfg.offer_timeout_ms,
    }));
    decision(out, &e.request.id, now, offered);
    e.assignment = Some(assignment);
}

/// End the current attempt because the whole request ends (cancel, deadline): stop its
/// offer timer if it was still an offer, record `outcome`, and tell the worker.
pub(super) fn abandon_attempt(
    idx: &mut Index,
    e: &mut Entry,
    now: Millis,
    outcome: AttemptOutcome,
    out: &mut Out,
) {
    let (Some(assignment), Some(worker)) = (e.assignment.clone(), e.current_worker().cloned())
    else {
        return;
    };
    if e.phase == Phase::Offered {
        out.push(local(LocalRouterEffect::CancelOfferTimer {
            assignment: assignment.clone(),
        }));
    }
    end_attempt(idx, e, now, outcome, out);
    out.push(send_cancel(worker, assignment));
}

/// Close the current attempt: drop it from the in-flight index and record its outcome.
pub(super) fn end_attempt(
    idx: &mut Index,
    e: &mut Entry,
    now: Millis,
    outcome: AttemptOutcome,
    out: &mut Out,
) {
    if let (Some(a), Some(worker)) = (&e.assignment, e.current_worker())
        && let Some(set) = idx.in_flight.get_mut(worker)
    {
        set.remove(a);
        if set.is_empty() {
            idx.in_flight.remove(worker);
        }
    }
    let request = e.request.id.clone();
    if let Some(a) = e.last_attempt_mut() {
        a.ended_at = Some(now);
        a.outcome = outcome.clone();
        let kind = DecisionEventKind::AttemptEnded {
            attempt: a.attempt,
            outcome,
        };
        decision(out, &request, now, kind);
    }
}

/// Move a request to its terminal phase and deliver the outcome to the client.
pub(super) fn finish(
    cfg: &RouterConfig,
    idx: &mut Index,
    e: &mut Entry,
    now: Millis,
    terminal: Terminal,
    out: &mut Out,
) {
    let (phase, outcome, kind) = match terminal {
        Terminal::Completed(result) => (
            Phase::Completed,
            TerminalOutcome::Completed,
            DeliveryKind::Completed { result },
        ),
        Terminal::Failed(error) => (
            Phase::Failed,
            TerminalOutcome::Failed {
                error: error.clone(),
            },
            DeliveryKind::Error { error },
        ),
        Terminal::Cancelled => (
            Phase::Cancelled,
            TerminalOutcome::Cancelled,
            DeliveryKind::Cancelled,
        ),
    };
    if e.phase == Phase::Waiting {
        // It ended still waiting for pages (cancelled, or its deadline passed).
        e.record.waited_ms = now.since(e.record.submitted_at);
    }
    set_phase(idx, e, phase);
    let id = e.request.id.clone();
    if phase == Phase::Completed && e.record.measured_ttft_ms.is_none() {
        e.record.measured_ttft_ms = Some(now.since(e.record.submitted_at));
    }
    e.record.outcome = Some(outcome.clone());
    e.record.finished_at = Some(now);
    compact_candidates(cfg, e);
    out.push(deliver(&id, kind));
    if now < e.record.deadline {
        out.push(local(LocalRouterEffect::CancelDeadlineTimer {
            request: id.clone(),
        }));
    }
    let measured_ttft_ms = e.record.measured_ttft_ms;
    decision(
        out,
        &id,
        now,
        DecisionEventKind::Finished {
            outcome,
            measured_ttft_ms,
        },
    );
    idx.expiry.insert((now + cfg.retention_ms, id));
}

/// A finished request keeps only the candidates that explain it: no more offers follow.
pub(super) fn compact_candidates(cfg: &RouterConfig, e: &mut Entry) {
    let before = e.record.candidates.len();
    // Every candidate an attempt was made on stays (the record's attempts name them).
    let attempted: Vec<usize> = e
        .record
        .candidates
        .iter()
        .enumerate()
        .filter(|(_, (c, _))| {
            e.record
                .attempts
                .iter()
                .any(|a| a.worker == c.worker_id && a.tier == c.tier)
        })
        .map(|(i, _)| i)
        .chain(e.current)
        .collect();
    let map = e
        .record
        .candidates
        .compact(cfg.retained_candidates, &attempted);
    e.record.candidates_omitted += before - e.record.candidates.len();
    e.current = e.current.and_then(|i| map.get(i).copied().flatten());
    e.order.clear();
    e.cursor = 0;
}

pub(super) fn deadline_timer(e: &Entry) -> RouterEffect {
    local(LocalRouterEffect::SetDeadlineTimer {
        request: e.request.id.clone(),
        at: e.record.deadline,
    })
}

pub(super) fn set_phase(idx: &mut Index, e: &mut Entry, phase: Phase) {
    let old = idx.counts.slot(e.phase);
    *old = old.saturating_sub(1);
    *idx.counts.slot(phase) += 1;
    e.phase = phase;
}

pub(super) fn send_cancel(to: WorkerId, assignment: AssignmentId) -> RouterEffect {
    RouterEffect::Send(OutboundToWorker {
        to,
        message: RouterMessage::Cancel(Cancel { assignment }),
    })
}

pub(super) fn local(effect: LocalRouterEffect) -> RouterEffect {
    RouterEffect::Local(effect)
}

pub(super) fn deliver(request: &RequestId, kind: DeliveryKind) -> RouterEffect {
    local(LocalRouterEffect::Deliver(Delivery {
        request: request.clone(),
        kind,
    }))
}

pub(super) fn decision(out: &mut Out, request: &RequestId, now: Millis, kind: DecisionEventKind) {
    out.push(local(LocalRouterEffect::Decision(DecisionEvent {
        request: request.clone(),
        at: now,
        kind,
    })));
}
