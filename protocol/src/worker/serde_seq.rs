//! Serialise maps with non-string keys (e.g. [`crate::ids::AssignmentId`]) as a sequence
//! of `[key, value]` pairs, so that JSON can represent them.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

pub(crate) fn serialize<K, V, S>(map: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error>
where
    K: Serialize,
    V: Serialize,
    S: Serializer,
{
    s.collect_seq(map.iter())
}
