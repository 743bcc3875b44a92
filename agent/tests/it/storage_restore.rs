//! The whole storage path a worker runs, on the host backend: prefill rows into a route's
//! pages, capture the route's chunks, store them in every tier, restore them into other
//! (scattered) pages and check the restored rows byte-exact against recomputation. A
//! damaged chunk must end in recompute, never in wrong KV.

use std::sync::Arc;

use den_agent::engine::SyntheticKv;
use den_agent::memory::{ArenaGeometry, HostMemory, PageMemory};
use den_agent::tiers::{
    Chunk, ChunkMeta, ChunkStore, ObjectConfig, ObjectTier, RamTier, S3Settings, SsdTier, TierError,
};
use den_protocol::chunk::plan_chunks;
use den_protocol::ids::ModelFingerprint;

const PAGE: u32 = 16;
const ROW: u64 = 512;

#[tokio::test]
async fn capture_store_restore_verifies_in_every_tier() {
    let dir = tempfile::tempdir().unwrap();
    let tiers: Vec<Arc<dyn ChunkStore>> = vec![
        Arc::new(RamTier::new(64 << 20)),
        Arc::new(SsdTier::open(dir.path().join("ssd"), 64 << 20).unwrap()),
        Arc::new(
            ObjectTier::open(&ObjectConfig {
                url: format!("file://{}/objects", dir.path().display())
                    .parse()
                    .unwrap(),
                s3: S3Settings::default(),
            })
            .unwrap(),
        ),
        Arc::new(
            ObjectTier::open(&ObjectConfig {
                url: "memory://restore".parse().unwrap(),
                s3: S3Settings::default(),
            })
            .unwrap(),
        ),
    ];
    let model = ModelFingerprint::from("restore-model");
    let kv = SyntheticKv::new(&model);
    let g = ArenaGeometry::new(PAGE, 128, ROW).unwrap();
    let mut memory = HostMemory::open(g).unwrap();

    // "Prefill" a 600-token prompt (3 chunks of 256, the last one short) into pages 0..38.
    let prompt: Vec<u32> = (0..600).map(|i| (i * 31 + 7) % 5000).collect();
    let route: Vec<u32> = (0..38).collect();
    memory
        .write_runs(
            &g.runs_for(&route, 0, 600).unwrap(),
            &kv.rows(0, &prompt, ROW as usize),
        )
        .unwrap();

    // Capture each chunk (device → host) and store it in every tier.
    let plan = plan_chunks(&prompt, 256);
    assert_eq!(plan.len(), 3);
    let mut chunks = Vec::new();
    for d in &plan {
        let mut buf = vec![0u8; (d.token_count as u64 * ROW) as usize];
        memory
            .read_runs(
                &g.runs_for(&route, d.start, d.token_count).unwrap(),
                &mut buf,
            )
            .unwrap();
        let chunk = Chunk::new(ChunkMeta::for_descriptor(&model, d, ROW), buf).unwrap();
        for t in &tiers {
            let r = t.put(&chunk).await.unwrap();
            assert_eq!(r.content_hash, chunk.content_hash());
        }
        chunks.push(chunk);
    }

    // Restore from each tier into a scattered route (every third page from 40) and verify.
    let restored_route: Vec<u32> = (0..38).map(|i| 40 + (i * 3) % 88).collect();
    for t in &tiers {
        for d in &plan {
            let chunk = t.get(chunks[d.index as usize].key()).await.unwrap();
            assert!(
                chunk.meta.matches(d),
                "{} returned a chunk for another place",
                t.describe()
            );
            let runs = g.runs_for(&restored_route, d.start, d.token_count).unwrap();
            memory.write_runs(&runs, &chunk.payload).unwrap();
        }
        let mut back = vec![0u8; (600 * ROW) as usize];
        memory
            .read_runs(&g.runs_for(&restored_route, 0, 600).unwrap(), &mut back)
            .unwrap();
        kv.verify_rows(0, &prompt, &back)
            .unwrap_or_else(|e| panic!("restore from {} is wrong: {e}", t.describe()));
    }

    // A chunk stored for another model is never found under this model's key.
    let other = ModelFingerprint::from("other-model");
    let foreign_key = ChunkMeta::for_descriptor(&other, &plan[0], ROW).key();
    for t in &tiers {
        let e = t.get(foreign_key).await.unwrap_err();
        assert!(matches!(e, TierError::Missing { .. }), "{e}");
        assert!(e.means_recompute());
    }
}
