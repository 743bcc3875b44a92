//! Download evidence per (node, artifact), with attempt attribution.
//!
//! Rules (integration guide, "Distinguish download, runner, and inference readiness"):
//! - a late transient sample (Pending/Ongoing) never overwrites a terminal outcome
//!   (Completed/Failed) of the SAME attempt;
//! - records without attempt ids are incomplete evidence;
//! - signed cards match by `registryCardId`; legacy/custom cards by full card equality;
//! - layer, rank and world-size differences in the shard metadata never reject an
//!   otherwise matching artifact (a new runner may reuse an earlier installation).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::EndpointLabel;
use crate::ids::NodeId;
use crate::skulk::{
    AttemptId, DownloadPhase, DownloadProgress, Memory, ModelCard, ModelId, RegistryCardId,
};
use crate::time::Millis;

/// The identity of a downloadable artifact: the model id plus, for signed cards, the
/// registry card id. Legacy cards (no registry id) are further told apart by full card
/// equality when matched.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ArtifactKey {
    pub model_id: ModelId,
    pub registry_card_id: Option<RegistryCardId>,
}

impl ArtifactKey {
    pub fn of(card: &ModelCard) -> ArtifactKey {
        ArtifactKey {
            model_id: card.model_id.clone(),
            registry_card_id: card.registry_card_id.clone(),
        }
    }
}

/// What the evidence says about one download.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DownloadState {
    Missing,
    Pending { downloaded: Memory, total: Memory },
    Ongoing { downloaded: Memory, total: Memory },
    Completed { total: Memory },
    Failed { message: String },
    Unknown { tag: String },
}

impl DownloadState {
    pub fn is_complete(&self) -> bool {
        matches!(self, DownloadState::Completed { .. })
    }

    /// The phase without its data: `missing`, `pending`, `ongoing`, `completed`,
    /// `failed`, `unknown`.
    pub fn category(&self) -> &'static str {
        match self {
            DownloadState::Missing => "missing",
            DownloadState::Pending { .. } => "pending",
            DownloadState::Ongoing { .. } => "ongoing",
            DownloadState::Completed { .. } => "completed",
            DownloadState::Failed { .. } => "failed",
            DownloadState::Unknown { .. } => "unknown",
        }
    }
}

/// How the evidence is tied to a download attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Attribution {
    /// The record carries an attempt id.
    Attempt(AttemptId),
    /// A legacy record without an attempt id: incomplete evidence. `dialect_has_attempts`
    /// says whether the same `/state` carried attempt ids elsewhere (then the server
    /// could have attributed it and did not).
    Unattributed { dialect_has_attempts: bool },
    /// No record.
    None,
}

/// The download evidence for one node and artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DownloadEvidence {
    pub node: NodeId,
    pub artifact: ArtifactKey,
    pub state: DownloadState,
    pub attribution: Attribution,
    /// When the current state was first observed.
    pub since: Option<Millis>,
    /// Set when samples disagree (two terminal outcomes of one attempt, or endpoints
    /// reporting different phases of a legacy record).
    pub contradiction: Option<String>,
    /// Late transient samples of a terminal attempt that were ignored.
    pub late_transients_ignored: u32,
    /// Records for the same model on the node whose card is a different artifact.
    pub other_artifacts: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Sample {
    pub phase: DownloadPhase,
    pub state: DownloadState,
    pub card: ModelCard,
    pub since: Millis,
    pub last_seen: Millis,
}

