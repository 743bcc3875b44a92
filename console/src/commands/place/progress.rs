//! Typed progress notes from a running placement, for the TUI and `den place`.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::mpsc;

use den_protocol::evidence::InstanceReport;
use den_protocol::placement::{Note, Outcome, StepKind};
use den_protocol::skulk::InstanceId;

/// One progress note. `at_ms` is the driver's logical time (ms since it started);
/// `instance` is the submitted instance once one is chosen (or resumed).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressNote {
    pub at_ms: u64,
    pub instance: Option<InstanceId>,
    pub event: Progress,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// The workflow moved to another step.
    Step(StepKind),
    /// Something worth showing that did not end the workflow.
    Note(Note),
    /// A request is being sent, e.g. `GET /state`. `poll`: a reconciliation poll of
    /// `/state` (its evidence follows as [`Progress::Evidence`]).
    Request {
        what: String,
        poll: bool,
    },
    /// Its answer: an HTTP status, or the transport failure.
    Answer {
        what: String,
        poll: bool,
        status: Option<u16>,
        failure: Option<String>,
        latency_ms: Option<u64>,
    },
    /// The submission fence is on disk (before anything effectful is sent).
    FenceWritten {
        path: PathBuf,
    },
    /// The fence could not be written: nothing is sent.
    FenceWriteFailed {
        detail: String,
    },
    /// The outcome is definitive and the fence was removed.
    FenceCleared {
        path: PathBuf,
    },
    /// The fence could not be removed (the outcome stands; the file is stale).
    FenceClearFailed {
        detail: String,
    },
    /// The one inference probe is being sent through the management API.
    Probe {
        what: String,
    },
    /// The latest evidence about the submitted instance (after each reconciliation poll).
    Evidence(Box<InstanceReport>),
    /// Waiting until this logical time before the next poll.
    Waiting {
        until_ms: u64,
    },
    Finished(Outcome),
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Progress::Step(step) => write!(f, "step: {step:?}"),
            Progress::Note(note) => write!(f, "{note}"),
            Progress::Request { what, .. } => write!(f, "→ {what}"),
            Progress::Answer {
                what,
                status,
                failure,
                latency_ms,
                ..
            } => {
                write!(f, "← {what}")?;
                if let Some(status) = status {
                    write!(f, " {status}")?;
                }
                if let Some(failure) = failure {
                    write!(f, " failed: {failure}")?;
                }
                if let Some(ms) = latency_ms {
                    write!(f, " ({ms} ms)")?;
                }
                Ok(())
            }
            Progress::FenceWritten { path } => write!(f, "fence written: {}", path.display()),
            Progress::FenceWriteFailed { detail } => write!(f, "fence not written: {detail}"),
            Progress::FenceCleared { path } => write!(f, "fence removed: {}", path.display()),
            Progress::FenceClearFailed { detail } => write!(f, "fence not removed: {detail}"),
            Progress::Probe { what } => write!(f, "probe → {what}"),
            Progress::Evidence(report) => write!(f, "evidence: {}", report.verdict),
            Progress::Waiting { until_ms } => write!(f, "next poll at {until_ms}ms"),
            Progress::Finished(outcome) => write!(f, "{outcome}"),
        }
    }
}

type Callback = dyn Fn(ProgressNote) + Send + Sync;

/// Where progress notes go: nowhere, a callback, or a channel. Cheap to clone.
#[derive(Clone, Default)]
pub struct ProgressSink {
    callback: Option<Arc<Callback>>,
}

impl fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProgressSink")
            .field("connected", &self.callback.is_some())
            .finish()
    }
}

impl ProgressSink {
    /// Discards every note.
    pub fn none() -> ProgressSink {
        ProgressSink::default()
    }

    /// Calls `f` for every note, on the driver's task (keep it quick).
    pub fn from_fn(f: impl Fn(ProgressNote) + Send + Sync + 'static) -> ProgressSink {
        ProgressSink {
            callback: Some(Arc::new(f)),
        }
    }

    /// Sends every note to the returned receiver (dropped receiver: notes are discarded).
    pub fn channel() -> (ProgressSink, mpsc::UnboundedReceiver<ProgressNote>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let sink = ProgressSink::from_fn(move |note| {
            let _ = tx.send(note);
        });
        (sink, rx)
    }

    pub(crate) fn emit(&self, note: ProgressNote) {
        if let Some(callback) = &self.callback {
            callback(note);
        }
    }
}
