//! Which process may be which worker: the router pins the credential each worker name
//! first says hello with (trust on first use), and refuses a later hello for that name
//! with any other credential, so a holder of the shared token cannot take over a live
//! worker's route and receive its offers. A restart of the same worker presents the same
//! credential (`worker/identity.rs`) and takes over with its new epoch as before.
//!
//! Pins live as long as the router process: a worker whose data directory was wiped gets
//! a new credential and is refused under its old name until the router restarts (the
//! refusal says so). A worker too old to send a credential is admitted unpinned and
//! logged once per connection; once a name is pinned, a hello without one is refused.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use den_protocol::ids::WorkerId;

/// What the pin table says about one hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// First contact with a credential: now pinned.
    Pinned,
    /// The credential this name is pinned to.
    Known,
    /// No credential and no pin: admitted, unproven.
    Unproven,
    /// Another credential, or none, for a pinned name.
    Refused(String),
}

/// Checks `credential` for `worker` against `pins`, pinning it on first contact.
pub fn admit(
    pins: &mut BTreeMap<WorkerId, [u8; 32]>,
    worker: &WorkerId,
    credential: Option<&str>,
) -> Admission {
    let digest = credential.map(|c| -> [u8; 32] { Sha256::digest(c.as_bytes()).into() });
    match (pins.get(worker), digest) {
        (None, None) => Admission::Unproven,
        (None, Some(d)) => {
            pins.insert(worker.clone(), d);
            Admission::Pinned
        }
        (Some(pinned), Some(d)) if bool::from(pinned.ct_eq(&d)) => Admission::Known,
        (Some(_), _) => Admission::Refused(format!(
            "worker name {worker} belongs to another process (its credential differs): run each worker with its own --name, or restart the router to forget a worker whose data directory was replaced"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_contact_pins_the_same_credential_returns_and_others_are_refused() {
        let mut pins = BTreeMap::new();
        let w = WorkerId::from("gpu-a");
        let real = "a".repeat(64);
        assert_eq!(admit(&mut pins, &w, Some(&real)), Admission::Pinned);
        // A restart of the same worker (same data dir) comes back.
        assert_eq!(admit(&mut pins, &w, Some(&real)), Admission::Known);
        // An impostor with the token but not the credential, or without one, does not.
        let Admission::Refused(why) = admit(&mut pins, &w, Some(&"b".repeat(64))) else {
            panic!("impostor admitted")
        };
        assert!(why.contains("gpu-a") && !why.contains(&real), "{why}");
        assert!(matches!(admit(&mut pins, &w, None), Admission::Refused(_)));
        // Other names are independent; a credential-less old worker is admitted unpinned.
        let old = WorkerId::from("old");
        assert_eq!(admit(&mut pins, &old, None), Admission::Unproven);
        assert!(!pins.contains_key(&old));
    }
}
