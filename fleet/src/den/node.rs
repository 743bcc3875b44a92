//! den's router in the fleet simulator: den-agent's own [`RouterNode`], driven through its
//! one entry point, `handle(now, input) -> effects`, exactly as the router actor drives
//! it — the same discovery, chunk catalog, candidate builder, pricing, ranking, offer
//! order, in-flight ledger and speculative prefixes. Nothing here decides; it only turns
//! the simulated workers into the frames den's workers send and the router's offers
//! into dispatches.
//!
//! Each simulated worker is one connection and one node. Its frames:
//! - **heartbeats**: an [`Observation`] of the worker — the engine plan it reports (den's
//!   workers do), its pool's free and evictable pages, its link rates, and the GPU
//!   prefixes it holds (the root-contiguous resident blocks). In a heartbeat-lagged run
//!   ([`crate::Heartbeats`], what `validate` replays) they arrive when the worker's
//!   heartbeats fire, listing every resident prefix; otherwise every worker heartbeats
//!   just before each request, which is the current view every other policy is given, and
//!   lists only the prefixes of that request's blocks (the only ones its candidates can
//!   match, so the candidates are the same as with the full list, at a fraction of the
//!   cost);
//! - **publish / retract**: the RAM and SSD replicas a worker holds of the request's
//!   blocks, and the object-store copies whose upload finished, delivered just before the
//!   request (a catalog's answer for a request depends on that request's chunks only, so
//!   this is the eager publication den's workers do, without the network delay);
//! - **offer results**: a simulated worker queues whatever it is offered, so it accepts
//!   at once, and runs the alternative it accepted as den's worker does ([`reuse_of`]:
//!   a lower-tier alternative is restored from its tier, even blocks the pool holds);
//!   **results** when its last token is out.
//!
//! Block `b` of the workload is a chunk of the router's chain: its tokens are a fixed
//! function of `b` ([`block_token`]), so equal block prefixes are equal token prefixes and
//! the router hashes them as it hashes any prompt. The node's timers (offer timeouts,
//! deadlines, heartbeat expiry) are never fired: offers are answered at once, the
//! simulated clients wait without a deadline and workers never miss a heartbeat.
//!
//! den's router prices a lower tier's fixed cost (a fetch's latency) as den's worker's
//! window of `RESTORE_FETCH_WINDOW` fetches in flight pipelines it: once before the bytes
//! stream, or once per window when latency dominates; the simulated H100 workers load a
//! run in one request, which the first case matches. A request the router refuses
//! (no worker's pool could ever hold it, or too many wait already) is refused in the
//! replay too: den-agent answers 503 with `Retry-After: 1`, and the simulated client
//! submits it again a second later (a new request id, its TTFT counted from the first
//! arrival; the report counts refusals). One the node keeps waiting for KV pages
//! ([`den_protocol::router_node::waiting`]) is held by the replay ([`Route::held`]) and
//! dispatched when the node offers it, on a heartbeat that shows the room
//! ([`Policy::admitted`]): after every worker event that finishes requests, each worker
//! heartbeats as it is then, as before each arrival.

mod catalog;
mod held;

use std::collections::HashMap;
use std::sync::Arc;

use held::{Held, Outcome, outcomes, refused};

use super::{StudyDecision, blocks_for};
use crate::cache::Level;
use crate::policy::{FleetView, LeastLoaded, Policy, Route, RouteRequest};
use crate::trace::block_token;
use crate::worker::Reuse;
use den_protocol::candidate::{Scored, Tier};
use den_protocol::chunk::{ChunkDescriptor, PrefixHash, plan_chunks};
use den_protocol::chunk_catalog::ChunkEntry;
use den_protocol::discovery::ConnectionId;
use den_protocol::ids::{AssignmentId, Epoch, ModelFingerprint, NodeId, RequestId, RouteId};
use den_protocol::observation::{GpuPrefix, Observation};
use den_protocol::request::{GenerationRequest, Token};
use den_protocol::router::{DeliveryKind, RouterConfig};
use den_protocol::router_node::{NodeConfig, NodeEffect, NodeInput, Pin, RouterNode};
use den_protocol::time::Millis;
use den_protocol::wire::{
    Heartbeat, Offer, OfferResult, Publish, PublishedChunk, ResultMessage, ResultStatus, Retract,
    RetractedChunk, RouterMessage, ToRouter, WorkerResult, WorkerTimings,
};

/// The model every simulated worker serves.
const MODEL: &str = "fleet/model";

