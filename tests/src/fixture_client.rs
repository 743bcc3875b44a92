//! Starting the `skulk-fixture-server` binary from a test and reading back what it
//! received (see [`crate::fixture_server`] for the server and [`crate::script`] for the
//! script format).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::fixture_server::RecordedRequest;
use crate::process::{ChildGuard, binary, spawn_listening};

/// The `skulk-fixture-server` binary, started from a test (killed on drop).
pub struct FixtureServer {
    pub child: ChildGuard,
    pub addr: SocketAddr,
}

impl FixtureServer {
    /// Starts the built binary (see [`binary`]) with `script` and `--var` pairs.
    pub fn start(script: &Path, vars: &[(&str, &str)]) -> Result<FixtureServer, String> {
        FixtureServer::start_with(&binary("skulk-fixture-server")?, script, vars)
    }

    /// Starts the binary at `exe` (e.g. `env!("CARGO_BIN_EXE_skulk-fixture-server")`).
    pub fn start_with(
        exe: &Path,
        script: &Path,
        vars: &[(&str, &str)],
    ) -> Result<FixtureServer, String> {
        let mut cmd = Command::new(exe);
        cmd.arg("--script").arg(script);
        for (name, value) in vars {
            cmd.arg("--var").arg(format!("{name}={value}"));
        }
        let (child, addr) = spawn_listening(cmd, "skulk-fixture-server", Duration::from_secs(10))?;
        Ok(FixtureServer { child, addr })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request recorded so far.
    pub fn requests(&self) -> Result<Vec<RecordedRequest>, String> {
        let (status, body) = http_request(self.addr, "GET", "/__requests")?;
        if status != 200 {
            return Err(format!("GET /__requests answered {status}: {body}"));
        }
        serde_json::from_str(&body).map_err(|e| format!("unreadable /__requests: {e}"))
    }

    /// How many `method path` requests were recorded (0 if the server cannot be asked).
    pub fn count(&self, method: &str, path: &str) -> usize {
        self.requests()
            .map(|r| r.iter().filter(|r| r.is(method, path)).count())
            .unwrap_or(0)
    }

    /// Forgets the recorded requests and restarts every sequence.
    pub fn reset(&self) -> Result<(), String> {
        http_request(self.addr, "POST", "/__reset").map(|_| ())
    }
}

/// A minimal blocking HTTP/1.1 request with an empty body (for control endpoints and
/// quick probes from synchronous test code). Returns the status and the body.
pub fn http_request(addr: SocketAddr, method: &str, path: &str) -> Result<(u16, String), String> {
    let fail = |e: std::io::Error| format!("{method} http://{addr}{path}: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(fail)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(fail)?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .map_err(fail)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(fail)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{method} {path}: no HTTP response"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{method} {path}: no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}
