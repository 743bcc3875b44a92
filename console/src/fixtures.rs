//! Fixed console inputs for tests, the render benchmark and demos: session events built
//! from the vendored Skulk 1.3.0 captures, den feed frames whose decision records come
//! from running the protocol's simulator (so they are real records), and a synthetic
//! cluster of any size.

use std::path::{Path, PathBuf};

use den_protocol::candidate::Tier;
use den_protocol::candidate_generation::candidates_for;
use den_protocol::chunk_catalog::ChunkCatalog;
use den_protocol::decision::DecisionRecord;
use den_protocol::evidence::{PollFailure, PollFailureKind};
use den_protocol::feed::{FEED_VERSION, FeedMessage};
use den_protocol::ids::{Epoch, RequestId};
use den_protocol::observation::{Observation, PoolStats, TierUsage};
use den_protocol::request::GenerationRequest;
use den_protocol::session::{SessionEvent, SourceId, SourceKind, Stamped};
use den_protocol::sim::{SimConfig, Simulation, sim7_routing_view, sim7_worker};
use den_protocol::skulk::State;
use den_protocol::time::Millis;
use den_protocol::worker::Counters;

/// Node ids of the derived two-node Skulk capture.
pub const ALPHA: &str = "12D3KooWDerivedNodeAlphaXXXXXXXXXXXXXXXXXXXXXXXXXXXX";
pub const BRAVO: &str = "12D3KooWDerivedNodeBravoXXXXXXXXXXXXXXXXXXXXXXXXXXXX";
/// The node of the runC capture.
pub const RUN_C_NODE: &str = "12D3KooWS5hbRfsg4cwEX7pKogLSmR1udPzi5g68xyrDuoCesy1L";
/// The model of the simulated routes.
pub const SIM_MODEL: &str = "llama-3.1-8b";
/// When the fixture scenarios are drawn.
pub const SCENARIO_NOW: Millis = Millis(25_000);

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// `tests/fixtures/skulk-1.3.0` of the workspace.
pub fn skulk_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/skulk-1.3.0")
}

/// A `/state` capture, e.g. `derived/state_two_nodes_running.json`.
pub fn skulk_state(rel: &str) -> Result<State, String> {
    let path = skulk_fixture_dir().join(rel);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{rel}: {e}"))
}

fn at(ms: u64, event: SessionEvent) -> Stamped {
    Stamped::new(Millis(ms), event)
}

fn source(id: &str, kind: SourceKind, url: &str) -> SessionEvent {
    SessionEvent::SourceAdded {
        source: id.into(),
        kind,
        url: url.into(),
    }
}

/// The captured state as answered now: the host's clock reads 1.2 s after the newest
/// `lastSeen` the capture holds (Skulk's sightings lag its answers by about that much).
fn state_event(id: &str, state: &State, latency_ms: u64) -> SessionEvent {
    let newest = state
        .last_seen
        .values()
        .filter_map(|t| den_protocol::time::rfc3339_unix_ms(t))
        .max();
    SessionEvent::SkulkState {
        source: id.into(),
        state: Box::new(state.clone()),
        latency_ms,
        received_unix_ms: newest.map(|t| t + 1_200),
    }
}

/// A worker heartbeat with the given pool occupancy.
pub fn observation(
    worker: &str,
    node: &str,
    total: u32,
    used_pct: u32,
    sequence: u64,
) -> Observation {
    let mut o = Observation::new(worker, node);
    o.sequence = sequence;
    o.models.insert(SIM_MODEL.into());
    o.page_size = 16;
    o.prefill_ms_per_token = 0.2;
    o.first_token_ms = 2.0;
    let used = total * used_pct.min(100) / 100;
    let reserved = used / 8;
    let resident = used - reserved;
    o.pool = PoolStats {
        total_pages: total,
        free: total - used,
        reserved,
        resident,
        evictable: resident / 2,
        durable: resident * 3 / 4,
        page_bytes: 2 * MIB,
    };
    o.free_pages = o.pool.free;
    o.evictable_pages = o.pool.evictable;
    o.tiers.insert(
        Tier::Ram,
        TierUsage {
            bytes: 12 * GIB + u64::from(used_pct) * GIB / 10,
            chunks: 4_000,
            capacity_bytes: 64 * GIB,
        },
    );
    o.tiers.insert(
        Tier::Ssd,
        TierUsage {
            bytes: 80 * GIB,
            chunks: 30_000,
            capacity_bytes: 1024 * GIB,
        },
    );
    o.evictions.insert("capacity".into(), 120 + sequence);
    o.evictions.insert("idle".into(), 14);
    o.backend = "cuda: NVIDIA H200".into();
    o.queue_depth = used_pct / 10;
    o
}

