//! Every outcome of the placement workflow, reached through its real inputs (Skulk 1.3.0
//! fixture bodies, edited where the scenario needs it) and asserted by name. The list of
//! names comes from an exhaustive match, so a new outcome does not compile until it has
//! a name here, and the last test fails until a scenario reaches it.

use std::collections::BTreeSet;

use den_protocol::ids::NodeId;
use den_protocol::placement::{
    Effect, FailureReason, Input, Outcome, ProbeResult, Target, UncertainReason,
};
use den_protocol::skulk::{InstanceId, Method};
use serde_json::{Value, json};

use crate::placement_workflow::{
    Driver, NO_ROUTE, config, previews_body, ready_state, request, submit,
};
use crate::skulk_support::*;

/// The outcome's name; exhaustive, so every variant has one.
fn name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Placed { .. } => "Placed",
        Outcome::Failed { reason, .. } => match reason {
            FailureReason::ManagementIdentityMismatch { .. } => "ManagementIdentityMismatch",
            FailureReason::IdentityUnavailable { .. } => "IdentityUnavailable",
            FailureReason::ComputeNotWanted { .. } => "ComputeNotWanted",
            FailureReason::RequirementsRefused { .. } => "RequirementsRefused",
            FailureReason::CardChangedSinceApproval { .. } => "CardChangedSinceApproval",
            FailureReason::IncompleteCapabilities { .. } => "IncompleteCapabilities",
            FailureReason::CapabilitiesUnproven { .. } => "CapabilitiesUnproven",
            FailureReason::PreviewsUnavailable { .. } => "PreviewsUnavailable",
            FailureReason::NoExactPreview { .. } => "NoExactPreview",
            FailureReason::StateUnavailable { .. } => "StateUnavailable",
            FailureReason::TargetNotInTopology { .. } => "TargetNotInTopology",
            FailureReason::FenceNotPersisted { .. } => "FenceNotPersisted",
            FailureReason::Refused { .. } => "Refused",
            FailureReason::NotSent { .. } => "NotSent",
            FailureReason::CommandRejected { .. } => "CommandRejected",
            FailureReason::InstanceFailed { .. } => "InstanceFailed",
            FailureReason::RunnerFailed { .. } => "RunnerFailed",
            FailureReason::DownloadFailed { .. } => "DownloadFailed",
            FailureReason::InstanceRemoved { .. } => "InstanceRemoved",
            FailureReason::ContextLimitTooSmall { .. } => "ContextLimitTooSmall",
            FailureReason::ReadinessTimedOut { .. } => "ReadinessTimedOut",
            FailureReason::ProbeFailed { .. } => "ProbeFailed",
        },
        Outcome::Uncertain { reason, .. } => match reason {
            UncertainReason::NotObservedBeforeDeadline { .. } => "NotObservedBeforeDeadline",
            UncertainReason::ContradictoryEvidence { .. } => "ContradictoryEvidence",
            UncertainReason::EvidenceUnavailable { .. } => "EvidenceUnavailable",
            UncertainReason::ResponseNamesOtherInstance { .. } => "ResponseNamesOtherInstance",
            UncertainReason::PlacementDiffers { .. } => "PlacementDiffers",
            UncertainReason::CardDiffersFromFence { .. } => "CardDiffersFromFence",
            UncertainReason::ManagementIdentityChanged { .. } => "ManagementIdentityChanged",
            UncertainReason::ComputeIdentityChanged { .. } => "ComputeIdentityChanged",
            UncertainReason::ProbeNotAttributable { .. } => "ProbeNotAttributable",
            UncertainReason::ProbeTransport { .. } => "ProbeTransport",
            UncertainReason::ProbeNotConfirmed { .. } => "ProbeNotConfirmed",
        },
    }
}

/// Every name [`name`] can return.
const ALL: &[&str] = &[
    "Placed",
    "ManagementIdentityMismatch",
    "IdentityUnavailable",
    "ComputeNotWanted",
    "RequirementsRefused",
    "CardChangedSinceApproval",
    "IncompleteCapabilities",
    "CapabilitiesUnproven",
    "PreviewsUnavailable",
    "NoExactPreview",
    "StateUnavailable",
    "TargetNotInTopology",
    "FenceNotPersisted",
    "Refused",
    "NotSent",
    "CommandRejected",
    "InstanceFailed",
    "RunnerFailed",
    "DownloadFailed",
    "InstanceRemoved",
    "ContextLimitTooSmall",
    "ReadinessTimedOut",
    "ProbeFailed",
    "NotObservedBeforeDeadline",
    "ContradictoryEvidence",
    "EvidenceUnavailable",
    "ResponseNamesOtherInstance",
    "PlacementDiffers",
    "CardDiffersFromFence",
    "ManagementIdentityChanged",
    "ComputeIdentityChanged",
    "ProbeNotAttributable",
    "ProbeTransport",
    "ProbeNotConfirmed",
];

