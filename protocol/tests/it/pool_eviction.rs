//! Residency and eviction (spec §4.5–4.6, tests E-1 … E-6; page size 4).

use crate::pool_support;

use den_protocol::pool::{EvictionPlan, EvictionReason, PagePool, PoolError, RoutePolicy};
use den_protocol::time::Millis;
use pool_support::*;

#[test]
fn e_1_lowest_value_density_is_evicted_first() {
    let mut pool = pool(4, 4);
    assert_eq!(pool.allocate(&r("cold"), 8).unwrap(), pages(&[0, 1]));
    assert_eq!(pool.allocate(&r("hot"), 8).unwrap(), pages(&[2, 3]));
    pool.set_policy(&r("cold"), durable(0.1, 10.0, 5.0))
        .unwrap();
    pool.set_policy(&r("hot"), durable(0.9, 20.0, 2.0)).unwrap();

    let needed = pool.requirement(&r("incoming"), 8);
    assert_eq!(needed, 2);
    assert_eq!(pool.plan_eviction(needed, &none()).evictions(), [r("cold")]);

    let grant = pool.admit_capacity(&r("incoming"), 8, &none()).unwrap();
    assert_eq!(grant.reserved_pages, 2);
    assert_eq!(grant.evictions.len(), 1);
    assert_eq!(grant.evictions[0].route, r("cold"));
    assert_eq!(
        grant.evictions[0].reason,
        EvictionReason::Capacity {
            for_route: r("incoming")
        }
    );
    assert_eq!(pool.allocate(&r("incoming"), 8).unwrap(), pages(&[0, 1]));
    assert!(pool.route(&r("hot")).is_some() && pool.route(&r("cold")).is_none());
    assert_eq!(pool.eviction_counters().capacity_routes, 1);
    assert_eq!(pool.eviction_counters().capacity_pages, 2);
    pool.check_invariants().unwrap();
}

#[test]
fn e_2_dirty_leased_pinned_and_appending_routes_are_never_evicted() {
    let mut pool = pool(4, 4);
    pool.allocate(&r("dirty"), 4).unwrap();
    pool.allocate(&r("leased"), 4).unwrap();
    pool.allocate(&r("pinned"), 4).unwrap();
    pool.allocate(&r("appending"), 2).unwrap();
    pool.set_policy(&r("leased"), durable(0.0, 0.0, 0.0))
        .unwrap();
    pool.set_policy(
        &r("pinned"),
        RoutePolicy {
            pinned: true,
            ..durable(0.0, 0.0, 0.0)
        },
    )
    .unwrap();
    pool.set_policy(&r("appending"), durable(0.0, 0.0, 0.0))
        .unwrap();
    pool.lease(&[r("leased")]).unwrap();
    pool.append_reserve(&r("appending"), 1).unwrap();
    let before = fingerprint(&pool);

    let plan = pool.plan_eviction(pool.requirement(&r("incoming"), 4), &none());
    assert_eq!(
        plan,
        EvictionPlan::Shortfall {
            required: 1,
            available: 0,
            shortfall: 1
        }
    );
    assert_eq!(
        pool.admit_capacity(&r("incoming"), 4, &none()),
        Err(PoolError::Shortfall {
            required: 1,
            available: 0,
            shortfall: 1
        })
    );
    assert_eq!(fingerprint(&pool), before);
    assert_eq!(pool.evictable_pages(&none()), 0);
    pool.check_invariants().unwrap();
}

#[test]
fn e_3_planning_simulates_refcounts_of_shared_pages() {
    let mut pool = pool(4, 2);
    pool.allocate(&r("root"), 4).unwrap();
    pool.fork(&r("root"), &r("fork-a"), None).unwrap();
    pool.fork(&r("root"), &r("fork-b"), None).unwrap();
    pool.release_route(&r("root")).unwrap();
    assert_eq!(pool.allocate(&r("other"), 4).unwrap(), pages(&[1]));
    pool.set_policy(&r("fork-a"), durable(0.1, 10.0, 5.0))
        .unwrap();
    pool.set_policy(&r("fork-b"), durable(0.1, 10.0, 5.0))
        .unwrap();
    pool.set_policy(&r("other"), durable(0.9, 20.0, 2.0))
        .unwrap();
    assert_eq!(pool.refcount(pages(&[0])[0]), 2);

    let plan = pool.plan_eviction(1, &none());
    assert_eq!(plan.evictions(), [r("fork-a"), r("fork-b")]);
    assert_eq!(
        plan,
        EvictionPlan::Admissible {
            evictions: vec![r("fork-a"), r("fork-b")],
            required: 1,
            available: 1,
            free_after: 0
        }
    );

    let grant = pool.admit_capacity(&r("incoming"), 4, &none()).unwrap();
    let freed: Vec<_> = grant
        .evictions
        .iter()
        .map(|e| (e.route.clone(), e.pages_freed))
        .collect();
    assert_eq!(freed, [(r("fork-a"), 0), (r("fork-b"), 1)]);
    assert!(pool.route(&r("other")).is_some());
    pool.check_invariants().unwrap();
}

#[test]
fn e_4_a_growing_route_is_protected_and_needs_only_its_growth() {
    let pool = e4_fixture();
    assert_eq!(pool.requirement(&r("running"), 16), 3);
    // Protected (as capacity admission always does), only the cold route goes.
    assert_eq!(
        pool.plan_eviction(3, &set(&["running"])).evictions(),
        [r("cold")]
    );
    // Unprotected, the running route's density (0) would put it first.
    assert_eq!(
        pool.plan_eviction(3, &none()).evictions(),
        [r("running"), r("cold")]
    );
}

