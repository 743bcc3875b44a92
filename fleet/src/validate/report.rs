//! The validation report: one row per request (measured, simulated, router-predicted) and
//! the summary (relative errors, worker agreement, TTFT distributions).

use std::fmt::Write as _;

use serde::Serialize;

use crate::SyntheticProfile;
use crate::metrics::Latency;
use den_protocol::engine_plan::StepCosts;

use super::{Measured, Plan, Simulated, ValidateArgs, WorkerCalibration};

/// Everything `den-fleet validate --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct ValidationReport {
    pub trace: String,
    pub slice: SliceInfo,
    pub workers: usize,
    /// The den estimate the simulator ran (`router`, `v1` … `v6`).
    pub den: String,
    /// The router's heartbeat interval, ms.
    pub heartbeat_ms: u64,
    pub profile: SyntheticProfile,
    /// The real model the workers ran (`--model-file`); `None`: the synthetic engine
    /// with the profile's costs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_file: Option<String>,
    pub rows: Vec<Row>,
    pub summary: Summary,
    /// What each worker measured of its own costs at the end (vs the declared profile).
    pub calibration: Vec<WorkerCalibration>,
    /// Wall time of the real replay, s.
    pub wall_s: f64,
}

/// Which part of the trace ran, and how it was scaled.
#[derive(Debug, Clone, Serialize)]
pub struct SliceInfo {
    pub requests: usize,
    pub first_line: usize,
    pub last_line: usize,
    /// Trace time of the first request, s.
    pub trace_start_s: f64,
    /// First to last arrival after scaling, s.
    pub scaled_span_s: f64,
    pub time_scale: f64,
    pub length_scale: f64,
    pub block_tokens: u32,
    pub mean_prompt_tokens: f64,
    pub mean_output_tokens: f64,
}

/// One request on both sides.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub index: usize,
    pub line: usize,
    /// Scaled arrival, ms from the first (as scheduled; the simulator replays it
    /// `send_lag_ms` later, when the client really sent it).
    pub arrival_ms: f64,
    /// Prompt and output tokens the simulator replayed.
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Client-side TTFT on the real cluster, ms.
    pub measured_ttft_ms: Option<f64>,
    /// The simulator's TTFT for the request (heartbeat-lagged observations), ms.
    pub sim_ttft_ms: f64,
    /// The simulator's TTFT with current observations, ms.
    pub fresh_ttft_ms: f64,
    /// The simulator's TTFT on the real router's worker and reuse, ms.
    pub followed_ttft_ms: f64,
    /// The real router's prediction for the attempt that served it, ms.
    pub router_predicted_ttft_ms: Option<f64>,
    /// The router's own measurement (decision record), ms.
    pub router_measured_ttft_ms: Option<f64>,
    /// den's prediction inside the simulator, ms.
    pub sim_predicted_ttft_ms: Option<f64>,
    /// |sim − measured| / measured.
    pub sim_error: Option<f64>,
    /// |fresh sim − measured| / measured.
    pub fresh_error: Option<f64>,
    /// |followed sim − measured| / measured.
    pub followed_error: Option<f64>,
    /// |router predicted − measured| / measured, against the TTFT of the submission the
    /// router served (after any refusals: [`Row::served_ttft_ms`]).
    pub router_error: Option<f64>,
    /// Worker index (0-based) each side chose.
    pub real_worker: Option<usize>,
    pub sim_worker: u32,
    pub fresh_worker: u32,
    /// Reused prompt tokens each side.
    pub real_cached_tokens: Option<u32>,
    pub sim_cached_tokens: u32,
    pub real_tier: Option<String>,
    /// Prompt tokens the real router received.
    pub real_prompt_tokens: Option<u32>,
    pub real_output_tokens: u32,
    pub attempts: usize,
    /// Times the router refused it (no worker could hold it) before it was served; the
    /// client sent it again a second later each time, and its TTFT counts from the
    /// first send.
    pub refusals: u32,
    /// Client-side TTFT of the submission that was served, ms: `measured_ttft_ms` less
    /// the refusals' waits (what the router predicted; equal unless refused).
    pub served_ttft_ms: Option<f64>,
    /// How long the router held it for KV pages no worker had free, ms (the router's
    /// prediction includes it).
    #[serde(skip_serializing_if = "is_zero")]
    pub router_waited_ms: f64,
    pub send_lag_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// Relative errors of one predictor against the measurement.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Errors {
    pub requests: usize,
    /// Median of |predicted − measured| / measured.
    pub median: f64,
    pub p90: f64,
    pub mean: f64,
    /// Mean of predicted − measured, ms (negative: optimistic).
    pub mean_signed_ms: f64,
}

