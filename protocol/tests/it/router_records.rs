//! Router decisions where the spec was silent (§12): decline reasons kept in the decision
//! record, deadlines, garbage collection of terminal records, duplicate submits, counts.

use crate::common;

use std::sync::Arc;

use common::{
    a, accept, completed, decline, deliveries, locals, router_cand, router_request, sends, token,
    two_candidate_router,
};
use den_protocol::candidate::{Candidate, Tier};
use den_protocol::capacity::DeclineReason;
use den_protocol::decision::{AttemptOutcome, DecisionEventKind, TerminalOutcome};
use den_protocol::ids::{Epoch, WorkerId};
use den_protocol::router::{
    DeliveryKind, LocalRouterEffect, Router, RouterConfig, RouterEffect, RouterError, RouterInput,
};
use den_protocol::time::Millis;
use den_protocol::wire::{Failure, WorkerResult};

const T0: Millis = Millis(0);

#[test]
fn decline_reasons_are_kept_in_the_decision_record() {
    let (mut router, _) = two_candidate_router();
    let _ = router.handle(
        Millis(1),
        decline(a("r", 1), DeclineReason::InsufficientPages),
    );
    let effects = router.handle(
        Millis(2),
        RouterInput::OfferResult {
            assignment: a("r", 2),
            worker_epoch: Epoch(4),
            accepted: false,
            reason: Some(DeclineReason::WorkerEpochChanged),
        },
    );
    let record = router.record(&"r".into()).unwrap();
    assert_eq!(
        record.decline_reasons(),
        [
            Some(DeclineReason::InsufficientPages),
            Some(DeclineReason::WorkerEpochChanged)
        ]
    );
    assert_eq!(
        record.attempts[1].outcome,
        AttemptOutcome::Declined {
            reason: Some(DeclineReason::WorkerEpochChanged),
            worker_epoch: Epoch(4)
        }
    );
    let d = deliveries(&effects);
    let DeliveryKind::Error { error } = &d[0].kind else {
        panic!("expected an error");
    };
    let RouterError::NoFeasibleWorker { summary } = error else {
        panic!("expected no-feasible-worker, got {error:?}");
    };
    assert_eq!(summary.attempts, 2);
    let text = error.to_string();
    assert!(text.contains("2 offer(s) failed"), "{text}");
    assert!(
        text.contains("second declined (worker-epoch-changed)"),
        "{text}"
    );
    assert!(!text.contains('\n'));
    assert!(matches!(
        record.outcome,
        Some(TerminalOutcome::Failed {
            error: RouterError::NoFeasibleWorker { .. }
        })
    ));
}

#[test]
fn no_feasible_worker_at_submission_names_the_infeasible_reasons() {
    let mut router = Router::default();
    let tight = Candidate {
        free_pages: 1,
        ..router_cand("a", Tier::None, 0)
    };
    let offline = Candidate {
        online: false,
        ..router_cand("b", Tier::None, 0)
    };
    let effects = router.handle(
        T0,
        RouterInput::submit(router_request("r"), vec![tight, offline]),
    );
    assert!(sends(&effects).is_empty());
    let d = deliveries(&effects);
    assert_eq!(d.len(), 1);
    let text = match &d[0].kind {
        DeliveryKind::Error { error } => error.to_string(),
        other => panic!("expected an error, got {other:?}"),
    };
    assert!(
        text.contains("worker-offline ×1, insufficient-pages ×1"),
        "{text}"
    );
    let record = router.record(&"r".into()).unwrap();
    assert_eq!(record.candidates.infeasible().count(), 2);
    assert_eq!(record.candidates.ranking().infeasible.len(), 2);
    assert!(locals(&effects).contains(&"cancel-deadline-timer"));
    let empty = router.handle(T0, RouterInput::submit(router_request("s"), vec![]));
    let text = match &deliveries(&empty)[0].kind {
        DeliveryKind::Error { error } => error.to_string(),
        other => panic!("expected an error, got {other:?}"),
    };
    assert!(text.contains("no candidates were given"), "{text}");
}

