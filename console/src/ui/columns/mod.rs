//! Table schemas: for each panel its rows, columns (title, width, priority, sort key,
//! cell) and what makes a row stale or a problem. The app sorts with the same columns
//! the table draws.

mod cluster;
mod feed;

use ratatui::text::{Line, Span};

use den_protocol::time::Millis;

use crate::app::table::{SortFn, TableRow};
use crate::model::{Level, Model};
use crate::theme::Theme;

pub use cluster::{DownloadsSpec, InstancesSpec, NodesSpec};
pub use feed::{EventsSpec, PagesSpec, RoutesSpec};

/// What a cell is drawn with.
pub struct Ctx<'a> {
    pub theme: &'a Theme,
    pub now: Millis,
    pub model: &'a Model,
    /// The row is the first of its group (or has none).
    pub head: bool,
}

impl Ctx<'_> {
    pub fn stale_after(&self) -> u64 {
        self.model.config().stale_after_ms
    }
}

/// One column of a table.
pub struct Column<R> {
    pub title: &'static str,
    /// Minimum width in cells.
    pub width: u16,
    /// Takes a share of the spare width.
    pub grow: bool,
    /// 0 = always shown; higher numbers are dropped first when the screen is narrow.
    pub priority: u8,
    pub sort: Option<SortFn<R>>,
    pub cell: fn(&R, &Ctx<'_>) -> Line<'static>,
}

/// A panel's schema.
pub trait PanelSpec {
    type Row: TableRow + 'static;
    /// Initial sort column and direction.
    const DEFAULT_SORT: (usize, bool);
    fn rows(model: &Model) -> &[Self::Row];
    /// What the panel's tab counts (rows, unless a row is a detail of another).
    fn count(model: &Model) -> usize {
        Self::rows(model).len()
    }
    fn version(model: &Model) -> u64;
    fn columns() -> &'static [Column<Self::Row>];
    /// Drawn aged: older than the staleness bound, or its source is down.
    fn stale(row: &Self::Row, ctx: &Ctx<'_>) -> bool;
    /// Counted in the panel's problem badge.
    fn level(row: &Self::Row) -> Level;
}

/// Runs `$f::<Spec>($args…)` for the spec of `$panel`.
#[macro_export]
macro_rules! dispatch_panel {
    ($panel:expr, $($f:ident)::+ ( $($arg:expr),* $(,)? )) => {
        match $panel {
            $crate::app::Panel::Nodes => $($f)::+::<$crate::ui::columns::NodesSpec>($($arg),*),
            $crate::app::Panel::Downloads => $($f)::+::<$crate::ui::columns::DownloadsSpec>($($arg),*),
            $crate::app::Panel::Instances => $($f)::+::<$crate::ui::columns::InstancesSpec>($($arg),*),
            $crate::app::Panel::Pages => $($f)::+::<$crate::ui::columns::PagesSpec>($($arg),*),
            $crate::app::Panel::Routes => $($f)::+::<$crate::ui::columns::RoutesSpec>($($arg),*),
            $crate::app::Panel::Events => $($f)::+::<$crate::ui::columns::EventsSpec>($($arg),*),
        }
    };
}

/// The sort function of column `i`, if it sorts.
pub fn sort_of<S: PanelSpec>(i: usize) -> Option<SortFn<S::Row>> {
    S::columns().get(i).and_then(|c| c.sort)
}

/// Titles of the sortable columns, for the help and the table title.
pub fn sort_title<S: PanelSpec>(i: usize) -> &'static str {
    S::columns().get(i).map_or("", |c| c.title)
}

/// The next sortable column after `i` (wrapping).
pub fn next_sortable<S: PanelSpec>(i: usize) -> usize {
    let cols = S::columns();
    (1..=cols.len())
        .map(|d| (i + d) % cols.len().max(1))
        .find(|j| cols.get(*j).is_some_and(|c| c.sort.is_some()))
        .unwrap_or(i)
}

/// Rows with a problem (warn, bad, unknown).
pub fn problems<S: PanelSpec>(model: &Model) -> usize {
    S::rows(model)
        .iter()
        .filter(|r| S::level(r).is_problem())
        .count()
}

/// The status glyph of a row: distinct shapes, not only colours.
pub fn level_glyph(level: Level, theme: &Theme) -> Line<'static> {
    let glyph = match level {
        Level::Good => "●",
        Level::Info => "○",
        Level::Warn => "◐",
        Level::Bad => "✗",
        Level::Unknown => "?",
    };
    Line::from(Span::styled(glyph, theme.level(level)))
}
