//! Test helpers: render a frame into a `TestBackend` and write it out with its styles, so
//! that snapshots show colours (dark and high-contrast differ) and not only text.

pub mod fake_api;

use std::collections::BTreeMap;
use std::fmt::Write;

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::style::{Color, Modifier};

use den_protocol::session::Stamped;
use den_protocol::time::Millis;

use crate::app::App;
use crate::model::Model;
use crate::theme::Theme;

/// A model with `events` applied and settled.
pub fn model_of(events: &[Stamped]) -> Model {
    let mut model = Model::default();
    model.apply_all(events);
    model
}

/// Draw one frame and return the buffer.
pub fn draw(
    app: &mut App,
    model: &Model,
    theme: &Theme,
    now: Millis,
    width: u16,
    height: u16,
) -> Buffer {
    app.prepare(model);
    let mut terminal = match Terminal::new(TestBackend::new(width, height)) {
        Ok(t) => t,
        Err(e) => panic!("test terminal: {e}"),
    };
    if let Err(e) = terminal.draw(|f| crate::ui::draw(f, app, model, theme, now)) {
        panic!("draw: {e}");
    }
    terminal.backend().buffer().clone()
}

/// The text of a buffer, one line per row, trailing spaces trimmed.
pub fn text(buf: &Buffer) -> String {
    let mut out = String::new();
    for y in 0..buf.area.height {
        let mut line = String::new();
        for x in 0..buf.area.width {
            if let Some(cell) = buf.cell((x, y)) {
                line.push_str(cell.symbol());
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Text, then a legend of the styles used and each row as runs of style letters.
pub fn styled(buf: &Buffer) -> String {
    let mut out = text(buf);
    let mut legend: BTreeMap<String, char> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut rows = String::new();
    for y in 0..buf.area.height {
        let mut runs: Vec<(char, usize)> = Vec::new();
        for x in 0..buf.area.width {
            let Some(cell) = buf.cell((x, y)) else {
                continue;
            };
            let key = style_name(cell.fg, cell.bg, cell.modifier);
            let next = letter(order.len());
            let l = *legend.entry(key.clone()).or_insert_with(|| {
                order.push(key);
                next
            });
            match runs.last_mut() {
                Some((c, n)) if *c == l => *n += 1,
                _ => runs.push((l, 1)),
            }
        }
        let _ = write!(rows, "{y:>3}");
        for (c, n) in runs {
            let _ = write!(rows, " {c}{n}");
        }
        rows.push('\n');
    }
    out.push_str("--- styles ---\n");
    for key in &order {
        if let Some(l) = legend.get(key) {
            let _ = writeln!(out, "{l} {key}");
        }
    }
    out.push_str(&rows);
    out
}

fn letter(i: usize) -> char {
    const LETTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    LETTERS.get(i).map_or('~', |b| char::from(*b))
}

fn colour(c: Color) -> String {
    match c {
        Color::Rgb(r, g, b) => format!("#{r:02x}{g:02x}{b:02x}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn style_name(fg: Color, bg: Color, m: Modifier) -> String {
    let mut s = format!("fg={} bg={}", colour(fg), colour(bg));
    if !m.is_empty() {
        let _ = write!(s, " {m:?}");
    }
    s
}
