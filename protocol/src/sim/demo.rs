//! The demo scenario behind `sim::demo()`: a busy GPU against a warm SSD (spec SIM-6 and
//! SIM-7), then a stale snapshot that forces a fallback.

use super::{SimConfig, Simulation, narrate};
use crate::candidate::Tier;
use crate::candidate_generation::candidates_for;
use crate::chunk::plan_chunks;
use crate::chunk_catalog::{ChunkCatalog, ChunkEntry};
use crate::ids::RequestId;
use crate::observation::{GpuPrefix, Observation};
use crate::request::GenerationRequest;
use crate::worker::Counters;

const MODEL: &str = "gemma/demo";
const MIB: u64 = 1024 * 1024;
const CHUNK: u32 = 64;

/// Run the demo and return its decision trace.
///
/// Two workers serve `gemma/demo`. `busy-gpu` holds the whole 256-token prefix in GPU
/// pages but has 45 ms of queue; `warm-ssd` is idle and has the first 192 tokens on local
/// SSD. `request-1` goes to the warm SSD (predicted 20.8 ms beats 47.0 ms: the lowest TTFT
/// wins, not the longest prefix). Then the warm worker's pool fills up behind the router's
/// back; `request-2`, a continuation of the same conversation, is declined
/// `insufficient-pages` by each of its SSD alternatives and falls back to the busy GPU.
pub fn demo() -> String {
    match run() {
        Ok(text) => text,
        Err(e) => format!("demo failed: {e}"),
    }
}

fn run() -> Result<String, String> {
    let mut sim = Simulation::new(SimConfig {
        decode_ms_per_token: 1.0,
        ..SimConfig::default()
    });
    sim.add_worker("busy-gpu", [MODEL], Counters::new(64, 0));
    sim.add_worker("warm-ssd", [MODEL], Counters::new(64, 0));

    let first = request("request-1", 256)?;
    let (catalog, observations) = sim7_routing_view(&first, MODEL, "warm-ssd", "busy-gpu");
    let candidates = candidates_for(&first, CHUNK, &observations, &catalog);
    sim.submit(first, candidates);
    sim.run_until_response(&RequestId::from("request-1"), 1_000)
        .map_err(|e| e.to_string())?;
    sim.run(10).map_err(|e| e.to_string())?;

    // Other work fills warm-ssd's pool; the router still routes on the old heartbeat.
    sim.set_capacity(&"warm-ssd".into(), Counters::new(0, 0));
    let second = request("request-2", 288)?;
    let candidates = candidates_for(&second, CHUNK, &observations, &catalog);
    sim.submit(second, candidates);
    sim.run_until_response(&RequestId::from("request-2"), 1_000)
        .map_err(|e| e.to_string())?;

    let mut text = String::from(
        "den simulator demo: busy GPU vs warm SSD, then a stale snapshot (logical ms)\n\n",
    );
    text.push_str(&narrate(&sim));
    Ok(text)
}

/// A request over tokens `0..=processed` (so `processed` tokens have KV rows).
fn request(id: &str, processed: u32) -> Result<GenerationRequest, String> {
    GenerationRequest::new(id, MODEL, (0..=processed).collect(), 8).map_err(|e| e.to_string())
}

/// What a router sees of the SIM-7 cluster for `model` (its chunk catalog and the
/// workers' observations): four catalogued 64-token chunks of 1 MiB over the first 256
/// tokens of `request`; `warm` (idle) holds SSD replicas of the first three; `busy` (45 ms
/// of queue) advertises all 256 tokens in GPU pages. Shared with the console's fixtures
/// so its decision records are the simulator's.
pub fn sim7_routing_view(
    request: &GenerationRequest,
    model: &str,
    warm: &str,
    busy: &str,
) -> (ChunkCatalog, Vec<Observation>) {
    let plan = plan_chunks(request.processed_tokens(), CHUNK);
    let mut catalog = ChunkCatalog::default();
    for d in plan.iter().take(4) {
        catalog.publish(ChunkEntry {
            model: model.into(),
            hash: d.hash,
            parent: d.parent,
            start: d.start,
            token_count: d.token_count,
            bytes: MIB,
            object: false,
        });
    }
    for d in plan.iter().take(3) {
        catalog.add_replica(warm.into(), model.into(), d.hash, Tier::Ssd);
    }
    let warm = sim7_worker(warm, model, 0.0);
    let mut busy = sim7_worker(busy, model, 45.0);
    if let Some(last) = plan.get(3) {
        busy.gpu_prefixes.push(GpuPrefix {
            model: model.into(),
            prefix_hash: last.hash,
            continuation_id: "busy-route".into(),
            token_count: 256,
            bytes: 4 * MIB,
        });
    }
    (catalog, vec![warm, busy])
}

/// A worker of the SIM-7 cluster with `queue_ms` of queued work.
pub fn sim7_worker(id: &str, model: &str, queue_ms: f64) -> Observation {
    let mut o = Observation::new(id, id);
    o.models.insert(model.into());
    o.queue_ms = queue_ms;
    o.page_size = 16;
    o.free_pages = 64;
    o.max_context = 1024;
    o.prefill_ms_per_token = 0.2;
    o.first_token_ms = 2.0;
    o.gpu_restore_bytes_per_ms = MIB as f64;
    o.tier_throughput_bytes_per_ms.insert(Tier::Ssd, MIB as f64);
    o.tier_fixed_ms.insert(Tier::Ssd, 0.0);
    o
}
