//! The newer dialect (den's router serves it) and unknown variants/fields: kept as
//! evidence, detected by `StateDialect`, and written back unchanged.

use crate::skulk_support;

use den_protocol::ids::NodeId;
use den_protocol::skulk::api::{
    CreateInstanceResponse, MemoryEstimate, ModelRequirements, PreviewsResponse,
};
use den_protocol::skulk::{
    CommandId, CommandOutcome, DownloadPhase, Instance, InstanceId, RunnerId, RunnerPhase, State,
};
use serde_json::{Value, json};
use skulk_support::*;

/// runC/state_t2 with every newer field added, plus things no dialect defines.
fn newer_state_json() -> Value {
    let mut v: Value = serde_json::from_str(&read("runC/state_t2.json")).expect("json");
    let record = &mut v["downloads"][RUN_C_NODE][0]["DownloadOngoing"];
    record["attemptId"] = json!("attempt-1");
    record["shardMetadata"]["PipelineShardMetadata"]["modelCard"]["registryCardId"] =
        json!("card_abc");
    record["shardMetadata"]["PipelineShardMetadata"]["modelCard"]["sourceRevision"] = json!("0123");
    v["instanceFailures"] = json!({
        "dead-instance": {"instanceId": "dead-instance", "message": "runner exited\nwith code 1", "errorCode": "runner_failed"}
    });
    v["nodeResources"] =
        json!({ RUN_C_NODE: {"backends": ["mlx"], "participation": "full", "apiAvailable": true} });
    v["commands"] = json!({
        "cmd-1": {"commandId": "cmd-1", "kind": "CreateInstance", "instanceId": RUN_C_INSTANCE, "outcome": {"Applied": {}}},
        "cmd-2": {"commandId": "cmd-2", "kind": "CreateInstance", "outcome": {"Rejected": {"message": "no memory"}}},
        "cmd-3": {"commandId": "cmd-3", "kind": "DeleteInstance", "outcome": {"Deferred": {"until": 5}}}
    });
    v["runners"]["runner-from-the-future"] = json!({"RunnerHibernating": {"depth": 3}});
    v["instances"]["future-instance"] = json!({"CudaPagedInstance": {
        "instanceId": "future-instance",
        "shardAssignments": {"modelId": "m", "runnerToShard": {}, "nodeToRunner": {"gpu-1": "r-1"}},
        "contextTokenLimit": 4096,
        "pagePool": {"pages": 10}
    }});
    v["downloads"]["gpu-1"] =
        json!([{"DownloadVerifying": {"nodeId": "gpu-1", "attemptId": "attempt-9"}}]);
    v["somethingNew"] = json!({"x": 1});
    v
}

