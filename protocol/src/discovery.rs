//! The discovery registry and connection-bound routes (spec §5.3, §5.4).
//!
//! [`Registry`] keeps the newest observation per worker: a heartbeat is accepted only if
//! its `(epoch, sequence)` is strictly newer; equal or older versions are ignored (the
//! first arrival of a version wins, even with different contents).
//!
//! [`Discovery`] adds the transport rules as a pure state machine: an accepted heartbeat
//! binds the worker to the exact connection that carried it and re-arms an expiry timer
//! keyed by `(connection, version)`; expiry, disconnect and send failure detach the worker
//! only if the route still belongs to that connection, so a stale connection can never
//! remove a newer route.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{HeartbeatVersion, WorkerId};
use crate::observation::Observation;
use crate::time::Millis;

/// What the registry did with an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Observed {
    /// A strictly newer version (or the first for this worker): stored.
    Accepted,
    /// The identical observation again: nothing changes, but liveness is refreshed.
    Repeated,
    /// Same version, different contents: ignored entirely.
    ConflictingDuplicate,
    /// An older version: ignored.
    Stale,
}

/// Newest observation per worker.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Registry {
    workers: BTreeMap<WorkerId, Observation>,
}

impl Registry {
    pub fn observe(&mut self, obs: Observation) -> Observed {
        match self.workers.get(&obs.worker_id) {
            Some(cur) if obs.version() < cur.version() => Observed::Stale,
            Some(cur) if obs.version() == cur.version() => {
                if *cur == obs {
                    Observed::Repeated
                } else {
                    Observed::ConflictingDuplicate
                }
            }
            _ => {
                self.workers.insert(obs.worker_id.clone(), obs);
                Observed::Accepted
            }
        }
    }

    pub fn remove(&mut self, worker: &WorkerId) -> Option<Observation> {
        self.workers.remove(worker)
    }

    pub fn get(&self, worker: &WorkerId) -> Option<&Observation> {
        self.workers.get(worker)
    }

    /// Observations ordered by worker id.
    pub fn observations(&self) -> impl Iterator<Item = &Observation> {
        self.workers.values()
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }
}

/// A transport connection, numbered by the runtime (never reused within a process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConnectionId(pub u64);

/// Why a worker was detached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DetachReason {
    HeartbeatExpired,
    Disconnected,
    SendFailed,
}

impl DetachReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DetachReason::HeartbeatExpired => "heartbeat-expired",
            DetachReason::Disconnected => "disconnected",
            DetachReason::SendFailed => "send-failed",
        }
    }
}

/// Inputs to [`Discovery::handle`].
#[derive(Debug, Clone, PartialEq)]
pub enum DiscoveryInput {
    Heartbeat {
        connection: ConnectionId,
        observation: Box<Observation>,
    },
    /// The connection's input ended: every worker ever seen on it is detached.
    Disconnected { connection: ConnectionId },
    /// A send to `worker` on `connection` failed.
    SendFailed {
        connection: ConnectionId,
        worker: WorkerId,
    },
    /// An expiry timer armed by [`DiscoveryEffect::ArmExpiry`] fired.
    ExpiryFired {
        worker: WorkerId,
        connection: ConnectionId,
        version: HeartbeatVersion,
    },
}

/// Effects of [`Discovery::handle`]. All are local: discovery never talks to the wire.
#[derive(Debug, Clone, PartialEq)]
#[must_use = "an effect is a decision to carry out, not a value to drop"]
pub enum DiscoveryEffect {
    /// The registry now holds this observation for the worker (first or newer version).
    Updated {
        worker: WorkerId,
        version: HeartbeatVersion,
    },
    /// (Re-)arm the worker's expiry timer; an earlier one for the worker is superseded.
    ArmExpiry {
        worker: WorkerId,
        connection: ConnectionId,
        version: HeartbeatVersion,
        at: Millis,
    },
    /// The worker's route and observation are gone; the runtime must report every request
    /// whose current attempt is on it as unavailable to the router.
    Detached {
        worker: WorkerId,
        connection: ConnectionId,
        reason: DetachReason,
    },
    /// A heartbeat that was ignored (stale or conflicting), for diagnostics.
    Ignored {
        worker: WorkerId,
        version: HeartbeatVersion,
        why: Observed,
    },
}

