//! Console recordings: the file format (pure encode/decode, version policy, redaction).
//!
//! A recording is one or more segment files. Each segment is newline-delimited JSON:
//!
//! ```text
//! {"format":"den-recording","version":"1.0","den_version":"0.1.0",…}   header
//! {"at":0,"snapshot":0,"state":{…}}                                    model checkpoint
//! {"at":12,"event":"source-added","source":"router",…}                  session event
//! {"at":40,"event":"feed","source":"router","message":{…}}
//! {"at":9000,"gap":3}                                                   3 events dropped
//! {"at":9100,"snapshot":812,"state":{…}}                                after 812 events
//! {"at":9400,"end":{"reason":"closed","events":830,"dropped":3,…}}     clean close
//! ```
//!
//! - Every line but the header starts with `{"at":N,` where `N` is the session offset in
//!   milliseconds, non-decreasing through the file (and across segments). The key after
//!   `at` says what the line is ([`peek`] reads both without parsing the line), so a
//!   reader can bisect a file by byte position and find snapshots by scanning backwards.
//! - Event lines are [`Stamped`] session events exactly as the console applied them
//!   (after [`redact`]). Snapshot lines carry `snapshot: K` (events before it, over the
//!   whole recording) and an opaque `state`: the console's model checkpoint, from which
//!   replay rebuilds exactly the model that playing the first `K` events gives.
//! - The header names the format version. A reader accepts any `1.x` and refuses another
//!   major version with a one-line message ([`decode_header`]); unknown header keys and
//!   unknown line kinds of a newer minor version are kept or skipped.
//! - An event line may carry, instead of its big value (a Skulk `/state`, a worker
//!   observation, a decision record), a `delta` member: a patch against a *base* named
//!   by a [`delta::Base`] key ([`delta`]). The base of a key is the value the last
//!   delta line of that key produced, or, when there is none since the last snapshot
//!   line (a full line or a `route-gone` of the key drops it; at most 256 keys are kept,
//!   least recently produced dropped first), the value the replaying model holds for
//!   the key (a `feed-routes` key, the records of a router feed snapshot, always takes
//!   the model's records of its source). Writer and reader follow the same rules over
//!   the same lines, so a reader that starts at any snapshot decodes exactly what the
//!   writer wrote.
//! - A crash leaves at most one torn last line; readers drop it and say so.
//! - Segments: `x.jsonl` is followed by `x.1.jsonl`, `x.2.jsonl`… after rotation; each
//!   starts with a header and a snapshot (it replays on its own) and the one before it
//!   ends with `{"at":N,"end":{"reason":"rotated","next":"x.1.jsonl",…}}`. A name ending
//!   in `.zst` is zstd: every snapshot starts a new zstd frame, preceded by a skippable
//!   frame (magic `0x184D2A5E`) holding `{"at":N,"snapshot":K}`, so that a reader finds
//!   snapshots by walking frame headers and decompresses only from the one it needs.
//!
//! Nothing here does I/O: the console's recorder and replayer own the files.

pub mod delta;
pub mod redact;

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::session::{SESSION_VERSION, SourceId, SourceKind, Stamped};
use crate::time::Millis;

pub use redact::{RedactionPolicy, Redactor};

/// The `format` of every recording header.
pub const FORMAT: &str = "den-recording";
/// The major version this den writes and reads.
pub const FORMAT_MAJOR: u32 = 1;
/// The minor version this den writes (readers accept any minor of their major).
pub const FORMAT_MINOR: u32 = 0;

/// The version string this den writes, `1.0`.
pub fn format_version() -> String {
    format!("{FORMAT_MAJOR}.{FORMAT_MINOR}")
}

/// One configured source, as the header lists it (URL already redacted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceInfo {
    pub source: SourceId,
    pub kind: SourceKind,
    pub url: String,
}

/// The first line of every segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub format: String,
    pub version: String,
    /// The den that wrote it (`CARGO_PKG_VERSION`).
    pub den_version: String,
    /// [`SESSION_VERSION`] of the event lines.
    pub session_version: u32,
    /// Identifies the recording; every segment of one recording carries the same id.
    pub recording: String,
    /// 0 for the first file, then 1, 2, … after each rotation.
    pub segment: u32,
    /// Wall-clock time of session offset 0, for display only (offsets are monotonic).
    pub started_at_unix_ms: u64,
    pub host: String,
    pub sources: Vec<SourceInfo>,
    pub redaction: RedactionPolicy,
    /// Console settings that change what replay draws (e.g. `stale_after_ms`). Opaque
    /// here: the console writes and reads them.
    #[serde(default)]
    pub console: Value,
    /// Keys of a newer minor version, kept.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// Why a header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("not a den recording: the first line is not a den-recording header")]
    NotARecording,
    #[error("recording format {0} is newer than this den (reads {FORMAT_MAJOR}.x): upgrade den")]
    Newer(String),
    #[error(
        "recording format {0} is older than this den reads ({FORMAT_MAJOR}.x): replay it with the den that wrote it"
    )]
    Older(String),
    #[error("recording header is malformed: {0}")]
    Malformed(String),
}

