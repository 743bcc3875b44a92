//! The interactive console: one loop over terminal input, source events and a frame
//! tick. Network I/O lives in other tasks; the loop only applies events, handles keys and
//! draws, so input is never blocked. Rendering is coalesced (television-style): changes
//! mark the frame dirty and at most one frame is drawn per `FRAME`.
//!
//! The loop's logic is [`Console`]: it stamps, records and applies events, handles keys
//! and draws, with the time passed in, so that tests drive it with a `TestBackend` and
//! a clock of their own. Every event the model applies also goes to the recorder, and
//! stamps are such that a frame drawn at `T` shows exactly the events stamped at or
//! before `T`: a replay to `T` draws the same frame.

use std::path::PathBuf;
use std::time::Duration;

use crossterm::event::{Event, EventStream, KeyEvent};
use futures_util::StreamExt;
use ratatui::Terminal;
use ratatui::backend::Backend;
use tokio::sync::mpsc;

use den_protocol::recording::SourceInfo;
use den_protocol::session::{SessionEvent, SourceId, Stamped, redact_url};
use den_protocol::time::Millis;

use crate::app::{App, Command, Effect, action_for};
use crate::commands::{self, Targets};
use crate::config::Settings;
use crate::model::{InstanceRow, Model, ModelConfig};
use crate::record::{Closed, RecordError, Recorder, RecorderConfig, paths};
use crate::sources::{self, Clock, PollConfig};
use crate::theme::Theme;

/// Shortest time between two frames.
const FRAME: Duration = Duration::from_millis(16);
/// Redraw at least this often so that ages advance.
const TICK: Duration = Duration::from_millis(500);
/// Source events applied per batch before input is looked at again.
const BATCH: usize = 1024;

