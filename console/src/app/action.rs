//! Actions (what a key means, as data) and the key map per mode.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use serde::{Deserialize, Serialize};

use super::Mode;
use super::panel::Panel;

/// Everything the operator can do, independent of the key that does it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", content = "arg", rename_all = "kebab-case")]
pub enum Action {
    Quit,
    NextPanel,
    PrevPanel,
    Focus(Panel),
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
    /// Drill into the selected row.
    Enter,
    /// Close the overlay or clear the filter.
    Back,
    /// Sort by the next column.
    SortNext,
    /// Reverse the sort direction.
    SortReverse,
    StartFilter,
    StartPalette,
    Help,
    /// Delete the selected instance / cancel the selected request / drain the selected
    /// worker, depending on the panel (asks for confirmation).
    RowCommand,
    /// Typed text in the filter or the palette.
    Input(char),
    Backspace,
    /// Clear the input line (ctrl-u).
    ClearInput,
    Submit,
    Complete,
    CompleteBack,
    HistoryOlder,
    HistoryNewer,
    Confirm,
    Deny,
}

/// The action of a key in `mode`, if any. Ctrl-C quits from everywhere.
pub fn action_for(key: KeyEvent, mode: &Mode) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && key.code == KeyCode::Char('c') {
        return Some(Action::Quit);
    }
    match mode {
        Mode::Normal => normal(key, ctrl),
        Mode::Filter => line_input(key, ctrl, false),
        Mode::Palette(_) => line_input(key, ctrl, true),
        Mode::Confirm(_) => match key.code {
            KeyCode::Char('y') | KeyCode::Char('Y') => Some(Action::Confirm),
            // Anything else — including enter — declines: confirming takes a deliberate y.
            _ => Some(Action::Deny),
        },
        Mode::Help | Mode::Detail { .. } => match key.code {
            KeyCode::Esc | KeyCode::Char('q') | KeyCode::Char('?') | KeyCode::Enter => {
                Some(Action::Back)
            }
            KeyCode::Char('j') | KeyCode::Down => Some(Action::Down),
            KeyCode::Char('k') | KeyCode::Up => Some(Action::Up),
            KeyCode::PageDown | KeyCode::Char(' ') => Some(Action::PageDown),
            KeyCode::PageUp => Some(Action::PageUp),
            KeyCode::Char('g') | KeyCode::Home => Some(Action::Top),
            _ => None,
        },
    }
}

fn normal(key: KeyEvent, ctrl: bool) -> Option<Action> {
    Some(match key.code {
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Tab => Action::NextPanel,
        KeyCode::BackTab => Action::PrevPanel,
        KeyCode::Char(c @ '1'..='6') => {
            let i = usize::from(c as u8 - b'1');
            Action::Focus(*Panel::ALL.get(i)?)
        }
        KeyCode::Char('j') | KeyCode::Down => Action::Down,
        KeyCode::Char('k') | KeyCode::Up => Action::Up,
        KeyCode::Char('f') if ctrl => Action::PageDown,
        KeyCode::Char('b') if ctrl => Action::PageUp,
        KeyCode::Char('d') if ctrl => Action::RowCommand,
        KeyCode::PageDown => Action::PageDown,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::Char('g') | KeyCode::Home => Action::Top,
        KeyCode::Char('G') | KeyCode::End => Action::Bottom,
        KeyCode::Enter => Action::Enter,
        KeyCode::Esc => Action::Back,
        KeyCode::Char('s') => Action::SortNext,
        KeyCode::Char('S') => Action::SortReverse,
        KeyCode::Char('/') => Action::StartFilter,
        KeyCode::Char(':') => Action::StartPalette,
        KeyCode::Char('?') => Action::Help,
        KeyCode::Char('d') | KeyCode::Char('c') => Action::RowCommand,
        KeyCode::Char('h') | KeyCode::Left => Action::PrevPanel,
        KeyCode::Char('l') | KeyCode::Right => Action::NextPanel,
        _ => return None,
    })
}

fn line_input(key: KeyEvent, ctrl: bool, palette: bool) -> Option<Action> {
    Some(match key.code {
        KeyCode::Esc => Action::Back,
        KeyCode::Enter => Action::Submit,
        KeyCode::Backspace => Action::Backspace,
        KeyCode::Char('u') if ctrl => Action::ClearInput,
        KeyCode::Char('p') if ctrl && palette => Action::HistoryOlder,
        KeyCode::Char('n') if ctrl && palette => Action::HistoryNewer,
        KeyCode::Tab if palette => Action::Complete,
        KeyCode::BackTab if palette => Action::CompleteBack,
        KeyCode::Up if palette => Action::HistoryOlder,
        KeyCode::Down if palette => Action::HistoryNewer,
        KeyCode::Char(c) if !ctrl => Action::Input(c),
        _ => return None,
    })
}
