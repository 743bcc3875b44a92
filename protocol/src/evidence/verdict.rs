//! Readiness verdicts and the per-instance phase that turns assessments into verdicts
//! with deadlines.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::reason::{Reason, summarise};
use crate::time::Millis;

/// The readiness of one instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Verdict {
    /// Download, runners and a successful inference probe agree for this instance.
    Ready { since: Millis },
    /// Not ready yet; readiness is expected by `deadline`.
    NotReady {
        reasons: Vec<Reason>,
        deadline: Millis,
    },
    /// Observations contradict each other: refresh them. Never ready.
    Uncertain { reasons: Vec<Reason> },
    /// It was ready and lost membership, runner readiness or its evidence; it may recover
    /// until `recover_by`.
    Lost {
        reasons: Vec<Reason>,
        since: Millis,
        recover_by: Millis,
    },
    /// A deadline passed without readiness (initial or recovery). Terminal.
    Failed { reasons: Vec<Reason> },
}

/// The verdict without its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum VerdictKind {
    Ready,
    NotReady,
    Uncertain,
    Lost,
    Failed,
}

impl Verdict {
    pub fn kind(&self) -> VerdictKind {
        match self {
            Verdict::Ready { .. } => VerdictKind::Ready,
            Verdict::NotReady { .. } => VerdictKind::NotReady,
            Verdict::Uncertain { .. } => VerdictKind::Uncertain,
            Verdict::Lost { .. } => VerdictKind::Lost,
            Verdict::Failed { .. } => VerdictKind::Failed,
        }
    }

    pub fn is_ready(&self) -> bool {
        matches!(self, Verdict::Ready { .. })
    }

    pub fn reasons(&self) -> &[Reason] {
        match self {
            Verdict::Ready { .. } => &[],
            Verdict::NotReady { reasons, .. }
            | Verdict::Uncertain { reasons }
            | Verdict::Lost { reasons, .. }
            | Verdict::Failed { reasons } => reasons,
        }
    }
}

impl fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VerdictKind::Ready => "ready",
            VerdictKind::NotReady => "not ready",
            VerdictKind::Uncertain => "uncertain",
            VerdictKind::Lost => "lost",
            VerdictKind::Failed => "failed",
        })
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Ready { since } => write!(f, "ready since {since}"),
            Verdict::NotReady { reasons, deadline } => {
                write!(f, "not ready (deadline {deadline}): {}", summarise(reasons))
            }
            Verdict::Uncertain { reasons } => write!(f, "uncertain: {}", summarise(reasons)),
            Verdict::Lost {
                reasons,
                since,
                recover_by,
            } => {
                write!(
                    f,
                    "lost at {since}, recovery until {recover_by}: {}",
                    summarise(reasons)
                )
            }
            Verdict::Failed { reasons } => write!(f, "failed: {}", summarise(reasons)),
        }
    }
}

/// Where an instance is in its readiness life.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Phase {
    /// Waiting for first readiness until `deadline`.
    Initial {
        deadline: Millis,
        deadline_reported: bool,
    },
    Ready {
        since: Millis,
    },
    Lost {
        since: Millis,
        recover_by: Millis,
    },
    Failed {
        reasons: Vec<Reason>,
    },
}

/// What a phase transition wants reported.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Transition {
    None,
    BecameReady,
    Lost { recover_by: Millis },
    Recovered,
    InitialDeadlinePassed { deadline: Millis },
    RecoveryDeadlinePassed { deadline: Millis },
}

