//! Transfer links of a simulated worker.

use super::cost::Micros;

/// A transfer link (one PCIe direction, an NVMe drive, one NIC direction): transfers run
/// one at a time, each in the earliest idle gap at or after it can start, so a transfer
/// whose data is ready early is not held behind one booked for later (work-conserving,
/// non-preemptive).
#[derive(Debug, Clone, Default)]
pub(crate) struct Link {
    /// Booked intervals `[start, end)`, sorted and disjoint.
    busy: Vec<(Micros, Micros)>,
}

impl Link {
    /// Books `duration` µs starting no earlier than `earliest`; returns the end time.
    pub(crate) fn reserve(&mut self, earliest: Micros, duration: Micros) -> Micros {
        self.busy
            .retain(|&(_, end)| end > earliest.saturating_sub(60_000_000));
        let mut start = earliest;
        let mut at = self.busy.len();
        for (i, &(s, e)) in self.busy.iter().enumerate() {
            if e <= start {
                continue;
            }
            if s >= start + duration {
                at = i;
                break;
            }
            start = start.max(e);
        }
        self.busy
            .insert(at.min(self.busy.len()), (start, start + duration));
        start + duration
    }

    /// Booked transfer time still ahead of `now`, ms.
    pub(crate) fn backlog_ms(&self, now: Micros) -> f64 {
        let us: Micros = self
            .busy
            .iter()
            .map(|&(s, e)| e.saturating_sub(s.max(now)))
            .sum();
        us as f64 / 1e3
    }
}
