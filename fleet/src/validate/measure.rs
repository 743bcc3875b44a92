//! Sending a scaled slice through a real router by timestamp, measuring each request at
//! the client.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};

use crate::{ScaledTrace, SyntheticEngine, SyntheticProfile};
use den_protocol::candidate::Tier;
use den_protocol::engine_plan::StepCosts;
use den_protocol::observation::Observation;

/// How long the client waits for the last answer after the last arrival.
const DRAIN: Duration = Duration::from_secs(600);

/// Before the first arrival, so every request is built and every task waiting.
const LEAD: Duration = Duration::from_millis(300);

/// How often the workers' measured costs are sampled through a real-model run.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What the client saw of one request.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Measured {
    /// Request sent → first streamed token, ms.
    pub client_ttft_ms: Option<f64>,
    /// How late the client sent it after its scaled arrival, ms (client load).
    pub send_lag_ms: f64,
    /// The router's measured TTFT (its decision record: first delta − submission), ms.
    pub router_ttft_ms: Option<f64>,
    /// The router's predicted TTFT for the attempt that served the request, ms.
    pub router_predicted_ttft_ms: Option<f64>,
    pub worker: Option<String>,
    pub tier: Option<String>,
    pub cached_tokens: Option<u32>,
    /// Prompt tokens the router received.
    pub prompt_tokens: Option<u32>,
    /// Tokens generated.
    pub output_tokens: u32,
    /// Offers made (1 unless a worker declined or timed out).
    pub attempts: usize,
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
    let bodies: Vec<Vec<u8>> = slice
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut tokens = slice.tokens(i);
            if let Some(v) = vocab {
                tokens.iter_mut().for_each(|t| *t %= v.max(1));
            }
            let body = json!({
                "id": format!("validate-{i}"),
                "tokens": tokens,
                "max_new_tokens": r.output_tokens,
                "deadline_ms": DRAIN.as_millis() as u64,
            });
            serde_json::to_vec(&body).unwrap_or_default()
        })
        .collect();
    let start = tokio::time::Instant::now() + LEAD;
    let last = slice.requests.last().map_or(0, |r| r.arrival_us);
    let deadline = start + Duration::from_micros(last) + DRAIN;
    let mut tasks = Vec::with_capacity(bodies.len());
    for (r, body) in slice.requests.iter().zip(bodies) {
        let at = start + Duration::from_micros(r.arrival_us);
        tokio::time::sleep_until(at).await;
        let lag = tokio::time::Instant::now().saturating_duration_since(at);
        let t0 = Instant::now();
        let sent = client
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send();
        let sent = tokio::time::timeout_at(deadline, sent).await;
        tasks.push(tokio::spawn(async move {
            let result = match sent {
                Ok(Ok(resp)) => read(resp, t0).await,
                Ok(Err(e)) => Err(format!("request failed: {e}")),
                Err(_) => Err("the router did not answer".to_owned()),
            };
            let mut m = result.unwrap_or_else(|e| Measured {
                error: Some(e),
                ..Measured::default()
            });
            m.send_lag_ms = lag.as_secs_f64() * 1e3;
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

/// What one worker measured of its own costs (its last heartbeat), against which the
/// profile's declared costs can be read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerCalibration {
    pub worker: String,
    /// Measured prefill cost per token (EWMA), ms.
    pub prefill_ms_per_token: f64,
    /// Measured first-token cost (EWMA), ms.
    pub first_token_ms: f64,
    /// Measured RAM-tier read throughput, bytes/ms (absent before the first read).
    pub ram_read_bytes_per_ms: Option<f64>,
    /// Measured host → page upload throughput, bytes/ms.
    pub upload_bytes_per_ms: f64,
}

/// The workers' last heartbeats as the router holds them (empty when unreachable).
pub async fn observations(router: &str) -> Vec<Observation> {
    let url = format!("{}/v1/workers", router.trim_end_matches('/'));
    let Ok(resp) = reqwest::get(&url).await else {
        return Vec::new();
    };
    resp.json().await.unwrap_or_default()
}

/// Every second until aborted, the workers' heartbeats that carry measured step costs,
/// appended to `into` (the fits of a whole run, `measured_profile`'s input).
pub async fn sample_observations(router: String, into: Arc<Mutex<Vec<Observation>>>) {
    loop {
        tokio::time::sleep(SAMPLE_EVERY).await;
        let now: Vec<Observation> = observations(&router)
            .await
            .into_iter()
            .filter(|o| {
                o.engine
                    .as_ref()
                    .is_some_and(|e| matches!(e.costs, StepCosts::Fitted { .. }))
            })
            .collect();
        if let Ok(mut v) = into.lock() {
            v.extend(now);
        }
    }
}

/// What each worker reports of its own costs.
pub fn calibration(observations: &[Observation]) -> Vec<WorkerCalibration> {
    observations
        .iter()
        .map(|o| WorkerCalibration {
            worker: o.worker_id.to_string(),
            prefill_ms_per_token: o.prefill_ms_per_token,
            first_token_ms: o.first_token_ms,
            ram_read_bytes_per_ms: o
                .tier_throughput_bytes_per_ms
                .get(&den_protocol::candidate::Tier::Ram)
                .copied(),
            upload_bytes_per_ms: o.gpu_restore_bytes_per_ms,
        })
        .collect()
}

/// `base` with what real-model workers measured and reported in their heartbeats: their
/// step costs (the mean of each term over the workers, which run the same model on the
/// same host), their pool (pages, page size, bytes per KV row) and their restore rate
/// (RAM-tier read then upload into pages, one after the other). The simulator's fleet
/// of identical workers then models these workers instead of the synthetic profile.
/// Errors when a worker has published no measured steps yet.
pub fn measured_profile(
    base: &SyntheticProfile,
    observations: &[Observation],
) -> Result<SyntheticProfile, String> {
    if observations.is_empty() {
        return Err("no worker observation to read measured costs from".into());
    }
    let mut sum = [0.0f64; 4];
    let mut batch_tokens = u32::MAX;
    for o in observations {
        let plan = o.engine.as_ref().ok_or_else(|| {
            format!(
                "worker {} published no engine plan: it has measured no steps",
                o.worker_id
            )
        })?;
        let StepCosts::Fitted {
            step_us,
            row_us,
            attention_us_per_position,
            context_us_per_token,
        } = plan.costs
        else {
            return Err(format!(
                "worker {} publishes declared step costs, not measured ones: is it running a model?",
                o.worker_id
            ));
        };
        for (s, v) in sum.iter_mut().zip([
            step_us,
            row_us,
            attention_us_per_position,
            context_us_per_token,
        ]) {
            *s += v;
        }
        batch_tokens = batch_tokens.min(plan.max_batched_tokens.max(1));
    }
    let n = observations.len() as f64;
    let [
        step_us,
        row_us,
        attention_us_per_position,
        context_us_per_token,
    ] = sum.map(|s| s / n);
    let pages = observations
        .iter()
        .map(|o| o.pool.total_pages)
        .min()
        .unwrap_or(base.pages);
    let page_size = observations[0].page_size.max(1);
    let kv_bytes_per_token = (observations[0].pool.page_bytes / page_size as u64).max(1);
    let rates: Vec<f64> = observations
        .iter()
        .filter_map(|o| {
            let read = *o.tier_throughput_bytes_per_ms.get(&Tier::Ram)?;
            let upload = o.gpu_restore_bytes_per_ms;
            (read > 0.0 && upload > 0.0).then(|| 1e3 / (1.0 / read + 1.0 / upload))
        })
        .collect();
    let restore_bytes_per_s = if rates.is_empty() {
        base.restore_bytes_per_s
    } else {
        rates.iter().sum::<f64>() / rates.len() as f64
    };
    let costs = StepCosts::Fitted {
        step_us,
        row_us,
        attention_us_per_position,
        context_us_per_token,
    };
    // The declared fields, read from the fit (what the study's older estimates read).
    let engine = SyntheticEngine::measured(costs, base.restore_chunk_ms, base.capture_bytes_per_s);
    Ok(SyntheticProfile {
        prefill_ms_per_token: engine.prefill_ms_per_token,
        first_token_ms: engine.first_token_ms,
        decode_ms_per_token: engine.decode_ms_per_token,
        pages,
        page_size,
        kv_bytes_per_token,
        batch_tokens: if batch_tokens == u32::MAX {
            base.batch_tokens
        } else {
            batch_tokens
        },
        restore_bytes_per_s,
        measured: Some(costs),
        ..base.clone()
    })
}

/// Reads one response sent at `t0`: the measurement, or a one-line error.
async fn read(resp: reqwest::Response, t0: Instant) -> Result<Measured, String> {
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        return Err(format!("{status}: {}", text.trim()));
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut first: Option<f64> = None;
    let mut output = 0u32;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("stream failed: {e}"))?;
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let v: Value = serde_json::from_slice(&line).map_err(|e| format!("bad line: {e}"))?;
            match v["type"].as_str() {
                Some("delta") => {
                    first.get_or_insert_with(|| t0.elapsed().as_secs_f64() * 1e3);
                    output += 1;
                }
                Some("completed") => {
                    let number = |k: &str| v[k].as_f64();
                    let count = |k: &str| v[k].as_u64().and_then(|n| u32::try_from(n).ok());
                    return Ok(Measured {
                        client_ttft_ms: first,
                        router_ttft_ms: number("ttft_ms"),
                        router_predicted_ttft_ms: number("predicted_ttft_ms"),
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
                    return Err(v["message"].as_str().unwrap_or("error").to_owned());
                }
                Some("cancelled") => return Err("cancelled".into()),
                _ => {}
            }
        }
    }
    Err("the stream ended without a terminal line".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use den_protocol::engine_plan::EnginePlan;

    fn fitted(step_us: f64, row_us: f64) -> StepCosts {
        StepCosts::Fitted {
            step_us,
            row_us,
            attention_us_per_position: 8.0,
            context_us_per_token: 0.5,
        }
    }

    fn worker(id: &str, costs: StepCosts, pages: u32) -> Observation {
        let mut o = Observation::new(id, "n");
        o.engine = Some(EnginePlan::idle(64, costs));
        o.pool.total_pages = pages;
        o.pool.page_bytes = 16 * 23_040;
        o.tier_throughput_bytes_per_ms.insert(Tier::Ram, 1e6);
        o.gpu_restore_bytes_per_ms = 4e6;
        o
    }

    #[test]
    fn the_simulated_workers_take_what_the_real_ones_measured() {
        let base = SyntheticProfile::validation(32);
        let obs = [
            worker("a", fitted(60_000.0, 2_000.0), 256),
            worker("b", fitted(70_000.0, 3_000.0), 200),
        ];
        let p = measured_profile(&base, &obs).unwrap();
        assert_eq!(p.measured, Some(fitted(65_000.0, 2_500.0)));
        assert_eq!(
            (p.pages, p.page_size, p.kv_bytes_per_token),
            (200, 16, 23_040)
        );
        assert_eq!(p.batch_tokens, 64);
        // A RAM read at 1 GB/s, then an upload at 4 GB/s: 0.8 GB/s end to end.
        assert!((p.restore_bytes_per_s - 0.8e9).abs() < 1.0);
        assert_eq!(p.chunk_tokens, 32);
        // The simulator's steps cost the fit: 65 ms + 10 rows of 2.5 ms + 8 µs × 45
        // positions.
        let cost = p.cost_model();
        assert_eq!(cost.step_us(10, 45.0, 0, 0), 65_000 + 25_000 + 360);
        assert_eq!(cost.prompt_rows(10), 9);
        assert!((cost.first_token_ms() - 67.5).abs() < 1e-9);
    }

    #[test]
    fn a_worker_without_measured_steps_is_an_error_naming_it() {
        let base = SyntheticProfile::validation(32);
        let declared = StepCosts::Synthetic {
            prefill_us_per_token: 100.0,
            decode_us_per_step: 2_000.0,
            first_token_us: 5_000.0,
        };
        let obs = [
            worker("a", fitted(1.0, 1.0), 10),
            worker("w-synth", declared, 10),
        ];
        let e = measured_profile(&base, &obs).unwrap_err();
        assert!(e.contains("w-synth") && e.contains("declared"), "{e}");
        let mut silent = Observation::new("w-quiet", "n");
        silent.engine = None;
        let e = measured_profile(&base, &[silent]).unwrap_err();
        assert!(e.contains("w-quiet"), "{e}");
        assert!(measured_profile(&base, &[]).is_err());
    }
}
