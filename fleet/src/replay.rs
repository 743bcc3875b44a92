//! The fleet simulator's discrete-event replay: arrivals in trace order, routed by one
//! policy, executed by the simulated workers.
//!
//! Three names for three things: this replay (the fleet study's own worker, cache and
//! cost models; only the estimate is shared with what runs); `den_protocol::sim` (the
//! deterministic simulator that drives the real router and worker machines through the
//! spec's scenarios); and [`crate::simulate`] (the `den-fleet simulate` command, which
//! runs this replay once per policy and fleet size).
//!
//! Events are (time, worker) step ends and wake-ups in a min-heap; each worker holds at
//! most one live event (older ones carry a stale version and are skipped). Before an
//! arrival at `t` every worker event at or before `t` is processed, so the router sees
//! each worker as of `t`, and ties go to the worker (a step ending at `t` frees its
//! capacity for a request arriving at `t`). Integer microseconds throughout; no
//! randomness; the same inputs give the same result, byte for byte.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use serde::{Deserialize, Serialize};

use super::cache::TierTraffic;
use super::cost::{CostModel, Micros};
use super::den::{DenOptions, StudyDecision};
use super::heartbeat::{Beats, Heartbeats};
use super::metrics::{Latency, PolicyReport, Prediction, Spread, Throughput, TierTokens};
use super::policy::{FleetView, LeastLoaded, Policy, PolicyKind, Route, RouteRequest};
use super::trace::Workload;
use super::worker::{ReqState, Shared, Worker};

/// A fleet to replay a workload on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetConfig {
    pub workers: usize,
    pub cost: CostModel,
    pub den: DenOptions,
    /// Requests (replay indices) whose routing decisions are recorded, for policies that
    /// can explain themselves (den).
    pub explain: BTreeSet<usize>,
    /// `Some`: policies see each worker's load as of its last heartbeat, like
    /// den-agent's router ([`super::heartbeat`]); `None` (default): as of now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeats: Option<Heartbeats>,
}

impl FleetConfig {
    /// `workers` workers with the default cost model and den options.
    pub fn new(workers: usize) -> FleetConfig {
        FleetConfig {
            workers: workers.max(1),
            cost: CostModel::default(),
            den: DenOptions::default(),
            explain: BTreeSet::new(),
            heartbeats: None,
        }
    }
}

/// One policy's replay: the report plus per-request outcomes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRun {
    pub report: PolicyReport,
    /// TTFT of each request in replay order, µs.
    pub ttft_us: Vec<u64>,
    /// The worker each request ran on.
    pub worker: Vec<u32>,
    /// Reused prompt tokens of each request.
    pub reused_tokens: Vec<u32>,
    /// When each request's prefill started (first chunk scheduled), µs after arrival.
    pub wait_us: Vec<u64>,
    /// The policy's TTFT prediction for each request, ms (den only).
    pub predicted_ttft_ms: Vec<Option<f64>>,
    pub decisions: Vec<StudyDecision>,
}

/// Replays `workload` through a fresh policy of `kind`.
pub fn run_policy(workload: &Workload, config: &FleetConfig, kind: PolicyKind) -> PolicyRun {
    let mut policy = kind.build(&config.den);
    run_with(workload, config, policy.as_mut())
}

