//! The evidence reducer: from timestamped observations of management endpoints to
//! per-node and per-instance evidence and a readiness verdict with typed reasons.
//!
//! It follows the integration guide: keep separate records for identity, membership,
//! downloads, runners and inference, because each proves a different part of the
//! workflow.
//! - Identity: an endpoint is bound to the node id its `GET /node_id` answers; a
//!   different answer later is a conflict (sticky until the endpoint is registered
//!   again).
//! - Membership is two-sided: every fresh endpoint lists the node in `topology.nodes`
//!   and, where its dialect has `nodeResources`, holds a live observation of it.
//! - Observation time is the runtime's (`now`), never Skulk's `lastSeen`. A failed or
//!   timed-out poll expires what that endpoint said at once; so does age beyond
//!   `stale_after_ms`.
//! - Downloads: see [`download`] (attempt attribution, late transients, card matching).
//! - Runners are bound through `shardAssignments.nodeToRunner`/`runnerToShard`.
//! - Ready only when download, runners and a successful inference probe agree for the
//!   same instance; the probe must have succeeded after they began to agree.
//!   Contradictions give `Uncertain`, never `Ready`. Losing readiness is reported at
//!   once and gets a bounded recovery interval; initial readiness has a deadline.
//!
//! Sans-IO: [`EvidenceReducer::handle`] takes `(now, input)` and returns notices;
//! [`EvidenceReducer::report`] reads the picture at any time.

mod assess;
pub mod download;
mod endpoint;
mod input;
pub mod reason;
pub mod report;
pub mod verdict;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{NodeId, string_id};
use crate::skulk::{InstanceId, State};
use crate::time::Millis;

pub use download::{ArtifactKey, Attribution, DownloadEvidence, DownloadState};
pub use endpoint::{Binding, Freshness};
pub use input::{
    AttemptPolicy, EvidenceConfig, Expectation, Input, Notice, PollFailure, PollFailureKind,
    PollObservation, PollResult, ProbeOutcome,
};
pub use reason::Reason;
pub use report::{
    AssignmentReport, EndpointReport, EvidenceReport, InstanceReport, Membership, NodeReport,
    Presence, ProbeRecord, RunnerEvidence,
};
pub use verdict::{Verdict, VerdictKind};

use assess::{Context, dedup};
use download::{DownloadTrack, Sample};
use endpoint::{Bind, EndpointTrack};
use verdict::{Phase, Transition, advance};

string_id!(
    /// The operator's name for a management endpoint, e.g. `management` or `gpu-7`.
    EndpointLabel
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct InstanceTrack {
    first_seen: Millis,
    /// The model of the latest definition seen (kept after the instance is removed).
    #[serde(default)]
    model_id: Option<crate::skulk::ModelId>,
    hard_expiry: Option<Millis>,
    last_present: Option<Millis>,
    /// Since when download, runners and membership agree (the probe aside).
    agreement_since: Option<Millis>,
    probe: Option<ProbeRecord>,
    phase: Phase,
    verdict: Verdict,
}

impl InstanceTrack {
    fn new(now: Millis, deadline: Millis, hard_expiry: Option<Millis>) -> InstanceTrack {
        let deadline = hard_expiry.map_or(deadline, |h| deadline.min(h));
        InstanceTrack {
            first_seen: now,
            model_id: None,
            hard_expiry,
            last_present: None,
            agreement_since: None,
            probe: None,
            phase: Phase::Initial {
                deadline,
                deadline_reported: false,
            },
            verdict: Verdict::NotReady {
                reasons: Vec::new(),
                deadline,
            },
        }
    }
}

/// The reducer. Deterministic: ordered maps only. Serialisable so that a console
/// recording can checkpoint it (a restored reducer behaves exactly like the original).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceReducer {
    config: EvidenceConfig,
    endpoints: BTreeMap<EndpointLabel, EndpointTrack>,
    #[serde(with = "pairs")]
    downloads: BTreeMap<(NodeId, ArtifactKey), DownloadTrack>,
    instances: BTreeMap<InstanceId, InstanceTrack>,
}

