//! Page pool: forks, copy-on-write, leases, scatter, page tables, transfers (spec §4.3,
//! §4.7, tests PP-1 … PP-8; page size 4, 8 pages) and the page state machine.

use crate::pool_support;

use den_protocol::pool::{
    Generation, Geometry, Page, PageCopy, PagePool, PageState, PoolError, Run, TokenSlot,
    TransferKind, scatter_runs,
};
use pool_support::*;

#[test]
fn pp_1_append_to_a_fork_copies_the_shared_partial_tail() {
    let mut pool = pool(4, 8);
    assert_eq!(pool.allocate(&r("root"), 6).unwrap(), pages(&[0, 1]));
    pool.fork(&r("root"), &r("fork"), None).unwrap();
    assert_eq!(pool.route(&r("fork")).unwrap().pages(), pages(&[0, 1]));
    assert_eq!((pool.refcount(Page(0)), pool.refcount(Page(1))), (2, 2));

    let a = pool.append_reserve(&r("fork"), 1).unwrap();
    assert_eq!(
        a.copy,
        Some(PageCopy {
            src: Page(1),
            dst: Page(2),
            rows: 2
        })
    );
    assert_eq!(
        a.slots,
        [TokenSlot {
            logical_page: 1,
            page: Page(2),
            offset: 2
        }]
    );
    assert!(a.growth.is_empty());
    // Until commit the fork reads its committed pages.
    assert_eq!(pool.route(&r("fork")).unwrap().pages(), pages(&[0, 1]));
    pool.check_invariants().unwrap();

    pool.commit_append(&r("fork"), a.id).unwrap();
    let fork = pool.route(&r("fork")).unwrap();
    assert_eq!(
        (fork.pages(), fork.token_count()),
        (pages(&[0, 2]).as_slice(), 7)
    );
    let root = pool.route(&r("root")).unwrap();
    assert_eq!(
        (root.pages(), root.token_count()),
        (pages(&[0, 1]).as_slice(), 6)
    );
    assert_eq!(
        (
            pool.refcount(Page(0)),
            pool.refcount(Page(1)),
            pool.refcount(Page(2))
        ),
        (2, 1, 1)
    );
    pool.check_invariants().unwrap();

    assert!(pool.release_route(&r("root")).unwrap());
    assert!(pool.release_route(&r("fork")).unwrap());
    assert!(!pool.release_route(&r("fork")).unwrap());
    assert_eq!(pool.free_count(), 8);
    pool.check_invariants().unwrap();
}

#[test]
fn pp_2_aborting_a_copy_on_write_append_restores_sharing() {
    let mut pool = pool(4, 8);
    pool.allocate(&r("root"), 3).unwrap();
    pool.fork(&r("root"), &r("fork"), None).unwrap();
    assert_eq!(pool.free_count(), 7);
    let before = fingerprint(&pool);

    let a = pool.append_reserve(&r("fork"), 2).unwrap();
    assert_eq!(
        a.copy,
        Some(PageCopy {
            src: Page(0),
            dst: Page(1),
            rows: 3
        })
    );
    assert_eq!(
        a.slots,
        [
            TokenSlot {
                logical_page: 0,
                page: Page(1),
                offset: 3
            },
            TokenSlot {
                logical_page: 1,
                page: Page(2),
                offset: 0
            }
        ]
    );
    assert_eq!(pool.free_count(), 5);
    // Only one append per route; release waits for it.
    assert_eq!(
        pool.append_reserve(&r("fork"), 1),
        Err(PoolError::AppendPending(r("fork")))
    );
    assert_eq!(
        pool.release_route(&r("fork")),
        Err(PoolError::AppendPending(r("fork")))
    );

    pool.abort_append(&r("fork"), a.id).unwrap();
    assert_eq!(pool.refcount(Page(0)), 2);
    assert_eq!(pool.free_count(), 7);
    assert_eq!(pool.route(&r("fork")).unwrap().pending_append(), None);
    assert_eq!(
        pool.commit_append(&r("fork"), a.id),
        Err(PoolError::NoPendingAppend(r("fork")))
    );
    // Same routes, pages and refcounts; the two pages the append used were occupied once.
    let after = fingerprint(&pool);
    assert_ne!(after, before, "generations of the returned pages grew");
    assert_eq!(
        pool.page_state(Page(1)),
        Some(PageState::Free {
            generation: Generation(1)
        })
    );
    pool.check_invariants().unwrap();
}

