//! The page pool as the worker's [`Capacity`]: the authoritative local interpreter's
//! offer path (spec §3.6 steps 4–6).
//!
//! - Step 4, resident prefix fork (the candidate's resident tokens: a GPU alternative's
//!   whole prefix, or a lower-tier alternative's resident head, > 0): the source is the
//!   candidate's `source_continuation_id`, else the route itself. A route that already
//!   exists with exactly that many tokens is used as is; with another length →
//!   `resident-prefix-mismatch`. Otherwise a source holding at least as many is forked
//!   for them; else → `resident-prefix-unavailable`. A lower-tier alternative's restore
//!   then appends the rest after them.
//! - Steps 5–6, capacity admission for `(route, processed + max_new)` with the route and every
//!   `protected` route excluded from eviction: plan, evict, reserve in one step. On
//!   shortfall the fork is undone and the offer declined `insufficient-pages`.
//!
//! Decisions where the spec is silent:
//! - An existing route that another assignment is using (protected, pending append or
//!   live reservation) is never joined: `resident-prefix-mismatch` (its contents are about
//!   to change under the other assignment).
//! - A route whose recorded model differs from the request's model is never used or
//!   forked: `resident-prefix-mismatch` for the route itself, `resident-prefix-unavailable`
//!   for a source (KV of one fingerprint is never reused for another).
//! - A non-GPU (or zero-prefix) offer for a continuation that is resident but idle here
//!   replaces that route: the admission counts its pages as freed and drops it when the
//!   offer is accepted, because the assignment rebuilds the route from its own prefix.
//!   Without this a continuation whose route is not advertised would be declined forever.
//! - `abandon` drops the route only when this assignment created it (fork, fresh or
//!   replacement); a route that existed before the offer keeps its exact prefix.

use std::collections::BTreeSet;

use super::PagePool;
use super::reservation::ReservationId;
use super::route::Route;
use crate::capacity::{Admission, AdmitRequest, Capacity, DeclineReason};
use crate::ids::{AssignmentId, ModelFingerprint, RouteId};

/// What an admitted assignment holds in the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AssignmentEntry {
    pub(super) route: RouteId,
    pub(super) reservation: Option<ReservationId>,
    pub(super) created_route: bool,
}

impl PagePool {
    /// The live capacity reservation of an admitted assignment (handlers claim from it by
    /// allocating or appending to the assignment's route).
    pub fn reservation_for(&self, assignment: &AssignmentId) -> Option<ReservationId> {
        self.assignments.get(assignment).and_then(|a| a.reservation)
    }

    /// Assignments admitted and not yet completed or abandoned.
    pub fn admitted(&self) -> impl Iterator<Item = (&AssignmentId, &RouteId)> {
        self.assignments.iter().map(|(a, e)| (a, &e.route))
    }

    /// An existing route cannot be joined by a new assignment while another uses it.
    fn route_busy(&self, route: &RouteId, protected: &BTreeSet<RouteId>) -> bool {
        protected.contains(route)
            || self.routes.get(route).is_some_and(|r| r.pending.is_some())
            || self.reservations.of_route(route).is_some()
    }
}

fn other_model(r: &Route, model: &ModelFingerprint) -> bool {
    r.policy
        .identity
        .as_ref()
        .is_some_and(|i| &i.model != model)
}

impl Capacity for PagePool {
    fn admit(&mut self, req: AdmitRequest<'_>) -> Result<Admission, DeclineReason> {
        if self.assignments.contains_key(req.assignment) {
            // The worker answers duplicate offers itself; a second admission of one
            // assignment would double its reservation.
            return Err(DeclineReason::RequestAlreadyAssigned);
        }
        let route = req.route;
        let model = &req.request.model;
        let cached = req.candidate.resident_tokens();
        let target = req.request.target();
        let existed = self.routes.contains_key(route);
        if existed && self.route_busy(route, req.protected) {
            return Err(DeclineReason::ResidentPrefixMismatch);
        }
        let mut forked_from = None;
        let mut replace = false;
        if cached > 0 {
            let source = req
                .candidate
                .source_continuation_id
                .as_ref()
                .unwrap_or(route);
            if let Some(r) = self.routes.get(route) {
                if r.token_count != cached || other_model(r, model) {
                    return Err(DeclineReason::ResidentPrefixMismatch);
                }
            } else {
                let usable = self
                    .routes
                    .get(source)
                    .is_some_and(|s| s.token_count >= cached && !other_model(s, model));
                if !usable || self.fork(source, route, Some(cached)).is_err() {
                    return Err(DeclineReason::ResidentPrefixUnavailable);
                }
                forked_from = Some(source.clone());
            }
        } else {
            replace = existed;
        }
        match self.admit_inner(route, target, req.protected, replace) {
            Ok(grant) => {
                self.assignments.insert(
                    req.assignment.clone(),
                    AssignmentEntry {
                        route: route.clone(),
                        reservation: Some(grant.reservation),
                        created_route: !existed || replace,
                    },
                );
                Ok(Admission {
                    reserved_pages: grant.reserved_pages,
                    evicted_pages: grant.reserved_pages.saturating_sub(grant.free_before),
                    evicted_routes: grant.evictions.into_iter().map(|e| e.route).collect(),
                    forked_from,
                })
            }
            Err(_) => {
                if forked_from.is_some() {
                    // The fork added one reference per shared page and nothing else;
                    // releasing it restores the pool exactly.
                    let _ = self.release_route(route);
                }
                Err(DeclineReason::InsufficientPages)
            }
        }
    }

    fn release(&mut self, assignment: &AssignmentId) -> bool {
        let Some(entry) = self.assignments.get_mut(assignment) else {
            return false;
        };
        match entry.reservation.take() {
            Some(r) => self.release_reservation(r),
            None => false,
        }
    }

    fn complete(&mut self, assignment: &AssignmentId, _route: &RouteId) {
        self.release(assignment);
        self.assignments.remove(assignment);
    }

    fn abandon(&mut self, assignment: &AssignmentId, route: &RouteId) {
        self.release(assignment);
        let Some(entry) = self.assignments.remove(assignment) else {
            return;
        };
        if entry.created_route && &entry.route == route {
            self.abort_pending(route);
            let _ = self.release_route(route);
        }
    }

    fn crash(&mut self) {
        self.reset();
    }

    fn free_pages(&self) -> u32 {
        self.free_count()
    }

    fn evictable_pages(&self, protected: &BTreeSet<RouteId>) -> u32 {
        PagePool::evictable_pages(self, protected)
    }
}
