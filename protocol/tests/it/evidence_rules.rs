//! One test per evidence rule, on states derived from the runC and derived fixtures.

use crate::skulk_support;

use den_protocol::evidence::{
    AttemptPolicy, Attribution, Binding, DownloadState, EndpointLabel, EvidenceConfig,
    EvidenceReducer, Expectation, Input, Membership, Notice, PollFailure, PollFailureKind,
    PollObservation, PollResult, ProbeOutcome, Reason, Verdict, VerdictKind,
};
use den_protocol::ids::NodeId;
use den_protocol::skulk::{InstanceId, State};
use den_protocol::time::Millis;
use serde_json::{Value, json};
use skulk_support::*;

// ----- state builders on runC/state_t2 (one node, instance 85bb…, runner a939…) ------

fn base() -> Value {
    serde_json::from_str(&read("runC/state_t2.json")).expect("json")
}

fn with_runner(mut v: Value, status: Value) -> Value {
    v["runners"][RUN_C_RUNNER] = status;
    v
}

/// Replaces the node's download record by `{tag: {nodeId, shardMetadata, modelDirectory, ..fields}}`.
fn with_download(mut v: Value, tag: &str, fields: Value) -> Value {
    let old = v["downloads"][RUN_C_NODE][0]["DownloadOngoing"].clone();
    let mut inner = json!({
        "nodeId": old["nodeId"], "shardMetadata": old["shardMetadata"], "modelDirectory": old["modelDirectory"]
    });
    if let (Some(target), Some(extra)) = (inner.as_object_mut(), fields.as_object()) {
        for (k, val) in extra {
            target.insert(k.clone(), val.clone());
        }
    }
    v["downloads"][RUN_C_NODE] = json!([{ tag: inner }]);
    v
}

fn completed(v: Value, attempt: Option<&str>) -> Value {
    let mut fields = json!({"total": {"inBytes": 729808896}, "readOnly": false});
    if let Some(a) = attempt {
        fields["attemptId"] = json!(a);
    }
    with_download(v, "DownloadCompleted", fields)
}

fn ongoing(v: Value, attempt: Option<&str>) -> Value {
    let mut fields = json!({"downloadProgress": {
        "total": {"inBytes": 100}, "downloaded": {"inBytes": 40}, "downloadedThisSession": {"inBytes": 40},
        "completedFiles": 0, "totalFiles": 1, "speed": 1.0, "etaMs": 60, "files": {}
    }});
    if let Some(a) = attempt {
        fields["attemptId"] = json!(a);
    }
    with_download(v, "DownloadOngoing", fields)
}

fn ready_state() -> Value {
    completed(with_runner(base(), json!({"RunnerReady": {}})), None)
}

fn to_state(v: Value) -> Box<State> {
    Box::new(serde_json::from_value(v).expect("state"))
}

fn instance() -> InstanceId {
    InstanceId::from(RUN_C_INSTANCE)
}

fn node() -> NodeId {
    NodeId::from(RUN_C_NODE)
}

struct Harness {
    reducer: EvidenceReducer,
}

impl Harness {
    fn new(config: EvidenceConfig) -> Harness {
        let mut reducer = EvidenceReducer::new(config);
        let _ = reducer.handle(
            Millis(0),
            Input::Endpoint {
                endpoint: "mgmt".into(),
                expected_node: Some(node()),
            },
        );
        Harness { reducer }
    }

    fn poll_on(&mut self, at: u64, endpoint: &str, v: Value) -> Vec<Notice> {
        let observation = PollObservation {
            endpoint: EndpointLabel::from(endpoint),
            node_id: Some(node()),
            result: PollResult::State(to_state(v)),
        };
        self.reducer.handle(Millis(at), Input::Poll(observation))
    }

    fn poll(&mut self, at: u64, v: Value) -> Vec<Notice> {
        self.poll_on(at, "mgmt", v)
    }

    fn probe(&mut self, at: u64, outcome: ProbeOutcome) -> Vec<Notice> {
        self.reducer.handle(
            Millis(at),
            Input::Probe {
                instance: instance(),
                outcome,
            },
        )
    }