const COMMAND: &str = "6ed67eec-54a4-423f-9d8f-616df570497e";

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).expect("json")
}

/// Identity answered; the next request is `/models/requirements`.
fn identified(d: &mut Driver) {
    d.input(Input::Start(request()));
    d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
}

/// Identity, requirements (absent) and baseline answered; previews are asked next.
fn baselined(d: &mut Driver) {
    identified(d);
    d.answer(Method::Get, "/models/requirements", 404, NO_ROUTE);
    d.answer(Method::Get, "/state", 200, &read("runC/state_idle.json"));
}

fn requirements(edit: impl FnOnce(&mut Value)) -> String {
    let mut r = json!({
        "model_id": RUN_C_MODEL, "card_digest": "a".repeat(64), "registry_card_id": null,
        "context_tokens": 4096, "context_limit": null, "storage_bytes": 729808896,
        "estimated_memory_bytes": null, "compatible_backends": ["mlx"],
        "required_capabilities": [], "engine_support": [], "incomplete_capabilities": []
    });
    edit(&mut r);
    r.to_string()
}

/// Submitted and acknowledged (runC's real acknowledgement); reconciling.
fn accepted(d: &mut Driver) {
    submit(d);
    d.answer(
        Method::Post,
        "/instance",
        200,
        &read("runC/create_instance.json"),
    );
}

/// Answers `/state` (or whatever `body` says for poll `n`) and wakes at each deadline
/// the workflow asks for, until it finishes or asks for something else (a probe).
fn poll_until_done(d: &mut Driver, body: impl Fn(usize) -> (u16, String)) {
    for n in 0..100 {
        let (status, text) = body(n);
        d.answer(Method::Get, "/state", status, &text);
        if d.wf.outcome().is_some() {
            return;
        }
        match d.last.as_slice() {
            [Effect::WakeAt(at)] => {
                let at = at.0;
                d.at(at, Input::Wake);
            }
            _ => return,
        }
    }
    panic!("the reconciliation deadline must end polling");
}

/// `ready_state()` with its created instance's core edited.
fn with_core(edit: impl FnOnce(&mut Value)) -> Value {
    let mut state = json_of(&ready_state());
    let core = state["instances"][CREATED_INSTANCE]
        .as_object_mut()
        .and_then(|tagged| tagged.values_mut().next())
        .expect("tagged instance");
    edit(core);
    state
}

fn loading(mut state: Value) -> Value {
    state["runners"][CREATED_RUNNER] = json!({"RunnerLoading": {}});
    state
}

