//! The router's timer wheel: offer timers, request deadlines and heartbeat expiries in
//! one ordered map keyed by `(due, sequence)`, with one sleep until the earliest in the
//! actor's select loop. Setting a key again replaces its timer; cancelling is O(log n).

use std::collections::BTreeMap;

use den_protocol::discovery::ConnectionId;
use den_protocol::ids::{AssignmentId, HeartbeatVersion, RequestId, WorkerId};
use den_protocol::time::Millis;

/// What a timer is for (one live timer per key).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerKey {
    Offer(AssignmentId),
    Deadline(RequestId),
    Expiry(WorkerId),
}

/// What firing a timer means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    Offer(AssignmentId),
    Deadline(RequestId),
    Expiry {
        worker: WorkerId,
        connection: ConnectionId,
        version: HeartbeatVersion,
    },
}

#[derive(Debug, Default)]
pub struct TimerWheel {
    seq: u64,
    due: BTreeMap<(Millis, u64), (TimerKey, Fired)>,
    keys: BTreeMap<TimerKey, (Millis, u64)>,
}

impl TimerWheel {
    /// Arm `key` to fire `fired` at `at`, replacing an earlier timer of the same key.
    pub fn set(&mut self, key: TimerKey, at: Millis, fired: Fired) {
        self.cancel(&key);
        self.seq += 1;
        let slot = (at, self.seq);
        self.keys.insert(key.clone(), slot);
        self.due.insert(slot, (key, fired));
    }

    pub fn cancel(&mut self, key: &TimerKey) {
        if let Some(slot) = self.keys.remove(key) {
            self.due.remove(&slot);
        }
    }

    /// When the earliest timer is due.
    pub fn next_due(&self) -> Option<Millis> {
        self.due.keys().next().map(|(at, _)| *at)
    }

    /// Remove and return every timer due at or before `now`, earliest first.
    pub fn pop_due(&mut self, now: Millis) -> Vec<Fired> {
        let mut out = Vec::new();
        while let Some(entry) = self.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (key, fired) = entry.remove();
            self.keys.remove(&key);
            out.push(fired);
        }
        out
    }

    pub fn len(&self) -> usize {
        self.due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_in_order_and_replaces_or_cancels_by_key() {
        let mut w = TimerWheel::default();
        let a = AssignmentId::new("r", 1);
        w.set(
            TimerKey::Offer(a.clone()),
            Millis(50),
            Fired::Offer(a.clone()),
        );
        w.set(
            TimerKey::Deadline("r".into()),
            Millis(10),
            Fired::Deadline("r".into()),
        );
        // Re-arming replaces: only one offer timer, now at 30.
        w.set(
            TimerKey::Offer(a.clone()),
            Millis(30),
            Fired::Offer(a.clone()),
        );
        assert_eq!(w.len(), 2);
        assert_eq!(w.next_due(), Some(Millis(10)));
        assert_eq!(w.pop_due(Millis(5)), vec![]);
        assert_eq!(
            w.pop_due(Millis(30)),
            vec![Fired::Deadline("r".into()), Fired::Offer(a.clone())]
        );
        assert!(w.is_empty());
        w.set(
            TimerKey::Offer(a.clone()),
            Millis(1),
            Fired::Offer(a.clone()),
        );
        w.cancel(&TimerKey::Offer(a));
        assert_eq!(w.pop_due(Millis(100)), vec![]);
        assert_eq!(w.next_due(), None);
    }
}
