//! The management state against scripted heartbeats: commands and their outcomes,
//! refusals, previews (subset matching, exclusion, codes), freshness, failures,
//! teardown, adoption and inference attribution.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use den_protocol::ids::{ModelFingerprint, NodeId, WorkerId};
use den_protocol::observation::{
    DownloadReport, DownloadStage, Observation, RunnerPool, RunnerReport, RunnerStage,
};
use den_protocol::skulk::api::CreateInstanceRequest;
use den_protocol::skulk::{
    CommandOutcome, DownloadProgress, Instance, InstanceId, ModelId, RunnerId, RunnerStatus, State,
};
use den_protocol::time::Millis;
use den_protocol::wire::{Control, ControlToWorker};

use super::*;

const CARD: &str = r#"
model_id = "den/tiny"
registry_card_id = "den-registry:tiny:v1"
source = "file:///artifacts/tiny"
context_length = 4096
[kv]
layers = 4
kv_heads = 2
head_dim = 64
dtype = "bf16"
[[files]]
path = "weights.bin"
bytes = 1000
sha256 = "ab5c1a8f0b6d2b7a1c8d4e5f60718293a4b5c6d7e8f90112233445566778899a"
"#;

const TIMEOUT: u64 = 3_000;

fn card() -> Card {
    Card::parse(Path::new("tiny.toml"), CARD).unwrap()
}

fn manager() -> Manager {
    let catalog = ModelCatalog::from_cards(vec![card()]).unwrap();
    Manager::new(
        ManageConfig {
            node: NodeId::from("router"),
            heartbeat_timeout_ms: TIMEOUT,
            id_seed: "test".into(),
        },
        Arc::new(catalog),
    )
}

/// A worker heartbeat: 16-token pages, 1 MiB of KV budget (2048 B/token → 32 pages).
fn obs(worker: &str, runners: Vec<RunnerReport>, downloads: Vec<DownloadReport>) -> Observation {
    let mut o = Observation::new(worker, worker);
    o.backend = "host: test arena".into();
    o.page_size = 16;
    o.kv_budget_bytes = 1 << 20;
    o.runners = runners;
    o.downloads = downloads;
    o
}

fn report(instance: &InstanceId, runner: &RunnerId, stage: RunnerStage) -> RunnerReport {
    RunnerReport {
        runner_id: runner.clone(),
        instance_id: instance.clone(),
        model_id: "den/tiny".into(),
        card_digest: card().digest,
        stage,
        attempt_id: Some("a1".into()),
        pool: Some(RunnerPool {
            weights_bytes: 1000,
            pages: 32,
            page_size: 16,
            page_bytes: 16 * 2048,
            context_tokens: 512,
        }),
    }
}

fn download(stage: DownloadStage) -> DownloadReport {
    DownloadReport {
        attempt_id: "a1".into(),
        model_id: "den/tiny".into(),
        card_digest: card().digest,
        instance_id: None,
        stage,
        bytes_done: 1000,
        bytes_total: 1000,
        files_done: 1,
        files_total: 1,
        bytes_per_s: 0.0,
        directory: "/data/models/x".into(),
    }
}

fn query(model: &str, nodes: &[&str], excluded: &[&str]) -> PreviewQuery {
    PreviewQuery {
        model_id: ModelId::from(model),
        node_ids: nodes.iter().map(|n| NodeId::from(*n)).collect(),
        excluded_node_ids: excluded.iter().map(|n| NodeId::from(*n)).collect(),
    }
}

/// Two live workers at t=0.
fn with_workers() -> Manager {
    let mut m = manager();
    for w in ["w1", "w2"] {
        assert!(
            m.observe(Millis(0), 1_000, &obs(w, vec![], vec![]))
                .is_empty()
        );
    }
    m
}

/// The admitted preview's instance on `node`.
fn preview_instance(m: &mut Manager, node: &str) -> Instance {
    let p = m.previews(Millis(10), &query("den/tiny", &[node], &[]));
    assert_eq!(p.previews.len(), 1, "{p:?}");
    let preview = &p.previews[0];
    assert!(preview.is_admitted(), "{preview:?}");
    preview.instance.clone().unwrap()
}

fn ids(instance: &Instance) -> (InstanceId, RunnerId) {
    let core = instance.core().unwrap();
    let runner = core
        .shard_assignments
        .node_to_runner
        .values()
        .next()
        .unwrap()
        .clone();
    (core.instance_id, runner)
}

