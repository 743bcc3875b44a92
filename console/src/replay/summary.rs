//! `den replay FILE --summary` and `--at TIME`: a recording as text (or JSON) without a
//! terminal.
//!
//! The summary is one streaming pass through the recording with the console's model:
//! what the events say directly (sources connecting and disconnecting, workers joining
//! and leaving, commands and their outcomes, decision records with setbacks, page pools)
//! plus what the model concludes after each management poll (nodes appearing and
//! disappearing, download failures, readiness verdict changes), as an incident timeline
//! and per topic.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use den_protocol::decision::{AttemptOutcome, DecisionRecord, TerminalOutcome};
use den_protocol::feed::FeedMessage;
use den_protocol::ids::{NodeId, RequestId, WorkerId};
use den_protocol::observation::Observation;
use den_protocol::recording::Offset;
use den_protocol::session::{CommandStatus, SessionEvent, SourceId, Stamped};
use den_protocol::time::Millis;

use super::{ReplayError, Replayer};
use crate::model::{DownloadStatus, Health, InstanceRow, Model};
use crate::record::paths::utc_time;

/// Most requests listed (the rest are counted).
const MAX_REQUESTS: usize = 200;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub recording: Info,
    pub sources: Vec<SourceSummary>,
    pub timeline: Vec<Item>,
    pub workers: Vec<WorkerSummary>,
    pub nodes: Vec<NodeChange>,
    pub commands: Vec<CommandSummary>,
    pub download_failures: Vec<DownloadFailure>,
    pub readiness: Vec<ReadinessChange>,
    pub requests: Vec<RequestSummary>,
    /// Failed or retried requests beyond those listed.
    pub requests_not_listed: usize,
    pub page_pressure: Vec<PagePressure>,
    pub problems: Problems,
}

