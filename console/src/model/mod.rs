//! The console's model: a pure reducer over [`Stamped`] session events.
//!
//! [`Model::apply`] folds one event in; [`Model::settle`] recomputes the derived rows of
//! the panels whose inputs changed (call it once before drawing, not per event); the
//! rows are then read through [`Model::views`] and [`Model::routes`]. Nothing here reads
//! a clock: the time of an event is its stamp, and how old something looks is decided
//! by the `now` a frame is drawn at. The same events give the same model, which is what
//! makes recordings replayable.
//!
//! Skulk-compatible `/state` answers go through the protocol's [`EvidenceReducer`]
//! (identity binding, two-sided membership, attempt-attributed downloads, verdicts with
//! deadlines): the Nodes, Downloads and Instances panels show what it concludes instead
//! of re-deriving it. The den console feed gives the Pages and Routes panels.

mod checkpoint;
mod cluster;
mod feed;
mod log;
pub mod rows;
mod sources;

use std::collections::{BTreeMap, VecDeque};

use den_protocol::evidence::{
    EndpointLabel, EvidenceConfig, EvidenceReducer, EvidenceReport, Input, ProbeOutcome,
};
use den_protocol::ids::{NodeId, RequestId, WorkerId};
use den_protocol::observation::Observation;
use den_protocol::session::{
    CommandSeq, CommandStatus, SessionEvent, SourceId, SourceKind, Stamped,
};
use den_protocol::skulk::{InstanceId, State};
use den_protocol::time::Millis;

pub use checkpoint::{Checkpoint, CheckpointError};
pub use log::short;
pub use rows::*;

/// Tunables of the model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    /// A value older than this is drawn aged; evidence older than this expires.
    pub stale_after_ms: u64,
    /// Heartbeats kept per worker for the occupancy sparkline.
    pub history_len: usize,
    /// Lines kept in the Events panel.
    pub event_log_len: usize,
    /// A connected source whose last good answer is older than this is shown silent
    /// (a frozen node answers nothing, and each poll only fails at its timeout).
    #[serde(default = "default_silent_after_ms")]
    pub silent_after_ms: u64,
}

fn default_silent_after_ms() -> u64 {
    5_000
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            stale_after_ms: 10_000,
            history_len: 40,
            event_log_len: 2_000,
            silent_after_ms: default_silent_after_ms(),
        }
    }
}

/// How long a removed instance stays listed (as removed, with its model and cause)
/// before it ages out.
pub const REMOVED_KEPT_MS: u64 = 10 * 60_000;

/// Derived rows of the small panels, rebuilt by [`Model::settle`].
#[derive(Debug, Clone, Default)]
pub struct Views {
    pub sources: Vec<SourceRow>,
    pub nodes: Vec<NodeRow>,
    pub downloads: Vec<DownloadRow>,
    pub instances: Vec<InstanceRow>,
    pub pages: Vec<PageRow>,
}

/// Change counters, one per panel: a panel's rows changed when its counter did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Versions {
    pub sources: u64,
    pub nodes: u64,
    pub downloads: u64,
    pub instances: u64,
    pub pages: u64,
    pub routes: u64,
    pub events: u64,
}

