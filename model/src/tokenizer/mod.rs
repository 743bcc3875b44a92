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
mod special;
mod spm;
mod vocab;

use std::collections::HashMap;
use std::path::Path;

use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{
    AddedVocabulary, DecoderWrapper, Model, ModelWrapper, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper,
};

use crate::gguf::GgufFile;

pub use bytelevel::{byte_to_char, char_to_byte};
pub use detok::Detokenizer;
pub use error::{TokenizerError, TokenizerErrorKind};
pub use spm::sentencepiece_merges;
pub use vocab::TokenKind;

use error::hf_message;
use special::{Fragment, Specials};
use vocab::{Spelling, Vocab, byte_token_value};

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

/// What the source-specific constructors hand to [`Tokenizer::assemble`].
struct Parts {
    source: String,
    model: TokenizerModel,
    hf: tokenizers::Tokenizer,
    texts: Vec<String>,
    kinds: Vec<TokenKind>,
    spelling: Spelling,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

impl Tokenizer {
    /// The tokenizer in a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let name = file.name();
        let fail = |kind: TokenizerErrorKind| TokenizerError::new(name, kind);
        let meta = |e: crate::gguf::GgufError| fail(e.into());
        let opt_u32 = |key: &str| match file.get(key) {
            None => Ok(None),
            Some(_) => file.get_u32(key).map(Some).map_err(meta),
        };
        let opt_bool = |key: &str, default: bool| match file.get(key) {
            None => Ok(default),
            Some(_) => file.get_bool(key).map_err(meta),
        };

        let model = file.get_str("tokenizer.ggml.model").map_err(meta)?;
        let texts = file
            .get_str_array("tokenizer.ggml.tokens")
            .map_err(meta)?
            .to_vec();
        let n = check_vocab_len(texts.len()).map_err(fail)?;
        let kinds = match file.get("tokenizer.ggml.token_type") {
            None => vec![TokenKind::Normal; n],
            Some(_) => {
                let types = file
                    .get_i32_array("tokenizer.ggml.token_type")
                    .map_err(meta)?;
                same_len("tokenizer.ggml.token_type", types.len(), n).map_err(fail)?;
                types.iter().map(|&t| TokenKind::from_gguf(t)).collect()
            }
        };
        let bos = opt_u32("tokenizer.ggml.bos_token_id")?;
        let eos = opt_u32("tokenizer.ggml.eos_token_id")?;
        let vocab_map = |texts: &[String]| -> tokenizers::models::bpe::Vocab {
            texts
                .iter()
                .zip(0u32..)
                .map(|(t, i)| (t.clone(), i))
                .collect()
        };

        let parts = match model {
            "gpt2" => {
                let pre = match file.get("tokenizer.ggml.pre") {
                    None => "default",
                    Some(_) => file.get_str("tokenizer.ggml.pre").map_err(meta)?,
                };
                // llama.cpp: `smollm` = `\p{N}` (each digit alone), then GPT-2's regex.
                let digits = match pre {
                    "smollm" => true,
                    "gpt-2" | "gpt2" => false,
                    other => {
                        return Err(fail(TokenizerErrorKind::UnsupportedPre {
                            pre: other.to_owned(),
                        }));
                    }
                };
                let raw = file.get_str_array("tokenizer.ggml.merges").map_err(meta)?;
                let mut merges = Vec::with_capacity(raw.len());
                for (index, m) in raw.iter().enumerate() {
                    let (a, b) = m.split_once(' ').ok_or_else(|| {
                        fail(TokenizerErrorKind::BadMerge {
                            index,
                            merge: m.clone(),
                        })
                    })?;
                    merges.push((a.to_owned(), b.to_owned()));
                }
                let bpe = BPE::builder()
                    .vocab_and_merges(vocab_map(&texts), merges)
                    .build()
                    .map_err(|e| fail(TokenizerErrorKind::Hf(hf_message(&*e))))?;
                let mut hf = tokenizers::Tokenizer::new(bpe);
                let byte_level = ByteLevel::new(false, true, true);
                let pre: PreTokenizerWrapper = if digits {
                    Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
                } else {
                    byte_level.into()
                };
                hf.with_pre_tokenizer(Some(pre));
                Parts {
                    source: name.to_owned(),
                    model: TokenizerModel::ByteLevelBpe,
                    hf,
                    texts,
                    kinds,
                    spelling: Spelling::ByteLevel,
                    bos,
                    eos,
                    add_bos: opt_bool("tokenizer.ggml.add_bos_token", false)?,
                    add_eos: opt_bool("tokenizer.ggml.add_eos_token", false)?,
                    add_space_prefix: false,
                }
            }
            "llama" => {
                let scores = file.get_f32_array("tokenizer.ggml.scores").map_err(meta)?;
                same_len("tokenizer.ggml.scores", scores.len(), n).map_err(fail)?;
                let merges = spm::sentencepiece_merges(&texts, scores);
                let mut builder = BPE::builder()
                    .vocab_and_merges(vocab_map(&texts), merges)
                    .byte_fallback(true)
                    .fuse_unk(true);
                if let Some(unk) = opt_u32("tokenizer.ggml.unknown_token_id")?
                    && let Some(text) = texts.get(unk as usize)
                {
                    builder = builder.unk_token(text.clone());
                }
                let bpe = builder
                    .build()
                    .map_err(|e| fail(TokenizerErrorKind::Hf(hf_message(&*e))))?;
                let mut hf = tokenizers::Tokenizer::new(bpe);
                let space = Replace::new(" ", "\u{2581}")
                    .map_err(|e| fail(TokenizerErrorKind::Hf(hf_message(&*e))))?;
                hf.with_normalizer(Some(NormalizerWrapper::from(space)));
                Parts {
                    source: name.to_owned(),
                    model: TokenizerModel::SentencePiece,
                    hf,
                    texts,
                    kinds,
                    spelling: Spelling::SentencePiece,
                    bos,
                    eos,
                    add_bos: opt_bool("tokenizer.ggml.add_bos_token", true)?,
                    add_eos: opt_bool("tokenizer.ggml.add_eos_token", false)?,
                    add_space_prefix: opt_bool("tokenizer.ggml.add_space_prefix", true)?,
                }
            }
            other => {
                return Err(fail(TokenizerErrorKind::UnsupportedModel {
                    model: other.to_owned(),
                }));
            }
        };
        Tokenizer::assemble(parts)
    }