#[test]
fn pp_3_chunk_scatter_splits_at_logical_page_boundaries() {
    let mut pool = pool(4, 8);
    pool.allocate(&r("route"), 4).unwrap();
    pool.allocate(&r("x"), 4).unwrap();
    let a = pool.append_reserve(&r("route"), 4).unwrap();
    pool.commit_append(&r("route"), a.id).unwrap();
    pool.allocate(&r("y"), 4).unwrap();
    let a = pool.append_reserve(&r("route"), 4).unwrap();
    pool.commit_append(&r("route"), a.id).unwrap();
    assert_eq!(pool.route(&r("route")).unwrap().pages(), pages(&[0, 2, 4]));

    let run = |page, offset, tokens, chunk_offset| Run {
        page: Page(page),
        offset,
        tokens,
        chunk_offset,
    };
    assert_eq!(
        pool.scatter(&r("route"), 2, 8).unwrap(),
        [run(0, 2, 2, 0), run(2, 0, 4, 2), run(4, 0, 2, 6)]
    );
    assert_eq!(pool.scatter(&r("route"), 4, 4).unwrap(), [run(2, 0, 4, 0)]);
    assert_eq!(pool.scatter(&r("route"), 9, 1).unwrap(), [run(4, 1, 1, 0)]);
    assert!(pool.scatter(&r("route"), 0, 0).unwrap().is_empty());
    assert_eq!(
        pool.scatter(&r("route"), 10, 4),
        Err(PoolError::RangeOutside {
            start: 10,
            count: 4,
            limit: 12
        })
    );

    // A 256-token chunk over 16-token pages: sixteen full-page runs covering the chunk.
    let many: Vec<Page> = (0..20).rev().map(Page).collect();
    let runs = scatter_runs(&many, 16, 32, 256).unwrap();
    assert_eq!(runs.len(), 16);
    assert!(runs.iter().all(|r| r.offset == 0 && r.tokens == 16));
    assert_eq!(runs[0].page, Page(17));
    assert_eq!(runs.iter().map(|r| r.tokens).sum::<u32>(), 256);
}

#[test]
fn pp_4_dense_page_tables_pad_with_minus_one() {
    let mut pool = pool(4, 8);
    pool.allocate(&r("a"), 6).unwrap();
    pool.allocate(&r("b"), 4).unwrap();
    pool.allocate(&r("empty"), 0).unwrap();
    let t = pool.page_table(&[r("a"), r("b"), r("empty")]).unwrap();
    assert_eq!(t.width, 2);
    assert_eq!(t.pages, [0, 1, 2, -1, -1, -1]);
    assert_eq!(t.lengths, [6, 4, 0]);
    assert_eq!(t.start_positions, [0, 0, 0]);
    assert_eq!((t.rows(), t.row(1)), (3, [2, -1].as_slice()));
    assert_eq!(
        pool.page_table(&[r("nope")]),
        Err(PoolError::UnknownRoute(r("nope")))
    );
}

