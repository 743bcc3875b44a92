//! Sending a scaled slice through a real router by timestamp, measuring each request at
//! the client.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};

use crate::ScaledTrace;

/// How long the client waits for the last answer after the last arrival.
const DRAIN: Duration = Duration::from_secs(600);

/// Before the first arrival, so every request is built and every task waiting.
const LEAD: Duration = Duration::from_millis(300);

/// How long a refused request's client waits before sending it again (den's
/// `Retry-After`, and the simulated client's wait, `den_fleet::replay`).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the client saw of one request.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Measured {
    /// Request sent → first streamed token, ms.
    pub client_ttft_ms: Option<f64>,
    /// How late the client sent it after its scaled arrival, ms (client load).
    pub send_lag_ms: f64,
    /// The router's measured TTFT (its decision record: first delta − submission), ms.
    pub router_ttft_ms: Option<f64>,
    /// The router's predicted TTFT for the attempt that served the request, counted
    /// from the router's taking it: the prediction made at the offer plus the time it
    /// waited in the router for KV pages before that ([`Measured::router_waited_ms`]), ms.
    pub router_predicted_ttft_ms: Option<f64>,
    /// How long the router held it for KV pages no worker had free, ms.
    pub router_waited_ms: f64,
    pub worker: Option<String>,
    pub tier: Option<String>,
    pub cached_tokens: Option<u32>,
    /// Prompt tokens the router received.
    pub prompt_tokens: Option<u32>,
    /// Tokens generated.
    pub output_tokens: u32,
    /// Offers made (1 unless a worker declined or timed out), in the request that
    /// was served.
    pub attempts: usize,
    /// Times the router refused the request (no worker could hold it) before it was
    /// served; the client sent it again a second after each.
    pub refusals: u32,
    /// First send → the send of the submission that was served, ms (0 unless refused):
    /// the router's prediction is that submission's.
    pub served_sent_ms: f64,
    pub error: Option<String>,
}

/// Replays every request of `slice` through the router at `router` (`http://host:port`):
/// request `i` is sent `arrival_us` after the start. Requests are *submitted* in slice
/// order — the next one is sent once the router answered the previous one's headers,
/// which it does right after submitting it — so requests with the same arrival (the
/// trace has bursts at the same millisecond) reach the router in the simulator's order;
/// each response is then read concurrently. Results in slice order; a request that
/// failed or got no answer carries `error`.
///
/// `vocab`: a real model's vocabulary; prompt ids are the expansion's modulo it.
pub async fn replay(router: &str, slice: &ScaledTrace, vocab: Option<u32>) -> Vec<Measured> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = match reqwest::Client::builder().tcp_nodelay(true).build() {
        Ok(c) => c,
        Err(e) => {
            let error = format!("cannot build an HTTP client: {e}");
            return slice
                .requests
                .iter()
                .map(|_| Measured {
                    error: Some(error.clone()),
                    ..Measured::default()
                })
                .collect();
        }
    };
    let url = format!("{}/v1/generate", router.trim_end_matches('/'));
    let bodies: Vec<Value> = slice
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut tokens = slice.tokens(i);
            if let Some(v) = vocab {
                tokens.iter_mut().for_each(|t| *t %= v.max(1));
            }
            json!({
                "id": format!("validate-{i}"),
                "tokens": tokens,
                "max_new_tokens": r.output_tokens,
                "deadline_ms": DRAIN.as_millis() as u64,
            })
        })
        .collect();
    let start = tokio::time::Instant::now() + LEAD;
    let last = slice.requests.last().map_or(0, |r| r.arrival_us);
    let deadline = start + Duration::from_micros(last) + DRAIN;
    let mut tasks = Vec::with_capacity(bodies.len());
    for (i, (r, mut body)) in slice.requests.iter().zip(bodies).enumerate() {
        let at = start + Duration::from_micros(r.arrival_us);
        tokio::time::sleep_until(at).await;
        let lag = tokio::time::Instant::now().saturating_duration_since(at);
        let t0 = Instant::now();
        let (client, url) = (client.clone(), url.clone());
        let post = move |body: &Value| {
            client
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(body).unwrap_or_default())
                .send()
        };
        let sent = tokio::time::timeout_at(deadline, post(&body)).await;
        tasks.push(tokio::spawn(async move {
            let mut sent = sent;
            let mut refusals = 0u32;
            let mut served_sent_ms = 0.0;
            let result = loop {
                let outcome = match sent {
                    Ok(Ok(resp)) => read(resp, t0).await,
                    Ok(Err(e)) => Err(Failed::Other(format!("request failed: {e}"))),
                    Err(_) => Err(Failed::Other("the router did not answer".to_owned())),
                };
                match outcome {
                    // As the simulated client does (and den's 503 asks): the same
                    // request again after `Retry-After`, its TTFT still counted from
                    // the first send. A new id: the refused one is the router's record.
                    Err(Failed::Refused(_))
                        if tokio::time::Instant::now() + RETRY_AFTER < deadline =>
                    {
                        refusals += 1;
                        tokio::time::sleep(RETRY_AFTER).await;
                        body["id"] = json!(format!("validate-{i}-retry-{refusals}"));
                        served_sent_ms = t0.elapsed().as_secs_f64() * 1e3;
                        sent = tokio::time::timeout_at(deadline, post(&body)).await;
                    }
                    other => break other.map_err(Failed::message),
                }
            };
            let mut m = result.unwrap_or_else(|e| Measured {
                error: Some(e),
                ..Measured::default()
            });
            m.send_lag_ms = lag.as_secs_f64() * 1e3;
            m.refusals = refusals;
            m.served_sent_ms = served_sent_ms;
            m
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        let abort = task.abort_handle();
        out.push(match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => Measured {
                error: Some(format!("the request task failed: {e}")),
                ..Measured::default()
            },
            Err(_) => {
                abort.abort();
                Measured {
                    error: Some(format!(
                        "no answer within {} s of the last arrival",
                        DRAIN.as_secs()
                    )),
                    ..Measured::default()
                }
            }
        });
    }
    out
}

