//! Changes in between snapshots: an event line may carry, instead of a large value that
//! mostly repeats the previous one, a patch against that previous value.
//!
//! Skulk `/state` answers are polled every few seconds and rarely change much; worker
//! heartbeats repeat most of their fields; a decision record is sent whole at every
//! change, candidate snapshot included. A writer that knows the previous value (the
//! recorder keeps the same model a replay rebuilds) replaces the value at `path` by a
//! [`Delta`] naming its [`Base`]; a reader that holds the same model looks the base up
//! and applies the patch, getting back exactly the value that was recorded.
//!
//! Patch format (JSON), exact for every JSON value including `null`:
//! - `{"=": V}`: the value is `V`;
//! - `{"~": {"key": PATCH, …}, "-": ["gone", …]}`: an object whose listed keys changed
//!   or were removed (either part may be absent);
//! - `{"@": {"3": PATCH, …}}`: a list of the same length whose listed items changed;
//! - `{"[": [PIECE, …]}`: a list spliced from the old one, piece by piece: `[i, n]`
//!   is the old items `i..i+n`, `{"=": V}` a new item `V` (lists whose items come and
//!   go: a worker's cached prefixes, a router's held decision records).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ids::{RequestId, WorkerId};
use crate::session::SourceId;

/// The previous value a patch applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Base {
    /// The latest `/state` of a source.
    SkulkState { source: SourceId },
    /// The latest observation of a worker in a source's feed.
    Worker { source: SourceId, worker: WorkerId },
    /// The latest decision record of a request in a source's feed.
    Route {
        source: SourceId,
        request: RequestId,
    },
    /// The decision records of a source's latest feed snapshot (a router resends its
    /// whole picture to a console that fell behind).
    FeedRoutes { source: SourceId },
}

/// The `delta` member of an event line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// Where in the event object the patched value goes (keys from the top).
    pub path: Vec<String>,
    pub base: Base,
    pub patch: Value,
}

/// A delta that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    #[error("delta against {0:?}, which this replay does not hold")]
    MissingBase(Base),
    #[error("malformed delta: {0}")]
    Malformed(String),
}

/// The patch that turns `old` into `new`; `None` when they are equal.
pub fn diff(old: &Value, new: &Value) -> Option<Value> {
    if old == new {
        return None;
    }
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut changed = Map::new();
            for (key, nv) in b {
                match a.get(key) {
                    Some(ov) => {
                        if let Some(p) = diff(ov, nv) {
                            changed.insert(key.clone(), p);
                        }
                    }
                    None => {
                        changed.insert(key.clone(), replace(nv));
                    }
                }
            }
            let gone: Vec<Value> = a
                .keys()
                .filter(|k| !b.contains_key(*k))
                .map(|k| Value::String(k.clone()))
                .collect();
            let mut patch = Map::new();
            if !changed.is_empty() {
                patch.insert("~".to_owned(), Value::Object(changed));
            }
            if !gone.is_empty() {
                patch.insert("-".to_owned(), Value::Array(gone));
            }
            Some(Value::Object(patch))
        }
        (Value::Array(a), Value::Array(b)) => {
            let spliced = splice(a, b);
            if a.len() != b.len() {
                return Some(spliced);
            }
            let items: Map<String, Value> = a
                .iter()
                .zip(b)
                .enumerate()
                .filter_map(|(i, (ov, nv))| diff(ov, nv).map(|p| (i.to_string(), p)))
                .collect();
            let mut patch = Map::new();
            patch.insert("@".to_owned(), Value::Object(items));
            let patch = Value::Object(patch);
            // Same length: items changed in place, or shifted (one gone, one new).
            if spliced.to_string().len() < patch.to_string().len() {
                Some(spliced)
            } else {
                Some(patch)
            }
        }
        _ => Some(replace(new)),
    }
}

