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

/// The real incident (`recordings/regenerate`: den-agent processes recorded by
/// `den record`): the worker serving a stream is killed while a placement downloads to
/// it, after a request it stopped answering fell back elsewhere.
#[test]
fn replay_summary_of_the_real_incident_names_the_killed_worker_the_failed_request_and_the_fallback()
{
    let incident = sample("incident.jsonl.zst");
    let (code, out, err) = den(&["replay", incident.to_str().expect("path"), "--summary"]);
    assert_eq!(code, Some(0), "{err}");
    // Which worker served the stream is the router's choice: read it from the summary.
    let killed = out
        .lines()
        .find_map(|l| {
            l.split("] worker ")
                .nth(1)?
                .split_once(" gone: disconnected")
        })
        .map(|(w, _)| w.to_owned())
        .unwrap_or_else(|| panic!("no worker left:\n{out}"));
    assert!(killed.starts_with("gpu-"), "{killed}");
    let failed = format!("request chat-stream-1 failed: worker {killed} became unavailable after");
    assert!(out.contains(&failed), "{failed:?} missing:\n{out}");
    let fallback = out
        .lines()
        .find_map(|l| l.split("request chat-followup-2 falls back to ").nth(1))
        .unwrap_or_else(|| panic!("no fallback:\n{out}"));
    assert!(
        fallback.starts_with("gpu-") && fallback != killed,
        "{fallback}"
    );
    let timed_out = format!("request chat-followup-2 attempt #1 on {killed}: timed out");
    assert!(out.contains(&timed_out), "{timed_out:?} missing:\n{out}");
    // The placement was downloading to the killed worker's node.
    let placing = "(den/incident-chat) not ready: runner";
    assert!(out.contains(placing), "{out}");
    assert!(
        out.contains(&format!("download on {killed}: ongoing")),
        "{out}"
    );
}

/// The synthetic incident (`recordings/synthetic/`), byte-for-byte reproducible.
#[test]
fn replay_summary_of_the_incident_names_the_killed_worker_the_failed_request_and_the_fallback() {
    let incident = sample("synthetic/incident.jsonl");
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
    let text = std::fs::read_to_string(sample("synthetic/demo.jsonl")).expect("sample");
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
        sample("synthetic/demo.jsonl").to_str().expect("path"),
        "--at",
        "soon",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("not a time"), "{err}");
    let (code, _, err) = den(&["record", "--duration", "1s"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no sources"), "{err}");
}