/// Host RAM as a restore source, bytes/ms: it is already in host memory (the cost model
/// charges only the PCIe upload), so its load is ~0 — finite, as a worker would report.
const RAM_BYTES_PER_MS: f64 = 1e12;

/// den-agent's `Retry-After` on a 503 (no worker can hold the request now), µs.
const RETRY_AFTER_US: u64 = 1_000_000;

/// How often the node's housekeeping runs (record retention), ms of simulated time.
const TICK_MS: u64 = 1_000;

/// A block as a chunk of the router's chain.
#[derive(Debug, Clone, Copy, PartialEq)]
struct BlockChunk {
    hash: PrefixHash,
    parent: PrefixHash,
    /// The block before it in its chain (`None` at the root).
    parent_block: Option<u32>,
    start: u32,
    tokens: u32,
}

/// den-agent's router node over the simulated fleet (module docs).
#[derive(Debug)]
pub struct NodePolicy {
    node: Option<RouterNode>,
    model: ModelFingerprint,
    chunk_size: u32,
    /// Heartbeat sequence per worker.
    sequence: Vec<u64>,
    /// Per block: its chunk, once a request has named it.
    chunks: Vec<Option<BlockChunk>>,
    /// Per block: published to the catalog as in the object store.
    in_object: Vec<bool>,
    /// The accepted assignment of each request in flight (replay index).
    assigned: HashMap<usize, AssignmentId>,
    max_waiting: usize,
    /// Requests waiting in the node for KV pages, by id.
    held: HashMap<RequestId, Held>,
    /// What the node did for waiting requests while handling a worker's frames.
    outcomes: Vec<Outcome>,
    /// When every worker last heartbeat with a fresh view (not heartbeat-lagged runs).
    beat_at: Option<u64>,
    next_tick: u64,
}

impl Default for NodePolicy {
    fn default() -> Self {
        NodePolicy::new()
    }
}

impl NodePolicy {
    pub fn new() -> NodePolicy {
        NodePolicy::with_max_waiting(den_protocol::router_node::DEFAULT_MAX_WAITING)
    }

    /// With at most `max_waiting` requests waiting in the node for KV pages.
    pub fn with_max_waiting(max_waiting: usize) -> NodePolicy {
        NodePolicy {
            max_waiting,
            node: None,
            model: ModelFingerprint(MODEL.into()),
            chunk_size: 1,
            sequence: Vec::new(),
            chunks: Vec::new(),
            in_object: Vec::new(),
            assigned: HashMap::new(),
            held: HashMap::new(),
            outcomes: Vec::new(),
            beat_at: None,
            next_tick: 0,
        }
    }

    /// The router node, once the first request created it.
    pub fn node(&self) -> Option<&RouterNode> {
        self.node.as_ref()
    }

    /// The node, created with one connection per worker on first use.
    fn ensure(&mut self, fleet: &FleetView, now: Millis) -> &mut RouterNode {
        let workers = fleet.worker_count();
        let chunk_size = fleet.cost.block_tokens.max(1);
        let max_waiting = self.max_waiting;
        let node = self.node.get_or_insert_with(|| {
            let mut node = RouterNode::new(NodeConfig {
                router: RouterConfig::default(),
                heartbeat_timeout_ms: u64::MAX / 4,
                chunk_size,
                max_waiting,
            });
            for w in 0..workers {
                let id = FleetView::worker_id(w);
                let effects = node.handle(
                    now,
                    NodeInput::Connected {
                        conn: conn(w),
                        worker: id.clone(),
                        node: NodeId(id.0),
                    },
                );
                drop(effects); // a connection's hello asks for nothing
            }
            node
        });
        self.chunk_size = chunk_size;
        if self.sequence.len() != workers {
            self.sequence = vec![0; workers];
        }
        let blocks = fleet.block_count();
        if self.chunks.len() < blocks {
            self.chunks.resize(blocks, None);
            self.in_object.resize(blocks, false);
        }
        node
    }

    /// Worker `w`'s heartbeat: its load as `fleet` shows it and the GPU prefixes it
    /// holds — those of each of `lists` of blocks, or every resident one (`None`).
    fn heartbeat_of(
        &mut self,
        w: usize,
        fleet: &FleetView,
        lists: Option<&[Vec<u32>]>,
        now: Millis,
    ) {
        let Some(seq) = self.sequence.get_mut(w) else {
            return;
        };
        *seq += 1;
        let mut obs = observation(w, *seq, fleet, &self.model);
        obs.gpu_prefixes = match lists {
            None => self.all_prefixes(w, fleet),
            Some(lists) => {
                let mut seen = std::collections::HashSet::new();
                let prefixes = lists
                    .iter()
                    .flat_map(|b| self.request_prefixes(w, b, fleet));
                prefixes.filter(|p| seen.insert(p.prefix_hash)).collect()
            }
        };
        if let Some(node) = self.node.as_mut() {
            let frame = ToRouter::Heartbeat(Box::new(Heartbeat { observation: obs }));
            let effects = send(node, now, conn(w), frame);
            // Timers (expiry, deadlines) are never fired here; what matters is what the
            // node did with the requests waiting for pages.
            self.outcomes.extend(outcomes(effects));
        }
    }

