//! What the router believes about a worker between its heartbeats: the work it offered
//! there that no heartbeat shows yet (or that finished since one did, see
//! [`super::inflight`]), and GPU prefixes it assumes resident because a request just
//! completed there. Both amend the observations candidates are built from, until the
//! worker's next heartbeat says what really is.

use super::*;

/// GPU prefixes the router assumes resident on a worker because a request just completed
/// there, until that worker's next accepted heartbeat says what really is (llm-d's
/// speculative index entries, without a timer: the heartbeat is the confirmation). A
/// client that repeats a prompt right after its answer would otherwise miss the cache it
/// just warmed. A wrong guess costs one decline (`resident-prefix-unavailable`) and the
/// next candidate is offered.
#[derive(Debug, Default)]
pub(super) struct Speculation {
    /// Worker → (the heartbeat version the guess amends, the guessed prefixes).
    pub(super) prefixes: BTreeMap<WorkerId, (HeartbeatVersion, Vec<GpuPrefix>)>,
}

impl RouterActor {
    /// Live observations, amended with speculative GPU prefixes where the worker has not
    /// heartbeated since the guess (cloned only for those workers, right after a
    /// completion).
    pub(super) fn observations_with_speculation(&self) -> Vec<Cow<'_, Observation>> {
        self.discovery
            .registry()
            .observations()
            .map(|obs| {
                let guessed = match self.speculation.prefixes.get(&obs.worker_id) {
                    Some((version, guessed)) if *version == obs.version() => guessed.as_slice(),
                    _ => &[],
                };
                if guessed.is_empty() {
                    return Cow::Borrowed(obs);
                }
                let mut amended = obs.clone();
                for p in guessed {
                    if !amended
                        .gpu_prefixes
                        .iter()
                        .any(|q| q.model == p.model && q.prefix_hash == p.prefix_hash)
                    {
                        amended.gpu_prefixes.push(p.clone());
                    }
                }
                Cow::Owned(amended)
            })
            .collect()
    }

    /// Adds to each candidate's queue the work its worker's last heartbeat does not show
    /// (see [`super::inflight`]); per candidate, so a busy router clones no observation
    /// for it.
    pub(super) fn amend_queues(&self, candidates: &mut [den_protocol::candidate::Candidate]) {
        for c in candidates {
            let extra_ms = self.unreflected.extra_ms(&c.worker_id);
            if extra_ms != 0.0 {
                c.queue_ms = (c.queue_ms + extra_ms).max(0.0);
            }
        }
    }

    /// `request` completed on `worker`: assume its route (the prompt's chunk chain) is
    /// resident there until the worker's next heartbeat.
    pub(super) fn speculate(&mut self, worker: &WorkerId, request: &GenerationRequest) {
        let Some(obs) = self.discovery.registry().get(worker) else {
            return;
        };
        // A worker without a storage tier releases a completed route at once (nothing
        // could make it durable, hence evictable): there is nothing resident to guess,
        // and every guess would cost a declined offer.
        if obs.tier_throughput_bytes_per_ms.is_empty() {
            return;
        }
        let bytes_per_token = obs
            .pool
            .page_bytes
            .checked_div(u64::from(obs.page_size))
            .unwrap_or(0);
        let route = request.route_id();
        let plan = plan_chunks(request.processed_tokens(), self.shared.opts.chunk_size);
        let guessed = plan.iter().map(|d| GpuPrefix {
            model: request.model.clone(),
            prefix_hash: d.hash,
            continuation_id: route.clone(),
            token_count: d.end(),
            bytes: u64::from(d.end()) * bytes_per_token,
        });
        let version = obs.version();
        let entry = self
            .speculation
            .prefixes
            .entry(worker.clone())
            .or_insert_with(|| (version, Vec::new()));
        if entry.0 != version {
            *entry = (version, Vec::new());
        }
        entry.1.extend(guessed);
    }
}
