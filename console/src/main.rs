//! `den`: the console (no subcommand) and its non-interactive subcommands.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use den_console::app::Command;
use den_console::config::{self, Cli, Sub};
use den_console::{status, tui};

fn main() -> ExitCode {
    let cli = Cli::parse();
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
                status::status(&settings, json, timeout).await
            }
            Some(Sub::Place {
                model,
                nodes,
                yes: _,
                json,
            }) => status::command(&settings, Command::Place { model, nodes }, json).await,
            Some(Sub::Delete { instance }) => {
                status::command(&settings, Command::Delete { instance }, false).await
            }
            Some(Sub::Cancel { request }) => {
                status::command(&settings, Command::Cancel { request }, false).await
            }
            Some(Sub::Drain { worker }) => {
                status::command(&settings, Command::Drain { worker }, false).await
            }
        }
    })
}
