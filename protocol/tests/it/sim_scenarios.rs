//! Simulator acceptance scenarios (spec §7.2) plus streaming, deadline and cancellation
//! scenarios the upstream simulator does not model.

use crate::common;

use common::{MODEL, cand, near_far, sim_request};
use den_protocol::candidate::{Candidate, Tier};
use den_protocol::candidate_generation::candidates_for;
use den_protocol::capacity::{Capacity, DeclineReason};
use den_protocol::chunk::plan_chunks;
use den_protocol::chunk_catalog::{ChunkCatalog, ChunkEntry};
use den_protocol::decision::AttemptOutcome;
use den_protocol::ids::{AssignmentId, Epoch, RequestId, WorkerId};
use den_protocol::observation::{GpuPrefix, Observation};
use den_protocol::request::GenerationRequest;
use den_protocol::router::{DeliveryKind, Phase, RouterError, RouterInput};
use den_protocol::sim::{Endpoint, SimConfig, Simulation, TraceEvent};
use den_protocol::time::Millis;
use den_protocol::wire::WorkerMessage;
use den_protocol::worker::{Counters, Finished, OperationOutcome, WorkerEffect, WorkerInput};

fn rid() -> RequestId {
    RequestId::from("request-1")
}

fn w(id: &str) -> WorkerId {
    WorkerId::from(id)
}

fn completed_tokens(sim: &Simulation) -> (Vec<u32>, u32, Millis) {
    let r = sim.response(&rid()).expect("a terminal response");
    match &r.delivery.kind {
        DeliveryKind::Completed { result } => {
            (result.tokens.clone(), result.cached_token_count, r.at)
        }
        other => panic!("expected completed, got {other:?}"),
    }
}

