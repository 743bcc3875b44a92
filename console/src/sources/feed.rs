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
    if url.starts_with("wss:") {
        return Err("TLS feeds (https routers) are not supported by this build: use http on a trusted network or a tunnel".to_owned());
    }
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
    let connecting = tokio_tungstenite::connect_async_with_config(request, Some(config), true);
    match tokio::time::timeout(timeout, connecting).await {
        Err(_) => Err(format!("{}: timed out connecting", redact(url))),
        Ok(Err(e)) => Err(format!("{}: {}", redact(url), one_line(&e.to_string()))),
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
    use super::*;

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
