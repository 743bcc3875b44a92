//! The page pool behind the worker's `Capacity` seam: the local interpreter's offer path
//! (spec §3.6 steps 4–6, §3.8; tests L-2, L-3, L-4, L-6 with page size 2, tokens
//! [1 2 3 4] and max_new 2 ⇒ target 5 ⇒ 3 pages).
//!
//! L-1, L-5 (and L-3 through the worker) drive the worker state machine over the pool:
//! see `pool_worker.rs`.

use crate::pool_support;

use den_protocol::candidate::Tier;
use den_protocol::capacity::{Capacity, DeclineReason};
use den_protocol::chunk::plan_chunks;
use den_protocol::ids::{AssignmentId, ModelFingerprint};
use den_protocol::observation::GpuPrefix;
use den_protocol::pool::{Page, PageState, RoutePolicy};
use pool_support::*;

fn l_request() -> den_protocol::request::GenerationRequest {
    request("req", vec![1, 2, 3, 4])
}

#[test]
fn l_2_a_stale_candidate_is_declined_insufficient_pages_without_change() {
    let mut pool = pool(2, 2);
    let offer = Offer::new(l_request(), candidate(Tier::None, 0, 4, None));
    assert!(
        offer.estimate.feasible(),
        "the router's stale view said 4 free pages"
    );
    assert_eq!(
        offer.admit(&mut pool),
        Err(DeclineReason::InsufficientPages)
    );
    assert_eq!(pool.free_pages(), 2);
    assert_eq!(pool.reserved_count(), 0);
    assert!(pool.reservation_for(&offer.assignment).is_none());
    pool.check_invariants().unwrap();
}

#[test]
fn l_3_gpu_candidate_forks_the_shared_prefix_and_reserves_only_growth() {
    let mut pool = pool(2, 4);
    pool.allocate(&r("shared-prefix"), 2).unwrap();
    let offer = Offer::new(
        l_request(),
        candidate(Tier::Gpu, 2, 3, Some("shared-prefix")),
    );
    let admission = offer.admit(&mut pool).unwrap();
    assert_eq!(
        admission.reserved_pages, 2,
        "3 pages for 5 tokens, 1 shared, full page ⇒ no copy-on-write page"
    );
    assert_eq!(admission.forked_from, Some(r("shared-prefix")));
    assert_eq!(
        (admission.evicted_pages, admission.evicted_routes.len()),
        (0, 0)
    );
    assert_eq!(pool.route(&offer.route).unwrap().pages(), pages(&[0]));
    assert_eq!(pool.refcount(Page(0)), 2);
    assert_eq!(pool.reserved_count(), 2);
    assert!(pool.reservation_for(&offer.assignment).is_some());
    pool.check_invariants().unwrap();

    // Cancel, then the pending task quiesces: the unclaimed pages go back, once.
    assert!(pool.release(&offer.assignment));
    assert!(!pool.release(&offer.assignment));
    assert_eq!(pool.reserved_count(), 0);
    pool.abandon(&offer.assignment, &offer.route);
    assert!(pool.route(&offer.route).is_none());
    assert_eq!((pool.refcount(Page(0)), pool.free_pages()), (1, 3));
    pool.check_invariants().unwrap();
}

#[test]
fn l_4_observation_reports_free_evictable_and_prefix_boundaries() {
    let mut pool = pool(2, 4);
    pool.allocate(&r("resident"), 2).unwrap();
    pool.set_policy(
        &r("resident"),
        RoutePolicy {
            durable: true,
            ..RoutePolicy::default()
        },
    )
    .unwrap();
    let model = ModelFingerprint::from("model-a");
    let chunks = plan_chunks(&[1, 2], 1);
    pool.record_prefixes(
        &r("resident"),
        &model,
        chunks.iter().map(|c| (c.end(), c.hash)),
    )
    .unwrap();

    assert_eq!(pool.free_pages(), 3);
    assert_eq!(Capacity::evictable_pages(&pool, &none()), 1);
    let entry = |hash, tokens, bytes| GpuPrefix {
        model: model.clone(),
        prefix_hash: hash,
        continuation_id: r("resident"),
        token_count: tokens,
        bytes,
    };
    assert_eq!(
        pool.gpu_prefixes(),
        [entry(chunks[1].hash, 2, 16), entry(chunks[0].hash, 1, 8)]
    );

    let stats = pool.stats(&none());
    assert_eq!(
        (
            stats.total_pages,
            stats.free,
            stats.reserved,
            stats.resident
        ),
        (4, 3, 0, 1)
    );
    assert_eq!(
        (stats.evictable, stats.durable, stats.page_bytes),
        (1, 1, 16)
    );
    // A protected route is not evictable.
    assert_eq!(pool.stats(&set(&["resident"])).evictable, 0);
}

