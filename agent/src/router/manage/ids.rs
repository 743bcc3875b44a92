//! Identifiers and timestamps of the management API.
//!
//! Instance, runner and command ids are UUID-shaped strings (Skulk uses UUID4): the
//! SHA-256 of a per-process seed and a counter, with the version and variant bits of a
//! random UUID. The seed mixes the router's start time and process id, so ids from two
//! router runs do not collide. Timestamps are ISO-8601 UTC strings like Skulk's
//! `lastSeen` (`2026-11-29T22:44:30.316Z`).

use sha2::{Digest, Sha256};

/// Generates UUID-shaped ids.
#[derive(Debug, Clone)]
pub struct IdGen {
    seed: [u8; 32],
    counter: u64,
}

impl IdGen {
    /// `seed` should differ between processes (start time, process id, name).
    pub fn new(seed: &str) -> IdGen {
        IdGen {
            seed: Sha256::digest(seed.as_bytes()).into(),
            counter: 0,
        }
    }

    /// The next id, e.g. `3f2b6c1e-8d4a-4e2f-9b1c-0a7d5e3f2c1b`.
    pub fn next_id(&mut self) -> String {
        self.counter = self.counter.wrapping_add(1);
        let mut h = Sha256::new();
        h.update(self.seed);
        h.update(self.counter.to_le_bytes());
        let d = h.finalize();
        let mut b = [0u8; 16];
        b.copy_from_slice(d.get(..16).unwrap_or(&[0u8; 16]));
        // Version 4, RFC 4122 variant. (Constant indices into a 16-byte array.)
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        let x = hex::encode(b);
        let part = |r: std::ops::Range<usize>| x.get(r).unwrap_or("");
        format!(
            "{}-{}-{}-{}-{}",
            part(0..8),
            part(8..12),
            part(12..16),
            part(16..20),
            part(20..32)
        )
    }
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn iso8601(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let ms = unix_ms % 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's algorithm, for non-negative day counts).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Now, in milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_uuid_shaped_and_distinct() {
        let mut a = IdGen::new("router-1");
        let mut b = IdGen::new("router-2");
        let x = a.next_id();
        let y = a.next_id();
        assert_ne!(x, y);
        assert_ne!(x, b.next_id());
        assert_eq!(x.len(), 36);
        assert_eq!(x.chars().nth(14), Some('4'));
        assert!(matches!(x.chars().nth(19), Some('8' | '9' | 'a' | 'b')));
    }

    #[test]
    fn timestamps_are_iso8601_utc() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(iso8601(1_798_590_270_316), "2026-12-30T00:24:30.316Z");
    }
}
