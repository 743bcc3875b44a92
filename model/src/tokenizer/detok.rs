//! Streaming detokenization: the text each new token adds, never a partial UTF-8 sequence.

use super::Tokenizer;

/// Turns a stream of token ids into text. A character split across byte tokens (Gemma's
/// `<0xE2><0x82><0xAC>`) or across byte-level pieces is held back until it is complete;
/// bytes that can never form a character come out as U+FFFD, exactly where
/// `String::from_utf8_lossy` over the whole output would put them, so the concatenated
/// pushes plus [`Detokenizer::finish`] equal [`Tokenizer::decode`] of the same ids.
///
/// Allocation-free once warm: the pending bytes and the output reuse their buffers.
#[derive(Debug, Clone, Default)]
pub struct Detokenizer {
    skip_special: bool,
    pending: Vec<u8>,
    out: String,
}

impl Detokenizer {
    /// `skip_special`: control and unknown tokens add nothing (what a chat reply shows).
    pub fn new(skip_special: bool) -> Detokenizer {
        Detokenizer {
            skip_special,
            pending: Vec::with_capacity(64),
            out: String::with_capacity(64),
        }
    }

    /// The text token `id` completes (empty while a character is incomplete). An id
    /// outside the vocabulary adds nothing.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> &str {
        self.out.clear();
        if let Some(piece) = tokenizer.piece_for(id, self.skip_special) {
            self.pending.extend_from_slice(piece);
        }
        self.drain_valid(false);
        &self.out
    }

    /// Ends the stream: an incomplete character still pending comes out as U+FFFD.
    pub fn finish(&mut self) -> &str {
        self.out.clear();
        self.drain_valid(true);
        &self.out
    }

    /// Whether bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Forgets any pending bytes.
    pub fn reset(&mut self) {
        self.pending.clear();
        self.out.clear();
    }

    /// Moves the complete characters of `pending` to `out`; with `all`, an incomplete tail
    /// too, as U+FFFD.
    fn drain_valid(&mut self, all: bool) {
        let mut start = 0;
        while start < self.pending.len() {
            let rest = self.pending.get(start..).unwrap_or_default();
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.out.push_str(s);
                    start = self.pending.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    let head = rest.get(..valid).unwrap_or_default();
                    self.out
                        .push_str(std::str::from_utf8(head).unwrap_or_default());
                    start += valid;
                    match e.error_len() {
                        Some(n) => {
                            self.out.push(char::REPLACEMENT_CHARACTER);
                            start += n;
                        }
                        None if all => {
                            self.out.push(char::REPLACEMENT_CHARACTER);
                            start = self.pending.len();
                        }
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..start);
    }
}
