//! The page pool shared between the worker actor (admission, through the state machine's
//! [`Capacity`]) and the device thread (allocating, appending and scattering rows).
//!
//! One mutex around one [`PagePool`], as spec §12 recommends: every pool mutation is a
//! short critical section; memory copies happen outside the lock, on page numbers the
//! pool has already handed out.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use den_protocol::capacity::{Admission, AdmitRequest, Capacity, DeclineReason};
use den_protocol::ids::{AssignmentId, RouteId};
use den_protocol::pool::PagePool;

/// A cheaply cloneable handle to the worker's page pool.
#[derive(Debug, Clone)]
pub struct SharedPool(Arc<Mutex<PagePool>>);

impl SharedPool {
    pub fn new(pool: PagePool) -> Self {
        SharedPool(Arc::new(Mutex::new(pool)))
    }

    /// The pool, locked. Keep the guard short: never hold it across a memory copy, a
    /// sleep or an await.
    pub fn lock(&self) -> MutexGuard<'_, PagePool> {
        // Pool operations validate before they mutate, so a panic elsewhere while the
        // lock was held cannot have left the accounting half-updated.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Capacity for SharedPool {
    fn admit(&mut self, req: AdmitRequest<'_>) -> Result<Admission, DeclineReason> {
        self.lock().admit(req)
    }

    fn release(&mut self, assignment: &AssignmentId) -> bool {
        self.lock().release(assignment)
    }

    fn complete(&mut self, assignment: &AssignmentId, route: &RouteId) {
        self.lock().complete(assignment, route)
    }

    fn abandon(&mut self, assignment: &AssignmentId, route: &RouteId) {
        self.lock().abandon(assignment, route)
    }

    fn crash(&mut self) {
        self.lock().crash()
    }

    fn free_pages(&self) -> u32 {
        self.lock().free_count()
    }

    fn evictable_pages(&self, protected: &BTreeSet<RouteId>) -> u32 {
        self.lock().evictable_pages(protected)
    }
}
