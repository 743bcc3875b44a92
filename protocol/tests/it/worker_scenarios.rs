//! Worker scenarios (spec §7.3 W-1..W-4) plus admission order, quiescence, tombstones,
//! crash/restart and the abstract page counters.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{MODEL, cand};
use den_protocol::candidate::{Candidate, Tier, estimate};
use den_protocol::capacity::{Capacity, DeclineReason};
use den_protocol::ids::{AssignmentId, Epoch, ModelFingerprint, RouteId};
use den_protocol::observation::Observation;
use den_protocol::request::GenerationRequest;
use den_protocol::time::Millis;
use den_protocol::wire::{
    Cancel, FailureKind, Offer, OfferResult, ResultMessage, ResultStatus, StopReason, TokenDelta,
    WorkerMessage,
};
use den_protocol::worker::{
    AssignmentPhase, Counters, Finished, LocalWorkerEffect, OperationKind, OperationOutcome,
    ReleaseCause, Worker, WorkerConfig, WorkerEffect, WorkerInput,
};

fn a(attempt: u64) -> AssignmentId {
    AssignmentId::new("r", attempt)
}

/// P = 32, max_new 8 → target 40 → 5 pages of 8.
fn request() -> GenerationRequest {
    GenerationRequest::new("r", MODEL, (0..=32).collect(), 8).unwrap()
}

/// SSD, 16 cached, epoch 3, on worker `w`.
fn w_cand() -> Candidate {
    Candidate {
        worker_epoch: Epoch(3),
        ..cand("w", Tier::Ssd, 16)
    }
}

fn offer_of(attempt: u64, candidate: Candidate) -> WorkerInput {
    let request = request();
    let estimate = estimate(&request, &candidate);
    WorkerInput::Offer(Box::new(Offer {
        assignment: a(attempt),
        worker_epoch: candidate.worker_epoch,
        request: Arc::new(request),
        candidate,
        estimate,
    }))
}

fn worker(free: u32) -> Worker<Counters> {
    Worker::new(
        "w",
        Epoch(3),
        [ModelFingerprint::from(MODEL)],
        Counters::new(free, 0),
    )
}

fn done(attempt: u64, outcome: OperationOutcome) -> WorkerInput {
    WorkerInput::OperationDone {
        assignment: a(attempt),
        outcome,
    }
}

fn started(effects: &[WorkerEffect]) -> Vec<OperationKind> {
    effects
        .iter()
        .filter_map(|e| match e {
            WorkerEffect::Local(LocalWorkerEffect::Start(op)) => Some(op.kind),
            _ => None,
        })
        .collect()
}

fn offer_result(effects: &[WorkerEffect]) -> Option<&OfferResult> {
    effects.iter().find_map(|e| match e {
        WorkerEffect::Send(WorkerMessage::OfferResult(r)) => Some(r),
        _ => None,
    })
}

fn result(effects: &[WorkerEffect]) -> Option<&ResultMessage> {
    effects.iter().find_map(|e| match e {
        WorkerEffect::Send(WorkerMessage::Result(r)) => Some(r),
        _ => None,
    })
}

fn decoded(tokens: Vec<u32>) -> OperationOutcome {
    OperationOutcome::Decoded {
        tokens,
        stop: StopReason::Length,
    }
}

