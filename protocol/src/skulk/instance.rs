//! Placed model instances (tagged: `MlxRingInstance`, `MlxJacclInstance`, …).

use crate::skulk::extra::Extra;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::common::{InstanceId, ModelId, RunnerId};
use super::model::{ModelCard, ShardMetadata};
use super::tagged::tagged_union;
use crate::ids::NodeId;

tagged_union! {
    /// A model instance: which runner serves which shard on which node.
    pub enum Instance {
        MlxRing(MlxRingInstance) = "MlxRingInstance",
        MlxJaccl(MlxJacclInstance) = "MlxJacclInstance",
        /// Newer Skulk: multi-node llama.cpp over RPC.
        LlamaRpc(LlamaRpcInstance) = "LlamaRpcInstance",
    }
}

/// The part of every instance kind the evidence reducer and the placement workflow need.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceCore {
    #[serde(alias = "instance_id")]
    pub instance_id: InstanceId,
    #[serde(alias = "shard_assignments")]
    pub shard_assignments: ShardAssignments,
    #[serde(default, alias = "context_token_limit")]
    pub context_token_limit: Option<u64>,
}

impl Instance {
    pub fn instance_id(&self) -> Option<&InstanceId> {
        match self {
            Instance::MlxRing(i) => Some(&i.instance_id),
            Instance::MlxJaccl(i) => Some(&i.instance_id),
            Instance::LlamaRpc(i) => Some(&i.instance_id),
            Instance::Unknown { .. } => None,
        }
    }

    pub fn shard_assignments(&self) -> Option<&ShardAssignments> {
        match self {
            Instance::MlxRing(i) => Some(&i.shard_assignments),
            Instance::MlxJaccl(i) => Some(&i.shard_assignments),
            Instance::LlamaRpc(i) => Some(&i.shard_assignments),
            Instance::Unknown { .. } => None,
        }
    }

    pub fn context_token_limit(&self) -> Option<u64> {
        match self {
            Instance::MlxRing(i) => i.context_token_limit,
            Instance::MlxJaccl(i) => i.context_token_limit,
            Instance::LlamaRpc(i) => i.context_token_limit,
            Instance::Unknown { .. } => self.core().and_then(|c| c.context_token_limit),
        }
    }

    /// The common fields, also for an instance kind den does not know as long as it
    /// carries `instanceId` and `shardAssignments` (den's own router may add kinds).
    pub fn core(&self) -> Option<InstanceCore> {
        match self {
            Instance::Unknown { value, .. } => serde_json::from_value(value.clone()).ok(),
            known => Some(InstanceCore {
                instance_id: known.instance_id()?.clone(),
                shard_assignments: known.shard_assignments()?.clone(),
                context_token_limit: known.context_token_limit(),
            }),
        }
    }

    /// The nodes the instance actually runs on: the keys of `nodeToRunner`.
    pub fn nodes(&self) -> BTreeSet<NodeId> {
        self.core()
            .map(|c| c.shard_assignments.nodes())
            .unwrap_or_default()
    }

    pub fn model_id(&self) -> Option<ModelId> {
        self.core().map(|c| c.shard_assignments.model_id)
    }
}

/// `shardAssignments`: the binding of nodes to runners and runners to shards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardAssignments {
    #[serde(alias = "model_id")]
    pub model_id: ModelId,
    #[serde(default, alias = "runner_to_shard")]
    pub runner_to_shard: BTreeMap<RunnerId, ShardMetadata>,
    #[serde(default, alias = "node_to_runner")]
    pub node_to_runner: BTreeMap<NodeId, RunnerId>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl ShardAssignments {
    pub fn nodes(&self) -> BTreeSet<NodeId> {
        self.node_to_runner.keys().cloned().collect()
    }

    /// The shard the runner on `node` serves, if the binding is complete.
    pub fn shard_of_node(&self, node: &NodeId) -> Option<(&RunnerId, &ShardMetadata)> {
        let runner = self.node_to_runner.get(node)?;
        let shard = self.runner_to_shard.get(runner)?;
        Some((runner, shard))
    }

    /// The model card of the node's shard.
    pub fn card_of_node(&self, node: &NodeId) -> Option<ModelCard> {
        self.shard_of_node(node)
            .and_then(|(_, shard)| shard.model_card())
    }
}

/// One ring host (`{"ip", "port"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    pub ip: String,
    pub port: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MlxRingInstance {
    #[serde(alias = "instance_id")]
    pub instance_id: InstanceId,
    #[serde(alias = "shard_assignments")]
    pub shard_assignments: ShardAssignments,
    /// The admission ceiling the master stamps at placement time.
    #[serde(default, alias = "context_token_limit")]
    pub context_token_limit: Option<u64>,
    #[serde(default, alias = "hosts_by_node")]
    pub hosts_by_node: BTreeMap<NodeId, Vec<Host>>,
    #[serde(default, alias = "ephemeral_port")]
    pub ephemeral_port: u64,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MlxJacclInstance {
    #[serde(alias = "instance_id")]
    pub instance_id: InstanceId,
    #[serde(alias = "shard_assignments")]
    pub shard_assignments: ShardAssignments,
    #[serde(default, alias = "context_token_limit")]
    pub context_token_limit: Option<u64>,
    /// N×N matrix of RDMA interface names, `null` on the diagonal.
    #[serde(default, alias = "jaccl_devices")]
    pub jaccl_devices: Vec<Vec<Option<String>>>,
    #[serde(default, alias = "jaccl_coordinators")]
    pub jaccl_coordinators: BTreeMap<NodeId, String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LlamaRpcInstance {
    #[serde(alias = "instance_id")]
    pub instance_id: InstanceId,
    #[serde(alias = "shard_assignments")]
    pub shard_assignments: ShardAssignments,
    #[serde(default, alias = "context_token_limit")]
    pub context_token_limit: Option<u64>,
    #[serde(alias = "driver_node")]
    pub driver_node: NodeId,
    #[serde(default, alias = "donor_endpoints")]
    pub donor_endpoints: BTreeMap<NodeId, String>,
    #[serde(flatten)]
    pub extra: Extra,
}
