//! Redaction: a session recorded with a bearer token, against a router whose `/state`
//! carries a running task with its prompt and echoes the token back, leaves neither the
//! token nor the prompt anywhere in the file (plain or compressed), while ids, counts and
//! timings stay.

use den_console::replay::Replayer;
use den_protocol::feed::{FEED_VERSION, FeedMessage};
use den_tests::RouterStub;
use den_tests::recording::{contains, den_record, recording_bytes};
use den_tests::router_stub::ECHO_AUTHORIZATION;

const TOKEN: &str = "den-tok-7c1f09e2b4aa";
const PROMPT: &str = "Draft the layoff announcement for the Lisbon office";

fn state_with_a_prompt() -> String {
    let text = std::fs::read_to_string(den_tests::skulk_fixture(
        "derived/state_two_nodes_running.json",
    ))
    .expect("state");
    let mut state: serde_json::Value = serde_json::from_str(&text).expect("json");
    state["tasks"]["task-secret-1"] = serde_json::json!({
        "TextGeneration": {
            "taskId": "task-secret-1",
            "taskStatus": "Running",
            "instanceId": "5838fcd2-a1f3-4dea-9074-158c5ed8c17c",
            "commandId": "cmd-1",
            "taskParams": {
                "model": "llama",
                "messages": [{"role": "user", "content": PROMPT}],
                "prompt": PROMPT,
                "max_output_tokens": 64,
                "authorization_seen": ECHO_AUTHORIZATION,
            },
            "errorMessage": format!("upstream said: {ECHO_AUTHORIZATION}"),
        }
    });
    state.to_string()
}

async fn record(name: &str) -> Vec<u8> {
    record_state(name, state_with_a_prompt()).await
}

async fn record_state(name: &str, state: String) -> Vec<u8> {
    let dir = den_tests::temp_dir().expect("temp dir");
    let file = dir.path().join(name);
    let hello = FeedMessage::Hello {
        feed_version: FEED_VERSION,
        router: "den-router-1".into(),
        started_at_unix_ms: 0,
    };
    let router = RouterStub::start(
        "12D3KooWDerivedNodeAlphaXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
        state,
        vec![hello],
    )
    .await
    .expect("stub");
    let url = router.url();
    den_record(
        "3s",
        &["--token", TOKEN, "--router", &url],
        &file,
        dir.path(),
    );
    // The session saw the state: the task is in the recording, its prompt is not.
    let mut replay = Replayer::open(&file).expect("replay");
    let end = replay.end();
    replay.seek(end).expect("seek");
    let model = replay.model();
    let (_, state) = model
        .state_of(&"router".into())
        .expect("the router's /state was recorded");
    assert!(state.tasks.keys().any(|k| k.as_str() == "task-secret-1"));
    recording_bytes(&file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_prompts_appear_nowhere_in_the_recording() {
    for name in ["secret.jsonl", "secret.jsonl.zst"] {
        let bytes = record(name).await;
        for needle in [TOKEN, PROMPT, "Lisbon", "Bearer den-tok"] {
            assert!(
                !contains(&bytes, needle.as_bytes()),
                "{needle:?} found in {name}"
            );
        }
        for kept in [
            "task-secret-1",
            "\"max_output_tokens\":64",
            "latency_ms",
            "[redacted]",
        ] {
            assert!(
                contains(&bytes, kept.as_bytes()),
                "{kept:?} missing from {name}"
            );
        }
        // The header states the policy.
        let header = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
        assert!(contains(header, b"\"policy\":\"den-redact-1\""));
        assert!(contains(header, b"\"known_secrets\":1"));
    }
}

/// Unknown fields are bounded before they are kept: a `/state` (which needs no token)
/// carrying a 2 MB field den does not know, at the top and inside a task, re-sent on every
/// poll for 3 s, leaves a recording of kilobytes with a marker naming the size — not
/// megabytes per poll (a 50 MB field once made 150 MB of recording in 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_skulk_fields_are_bounded_in_the_recording() {
    let mut state: serde_json::Value = serde_json::from_str(&state_with_a_prompt()).unwrap();
    let junk = "j".repeat(2_000_000);
    state["junkFromANewerSkulk"] = serde_json::Value::String(junk.clone());
    if let Some(tasks) = state["tasks"].as_object_mut() {
        for task in tasks.values_mut() {
            if let Some(inner) = task.as_object_mut().and_then(|t| t.values_mut().next()) {
                inner["junkInATask"] = serde_json::Value::String(junk.clone());
            }
        }
    }
    let bytes = record_state("junk.jsonl", state.to_string()).await;
    assert!(bytes.len() < 256 * 1024, "{} bytes recorded", bytes.len());
    assert!(
        contains(&bytes, b"not kept"),
        "the marker says what was dropped"
    );
    assert!(!contains(&bytes, &junk.as_bytes()[..4096]));
}
