//! Pages, Routes and Events columns.

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use den_protocol::candidate::Tier;

use crate::app::table::SortKey;
use crate::model::{EventLine, Level, Model, PageRow, RoutePhase, RouteRow};
use crate::ui::cells::{age_cell, bytes_short, clock, missing, ms, sparkline, stacked_bar, text};

use super::{Column, Ctx, PanelSpec, level_glyph};

/// Width of the page-pool bar.
const POOL_BAR: usize = 20;
/// Heartbeats shown in the occupancy sparkline.
const HISTORY: usize = 16;

pub struct PagesSpec;

impl PanelSpec for PagesSpec {
    type Row = PageRow;
    const DEFAULT_SORT: (usize, bool) = (1, false);

    fn rows(model: &Model) -> &[PageRow] {
        &model.views().pages
    }

    fn version(model: &Model) -> u64 {
        model.versions().pages
    }

    fn columns() -> &'static [Column<PageRow>] {
        PAGE_COLUMNS
    }

    fn stale(row: &PageRow, ctx: &Ctx<'_>) -> bool {
        row.gone.is_some()
            || ctx.model.is_stale(row.observed_at, ctx.now)
            || ctx.model.source_down(&row.source)
    }

    fn level(row: &PageRow) -> Level {
        page_level(row)
    }
}

fn page_level(r: &PageRow) -> Level {
    if r.inconsistent.is_some() {
        Level::Unknown
    } else if r.gone.is_some() || !r.online {
        Level::Bad
    } else if r.draining {
        Level::Warn
    } else {
        Level::Good
    }
}

fn used_pct(r: &PageRow) -> Option<f64> {
    (r.pool.total_pages > 0).then(|| {
        100.0 * f64::from(r.pool.total_pages.saturating_sub(r.pool.free))
            / f64::from(r.pool.total_pages)
    })
}

const PAGE_COLUMNS: &[Column<PageRow>] = &[
    Column {
        title: "",
        width: 1,
        grow: false,
        priority: 0,
        sort: None,
        cell: |r, c| level_glyph(page_level(r), c.theme),
    },
    Column {
        title: "WORKER",
        width: 12,
        grow: true,
        priority: 0,
        sort: Some(|r| SortKey::text(r.worker.as_str())),
        cell: |r, c| text(r.worker.to_string(), c.theme.base()),
    },
    Column {
        title: "STATE",
        width: 8,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::text(page_state(r))),
        cell: |r, c| text(page_state(r), c.theme.level(page_level(r))),
    },
    Column {
        title: "POOL",
        width: POOL_BAR as u16,
        grow: false,
        priority: 0,
        sort: None,
        cell: |r, c| {
            let p = r.pool;
            let ch = &c.theme.charts;
            // Evictable ⊆ durable ⊆ resident: draw the disjoint slices.
            let durable_pinned = p.durable.saturating_sub(p.evictable);
            let volatile = p.resident.saturating_sub(p.durable.max(p.evictable));
            let parts = [
                (u64::from(p.reserved), ch.reserved),
                (u64::from(volatile), ch.resident),
                (u64::from(durable_pinned), ch.durable),
                (u64::from(p.evictable.min(p.resident)), ch.evictable),
            ];
            Line::from(stacked_bar(
                &parts,
                u64::from(p.total_pages),
                POOL_BAR,
                ch.free,
            ))
        },
    },
    Column {
        title: "USED",
        width: 4,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::opt_num(used_pct(r))),
        cell: |r, c| match used_pct(r) {
            Some(p) => text(format!("{p:>3.0}%"), c.theme.base()),
            None => missing(c.theme),
        },
    },
    Column {
        title: "FREE/RSV/RES/EVI/DUR",
        width: 24,
        grow: false,
        priority: 2,
        sort: Some(|r| SortKey::num(r.pool.total_pages)),
        cell: |r, c| {
            let p = r.pool;
            match &r.inconsistent {
                Some(why) => Line::from(vec![
                    Span::styled("! ", c.theme.mark(crate::model::Mark::Contradiction)),
                    Span::styled(why.clone(), c.theme.level(Level::Unknown)),
                ]),
                None => text(
                    format!(
                        "{}/{}/{}/{}/{}",
                        p.free, p.reserved, p.resident, p.evictable, p.durable
                    ),
                    c.theme.base(),
                ),
            }
        },
    },
    Column {
        title: "HISTORY",
        width: HISTORY as u16,
        grow: false,
        priority: 1,
        sort: None,
        cell: |r, c| {
            text(
                sparkline(&r.history, HISTORY),
                Style::new().fg(c.theme.charts.sparkline).bg(c.theme.ui.bg),
            )
        },
    },
    Column {
        title: "RAM/SSD/OBJ",
        width: 16,
        grow: false,
        priority: 2,
        sort: Some(|r| SortKey::num(r.tiers.values().map(|t| t.bytes as f64).sum::<f64>())),
        cell: |r, c| {
            let tier = |t: Tier| {
                r.tiers
                    .get(&t)
                    .map_or_else(|| "—".to_owned(), |u| bytes_short(u.bytes))
            };
            text(
                format!(
                    "{}/{}/{}",
                    tier(Tier::Ram),
                    tier(Tier::Ssd),
                    tier(Tier::Object)
                ),
                c.theme.base(),
            )
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
        title: "EVICTIONS",
        width: 14,
        grow: true,
        priority: 3,
        sort: Some(|r| SortKey::num(r.evictions.values().sum::<u64>() as f64)),
        cell: |r, c| {
            let mut by_count: Vec<(&String, &u64)> = r.evictions.iter().collect();
            by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let s: Vec<String> = by_count.iter().map(|(k, v)| format!("{k} {v}")).collect();
            text(s.join(", "), c.theme.dim())
        },
    },
];

