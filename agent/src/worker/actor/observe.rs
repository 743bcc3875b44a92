//! Heartbeats (spec §3.8, §5.2), the worker's Prometheus metrics and `GET /status`.

use super::*;

impl Actor {
    /// Heartbeat within a few milliseconds (coalescing further changes).
    pub(super) fn heartbeat_soon(&mut self) {
        if self.eager.is_none() {
            self.eager = Some(tokio::time::Instant::now() + EAGER_HEARTBEAT);
        }
    }

    pub(super) fn heartbeat(&mut self) {
        self.eager = None;
        let obs = self.observation();
        self.export_metrics(&obs);
        if self.link.is_some() {
            self.send(&ToRouter::Heartbeat(Box::new(Heartbeat {
                observation: obs,
            })));
            self.sequence += 1;
        }
    }

    pub(super) fn observation(&self) -> Observation {
        let o = &self.p.opts;
        let mut obs = Observation::new(o.name.clone(), o.node.clone());
        self.p.machine.fill_observation(&mut obs);
        obs.sequence = self.sequence;
        obs.queue_ms = self.p.queue.remaining_ms();
        obs.page_size = o.page_size;
        obs.max_context = self.engine.max_context;
        let (prefill, first, _) = self.costs();
        obs.prefill_ms_per_token = prefill;
        obs.first_token_ms = first;
        obs.gpu_restore_bytes_per_ms = self.upload_bytes_per_ms();
        for (tier, fallback) in [
            (Tier::Ram, DEFAULT_RAM_BYTES_PER_MS),
            (Tier::Ssd, DEFAULT_SSD_BYTES_PER_MS),
            (Tier::Object, DEFAULT_OBJECT_BYTES_PER_MS),
        ] {
            if self.p.tiers.get(tier).is_some() {
                // What restores measured of the link (its streaming rate and latency),
                // else single reads' rate, else a default.
                let fit = self.fetches.link_fit(tier);
                let v = fit
                    .bytes_per_ms
                    .value
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .or_else(|| self.tier_bytes_per_ms(tier))
                    .unwrap_or(fallback);
                obs.tier_throughput_bytes_per_ms.insert(tier, v);
                if let Some(ms) = fit.fixed_ms.value.filter(|v| v.is_finite() && *v >= 0.0) {
                    obs.tier_fixed_ms.insert(tier, ms);
                }
                // Restores still reading from the tier: a new load waits behind them.
                let pending = self.fetches.pending_bytes(tier);
                if pending > 0 {
                    obs.link_backlog_ms.insert(tier, pending as f64 / v);
                }
            }
        }
        {
            let pool = self.p.pool.lock();
            obs.gpu_prefixes = pool.gpu_prefixes();
            obs.pool = pool.stats(self.p.machine.protected_routes());
            let c = pool.eviction_counters();
            obs.evictions.insert("capacity".into(), c.capacity_routes);
            obs.evictions.insert("explicit".into(), c.explicit_routes);
        }
        obs.engine = self
            .p
            .device_ctx
            .engine_plan
            .lock()
            .ok()
            .and_then(|p| p.clone());
        if let Some(plan) = &obs.engine {
            // The scheduler's own queue: when its pending prefills are done, by the replay
            // the router prices with (the meter's sum of queued operations is a serial
            // engine's, which no den worker is any more).
            obs.queue_ms = den_protocol::engine_plan::replay(plan, None)
                .finish_ms
                .iter()
                .fold(0.0, |a: f64, b| a.max(*b));
        }
        obs.object_store = self.p.tiers.object.is_some();
        obs.tiers = self.tier_usage.clone();
        obs.backend = self.p.backend.clone();
        obs.kv_budget_bytes = self.p.models.kv_budget();
        let busy: BTreeSet<den_protocol::ids::ModelFingerprint> = self
            .live
            .values()
            .map(|l| l.work.request.model.clone())
            .collect();
        let (downloads, runners) = self.p.models.reports(&busy);
        obs.downloads = downloads;
        obs.runners = runners;
        obs
    }

    pub(super) fn upload_bytes_per_ms(&self) -> f64 {
        let t = self.p.totals.lock().unwrap_or_else(|p| p.into_inner());
        positive(
            t.upload.bytes_per_ms.or(DEFAULT_UPLOAD_BYTES_PER_MS),
            DEFAULT_UPLOAD_BYTES_PER_MS,
        )
    }

