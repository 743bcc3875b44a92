//! The den console feed: workers (Pages panel, page pools on the Nodes panel) and
//! decision records (Routes panel).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use den_protocol::decision::{AttemptOutcome, DecisionRecord, TerminalOutcome};
use den_protocol::feed::FeedMessage;
use den_protocol::ids::{RequestId, WorkerId};
use den_protocol::observation::{Observation, PoolStats};
use den_protocol::session::SourceId;
use den_protocol::time::Millis;

use super::log::short;
use super::{Health, Level, Model, PageRow, RoutePhase, RouteRow, WorkerTrack};

impl Model {
    pub(super) fn feed(&mut self, at: Millis, source: &SourceId, message: &FeedMessage) {
        match message {
            FeedMessage::Hello {
                feed_version,
                router,
                ..
            } => {
                let track = self.source_mut(source);
                track.router = Some(router.clone());
                track.feed = Some(Health::Connected);
                self.log_line(
                    at,
                    Some(source),
                    Level::Info,
                    format!("feed hello from router {router} (feed v{feed_version})"),
                );
            }
            FeedMessage::Snapshot {
                workers, routes, ..
            } => {
                let seen: BTreeSet<&WorkerId> = workers.iter().map(|o| &o.worker_id).collect();
                self.workers
                    .retain(|(s, w), _| s != source || seen.contains(w));
                for observation in workers {
                    self.observe_worker(at, source, observation, false);
                }
                let ids: BTreeSet<&RequestId> = routes.iter().map(|r| &r.request).collect();
                self.routes
                    .retain_keys(|(s, r)| s != source || ids.contains(r));
                for record in routes {
                    self.upsert_route(at, source, record, false);
                }
                self.versions.routes += 1;
                self.workers_dirty = true;
                let track = self.source_mut(source);
                track.feed = Some(Health::Connected);
                if track.last_ok.is_none() {
                    track.last_ok = Some(at);
                }
                self.log_line(
                    at,
                    Some(source),
                    Level::Info,
                    format!(
                        "snapshot: {} workers, {} routes",
                        workers.len(),
                        routes.len()
                    ),
                );
            }
            FeedMessage::Worker { observation, .. } => {
                self.observe_worker(at, source, observation, true);
                self.workers_dirty = true;
            }
            FeedMessage::WorkerGone { worker, reason, .. } => {
                if let Some(track) = self.workers.get_mut(&(source.clone(), worker.clone())) {
                    track.gone = Some(reason.clone());
                }
                self.workers_dirty = true;
                self.log_line(
                    at,
                    Some(source),
                    Level::Warn,
                    format!("worker {worker} gone: {reason}"),
                );
            }
            FeedMessage::Route { record, .. } => {
                self.upsert_route(at, source, record, true);
                self.versions.routes += 1;
            }
            FeedMessage::RouteGone { request, .. } => {
                self.routes.remove(&(source.clone(), request.clone()));
                self.versions.routes += 1;
            }
        }
    }

    fn observe_worker(
        &mut self,
        at: Millis,
        source: &SourceId,
        observation: &Observation,
        narrate: bool,
    ) {
        let key = (source.clone(), observation.worker_id.clone());
        let occupancy = occupancy(&observation.pool);
        let history_len = self.config.history_len.max(1);
        let mut lines = Vec::new();
        match self.workers.get_mut(&key) {
            Some(track) => {
                let old = &track.observation;
                if old.draining != observation.draining {
                    lines.push(if observation.draining {
                        (Level::Warn, "draining: takes no new offers".to_owned())
                    } else {
                        (Level::Info, "no longer draining".to_owned())
                    });
                }
                if old.online != observation.online {
                    lines.push(if observation.online {
                        (Level::Good, "online".to_owned())
                    } else {
                        (Level::Bad, "offline".to_owned())
                    });
                }
                if track.gone.take().is_some() {
                    lines.push((Level::Good, "back".to_owned()));
                }
                // Only a newer heartbeat adds a sample; a repeated snapshot does not.
                if observation.version() > old.version() || track.history.is_empty() {
                    track.history.push_back(occupancy);
                    while track.history.len() > history_len {
                        track.history.pop_front();
                    }
                }
                *track.observation = observation.clone();
                track.received_at = at;
            }
            None => {
                lines.push((
                    Level::Info,
                    format!(
                        "joined (node {}, {} pages{})",
                        observation.node,
                        observation.pool.total_pages,
                        if observation.backend.is_empty() {
                            String::new()
                        } else {
                            format!(", {}", observation.backend)
                        }
                    ),
                ));
                self.workers.insert(
                    key,
                    WorkerTrack {
                        observation: Box::new(observation.clone()),
                        received_at: at,
                        history: VecDeque::from([occupancy]),
                        gone: None,
                    },
                );
            }
        }
        if narrate {
            for (level, text) in lines {
                let text = format!("worker {}: {text}", observation.worker_id);
                self.log_line(at, Some(source), level, text);
            }
        }
    }

