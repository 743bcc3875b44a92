//! Router scenarios (spec §7.3 R-5, R-6, C-1, C-2) and the fencing rules of §2.4/§2.6.

use crate::common;

use std::collections::BTreeSet;

use common::{
    MODEL, a, accept, completed, decline, deliveries, locals, offer, router_cand, sends, token,
    two_candidate_router,
};
use den_protocol::candidate::{Candidate, Tier};
use den_protocol::capacity::DeclineReason;
use den_protocol::decision::AttemptOutcome;
use den_protocol::ids::{Epoch, RequestId};
use den_protocol::request::GenerationRequest;
use den_protocol::router::{
    DeliveryKind, LocalRouterEffect, Phase, Router, RouterConfig, RouterEffect, RouterError,
    RouterInput,
};
use den_protocol::time::Millis;
use den_protocol::wire::{Failure, FailureKind, WorkerResult};

const T0: Millis = Millis(0);

#[test]
fn r_5_decline_offers_the_next_candidate_and_a_stale_result_is_fenced() {
    let (mut router, effects) = two_candidate_router();
    assert_eq!(sends(&effects), [("offer", "first".to_owned(), 1)]);
    let effects = router.handle(
        Millis(1),
        decline(a("r", 1), DeclineReason::InsufficientPages),
    );
    assert_eq!(sends(&effects), [("offer", "second".to_owned(), 2)]);
    // Decision: the declined attempt's timer is cancelled before the next one is set.
    let timers: Vec<_> = locals(&effects)
        .into_iter()
        .filter(|l| l.ends_with("timer"))
        .collect();
    assert_eq!(timers, ["cancel-offer-timer", "set-offer-timer"]);
    let _ = router.handle(Millis(2), accept(a("r", 2)));
    let before = router.clone();
    let effects = router.handle(Millis(3), completed(a("r", 1), vec![99]));
    assert!(effects.is_empty());
    assert_eq!(router, before);
    let effects = router.handle(Millis(4), completed(a("r", 2), vec![7]));
    let d = deliveries(&effects);
    assert_eq!(d.len(), 1);
    assert!(matches!(&d[0].kind, DeliveryKind::Completed { result } if result.tokens == [7]));
    assert_eq!(router.phase(&"r".into()), Some(Phase::Completed));
}

#[test]
fn r_6_deltas_are_ordered_and_disable_unsafe_retry() {
    let (mut router, _) = two_candidate_router();
    let _ = router.handle(Millis(1), accept(a("r", 1)));
    let effects = router.handle(Millis(2), token(a("r", 1), 7, 0));
    let d = deliveries(&effects);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].kind, DeliveryKind::Delta { token: 7, index: 0 });
    assert!(
        router.handle(Millis(3), token(a("r", 1), 7, 0)).is_empty(),
        "duplicate"
    );
    assert!(
        router.handle(Millis(3), token(a("r", 1), 9, 2)).is_empty(),
        "gap"
    );
    let effects = router.handle(
        Millis(4),
        RouterInput::WorkerUnavailable {
            worker: "first".into(),
            assignment: a("r", 1),
        },
    );
    assert_eq!(router.phase(&"r".into()), Some(Phase::Failed));
    let d = deliveries(&effects);
    assert_eq!(d.len(), 1);
    assert_eq!(
        d[0].kind,
        DeliveryKind::Error {
            error: RouterError::WorkerUnavailableAfterStream {
                worker: "first".into(),
                delivered: 1
            }
        }
    );
    assert!(
        sends(&effects).is_empty(),
        "no retry offer after a streamed token"
    );
    assert!(
        router.handle(Millis(5), token(a("r", 1), 8, 1)).is_empty(),
        "post-terminal delta"
    );
}

#[test]
fn failed_result_after_stream_is_worker_failed_after_stream() {
    let (mut router, _) = two_candidate_router();
    let _ = router.handle(Millis(1), accept(a("r", 1)));
    let _ = router.handle(Millis(2), token(a("r", 1), 7, 0));
    let reason = Failure::new(FailureKind::DecodeFailed, "device lost");
    let effects = router.handle(
        Millis(3),
        RouterInput::Result {
            assignment: a("r", 1),
            result: Box::new(WorkerResult::failed(reason.clone())),
        },
    );
    let d = deliveries(&effects);
    assert_eq!(d.len(), 1);
    let DeliveryKind::Error { error } = &d[0].kind else {
        panic!("expected an error, got {:?}", d[0].kind);
    };
    assert_eq!(
        error,
        &RouterError::WorkerFailedAfterStream {
            worker: "first".into(),
            reason,
            delivered: 1
        }
    );
    assert!(error.to_string().contains("decode-failed: device lost"));
    assert!(sends(&effects).is_empty());
}

