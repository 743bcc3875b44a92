//! The Events panel: a bounded log of what was observed and what the operator did.

use den_protocol::evidence::Notice;
use den_protocol::evidence::reason::summarise;
use den_protocol::session::SourceId;
use den_protocol::time::Millis;

use super::{EventLine, Level, Model};

impl Model {
    pub(super) fn log_line(
        &mut self,
        at: Millis,
        source: Option<&SourceId>,
        level: Level,
        text: String,
    ) {
        self.log_seq += 1;
        self.log.push(EventLine {
            seq: self.log_seq,
            at,
            source: source.cloned(),
            level,
            text,
        });
        // Trim in batches so that the cost per line stays constant.
        let cap = self.config.event_log_len.max(1);
        if self.log.len() > cap + cap / 4 {
            let excess = self.log.len() - cap;
            self.log.drain(..excess);
        }
        self.versions.events += 1;
    }

    /// What the evidence reducer reported at once.
    pub(super) fn log_notices(&mut self, at: Millis, source: &SourceId, notices: Vec<Notice>) {
        for notice in notices {
            let (level, text) = match notice {
                Notice::VerdictChanged { instance, verdict } => {
                    let level = match verdict.kind() {
                        den_protocol::evidence::VerdictKind::Ready => Level::Good,
                        den_protocol::evidence::VerdictKind::NotReady => Level::Info,
                        den_protocol::evidence::VerdictKind::Uncertain => Level::Unknown,
                        den_protocol::evidence::VerdictKind::Lost
                        | den_protocol::evidence::VerdictKind::Failed => Level::Bad,
                    };
                    let reasons = verdict.reasons();
                    let text = if reasons.is_empty() {
                        format!("instance {}: {}", short(instance.as_str()), verdict.kind())
                    } else {
                        format!(
                            "instance {}: {}: {}",
                            short(instance.as_str()),
                            verdict.kind(),
                            summarise(reasons)
                        )
                    };
                    (level, text)
                }
                Notice::ReadinessLost {
                    instance,
                    reasons,
                    recover_by,
                } => (
                    Level::Bad,
                    format!(
                        "instance {} lost readiness (recovery until {recover_by}): {}",
                        short(instance.as_str()),
                        summarise(&reasons)
                    ),
                ),
                Notice::ReadinessRecovered { instance } => (
                    Level::Good,
                    format!("instance {} recovered", short(instance.as_str())),
                ),
                Notice::InitialDeadlineExceeded { instance, deadline } => (
                    Level::Bad,
                    format!(
                        "instance {}: not ready by its deadline {deadline}",
                        short(instance.as_str())
                    ),
                ),
                Notice::RecoveryDeadlineExceeded { instance, deadline } => (
                    Level::Bad,
                    format!(
                        "instance {}: did not recover by {deadline}",
                        short(instance.as_str())
                    ),
                ),
                Notice::IdentityConflict {
                    endpoint,
                    expected,
                    observed,
                } => (
                    Level::Unknown,
                    format!("{endpoint} answers as node {observed}, bound to {expected}"),
                ),
                Notice::NodeRestarted {
                    endpoint,
                    previous,
                    node,
                } => (
                    Level::Warn,
                    format!(
                        "{endpoint} restarted: node {previous} left, node {node} joined at the same endpoint (a new node id)"
                    ),
                ),
            };
            self.log_line(at, Some(source), level, text);
        }
    }
}

/// The first 8 characters of a long id (UUIDs, peer ids), as the evidence reasons do.
pub fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}