/// Reads one response sent at `t0`: the measurement, or a one-line error.
async fn read(resp: reqwest::Response, t0: Instant) -> Result<Measured, Failed> {
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let message = format!("{status}: {}", text.trim());
        return Err(if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            Failed::Refused(message)
        } else {
            Failed::Other(message)
        });
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut first: Option<f64> = None;
    let mut output = 0u32;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| Failed::Other(format!("stream failed: {e}")))?;
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let v: Value = serde_json::from_slice(&line)
                .map_err(|e| Failed::Other(format!("bad line: {e}")))?;
            match v["type"].as_str() {
                Some("delta") => {
                    first.get_or_insert_with(|| t0.elapsed().as_secs_f64() * 1e3);
                    output += 1;
                }
                Some("completed") => {
                    let number = |k: &str| v[k].as_f64();
                    let count = |k: &str| v[k].as_u64().and_then(|n| u32::try_from(n).ok());
                    let waited = number("waited_ms").unwrap_or(0.0);
                    return Ok(Measured {
                        client_ttft_ms: first,
                        router_ttft_ms: number("ttft_ms"),
                        router_predicted_ttft_ms: number("predicted_ttft_ms").map(|p| p + waited),
                        router_waited_ms: waited,
                        worker: v["worker"].as_str().map(str::to_owned),
                        tier: v["tier"].as_str().map(str::to_owned),
                        cached_tokens: count("cached_tokens"),
                        prompt_tokens: count("prompt_tokens"),
                        output_tokens: output,
                        attempts: v["attempts"].as_array().map_or(0, Vec::len),
                        ..Measured::default()
                    });
                }
                Some("error") => {
                    let message = v["message"].as_str().unwrap_or("error").to_owned();
                    return Err(if v["error"]["kind"] == "no-feasible-worker" {
                        Failed::Refused(message)
                    } else {
                        Failed::Other(message)
                    });
                }
                Some("cancelled") => return Err(Failed::Other("cancelled".into())),
                _ => {}
            }
        }
    }
    Err(Failed::Other(
        "the stream ended without a terminal line".into(),
    ))
}

/// How a request failed: refused (no worker could hold it now; the client may send it
/// again), or anything else (final).
#[derive(Debug)]
enum Failed {
    Refused(String),
    Other(String),
}

impl Failed {
    fn message(self) -> String {
        match self {
            Failed::Refused(m) | Failed::Other(m) => m,
        }
    }
}