fn page_state(r: &PageRow) -> String {
    if r.gone.is_some() {
        "gone"
    } else if !r.online {
        "offline"
    } else if r.draining {
        "draining"
    } else {
        "serving"
    }
    .to_owned()
}

pub struct RoutesSpec;

impl PanelSpec for RoutesSpec {
    type Row = RouteRow;
    /// Newest first.
    const DEFAULT_SORT: (usize, bool) = (11, true);

    fn rows(model: &Model) -> &[RouteRow] {
        model.routes()
    }

    fn version(model: &Model) -> u64 {
        model.versions().routes
    }

    fn columns() -> &'static [Column<RouteRow>] {
        ROUTE_COLUMNS
    }

    fn stale(row: &RouteRow, ctx: &Ctx<'_>) -> bool {
        ctx.model.source_down(&row.source)
    }

    fn level(row: &RouteRow) -> Level {
        route_level(row)
    }
}

fn route_level(r: &RouteRow) -> Level {
    match r.phase {
        RoutePhase::Failed => Level::Bad,
        RoutePhase::Cancelled => Level::Info,
        RoutePhase::Completed if r.setbacks.is_empty() => Level::Good,
        RoutePhase::Completed => Level::Info,
        // Short of KV pages everywhere: the fleet is at capacity for it.
        RoutePhase::Waiting => Level::Warn,
        RoutePhase::Offered | RoutePhase::Running if !r.setbacks.is_empty() => Level::Warn,
        RoutePhase::Offered | RoutePhase::Running => Level::Info,
    }
}

