//! Nodes, Downloads and Instances columns.

use ratatui::style::Modifier;
use ratatui::text::{Line, Span};

use crate::app::table::SortKey;
use crate::model::{
    DownloadRow, DownloadStatus, Evidence, Identity, InstanceRow, Level, Mark, MembershipView,
    Model, NodeRow, short,
};
use crate::ui::cells::{age_cell, bytes_short, deadline, missing, opt_text, progress, text};

use super::{Column, Ctx, PanelSpec, level_glyph};

pub struct NodesSpec;

impl PanelSpec for NodesSpec {
    type Row = NodeRow;
    const DEFAULT_SORT: (usize, bool) = (1, false);

    fn rows(model: &Model) -> &[NodeRow] {
        &model.views().nodes
    }

    fn version(model: &Model) -> u64 {
        model.versions().nodes
    }

    fn columns() -> &'static [Column<NodeRow>] {
        NODE_COLUMNS
    }

    fn stale(row: &NodeRow, ctx: &Ctx<'_>) -> bool {
        row.observed_at
            .is_some_and(|at| ctx.model.is_stale(at, ctx.now))
    }

    fn level(row: &NodeRow) -> Level {
        row.level
    }
}

const NODE_COLUMNS: &[Column<NodeRow>] = &[
    Column {
        title: "",
        width: 1,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::num(level_rank(r.level))),
        cell: |r, c| level_glyph(r.level, c.theme),
    },
    Column {
        title: "NODE",
        width: 24,
        grow: true,
        priority: 0,
        sort: Some(|r| SortKey::text(r.node.as_str())),
        cell: |r, c| text(r.node.to_string(), c.theme.base()),
    },
    Column {
        title: "NAME",
        width: 12,
        grow: false,
        priority: 4,
        sort: Some(|r| r.name.clone().map_or(SortKey::Missing, SortKey::Text)),
        cell: |r, c| {
            opt_text(
                r.name.clone().or_else(|| r.accelerator.clone()),
                c.theme.dim(),
                c.theme,
            )
        },
    },
    Column {
        title: "IDENTITY",
        width: 13,
        grow: false,
        priority: 1,
        sort: Some(|r| SortKey::text(identity(r).0)),
        cell: |r, c| {
            let (label, level) = identity(r);
            match level {
                None => missing(c.theme),
                Some(Level::Unknown) => text(
                    label,
                    c.theme
                        .level(Level::Unknown)
                        .add_modifier(Modifier::REVERSED),
                ),
                Some(level) => text(label, c.theme.level(level)),
            }
        },
    },
    Column {
        title: "MEMBERSHIP",
        width: 11,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::text(membership(r).0)),
        cell: |r, c| {
            let (label, level) = membership(r);
            if level == Level::Unknown {
                text(label, c.theme.missing())
            } else {
                text(label, c.theme.level(level))
            }
        },
    },
    // SEEN is the source's own last sighting (Skulk's `lastSeen`), POLL the age of den's
    // latest answer about the node: a node can answer polls and still be unseen by its
    // cluster, and the other way round.
    Column {
        title: "SEEN",
        width: 5,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::opt_num(r.source_seen_at.map(|t| -(t.0 as f64)))),
        cell: |r, c| age_cell(r.source_seen_at, c.now, c.stale_after(), c.theme),
    },
    Column {
        title: "POLL",
        width: 5,
        grow: false,
        priority: 4,
        sort: Some(|r| SortKey::opt_num(r.observed_at.map(|t| -(t.0 as f64)))),
        cell: |r, c| age_cell(r.observed_at, c.now, c.stale_after(), c.theme),
    },
    Column {
        title: "RAM FREE",
        width: 13,
        grow: false,
        priority: 2,
        sort: Some(|r| SortKey::opt_num(r.ram_available.map(|v| v as f64))),
        cell: |r, c| match (r.ram_available, r.ram_total) {
            (Some(a), Some(t)) => text(
                format!("{}/{}", bytes_short(a), bytes_short(t)),
                c.theme.base(),
            ),
            _ => missing(c.theme),
        },
    },
    Column {
        title: "GPU",
        width: 4,
        grow: false,
        priority: 3,
        sort: Some(|r| SortKey::opt_num(r.gpu_usage)),
        cell: |r, c| match r.gpu_usage {
            Some(u) => text(format!("{:.0}%", u * 100.0), c.theme.base()),
            None => missing(c.theme),
        },
    },
    Column {
        title: "PAGES FREE",
        width: 11,
        grow: false,
        priority: 1,
        sort: Some(|r| SortKey::opt_num(r.pool.map(|p| p.free))),
        cell: |r, c| match r.pool {
            Some(p) => text(format!("{}/{}", p.free, p.total_pages), c.theme.base()),
            None => missing(c.theme),
        },
    },
    Column {
        title: "STATE",
        width: 9,
        grow: false,
        priority: 2,
        sort: Some(|r| {
            r.health_level
                .clone()
                .map_or(SortKey::Missing, SortKey::Text)
        }),
        cell: |r, c| {
            if r.draining {
                text("draining", c.theme.level(Level::Warn))
            } else {
                opt_text(r.health_level.clone(), c.theme.dim(), c.theme)
            }
        },
    },
    Column {
        title: "WHY",
        width: 16,
        grow: true,
        priority: 3,
        sort: None,
        cell: |r, c| match r.health_reasons.first().or(r.membership_reasons.first()) {
            Some(reason) => text(reason.clone(), c.theme.level(r.level)),
            None => text(String::new(), c.theme.base()),
        },
    },
];

