//! Execution (spec §3.3), token deltas (§3.4) and cancellation with quiescence (§3.5,
//! §3.7).

use std::sync::Arc;

use super::{
    AssignmentPhase, Finished, LocalWorkerEffect, Operation, OperationKind, OperationOutcome,
    ReleaseCause, Worker, WorkerEffect,
};
use crate::capacity::Capacity;
use crate::ids::AssignmentId;
use crate::request::Token;
use crate::time::Millis;
use crate::wire::{
    Failure, FailureKind, ResultMessage, ResultStatus, StopReason, TokenDelta, WorkerMessage,
    WorkerResult,
};

type Out = Vec<WorkerEffect>;

impl<C: Capacity> Worker<C> {
    /// A token from the decode operation: only the exact next index of a decoding,
    /// unfenced assignment is sent; everything else is dropped silently.
    pub(super) fn on_token(
        &mut self,
        now: Millis,
        assignment: &AssignmentId,
        token: Token,
        index: u32,
        out: &mut Out,
    ) {
        let Some(a) = self.active.get_mut(assignment) else {
            return;
        };
        if a.phase != AssignmentPhase::Decoding || index != a.emitted {
            return;
        }
        a.emitted += 1;
        if index == 0 {
            a.timings.first_token_ms = Some(now.since(a.accepted_at));
        }
        out.push(WorkerEffect::Send(WorkerMessage::Token(TokenDelta {
            assignment: assignment.clone(),
            token,
            index,
        })));
    }

    pub(super) fn on_operation_done(
        &mut self,
        now: Millis,
        assignment: &AssignmentId,
        outcome: OperationOutcome,
        out: &mut Out,
    ) {
        let Some(a) = self.active.get_mut(assignment) else {
            return; // unknown (e.g. lost in a crash) or already terminal
        };
        let kind = outcome.kind();
        if a.in_flight != Some(kind) {
            return; // stale or duplicate result
        }
        let elapsed = Some(now.since(a.op_started_at));
        if matches!(outcome, OperationOutcome::Prefilled) {
            // The device goes straight on to the decode (`OperationKind::Prefill`): it is
            // in flight now, cancelled or not, and its outcome is what releases the pages.
            a.timings.prefill_ms = elapsed;
            a.in_flight = Some(OperationKind::Decode);
            a.op_started_at = now;
            if a.phase != AssignmentPhase::Cancelling {
                a.phase = AssignmentPhase::Decoding;
            }
            return;
        }
        a.in_flight = None;
        if a.phase == AssignmentPhase::Cancelling {
            // Quiescent at last: now the reservation can go.
            self.drop_cancelled(now, assignment, out);
            return;
        }
        match outcome {
            OperationOutcome::Restored { cached_token_count } => {
                a.timings.restore_ms = elapsed;
                a.cached_token_count =
                    cached_token_count.unwrap_or(a.work.candidate.cached_token_count);
                // `missing` comes from the estimate, not the restore: decode repairs an
                // under-restored prefix (§3.3).
                let next = if a.work.estimate.missing > 0 {
                    OperationKind::Prefill
                } else {
                    OperationKind::Decode
                };
                out.push(self.start(now, assignment, next));
            }
            // Handled above: the decode is already running.
            OperationOutcome::Prefilled => {}
            OperationOutcome::Decoded { tokens, stop } => {
                a.timings.decode_ms = elapsed;
                self.complete(now, assignment, tokens, stop, out);
            }
            OperationOutcome::Failed { operation, detail } => {
                let kind = match operation {
                    OperationKind::Restore => FailureKind::RestoreFailed,
                    OperationKind::Prefill => FailureKind::PrefillFailed,
                    OperationKind::Decode => FailureKind::DecodeFailed,
                };
                self.fail(now, assignment, Failure::new(kind, detail), out);
            }
        }
    }

