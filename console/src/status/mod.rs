//! `den status`: one snapshot from the same sources, model and columns as the console.
//! Exit codes: 0 every source answered, 1 none did, 2 partial. The one-shot commands
//! (`den place/delete/cancel/drain`) are [`crate::commands::oneshot`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

use den_protocol::feed::FeedMessage;
use den_protocol::session::{SessionEvent, SourceId, SourceKind, Stamped};
use den_protocol::text::{printable, printable_lines};
use den_protocol::time::Millis;

use crate::app::table::compute_order;
use crate::config::Settings;
use crate::model::{
    DownloadRow, InstanceRow, Model, ModelConfig, NodeRow, PageRow, RouteRow, SourceRow,
};
use crate::sources::{self, Clock, PollConfig};
use crate::theme::Theme;
use crate::ui::columns::{Ctx, PanelSpec, sort_of};
use crate::ui::table::fit_columns;

/// Width of the text tables.
const TEXT_WIDTH: u16 = 150;

/// What `den status` saw.
pub struct Gathered {
    pub model: Model,
    pub now: Millis,
    /// Sources that answered everything they serve (the API, and the feed of a router).
    pub answered: BTreeSet<SourceId>,
    /// Why the others did not, by source.
    pub problems: BTreeMap<SourceId, String>,
}

/// Connect every source and apply what they say until each answered (or failed) once,
/// or `timeout` passed.
pub async fn gather(settings: &Settings, timeout: Duration) -> Result<Gathered, String> {
    gather_recording(settings, timeout, None).await
}

/// [`gather`], recording what was gathered to `record` (`den status --record PATH`).
pub async fn gather_recording(
    settings: &Settings,
    timeout: Duration,
    record: Option<&std::path::Path>,
) -> Result<Gathered, String> {
    if settings.sources.is_empty() {
        return Err(
            "no sources: pass --router URL or --skulk URL (or set DEN_ROUTER / DEN_SKULK)"
                .to_owned(),
        );
    }
    let clock = Clock::new();
    let (tx, mut rx) = mpsc::channel(4096);
    let poll = PollConfig {
        interval: settings.poll_interval,
        timeout: settings.request_timeout.min(timeout),
        catalog: false,
    };
    let tasks = sources::spawn_all(&settings.sources, settings.token.as_deref(), poll, &tx)
        .map_err(|e| e.to_string())?;
    drop(tx);
    let mut model = Model::new(ModelConfig {
        stale_after_ms: settings.stale_after_ms,
        ..ModelConfig::default()
    });
    let recorder = match record {
        Some(path) => {
            let mut s = settings.clone();
            s.record = Some(path.to_path_buf());
            s.no_record = false;
            crate::tui::start_recorder(&s).map_err(|e| e.to_string())?
        }
        None => None,
    };
    let apply = |model: &mut Model, stamped: Stamped| {
        if let Some(r) = &recorder {
            r.record(&stamped);
        }
        model.apply(&stamped);
    };
    for spec in &settings.sources {
        apply(&mut model, Stamped::new(clock.now(), sources::added(spec)));
    }
    if let Some(dir) = crate::commands::place::default_fence_dir() {
        let now_unix = crate::commands::place::clock::unix_now_ms();
        for event in crate::commands::place::fence_deadlines(&dir, now_unix) {
            apply(&mut model, Stamped::new(clock.now(), event));
        }
    }
    let kinds: BTreeMap<SourceId, SourceKind> = settings
        .sources
        .iter()
        .map(|s| (s.id.clone(), s.kind))
        .collect();
    let mut api: BTreeMap<SourceId, Result<(), String>> = BTreeMap::new();
    let mut feed: BTreeMap<SourceId, Result<(), String>> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + timeout;
    let heard_all = |api: &BTreeMap<_, _>, feed: &BTreeMap<_, _>| {
        kinds.iter().all(|(id, kind)| {
            api.contains_key(id) && (*kind == SourceKind::Skulk || feed.contains_key(id))
        })
    };
    while !heard_all(&api, &feed) {
        let Ok(Some(event)) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            break;
        };
        match &event {
            SessionEvent::SkulkState { source, .. } => {
                api.insert(source.clone(), Ok(()));
            }
            SessionEvent::PollFailed {
                source, failure, ..
            } => {
                api.entry(source.clone())
                    .or_insert_with(|| Err(format!("GET /state: {failure}")));
            }
            SessionEvent::Feed {
                source,
                message: FeedMessage::Snapshot { .. },
            } => {
                feed.insert(source.clone(), Ok(()));
            }
            SessionEvent::Disconnected { source, reason } => {
                feed.entry(source.clone())
                    .or_insert_with(|| Err(format!("feed: {reason}")));
            }
            _ => {}
        }
        apply(&mut model, Stamped::new(clock.now(), event));
    }
    for task in tasks {
        task.abort();
    }
    if let Some(r) = recorder {
        eprintln!(
            "den status: {}",
            crate::tui::describe_closed(&r.close(model.now()))
        );
    }
    model.settle();
    let mut answered = BTreeSet::new();
    let mut problems = BTreeMap::new();
    for (id, kind) in &kinds {
        let api = api
            .get(id)
            .cloned()
            .unwrap_or_else(|| Err("GET /state: no answer before the timeout".to_owned()));
        let feed = match kind {
            SourceKind::Skulk => Ok(()),
            SourceKind::DenRouter => feed
                .get(id)
                .cloned()
                .unwrap_or_else(|| Err("feed: no snapshot before the timeout".to_owned())),
        };
        match (api, feed) {
            (Ok(()), Ok(())) => {
                answered.insert(id.clone());
            }
            (Err(a), Err(f)) => {
                problems.insert(id.clone(), format!("{a}; {f}"));
            }
            (Err(e), Ok(())) | (Ok(()), Err(e)) => {
                problems.insert(id.clone(), e);
            }
        }
    }
    Ok(Gathered {
        now: model.now(),
        model,
        answered,
        problems,
    })
}