    fn ok_probe(&mut self, at: u64) -> Vec<Notice> {
        self.probe(at, ProbeOutcome::Succeeded { served_by: None })
    }

    fn verdict(&self) -> Verdict {
        self.reducer.verdict(&instance()).cloned().expect("tracked")
    }

    fn download(&self, at: u64) -> den_protocol::evidence::DownloadEvidence {
        let report = self
            .reducer
            .instance(&instance(), Millis(at))
            .expect("tracked");
        report.assignments[0]
            .download
            .clone()
            .expect("download evidence")
    }
}

fn has(verdict: &Verdict, pred: impl Fn(&Reason) -> bool) -> bool {
    verdict.reasons().iter().any(pred)
}

// ----- readiness needs download, runner and probe ------------------------------------

#[test]
fn ready_only_when_download_runner_and_a_later_probe_agree() {
    let mut h = Harness::new(EvidenceConfig::default());
    // a probe before agreement proves nothing
    h.poll(1_000, base());
    h.ok_probe(1_500);
    h.poll(2_000, ready_state());
    let v = h.verdict();
    assert_eq!(v.reasons(), &[Reason::ProbeMissing], "{v}");
    assert!(
        h.reducer
            .instance(&instance(), Millis(2_000))
            .expect("tracked")
            .awaiting_probe
    );
    // the probe after agreement makes it ready
    let notices = h.ok_probe(2_500);
    assert_eq!(
        h.verdict(),
        Verdict::Ready {
            since: Millis(2_500)
        }
    );
    assert!(notices.iter().any(|n| matches!(
        n,
        Notice::VerdictChanged {
            verdict: Verdict::Ready { .. },
            ..
        }
    )));
    // the legacy record was used, flagged incomplete
    assert_eq!(
        h.download(2_500).attribution,
        Attribution::Unattributed {
            dialect_has_attempts: false
        }
    );
}

#[test]
fn a_failed_probe_or_one_served_by_another_instance_is_not_readiness() {
    let mut h = Harness::new(EvidenceConfig::default());
    h.poll(1_000, ready_state());
    h.probe(
        1_100,
        ProbeOutcome::Failed {
            detail: "HTTP 500: Internal Server Error".into(),
        },
    );
    assert!(has(&h.verdict(), |r| matches!(
        r,
        Reason::ProbeFailed { .. }
    )));
    h.probe(
        1_200,
        ProbeOutcome::Succeeded {
            served_by: Some(InstanceId::from("someone-else")),
        },
    );
    assert!(has(&h.verdict(), |r| matches!(
        r,
        Reason::ProbeServedByOther { .. }
    )));
    h.probe(
        1_300,
        ProbeOutcome::Succeeded {
            served_by: Some(instance()),
        },
    );
    assert!(h.verdict().is_ready());
}

// ----- downloads ---------------------------------------------------------------------

#[test]
fn a_late_transient_sample_never_overwrites_a_terminal_outcome_of_the_same_attempt() {
    let mut h = Harness::new(EvidenceConfig::default());
    let runner_ready = || with_runner(base(), json!({"RunnerReady": {}}));
    h.poll(1_000, completed(runner_ready(), Some("attempt-1")));
    h.poll(2_000, ongoing(runner_ready(), Some("attempt-1")));
    let d = h.download(2_000);
    assert!(
        matches!(d.state, DownloadState::Completed { .. }),
        "{:?}",
        d.state
    );
    assert_eq!(d.attribution, Attribution::Attempt("attempt-1".into()));
    assert_eq!(d.late_transients_ignored, 1);
    h.ok_probe(2_100);
    assert!(h.verdict().is_ready(), "{}", h.verdict());

    // a NEW attempt is a different story: it is the current work
    h.poll(3_000, ongoing(runner_ready(), Some("attempt-2")));
    let d = h.download(3_000);
    assert!(matches!(d.state, DownloadState::Ongoing { .. }));
    assert_eq!(d.attribution, Attribution::Attempt("attempt-2".into()));
    // ready runner while its download is not complete: contradiction, refresh
    assert!(has(&h.verdict(), |r| matches!(
        r,
        Reason::RunnerAheadOfDownload { .. }
    )));
}