#[test]
fn e_5_applied_admission_reserves_evicts_and_releases() {
    let mut pool = e4_fixture();
    let grant = pool.admit_capacity(&r("running"), 16, &none()).unwrap();
    assert_eq!(grant.reserved_pages, 3);
    assert_eq!(
        grant
            .evictions
            .iter()
            .map(|e| e.route.clone())
            .collect::<Vec<_>>(),
        [r("cold")]
    );
    assert!(pool.route(&r("running")).is_some() && pool.route(&r("cold")).is_none());
    assert_eq!((pool.reserved_count(), pool.free_count()), (3, 0));
    pool.check_invariants().unwrap();

    // Growth claims from the reservation; release returns the rest and is idempotent.
    let append = pool.append_reserve(&r("running"), 6).unwrap();
    assert_eq!(append.growth, pages(&[1, 2]));
    pool.commit_append(&r("running"), append.id).unwrap();
    assert_eq!(pool.reserved_count(), 1);
    assert!(pool.release_reservation(grant.reservation));
    assert!(!pool.release_reservation(grant.reservation));
    assert_eq!((pool.reserved_count(), pool.free_count()), (0, 1));
    pool.check_invariants().unwrap();
}

/// Page size 4, 4 pages: `running` (3 tokens, page 0, density 0), `cold` (pages 1–3).
fn e4_fixture() -> PagePool {
    let mut pool = pool(4, 4);
    assert_eq!(pool.allocate(&r("running"), 3).unwrap(), pages(&[0]));
    assert_eq!(pool.allocate(&r("cold"), 12).unwrap(), pages(&[1, 2, 3]));
    pool.set_policy(&r("running"), durable(0.0, 0.0, 0.0))
        .unwrap();
    pool.set_policy(&r("cold"), durable(0.1, 10.0, 5.0))
        .unwrap();
    pool
}

#[test]
fn e_6_evictable_count_respects_shared_refcounts_and_protection() {
    let mut pool = pool(4, 2);
    pool.allocate(&r("root"), 4).unwrap();
    pool.fork(&r("root"), &r("fork-a"), None).unwrap();
    pool.fork(&r("root"), &r("fork-b"), None).unwrap();
    pool.release_route(&r("root")).unwrap();
    pool.set_policy(&r("fork-a"), durable(0.5, 10.0, 1.0))
        .unwrap();
    pool.set_policy(&r("fork-b"), durable(0.5, 10.0, 1.0))
        .unwrap();
    assert_eq!(pool.evictable_pages(&none()), 1);
    assert_eq!(pool.evictable_pages(&set(&["fork-a"])), 0);
    assert_eq!(pool.stats(&none()).evictable, 1);
}

#[test]
fn ties_in_density_go_to_the_least_recently_used_then_route_id() {
    let mut pool = pool(4, 3);
    for id in ["b", "a", "c"] {
        pool.allocate(&r(id), 4).unwrap();
        pool.set_policy(&r(id), durable(0.5, 4.0, 0.0)).unwrap();
    }
    pool.touch(&r("a"), Millis(50)).unwrap();
    pool.touch(&r("b"), Millis(10)).unwrap();
    pool.touch(&r("c"), Millis(10)).unwrap();
    assert_eq!(
        pool.plan_eviction(3, &none()).evictions(),
        [r("b"), r("c"), r("a")]
    );
    // Density divides value by pages: a 2-page route of equal value goes first.
    let mut pool2 = pool_support::pool(4, 3);
    pool2.allocate(&r("big"), 8).unwrap();
    pool2.allocate(&r("small"), 4).unwrap();
    pool2
        .set_policy(&r("big"), durable(1.0, 10.0, 0.0))
        .unwrap();
    pool2
        .set_policy(&r("small"), durable(1.0, 10.0, 0.0))
        .unwrap();
    assert_eq!(pool2.plan_eviction(2, &none()).evictions(), [r("big")]);
}

#[test]
fn explicit_eviction_and_policy_validation() {
    let mut pool = pool(4, 2);
    pool.allocate(&r("a"), 4).unwrap();
    assert_eq!(
        pool.evict(&r("a"), EvictionReason::Explicit),
        Err(PoolError::NotEvictable(r("a")))
    );
    assert_eq!(
        pool.set_policy(&r("a"), durable(1.5, 1.0, 0.0)),
        Err(PoolError::InvalidPolicy("reuse_probability"))
    );
    assert_eq!(
        pool.set_policy(&r("a"), durable(0.5, f64::NAN, 0.0)),
        Err(PoolError::InvalidPolicy("recompute_ms"))
    );
    assert!(!pool.route(&r("a")).unwrap().policy().durable);
    pool.set_policy(&r("a"), durable(0.5, 1.0, 0.0)).unwrap();
    let e = pool.evict(&r("a"), EvictionReason::Explicit).unwrap();
    assert_eq!(e.pages_freed, 1);
    assert_eq!(pool.eviction_counters().explicit_routes, 1);
    pool.check_invariants().unwrap();
}

#[test]
fn many_candidates_plan_in_order_without_touching_the_pool() {
    let mut pool = pool(1, 1000);
    for i in 0..1000u32 {
        let id = r(&format!("route-{i:04}"));
        pool.allocate(&id, 1).unwrap();
        // Values descending with i: the last routes are the cheapest.
        pool.set_policy(&id, durable(1.0, (1000 - i) as f64, 0.0))
            .unwrap();
    }
    let before = fingerprint(&pool);
    let plan = pool.plan_eviction(3, &set(&["route-0999"]));
    assert_eq!(
        plan.evictions(),
        [r("route-0998"), r("route-0997"), r("route-0996")]
    );
    assert_eq!(fingerprint(&pool), before);
    assert_eq!(pool.evictable_pages(&none()), 1000);
}
