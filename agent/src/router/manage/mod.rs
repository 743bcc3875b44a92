//! den's management API on the router, in the newer Skulk dialect (see
//! `skulk-api-1.3.0.md` for the shapes and the integration guide for the contract).
//!
//! - [`catalog`]: the model catalog (`--catalog DIR` of TOML cards).
//! - [`Manager`]: the management state, owned by the router actor and driven like the
//!   other machines there (inputs with the actor's logical time and the wall clock,
//!   effects to interpret): instances with their shard assignments, command outcomes,
//!   terminal failure records, the workers' download and runner reports (from their
//!   heartbeats) and the inference each instance served.
//! - [`http`]: the endpoints (`GET /node_id`, `GET /state`, `GET /instance/previews`,
//!   `POST /instance`, `GET|DELETE /instance/{id}`, `GET /models/requirements`,
//!   `GET /models`), all behind the router's token.
//!
//! Decisions where the guide is silent:
//! - A den node is a worker (its worker id is the node id in `/state`); the router is a
//!   node too (its `--name`), which runs no runner.
//! - An instance has exactly one runner on one node, serving every layer (one pipeline
//!   shard); a worker runs at most one runner at a time (a preview for a busy worker is
//!   refused `runner_busy`).
//! - `POST /instance` checks the card (equal to the catalog's), that the node is live
//!   and free and that its KV budget holds at least one page of the card, then answers
//!   at once. The command is `Pending` until the worker's heartbeat lists the runner
//!   (`Applied`), or `Rejected` when the worker went away before that.
//! - `DELETE /instance/{id}` removes the instance at once and tears its runner down; the
//!   command is `Applied` when the worker no longer lists the runner. It stops nothing
//!   else: the host keeps running and downloaded artifacts stay installed.
//! - A runner that fails leaves its instance in place with a `RunnerFailed` status and an
//!   `instanceFailures` record (the first failure is kept); delete and place again to
//!   retry, which starts a new download attempt unless the artifact is installed.
//! - After a router restart, runners that workers still report are adopted as instances
//!   (their cards are looked up by digest), so a restart does not orphan memory.

pub mod catalog;
mod commands;
pub mod gguf_cards;
pub mod http;
pub mod ids;
mod preview;
mod reconcile;
mod view;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::oneshot;

use den_protocol::ids::{ModelFingerprint, NodeId, WorkerId};
use den_protocol::observation::{DownloadReport, PoolStats, RunnerPool, RunnerReport, RunnerStage};
use den_protocol::skulk::api::{
    CreateInstanceRequest, CreateInstanceResponse, DeleteInstanceResponse, PreviewsResponse,
};
use den_protocol::skulk::{
    CommandId, CommandStatus, Instance, InstanceFailure, InstanceId, InstanceInference, ModelId,
    RunnerId, ShardAssignments, State,
};
use den_protocol::time::Millis;

pub use catalog::{Card, CardError, ModelCatalog};
pub use ids::{IdGen, iso8601, unix_now_ms};
pub use preview::PreviewQuery;

/// The instance kind den's router creates (`{"DenInstance": {…}}`): `instanceId`,
/// `shardAssignments`, `contextTokenLimit`.
pub const INSTANCE_TAG: &str = "DenInstance";

/// How often an unanswered place/remove frame is sent again (on heartbeats).
const RESEND_AFTER_MS: u64 = 2_000;
/// Finished command records and failure records kept (oldest forgotten first).
pub const RETAINED_RECORDS: usize = 1024;

/// What the HTTP layer asks the router actor.
pub enum Request {
    State {
        reply: oneshot::Sender<State>,
    },
    Previews {
        query: PreviewQuery,
        reply: oneshot::Sender<PreviewsResponse>,
    },
    Create {
        body: Box<CreateInstanceRequest>,
        reply: oneshot::Sender<Result<CreateInstanceResponse, Refusal>>,
    },
    Delete {
        instance: InstanceId,
        reply: oneshot::Sender<Result<DeleteInstanceResponse, Refusal>>,
    },
    Get {
        instance: InstanceId,
        reply: oneshot::Sender<Option<Instance>>,
    },
}

/// A refused management request: nothing happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    /// Stable category (`model_unknown`, `node_unavailable`, `runner_busy`, …).
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(status: u16, code: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            code,
            message: message.into(),
        }
    }
}