#[test]
fn failed_result_before_stream_retries_the_next_candidate() {
    let (mut router, _) = two_candidate_router();
    let _ = router.handle(Millis(1), accept(a("r", 1)));
    let effects = router.handle(
        Millis(2),
        RouterInput::Result {
            assignment: a("r", 1),
            result: Box::new(WorkerResult::failed(Failure::new(
                FailureKind::RestoreFailed,
                "missing chunk",
            ))),
        },
    );
    assert_eq!(sends(&effects), [("offer", "second".to_owned(), 2)]);
    let record = router.record(&"r".into()).unwrap();
    assert!(matches!(
        &record.attempts[0].outcome,
        AttemptOutcome::Failed { reason } if reason.kind == FailureKind::RestoreFailed
    ));
}

/// A timer table as a runtime keeps it: set adds, cancel removes.
#[derive(Default)]
struct Timers(BTreeSet<String>);

impl Timers {
    fn apply(&mut self, effects: &[RouterEffect]) {
        for e in effects {
            match e {
                RouterEffect::Local(LocalRouterEffect::SetOfferTimer { assignment, .. }) => {
                    self.0.insert(format!("offer {assignment}"));
                }
                RouterEffect::Local(LocalRouterEffect::CancelOfferTimer { assignment }) => {
                    self.0.remove(&format!("offer {assignment}"));
                }
                RouterEffect::Local(LocalRouterEffect::SetDeadlineTimer { request, .. }) => {
                    self.0.insert(format!("deadline {request}"));
                }
                RouterEffect::Local(LocalRouterEffect::CancelDeadlineTimer { request }) => {
                    self.0.remove(&format!("deadline {request}"));
                }
                _ => {}
            }
        }
    }
}

fn c_request() -> GenerationRequest {
    GenerationRequest::new("request-a", MODEL, vec![1, 2, 3], 2).unwrap()
}

fn c_candidates() -> Vec<Candidate> {
    let slow = Candidate {
        queue_ms: 50.0,
        ..router_cand("slow", Tier::None, 0)
    };
    vec![slow, router_cand("fast", Tier::None, 0)]
}

#[test]
fn c_1_offer_goes_to_the_faster_candidate_and_no_timer_remains() {
    let mut router = Router::default();
    let mut timers = Timers::default();
    let effects = router.handle(T0, RouterInput::submit(c_request(), c_candidates()));
    timers.apply(&effects);
    assert_eq!(sends(&effects), [("offer", "fast".to_owned(), 1)]);
    let effects = router.handle(Millis(1), accept(a("request-a", 1)));
    timers.apply(&effects);
    assert!(
        timers.0.iter().all(|t| !t.starts_with("offer")),
        "{:?}",
        timers.0
    );
    assert!(
        router
            .handle(Millis(2), completed(a("request-a", 999), vec![1]))
            .is_empty()
    );
    let result = WorkerResult {
        cached_token_count: 2,
        ..WorkerResult::completed(vec![5, 6], 0)
    };
    let effects = router.handle(
        Millis(3),
        RouterInput::Result {
            assignment: a("request-a", 1),
            result: Box::new(result.clone()),
        },
    );
    timers.apply(&effects);
    assert_eq!(
        deliveries(&effects)[0].kind,
        DeliveryKind::Completed {
            result: Box::new(result)
        },
        "delivered verbatim"
    );
    assert!(timers.0.is_empty(), "{:?}", timers.0);
}

#[test]
fn c_2_offer_timeout_cancels_the_first_worker_before_offering_the_second() {
    let mut router = Router::default();
    let mut all = router.handle(T0, RouterInput::submit(c_request(), c_candidates()));
    let timer = all.iter().find_map(|e| match e {
        RouterEffect::Local(LocalRouterEffect::SetOfferTimer { assignment, at }) => {
            Some((assignment.clone(), *at))
        }
        _ => None,
    });
    let (assignment, at) = timer.expect("an offer timer");
    assert_eq!(at, Millis(RouterConfig::default().offer_timeout_ms));
    all.extend(router.handle(at, RouterInput::OfferTimeout { assignment }));
    assert_eq!(
        sends(&all),
        [
            ("offer", "fast".to_owned(), 1),
            ("cancel", "fast".to_owned(), 1),
            ("offer", "slow".to_owned(), 2)
        ]
    );
    assert_eq!(
        router.assignment(&"request-a".into()),
        Some(&a("request-a", 2))
    );
}

#[test]
fn offers_are_sent_before_their_timer_is_set() {
    let (_, effects) = two_candidate_router();
    let send = effects
        .iter()
        .position(|e| matches!(e, RouterEffect::Send(_)));
    let timer = effects.iter().position(|e| {
        matches!(
            e,
            RouterEffect::Local(LocalRouterEffect::SetOfferTimer { .. })
        )
    });
    assert!(send.unwrap() < timer.unwrap());
    let o = offer(&effects).unwrap();
    assert_eq!(o.worker_epoch, Epoch(0));
    assert_eq!(o.estimate.ttft_ms, 2.0);
    assert_eq!(o.request.id, RequestId::from("r"));
}

