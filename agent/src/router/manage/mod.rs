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
pub mod http;
pub mod ids;
mod preview;
mod view;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::oneshot;

use den_protocol::ids::{ModelFingerprint, NodeId, WorkerId};
use den_protocol::observation::{
    DownloadReport, Observation, PoolStats, RunnerPool, RunnerReport, RunnerStage,
};
use den_protocol::skulk::api::{
    CreateInstanceRequest, CreateInstanceResponse, DeleteInstanceResponse, PreviewsResponse,
};
use den_protocol::skulk::runner::NoFields;
use den_protocol::skulk::state::CommandRejected;
use den_protocol::skulk::{
    CommandId, CommandOutcome, CommandStatus, Instance, InstanceFailure, InstanceId,
    InstanceInference, ModelId, RunnerId, ShardAssignments, State,
};
use den_protocol::time::Millis;
use den_protocol::wire::{Control, ControlToWorker, PlaceRunner, RemoveRunner};

pub use catalog::{Card, CardError, Catalog};
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
    catalog: Arc<Catalog>,
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
    pub fn new(config: ManageConfig, catalog: Arc<Catalog>) -> Manager {
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

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn node(&self) -> &NodeId {
        &self.config.node
    }

    /// A worker's newest accepted heartbeat. Returns the frames to send.
    pub fn observe(
        &mut self,
        now: Millis,
        unix_ms: u64,
        obs: &Observation,
    ) -> Vec<ControlToWorker> {
        let worker = obs.worker_id.clone();
        self.workers.insert(
            worker.clone(),
            WorkerView {
                backend: obs.backend.clone(),
                page_size: obs.page_size,
                kv_budget_bytes: obs.kv_budget_bytes,
                draining: obs.draining,
                pool: obs.pool,
                downloads: obs.downloads.clone(),
                runners: obs.runners.clone(),
                heartbeat_at: now,
                heartbeat_unix_ms: unix_ms,
            },
        );
        let mut out = Vec::new();
        self.reconcile_instances(now, unix_ms, &worker, &mut out);
        self.reconcile_removals(now, &worker, &mut out);
        self.adopt(&worker);
        out
    }

    fn reconcile_instances(
        &mut self,
        now: Millis,
        unix_ms: u64,
        worker: &WorkerId,
        out: &mut Vec<ControlToWorker>,
    ) {
        let Some(view) = self.workers.get(worker) else {
            return;
        };
        let mut failed: Vec<(InstanceId, InstanceFailure)> = Vec::new();
        let mut applied: Vec<CommandId> = Vec::new();
        let mut resend: Vec<InstanceId> = Vec::new();
        for (id, rec) in self
            .instances
            .iter_mut()
            .filter(|(_, r)| &r.worker == worker)
        {
            match view.runner(&rec.runner) {
                Some(report) => {
                    if !rec.acknowledged {
                        rec.acknowledged = true;
                        applied.extend(rec.command.clone());
                    }
                    if let RunnerStage::Failed { message, code } = &report.stage {
                        failed.push((
                            id.clone(),
                            failure(id, rec, message, code, report.attempt_id.clone(), unix_ms),
                        ));
                    }
                }
                None if rec.acknowledged => {
                    let message = format!(
                        "runner {} is gone from worker {worker} (the worker restarted or dropped it)",
                        rec.runner
                    );
                    failed.push((
                        id.clone(),
                        failure(id, rec, &message, "runner_lost", None, unix_ms),
                    ));
                }
                None => {
                    let due = rec
                        .last_sent
                        .is_none_or(|t| now.since(t) >= RESEND_AFTER_MS);
                    if due {
                        resend.push(id.clone());
                    }
                }
            }
        }
        for command in applied {
            self.set_outcome(&command, CommandOutcome::Applied(NoFields::default()));
        }
        for (id, f) in failed {
            self.record_failure(id, f);
        }
        for id in resend {
            if let Some(frame) = self.place_frame(&id) {
                out.push(frame);
                if let Some(rec) = self.instances.get_mut(&id) {
                    rec.last_sent = Some(now);
                }
            }
        }
    }

    fn reconcile_removals(
        &mut self,
        now: Millis,
        worker: &WorkerId,
        out: &mut Vec<ControlToWorker>,
    ) {
        let Some(view) = self.workers.get(worker) else {
            return;
        };
        let mut done = Vec::new();
        for (runner, removal) in self
            .removals
            .iter_mut()
            .filter(|(_, r)| &r.worker == worker)
        {
            if view.runner(runner).is_none() {
                done.push(runner.clone());
            } else if now.since(removal.last_sent) >= RESEND_AFTER_MS {
                removal.last_sent = now;
                out.push(ControlToWorker {
                    to: worker.clone(),
                    control: Control::RemoveRunner(RemoveRunner {
                        instance_id: removal.instance.clone(),
                        runner_id: runner.clone(),
                    }),
                });
            }
        }
        for runner in done {
            if let Some(removal) = self.removals.remove(&runner) {
                self.set_outcome(
                    &removal.command,
                    CommandOutcome::Applied(NoFields::default()),
                );
            }
        }
    }

    /// Runners a worker reports that no instance or removal knows (a restarted router):
    /// adopted as instances when their card is in the catalog.
    fn adopt(&mut self, worker: &WorkerId) {
        let Some(view) = self.workers.get(worker) else {
            return;
        };
        let known = |r: &RunnerReport| {
            self.removals.contains_key(&r.runner_id)
                || self.instances.values().any(|i| i.runner == r.runner_id)
                || self.instances.contains_key(&r.instance_id)
        };
        let orphans: Vec<RunnerReport> = view
            .runners
            .iter()
            .filter(|r| !known(r) && r.stage != RunnerStage::ShuttingDown)
            .cloned()
            .collect();
        let backend = view.backend_kind().to_owned();
        let budget = view.kv_budget_bytes;
        let page_size = view.page_size;
        for r in orphans {
            let Some(card) = self.catalog.by_digest(&r.card_digest).cloned() else {
                tracing::warn!(%worker, runner = %r.runner_id, "a worker runs a runner whose card is not in the catalog; leaving it alone");
                continue;
            };
            let node = NodeId::new(worker.as_str());
            let assignments = preview::assignments(&card, &node, &r.runner_id, &backend);
            tracing::info!(%worker, runner = %r.runner_id, instance = %r.instance_id, "adopting a runner the worker still runs");
            self.instances.insert(
                r.instance_id.clone(),
                InstanceRecord {
                    model_id: card.model_id.clone(),
                    digest: card.digest.clone(),
                    worker: worker.clone(),
                    runner: r.runner_id.clone(),
                    assignments,
                    context_token_limit: preview::context_limit(&card, budget, page_size),
                    command: None,
                    acknowledged: true,
                    last_sent: None,
                },
            );
        }
    }

    /// A worker was detached (expired, disconnected, refused).
    pub fn worker_gone(&mut self, unix_ms: u64, worker: &WorkerId) {
        self.workers.remove(worker);
        let lost: Vec<InstanceId> = self
            .instances
            .iter()
            .filter(|(_, r)| &r.worker == worker && !r.acknowledged)
            .map(|(id, _)| id.clone())
            .collect();
        for id in lost {
            let Some(rec) = self.instances.remove(&id) else {
                continue;
            };
            let message = format!(
                "worker {worker} went away before it took runner {} of instance {id}",
                rec.runner
            );
            if let Some(command) = &rec.command {
                self.set_outcome(
                    command,
                    CommandOutcome::Rejected(CommandRejected {
                        message: message.clone(),
                        extra: BTreeMap::new(),
                    }),
                );
            }
            let f = failure(&id, &rec, &message, "node_unavailable", None, unix_ms);
            self.record_failure(id, f);
        }
    }

    /// `POST /instance`.
    pub fn create(
        &mut self,
        now: Millis,
        body: CreateInstanceRequest,
    ) -> Result<(CreateInstanceResponse, Vec<ControlToWorker>), Refusal> {
        let core = body.instance.core().ok_or_else(|| {
            Refusal::new(
                400,
                "invalid_instance",
                format!(
                    "the {} instance carries no readable instanceId and shardAssignments",
                    body.instance.tag()
                ),
            )
        })?;
        let id = core.instance_id.clone();
        if id.as_str().trim().is_empty() {
            return Err(Refusal::new(400, "invalid_instance", "instanceId is empty"));
        }
        if self.instances.contains_key(&id) {
            return Err(Refusal::new(
                409,
                "instance_exists",
                format!("instance {id} already exists: delete it first or request a fresh preview"),
            ));
        }
        let assignments = core.shard_assignments;
        let card = self
            .catalog
            .get(&assignments.model_id)
            .cloned()
            .ok_or_else(|| {
                Refusal::new(
                    400,
                    "model_unknown",
                    format!(
                        "model {} is not in the catalog (it has: {})",
                        assignments.model_id,
                        self.catalog.ids()
                    ),
                )
            })?;
        let mut nodes = assignments.node_to_runner.iter();
        let (node, runner) = match (nodes.next(), nodes.next()) {
            (Some((n, r)), None) => (n.clone(), r.clone()),
            _ => {
                return Err(Refusal::new(
                    400,
                    "invalid_instance",
                    format!(
                        "den runs an instance on exactly one node; nodeToRunner has {} entries",
                        assignments.node_to_runner.len()
                    ),
                ));
            }
        };
        if runner.as_str().trim().is_empty() {
            return Err(Refusal::new(
                400,
                "invalid_instance",
                "the runner id is empty",
            ));
        }
        let Some(shard) = assignments.runner_to_shard.get(&runner) else {
            return Err(Refusal::new(
                400,
                "invalid_instance",
                format!("runner {runner} has no entry in runnerToShard"),
            ));
        };
        let expected = card.model_card();
        if shard.card() != Some(&expected) {
            return Err(Refusal::new(
                400,
                "card_mismatch",
                format!(
                    "the shard's card for {} is not the catalog's card (digest {}): request a fresh preview",
                    card.model_id, card.digest
                ),
            ));
        }
        if self.instances.values().any(|r| r.runner == runner)
            || self.removals.contains_key(&runner)
        {
            return Err(Refusal::new(
                409,
                "runner_exists",
                format!("runner {runner} already exists: request a fresh preview"),
            ));
        }
        let worker = WorkerId::new(node.as_str());
        let view = self.live(now, &worker).ok_or_else(|| {
            Refusal::new(
                400,
                "node_unavailable",
                format!("node {node} is not a live worker of this router"),
            )
        })?;
        if let Some(busy) = self.busy(&worker) {
            return Err(Refusal::new(409, "runner_busy", busy));
        }
        let Some(limit) = preview::context_limit(&card, view.kv_budget_bytes, view.page_size)
        else {
            return Err(Refusal::new(
                400,
                "insufficient_memory",
                preview::memory_message(&card, view),
            ));
        };
        let command = self.new_command("CreateInstance", &id);
        self.instances.insert(
            id.clone(),
            InstanceRecord {
                model_id: card.model_id.clone(),
                digest: card.digest.clone(),
                worker: worker.clone(),
                runner: runner.clone(),
                assignments,
                context_token_limit: Some(limit),
                command: Some(command.clone()),
                acknowledged: false,
                last_sent: Some(now),
            },
        );
        // A fresh failure record would otherwise shadow this placement's.
        if self.failures.remove(&id).is_some() {
            self.failure_order.retain(|f| f != &id);
        }
        let frames = self.place_frame(&id).into_iter().collect();
        Ok((
            CreateInstanceResponse {
                message: format!(
                    "Command received: runner {runner} of instance {id} is being placed on {node}; watch GET /state for its download, runner and this command's outcome."
                ),
                command_id: command,
                instance_id: Some(id),
                model_card: Some(expected),
                extra: BTreeMap::new(),
            },
            frames,
        ))
    }

    /// `DELETE /instance/{id}`.
    pub fn delete(
        &mut self,
        now: Millis,
        id: &InstanceId,
    ) -> Result<(DeleteInstanceResponse, Vec<ControlToWorker>), Refusal> {
        let rec = self.instances.remove(id).ok_or_else(|| {
            Refusal::new(404, "instance_unknown", format!("Instance not found: {id}"))
        })?;
        self.inference.remove(id);
        let command = self.new_command("DeleteInstance", id);
        // The placement never got to run: its command is rejected, not pending forever.
        if let Some(placed) = &rec.command
            && !rec.acknowledged
            && self
                .commands
                .get(placed)
                .is_some_and(|c| matches!(c.outcome, CommandOutcome::Pending(_)))
        {
            self.set_outcome(
                placed,
                CommandOutcome::Rejected(CommandRejected {
                    message: format!("instance {id} was deleted before its runner started"),
                    extra: BTreeMap::new(),
                }),
            );
        }
        self.removals.insert(
            rec.runner.clone(),
            Removal {
                worker: rec.worker.clone(),
                instance: id.clone(),
                command: command.clone(),
                last_sent: now,
            },
        );
        let frame = ControlToWorker {
            to: rec.worker.clone(),
            control: Control::RemoveRunner(RemoveRunner {
                instance_id: id.clone(),
                runner_id: rec.runner.clone(),
            }),
        };
        Ok((
            DeleteInstanceResponse {
                message: format!(
                    "Command received: runner {} on {} is being torn down and its memory released. Only den's model state changes: the host keeps running and the downloaded artifact stays installed.",
                    rec.runner, rec.worker
                ),
                command_id: command,
                instance_id: id.clone(),
                extra: BTreeMap::new(),
            },
            vec![frame],
        ))
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

    fn place_frame(&self, id: &InstanceId) -> Option<ControlToWorker> {
        let rec = self.instances.get(id)?;
        let card = self.catalog.by_digest(&rec.digest)?;
        Some(ControlToWorker {
            to: rec.worker.clone(),
            control: Control::PlaceRunner(Box::new(PlaceRunner {
                instance_id: id.clone(),
                runner_id: rec.runner.clone(),
                artifact: card.artifact(),
                source: card.source.clone(),
            })),
        })
    }

    /// Records a new pending command; the oldest finished ones beyond
    /// [`RETAINED_RECORDS`] are forgotten.
    fn new_command(&mut self, kind: &str, instance: &InstanceId) -> CommandId {
        let command = CommandId::new(self.ids.next_id());
        self.applied += 1;
        self.commands.insert(
            command.clone(),
            CommandStatus {
                command_id: command.clone(),
                kind: kind.to_owned(),
                instance_id: Some(instance.clone()),
                outcome: CommandOutcome::Pending(NoFields::default()),
                extra: BTreeMap::new(),
            },
        );
        self.command_order.push_back(command.clone());
        let mut scanned = 0;
        while self.commands.len() > RETAINED_RECORDS && scanned < self.command_order.len() {
            let Some(oldest) = self.command_order.pop_front() else {
                break;
            };
            let pending = self
                .commands
                .get(&oldest)
                .is_some_and(|c| matches!(c.outcome, CommandOutcome::Pending(_)));
            if pending {
                // Still in flight: keep it, look at the next.
                self.command_order.push_back(oldest);
                scanned += 1;
            } else {
                self.commands.remove(&oldest);
            }
        }
        command
    }

    /// Keeps the first failure of an instance; forgets the oldest beyond
    /// [`RETAINED_RECORDS`].
    fn record_failure(&mut self, id: InstanceId, f: InstanceFailure) {
        if self.failures.contains_key(&id) {
            return;
        }
        self.failures.insert(id.clone(), f);
        self.failure_order.push_back(id);
        while self.failures.len() > RETAINED_RECORDS {
            let Some(oldest) = self.failure_order.pop_front() else {
                break;
            };
            self.failures.remove(&oldest);
        }
    }

    fn set_outcome(&mut self, command: &CommandId, outcome: CommandOutcome) {
        if let Some(c) = self.commands.get_mut(command) {
            c.outcome = outcome;
        }
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
        extra: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests;
