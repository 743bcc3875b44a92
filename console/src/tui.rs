//! The interactive console: one loop over terminal input, source events and a frame
//! tick. Network I/O lives in other tasks; the loop only applies events, handles keys and
//! draws, so input is never blocked. Rendering is coalesced (television-style): changes
//! mark the frame dirty and at most one frame is drawn per [`FRAME`].

use std::time::Duration;

use crossterm::event::{Event, EventStream};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use den_protocol::session::{SessionEvent, SourceId, Stamped};

use crate::app::{App, Effect, action_for};
use crate::config::Settings;
use crate::exec::{self, Targets};
use crate::model::{InstanceRow, Model, ModelConfig};
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
}

/// Run the console until the operator quits.
pub async fn run(settings: Settings) -> Result<(), TuiError> {
    let mut theme = Theme::load(&settings.theme, Theme::user_dir().as_deref())?;
    let clock = Clock::new();
    let (tx, mut rx) = mpsc::channel::<SessionEvent>(4096);
    let poll = PollConfig {
        interval: settings.poll_interval,
        timeout: settings.request_timeout,
    };
    let targets = Targets::new(
        &settings.sources,
        settings.token.as_deref(),
        settings.request_timeout,
    )?;
    let _tasks = sources::spawn_all(&settings.sources, settings.token.as_deref(), poll, &tx)?;
    let mut model = Model::new(ModelConfig {
        stale_after_ms: settings.stale_after_ms,
        ..ModelConfig::default()
    });
    for spec in &settings.sources {
        model.apply(&Stamped::new(clock.now(), sources::added(spec)));
    }
    let recording = settings.record.as_ref().map(|p| p.display().to_string());
    let mut app = App::new(settings.read_only, recording);

    let mut terminal = ratatui::try_init().map_err(|e| TuiError::Terminal(e.to_string()))?;
    let mut input = EventStream::new();
    let mut frame = tokio::time::interval(FRAME);
    frame.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut tick = tokio::time::interval(TICK);
    let mut batch = Vec::with_capacity(BATCH);
    let mut dirty = true;
    while app.running {
        tokio::select! {
            biased;
            key = input.next() => match key {
                Some(Ok(Event::Key(key))) => {
                    if let Some(action) = action_for(key, &app.mode) {
                        model.settle();
                        let effects = app.update(action, &model);
                        for effect in effects {
                            handle(effect, &mut model, &mut theme, &clock, &targets, &tx);
                        }
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
                    model.apply(&Stamped::new(clock.now(), event));
                }
                dirty = true;
            }
            _ = tick.tick() => dirty = true,
            _ = frame.tick() => {
                if dirty {
                    model.settle();
                    app.prepare(&model);
                    let now = clock.now();
                    let drawn = terminal.draw(|f| crate::ui::draw(f, &app, &model, &theme, now));
                    if drawn.is_err() {
                        break;
                    }
                    dirty = false;
                }
            }
        }
    }
    ratatui::restore();
    Ok(())
}

fn handle(
    effect: Effect,
    model: &mut Model,
    theme: &mut Theme,
    clock: &Clock,
    targets: &Targets,
    tx: &mpsc::Sender<SessionEvent>,
) {
    match effect {
        Effect::Quit => {}
        Effect::Note(text) => model.apply(&Stamped::new(clock.now(), SessionEvent::Note { text })),
        Effect::Theme(name) => {
            let text = match Theme::load(&name, Theme::user_dir().as_deref()) {
                Ok(t) => {
                    *theme = t;
                    format!("theme {name}")
                }
                Err(e) => e.to_string(),
            };
            model.apply(&Stamped::new(clock.now(), SessionEvent::Note { text }));
        }
        Effect::Execute { id, command } => {
            model.apply(&Stamped::new(
                clock.now(),
                SessionEvent::Command {
                    id,
                    text: command.to_string(),
                },
            ));
            let preferred = match &command {
                crate::app::Command::Delete { instance } => source_holding(model, instance),
                _ => None,
            };
            let targets = targets.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                exec::execute(id, command, &targets, preferred, &tx).await;
            });
        }
    }
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