#[test]
fn two_terminal_outcomes_of_one_attempt_are_a_contradiction() {
    let mut h = Harness::new(EvidenceConfig::default());
    h.poll(1_000, completed(base(), Some("a")));
    h.poll(
        2_000,
        with_download(
            base(),
            "DownloadFailed",
            json!({"attemptId": "a", "errorMessage": "disk"}),
        ),
    );
    let v = h.verdict();
    assert_eq!(v.kind(), VerdictKind::Uncertain, "{v}");
    assert!(has(&v, |r| matches!(
        r,
        Reason::DownloadContradiction { .. }
    )));
}

#[test]
fn legacy_records_are_incomplete_evidence() {
    // 1.3.0 dialect: counted (no attribution possible), but flagged in the report
    let mut h = Harness::new(EvidenceConfig::default());
    h.poll(1_000, ready_state());
    h.ok_probe(1_100);
    assert!(h.verdict().is_ready());
    assert_eq!(
        h.download(1_100).attribution,
        Attribution::Unattributed {
            dialect_has_attempts: false
        }
    );

    // a server that has attempt ids but left this record without one: does not count
    let mut v = ready_state();
    let mut other = v["downloads"][RUN_C_NODE][0].clone();
    other["DownloadCompleted"]["attemptId"] = json!("attempt-x");
    other["DownloadCompleted"]["shardMetadata"]["PipelineShardMetadata"]["modelCard"]["modelId"] =
        json!("other/model");
    v["downloads"][RUN_C_NODE]
        .as_array_mut()
        .expect("list")
        .push(other);
    let mut h = Harness::new(EvidenceConfig::default());
    h.poll(1_000, v);
    h.ok_probe(1_100);
    let verdict = h.verdict();
    assert_eq!(verdict.kind(), VerdictKind::NotReady);
    assert!(
        has(&verdict, |r| matches!(
            r,
            Reason::DownloadUnattributed { .. }
        )),
        "{verdict}"
    );

    // strict policy: never without an attempt id
    let mut h = Harness::new(EvidenceConfig {
        attempt_policy: AttemptPolicy::Strict,
        ..EvidenceConfig::default()
    });
    h.poll(1_000, ready_state());
    h.ok_probe(1_100);
    assert!(has(&h.verdict(), |r| matches!(
        r,
        Reason::DownloadUnattributed { .. }
    )));
}

#[test]
fn shard_layout_differences_do_not_reject_a_matching_artifact() {
    let mut v = ready_state();
    let shard = &mut v["downloads"][RUN_C_NODE][0]["DownloadCompleted"]["shardMetadata"]["PipelineShardMetadata"];
    shard["deviceRank"] = json!(1);
    shard["worldSize"] = json!(2);
    shard["startLayer"] = json!(8);
    shard["endLayer"] = json!(16);
    shard["resolvedBackend"] = json!(null);
    let mut h = Harness::new(EvidenceConfig::default());
    h.poll(1_000, v.clone());
    h.ok_probe(1_100);
    assert!(h.verdict().is_ready(), "{}", h.verdict());

    // a different legacy card for the same model id is another artifact
    let mut other = v;
    other["downloads"][RUN_C_NODE][0]["DownloadCompleted"]["shardMetadata"]["PipelineShardMetadata"]
        ["modelCard"]["quantization"] = json!("8bit");
    let mut h = Harness::new(EvidenceConfig::default());
    h.poll(1_000, other);
    let v = h.verdict();
    assert!(
        has(&v, |r| matches!(r, Reason::DownloadMissing { .. })),
        "{v}"
    );
    assert!(
        has(&v, |r| matches!(r, Reason::ArtifactMismatch { .. })),
        "{v}"
    );
}

