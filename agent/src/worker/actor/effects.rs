//! Carrying out the worker machine's effects: frames to the router, operations on the
//! device queue (restores through their fetch), cancellation flags, and what a released
//! assignment leaves behind (a checkpoint of a completed route).

use super::*;

impl Actor {
    pub(super) fn apply(&mut self, effects: Vec<WorkerEffect>) {
        for effect in effects {
            match effect {
                WorkerEffect::Send(message) => {
                    if let WorkerMessage::OfferResult(r) = &message {
                        let reason = r.reason.map(|r| r.as_str()).unwrap_or("");
                        self.p.metrics.counter_add(
                            "den_offers_total",
                            "Offers answered, by result and decline reason.",
                            &[
                                ("result", if r.accepted { "accepted" } else { "declined" }),
                                ("reason", reason),
                            ],
                            1.0,
                        );
                    }
                    self.send(&ToRouter::from(message));
                }
                WorkerEffect::Local(LocalWorkerEffect::Start(op)) => self.start(op),
                WorkerEffect::Local(LocalWorkerEffect::CancelOperation { assignment, .. }) => {
                    if let Some(flag) = self.flags.get(&assignment) {
                        flag.store(true, Ordering::Relaxed);
                    }
                }
                WorkerEffect::Local(LocalWorkerEffect::Released { assignment, cause }) => {
                    self.flags.remove(&assignment);
                    self.p.queue.clear_future(&assignment);
                    let live = self.live.remove(&assignment);
                    let label = match cause {
                        ReleaseCause::Completed => "completed",
                        ReleaseCause::Failed => "failed",
                        ReleaseCause::Cancelled => "cancelled",
                    };
                    self.p.metrics.counter_add(
                        "den_assignments_total",
                        "Assignments that ended, by how (their reservation was released).",
                        &[("outcome", label)],
                        1.0,
                    );
                    if cause == ReleaseCause::Completed
                        && let Some(live) = live
                    {
                        self.after_completion(&live.work, &live.output);
                    }
                }
            }
        }
    }

    pub(super) fn start(&mut self, op: Operation) {
        let assignment = op.assignment().clone();
        let job = self.next_job;
        self.next_job += 1;
        let flag = Arc::clone(
            self.flags
                .entry(assignment.clone())
                .or_insert_with(|| Arc::new(AtomicBool::new(false))),
        );
        self.live.entry(assignment.clone()).or_insert_with(|| Live {
            work: Arc::clone(&op.work),
            accepted: Instant::now(),
            last_token: None,
            output: Vec::new(),
        });
        let kind = op.kind;
        self.p.queue.enqueue(job, self.predict(&op));
        self.p
            .queue
            .set_future(&assignment, self.still_to_queue(&op));
        let submitted = if kind == OperationKind::Restore {
            self.start_restore(job, op, flag)
        } else {
            crate::hops::mark(crate::hops::Hop::JobQueued);
            self.p.device.submit(Job::Op {
                job,
                op,
                cancel: flag,
            })
        };
        if !submitted {
            self.p.queue.finish(job);
            let effects = self.p.machine.handle(
                self.now(),
                WorkerInput::OperationDone {
                    assignment,
                    outcome: OperationOutcome::Failed {
                        operation: kind,
                        detail: "the device queue is closed".into(),
                    },
                },
            );
            self.apply(effects);
        }
    }

    /// A restore: the device thread is told first, then the chain's chunks are fetched
    /// on the runtime, a window at a time, and handed to it in order (`worker::fetch`).
    pub(super) fn start_restore(
        &mut self,
        job: u64,
        op: Operation,
        cancel: Arc<AtomicBool>,
    ) -> bool {
        let config = self.p.device_ctx.config;
        let held = self
            .p
            .pool
            .lock()
            .route(&op.work.route)
            .map_or(0, |r| r.token_count());
        let chunks = fetch::restore_chunks(
            &op.work.request,
            op.work.candidate.cached_token_count,
            held,
            config.chunk_size,
        );
        let model = op.work.request.model.clone();
        let tier = op.work.candidate.tier;
        let stop = Arc::new(AtomicBool::new(false));
        if !self.p.device.submit(Job::Restore {
            job,
            op,
            cancel: Arc::clone(&cancel),
            stop: Arc::clone(&stop),
        }) {
            return false;
        }
        let cx = FetchContext {
            tiers: self.p.tiers.clone(),
            metrics: Arc::clone(&self.p.metrics),
            events: self.p.device_ctx.events.clone(),
            faults: Arc::clone(&self.p.device_ctx.faults),
            meter: Arc::clone(&self.fetches),
            row_bytes: config.row_bytes,
        };
        let tx = self.internal_tx.clone();
        tokio::spawn(async move {
            let ended = || cancel.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed);
            fetch::fetch_in_order(&cx, &model, tier, chunks, ended, |f| {
                tx.send(Internal::Fetched {
                    job,
                    fetched: Some(f),
                })
                .is_ok()
            })
            .await;
            let _ = tx.send(Internal::Fetched { job, fetched: None });
        });
        true
    }

    pub(super) fn cancel_all(&mut self) {
        let ids: Vec<AssignmentId> = self
            .p
            .machine
            .assignments()
            .map(|(id, _)| id.clone())
            .collect();
        for assignment in ids {
            let effects = self.p.machine.handle(
                self.now(),
                WorkerInput::Cancel(den_protocol::wire::Cancel { assignment }),
            );
            self.apply(effects);
        }
    }

    /// Send a frame on the current connection. A full outbound queue means the router
    /// stopped reading: drop the connection (the link reconnects).
    pub(super) fn send(&mut self, frame: &ToRouter) {
        let Some(link) = &self.link else {
            return;
        };
        let text = match encode_text(frame) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!("cannot encode a frame for the router: {e}");
                return;
            }
        };
        if matches!(frame, ToRouter::Result(_)) {
            crate::hops::mark(crate::hops::Hop::ResultQueued);
        }
        if link.tx.try_send(text).is_err() {
            tracing::warn!("the router connection is not draining its queue; dropping it");
            self.link = None;
            self.cancel_all();
        }
    }
}
