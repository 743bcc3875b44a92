//! Property tests: random interleavings of submits, cancels, declines, accepts, timeouts,
//! deltas (duplicated, reordered, forged), results (including stale attempts), crashes,
//! restarts, partitions, pauses and delays, all driven through the simulator.
//!
//! (a) no stale attempt ever changes or completes a request;
//! (b) once quiet, every request has exactly one terminal delivery, its deltas are
//!     contiguous from 0, precede the terminal delivery and match the result's tokens;
//! (c) equal inputs give a byte-identical trace;
//! (d) page counters never lose a page, releases are idempotent, and nothing stays
//!     reserved once quiet.

use crate::common;

use std::collections::BTreeMap;

use common::MODEL;
use den_protocol::candidate::{Candidate, Tier, TransferCapabilities, rank};
use den_protocol::capacity::{Capacity, DeclineReason};
use den_protocol::decision::CandidateSnapshot;
use den_protocol::ids::{AssignmentId, RequestId, WorkerId};
use den_protocol::request::GenerationRequest;
use den_protocol::router::{DeliveryKind, LocalRouterEffect, Phase, RouterEffect, RouterInput};
use den_protocol::sim::{Endpoint, SimConfig, Simulation, TraceEvent};
use den_protocol::wire::{RouterMessage, WorkerResult};
use den_protocol::worker::{Counters, OperationOutcome, WorkerInput};
use proptest::prelude::*;

const WORKERS: usize = 3;

fn worker_id(i: usize) -> WorkerId {
    WorkerId::from(format!("w{}", i % WORKERS))
}

#[derive(Debug, Clone)]
struct Alt {
    worker: usize,
    tier: Tier,
    cached_fraction: u8,
    queue_ms: u8,
    first_token_ms: u8,
    stale_epoch: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Submit {
        processed: u32,
        max_new: u32,
        alts: Vec<Alt>,
    },
    Cancel(usize),
    Run(u64),
    Crash(usize),
    Restart(usize),
    Pause(usize),
    Resume(usize),
    Partition(usize, bool),
    Heal,
    DropNext(usize, bool),
    DelayNext(usize, bool, u64),
    DuplicateNext(usize, bool),
    SetCapacity(usize, u32),
    StaleResult(usize, u64),
    ForgedToken(usize, bool),
    LateTimeout(usize),
    RacingDecline(usize),
    RacingAccept(usize),
    FailOperation(usize),
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![
        Just(Tier::Gpu),
        Just(Tier::Ram),
        Just(Tier::Ssd),
        Just(Tier::Object),
        Just(Tier::None)
    ]
}

