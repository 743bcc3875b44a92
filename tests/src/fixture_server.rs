//! A Skulk-compatible fixture server: serves a [`Script`]'s responses in order over
//! plain HTTP/1.1 on loopback and records every request it receives.
//!
//! One request per connection (every answer carries `connection: close`), bodies by
//! `content-length` (chunked request bodies are read too). This keeps "the connection
//! was closed after the request was read" exact: `drop-after-read` reads the whole
//! request and closes the socket without a byte of response.
//!
//! Control endpoints (never recorded, never scripted):
//! - `GET /__requests`: every recorded request so far, as a JSON array of
//!   [`RecordedRequest`];
//! - `POST /__reset`: forget the recorded requests and restart every route's sequence.
//!
//! The binary `skulk-fixture-server` wraps [`serve`];
//! [`crate::fixture_client::FixtureServer`] starts that binary from a test and reads the
//! recordings back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::script::{Action, Response, Script, parse_query};

/// One request the server received.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// 1, 2, 3… in arrival order (after the request was fully read).
    pub seq: u64,
    pub method: String,
    pub path: String,
    /// The raw query string, if any.
    pub query: Option<String>,
    /// The body as text (lossy UTF-8).
    pub body: String,
    /// The `Authorization` header, if one was sent.
    pub authorization: Option<String>,
    /// The index of the route that matched (`None`: the fallback answered).
    pub route: Option<usize>,
    /// What was done: `respond 200`, `drop-after-read`, `fallback 404`.
    pub served: String,
}

impl RecordedRequest {
    pub fn is(&self, method: &str, path: &str) -> bool {
        self.method.eq_ignore_ascii_case(method) && self.path == path
    }
}

/// Largest request head and body the server reads.
const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 16 * 1024 * 1024;

#[derive(Default)]
struct Recording {
    requests: Vec<RecordedRequest>,
    cursors: BTreeMap<usize, usize>,
}

/// Serves `script` on `listener` until the process ends. Logs one line per request to
/// stderr.
pub async fn serve(listener: TcpListener, script: Script) -> std::io::Result<()> {
    let script = Arc::new(script);
    let recording = Arc::new(Mutex::new(Recording::default()));
    loop {
        let (stream, _) = listener.accept().await?;
        let script = Arc::clone(&script);
        let recording = Arc::clone(&recording);
        tokio::spawn(async move {
            if let Err(e) = connection(stream, &script, &recording).await {
                eprintln!("fixture server: connection error: {e}");
            }
        });
    }
}

