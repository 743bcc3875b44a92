//! The reducer over the live runC series: `/state` polled every 2 s after a placement on a
//! node without internet, where the runner fails and the download never progresses.

use crate::skulk_support;

use den_protocol::evidence::{
    Attribution, Binding, DownloadState, EndpointLabel, EvidenceConfig, EvidenceReducer, Freshness,
    Input, Membership, Notice, PollFailure, PollFailureKind, PollObservation, PollResult, Reason,
    VerdictKind,
};
use den_protocol::ids::NodeId;
use den_protocol::skulk::{InstanceId, RunnerPhase};
use den_protocol::time::Millis;
use skulk_support::*;

fn endpoint() -> EndpointLabel {
    EndpointLabel::from("management")
}

/// Feeds runC/state_t1..t12 at 2 s, 4 s, … 24 s; returns the reducer and every notice.
fn run_series() -> (EvidenceReducer, Vec<(Millis, Notice)>) {
    let node: NodeId = serde_json::from_str(&read("runC/node_id.json")).expect("node id");
    let mut reducer = EvidenceReducer::new(EvidenceConfig::default());
    let mut notices = Vec::new();
    let _ = reducer.handle(
        Millis(0),
        Input::Endpoint {
            endpoint: endpoint(),
            expected_node: Some(node.clone()),
        },
    );
    for i in 1..=12u64 {
        let now = Millis(i * 2_000);
        let observation = PollObservation {
            endpoint: endpoint(),
            node_id: Some(node.clone()),
            result: PollResult::State(Box::new(state(&format!("runC/state_t{i}.json")))),
        };
        for notice in reducer.handle(now, Input::Poll(observation)) {
            notices.push((now, notice));
        }
    }
    (reducer, notices)
}

#[test]
fn runc_series_reports_the_download_the_runner_failure_and_failed() {
    let (reducer, notices) = run_series();
    let now = Millis(24_000);
    let report = reducer.report(now);

    let ep = &report.endpoints[&endpoint()];
    assert_eq!(ep.binding, Binding::Bound(NodeId::from(RUN_C_NODE)));
    assert!(matches!(ep.freshness, Freshness::Fresh { age_ms: 0 }));
    assert!(ep.dialect.as_ref().is_some_and(|d| d.is_legacy()));
    assert!(matches!(
        report.nodes[&NodeId::from(RUN_C_NODE)].membership,
        Membership::Member { .. }
    ));

    let instance = &report.instances[&InstanceId::from(RUN_C_INSTANCE)];
    assert_eq!(
        instance.model_id.as_ref().map(|m| m.as_str()),
        Some(RUN_C_MODEL)
    );
    assert_eq!(instance.first_seen, Millis(2_000));
    assert_eq!(instance.context_token_limit, Some(270_688));

    // the download: ongoing at zero bytes, a legacy record (no attempt id)
    let assignment = &instance.assignments[0];
    assert_eq!(assignment.node.as_str(), RUN_C_NODE);
    let download = assignment.download.as_ref().expect("download evidence");
    assert!(
        matches!(download.state, DownloadState::Ongoing { .. }),
        "{:?}",
        download.state
    );
    assert_eq!(
        download.attribution,
        Attribution::Unattributed {
            dialect_has_attempts: false
        }
    );
    assert_eq!(download.artifact.model_id.as_str(), RUN_C_MODEL);

    // the runner failure, with Skulk's message
    assert_eq!(assignment.runner.runner.as_str(), RUN_C_RUNNER);
    assert_eq!(assignment.runner.phase, Some(RunnerPhase::Failed));
    assert_eq!(
        instance.runner_failure().map(|(_, _, m)| m),
        Some(RUN_C_FAILURE)
    );

    // the verdict: failed at once (Skulk never restarts a runner that failed before the
    // instance was ready, so waiting for the deadline would only hide it), for exactly
    // these reasons
    assert_eq!(instance.verdict.kind(), VerdictKind::Failed);
    let reasons = instance.reasons();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| matches!(r, Reason::RunnerFailed { message, runner, .. }
        if message == RUN_C_FAILURE && runner.as_str() == RUN_C_RUNNER))
    );
    assert!(
        reasons
            .iter()
            .any(|r| matches!(r, Reason::DownloadInProgress { phase, .. } if phase == "ongoing"))
    );
    assert!(!instance.awaiting_probe);
    let line = instance.verdict.to_string();
    assert!(
        line.starts_with("failed") && line.contains(RUN_C_FAILURE) && !line.contains('\n'),
        "{line}"
    );

    // notices: the verdict changed at t1 (runner not there yet) and at t2 (failed), then
    // the same evidence repeated for ten polls without new notices
    let changes: Vec<_> = notices
        .iter()
        .filter_map(|(at, n)| match n {
            Notice::VerdictChanged { verdict, .. } => Some((*at, verdict.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert_eq!(changes[0].0, Millis(2_000));
    assert!(
        changes[0]
            .1
            .reasons()
            .iter()
            .any(|r| matches!(r, Reason::RunnerMissing { .. }))
    );
    assert!(
        changes[0]
            .1
            .reasons()
            .iter()
            .any(|r| matches!(r, Reason::DownloadInProgress { phase, .. } if phase == "pending"))
    );
    assert_eq!(changes[1].0, Millis(4_000));
}

#[test]
fn runc_evidence_expires_when_polling_fails_or_goes_stale() {
    let (mut reducer, _) = run_series();
    let failure = PollFailure {
        kind: PollFailureKind::Timeout,
        detail: "no answer within 2 s".into(),
    };
    let _ = reducer.handle(
        Millis(26_000),
        Input::Poll(PollObservation {
            endpoint: endpoint(),
            node_id: None,
            result: PollResult::Failed(failure),
        }),
    );
    let report = reducer.report(Millis(26_000));
    let instance = &report.instances[&InstanceId::from(RUN_C_INSTANCE)];
    // nothing fresh to reason from: only the failing poll remains as a reason
    assert_eq!(instance.assignments.len(), 0);
    assert!(
        instance
            .reasons()
            .iter()
            .any(|r| matches!(r, Reason::PollFailing { .. }))
    );
    assert!(matches!(
        report.endpoints[&endpoint()].freshness,
        Freshness::Failing {
            since: Millis(26_000),
            ..
        }
    ));

    let (mut reducer, _) = run_series();
    let _ = reducer.handle(Millis(24_000 + 10_001), Input::Tick);
    let verdict = reducer
        .verdict(&InstanceId::from(RUN_C_INSTANCE))
        .expect("tracked");
    assert!(
        verdict
            .reasons()
            .iter()
            .any(|r| matches!(r, Reason::EvidenceStale { age_ms: 10_001, .. }))
    );
}