/// Decision records of a small scenario run through the protocol's simulator:
/// `request-1` prefers a warm SSD over a busy GPU and completes; `request-2` is declined
/// `insufficient-pages` and falls back; `request-3` has no feasible worker and fails;
/// `request-4` is cancelled by its client; `request-5` is still streaming.
pub fn sim_records() -> Result<Vec<DecisionRecord>, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut sim = Simulation::new(SimConfig {
        decode_ms_per_token: 1.0,
        ..SimConfig::default()
    });
    sim.add_worker("gpu-b", [SIM_MODEL], Counters::new(64, 0));
    sim.add_worker("gpu-a", [SIM_MODEL], Counters::new(64, 0));
    let first = request("request-1", 256, 8)?;
    let (catalog, observations) = routing_view(&first);
    sim.submit(
        first.clone(),
        candidates_for(&first, 64, &observations, &catalog),
    );
    sim.run_until_response(&RequestId::from("request-1"), 1_000)
        .map_err(|e| err(&e))?;
    sim.run(10).map_err(|e| err(&e))?;
    sim.set_capacity(&"gpu-a".into(), Counters::new(0, 0));
    let second = request("request-2", 288, 8)?;
    sim.submit(
        second.clone(),
        candidates_for(&second, 64, &observations, &catalog),
    );
    sim.run_until_response(&RequestId::from("request-2"), 1_000)
        .map_err(|e| err(&e))?;
    sim.submit(request("request-3", 64, 8)?, Vec::new());
    sim.set_capacity(&"gpu-a".into(), Counters::new(64, 0));
    let fourth = request("request-4", 128, 8)?;
    sim.submit(
        fourth.clone(),
        candidates_for(&fourth, 64, &observations, &catalog),
    );
    sim.cancel(&RequestId::from("request-4"));
    sim.run(5).map_err(|e| err(&e))?;
    let fifth = request("request-5", 200, 500)?;
    sim.submit(
        fifth.clone(),
        candidates_for(&fifth, 64, &observations, &catalog),
    );
    sim.run(20).map_err(|e| err(&e))?;
    Ok(sim.router().records().cloned().collect())
}

fn request(id: &str, processed: u32, max_new: u32) -> Result<GenerationRequest, String> {
    GenerationRequest::new(id, SIM_MODEL, (0..=processed).collect(), max_new)
        .map_err(|e| e.to_string())
}

/// The simulator's SIM-7 cluster (gpu-a holds SSD replicas of the first three chunks,
/// gpu-b, with 45 ms of queue, advertises all 256 tokens in GPU pages) plus a third
/// worker that cannot take the request, so the record shows an infeasible candidate.
fn routing_view(request: &GenerationRequest) -> (ChunkCatalog, Vec<Observation>) {
    let (catalog, mut observations) = sim7_routing_view(request, SIM_MODEL, "gpu-a", "gpu-b");
    let mut full = sim7_worker("gpu-c", SIM_MODEL, 0.0);
    full.free_pages = 0;
    observations.push(full);
    (catalog, observations)
}