/// What ended the console with an error (one line for the user).
#[derive(Debug, thiserror::Error)]
pub enum TuiError {
    #[error("{0}")]
    Theme(#[from] crate::theme::ThemeError),
    #[error("{0}")]
    Source(#[from] crate::http::UrlError),
    #[error("den needs a terminal for its console ({0}); use `den status` in scripts")]
    Terminal(String),
    #[error("{0}")]
    Record(#[from] RecordError),
}

/// The console's state and what it does with its inputs, without a terminal or a clock.
pub struct Console {
    pub app: App,
    pub model: Model,
    pub theme: Theme,
    recorder: Option<Recorder>,
    last_stamp: Millis,
    drawn_at: Option<Millis>,
}

impl Console {
    pub fn new(app: App, model: Model, theme: Theme, recorder: Option<Recorder>) -> Console {
        Console {
            app,
            model,
            theme,
            recorder,
            last_stamp: Millis::ZERO,
            drawn_at: None,
        }
    }

    /// The stamp of an event arriving at `now`: never before the previous stamp, and
    /// after the last frame drawn (so that frame never lacks an event stamped at its
    /// time).
    pub fn stamp(&mut self, now: Millis) -> Millis {
        let after_frame = self.drawn_at.map_or(Millis::ZERO, |t| t.saturating_add(1));
        self.last_stamp = now.max(self.last_stamp).max(after_frame);
        self.last_stamp
    }

    /// Stamp, record and apply one event.
    pub fn apply(&mut self, now: Millis, event: SessionEvent) {
        let stamped = Stamped::new(self.stamp(now), event);
        if let Some(recorder) = &self.recorder {
            recorder.record(&stamped);
        }
        self.model.apply(&stamped);
    }

    /// Handle a key. Returns the commands to execute (already applied as `Command`
    /// events) and whether to quit.
    pub fn key(
        &mut self,
        now: Millis,
        key: KeyEvent,
    ) -> Vec<(den_protocol::session::CommandSeq, Command)> {
        let mut run = Vec::new();
        let Some(action) = action_for(key, &self.app.mode, self.app.focus) else {
            return run;
        };
        self.model.settle();
        let effects = self.app.update(action, &self.model);
        for effect in effects {
            match effect {
                Effect::Quit => {}
                Effect::Note(text) => self.apply(now, SessionEvent::Note { text }),
                Effect::Theme(name) => {
                    let text = match Theme::load(&name, Theme::user_dir().as_deref()) {
                        Ok(t) => {
                            self.theme = t;
                            format!("theme {name}")
                        }
                        Err(e) => e.to_string(),
                    };
                    self.apply(now, SessionEvent::Note { text });
                }
                Effect::Execute { id, command } => {
                    self.apply(
                        now,
                        SessionEvent::Command {
                            id,
                            text: command.to_string(),
                        },
                    );
                    run.push((id, command));
                }
            }
        }
        run
    }

    /// The time a frame drawn now shows: never before an event already applied.
    pub fn frame_time(&self, now: Millis) -> Millis {
        now.max(self.last_stamp)
    }

    /// Settle and draw one frame; returns its time.
    pub fn draw<B: Backend>(
        &mut self,
        terminal: &mut Terminal<B>,
        now: Millis,
    ) -> Result<Millis, B::Error> {
        let at = self.frame_time(now);
        self.model.settle();
        self.app.prepare(&self.model);
        let (app, model, theme) = (&self.app, &self.model, &self.theme);
        terminal.draw(|f| crate::ui::draw(f, app, model, theme, at))?;
        self.drawn_at = Some(at);
        Ok(at)
    }

    /// Events the recorder had to drop so far.
    pub fn dropped(&self) -> u64 {
        self.recorder.as_ref().map_or(0, Recorder::dropped)
    }

    /// Finish the recording (if any) at `now`.
    pub fn close_recording(&mut self, now: Millis) -> Option<Result<Closed, RecordError>> {
        let at = now.max(self.last_stamp);
        self.recorder.take().map(|r| r.close(at))
    }
}

/// Where a session records to: `--record PATH` (a directory: a new file in it), else
/// (unless `--no-record`) a new file under the data directory.
pub fn recording_path(settings: &Settings, started_at_unix_ms: u64) -> Option<PathBuf> {
    if settings.no_record {
        return None;
    }
    let name = paths::default_name(started_at_unix_ms, &paths::host_name());
    match &settings.record {
        // A directory (existing, or written with a trailing slash): a new file in it.
        Some(p) if p.is_dir() || p.to_string_lossy().ends_with('/') => Some(p.join(name)),
        Some(p) => Some(p.clone()),
        None => paths::default_dir().map(|d| d.join(name)),
    }
}

/// Start the recorder of a session on `settings`' sources, if it records.
pub fn start_recorder(settings: &Settings) -> Result<Option<Recorder>, RecordError> {
    let started = crate::record::unix_ms_now();
    let Some(path) = recording_path(settings, started) else {
        return Ok(None);
    };
    let default_dir = settings.record.is_none();
    let sources = settings
        .sources
        .iter()
        .map(|s| SourceInfo {
            source: s.id.clone(),
            kind: s.kind,
            url: redact_url(&s.url),
        })
        .collect();
    let mut config = RecorderConfig::new(path, model_config(settings), sources);
    config.started_at_unix_ms = started;
    config.secrets = settings.token.iter().cloned().collect();
    config.sweep_directory = default_dir;
    Recorder::start(config).map(Some)
}

pub fn model_config(settings: &Settings) -> ModelConfig {
    let interval = u64::try_from(settings.poll_interval.as_millis()).unwrap_or(u64::MAX);
    ModelConfig {
        stale_after_ms: settings.stale_after_ms,
        // Two answers missed, and a little more: one slow answer is not silence.
        silent_after_ms: interval.saturating_mul(5) / 2,
        ..ModelConfig::default()
    }
}

/// One line for the user about a finished recording.
pub fn describe_closed(closed: &Result<Closed, RecordError>) -> String {
    match closed {
        Ok(c) => {
            let path = c
                .segments
                .first()
                .map_or_else(String::new, |p| p.display().to_string());
            let segments = if c.segments.len() > 1 {
                format!(" in {} segments", c.segments.len())
            } else {
                String::new()
            };
            let dropped = if c.dropped > 0 {
                format!(", {} dropped (the disk could not keep up)", c.dropped)
            } else {
                String::new()
            };
            format!(
                "recorded {} events ({} bytes{segments}{dropped}) to {path}\n  replay: den replay {path}",
                c.events, c.bytes
            )
        }
        Err(e) => e.to_string(),
    }
}

/// Run the console until the operator quits.
pub async fn run(settings: Settings) -> Result<(), TuiError> {
    let theme = Theme::load(&settings.theme, Theme::user_dir().as_deref())?;
    let clock = Clock::new();
    let (tx, mut rx) = mpsc::channel::<SessionEvent>(4096);
    let poll = PollConfig {
        interval: settings.poll_interval,
        timeout: settings.request_timeout,
        catalog: true,
    };
    let targets = Targets::new(
        &settings.sources,
        settings.token.as_deref(),
        settings.request_timeout,
    )?;
    let recorder = start_recorder(&settings)?;
    let label = recorder.as_ref().map(|r| r.path().display().to_string());
    let _tasks = sources::spawn_all(&settings.sources, settings.token.as_deref(), poll, &tx)?;
    let model = Model::new(model_config(&settings));
    let app = App::new(settings.read_only, label);
    let mut console = Console::new(app, model, theme, recorder);
    for spec in &settings.sources {
        console.apply(clock.now(), sources::added(spec));
    }
    let now_unix = crate::commands::place::clock::unix_now_ms();
    for event in crate::commands::place::fence_deadlines(&targets.fence_dir, now_unix) {
        console.apply(clock.now(), event);
    }

    let mut terminal = ratatui::try_init().map_err(|e| TuiError::Terminal(e.to_string()))?;
    let mut input = EventStream::new();
    let mut frame = tokio::time::interval(FRAME);
    frame.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut tick = tokio::time::interval(TICK);
    let mut batch = Vec::with_capacity(BATCH);
    let mut dirty = true;
    while console.app.running {
        tokio::select! {
            biased;
            key = input.next() => match key {
                Some(Ok(Event::Key(key))) => {
                    for (id, command) in console.key(clock.now(), key) {
                        spawn_command(&console.model, &targets, &tx, id, command);
                    }
                    dirty = true;
                }
                Some(Ok(_)) => dirty = true,
                Some(Err(_)) | None => break,
            },
            n = rx.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    break;
                }
                for event in batch.drain(..) {
                    console.apply(clock.now(), event);
                }
                dirty = true;
            }
            _ = tick.tick() => dirty = true,
            _ = frame.tick() => {
                if dirty {
                    if console.draw(&mut terminal, clock.now()).is_err() {
                        break;
                    }
                    dirty = false;
                }
            }
        }
    }
    ratatui::restore();
    if let Some(closed) = console.close_recording(clock.now()) {
        eprintln!("den: {}", describe_closed(&closed));
    }
    Ok(())
}

fn spawn_command(
    model: &Model,
    targets: &Targets,
    tx: &mpsc::Sender<SessionEvent>,
    id: den_protocol::session::CommandSeq,
    command: Command,
) {
    let preferred = match &command {
        Command::Delete { instance } => source_holding(model, instance),
        _ => None,
    };
    let targets = targets.clone();
    let tx = tx.clone();
    tokio::spawn(async move {
        commands::execute(id, command, &targets, preferred, &tx).await;
    });
}

/// The source whose latest `/state` holds `instance` (deletions go there).
fn source_holding(model: &Model, instance: &str) -> Option<SourceId> {
    let present = model
        .views()
        .instances
        .iter()
        .any(|r| matches!(r, InstanceRow::Instance { instance: i, .. } if i == instance));
    if !present {
        return None;
    }
    model
        .views()
        .sources
        .iter()
        .map(|s| &s.source)
        .find(|s| {
            model
                .state_of(s)
                .is_some_and(|(_, st)| st.instances.keys().any(|k| k.as_str() == instance))
        })
        .cloned()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use ratatui::backend::TestBackend;

    use super::*;
    use crate::replay::Replayer;

    fn settings(record: Option<&Path>, no_record: bool) -> Settings {
        Settings {
            sources: Vec::new(),
            token: Some("t0ken-value".into()),
            ca_cert: None,
            theme: "dark".into(),
            read_only: false,
            record: record.map(Path::to_path_buf),
            no_record,
            poll_interval: Duration::from_millis(100),
            request_timeout: Duration::from_secs(1),
            stale_after_ms: 10_000,
        }
    }

    #[test]
    fn sessions_record_by_default_to_a_path_or_into_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(recording_path(&settings(None, true), 0), None);
        let default = recording_path(&settings(None, false), 1_750_000_000_000);
        if let Some(p) = default {
            assert!(p.ends_with(paths::default_name(1_750_000_000_000, &paths::host_name())));
            assert!(p.to_string_lossy().contains("den/recordings"));
        }
        let file = dir.path().join("x.jsonl");
        assert_eq!(recording_path(&settings(Some(&file), false), 0), Some(file));
        let inside = recording_path(&settings(Some(dir.path()), false), 0).unwrap();
        assert_eq!(inside.parent(), Some(dir.path()));
    }

