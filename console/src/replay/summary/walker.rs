//! The one streaming pass behind the summary: each event of the recording, and what
//! the console's model concludes after each management poll, become the summary's
//! timeline, per-topic lists and page pressure.

use std::collections::{BTreeMap, BTreeSet};

use den_protocol::decision::{AttemptOutcome, DecisionRecord, TerminalOutcome};
use den_protocol::feed::FeedMessage;
use den_protocol::ids::{NodeId, RequestId, WorkerId};
use den_protocol::observation::Observation;
use den_protocol::session::{SessionEvent, SourceId, Stamped};
use den_protocol::time::Millis;

use super::super::Replayer;
use super::*;
use crate::model::{DownloadStatus, Health, InstanceRow, Model};

#[derive(Default)]
pub(super) struct Walker {
    pub(super) timeline: Vec<Item>,
    pub(super) sources: BTreeMap<SourceId, SourceSummary>,
    /// Sources whose management API answers (its latest poll succeeded).
    pub(super) answering: BTreeSet<SourceId>,
    pub(super) workers: BTreeMap<(SourceId, WorkerId), WorkerSummary>,
    pub(super) nodes_before: BTreeSet<NodeId>,
    pub(super) node_changes: Vec<NodeChange>,
    pub(super) commands: BTreeMap<u64, CommandSummary>,
    pub(super) failed_downloads: BTreeMap<String, (NodeId, String, String)>,
    pub(super) download_failures: Vec<DownloadFailure>,
    pub(super) instances_before: BTreeMap<String, (String, Option<String>, Vec<String>)>,
    pub(super) readiness: Vec<ReadinessChange>,
    pub(super) requests: BTreeMap<(SourceId, RequestId), RequestSummary>,
    pub(super) pressure: BTreeMap<(SourceId, WorkerId), PagePressure>,
}

impl Walker {
    fn item(&mut self, at: Millis, source: Option<&SourceId>, kind: &'static str, text: String) {
        self.timeline.push(Item {
            at,
            source: source.cloned(),
            kind,
            text,
        });
    }

    pub(super) fn event(&mut self, e: &Stamped, r: &mut Replayer) {
        let at = e.at;
        let mut settle = false;
        match &e.event {
            SessionEvent::SourceAdded { source, kind, url } => {
                self.sources.insert(
                    source.clone(),
                    SourceSummary {
                        source: source.clone(),
                        kind: kind.to_string(),
                        url: url.clone(),
                        connected: Vec::new(),
                        disconnected: Vec::new(),
                    },
                );
                self.item(
                    at,
                    Some(source),
                    "source",
                    format!("source added: {kind} {url}"),
                );
            }
            SessionEvent::Connected { source } => {
                if let Some(s) = self.sources.get_mut(source) {
                    s.connected.push(at);
                }
                self.item(at, Some(source), "source", "connected".to_owned());
            }
            SessionEvent::Disconnected { source, reason } => {
                if let Some(s) = self.sources.get_mut(source) {
                    s.disconnected.push((at, reason.clone()));
                }
                self.item(
                    at,
                    Some(source),
                    "source",
                    format!("disconnected: {reason}"),
                );
            }
            SessionEvent::Feed { source, message } => settle = self.feed(at, source, message),
            SessionEvent::SkulkState { source, .. } => {
                if self.answering.insert(source.clone()) {
                    if let Some(s) = self.sources.get_mut(source) {
                        s.connected.push(at);
                    }
                    self.item(
                        at,
                        Some(source),
                        "source",
                        "management API answers".to_owned(),
                    );
                }
                settle = true;
            }
            SessionEvent::Probe { .. } => settle = true,
            SessionEvent::PollFailed {
                source,
                endpoint,
                failure,
                ..
            } => {
                // Only the first failure of an outage changes the source's health.
                let was_down =
                    r.model_unsettled().views().sources.iter().any(|s| {
                        &s.source == source && matches!(s.api, Health::Disconnected { .. })
                    });
                if !was_down {
                    self.item(
                        at,
                        Some(source),
                        "source",
                        format!("GET {endpoint} failed: {failure}"),
                    );
                }
                if self.answering.remove(source)
                    && let Some(s) = self.sources.get_mut(source)
                {
                    s.disconnected
                        .push((at, format!("GET {endpoint}: {failure}")));
                }
                settle = true;
            }
            SessionEvent::SkulkNodeId { .. } => {}
            SessionEvent::Command { id, text } => {
                let placement = text.starts_with("place");
                self.commands.insert(
                    id.0,
                    CommandSummary {
                        id: id.0,
                        text: text.clone(),
                        issued_at: at,
                        placement,
                        progress: Vec::new(),
                        outcome: None,
                    },
                );
                self.item(at, None, "command", format!("operator: {text} ({id})"));
            }
            SessionEvent::CommandProgress { id, note } => {
                if let Some(c) = self.commands.get_mut(&id.0) {
                    c.progress.push((at, note.clone()));
                }
            }
            SessionEvent::CommandOutcome { id, status, detail } => {
                let text = self
                    .commands
                    .get(&id.0)
                    .map_or_else(|| format!("command {id}"), |c| c.text.clone());
                if let Some(c) = self.commands.get_mut(&id.0) {
                    c.outcome = Some((at, *status, detail.clone()));
                }
                self.item(
                    at,
                    None,
                    "command",
                    format!("{text} ({id}): {status}: {detail}"),
                );
            }
            SessionEvent::Note { .. }
            | SessionEvent::PlacementDeadline { .. }
            | SessionEvent::SkulkCatalog { .. } => {}
        }
        if settle {
            self.after_settle(at, r.model());
        }
    }