/// The summary over every request.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub completed: usize,
    pub failed: usize,
    /// Requests the router refused at least once, and the resends in all.
    pub refused: usize,
    pub resends: u64,
    /// Requests the router held for KV pages before offering them.
    pub waited: usize,
    /// The simulator with heartbeat-lagged observations (like den-agent's router).
    pub sim_vs_measured: Errors,
    /// The simulator with current observations (the fleet study's ideal router).
    pub fresh_vs_measured: Errors,
    /// The simulator on the real router's choices (its worker model alone).
    pub followed_vs_measured: Errors,
    pub router_vs_measured: Errors,
    /// Share of completed requests the simulator sent to the same worker as the router.
    pub worker_agreement: f64,
    pub fresh_worker_agreement: f64,
    /// Share of completed requests that reused the same number of prompt tokens.
    pub reuse_agreement: f64,
    pub measured_ttft_ms: Latency,
    pub sim_ttft_ms: Latency,
    pub fresh_ttft_ms: Latency,
    pub followed_ttft_ms: Latency,
    pub router_predicted_ttft_ms: Latency,
    /// Reused / prompt tokens, each side.
    pub measured_reuse: f64,
    pub sim_reuse: f64,
    /// Client TTFT − the router's measured TTFT, mean ms (HTTP and streaming overhead).
    pub client_overhead_ms: f64,
    pub send_lag_p99_ms: f64,
}

