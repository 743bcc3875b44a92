//! Decision records: why the router sent a request where it did, and what happened.
//!
//! The router keeps one [`DecisionRecord`] per request from submission until the record
//! is garbage-collected, and emits a small [`DecisionEvent`] at every change so that
//! runtimes can stream decisions to the console and recordings without copying the whole
//! record each time. The record holds the full candidate snapshot (every candidate with its
//! estimate: predicted TTFT, or the reason it is infeasible), every attempt with its
//! outcome and reason, and the measured outcome next to the prediction.

use std::cmp::Ordering;
use std::fmt;

use serde::ser::SerializeSeq;
use serde::{Deserialize, Serialize, Serializer};

use crate::candidate::{Candidate, Estimate, Ranking, Scored, Tier, estimate_shape, fleet_cost_ms};
use crate::capacity::DeclineReason;
use crate::ids::{Epoch, ModelFingerprint, RequestId, WorkerId};
use crate::request::GenerationRequest;
use crate::router::RouterError;
use crate::time::Millis;
use crate::wire::{Failure, WorkerTimings};

/// Everything the router decided and observed about one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub request: RequestId,
    pub model: ModelFingerprint,
    pub processed_tokens: u32,
    pub max_new_tokens: u32,
    /// When the router took the request (before any wait for KV pages).
    pub submitted_at: Millis,
    pub deadline: Millis,
    /// How long the request waited in the router for KV pages before its candidates
    /// were taken ([`crate::router_node::waiting`]): its first offer went out this long
    /// after `submitted_at`, and the attempts' predicted TTFTs count from then. One that
    /// ended while waiting (cancelled, past its deadline) waited until it ended. While it
    /// still waits, 0, with no attempt and no outcome ([`DecisionRecord::is_waiting`]).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub waited_ms: u64,
    /// The candidate snapshot taken at submission, each with its estimate (predicted
    /// TTFT, or why it is infeasible). [`CandidateSnapshot::ranking`] gives offer order.
    pub candidates: CandidateSnapshot,
    /// Candidates dropped from `candidates` when the request finished: a retained record
    /// keeps the best feasible ones, the first infeasible ones and every one attempted
    /// ([`CandidateSnapshot::compact`]), so memory does not grow with the fleet.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub candidates_omitted: usize,
    pub attempts: Vec<AttemptRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_delta_at: Option<Millis>,
    pub delivered_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<TerminalOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Millis>,
    /// First delta − submission, or completion − submission when nothing was streamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_ttft_ms: Option<u64>,
    /// The prefix tokens the worker actually reused (from its result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_cached_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_timings: Option<WorkerTimings>,
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

impl DecisionRecord {
    /// Whether the request is still waiting in the router for KV pages: nothing was
    /// offered yet and it has not ended (the router offers a request in the same step
    /// that submits it otherwise, so no other record is ever seen this way).
    pub fn is_waiting(&self) -> bool {
        self.attempts.is_empty() && self.outcome.is_none()
    }

    /// The attempt that is current or ended the request (the last one made).
    pub fn last_attempt(&self) -> Option<&AttemptRecord> {
        self.attempts.last()
    }

    /// The attempt that completed the request, if it completed.
    pub fn chosen(&self) -> Option<&AttemptRecord> {
        self.attempts
            .iter()
            .rev()
            .find(|a| a.outcome == AttemptOutcome::Completed)
    }

    /// Decline reasons in attempt order (`None` for a decline that gave no reason).
    pub fn decline_reasons(&self) -> Vec<Option<DeclineReason>> {
        self.attempts
            .iter()
            .filter_map(|a| match a.outcome {
                AttemptOutcome::Declined { reason, .. } => Some(reason),
                _ => None,
            })
            .collect()
    }

    pub fn is_terminal(&self) -> bool {
        self.outcome.is_some()
    }
}