    pub(super) fn tier_bytes_per_ms(&self, tier: Tier) -> Option<f64> {
        let store = self.p.tiers.get(tier)?;
        let v = store.io_totals().reads.bytes_per_ms.value?;
        (v.is_finite() && v > 0.0).then_some(v)
    }

    pub(super) fn export_metrics(&mut self, obs: &Observation) {
        let m = &self.p.metrics;
        let pool = obs.pool;
        for (state, v) in [
            ("free", pool.free),
            ("reserved", pool.reserved),
            ("resident", pool.resident),
            ("evictable", pool.evictable),
            ("durable", pool.durable),
        ] {
            m.gauge_set(
                "den_pages",
                "KV pages by state.",
                &[("state", state)],
                v as f64,
            );
        }
        m.gauge_set(
            "den_pages_total",
            "KV pages in the pool.",
            &[],
            pool.total_pages as f64,
        );
        m.gauge_set(
            "den_queue_depth",
            "Assignments live on this worker (queued or running).",
            &[],
            obs.queue_depth as f64,
        );
        m.gauge_set(
            "den_queue_ms",
            "Predicted remaining work of the execution queue, in milliseconds.",
            &[],
            obs.queue_ms,
        );
        m.gauge_set(
            "den_worker_draining",
            "1 while the worker declines new offers.",
            &[],
            if obs.draining { 1.0 } else { 0.0 },
        );
        m.gauge_set(
            "den_worker_epoch",
            "Process generation.",
            &[],
            obs.epoch.0 as f64,
        );
        m.gauge_set(
            "den_gpu_prefixes",
            "Resident prefixes advertised in the heartbeat.",
            &[],
            obs.gpu_prefixes.len() as f64,
        );
        for (tier, usage) in &obs.tiers {
            let t = tier.as_str();
            m.gauge_set(
                "den_tier_bytes",
                "Bytes held per storage tier (object: bytes this worker wrote).",
                &[("tier", t)],
                usage.bytes as f64,
            );
            m.gauge_set(
                "den_tier_chunks",
                "Chunks held per storage tier.",
                &[("tier", t)],
                usage.chunks as f64,
            );
        }
        for (reason, n) in &obs.evictions {
            self.export_total(
                "den_evictions_total",
                "Resident routes evicted, by reason.",
                &[("reason", reason)],
                *n as f64,
            );
        }
        let totals = *self.p.totals.lock().unwrap_or_else(|p| p.into_inner());
        for (dir, t) in [
            ("upload", totals.upload),
            ("download", totals.download),
            ("page_copy", totals.page_copy),
        ] {
            self.export_total(
                "den_transfer_bytes_total",
                "Bytes moved between host buffers and the page arena, by direction.",
                &[("direction", dir)],
                t.bytes as f64,
            );
        }
        for (tier, io) in self.p.tiers.io_totals() {
            for (dir, bytes) in [("read", io.reads.bytes), ("write", io.writes.bytes)] {
                self.export_total(
                    "den_tier_io_bytes_total",
                    "Bytes read from and written to each storage tier.",
                    &[("tier", tier.as_str()), ("direction", dir)],
                    bytes as f64,
                );
            }
        }
    }

    /// Export a cumulative total kept elsewhere as a Prometheus counter: add only what
    /// it grew by since the last export.
    fn export_total(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        let key = format!("{name}{labels:?}");
        let last = self.exported.get(&key).copied().unwrap_or(0.0);
        self.p
            .metrics
            .counter_add(name, help, labels, (value - last).max(0.0));
        self.exported.insert(key, value.max(last));
    }

    pub(super) fn status(&self) -> WorkerStatus {
        let obs = self.observation();
        let pool = self.p.pool.lock();
        WorkerStatus {
            worker: self.p.opts.name.to_string(),
            epoch: self.p.epoch,
            connected: self.link.is_some(),
            draining: self.p.machine.draining(),
            assignments: self.p.machine.assignments().count(),
            routes: pool.route_count(),
            pool: obs.pool,
            queue_ms: obs.queue_ms,
            chunks_indexed: self.index.len(),
            checkpoints_in_flight: self.checkpoints,
            restore_verified: self.p.metrics.value("den_restore_verified_total", &[]),
            restore_mismatch: self.p.metrics.value("den_restore_mismatch_total", &[]),
            backend: self.p.backend.clone(),
        }
    }
}
