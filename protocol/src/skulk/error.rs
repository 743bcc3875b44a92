//! Error bodies of the management API, typed.
//!
//! Skulk answers errors three ways: an OpenAI-style envelope
//! `{"error": {"message", "type", "param", "code"}}` for every `HTTPException`, FastAPI's
//! unwrapped 422 `{"detail": [...]}` for request validation, and a text/plain
//! `Internal Server Error` for unhandled exceptions. [`ApiError::from_response`] turns any
//! non-2xx response into one [`ApiError`] whose `Display` is a single line.

use crate::skulk::extra::Extra;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::one_line;

/// `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    pub error: ErrorInfo,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorInfo {
    #[serde(default)]
    pub message: String,
    /// The HTTP reason phrase in Skulk (`"Not Found"`), an OpenAI error type elsewhere
    /// (`"invalid_request_error"`).
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub param: Option<String>,
    #[serde(default)]
    pub code: Option<ErrorCode>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `code`: an integer status in Skulk, a string in some OpenAI-compatible servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ErrorCode {
    Number(i64),
    Text(String),
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::Number(n) => write!(f, "{n}"),
            ErrorCode::Text(t) => f.write_str(t),
        }
    }
}

/// One entry of FastAPI's 422 `detail` list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationIssue {
    #[serde(default, rename = "type")]
    pub kind: String,
    /// Where: `["query", "model_id"]`, `["body", "sharding"]`.
    #[serde(default)]
    pub loc: Vec<Value>,
    #[serde(default)]
    pub msg: String,
    #[serde(default)]
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctx: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl ValidationIssue {
    /// `query.model_id`.
    pub fn location(&self) -> String {
        self.loc
            .iter()
            .map(|part| match part {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// `{"detail": [...]}` or `{"detail": "…"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Detail {
    Issues(Vec<ValidationIssue>),
    Message(String),
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
struct DetailBody {
    detail: Detail,
}

/// A non-2xx answer of the management API.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiError {
    /// The OpenAI-style envelope.
    Envelope { status: u16, error: Box<ErrorInfo> },
    /// FastAPI request validation (422), not wrapped in an envelope.
    Validation {
        status: u16,
        issues: Vec<ValidationIssue>,
    },
    /// `{"detail": "…"}` (e.g. an unknown route on a plain FastAPI app).
    Detail { status: u16, message: String },
    /// A body that is not JSON, e.g. text/plain `Internal Server Error`.
    Plain { status: u16, body: String },
    /// JSON of a shape den does not know.
    Unrecognised { status: u16, body: Value },
}

impl ApiError {
    /// Classifies a response body. `status` is the HTTP status code.
    pub fn from_response(status: u16, body: &str) -> ApiError {
        let Ok(value) = serde_json::from_str::<Value>(body) else {
            return ApiError::Plain {
                status,
                body: body.trim().to_owned(),
            };
        };
        if let Ok(envelope) = serde_json::from_value::<ErrorEnvelope>(value.clone()) {
            return ApiError::Envelope {
                status,
                error: Box::new(envelope.error),
            };
        }
        if let Ok(detail) = serde_json::from_value::<DetailBody>(value.clone()) {
            return match detail.detail {
                Detail::Issues(issues) => ApiError::Validation { status, issues },
                Detail::Message(message) => ApiError::Detail { status, message },
            };
        }
        ApiError::Unrecognised {
            status,
            body: value,
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            ApiError::Envelope { status, .. }
            | ApiError::Validation { status, .. }
            | ApiError::Detail { status, .. }
            | ApiError::Plain { status, .. }
            | ApiError::Unrecognised { status, .. } => *status,
        }
    }

    /// The human message (envelope message, first validation message, plain body).
    pub fn message(&self) -> String {
        match self {
            ApiError::Envelope { error, .. } => one_line(&error.message),
            ApiError::Validation { issues, .. } => issues
                .iter()
                .map(|i| format!("{}: {}", one_line(&i.location()), one_line(&i.msg)))
                .collect::<Vec<_>>()
                .join("; "),
            ApiError::Detail { message, .. } => one_line(message),
            ApiError::Plain { body, .. } => one_line(body),
            ApiError::Unrecognised { body, .. } => one_line(&body.to_string()),
        }
    }

    /// 404 or 405: the route (or the resource) is not there.
    pub fn is_not_found(&self) -> bool {
        matches!(self.status(), 404 | 405)
    }

    /// 4xx: the server refused before doing anything (Skulk checks before forwarding a
    /// command). 5xx is ambiguous: an effect may or may not have happened.
    pub fn is_refusal(&self) -> bool {
        (400..500).contains(&self.status())
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Envelope { status, error } => {
                if error.kind.is_empty() {
                    write!(f, "HTTP {status}: {}", one_line(&error.message))
                } else {
                    write!(
                        f,
                        "HTTP {status} {}: {}",
                        one_line(&error.kind),
                        one_line(&error.message)
                    )
                }
            }
            ApiError::Validation { status, .. } => {
                write!(f, "HTTP {status} request rejected: {}", self.message())
            }
            ApiError::Detail { status, message } => {
                write!(f, "HTTP {status}: {}", one_line(message))
            }
            ApiError::Plain { status, body } => {
                if body.is_empty() {
                    write!(f, "HTTP {status} with an empty body")
                } else {
                    write!(f, "HTTP {status}: {}", clip(&one_line(body)))
                }
            }
            ApiError::Unrecognised { status, body } => {
                write!(
                    f,
                    "HTTP {status} with an unrecognised body: {}",
                    clip(&one_line(&body.to_string()))
                )
            }
        }
    }
}

impl std::error::Error for ApiError {}

/// A body quoted in an error (an HTML page, a JSON dump) keeps its first 240 characters.
fn clip(s: &str) -> String {
    const MAX: usize = 240;
    match s.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

/// Why a 2xx body could not be read as the expected type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not read the {what} response: {detail}")]
pub struct DecodeError {
    pub what: &'static str,
    pub detail: String,
}

/// Reads a 2xx body as `T`, or classifies a non-2xx body as an [`ApiError`].
pub fn decode_response<T: serde::de::DeserializeOwned>(
    status: u16,
    body: &str,
    what: &'static str,
) -> Result<T, ResponseError> {
    if !(200..300).contains(&status) {
        return Err(ResponseError::Api(ApiError::from_response(status, body)));
    }
    serde_json::from_str(body).map_err(|e| {
        ResponseError::Decode(DecodeError {
            what,
            detail: one_line(&e.to_string()),
        })
    })
}

/// A response that was not what the caller needed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResponseError {
    #[error("{0}")]
    Api(ApiError),
    #[error("{0}")]
    Decode(DecodeError),
}
