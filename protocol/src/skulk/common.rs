//! Scalars shared by every Skulk object: ids and `Memory`.
//!
//! Node ids reuse [`crate::ids::NodeId`] (a libp2p peer id in Skulk, a host name in den);
//! the other ids are UUID4 strings in Skulk and opaque strings here.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::string_id;

string_id!(
    /// A placed model instance (`instanceId`).
    InstanceId
);
string_id!(
    /// One runner (a process serving one shard of an instance).
    RunnerId
);
string_id!(
    /// A master task (`taskId`).
    TaskId
);
string_id!(
    /// A command accepted by the API (`command_id`).
    CommandId
);
string_id!(
    /// An event of the `/events` diagnostics log.
    EventId
);
string_id!(
    /// A model catalog id, e.g. `mlx-community/Llama-3.2-1B-Instruct-4bit`.
    ModelId
);
string_id!(
    /// The identity of one download attempt (newer dialect: `attemptId`). Transient and
    /// terminal records of the same attempt share it.
    AttemptId
);
string_id!(
    /// The immutable identity of a signed model card (newer dialect: `registryCardId`).
    RegistryCardId
);

/// A byte count. Serialised `{"inBytes": n}` in state objects; `/events` writes
/// `{"in_bytes": n}`, which is accepted too.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Memory {
    #[serde(rename = "inBytes", alias = "in_bytes")]
    pub in_bytes: u64,
}

impl Memory {
    pub fn from_bytes(in_bytes: u64) -> Memory {
        Memory { in_bytes }
    }
}

impl fmt::Display for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
        const MIB: f64 = 1024.0 * 1024.0;
        let b = self.in_bytes as f64;
        if b >= GIB {
            write!(f, "{:.1} GiB", b / GIB)
        } else if b >= MIB {
            write!(f, "{:.1} MiB", b / MIB)
        } else {
            write!(f, "{} B", self.in_bytes)
        }
    }
}

/// A message from the cluster as one clean console line: control and escape sequences
/// removed, line breaks and runs of whitespace made one space ([`crate::text::one_line`]).
pub fn one_line(text: &str) -> String {
    crate::text::one_line(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_accepts_both_casings_and_writes_camel_case() {
        let m: Memory = serde_json::from_str(r#"{"in_bytes": 5}"#).unwrap();
        assert_eq!(m.in_bytes, 5);
        let m: Memory = serde_json::from_str(r#"{"inBytes": 7}"#).unwrap();
        assert_eq!(serde_json::to_string(&m).unwrap(), r#"{"inBytes":7}"#);
    }

    #[test]
    fn one_line_folds_line_breaks() {
        assert_eq!(one_line("a\nb\r\nc\n"), "a b c");
    }
}
