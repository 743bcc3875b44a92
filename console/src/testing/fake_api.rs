//! An in-process stand-in for a management API and a den router's console feed: it
//! replays the Skulk 1.3.0 captures, answers the commands' endpoints and streams feed
//! frames, so `den status` and the one-shot commands are tested without the den-tests
//! fixture server.

use std::sync::Arc;
use std::time::Duration;

use futures_util::SinkExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use den_protocol::feed::{self, FEED_VERSION, FeedMessage};
use den_protocol::session::SourceKind;
use den_protocol::time::Millis;

use crate::config::{Settings, SourceSpec};
use crate::fixtures::{self, ALPHA, BRAVO};

pub const TOKEN: &str = "s3cret";

/// What the fake server answers.
#[derive(Clone)]
pub struct Fake {
    pub token: Option<&'static str>,
    pub state: Arc<String>,
    pub node: &'static str,
    pub feed: Option<Arc<Vec<String>>>,
    pub delete_status: u16,
}

impl Fake {
    pub fn skulk() -> Fake {
        let path = fixtures::skulk_fixture_dir().join("derived/state_two_nodes_running.json");
        Fake {
            token: None,
            state: Arc::new(std::fs::read_to_string(path).expect("fixture")),
            node: ALPHA,
            feed: None,
            delete_status: 200,
        }
    }

    pub fn router() -> Fake {
        let frames = vec![
            feed::encode(&FeedMessage::Hello {
                feed_version: FEED_VERSION,
                router: "den-router-1".into(),
                started_at_unix_ms: 0,
            }),
            feed::encode(&FeedMessage::Snapshot {
                at: Millis(5),
                workers: vec![
                    fixtures::observation("gpu-a", ALPHA, 4096, 40, 1),
                    fixtures::observation("gpu-b", BRAVO, 4096, 70, 1),
                ],
                routes: fixtures::sim_records().expect("records"),
            }),
        ];
        Fake {
            token: Some(TOKEN),
            feed: Some(Arc::new(frames)),
            ..Fake::skulk()
        }
    }
}

pub async fn serve(fake: Fake) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(handle(stream, fake.clone()));
        }
    });
    format!("http://{addr}")
}

async fn handle(mut stream: TcpStream, fake: Fake) {
    // Peek at the request head so that a WebSocket upgrade can still be accepted.
    let mut buf = vec![0u8; 8192];
    let head = loop {
        let Ok(n) = stream.peek(&mut buf).await else {
            return;
        };
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        if text.contains("\r\n\r\n") || n == buf.len() {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let mut lines = head.lines();
    let first = lines.next().unwrap_or_default().to_owned();
    let mut parts = first.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let authorized = fake.token.is_none_or(|t| {
        head.lines().any(|l| {
            l.to_ascii_lowercase() == format!("authorization: bearer {}", t.to_ascii_lowercase())
        })
    });
    if path == "/v1/console"
        && authorized
        && let Some(frames) = &fake.feed
    {
        let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
            return;
        };
        for frame in frames.iter() {
            if ws.send(Message::text(frame.clone())).await.is_err() {
                return;
            }
        }
        // Stay connected until the console goes away.
        let _ = futures_util::StreamExt::next(&mut ws).await;
        return;
    }
    let end = head.find("\r\n\r\n").map_or(head.len(), |i| i + 4);
    let mut consumed = vec![0u8; end];
    let _ = stream.read_exact(&mut consumed).await;
    let (status, body) = match (method.as_str(), path.as_str()) {
        _ if !authorized => (401, r#"{"detail":"Not authenticated"}"#.to_owned()),
        ("GET", "/node_id") => (200, format!("\"{}\"", fake.node)),
        ("GET", "/state") => (200, fake.state.to_string()),
        ("DELETE", p) if p.starts_with("/instance/") => (
            fake.delete_status,
            if fake.delete_status == 200 {
                r#"{"message":"Command received.","command_id":"c1","instance_id":"x"}"#.to_owned()
            } else {
                r#"{"detail":"Instance not found"}"#.to_owned()
            },
        ),
        ("POST", p) if p.starts_with("/v1/requests/") && p.ends_with("/cancel") => {
            (202, "{}".to_owned())
        }
        _ => (404, r#"{"detail":"Not Found"}"#.to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

pub fn settings(sources: Vec<SourceSpec>, token: Option<&str>) -> Settings {
    Settings {
        sources,
        token: token.map(str::to_owned),
        ca_cert: None,
        theme: "dark".into(),
        read_only: false,
        record: None,
        no_record: true,
        poll_interval: Duration::from_millis(200),
        request_timeout: Duration::from_secs(2),
        stale_after_ms: 10_000,
    }
}

pub fn skulk(id: &str, url: &str) -> SourceSpec {
    SourceSpec {
        id: id.into(),
        kind: SourceKind::Skulk,
        url: url.to_owned(),
    }
}