fn scenarios() -> Vec<(&'static str, Outcome)> {
    let mut out = Vec::new();
    let mut run = |label: &'static str, f: &dyn Fn(&mut Driver)| {
        let mut d = Driver::new(config());
        f(&mut d);
        out.push((label, d.outcome()));
    };

    run("placed", &|d| {
        accepted(d);
        d.answer(Method::Get, "/state", 200, &ready_state());
        d.probe(ProbeResult::Completed { served_by: None });
    });
    run("the management API is another node", &|d| {
        d.input(Input::Start(request()));
        d.answer(Method::Get, "/node_id", 200, "\"12D3KooWSomebodyElse\"");
    });
    run("/node_id fails", &|d| {
        d.input(Input::Start(request()));
        d.answer(Method::Get, "/node_id", 500, "{\"detail\":\"boom\"}");
    });
    run("the compute endpoint is an unwanted node", &|d| {
        let mut r = request();
        r.compute = true;
        d.input(Input::Start(r));
        d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
        assert_eq!(d.target(), Target::Compute);
        d.answer(Method::Get, "/node_id", 200, &format!("\"{ALPHA}\""));
    });
    run("requirements refused", &|d| {
        identified(d);
        d.answer(
            Method::Get,
            "/models/requirements",
            400,
            "{\"detail\":\"context_tokens must be positive\"}",
        );
    });
    run("card changed since approval", &|d| {
        let mut r = request();
        r.approved_card_digest = Some("b".repeat(64));
        d.input(Input::Start(r));
        d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
        d.answer(
            Method::Get,
            "/models/requirements",
            200,
            &requirements(|_| {}),
        );
    });
    run("incomplete capabilities", &|d| {
        identified(d);
        let body = requirements(|r| r["incomplete_capabilities"] = json!(["vision"]));
        d.answer(Method::Get, "/models/requirements", 200, &body);
    });
    run("required capability unproven", &|d| {
        identified(d);
        let body = requirements(|r| r["required_capabilities"] = json!(["text"]));
        d.answer(Method::Get, "/models/requirements", 200, &body);
    });
    run("baseline unreadable", &|d| {
        identified(d);
        d.answer(Method::Get, "/models/requirements", 404, NO_ROUTE);
        d.answer(Method::Get, "/state", 503, "{\"detail\":\"starting\"}");
    });
    run("node not in the topology", &|d| {
        let mut r = request();
        r.nodes = BTreeSet::from([NodeId::from("12D3KooWTypo")]);
        d.input(Input::Start(r));
        d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
        d.answer(Method::Get, "/models/requirements", 404, NO_ROUTE);
        d.answer(Method::Get, "/state", 200, &read("runC/state_idle.json"));
    });
    run("previews fail", &|d| {
        baselined(d);
        d.answer(
            Method::Get,
            "/instance/previews",
            500,
            "{\"detail\":\"boom\"}",
        );
    });
    run("no preview at all", &|d| {
        baselined(d);
        d.answer(Method::Get, "/instance/previews", 200, "{\"previews\": []}");
    });
    run("fence not persisted", &|d| {
        baselined(d);
        d.answer(Method::Get, "/instance/previews", 200, &previews_body());
        let instance_id = d.fence().instance_id;
        d.input(Input::FencePersistFailed {
            instance_id,
            detail: "No space left on device".into(),
        });
    });
    run("POST refused", &|d| {
        submit(d);
        d.answer(Method::Post, "/instance", 400, "{\"detail\":\"bad body\"}");
    });
    run("POST never left", &|d| {
        submit(d);
        d.lose(Method::Post, "/instance", false);
    });
    run("command rejected", &|d| {
        accepted(d);
        let mut state = loading(json_of(&ready_state()));
        state["commands"] = json!({COMMAND: {
            "commandId": COMMAND, "kind": "CreateInstance",
            "outcome": {"Rejected": {"message": "node left the cluster"}}
        }});
        d.answer(Method::Get, "/state", 200, &state.to_string());
    });
    run("instance failure record", &|d| {
        accepted(d);
        let mut state = json_of(&read("runC/state_idle.json"));
        state["instanceFailures"] = json!({CREATED_INSTANCE: {
            "instanceId": CREATED_INSTANCE, "message": "backend mismatch"
        }});
        d.answer(Method::Get, "/state", 200, &state.to_string());
    });
    run("runner failed", &|d| {
        accepted(d);
        let mut state = json_of(&ready_state());
        state["runners"][CREATED_RUNNER] = json!({"RunnerFailed": {"errorMessage": "OOM"}});
        d.answer(Method::Get, "/state", 200, &state.to_string());
    });
    run("download failed", &|d| {
        accepted(d);
        let mut state = loading(json_of(&read("runC/state_after_create_instance.json")));
        let old = state["downloads"][RUN_C_NODE][0]["DownloadOngoing"].clone();
        state["downloads"][RUN_C_NODE] = json!([{"DownloadFailed": {
            "nodeId": old["nodeId"], "shardMetadata": old["shardMetadata"],
            "errorMessage": "[Errno 28] No space left on device"
        }}]);
        d.answer(Method::Get, "/state", 200, &state.to_string());
    });
    run("observed, then removed", &|d| {
        accepted(d);
        let seen = loading(json_of(&ready_state())).to_string();
        poll_until_done(d, |n| {
            let body = if n == 0 {
                seen.clone()
            } else {
                read("runC/state_idle.json")
            };
            (200, body)
        });
    });
    run("context limit below the request", &|d| {
        accepted(d);
        let state = with_core(|core| core["contextTokenLimit"] = json!(1000));
        d.answer(Method::Get, "/state", 200, &state.to_string());
    });
    run("never ready by the deadline", &|d| {
        accepted(d);
        let state = loading(json_of(&ready_state())).to_string();
        poll_until_done(d, |_| (200, state.clone()));
    });
    run("probe failed", &|d| {
        accepted(d);
        d.answer(Method::Get, "/state", 200, &ready_state());
        d.probe(ProbeResult::Error {
            detail: "model not loaded".into(),
        });
    });
    run("nothing observed before the deadline", &|d| {
        submit(d);
        d.lose(Method::Post, "/instance", true);
        poll_until_done(d, |_| (200, read("runC/state_idle.json")));
    });
    run("contradiction at the deadline", &|d| {
        accepted(d);
        // the runner says ready while the download is still ongoing
        let mut state = json_of(&read("runC/state_after_create_instance.json"));
        state["runners"][CREATED_RUNNER] = json!({"RunnerReady": {}});
        let state = state.to_string();
        poll_until_done(d, |_| (200, state.clone()));
    });
    run("blind at the deadline", &|d| {
        accepted(d);
        let seen = loading(json_of(&ready_state())).to_string();
        poll_until_done(d, |n| {
            if n == 0 {
                (200, seen.clone())
            } else {
                (503, "{\"detail\":\"unavailable\"}".to_owned())
            }
        });
    });
    run("acknowledgement names another instance", &|d| {
        submit(d);
        let mut ack = json_of(&read("runC/create_instance.json"));
        ack["instance_id"] = json!("00000000-0000-4000-8000-000000000000");
        d.answer(Method::Post, "/instance", 200, &ack.to_string());
    });
    run("instance on other nodes", &|d| {
        accepted(d);
        let state = with_core(|core| {
            core["shardAssignments"]["nodeToRunner"] = json!({ALPHA: CREATED_RUNNER});
        });
        d.answer(Method::Get, "/state", 200, &state.to_string());
    });
    run("another card at the same instance id", &|d| {
        accepted(d);
        let state = with_core(|core| {
            for shard in core["shardAssignments"]["runnerToShard"]
                .as_object_mut()
                .expect("runners")
                .values_mut()
            {
                for fields in shard.as_object_mut().expect("tagged").values_mut() {
                    fields["modelCard"]["quantization"] = json!("8bit");
                }
            }
        });
        d.answer(Method::Get, "/state", 200, &state.to_string());
    });
    run("resumed against another node", &|d| {
        let mut first = Driver::new(config());
        submit(&mut first);
        let fence = first.wf.fence().cloned().expect("fence");
        d.input(Input::Resume(Box::new(fence)));
        d.answer(Method::Get, "/node_id", 200, "\"12D3KooWSomebodyElse\"");
    });
    run("resumed against another compute node", &|d| {
        let mut first = Driver::new(config());
        compute_submit(&mut first);
        let fence = first.wf.fence().cloned().expect("fence");
        assert_eq!(
            fence.compute_node.as_ref().map(NodeId::as_str),
            Some(RUN_C_NODE)
        );
        d.input(Input::Resume(Box::new(fence)));
        d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
        assert_eq!(d.target(), Target::Compute);
        d.answer(Method::Get, "/node_id", 200, "\"12D3KooWReplacement\"");
    });
    run("probe answered by someone unknown", &|d| {
        accepted(d);
        let mut state = json_of(&ready_state());
        let runc = json_of(&read("runC/state_t2.json"));
        state["instances"][RUN_C_INSTANCE] = runc["instances"][RUN_C_INSTANCE].clone();
        d.answer(Method::Get, "/state", 200, &state.to_string());
        d.probe(ProbeResult::Completed { served_by: None });
    });
    run("probe lost", &|d| {
        accepted(d);
        d.answer(Method::Get, "/state", 200, &ready_state());
        d.probe(ProbeResult::Transport {
            detail: "connection reset".into(),
        });
    });
    run("probe served by another instance", &|d| {
        accepted(d);
        d.answer(Method::Get, "/state", 200, &ready_state());
        d.probe(ProbeResult::Completed {
            served_by: Some(InstanceId::from(RUN_C_INSTANCE)),
        });
    });
    out
}

