//! Reconciliation after submission, the probe, and the outcome at the deadline.

use super::{Answer, PlacementWorkflow, Step, bound, management};
use crate::evidence::download::card_matches;
use crate::evidence::{
    Expectation, Input as EvidenceInput, PollFailure, PollFailureKind, PollResult, Presence,
    ProbeOutcome, Reason, Verdict,
};
use crate::ids::NodeId;
use crate::placement::{Effect, FailureReason, Fence, Note, ProbeResult, UncertainReason};
use crate::skulk::chat::{ChatCompletionRequest, ChatMessage};
use crate::skulk::{CommandOutcome, DownloadProgress, HttpIntent, InstanceId, State};
use crate::time::Millis;

impl PlacementWorkflow {
    /// The accepted instance rechecked against the complete shard cards the fence stored
    /// (the guide: persist them "for subsequent state comparisons"), node by node, by
    /// the same rule downloads are matched with (signed: registry card id; otherwise the
    /// whole card).
    fn card_differs(&self, fence: &Fence) -> Option<UncertainReason> {
        let observed = self
            .evidence
            .latest_state(&management())?
            .instances
            .get(&fence.instance_id)?
            .core()?;
        let submitted = fence.request.instance.core()?;
        for node in &fence.nodes {
            let (Some(want), Some(seen)) = (
                submitted.shard_assignments.card_of_node(node),
                observed.shard_assignments.card_of_node(node),
            ) else {
                continue;
            };
            if !card_matches(&want, &seen) {
                let name = |c: &crate::skulk::ModelCard| match &c.registry_card_id {
                    Some(id) => format!("{} ({id})", c.model_id),
                    None => c.model_id.to_string(),
                };
                return Some(UncertainReason::CardDiffersFromFence {
                    node: node.clone(),
                    submitted: name(&want),
                    observed: name(&seen),
                });
            }
        }
        None
    }

    pub(super) fn enter_reconciliation(&mut self, now: Millis) -> Vec<Effect> {
        let Some(fence) = &self.fence else {
            return Vec::new();
        };
        let expectation = Expectation {
            instance: fence.instance_id.clone(),
            deadline: Some(fence.reconcile_deadline),
            hard_expiry: fence.hard_expiry,
        };
        self.observe(now, EvidenceInput::Expect(expectation));
        self.step = Step::Reconciling;
        self.poll_cycle()
    }

    /// One reconciliation poll: the identity first if it is not established yet.
    pub(super) fn poll_cycle(&mut self) -> Vec<Effect> {
        if self.management_node.is_none() {
            self.step = Step::Identity;
            return vec![self.http(HttpIntent::node_id())];
        }
        self.step = Step::Reconciling;
        vec![self.http(HttpIntent::state())]
    }

    pub(super) fn on_state(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
        let result = poll_result(&answer);
        if let PollResult::Failed(failure) = &result {
            self.notes.push(Note::PollFailed {
                detail: failure.to_string(),
            });
        }
        let rejected = match &result {
            PollResult::State(state) => self.command_rejection(state),
            PollResult::Failed(_) => None,
        };
        self.feed_poll(now, result);
        if let Some(message) = rejected {
            return self.finish_failed(FailureReason::CommandRejected { message }, true);
        }
        if self.compute_node.is_some() {
            // The second side before judging: readiness needs both views fresh.
            self.step = Step::ReconcilingCompute;
            return vec![self.http_compute(HttpIntent::state())];
        }
        self.judge_and_wait(now)
    }

    pub(super) fn on_compute_state(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
        let result = poll_result(&answer);
        if let PollResult::Failed(failure) = &result {
            self.notes.push(Note::PollFailed {
                detail: format!("compute node: {failure}"),
            });
        }
        self.feed_compute_poll(now, result);
        self.step = Step::Reconciling;
        self.judge_and_wait(now)
    }

    fn judge_and_wait(&mut self, now: Millis) -> Vec<Effect> {
        if let Some(effects) = self.judge(now) {
            return effects;
        }
        self.after_poll(now)
    }

