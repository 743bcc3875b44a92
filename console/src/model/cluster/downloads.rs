//! The Downloads rows: every source's download records grouped by node, model and card,
//! merged where two sources saw the same one; the download evidence of an instance.

use super::*;

/// A download of 0 bytes this long is named as stalled.
const STALL_HINT_MS: u64 = 5 * 60_000;

pub(super) fn download_rows(
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

pub(super) fn group_key(node: &NodeId, model: &str, card: Option<&str>) -> String {
    format!("{node}/{model}/{}", card.unwrap_or(""))
}

pub(super) fn download_row(
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
pub(super) fn merge_download(existing: &mut DownloadRow, new: DownloadRow) {
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

pub(super) fn download_evidence(d: &DownloadEvidence) -> Evidence {
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