impl EvidenceReducer {
    pub fn new(config: EvidenceConfig) -> EvidenceReducer {
        EvidenceReducer {
            config,
            endpoints: BTreeMap::new(),
            downloads: BTreeMap::new(),
            instances: BTreeMap::new(),
        }
    }

    pub fn config(&self) -> &EvidenceConfig {
        &self.config
    }

    #[must_use = "the effects are what the state machine decided: carry them out"]
    pub fn handle(&mut self, now: Millis, input: Input) -> Vec<Notice> {
        let mut notices = Vec::new();
        match input {
            Input::Endpoint {
                endpoint,
                expected_node,
            } => {
                self.endpoints
                    .insert(endpoint, EndpointTrack::new(expected_node));
            }
            Input::Poll(observation) => self.poll(now, observation, &mut notices),
            Input::Probe { instance, outcome } => {
                if let Some(track) = self.instances.get_mut(&instance) {
                    track.probe = Some(ProbeRecord { at: now, outcome });
                }
            }
            Input::Expect(expectation) => {
                let deadline = expectation
                    .deadline
                    .unwrap_or_else(|| now.saturating_add(self.config.initial_deadline_ms));
                let track = self
                    .instances
                    .entry(expectation.instance)
                    .or_insert_with(|| InstanceTrack::new(now, deadline, expectation.hard_expiry));
                track.hard_expiry = expectation.hard_expiry.or(track.hard_expiry);
                if let Phase::Initial { deadline: d, .. } = &mut track.phase {
                    *d = track.hard_expiry.map_or(deadline, |h| deadline.min(h));
                }
            }
            Input::Forget { instance } => {
                self.instances.remove(&instance);
            }
            Input::Tick => {}
        }
        self.reevaluate(now, &mut notices);
        notices
    }

    fn poll(&mut self, now: Millis, observation: PollObservation, notices: &mut Vec<Notice>) {
        let PollObservation {
            endpoint,
            node_id,
            result,
        } = observation;
        let track = self.endpoints.entry(endpoint.clone()).or_default();
        if let Some(node) = node_id {
            match track.bind(node, self.config.follow_restarts) {
                Some(Bind::Conflict { expected, observed }) => {
                    notices.push(Notice::IdentityConflict {
                        endpoint: endpoint.clone(),
                        expected,
                        observed,
                    })
                }
                Some(Bind::Restarted { previous, node }) => notices.push(Notice::NodeRestarted {
                    endpoint: endpoint.clone(),
                    previous,
                    node,
                }),
                None => {}
            }
        }
        let state = match result {
            PollResult::Failed(failure) => {
                let since = track.failing.as_ref().map_or(now, |(since, _)| *since);
                track.failing = Some((since, failure));
                return;
            }
            PollResult::State(state) => state,
        };
        track.failing = None;
        track.last_ok = Some(now);
        self.ingest_downloads(now, &endpoint, &state);
        for id in state.instances.keys() {
            if self.config.track_all_instances && !self.instances.contains_key(id) {
                let deadline = now.saturating_add(self.config.initial_deadline_ms);
                self.instances
                    .insert(id.clone(), InstanceTrack::new(now, deadline, None));
            }
        }
        if let Some(track) = self.endpoints.get_mut(&endpoint) {
            track.state = Some(state);
        }
    }

