//! Streaming passes over every line of a recording: event markers for the timeline and
//! the matches of a search, without decoding events (raw line bytes are matched).

use den_protocol::recording::{Kind, peek};
use den_protocol::time::Millis;

use super::Recording;

/// Most matches kept (the timeline has a few hundred columns; `n`/`N` beyond that many
/// matches are rarely useful).
pub const MAX_MATCHES: usize = 100_000;

/// What `n`/`N` look for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// Anything that went wrong: disconnections, failed polls and probes, workers gone,
    /// declined, timed-out, unavailable or failed attempts, failed commands and downloads.
    Failures,
    /// Declined offers.
    Declines,
    /// Lines containing this text (case-insensitive): a request id, a worker, a node…
    Text(String),
}

const FAILURE_NEEDLES: &[&str] = &[
    "\"event\":\"disconnected\"",
    "\"event\":\"poll-failed\"",
    "\"type\":\"worker-gone\"",
    "\"kind\":\"failed\"",
    "\"kind\":\"worker-unavailable\"",
    "\"kind\":\"timed-out\"",
    "\"kind\":\"declined\"",
    "\"status\":\"failed\"",
    "\"status\":\"uncertain\"",
    "\"outcome\":{\"Failed\"",
    "DownloadFailed",
];

impl Filter {
    pub fn parse(text: &str) -> Filter {
        match text.trim().to_ascii_lowercase().as_str() {
            "failures" | "failure" | "fail" | "errors" => Filter::Failures,
            "declines" | "decline" | "declined" => Filter::Declines,
            _ => Filter::Text(text.trim().to_owned()),
        }
    }

    pub fn label(&self) -> String {
        match self {
            Filter::Failures => "failures".to_owned(),
            Filter::Declines => "declines".to_owned(),
            Filter::Text(t) => format!("\"{t}\""),
        }
    }

    /// Whether an event line matches.
    pub fn matches(&self, line: &[u8]) -> bool {
        match self {
            Filter::Failures => FAILURE_NEEDLES.iter().any(|n| contains(line, n.as_bytes())),
            Filter::Declines => contains(line, b"\"kind\":\"declined\""),
            Filter::Text(t) => contains_ignore_case(line, t.as_bytes()),
        }
    }
}

/// The events that match, as `(time, ordinal)` (the ordinal counts event lines from the
/// start of the recording, 1 for the first).
pub fn matches(recording: &Recording, filter: &Filter) -> Vec<(Millis, u64)> {
    let mut out = Vec::new();
    for seg in &recording.segments {
        let Ok(mut reader) = seg.reader_from(0) else {
            continue;
        };
        let mut ordinal = seg.first_events;
        while let Some(line) = reader.next_line() {
            let Some(p) = peek(&line.bytes) else {
                continue;
            };
            if p.kind != Kind::Event {
                continue;
            }
            ordinal += 1;
            if filter.matches(&line.bytes) {
                out.push((p.at, ordinal));
                if out.len() >= MAX_MATCHES {
                    return out;
                }
            }
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_name_what_they_match() {
        let gone = br#"{"at":5,"event":"feed","message":{"type":"worker-gone","worker":"w1"}}"#;
        let hb = br#"{"at":6,"event":"feed","message":{"type":"worker","observation":{}}}"#;
        let declined = br#"{"at":7,"event":"feed","message":{"record":{"attempts":[{"outcome":{"kind":"declined"}}],"request":"Req-42"}}}"#;
        assert!(Filter::Failures.matches(gone));
        assert!(!Filter::Failures.matches(hb));
        assert!(Filter::Failures.matches(declined));
        assert!(Filter::Declines.matches(declined));
        assert!(!Filter::Declines.matches(gone));
        assert_eq!(Filter::parse("FAILURES"), Filter::Failures);
        assert!(Filter::parse("req-42").matches(declined));
        assert!(!Filter::parse("req-43").matches(declined));
        assert_eq!(Filter::parse("w1").label(), "\"w1\"");
    }
}
