//! `den replay FILE`: the console's panels driven by a recording, with a timeline.
//!
//! The panels are the console's own ([`crate::ui::draw_in`]) over the replayer's model,
//! drawn as of the replay position; navigation keys work as in the console. Below them a
//! status line and a timeline bar (position, speed, paused, failure markers). Commands
//! are refused: a replay cannot change the cluster.
//!
//! Keys come from the key table (`app/keymap.rs`, mode `Replay`, then the console's):
//! space pause/resume · ←/→ step one event · [/] jump 10 s · t go to a time · +/- speed
//! (0.25× to 64×) · f find (failures, declines, or any text) · n/N next and previous
//! match · q quit. Tab, j/k, g/G, /, enter, ? behave as in the console.

use std::path::Path;
use std::process::ExitCode;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use crossterm::event::{Event, EventStream, KeyEvent};
use futures_util::StreamExt;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use den_protocol::recording::{Offset, parse_offset};
use den_protocol::time::Millis;

use super::scan::{self, Filter};
use super::{ReplayError, Replayer};
use crate::app::keymap::{self, KeyMode};
use crate::app::{Action, App, Effect, replay_action_for};
use crate::model::Level;
use crate::record::paths::utc_time;
use crate::theme::Theme;

/// Playback speeds.
pub const SPEEDS: [f64; 9] = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];
/// `[` and `]` jump this far.
const JUMP: u64 = 10_000;
const FRAME: Duration = Duration::from_millis(33);

/// A line of input the replay asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Goto(String),
    Find(String),
}

/// The replay's state: the replayer, the console's app state and the playback.
pub struct Replay {
    pub replayer: Replayer,
    pub app: App,
    pub theme: Theme,
    pub paused: bool,
    speed: usize,
    /// Fractional milliseconds of playback not yet applied.
    carry: f64,
    pub prompt: Option<Prompt>,
    pub filter: Option<Filter>,
    pub matches: Vec<(Millis, u64)>,
    /// Failure markers on the timeline (filled in by a background scan).
    pub markers: Vec<Millis>,
    pub message: Option<(Level, String)>,
}

impl Replay {
    pub fn new(replayer: Replayer, theme: Theme, label: String, speed: f64) -> Replay {
        let mut app = App::default();
        app.replay = Some(label);
        let speed = SPEEDS
            .iter()
            .position(|s| *s >= speed)
            .unwrap_or(SPEEDS.len() - 1);
        Replay {
            replayer,
            app,
            theme,
            paused: false,
            speed,
            carry: 0.0,
            prompt: None,
            filter: None,
            matches: Vec::new(),
            markers: Vec::new(),
            message: None,
        }
    }

    pub fn speed(&self) -> f64 {
        SPEEDS.get(self.speed).copied().unwrap_or(1.0)
    }

    pub fn running(&self) -> bool {
        self.app.running
    }

    /// Move playback on by `elapsed` real time (nothing while paused).
    pub fn advance(&mut self, elapsed: Duration) -> Result<(), ReplayError> {
        if self.paused || self.prompt.is_some() {
            return Ok(());
        }
        let ms = elapsed.as_secs_f64() * 1000.0 * self.speed() + self.carry;
        let whole = ms.floor();
        self.carry = ms - whole;
        let target = self.replayer.position().saturating_add(whole as u64);
        if target >= self.replayer.end() {
            self.seek(self.replayer.end())?;
            self.paused = true;
            self.message = Some((Level::Info, "end of the recording".to_owned()));
            return Ok(());
        }
        self.seek(target)
    }

    fn seek(&mut self, t: Millis) -> Result<(), ReplayError> {
        self.replayer.seek(t)?;
        self.after_move();
        Ok(())
    }

    /// The model may have been replaced: tables must not trust their cached order.
    fn after_move(&mut self) {
        for table in &mut self.app.tables {
            table.invalidate();
        }
    }