/// A request as read off the wire.
struct Incoming {
    method: String,
    path: String,
    query: Option<String>,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

async fn connection(
    mut stream: TcpStream,
    script: &Script,
    recording: &Mutex<Recording>,
) -> std::io::Result<()> {
    let Some(request) = read_request(&mut stream).await? else {
        return Ok(());
    };
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/__requests") => {
            let body = {
                let rec = lock(recording);
                serde_json::to_vec(&rec.requests).unwrap_or_default()
            };
            return write_response(
                &mut stream,
                200,
                "application/json",
                &BTreeMap::new(),
                &body,
            )
            .await;
        }
        ("POST", "/__reset") => {
            *lock(recording) = Recording::default();
            return write_response(&mut stream, 204, "text/plain", &BTreeMap::new(), b"").await;
        }
        _ => {}
    }
    let pairs = request
        .query
        .as_deref()
        .map(parse_query)
        .unwrap_or_default();
    let route = script.route_for(&request.method, &request.path, &pairs);
    let response: Arc<Response> = {
        let mut rec = lock(recording);
        let response = match route.and_then(|i| script.routes.get(i).map(|r| (i, r))) {
            Some((i, r)) => {
                let cursor = rec.cursors.entry(i).or_insert(0);
                let at = (*cursor).min(r.responses.len().saturating_sub(1));
                *cursor = cursor.saturating_add(1);
                r.responses
                    .get(at)
                    .cloned()
                    .unwrap_or_else(|| Arc::clone(&script.fallback))
            }
            None => Arc::clone(&script.fallback),
        };
        let served = match (response.action, route) {
            (Action::DropAfterRead, _) => "drop-after-read".to_owned(),
            (Action::Respond, Some(_)) => format!("respond {}", response.status),
            (Action::Respond, None) => format!("fallback {}", response.status),
        };
        let seq = rec.requests.len() as u64 + 1;
        eprintln!(
            "fixture server: #{seq} {} {}{} → {served}",
            request.method,
            request.path,
            request
                .query
                .as_deref()
                .map(|q| format!("?{q}"))
                .unwrap_or_default()
        );
        rec.requests.push(RecordedRequest {
            seq,
            method: request.method.clone(),
            path: request.path.clone(),
            query: request.query.clone(),
            body: String::from_utf8_lossy(&request.body).into_owned(),
            authorization: request.headers.get("authorization").cloned(),
            route,
            served,
        });
        response
    };
    if response.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(response.delay_ms)).await;
    }
    match response.action {
        // Close without answering: the request was read, the response is lost.
        Action::DropAfterRead => Ok(()),
        Action::Respond => {
            let content_type = response
                .headers
                .get("content-type")
                .cloned()
                .unwrap_or_else(|| "application/json".to_owned());
            let mut extra = response.headers.clone();
            extra.remove("content-type");
            write_response(
                &mut stream,
                response.status,
                &content_type,
                &extra,
                &response.body,
            )
            .await
        }
    }
}

fn lock(recording: &Mutex<Recording>) -> std::sync::MutexGuard<'_, Recording> {
    // A panicking connection task cannot leave the recording half-written (every update
    // is a single push or insert), so a poisoned lock is still consistent.
    recording
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<Incoming>> {
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        if let Some(pos) = find(&buf, b"\r\n\r\n") {
            break pos;
        }
        if buf.len() > MAX_HEAD {
            return Err(invalid("request head too large"));
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    };
    let head = String::from_utf8_lossy(buf.get(..head_end).unwrap_or_default()).into_owned();
    let mut rest = buf.get(head_end + 4..).unwrap_or_default().to_vec();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(invalid("malformed request line"));
    };
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
        None => (target.to_owned(), None),
    };
    let chunked = headers
        .get("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        read_chunked(stream, rest).await?
    } else {
        let length: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if length > MAX_BODY {
            return Err(invalid("request body too large"));
        }
        while rest.len() < length {
            let mut chunk = [0u8; 8192];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(invalid("connection closed inside the body"));
            }
            rest.extend_from_slice(chunk.get(..n).unwrap_or_default());
        }
        rest.truncate(length);
        rest
    };
    Ok(Some(Incoming {
        method: method.to_ascii_uppercase(),
        path,
        query,
        headers,
        body,
    }))
}

async fn read_chunked(stream: &mut TcpStream, mut buf: Vec<u8>) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(pos) = find(&buf, b"\r\n") {
                break pos;
            }
            fill(stream, &mut buf).await?;
        };
        let size_text = String::from_utf8_lossy(buf.get(..line_end).unwrap_or_default())
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        let size =
            usize::from_str_radix(&size_text, 16).map_err(|_| invalid("malformed chunk size"))?;
        buf.drain(..line_end + 2);
        if body.len() + size > MAX_BODY {
            return Err(invalid("request body too large"));
        }
        while buf.len() < size + 2 {
            fill(stream, &mut buf).await?;
        }
        body.extend_from_slice(buf.get(..size).unwrap_or_default());
        buf.drain(..size + 2);
        if size == 0 {
            return Ok(body);
        }
    }
}

async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = [0u8; 8192];
    let n = stream.read(&mut chunk).await?;
    if n == 0 {
        return Err(invalid("connection closed inside a chunked body"));
    }
    buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    Ok(())
}