#[derive(Debug, Clone, Serialize)]
pub struct Info {
    pub files: Vec<String>,
    pub id: String,
    pub format_version: String,
    pub den_version: String,
    pub host: String,
    pub started_at: String,
    pub started_at_unix_ms: u64,
    pub start_ms: u64,
    pub end_ms: u64,
    pub events: u64,
    pub redaction: String,
    /// Earlier segments were deleted (retention) or are missing.
    pub missing_start: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Item {
    pub at: Millis,
    pub source: Option<SourceId>,
    pub kind: &'static str,
    pub text: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct SourceSummary {
    pub source: SourceId,
    pub kind: String,
    pub url: String,
    pub connected: Vec<Millis>,
    pub disconnected: Vec<(Millis, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerSummary {
    pub source: SourceId,
    pub worker: WorkerId,
    pub node: NodeId,
    pub joined_at: Millis,
    /// When it left and why (`heartbeat expired`, `disconnected`…).
    pub left: Vec<(Millis, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeChange {
    pub at: Millis,
    pub node: NodeId,
    pub joined: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct CommandSummary {
    pub id: u64,
    pub text: String,
    pub issued_at: Millis,
    pub placement: bool,
    pub progress: Vec<(Millis, String)>,
    pub outcome: Option<(Millis, CommandStatus, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DownloadFailure {
    pub at: Millis,
    pub node: NodeId,
    pub model: String,
    pub error: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReadinessChange {
    pub at: Millis,
    pub instance: String,
    pub model: Option<String>,
    pub verdict: String,
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    pub attempt: u64,
    pub worker: WorkerId,
    pub outcome: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RequestSummary {
    pub source: SourceId,
    pub request: RequestId,
    pub model: String,
    /// Console time of the first record seen.
    pub seen_at: Millis,
    /// `completed`, `failed: …`, `cancelled` or `live`.
    pub outcome: String,
    pub failed: bool,
    pub attempts: Vec<Attempt>,
    /// The worker that took over after a setback.
    pub fallback: Option<WorkerId>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PagePressure {
    pub source: SourceId,
    pub worker: WorkerId,
    pub node: NodeId,
    pub lowest_free: u32,
    pub total_pages: u32,
    pub at: Millis,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Problems {
    /// Events the recorder dropped (a disk that could not keep up), by where.
    pub dropped: Vec<(Millis, u64)>,
    pub torn: Vec<(String, u64)>,
    pub skipped_lines: u64,
}

/// Walk the whole recording.
pub fn summarise(path: &Path) -> Result<Summary, ReplayError> {
    let mut r = Replayer::open(path)?;
    let model = r.model();
    let mut w = Walker {
        nodes_before: node_ids(model),
        instances_before: verdicts(model),
        failed_downloads: failed_downloads(model),
        ..Walker::default()
    };
    while r.step_forward()? {
        let Some(event) = r.last_event().cloned() else {
            continue;
        };
        w.event(&event, &mut r);
    }
    let header = r.recording().header().clone();
    let warnings = r.warnings().clone();
    let mut requests: Vec<RequestSummary> = w
        .requests
        .into_values()
        .filter(|q| q.failed || q.attempts.len() > 1 || q.fallback.is_some())
        .collect();
    requests.sort_by_key(|q| (q.seen_at, q.request.clone()));
    let requests_not_listed = requests.len().saturating_sub(MAX_REQUESTS);
    requests.truncate(MAX_REQUESTS);
    let mut page_pressure: Vec<PagePressure> = w.pressure.into_values().collect();
    page_pressure.sort_by(|a, b| {
        let ratio = |p: &PagePressure| p.lowest_free as f64 / p.total_pages.max(1) as f64;
        ratio(a).total_cmp(&ratio(b)).then(a.worker.cmp(&b.worker))
    });
    let mut timeline = w.timeline;
    timeline.sort_by_key(|i| i.at);
    Ok(Summary {
        recording: Info {
            files: r
                .recording()
                .paths()
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            id: header.recording.clone(),
            format_version: header.version.clone(),
            den_version: header.den_version.clone(),
            host: header.host.clone(),
            started_at: utc_time(header.started_at_unix_ms),
            started_at_unix_ms: header.started_at_unix_ms,
            start_ms: r.start().0,
            end_ms: r.end().0,
            events: r.ordinal(),
            redaction: header.redaction.policy.clone(),
            missing_start: r.recording().missing_before,
        },
        sources: w.sources.into_values().collect(),
        timeline,
        workers: w.workers.into_values().collect(),
        nodes: w.node_changes,
        commands: w.commands.into_values().collect(),
        download_failures: w.download_failures,
        readiness: w.readiness,
        requests,
        requests_not_listed,
        page_pressure,
        problems: Problems {
            dropped: warnings.gaps.clone(),
            torn: warnings.torn.clone(),
            skipped_lines: warnings.skipped,
        },
    })
}

#[derive(Default)]
struct Walker {
    timeline: Vec<Item>,
    sources: BTreeMap<SourceId, SourceSummary>,
    /// Sources whose management API answers (its latest poll succeeded).
    answering: BTreeSet<SourceId>,
    workers: BTreeMap<(SourceId, WorkerId), WorkerSummary>,
    nodes_before: BTreeSet<NodeId>,
    node_changes: Vec<NodeChange>,
    commands: BTreeMap<u64, CommandSummary>,
    failed_downloads: BTreeMap<String, (NodeId, String, String)>,
    download_failures: Vec<DownloadFailure>,
    instances_before: BTreeMap<String, (String, Option<String>, Vec<String>)>,
    readiness: Vec<ReadinessChange>,
    requests: BTreeMap<(SourceId, RequestId), RequestSummary>,
    pressure: BTreeMap<(SourceId, WorkerId), PagePressure>,
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

    fn event(&mut self, e: &Stamped, r: &mut Replayer) {
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

fn node_ids(model: &Model) -> BTreeSet<NodeId> {
    model.views().nodes.iter().map(|n| n.node.clone()).collect()
}

fn failed_downloads(model: &Model) -> BTreeMap<String, (NodeId, String, String)> {
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

fn verdicts(model: &Model) -> BTreeMap<String, (String, Option<String>, Vec<String>)> {
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

fn t(at: Millis) -> String {
    Offset(at).to_string()
}

/// The summary as text.
pub fn text(s: &Summary) -> String {
    let mut out = String::new();
    let i = &s.recording;
    let _ = writeln!(
        out,
        "den recording {} (format {}, den {}, host {})",
        i.id, i.format_version, i.den_version, i.host
    );
    for f in &i.files {
        let _ = writeln!(out, "  file {f}");
    }
    let _ = writeln!(
        out,
        "  started {}; {} to {} ({} events); redaction {}",
        i.started_at,
        t(Millis(i.start_ms)),
        t(Millis(i.end_ms)),
        i.events,
        i.redaction
    );
    if i.missing_start {
        out.push_str("  earlier segments are missing (deleted by retention?): the summary starts at the first one found\n");
    }

    out.push_str("\nSOURCES\n");
    for src in &s.sources {
        let _ = write!(out, "  {} ({} {})", src.source, src.kind, src.url);
        if !src.connected.is_empty() {
            let times: Vec<String> = src.connected.iter().map(|a| t(*a)).collect();
            let _ = write!(out, ": connected {}", times.join(", "));
        }
        for (at, reason) in &src.disconnected {
            let _ = write!(out, "; disconnected {}: {reason}", t(*at));
        }
        out.push('\n');
    }

    out.push_str("\nTIMELINE\n");
    if s.timeline.is_empty() {
        out.push_str("  nothing happened\n");
    }
    for item in &s.timeline {
        let source = item
            .source
            .as_ref()
            .map_or(String::new(), |s| format!("[{s}] "));
        let _ = writeln!(out, "  {}  {source}{}", t(item.at), item.text);
    }

    out.push_str("\nWORKERS\n");
    if s.workers.is_empty() {
        out.push_str("  none\n");
    }
    for w in &s.workers {
        let _ = write!(
            out,
            "  {} on node {}: joined {}",
            w.worker,
            w.node,
            t(w.joined_at)
        );
        for (at, reason) in &w.left {
            let _ = write!(out, "; left {} ({reason})", t(*at));
        }
        out.push('\n');
    }

    out.push_str("\nPLACEMENTS AND OTHER COMMANDS\n");
    if s.commands.is_empty() {
        out.push_str("  none\n");
    }
    for c in &s.commands {
        let outcome = c.outcome.as_ref().map_or_else(
            || "no outcome recorded".to_owned(),
            |(at, status, detail)| format!("{status} at {}: {detail}", t(*at)),
        );
        let _ = writeln!(
            out,
            "  #{} {} (issued {}): {outcome}",
            c.id,
            c.text,
            t(c.issued_at)
        );
        for (at, note) in &c.progress {
            let _ = writeln!(out, "      {}  {note}", t(*at));
        }
    }

    out.push_str("\nREQUESTS FAILED OR RETRIED\n");
    if s.requests.is_empty() {
        out.push_str("  none\n");
    }
    for q in &s.requests {
        let attempts: Vec<String> = q
            .attempts
            .iter()
            .map(|a| format!("#{} {} {}", a.attempt, a.worker, a.outcome))
            .collect();
        let fallback = q
            .fallback
            .as_ref()
            .map_or_else(String::new, |w| format!("; fallback {w}"));
        let _ = writeln!(
            out,
            "  {} ({}, first seen {}): {}; attempts: {}{fallback}",
            q.request,
            q.model,
            t(q.seen_at),
            q.outcome,
            attempts.join(", ")
        );
    }
    if s.requests_not_listed > 0 {
        let _ = writeln!(out, "  … and {} more", s.requests_not_listed);
    }

    out.push_str("\nDOWNLOAD FAILURES\n");
    if s.download_failures.is_empty() {
        out.push_str("  none\n");
    }
    for d in &s.download_failures {
        let _ = writeln!(out, "  {}  {} on {}: {}", t(d.at), d.model, d.node, d.error);
    }

    out.push_str("\nREADINESS CHANGES\n");
    if s.readiness.is_empty() {
        out.push_str("  none\n");
    }
    for c in &s.readiness {
        let _ = writeln!(
            out,
            "  {}  {} ({}): {}{}",
            t(c.at),
            c.instance,
            c.model.as_deref().unwrap_or("?"),
            c.verdict,
            if c.reasons.is_empty() {
                String::new()
            } else {
                format!(": {}", c.reasons.join("; "))
            }
        );
    }

    out.push_str("\nPAGE PRESSURE (lowest free pages per worker)\n");
    if s.page_pressure.is_empty() {
        out.push_str("  no page pools reported\n");
    }
    for p in &s.page_pressure {
        let used = 100.0 - 100.0 * p.lowest_free as f64 / p.total_pages.max(1) as f64;
        let _ = writeln!(
            out,
            "  {} (node {}): {} of {} pages free ({used:.1}% used) at {}",
            p.worker,
            p.node,
            p.lowest_free,
            p.total_pages,
            t(p.at)
        );
    }

    out.push_str("\nRECORDING PROBLEMS\n");
    let pr = &s.problems;
    if pr.dropped.is_empty() && pr.torn.is_empty() && pr.skipped_lines == 0 {
        out.push_str("  none\n");
    }
    for (at, n) in &pr.dropped {
        let _ = writeln!(
            out,
            "  {n} events dropped before {} (the recorder could not keep up)",
            t(*at)
        );
    }
    for (file, bytes) in &pr.torn {
        let _ = match bytes {
            // A zstd stream cut mid-frame ends in an error with no partial line in hand.
            0 => writeln!(
                out,
                "  {file}: the compressed stream ends early (the recorder stopped mid-write); everything before the cut was read"
            ),
            _ => writeln!(
                out,
                "  {file}: the last {bytes} bytes are an incomplete line (the recorder stopped mid-write)"
            ),
        };
    }
    if pr.skipped_lines > 0 {
        let _ = writeln!(out, "  {} lines could not be read", pr.skipped_lines);
    }
    out
}

/// `--at TIME`: every panel as it was at `t`, as text or JSON.
pub fn at(path: &Path, t: Millis, json: bool) -> Result<String, ReplayError> {
    let mut r = Replayer::open(path)?;
    r.seek(t)?;
    let t = r.position();
    let model = r.model().clone();
    let mut answered = BTreeSet::new();
    let mut problems = BTreeMap::new();
    for s in &model.views().sources {
        match s.health() {
            Health::Connected => {
                answered.insert(s.source.clone());
            }
            Health::Connecting => {
                problems.insert(s.source.clone(), "no answer yet".to_owned());
            }
            Health::Disconnected { reason, .. } => {
                problems.insert(s.source.clone(), format!("down: {reason}"));
            }
        }
    }
    let events: Vec<crate::model::EventLine> = model.events().to_vec();
    let gathered = crate::status::Gathered {
        model,
        now: t,
        answered,
        problems,
    };
    if json {
        let panels: serde_json::Value = serde_json::from_str(&crate::status::snapshot_json(
            &gathered,
            gathered.problems.is_empty(),
        ))
        .unwrap_or(serde_json::Value::Null);
        let out = serde_json::json!({
            "at_ms": t.0,
            "at": Offset(t).to_string(),
            "panels": panels,
            "events": events,
        });
        return Ok(serde_json::to_string_pretty(&out).unwrap_or_default());
    }
    let header = r.recording().header();
    let wall = utc_time(header.started_at_unix_ms.saturating_add(t.0));
    let mut out = format!(
        "den recording {} at {} ({wall}), after {} events\n",
        header.recording,
        Offset(t),
        r.ordinal()
    );
    out.push_str(&crate::status::snapshot_text(&gathered));
    let _ = writeln!(
        out,
        "\nEVENTS (last {} of {})",
        events.len().min(40),
        events.len()
    );
    for line in events.iter().rev().take(40).rev() {
        let source = line
            .source
            .as_ref()
            .map_or(String::new(), |s| format!("[{s}] "));
        let _ = writeln!(out, "  {}  {source}{}", Offset(line.at), line.text);
    }
    Ok(out)
}
