//! The placement state machine. See the module documentation of [`super`] for the steps.
//!
//! `submit` holds the steps up to the POST, `reconcile` everything after it.

mod reconcile;
mod submit;

use super::{
    Effect, FailureReason, Fence, Input, Note, Outcome, PlacementRequest, RequestSeq, StepKind,
    Target, TransportFailure, UncertainReason, WorkflowConfig,
};
use crate::evidence::{
    EndpointLabel, EvidenceReducer, Input as EvidenceInput, PollObservation, PollResult,
};
use crate::ids::NodeId;
use crate::skulk::api::ModelRequirements;
use crate::skulk::error::ApiError;
use crate::skulk::{CommandId, HttpIntent, Instance, InstanceId};
use crate::time::Millis;

/// The labels of the endpoints inside the workflow's evidence reducer.
const MANAGEMENT: &str = "management";
const COMPUTE: &str = "compute";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Idle,
    Identity,
    ComputeIdentity,
    Requirements,
    Previews,
    Baseline,
    ComputeBaseline,
    Fencing,
    Submitting,
    Reconciling,
    ReconcilingCompute,
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
    compute_node: Option<NodeId>,
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
            compute_node: None,
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
    #[must_use = "the effects are what the state machine decided: carry them out"]
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
            Step::ComputeIdentity | Step::ComputeBaseline | Step::ReconcilingCompute => {
                StepKind::CheckingCompute
            }
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

    fn on_answer(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
        match self.step {
            Step::Identity => self.on_identity(now, answer),
            Step::ComputeIdentity => self.on_compute_identity(now, answer),
            Step::ComputeBaseline => self.on_compute_baseline(now, answer),
            Step::ReconcilingCompute => self.on_compute_state(now, answer),
            Step::Requirements => self.on_requirements(answer),
            Step::Previews => self.on_previews(now, answer),
            Step::Baseline => self.on_baseline(now, answer),
            Step::Submitting => self.on_submitted(now, answer),
            Step::Reconciling => self.on_state(now, answer),
            Step::Idle | Step::Fencing | Step::Probing | Step::Done => Vec::new(),
        }
    }

    /// Feeds the evidence reducer. The workflow judges from the reducer's state (`judge`),
    /// not from its notices: those are for an event log, which the workflow does not keep.
    fn observe(&mut self, now: Millis, input: EvidenceInput) {
        let _notices = self.evidence.handle(now, input);
    }

    fn feed_poll(&mut self, now: Millis, result: PollResult) {
        let observation = PollObservation {
            endpoint: management(),
            node_id: self.management_node.clone(),
            result,
        };
        self.observe(now, EvidenceInput::Poll(observation));
    }

    fn feed_compute_poll(&mut self, now: Millis, result: PollResult) {
        let observation = PollObservation {
            endpoint: compute(),
            node_id: self.compute_node.clone(),
            result,
        };
        self.observe(now, EvidenceInput::Poll(observation));
    }

    fn next_seq(&mut self) -> RequestSeq {
        self.next_seq = self.next_seq.saturating_add(1);
        let seq = RequestSeq(self.next_seq);
        self.outstanding = Some(seq);
        seq
    }

    fn http(&mut self, intent: HttpIntent) -> Effect {
        let request = self.next_seq();
        Effect::Http {
            request,
            intent,
            target: Target::Management,
        }
    }

    fn http_compute(&mut self, intent: HttpIntent) -> Effect {
        let request = self.next_seq();
        Effect::Http {
            request,
            intent,
            target: Target::Compute,
        }
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

pub(super) fn management() -> EndpointLabel {
    EndpointLabel::from(MANAGEMENT)
}

pub(super) fn compute() -> EndpointLabel {
    EndpointLabel::from(COMPUTE)
}

pub(super) fn bound(t: Millis, limit: Option<Millis>) -> Millis {
    limit.map_or(t, |l| t.min(l))
}
