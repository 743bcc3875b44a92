//! The one key table: for each mode, the keys, the [`Action`] they mean, and how they are
//! described. The console's bindings ([`action_for`]), its footer, its help overlay, the
//! replay's keys ([`replay_action_for`]) and the README's key tables all come from
//! [`BINDINGS`], so a key cannot mean one thing in the code and another on the screen.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::Mode;
use super::action::Action;
use super::panel::Panel;

/// One key as the table names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// A character without ctrl (`' '` is the space bar).
    Char(char),
    /// A character with ctrl.
    Ctrl(char),
    Tab,
    BackTab,
    Enter,
    Esc,
    Backspace,
    Up,
    Down,
    Left,
    Right,
    PageUp,
    PageDown,
    Home,
    End,
    /// Any character without ctrl: typed text.
    AnyChar,
    /// Any key the mode binds no other way.
    AnyOther,
}

impl Key {
    fn matches(self, code: KeyCode, ctrl: bool) -> bool {
        match (self, code) {
            (Key::Char(a), KeyCode::Char(b)) => !ctrl && a == b,
            (Key::Ctrl(a), KeyCode::Char(b)) => ctrl && a == b,
            (Key::AnyChar, KeyCode::Char(_)) => !ctrl,
            (Key::AnyOther, _) => true,
            (Key::Tab, KeyCode::Tab)
            | (Key::BackTab, KeyCode::BackTab)
            | (Key::Enter, KeyCode::Enter)
            | (Key::Esc, KeyCode::Esc)
            | (Key::Backspace, KeyCode::Backspace)
            | (Key::Up, KeyCode::Up)
            | (Key::Down, KeyCode::Down)
            | (Key::Left, KeyCode::Left)
            | (Key::Right, KeyCode::Right)
            | (Key::PageUp, KeyCode::PageUp)
            | (Key::PageDown, KeyCode::PageDown)
            | (Key::Home, KeyCode::Home)
            | (Key::End, KeyCode::End) => true,
            _ => false,
        }
    }
}

/// Which keyboard mode a binding belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMode {
    /// Browsing the panels.
    Normal,
    /// The replay's own keys, looked up before [`KeyMode::Normal`] in `den replay`.
    Replay,
    /// Typing a line: the `/` filter, and the replay's go-to and find prompts.
    Line,
    /// Typing in the `:` palette (line keys plus completion and history).
    Palette,
    /// A command waits for `y`.
    Confirm,
    /// The help or detail overlay.
    Overlay,
}

impl KeyMode {
    pub const ALL: [KeyMode; 6] = [
        KeyMode::Normal,
        KeyMode::Replay,
        KeyMode::Line,
        KeyMode::Palette,
        KeyMode::Confirm,
        KeyMode::Overlay,
    ];

    /// The table mode of the console's `mode`.
    pub fn of(mode: &Mode) -> KeyMode {
        match mode {
            Mode::Normal => KeyMode::Normal,
            Mode::Filter => KeyMode::Line,
            Mode::Palette(_) => KeyMode::Palette,
            Mode::Confirm(_) => KeyMode::Confirm,
            Mode::Help | Mode::Detail { .. } => KeyMode::Overlay,
        }
    }

    /// The README's heading for the mode.
    pub fn title(self) -> &'static str {
        match self {
            KeyMode::Normal => "panels",
            KeyMode::Replay => "replay (before the panel keys)",
            KeyMode::Line => "filter and prompts",
            KeyMode::Palette => "palette",
            KeyMode::Confirm => "confirmation",
            KeyMode::Overlay => "help and detail",
        }
    }
}

/// What a binding does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Does {
    Act(Action),
    /// The typed character becomes [`Action::Input`].
    Type,
}

/// Where a binding is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Panels {
    All,
    Only(&'static [Panel]),
}

impl Panels {
    fn contains(self, panel: Panel) -> bool {
        match self {
            Panels::All => true,
            Panels::Only(list) => list.contains(&panel),
        }
    }
}

/// One row of the key table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    pub mode: KeyMode,
    pub keys: &'static [Key],
    pub does: Does,
    /// How the keys are written in the footer, the help overlay and the README.
    pub label: &'static str,
    /// What it does, in a word or two.
    pub hint: &'static str,
    /// Shown in the footer (otherwise in the help overlay and the README only).
    pub footer: bool,
    pub panels: Panels,
    /// Changes the cluster: not offered in `--read-only`.
    pub mutates: bool,
    /// How the help overlay lists it.
    pub help: Help,
}

