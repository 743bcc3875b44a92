//! Event lines as the recorder writes them and the replayer reads them back.
//!
//! Writing: the session event as JSON, redacted ([`Redactor`]), then — for a Skulk
//! `/state`, a worker heartbeat or a decision record — the big value replaced by a
//! delta against the value the model already holds ([`delta`]) when that is less than
//! half the size. Reading
//! undoes the delta with the replaying model, which holds the same value: the recorder
//! keeps a model of exactly what it wrote and decodes each line with it before applying
//! it, the way a replay will.

use serde_json::Value;

use den_protocol::feed::FeedMessage;
use den_protocol::recording::delta::{self, Base, DeltaError};
use den_protocol::recording::{self as format, LineError, Redactor};
use den_protocol::session::{SessionEvent, Stamped};

use crate::model::Model;

/// A line that could not be turned back into an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{0}")]
    Line(#[from] LineError),
    #[error("{0}")]
    Delta(#[from] DeltaError),
}

/// Encode one event for the file: redacted, with deltas against `model` (the model of
/// everything written before it).
pub fn encode(redactor: &Redactor, stamped: &Stamped, model: &Model) -> String {
    let Ok(mut value) = serde_json::to_value(stamped) else {
        return format::encode_event(stamped);
    };
    redactor.redact(&mut value);
    match &stamped.event {
        SessionEvent::SkulkState { source, .. } => {
            if let Some((_, state)) = model.state_of(source)
                && let Ok(base) = serde_json::to_value(state)
            {
                let key = Base::SkulkState {
                    source: source.clone(),
                };
                delta::compress(&mut value, &["state"], key, &base);
            }
        }
        SessionEvent::Feed {
            source,
            message: FeedMessage::Worker { observation, .. },
        } => {
            if let Some(previous) = model.observation(source, &observation.worker_id)
                && let Ok(base) = serde_json::to_value(previous)
            {
                let key = Base::Worker {
                    source: source.clone(),
                    worker: observation.worker_id.clone(),
                };
                delta::compress(&mut value, &["message", "observation"], key, &base);
            }
        }
        SessionEvent::Feed {
            source,
            message: FeedMessage::Route { record, .. },
        } => {
            if let Some(previous) = model.route(source, &record.request)
                && let Ok(base) = serde_json::to_value(previous.record.as_ref())
            {
                let key = Base::Route {
                    source: source.clone(),
                    request: record.request.clone(),
                };
                delta::compress(&mut value, &["message", "record"], key, &base);
            }
        }
        _ => {}
    }
    format::encode_event_value(&value).unwrap_or_else(|| format::encode_event(stamped))
}

/// Decode an event line, resolving a delta against `model` (the model of every line
/// before this one).
pub fn decode(line: &[u8], model: &Model) -> Result<Stamped, DecodeError> {
    if !has_delta(line) {
        return Ok(format::decode_event(line)?);
    }
    let mut value: Value = serde_json::from_slice(line).map_err(|e| LineError::Malformed {
        kind: "event",
        detail: e.to_string(),
    })?;
    delta::expand(&mut value, |base| match base {
        Base::SkulkState { source } => model
            .state_of(source)
            .and_then(|(_, s)| serde_json::to_value(s).ok()),
        Base::Worker { source, worker } => model
            .observation(source, worker)
            .and_then(|o| serde_json::to_value(o).ok()),
        Base::Route { source, request } => model
            .route(source, request)
            .and_then(|r| serde_json::to_value(r.record.as_ref()).ok()),
    })?;
    serde_json::from_value(value).map_err(|e| {
        DecodeError::Line(LineError::Malformed {
            kind: "event",
            detail: e.to_string(),
        })
    })
}

/// Whether a line may carry a delta (then it takes the slower path through a JSON
/// value). The byte sequence cannot occur inside a JSON string (its quotes would be
/// escaped); a nested `delta` object elsewhere only costs the slower path.
fn has_delta(line: &[u8]) -> bool {
    const NEEDLE: &[u8] = b",\"delta\":{\"";
    line.windows(NEEDLE.len()).any(|w| w == NEEDLE)
}

#[cfg(test)]
mod tests {
    use den_protocol::time::Millis;

    use super::*;
    use crate::fixtures;

    #[test]
    fn lines_decode_to_the_events_written_and_repeats_shrink() {
        let redactor = Redactor::default();
        let mut writer = Model::default();
        let mut reader = Model::default();
        let mut full = 0;
        let mut written = 0;
        for (i, stamped) in fixtures::scenario().unwrap().into_iter().enumerate() {
            let line = encode(&redactor, &stamped, &writer);
            full += format::encode_event(&stamped).len();
            written += line.len();
            let back = decode(line.as_bytes(), &reader).unwrap();
            // What was written is the redacted event (the fixture states carry a chat
            // prompt in a task's parameters).
            let mut expected = serde_json::to_value(&stamped).unwrap();
            redactor.redact(&mut expected);
            let expected: Stamped = serde_json::from_value(expected).unwrap();
            assert!(back == expected, "event {i} differs after decoding");
            writer.apply(&back);
            reader.apply(&back);
        }
        assert!(
            written * 3 < full,
            "deltas should shrink repeated states: {written} of {full}"
        );
    }

    #[test]
    fn a_delta_without_its_base_is_an_error_not_a_wrong_event() {
        let redactor = Redactor::default();
        let events = fixtures::run_c_scenario().unwrap();
        let mut writer = Model::default();
        let mut last = String::new();
        for stamped in &events {
            last = encode(&redactor, stamped, &writer);
            writer.apply(stamped);
        }
        assert!(has_delta(last.as_bytes()), "{last}");
        let empty = Model::default();
        assert!(matches!(
            decode(last.as_bytes(), &empty),
            Err(DecodeError::Delta(DeltaError::MissingBase(_)))
        ));
        let note = Stamped::new(Millis(1), SessionEvent::Note { text: "x".into() });
        assert!(!has_delta(encode(&redactor, &note, &empty).as_bytes()));
    }
}
