//! `den-fleet`: the command-line shell over the fleet study (see `den_fleet::cli`).
//! The tables and reports go to stdout; logs go to stderr.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use den_agent::logging;
use den_fleet::cli::{Cli, Command};
use den_fleet::{simulate, validate};

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format.unwrap_or_default(), cli.log.as_deref());
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(1, &format!("cannot start the async runtime: {e}")),
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Simulate(args) => simulate(args).await,
            Command::Validate(args) => validate(args).await,
        }
    })
}

/// `den-fleet simulate`: CPU-bound, so off the async threads.
async fn simulate(args: simulate::SimulateArgs) -> ExitCode {
    match tokio::task::spawn_blocking(move || simulate::run(&args)).await {
        Ok(Ok(out)) => {
            say(&out);
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => fail(2, &e),
        Err(e) => fail(1, &format!("simulate failed: {e}")),
    }
}

/// `den-fleet validate`: starts `den-agent` as the router and the workers.
async fn validate(args: validate::ValidateArgs) -> ExitCode {
    let agent = match validate::agent_binary(args.agent.as_deref()) {
        Ok(p) => p,
        Err(e) => return fail(1, &e),
    };
    match validate::run(&args, agent).await {
        Ok(out) => {
            say(&out);
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, &e),
    }
}

fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "{text}");
    let _ = out.flush();
}

/// One line on stderr; with JSON logs, an error event instead (the shipper's format).
fn fail(code: u8, message: &str) -> ExitCode {
    if logging::is_json() {
        tracing::error!("{message}");
    } else {
        eprintln!("den-fleet: {message}");
    }
    ExitCode::from(code)
}