impl ValidationReport {
    pub fn new(
        args: &ValidateArgs,
        plan: &Plan,
        sim: &Simulated,
        measured: &[Measured],
        wall_s: f64,
    ) -> ValidationReport {
        let s = &plan.slice;
        let rows: Vec<Row> = s
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let m = measured.get(i).cloned().unwrap_or_default();
                let ms = |v: &[u64]| v.get(i).copied().unwrap_or(0) as f64 / 1e3;
                let (sim_ttft_ms, fresh_ttft_ms, followed_ttft_ms) = (
                    ms(&sim.lagged.ttft_us),
                    ms(&sim.fresh.ttft_us),
                    ms(&sim.followed.ttft_us),
                );
                let error = |p: Option<f64>| relative(p, m.client_ttft_ms);
                let served_ttft_ms = m.client_ttft_ms.map(|t| (t - m.served_sent_ms).max(0.0));
                Row {
                    index: i,
                    line: r.line,
                    arrival_ms: r.arrival_us as f64 / 1e3,
                    prompt_tokens: r.input_tokens,
                    output_tokens: r.output_tokens,
                    measured_ttft_ms: m.client_ttft_ms,
                    sim_ttft_ms,
                    fresh_ttft_ms,
                    followed_ttft_ms,
                    router_predicted_ttft_ms: m.router_predicted_ttft_ms,
                    router_measured_ttft_ms: m.router_ttft_ms,
                    sim_predicted_ttft_ms: sim.lagged.predicted_ttft_ms.get(i).copied().flatten(),
                    sim_error: error(Some(sim_ttft_ms)),
                    fresh_error: error(Some(fresh_ttft_ms)),
                    followed_error: error(Some(followed_ttft_ms)),
                    router_error: relative(m.router_predicted_ttft_ms, served_ttft_ms),
                    real_worker: m.worker.as_deref().and_then(worker_index),
                    sim_worker: sim.lagged.worker.get(i).copied().unwrap_or(0),
                    fresh_worker: sim.fresh.worker.get(i).copied().unwrap_or(0),
                    real_cached_tokens: m.cached_tokens,
                    sim_cached_tokens: sim.lagged.reused_tokens.get(i).copied().unwrap_or(0),
                    real_tier: m.tier.clone(),
                    real_prompt_tokens: m.prompt_tokens,
                    real_output_tokens: m.output_tokens,
                    attempts: m.attempts,
                    refusals: m.refusals,
                    served_ttft_ms,
                    router_waited_ms: m.router_waited_ms,
                    send_lag_ms: m.send_lag_ms,
                    error: m.error.clone().or_else(|| {
                        m.client_ttft_ms
                            .is_none()
                            .then(|| "completed without a streamed token".to_owned())
                    }),
                }
            })
            .collect();
        let summary = Summary::new(&rows);
        ValidationReport {
            trace: plan.trace_path.display().to_string(),
            slice: SliceInfo {
                requests: s.requests.len(),
                first_line: s.requests.first().map_or(0, |r| r.line),
                last_line: s.requests.last().map_or(0, |r| r.line),
                trace_start_s: s.trace_start_ms as f64 / 1e3,
                scaled_span_s: s.duration_s(),
                time_scale: s.scale.time,
                length_scale: s.scale.length,
                block_tokens: s.block_tokens,
                mean_prompt_tokens: mean(s.requests.iter().map(|r| r.input_tokens as f64)),
                mean_output_tokens: mean(s.requests.iter().map(|r| r.output_tokens as f64)),
            },
            workers: args.workers,
            model_file: plan.model.as_ref().map(|m| m.path.display().to_string()),
            den: args.den.trim().to_owned(),
            heartbeat_ms: args.heartbeat_ms,
            profile: plan.profile.clone(),
            rows,
            summary,
            calibration: Vec::new(),
            wall_s,
        }
    }

    /// The first failure, for a one-line error.
    pub fn first_error(&self) -> Option<&str> {
        self.rows.iter().find_map(|r| r.error.as_deref())
    }

    /// The report as text: the setup, the summary, optionally one line per request.
    pub fn text(&self, rows: bool) -> String {
        let mut out = String::new();
        let (s, p, m) = (&self.slice, &self.profile, &self.summary);
        let _ = writeln!(
            out,
            "den-fleet validate: {} requests of {} (lines {}–{}, from {:.1} s), time ÷{}, lengths ÷{} ({}-token blocks; mean prompt {:.0}, output {:.0} tokens), {:.1} s scaled",
            s.requests,
            self.trace,
            s.first_line,
            s.last_line,
            s.trace_start_s,
            s.time_scale,
            s.length_scale,
            s.block_tokens,
            s.mean_prompt_tokens,
            s.mean_output_tokens,
            s.scaled_span_s,
        );
        let costs = match p.measured {
            Some(StepCosts::Fitted {
                step_us,
                row_us,
                attention_us_per_position,
                context_us_per_token,
            }) => format!(
                "steps as measured: {:.1} ms + {:.3} ms/row + {:.2} µs/attention position + {:.3} µs/context token",
                step_us / 1e3,
                row_us / 1e3,
                attention_us_per_position,
                context_us_per_token
            ),
            _ => format!(
                "prefill {} ms/token, first token {} ms, decode {} ms/token",
                p.prefill_ms_per_token, p.first_token_ms, p.decode_ms_per_token
            ),
        };
        let _ = writeln!(
            out,
            "{} workers: {costs}, {} pages × {} tokens, {} B/token, RAM {} MiB, SSD {} MiB; router heartbeat {} ms; simulator: den ({})",
            self.workers,
            p.pages,
            p.page_size,
            p.kv_bytes_per_token,
            p.ram_bytes >> 20,
            p.ssd_bytes >> 20,
            self.heartbeat_ms,
            self.den,
        );
        if let Some(model) = &self.model_file {
            let _ = writeln!(
                out,
                "the workers ran the real model {model}; the router priced them by their reported engine plans, the simulator's workers cost the steps the real ones measured (above, at the end of the run)"
            );
        }
        let _ = writeln!(
            out,
            "{} completed, {} failed, {} waited in the router for KV pages, {} refused and sent again ({} resends), replayed in {:.1} s wall (client send lag p99 {:.1} ms, client − router TTFT {:+.1} ms mean)",
            m.completed,
            m.failed,
            m.waited,
            m.refused,
            m.resends,
            self.wall_s,
            m.send_lag_p99_ms,
            m.client_overhead_ms
        );
        // A rate with the bytes it was measured on; "-" where nothing moved that way.
        let rate = |v: Option<f64>, bytes: u64| {
            v.map_or("-".to_owned(), |v| {
                format!("{:.0} MB/s over {:.1} MB", v / 1e3, bytes as f64 / 1e6)
            })
        };
        for c in &self.calibration {
            let _ = writeln!(
                out,
                "  {} measured: prefill {:.4} ms/token, first token {:.2} ms, RAM reads {}, SSD reads {}, uploads {}",
                c.worker,
                c.prefill_ms_per_token,
                c.first_token_ms,
                rate(c.ram_read_bytes_per_ms, c.moved.ram_read_bytes),
                rate(c.ssd_read_bytes_per_ms, c.moved.ssd_read_bytes),
                rate(c.upload_bytes_per_ms, c.moved.upload_bytes),
            );
        }
        let _ = writeln!(
            out,
            "\n{:<26} {:>13} {:>10} {:>10} {:>14}",
            "TTFT vs measured", "median |err|", "p90 |err|", "mean |err|", "mean pred−meas"
        );
        for (name, e) in [
            ("simulator", &m.sim_vs_measured),
            ("simulator, fresh view", &m.fresh_vs_measured),
            ("simulator, router's picks", &m.followed_vs_measured),
            ("router prediction", &m.router_vs_measured),
        ] {
            let _ = writeln!(
                out,
                "{:<26} {:>12.1}% {:>9.1}% {:>9.1}% {:>+11.1} ms",
                name,
                e.median * 100.0,
                e.p90 * 100.0,
                e.mean * 100.0,
                e.mean_signed_ms
            );
        }
        let _ = writeln!(
            out,
            "\nsame worker as the real router: simulator {:.1}%, fresh view {:.1}% of requests; same reuse: {:.1}%; prompt tokens reused: measured {:.1}%, simulated {:.1}%",
            m.worker_agreement * 100.0,
            m.fresh_worker_agreement * 100.0,
            m.reuse_agreement * 100.0,
            m.measured_reuse * 100.0,
            m.sim_reuse * 100.0
        );
        let _ = writeln!(
            out,
            "\n{:<26} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "TTFT ms", "mean", "p50", "p90", "p99", "max"
        );
        for (name, l) in [
            ("measured (client)", &m.measured_ttft_ms),
            ("simulated", &m.sim_ttft_ms),
            ("simulated, fresh view", &m.fresh_ttft_ms),
            ("simulated, router's picks", &m.followed_ttft_ms),
            ("router prediction", &m.router_predicted_ttft_ms),
        ] {
            let _ = writeln!(
                out,
                "{:<26} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
                name, l.mean, l.p50, l.p90, l.p99, l.max
            );
        }
        if rows {
            let _ = writeln!(
                out,
                "\n{:>4} {:>6} {:>9} {:>6} {:>4} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>11}",
                "#",
                "line",
                "arrive ms",
                "prompt",
                "out",
                "measured",
                "sim",
                "router",
                "sim err",
                "rtr err",
                "worker r/s",
                "cached r/s"
            );
            let opt = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.1}"));
            let pct = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{:.0}%", x * 100.0));
            for r in &self.rows {
                let _ = writeln!(
                    out,
                    "{:>4} {:>6} {:>9.1} {:>6} {:>4} {:>9} {:>9.1} {:>9} {:>7} {:>7} {:>9} {:>11}",
                    r.index,
                    r.line,
                    r.arrival_ms,
                    r.prompt_tokens,
                    r.output_tokens,
                    opt(r.measured_ttft_ms),
                    r.sim_ttft_ms,
                    opt(r.router_predicted_ttft_ms),
                    pct(r.sim_error),
                    pct(r.router_error),
                    format!(
                        "{}/{}",
                        r.real_worker.map_or("-".to_owned(), |w| w.to_string()),
                        r.sim_worker
                    ),
                    format!(
                        "{}/{}",
                        r.real_cached_tokens
                            .map_or("-".to_owned(), |c| c.to_string()),
                        r.sim_cached_tokens
                    ),
                );
            }
        }
        out
    }
}

