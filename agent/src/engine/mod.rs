//! The synthetic execution engine's data and cost model. **Model-free**: no weights, no
//! attention, no sampling. It produces deterministic stand-ins for what a model would
//! produce, so that every other part of den (page pool, tiers, restores, routing, the
//! OpenAI ingress) runs for real and can be checked exactly:
//!
//! - [`kv`]: the KV row of (model, position, token), written into page buffers by
//!   "prefill" and checked byte-exact after every restore ([`verify_rows`]);
//! - [`output_token`]: the token a "decode" step emits, a deterministic function of the
//!   model, the prompt context and the output index (greedy, so sampling parameters are
//!   carried but not applied);
//! - [`tokenizer`]: a reversible word/byte tokenizer for text requests;
//! - [`costs`]: the declared per-token costs the execution queue spends.
//!
//! The execution loop itself (queues, lanes, cancellation) is not here.

use sha2::{Digest, Sha256};

use den_protocol::chunk::PrefixHash;
use den_protocol::ids::ModelFingerprint;
use den_protocol::request::Token;

pub mod costs;
pub mod kv;
pub mod tokenizer;

pub use costs::{CostError, EngineCosts};
pub use kv::{SyntheticKv, VerifyError, kv_row, verify_rows, write_rows};
pub use tokenizer::{VOCAB_SIZE, WORDS, detokenize, tokenize};

const OUTPUT_DOMAIN: &[u8] = b"den/synthetic-output/v1";

/// The context an output stream is a function of: the chained prefix hash of the whole
/// prompt taken as one chunk (independent of the chunk size used for caching).
pub fn context_hash(prompt: &[Token]) -> PrefixHash {
    PrefixHash::chain(PrefixHash::ROOT, prompt)
}

/// The `index`-th output token (0-based) for a prompt with context `context` under
/// `model`. Always inside the tokenizer's vocabulary: mostly `" word"` tokens, with a
/// period or comma about one time in sixteen, so detokenized output reads as text.
pub fn output_token(model: &ModelFingerprint, context: PrefixHash, index: u32) -> Token {
    let mut h = Sha256::new();
    h.update(OUTPUT_DOMAIN);
    h.update((model.0.len() as u64).to_be_bytes());
    h.update(model.0.as_bytes());
    h.update(context.0);
    h.update(index.to_be_bytes());
    let d: [u8; 32] = h.finalize().into();
    let r = u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
    let words = WORDS.len() as u64;
    match r % 16 {
        0 if index > 0 => {
            if r & 16 == 0 {
                b'.' as Token
            } else {
                b',' as Token
            }
        }
        _ => (256 + words + (r >> 8) % words) as Token,
    }
}

/// The first `n` output tokens for `prompt`.
pub fn generate(model: &ModelFingerprint, prompt: &[Token], n: u32) -> Vec<Token> {
    let context = context_hash(prompt);
    (0..n).map(|i| output_token(model, context, i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_deterministic_in_vocabulary_and_depends_on_everything() {
        let m = ModelFingerprint::from("m");
        let a = generate(&m, &[1, 2, 3], 64);
        assert_eq!(a, generate(&m, &[1, 2, 3], 64));
        assert!(a.iter().all(|t| *t < VOCAB_SIZE));
        assert_ne!(a, generate(&m, &[1, 2, 4], 64));
        assert_ne!(a, generate(&ModelFingerprint::from("n"), &[1, 2, 3], 64));
        // Streams are prefix-stable: asking for fewer tokens gives a prefix.
        assert_eq!(generate(&m, &[1, 2, 3], 10), a[..10]);
        // The first token is always a word, and the text reads as words.
        assert!(a[0] >= 256);
        let text = detokenize(&a);
        assert!(text.starts_with(' ') && text.split_whitespace().count() > 30);
    }
}
