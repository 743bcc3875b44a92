//! The placement workflow driven with Skulk 1.3.0 fixture bodies.

use crate::skulk_support;

use std::collections::BTreeSet;

use den_protocol::ids::NodeId;
use den_protocol::placement::{
    Effect, FailureReason, Fence, Input, Note, Outcome, PlacementRequest, PlacementWorkflow,
    ProbeResult, Rejection, RequestSeq, StepKind, Target, TransportFailure, UncertainReason,
    WorkflowConfig,
};
use den_protocol::skulk::{HttpIntent, InstanceId, Method, ModelId};
use den_protocol::time::Millis;
use serde_json::{Value, json};
use skulk_support::*;

/// FastAPI's answer for a route that does not exist (no /models/requirements in 1.3.0).
pub(crate) const NO_ROUTE: &str = r#"{"detail":"Not Found"}"#;

pub(crate) struct Driver {
    pub(crate) wf: PlacementWorkflow,
    pub(crate) now: u64,
    pub(crate) log: Vec<Effect>,
    pub(crate) last: Vec<Effect>,
}

impl Driver {
    pub(crate) fn new(config: WorkflowConfig) -> Driver {
        Driver {
            wf: PlacementWorkflow::new(config),
            now: 0,
            log: Vec::new(),
            last: Vec::new(),
        }
    }

    pub(crate) fn input(&mut self, input: Input) -> &[Effect] {
        self.now += 100;
        let effects = self.wf.handle(Millis(self.now), input);
        self.log.extend(effects.iter().cloned());
        self.last = effects;
        &self.last
    }

    pub(crate) fn at(&mut self, now: u64, input: Input) -> &[Effect] {
        self.now = now.saturating_sub(100);
        self.input(input)
    }