async fn write_response(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    headers: &BTreeMap<String, String>,
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
         connection: close\r\nserver: skulk-fixture-server\r\n",
        reason(status),
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.flush().await?;
    stream.shutdown().await
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::path::Path;

    use super::*;
    use crate::fixture_client::http_request;

    /// Serves `script` in-process on a free loopback port.
    async fn start(script: &str) -> SocketAddr {
        let script = Script::parse(script, Path::new("."), &BTreeMap::new()).expect("script");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, script));
        addr
    }

    fn client() -> reqwest::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client")
    }

    #[tokio::test]
    async fn sequences_advance_the_last_repeats_and_requests_are_recorded() {
        let addr = start(
            r#"{"routes": [
                {"method": "GET", "path": "/state",
                 "responses": [{"body": "one"}, {"body": "two", "repeat": 2}, {"status": 503, "body": "last"}]},
                {"method": "POST", "path": "/instance", "responses": [{"action": "drop-after-read"}]}
            ]}"#,
        )
        .await;
        let c = client();
        let mut seen = Vec::new();
        for _ in 0..6 {
            let r = c
                .get(format!("http://{addr}/state?x=1"))
                .bearer_auth("tok")
                .send()
                .await
                .expect("answer");
            seen.push(format!(
                "{} {}",
                r.status().as_u16(),
                r.text().await.expect("body")
            ));
        }
        assert_eq!(
            seen,
            [
                "200 one", "200 two", "200 two", "503 last", "503 last", "503 last"
            ]
        );
        let lost = c
            .post(format!("http://{addr}/instance"))
            .body(r#"{"instance": 1}"#)
            .send()
            .await;
        assert!(lost.is_err(), "the connection closes without an answer");
        let missing = c
            .get(format!("http://{addr}/models/requirements"))
            .send()
            .await
            .expect("answer");
        assert_eq!(missing.status().as_u16(), 404);
        assert_eq!(
            missing.text().await.expect("body"),
            r#"{"detail":"Not Found"}"#
        );

        let recorded = tokio::task::spawn_blocking(move || {
            let (status, body) = http_request(addr, "GET", "/__requests").expect("requests");
            assert_eq!(status, 200);
            serde_json::from_str::<Vec<RecordedRequest>>(&body).expect("json")
        })
        .await
        .expect("joined");
        assert_eq!(recorded.len(), 8);
        assert_eq!(recorded[0].query.as_deref(), Some("x=1"));
        assert_eq!(recorded[0].authorization.as_deref(), Some("Bearer tok"));
        assert_eq!(recorded[0].route, Some(0));
        let post = &recorded[6];
        assert!(post.is("POST", "/instance"));
        assert_eq!(post.body, r#"{"instance": 1}"#);
        assert_eq!(post.served, "drop-after-read");
        assert_eq!(post.authorization, None);
        assert_eq!(recorded[7].served, "fallback 404");
        assert_eq!(recorded[7].route, None);

        // reset: recordings forgotten, sequences restart
        let (status, _) =
            tokio::task::spawn_blocking(move || http_request(addr, "POST", "/__reset"))
                .await
                .expect("joined")
                .expect("reset");
        assert_eq!(status, 204);
        let again = c
            .get(format!("http://{addr}/state"))
            .send()
            .await
            .expect("answer");
        assert_eq!(again.text().await.expect("body"), "one");
    }

    #[tokio::test]
    async fn chunked_request_bodies_are_read_whole() {
        let addr = start(r#"{"routes": []}"#).await;
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(
                b"POST /x HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n\
                  4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\n\r\n",
            )
            .await
            .expect("write");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("read");
        assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 404 Not Found\r\n"));
        let recorded = tokio::task::spawn_blocking(move || {
            http_request(addr, "GET", "/__requests")
                .expect("requests")
                .1
        })
        .await
        .expect("joined");
        let recorded: Vec<RecordedRequest> = serde_json::from_str(&recorded).expect("json");
        assert_eq!(recorded[0].body, "abcdefg");
    }
}