#[test]
fn l_6_fork_at_an_advertised_boundary_or_decline_unavailable() {
    let mut pool = pool(2, 8);
    pool.allocate(&r("resident"), 3).unwrap();
    let offer = Offer::new(l_request(), candidate(Tier::Gpu, 2, 6, Some("resident")));
    let admission = offer.admit(&mut pool).unwrap();
    assert_eq!(admission.forked_from, Some(r("resident")));
    let forked = pool.route(&offer.route).unwrap();
    assert_eq!(
        (forked.token_count(), forked.pages()),
        (2, pages(&[0]).as_slice())
    );
    assert_eq!(admission.reserved_pages, 2);

    let longer = Offer::new(
        request("req-2", vec![1, 2, 3, 4, 5, 6]),
        candidate(Tier::Gpu, 4, 6, Some("resident")),
    );
    assert!(longer.estimate.feasible());
    assert_eq!(
        longer.admit(&mut pool),
        Err(DeclineReason::ResidentPrefixUnavailable)
    );
    pool.check_invariants().unwrap();
}

#[test]
fn an_existing_route_must_hold_exactly_the_cached_prefix() {
    let mut pool = pool(2, 8);
    pool.allocate(&r("conversation"), 3).unwrap();
    let req = l_request().with_continuation_id("conversation");
    let wrong = Offer::new(req.clone(), candidate(Tier::Gpu, 2, 6, None));
    assert_eq!(
        wrong.admit(&mut pool),
        Err(DeclineReason::ResidentPrefixMismatch)
    );

    let exact = Offer::new(req, candidate(Tier::Gpu, 3, 6, None));
    let admission = exact.admit(&mut pool).unwrap();
    assert_eq!(admission.forked_from, None);
    // 5 tokens need 3 pages; the route holds 2 and its partial tail is private.
    assert_eq!(admission.reserved_pages, 1);
    // Abandoning keeps a route that existed before the offer.
    pool.abandon(&exact.assignment, &exact.route);
    assert_eq!(pool.route(&r("conversation")).unwrap().token_count(), 3);
    pool.check_invariants().unwrap();
}

#[test]
fn a_shared_partial_tail_reserves_its_copy_on_write_page() {
    let mut pool = pool(2, 8);
    pool.allocate(&r("resident"), 3).unwrap();
    let offer = Offer::new(
        request("req", vec![1, 2, 3, 4, 5]),
        candidate(Tier::Gpu, 3, 6, Some("resident")),
    );
    let admission = offer.admit(&mut pool).unwrap();
    // target 6 ⇒ 3 pages; 2 shared, the partial tail shared ⇒ +1 copy-on-write page.
    assert_eq!(admission.reserved_pages, 2);
    let append = pool.append_reserve(&offer.route, 3).unwrap();
    assert!(append.copy.is_some());
    assert_eq!(
        pool.reserved_count(),
        0,
        "the append drew both pages from the reservation"
    );
    pool.commit_append(&offer.route, append.id).unwrap();
    pool.complete(&offer.assignment, &offer.route);
    assert_eq!(pool.route(&offer.route).unwrap().token_count(), 6);
    pool.check_invariants().unwrap();
}

#[test]
fn admission_evicts_unprotected_durable_routes_and_reports_them() {
    let mut pool = pool(2, 5);
    pool.allocate(&r("cold"), 4).unwrap();
    pool.allocate(&r("busy"), 4).unwrap();
    pool.set_policy(&r("cold"), durable(0.1, 10.0, 5.0))
        .unwrap();
    // Lower density than cold, but another assignment's route.
    pool.set_policy(&r("busy"), durable(0.0, 0.0, 0.0)).unwrap();
    let mut offer = Offer::new(l_request(), candidate(Tier::None, 0, 2, None));
    offer.protected = set(&["busy"]);
    let admission = offer.admit(&mut pool).unwrap();
    assert_eq!(admission.reserved_pages, 3);
    assert_eq!(
        admission.evicted_pages, 2,
        "one page was free, two came from evicting cold"
    );
    assert_eq!(admission.evicted_routes, [r("cold")]);
    assert!(pool.route(&r("busy")).is_some());

    // The handler allocates the route from the reservation; completion keeps it.
    pool.allocate(&offer.route, 3).unwrap();
    assert_eq!(pool.reserved_count(), 1);
    pool.complete(&offer.assignment, &offer.route);
    assert_eq!((pool.reserved_count(), pool.free_pages()), (0, 1));
    assert!(pool.route(&offer.route).is_some());
    assert!(!pool.release(&offer.assignment));
    pool.check_invariants().unwrap();
}