/// Replays `workload` through `policy` (any [`Policy`] implementation).
pub fn run_with(workload: &Workload, config: &FleetConfig, policy: &mut dyn Policy) -> PolicyRun {
    let n = config.workers.max(1);
    let cost = &config.cost;
    let workers: Vec<Worker> = (0..n)
        .map(|i| Worker::new(i as u32, workload, cost))
        .collect();
    let mut sh = Shared {
        workload,
        cost,
        reqs: vec![ReqState::default(); workload.requests.len()],
        published_at: vec![Micros::MAX; workload.block_count()],
        overcommits: 0,
    };
    let mut fleet = Fleet {
        events: BinaryHeap::new(),
        versions: vec![0u64; n],
        workers: Vec::new(),
    };
    let mut book = Book {
        decisions: Vec::new(),
        predicted: vec![None; workload.requests.len()],
        retries: BinaryHeap::new(),
        attempts: vec![0u32; workload.requests.len()],
        refusals: Refusals::default(),
        held_since: vec![None; workload.requests.len()],
        waited: (0, 0),
    };
    let start = workload.requests.first().map_or(0, |r| r.arrival_us);
    let mut beats = config
        .heartbeats
        .map(|h| Beats::new(h, start, &workers, &sh));
    fleet.workers = workers;
    let mut next = 0usize;
    let mut idle_beats = 0usize;

    loop {
        let arrival = workload.requests.get(next).map(|r| r.arrival_us);
        let retry = book.retries.peek().map(|Reverse(r)| *r);
        // A new arrival goes before a retry at the same instant.
        let (now, i) = match (arrival, retry) {
            (Some(a), Some((t, r))) if t < a => {
                book.retries.pop();
                (t, r)
            }
            (Some(a), _) => {
                next += 1;
                (a, next - 1)
            }
            (None, Some((t, r))) => {
                book.retries.pop();
                (t, r)
            }
            (None, None) => {
                // No more arrivals: run the workers out. A policy still holding requests
                // routes them as work finishes, or (heartbeat-lagged) as heartbeats show
                // it — for one more round of every worker's heartbeat at most.
                let holding = book.held_since.iter().any(Option::is_some);
                let until = match (fleet.events.is_empty(), holding) {
                    (false, _) => None,
                    (true, false) => break,
                    (true, true) => match beats.as_ref().and_then(|b| b.next()) {
                        Some(at) if idle_beats <= n => at,
                        _ => break,
                    }
                    .into(),
                };
                idle_beats = if until.is_some() { idle_beats + 1 } else { 0 };
                let beats = if holding { beats.as_mut() } else { None };
                if !drain(&mut fleet, &mut sh, until, beats, policy, &mut book) {
                    break;
                }
                continue;
            }
        };
        let Some(req) = workload.requests.get(i) else {
            continue;
        };
        drain(
            &mut fleet,
            &mut sh,
            Some(now),
            beats.as_mut(),
            policy,
            &mut book,
        );
        let attempt = book.attempts.get(i).copied().unwrap_or(0);
        let request = route_request(workload, i, req, config.explain.contains(&i), attempt);
        let route = {
            let view = FleetView::new(
                now,
                &fleet.workers,
                &sh,
                beats.as_ref().map(Beats::snapshots),
            );
            policy.route(&request, &view)
        };
        if route.held {
            if let Some(h) = book.held_since.get_mut(i) {
                *h = Some(now);
            }
        } else {
            fleet.route(&mut sh, beats.as_mut(), &mut book, now, &request, route);
        }
        // What the heartbeats before this arrival let the policy route of what it held.
        admit(&mut fleet, &mut sh, now, beats.as_mut(), policy, &mut book);
    }

    // Whatever a policy still holds then (it should hold nothing) goes to the
    // least-loaded worker, counted as given up.
    let end = sh.reqs.iter().map(|r| r.done).max().unwrap_or(0);
    for i in 0..book.held_since.len() {
        if book.held_since.get(i).copied().flatten().is_none() {
            continue;
        }
        let Some(req) = workload.requests.get(i) else {
            continue;
        };
        let request = route_request(workload, i, req, false, 0);
        book.refusals.gave_up += 1;
        let route = {
            let view = FleetView::new(end, &fleet.workers, &sh, None);
            LeastLoaded.route(&request, &view)
        };
        fleet.route(&mut sh, None, &mut book, end, &request, route);
    }
    drain(&mut fleet, &mut sh, None, None, policy, &mut book);

    let mut decisions = book.decisions;
    // A retried request is decided after later arrivals: keep the records in replay order.
    decisions.sort_by_key(|d| d.request);
    for d in &mut decisions {
        if let (Some(st), Some(req)) = (sh.reqs.get(d.request), workload.requests.get(d.request)) {
            d.measured_ttft_ms =
                Some(st.first_token.saturating_sub(req.arrival_us) as f64 / 1000.0);
        }
    }
    let mut run = summarise(
        policy.name(),
        workload,
        &fleet.workers,
        sh,
        decisions,
        book.predicted,
    );
    run.report.refused_requests = book.refusals.requests;
    run.report.client_retries = book.refusals.retries;
    run.report.gave_up = book.refusals.gave_up;
    let (waited, waited_us) = book.waited;
    run.report.waited_requests = waited;
    if waited > 0 {
        run.report.mean_wait_ms = waited_us as f64 / waited as f64 / 1000.0;
    }
    run
}

/// A refused request's client retries this often at most (at den's `Retry-After` of a
/// second, ten minutes), then the replay sends it to the least-loaded worker.
pub const MAX_CLIENT_RETRIES: u32 = 600;

/// What the policy refused over a replay.
#[derive(Debug, Default)]
struct Refusals {
    requests: u64,
    retries: u64,
    gave_up: u64,
}

impl Refusals {
    fn refused(&mut self, attempt: u32) {
        if attempt == 0 {
            self.requests += 1;
        }
        self.retries += 1;
    }
}

/// The simulated workers and their pending events.
struct Fleet {
    events: BinaryHeap<Reverse<(Micros, usize, u64)>>,
    versions: Vec<u64>,
    workers: Vec<Worker>,
}

