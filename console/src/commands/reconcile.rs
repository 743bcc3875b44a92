//! `den reconcile`: every stored placement fence resumed against the management API it
//! was submitted to ([`place::resume_all`] per configured endpoint), straight into
//! reconciliation — never a second `POST /instance`. One line per fence: its instance,
//! and placed / failed (why) / uncertain (why, the fence kept) / left alone (unreadable,
//! or submitted to an origin not configured here). Then every stored cleanup intent
//! (a `den delete` whose absence was never confirmed) is retried until `/state` stops
//! listing the instance: deleted / deletion-pending / deletion-failed. Exit 2 if any is
//! still uncertain or pending, else 1 if any failed or could not be resumed, else 0.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;

use den_protocol::placement::{Outcome, WorkflowConfig};
use den_protocol::text::printable;

use super::Targets;
use super::cleanup::CleanupStore;
use super::place::{self, DEFAULT_PROBE_TIMEOUT, ProgressSink, ResumeResult, Resumed};
use crate::config::Settings;
use den_protocol::session::CommandStatus;

/// What became of one fence.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    instance: String,
    result: &'static str,
    detail: String,
    exit: u8,
}

fn line(r: &Resumed) -> Line {
    let instance = r
        .instance_id
        .as_ref()
        .map_or_else(|| r.path.display().to_string(), |i| i.to_string());
    let (result, detail, exit) = match &r.result {
        ResumeResult::Finished(o @ Outcome::Placed { .. }) => ("placed", o.to_string(), 0),
        ResumeResult::Finished(o @ Outcome::Failed { .. }) => ("failed", o.to_string(), 1),
        ResumeResult::Finished(o @ Outcome::Uncertain { .. }) => ("uncertain", o.to_string(), 2),
        ResumeResult::Unreadable(e) => ("unreadable", e.to_string(), 1),
        ResumeResult::OtherOrigin { origin } => (
            "other-origin",
            format!(
                "submitted to {origin}, which is not configured here: add it with --skulk or --router"
            ),
            1,
        ),
        ResumeResult::Error(e) => ("error", e.to_string(), 1),
    };
    Line {
        instance,
        result,
        detail,
        exit,
    }
}

/// A fence's result from every endpoint, merged: one that resumed it wins over
/// "submitted elsewhere" from the others.
fn merge(all: Vec<Resumed>) -> Vec<Line> {
    let mut by_path: BTreeMap<PathBuf, Line> = BTreeMap::new();
    for r in all {
        let l = line(&r);
        match by_path.get(&r.path) {
            Some(old) if old.result != "other-origin" => {}
            _ => {
                by_path.insert(r.path, l);
            }
        }
    }
    by_path.into_values().collect()
}

pub async fn run(settings: &Settings, json: bool) -> ExitCode {
    let targets = match Targets::new(
        &settings.sources,
        settings.token.as_deref(),
        settings.request_timeout,
    ) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("den reconcile: {e}");
            return ExitCode::from(1);
        }
    };
    let progress = ProgressSink::from_fn(|note| {
        if !matches!(
            note.event,
            place::Progress::Evidence(_) | place::Progress::Waiting { .. }
        ) {
            eprintln!("den reconcile: {}", printable(&note.event.to_string()));
        }
    });
    let mut all = Vec::new();
    for (_, client) in &targets.management {
        match place::resume_all(
            &targets.fence_dir,
            client,
            &WorkflowConfig::default(),
            DEFAULT_PROBE_TIMEOUT,
            progress.clone(),
        )
        .await
        {
            Ok(r) => all.extend(r),
            Err(e) => {
                eprintln!("den reconcile: {e}");
                return ExitCode::from(1);
            }
        }
    }
    if targets.management.is_empty() {
        eprintln!("den reconcile: no management API configured: give --skulk URL or --router URL");
        return ExitCode::from(1);
    }
    let mut lines = merge(all);
    lines.extend(cleanups(&targets).await);
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if lines.is_empty() && !json {
        let _ = writeln!(
            out,
            "no stored placement fences in {} and no pending deletions",
            targets.fence_dir.display()
        );
    }
    for l in &lines {
        if json {
            let v = json!({"instance": l.instance, "result": l.result, "detail": l.detail});
            let _ = writeln!(out, "{v}");
        } else {
            let _ = writeln!(
                out,
                "{}: {}: {}",
                printable(&l.instance),
                l.result,
                printable(&l.detail)
            );
        }
    }
    let code = if lines.iter().any(|l| l.exit == 2) {
        2
    } else {
        lines.iter().map(|l| l.exit).max().unwrap_or(0)
    };
    ExitCode::from(code)
}

/// Every stored cleanup intent retried against the management API of its origin (one
/// line each: deleted, deletion-pending, deletion-failed); intents for an origin not
/// configured here, or that do not read, are named and left alone.
async fn cleanups(targets: &Targets) -> Vec<Line> {
    let store = CleanupStore::beside_fences(&targets.fence_dir);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<den_protocol::session::SessionEvent>(64);
    let printer = tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            if let den_protocol::session::SessionEvent::Note { text } = event {
                eprintln!("den reconcile: {}", printable(&text));
            }
        }
    });
    let mut lines = Vec::new();
    let origins: Vec<String> = targets.management.iter().map(|(_, c)| c.origin()).collect();
    for entry in store.list() {
        match entry {
            Ok(intent) if !origins.contains(&intent.origin) => lines.push(Line {
                instance: intent.instance_id.to_string(),
                result: "other-origin",
                detail: format!(
                    "deletion requested at {}, which is not configured here: add it with --skulk or --router",
                    intent.origin
                ),
                exit: 1,
            }),
            Ok(_) => {}
            Err(e) => lines.push(Line {
                instance: store.dir().display().to_string(),
                result: "unreadable",
                detail: e,
                exit: 1,
            }),
        }
    }
    for target in &targets.management {
        for (instance, finished) in super::delete::retry(target, &store, &tx).await {
            let (result, exit) = match finished.status {
                CommandStatus::Ok => ("deleted", 0),
                CommandStatus::Uncertain => ("deletion-pending", 2),
                CommandStatus::Failed => ("deletion-failed", 1),
            };
            lines.push(Line {
                instance: instance.to_string(),
                result,
                detail: finished.detail,
                exit,
            });
        }
    }
    drop(tx);
    let _ = printer.await;
    lines
}