#[test]
fn late_timeouts_and_late_accepts_are_fenced() {
    let (mut router, _) = two_candidate_router();
    let _ = router.handle(
        Millis(100),
        RouterInput::OfferTimeout {
            assignment: a("r", 1),
        },
    );
    let before = router.clone();
    assert!(router.handle(Millis(101), accept(a("r", 1))).is_empty());
    assert!(
        router
            .handle(
                Millis(102),
                RouterInput::OfferTimeout {
                    assignment: a("r", 1)
                }
            )
            .is_empty()
    );
    assert!(
        router
            .handle(Millis(103), decline(a("r", 1), DeclineReason::Draining))
            .is_empty()
    );
    assert_eq!(router, before);
    let _ = router.handle(Millis(104), accept(a("r", 2)));
    // Offer results are only honoured while offered.
    assert!(
        router
            .handle(Millis(105), decline(a("r", 2), DeclineReason::Draining))
            .is_empty()
    );
    assert!(
        router
            .handle(
                Millis(106),
                RouterInput::OfferTimeout {
                    assignment: a("r", 2)
                }
            )
            .is_empty()
    );
    assert_eq!(router.phase(&"r".into()), Some(Phase::Assigned));
}

#[test]
fn unavailability_must_name_the_current_attempts_worker() {
    let (mut router, _) = two_candidate_router();
    let wrong = RouterInput::WorkerUnavailable {
        worker: "second".into(),
        assignment: a("r", 1),
    };
    assert!(router.handle(Millis(1), wrong).is_empty());
    let stale = RouterInput::WorkerUnavailable {
        worker: "first".into(),
        assignment: a("r", 7),
    };
    assert!(router.handle(Millis(1), stale).is_empty());
    let right = RouterInput::WorkerUnavailable {
        worker: "first".into(),
        assignment: a("r", 1),
    };
    let effects = router.handle(Millis(2), right);
    assert_eq!(sends(&effects), [("offer", "second".to_owned(), 2)]);
    assert_eq!(locals(&effects)[0], "cancel-offer-timer");
}

/// Worker `a` offers a GPU prefix and an SSD boundary, worker `b` recomputes; the order
/// is a/gpu, a/ssd, b/none.
fn same_worker_alternatives() -> (Router, Vec<RouterEffect>) {
    let mut router = Router::new(RouterConfig::default());
    let gpu = Candidate {
        source_continuation_id: Some("resident".into()),
        ..router_cand("a", Tier::Gpu, 96)
    };
    let ssd = Candidate {
        prefix_load_ms: 5.0,
        ..router_cand("a", Tier::Ssd, 64)
    };
    let none = Candidate {
        queue_ms: 40.0,
        ..router_cand("b", Tier::None, 0)
    };
    let effects = router.handle(
        T0,
        RouterInput::submit(common::router_request("r"), vec![none, ssd, gpu]),
    );
    (router, effects)
}

#[test]
fn a_stale_gpu_decline_keeps_the_same_workers_durable_alternative() {
    let (mut router, effects) = same_worker_alternatives();
    assert_eq!(sends(&effects), [("offer", "a".to_owned(), 1)]);
    let effects = router.handle(
        Millis(1),
        decline(a("r", 1), DeclineReason::ResidentPrefixUnavailable),
    );
    let next = offer(&effects).expect("an offer");
    assert_eq!(
        (next.candidate.worker_id.as_str(), next.candidate.tier),
        ("a", Tier::Ssd)
    );
}

#[test]
fn a_timed_out_worker_is_not_offered_its_other_alternatives() {
    let (mut router, _) = same_worker_alternatives();
    let at = Millis(RouterConfig::default().offer_timeout_ms);
    let effects = router.handle(
        at,
        RouterInput::OfferTimeout {
            assignment: a("r", 1),
        },
    );
    assert_eq!(
        sends(&effects),
        [("cancel", "a".to_owned(), 1), ("offer", "b".to_owned(), 2)],
        "the next offer goes to another worker, not a's SSD alternative"
    );
}

#[test]
fn a_decline_that_holds_for_the_whole_worker_skips_its_other_alternatives() {
    for reason in [
        DeclineReason::RequestAlreadyAssigned,
        DeclineReason::Draining,
        DeclineReason::WorkerEpochChanged,
        DeclineReason::ModelNotLoaded,
    ] {
        let (mut router, _) = same_worker_alternatives();
        let effects = router.handle(Millis(1), decline(a("r", 1), reason));
        assert_eq!(sends(&effects), [("offer", "b".to_owned(), 2)], "{reason}");
    }
}