    /// A Hugging Face `tokenizer.json` with a BPE model. Token kinds follow llama.cpp's
    /// converter: added tokens that are special, or look it (`<unused0>`, `<|x|>`), are
    /// control tokens; other added tokens are user-defined (with `▁` written as a space
    /// for SentencePiece vocabularies); `<0xHH>` with byte fallback are byte tokens.
    /// BOS and EOS: what the file's post-processor adds around an empty text (Gemma:
    /// `<bos>`, added); where it adds none, the first of `<bos>`, `<s>`,
    /// `<|begin_of_text|>` (not added) and of `<eos>`, `</s>`, `<|endoftext|>`,
    /// `<|im_end|>`, `<|end_of_text|>` that exists.
    pub fn from_tokenizer_json(path: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let fail = |kind: TokenizerErrorKind| TokenizerError::new(&name, kind);
        let bytes = std::fs::read(path).map_err(|e| fail(TokenizerErrorKind::Io(e)))?;
        let mut hf = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| fail(TokenizerErrorKind::Json(hf_message(&*e))))?;
        drop(bytes);

        let byte_fallback = match hf.get_model() {
            ModelWrapper::BPE(bpe) => bpe.byte_fallback,
            _ => {
                return Err(fail(TokenizerErrorKind::UnsupportedModel {
                    model: "a tokenizer.json model other than BPE".to_owned(),
                }));
            }
        };
        let spelling = match hf.get_decoder() {
            Some(DecoderWrapper::ByteLevel(_)) => Spelling::ByteLevel,
            _ => Spelling::SentencePiece,
        };
        let model = match spelling {
            Spelling::ByteLevel => TokenizerModel::ByteLevelBpe,
            Spelling::SentencePiece => TokenizerModel::SentencePiece,
        };

        let all = hf.get_vocab(true);
        let n = all.values().max().map_or(0, |&m| m as usize + 1);
        let n = check_vocab_len(n).map_err(fail)?;
        let added = hf.get_added_tokens_decoder();
        let mut texts = Vec::with_capacity(n);
        let mut kinds = Vec::with_capacity(n);
        for id in (0..n).filter_map(|i| u32::try_from(i).ok()) {
            let (text, kind) = match (added.get(&id), hf.get_model().id_to_token(id)) {
                (Some(a), _) if a.special || looks_special(&a.content) => {
                    (a.content.clone(), TokenKind::Control)
                }
                (Some(a), _) => {
                    let text = match spelling {
                        Spelling::SentencePiece => a.content.replace('\u{2581}', " "),
                        Spelling::ByteLevel => a.content.clone(),
                    };
                    (text, TokenKind::UserDefined)
                }
                (None, Some(t)) if byte_fallback && byte_token_value(&t).is_some() => {
                    (t, TokenKind::Byte)
                }
                (None, Some(t)) => (t, TokenKind::Normal),
                (None, None) => (format!("[PAD{id}]"), TokenKind::Unused),
            };
            texts.push(text);
            kinds.push(kind);
        }

