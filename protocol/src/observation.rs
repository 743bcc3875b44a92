//! Worker observations: the payload of a heartbeat (spec §5.2).
//!
//! A worker publishes one observation immediately after it connects and then
//! periodically, each with a strictly larger [`HeartbeatVersion`]. The router keeps the
//! newest per worker in the discovery registry and builds candidates from it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::candidate::{Tier, TransferCapabilities};
use crate::chunk::PrefixHash;
use crate::ids::{Epoch, HeartbeatVersion, ModelFingerprint, NodeId, RouteId, WorkerId};

/// A prefix resident in a worker's GPU page pool, advertised by heartbeat only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPrefix {
    pub model: ModelFingerprint,
    pub prefix_hash: PrefixHash,
    pub continuation_id: RouteId,
    pub token_count: u32,
    pub bytes: u64,
}

/// Page-pool occupancy, for operators (the routing inputs are `free_pages` and
/// `evictable_pages`). Every page is in exactly one of free, reserved or resident;
/// evictable and durable count resident pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PoolStats {
    pub total_pages: u32,
    pub free: u32,
    pub reserved: u32,
    pub resident: u32,
    pub evictable: u32,
    pub durable: u32,
    pub page_bytes: u64,
}

/// Bytes and chunks held in one storage tier of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TierUsage {
    pub bytes: u64,
    pub chunks: u64,
    /// 0 when the tier has no configured limit.
    pub capacity_bytes: u64,
}

/// One heartbeat's worth of worker state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawObservation")]
pub struct Observation {
    pub worker_id: WorkerId,
    pub node: NodeId,
    pub epoch: Epoch,
    pub sequence: u64,
    pub models: BTreeSet<ModelFingerprint>,
    pub online: bool,
    pub queue_ms: f64,
    pub page_size: u32,
    pub max_context: u32,
    pub free_pages: u32,
    pub evictable_pages: u32,
    pub prefill_ms_per_token: f64,
    pub first_token_ms: f64,
    pub gpu_restore_bytes_per_ms: f64,
    pub tier_throughput_bytes_per_ms: BTreeMap<Tier, f64>,
    pub tier_fixed_ms: BTreeMap<Tier, f64>,
    pub transfer: TransferCapabilities,
    pub gpu_prefixes: Vec<GpuPrefix>,
    pub object_store: bool,
    /// Requests queued or running on this worker (observability and baselines).
    pub queue_depth: u32,
    /// A draining worker takes no new offers but finishes what it has.
    pub draining: bool,
    pub pool: PoolStats,
    /// Usage of the worker's RAM, SSD and object tiers (operators' view).
    pub tiers: BTreeMap<Tier, TierUsage>,
    /// Cumulative evictions by reason since the process started.
    pub evictions: BTreeMap<String, u64>,
    /// The memory backend, e.g. `host` or `cuda: NVIDIA H200`.
    pub backend: String,
}

impl Observation {
    pub fn version(&self) -> HeartbeatVersion {
        HeartbeatVersion {
            epoch: self.epoch,
            sequence: self.sequence,
        }
    }

    /// A minimal valid observation, for tests and simple runtimes to fill in.
    pub fn new(worker: impl Into<WorkerId>, node: impl Into<NodeId>) -> Self {
        Observation {
            worker_id: worker.into(),
            node: node.into(),
            epoch: Epoch(0),
            sequence: 0,
            models: BTreeSet::new(),
            online: true,
            queue_ms: 0.0,
            page_size: 16,
            max_context: 8192,
            free_pages: 0,
            evictable_pages: 0,
            prefill_ms_per_token: 0.0,
            first_token_ms: 0.0,
            gpu_restore_bytes_per_ms: 1.0,
            tier_throughput_bytes_per_ms: BTreeMap::new(),
            tier_fixed_ms: BTreeMap::new(),
            transfer: TransferCapabilities::default(),
            gpu_prefixes: Vec::new(),
            object_store: false,
            queue_depth: 0,
            draining: false,
            pool: PoolStats::default(),
            tiers: BTreeMap::new(),
            evictions: BTreeMap::new(),
            backend: String::new(),
        }
    }
}

