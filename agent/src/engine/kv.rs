//! Synthetic KV rows: a deterministic, model-free stand-in for the K and V a real model
//! would compute for a token at a position.
//!
//! Row bytes are a keyed pseudo-random stream: the key is SHA-256 over a domain string and
//! the model fingerprint (computed once per [`SyntheticKv`]); each row's seed mixes that
//! key with the absolute position and the token id through SplitMix64, and the row is the
//! SplitMix64 stream from that seed, 8 little-endian bytes at a time (the last word is
//! truncated when `row_bytes` is not a multiple of 8). Properties the tests rely on:
//! - the same (model, position, token) always gives the same bytes, on every host;
//! - changing any of the three changes the row (with overwhelming probability);
//! - generating is cheap (a few cycles per byte), so restores can be verified byte-exact
//!   against recomputation with [`verify_rows`].
//!
//! A real model's row depends on the whole prefix, not only on (position, token). The
//! chunk identity (a chained prefix hash) already makes equal (position, token) pairs
//! under different prefixes distinct chunks, so this simplification never lets a wrong
//! chunk verify.

use sha2::{Digest, Sha256};

use den_protocol::ids::ModelFingerprint;
use den_protocol::request::Token;

const KV_DOMAIN: &[u8] = b"den/synthetic-kv/v1";

/// A restored or captured row that is not what recomputation gives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error(
        "KV row at position {position} differs from recomputation: the restore is wrong, recompute it"
    )]
    Mismatch { position: u32 },
    #[error(
        "KV buffer is {got} bytes, which is not {tokens} whole rows: expected a multiple of the token count"
    )]
    Length { tokens: usize, got: usize },
}

/// A model's synthetic KV generator (holds the per-model key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntheticKv {
    key: [u64; 2],
}

impl SyntheticKv {
    pub fn new(model: &ModelFingerprint) -> Self {
        let mut h = Sha256::new();
        h.update(KV_DOMAIN);
        h.update((model.0.len() as u64).to_be_bytes());
        h.update(model.0.as_bytes());
        let d: [u8; 32] = h.finalize().into();
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&d[i..i + 8]);
            u64::from_le_bytes(b)
        };
        SyntheticKv {
            key: [word(0), word(8)],
        }
    }

    /// Writes the row of `token` at absolute `position` into `out` (its length is the row
    /// size).
    pub fn row_into(&self, position: u32, token: Token, out: &mut [u8]) {
        let mut state = self.seed(position, token);
        let mut words = out.chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&next(&mut state).to_le_bytes());
        }
        let tail = words.into_remainder();
        if !tail.is_empty() {
            let last = next(&mut state).to_le_bytes();
            let n = tail.len();
            tail.copy_from_slice(&last[..n]);
        }
    }

    /// The row of `token` at `position`, `row_bytes` long.
    pub fn row(&self, position: u32, token: Token, row_bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; row_bytes];
        self.row_into(position, token, &mut out);
        out
    }

    /// Writes the rows of `tokens` at positions `start, start + 1, …` into `out`,
    /// token-major; `out.len()` must be a whole number of rows per token.
    pub fn write_rows(
        &self,
        start: u32,
        tokens: &[Token],
        out: &mut [u8],
    ) -> Result<(), VerifyError> {
        let row_bytes = row_bytes_of(tokens.len(), out.len())?;
        if row_bytes == 0 {
            return Ok(());
        }
        for (i, (row, token)) in out.chunks_exact_mut(row_bytes).zip(tokens).enumerate() {
            self.row_into(start.wrapping_add(i as u32), *token, row);
        }
        Ok(())
    }

    /// The rows of `tokens` from position `start`, each `row_bytes` long.
    pub fn rows(&self, start: u32, tokens: &[Token], row_bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; tokens.len() * row_bytes];
        for (i, (row, token)) in out
            .chunks_exact_mut(row_bytes.max(1))
            .zip(tokens)
            .enumerate()
        {
            self.row_into(start.wrapping_add(i as u32), *token, row);
        }
        out
    }

    /// Checks `buffer` against recomputation without allocating; reports the first
    /// position that differs.
    pub fn verify_rows(
        &self,
        start: u32,
        tokens: &[Token],
        buffer: &[u8],
    ) -> Result<(), VerifyError> {
        let row_bytes = row_bytes_of(tokens.len(), buffer.len())?;
        if row_bytes == 0 {
            return Ok(());
        }
        for (i, (row, token)) in buffer.chunks_exact(row_bytes).zip(tokens).enumerate() {
            let position = start.wrapping_add(i as u32);
            if !self.row_matches(position, *token, row) {
                return Err(VerifyError::Mismatch { position });
            }
        }
        Ok(())
    }

    fn row_matches(&self, position: u32, token: Token, row: &[u8]) -> bool {
        let mut state = self.seed(position, token);
        let mut words = row.chunks_exact(8);
        for w in &mut words {
            if w != next(&mut state).to_le_bytes() {
                return false;
            }
        }
        let tail = words.remainder();
        tail.is_empty() || tail == &next(&mut state).to_le_bytes()[..tail.len()]
    }

    fn seed(&self, position: u32, token: Token) -> u64 {
        let mut s = self.key[0] ^ ((position as u64) << 32 | token as u64);
        let a = next(&mut s);
        let mut t = self.key[1] ^ a;
        next(&mut t)
    }
}

