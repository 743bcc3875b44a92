//! GPU prefixes the router assumes resident on a worker because a request just completed
//! there, until that worker's next accepted heartbeat says what really is (llm-d's
//! speculative index entries, without a timer: the heartbeat is the confirmation). A
//! client that repeats a prompt right after its answer would otherwise miss the cache it
//! just warmed. A wrong guess costs one decline (`resident-prefix-unavailable`) and the
//! next candidate is offered.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::chunk::plan_chunks;
use crate::discovery::Registry;
use crate::ids::{HeartbeatVersion, WorkerId};
use crate::observation::{GpuPrefix, Observation};
use crate::request::GenerationRequest;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Speculation {
    /// Worker → (the heartbeat version the guess amends, the guessed prefixes).
    prefixes: BTreeMap<WorkerId, (HeartbeatVersion, Vec<GpuPrefix>)>,
}

impl Speculation {
    /// Live observations, amended with speculative GPU prefixes where the worker has not
    /// heartbeated since the guess (cloned only for those workers, right after a
    /// completion).
    pub fn amended<'a>(&self, registry: &'a Registry) -> Vec<Cow<'a, Observation>> {
        registry
            .observations()
            .map(|obs| {
                let guessed = match self.prefixes.get(&obs.worker_id) {
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

    /// `request` completed on the worker of `obs` (its newest observation): assume its
    /// route (the prompt's chunk chain) is resident there until the worker's next
    /// heartbeat.
    pub fn completed(&mut self, obs: &Observation, request: &GenerationRequest, chunk_size: u32) {
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
        let plan = plan_chunks(request.processed_tokens(), chunk_size);
        let guessed = plan.iter().map(|d| GpuPrefix {
            model: request.model.clone(),
            prefix_hash: d.hash,
            continuation_id: route.clone(),
            token_count: d.end(),
            bytes: u64::from(d.end()) * bytes_per_token,
        });
        let version = obs.version();
        let entry = self
            .prefixes
            .entry(obs.worker_id.clone())
            .or_insert_with(|| (version, Vec::new()));
        if entry.0 != version {
            *entry = (version, Vec::new());
        }
        entry.1.extend(guessed);
    }

    /// The worker heartbeated (or left): its guesses are superseded.
    pub fn forget(&mut self, worker: &WorkerId) {
        self.prefixes.remove(worker);
    }
}