/// One offer of the request to one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub attempt: u64,
    pub worker: WorkerId,
    pub tier: Tier,
    pub cached_tokens: u32,
    /// Of `cached_tokens`, the resident head a lower-tier alternative forks
    /// (`Candidate::resident_token_count`).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub resident_tokens: u32,
    pub predicted_ttft_ms: f64,
    /// Position of the candidate in the offer order (0 = best).
    pub rank: usize,
    pub offered_at: Millis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Millis>,
    pub outcome: AttemptOutcome,
}

/// How an attempt ended (or where it stands).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum AttemptOutcome {
    /// Offered; no answer yet.
    Pending,
    /// Accepted; executing.
    Running,
    Completed,
    /// The worker declined; `worker_epoch` is the epoch it reported.
    Declined {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<DeclineReason>,
        worker_epoch: Epoch,
    },
    TimedOut,
    WorkerUnavailable,
    Failed {
        reason: Failure,
    },
    /// The client cancelled the request while this attempt was current.
    Cancelled,
    /// The request ended for another reason (its deadline) while this attempt was current.
    Superseded,
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttemptOutcome::Pending => f.write_str("pending"),
            AttemptOutcome::Running => f.write_str("running"),
            AttemptOutcome::Completed => f.write_str("completed"),
            AttemptOutcome::Declined {
                reason: Some(r), ..
            } => write!(f, "declined ({r})"),
            AttemptOutcome::Declined { reason: None, .. } => f.write_str("declined"),
            AttemptOutcome::TimedOut => f.write_str("timed out"),
            AttemptOutcome::WorkerUnavailable => f.write_str("became unavailable"),
            AttemptOutcome::Failed { reason } => write!(f, "failed ({reason})"),
            AttemptOutcome::Cancelled => f.write_str("cancelled"),
            AttemptOutcome::Superseded => f.write_str("superseded"),
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum TerminalOutcome {
    Completed,
    Failed { error: RouterError },
    Cancelled,
}

impl fmt::Display for TerminalOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TerminalOutcome::Completed => f.write_str("completed"),
            TerminalOutcome::Failed { error } => write!(f, "failed: {error}"),
            TerminalOutcome::Cancelled => f.write_str("cancelled"),
        }
    }
}

/// A small notice of one change to a decision record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionEvent {
    pub request: RequestId,
    pub at: Millis,
    #[serde(flatten)]
    pub kind: DecisionEventKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum DecisionEventKind {
    Submitted {
        feasible: u32,
        infeasible: u32,
        deadline: Millis,
    },
    /// No candidate can take it until KV pages free: the router node holds it (its
    /// record is in phase waiting, with no attempt).
    Waiting,
    /// It left the wait for pages after `waited_ms`, with these candidates.
    Released {
        waited_ms: u64,
        feasible: u32,
        infeasible: u32,
    },
    Offered {
        attempt: u64,
        worker: WorkerId,
        tier: Tier,
        cached_tokens: u32,
        predicted_ttft_ms: f64,
    },
    Accepted {
        attempt: u64,
    },
    AttemptEnded {
        attempt: u64,
        outcome: AttemptOutcome,
    },
    FirstDelta {
        ttft_ms: u64,
    },
    Finished {
        outcome: TerminalOutcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        measured_ttft_ms: Option<u64>,
    },
    /// The record was garbage-collected after its retention period.
    Collected,
}

/// Every candidate of one request with its estimate, in submission order.
///
/// The router ranks lazily: the first offer needs only the best candidate, found while
/// scoring (one pass); the full offer order is sorted only if a fallback is needed. Both
/// use the order of [`crate::candidate::offer_order`] — `(ttft + imposed delay, −cached,
/// worker id, tier)`, ties kept in submission order — so the offers made are exactly
/// those of [`crate::candidate::rank`] sorted by that order.
/// Serialised as a list of `{candidate, estimate}` pairs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "Vec<Scored>")]
pub struct CandidateSnapshot {
    candidates: Vec<Candidate>,
    estimates: Vec<Estimate>,
    feasible: usize,
    /// The first feasible candidate in offer order.
    best: Option<usize>,
}

