//! A synthetic workload with shared prefixes, sent through a router's `POST /v1/generate`:
//! a few system prompts shared by many conversations, each conversation growing turn by
//! turn (the next prompt is the previous prompt, the model's answer and a new user
//! message). That is the traffic a prefix cache exists for: the system prompt is reused
//! across conversations and a conversation's history across its turns.
//!
//! [`run`] measures TTFT at the client (request sent → first streamed token) and reads
//! cached tokens, the serving worker and the cache tier from each completion;
//! [`WorkloadReport::summary`] prints TTFT (mean, p50, p99) and cache-hit statistics.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::engine::WORDS;

/// The shape of the traffic.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    /// Stop issuing requests after this long.
    pub duration: Duration,
    /// Stop after this many requests (whichever comes first).
    pub requests: Option<usize>,
    /// Conversations in flight at once.
    pub concurrency: usize,
    /// Distinct system prompts shared by all conversations.
    pub system_prompts: usize,
    pub system_tokens: usize,
    /// Tokens of each user message.
    pub turn_tokens: usize,
    /// Turns per conversation before a new one starts.
    pub turns: usize,
    pub max_new_tokens: u32,
    /// Model to name (`None`: the router picks the only one served).
    pub model: Option<String>,
    pub seed: u64,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            duration: Duration::from_secs(10),
            requests: None,
            concurrency: 6,
            system_prompts: 3,
            system_tokens: 384,
            turn_tokens: 48,
            turns: 4,
            max_new_tokens: 16,
            model: None,
            seed: 1,
        }
    }
}

/// One completed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub ttft_ms: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub tier: String,
    pub worker: String,
    pub attempts: usize,
}

/// What a workload run measured.
#[derive(Debug, Clone, Default)]
pub struct WorkloadReport {
    pub samples: Vec<Sample>,
    /// Failed requests by error message.
    pub errors: BTreeMap<String, usize>,
    pub elapsed: Duration,
}

impl WorkloadReport {
    pub fn completed(&self) -> usize {
        self.samples.len()
    }

    pub fn failed(&self) -> usize {
        self.errors.values().sum()
    }

    /// TTFT quantile `q` in [0, 1] (nearest rank), ms.
    pub fn ttft_quantile(&self, q: f64) -> Option<f64> {
        let mut v: Vec<f64> = self.samples.iter().map(|s| s.ttft_ms).collect();
        quantile(&mut v, q)
    }

    pub fn ttft_mean(&self) -> Option<f64> {
        let n = self.samples.len();
        (n > 0).then(|| self.samples.iter().map(|s| s.ttft_ms).sum::<f64>() / n as f64)
    }

    /// Cached prompt tokens / prompt tokens over every completed request.
    pub fn cached_fraction(&self) -> f64 {
        let prompt: u64 = self.samples.iter().map(|s| s.prompt_tokens).sum();
        let cached: u64 = self.samples.iter().map(|s| s.cached_tokens).sum();
        if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        }
    }

    /// Requests by the tier their cache hit came from ("none" = recomputed).
    pub fn by_tier(&self) -> BTreeMap<String, (usize, u64)> {
        let mut out: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        for s in &self.samples {
            let e = out.entry(s.tier.clone()).or_default();
            e.0 += 1;
            e.1 += s.cached_tokens;
        }
        out
    }

    /// TTFT quantiles of the requests that hit a cache and of those that did not.
    pub fn ttft_by_hit(&self) -> (Option<f64>, Option<f64>) {
        let mut hit: Vec<f64> = Vec::new();
        let mut miss: Vec<f64> = Vec::new();
        for s in &self.samples {
            if s.cached_tokens > 0 {
                hit.push(s.ttft_ms);
            } else {
                miss.push(s.ttft_ms);
            }
        }
        (quantile(&mut hit, 0.5), quantile(&mut miss, 0.5))
    }

    /// A printable summary.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let _ = writeln!(
            s,
            "requests: {} completed, {} failed in {:.1} s ({:.1} req/s)",
            self.completed(),
            self.failed(),
            secs,
            self.completed() as f64 / secs
        );
        let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.1}"));
        let _ = writeln!(
            s,
            "TTFT ms: mean {}  p50 {}  p99 {}",
            f(self.ttft_mean()),
            f(self.ttft_quantile(0.5)),
            f(self.ttft_quantile(0.99))
        );
        let (hit, miss) = self.ttft_by_hit();
        let _ = writeln!(s, "TTFT p50 ms: cache hit {}  miss {}", f(hit), f(miss));
        let prompt: u64 = self.samples.iter().map(|s| s.prompt_tokens).sum();
        let cached: u64 = self.samples.iter().map(|s| s.cached_tokens).sum();
        let _ = writeln!(
            s,
            "cache: {cached} of {prompt} prompt tokens reused ({:.1} %)",
            100.0 * self.cached_fraction()
        );
        for (tier, (n, tokens)) in self.by_tier() {
            let _ = writeln!(
                s,
                "  tier {tier:<6} {n:>5} requests  {tokens:>8} cached tokens"
            );
        }
        let mut workers: BTreeMap<&str, usize> = BTreeMap::new();
        for x in &self.samples {
            *workers.entry(x.worker.as_str()).or_default() += 1;
        }
        let list: Vec<String> = workers.iter().map(|(w, n)| format!("{w} {n}")).collect();
        let _ = writeln!(s, "served by: {}", list.join(", "));
        for (e, n) in &self.errors {
            let _ = writeln!(s, "error ×{n}: {e}");
        }
        s
    }
}

/// The `q` quantile of `v` (sorted in place) by nearest rank; `None` when empty.
pub fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v.get(rank - 1).copied()
}