#[test]
fn signed_cards_match_by_registry_card_id_only() {
    let sign = |mut v: Value,
                instance_card: &str,
                download_card: &str,
                download_base_model: &str| {
        let card = &mut v["instances"][RUN_C_INSTANCE]["MlxRingInstance"]["shardAssignments"]["runnerToShard"]
            [RUN_C_RUNNER]["PipelineShardMetadata"]["modelCard"];
        card["registryCardId"] = json!(instance_card);
        let dcard = &mut v["downloads"][RUN_C_NODE][0]["DownloadCompleted"]["shardMetadata"]["PipelineShardMetadata"]
            ["modelCard"];
        dcard["registryCardId"] = json!(download_card);
        dcard["baseModel"] = json!(download_base_model);
        v["downloads"][RUN_C_NODE][0]["DownloadCompleted"]["attemptId"] = json!("a1");
        v
    };
    // same registry id, other fields differ: the same artifact
    let mut h = Harness::new(EvidenceConfig::default());
    h.poll(1_000, sign(ready_state(), "card_x", "card_x", "renamed"));
    h.ok_probe(1_100);
    assert!(h.verdict().is_ready(), "{}", h.verdict());
    // another registry id: another artifact
    let mut h = Harness::new(EvidenceConfig::default());
    h.poll(
        1_000,
        sign(ready_state(), "card_x", "card_y", "Llama 3.2 1B"),
    );
    assert!(has(&h.verdict(), |r| matches!(
        r,
        Reason::ArtifactMismatch { .. }
    )));
}

#[test]
fn a_failed_download_retained_from_before_the_instance_is_not_attributed_to_it() {
    let failed = |v: Value| {
        with_download(
            v,
            "DownloadFailed",
            json!({"errorMessage": "[Errno 28] No space left"}),
        )
    };
    let mut reducer = EvidenceReducer::new(EvidenceConfig {
        track_all_instances: false,
        ..EvidenceConfig::default()
    });
    let _ = reducer.handle(
        Millis(0),
        Input::Endpoint {
            endpoint: "mgmt".into(),
            expected_node: Some(node()),
        },
    );
    let poll = |v: Value| {
        Input::Poll(PollObservation {
            endpoint: "mgmt".into(),
            node_id: Some(node()),
            result: PollResult::State(to_state(v)),
        })
    };
    let _ = reducer.handle(Millis(1_000), poll(failed(base())));
    let _ = reducer.handle(
        Millis(2_000),
        Input::Expect(Expectation {
            instance: instance(),
            deadline: None,
            hard_expiry: None,
        }),
    );
    let _ = reducer.handle(Millis(3_000), poll(failed(base())));
    let v = reducer.verdict(&instance()).cloned().expect("tracked");
    assert!(
        has(&v, |r| matches!(
            r,
            Reason::DownloadFailed { current: false, .. }
        )),
        "{v}"
    );
    assert!(v.to_string().contains("before this instance"));
}

// ----- contradictions ----------------------------------------------------------------

#[test]
fn contradictory_views_give_uncertain_never_ready() {
    let mut h = Harness::new(EvidenceConfig::default());
    let _ = h.reducer.handle(
        Millis(0),
        Input::Endpoint {
            endpoint: "compute".into(),
            expected_node: Some(node()),
        },
    );
    h.poll_on(1_000, "mgmt", ready_state());
    h.poll_on(1_000, "compute", completed(base(), None));
    h.ok_probe(1_100);
    let v = h.verdict();
    assert_eq!(v.kind(), VerdictKind::Uncertain, "{v}");
    assert!(has(&v, |r| matches!(r, Reason::RunnerContradiction { .. })));

    // completed on one endpoint, ongoing on the other (legacy records)
    let mut h = Harness::new(EvidenceConfig::default());
    let _ = h.reducer.handle(
        Millis(0),
        Input::Endpoint {
            endpoint: "compute".into(),
            expected_node: Some(node()),
        },
    );
    h.poll_on(1_000, "mgmt", ready_state());
    h.poll_on(
        1_000,
        "compute",
        ongoing(with_runner(base(), json!({"RunnerReady": {}})), None),
    );
    h.ok_probe(1_100);
    let v = h.verdict();
    assert_eq!(v.kind(), VerdictKind::Uncertain, "{v}");
    assert!(has(&v, |r| matches!(
        r,
        Reason::DownloadContradiction { .. }
    )));
}

