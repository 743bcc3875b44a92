//! den's management API against a real router and two real workers on 127.0.0.1:
//! identity, `/state` in the newer dialect, requirements (a missing estimate is unknown),
//! previews (node subsets, exclusions, refusal codes), a placement whose command outcome
//! is observable, deletion that keeps the downloads, and the token on every endpoint.
//!
//! Needs `cargo build -p den-agent` first (`tests/run` builds everything).

use serde_json::{Value, json};

use den_protocol::ids::NodeId;
use den_protocol::skulk::api::{CreateInstanceResponse, DeleteInstanceResponse, MemoryEstimate};
use den_protocol::skulk::{CommandOutcome, DownloadProgress, RunnerStatus};
use den_tests::agents::{client, start_router, start_worker};
use den_tests::manage::{Mgmt, artifact, card, downloads_of, instance_ids, local_catalog};

const TOKEN: &str = "manage-secret";
const MODEL: &str = "den/tiny-chat";
const SIZED: &str = "den/sized-chat";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manage_api_state_previews_requirements_commands_and_auth() {
    let assets = tempfile::tempdir().unwrap();
    let files = artifact(1, 300_000);
    let local = local_catalog(
        assets.path(),
        MODEL,
        Some("den-registry:tiny-chat:v1"),
        &files,
    );
    std::fs::write(
        local.dir.join("sized.toml"),
        card(SIZED, None, &local.url, Some("64MiB"), &files),
    )
    .unwrap();
    let catalog_arg = local.dir.display().to_string();
    let router = start_router(
        Some(TOKEN),
        &["--catalog", &catalog_arg, "--name", "mgmt-router"],
    );
    let _w1 = start_worker(&router, "w1", false, &[]);
    let _w2 = start_worker(&router, "w2", false, &[]);
    router.wait_workers(&["w1", "w2"]).await;
    let m = Mgmt { router: &router };

    // Without the token every management endpoint is refused.
    for (method, path) in [
        ("GET", "/node_id"),
        ("GET", "/state"),
        ("GET", "/instance/previews?model_id=den/tiny-chat"),
        ("GET", "/models/requirements?model_id=den/tiny-chat"),
        ("GET", "/models"),
        ("POST", "/instance"),
        ("DELETE", "/instance/x"),
    ] {
        let url = format!("{}{path}", router.url);
        let req = match method {
            "GET" => client().get(&url),
            "POST" => client().post(&url).json(&json!({})),
            _ => client().delete(&url),
        };
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{method} {path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], 401, "{method} {path}: {body}");
    }

    // Identity and topology.
    let id = m.get("/node_id").await;
    assert_eq!((id.status, id.body.clone()), (200, json!("mgmt-router")));
    let state = m
        .wait_state("both workers live in /state", |s| {
            let live = s.node_resources.as_ref()?;
            (live.contains_key(&NodeId::from("w1")) && live.contains_key(&NodeId::from("w2")))
                .then(|| s.clone())
        })
        .await;
    let dialect = state.dialect();
    assert!(dialect.instance_failures && dialect.node_resources && dialect.commands);
    assert!(!dialect.is_legacy());
    assert!(
        dialect.unknown_keys.is_empty(),
        "{:?}",
        dialect.unknown_keys
    );
    for n in ["mgmt-router", "w1", "w2"] {
        assert!(state.topology.contains(&NodeId::from(n)), "{n} in topology");
        assert!(
            state.last_seen.contains_key(&NodeId::from(n)),
            "{n} in lastSeen"
        );
    }
    let pools = state.node_pools.as_ref().unwrap();
    assert_eq!(pools[&NodeId::from("w1")].total_pages, 256);

    // Requirements: a card without an estimate is unknown, never zero.
    let unknown = m.requirements_of(MODEL, Some(1000)).await;
    assert_eq!(unknown.memory_estimate(), MemoryEstimate::Unknown);
    assert_eq!(unknown.context_limit, Some(2048));
    assert_eq!(unknown.required_capabilities, vec!["text-generation"]);
    let digest = unknown.card_digest.clone().unwrap();
    let sized = m.requirements_of(SIZED, Some(1000)).await;
    assert_eq!(
        sized.memory_estimate(),
        MemoryEstimate::Known((64 << 20) + 1000 * 1024)
    );
    assert_eq!(m.requirements("den/none", None).await.status, 404);
    assert_eq!(m.get("/models/requirements").await.status, 422);
    let catalog: Value = m.get("/models").await.body;
    assert_eq!(catalog["data"].as_array().map(Vec::len), Some(2));

    // Previews: subset matching, exclusion, codes.
    let all = m.previews(MODEL, &[], &[]).await;
    assert_eq!(all.previews.len(), 2);
    for p in &all.previews {
        assert!(p.is_admitted(), "{p:?}");
        assert_eq!(p.card_digest.as_deref(), Some(digest.as_str()));
        assert_eq!(p.effective_context_limit(), Some(2048));
    }
    let on_w1 = m.previews(MODEL, &["w1"], &[]).await;
    assert_eq!(on_w1.previews.len(), 1);
    assert_eq!(on_w1.previews[0].nodes(), [NodeId::from("w1")].into());
    let not_w1 = m.previews(MODEL, &[], &["w1"]).await;
    assert_eq!(not_w1.previews.len(), 1);
    assert_eq!(not_w1.previews[0].nodes(), [NodeId::from("w2")].into());
    let both = m.previews(MODEL, &["w1", "w2"], &[]).await;
    assert_eq!(
        both.previews[0].error_code.as_deref(),
        Some("no_valid_placement")
    );
    let none = m.previews("den/none", &[], &[]).await;
    assert_eq!(
        none.previews[0].error_code.as_deref(),
        Some("model_unknown")
    );

    // Placement: the command is observable, pending then applied.
    let instance = on_w1.previews[0].instance.clone().unwrap();
    let (instance_id, runner) = instance_ids(&instance);
    let created = m.create(&instance).await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    let ack: CreateInstanceResponse = serde_json::from_value(created.body).unwrap();
    assert_eq!(ack.instance_id.as_ref(), Some(&instance_id));
    let again = m.create(&instance).await;
    assert_eq!(
        again.status, 409,
        "the same instance twice: {:?}",
        again.body
    );
    let busy = m.previews(MODEL, &["w1"], &[]).await;
    assert_eq!(busy.previews[0].error_code.as_deref(), Some("runner_busy"));
    let state = m
        .wait_state("the placement applied and its runner ready", |s| {
            let applied = matches!(
                s.commands.as_ref()?.get(&ack.command_id)?.outcome,
                CommandOutcome::Applied(_)
            );
            (applied && s.runners.get(&runner)?.is_ready()).then(|| s.clone())
        })
        .await;
    let command = &state.commands.as_ref().unwrap()[&ack.command_id];
    assert_eq!(command.instance_id.as_ref(), Some(&instance_id));
    assert_eq!(command.kind, "CreateInstance");
    let placed = &state.instances[&instance_id];
    assert_eq!(placed.nodes(), [NodeId::from("w1")].into());
    let records = downloads_of(&state, "w1", MODEL);
    assert!(
        records
            .iter()
            .any(|d| matches!(d, DownloadProgress::Completed(c) if c.attempt_id.is_some())),
        "{records:?}"
    );
    assert!(state.dialect().attempt_ids && state.dialect().registry_card_ids);
    let got = m.get(&format!("/instance/{instance_id}")).await;
    assert_eq!(got.status, 200);
    assert!(got.body.get("DenInstance").is_some(), "{}", got.body);

    // Deletion: the runner goes, the downloads stay, nothing else is claimed.
    let deleted = m.delete(&format!("/instance/{instance_id}")).await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    let ack: DeleteInstanceResponse = serde_json::from_value(deleted.body).unwrap();
    assert!(
        ack.message.contains("host keeps running"),
        "{}",
        ack.message
    );
    let state = m
        .wait_state("the runner torn down and the deletion applied", |s| {
            let applied = matches!(
                s.commands.as_ref()?.get(&ack.command_id)?.outcome,
                CommandOutcome::Applied(_)
            );
            (applied && !s.runners.contains_key(&runner)).then(|| s.clone())
        })
        .await;
    assert!(!state.instances.contains_key(&instance_id));
    assert!(
        !downloads_of(&state, "w1", MODEL).is_empty(),
        "download records kept"
    );
    assert_eq!(
        m.delete(&format!("/instance/{instance_id}")).await.status,
        404
    );
    assert!(
        state
            .runners
            .values()
            .all(|r| !matches!(r, RunnerStatus::Failed(_)))
    );
}
