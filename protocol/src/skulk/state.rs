//! `GET /state`: durable control state plus the telemetry overlay, in camelCase.
//!
//! Every top-level key of Skulk 1.3.0 is typed. The newer dialect's keys
//! (`instanceFailures`, `nodeResources`) and den's `commands` are `Option`: absent means
//! "this server does not report it" (incomplete evidence), never "empty". Unknown
//! top-level keys are kept in `extra`. [`State::dialect`] says which newer fields a body
//! carried.

use crate::skulk::extra::Extra;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{AttemptId, CommandId, InstanceId, ModelId, RunnerId};
use super::download::DownloadProgress;
use super::instance::Instance;
use super::node::{
    NodeDisk, NodeHealth, NodeIdentityInfo, NodeMemory, NodeNetworkInfo, NodeRdmaCtl,
    NodeResources, NodeSystem, NodeThunderboltInfo, ThunderboltBridgeStatus,
};
use super::runner::RunnerStatus;
use super::tagged::tagged_union;
use super::task::Task;
use super::topology::Topology;
use crate::ids::NodeId;

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    #[serde(default)]
    pub instances: BTreeMap<InstanceId, Instance>,
    #[serde(default)]
    pub runners: BTreeMap<RunnerId, RunnerStatus>,
    #[serde(default)]
    pub downloads: BTreeMap<NodeId, Vec<DownloadProgress>>,
    #[serde(default)]
    pub tasks: BTreeMap<super::common::TaskId, Task>,
    /// ISO-8601 strings as Skulk wrote them. A controller attaches its own observation
    /// time instead of trusting these.
    #[serde(default, alias = "last_seen")]
    pub last_seen: BTreeMap<NodeId, String>,
    #[serde(default)]
    pub topology: Topology,
    #[serde(default, alias = "tracing_enabled")]
    pub tracing_enabled: bool,
    #[serde(default = "minus_one", alias = "last_event_applied_idx")]
    pub last_event_applied_idx: i64,
    #[serde(default, alias = "node_network")]
    pub node_network: BTreeMap<NodeId, NodeNetworkInfo>,
    #[serde(default, alias = "node_thunderbolt")]
    pub node_thunderbolt: BTreeMap<NodeId, NodeThunderboltInfo>,
    #[serde(default, alias = "node_thunderbolt_bridge")]
    pub node_thunderbolt_bridge: BTreeMap<NodeId, ThunderboltBridgeStatus>,
    #[serde(default, alias = "thunderbolt_bridge_cycles")]
    pub thunderbolt_bridge_cycles: Vec<Vec<NodeId>>,
    #[serde(default, alias = "node_memory")]
    pub node_memory: BTreeMap<NodeId, NodeMemory>,
    #[serde(default, alias = "node_system")]
    pub node_system: BTreeMap<NodeId, NodeSystem>,
    #[serde(default, alias = "node_identities")]
    pub node_identities: BTreeMap<NodeId, NodeIdentityInfo>,
    #[serde(default, alias = "node_disk")]
    pub node_disk: BTreeMap<NodeId, NodeDisk>,
    #[serde(default, alias = "node_rdma_ctl")]
    pub node_rdma_ctl: BTreeMap<NodeId, NodeRdmaCtl>,
    #[serde(default, alias = "node_health")]
    pub node_health: BTreeMap<NodeId, NodeHealth>,
    /// Newer dialect: terminal failure records by instance id.
    #[serde(
        default,
        alias = "instance_failures",
        skip_serializing_if = "Option::is_none"
    )]
    pub instance_failures: Option<BTreeMap<InstanceId, InstanceFailure>>,
    /// Newer dialect: this endpoint's live resource observations, by node.
    #[serde(
        default,
        alias = "node_resources",
        skip_serializing_if = "Option::is_none"
    )]
    pub node_resources: Option<BTreeMap<NodeId, NodeResources>>,
    /// den addition: the status of commands (placement, deletion) by command id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commands: Option<BTreeMap<CommandId, CommandStatus>>,
    /// den addition: ordinary inference the management API served through each
    /// instance's current runner (attributed by the router that routed it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference: Option<BTreeMap<InstanceId, InstanceInference>>,
    /// den addition: each live node's KV page pool (and its runner's, when it has one).
    #[serde(default, alias = "node_pools", skip_serializing_if = "Option::is_none")]
    pub node_pools: Option<BTreeMap<NodeId, NodePool>>,
    /// Top-level keys den does not know, kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

fn minus_one() -> i64 {
    -1
}

/// Newer dialect: why a placement failed terminally (kept after the instance is gone).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceFailure {
    #[serde(alias = "instance_id")]
    pub instance_id: InstanceId,
    #[serde(default, alias = "model_id", skip_serializing_if = "Option::is_none")]
    pub model_id: Option<ModelId>,
    /// Operator-readable cause.
    #[serde(default, alias = "error_message")]
    pub message: String,
    /// Stable machine-readable category, when the server has one.
    #[serde(default, alias = "error_code", skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(default, alias = "node_id", skip_serializing_if = "Option::is_none")]
    pub node_id: Option<NodeId>,
    #[serde(default, alias = "runner_id", skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<RunnerId>,
    #[serde(default, alias = "attempt_id", skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<AttemptId>,
    /// The server's timestamp, as written.
    #[serde(default, alias = "failed_at", skip_serializing_if = "Option::is_none")]
    pub failed_at: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// den addition: one command's status, so that an accepted command's outcome can be read