#[test]
fn pp_5_host_append_commits_only_after_the_upload_and_a_fault_changes_nothing() {
    let mut pool = pool(4, 8);
    pool.allocate(&r("route"), 2).unwrap();

    // Upload the appended rows page by page; commit waits for every page.
    let a = pool.append_reserve(&r("route"), 4).unwrap();
    let targets: std::collections::BTreeSet<Page> = a.slots.iter().map(|s| s.page).collect();
    let tickets: Vec<_> = targets
        .iter()
        .map(|p| pool.start_load(*p).unwrap())
        .collect();
    assert_eq!(
        pool.commit_append(&r("route"), a.id),
        Err(PoolError::TransferInFlight {
            route: r("route"),
            page: Page(0)
        })
    );
    pool.complete_load(tickets[0]).unwrap();
    assert_eq!(
        pool.commit_append(&r("route"), a.id),
        Err(PoolError::TransferInFlight {
            route: r("route"),
            page: Page(1)
        })
    );
    assert_eq!(pool.route(&r("route")).unwrap().token_count(), 2);
    pool.complete_load(tickets[1]).unwrap();
    pool.commit_append(&r("route"), a.id).unwrap();
    assert_eq!(pool.route(&r("route")).unwrap().token_count(), 6);

    // A device fault mid-upload: fail, abort, and the route is as before.
    let free = pool.free_count();
    let a = pool.append_reserve(&r("route"), 3).unwrap();
    assert_eq!(a.growth, pages(&[2]));
    let t1 = pool.start_load(Page(1)).unwrap();
    let t2 = pool.start_load(Page(2)).unwrap();
    pool.fail_load(t1).unwrap();
    pool.abort_append(&r("route"), a.id).unwrap();
    assert_eq!(pool.route(&r("route")).unwrap().token_count(), 6);
    assert_eq!(pool.route(&r("route")).unwrap().pages(), pages(&[0, 1]));
    assert_eq!(pool.free_count(), free);
    // The upload into the returned page completes late: stale, nothing changes.
    assert!(matches!(
        pool.complete_load(t2),
        Err(PoolError::StaleTicket { .. })
    ));
    assert_eq!(
        pool.page_state(Page(2)),
        Some(PageState::Free {
            generation: Generation(1)
        })
    );
    pool.check_invariants().unwrap();
}

#[test]
fn pp_6_a_lease_makes_the_live_tail_copy_on_write_and_pins_released_pages() {
    let mut pool = pool(4, 8);
    pool.allocate(&r("route"), 6).unwrap();
    let lease = pool.lease(&[r("route")]).unwrap();
    assert!(pool.is_leased(&r("route")));
    // The leased, shared partial tail costs one extra page for a future append.
    assert_eq!(pool.requirement(&r("route"), 8), 1);

    let a = pool.append_reserve(&r("route"), 1).unwrap();
    assert_eq!(
        a.copy,
        Some(PageCopy {
            src: Page(1),
            dst: Page(2),
            rows: 2
        })
    );
    pool.commit_append(&r("route"), a.id).unwrap();
    assert_eq!(pool.route(&r("route")).unwrap().pages(), pages(&[0, 2]));
    let snapshot = &pool.get_lease(lease).unwrap().entries[0];
    assert_eq!(
        (snapshot.pages.clone(), snapshot.token_count),
        (pages(&[0, 1]), 6)
    );
    assert_eq!(pool.refcount(Page(1)), 1);

    pool.release_route(&r("route")).unwrap();
    assert_eq!(
        pool.free_count(),
        6,
        "pages 0 and 1 stay pinned by the lease"
    );
    assert!(matches!(
        pool.page_state(Page(1)),
        Some(PageState::Resident { .. })
    ));
    assert!(pool.release_lease(lease));
    assert!(!pool.release_lease(lease));
    assert_eq!(pool.free_count(), 8);
    pool.check_invariants().unwrap();
}

#[test]
fn pp_7_prospective_leases_see_post_append_lengths_and_reject_stale_appends() {
    let mut pool = pool(4, 8);
    pool.allocate(&r("a"), 3).unwrap();
    pool.allocate(&r("b"), 4).unwrap();
    let append_a = pool.append_reserve(&r("a"), 2).unwrap();
    let append_b = pool.append_reserve(&r("b"), 1).unwrap();

    let lease = pool
        .lease_prospective(&[(r("a"), append_a.id), (r("b"), append_b.id)])
        .unwrap();
    let table = pool.get_lease(lease).unwrap().page_table();
    assert_eq!(table.lengths, [5, 5]);
    assert_eq!(table.pages, [0, 2, 1, 3]);
    assert!(pool.get_lease(lease).unwrap().prospective);
    // The live routes are still uncommitted.
    assert_eq!(pool.page_table(&[r("a"), r("b")]).unwrap().lengths, [3, 4]);

    // Abort a's append: the prospective lease keeps its growth page pinned, and a lease
    // naming the aborted append is stale, as is one naming a replaced append.
    pool.abort_append(&r("a"), append_a.id).unwrap();
    assert_eq!(pool.refcount(Page(2)), 1);
    assert_eq!(
        pool.lease_prospective(&[(r("a"), append_a.id)]),
        Err(PoolError::StaleAppend {
            route: r("a"),
            given: append_a.id,
            pending: None
        })
    );
    // The prospective lease also pins a's tail page 0, so the new append copies it.
    let again = pool.append_reserve(&r("a"), 2).unwrap();
    assert_eq!(
        again.copy,
        Some(PageCopy {
            src: Page(0),
            dst: Page(4),
            rows: 3
        })
    );
    assert_eq!(again.growth, pages(&[5]));
    let leases = pool.lease_count();
    assert!(
        pool.lease_prospective(&[(r("b"), append_b.id), (r("a"), append_a.id)])
            .is_err()
    );
    assert_eq!(
        pool.lease_count(),
        leases,
        "a stale entry rejects the whole lease"
    );
    pool.lease_prospective(&[(r("a"), again.id)]).unwrap();
    pool.check_invariants().unwrap();
}