/// The main fixture scenario, drawn at [`SCENARIO_NOW`]:
/// - `router` (a den router): feed with workers gpu-a (ALPHA), gpu-b (BRAVO), gpu-c on
///   node `charlie` (draining, last heartbeat at 5 s: stale) and gpu-d (gone), the
///   simulated decision records, and its `/state` (the derived two-node capture);
/// - `mgmt` and `bravo` (Skulk): the management API bound to ALPHA and the compute
///   node's API bound to BRAVO, both serving the derived two-node capture, polled every
///   2 s — two-sided membership of ALPHA and BRAVO;
/// - `lab` (Skulk): a second management API of the same cluster that answers for 10 s
///   and then refuses connections, so it shows disconnected and its evidence expired.
pub fn scenario() -> Result<Vec<Stamped>, String> {
    let two_nodes = skulk_state("derived/state_two_nodes_running.json")?;
    let records = sim_records()?;
    let mut ev = vec![
        at(
            0,
            source("router", SourceKind::DenRouter, "http://10.0.0.1:7000"),
        ),
        at(
            0,
            source("mgmt", SourceKind::Skulk, "http://10.0.0.2:52415"),
        ),
        at(
            0,
            source("bravo", SourceKind::Skulk, "http://10.0.0.3:52415"),
        ),
        at(0, source("lab", SourceKind::Skulk, "http://10.0.9.9:52415")),
        at(
            40,
            SessionEvent::Connected {
                source: "router".into(),
            },
        ),
        at(
            50,
            SessionEvent::Feed {
                source: "router".into(),
                message: FeedMessage::Hello {
                    feed_version: FEED_VERSION,
                    router: "den-router-1".into(),
                    started_at_unix_ms: 1_750_000_000_000,
                },
            },
        ),
    ];
    let mut gone = observation("gpu-d", "delta", 1024, 10, 0);
    gone.backend = "host".into();
    let mut charlie = observation("gpu-c", "charlie", 2048, 35, 0);
    charlie.draining = true;
    charlie.backend = "host".into();
    ev.push(at(
        60,
        SessionEvent::Feed {
            source: "router".into(),
            message: FeedMessage::Snapshot {
                at: Millis(9_000),
                workers: vec![
                    observation("gpu-a", ALPHA, 4096, 40, 0),
                    observation("gpu-b", BRAVO, 4096, 70, 0),
                    charlie.clone(),
                    gone,
                ],
                routes: records,
            },
        },
    ));
    let mut t = 100;
    let mut seq = 1;
    while t < 25_000 {
        // Heartbeats every second; gpu-c stops after 5 s.
        let wave = |phase: u64| 30 + ((seq * 7 + phase) % 50) as u32;
        for (worker, node, phase) in [("gpu-a", ALPHA, 0), ("gpu-b", BRAVO, 23)] {
            ev.push(at(
                t,
                worker_event(observation(worker, node, 4096, wave(phase), seq)),
            ));
        }
        if t < 5_000 {
            let mut c = charlie.clone();
            c.sequence = seq;
            ev.push(at(t, worker_event(c)));
        }
        if seq % 2 == 0 {
            for (src, node) in [("mgmt", ALPHA), ("bravo", BRAVO), ("router", ALPHA)] {
                ev.push(at(
                    t + 5,
                    SessionEvent::SkulkNodeId {
                        source: src.into(),
                        node: node.into(),
                    },
                ));
                ev.push(at(t + 10, state_event(src, &two_nodes, 12 + seq % 5)));
            }
            if t < 10_000 {
                ev.push(at(
                    t + 15,
                    SessionEvent::SkulkNodeId {
                        source: "lab".into(),
                        node: ALPHA.into(),
                    },
                ));
                ev.push(at(t + 20, state_event("lab", &two_nodes, 40)));
            } else {
                ev.push(at(
                    t + 20,
                    SessionEvent::PollFailed {
                        source: "lab".into(),
                        endpoint: "/state".into(),
                        failure: PollFailure {
                            kind: PollFailureKind::Transport,
                            detail: "http://10.0.9.9:52415: could not connect (connection refused)"
                                .into(),
                        },
                        latency_ms: 3,
                    },
                ));
            }
        }
        if t == 20_100 {
            ev.push(at(
                t,
                SessionEvent::Feed {
                    source: "router".into(),
                    message: FeedMessage::WorkerGone {
                        at: Millis(29_000),
                        worker: "gpu-d".into(),
                        reason: "heartbeat expired".into(),
                    },
                },
            ));
        }
        t += 1_000;
        seq += 1;
    }
    Ok(ev)
}

