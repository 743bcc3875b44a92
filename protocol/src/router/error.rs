//! Why a request failed: one error kind per cause (spec §2.8, §12).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::candidate::Infeasible;
use crate::decision::AttemptOutcome;
use crate::ids::WorkerId;
use crate::time::Millis;
use crate::wire::Failure;

/// The terminal error a request can end with. Each `Display` is one line that says what
/// happened and what the client can do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum RouterError {
    /// No candidate was feasible, or every feasible one declined, timed out, failed or
    /// became unavailable before the first token.
    #[error("no feasible worker: {summary}")]
    NoFeasibleWorker { summary: NoFeasible },
    /// The worker went away after tokens were streamed; a transparent retry could
    /// duplicate or contradict visible output.
    #[error(
        "worker {worker} became unavailable after {delivered} streamed token(s); partial output cannot be retried transparently: resubmit the request"
    )]
    WorkerUnavailableAfterStream { worker: WorkerId, delivered: u32 },
    /// The worker reported a failure after tokens were streamed.
    #[error(
        "worker {worker} failed after {delivered} streamed token(s) ({reason}); partial output cannot be retried transparently: resubmit the request"
    )]
    WorkerFailedAfterStream {
        worker: WorkerId,
        reason: Failure,
        delivered: u32,
    },
    /// The request's deadline passed before it finished.
    #[error(
        "deadline {deadline} passed before the request finished: retry with a longer deadline or when the cluster is less loaded"
    )]
    DeadlineExceeded { deadline: Millis },
}

/// What was tried before giving up with [`RouterError::NoFeasibleWorker`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoFeasible {
    /// Candidates scored at submission.
    pub candidates: u32,
    /// Infeasible candidates by reason, in the order reasons are checked.
    pub infeasible: Vec<(Infeasible, u32)>,
    /// Offers made (each one failed).
    pub attempts: u64,
    /// How the last offer ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<LastAttempt>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastAttempt {
    pub worker: WorkerId,
    pub outcome: AttemptOutcome,
}

impl fmt::Display for NoFeasible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.candidates == 0 {
            return f.write_str("no candidates were given; check that a worker serves the model");
        }
        write!(f, "{} offer(s) failed", self.attempts)?;
        if let Some(last) = &self.last {
            write!(f, " (last: {} {})", last.worker, last.outcome)?;
        }
        let infeasible: u32 = self.infeasible.iter().map(|(_, n)| n).sum();
        if infeasible > 0 {
            write!(
                f,
                ", {infeasible} of {} candidate(s) infeasible (",
                self.candidates
            )?;
            for (i, (reason, n)) in self.infeasible.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{reason} ×{n}")?;
            }
            f.write_str(")")?;
        }
        f.write_str("; add capacity or retry later")
    }
}
