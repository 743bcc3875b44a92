//! Assessing one instance from the fresh views: presence, membership, runners,
//! downloads and failure records. Pure functions over the reducer's tracks.

use std::collections::{BTreeMap, BTreeSet};

use super::download::{ArtifactKey, Attribution, DownloadEvidence, DownloadState, DownloadTrack};
use super::endpoint::{Binding, EndpointTrack, Freshness};
use super::reason::Reason;
use super::report::{AssignmentReport, Membership, Presence, RunnerEvidence};
use super::{AttemptPolicy, EndpointLabel, EvidenceConfig};
use crate::ids::NodeId;
use crate::skulk::{
    Instance, InstanceCore, InstanceId, RunnerPhase, RunnerStatus, State, Task, TaskStatus,
};
use crate::time::Millis;

/// The reducer's tracks, read at one moment.
pub(crate) struct Context<'a> {
    pub config: &'a EvidenceConfig,
    pub endpoints: &'a BTreeMap<EndpointLabel, EndpointTrack>,
    pub downloads: &'a BTreeMap<(NodeId, ArtifactKey), DownloadTrack>,
    pub now: Millis,
}

/// The assessment of one instance, before the inference probe is considered.
pub(crate) struct Assessment {
    pub presence: Presence,
    pub core: Option<InstanceCore>,
    pub assignments: Vec<AssignmentReport>,
    pub failures: Vec<Reason>,
    /// Everything that keeps the instance from readiness, except the probe.
    pub reasons: Vec<Reason>,
}

impl<'a> Context<'a> {
    /// Fresh, identity-consistent views, by endpoint.
    pub fn fresh(&self) -> BTreeMap<&'a EndpointLabel, &'a State> {
        self.endpoints
            .iter()
            .filter_map(|(label, track)| {
                track
                    .usable_state(self.now, self.config.stale_after_ms)
                    .map(|s| (label, s))
            })
            .collect()
    }

    fn fresh_labels(&self) -> BTreeSet<EndpointLabel> {
        self.fresh().into_keys().cloned().collect()
    }

    /// Reasons that come from the endpoints themselves (identity, freshness).
    pub fn endpoint_reasons(&self) -> Vec<Reason> {
        let mut reasons = Vec::new();
        for (label, track) in self.endpoints {
            match track.binding() {
                Binding::Conflict { expected, observed } => {
                    reasons.push(Reason::IdentityConflict {
                        endpoint: label.clone(),
                        expected,
                        observed,
                    });
                    continue;
                }
                Binding::Unbound => reasons.push(Reason::EndpointUnbound {
                    endpoint: label.clone(),
                }),
                Binding::Bound(_) => {}
            }
            match track.freshness(self.now, self.config.stale_after_ms) {
                Freshness::Fresh { .. } => {}
                Freshness::NeverPolled => reasons.push(Reason::NoObservation {
                    endpoint: label.clone(),
                }),
                Freshness::Stale { age_ms } => reasons.push(Reason::EvidenceStale {
                    endpoint: label.clone(),
                    age_ms,
                }),
                Freshness::Failing { failure, .. } => reasons.push(Reason::PollFailing {
                    endpoint: label.clone(),
                    detail: failure.to_string(),
                }),
            }
        }
        reasons
    }