fn level_rank(level: Level) -> f64 {
    match level {
        Level::Bad => 0.0,
        Level::Unknown => 1.0,
        Level::Warn => 2.0,
        Level::Info => 3.0,
        Level::Good => 4.0,
    }
}

fn identity(r: &NodeRow) -> (String, Option<Level>) {
    match &r.identity {
        Identity::Bound { source } => (format!("bound {source}"), Some(Level::Good)),
        Identity::Conflict { .. } => ("CONFLICT".to_owned(), Some(Level::Unknown)),
        Identity::NotBound => ("—".to_owned(), None),
    }
}

fn membership(r: &NodeRow) -> (String, Level) {
    match &r.membership {
        MembershipView::Member { observers } => (format!("member ×{observers}"), Level::Good),
        MembershipView::OneSided { .. } => ("one-sided".to_owned(), Level::Warn),
        MembershipView::NotMember => ("not member".to_owned(), Level::Bad),
        MembershipView::Unknown => ("?".to_owned(), Level::Unknown),
    }
}

pub struct DownloadsSpec;

impl PanelSpec for DownloadsSpec {
    type Row = DownloadRow;
    const DEFAULT_SORT: (usize, bool) = (1, false);

    fn rows(model: &Model) -> &[DownloadRow] {
        &model.views().downloads
    }

    fn version(model: &Model) -> u64 {
        model.versions().downloads
    }

    fn columns() -> &'static [Column<DownloadRow>] {
        DOWNLOAD_COLUMNS
    }

    fn stale(row: &DownloadRow, ctx: &Ctx<'_>) -> bool {
        ctx.model.is_stale(row.observed_at, ctx.now)
            || row.seen_by.iter().all(|s| ctx.model.source_down(s))
    }

    fn level(row: &DownloadRow) -> Level {
        row.level
    }
}

