//! The generation state machine: logits in, visible text and a finish reason out.

use super::{Sampler, SamplerConfig};
use crate::tokenizer::{Detokenizer, Tokenizer};

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    pub sampler: SamplerConfig,
    /// At most this many tokens; `None`: what is left of the context.
    pub max_tokens: Option<usize>,
    /// Texts that end the generation when they appear in the output (even split across
    /// tokens); the output stops before the first one. Empty strings are ignored.
    pub stop: Vec<String>,
    /// Tokens that end the generation, besides EOS and the end-of-turn tokens.
    pub stop_token_ids: Vec<u32>,
    /// Keep going past EOS and the end-of-turn tokens (`stop_token_ids` still stop).
    pub ignore_eos: bool,
    /// Leave control tokens out of the text (default: true).
    pub skip_special: bool,
}

impl Default for GenerationConfig {
    fn default() -> GenerationConfig {
        GenerationConfig {
            sampler: SamplerConfig::default(),
            max_tokens: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            skip_special: true,
        }
    }
}

/// Why a generation ended (OpenAI's `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, an end-of-turn token, a stop token id, or a stop string.
    Stop,
    /// `max_tokens`, or the end of the context.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What one token did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'a> {
    /// Token `id` was chosen: run it through the model for the next logits. `text` is the
    /// new visible text; it may be empty (an incomplete character, a special token, or
    /// text held back because it may begin a stop string).
    Token { id: u32, text: &'a str },
    /// The generation is over; no more logits are needed. `id` is the token that ended
    /// it (the EOS or stop token for a token stop, the token that completed a stop
    /// string, or the last token for `Length`, which is part of the output); `text` is
    /// the last visible text: held-back text released, or what came before the stop
    /// string.
    Finished {
        reason: FinishReason,
        id: u32,
        text: &'a str,
    },
}

/// A generation could not start or go on: one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerationError {
    #[error("the prompt's {prompt} tokens leave no room in the context of {context}")]
    PromptFillsContext { prompt: usize, context: usize },
    #[error("max_tokens is 0")]
    ZeroMaxTokens,
    #[error("no token can be sampled: the logits are empty, NaN or -inf")]
    NoCandidates,
    #[error("the generation has already finished")]
    AlreadyFinished,
}

/// One completion's state, fed one set of logits per token (sans-IO: the caller runs the
/// model). Allocation-free per token once warm.
#[derive(Debug, Clone)]
pub struct Generation {
    sampler: Sampler,
    detok: Detokenizer,
    stop: Vec<String>,
    /// Sorted: EOS and the end-of-turn tokens (unless `ignore_eos`) and `stop_token_ids`.
    stop_ids: Vec<u32>,
    limit: usize,
    produced: usize,
    /// Visible text not yet returned: a suffix that may begin a stop string.
    held: String,
    /// What the last step returned.
    out: String,
    finished: Option<FinishReason>,
}

impl Generation {
    /// A generation after a prompt of `prompt_len` tokens in a context of `context_len`.
    pub fn new(
        tokenizer: &Tokenizer,
        config: GenerationConfig,
        prompt_len: usize,
        context_len: usize,
    ) -> Result<Generation, GenerationError> {
        let room = context_len.saturating_sub(prompt_len);
        if room == 0 {
            return Err(GenerationError::PromptFillsContext {
                prompt: prompt_len,
                context: context_len,
            });
        }
        let limit = match config.max_tokens {
            Some(0) => return Err(GenerationError::ZeroMaxTokens),
            Some(m) => m.min(room),
            None => room,
        };
        let mut stop_ids = config.stop_token_ids;
        if !config.ignore_eos {
            stop_ids.extend_from_slice(tokenizer.eog_ids());
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let stop: Vec<String> = config.stop.into_iter().filter(|s| !s.is_empty()).collect();
        let longest = stop.iter().map(String::len).max().unwrap_or(0);
        Ok(Generation {
            sampler: Sampler::new(config.sampler),
            detok: Detokenizer::new(config.skip_special),
            stop,
            stop_ids,
            limit,
            produced: 0,
            held: String::with_capacity(longest + 64),
            out: String::with_capacity(longest + 64),
            finished: None,
        })
    }

    /// Samples a token from `logits` and takes it ([`Generation::accept`]).
    pub fn step(
        &mut self,
        tokenizer: &Tokenizer,
        logits: &[f32],
    ) -> Result<Step<'_>, GenerationError> {
        if self.finished.is_some() {
            return Err(GenerationError::AlreadyFinished);
        }
        let id = self
            .sampler
            .sample(logits)
            .ok_or(GenerationError::NoCandidates)?;
        self.accept(tokenizer, id)
    }

    /// Takes token `id` as the next output token (chosen by [`Generation::step`], or
    /// elsewhere: a forced or a speculated token).
    pub fn accept(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<Step<'_>, GenerationError> {
        if self.finished.is_some() {
            return Err(GenerationError::AlreadyFinished);
        }
        self.produced += 1;
        self.out.clear();
        if self.stop_ids.binary_search(&id).is_ok() {
            let tail = self.detok.finish();
            self.held.push_str(tail);
            return Ok(self.finish(FinishReason::Stop, id));
        }
        let text = self.detok.push(tokenizer, id);
        self.held.push_str(text);
        if let Some(at) = self.first_stop() {
            self.held.truncate(at);
            return Ok(self.finish(FinishReason::Stop, id));
        }
        if self.produced >= self.limit {
            let tail = self.detok.finish();
            self.held.push_str(tail);
            if let Some(at) = self.first_stop() {
                self.held.truncate(at);
                return Ok(self.finish(FinishReason::Stop, id));
            }
            return Ok(self.finish(FinishReason::Length, id));
        }
        let emit = self.held.len() - self.held_back();
        self.out.push_str(self.held.get(..emit).unwrap_or_default());
        self.held.drain(..emit);
        Ok(Step::Token {
            id,
            text: &self.out,
        })
    }

    /// Ends a generation that stopped from outside (the caller's own token limit, an
    /// aborted stream): returns the text still held back (an incomplete character, a
    /// possible stop-string start), cut before a stop string it completes. Empty once
    /// finished.
    pub fn end(&mut self) -> &str {
        self.out.clear();
        if self.finished.is_some() {
            return &self.out;
        }
        let tail = self.detok.finish();
        self.held.push_str(tail);
        let reason = match self.first_stop() {
            Some(at) => {
                self.held.truncate(at);
                FinishReason::Stop
            }
            None => FinishReason::Length,
        };
        self.finished = Some(reason);
        self.out.push_str(&self.held);
        self.held.clear();
        &self.out
    }

    fn finish(&mut self, reason: FinishReason, id: u32) -> Step<'_> {
        self.finished = Some(reason);
        self.out.push_str(&self.held);
        self.held.clear();
        Step::Finished {
            reason,
            id,
            text: &self.out,
        }
    }

    /// Where the first stop string starts in `held`.
    fn first_stop(&self) -> Option<usize> {
        self.stop
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
    }

    /// The length of the longest suffix of `held` that is a proper prefix of a stop string.
    fn held_back(&self) -> usize {
        let mut keep = 0;
        for s in &self.stop {
            for k in (keep + 1..s.len()).rev() {
                if s.is_char_boundary(k) && s.get(..k).is_some_and(|p| self.held.ends_with(p)) {
                    keep = k;
                    break;
                }
            }
        }
        keep
    }

    /// Tokens taken so far.
    pub fn produced(&self) -> usize {
        self.produced
    }

    /// The most tokens this generation will take.
    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn finished(&self) -> Option<FinishReason> {
        self.finished
    }

    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }
}
