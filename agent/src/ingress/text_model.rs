//! The text side of each served model: prompts to token ids, token ids to text.
//!
//! A real model (fingerprint `ID@KV`) is tokenized with its own tokenizer and chat
//! template, loaded by the router from the same GGUF file the workers serve
//! (`den-agent router --model-file PATH`): the router needs the token ids before it
//! routes, because routing is by cached prefix. A real model the router has no file for
//! is refused with a one-line error saying so (never tokenized by the synthetic engine,
//! whose ids would mean nothing to it). Every other model is the synthetic engine's,
//! with its ChatML-like template and word/byte tokenizer ([`super::template`]).
//!
//! Output text for a real model goes through den-model's [`Generation`] with the
//! request's stops, fed the tokens the worker sampled: the worker stops at the same token
//! (it runs the same loop), and the ingress cuts the text before a stop string and holds
//! back what may begin one, exactly as the worker decided.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::StatusCode;

use den_model::sample::{Generation, Step};
use den_model::template::Message as TemplateMessage;
use den_protocol::ids::{ModelFingerprint, RequestId};
use den_protocol::request::{Sampling, Token};

use super::error::ApiError;
use super::parse::{Message, Prompt};
use super::template;
use super::text::TextStream;
use crate::model_file::{ModelFile, ModelText, generation_config};

/// The real models this router can tokenize for, by fingerprint.
#[derive(Debug, Default, Clone)]
pub struct TextModels {
    models: BTreeMap<ModelFingerprint, Arc<ModelText>>,
}

impl TextModels {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the text side of an opened model file.
    pub fn add(&mut self, model: &ModelFile) {
        self.models
            .insert(model.fingerprint().clone(), Arc::clone(&model.text));
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// How to tokenize for `fingerprint`.
    pub fn get(&self, fingerprint: &ModelFingerprint) -> Result<TextModel, ApiError> {
        if !fingerprint.is_weights_bound() {
            return Ok(TextModel::Synthetic);
        }
        match self.models.get(fingerprint) {
            Some(t) => Ok(TextModel::Real(Arc::clone(t))),
            None => Err(ApiError::server(
                StatusCode::SERVICE_UNAVAILABLE,
                "tokenizer_unavailable",
                format!(
                    "model {fingerprint} is served by real workers but this router has no tokenizer for it: restart the router with --model-file PATH.gguf (the same file), or send token ids to /v1/generate"
                ),
            )),
        }
    }
}

/// One model's text side.
#[derive(Debug, Clone)]
pub enum TextModel {
    /// The synthetic engine's template and word/byte tokenizer.
    Synthetic,
    Real(Arc<ModelText>),
}

impl TextModel {
    /// The prompt tokens of a conversation: the model's chat template, then its tokenizer
    /// (control tokens the template writes are matched as such, as llama.cpp's server does).
    pub fn chat_tokens(&self, messages: &[Message]) -> Result<Vec<Token>, ApiError> {
        match self {
            TextModel::Synthetic => Ok(template::chat_tokens(messages)),
            TextModel::Real(t) => {
                let messages: Vec<TemplateMessage> = messages
                    .iter()
                    .map(|m| TemplateMessage::new(m.role.as_str(), m.content.clone()))
                    .collect();
                let text = t.template.render(&messages, true).map_err(|e| {
                    ApiError::invalid("messages", "invalid_value", format!("messages: {e}"))
                })?;
                // The template writes BOS itself where the model wants one.
                encode(t, &text, false, "messages")
            }
        }
    }

    /// The prompt tokens of a completions prompt (text gets BOS as the model asks).
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<Token>, ApiError> {
        match (self, prompt) {
            (TextModel::Synthetic, p) => Ok(template::prompt_tokens(p)),
            (TextModel::Real(t), Prompt::Text(s)) => encode(t, s, true, "prompt"),
            (TextModel::Real(t), Prompt::Tokens(ids)) => {
                let vocab = t.tokenizer.n_vocab();
                match ids.iter().position(|id| *id as usize >= vocab) {
                    Some(i) => Err(ApiError::invalid(
                        "prompt",
                        "invalid_value",
                        format!(
                            "prompt[{i}] = {} is not a token of this model (its vocabulary has {vocab})",
                            ids[i]
                        ),
                    )),
                    None => Ok(ids.clone()),
                }
            }
        }
    }

