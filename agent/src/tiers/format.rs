//! The stored form of a chunk: a self-describing header, then the payload.
//!
//! Every tier stores exactly these bytes, so a chunk copied between tiers (or found in a
//! bucket by another worker) is checked the same way everywhere. All integers are
//! big-endian.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "DENCHUNK"
//!      8     2  format version (1)
//!     10     2  header length in bytes (everything before the payload)
//!     12     4  start: absolute position of the chunk's first token
//!     16     4  token count
//!     20     8  row bytes (one token row, all layers' K and V)
//!     28     8  payload length (= token count × row bytes)
//!     36    16  prefix hash (den_protocol::chunk::PrefixHash of this chunk)
//!     52    16  parent hash (all zeros at the root)
//!     68    32  SHA-256 of the payload (the content hash)
//!    100     2  model fingerprint length m
//!    102     m  model fingerprint, UTF-8
//!  102+m     8  header checksum: first 8 bytes of SHA-256(domain ‖ bytes 0..102+m)
//!  110+m     …  payload: token rows, token-major (row of `start`, then `start + 1`, …)
//! ```
//!
//! Reading recomputes the header checksum, checks that the header names the requested
//! catalog key, that lengths agree, and recomputes the payload's SHA-256. Any difference
//! is [`TierError::Corrupt`]: the caller recomputes; wrong KV is never returned.

use std::fmt;
use std::ops::Range;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use den_protocol::candidate::Tier;
use den_protocol::chunk::{ChunkDescriptor, PrefixHash};
use den_protocol::ids::ModelFingerprint;

use crate::tiers::{ChunkKey, TierError};

pub const MAGIC: &[u8; 8] = b"DENCHUNK";
pub const FORMAT_VERSION: u16 = 1;
const HEADER_DOMAIN: &[u8] = b"den/chunk-header/v1";
const FIXED: usize = 102;
const CHECKSUM: usize = 8;

/// SHA-256 of a chunk's payload: the chunk's physical identity.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    pub fn of(payload: &[u8]) -> Self {
        ContentHash(Sha256::digest(payload).into())
    }
}

impl fmt::Display for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentHash({self})")
    }
}

/// What a chunk is: its model, its place in the prefix chain and its row geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkMeta {
    pub model: ModelFingerprint,
    pub prefix: PrefixHash,
    pub parent: PrefixHash,
    pub start: u32,
    pub token_count: u32,
    pub row_bytes: u64,
}

impl ChunkMeta {
    /// The meta of a planned chunk (see `den_protocol::chunk::plan_chunks`).
    pub fn for_descriptor(model: &ModelFingerprint, d: &ChunkDescriptor, row_bytes: u64) -> Self {
        ChunkMeta {
            model: model.clone(),
            prefix: d.hash,
            parent: d.parent,
            start: d.start,
            token_count: d.token_count,
            row_bytes,
        }
    }

    /// The catalog key (model + prefix hash) the chunk is stored under.
    pub fn key(&self) -> ChunkKey {
        ChunkKey::of(&self.model, self.prefix)
    }

    pub fn payload_bytes(&self) -> u64 {
        self.token_count as u64 * self.row_bytes
    }

    /// Whether this is the chunk the plan expects (prefix, parent, start, count), so a
    /// stored chunk under the right key but with a different place in the chain is refused.
    pub fn matches(&self, d: &ChunkDescriptor) -> bool {
        self.prefix == d.hash
            && self.parent == d.parent
            && self.start == d.start
            && self.token_count == d.token_count
    }
}

/// A chunk: meta plus its token-major payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub meta: ChunkMeta,
    pub payload: Bytes,
}

impl Chunk {
    /// Checks that the payload is `token_count × row_bytes` bytes and the model name fits
    /// the header.
    pub fn new(meta: ChunkMeta, payload: impl Into<Bytes>) -> Result<Self, TierError> {
        let payload = payload.into();
        if payload.len() as u64 != meta.payload_bytes() {
            return Err(TierError::InvalidChunk(format!(
                "payload is {} bytes but {} tokens × {} bytes per row is {}",
                payload.len(),
                meta.token_count,
                meta.row_bytes,
                meta.payload_bytes()
            )));
        }
        if meta.model.0.trim().is_empty()
            || meta.model.0.len() > usize::from(u16::MAX) - FIXED - CHECKSUM
        {
            return Err(TierError::InvalidChunk(format!(
                "model fingerprint must be non-blank and under 64 KiB (got {} bytes)",
                meta.model.0.len()
            )));
        }
        Ok(Chunk { meta, payload })
    }

