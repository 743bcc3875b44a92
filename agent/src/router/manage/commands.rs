//! `POST /instance` and `DELETE /instance/{id}`: validation, command records (bounded)
//! and the frames that carry them out.

use den_protocol::ids::WorkerId;
use den_protocol::skulk::api::{
    CreateInstanceRequest, CreateInstanceResponse, DeleteInstanceResponse,
};
use den_protocol::skulk::runner::NoFields;
use den_protocol::skulk::state::CommandRejected;
use den_protocol::skulk::{CommandId, CommandOutcome, CommandStatus, InstanceFailure, InstanceId};
use den_protocol::time::Millis;
use den_protocol::wire::{Control, ControlToWorker, PlaceRunner, RemoveRunner};

use super::{InstanceRecord, Manager, RETAINED_RECORDS, Refusal, Removal, preview};

impl Manager {
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
        if !card.resolved {
            return Err(Refusal::new(
                503,
                "card_unresolved",
                format!(
                    "model {}'s GGUF file was not read by this router (gguf_cards::resolve runs at start): restart the router",
                    card.model_id
                ),
            ));
        }
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
                extra: Default::default(),
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
                    extra: Default::default(),
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
                extra: Default::default(),
            },
            vec![frame],
        ))
    }

    pub(super) fn place_frame(&self, id: &InstanceId) -> Option<ControlToWorker> {
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
    pub(super) fn new_command(&mut self, kind: &str, instance: &InstanceId) -> CommandId {
        let command = CommandId::new(self.ids.next_id());
        self.applied += 1;
        self.commands.insert(
            command.clone(),
            CommandStatus {
                command_id: command.clone(),
                kind: kind.to_owned(),
                instance_id: Some(instance.clone()),
                outcome: CommandOutcome::Pending(NoFields::default()),
                extra: Default::default(),
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
    pub(super) fn record_failure(&mut self, id: InstanceId, f: InstanceFailure) {
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

    pub(super) fn set_outcome(&mut self, command: &CommandId, outcome: CommandOutcome) {
        if let Some(c) = self.commands.get_mut(command) {
            c.outcome = outcome;
        }
    }
}
