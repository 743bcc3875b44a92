//! The requests den's router node holds for KV pages, in the replay: the node keeps them
//! ([`den_protocol::router_node::waiting`]), the replay holds them ([`Route::held`]), and
//! what the node later offers or fails of them becomes the replay's routes
//! ([`crate::policy::Policy::admitted`]).

use super::{NodePolicy, RETRY_AFTER_US};
use crate::policy::{FleetView, Route, RouteRequest};
use den_protocol::discovery::ConnectionId;
use den_protocol::ids::RequestId;
use den_protocol::router_node::NodeEffect;
use den_protocol::time::Millis;
use den_protocol::wire::{Offer, RouterMessage};

/// A request waiting in the node for KV pages.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) index: usize,
    pub(super) blocks: Vec<u32>,
    pub(super) line: usize,
    pub(super) input_tokens: u32,
    pub(super) output_tokens: u32,
    pub(super) explain: bool,
    pub(super) attempt: u32,
}

impl Held {
    pub(super) fn of(request: &RouteRequest) -> Held {
        Held {
            index: request.index,
            blocks: request.blocks.to_vec(),
            line: request.line,
            input_tokens: request.input_tokens,
            output_tokens: request.output_tokens,
            explain: request.explain,
            attempt: request.attempt,
        }
    }

    pub(super) fn request(&self) -> RouteRequest<'_> {
        RouteRequest {
            index: self.index,
            line: self.line,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            blocks: &self.blocks,
            explain: self.explain,
            attempt: self.attempt,
        }
    }
}

/// What became of a waiting request.
#[derive(Debug)]
pub(super) enum Outcome {
    Offered(ConnectionId, Box<Offer>),
    Failed(RequestId),
}

impl NodePolicy {
    /// Whether some worker has the pages the oldest waiting request needed when the node
    /// last examined it: the node examines none before that one (`RouterNode` skips it
    /// while no worker has that room, and the others wait behind it), so only then is a
    /// fresh heartbeat worth sending.
    pub(super) fn room_for_held(&self, fleet: &FleetView) -> bool {
        let Some(need) = (self.node.as_ref())
            .and_then(|n| n.waiting().iter().next())
            .map(|p| p.needed_pages)
        else {
            return false;
        };
        (0..fleet.worker_count()).any(|w| {
            let load = fleet.load(w);
            u64::from(load.free_blocks) + u64::from(load.evictable_blocks) >= need
        })
    }

    /// The blocks of `first` (the request being routed), then of the oldest waiting
    /// requests: the prefixes a fresh heartbeat lists and the catalog is brought up to
    /// date for. Only the oldest `2 × workers`: the node examines waiting requests in
    /// arrival order and stops at the first that still waits, so a younger one is almost
    /// never priced, and listing every one (hundreds past capacity) for every event
    /// would cost the replay most of its time.
    pub(super) fn held_lists(&self, first: Option<&[u32]>, workers: usize) -> Vec<Vec<u32>> {
        let mut held: Vec<&Held> = self.held.values().collect();
        held.sort_by_key(|h| h.index);
        first
            .map(<[u32]>::to_vec)
            .into_iter()
            .chain(held.into_iter().take(2 * workers).map(|h| h.blocks.clone()))
            .collect()
    }

    /// What the node offered or failed of the waiting requests since the last call, as
    /// the replay's routes ([`Policy::admitted`]); first, where the replay gives current
    /// views and one of them may fit, every worker heartbeats as it is now (as before
    /// each arrival), listing the prefixes of the oldest waiting requests' blocks.
    pub(super) fn admit_held(&mut self, fleet: &FleetView) -> Vec<(usize, Route)> {
        let now = Millis(fleet.now / 1000);
        if !self.held.is_empty()
            && !fleet.lagged()
            && self.beat_at != Some(fleet.now)
            && self.room_for_held(fleet)
        {
            let lists = self.held_lists(None, fleet.worker_count());
            for blocks in &lists {
                self.sync_catalog(blocks, fleet, now);
            }
            for w in 0..fleet.worker_count() {
                self.heartbeat_of(w, fleet, Some(&lists), now);
            }
            self.beat_at = Some(fleet.now);
        }
        let mut out = Vec::new();
        for outcome in std::mem::take(&mut self.outcomes) {
            match outcome {
                Outcome::Offered(conn, offer) => {
                    let id = offer.assignment.request.clone();
                    let Some(h) = self.held.remove(&id) else {
                        continue;
                    };
                    let mut route = self.accept(now, conn, offer, h.index, &h.blocks, fleet);
                    if h.explain {
                        route.record = self.study_record(&id, &h.request(), fleet);
                    }
                    out.push((h.index, route));
                }
                Outcome::Failed(id) => {
                    if let Some(h) = self.held.remove(&id) {
                        out.push((h.index, refused()));
                    }
                }
            }
        }
        out
    }
}

/// den-agent's answer when no worker could hold a request: 503 with `Retry-After: 1`.
pub(super) fn refused() -> Route {
    Route {
        retry_after_us: Some(RETRY_AFTER_US),
        ..Route::to(0)
    }
}

/// The offers and failures among a worker frame's effects (requests that waited).
pub(super) fn outcomes(effects: Vec<NodeEffect>) -> impl Iterator<Item = Outcome> {
    effects.into_iter().filter_map(|e| match e {
        NodeEffect::Send { conn, frame } => match frame.message {
            RouterMessage::Offer(o) => Some(Outcome::Offered(conn, o)),
            _ => None,
        },
        NodeEffect::Deliver(d) if d.is_terminal() => Some(Outcome::Failed(d.request)),
        _ => None,
    })
}
