//! Runner statuses (tagged: `{"RunnerReady": {}}`, `{"RunnerFailed": {"errorMessage": …}}`).

use crate::skulk::extra::Extra;

use serde::{Deserialize, Serialize};

use super::tagged::tagged_union;

/// The body of a variant without fields. Serialises as `{}`; unexpected fields are kept.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NoFields {
    #[serde(flatten)]
    pub extra: Extra,
}

tagged_union! {
    /// The lifecycle of one runner.
    pub enum RunnerStatus {
        Idle(NoFields) = "RunnerIdle",
        Connecting(NoFields) = "RunnerConnecting",
        Connected(NoFields) = "RunnerConnected",
        Loading(RunnerLoading) = "RunnerLoading",
        Loaded(NoFields) = "RunnerLoaded",
        WarmingUp(NoFields) = "RunnerWarmingUp",
        Ready(NoFields) = "RunnerReady",
        Running(NoFields) = "RunnerRunning",
        ShuttingDown(NoFields) = "RunnerShuttingDown",
        Shutdown(NoFields) = "RunnerShutdown",
        Failed(RunnerFailed) = "RunnerFailed",
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerLoading {
    #[serde(default, alias = "layers_loaded")]
    pub layers_loaded: u64,
    #[serde(default, alias = "total_layers")]
    pub total_layers: u64,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerFailed {
    #[serde(default, alias = "error_message")]
    pub error_message: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A coarse classification of [`RunnerStatus`] for readiness decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RunnerPhase {
    /// Idle … WarmingUp: on its way, not serving yet.
    Starting,
    /// `RunnerReady` or `RunnerRunning`: ready or executing work.
    Ready,
    /// `RunnerFailed`.
    Failed,
    /// Shutting down or shut down.
    Stopped,
    /// A status den does not know.
    Unknown,
}

impl RunnerStatus {
    pub fn phase(&self) -> RunnerPhase {
        match self {
            RunnerStatus::Idle(_)
            | RunnerStatus::Connecting(_)
            | RunnerStatus::Connected(_)
            | RunnerStatus::Loading(_)
            | RunnerStatus::Loaded(_)
            | RunnerStatus::WarmingUp(_) => RunnerPhase::Starting,
            RunnerStatus::Ready(_) | RunnerStatus::Running(_) => RunnerPhase::Ready,
            RunnerStatus::Failed(_) => RunnerPhase::Failed,
            RunnerStatus::ShuttingDown(_) | RunnerStatus::Shutdown(_) => RunnerPhase::Stopped,
            RunnerStatus::Unknown { .. } => RunnerPhase::Unknown,
        }
    }

    /// `RunnerReady` or `RunnerRunning`.
    pub fn is_ready(&self) -> bool {
        self.phase() == RunnerPhase::Ready
    }

    /// The failure message of a `RunnerFailed` (an empty string when Skulk sent `null`).
    pub fn failure_message(&self) -> Option<&str> {
        match self {
            RunnerStatus::Failed(f) => Some(f.error_message.as_deref().unwrap_or("")),
            _ => None,
        }
    }

    /// A short human description, e.g. `loading 14/28 layers`.
    pub fn describe(&self) -> String {
        match self {
            RunnerStatus::Loading(l) => {
                format!("loading {}/{} layers", l.layers_loaded, l.total_layers)
            }
            RunnerStatus::Failed(f) => match &f.error_message {
                Some(m) => format!("failed: {}", super::common::one_line(m)),
                None => "failed".to_owned(),
            },
            other => other.tag().trim_start_matches("Runner").to_lowercase(),
        }
    }
}
