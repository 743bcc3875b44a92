//! The simulator's event queue: ordered by `(due, seq)`, so events due at the same time
//! are delivered first-in first-out and every run is deterministic.

use std::collections::BTreeMap;

use serde::ser::SerializeSeq;
use serde::{Serialize, Serializer};

use crate::ids::{AssignmentId, RequestId, WorkerId};
use crate::router::RouterInput;
use crate::time::Millis;
use crate::wire::{RouterMessage, WorkerMessage};
use crate::worker::WorkerInput;

/// Something that will happen at a logical time.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum SimEvent {
    /// A router message in flight to a worker.
    ToWorker {
        to: WorkerId,
        message: RouterMessage,
    },
    /// A worker message in flight to the router.
    ToRouter {
        from: WorkerId,
        message: WorkerMessage,
    },
    /// The simulated engine reports to its worker (operation results, tokens).
    Engine {
        worker: WorkerId,
        input: WorkerInput,
    },
    /// A router timer fires.
    Timer { input: RouterInput },
}

/// Timers can be cancelled; they are found by this key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum TimerKey {
    Offer(AssignmentId),
    Deadline(RequestId),
}

#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct EventQueue {
    events: BTreeMap<(Millis, u64), SimEvent>,
    /// Pending timers (derived from `events`; not serialised).
    timers: BTreeMap<TimerKey, (Millis, u64)>,
    next_seq: u64,
}

impl EventQueue {
    pub(super) fn push(&mut self, due: Millis, event: SimEvent) -> (Millis, u64) {
        let key = (due, self.next_seq);
        self.next_seq += 1;
        self.events.insert(key, event);
        key
    }

    /// Schedule a timer; one already pending under the same key is replaced.
    pub(super) fn push_timer(&mut self, timer: TimerKey, due: Millis, event: SimEvent) {
        let key = self.push(due, event);
        if let Some(old) = self.timers.insert(timer, key) {
            self.events.remove(&old);
        }
    }

    pub(super) fn cancel_timer(&mut self, timer: &TimerKey) {
        if let Some(key) = self.timers.remove(timer) {
            self.events.remove(&key);
        }
    }

    pub(super) fn next_due(&self) -> Option<Millis> {
        self.events.first_key_value().map(|((due, _), _)| *due)
    }

    pub(super) fn pop(&mut self) -> Option<(Millis, SimEvent)> {
        let ((due, _), event) = self.events.pop_first()?;
        if let SimEvent::Timer { input } = &event {
            let timer = match input {
                RouterInput::OfferTimeout { assignment } => {
                    Some(TimerKey::Offer(assignment.clone()))
                }
                RouterInput::DeadlineExpired { request } => {
                    Some(TimerKey::Deadline(request.clone()))
                }
                _ => None,
            };
            if let Some(t) = timer {
                self.timers.remove(&t);
            }
        }
        Some((due, event))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.events.len()
    }

    pub(super) fn pending(&self) -> impl Iterator<Item = (Millis, &SimEvent)> {
        self.events.iter().map(|((due, _), e)| (*due, e))
    }
}

#[derive(Serialize)]
struct Pending<'a> {
    due: Millis,
    seq: u64,
    #[serde(flatten)]
    event: &'a SimEvent,
}

impl Serialize for EventQueue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.events.len()))?;
        for ((due, n), event) in &self.events {
            seq.serialize_element(&Pending {
                due: *due,
                seq: *n,
                event,
            })?;
        }
        seq.end()
    }
}