/// What the offer order compares, given each candidate's fleet cost (own TTFT plus the
/// delay imposed on the worker's pending requests): the cost, then the longer prefix,
/// the worker id and the tier.
fn order(ca: &Candidate, cost_a: f64, cb: &Candidate, cost_b: f64) -> Ordering {
    cost_a
        .total_cmp(&cost_b)
        .then_with(|| cb.cached_token_count.cmp(&ca.cached_token_count))
        .then_with(|| ca.worker_id.cmp(&cb.worker_id))
        .then_with(|| ca.tier.cmp(&cb.tier))
}

/// The index of the first feasible candidate in offer order, fed one candidate at a
/// time (an earlier index wins an exact tie).
#[derive(Default)]
struct BestSoFar(Option<(usize, f64)>);

impl BestSoFar {
    #[inline]
    fn offer(&mut self, i: usize, c: &Candidate, e: &Estimate, all: &[Candidate]) {
        if !e.feasible() {
            return;
        }
        let cost = fleet_cost_ms(c, e);
        let better = match self.0 {
            None => true,
            Some((b, best_cost)) => match cost.total_cmp(&best_cost) {
                Ordering::Less => true,
                Ordering::Greater => false,
                // Prefix lengths and names are compared only on a tie of cost.
                Ordering::Equal => all
                    .get(b)
                    .is_some_and(|cb| order(c, cost, cb, best_cost) == Ordering::Less),
            },
        };
        if better {
            self.0 = Some((i, cost));
        }
    }
}