#[test]
fn w_1_accept_restore_prefill_decode_completes() {
    let mut w = worker(8);
    let effects = w.handle(Millis(0), offer_of(1, w_cand()));
    assert_eq!(effects.len(), 2);
    assert!(offer_result(&effects).is_some_and(|r| r.accepted && r.worker_epoch == Epoch(3)));
    assert_eq!(started(&effects), [OperationKind::Restore]);
    assert!(
        matches!(effects[0], WorkerEffect::Send(_)),
        "offer result first"
    );
    // A restore result for another attempt is ignored.
    let restored = OperationOutcome::Restored {
        cached_token_count: Some(12),
    };
    assert!(w.handle(Millis(1), done(0, restored.clone())).is_empty());
    let effects = w.handle(Millis(4), done(1, restored.clone()));
    assert_eq!(started(&effects), [OperationKind::Prefill]);
    assert!(
        w.handle(Millis(4), done(1, restored)).is_empty(),
        "duplicate restore result"
    );
    // The prefill goes on into its decode on the device: nothing more to start.
    let effects = w.handle(Millis(9), done(1, OperationOutcome::Prefilled));
    assert!(effects.is_empty(), "{effects:?}");
    assert_eq!(
        w.assignment(&a(1)).unwrap().phase,
        AssignmentPhase::Decoding
    );
    let effects = w.handle(Millis(12), done(1, decoded(vec![5, 6])));
    let r = result(&effects).expect("a result");
    assert_eq!(r.result.status, ResultStatus::Completed);
    assert_eq!(r.result.tokens, [5, 6]);
    assert_eq!(
        r.result.cached_token_count, 12,
        "the restore's actual count"
    );
    assert_eq!(r.result.timings.restore_ms, Some(4));
    assert_eq!(r.result.timings.prefill_ms, Some(5));
    assert_eq!(r.result.timings.decode_ms, Some(3));
    assert_eq!(r.result.timings.total_ms, 12);
    assert!(
        effects.contains(&WorkerEffect::Local(LocalWorkerEffect::Released {
            assignment: a(1),
            cause: ReleaseCause::Completed
        }))
    );
    assert!(w.assignment(&a(1)).is_none());
    assert!(matches!(
        w.finished(&a(1)),
        Some(Finished::Completed { .. })
    ));
    // The completed route stays resident (5 pages), as evictable cache.
    assert_eq!(w.capacity().free_pages(), 3);
    assert_eq!(w.capacity().evictable_pages(&BTreeSet::new()), 5);
    assert!(w.capacity().accounted());
}

#[test]
fn w_2_insufficient_pages_declines_and_stores_nothing() {
    let mut w = worker(1);
    let before = w.clone();
    let effects = w.handle(Millis(0), offer_of(1, w_cand()));
    assert_eq!(
        effects,
        [WorkerEffect::Send(WorkerMessage::OfferResult(
            OfferResult {
                assignment: a(1),
                worker_epoch: Epoch(3),
                accepted: false,
                reason: Some(DeclineReason::InsufficientPages)
            }
        ))]
    );
    assert_eq!(w, before);
}

#[test]
fn w_3_cancel_fences_at_once_and_releases_pages_at_quiescence() {
    let mut w = worker(8);
    let _ = w.handle(Millis(0), offer_of(1, w_cand()));
    assert_eq!(w.capacity().free_pages(), 3);
    let effects = w.handle(Millis(1), WorkerInput::Cancel(Cancel { assignment: a(1) }));
    assert_eq!(
        effects,
        [WorkerEffect::Local(LocalWorkerEffect::CancelOperation {
            assignment: a(1),
            in_flight: Some(OperationKind::Restore)
        })]
    );
    // The restore may still write into the reservation: the pages stay reserved.
    assert_eq!(w.capacity().free_pages(), 3);
    assert_eq!(
        w.assignment(&a(1)).unwrap().phase,
        AssignmentPhase::Cancelling
    );
    assert!(
        w.handle(Millis(2), WorkerInput::Cancel(Cancel { assignment: a(1) }))
            .is_empty()
    );
    let restored = OperationOutcome::Restored {
        cached_token_count: None,
    };
    let effects = w.handle(Millis(3), done(1, restored.clone()));
    assert_eq!(
        effects,
        [WorkerEffect::Local(LocalWorkerEffect::Released {
            assignment: a(1),
            cause: ReleaseCause::Cancelled
        })],
        "no wire message for a fenced assignment"
    );
    assert_eq!(w.capacity().free_pages(), 8);
    assert!(w.assignment(&a(1)).is_none());
    assert!(w.handle(Millis(4), done(1, restored)).is_empty());
    assert!(
        w.handle(Millis(4), WorkerInput::Cancel(Cancel { assignment: a(1) }))
            .is_empty()
    );
}

