//! Reading a comparison: where each policy's TTFT goes, and den's decision records for
//! the requests where it beat or lost to the best other policy by the most.
//!
//! Shared by `examples/fleet.rs` and `den-fleet simulate`, so both print the same thing.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::den::StudyDecision;
use super::policy::PolicyKind;
use super::replay::{FleetConfig, PolicyRun, run_policy};
use super::trace::Workload;

/// One policy's mean TTFT split into the request's own prefill (alone on an idle worker,
/// in its engine's steps, with the reuse it got, first token included), the wait before its prefill began (queue, prefix load,
/// restore), and the slowdown while prefilling (steps shared with other work).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeSplit {
    pub policy: String,
    pub own_prefill_ms: f64,
    pub wait_ms: f64,
    pub slowdown_ms: f64,
}

/// [`TimeSplit`] of one run.
pub fn time_split(workload: &Workload, config: &FleetConfig, run: &PolicyRun) -> TimeSplit {
    let n = workload.requests.len().max(1) as f64;
    let (mut own, mut wait, mut slow) = (0.0, 0.0, 0.0);
    for (i, req) in workload.requests.iter().enumerate() {
        let reused = run.reused_tokens.get(i).copied().unwrap_or(0);
        let o = config.cost.alone_ttft_ms(reused, req.input_tokens);
        let w = run.wait_us.get(i).copied().unwrap_or(0) as f64 / 1e3;
        own += o;
        wait += w;
        slow += run.ttft_us.get(i).copied().unwrap_or(0) as f64 / 1e3 - o - w;
    }
    TimeSplit {
        policy: run.report.policy.clone(),
        own_prefill_ms: own / n,
        wait_ms: wait / n,
        slowdown_ms: slow / n,
    }
}

/// The splits as text, one line per policy.
pub fn time_split_text(splits: &[TimeSplit]) -> String {
    let mut out = String::new();
    for s in splits {
        let _ = writeln!(
            out,
            "  {:<13} mean TTFT = own prefill {:>4.0} + wait (queue, load, restore) {:>4.0} + slowdown {:>4.0} ms",
            s.policy, s.own_prefill_ms, s.wait_ms, s.slowdown_ms
        );
    }
    out
}

/// One request where den and the best other policy differed most, with den's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Contrast {
    /// `true`: den was faster.
    pub win: bool,
    pub den_ttft_ms: f64,
    pub den_worker: u32,
    pub den_reused_tokens: u32,
    pub other_policy: String,
    pub other_ttft_ms: f64,
    pub other_worker: u32,
    pub other_reused_tokens: u32,
    pub record: StudyDecision,
}

/// The run of the best policy other than den (lowest mean TTFT), if any.
pub fn best_other(runs: &[PolicyRun]) -> Option<&PolicyRun> {
    runs.iter()
        .filter(|r| r.report.policy != PolicyKind::Den.as_str())
        .min_by(|a, b| a.report.ttft_ms.mean.total_cmp(&b.report.ttft_ms.mean))
}

/// den's `k` biggest wins and `k` biggest losses against the best other policy in
/// `runs`, with den's decision records (den is replayed once more, recording those
/// requests; the replay is deterministic). Empty without a den run or another policy.
pub fn contrasts(
    workload: &Workload,
    config: &FleetConfig,
    runs: &[PolicyRun],
    k: usize,
) -> Vec<Contrast> {
    let Some(den) = runs
        .iter()
        .find(|r| r.report.policy == PolicyKind::Den.as_str())
    else {
        return Vec::new();
    };
    let Some(other) = best_other(runs) else {
        return Vec::new();
    };
    if k == 0 {
        return Vec::new();
    }
    // (other − den) per request: most negative first = den's worst losses.
    let mut diffs: Vec<(i64, usize)> = den
        .ttft_us
        .iter()
        .zip(&other.ttft_us)
        .enumerate()
        .map(|(i, (&d, &o))| (o as i64 - d as i64, i))
        .collect();
    diffs.sort_unstable();
    let losses: Vec<usize> = diffs
        .iter()
        .take(k)
        .filter(|d| d.0 < 0)
        .map(|d| d.1)
        .collect();
    let wins: Vec<usize> = diffs
        .iter()
        .rev()
        .take(k)
        .filter(|d| d.0 > 0)
        .map(|d| d.1)
        .collect();
    let mut cfg = config.clone();
    cfg.explain = wins.iter().chain(&losses).copied().collect::<BTreeSet<_>>();
    let rerun = run_policy(workload, &cfg, PolicyKind::Den);
    let ms = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0) as f64 / 1e3;
    let at = |v: &[u32], i: usize| v.get(i).copied().unwrap_or(0);
    let mut out = Vec::with_capacity(wins.len() + losses.len());
    for (win, set) in [(true, &wins), (false, &losses)] {
        for &i in set {
            let Some(record) = rerun.decisions.iter().find(|d| d.request == i) else {
                continue;
            };
            out.push(Contrast {
                win,
                den_ttft_ms: ms(&den.ttft_us, i),
                den_worker: at(&den.worker, i),
                den_reused_tokens: at(&den.reused_tokens, i),
                other_policy: other.report.policy.clone(),
                other_ttft_ms: ms(&other.ttft_us, i),
                other_worker: at(&other.worker, i),
                other_reused_tokens: at(&other.reused_tokens, i),
                record: record.clone(),
            });
        }
    }
    out
}

/// The contrasts as text: a headline per request, then each worker's best offer.
pub fn contrasts_text(contrasts: &[Contrast]) -> String {
    let mut out = String::new();
    for c in contrasts {
        let d = &c.record;
        let _ = writeln!(
            out,
            "{} request #{} (line {}, t={:.3} s, prompt {} tokens): den {:.0} ms on w{:02} reusing {}; {} {:.0} ms on w{:02} reusing {}",
            if c.win { "WIN" } else { "LOSS" },
            d.request,
            d.line,
            d.at_ms / 1e3,
            d.input_tokens,
            c.den_ttft_ms,
            c.den_worker,
            c.den_reused_tokens,
            c.other_policy,
            c.other_ttft_ms,
            c.other_worker,
            c.other_reused_tokens,
        );
        for (j, s) in d.ranked.iter().enumerate() {
            let x = &s.candidate;
            let imposed = d
                .imposed_ms
                .get(j)
                .map_or(String::new(), |v| format!("  (+{v:.0} ms on others)"));
            let _ = writeln!(
                out,
                "    {} {:<6} cached {:>6}  queue {:>7.1}  load {:>7.1}  restore {:>6.1}  prefill {:>7.1}  first {:>4.1}  => {:>7.1} ms{}",
                x.worker_id,
                x.tier.as_str(),
                x.cached_token_count,
                x.queue_ms,
                x.prefix_load_ms,
                x.gpu_restore_ms,
                s.estimate.missing as f64 * x.prefill_ms_per_token,
                x.first_token_ms,
                s.estimate.ttft_ms,
                imposed
            );
        }
    }
    out
}