const DOWNLOAD_COLUMNS: &[Column<DownloadRow>] = &[
    Column {
        title: "",
        width: 1,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::num(level_rank(r.level))),
        cell: |r, c| level_glyph(r.level, c.theme),
    },
    Column {
        title: "NODE",
        width: 12,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::text(r.node.as_str())),
        cell: |r, c| {
            if c.head {
                text(c.model.node_label(&r.node), c.theme.base())
            } else {
                text("  └", c.theme.dim())
            }
        },
    },
    Column {
        title: "MODEL",
        width: 18,
        grow: true,
        priority: 0,
        sort: Some(|r| SortKey::text(&r.model)),
        cell: |r, c| {
            if c.head {
                text(r.model.clone(), c.theme.base())
            } else {
                text(String::new(), c.theme.base())
            }
        },
    },
    Column {
        title: "ATTEMPT",
        width: 8,
        grow: false,
        priority: 1,
        sort: Some(|r| r.attempt.clone().map_or(SortKey::Missing, SortKey::Text)),
        cell: |r, c| match &r.attempt {
            Some(a) => text(short(a).to_owned(), c.theme.base()),
            None => text("legacy", c.theme.missing()),
        },
    },
    Column {
        title: "STATE",
        width: 9,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::text(status_label(&r.status))),
        cell: |r, c| text(status_label(&r.status), c.theme.level(r.level)),
    },
    Column {
        title: "PROGRESS",
        width: 16,
        grow: false,
        priority: 0,
        sort: Some(|r| match (r.downloaded, r.total) {
            (Some(d), Some(t)) if t > 0 => SortKey::num(d as f64 / t as f64),
            _ => SortKey::Missing,
        }),
        cell: |r, c| progress(r.downloaded, r.total, 16, c.theme),
    },
    Column {
        title: "BYTES",
        width: 13,
        grow: false,
        priority: 2,
        sort: Some(|r| SortKey::opt_num(r.total.map(|v| v as f64))),
        cell: |r, c| match (r.downloaded, r.total) {
            (Some(d), Some(t)) => text(
                format!("{}/{}", bytes_short(d), bytes_short(t)),
                c.theme.base(),
            ),
            (Some(d), None) => text(format!("{}/?", bytes_short(d)), c.theme.base()),
            _ => missing(c.theme),
        },
    },
    Column {
        title: "ETA",
        width: 5,
        grow: false,
        priority: 3,
        sort: Some(|r| SortKey::opt_num(r.eta_ms.map(|v| v as f64))),
        cell: |r, c| match r.eta_ms {
            Some(ms) => text(crate::ui::cells::age(ms), c.theme.base()),
            None => missing(c.theme),
        },
    },
    Column {
        title: "RATE",
        width: 9,
        grow: false,
        priority: 2,
        sort: Some(|r| SortKey::opt_num(r.rate)),
        cell: |r, c| match r.rate {
            Some(rate) => text(
                format!("{}/s", bytes_short(rate.max(0.0) as u64)),
                c.theme.base(),
            ),
            None => missing(c.theme),
        },
    },
    Column {
        title: "SEEN",
        width: 5,
        grow: false,
        priority: 1,
        sort: Some(|r| SortKey::num(-(r.observed_at.0 as f64))),
        cell: |r, c| age_cell(Some(r.observed_at), c.now, c.stale_after(), c.theme),
    },
    Column {
        title: "WHY",
        width: 16,
        grow: true,
        priority: 1,
        sort: Some(|r| {
            r.error
                .clone()
                .or_else(|| r.hint.clone())
                .map_or(SortKey::Missing, SortKey::Text)
        }),
        cell: |r, c| match (&r.contradiction, &r.error, &r.hint) {
            (Some(x), _, _) => Line::from(vec![
                Span::styled("! ", c.theme.mark(Mark::Contradiction)),
                Span::styled(x.clone(), c.theme.level(Level::Unknown)),
            ]),
            (None, Some(e), _) => text(e.clone(), c.theme.level(r.level)),
            (None, None, Some(h)) => text(h.clone(), c.theme.level(Level::Warn)),
            (None, None, None) => text(String::new(), c.theme.base()),
        },
    },
];

fn status_label(s: &DownloadStatus) -> String {
    match s {
        DownloadStatus::Pending => "pending".to_owned(),
        DownloadStatus::Ongoing => "ongoing".to_owned(),
        DownloadStatus::Completed => "completed".to_owned(),
        DownloadStatus::Failed => "failed".to_owned(),
        DownloadStatus::Unknown(tag) => format!("? {tag}"),
    }
}

pub struct InstancesSpec;

impl PanelSpec for InstancesSpec {
    type Row = InstanceRow;
    const DEFAULT_SORT: (usize, bool) = (1, false);

    fn rows(model: &Model) -> &[InstanceRow] {
        &model.views().instances
    }

    fn count(model: &Model) -> usize {
        Self::rows(model)
            .iter()
            .filter(|r| matches!(r, InstanceRow::Instance { .. }))
            .count()
    }

    fn version(model: &Model) -> u64 {
        model.versions().instances
    }

    fn columns() -> &'static [Column<InstanceRow>] {
        INSTANCE_COLUMNS
    }

    fn stale(row: &InstanceRow, ctx: &Ctx<'_>) -> bool {
        row.observed_at()
            .is_some_and(|at| ctx.model.is_stale(at, ctx.now))
    }

    fn level(row: &InstanceRow) -> Level {
        match row {
            InstanceRow::Instance { verdict, .. } => verdict.level,
            // Counted once, on the instance.
            InstanceRow::Assignment { .. } => Level::Good,
        }
    }
}