    /// Decides what the latest evidence means; `None` to keep reconciling.
    pub(super) fn judge(&mut self, now: Millis) -> Option<Vec<Effect>> {
        let fence = self.fence.clone()?;
        let report = self.evidence.instance(&fence.instance_id, now)?;
        if let Some(message) = report.failures.iter().find_map(|r| match r {
            Reason::InstanceFailed { message, .. } => Some(message.clone()),
            _ => None,
        }) {
            return Some(self.finish_failed(FailureReason::InstanceFailed { message }, true));
        }
        match &report.presence {
            Presence::Observed { .. } | Presence::Disputed { .. } => self.observed = true,
            Presence::Gone { .. } if self.observed => {
                let detail = self.removal_hint(&fence);
                return Some(self.finish_failed(FailureReason::InstanceRemoved { detail }, true));
            }
            _ => {}
        }
        if self.observed && !report.assignments.is_empty() {
            let observed_nodes: Vec<NodeId> =
                report.assignments.iter().map(|a| a.node.clone()).collect();
            if observed_nodes
                .iter()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
                != fence.nodes
            {
                let expected = fence.nodes.iter().cloned().collect();
                let reason = UncertainReason::PlacementDiffers {
                    expected,
                    observed: observed_nodes,
                };
                return Some(self.finish_uncertain(reason));
            }
            if let Some(reason) = self.card_differs(&fence) {
                return Some(self.finish_uncertain(reason));
            }
            if let (Some(limit), Some(requested)) =
                (report.context_token_limit, fence.context_tokens)
                && limit < requested
            {
                return Some(self.finish_failed(
                    FailureReason::ContextLimitTooSmall { limit, requested },
                    true,
                ));
            }
        }
        if let Some((node, runner, message)) = report.runner_failure() {
            let reason = FailureReason::RunnerFailed {
                node: node.clone(),
                runner: runner.clone(),
                message: message.to_owned(),
            };
            return Some(self.finish_failed(reason, true));
        }
        if let Some((node, message)) = report.reasons().iter().find_map(|r| match r {
            Reason::DownloadFailed {
                node,
                message,
                current: true,
                ..
            } => Some((node.clone(), message.clone())),
            _ => None,
        }) {
            return Some(self.finish_failed(FailureReason::DownloadFailed { node, message }, true));
        }
        if report.verdict.is_ready() {
            return Some(self.finish_placed(&fence));
        }
        if report.awaiting_probe && !self.probe_sent {
            return Some(self.send_probe(&fence));
        }
        None
    }

    pub(super) fn after_poll(&mut self, now: Millis) -> Vec<Effect> {
        let Some(deadline) = self.fence.as_ref().map(|f| f.reconcile_deadline) else {
            return Vec::new();
        };
        if now >= deadline {
            return self.conclude(now, deadline);
        }
        let wake = bound(
            now.saturating_add(self.config.poll_interval_ms),
            Some(deadline),
        );
        vec![Effect::WakeAt(wake)]
    }

    /// The deadline passed without a definitive answer.
    pub(super) fn conclude(&mut self, now: Millis, deadline: Millis) -> Vec<Effect> {
        let Some(id) = self.fence.as_ref().map(|f| f.instance_id.clone()) else {
            return Vec::new();
        };
        if !self.observed {
            return self.finish_uncertain(UncertainReason::NotObservedBeforeDeadline { deadline });
        }
        let verdict = self.evidence.instance(&id, now).map(|r| r.verdict);
        let reasons = verdict
            .as_ref()
            .map(|v| v.reasons().to_vec())
            .unwrap_or_default();
        if matches!(verdict, Some(Verdict::Uncertain { .. })) {
            return self.finish_uncertain(UncertainReason::ContradictoryEvidence { reasons });
        }
        let blind = reasons.iter().any(|r| {
            matches!(
                r,
                Reason::PollFailing { .. }
                    | Reason::EvidenceStale { .. }
                    | Reason::NoObservation { .. }
            )
        });
        if blind {
            // The last word is that we cannot see: not a proof of failure.
            return self.finish_uncertain(UncertainReason::EvidenceUnavailable { reasons });
        }
        self.finish_failed(FailureReason::ReadinessTimedOut { deadline, reasons }, true)
    }

