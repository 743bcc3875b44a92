//! `den`: the console (no subcommand) and its non-interactive subcommands.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use den_console::app::Command;
use den_console::commands::oneshot;
use den_console::config::{self, Cli, Sub};
use den_console::demo::{Demo, DemoOptions};
use den_console::replay::summary;
use den_console::{record, status, tui};

fn main() -> ExitCode {
    // clap exits 2 on a usage error, which is `den place`'s "uncertain": a script must
    // never read a typo as a kept fence. Usage errors exit 64 (EX_USAGE).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 64 } else { 0 });
        }
    };
    let settings = match config::read_file(cli.common.config.as_deref())
        .and_then(|file| config::resolve(&cli.common, file))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("den: {e}");
            return ExitCode::from(1);
        }
    };
    den_console::http::install_crypto_provider();
    // Before the first connection: every client of this process trusts the same roots.
    if let Some(ca) = &settings.ca_cert
        && let Err(e) = den_agent::tls::trust_also(ca)
    {
        eprintln!("den: --ca-cert: {e}");
        return ExitCode::from(1);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("den: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async move {
        match cli.command {
            None => match tui::run(settings).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("den: {e}");
                    ExitCode::from(1)
                }
            },
            Some(Sub::Status { json, timeout }) => {
                let timeout = Duration::from_secs_f64(timeout.clamp(0.1, 3600.0));
                // A one-shot status records only when asked on the command line.
                let record = cli
                    .common
                    .record
                    .as_deref()
                    .filter(|_| !cli.common.no_record);
                status::status(&settings, json, timeout, record).await
            }
            Some(Sub::Place {
                model,
                nodes,
                context_tokens,
                expires,
                expect_management_node,
                card_digest,
                wait,
                compute,
                yes,
                json,
            }) => {
                if !yes && !confirm_on_terminal(&model, &nodes) {
                    return ExitCode::from(
                        u8::try_from(den_console::commands::place::EXIT_DECLINED).unwrap_or(1),
                    );
                }
                let intent = den_console::app::intent::PlaceIntent {
                    context_tokens,
                    expires,
                    management_node: expect_management_node,
                    card_digest,
                    wait,
                    compute,
                };
                let command = Command::Place {
                    model,
                    nodes,
                    intent,
                };
                oneshot::run(&settings, command, json).await
            }
            Some(Sub::Reconcile { json }) => {
                den_console::commands::reconcile::run(&settings, json).await
            }
            Some(Sub::Delete { instance, yes }) => {
                let question = format!(
                    "Delete instance {instance}? Its runners stop and requests to it fail. [y/N] "
                );
                if !yes && !confirm("delete", &question) {
                    return ExitCode::from(1);
                }
                oneshot::run(&settings, Command::Delete { instance }, false).await
            }
            Some(Sub::Cancel { request }) => {
                oneshot::run(&settings, Command::Cancel { request }, false).await
            }
            Some(Sub::Drain { worker }) => {
                oneshot::run(&settings, Command::Drain { worker }, false).await
            }
            Some(Sub::Record { file, duration }) => {
                record::session::record(&settings, file, duration.as_deref()).await
            }
            Some(Sub::Replay {
                file,
                summary: want_summary,
                json,
                at,
                speed,
            }) => {
                replay(
                    &file,
                    want_summary,
                    json,
                    at.as_deref(),
                    speed,
                    &settings.theme,
                )
                .await
            }
            Some(Sub::Demo {
                headless,
                duration,
                workers,
                model_file,
                synthetic,
            }) => {
                let model = if synthetic {
                    None
                } else {
                    model_file.or_else(den_console::demo::default_model_file)
                };
                demo(&settings, headless, duration, workers, model).await
            }
        }
    })
}

/// `den replay`: interactive, `--summary` or `--at`.
async fn replay(
    file: &std::path::Path,
    want_summary: bool,
    json: bool,
    at: Option<&str>,
    speed: f64,
    theme: &str,
) -> ExitCode {
    let out = if let Some(at) = at {
        let t = match den_protocol::recording::parse_offset(at) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("den replay: --at {e}");
                return ExitCode::from(1);
            }
        };
        summary::at(file, t, json)
    } else if want_summary {
        summary::summarise(file).map(|s| {
            if json {
                serde_json::to_string_pretty(&s).unwrap_or_default()
            } else {
                summary::text(&s)
            }
        })
    } else {
        return den_console::replay::tui::run(file, speed, theme).await;
    };
    match out {
        Ok(text) => {
            use std::io::Write;
            // A closed pipe (`| head`) is not an error worth a panic. Text is stripped of
            // control sequences: a recording holds whatever the network sent.
            let text = if json {
                text
            } else {
                den_protocol::text::printable_lines(&text).into_owned()
            };
            let _ = writeln!(std::io::stdout().lock(), "{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("den replay: {e}");
            ExitCode::from(1)
        }
    }
}