    /// Handle one key: the key table turns it into an [`Action`] (the replay's own keys
    /// first in normal mode, then the console's), and the action is applied.
    pub fn key(&mut self, key: KeyEvent) -> Result<(), ReplayError> {
        if let Some(prompt) = self.prompt.take() {
            return self.prompt_key(prompt, key);
        }
        let Some(action) = replay_action_for(key, &self.app.mode, self.app.focus) else {
            return Ok(());
        };
        if action == Action::Quit {
            self.app.running = false;
            return Ok(());
        }
        self.message = None;
        if self.replay_action(action)? {
            return Ok(());
        }
        let model = self.replayer.model().clone();
        for effect in self.app.update(action, &model) {
            match effect {
                Effect::Quit => {}
                Effect::Note(text) => self.message = Some((Level::Warn, text)),
                Effect::Theme(name) => match Theme::load(&name, Theme::user_dir().as_deref()) {
                    Ok(t) => self.theme = t,
                    Err(e) => self.message = Some((Level::Bad, e.to_string())),
                },
                Effect::Execute { command, .. } => {
                    self.message = Some((
                        Level::Warn,
                        format!("replay: `{command}` refused: commands are disabled in a replay"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Applies the replay's own actions; false when the action is the console's.
    fn replay_action(&mut self, action: Action) -> Result<bool, ReplayError> {
        match action {
            Action::PlayPause => {
                self.paused = !self.paused;
                self.carry = 0.0;
            }
            Action::StepForward => {
                self.paused = true;
                if !self.replayer.step_forward()? {
                    self.message = Some((Level::Info, "end of the recording".to_owned()));
                }
                self.after_move();
            }
            Action::StepBack => {
                self.paused = true;
                if !self.replayer.step_back()? {
                    self.message = Some((Level::Info, "start of the recording".to_owned()));
                }
                self.after_move();
            }
            Action::JumpBack => {
                let t = Millis(self.replayer.position().0.saturating_sub(JUMP));
                self.seek(t)?;
            }
            Action::JumpForward => {
                let t = self.replayer.position().saturating_add(JUMP);
                self.seek(t)?;
            }
            Action::GoToTime => self.prompt = Some(Prompt::Goto(String::new())),
            Action::Find => {
                let current = match &self.filter {
                    Some(Filter::Text(t)) => t.clone(),
                    Some(other) => other.label(),
                    None => String::new(),
                };
                self.prompt = Some(Prompt::Find(current));
            }
            Action::Faster => self.speed = (self.speed + 1).min(SPEEDS.len() - 1),
            Action::Slower => self.speed = self.speed.saturating_sub(1),
            Action::NextMatch => self.next_match(true)?,
            Action::PrevMatch => self.next_match(false)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A key while the go-to or find prompt is open: the table's line keys.
    fn prompt_key(&mut self, prompt: Prompt, key: KeyEvent) -> Result<(), ReplayError> {
        let (mut input, goto) = match prompt {
            Prompt::Goto(s) => (s, true),
            Prompt::Find(s) => (s, false),
        };
        match keymap::lookup(KeyMode::Line, self.app.focus, key) {
            Some(Action::Quit) => {
                self.app.running = false;
                return Ok(());
            }
            Some(Action::Back) => return Ok(()),
            Some(Action::Submit) => {
                if goto {
                    match parse_offset(&input) {
                        Ok(t) => self.seek(t)?,
                        Err(e) => self.message = Some((Level::Bad, e)),
                    }
                } else {
                    self.find(&input)?;
                }
                return Ok(());
            }
            Some(Action::Backspace) => {
                input.pop();
            }
            Some(Action::ClearInput) => input.clear(),
            Some(Action::Input(c)) => input.push(c),
            _ => {}
        }
        self.prompt = Some(if goto {
            Prompt::Goto(input)
        } else {
            Prompt::Find(input)
        });
        Ok(())
    }

    /// Set the filter, find its matches and go to the next one.
    pub fn find(&mut self, text: &str) -> Result<(), ReplayError> {
        if text.trim().is_empty() {
            self.filter = None;
            self.matches.clear();
            return Ok(());
        }
        let filter = Filter::parse(text);
        self.matches = scan::matches(self.replayer.recording(), &filter);
        self.filter = Some(filter);
        if self.matches.is_empty() {
            self.message = Some((Level::Warn, "no event matches".to_owned()));
            return Ok(());
        }
        self.next_match(true)
    }

    /// Go to the next (or previous) matching event.
    pub fn next_match(&mut self, forward: bool) -> Result<(), ReplayError> {
        let Some(filter) = &self.filter else {
            self.message = Some((
                Level::Info,
                "f sets what n/N find: failures, declines, or text (a request id, a worker…)"
                    .to_owned(),
            ));
            return Ok(());
        };
        let here = self.replayer.position();
        let found = if forward {
            self.matches.iter().find(|(at, _)| *at > here)
        } else {
            self.matches.iter().rev().find(|(at, _)| *at < here)
        };
        match found.copied() {
            Some((at, _)) => {
                self.paused = true;
                self.seek(at)?;
            }
            None => {
                let label = filter.label();
                let which = if forward { "after" } else { "before" };
                self.message = Some((Level::Info, format!("no {label} {which} this point")));
            }
        }
        Ok(())
    }

    /// Draw the panels and the timeline.
    pub fn draw(&mut self, frame: &mut Frame<'_>) {
        let area = frame.area();
        let [console, status, bar] = Layout::vertical([
            Constraint::Min(5),
            Constraint::Length(1),
            Constraint::Length(1),
        ])
        .areas(area);
        let now = self.replayer.position();
        let model = self.replayer.model();
        self.app.prepare(model);
        crate::ui::draw_in(frame, console, &self.app, model, &self.theme, now);
        self.draw_status(frame, status);
        self.draw_bar(frame, bar);
    }

    fn draw_status(&self, frame: &mut Frame<'_>, area: Rect) {
        let theme = &self.theme;
        let line = match &self.prompt {
            Some(Prompt::Goto(input)) => Line::from(vec![
                Span::styled(" go to: ", theme.key()),
                Span::styled(format!("{input}▏"), theme.base()),
                Span::styled(
                    "  90s · 1m30s · 1:30 · 1500ms   ⏎ go  esc cancel",
                    theme.dim(),
                ),
            ]),
            Some(Prompt::Find(input)) => Line::from(vec![
                Span::styled(" find: ", theme.key()),
                Span::styled(format!("{input}▏"), theme.base()),
                Span::styled(
                    "  failures · declines · any text (request id, worker, node)   ⏎ find  esc cancel",
                    theme.dim(),
                ),
            ]),
            None => self.status_line(),
        };
        frame.render_widget(Paragraph::new(line).style(theme.base()), area);
    }

    fn status_line(&self) -> Line<'static> {
        let theme = &self.theme;
        let r = &self.replayer;
        let state = if self.paused { "⏸" } else { "▶" };
        let speed = self.speed();
        let speed = if speed < 1.0 {
            format!("{speed}×")
        } else {
            format!("{speed:.0}×")
        };
        let header = r.recording().header();
        let wall = utc_time(header.started_at_unix_ms.saturating_add(r.position().0));
        let mut spans = vec![
            Span::styled(
                format!(" {state} {speed} "),
                theme.title().add_modifier(Modifier::REVERSED),
            ),
            Span::styled(
                format!(" {} / {} ", Offset(r.position()), Offset(r.end())),
                theme.base().add_modifier(Modifier::BOLD),
            ),
            Span::styled(format!("event {}  {wall} ", r.ordinal()), theme.dim()),
        ];
        if let Some(filter) = &self.filter {
            let here = r.position();
            let upto = self.matches.iter().filter(|(at, _)| *at <= here).count();
            spans.push(Span::styled(
                format!(" find {} {upto}/{} ", filter.label(), self.matches.len()),
                theme.level(Level::Info),
            ));
        }
        if let Some((level, text)) = &self.message {
            spans.push(Span::styled(
                format!(" {text} "),
                theme.level(*level).add_modifier(Modifier::BOLD),
            ));
        } else {
            for (key, what) in keymap::footer_keys(self.app.focus, KeyMode::Replay, true) {
                spans.push(Span::styled(format!(" {key}"), theme.key()));
                spans.push(Span::styled(format!(" {what}"), theme.dim()));
            }
        }
        Line::from(spans)
    }

    fn draw_bar(&self, frame: &mut Frame<'_>, area: Rect) {
        let theme = &self.theme;
        let width = usize::from(area.width.saturating_sub(2)).max(1);
        let r = &self.replayer;
        let span = r.end().since(r.start()).max(1);
        let column = |t: Millis| -> usize {
            let x = t.since(r.start()) as u128 * (width as u128 - 1) / u128::from(span);
            usize::try_from(x).unwrap_or(width - 1).min(width - 1)
        };
        let here = column(r.position());
        let mut marks = vec![false; width];
        for m in &self.markers {
            if let Some(slot) = marks.get_mut(column(*m)) {
                *slot = true;
            }
        }
        let mut found = vec![false; width];
        for (m, _) in &self.matches {
            if let Some(slot) = found.get_mut(column(*m)) {
                *slot = true;
            }
        }
        let mut spans = vec![Span::raw(" ")];
        for x in 0..width {
            let (symbol, style) = if x == here {
                ("●", theme.title().add_modifier(Modifier::BOLD))
            } else if found.get(x).copied().unwrap_or(false) {
                ("◆", theme.level(Level::Info))
            } else if marks.get(x).copied().unwrap_or(false) {
                ("▲", theme.level(Level::Bad))
            } else if x < here {
                ("━", theme.base())
            } else {
                ("─", theme.dim())
            };
            spans.push(Span::styled(symbol, style));
        }
        frame.render_widget(Paragraph::new(Line::from(spans)).style(theme.base()), area);
    }
}

/// `den replay FILE`.
pub async fn run(path: &Path, speed: f64, theme_name: &str) -> ExitCode {
    let fail = |e: &dyn std::fmt::Display| {
        eprintln!("den replay: {e}");
        ExitCode::from(1)
    };
    let replayer = match Replayer::open(path) {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    let theme = match Theme::load(theme_name, Theme::user_dir().as_deref()) {
        Ok(t) => t,
        Err(e) => return fail(&e),
    };
    let label = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let recording = replayer.recording().clone();
    let mut replay = Replay::new(replayer, theme, label, speed.clamp(0.25, 64.0));
    // Failure markers come from a pass over the whole file, off the UI thread.
    let (markers_tx, markers_rx) = std_mpsc::channel();
    std::thread::spawn(move || {
        let found = scan::matches(&recording, &Filter::Failures);
        let _ = markers_tx.send(found.into_iter().map(|(at, _)| at).collect::<Vec<_>>());
    });
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            return fail(&format!(
                "needs a terminal ({e}); use --summary or --at in scripts"
            ));
        }
    };
    let mut input = EventStream::new();
    let mut frame = tokio::time::interval(FRAME);
    frame.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last = Instant::now();
    let mut error = None;
    while replay.running() {
        tokio::select! {
            biased;
            key = input.next() => match key {
                Some(Ok(Event::Key(key))) => {
                    if let Err(e) = replay.key(key) {
                        error = Some(e);
                        break;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            },
            _ = frame.tick() => {
                let now = Instant::now();
                if let Err(e) = replay.advance(now - last) {
                    error = Some(e);
                    break;
                }
                last = now;
                if let Ok(markers) = markers_rx.try_recv() {
                    replay.markers = markers;
                }
                if terminal.draw(|f| replay.draw(f)).is_err() {
                    break;
                }
            }
        }
    }
    ratatui::restore();
    match error {
        Some(e) => fail(&e),
        None => ExitCode::SUCCESS,
    }
}