    fn upsert_route(
        &mut self,
        at: Millis,
        source: &SourceId,
        record: &DecisionRecord,
        narrate: bool,
    ) {
        let key = (source.clone(), record.request.clone());
        let row = route_row(at, source, record);
        if narrate {
            let old = self.routes.get(&key);
            let old_setbacks = old.map_or(0, |r| r.setbacks.len());
            let new_setbacks: Vec<String> =
                row.setbacks.iter().skip(old_setbacks).cloned().collect();
            let was_terminal = old.is_some_and(|r| !r.phase.is_live());
            let was_waiting = old.is_some_and(|r| r.phase == RoutePhase::Waiting);
            let id = short(record.request.as_str()).to_owned();
            for setback in new_setbacks {
                self.log_line(
                    at,
                    Some(source),
                    Level::Warn,
                    format!("route {id}: {setback}"),
                );
            }
            if row.phase == RoutePhase::Waiting && !was_waiting {
                self.log_line(
                    at,
                    Some(source),
                    Level::Warn,
                    format!("route {id} waits for KV pages: no worker has room for it now"),
                );
            } else if was_waiting && record.waited_ms > 0 {
                // As the route's detail view writes it.
                let waited = crate::ui::cells::ms(record.waited_ms as f64);
                self.log_line(
                    at,
                    Some(source),
                    Level::Info,
                    format!("route {id} waited {waited} for KV pages"),
                );
            }
            if !was_terminal {
                match &record.outcome {
                    Some(TerminalOutcome::Failed { error }) => self.log_line(
                        at,
                        Some(source),
                        Level::Bad,
                        format!("route {id} failed: {error}"),
                    ),
                    Some(TerminalOutcome::Cancelled) => self.log_line(
                        at,
                        Some(source),
                        Level::Info,
                        format!("route {id} cancelled"),
                    ),
                    _ => {}
                }
            }
        }
        self.routes.upsert(key, row);
    }

    pub(super) fn rebuild_pages(&mut self) {
        self.views.pages = self
            .workers
            .iter()
            .map(|((source, worker), track)| {
                let o = &track.observation;
                PageRow {
                    source: source.clone(),
                    worker: worker.clone(),
                    node: o.node.clone(),
                    pool: o.pool,
                    history: track.history.iter().copied().collect(),
                    tiers: o.tiers.clone(),
                    evictions: o.evictions.clone(),
                    draining: o.draining,
                    online: o.online,
                    backend: o.backend.clone(),
                    queue_depth: o.queue_depth,
                    observed_at: track.received_at,
                    gone: track.gone.clone(),
                    inconsistent: inconsistency(&o.pool),
                }
            })
            .collect();
        self.versions.pages += 1;
    }

    /// Live workers (not gone) by node, for the Nodes panel.
    pub(super) fn workers_by_node(
        &self,
    ) -> std::collections::BTreeMap<den_protocol::ids::NodeId, Vec<(&WorkerId, &WorkerTrack)>> {
        let mut by_node: std::collections::BTreeMap<_, Vec<_>> = Default::default();
        for ((_, worker), track) in &self.workers {
            if track.gone.is_none() {
                by_node
                    .entry(track.observation.node.clone())
                    .or_insert_with(Vec::new)
                    .push((worker, track));
            }
        }
        by_node
    }
}

