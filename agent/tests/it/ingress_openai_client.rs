//! The official `openai` Python client (tests/python/openai_client_test.py) against the
//! ingress, served on loopback over `FakeSubmitter` — an in-process stand-in for the
//! router runtime (which merges separately). The same script runs against a real router.
//!
//! Python is `$DEN_TEST_PYTHON` (tests/run sets it to its .venv with `openai` installed),
//! else `.venv/bin/python` in the repository root; with neither, or without the `openai`
//! package, the test prints "skipped" and passes, except under tests/run, where it fails.

use crate::ingress_common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use den_agent::auth;
use den_agent::ingress::IngressConfig;
use den_agent::ingress::fake::{Behaviour, FakeModel};

use ingress_common::*;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> Option<PathBuf> {
    let candidate = match std::env::var_os("DEN_TEST_PYTHON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => repo_root().join(".venv/bin/python"),
    };
    let has_openai = std::process::Command::new(&candidate)
        .args(["-c", "import openai"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    has_openai.then_some(candidate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_client_streamed_and_not_streamed() {
    let Some(python) = python() else {
        den_tests::environment::missing(
            "no Python with the `openai` package (set DEN_TEST_PYTHON or run tests/run, which creates .venv)",
        );
        return;
    };
    let config = IngressConfig {
        token: auth::Token::new("den-python-token"),
        ..IngressConfig::default()
    };
    let flaky = FakeModel::new("flaky", 4096).with(Behaviour {
        fail_after: Some(2),
        ..Behaviour::default()
    });
    let server = serve(vec![model(), flaky], config).await;
    let script = repo_root().join("tests/python/openai_client_test.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .env("DEN_TEST_BASE_URL", server.url("/v1"))
        .env("DEN_TEST_MODEL", "den-test")
        .env("DEN_TEST_API_KEY", "den-python-token")
        .env("DEN_TEST_FLAKY_MODEL", "flaky")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the Python client finished within 180 s")
        .expect("the Python client started");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "openai client checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"));
    assert!(stdout.contains("ok   error_after_the_first_token_raises_during_the_stream"));
}
