//! Management-API rows: Nodes, Downloads and Instances, from the evidence report and the
//! latest `/state` of each source.

use std::collections::{BTreeMap, BTreeSet};

use den_protocol::evidence::{
    AssignmentReport, Attribution, Binding, DownloadEvidence, DownloadState, EndpointLabel,
    EvidenceReport, InstanceReport, Membership, Presence, ProbeOutcome, Verdict, VerdictKind,
};
use den_protocol::ids::NodeId;
use den_protocol::observation::PoolStats;
use den_protocol::session::{CommandStatus, SourceId};
use den_protocol::skulk::node::HealthLevel;
use den_protocol::skulk::{DownloadProgress, RunnerPhase, State};
use den_protocol::time::Millis;

use super::{
    DownloadRow, DownloadStatus, Evidence, Identity, InstanceRow, Level, Mark, MembershipView,
    Model, NodeRow, Removed, VerdictView,
};

mod downloads;
mod instances;

use downloads::download_rows;
use instances::{instance_rows, tasks_by_instance};

impl Model {
    /// Downloads and instances (after the evidence report was refreshed).
    pub(super) fn rebuild_cluster(&mut self) {
        let Some(report) = &self.report else {
            return;
        };
        let states: Vec<(SourceId, Millis, &State)> = self
            .sources
            .keys()
            .filter_map(|id| self.state_of(id).map(|(at, s)| (id.clone(), at, s)))
            .collect();
        let downloads = download_rows(&states, report, self.now);
        let state_times: BTreeMap<SourceId, Millis> =
            states.iter().map(|(id, at, _)| (id.clone(), *at)).collect();
        let tasks = tasks_by_instance(&states);
        let mut instances = Vec::new();
        for instance in report.instances.values() {
            let deleted_here = self.commands.values().any(|c| {
                c.text == format!("delete {}", instance.instance_id)
                    && c.outcome
                        .as_ref()
                        .is_none_or(|(s, _)| *s != CommandStatus::Failed)
            });
            let tasks = tasks
                .get(&instance.instance_id)
                .cloned()
                .unwrap_or_default();
            instance_rows(instance, &state_times, deleted_here, tasks, &mut instances);
        }
        self.views.downloads = downloads;
        self.views.instances = instances;
        self.versions.downloads += 1;
        self.versions.instances += 1;
    }

