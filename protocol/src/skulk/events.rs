//! `GET /events`: the API node's local diagnostics log, a JSON array of tagged events.
//!
//! Unlike `/state`, Skulk writes these WITHOUT aliases, so every key inside a tag is
//! snake_case (`event_id`, `download_progress`, `{"in_bytes": …}`). The event envelopes
//! below are snake_case; nested state objects (instances, download records, runner
//! statuses, tasks) reuse the camelCase types, which accept snake_case aliases. When
//! serialised back, those nested objects are written in camelCase (den's own form).
//! The log is bounded by ring retention: never treat it as complete history.

use crate::skulk::extra::Extra;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::{EventId, InstanceId, RunnerId, TaskId};
use super::download::DownloadProgress;
use super::instance::Instance;
use super::runner::RunnerStatus;
use super::state::InstanceFailure;
use super::tagged::tagged_union;
use super::task::{Task, TaskStatus};
use crate::ids::NodeId;

tagged_union! {
    /// One event of `/events`.
    pub enum Event {
        NodeGatheredInfo(NodeGatheredInfo) = "NodeGatheredInfo",
        NodeDownloadProgress(NodeDownloadProgress) = "NodeDownloadProgress",
        InstanceCreated(InstanceCreated) = "InstanceCreated",
        InstanceDeleted(InstanceDeleted) = "InstanceDeleted",
        InstanceFailureRecorded(InstanceFailureRecorded) = "InstanceFailureRecorded",
        TaskCreated(TaskCreated) = "TaskCreated",
        TaskStatusUpdated(TaskStatusUpdated) = "TaskStatusUpdated",
        TaskFailed(TaskFailed) = "TaskFailed",
        TaskDeleted(TaskRef) = "TaskDeleted",
        TaskAcknowledged(TaskRef) = "TaskAcknowledged",
        RunnerStatusUpdated(RunnerStatusUpdated) = "RunnerStatusUpdated",
        NodeTimedOut(NodeTimedOut) = "NodeTimedOut",
        TopologyEdgeCreated(TopologyEdge) = "TopologyEdgeCreated",
        TopologyEdgeDeleted(TopologyEdge) = "TopologyEdgeDeleted",
        TracingStateChanged(TracingStateChanged) = "TracingStateChanged",
    }
}

impl Event {
    /// `event_id` of a known event kind.
    pub fn event_id(&self) -> Option<&EventId> {
        match self {
            Event::NodeGatheredInfo(e) => Some(&e.event_id),
            Event::NodeDownloadProgress(e) => Some(&e.event_id),
            Event::InstanceCreated(e) => Some(&e.event_id),
            Event::InstanceDeleted(e) => Some(&e.event_id),
            Event::InstanceFailureRecorded(e) => Some(&e.event_id),
            Event::TaskCreated(e) => Some(&e.event_id),
            Event::TaskStatusUpdated(e) => Some(&e.event_id),
            Event::TaskFailed(e) => Some(&e.event_id),
            Event::TaskDeleted(e) | Event::TaskAcknowledged(e) => Some(&e.event_id),
            Event::RunnerStatusUpdated(e) => Some(&e.event_id),
            Event::NodeTimedOut(e) => Some(&e.event_id),
            Event::TopologyEdgeCreated(e) | Event::TopologyEdgeDeleted(e) => Some(&e.event_id),
            Event::TracingStateChanged(e) => Some(&e.event_id),
            Event::Unknown { .. } => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeGatheredInfo {
    pub event_id: EventId,
    pub node_id: NodeId,
    /// `str(datetime)`, e.g. `2026-11-29 22:43:40.317919+00:00`.
    #[serde(default)]
    pub when: String,
    /// A tagged info payload (`NodeNetworkInterfaces`, `NodeConfig`, …), kept raw.
    #[serde(default)]
    pub info: Value,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeDownloadProgress {
    pub event_id: EventId,
    pub download_progress: DownloadProgress,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceCreated {
    pub event_id: EventId,
    pub instance: Instance,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceDeleted {
    pub event_id: EventId,
    pub instance_id: InstanceId,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceFailureRecorded {
    pub event_id: EventId,
    pub failure: InstanceFailure,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskCreated {
    pub event_id: EventId,
    pub task_id: TaskId,
    pub task: Task,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStatusUpdated {
    pub event_id: EventId,
    pub task_id: TaskId,
    pub task_status: TaskStatus,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskFailed {
    pub event_id: EventId,
    pub task_id: TaskId,
    #[serde(default)]
    pub error_type: String,
    #[serde(default)]
    pub error_message: String,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRef {
    pub event_id: EventId,
    pub task_id: TaskId,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunnerStatusUpdated {
    pub event_id: EventId,
    pub runner_id: RunnerId,
    pub runner_status: RunnerStatus,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeTimedOut {
    pub event_id: EventId,
    pub node_id: NodeId,
    #[serde(default)]
    pub evidence: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopologyEdge {
    pub event_id: EventId,
    /// The connection, kept raw.
    #[serde(default)]
    pub conn: Value,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TracingStateChanged {
    pub event_id: EventId,
    pub enabled: bool,
    #[serde(flatten)]
    pub extra: Extra,
}