/// The `[` patch of `b` against `a`: runs of equal items copied from `a` (found by their
/// JSON text), everything else as new items.
fn splice(a: &[Value], b: &[Value]) -> Value {
    let texts: Vec<String> = a.iter().map(Value::to_string).collect();
    let mut at: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, t) in texts.iter().enumerate() {
        at.entry(t.as_str()).or_default().push(i);
    }
    let mut pieces: Vec<Value> = Vec::new();
    // The run being extended: old start and length.
    let mut run: Option<(usize, usize)> = None;
    for item in b {
        let text = item.to_string();
        if let Some((start, len)) = run
            && texts.get(start + len).is_some_and(|t| *t == text)
        {
            run = Some((start, len + 1));
            continue;
        }
        if let Some((start, len)) = run.take() {
            pieces.push(Value::from(vec![start, len]));
        }
        match at.get(text.as_str()).and_then(|v| v.first()) {
            Some(&i) => run = Some((i, 1)),
            None => pieces.push(replace(item)),
        }
    }
    if let Some((start, len)) = run {
        pieces.push(Value::from(vec![start, len]));
    }
    let mut patch = Map::new();
    patch.insert("[".to_owned(), Value::Array(pieces));
    Value::Object(patch)
}

fn replace(v: &Value) -> Value {
    let mut m = Map::new();
    m.insert("=".to_owned(), v.clone());
    Value::Object(m)
}

/// Apply a patch made by [`diff`].
pub fn apply(old: &Value, patch: &Value) -> Result<Value, DeltaError> {
    let mut value = old.clone();
    apply_in_place(&mut value, patch)?;
    Ok(value)
}

/// Apply a patch made by [`diff`] to `value` itself (no copy of what does not change).
pub fn apply_in_place(value: &mut Value, patch: &Value) -> Result<(), DeltaError> {
    let bad = |what: &str| DeltaError::Malformed(what.to_owned());
    let p = patch
        .as_object()
        .ok_or_else(|| bad("patch is not an object"))?;
    if p.is_empty() {
        return Ok(());
    }
    if let Some(v) = p.get("=") {
        *value = v.clone();
        return Ok(());
    }
    if let Some(items) = p.get("@") {
        let items = items.as_object().ok_or_else(|| bad("@ is not an object"))?;
        let list = value
            .as_array_mut()
            .ok_or_else(|| bad("@ patch of a value that is not a list"))?;
        for (i, ip) in items {
            let i: usize = i.parse().map_err(|_| bad("@ index is not a number"))?;
            let slot = list.get_mut(i).ok_or_else(|| bad("@ index out of range"))?;
            apply_in_place(slot, ip)?;
        }
        return Ok(());
    }
    if let Some(pieces) = p.get("[") {
        let pieces = pieces.as_array().ok_or_else(|| bad("[ is not a list"))?;
        let old = value
            .as_array()
            .ok_or_else(|| bad("[ patch of a value that is not a list"))?;
        let mut list = Vec::with_capacity(old.len());
        for piece in pieces {
            match piece {
                Value::Array(range) => {
                    let n = |i: usize| range.get(i).and_then(Value::as_u64).map(|v| v as usize);
                    let (Some(start), Some(len)) = (n(0), n(1)) else {
                        return Err(bad("[ run is not [start, length]"));
                    };
                    let run = old
                        .get(start..start.saturating_add(len))
                        .ok_or_else(|| bad("[ run out of range"))?;
                    list.extend_from_slice(run);
                }
                Value::Object(item) => {
                    list.push(
                        item.get("=")
                            .cloned()
                            .ok_or_else(|| bad("[ item lacks ="))?,
                    );
                }
                _ => return Err(bad("[ piece is neither a run nor an item")),
            }
        }
        *value = Value::Array(list);
        return Ok(());
    }
    let object = value
        .as_object_mut()
        .ok_or_else(|| bad("object patch of a value that is not an object"))?;
    if let Some(changed) = p.get("~") {
        let changed = changed
            .as_object()
            .ok_or_else(|| bad("~ is not an object"))?;
        for (key, kp) in changed {
            let slot = object.entry(key.clone()).or_insert(Value::Null);
            apply_in_place(slot, kp)?;
        }
    }
    if let Some(gone) = p.get("-") {
        let gone = gone.as_array().ok_or_else(|| bad("- is not a list"))?;
        for key in gone {
            let key = key.as_str().ok_or_else(|| bad("- key is not a string"))?;
            object.remove(key);
        }
    }
    Ok(())
}

