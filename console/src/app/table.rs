//! Table state of one panel: sort column and direction, filter, selection; and the
//! cached row order (filtered, sorted, grouped), recomputed only when the rows, the sort
//! or the filter changed, never per frame.

use std::borrow::Cow;
use std::cell::Cell;
use std::cmp::Ordering;

/// A value to sort by. Missing values sort last in both directions: "not reported" is
/// not the smallest value.
#[derive(Debug, Clone, PartialEq)]
pub enum SortKey {
    Text(String),
    Num(f64),
    Missing,
}

impl SortKey {
    pub fn num(v: impl Into<f64>) -> SortKey {
        SortKey::Num(v.into())
    }

    pub fn opt_num<T: Into<f64>>(v: Option<T>) -> SortKey {
        v.map_or(SortKey::Missing, |v| SortKey::Num(v.into()))
    }

    pub fn text(s: impl Into<String>) -> SortKey {
        SortKey::Text(s.into())
    }

    /// Ascending comparison of present values; `None` when either is missing.
    fn cmp_present(&self, other: &SortKey) -> Option<Ordering> {
        match (self, other) {
            (SortKey::Text(a), SortKey::Text(b)) => Some(a.cmp(b)),
            (SortKey::Num(a), SortKey::Num(b)) => Some(a.total_cmp(b)),
            (SortKey::Text(_), SortKey::Num(_)) => Some(Ordering::Greater),
            (SortKey::Num(_), SortKey::Text(_)) => Some(Ordering::Less),
            _ => None,
        }
    }
}

/// What a table needs from a row.
pub trait TableRow {
    /// Identifies the row across updates (selection follows it).
    fn key(&self) -> Cow<'_, str>;
    /// Rows of one group stay together, in model order (an instance and its nodes,
    /// the attempts of one artifact).
    fn group(&self) -> Option<&str> {
        None
    }
    /// Text the `/` filter matches against (lower case).
    fn filter_text(&self) -> String;
}

/// How to sort a panel's rows by one column.
pub type SortFn<R> = fn(&R) -> SortKey;

/// Per-panel table state.
#[derive(Debug, Clone, Default)]
pub struct TableState {
    /// Index of the sort column among the panel's columns.
    pub sort: usize,
    pub descending: bool,
    pub filter: String,
    /// Position of the selection in [`TableState::order`].
    pub selected: usize,
    selected_key: Option<String>,
    order: Vec<usize>,
    built_for: Option<(u64, usize, bool, String)>,
    /// First visible row; the table widget keeps the selection in view.
    pub offset: Cell<usize>,
    /// Rows visible at the last draw (for page up/down).
    pub viewport: Cell<usize>,
}

impl TableState {
    pub fn with_sort(sort: usize, descending: bool) -> TableState {
        TableState {
            sort,
            descending,
            ..TableState::default()
        }
    }

    /// Row indices in display order.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    pub fn selected_index(&self) -> Option<usize> {
        self.order.get(self.selected).copied()
    }

    pub fn selected_row<'a, R>(&self, rows: &'a [R]) -> Option<&'a R> {
        self.selected_index().and_then(|i| rows.get(i))
    }

    /// Recompute the order when `version`, the sort or the filter changed.
    pub fn rebuild<R: TableRow>(&mut self, rows: &[R], sort: Option<SortFn<R>>, version: u64) {
        let stamp = (version, self.sort, self.descending, self.filter.clone());
        if self.built_for.as_ref() == Some(&stamp) && self.order.len() <= rows.len() {
            return;
        }
        self.order = compute_order(rows, sort, self.descending, &self.filter);
        self.built_for = Some(stamp);
        self.reselect(rows);
    }

    /// Force the next [`TableState::rebuild`] to recompute.
    pub fn invalidate(&mut self) {
        self.built_for = None;
    }

    fn reselect<R: TableRow>(&mut self, rows: &[R]) {
        if let Some(key) = &self.selected_key
            && let Some(pos) = self
                .order
                .iter()
                .position(|i| rows.get(*i).is_some_and(|r| r.key() == key.as_str()))
        {
            self.selected = pos;
            return;
        }
        self.selected = self.selected.min(self.order.len().saturating_sub(1));
        self.remember(rows);
    }

    fn remember<R: TableRow>(&mut self, rows: &[R]) {
        self.selected_key = self.selected_row(rows).map(|r| r.key().into_owned());
    }

    /// Move the selection by `delta` rows (clamped).
    pub fn move_by<R: TableRow>(&mut self, rows: &[R], delta: isize) {
        if self.order.is_empty() {
            return;
        }
        let last = self.order.len() - 1;
        self.selected = self.selected.saturating_add_signed(delta).min(last);
        self.remember(rows);
    }

    pub fn select_first<R: TableRow>(&mut self, rows: &[R]) {
        self.selected = 0;
        self.remember(rows);
    }

    pub fn select_last<R: TableRow>(&mut self, rows: &[R]) {
        self.selected = self.order.len().saturating_sub(1);
        self.remember(rows);
    }

    /// Page size for page up/down (at least 1).
    pub fn page(&self) -> isize {
        self.viewport.get().max(2) as isize - 1
    }
}