/// One command the operator issued, and how it went.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CommandTrack {
    pub text: String,
    pub issued_at: Millis,
    pub notes: Vec<String>,
    pub outcome: Option<(CommandStatus, String)>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct SourceTrack {
    kind: SourceKind,
    url: String,
    feed: Option<Health>,
    api: Health,
    latency_ms: Option<u64>,
    last_ok: Option<Millis>,
    node: Option<NodeId>,
    /// A `/node_id` answer not yet handed to the evidence reducer.
    pending_node: Option<NodeId>,
    router: Option<NodeId>,
    /// When the latest `/state` arrived.
    state_at: Option<Millis>,
    /// This host's wall clock then (UNIX ms), to age the state's `lastSeen` times.
    #[serde(default)]
    state_clock: Option<u64>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct WorkerTrack {
    observation: Box<Observation>,
    received_at: Millis,
    history: VecDeque<u8>,
    gone: Option<String>,
}

/// Rows kept in a vector with an index by key, so that one change costs one update.
#[derive(Debug, Clone)]
struct Indexed<K: Ord, R> {
    rows: Vec<R>,
    index: BTreeMap<K, usize>,
}

impl<K: Ord + Clone, R> Default for Indexed<K, R> {
    fn default() -> Self {
        Indexed {
            rows: Vec::new(),
            index: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone, R> Indexed<K, R> {
    fn get(&self, key: &K) -> Option<&R> {
        self.index.get(key).and_then(|i| self.rows.get(*i))
    }

    fn upsert(&mut self, key: K, row: R) {
        match self.index.get(&key).and_then(|i| self.rows.get_mut(*i)) {
            Some(slot) => *slot = row,
            None => {
                self.index.insert(key, self.rows.len());
                self.rows.push(row);
            }
        }
    }

    fn remove(&mut self, key: &K) -> Option<R> {
        let i = self.index.remove(key)?;
        if i >= self.rows.len() {
            return None;
        }
        let row = self.rows.swap_remove(i);
        // The former last row now lives at `i`.
        if i < self.rows.len()
            && let Some(moved) = self.index.values_mut().find(|v| **v == self.rows.len())
        {
            *moved = i;
        }
        Some(row)
    }

    fn retain_keys(&mut self, mut keep: impl FnMut(&K) -> bool) {
        let gone: Vec<K> = self.index.keys().filter(|k| !keep(k)).cloned().collect();
        for key in gone {
            self.remove(&key);
        }
    }
}

/// The console model.
#[derive(Debug, Clone)]
pub struct Model {
    config: ModelConfig,
    now: Millis,
    sources: BTreeMap<SourceId, SourceTrack>,
    evidence: EvidenceReducer,
    /// When the evidence reducer last took an input: the report is computed as of this
    /// time, so that the rows depend only on the events applied, never on when
    /// [`Model::settle`] happened to run (a replay settles at other moments than the
    /// live console did and must draw the same rows).
    evidence_at: Option<Millis>,
    report: Option<EvidenceReport>,
    workers: BTreeMap<(SourceId, WorkerId), WorkerTrack>,
    routes: Indexed<(SourceId, RequestId), RouteRow>,
    commands: BTreeMap<CommandSeq, CommandTrack>,
    log: Vec<EventLine>,
    log_seq: u64,
    node_names: BTreeMap<NodeId, String>,
    views: Views,
    versions: Versions,
    cluster_dirty: bool,
    workers_dirty: bool,
    sources_dirty: bool,
    /// The newest inference record of each instance a den router reported, by source:
    /// a changed one is a probe observed through that management API.
    inference_seen: BTreeMap<(SourceId, InstanceId), (u64, Option<String>)>,
    /// Each source's model catalog (`GET /v1/models`), for completion.
    catalogs: BTreeMap<SourceId, Vec<String>>,
}

impl Default for Model {
    fn default() -> Self {
        Model::new(ModelConfig::default())
    }
}

impl Model {
    pub fn new(config: ModelConfig) -> Model {
        let evidence = EvidenceReducer::new(EvidenceConfig {
            stale_after_ms: config.stale_after_ms,
            // An observer follows a Skulk node through its restarts (a new node id at
            // the same endpoint); placements keep the sticky conflict.
            follow_restarts: true,
            forget_gone_after_ms: Some(REMOVED_KEPT_MS),
            ..EvidenceConfig::default()
        });
        Model {
            config,
            now: Millis::ZERO,
            sources: BTreeMap::new(),
            evidence,
            evidence_at: None,
            report: None,
            workers: BTreeMap::new(),
            routes: Indexed::default(),
            commands: BTreeMap::new(),
            log: Vec::new(),
            log_seq: 0,
            node_names: BTreeMap::new(),
            views: Views::default(),
            versions: Versions::default(),
            cluster_dirty: false,
            workers_dirty: false,
            sources_dirty: false,
            inference_seen: BTreeMap::new(),
            catalogs: BTreeMap::new(),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The time of the latest event applied.
    pub fn now(&self) -> Millis {
        self.now
    }

    /// Fold one event in. Events are expected in stamp order; an older stamp is treated
    /// as "now" (it cannot move time backwards).
    pub fn apply(&mut self, stamped: &Stamped) {
        self.now = self.now.max(stamped.at);
        let at = self.now;
        match &stamped.event {
            SessionEvent::SourceAdded { source, kind, url } => {
                self.add_source(at, source, *kind, url)
            }
            SessionEvent::Connected { source } => self.connected(at, source),
            SessionEvent::Disconnected { source, reason } => self.disconnected(at, source, reason),
            SessionEvent::Feed { source, message } => self.feed(at, source, message),
            SessionEvent::SkulkNodeId { source, node } => self.node_id(at, source, node),
            SessionEvent::SkulkCatalog { source, models } => {
                self.catalogs.insert(
                    source.clone(),
                    models.iter().map(ToString::to_string).collect(),
                );
            }
            SessionEvent::SkulkState {
                source,
                state,
                latency_ms,
                received_unix_ms,
            } => self.state(at, source, state, *latency_ms, *received_unix_ms),
            SessionEvent::PollFailed {
                source,
                endpoint,
                failure,
                latency_ms,
            } => self.poll_failed(at, source, endpoint, failure, *latency_ms),
            SessionEvent::Probe {
                source,
                instance,
                outcome,
            } => {
                self.evidence_at = Some(at);
                // The event below says what happened; the notices would repeat it.
                let _notices = self.evidence.handle(
                    at,
                    Input::Probe {
                        instance: instance.clone(),
                        outcome: outcome.clone(),
                    },
                );
                let (level, what) = match outcome {
                    ProbeOutcome::Succeeded { .. } => (Level::Good, "succeeded".to_owned()),
                    ProbeOutcome::Failed { detail } => (Level::Bad, format!("failed: {detail}")),
                };
                let text = format!(
                    "probe of instance {}: {what}",
                    log::short(instance.as_str())
                );
                self.log_line(at, Some(source), level, text);
                self.cluster_dirty = true;
            }
            SessionEvent::Command { id, text } => {
                self.commands.insert(
                    *id,
                    CommandTrack {
                        text: text.clone(),
                        issued_at: at,
                        notes: Vec::new(),
                        outcome: None,
                    },
                );
                self.log_line(at, None, Level::Info, format!("» {text} ({id})"));
            }
            SessionEvent::CommandProgress { id, note } => {
                if let Some(track) = self.commands.get_mut(id) {
                    track.notes.push(note.clone());
                }
                self.log_line(at, None, Level::Info, format!("  {id} {note}"));
            }
            SessionEvent::CommandOutcome { id, status, detail } => {
                let text = self.commands.get(id).map(|c| c.text.clone());
                if let Some(track) = self.commands.get_mut(id) {
                    track.outcome = Some((*status, detail.clone()));
                }
                let level = match status {
                    CommandStatus::Ok => Level::Good,
                    CommandStatus::Failed => Level::Bad,
                    CommandStatus::Uncertain => Level::Unknown,
                };
                let what = text.unwrap_or_else(|| "command".to_owned());
                self.log_line(
                    at,
                    None,
                    level,
                    format!("« {what} ({id}): {status}: {detail}"),
                );
            }
            SessionEvent::Note { text } => self.log_line(at, None, Level::Info, text.clone()),
            SessionEvent::PlacementDeadline {
                instance,
                deadline_in_ms,
                hard_expiry_in_ms,
            } => {
                self.evidence_at = Some(at);
                let _notices = self.evidence.handle(
                    at,
                    den_protocol::evidence::Input::Expect(den_protocol::evidence::Expectation {
                        instance: instance.clone(),
                        deadline: Some(at.saturating_add(*deadline_in_ms)),
                        hard_expiry: hard_expiry_in_ms.map(|h| at.saturating_add(h)),
                    }),
                );
                self.cluster_dirty = true;
            }
        }
    }

    /// Recompute the rows of panels whose inputs changed since the last call.
    pub fn settle(&mut self) {
        if self.cluster_dirty {
            self.cluster_dirty = false;
            let at = self.evidence_at.unwrap_or(self.now);
            self.report = Some(self.evidence.report(at));
            self.rebuild_cluster();
            self.workers_dirty = true;
        }
        if self.workers_dirty {
            self.workers_dirty = false;
            self.rebuild_pages();
            self.rebuild_nodes();
        }
        if self.sources_dirty {
            self.sources_dirty = false;
            self.rebuild_sources();
        }
    }

    /// Apply a batch of events and settle.
    pub fn apply_all<'a>(&mut self, events: impl IntoIterator<Item = &'a Stamped>) {
        for event in events {
            self.apply(event);
        }
        self.settle();
    }

    pub fn views(&self) -> &Views {
        &self.views
    }

    /// Route rows, in no particular order (panels sort them).
    pub fn routes(&self) -> &[RouteRow] {
        &self.routes.rows
    }

    pub fn route(&self, source: &SourceId, request: &RequestId) -> Option<&RouteRow> {
        self.routes.get(&(source.clone(), request.clone()))
    }

    /// The Events panel, oldest first.
    pub fn events(&self) -> &[EventLine] {
        &self.log
    }

    pub fn versions(&self) -> Versions {
        self.versions
    }

    pub fn commands(&self) -> &BTreeMap<CommandSeq, CommandTrack> {
        &self.commands
    }

    /// The evidence report as of the last settle.
    pub fn report(&self) -> Option<&EvidenceReport> {
        self.report.as_ref()
    }

    /// The latest `/state` of a source and when it arrived.
    /// This host's wall clock (UNIX ms) when the source's latest `/state` arrived.
    pub fn state_clock(&self, source: &SourceId) -> Option<u64> {
        self.sources.get(source)?.state_clock
    }

    pub fn state_of(&self, source: &SourceId) -> Option<(Millis, &State)> {
        let at = self.sources.get(source)?.state_at?;
        let state = self
            .evidence
            .latest_state(&EndpointLabel::new(source.as_str()))?;
        Some((at, state))
    }

    /// The latest observation of a worker in a source's feed (also after it left).
    pub fn observation(&self, source: &SourceId, worker: &WorkerId) -> Option<&Observation> {
        self.workers
            .get(&(source.clone(), worker.clone()))
            .map(|t| t.observation.as_ref())
    }

    /// How to show a node in narrow places: its friendly name when a source reports one,
    /// else the id (libp2p peer ids without their common `12D3KooW` prefix).
    pub fn node_label(&self, node: &NodeId) -> String {
        if let Some(name) = self.node_names.get(node) {
            return name.clone();
        }
        let id = node.as_str();
        match id.strip_prefix("12D3KooW") {
            Some(rest) if rest.len() > 12 => format!("…{}", rest.get(..12).unwrap_or(rest)),
            _ => id.to_owned(),
        }
    }

    /// Whether a value observed at `at` is stale at `now`.
    pub fn is_stale(&self, at: Millis, now: Millis) -> bool {
        now.since(at) > self.config.stale_after_ms
    }

    /// Whether a source is currently disconnected (its rows are drawn stale).
    pub fn source_down(&self, source: &SourceId) -> bool {
        self.sources.get(source).is_some_and(|s| {
            matches!(s.api, Health::Disconnected { .. })
                || matches!(s.feed, Some(Health::Disconnected { .. }))
        })
    }

    /// Ids known to the model, for completion in the command palette.
    pub fn known_ids(&self) -> KnownIds {
        let mut ids = KnownIds::default();
        if let Some(report) = &self.report {
            for (id, instance) in &report.instances {
                ids.instances.push(id.to_string());
                if let Some(model) = &instance.model_id {
                    ids.models.push(model.to_string());
                }
            }
            ids.nodes
                .extend(report.nodes.keys().map(ToString::to_string));
        }
        for row in &self.views.downloads {
            ids.models.push(row.model.clone());
        }
        // What can be placed, even before anything is running or downloading.
        for models in self.catalogs.values() {
            ids.models.extend(models.iter().cloned());
        }
        for ((_, worker), track) in &self.workers {
            ids.workers.push(worker.to_string());
            ids.nodes.push(track.observation.node.to_string());
            ids.models
                .extend(track.observation.models.iter().map(ToString::to_string));
        }
        let mut live: Vec<&RouteRow> = self.routes.rows.iter().collect();
        live.sort_by(|a, b| {
            (
                !a.phase.is_live(),
                std::cmp::Reverse(a.submitted_at),
                &a.request,
            )
                .cmp(&(
                    !b.phase.is_live(),
                    std::cmp::Reverse(b.submitted_at),
                    &b.request,
                ))
        });
        ids.requests = live.iter().map(|r| r.request.to_string()).collect();
        for list in [
            &mut ids.instances,
            &mut ids.models,
            &mut ids.nodes,
            &mut ids.workers,
        ] {
            list.sort();
            list.dedup();
        }
        ids
    }
}

/// Ids for completion, each list sorted (requests: live first, newest first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownIds {
    pub instances: Vec<String>,
    pub requests: Vec<String>,
    pub workers: Vec<String>,
    pub models: Vec<String>,
    pub nodes: Vec<String>,
}

#[cfg(test)]
mod tests;
