//! The placement state machine. See the module documentation of [`super`] for the steps.

use std::collections::BTreeMap;

use super::select::{Criteria, select_preview};
use super::{
    Effect, FailureReason, Fence, Input, Note, Outcome, PlacementRequest, ProbeResult, RequestSeq,
    StepKind, TransportFailure, UncertainReason, WorkflowConfig,
};
use crate::evidence::{
    EndpointLabel, EvidenceReducer, Expectation, Input as EvidenceInput, PollFailure,
    PollFailureKind, PollObservation, PollResult, Presence, ProbeOutcome, Reason, Verdict,
};
use crate::ids::NodeId;
use crate::skulk::api::{CreateInstanceResponse, ModelRequirements, PreviewsResponse};
use crate::skulk::chat::{ChatCompletionRequest, ChatMessage};
use crate::skulk::error::ApiError;
use crate::skulk::{
    CommandId, CommandOutcome, CreateInstanceRequest, DownloadProgress, HttpIntent, Instance,
    InstanceId, State,
};
use crate::time::Millis;

/// The label of the management endpoint inside the workflow's evidence reducer.
const MANAGEMENT: &str = "management";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Idle,
    Identity,
    Requirements,
    Previews,
    Baseline,
    Fencing,
    Submitting,
    Reconciling,
    Probing,
    Done,
}

/// What came back for an HTTP effect.
enum Answer {
    Response { status: u16, body: String },
    Failed(TransportFailure),
}

impl Answer {
    fn ok_body(&self) -> Option<&str> {
        match self {
            Answer::Response { status, body } if (200..300).contains(status) => Some(body),
            _ => None,
        }
    }

    /// One line saying what went wrong (for a non-2xx response or a transport failure).
    fn failure_detail(&self) -> String {
        match self {
            Answer::Response { status, body } => ApiError::from_response(*status, body).to_string(),
            Answer::Failed(f) => f.detail.clone(),
        }
    }
}

/// One placement, from identity check to outcome.
#[derive(Debug, Clone)]
pub struct PlacementWorkflow {
    config: WorkflowConfig,
    step: Step,
    resumed: bool,
    request: Option<PlacementRequest>,
    next_seq: u64,
    outstanding: Option<RequestSeq>,
    management_node: Option<NodeId>,
    requirements: Option<ModelRequirements>,
    selected: Option<Instance>,
    fence: Option<Fence>,
    command_id: Option<CommandId>,
    observed: bool,
    probe_sent: bool,
    probe_others: Vec<InstanceId>,
    evidence: EvidenceReducer,
    outcome: Option<Outcome>,
    notes: Vec<Note>,
}

impl PlacementWorkflow {
    pub fn new(config: WorkflowConfig) -> PlacementWorkflow {
        let evidence = EvidenceReducer::new(config.evidence.clone());
        PlacementWorkflow {
            config,
            step: Step::Idle,
            resumed: false,
            request: None,
            next_seq: 0,
            outstanding: None,
            management_node: None,
            requirements: None,
            selected: None,
            fence: None,
            command_id: None,
            observed: false,
            probe_sent: false,
            probe_others: Vec::new(),
            evidence,
            outcome: None,
            notes: Vec::new(),
        }
    }

