//! Logical time.
//!
//! The pure core never reads a clock. Runtimes pass the current time in as [`Millis`]
//! (milliseconds since an origin of their choosing, typically process start); the
//! simulator uses integer ticks of one millisecond.

use std::fmt;
use std::ops::{Add, Sub};

use serde::{Deserialize, Serialize};

/// A point in logical time, in milliseconds since the runtime's origin.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Millis(pub u64);

impl Millis {
    pub const ZERO: Millis = Millis(0);

    /// Time elapsed since `earlier`, saturating at zero when `earlier` is in the future.
    pub fn since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    pub fn saturating_add(self, ms: u64) -> Millis {
        Millis(self.0.saturating_add(ms))
    }
}

impl Add<u64> for Millis {
    type Output = Millis;
    fn add(self, ms: u64) -> Millis {
        self.saturating_add(ms)
    }
}

impl Sub<u64> for Millis {
    type Output = Millis;
    fn sub(self, ms: u64) -> Millis {
        Millis(self.0.saturating_sub(ms))
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// Rounds a non-negative cost in milliseconds up to whole milliseconds, the way the
/// simulator turns declared costs into delays. Negative, NaN and infinite inputs give 0
/// (non-finite costs are rejected at the edge; this keeps the simulator total).
pub fn ceil_ms(cost: f64) -> u64 {
    if cost.is_finite() && cost > 0.0 {
        cost.ceil() as u64
    } else {
        0
    }
}
