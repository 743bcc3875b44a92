//! Event lines as the recorder writes them and the replayer reads them back.
//!
//! Writing: the session event as JSON, redacted ([`Redactor`]), then — for a Skulk
//! `/state`, a worker heartbeat, a decision record or the records of a router feed
//! snapshot — the big value replaced by a delta
//! against a *base* when that is less than half the size ([`delta`]). Reading undoes the
//! delta with the same base.
//!
//! The base of a key (a source's state, a worker, a request) is the value the last delta
//! line of that key produced, kept in a small cache, or, when the cache has none, the
//! value the model holds, serialised. The records of a router feed snapshot always take
//! the model's records of that source as their base (never cached). Writer and reader keep identical caches because
//! they apply identical rules to the identical sequence of lines: a delta line stores its
//! result, a full line or a `route-gone` drops the key, a snapshot line clears
//! everything (so a reader that starts at a snapshot starts with the writer's cache), and
//! the least recently stored key is dropped beyond [`CACHE`] keys. The recorder decodes
//! every line it writes with its own codec and model, exactly as a replay will.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use den_protocol::feed::FeedMessage;
use den_protocol::recording::delta::{self, Base, Delta, DeltaError};
use den_protocol::recording::{self as format, LineError, Redactor};
use den_protocol::session::{SessionEvent, Stamped};

use crate::model::Model;

/// Keys whose base value is cached.
pub const CACHE: usize = 256;

/// A line that could not be turned back into an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{0}")]
    Line(#[from] LineError),
    #[error("{0}")]
    Delta(#[from] DeltaError),
}

/// The base cache of one writer or reader.
#[derive(Debug, Clone, Default)]
pub struct Codec {
    values: BTreeMap<Base, (u64, Value)>,
    order: BTreeMap<u64, Base>,
    stamp: u64,
}

impl Codec {
    pub fn new() -> Codec {
        Codec::default()
    }

    /// A snapshot line: forget every base.
    pub fn clear(&mut self) {
        self.values.clear();
        self.order.clear();
    }

    /// Encode one event for the file: redacted, with a delta against the base of its key
    /// (`model` is the model of every line written before). Does not change the cache:
    /// the writer decodes the line it writes, which does.
    pub fn encode(&self, redactor: &Redactor, stamped: &Stamped, model: &Model) -> String {
        let Ok(mut value) = serde_json::to_value(stamped) else {
            return format::encode_event(stamped);
        };
        redactor.redact(&mut value);
        if let Some((key, path)) = keyed(&stamped.event) {
            let cached = self
                .values
                .get(&key)
                .map(|(_, v)| v)
                .filter(|_| cached(&key));
            let fresh;
            let base = match cached {
                Some(v) => Some(v),
                None => {
                    fresh = base_from_model(&key, model);
                    fresh.as_ref()
                }
            };
            if let Some(base) = base {
                delta::compress(&mut value, path, key, base);
            }
        }
        format::encode_event_value(&value).unwrap_or_else(|| format::encode_event(stamped))
    }

    /// Decode an event line (`model` is the model of every line before it).
    pub fn decode(&mut self, line: &[u8], model: &Model) -> Result<Stamped, DecodeError> {
        if !has_delta(line) {
            let stamped = format::decode_event(line)?;
            if let Some((key, _)) = keyed(&stamped.event) {
                self.forget(&key);
            }
            if let SessionEvent::Feed {
                source,
                message: FeedMessage::RouteGone { request, .. },
            } = &stamped.event
            {
                self.forget(&Base::Route {
                    source: source.clone(),
                    request: request.clone(),
                });
            }
            return Ok(stamped);
        }
        let malformed = |e: serde_json::Error| LineError::Malformed {
            kind: "event",
            detail: den_protocol::text::one_line(&e.to_string()),
        };
        let mut event: Value = serde_json::from_slice(line).map_err(malformed)?;
        let raw = event
            .as_object_mut()
            .and_then(|o| o.remove("delta"))
            .ok_or_else(|| DeltaError::Malformed("no delta".to_owned()))?;
        let d: Delta = serde_json::from_value(raw)
            .map_err(|e| DeltaError::Malformed(den_protocol::text::one_line(&e.to_string())))?;
        let mut value = match self.take(&d.base) {
            Some(v) => v,
            None => base_from_model(&d.base, model)
                .ok_or_else(|| DeltaError::MissingBase(d.base.clone()))?,
        };
        delta::apply_in_place(&mut value, &d.patch)?;
        let (last, parents) = d
            .path
            .split_last()
            .ok_or_else(|| DeltaError::Malformed("empty path".to_owned()))?;
        let parent = parents
            .iter()
            .try_fold(&mut event, |v, k| v.as_object_mut()?.get_mut(k))
            .and_then(Value::as_object_mut)
            .ok_or_else(|| DeltaError::Malformed("path does not lead to an object".to_owned()))?;
        parent.insert(last.clone(), value);
        let stamped = Stamped::deserialize(&event).map_err(malformed)?;
        // Keep the expanded value as the key's next base (moved out, not copied).
        let expanded = parents
            .iter()
            .try_fold(&mut event, |v, k| v.as_object_mut()?.get_mut(k))
            .and_then(Value::as_object_mut)
            .and_then(|p| p.remove(last));
        if let Some(v) = expanded
            && cached(&d.base)
        {
            self.store(d.base, v);
        }
        Ok(stamped)
    }

    fn take(&mut self, key: &Base) -> Option<Value> {
        let (stamp, v) = self.values.remove(key)?;
        self.order.remove(&stamp);
        Some(v)
    }

    fn forget(&mut self, key: &Base) {
        self.take(key);
    }

    fn store(&mut self, key: Base, value: Value) {
        self.forget(&key);
        self.stamp += 1;
        self.order.insert(self.stamp, key.clone());
        self.values.insert(key, (self.stamp, value));
        while self.values.len() > CACHE {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.values.remove(&oldest);
        }
    }
}

/// Whether a key's base is kept in the cache. A feed snapshot's records are taken from
/// the model, which holds every record the feed sent since the last snapshot: a delta
/// against the previous snapshot would repeat them.
fn cached(key: &Base) -> bool {
    !matches!(key, Base::FeedRoutes { .. })
}

/// The key and the path of the big value of an event that may be written as a delta.
fn keyed(event: &SessionEvent) -> Option<(Base, &'static [&'static str])> {
    match event {
        SessionEvent::SkulkState { source, .. } => Some((
            Base::SkulkState {
                source: source.clone(),
            },
            &["state"],
        )),
        SessionEvent::Feed {
            source,
            message: FeedMessage::Worker { observation, .. },
        } => Some((
            Base::Worker {
                source: source.clone(),
                worker: observation.worker_id.clone(),
            },
            &["message", "observation"],
        )),
        SessionEvent::Feed {
            source,
            message: FeedMessage::Route { record, .. },
        } => Some((
            Base::Route {
                source: source.clone(),
                request: record.request.clone(),
            },
            &["message", "record"],
        )),
        SessionEvent::Feed {
            source,
            message: FeedMessage::Snapshot { .. },
        } => Some((
            Base::FeedRoutes {
                source: source.clone(),
            },
            &["message", "routes"],
        )),
        _ => None,
    }
}