#[test]
fn deadline_expiry_fails_with_deadline_exceeded_and_cancels_the_worker() {
    let mut router = Router::default();
    let effects = router.handle(
        T0,
        RouterInput::Submit {
            request: Arc::new(router_request("r")),
            candidates: vec![router_cand("w", Tier::None, 0)],
            deadline: Some(Millis(500)),
        },
    );
    assert!(
        effects.iter().any(|e| matches!(e,
        RouterEffect::Local(LocalRouterEffect::SetDeadlineTimer { at, .. }) if *at == Millis(500)))
    );
    let _ = router.handle(Millis(1), accept(a("r", 1)));
    let early = RouterInput::DeadlineExpired {
        request: "r".into(),
    };
    assert!(
        router.handle(Millis(499), early.clone()).is_empty(),
        "not yet due"
    );
    let effects = router.handle(Millis(500), early.clone());
    assert_eq!(sends(&effects), [("cancel", "w".to_owned(), 1)]);
    assert_eq!(
        deliveries(&effects)[0].kind,
        DeliveryKind::Error {
            error: RouterError::DeadlineExceeded {
                deadline: Millis(500)
            }
        }
    );
    let record = router.record(&"r".into()).unwrap();
    assert_eq!(record.attempts[0].outcome, AttemptOutcome::Superseded);
    assert!(router.handle(Millis(501), early).is_empty(), "terminal");
}

#[test]
fn default_deadline_applies_and_a_past_deadline_fails_at_once() {
    let config = RouterConfig {
        default_deadline_ms: 250,
        ..RouterConfig::default()
    };
    let mut router = Router::new(config);
    let _ = router.handle(
        Millis(10),
        RouterInput::submit(router_request("r"), vec![router_cand("w", Tier::None, 0)]),
    );
    assert_eq!(router.record(&"r".into()).unwrap().deadline, Millis(260));
    let effects = router.handle(
        Millis(20),
        RouterInput::Submit {
            request: Arc::new(router_request("late")),
            candidates: vec![router_cand("w", Tier::None, 0)],
            deadline: Some(Millis(20)),
        },
    );
    assert!(sends(&effects).is_empty());
    assert!(matches!(
        deliveries(&effects)[0].kind,
        DeliveryKind::Error {
            error: RouterError::DeadlineExceeded { .. }
        }
    ));
}

#[test]
fn terminal_records_are_collected_after_retention() {
    let mut router = Router::new(RouterConfig {
        retention_ms: 100,
        ..RouterConfig::default()
    });
    let _ = router.handle(
        T0,
        RouterInput::submit(router_request("r"), vec![router_cand("w", Tier::None, 0)]),
    );
    let _ = router.handle(Millis(5), accept(a("r", 1)));
    let _ = router.handle(Millis(10), completed(a("r", 1), vec![1]));
    assert!(router.handle(Millis(109), RouterInput::Tick).is_empty());
    assert!(router.record(&"r".into()).is_some());
    let effects = router.handle(Millis(110), RouterInput::Tick);
    assert!(
        matches!(&effects[..], [RouterEffect::Local(LocalRouterEffect::Decision(d))]
        if d.kind == DecisionEventKind::Collected)
    );
    assert!(router.record(&"r".into()).is_none());
    assert_eq!(router.counts().completed, 0);
    assert_eq!(router.counts().collected, 1);
    assert!(
        router
            .handle(Millis(111), completed(a("r", 1), vec![1]))
            .is_empty()
    );
    // After collection the id is unknown: a new submit is a new request.
    let effects = router.handle(
        Millis(112),
        RouterInput::submit(router_request("r"), vec![router_cand("w", Tier::None, 0)]),
    );
    assert_eq!(sends(&effects), [("offer", "w".to_owned(), 1)]);
}

#[test]
fn duplicate_submit_of_a_known_id_is_ignored() {
    let (mut router, _) = two_candidate_router();
    let before = router.clone();
    let again = router.handle(
        Millis(1),
        RouterInput::submit(
            router_request("r"),
            vec![router_cand("other", Tier::None, 0)],
        ),
    );
    assert!(again.is_empty());
    assert_eq!(router, before);
}

