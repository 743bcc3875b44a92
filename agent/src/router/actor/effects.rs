//! Interpreting the router machine's and discovery's effects: sends (with the fast
//! fallback for workers without a route), timers, deliveries, detaches.

use den_protocol::candidate::added_work_ms;

use super::*;

impl RouterActor {
    /// Hand one input to the machine, then everything its effects fed back.
    pub(super) fn drive(&mut self, input: RouterInput) {
        self.pending.push_back(input);
        self.drain_pending();
    }

    pub(super) fn drain_pending(&mut self) {
        while let Some(input) = self.pending.pop_front() {
            let effects = self.router.handle(self.now(), input);
            self.apply_router(effects);
        }
    }

    pub(super) fn apply_router(&mut self, effects: Vec<RouterEffect>) {
        for effect in effects {
            match effect {
                RouterEffect::Send(out) => {
                    let kind = out.message.kind();
                    let Some(conn) = self.discovery.route(&out.to) else {
                        if let RouterMessage::Offer(o) = &out.message {
                            // Fast fallback: no live route, no waiting for the timer.
                            self.metrics().counter_add(
                                "den_router_offers_without_route_total",
                                "Offers to a worker with no live route (failed at once).",
                                &[],
                                1.0,
                            );
                            self.pending.push_back(RouterInput::WorkerUnavailable {
                                worker: out.to.clone(),
                                assignment: o.assignment.clone(),
                            });
                        }
                        continue;
                    };
                    let text = match encode(&out) {
                        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
                        Err(e) => {
                            tracing::error!("cannot encode a {kind} frame: {e}");
                            continue;
                        }
                    };
                    let sent = self
                        .conns
                        .get(&conn)
                        .is_some_and(|c| c.outbound.try_send(Outbound::Frame(text)).is_ok());
                    if sent {
                        if let RouterMessage::Offer(o) = &out.message {
                            let work = added_work_ms(&o.candidate, &o.estimate);
                            self.unreflected
                                .offered(&out.to, o.assignment.clone(), work);
                        }
                        self.metrics().counter_add(
                            "den_router_frames_sent_total",
                            "Frames sent to workers, by type.",
                            &[("type", kind)],
                            1.0,
                        );
                    } else {
                        tracing::warn!(worker = %out.to, "send to worker failed; detaching it");
                        if let Some(c) = self.conns.get(&conn) {
                            let _ = c.outbound.try_send(Outbound::Refuse {
                                reason: RefusalReason::Malformed,
                                detail: "the worker does not read its frames (outbound queue full)"
                                    .into(),
                            });
                        }
                        let effects = self.discovery.handle(
                            self.now(),
                            DiscoveryInput::SendFailed {
                                connection: conn,
                                worker: out.to.clone(),
                            },
                        );
                        self.apply_discovery(effects);
                    }
                }
                RouterEffect::Local(local) => match local {
                    LocalRouterEffect::SetOfferTimer { assignment, at } => self.timers.set(
                        TimerKey::Offer(assignment.clone()),
                        at,
                        Fired::Offer(assignment),
                    ),
                    LocalRouterEffect::CancelOfferTimer { assignment } => {
                        self.timers.cancel(&TimerKey::Offer(assignment))
                    }
                    LocalRouterEffect::SetDeadlineTimer { request, at } => self.timers.set(
                        TimerKey::Deadline(request.clone()),
                        at,
                        Fired::Deadline(request),
                    ),
                    LocalRouterEffect::CancelDeadlineTimer { request } => {
                        self.timers.cancel(&TimerKey::Deadline(request))
                    }
                    LocalRouterEffect::Deliver(d) => self.deliver(d),
                    LocalRouterEffect::Decision(e) => self.on_decision(e),
                },
            }
        }
    }

