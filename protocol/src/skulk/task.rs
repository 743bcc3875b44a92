//! Master tasks (`/state.tasks`, tagged by kind). Tasks outlive their instance.
//!
//! `taskParams` of generation tasks is a plain snake_case object and is kept as raw JSON.

use crate::skulk::extra::Extra;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::{CommandId, InstanceId, RunnerId, TaskId};
use super::instance::Instance;
use super::model::ShardMetadata;
use super::tagged::{open_enum, tagged_union};
use crate::ids::NodeId;

open_enum! {
    /// `taskStatus`.
    pub enum TaskStatus {
        Pending = "Pending",
        Running = "Running",
        Complete = "Complete",
        TimedOut = "TimedOut",
        Failed = "Failed",
        Cancelled = "Cancelled",
    }
}

tagged_union! {
    /// One task.
    pub enum Task {
        CreateRunner(CreateRunnerTask) = "CreateRunner",
        DownloadModel(DownloadModelTask) = "DownloadModel",
        LoadModel(BaseTask) = "LoadModel",
        ConnectToGroup(BaseTask) = "ConnectToGroup",
        StartWarmup(BaseTask) = "StartWarmup",
        TextGeneration(GenerationTask) = "TextGeneration",
        ImageGeneration(GenerationTask) = "ImageGeneration",
        ImageEdits(GenerationTask) = "ImageEdits",
        TextEmbedding(GenerationTask) = "TextEmbedding",
        CancelTask(CancelTask) = "CancelTask",
        Shutdown(ShutdownTask) = "Shutdown",
    }
}

/// The fields every task kind has.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskCommon {
    #[serde(alias = "task_id")]
    pub task_id: TaskId,
    #[serde(alias = "task_status")]
    pub task_status: TaskStatus,
    #[serde(default, alias = "instance_id")]
    pub instance_id: Option<InstanceId>,
}

impl Task {
    /// The common fields, also for a task kind den does not know.
    pub fn common(&self) -> Option<TaskCommon> {
        let (task_id, task_status, instance_id) = match self {
            Task::CreateRunner(t) => (&t.task_id, &t.task_status, &t.instance_id),
            Task::DownloadModel(t) => (&t.task_id, &t.task_status, &t.instance_id),
            Task::LoadModel(t) | Task::ConnectToGroup(t) | Task::StartWarmup(t) => {
                (&t.task_id, &t.task_status, &t.instance_id)
            }
            Task::TextGeneration(t)
            | Task::ImageGeneration(t)
            | Task::ImageEdits(t)
            | Task::TextEmbedding(t) => (&t.task_id, &t.task_status, &t.instance_id),
            Task::CancelTask(t) => (&t.task_id, &t.task_status, &t.instance_id),
            Task::Shutdown(t) => (&t.task_id, &t.task_status, &t.instance_id),
            Task::Unknown { value, .. } => return serde_json::from_value(value.clone()).ok(),
        };
        Some(TaskCommon {
            task_id: task_id.clone(),
            task_status: task_status.clone(),
            instance_id: Some(instance_id.clone()),
        })
    }

    pub fn status(&self) -> Option<TaskStatus> {
        self.common().map(|c| c.task_status)
    }

    pub fn instance_id(&self) -> Option<InstanceId> {
        self.common().and_then(|c| c.instance_id)
    }

    /// `errorMessage` of a failed generation task.
    pub fn error_message(&self) -> Option<&str> {
        match self {
            Task::TextGeneration(t)
            | Task::ImageGeneration(t)
            | Task::ImageEdits(t)
            | Task::TextEmbedding(t) => t.error_message.as_deref(),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BaseTask {
    #[serde(alias = "task_id")]
    pub task_id: TaskId,
    #[serde(alias = "task_status")]
    pub task_status: TaskStatus,
    #[serde(alias = "instance_id")]
    pub instance_id: InstanceId,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateRunnerTask {
    #[serde(alias = "task_id")]
    pub task_id: TaskId,
    #[serde(alias = "task_status")]
    pub task_status: TaskStatus,
    #[serde(alias = "instance_id")]
    pub instance_id: InstanceId,
    #[serde(alias = "bound_instance")]
    pub bound_instance: BoundInstance,
    #[serde(flatten)]
    pub extra: Extra,
}

/// The instance a runner is created for, with the runner and node it is bound to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BoundInstance {
    pub instance: Instance,
    #[serde(alias = "bound_runner_id")]
    pub bound_runner_id: RunnerId,
    #[serde(alias = "bound_node_id")]
    pub bound_node_id: NodeId,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadModelTask {
    #[serde(alias = "task_id")]
    pub task_id: TaskId,
    #[serde(alias = "task_status")]
    pub task_status: TaskStatus,
    #[serde(alias = "instance_id")]
    pub instance_id: InstanceId,
    #[serde(alias = "shard_metadata")]
    pub shard_metadata: ShardMetadata,
    #[serde(flatten)]
    pub extra: Extra,
}

/// TextGeneration, ImageGeneration, ImageEdits and TextEmbedding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerationTask {
    #[serde(alias = "task_id")]
    pub task_id: TaskId,
    #[serde(alias = "task_status")]
    pub task_status: TaskStatus,
    #[serde(alias = "instance_id")]
    pub instance_id: InstanceId,
    #[serde(alias = "command_id")]
    pub command_id: CommandId,
    #[serde(default, alias = "owner_node")]
    pub owner_node: Option<NodeId>,
    /// A plain snake_case object (`max_output_tokens`, …), kept raw.
    #[serde(default, alias = "task_params")]
    pub task_params: Value,
    #[serde(default, alias = "trace_enabled")]
    pub trace_enabled: bool,
    #[serde(default, alias = "error_type")]
    pub error_type: Option<String>,
    #[serde(default, alias = "error_message")]
    pub error_message: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelTask {
    #[serde(alias = "task_id")]
    pub task_id: TaskId,
    #[serde(alias = "task_status")]
    pub task_status: TaskStatus,
    #[serde(alias = "instance_id")]
    pub instance_id: InstanceId,
    #[serde(alias = "cancelled_task_id")]
    pub cancelled_task_id: TaskId,
    #[serde(alias = "runner_id")]
    pub runner_id: RunnerId,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownTask {
    #[serde(alias = "task_id")]
    pub task_id: TaskId,
    #[serde(alias = "task_status")]
    pub task_status: TaskStatus,
    #[serde(alias = "instance_id")]
    pub instance_id: InstanceId,
    #[serde(alias = "runner_id")]
    pub runner_id: RunnerId,
    #[serde(flatten)]
    pub extra: Extra,
}