#[test]
fn w_4_token_deltas_are_ordered_and_assignment_fenced() {
    let mut w = worker(8);
    // GPU tier with everything cached: decode is the first operation.
    let gpu = Candidate {
        worker_epoch: Epoch(3),
        ..cand("w", Tier::Gpu, 32)
    };
    let effects = w.handle(Millis(0), offer_of(1, gpu));
    assert_eq!(started(&effects), [OperationKind::Decode]);
    let tok = |token, index| WorkerInput::Token {
        assignment: a(1),
        token,
        index,
    };
    let effects = w.handle(Millis(1), tok(9, 0));
    assert_eq!(
        effects,
        [WorkerEffect::Send(WorkerMessage::Token(TokenDelta {
            assignment: a(1),
            token: 9,
            index: 0
        }))]
    );
    assert!(w.handle(Millis(1), tok(9, 0)).is_empty(), "duplicate");
    assert!(w.handle(Millis(1), tok(9, 2)).is_empty(), "gap");
    assert_eq!(w.handle(Millis(2), tok(10, 1)).len(), 1);
    assert_eq!(w.assignment(&a(1)).unwrap().emitted, 2);
    let stale = WorkerInput::Token {
        assignment: a(7),
        token: 1,
        index: 2,
    };
    assert!(w.handle(Millis(2), stale).is_empty(), "unknown assignment");
    let _ = w.handle(Millis(3), WorkerInput::Cancel(Cancel { assignment: a(1) }));
    assert!(w.handle(Millis(3), tok(11, 2)).is_empty(), "post-cancel");
}

#[test]
fn admission_checks_run_in_spec_order_and_declines_change_nothing() {
    let decline = |w: &mut Worker<Counters>, c: Candidate| {
        let before = w.clone();
        let effects = w.handle(Millis(0), offer_of(9, c));
        assert_eq!(*w, before, "a decline changes no state");
        let r = offer_result(&effects).expect("an offer result").clone();
        assert!(!r.accepted);
        assert_eq!(
            r.worker_epoch,
            w.epoch(),
            "declines carry the current epoch"
        );
        r.reason
    };
    let stale_and_wrong = Candidate {
        worker_epoch: Epoch(1),
        ..cand("other", Tier::Ssd, 16)
    };
    let mut offline = worker(8);
    let _ = offline.handle(Millis(0), WorkerInput::Crash);
    assert_eq!(offline.epoch(), Epoch(4));
    assert_eq!(
        decline(&mut offline, stale_and_wrong.clone()),
        Some(DeclineReason::WorkerOffline)
    );
    let mut w = worker(8);
    assert_eq!(
        decline(&mut w, stale_and_wrong),
        Some(DeclineReason::WorkerEpochChanged)
    );
    let wrong = Candidate {
        worker_epoch: Epoch(3),
        ..cand("other", Tier::Ssd, 16)
    };
    assert_eq!(decline(&mut w, wrong), Some(DeclineReason::WrongWorker));
    let mut no_model = Worker::new(
        "w",
        Epoch(3),
        [ModelFingerprint::from("other")],
        Counters::new(8, 0),
    );
    assert_eq!(
        decline(&mut no_model, w_cand()),
        Some(DeclineReason::ModelNotLoaded)
    );
    let tight = Candidate {
        max_context: 39,
        ..w_cand()
    };
    assert_eq!(
        decline(&mut w, tight),
        Some(DeclineReason::ContextCapacityExceeded)
    );
    let mut draining = worker(8);
    let _ = draining.handle(Millis(0), WorkerInput::SetDraining { draining: true });
    assert_eq!(
        decline(&mut draining, w_cand()),
        Some(DeclineReason::Draining)
    );
    // Another live assignment for the same request (even one quiescing after a cancel).
    let _ = w.handle(Millis(0), offer_of(1, w_cand()));
    let _ = w.handle(Millis(1), WorkerInput::Cancel(Cancel { assignment: a(1) }));
    assert_eq!(
        decline(&mut w, w_cand()),
        Some(DeclineReason::RequestAlreadyAssigned)
    );
}

