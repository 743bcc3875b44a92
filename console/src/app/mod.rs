//! The interactive state of the console and its pure update function.
//!
//! Keys become [`Action`]s ([`action_for`]); [`App::update`] applies an action with the
//! current model and returns [`Effect`]s for the runtime (quit, execute a confirmed
//! command, log a note, switch theme). No I/O and no clock: the same actions on the same
//! model give the same state, which the key-handling tests rely on.

pub mod action;
pub mod intent;
pub mod keymap;
pub mod palette;
pub mod panel;
pub mod table;

use den_protocol::session::CommandSeq;

use crate::dispatch_panel;
use crate::model::{Level, Model};
use crate::ui::columns::{PanelSpec, next_sortable, sort_of};

pub use action::Action;
pub use keymap::{action_for, replay_action_for};
pub use palette::{Command, PaletteState};
pub use panel::Panel;
pub use table::TableState;

/// Palette lines kept for history.
const HISTORY_CAP: usize = 200;

/// What the console is doing with the keyboard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Typing the focused panel's `/` filter.
    Filter,
    Palette(PaletteState),
    /// A mutating command waits for `y`.
    Confirm(Command),
    Help,
    /// The full record of one row (`key` as in [`table::TableRow::key`]).
    Detail {
        panel: Panel,
        key: String,
        scroll: u16,
    },
}

/// What the runtime must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    Quit,
    /// Run a confirmed command; its `Command` session event carries `id`.
    Execute {
        id: CommandSeq,
        command: Command,
    },
    /// Put a line into the Events panel (and the recording).
    Note(String),
    /// Load and apply a theme.
    Theme(String),
}

/// A one-line message in the footer until the next key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flash {
    pub level: Level,
    pub text: String,
    /// The command this flash announced: replaced by its outcome when that arrives, so
    /// a placement the previews refuse does not keep saying "sent".
    pub command: Option<CommandSeq>,
}

#[derive(Debug, Clone)]
pub struct App {
    pub focus: Panel,
    pub tables: [TableState; 6],
    pub mode: Mode,
    pub read_only: bool,
    /// Where the session is recorded, if it is.
    pub recording: Option<String>,
    /// Set when the panels show a recording (`den replay`): commands are refused and the
    /// header says so.
    pub replay: Option<String>,
    /// Palette history, oldest first.
    pub history: Vec<String>,
    pub flash: Option<Flash>,
    pub running: bool,
    next_command: u64,
}

impl Default for App {
    fn default() -> Self {
        App::new(false, None)
    }
}

fn initial_table<S: PanelSpec>() -> TableState {
    let (sort, descending) = S::DEFAULT_SORT;
    TableState::with_sort(sort, descending)
}

impl App {
    pub fn new(read_only: bool, recording: Option<String>) -> App {
        App {
            focus: Panel::Nodes,
            tables: Panel::ALL.map(|p| dispatch_panel!(p, initial_table())),
            mode: Mode::Normal,
            read_only,
            recording,
            replay: None,
            history: Vec::new(),
            flash: None,
            running: true,
            next_command: 0,
        }
    }

    /// A default app looking at `panel`.
    pub fn focused(panel: Panel) -> App {
        App {
            focus: panel,
            ..App::default()
        }
    }

    pub fn table(&self, panel: Panel) -> &TableState {
        // `Panel::index` is always < 6, the length of `tables`.
        &self.tables[panel.index()]
    }

    fn table_mut(&mut self, panel: Panel) -> &mut TableState {
        // `Panel::index` is always < 6, the length of `tables`.
        &mut self.tables[panel.index()]
    }

    /// Bring the focused panel's row order up to date (call before drawing).
    pub fn prepare(&mut self, model: &Model) {
        let panel = self.focus;
        dispatch_panel!(panel, rebuild(self.table_mut(panel), model));
        self.settle_flash(model);
    }

    /// A flash that announced a command shows how it ended once it has.
    fn settle_flash(&mut self, model: &Model) {
        let Some(flash) = &mut self.flash else {
            return;
        };
        let Some(id) = flash.command else {
            return;
        };
        let Some(track) = model.commands().get(&id) else {
            return;
        };
        let Some((status, detail)) = &track.outcome else {
            return;
        };
        flash.level = match status {
            den_protocol::session::CommandStatus::Ok => Level::Good,
            den_protocol::session::CommandStatus::Failed => Level::Bad,
            den_protocol::session::CommandStatus::Uncertain => Level::Unknown,
        };
        flash.text = den_protocol::text::one_line(&format!(
            "{} ({id}) {status}: {detail}",
            track.text,
            status = status.as_str()
        ));
        flash.command = None;
    }

