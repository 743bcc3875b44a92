//! The vocabulary as llama.cpp sees it: each token's text and kind, and the bytes it
//! decodes to.

use super::bytelevel::char_to_byte;

/// What a token is, as GGUF's `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`)
/// says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// Ordinary text.
    Normal,
    /// The unknown token: special, hidden when decoding with `skip_special`.
    Unknown,
    /// A control token (`<|im_start|>`, `<bos>`, `<end_of_turn>`): matched in text only
    /// when parsing special tokens, hidden when decoding with `skip_special`.
    Control,
    /// An added token that is text (Gemma's `\n\n`, `<table>`): always matched in text
    /// before the model's tokenizer runs, always decoded.
    UserDefined,
    /// A token never produced by encoding; decodes to nothing.
    Unused,
    /// A byte-fallback token `<0xHH>`: decodes to that one byte.
    Byte,
}

impl TokenKind {
    /// GGUF's token type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    /// 0 (undefined) and anything else decode to nothing, as in llama.cpp: unused.
    pub fn from_gguf(t: i32) -> TokenKind {
        match t {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            6 => TokenKind::Byte,
            _ => TokenKind::Unused,
        }
    }

    /// Control and unknown tokens: what `skip_special` hides.
    pub fn is_special(self) -> bool {
        matches!(self, TokenKind::Control | TokenKind::Unknown)
    }
}

/// How a vocabulary spells bytes in its normal tokens' texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spelling {
    /// GPT-2's byte-level alphabet (`Ġ` for a space).
    ByteLevel,
    /// SentencePiece: UTF-8 text with `▁` (U+2581) for a space.
    SentencePiece,
}

/// Texts, kinds and decoded bytes, indexed by token id.
#[derive(Debug, Clone)]
pub(crate) struct Vocab {
    pub texts: Vec<String>,
    pub kinds: Vec<TokenKind>,
    piece_bytes: Vec<u8>,
    /// `piece_ends[i]` is where token i's bytes end in `piece_bytes` (they start where
    /// token i-1's end).
    piece_ends: Vec<usize>,
}

impl Vocab {
    /// `texts` and `kinds` have the same length (the caller checked).
    pub fn new(texts: Vec<String>, kinds: Vec<TokenKind>, spelling: Spelling) -> Vocab {
        let mut piece_bytes = Vec::with_capacity(texts.iter().map(String::len).sum());
        let mut piece_ends = Vec::with_capacity(texts.len());
        for (text, &kind) in texts.iter().zip(&kinds) {
            push_piece(&mut piece_bytes, text, kind, spelling);
            piece_ends.push(piece_bytes.len());
        }
        Vocab {
            texts,
            kinds,
            piece_bytes,
            piece_ends,
        }
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// The bytes token `id` decodes to (its text for control tokens), if it exists.
    pub fn piece(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let end = *self.piece_ends.get(i)?;
        let start = match i.checked_sub(1) {
            Some(p) => *self.piece_ends.get(p)?,
            None => 0,
        };
        self.piece_bytes.get(start..end)
    }

    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }
}

/// The bytes a token decodes to, as llama.cpp's `token_to_piece` with `special = true`.
fn push_piece(out: &mut Vec<u8>, text: &str, kind: TokenKind, spelling: Spelling) {
    match kind {
        TokenKind::Unknown | TokenKind::Control | TokenKind::UserDefined => {
            out.extend_from_slice(text.as_bytes())
        }
        TokenKind::Unused => {}
        TokenKind::Byte => match byte_token_value(text) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(text.as_bytes()),
        },
        TokenKind::Normal => match spelling {
            Spelling::SentencePiece => {
                for c in text.chars() {
                    let c = if c == '\u{2581}' { ' ' } else { c };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
            Spelling::ByteLevel => {
                for c in text.chars() {
                    match char_to_byte(c) {
                        Some(b) => out.push(b),
                        // Not in the alphabet: llama.cpp writes a marker; den keeps the char.
                        None => {
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                        }
                    }
                }
            }
        },
    }
}

/// The byte of a `<0xHH>` token.
pub(crate) fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_follow_the_spelling_and_the_kind() {
        let texts = ["<s>", "Ġhello", "▁hi", "<0x0A>", "<0xZZ>", "x", "  "]
            .map(String::from)
            .to_vec();
        let kinds = vec![
            TokenKind::Control,
            TokenKind::Normal,
            TokenKind::Normal,
            TokenKind::Byte,
            TokenKind::Byte,
            TokenKind::Unused,
            TokenKind::UserDefined,
        ];
        let bl = Vocab::new(texts.clone(), kinds.clone(), Spelling::ByteLevel);
        assert_eq!(bl.piece(0), Some(&b"<s>"[..]));
        assert_eq!(bl.piece(1), Some(&b" hello"[..]));
        assert_eq!(bl.piece(3), Some(&b"\n"[..]));
        assert_eq!(bl.piece(4), Some(&b"<0xZZ>"[..]));
        assert_eq!(bl.piece(5), Some(&b""[..]));
        assert_eq!(bl.piece(6), Some(&b"  "[..]));
        assert_eq!(bl.piece(7), None);
        let sp = Vocab::new(texts, kinds, Spelling::SentencePiece);
        assert_eq!(sp.piece(2), Some(&b" hi"[..]));
        assert_eq!(byte_token_value("<0xFF>"), Some(255));
        assert_eq!(byte_token_value("<0xFFF>"), None);
    }
}