    fn ingest_downloads(&mut self, now: Millis, endpoint: &EndpointLabel, state: &State) {
        let dialect_has_attempts = state.dialect().attempt_ids;
        let mut legacy_seen: BTreeSet<(NodeId, ArtifactKey)> = BTreeSet::new();
        let mut attempt_seen: BTreeSet<(NodeId, ArtifactKey)> = BTreeSet::new();
        for (node, records) in &state.downloads {
            for record in records {
                // A record whose artifact cannot be read cannot be attributed to anything.
                let Some(card) = record.model_card() else {
                    continue;
                };
                let key = (node.clone(), ArtifactKey::of(&card));
                let sample = Sample::from_record(record, card, now);
                let track = self.downloads.entry(key.clone()).or_default();
                match record.attempt_id_owned() {
                    Some(attempt) => {
                        track.observe_attempt(endpoint, attempt, sample);
                        attempt_seen.insert(key);
                    }
                    None => {
                        track.observe_legacy(endpoint, sample, dialect_has_attempts);
                        legacy_seen.insert(key);
                    }
                }
            }
        }
        for (key, track) in self.downloads.iter_mut() {
            if !legacy_seen.contains(key) {
                track.forget_legacy(endpoint);
            }
            if !attempt_seen.contains(key) {
                track.forget_current(endpoint);
            }
        }
        self.downloads.retain(|_, t| !t.is_empty());
    }

    fn context(&self, now: Millis) -> Context<'_> {
        Context {
            config: &self.config,
            endpoints: &self.endpoints,
            downloads: &self.downloads,
            now,
        }
    }

    fn reevaluate(&mut self, now: Millis, notices: &mut Vec<Notice>) {
        let ids: Vec<InstanceId> = self.instances.keys().cloned().collect();
        for id in ids {
            let Some(track) = self.instances.get(&id) else {
                continue;
            };
            let assessment = self
                .context(now)
                .assess(&id, track.first_seen, track.last_present);
            let present = matches!(
                assessment.presence,
                Presence::Observed { .. } | Presence::Disputed { .. }
            );
            if let (Presence::Gone { last_seen }, Some(after)) =
                (&assessment.presence, self.config.forget_gone_after_ms)
                && now.since(*last_seen) >= after
            {
                self.instances.remove(&id);
                continue;
            }
            let model_id = assessment
                .core
                .as_ref()
                .map(|c| c.shard_assignments.model_id.clone());
            let agreed = assessment.reasons.is_empty();
            let Some(track) = self.instances.get_mut(&id) else {
                continue;
            };
            if present {
                track.last_present = Some(now);
            }
            if model_id.is_some() {
                track.model_id = model_id;
            }
            track.agreement_since = if agreed {
                Some(track.agreement_since.unwrap_or(now))
            } else {
                None
            };
            let mut reasons = assessment.reasons;
            if let Some(since) = track.agreement_since {
                reasons.extend(probe_reasons(&id, since, track.probe.as_ref()));
            }
            dedup(&mut reasons);
            let (verdict, transition) = advance(
                &mut track.phase,
                now,
                reasons,
                self.config.recovery_deadline_ms,
                track.hard_expiry,
            );
            match transition {
                Transition::None | Transition::BecameReady => {}
                Transition::Lost { recover_by } => notices.push(Notice::ReadinessLost {
                    instance: id.clone(),
                    reasons: verdict.reasons().to_vec(),
                    recover_by,
                }),
                Transition::Recovered => notices.push(Notice::ReadinessRecovered {
                    instance: id.clone(),
                }),
                Transition::InitialDeadlinePassed { deadline } => {
                    notices.push(Notice::InitialDeadlineExceeded {
                        instance: id.clone(),
                        deadline,
                    })
                }
                Transition::RecoveryDeadlinePassed { deadline } => {
                    notices.push(Notice::RecoveryDeadlineExceeded {
                        instance: id.clone(),
                        deadline,
                    })
                }
            }
            if verdict != track.verdict {
                track.verdict = verdict.clone();
                notices.push(Notice::VerdictChanged {
                    instance: id.clone(),
                    verdict,
                });
            }
        }
    }

    /// The verdict as of the last input.
    pub fn verdict(&self, instance: &InstanceId) -> Option<&Verdict> {
        self.instances.get(instance).map(|t| &t.verdict)
    }

    /// The latest state an endpoint returned (fresh or not).
    pub fn latest_state(&self, endpoint: &EndpointLabel) -> Option<&State> {
        self.endpoints
            .get(endpoint)
            .and_then(|t| t.state.as_deref())
    }

    /// The report of one tracked instance.
    pub fn instance(&self, id: &InstanceId, now: Millis) -> Option<InstanceReport> {
        let track = self.instances.get(id)?;
        let assessment = self
            .context(now)
            .assess(id, track.first_seen, track.last_present);
        let awaiting_probe = assessment.reasons.is_empty() && !track.verdict.is_ready();
        Some(InstanceReport {
            instance_id: id.clone(),
            // A removed instance keeps the model it was seen with.
            model_id: assessment
                .core
                .as_ref()
                .map(|c| c.shard_assignments.model_id.clone())
                .or_else(|| track.model_id.clone()),
            first_seen: track.first_seen,
            presence: assessment.presence,
            context_token_limit: assessment.core.as_ref().and_then(|c| c.context_token_limit),
            assignments: assessment.assignments,
            probe: track.probe.clone(),
            failures: assessment.failures,
            awaiting_probe,
            verdict: track.verdict.clone(),
        })
    }

    /// The whole picture.
    pub fn report(&self, now: Millis) -> EvidenceReport {
        let ctx = self.context(now);
        let endpoints = self
            .endpoints
            .iter()
            .map(|(label, track)| {
                let report = EndpointReport {
                    binding: track.binding(),
                    freshness: track.freshness(now, self.config.stale_after_ms),
                    last_ok: track.last_ok,
                    dialect: track.state.as_ref().map(|s| s.dialect()),
                };
                (label.clone(), report)
            })
            .collect();
        let mut node_ids: BTreeSet<NodeId> = self
            .endpoints
            .values()
            .filter_map(|t| t.bound.clone())
            .collect();
        for state in ctx.fresh().values() {
            node_ids.extend(state.topology.nodes.iter().cloned());
        }
        node_ids.extend(self.downloads.keys().map(|(n, _)| n.clone()));
        let fresh_labels: BTreeSet<EndpointLabel> = ctx.fresh().into_keys().cloned().collect();
        let nodes = node_ids
            .into_iter()
            .map(|node| {
                let downloads = self
                    .downloads
                    .iter()
                    .filter(|((n, _), _)| *n == node)
                    .filter_map(|((n, key), track)| track.summary(n, key, &fresh_labels))
                    .collect();
                let report = NodeReport {
                    endpoint: ctx.endpoint_of(&node).cloned(),
                    membership: ctx.membership(&node),
                    downloads,
                };
                (node, report)
            })
            .collect();
        let instances = self
            .instances
            .keys()
            .filter_map(|id| self.instance(id, now).map(|r| (id.clone(), r)))
            .collect();
        EvidenceReport {
            at: now,
            endpoints,
            nodes,
            instances,
        }
    }
}

