//! A human-readable decision trace of a simulation.

use std::fmt::Write;

use super::Simulation;
use super::trace::{Endpoint, Fault, TraceEvent};
use crate::candidate::Scored;
use crate::decision::{DecisionEvent, DecisionEventKind, DecisionRecord};
use crate::router::{DeliveryKind, LocalRouterEffect, RouterEffect};

/// Render the decisions of a simulation, one line per decision, with the ranked candidate
/// snapshot under each submission and a summary table at the end.
pub fn narrate(sim: &Simulation) -> String {
    let mut out = String::new();
    for entry in sim.trace() {
        let at = entry.at.0;
        match &entry.event {
            TraceEvent::Router { effects, .. } => {
                for effect in effects {
                    match effect {
                        RouterEffect::Local(LocalRouterEffect::Decision(d)) => {
                            decision_line(&mut out, sim, d);
                        }
                        RouterEffect::Local(LocalRouterEffect::Deliver(d)) => {
                            if let DeliveryKind::Completed { result } = &d.kind {
                                line(
                                    &mut out,
                                    at,
                                    d.request.as_str(),
                                    &format!(
                                        "delivered {} tokens, {} prefix tokens reused by the worker",
                                        result.tokens.len(),
                                        result.cached_token_count
                                    ),
                                );
                            }
                        }
                        _ => {}
                    }
                }
            }
            TraceEvent::NetworkDrop {
                from, to, message, ..
            } => line(
                &mut out,
                at,
                "network",
                &format!("{message} {} → {} lost", endpoint(from), endpoint(to)),
            ),
            TraceEvent::Fault(f) => line(&mut out, at, "fault", &fault(f)),
            _ => {}
        }
    }
    summary(&mut out, sim);
    out
}

fn decision_line(out: &mut String, sim: &Simulation, d: &DecisionEvent) {
    let at = d.at.0;
    let who = d.request.as_str();
    let text = match &d.kind {
        DecisionEventKind::Submitted {
            feasible,
            infeasible,
            deadline,
        } => {
            line(
                out,
                at,
                who,
                &format!(
                    "submitted; {feasible} feasible candidate(s), {infeasible} infeasible; deadline t={}",
                    deadline.0
                ),
            );
            if let Some(record) = sim.router().record(&d.request) {
                ranking(out, record);
            }
            return;
        }
        DecisionEventKind::Offered {
            attempt,
            worker,
            tier,
            cached_tokens,
            predicted_ttft_ms,
        } => format!(
            "attempt {attempt}: offer → {worker} ({tier}, {cached_tokens} cached, predicted TTFT {predicted_ttft_ms:.1} ms)"
        ),
        DecisionEventKind::Waiting => "waiting for KV pages".to_owned(),
        DecisionEventKind::Released {
            waited_ms,
            feasible,
            infeasible,
        } => format!(
            "left the wait for pages after {waited_ms} ms; {feasible} feasible candidate(s), {infeasible} infeasible"
        ),
        DecisionEventKind::Accepted { attempt } => format!("attempt {attempt}: accepted"),
        DecisionEventKind::AttemptEnded { attempt, outcome } => {
            format!("attempt {attempt}: {outcome}")
        }
        DecisionEventKind::FirstDelta { ttft_ms } => {
            format!("first token streamed (measured TTFT {ttft_ms} ms)")
        }
        DecisionEventKind::Finished {
            outcome,
            measured_ttft_ms,
        } => match measured_ttft_ms {
            Some(ms) => format!("{outcome} (measured TTFT {ms} ms)"),
            None => outcome.to_string(),
        },
        DecisionEventKind::Collected => "record collected".to_owned(),
    };
    line(out, at, who, &text);
}

fn ranking(out: &mut String, record: &DecisionRecord) {
    let ranking = record.candidates.ranking();
    for (i, s) in ranking.feasible.iter().enumerate() {
        let _ = writeln!(out, "{:>24}{}", "", scored(&format!("#{}", i + 1), s));
    }
    for s in &ranking.infeasible {
        let why = s.estimate.infeasible.map(|r| r.as_str()).unwrap_or("");
        let _ = writeln!(out, "{:>24}{}", "", scored(&format!("✗ {why}"), s));
    }
}

fn scored(label: &str, s: &Scored) -> String {
    let c = &s.candidate;
    let ttft = if s.estimate.feasible() {
        format!("predicted TTFT {:>6.1} ms", s.estimate.ttft_ms)
    } else {
        String::new()
    };
    format!(
        "{label:<4} {:<10} {:<6} {:>5} cached  {ttft}",
        c.worker_id.as_str(),
        c.tier.as_str(),
        c.cached_token_count
    )
}

fn summary(out: &mut String, sim: &Simulation) {
    let _ = writeln!(out, "\nsummary:");
    let _ = writeln!(
        out,
        "  {:<12} {:<10} {:<10} {:<6} {:>8} {:>10} {:>9}",
        "request", "outcome", "worker", "tier", "attempts", "predicted", "measured"
    );
    for r in sim.router().records() {
        let outcome = r.outcome.as_ref().map(|o| match o {
            crate::decision::TerminalOutcome::Completed => "completed",
            crate::decision::TerminalOutcome::Failed { .. } => "failed",
            crate::decision::TerminalOutcome::Cancelled => "cancelled",
        });
        let last = r.last_attempt();
        let _ = writeln!(
            out,
            "  {:<12} {:<10} {:<10} {:<6} {:>8} {:>7.1} ms {:>6} ms",
            r.request.as_str(),
            outcome.unwrap_or("running"),
            last.map(|a| a.worker.as_str()).unwrap_or("-"),
            last.map(|a| a.tier.as_str()).unwrap_or("-"),
            r.attempts.len(),
            last.map(|a| a.predicted_ttft_ms).unwrap_or(0.0),
            r.measured_ttft_ms
                .map(|m| m.to_string())
                .unwrap_or_else(|| "-".to_owned()),
        );
    }
}

fn line(out: &mut String, at: u64, who: &str, text: &str) {
    let _ = writeln!(out, "t={at:<6} {who:<14} {text}");
}

fn endpoint(e: &Endpoint) -> String {
    match e {
        Endpoint::Router => "router".to_owned(),
        Endpoint::Worker(w) => w.to_string(),
    }
}

fn fault(f: &Fault) -> String {
    match f {
        Fault::Partition { from, to } => {
            format!("link {} → {} partitioned", endpoint(from), endpoint(to))
        }
        Fault::Heal => "all links healed".to_owned(),
        Fault::Pause { worker } => format!("{worker} paused"),
        Fault::Resume { worker } => format!("{worker} resumed"),
        Fault::Crash { worker } => format!("{worker} crashed"),
        Fault::Restart { worker } => format!("{worker} restarted"),
        Fault::SetCapacity {
            worker,
            free,
            evictable,
        } => format!(
            "{worker}'s pool now has {free} free and {evictable} evictable pages (the router's snapshot is stale)"
        ),
        Fault::DropNext { from, to } => {
            format!(
                "next message {} → {} will be lost",
                endpoint(from),
                endpoint(to)
            )
        }
        Fault::DelayNext { from, to, ms } => format!(
            "next message {} → {} will be {ms} ms late",
            endpoint(from),
            endpoint(to)
        ),
        Fault::DuplicateNext { from, to } => format!(
            "next message {} → {} will be duplicated",
            endpoint(from),
            endpoint(to)
        ),
    }
}
