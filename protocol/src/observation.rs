//! Worker observations: the payload of a heartbeat (spec §5.2).
//!
//! A worker publishes one observation immediately after it connects and then
//! periodically, each with a strictly larger [`HeartbeatVersion`]. The router keeps the
//! newest per worker in the discovery registry and builds candidates from it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::candidate::{Tier, TransferCapabilities};
use crate::chunk::PrefixHash;
use crate::engine_plan::{EnginePlan, StepCosts};
use crate::ids::{Epoch, HeartbeatVersion, ModelFingerprint, NodeId, RouteId, WorkerId};
use crate::skulk::{AttemptId, InstanceId, ModelId, RunnerId};

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
    /// Transfer time already booked ahead on the link a load from each tier uses, ms:
    /// what a new load from that tier waits behind (`Ram`/`Ssd`/`Object`: the worker's
    /// restore fetches from it; `Gpu`: host→device copies). Absent: idle.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub link_backlog_ms: BTreeMap<Tier, f64>,
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
    /// Bytes a runner's KV page pool may take (management API; 0: no runners).
    pub kv_budget_bytes: u64,
    /// Download attempts of model artifacts, newest last (management API).
    pub downloads: Vec<DownloadReport>,
    /// Runners of placed model instances (management API).
    pub runners: Vec<RunnerReport>,
    /// A batching engine's scheduler state and measured step costs: the router prices
    /// candidates by replaying it ([`crate::engine_plan`]) instead of `queue_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EnginePlan>,
}

/// One download attempt of a model artifact. Its id is unique; the transient and the
/// terminal reports of one attempt share it, and a terminal report never changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DownloadReport {
    pub attempt_id: AttemptId,
    pub model_id: ModelId,
    pub card_digest: String,
    /// The instance whose placement started it (`None` for an installation found on disk
    /// at start, reported with the attempt id that installed it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<InstanceId>,
    pub stage: DownloadStage,
    #[serde(default)]
    pub bytes_done: u64,
    #[serde(default)]
    pub bytes_total: u64,
    #[serde(default)]
    pub files_done: u32,
    #[serde(default)]
    pub files_total: u32,
    /// Bytes per second of this attempt so far.
    #[serde(default)]
    pub bytes_per_s: f64,
    /// Where the artifact is (or will be) installed on the worker.
    #[serde(default)]
    pub directory: String,
}

/// Where a download attempt is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "stage", rename_all = "kebab-case")]
pub enum DownloadStage {
    /// Accepted, not started.
    Pending,
    /// Fetching files.
    Ongoing,
    /// Every file verified, installation finalized.
    Completed,
    /// This attempt failed; `reason` is one line.
    Failed { reason: String },
}

impl DownloadStage {
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            DownloadStage::Completed | DownloadStage::Failed { .. }
        )
    }
}

/// One runner of a placed instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunnerReport {
    pub runner_id: RunnerId,
    pub instance_id: InstanceId,
    pub model_id: ModelId,
    pub card_digest: String,
    pub stage: RunnerStage,
    /// The download attempt whose installation the runner loads (an earlier one when the
    /// artifact was already installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<AttemptId>,
    /// The runner's memory once loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<RunnerPool>,
}

/// The lifecycle of a runner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "stage", rename_all = "kebab-case")]
pub enum RunnerStage {
    /// Waiting for its artifact's download.
    Waiting,
    Loading {
        layers_loaded: u64,
        total_layers: u64,
    },
    Ready,
    /// Ready and serving at least one request.
    Running,
    /// `code` is a stable category (`download_failed`, `load_failed`, `runner_busy`, …).
    Failed {
        message: String,
        code: String,
    },
    ShuttingDown,
}

/// The memory a loaded runner holds: its weights and its KV page pool, sized from the
/// card's KV bytes per token and the worker's KV budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RunnerPool {
    pub weights_bytes: u64,
    pub pages: u32,
    pub page_size: u32,
    pub page_bytes: u64,
    /// Tokens the pool holds for one sequence, capped by the card's context length.
    pub context_tokens: u64,
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
            link_backlog_ms: BTreeMap::new(),
            transfer: TransferCapabilities::default(),
            gpu_prefixes: Vec::new(),
            object_store: false,
            queue_depth: 0,
            draining: false,
            pool: PoolStats::default(),
            tiers: BTreeMap::new(),
            evictions: BTreeMap::new(),
            backend: String::new(),
            kv_budget_bytes: 0,
            downloads: Vec::new(),
            runners: Vec::new(),
            engine: None,
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
    #[error("observation {0}")]
    Management(String),
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
    link_backlog_ms: BTreeMap<Tier, f64>,
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
    #[serde(default)]
    kv_budget_bytes: u64,
    #[serde(default)]
    downloads: Vec<DownloadReport>,
    #[serde(default)]
    runners: Vec<RunnerReport>,
    #[serde(default)]
    engine: Option<EnginePlan>,
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
        for v in r.link_backlog_ms.values() {
            non_negative("link_backlog_ms", *v)?;
        }
        validate_management(&r.downloads, &r.runners)?;
        if let Some(plan) = &r.engine {
            validate_engine(plan)?;
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
            link_backlog_ms: r.link_backlog_ms,
            transfer: r.transfer,
            gpu_prefixes: r.gpu_prefixes,
            object_store: r.object_store,
            queue_depth: r.queue_depth,
            draining: r.draining,
            pool: r.pool,
            tiers: r.tiers,
            evictions: r.evictions,
            backend: r.backend,
            kv_budget_bytes: r.kv_budget_bytes,
            downloads: r.downloads,
            runners: r.runners,
            engine: r.engine,
        })
    }
}

