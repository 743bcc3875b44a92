//! The worker state machine over the real page pool (spec §3.6–3.7, tests L-1, L-3 and
//! L-5: page size 2, 4 pages, tokens [1 2 3 4], max_new 2 ⇒ target 5 ⇒ 3 pages).
//!
//! A small engine stands in for the runtime: it runs each started operation against the
//! pool the way the paged handlers do (§3.9) — restore allocates the route from the
//! assignment's reservation, prefill appends the uncached suffix, decode appends one row
//! per generated token — and reports the outcome back to the worker.

use crate::pool_support;

use std::sync::Arc;

use den_protocol::candidate::{Tier, estimate};
use den_protocol::ids::{AssignmentId, Epoch, ModelFingerprint};
use den_protocol::pool::PagePool;
use den_protocol::request::GenerationRequest;
use den_protocol::time::Millis;
use den_protocol::wire::{Cancel, Offer, ResultStatus, StopReason, WorkerMessage, WorkerResult};
use den_protocol::worker::{
    AssignmentPhase, LocalWorkerEffect, Operation, OperationKind, OperationOutcome, Worker,
    WorkerEffect, WorkerInput,
};
use pool_support::*;

type PoolWorker = Worker<PagePool>;

fn worker(pool: PagePool) -> PoolWorker {
    Worker::new("w", Epoch(0), [ModelFingerprint::from("model-a")], pool)
}

fn offer(request: GenerationRequest, tier: Tier, cached: u32, source: Option<&str>) -> Offer {
    let candidate = candidate(tier, cached, 4, source);
    let estimate = estimate(&request, &candidate);
    Offer {
        assignment: AssignmentId::new(request.id.clone(), 1),
        worker_epoch: Epoch(0),
        request: Arc::new(request),
        candidate,
        estimate,
    }
}

fn started(effects: &[WorkerEffect]) -> Vec<Operation> {
    effects
        .iter()
        .filter_map(|e| match e {
            WorkerEffect::Local(LocalWorkerEffect::Start(op)) => Some(op.clone()),
            _ => None,
        })
        .collect()
}

fn accepted(effects: &[WorkerEffect]) -> bool {
    effects
        .iter()
        .any(|e| matches!(e, WorkerEffect::Send(WorkerMessage::OfferResult(r)) if r.accepted))
}

fn result(effects: &[WorkerEffect]) -> Option<WorkerResult> {
    effects.iter().find_map(|e| match e {
        WorkerEffect::Send(WorkerMessage::Result(m)) => Some((*m.result).clone()),
        _ => None,
    })
}

/// Run one operation against the pool as the paged handlers would. Restore brings back
/// `restored` tokens (possibly fewer than the candidate claimed); decode emits `output`.
/// Returns the worker's effects for the tokens and the outcome.
fn run(w: &mut PoolWorker, op: &Operation, restored: u32, output: &[u32]) -> Vec<WorkerEffect> {
    let work = Arc::clone(&op.work);
    let (a, route) = (&work.assignment, &work.route);
    let pool = w.capacity_mut();
    assert!(
        pool.reservation_for(a).is_some(),
        "{:?} runs with the assignment's reservation",
        op.kind
    );
    let mut effects = Vec::new();
    let outcome = match op.kind {
        OperationKind::Restore => {
            pool.allocate(route, restored).unwrap();
            OperationOutcome::Restored {
                cached_token_count: Some(restored),
            }
        }
        OperationKind::Prefill => {
            if pool.route(route).is_none() {
                pool.allocate(route, 0).unwrap();
            }
            let have = pool.route(route).unwrap().token_count();
            let missing = work.request.processed() - have;
            let append = pool.append_reserve(route, missing).unwrap();
            pool.commit_append(route, append.id).unwrap();
            OperationOutcome::Prefilled
        }
        OperationKind::Decode => {
            for (index, token) in output.iter().enumerate() {
                let pool = w.capacity_mut();
                let append = pool.append_reserve(route, 1).unwrap();
                pool.commit_append(route, append.id).unwrap();
                let input = WorkerInput::Token {
                    assignment: a.clone(),
                    token: *token,
                    index: index as u32,
                };
                effects.extend(w.handle(Millis(1), input));
            }
            OperationOutcome::Decoded {
                tokens: output.to_vec(),
                stop: StopReason::Length,
            }
        }
    };
    effects.extend(w.handle(
        Millis(2),
        WorkerInput::OperationDone {
            assignment: a.clone(),
            outcome,
        },
    ));
    if op.kind == OperationKind::Prefill {
        // A prefill continues into its decode with no second `Start`.
        assert!(started(&effects).is_empty(), "no Start after Prefilled");
        let decode = Operation {
            kind: OperationKind::Decode,
            ..op.clone()
        };
        effects.extend(run(w, &decode, restored, output));
    }
    effects
}