/// Settings of the management state.
#[derive(Debug, Clone)]
pub struct ManageConfig {
    /// The router's node id (`GET /node_id`).
    pub node: NodeId,
    /// A worker whose newest heartbeat is older than this is not reported live.
    pub heartbeat_timeout_ms: u64,
    /// Seeds ids (distinct per process).
    pub id_seed: String,
}

/// What the manager remembers of one live worker (from its newest heartbeat).
#[derive(Debug, Clone)]
pub(crate) struct WorkerView {
    pub backend: String,
    pub page_size: u32,
    pub kv_budget_bytes: u64,
    pub draining: bool,
    pub pool: PoolStats,
    pub downloads: Vec<DownloadReport>,
    pub runners: Vec<RunnerReport>,
    pub heartbeat_at: Millis,
    pub heartbeat_unix_ms: u64,
}

impl WorkerView {
    pub fn runner(&self, id: &RunnerId) -> Option<&RunnerReport> {
        self.runners.iter().find(|r| &r.runner_id == id)
    }

    /// `host` or `cuda` (the backend description starts with it).
    pub fn backend_kind(&self) -> &str {
        if self.backend.starts_with("cuda") {
            "cuda"
        } else {
            "host"
        }
    }
}

/// One placed instance.
#[derive(Debug, Clone)]
pub(crate) struct InstanceRecord {
    pub model_id: ModelId,
    pub digest: String,
    pub worker: WorkerId,
    pub runner: RunnerId,
    pub assignments: ShardAssignments,
    pub context_token_limit: Option<u64>,
    pub command: Option<CommandId>,
    /// The worker's heartbeat listed the runner.
    pub acknowledged: bool,
    pub last_sent: Option<Millis>,
}

/// A runner being torn down.
#[derive(Debug, Clone)]
pub(crate) struct Removal {
    pub worker: WorkerId,
    pub instance: InstanceId,
    pub command: CommandId,
    pub last_sent: Millis,
}

/// The management state. See the module documentation.
pub struct Manager {
    config: ManageConfig,
    catalog: Arc<ModelCatalog>,
    ids: IdGen,
    pub(crate) workers: BTreeMap<WorkerId, WorkerView>,
    pub(crate) instances: BTreeMap<InstanceId, InstanceRecord>,
    pub(crate) removals: BTreeMap<RunnerId, Removal>,
    pub(crate) commands: BTreeMap<CommandId, CommandStatus>,
    pub(crate) failures: BTreeMap<InstanceId, InstanceFailure>,
    pub(crate) inference: BTreeMap<InstanceId, InstanceInference>,
    /// Commands in the order they were issued (`lastEventAppliedIdx`).
    pub(crate) applied: i64,
    /// Command and failure ids in the order they were recorded, for retention.
    command_order: VecDeque<CommandId>,
    failure_order: VecDeque<InstanceId>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DenInstance<'a> {
    instance_id: &'a InstanceId,
    shard_assignments: &'a ShardAssignments,
    context_token_limit: Option<u64>,
}

impl Manager {
    pub fn new(config: ManageConfig, catalog: Arc<ModelCatalog>) -> Manager {
        let ids = IdGen::new(&config.id_seed);
        Manager {
            config,
            catalog,
            ids,
            workers: BTreeMap::new(),
            instances: BTreeMap::new(),
            removals: BTreeMap::new(),
            commands: BTreeMap::new(),
            failures: BTreeMap::new(),
            inference: BTreeMap::new(),
            applied: -1,
            command_order: VecDeque::new(),
            failure_order: VecDeque::new(),
        }
    }

    pub fn catalog(&self) -> &Arc<ModelCatalog> {
        &self.catalog
    }

    pub fn node(&self) -> &NodeId {
        &self.config.node
    }

    /// `GET /instance/{id}`: the tagged instance.
    pub fn instance(&self, id: &InstanceId) -> Option<Instance> {
        self.instances.get(id).map(|r| instance_value(id, r))
    }

    /// A request completed (`ok`) or failed on `worker` for `model`: counted for the
    /// instance whose ready runner there serves that fingerprint, which is returned.
    pub fn served(
        &mut self,
        worker: &WorkerId,
        model: &ModelFingerprint,
        ok: bool,
        unix_ms: u64,
    ) -> Option<InstanceId> {
        let view = self.workers.get(worker)?;
        let (id, rec) = self.instances.iter().find(|(_, r)| {
            &r.worker == worker
                && self
                    .catalog
                    .by_digest(&r.digest)
                    .is_some_and(|c| &c.fingerprint == model)
                && view
                    .runner(&r.runner)
                    .is_some_and(|x| matches!(x.stage, RunnerStage::Ready | RunnerStage::Running))
        })?;
        let entry = self.inference.entry(id.clone()).or_default();
        if entry.runner_id.as_ref() != Some(&rec.runner) {
            *entry = InstanceInference {
                runner_id: Some(rec.runner.clone()),
                ..InstanceInference::default()
            };
        }
        if ok {
            entry.completed += 1;
            entry.last_completed_at = Some(iso8601(unix_ms));
        } else {
            entry.failed += 1;
        }
        Some(id.clone())
    }

