//! The HTTP client for management APIs (Skulk 1.3.0 or a den router).
//!
//! Every request has a bounded deadline. Credentials are scoped to the configured origin:
//! paths are joined onto the base URL (an absolute URL in a path is refused), redirects
//! are never followed, and the `Authorization` header is only ever attached to requests
//! built here for that origin — so a token cannot leak to another host.

use std::fmt;
use std::time::{Duration, Instant};

use reqwest::Url;
use serde::de::DeserializeOwned;

use den_protocol::placement::TransportFailure;
use den_protocol::skulk::error::ApiError;
use den_protocol::skulk::{HttpIntent, Method};

/// Default per-request deadline.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A configured management endpoint.
#[derive(Clone)]
pub struct ManagementClient {
    base: Url,
    client: reqwest::Client,
    token: Option<String>,
    timeout: Duration,
}

impl fmt::Debug for ManagementClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagementClient")
            .field("base", &self.base.as_str())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// What came back from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    pub status: u16,
    pub body: String,
    pub latency: Duration,
}

/// Why a typed GET failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Transport(String),
    #[error("{0}")]
    Api(ApiError),
    #[error("unexpected response from {path}: {detail}")]
    Decode { path: String, detail: String },
}

/// A base URL or path that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("invalid management URL {0:?}: expected http://HOST:PORT or https://HOST:PORT")]
    Base(String),
    #[error("refusing path {0:?}: only paths on the configured origin are requested")]
    Path(String),
}

impl ManagementClient {
    /// A client for `base` (e.g. `http://127.0.0.1:52415`), sending `token` as a bearer
    /// token to that origin only, with `timeout` per request.
    pub fn new(base: &str, token: Option<String>, timeout: Duration) -> Result<Self, UrlError> {
        let mut url = Url::parse(base).map_err(|_| UrlError::Base(base.to_owned()))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(UrlError::Base(base.to_owned()));
        }
        if !url.path().ends_with('/') {
            let path = format!("{}/", url.path());
            url.set_path(&path);
        }
        install_crypto_provider();
        let client = reqwest::Client::builder()
            // The system's roots plus --ca-cert's (den_agent::tls::trust_also).
            .tls_certs_merge(den_agent::tls::reqwest_roots())
            .redirect(reqwest::redirect::Policy::none())
            // A proxy is another origin: the bearer token must never travel through one.
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(3)))
            .build()
            .map_err(|_| UrlError::Base(base.to_owned()))?;
        Ok(ManagementClient {
            base: url,
            client,
            token: token.filter(|t| !t.is_empty()),
            timeout,
        })
    }

    /// The deadline of each request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The bearer token (for a second client to the same origin only).
    pub(crate) fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The origin requests go to, e.g. `http://127.0.0.1:52415`.
    pub fn origin(&self) -> String {
        self.base.origin().ascii_serialization()
    }

    /// The base URL as configured (with a trailing slash).
    pub fn base(&self) -> &str {
        self.base.as_str()
    }

    /// The absolute URL of `path` on this origin.
    pub fn url(&self, path: &str) -> Result<Url, UrlError> {
        let rel = path.trim_start_matches('/');
        if rel.contains("://") || path.starts_with("//") {
            return Err(UrlError::Path(path.to_owned()));
        }
        let url = self
            .base
            .join(rel)
            .map_err(|_| UrlError::Path(path.to_owned()))?;
        if url.origin() != self.base.origin() {
            return Err(UrlError::Path(path.to_owned()));
        }
        Ok(url)
    }

    /// Perform an intent. Any HTTP status is an answer; only transport problems are
    /// failures, with `sent` false exactly when the request cannot have reached the server.
    pub async fn execute(&self, intent: &HttpIntent) -> Result<HttpAnswer, TransportFailure> {
        self.send(intent, None).await
    }

    /// [`Self::execute`] with another deadline for this one request (an inference probe
    /// may take longer than a state read).
    pub async fn execute_within(
        &self,
        intent: &HttpIntent,
        timeout: Duration,
    ) -> Result<HttpAnswer, TransportFailure> {
        self.send(intent, Some(timeout)).await
    }

    async fn send(
        &self,
        intent: &HttpIntent,
        timeout: Option<Duration>,
    ) -> Result<HttpAnswer, TransportFailure> {
        let mut url = self.url(&intent.path).map_err(|e| TransportFailure {
            sent: false,
            detail: e.to_string(),
        })?;
        if !intent.query.is_empty() {
            let mut q = url.query_pairs_mut();
            for (k, v) in &intent.query {
                q.append_pair(k, v);
            }
        }
        let method = match intent.method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Delete => reqwest::Method::DELETE,
        };
        let mut req = self.client.request(method, url);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = &intent.body {
            req = req.json(body);
        }
        if let Some(timeout) = timeout {
            req = req.timeout(timeout);
        }
        let started = Instant::now();
        let resp = req
            .send()
            .await
            .map_err(|e| transport_failure(&self.origin(), &e))?;
        let status = resp.status().as_u16();
        let body = read_capped(resp, &self.origin()).await?;
        Ok(HttpAnswer {
            status,
            body,
            latency: started.elapsed(),
        })
    }

    /// GET `path` and decode a 2xx JSON body into `T`; other statuses become [`ApiError`].
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<(T, Duration), ClientError> {
        let answer = self
            .execute(&HttpIntent::get(path))
            .await
            .map_err(|f| ClientError::Transport(f.detail))?;
        if !(200..300).contains(&answer.status) {
            return Err(ClientError::Api(ApiError::from_response(
                answer.status,
                &answer.body,
            )));
        }
        let value = serde_json::from_str(&answer.body).map_err(|e| ClientError::Decode {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
        Ok((value, answer.latency))
    }
}

/// reqwest is built without a default TLS crypto provider; install ring once.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn transport_failure(origin: &str, e: &reqwest::Error) -> TransportFailure {
    // A connect error means nothing was sent; anything later (timeout, reset, broken
    // body) may have reached the server and must be reconciled, not retried.
    let sent = !e.is_connect() && !e.is_builder();
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "connection failed"
    };
    TransportFailure {
        sent,
        detail: den_agent::tls::explain_trust(format!("{origin}: {what} ({})", one_line(e))),
    }
}