#[test]
fn pp_8_batched_commit_and_abort_validate_every_entry_first() {
    let mut pool = pool(4, 8);
    pool.allocate(&r("a"), 4).unwrap();
    pool.allocate(&r("b"), 4).unwrap();
    let a = pool.append_reserve(&r("a"), 1).unwrap();
    let b = pool.append_reserve(&r("b"), 1).unwrap();
    let before = fingerprint(&pool);

    let stale = (r("b"), a.id);
    assert!(matches!(
        pool.abort_appends(&[(r("a"), a.id), stale.clone()]),
        Err(PoolError::StaleAppend { .. })
    ));
    assert!(matches!(
        pool.commit_appends(&[(r("a"), a.id), stale]),
        Err(PoolError::StaleAppend { .. })
    ));
    assert_eq!(
        pool.commit_appends(&[(r("a"), a.id), (r("a"), a.id)]),
        Err(PoolError::DuplicateEntry(r("a")))
    );
    assert_eq!(
        pool.commit_appends(&[(r("a"), a.id), (r("c"), b.id)]),
        Err(PoolError::UnknownRoute(r("c")))
    );
    assert_eq!(fingerprint(&pool), before);

    pool.abort_appends(&[(r("a"), a.id), (r("b"), b.id)])
        .unwrap();
    assert_eq!(pool.free_count(), 6);
    let a = pool.append_reserve(&r("a"), 1).unwrap();
    let b = pool.append_reserve(&r("b"), 5).unwrap();
    pool.commit_appends(&[(r("b"), b.id), (r("a"), a.id)])
        .unwrap();
    let counts: Vec<_> = ["a", "b"]
        .iter()
        .map(|id| pool.route(&r(id)).unwrap().token_count())
        .collect();
    assert_eq!(counts, [5, 9]);
    pool.check_invariants().unwrap();
}

#[test]
fn a_late_transfer_into_a_freed_and_reused_page_is_rejected() {
    let mut pool = pool(4, 8);
    pool.allocate(&r("old"), 4).unwrap();
    let ticket = pool.start_load(Page(0)).unwrap();
    assert_eq!(ticket.generation, Generation(0));
    assert_eq!(
        pool.page_state(Page(0)),
        Some(PageState::Loading {
            generation: Generation(0)
        })
    );
    // A loading page cannot be forked (its contents are not there yet) or loaded twice.
    assert!(matches!(
        pool.fork(&r("old"), &r("f"), None),
        Err(PoolError::PageNotIdle { .. })
    ));
    assert!(matches!(
        pool.start_load(Page(0)),
        Err(PoolError::PageNotIdle { .. })
    ));

    pool.release_route(&r("old")).unwrap();
    assert_eq!(
        pool.page_state(Page(0)),
        Some(PageState::Free {
            generation: Generation(1)
        })
    );
    assert_eq!(pool.allocate(&r("new"), 4).unwrap(), pages(&[0]));
    let before = fingerprint(&pool);
    assert_eq!(
        pool.complete_load(ticket),
        Err(PoolError::StaleTicket {
            page: Page(0),
            ticket: Generation(0),
            current: Generation(1)
        })
    );
    assert_eq!(pool.fail_load(ticket), pool.complete_load(ticket));
    assert_eq!(fingerprint(&pool), before);
    assert_eq!(
        pool.page_state(Page(0)),
        Some(PageState::Resident {
            generation: Generation(1)
        })
    );

    // A read-out of the reused page that outlives it is stale as well.
    let out = pool.start_evict(Page(0)).unwrap();
    assert_eq!(out.kind, TransferKind::Evict);
    pool.release_route(&r("new")).unwrap();
    pool.allocate(&r("newer"), 4).unwrap();
    assert!(matches!(
        pool.complete_evict(out),
        Err(PoolError::StaleTicket { .. })
    ));
    pool.check_invariants().unwrap();
}

