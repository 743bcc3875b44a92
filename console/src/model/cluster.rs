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

/// A download of 0 bytes this long is named as stalled.
const STALL_HINT_MS: u64 = 5 * 60_000;

fn download_rows(
    states: &[(SourceId, Millis, &State)],
    report: &EvidenceReport,
    now: Millis,
) -> Vec<DownloadRow> {
    let mut rows: BTreeMap<String, DownloadRow> = BTreeMap::new();
    for (source, at, state) in states {
        for (node, records) in &state.downloads {
            for record in records {
                let row = download_row(source, *at, node, record);
                match rows.get_mut(&row.key) {
                    None => {
                        rows.insert(row.key.clone(), row);
                    }
                    Some(existing) => merge_download(existing, row),
                }
            }
        }
    }
    // What the evidence reducer concluded per (node, artifact).
    let evidence: BTreeMap<String, &DownloadEvidence> = report
        .nodes
        .values()
        .flat_map(|n| n.downloads.iter())
        .map(|d| {
            (
                group_key(
                    &d.node,
                    d.artifact.model_id.as_str(),
                    d.artifact.registry_card_id.as_ref().map(|c| c.as_str()),
                ),
                d,
            )
        })
        .collect();
    for row in rows.values_mut() {
        let Some(d) = evidence.get(&row.group) else {
            continue;
        };
        if let Some(c) = &d.contradiction
            && row.contradiction.is_none()
        {
            row.contradiction = Some(c.clone());
            row.level = Level::Unknown;
        }
        // A failed attempt of an artifact whose current attempt completed is history.
        if row.status == DownloadStatus::Failed && d.state.is_complete() {
            row.level = Level::Info;
        }
        let moving = matches!(
            row.status,
            DownloadStatus::Pending | DownloadStatus::Ongoing
        );
        if moving
            && row.downloaded.unwrap_or(0) == 0
            && let Some(since) = d.since
            && now.since(since) >= STALL_HINT_MS
        {
            row.hint = Some(format!(
                "0 B after {}: stalled? check the node's network and disk",
                crate::ui::cells::age(now.since(since))
            ));
            row.level = worse(row.level, Level::Warn);
        }
    }
    // Skulk keeps downloading after the instance that wanted it is deleted.
    let needed: BTreeSet<(NodeId, String)> = states
        .iter()
        .flat_map(|(_, _, state)| state.instances.values())
        .filter_map(|i| i.core())
        .flat_map(|core| {
            let model = core.shard_assignments.model_id.to_string();
            core.shard_assignments
                .node_to_runner
                .keys()
                .map(move |n| (n.clone(), model.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    for row in rows.values_mut() {
        let moving = matches!(
            row.status,
            DownloadStatus::Pending | DownloadStatus::Ongoing
        );
        if moving && row.hint.is_none() && !needed.contains(&(row.node.clone(), row.model.clone()))
        {
            row.hint = Some(
                "no instance on this node needs it (Skulk keeps a download after its instance is deleted)"
                    .to_owned(),
            );
        }
    }
    rows.into_values().collect()
}

fn group_key(node: &NodeId, model: &str, card: Option<&str>) -> String {
    format!("{node}/{model}/{}", card.unwrap_or(""))
}

fn download_row(
    source: &SourceId,
    at: Millis,
    node: &NodeId,
    record: &DownloadProgress,
) -> DownloadRow {
    let card = record.model_card();
    let model = card
        .as_ref()
        .map_or_else(|| "?".to_owned(), |c| c.model_id.to_string());
    let registry = card
        .as_ref()
        .and_then(|c| c.registry_card_id.as_ref())
        .map(|c| c.to_string());
    let attempt = record.attempt_id_owned().map(|a| a.to_string());
    let status = match record {
        DownloadProgress::Pending(_) => DownloadStatus::Pending,
        DownloadProgress::Ongoing(_) => DownloadStatus::Ongoing,
        DownloadProgress::Completed(_) => DownloadStatus::Completed,
        DownloadProgress::Failed(_) => DownloadStatus::Failed,
        DownloadProgress::Unknown { tag, .. } => DownloadStatus::Unknown(tag.clone()),
    };
    let level = match status {
        DownloadStatus::Completed => Level::Good,
        DownloadStatus::Pending | DownloadStatus::Ongoing => Level::Info,
        DownloadStatus::Failed => Level::Bad,
        DownloadStatus::Unknown(_) => Level::Unknown,
    };
    let bytes = record.bytes();
    let rate = match record {
        DownloadProgress::Ongoing(d) => Some(d.download_progress.speed),
        _ => None,
    };
    let (eta_ms, files) = match record {
        DownloadProgress::Ongoing(d) => (
            u64::try_from(d.download_progress.eta_ms).ok(),
            Some((
                d.download_progress.completed_files,
                d.download_progress.total_files,
            )),
        ),
        _ => (None, None),
    };
    DownloadRow {
        key: format!("{node}/{model}/{}", attempt.as_deref().unwrap_or("legacy")),
        group: group_key(node, &model, registry.as_deref()),
        node: node.clone(),
        model,
        card: registry,
        attempt,
        status,
        downloaded: bytes.map(|(d, _)| d.in_bytes),
        total: bytes.map(|(_, t)| t.in_bytes).filter(|t| *t > 0),
        rate,
        eta_ms,
        files,
        error: record
            .error_message()
            .map(den_protocol::skulk::common::one_line),
        hint: None,
        seen_by: vec![source.clone()],
        contradiction: None,
        observed_at: at,
        level,
    }
}

/// The same record seen by two sources: they must agree on its status.
fn merge_download(existing: &mut DownloadRow, new: DownloadRow) {
    if existing.status != new.status && existing.contradiction.is_none() {
        existing.contradiction = Some(format!(
            "{} reports {:?}, {} reports {:?}",
            join(existing.seen_by.iter()),
            existing.status,
            join(new.seen_by.iter()),
            new.status
        ));
        existing.level = Level::Unknown;
    }
    existing.seen_by.extend(new.seen_by);
    if new.observed_at > existing.observed_at {
        let contradiction = existing.contradiction.take();
        let seen_by = std::mem::take(&mut existing.seen_by);
        let level = if contradiction.is_some() {
            Level::Unknown
        } else {
            new.level
        };
        *existing = DownloadRow {
            contradiction,
            seen_by,
            level,
            ..new
        };
    }
}

/// Every task of every state by instance, one line each, deduplicated by task id (the
/// freshest state's view of a task wins).
fn tasks_by_instance(
    states: &[(SourceId, Millis, &State)],
) -> BTreeMap<den_protocol::skulk::InstanceId, Vec<String>> {
    let mut newest: BTreeMap<String, (Millis, den_protocol::skulk::InstanceId, String)> =
        BTreeMap::new();
    for (_, at, state) in states {
        for (task_id, task) in &state.tasks {
            let Some(common) = task.common() else {
                continue;
            };
            let Some(instance) = common.instance_id else {
                continue;
            };
            let kind = task.tag();
            let mut line = format!(
                "{kind} {} {}",
                super::log::short(task_id.as_str()),
                common.task_status
            );
            if let den_protocol::skulk::Task::TextGeneration(g) = task {
                line.push_str(&format!(
                    ", command {}",
                    super::log::short(g.command_id.as_str())
                ));
            }
            if let Some(e) = task.error_message() {
                line.push_str(&format!(": {}", den_protocol::text::one_line(e)));
            }
            let key = task_id.to_string();
            if newest.get(&key).is_none_or(|(t, _, _)| *at >= *t) {
                newest.insert(key, (*at, instance, line));
            }
        }
    }
    let mut out: BTreeMap<den_protocol::skulk::InstanceId, Vec<String>> = BTreeMap::new();
    for (_, instance, line) in newest.into_values() {
        out.entry(instance).or_default().push(line);
    }
    out
}

fn instance_rows(
    report: &InstanceReport,
    state_times: &BTreeMap<SourceId, Millis>,
    deleted_here: bool,
    tasks: Vec<String>,
    out: &mut Vec<InstanceRow>,
) {
    let id = report.instance_id.to_string();
    let (presence, present_on): (String, Vec<&EndpointLabel>) = match &report.presence {
        Presence::Observed { endpoints } => (
            format!("observed by {}", join(endpoints.iter())),
            endpoints.iter().collect(),
        ),
        Presence::NotYetObserved => ("not yet observed".to_owned(), Vec::new()),
        Presence::Gone { last_seen } => (
            format!(
                "removed (last seen at {})",
                crate::ui::cells::clock(*last_seen)
            ),
            Vec::new(),
        ),
        Presence::Disputed {
            present_on,
            absent_on,
        } => (
            format!(
                "present on {}, absent on {}",
                join(present_on.iter()),
                join(absent_on.iter())
            ),
            present_on.iter().collect(),
        ),
        Presence::Unknown => ("no fresh source".to_owned(), Vec::new()),
    };
    let observed_at = present_on
        .iter()
        .filter_map(|l| state_times.get(&SourceId::new(l.as_str())))
        .max()
        .copied();
    let children: Vec<InstanceRow> = report
        .assignments
        .iter()
        .map(|a| assignment_row(&id, a, report, observed_at))
        .collect();
    let worst = |pick: fn(&InstanceRow) -> Option<Mark>| {
        children
            .iter()
            .filter_map(pick)
            .reduce(Mark::worse)
            .unwrap_or(Mark::Unknown)
    };
    let download = worst(|r| match r {
        InstanceRow::Assignment { download, .. } => Some(download.mark),
        InstanceRow::Instance { .. } => None,
    });
    let runner = worst(|r| match r {
        InstanceRow::Assignment { runner_status, .. } => Some(runner_status.mark),
        InstanceRow::Instance { .. } => None,
    });
    let probe = worst(|r| match r {
        InstanceRow::Assignment { probe, .. } => Some(probe.mark),
        InstanceRow::Instance { .. } => None,
    });
    let removed = match &report.presence {
        Presence::Gone { last_seen } => Some(Removed {
            last_seen: *last_seen,
            cause: if deleted_here {
                "deleted through den".to_owned()
            } else {
                "no longer in any fresh /state (deleted or failed in the cluster)".to_owned()
            },
        }),
        _ => None,
    };
    let mut verdict = verdict_view(&report.verdict, report.awaiting_probe);
    if let Some(r) = &removed {
        verdict = VerdictView {
            kind: "removed".to_owned(),
            deadline: None,
            since: Some(r.last_seen),
            reasons: vec![r.cause.clone()],
            level: Level::Info,
        };
    }
    out.push(InstanceRow::Instance {
        instance: id.clone(),
        model: report.model_id.as_ref().map(ToString::to_string),
        nodes: report.assignments.len(),
        presence,
        context_limit: report.context_token_limit,
        verdict,
        removed,
        tasks,
        download,
        runner,
        probe,
        failures: report.failures.iter().map(ToString::to_string).collect(),
        observed_at,
    });
    out.extend(children);
}

/// The verdict as drawn. An instance whose download, runners and membership agree but
/// that no probe was observed for is shown as `unprobed` (this console does not send
/// inference requests by itself): never as ready, and not as failed for want of a probe
/// it never sent. The reducer's own verdict and reasons are kept.
fn verdict_view(verdict: &Verdict, awaiting_probe: bool) -> VerdictView {
    let (deadline, since) = match verdict {
        Verdict::Ready { since } => (None, Some(*since)),
        Verdict::NotReady { deadline, .. } => (Some(*deadline), None),
        Verdict::Lost {
            since, recover_by, ..
        } => (Some(*recover_by), Some(*since)),
        Verdict::Uncertain { .. } | Verdict::Failed { .. } => (None, None),
    };
    let (kind, level) = match verdict.kind() {
        VerdictKind::Ready => ("ready".to_owned(), Level::Good),
        _ if awaiting_probe => ("unprobed".to_owned(), Level::Info),
        VerdictKind::NotReady => ("not ready".to_owned(), Level::Warn),
        VerdictKind::Uncertain => ("uncertain".to_owned(), Level::Unknown),
        VerdictKind::Lost => ("lost".to_owned(), Level::Bad),
        VerdictKind::Failed => ("failed".to_owned(), Level::Bad),
    };
    VerdictView {
        kind,
        deadline,
        since,
        reasons: verdict.reasons().iter().map(ToString::to_string).collect(),
        level,
    }
}

fn assignment_row(
    instance: &str,
    a: &AssignmentReport,
    report: &InstanceReport,
    observed_at: Option<Millis>,
) -> InstanceRow {
    let download = match &a.download {
        None => Evidence::new(Mark::Unknown, "no readable card for the shard"),
        Some(d) => download_evidence(d),
    };
    let runner = &a.runner;
    let runner_status = match runner.phase {
        Some(RunnerPhase::Ready) => Evidence::new(Mark::Ok, describe_runner(a)),
        Some(RunnerPhase::Starting) => Evidence::new(Mark::Pending, describe_runner(a)),
        Some(RunnerPhase::Failed) => Evidence::new(
            Mark::Bad,
            runner
                .failure
                .clone()
                .unwrap_or_else(|| "failed".to_owned()),
        ),
        Some(RunnerPhase::Stopped) => Evidence::new(Mark::Bad, describe_runner(a)),
        Some(RunnerPhase::Unknown) => Evidence::new(Mark::Unknown, describe_runner(a)),
        None if runner.observed.is_empty() => Evidence::new(Mark::Unknown, "not reported"),
        None => Evidence::new(
            Mark::Contradiction,
            format!("views disagree: {}", describe_runner(a)),
        ),
    };
    let probe = match &report.probe {
        Some(p) => match &p.outcome {
            ProbeOutcome::Succeeded { served_by } => match served_by {
                Some(other) if other != &report.instance_id => {
                    Evidence::new(Mark::Bad, format!("answered by instance {other}"))
                }
                _ => Evidence::new(Mark::Ok, format!("succeeded at {}", p.at)),
            },
            ProbeOutcome::Failed { detail } => Evidence::new(Mark::Bad, detail.clone()),
        },
        None if report.awaiting_probe => Evidence::new(Mark::Pending, "awaiting a probe"),
        None => Evidence::new(Mark::Unknown, "no probe observed"),
    };
    let membership = match &a.membership {
        Membership::Member { .. } => Evidence::new(Mark::Ok, "member"),
        Membership::OneSided { seen_by, .. } => Evidence::new(
            Mark::Pending,
            format!("one-sided: seen by {} only", join(seen_by.iter())),
        ),
        Membership::NotMember { .. } => Evidence::new(Mark::Bad, "not a member"),
        Membership::Unknown => Evidence::new(Mark::Unknown, "no fresh source"),
    };
    InstanceRow::Assignment {
        instance: instance.to_owned(),
        node: a.node.clone(),
        runner: a.runner.runner.to_string(),
        download,
        runner_status,
        probe,
        membership,
        backend: a.resolved_backend.clone(),
        observed_at,
    }
}

fn describe_runner(a: &AssignmentReport) -> String {
    let views: BTreeSet<String> = a.runner.observed.values().map(|s| s.describe()).collect();
    views.into_iter().collect::<Vec<_>>().join(" / ")
}

fn download_evidence(d: &DownloadEvidence) -> Evidence {
    if let Some(c) = &d.contradiction {
        return Evidence::new(Mark::Contradiction, c.clone());
    }
    let unattributed = matches!(d.attribution, Attribution::Unattributed { .. });
    match &d.state {
        DownloadState::Completed { total } => Evidence::new(
            Mark::Ok,
            if unattributed {
                format!("completed {total} (no attempt id)")
            } else {
                format!("completed {total}")
            },
        ),
        DownloadState::Pending { downloaded, total }
        | DownloadState::Ongoing { downloaded, total } => {
            Evidence::new(Mark::Pending, format!("{downloaded} of {total}"))
        }
        DownloadState::Failed { message } => Evidence::new(Mark::Bad, message.clone()),
        DownloadState::Missing => Evidence::new(Mark::Unknown, "no download record"),
        DownloadState::Unknown { tag } => {
            Evidence::new(Mark::Unknown, format!("unknown record {tag}"))
        }
    }
}

fn join<'a, T: std::fmt::Display + 'a>(items: impl Iterator<Item = &'a T>) -> String {
    items
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
