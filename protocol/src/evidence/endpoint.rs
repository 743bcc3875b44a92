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

/// What a `/node_id` answer changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Bind {
    Conflict { expected: NodeId, observed: NodeId },
    Restarted { previous: NodeId, node: NodeId },
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

    /// Records a `/node_id` answer.
    ///
    /// An endpoint registered with an expected node (a placement bound to a resource)
    /// that answers as another is a sticky conflict. One registered without, that later
    /// answers as another node than it was bound to, is a conflict too unless
    /// `follow_restarts`: an observer (the console) follows the endpoint to its new
    /// node (Skulk 1.3.0 makes a new node id at every start), dropping what the old node
    /// said, and is told so.
    pub fn bind(&mut self, observed: NodeId, follow_restarts: bool) -> Option<Bind> {
        if self.conflict.is_some() {
            return None;
        }
        if let Some(expected) = &self.expected {
            if *expected != observed {
                self.conflict = Some((expected.clone(), observed.clone()));
                return Some(Bind::Conflict {
                    expected: expected.clone(),
                    observed,
                });
            }
            self.bound = Some(observed);
            return None;
        }
        match self.bound.take() {
            Some(previous) if previous != observed => {
                if follow_restarts {
                    self.bound = Some(observed.clone());
                    self.state = None;
                    Some(Bind::Restarted {
                        previous,
                        node: observed,
                    })
                } else {
                    self.bound = Some(previous.clone());
                    self.conflict = Some((previous.clone(), observed.clone()));
                    Some(Bind::Conflict {
                        expected: previous,
                        observed,
                    })
                }
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
