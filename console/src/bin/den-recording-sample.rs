//! `den-recording-sample`: write the synthetic sample recordings (see
//! `recordings/README.md`) through den's recorder.
//!
//! ```text
//! den-recording-sample incident FILE
//! den-recording-sample demo [--seconds N] FILE
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use den_console::model::ModelConfig;
use den_console::record::{Recorder, RecorderConfig, synthetic};
use den_protocol::recording::SourceInfo;
use den_protocol::session::{SessionEvent, Stamped};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(line) => {
            eprintln!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("den-recording-sample: {e}");
            eprintln!("usage: den-recording-sample incident FILE | demo [--seconds N] FILE");
            ExitCode::from(1)
        }
    }
}

fn run(args: &[String]) -> Result<String, String> {
    let (kind, rest) = args.split_first().ok_or("which sample?")?;
    let (events, file) = match (kind.as_str(), rest) {
        ("incident", [file]) => (synthetic::incident()?, file),
        ("demo", [file]) => (synthetic::demo(10)?, file),
        ("demo", [flag, n, file]) if flag == "--seconds" => {
            let n: u64 = n
                .parse()
                .map_err(|_| format!("--seconds {n}: not a number"))?;
            (synthetic::demo(n)?, file)
        }
        _ => return Err(format!("unknown arguments {args:?}")),
    };
    let path = PathBuf::from(file);
    let sources = events
        .iter()
        .filter_map(|e| match &e.event {
            SessionEvent::SourceAdded { source, kind, url } => Some(SourceInfo {
                source: source.clone(),
                kind: *kind,
                url: url.clone(),
            }),
            _ => None,
        })
        .collect();
    let mut config = RecorderConfig::new(path, ModelConfig::default(), sources);
    // Reproducible bytes: fixed start, host and id.
    config.started_at_unix_ms = 1_750_000_000_000;
    config.host = "synthetic".to_owned();
    config.recording_id = Some(format!("synthetic-{kind}"));
    let recorder = Recorder::start(config).map_err(|e| e.to_string())?;
    for e in &events {
        recorder.record_waiting(e);
    }
    let end = events
        .last()
        .map_or(den_protocol::time::Millis::ZERO, |e: &Stamped| e.at);
    let closed = recorder.close(end).map_err(|e| e.to_string())?;
    Ok(format!(
        "wrote {} events ({} bytes) to {}",
        closed.events,
        closed.bytes,
        closed
            .segments
            .first()
            .map_or_else(String::new, |p| p.display().to_string())
    ))
}
