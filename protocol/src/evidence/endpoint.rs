//! One management endpoint: its identity binding and the freshness of what it said.

use serde::{Deserialize, Serialize};

use super::PollFailure;
use crate::ids::NodeId;
use crate::skulk::State;
use crate::time::Millis;

/// Which node an endpoint is, according to `GET /node_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Binding {
    /// No `/node_id` answer yet.
    Unbound,
    Bound(NodeId),
    /// The endpoint answered as a different node than the expected or previously bound
    /// one. Sticky until the endpoint is registered again: a reachable port alone does
    /// not establish which resource is behind it.
    Conflict {
        expected: NodeId,
        observed: NodeId,
    },
}

/// How current the endpoint's evidence is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Freshness {
    NeverPolled,
    Fresh {
        age_ms: u64,
    },
    /// The last success is older than the staleness bound.
    Stale {
        age_ms: u64,
    },
    /// The latest poll failed (since `since`); cached readiness expired.
    Failing {
        since: Millis,
        failure: PollFailure,
    },
}

impl Freshness {
    pub fn is_fresh(&self) -> bool {
        matches!(self, Freshness::Fresh { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct EndpointTrack {
    pub expected: Option<NodeId>,
    pub bound: Option<NodeId>,
    pub conflict: Option<(NodeId, NodeId)>,
    pub last_ok: Option<Millis>,
    pub failing: Option<(Millis, PollFailure)>,
    pub state: Option<Box<State>>,
}

impl EndpointTrack {
    pub fn new(expected: Option<NodeId>) -> EndpointTrack {
        EndpointTrack {
            expected,
            ..EndpointTrack::default()
        }
    }

    /// Records a `/node_id` answer. Returns `(expected, observed)` when this creates a
    /// new conflict.
    pub fn bind(&mut self, observed: NodeId) -> Option<(NodeId, NodeId)> {
        if self.conflict.is_some() {
            return None;
        }
        let reference = self.bound.clone().or_else(|| self.expected.clone());
        match reference {
            Some(expected) if expected != observed => {
                self.conflict = Some((expected.clone(), observed.clone()));
                Some((expected, observed))
            }
            _ => {
                self.bound = Some(observed);
                None
            }
        }
    }

    pub fn binding(&self) -> Binding {
        match (&self.conflict, &self.bound) {
            (Some((expected, observed)), _) => Binding::Conflict {
                expected: expected.clone(),
                observed: observed.clone(),
            },
            (None, Some(node)) => Binding::Bound(node.clone()),
            (None, None) => Binding::Unbound,
        }
    }

    pub fn freshness(&self, now: Millis, stale_after_ms: u64) -> Freshness {
        if let Some((since, failure)) = &self.failing {
            return Freshness::Failing {
                since: *since,
                failure: failure.clone(),
            };
        }
        match self.last_ok {
            None => Freshness::NeverPolled,
            Some(at) => {
                let age_ms = now.since(at);
                if age_ms > stale_after_ms {
                    Freshness::Stale { age_ms }
                } else {
                    Freshness::Fresh { age_ms }
                }
            }
        }
    }

    /// The state to reason from: only when fresh and without identity conflict.
    pub fn usable_state(&self, now: Millis, stale_after_ms: u64) -> Option<&State> {
        if self.conflict.is_some() || !self.freshness(now, stale_after_ms).is_fresh() {
            return None;
        }
        self.state.as_deref()
    }
}