#[test]
fn l_1_accepted_work_runs_restore_prefill_decode_on_its_reservation() {
    let mut w = worker(pool(2, 4));
    let effects = w.handle(
        Millis(0),
        WorkerInput::Offer(Box::new(offer(
            request("req", vec![1, 2, 3, 4]),
            Tier::Ssd,
            2,
            None,
        ))),
    );
    assert!(accepted(&effects));
    assert_eq!(w.capacity().reserved_count(), 3);

    let mut ops = started(&effects);
    let mut kinds = Vec::new();
    let mut last = Vec::new();
    while let Some(op) = ops.pop() {
        kinds.push(op.kind);
        // The restore brings back 1 token although the candidate said 2.
        last = run(&mut w, &op, 1, &[9, 10]);
        ops.extend(started(&last));
    }
    // The prefill went on into the decode (`run` checks that nothing was started).
    assert_eq!(kinds, [OperationKind::Restore, OperationKind::Prefill]);
    let result = result(&last).unwrap();
    assert_eq!(
        (
            result.status,
            result.tokens.clone(),
            result.cached_token_count
        ),
        (ResultStatus::Completed, vec![9, 10], 1)
    );
    let pool = w.capacity();
    assert_eq!(pool.reserved_count(), 0);
    let route = pool
        .route(&den_protocol::ids::RouteId::from("req"))
        .unwrap();
    assert_eq!(
        route.token_count(),
        5,
        "completed routes stay resident as cache"
    );
    pool.check_invariants().unwrap();
}

#[test]
fn l_3_gpu_offer_forks_the_prefix_and_starts_prefilling() {
    let mut pool = pool(2, 4);
    pool.allocate(&r("shared-prefix"), 2).unwrap();
    let mut w = worker(pool);
    let effects = w.handle(
        Millis(0),
        WorkerInput::Offer(Box::new(offer(
            request("req", vec![1, 2, 3, 4]),
            Tier::Gpu,
            2,
            Some("shared-prefix"),
        ))),
    );
    assert!(accepted(&effects));
    let a = AssignmentId::new("req", 1);
    assert_eq!(w.assignment(&a).unwrap().phase, AssignmentPhase::Prefilling);
    assert_eq!(w.capacity().reserved_count(), 2);
    assert_eq!(
        w.capacity().route(&r("req")).unwrap().pages(),
        w.capacity().route(&r("shared-prefix")).unwrap().pages()
    );

    // Cancel with the prefill pending, then the task runs: its pages stay reserved
    // through `Prefilled` (the device goes on into the decode, which may already be
    // writing them) and go when the decode's outcome comes back.
    assert_eq!(started(&effects)[0].kind, OperationKind::Prefill);
    let _ = w.handle(
        Millis(1),
        WorkerInput::Cancel(Cancel {
            assignment: a.clone(),
        }),
    );
    assert_eq!(w.capacity().reserved_count(), 2);
    let effects = w.handle(
        Millis(2),
        WorkerInput::OperationDone {
            assignment: a.clone(),
            outcome: OperationOutcome::Prefilled,
        },
    );
    assert!(effects.is_empty(), "{effects:?}");
    assert_eq!(w.capacity().reserved_count(), 2);
    let _ = w.handle(
        Millis(3),
        WorkerInput::OperationDone {
            assignment: a,
            outcome: OperationOutcome::Failed {
                operation: OperationKind::Decode,
                detail: "cancelled".into(),
            },
        },
    );
    assert_eq!(w.capacity().reserved_count(), 0);
    assert!(
        w.capacity().route(&r("req")).is_none(),
        "the abandoned fork is dropped"
    );
    assert!(w.capacity().route(&r("shared-prefix")).is_some());
    w.capacity().check_invariants().unwrap();
}

#[test]
fn l_5_cancel_keeps_the_reservation_until_the_pending_task_returns() {
    let mut w = worker(pool(2, 4));
    let effects = w.handle(
        Millis(0),
        WorkerInput::Offer(Box::new(offer(
            request("req", vec![1, 2, 3, 4]),
            Tier::Ssd,
            2,
            None,
        ))),
    );
    let a = AssignmentId::new("req", 1);
    assert_eq!(started(&effects).len(), 1);
    assert_eq!(w.capacity().reserved_count(), 3);

    let cancel = w.handle(
        Millis(1),
        WorkerInput::Cancel(Cancel {
            assignment: a.clone(),
        }),
    );
    let hooks: Vec<_> = cancel
        .iter()
        .filter_map(|e| match e {
            WorkerEffect::Local(LocalWorkerEffect::CancelOperation {
                assignment,
                in_flight,
            }) => Some((assignment.clone(), *in_flight)),
            _ => None,
        })
        .collect();
    assert_eq!(hooks, [(a.clone(), Some(OperationKind::Restore))]);
    assert_eq!(
        w.capacity().reserved_count(),
        3,
        "pages stay reserved while the task may still write"
    );
    assert!(
        w.handle(
            Millis(1),
            WorkerInput::Cancel(Cancel {
                assignment: a.clone()
            })
        )
        .is_empty()
    );

    // The pending task runs (its restore claims a page) and returns.
    let done = run(&mut w, &started(&effects)[0], 1, &[]);
    assert!(
        done.iter()
            .any(|e| matches!(e, WorkerEffect::Local(LocalWorkerEffect::Released { .. })))
    );
    assert_eq!(
        (w.capacity().reserved_count(), w.capacity().free_count()),
        (0, 4)
    );
    w.capacity().check_invariants().unwrap();
}