/// Run `spec` against the router at `router` (`http://host:port`).
pub async fn run(router: &str, token: Option<&str>, spec: &WorkloadSpec) -> WorkloadReport {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let issued = Arc::new(AtomicUsize::new(0));
    let next_conversation = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = start + spec.duration;
    let mut tasks = Vec::new();
    for _ in 0..spec.concurrency.max(1) {
        let client = client.clone();
        let url = format!("{}/v1/generate", router.trim_end_matches('/'));
        let token = token.map(str::to_owned);
        let spec = spec.clone();
        let issued = Arc::clone(&issued);
        let next_conversation = Arc::clone(&next_conversation);
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut errors: BTreeMap<String, usize> = BTreeMap::new();
            'conversations: loop {
                let k = next_conversation.fetch_add(1, Ordering::Relaxed);
                let system = system_prompt(&spec, k % spec.system_prompts.max(1));
                let mut history: Vec<u32> = Vec::new();
                for turn in 0..spec.turns.max(1) {
                    if Instant::now() >= deadline {
                        break 'conversations;
                    }
                    let n = issued.fetch_add(1, Ordering::Relaxed);
                    if spec.requests.is_some_and(|max| n >= max) {
                        break 'conversations;
                    }
                    let user = tokens(
                        spec.seed ^ 0xC0FFEE,
                        (k * 1000 + turn) as u64,
                        spec.turn_tokens,
                    );
                    history.extend(&user);
                    let prompt: Vec<u32> = system.iter().chain(&history).copied().collect();
                    match generate(&client, &url, token.as_deref(), &spec, &prompt).await {
                        Ok((sample, output)) => {
                            history.extend(output);
                            samples.push(sample);
                        }
                        Err(e) => {
                            *errors.entry(e).or_default() += 1;
                            continue 'conversations;
                        }
                    }
                }
            }
            (samples, errors)
        }));
    }
    let mut report = WorkloadReport::default();
    for t in tasks {
        if let Ok((samples, errors)) = t.await {
            report.samples.extend(samples);
            for (e, n) in errors {
                *report.errors.entry(e).or_default() += n;
            }
        }
    }
    report.elapsed = start.elapsed();
    report
}

/// One request; the sample and the generated tokens, or a one-line error.
async fn generate(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    spec: &WorkloadSpec,
    prompt: &[u32],
) -> Result<(Sample, Vec<u32>), String> {
    let mut body = json!({"tokens": prompt, "max_new_tokens": spec.max_new_tokens});
    if let Some(m) = &spec.model {
        body["model"] = json!(m);
    }
    let mut req = client.post(url).json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let t0 = Instant::now();
    let resp = req
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        return Err(format!("{status}: {}", text.trim()));
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut first: Option<f64> = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("stream failed: {e}"))?;
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let v: Value = serde_json::from_slice(&line).map_err(|e| format!("bad line: {e}"))?;
            match v["type"].as_str() {
                Some("delta") => {
                    first.get_or_insert_with(|| t0.elapsed().as_secs_f64() * 1e3);
                }
                Some("completed") => {
                    let output: Vec<u32> = v["tokens"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|t| t.as_u64().map(|t| t as u32))
                                .collect()
                        })
                        .unwrap_or_default();
                    let cached = v["cached_tokens"].as_u64().unwrap_or(0);
                    let sample = Sample {
                        ttft_ms: first.unwrap_or_else(|| t0.elapsed().as_secs_f64() * 1e3),
                        prompt_tokens: (prompt.len() as u64).saturating_sub(1),
                        cached_tokens: cached,
                        tier: if cached == 0 {
                            "none".into()
                        } else {
                            v["tier"].as_str().unwrap_or("none").to_owned()
                        },
                        worker: v["worker"].as_str().unwrap_or("?").to_owned(),
                        attempts: v["attempts"].as_array().map_or(0, Vec::len),
                    };
                    return Ok((sample, output));
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

fn system_prompt(spec: &WorkloadSpec, i: usize) -> Vec<u32> {
    tokens(spec.seed, 0x5157_0000 + i as u64, spec.system_tokens)
}

/// `n` deterministic word tokens for `(seed, stream)`.
pub fn tokens(seed: u64, stream: u64, n: usize) -> Vec<u32> {
    let mut state = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let words = 2 * WORDS.len() as u64;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (256 + z % words) as u32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ttft: f64, cached: u64, tier: &str) -> Sample {
        Sample {
            ttft_ms: ttft,
            prompt_tokens: 100,
            cached_tokens: cached,
            tier: tier.into(),
            worker: "w".into(),
            attempts: 1,
        }
    }

    #[test]
    fn report_statistics() {
        let r = WorkloadReport {
            samples: vec![
                sample(100.0, 0, "none"),
                sample(10.0, 80, "gpu"),
                sample(20.0, 60, "ram"),
            ],
            errors: BTreeMap::new(),
            elapsed: Duration::from_secs(1),
        };
        assert_eq!(r.ttft_quantile(0.5), Some(20.0));
        assert_eq!(r.ttft_quantile(0.99), Some(100.0));
        assert!((r.cached_fraction() - 140.0 / 300.0).abs() < 1e-9);
        assert_eq!(r.by_tier().get("gpu"), Some(&(1, 80)));
        assert_eq!(r.ttft_by_hit(), (Some(10.0), Some(100.0)));
        let text = r.summary();
        assert!(
            text.contains("p50 20.0") && text.contains("tier gpu"),
            "{text}"
        );
    }

    #[test]
    fn tokens_are_deterministic_words() {
        let a = tokens(1, 2, 50);
        assert_eq!(a, tokens(1, 2, 50));
        assert_ne!(a, tokens(1, 3, 50));
        assert!(
            a.iter()
                .all(|t| *t >= 256 && *t < crate::engine::VOCAB_SIZE)
        );
    }
}