    pub(super) fn deliver(&mut self, d: Delivery) {
        let id = d.request.clone();
        let terminal = d.is_terminal();
        let now = Instant::now();
        let m = Arc::clone(&self.shared.metrics);
        if matches!(d.kind, DeliveryKind::Completed { .. }) {
            let worker = self
                .router
                .record(&id)
                .and_then(|r| r.chosen())
                .map(|a| a.worker.clone());
            let request = self.deliveries.get(&id).map(|s| Arc::clone(&s.request));
            if let (Some(worker), Some(request)) = (worker, request) {
                self.speculate(&worker, &request);
            }
        }
        if terminal {
            self.unreflected.ended(&id);
        }
        self.count_inference(&d);
        let Some(state) = self.deliveries.get_mut(&id) else {
            return;
        };
        match &d.kind {
            DeliveryKind::Delta { .. } => {
                if let Some(last) = state.last_delta {
                    m.histogram_observe(
                        "den_inter_token_ms",
                        "Time between consecutive streamed tokens of one request, at the router.",
                        LATENCY_MS_BUCKETS,
                        &[],
                        (now - last).as_secs_f64() * 1e3,
                    );
                }
                state.last_delta = Some(now);
            }
            DeliveryKind::Completed { result } => {
                let processed = self.router.record(&id).map_or(0, |r| r.processed_tokens);
                m.counter_add(
                    "den_prompt_tokens_total",
                    "Processed prompt tokens of completed requests.",
                    &[],
                    processed as f64,
                );
                m.counter_add(
                    "den_cached_tokens_total",
                    "Prompt tokens of completed requests served from a cache (as the worker reported).",
                    &[],
                    result.cached_token_count as f64,
                );
                let tier = self
                    .router
                    .record(&id)
                    .and_then(|r| r.chosen())
                    .map_or("none", |a| a.tier.as_str());
                let tier = if result.cached_token_count == 0 {
                    "none"
                } else {
                    tier
                };
                m.counter_add(
                    "den_completed_by_tier_total",
                    "Completed requests by the tier their cached prefix came from.",
                    &[("tier", tier)],
                    1.0,
                );
            }
            _ => {}
        }
        match state.tx.try_send(d) {
            Ok(()) => {
                if terminal {
                    self.deliveries.remove(&id);
                }
            }
            Err(e) => {
                let why = match e {
                    mpsc::error::TrySendError::Full(_) => "slow-client",
                    mpsc::error::TrySendError::Closed(_) => "client-gone",
                };
                self.deliveries.remove(&id);
                if !terminal {
                    m.counter_add(
                        "den_router_client_cancels_total",
                        "Requests cancelled because their client fell behind or went away.",
                        &[("why", why)],
                        1.0,
                    );
                    self.pending.push_back(RouterInput::Cancel { request: id });
                }
            }
        }
    }

    pub(super) fn apply_discovery(&mut self, effects: Vec<DiscoveryEffect>) {
        let mut workers_changed = false;
        for effect in effects {
            match effect {
                DiscoveryEffect::Updated { worker, .. } => {
                    workers_changed = true;
                    // The heartbeat says what really is resident: drop the guesses.
                    self.speculation.prefixes.remove(&worker);
                    self.metrics().counter_add(
                        "den_router_heartbeats_total",
                        "Heartbeats accepted (a newer observation stored).",
                        &[],
                        1.0,
                    );
                    if self.shared.feed.receiver_count() > 0
                        && let Some(obs) = self.discovery.registry().get(&worker)
                    {
                        let frame = FeedMessage::Worker {
                            at: self.now(),
                            observation: Box::new(obs.clone()),
                        };
                        let _ = self.shared.feed.send(Arc::from(encode_feed(&frame)));
                    }
                    self.observe_for_management(&worker);
                }
                DiscoveryEffect::ArmExpiry {
                    worker,
                    connection,
                    version,
                    at,
                } => self.timers.set(
                    TimerKey::Expiry(worker.clone()),
                    at,
                    Fired::Expiry {
                        worker,
                        connection,
                        version,
                    },
                ),
                DiscoveryEffect::Detached {
                    worker,
                    connection,
                    reason,
                } => {
                    workers_changed = true;
                    self.speculation.prefixes.remove(&worker);
                    tracing::warn!(%worker, conn = connection.0, reason = reason.as_str(), "worker detached");
                    self.metrics().counter_add(
                        "den_router_workers_detached_total",
                        "Workers detached, by reason.",
                        &[("reason", reason.as_str())],
                        1.0,
                    );
                    self.timers.cancel(&TimerKey::Expiry(worker.clone()));
                    self.manager
                        .worker_gone(crate::router::manage::unix_now_ms(), &worker);
                    let inputs = self.router.unavailable_inputs(&worker);
                    self.pending.extend(inputs);
                    // A worker that merely missed heartbeats may come back on the same
                    // connection with its tiers intact (it republishes only on reconnect),
                    // so only a lost connection drops the node's replicas. Stale replicas
                    // of a dead node are harmless: candidates come from live workers only,
                    // and a missing chunk is retracted and recomputed.
                    let lost = reason != DetachReason::HeartbeatExpired;
                    if let Some(node) = self
                        .conns
                        .get(&connection)
                        .filter(|_| lost)
                        .map(|c| c.node.clone())
                    {
                        let still_there = self
                            .discovery
                            .registry()
                            .observations()
                            .any(|o| o.node == node);
                        if !still_there {
                            self.catalog.remove_node(&node);
                        }
                    }
                    let frame = FeedMessage::WorkerGone {
                        at: self.now(),
                        worker,
                        reason: reason.as_str().to_owned(),
                    };
                    let _ = self.shared.feed.send(Arc::from(encode_feed(&frame)));
                }
                DiscoveryEffect::Ignored {
                    worker,
                    version,
                    why,
                } => {
                    tracing::debug!(%worker, %version, ?why, "heartbeat ignored");
                }
            }
        }
        if workers_changed {
            // Rebuilt once per batch of commands (`flush`), not per heartbeat: the
            // listing is O(workers), so per heartbeat it was O(workers²) per interval.
            self.models_dirty = true;
        }
        self.drain_pending();
    }
}