fn one_line(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s.replace('\n', " ")
}

/// Largest response body den reads from a source. Skulk's `/state` for a large cluster
/// is a few megabytes; a peer that sends more is refused rather than allowed to grow the
/// console's memory without bound.
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// The body, at most [`MAX_RESPONSE_BYTES`] of it, read chunk by chunk (the
/// `Content-Length` is not trusted).
async fn read_capped(
    mut resp: reqwest::Response,
    origin: &str,
) -> Result<String, TransportFailure> {
    let too_large = || TransportFailure {
        sent: true,
        detail: format!(
            "{origin} answered with more than {} MiB: refusing to read it",
            MAX_RESPONSE_BYTES >> 20
        ),
    };
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_RESPONSE_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| transport_failure(origin, &e))?
    {
        if bytes.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_on_the_configured_origin() {
        let c = ManagementClient::new("http://127.0.0.1:52415", Some("t".into()), DEFAULT_TIMEOUT)
            .unwrap();
        assert_eq!(
            c.url("/state").unwrap().as_str(),
            "http://127.0.0.1:52415/state"
        );
        assert!(c.url("http://evil.example/state").is_err());
        assert!(c.url("//evil.example/state").is_err());
        let prefixed = ManagementClient::new("http://h:1/api", None, DEFAULT_TIMEOUT).unwrap();
        assert_eq!(
            prefixed.url("/state").unwrap().as_str(),
            "http://h:1/api/state"
        );
        assert!(ManagementClient::new("ftp://h", None, DEFAULT_TIMEOUT).is_err());
        assert!(ManagementClient::new("not a url", None, DEFAULT_TIMEOUT).is_err());
        assert!(!format!("{c:?}").contains("\"t\""));
    }

    #[tokio::test]
    async fn refused_connection_is_not_sent() {
        // Port 9 (discard) on loopback is closed on test machines.
        let c = ManagementClient::new("http://127.0.0.1:9", None, Duration::from_secs(2)).unwrap();
        let err = c.execute(&HttpIntent::get("/state")).await.unwrap_err();
        assert!(!err.sent, "{err:?}");
    }
}