const ROUTE_COLUMNS: &[Column<RouteRow>] = &[
    Column {
        title: "",
        width: 1,
        grow: false,
        priority: 0,
        sort: None,
        cell: |r, c| level_glyph(route_level(r), c.theme),
    },
    Column {
        title: "REQUEST",
        width: 12,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::text(r.request.as_str())),
        cell: |r, c| text(r.request.to_string(), c.theme.base()),
    },
    Column {
        title: "MODEL",
        width: 12,
        grow: false,
        priority: 3,
        sort: Some(|r| SortKey::text(&r.model)),
        cell: |r, c| text(r.model.clone(), c.theme.dim()),
    },
    Column {
        title: "WORKER",
        width: 10,
        grow: false,
        priority: 0,
        sort: Some(|r| {
            r.worker
                .as_ref()
                .map_or(SortKey::Missing, |w| SortKey::text(w.as_str()))
        }),
        cell: |r, c| match &r.worker {
            Some(w) => text(w.to_string(), c.theme.base()),
            None => missing(c.theme),
        },
    },
    Column {
        title: "TIER",
        width: 6,
        grow: false,
        priority: 1,
        sort: Some(|r| {
            r.tier
                .map_or(SortKey::Missing, |t| SortKey::text(t.as_str()))
        }),
        cell: |r, c| match r.tier {
            Some(t) => text(t.as_str(), c.theme.base()),
            None => missing(c.theme),
        },
    },
    Column {
        title: "CACHED",
        width: 6,
        grow: false,
        priority: 1,
        sort: Some(|r| SortKey::opt_num(r.cached_tokens)),
        cell: |r, c| match r.cached_tokens {
            Some(t) => text(format!("{t:>6}"), c.theme.base()),
            None => missing(c.theme),
        },
    },
    Column {
        title: "PRED",
        width: 8,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::opt_num(r.predicted_ttft_ms)),
        cell: |r, c| match r.predicted_ttft_ms {
            Some(p) => text(format!("{:>8}", ms(p)), c.theme.base()),
            None => missing(c.theme),
        },
    },
    Column {
        title: "TTFT",
        width: 8,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::opt_num(r.measured_ttft_ms.map(|v| v as f64))),
        cell: |r, c| match r.measured_ttft_ms {
            Some(m) => {
                // Twice the prediction or worse is worth a look.
                let late = r
                    .predicted_ttft_ms
                    .is_some_and(|p| m as f64 > 2.0 * p.max(1.0));
                let style = if late {
                    c.theme.level(Level::Warn)
                } else {
                    c.theme.base()
                };
                text(format!("{:>8}", ms(m as f64)), style)
            }
            None => missing(c.theme),
        },
    },
    Column {
        title: "PHASE",
        width: 9,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::text(r.phase.as_str())),
        cell: |r, c| text(r.phase.as_str(), c.theme.level(route_level(r))),
    },
    Column {
        title: "ATT",
        width: 3,
        grow: false,
        priority: 1,
        sort: Some(|r| SortKey::num(r.attempt as f64)),
        cell: |r, c| text(format!("{:>3}", r.attempt), c.theme.base()),
    },
    Column {
        title: "DECLINES / TIMEOUTS",
        width: 18,
        grow: true,
        priority: 1,
        sort: Some(|r| SortKey::num(r.setbacks.len() as f64)),
        cell: |r, c| match (&r.error, r.setbacks.is_empty()) {
            _ if r.phase == RoutePhase::Waiting => text(
                "waiting for KV pages".to_owned(),
                c.theme.level(Level::Warn),
            ),
            (Some(e), _) => text(e.clone(), c.theme.level(Level::Bad)),
            (None, true) => text(String::new(), c.theme.base()),
            (None, false) => text(r.setbacks.join("; "), c.theme.level(Level::Warn)),
        },
    },
    Column {
        title: "AGE",
        width: 5,
        grow: false,
        priority: 2,
        sort: Some(|r| SortKey::num(r.submitted_at.0 as f64)),
        cell: |r, c| {
            text(
                crate::ui::cells::age(c.now.since(r.updated_at)),
                c.theme.dim(),
            )
        },
    },
];

pub struct EventsSpec;

impl PanelSpec for EventsSpec {
    type Row = EventLine;
    /// Newest first.
    const DEFAULT_SORT: (usize, bool) = (0, true);

    fn rows(model: &Model) -> &[EventLine] {
        model.events()
    }

    fn version(model: &Model) -> u64 {
        model.versions().events
    }

    fn columns() -> &'static [Column<EventLine>] {
        EVENT_COLUMNS
    }

    fn stale(_: &EventLine, _: &Ctx<'_>) -> bool {
        false
    }

    /// History is not a current problem.
    fn level(_: &EventLine) -> Level {
        Level::Good
    }
}

const EVENT_COLUMNS: &[Column<EventLine>] = &[
    Column {
        title: "TIME",
        width: 7,
        grow: false,
        priority: 0,
        sort: Some(|r| SortKey::num(r.seq as f64)),
        cell: |r, c| text(clock(r.at), c.theme.dim()),
    },
    Column {
        title: "SOURCE",
        width: 10,
        grow: false,
        priority: 1,
        sort: Some(|r| {
            r.source
                .as_ref()
                .map_or(SortKey::Missing, |s| SortKey::text(s.as_str()))
        }),
        cell: |r, c| match &r.source {
            Some(s) => text(s.to_string(), c.theme.dim()),
            None => text("console", c.theme.dim()),
        },
    },
    Column {
        title: "",
        width: 1,
        grow: false,
        priority: 0,
        sort: None,
        cell: |r, c| level_glyph(r.level, c.theme),
    },
    Column {
        title: "EVENT",
        width: 20,
        grow: true,
        priority: 0,
        sort: None,
        cell: |r, c| {
            let style = if r.level == Level::Info {
                c.theme.base()
            } else {
                c.theme.level(r.level)
            };
            text(r.text.clone(), style)
        },
    },
];
