//! Reading a JSON request body at the edge: content type, size limit, syntax.
//!
//! A body over the limit is answered with 413 in the OpenAI envelope. The rest of it is
//! read and discarded (up to [`DRAIN_LIMIT`]) first, so the client, which is still
//! sending, reads the 413 instead of a connection reset.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use futures_util::StreamExt;
use serde_json::Value;

use super::error::ApiError;

/// How much of an oversized body is read and thrown away before giving up on a clean
/// answer (the connection is then closed under the client).
pub const DRAIN_LIMIT: usize = 64 << 20;

/// Why a body could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Over the limit (the excess was drained, so the client reads the answer).
    TooLarge { limit: usize },
    /// The connection failed while the body was read.
    Unreadable(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge { limit } => write!(
                f,
                "the request body is larger than {limit} bytes: send a smaller one"
            ),
            BodyError::Unreadable(e) => write!(f, "could not read the request body: {e}"),
        }
    }
}

/// The body's bytes, at most `limit` of them. An oversized body is read and thrown away
/// (up to [`DRAIN_LIMIT`]) before the error, so the client sees the answer rather than a
/// reset connection. Shared by every route that takes a body.
pub async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|n| n > limit as u64) {
        drain(&mut stream, 0).await;
        return Err(BodyError::TooLarge { limit });
    }
    let mut bytes = Vec::with_capacity(declared.map_or(1024, |n| n as usize));
    while let Some(frame) = stream.next().await {
        let frame = frame.map_err(|e| BodyError::Unreadable(e.to_string()))?;
        if bytes.len() + frame.len() > limit {
            drain(&mut stream, bytes.len() + frame.len()).await;
            return Err(BodyError::TooLarge { limit });
        }
        bytes.extend_from_slice(&frame);
    }
    Ok(bytes)
}

/// The body as JSON, or the error that names what was wrong with it.
pub async fn read_json(headers: &HeaderMap, body: Body, limit: usize) -> Result<Value, ApiError> {
    check_content_type(headers)?;
    let bytes = read_limited(headers, body, limit)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge { limit } => ApiError::bad_request(
                "request_too_large",
                format!("the request body is larger than {limit} bytes: send a smaller prompt"),
            )
            .with_status(StatusCode::PAYLOAD_TOO_LARGE),
            BodyError::Unreadable(_) => ApiError::bad_request("invalid_body", e.to_string()),
        })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "invalid_json",
            "the request body is empty: send a JSON object",
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(
            "invalid_json",
            format!("the request body is not valid JSON: {e}"),
        )
    })
}

/// `Content-Type` must be `application/json` (parameters such as `charset` allowed).
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("(not text)"));
    let essence = ct.map(|c| {
        c.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    });
    match essence.as_deref() {
        Some("application/json") => Ok(()),
        Some(_) => Err(ApiError::bad_request(
            "invalid_content_type",
            format!(
                "Content-Type is {:?}: send the body as JSON with `Content-Type: application/json`",
                ct.unwrap_or_default()
            ),
        )),
        None => Err(ApiError::bad_request(
            "invalid_content_type",
            "Content-Type is missing: send the body as JSON with `Content-Type: application/json`",
        )),
    }
}

async fn drain(stream: &mut axum::body::BodyDataStream, mut read: usize) {
    while read <= DRAIN_LIMIT {
        match stream.next().await {
            Some(Ok(frame)) => read += frame.len(),
            _ => return,
        }
    }
}