/// What the inference probe adds once download, runners and membership agree.
fn probe_reasons(
    instance: &InstanceId,
    agreement_since: Millis,
    probe: Option<&ProbeRecord>,
) -> Vec<Reason> {
    match probe {
        // A probe from before the current agreement proves nothing about it.
        Some(record) if record.at >= agreement_since => match &record.outcome {
            ProbeOutcome::Succeeded {
                served_by: Some(other),
            } if other != instance => {
                vec![Reason::ProbeServedByOther {
                    other: other.clone(),
                }]
            }
            ProbeOutcome::Succeeded { .. } => Vec::new(),
            ProbeOutcome::Failed { detail } => vec![Reason::ProbeFailed {
                detail: detail.clone(),
            }],
        },
        _ => vec![Reason::ProbeMissing],
    }
}

/// A map with tuple keys as a JSON list of `[key, value]` pairs (JSON object keys must
/// be strings).
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K, V, S>(map: &BTreeMap<K, V>, serializer: S) -> Result<S::Ok, S::Error>
    where
        K: Serialize,
        V: Serialize,
        S: Serializer,
    {
        serializer.collect_seq(map.iter())
    }

    pub fn deserialize<'de, K, V, D>(deserializer: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        let pairs: Vec<(K, V)> = Vec::deserialize(deserializer)?;
        Ok(pairs.into_iter().collect())
    }
}
