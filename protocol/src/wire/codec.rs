//! Encoding and decoding of control-channel frames.
//!
//! Decoding is total: every input, however broken, gives a value or a typed
//! [`CodecError`] with a one-line explanation; nothing panics. A frame is first checked
//! against the size limit, parsed as a JSON object and dispatched on its `type`; then each
//! field is decoded on its own so that an error names the field that was wrong. Unknown
//! extra fields are ignored (forward compatibility within a protocol version).

use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::hot;
use super::{
    Cancel, Control, Heartbeat, Hello, ModelArtifact, Offer, OfferResult, PROTOCOL_VERSION,
    PlaceRunner, Publish, PublishedChunk, Refused, RemoveRunner, ResultMessage, ResultStatus,
    Retract, RouterMessage, ToRouter, TokenDelta, Welcome, WireMessage, WorkerResult,
};
use crate::candidate::{Candidate, Tier};
use crate::ids::{AssignmentId, NodeId, WorkerId};

/// Which side rejected a frame whose type belongs to the other direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Decoding at a worker (router → worker frames expected).
    AtWorker,
    /// Decoding at the router (worker → router frames expected).
    AtRouter,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::AtWorker => {
                "at a worker (only offer, cancel, drain, place-runner, remove-runner, welcome and refused are)"
            }
            Direction::AtRouter => {
                "at the router (only hello, heartbeat, offer-result, token, result, publish and retract are)"
            }
        })
    }
}

/// Why a frame could not be decoded (or encoded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error(
        "frame of {len} bytes exceeds the {limit}-byte limit: send a smaller request or raise the frame limit"
    )]
    TooLarge { len: usize, limit: usize },
    #[error("malformed frame: {detail}")]
    Malformed { detail: String },
    #[error(
        "unknown message type {ty:?}: the peer speaks another protocol; run matching den versions"
    )]
    UnknownType { ty: String },
    #[error("message type {ty:?} is not valid {direction}")]
    UnexpectedType { ty: String, direction: Direction },
    #[error(
        "protocol version {got} is not supported (this side speaks {supported}): run matching den versions"
    )]
    UnsupportedVersion { got: u64, supported: u32 },
    #[error("invalid field `{field}`: {detail}")]
    InvalidField { field: String, detail: String },
    #[error("could not encode frame: {detail}")]
    Encode { detail: String },
}

/// What a worker makes of one frame.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerInbound {
    /// An offer or cancel addressed to this worker.
    Router(RouterMessage),
    /// An operator control addressed to this worker.
    Control(Control),
    Welcome(Welcome),
    Refused(Refused),
    /// An offer or cancel addressed to another worker (a shared channel): not for us,
    /// not validated further.
    Ignored {
        to: WorkerId,
        ty: &'static str,
    },
}

/// Encode a frame as JSON bytes.
pub fn encode<M: WireMessage>(message: &M) -> Result<Vec<u8>, CodecError> {
    encode_text(message).map(String::into_bytes)
}

/// Encode a frame as JSON text, for a WebSocket text message (no second copy to check
/// that JSON is UTF-8: it always is).
pub fn encode_text<M: WireMessage>(message: &M) -> Result<String, CodecError> {
    serde_json::to_string(message).map_err(|e| CodecError::Encode {
        detail: one_line(&e.to_string()),
    })
}

