//! The official `openai` Python client against a real router with two real workers on
//! loopback: models, chat and completions, streamed and not streamed, usage with the
//! workers' actual cached tokens for a repeated prompt, and typed errors.
//!
//! The client is installed by `tests/run` into `.venv/` and named by `DEN_TEST_PYTHON`;
//! without it the test says so and is skipped (it cannot run without the real client).

use std::path::PathBuf;
use std::process::Command;

use den_tests::agents::{start_router, start_worker};
use den_tests::workspace_dir;

fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DEN_TEST_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let venv = workspace_dir().join(".venv/bin/python");
    venv.exists().then_some(venv)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_official_openai_client_streamed_and_not_streamed() {
    let Some(python) = python() else {
        eprintln!(
            "skipped: no Python with the openai package (run tests/run, or set DEN_TEST_PYTHON)"
        );
        return;
    };
    let router = start_router(Some("client-key"), &[]);
    let _a = start_worker(&router, "w-a", false, &["--model", "den/synthetic"]);
    let _b = start_worker(&router, "w-b", false, &["--model", "den/synthetic"]);
    router.wait_workers(&["w-a", "w-b"]).await;

    let script = workspace_dir().join("tests/python/openai_client_test.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .env("DEN_TEST_BASE_URL", format!("{}/v1", router.url))
            .env("DEN_TEST_MODEL", "den/synthetic")
            .env("DEN_TEST_API_KEY", "client-key")
            .env("DEN_TEST_EXPECT_CACHED", "1")
            .output()
    })
    .await
    .expect("join")
    .expect("run the openai client script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "openai client checks failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("ok   chat_streamed_with_usage_matches_not_streamed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok   cached_tokens_are_reported_for_a_repeated_prompt"),
        "{stdout}"
    );
}
