//! Overlays: the command palette with its completion popup, the confirmation dialog and
//! the per-panel help.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph, Wrap};

use crate::app::palette::COMMANDS;
use crate::app::{App, Command, PaletteState, Panel};
use crate::dispatch_panel;
use crate::model::{Level, Mark};
use crate::theme::Theme;

use super::centered;
use super::columns::{PanelSpec, sort_title};
use crate::app::keymap::{self, KeyMode};

/// Completion candidates shown at once.
const POPUP_ROWS: usize = 8;

pub fn palette(frame: &mut Frame<'_>, body: Rect, state: &PaletteState, app: &App, theme: &Theme) {
    let width = body.width.saturating_sub(4).min(90);
    let input_area = Rect {
        x: body.x + (body.width - width) / 2,
        y: body.y + body.height.saturating_sub(4),
        width,
        height: 3.min(body.height),
    };
    let block = Block::bordered()
        .border_type(BorderType::Rounded)
        .border_style(theme.overlay().fg(theme.overlay.border))
        .style(theme.overlay())
        .title(Span::styled(
            " command ",
            theme.overlay().add_modifier(Modifier::BOLD),
        ));
    let mut line = vec![
        Span::styled(": ", theme.overlay().fg(theme.overlay.border)),
        Span::styled(state.input.clone(), theme.overlay().fg(theme.overlay.input)),
        Span::styled("▏", theme.overlay().fg(theme.overlay.input)),
    ];
    if let Some(usage) = usage_hint(&state.input) {
        line.push(Span::styled(
            format!("   {usage}"),
            theme.overlay().fg(theme.ui.dim),
        ));
    }
    if app.read_only {
        line.push(Span::styled(
            "   read-only",
            theme.overlay().fg(theme.status.warn),
        ));
    }
    frame.render_widget(Clear, input_area);
    frame.render_widget(Paragraph::new(Line::from(line)).block(block), input_area);

    if state.candidates.is_empty() {
        return;
    }
    let shown = state.candidates.len().min(POPUP_ROWS);
    let start = state
        .chosen
        .map_or(0, |c| c.saturating_sub(POPUP_ROWS - 1))
        .min(state.candidates.len() - shown);
    let height = u16::try_from(shown).unwrap_or(0) + 2;
    let popup = Rect {
        y: input_area.y.saturating_sub(height),
        height: height.min(input_area.y.saturating_sub(body.y)),
        width: width.min(60),
        ..input_area
    };
    let lines: Vec<Line<'_>> = state
        .candidates
        .iter()
        .enumerate()
        .skip(start)
        .take(shown)
        .map(|(i, c)| {
            let style = if Some(i) == state.chosen {
                theme.selection()
            } else {
                theme.overlay()
            };
            Line::from(Span::styled(format!(" {c}"), style))
        })
        .collect();
    let more = state.candidates.len().saturating_sub(shown);
    let title = if more > 0 {
        format!(" tab: {} of {} ", shown, state.candidates.len())
    } else {
        " tab completes ".to_owned()
    };
    let block = Block::bordered()
        .border_type(BorderType::Rounded)
        .border_style(theme.overlay().fg(theme.overlay.border))
        .style(theme.overlay())
        .title(Span::styled(title, theme.overlay().fg(theme.ui.dim)));
    frame.render_widget(Clear, popup);
    frame.render_widget(Paragraph::new(lines).block(block), popup);
}

/// The usage line of the command being typed.
fn usage_hint(input: &str) -> Option<&'static str> {
    let verb = input.split_whitespace().next()?;
    COMMANDS
        .iter()
        .find(|(c, _)| *c == verb)
        .map(|(_, usage)| *usage)
        .filter(|u| u.contains(' '))
        .map(|u| u.split("  ").next().unwrap_or(u))
}

pub fn confirm(frame: &mut Frame<'_>, body: Rect, command: &Command, theme: &Theme) {
    let area = centered(body, 64, 9);
    let danger = theme.overlay().fg(theme.overlay.danger);
    let block = Block::bordered()
        .border_type(BorderType::Double)
        .border_style(danger)
        .style(theme.overlay())
        .title(Span::styled(
            format!(" {}? ", command.verb()),
            danger.add_modifier(Modifier::BOLD),
        ));
    let text = vec![
        Line::from(Span::styled(
            command.to_string(),
            theme.overlay().add_modifier(Modifier::BOLD),
        )),
        Line::raw(""),
        Line::from(Span::styled(command.consequence(), theme.overlay())),
        Line::raw(""),
        Line::from(vec![
            Span::styled(
                " y ",
                danger.add_modifier(Modifier::REVERSED | Modifier::BOLD),
            ),
            Span::styled(" confirm    ", theme.overlay()),
            Span::styled(
                " any other key ",
                theme.overlay().add_modifier(Modifier::REVERSED),
            ),
            Span::styled(" cancel", theme.overlay()),
        ]),
    ];
    frame.render_widget(Clear, area);
    frame.render_widget(
        Paragraph::new(text).block(block).wrap(Wrap { trim: true }),
        area,
    );
}

