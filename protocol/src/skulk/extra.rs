//! The fields of a Skulk object that den does not know, kept for display, recording and
//! round trips — but bounded. A peer (or anything that can answer in Skulk's place; its
//! `/state` needs no token) could otherwise park megabytes in an unknown field that every
//! poll copies into memory and every recording writes again (a 50 MB junk field once made
//! 150 MB of recording in 3 s). Each unknown field is kept when its JSON is at most
//! [`MAX_FIELD_BYTES`] and its name at most [`MAX_NAME_BYTES`]; a larger one is replaced by a
//! short marker naming its size; after [`MAX_FIELDS`] fields the rest are counted in one
//! marker. Known fields are typed elsewhere and never capped here.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Deref, DerefMut};

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Largest unknown field kept as it came, in bytes of JSON.
pub const MAX_FIELD_BYTES: usize = 4096;
/// Longest unknown field name kept.
pub const MAX_NAME_BYTES: usize = 128;
/// Unknown fields kept per object.
pub const MAX_FIELDS: usize = 64;
/// The marker field that counts the unknown fields not kept.
pub const DROPPED_FIELDS: &str = "_den_dropped_fields";

/// Unknown fields of one object (`#[serde(flatten)] extra: Extra`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extra(BTreeMap<String, Value>);

impl Extra {
    pub fn new() -> Self {
        Extra::default()
    }
}

impl Deref for Extra {
    type Target = BTreeMap<String, Value>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Extra {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl From<BTreeMap<String, Value>> for Extra {
    fn from(m: BTreeMap<String, Value>) -> Self {
        Extra(m)
    }
}

impl FromIterator<(String, Value)> for Extra {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        Extra(iter.into_iter().collect())
    }
}

impl Serialize for Extra {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Extra {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ExtraVisitor)
    }
}

struct ExtraVisitor;

impl<'de> Visitor<'de> for ExtraVisitor {
    type Value = Extra;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Extra, A::Error> {
        let mut out = BTreeMap::new();
        let mut dropped = 0u64;
        while let Some(key) = map.next_key::<String>()? {
            let value: Value = map.next_value()?;
            if out.len() >= MAX_FIELDS || key.len() > MAX_NAME_BYTES {
                dropped += 1;
                continue;
            }
            let size = json_size(&value);
            let kept = if size <= MAX_FIELD_BYTES {
                value
            } else {
                Value::String(format!("<unknown field of {size} bytes not kept>"))
            };
            out.insert(key, kept);
        }
        if dropped > 0 {
            out.insert(DROPPED_FIELDS.to_owned(), Value::from(dropped));
        }
        Ok(Extra(out))
    }
}

/// Bytes of `v` as compact JSON, counted without writing it (a container stops being
/// walked once past the cap, so the size of a huge nested one is a lower bound).
fn json_size(v: &Value) -> usize {
    fn walk(v: &Value, acc: &mut usize) {
        if *acc > MAX_FIELD_BYTES {
            return;
        }
        match v {
            Value::Null => *acc += 4,
            Value::Bool(b) => *acc += if *b { 4 } else { 5 },
            Value::Number(n) => *acc += n.to_string().len(),
            Value::String(s) => *acc += s.len() + 2,
            Value::Array(a) => {
                *acc += 2 + a.len().saturating_sub(1);
                for x in a {
                    walk(x, acc);
                }
            }
            Value::Object(o) => {
                *acc += 2 + o.len().saturating_sub(1);
                for (k, x) in o {
                    *acc += k.len() + 3;
                    walk(x, acc);
                }
            }
        }
    }
    let mut acc = 0;
    walk(v, &mut acc);
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, Serialize)]
    struct Known {
        name: String,
        #[serde(flatten)]
        extra: Extra,
    }

    #[test]
    fn unknown_fields_are_kept_small_and_bounded() {
        let junk = "x".repeat(50_000);
        let mut text = format!(r#"{{"name":"n","small":{{"a":[1,2]}},"junk":"{junk}""#);
        for i in 0..100 {
            text.push_str(&format!(r#","f{i:03}":{i}"#));
        }
        text.push('}');
        let k: Known = serde_json::from_str(&text).unwrap();
        assert_eq!(k.name, "n");
        assert_eq!(k.extra["small"], serde_json::json!({"a": [1, 2]}));
        assert_eq!(
            k.extra["junk"],
            Value::String("<unknown field of 50002 bytes not kept>".into())
        );
        assert!(k.extra.len() <= MAX_FIELDS + 1);
        assert!(k.extra[DROPPED_FIELDS].as_u64().unwrap() > 0);
        let back = serde_json::to_string(&k).unwrap();
        assert!(back.len() < 4 * 1024, "{} bytes", back.len());
        // What fits round-trips unchanged.
        let small: Known = serde_json::from_str(r#"{"name":"n","v":{"b":true}}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&small).unwrap(),
            r#"{"name":"n","v":{"b":true}}"#
        );
        assert_eq!(
            json_size(&serde_json::json!({"a":[1,null,"s"]})),
            r#"{"a":[1,null,"s"]}"#.len()
        );
    }
}