    /// The endpoint bound to `node`, if any.
    pub fn endpoint_of(&self, node: &NodeId) -> Option<&'a EndpointLabel> {
        self.endpoints
            .iter()
            .find(|(_, t)| t.bound.as_ref() == Some(node) && t.conflict.is_none())
            .map(|(l, _)| l)
    }

    /// Two-sided membership of `node` across the fresh views.
    pub fn membership(&self, node: &NodeId) -> Membership {
        let fresh = self.fresh();
        if fresh.is_empty() {
            return Membership::Unknown;
        }
        let mut seen_by = BTreeSet::new();
        let mut reasons = Vec::new();
        for (label, state) in &fresh {
            let own_node = self.endpoints.get(*label).and_then(|t| t.bound.as_ref());
            let mut sees = true;
            if !state.topology.contains(node) {
                reasons.push(Reason::NotInTopology {
                    node: node.clone(),
                    observer: (*label).clone(),
                });
                sees = false;
            }
            // Where the dialect has nodeResources, a live resource observation of every
            // OTHER node is required (an endpoint need not observe itself).
            if let Some(resources) = &state.node_resources
                && own_node != Some(node)
                && !resources.contains_key(node)
            {
                reasons.push(Reason::NoLiveResources {
                    node: node.clone(),
                    observer: (*label).clone(),
                });
                sees = false;
            }
            if sees {
                seen_by.insert((*label).clone());
            }
        }
        if reasons.is_empty() {
            Membership::Member { observers: seen_by }
        } else if seen_by.is_empty()
            && reasons
                .iter()
                .all(|r| matches!(r, Reason::NotInTopology { .. }))
        {
            Membership::NotMember { reasons }
        } else {
            Membership::OneSided { seen_by, reasons }
        }
    }

    /// The nodes every instance's readiness depends on besides its own: the nodes the
    /// endpoints are bound to ("both endpoints see both nodes").
    fn bound_nodes(&self) -> BTreeSet<NodeId> {
        self.endpoints
            .values()
            .filter(|t| t.conflict.is_none())
            .filter_map(|t| t.bound.clone())
            .collect()
    }

    pub fn assess(
        &self,
        id: &InstanceId,
        first_seen: Millis,
        last_present: Option<Millis>,
    ) -> Assessment {
        let fresh = self.fresh();
        let mut reasons = self.endpoint_reasons();

        // Presence and the instance definition.
        let present: BTreeMap<&EndpointLabel, &Instance> = fresh
            .iter()
            .filter_map(|(l, s)| s.instances.get(id).map(|i| (*l, i)))
            .collect();
        let absent: BTreeSet<EndpointLabel> = fresh
            .keys()
            .filter(|l| !present.contains_key(*l))
            .map(|l| (*l).clone())
            .collect();
        let present_labels: BTreeSet<EndpointLabel> =
            present.keys().map(|l| (*l).clone()).collect();
        let presence = if fresh.is_empty() {
            Presence::Unknown
        } else if present.is_empty() {
            match last_present {
                Some(last_seen) => Presence::Gone { last_seen },
                None => Presence::NotYetObserved,
            }
        } else if absent.is_empty() {
            Presence::Observed {
                endpoints: present_labels.clone(),
            }
        } else {
            Presence::Disputed {
                present_on: present_labels.clone(),
                absent_on: absent.clone(),
            }
        };
        match &presence {
            Presence::NotYetObserved => reasons.push(Reason::InstanceNotObserved {
                instance: id.clone(),
            }),
            Presence::Gone { last_seen } => reasons.push(Reason::InstanceGone {
                instance: id.clone(),
                last_seen: *last_seen,
            }),
            Presence::Disputed {
                present_on,
                absent_on,
            } => reasons.push(Reason::InstancePresenceDisagrees {
                instance: id.clone(),
                present_on: present_on.iter().cloned().collect(),
                absent_on: absent_on.iter().cloned().collect(),
            }),
            Presence::Observed { .. } | Presence::Unknown => {}
        }

        let cores: Vec<(&EndpointLabel, Option<InstanceCore>)> =
            present.iter().map(|(l, i)| (*l, i.core())).collect();
        let core = cores.iter().find_map(|(_, c)| c.clone());
        if let Some((_, instance)) = present.iter().next()
            && core.is_none()
        {
            reasons.push(Reason::InstanceUnreadable {
                instance: id.clone(),
                tag: instance.tag().to_owned(),
            });
        }
        if let Some(reference) = &core {
            let differs = cores.iter().any(|(_, c)| {
                c.as_ref().is_some_and(|c| {
                    c.shard_assignments.node_to_runner != reference.shard_assignments.node_to_runner
                        || c.shard_assignments.runner_to_shard
                            != reference.shard_assignments.runner_to_shard
                })
            });
            if differs {
                reasons.push(Reason::InstanceDefinitionDisagrees {
                    instance: id.clone(),
                });
            }
        }

        // Terminal failure records and failed lifecycle tasks.
        let failures = failure_reasons(id, &fresh);
        reasons.extend(failures.iter().cloned());

        // Per assigned node: membership, runner and download.
        let mut assignments = Vec::new();
        let mut checked_membership = BTreeSet::new();
        if let Some(core) = &core {
            let fresh_labels = self.fresh_labels();
            for (node, runner) in &core.shard_assignments.node_to_runner {
                let membership = self.membership(node);
                reasons.extend(membership.reasons().iter().cloned());
                checked_membership.insert(node.clone());
                let shard = core.shard_assignments.runner_to_shard.get(runner);
                if shard.is_none() {
                    reasons.push(Reason::RunnerBindingInvalid {
                        node: node.clone(),
                        runner: runner.clone(),
                    });
                }
                let runner_evidence = runner_evidence(runner, &fresh);
                let runner_ready = runner_evidence.phase == Some(RunnerPhase::Ready);
                reasons.extend(runner_reasons(node, &runner_evidence, &fresh));
                let download = shard
                    .and_then(|s| s.model_card())
                    .map(|card| self.download_evidence(node, &card, &fresh_labels));
                if let Some(evidence) = &download {
                    reasons.extend(download_reasons(
                        evidence,
                        self.config.attempt_policy,
                        first_seen,
                    ));
                    if runner_ready
                        && !evidence.state.is_complete()
                        && evidence.contradiction.is_none()
                    {
                        reasons.push(Reason::RunnerAheadOfDownload {
                            node: node.clone(),
                            runner: runner.clone(),
                        });
                    }
                }
                assignments.push(AssignmentReport {
                    node: node.clone(),
                    runner: runner_evidence,
                    download,
                    membership,
                    resolved_backend: shard
                        .and_then(|s| s.fields())
                        .and_then(|f| f.resolved_backend.clone()),
                });
            }
        }
        // Both endpoints must see both nodes: the endpoints' own nodes too.
        for node in self.bound_nodes() {
            if !checked_membership.contains(&node) {
                reasons.extend(self.membership(&node).reasons().iter().cloned());
            }
        }
        dedup(&mut reasons);
        Assessment {
            presence,
            core,
            assignments,
            failures,
            reasons,
        }
    }

    /// The download evidence of the artifact `card` on `node`.
    pub fn download_evidence(
        &self,
        node: &NodeId,
        card: &crate::skulk::ModelCard,
        fresh: &BTreeSet<EndpointLabel>,
    ) -> DownloadEvidence {
        let key = ArtifactKey::of(card);
        let found = self
            .downloads
            .get(&(node.clone(), key.clone()))
            .and_then(|t| t.evidence(node, &key, card, fresh));
        // Records for the same model id that are a different artifact (another signed
        // card, or a legacy card that is not equal).
        let other_artifacts = self
            .downloads
            .iter()
            .filter(|((n, k), _)| n == node && k.model_id == card.model_id)
            .filter(|((_, k), t)| *k != key || t.has_other_artifact(card, fresh))
            .count();
        let other_artifacts = u32::try_from(other_artifacts).unwrap_or(u32::MAX);
        match found {
            Some(mut evidence) => {
                evidence.other_artifacts = other_artifacts;
                evidence
            }
            None => DownloadEvidence {
                node: node.clone(),
                artifact: key,
                state: DownloadState::Missing,
                attribution: Attribution::None,
                since: None,
                contradiction: None,
                late_transients_ignored: 0,
                other_artifacts,
            },
        }
    }
}

