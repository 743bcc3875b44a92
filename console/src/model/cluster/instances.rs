//! The Instances rows: each instance's verdict as drawn, its tasks and one row per
//! assignment with the evidence for and against its runner.

use super::downloads::download_evidence;
use super::*;

/// Every task of every state by instance, one line each, deduplicated by task id (the
/// freshest state's view of a task wins).
pub(super) fn tasks_by_instance(
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
                crate::model::log::short(task_id.as_str()),
                common.task_status
            );
            if let den_protocol::skulk::Task::TextGeneration(g) = task {
                line.push_str(&format!(
                    ", command {}",
                    crate::model::log::short(g.command_id.as_str())
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

pub(super) fn instance_rows(
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
pub(super) fn verdict_view(verdict: &Verdict, awaiting_probe: bool) -> VerdictView {
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

pub(super) fn assignment_row(
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

pub(super) fn describe_runner(a: &AssignmentReport) -> String {
    let views: BTreeSet<String> = a.runner.observed.values().map(|s| s.describe()).collect();
    views.into_iter().collect::<Vec<_>>().join(" / ")
}