    /// Returns whether the model's rows may have changed in a way the summary tracks.
    fn feed(&mut self, at: Millis, source: &SourceId, message: &FeedMessage) -> bool {
        match message {
            FeedMessage::Hello { router, .. } => {
                self.item(
                    at,
                    Some(source),
                    "source",
                    format!("feed from router {router}"),
                );
                false
            }
            FeedMessage::Snapshot {
                workers, routes, ..
            } => {
                for o in workers {
                    self.observe(at, source, o);
                }
                for record in routes {
                    self.route(at, source, record);
                }
                true
            }
            FeedMessage::Worker { observation, .. } => {
                let known = self
                    .workers
                    .get(&(source.clone(), observation.worker_id.clone()))
                    .is_some_and(|w| w.left.is_empty());
                self.observe(at, source, observation);
                !known
            }
            FeedMessage::WorkerGone { worker, reason, .. } => {
                if let Some(w) = self.workers.get_mut(&(source.clone(), worker.clone())) {
                    w.left.push((at, reason.clone()));
                }
                self.item(
                    at,
                    Some(source),
                    "worker",
                    format!("worker {worker} gone: {reason}"),
                );
                true
            }
            FeedMessage::Route { record, .. } => {
                self.route(at, source, record);
                false
            }
            FeedMessage::RouteGone { .. } => false,
        }
    }

    fn observe(&mut self, at: Millis, source: &SourceId, o: &Observation) {
        let key = (source.clone(), o.worker_id.clone());
        match self.workers.get_mut(&key) {
            Some(w) => {
                if w.left.last().is_some_and(|(left, _)| *left > w.joined_at) {
                    // Back after leaving.
                    w.joined_at = at;
                    let text = format!("worker {} back", o.worker_id);
                    self.item(at, Some(source), "worker", text);
                }
            }
            None => {
                self.workers.insert(
                    key.clone(),
                    WorkerSummary {
                        source: source.clone(),
                        worker: o.worker_id.clone(),
                        node: o.node.clone(),
                        joined_at: at,
                        left: Vec::new(),
                    },
                );
                let text = format!(
                    "worker {} joined (node {}, {} pages)",
                    o.worker_id, o.node, o.pool.total_pages
                );
                self.item(at, Some(source), "worker", text);
            }
        }
        if o.pool.total_pages > 0 {
            let entry = self.pressure.entry(key).or_insert(PagePressure {
                source: source.clone(),
                worker: o.worker_id.clone(),
                node: o.node.clone(),
                lowest_free: o.pool.free,
                total_pages: o.pool.total_pages,
                at,
            });
            if o.pool.free < entry.lowest_free {
                entry.lowest_free = o.pool.free;
                entry.total_pages = o.pool.total_pages;
                entry.at = at;
            }
        }
    }