/// What the replay keeps of the policy's decisions.
struct Book {
    decisions: Vec<StudyDecision>,
    predicted: Vec<Option<f64>>,
    /// Requests a policy refused, by when their clients submit them again.
    retries: BinaryHeap<Reverse<(Micros, usize)>>,
    attempts: Vec<u32>,
    refusals: Refusals,
    /// When the policy held each request it is holding ([`crate::policy::Route::held`]).
    held_since: Vec<Option<Micros>>,
    /// Requests the policy held, and how long they waited in all, µs.
    waited: (u64, u64),
}

impl Fleet {
    fn schedule(&mut self, w: usize, at: Micros) {
        if let Some(v) = self.versions.get_mut(w) {
            *v += 1;
            self.events.push(Reverse((at, w, *v)));
        }
    }

    /// Carries out `route` for request `request.index` at `now`: a refusal schedules
    /// the client's retry, anything else dispatches it to its worker.
    #[allow(clippy::too_many_arguments)]
    fn route(
        &mut self,
        sh: &mut Shared,
        beats: Option<&mut Beats>,
        book: &mut Book,
        now: Micros,
        request: &RouteRequest,
        mut route: Route,
    ) {
        let i = request.index;
        if let Some(after) = route.retry_after_us {
            let attempt = book.attempts.get(i).copied().unwrap_or(0);
            book.refusals.refused(attempt);
            if attempt < MAX_CLIENT_RETRIES {
                if let Some(a) = book.attempts.get_mut(i) {
                    *a += 1;
                }
                book.retries.push(Reverse((now + after.max(1), i)));
                return;
            }
            book.refusals.gave_up += 1;
            let view = FleetView::new(
                now,
                &self.workers,
                sh,
                beats.as_deref().map(Beats::snapshots),
            );
            route = LeastLoaded.route(request, &view);
        }
        let arrival = sh.workload.requests.get(i).map_or(now, |r| r.arrival_us);
        if let Some(since) = book.held_since.get_mut(i).and_then(Option::take) {
            book.waited.0 += 1;
            book.waited.1 += now.saturating_sub(since);
            // The router predicts from the moment it offers; the client counts from
            // its arrival.
            route.predicted_ttft_ms = route
                .predicted_ttft_ms
                .map(|p| p + now.saturating_sub(arrival) as f64 / 1000.0);
        }
        if let Some(p) = book.predicted.get_mut(i) {
            *p = route.predicted_ttft_ms;
        }
        if let Some(record) = route.record {
            book.decisions.push(record);
        }
        let n = self.workers.len().max(1);
        let w = route.worker.min(n - 1);
        if let (Some(b), Some(work)) = (beats, route.added_work_ms) {
            b.dispatched(w, i, work);
        }
        let Some(worker) = self.workers.get_mut(w) else {
            return;
        };
        if let Some(next) = worker.dispatch(now, i as u32, route.reuse, sh) {
            self.schedule(w, next);
        }
    }
}

/// Processes worker events up to and including `until` (all of them for `None`), and
/// the heartbeats due in between (a heartbeat at the time of an event follows it); the
/// policy hears of each heartbeat and each finished request, and routes what it held
/// once either may have made room. Returns whether any event was processed.
fn drain(
    fleet: &mut Fleet,
    sh: &mut Shared,
    until: Option<Micros>,
    mut beats: Option<&mut Beats>,
    policy: &mut dyn Policy,
    book: &mut Book,
) -> bool {
    let mut any = false;
    loop {
        let event = fleet.events.peek().map(|Reverse((at, _, _))| *at);
        let beat = beats.as_ref().and_then(|b| b.next());
        let next = match (event, beat) {
            (Some(e), Some(b)) => e.min(b),
            (Some(e), None) => e,
            (None, Some(b)) => b,
            (None, None) => return any,
        };
        let done = match until {
            Some(t) => next > t,
            // The final drain: no more arrivals, so no more heartbeats to take.
            None => event.is_none(),
        };
        if done {
            return any;
        }
        any = true;
        let at = if beat.is_some_and(|b| event.is_none_or(|e| b < e)) {
            let Some(b) = beats.as_deref_mut() else {
                continue;
            };
            let Some((at, w)) = b.fire(&fleet.workers, sh) else {
                continue;
            };
            let view = FleetView::new(at, &fleet.workers, sh, Some(b.snapshots()));
            policy.heartbeat(w, &view);
            at
        } else {
            let Some(Reverse((at, w, v))) = fleet.events.pop() else {
                return any;
            };
            if fleet.versions.get(w) != Some(&v) {
                continue;
            }
            let Some(worker) = fleet.workers.get_mut(w) else {
                continue;
            };
            let next = worker.on_event(at, sh);
            let finished = !worker.finished.is_empty();
            for &r in &worker.finished {
                policy.finished(w, r as usize, at);
            }
            match beats.as_deref_mut() {
                Some(b) => b.after_event(w, worker, at),
                None => worker.finished.clear(),
            }
            if let Some(next) = next {
                fleet.schedule(w, next);
            }
            if !finished {
                continue;
            }
            at
        };
        admit(fleet, sh, at, beats.as_deref_mut(), policy, book);
    }
}