#[test]
fn cancel_tells_the_current_worker_and_delivers_cancelled_once() {
    let (mut router, _) = two_candidate_router();
    let effects = router.handle(
        Millis(1),
        RouterInput::Cancel {
            request: "r".into(),
        },
    );
    assert_eq!(sends(&effects), [("cancel", "first".to_owned(), 1)]);
    assert!(locals(&effects).contains(&"cancel-offer-timer"));
    assert_eq!(deliveries(&effects)[0].kind, DeliveryKind::Cancelled);
    assert!(
        router
            .handle(
                Millis(2),
                RouterInput::Cancel {
                    request: "r".into()
                }
            )
            .is_empty()
    );
    assert!(router.handle(Millis(3), accept(a("r", 1))).is_empty());
    let record = router.record(&"r".into()).unwrap();
    assert_eq!(record.attempts[0].outcome, AttemptOutcome::Cancelled);
    assert_eq!(record.outcome, Some(TerminalOutcome::Cancelled));
}

#[test]
fn in_flight_index_follows_current_attempts() {
    let (mut router, _) = two_candidate_router();
    let first = WorkerId::from("first");
    assert_eq!(
        router.in_flight_on(&first).collect::<Vec<_>>(),
        [&a("r", 1)]
    );
    assert_eq!(
        router.unavailable_inputs(&first),
        [RouterInput::WorkerUnavailable {
            worker: first.clone(),
            assignment: a("r", 1)
        }]
    );
    let _ = router.handle(Millis(1), decline(a("r", 1), DeclineReason::Draining));
    assert_eq!(router.in_flight_on(&first).count(), 0);
    assert_eq!(router.in_flight_on(&"second".into()).count(), 1);
    assert_eq!(router.counts().offered, 1);
    let _ = router.handle(Millis(2), accept(a("r", 2)));
    assert_eq!((router.counts().offered, router.counts().assigned), (0, 1));
    let _ = router.handle(Millis(3), completed(a("r", 2), vec![]));
    assert_eq!(router.counts().in_flight(), 0);
    assert_eq!(router.counts().completed, 1);
    assert_eq!(router.in_flight_on(&"second".into()).count(), 0);
}

#[test]
fn the_record_measures_ttft_and_keeps_the_workers_actual_cached_count() {
    let (mut router, _) = two_candidate_router();
    let _ = router.handle(Millis(3), accept(a("r", 1)));
    let _ = router.handle(Millis(9), token(a("r", 1), 5, 0));
    let result = WorkerResult {
        cached_token_count: 64,
        ..WorkerResult::completed(vec![5], 0)
    };
    let _ = router.handle(
        Millis(12),
        RouterInput::Result {
            assignment: a("r", 1),
            result: Box::new(result),
        },
    );
    let record = router.record(&"r".into()).unwrap();
    assert_eq!(record.measured_ttft_ms, Some(9));
    assert_eq!(record.first_delta_at, Some(Millis(9)));
    assert_eq!(record.actual_cached_tokens, Some(64));
    assert_eq!(record.chosen().unwrap().accepted_at, Some(Millis(3)));
    assert_eq!(record.chosen().unwrap().predicted_ttft_ms, 2.0);
    assert_eq!(record.finished_at, Some(Millis(12)));
    let json = serde_json::to_value(record).unwrap();
    assert_eq!(json["attempts"][0]["outcome"]["kind"], "completed");
    let snapshot = json["candidates"].as_array().unwrap();
    assert_eq!(snapshot.len(), 2);
    assert_eq!(snapshot[0]["estimate"]["ttft_ms"], 52.0);
    assert_eq!(snapshot[0]["candidate"]["worker_id"], "second");
}