fn outcome(state: &State, command: &den_protocol::skulk::CommandId) -> CommandOutcome {
    state.commands.as_ref().unwrap()[command].outcome.clone()
}

#[test]
fn a_placement_is_pending_until_the_worker_lists_its_runner_then_applied() {
    let mut m = with_workers();
    let instance = preview_instance(&mut m, "w1");
    let (id, runner) = ids(&instance);
    let (ack, frames) = m
        .create(Millis(20), CreateInstanceRequest { instance })
        .unwrap();
    assert_eq!(ack.instance_id.as_ref(), Some(&id));
    assert_eq!(ack.model_card, Some(card().model_card()));
    match frames.as_slice() {
        [
            ControlToWorker {
                to,
                control: Control::PlaceRunner(p),
            },
        ] => {
            assert_eq!(to.as_str(), "w1");
            assert_eq!(p.runner_id, runner);
            assert_eq!(p.artifact, card().artifact());
            assert_eq!(p.source, "file:///artifacts/tiny");
        }
        other => panic!("{other:?}"),
    }
    let state = m.state(Millis(30), 2_000);
    assert!(matches!(
        outcome(&state, &ack.command_id),
        CommandOutcome::Pending(_)
    ));
    assert!(matches!(state.runners[&runner], RunnerStatus::Idle(_)));
    // The stamped context limit is the node's: 1 MiB / (16 × 2048 B) = 32 pages × 16.
    assert_eq!(state.instances[&id].context_token_limit(), Some(512));

    let hb = obs(
        "w1",
        vec![report(&id, &runner, RunnerStage::Ready)],
        vec![download(DownloadStage::Completed)],
    );
    assert!(m.observe(Millis(40), 3_000, &hb).is_empty());
    let state = m.state(Millis(50), 3_000);
    assert!(matches!(
        outcome(&state, &ack.command_id),
        CommandOutcome::Applied(_)
    ));
    assert!(state.runners[&runner].is_ready());
    let records = state.downloads_of(&NodeId::from("w1"));
    assert!(
        matches!(&records[0], DownloadProgress::Completed(d) if d.attempt_id.as_ref().map(|a| a.as_str()) == Some("a1"))
    );
    assert_eq!(
        records[0].model_card().and_then(|c| c.registry_card_id),
        card().registry_card_id
    );
    let dialect = state.dialect();
    assert!(dialect.instance_failures && dialect.node_resources && dialect.commands);
    assert!(dialect.attempt_ids && dialect.registry_card_ids);
    // The served body parses back as the same state.
    let json = serde_json::to_string(&state).unwrap();
    assert_eq!(serde_json::from_str::<State>(&json).unwrap(), state);
}

#[test]
fn refusals_say_why_and_change_nothing() {
    let mut m = with_workers();
    let instance = preview_instance(&mut m, "w1");
    let mut v = serde_json::to_value(&instance).unwrap();

    let mut unknown = v.clone();
    unknown["DenInstance"]["shardAssignments"]["modelId"] = serde_json::json!("den/other");
    let r = m.create(
        Millis(1),
        serde_json::from_value(serde_json::json!({"instance": unknown})).unwrap(),
    );
    assert_eq!(r.unwrap_err().code, "model_unknown");

    let mut tampered = v.clone();
    let runner = ids(&instance).1;
    tampered["DenInstance"]["shardAssignments"]["runnerToShard"][runner.as_str()]["PipelineShardMetadata"]
        ["modelCard"]["contextLength"] = serde_json::json!(1);
    let r = m.create(
        Millis(1),
        serde_json::from_value(serde_json::json!({"instance": tampered})).unwrap(),
    );
    assert_eq!(r.unwrap_err().code, "card_mismatch");

    let mut elsewhere = v.clone();
    elsewhere["DenInstance"]["shardAssignments"]["nodeToRunner"] =
        serde_json::json!({"w9": runner.as_str()});
    let r = m.create(
        Millis(1),
        serde_json::from_value(serde_json::json!({"instance": elsewhere})).unwrap(),
    );
    assert_eq!(r.unwrap_err().code, "node_unavailable");

    let mut two = v.clone();
    two["DenInstance"]["shardAssignments"]["nodeToRunner"]["w2"] = serde_json::json!("x");
    let r = m.create(
        Millis(1),
        serde_json::from_value(serde_json::json!({"instance": two})).unwrap(),
    );
    assert_eq!(r.unwrap_err().code, "invalid_instance");

    assert!(m.state(Millis(2), 0).instances.is_empty());
    assert!(m.state(Millis(2), 0).commands.unwrap().is_empty());

    // Accepted once; the same instance again is a conflict, and the node is now busy.
    m.create(
        Millis(3),
        serde_json::from_value(serde_json::json!({"instance": v.clone()})).unwrap(),
    )
    .unwrap();
    let r = m.create(
        Millis(4),
        serde_json::from_value(serde_json::json!({"instance": v.clone()})).unwrap(),
    );
    assert_eq!(r.unwrap_err().status, 409);
    v["DenInstance"]["instanceId"] = serde_json::json!("another");
    let r = m.create(
        Millis(4),
        serde_json::from_value(serde_json::json!({"instance": v})).unwrap(),
    );
    let e = r.unwrap_err();
    assert!(
        e.code == "runner_exists" || e.code == "runner_busy",
        "{e:?}"
    );
}

