//! The simulator's trace: every machine step with its input and effects, every network
//! fault and every injected fault, in the order they happened.

use serde::Serialize;

use crate::ids::{AssignmentId, WorkerId};
use crate::router::{RouterEffect, RouterInput};
use crate::time::Millis;
use crate::worker::{WorkerEffect, WorkerInput};

/// One end of a directed link.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Endpoint {
    Router,
    Worker(WorkerId),
}

impl Endpoint {
    pub fn worker(id: impl Into<WorkerId>) -> Self {
        Endpoint::Worker(id.into())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceEntry {
    pub at: Millis,
    #[serde(flatten)]
    pub event: TraceEvent,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "trace", rename_all = "kebab-case")]
pub enum TraceEvent {
    /// The router handled `input` and produced `effects`.
    Router {
        input: RouterInput,
        effects: Vec<RouterEffect>,
    },
    /// A worker handled `input` and produced `effects`.
    Worker {
        worker: WorkerId,
        input: WorkerInput,
        effects: Vec<WorkerEffect>,
    },
    /// A message was lost: its link was partitioned, or a drop fault hit it.
    NetworkDrop {
        from: Endpoint,
        to: Endpoint,
        message: &'static str,
        assignment: AssignmentId,
    },
    /// A delay fault postponed a message.
    NetworkDelay {
        from: Endpoint,
        to: Endpoint,
        message: &'static str,
        assignment: AssignmentId,
        extra_ms: u64,
    },
    /// A duplicate fault sent a message twice.
    NetworkDuplicate {
        from: Endpoint,
        to: Endpoint,
        message: &'static str,
        assignment: AssignmentId,
    },
    /// A message or engine report for a worker the simulation does not have.
    MissingWorker { worker: WorkerId },
    /// A fault was injected.
    Fault(Fault),
}

/// Faults the simulator can inject.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum Fault {
    Partition {
        from: Endpoint,
        to: Endpoint,
    },
    Heal,
    Pause {
        worker: WorkerId,
    },
    Resume {
        worker: WorkerId,
    },
    Crash {
        worker: WorkerId,
    },
    Restart {
        worker: WorkerId,
    },
    SetCapacity {
        worker: WorkerId,
        free: u32,
        evictable: u32,
    },
    DropNext {
        from: Endpoint,
        to: Endpoint,
    },
    DelayNext {
        from: Endpoint,
        to: Endpoint,
        ms: u64,
    },
    DuplicateNext {
        from: Endpoint,
        to: Endpoint,
    },
}

/// A one-shot fault waiting for the next message on its link.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct LinkFault {
    pub(super) from: Endpoint,
    pub(super) to: Endpoint,
    pub(super) action: LinkAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum LinkAction {
    Drop,
    Delay(u64),
    Duplicate,
}