/// How the help overlay lists a binding (it has room for about fifteen keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Help {
    /// With its own label and hint.
    Same,
    /// Under another label and hint, for a pair or run of keys (`g/G top/bottom`).
    As(&'static str, &'static str),
    /// Covered by a neighbour's `As` entry.
    Hidden,
}

const fn b(
    mode: KeyMode,
    keys: &'static [Key],
    action: Action,
    label: &'static str,
    hint: &'static str,
    footer: bool,
) -> Binding {
    Binding {
        mode,
        keys,
        does: Does::Act(action),
        label,
        hint,
        footer,
        panels: Panels::All,
        mutates: false,
        help: Help::Same,
    }
}

const fn paired(binding: Binding, help: Help) -> Binding {
    Binding { help, ..binding }
}

const fn row_command(panels: &'static [Panel], label: &'static str, hint: &'static str) -> Binding {
    Binding {
        mode: KeyMode::Normal,
        keys: &[Key::Char('d'), Key::Char('c'), Key::Ctrl('d')],
        does: Does::Act(Action::RowCommand),
        label,
        hint,
        footer: true,
        panels: Panels::Only(panels),
        mutates: true,
        help: Help::Same,
    }
}

use Key::{Ctrl, Down, Up};
use KeyMode::{Confirm, Line, Normal, Overlay, Palette, Replay};

