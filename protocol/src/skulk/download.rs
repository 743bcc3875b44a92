//! Download records, grouped by node in `/state.downloads` (tagged unions).
//!
//! 1.3.0 keeps at most one record per (node, model id) and has no attempt ids. The newer
//! dialect adds `attemptId` (shared by the transient and terminal records of one attempt)
//! and `registryCardId` on the card. A record without an attempt id is incomplete
//! evidence, not an error.

use crate::skulk::extra::Extra;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::{AttemptId, Memory};
use super::model::{ModelCard, ShardMetadata};
use super::tagged::tagged_union;
use crate::ids::NodeId;

tagged_union! {
    /// One download record.
    pub enum DownloadProgress {
        Pending(DownloadPending) = "DownloadPending",
        Ongoing(DownloadOngoing) = "DownloadOngoing",
        Completed(DownloadCompleted) = "DownloadCompleted",
        Failed(DownloadFailed) = "DownloadFailed",
    }
}

/// Coarse classification of a download record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DownloadPhase {
    Pending,
    Ongoing,
    Completed,
    Failed,
    Unknown,
}

impl DownloadPhase {
    /// Completed and Failed are terminal for their attempt; a later transient sample of
    /// the same attempt never overwrites them.
    pub fn is_terminal(self) -> bool {
        matches!(self, DownloadPhase::Completed | DownloadPhase::Failed)
    }
}

impl DownloadProgress {
    pub fn phase(&self) -> DownloadPhase {
        match self {
            DownloadProgress::Pending(_) => DownloadPhase::Pending,
            DownloadProgress::Ongoing(_) => DownloadPhase::Ongoing,
            DownloadProgress::Completed(_) => DownloadPhase::Completed,
            DownloadProgress::Failed(_) => DownloadPhase::Failed,
            DownloadProgress::Unknown { .. } => DownloadPhase::Unknown,
        }
    }

    pub fn node_id(&self) -> Option<&NodeId> {
        match self {
            DownloadProgress::Pending(d) => Some(&d.node_id),
            DownloadProgress::Ongoing(d) => Some(&d.node_id),
            DownloadProgress::Completed(d) => Some(&d.node_id),
            DownloadProgress::Failed(d) => Some(&d.node_id),
            DownloadProgress::Unknown { .. } => None,
        }
    }

    pub fn shard_metadata(&self) -> Option<&ShardMetadata> {
        match self {
            DownloadProgress::Pending(d) => Some(&d.shard_metadata),
            DownloadProgress::Ongoing(d) => Some(&d.shard_metadata),
            DownloadProgress::Completed(d) => Some(&d.shard_metadata),
            DownloadProgress::Failed(d) => Some(&d.shard_metadata),
            DownloadProgress::Unknown { .. } => None,
        }
    }

    /// The card of the downloaded artifact (also for an unknown record kind that carries
    /// a parseable `shardMetadata`).
    pub fn model_card(&self) -> Option<ModelCard> {
        match self {
            DownloadProgress::Unknown { value, .. } => value
                .get("shardMetadata")
                .or_else(|| value.get("shard_metadata"))
                .and_then(|s| serde_json::from_value::<ShardMetadata>(s.clone()).ok())
                .and_then(|s| s.model_card()),
            known => known.shard_metadata().and_then(ShardMetadata::model_card),
        }
    }

    pub fn attempt_id(&self) -> Option<&AttemptId> {
        match self {
            DownloadProgress::Pending(d) => d.attempt_id.as_ref(),
            DownloadProgress::Ongoing(d) => d.attempt_id.as_ref(),
            DownloadProgress::Completed(d) => d.attempt_id.as_ref(),
            DownloadProgress::Failed(d) => d.attempt_id.as_ref(),
            // An unknown kind's id lives in a raw Value; see `attempt_id_owned`.
            DownloadProgress::Unknown { .. } => None,
        }
    }

    /// Like [`DownloadProgress::attempt_id`] but also reads unknown record kinds.
    pub fn attempt_id_owned(&self) -> Option<AttemptId> {
        match self {
            DownloadProgress::Unknown { value, .. } => value
                .get("attemptId")
                .or_else(|| value.get("attempt_id"))
                .and_then(Value::as_str)
                .map(AttemptId::from),
            known => known.attempt_id().cloned(),
        }
    }

    /// `(downloaded, total)` bytes where the record says.
    pub fn bytes(&self) -> Option<(Memory, Memory)> {
        match self {
            DownloadProgress::Pending(d) => Some((d.downloaded, d.total)),
            DownloadProgress::Ongoing(d) => {
                Some((d.download_progress.downloaded, d.download_progress.total))
            }
            DownloadProgress::Completed(d) => Some((d.total, d.total)),
            DownloadProgress::Failed(_) | DownloadProgress::Unknown { .. } => None,
        }
    }

    pub fn error_message(&self) -> Option<&str> {
        match self {
            DownloadProgress::Failed(d) => Some(&d.error_message),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadPending {
    #[serde(alias = "node_id")]
    pub node_id: NodeId,
    #[serde(alias = "shard_metadata")]
    pub shard_metadata: ShardMetadata,
    #[serde(default, alias = "model_directory")]
    pub model_directory: String,
    #[serde(default, alias = "attempt_id", skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<AttemptId>,
    #[serde(default)]
    pub downloaded: Memory,
    #[serde(default)]
    pub total: Memory,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadOngoing {
    #[serde(alias = "node_id")]
    pub node_id: NodeId,
    #[serde(alias = "shard_metadata")]
    pub shard_metadata: ShardMetadata,
    #[serde(default, alias = "model_directory")]
    pub model_directory: String,
    #[serde(default, alias = "attempt_id", skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<AttemptId>,
    #[serde(alias = "download_progress")]
    pub download_progress: DownloadProgressData,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadCompleted {
    #[serde(alias = "node_id")]
    pub node_id: NodeId,
    #[serde(alias = "shard_metadata")]
    pub shard_metadata: ShardMetadata,
    #[serde(default, alias = "model_directory")]
    pub model_directory: String,
    #[serde(default, alias = "attempt_id", skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<AttemptId>,
    #[serde(default)]
    pub total: Memory,
    #[serde(default, alias = "read_only")]
    pub read_only: bool,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadFailed {
    #[serde(alias = "node_id")]
    pub node_id: NodeId,
    #[serde(alias = "shard_metadata")]
    pub shard_metadata: ShardMetadata,
    #[serde(default, alias = "model_directory")]
    pub model_directory: String,
    #[serde(default, alias = "attempt_id", skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<AttemptId>,
    #[serde(default, alias = "error_message")]
    pub error_message: String,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `downloadProgress` of an ongoing download; `files` repeats the shape per file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadProgressData {
    #[serde(default)]
    pub total: Memory,
    #[serde(default)]
    pub downloaded: Memory,
    #[serde(default, alias = "downloaded_this_session")]
    pub downloaded_this_session: Memory,
    #[serde(default, alias = "completed_files")]
    pub completed_files: u64,
    #[serde(default, alias = "total_files")]
    pub total_files: u64,
    /// Bytes per second.
    #[serde(default)]
    pub speed: f64,
    #[serde(default, alias = "eta_ms")]
    pub eta_ms: i64,
    #[serde(default)]
    pub files: BTreeMap<String, DownloadProgressData>,
}
