//! `den status --json`, the real binary, against (1) a Skulk 1.3.0 node replayed from its
//! captured responses by the fixture server and (2) `den demo`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use den_tests::{FixtureServer, binary, script_path};

fn status(args: &[&str]) -> (Option<i32>, Value, String) {
    let den = binary("den").expect("the den binary (cargo build --workspace builds it)");
    let out = Command::new(den)
        .args(["--no-record", "status", "--json", "--timeout", "10"])
        .args(args)
        .output()
        .expect("run den status");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("den status --json printed no JSON ({e}):\n{stdout}\n{stderr}"));
    (out.status.code(), json, stderr)
}

#[test]
fn status_json_reads_a_replayed_skulk_1_3_0_node() {
    let server = FixtureServer::start_with(
        Path::new(env!("CARGO_BIN_EXE_skulk-fixture-server")),
        &script_path("skulk_runC_replay.json"),
        &[],
    )
    .expect("fixture server");
    let (code, json, stderr) = status(&["--skulk", &server.url()]);
    assert_eq!(code, Some(0), "{stderr}\n{json:#}");
    let text = json.to_string();
    // The node behind the capture, bound by its /node_id.
    assert!(
        text.contains("12D3KooWS5hbRfsg4cwEX7pKogLSmR1udPzi5g68xyrDuoCesy1L"),
        "{json:#}"
    );
    // Skulk 1.3.0 has no probes and no attempt ids: nothing may read as ready.
    assert!(
        !text.contains("\"ready\""),
        "a 1.3.0 capture must never read ready: {json:#}"
    );
    assert!(server.count("GET", "/state") >= 1);
}

#[test]
fn status_json_reads_den_demo() {
    let den = binary("den").expect("the den binary");
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("demo.err");
    let mut demo = Command::new(den)
        .args(["--no-record", "demo", "--headless", "--duration", "60s"])
        .env("DEN_TOKEN", "status-test")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("den demo");
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = loop {
        let text = std::fs::read_to_string(&err).unwrap_or_default();
        if let Some(u) = text
            .lines()
            .find_map(|l| l.strip_prefix("den demo: router on "))
        {
            break u.trim().to_owned();
        }
        assert!(Instant::now() < deadline, "den demo did not start:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let (code, json, stderr) = status(&["--router", &url, "--token", "status-test"]);
    let _ = demo.kill();
    let _ = demo.wait();
    assert_eq!(code, Some(0), "{stderr}\n{json:#}");
    let text = json.to_string();
    for w in ["w-1", "w-2", "w-3"] {
        assert!(text.contains(w), "{w} missing from {json:#}");
    }
}

/// `den status --json` prints one JSON document even when it has nothing to show: with
/// no source configured (`error` says which flag to pass) and when no source answers
/// (the empty snapshot with each source's problem), both exit 1.
#[test]
fn status_json_is_a_document_when_nothing_answers() {
    let den = binary("den").expect("the den binary (cargo build --workspace builds it)");
    let home = tempfile::tempdir().expect("temp dir");
    let run = |args: &[&str]| {
        let out = Command::new(&den)
            .args(["--no-record"])
            .args(args)
            .env_remove("DEN_ROUTER")
            .env_remove("DEN_SKULK")
            .env_remove("DEN_CONFIG")
            .env("XDG_CONFIG_HOME", home.path())
            .output()
            .expect("run den status");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let json: Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("no JSON document ({e}): {stdout:?}"));
        (out.status.code(), json)
    };
    let (code, json) = run(&["status", "--json"]);
    assert_eq!(code, Some(1));
    assert_eq!(json["complete"], false);
    assert!(
        json["error"]
            .as_str()
            .is_some_and(|e| e.contains("--router")),
        "{json}"
    );
    let (code, json) = run(&[
        "--router",
        "http://127.0.0.1:1",
        "status",
        "--json",
        "--timeout",
        "2",
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(json["complete"], false);
    let problem = json["problems"]["router"].as_str().unwrap_or_default();
    assert!(problem.contains("could not connect"), "{json}");
}