#[test]
fn duplicate_offer_is_reacknowledged_and_resends_the_terminal_result() {
    let mut w = worker(8);
    let gpu = Candidate {
        worker_epoch: Epoch(3),
        ..cand("w", Tier::Gpu, 32)
    };
    let _ = w.handle(Millis(0), offer_of(1, gpu.clone()));
    // While running: re-ack only, no second operation.
    let effects = w.handle(Millis(1), offer_of(1, gpu.clone()));
    assert_eq!(effects.len(), 1);
    assert!(offer_result(&effects).unwrap().accepted);
    let completed = w.handle(Millis(2), done(1, decoded(vec![4])));
    let sent = result(&completed).unwrap().clone();
    let snapshot = w.clone();
    let effects = w.handle(Millis(3), offer_of(1, gpu));
    assert_eq!(effects.len(), 2);
    assert!(offer_result(&effects).unwrap().accepted);
    assert_eq!(result(&effects), Some(&sent), "idempotent retransmission");
    assert!(started(&effects).is_empty());
    assert_eq!(w, snapshot);
}

#[test]
fn an_offer_overtaken_by_its_cancel_is_acknowledged_but_never_run() {
    let mut w = worker(8);
    assert!(
        w.handle(Millis(0), WorkerInput::Cancel(Cancel { assignment: a(1) }))
            .is_empty()
    );
    let effects = w.handle(Millis(1), offer_of(1, w_cand()));
    assert_eq!(effects.len(), 1);
    assert!(offer_result(&effects).unwrap().accepted);
    assert_eq!(w.capacity().free_pages(), 8);
    assert_eq!(w.assignments().count(), 0);
}

#[test]
fn failed_operation_sends_a_failed_result_and_releases() {
    let mut w = worker(8);
    let _ = w.handle(Millis(0), offer_of(1, w_cand()));
    let failed = OperationOutcome::Failed {
        operation: OperationKind::Restore,
        detail: "chunk missing".into(),
    };
    let effects = w.handle(Millis(2), done(1, failed));
    let r = result(&effects).unwrap();
    assert_eq!(r.result.status, ResultStatus::Failed);
    let failure = r.result.failure.as_ref().unwrap();
    assert_eq!(failure.kind, FailureKind::RestoreFailed);
    assert_eq!(failure.to_string(), "restore-failed: chunk missing");
    assert_eq!(w.capacity().free_pages(), 8);
    assert!(matches!(w.finished(&a(1)), Some(Finished::Failed { .. })));
    // A failure reported for an operation that is not in flight is ignored.
    let _ = w.handle(Millis(3), offer_of(2, w_cand()));
    let wrong = OperationOutcome::Failed {
        operation: OperationKind::Decode,
        detail: "late".into(),
    };
    assert!(w.handle(Millis(4), done(2, wrong)).is_empty());
}

#[test]
fn crash_loses_everything_and_restart_keeps_the_new_epoch() {
    let mut w = worker(8);
    let _ = w.handle(Millis(0), offer_of(1, w_cand()));
    assert!(w.handle(Millis(1), WorkerInput::Crash).is_empty());
    assert!(!w.online());
    assert_eq!(w.epoch(), Epoch(4));
    assert_eq!(w.assignments().count(), 0);
    assert_eq!(w.capacity().free_pages(), 8);
    assert!(w.capacity().accounted());
    let restored = OperationOutcome::Restored {
        cached_token_count: None,
    };
    assert!(
        w.handle(Millis(2), done(1, restored)).is_empty(),
        "late result after crash"
    );
    let _ = w.handle(Millis(3), WorkerInput::Restart);
    assert!(w.online());
    let effects = w.handle(Millis(4), offer_of(2, w_cand()));
    assert_eq!(
        offer_result(&effects).unwrap().reason,
        Some(DeclineReason::WorkerEpochChanged),
        "offers built from pre-crash observations are declined"
    );
    let fresh = Candidate {
        worker_epoch: Epoch(4),
        ..w_cand()
    };
    assert!(
        offer_result(&w.handle(Millis(5), offer_of(3, fresh)))
            .unwrap()
            .accepted
    );
}

#[test]
fn first_operation_follows_the_tier_and_missing_tokens() {
    let first = |c: Candidate| {
        let mut w = worker(8);
        started(&w.handle(Millis(0), offer_of(1, c)))
    };
    let at = |tier, cached| Candidate {
        worker_epoch: Epoch(3),
        ..cand("w", tier, cached)
    };
    assert_eq!(first(at(Tier::Ssd, 16)), [OperationKind::Restore]);
    assert_eq!(first(at(Tier::Gpu, 16)), [OperationKind::Prefill]);
    assert_eq!(first(at(Tier::None, 0)), [OperationKind::Prefill]);
    assert_eq!(first(at(Tier::Gpu, 32)), [OperationKind::Decode]);
    let mut w = worker(8);
    let _ = w.handle(Millis(0), offer_of(1, at(Tier::Gpu, 16)));
    assert_eq!(w.assignment(&a(1)).unwrap().cached_token_count, 16);
}