    /// The single entry point.
    pub fn handle(&mut self, now: Millis, input: Input) -> Vec<Effect> {
        if self.step == Step::Done {
            return Vec::new();
        }
        match input {
            Input::Start(request) if self.step == Step::Idle => self.start(request),
            Input::Resume(fence) if self.step == Step::Idle => self.resume(*fence),
            Input::Start(_) | Input::Resume(_) => Vec::new(),
            Input::HttpResponse {
                request,
                status,
                body,
            } => {
                if !self.take(request) {
                    return Vec::new();
                }
                self.on_answer(now, Answer::Response { status, body })
            }
            Input::HttpFailed { request, failure } => {
                if !self.take(request) {
                    return Vec::new();
                }
                self.on_answer(now, Answer::Failed(failure))
            }
            Input::FencePersisted { instance_id } => self.on_fence_persisted(instance_id),
            Input::FencePersistFailed {
                instance_id,
                detail,
            } => {
                if self.step != Step::Fencing
                    || self.fence.as_ref().map(|f| &f.instance_id) != Some(&instance_id)
                {
                    return Vec::new();
                }
                // Nothing was sent; there is no fence to clear.
                self.finish_failed(FailureReason::FenceNotPersisted { detail }, false)
            }
            Input::ProbeAnswered { request, result } => {
                if self.step != Step::Probing || !self.take(request) {
                    return Vec::new();
                }
                self.on_probe(now, result)
            }
            Input::Wake => {
                if self.step == Step::Reconciling && self.outstanding.is_none() {
                    self.poll_cycle()
                } else {
                    Vec::new()
                }
            }
        }
    }

    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    pub fn fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }

    pub fn command_id(&self) -> Option<&CommandId> {
        self.command_id.as_ref()
    }

    pub fn notes(&self) -> &[Note] {
        &self.notes
    }

    /// The evidence gathered while reconciling (for the console's detail view).
    pub fn evidence(&self) -> &EvidenceReducer {
        &self.evidence
    }

    pub fn step(&self) -> StepKind {
        match self.step {
            Step::Idle => StepKind::Idle,
            Step::Identity => StepKind::CheckingIdentity,
            Step::Requirements => StepKind::ReadingRequirements,
            Step::Previews => StepKind::Previewing,
            Step::Baseline => StepKind::ReadingBaseline,
            Step::Fencing => StepKind::PersistingFence,
            Step::Submitting => StepKind::Submitting,
            Step::Reconciling => StepKind::Reconciling,
            Step::Probing => StepKind::Probing,
            Step::Done => StepKind::Done,
        }
    }

    // ----- steps ---------------------------------------------------------------------

    fn start(&mut self, request: PlacementRequest) -> Vec<Effect> {
        self.request = Some(request);
        self.step = Step::Identity;
        vec![self.http(HttpIntent::node_id())]
    }

    fn resume(&mut self, fence: Fence) -> Vec<Effect> {
        self.resumed = true;
        self.request = Some(PlacementRequest {
            model_id: fence.model_id.clone(),
            nodes: fence.nodes.clone(),
            context_tokens: fence.context_tokens,
            management_node: fence.management_node.clone(),
            approved_card_digest: None,
            hard_expiry: fence.hard_expiry,
        });
        self.selected = Some(fence.request.instance.clone());
        self.notes.push(Note::Resumed {
            instance_id: fence.instance_id.clone(),
        });
        self.fence = Some(fence);
        // Recheck the management identity first, then reconcile. Never re-post.
        self.step = Step::Identity;
        vec![self.http(HttpIntent::node_id())]
    }

    fn on_answer(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
        match self.step {
            Step::Identity => self.on_identity(now, answer),
            Step::Requirements => self.on_requirements(answer),
            Step::Previews => self.on_previews(answer),
            Step::Baseline => self.on_baseline(now, answer),
            Step::Submitting => self.on_submitted(now, answer),
            Step::Reconciling => self.on_state(now, answer),
            Step::Idle | Step::Fencing | Step::Probing | Step::Done => Vec::new(),
        }
    }

    fn on_identity(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
        let observed = match answer.ok_body() {
            Some(body) => serde_json::from_str::<NodeId>(body)
                .map_err(|e| format!("unreadable /node_id answer: {e}")),
            None => Err(answer.failure_detail()),
        };
        let node = match observed {
            Ok(node) => node,
            Err(detail) if self.resumed => {
                // Already submitted: keep reconciling (identity is asked again next cycle).
                self.notes.push(Note::PollFailed { detail });
                self.step = Step::Reconciling;
                return self.after_poll(now);
            }
            Err(detail) => {
                return self.finish_failed(FailureReason::IdentityUnavailable { detail }, false);
            }
        };
        let expected = self
            .request
            .as_ref()
            .and_then(|r| r.management_node.clone());
        if let Some(expected) = expected
            && expected != node
        {
            return if self.resumed {
                self.finish_uncertain(UncertainReason::ManagementIdentityChanged {
                    expected,
                    observed: node,
                })
            } else {
                self.finish_failed(
                    FailureReason::ManagementIdentityMismatch {
                        expected,
                        observed: node,
                    },
                    false,
                )
            };
        }
        self.management_node = Some(node.clone());
        self.evidence.handle(
            now,
            EvidenceInput::Endpoint {
                endpoint: management(),
                expected_node: Some(node),
            },
        );
        if self.resumed {
            return self.enter_reconciliation(now);
        }
        let Some(request) = &self.request else {
            return Vec::new();
        };
        let intent = HttpIntent::model_requirements(&request.model_id, request.context_tokens);
        self.step = Step::Requirements;
        vec![self.http(intent)]
    }

    fn on_requirements(&mut self, answer: Answer) -> Vec<Effect> {
        match &answer {
            Answer::Response { status, body } if (200..300).contains(status) => {
                match serde_json::from_str::<ModelRequirements>(body) {
                    Ok(requirements) => {
                        if let Some(reason) = self.check_requirements(&requirements) {
                            return self.finish_failed(reason, false);
                        }
                        self.requirements = Some(requirements);
                    }
                    Err(e) => self.notes.push(Note::RequirementsUnavailable {
                        detail: format!("unreadable: {e}"),
                    }),
                }
            }
            // The endpoint does not exist (Skulk 1.3.0): requirements are unknown.
            Answer::Response {
                status: 404 | 405, ..
            } => self.notes.push(Note::RequirementsUnavailable {
                detail: answer.failure_detail(),
            }),
            Answer::Response { status, .. } if (400..500).contains(status) => {
                return self.finish_failed(
                    FailureReason::RequirementsRefused {
                        detail: answer.failure_detail(),
                    },
                    false,
                );
            }
            // A read reserves nothing; a server or transport error leaves it unknown.
            _ => self.notes.push(Note::RequirementsUnavailable {
                detail: answer.failure_detail(),
            }),
        }
        let Some(request) = &self.request else {
            return Vec::new();
        };
        let intent = HttpIntent::previews(&request.model_id, &request.nodes, []);
        self.step = Step::Previews;
        vec![self.http(intent)]
    }

    fn check_requirements(&self, requirements: &ModelRequirements) -> Option<FailureReason> {
        let approved = self
            .request
            .as_ref()
            .and_then(|r| r.approved_card_digest.clone());
        if let (Some(approved), Some(current)) = (approved, requirements.card_digest.clone())
            && approved != current
        {
            return Some(FailureReason::CardChangedSinceApproval { approved, current });
        }
        if !requirements.incomplete_capabilities.is_empty() {
            return Some(FailureReason::IncompleteCapabilities {
                capabilities: requirements.incomplete_capabilities.clone(),
            });
        }
        None
    }

    fn on_previews(&mut self, answer: Answer) -> Vec<Effect> {
        let previews = match answer.ok_body() {
            Some(body) => match serde_json::from_str::<PreviewsResponse>(body) {
                Ok(p) => p,
                Err(e) => {
                    let detail = format!("unreadable previews: {e}");
                    return self
                        .finish_failed(FailureReason::PreviewsUnavailable { detail }, false);
                }
            },
            None => {
                let detail = answer.failure_detail();
                return self.finish_failed(FailureReason::PreviewsUnavailable { detail }, false);
            }
        };
        let Some(request) = &self.request else {
            return Vec::new();
        };
        let approved_digest = request.approved_card_digest.clone().or_else(|| {
            self.requirements
                .as_ref()
                .and_then(|r| r.card_digest.clone())
        });
        let criteria = Criteria {
            model_id: &request.model_id,
            nodes: &request.nodes,
            context_tokens: request.context_tokens,
            card_digest: approved_digest.as_deref(),
            registry_card_id: self
                .requirements
                .as_ref()
                .and_then(|r| r.registry_card_id.as_ref()),
            compatible_backends: self
                .requirements
                .as_ref()
                .map(|r| r.compatible_backends.as_slice())
                .unwrap_or(&[]),
        };
        match select_preview(&previews.previews, &criteria) {
            Ok((_, preview)) => {
                self.selected = preview.instance.clone();
                self.step = Step::Baseline;
                vec![self.http(HttpIntent::state())]
            }
            Err(rejections) => {
                self.finish_failed(FailureReason::NoExactPreview { rejections }, false)
            }
        }
    }

    fn on_baseline(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
        let state = match answer.ok_body().map(serde_json::from_str::<State>) {
            Some(Ok(state)) => state,
            Some(Err(e)) => {
                let detail = format!("unreadable /state: {e}");
                return self.finish_failed(FailureReason::StateUnavailable { detail }, false);
            }
            None => {
                let detail = answer.failure_detail();
                return self.finish_failed(FailureReason::StateUnavailable { detail }, false);
            }
        };
        let Some(request) = self.request.clone() else {
            return Vec::new();
        };
        let missing: Vec<NodeId> = request
            .nodes
            .iter()
            .filter(|n| !state.topology.contains(n))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return self
                .finish_failed(FailureReason::TargetNotInTopology { nodes: missing }, false);
        }
        // The baseline is evidence too: download history from before the submission is
        // then recognisable as such.
        self.feed_poll(now, PollResult::State(Box::new(state)));
        let Some(instance) = self.selected.clone() else {
            return Vec::new();
        };
        let Some(core) = instance.core() else {
            return Vec::new();
        };
        let deadline = bound(
            now.saturating_add(self.config.reconcile_deadline_ms),
            request.hard_expiry,
        );
        let fence = Fence {
            version: Fence::VERSION,
            instance_id: core.instance_id,
            model_id: request.model_id.clone(),
            nodes: request.nodes.clone(),
            management_node: self.management_node.clone(),
            context_tokens: request.context_tokens,
            request: CreateInstanceRequest { instance },
            created_at: now,
            reconcile_deadline: deadline,
            hard_expiry: request.hard_expiry,
        };
        self.fence = Some(fence.clone());
        self.step = Step::Fencing;
        vec![Effect::PersistFence(Box::new(fence))]
    }

    fn on_fence_persisted(&mut self, instance_id: InstanceId) -> Vec<Effect> {
        let Some(fence) = self.fence.clone() else {
            return Vec::new();
        };
        if self.step != Step::Fencing || fence.instance_id != instance_id {
            return Vec::new();
        }
        match HttpIntent::create_instance(&fence.request) {
            Ok(intent) => {
                self.step = Step::Submitting;
                vec![self.http(intent)]
            }
            Err(e) => self.finish_failed(
                FailureReason::NotSent {
                    detail: format!("body not serialisable: {e}"),
                },
                true,
            ),
        }
    }

    fn on_submitted(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
        let Some(ours) = self.fence.as_ref().map(|f| f.instance_id.clone()) else {
            return Vec::new();
        };
        match &answer {
            Answer::Response { status, body } if (200..300).contains(status) => {
                match serde_json::from_str::<CreateInstanceResponse>(body) {
                    Ok(ack) => {
                        self.command_id = Some(ack.command_id);
                        if let Some(answered) = ack.instance_id
                            && answered != ours
                        {
                            let reason = UncertainReason::ResponseNamesOtherInstance {
                                submitted: ours,
                                answered,
                            };
                            return self.finish_uncertain(reason);
                        }
                    }
                    Err(e) => self.notes.push(Note::AcknowledgementUnreadable {
                        detail: e.to_string(),
                    }),
                }
            }
            // Skulk checks before forwarding the command: a 4xx means nothing happened.
            Answer::Response { status, .. } if (400..500).contains(status) => {
                let reason = FailureReason::Refused {
                    status: *status,
                    detail: answer.failure_detail(),
                };
                return self.finish_failed(reason, true);
            }
            Answer::Failed(failure) if !failure.sent => {
                return self.finish_failed(
                    FailureReason::NotSent {
                        detail: failure.detail.clone(),
                    },
                    true,
                );
            }
            // 5xx or a lost response: the command may have been accepted. Reconcile.
            _ => self.notes.push(Note::SubmissionOutcomeUnknown {
                detail: answer.failure_detail(),
            }),
        }
        self.enter_reconciliation(now)
    }

    fn enter_reconciliation(&mut self, now: Millis) -> Vec<Effect> {
        let Some(fence) = &self.fence else {
            return Vec::new();
        };
        let expectation = Expectation {
            instance: fence.instance_id.clone(),
            deadline: Some(fence.reconcile_deadline),
            hard_expiry: fence.hard_expiry,
        };
        self.evidence
            .handle(now, EvidenceInput::Expect(expectation));
        self.step = Step::Reconciling;
        self.poll_cycle()
    }

    /// One reconciliation poll: the identity first if it is not established yet.
    fn poll_cycle(&mut self) -> Vec<Effect> {
        if self.management_node.is_none() {
            self.step = Step::Identity;
            return vec![self.http(HttpIntent::node_id())];
        }
        self.step = Step::Reconciling;
        vec![self.http(HttpIntent::state())]
    }

    fn on_state(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
        let result = match &answer {
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
        };
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
        if let Some(effects) = self.judge(now) {
            return effects;
        }
        self.after_poll(now)
    }

    /// Decides what the latest evidence means; `None` to keep reconciling.
    fn judge(&mut self, now: Millis) -> Option<Vec<Effect>> {
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

    fn after_poll(&mut self, now: Millis) -> Vec<Effect> {
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
    fn conclude(&mut self, now: Millis, deadline: Millis) -> Vec<Effect> {
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

    fn send_probe(&mut self, fence: &Fence) -> Vec<Effect> {
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
            extra: BTreeMap::new(),
        };
        let intent = match HttpIntent::chat_completions(&body) {
            Ok(intent) => intent,
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

    fn on_probe(&mut self, now: Millis, result: ProbeResult) -> Vec<Effect> {
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
                self.evidence.handle(
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
                self.evidence.handle(
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

    // ----- helpers -------------------------------------------------------------------

    fn feed_poll(&mut self, now: Millis, result: PollResult) {
        let observation = PollObservation {
            endpoint: management(),
            node_id: self.management_node.clone(),
            result,
        };
        self.evidence.handle(now, EvidenceInput::Poll(observation));
    }

    /// den's command status: our command rejected.
    fn command_rejection(&self, state: &State) -> Option<String> {
        let command = self.command_id.as_ref()?;
        match &state.commands.as_ref()?.get(command)?.outcome {
            CommandOutcome::Rejected(r) => Some(r.message.clone()),
            _ => None,
        }
    }

    /// Why an observed instance may have vanished: Skulk 1.3.0 deletes an instance stuck
    /// on a failed download; the retained DownloadFailed is the only trace.
    fn removal_hint(&self, fence: &Fence) -> Option<String> {
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

    fn next_seq(&mut self) -> RequestSeq {
        self.next_seq = self.next_seq.saturating_add(1);
        let seq = RequestSeq(self.next_seq);
        self.outstanding = Some(seq);
        seq
    }

    fn http(&mut self, intent: HttpIntent) -> Effect {
        let request = self.next_seq();
        Effect::Http { request, intent }
    }

    /// Accepts an answer only for the outstanding request (fencing of late answers).
    fn take(&mut self, seq: RequestSeq) -> bool {
        if self.outstanding == Some(seq) {
            self.outstanding = None;
            true
        } else {
            false
        }
    }

    fn instance_id(&self) -> Option<InstanceId> {
        self.fence
            .as_ref()
            .map(|f| f.instance_id.clone())
            .or_else(|| {
                self.selected
                    .as_ref()
                    .and_then(|i| i.instance_id().cloned())
            })
    }

    fn finish(&mut self, outcome: Outcome, clear_fence: bool) -> Vec<Effect> {
        self.step = Step::Done;
        self.outstanding = None;
        self.outcome = Some(outcome.clone());
        let mut effects = Vec::new();
        if clear_fence && let Some(fence) = &self.fence {
            effects.push(Effect::ClearFence {
                instance_id: fence.instance_id.clone(),
            });
        }
        effects.push(Effect::Finished(outcome));
        effects
    }

    fn finish_placed(&mut self, fence: &Fence) -> Vec<Effect> {
        let outcome = Outcome::Placed {
            instance_id: fence.instance_id.clone(),
            command_id: self.command_id.clone(),
        };
        self.finish(outcome, true)
    }

    fn finish_failed(&mut self, reason: FailureReason, clear_fence: bool) -> Vec<Effect> {
        let instance_id = self.instance_id();
        self.finish(
            Outcome::Failed {
                instance_id,
                reason,
            },
            clear_fence,
        )
    }

    /// Uncertain keeps the fence: whoever resumes must reconcile, not re-post.
    fn finish_uncertain(&mut self, reason: UncertainReason) -> Vec<Effect> {
        let instance_id = self.instance_id();
        self.finish(
            Outcome::Uncertain {
                instance_id,
                reason,
            },
            false,
        )
    }
}

fn management() -> EndpointLabel {
    EndpointLabel::from(MANAGEMENT)
}

fn bound(t: Millis, limit: Option<Millis>) -> Millis {
    limit.map_or(t, |l| t.min(l))
}