/// Filter, sort and group rows.
///
/// Filter: every whitespace-separated term must occur in the row's filter text
/// (case-insensitive); a term starting with `!` must not. A group is shown whole when
/// any of its rows matches.
pub fn compute_order<R: TableRow>(
    rows: &[R],
    sort: Option<SortFn<R>>,
    descending: bool,
    filter: &str,
) -> Vec<usize> {
    let terms: Vec<(bool, String)> = filter
        .split_whitespace()
        .map(|t| match t.strip_prefix('!') {
            Some(rest) => (false, rest.to_lowercase()),
            None => (true, t.to_lowercase()),
        })
        .filter(|(_, t)| !t.is_empty())
        .collect();
    let matches = |r: &R| {
        if terms.is_empty() {
            return true;
        }
        let text = r.filter_text().to_lowercase();
        terms
            .iter()
            .all(|(want, t)| text.contains(t.as_str()) == *want)
    };
    let grouped = rows.iter().any(|r| r.group().is_some());
    let mut keep: Vec<usize> = if grouped && !terms.is_empty() {
        let groups: std::collections::BTreeSet<&str> = rows
            .iter()
            .filter(|r| matches(r))
            .filter_map(|r| r.group())
            .collect();
        (0..rows.len())
            .filter(|i| {
                rows.get(*i).is_some_and(|r| match r.group() {
                    Some(g) => groups.contains(g),
                    None => matches(r),
                })
            })
            .collect()
    } else {
        (0..rows.len())
            .filter(|i| rows.get(*i).is_some_and(&matches))
            .collect()
    };
    if let Some(sort) = sort {
        let mut keyed: Vec<(SortKey, usize)> = keep
            .iter()
            .filter_map(|i| rows.get(*i).map(|r| (sort(r), *i)))
            .collect();
        keyed.sort_by(|(a, ia), (b, ib)| {
            let by_value = match a.cmp_present(b) {
                Some(o) if descending => o.reverse(),
                Some(o) => o,
                None => match (a, b) {
                    (SortKey::Missing, SortKey::Missing) => Ordering::Equal,
                    (SortKey::Missing, _) => Ordering::Greater,
                    _ => Ordering::Less,
                },
            };
            by_value.then_with(|| match (rows.get(*ia), rows.get(*ib)) {
                (Some(ra), Some(rb)) => ra.key().cmp(&rb.key()),
                _ => ia.cmp(ib),
            })
        });
        keep = keyed.into_iter().map(|(_, i)| i).collect();
    }
    if grouped {
        keep = regroup(rows, keep);
    }
    keep
}

/// Groups in order of their first member; members in model order.
fn regroup<R: TableRow>(rows: &[R], sorted: Vec<usize>) -> Vec<usize> {
    let mut members: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for i in &sorted {
        if let Some(g) = rows.get(*i).and_then(|r| r.group()) {
            members.entry(g).or_default().push(*i);
        }
    }
    for list in members.values_mut() {
        list.sort_unstable();
    }
    let mut out = Vec::with_capacity(sorted.len());
    let mut done = std::collections::BTreeSet::new();
    for i in sorted {
        match rows.get(i).and_then(|r| r.group()) {
            None => out.push(i),
            Some(g) => {
                if done.insert(g)
                    && let Some(list) = members.get(g)
                {
                    out.extend(list.iter().copied());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    struct R(&'static str, Option<f64>, Option<&'static str>);

    impl TableRow for R {
        fn key(&self) -> Cow<'_, str> {
            Cow::Borrowed(self.0)
        }
        fn group(&self) -> Option<&str> {
            self.2
        }
        fn filter_text(&self) -> String {
            self.0.to_owned()
        }
    }

    fn by_value(r: &R) -> SortKey {
        SortKey::opt_num(r.1)
    }

    #[test]
    fn missing_values_sort_last_in_both_directions() {
        let rows = [
            R("a", Some(2.0), None),
            R("b", None, None),
            R("c", Some(1.0), None),
        ];
        assert_eq!(compute_order(&rows, Some(by_value), false, ""), [2, 0, 1]);
        assert_eq!(compute_order(&rows, Some(by_value), true, ""), [0, 2, 1]);
    }

    #[test]
    fn filter_terms_all_match_and_bang_excludes() {
        let rows = [
            R("alpha-1", None, None),
            R("alpha-2", None, None),
            R("beta", None, None),
        ];
        assert_eq!(compute_order(&rows, None, false, "ALPHA"), [0, 1]);
        assert_eq!(compute_order(&rows, None, false, "alpha !2"), [0]);
        assert_eq!(compute_order(&rows, None, false, "  "), [0, 1, 2]);
    }

    #[test]
    fn groups_stay_together_in_model_order() {
        let rows = [
            R("g1-parent", Some(5.0), Some("g1")),
            R("g1-child", None, Some("g1")),
            R("g2-parent", Some(1.0), Some("g2")),
            R("g2-child", None, Some("g2")),
        ];
        assert_eq!(
            compute_order(&rows, Some(by_value), false, ""),
            [2, 3, 0, 1]
        );
        // a match on a child shows its whole group
        assert_eq!(compute_order(&rows, None, false, "g1-child"), [0, 1]);
    }

    #[test]
    fn selection_follows_its_row_across_reorders() {
        let rows = vec![R("a", Some(1.0), None), R("b", Some(2.0), None)];
        let mut t = TableState::default();
        t.rebuild(&rows, Some(by_value), 1);
        t.move_by(&rows, 1);
        assert_eq!(t.selected_row(&rows).unwrap().0, "b");
        t.descending = true;
        t.rebuild(&rows, Some(by_value), 1);
        assert_eq!(t.selected, 0);
        assert_eq!(t.selected_row(&rows).unwrap().0, "b");
    }
}