#[test]
fn an_identity_conflict_is_reported_and_makes_the_verdict_uncertain() {
    let mut h = Harness::new(EvidenceConfig::default());
    let observation = PollObservation {
        endpoint: "mgmt".into(),
        node_id: Some(NodeId::from("12D3KooWSomeoneElse")),
        result: PollResult::State(to_state(ready_state())),
    };
    let notices = h.reducer.handle(Millis(1_000), Input::Poll(observation));
    assert!(notices.iter().any(|n| matches!(n, Notice::IdentityConflict { observed, .. } if observed.as_str() == "12D3KooWSomeoneElse")));
    h.ok_probe(1_100);
    let v = h.verdict();
    assert!(!v.is_ready());
    assert!(
        has(&v, |r| matches!(r, Reason::IdentityConflict { .. })),
        "{v}"
    );

    // an endpoint that never answered /node_id is not evidence of which node it is
    let mut reducer = EvidenceReducer::new(EvidenceConfig::default());
    let observation = PollObservation {
        endpoint: "anon".into(),
        node_id: None,
        result: PollResult::State(to_state(ready_state())),
    };
    let _ = reducer.handle(Millis(1_000), Input::Poll(observation));
    let v = reducer.verdict(&instance()).cloned().expect("tracked");
    assert!(
        has(&v, |r| matches!(r, Reason::EndpointUnbound { .. })),
        "{v}"
    );
}

// ----- membership --------------------------------------------------------------------

#[test]
fn membership_is_two_sided_where_the_dialect_has_node_resources() {
    let derived = || -> Value {
        serde_json::from_str(&read("derived/state_two_nodes_running.json")).expect("json")
    };
    let mut from_alpha = derived();
    from_alpha["nodeResources"] = json!({ BRAVO: {"backends": ["mlx"]} });
    let mut from_bravo = derived();
    from_bravo["nodeResources"] = json!({}); // bravo has no live view of alpha
    let mut reducer = EvidenceReducer::new(EvidenceConfig::default());
    let _ = reducer.handle(
        Millis(0),
        Input::Endpoint {
            endpoint: "alpha".into(),
            expected_node: Some(NodeId::from(ALPHA)),
        },
    );
    let _ = reducer.handle(
        Millis(0),
        Input::Endpoint {
            endpoint: "bravo".into(),
            expected_node: Some(NodeId::from(BRAVO)),
        },
    );
    for (label, node, v) in [("alpha", ALPHA, from_alpha), ("bravo", BRAVO, from_bravo)] {
        let observation = PollObservation {
            endpoint: label.into(),
            node_id: Some(NodeId::from(node)),
            result: PollResult::State(to_state(v)),
        };
        let _ = reducer.handle(Millis(1_000), Input::Poll(observation));
    }
    let report = reducer.report(Millis(1_000));
    assert!(report.nodes[&NodeId::from(BRAVO)].membership.is_member());
    match &report.nodes[&NodeId::from(ALPHA)].membership {
        Membership::OneSided { seen_by, reasons } => {
            assert_eq!(
                seen_by.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
                vec!["alpha"]
            );
            assert_eq!(
                reasons,
                &[Reason::NoLiveResources {
                    node: NodeId::from(ALPHA),
                    observer: "bravo".into()
                }]
            );
        }
        other => panic!("{other:?}"),
    }
    // an instance on both nodes cannot be ready on a one-sided view
    let ring = InstanceId::from("5838fcd2-a1f3-4dea-9074-158c5ed8c17c");
    let _ = reducer.handle(
        Millis(1_100),
        Input::Probe {
            instance: ring.clone(),
            outcome: ProbeOutcome::Succeeded { served_by: None },
        },
    );
    let v = reducer.verdict(&ring).cloned().expect("tracked");
    assert!(
        has(&v, |r| matches!(r, Reason::NoLiveResources { .. })),
        "{v}"
    );
    // without the one-sided view the derived ring instance is ready: both runners ready,
    // both downloads completed (legacy records)
    let mut reducer = EvidenceReducer::new(EvidenceConfig::default());
    for (label, node) in [("alpha", ALPHA), ("bravo", BRAVO)] {
        let observation = PollObservation {
            endpoint: label.into(),
            node_id: Some(NodeId::from(node)),
            result: PollResult::State(to_state(derived())),
        };
        let _ = reducer.handle(Millis(1_000), Input::Poll(observation));
    }
    let _ = reducer.handle(
        Millis(1_100),
        Input::Probe {
            instance: ring.clone(),
            outcome: ProbeOutcome::Succeeded { served_by: None },
        },
    );
    assert!(
        reducer.verdict(&ring).is_some_and(Verdict::is_ready),
        "{:?}",
        reducer.verdict(&ring)
    );
}