    #[test]
    fn a_frame_at_t_shows_every_event_stamped_up_to_t_and_no_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.jsonl");
        let recorder = start_recorder(&settings(Some(&file), false)).unwrap();
        let mut console =
            Console::new(App::default(), Model::default(), Theme::default(), recorder);
        let mut terminal = Terminal::new(TestBackend::new(100, 30)).unwrap();
        let note = |t: &str| SessionEvent::Note { text: t.into() };
        console.apply(Millis(5), note("a"));
        assert_eq!(console.draw(&mut terminal, Millis(5)).unwrap(), Millis(5));
        // Arrives in the same millisecond as the frame, after it: stamped later.
        console.apply(Millis(5), note("b"));
        // A clock that reads earlier than an applied event does not draw before it.
        assert_eq!(console.frame_time(Millis(3)), Millis(6));
        let closed = console.close_recording(Millis(9)).unwrap().unwrap();
        assert_eq!(closed.events, 2);
        let mut replay = Replayer::open(&file).unwrap();
        replay.seek(Millis(5)).unwrap();
        let texts: Vec<&str> = replay
            .model()
            .events()
            .iter()
            .map(|l| l.text.as_str())
            .collect();
        assert_eq!(texts, ["a"]);
        replay.seek(Millis(6)).unwrap();
        assert_eq!(replay.model().events().len(), 2);
        // The token given to the session is a known secret of the recording.
        let header = std::fs::read_to_string(&file).unwrap();
        assert!(header.contains("\"known_secrets\":1"));
    }
}