/// Replace the value at `path` of an event object by a delta against `base_value`, if
/// the delta is smaller than half the value. Returns whether it did.
pub fn compress(event: &mut Value, path: &[&str], base: Base, base_value: &Value) -> bool {
    let Some(slot) = pointer_mut(event, path) else {
        return false;
    };
    let Some(patch) = diff(base_value, slot) else {
        // Equal: an empty object patch.
        let empty = Value::Object(Map::new());
        return set_delta(event, path, base, empty);
    };
    let full = slot.to_string().len();
    if patch.to_string().len() * 2 > full {
        return false;
    }
    set_delta(event, path, base, patch)
}

fn set_delta(event: &mut Value, path: &[&str], base: Base, patch: Value) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let Some(parent) = pointer_mut(event, parents).and_then(Value::as_object_mut) else {
        return false;
    };
    parent.remove(*last);
    let delta = Delta {
        path: path.iter().map(|s| (*s).to_owned()).collect(),
        base,
        patch,
    };
    let Ok(delta) = serde_json::to_value(delta) else {
        return false;
    };
    match event.as_object_mut() {
        Some(top) => {
            top.insert("delta".to_owned(), delta);
            true
        }
        None => false,
    }
}

/// If an event object carries a delta, replace it by the full value, looking the base
/// up with `lookup`. Events without a delta are left alone.
pub fn expand(
    event: &mut Value,
    lookup: impl FnOnce(&Base) -> Option<Value>,
) -> Result<(), DeltaError> {
    let Some(raw) = event.as_object_mut().and_then(|o| o.remove("delta")) else {
        return Ok(());
    };
    let delta: Delta = serde_json::from_value(raw)
        .map_err(|e| DeltaError::Malformed(crate::text::one_line(&e.to_string())))?;
    let base = lookup(&delta.base).ok_or_else(|| DeltaError::MissingBase(delta.base.clone()))?;
    let value = apply(&base, &delta.patch)?;
    let (last, parents) = delta
        .path
        .split_last()
        .ok_or_else(|| DeltaError::Malformed("empty path".to_owned()))?;
    let parents: Vec<&str> = parents.iter().map(String::as_str).collect();
    let parent = pointer_mut(event, &parents)
        .and_then(Value::as_object_mut)
        .ok_or_else(|| DeltaError::Malformed("path does not lead to an object".to_owned()))?;
    parent.insert(last.clone(), value);
    Ok(())
}

