//! Deterministic sessions for the sample recordings, the tests and the benchmarks, made
//! of real protocol values: decision records come from the protocol's simulator (so
//! they are what a router records), Skulk states from the vendored 1.3.0 captures.
//!
//! - [`incident`]: a worker killed mid-stream while a placement is in progress;
//! - [`demo`]: a steady session like `den demo` (three workers, a request every 500 ms);
//! - [`Bulk`]: an endless realistic stream for size and seek benchmarks.

use std::collections::{BTreeMap, BTreeSet};

use den_protocol::candidate::Tier;
use den_protocol::candidate_generation::candidates_for;
use den_protocol::chunk::plan_chunks;
use den_protocol::chunk_catalog::{ChunkCatalog, ChunkEntry};
use den_protocol::decision::DecisionRecord;
use den_protocol::feed::{FEED_VERSION, FeedMessage};
use den_protocol::ids::{RequestId, WorkerId};
use den_protocol::observation::{GpuPrefix, Observation};
use den_protocol::request::GenerationRequest;
use den_protocol::session::{
    CommandSeq, CommandStatus, SessionEvent, SourceId, SourceKind, Stamped,
};
use den_protocol::sim::{SimConfig, Simulation};
use den_protocol::skulk::State;
use den_protocol::time::Millis;
use den_protocol::worker::Counters;

use crate::fixtures::{self, RUN_C_NODE, SIM_MODEL};

mod bulk;
pub use bulk::Bulk;

const MIB: u64 = 1024 * 1024;
/// Simulator steps between looks at the decision records.
const STEP: u64 = 5;

/// Node of each synthetic worker.
const NODES: [(&str, &str); 3] = [
    ("gpu-a", "node-alpha"),
    ("gpu-b", "node-bravo"),
    ("gpu-c", "node-charlie"),
];

/// The simulator's router seen through a console feed: every change of a decision
/// record becomes a `route` frame at the console time it happened.
pub struct SimFeed {
    pub sim: Simulation,
    source: SourceId,
    /// Console time of simulator time 0.
    offset: u64,
    open: BTreeSet<RequestId>,
    emitted: BTreeMap<RequestId, DecisionRecord>,
    catalog: ChunkCatalog,
    observations: Vec<Observation>,
}

impl SimFeed {
    pub fn new(source: &str, offset: u64, workers: &[&str]) -> SimFeed {
        let mut sim = Simulation::new(SimConfig {
            decode_ms_per_token: 20.0,
            retention_ms: 60_000,
            trace: false,
            ..SimConfig::default()
        });
        for w in workers {
            sim.add_worker(*w, [SIM_MODEL], Counters::new(4096, 0));
        }
        let (catalog, observations) = routing_view(workers);
        SimFeed {
            sim,
            source: source.into(),
            offset,
            open: BTreeSet::new(),
            emitted: BTreeMap::new(),
            catalog,
            observations,
        }
    }

    fn now(&self) -> u64 {
        self.offset + self.sim.now().0
    }

    /// Submit a request now (at the simulator's current time).
    pub fn submit(&mut self, request: GenerationRequest, out: &mut Vec<Stamped>) {
        let candidates = candidates_for(&request, 64, &self.observations, &self.catalog);
        self.open.insert(request.id.clone());
        self.sim.submit(request, candidates);
        self.emit(out);
    }

    /// Run the simulator until console time `t`.
    pub fn run_to(&mut self, t: u64, out: &mut Vec<Stamped>) -> Result<(), String> {
        while self.now() + STEP <= t {
            self.sim.run(STEP).map_err(|e| e.to_string())?;
            self.emit(out);
        }
        let rest = t.saturating_sub(self.now());
        if rest > 0 {
            self.sim.run(rest).map_err(|e| e.to_string())?;
            self.emit(out);
        }
        Ok(())
    }

    /// Kill a worker now: the router learns of it as of a lost connection, and later
    /// requests no longer list it as a candidate.
    pub fn crash(&mut self, worker: &str, out: &mut Vec<Stamped>) {
        self.sim.crash(&worker.into());
        self.observations.retain(|o| o.worker_id.as_str() != worker);
        self.emit(out);
    }

