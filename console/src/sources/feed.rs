//! The den console feed over a WebSocket, with reconnection.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use den_protocol::feed::{self, FeedError, MAX_FEED_FRAME};
use den_protocol::session::{SessionEvent, SourceId};

/// First reconnection delay; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// `ws(s)://HOST:PORT/PREFIX/v1/console` of a router base URL.
pub fn feed_url(base: &str) -> Option<String> {
    let mut url = reqwest::Url::parse(base).ok()?;
    let scheme = match url.scheme() {
        "http" => "ws",
        "https" => "wss",
        _ => return None,
    };
    url.set_scheme(scheme).ok()?;
    let path = format!("{}/v1/console", url.path().trim_end_matches('/'));
    url.set_path(&path);
    url.set_query(None);
    Some(url.to_string())
}

/// Keep a feed connection to `url` until the receiver goes away.
pub async fn run(
    source: SourceId,
    url: String,
    token: Option<String>,
    connect_timeout: Duration,
    tx: mpsc::Sender<SessionEvent>,
) {
    let mut backoff = MIN_BACKOFF;
    // Report a failure to connect once per outage, not once per retry.
    let mut reported_down = false;
    loop {
        let reason = match connect(&url, token.as_deref(), connect_timeout).await {
            Err(reason) => reason,
            Ok(mut ws) => {
                backoff = MIN_BACKOFF;
                reported_down = false;
                if tx
                    .send(SessionEvent::Connected {
                        source: source.clone(),
                    })
                    .await
                    .is_err()
                {
                    return;
                }
                let reason = loop {
                    let bytes = match ws.next().await {
                        None => break "closed by the router".to_owned(),
                        Some(Err(e)) => break one_line(&e.to_string()),
                        Some(Ok(Message::Text(t))) => t.as_bytes().to_vec(),
                        Some(Ok(Message::Binary(b))) => b.to_vec(),
                        Some(Ok(Message::Close(_))) => break "closed by the router".to_owned(),
                        Some(Ok(_)) => continue,
                    };
                    match feed::decode(&bytes, MAX_FEED_FRAME) {
                        Ok(message) => {
                            let event = SessionEvent::Feed {
                                source: source.clone(),
                                message,
                            };
                            if tx.send(event).await.is_err() {
                                return;
                            }
                        }
                        // A newer router: no point retrying quickly.
                        Err(e @ FeedError::UnsupportedVersion { .. }) => {
                            backoff = MAX_BACKOFF;
                            break e.to_string();
                        }
                        Err(e) => break e.to_string(),
                    }
                };
                let _ = ws.close(None).await;
                reason
            }
        };
        if !reported_down {
            reported_down = true;
            let event = SessionEvent::Disconnected {
                source: source.clone(),
                reason,
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(url: &str, token: Option<&str>, timeout: Duration) -> Result<Socket, String> {
    let mut request = url
        .into_client_request()
        .map_err(|e| format!("invalid feed URL {url}: {e}"))?;
    if let Some(token) = token {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "the token contains characters a header cannot carry".to_owned())?;
        request.headers_mut().insert("authorization", value);
    }
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_FEED_FRAME))
        .max_frame_size(Some(MAX_FEED_FRAME));
    let connector = den_agent::tls::ws_connector(url)?;
    let connecting =
        tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, connector);
    match tokio::time::timeout(timeout, connecting).await {
        Err(_) => Err(format!("{}: timed out connecting", redact(url))),
        Ok(Err(e)) => Err(format!(
            "{}: {}",
            redact(url),
            one_line(&den_agent::tls::explain_ws_error(&e))
        )),
        Ok(Ok((ws, _response))) => Ok(ws),
    }
}

fn redact(url: &str) -> String {
    den_protocol::session::redact_url(url)
}

fn one_line(s: &str) -> String {
    den_protocol::skulk::common::one_line(s)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures_util::SinkExt;
    use tokio::net::TcpListener;
    use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};

    use den_protocol::feed::{FEED_VERSION, FeedMessage};

    use super::*;

    fn hello() -> String {
        feed::encode(&FeedMessage::Hello {
            feed_version: FEED_VERSION,
            router: "r1".into(),
            started_at_unix_ms: 0,
        })
    }

    /// Accepts connections that carry the bearer token; the first one is closed right
    /// after its hello (the router "restarts"), later ones stay open.
    async fn flaky_router(token: &'static str) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                // The callback's signature is tungstenite's.
                #[allow(clippy::result_large_err)]
                let check = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
                    let auth = req
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok());
                    if auth == Some(&format!("Bearer {token}")) {
                        Ok(resp)
                    } else {
                        let mut refusal = ErrorResponse::new(Some("no token".into()));
                        *refusal.status_mut() =
                            tokio_tungstenite::tungstenite::http::StatusCode::UNAUTHORIZED;
                        Err(refusal)
                    }
                };
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, check).await else {
                    continue;
                };
                let n = count.fetch_add(1, Ordering::SeqCst);
                let _ = ws.send(Message::text(hello())).await;
                if n == 0 {
                    let _ = ws.close(None).await;
                } else {
                    tokio::spawn(async move { while ws.next().await.is_some() {} });
                }
            }
        });
        (format!("ws://{addr}/v1/console"), accepted)
    }

    async fn next(rx: &mut mpsc::Receiver<SessionEvent>) -> SessionEvent {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("an event in time")
            .expect("channel open")
    }

    #[tokio::test]
    async fn a_lost_feed_reports_disconnected_and_reconnects_with_the_token() {
        let (url, accepted) = flaky_router("tok").await;
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(run(
            "router".into(),
            url,
            Some("tok".into()),
            Duration::from_secs(2),
            tx,
        ));
        assert!(matches!(
            next(&mut rx).await,
            SessionEvent::Connected { .. }
        ));
        assert!(matches!(
            next(&mut rx).await,
            SessionEvent::Feed {
                message: FeedMessage::Hello { .. },
                ..
            }
        ));
        assert!(matches!(
            next(&mut rx).await,
            SessionEvent::Disconnected { .. }
        ));
        assert!(matches!(
            next(&mut rx).await,
            SessionEvent::Connected { .. }
        ));
        assert!(matches!(
            next(&mut rx).await,
            SessionEvent::Feed {
                message: FeedMessage::Hello { .. },
                ..
            }
        ));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        task.abort();
    }

    #[tokio::test]
    async fn a_refused_token_is_one_disconnected_event_per_outage() {
        let (url, accepted) = flaky_router("tok").await;
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(run(
            "router".into(),
            url,
            Some("wrong".into()),
            Duration::from_secs(2),
            tx,
        ));
        match next(&mut rx).await {
            SessionEvent::Disconnected { reason, .. } => {
                assert!(reason.contains("401"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // retries keep failing quietly
        assert!(
            tokio::time::timeout(Duration::from_millis(800), rx.recv())
                .await
                .is_err()
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 0);
        task.abort();
    }

    #[test]
    fn feed_urls_follow_the_router_base() {
        assert_eq!(
            feed_url("http://r:7000").as_deref(),
            Some("ws://r:7000/v1/console")
        );
        assert_eq!(
            feed_url("https://r/den/").as_deref(),
            Some("wss://r/den/v1/console")
        );
        assert_eq!(feed_url("ftp://r"), None);
    }
}