    /// Fence the assignment now; release its pages once nothing of it is in flight.
    pub(super) fn on_cancel(&mut self, now: Millis, assignment: AssignmentId, out: &mut Out) {
        let Some(a) = self.active.get_mut(&assignment) else {
            if !self.finished.contains_key(&assignment) {
                // Cancel overtook its offer: remember it so the offer is never run.
                self.remember(now, assignment, Finished::Cancelled);
            }
            return;
        };
        if a.phase == AssignmentPhase::Cancelling {
            return; // duplicate cancel
        }
        a.phase = AssignmentPhase::Cancelling;
        out.push(WorkerEffect::Local(LocalWorkerEffect::CancelOperation {
            assignment: assignment.clone(),
            in_flight: a.in_flight,
        }));
        if a.in_flight.is_none() {
            self.drop_cancelled(now, &assignment, out);
        }
    }

    fn drop_cancelled(&mut self, now: Millis, assignment: &AssignmentId, out: &mut Out) {
        if let Some(a) = self.remove_active(assignment) {
            self.capacity.abandon(assignment, &a.work.route);
            self.remember(now, assignment.clone(), Finished::Cancelled);
            out.push(released(assignment, ReleaseCause::Cancelled));
        }
    }

    /// Start `kind` for a live assignment.
    fn start(
        &mut self,
        now: Millis,
        assignment: &AssignmentId,
        kind: OperationKind,
    ) -> WorkerEffect {
        let worker = self.id.clone();
        let work = match self.active.get_mut(assignment) {
            Some(a) => {
                a.in_flight = Some(kind);
                a.op_started_at = now;
                a.phase = match kind {
                    OperationKind::Restore => AssignmentPhase::Restoring,
                    OperationKind::Prefill => AssignmentPhase::Prefilling,
                    OperationKind::Decode => AssignmentPhase::Decoding,
                };
                Arc::clone(&a.work)
            }
            // Callers hold a live assignment; this arm only keeps the function total.
            None => {
                return WorkerEffect::Local(LocalWorkerEffect::CancelOperation {
                    assignment: assignment.clone(),
                    in_flight: None,
                });
            }
        };
        WorkerEffect::Local(LocalWorkerEffect::Start(Operation { kind, worker, work }))
    }

    fn complete(
        &mut self,
        now: Millis,
        assignment: &AssignmentId,
        tokens: Vec<Token>,
        stop: StopReason,
        out: &mut Out,
    ) {
        let Some(a) = self.remove_active(assignment) else {
            return;
        };
        self.capacity.complete(assignment, &a.work.route);
        let mut timings = a.timings;
        timings.total_ms = now.since(a.accepted_at);
        let result = WorkerResult {
            status: ResultStatus::Completed,
            tokens,
            cached_token_count: a.cached_token_count,
            stop: Some(stop),
            failure: None,
            timings,
        };
        self.send_result(now, assignment, result, out);
        out.push(released(assignment, ReleaseCause::Completed));
    }

    fn fail(&mut self, now: Millis, assignment: &AssignmentId, failure: Failure, out: &mut Out) {
        let Some(a) = self.remove_active(assignment) else {
            return;
        };
        self.capacity.abandon(assignment, &a.work.route);
        let mut timings = a.timings;
        timings.total_ms = now.since(a.accepted_at);
        let result = WorkerResult {
            status: ResultStatus::Failed,
            tokens: Vec::new(),
            cached_token_count: a.cached_token_count,
            stop: None,
            failure: Some(failure),
            timings,
        };
        self.send_result(now, assignment, result, out);
        out.push(released(assignment, ReleaseCause::Failed));
    }

    fn send_result(
        &mut self,
        now: Millis,
        assignment: &AssignmentId,
        result: WorkerResult,
        out: &mut Out,
    ) {
        let finished = if result.is_completed() {
            Finished::Completed {
                result: result.clone(),
            }
        } else {
            Finished::Failed {
                result: result.clone(),
            }
        };
        self.remember(now, assignment.clone(), finished);
        out.push(WorkerEffect::Send(WorkerMessage::Result(ResultMessage {
            assignment: assignment.clone(),
            result: Box::new(result),
        })));
    }
}

fn released(assignment: &AssignmentId, cause: ReleaseCause) -> WorkerEffect {
    WorkerEffect::Local(LocalWorkerEffect::Released {
        assignment: assignment.clone(),
        cause,
    })
}