    /// Apply one action.
    pub fn update(&mut self, action: Action, model: &Model) -> Vec<Effect> {
        self.flash = None;
        // In text input `q` is a letter; only ctrl-c arrives there as Quit.
        if action == Action::Quit {
            self.running = false;
            return vec![Effect::Quit];
        }
        match std::mem::replace(&mut self.mode, Mode::Normal) {
            Mode::Normal => self.normal(action, model),
            Mode::Filter => self.filter(action),
            Mode::Palette(state) => self.palette(state, action, model),
            Mode::Confirm(command) => self.confirm(command, action),
            Mode::Help => {
                if action != Action::Back {
                    self.mode = Mode::Help;
                }
                Vec::new()
            }
            Mode::Detail { panel, key, scroll } => {
                let scroll = match action {
                    Action::Back => return Vec::new(),
                    Action::Down => scroll.saturating_add(1),
                    Action::Up => scroll.saturating_sub(1),
                    Action::PageDown => scroll.saturating_add(10),
                    Action::PageUp => scroll.saturating_sub(10),
                    Action::Top => 0,
                    _ => scroll,
                };
                self.mode = Mode::Detail { panel, key, scroll };
                Vec::new()
            }
        }
    }

    fn normal(&mut self, action: Action, model: &Model) -> Vec<Effect> {
        let panel = self.focus;
        match action {
            Action::NextPanel => self.focus = panel.next(),
            Action::PrevPanel => self.focus = panel.prev(),
            Action::Focus(p) => self.focus = p,
            Action::Up => self.move_selection(model, -1),
            Action::Down => self.move_selection(model, 1),
            Action::PageUp => {
                let page = self.table(panel).page();
                self.move_selection(model, -page);
            }
            Action::PageDown => {
                let page = self.table(panel).page();
                self.move_selection(model, page);
            }
            Action::Top => self.move_selection(model, isize::MIN / 2),
            Action::Bottom => self.move_selection(model, isize::MAX / 2),
            Action::Enter => {
                self.prepare(model);
                if let Some(key) = dispatch_panel!(panel, selected_key(self.table(panel), model)) {
                    self.mode = Mode::Detail {
                        panel,
                        key,
                        scroll: 0,
                    };
                }
            }
            Action::Back => self.table_mut(panel).filter.clear(),
            Action::SortNext => {
                let table = self.table_mut(panel);
                table.sort = dispatch_panel!(panel, next_sortable(table.sort));
                table.descending = false;
            }
            Action::SortReverse => {
                let table = self.table_mut(panel);
                table.descending = !table.descending;
            }
            Action::StartFilter => self.mode = Mode::Filter,
            Action::StartPalette => {
                let mut state = PaletteState::default();
                state.edit(&model.known_ids(), |_| {});
                self.mode = Mode::Palette(state);
            }
            Action::Help => self.mode = Mode::Help,
            Action::RowCommand => return self.row_command(model),
            _ => {}
        }
        Vec::new()
    }

    fn move_selection(&mut self, model: &Model, delta: isize) {
        let panel = self.focus;
        self.prepare(model);
        dispatch_panel!(panel, move_in(self.table_mut(panel), model, delta));
    }

    fn filter(&mut self, action: Action) -> Vec<Effect> {
        let panel = self.focus;
        match action {
            Action::Input(c) => self.table_mut(panel).filter.push(c),
            Action::Backspace => {
                self.table_mut(panel).filter.pop();
            }
            Action::ClearInput => self.table_mut(panel).filter.clear(),
            Action::Submit => return Vec::new(),
            Action::Back => {
                self.table_mut(panel).filter.clear();
                return Vec::new();
            }
            _ => {}
        }
        self.mode = Mode::Filter;
        Vec::new()
    }

    fn palette(&mut self, mut state: PaletteState, action: Action, model: &Model) -> Vec<Effect> {
        let ids = model.known_ids();
        match action {
            Action::Back => return Vec::new(),
            Action::Input(c) => state.edit(&ids, |s| s.push(c)),
            Action::Backspace => state.edit(&ids, |s| {
                s.pop();
            }),
            Action::ClearInput => state.edit(&ids, String::clear),
            Action::Complete => state.complete(&ids, false),
            Action::CompleteBack => state.complete(&ids, true),
            Action::HistoryOlder => state.browse(&self.history, true, &ids),
            Action::HistoryNewer => state.browse(&self.history, false, &ids),
            Action::Submit => match palette::parse(&state.input) {
                Ok(command) => {
                    palette::remember(&mut self.history, &state.input, HISTORY_CAP);
                    return self.request(command);
                }
                Err(e) => {
                    self.flash = Some(Flash {
                        level: Level::Bad,
                        text: e.to_string(),
                        command: None,
                    });
                }
            },
            _ => {}
        }
        self.mode = Mode::Palette(state);
        Vec::new()
    }

