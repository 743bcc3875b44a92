//! Request and response envelopes of the management endpoints.
//!
//! Envelopes are plain models with snake_case keys; the state objects nested in them keep
//! their camelCase (a preview has `model_id`, its instance has `instanceId`). `GET
//! /node_id` answers a bare JSON string: parse it as [`crate::ids::NodeId`].

use crate::skulk::extra::Extra;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::{CommandId, InstanceId, ModelId, RegistryCardId};
use super::instance::Instance;
use super::model::{ModelCard, ShardMetadata};
use super::tagged::open_enum;
use crate::ids::NodeId;

/// `GET /node/identity` (camelCase, built by hand in Skulk).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeIdentityResponse {
    #[serde(alias = "node_id")]
    pub node_id: NodeId,
    #[serde(default)]
    pub hostname: String,
    /// The first non-loopback IPv4 address, or the hostname.
    #[serde(default, alias = "ip_address")]
    pub ip_address: String,
    #[serde(flatten)]
    pub extra: Extra,
}

open_enum! {
    /// Requested sharding of a placement.
    pub enum Sharding {
        Pipeline = "Pipeline",
        Tensor = "Tensor",
    }
}

open_enum! {
    /// Requested instance kind of a placement.
    pub enum InstanceMeta {
        MlxRing = "MlxRing",
        MlxJaccl = "MlxJaccl",
        LlamaRpc = "LlamaRpc",
    }
}

/// `GET /instance/previews` → `{"previews": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviewsResponse {
    #[serde(default)]
    pub previews: Vec<PlacementPreview>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// One candidate placement. `sharding`/`instance_meta` say what was REQUESTED; the real
/// shape is the instance variant and its shard tags (single-node placements come out as
/// a pipeline ring). A preview is not a reservation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacementPreview {
    pub model_id: ModelId,
    pub sharding: Sharding,
    pub instance_meta: InstanceMeta,
    #[serde(default)]
    pub instance: Option<Instance>,
    /// Bytes per node; the storage size split evenly.
    #[serde(default)]
    pub memory_delta_by_node: Option<BTreeMap<NodeId, i64>>,
    /// `null` for an admitted preview.
    #[serde(default)]
    pub error: Option<String>,
    /// Newer dialect: stable refusal category (`no_valid_placement`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// Newer dialect: digest of the authorised card used for the preview.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card_digest: Option<String>,
    /// Newer dialect (den): the context limit of the previewed instance.
    #[serde(
        default,
        rename = "contextTokenLimit",
        alias = "context_token_limit",
        skip_serializing_if = "Option::is_none"
    )]
    pub context_token_limit: Option<u64>,
    /// Newer Skulk: the largest context window this placement can hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_context_tokens: Option<u64>,
    /// Newer Skulk: operator-readable compatibility gap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compatibility_detail: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl PlacementPreview {
    /// Admitted: no error and an instance to submit.
    pub fn is_admitted(&self) -> bool {
        self.error.is_none() && self.error_code.is_none() && self.instance.is_some()
    }

    /// The nodes the previewed instance would actually run on (`nodeToRunner` keys).
    pub fn nodes(&self) -> BTreeSet<NodeId> {
        self.instance
            .as_ref()
            .map(Instance::nodes)
            .unwrap_or_default()
    }

    /// The context limit: the preview's own field where present, else the instance's.
    pub fn effective_context_limit(&self) -> Option<u64> {
        self.context_token_limit
            .or_else(|| {
                self.instance
                    .as_ref()
                    .and_then(Instance::context_token_limit)
            })
            .or(self.max_context_tokens)
    }
}

/// `POST /place_instance` body (snake_case).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlaceInstanceParams {
    pub model_id: ModelId,
    #[serde(default = "pipeline")]
    pub sharding: Sharding,
    #[serde(default = "mlx_ring")]
    pub instance_meta: InstanceMeta,
    #[serde(default = "one")]
    pub min_nodes: u64,
    #[serde(default)]
    pub excluded_nodes: Vec<NodeId>,
    /// Newer Skulk: requested context window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<u64>,
}

impl PlaceInstanceParams {
    pub fn new(model_id: impl Into<ModelId>) -> PlaceInstanceParams {
        PlaceInstanceParams {
            model_id: model_id.into(),
            sharding: Sharding::Pipeline,
            instance_meta: InstanceMeta::MlxRing,
            min_nodes: 1,
            excluded_nodes: Vec::new(),
            context_tokens: None,
        }
    }
}

fn pipeline() -> Sharding {
    Sharding::Pipeline
}

fn mlx_ring() -> InstanceMeta {
    InstanceMeta::MlxRing
}

fn one() -> u64 {
    1
}