    /// Accepts `offer` for request `index` (a simulated worker queues whatever it is
    /// offered) and turns it into the replay's route.
    fn accept(
        &mut self,
        now: Millis,
        conn: ConnectionId,
        offer: Box<Offer>,
        index: usize,
        blocks: &[u32],
        fleet: &FleetView,
    ) -> Route {
        if let Some(node) = self.node.as_mut() {
            let answer = ToRouter::OfferResult(OfferResult {
                assignment: offer.assignment.clone(),
                worker_epoch: offer.worker_epoch,
                accepted: true,
                reason: None,
            });
            let effects = send(node, now, conn, answer);
            drop(effects); // acceptance: the record and the ledger only
        }
        let c = &offer.candidate;
        let block_tokens: Vec<u32> = blocks.iter().map(|&b| fleet.block_tokens(b)).collect();
        let reuse = reuse_of(
            c.tier,
            c.cached_token_count,
            c.resident_tokens(),
            &block_tokens,
        );
        let route = Route {
            worker: usize::try_from(conn.0).unwrap_or(0),
            reuse,
            predicted_ttft_ms: Some(offer.estimate.ttft_ms),
            // The node keeps its own ledger of offered work (`RouterNode::unreflected_ms`).
            added_work_ms: None,
            record: None,
            retry_after_us: None,
            held: false,
        };
        self.assigned.insert(index, offer.assignment);
        route
    }

    /// The node's housekeeping, once per [`TICK_MS`] of simulated time.
    fn tick(&mut self, now: Millis) {
        if now.0 < self.next_tick {
            return;
        }
        self.next_tick = now.0 + TICK_MS;
        if let Some(node) = self.node.as_mut() {
            let effects = node.handle(now, NodeInput::Tick);
            drop(effects); // retention only
        }
    }

    /// What the explained request's record shows: each worker's best feasible
    /// candidate in offer order, the chosen one first.
    fn study_record(
        &self,
        id: &RequestId,
        request: &RouteRequest,
        fleet: &FleetView,
    ) -> Option<StudyDecision> {
        let record = self.node.as_ref()?.router().record(id)?;
        let ranking = record.candidates.ranking();
        let mut seen = std::collections::BTreeSet::new();
        let ranked: Vec<Scored> = ranking
            .feasible
            .into_iter()
            .filter(|s| seen.insert(s.candidate.worker_id.clone()))
            .collect();
        let chosen = ranked.first()?.clone();
        Some(StudyDecision {
            request: request.index,
            line: request.line,
            at_ms: fleet.now as f64 / 1000.0,
            input_tokens: request.input_tokens,
            output_tokens: request.output_tokens,
            chosen,
            imposed_ms: ranked.iter().map(|s| s.candidate.imposed_ms).collect(),
            ranked,
            candidates: record.candidates.len() + record.candidates_omitted,
            infeasible: ranking.infeasible.len(),
            capacity_fallback: false,
            measured_ttft_ms: None,
        })
    }
}