/// instead of inferred by diffing state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandStatus {
    #[serde(alias = "command_id")]
    pub command_id: CommandId,
    /// `CreateInstance`, `PlaceInstance`, `DeleteInstance`, … (open string).
    #[serde(default)]
    pub kind: String,
    #[serde(
        default,
        alias = "instance_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub instance_id: Option<InstanceId>,
    pub outcome: CommandOutcome,
    #[serde(flatten)]
    pub extra: Extra,
}

tagged_union! {
    /// What became of a command.
    pub enum CommandOutcome {
        Pending(super::runner::NoFields) = "Pending",
        Applied(super::runner::NoFields) = "Applied",
        Rejected(CommandRejected) = "Rejected",
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandRejected {
    #[serde(default)]
    pub message: String,
    #[serde(flatten)]
    pub extra: Extra,
}

/// den addition: inference served through one instance's current runner. Counts reset
/// when the instance gets another runner.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceInference {
    /// Ordinary requests that completed on the instance's runner.
    #[serde(default)]
    pub completed: u64,
    /// Requests that failed there (worker failures, not client cancellations).
    #[serde(default)]
    pub failed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<RunnerId>,
    /// The server's timestamp of the latest completion, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_completed_at: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// den addition: a node's KV page pool. Every page is free, reserved or resident;
/// evictable and durable count resident pages.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePool {
    #[serde(default)]
    pub page_size: u32,
    #[serde(default)]
    pub page_bytes: u64,
    #[serde(default)]
    pub total_pages: u32,
    #[serde(default)]
    pub free_pages: u32,
    #[serde(default)]
    pub reserved_pages: u32,
    #[serde(default)]
    pub resident_pages: u32,
    #[serde(default)]
    pub evictable_pages: u32,
    #[serde(default)]
    pub durable_pages: u32,
    /// What a runner's page pool may take on this node.
    #[serde(default)]
    pub kv_budget_bytes: u64,
    /// The page pool of the node's runner, sized from its card and the budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<RunnerPoolSummary>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// den addition: one runner's memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerPoolSummary {
    pub runner_id: RunnerId,
    #[serde(default)]
    pub weights_bytes: u64,
    #[serde(default)]
    pub pages: u32,
    #[serde(default)]
    pub page_bytes: u64,
    #[serde(default)]
    pub context_tokens: u64,
    #[serde(flatten)]
    pub extra: Extra,
}

/// Which fields of the newer dialect a `/state` body carried.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StateDialect {
    pub instance_failures: bool,
    pub node_resources: bool,
    pub commands: bool,
    /// den's `inference` map.
    pub inference: bool,
    /// den's `nodePools` map.
    pub node_pools: bool,
    /// At least one download record carried an `attemptId`.
    pub attempt_ids: bool,
    /// At least one card carried a `registryCardId`.
    pub registry_card_ids: bool,
    /// Top-level keys neither dialect defines.
    pub unknown_keys: Vec<String>,
}

impl StateDialect {
    /// True when nothing of the newer dialect was present (Skulk 1.3.0 as it is).
    pub fn is_legacy(&self) -> bool {
        !(self.instance_failures
            || self.node_resources
            || self.commands
            || self.inference
            || self.node_pools
            || self.attempt_ids
            || self.registry_card_ids)
    }
}

impl State {
    pub fn dialect(&self) -> StateDialect {
        let records = || self.downloads.values().flatten();
        let cards_in_instances = self
            .instances
            .values()
            .filter_map(Instance::core)
            .flat_map(|c| c.shard_assignments.runner_to_shard.into_values())
            .filter_map(|s| s.model_card())
            .any(|c| c.registry_card_id.is_some());
        StateDialect {
            instance_failures: self.instance_failures.is_some(),
            node_resources: self.node_resources.is_some(),
            commands: self.commands.is_some(),
            inference: self.inference.is_some(),
            node_pools: self.node_pools.is_some(),
            attempt_ids: records().any(|r| r.attempt_id_owned().is_some()),
            registry_card_ids: cards_in_instances
                || records().any(|r| r.model_card().is_some_and(|c| c.registry_card_id.is_some())),
            unknown_keys: self.extra.keys().cloned().collect(),
        }
    }

    /// Download records of one node (empty when the node has none).
    pub fn downloads_of(&self, node: &NodeId) -> &[DownloadProgress] {
        self.downloads.get(node).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Instances serving `model` (by `shardAssignments.modelId`).
    pub fn instances_of_model<'a>(
        &'a self,
        model: &'a ModelId,
    ) -> impl Iterator<Item = &'a InstanceId> + 'a {
        self.instances
            .iter()
            .filter(move |(_, i)| i.model_id().as_ref() == Some(model))
            .map(|(id, _)| id)
    }
}