    /// Requests running or offered on `worker`.
    pub fn active_on(&self, worker: &WorkerId) -> usize {
        self.open
            .iter()
            .filter_map(|id| self.sim.router().record(id))
            .filter(|r| r.last_attempt().is_some_and(|a| &a.worker == worker))
            .count()
    }

    fn emit(&mut self, out: &mut Vec<Stamped>) {
        let at = self.now();
        let router_at = self.sim.now();
        let mut closed = Vec::new();
        for id in &self.open {
            let Some(record) = self.sim.router().record(id) else {
                continue;
            };
            // A router sends a record when it changes (submitted, offered, accepted, first
            // token, attempt ended, finished), not at every streamed token.
            if self
                .emitted
                .get(id)
                .is_none_or(|e| !same_but_tokens(e, record))
            {
                out.push(Stamped::new(
                    Millis(at),
                    SessionEvent::Feed {
                        source: self.source.clone(),
                        message: FeedMessage::Route {
                            at: router_at,
                            record: Box::new(record.clone()),
                        },
                    },
                ));
                self.emitted.insert(id.clone(), record.clone());
            }
            if record.is_terminal() {
                closed.push(id.clone());
            }
        }
        for id in closed {
            self.open.remove(&id);
        }
        // Records the router garbage-collected.
        let gone: Vec<RequestId> = self
            .emitted
            .keys()
            .filter(|id| !self.open.contains(*id) && self.sim.router().record(id).is_none())
            .cloned()
            .collect();
        for id in gone {
            self.emitted.remove(&id);
            out.push(Stamped::new(
                Millis(at),
                SessionEvent::Feed {
                    source: self.source.clone(),
                    message: FeedMessage::RouteGone {
                        at: router_at,
                        request: id,
                    },
                },
            ));
        }
    }
}

/// Equal but for the count of streamed tokens.
fn same_but_tokens(a: &DecisionRecord, b: &DecisionRecord) -> bool {
    DecisionRecord {
        waited_ms: 0,
        delivered_tokens: b.delivered_tokens,
        ..a.clone()
    } == *b
}

/// A 256-token shared prefix in four catalogued chunks: `gpu-a` holds it in GPU pages,
/// `gpu-b` has SSD replicas of the first three chunks, `gpu-c` nothing.
fn routing_view(workers: &[&str]) -> (ChunkCatalog, Vec<Observation>) {
    let tokens: Vec<u32> = (0..=256).collect();
    let plan = plan_chunks(&tokens, 64);
    let mut catalog = ChunkCatalog::default();
    for d in plan.iter().take(4) {
        catalog.publish(ChunkEntry {
            model: SIM_MODEL.into(),
            hash: d.hash,
            parent: d.parent,
            start: d.start,
            token_count: d.token_count,
            bytes: MIB,
            object: false,
        });
    }
    for d in plan.iter().take(3) {
        catalog.add_replica("gpu-b".into(), SIM_MODEL.into(), d.hash, Tier::Ssd);
    }
    let observations = workers
        .iter()
        .map(|w| {
            let mut o = Observation::new(*w, node_of(w));
            o.models.insert(SIM_MODEL.into());
            o.free_pages = 4096;
            o.max_context = 8192;
            o.prefill_ms_per_token = 0.2;
            o.first_token_ms = 2.0;
            o.gpu_restore_bytes_per_ms = MIB as f64;
            o.tier_throughput_bytes_per_ms.insert(Tier::Ssd, MIB as f64);
            o.tier_fixed_ms.insert(Tier::Ssd, 0.0);
            if *w == "gpu-a"
                && let Some(last) = plan.get(3)
            {
                o.gpu_prefixes.push(GpuPrefix {
                    model: SIM_MODEL.into(),
                    prefix_hash: last.hash,
                    continuation_id: "conversation-1".into(),
                    token_count: 256,
                    bytes: 4 * MIB,
                });
            }
            if *w == "gpu-c" {
                o.queue_ms = 30.0;
            }
            o
        })
        .collect();
    (catalog, observations)
}

fn node_of(worker: &str) -> &'static str {
    NODES
        .iter()
        .find(|(w, _)| *w == worker)
        .map_or("node-unknown", |(_, n)| *n)
}

/// A request over the shared prefix plus `extra` own tokens.
fn request(id: &str, extra: u32, max_new: u32) -> Result<GenerationRequest, String> {
    let mut tokens: Vec<u32> = (0..=256).collect();
    tokens.extend((0..extra).map(|i| 10_000 + i));
    GenerationRequest::new(id, SIM_MODEL, tokens, max_new).map_err(|e| e.to_string())
}