        // What the post-processor adds around a text: BOS before it, EOS after it.
        let hf_err = |e: tokenizers::Error| fail(TokenizerErrorKind::Hf(hf_message(&*e)));
        let plain = hf.encode_fast("a", false).map_err(hf_err)?;
        let full = hf.encode_fast("a", true).map_err(hf_err)?;
        let (plain, full) = (plain.get_ids(), full.get_ids());
        let at = (0..=full.len().saturating_sub(plain.len()))
            .find(|&i| full.get(i..i + plain.len()) == Some(plain));
        let before = at.and_then(|i| full.get(..i)).unwrap_or_default();
        let after = at
            .and_then(|i| full.get(i + plain.len()..))
            .unwrap_or_default();
        let (mut bos, add_bos) = (before.first().copied(), !before.is_empty());
        let (mut eos, add_eos) = (after.last().copied(), !after.is_empty());
        let find = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| texts.iter().position(|t| t == n))
                .and_then(|i| u32::try_from(i).ok())
        };
        if bos.is_none() {
            bos = find(&["<bos>", "<s>", "<|begin_of_text|>"]);
        }
        if eos.is_none() {
            eos = find(&[
                "<eos>",
                "</s>",
                "<|endoftext|>",
                "<|im_end|>",
                "<|end_of_text|>",
            ]);
        }

        // den splits special tokens itself; the pipeline sees raw text only.
        hf.with_added_vocabulary(AddedVocabulary::new());
        hf.with_post_processor(None::<PostProcessorWrapper>);
        Tokenizer::assemble(Parts {
            source: name,
            model,
            hf,
            texts,
            kinds,
            spelling,
            bos,
            eos,
            add_bos,
            add_eos,
            add_space_prefix: false,
        })
    }

    fn assemble(p: Parts) -> Result<Tokenizer, TokenizerError> {
        let fail = |kind| TokenizerError::new(&p.source, kind);
        let n = p.texts.len();
        for (what, id) in [("bos", p.bos), ("eos", p.eos)] {
            if let Some(id) = id
                && id as usize >= n
            {
                return Err(fail(TokenizerErrorKind::BadTokenId {
                    what,
                    id,
                    n_vocab: n,
                }));
            }
        }
        let mut kinds = p.kinds;
        let mut ids: HashMap<String, u32> = HashMap::with_capacity(n);
        for (t, i) in p.texts.iter().zip(0u32..) {
            ids.insert(t.clone(), i);
        }
        // End-of-generation tokens; llama.cpp makes them control tokens where they are not.
        let mut eog: Vec<u32> = p.eos.into_iter().collect();
        for text in EOG_TEXTS {
            if let Some(&id) = ids.get(*text) {
                if !eog.contains(&id) {
                    eog.push(id);
                }
                if let Some(k) = kinds.get_mut(id as usize)
                    && !k.is_special()
                {
                    *k = TokenKind::Control;
                }
            }
        }
        eog.sort_unstable();
        let vocab = Vocab::new(p.texts, kinds, p.spelling);
        let specials = Specials::new(&vocab).map_err(|e| fail(TokenizerErrorKind::Hf(e)))?;
        Ok(Tokenizer {
            source: p.source,
            model: p.model,
            hf: p.hf,
            vocab,
            specials,
            ids,
            bos: p.bos,
            eos: p.eos,
            add_bos: p.add_bos,
            add_eos: p.add_eos,
            add_space_prefix: p.add_space_prefix && p.model == TokenizerModel::SentencePiece,
            eog,
        })
    }

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

fn check_vocab_len(n: usize) -> Result<usize, TokenizerErrorKind> {
    if n == 0 {
        return Err(TokenizerErrorKind::EmptyVocab);
    }
    if u32::try_from(n).is_err() {
        return Err(TokenizerErrorKind::VocabTooLarge(n));
    }
    Ok(n)
}

fn same_len(what: &'static str, found: usize, expected: usize) -> Result<(), TokenizerErrorKind> {
    if found == expected {
        Ok(())
    } else {
        Err(TokenizerErrorKind::LengthMismatch {
            what,
            found,
            expected,
        })
    }
}

/// llama.cpp's converter's `does_token_look_special`.
fn looks_special(text: &str) -> bool {
    matches!(text, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (text.starts_with("<|") && text.ends_with("|>"))
        || (text.starts_with("<\u{ff5c}") && text.ends_with("\u{ff5c}>"))
        || (text.starts_with("<unused") && text.ends_with('>'))
}