pub fn help(frame: &mut Frame<'_>, body: Rect, panel: Panel, read_only: bool, theme: &Theme) {
    let area = centered(body, 86, 30);
    let block = Block::bordered()
        .border_type(BorderType::Rounded)
        .border_style(theme.overlay().fg(theme.overlay.border))
        .style(theme.overlay())
        .title(Span::styled(
            format!(" help: {} ", panel.title()),
            theme.overlay().add_modifier(Modifier::BOLD),
        ));
    let heading = |s: &str| {
        Line::from(Span::styled(
            s.to_owned(),
            theme
                .overlay()
                .fg(theme.ui.title)
                .add_modifier(Modifier::BOLD),
        ))
    };
    let mut lines = vec![
        Line::from(Span::styled(about(panel), theme.overlay())),
        Line::raw(""),
    ];
    lines.push(heading("keys"));
    let mut keys = keymap::help_keys(panel, KeyMode::Normal, read_only);
    keys.push(("ctrl-c", "quit"));
    for chunk in keys.chunks(3) {
        let mut spans = Vec::new();
        for (k, what) in chunk {
            spans.push(Span::styled(
                format!(" {k:>9} "),
                theme
                    .overlay()
                    .fg(theme.ui.key)
                    .add_modifier(Modifier::BOLD),
            ));
            spans.push(Span::styled(format!("{what:<14}"), theme.overlay()));
        }
        lines.push(Line::from(spans));
    }
    lines.push(Line::raw(""));
    lines.push(heading("marks"));
    let mut marks = Vec::new();
    for (mark, what) in [
        (Mark::Ok, "confirmed"),
        (Mark::Pending, "in progress"),
        (Mark::Bad, "failed"),
        (Mark::Unknown, "not reported"),
        (Mark::Contradiction, "contradicted"),
    ] {
        marks.push(Span::styled(
            format!(" {} ", mark.symbol()),
            theme.mark(mark).bg(theme.overlay.bg),
        ));
        marks.push(Span::styled(format!("{what}  "), theme.overlay()));
    }
    lines.push(Line::from(marks));
    let mut levels = Vec::new();
    for (glyph, level, what) in [
        ("●", Level::Good, "healthy"),
        ("○", Level::Info, "informational"),
        ("◐", Level::Warn, "not yet / one-sided"),
        ("✗", Level::Bad, "failed"),
        ("?", Level::Unknown, "unknown"),
    ] {
        levels.push(Span::styled(
            format!(" {glyph} "),
            theme.level(level).bg(theme.overlay.bg),
        ));
        levels.push(Span::styled(format!("{what}  "), theme.overlay()));
    }
    lines.push(Line::from(levels));
    lines.push(Line::from(Span::styled(
        " — means not reported (never zero); dim rows are older than the staleness bound or their source is down",
        theme.overlay(),
    )));
    lines.push(Line::raw(""));
    lines.push(heading("columns (s sorts by the next one, S reverses)"));
    let columns = dispatch_panel!(panel, column_titles());
    lines.push(Line::from(Span::styled(
        format!(" {columns}"),
        theme.overlay(),
    )));
    lines.push(Line::raw(""));
    lines.push(heading("commands (:)"));
    for (_, usage) in COMMANDS.iter().take(4) {
        lines.push(Line::from(Span::styled(
            format!(" {usage}"),
            theme.overlay(),
        )));
    }
    lines.push(Line::from(Span::styled(
        " nodes|downloads|instances|pages|routes|events   theme NAME   quit",
        theme.overlay(),
    )));
    frame.render_widget(Clear, area);
    frame.render_widget(
        Paragraph::new(lines)
            .block(block)
            .wrap(Wrap { trim: false }),
        area,
    );
}

fn column_titles<S: PanelSpec>() -> String {
    (0..S::columns().len())
        .map(sort_title::<S>)
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(" · ")
}

fn about(panel: Panel) -> &'static str {
    match panel {
        Panel::Nodes => {
            "Every node any source knows: whether its identity is bound (its own /node_id answers), two-sided membership (every fresh source lists it and, where reported, observes its resources), when it was last seen, memory and the den page pools on it."
        }
        Panel::Downloads => {
            "Download records per node from every /state, grouped by artifact; one row per attempt (legacy records have no attempt id). Byte progress is not installation readiness: only completed counts."
        }
        Panel::Instances => {
            "Each instance with its readiness verdict and deadline, then one row per assigned node with its evidence: download, runner and inference probe. Ready only when all agree for the same instance."
        }
        Panel::Pages => {
            "Page pools of den workers from the router feed: reserved, resident (durable, evictable) and free pages, occupancy history per heartbeat, bytes per storage tier and eviction reasons."
        }
        Panel::Routes => {
            "Requests the router decided on: where each went, the predicted and measured time to first token, and every decline or timeout. Enter shows all candidates and their scores."
        }
        Panel::Events => "Everything observed and every command issued, newest first.",
    }
}
