//! What a waiting placement is waiting for, as one line: per assigned node the download
//! (bytes of total, rate and ETA from the bytes den saw move, or how long nothing moved)
//! and the runner; then whether the probe is pending. Said when the picture changes
//! (a phase, not a number) and otherwise every [`EVERY_MS`], so `den place --wait`
//! shows live progress without repeating itself every poll.

use std::collections::BTreeMap;

use den_protocol::evidence::{DownloadState, InstanceReport};
use den_protocol::ids::NodeId;
use den_protocol::skulk::RunnerPhase;
use den_protocol::text::{bytes, short_node};

/// A line at least this often while something is still moving or waiting.
pub const EVERY_MS: u64 = 10_000;
/// Bytes that have not moved for this long are called a stall.
pub const STALL_MS: u64 = 60_000;

#[derive(Debug, Clone, Copy)]
struct Sample {
    first_at: u64,
    first_bytes: u64,
    bytes: u64,
    changed_at: u64,
}

/// The state of the summary between polls.
#[derive(Debug, Default)]
pub struct Watch {
    samples: BTreeMap<NodeId, Sample>,
    shape: Option<String>,
    said_at: Option<u64>,
}

impl Watch {
    /// The line for this poll, or `None` when it would only repeat the last one.
    pub fn line(&mut self, at_ms: u64, report: &InstanceReport) -> Option<String> {
        let mut parts = Vec::new();
        let mut shape = Vec::new();
        for a in &report.assignments {
            let node = short_node(a.node.as_str());
            let download = match a.download.as_ref().map(|d| &d.state) {
                None | Some(DownloadState::Missing) => "no download record yet".to_owned(),
                Some(DownloadState::Pending { downloaded, total })
                | Some(DownloadState::Ongoing { downloaded, total }) => {
                    self.moving(at_ms, &a.node, downloaded.in_bytes, total.in_bytes)
                }
                Some(DownloadState::Completed { total }) => {
                    format!("download complete ({})", bytes(total.in_bytes))
                }
                Some(DownloadState::Failed { message }) => format!("download failed: {message}"),
                Some(DownloadState::Unknown { tag }) => format!("download {tag}"),
            };
            let runner = match a.runner.phase {
                Some(RunnerPhase::Ready) => "runner ready",
                Some(RunnerPhase::Starting) => "runner starting",
                Some(RunnerPhase::Failed) => "runner failed",
                Some(RunnerPhase::Stopped) => "runner stopped",
                Some(RunnerPhase::Unknown) => "runner in an unknown state",
                None => "no runner state yet",
            };
            shape.push(format!(
                "{node}:{}:{runner}",
                a.download.as_ref().map_or("none", |d| d.state.category())
            ));
            parts.push(format!("{node}: {download}; {runner}"));
        }
        if parts.is_empty() {
            parts.push("the instance is not in /state yet".to_owned());
        }
        let probe = if report.verdict.is_ready() {
            "ready"
        } else if report.awaiting_probe {
            "download and runner agree: probing"
        } else {
            "probe after download and runner agree"
        };
        shape.push(probe.to_owned());
        let shape = shape.join("|");
        let due = self
            .said_at
            .is_none_or(|t| at_ms.saturating_sub(t) >= EVERY_MS);
        if self.shape.as_deref() == Some(shape.as_str()) && !due {
            return None;
        }
        self.shape = Some(shape);
        self.said_at = Some(at_ms);
        Some(format!("waiting: {}; {probe}", parts.join("; ")))
    }