/// Decode a frame arriving at worker `me`.
pub fn decode_for_worker(
    bytes: &[u8],
    max_frame: usize,
    me: &WorkerId,
) -> Result<WorkerInbound, CodecError> {
    if bytes.len() <= max_frame
        && let Some(frame) = hot::for_worker(bytes, me)
    {
        return Ok(frame);
    }
    let (ty, mut obj) = open(bytes, max_frame)?;
    match ty.as_str() {
        "offer" | "cancel" => {
            let to: WorkerId = field(&mut obj, "to")?;
            let ty: &'static str = if ty == "offer" { "offer" } else { "cancel" };
            if &to != me {
                return Ok(WorkerInbound::Ignored { to, ty });
            }
            let message = if ty == "offer" {
                RouterMessage::Offer(Box::new(decode_offer(&mut obj)?))
            } else {
                RouterMessage::Cancel(Cancel {
                    assignment: assignment(&mut obj)?,
                })
            };
            Ok(WorkerInbound::Router(message))
        }
        "drain" => {
            let to: WorkerId = field(&mut obj, "to")?;
            if &to != me {
                return Ok(WorkerInbound::Ignored { to, ty: "drain" });
            }
            Ok(WorkerInbound::Control(Control::Drain {
                draining: field(&mut obj, "draining")?,
            }))
        }
        "place-runner" => {
            let to: WorkerId = field(&mut obj, "to")?;
            if &to != me {
                return Ok(WorkerInbound::Ignored {
                    to,
                    ty: "place-runner",
                });
            }
            let (instance_id, runner_id) = runner_ids(&mut obj)?;
            let artifact: ModelArtifact = field(&mut obj, "artifact")?;
            artifact
                .validate()
                .map_err(|(field, detail)| invalid(&field, &detail))?;
            let source: String = field(&mut obj, "source")?;
            non_empty("source", source.trim())?;
            Ok(WorkerInbound::Control(Control::PlaceRunner(Box::new(
                PlaceRunner {
                    instance_id,
                    runner_id,
                    artifact,
                    source,
                },
            ))))
        }
        "remove-runner" => {
            let to: WorkerId = field(&mut obj, "to")?;
            if &to != me {
                return Ok(WorkerInbound::Ignored {
                    to,
                    ty: "remove-runner",
                });
            }
            let (instance_id, runner_id) = runner_ids(&mut obj)?;
            Ok(WorkerInbound::Control(Control::RemoveRunner(
                RemoveRunner {
                    instance_id,
                    runner_id,
                },
            )))
        }
        "welcome" => {
            version(&mut obj)?;
            Ok(WorkerInbound::Welcome(Welcome {
                protocol_version: PROTOCOL_VERSION,
                heartbeat_interval_ms: positive_ms(&mut obj, "heartbeat_interval_ms")?,
                heartbeat_timeout_ms: positive_ms(&mut obj, "heartbeat_timeout_ms")?,
            }))
        }
        "refused" => Ok(WorkerInbound::Refused(Refused {
            reason: field(&mut obj, "reason")?,
            detail: field(&mut obj, "detail")?,
        })),
        "hello" | "heartbeat" | "offer-result" | "token" | "result" | "publish" | "retract" => {
            Err(CodecError::UnexpectedType {
                ty,
                direction: Direction::AtWorker,
            })
        }
        _ => Err(CodecError::UnknownType { ty: one_line(&ty) }),
    }
}

/// Decode a frame arriving at the router.
pub fn decode_for_router(bytes: &[u8], max_frame: usize) -> Result<ToRouter, CodecError> {
    if bytes.len() <= max_frame
        && let Some(frame) = hot::for_router(bytes)
    {
        return Ok(frame);
    }
    let (ty, mut obj) = open(bytes, max_frame)?;
    match ty.as_str() {
        "hello" => {
            version(&mut obj)?;
            let worker_id: WorkerId = field(&mut obj, "worker_id")?;
            name("worker_id", worker_id.as_str())?;
            let node: NodeId = field(&mut obj, "node")?;
            name("node", node.as_str())?;
            let credential: Option<String> = opt_field(&mut obj, "credential")?;
            if let Some(c) = &credential
                && (c.len() != 64 || !c.bytes().all(|b| b.is_ascii_hexdigit()))
            {
                return Err(invalid("credential", "must be 64 hexadecimal digits"));
            }
            Ok(ToRouter::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                worker_id,
                node,
                epoch: field(&mut obj, "epoch")?,
                credential,
            }))
        }
        "heartbeat" => Ok(ToRouter::Heartbeat(Box::new(Heartbeat {
            observation: field(&mut obj, "observation")?,
        }))),
        "offer-result" => {
            let assignment = assignment(&mut obj)?;
            let worker_epoch = field(&mut obj, "worker_epoch")?;
            let accepted: bool = field(&mut obj, "accepted")?;
            let r = OfferResult {
                assignment,
                worker_epoch,
                accepted,
                reason: opt_field(&mut obj, "reason")?,
            };
            check_offer_result(&r)?;
            Ok(ToRouter::OfferResult(r))
        }
        "token" => Ok(ToRouter::Token(TokenDelta {
            assignment: assignment(&mut obj)?,
            token: field(&mut obj, "token")?,
            index: field(&mut obj, "index")?,
        })),
        "result" => {
            let assignment = assignment(&mut obj)?;
            let result: Box<WorkerResult> = field(&mut obj, "result")?;
            check_result(&result)?;
            Ok(ToRouter::Result(ResultMessage { assignment, result }))
        }
        "publish" => {
            let chunks: Vec<PublishedChunk> = field(&mut obj, "chunks")?;
            check_publish(&chunks)?;
            Ok(ToRouter::Publish(Publish { chunks }))
        }
        "retract" => Ok(ToRouter::Retract(Retract {
            chunks: field(&mut obj, "chunks")?,
        })),
        "offer" | "cancel" | "drain" | "place-runner" | "remove-runner" | "welcome" | "refused" => {
            Err(CodecError::UnexpectedType {
                ty,
                direction: Direction::AtRouter,
            })
        }
        _ => Err(CodecError::UnknownType { ty: one_line(&ty) }),
    }
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Size check, JSON parse, object check and `type` extraction.
fn open(bytes: &[u8], max_frame: usize) -> Result<(String, Map<String, Value>), CodecError> {
    if bytes.len() > max_frame {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            limit: max_frame,
        });
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| CodecError::Malformed {
        detail: one_line(&format!("not JSON: {e}")),
    })?;
    let Value::Object(mut obj) = value else {
        return Err(malformed("a frame must be a JSON object"));
    };
    match obj.remove("type") {
        Some(Value::String(ty)) => Ok((ty, obj)),
        Some(_) => Err(malformed("the `type` field must be a string")),
        None => Err(malformed("the frame has no `type` field")),
    }
}

