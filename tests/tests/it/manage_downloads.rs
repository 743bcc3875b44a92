//! Models placed through den's management API on real workers: download attempts watched
//! in `/state`, a corrupted artifact file failing its attempt with a checksum reason, a
//! retry that is a new attempt and completes, inference through the placed instance
//! (named in `served_by`), reuse of the installation, deletion; and the same from an
//! S3-compatible bucket.
//!
//! The S3 test runs when `DEN_TEST_S3_ENDPOINT` is set (`tests/run` starts moto and
//! exports it with `DEN_TEST_S3_BUCKET` and `AWS_*`); otherwise it prints "skipped".
//! Needs `cargo build -p den-agent` first.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use den_protocol::ids::NodeId;
use den_protocol::skulk::api::CreateInstanceResponse;
use den_protocol::skulk::{AttemptId, CommandOutcome, DownloadProgress, InstanceId, State};
use den_tests::agents::{Router, client, start_router, start_worker, start_worker_env};
use den_tests::manage::{
    Mgmt, artifact, card, downloads_of, file_in, instance_ids, local_catalog, upload_s3,
};
use den_tests::s3::TestS3;

const MODEL: &str = "den/tiny-chat";

/// The attempt ids of `model` on `node`, in the order the worker reports them.
fn attempts(state: &State, node: &str) -> Vec<(AttemptId, DownloadProgress)> {
    downloads_of(state, node, MODEL)
        .into_iter()
        .filter_map(|d| d.attempt_id_owned().map(|a| (a, d.clone())))
        .collect()
}

/// Places `MODEL` on exactly `node`; returns the instance id, its runner and command.
async fn place(
    m: &Mgmt<'_>,
    node: &str,
) -> (
    InstanceId,
    den_protocol::skulk::RunnerId,
    den_protocol::skulk::CommandId,
) {
    let instance = m.preview_on(MODEL, node).await;
    let (id, runner) = instance_ids(&instance);
    let a = m.create(&instance).await;
    assert_eq!(a.status, 200, "POST /instance: {:?}", a.body);
    let ack: CreateInstanceResponse = serde_json::from_value(a.body).unwrap();
    (id, runner, ack.command_id)
}