/// Router → worker sends in the trace, as (kind, to, attempt).
fn router_sends(sim: &Simulation) -> Vec<(&'static str, String, u64)> {
    sim.trace()
        .iter()
        .filter_map(|t| match &t.event {
            TraceEvent::Router { effects, .. } => Some(common::sends(effects)),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn sim_1_locality_load_tradeoff_restore_prefill_decode() {
    let mut sim = near_far(SimConfig::default());
    let near = Candidate {
        queue_ms: 1.0,
        ..cand("near", Tier::Gpu, 24)
    };
    let far = Candidate {
        prefix_load_ms: 30.0,
        gpu_restore_ms: 4.0,
        ..cand("far", Tier::Object, 32)
    };
    sim.submit(sim_request(), vec![far, near]);
    sim.run_until_response(&rid(), 100).unwrap();
    let (tokens, cached, at) = completed_tokens(&sim);
    assert_eq!(tokens, [41, 42, 43, 44]);
    assert_eq!(cached, 24);
    assert_eq!(
        at,
        Millis(8),
        "derived: offer 1, prefill 1 + 8 × 0.5 → 6, decode → 7, result 8"
    );
    assert_eq!(sim.router().current_worker(&rid()), Some(&w("near")));
    let near = sim.worker(&w("near")).unwrap();
    assert!(matches!(
        near.finished(&AssignmentId::new("request-1", 1)),
        Some(Finished::Completed { .. })
    ));
    let record = sim.router().record(&rid()).unwrap();
    let ranking = record.candidates.ranking();
    assert_eq!(ranking.feasible[0].estimate.ttft_ms, 6.0);
    assert_eq!(ranking.feasible[1].estimate.ttft_ms, 35.0);
    assert_eq!(record.actual_cached_tokens, Some(24));
}

#[test]
fn sim_2_stale_capacity_snapshot_declines_and_falls_back() {
    let mut sim = near_far(SimConfig::default());
    sim.set_capacity(&w("near"), Counters::new(0, 0));
    let near = cand("near", Tier::Gpu, 32);
    let far = Candidate {
        queue_ms: 2.0,
        ..cand("far", Tier::Gpu, 32)
    };
    sim.submit(sim_request(), vec![near, far]);
    sim.run_until_response(&rid(), 100).unwrap();
    let (tokens, _, at) = completed_tokens(&sim);
    assert_eq!(tokens, [41, 42, 43, 44]);
    assert_eq!(at, Millis(5));
    assert_eq!(sim.router().current_worker(&rid()), Some(&w("far")));
    let declined = sim.trace().iter().any(|t| match &t.event {
        TraceEvent::Worker {
            worker, effects, ..
        } => {
            worker == &w("near")
                && effects.iter().any(|e| {
                    matches!(e, WorkerEffect::Send(WorkerMessage::OfferResult(r))
                        if !r.accepted && r.reason == Some(DeclineReason::InsufficientPages))
                })
        }
        _ => false,
    });
    assert!(
        declined,
        "near declines insufficient-pages (needs 5 − 4 resident = 1 page)"
    );
    let record = sim.router().record(&rid()).unwrap();
    assert_eq!(
        record.decline_reasons(),
        [Some(DeclineReason::InsufficientPages)]
    );
}

#[test]
fn sim_3_timeout_fallback_across_a_directed_partition() {
    let mut sim = near_far(SimConfig {
        offer_timeout: 3,
        ..SimConfig::default()
    });
    sim.partition_link(Endpoint::Router, Endpoint::worker("near"));
    let near = cand("near", Tier::Gpu, 32);
    let far = Candidate {
        queue_ms: 1.0,
        ..cand("far", Tier::Gpu, 16)
    };
    sim.submit(sim_request(), vec![far, near]);
    sim.run_until_response(&rid(), 100).unwrap();
    let (tokens, _, at) = completed_tokens(&sim);
    assert_eq!(tokens, [41, 42, 43, 44]);
    assert_eq!(
        sim.router().assignment(&rid()),
        Some(&AssignmentId::new("request-1", 2))
    );
    assert_eq!(
        at,
        Millis(15),
        "timeout 3, offer far 4, prefill 9 → 13, decode → 14, 15"
    );
    assert!(
        sim.trace()
            .iter()
            .any(|t| matches!(t.event, TraceEvent::NetworkDrop { .. }))
    );
    assert_eq!(
        router_sends(&sim),
        [
            ("offer", "near".to_owned(), 1),
            ("cancel", "near".to_owned(), 1),
            ("offer", "far".to_owned(), 2)
        ]
    );
    let record = sim.router().record(&rid()).unwrap();
    assert_eq!(record.attempts[0].outcome, AttemptOutcome::TimedOut);
}

#[test]
fn sim_4_worker_crash_fallback_fences_the_late_completion() {
    let mut sim = near_far(SimConfig::default());
    let near = Candidate {
        prefix_load_ms: 3.0,
        gpu_restore_ms: 1.0,
        ..cand("near", Tier::Ssd, 32)
    };
    let far = Candidate {
        queue_ms: 1.0,
        ..cand("far", Tier::Gpu, 16)
    };
    sim.submit(sim_request(), vec![near, far]);
    sim.run(2).unwrap();
    assert_eq!(sim.router().phase(&rid()), Some(Phase::Assigned));
    sim.crash(&w("near"));
    sim.run_until_response(&rid(), 100).unwrap();
    let (tokens, _, at) = completed_tokens(&sim);
    assert_eq!(tokens, [41, 42, 43, 44]);
    assert_eq!(at, Millis(14));
    assert_eq!(
        sim.router().assignment(&rid()),
        Some(&AssignmentId::new("request-1", 2))
    );
    let near = sim.worker(&w("near")).unwrap();
    assert_eq!(near.epoch(), Epoch(1));
    assert_eq!(near.assignments().count(), 0);
    // The restore result near scheduled before the crash arrives at t = 5 and is ignored.
    let late = sim.trace().iter().find(|t| {
        matches!(&t.event, TraceEvent::Worker { worker, input: WorkerInput::OperationDone { .. }, .. }
            if worker == &w("near"))
    });
    let late = late.expect("near's late restore result is delivered");
    assert_eq!(late.at, Millis(5));
    assert!(matches!(&late.event, TraceEvent::Worker { effects, .. } if effects.is_empty()));
    assert_eq!(sim.worker(&w("near")).unwrap().capacity().free_pages(), 8);
}

fn sim_5_run() -> Simulation {
    let mut sim = near_far(SimConfig {
        network_delay: 2,
        ..SimConfig::default()
    });
    let near = Candidate {
        queue_ms: 1.0,
        prefix_load_ms: 3.0,
        gpu_restore_ms: 1.0,
        ..cand("near", Tier::Ssd, 24)
    };
    let far = Candidate {
        queue_ms: 2.0,
        ..cand("far", Tier::Gpu, 8)
    };
    sim.submit(sim_request(), vec![near, far]);
    sim.run_until_quiet(1_000).unwrap();
    sim
}

#[test]
fn sim_5_deterministic_replay() {
    let (a, b) = (sim_5_run(), sim_5_run());
    assert!(a.response(&rid()).is_some());
    assert_eq!(a, b);
    assert_eq!(a.trace(), b.trace());
    assert_eq!(a.trace_json().unwrap(), b.trace_json().unwrap());
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
}

#[test]
fn sim_6_busy_gpu_vs_warm_ssd() {
    let mut sim = Simulation::new(SimConfig::default());
    sim.add_worker("busy-gpu", [MODEL], Counters::new(64, 0));
    sim.add_worker("warm-ssd", [MODEL], Counters::new(64, 0));
    let request = GenerationRequest::new("request-1", MODEL, (0..=256).collect(), 8).unwrap();
    let base = |w: &str, tier, cached| Candidate {
        page_size: 16,
        free_pages: 64,
        max_context: 1024,
        prefill_ms_per_token: 0.2,
        first_token_ms: 2.0,
        ..cand(w, tier, cached)
    };
    let busy = Candidate {
        queue_ms: 45.0,
        ..base("busy-gpu", Tier::Gpu, 256)
    };
    let warm = Candidate {
        prefix_load_ms: 4.0,
        gpu_restore_ms: 3.0,
        ..base("warm-ssd", Tier::Ssd, 192)
    };
    sim.submit(request, vec![busy, warm]);
    sim.run_until_response(&rid(), 1_000).unwrap();
    let record = sim.router().record(&rid()).unwrap();
    let ttfts: Vec<f64> = record
        .candidates
        .ranking()
        .feasible
        .iter()
        .map(|s| s.estimate.ttft_ms)
        .collect();
    assert!(
        (ttfts[0] - 21.8).abs() < 1e-9 && ttfts[1] == 47.0,
        "{ttfts:?}"
    );
    assert_eq!(sim.router().current_worker(&rid()), Some(&w("warm-ssd")));
    assert!(matches!(
        sim.response(&rid()).unwrap().delivery.kind,
        DeliveryKind::Completed { .. }
    ));
}

#[test]
fn sim_7_database_derived_candidates() {
    let mib = 1024 * 1024;
    let request = GenerationRequest::new("request-1", MODEL, (0..=256).collect(), 8).unwrap();
    let plan = plan_chunks(request.processed_tokens(), 64);
    let mut catalog = ChunkCatalog::default();
    for d in &plan {
        catalog.publish(ChunkEntry {
            model: MODEL.into(),
            hash: d.hash,
            parent: d.parent,
            start: d.start,
            token_count: d.token_count,
            bytes: mib,
            object: false,
        });
    }
    for d in plan.iter().take(3) {
        catalog.add_replica("warm-ssd".into(), MODEL.into(), d.hash, Tier::Ssd);
    }
    let observe = |id: &str, queue_ms| {
        let mut o = Observation::new(id, id);
        o.models.insert(MODEL.into());
        o.queue_ms = queue_ms;
        o.page_size = 16;
        o.free_pages = 64;
        o.max_context = 1024;
        o.prefill_ms_per_token = 0.2;
        o.first_token_ms = 2.0;
        o.gpu_restore_bytes_per_ms = mib as f64;
        o.tier_throughput_bytes_per_ms.insert(Tier::Ssd, mib as f64);
        o.tier_fixed_ms.insert(Tier::Ssd, 0.0);
        o
    };
    let warm = observe("warm-ssd", 0.0);
    let mut busy = observe("busy-gpu", 45.0);
    busy.gpu_prefixes.push(GpuPrefix {
        model: MODEL.into(),
        prefix_hash: plan[3].hash,
        continuation_id: "busy-route".into(),
        token_count: 256,
        bytes: 4 * mib,
    });
    let candidates = candidates_for(&request, 64, [&warm, &busy], &catalog);

    let mut sim = Simulation::new(SimConfig::default());
    sim.add_worker("busy-gpu", [MODEL], Counters::new(64, 0));
    sim.add_worker("warm-ssd", [MODEL], Counters::new(64, 0));
    sim.submit(request, candidates);
    sim.run_until_response(&rid(), 1_000).unwrap();

    let record = sim.router().record(&rid()).unwrap();
    let ranking: Vec<_> = record
        .candidates
        .ranking()
        .feasible
        .iter()
        .map(|s| {
            let c = &s.candidate;
            (
                c.worker_id.to_string(),
                c.tier,
                c.cached_token_count,
                s.estimate.ttft_ms,
            )
        })
        .collect();
    let want = [
        ("warm-ssd", Tier::Ssd, 192, 20.8),
        ("warm-ssd", Tier::Ssd, 128, 31.6),
        ("warm-ssd", Tier::Ssd, 64, 42.4),
        ("busy-gpu", Tier::Gpu, 256, 47.0),
        ("warm-ssd", Tier::None, 0, 53.2),
        ("busy-gpu", Tier::None, 0, 98.2),
    ];
    assert_eq!(ranking.len(), want.len(), "{ranking:?}");
    for (got, want) in ranking.iter().zip(want) {
        assert_eq!((got.0.as_str(), got.1, got.2), (want.0, want.1, want.2));
        assert!((got.3 - want.3).abs() < 1e-9, "{got:?} vs {want:?}");
    }
    assert_eq!(sim.router().current_worker(&rid()), Some(&w("warm-ssd")));
    assert_eq!(record.attempts[0].tier, Tier::Ssd);
    assert!(matches!(
        sim.response(&rid()).unwrap().delivery.kind,
        DeliveryKind::Completed { .. }
    ));
}

#[test]
fn sim_8_cancel_after_acceptance() {
    let mut sim = near_far(SimConfig::default());
    let near = Candidate {
        queue_ms: 1.0,
        ..cand("near", Tier::Gpu, 24)
    };
    sim.submit(sim_request(), vec![near]);
    sim.run(2).unwrap();
    assert_eq!(sim.router().phase(&rid()), Some(Phase::Assigned));
    sim.cancel(&rid());
    sim.run(1).unwrap();
    // The worker fenced the assignment but its prefill is still in flight: pages stay.
    let a1 = AssignmentId::new("request-1", 1);
    let near_worker = sim.worker(&w("near")).unwrap();
    assert!(near_worker.assignment(&a1).is_some());
    assert_eq!(near_worker.capacity().free_pages(), 6);
    assert!(sim.run_until_quiet(100).unwrap());
    let id = rid();
    let terminal: Vec<_> = sim
        .deliveries(&id)
        .filter(|r| r.delivery.is_terminal())
        .collect();
    assert_eq!(terminal.len(), 1);
    assert_eq!(terminal[0].delivery.kind, DeliveryKind::Cancelled);
    let near_worker = sim.worker(&w("near")).unwrap();
    assert!(near_worker.assignment(&a1).is_none());
    assert_eq!(near_worker.finished(&a1), Some(&Finished::Cancelled));
    assert_eq!(near_worker.capacity().free_pages(), 8);
    assert!(near_worker.capacity().accounted());
    // A later operation result for the cancelled assignment is ignored.
    let before = sim.worker(&w("near")).unwrap().clone();
    sim.inject_worker(
        &w("near"),
        WorkerInput::OperationDone {
            assignment: a1,
            outcome: OperationOutcome::Prefilled,
        },
    );
    assert_eq!(sim.worker(&w("near")).unwrap(), &before);
    assert!(sim.quiet());
}

fn streaming_sim() -> Simulation {
    let mut sim = near_far(SimConfig {
        decode_ms_per_token: 2.0,
        ..SimConfig::default()
    });
    let near = cand("near", Tier::Gpu, 32);
    let far = Candidate {
        queue_ms: 1.0,
        ..cand("far", Tier::Gpu, 16)
    };
    sim.submit(sim_request(), vec![near, far]);
    sim
}

#[test]
fn sim_streaming_deltas_arrive_in_order_before_completion() {
    let mut sim = streaming_sim();
    sim.run_until_response(&rid(), 100).unwrap();
    assert_eq!(sim.streamed(&rid()), [(0, 41), (1, 42), (2, 43), (3, 44)]);
    let kinds: Vec<_> = sim
        .deliveries(&rid())
        .map(|r| (r.at.0, r.delivery.is_terminal()))
        .collect();
    // Offer at 1, decode from 1: tokens at 2, 4, 6, 8 on the worker, +1 on the way.
    assert_eq!(
        kinds,
        [(3, false), (5, false), (7, false), (9, false), (9, true)]
    );
    let record = sim.router().record(&rid()).unwrap();
    assert_eq!(record.first_delta_at, Some(Millis(3)));
    assert_eq!(record.measured_ttft_ms, Some(3));
    assert_eq!(record.delivered_tokens, 4);
}

#[test]
fn sim_streaming_crash_after_first_delta_fails_once_without_retry() {
    let mut sim = streaming_sim();
    sim.run(3).unwrap();
    assert_eq!(sim.streamed(&rid()), [(0, 41)]);
    sim.crash(&w("near"));
    assert!(sim.run_until_quiet(100).unwrap());
    let id = rid();
    let terminal: Vec<_> = sim
        .deliveries(&id)
        .filter(|r| r.delivery.is_terminal())
        .collect();
    assert_eq!(terminal.len(), 1);
    assert_eq!(
        terminal[0].delivery.kind,
        DeliveryKind::Error {
            error: RouterError::WorkerUnavailableAfterStream {
                worker: w("near"),
                delivered: 1
            }
        }
    );
    let offers = router_sends(&sim)
        .into_iter()
        .filter(|s| s.0 == "offer")
        .count();
    assert_eq!(offers, 1, "no transparent retry after a streamed token");
    assert_eq!(sim.streamed(&rid()), [(0, 41)]);
}

#[test]
fn sim_deadline_expiry_fails_the_request_and_cancels_the_worker() {
    let mut sim = near_far(SimConfig {
        offer_timeout: 1_000,
        ..SimConfig::default()
    });
    sim.pause(&w("near"));
    sim.submit_with_deadline(sim_request(), vec![cand("near", Tier::Gpu, 32)], Millis(50));
    sim.run_until_response(&rid(), 100).unwrap();
    let r = sim.response(&rid()).unwrap();
    assert_eq!(r.at, Millis(50));
    assert_eq!(
        r.delivery.kind,
        DeliveryKind::Error {
            error: RouterError::DeadlineExceeded {
                deadline: Millis(50)
            }
        }
    );
    // Resuming lets the worker see offer and cancel; it ends with nothing reserved.
    sim.resume(&w("near"));
    assert!(sim.run_until_quiet(100).unwrap());
    let near = sim.worker(&w("near")).unwrap();
    assert_eq!(near.assignments().count(), 0);
    assert_eq!(near.capacity().free_pages(), 8);
    let cancels = router_sends(&sim)
        .into_iter()
        .filter(|s| s.0 == "cancel")
        .count();
    assert_eq!(cancels, 1);
}

#[test]
fn sim_terminal_records_are_collected_after_retention() {
    let mut sim = near_far(SimConfig {
        retention_ms: 100,
        ..SimConfig::default()
    });
    sim.submit(sim_request(), vec![cand("near", Tier::Gpu, 32)]);
    sim.run_until_quiet(100).unwrap();
    assert!(sim.router().record(&rid()).is_some());
    sim.run(200).unwrap();
    // Collection is lazy: the next router step collects.
    sim.inject_router(RouterInput::Tick);
    assert!(sim.router().record(&rid()).is_none());
    assert_eq!(sim.router().counts().collected, 1);
}

#[test]
fn sim_duplicated_and_late_messages_are_fenced() {
    let mut sim = near_far(SimConfig::default());
    let (router, near) = (Endpoint::Router, Endpoint::worker("near"));
    sim.duplicate_next(router.clone(), near.clone());
    sim.delay_next(near.clone(), router.clone(), 30);
    sim.submit(sim_request(), vec![cand("near", Tier::Gpu, 32)]);
    assert!(sim.run_until_quiet(200).unwrap());
    // The offer reached near twice; the first accept was 30 ms late, the re-ack of the
    // duplicate was on time. near served the request once.
    let offers_at_near = sim
        .trace()
        .iter()
        .filter(|t| {
            matches!(&t.event, TraceEvent::Worker { worker, input: WorkerInput::Offer(_), .. }
                if worker == &w("near"))
        })
        .count();
    assert_eq!(offers_at_near, 2);
    let terminal: Vec<_> = sim
        .responses()
        .iter()
        .filter(|r| r.delivery.is_terminal())
        .collect();
    assert_eq!(terminal.len(), 1);
    assert!(matches!(
        terminal[0].delivery.kind,
        DeliveryKind::Completed { .. }
    ));
    assert_eq!(sim.streamed(&rid()).len(), 4);
    // The late accept arrives at t = 32 and changes nothing.
    let late = sim
        .trace()
        .iter()
        .find(|t| {
            matches!(
                &t.event,
                TraceEvent::Router {
                    input: RouterInput::OfferResult { .. },
                    ..
                }
            ) && t.at == Millis(32)
        })
        .expect("the late accept reaches the router");
    assert!(matches!(&late.event, TraceEvent::Router { effects, .. } if effects.is_empty()));
    let near = sim.worker(&w("near")).unwrap();
    assert_eq!(
        near.capacity().free_pages(),
        8 - 1,
        "the completed route stays resident"
    );
    assert!(near.capacity().accounted());
}

#[test]
fn demo_prints_a_decision_trace_with_a_fallback() {
    let text = den_protocol::sim::demo();
    assert!(text.contains("warm-ssd"), "{text}");
    assert!(text.contains("declined (insufficient-pages)"), "{text}");
    assert!(text.contains("request-2      completed"), "{text}");
    assert_eq!(text, den_protocol::sim::demo(), "the demo is deterministic");
}
