//! The table widget every panel uses: responsive columns, sorted/filtered rows from the
//! app's cached order, only the visible rows formatted, stale rows aged.

use ratatui::Frame;
use ratatui::layout::{Alignment, Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Paragraph, Row, Table};

use den_protocol::time::Millis;

use crate::app::table::TableRow;
use crate::app::{App, Panel};
use crate::model::Model;
use crate::theme::Theme;

use super::columns::{Column, Ctx, PanelSpec, sort_title};

/// Draw the focused panel's table into `area`.
pub fn draw<S: PanelSpec>(
    frame: &mut Frame<'_>,
    area: Rect,
    panel: Panel,
    app: &App,
    model: &Model,
    theme: &Theme,
    now: Millis,
) {
    let state = app.table(panel);
    let rows = S::rows(model);
    let order = state.order();
    let arrow = if state.descending { "▼" } else { "▲" };
    let mut right = vec![Span::styled(
        format!(" sort {} {arrow} ", sort_title::<S>(state.sort)),
        theme.dim(),
    )];
    if !state.filter.is_empty() {
        right.push(Span::styled(format!("/{} ", state.filter), theme.key()));
    }
    let block = Block::bordered()
        .border_type(BorderType::Rounded)
        .border_style(theme.border(true))
        .style(theme.base())
        .title(Line::from(vec![
            Span::styled(format!(" {} ", panel.title()), theme.title()),
            Span::styled(format!("{}/{} ", order.len(), rows.len()), theme.dim()),
        ]))
        .title(Line::from(right).alignment(Alignment::Right));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.height < 2 || inner.width < 4 {
        return;
    }
    let columns = fit_columns(S::columns(), inner.width);
    let widths: Vec<Constraint> = columns
        .iter()
        .map(|(_, w)| Constraint::Length(*w))
        .collect();
    let header = Row::new(
        columns
            .iter()
            .map(|(c, _)| Line::from(Span::styled(c.title, theme.header()))),
    )
    .style(theme.header());

    let viewport = usize::from(inner.height - 1);
    state.viewport.set(viewport);
    if order.is_empty() {
        let text = if rows.is_empty() {
            empty_text(panel)
        } else {
            format!("nothing matches /{} — esc clears the filter", state.filter)
        };
        let table = Table::new(Vec::<Row<'_>>::new(), widths)
            .header(header)
            .column_spacing(1)
            .style(theme.base());
        frame.render_widget(table, inner);
        let msg_area = Rect {
            y: inner.y + 2.min(inner.height - 1),
            height: 1,
            ..inner
        };
        frame.render_widget(
            Paragraph::new(Span::styled(text, theme.missing())).alignment(Alignment::Center),
            msg_area,
        );
        return;
    }
    let selected = state.selected.min(order.len() - 1);
    let mut offset = state.offset.get().min(selected);
    if selected >= offset + viewport {
        offset = selected + 1 - viewport;
    }
    offset = offset.min(order.len().saturating_sub(viewport));
    state.offset.set(offset);

    let end = (offset + viewport).min(order.len());
    let mut table_rows = Vec::with_capacity(end - offset);
    for pos in offset..end {
        let Some(row) = order.get(pos).and_then(|i| rows.get(*i)) else {
            continue;
        };
        let head = match (pos.checked_sub(1).and_then(|p| order.get(p)), row.group()) {
            (_, None) | (None, _) => true,
            (Some(prev), Some(group)) => rows.get(*prev).and_then(|r| r.group()) != Some(group),
        };
        let ctx = Ctx {
            theme,
            now,
            model,
            head,
        };
        let stale = S::stale(row, &ctx);
        let cells = columns.iter().map(|(c, w)| {
            let line = super::cells::elide_line((c.cell)(row, &ctx), *w);
            if pos == selected {
                restyle(line, theme.selection().add_modifier(Modifier::BOLD))
            } else if stale {
                restyle(line, theme.stale())
            } else {
                line
            }
        });
        let style = if pos == selected {
            theme.selection()
        } else {
            theme.base()
        };
        table_rows.push(Row::new(cells).style(style));
    }
    let table = Table::new(table_rows, widths)
        .header(header)
        .column_spacing(1)
        .style(theme.base());
    frame.render_widget(table, inner);
}

/// Override every span's colours (keeping modifiers such as reverse for contradictions).
fn restyle(line: Line<'static>, style: Style) -> Line<'static> {
    let spans = line
        .spans
        .into_iter()
        .map(|s| {
            let keep = s.style.add_modifier & (Modifier::REVERSED | Modifier::BOLD);
            Span::styled(s.content, style.add_modifier(keep))
        })
        .collect::<Vec<_>>();
    Line::from(spans)
}

/// Choose the columns that fit `width` (dropping the highest priority numbers first)
/// and share the spare width among growing columns.
pub fn fit_columns<R>(columns: &'static [Column<R>], width: u16) -> Vec<(&'static Column<R>, u16)> {
    let mut shown: Vec<&Column<R>> = columns.iter().collect();
    let need = |cols: &[&Column<R>]| -> u32 {
        cols.iter().map(|c| u32::from(c.width)).sum::<u32>() + cols.len().saturating_sub(1) as u32
    };
    while need(&shown) > u32::from(width) {
        let Some((drop, _)) = shown
            .iter()
            .enumerate()
            .filter(|(_, c)| c.priority > 0)
            .max_by_key(|(i, c)| (c.priority, *i))
        else {
            break;
        };
        shown.remove(drop);
    }
    let spare = u32::from(width).saturating_sub(need(&shown));
    let growers = shown.iter().filter(|c| c.grow).count() as u32;
    let mut extra_left = spare;
    let mut seen_growers = 0;
    shown
        .into_iter()
        .map(|c| {
            let mut w = u32::from(c.width);
            if c.grow && growers > 0 {
                seen_growers += 1;
                let share = if seen_growers == growers {
                    extra_left
                } else {
                    spare / growers
                };
                extra_left -= share;
                w += share;
            }
            (c, u16::try_from(w).unwrap_or(u16::MAX))
        })
        .collect()
}

fn empty_text(panel: Panel) -> String {
    match panel {
        Panel::Nodes => "no nodes yet: waiting for a source to answer (header shows their health)",
        Panel::Downloads => "no download records in any /state",
        Panel::Instances => "no instances: `:place MODEL` places one",
        Panel::Pages => "no den workers: page pools come from a den router's feed (--router)",
        Panel::Routes => "no requests routed yet (needs a den router: --router)",
        Panel::Events => "nothing happened yet",
    }
    .to_owned()
}