/// Encode a header line (no newline). `format` is written first so that a header is
/// recognisable from its first bytes.
pub fn encode_header(header: &Header) -> String {
    // Serialising plain data with string map keys cannot fail; the fallback keeps the
    // file readable (and refusable) if it ever did.
    serde_json::to_string(header).unwrap_or_else(|e| {
        format!(
            "{{\"format\":\"{FORMAT}\",\"version\":\"{}\",\"error\":{:?}}}",
            format_version(),
            e.to_string()
        )
    })
}

/// Decode a header line, enforcing the version policy: same major accepted (unknown keys
/// kept), another major refused.
pub fn decode_header(line: &[u8]) -> Result<Header, FormatError> {
    let value: Value =
        serde_json::from_slice(trim_line(line)).map_err(|_| FormatError::NotARecording)?;
    if value.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(FormatError::NotARecording);
    }
    let version = value
        .get("version")
        .and_then(Value::as_str)
        .ok_or_else(|| FormatError::Malformed("no version".to_owned()))?
        .to_owned();
    let major = parse_major(&version)
        .ok_or_else(|| FormatError::Malformed(format!("version {version:?} is not MAJOR.MINOR")))?;
    if major > FORMAT_MAJOR {
        return Err(FormatError::Newer(version));
    }
    if major < FORMAT_MAJOR {
        return Err(FormatError::Older(version));
    }
    serde_json::from_value(value)
        .map_err(|e| FormatError::Malformed(crate::text::one_line(&e.to_string())))
}

impl Header {
    /// A header for segment `segment` of a recording written by this den.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        den_version: &str,
        recording: &str,
        segment: u32,
        started_at_unix_ms: u64,
        host: &str,
        sources: Vec<SourceInfo>,
        redaction: RedactionPolicy,
        console: Value,
    ) -> Header {
        Header {
            format: FORMAT.to_owned(),
            version: format_version(),
            den_version: den_version.to_owned(),
            session_version: SESSION_VERSION,
            recording: recording.to_owned(),
            segment,
            started_at_unix_ms,
            host: host.to_owned(),
            sources,
            redaction,
            console,
            extra: Default::default(),
        }
    }
}

fn parse_major(version: &str) -> Option<u32> {
    let major = version.split('.').next()?;
    major.parse().ok()
}

/// What a line is, read from its first bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Header,
    Event,
    /// A model checkpoint taken after `events` events.
    Snapshot {
        events: u64,
    },
    /// `dropped` events were lost before this point (the recorder could not keep up).
    Gap {
        dropped: u64,
    },
    End,
    /// A line kind of a newer minor version: skipped.
    Other(String),
}

/// The time and kind of a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    pub at: Millis,
    pub kind: Kind,
}

/// Read the time and kind of a line from its prefix (`{"at":N,"KEY":…`), without parsing
/// the rest. `None` for anything else (a torn line, garbage). A header peeks as
/// [`Kind::Header`] at time 0.
pub fn peek(line: &[u8]) -> Option<Peek> {
    if line.starts_with(b"{\"format\":") {
        return Some(Peek {
            at: Millis::ZERO,
            kind: Kind::Header,
        });
    }
    let rest = line.strip_prefix(b"{\"at\":")?;
    let (at, rest) = leading_number(rest)?;
    let rest = rest.strip_prefix(b",\"")?;
    let end = rest.iter().position(|b| *b == b'"')?;
    let key = rest.get(..end)?;
    let after = rest.get(end + 1..)?.strip_prefix(b":")?;
    let kind = match key {
        b"event" => Kind::Event,
        b"snapshot" => Kind::Snapshot {
            events: leading_number(after)?.0,
        },
        b"gap" => Kind::Gap {
            dropped: leading_number(after)?.0,
        },
        b"end" => Kind::End,
        other => Kind::Other(String::from_utf8_lossy(other).into_owned()),
    };
    Some(Peek {
        at: Millis(at),
        kind,
    })
}

fn leading_number(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 19 {
        return None;
    }
    let (num, rest) = bytes.split_at(digits);
    let n = std::str::from_utf8(num).ok()?.parse().ok()?;
    Some((n, rest))
}

/// A line that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("line is not a recording line")]
    Unrecognised,
    #[error("malformed {kind} line: {detail}")]
    Malformed { kind: &'static str, detail: String },
}

/// Encode an event line (no newline): `{"at":N,"event":"…",…}`.
pub fn encode_event(stamped: &Stamped) -> String {
    // `Stamped` serialises `at` first, then the flattened, internally tagged event whose
    // tag comes first: the prefix `peek` reads. Serialising plain data cannot fail.
    serde_json::to_string(stamped).unwrap_or_else(|e| {
        format!(
            "{{\"at\":{},\"event\":\"note\",\"text\":{:?}}}",
            stamped.at.0,
            format!("event could not be encoded: {e}")
        )
    })
}