#[test]
fn router_errors_display_as_one_line() {
    let errors = [
        RouterError::WorkerUnavailableAfterStream {
            worker: "w".into(),
            delivered: 3,
        },
        RouterError::WorkerFailedAfterStream {
            worker: "w".into(),
            reason: Failure::unspecified(),
            delivered: 1,
        },
        RouterError::DeadlineExceeded {
            deadline: Millis(9),
        },
    ];
    for e in errors {
        let text = e.to_string();
        assert!(
            !text.contains('\n') && text.contains("resubmit") || text.contains("retry"),
            "{text}"
        );
    }
}

/// The router offers by fleet cost — the request's own predicted TTFT plus the delay it
/// would impose on the worker's pending requests — as `candidate::offer_order` and the
/// simulator's den policy do; on a decline, the next one in that order.
#[test]
fn offers_follow_ttft_plus_imposed_delay() {
    // "fast" has the lower own TTFT (queue 0 vs 10) but would delay its pending
    // requests by 50 ms; "calm" costs 10 ms more and imposes nothing.
    let fast = Candidate {
        imposed_ms: 50.0,
        ..router_cand("fast", Tier::None, 0)
    };
    let calm = Candidate {
        queue_ms: 10.0,
        ..router_cand("calm", Tier::None, 0)
    };
    let mut router = Router::default();
    let effects = router.handle(
        T0,
        RouterInput::Submit {
            request: Arc::new(router_request("r")),
            candidates: vec![fast.clone(), calm.clone()],
            deadline: None,
        },
    );
    assert_eq!(sends(&effects), [("offer", "calm".to_owned(), 1)]);
    let effects = router.handle(
        Millis(1),
        decline(a("r", 1), DeclineReason::InsufficientPages),
    );
    assert_eq!(sends(&effects), [("offer", "fast".to_owned(), 2)]);
    // Without the imposed delay the order is by own TTFT.
    let mut router = Router::default();
    let effects = router.handle(
        T0,
        RouterInput::Submit {
            request: Arc::new(router_request("r")),
            candidates: vec![
                Candidate {
                    imposed_ms: 0.0,
                    ..fast
                },
                calm,
            ],
            deadline: None,
        },
    );
    assert_eq!(sends(&effects), [("offer", "fast".to_owned(), 1)]);
}

/// A finished request's record keeps its best feasible candidates, its first infeasible
/// ones and every one it was offered to; the rest are counted, not kept (with a thousand
/// workers and minutes of retention the full snapshots were most of the router's memory).
#[test]
fn finished_records_keep_the_candidates_that_explain_them() {
    let mut router = Router::new(RouterConfig {
        retained_candidates: 2,
        ..RouterConfig::default()
    });
    let mut candidates: Vec<_> = (0..10)
        .map(|i| router_cand(&format!("w{i}"), Tier::None, 0))
        .collect();
    // Three infeasible ones: a context the workers cannot hold.
    for c in candidates.iter_mut().skip(7) {
        c.max_context = 1;
    }
    let effects = router.handle(T0, RouterInput::submit(router_request("r"), candidates));
    let first = sends(&effects)[0].1.clone();
    assert_eq!(router.record(&"r".into()).unwrap().candidates.len(), 10);
    // The best declines; the request completes on its second choice.
    let _ = router.handle(
        Millis(2),
        decline(a("r", 1), DeclineReason::InsufficientPages),
    );
    let _ = router.handle(Millis(3), accept(a("r", 2)));
    let _ = router.handle(Millis(4), completed(a("r", 2), vec![1]));
    let record = router.record(&"r".into()).unwrap();
    assert_eq!(record.outcome, Some(TerminalOutcome::Completed));
    // 2 best feasible (both attempted) + 2 infeasible = 4 of 10.
    assert_eq!(record.candidates.len(), 4, "{record:?}");
    assert_eq!(record.candidates_omitted, 6);
    assert_eq!(record.candidates.feasible_count(), 2);
    let kept: Vec<String> = record
        .candidates
        .iter()
        .map(|(c, _)| c.worker_id.to_string())
        .collect();
    assert!(kept.contains(&first), "{kept:?}");
    for attempt in &record.attempts {
        assert!(kept.contains(&attempt.worker.to_string()), "{kept:?}");
    }
    assert_eq!(record.chosen().map(|a| a.attempt), Some(2));
}
