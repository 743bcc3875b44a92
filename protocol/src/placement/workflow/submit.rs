//! Identity, requirements, preview selection, baseline, fence and submission.

use super::{Answer, PlacementWorkflow, Step, bound, compute, management};
use crate::evidence::{Input as EvidenceInput, PollResult};
use crate::ids::NodeId;
use crate::placement::select::{Criteria, select_preview};
use crate::placement::{Effect, FailureReason, Fence, Note, PlacementRequest, UncertainReason};
use crate::skulk::api::{CreateInstanceResponse, ModelRequirements, PreviewsResponse};
use crate::skulk::{CreateInstanceRequest, HttpIntent, InstanceId, State};
use crate::time::Millis;

impl PlacementWorkflow {
    pub(super) fn start(&mut self, request: PlacementRequest) -> Vec<Effect> {
        self.request = Some(request);
        self.step = Step::Identity;
        vec![self.http(HttpIntent::node_id())]
    }

    pub(super) fn resume(&mut self, fence: Fence) -> Vec<Effect> {
        self.resumed = true;
        self.request = Some(PlacementRequest {
            model_id: fence.model_id.clone(),
            nodes: fence.nodes.clone(),
            context_tokens: fence.context_tokens,
            management_node: fence.management_node.clone(),
            approved_card_digest: None,
            hard_expiry: fence.hard_expiry,
            compute: fence.compute_node.is_some(),
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

    pub(super) fn on_identity(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
        let node = match node_id_of(&answer) {
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
        self.observe(
            now,
            EvidenceInput::Endpoint {
                endpoint: management(),
                expected_node: Some(node),
            },
        );
        if self.request.as_ref().is_some_and(|r| r.compute) && self.compute_node.is_none() {
            self.step = Step::ComputeIdentity;
            return vec![self.http_compute(HttpIntent::node_id())];
        }
        self.after_identity(now)
    }

    fn after_identity(&mut self, now: Millis) -> Vec<Effect> {
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

    /// The compute node's own `/node_id`: it must be one of the wanted nodes (and, after
    /// a restart, the one the fence bound). Its endpoint is then registered bound to it,
    /// so every later `/state` it answers is the second side of the evidence.
    pub(super) fn on_compute_identity(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
        let node = match node_id_of(&answer) {
            Ok(node) => node,
            Err(detail) if self.resumed => {
                self.notes.push(Note::PollFailed {
                    detail: format!("compute node: {detail}"),
                });
                return self.after_identity(now);
            }
            Err(detail) => {
                let detail = format!("compute node: {detail}");
                return self.finish_failed(FailureReason::IdentityUnavailable { detail }, false);
            }
        };
        if let Some(expected) = self.fence.as_ref().and_then(|f| f.compute_node.clone())
            && expected != node
        {
            return self.finish_uncertain(UncertainReason::ComputeIdentityChanged {
                expected,
                observed: node,
            });
        }
        let wanted: Vec<NodeId> = self
            .request
            .as_ref()
            .map(|r| r.nodes.iter().cloned().collect())
            .unwrap_or_default();
        if !wanted.contains(&node) {
            return self.finish_failed(
                FailureReason::ComputeNotWanted {
                    observed: node,
                    wanted,
                },
                false,
            );
        }
        self.compute_node = Some(node.clone());
        self.observe(
            now,
            EvidenceInput::Endpoint {
                endpoint: compute(),
                expected_node: Some(node),
            },
        );
        self.after_identity(now)
    }

    pub(super) fn on_requirements(&mut self, answer: Answer) -> Vec<Effect> {
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
            // One short line, not the body: it is said on every placement against 1.3.0.
            Answer::Response {
                status: status @ (404 | 405),
                ..
            } => self.notes.push(Note::RequirementsUnavailable {
                detail: format!(
                    "HTTP {status} (Skulk 1.3.0 has no such endpoint; previews still check)"
                ),
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
        // The wanted nodes are checked against the topology before anything is asked
        // about them: a mistyped `--node` is named as such, not as "no preview".
        self.step = Step::Baseline;
        vec![self.http(HttpIntent::state())]
    }

    pub(super) fn check_requirements(
        &self,
        requirements: &ModelRequirements,
    ) -> Option<FailureReason> {
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
        let unproven = crate::placement::capability::unproven_capabilities(requirements);
        if !unproven.is_empty() {
            return Some(FailureReason::CapabilitiesUnproven {
                capabilities: unproven,
            });
        }
        None
    }

    pub(super) fn on_previews(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
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
                self.fence_selected(now)
            }
            Err(rejections) => {
                self.finish_failed(FailureReason::NoExactPreview { rejections }, false)
            }
        }
    }

    pub(super) fn on_baseline(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
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
        if let Some(failed) = self.check_topology(&state) {
            return failed;
        }
        // The baseline is evidence too: download history from before the submission is
        // then recognisable as such.
        self.feed_poll(now, PollResult::State(Box::new(state)));
        if self.compute_node.is_some() {
            self.step = Step::ComputeBaseline;
            return vec![self.http_compute(HttpIntent::state())];
        }
        self.ask_previews()
    }

    /// The compute node's baseline: its own topology must list the wanted nodes too
    /// (membership is two-sided), and its retained download history predates the
    /// submission like the management API's.
    pub(super) fn on_compute_baseline(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
        let state = match answer.ok_body().map(serde_json::from_str::<State>) {
            Some(Ok(state)) => state,
            Some(Err(e)) => {
                let detail = format!("compute node: unreadable /state: {e}");
                return self.finish_failed(FailureReason::StateUnavailable { detail }, false);
            }
            None => {
                let detail = format!("compute node: {}", answer.failure_detail());
                return self.finish_failed(FailureReason::StateUnavailable { detail }, false);
            }
        };
        if let Some(failed) = self.check_topology(&state) {
            return failed;
        }
        self.feed_compute_poll(now, PollResult::State(Box::new(state)));
        self.ask_previews()
    }

    fn check_topology(&mut self, state: &State) -> Option<Vec<Effect>> {
        let request = self.request.as_ref()?;
        let missing: Vec<NodeId> = request
            .nodes
            .iter()
            .filter(|n| !state.topology.contains(n))
            .cloned()
            .collect();
        if missing.is_empty() {
            return None;
        }
        let known = state.topology.nodes.clone();
        Some(self.finish_failed(
            FailureReason::TargetNotInTopology {
                nodes: missing,
                known,
            },
            false,
        ))
    }

    fn ask_previews(&mut self) -> Vec<Effect> {
        let Some(request) = &self.request else {
            return Vec::new();
        };
        let intent = HttpIntent::previews(&request.model_id, &request.nodes, []);
        self.step = Step::Previews;
        vec![self.http(intent)]
    }

    /// The fence of the selected preview, persisted before anything is posted.
    fn fence_selected(&mut self, now: Millis) -> Vec<Effect> {
        let Some(request) = self.request.clone() else {
            return Vec::new();
        };
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
            compute_node: self.compute_node.clone(),
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

    pub(super) fn on_fence_persisted(&mut self, instance_id: InstanceId) -> Vec<Effect> {
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

    pub(super) fn on_submitted(&mut self, now: Millis, answer: Answer) -> Vec<Effect> {
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
}

/// A `/node_id` answer, or one line saying why there is none.
fn node_id_of(answer: &Answer) -> Result<NodeId, String> {
    match answer.ok_body() {
        Some(body) => serde_json::from_str::<NodeId>(body)
            .map_err(|e| format!("unreadable /node_id answer: {e}")),
        None => Err(answer.failure_detail()),
    }
}
