//! The driver's time base, and how fence times cross a restart.
//!
//! The workflow sees logical time: milliseconds since the driver started ([`Clock::now`]).
//! Fences on disk carry wall-clock UNIX milliseconds instead (creation time for display,
//! the original reconcile deadline, the external resource's hard expiry), so they mean
//! the same thing to whichever process reads them next.
//!
//! On resume the reconcile deadline is recomputed: a restart begins a new bounded watch
//! of `WorkflowConfig::reconcile_deadline_ms` from the moment of resumption, because
//! nobody was watching while the process was down. The hard expiry stays an absolute
//! bound across restarts; one already passed leaves a single reconciliation look before
//! the workflow concludes.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use den_protocol::placement::Fence;
use den_protocol::time::Millis;

/// Logical time for one driver run, anchored to the wall clock at its start.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: Instant,
    unix_origin_ms: u64,
}

impl Clock {
    /// Time zero is now.
    pub fn start() -> Clock {
        Clock {
            origin: Instant::now(),
            unix_origin_ms: unix_now_ms(),
        }
    }

    /// Milliseconds since the driver started.
    pub fn now(&self) -> Millis {
        Millis(u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// The wall-clock UNIX milliseconds of logical time `t`.
    pub fn to_unix_ms(&self, t: Millis) -> u64 {
        self.unix_origin_ms.saturating_add(t.0)
    }

    /// Logical time of a UNIX time; anything before the driver started is time zero.
    pub fn from_unix_ms(&self, unix_ms: u64) -> Millis {
        Millis(unix_ms.saturating_sub(self.unix_origin_ms))
    }

    /// The monotonic instant of logical time `t` (for timers); `None` when it lies beyond
    /// what the platform's clock can represent (an effectively endless deadline).
    pub fn instant(&self, t: Millis) -> Option<Instant> {
        self.origin.checked_add(Duration::from_millis(t.0))
    }

    /// The fence as written to disk: its times in UNIX milliseconds.
    pub fn fence_to_disk(&self, fence: &Fence) -> Fence {
        let mut out = fence.clone();
        out.created_at = Millis(self.to_unix_ms(fence.created_at));
        out.reconcile_deadline = Millis(self.to_unix_ms(fence.reconcile_deadline));
        out.hard_expiry = fence.hard_expiry.map(|t| Millis(self.to_unix_ms(t)));
        out
    }

    /// A fence read from disk, in this driver's logical time, with the reconcile
    /// deadline recomputed as `now + reconcile_window_ms` (bounded by the hard expiry).
    pub fn fence_from_disk(&self, stored: &Fence, reconcile_window_ms: u64) -> Fence {
        let mut out = stored.clone();
        out.created_at = self.from_unix_ms(stored.created_at.0);
        out.hard_expiry = stored.hard_expiry.map(|t| self.from_unix_ms(t.0));
        let window = self.now().saturating_add(reconcile_window_ms);
        out.reconcile_deadline = out.hard_expiry.map_or(window, |h| window.min(h));
        out
    }
}

/// Milliseconds since the UNIX epoch (0 if the system clock is before it).
pub fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
