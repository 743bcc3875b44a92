//! Page-pool accounting benchmarks: `cargo bench -p den-protocol --bench pool`.
//!
//! Fixtures: 16-token pages; "10k" pools hold 10 000 resident durable one-page routes
//! with spread-out eviction values plus some free pages.
// A benchmark may unwrap, expect and panic: a broken set-up should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // benches time and read files

use std::collections::BTreeSet;

use divan::{Bencher, black_box};

use den_protocol::candidate::{Candidate, Tier, TransferCapabilities, estimate};
use den_protocol::capacity::{AdmitRequest, Capacity};
use den_protocol::ids::{AssignmentId, Epoch, RouteId, WorkerId};
use den_protocol::pool::{Geometry, PagePool, RoutePolicy};
use den_protocol::request::GenerationRequest;
use den_protocol::time::Millis;

/// The allocator den-agent runs with (`agent/src/lib.rs`), so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    divan::main();
}

const PAGE: u32 = 16;
const RESIDENT: u32 = 10_000;

/// `RESIDENT` durable one-page routes `route-i` and `free` free pages.
fn resident_pool(free: u32) -> PagePool {
    let mut pool = PagePool::new(Geometry::new(PAGE, RESIDENT + free, 64 * 1024)).unwrap();
    for i in 0..RESIDENT {
        let id = RouteId::new(format!("route-{i:05}"));
        pool.allocate(&id, PAGE).unwrap();
        let policy = RoutePolicy {
            durable: true,
            reuse_probability: ((i * 7919) % 100) as f64 / 100.0,
            recompute_ms: 50.0 + (i % 13) as f64,
            reload_ms: 5.0,
            last_access: Millis(i as u64),
            ..RoutePolicy::default()
        };
        pool.set_policy(&id, policy).unwrap();
    }
    pool
}

fn protected() -> BTreeSet<RouteId> {
    (0..16)
        .map(|i| RouteId::new(format!("route-{:05}", i * 97)))
        .collect()
}

mod reservation {
    use super::*;

    /// Reserve 4 pages for a new route and release them (the admission fast path).
    #[divan::bench]
    fn reserve_release(bencher: Bencher) {
        let mut pool = resident_pool(256);
        let route = RouteId::from("incoming");
        bencher.bench_local(|| {
            let id = pool.reserve(black_box(&route), 64).unwrap();
            pool.release_reservation(id)
        });
    }

    /// Reserve 4 pages, claim them by allocating the route, release the reservation
    /// (nothing left) and the route.
    #[divan::bench]
    fn reserve_claim_release_cycle(bencher: Bencher) {
        let mut pool = resident_pool(256);
        let route = RouteId::from("incoming");
        bencher.bench_local(|| {
            let id = pool.reserve(black_box(&route), 64).unwrap();
            pool.allocate(&route, 64).unwrap();
            pool.release_reservation(id);
            pool.release_route(&route).unwrap()
        });
    }

    /// One decode step's append reservation, then its abort (keeps the route steady).
    #[divan::bench]
    fn append_reserve_abort(bencher: Bencher) {
        let mut pool = resident_pool(256);
        let route = RouteId::from("incoming");
        pool.allocate(&route, 1).unwrap();
        bencher.bench_local(|| {
            let a = pool.append_reserve(&route, 1).unwrap();
            pool.abort_append(&route, a.id).unwrap();
        });
    }
}

mod eviction {
    use super::*;

    /// Plan room for 8 pages more than are free in a full 10k-route pool.
    #[divan::bench]
    fn plan_8_pages_over_10k_routes(bencher: Bencher) {
        let pool = resident_pool(4);
        let protected = protected();
        bencher.bench_local(|| pool.plan_eviction(black_box(12), &protected));
    }

    /// Evictable pages over 10k routes (every heartbeat).
    #[divan::bench]
    fn evictable_pages_10k_routes(bencher: Bencher) {
        let pool = resident_pool(4);
        let protected = protected();
        bencher.bench_local(|| pool.evictable_pages(black_box(&protected)));
    }
}

