//! A tiny deterministic word/byte tokenizer for the synthetic engine and the OpenAI
//! ingress. It is not any real model's tokenizer; it only has to be stable and reversible.
//!
//! Vocabulary ([`VOCAB_SIZE`] ids):
//! - `0..=255`: single bytes;
//! - `256 .. 256 + W`: the [`WORDS`] list, bare (`"the"`);
//! - `256 + W .. 256 + 2W`: the same words with one leading space (`" the"`).
//!
//! Tokenizing scans left to right: a space followed by a known ASCII word becomes one
//! `" word"` token; a known word becomes one `"word"` token; any other run of ASCII letters
//! and digits, and every other byte (spaces, punctuation, UTF-8 bytes), becomes one token
//! per byte. Words are matched whole and case-sensitively (`"The"` is bytes). Because
//! every token stands for a fixed byte string, `detokenize(tokenize(s)) == s` for every
//! string `s`, not only ASCII words. Ids outside the vocabulary detokenize to U+FFFD.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use den_protocol::request::Token;

/// The word list. Order fixes the ids; never reorder, only append (ids would change).
pub const WORDS: &[&str] = &[
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on",
    "are", "with", "as", "i", "his", "they", "be", "at", "one", "have", "this", "from", "or",
    "had", "by", "not", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all",
    "there", "when", "up", "use", "your", "how", "said", "an", "each", "she", "which", "do",
    "their", "time", "if", "will", "way", "about", "many", "then", "them", "write", "would",
    "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look",
    "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my",
    "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been", "now",
    "find", "any", "new", "work", "part", "take", "get", "place", "made", "live", "where", "after",
    "back", "little", "only", "round", "man", "year", "came", "show", "every", "good", "me",
    "give", "our", "under", "name", "very", "through", "just", "form", "sentence", "great",
    "think", "say", "help", "low", "line", "differ", "turn", "cause", "much", "mean", "before",
    "move", "right", "boy", "old", "too", "same", "tell", "does", "set", "three", "want", "air",
    "well", "also", "play", "small", "end", "put", "home", "read", "hand", "port", "large",
    "spell", "add", "even", "land", "here", "must", "big", "high", "such", "follow", "act", "why",
    "ask", "men", "change", "went", "light", "kind", "off", "need", "house", "picture", "try",
    "us", "again", "animal", "point", "mother", "world", "near", "build", "self", "earth",
    "father", "cache", "page", "token", "route", "worker", "router", "prefix", "model", "chunk",
    "request", "hello", "den",
];

/// Number of token ids the tokenizer can produce.
pub const VOCAB_SIZE: u32 = 256 + 2 * WORDS.len() as u32;

const BYTES: u32 = 256;

/// Splits `text` into tokens (see the module comment).
pub fn tokenize(text: &str) -> Vec<Token> {
    let b = text.as_bytes();
    let words = word_ids();
    let mut out = Vec::with_capacity(b.len() / 3 + 1);
    let mut i = 0;
    // Indexing below is in bounds: `i < b.len()` in the loop and every `run_end` result
    // lies in `i + 1 ..= b.len()`.
    while i < b.len() {
        let c = b[i];
        if c == b' ' && b.get(i + 1).is_some_and(u8::is_ascii_alphanumeric) {
            let end = run_end(b, i + 1);
            if let Some(w) = words.get(&b[i + 1..end]) {
                out.push(BYTES + WORDS.len() as u32 + w);
                i = end;
                continue;
            }
        }
        if c.is_ascii_alphanumeric() {
            let end = run_end(b, i);
            match words.get(&b[i..end]) {
                Some(w) => out.push(BYTES + w),
                None => out.extend(b[i..end].iter().map(|x| *x as Token)),
            }
            i = end;
            continue;
        }
        out.push(c as Token);
        i += 1;
    }
    out
}

/// Joins tokens back into text. Byte tokens that do not form valid UTF-8 and ids outside
/// the vocabulary become U+FFFD.
pub fn detokenize(tokens: &[Token]) -> String {
    let mut bytes = Vec::with_capacity(tokens.len() * 4);
    for t in tokens {
        match piece(*t) {
            Some(p) => bytes.extend_from_slice(p.as_bytes()),
            None if *t < BYTES => bytes.push(*t as u8),
            None => bytes.extend_from_slice("\u{FFFD}".as_bytes()),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The text of one word token (`"the"` or `" the"`); `None` for byte tokens and ids
/// outside the vocabulary.
pub fn piece(token: Token) -> Option<String> {
    let w = WORDS.len() as u32;
    match token.checked_sub(BYTES) {
        Some(i) if i < w => WORDS.get(i as usize).map(|s| (*s).to_owned()),
        Some(i) if i < 2 * w => WORDS.get((i - w) as usize).map(|s| format!(" {s}")),
        _ => None,
    }
}

fn run_end(b: &[u8], from: usize) -> usize {
    let mut end = from;
    while b.get(end).is_some_and(u8::is_ascii_alphanumeric) {
        end += 1;
    }
    end
}

fn word_ids() -> &'static BTreeMap<&'static [u8], u32> {
    static IDS: OnceLock<BTreeMap<&'static [u8], u32>> = OnceLock::new();
    IDS.get_or_init(|| {
        let mut m = BTreeMap::new();
        for (i, w) in WORDS.iter().enumerate() {
            // First occurrence wins, so an accidental duplicate cannot change ids.
            m.entry(w.as_bytes()).or_insert(i as u32);
        }
        m
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_words_are_single_tokens_with_or_without_a_leading_space() {
        let t = tokenize("the cache of the page");
        assert_eq!(t.len(), 5);
        assert_eq!(t[0], 256);
        assert_eq!(piece(t[1]).as_deref(), Some(" cache"));
        assert_eq!(t[3], 256 + WORDS.len() as u32);
        assert_eq!(detokenize(&t), "the cache of the page");
        assert!(t.iter().all(|x| *x < VOCAB_SIZE));
    }

    #[test]
    fn unknown_words_punctuation_and_utf8_fall_back_to_bytes_and_round_trip() {
        for s in [
            "",
            "Hello, world!",
            "zebra xylophone  the\tend.",
            "  leading and trailing  ",
            "naïve café ☕ 1234",
            "the.the,the the",
        ] {
            assert_eq!(detokenize(&tokenize(s)), s, "{s:?}");
        }
        assert_eq!(tokenize("zz"), vec![b'z' as u32, b'z' as u32]);
        // A known word inside a longer run is not split out.
        assert_eq!(tokenize("theory").len(), 6);
    }

    #[test]
    fn word_ids_are_unique_and_stable() {
        assert_eq!(word_ids().len(), WORDS.len(), "duplicate word in WORDS");
        assert_eq!(tokenize("the"), vec![256]);
        assert_eq!(tokenize("den"), vec![256 + WORDS.len() as u32 - 1]);
        assert_eq!(detokenize(&[VOCAB_SIZE]), "\u{FFFD}");
    }
}
