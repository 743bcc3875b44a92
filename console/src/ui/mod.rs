//! Drawing. Every widget draws from `(&App, &Model, &Theme, now)` and nothing else: no
//! clock, no I/O, no state changes (the table's scroll offset is a `Cell` the widget
//! keeps in view). The same inputs draw the same frame.

pub mod cells;
pub mod columns;
mod detail;
mod overlay;
pub mod table;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use den_protocol::session::SourceKind;
use den_protocol::time::Millis;

use crate::app::keymap::{self, KeyMode};
use crate::app::{App, Mode, Panel};
use crate::dispatch_panel;
use crate::model::{Health, Level, Model, SourceRow};
use crate::theme::Theme;

use columns::problems;

/// Draw one frame.
pub fn draw(frame: &mut Frame<'_>, app: &App, model: &Model, theme: &Theme, now: Millis) {
    draw_in(frame, frame.area(), app, model, theme, now);
}

/// Draw the console into `area` of the frame (`den replay` keeps rows below it for its
/// timeline).
pub fn draw_in(
    frame: &mut Frame<'_>,
    area: Rect,
    app: &App,
    model: &Model,
    theme: &Theme,
    now: Millis,
) {
    frame.render_widget(Block::new().style(theme.base()), area);
    let [header, tabs, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);
    draw_header(frame, header, app, model, theme, now);
    draw_tabs(frame, tabs, app, model, theme);
    let panel = app.focus;
    dispatch_panel!(
        panel,
        table::draw(frame, body, panel, app, model, theme, now)
    );
    draw_footer(frame, footer, app, theme);
    match &app.mode {
        Mode::Palette(state) => overlay::palette(frame, body, state, app, theme),
        Mode::Confirm(command) => overlay::confirm(frame, body, command, theme),
        Mode::Help => overlay::help(frame, body, app.focus, app.read_only, theme),
        Mode::Detail { panel, key, scroll } => {
            detail::draw(frame, body, *panel, key, *scroll, model, theme, now)
        }
        Mode::Normal | Mode::Filter => {}
    }
}

fn draw_header(
    frame: &mut Frame<'_>,
    area: Rect,
    app: &App,
    model: &Model,
    theme: &Theme,
    now: Millis,
) {
    let mut spans = vec![Span::styled(
        " den ",
        theme.title().add_modifier(Modifier::REVERSED),
    )];
    let sources = &model.views().sources;
    if sources.is_empty() {
        spans.push(Span::styled(
            " no sources: pass --router URL or --skulk URL ",
            theme.level(Level::Warn),
        ));
    }
    for s in sources {
        spans.push(Span::raw(" "));
        spans.extend(source_spans(s, theme, now, model.config().silent_after_ms));
    }
    let mut right = Vec::new();
    if app.read_only {
        right.push(Span::styled(
            " READ-ONLY ",
            theme.level(Level::Warn).add_modifier(Modifier::REVERSED),
        ));
        right.push(Span::raw(" "));
    }
    match (&app.replay, &app.recording) {
        (Some(file), _) => {
            right.push(Span::styled(
                "▶ REPLAY ",
                theme.level(Level::Info).add_modifier(Modifier::BOLD),
            ));
            right.push(Span::styled(file.clone(), theme.dim()));
        }
        (None, Some(path)) => {
            right.push(Span::styled(
                "● REC ",
                theme.level(Level::Bad).add_modifier(Modifier::BOLD),
            ));
            right.push(Span::styled(path.clone(), theme.dim()));
        }
        (None, None) => right.push(Span::styled("not recording", theme.dim())),
    }
    right.push(Span::styled(
        format!(" {} ", cells::clock(now)),
        theme.dim(),
    ));
    let right_width: usize = right.iter().map(|s| s.content.chars().count()).sum();
    let [left_area, right_area] = Layout::horizontal([
        Constraint::Min(10),
        Constraint::Length(u16::try_from(right_width).unwrap_or(u16::MAX)),
    ])
    .areas(area);
    frame.render_widget(
        Paragraph::new(Line::from(spans)).style(theme.base()),
        left_area,
    );
    frame.render_widget(
        Paragraph::new(Line::from(right)).style(theme.base()),
        right_area,
    );
}