/// An observation that breaks a rule of §5.2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObservationError {
    #[error("observation field {0} must be a finite number ≥ 0")]
    NegativeOrNonFinite(&'static str),
    #[error("observation field {0} must be > 0")]
    NotPositive(&'static str),
    #[error("observation worker_id is empty")]
    EmptyWorker,
}

#[derive(Deserialize)]
struct RawObservation {
    worker_id: WorkerId,
    node: NodeId,
    #[serde(default)]
    epoch: Epoch,
    #[serde(default)]
    sequence: u64,
    #[serde(default)]
    models: BTreeSet<ModelFingerprint>,
    #[serde(default = "yes")]
    online: bool,
    queue_ms: f64,
    page_size: u32,
    max_context: u32,
    free_pages: u32,
    evictable_pages: u32,
    prefill_ms_per_token: f64,
    first_token_ms: f64,
    gpu_restore_bytes_per_ms: f64,
    #[serde(default)]
    tier_throughput_bytes_per_ms: BTreeMap<Tier, f64>,
    #[serde(default)]
    tier_fixed_ms: BTreeMap<Tier, f64>,
    #[serde(default)]
    transfer: TransferCapabilities,
    #[serde(default)]
    gpu_prefixes: Vec<GpuPrefix>,
    #[serde(default)]
    object_store: bool,
    #[serde(default)]
    queue_depth: u32,
    #[serde(default)]
    draining: bool,
    #[serde(default)]
    pool: PoolStats,
    #[serde(default)]
    tiers: BTreeMap<Tier, TierUsage>,
    #[serde(default)]
    evictions: BTreeMap<String, u64>,
    #[serde(default)]
    backend: String,
}

fn yes() -> bool {
    true
}

fn non_negative(name: &'static str, v: f64) -> Result<(), ObservationError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(ObservationError::NegativeOrNonFinite(name))
    }
}

fn positive(name: &'static str, v: f64) -> Result<(), ObservationError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ObservationError::NotPositive(name))
    }
}

impl TryFrom<RawObservation> for Observation {
    type Error = ObservationError;

    fn try_from(r: RawObservation) -> Result<Self, Self::Error> {
        if r.worker_id.0.is_empty() {
            return Err(ObservationError::EmptyWorker);
        }
        non_negative("queue_ms", r.queue_ms)?;
        non_negative("prefill_ms_per_token", r.prefill_ms_per_token)?;
        non_negative("first_token_ms", r.first_token_ms)?;
        positive("gpu_restore_bytes_per_ms", r.gpu_restore_bytes_per_ms)?;
        positive("page_size", r.page_size as f64)?;
        positive("max_context", r.max_context as f64)?;
        for v in r.tier_throughput_bytes_per_ms.values() {
            positive("tier_throughput_bytes_per_ms", *v)?;
        }
        for v in r.tier_fixed_ms.values() {
            non_negative("tier_fixed_ms", *v)?;
        }
        Ok(Observation {
            worker_id: r.worker_id,
            node: r.node,
            epoch: r.epoch,
            sequence: r.sequence,
            models: r.models,
            online: r.online,
            queue_ms: r.queue_ms,
            page_size: r.page_size,
            max_context: r.max_context,
            free_pages: r.free_pages,
            evictable_pages: r.evictable_pages,
            prefill_ms_per_token: r.prefill_ms_per_token,
            first_token_ms: r.first_token_ms,
            gpu_restore_bytes_per_ms: r.gpu_restore_bytes_per_ms,
            tier_throughput_bytes_per_ms: r.tier_throughput_bytes_per_ms,
            tier_fixed_ms: r.tier_fixed_ms,
            transfer: r.transfer,
            gpu_prefixes: r.gpu_prefixes,
            object_store: r.object_store,
            queue_depth: r.queue_depth,
            draining: r.draining,
            pool: r.pool,
            tiers: r.tiers,
            evictions: r.evictions,
            backend: r.backend,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_negative_costs() {
        let mut o = Observation::new("w", "n");
        o.tier_throughput_bytes_per_ms.insert(Tier::Ssd, 1000.0);
        let json = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<Observation>(&json).unwrap(), o);
        let bad = json.replace(r#""queue_ms":0.0"#, r#""queue_ms":-1.0"#);
        let err = serde_json::from_str::<Observation>(&bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("queue_ms"), "{err}");
    }
}