/// `POST /instance` body: `{"instance": <tagged Instance>}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateInstanceRequest {
    pub instance: Instance,
}

/// `POST /instance` and `POST /place_instance` → a command acknowledgement. 1.3.0 has no
/// `instance_id` here; the newer dialect names the created instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateInstanceResponse {
    #[serde(default)]
    pub message: String,
    pub command_id: CommandId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<InstanceId>,
    #[serde(default)]
    pub model_card: Option<ModelCard>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `DELETE /instance/{id}` → acknowledgement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeleteInstanceResponse {
    #[serde(default)]
    pub message: String,
    pub command_id: CommandId,
    pub instance_id: InstanceId,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `POST /v1/cancel/{command_id}` → acknowledgement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelCommandResponse {
    #[serde(default)]
    pub message: String,
    pub command_id: CommandId,
}

/// `POST /download/start` body (camelCase).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartDownloadRequest {
    #[serde(alias = "target_node_id")]
    pub target_node_id: NodeId,
    #[serde(alias = "shard_metadata")]
    pub shard_metadata: ShardMetadata,
}

/// `POST /download/start` and `DELETE /download/{node}/{model}` → `{"commandId": …}`
/// (camelCase, unlike the other acknowledgements).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadCommandResponse {
    #[serde(alias = "command_id")]
    pub command_id: CommandId,
}

/// `GET /v1/models` → the model catalog (not only running models).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub data: Vec<ModelListEntry>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelListEntry {
    pub id: ModelId,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: i64,
    #[serde(default)]
    pub owned_by: String,
    #[serde(default)]
    pub hugging_face_id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub context_length: u64,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub storage_size_megabytes: u64,
    #[serde(default)]
    pub supports_tensor: bool,
    #[serde(default)]
    pub tasks: Vec<String>,
    #[serde(default)]
    pub is_custom: bool,
    #[serde(default)]
    pub family: String,
    #[serde(default)]
    pub quantization: String,
    #[serde(default)]
    pub base_model: String,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub reasoning: Option<Value>,
    #[serde(default)]
    pub modalities: Option<Value>,
    #[serde(default)]
    pub tooling: Option<Value>,
    #[serde(default)]
    pub runtime: Option<Value>,
    #[serde(default)]
    pub resolved_capabilities: Option<Value>,
    /// Newer dialect: signed card identity of the active card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_card_id: Option<RegistryCardId>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// Newer dialect: `GET /models/requirements?model_id=…&context_tokens=…`. Advisory; it
/// reserves nothing. Absent in Skulk 1.3.0 (the endpoint answers 404): requirements are
/// then unknown, which is not a failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequirements {
    pub model_id: ModelId,
    /// SHA-256 of the canonical card; compare with the preview's `card_digest`.
    #[serde(default)]
    pub card_digest: Option<String>,
    #[serde(default)]
    pub registry_card_id: Option<RegistryCardId>,
    #[serde(default)]
    pub context_tokens: Option<u64>,
    /// The card's advertised context limit; `null` when unknown.
    #[serde(default)]
    pub context_limit: Option<u64>,
    #[serde(default)]
    pub storage_bytes: Option<u64>,
    /// Whole-model memory estimate. `null` means the sizing information is MISSING,
    /// never zero memory: read it through [`ModelRequirements::memory_estimate`].
    #[serde(default)]
    pub estimated_memory_bytes: Option<u64>,
    #[serde(default)]
    pub discrete_gpu_memory_fraction: Option<f64>,
    #[serde(default)]
    pub unified_memory_fraction: Option<f64>,
    #[serde(default)]
    pub compatible_backends: Vec<String>,
    /// Every capability here needs a supported exact engine/build/hardware match. Do not
    /// infer this set from the engine claims returned.
    #[serde(default)]
    pub required_capabilities: Vec<String>,
    /// Signed engine support claims, kept raw.
    #[serde(default)]
    pub engine_support: Vec<Value>,
    /// Artifact capabilities marked incomplete; these block admission on their own.
    #[serde(default)]
    pub incomplete_capabilities: Vec<String>,
    #[serde(default = "yes")]
    pub estimate_only: bool,
    #[serde(flatten)]
    pub extra: Extra,
}

fn yes() -> bool {
    true
}

/// A memory estimate that cannot be mistaken for zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryEstimate {
    Known(u64),
    /// The server had no sizing information.
    Unknown,
}

impl ModelRequirements {
    pub fn memory_estimate(&self) -> MemoryEstimate {
        match self.estimated_memory_bytes {
            Some(bytes) => MemoryEstimate::Known(bytes),
            None => MemoryEstimate::Unknown,
        }
    }
}