/// The row of `token` at `position` under `model` (see the module comment).
pub fn kv_row(model: &ModelFingerprint, position: u32, token: Token, row_bytes: usize) -> Vec<u8> {
    SyntheticKv::new(model).row(position, token, row_bytes)
}

/// Writes the rows of `tokens` from position `start` into `out` (token-major).
pub fn write_rows(
    model: &ModelFingerprint,
    start: u32,
    tokens: &[Token],
    out: &mut [u8],
) -> Result<(), VerifyError> {
    SyntheticKv::new(model).write_rows(start, tokens, out)
}

/// Checks a restored buffer byte-exact against recomputation; the row size is
/// `buffer.len() / tokens.len()`.
pub fn verify_rows(
    model: &ModelFingerprint,
    start: u32,
    tokens: &[Token],
    buffer: &[u8],
) -> Result<(), VerifyError> {
    SyntheticKv::new(model).verify_rows(start, tokens, buffer)
}

fn row_bytes_of(tokens: usize, len: usize) -> Result<usize, VerifyError> {
    if tokens == 0 {
        return if len == 0 {
            Ok(0)
        } else {
            Err(VerifyError::Length { tokens, got: len })
        };
    }
    if !len.is_multiple_of(tokens) {
        return Err(VerifyError::Length { tokens, got: len });
    }
    Ok(len / tokens)
}

/// SplitMix64: advances `state` and returns the next output.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> ModelFingerprint {
        ModelFingerprint::from(s)
    }

    #[test]
    fn rows_are_deterministic_and_keyed_by_model_position_and_token() {
        let a = kv_row(&m("llama"), 5, 42, 100);
        assert_eq!(a.len(), 100);
        assert_eq!(a, kv_row(&m("llama"), 5, 42, 100));
        assert_ne!(a, kv_row(&m("gemma"), 5, 42, 100));
        assert_ne!(a, kv_row(&m("llama"), 6, 42, 100));
        assert_ne!(a, kv_row(&m("llama"), 5, 43, 100));
        // A shorter row is a prefix of the longer one (same stream).
        assert_eq!(kv_row(&m("llama"), 5, 42, 13), a[..13]);
        // Not trivially constant.
        assert!(a.iter().any(|b| *b != a[0]));
    }

    #[test]
    fn write_rows_matches_row_by_row_and_verifies() {
        let kv = SyntheticKv::new(&m("x"));
        let tokens = [7, 7, 9, 1];
        let mut buf = vec![0u8; 4 * 36];
        kv.write_rows(10, &tokens, &mut buf).unwrap();
        for (i, t) in tokens.iter().enumerate() {
            assert_eq!(buf[i * 36..(i + 1) * 36], kv.row(10 + i as u32, *t, 36));
        }
        assert_eq!(kv.rows(10, &tokens, 36), buf);
        assert_eq!(verify_rows(&m("x"), 10, &tokens, &buf), Ok(()));
        // One flipped byte in the third row names its position.
        buf[2 * 36 + 35] ^= 1;
        assert_eq!(
            verify_rows(&m("x"), 10, &tokens, &buf),
            Err(VerifyError::Mismatch { position: 12 })
        );
        // Rows verified at the wrong start position fail at once.
        buf[2 * 36 + 35] ^= 1;
        assert_eq!(
            kv.verify_rows(11, &tokens, &buf),
            Err(VerifyError::Mismatch { position: 11 })
        );
        assert!(matches!(
            kv.verify_rows(10, &tokens, &buf[1..]),
            Err(VerifyError::Length { tokens: 4, .. })
        ));
        assert_eq!(kv.verify_rows(0, &[], &[]), Ok(()));
    }
}