#[test]
fn every_placement_outcome_is_reached_by_its_scenario() {
    let reached = scenarios();
    let expect = [
        ("placed", "Placed"),
        (
            "the management API is another node",
            "ManagementIdentityMismatch",
        ),
        ("/node_id fails", "IdentityUnavailable"),
        (
            "the compute endpoint is an unwanted node",
            "ComputeNotWanted",
        ),
        ("requirements refused", "RequirementsRefused"),
        ("card changed since approval", "CardChangedSinceApproval"),
        ("incomplete capabilities", "IncompleteCapabilities"),
        ("required capability unproven", "CapabilitiesUnproven"),
        ("baseline unreadable", "StateUnavailable"),
        ("node not in the topology", "TargetNotInTopology"),
        ("previews fail", "PreviewsUnavailable"),
        ("no preview at all", "NoExactPreview"),
        ("fence not persisted", "FenceNotPersisted"),
        ("POST refused", "Refused"),
        ("POST never left", "NotSent"),
        ("command rejected", "CommandRejected"),
        ("instance failure record", "InstanceFailed"),
        ("runner failed", "RunnerFailed"),
        ("download failed", "DownloadFailed"),
        ("observed, then removed", "InstanceRemoved"),
        ("context limit below the request", "ContextLimitTooSmall"),
        ("never ready by the deadline", "ReadinessTimedOut"),
        ("probe failed", "ProbeFailed"),
        (
            "nothing observed before the deadline",
            "NotObservedBeforeDeadline",
        ),
        ("contradiction at the deadline", "ContradictoryEvidence"),
        ("blind at the deadline", "EvidenceUnavailable"),
        (
            "acknowledgement names another instance",
            "ResponseNamesOtherInstance",
        ),
        ("instance on other nodes", "PlacementDiffers"),
        (
            "another card at the same instance id",
            "CardDiffersFromFence",
        ),
        ("resumed against another node", "ManagementIdentityChanged"),
        (
            "resumed against another compute node",
            "ComputeIdentityChanged",
        ),
        ("probe answered by someone unknown", "ProbeNotAttributable"),
        ("probe lost", "ProbeTransport"),
        ("probe served by another instance", "ProbeNotConfirmed"),
    ];
    assert_eq!(reached.len(), expect.len());
    for ((label, outcome), (want_label, want)) in reached.iter().zip(expect) {
        assert_eq!(*label, want_label);
        assert_eq!(name(outcome), want, "{label}: {outcome}");
        // every outcome renders on one line
        let line = outcome.to_string();
        assert!(!line.contains('\n'), "{label}: {line}");
    }
    let names: BTreeSet<&str> = reached.iter().map(|(_, o)| name(o)).collect();
    let all: BTreeSet<&str> = ALL.iter().copied().collect();
    assert_eq!(
        all.difference(&names).collect::<Vec<_>>(),
        Vec::<&&str>::new(),
        "outcomes no scenario reaches"
    );
    assert_eq!(all.len(), ALL.len(), "ALL names each outcome once");
}