fn decode_offer(obj: &mut Map<String, Value>) -> Result<Offer, CodecError> {
    let assignment = assignment(obj)?;
    let worker_epoch = field(obj, "worker_epoch")?;
    let offer = Offer {
        assignment,
        worker_epoch,
        request: Arc::new(field(obj, "request")?),
        candidate: field(obj, "candidate")?,
        estimate: field(obj, "estimate")?,
    };
    check_offer(&offer)?;
    Ok(offer)
}

// The rules a decoded frame must also meet, on either decoding path (`hot` too).

/// A declined offer says why.
pub(super) fn check_offer_result(r: &OfferResult) -> Result<(), CodecError> {
    if !r.accepted && r.reason.is_none() {
        return Err(invalid("reason", "a declined offer must carry a reason"));
    }
    Ok(())
}

/// A publication's rules beyond its types: every chunk has a token, and a local replica
/// is in RAM or on SSD (a GPU copy is not durable storage).
pub(super) fn check_publish(chunks: &[PublishedChunk]) -> Result<(), CodecError> {
    for c in chunks {
        if c.entry.token_count == 0 {
            return Err(invalid(
                "chunks.entry.token_count",
                "a chunk has at least one token",
            ));
        }
        if c.tiers.iter().any(|t| !matches!(t, Tier::Ram | Tier::Ssd)) {
            return Err(invalid(
                "chunks.tiers",
                "local replica tiers are ram or ssd",
            ));
        }
    }
    Ok(())
}

/// A result carries a failure exactly when it failed.
pub(super) fn check_result(r: &WorkerResult) -> Result<(), CodecError> {
    match (r.status, &r.failure) {
        (ResultStatus::Failed, None) => {
            Err(invalid("result.failure", "a failed result must say why"))
        }
        (ResultStatus::Completed, Some(_)) => Err(invalid(
            "result.failure",
            "a completed result cannot carry a failure",
        )),
        _ => Ok(()),
    }
}

/// An offer's request is its assignment's, and its candidate's costs are sane.
pub(super) fn check_offer(o: &Offer) -> Result<(), CodecError> {
    if o.request.id != o.assignment.request {
        return Err(invalid(
            "request.id",
            "does not match the assignment's request id",
        ));
    }
    validate_candidate(&o.candidate)
}

fn assignment(obj: &mut Map<String, Value>) -> Result<AssignmentId, CodecError> {
    let a: AssignmentId = field(obj, "assignment")?;
    valid_assignment(&a)?;
    Ok(a)
}

pub(super) fn valid_assignment(a: &AssignmentId) -> Result<(), CodecError> {
    non_empty("assignment.request", a.request.as_str())?;
    if a.attempt == 0 {
        return Err(invalid("assignment.attempt", "attempts start at 1"));
    }
    Ok(())
}

