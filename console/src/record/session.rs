//! `den record`: the console's sources and recorder without a terminal.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tokio::sync::mpsc;

use den_protocol::recording::parse_offset;
use den_protocol::session::SessionEvent;

use crate::app::App;
use crate::config::Settings;
use crate::model::Model;
use crate::record::{Closed, RecordError, Recorder};
use crate::sources::{self, Clock, PollConfig};
use crate::theme::Theme;
use crate::tui::{Console, describe_closed, model_config, start_recorder};

/// Record until `duration` passes or the process is told to stop (SIGINT, SIGTERM).
pub async fn record(
    settings: &Settings,
    file: Option<PathBuf>,
    duration: Option<&str>,
) -> ExitCode {
    let fail = |e: &dyn std::fmt::Display| {
        eprintln!("den record: {e}");
        ExitCode::from(1)
    };
    if settings.sources.is_empty() {
        return fail(
            &"no sources: pass --router URL or --skulk URL (or set DEN_ROUTER / DEN_SKULK)",
        );
    }
    let duration = match duration.map(parse_offset).transpose() {
        Ok(d) => d.map(|m| Duration::from_millis(m.0)),
        Err(e) => return fail(&e),
    };
    let mut settings = settings.clone();
    if let Some(file) = file {
        settings.record = Some(file);
        settings.no_record = false;
    }
    let recorder = match start_recorder(&settings) {
        Ok(Some(r)) => r,
        Ok(None) => return fail(&"--no-record: nothing to record"),
        Err(e) => return fail(&e),
    };
    eprintln!("den record: recording to {}", recorder.path().display());
    let deadline = duration.map(|d| tokio::time::Instant::now() + d);
    let stop = async move {
        tokio::select! {
            _ = stop_signal() => {}
            _ = sleep_until(deadline) => {}
        }
    };
    match record_sources(&settings, recorder, stop).await {
        Ok(closed) => {
            eprintln!("den record: {}", describe_closed(&closed));
            if closed.is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => fail(&e),
    }
}

/// Record `settings`' sources with `recorder` until `stop` completes (or every source
/// task ended), then close the recording. `den record` and `den demo --headless`.
pub async fn record_sources(
    settings: &Settings,
    recorder: Recorder,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Result<Closed, RecordError>, String> {
    let clock = Clock::new();
    let (tx, mut rx) = mpsc::channel::<SessionEvent>(4096);
    let poll = PollConfig {
        interval: settings.poll_interval,
        timeout: settings.request_timeout,
        catalog: false,
    };
    let tasks = sources::spawn_all(&settings.sources, settings.token.as_deref(), poll, &tx)
        .map_err(|e| e.to_string())?;
    drop(tx);
    let mut console = Console::new(
        App::default(),
        Model::new(model_config(settings)),
        Theme::default(),
        Some(recorder),
    );
    for spec in &settings.sources {
        console.apply(clock.now(), sources::added(spec));
    }
    tokio::pin!(stop);
    loop {
        tokio::select! {
            event = rx.recv() => match event {
                Some(event) => console.apply(clock.now(), event),
                None => break,
            },
            _ = &mut stop => break,
        }
    }
    for task in tasks {
        task.abort();
    }
    // The recorder is in the console: closing it cannot fail to find it.
    console
        .close_recording(clock.now())
        .ok_or_else(|| "the recording was already closed".to_owned())
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// SIGINT or (on Unix) SIGTERM.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