fn worker_event(observation: Observation) -> SessionEvent {
    SessionEvent::Feed {
        source: "router".into(),
        message: FeedMessage::Worker {
            at: Millis(9_000 + observation.sequence * 1_000),
            observation: Box::new(observation),
        },
    }
}

/// The runC captures alone: the management API of one node polled every 2 s while a
/// placement downloads and its runner fails.
pub fn run_c_scenario() -> Result<Vec<Stamped>, String> {
    let mut ev = vec![at(
        0,
        source("skulk", SourceKind::Skulk, "http://127.0.0.1:52415"),
    )];
    for i in 1..=12u64 {
        let state = skulk_state(&format!("runC/state_t{i}.json"))?;
        ev.push(at(
            i * 2_000,
            SessionEvent::SkulkNodeId {
                source: "skulk".into(),
                node: RUN_C_NODE.into(),
            },
        ));
        ev.push(at(i * 2_000 + 5, state_event("skulk", &state, 9)));
    }
    Ok(ev)
}

/// A synthetic cluster: `workers` den workers (one node each) and `routes` decision
/// records, from one router, as of [`SCENARIO_NOW`]. For the render benchmark.
pub fn synthetic(workers: usize, routes: usize) -> Result<Vec<Stamped>, String> {
    let base = sim_records()?;
    let router: SourceId = "router".into();
    let observations: Vec<Observation> = (0..workers)
        .map(|i| {
            let mut o = observation(
                &format!("gpu-{i:04}"),
                &format!("node-{i:04}"),
                4096,
                (i * 37 % 100) as u32,
                1,
            );
            o.epoch = Epoch(1);
            o
        })
        .collect();
    let mut records = Vec::with_capacity(routes);
    for i in 0..routes {
        let Some(template) = base.get(i % base.len().max(1)) else {
            break;
        };
        let mut r = template.clone();
        r.request = RequestId::new(format!("req-{i:06}"));
        r.submitted_at = Millis(i as u64);
        let worker = format!("gpu-{:04}", i % workers.max(1));
        for a in &mut r.attempts {
            a.worker = worker.as_str().into();
        }
        records.push(r);
    }
    let mut ev = vec![
        at(
            0,
            source("router", SourceKind::DenRouter, "http://10.0.0.1:7000"),
        ),
        at(
            10,
            SessionEvent::Connected {
                source: router.clone(),
            },
        ),
        at(
            20,
            SessionEvent::Feed {
                source: router.clone(),
                message: FeedMessage::Hello {
                    feed_version: FEED_VERSION,
                    router: "den-router-1".into(),
                    started_at_unix_ms: 0,
                },
            },
        ),
        at(
            30,
            SessionEvent::Feed {
                source: router.clone(),
                message: FeedMessage::Snapshot {
                    at: Millis(30),
                    workers: observations.clone(),
                    routes: records,
                },
            },
        ),
    ];
    for n in 0..workers {
        for k in 2..12u64 {
            let mut o = observation(
                &format!("gpu-{n:04}"),
                &format!("node-{n:04}"),
                4096,
                ((n as u64 + k * 13) % 100) as u32,
                k,
            );
            o.epoch = Epoch(1);
            ev.push(at(
                20_000 + k * 400,
                SessionEvent::Feed {
                    source: router.clone(),
                    message: FeedMessage::Worker {
                        at: Millis(20_000 + k * 400),
                        observation: Box::new(o),
                    },
                },
            ));
        }
    }
    Ok(ev)
}
