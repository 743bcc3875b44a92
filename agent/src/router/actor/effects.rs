//! Carrying out the router node's effects: frames to connections (a failed send handed
//! back), timers, deliveries to clients, metrics and logs, the console feed and the
//! management API's view of workers.

use den_protocol::router_node::Count;

use super::*;

impl RouterActor {
    /// Hand one input to the node, then carry out its effects (and whatever they feed
    /// back: failed sends, cancels for vanished clients).
    pub(super) fn drive(&mut self, input: NodeInput) {
        // One effect buffer for the actor's life; fed-back inputs are rare.
        let mut effects = std::mem::take(&mut self.effects);
        let mut back = std::collections::VecDeque::new(); // allocates only when used
        let mut next = Some(input);
        while let Some(input) = next.take().or_else(|| back.pop_front()) {
            let submit = matches!(input, NodeInput::Submit { .. });
            self.node.handle_into(self.now(), input, &mut effects);
            if submit {
                crate::hops::mark(crate::hops::Hop::Decided);
            }
            for effect in effects.drain(..) {
                if let Some(input) = self.apply(effect) {
                    back.push_back(input);
                }
            }
        }
        self.effects = effects;
    }

    /// One effect; `Some` is an input for the node that carrying it out produced.
    fn apply(&mut self, effect: NodeEffect) -> Option<NodeInput> {
        match effect {
            NodeEffect::Send { conn, frame } => {
                let kind = frame.message.kind();
                let text = match encode_text(&frame) {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::error!("cannot encode a {kind} frame: {e}");
                        return None;
                    }
                };
                if kind == "offer" {
                    crate::hops::mark(crate::hops::Hop::OfferQueued);
                }
                if self.queue_frame(conn, text, kind) {
                    return None;
                }
                tracing::warn!(worker = %frame.to, "send to worker failed; detaching it");
                if let Some(c) = self.conns.get(&conn) {
                    let _ = c.outbound.try_send(Outbound::Refuse {
                        reason: RefusalReason::Malformed,
                        detail: "the worker does not read its frames (outbound queue full)".into(),
                    });
                }
                Some(NodeInput::SendFailed {
                    conn,
                    worker: frame.to,
                })
            }
            NodeEffect::Refuse { conn, detail } => {
                tracing::warn!(conn = conn.0, "refusing a worker connection: {detail}");
                if let Some(c) = self.conns.get(&conn) {
                    let _ = c.outbound.try_send(Outbound::Refuse {
                        reason: RefusalReason::Malformed,
                        detail,
                    });
                }
                None
            }
            NodeEffect::SetTimer { timer, at } => {
                self.timers.set(timer, at);
                None
            }
            NodeEffect::CancelTimer(key) => {
                self.timers.cancel(&key);
                None
            }
            NodeEffect::Deliver(d) => self.deliver(d),
            NodeEffect::Decision(e) => {
                self.on_decision(e);
                None
            }
            NodeEffect::WorkerUpdated(worker) => {
                self.models_dirty = true;
                if self.shared.feed.receiver_count() > 0
                    && let Some(obs) = self.node.discovery().registry().get(&worker)
                {
                    let frame = FeedMessage::Worker {
                        at: self.now(),
                        observation: Box::new(obs.clone()),
                    };
                    let _ = self.shared.feed.send(Arc::from(encode_feed(&frame)));
                }
                self.observe_for_management(&worker);
                None
            }
            NodeEffect::WorkerDetached {
                worker,
                connection,
                reason,
            } => {
                // The served-model listing is rebuilt once per batch of commands
                // (`run`), not per heartbeat: it is O(workers).
                self.models_dirty = true;
                tracing::warn!(%worker, conn = connection.0, reason = reason.as_str(), "worker detached");
                self.metrics().counter_add(
                    "den_router_workers_detached_total",
                    "Workers detached, by reason.",
                    &[("reason", reason.as_str())],
                    1.0,
                );
                self.manager
                    .worker_gone(crate::router::manage::unix_now_ms(), &worker);
                let frame = FeedMessage::WorkerGone {
                    at: self.now(),
                    worker,
                    reason: reason.as_str().to_owned(),
                };
                let _ = self.shared.feed.send(Arc::from(encode_feed(&frame)));
                None
            }
            NodeEffect::Count(count) => {
                self.count(count);
                None
            }
        }
    }

    /// Queues a frame on a connection's outbound queue and counts it; false when the
    /// queue is full or closed (a send failure).
    pub(super) fn queue_frame(&self, conn: ConnectionId, text: String, kind: &'static str) -> bool {
        let sent = self
            .conns
            .get(&conn)
            .is_some_and(|c| c.outbound.try_send(Outbound::Frame(text)).is_ok());
        if sent {
            self.metrics().counter_add(
                "den_router_frames_sent_total",
                "Frames sent to workers, by type.",
                &[("type", kind)],
                1.0,
            );
        }
        sent
    }

    fn count(&self, count: Count) {
        let m = self.metrics();
        match count {
            Count::FrameReceived(kind) => m.counter_add(
                "den_router_frames_received_total",
                "Frames received from workers, by type.",
                &[("type", kind)],
                1.0,
            ),
            Count::HeartbeatAccepted => m.counter_add(
                "den_router_heartbeats_total",
                "Heartbeats accepted (a newer observation stored).",
                &[],
                1.0,
            ),
            Count::HeartbeatIgnored {
                worker,
                version,
                why,
            } => tracing::debug!(%worker, %version, ?why, "heartbeat ignored"),
            Count::Fenced(kind) => m.counter_add(
                "den_router_fenced_total",
                "Worker messages ignored as late, duplicate or not for the current attempt.",
                &[("type", kind)],
                1.0,
            ),
            Count::OfferWithoutRoute => m.counter_add(
                "den_router_offers_without_route_total",
                "Offers to a worker with no live route (failed at once).",
                &[],
                1.0,
            ),
            Count::OfferTimeout => m.counter_add(
                "den_router_offer_timeouts_total",
                "Offer timers that fired.",
                &[],
                1.0,
            ),
        }
    }

    /// A delivery to its client; `Some(Cancel)` when the client fell behind or left.
    pub(super) fn deliver(&mut self, d: Delivery) -> Option<NodeInput> {
        let id = d.request.clone();
        let terminal = d.is_terminal();
        let now = Instant::now();
        let m = Arc::clone(&self.shared.metrics);
        self.count_inference(&d);
        let state = self.deliveries.get_mut(&id)?;
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
                let processed = self
                    .node
                    .router()
                    .record(&id)
                    .map_or(0, |r| r.processed_tokens);
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
                    .node
                    .router()
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
                None
            }
            Err(e) => {
                let why = match e {
                    mpsc::error::TrySendError::Full(_) => "slow-client",
                    mpsc::error::TrySendError::Closed(_) => "client-gone",
                };
                self.deliveries.remove(&id);
                if terminal {
                    return None;
                }
                m.counter_add(
                    "den_router_client_cancels_total",
                    "Requests cancelled because their client fell behind or went away.",
                    &[("why", why)],
                    1.0,
                );
                Some(NodeInput::Cancel { request: id })
            }
        }
    }
}
