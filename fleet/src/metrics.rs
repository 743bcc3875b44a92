//! What a run measured, per policy, and the comparison table.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::cache::TierTraffic;
use super::cost::CostModel;
use super::trace::TraceSummary;

/// TTFT distribution in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Latency {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Latency {
    /// From samples in microseconds (nearest-rank percentiles).
    pub fn from_us(samples: &[u64]) -> Latency {
        if samples.is_empty() {
            return Latency::default();
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        let ms = |v: u64| v as f64 / 1000.0;
        let rank = |q: f64| {
            let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
            s.get(i).copied().map_or(0.0, ms)
        };
        let sum: u128 = s.iter().map(|&v| v as u128).sum();
        Latency {
            mean: sum as f64 / s.len() as f64 / 1000.0,
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: s.last().copied().map_or(0.0, ms),
        }
    }
}

/// Completed work per second of simulated time (first arrival to last completion).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Throughput {
    pub makespan_s: f64,
    pub requests_per_s: f64,
    pub prompt_tokens_per_s: f64,
    pub output_tokens_per_s: f64,
}

/// Reused prompt tokens by the tier they came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TierTokens {
    pub gpu: u64,
    pub ram: u64,
    pub ssd: u64,
    pub object: u64,
}

impl TierTokens {
    pub fn total(&self) -> u64 {
        self.gpu + self.ram + self.ssd + self.object
    }
}

/// How evenly the work spread over workers.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Spread {
    pub requests_per_worker: Vec<u32>,
    /// Busiest worker's requests / mean requests per worker.
    pub requests_max_over_mean: f64,
    /// Busiest worker's GPU busy time / mean busy time.
    pub busy_max_over_mean: f64,
    /// Coefficient of variation of GPU busy time across workers.
    pub busy_cov: f64,
}

impl Spread {
    pub fn new(requests: Vec<u32>, busy_us: &[u64]) -> Spread {
        let req: Vec<f64> = requests.iter().map(|&r| r as f64).collect();
        let busy: Vec<f64> = busy_us.iter().map(|&b| b as f64).collect();
        Spread {
            requests_max_over_mean: max_over_mean(&req),
            busy_max_over_mean: max_over_mean(&busy),
            busy_cov: cov(&busy),
            requests_per_worker: requests,
        }
    }
}

/// One policy's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyReport {
    pub policy: String,
    pub workers: usize,
    pub requests: usize,
    pub ttft_ms: Latency,
    pub throughput: Throughput,
    /// Reused prompt tokens / prompt tokens.
    pub prefix_hit_rate: f64,
    pub prompt_tokens: u64,
    pub reused_tokens: TierTokens,
    pub tokens_recomputed: u64,
    /// Bytes moved between tiers and evictions per tier, summed over workers.
    pub tiers: TierTraffic,
    pub load_spread: Spread,
    /// Admissions over pool capacity on an otherwise idle worker (should stay ~0).
    pub overcommits: u64,
    /// How well the policy's own TTFT predictions matched (policies that predict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Prediction>,
    /// Requests the policy refused at least once (den: no worker could hold them), each
    /// retried by its client after the router's `Retry-After`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refused_requests: u64,
    /// Refusals in all (a request refused twice counts twice).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub client_retries: u64,
    /// Requests still refused after [`crate::replay::MAX_CLIENT_RETRIES`] retries, then
    /// sent to the worker with the fewest requests in flight (should stay 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gave_up: u64,
    /// Requests the policy held until a worker had the KV pages for them (den's router
    /// keeps them FCFS instead of refusing them), and the mean wait of those, ms.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waited_requests: u64,
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub mean_wait_ms: f64,
}

fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// Predicted vs measured TTFT over the requests a policy predicted.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Prediction {
    pub requests: usize,
    /// Mean of measured − predicted, ms (positive: the policy was optimistic).
    pub mean_error_ms: f64,
    /// Mean |measured − predicted|, ms.
    pub mean_abs_error_ms: f64,
    /// Share of requests measured within ±25% (or ±50 ms) of the prediction.
    pub within_25pct: f64,
}

impl Prediction {
    /// From per-request predictions (ms) and measurements (µs); `None` if nothing was
    /// predicted.
    pub fn new(predicted_ms: &[Option<f64>], measured_us: &[u64]) -> Option<Prediction> {
        let mut n = 0usize;
        let (mut err, mut abs, mut close) = (0.0, 0.0, 0usize);
        for (p, &m) in predicted_ms.iter().zip(measured_us) {
            let Some(p) = *p else { continue };
            let m = m as f64 / 1000.0;
            n += 1;
            err += m - p;
            abs += (m - p).abs();
            if (m - p).abs() <= (0.25 * p).max(50.0) {
                close += 1;
            }
        }
        (n > 0).then(|| Prediction {
            requests: n,
            mean_error_ms: err / n as f64,
            mean_abs_error_ms: abs / n as f64,
            within_25pct: close as f64 / n as f64,
        })
    }
}

/// All policies on one trace and fleet size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetReport {
    pub trace: TraceSummary,
    pub workers: usize,
    pub cost: CostModel,
    /// Mean TTFT no policy can beat on this trace and cost model, ms: every request
    /// served alone on an idle worker (in its engine's steps), reusing everything an infinite cache shared by all
    /// workers would hold, with no load or restore time.
    pub ttft_lower_bound_ms: f64,
    pub policies: Vec<PolicyReport>,
}