    fn moving(&mut self, at_ms: u64, node: &NodeId, done: u64, total: u64) -> String {
        let s = self.samples.entry(node.clone()).or_insert(Sample {
            first_at: at_ms,
            first_bytes: done,
            bytes: done,
            changed_at: at_ms,
        });
        if done != s.bytes {
            s.bytes = done;
            s.changed_at = at_ms;
        }
        // Skulk reports a total of 0 until it knows the size: unknown, not zero.
        let of = if total == 0 {
            format!("{} of ?", bytes(done))
        } else {
            format!(
                "{} of {} ({}%)",
                bytes(done),
                bytes(total),
                done.min(total).saturating_mul(100) / total
            )
        };
        let still = at_ms.saturating_sub(s.changed_at);
        if still >= STALL_MS {
            return format!(
                "download {of}, no bytes for {} s (stalled? check the node's network and disk)",
                still / 1000
            );
        }
        let elapsed = s.changed_at.saturating_sub(s.first_at);
        let moved = s.bytes.saturating_sub(s.first_bytes);
        if elapsed == 0 || moved == 0 {
            return format!("download {of}");
        }
        let rate = moved.saturating_mul(1000) / elapsed;
        let eta = (total > done && rate > 0).then(|| (total - done) / rate);
        match eta {
            Some(secs) => format!("download {of} at {}/s, ETA {secs} s", bytes(rate)),
            None => format!("download {of} at {}/s", bytes(rate)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use den_protocol::evidence::{
        ArtifactKey, AssignmentReport, Attribution, DownloadEvidence, Membership, Presence,
        RunnerEvidence, Verdict,
    };
    use den_protocol::skulk::Memory;
    use den_protocol::time::Millis;

    fn report(done: u64, total: u64) -> InstanceReport {
        InstanceReport {
            instance_id: "i".into(),
            model_id: None,
            first_seen: Millis(0),
            presence: Presence::NotYetObserved,
            context_token_limit: None,
            assignments: vec![AssignmentReport {
                node: "12D3KooWS5hbRfsg4cwEX7pKogLSmR1udPzi5g68xyrDuoCesy1L".into(),
                runner: RunnerEvidence {
                    runner: "r".into(),
                    observed: Default::default(),
                    phase: Some(RunnerPhase::Starting),
                    failure: None,
                },
                download: Some(DownloadEvidence {
                    node: "n".into(),
                    artifact: ArtifactKey {
                        model_id: "m".into(),
                        registry_card_id: None,
                    },
                    state: DownloadState::Ongoing {
                        downloaded: Memory::from_bytes(done),
                        total: Memory::from_bytes(total),
                    },
                    attribution: Attribution::None,
                    since: None,
                    contradiction: None,
                    late_transients_ignored: 0,
                    other_artifacts: 0,
                }),
                membership: Membership::Unknown,
                resolved_backend: None,
            }],
            probe: None,
            failures: Vec::new(),
            awaiting_probe: false,
            verdict: Verdict::NotReady {
                reasons: Vec::new(),
                deadline: Millis(600_000),
            },
        }
    }

    #[test]
    fn progress_lines_give_bytes_rate_and_eta_then_name_a_stall() {
        const MIB: u64 = 1 << 20;
        let mut w = Watch::default();
        let first = w.line(0, &report(0, 100 * MIB)).expect("first line");
        assert!(
            first.contains("…uoCesy1L: download 0 B of 100.0 MiB (0%)"),
            "{first}"
        );
        assert!(first.contains("runner starting"), "{first}");
        // same phase, 2 s later: not repeated
        assert_eq!(w.line(2_000, &report(10 * MIB, 100 * MIB)), None);
        // due again after 10 s: 50 MiB in 10 s is 5 MiB/s, 50 MiB left is 10 s
        let line = w.line(10_000, &report(50 * MIB, 100 * MIB)).expect("due");
        assert!(
            line.contains("50.0 MiB of 100.0 MiB (50%) at 5.0 MiB/s, ETA 10 s"),
            "{line}"
        );
        // nothing moves for a minute: a stall, said as such
        let line = w.line(75_000, &report(50 * MIB, 100 * MIB)).expect("due");
        assert!(line.contains("no bytes for 65 s (stalled?"), "{line}");
        // an unknown total is not zero
        let mut w = Watch::default();
        let line = w.line(0, &report(0, 0)).expect("line");
        assert!(line.contains("download 0 B of ?"), "{line}");
    }
}
