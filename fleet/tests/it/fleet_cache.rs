//! Tiered block cache: eviction cascade, pins, LRU order and byte accounting, alone and
//! through the simulator.

use den_fleet::cache::{BlockCache, Level};
use den_fleet::{CostModel, FleetConfig, PolicyKind, Trace, TraceRequest, Workload, run_policy};

const BLOCK: u64 = 1000;

fn bytes(_: u32) -> u64 {
    BLOCK
}

#[test]
fn evictions_cascade_gpu_to_ram_to_ssd_to_nowhere_and_every_byte_is_counted() {
    let mut c = BlockCache::new(10, 2, 2, 2);
    for b in 0..2 {
        c.insert_gpu_pinned(b);
        c.unpin(Level::Gpu, b);
    }
    assert_eq!((c.gpu_len(), c.gpu_evictable()), (2, 2));
    // Block 0 is the coldest: it goes first, to RAM.
    assert_eq!(c.evict_gpu(1, &bytes), 1);
    assert_eq!(c.best(0), Some(Level::Ram));
    assert_eq!(c.best(1), Some(Level::Gpu));
    assert_eq!(c.traffic.gpu_to_ram_bytes, BLOCK);
    // Fill RAM past capacity: the coldest RAM block is demoted to SSD.
    assert!(c.insert_ram(5, &bytes));
    assert!(c.insert_ram(6, &bytes));
    assert_eq!(c.best(0), Some(Level::Ssd));
    assert_eq!((c.ram_len(), c.ssd_len()), (2, 1));
    assert_eq!(c.traffic.ram_to_ssd_bytes, BLOCK);
    // SSD overflow drops its coldest block entirely.
    assert!(c.insert_ram(7, &bytes));
    assert!(c.insert_ram(8, &bytes));
    assert_eq!(c.ssd_len(), 2);
    assert_eq!(c.best(0), None, "dropped from the last tier");
    assert_eq!(
        (
            c.traffic.gpu_evictions,
            c.traffic.ram_evictions,
            c.traffic.ssd_evictions
        ),
        (1, 3, 1)
    );
    assert_eq!(c.traffic.ram_to_ssd_bytes, 3 * BLOCK);
}

#[test]
fn pinned_blocks_are_never_evicted_and_inclusive_copies_cost_nothing_twice() {
    let mut c = BlockCache::new(10, 2, 4, 4);
    c.insert_gpu_pinned(1);
    c.insert_gpu_pinned(2);
    c.unpin(Level::Gpu, 2);
    assert_eq!(c.evict_gpu(2, &bytes), 1, "only the unpinned block can go");
    assert!(c.has(Level::Gpu, 1));
    // Block 2 now also lives in RAM; bring it back and evict again: no second copy.
    c.insert_gpu_pinned(2);
    c.unpin(Level::Gpu, 2);
    let before = c.traffic.gpu_to_ram_bytes;
    assert_eq!(c.evict_gpu(1, &bytes), 1);
    assert_eq!(c.traffic.gpu_to_ram_bytes, before, "RAM already had it");
    // A RAM pin protects against RAM eviction; with RAM full of pinned blocks an insert
    // is refused rather than evicting one.
    let mut c = BlockCache::new(10, 1, 1, 1);
    assert!(c.insert_ram(3, &bytes));
    c.pin(Level::Ram, 3);
    assert!(!c.insert_ram(4, &bytes));
    assert!(c.has(Level::Ram, 3));
    c.unpin(Level::Ram, 3);
    assert!(c.insert_ram(4, &bytes));
    assert_eq!(c.best(3), Some(Level::Ssd));
}

#[test]
fn touch_orders_eviction_and_gpu_prefix_stops_at_the_first_gap() {
    let mut c = BlockCache::new(10, 3, 3, 3);
    for b in [0, 1, 2] {
        c.insert_gpu_pinned(b);
        c.unpin(Level::Gpu, b);
    }
    c.touch(Level::Gpu, 0);
    c.evict_gpu(1, &bytes);
    assert!(
        c.has(Level::Gpu, 0) && !c.has(Level::Gpu, 1),
        "1 was the coldest after touching 0"
    );
    assert_eq!(c.gpu_prefix(&[0, 2, 5]), 2);
    assert_eq!(c.gpu_prefix(&[0, 1, 2]), 1);
}

fn conversation() -> Trace {
    // Two turns of one conversation and unrelated fillers that push the first turn out of
    // a tiny GPU pool, so the second turn finds its prefix in RAM.
    let mut requests = vec![TraceRequest {
        timestamp: 0,
        input_length: 4 * 512,
        output_length: 2,
        hash_ids: vec![1, 2, 3, 4],
    }];
    for i in 0..6u64 {
        requests.push(TraceRequest {
            timestamp: 1000 + i * 1000,
            input_length: 4 * 512,
            output_length: 2,
            hash_ids: (0..4).map(|k| 100 + 10 * i + k).collect(),
        });
    }
    requests.push(TraceRequest {
        timestamp: 10_000,
        input_length: 5 * 512,
        output_length: 2,
        hash_ids: vec![1, 2, 3, 4, 5],
    });
    Trace {
        lines: (1..=requests.len()).collect(),
        requests,
    }
}

#[test]
fn a_returning_turn_is_promoted_from_ram_and_the_bytes_add_up() {
    let workload = Workload::from_trace(&conversation());
    let mut config = FleetConfig::new(1);
    config.cost = CostModel {
        gpu_kv_blocks: 8,
        ram_blocks: 64,
        ssd_blocks: 64,
        ..CostModel::default()
    };
    for kind in [PolicyKind::Den, PolicyKind::RoundRobin] {
        let run = run_policy(&workload, &config, kind);
        let r = &run.report;
        let last = run.reused_tokens.len() - 1;
        assert_eq!(
            run.reused_tokens[last],
            4 * 512,
            "{kind}: the whole first turn is reused"
        );
        assert_eq!(r.reused_tokens.ram, 4 * 512, "{kind}: from RAM");
        let kv = config.cost.kv_bytes_per_token;
        assert_eq!(
            r.tiers.ram_to_gpu_bytes,
            4 * 512 * kv,
            "{kind}: restored over PCIe"
        );
        assert!(r.tiers.gpu_evictions > 0 && r.tiers.gpu_to_ram_bytes >= 4 * 512 * kv);
        assert_eq!(
            r.tokens_recomputed + r.reused_tokens.total(),
            r.prompt_tokens
        );
    }
}