#[test]
fn a_declined_fork_is_undone_exactly() {
    let mut pool = pool(2, 2);
    pool.allocate(&r("resident"), 2).unwrap();
    let before = fingerprint(&pool);
    let offer = Offer::new(
        request("req", vec![1, 2, 3, 4, 5, 6]),
        candidate(Tier::Gpu, 2, 9, Some("resident")),
    );
    assert_eq!(
        offer.admit(&mut pool),
        Err(DeclineReason::InsufficientPages)
    );
    assert_eq!(fingerprint(&pool), before);
    assert!(pool.route(&offer.route).is_none());
}

#[test]
fn routes_of_another_model_or_in_use_are_never_joined() {
    let mut pool = pool(2, 8);
    pool.allocate(&r("other-model"), 2).unwrap();
    let hash = plan_chunks(&[1, 2], 2)[0].hash;
    pool.record_prefixes(
        &r("other-model"),
        &ModelFingerprint::from("model-b"),
        [(2, hash)],
    )
    .unwrap();
    let offer = Offer::new(l_request(), candidate(Tier::Gpu, 2, 6, Some("other-model")));
    assert_eq!(
        offer.admit(&mut pool),
        Err(DeclineReason::ResidentPrefixUnavailable)
    );

    // A continuation another assignment is using cannot be admitted again.
    let first = Offer::new(
        l_request().with_continuation_id("conv"),
        candidate(Tier::None, 0, 6, None),
    );
    first.admit(&mut pool).unwrap();
    pool.allocate(&first.route, 3).unwrap();
    let mut second = Offer::new(
        request("req-2", vec![1, 2, 3, 4]).with_continuation_id("conv"),
        candidate(Tier::None, 0, 6, None),
    );
    second.protected = set(&["conv"]);
    assert_eq!(
        second.admit(&mut pool),
        Err(DeclineReason::ResidentPrefixMismatch)
    );
    // The same assignment is never admitted twice.
    assert_eq!(
        first.admit(&mut pool),
        Err(DeclineReason::RequestAlreadyAssigned)
    );
    pool.check_invariants().unwrap();
}

#[test]
fn a_recompute_offer_replaces_an_idle_resident_continuation() {
    let mut pool = pool(2, 3);
    pool.allocate(&r("conv"), 4).unwrap();
    let offer = Offer::new(
        l_request().with_continuation_id("conv"),
        candidate(Tier::None, 0, 3, None),
    );
    // The idle route's 2 pages count as freed: 3 pages fit in a 3-page pool.
    let admission = offer.admit(&mut pool).unwrap();
    assert_eq!(admission.reserved_pages, 3);
    assert_eq!(
        (admission.evicted_pages, admission.evicted_routes.len()),
        (0, 0)
    );
    assert!(pool.route(&r("conv")).is_none());
    pool.allocate(&r("conv"), 3).unwrap();
    pool.abandon(&offer.assignment, &offer.route);
    assert!(
        pool.route(&r("conv")).is_none(),
        "the assignment built it, so abandon drops it"
    );
    assert_eq!(pool.free_pages(), 3);
    pool.check_invariants().unwrap();
}

#[test]
fn abandon_aborts_a_pending_append_and_crash_frees_everything() {
    let mut pool = pool(2, 8);
    let offer = Offer::new(l_request(), candidate(Tier::None, 0, 8, None));
    offer.admit(&mut pool).unwrap();
    pool.allocate(&offer.route, 3).unwrap();
    pool.append_reserve(&offer.route, 1).unwrap();
    pool.abandon(&offer.assignment, &offer.route);
    assert!(pool.route(&offer.route).is_none());
    assert_eq!(pool.free_pages(), 8);
    pool.check_invariants().unwrap();

    pool.allocate(&r("a"), 4).unwrap();
    pool.lease(&[r("a")]).unwrap();
    let offer = Offer::new(
        request("req-9", vec![1, 2, 3]),
        candidate(Tier::None, 0, 8, None),
    );
    offer.admit(&mut pool).unwrap();
    let ticket = pool.start_load(Page(0)).unwrap();
    let generations = pool.generations();
    pool.crash();
    assert_eq!(
        (
            pool.free_pages(),
            pool.reserved_count(),
            pool.route_count(),
            pool.lease_count()
        ),
        (8, 0, 0, 0)
    );
    assert!(
        pool.generations()
            .iter()
            .zip(&generations)
            .all(|(now, was)| now >= was)
    );
    assert!(pool.complete_load(ticket).is_err());
    assert!(matches!(
        pool.page_state(Page(0)),
        Some(PageState::Free { .. })
    ));
    assert!(!pool.release(&offer.assignment));
    assert!(!pool.release(&AssignmentId::new("never", 1)));
    pool.check_invariants().unwrap();
}