    /// A command from the palette or a row key: mutating ones are refused in read-only
    /// mode and otherwise confirmed first.
    pub fn request(&mut self, command: Command) -> Vec<Effect> {
        match command {
            Command::Focus(p) => self.focus = p,
            Command::Help => self.mode = Mode::Help,
            Command::Quit => {
                self.running = false;
                return vec![Effect::Quit];
            }
            Command::Theme(name) => return vec![Effect::Theme(name)],
            command if self.replay.is_some() => {
                self.flash = Some(Flash {
                    level: Level::Warn,
                    text: format!("replay: `{command}` refused: commands are disabled in a replay"),
                    command: None,
                });
            }
            command if self.read_only => {
                let text = format!(
                    "read-only mode: `{command}` refused (den was started with --read-only)"
                );
                self.flash = Some(Flash {
                    level: Level::Bad,
                    text: text.clone(),
                    command: None,
                });
                return vec![Effect::Note(text)];
            }
            command => self.mode = Mode::Confirm(command),
        }
        Vec::new()
    }

    fn confirm(&mut self, command: Command, action: Action) -> Vec<Effect> {
        match action {
            Action::Confirm => {
                self.next_command += 1;
                let id = CommandSeq(self.next_command);
                self.flash = Some(Flash {
                    level: Level::Info,
                    text: format!("{command} ({id}) sent; progress in Events (6)"),
                    command: Some(id),
                });
                vec![Effect::Execute { id, command }]
            }
            _ => {
                self.flash = Some(Flash {
                    level: Level::Info,
                    text: format!("not sent: {command}"),
                    command: None,
                });
                Vec::new()
            }
        }
    }

    /// `d`/`c` on a row: delete the instance, cancel the request, drain the worker.
    fn row_command(&mut self, model: &Model) -> Vec<Effect> {
        self.prepare(model);
        let table = self.table(self.focus);
        let command = match self.focus {
            Panel::Instances => {
                let rows = &model.views().instances;
                match table.selected_row(rows) {
                    Some(r) if is_removed(rows, r.instance()) => {
                        Err("that instance is already gone from /state: nothing to delete")
                    }
                    Some(r) => Ok(Command::Delete {
                        instance: r.instance().to_owned(),
                    }),
                    None => Err("no instance selected"),
                }
            }
            Panel::Routes => match table.selected_row(model.routes()) {
                Some(r) if r.phase.is_live() => Ok(Command::Cancel {
                    request: r.request.to_string(),
                }),
                Some(_) => Err("that request already finished"),
                None => Err("no request selected"),
            },
            Panel::Pages => table
                .selected_row(&model.views().pages)
                .map(|r| Command::Drain {
                    worker: r.worker.to_string(),
                })
                .ok_or("no worker selected"),
            Panel::Nodes => match table.selected_row(&model.views().nodes) {
                Some(r) => match r.workers.as_slice() {
                    [worker] => Ok(Command::Drain {
                        worker: worker.to_string(),
                    }),
                    [] => Err("no den worker runs on that node"),
                    _ => Err("several workers on that node: drain one from Pages (4)"),
                },
                None => Err("no node selected"),
            },
            Panel::Downloads | Panel::Events => {
                Err("no row command in this panel; : opens the palette")
            }
        };
        match command {
            Ok(command) => self.request(command),
            Err(why) => {
                self.flash = Some(Flash {
                    level: Level::Warn,
                    text: why.to_owned(),
                    command: None,
                });
                Vec::new()
            }
        }
    }
}

fn rebuild<S: PanelSpec>(table: &mut TableState, model: &Model) {
    table.rebuild(S::rows(model), sort_of::<S>(table.sort), S::version(model));
}

fn move_in<S: PanelSpec>(table: &mut TableState, model: &Model, delta: isize) {
    let rows = S::rows(model);
    match delta {
        d if d <= isize::MIN / 4 => table.select_first(rows),
        d if d >= isize::MAX / 4 => table.select_last(rows),
        d => table.move_by(rows, d),
    }
}

fn selected_key<S: PanelSpec>(table: &TableState, model: &Model) -> Option<String> {
    use table::TableRow;
    table
        .selected_row(S::rows(model))
        .map(|r| r.key().into_owned())
}

#[cfg(test)]
mod tests;

/// The instance's row says it left every fresh `/state`.
fn is_removed(rows: &[crate::model::InstanceRow], instance: &str) -> bool {
    rows.iter().any(|r| {
        matches!(r, crate::model::InstanceRow::Instance { instance: i, removed: Some(_), .. } if i == instance)
    })
}