impl Policy for NodePolicy {
    fn name(&self) -> &'static str {
        "den"
    }

    fn route(&mut self, request: &RouteRequest, fleet: &FleetView) -> Route {
        let now = Millis(fleet.now / 1000);
        let created = self.node.is_none();
        self.ensure(fleet, now);
        if created && fleet.lagged() {
            // The heartbeats that arrived before the first request: the view's lagged
            // loads are exactly their content.
            for w in 0..fleet.worker_count() {
                self.heartbeat_of(w, fleet, None, now);
            }
        }
        self.tick(now);
        let tokens = tokens_of(request.blocks, request.input_tokens, fleet);
        let id = request_id(request);
        let Ok(generation) = GenerationRequest::new(
            id.clone(),
            self.model.clone(),
            tokens,
            request.output_tokens.max(1),
        ) else {
            // An empty prompt: den's ingress refuses it; the replay still needs a worker.
            return LeastLoaded.route(request, fleet);
        };
        let plan = plan_chunks(generation.processed_tokens(), self.chunk_size);
        self.learn(request.blocks, &plan, fleet);
        self.sync_catalog(request.blocks, fleet, now);
        if !fleet.lagged() {
            // The waiting requests' prefixes only when one of them may be admitted: the
            // node skips them otherwise, and listing them costs the replay dearly.
            // (Their catalog entries were brought up to date when room last appeared,
            // in `admitted`: a worker's room grows only when its requests finish.)
            let lists = if self.room_for_held(fleet) {
                self.held_lists(Some(request.blocks), fleet.worker_count())
            } else {
                vec![request.blocks.to_vec()]
            };
            for w in 0..fleet.worker_count() {
                self.heartbeat_of(w, fleet, Some(&lists), now);
            }
            self.beat_at = Some(fleet.now);
        }
        let Some(node) = self.node.as_mut() else {
            return LeastLoaded.route(request, fleet);
        };
        let effects = node.handle(
            now,
            NodeInput::Submit {
                request: Arc::new(generation),
                // The simulated clients wait without a deadline (a request waiting for
                // pages past the router's default would fail when offered).
                deadline: Some(Millis(u64::MAX / 4)),
                pin: Pin::Any,
            },
        );
        let offer = effects.into_iter().find_map(|e| match e {
            NodeEffect::Send { conn, frame } => match frame.message {
                RouterMessage::Offer(o) => Some((conn, o)),
                _ => None,
            },
            _ => None,
        });
        let Some((conn, offer)) = offer else {
            if node.waiting().contains(&id) {
                // No worker has its pages now: it waits in the router, FCFS.
                self.held.insert(id, Held::of(request));
                return Route {
                    held: true,
                    ..Route::to(0)
                };
            }
            // No worker could hold it: den-agent answers 503 with `Retry-After: 1`.
            return refused();
        };
        let mut route = self.accept(now, conn, offer, request.index, request.blocks, fleet);
        if request.explain {
            route.record = self.study_record(&id, request, fleet);
        }
        route
    }

    fn admitted(&mut self, fleet: &FleetView) -> Vec<(usize, Route)> {
        self.admit_held(fleet)
    }

    fn heartbeat(&mut self, w: usize, fleet: &FleetView) {
        let now = Millis(fleet.now / 1000);
        if self.node.is_none() {
            return; // nothing routed yet: the first request connects the workers
        }
        self.heartbeat_of(w, fleet, None, now);
    }

    fn finished(&mut self, w: usize, r: usize, now: u64) {
        let Some(assignment) = self.assigned.remove(&r) else {
            return;
        };
        let Some(node) = self.node.as_mut() else {
            return;
        };
        let frame = ToRouter::Result(ResultMessage {
            assignment,
            result: Box::new(WorkerResult {
                status: ResultStatus::Completed,
                tokens: Vec::new(),
                cached_token_count: 0,
                stop: None,
                failure: None,
                timings: WorkerTimings::default(),
            }),
        });
        let effects = send(node, Millis(now / 1000), conn(w), frame);
        debug_assert!(
            effects.iter().any(|e| matches!(
                e,
                NodeEffect::Deliver(d) if matches!(d.kind, DeliveryKind::Completed { .. })
            )),
            "the router completes an accepted request on its result"
        );
    }
}

fn conn(w: usize) -> ConnectionId {
    ConnectionId(w as u64)
}

/// `frame` from the worker on `conn`, as the router actor hands it to the node.
fn send(
    node: &mut RouterNode,
    now: Millis,
    conn: ConnectionId,
    frame: ToRouter,
) -> Vec<NodeEffect> {
    node.handle(now, NodeInput::Frame { conn, frame })
}

/// A request's id at the router: each client retry is a new submission.
fn request_id(request: &RouteRequest) -> RequestId {
    match request.attempt {
        0 => RequestId::new(format!("r{}", request.index)),
        n => RequestId::new(format!("r{}.{n}", request.index)),
    }
}

/// The route every prefix of worker `w` is advertised under (the simulated worker's
/// blocks are not routes; the router only passes the id back in a GPU offer).
fn route_of(w: usize) -> RouteId {
    RouteId(format!("{}-pool", FleetView::worker_id(w).0))
}

/// The request's prompt: each block's tokens, the last block cut to the prompt length.
fn tokens_of(blocks: &[u32], input_tokens: u32, fleet: &FleetView) -> Vec<Token> {
    let mut out = Vec::with_capacity(input_tokens as usize);
    for &b in blocks {
        let left = (input_tokens as usize).saturating_sub(out.len());
        let take = left.min(fleet.block_tokens(b) as usize) as u32;
        out.extend((0..take).map(|i| block_token(u64::from(b), i)));
    }
    out
}

