//! Building a [`Tokenizer`] from its two sources: a GGUF file's `tokenizer.ggml.*`
//! metadata and a Hugging Face `tokenizer.json`.

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

use super::error::hf_message;
use super::special::Specials;
use super::vocab::{Spelling, Vocab, byte_token_value};
use super::{
    EOG_TEXTS, TokenKind, Tokenizer, TokenizerError, TokenizerErrorKind, TokenizerModel, spm,
};

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