fn failure_reasons(id: &InstanceId, fresh: &BTreeMap<&EndpointLabel, &State>) -> Vec<Reason> {
    let mut out = Vec::new();
    for state in fresh.values() {
        if let Some(failure) = state.instance_failures.as_ref().and_then(|f| f.get(id)) {
            out.push(Reason::InstanceFailed {
                instance: id.clone(),
                message: failure.message.clone(),
                code: failure.error_code.clone(),
            });
        }
        for (task_id, task) in &state.tasks {
            let lifecycle = matches!(
                task,
                Task::CreateRunner(_)
                    | Task::DownloadModel(_)
                    | Task::LoadModel(_)
                    | Task::ConnectToGroup(_)
                    | Task::StartWarmup(_)
            );
            let Some(common) = task.common() else {
                continue;
            };
            if lifecycle
                && common.instance_id.as_ref() == Some(id)
                && common.task_status == TaskStatus::Failed
            {
                out.push(Reason::TaskFailed {
                    task: task_id.clone(),
                    kind: task.tag().to_owned(),
                    message: task.error_message().map(str::to_owned),
                });
            }
        }
    }
    dedup(&mut out);
    out
}

fn runner_evidence(
    runner: &crate::skulk::RunnerId,
    fresh: &BTreeMap<&EndpointLabel, &State>,
) -> RunnerEvidence {
    let observed: BTreeMap<EndpointLabel, RunnerStatus> = fresh
        .iter()
        .filter_map(|(l, s)| s.runners.get(runner).map(|r| ((*l).clone(), r.clone())))
        .collect();
    let phases: BTreeSet<RunnerPhase> = observed.values().map(RunnerStatus::phase).collect();
    let failure = observed
        .values()
        .find_map(|r| r.failure_message().map(str::to_owned));
    let phase = if phases.contains(&RunnerPhase::Failed) && phases.contains(&RunnerPhase::Ready) {
        None
    } else if phases.contains(&RunnerPhase::Failed) {
        Some(RunnerPhase::Failed)
    } else if phases.len() == 1 {
        phases.iter().next().copied()
    } else if phases.contains(&RunnerPhase::Unknown) {
        Some(RunnerPhase::Unknown)
    } else if phases.contains(&RunnerPhase::Stopped) {
        Some(RunnerPhase::Stopped)
    } else if phases.is_empty() {
        None
    } else {
        // Starting on one view, ready on another: a lagging view, not yet ready.
        Some(RunnerPhase::Starting)
    };
    RunnerEvidence {
        runner: runner.clone(),
        observed,
        phase,
        failure,
    }
}