#[test]
fn a_node_missing_from_a_topology_is_named() {
    let mut v = ready_state();
    v["topology"]["nodes"] = json!([]);
    let mut h = Harness::new(EvidenceConfig::default());
    h.poll(1_000, v);
    assert!(has(&h.verdict(), |r| matches!(
        r,
        Reason::NotInTopology { .. }
    )));
}

// ----- failures ----------------------------------------------------------------------

#[test]
fn instance_failures_are_correlated_by_instance_id() {
    let mut v = base();
    v["instanceFailures"] = json!({
        RUN_C_INSTANCE: {"instanceId": RUN_C_INSTANCE, "message": "runner crashed", "errorCode": "runner_failed"},
        "other": {"instanceId": "other", "message": "not ours"}
    });
    let mut h = Harness::new(EvidenceConfig::default());
    h.poll(1_000, v);
    let report = h
        .reducer
        .instance(&instance(), Millis(1_000))
        .expect("tracked");
    assert_eq!(
        report.failures,
        vec![Reason::InstanceFailed {
            instance: instance(),
            message: "runner crashed".into(),
            code: Some("runner_failed".into())
        }]
    );
    assert!(!report.verdict.to_string().contains("not ours"));
}

// ----- lost readiness and deadlines ---------------------------------------------------

fn ready_harness() -> Harness {
    let mut h = Harness::new(EvidenceConfig {
        recovery_deadline_ms: 30_000,
        ..EvidenceConfig::default()
    });
    h.poll(1_000, ready_state());
    h.ok_probe(1_100);
    assert!(h.verdict().is_ready());
    h
}

#[test]
fn lost_readiness_is_reported_at_once_with_a_bounded_recovery_deadline() {
    let mut h = ready_harness();
    let failed = with_runner(
        ready_state(),
        json!({"RunnerFailed": {"errorMessage": "OOM"}}),
    );
    let notices = h.poll(5_000, failed.clone());
    let lost = notices.iter().find_map(|n| match n {
        Notice::ReadinessLost {
            reasons,
            recover_by,
            ..
        } => Some((reasons.clone(), *recover_by)),
        _ => None,
    });
    let (reasons, recover_by) = lost.expect("the loss is reported on the same input");
    assert_eq!(recover_by, Millis(35_000));
    assert!(
        reasons
            .iter()
            .any(|r| matches!(r, Reason::RunnerFailed { message, .. } if message == "OOM"))
    );
    assert!(matches!(
        h.verdict(),
        Verdict::Lost {
            since: Millis(5_000),
            recover_by: Millis(35_000),
            ..
        }
    ));

    h.poll(20_000, failed);
    assert_eq!(h.verdict().kind(), VerdictKind::Lost);
    let notices = h.reducer.handle(Millis(35_000), Input::Tick);
    assert!(notices.iter().any(|n| matches!(
        n,
        Notice::RecoveryDeadlineExceeded {
            deadline: Millis(35_000),
            ..
        }
    )));
    let v = h.verdict();
    assert_eq!(v.kind(), VerdictKind::Failed);
    assert!(has(&v, |r| matches!(
        r,
        Reason::RecoveryDeadlineExceeded { .. }
    )));
}