/// `● router 12ms`, `○ skulk connecting`, `✗ skulk down 30s: reason`.
fn source_spans(
    s: &SourceRow,
    theme: &Theme,
    now: Millis,
    silent_after_ms: u64,
) -> Vec<Span<'static>> {
    let kind = match s.kind {
        SourceKind::DenRouter => "router",
        SourceKind::Skulk => "skulk",
    };
    let name = if s.source.as_str() == kind {
        s.source.to_string()
    } else {
        format!("{kind}:{}", s.source)
    };
    match s.health() {
        // Connected, but nothing has answered for a while: not green. A frozen node
        // (SIGSTOP) looks like this until its polls time out.
        Health::Connected if s.last_ok.is_some_and(|t| now.since(t) > silent_after_ms) => {
            let age = s.last_ok.map_or(0, |t| now.since(t));
            vec![
                Span::styled("◐ ", theme.level(Level::Warn)),
                Span::styled(name, theme.base()),
                Span::styled(
                    format!(" silent {}", cells::age(age)),
                    theme.level(Level::Warn),
                ),
            ]
        }
        Health::Connected => {
            let latency = s.latency_ms.map_or_else(String::new, |l| format!(" {l}ms"));
            vec![
                Span::styled("● ", theme.level(Level::Good)),
                Span::styled(name, theme.base()),
                Span::styled(latency, theme.dim()),
            ]
        }
        Health::Connecting => vec![
            Span::styled("○ ", theme.level(Level::Unknown)),
            Span::styled(name, theme.base()),
            Span::styled(" connecting", theme.dim()),
        ],
        Health::Disconnected { since, .. } => vec![
            Span::styled("✗ ", theme.level(Level::Bad)),
            Span::styled(name, theme.level(Level::Bad)),
            Span::styled(
                format!(" down {}", cells::age(now.since(*since))),
                theme.level(Level::Bad),
            ),
        ],
    }
}

fn draw_tabs(frame: &mut Frame<'_>, area: Rect, app: &App, model: &Model, theme: &Theme) {
    let mut spans = Vec::new();
    for panel in Panel::ALL {
        let n = dispatch_panel!(panel, count(model));

        let bad = dispatch_panel!(panel, problems(model));
        let style = if panel == app.focus {
            ratatui::style::Style::new()
                .fg(theme.ui.tab_active_fg)
                .bg(theme.ui.tab_active_bg)
                .add_modifier(Modifier::BOLD)
        } else {
            theme.base().fg(theme.ui.tab_fg)
        };
        spans.push(Span::styled(
            format!(" {} {} {n} ", panel.index() + 1, panel.title()),
            style,
        ));
        if bad > 0 {
            spans.push(Span::styled(format!("◐{bad}"), theme.level(Level::Warn)));
        }
        spans.push(Span::raw(" "));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)).style(theme.base()), area);
}

fn count<S: columns::PanelSpec>(model: &Model) -> usize {
    S::count(model)
}

/// The keys that work now, or the flash message.
fn draw_footer(frame: &mut Frame<'_>, area: Rect, app: &App, theme: &Theme) {
    let line = if let Some(flash) = &app.flash {
        Line::from(Span::styled(
            format!(" {}", flash.text),
            theme.level(flash.level).add_modifier(Modifier::BOLD),
        ))
    } else {
        match &app.mode {
            Mode::Filter => Line::from(vec![
                Span::styled(" /", theme.key()),
                Span::styled(
                    format!("{}▏", app.table(app.focus).filter),
                    theme.base().fg(theme.overlay.input),
                ),
                Span::styled("  ⏎ keep  esc clear  !word excludes", theme.dim()),
            ]),
            mode => keys_line(&footer_keys(app.focus, mode, app.read_only), theme),
        }
    };
    frame.render_widget(Paragraph::new(line).style(theme.base()), area);
}

fn keys_line(keys: &[(&str, &str)], theme: &Theme) -> Line<'static> {
    let mut spans = vec![Span::raw(" ")];
    for (key, what) in keys {
        spans.push(Span::styled((*key).to_owned(), theme.key()));
        spans.push(Span::styled(format!(" {what} "), theme.dim()));
    }
    Line::from(spans)
}

/// The footer's key hints for a panel and mode, from the key table.
pub fn footer_keys(
    panel: Panel,
    mode: &Mode,
    read_only: bool,
) -> Vec<(&'static str, &'static str)> {
    keymap::footer_keys(panel, KeyMode::of(mode), read_only)
}

/// A rectangle centred in `area`, at most `width`×`height`.
pub fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let w = width.min(area.width);
    let h = height.min(area.height);
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}

#[cfg(test)]
mod tests;