/// Every key den's console and replay know, in the order the footer and help show them.
/// Ctrl-C quits from every mode before this table is read.
#[rustfmt::skip] // one row per binding reads as a table
pub static BINDINGS: &[Binding] = &[
    // --- panels ---
    b(Normal, &[Key::Tab, Key::Char('l'), Key::Right], Action::NextPanel, "tab", "panel", true),
    paired(b(Normal, &[Key::BackTab, Key::Char('h'), Key::Left], Action::PrevPanel, "shift-tab", "previous panel", false), Help::Hidden),
    paired(b(Normal, &[Key::Char('1')], Action::Focus(Panel::Nodes), "1", "Nodes", false), Help::As("1-6", "jump to panel")),
    paired(b(Normal, &[Key::Char('2')], Action::Focus(Panel::Downloads), "2", "Downloads", false), Help::Hidden),
    paired(b(Normal, &[Key::Char('3')], Action::Focus(Panel::Instances), "3", "Instances", false), Help::Hidden),
    paired(b(Normal, &[Key::Char('4')], Action::Focus(Panel::Pages), "4", "Pages", false), Help::Hidden),
    paired(b(Normal, &[Key::Char('5')], Action::Focus(Panel::Routes), "5", "Routes", false), Help::Hidden),
    paired(b(Normal, &[Key::Char('6')], Action::Focus(Panel::Events), "6", "Events", false), Help::Hidden),
    b(Normal, &[Key::Char('j'), Down], Action::Down, "j/k", "move", true),
    paired(b(Normal, &[Key::Char('k'), Up], Action::Up, "k", "up", false), Help::Hidden),
    paired(b(Normal, &[Key::PageDown, Ctrl('f')], Action::PageDown, "pgdn", "page down", false), Help::As("pgup/pgdn", "page")),
    paired(b(Normal, &[Key::PageUp, Ctrl('b')], Action::PageUp, "pgup", "page up", false), Help::Hidden),
    paired(b(Normal, &[Key::Char('g'), Key::Home], Action::Top, "g", "top", false), Help::As("g/G", "top/bottom")),
    paired(b(Normal, &[Key::Char('G'), Key::End], Action::Bottom, "G", "bottom", false), Help::Hidden),
    b(Normal, &[Key::Char('/')], Action::StartFilter, "/", "filter", true),
    b(Normal, &[Key::Char('s')], Action::SortNext, "s", "sort", true),
    b(Normal, &[Key::Char('S')], Action::SortReverse, "S", "reverse sort", false),
    Binding {
        panels: Panels::Only(&[Panel::Nodes, Panel::Downloads, Panel::Instances, Panel::Pages, Panel::Routes]),
        ..b(Normal, &[Key::Enter], Action::Enter, "⏎", "detail", true)
    },
    // Events rows have a detail view too; the footer has no room to say so.
    Binding {
        panels: Panels::Only(&[Panel::Events]),
        help: Help::Hidden,
        ..b(Normal, &[Key::Enter], Action::Enter, "⏎", "detail", false)
    },
    b(Normal, &[Key::Esc], Action::Back, "esc", "clear filter", false),
    row_command(&[Panel::Instances], "d", "delete"),
    row_command(&[Panel::Routes], "c", "cancel"),
    row_command(&[Panel::Pages, Panel::Nodes], "d", "drain"),
    // In the other panels the key says that there is none (and points at the palette).
    Binding {
        footer: false,
        mutates: false,
        help: Help::Hidden,
        ..row_command(&[Panel::Downloads, Panel::Events], "d", "says there is none")
    },
    b(Normal, &[Key::Char(':')], Action::StartPalette, ":", "cmd", true),
    b(Normal, &[Key::Char('?')], Action::Help, "?", "help", true),
    b(Normal, &[Key::Char('q')], Action::Quit, "q", "quit", true),
    // --- replay ---
    b(Replay, &[Key::Char(' ')], Action::PlayPause, "space", "pause/resume", true),
    b(Replay, &[Key::Right], Action::StepForward, "→", "next event", true),
    b(Replay, &[Key::Left], Action::StepBack, "←", "previous event", false),
    b(Replay, &[Key::Char(']')], Action::JumpForward, "]", "+10 s", true),
    b(Replay, &[Key::Char('[')], Action::JumpBack, "[", "-10 s", false),
    b(Replay, &[Key::Char('t')], Action::GoToTime, "t", "go to time", true),
    b(Replay, &[Key::Char('f')], Action::Find, "f", "find", true),
    b(Replay, &[Key::Char('n')], Action::NextMatch, "n", "next match", true),
    b(Replay, &[Key::Char('N')], Action::PrevMatch, "N", "previous match", false),
    b(Replay, &[Key::Char('+'), Key::Char('='), Key::Char('>')], Action::Faster, "+", "faster", true),
    b(Replay, &[Key::Char('-'), Key::Char('<')], Action::Slower, "-", "slower", false),
    // --- typing a line ---
    b(Line, &[Key::Enter], Action::Submit, "⏎", "keep", true),
    b(Line, &[Key::Esc], Action::Back, "esc", "clear", true),
    b(Line, &[Key::Backspace], Action::Backspace, "backspace", "delete a character", false),
    b(Line, &[Ctrl('u')], Action::ClearInput, "ctrl-u", "clear the line", false),
    Binding { does: Does::Type, ..b(Line, &[Key::AnyChar], Action::Back, "text", "type", false) },
    // --- palette ---
    b(Palette, &[Key::Tab], Action::Complete, "tab", "complete", true),
    b(Palette, &[Key::BackTab], Action::CompleteBack, "shift-tab", "complete backwards", false),
    b(Palette, &[Up, Ctrl('p')], Action::HistoryOlder, "↑↓", "history", true),
    b(Palette, &[Down, Ctrl('n')], Action::HistoryNewer, "↓", "newer", false),
    b(Palette, &[Key::Enter], Action::Submit, "⏎", "run", true),
    b(Palette, &[Key::Esc], Action::Back, "esc", "close", true),
    b(Palette, &[Key::Backspace], Action::Backspace, "backspace", "delete a character", false),
    b(Palette, &[Ctrl('u')], Action::ClearInput, "ctrl-u", "clear the line", false),
    Binding { does: Does::Type, ..b(Palette, &[Key::AnyChar], Action::Back, "text", "type", false) },
    // --- confirmation: only a deliberate y confirms; enter is "any other key" ---
    b(Confirm, &[Key::Char('y'), Key::Char('Y')], Action::Confirm, "y", "confirm", true),
    b(Confirm, &[Key::AnyOther], Action::Deny, "any other key", "cancel", true),
    // --- help and detail overlays ---
    b(Overlay, &[Key::Char('j'), Down], Action::Down, "j/k", "scroll", true),
    b(Overlay, &[Key::Char('k'), Up], Action::Up, "k", "scroll up", false),
    b(Overlay, &[Key::PageDown, Key::Char(' ')], Action::PageDown, "pgdn", "page down", false),
    b(Overlay, &[Key::PageUp], Action::PageUp, "pgup", "page up", false),
    b(Overlay, &[Key::Char('g'), Key::Home], Action::Top, "g", "top", false),
    b(Overlay, &[Key::Esc, Key::Char('q'), Key::Char('?'), Key::Enter], Action::Back, "esc", "back", true),
];