#[derive(Serialize)]
struct Snapshot<'a> {
    complete: bool,
    at_ms: u64,
    sources: &'a [SourceRow],
    problems: &'a BTreeMap<SourceId, String>,
    nodes: &'a [NodeRow],
    downloads: &'a [DownloadRow],
    instances: &'a [InstanceRow],
    pages: &'a [PageRow],
    routes: &'a [RouteRow],
}

/// `den status`.
pub async fn status(
    settings: &Settings,
    json: bool,
    timeout: Duration,
    record: Option<&std::path::Path>,
) -> ExitCode {
    let gathered = match gather_recording(settings, timeout, record).await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("den status: {e}");
            if json {
                // `--json` always prints one JSON document, so a script can parse it.
                print_line(&serde_json::json!({ "complete": false, "error": e }).to_string());
            }
            return ExitCode::from(1);
        }
    };
    let code = exit_code(&gathered);
    if code == 1 {
        eprintln!(
            "den status: no source answered: {}",
            printable(&join_problems(&gathered.problems))
        );
        if json {
            print_line(&snapshot_json(&gathered, false));
        }
        return ExitCode::from(1);
    }
    let complete = code == 0;
    let out = if json {
        snapshot_json(&gathered, complete)
    } else {
        snapshot_text(&gathered)
    };
    print_line(&out);
    if !complete {
        eprintln!(
            "den status: partial: {}",
            printable(&join_problems(&gathered.problems))
        );
    }
    ExitCode::from(code)
}

/// 0: every source answered; 1: none did; 2: some did (partial).
pub fn exit_code(g: &Gathered) -> u8 {
    match (g.answered.is_empty(), g.problems.is_empty()) {
        (_, true) => 0,
        (true, false) => 1,
        (false, false) => 2,
    }
}