fn pointer_mut<'a>(value: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    path.iter()
        .try_fold(value, |v, key| v.as_object_mut()?.get_mut(*key))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn round_trip(old: Value, new: Value) {
        match diff(&old, &new) {
            None => assert_eq!(old, new),
            Some(p) => assert_eq!(apply(&old, &p).unwrap(), new, "patch {p}"),
        }
    }

    #[test]
    fn patches_rebuild_every_kind_of_change_exactly() {
        round_trip(json!({"a": 1}), json!({"a": 1}));
        round_trip(json!({"a": 1, "b": null}), json!({"a": 2, "c": null}));
        round_trip(
            json!({"a": {"x": [1, 2, 3]}}),
            json!({"a": {"x": [1, 5, 3]}}),
        );
        round_trip(json!({"a": [1, 2]}), json!({"a": [1, 2, 3]}));
        round_trip(
            json!([{"p": 1}, {"p": 2}]),
            json!([{"p": 1}, {"p": 3, "q": null}]),
        );
        round_trip(json!("x"), json!({"y": 1}));
        round_trip(json!(null), json!(0));
        round_trip(json!({"a": {"b": 1}}), json!({"a": null}));
        round_trip(json!({"=": 1, "~": 2}), json!({"=": 2, "-": 3}));
        assert_eq!(apply(&json!("s"), &json!({})).unwrap(), json!("s"));
    }

    #[test]
    fn lists_whose_items_come_and_go_are_spliced_from_the_old_one() {
        let item = |i: u32| json!({"prefix": format!("p-{i:04}"), "tokens": i * 16});
        let old: Vec<Value> = (0..300).map(item).collect();
        // Two gone at the front, one changed in the middle, three new at the end.
        let mut new: Vec<Value> = (2..300).map(item).collect();
        new[100] = json!({"prefix": "changed", "tokens": 1});
        new.extend((300..303).map(item));
        let (old, new) = (Value::Array(old), Value::Array(new));
        let patch = diff(&old, &new).unwrap();
        assert!(patch.get("[").is_some(), "{patch}");
        assert!(patch.to_string().len() < 300, "{patch}");
        assert_eq!(apply(&old, &patch).unwrap(), new);
        // Same length but shifted by one: a splice beats item patches.
        let shifted = Value::Array((1..301).map(item).collect());
        let patch = diff(&old, &shifted).unwrap();
        assert!(patch.get("[").is_some(), "{patch}");
        assert_eq!(apply(&old, &patch).unwrap(), shifted);
        round_trip(json!([1, 2, 1, 2]), json!([2, 1, 2, 1, 1]));
        round_trip(json!([]), json!([1]));
        round_trip(json!([1]), json!([]));
        for bad in [
            json!({"[": [[5, 1]]}),
            json!({"[": [[0]]}),
            json!({"[": [3]}),
        ] {
            assert!(matches!(
                apply(&json!([1, 2]), &bad),
                Err(DeltaError::Malformed(_))
            ));
        }
    }

    #[test]
    fn a_small_change_to_a_large_value_is_a_small_delta() {
        let big: Vec<Value> = (0..200)
            .map(|i| json!({"id": i, "name": "xxxxxxxx"}))
            .collect();
        let base = json!({"items": big, "n": 1});
        let mut new = base.clone();
        new["n"] = json!(2);
        let mut event =
            json!({"at": 5, "event": "skulk-state", "source": "s", "state": new.clone()});
        let key = Base::SkulkState { source: "s".into() };
        assert!(compress(&mut event, &["state"], key.clone(), &base));
        assert!(event.get("state").is_none());
        assert!(event.to_string().len() < 200, "{event}");
        let mut back = event.clone();
        expand(&mut back, |b| (b == &key).then(|| base.clone())).unwrap();
        assert_eq!(back["state"], new);
        let err = expand(&mut event.clone(), |_| None).unwrap_err();
        assert_eq!(err, DeltaError::MissingBase(key));
    }

    #[test]
    fn a_mostly_new_value_is_written_whole_and_nested_paths_work() {
        let base = json!({"a": 1});
        let mut event = json!({"event": "feed", "message": {"observation": {"b": 2}}});
        let key = Base::Worker {
            source: "r".into(),
            worker: "w".into(),
        };
        assert!(!compress(
            &mut event,
            &["message", "observation"],
            key.clone(),
            &base
        ));
        let same = json!({"x": [1, 2, 3], "y": "long enough value"});
        let mut event =
            json!({"event": "feed", "message": {"type": "worker", "observation": same.clone()}});
        assert!(compress(
            &mut event,
            &["message", "observation"],
            key.clone(),
            &same
        ));
        assert!(event["message"].get("observation").is_none());
        expand(&mut event, |_| Some(same.clone())).unwrap();
        assert_eq!(event["message"]["observation"], same);
        assert!(event.get("delta").is_none());
    }
}