    /// Nodes: every node the evidence knows plus every node a den worker runs on.
    pub(super) fn rebuild_nodes(&mut self) {
        let by_node = self.workers_by_node();
        let states: Vec<(SourceId, Millis, &State)> = self
            .sources
            .keys()
            .filter_map(|id| self.state_of(id).map(|(at, s)| (id.clone(), at, s)))
            .collect();
        let mut nodes: BTreeSet<NodeId> = by_node.keys().cloned().collect();
        if let Some(report) = &self.report {
            nodes.extend(report.nodes.keys().cloned());
        }
        let mut rows = Vec::with_capacity(nodes.len());
        for node in nodes {
            let workers = by_node.get(&node).map(Vec::as_slice).unwrap_or(&[]);
            let node_report = self.report.as_ref().and_then(|r| r.nodes.get(&node));
            let identity = node_report
                .and_then(|n| n.endpoint.as_ref())
                .and_then(|label| {
                    let endpoint = self.report.as_ref()?.endpoints.get(label)?;
                    Some(identity_of(label, &endpoint.binding))
                })
                .unwrap_or(Identity::NotBound);
            let (membership, membership_reasons) = match node_report.map(|n| &n.membership) {
                Some(m) => membership_view(m),
                None => (
                    MembershipView::Unknown,
                    vec![
                        "known only from the router feed: no management topology lists it"
                            .to_owned(),
                    ],
                ),
            };
            let mut observed_at = workers.iter().map(|(_, t)| t.received_at).max();
            // The source's own `lastSeen`, on this session's clock: the state arrived at
            // `at` (logical) and `clock` (wall); `lastSeen` is that much older.
            let mut source_seen_at: Option<Millis> = None;
            for (id, at, state) in &states {
                let (Some(clock), Some(seen)) = (self.state_clock(id), state.last_seen.get(&node))
                else {
                    continue;
                };
                let Some(seen) = den_protocol::time::rfc3339_unix_ms(seen) else {
                    continue;
                };
                let seen_at = Millis(at.0.saturating_sub(clock.saturating_sub(seen)));
                source_seen_at = source_seen_at.max(Some(seen_at));
            }
            // The freshest state that reports the node's resources.
            let mut resources: Option<(Millis, &State)> = None;
            for (_, at, state) in &states {
                if state.topology.contains(&node) {
                    observed_at = observed_at.max(Some(*at));
                }
                let has =
                    state.node_memory.contains_key(&node) || state.node_system.contains_key(&node);
                if has && resources.is_none_or(|(t, _)| *at > t) {
                    resources = Some((*at, state));
                }
            }
            let memory = resources.and_then(|(_, s)| s.node_memory.get(&node));
            let system = resources.and_then(|(_, s)| s.node_system.get(&node));
            let ident = resources.and_then(|(_, s)| s.node_identities.get(&node));
            let name = ident
                .map(|i| i.friendly_name.clone())
                .filter(|n| !n.is_empty());
            let known = |v: &str| (!v.is_empty() && v != "unknown").then(|| v.to_owned());
            let os = ident.and_then(|i| {
                let parts: Vec<String> = [
                    known(&i.os_version),
                    known(&i.os_build_version),
                    known(&i.chip_id),
                    known(&i.model_id).filter(|m| m != "Unknown Model"),
                ]
                .into_iter()
                .flatten()
                .collect();
                (!parts.is_empty()).then(|| parts.join(", "))
            });
            let version = ident.map(
                |i| match (known(&i.skulk_version), known(&i.skulk_commit)) {
                    (Some(v), Some(c)) => format!("skulk {v} ({c})"),
                    (Some(v), None) => format!("skulk {v}"),
                    (None, Some(c)) => format!("skulk commit {c}"),
                    (None, None) => "skulk version not reported".to_owned(),
                },
            );
            let disk = resources.and_then(|(_, s)| s.node_disk.get(&node));
            let node_health = resources.and_then(|(_, s)| s.node_health.get(&node));
            let health_reasons: Vec<String> = node_health
                .map(|h| {
                    h.reasons
                        .iter()
                        .map(|r| {
                            let message = if r.message.is_empty() {
                                r.code.clone()
                            } else {
                                r.message.clone()
                            };
                            match r.remediation.as_deref().filter(|m| !m.is_empty()) {
                                Some(fix) => format!("{message} — {fix}"),
                                None => message,
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            let health_level = node_health.map(|h| h.level.to_string());
            let pool = (!workers.is_empty()).then(|| {
                workers
                    .iter()
                    .fold(PoolStats::default(), |mut acc, (_, t)| {
                        let p = &t.observation.pool;
                        acc.total_pages += p.total_pages;
                        acc.free += p.free;
                        acc.reserved += p.reserved;
                        acc.resident += p.resident;
                        acc.evictable += p.evictable;
                        acc.durable += p.durable;
                        acc.page_bytes = acc.page_bytes.max(p.page_bytes);
                        acc
                    })
            });
            let draining = workers.iter().any(|(_, t)| t.observation.draining);
            let mut level = match &membership {
                MembershipView::Member { .. } => Level::Good,
                MembershipView::OneSided { .. } => Level::Warn,
                MembershipView::NotMember => Level::Bad,
                MembershipView::Unknown if !workers.is_empty() => Level::Info,
                MembershipView::Unknown => Level::Unknown,
            };
            if matches!(identity, Identity::Conflict { .. }) {
                level = worse(level, Level::Unknown);
            }
            match node_health.map(|h| &h.level) {
                Some(HealthLevel::Error) => level = worse(level, Level::Bad),
                Some(HealthLevel::Warn) => level = worse(level, Level::Warn),
                _ => {}
            }
            if draining {
                level = worse(level, Level::Warn);
            }
            rows.push(NodeRow {
                node: node.clone(),
                name,
                identity,
                membership,
                membership_reasons,
                observed_at,
                source_seen_at,
                ram_available: memory.map(|m| m.ram_available.in_bytes),
                ram_total: memory.map(|m| m.ram_total.in_bytes),
                gpu_usage: system.map(|s| s.gpu_usage),
                accelerator: system
                    .and_then(|s| s.accelerator.as_ref())
                    .and_then(|a| a.name.clone()),
                pool,
                workers: workers.iter().map(|(w, _)| (*w).clone()).collect(),
                draining,
                health_level,
                health_reasons,
                system: os,
                version,
                disk_available: disk.map(|d| d.available.in_bytes),
                disk_total: disk.map(|d| d.total.in_bytes),
                level,
            });
        }
        self.node_names = rows
            .iter()
            .filter_map(|r| r.name.clone().map(|n| (r.node.clone(), n)))
            .collect();
        self.views.nodes = rows;
        self.versions.nodes += 1;
    }
}

/// Severity order for combining levels: good < info < warn < unknown < bad.
pub(crate) fn worse(a: Level, b: Level) -> Level {
    let rank = |l: Level| match l {
        Level::Good => 0,
        Level::Info => 1,
        Level::Warn => 2,
        Level::Unknown => 3,
        Level::Bad => 4,
    };
    if rank(b) > rank(a) { b } else { a }
}

fn identity_of(label: &EndpointLabel, binding: &Binding) -> Identity {
    let source = SourceId::new(label.as_str());
    match binding {
        Binding::Bound(_) => Identity::Bound { source },
        Binding::Conflict { expected, observed } => Identity::Conflict {
            source,
            expected: expected.clone(),
            observed: observed.clone(),
        },
        Binding::Unbound => Identity::NotBound,
    }
}

fn membership_view(m: &Membership) -> (MembershipView, Vec<String>) {
    let reasons = m.reasons().iter().map(ToString::to_string).collect();
    let view = match m {
        Membership::Member { observers } => MembershipView::Member {
            observers: observers.len(),
        },
        Membership::OneSided { seen_by, .. } => MembershipView::OneSided {
            seen_by: seen_by.iter().map(|l| SourceId::new(l.as_str())).collect(),
        },
        Membership::NotMember { .. } => MembershipView::NotMember,
        Membership::Unknown => MembershipView::Unknown,
    };
    (view, reasons)
}

fn join<'a, T: std::fmt::Display + 'a>(items: impl Iterator<Item = &'a T>) -> String {
    items
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
