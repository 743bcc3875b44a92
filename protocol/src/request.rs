//! Generation requests, validated at the edge.
//!
//! A [`GenerationRequest`] can only be built through [`GenerationRequest::new`] or by
//! deserialising JSON, and both paths run the same checks, so code behind the edge never
//! sees an empty token vector or a zero generation budget.

use serde::{Deserialize, Serialize};

use crate::ids::{ModelFingerprint, RequestId, RouteId};

/// A token id.
pub type Token = u32;

/// Sampling parameters, applied by a worker running a real model (den-model's sampler:
/// temperature, then top-k and top-p, then a draw seeded by `seed`, or by the request id
/// when none is given, so a replayed request samples the same tokens). The synthetic
/// engine ignores them: its output is a fixed function of the prompt.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Sampling {
    /// `0` is greedy; absent is OpenAI's default, 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Keep the `top_k` most likely tokens; absent or 0 keeps all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Texts that end the output (not included in it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Token ids that end the output, besides the model's end-of-sequence tokens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_token_ids: Vec<Token>,
    /// Keep generating past end-of-sequence tokens (`stop_token_ids` still stop).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_eos: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// An exact continuation request.
///
/// The last token is *pending*: it has no KV row yet. The processed count is
/// `tokens.len() - 1`; decoding `max_new_tokens` appends that many KV rows, so the
/// projected context is `processed + max_new_tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawRequest")]
pub struct GenerationRequest {
    pub id: RequestId,
    pub model: ModelFingerprint,
    pub tokens: Vec<Token>,
    pub max_new_tokens: u32,
    #[serde(default)]
    pub arrival: u64,
    #[serde(default)]
    pub priority: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation_id: Option<RouteId>,
    #[serde(default)]
    pub sampling: Sampling,
    /// Simulator only: the tokens the simulated engine returns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated_output: Option<Vec<Token>>,
}

/// Why a request was refused at the edge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request id is empty: give every request a non-empty id")]
    EmptyId,
    #[error("model fingerprint is blank: name the model the request is for")]
    BlankModel,
    #[error("request has no tokens: a prompt needs at least one token")]
    NoTokens,
    #[error("max_new_tokens is 0: ask for at least one new token")]
    ZeroMaxNew,
}

impl GenerationRequest {
    pub fn new(
        id: impl Into<RequestId>,
        model: impl Into<ModelFingerprint>,
        tokens: Vec<Token>,
        max_new_tokens: u32,
    ) -> Result<Self, RequestError> {
        RawRequest {
            id: id.into(),
            model: model.into(),
            tokens,
            max_new_tokens,
            arrival: 0,
            priority: 0,
            continuation_id: None,
            sampling: Sampling::default(),
            simulated_output: None,
        }
        .try_into()
    }

    pub fn with_simulated_output(mut self, output: Vec<Token>) -> Self {
        self.simulated_output = Some(output);
        self
    }

    pub fn with_continuation_id(mut self, route: impl Into<RouteId>) -> Self {
        self.continuation_id = Some(route.into());
        self
    }

    /// Tokens with KV rows once the prompt is processed: all but the pending last token.
    pub fn processed(&self) -> u32 {
        // `tokens` is non-empty by construction.
        (self.tokens.len() as u32).saturating_sub(1)
    }

    /// Projected context size after decoding: `processed + max_new_tokens`.
    pub fn target(&self) -> u32 {
        self.processed().saturating_add(self.max_new_tokens)
    }

    /// The processed prefix (excludes the pending token).
    pub fn processed_tokens(&self) -> &[Token] {
        &self.tokens[..self.processed() as usize]
    }

    /// The route this request's KV lives in: its continuation id, else its request id.
    pub fn route_id(&self) -> RouteId {
        self.continuation_id
            .clone()
            .unwrap_or_else(|| RouteId::from(&self.id))
    }
}

#[derive(Deserialize)]
struct RawRequest {
    id: RequestId,
    model: ModelFingerprint,
    tokens: Vec<Token>,
    max_new_tokens: u32,
    #[serde(default)]
    arrival: u64,
    #[serde(default)]
    priority: u32,
    #[serde(default)]
    continuation_id: Option<RouteId>,
    #[serde(default)]
    sampling: Sampling,
    #[serde(default)]
    simulated_output: Option<Vec<Token>>,
}

impl TryFrom<RawRequest> for GenerationRequest {
    type Error = RequestError;

    fn try_from(r: RawRequest) -> Result<Self, Self::Error> {
        if r.id.0.is_empty() {
            return Err(RequestError::EmptyId);
        }
        if r.model.0.trim().is_empty() {
            return Err(RequestError::BlankModel);
        }
        if r.tokens.is_empty() {
            return Err(RequestError::NoTokens);
        }
        if r.max_new_tokens == 0 {
            return Err(RequestError::ZeroMaxNew);
        }
        Ok(GenerationRequest {
            id: r.id,
            model: r.model,
            tokens: r.tokens,
            max_new_tokens: r.max_new_tokens,
            arrival: r.arrival,
            priority: r.priority,
            continuation_id: r.continuation_id,
            sampling: r.sampling,
            simulated_output: r.simulated_output,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_arrival_and_priority_to_zero() {
        let r: GenerationRequest =
            serde_json::from_str(r#"{"id":"r","model":"m","tokens":[1,2,3],"max_new_tokens":2}"#)
                .unwrap();
        assert_eq!((r.arrival, r.priority), (0, 0));
        assert_eq!((r.processed(), r.target()), (2, 4));
        assert_eq!(r.route_id(), RouteId::from("r"));
    }

    #[test]
    fn rejects_invalid_requests_with_one_error_each() {
        assert_eq!(
            GenerationRequest::new("", "m", vec![1], 1),
            Err(RequestError::EmptyId)
        );
        assert_eq!(
            GenerationRequest::new("r", " ", vec![1], 1),
            Err(RequestError::BlankModel)
        );
        assert_eq!(
            GenerationRequest::new("r", "m", vec![], 1),
            Err(RequestError::NoTokens)
        );
        assert_eq!(
            GenerationRequest::new("r", "m", vec![1], 0),
            Err(RequestError::ZeroMaxNew)
        );
        let bad = serde_json::from_str::<GenerationRequest>(
            r#"{"id":"r","model":"m","tokens":[],"max_new_tokens":2}"#,
        );
        assert!(bad.unwrap_err().to_string().contains("no tokens"));
    }
}
