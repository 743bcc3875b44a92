//! Property tests: random sequences of every pool operation keep the accounting
//! consistent, refusals change nothing, releases are idempotent, generations only grow,
//! and eviction planning agrees with what evicting actually frees.

use crate::pool_support;

use std::collections::BTreeSet;

use proptest::prelude::*;

use den_protocol::candidate::Tier;
use den_protocol::capacity::Capacity;
use den_protocol::ids::{AssignmentId, RouteId};
use den_protocol::pool::{
    AppendId, EvictionPlan, EvictionReason, LeaseId, Page, PagePool, PoolError, ReservationId,
    RoutePolicy, TransferTicket,
};
use den_protocol::time::Millis;
use pool_support::*;

const ROUTES: u8 = 5;
const PAGES: u32 = 24;
const PAGE_SIZE: u32 = 3;

#[derive(Debug, Clone)]
enum Op {
    Allocate(u8, u8),
    Fork(u8, u8, Option<u8>),
    Release(u8),
    Append(u8, u8),
    Commit(u8),
    Abort(u8),
    StaleCommit(u8),
    Lease(Vec<u8>),
    LeaseProspective(u8),
    ReleaseLease(u8),
    Reserve(u8, u8),
    ReleaseReservation(u8),
    Policy {
        route: u8,
        p: u8,
        recompute: u8,
        reload: u8,
        pinned: bool,
        durable: bool,
    },
    Touch(u8, u16),
    Evict(u8),
    Admit {
        route: u8,
        target: u8,
        protected: u8,
    },
    StartLoad(u8),
    FinishLoad(u8, bool),
    StartEvict(u8),
    FinishEvict(u8),
    CapAdmit {
        route: u8,
        gpu: bool,
        cached: u8,
        source: Option<u8>,
        prompt: u8,
        protected: u8,
    },
    CapRelease(u8),
    CapComplete(u8),
    CapAbandon(u8),
    Crash,
}

fn route() -> impl Strategy<Value = u8> {
    0..ROUTES
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        18 => (route(), 0u8..12).prop_map(|(r, t)| Op::Allocate(r, t)),
        12 => (route(), route(), proptest::option::of(0u8..12)).prop_map(|(a, b, n)| Op::Fork(a, b, n)),
        3 => route().prop_map(Op::Release),
        18 => (route(), 1u8..8).prop_map(|(r, t)| Op::Append(r, t)),
        12 => route().prop_map(Op::Commit),
        6 => route().prop_map(Op::Abort),
        2 => route().prop_map(Op::StaleCommit),
        6 => proptest::collection::vec(route(), 1..4).prop_map(Op::Lease),
        6 => route().prop_map(Op::LeaseProspective),
        6 => any::<u8>().prop_map(Op::ReleaseLease),
        3 => (route(), 0u8..20).prop_map(|(r, t)| Op::Reserve(r, t)),
        6 => any::<u8>().prop_map(Op::ReleaseReservation),
        9 => (route(), 0u8..=100, any::<u8>(), any::<u8>(), proptest::bool::weighted(0.2), proptest::bool::weighted(0.8))
            .prop_map(|(route, p, recompute, reload, pinned, durable)| Op::Policy { route, p, recompute, reload, pinned, durable }),
        3 => (route(), any::<u16>()).prop_map(|(r, t)| Op::Touch(r, t)),
        3 => route().prop_map(Op::Evict),
        6 => (route(), 0u8..30, any::<u8>()).prop_map(|(route, target, protected)| Op::Admit { route, target, protected }),
        4 => (0u8..PAGES as u8).prop_map(Op::StartLoad),
        4 => (any::<u8>(), any::<bool>()).prop_map(|(i, ok)| Op::FinishLoad(i, ok)),
        3 => (0u8..PAGES as u8).prop_map(Op::StartEvict),
        3 => any::<u8>().prop_map(Op::FinishEvict),
        9 => (route(), any::<bool>(), 0u8..10, proptest::option::of(route()), 1u8..14, any::<u8>())
            .prop_map(|(route, gpu, cached, source, prompt, protected)| Op::CapAdmit { route, gpu, cached, source, prompt, protected }),
        6 => any::<u8>().prop_map(Op::CapRelease),
        6 => any::<u8>().prop_map(Op::CapComplete),
        3 => any::<u8>().prop_map(Op::CapAbandon),
        1 => Just(Op::Crash),
    ]
}

fn rid(i: u8) -> RouteId {
    RouteId::new(format!("r{i}"))
}

fn mask(m: u8) -> BTreeSet<RouteId> {
    (0..ROUTES).filter(|i| m & (1 << i) != 0).map(rid).collect()
}

fn pick<T: Clone>(v: &[T], i: u8) -> Option<T> {
    if v.is_empty() {
        None
    } else {
        v.get(i as usize % v.len()).cloned()
    }
}