/// A placement with the compute node's own API: identity of both, both baselines, the
/// fence, the POST; reconciliation then polls both `/state`s every cycle.
fn compute_submit(d: &mut Driver) {
    let mut r = request();
    r.compute = true;
    d.input(Input::Start(r));
    d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
    assert_eq!(d.target(), Target::Compute);
    d.answer(Method::Get, "/node_id", 200, &read("runC/node_id.json"));
    assert_eq!(d.target(), Target::Management);
    d.answer(Method::Get, "/models/requirements", 404, NO_ROUTE);
    d.answer(Method::Get, "/state", 200, &read("runC/state_idle.json"));
    assert_eq!(d.target(), Target::Compute);
    d.answer(Method::Get, "/state", 200, &read("runC/state_idle.json"));
    d.answer(Method::Get, "/instance/previews", 200, &previews_body());
    let instance_id = d.fence().instance_id;
    d.input(Input::FencePersisted { instance_id });
}

/// Membership is two-sided during placement: the management API shows the instance
/// ready, but the compute node's own `/state` does not list the node in its topology
/// (it left, or is partitioned from the cluster) — no probe, never placed; the same
/// answer from both sides places it.
#[test]
fn placement_with_a_compute_endpoint_needs_both_sides() {
    let mut one_sided = json_of(&ready_state());
    one_sided["topology"]["nodes"] = json!([]);
    let one_sided = one_sided.to_string();

    let mut d = Driver::new(config());
    compute_submit(&mut d);
    d.answer(
        Method::Post,
        "/instance",
        200,
        &read("runC/create_instance.json"),
    );
    let mut polls = 0;
    loop {
        assert_eq!(d.target(), Target::Management);
        d.answer(Method::Get, "/state", 200, &ready_state());
        assert_eq!(d.target(), Target::Compute, "the second side, every cycle");
        d.answer(Method::Get, "/state", 200, &one_sided);
        assert!(
            !d.log.iter().any(|e| matches!(e, Effect::Probe { .. })),
            "no probe while one side disagrees"
        );
        polls += 1;
        match d.last.as_slice() {
            [Effect::WakeAt(at)] => {
                let at = at.0;
                d.at(at, Input::Wake);
            }
            _ => break,
        }
        assert!(polls < 100);
    }
    assert!(!d.outcome().is_placed(), "{}", d.outcome());

    let mut d = Driver::new(config());
    compute_submit(&mut d);
    d.answer(
        Method::Post,
        "/instance",
        200,
        &read("runC/create_instance.json"),
    );
    d.answer(Method::Get, "/state", 200, &ready_state());
    d.answer(Method::Get, "/state", 200, &ready_state());
    d.probe(ProbeResult::Completed { served_by: None });
    assert!(d.outcome().is_placed(), "{}", d.outcome());
}