#[test]
fn previews_match_node_subsets_honour_exclusions_and_code_their_refusals() {
    let mut m = with_workers();
    let all = m.previews(Millis(1), &query("den/tiny", &[], &[]));
    let nodes: BTreeSet<BTreeSet<NodeId>> = all.previews.iter().map(|p| p.nodes()).collect();
    assert_eq!(nodes.len(), 2, "one single-node candidate per worker");
    for p in &all.previews {
        assert_eq!(p.card_digest.as_deref(), Some(card().digest.as_str()));
        assert_eq!(p.effective_context_limit(), Some(512));
    }
    let only_w2 = m.previews(Millis(1), &query("den/tiny", &[], &["w1"]));
    assert_eq!(only_w2.previews.len(), 1);
    assert_eq!(
        only_w2.previews[0].nodes(),
        BTreeSet::from([NodeId::from("w2")])
    );
    let both = m.previews(Millis(1), &query("den/tiny", &["w1", "w2"], &[]));
    assert_eq!(
        both.previews[0].error_code.as_deref(),
        Some("no_valid_placement")
    );
    assert!(both.previews[0].instance.is_none());
    let unknown = m.previews(Millis(1), &query("den/nope", &[], &[]));
    assert_eq!(
        unknown.previews[0].error_code.as_deref(),
        Some("model_unknown")
    );
    // Busy and short of memory.
    let instance = preview_instance(&mut m, "w1");
    m.create(Millis(2), CreateInstanceRequest { instance })
        .unwrap();
    let busy = m.previews(Millis(3), &query("den/tiny", &["w1"], &[]));
    assert_eq!(busy.previews[0].error_code.as_deref(), Some("runner_busy"));
    let mut small = obs("w2", vec![], vec![]);
    small.kv_budget_bytes = 1000;
    m.observe(Millis(4), 0, &small);
    let short = m.previews(Millis(5), &query("den/tiny", &["w2"], &[]));
    assert_eq!(
        short.previews[0].error_code.as_deref(),
        Some("insufficient_memory")
    );
}

#[test]
fn only_fresh_workers_are_live_resources() {
    let mut m = with_workers();
    m.observe(Millis(TIMEOUT), 0, &obs("w2", vec![], vec![]));
    let state = m.state(Millis(TIMEOUT + 10), 0);
    let resources = state.node_resources.unwrap();
    assert!(resources.contains_key(&NodeId::from("w2")));
    assert!(
        !resources.contains_key(&NodeId::from("w1")),
        "w1's heartbeat is stale"
    );
    assert_eq!(
        state.topology.nodes,
        vec![NodeId::from("router"), NodeId::from("w2")]
    );
    assert!(state.last_seen.contains_key(&NodeId::from("router")));
    let stale = m.previews(Millis(TIMEOUT + 10), &query("den/tiny", &["w1"], &[]));
    assert_eq!(
        stale.previews[0].error_code.as_deref(),
        Some("no_valid_placement")
    );
}