/// What the test remembers between operations.
#[derive(Default)]
struct Model {
    leases: Vec<LeaseId>,
    reservations: Vec<ReservationId>,
    loads: Vec<TransferTicket>,
    evicts: Vec<TransferTicket>,
    assignments: Vec<(AssignmentId, RouteId)>,
    next_request: u64,
}

fn pending(pool: &PagePool, r: &RouteId) -> Option<AppendId> {
    pool.route(r).and_then(|x| x.pending_append())
}

/// Apply one operation, checking its local properties. Returns whether the pool may
/// have changed (`false` means it must be exactly as before).
fn apply(pool: &mut PagePool, m: &mut Model, op: &Op) -> Result<bool, TestCaseError> {
    let changed = match op {
        Op::Allocate(r, t) => pool.allocate(&rid(*r), *t as u32).is_ok(),
        Op::Fork(a, b, n) => pool.fork(&rid(*a), &rid(*b), n.map(u32::from)).is_ok(),
        Op::Release(r) => {
            let first = pool.release_route(&rid(*r));
            if first == Ok(true) {
                prop_assert_eq!(pool.release_route(&rid(*r)), Ok(false));
            }
            first == Ok(true)
        }
        Op::Append(r, t) => pool.append_reserve(&rid(*r), *t as u32).is_ok(),
        Op::Commit(r) => match pending(pool, &rid(*r)) {
            Some(id) => pool.commit_append(&rid(*r), id).is_ok(),
            None => false,
        },
        Op::Abort(r) => match pending(pool, &rid(*r)) {
            Some(id) => {
                pool.abort_append(&rid(*r), id)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(pending(pool, &rid(*r)), None);
                true
            }
            None => false,
        },
        Op::StaleCommit(r) => {
            let stale = AppendId(u64::MAX);
            prop_assert!(pool.commit_append(&rid(*r), stale).is_err());
            prop_assert!(pool.abort_append(&rid(*r), stale).is_err());
            false
        }
        Op::Lease(rs) => {
            let ids: Vec<RouteId> = rs.iter().map(|r| rid(*r)).collect();
            match pool.lease(&ids) {
                Ok(id) => {
                    m.leases.push(id);
                    true
                }
                Err(_) => false,
            }
        }
        Op::LeaseProspective(r) => match pending(pool, &rid(*r)) {
            Some(id) => {
                let lease = pool
                    .lease_prospective(&[(rid(*r), id)])
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                m.leases.push(lease);
                true
            }
            None => false,
        },
        Op::ReleaseLease(i) => match pick(&m.leases, *i) {
            Some(id) => {
                let first = pool.release_lease(id);
                prop_assert!(!pool.release_lease(id), "lease release is idempotent");
                m.leases.retain(|l| *l != id);
                first
            }
            None => false,
        },
        Op::Reserve(r, t) => match pool.reserve(&rid(*r), *t as u32) {
            Ok(id) => {
                m.reservations.push(id);
                true
            }
            Err(_) => false,
        },
        Op::ReleaseReservation(i) => match pick(&m.reservations, *i) {
            Some(id) => {
                let first = pool.release_reservation(id);
                prop_assert!(
                    !pool.release_reservation(id),
                    "reservation release is idempotent"
                );
                m.reservations.retain(|x| *x != id);
                first
            }
            None => false,
        },
        Op::Policy {
            route,
            p,
            recompute,
            reload,
            pinned,
            durable,
        } => {
            let policy = RoutePolicy {
                durable: *durable,
                pinned: *pinned,
                reuse_probability: *p as f64 / 100.0,
                recompute_ms: *recompute as f64,
                reload_ms: *reload as f64,
                ..RoutePolicy::default()
            };
            pool.update_policy(&rid(*route), |old| {
                *old = RoutePolicy {
                    last_access: old.last_access,
                    ..policy
                }
            })
            .is_ok()
        }
        Op::Touch(r, t) => pool.touch(&rid(*r), Millis(*t as u64)).is_ok(),
        Op::Evict(r) => pool.evict(&rid(*r), EvictionReason::Explicit).is_ok(),
        Op::Admit {
            route,
            target,
            protected,
        } => {
            let (route, target, protected) = (rid(*route), *target as u32, mask(*protected));
            let mut excluded = protected.clone();
            excluded.insert(route.clone());
            let blocked = pool.reservation_of(&route).is_some() || pending(pool, &route).is_some();
            let plan = pool.plan_eviction(pool.requirement(&route, target), &excluded);
            match pool.admit_capacity(&route, target, &protected) {
                Ok(grant) => {
                    prop_assert!(!blocked);
                    let evicted: Vec<RouteId> =
                        grant.evictions.iter().map(|e| e.route.clone()).collect();
                    prop_assert_eq!(evicted.as_slice(), plan.evictions());
                    prop_assert!(evicted.iter().all(|e| !excluded.contains(e)));
                    m.reservations.push(grant.reservation);
                    true
                }
                Err(PoolError::Shortfall { shortfall, .. }) => {
                    let planned = matches!(plan, EvictionPlan::Shortfall { shortfall: s, .. } if s == shortfall);
                    prop_assert!(planned, "admission fell short where the plan did not");
                    false
                }
                Err(_) => {
                    prop_assert!(blocked);
                    false
                }
            }
        }
        Op::StartLoad(p) => match pool.start_load(Page(*p as u32)) {
            Ok(t) => {
                m.loads.push(t);
                true
            }
            Err(_) => false,
        },
        Op::FinishLoad(i, ok) => match pick(&m.loads, *i) {
            Some(t) => {
                let r = if *ok {
                    pool.complete_load(t)
                } else {
                    pool.fail_load(t)
                };
                m.loads.retain(|x| *x != t);
                prop_assert!(pool.complete_load(t).is_err(), "a ticket completes once");
                r.is_ok()
            }
            None => false,
        },
        Op::StartEvict(p) => match pool.start_evict(Page(*p as u32)) {
            Ok(t) => {
                m.evicts.push(t);
                true
            }
            Err(_) => false,
        },
        Op::FinishEvict(i) => match pick(&m.evicts, *i) {
            Some(t) => {
                m.evicts.retain(|x| *x != t);
                pool.complete_evict(t).is_ok()
            }
            None => false,
        },
        Op::CapAdmit {
            route,
            gpu,
            cached,
            source,
            prompt,
            protected,
        } => {
            m.next_request += 1;
            let tokens: Vec<u32> = (0..*prompt as u32).collect();
            let req = request(&format!("q{}", m.next_request), tokens)
                .with_continuation_id(rid(*route).0);
            let tier = if *gpu { Tier::Gpu } else { Tier::None };
            let source = source.map(|s| format!("r{s}"));
            let mut offer = Offer::new(
                req,
                candidate(tier, *cached as u32, PAGES, source.as_deref()),
            );
            offer.protected = mask(*protected);
            offer.protected.remove(&offer.route);
            match offer.admit(pool) {
                Ok(_) => {
                    m.assignments
                        .push((offer.assignment.clone(), offer.route.clone()));
                    true
                }
                Err(_) => false,
            }
        }
        Op::CapRelease(i) => match pick(&m.assignments, *i) {
            Some((a, _)) => {
                let first = pool.release(&a);
                prop_assert!(!pool.release(&a), "capacity release is idempotent");
                first
            }
            None => false,
        },
        Op::CapComplete(i) => match pick(&m.assignments, *i) {
            Some((a, route)) => {
                pool.complete(&a, &route);
                m.assignments.retain(|(x, _)| *x != a);
                prop_assert!(pool.reservation_for(&a).is_none());
                true
            }
            None => false,
        },
        Op::CapAbandon(i) => match pick(&m.assignments, *i) {
            Some((a, route)) => {
                pool.abandon(&a, &route);
                m.assignments.retain(|(x, _)| *x != a);
                true
            }
            None => false,
        },
        Op::Crash => {
            pool.crash();
            prop_assert_eq!(pool.free_pages(), PAGES);
            *m = Model {
                next_request: m.next_request,
                ..Model::default()
            };
            true
        }
    };
    Ok(changed)
}

