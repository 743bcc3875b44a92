//! `GET /state`: the management state and the workers' reports composed into Skulk's
//! shape, in the newer dialect.
//!
//! - `topology.nodes`: the router and every live worker; `lastSeen` their newest
//!   heartbeats (the router: now).
//! - `nodeResources`: only workers whose newest heartbeat is fresh (within the heartbeat
//!   timeout); the router does not observe itself.
//! - `downloads`: per node, every attempt the worker reports (tagged records with
//!   `attemptId`), oldest first; `runners`: the assigned runners' statuses, and
//!   `RunnerShuttingDown` for runners being torn down.
//! - `instanceFailures`, `commands` (den) and den's `inference` and `nodePools` are
//!   always present (possibly empty): absent would mean "not reported".

use std::collections::BTreeMap;

use den_protocol::ids::NodeId;
use den_protocol::observation::{DownloadReport, DownloadStage, RunnerReport, RunnerStage};
use den_protocol::skulk::download::{
    DownloadCompleted, DownloadFailed, DownloadOngoing, DownloadPending, DownloadProgressData,
};
use den_protocol::skulk::model::ShardFields;
use den_protocol::skulk::node::NodeResources;
use den_protocol::skulk::runner::{NoFields, RunnerFailed, RunnerLoading};
use den_protocol::skulk::topology::Topology;
use den_protocol::skulk::{
    DownloadProgress, Memory, ModelCard, NodePool, RunnerPoolSummary, RunnerStatus, ShardMetadata,
    State,
};
use den_protocol::time::Millis;

use super::preview::node_of;
use super::{Manager, WorkerView, instance_value, iso8601};

impl Manager {
    pub fn state(&self, now: Millis, unix_ms: u64) -> State {
        let live: Vec<(&den_protocol::ids::WorkerId, &WorkerView)> = self
            .workers
            .iter()
            .filter(|(w, _)| self.live(now, w).is_some())
            .collect();
        let mut state = State {
            last_event_applied_idx: self.applied,
            ..State::default()
        };
        state.topology = Topology {
            nodes: std::iter::once(self.node().clone())
                .chain(live.iter().map(|(w, _)| node_of(w)))
                .collect(),
            connections: BTreeMap::new(),
            extra: Default::default(),
        };
        state
            .last_seen
            .insert(self.node().clone(), iso8601(unix_ms));
        let mut resources = BTreeMap::new();
        let mut pools = BTreeMap::new();
        for (worker, view) in &live {
            let node = node_of(worker);
            state
                .last_seen
                .insert(node.clone(), iso8601(view.heartbeat_unix_ms));
            resources.insert(node.clone(), node_resources(view));
            pools.insert(node.clone(), node_pool(view));
            let records: Vec<DownloadProgress> = view
                .downloads
                .iter()
                .map(|d| self.download_record(&node, view, d))
                .collect();
            if !records.is_empty() {
                state.downloads.insert(node, records);
            }
        }
        for (id, rec) in &self.instances {
            state.instances.insert(id.clone(), instance_value(id, rec));
            let Some(view) = self.workers.get(&rec.worker) else {
                continue; // the worker is gone: no current runner evidence
            };
            let status = match view.runner(&rec.runner) {
                Some(report) => runner_status(report),
                None if rec.acknowledged => RunnerStatus::Failed(RunnerFailed {
                    error_message: Some(format!(
                        "runner {} is gone from worker {}",
                        rec.runner, rec.worker
                    )),
                    extra: Default::default(),
                }),
                None => RunnerStatus::Idle(NoFields::default()),
            };
            state.runners.insert(rec.runner.clone(), status);
        }
        for (runner, removal) in &self.removals {
            let listed = self
                .workers
                .get(&removal.worker)
                .and_then(|v| v.runner(runner))
                .is_some();
            if listed {
                state.runners.insert(
                    runner.clone(),
                    RunnerStatus::ShuttingDown(NoFields::default()),
                );
            }
        }
        state.node_resources = Some(resources);
        state.node_pools = Some(pools);
        state.instance_failures = Some(self.failures.clone());
        state.commands = Some(self.commands.clone());
        state.inference = Some(self.inference.clone());
        state
    }