/// Encode an event from its (redacted) JSON value. The value must be an object with `at`
/// and `event`; they are written first.
pub fn encode_event_value(value: &Value) -> Option<String> {
    let object = value.as_object()?;
    let at = object.get("at")?.as_u64()?;
    let event = object.get("event")?;
    let mut out = format!("{{\"at\":{at},\"event\":{event}");
    for (key, v) in object {
        if key == "at" || key == "event" {
            continue;
        }
        out.push(',');
        out.push_str(&Value::String(key.clone()).to_string());
        out.push(':');
        out.push_str(&v.to_string());
    }
    out.push('}');
    Some(out)
}

/// Decode an event line.
pub fn decode_event(line: &[u8]) -> Result<Stamped, LineError> {
    serde_json::from_slice(trim_line(line)).map_err(|e| LineError::Malformed {
        kind: "event",
        detail: crate::text::one_line(&e.to_string()),
    })
}

/// Encode a snapshot line from the already-serialised state.
pub fn encode_snapshot(at: Millis, events: u64, state_json: &str) -> String {
    format!(
        "{{\"at\":{},\"snapshot\":{events},\"state\":{state_json}}}",
        at.0
    )
}

#[derive(Deserialize)]
struct SnapshotLine<S> {
    at: Millis,
    snapshot: u64,
    state: S,
}

/// Decode a snapshot line: its time, the events before it and its state.
pub fn decode_snapshot<S: DeserializeOwned>(line: &[u8]) -> Result<(Millis, u64, S), LineError> {
    let s: SnapshotLine<S> =
        serde_json::from_slice(trim_line(line)).map_err(|e| LineError::Malformed {
            kind: "snapshot",
            detail: crate::text::one_line(&e.to_string()),
        })?;
    Ok((s.at, s.snapshot, s.state))
}

/// Encode a gap line: `dropped` events were lost before `at`.
pub fn encode_gap(at: Millis, dropped: u64) -> String {
    format!("{{\"at\":{},\"gap\":{dropped}}}", at.0)
}

/// Why a segment ended cleanly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    /// `closed` (the session ended) or `rotated` (the next segment follows).
    pub reason: String,
    /// Events written over the whole recording so far.
    pub events: u64,
    /// Events lost over the whole recording so far.
    pub dropped: u64,
    /// Bytes of this segment before this line (uncompressed).
    pub bytes: u64,
    /// The next segment's file name, after a rotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Encode an end line.
pub fn encode_end(at: Millis, end: &End) -> String {
    let body = serde_json::to_string(end).unwrap_or_else(|_| "{}".to_owned());
    format!("{{\"at\":{},\"end\":{body}}}", at.0)
}

#[derive(Deserialize)]
struct EndLine {
    end: End,
}

/// Decode an end line.
pub fn decode_end(line: &[u8]) -> Result<End, LineError> {
    serde_json::from_slice::<EndLine>(trim_line(line))
        .map(|l| l.end)
        .map_err(|e| LineError::Malformed {
            kind: "end",
            detail: crate::text::one_line(&e.to_string()),
        })
}

fn trim_line(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// A time in a recording, as users type and read it: `90s`, `1m30s`, `1:30`, `1:02:03`,
/// `1500ms`, or plain seconds (`90`, `90.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Offset(pub Millis);

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.0;
        let (h, m, s, rest) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
        if h > 0 {
            write!(f, "{h}:{m:02}:{s:02}.{rest:03}")
        } else {
            write!(f, "{m:02}:{s:02}.{rest:03}")
        }
    }
}

/// Parse a time typed by a user (see [`Offset`]).
pub fn parse_offset(text: &str) -> Result<Millis, String> {
    let t = text.trim();
    let bad = || format!("{text:?} is not a time: use 90s, 1m30s, 1:30, 1:02:03 or 1500ms");
    if t.is_empty() {
        return Err(bad());
    }
    if t.contains(':') {
        let mut total = 0.0f64;
        for part in t.split(':') {
            let v: f64 = part.parse().map_err(|_| bad())?;
            if !v.is_finite() || v < 0.0 {
                return Err(bad());
            }
            total = total * 60.0 + v;
        }
        return Ok(Millis((total * 1000.0).round() as u64));
    }
    if let Some(ms) = t.strip_suffix("ms") {
        return ms.trim().parse::<u64>().map(Millis).map_err(|_| bad());
    }
    let mut total = 0.0f64;
    let mut number = String::new();
    let mut any_unit = false;
    for c in t.chars() {
        match c {
            '0'..='9' | '.' => number.push(c),
            'h' | 'm' | 's' => {
                let v: f64 = number.parse().map_err(|_| bad())?;
                number.clear();
                any_unit = true;
                total += v * match c {
                    'h' => 3600.0,
                    'm' => 60.0,
                    _ => 1.0,
                };
            }
            _ => return Err(bad()),
        }
    }
    if !number.is_empty() {
        if any_unit {
            return Err(bad());
        }
        total = number.parse().map_err(|_| bad())?;
    }
    if !total.is_finite() || total < 0.0 {
        return Err(bad());
    }
    Ok(Millis((total * 1000.0).round() as u64))
}

#[cfg(test)]
mod tests;