#[test]
fn a_worker_that_leaves_before_taking_the_runner_rejects_the_command() {
    let mut m = with_workers();
    let instance = preview_instance(&mut m, "w1");
    let (id, _) = ids(&instance);
    let (ack, _) = m
        .create(Millis(1), CreateInstanceRequest { instance })
        .unwrap();
    m.worker_gone(5_000, &WorkerId::from("w1"));
    let state = m.state(Millis(2), 5_000);
    assert!(
        matches!(outcome(&state, &ack.command_id), CommandOutcome::Rejected(r) if r.message.contains("went away"))
    );
    assert!(state.instances.is_empty());
    let f = &state.instance_failures.unwrap()[&id];
    assert_eq!(f.error_code.as_deref(), Some("node_unavailable"));
    assert_eq!(f.node_id, Some(NodeId::from("w1")));
}

#[test]
fn a_failed_runner_is_an_instance_failure_with_its_attempt() {
    let mut m = with_workers();
    let instance = preview_instance(&mut m, "w1");
    let (id, runner) = ids(&instance);
    m.create(Millis(1), CreateInstanceRequest { instance })
        .unwrap();
    let failed = RunnerStage::Failed {
        message: "download attempt a1 failed: checksum mismatch for weights.bin".into(),
        code: "download_failed".into(),
    };
    m.observe(
        Millis(2),
        7_000,
        &obs("w1", vec![report(&id, &runner, failed)], vec![]),
    );
    let state = m.state(Millis(3), 7_000);
    let f = &state.instance_failures.as_ref().unwrap()[&id];
    assert_eq!(f.error_code.as_deref(), Some("download_failed"));
    assert_eq!(f.attempt_id.as_ref().map(|a| a.as_str()), Some("a1"));
    assert_eq!(f.runner_id.as_ref(), Some(&runner));
    assert!(f.failed_at.as_deref().is_some_and(|t| t.ends_with('Z')));
    assert!(
        state.runners[&runner]
            .failure_message()
            .unwrap()
            .contains("checksum")
    );
    assert!(state.instances.contains_key(&id), "kept until deleted");
}

#[test]
fn deletion_tears_the_runner_down_and_is_applied_when_it_is_gone() {
    let mut m = with_workers();
    let instance = preview_instance(&mut m, "w1");
    let (id, runner) = ids(&instance);
    m.create(Millis(1), CreateInstanceRequest { instance })
        .unwrap();
    m.observe(
        Millis(2),
        0,
        &obs("w1", vec![report(&id, &runner, RunnerStage::Ready)], vec![]),
    );
    let (ack, frames) = m.delete(Millis(3), &id).unwrap();
    assert!(
        ack.message.contains("host keeps running"),
        "{}",
        ack.message
    );
    assert!(matches!(
        frames.as_slice(),
        [ControlToWorker { control: Control::RemoveRunner(r), .. }] if r.runner_id == runner
    ));
    assert_eq!(m.delete(Millis(3), &id).unwrap_err().status, 404);
    // Still listed: shutting down; the command waits.
    m.observe(
        Millis(4),
        0,
        &obs(
            "w1",
            vec![report(&id, &runner, RunnerStage::ShuttingDown)],
            vec![],
        ),
    );
    let state = m.state(Millis(5), 0);
    assert!(state.instances.is_empty());
    assert!(matches!(
        state.runners[&runner],
        RunnerStatus::ShuttingDown(_)
    ));
    assert!(matches!(
        outcome(&state, &ack.command_id),
        CommandOutcome::Pending(_)
    ));
    // A still-listed runner gets the frame again after a while.
    let again = m.observe(
        Millis(5_000),
        0,
        &obs(
            "w1",
            vec![report(&id, &runner, RunnerStage::ShuttingDown)],
            vec![download(DownloadStage::Completed)],
        ),
    );
    assert_eq!(again.len(), 1);
    m.observe(
        Millis(5_100),
        0,
        &obs("w1", vec![], vec![download(DownloadStage::Completed)]),
    );
    let state = m.state(Millis(5_200), 0);
    assert!(state.runners.is_empty());
    assert!(matches!(
        outcome(&state, &ack.command_id),
        CommandOutcome::Applied(_)
    ));
    assert_eq!(
        state.downloads_of(&NodeId::from("w1")).len(),
        1,
        "download records stay"
    );
    assert!(m.busy(&WorkerId::from("w1")).is_none());
}

