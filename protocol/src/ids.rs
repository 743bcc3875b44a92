//! Identities.
//!
//! Every id is its own type so that a worker id can never be passed where a request id
//! is expected. String ids serialise as plain JSON strings.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            pub fn new(s: impl Into<String>) -> Self {
                Self(s.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
    };
}

// Re-exported so other pure modules (e.g. the Skulk API types) declare their ids the same
// way instead of duplicating the macro.
pub(crate) use string_id;

string_id!(
    /// A machine (host) in the cluster: the storage node name that replica facts refer to,
    /// and the node id the management API reports.
    NodeId
);
string_id!(
    /// One worker process's stable name (one per GPU host, usually equal to its node).
    WorkerId
);
string_id!(
    /// A generation request, e.g. `chatcmpl-…`.
    RequestId
);
string_id!(
    /// The compatibility fingerprint of a model: weights identity, architecture, layout and
    /// execution variant. KV from one fingerprint is never reused for another.
    ModelFingerprint
);
string_id!(
    /// A resident route (continuation) in a page pool. Defaults to the request id.
    RouteId
);

/// Separates a real model's public id from its KV identity in a fingerprint.
pub const WEIGHTS_SEPARATOR: char = '@';

impl ModelFingerprint {
    /// The fingerprint of a real model: `ID@KV`, its public id and the first 16 hex digits
    /// of its KV fingerprint (the weights' digest with the KV dtype and row layout), so
    /// two files served under one id never share a chunk. The synthetic engine's
    /// fingerprints are plain ids, without `@`.
    pub fn of_weights(id: &str, kv_fingerprint: &[u8; 32]) -> ModelFingerprint {
        let mut s = String::with_capacity(id.len() + 17);
        s.push_str(id);
        s.push(WEIGHTS_SEPARATOR);
        for b in &kv_fingerprint[..8] {
            s.push_str(&format!("{b:02x}"));
        }
        ModelFingerprint(s)
    }

    /// The id clients name the model by: the part before `@` for a real model, the whole
    /// fingerprint otherwise.
    pub fn public_id(&self) -> &str {
        self.weights_split().map_or(&self.0, |(id, _)| id)
    }

    /// Whether this names real weights (`ID@KV`), whose prompts need the model's own
    /// tokenizer.
    pub fn is_weights_bound(&self) -> bool {
        self.weights_split().is_some()
    }

    fn weights_split(&self) -> Option<(&str, &str)> {
        let (id, kv) = self.0.rsplit_once(WEIGHTS_SEPARATOR)?;
        (!id.is_empty() && kv.len() == 16 && kv.bytes().all(|b| b.is_ascii_hexdigit()))
            .then_some((id, kv))
    }
}

impl From<&RequestId> for RouteId {
    fn from(r: &RequestId) -> Self {
        RouteId(r.0.clone())
    }
}

/// A worker process generation. It increases on every process start (and on a simulated
/// crash), so offers built from observations of an earlier process are declined.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub u64);

impl Epoch {
    pub fn next(self) -> Epoch {
        Epoch(self.0.saturating_add(1))
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

/// One attempt at serving a request: the request id plus an attempt number that starts at
/// 1 and is never reused within a router's lifetime. Every worker message and every timer
/// carries it; anything that does not match the current attempt is a no-op ("fencing").
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AssignmentId {
    pub request: RequestId,
    pub attempt: u64,
}

impl AssignmentId {
    pub fn new(request: impl Into<RequestId>, attempt: u64) -> Self {
        Self {
            request: request.into(),
            attempt,
        }
    }
}

impl fmt::Display for AssignmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.request, self.attempt)
    }
}

/// The version of a worker heartbeat: `(epoch, sequence)`, compared lexicographically.
/// Equal or older versions are ignored, so a restart (epoch + 1, sequence 0) beats any
/// sequence of an older epoch.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct HeartbeatVersion {
    pub epoch: Epoch,
    pub sequence: u64,
}

impl HeartbeatVersion {
    pub fn new(epoch: u64, sequence: u64) -> Self {
        Self {
            epoch: Epoch(epoch),
            sequence,
        }
    }
}

impl fmt::Display for HeartbeatVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.epoch, self.sequence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_bound_fingerprints_carry_their_public_id() {
        let kv = [0xabu8; 32];
        let f = ModelFingerprint::of_weights("smollm2", &kv);
        assert_eq!(f.as_str(), "smollm2@abababababababab");
        assert!(f.is_weights_bound());
        assert_eq!(f.public_id(), "smollm2");
        let other = ModelFingerprint::of_weights("smollm2", &[0xcd; 32]);
        assert_ne!(f, other);
        for plain in [
            "den-synthetic",
            "a@b",
            "@abababababababab",
            "x@ababababababab",
        ] {
            let p = ModelFingerprint::from(plain);
            assert!(!p.is_weights_bound(), "{plain}");
            assert_eq!(p.public_id(), plain);
        }
    }

    #[test]
    fn heartbeat_versions_order_by_epoch_then_sequence() {
        assert!(HeartbeatVersion::new(1, 0) > HeartbeatVersion::new(0, 999));
        assert!(HeartbeatVersion::new(0, 2) > HeartbeatVersion::new(0, 1));
        assert_eq!(HeartbeatVersion::new(3, 3), HeartbeatVersion::new(3, 3));
    }

    #[test]
    fn ids_serialise_as_plain_strings() {
        let id = AssignmentId::new("req-1", 2);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, r#"{"request":"req-1","attempt":2}"#);
        assert_eq!(
            serde_json::to_string(&WorkerId::from("w")).unwrap(),
            r#""w""#
        );
    }
}
