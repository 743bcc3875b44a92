//! Checkpoints (spec §8.4): after a completion, record the route's prefix identity (so
//! it is advertised), capture its chunks on the device queue, store them in every tier,
//! wait for the receipts, publish, and only then mark the route durable. Also the
//! bookkeeping of replicas found missing or corrupt during restores.

use super::*;

impl Actor {
    /// Record the completed route's prefix identity and start its checkpoint.
    pub(super) fn after_completion(&mut self, work: &Work, output: &[Token]) {
        let route = &work.route;
        let request = &work.request;
        let cs = self.p.opts.chunk_size;
        let tiers = self.p.tiers.kinds();
        let row_bytes = self.engine.row_bytes;
        let now = self.now();
        let mut pool = self.p.pool.lock();
        let Some(r) = pool.route(route) else {
            return;
        };
        if tiers.is_empty() {
            // Nothing could ever make the route durable (evictable): do not keep it.
            let _ = pool.release_route(route);
            return;
        }
        let count = r.token_count();
        let all: Vec<Token> = request.tokens.iter().chain(output).copied().collect();
        let Some(route_tokens) = all.get(..count as usize) else {
            return;
        };
        let chunks = checkpoint_plan(route_tokens, request.processed_tokens(), cs);
        let prefixes: Vec<(u32, PrefixHash)> = chunks.iter().map(|d| (d.end(), d.hash)).collect();
        if let Err(e) = pool.record_prefixes(route, &request.model, prefixes) {
            tracing::warn!(%route, "cannot record the route's prefixes: {e}");
            return;
        }
        let _ = pool.touch(route, now);
        self.eager = self
            .eager
            .or(Some(tokio::time::Instant::now() + EAGER_HEARTBEAT));
        let needed: Vec<ChunkKey> = chunks
            .iter()
            .map(|d| ChunkKey::of(&request.model, d.hash))
            .collect();
        let todo: Vec<ChunkMeta> = chunks
            .iter()
            .filter(|d| {
                !self
                    .index
                    .holds_all(&ChunkKey::of(&request.model, d.hash), &tiers)
            })
            .map(|d| ChunkMeta::for_descriptor(&request.model, d, row_bytes))
            .collect();
        if todo.is_empty() {
            drop(pool);
            self.mark_durable(route, count, &needed);
            return;
        }
        let lease = match pool.lease(std::slice::from_ref(route)) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(%route, "cannot lease the route for its checkpoint: {e}");
                return;
            }
        };
        let pages = pool
            .get_lease(lease)
            .and_then(|l| l.entries.first())
            .map(|e| e.pages.clone())
            .unwrap_or_default();
        drop(pool);
        let job = self.next_job;
        self.next_job += 1;
        let bytes: u64 = todo.iter().map(|m| m.payload_bytes()).sum();
        let upload = self.upload_bytes_per_ms();
        self.p.queue.enqueue(job, bytes as f64 / upload);
        let (reply, rx) = oneshot::channel();
        self.checkpoints += 1;
        if !self.p.device.submit(Job::Capture {
            job,
            pages,
            chunks: todo,
            reply,
        }) {
            self.p.queue.finish(job);
            self.checkpoints -= 1;
            self.p.pool.lock().release_lease(lease);
            return;
        }
        let tx = self.internal_tx.clone();
        let route = route.clone();
        tokio::spawn(async move {
            let result = rx
                .await
                .unwrap_or_else(|_| Err("the device thread stopped".into()));
            let _ = tx.send(Internal::Captured {
                route,
                tokens: count,
                lease,
                needed,
                result,
            });
        });
    }

    pub(super) fn on_checkpointed(
        &mut self,
        route: RouteId,
        tokens: u32,
        needed: Vec<ChunkKey>,
        outcome: CheckpointOutcome,
    ) {
        for e in &outcome.errors {
            tracing::warn!(%route, "checkpoint: {e}");
        }
        if !outcome.errors.is_empty() {
            // A full disk or an unreachable object store shows here, not only in the log.
            self.p.metrics.counter_add(
                "den_checkpoint_errors_total",
                "Tier writes of checkpoints that failed (disk full, object store down, ...).",
                &[],
                outcome.errors.len() as f64,
            );
        }
        self.p.metrics.counter_add(
            "den_checkpoint_chunks_total",
            "Chunks stored by checkpoints (acknowledged by at least one tier).",
            &[],
            outcome.stored.len() as f64,
        );
        let published = self.index.record(&outcome.stored);
        if !published.is_empty() {
            self.send(&ToRouter::Publish(Publish { chunks: published }));
        }
        let retracted: Vec<RetractedChunk> = outcome
            .evicted
            .iter()
            .filter_map(|(key, tier)| self.index.forget(key, *tier))
            .collect();
        if !retracted.is_empty() {
            self.send(&ToRouter::Retract(Retract { chunks: retracted }));
        }
        self.tier_usage = outcome.usage;
        if outcome.complete {
            self.mark_durable(&route, tokens, &needed);
        }
    }

    /// The route's chunks are all stored: it is durable now, hence evictable.
    pub(super) fn mark_durable(&mut self, route: &RouteId, tokens: u32, needed: &[ChunkKey]) {
        if !needed.iter().all(|k| self.index.get(k).is_some()) {
            return;
        }
        let (prefill, _, _) = self.costs();
        let reload = tokens as f64 * self.engine.row_bytes as f64
            / self
                .tier_bytes_per_ms(Tier::Ram)
                .unwrap_or(DEFAULT_RAM_BYTES_PER_MS);
        let now = self.now();
        let mut pool = self.p.pool.lock();
        // A route that grew since (a continuation reused it) is not covered by these
        // chunks; it gets its own checkpoint when that assignment completes.
        if pool.route(route).is_none_or(|r| r.token_count() != tokens) {
            return;
        }
        let result = pool.update_policy(route, |p| {
            p.durable = true;
            p.reuse_probability = 0.5;
            p.recompute_ms = tokens as f64 * prefill;
            p.reload_ms = reload;
            p.last_access = p.last_access.max(now);
        });
        drop(pool);
        match result {
            Ok(()) => self.heartbeat_soon(),
            Err(e) => tracing::warn!(%route, "cannot mark the route durable: {e}"),
        }
    }

    pub(super) fn on_bad_replica(&mut self, bad: BadReplica) {
        let local = matches!(bad.tier, Tier::Ram | Tier::Ssd);
        let retraction = match self.index.forget(&bad.key, bad.tier) {
            Some(r) => Some(r),
            // The object store is shared: tell the router even if another worker wrote it.
            None if bad.tier == Tier::Object => Some(RetractedChunk {
                model: bad.model.clone(),
                hash: bad.hash,
                tier: Tier::Object,
            }),
            None => None,
        };
        if bad.corrupt
            && local
            && let Some(store) = self.p.tiers.get(bad.tier)
        {
            let key = bad.key;
            tokio::spawn(async move {
                let _ = store.delete(key).await;
            });
            self.refresh_usage();
        }
        if let Some(r) = retraction {
            tracing::info!(tier = r.tier.as_str(), chunk = %r.hash, corrupt = bad.corrupt, "retracting a replica");
            self.send(&ToRouter::Retract(Retract { chunks: vec![r] }));
        }
    }

    pub(super) fn refresh_usage(&self) {
        let tiers = self.p.tiers.clone();
        let tx = self.internal_tx.clone();
        tokio::spawn(async move {
            let _ = tx.send(Internal::Usage(tiers.usage().await));
        });
    }
}