#[test]
fn newer_dialect_fields_are_read_detected_and_written_back() {
    let original = newer_state_json();
    let state: State = serde_json::from_value(original.clone()).expect("parses");
    let dialect = state.dialect();
    assert!(dialect.instance_failures && dialect.node_resources && dialect.commands);
    assert!(dialect.attempt_ids && dialect.registry_card_ids);
    assert!(!dialect.is_legacy());
    assert_eq!(dialect.unknown_keys, vec!["somethingNew".to_owned()]);

    let record = &state.downloads_of(&NodeId::from(RUN_C_NODE))[0];
    assert_eq!(record.attempt_id().map(|a| a.as_str()), Some("attempt-1"));
    let card = record.model_card().expect("card");
    assert_eq!(
        card.registry_card_id.as_ref().map(|c| c.as_str()),
        Some("card_abc")
    );
    assert_eq!(card.extra.get("sourceRevision"), Some(&json!("0123")));

    let failure =
        &state.instance_failures.as_ref().expect("failures")[&InstanceId::from("dead-instance")];
    assert_eq!(failure.error_code.as_deref(), Some("runner_failed"));
    let resources = &state.node_resources.as_ref().expect("resources")[&NodeId::from(RUN_C_NODE)];
    assert_eq!(resources.backends, vec!["mlx".to_owned()]);

    let commands = state.commands.as_ref().expect("commands");
    assert!(matches!(
        commands[&CommandId::from("cmd-1")].outcome,
        CommandOutcome::Applied(_)
    ));
    match &commands[&CommandId::from("cmd-2")].outcome {
        CommandOutcome::Rejected(r) => assert_eq!(r.message, "no memory"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        commands[&CommandId::from("cmd-3")].outcome.tag(),
        "Deferred"
    );

    // unknown variants are kept as evidence, not errors
    let future_runner = &state.runners[&RunnerId::from("runner-from-the-future")];
    assert!(future_runner.is_unknown());
    assert_eq!(future_runner.phase(), RunnerPhase::Unknown);
    let future_instance = &state.instances[&InstanceId::from("future-instance")];
    assert!(matches!(future_instance, Instance::Unknown { .. }));
    let core = future_instance
        .core()
        .expect("core of an unknown instance kind");
    assert_eq!(core.context_token_limit, Some(4096));
    assert_eq!(
        future_instance.nodes().into_iter().collect::<Vec<_>>(),
        vec![NodeId::from("gpu-1")]
    );
    let future_download = &state.downloads_of(&NodeId::from("gpu-1"))[0];
    assert_eq!(future_download.phase(), DownloadPhase::Unknown);
    assert_eq!(
        future_download
            .attempt_id_owned()
            .as_ref()
            .map(|a| a.as_str()),
        Some("attempt-9")
    );

    // and everything is written back as it came
    assert_eq!(serde_json::to_value(&state).expect("serialises"), original);
}

#[test]
fn a_legacy_state_serialises_without_any_newer_key() {
    let state = state("runC/state_t2.json");
    let v = serde_json::to_value(&state).expect("serialises");
    for key in ["instanceFailures", "nodeResources", "commands"] {
        assert!(
            v.get(key).is_none(),
            "{key} must not appear in a 1.3.0 body"
        );
    }
    let text = serde_json::to_string(&state).expect("serialises");
    assert!(!text.contains("attemptId") && !text.contains("registryCardId"));
}

#[test]
fn newer_preview_and_acknowledgement_fields_are_optional() {
    let previews: PreviewsResponse = serde_json::from_value(json!({"previews": [{
        "model_id": "m", "sharding": "Pipeline", "instance_meta": "MlxRing", "instance": null,
        "memory_delta_by_node": null, "error": "not enough memory",
        "error_code": "no_valid_placement", "card_digest": null, "contextTokenLimit": null,
        "alternative": false
    }, {
        "model_id": "m", "sharding": "Diagonal", "instance_meta": "CudaPaged", "instance": null,
        "memory_delta_by_node": null, "error": null, "card_digest": "ab", "contextTokenLimit": 8192
    }]}))
    .expect("parses");
    let refused = &previews.previews[0];
    assert_eq!(refused.error_code.as_deref(), Some("no_valid_placement"));
    assert_eq!(refused.extra.get("alternative"), Some(&json!(false)));
    let odd = &previews.previews[1];
    assert_eq!(
        (odd.sharding.as_str(), odd.instance_meta.as_str()),
        ("Diagonal", "CudaPaged")
    );
    assert_eq!(odd.effective_context_limit(), Some(8192));
    assert!(!odd.is_admitted(), "no instance, nothing to submit");

    let ack: CreateInstanceResponse = serde_json::from_value(json!({
        "message": "Command received.", "command_id": "c1", "instance_id": "i1", "model_card": null
    }))
    .expect("parses");
    assert_eq!(ack.instance_id.as_ref().map(|i| i.as_str()), Some("i1"));
}

#[test]
fn a_null_memory_estimate_means_unknown_never_zero() {
    let req: ModelRequirements = serde_json::from_value(json!({
        "model_id": "m", "card_digest": "a".repeat(64), "registry_card_id": null, "context_tokens": 4096,
        "context_limit": null, "storage_bytes": 10, "estimated_memory_bytes": null,
        "discrete_gpu_memory_fraction": 0.9, "unified_memory_fraction": 0.75,
        "compatible_backends": ["mlx"], "required_capabilities": ["text", "tools"],
        "engine_support": [{"engine": "mlx"}], "incomplete_capabilities": [], "estimate_only": true
    }))
    .expect("parses");
    assert_eq!(req.memory_estimate(), MemoryEstimate::Unknown);
    assert_eq!(
        req.required_capabilities,
        vec!["text".to_owned(), "tools".to_owned()]
    );
    let known: ModelRequirements =
        serde_json::from_value(json!({"model_id": "m", "estimated_memory_bytes": 0}))
            .expect("parses");
    assert_eq!(known.memory_estimate(), MemoryEstimate::Known(0));
}
