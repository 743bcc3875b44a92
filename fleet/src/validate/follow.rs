//! A simulator policy that follows the real router: each request goes to the worker the
//! real router sent it to and reuses as many blocks as the real worker did.
//!
//! Running the simulator with it separates the two ways the simulator can be wrong: its
//! model of the workers (costs, FIFO queue, cache) — measured by this run — and den's
//! routing decisions taken on a slightly different view of the fleet, which, once one
//! request goes elsewhere, send every later request onto different queues.

use crate::worker::Reuse;
use crate::{FleetView, Policy, Route, RouteRequest};

use super::Measured;

/// The real router's choices, by request index.
#[derive(Debug, Clone, Default)]
pub struct FollowRouter {
    choices: Vec<Option<Choice>>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Choice {
    worker: usize,
    /// Blocks the real worker reused (`None`: it did not say; reuse the longest).
    blocks: Option<u32>,
}

impl FollowRouter {
    /// `worker_index` maps a real worker's name to the simulator's index;
    /// `block_tokens` converts reused tokens into blocks.
    pub fn new(
        measured: &[Measured],
        block_tokens: u32,
        worker_index: impl Fn(&str) -> Option<usize>,
    ) -> FollowRouter {
        let choices = measured
            .iter()
            .map(|m| {
                let worker = worker_index(m.worker.as_deref()?)?;
                let blocks = m.cached_tokens.map(|t| t / block_tokens.max(1));
                Some(Choice { worker, blocks })
            })
            .collect();
        FollowRouter { choices }
    }
}

impl Policy for FollowRouter {
    fn name(&self) -> &'static str {
        "router's choices"
    }

    fn route(&mut self, request: &RouteRequest, fleet: &FleetView) -> Route {
        // A request the real cluster did not serve has no choice to follow: spread those
        // round-robin (the report counts them as failed anyway).
        let Some(c) = self.choices.get(request.index).copied().flatten() else {
            return Route::to(request.index % fleet.worker_count().max(1));
        };
        let mut route = Route::to(c.worker.min(fleet.worker_count().saturating_sub(1)));
        if let Some(n) = c.blocks {
            route.reuse = Reuse::Blocks(n);
        }
        route
    }
}
