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

use den_protocol::ids::{NodeId, RequestId, WorkerId};
use den_protocol::recording::Offset;
use den_protocol::session::{CommandStatus, SourceId};
use den_protocol::time::Millis;

use super::{ReplayError, Replayer};
use crate::model::Health;
use crate::record::paths::utc_time;

mod text;
mod walker;

pub use text::text;
use walker::{Walker, failed_downloads, node_ids, verdicts};

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