    fn download_record(
        &self,
        node: &NodeId,
        view: &WorkerView,
        d: &DownloadReport,
    ) -> DownloadProgress {
        let card = self
            .catalog()
            .by_digest(&d.card_digest)
            .map(|c| c.model_card())
            .unwrap_or_else(|| ModelCard::minimal(d.model_id.clone()));
        let layers = card.n_layers;
        let shard = ShardMetadata::Pipeline(ShardFields {
            model_card: card,
            device_rank: 0,
            world_size: 1,
            resolved_backend: Some(view.backend_kind().to_owned()),
            immediate_exception: false,
            should_timeout: None,
            start_layer: 0,
            end_layer: layers,
            n_layers: layers,
            cfg_rank: None,
            cfg_world_size: None,
            pipeline_rank: None,
            pipeline_world_size: None,
            extra: Default::default(),
        });
        let attempt = Some(d.attempt_id.clone());
        let total = Memory::from_bytes(d.bytes_total);
        let done = Memory::from_bytes(d.bytes_done);
        match &d.stage {
            DownloadStage::Pending => DownloadProgress::Pending(DownloadPending {
                node_id: node.clone(),
                shard_metadata: shard,
                model_directory: d.directory.clone(),
                attempt_id: attempt,
                downloaded: done,
                total,
                extra: Default::default(),
            }),
            DownloadStage::Ongoing => {
                let left = d.bytes_total.saturating_sub(d.bytes_done) as f64;
                let eta_ms = if d.bytes_per_s > 0.0 {
                    (left / d.bytes_per_s * 1000.0) as i64
                } else {
                    0
                };
                DownloadProgress::Ongoing(DownloadOngoing {
                    node_id: node.clone(),
                    shard_metadata: shard,
                    model_directory: d.directory.clone(),
                    attempt_id: attempt,
                    download_progress: DownloadProgressData {
                        total,
                        downloaded: done,
                        downloaded_this_session: done,
                        completed_files: u64::from(d.files_done),
                        total_files: u64::from(d.files_total),
                        speed: d.bytes_per_s,
                        eta_ms,
                        files: BTreeMap::new(),
                    },
                    extra: Default::default(),
                })
            }
            DownloadStage::Completed => DownloadProgress::Completed(DownloadCompleted {
                node_id: node.clone(),
                shard_metadata: shard,
                model_directory: d.directory.clone(),
                attempt_id: attempt,
                total,
                read_only: false,
                extra: Default::default(),
            }),
            DownloadStage::Failed { reason } => DownloadProgress::Failed(DownloadFailed {
                node_id: node.clone(),
                shard_metadata: shard,
                model_directory: d.directory.clone(),
                attempt_id: attempt,
                error_message: reason.clone(),
                extra: Default::default(),
            }),
        }
    }
}

fn runner_status(report: &RunnerReport) -> RunnerStatus {
    match &report.stage {
        RunnerStage::Waiting => RunnerStatus::Idle(NoFields::default()),
        RunnerStage::Loading {
            layers_loaded,
            total_layers,
        } => RunnerStatus::Loading(RunnerLoading {
            layers_loaded: *layers_loaded,
            total_layers: *total_layers,
            extra: Default::default(),
        }),
        RunnerStage::Ready => RunnerStatus::Ready(NoFields::default()),
        RunnerStage::Running => RunnerStatus::Running(NoFields::default()),
        RunnerStage::Failed { message, .. } => RunnerStatus::Failed(RunnerFailed {
            error_message: Some(message.clone()),
            extra: Default::default(),
        }),
        RunnerStage::ShuttingDown => RunnerStatus::ShuttingDown(NoFields::default()),
    }
}

fn node_resources(view: &WorkerView) -> NodeResources {
    NodeResources {
        backends: vec![view.backend_kind().to_owned()],
        hardware_classes: vec![view.backend.clone()],
        participation: Some(if view.draining { "draining" } else { "full" }.to_owned()),
        ..NodeResources::default()
    }
}

fn node_pool(view: &WorkerView) -> NodePool {
    let p = view.pool;
    NodePool {
        page_size: view.page_size,
        page_bytes: p.page_bytes,
        total_pages: p.total_pages,
        free_pages: p.free,
        reserved_pages: p.reserved,
        resident_pages: p.resident,
        evictable_pages: p.evictable,
        durable_pages: p.durable,
        kv_budget_bytes: view.kv_budget_bytes,
        runner: view.runners.iter().find_map(|r| {
            r.pool.map(|pool| RunnerPoolSummary {
                runner_id: r.runner_id.clone(),
                weights_bytes: pool.weights_bytes,
                pages: pool.pages,
                page_bytes: pool.page_bytes,
                context_tokens: pool.context_tokens,
                extra: Default::default(),
            })
        }),
        extra: Default::default(),
    }
}
