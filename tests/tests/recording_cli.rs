//! `den replay` and `den record` from the command line: the summary of the incident
//! sample, `--json`, `--at`, and one-line refusals.

use std::path::PathBuf;
use std::process::Command;

use den_tests::recording::den_binary;
use den_tests::workspace_dir;

fn sample(name: &str) -> PathBuf {
    workspace_dir().join("recordings").join(name)
}

fn den(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(den_binary())
        .args(args)
        .env_remove("DEN_CONFIG")
        .env_remove("DEN_ROUTER")
        .env_remove("DEN_SKULK")
        .output()
        .expect("run den");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn replay_summary_of_the_incident_names_the_killed_worker_the_failed_request_and_the_fallback() {
    let incident = sample("incident.jsonl");
    let path = incident.to_str().expect("utf-8 path");
    let (code, out, err) = den(&["replay", path, "--summary"]);
    assert_eq!(code, Some(0), "{err}");
    for needle in [
        "worker gpu-a gone: disconnected",
        "request request-7 failed: worker gpu-a became unavailable after",
        "request request-8 falls back to gpu-b",
        "#1 place mlx-community/Llama-3.2-1B-Instruct-4bit",
        "gpu-b (node node-bravo):",
    ] {
        assert!(out.contains(needle), "{needle:?} missing:\n{out}");
    }
    let (code, out, _) = den(&["replay", path, "--summary", "--json"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["requests"][1]["fallback"], "gpu-b");
    let (code, out, _) = den(&["replay", path, "--at", "1:00"]);
    assert_eq!(code, Some(0));
    assert!(
        out.starts_with("den recording synthetic-incident at 00:25.100"),
        "clamped to the end: {out}"
    );
}

#[test]
fn replay_refuses_what_it_cannot_read_in_one_line() {
    let dir = den_tests::temp_dir().expect("temp dir");
    let newer = dir.path().join("newer.jsonl");
    let text = std::fs::read_to_string(sample("demo.jsonl")).expect("sample");
    std::fs::write(
        &newer,
        text.replacen("\"version\":\"1.0\"", "\"version\":\"2.3\"", 1),
    )
    .expect("write");
    let (code, out, err) = den(&["replay", newer.to_str().expect("path"), "--summary"]);
    assert_eq!(code, Some(1));
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.trim_end()
            .ends_with("recording format 2.3 is newer than this den (reads 1.x): upgrade den"),
        "{err}"
    );
    let (code, _, err) = den(&["replay", "/nonexistent/x.jsonl", "--summary"]);
    assert_eq!(code, Some(1));
    assert_eq!(err.lines().count(), 1, "{err}");
    let (code, _, err) = den(&[
        "replay",
        sample("demo.jsonl").to_str().expect("path"),
        "--at",
        "soon",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("not a time"), "{err}");
    let (code, _, err) = den(&["record", "--duration", "1s"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no sources"), "{err}");
}
