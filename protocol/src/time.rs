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

/// `YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)` → UNIX ms.
pub fn rfc3339_unix_ms(s: &str) -> Option<u64> {
    let (date, time) = s.split_once(['T', 't'])?;
    let mut d = date.split('-');
    let (y, mo, da): (i64, u32, u32) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    if d.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&da) {
        return None;
    }
    let (clock, offset_s) = if let Some(c) = time.strip_suffix(['Z', 'z']) {
        (c, 0i64)
    } else {
        let at = time.rfind(['+', '-'])?;
        let (c, off) = time.split_at(at);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let (oh, om) = off.get(1..)?.split_once(':')?;
        let (oh, om): (i64, i64) = (oh.parse().ok()?, om.parse().ok()?);
        if oh > 23 || om > 59 {
            return None;
        }
        (c, sign * (oh * 3600 + om * 60))
    };
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, ""));
    let mut t = hms.split(':');
    let (h, mi, se): (i64, i64, i64) = (
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
    );
    if t.next().is_some() || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let ms: i64 = if frac.is_empty() {
        0
    } else if frac.bytes().all(|b| b.is_ascii_digit()) {
        let digits: String = frac.chars().chain("000".chars()).take(3).collect();
        digits.parse().ok()?
    } else {
        return None;
    };
    let secs = days_from_civil(y, mo, da) * 86_400 + h * 3600 + mi * 60 + se - offset_s;
    u64::try_from(secs.checked_mul(1000)?.checked_add(ms)?).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
