//! The OpenAI-compatible chat shapes a probe needs (snake_case).
//!
//! Skulk's streamed chunks say `"object": "chat.completion"` (not `.chunk`); both are
//! accepted. Fields den does not read are kept in `extra`.

use crate::skulk::extra::Extra;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::ModelId;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, a list of content parts, or null.
    #[serde(default)]
    pub content: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatMessage {
    pub fn user(text: &str) -> ChatMessage {
        ChatMessage {
            role: "user".to_owned(),
            content: Some(Value::String(text.to_owned())),
            reasoning_content: None,
            extra: Default::default(),
        }
    }

    /// The content when it is plain text.
    pub fn text(&self) -> Option<&str> {
        self.content.as_ref().and_then(Value::as_str)
    }
}

/// `POST /v1/chat/completions` body (the fields den sets; the rest go in `extra`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: ModelId,
    pub messages: Vec<ChatMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: i64,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub choices: Vec<ChatChoice>,
    #[serde(default)]
    pub usage: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    #[serde(default)]
    pub index: u64,
    pub message: ChatMessage,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// One `data:` frame of a streamed completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: i64,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    #[serde(default)]
    pub usage: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    #[serde(default)]
    pub index: u64,
    pub delta: ChatMessage,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}