/// The registry plus connection-bound routes and expiry.
#[derive(Debug, Clone, PartialEq)]
pub struct Discovery {
    heartbeat_timeout_ms: u64,
    registry: Registry,
    routes: BTreeMap<WorkerId, ConnectionId>,
    seen_on: BTreeMap<ConnectionId, BTreeSet<WorkerId>>,
}

impl Discovery {
    /// Default heartbeat timeout of the reference transport.
    pub const DEFAULT_HEARTBEAT_TIMEOUT_MS: u64 = 3000;

    pub fn new(heartbeat_timeout_ms: u64) -> Self {
        Discovery {
            heartbeat_timeout_ms,
            registry: Registry::default(),
            routes: BTreeMap::new(),
            seen_on: BTreeMap::new(),
        }
    }

    #[must_use = "the effects are what the state machine decided: carry them out"]
    pub fn handle(&mut self, now: Millis, input: DiscoveryInput) -> Vec<DiscoveryEffect> {
        match input {
            DiscoveryInput::Heartbeat {
                connection,
                observation,
            } => self.heartbeat(now, connection, *observation),
            DiscoveryInput::Disconnected { connection } => {
                let workers = self.seen_on.remove(&connection).unwrap_or_default();
                workers
                    .into_iter()
                    .filter_map(|w| self.detach(&w, connection, DetachReason::Disconnected))
                    .collect()
            }
            DiscoveryInput::SendFailed { connection, worker } => self
                .detach(&worker, connection, DetachReason::SendFailed)
                .into_iter()
                .collect(),
            DiscoveryInput::ExpiryFired {
                worker,
                connection,
                version,
            } => {
                let current = self.registry.get(&worker).map(Observation::version);
                if current != Some(version) {
                    return Vec::new();
                }
                self.detach(&worker, connection, DetachReason::HeartbeatExpired)
                    .into_iter()
                    .collect()
            }
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The connection that currently carries `worker`, if it is live.
    pub fn route(&self, worker: &WorkerId) -> Option<ConnectionId> {
        self.routes.get(worker).copied()
    }

    fn heartbeat(
        &mut self,
        now: Millis,
        connection: ConnectionId,
        obs: Observation,
    ) -> Vec<DiscoveryEffect> {
        let worker = obs.worker_id.clone();
        let version = obs.version();
        self.seen_on
            .entry(connection)
            .or_default()
            .insert(worker.clone());
        let observed = self.registry.observe(obs);
        let mut effects = Vec::new();
        match observed {
            Observed::Accepted => effects.push(DiscoveryEffect::Updated {
                worker: worker.clone(),
                version,
            }),
            Observed::Repeated => {}
            Observed::ConflictingDuplicate | Observed::Stale => {
                effects.push(DiscoveryEffect::Ignored {
                    worker,
                    version,
                    why: observed,
                });
                return effects;
            }
        }
        // Only a heartbeat whose observation the registry now holds binds the route.
        self.routes.insert(worker.clone(), connection);
        effects.push(DiscoveryEffect::ArmExpiry {
            worker,
            connection,
            version,
            at: now + self.heartbeat_timeout_ms,
        });
        effects
    }

    fn detach(
        &mut self,
        worker: &WorkerId,
        connection: ConnectionId,
        reason: DetachReason,
    ) -> Option<DiscoveryEffect> {
        if self.routes.get(worker) != Some(&connection) {
            return None;
        }
        self.routes.remove(worker);
        self.registry.remove(worker);
        Some(DiscoveryEffect::Detached {
            worker: worker.clone(),
            connection,
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(epoch: u64, seq: u64, queue: f64) -> Observation {
        let mut o = Observation::new("w", "n");
        o.epoch = crate::ids::Epoch(epoch);
        o.sequence = seq;
        o.queue_ms = queue;
        o
    }

    #[test]
    fn registry_orders_versions_and_ignores_equal_ones() {
        let mut r = Registry::default();
        assert_eq!(r.observe(obs(0, 2, 1.0)), Observed::Accepted);
        assert_eq!(r.observe(obs(0, 1, 9.0)), Observed::Stale);
        assert_eq!(r.observe(obs(0, 2, 5.0)), Observed::ConflictingDuplicate);
        assert_eq!(r.observe(obs(0, 2, 1.0)), Observed::Repeated);
        assert_eq!(r.get(&"w".into()).map(|o| o.queue_ms), Some(1.0));
        // A restart beats any older-epoch sequence.
        assert_eq!(r.observe(obs(1, 0, 7.0)), Observed::Accepted);
        assert_eq!(r.get(&"w".into()).map(|o| o.queue_ms), Some(7.0));
        assert!(r.remove(&"w".into()).is_some());
        assert!(r.is_empty());
    }

    #[test]
    fn registry_lists_workers_in_stable_order() {
        let mut r = Registry::default();
        for w in ["c", "a", "b"] {
            r.observe(Observation::new(w, w));
        }
        let ids: Vec<_> = r.observations().map(|o| o.worker_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
    }

    #[test]
    fn stale_connection_cannot_remove_newer_route() {
        let mut d = Discovery::new(100);
        let (old, new) = (ConnectionId(1), ConnectionId(2));
        let _ = d.handle(
            Millis(0),
            DiscoveryInput::Heartbeat {
                connection: old,
                observation: Box::new(obs(0, 0, 0.0)),
            },
        );
        let _ = d.handle(
            Millis(5),
            DiscoveryInput::Heartbeat {
                connection: new,
                observation: Box::new(obs(1, 0, 0.0)),
            },
        );
        assert_eq!(d.route(&"w".into()), Some(new));
        assert!(
            d.handle(Millis(6), DiscoveryInput::Disconnected { connection: old })
                .is_empty()
        );
        assert_eq!(d.route(&"w".into()), Some(new));
        let fx = d.handle(Millis(7), DiscoveryInput::Disconnected { connection: new });
        assert!(matches!(
            fx.as_slice(),
            [DiscoveryEffect::Detached {
                reason: DetachReason::Disconnected,
                ..
            }]
        ));
        assert!(d.registry().is_empty());
    }

    #[test]
    fn expiry_only_detaches_the_version_it_was_armed_for() {
        let mut d = Discovery::new(40);
        let c = ConnectionId(1);
        let fx = d.handle(
            Millis(0),
            DiscoveryInput::Heartbeat {
                connection: c,
                observation: Box::new(obs(0, 0, 0.0)),
            },
        );
        assert!(fx.contains(&DiscoveryEffect::ArmExpiry {
            worker: "w".into(),
            connection: c,
            version: HeartbeatVersion::new(0, 0),
            at: Millis(40)
        }));
        let _ = d.handle(
            Millis(10),
            DiscoveryInput::Heartbeat {
                connection: c,
                observation: Box::new(obs(0, 1, 0.0)),
            },
        );
        let stale = DiscoveryInput::ExpiryFired {
            worker: "w".into(),
            connection: c,
            version: HeartbeatVersion::new(0, 0),
        };
        assert!(d.handle(Millis(40), stale).is_empty());
        let live = DiscoveryInput::ExpiryFired {
            worker: "w".into(),
            connection: c,
            version: HeartbeatVersion::new(0, 1),
        };
        assert_eq!(d.handle(Millis(50), live).len(), 1);
        assert_eq!(d.route(&"w".into()), None);
    }

    #[test]
    fn conflicting_equal_version_neither_binds_nor_rearms() {
        let mut d = Discovery::new(40);
        let _ = d.handle(
            Millis(0),
            DiscoveryInput::Heartbeat {
                connection: ConnectionId(1),
                observation: Box::new(obs(0, 3, 0.0)),
            },
        );
        let fx = d.handle(
            Millis(1),
            DiscoveryInput::Heartbeat {
                connection: ConnectionId(2),
                observation: Box::new(obs(0, 3, 9.0)),
            },
        );
        assert!(matches!(
            fx.as_slice(),
            [DiscoveryEffect::Ignored {
                why: Observed::ConflictingDuplicate,
                ..
            }]
        ));
        assert_eq!(d.route(&"w".into()), Some(ConnectionId(1)));
        // The identical re-send re-arms.
        let fx = d.handle(
            Millis(2),
            DiscoveryInput::Heartbeat {
                connection: ConnectionId(1),
                observation: Box::new(obs(0, 3, 0.0)),
            },
        );
        assert!(matches!(fx.as_slice(), [DiscoveryEffect::ArmExpiry { .. }]));
    }
}