    pub fn key(&self) -> ChunkKey {
        self.meta.key()
    }

    pub fn content_hash(&self) -> ContentHash {
        ContentHash::of(&self.payload)
    }

    /// Header length for this chunk's model name.
    pub fn header_len(&self) -> usize {
        FIXED + self.meta.model.0.len() + CHECKSUM
    }

    /// The stored bytes: header then payload. Also returns the content hash.
    pub fn encode(&self) -> (Vec<u8>, ContentHash) {
        let hash = self.content_hash();
        let m = &self.meta;
        let header_len = self.header_len();
        let mut out = Vec::with_capacity(header_len + self.payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
        // Chunk::new bounds the model length so the header length fits u16.
        out.extend_from_slice(&(header_len as u16).to_be_bytes());
        out.extend_from_slice(&m.start.to_be_bytes());
        out.extend_from_slice(&m.token_count.to_be_bytes());
        out.extend_from_slice(&m.row_bytes.to_be_bytes());
        out.extend_from_slice(&(self.payload.len() as u64).to_be_bytes());
        out.extend_from_slice(&m.prefix.0);
        out.extend_from_slice(&m.parent.0);
        out.extend_from_slice(&hash.0);
        out.extend_from_slice(&(m.model.0.len() as u16).to_be_bytes());
        out.extend_from_slice(m.model.0.as_bytes());
        let sum = header_checksum(&out);
        out.extend_from_slice(&sum);
        out.extend_from_slice(&self.payload);
        (out, hash)
    }
}

/// A stored chunk that passed every check: its meta, content hash, and where its payload
/// lies in the bytes that were decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub meta: ChunkMeta,
    pub content_hash: ContentHash,
    pub payload: Range<usize>,
}

/// Decodes and verifies stored bytes that should hold the chunk `key`. Works on any
/// slice (a memory map, a downloaded object) without copying the payload.
pub fn decode(tier: Tier, key: ChunkKey, bytes: &[u8]) -> Result<Verified, TierError> {
    let corrupt = |field: &'static str, expected: String, got: String| TierError::Corrupt {
        tier,
        key,
        field,
        expected,
        got,
    };
    let Some(fixed) = bytes.get(..FIXED) else {
        return Err(corrupt(
            "length",
            format!("at least {FIXED} bytes"),
            bytes.len().to_string(),
        ));
    };
    let r = Reader(fixed);
    if r.array::<8>(0) != *MAGIC {
        return Err(corrupt(
            "magic",
            "DENCHUNK".into(),
            hex::encode(r.array::<8>(0)),
        ));
    }
    let version = u16::from_be_bytes(r.array(8));
    if version != FORMAT_VERSION {
        return Err(corrupt(
            "format version",
            FORMAT_VERSION.to_string(),
            version.to_string(),
        ));
    }
    let header_len = usize::from(u16::from_be_bytes(r.array(10)));
    let model_len = usize::from(u16::from_be_bytes(r.array(100)));
    if header_len != FIXED + model_len + CHECKSUM || bytes.len() < header_len {
        return Err(corrupt(
            "header length",
            format!("{} (model {model_len} bytes)", FIXED + model_len + CHECKSUM),
            format!("{header_len} of {} stored bytes", bytes.len()),
        ));
    }
    // header_len ≤ bytes.len() was checked just above.
    let (Some(head), Some(sum)) = (
        bytes.get(..FIXED + model_len),
        bytes.get(FIXED + model_len..header_len),
    ) else {
        return Err(corrupt(
            "header length",
            header_len.to_string(),
            bytes.len().to_string(),
        ));
    };
    let want = header_checksum(head);
    if sum != want {
        return Err(corrupt(
            "header checksum",
            hex::encode(want),
            hex::encode(sum),
        ));
    }
    let model = std::str::from_utf8(&head[FIXED..])
        .map_err(|_| corrupt("model fingerprint", "UTF-8".into(), "invalid UTF-8".into()))?;
    let meta = ChunkMeta {
        model: ModelFingerprint::from(model),
        prefix: PrefixHash(r.array(36)),
        parent: PrefixHash(r.array(52)),
        start: u32::from_be_bytes(r.array(12)),
        token_count: u32::from_be_bytes(r.array(16)),
        row_bytes: u64::from_be_bytes(r.array(20)),
    };
    if meta.key() != key {
        return Err(corrupt(
            "catalog key",
            key.to_string(),
            meta.key().to_string(),
        ));
    }
    let payload_len = u64::from_be_bytes(r.array(28));
    let stored = (bytes.len() - header_len) as u64;
    if payload_len != meta.payload_bytes() || payload_len != stored {
        return Err(corrupt(
            "payload length",
            format!(
                "{} ({} tokens × {} B)",
                meta.payload_bytes(),
                meta.token_count,
                meta.row_bytes
            ),
            format!("{payload_len} declared, {stored} stored"),
        ));
    }
    let expected = ContentHash(r.array(68));
    let payload = header_len..bytes.len();
    let got = ContentHash::of(bytes.get(payload.clone()).unwrap_or_default());
    if got != expected {
        return Err(corrupt(
            "content sha256",
            expected.to_string(),
            got.to_string(),
        ));
    }
    Ok(Verified {
        meta,
        content_hash: expected,
        payload,
    })
}