#[test]
fn lost_readiness_recovers_only_with_fresh_agreement_and_a_new_probe() {
    let mut h = ready_harness();
    // polling fails: cached readiness expires at once
    let failure = PollFailure {
        kind: PollFailureKind::Transport,
        detail: "connection reset".into(),
    };
    let notices = h.reducer.handle(
        Millis(3_000),
        Input::Poll(PollObservation {
            endpoint: "mgmt".into(),
            node_id: None,
            result: PollResult::Failed(failure),
        }),
    );
    assert!(
        notices
            .iter()
            .any(|n| matches!(n, Notice::ReadinessLost { .. }))
    );
    assert!(has(&h.verdict(), |r| matches!(
        r,
        Reason::PollFailing { .. }
    )));
    // the evidence is back, but the old probe predates the new agreement
    h.poll(4_000, ready_state());
    assert_eq!(h.verdict().kind(), VerdictKind::Lost);
    assert!(has(&h.verdict(), |r| *r == Reason::ProbeMissing));
    let notices = h.ok_probe(4_100);
    assert!(
        notices
            .iter()
            .any(|n| matches!(n, Notice::ReadinessRecovered { .. }))
    );
    assert_eq!(
        h.verdict(),
        Verdict::Ready {
            since: Millis(4_100)
        }
    );
}

#[test]
fn initial_readiness_has_a_deadline_after_which_not_ready_is_failed() {
    let mut h = Harness::new(EvidenceConfig::default());
    let _ = h.reducer.handle(
        Millis(0),
        Input::Expect(Expectation {
            instance: instance(),
            deadline: Some(Millis(60_000)),
            hard_expiry: Some(Millis(50_000)),
        }),
    );
    // still loading (base()'s runner failed, which fails at once: not this rule)
    let loading = with_runner(base(), json!({"RunnerLoading": {}}));
    h.poll(10_000, loading.clone());
    assert!(
        matches!(
            h.verdict(),
            Verdict::NotReady {
                deadline: Millis(50_000),
                ..
            }
        ),
        "hard expiry bounds it"
    );
    h.poll(49_999, loading);
    assert_eq!(h.verdict().kind(), VerdictKind::NotReady);
    let notices = h.reducer.handle(Millis(50_000), Input::Tick);
    assert!(notices.iter().any(|n| matches!(
        n,
        Notice::InitialDeadlineExceeded {
            deadline: Millis(50_000),
            ..
        }
    )));
    let v = h.verdict();
    assert_eq!(v.kind(), VerdictKind::Failed);
    assert!(has(&v, |r| matches!(
        r,
        Reason::ReadinessDeadlineExceeded { .. }
    )));
    assert!(
        has(&v, |r| matches!(r, Reason::RunnerStarting { .. })),
        "the cause stays visible: {v}"
    );
    // terminal: later agreement does not revive a timed-out readiness
    h.poll(51_000, ready_state());
    h.ok_probe(51_100);
    assert_eq!(h.verdict().kind(), VerdictKind::Failed);
}

#[test]
fn every_reason_renders_on_one_line() {
    let reasons = vec![
        Reason::RunnerFailed {
            node: node(),
            runner: "r".into(),
            message: "line one\nline two".into(),
        },
        Reason::DownloadFailed {
            node: node(),
            attempt: Some("a".into()),
            message: "x\r\ny".into(),
            current: true,
        },
        Reason::InstanceFailed {
            instance: instance(),
            message: "a\nb".into(),
            code: None,
        },
        Reason::PollFailing {
            endpoint: "e".into(),
            detail: "reset\n".into(),
        },
        Reason::ProbeFailed {
            detail: "500\nboom".into(),
        },
    ];
    for r in reasons {
        let line = r.to_string();
        assert!(!line.contains('\n') && !line.contains('\r'), "{line:?}");
    }
}