    /// Text for `tokens` (as `/detokenize` answers: special tokens written out).
    pub fn detokenize(&self, tokens: &[Token]) -> String {
        match self {
            TextModel::Synthetic => crate::engine::detokenize(tokens),
            TextModel::Real(t) => t.tokenizer.decode(tokens, false),
        }
    }

    /// Plain text tokenized as `/tokenize` does: BOS as the model asks when
    /// `add_special_tokens`. Empty text may give no tokens.
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<Token>, ApiError> {
        match self {
            TextModel::Synthetic => Ok(crate::engine::tokenize(text)),
            TextModel::Real(t) => t
                .tokenizer
                .encode(text, add_special)
                .map_err(|e| ApiError::invalid("prompt", "invalid_value", format!("prompt: {e}"))),
        }
    }

    /// The most tokens one sequence may hold, as the model was trained.
    pub fn context_length(&self) -> Option<u32> {
        match self {
            TextModel::Synthetic => None,
            TextModel::Real(t) => Some(t.context_length),
        }
    }

    /// The text of one request's output, built token by token.
    pub fn output(&self, sampling: &Sampling, id: &RequestId, limit: u32) -> OutputText {
        match self {
            TextModel::Synthetic => OutputText::Synthetic(TextStream::new()),
            TextModel::Real(t) => {
                let config = generation_config(sampling, id, limit);
                // The context bound is the worker's to enforce; here only the stops matter.
                match Generation::new(&t.tokenizer, config, 0, usize::MAX) {
                    Ok(g) => OutputText::Real {
                        text: Arc::clone(t),
                        generation: Box::new(g),
                    },
                    // Only a zero limit fails, and the ingress never asks for one.
                    Err(_) => OutputText::Synthetic(TextStream::new()),
                }
            }
        }
    }
}

fn encode(
    t: &ModelText,
    text: &str,
    add_special: bool,
    param: &str,
) -> Result<Vec<Token>, ApiError> {
    let ids = t
        .tokenizer
        .encode(text, add_special)
        .map_err(|e| ApiError::invalid(param, "invalid_value", format!("{param}: {e}")))?;
    if ids.is_empty() {
        return Err(ApiError::invalid(
            param,
            "invalid_value",
            format!("{param} is empty once tokenized: give at least one token of text"),
        ));
    }
    Ok(ids)
}

/// One output stream's text.
pub enum OutputText {
    Synthetic(TextStream),
    Real {
        text: Arc<ModelText>,
        generation: Box<Generation>,
    },
}

impl OutputText {
    /// The new visible text `token` makes (maybe empty: an incomplete character, a special
    /// token, text that may begin a stop string, or anything after the output ended).
    pub fn push(&mut self, token: Token) -> String {
        match self {
            OutputText::Synthetic(s) => s.push(token),
            OutputText::Real { text, generation } => {
                if generation.finished().is_some() {
                    return String::new();
                }
                match generation.accept(&text.tokenizer, token) {
                    Ok(Step::Token { text, .. } | Step::Finished { text, .. }) => text.to_owned(),
                    Err(_) => String::new(),
                }
            }
        }
    }

    /// What is still held back, once the stream has ended.
    pub fn finish(&mut self) -> String {
        match self {
            OutputText::Synthetic(s) => s.finish(),
            OutputText::Real { generation, .. } => generation.end().to_owned(),
        }
    }

    /// All of `tokens`' text at once (a non-streamed answer).
    pub fn all(mut self, tokens: &[Token]) -> String {
        let mut out = String::new();
        for t in tokens {
            out.push_str(&self.push(*t));
        }
        out.push_str(&self.finish());
        out
    }
}
