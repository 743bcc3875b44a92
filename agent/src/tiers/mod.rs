//! Chunk storage tiers below the GPU: `ram`, `ssd` (files read through memmap2) and
//! `object` (any object_store backend: S3-compatible, local file system, memory).
//!
//! # Identity
//!
//! A chunk is stored under its **catalog key** ([`ChunkKey`]: SHA-256 over the model
//! fingerprint and the chunk's chained prefix hash, `den_protocol::chunk::catalog_key`),
//! so the same tokens under two models never share an entry. The stored object is
//! self-describing (see [`mod@format`]): a header with magic, format version, model
//! fingerprint, prefix and parent hash, start, token count and row bytes, plus the SHA-256
//! of the payload (the content hash, the chunk's physical identity).
//!
//! # Contract of every tier
//!
//! - `put` returns a [`Receipt`] only after the bytes are durable *in that tier*: in the
//!   map for `ram`; written, fsynced and atomically renamed (and the directory fsynced) for
//!   `ssd`; a completed PUT for `object` (with fsync for `file://`). A chunk is advertised
//!   only after its receipt.
//! - `get` returns the chunk only after recomputing the header checksum and the payload's
//!   SHA-256. A missing chunk is [`TierError::Missing`], a damaged one
//!   [`TierError::Corrupt`]; the worker turns both into recompute, never into wrong KV.
//! - Capacity-bounded tiers (`ram`, `ssd`) evict least recently used chunks to make room
//!   and list the evicted keys in the receipt so the catalog can be told.
//! - Every `get` and `put` is measured; [`IoTotals`] keeps bytes, time and a bytes/ms EWMA
//!   per direction for the cost model's tier throughput (spec §6.2).
//!
//! Methods take `&self` and return boxed futures so that tiers can be shared
//! (`Arc<dyn ChunkStore>`) across tasks; blocking file work runs on tokio's blocking pool.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use den_protocol::calibration::Ewma;
use den_protocol::candidate::Tier;
use den_protocol::chunk::{PrefixHash, catalog_key};
use den_protocol::ids::ModelFingerprint;

pub mod format;
mod lru;
pub mod object;
pub mod ram;
pub mod ssd;
pub mod url;

pub use format::{Chunk, ChunkMeta, ContentHash};
pub use object::ObjectTier;
pub use ram::RamTier;
pub use ssd::SsdTier;
pub use url::{ObjectConfig, ObjectUrl, S3Settings, Secret, UrlError};

/// A boxed, sendable future (keeps [`ChunkStore`] object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The key a chunk is stored under: its catalog key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkKey(pub PrefixHash);

impl ChunkKey {
    pub fn of(model: &ModelFingerprint, prefix: PrefixHash) -> Self {
        ChunkKey(catalog_key(model, prefix))
    }

    /// 32 lowercase hex digits, no hyphens: the file and object name.
    pub fn hex(&self) -> String {
        hex::encode(self.0.0)
    }

    /// Parses [`ChunkKey::hex`] output (or a hyphenated UUID form).
    pub fn parse(s: &str) -> Option<Self> {
        s.parse::<PrefixHash>().ok().map(ChunkKey)
    }
}

impl fmt::Display for ChunkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for ChunkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkKey({})", self.0)
    }
}

/// Proof that a chunk is durable in a tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub tier: Tier,
    pub key: ChunkKey,
    pub content_hash: ContentHash,
    /// Bytes stored (header + payload).
    pub stored_bytes: u64,
    /// False when an intact copy was already there and nothing was written (first writer
    /// wins; `content_hash` is then the stored copy's).
    pub fresh: bool,
    /// Chunks evicted to make room; tell the catalog they are gone from this tier.
    pub evicted: Vec<ChunkKey>,
    pub io: IoSample,
}

/// One measured operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IoSample {
    pub bytes: u64,
    pub elapsed: Duration,
}

impl IoSample {
    pub fn bytes_per_ms(&self) -> Option<f64> {
        let ms = self.elapsed.as_secs_f64() * 1e3;
        (self.bytes > 0 && ms > 0.0).then(|| self.bytes as f64 / ms)
    }
}

/// Bytes and chunk count held by a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Usage {
    pub bytes: u64,
    pub count: u64,
    /// Capacity in bytes, when the tier has one.
    pub capacity: Option<u64>,
}

/// Running totals of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct IoDirection {
    pub bytes: u64,
    pub elapsed_ns: u64,
    pub count: u64,
    /// EWMA of per-operation throughput in bytes/ms.
    pub bytes_per_ms: Ewma,
}

impl IoDirection {
    fn record(&mut self, s: IoSample) {
        self.bytes = self.bytes.saturating_add(s.bytes);
        self.elapsed_ns = self
            .elapsed_ns
            .saturating_add(u64::try_from(s.elapsed.as_nanos()).unwrap_or(u64::MAX));
        self.count += 1;
        if let Some(rate) = s.bytes_per_ms() {
            self.bytes_per_ms.observe(rate);
        }
    }
}

/// Per-tier I/O totals.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct IoTotals {
    /// Successful, verified gets.
    pub reads: IoDirection,
    /// Puts that returned a receipt.
    pub writes: IoDirection,
    pub misses: u64,
    pub corrupt: u64,
    pub evictions: u64,
}