/// The binding of `key` in `mode` on `panel`, if any.
pub fn lookup(mode: KeyMode, panel: Panel, key: KeyEvent) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && key.code == KeyCode::Char('c') {
        return Some(Action::Quit);
    }
    // Named keys and characters first, so `AnyChar`/`AnyOther` are only fallbacks.
    let of_mode = || {
        BINDINGS
            .iter()
            .filter(move |b| b.mode == mode && b.panels.contains(panel))
    };
    let exact = of_mode().find(|b| {
        b.keys
            .iter()
            .any(|k| !matches!(k, Key::AnyChar | Key::AnyOther) && k.matches(key.code, ctrl))
    });
    let binding =
        exact.or_else(|| of_mode().find(|b| b.keys.iter().any(|k| k.matches(key.code, ctrl))))?;
    match binding.does {
        Does::Act(action) => Some(action),
        Does::Type => match key.code {
            KeyCode::Char(c) => Some(Action::Input(c)),
            _ => None,
        },
    }
}

/// The action of a key in the console's `mode` with `panel` focused.
pub fn action_for(key: KeyEvent, mode: &Mode, panel: Panel) -> Option<Action> {
    lookup(KeyMode::of(mode), panel, key)
}

/// The action of a key in `den replay`: the replay's own keys in normal mode, then the
/// console's.
pub fn replay_action_for(key: KeyEvent, mode: &Mode, panel: Panel) -> Option<Action> {
    if *mode == Mode::Normal
        && let Some(action) = lookup(KeyMode::Replay, panel, key)
    {
        return Some(action);
    }
    action_for(key, mode, panel)
}

/// The footer's key hints for `mode` on `panel` (the help overlay shows the rest).
pub fn footer_keys(
    panel: Panel,
    mode: KeyMode,
    read_only: bool,
) -> Vec<(&'static str, &'static str)> {
    offered(panel, mode, read_only)
        .filter(|b| b.footer)
        .map(|b| (b.label, b.hint))
        .collect()
}

/// Every key of `mode` on `panel`, footer keys first (the help overlay).
pub fn help_keys(
    panel: Panel,
    mode: KeyMode,
    read_only: bool,
) -> Vec<(&'static str, &'static str)> {
    let mut keys = footer_keys(panel, mode, read_only);
    keys.extend(
        offered(panel, mode, read_only)
            .filter(|b| !b.footer)
            .filter_map(|b| match b.help {
                Help::Same => Some((b.label, b.hint)),
                Help::As(label, hint) => Some((label, hint)),
                Help::Hidden => None,
            }),
    );
    keys
}

fn offered(panel: Panel, mode: KeyMode, read_only: bool) -> impl Iterator<Item = &'static Binding> {
    BINDINGS
        .iter()
        .filter(move |b| b.mode == mode && b.panels.contains(panel) && !(read_only && b.mutates))
}

/// How a key is written in the README.
fn key_name(key: Key) -> String {
    match key {
        Key::Char(' ') => "Space".to_owned(),
        Key::Char(c) => c.to_string(),
        Key::Ctrl(c) => format!("Ctrl-{}", c.to_ascii_uppercase()),
        Key::Tab => "Tab".to_owned(),
        Key::BackTab => "Shift-Tab".to_owned(),
        Key::Enter => "Enter".to_owned(),
        Key::Esc => "Esc".to_owned(),
        Key::Backspace => "Backspace".to_owned(),
        Key::Up => "↑".to_owned(),
        Key::Down => "↓".to_owned(),
        Key::Left => "←".to_owned(),
        Key::Right => "→".to_owned(),
        Key::PageUp => "PgUp".to_owned(),
        Key::PageDown => "PgDn".to_owned(),
        Key::Home => "Home".to_owned(),
        Key::End => "End".to_owned(),
        Key::AnyChar => "any character".to_owned(),
        Key::AnyOther => "any other key".to_owned(),
    }
}

