//! The management API inside the actor: requests from the HTTP layer, heartbeats and
//! detaches fed to the [`Manager`](crate::router::manage::Manager), the inference each
//! placed instance served, and the control frames the manager asks for.

use super::*;

use crate::router::manage::{Request, unix_now_ms};

impl RouterActor {
    pub(super) fn on_manage(&mut self, request: Request) {
        let now = self.now();
        match request {
            Request::State { reply } => {
                let _ = reply.send(self.manager.state(now, unix_now_ms()));
            }
            Request::Previews { query, reply } => {
                let _ = reply.send(self.manager.previews(now, &query));
            }
            Request::Create { body, reply } => match self.manager.create(now, *body) {
                Ok((ack, frames)) => {
                    tracing::info!(
                        instance = ack.instance_id.as_ref().map(|i| i.as_str()).unwrap_or(""),
                        command = %ack.command_id,
                        "instance accepted"
                    );
                    self.send_controls(frames);
                    let _ = reply.send(Ok(ack));
                }
                Err(refusal) => {
                    let _ = reply.send(Err(refusal));
                }
            },
            Request::Delete { instance, reply } => match self.manager.delete(now, &instance) {
                Ok((ack, frames)) => {
                    tracing::info!(%instance, command = %ack.command_id, "instance deleted");
                    self.send_controls(frames);
                    let _ = reply.send(Ok(ack));
                }
                Err(refusal) => {
                    let _ = reply.send(Err(refusal));
                }
            },
            Request::Get { instance, reply } => {
                let _ = reply.send(self.manager.instance(&instance));
            }
        }
    }

    /// A worker's heartbeat was accepted: the manager reconciles against it.
    pub(super) fn observe_for_management(&mut self, worker: &WorkerId) {
        let now = self.now();
        let Some(obs) = self.node.discovery().registry().get(worker) else {
            return;
        };
        let frames = self.manager.observe(now, unix_now_ms(), obs);
        self.send_controls(frames);
    }

    /// A terminal delivery: attribute completions (and worker failures) to the placed
    /// instance that served them.
    pub(super) fn count_inference(&mut self, d: &Delivery) {
        let ok = match &d.kind {
            DeliveryKind::Completed { .. } => true,
            DeliveryKind::Error { .. } => false,
            DeliveryKind::Delta { .. } | DeliveryKind::Cancelled => return,
        };
        let Some(record) = self.node.router().record(&d.request) else {
            return;
        };
        let attempt = if ok {
            record.chosen()
        } else {
            record
                .attempts
                .iter()
                .rev()
                .find(|a| matches!(a.outcome, AttemptOutcome::Failed { .. }))
        };
        let Some(worker) = attempt.map(|a| a.worker.clone()) else {
            return;
        };
        let model = record.model.clone();
        if let Some(instance) = self.manager.served(&worker, &model, ok, unix_now_ms())
            && ok
        {
            self.shared
                .served_by()
                .insert(d.request.clone(), instance.to_string());
        }
    }

    /// Sends management frames to their workers. A worker that cannot be reached now
    /// gets the frame again from the manager on a later heartbeat.
    pub(super) fn send_controls(&mut self, frames: Vec<ControlToWorker>) {
        for frame in frames {
            let kind = frame.control.kind();
            let text = match encode_text(&frame) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!("cannot encode a {kind} frame: {e}");
                    continue;
                }
            };
            let sent = self
                .node
                .conn_of(&frame.to)
                .is_some_and(|conn| self.queue_frame(conn, text, kind));
            if !sent {
                tracing::warn!(worker = %frame.to, "{kind} not sent now (no live connection); retried on its next heartbeat");
            }
        }
    }
}