mod admit {
    use super::*;

    struct Offer {
        assignment: AssignmentId,
        route: RouteId,
        request: GenerationRequest,
        candidate: Candidate,
    }

    fn offer(tier: Tier, cached: u32, source: Option<&str>) -> Offer {
        // 95 processed tokens + 32 new ⇒ 127 tokens ⇒ 8 pages.
        let request = GenerationRequest::new("bench-req", "model", (0..96).collect(), 32).unwrap();
        let candidate = Candidate {
            worker_id: WorkerId::from("w"),
            worker_epoch: Epoch(0),
            tier,
            cached_token_count: cached,
            cached_bytes: 0,
            queue_ms: 0.0,
            prefix_load_ms: 0.0,
            gpu_restore_ms: 0.0,
            prefill_ms_per_token: 0.1,
            first_token_ms: 1.0,
            page_size: PAGE,
            free_pages: 64,
            evictable_pages: 10_000,
            max_context: 8192,
            online: true,
            model_loaded: true,
            exact: true,
            source_continuation_id: source.map(RouteId::from),
            resident_token_count: 0,
            transfer: TransferCapabilities::default(),
            imposed_ms: 0.0,
        };
        Offer {
            assignment: AssignmentId::new("bench-req", 1),
            route: request.route_id(),
            request,
            candidate,
        }
    }

    fn admit(pool: &mut PagePool, o: &Offer, protected: &BTreeSet<RouteId>) {
        let estimate = estimate(&o.request, &o.candidate);
        let req = AdmitRequest {
            assignment: &o.assignment,
            route: &o.route,
            request: &o.request,
            candidate: &o.candidate,
            estimate: &estimate,
            protected,
        };
        black_box(pool.admit(req).unwrap());
    }

    /// Capacity::admit of an 8-page recompute offer with 64 free pages, 10k routes.
    #[divan::bench(sample_size = 1, sample_count = 500)]
    fn recompute_without_eviction(bencher: Bencher) {
        let pool = resident_pool(64);
        let (o, protected) = (offer(Tier::None, 0, None), protected());
        bencher
            .with_inputs(|| pool.clone())
            .bench_local_refs(|p| admit(p, &o, &protected));
    }

    /// Capacity::admit of an 8-page recompute offer with 4 free pages: plans over the
    /// 10k routes, evicts the cheapest and reserves.
    #[divan::bench(sample_size = 1, sample_count = 500)]
    fn recompute_with_eviction(bencher: Bencher) {
        let pool = resident_pool(4);
        let (o, protected) = (offer(Tier::None, 0, None), protected());
        bencher
            .with_inputs(|| pool.clone())
            .bench_local_refs(|p| admit(p, &o, &protected));
    }

    /// Capacity::admit of a GPU-tier offer forking a resident 16-token prefix.
    #[divan::bench(sample_size = 1, sample_count = 500)]
    fn gpu_fork_without_eviction(bencher: Bencher) {
        let pool = resident_pool(64);
        let (o, protected) = (offer(Tier::Gpu, 16, Some("route-00001")), protected());
        bencher
            .with_inputs(|| pool.clone())
            .bench_local_refs(|p| admit(p, &o, &protected));
    }

    /// Admit and abandon in a loop (no per-iteration clone): the steady-state cost.
    #[divan::bench]
    fn admit_abandon_cycle(bencher: Bencher) {
        let mut pool = resident_pool(64);
        let (o, protected) = (offer(Tier::None, 0, None), protected());
        bencher.bench_local(|| {
            admit(&mut pool, &o, &protected);
            pool.abandon(&o.assignment, &o.route);
        });
    }
}

mod observe {
    use super::*;

    /// Pool statistics of a 10k-route pool (every heartbeat).
    #[divan::bench]
    fn stats_10k_routes(bencher: Bencher) {
        let pool = resident_pool(4);
        let protected = protected();
        bencher.bench_local(|| pool.stats(black_box(&protected)));
    }
}