/// Advances `phase` given the current assessment and returns the verdict.
///
/// `reasons` are everything that keeps the instance from being ready (empty = ready);
/// contradictions among them make the verdict uncertain.
pub(crate) fn advance(
    phase: &mut Phase,
    now: Millis,
    reasons: Vec<Reason>,
    recovery_ms: u64,
    hard_expiry: Option<Millis>,
) -> (Verdict, Transition) {
    let ready = reasons.is_empty();
    let contradictory = reasons.iter().any(Reason::is_contradiction);
    let bound = |t: Millis| hard_expiry.map_or(t, |h| t.min(h));
    // Failed while the proof lasts, without moving the phase: deadlines keep running,
    // and evidence that changes (a newer attempt where the dialect has them) is read
    // again as it comes.
    // Before first readiness only: capacity that was ready and lost it gets its bounded
    // recovery interval, as the guide asks, whatever the cause.
    if !contradictory
        && reasons.iter().any(Reason::is_terminal)
        && matches!(phase, Phase::Initial { .. })
    {
        // The proof first: one-line summaries lead with it.
        let mut reasons = reasons;
        reasons.sort_by_key(|r| !r.is_terminal());
        return (Verdict::Failed { reasons }, Transition::None);
    }
    match phase.clone() {
        Phase::Initial {
            deadline,
            deadline_reported,
        } => {
            if ready {
                *phase = Phase::Ready { since: now };
                return (Verdict::Ready { since: now }, Transition::BecameReady);
            }
            if now < deadline {
                let verdict = if contradictory {
                    Verdict::Uncertain { reasons }
                } else {
                    Verdict::NotReady { reasons, deadline }
                };
                return (verdict, Transition::None);
            }
            let transition = if deadline_reported {
                Transition::None
            } else {
                Transition::InitialDeadlinePassed { deadline }
            };
            let mut all = vec![Reason::ReadinessDeadlineExceeded { deadline }];
            all.extend(reasons);
            if contradictory {
                // Contradictory evidence is not proof of failure: it stays uncertain, with
                // the deadline named among the reasons.
                *phase = Phase::Initial {
                    deadline,
                    deadline_reported: true,
                };
                (Verdict::Uncertain { reasons: all }, transition)
            } else {
                *phase = Phase::Failed {
                    reasons: all.clone(),
                };
                (Verdict::Failed { reasons: all }, transition)
            }
        }
        Phase::Ready { since } => {
            if ready {
                return (Verdict::Ready { since }, Transition::None);
            }
            let recover_by = bound(now.saturating_add(recovery_ms));
            *phase = Phase::Lost {
                since: now,
                recover_by,
            };
            (
                Verdict::Lost {
                    reasons,
                    since: now,
                    recover_by,
                },
                Transition::Lost { recover_by },
            )
        }
        Phase::Lost { since, recover_by } => {
            if ready {
                *phase = Phase::Ready { since: now };
                return (Verdict::Ready { since: now }, Transition::Recovered);
            }
            if now < recover_by {
                return (
                    Verdict::Lost {
                        reasons,
                        since,
                        recover_by,
                    },
                    Transition::None,
                );
            }
            let mut all = vec![Reason::RecoveryDeadlineExceeded {
                deadline: recover_by,
            }];
            all.extend(reasons);
            *phase = Phase::Failed {
                reasons: all.clone(),
            };
            (
                Verdict::Failed { reasons: all },
                Transition::RecoveryDeadlinePassed {
                    deadline: recover_by,
                },
            )
        }
        Phase::Failed { reasons } => (Verdict::Failed { reasons }, Transition::None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_initial_deadline_turns_not_ready_into_failed_once() {
        let mut phase = Phase::Initial {
            deadline: Millis(100),
            deadline_reported: false,
        };
        let (v, t) = advance(&mut phase, Millis(50), vec![Reason::ProbeMissing], 10, None);
        assert_eq!((v.kind(), t), (VerdictKind::NotReady, Transition::None));
        let (v, t) = advance(
            &mut phase,
            Millis(100),
            vec![Reason::ProbeMissing],
            10,
            None,
        );
        assert_eq!(v.kind(), VerdictKind::Failed);
        assert_eq!(
            t,
            Transition::InitialDeadlinePassed {
                deadline: Millis(100)
            }
        );
        // terminal: later readiness does not revive it
        let (v, t) = advance(&mut phase, Millis(120), vec![], 10, None);
        assert_eq!((v.kind(), t), (VerdictKind::Failed, Transition::None));
    }

    #[test]
    fn a_terminal_failure_fails_at_once_and_history_does_not() {
        let failed = |current| Reason::DownloadFailed {
            node: "n".into(),
            attempt: None,
            message: "[Errno 28] No space left on device".to_owned(),
            current,
        };
        let mut phase = Phase::Initial {
            deadline: Millis(900_000),
            deadline_reported: false,
        };
        let (v, _) = advance(&mut phase, Millis(10), vec![failed(false)], 10, None);
        assert_eq!(v.kind(), VerdictKind::NotReady);
        let (v, _) = advance(&mut phase, Millis(20), vec![failed(true)], 10, None);
        assert_eq!(v.kind(), VerdictKind::Failed, "long before the deadline");
        // the proof gone (a newer attempt in a dialect that has them), it is read again
        let (v, _) = advance(&mut phase, Millis(30), vec![Reason::ProbeMissing], 10, None);
        assert_eq!(v.kind(), VerdictKind::NotReady);
        // once ready, a failure is a loss with its recovery interval
        let mut phase = Phase::Ready { since: Millis(0) };
        let (v, _) = advance(&mut phase, Millis(5), vec![failed(true)], 1_000, None);
        assert_eq!(v.kind(), VerdictKind::Lost);
        // a contradiction is not proof: uncertain, not failed
        let mut phase = Phase::Initial {
            deadline: Millis(900_000),
            deadline_reported: false,
        };
        let contradiction = Reason::DownloadContradiction {
            node: "n".into(),
            detail: "completed on one endpoint, failed on another".to_owned(),
        };
        let (v, _) = advance(
            &mut phase,
            Millis(10),
            vec![failed(true), contradiction],
            1_000,
            None,
        );
        assert_eq!(v.kind(), VerdictKind::Uncertain);
    }

    #[test]
    fn recovery_is_bounded_by_the_hard_expiry() {
        let mut phase = Phase::Ready { since: Millis(0) };
        let (v, t) = advance(
            &mut phase,
            Millis(10),
            vec![Reason::ProbeMissing],
            1_000,
            Some(Millis(50)),
        );
        assert_eq!(v.kind(), VerdictKind::Lost);
        assert_eq!(
            t,
            Transition::Lost {
                recover_by: Millis(50)
            }
        );
    }
}
