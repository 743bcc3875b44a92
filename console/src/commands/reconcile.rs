//! `den reconcile`: every stored placement fence resumed against the management API it
//! was submitted to ([`place::resume_all`] per configured endpoint), straight into
//! reconciliation — never a second `POST /instance`. One line per fence: its instance,
//! and placed / failed (why) / uncertain (why, the fence kept) / left alone (unreadable,
//! or submitted to an origin not configured here). Exit 2 if any is still uncertain,
//! else 1 if any failed or could not be resumed, else 0.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;

use den_protocol::placement::{Outcome, WorkflowConfig};
use den_protocol::text::printable;

use super::Targets;
use super::place::{self, DEFAULT_PROBE_TIMEOUT, ProgressSink, ResumeResult, Resumed};
use crate::config::Settings;

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
    let lines = merge(all);
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if lines.is_empty() && !json {
        let _ = writeln!(
            out,
            "no stored placement fences in {}",
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
