//! The object tier against a real S3-compatible server on loopback: a prefix one worker
//! checkpointed into the bucket is restored, byte-exact, by another worker.
//!
//! Runs when `DEN_TEST_S3_ENDPOINT` is set (`tests/run` starts moto and exports it with
//! `DEN_TEST_S3_BUCKET` and `AWS_*` credentials); otherwise prints "skipped". For a local
//! run: `.venv/bin/python -c 'from moto.server import main; main()' -H 127.0.0.1 -p 9000 &`,
//! `curl -X PUT http://127.0.0.1:9000/den-test`, then
//! `DEN_TEST_S3_ENDPOINT=http://127.0.0.1:9000 cargo test -p den-tests --test agents_s3`.

use std::time::Duration;

use den_tests::agents::{body, metric, prompt, start_router, start_worker_env, wait_for};
use den_tests::s3::TestS3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_object_tier_on_s3_restores_across_workers() {
    let Some(s3) = TestS3::from_env() else {
        den_tests::environment::missing("DEN_TEST_S3_ENDPOINT is not set");
        return;
    };
    let (bucket, env) = (&s3.bucket, s3.env.clone());
    // A fresh prefix per run: runs never see each other's chunks.
    let url = format!("s3://{bucket}/{}", TestS3::fresh_prefix("agents"));
    let args = [
        "--object-store",
        url.as_str(),
        "--prefill-ms-per-token",
        "4",
        "--first-token-ms",
        "2",
    ];
    let router = start_router(None, &[]);
    let a = start_worker_env(&router, "w-a", false, &args, &env);
    let b = start_worker_env(&router, "w-b", false, &args, &env);
    router.wait_workers(&["w-a", "w-b"]).await;

    let tokens = prompt(11, 100);
    let first = router.generate(body("s1", &tokens, 4)).await;
    assert_eq!(first.kind(), "completed", "{:?}", first.terminal);
    let (writer, reader) = if first.worker() == "w-a" {
        (&a, &b)
    } else {
        (&b, &a)
    };
    writer.wait_idle().await;
    let wm = writer.metrics_text().await;
    assert!(
        metric(
            &wm,
            "den_tier_io_bytes_total",
            &[("tier", "object"), ("direction", "write")]
        ) > 0.0,
        "the checkpoint reached the bucket"
    );

    // Take the writer out of rotation: the only way to the prefix is the bucket.
    let resp = router
        .post(&format!("/v1/workers/{}/drain", writer.name))
        .await;
    assert!(resp.status().is_success());
    wait_for(
        "the drain to be advertised",
        Duration::from_secs(10),
        || async {
            let obs = router.observation(&writer.name).await?;
            (obs["draining"] == true).then_some(())
        },
    )
    .await;

    let second = router.generate(body("s2", &tokens, 4)).await;
    assert_eq!(second.kind(), "completed", "{:?}", second.terminal);
    assert_eq!(second.worker(), reader.name);
    assert_eq!(second.tier(), "object");
    assert_eq!(second.cached_tokens(), 99);
    assert_eq!(second.tokens(), first.tokens());
    assert!(second.ttft.unwrap() < first.ttft.unwrap());
    let rm = reader.metrics_text().await;
    assert_eq!(
        metric(&rm, "den_restored_tokens_total", &[("tier", "object")]),
        99.0
    );
    let status = reader.status().await;
    assert!(
        status["restore_verified"].as_f64().unwrap() >= 7.0,
        "{status}"
    );
    assert_eq!(status["restore_mismatch"], 0.0);
}