impl FleetReport {
    /// den's mean TTFT advantage over the best other policy (`best_mean / den_mean`), when
    /// both ran.
    pub fn den_speedup(&self) -> Option<(String, f64)> {
        let den = self.policies.iter().find(|p| p.policy == "den")?;
        let best = self
            .policies
            .iter()
            .filter(|p| p.policy != "den")
            .min_by(|a, b| a.ttft_ms.mean.total_cmp(&b.ttft_ms.mean))?;
        (den.ttft_ms.mean > 0.0)
            .then(|| (best.policy.clone(), best.ttft_ms.mean / den.ttft_ms.mean))
    }

    /// The comparison as a fixed-width text table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let t = &self.trace;
        let _ = writeln!(
            out,
            "{} requests over {:.0} s (mean prompt {:.0}, output {:.0} tokens; ideal hit rate {:.1}%), {} workers, {} on {}",
            t.requests,
            t.duration_s,
            t.mean_input_tokens,
            t.mean_output_tokens,
            t.ideal_hit_rate * 100.0,
            self.workers,
            self.cost.model,
            self.cost.gpu
        );
        let _ = writeln!(
            out,
            "{:<13} {:>8} {:>8} {:>9} {:>6} {:>7} {:>6} {:>8} {:>25} {:>7} {:>7} {:>7} {:>7} {:>7} {:>17} {:>11}",
            "policy",
            "TTFT ms",
            "p50",
            "p99",
            "req/s",
            "out t/s",
            "hit%",
            "recomp",
            "reuse gpu/ram/ssd/obj %",
            "ram>gpu",
            "ssd rd",
            "obj rd",
            "obj wr",
            "gpu>ram",
            "evict gpu/ram/ssd",
            "spread req/busy",
        );
        let _ = writeln!(
            out,
            "{:<13} {:>8} {:>8} {:>9} {:>6} {:>7} {:>6} {:>8} {:>25} {:>7} {:>7} {:>7} {:>7} {:>7} {:>17} {:>11}",
            "",
            "mean",
            "",
            "",
            "",
            "",
            "",
            "Mtok",
            "",
            "GB",
            "GB",
            "GB",
            "GB",
            "GB",
            "k blocks",
            "max/mean"
        );
        for p in &self.policies {
            let r = &p.reused_tokens;
            let pct = |x: u64| {
                if p.prompt_tokens == 0 {
                    0.0
                } else {
                    x as f64 * 100.0 / p.prompt_tokens as f64
                }
            };
            let gb = |b: u64| b as f64 / 1e9;
            let k = |n: u64| n as f64 / 1e3;
            let _ = writeln!(
                out,
                "{:<13} {:>8.0} {:>8.0} {:>9.0} {:>6.2} {:>7.0} {:>6.1} {:>8.1} {:>25} {:>7.0} {:>7.0} {:>7.0} {:>7.0} {:>7.0} {:>17} {:>11}",
                p.policy,
                p.ttft_ms.mean,
                p.ttft_ms.p50,
                p.ttft_ms.p99,
                p.throughput.requests_per_s,
                p.throughput.output_tokens_per_s,
                p.prefix_hit_rate * 100.0,
                p.tokens_recomputed as f64 / 1e6,
                format!(
                    "{:.1}/{:.1}/{:.1}/{:.1}",
                    pct(r.gpu),
                    pct(r.ram),
                    pct(r.ssd),
                    pct(r.object)
                ),
                gb(p.tiers.ram_to_gpu_bytes),
                gb(p.tiers.ssd_read_bytes),
                gb(p.tiers.object_read_bytes),
                gb(p.tiers.object_write_bytes),
                gb(p.tiers.gpu_to_ram_bytes),
                format!(
                    "{:.1}/{:.1}/{:.1}",
                    k(p.tiers.gpu_evictions),
                    k(p.tiers.ram_evictions),
                    k(p.tiers.ssd_evictions)
                ),
                format!(
                    "{:.2}/{:.2}",
                    p.load_spread.requests_max_over_mean, p.load_spread.busy_max_over_mean
                ),
            );
        }
        for p in &self.policies {
            if p.waited_requests > 0 {
                let _ = writeln!(
                    out,
                    "{}: {} requests waited in the router for KV pages, {:.0} ms on average",
                    p.policy, p.waited_requests, p.mean_wait_ms
                );
            }
            if p.client_retries > 0 {
                let _ = writeln!(
                    out,
                    "{}: {} requests refused for want of KV pages and retried by their clients after the router's Retry-After ({} retries, {} still refused then sent to the least-loaded worker)",
                    p.policy, p.refused_requests, p.client_retries, p.gave_up
                );
            }
            if let Some(q) = &p.prediction {
                let _ = writeln!(
                    out,
                    "{} TTFT prediction: mean error {:+.0} ms, mean |error| {:.0} ms, {:.0}% within ±25%",
                    p.policy,
                    q.mean_error_ms,
                    q.mean_abs_error_ms,
                    q.within_25pct * 100.0
                );
            }
        }
        let _ = writeln!(
            out,
            "lower bound (each request alone on an idle worker, ideal reuse, free loads): {:.0} ms mean",
            self.ttft_lower_bound_ms
        );
        if let Some((best, x)) = self.den_speedup() {
            let best_mean = self
                .policies
                .iter()
                .find(|p| p.policy == best)
                .map_or(0.0, |p| p.ttft_ms.mean);
            let ceiling = if self.ttft_lower_bound_ms > 0.0 {
                best_mean / self.ttft_lower_bound_ms
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "den mean TTFT vs best other policy ({best}): {x:.2}x lower (the bound allows at most {ceiling:.2}x)"
            );
        }
        out
    }
}

fn max_over_mean(v: &[f64]) -> f64 {
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let max = v.iter().copied().fold(0.0, f64::max);
    if mean > 0.0 { max / mean } else { 0.0 }
}

fn cov(v: &[f64]) -> f64 {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    if mean <= 0.0 {
        return 0.0;
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    var.sqrt() / mean
}