impl Summary {
    fn new(rows: &[Row]) -> Summary {
        let done: Vec<&Row> = rows
            .iter()
            .filter(|r| r.error.is_none() && r.measured_ttft_ms.is_some())
            .collect();
        let n = done.len().max(1) as f64;
        let share = |f: &dyn Fn(&Row) -> bool| done.iter().filter(|r| f(r)).count() as f64 / n;
        let us = |v: Vec<f64>| {
            let samples: Vec<u64> = v
                .iter()
                .map(|ms| (ms.max(0.0) * 1e3).round() as u64)
                .collect();
            Latency::from_us(&samples)
        };
        let measured: Vec<f64> = done.iter().filter_map(|r| r.measured_ttft_ms).collect();
        let prompt: f64 = done
            .iter()
            .map(|r| r.prompt_tokens as f64)
            .sum::<f64>()
            .max(1.0);
        Summary {
            completed: done.len(),
            failed: rows.len() - done.len(),
            refused: rows.iter().filter(|r| r.refusals > 0).count(),
            resends: rows.iter().map(|r| u64::from(r.refusals)).sum(),
            waited: rows.iter().filter(|r| r.router_waited_ms > 0.0).count(),
            sim_vs_measured: errors(
                done.iter()
                    .map(|r| (Some(r.sim_ttft_ms), r.measured_ttft_ms)),
            ),
            fresh_vs_measured: errors(
                done.iter()
                    .map(|r| (Some(r.fresh_ttft_ms), r.measured_ttft_ms)),
            ),
            followed_vs_measured: errors(
                done.iter()
                    .map(|r| (Some(r.followed_ttft_ms), r.measured_ttft_ms)),
            ),
            router_vs_measured: errors(
                done.iter()
                    .map(|r| (r.router_predicted_ttft_ms, r.served_ttft_ms)),
            ),
            worker_agreement: share(&|r| r.real_worker == Some(r.sim_worker as usize)),
            fresh_worker_agreement: share(&|r| r.real_worker == Some(r.fresh_worker as usize)),
            reuse_agreement: share(&|r| r.real_cached_tokens == Some(r.sim_cached_tokens)),
            measured_ttft_ms: us(measured),
            sim_ttft_ms: us(done.iter().map(|r| r.sim_ttft_ms).collect()),
            fresh_ttft_ms: us(done.iter().map(|r| r.fresh_ttft_ms).collect()),
            followed_ttft_ms: us(done.iter().map(|r| r.followed_ttft_ms).collect()),
            router_predicted_ttft_ms: us(done
                .iter()
                .filter_map(|r| r.router_predicted_ttft_ms)
                .collect()),
            measured_reuse: done
                .iter()
                .map(|r| r.real_cached_tokens.unwrap_or(0) as f64)
                .sum::<f64>()
                / prompt,
            sim_reuse: done.iter().map(|r| r.sim_cached_tokens as f64).sum::<f64>() / prompt,
            client_overhead_ms: mean(
                done.iter()
                    .filter_map(|r| Some(r.measured_ttft_ms? - r.router_measured_ttft_ms?)),
            ),
            send_lag_p99_ms: quantile(rows.iter().map(|r| r.send_lag_ms).collect(), 0.99),
        }
    }
}

