//! `den place/delete/cancel/drain`: one command from the command line, executed by the
//! same code as the console's ([`super::execute`]); progress on stderr, the outcome on
//! stdout (or stderr when it is not ok). Exit codes: 0 ok, 1 failed, 2 uncertain; `place`
//! splits failures by class (3 refused, 4 not attempted, 5 declined: README).

use den_protocol::text::printable;
use std::process::ExitCode;

use tokio::sync::mpsc;

use den_protocol::session::{CommandSeq, CommandStatus, SessionEvent};

use super::{Targets, execute};
use crate::app::Command;
use crate::config::Settings;

/// Runs one command with the same code as the console.
pub async fn run(settings: &Settings, command: Command, json: bool) -> ExitCode {
    if settings.read_only && command.is_mutating() {
        eprintln!(
            "den {}: refused: read-only mode (--read-only or read_only in the config)",
            command.verb()
        );
        return ExitCode::from(1);
    }
    let targets = match Targets::new(
        &settings.sources,
        settings.token.as_deref(),
        settings.request_timeout,
    ) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("den {}: {e}", command.verb());
            return ExitCode::from(1);
        }
    };
    let (tx, mut rx) = mpsc::channel(64);
    let verb = command.verb();
    // Progress goes to stderr, one line per step; with --json one JSON object per line
    // (`{"event":"progress","command":"place","note":…}`), so stdout stays the single
    // outcome document.
    let printer = tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            if let SessionEvent::CommandProgress { note, .. } = event {
                let note = printable(&note);
                if json {
                    let line =
                        serde_json::json!({"event": "progress", "command": verb, "note": note});
                    eprintln!("{line}");
                } else {
                    eprintln!("den {verb}: {note}");
                }
            }
        }
    });
    let finished = execute(CommandSeq(1), command, &targets, None, &tx).await;
    drop(tx);
    let _ = printer.await;
    if json {
        // A placement adds its outcome (`outcome`, `instance_id`, `command_id`, `reason`,
        // `exit_code`, …) to the status and detail every command prints.
        let mut body = serde_json::json!({ "status": finished.status, "detail": finished.detail });
        if let (Some(serde_json::Value::Object(outcome)), Some(map)) =
            (&finished.outcome, body.as_object_mut())
        {
            for (k, v) in outcome {
                map.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), "{body}");
    } else {
        // The detail quotes what Skulk or the router answered.
        let line = format!("{}: {}", finished.status, printable(&finished.detail));
        match finished.status {
            CommandStatus::Ok => {
                use std::io::Write as _;
                let _ = writeln!(std::io::stdout().lock(), "{line}");
            }
            _ => eprintln!("{line}"),
        }
    }
    ExitCode::from(
        finished
            .exit_code
            .unwrap_or_else(|| finished.status.exit_code()),
    )
}

#[cfg(test)]
mod tests {
    use den_protocol::session::SourceKind;

    use super::*;
    use crate::config::SourceSpec;
    use crate::testing::fake_api::{Fake, TOKEN, serve, settings, skulk};

    #[tokio::test]
    async fn commands_run_against_the_server_with_three_way_outcomes() {
        crate::http::install_crypto_provider();
        let ok = serve(Fake::skulk()).await;
        let missing = serve(Fake {
            delete_status: 404,
            ..Fake::skulk()
        })
        .await;
        let code = |c: ExitCode| format!("{c:?}");
        let delete = || Command::Delete {
            instance: "5838fcd2".into(),
        };
        assert_eq!(
            code(run(&settings(vec![skulk("m", &ok)], None), delete(), false).await),
            code(ExitCode::from(0))
        );
        assert_eq!(
            code(run(&settings(vec![skulk("m", &missing)], None), delete(), false).await),
            code(ExitCode::from(1))
        );
        let mut read_only = settings(vec![skulk("m", &ok)], None);
        read_only.read_only = true;
        assert_eq!(
            code(run(&read_only, delete(), false).await),
            code(ExitCode::from(1))
        );
        let router = SourceSpec {
            id: "router".into(),
            kind: SourceKind::DenRouter,
            url: serve(Fake::router()).await,
        };
        let cancel = Command::Cancel {
            request: "request-5".into(),
        };
        assert_eq!(
            code(run(&settings(vec![router], Some(TOKEN)), cancel, true).await),
            code(ExitCode::from(0))
        );
    }
}
