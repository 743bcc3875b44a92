//! OpenAI-style response ids: `chatcmpl-…` and `cmpl-…`.
//!
//! 24 hex digits: a per-process random salt (from std's randomly keyed hasher, so no
//! extra dependency) mixed with a process-wide counter. Unique within a process by the
//! counter, and unlikely to repeat across restarts by the salt. The same string is the
//! router's request id, so logs, decisions and the client's response line up.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh id with the given prefix (`"chatcmpl"`, `"cmpl"`).
pub fn next(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let salt = salt();
    let mut h = RandomState::new().build_hasher();
    h.write_u64(n);
    // 32 bits of salt, 32 bits of a hash of the counter (for looks), and the counter
    // itself in the last 32 bits (for uniqueness).
    format!(
        "{prefix}-{:08x}{:08x}{:08x}",
        salt as u32,
        h.finish() as u32,
        n as u32 ^ (salt >> 32) as u32
    )
}

fn salt() -> u64 {
    static SALT: OnceLock<u64> = OnceLock::new();
    *SALT.get_or_init(|| {
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(d.as_nanos());
        }
        h.finish()
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn ids_are_unique_and_prefixed() {
        let ids: BTreeSet<String> = (0..10_000).map(|_| next("chatcmpl")).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(
            ids.iter()
                .all(|i| i.starts_with("chatcmpl-") && i.len() == 9 + 24)
        );
    }
}