fn at(ms: u64, event: SessionEvent) -> Stamped {
    Stamped::new(Millis(ms), event)
}

fn heartbeat(source: &str, worker: &str, used_pct: u32, seq: u64, router_at: u64) -> Stamped {
    let mut o = fixtures::observation(worker, node_of(worker), 4096, used_pct, seq);
    o.epoch = den_protocol::ids::Epoch(1);
    Stamped::new(
        Millis(router_at),
        SessionEvent::Feed {
            source: source.into(),
            message: FeedMessage::Worker {
                at: Millis(router_at),
                observation: Box::new(o),
            },
        },
    )
}

fn opening(out: &mut Vec<Stamped>, workers: &[&str]) {
    out.push(at(
        0,
        SessionEvent::SourceAdded {
            source: "router".into(),
            kind: SourceKind::DenRouter,
            url: "http://10.0.0.1:7000".into(),
        },
    ));
    out.push(at(
        40,
        SessionEvent::Connected {
            source: "router".into(),
        },
    ));
    out.push(at(
        50,
        SessionEvent::Feed {
            source: "router".into(),
            message: FeedMessage::Hello {
                feed_version: FEED_VERSION,
                router: "den-router-1".into(),
                started_at_unix_ms: 1_750_000_000_000,
            },
        },
    ));
    let observations = workers
        .iter()
        .map(|w| fixtures::observation(w, node_of(w), 4096, 20, 1))
        .collect();
    out.push(at(
        60,
        SessionEvent::Feed {
            source: "router".into(),
            message: FeedMessage::Snapshot {
                at: Millis(60),
                workers: observations,
                routes: Vec::new(),
            },
        },
    ));
}

