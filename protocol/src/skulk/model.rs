//! Model cards and shard metadata (camelCase; snake_case accepted for `/events`).
//!
//! Fields Skulk 1.3.0 always writes are always written back (nullable ones as `null`), so
//! a body den received round-trips unchanged. Fields of the newer dialect
//! (`registryCardId`) are written only when present: a strict 1.3.0 server would refuse
//! an unknown key. Anything else is kept in `extra` and written back verbatim.

use crate::skulk::extra::Extra;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::{Memory, ModelId, RegistryCardId};
use super::tagged::tagged_union;

/// A model card as embedded in shard metadata (`modelCard`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelCard {
    #[serde(alias = "model_id")]
    pub model_id: ModelId,
    #[serde(default, alias = "storage_size")]
    pub storage_size: Memory,
    #[serde(default, alias = "n_layers")]
    pub n_layers: u64,
    #[serde(default, alias = "hidden_size")]
    pub hidden_size: u64,
    #[serde(default, alias = "supports_tensor")]
    pub supports_tensor: bool,
    #[serde(
        default,
        alias = "num_key_value_heads",
        skip_serializing_if = "Option::is_none"
    )]
    pub num_key_value_heads: Option<u64>,
    #[serde(default)]
    pub tasks: Vec<String>,
    #[serde(default)]
    pub components: Option<Value>,
    #[serde(default)]
    pub family: String,
    #[serde(default)]
    pub quantization: String,
    #[serde(default, alias = "base_model")]
    pub base_model: String,
    #[serde(default, alias = "gguf_file")]
    pub gguf_file: Option<String>,
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// The advertised context length; 0 when unknown.
    #[serde(default, alias = "context_length")]
    pub context_length: u64,
    #[serde(default, alias = "uses_cfg")]
    pub uses_cfg: bool,
    #[serde(default, alias = "trust_remote_code")]
    pub trust_remote_code: bool,
    #[serde(default, alias = "is_custom")]
    pub is_custom: bool,
    #[serde(default)]
    pub vision: Option<Value>,
    #[serde(default)]
    pub reasoning: Option<Value>,
    #[serde(default)]
    pub modalities: Option<Value>,
    #[serde(default)]
    pub tooling: Option<Value>,
    #[serde(default)]
    pub runtime: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<CardPlacement>,
    /// Newer dialect: the immutable identity of a signed card. `None` for legacy and
    /// custom cards, which are matched by full card equality instead.
    #[serde(
        default,
        alias = "registry_card_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub registry_card_id: Option<RegistryCardId>,
    /// Fields den does not know (e.g. `sourceRevision`), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ModelCard {
    /// A card with only the identity filled in; the rest defaulted. For tests and for
    /// building requests.
    pub fn minimal(model_id: impl Into<ModelId>) -> ModelCard {
        ModelCard {
            model_id: model_id.into(),
            storage_size: Memory::default(),
            n_layers: 0,
            hidden_size: 0,
            supports_tensor: false,
            num_key_value_heads: None,
            tasks: Vec::new(),
            components: None,
            family: String::new(),
            quantization: String::new(),
            base_model: String::new(),
            gguf_file: None,
            capabilities: Vec::new(),
            context_length: 0,
            uses_cfg: false,
            trust_remote_code: false,
            is_custom: false,
            vision: None,
            reasoning: None,
            modalities: None,
            tooling: None,
            runtime: None,
            placement: None,
            registry_card_id: None,
            extra: Default::default(),
        }
    }

    /// Backends the card declares compatible (`placement.compatibleBackends`).
    pub fn compatible_backends(&self) -> &[String] {
        self.placement
            .as_ref()
            .map(|p| p.compatible_backends.as_slice())
            .unwrap_or(&[])
    }
}

/// `modelCard.placement`: declared backend compatibility and sizing hints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CardPlacement {
    #[serde(default, alias = "compatible_backends")]
    pub compatible_backends: Vec<String>,
    #[serde(default, alias = "min_vram_gib")]
    pub min_vram_gib: Option<f64>,
    #[serde(default, alias = "max_context_tokens")]
    pub max_context_tokens: Option<u64>,
    #[serde(default, alias = "backend_preference")]
    pub backend_preference: Vec<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

tagged_union! {
    /// Which part of a model one runner serves.
    pub enum ShardMetadata {
        Pipeline(ShardFields) = "PipelineShardMetadata",
        Tensor(ShardFields) = "TensorShardMetadata",
        Cfg(ShardFields) = "CfgShardMetadata",
    }
}

impl ShardMetadata {
    pub fn fields(&self) -> Option<&ShardFields> {
        match self {
            ShardMetadata::Pipeline(f) | ShardMetadata::Tensor(f) | ShardMetadata::Cfg(f) => {
                Some(f)
            }
            ShardMetadata::Unknown { .. } => None,
        }
    }

    pub fn fields_mut(&mut self) -> Option<&mut ShardFields> {
        match self {
            ShardMetadata::Pipeline(f) | ShardMetadata::Tensor(f) | ShardMetadata::Cfg(f) => {
                Some(f)
            }
            ShardMetadata::Unknown { .. } => None,
        }
    }

    /// The card of a known shard kind, or of an unknown one that still carries a
    /// parseable `modelCard`.
    pub fn model_card(&self) -> Option<ModelCard> {
        match self {
            ShardMetadata::Unknown { value, .. } => value
                .get("modelCard")
                .or_else(|| value.get("model_card"))
                .and_then(|c| serde_json::from_value(c.clone()).ok()),
            known => known.fields().map(|f| f.model_card.clone()),
        }
    }

    /// Borrowing variant of [`ShardMetadata::model_card`] for known shard kinds.
    pub fn card(&self) -> Option<&ModelCard> {
        self.fields().map(|f| &f.model_card)
    }
}

/// The fields shared by every shard kind. `Cfg` adds its ranks (present only there).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardFields {
    #[serde(alias = "model_card")]
    pub model_card: ModelCard,
    #[serde(default, alias = "device_rank")]
    pub device_rank: u64,
    #[serde(default = "one", alias = "world_size")]
    pub world_size: u64,
    #[serde(default, alias = "resolved_backend")]
    pub resolved_backend: Option<String>,
    #[serde(default, alias = "immediate_exception")]
    pub immediate_exception: bool,
    #[serde(default, alias = "should_timeout")]
    pub should_timeout: Option<f64>,
    #[serde(default, alias = "start_layer")]
    pub start_layer: u64,
    #[serde(default, alias = "end_layer")]
    pub end_layer: u64,
    #[serde(default, alias = "n_layers")]
    pub n_layers: u64,
    #[serde(default, alias = "cfg_rank", skip_serializing_if = "Option::is_none")]
    pub cfg_rank: Option<u64>,
    #[serde(
        default,
        alias = "cfg_world_size",
        skip_serializing_if = "Option::is_none"
    )]
    pub cfg_world_size: Option<u64>,
    #[serde(
        default,
        alias = "pipeline_rank",
        skip_serializing_if = "Option::is_none"
    )]
    pub pipeline_rank: Option<u64>,
    #[serde(
        default,
        alias = "pipeline_world_size",
        skip_serializing_if = "Option::is_none"
    )]
    pub pipeline_world_size: Option<u64>,
    #[serde(flatten)]
    pub extra: Extra,
}

fn one() -> u64 {
    1
}