    /// Every placed instance and the fingerprint of the model its card names.
    pub fn instance_models(&self) -> std::collections::BTreeMap<String, ModelFingerprint> {
        self.instances
            .iter()
            .filter_map(|(id, r)| {
                let card = self.catalog.by_digest(&r.digest)?;
                Some((id.as_str().to_owned(), card.fingerprint.clone()))
            })
            .collect()
    }

    /// The worker that runs `instance`.
    pub fn worker_of(&self, instance: &InstanceId) -> Option<WorkerId> {
        self.instances.get(instance).map(|r| r.worker.clone())
    }

    /// The catalog model id served under `fingerprint`, with the smallest context limit
    /// of its ready runners (the ingress lists catalog models by their id).
    pub fn served_model(&self, fingerprint: &ModelFingerprint) -> Option<(ModelId, Option<u64>)> {
        let card = self.catalog.by_fingerprint(fingerprint)?;
        let limit = self
            .instances
            .values()
            .filter(|r| r.digest == card.digest)
            .filter_map(|r| {
                let view = self.workers.get(&r.worker)?;
                let pool: &RunnerPool = view.runner(&r.runner)?.pool.as_ref()?;
                Some(pool.context_tokens)
            })
            .min();
        Some((card.model_id.clone(), limit))
    }

    /// The worker's view when its newest heartbeat is fresh.
    pub(crate) fn live(&self, now: Millis, worker: &WorkerId) -> Option<&WorkerView> {
        self.workers
            .get(worker)
            .filter(|v| now.since(v.heartbeat_at) <= self.config.heartbeat_timeout_ms)
    }

    /// Why `worker` cannot take another runner, if it cannot.
    pub(crate) fn busy(&self, worker: &WorkerId) -> Option<String> {
        if let Some((id, r)) = self.instances.iter().find(|(_, r)| &r.worker == worker) {
            return Some(format!(
                "worker {worker} already runs runner {} of instance {id} (one runner per worker): delete it first",
                r.runner
            ));
        }
        if let Some((runner, _)) = self.removals.iter().find(|(_, r)| &r.worker == worker) {
            return Some(format!(
                "worker {worker} is still tearing runner {runner} down; try again shortly"
            ));
        }
        let view = self.workers.get(worker)?;
        view.runners
            .iter()
            .find(|r| r.stage != RunnerStage::ShuttingDown)
            .map(|r| format!("worker {worker} still runs runner {}", r.runner_id))
    }

    pub(crate) fn next_id(&mut self) -> String {
        self.ids.next_id()
    }
}

/// The tagged instance value of a record.
pub(crate) fn instance_value(id: &InstanceId, rec: &InstanceRecord) -> Instance {
    den_instance(id, &rec.assignments, rec.context_token_limit)
}

pub(crate) fn den_instance(
    id: &InstanceId,
    assignments: &ShardAssignments,
    context_token_limit: Option<u64>,
) -> Instance {
    let value = serde_json::to_value(DenInstance {
        instance_id: id,
        shard_assignments: assignments,
        context_token_limit,
    })
    .unwrap_or(Value::Null);
    Instance::Unknown {
        tag: INSTANCE_TAG.to_owned(),
        value,
    }
}

fn failure(
    id: &InstanceId,
    rec: &InstanceRecord,
    message: &str,
    code: &str,
    attempt: Option<den_protocol::skulk::AttemptId>,
    unix_ms: u64,
) -> InstanceFailure {
    InstanceFailure {
        instance_id: id.clone(),
        model_id: Some(rec.model_id.clone()),
        message: message.to_owned(),
        error_code: Some(code.to_owned()),
        node_id: Some(NodeId::new(rec.worker.as_str())),
        runner_id: Some(rec.runner.clone()),
        attempt_id: attempt,
        failed_at: Some(iso8601(unix_ms)),
        extra: Default::default(),
    }
}

#[cfg(test)]
mod tests;