/// Most pending prefills an engine plan may list: the router replays it for every
/// candidate of every request, so its size is bounded like any network input.
pub const MAX_PLAN_PENDING: usize = 1024;

/// An engine plan: finite, non-negative numbers, a positive step budget, a bounded list.
fn validate_engine(plan: &EnginePlan) -> Result<(), ObservationError> {
    let bad = |what: String| Err(ObservationError::Management(what));
    if plan.max_batched_tokens == 0 {
        return bad("engine.max_batched_tokens must be > 0".into());
    }
    if plan.pending.len() > MAX_PLAN_PENDING {
        return bad(format!(
            "engine.pending lists {} requests, at most {MAX_PLAN_PENDING}",
            plan.pending.len()
        ));
    }
    non_negative("engine.step_remaining_ms", plan.step_remaining_ms)?;
    positive("engine.step_calibration", plan.step_calibration)?;
    let costs: &[f64] = match &plan.costs {
        StepCosts::Batched {
            row_us,
            weights_pass_us,
            attention_us_per_position,
            context_us_per_token,
        } => &[
            *row_us,
            *weights_pass_us,
            *attention_us_per_position,
            *context_us_per_token,
        ],
        StepCosts::Fitted {
            step_us,
            row_us,
            attention_us_per_position,
            context_us_per_token,
        } => &[
            *step_us,
            *row_us,
            *attention_us_per_position,
            *context_us_per_token,
        ],
        StepCosts::Synthetic {
            prefill_us_per_token,
            decode_us_per_step,
            first_token_us,
        } => &[*prefill_us_per_token, *decode_us_per_step, *first_token_us],
    };
    for c in costs {
        non_negative("engine.costs", *c)?;
    }
    for p in &plan.pending {
        non_negative("engine.pending.ready_in_ms", p.ready_in_ms)?;
    }
    Ok(())
}

/// Download and runner reports: ids present, byte counts consistent, rates finite.
fn validate_management(
    downloads: &[DownloadReport],
    runners: &[RunnerReport],
) -> Result<(), ObservationError> {
    let bad = |what: String| Err(ObservationError::Management(what));
    for d in downloads {
        if d.attempt_id.as_str().is_empty() || d.model_id.as_str().is_empty() {
            return bad("downloads: attempt_id and model_id must not be empty".into());
        }
        if d.bytes_done > d.bytes_total {
            return bad(format!(
                "downloads: attempt {} has {} of {} bytes",
                d.attempt_id, d.bytes_done, d.bytes_total
            ));
        }
        if !(d.bytes_per_s.is_finite() && d.bytes_per_s >= 0.0) {
            return bad(format!(
                "downloads: attempt {} rate must be a finite number ≥ 0",
                d.attempt_id
            ));
        }
    }
    for r in runners {
        if r.runner_id.as_str().is_empty() || r.instance_id.as_str().is_empty() {
            return bad("runners: runner_id and instance_id must not be empty".into());
        }
        if let RunnerStage::Loading {
            layers_loaded,
            total_layers,
        } = r.stage
            && layers_loaded > total_layers
        {
            return bad(format!(
                "runners: runner {} loaded {layers_loaded} of {total_layers} layers",
                r.runner_id
            ));
        }
    }
    Ok(())
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
        // A link backlog travels when set, is absent when idle, and is never negative.
        assert!(!json.contains("link_backlog_ms"), "{json}");
        o.link_backlog_ms.insert(Tier::Ssd, 12.5);
        let json = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<Observation>(&json).unwrap(), o);
        let bad = json.replace(r#""ssd":12.5"#, r#""ssd":-1.0"#);
        let err = serde_json::from_str::<Observation>(&bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("link_backlog_ms"), "{err}");
    }

    #[test]
    fn management_reports_round_trip_and_are_validated() {
        let mut o = Observation::new("w", "n");
        o.kv_budget_bytes = 1 << 20;
        o.downloads.push(DownloadReport {
            attempt_id: "a1".into(),
            model_id: "den/tiny".into(),
            card_digest: "d".into(),
            instance_id: Some("i1".into()),
            stage: DownloadStage::Failed {
                reason: "checksum mismatch".into(),
            },
            bytes_done: 5,
            bytes_total: 10,
            files_done: 0,
            files_total: 1,
            bytes_per_s: 1.5,
            directory: "/d".into(),
        });
        o.runners.push(RunnerReport {
            runner_id: "r1".into(),
            instance_id: "i1".into(),
            model_id: "den/tiny".into(),
            card_digest: "d".into(),
            stage: RunnerStage::Loading {
                layers_loaded: 1,
                total_layers: 4,
            },
            attempt_id: None,
            pool: None,
        });
        let json = serde_json::to_string(&o).unwrap();
        assert!(json.contains(r#""stage":"failed""#), "{json}");
        assert_eq!(serde_json::from_str::<Observation>(&json).unwrap(), o);
        // Older workers send neither list: defaults.
        let plain = serde_json::to_value(Observation::new("w", "n")).unwrap();
        let mut old = plain.as_object().unwrap().clone();
        old.remove("downloads");
        old.remove("runners");
        old.remove("kv_budget_bytes");
        let parsed: Observation = serde_json::from_value(old.into()).unwrap();
        assert!(parsed.downloads.is_empty() && parsed.runners.is_empty());
        let bad = json.replace(r#""bytes_done":5"#, r#""bytes_done":50"#);
        let err = serde_json::from_str::<Observation>(&bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("50 of 10"), "{err}");
    }
}
