//! Per-node maps of `/state` (network, memory, system, identity, disk, RDMA, health) and
//! the newer dialect's `nodeResources`.

use crate::skulk::extra::Extra;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::Memory;
use super::tagged::open_enum;

/// `nodeNetwork[node]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NodeNetworkInfo {
    #[serde(default)]
    pub interfaces: Vec<NetworkInterface>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    pub name: String,
    #[serde(default, alias = "ip_address")]
    pub ip_address: String,
    #[serde(default, alias = "interface_type")]
    pub interface_type: String,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `nodeThunderbolt[node]`; interface identifiers are kept raw.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NodeThunderboltInfo {
    #[serde(default)]
    pub interfaces: Vec<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `nodeThunderboltBridge[node]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThunderboltBridgeStatus {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub exists: bool,
    #[serde(default, alias = "service_name")]
    pub service_name: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `nodeMemory[node]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeMemory {
    #[serde(default, alias = "ram_total")]
    pub ram_total: Memory,
    #[serde(default, alias = "ram_available")]
    pub ram_available: Memory,
    #[serde(default, alias = "swap_total")]
    pub swap_total: Memory,
    #[serde(default, alias = "swap_available")]
    pub swap_available: Memory,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `nodeSystem[node]`: utilisation and power, with an optional accelerator reading.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSystem {
    #[serde(default, alias = "gpu_usage")]
    pub gpu_usage: f64,
    #[serde(default)]
    pub temp: f64,
    #[serde(default, alias = "sys_power")]
    pub sys_power: f64,
    #[serde(default, alias = "pcpu_usage")]
    pub pcpu_usage: f64,
    #[serde(default, alias = "ecpu_usage")]
    pub ecpu_usage: f64,
    #[serde(default)]
    pub accelerator: Option<Accelerator>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Accelerator {
    #[serde(default)]
    pub vendor: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, alias = "utilization_ratio")]
    pub utilization_ratio: Option<f64>,
    #[serde(default, alias = "vram_total_bytes")]
    pub vram_total_bytes: Option<u64>,
    #[serde(default, alias = "vram_used_bytes")]
    pub vram_used_bytes: Option<u64>,
    #[serde(default, alias = "gtt_total_bytes")]
    pub gtt_total_bytes: Option<u64>,
    #[serde(default, alias = "power_watts")]
    pub power_watts: Option<f64>,
    #[serde(default, alias = "temperature_celsius")]
    pub temperature_celsius: Option<f64>,
    #[serde(default, alias = "clock_mhz")]
    pub clock_mhz: Option<f64>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `nodeIdentities[node]`: hardware and software identity.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeIdentityInfo {
    #[serde(default, alias = "model_id")]
    pub model_id: String,
    #[serde(default, alias = "chip_id")]
    pub chip_id: String,
    #[serde(default, alias = "friendly_name")]
    pub friendly_name: String,
    #[serde(default, alias = "os_version")]
    pub os_version: String,
    #[serde(default, alias = "os_build_version")]
    pub os_build_version: String,
    #[serde(default, alias = "skulk_version")]
    pub skulk_version: String,
    #[serde(default, alias = "skulk_commit")]
    pub skulk_commit: String,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `nodeDisk[node]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NodeDisk {
    #[serde(default)]
    pub total: Memory,
    #[serde(default)]
    pub available: Memory,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `nodeRdmaCtl[node]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRdmaCtl {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default, alias = "interfaces_present")]
    pub interfaces_present: bool,
    #[serde(flatten)]
    pub extra: Extra,
}

open_enum! {
    /// `nodeHealth[node].level`.
    pub enum HealthLevel {
        Ok = "ok",
        Warn = "warn",
        Error = "error",
    }
}

/// `nodeHealth[node]`: derived health with coded reasons (`download_failed`, `disk_full`,
/// `disk_low`, `unreachable`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeHealth {
    pub level: HealthLevel,
    #[serde(default)]
    pub reasons: Vec<HealthReason>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthReason {
    pub code: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub remediation: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// Newer dialect: `nodeResources[node]`, the endpoint's live resource observation of a
/// node (backends, participation). An observation, not a promise of reachability.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeResources {
    #[serde(default)]
    pub backends: Vec<String>,
    #[serde(
        default,
        alias = "engine_builds",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub engine_builds: BTreeMap<String, String>,
    #[serde(
        default,
        alias = "hardware_classes",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub hardware_classes: Vec<String>,
    /// `full`, `management`, … (open string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participation: Option<String>,
    #[serde(
        default,
        alias = "api_available",
        skip_serializing_if = "Option::is_none"
    )]
    pub api_available: Option<bool>,
    #[serde(
        default,
        alias = "data_transport",
        skip_serializing_if = "Option::is_none"
    )]
    pub data_transport: Option<String>,
    #[serde(
        default,
        alias = "on_demand_backends",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub on_demand_backends: Vec<String>,
    #[serde(
        default,
        alias = "capability_conflicts",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub capability_conflicts: Vec<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}
