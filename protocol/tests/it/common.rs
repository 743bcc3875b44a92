//! Fixtures shared by the scenario tests (spec §7.2, §7.3).
#![allow(dead_code)]

use den_protocol::candidate::{Candidate, Tier, TransferCapabilities};
use den_protocol::capacity::DeclineReason;
use den_protocol::ids::{AssignmentId, Epoch, WorkerId};
use den_protocol::request::GenerationRequest;
use den_protocol::router::{Delivery, LocalRouterEffect, Router, RouterEffect, RouterInput};
use den_protocol::sim::{SimConfig, Simulation};
use den_protocol::time::Millis;
use den_protocol::wire::WorkerResult;
use den_protocol::wire::{OutboundToWorker, RouterMessage};
use den_protocol::worker::Counters;

pub const MODEL: &str = "gemma/test";

/// The simulator fixture request: tokens 0..=32 (P = 32), max_new 4, output [41 42 43 44].
pub fn sim_request() -> GenerationRequest {
    GenerationRequest::new("request-1", MODEL, (0..=32).collect(), 4)
        .unwrap()
        .with_simulated_output(vec![41, 42, 43, 44])
}

/// A simulator fixture candidate: epoch 0, cached bytes 128 × cached, prefill 0.5,
/// first token 1, page 8, free 8, evictable 0, max context 128.
pub fn cand(worker: &str, tier: Tier, cached: u32) -> Candidate {
    Candidate {
        worker_id: WorkerId::from(worker),
        worker_epoch: Epoch(0),
        tier,
        cached_token_count: cached,
        cached_bytes: 128 * cached as u64,
        queue_ms: 0.0,
        prefix_load_ms: 0.0,
        gpu_restore_ms: 0.0,
        prefill_ms_per_token: 0.5,
        first_token_ms: 1.0,
        page_size: 8,
        free_pages: 8,
        evictable_pages: 0,
        max_context: 128,
        online: true,
        model_loaded: true,
        exact: true,
        source_continuation_id: None,
        resident_token_count: 0,
        transfer: TransferCapabilities::default(),
        imposed_ms: 0.0,
    }
}

/// A simulation with workers `near` and `far` (epoch 0, model gemma/test, free 8).
pub fn near_far(config: SimConfig) -> Simulation {
    let mut sim = Simulation::new(config);
    sim.add_worker("near", [MODEL], Counters::new(8, 0));
    sim.add_worker("far", [MODEL], Counters::new(8, 0));
    sim
}

/// The router-test fixture of spec §7.3: page 16, free 32, max-context 2048, first 2.0,
/// prefill 0.5.
pub fn router_cand(worker: &str, tier: Tier, cached: u32) -> Candidate {
    Candidate {
        page_size: 16,
        free_pages: 32,
        max_context: 2048,
        first_token_ms: 2.0,
        cached_bytes: 0,
        ..cand(worker, tier, cached)
    }
}

/// Router-test request: P = 100, max_new 16.
pub fn router_request(id: &str) -> GenerationRequest {
    GenerationRequest::new(id, MODEL, (0..101).collect(), 16).unwrap()
}

/// The wire sends among router effects, as (kind, to, attempt).
pub fn sends(effects: &[RouterEffect]) -> Vec<(&'static str, String, u64)> {
    effects
        .iter()
        .filter_map(|e| match e {
            RouterEffect::Send(OutboundToWorker { to, message }) => {
                Some((message.kind(), to.to_string(), message.assignment().attempt))
            }
            RouterEffect::Local(_) => None,
        })
        .collect()
}

/// The local router effects, by variant name, in order.
pub fn locals(effects: &[RouterEffect]) -> Vec<&'static str> {
    effects
        .iter()
        .filter_map(|e| match e {
            RouterEffect::Local(l) => Some(match l {
                LocalRouterEffect::SetOfferTimer { .. } => "set-offer-timer",
                LocalRouterEffect::CancelOfferTimer { .. } => "cancel-offer-timer",
                LocalRouterEffect::SetDeadlineTimer { .. } => "set-deadline-timer",
                LocalRouterEffect::CancelDeadlineTimer { .. } => "cancel-deadline-timer",
                LocalRouterEffect::Deliver(_) => "deliver",
                LocalRouterEffect::Decision(_) => "decision",
            }),
            RouterEffect::Send(_) => None,
        })
        .collect()
}

/// The offer among router effects, if any.
pub fn offer(effects: &[RouterEffect]) -> Option<&den_protocol::wire::Offer> {
    effects.iter().find_map(|e| match e {
        RouterEffect::Send(OutboundToWorker {
            message: RouterMessage::Offer(o),
            ..
        }) => Some(&**o),
        _ => None,
    })
}

// Router-test helpers.

pub fn a(request: &str, attempt: u64) -> AssignmentId {
    AssignmentId::new(request, attempt)
}

pub fn accept(assignment: AssignmentId) -> RouterInput {
    RouterInput::OfferResult {
        assignment,
        worker_epoch: Epoch(0),
        accepted: true,
        reason: None,
    }
}

pub fn decline(assignment: AssignmentId, reason: DeclineReason) -> RouterInput {
    RouterInput::OfferResult {
        assignment,
        worker_epoch: Epoch(0),
        accepted: false,
        reason: Some(reason),
    }
}

pub fn token(assignment: AssignmentId, token: u32, index: u32) -> RouterInput {
    RouterInput::Token {
        assignment,
        token,
        index,
    }
}

pub fn completed(assignment: AssignmentId, tokens: Vec<u32>) -> RouterInput {
    RouterInput::Result {
        assignment,
        result: Box::new(WorkerResult::completed(tokens, 0)),
    }
}

pub fn deliveries(effects: &[RouterEffect]) -> Vec<&Delivery> {
    effects
        .iter()
        .filter_map(|e| match e {
            RouterEffect::Local(LocalRouterEffect::Deliver(d)) => Some(d),
            _ => None,
        })
        .collect()
}

/// Router with request `r` submitted over candidates `first` (best) and `second`.
pub fn two_candidate_router() -> (Router, Vec<RouterEffect>) {
    let mut router = Router::default();
    let first = router_cand("first", Tier::Gpu, 100);
    let second = router_cand("second", Tier::None, 0);
    let effects = router.handle(
        Millis(0),
        RouterInput::submit(router_request("r"), vec![second, first]),
    );
    (router, effects)
}
