//! Chunk identity: a chained prefix hash at a fixed chunk size (spec §8.1).
//!
//! The prefix hash of chunk *i* is SHA-256 over a domain string, the parent hash (16 zero
//! bytes at the root), the chunk's token count as u64 big-endian and every token as u64
//! big-endian, truncated to 128 bits with RFC 4122 version-5 and variant bits. Fixed-width
//! encoding rules out concatenation ambiguity; chaining means equal suffixes under
//! different prefixes never alias. The model is *not* in the chain: it enters through the
//! catalog key ([`catalog_key`]), so the same tokens under two models share a prefix hash
//! but never a catalog entry.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::ids::ModelFingerprint;
use crate::request::Token;

const PREFIX_DOMAIN: &[u8] = b"den/prefix-chain/v1";
const CATALOG_DOMAIN: &[u8] = b"den/catalog-key/v1";

/// Default chunk size in processed tokens.
pub const DEFAULT_CHUNK_SIZE: u32 = 256;

/// How many chunk fetches a worker's restore keeps in flight at once. A worker fetches a
/// restore's chunks concurrently, off its device thread, so a tier's per-fetch latency
/// overlaps the other fetches instead of adding up per chunk; the router prices restores
/// by the same number (`candidate_generation`).
pub const RESTORE_FETCH_WINDOW: usize = 32;

/// A 128-bit chained prefix hash, displayed as a hyphenated UUID.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PrefixHash(pub [u8; 16]);

impl PrefixHash {
    pub const ROOT: PrefixHash = PrefixHash([0; 16]);

    /// The hash of the chunk `tokens` following `parent`.
    pub fn chain(parent: PrefixHash, tokens: &[Token]) -> PrefixHash {
        let mut h = Sha256::new();
        h.update(PREFIX_DOMAIN);
        h.update(parent.0);
        h.update((tokens.len() as u64).to_be_bytes());
        for t in tokens {
            h.update((*t as u64).to_be_bytes());
        }
        uuid_v5_bits(h.finalize().into())
    }
}

impl fmt::Display for PrefixHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = hex::encode(self.0);
        write!(
            f,
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }
}

impl fmt::Debug for PrefixHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrefixHash({self})")
    }
}

/// A prefix hash that is not 32 hex digits (hyphens allowed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid prefix hash {0:?}: expected 32 hex digits, optionally hyphenated like a UUID")]
pub struct PrefixHashError(pub String);

impl FromStr for PrefixHash {
    type Err = PrefixHashError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits: String = s.chars().filter(|c| *c != '-').collect();
        let mut out = [0u8; 16];
        match hex::decode_to_slice(&digits, &mut out) {
            Ok(()) => Ok(PrefixHash(out)),
            Err(_) => Err(PrefixHashError(s.to_owned())),
        }
    }
}

impl Serialize for PrefixHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PrefixHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One planned chunk of a request's processed prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkDescriptor {
    pub index: u32,
    pub start: u32,
    pub token_count: u32,
    pub parent: PrefixHash,
    pub hash: PrefixHash,
}

impl ChunkDescriptor {
    /// Tokens covered from the start of the prefix through the end of this chunk.
    pub fn end(&self) -> u32 {
        self.start + self.token_count
    }
}

/// Plan the exact chunk chain over `processed` (the prompt without its pending token).
/// The last chunk may be shorter than `chunk_size`. A zero chunk size is treated as 1.
pub fn plan_chunks(processed: &[Token], chunk_size: u32) -> Vec<ChunkDescriptor> {
    let size = chunk_size.max(1) as usize;
    let mut parent = PrefixHash::ROOT;
    processed
        .chunks(size)
        .enumerate()
        .map(|(i, tokens)| {
            let hash = PrefixHash::chain(parent, tokens);
            let d = ChunkDescriptor {
                index: i as u32,
                start: (i * size) as u32,
                token_count: tokens.len() as u32,
                parent,
                hash,
            };
            parent = hash;
            d
        })
        .collect()
}

/// The catalog key of a chunk: SHA-256 over a domain, the model fingerprint and the
/// prefix hash. Two models never share a catalog entry for equal tokens.
pub fn catalog_key(model: &ModelFingerprint, hash: PrefixHash) -> PrefixHash {
    let mut h = Sha256::new();
    h.update(CATALOG_DOMAIN);
    h.update((model.0.len() as u64).to_be_bytes());
    h.update(model.0.as_bytes());
    h.update(hash.0);
    uuid_v5_bits(h.finalize().into())
}

fn uuid_v5_bits(digest: [u8; 32]) -> PrefixHash {
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    out[6] = (out[6] & 0x0f) | 0x50;
    out[8] = (out[8] & 0x3f) | 0x80;
    PrefixHash(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_are_prefix_stable_and_suffix_distinct() {
        let a = plan_chunks(&[1, 2, 3, 4, 5, 6], 2);
        let b = plan_chunks(&[1, 2, 3, 4, 9, 9], 2);
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].hash, b[0].hash);
        assert_eq!(a[1].hash, b[1].hash);
        assert_ne!(a[2].hash, b[2].hash);
        // Equal suffix under a different prefix does not alias.
        let c = plan_chunks(&[7, 7, 3, 4], 2);
        assert_ne!(c[1].hash, a[1].hash);
        assert_eq!(a[1].parent, a[0].hash);
        assert_eq!(a[0].parent, PrefixHash::ROOT);
    }

    #[test]
    fn last_chunk_may_be_short_and_counts_disambiguate() {
        let a = plan_chunks(&[1, 2, 3], 2);
        assert_eq!((a[1].start, a[1].token_count, a[1].end()), (2, 1, 3));
        // [0] vs [0, 0]: the token count is part of the hash.
        assert_ne!(
            PrefixHash::chain(PrefixHash::ROOT, &[0]),
            PrefixHash::chain(PrefixHash::ROOT, &[0, 0])
        );
    }

    #[test]
    fn hashes_are_uuid_v5_shaped_and_round_trip() {
        let h = plan_chunks(&[1, 2], 2)[0].hash;
        let s = h.to_string();
        assert_eq!(s.len(), 36);
        assert_eq!(&s[14..15], "5");
        assert_eq!(s.parse::<PrefixHash>().unwrap(), h);
        assert_eq!(
            serde_json::from_str::<PrefixHash>(&serde_json::to_string(&h).unwrap()).unwrap(),
            h
        );
        assert!("xyz".parse::<PrefixHash>().is_err());
    }

    #[test]
    fn model_identity_enters_the_catalog_key_not_the_chain() {
        let h = plan_chunks(&[1, 2], 2)[0].hash;
        let a = catalog_key(&ModelFingerprint::from("a"), h);
        let b = catalog_key(&ModelFingerprint::from("b"), h);
        assert_ne!(a, b);
    }
}