/// Evicting every eligible route (one at a time, in any order) frees exactly what the
/// simulation said.
fn evict_all_matches_simulation(pool: &PagePool) -> Result<(), TestCaseError> {
    let predicted = pool.evictable_pages(&BTreeSet::new());
    let mut copy = pool.clone();
    let eligible: Vec<RouteId> = pool
        .routes()
        .map(|(id, _)| id.clone())
        .filter(|id| pool.is_evictable(id, &BTreeSet::new()))
        .collect();
    let before = copy.free_count();
    for id in eligible.iter().rev() {
        copy.evict(id, EvictionReason::Explicit)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    prop_assert_eq!(copy.free_count() - before, predicted);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_operation_sequences_keep_the_pool_consistent(ops in proptest::collection::vec(op(), 1..120)) {
        let mut pool = pool(PAGE_SIZE, PAGES);
        let mut model = Model::default();
        let mut generations = pool.generations();
        for op in &ops {
            let before = format!("{pool:?}");
            let changed = apply(&mut pool, &mut model, op)?;
            if !changed {
                prop_assert_eq!(format!("{pool:?}"), before, "refused {:?} changed the pool", op);
            }
            if let Err(e) = pool.check_invariants() {
                return Err(TestCaseError::fail(format!("after {op:?}: {e}")));
            }
            prop_assert_eq!(pool.free_count() + pool.reserved_count() + pool.referenced_count(), PAGES);
            let now = pool.generations();
            prop_assert!(now.iter().zip(&generations).all(|(n, w)| n >= w), "generations only grow");
            generations = now;
            evict_all_matches_simulation(&pool)?;
        }
    }
}