#[test]
fn heartbeat_fields_come_from_the_pool_with_live_routes_protected() {
    let mut pool = pool(2, 4);
    pool.allocate(&r("req"), 2).unwrap();
    pool.set_policy(&r("req"), durable(0.5, 10.0, 1.0)).unwrap();
    let mut w = worker(pool);
    let mut obs = den_protocol::observation::Observation::new("w", "node");
    w.fill_observation(&mut obs);
    assert_eq!((obs.free_pages, obs.evictable_pages), (3, 1));
    // An assignment on that continuation protects it.
    let req = request("req-2", vec![1, 2, 3]).with_continuation_id("req");
    let effects = w.handle(
        Millis(0),
        WorkerInput::Offer(Box::new(offer(req, Tier::Gpu, 2, None))),
    );
    assert!(accepted(&effects));
    w.fill_observation(&mut obs);
    assert_eq!(obs.evictable_pages, 0);
}

/// A lower-tier offer of `cached` tokens whose first `resident` are in `source`.
fn mixed_offer(request: GenerationRequest, cached: u32, resident: u32, source: &str) -> Offer {
    let mut o = offer(request, Tier::Ram, cached, Some(source));
    o.candidate.resident_token_count = resident;
    o.estimate = estimate(&o.request, &o.candidate);
    o
}

#[test]
fn a_resident_head_is_forked_and_only_the_tail_restored() {
    // Page size 2, 5 pages; "shared-prefix" holds tokens 1–2 (page 0). The offer reuses
    // 4 tokens: the first 2 resident, 3–4 from RAM. Tokens [1..6], max_new 2 ⇒ 7 ⇒ 4
    // pages, one shared: 3 to reserve.
    let mut pool = pool(2, 5);
    pool.allocate(&r("shared-prefix"), 2).unwrap();
    let mut w = worker(pool);
    let effects = w.handle(
        Millis(0),
        WorkerInput::Offer(Box::new(mixed_offer(
            request("req", vec![1, 2, 3, 4, 5, 6]),
            4,
            2,
            "shared-prefix",
        ))),
    );
    assert!(accepted(&effects), "{effects:?}");
    let a = AssignmentId::new("req", 1);
    let state = w.assignment(&a).unwrap();
    assert_eq!(state.phase, AssignmentPhase::Restoring);
    assert_eq!(state.cached_token_count, 2, "the head counts at once");
    assert_eq!(w.capacity().reserved_count(), 3);
    let route = w.capacity().route(&r("req")).unwrap();
    assert_eq!(route.token_count(), 2);
    assert_eq!(
        route.pages(),
        w.capacity().route(&r("shared-prefix")).unwrap().pages()
    );
    let ops = started(&effects);
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].kind, OperationKind::Restore);
    // The restore appends the tail after the forked head, then the prefill follows.
    let pool = w.capacity_mut();
    let append = pool.append_reserve(&r("req"), 2).unwrap();
    pool.commit_append(&r("req"), append.id).unwrap();
    let after = w.handle(
        Millis(1),
        WorkerInput::OperationDone {
            assignment: a.clone(),
            outcome: OperationOutcome::Restored {
                cached_token_count: Some(4),
            },
        },
    );
    assert_eq!(w.assignment(&a).unwrap().cached_token_count, 4);
    assert_eq!(started(&after)[0].kind, OperationKind::Prefill);
    assert_eq!(
        w.capacity()
            .route(&r("shared-prefix"))
            .unwrap()
            .token_count(),
        2,
        "the source is untouched"
    );
    w.capacity().check_invariants().unwrap();
}

#[test]
fn a_resident_head_that_is_gone_declines_the_offer_unchanged() {
    let mut w = worker(pool(2, 5));
    let effects = w.handle(
        Millis(0),
        WorkerInput::Offer(Box::new(mixed_offer(
            request("req", vec![1, 2, 3, 4, 5, 6]),
            4,
            2,
            "shared-prefix",
        ))),
    );
    assert!(!accepted(&effects));
    assert!(
        format!("{effects:?}").contains("ResidentPrefixUnavailable"),
        "{effects:?}"
    );
    assert_eq!(w.capacity().reserved_count(), 0);
    assert!(w.capacity().route(&r("req")).is_none());
}
