//! Cell formatting: ages, bytes, durations, bars and sparklines. Pure functions of their
//! inputs and the theme.

use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};

use den_protocol::time::Millis;

use crate::model::Level;
use crate::theme::Theme;

/// The symbol for a value that was not reported (distinct from zero).
pub const MISSING: &str = "—";

/// A missing value, styled as such.
pub fn missing(theme: &Theme) -> Line<'static> {
    Line::from(Span::styled(MISSING, theme.missing()))
}

pub fn text(s: impl Into<String>, style: Style) -> Line<'static> {
    Line::from(Span::styled(s.into(), style))
}

pub fn opt_text(s: Option<impl Into<String>>, style: Style, theme: &Theme) -> Line<'static> {
    match s {
        Some(s) => text(s, style),
        None => missing(theme),
    }
}

/// `850ms`, `12s`, `4m`, `3h`, `2d`.
pub fn age(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}s", ms / 1_000),
        60_000..3_600_000 => format!("{}m", ms / 60_000),
        3_600_000..86_400_000 => format!("{}h", ms / 3_600_000),
        _ => format!("{}d", ms / 86_400_000),
    }
}

/// The age of something observed at `at`, drawn stale past the bound.
pub fn age_cell(at: Option<Millis>, now: Millis, stale_after: u64, theme: &Theme) -> Line<'static> {
    match at {
        None => missing(theme),
        Some(at) => {
            let ms = now.since(at);
            let style = if ms > stale_after {
                theme.level(Level::Warn)
            } else {
                theme.dim()
            };
            text(age(ms), style)
        }
    }
}

/// How far a deadline is: `in 4m`, or `4m ago` (passed) in the bad colour.
pub fn deadline(at: Millis, now: Millis, theme: &Theme) -> Line<'static> {
    if at > now {
        text(format!("in {}", age(at.since(now))), theme.base())
    } else {
        text(
            format!("{} ago", age(now.since(at))),
            theme.level(Level::Bad),
        )
    }
}

pub use den_protocol::text::bytes;

/// Compact bytes in binary units without a space: `1.2Gi`, `640Mi`, `12Ki`, `512B`.
pub fn bytes_short(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "Ki", "Mi", "Gi", "Ti"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    let u = UNITS.get(unit).copied().unwrap_or("B");
    if unit == 0 || v >= 100.0 {
        format!("{v:.0}{u}")
    } else {
        format!("{v:.1}{u}")
    }
}

/// Milliseconds with one decimal below 100 ms.
pub fn ms(v: f64) -> String {
    if !v.is_finite() {
        return "?".to_owned();
    }
    if v < 100.0 {
        format!("{v:.1}ms")
    } else if v < 10_000.0 {
        format!("{v:.0}ms")
    } else {
        format!("{:.1}s", v / 1000.0)
    }
}

/// A stacked bar of `width` cells: each part gets a share of the cells proportional to
/// its value (largest remainder), drawn in its colour; the rest is `empty`.
pub fn stacked_bar(
    parts: &[(u64, Color)],
    total: u64,
    width: usize,
    empty: Color,
) -> Vec<Span<'static>> {
    if width == 0 {
        return Vec::new();
    }
    if total == 0 {
        return vec![Span::styled("░".repeat(width), Style::new().fg(empty))];
    }
    let mut cells: Vec<(usize, u64, Color)> = parts
        .iter()
        .map(|(v, c)| {
            let exact = (*v as u128 * width as u128) / total as u128;
            let rem = (*v as u128 * width as u128) % total as u128;
            (exact as usize, rem as u64, *c)
        })
        .collect();
    let used: usize = cells.iter().map(|(n, _, _)| *n).sum();
    let filled: u64 = parts.iter().map(|(v, _)| *v).sum::<u64>().min(total);
    let target = ((filled as u128 * width as u128 + total as u128 / 2) / total as u128) as usize;
    let mut extra = target.saturating_sub(used).min(width.saturating_sub(used));
    let mut by_rem: Vec<usize> = (0..cells.len()).collect();
    by_rem.sort_by(|a, b| {
        let ra = cells.get(*a).map_or(0, |c| c.1);
        let rb = cells.get(*b).map_or(0, |c| c.1);
        rb.cmp(&ra).then(a.cmp(b))
    });
    for i in by_rem {
        if extra == 0 {
            break;
        }
        if let Some(c) = cells.get_mut(i)
            && c.1 > 0
        {
            c.0 += 1;
            extra -= 1;
        }
    }
    let mut spans = Vec::new();
    let mut drawn = 0;
    for (n, _, colour) in cells {
        let n = n.min(width - drawn);
        if n > 0 {
            spans.push(Span::styled("█".repeat(n), Style::new().fg(colour)));
            drawn += n;
        }
    }
    if drawn < width {
        spans.push(Span::styled(
            "░".repeat(width - drawn),
            Style::new().fg(empty),
        ));
    }
    spans
}

/// A progress bar with a percentage: `██████░░░░  60%`. Unknown total → `?`.
pub fn progress(
    done: Option<u64>,
    total: Option<u64>,
    width: usize,
    theme: &Theme,
) -> Line<'static> {
    let (Some(done), Some(total)) = (done, total) else {
        let mut spans = vec![Span::styled(
            "░".repeat(width.saturating_sub(5)),
            Style::new().fg(theme.charts.progress_empty),
        )];
        spans.push(Span::styled("    ?", theme.missing()));
        return Line::from(spans);
    };
    let pct = if total == 0 {
        0
    } else {
        ((done.min(total) as u128 * 100) / total as u128) as u64
    };
    let mut spans = stacked_bar(
        &[(done.min(total), theme.charts.progress)],
        total,
        width.saturating_sub(5),
        theme.charts.progress_empty,
    );
    spans.push(Span::styled(format!("{pct:>4}%"), theme.base()));
    Line::from(spans)
}

const TICKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// The last `width` percentages as a sparkline (0–100 → ▁…█), right-aligned.
pub fn sparkline(values: &[u8], width: usize) -> String {
    let start = values.len().saturating_sub(width);
    let tail = values.get(start..).unwrap_or(&[]);
    let mut s: String = " ".repeat(width.saturating_sub(tail.len()));
    for v in tail {
        let i = (usize::from((*v).min(100)) * (TICKS.len() - 1) + 50) / 100;
        s.push(TICKS.get(i).copied().unwrap_or('█'));
    }
    s
}

/// Session time as `mm:ss.t` below an hour, else `h:mm:ss`.
pub fn clock(at: Millis) -> String {
    let s = at.0 / 1000;
    if s < 3600 {
        format!("{:02}:{:02}.{}", s / 60, s % 60, (at.0 % 1000) / 100)
    } else {
        format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widths(spans: &[Span<'_>]) -> Vec<usize> {
        spans.iter().map(|s| s.content.chars().count()).collect()
    }

    #[test]
    fn stacked_bars_fill_exactly_their_width() {
        let c = Color::Red;
        let spans = stacked_bar(&[(1, c), (1, c), (1, c)], 3, 10, Color::Gray);
        assert_eq!(widths(&spans).iter().sum::<usize>(), 10);
        let spans = stacked_bar(&[(5, c)], 10, 10, Color::Gray);
        assert_eq!(widths(&spans), [5, 5]);
        let spans = stacked_bar(&[], 0, 4, Color::Gray);
        assert_eq!(widths(&spans), [4]);
        // over-full input never draws past the width
        let spans = stacked_bar(&[(30, c), (30, c)], 10, 8, Color::Gray);
        assert_eq!(widths(&spans).iter().sum::<usize>(), 8);
    }

    #[test]
    fn formats_are_compact() {
        assert_eq!(age(850), "850ms");
        assert_eq!(age(61_000), "1m");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(12), "12 B");
        assert_eq!(bytes_short(3 * 1024 * 1024 * 1024), "3.0Gi");
        assert_eq!(ms(20.84), "20.8ms");
        assert_eq!(ms(12_500.0), "12.5s");
        assert_eq!(sparkline(&[0, 50, 100], 5), "  ▁▅█");
        assert_eq!(clock(Millis(61_500)), "01:01.5");
    }
}

/// Text cut to `width` terminal cells. A single token (an id, a hash, a path) keeps its
/// head and its tail around a middle `…`, because ids that share a prefix (peer ids all
/// start `12D3KooW`) differ at the end; a token with `/` (`org/model`, a path) first
/// loses everything before its last component; text with spaces keeps its head and ends
/// in `…`.
/// Text that fits is returned unchanged.
pub fn elide(s: &str, width: usize) -> String {
    use unicode_width::UnicodeWidthStr;
    if s.width() <= width {
        return s.to_owned();
    }
    if width == 0 {
        return String::new();
    }
    let budget = width - 1;
    if s.contains(char::is_whitespace) {
        return format!("{}…", take_cells(s.chars(), budget));
    }
    // `org/model`, a path: the last component names the thing; the owner goes first.
    if let Some((_, last)) = s.rsplit_once('/')
        && !last.is_empty()
    {
        return elide(last, width);
    }
    let tail_cells = budget / 2;
    let head = take_cells(s.chars(), budget - tail_cells);
    let tail: String = take_cells(s.chars().rev(), tail_cells)
        .chars()
        .rev()
        .collect();
    format!("{head}…{tail}")
}

fn take_cells(chars: impl Iterator<Item = char>, cells: usize) -> String {
    use unicode_width::UnicodeWidthChar;
    let mut out = String::new();
    let mut used = 0;
    for c in chars {
        let w = c.width().unwrap_or(0);
        if used + w > cells {
            break;
        }
        used += w;
        out.push(c);
    }
    out
}

/// A cell's line cut to `width` cells by [`elide`], keeping the first span's style.
pub fn elide_line(line: Line<'static>, width: u16) -> Line<'static> {
    let width = usize::from(width);
    if line.width() <= width {
        return line;
    }
    let style = line.spans.first().map(|s| s.style).unwrap_or_default();
    let text: String = line.spans.iter().map(|s| s.content.as_ref()).collect();
    Line::from(Span::styled(elide(&text, width), style)).style(line.style)
}

#[cfg(test)]
mod elide_tests {
    use super::elide;

    #[test]
    fn ids_keep_head_and_tail_text_keeps_its_head() {
        let id = "12D3KooWS5hbRfsg4cwEX7pKogLSmR1udPzi5g68xyrDuoCesy1L";
        assert_eq!(elide(id, 52), id);
        let cut = elide(id, 24);
        assert_eq!(cut.chars().count(), 24);
        assert_eq!(cut, "12D3KooWS5hb…yrDuoCesy1L");
        assert!(cut.ends_with("Cesy1L") && cut.starts_with("12D3KooW"));
        assert_eq!(elide("not ready: download", 12), "not ready: …");
        assert_eq!(
            elide("mlx-community/Meta-Llama-3.1-8B-Instruct-4bit", 20),
            "Meta-Llama…ruct-4bit"
        );
        assert_eq!(elide("mlx-community/Qwen3-0.6B", 20), "Qwen3-0.6B");
        assert_eq!(elide("東京東京東京", 5), "東…京");
        assert_eq!(elide("東京 東京 東京", 6), "東京 …");
        assert_eq!(elide("abc", 0), "");
        assert_eq!(elide("abcdef", 1), "…");
    }
}
