//! The router's timer wheel: offer timers, request deadlines and heartbeat expiries in
//! one ordered map keyed by `(due, sequence)`, with one sleep until the earliest in the
//! actor's select loop. Setting a key again replaces its timer; cancelling is O(log n).

use std::collections::BTreeMap;

use den_protocol::router_node::{Timer, TimerKey};
use den_protocol::time::Millis;

#[derive(Debug, Default)]
pub struct TimerWheel {
    seq: u64,
    due: BTreeMap<(Millis, u64), Timer>,
    keys: BTreeMap<TimerKey, (Millis, u64)>,
}

impl TimerWheel {
    /// Arm `timer` to fire at `at`, replacing an earlier timer of the same key.
    pub fn set(&mut self, timer: Timer, at: Millis) {
        let key = timer.key();
        self.cancel(&key);
        self.seq += 1;
        let slot = (at, self.seq);
        self.keys.insert(key, slot);
        self.due.insert(slot, timer);
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
    pub fn pop_due(&mut self, now: Millis) -> Vec<Timer> {
        let mut out = Vec::new();
        while let Some(entry) = self.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let timer = entry.remove();
            self.keys.remove(&timer.key());
            out.push(timer);
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
    use den_protocol::ids::AssignmentId;

    #[test]
    fn fires_in_order_and_replaces_or_cancels_by_key() {
        let mut w = TimerWheel::default();
        let a = AssignmentId::new("r", 1);
        w.set(Timer::Offer(a.clone()), Millis(50));
        w.set(Timer::Deadline("r".into()), Millis(10));
        // Re-arming replaces: only one offer timer, now at 30.
        w.set(Timer::Offer(a.clone()), Millis(30));
        assert_eq!(w.len(), 2);
        assert_eq!(w.next_due(), Some(Millis(10)));
        assert_eq!(w.pop_due(Millis(5)), vec![]);
        assert_eq!(
            w.pop_due(Millis(30)),
            vec![Timer::Deadline("r".into()), Timer::Offer(a.clone())]
        );
        assert!(w.is_empty());
        w.set(Timer::Offer(a.clone()), Millis(1));
        w.cancel(&TimerKey::Offer(a));
        assert_eq!(w.pop_due(Millis(100)), vec![]);
        assert_eq!(w.next_due(), None);
    }
}