/// The incident: three workers serve `llama-3.1-8b` while the operator places
/// Llama-3.2-1B on the management node (its download runs and its runner fails: the
/// vendored runC captures). At 12 s `gpu-a` is killed (`kill -9`) while streaming
/// `request-7`, which fails (tokens were already streamed), and while `request-8` waits
/// for its first token there, which falls back to `gpu-b`. `gpu-b`'s pool then fills.
pub fn incident() -> Result<Vec<Stamped>, String> {
    let workers = ["gpu-a", "gpu-b", "gpu-c"];
    let mut out = Vec::new();
    opening(&mut out, &workers);
    out.push(at(
        0,
        SessionEvent::SourceAdded {
            source: "mgmt".into(),
            kind: SourceKind::Skulk,
            url: "http://10.0.0.2:52415".into(),
        },
    ));
    let model = "mlx-community/Llama-3.2-1B-Instruct-4bit";
    let place = CommandSeq(1);
    let mut feed = SimFeed::new("router", 4_000, &workers);
    let crash_at = 12_000;
    let mut killed = false;
    let mut seq = 1;
    let mut requests: Vec<(u64, &str, u32, u32)> = vec![
        (4_200, "request-1", 40, 60),
        (5_000, "request-2", 80, 40),
        (5_800, "request-3", 20, 80),
        (6_600, "request-4", 120, 30),
        (7_400, "request-5", 60, 50),
        (8_200, "request-6", 30, 40),
        (9_000, "request-7", 10, 400),
        (crash_at - 1, "request-8", 12, 60),
        (13_500, "request-9", 40, 60),
        (15_000, "request-10", 70, 50),
        (17_000, "request-11", 50, 120),
        (19_000, "request-12", 20, 80),
    ];
    requests.reverse();
    let end = 26_000;
    let mut t = 100;
    while t <= end {
        // Simulated traffic up to t, each request submitted at its time.
        while let Some(&(when, id, extra, max_new)) = requests.last() {
            if when > t {
                break;
            }
            feed.run_to(when.max(4_000), &mut out)?;
            feed.submit(request(id, extra, max_new)?, &mut out);
            requests.pop();
        }
        feed.run_to(t.max(4_000), &mut out)?;
        if !killed && t >= crash_at {
            feed.run_to(crash_at, &mut out)?;
            feed.crash("gpu-a", &mut out);
            out.push(at(
                crash_at,
                SessionEvent::Feed {
                    source: "router".into(),
                    message: FeedMessage::WorkerGone {
                        at: Millis(crash_at),
                        worker: "gpu-a".into(),
                        reason: "disconnected: connection reset by peer".into(),
                    },
                },
            ));
            killed = true;
        }
        // Heartbeats every second.
        if t % 1_000 == 100 {
            for w in workers {
                if w == "gpu-a" && killed {
                    continue;
                }
                let active = feed.active_on(&w.into()) as u32;
                let base = if w == "gpu-b" && killed { 78 } else { 18 };
                let used = (base + active * 9 + (seq as u32 * 3) % 7).min(99);
                out.push(heartbeat("router", w, used, seq, t));
            }
            seq += 1;
        }
        // The management node and the router's management API, every 2 s.
        if t % 2_000 == 100 && t >= 2_100 {
            let i = ((t - 100) / 2_000).min(12);
            let state = fixtures::skulk_state(&format!("runC/state_t{i}.json"))?;
            for (source, latency) in [("mgmt", 9), ("router", 14)] {
                out.push(at(
                    t + 5,
                    SessionEvent::SkulkNodeId {
                        source: source.into(),
                        node: RUN_C_NODE.into(),
                    },
                ));
                out.push(at(t + 10, state_event(source, &state, latency)));
            }
        }
        match t {
            1_600 => {
                out.push(at(
                    t,
                    SessionEvent::Command {
                        id: place,
                        text: format!("place {model} {RUN_C_NODE}"),
                    },
                ));
                for (dt, note) in [
                    (20, "→ GET /models/requirements"),
                    (40, "→ GET /instance/previews"),
                    (60, "1 placement uses exactly the requested node"),
                    (80, "fence written"),
                    (100, "→ POST /instance"),
                    (300, "submitted: instance 85bbd162"),
                ] {
                    out.push(at(
                        t + dt,
                        SessionEvent::CommandProgress {
                            id: place,
                            note: note.into(),
                        },
                    ));
                }
            }
            8_100 => out.push(at(
                t,
                SessionEvent::CommandProgress {
                    id: place,
                    note: "evidence: not ready: download ongoing, runner failed".into(),
                },
            )),
            22_100 => out.push(at(
                t,
                SessionEvent::CommandOutcome {
                    id: place,
                    status: CommandStatus::Failed,
                    detail: "instance 85bbd162: runner a9393fdd failed: module 'mlx.core' has no attribute 'new_thread_local_stream'"
                        .into(),
                },
            )),
            _ => {}
        }
        t += 100;
    }
    out.sort_by_key(|e| e.at);
    Ok(out)
}

fn state_event(source: &str, state: &State, latency_ms: u64) -> SessionEvent {
    SessionEvent::SkulkState {
        source: source.into(),
        state: Box::new(state.clone()),
        latency_ms,
        received_unix_ms: None,
    }
}

/// A steady session like `den demo`: three workers heartbeating every second, a
/// request every 500 ms through the simulated router, the router's management API
/// polled every 2 s.
pub fn demo(seconds: u64) -> Result<Vec<Stamped>, String> {
    let workers = ["gpu-a", "gpu-b", "gpu-c"];
    let mut out = Vec::new();
    opening(&mut out, &workers);
    let state = fixtures::skulk_state("derived/state_two_nodes_running.json")?;
    let mut feed = SimFeed::new("router", 1_000, &workers);
    let end = seconds * 1_000;
    let mut seq = 1;
    let mut n = 0u64;
    let mut t = 1_000;
    while t <= end {
        feed.run_to(t, &mut out)?;
        if t % 500 == 0 {
            n += 1;
            let extra = 10 + (n * 37 % 200) as u32;
            let max_new = 20 + (n * 53 % 100) as u32;
            feed.submit(request(&format!("req-{n:06}"), extra, max_new)?, &mut out);
        }
        if t % 1_000 == 0 {
            for w in workers {
                let active = feed.active_on(&w.into()) as u32;
                let used = (20 + active * 6 + (seq as u32 * 5) % 11).min(99);
                out.push(heartbeat("router", w, used, seq, t));
            }
            seq += 1;
        }
        if t % 2_000 == 0 {
            out.push(at(t + 5, state_event("router", &state, 4)));
        }
        t += 100;
    }
    out.sort_by_key(|e| e.at);
    Ok(out)
}