/// The chunks a completed route is checkpointed as (and the boundaries it advertises):
/// every full chunk of the route's tokens, plus the request's own plan over its processed
/// prompt (whose last chunk may be partial: that is what the same prompt asks for next
/// time). The route's trailing partial chunk is left out (cheap to recompute).
pub fn checkpoint_plan(
    route_tokens: &[Token],
    processed: &[Token],
    chunk_size: u32,
) -> Vec<ChunkDescriptor> {
    let mut by_end: BTreeMap<(u32, u32), ChunkDescriptor> = BTreeMap::new();
    for d in plan_chunks(route_tokens, chunk_size) {
        if d.token_count == chunk_size {
            by_end.insert((d.start, d.token_count), d);
        }
    }
    if processed.len() <= route_tokens.len() {
        for d in plan_chunks(processed, chunk_size) {
            by_end.entry((d.start, d.token_count)).or_insert(d);
        }
    }
    let mut out: Vec<ChunkDescriptor> = by_end.into_values().collect();
    out.sort_by_key(|d| (d.start, d.token_count));
    // Dedupe identical hashes (a full request chunk equals the route's).
    let mut seen = BTreeSet::new();
    out.retain(|d| seen.insert(d.hash));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn checkpoint_plan_covers_full_route_chunks_and_the_prompt_end() {
        let route: Vec<Token> = (0..40).collect();
        let prompt = &route[..25];
        let plan = checkpoint_plan(&route, prompt, 16);
        let spans: Vec<(u32, u32)> = plan.iter().map(|d| (d.start, d.token_count)).collect();
        // Full chunks [0,16) and [16,32) of the route, the prompt's partial [16,25).
        assert_eq!(spans, vec![(0, 16), (16, 9), (16, 16)]);
        // The partial chunk chains from the first full chunk, like the next request's plan.
        assert_eq!(plan[1].parent, plan[0].hash);
        assert_eq!(plan[1].hash, plan_chunks(prompt, 16)[1].hash);
    }
}