/// What den's worker does with the alternative it accepted (spec §3.3), on every
/// profile: a GPU or recompute alternative reuses its resident blocks; a lower-tier one
/// forks the resident head it names and restores the rest from the tier it names, even
/// blocks the pool also holds. The router prices exactly that, so an engine that took
/// whatever its pool holds instead would run a different plan than the one priced: a
/// request the router meant to start after a restore (and so not to join, and lengthen,
/// the pending requests' last prefill step) would join it at once.
fn reuse_of(tier: Tier, cached: u32, resident: u32, block_tokens: &[u32]) -> Reuse {
    let blocks = blocks_for(block_tokens, cached);
    if matches!(tier, Tier::Ram | Tier::Ssd | Tier::Object) {
        Reuse::Restore {
            resident: blocks_for(block_tokens, resident),
            blocks,
        }
    } else {
        Reuse::Blocks(blocks)
    }
}

/// What a den worker's heartbeat says, for simulated worker `w` as `fleet` shows it.
fn observation(
    w: usize,
    sequence: u64,
    fleet: &FleetView,
    model: &ModelFingerprint,
) -> Observation {
    let load = fleet.load(w);
    let cost = fleet.cost;
    let id = FleetView::worker_id(w);
    let mut obs = Observation::new(id.clone(), NodeId(id.0));
    obs.epoch = Epoch(1);
    obs.sequence = sequence;
    obs.models.insert(model.clone());
    obs.online = true;
    obs.queue_ms = load.queue_ms;
    obs.page_size = cost.block_tokens;
    obs.max_context = cost.max_context;
    obs.free_pages = load.free_blocks;
    obs.evictable_pages = load.evictable_blocks;
    obs.prefill_ms_per_token = load.prefill_ms_per_token;
    obs.first_token_ms = cost.first_token_ms();
    obs.gpu_restore_bytes_per_ms = cost.pcie_bytes_per_s / 1000.0;
    obs.tier_throughput_bytes_per_ms
        .insert(Tier::Ram, RAM_BYTES_PER_MS);
    obs.tier_throughput_bytes_per_ms
        .insert(Tier::Ssd, cost.nvme_bytes_per_s / 1000.0);
    obs.tier_fixed_ms
        .insert(Tier::Ssd, cost.nvme_fixed_us as f64 / 1000.0);
    if let Some(object) = &cost.object_store {
        obs.object_store = true;
        obs.tier_throughput_bytes_per_ms
            .insert(Tier::Object, object.bytes_per_s / 1000.0);
        obs.tier_fixed_ms
            .insert(Tier::Object, object.latency_us as f64 / 1000.0);
    }
    // What the worker's links have booked: loads from a tier wait behind them.
    for (tier, ms) in [
        (Tier::Ssd, load.nvme_backlog_ms),
        (Tier::Object, load.object_backlog_ms),
        (Tier::Gpu, load.pcie_backlog_ms + load.pcie_queued_ms),
    ] {
        if ms > 0.0 {
            obs.link_backlog_ms.insert(tier, ms);
        }
    }
    obs.pool.total_pages = load.capacity_blocks;
    obs.pool.free = load.free_blocks;
    obs.pool.evictable = load.evictable_blocks;
    obs.pool.page_bytes = cost.kv_bytes(u64::from(cost.block_tokens));
    obs.engine = Some(load.plan);
    obs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_tier_alternative_restores_what_it_names_whatever_the_pool_holds() {
        // Blocks of 512, 512 and 300 tokens. A GPU reuse of 1024 tokens takes two blocks
        // as they are; an object-store alternative of 1024 tokens restores both, even
        // where the pool holds them (resident 0), or forks the one-block head it names.
        let blocks = [512, 512, 300];
        assert_eq!(reuse_of(Tier::Gpu, 1024, 0, &blocks), Reuse::Blocks(2));
        assert_eq!(reuse_of(Tier::None, 0, 0, &blocks), Reuse::Blocks(0));
        assert_eq!(
            reuse_of(Tier::Object, 1024, 0, &blocks),
            Reuse::Restore {
                resident: 0,
                blocks: 2
            }
        );
        assert_eq!(
            reuse_of(Tier::Ssd, 1324, 512, &blocks),
            Reuse::Restore {
                resident: 1,
                blocks: 3
            }
        );
    }
}