fn join_problems(problems: &BTreeMap<SourceId, String>) -> String {
    problems
        .iter()
        .map(|(id, why)| format!("{id}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The snapshot as JSON (the same rows the console draws).
/// One document on stdout. JSON escapes control characters itself; text is stripped of
/// them (names and messages come from the network). A closed pipe (`| head`) is not
/// worth a panic.
fn print_line(out: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{}", printable_lines(out));
}

pub fn snapshot_json(g: &Gathered, complete: bool) -> String {
    let v = g.model.views();
    let mut routes: Vec<&RouteRow> = g.model.routes().iter().collect();
    routes.sort_by(|a, b| {
        b.submitted_at
            .cmp(&a.submitted_at)
            .then(a.request.cmp(&b.request))
    });
    let routes: Vec<RouteRow> = routes.into_iter().cloned().collect();
    let snapshot = Snapshot {
        complete,
        at_ms: g.now.0,
        sources: &v.sources,
        problems: &g.problems,
        nodes: &v.nodes,
        downloads: &v.downloads,
        instances: &v.instances,
        pages: &v.pages,
        routes: &routes,
    };
    serde_json::to_string_pretty(&snapshot).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The snapshot as text tables, with the console's columns.
pub fn snapshot_text(g: &Gathered) -> String {
    let theme = Theme::default();
    let mut out = String::new();
    for s in &g.model.views().sources {
        let health = match s.health() {
            crate::model::Health::Connected => "ok".to_owned(),
            crate::model::Health::Connecting => "no answer".to_owned(),
            crate::model::Health::Disconnected { reason, .. } => format!("down: {reason}"),
        };
        let latency = s.latency_ms.map_or_else(String::new, |l| format!(" {l}ms"));
        let _ = writeln!(
            out,
            "source {} ({} {}): {}{latency}",
            s.source,
            s.kind,
            printable(&s.url),
            printable(&health)
        );
    }
    out.push_str(&table::<crate::ui::columns::NodesSpec>("NODES", g, &theme));
    out.push_str(&table::<crate::ui::columns::DownloadsSpec>(
        "DOWNLOADS",
        g,
        &theme,
    ));
    out.push_str(&table::<crate::ui::columns::InstancesSpec>(
        "INSTANCES",
        g,
        &theme,
    ));
    out.push_str(&table::<crate::ui::columns::PagesSpec>("PAGES", g, &theme));
    out.push_str(&table::<crate::ui::columns::RoutesSpec>(
        "ROUTES", g, &theme,
    ));
    out
}

fn table<S: PanelSpec>(title: &str, g: &Gathered, theme: &Theme) -> String {
    let rows = S::rows(&g.model);
    let mut out = format!("\n{title} ({})\n", S::count(&g.model));
    if rows.is_empty() {
        out.push_str("  none\n");
        return out;
    }
    let (sort, descending) = S::DEFAULT_SORT;
    let order = compute_order(rows, sort_of::<S>(sort), descending, "");
    let columns = fit_columns(S::columns(), TEXT_WIDTH);
    let cell = |text: &str, width: u16| {
        let w = usize::from(width);
        let t = crate::ui::cells::elide(text, w);
        let pad = w.saturating_sub(unicode_width::UnicodeWidthStr::width(t.as_str()));
        format!("{t}{:pad$}", "")
    };
    let header: Vec<String> = columns.iter().map(|(c, w)| cell(c.title, *w)).collect();
    out.push_str(header.join(" ").trim_end());
    out.push('\n');
    let mut previous_group: Option<&str> = None;
    for i in order {
        let Some(row) = rows.get(i) else { continue };
        use crate::app::table::TableRow;
        let group = row.group();
        let ctx = Ctx {
            theme,
            now: g.now,
            model: &g.model,
            head: group.is_none() || group != previous_group,
        };
        previous_group = group;
        let cells: Vec<String> = columns
            .iter()
            .map(|(c, w)| {
                let line = (c.cell)(row, &ctx);
                let text: String = line.spans.iter().map(|s| s.content.as_ref()).collect();
                cell(&printable(&text), *w)
            })
            .collect();
        out.push_str(cells.join(" ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