#[test]
fn tombstones_are_bounded_by_count_and_time() {
    let config = WorkerConfig {
        retention_ms: 100,
        retention_count: 2,
    };
    let mut w = worker(8).with_config(config);
    for attempt in 1..=3 {
        let _ = w.handle(
            Millis(attempt),
            WorkerInput::Cancel(Cancel {
                assignment: a(attempt),
            }),
        );
    }
    assert!(
        w.finished(&a(1)).is_none(),
        "oldest dropped beyond the count"
    );
    assert!(w.finished(&a(2)).is_some() && w.finished(&a(3)).is_some());
    let _ = w.handle(Millis(103), WorkerInput::Restart);
    assert!(
        w.finished(&a(3)).is_none(),
        "dropped after the retention time"
    );
}

#[test]
fn fill_observation_reports_authoritative_capacity() {
    let mut w = worker(8);
    let _ = w.handle(Millis(0), offer_of(1, w_cand()));
    let mut obs = Observation::new("x", "node-1");
    w.fill_observation(&mut obs);
    assert_eq!(obs.worker_id.as_str(), "w");
    assert_eq!(obs.epoch, Epoch(3));
    assert_eq!(
        (obs.free_pages, obs.evictable_pages, obs.queue_depth),
        (3, 0, 1)
    );
    assert!(obs.models.contains(&ModelFingerprint::from(MODEL)));
}

#[test]
fn counters_evict_oldest_unprotected_routes_and_keep_every_page_accounted() {
    let mut w = Worker::new(
        "w",
        Epoch(0),
        [ModelFingerprint::from(MODEL)],
        Counters::new(10, 2),
    );
    let run = |w: &mut Worker<Counters>, id: &str, attempt: u64| {
        let request = GenerationRequest::new(id, MODEL, (0..=32).collect(), 8).unwrap();
        let c = cand("w", Tier::None, 0);
        let e = estimate(&request, &c);
        let offer = Offer {
            assignment: AssignmentId::new(id, attempt),
            worker_epoch: Epoch(0),
            request: Arc::new(request),
            candidate: c,
            estimate: e,
        };
        w.handle(Millis(0), WorkerInput::Offer(Box::new(offer)))
    };
    // 5 pages each. a and b complete and become evictable routes.
    for id in ["a", "b"] {
        run(&mut w, id, 1);
        let assignment = AssignmentId::new(id, 1);
        let _ = w.handle(
            Millis(1),
            WorkerInput::OperationDone {
                assignment: assignment.clone(),
                outcome: OperationOutcome::Prefilled,
            },
        );
        let _ = w.handle(
            Millis(2),
            WorkerInput::OperationDone {
                assignment,
                outcome: decoded(vec![1]),
            },
        );
    }
    let c = w.capacity();
    assert_eq!(
        (c.free_pages(), c.anonymous_evictable(), c.resident_pages()),
        (0, 2, 10)
    );
    // c needs 5: 2 anonymous, then route a (oldest) is evicted; its 2 spare pages go free.
    let effects = run(&mut w, "c", 1);
    assert!(offer_result(&effects).unwrap().accepted);
    let c = w.capacity();
    assert_eq!(c.free_pages(), 2);
    assert_eq!(
        c.resident().map(|(r, _)| r.clone()).collect::<Vec<_>>(),
        [RouteId::from("b")]
    );
    assert!(c.accounted());
    // d needs 5: 2 free + route b (5) would do, but only if b is not protected.
    let mut protected = BTreeSet::new();
    protected.insert(RouteId::from("b"));
    assert_eq!(w.capacity().evictable_pages(&protected), 0);
    // Releases are idempotent.
    let mut counters = w.capacity().clone();
    assert!(counters.release(&AssignmentId::new("c", 1)));
    assert!(!counters.release(&AssignmentId::new("c", 1)));
    assert!(counters.accounted());
}