    pub(super) fn send_probe(&mut self, fence: &Fence) -> Vec<Effect> {
        let others: Vec<InstanceId> = self
            .evidence
            .latest_state(&management())
            .map(|s| {
                s.instances_of_model(&fence.model_id)
                    .filter(|i| **i != fence.instance_id)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        self.probe_others = others;
        let body = ChatCompletionRequest {
            model: fence.model_id.clone(),
            messages: vec![ChatMessage::user(&self.config.probe_prompt)],
            max_tokens: Some(self.config.probe_max_tokens),
            stream: false,
            extra: Default::default(),
        };
        // den's router serves the probe on exactly this instance (`den_instance`); other
        // servers ignore the parameter, and `served_by` (or its absence) still decides
        // attribution.
        let intent = match HttpIntent::chat_completions(&body) {
            Ok(intent) => intent.with_query("den_instance", fence.instance_id.as_str()),
            Err(e) => {
                return self.finish_uncertain(UncertainReason::ProbeTransport {
                    detail: e.to_string(),
                });
            }
        };
        self.probe_sent = true;
        self.step = Step::Probing;
        let request = self.next_seq();
        vec![Effect::Probe {
            request,
            instance_id: fence.instance_id.clone(),
            intent,
        }]
    }

    pub(super) fn on_probe(&mut self, now: Millis, result: ProbeResult) -> Vec<Effect> {
        let Some(fence) = self.fence.clone() else {
            return Vec::new();
        };
        match result {
            ProbeResult::Transport { detail } => {
                self.finish_uncertain(UncertainReason::ProbeTransport { detail })
            }
            ProbeResult::Error { detail } => {
                let outcome = ProbeOutcome::Failed {
                    detail: detail.clone(),
                };
                self.observe(
                    now,
                    EvidenceInput::Probe {
                        instance: fence.instance_id.clone(),
                        outcome,
                    },
                );
                self.finish_failed(FailureReason::ProbeFailed { detail }, true)
            }
            ProbeResult::Completed { served_by } => {
                if served_by.is_none() && !self.probe_others.is_empty() {
                    // Another instance of the same model may have answered: proves nothing.
                    let others = self.probe_others.clone();
                    return self.finish_uncertain(UncertainReason::ProbeNotAttributable { others });
                }
                let outcome = ProbeOutcome::Succeeded { served_by };
                self.observe(
                    now,
                    EvidenceInput::Probe {
                        instance: fence.instance_id.clone(),
                        outcome,
                    },
                );
                let verdict = self.evidence.verdict(&fence.instance_id).cloned();
                match verdict {
                    Some(Verdict::Ready { .. }) => self.finish_placed(&fence),
                    Some(v)
                        if v.reasons()
                            .iter()
                            .any(|r| matches!(r, Reason::ProbeServedByOther { .. })) =>
                    {
                        self.finish_uncertain(UncertainReason::ProbeNotConfirmed {
                            verdict: v.to_string(),
                        })
                    }
                    // The evidence may simply have aged while the probe ran: look again.
                    _ => {
                        self.step = Step::Reconciling;
                        self.poll_cycle()
                    }
                }
            }
        }
    }

    /// den's command status: our command rejected.
    pub(super) fn command_rejection(&self, state: &State) -> Option<String> {
        let command = self.command_id.as_ref()?;
        match &state.commands.as_ref()?.get(command)?.outcome {
            CommandOutcome::Rejected(r) => Some(r.message.clone()),
            _ => None,
        }
    }

    /// Why an observed instance may have vanished: Skulk 1.3.0 deletes an instance stuck
    /// on a failed download; the retained DownloadFailed is the only trace.
    pub(super) fn removal_hint(&self, fence: &Fence) -> Option<String> {
        let state = self.evidence.latest_state(&management())?;
        fence.nodes.iter().find_map(|node| {
            state
                .downloads_of(node)
                .iter()
                .find_map(|record| match record {
                    DownloadProgress::Failed(f)
                        if record
                            .model_card()
                            .is_some_and(|c| c.model_id == fence.model_id) =>
                    {
                        Some(format!("download on {node} failed: {}", f.error_message))
                    }
                    _ => None,
                })
        })
    }
}

/// A `/state` answer as the evidence reducer's poll result.
fn poll_result(answer: &Answer) -> PollResult {
    match answer {
        Answer::Response { status, body } if (200..300).contains(status) => {
            match serde_json::from_str::<State>(body) {
                Ok(state) => PollResult::State(Box::new(state)),
                Err(e) => PollResult::Failed(PollFailure {
                    kind: PollFailureKind::Decode,
                    detail: e.to_string(),
                }),
            }
        }
        Answer::Response { status, .. } => PollResult::Failed(PollFailure {
            kind: PollFailureKind::Http(*status),
            detail: answer.failure_detail(),
        }),
        Answer::Failed(f) => PollResult::Failed(PollFailure {
            kind: PollFailureKind::Transport,
            detail: f.detail.clone(),
        }),
    }
}