fn mark_cell(mark: Mark, c: &Ctx<'_>) -> Line<'static> {
    text(format!(" {}", mark.symbol()), c.theme.mark(mark))
}

fn evidence_note(e: &Evidence, c: &Ctx<'_>) -> Line<'static> {
    text(e.note.clone(), c.theme.level(e.mark.level()))
}

const INSTANCE_COLUMNS: &[Column<InstanceRow>] = &[
    Column {
        title: "",
        width: 1,
        grow: false,
        priority: 0,
        sort: Some(|r| match r {
            InstanceRow::Instance { verdict, .. } => SortKey::num(level_rank(verdict.level)),
            InstanceRow::Assignment { .. } => SortKey::Missing,
        }),
        cell: |r, c| match r {
            InstanceRow::Instance { verdict, .. } => level_glyph(verdict.level, c.theme),
            InstanceRow::Assignment { .. } => text(String::new(), c.theme.base()),
        },
    },
    Column {
        title: "INSTANCE",
        width: 10,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::text(r.instance())),
        cell: |r, c| match r {
            InstanceRow::Instance { instance, .. } => {
                text(short(instance).to_owned(), c.theme.base())
            }
            InstanceRow::Assignment { .. } => text("  └", c.theme.dim()),
        },
    },
    Column {
        title: "MODEL / NODE",
        width: 18,
        grow: true,
        priority: 0,
        sort: Some(|r| match r {
            InstanceRow::Instance { model, .. } => {
                model.clone().map_or(SortKey::Missing, SortKey::Text)
            }
            InstanceRow::Assignment { .. } => SortKey::Missing,
        }),
        cell: |r, c| match r {
            InstanceRow::Instance { model, .. } => opt_text(model.clone(), c.theme.base(), c.theme),
            InstanceRow::Assignment { node, runner, .. } => text(
                format!("{} runner {}", c.model.node_label(node), short(runner)),
                c.theme.dim(),
            ),
        },
    },
    Column {
        title: "DL",
        width: 2,
        grow: false,
        priority: 0,
        sort: None,
        cell: |r, c| match r {
            InstanceRow::Instance { download, .. } => mark_cell(*download, c),
            InstanceRow::Assignment { download, .. } => mark_cell(download.mark, c),
        },
    },
    Column {
        title: "RUN",
        width: 3,
        grow: false,
        priority: 0,
        sort: None,
        cell: |r, c| match r {
            InstanceRow::Instance { runner, .. } => mark_cell(*runner, c),
            InstanceRow::Assignment { runner_status, .. } => mark_cell(runner_status.mark, c),
        },
    },
    Column {
        title: "PROBE",
        width: 5,
        grow: false,
        priority: 0,
        sort: None,
        cell: |r, c| match r {
            InstanceRow::Instance { probe, .. } => mark_cell(*probe, c),
            InstanceRow::Assignment { probe, .. } => mark_cell(probe.mark, c),
        },
    },
    Column {
        title: "VERDICT",
        width: 10,
        grow: false,
        priority: 0,
        sort: Some(|r| match r {
            InstanceRow::Instance { verdict, .. } => SortKey::text(&verdict.kind),
            InstanceRow::Assignment { .. } => SortKey::Missing,
        }),
        cell: |r, c| match r {
            InstanceRow::Instance { verdict, .. } => {
                let style = c.theme.level(verdict.level);
                let style = if verdict.level == Level::Unknown {
                    style.add_modifier(Modifier::REVERSED)
                } else {
                    style
                };
                text(verdict.kind.clone(), style)
            }
            InstanceRow::Assignment { membership, .. } => Line::from(vec![
                Span::styled(membership.mark.symbol(), c.theme.mark(membership.mark)),
                Span::styled(" member", c.theme.dim()),
            ]),
        },
    },
    Column {
        title: "DEADLINE",
        width: 9,
        grow: false,
        priority: 1,
        sort: Some(|r| match r {
            InstanceRow::Instance { verdict, .. } => {
                SortKey::opt_num(verdict.deadline.map(|d| d.0 as f64))
            }
            InstanceRow::Assignment { .. } => SortKey::Missing,
        }),
        cell: |r, c| match r {
            InstanceRow::Instance { verdict, .. } => match verdict.deadline {
                Some(d) => deadline(d, c.now, c.theme),
                None => missing(c.theme),
            },
            InstanceRow::Assignment { .. } => text(String::new(), c.theme.base()),
        },
    },
    Column {
        title: "REASON",
        width: 20,
        grow: true,
        priority: 1,
        sort: None,
        cell: |r, c| match r {
            InstanceRow::Instance {
                verdict, failures, ..
            } => match failures.first().or(verdict.reasons.first()) {
                Some(reason) => text(reason.clone(), c.theme.level(verdict.level)),
                None => text(String::new(), c.theme.base()),
            },
            InstanceRow::Assignment {
                download,
                runner_status,
                probe,
                membership,
                ..
            } => {
                let first = [membership, download, runner_status, probe]
                    .into_iter()
                    .find(|e| e.mark != Mark::Ok);
                match first {
                    Some(e) => evidence_note(e, c),
                    None => text("all evidence agrees", c.theme.level(Level::Good)),
                }
            }
        },
    },
];