impl CandidateSnapshot {
    /// Estimate every candidate for `request` (no copies of the candidates), finding the
    /// best one on the way.
    pub fn score(request: &GenerationRequest, candidates: Vec<Candidate>) -> Self {
        let (processed, max_new) = (request.processed(), request.max_new_tokens);
        let mut feasible = 0;
        let mut best = BestSoFar::default();
        let estimates: Vec<Estimate> = candidates
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let e = estimate_shape(processed, max_new, c);
                feasible += usize::from(e.feasible());
                best.offer(i, c, &e, &candidates);
                e
            })
            .collect();
        CandidateSnapshot {
            candidates,
            estimates,
            feasible,
            best: best.0.map(|(i, _)| i),
        }
    }

    fn assemble(candidates: Vec<Candidate>, estimates: Vec<Estimate>) -> Self {
        let mut best = BestSoFar::default();
        for (i, (c, e)) in candidates.iter().zip(&estimates).enumerate() {
            best.offer(i, c, e, &candidates);
        }
        CandidateSnapshot {
            feasible: estimates.iter().filter(|e| e.feasible()).count(),
            best: best.0.map(|(i, _)| i),
            candidates,
            estimates,
        }
    }

    pub fn len(&self) -> usize {
        self.candidates.len()
    }

    pub fn is_empty(&self) -> bool {
        self.candidates.is_empty()
    }

    /// Candidate `i` (submission order) with its estimate.
    pub fn get(&self, i: usize) -> Option<(&Candidate, &Estimate)> {
        Some((self.candidates.get(i)?, self.estimates.get(i)?))
    }

    /// Every candidate with its estimate, in submission order.
    pub fn iter(&self) -> impl Iterator<Item = (&Candidate, &Estimate)> {
        self.candidates.iter().zip(&self.estimates)
    }

    pub fn feasible_count(&self) -> usize {
        self.feasible
    }

    /// Feasible and infeasible candidates, as decision events report them.
    pub fn counts(&self) -> (u32, u32) {
        let u = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        (
            u(self.feasible),
            u(self.len().saturating_sub(self.feasible)),
        )
    }

    /// The infeasible candidates with their estimates (and reasons), submission order.
    pub fn infeasible(&self) -> impl Iterator<Item = (&Candidate, &Estimate)> {
        self.iter().filter(|(_, e)| !e.feasible())
    }

    /// The first feasible candidate in offer order.
    pub fn best(&self) -> Option<usize> {
        self.best
    }

    /// Feasible candidates in offer order (submission order breaks exact ties).
    pub fn offer_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len())
            .filter(|i| self.estimates.get(*i).is_some_and(Estimate::feasible))
            .collect();
        order.sort_by(|a, b| self.compare(*a, *b));
        order
    }

    /// The snapshot as a [`Ranking`]: feasible in offer order, infeasible after (copies).
    pub fn ranking(&self) -> Ranking {
        let scored = |i: usize| {
            self.get(i).map(|(c, e)| Scored {
                candidate: c.clone(),
                estimate: e.clone(),
            })
        };
        Ranking {
            feasible: self.offer_order().into_iter().filter_map(scored).collect(),
            infeasible: (0..self.len())
                .filter(|i| self.estimates.get(*i).is_some_and(|e| !e.feasible()))
                .filter_map(scored)
                .collect(),
        }
    }

    /// Keeps the `keep` best feasible candidates (offer order), the first `keep`
    /// infeasible ones (submission order) and those at `pinned`, in submission order, and
    /// drops the rest. Returns, for each old index, its new one. A finished request's
    /// record needs no more for its explanation, and with a thousand workers and minutes
    /// of retention the full snapshots were most of the router's memory.
    pub fn compact(&mut self, keep: usize, pinned: &[usize]) -> Vec<Option<usize>> {
        let n = self.len();
        let mut kept = vec![false; n];
        for i in self.offer_order().into_iter().take(keep) {
            kept[i] = true;
        }
        let infeasible = (0..n).filter(|i| self.estimates.get(*i).is_some_and(|e| !e.feasible()));
        for i in infeasible.take(keep) {
            kept[i] = true;
        }
        for &i in pinned {
            if let Some(k) = kept.get_mut(i) {
                *k = true;
            }
        }
        let mut map = vec![None; n];
        if kept.iter().all(|k| *k) {
            for (i, m) in map.iter_mut().enumerate() {
                *m = Some(i);
            }
            return map;
        }
        let candidates = std::mem::take(&mut self.candidates);
        let estimates = std::mem::take(&mut self.estimates);
        let mut new_c = Vec::new();
        let mut new_e = Vec::new();
        for (i, (c, e)) in candidates.into_iter().zip(estimates).enumerate() {
            if kept.get(i).copied().unwrap_or(false) {
                if let Some(m) = map.get_mut(i) {
                    *m = Some(new_c.len());
                }
                new_c.push(c);
                new_e.push(e);
            }
        }
        *self = CandidateSnapshot::assemble(new_c, new_e);
        map
    }

    /// [`crate::candidate::offer_order`] on two indices.
    fn compare(&self, a: usize, b: usize) -> Ordering {
        match (self.get(a), self.get(b)) {
            (Some((ca, ea)), Some((cb, eb))) => {
                order(ca, fleet_cost_ms(ca, ea), cb, fleet_cost_ms(cb, eb))
            }
            // Indices come from this snapshot; keep the order total anyway.
            _ => a.cmp(&b),
        }
    }
}

impl From<Vec<Scored>> for CandidateSnapshot {
    fn from(scored: Vec<Scored>) -> Self {
        let (candidates, estimates): (Vec<Candidate>, Vec<Estimate>) = scored
            .into_iter()
            .map(|s| (s.candidate, s.estimate))
            .unzip();
        CandidateSnapshot::assemble(candidates, estimates)
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Serialize)]
struct ScoredRef<'a> {
    candidate: &'a Candidate,
    estimate: &'a Estimate,
}

impl Serialize for CandidateSnapshot {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.len()))?;
        for (candidate, estimate) in self.iter() {
            seq.serialize_element(&ScoredRef {
                candidate,
                estimate,
            })?;
        }
        seq.end()
    }
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