/// Decodes owned bytes into a chunk whose payload shares the buffer (no copy).
pub fn decode_bytes(
    tier: Tier,
    key: ChunkKey,
    bytes: Bytes,
) -> Result<(Chunk, ContentHash), TierError> {
    let v = decode(tier, key, &bytes)?;
    let payload = bytes.slice(v.payload);
    Ok((
        Chunk {
            meta: v.meta,
            payload,
        },
        v.content_hash,
    ))
}

fn header_checksum(head: &[u8]) -> [u8; CHECKSUM] {
    let mut h = Sha256::new();
    h.update(HEADER_DOMAIN);
    h.update(head);
    let d: [u8; 32] = h.finalize().into();
    let mut out = [0u8; CHECKSUM];
    out.copy_from_slice(&d[..CHECKSUM]);
    out
}

/// Fixed-offset reads from the fixed part of the header (always `FIXED` bytes long).
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        // Every call site reads inside the FIXED-byte prefix, which `decode` checked.
        if let Some(s) = self.0.get(at..at + N) {
            out.copy_from_slice(s);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk() -> Chunk {
        let meta = ChunkMeta {
            model: ModelFingerprint::from("model-a"),
            prefix: PrefixHash([7; 16]),
            parent: PrefixHash([3; 16]),
            start: 256,
            token_count: 4,
            row_bytes: 10,
        };
        Chunk::new(meta, (0..40u8).collect::<Vec<u8>>()).unwrap()
    }

    #[test]
    fn encode_decode_round_trip_shares_the_payload() {
        let c = chunk();
        let (bytes, hash) = c.encode();
        assert_eq!(bytes.len(), c.header_len() + 40);
        assert_eq!(&bytes[..8], MAGIC);
        let (back, h2) = decode_bytes(Tier::Ram, c.key(), Bytes::from(bytes)).unwrap();
        assert_eq!(back, c);
        assert_eq!(hash, h2);
        assert_eq!(hash, ContentHash::of(&c.payload));
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let c = chunk();
        let (bytes, _) = c.encode();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            assert!(
                matches!(
                    decode(Tier::Ssd, c.key(), &bad),
                    Err(TierError::Corrupt { .. })
                ),
                "flip at byte {i} was not detected"
            );
        }
        assert!(matches!(
            decode(Tier::Ssd, c.key(), &bytes[..bytes.len() - 1]),
            Err(TierError::Corrupt {
                field: "payload length",
                ..
            })
        ));
        assert!(matches!(
            decode(Tier::Ssd, c.key(), &bytes[..50]),
            Err(TierError::Corrupt {
                field: "length",
                ..
            })
        ));
    }

    #[test]
    fn a_chunk_under_another_key_is_refused() {
        let c = chunk();
        let (bytes, _) = c.encode();
        let other = ChunkKey::of(&ModelFingerprint::from("model-b"), c.meta.prefix);
        let e = decode(Tier::Object, other, &bytes).unwrap_err();
        assert!(matches!(
            e,
            TierError::Corrupt {
                field: "catalog key",
                ..
            }
        ));
        assert!(e.means_recompute());
    }

    #[test]
    fn payload_length_and_model_are_checked_at_construction() {
        let mut meta = chunk().meta;
        assert!(Chunk::new(meta.clone(), vec![0u8; 39]).is_err());
        meta.model = ModelFingerprint::from("  ");
        assert!(Chunk::new(meta, vec![0u8; 40]).is_err());
    }

    #[test]
    fn meta_matches_its_descriptor() {
        let tokens: Vec<u32> = (0..8).collect();
        let plan = den_protocol::chunk::plan_chunks(&tokens, 4);
        let m = ModelFingerprint::from("m");
        let meta = ChunkMeta::for_descriptor(&m, &plan[1], 16);
        assert!(meta.matches(&plan[1]));
        assert!(!meta.matches(&plan[0]));
        assert_eq!(meta.key(), ChunkKey::of(&m, plan[1].hash));
    }
}