    fn route(&mut self, at: Millis, source: &SourceId, record: &DecisionRecord) {
        let key = (source.clone(), record.request.clone());
        let previous = self.requests.get(&key).cloned();
        let attempts: Vec<Attempt> = record
            .attempts
            .iter()
            .map(|a| Attempt {
                attempt: a.attempt,
                worker: a.worker.clone(),
                outcome: a.outcome.to_string(),
            })
            .collect();
        let setback = |o: &AttemptOutcome| {
            !matches!(
                o,
                AttemptOutcome::Pending
                    | AttemptOutcome::Running
                    | AttemptOutcome::Completed
                    | AttemptOutcome::Cancelled
                    | AttemptOutcome::Superseded
            )
        };
        let first_setback = record.attempts.iter().position(|a| setback(&a.outcome));
        let fallback = first_setback.and_then(|i| {
            let failed_worker = record.attempts.get(i).map(|a| &a.worker);
            record
                .attempts
                .iter()
                .skip(i + 1)
                .rev()
                .find(|a| !setback(&a.outcome) && Some(&a.worker) != failed_worker)
                .map(|a| a.worker.clone())
        });
        let (outcome, failed) = match &record.outcome {
            None => ("live".to_owned(), false),
            Some(TerminalOutcome::Failed { error }) => (format!("failed: {error}"), true),
            Some(o) => (o.to_string(), false),
        };
        let id = record.request.to_string();
        // New setbacks and the terminal failure go on the timeline.
        let seen_setbacks = previous.as_ref().map_or(0, |p| {
            p.attempts
                .iter()
                .filter(|a| a.outcome != "pending" && a.outcome != "running")
                .count()
        });
        let setbacks: Vec<String> = record
            .attempts
            .iter()
            .filter(|a| !matches!(a.outcome, AttemptOutcome::Pending | AttemptOutcome::Running))
            .skip(seen_setbacks)
            .filter(|a| setback(&a.outcome))
            .map(|a| {
                format!(
                    "request {id} attempt #{} on {}: {}",
                    a.attempt, a.worker, a.outcome
                )
            })
            .collect();
        for text in setbacks {
            self.item(at, Some(source), "request", text);
        }
        let was_failed = previous.as_ref().is_some_and(|p| p.failed);
        if failed && !was_failed {
            self.item(
                at,
                Some(source),
                "request",
                format!("request {id} {outcome}"),
            );
        }
        let was_fallback = previous.as_ref().and_then(|p| p.fallback.clone());
        if let Some(worker) = &fallback
            && was_fallback.as_ref() != Some(worker)
        {
            self.item(
                at,
                Some(source),
                "request",
                format!("request {id} falls back to {worker}"),
            );
        }
        self.requests.insert(
            key,
            RequestSummary {
                source: source.clone(),
                request: record.request.clone(),
                model: record.model.to_string(),
                seen_at: previous.as_ref().map_or(at, |p| p.seen_at),
                outcome,
                failed,
                attempts,
                fallback,
            },
        );
    }

    fn after_settle(&mut self, at: Millis, model: &Model) {
        let nodes = node_ids(model);
        let before = std::mem::take(&mut self.nodes_before);
        for node in nodes.difference(&before) {
            self.node_changes.push(NodeChange {
                at,
                node: node.clone(),
                joined: true,
            });
            let label = model.node_label(node);
            self.item(at, None, "node", format!("node {label} appears"));
        }
        for node in before.difference(&nodes) {
            self.node_changes.push(NodeChange {
                at,
                node: node.clone(),
                joined: false,
            });
            self.item(at, None, "node", format!("node {node} no longer seen"));
        }
        self.nodes_before = nodes;

        let failed = failed_downloads(model);
        for (key, (node, model_id, error)) in &failed {
            if !self.failed_downloads.contains_key(key) {
                self.download_failures.push(DownloadFailure {
                    at,
                    node: node.clone(),
                    model: model_id.clone(),
                    error: error.clone(),
                });
                let text = format!(
                    "download of {model_id} on {} failed: {error}",
                    model.node_label(node)
                );
                self.item(at, None, "download", text);
            }
        }
        self.failed_downloads = failed;

        let now = verdicts(model);
        for (instance, (verdict, model_id, reasons)) in &now {
            let before = self.instances_before.get(instance).map(|v| &v.0);
            if before != Some(verdict) {
                self.readiness.push(ReadinessChange {
                    at,
                    instance: instance.clone(),
                    model: model_id.clone(),
                    verdict: verdict.clone(),
                    reasons: reasons.clone(),
                });
                let short = crate::model::short(instance);
                let what = model_id.as_deref().unwrap_or("?");
                let why = if reasons.is_empty() {
                    String::new()
                } else {
                    format!(": {}", reasons.join("; "))
                };
                self.item(
                    at,
                    None,
                    "readiness",
                    format!("instance {short} ({what}) {verdict}{why}"),
                );
            }
        }
        let gone: Vec<String> = self
            .instances_before
            .keys()
            .filter(|i| !now.contains_key(*i))
            .cloned()
            .collect();
        for instance in &gone {
            {
                let short = crate::model::short(instance);
                self.item(at, None, "readiness", format!("instance {short} gone"));
            }
        }
        self.instances_before = now;
    }
}

pub(super) fn node_ids(model: &Model) -> BTreeSet<NodeId> {
    model.views().nodes.iter().map(|n| n.node.clone()).collect()
}

pub(super) fn failed_downloads(model: &Model) -> BTreeMap<String, (NodeId, String, String)> {
    model
        .views()
        .downloads
        .iter()
        .filter(|d| d.status == DownloadStatus::Failed)
        .map(|d| {
            (
                d.key.clone(),
                (
                    d.node.clone(),
                    d.model.clone(),
                    d.error.clone().unwrap_or_default(),
                ),
            )
        })
        .collect()
}

pub(super) fn verdicts(model: &Model) -> BTreeMap<String, (String, Option<String>, Vec<String>)> {
    model
        .views()
        .instances
        .iter()
        .filter_map(|row| match row {
            InstanceRow::Instance {
                instance,
                model,
                verdict,
                ..
            } => Some((
                instance.clone(),
                (verdict.kind.clone(), model.clone(), verdict.reasons.clone()),
            )),
            InstanceRow::Assignment { .. } => None,
        })
        .collect()
}