/// An unpinned endpoint that answers as a new node id: a placement (the default) keeps
/// the sticky conflict, since its instance lived on the old node; an observer with
/// `follow_restarts` follows the endpoint to the new node and drops the old one's state.
#[test]
fn a_new_node_id_is_a_conflict_for_placements_and_a_restart_for_observers() {
    let poll = |reducer: &mut EvidenceReducer, at: u64, node: &str| {
        reducer.handle(
            Millis(at),
            Input::Poll(PollObservation {
                endpoint: "anon".into(),
                node_id: Some(NodeId::from(node)),
                result: PollResult::State(to_state(ready_state())),
            }),
        )
    };
    let mut strict = EvidenceReducer::new(EvidenceConfig::default());
    let notices = poll(&mut strict, 1_000, "12D3KooWFirst");
    assert!(!notices.iter().any(|n| matches!(
        n,
        Notice::IdentityConflict { .. } | Notice::NodeRestarted { .. }
    )));
    let notices = poll(&mut strict, 2_000, "12D3KooWSecond");
    assert!(
        notices
            .iter()
            .any(|n| matches!(n, Notice::IdentityConflict { .. })),
        "{notices:?}"
    );
    // sticky: answering as the first node again does not undo it
    let _ = poll(&mut strict, 3_000, "12D3KooWFirst");
    assert!(matches!(
        strict.report(Millis(3_000)).endpoints[&EndpointLabel::from("anon")].binding,
        Binding::Conflict { .. }
    ));

    let mut observer = EvidenceReducer::new(EvidenceConfig {
        follow_restarts: true,
        ..EvidenceConfig::default()
    });
    let _ = poll(&mut observer, 1_000, "12D3KooWFirst");
    let notices = poll(&mut observer, 2_000, "12D3KooWSecond");
    assert!(
        notices
            .iter()
            .any(|n| matches!(n, Notice::NodeRestarted { previous, node, .. }
            if previous.as_str() == "12D3KooWFirst" && node.as_str() == "12D3KooWSecond")),
        "{notices:?}"
    );
    assert!(
        !notices
            .iter()
            .any(|n| matches!(n, Notice::IdentityConflict { .. }))
    );
    assert_eq!(
        observer.report(Millis(2_000)).endpoints[&EndpointLabel::from("anon")].binding,
        Binding::Bound(NodeId::from("12D3KooWSecond"))
    );

    // a pinned endpoint is never followed, observer or not
    let _ = observer.handle(
        Millis(2_500),
        Input::Endpoint {
            endpoint: "anon".into(),
            expected_node: Some(NodeId::from("12D3KooWSecond")),
        },
    );
    let notices = poll(&mut observer, 3_000, "12D3KooWThird");
    assert!(
        notices
            .iter()
            .any(|n| matches!(n, Notice::IdentityConflict { .. })),
        "{notices:?}"
    );
}

/// Distributed agreement: two fresh endpoints whose `/state` names different current
/// attempts of the same download disagree. That is a contradiction (uncertain, never
/// ready), not a merge in which the endpoint polled last wins; once they name the same
/// attempt, it is evidence again.
#[test]
fn endpoints_naming_different_attempts_are_a_contradiction() {
    let ready_with = |attempt: &str| {
        completed(
            with_runner(base(), json!({"RunnerReady": {}})),
            Some(attempt),
        )
    };
    let mut h = Harness::new(EvidenceConfig::default());
    let _ = h.reducer.handle(
        Millis(0),
        Input::Endpoint {
            endpoint: "compute".into(),
            expected_node: Some(node()),
        },
    );
    h.poll_on(1_000, "mgmt", ready_with("attempt-1"));
    h.poll_on(1_000, "compute", ready_with("attempt-2"));
    h.ok_probe(1_100);
    let v = h.verdict();
    assert_eq!(v.kind(), VerdictKind::Uncertain, "{v}");
    assert!(
        has(
            &v,
            |r| matches!(r, Reason::DownloadContradiction { detail, .. }
            if detail.contains("attempt-1") && detail.contains("attempt-2"))
        ),
        "{v}"
    );
    // the order of the polls does not pick a winner
    h.poll_on(2_000, "compute", ready_with("attempt-2"));
    h.poll_on(2_000, "mgmt", ready_with("attempt-1"));
    assert_eq!(h.verdict().kind(), VerdictKind::Uncertain);

    // agreement again: the management endpoint now names attempt-2 as well
    h.poll_on(3_000, "mgmt", ready_with("attempt-2"));
    h.ok_probe(3_100);
    assert!(h.verdict().is_ready(), "{}", h.verdict());
}