#[test]
fn transfer_tickets_complete_once_and_only_for_their_kind() {
    let mut pool = pool(4, 8);
    pool.allocate(&r("a"), 3).unwrap();
    assert_eq!(
        pool.start_load(Page(5)),
        Err(PoolError::PageNotIdle {
            page: Page(5),
            state: "free"
        })
    );
    assert_eq!(
        pool.start_load(Page(99)),
        Err(PoolError::UnknownPage(Page(99)))
    );
    let t = pool.start_evict(Page(0)).unwrap();
    assert_eq!(
        pool.page_state(Page(0)),
        Some(PageState::Evicting {
            generation: Generation(0)
        })
    );
    assert!(matches!(
        pool.complete_load(t),
        Err(PoolError::NoTransferInFlight { .. })
    ));
    // A partial tail being read out is not written in place; once shared (leased) the
    // append writes a private copy instead.
    assert_eq!(
        pool.append_reserve(&r("a"), 1),
        Err(PoolError::PageNotIdle {
            page: Page(0),
            state: "evicting"
        })
    );
    let lease = pool.lease(&[r("a")]).unwrap();
    let append = pool.append_reserve(&r("a"), 1).unwrap();
    assert_eq!(
        append.copy,
        Some(PageCopy {
            src: Page(0),
            dst: Page(1),
            rows: 3
        })
    );
    pool.abort_append(&r("a"), append.id).unwrap();
    pool.release_lease(lease);
    pool.complete_evict(t).unwrap();
    assert_eq!(
        pool.complete_evict(t),
        Err(PoolError::NoTransferInFlight {
            page: Page(0),
            kind: TransferKind::Evict
        })
    );
    assert_eq!(
        pool.page_state(Page(0)),
        Some(PageState::Resident {
            generation: Generation(0)
        })
    );
    pool.check_invariants().unwrap();
}

#[test]
fn allocation_takes_the_lowest_pages_and_refuses_what_is_not_there() {
    let mut pool = pool(4, 4);
    pool.allocate(&r("a"), 4).unwrap();
    pool.allocate(&r("b"), 4).unwrap();
    pool.release_route(&r("a")).unwrap();
    assert_eq!(
        pool.allocate(&r("c"), 13).unwrap_err(),
        PoolError::InsufficientPages {
            needed: 4,
            available: 3
        }
    );
    assert_eq!(pool.allocate(&r("c"), 8).unwrap(), pages(&[0, 2]));
    assert_eq!(
        pool.allocate(&r("c"), 1),
        Err(PoolError::RouteExists(r("c")))
    );
    assert_eq!(
        pool.fork(&r("b"), &r("d"), Some(5)),
        Err(PoolError::ForkTooLong {
            from: r("b"),
            tokens: 5,
            has: 4
        })
    );
    assert_eq!(
        pool.append_reserve(&r("b"), 0),
        Err(PoolError::EmptyAppend(r("b")))
    );
}

#[test]
fn geometry_is_validated_at_construction() {
    let err = PagePool::new(Geometry::new(0, 4, 1)).unwrap_err();
    assert!(err.to_string().contains("page_size is 0"), "{err}");
    let err = PagePool::new(Geometry::new(4, u32::MAX, 1)).unwrap_err();
    assert!(err.to_string().contains("i32"), "{err}");
    let pool = PagePool::new(Geometry::new(16, 10, 4096)).unwrap();
    assert_eq!(
        (
            pool.free_count(),
            pool.geometry().pages_for(17),
            pool.geometry().bytes_for(3)
        ),
        (10, 2, 768)
    );
}
