//! Tokenizers for den's models, built on the Hugging Face `tokenizers` crate and made to
//! tokenize exactly as llama.cpp does (`model/tests/golden/tokens_*.json`, written by
//! llama.cpp's `llama-tokenize`, is the reference).
//!
//! Two sources:
//! - [`Tokenizer::from_gguf`]: the vocabulary in a GGUF file. `gpt2` (byte-level BPE from
//!   the tokens and merges, with the `smollm` or `gpt-2` pre-tokenizer: SmolLM2) and
//!   `llama` (SentencePiece with scores: Gemma 3; the merges are derived from the scores,
//!   see `spm.rs`).
//! - [`Tokenizer::from_tokenizer_json`]: a Hugging Face `tokenizer.json` (a BPE model).
//!
//! Encoding follows llama.cpp's `llama_tokenize`: special tokens are split out of the text
//! first (`special.rs`), each raw fragment goes through the Hugging Face pipeline, and BOS
//! (and EOS, where the model asks) are added when `add_special`. Decoding is den's own,
//! from each token's bytes (`vocab.rs`), so a stream can be cut at any token
//! ([`Detokenizer`]).

mod bytelevel;
mod detok;
mod error;
mod load;
mod special;
mod spm;
mod vocab;

use std::collections::HashMap;

pub use bytelevel::{byte_to_char, char_to_byte};
pub use detok::Detokenizer;
pub use error::{TokenizerError, TokenizerErrorKind};
pub use spm::sentencepiece_merges;
pub use vocab::TokenKind;

use error::hf_message;
use special::{Fragment, Specials};
use vocab::Vocab;

/// The tokenizer algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerModel {
    /// GPT-2-style byte-level BPE (GGUF `gpt2`: SmolLM2).
    ByteLevelBpe,
    /// SentencePiece BPE over UTF-8 with byte fallback (GGUF `llama`: Gemma 3).
    SentencePiece,
}

/// How to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add BOS (and EOS) as the model asks (`tokenizer.ggml.add_bos_token`, ...).
    pub add_special: bool,
    /// Match control tokens written in the text (`<|im_start|>`) as those tokens. Off, they
    /// are tokenized as text, so user content cannot forge them; user-defined tokens
    /// (Gemma's `\n\n`) match either way, as in llama.cpp.
    pub parse_special: bool,
}

/// Tokens that end a generation besides EOS, by text (llama.cpp's list, less the entries
/// for models den does not run).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
];

/// A model's tokenizer. Cheap to share (`Send + Sync`); encoding and decoding take `&self`.
pub struct Tokenizer {
    source: String,
    model: TokenizerModel,
    hf: tokenizers::Tokenizer,
    vocab: Vocab,
    specials: Specials,
    ids: HashMap<String, u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    eog: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("source", &self.source)
            .field("model", &self.model)
            .field("n_vocab", &self.vocab.len())
            .field("n_special", &self.specials.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Encodes `text`, matching special tokens written in it (`<|im_start|>`), as
    /// llama.cpp's `llama-tokenize` does; `add_special` adds BOS (and EOS) as the model
    /// asks. A chat prompt rendered by [`crate::template::ChatTemplate`] already holds its
    /// BOS where the template writes one: encode it with `add_special = false`.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(
            text,
            EncodeOptions {
                add_special,
                parse_special: true,
            },
        )
    }

    /// Encodes `text` as llama.cpp's `llama_tokenize(add_special, parse_special)`.
    pub fn encode_with(&self, text: &str, opts: EncodeOptions) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if opts.add_special
            && self.add_bos
            && let Some(b) = self.bos
        {
            out.push(b);
        }
        let mut prefixed = String::new();
        let mut prev_special = true;
        for fragment in self.specials.partition(text, opts.parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Raw(raw) => {
                    // SentencePiece's dummy prefix, after the start and after special tokens.
                    let raw = if self.add_space_prefix && prev_special {
                        prefixed.clear();
                        prefixed.push(' ');
                        prefixed.push_str(raw);
                        prefixed.as_str()
                    } else {
                        raw
                    };
                    let enc = self.hf.encode_fast(raw, false).map_err(|e| {
                        TokenizerError::new(&self.source, TokenizerErrorKind::Hf(hf_message(&*e)))
                    })?;
                    out.extend_from_slice(enc.get_ids());
                    prev_special = false;
                }
            }
        }
        if opts.add_special
            && self.add_eos
            && let Some(e) = self.eos
        {
            out.push(e);
        }
        Ok(out)
    }

    /// The text of `ids`; `skip_special` leaves out control and unknown tokens. Bytes that
    /// do not form UTF-8 become U+FFFD. Ids outside the vocabulary add nothing.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if let Some(p) = self.piece_for(id, skip_special) {
                bytes.extend_from_slice(p);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes token `id` decodes to (a control token's text included), if it exists.
    /// A piece may be part of a UTF-8 character.
    pub fn piece(&self, id: u32) -> Option<&[u8]> {
        self.vocab.piece(id)
    }

    /// The piece, or `None` for a special token when `skip_special`.
    pub(crate) fn piece_for(&self, id: u32, skip_special: bool) -> Option<&[u8]> {
        let kind = self.vocab.kind(id)?;
        if skip_special && kind.is_special() {
            return None;
        }
        self.vocab.piece(id)
    }

    /// The token's text as the vocabulary spells it (`Ġhello`, `▁hi`, `<0x0A>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(String::as_str)
    }

    /// The id whose vocabulary text is `text` exactly (the last, if several share it).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.vocab.kind(id)
    }

    /// Whether `id` is a control or unknown token (what `skip_special` hides).
    pub fn is_special(&self, id: u32) -> bool {
        self.vocab.kind(id).is_some_and(TokenKind::is_special)
    }

    /// The number of token ids: the model's vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether `add_special` adds BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// Whether `add_special` adds EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }

    /// The tokens that end a generation: EOS and the end-of-turn tokens (SmolLM2:
    /// `<|endoftext|>`, `<|im_end|>`; Gemma 3: `<eos>`, `<end_of_turn>`), ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The id of the control, unknown or user-defined token whose text is `text`.
    pub fn special_id(&self, text: &str) -> Option<u32> {
        self.token_id(text).filter(|&id| {
            matches!(
                self.vocab.kind(id),
                Some(TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown)
            )
        })
    }

    pub fn model(&self) -> TokenizerModel {
        self.model
    }

    /// The file the tokenizer came from, as named when opened.
    pub fn source(&self) -> &str {
        &self.source
    }
}
