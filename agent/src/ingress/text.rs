//! Tokens → text, incrementally.
//!
//! A streamed delta carries one token, and a byte token can be half of a UTF-8 character.
//! [`TextStream`] holds back incomplete sequences so every chunk is valid text, and the
//! concatenation of everything it emits equals [`crate::engine::detokenize`] of all the
//! tokens (invalid sequences become U+FFFD exactly as `String::from_utf8_lossy` does).

use den_protocol::request::Token;

use crate::engine;

const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

/// Incremental detokenizer for one output stream.
#[derive(Debug, Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Text that `token` completes; empty while a multi-byte character is incomplete.
    pub fn push(&mut self, token: Token) -> String {
        token_bytes(token, &mut self.pending);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // `valid_up_to` bytes are valid UTF-8 by the error's contract.
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                        None => {
                            // An incomplete sequence at the end: wait for more bytes.
                            self.pending.drain(..valid);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// Whatever is held back, once the stream has ended.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// The bytes a token stands for (see [`crate::engine::tokenizer`]).
fn token_bytes(token: Token, out: &mut Vec<u8>) {
    match engine::tokenizer::piece(token) {
        Some(p) => out.extend_from_slice(p.as_bytes()),
        None => match u8::try_from(token) {
            Ok(b) => out.push(b),
            Err(_) => out.extend_from_slice(REPLACEMENT),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(tokens: &[Token]) -> (Vec<String>, String) {
        let mut s = TextStream::new();
        let mut parts: Vec<String> = tokens.iter().map(|t| s.push(*t)).collect();
        parts.push(s.finish());
        let joined = parts.concat();
        (parts, joined)
    }

    #[test]
    fn streaming_equals_detokenizing_the_whole_output() {
        let utf8 = engine::tokenize("naïve café ☕ the end");
        let mut cases = vec![
            utf8.clone(),
            vec![0xE2, 0x98],
            vec![0xFF, b'a' as u32, 0xC3],
        ];
        cases.push(vec![engine::VOCAB_SIZE, 0xC3, 0xA9, 0xE2, b'x' as u32]);
        for tokens in cases {
            let (_, joined) = streamed(&tokens);
            assert_eq!(joined, engine::detokenize(&tokens), "{tokens:?}");
        }
        // The three bytes of ☕ produce one chunk, on the last byte.
        let (parts, _) = streamed(&[0xE2, 0x98, 0x95]);
        assert_eq!(parts, vec!["", "", "☕", ""]);
    }
}
