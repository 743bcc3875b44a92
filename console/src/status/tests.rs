//! `den status` and the non-interactive commands against an in-process server that
//! replays the Skulk 1.3.0 captures and speaks the den console feed (until the
//! den-tests fixture server lands, this stands in for it).

use std::sync::Arc;
use std::time::Duration;

use futures_util::SinkExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use den_protocol::feed::{self, FEED_VERSION, FeedMessage};
use den_protocol::session::SourceKind;

use super::*;
use crate::config::SourceSpec;
use crate::fixtures::{self, ALPHA, BRAVO};

const TOKEN: &str = "s3cret";

/// What the fake server answers.
#[derive(Clone)]
struct Fake {
    token: Option<&'static str>,
    state: Arc<String>,
    node: &'static str,
    feed: Option<Arc<Vec<String>>>,
    delete_status: u16,
}

impl Fake {
    fn skulk() -> Fake {
        let path = fixtures::skulk_fixture_dir().join("derived/state_two_nodes_running.json");
        Fake {
            token: None,
            state: Arc::new(std::fs::read_to_string(path).expect("fixture")),
            node: ALPHA,
            feed: None,
            delete_status: 200,
        }
    }

    fn router() -> Fake {
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

async fn serve(fake: Fake) -> String {
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

fn settings(sources: Vec<SourceSpec>, token: Option<&str>) -> Settings {
    Settings {
        sources,
        token: token.map(str::to_owned),
        theme: "dark".into(),
        read_only: false,
        record: None,
        no_record: true,
        poll_interval: Duration::from_millis(200),
        request_timeout: Duration::from_secs(2),
        stale_after_ms: 10_000,
    }
}

fn skulk(id: &str, url: &str) -> SourceSpec {
    SourceSpec {
        id: id.into(),
        kind: SourceKind::Skulk,
        url: url.to_owned(),
    }
}

#[tokio::test]
async fn status_against_the_skulk_captures_reports_nodes_downloads_and_verdicts() {
    crate::http::install_crypto_provider();
    let url = serve(Fake::skulk()).await;
    let g = gather(
        &settings(vec![skulk("mgmt", &url)], None),
        Duration::from_secs(5),
    )
    .await
    .expect("gather");
    assert_eq!(exit_code(&g), 0, "{:?}", g.problems);
    let json: serde_json::Value = serde_json::from_str(&snapshot_json(&g, true)).expect("json");
    assert_eq!(json["complete"], true);
    let nodes: Vec<&str> = json["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["node"].as_str())
        .collect();
    assert_eq!(nodes, [ALPHA, BRAVO]);
    assert_eq!(json["nodes"][0]["identity"]["state"], "bound");
    assert_eq!(json["downloads"].as_array().map(Vec::len), Some(5));
    let verdicts: Vec<&str> = json["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .filter(|r| r["row"] == "instance")
        .filter_map(|r| r["verdict"]["kind"].as_str())
        .collect();
    // one instance has all evidence but no probe; the other is still downloading
    assert_eq!(verdicts, ["unprobed", "not ready"]);
    let text = snapshot_text(&g);
    assert!(text.contains("INSTANCES (2)"), "{text}");
    assert!(text.contains("No space left on device"), "{text}");
}

#[tokio::test]
async fn a_router_source_uses_its_token_for_feed_and_api() {
    crate::http::install_crypto_provider();
    let url = serve(Fake::router()).await;
    let router = SourceSpec {
        id: "router".into(),
        kind: SourceKind::DenRouter,
        url: url.clone(),
    };
    let g = gather(
        &settings(vec![router.clone()], Some(TOKEN)),
        Duration::from_secs(5),
    )
    .await
    .expect("gather");
    assert_eq!(exit_code(&g), 0, "{:?}", g.problems);
    assert_eq!(g.model.routes().len(), 5);
    assert_eq!(g.model.views().pages.len(), 2);
    let json = snapshot_json(&g, true);
    assert!(!json.contains(TOKEN));

    // without the token neither the API nor the feed answers: a failure, exit 1
    let g = gather(&settings(vec![router], None), Duration::from_secs(3))
        .await
        .expect("gather");
    assert_eq!(exit_code(&g), 1);
    let why = g.problems.get(&SourceId::from("router")).expect("problem");
    assert!(why.contains("401"), "{why}");
}

#[tokio::test]
async fn an_unreachable_source_makes_the_snapshot_partial() {
    crate::http::install_crypto_provider();
    let url = serve(Fake::skulk()).await;
    let sources = vec![skulk("mgmt", &url), skulk("gone", "http://127.0.0.1:9")];
    let g = gather(&settings(sources, None), Duration::from_secs(5))
        .await
        .expect("gather");
    assert_eq!(exit_code(&g), 2);
    assert_eq!(
        g.answered.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        ["mgmt"]
    );
    assert!(
        g.problems
            .get(&SourceId::from("gone"))
            .is_some_and(|p| p.contains("GET /state"))
    );
    let json: serde_json::Value = serde_json::from_str(&snapshot_json(&g, false)).expect("json");
    assert_eq!(json["complete"], false);
    assert!(
        gather(&settings(vec![], None), Duration::from_secs(1))
            .await
            .is_err()
    );
}

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
        code(command(&settings(vec![skulk("m", &ok)], None), delete(), false).await),
        code(ExitCode::from(0))
    );
    assert_eq!(
        code(command(&settings(vec![skulk("m", &missing)], None), delete(), false).await),
        code(ExitCode::from(1))
    );
    let mut read_only = settings(vec![skulk("m", &ok)], None);
    read_only.read_only = true;
    assert_eq!(
        code(command(&read_only, delete(), false).await),
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
        code(command(&settings(vec![router], Some(TOKEN)), cancel, true).await),
        code(ExitCode::from(0))
    );
}

/// A Skulk `/state` needs no den token: names in it must not reach the operator's
/// terminal as control sequences (OSC 52 writes the clipboard, CSI 2J clears the screen)
/// or forge lines with a newline.
#[tokio::test]
async fn status_text_strips_escape_sequences_from_network_names() {
    crate::http::install_crypto_provider();
    let mut fake = Fake::skulk();
    let hostile = (*fake.state)
        .replace(
            "\"friendlyName\": \"alpha\"",
            "\"friendlyName\": \"al\\u001b]52;c;ZXZpbA==\\u0007pha\\u001b[2J\"",
        )
        .replace(
            "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
            "mlx-community/Meta\\nFORGED LINE\\u001b]0;owned\\u0007",
        );
    assert_ne!(
        hostile, *fake.state,
        "the fixture has the fields this test poisons"
    );
    fake.state = Arc::new(hostile);
    let url = serve(fake).await;
    let g = gather(
        &settings(vec![skulk("mgmt", &url)], None),
        Duration::from_secs(5),
    )
    .await
    .expect("gather");
    let text = snapshot_text(&g);
    assert!(text.contains("NODES"), "{text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("FORGED")),
        "a newline in a model name became a line of its own: {text}"
    );
}

/// A `/state` larger than den reads is refused with one line, not buffered whole.
#[tokio::test]
async fn an_oversized_state_is_refused_not_read_whole() {
    crate::http::install_crypto_provider();
    let mut fake = Fake::skulk();
    let mut huge = String::with_capacity(crate::http::MAX_RESPONSE_BYTES + 16);
    huge.push_str("{\"pad\":\"");
    huge.push_str(&"x".repeat(crate::http::MAX_RESPONSE_BYTES));
    huge.push_str("\"}");
    fake.state = Arc::new(huge);
    let url = serve(fake).await;
    let g = gather(
        &settings(vec![skulk("mgmt", &url)], None),
        Duration::from_secs(20),
    )
    .await
    .expect("gather");
    assert_eq!(exit_code(&g), 1, "{:?}", g.problems);
    let problems = join_problems(&g.problems);
    assert!(problems.contains("refusing to read it"), "{problems}");
}