/// The README's key tables, one per mode (the README embeds this text; a test keeps
/// them equal).
pub fn markdown() -> String {
    let mut out = String::new();
    for mode in KeyMode::ALL {
        out.push_str(&format!(
            "\n**{}**\n\n| keys | does |\n|---|---|\n",
            mode.title()
        ));
        for b in BINDINGS.iter().filter(|b| b.mode == mode) {
            let keys: Vec<String> = b
                .keys
                .iter()
                .map(|k| format!("`{}`", key_name(*k)))
                .collect();
            let mut does = b.hint.to_owned();
            if let Panels::Only(panels) = b.panels {
                let names: Vec<&str> = panels.iter().map(|p| p.title()).collect();
                does.push_str(&format!(" ({})", names.join(", ")));
            }
            if b.mutates {
                does.push_str("; asks first, refused with --read-only");
            }
            out.push_str(&format!("| {} | {} |\n", keys.join(" "), does));
        }
    }
    out.push_str("\n`Ctrl-C` quits from every mode.\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(code: KeyCode, modifiers: KeyModifiers) -> KeyEvent {
        KeyEvent::new(code, modifiers)
    }

    /// Every concrete key of a mode means one thing per panel: the table has no shadowed
    /// rows.
    #[test]
    fn no_key_is_bound_twice_in_one_mode() {
        for mode in KeyMode::ALL {
            for panel in Panel::ALL {
                let mut seen: Vec<Key> = Vec::new();
                for b in BINDINGS
                    .iter()
                    .filter(|b| b.mode == mode && b.panels.contains(panel))
                {
                    for k in b.keys {
                        assert!(
                            !seen.contains(k),
                            "{k:?} is bound twice in {mode:?} on {panel:?}"
                        );
                        seen.push(*k);
                    }
                }
            }
        }
    }

    /// The replay's keys take no key the panels use, except the arrows (h/l still switch
    /// panels in a replay).
    #[test]
    fn replay_keys_shadow_only_the_arrows() {
        for b in BINDINGS.iter().filter(|b| b.mode == KeyMode::Replay) {
            for k in b.keys {
                let shadowed = BINDINGS
                    .iter()
                    .any(|n| n.mode == KeyMode::Normal && n.keys.contains(k));
                assert!(
                    !shadowed || matches!(k, Key::Left | Key::Right),
                    "replay key {k:?} hides a panel key"
                );
            }
        }
        let g = ev(KeyCode::Char('g'), KeyModifiers::NONE);
        assert_eq!(
            replay_action_for(g, &Mode::Normal, Panel::Nodes),
            Some(Action::Top)
        );
        let t = ev(KeyCode::Char('t'), KeyModifiers::NONE);
        assert_eq!(
            replay_action_for(t, &Mode::Normal, Panel::Nodes),
            Some(Action::GoToTime)
        );
        assert_eq!(action_for(t, &Mode::Normal, Panel::Nodes), None);
    }

    #[test]
    fn typed_text_falls_back_after_named_keys() {
        let q = ev(KeyCode::Char('q'), KeyModifiers::NONE);
        assert_eq!(
            action_for(q, &Mode::Filter, Panel::Nodes),
            Some(Action::Input('q'))
        );
        let u = ev(KeyCode::Char('u'), KeyModifiers::CONTROL);
        assert_eq!(
            action_for(u, &Mode::Filter, Panel::Nodes),
            Some(Action::ClearInput)
        );
        let x = ev(KeyCode::Char('x'), KeyModifiers::CONTROL);
        assert_eq!(action_for(x, &Mode::Filter, Panel::Nodes), None);
    }

    #[test]
    fn row_commands_are_offered_where_they_apply_and_never_read_only() {
        let d = ev(KeyCode::Char('d'), KeyModifiers::NONE);
        assert_eq!(
            action_for(d, &Mode::Normal, Panel::Instances),
            Some(Action::RowCommand)
        );
        assert_eq!(
            action_for(d, &Mode::Normal, Panel::Events),
            Some(Action::RowCommand)
        );
        assert!(
            !footer_keys(Panel::Events, KeyMode::Normal, false)
                .iter()
                .any(|k| k.0 == "d")
        );
        assert!(footer_keys(Panel::Routes, KeyMode::Normal, false).contains(&("c", "cancel")));
        assert!(
            !footer_keys(Panel::Routes, KeyMode::Normal, true)
                .iter()
                .any(|k| k.0 == "c")
        );
    }

    /// The README's key tables are this table's rendering. `DEN_BLESS=1` rewrites them.
    #[test]
    fn the_readme_key_tables_are_the_key_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
        let readme = std::fs::read_to_string(path).unwrap();
        let begin = "<!-- keys: generated from console/src/app/keymap.rs -->";
        let end = "<!-- /keys -->";
        let (Some(a), Some(z)) = (readme.find(begin), readme.find(end)) else {
            panic!("README.md lacks the {begin} … {end} block");
        };
        let embedded = &readme[a + begin.len()..z];
        if std::env::var_os("DEN_BLESS").is_some() {
            let text = format!("{}{begin}\n{}{}", &readme[..a], markdown(), &readme[z..]);
            std::fs::write(path, text).unwrap();
            return;
        }
        assert_eq!(
            embedded.trim(),
            markdown().trim(),
            "README.md's key tables differ from keymap.rs: paste keymap::markdown() between the markers"
        );
    }
}