/// Request `i` (`req`) of `workload` as a policy sees it.
fn route_request<'w>(
    workload: &'w Workload,
    i: usize,
    req: &'w crate::trace::WorkRequest,
    explain: bool,
    attempt: u32,
) -> RouteRequest<'w> {
    RouteRequest {
        index: i,
        line: req.line,
        input_tokens: req.input_tokens,
        output_tokens: req.output_tokens,
        blocks: workload.blocks(req),
        explain,
        attempt,
    }
}

/// Routes what the policy held and now admits ([`Policy::admitted`]) at `at`.
fn admit(
    fleet: &mut Fleet,
    sh: &mut Shared,
    at: Micros,
    mut beats: Option<&mut Beats>,
    policy: &mut dyn Policy,
    book: &mut Book,
) {
    let admitted = {
        let view = FleetView::new(
            at,
            &fleet.workers,
            sh,
            beats.as_deref().map(Beats::snapshots),
        );
        policy.admitted(&view)
    };
    for (i, route) in admitted {
        let Some(req) = sh.workload.requests.get(i) else {
            continue;
        };
        let attempt = book.attempts.get(i).copied().unwrap_or(0);
        let request = route_request(sh.workload, i, req, false, attempt);
        fleet.route(sh, beats.as_deref_mut(), book, at, &request, route);
    }
}

fn summarise(
    name: &str,
    workload: &Workload,
    workers: &[Worker],
    sh: Shared,
    decisions: Vec<StudyDecision>,
    predicted: Vec<Option<f64>>,
) -> PolicyRun {
    let mut ttft = Vec::with_capacity(sh.reqs.len());
    let mut reused = TierTokens::default();
    let mut prompt = 0u64;
    let mut output = 0u64;
    let mut last_done = 0;
    for (st, req) in sh.reqs.iter().zip(&workload.requests) {
        ttft.push(st.first_token.saturating_sub(req.arrival_us));
        prompt += req.input_tokens as u64;
        output += req.output_tokens as u64;
        last_done = last_done.max(st.done);
        let [g, r, s, o] = st.source_tokens;
        reused.gpu += g as u64;
        reused.ram += r as u64;
        reused.ssd += s as u64;
        reused.object += o as u64;
    }
    let first = workload.requests.first().map_or(0, |r| r.arrival_us);
    let makespan_s = last_done.saturating_sub(first) as f64 / 1e6;
    let per_s = |x: f64| {
        if makespan_s > 0.0 {
            x / makespan_s
        } else {
            0.0
        }
    };
    let mut tiers = TierTraffic::default();
    for w in workers {
        tiers.add(&w.cache.traffic);
    }
    let busy: Vec<u64> = workers.iter().map(|w| w.busy_us).collect();
    let routed: Vec<u32> = workers.iter().map(|w| w.routed).collect();
    let report = PolicyReport {
        policy: name.to_owned(),
        workers: workers.len(),
        requests: workload.requests.len(),
        ttft_ms: Latency::from_us(&ttft),
        throughput: Throughput {
            makespan_s,
            requests_per_s: per_s(workload.requests.len() as f64),
            prompt_tokens_per_s: per_s(prompt as f64),
            output_tokens_per_s: per_s(output as f64),
        },
        prefix_hit_rate: if prompt == 0 {
            0.0
        } else {
            reused.total() as f64 / prompt as f64
        },
        prompt_tokens: prompt,
        reused_tokens: reused,
        tokens_recomputed: prompt - reused.total(),
        tiers,
        load_spread: Spread::new(routed, &busy),
        overcommits: sh.overcommits,
        prediction: Prediction::new(&predicted, &ttft),
        refused_requests: 0,
        client_retries: 0,
        gave_up: 0,
        waited_requests: 0,
        mean_wait_ms: 0.0,
    };
    PolicyRun {
        report,
        ttft_us: ttft,
        worker: sh.reqs.iter().map(|s| s.worker).collect(),
        reused_tokens: sh.reqs.iter().map(|s| s.reused_tokens).collect(),
        predicted_ttft_ms: predicted,
        wait_us: sh
            .reqs
            .iter()
            .zip(&workload.requests)
            .map(|(s, r)| {
                s.started
                    .unwrap_or(s.first_token)
                    .saturating_sub(r.arrival_us)
            })
            .collect(),
        decisions,
    }
}
