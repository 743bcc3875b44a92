//! Shared fixtures of the page-pool tests.
#![allow(dead_code)]

use std::collections::BTreeSet;

use den_protocol::candidate::{Candidate, Estimate, Tier, TransferCapabilities, estimate};
use den_protocol::capacity::{Admission, AdmitRequest, Capacity, DeclineReason};
use den_protocol::ids::{AssignmentId, Epoch, RouteId, WorkerId};
use den_protocol::pool::{Geometry, Page, PagePool, RoutePolicy};
use den_protocol::request::GenerationRequest;

/// Bytes of one token row in every fixture: 8.
pub const BYTES_PER_TOKEN: u64 = 8;

pub fn pool(page_size: u32, page_count: u32) -> PagePool {
    PagePool::new(Geometry::new(
        page_size,
        page_count,
        page_size as u64 * BYTES_PER_TOKEN,
    ))
    .unwrap()
}

pub fn r(id: &str) -> RouteId {
    RouteId::from(id)
}

pub fn pages(ns: &[u32]) -> Vec<Page> {
    ns.iter().map(|n| Page(*n)).collect()
}

pub fn none() -> BTreeSet<RouteId> {
    BTreeSet::new()
}

pub fn set(ids: &[&str]) -> BTreeSet<RouteId> {
    ids.iter().map(|s| r(s)).collect()
}

/// A durable, unpinned policy with the given value inputs.
pub fn durable(p: f64, recompute_ms: f64, reload_ms: f64) -> RoutePolicy {
    RoutePolicy {
        durable: true,
        reuse_probability: p,
        recompute_ms,
        reload_ms,
        ..RoutePolicy::default()
    }
}

/// Everything observable about a pool, to assert "unchanged".
pub fn fingerprint(pool: &PagePool) -> String {
    let routes: Vec<_> = pool
        .routes()
        .map(|(id, r)| {
            format!(
                "{id}:{:?}/{}/{:?}",
                r.pages(),
                r.token_count(),
                r.pending_append()
            )
        })
        .collect();
    let states: Vec<_> = (0..pool.page_count())
        .map(|p| (pool.page_state(Page(p)), pool.refcount(Page(p))))
        .collect();
    format!("{routes:?} {states:?} {:?}", pool.free_pages_list())
}

/// The local-interpreter fixture of spec §7.3 L-*: page size 2, tokens [1 2 3 4],
/// max_new 2 ⇒ target 5 ⇒ 3 pages.
pub fn request(id: &str, tokens: Vec<u32>) -> GenerationRequest {
    GenerationRequest::new(id, "model-a", tokens, 2).unwrap()
}

pub fn candidate(tier: Tier, cached: u32, free_pages: u32, source: Option<&str>) -> Candidate {
    Candidate {
        worker_id: WorkerId::from("w"),
        worker_epoch: Epoch(0),
        tier,
        cached_token_count: cached,
        cached_bytes: cached as u64 * BYTES_PER_TOKEN,
        queue_ms: 0.0,
        prefix_load_ms: 0.0,
        gpu_restore_ms: 0.0,
        prefill_ms_per_token: 1.0,
        first_token_ms: 1.0,
        page_size: 2,
        free_pages,
        evictable_pages: 0,
        max_context: 4096,
        online: true,
        model_loaded: true,
        exact: true,
        source_continuation_id: source.map(RouteId::from),
        resident_token_count: 0,
        transfer: TransferCapabilities::default(),
        imposed_ms: 0.0,
    }
}

/// One offer as the worker machine would hand it to capacity.
pub struct Offer {
    pub assignment: AssignmentId,
    pub route: RouteId,
    pub request: GenerationRequest,
    pub candidate: Candidate,
    pub estimate: Estimate,
    pub protected: BTreeSet<RouteId>,
}

impl Offer {
    pub fn new(request: GenerationRequest, candidate: Candidate) -> Offer {
        let estimate = estimate(&request, &candidate);
        Offer {
            assignment: AssignmentId::new(request.id.clone(), 1),
            route: request.route_id(),
            request,
            candidate,
            estimate,
            protected: BTreeSet::new(),
        }
    }

    pub fn admit(&self, pool: &mut PagePool) -> Result<Admission, DeclineReason> {
        pool.admit(AdmitRequest {
            assignment: &self.assignment,
            route: &self.route,
            request: &self.request,
            candidate: &self.candidate,
            estimate: &self.estimate,
            protected: &self.protected,
        })
    }
}