    /// The HTTP request the last input asked for.
    pub(crate) fn pending(&self) -> (RequestSeq, HttpIntent) {
        self.last
            .iter()
            .find_map(|e| match e {
                Effect::Http {
                    request, intent, ..
                } => Some((*request, intent.clone())),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no HTTP effect in {:?}", self.last))
    }

    /// Which API the pending HTTP effect is for.
    pub(crate) fn target(&self) -> Target {
        self.last
            .iter()
            .find_map(|e| match e {
                Effect::Http { target, .. } => Some(*target),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no HTTP effect in {:?}", self.last))
    }

    pub(crate) fn expect(&self, method: Method, path: &str) -> RequestSeq {
        let (seq, intent) = self.pending();
        assert_eq!(
            (intent.method, intent.path.as_str()),
            (method, path),
            "{intent}"
        );
        seq
    }

    pub(crate) fn answer(
        &mut self,
        method: Method,
        path: &str,
        status: u16,
        body: &str,
    ) -> &[Effect] {
        let request = self.expect(method, path);
        self.input(Input::HttpResponse {
            request,
            status,
            body: body.to_owned(),
        })
    }

    pub(crate) fn lose(&mut self, method: Method, path: &str, sent: bool) -> &[Effect] {
        let request = self.expect(method, path);
        let failure = TransportFailure {
            sent,
            detail: "connection reset after sending".into(),
        };
        self.input(Input::HttpFailed { request, failure })
    }

    pub(crate) fn fence(&self) -> Fence {
        self.last
            .iter()
            .find_map(|e| match e {
                Effect::PersistFence(f) => Some((**f).clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no PersistFence in {:?}", self.last))
    }

    pub(crate) fn probe(&mut self, result: ProbeResult) -> &[Effect] {
        let (request, instance_id, intent) = self
            .last
            .iter()
            .find_map(|e| match e {
                Effect::Probe {
                    request,
                    instance_id,
                    intent,
                } => Some((*request, instance_id.clone(), intent.clone())),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no Probe in {:?}", self.last));
        assert_eq!(instance_id.as_str(), CREATED_INSTANCE);
        assert_eq!(
            (intent.method, intent.path.as_str()),
            (Method::Post, "/v1/chat/completions")
        );
        assert_eq!(
            intent.body.as_ref().map(|b| b["model"].clone()),
            Some(json!(RUN_C_MODEL))
        );
        self.input(Input::ProbeAnswered { request, result })
    }

    pub(crate) fn outcome(&self) -> Outcome {
        self.wf.outcome().cloned().expect("finished")
    }

    pub(crate) fn posts(&self) -> usize {
        self.log
            .iter()
            .filter(|e| matches!(e, Effect::Http { intent, .. } if intent.method == Method::Post && intent.path == "/instance"))
            .count()
    }

    pub(crate) fn cleared(&self) -> bool {
        self.log
            .iter()
            .any(|e| matches!(e, Effect::ClearFence { .. }))
    }
}

pub(crate) fn request() -> PlacementRequest {
    PlacementRequest {
        model_id: ModelId::from(RUN_C_MODEL),
        nodes: BTreeSet::from([NodeId::from(RUN_C_NODE)]),
        context_tokens: Some(4096),
        management_node: Some(NodeId::from(RUN_C_NODE)),
        approved_card_digest: None,
        hard_expiry: None,
        compute: false,
    }
}

pub(crate) fn config() -> WorkflowConfig {
    WorkflowConfig {
        reconcile_deadline_ms: 20_000,
        poll_interval_ms: 2_000,
        ..WorkflowConfig::default()
    }
}

/// runC's previews with the first preview's instance replaced by the instance that was
/// really submitted in runC (`instance_placement_for_create`, id cff479d0…).
pub(crate) fn previews_body() -> String {
    let mut previews: Value =
        serde_json::from_str(&read("runC/instance_previews_llama1b.json")).expect("json");
    let instance: Value =
        serde_json::from_str(&read("runC/instance_placement_for_create.json")).expect("json");
    previews["previews"][0]["instance"] = instance;
    previews.to_string()
}

/// runC/state_after_create_instance with the runner ready and the download completed.
pub(crate) fn ready_state() -> String {
    let mut v: Value =
        serde_json::from_str(&read("runC/state_after_create_instance.json")).expect("json");
    v["runners"][CREATED_RUNNER] = json!({"RunnerReady": {}});
    let old = v["downloads"][RUN_C_NODE][0]["DownloadOngoing"].clone();
    v["downloads"][RUN_C_NODE] = json!([{"DownloadCompleted": {
        "nodeId": old["nodeId"], "shardMetadata": old["shardMetadata"], "modelDirectory": old["modelDirectory"],
        "total": {"inBytes": 729808896}, "readOnly": false
    }}]);
    v.to_string()
}

/// Runs identity → requirements (absent) → baseline → previews → fence → POST sent.
pub(crate) fn submit(d: &mut Driver) {
    d.input(Input::Start(request()));
    d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
    let (_, intent) = d.pending();
    assert_eq!(intent.query_values("model_id"), vec![RUN_C_MODEL]);
    assert_eq!(intent.query_values("context_tokens"), vec!["4096"]);
    d.answer(Method::Get, "/models/requirements", 404, NO_ROUTE);
    d.answer(Method::Get, "/state", 200, &read("runC/state_idle.json"));
    let (_, intent) = d.pending();
    assert_eq!(intent.query_values("node_ids"), vec![RUN_C_NODE]);
    d.answer(Method::Get, "/instance/previews", 200, &previews_body());
    // the fence comes first, and nothing is sent before it is persisted
    let fence = d.fence();
    assert_eq!(d.last.len(), 1, "{:?}", d.last);
    assert_eq!(fence.instance_id.as_str(), CREATED_INSTANCE);
    let sent_body = serde_json::to_value(&fence.request).expect("serialises");
    let runc_body: Value =
        serde_json::from_str(&read("runC/create_instance_request.json")).expect("json");
    assert_eq!(
        sent_body, runc_body,
        "the fence holds exactly the body runC posted"
    );
    assert_eq!(d.wf.step(), StepKind::PersistingFence);
    d.input(Input::FencePersisted {
        instance_id: fence.instance_id.clone(),
    });
    let (_, intent) = d.pending();
    assert_eq!(
        (intent.method, intent.path.as_str()),
        (Method::Post, "/instance")
    );
    assert_eq!(intent.body, Some(runc_body));
}

#[test]
fn placement_accepted_and_ready() {
    let mut d = Driver::new(config());
    submit(&mut d);
    d.answer(
        Method::Post,
        "/instance",
        200,
        &read("runC/create_instance.json"),
    );
    assert_eq!(
        d.wf.command_id().map(|c| c.as_str()),
        Some("6ed67eec-54a4-423f-9d8f-616df570497e")
    );
    d.answer(Method::Get, "/state", 200, &ready_state());
    d.probe(ProbeResult::from_response(
        200,
        &read("derived/chat_completions_nonstream_ok.json"),
    ));
    match d.outcome() {
        Outcome::Placed {
            instance_id,
            command_id,
        } => {
            assert_eq!(instance_id.as_str(), CREATED_INSTANCE);
            assert_eq!(
                command_id.as_ref().map(|c| c.as_str()),
                Some("6ed67eec-54a4-423f-9d8f-616df570497e")
            );
        }
        other => panic!("{other}"),
    }
    assert!(d.cleared());
    assert_eq!(d.posts(), 1);
    assert!(
        d.wf.notes()
            .iter()
            .any(|n| matches!(n, Note::RequirementsUnavailable { .. }))
    );
    // exactly one probe
    assert_eq!(
        d.log
            .iter()
            .filter(|e| matches!(e, Effect::Probe { .. }))
            .count(),
        1
    );
}

#[test]
fn placement_accepted_then_runner_failed() {
    let mut d = Driver::new(config());
    submit(&mut d);
    d.answer(
        Method::Post,
        "/instance",
        200,
        &read("runC/create_instance.json"),
    );
    d.answer(
        Method::Get,
        "/state",
        200,
        &read("runC/state_after_create_instance.json"),
    );
    match d.outcome() {
        Outcome::Failed {
            instance_id,
            reason: FailureReason::RunnerFailed {
                runner, message, ..
            },
        } => {
            assert_eq!(
                instance_id.as_ref().map(InstanceId::as_str),
                Some(CREATED_INSTANCE)
            );
            assert_eq!(runner.as_str(), CREATED_RUNNER);
            assert_eq!(message, RUN_C_FAILURE);
        }
        other => panic!("{other}"),
    }
    assert!(d.outcome().to_string().contains(RUN_C_FAILURE));
    assert!(
        !d.log.iter().any(|e| matches!(e, Effect::Probe { .. })),
        "no probe for a failed runner"
    );
}

#[test]
fn placement_response_lost_is_reconciled_without_a_second_post() {
    let mut d = Driver::new(config());
    submit(&mut d);
    d.lose(Method::Post, "/instance", true);
    assert!(
        d.wf.notes()
            .iter()
            .any(|n| matches!(n, Note::SubmissionOutcomeUnknown { .. }))
    );
    // not visible yet: wait and look again
    d.answer(Method::Get, "/state", 200, &read("runC/state_idle.json"));
    assert!(
        matches!(d.last.as_slice(), [Effect::WakeAt(_)]),
        "{:?}",
        d.last
    );
    d.input(Input::Wake);
    d.answer(
        Method::Get,
        "/state",
        200,
        &read("runC/state_after_create_instance.json"),
    );
    assert!(matches!(
        d.outcome(),
        Outcome::Failed {
            reason: FailureReason::RunnerFailed { .. },
            ..
        }
    ));
    assert_eq!(
        d.posts(),
        1,
        "a lost response is reconciled, never re-posted"
    );

    // a 500 text/plain answer is just as ambiguous: reconcile too
    let mut d = Driver::new(config());
    submit(&mut d);
    d.answer(
        Method::Post,
        "/instance",
        500,
        &read("runA/place_instance_unknown_model.json"),
    );
    d.answer(Method::Get, "/state", 200, &ready_state());
    d.probe(ProbeResult::Completed { served_by: None });
    assert!(d.outcome().is_placed());
    assert_eq!(d.posts(), 1);
}

#[test]
fn placement_nothing_observed_before_the_deadline_is_uncertain() {
    // an unrelated instance serving the same model, ready, does not prove success
    let mut unrelated: Value = serde_json::from_str(&read("runC/state_t2.json")).expect("json");
    unrelated["runners"][RUN_C_RUNNER] = json!({"RunnerReady": {}});
    let mut d = Driver::new(config());
    submit(&mut d);
    let fence_deadline = d.fence_deadline();
    d.lose(Method::Post, "/instance", true);
    let mut polls = 0;
    loop {
        let body = if polls % 2 == 0 {
            read("runC/state_idle.json")
        } else {
            unrelated.to_string()
        };
        d.answer(Method::Get, "/state", 200, &body);
        polls += 1;
        match d.last.as_slice() {
            [Effect::WakeAt(at)] => {
                let at = at.0;
                d.at(at, Input::Wake);
            }
            _ => break,
        }
        assert!(polls < 50, "the deadline must end reconciliation");
    }
    match d.outcome() {
        Outcome::Uncertain {
            instance_id,
            reason: UncertainReason::NotObservedBeforeDeadline { deadline },
        } => {
            assert_eq!(
                instance_id.as_ref().map(InstanceId::as_str),
                Some(CREATED_INSTANCE)
            );
            assert_eq!(deadline, fence_deadline);
        }
        other => panic!("{other}"),
    }
    assert!(!d.cleared(), "the fence is kept for an uncertain outcome");
    assert_eq!(d.posts(), 1);
    assert!(!d.log.iter().any(|e| matches!(e, Effect::Probe { .. })));
}

impl Driver {
    pub(crate) fn fence_deadline(&self) -> Millis {
        self.wf
            .fence()
            .map(|f| f.reconcile_deadline)
            .expect("fence")
    }
}

#[test]
fn placement_preview_whose_node_to_runner_keys_differ_is_not_selected() {
    let previews = read("derived/instance_previews_two_nodes_llama1b.json");
    let two_nodes = || PlacementRequest {
        model_id: ModelId::from(RUN_C_MODEL),
        nodes: BTreeSet::from([NodeId::from(ALPHA), NodeId::from(BRAVO)]),
        context_tokens: None,
        management_node: None,
        approved_card_digest: None,
        hard_expiry: None,
        compute: false,
    };
    // wanted {alpha, bravo}: the alpha-only previews come first and are skipped
    let mut d = Driver::new(config());
    d.input(Input::Start(two_nodes()));
    d.answer(Method::Get, "/node_id", 200, &format!("\"{ALPHA}\""));
    d.answer(Method::Get, "/models/requirements", 404, NO_ROUTE);
    let two_node_state = read("derived/state_two_nodes_running.json");
    d.answer(Method::Get, "/state", 200, &two_node_state);
    d.answer(Method::Get, "/instance/previews", 200, &previews);
    let fence = d.fence();
    assert_eq!(
        fence.instance_id.as_str(),
        "834528db-f956-4335-9820-912bc74589a6"
    );
    assert_eq!(fence.request.instance.nodes(), two_nodes().nodes);

    // wanted {bravo} alone: every preview includes alpha (subset matching), none selected
    let mut d = Driver::new(config());
    let mut only_bravo = two_nodes();
    only_bravo.nodes = BTreeSet::from([NodeId::from(BRAVO)]);
    d.input(Input::Start(only_bravo));
    d.answer(Method::Get, "/node_id", 200, &format!("\"{ALPHA}\""));
    d.answer(Method::Get, "/models/requirements", 404, NO_ROUTE);
    d.answer(Method::Get, "/state", 200, &two_node_state);
    d.answer(Method::Get, "/instance/previews", 200, &previews);
    match d.outcome() {
        Outcome::Failed {
            reason: FailureReason::NoExactPreview { rejections },
            ..
        } => {
            assert_eq!(rejections.len(), 8);
            assert!(
                rejections
                    .iter()
                    .all(|r| matches!(r.rejection, Rejection::NodeSetDiffers { .. }))
            );
        }
        other => panic!("{other}"),
    }
    assert!(!d.log.iter().any(|e| matches!(e, Effect::PersistFence(_))));
    assert_eq!(d.posts(), 0);
}

#[test]
fn placement_resumes_from_a_persisted_fence() {
    let mut d = Driver::new(config());
    submit(&mut d);
    // the runtime persisted the fence, posted, then the process died
    let persisted =
        serde_json::to_string(&d.wf.fence().cloned().expect("fence")).expect("serialises");

    let fence: Fence = serde_json::from_str(&persisted).expect("fence reads back");
    let mut resumed = Driver::new(config());
    resumed.now = 5_000;
    resumed.input(Input::Resume(Box::new(fence.clone())));
    resumed.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
    resumed.answer(Method::Get, "/state", 200, &ready_state());
    resumed.probe(ProbeResult::Completed { served_by: None });
    assert!(resumed.outcome().is_placed(), "{}", resumed.outcome());
    assert_eq!(resumed.posts(), 0, "resuming never posts");
    assert!(
        resumed
            .wf
            .notes()
            .iter()
            .any(|n| matches!(n, Note::Resumed { .. }))
    );

    // a management API that is now another node proves nothing about the submission
    let mut other = Driver::new(config());
    other.input(Input::Resume(Box::new(fence)));
    other.answer(Method::Get, "/node_id", 200, "\"12D3KooWSomebodyElse\"");
    assert!(matches!(
        other.outcome(),
        Outcome::Uncertain {
            reason: UncertainReason::ManagementIdentityChanged { .. },
            ..
        }
    ));
    assert!(!other.cleared());
    assert_eq!(other.posts(), 0);
}

#[test]
fn placement_refused_with_4xx_fails_without_reconciling() {
    let mut d = Driver::new(config());
    submit(&mut d);
    let refusal = r#"{"error":{"message":"Insufficient memory to create instance. Required: 0.7GB, Available: 0.1GB","type":"Bad Request","param":null,"code":400}}"#;
    d.answer(Method::Post, "/instance", 400, refusal);
    match d.outcome() {
        Outcome::Failed {
            reason:
                FailureReason::Refused {
                    status: 400,
                    detail,
                },
            ..
        } => {
            assert!(detail.contains("Insufficient memory"))
        }
        other => panic!("{other}"),
    }
    assert!(d.cleared());
    let states_after_post = d
        .log
        .iter()
        .skip_while(|e| !matches!(e, Effect::Http { intent, .. } if intent.path == "/instance"))
        .filter(|e| matches!(e, Effect::Http { .. }))
        .count();
    assert_eq!(
        states_after_post, 1,
        "only the POST itself, no reconciliation polls"
    );
}

#[test]
fn placement_ignores_answers_to_requests_it_did_not_ask_for() {
    let mut d = Driver::new(config());
    d.input(Input::Start(request()));
    let (seq, _) = d.pending();
    let stale = RequestSeq(seq.0 + 7);
    assert!(
        d.input(Input::HttpResponse {
            request: stale,
            status: 200,
            body: "\"x\"".into()
        })
        .is_empty()
    );
    assert_eq!(d.wf.step(), StepKind::CheckingIdentity);
    let effects = d.input(Input::HttpResponse {
        request: seq,
        status: 200,
        body: read("runC/node_id.json"),
    });
    assert!(
        matches!(effects, [Effect::Http { intent, .. }] if intent.path == "/models/requirements")
    );
    assert_eq!(d.wf.step(), StepKind::ReadingRequirements);
    // the same answer twice is not taken twice
    assert!(
        d.input(Input::HttpResponse {
            request: seq,
            status: 200,
            body: read("runC/node_id.json")
        })
        .is_empty()
    );
}

#[test]
fn placement_checks_the_approved_card_digest_and_the_context_limit() {
    let requirements = json!({
        "model_id": RUN_C_MODEL, "card_digest": "a".repeat(64), "registry_card_id": null,
        "context_tokens": 4096, "context_limit": null, "storage_bytes": 729808896,
        "estimated_memory_bytes": null, "compatible_backends": ["mlx"], "required_capabilities": ["text"],
        "engine_support": [{"capability": "text", "engine": "mlx", "build": "0.29.1",
                            "hardware": "apple-m4", "status": "supported"}],
        "incomplete_capabilities": []
    });
    let mut previews: Value = serde_json::from_str(&previews_body()).expect("json");
    for p in previews["previews"].as_array_mut().expect("list") {
        p["card_digest"] = json!("b".repeat(64));
    }
    let mut d = Driver::new(config());
    d.input(Input::Start(request()));
    d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
    d.answer(
        Method::Get,
        "/models/requirements",
        200,
        &requirements.to_string(),
    );
    d.answer(Method::Get, "/state", 200, &read("runC/state_idle.json"));
    d.answer(
        Method::Get,
        "/instance/previews",
        200,
        &previews.to_string(),
    );
    match d.outcome() {
        Outcome::Failed {
            reason: FailureReason::NoExactPreview { rejections },
            ..
        } => {
            assert!(
                rejections
                    .iter()
                    .all(|r| matches!(r.rejection, Rejection::CardDigestDiffers { .. }))
            );
        }
        other => panic!("{other}"),
    }

    // a context request above the stamped limit (270688) is not selectable
    let mut d = Driver::new(config());
    let mut big = request();
    big.context_tokens = Some(300_000);
    d.input(Input::Start(big));
    d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
    d.answer(Method::Get, "/models/requirements", 404, NO_ROUTE);
    d.answer(Method::Get, "/state", 200, &read("runC/state_idle.json"));
    d.answer(Method::Get, "/instance/previews", 200, &previews_body());
    match d.outcome() {
        Outcome::Failed {
            reason: FailureReason::NoExactPreview { rejections },
            ..
        } => {
            assert!(rejections.iter().all(|r| r.rejection
                == Rejection::ContextTooSmall {
                    limit: 270_688,
                    requested: 300_000
                }));
        }
        other => panic!("{other}"),
    }
}

#[test]
fn placement_correlates_instance_failures_after_acceptance() {
    let mut state: Value = serde_json::from_str(&read("runC/state_idle.json")).expect("json");
    state["instanceFailures"] = json!({
        CREATED_INSTANCE: {"instanceId": CREATED_INSTANCE, "message": "placement failed asynchronously: backend mismatch"}
    });
    let mut d = Driver::new(config());
    submit(&mut d);
    d.answer(
        Method::Post,
        "/instance",
        200,
        &read("runC/create_instance.json"),
    );
    d.answer(Method::Get, "/state", 200, &state.to_string());
    match d.outcome() {
        Outcome::Failed {
            reason: FailureReason::InstanceFailed { message },
            ..
        } => {
            assert!(message.contains("backend mismatch"))
        }
        other => panic!("{other}"),
    }
}

#[test]
fn placement_probe_answered_by_an_unknown_instance_is_uncertain() {
    // another instance of the same model exists: a probe by model id may reach it
    let mut state: Value = serde_json::from_str(&ready_state()).expect("json");
    let runc: Value = serde_json::from_str(&read("runC/state_t2.json")).expect("json");
    state["instances"][RUN_C_INSTANCE] = runc["instances"][RUN_C_INSTANCE].clone();
    let mut d = Driver::new(config());
    submit(&mut d);
    d.answer(
        Method::Post,
        "/instance",
        200,
        &read("runC/create_instance.json"),
    );
    d.answer(Method::Get, "/state", 200, &state.to_string());
    d.probe(ProbeResult::Completed { served_by: None });
    match d.outcome() {
        Outcome::Uncertain {
            reason: UncertainReason::ProbeNotAttributable { others },
            ..
        } => {
            assert_eq!(others, vec![InstanceId::from(RUN_C_INSTANCE)]);
        }
        other => panic!("{other}"),
    }
    assert!(!d.cleared());
}

#[test]
fn placement_identity_mismatch_fails_before_anything_is_sent() {
    let mut d = Driver::new(config());
    d.input(Input::Start(request()));
    d.answer(Method::Get, "/node_id", 200, "\"12D3KooWSomebodyElse\"");
    assert!(matches!(
        d.outcome(),
        Outcome::Failed {
            reason: FailureReason::ManagementIdentityMismatch { .. },
            ..
        }
    ));
    assert_eq!(
        d.log
            .iter()
            .filter(|e| matches!(e, Effect::Http { .. }))
            .count(),
        1
    );
}

/// A `--node` the topology does not list fails before any preview is asked for, and
/// the failure names the nodes the topology does list.
#[test]
fn placement_on_a_node_missing_from_the_topology_fails_before_previews() {
    let mut d = Driver::new(config());
    let mut typo = request();
    typo.nodes = BTreeSet::from([NodeId::from("12D3KooWTypo")]);
    d.input(Input::Start(typo));
    d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
    d.answer(Method::Get, "/models/requirements", 404, NO_ROUTE);
    d.answer(Method::Get, "/state", 200, &read("runC/state_idle.json"));
    match d.outcome() {
        Outcome::Failed {
            reason: reason @ FailureReason::TargetNotInTopology { .. },
            ..
        } => {
            let line = reason.to_string();
            assert!(
                line.contains("12D3KooWTypo") && line.contains(RUN_C_NODE),
                "{line}"
            );
        }
        other => panic!("{other}"),
    }
    assert!(
        !d.log.iter().any(
            |e| matches!(e, Effect::Http { intent, .. } if intent.path == "/instance/previews")
        )
    );
    assert_eq!(d.posts(), 0);
}

/// runA: a Linux node without an MLX backend. Skulk refuses all four previews with the
/// same 230-character message; the failure names it once, with the previews it covers.
#[test]
fn placement_refused_by_every_preview_says_so_once() {
    let mut d = Driver::new(config());
    let mut linux = request();
    let node: String = serde_json::from_str(&read("runA/node_id.json")).expect("json");
    linux.nodes = BTreeSet::from([NodeId::from(node.as_str())]);
    linux.management_node = Some(NodeId::from(node.as_str()));
    linux.model_id = ModelId::from("mlx-community/Llama-3.2-1B-Instruct-4bit");
    d.input(Input::Start(linux));
    d.answer(Method::Get, "/node_id", 200, &read("runA/node_id.json"));
    d.answer(Method::Get, "/models/requirements", 404, NO_ROUTE);
    d.answer(Method::Get, "/state", 200, &read("runA/state_idle.json"));
    d.answer(
        Method::Get,
        "/instance/previews",
        200,
        &read("runA/instance_previews_llama1b.json"),
    );
    let line = match d.outcome() {
        Outcome::Failed {
            reason: reason @ FailureReason::NoExactPreview { .. },
            ..
        } => reason.to_string(),
        other => panic!("{other}"),
    };
    assert_eq!(
        line.matches("ineligible for this model").count(),
        1,
        "{line}"
    );
    assert!(line.contains("4 previews (#0"), "{line}");
    assert!(line.len() < 600, "{} bytes: {line}", line.len());
    assert_eq!(d.posts(), 0);
}

/// `required_capabilities` are matched exactly against the engine claims: a required
/// capability with only an incomplete claim (or none) refuses the placement before any
/// preview, fence or POST; the required set is the requirements', never the claims'.
#[test]
fn placement_refuses_required_capabilities_no_claim_proves() {
    let requirements = |claims: Value| {
        json!({
            "model_id": RUN_C_MODEL, "card_digest": null, "registry_card_id": null,
            "context_tokens": 4096, "context_limit": null, "storage_bytes": 729808896,
            "estimated_memory_bytes": null, "compatible_backends": ["mlx"],
            "required_capabilities": ["text", "tool-calls"],
            "engine_support": claims, "incomplete_capabilities": []
        })
        .to_string()
    };
    let claim = |capability: &str, status: &str| {
        json!({"capability": capability, "engine": "mlx", "build": "0.29.1",
               "hardware": "apple-m4", "status": status})
    };
    let mut d = Driver::new(config());
    d.input(Input::Start(request()));
    d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
    let body = requirements(json!([
        claim("text", "supported"),
        claim("tool-calls", "incomplete")
    ]));
    d.answer(Method::Get, "/models/requirements", 200, &body);
    match d.outcome() {
        Outcome::Failed {
            reason: FailureReason::CapabilitiesUnproven { capabilities },
            ..
        } => assert_eq!(capabilities, ["tool-calls"]),
        other => panic!("{other}"),
    }
    assert!(!d.log.iter().any(|e| matches!(e, Effect::PersistFence(_))));
    assert_eq!(d.posts(), 0);

    // both proven: the workflow goes on to the baseline
    let mut d = Driver::new(config());
    d.input(Input::Start(request()));
    d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
    let body = requirements(json!([
        claim("text", "supported"),
        claim("tool-calls", "supported")
    ]));
    d.answer(Method::Get, "/models/requirements", 200, &body);
    let (_, intent) = d.pending();
    assert_eq!(intent.path, "/state");
}

/// The accepted instance is rechecked against the shard cards the fence stored: the
/// same instance id carrying another card (here another quantization of the model) is
/// not what was approved, so the placement is uncertain, never ready, and no probe is
/// sent to it.
#[test]
fn placement_rechecks_the_accepted_instance_against_the_stored_card() {
    let mut d = Driver::new(config());
    submit(&mut d);
    d.answer(
        Method::Post,
        "/instance",
        200,
        &read("runC/create_instance.json"),
    );
    let mut state: Value = serde_json::from_str(&ready_state()).expect("json");
    let mut swapped = 0;
    for (_, instance) in state["instances"].as_object_mut().expect("instances") {
        for (_, core) in instance.as_object_mut().expect("tagged") {
            for (_, shard) in core["shardAssignments"]["runnerToShard"]
                .as_object_mut()
                .expect("runners")
            {
                for (_, fields) in shard.as_object_mut().expect("tagged shard") {
                    fields["modelCard"]["quantization"] = json!("8bit");
                    swapped += 1;
                }
            }
        }
    }
    assert!(swapped > 0);
    d.answer(Method::Get, "/state", 200, &state.to_string());
    match d.outcome() {
        Outcome::Uncertain {
            reason: UncertainReason::CardDiffersFromFence { node, .. },
            ..
        } => assert_eq!(node.as_str(), RUN_C_NODE),
        other => panic!("{other}"),
    }
    assert!(!d.log.iter().any(|e| matches!(e, Effect::Probe { .. })));
    assert_eq!(d.posts(), 1);
}