#[test]
fn inference_is_attributed_to_the_instance_whose_ready_runner_served_it() {
    let mut m = with_workers();
    let instance = preview_instance(&mut m, "w1");
    let (id, runner) = ids(&instance);
    m.create(Millis(1), CreateInstanceRequest { instance })
        .unwrap();
    let model = ModelFingerprint::from("den/tiny");
    let w1 = WorkerId::from("w1");
    assert_eq!(m.served(&w1, &model, true, 0), None, "not ready yet");
    m.observe(
        Millis(2),
        0,
        &obs(
            "w1",
            vec![report(&id, &runner, RunnerStage::Running)],
            vec![],
        ),
    );
    assert_eq!(m.served(&w1, &model, true, 9_000), Some(id.clone()));
    assert_eq!(m.served(&WorkerId::from("w2"), &model, true, 0), None);
    let state = m.state(Millis(3), 0);
    let record = &state.inference.unwrap()[&id];
    assert_eq!(
        (record.completed, record.runner_id.as_ref()),
        (1, Some(&runner))
    );
    assert_eq!(
        m.served_model(&model),
        Some((ModelId::from("den/tiny"), Some(512)))
    );
}

#[test]
fn a_restarted_router_adopts_the_runners_workers_still_run() {
    let mut m = manager();
    let id = InstanceId::from("i-before");
    let runner = RunnerId::from("r-before");
    m.observe(
        Millis(0),
        0,
        &obs("w1", vec![report(&id, &runner, RunnerStage::Ready)], vec![]),
    );
    let state = m.state(Millis(1), 0);
    let instance = &state.instances[&id];
    assert_eq!(instance.tag(), INSTANCE_TAG);
    assert_eq!(instance.nodes(), BTreeSet::from([NodeId::from("w1")]));
    assert!(state.runners[&runner].is_ready());
}

#[test]
fn finished_command_records_are_retained_up_to_a_bound() {
    let mut m = with_workers();
    let mut last = None;
    for i in 0..600u64 {
        let instance = preview_instance(&mut m, "w1");
        let (id, _) = ids(&instance);
        m.create(Millis(i), CreateInstanceRequest { instance })
            .unwrap();
        let (ack, _) = m.delete(Millis(i), &id).unwrap();
        m.observe(Millis(i), 0, &obs("w1", vec![], vec![]));
        last = Some(ack.command_id);
    }
    let state = m.state(Millis(600), 0);
    let commands = state.commands.unwrap();
    assert_eq!(commands.len(), RETAINED_RECORDS);
    assert!(matches!(
        commands[&last.unwrap()].outcome,
        CommandOutcome::Applied(_)
    ));
    assert_eq!(state.last_event_applied_idx, 1199);
}

/// The guide: "do not combine multiple GPUs into one capacity figure without engine
/// support for that layout". Two GPUs of one host are two den workers; each is short of
/// one page of the card by a byte, together they would hold it twice over. No preview
/// admits the model on either, none spans both, and no context limit counts both budgets.
#[test]
fn capacity_of_two_gpus_is_never_summed() {
    let mut m = manager();
    let page = 16 * card().kv.bytes_per_token();
    for gpu in ["host-gpu0", "host-gpu1"] {
        let mut o = obs(gpu, vec![], vec![]);
        o.kv_budget_bytes = page - 1;
        m.observe(Millis(1), 0, &o);
    }
    let each = m.previews(Millis(2), &query("den/tiny", &[], &[]));
    assert_eq!(each.previews.len(), 2);
    for p in &each.previews {
        assert_eq!(
            p.error_code.as_deref(),
            Some("insufficient_memory"),
            "{p:?}"
        );
        assert!(p.instance.is_none() && p.context_token_limit.is_none());
    }
    let both = m.previews(
        Millis(3),
        &query("den/tiny", &["host-gpu0", "host-gpu1"], &[]),
    );
    assert_eq!(both.previews.len(), 1);
    assert_eq!(
        both.previews[0].error_code.as_deref(),
        Some("no_valid_placement")
    );

    // one GPU with exactly one page: admitted, and its limit is that GPU's alone
    let mut o = obs("host-gpu0", vec![], vec![]);
    o.kv_budget_bytes = page;
    m.observe(Millis(4), 0, &o);
    let one = m.previews(Millis(5), &query("den/tiny", &["host-gpu0"], &[]));
    assert_eq!(one.previews[0].context_token_limit, Some(16));
}