/// Used pages in percent (0 when the pool reports no pages).
fn occupancy(pool: &PoolStats) -> u8 {
    if pool.total_pages == 0 {
        return 0;
    }
    let used = pool.total_pages.saturating_sub(pool.free) as u64;
    ((used * 100) / pool.total_pages as u64).min(100) as u8
}

/// Pool stats that break their own rules (every page is free, reserved or resident;
/// evictable and durable pages are resident).
fn inconsistency(pool: &PoolStats) -> Option<String> {
    let sum = pool.free as u64 + pool.reserved as u64 + pool.resident as u64;
    if pool.total_pages > 0 && sum != pool.total_pages as u64 {
        return Some(format!(
            "free+reserved+resident = {sum} ≠ {} pages",
            pool.total_pages
        ));
    }
    if pool.evictable > pool.resident {
        return Some(format!(
            "evictable {} > resident {}",
            pool.evictable, pool.resident
        ));
    }
    if pool.durable > pool.resident {
        return Some(format!(
            "durable {} > resident {}",
            pool.durable, pool.resident
        ));
    }
    None
}

/// The Routes panel row of one decision record.
pub(crate) fn route_row(at: Millis, source: &SourceId, record: &DecisionRecord) -> RouteRow {
    let last = record.last_attempt();
    let phase = match (&record.outcome, last.map(|a| &a.outcome)) {
        (Some(TerminalOutcome::Completed), _) => RoutePhase::Completed,
        (Some(TerminalOutcome::Failed { .. }), _) => RoutePhase::Failed,
        (Some(TerminalOutcome::Cancelled), _) => RoutePhase::Cancelled,
        (None, Some(AttemptOutcome::Running)) => RoutePhase::Running,
        (None, Some(_)) => RoutePhase::Offered,
        (None, None) => RoutePhase::Waiting,
    };
    let setbacks = record
        .attempts
        .iter()
        .filter(|a| {
            !matches!(
                a.outcome,
                AttemptOutcome::Pending
                    | AttemptOutcome::Running
                    | AttemptOutcome::Completed
                    | AttemptOutcome::Cancelled
                    | AttemptOutcome::Superseded
            )
        })
        .map(|a| format!("#{} {} {}", a.attempt, a.worker, a.outcome))
        .collect();
    let error = match &record.outcome {
        Some(TerminalOutcome::Failed { error }) => Some(error.to_string()),
        _ => None,
    };
    RouteRow {
        source: source.clone(),
        request: record.request.clone(),
        model: record.model.to_string(),
        worker: last.map(|a| a.worker.clone()),
        tier: last.map(|a| a.tier),
        cached_tokens: last.map(|a| a.cached_tokens),
        predicted_ttft_ms: last.map(|a| a.predicted_ttft_ms),
        measured_ttft_ms: record.measured_ttft_ms,
        phase,
        attempt: last.map_or(0, |a| a.attempt),
        setbacks,
        error,
        submitted_at: record.submitted_at,
        updated_at: at,
        record: Arc::new(record.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inconsistent_pool_stats_are_named() {
        let ok = PoolStats {
            total_pages: 10,
            free: 4,
            reserved: 1,
            resident: 5,
            evictable: 2,
            durable: 3,
            page_bytes: 1,
        };
        assert_eq!(inconsistency(&ok), None);
        assert_eq!(occupancy(&ok), 60);
        let bad = PoolStats { evictable: 6, ..ok };
        assert!(inconsistency(&bad).unwrap().contains("evictable 6"));
        let lost = PoolStats { free: 3, ..ok };
        assert!(inconsistency(&lost).unwrap().contains("≠ 10"));
        assert_eq!(occupancy(&PoolStats::default()), 0);
    }
}