fn alt() -> impl Strategy<Value = Alt> {
    (
        0..WORKERS,
        tier(),
        0u8..=4,
        0u8..20,
        0u8..4,
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(worker, tier, cached_fraction, queue_ms, first_token_ms, stale_epoch)| Alt {
                worker,
                tier,
                cached_fraction,
                queue_ms,
                first_token_ms,
                stale_epoch,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    let link = (0..WORKERS, any::<bool>());
    prop_oneof![
        6 => (1u32..40, 1u32..9, prop::collection::vec(alt(), 0..5))
            .prop_map(|(processed, max_new, alts)| Op::Submit { processed, max_new, alts }),
        6 => (1u64..20).prop_map(Op::Run),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (0..WORKERS).prop_map(Op::Crash),
        1 => (0..WORKERS).prop_map(Op::Restart),
        1 => (0..WORKERS).prop_map(Op::Pause),
        1 => (0..WORKERS).prop_map(Op::Resume),
        1 => link.clone().prop_map(|(w, d)| Op::Partition(w, d)),
        1 => Just(Op::Heal),
        1 => link.clone().prop_map(|(w, d)| Op::DropNext(w, d)),
        1 => (link.clone(), 1u64..30).prop_map(|((w, d), ms)| Op::DelayNext(w, d, ms)),
        1 => link.prop_map(|(w, d)| Op::DuplicateNext(w, d)),
        1 => (0..WORKERS, 0u32..12).prop_map(|(w, free)| Op::SetCapacity(w, free)),
        1 => (any::<usize>(), 1u64..3).prop_map(|(r, d)| Op::StaleResult(r, d)),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(r, gap)| Op::ForgedToken(r, gap)),
        1 => any::<usize>().prop_map(Op::LateTimeout),
        1 => any::<usize>().prop_map(Op::RacingDecline),
        1 => any::<usize>().prop_map(Op::RacingAccept),
        1 => (0..WORKERS).prop_map(Op::FailOperation),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    network_delay: u64,
    offer_timeout: u64,
    decode_ms_per_token: f64,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0u64..3,
        1u64..12,
        0u8..6,
        prop::collection::vec(op(), 1..40),
    )
        .prop_map(|(network_delay, offer_timeout, per_token, ops)| Case {
            network_delay,
            offer_timeout,
            decode_ms_per_token: per_token as f64,
            ops,
        })
}

fn candidate(sim: &Simulation, alt: &Alt, processed: u32) -> Candidate {
    let worker = worker_id(alt.worker);
    let epoch = sim.worker(&worker).map(|w| w.epoch()).unwrap_or_default();
    let cached = match alt.tier {
        Tier::None => 0,
        _ => processed * alt.cached_fraction as u32 / 4,
    };
    Candidate {
        worker_id: worker,
        worker_epoch: if alt.stale_epoch {
            den_protocol::ids::Epoch(99)
        } else {
            epoch
        },
        tier: alt.tier,
        cached_token_count: cached,
        cached_bytes: cached as u64 * 64,
        queue_ms: alt.queue_ms as f64,
        prefix_load_ms: if alt.tier == Tier::Gpu { 0.0 } else { 2.0 },
        gpu_restore_ms: 1.0,
        prefill_ms_per_token: 0.25,
        first_token_ms: alt.first_token_ms as f64,
        page_size: 8,
        free_pages: 16,
        evictable_pages: 4,
        max_context: 64,
        online: true,
        model_loaded: true,
        exact: true,
        source_continuation_id: None,
        resident_token_count: 0,
        transfer: TransferCapabilities::default(),
        imposed_ms: 0.0,
    }
}

fn link(w: usize, to_worker: bool) -> (Endpoint, Endpoint) {
    let worker = Endpoint::Worker(worker_id(w));
    if to_worker {
        (Endpoint::Router, worker)
    } else {
        (worker, Endpoint::Router)
    }
}

/// Run a case; returns the simulation (quiet) and the submitted request ids.
fn run(case: &Case) -> (Simulation, Vec<RequestId>) {
    let mut sim = Simulation::new(SimConfig {
        network_delay: case.network_delay,
        offer_timeout: case.offer_timeout,
        decode_ms_per_token: case.decode_ms_per_token,
        deadline_ms: 300,
        ..SimConfig::default()
    });
    for i in 0..WORKERS {
        sim.add_worker(worker_id(i), [MODEL], Counters::new(16, 4));
    }
    let mut ids: Vec<RequestId> = Vec::new();
    let pick = |ids: &[RequestId], i: usize| ids.get(i % ids.len().max(1)).cloned();
    for op in &case.ops {
        match op {
            Op::Submit {
                processed,
                max_new,
                alts,
            } => {
                let id = RequestId::from(format!("req-{}", ids.len()));
                let tokens = (0..=*processed).collect();
                let Ok(request) = GenerationRequest::new(id.clone(), MODEL, tokens, *max_new)
                else {
                    continue;
                };
                let candidates = alts
                    .iter()
                    .map(|a| candidate(&sim, a, *processed))
                    .collect();
                sim.submit(request, candidates);
                ids.push(id);
            }
            Op::Cancel(i) => {
                if let Some(id) = pick(&ids, *i) {
                    sim.cancel(&id);
                }
            }
            Op::Run(ticks) => sim.run(*ticks).unwrap(),
            Op::Crash(w) => sim.crash(&worker_id(*w)),
            Op::Restart(w) => sim.restart(&worker_id(*w)),
            Op::Pause(w) => sim.pause(&worker_id(*w)),
            Op::Resume(w) => sim.resume(&worker_id(*w)),
            Op::Partition(w, d) => {
                let (from, to) = link(*w, *d);
                sim.partition_link(from, to);
            }
            Op::Heal => sim.heal(),
            Op::DropNext(w, d) => {
                let (from, to) = link(*w, *d);
                sim.drop_next(from, to);
            }
            Op::DelayNext(w, d, ms) => {
                let (from, to) = link(*w, *d);
                sim.delay_next(from, to, *ms);
            }
            Op::DuplicateNext(w, d) => {
                let (from, to) = link(*w, *d);
                sim.duplicate_next(from, to);
            }
            Op::SetCapacity(w, free) => sim.set_capacity(&worker_id(*w), Counters::new(*free, 0)),
            Op::StaleResult(i, delta) => {
                let Some(id) = pick(&ids, *i) else { continue };
                let Some(current) = sim.router().assignment(&id).map(|a| a.attempt) else {
                    continue;
                };
                // An attempt that is not the current one: older when possible, else newer.
                let attempt = if current > *delta {
                    current - delta
                } else {
                    current + delta
                };
                sim.inject_router(RouterInput::Result {
                    assignment: AssignmentId::new(id, attempt),
                    result: Box::new(WorkerResult::completed(vec![666], 0)),
                });
            }
            Op::ForgedToken(i, gap) => {
                let Some(id) = pick(&ids, *i) else { continue };
                let Some(assignment) = sim.router().assignment(&id).cloned() else {
                    continue;
                };
                let delivered = sim.router().delivered(&id).unwrap_or(0);
                // A duplicate of the last delivered index, or a gap past the next one.
                let index = if *gap || delivered == 0 {
                    delivered + 1
                } else {
                    delivered - 1
                };
                sim.inject_router(RouterInput::Token {
                    assignment,
                    token: 666,
                    index,
                });
            }
            Op::LateTimeout(i) => {
                let Some(id) = pick(&ids, *i) else { continue };
                let Some(current) = sim.router().assignment(&id).cloned() else {
                    continue;
                };
                // A timeout for an older attempt, or for the current one once accepted.
                let assignment = if current.attempt > 1 {
                    AssignmentId::new(id.clone(), current.attempt - 1)
                } else if sim.router().phase(&id) != Some(Phase::Offered) {
                    current
                } else {
                    continue;
                };
                sim.inject_router(RouterInput::OfferTimeout { assignment });
            }
            Op::RacingDecline(i) => {
                // The router hears "declined" for its current offer (a racing answer).
                let Some(id) = pick(&ids, *i) else { continue };
                if sim.router().phase(&id) != Some(Phase::Offered) {
                    continue;
                }
                let Some(assignment) = sim.router().assignment(&id).cloned() else {
                    continue;
                };
                sim.inject_router(RouterInput::OfferResult {
                    assignment,
                    worker_epoch: Default::default(),
                    accepted: false,
                    reason: Some(DeclineReason::InsufficientPages),
                });
            }
            Op::RacingAccept(i) => {
                // The router hears "accepted" for its current offer, whatever the worker
                // really said: without a result the deadline has to end it.
                let Some(id) = pick(&ids, *i) else { continue };
                if sim.router().phase(&id) != Some(Phase::Offered) {
                    continue;
                }
                let Some(assignment) = sim.router().assignment(&id).cloned() else {
                    continue;
                };
                sim.inject_router(RouterInput::OfferResult {
                    assignment,
                    worker_epoch: Default::default(),
                    accepted: true,
                    reason: None,
                });
            }
            Op::FailOperation(w) => {
                // The engine fails the in-flight operation of the worker's first assignment.
                let worker = worker_id(*w);
                let failing = sim.worker(&worker).and_then(|wk| {
                    wk.assignments()
                        .find_map(|(a, s)| s.in_flight.map(|op| (a.clone(), op)))
                });
                let Some((assignment, operation)) = failing else {
                    continue;
                };
                sim.inject_worker(
                    &worker,
                    WorkerInput::OperationDone {
                        assignment,
                        outcome: OperationOutcome::Failed {
                            operation,
                            detail: "injected".into(),
                        },
                    },
                );
            }
        }
        check_counters(&sim);
    }
    sim.heal();
    for i in 0..WORKERS {
        sim.resume(&worker_id(i));
        sim.restart(&worker_id(i));
    }
    let quiet = sim.run_until_quiet(100_000).unwrap();
    assert!(quiet, "the simulation settles");
    check_counters(&sim);
    (sim, ids)
}

/// (d) every page accounted; releasing twice releases once.
fn check_counters(sim: &Simulation) {
    for w in sim.workers() {
        let c = w.capacity();
        assert!(c.accounted(), "{} lost a page: {c:?}", w.id());
        let mut copy = c.clone();
        let ids: Vec<AssignmentId> = c.reservations().map(|(a, _)| a.clone()).collect();
        for a in ids {
            assert!(copy.release(&a));
            assert!(!copy.release(&a), "second release of {a} did something");
        }
        assert!(copy.accounted());
        assert_eq!(
            copy.free_pages() + copy.evictable_pages(&Default::default()),
            c.total()
        );
    }
}

/// (a) Inputs naming an attempt other than the latest offered one change nothing, and
/// completions come from the latest attempt.
fn check_fencing(sim: &Simulation) {
    let mut latest: BTreeMap<RequestId, u64> = BTreeMap::new();
    for entry in sim.trace() {
        let TraceEvent::Router { input, effects } = &entry.event else {
            continue;
        };
        let named = match input {
            RouterInput::OfferResult { assignment, .. }
            | RouterInput::Token { assignment, .. }
            | RouterInput::Result { assignment, .. }
            | RouterInput::OfferTimeout { assignment }
            | RouterInput::WorkerUnavailable { assignment, .. } => Some(assignment),
            _ => None,
        };
        if let Some(a) = named
            && latest.get(&a.request) != Some(&a.attempt)
        {
            assert!(
                effects.is_empty(),
                "stale {a} changed something: {effects:?}"
            );
        }
        for e in effects {
            match e {
                RouterEffect::Send(out) => {
                    if let RouterMessage::Offer(o) = &out.message {
                        latest.insert(o.assignment.request.clone(), o.assignment.attempt);
                    }
                }
                RouterEffect::Local(LocalRouterEffect::Deliver(d)) => {
                    if let DeliveryKind::Completed { .. } = d.kind {
                        let Some(RouterInput::Result { assignment, .. }) = Some(input) else {
                            panic!("completion without a result: {input:?}");
                        };
                        assert_eq!(latest.get(&assignment.request), Some(&assignment.attempt));
                    }
                }
                _ => {}
            }
        }
    }
}

/// (b) one terminal delivery each; contiguous deltas before it, matching the result.
fn check_deliveries(sim: &Simulation, ids: &[RequestId]) {
    for id in ids {
        let deliveries: Vec<_> = sim.deliveries(id).collect();
        let terminal: Vec<usize> = deliveries
            .iter()
            .enumerate()
            .filter(|(_, r)| r.delivery.is_terminal())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(terminal.len(), 1, "{id}: {deliveries:?}");
        assert_eq!(
            terminal[0],
            deliveries.len() - 1,
            "{id}: delivery after terminal"
        );
        let streamed = sim.streamed(id);
        for (i, (index, _)) in streamed.iter().enumerate() {
            assert_eq!(
                *index as usize, i,
                "{id}: deltas not contiguous: {streamed:?}"
            );
        }
        assert!(
            streamed.iter().all(|(_, t)| *t != 666),
            "{id}: forged token delivered"
        );
        if let DeliveryKind::Completed { result } = &deliveries[terminal[0]].delivery.kind {
            assert_ne!(result.tokens, [666], "{id}: stale result delivered");
            let tokens: Vec<u32> = streamed.iter().map(|(_, t)| *t).collect();
            assert!(
                result.tokens.starts_with(&tokens),
                "{id}: {tokens:?} vs {result:?}"
            );
            let record = sim.router().record(id).unwrap();
            assert!(record.chosen().is_some_and(|a| a.accepted_at.is_some()));
        }
    }
    for w in sim.workers() {
        assert_eq!(w.assignments().count(), 0, "{} still has work", w.id());
        assert_eq!(
            w.capacity().reserved_pages(),
            0,
            "{} leaks a reservation",
            w.id()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The router's lazy ranking offers exactly what `candidate::rank` orders.
    #[test]
    fn lazy_snapshot_order_equals_rank(
        processed in 1u32..40,
        alts in prop::collection::vec((alt(), 0u8..3), 0..24),
    ) {
        let sim = Simulation::new(SimConfig::default());
        let request = GenerationRequest::new("r", MODEL, (0..=processed).collect(), 4).unwrap();
        // Few distinct queue values, so that ties on TTFT are common.
        let candidates: Vec<Candidate> = alts
            .iter()
            .map(|(a, q)| Candidate { queue_ms: *q as f64, ..candidate(&sim, a, processed) })
            .collect();
        let ranked = rank(&request, candidates.clone());
        let snapshot = CandidateSnapshot::score(&request, candidates);
        let order = snapshot.offer_order();
        prop_assert_eq!(snapshot.best(), order.first().copied());
        prop_assert_eq!(snapshot.ranking(), ranked);
    }

    #[test]
    fn random_interleavings_keep_every_invariant(case in case()) {
        let (sim, ids) = run(&case);
        check_fencing(&sim);
        check_deliveries(&sim, &ids);
        // (c) replay is byte-identical.
        let (again, _) = run(&case);
        prop_assert_eq!(sim.trace_json().unwrap(), again.trace_json().unwrap());
        prop_assert!(sim == again);
    }
}