/// |predicted − measured| / measured, when both exist and the measurement is positive.
fn relative(predicted: Option<f64>, measured: Option<f64>) -> Option<f64> {
    let (p, m) = (predicted?, measured?);
    (m > 0.0 && p.is_finite()).then(|| (p - m).abs() / m)
}

fn errors(pairs: impl Iterator<Item = (Option<f64>, Option<f64>)>) -> Errors {
    let mut rel = Vec::new();
    let mut signed = Vec::new();
    for (p, m) in pairs {
        if let (Some(e), Some(p), Some(m)) = (relative(p, m), p, m) {
            rel.push(e);
            signed.push(p - m);
        }
    }
    Errors {
        requests: rel.len(),
        median: quantile(rel.clone(), 0.5),
        p90: quantile(rel.clone(), 0.9),
        mean: mean(rel.into_iter()),
        mean_signed_ms: mean(signed.into_iter()),
    }
}

/// Nearest-rank quantile (0 for no samples).
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v.get(rank - 1).copied().unwrap_or(0.0)
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// `w-3` → 2: the local cluster names its workers `w-1` … `w-N`, the simulator
/// numbers them from 0 (both sort in the same order, so ties break the same way).
pub fn worker_index(name: &str) -> Option<usize> {
    name.strip_prefix("w-")?
        .parse::<usize>()
        .ok()?
        .checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_errors_and_quantiles() {
        assert_eq!(relative(Some(110.0), Some(100.0)), Some(0.1));
        assert_eq!(relative(Some(90.0), Some(100.0)), Some(0.1));
        assert_eq!(relative(None, Some(100.0)), None);
        assert_eq!(relative(Some(1.0), Some(0.0)), None);
        let e = errors(
            [
                (Some(100.0), Some(100.0)),
                (Some(120.0), Some(100.0)),
                (Some(50.0), Some(100.0)),
                (None, Some(100.0)),
            ]
            .into_iter(),
        );
        assert_eq!(e.requests, 3);
        assert_eq!(e.median, 0.2);
        assert_eq!(e.p90, 0.5);
        assert!((e.mean_signed_ms - (-10.0)).abs() < 1e-9);
        assert_eq!(quantile(Vec::new(), 0.5), 0.0);
    }

    #[test]
    fn worker_names_map_to_simulator_indices() {
        assert_eq!(worker_index("w-1"), Some(0));
        assert_eq!(worker_index("w-12"), Some(11));
        assert_eq!(worker_index("w-0"), None);
        assert_eq!(worker_index("gpu-1"), None);
    }
}
