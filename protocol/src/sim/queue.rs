//! The simulator's event queue: ordered by `(due, seq)`, so events due at the same time
//! are delivered first-in first-out and every run is deterministic.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

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

/// A binary heap of small `(due, seq, slot)` keys over a slab of events, so that queue
/// operations move 24-byte keys rather than whole events. Cancelled events leave their
/// key in the heap; a key whose slot no longer holds its `seq` is skipped.
#[derive(Debug, Clone, Default)]
pub(super) struct EventQueue {
    heap: BinaryHeap<Reverse<(Millis, u64, usize)>>,
    slots: Vec<Option<(u64, SimEvent)>>,
    free: Vec<usize>,
    live: usize,
    /// Pending timers: key → (seq, slot).
    timers: BTreeMap<TimerKey, (u64, usize)>,
    next_seq: u64,
}

impl EventQueue {
    pub(super) fn push(&mut self, due: Millis, event: SimEvent) -> (u64, usize) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let entry = Some((seq, event));
        let slot = match self.free.pop() {
            Some(slot) => {
                if let Some(s) = self.slots.get_mut(slot) {
                    *s = entry;
                }
                slot
            }
            None => {
                self.slots.push(entry);
                self.slots.len() - 1
            }
        };
        self.heap.push(Reverse((due, seq, slot)));
        self.live += 1;
        (seq, slot)
    }

    /// Schedule a timer; one already pending under the same key is replaced.
    pub(super) fn push_timer(&mut self, timer: TimerKey, due: Millis, event: SimEvent) {
        let key = self.push(due, event);
        if let Some(old) = self.timers.insert(timer, key) {
            self.remove(old);
        }
    }

    pub(super) fn cancel_timer(&mut self, timer: &TimerKey) {
        if let Some(key) = self.timers.remove(timer) {
            self.remove(key);
        }
    }

    /// Due time of the next live event.
    pub(super) fn next_due(&mut self) -> Option<Millis> {
        while let Some(Reverse((due, seq, slot))) = self.heap.peek().copied() {
            if self.holds(seq, slot) {
                return Some(due);
            }
            self.heap.pop();
        }
        None
    }

    pub(super) fn pop(&mut self) -> Option<(Millis, SimEvent)> {
        while let Some(Reverse((due, seq, slot))) = self.heap.pop() {
            if !self.holds(seq, slot) {
                continue;
            }
            let Some((_, event)) = self.slots.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            self.free.push(slot);
            self.live -= 1;
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
            return Some((due, event));
        }
        None
    }

    pub(super) fn is_empty(&self) -> bool {
        self.live == 0
    }

    pub(super) fn len(&self) -> usize {
        self.live
    }

    /// Live events in delivery order.
    pub(super) fn pending(&self) -> Vec<(Millis, u64, &SimEvent)> {
        let mut out: Vec<(Millis, u64, &SimEvent)> = self
            .heap
            .iter()
            .filter_map(|Reverse((due, seq, slot))| match self.slots.get(*slot) {
                Some(Some((s, e))) if s == seq => Some((*due, *seq, e)),
                _ => None,
            })
            .collect();
        out.sort_by_key(|(due, seq, _)| (*due, *seq));
        out
    }

    fn holds(&self, seq: u64, slot: usize) -> bool {
        matches!(self.slots.get(slot), Some(Some((s, _))) if *s == seq)
    }

    fn remove(&mut self, (seq, slot): (u64, usize)) {
        if self.holds(seq, slot) {
            if let Some(s) = self.slots.get_mut(slot) {
                *s = None;
            }
            self.free.push(slot);
            self.live -= 1;
        }
    }
}

/// Equal when the same events are pending in the same order (layout aside).
impl PartialEq for EventQueue {
    fn eq(&self, other: &Self) -> bool {
        self.next_seq == other.next_seq && self.pending() == other.pending()
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
        let pending = self.pending();
        let mut seq = s.serialize_seq(Some(pending.len()))?;
        for (due, n, event) in pending {
            seq.serialize_element(&Pending { due, seq: n, event })?;
        }
        seq.end()
    }
}