/// One chat completion through the router's ingress (pinned to an instance when given).
async fn chat(router: &Router, pin: Option<&str>) -> Value {
    let query = pin
        .map(|p| format!("?den_instance={p}"))
        .unwrap_or_default();
    let mut req = client()
        .post(format!("{}/v1/chat/completions{query}", router.url))
        .json(&json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "Reply with the single word: ready"}],
            "max_tokens": 4
        }));
    if let Some(t) = &router.token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    resp.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manage_file_source_checksum_failure_then_retry_with_a_new_attempt() {
    let assets = tempfile::tempdir().unwrap();
    let files = artifact(3, 2_500_000);
    let local = local_catalog(
        assets.path(),
        MODEL,
        Some("den-registry:tiny-chat:v1"),
        &files,
    );
    let catalog_arg = local.dir.display().to_string();
    let router = start_router(None, &["--catalog", &catalog_arg]);
    let _w1 = start_worker(&router, "w1", false, &[]);
    let _w2 = start_worker(&router, "w2", false, &[]);
    router.wait_workers(&["w1", "w2"]).await;
    let m = Mgmt { router: &router };

    // Corrupt one artifact file at the source (same size, one byte flipped).
    let weights = file_in(&local.source, &files[1]);
    let good = std::fs::read(&weights).unwrap();
    let mut bad = good.clone();
    bad[12_345] ^= 0x5a;
    std::fs::write(&weights, &bad).unwrap();

    let (first, runner, command) = place(&m, "w1").await;
    let (state, failed_attempt) = m
        .wait_state("the first attempt to fail", |s| {
            attempts(s, "w1")
                .into_iter()
                .find_map(|(a, d)| matches!(d, DownloadProgress::Failed(_)).then(|| (s.clone(), a)))
        })
        .await;
    let failed = attempts(&state, "w1")
        .into_iter()
        .find(|(a, _)| *a == failed_attempt)
        .map(|(_, d)| d)
        .unwrap();
    let reason = failed.error_message().unwrap_or("");
    assert!(
        reason.contains("checksum mismatch for weights/model-00001.bin"),
        "{reason}"
    );
    let state = m
        .wait_state("the instance failure record", |s| {
            s.instance_failures.as_ref()?.get(&first).cloned()
        })
        .await;
    assert_eq!(state.error_code.as_deref(), Some("download_failed"));
    assert_eq!(state.attempt_id.as_ref(), Some(&failed_attempt));
    assert_eq!(state.node_id, Some(NodeId::from("w1")));
    assert_eq!(state.runner_id.as_ref(), Some(&runner));
    let now = m.state().await;
    assert!(
        now.runners[&runner]
            .failure_message()
            .is_some_and(|msg| msg.contains("checksum mismatch")),
        "{:?}",
        now.runners.get(&runner)
    );
    // The command was applied (the worker took the runner); the failure is the
    // instance's, not a rejection of the command.
    assert!(matches!(
        now.commands.as_ref().unwrap()[&command].outcome,
        CommandOutcome::Applied(_)
    ));

    // Retry: fix the source, delete, place again: a new attempt id that completes.
    std::fs::write(&weights, &good).unwrap();
    assert_eq!(m.delete(&format!("/instance/{first}")).await.status, 200);
    m.wait_state("the failed runner gone", |s| {
        (!s.runners.contains_key(&runner)).then_some(())
    })
    .await;
    let (second, runner2, _) = place(&m, "w1").await;
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let state = m
        .wait_state("the retry to complete and its runner to be ready", |s| {
            for (a, d) in attempts(s, "w1") {
                if a != failed_attempt {
                    seen.insert(d.tag().to_owned());
                }
            }
            s.runners.get(&runner2)?.is_ready().then(|| s.clone())
        })
        .await;
    let all = attempts(&state, "w1");
    assert_eq!(all.len(), 2, "{all:?}");
    let (retry, record) = all.iter().find(|(a, _)| *a != failed_attempt).unwrap();
    assert_ne!(retry, &failed_attempt);
    assert!(
        matches!(record, DownloadProgress::Completed(_)),
        "{record:?}"
    );
    assert!(seen.contains("DownloadCompleted"), "{seen:?}");
    // The failed attempt's record is kept as it was.
    assert!(
        all.iter()
            .any(|(a, d)| *a == failed_attempt && matches!(d, DownloadProgress::Failed(_)))
    );

    // Inference goes to the placed instance, which the answer names.
    let answer = chat(&router, None).await;
    assert_eq!(answer["served_by"], second.as_str(), "{answer}");
    let pinned = chat(&router, Some(second.as_str())).await;
    assert_eq!(pinned["served_by"], second.as_str(), "{pinned}");
    // Pinned to an instance that does not exist: a 404 saying so, no worker serves it.
    let pinned_to = |instance: &str, model: &str| {
        let mut req = client()
            .post(format!(
                "{}/v1/chat/completions?den_instance={instance}",
                router.url
            ))
            .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}));
        if let Some(t) = &router.token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    let r = pinned_to("no-such-instance", MODEL).await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "instance_not_found", "{body}");
    assert_eq!(body["error"]["param"], "den_instance", "{body}");
    // Pinned to this instance but for another model: a 400, never silently ignored.
    let r = pinned_to(second.as_str(), "den-synthetic").await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    let msg = body["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains(MODEL) && msg.contains("den-synthetic"),
        "{body}"
    );
    let state = m
        .wait_state("the inference record", |s| {
            let r = s.inference.as_ref()?.get(&second)?;
            (r.completed > 0).then(|| r.clone())
        })
        .await;
    assert_eq!(state.runner_id.as_ref(), Some(&runner2));

    // Reuse: delete and place again on the same worker: no new attempt.
    assert_eq!(m.delete(&format!("/instance/{second}")).await.status, 200);
    m.wait_state("the runner gone", |s| {
        (!s.runners.contains_key(&runner2)).then_some(())
    })
    .await;
    let (_, runner3, _) = place(&m, "w1").await;
    let state = m
        .wait_state("the reusing runner to be ready", |s| {
            s.runners.get(&runner3)?.is_ready().then(|| s.clone())
        })
        .await;
    assert_eq!(
        attempts(&state, "w1").len(),
        2,
        "the installation was reused"
    );
    // The other worker has no download of it at all.
    assert!(attempts(&state, "w2").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manage_s3_source_downloads_verifies_and_serves() {
    let Some(s3) = TestS3::from_env() else {
        den_tests::environment::missing("DEN_TEST_S3_ENDPOINT is not set");
        return;
    };
    let (endpoint, bucket, env) = (&s3.endpoint, &s3.bucket, s3.env.clone());
    let prefix = format!("{}/tiny", TestS3::fresh_prefix("models"));
    let files = artifact(9, 1_500_000);
    upload_s3(endpoint, bucket, &prefix, &files).await;
    let assets = tempfile::tempdir().unwrap();
    let catalog = assets.path().join("catalog");
    std::fs::create_dir_all(&catalog).unwrap();
    std::fs::write(
        catalog.join("tiny.toml"),
        card(
            MODEL,
            None,
            &format!("s3://{bucket}/{prefix}"),
            None,
            &files,
        ),
    )
    .unwrap();
    let catalog_arg = catalog.display().to_string();
    let router = start_router(Some("s3-token"), &["--catalog", &catalog_arg]);
    let _w1 = start_worker_env(&router, "w1", false, &[], &env);
    let _w2 = start_worker_env(&router, "w2", false, &[], &env);
    router.wait_workers(&["w1", "w2"]).await;
    let m = Mgmt { router: &router };

    let (id, runner, _) = place(&m, "w2").await;
    let state = m
        .wait_state(
            "the S3 download to complete and the runner to be ready",
            |s| s.runners.get(&runner)?.is_ready().then(|| s.clone()),
        )
        .await;
    let records = attempts(&state, "w2");
    assert_eq!(records.len(), 1);
    let (_, record) = &records[0];
    assert!(
        matches!(record, DownloadProgress::Completed(_)),
        "{record:?}"
    );
    assert_eq!(
        record.bytes().map(|(_, total)| total.in_bytes),
        Some(files.iter().map(|f| f.bytes.len() as u64).sum::<u64>())
    );
    let answer = chat(&router, None).await;
    assert_eq!(answer["served_by"], id.as_str(), "{answer}");
    assert_eq!(m.delete(&format!("/instance/{id}")).await.status, 200);
    let state = m
        .wait_state("the runner gone", |s| {
            (!s.runners.contains_key(&runner)).then(|| s.clone())
        })
        .await;
    assert_eq!(attempts(&state, "w2").len(), 1, "download records kept");
}
