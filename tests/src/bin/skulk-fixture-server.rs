//! `skulk-fixture-server --script FILE [--listen ADDR] [--var NAME=VALUE]...`
//!
//! A Skulk-compatible HTTP server on loopback for tests: serves the script's captured
//! responses in order per route and records every request (see `den_tests::script` for
//! the script format and `den_tests::fixture_server` for the control endpoints
//! `GET /__requests` and `POST /__reset`). Prints `listening on ADDR` as its first
//! stdout line (bind port 0 to get a free one); one line per request goes to stderr.
// Test support: a helper that cannot do its job fails the test that called it, so it may
// unwrap, expect and panic. Nothing here ships in den's binaries.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use den_tests::fixture_server::serve;
use den_tests::script::Script;

const USAGE: &str =
    "usage: skulk-fixture-server --script FILE [--listen ADDR] [--var NAME=VALUE]...";

struct Args {
    script: PathBuf,
    listen: String,
    vars: BTreeMap<String, String>,
}

fn parse_args() -> Result<Args, String> {
    let mut script = None;
    let mut listen = "127.0.0.1:0".to_owned();
    let mut vars = BTreeMap::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--script" => script = Some(PathBuf::from(value("--script")?)),
            "--listen" => listen = value("--listen")?,
            "--var" => {
                let pair = value("--var")?;
                let (name, val) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("--var {pair:?}: expected NAME=VALUE"))?;
                vars.insert(name.to_owned(), val.to_owned());
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let script = script.ok_or_else(|| "--script FILE is required".to_owned())?;
    Ok(Args {
        script,
        listen,
        vars,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("skulk-fixture-server: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let script = match Script::load(&args.script, &args.vars) {
        Ok(script) => script,
        Err(e) => {
            eprintln!("skulk-fixture-server: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(&args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "skulk-fixture-server: cannot listen on {}: {e}",
                args.listen
            );
            return ExitCode::from(1);
        }
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("skulk-fixture-server: {e}");
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "listening on {addr}")
        .and_then(|()| out.flush())
        .is_err()
    {
        return ExitCode::from(1);
    }
    drop(out);
    if let Some(description) = &script.description {
        eprintln!("skulk-fixture-server: {description}");
    }
    match serve(listener, script).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skulk-fixture-server: {e}");
            ExitCode::from(1)
        }
    }
}