/// Shared bookkeeping for [`IoTotals`] (a tier records from many tasks).
#[derive(Debug, Default)]
pub(crate) struct IoMeter(Mutex<IoTotals>);

impl IoMeter {
    pub(crate) fn snapshot(&self) -> IoTotals {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn read(&self, s: IoSample) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reads
            .record(s);
    }

    pub(crate) fn write(&self, s: IoSample, evicted: usize) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        t.writes.record(s);
        t.evictions += evicted as u64;
    }

    /// Counts a failed get by kind.
    pub(crate) fn failed<T>(&self, r: &Result<T, TierError>) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match r {
            Err(TierError::Missing { .. }) => t.misses += 1,
            Err(TierError::Corrupt { .. }) => t.corrupt += 1,
            _ => {}
        }
    }
}

/// A storage tier for chunks. See the module comment for the contract.
pub trait ChunkStore: Send + Sync {
    /// `Tier::Ram`, `Tier::Ssd` or `Tier::Object`.
    fn tier(&self) -> Tier;

    /// One line for logs: kind and location, never credentials.
    fn describe(&self) -> String;

    /// Stores `chunk`; the receipt comes back only once the bytes are durable here.
    fn put<'a>(&'a self, chunk: &'a Chunk) -> BoxFuture<'a, Result<Receipt, TierError>>;

    /// The verified chunk stored under `key`.
    fn get(&self, key: ChunkKey) -> BoxFuture<'_, Result<Chunk, TierError>>;

    /// Whether something is stored under `key` (not verified).
    fn contains(&self, key: ChunkKey) -> BoxFuture<'_, Result<bool, TierError>>;

    /// Removes `key`; true when something was removed.
    fn delete(&self, key: ChunkKey) -> BoxFuture<'_, Result<bool, TierError>>;

    fn usage(&self) -> BoxFuture<'_, Result<Usage, TierError>>;

    fn io_totals(&self) -> IoTotals;
}

/// Why a tier operation failed. Messages say what was wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TierError {
    #[error("chunk {key} is not in the {} tier; recompute it", tier.as_str())]
    Missing { tier: Tier, key: ChunkKey },
    #[error(
        "chunk {key} in the {} tier is corrupt: {field} should be {expected} but is {got}; recompute it",
        tier.as_str()
    )]
    Corrupt {
        tier: Tier,
        key: ChunkKey,
        field: &'static str,
        expected: String,
        got: String,
    },
    #[error(
        "chunk {key} is {bytes} bytes, more than the {} tier's whole capacity of {capacity} bytes; raise the capacity",
        tier.as_str()
    )]
    TooLarge {
        tier: Tier,
        key: ChunkKey,
        bytes: u64,
        capacity: u64,
    },
    #[error("invalid chunk: {0}")]
    InvalidChunk(String),
    #[error("{} tier: {op} {location} failed: {message}", tier.as_str())]
    Io {
        tier: Tier,
        op: &'static str,
        location: String,
        message: String,
    },
    #[error("object store configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Url(#[from] UrlError),
}

impl TierError {
    /// True for a missing or corrupt chunk: the caller must recompute the chunk (and, for
    /// a catalog entry, withdraw the replica). Other errors are failures of the tier.
    pub fn means_recompute(&self) -> bool {
        matches!(self, TierError::Missing { .. } | TierError::Corrupt { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_catalog_keys_and_print_as_hex_names() {
        let m = ModelFingerprint::from("m");
        let p = PrefixHash([1; 16]);
        let k = ChunkKey::of(&m, p);
        assert_eq!(k.0, catalog_key(&m, p));
        assert_eq!(k.hex().len(), 32);
        assert_eq!(ChunkKey::parse(&k.hex()), Some(k));
        assert_eq!(ChunkKey::parse("nope"), None);
    }

    #[test]
    fn errors_say_what_to_do() {
        let key = ChunkKey(PrefixHash([2; 16]));
        let e = TierError::Missing {
            tier: Tier::Ssd,
            key,
        };
        assert!(e.to_string().contains("ssd tier") && e.to_string().contains("recompute"));
        assert!(e.means_recompute());
        let io = TierError::Io {
            tier: Tier::Object,
            op: "put",
            location: "s3://b/x".into(),
            message: "timeout".into(),
        };
        assert!(!io.means_recompute());
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::future::Future;

    use den_protocol::chunk::PrefixHash;
    use den_protocol::ids::ModelFingerprint;

    use crate::engine::SyntheticKv;
    use crate::tiers::{Chunk, ChunkMeta};

    /// A chunk of `tokens` synthetic rows; `n` makes its tokens (and prefix) distinct.
    pub(crate) fn chunk(model: &str, n: u32, tokens: u32, row_bytes: u64) -> Chunk {
        let model = ModelFingerprint::from(model);
        let toks: Vec<u32> = (0..tokens).map(|i| n * 1_000 + i).collect();
        let prefix = PrefixHash::chain(PrefixHash::ROOT, &toks);
        let payload = SyntheticKv::new(&model).rows(0, &toks, row_bytes as usize);
        let meta = ChunkMeta {
            model,
            prefix,
            parent: PrefixHash::ROOT,
            start: 0,
            token_count: tokens,
            row_bytes,
        };
        Chunk::new(meta, payload).expect("valid test chunk")
    }

    pub(crate) fn run<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("test runtime")
            .block_on(f)
    }
}
