//! What the router tells the outside: metrics from decision events, console feed frames
//! (coalesced route updates, snapshots), the served-models list, gauges.

use super::*;

/// Decision records in one console-feed snapshot (see [`RouterActor::snapshot_frame`]).
pub const FEED_SNAPSHOT_ROUTES: usize = 256;

impl RouterActor {
    pub(super) fn on_decision(&mut self, e: DecisionEvent) {
        let m = Arc::clone(&self.shared.metrics);
        match &e.kind {
            DecisionEventKind::Submitted { .. } => m.counter_add(
                "den_router_submitted_total",
                "Requests submitted to the router.",
                &[],
                1.0,
            ),
            DecisionEventKind::Offered { tier, .. } => m.counter_add(
                "den_router_offers_total",
                "Offers made, by the candidate's cache tier.",
                &[("tier", tier.as_str())],
                1.0,
            ),
            DecisionEventKind::AttemptEnded { outcome, .. } => {
                let (kind, reason) = match outcome {
                    AttemptOutcome::Declined { reason, .. } => {
                        ("declined", reason.map(|r| r.as_str()).unwrap_or(""))
                    }
                    AttemptOutcome::TimedOut => ("timed-out", ""),
                    AttemptOutcome::WorkerUnavailable => ("worker-unavailable", ""),
                    AttemptOutcome::Failed { reason } => ("failed", reason.kind.as_str()),
                    AttemptOutcome::Completed => ("completed", ""),
                    AttemptOutcome::Cancelled => ("cancelled", ""),
                    AttemptOutcome::Superseded => ("superseded", ""),
                    AttemptOutcome::Pending | AttemptOutcome::Running => ("other", ""),
                };
                m.counter_add(
                    "den_router_attempts_ended_total",
                    "Attempts that ended, by outcome and decline or failure reason.",
                    &[("outcome", kind), ("reason", reason)],
                    1.0,
                );
            }
            DecisionEventKind::FirstDelta { ttft_ms } => m.histogram_observe(
                "den_ttft_ms",
                "Time to first token: submission to the first streamed token, at the router.",
                LATENCY_MS_BUCKETS,
                &[],
                *ttft_ms as f64,
            ),
            DecisionEventKind::Finished { outcome, .. } => {
                let label = match outcome {
                    TerminalOutcome::Completed => "completed",
                    TerminalOutcome::Failed { .. } => "failed",
                    TerminalOutcome::Cancelled => "cancelled",
                };
                m.counter_add(
                    "den_requests_total",
                    "Requests that finished, by outcome.",
                    &[("outcome", label)],
                    1.0,
                );
            }
            DecisionEventKind::Collected => {
                self.shared.known().remove(&e.request);
                self.shared.served_by().remove(&e.request);
                self.dirty.remove(&e.request);
                let frame = FeedMessage::RouteGone {
                    at: e.at,
                    request: e.request.clone(),
                };
                let _ = self.shared.feed.send(Arc::from(encode_feed(&frame)));
                return;
            }
            DecisionEventKind::Waiting => m.counter_add(
                "den_router_waited_total",
                "Requests that waited for KV pages no worker had free.",
                &[],
                1.0,
            ),
            DecisionEventKind::Released { waited_ms, .. } => m.counter_add(
                "den_router_wait_seconds_total",
                "Time requests spent waiting for KV pages, counted when the router takes one up again.",
                &[],
                *waited_ms as f64 / 1000.0,
            ),
            DecisionEventKind::Accepted { .. } => {}
        }
        self.dirty.insert(e.request);
    }

    pub(super) fn flush_feed(&mut self) {
        if self.dirty.is_empty() {
            return;
        }
        let dirty = std::mem::take(&mut self.dirty);
        if self.shared.feed.receiver_count() == 0 {
            return;
        }
        let at = self.now();
        for id in dirty {
            if let Some(record) = self.node.router().record(&id) {
                let frame = FeedMessage::Route {
                    at,
                    record: Box::new(record.clone()),
                };
                let _ = self.shared.feed.send(Arc::from(encode_feed(&frame)));
            }
        }
    }

    /// The console feed's snapshot: every worker, and the [`FEED_SNAPSHOT_ROUTES`] most
    /// relevant decision records — every live one first, then the most recently finished
    /// — never the whole retention window (≈ 27 KB a record: 1,900 of them made 9 MB
    /// snapshots, re-sent to every console every few seconds). Older records stay
    /// readable one at a time (`GET /v1/requests/{id}`).
    pub(super) fn snapshot_frame(&self) -> Arc<str> {
        let mut routes: Vec<&den_protocol::decision::DecisionRecord> =
            self.node.router().records().collect();
        if routes.len() > FEED_SNAPSHOT_ROUTES {
            routes.sort_by_key(|r| (r.outcome.is_none(), r.finished_at.unwrap_or(r.submitted_at)));
            let surplus = routes.len() - FEED_SNAPSHOT_ROUTES;
            routes.drain(..surplus);
        }
        let frame = FeedMessage::Snapshot {
            at: self.now(),
            workers: self
                .node
                .discovery()
                .registry()
                .observations()
                .cloned()
                .collect(),
            routes: routes.into_iter().cloned().collect(),
        };
        Arc::from(encode_feed(&frame))
    }

    pub(super) fn update_models(&self) {
        let mut by_model: BTreeMap<(String, den_protocol::ids::ModelFingerprint), (usize, u32)> =
            BTreeMap::new();
        for obs in self.node.discovery().registry().observations() {
            if !obs.online || obs.draining {
                continue;
            }
            for m in &obs.models {
                // A placed catalog model is listed under its model id, admitting no more
                // than its runners' page pools hold.
                let (id, limit) = match self.manager.served_model(m) {
                    Some((id, limit)) => (id.to_string(), limit),
                    None => (m.public_id().to_owned(), None),
                };
                let context = match limit {
                    Some(l) => obs.max_context.min(u32::try_from(l).unwrap_or(u32::MAX)),
                    None => obs.max_context,
                };
                let e = by_model.entry((id, m.clone())).or_insert((0, 0));
                e.0 += 1;
                e.1 = e.1.max(context);
            }
        }
        let models = by_model
            .into_iter()
            .map(|((id, fingerprint), (workers, max_context))| ServedModel {
                id,
                fingerprint,
                workers,
                max_context,
            })
            .collect();
        self.shared.set_models(models);
        self.shared.set_instances(self.manager.instance_models());
    }

    pub(super) fn export_gauges(&self) {
        let m = self.metrics();
        let c = self.node.router().counts();
        m.gauge_set(
            "den_router_workers",
            "Workers with a live route.",
            &[],
            self.node.discovery().registry().len() as f64,
        );
        for (phase, n) in [
            ("offered", c.offered),
            ("assigned", c.assigned),
            ("completed", c.completed),
            ("failed", c.failed),
            ("cancelled", c.cancelled),
            ("waiting", c.waiting),
        ] {
            m.gauge_set(
                "den_router_requests",
                "Requests held by the router, by phase (terminal ones until collected).",
                &[("phase", phase)],
                n as f64,
            );
        }
        m.gauge_set(
            "den_catalog_chunks",
            "Chunks published in the catalog.",
            &[],
            self.node.catalog().chunk_count() as f64,
        );
        m.gauge_set(
            "den_router_timers",
            "Armed timers (offers, deadlines, heartbeat expiries).",
            &[],
            self.timers.len() as f64,
        );
    }
}