/// Candidate costs are non-negative finite numbers and the page size is positive (§1.3).
fn validate_candidate(c: &Candidate) -> Result<(), CodecError> {
    non_empty("candidate.worker_id", c.worker_id.as_str())?;
    let costs = [
        ("candidate.queue_ms", c.queue_ms),
        ("candidate.prefix_load_ms", c.prefix_load_ms),
        ("candidate.gpu_restore_ms", c.gpu_restore_ms),
        ("candidate.prefill_ms_per_token", c.prefill_ms_per_token),
        ("candidate.first_token_ms", c.first_token_ms),
    ];
    for (name, v) in costs {
        if !(v.is_finite() && v >= 0.0) {
            return Err(invalid(name, "must be a finite number ≥ 0"));
        }
    }
    if c.page_size == 0 {
        return Err(invalid("candidate.page_size", "must be > 0"));
    }
    Ok(())
}

/// `instance_id` and `runner_id` of a management frame, both non-empty.
fn runner_ids(
    obj: &mut Map<String, Value>,
) -> Result<(crate::skulk::InstanceId, crate::skulk::RunnerId), CodecError> {
    let instance: crate::skulk::InstanceId = field(obj, "instance_id")?;
    non_empty("instance_id", instance.as_str())?;
    let runner: crate::skulk::RunnerId = field(obj, "runner_id")?;
    non_empty("runner_id", runner.as_str())?;
    Ok((instance, runner))
}

fn version(obj: &mut Map<String, Value>) -> Result<(), CodecError> {
    let got: u64 = field(obj, "protocol_version")?;
    if got != PROTOCOL_VERSION as u64 {
        return Err(CodecError::UnsupportedVersion {
            got,
            supported: PROTOCOL_VERSION,
        });
    }
    Ok(())
}

fn positive_ms(obj: &mut Map<String, Value>, name: &'static str) -> Result<u64, CodecError> {
    let v: u64 = field(obj, name)?;
    if v == 0 {
        return Err(invalid(name, "must be > 0"));
    }
    Ok(v)
}

/// Longest worker or node name a peer may claim, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// A name a peer gives itself, which ends up in logs, the console and recordings: one
/// to [`MAX_NAME_BYTES`] bytes of printable text, no control or escape characters, no
/// surrounding whitespace.
fn name(field: &'static str, s: &str) -> Result<(), CodecError> {
    non_empty(field, s)?;
    if s.len() > MAX_NAME_BYTES {
        return Err(invalid(
            field,
            &format!("is {} bytes; at most {MAX_NAME_BYTES} are allowed", s.len()),
        ));
    }
    if crate::text::printable(s) != s {
        return Err(invalid(
            field,
            "contains control or escape characters; use printable text",
        ));
    }
    if s.trim() != s {
        return Err(invalid(field, "has leading or trailing whitespace"));
    }
    Ok(())
}

fn non_empty(name: &'static str, s: &str) -> Result<(), CodecError> {
    if s.is_empty() {
        Err(invalid(name, "must not be empty"))
    } else {
        Ok(())
    }
}

/// Remove and decode a required field.
fn field<T: DeserializeOwned>(
    obj: &mut Map<String, Value>,
    name: &'static str,
) -> Result<T, CodecError> {
    match obj.remove(name) {
        None => Err(invalid(name, "is missing")),
        Some(v) => serde_json::from_value(v).map_err(|e| invalid(name, &e.to_string())),
    }
}

/// Remove and decode an optional field (absent or null → `None`).
fn opt_field<T: DeserializeOwned>(
    obj: &mut Map<String, Value>,
    name: &'static str,
) -> Result<Option<T>, CodecError> {
    match obj.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v)
            .map(Some)
            .map_err(|e| invalid(name, &e.to_string())),
    }
}

fn invalid(field: &str, detail: &str) -> CodecError {
    CodecError::InvalidField {
        field: field.to_owned(),
        detail: one_line(detail),
    }
}

fn malformed(detail: &str) -> CodecError {
    CodecError::Malformed {
        detail: detail.to_owned(),
    }
}

/// Error details quote peer input: keep them to one short line.
fn one_line(s: &str) -> String {
    const MAX: usize = 160;
    // Escape sequences go whole, not just their control characters (den_protocol::text).
    let clean = crate::text::printable(s);
    let mut out: String = clean.chars().take(MAX).collect();
    if clean.chars().count() > MAX {
        out.push('…');
    }
    out
}
