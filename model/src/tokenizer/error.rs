//! The tokenizer's errors: one line, naming the source (a GGUF file or a tokenizer.json).

use crate::gguf::GgufError;

/// A tokenizer could not be built, or could not encode: `{source}: {kind}`.
#[derive(Debug, thiserror::Error)]
#[error("{source_name}: {kind}")]
pub struct TokenizerError {
    /// The GGUF file or tokenizer.json the tokenizer came from.
    pub source_name: String,
    pub kind: TokenizerErrorKind,
}

impl TokenizerError {
    pub(crate) fn new(source_name: &str, kind: TokenizerErrorKind) -> TokenizerError {
        TokenizerError {
            source_name: source_name.to_owned(),
            kind,
        }
    }
}

/// What was wrong.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerErrorKind {
    /// The GGUF metadata lacks a key or has the wrong type (the message names it; the
    /// file is already named by [`TokenizerError`]).
    #[error("{}", .0.kind)]
    Gguf(Box<GgufError>),
    #[error("{0}")]
    Io(std::io::Error),
    #[error(
        "unsupported tokenizer {model:?} (den reads gpt2 byte-level BPE and llama SentencePiece)"
    )]
    UnsupportedModel { model: String },
    #[error("unsupported pre-tokenizer {pre:?} for a gpt2 BPE vocabulary")]
    UnsupportedPre { pre: String },
    #[error("{what} has {found} entries, but the vocabulary has {expected}")]
    LengthMismatch {
        what: &'static str,
        found: usize,
        expected: usize,
    },
    #[error("the vocabulary is empty")]
    EmptyVocab,
    #[error("the vocabulary has {0} tokens, more than a u32 id can name")]
    VocabTooLarge(usize),
    #[error("{what} token id {id} is outside the vocabulary of {n_vocab}")]
    BadTokenId {
        what: &'static str,
        id: u32,
        n_vocab: usize,
    },
    #[error("merge #{index} {merge:?} is not two tokens separated by one space")]
    BadMerge { index: usize, merge: String },
    #[error("tokenizer.json: {0}")]
    Json(String),
    /// The Hugging Face tokenizer refused to build or to encode (its message, on one line).
    #[error("{0}")]
    Hf(String),
}

impl From<GgufError> for TokenizerErrorKind {
    fn from(e: GgufError) -> TokenizerErrorKind {
        TokenizerErrorKind::Gguf(Box::new(e))
    }
}

/// An error from the `tokenizers` crate, on one line.
pub(crate) fn hf_message(e: &(dyn std::error::Error + Send + Sync)) -> String {
    e.to_string().replace('\n', " ")
}