fn runner_reasons(
    node: &NodeId,
    evidence: &RunnerEvidence,
    fresh: &BTreeMap<&EndpointLabel, &State>,
) -> Vec<Reason> {
    let runner = evidence.runner.clone();
    let node = node.clone();
    if evidence.observed.is_empty() {
        return if fresh.is_empty() {
            Vec::new()
        } else {
            vec![Reason::RunnerMissing { node, runner }]
        };
    }
    let describe = || {
        evidence
            .observed
            .iter()
            .map(|(l, s)| format!("{} on {l}", s.describe()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let reason = match evidence.phase {
        Some(RunnerPhase::Ready) => return Vec::new(),
        None => Reason::RunnerContradiction {
            node,
            runner,
            detail: describe(),
        },
        Some(RunnerPhase::Failed) => Reason::RunnerFailed {
            node,
            runner,
            message: evidence.failure.clone().unwrap_or_default(),
        },
        Some(RunnerPhase::Starting) => Reason::RunnerStarting {
            node,
            runner,
            status: describe(),
        },
        Some(RunnerPhase::Stopped) => Reason::RunnerStopped {
            node,
            runner,
            status: describe(),
        },
        Some(RunnerPhase::Unknown) => {
            let tag = evidence
                .observed
                .values()
                .find(|s| s.is_unknown())
                .map(|s| s.tag().to_owned());
            Reason::RunnerUnknownStatus {
                node,
                runner,
                tag: tag.unwrap_or_default(),
            }
        }
    };
    vec![reason]
}

fn download_reasons(
    evidence: &DownloadEvidence,
    policy: AttemptPolicy,
    first_seen: Millis,
) -> Vec<Reason> {
    let node = evidence.node.clone();
    let model = evidence.artifact.model_id.clone();
    let mut out = Vec::new();
    if let Some(detail) = &evidence.contradiction {
        out.push(Reason::DownloadContradiction {
            node: node.clone(),
            detail: detail.clone(),
        });
    }
    match &evidence.state {
        DownloadState::Missing => {
            out.push(Reason::DownloadMissing {
                node: node.clone(),
                model: model.clone(),
            });
            if evidence.other_artifacts > 0 {
                out.push(Reason::ArtifactMismatch { node, model });
            }
        }
        DownloadState::Pending { downloaded, total }
        | DownloadState::Ongoing { downloaded, total } => {
            let phase = if matches!(evidence.state, DownloadState::Pending { .. }) {
                "pending"
            } else {
                "ongoing"
            };
            out.push(Reason::DownloadInProgress {
                node,
                phase: phase.to_owned(),
                downloaded: Some(*downloaded),
                total: Some(*total),
            });
        }
        DownloadState::Completed { .. } => {
            let attributed = match &evidence.attribution {
                Attribution::Attempt(_) => true,
                Attribution::Unattributed {
                    dialect_has_attempts,
                } => policy == AttemptPolicy::LegacyDialectOnly && !dialect_has_attempts,
                Attribution::None => false,
            };
            if !attributed {
                out.push(Reason::DownloadUnattributed { node, model });
            }
        }
        DownloadState::Failed { message } => {
            let attempt = match &evidence.attribution {
                Attribution::Attempt(a) => Some(a.clone()),
                _ => None,
            };
            // A failure first observed before the instance existed is retained history
            // (Skulk keeps DownloadFailed after its instance is torn down).
            let current = evidence.since.is_none_or(|since| since >= first_seen);
            out.push(Reason::DownloadFailed {
                node,
                attempt,
                message: message.clone(),
                current,
            });
        }
        DownloadState::Unknown { tag } => out.push(Reason::DownloadUnknownStatus {
            node,
            tag: tag.clone(),
        }),
    }
    out
}

/// Removes repeated reasons, keeping the first occurrence.
pub(crate) fn dedup(reasons: &mut Vec<Reason>) {
    let mut kept: Vec<Reason> = Vec::with_capacity(reasons.len());
    for r in reasons.drain(..) {
        if !kept.contains(&r) {
            kept.push(r);
        }
    }
    *reasons = kept;
}