/// Asks before a placement is submitted (placements start downloads and claim memory).
/// Without a terminal to ask on, refuses: scripts pass `--yes`.
fn confirm_on_terminal(model: &str, nodes: &[String]) -> bool {
    let target = if nodes.is_empty() {
        "the management node".to_owned()
    } else {
        nodes.join(", ")
    };
    confirm(
        "place",
        &format!("Place {model} on {target}? A submission fence is written first. [y/N] "),
    )
}

/// Asks `question` on the terminal; a non-terminal stdin needs `--yes`.
fn confirm(verb: &str, question: &str) -> bool {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        eprintln!(
            "den {verb}: refusing without confirmation: pass --yes (stdin is not a terminal)"
        );
        return false;
    }
    eprint!("{question}");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    if std::io::stdin().lock().read_line(&mut answer).is_err() {
        return false;
    }
    let yes = matches!(answer.trim(), "y" | "Y" | "yes");
    if !yes {
        eprintln!("den {verb}: nothing sent");
    }
    yes
}

/// `den demo`: the embedded cluster with the console attached (or headless).
async fn demo(
    settings: &den_console::config::Settings,
    headless: bool,
    duration: Option<Duration>,
    workers: usize,
    model_file: Option<std::path::PathBuf>,
) -> ExitCode {
    let duration = if headless {
        Some(duration.unwrap_or(Duration::from_secs(10)))
    } else {
        duration
    };
    let banner = den_console::demo::banner(model_file.as_deref());
    eprintln!("den demo: {banner}");
    let opts = DemoOptions {
        workers,
        duration,
        token: settings.token.clone(),
        model_file,
        ..DemoOptions::default()
    };
    // The cluster owns a runtime of its own; start and stop it off this runtime's threads.
    let started = tokio::task::spawn_blocking(move || Demo::start(&opts)).await;
    let mut demo = match started {
        Ok(Ok(d)) => d,
        Ok(Err(e)) => {
            eprintln!("den: {e}");
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("den: demo: the cluster failed to start: {e}");
            return ExitCode::from(1);
        }
    };
    eprintln!("den demo: router on {}", demo.router_url);
    if headless {
        // Recorded like the console would (on by default; --record PATH, --no-record).
        let recording = match headless_recording(demo.settings(settings)) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("den demo: {e}");
                let _ = tokio::task::spawn_blocking(move || demo.stop()).await;
                return ExitCode::from(1);
            }
        };
        let (report, demo) = tokio::task::spawn_blocking(move || {
            let r = demo.wait_workload();
            (r, demo)
        })
        .await
        .map_or((None, None), |(r, d)| (r, Some(d)));
        if let Some((stop, task)) = recording {
            let _ = stop.send(());
            match task.await {
                Ok(Ok(closed)) => eprintln!("den demo: {}", tui::describe_closed(&closed)),
                Ok(Err(e)) => eprintln!("den demo: recording: {e}"),
                Err(e) => eprintln!("den demo: recording: {e}"),
            }
        }
        if let Some(demo) = demo {
            let _ = tokio::task::spawn_blocking(move || demo.stop()).await;
        }
        match report {
            Some(r) => {
                use std::io::Write as _;
                let _ = write!(std::io::stdout().lock(), "{}", r.summary());
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("den: demo: the workload did not report");
                ExitCode::from(1)
            }
        }
    } else {
        let result = tui::run(demo.settings(settings)).await;
        let _ = tokio::task::spawn_blocking(move || demo.stop()).await;
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("den: {e}");
                ExitCode::from(1)
            }
        }
    }
}

type Recording = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<
        Result<Result<den_console::record::Closed, den_console::record::RecordError>, String>,
    >,
);

/// Start recording the demo's router in the background, unless `--no-record`; stops
/// when the sender is used or dropped.
fn headless_recording(
    settings: den_console::config::Settings,
) -> Result<Option<Recording>, String> {
    let Some(recorder) = tui::start_recorder(&settings).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    eprintln!("den demo: recording to {}", recorder.path().display());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        record::session::record_sources(&settings, recorder, async {
            let _ = stop_rx.await;
        })
        .await
    });
    Ok(Some((stop_tx, task)))
}
