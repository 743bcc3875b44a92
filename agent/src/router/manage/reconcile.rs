//! Heartbeats into the management state: command outcomes (a placement is applied when
//! the worker lists its runner; a deletion when it no longer does), failure records,
//! re-sending unanswered frames, adoption of runners a restarted router did not know,
//! and workers that went away.

use den_protocol::ids::{NodeId, WorkerId};
use den_protocol::observation::{Observation, RunnerReport, RunnerStage};
use den_protocol::skulk::runner::NoFields;
use den_protocol::skulk::state::CommandRejected;
use den_protocol::skulk::{CommandId, CommandOutcome, InstanceFailure, InstanceId};
use den_protocol::time::Millis;
use den_protocol::wire::{Control, ControlToWorker, RemoveRunner};

use super::{InstanceRecord, Manager, RESEND_AFTER_MS, WorkerView, failure, preview};

impl Manager {
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
                        extra: Default::default(),
                    }),
                );
            }
            let f = failure(&id, &rec, &message, "node_unavailable", None, unix_ms);
            self.record_failure(id, f);
        }
    }
}