/// The value the model holds for a key, serialised.
fn base_from_model(key: &Base, model: &Model) -> Option<Value> {
    match key {
        Base::SkulkState { source } => model
            .state_of(source)
            .and_then(|(_, s)| serde_json::to_value(s).ok()),
        Base::Worker { source, worker } => model
            .observation(source, worker)
            .and_then(|o| serde_json::to_value(o).ok()),
        Base::Route { source, request } => model
            .route(source, request)
            .and_then(|r| serde_json::to_value(r.record.as_ref()).ok()),
        // The records the model holds from the source, in its order (a splice patch
        // finds them wherever they are).
        Base::FeedRoutes { source } => {
            let held: Vec<&den_protocol::decision::DecisionRecord> = model
                .routes()
                .iter()
                .filter(|r| &r.source == source)
                .map(|r| r.record.as_ref())
                .collect();
            serde_json::to_value(held).ok()
        }
    }
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

    /// Write and read a session the way the recorder and a replay do.
    fn round_trip(events: &[Stamped], clear_every: usize) -> (usize, usize) {
        let redactor = Redactor::default();
        let (mut wc, mut rc) = (Codec::new(), Codec::new());
        let mut writer = Model::default();
        let mut reader = Model::default();
        let mut full = 0;
        let mut written = 0;
        for (i, stamped) in events.iter().enumerate() {
            if i % clear_every == clear_every - 1 {
                wc.clear();
                rc.clear();
            }
            let line = wc.encode(&redactor, stamped, &writer);
            full += format::encode_event(stamped).len();
            written += line.len();
            let mine = wc.decode(line.as_bytes(), &writer).unwrap();
            let back = rc.decode(line.as_bytes(), &reader).unwrap();
            // What was written is the redacted event (the fixture states carry a chat
            // prompt in a task's parameters).
            let mut expected = serde_json::to_value(stamped).unwrap();
            redactor.redact(&mut expected);
            let expected: Stamped = serde_json::from_value(expected).unwrap();
            assert!(back == expected, "event {i} differs after decoding");
            assert!(mine == back, "writer and reader disagree at {i}");
            writer.apply(&mine);
            reader.apply(&back);
        }
        (written, full)
    }

    #[test]
    fn lines_decode_to_the_events_written_and_repeats_shrink() {
        let events = fixtures::scenario().unwrap();
        let (written, full) = round_trip(&events, usize::MAX);
        assert!(
            written * 3 < full,
            "deltas should shrink repeated states: {written} of {full}"
        );
        // Snapshots in between (cache cleared on both sides) change nothing.
        round_trip(&events, 17);
        round_trip(&crate::record::synthetic::incident().unwrap(), 23);
    }

    #[test]
    fn a_delta_without_its_base_is_an_error_not_a_wrong_event() {
        let redactor = Redactor::default();
        let events = fixtures::run_c_scenario().unwrap();
        let mut writer = Model::default();
        let mut codec = Codec::new();
        let mut last = String::new();
        for stamped in &events {
            last = codec.encode(&redactor, stamped, &writer);
            let decoded = codec.decode(last.as_bytes(), &writer).unwrap();
            writer.apply(&decoded);
        }
        assert!(has_delta(last.as_bytes()), "{last}");
        let empty = Model::default();
        assert!(matches!(
            Codec::new().decode(last.as_bytes(), &empty),
            Err(DecodeError::Delta(DeltaError::MissingBase(_)))
        ));
        let note = Stamped::new(Millis(1), SessionEvent::Note { text: "x".into() });
        assert!(!has_delta(
            codec.encode(&redactor, &note, &empty).as_bytes()
        ));
    }

    #[test]
    fn the_cache_is_bounded_and_forgets_the_oldest() {
        let mut c = Codec::new();
        for i in 0..(CACHE + 10) {
            c.store(
                Base::Worker {
                    source: "r".into(),
                    worker: format!("w{i}").into(),
                },
                Value::from(i),
            );
        }
        assert_eq!(c.values.len(), CACHE);
        assert!(!c.values.contains_key(&Base::Worker {
            source: "r".into(),
            worker: "w0".into()
        }));
        c.clear();
        assert!(c.values.is_empty() && c.order.is_empty());
    }
}