impl Sample {
    pub fn from_record(record: &DownloadProgress, card: ModelCard, now: Millis) -> Sample {
        let state = match record {
            DownloadProgress::Pending(d) => DownloadState::Pending {
                downloaded: d.downloaded,
                total: d.total,
            },
            DownloadProgress::Ongoing(d) => DownloadState::Ongoing {
                downloaded: d.download_progress.downloaded,
                total: d.download_progress.total,
            },
            DownloadProgress::Completed(d) => DownloadState::Completed { total: d.total },
            DownloadProgress::Failed(d) => DownloadState::Failed {
                message: d.error_message.clone(),
            },
            DownloadProgress::Unknown { tag, .. } => DownloadState::Unknown { tag: tag.clone() },
        };
        Sample {
            phase: record.phase(),
            state,
            card,
            since: now,
            last_seen: now,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct AttemptRecord {
    sample: Sample,
    /// A second, different terminal outcome for the same attempt.
    conflicting_terminal: Option<Sample>,
    late_transients: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct LegacySample {
    sample: Sample,
    dialect_has_attempts: bool,
}

/// Everything observed about one (node, artifact key).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct DownloadTrack {
    attempts: BTreeMap<AttemptId, AttemptRecord>,
    /// Attempt ids in order of first observation; the last is the current attempt.
    order: Vec<AttemptId>,
    /// The latest sample without attempt id, per endpoint.
    legacy: BTreeMap<EndpointLabel, LegacySample>,
    /// The attempt each endpoint's latest `/state` names for this artifact (its last
    /// record). Fresh endpoints naming different attempts disagree: a contradiction,
    /// never "the last one seen wins".
    #[serde(default)]
    current: BTreeMap<EndpointLabel, AttemptId>,
}

impl DownloadTrack {
    pub fn observe_attempt(
        &mut self,
        endpoint: &EndpointLabel,
        attempt: AttemptId,
        sample: Sample,
    ) {
        self.current.insert(endpoint.clone(), attempt.clone());
        let Some(record) = self.attempts.get_mut(&attempt) else {
            self.order.push(attempt.clone());
            self.attempts.insert(
                attempt,
                AttemptRecord {
                    sample,
                    conflicting_terminal: None,
                    late_transients: 0,
                },
            );
            return;
        };
        let old = &mut record.sample;
        if old.phase.is_terminal() && !sample.phase.is_terminal() {
            // A late transient sample of a finished attempt: it never overwrites it.
            record.late_transients = record.late_transients.saturating_add(1);
            return;
        }
        if old.phase.is_terminal() && sample.phase.is_terminal() && old.phase != sample.phase {
            record.conflicting_terminal = Some(sample);
            return;
        }
        if old.phase == sample.phase {
            old.state = sample.state;
            old.last_seen = sample.last_seen;
        } else {
            *old = sample;
        }
    }

    pub fn observe_legacy(
        &mut self,
        endpoint: &EndpointLabel,
        mut sample: Sample,
        dialect_has_attempts: bool,
    ) {
        if let Some(previous) = self.legacy.get(endpoint)
            && previous.sample.phase == sample.phase
            && previous.sample.card == sample.card
        {
            sample.since = previous.sample.since;
        }
        self.legacy.insert(
            endpoint.clone(),
            LegacySample {
                sample,
                dialect_has_attempts,
            },
        );
    }

    /// The endpoint's latest state no longer lists a legacy record: its sample is gone.
    pub fn forget_legacy(&mut self, endpoint: &EndpointLabel) {
        self.legacy.remove(endpoint);
    }

    /// The endpoint's latest state names no attempt of this artifact any more.
    pub fn forget_current(&mut self, endpoint: &EndpointLabel) {
        self.current.remove(endpoint);
    }

    /// Fresh endpoints that name different current attempts, as one line.
    fn attempt_disagreement(&self, fresh: &BTreeSet<EndpointLabel>) -> Option<String> {
        let named: Vec<(&EndpointLabel, &AttemptId)> = self
            .current
            .iter()
            .filter(|(e, _)| fresh.contains(*e))
            .collect();
        let distinct: BTreeSet<&AttemptId> = named.iter().map(|(_, a)| *a).collect();
        (distinct.len() > 1).then(|| {
            let list = named
                .iter()
                .map(|(e, a)| format!("{e} names attempt {a}"))
                .collect::<Vec<_>>()
                .join(", ");
            format!("endpoints disagree on the current attempt: {list}")
        })
    }

    pub fn is_empty(&self) -> bool {
        self.attempts.is_empty() && self.legacy.is_empty() && self.current.is_empty()
    }

    /// The evidence for an instance whose shard card is `wanted`, using legacy samples
    /// only from `fresh` endpoints. `None` when nothing in this track matches the card.
    pub fn evidence(
        &self,
        node: &NodeId,
        key: &ArtifactKey,
        wanted: &ModelCard,
        fresh: &BTreeSet<EndpointLabel>,
    ) -> Option<DownloadEvidence> {
        let matches = |card: &ModelCard| card_matches(wanted, card);
        // Attempt-attributed records first: the current (latest) matching attempt.
        if let Some(record) = self
            .order
            .iter()
            .rev()
            .filter_map(|a| self.attempts.get(a).map(|r| (a, r)))
            .find(|(_, r)| matches(&r.sample.card))
        {
            let (attempt, record) = record;
            let contradiction = record
                .conflicting_terminal
                .as_ref()
                .map(|other| {
                    format!(
                        "attempt {} reported {} and {}",
                        attempt,
                        record.sample.state.category(),
                        other.state.category()
                    )
                })
                .or_else(|| self.attempt_disagreement(fresh));
            return Some(DownloadEvidence {
                node: node.clone(),
                artifact: key.clone(),
                state: record.sample.state.clone(),
                attribution: Attribution::Attempt(attempt.clone()),
                since: Some(record.sample.since),
                contradiction,
                late_transients_ignored: record.late_transients,
                other_artifacts: 0,
            });
        }
        let samples: Vec<(&EndpointLabel, &LegacySample)> = self
            .legacy
            .iter()
            .filter(|(endpoint, s)| fresh.contains(*endpoint) && matches(&s.sample.card))
            .collect();
        let (_, first) = samples.first()?;
        let categories: BTreeSet<&str> = samples
            .iter()
            .map(|(_, s)| s.sample.state.category())
            .collect();
        let contradiction = (categories.len() > 1).then(|| {
            samples
                .iter()
                .map(|(e, s)| format!("{} on {e}", s.sample.state.category()))
                .collect::<Vec<_>>()
                .join(", ")
        });
        Some(DownloadEvidence {
            node: node.clone(),
            artifact: key.clone(),
            state: first.sample.state.clone(),
            attribution: Attribution::Unattributed {
                dialect_has_attempts: samples.iter().any(|(_, s)| s.dialect_has_attempts),
            },
            since: samples.iter().map(|(_, s)| s.sample.since).max(),
            contradiction,
            late_transients_ignored: 0,
            other_artifacts: 0,
        })
    }

    /// A card-independent summary of the track (for per-node reports).
    pub fn summary(
        &self,
        node: &NodeId,
        key: &ArtifactKey,
        fresh: &BTreeSet<EndpointLabel>,
    ) -> Option<DownloadEvidence> {
        let card = self
            .order
            .last()
            .and_then(|a| self.attempts.get(a))
            .map(|r| &r.sample.card)
            .or_else(|| {
                self.legacy
                    .iter()
                    .find(|(e, _)| fresh.contains(*e))
                    .map(|(_, s)| &s.sample.card)
            })?;
        self.evidence(node, key, card, fresh)
    }

    /// Whether any sample (attempt or fresh legacy) is for a card that does not match.
    pub fn has_other_artifact(&self, wanted: &ModelCard, fresh: &BTreeSet<EndpointLabel>) -> bool {
        self.attempts
            .values()
            .any(|r| !card_matches(wanted, &r.sample.card))
            || self
                .legacy
                .iter()
                .any(|(e, s)| fresh.contains(e) && !card_matches(wanted, &s.sample.card))
    }
}

/// Signed cards match by registry card id; legacy/custom cards by full card equality.
/// Shard metadata (layers, rank, world size) is not part of the card and never compared.
pub fn card_matches(wanted: &ModelCard, observed: &ModelCard) -> bool {
    match (&wanted.registry_card_id, &observed.registry_card_id) {
        (Some(a), Some(b)) => a == b,
        (None, None) => wanted == observed,
        // A signed card is never proven by an unsigned record, nor the reverse.
        _ => false,
    }
}
