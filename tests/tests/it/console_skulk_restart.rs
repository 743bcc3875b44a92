//! A Skulk node that restarts, or freezes, under an open console, through the real
//! `den record` against the fixture server. A restart (Skulk 1.3.0 makes a new node id at
//! every start: runA's and then runC's captures through one endpoint) is followed — the
//! old id leaves the Nodes panel, the new one is bound, and the Events say "restarted" —
//! instead of staying bound to an id nothing answers for. A frozen node is down from its
//! last good answer, not from when den's poll gave up.

use std::path::Path;

use den_console::model::Model;
use den_console::replay::Replayer;
use den_tests::recording::den_record;
use den_tests::{FixtureServer, script_path};

const RUN_A_NODE: &str = "12D3KooWDWXLYXk5Q7ZmwcgDa8PJxjGMeKYXUNnkv3PfsMiTCo53";
const RUN_C_NODE: &str = "12D3KooWS5hbRfsg4cwEX7pKogLSmR1udPzi5g68xyrDuoCesy1L";

/// `den record` for `duration` against the fixture server playing `script`, with
/// `console_toml` as the console's configuration; the session's model at its end.
fn recorded(script: &str, duration: &str, console_toml: &str) -> (Model, FixtureServer) {
    let server = FixtureServer::start_with(
        Path::new(env!("CARGO_BIN_EXE_skulk-fixture-server")),
        &script_path(script),
        &[],
    )
    .expect("fixture server");
    let dir = den_tests::temp_dir().expect("temp dir");
    let config = dir.path().join("den");
    std::fs::create_dir_all(&config).expect("config dir");
    std::fs::write(config.join("console.toml"), console_toml).expect("config");
    let file = dir.path().join("session.jsonl");
    den_record(duration, &["--skulk", &server.url()], &file, dir.path());
    let mut replay = Replayer::open(&file).expect("replay");
    let end = replay.end();
    replay.seek(end).expect("seek");
    (replay.model().clone(), server)
}

#[test]
fn a_skulk_restart_is_followed_by_the_recorded_session() {
    let (model, server) = recorded("skulk_restart.json", "7s", "");
    let polled = server
        .requests()
        .expect("requests")
        .iter()
        .filter(|r| r.is("GET", "/node_id"))
        .count();
    assert!(
        polled >= 3,
        "the restart was reached: {polled} /node_id polls"
    );
    let nodes: Vec<&str> = model
        .views()
        .nodes
        .iter()
        .map(|n| n.node.as_str())
        .collect();
    assert_eq!(nodes, [RUN_C_NODE], "the old id left, the new one joined");
    let restarted: Vec<&str> = model
        .events()
        .iter()
        .map(|e| e.text.as_str())
        .filter(|t| t.contains("restarted"))
        .collect();
    assert_eq!(restarted.len(), 1, "{restarted:?}");
    assert!(
        restarted[0].contains(RUN_A_NODE) && restarted[0].contains(RUN_C_NODE),
        "{restarted:?}"
    );
}

#[test]
fn a_frozen_skulk_node_is_down_since_its_last_good_answer() {
    // Poll every 300 ms with a 1 s deadline, so the freeze shows within seconds.
    let (model, _server) = recorded(
        "skulk_frozen.json",
        "4s",
        "poll_interval_ms = 300\nrequest_timeout_ms = 1000\n",
    );
    let source = model.views().sources.first().expect("one source").clone();
    let last_ok = source.last_ok.expect("it answered before it froze");
    match &source.api {
        den_console::model::Health::Disconnected { since, reason } => {
            assert_eq!(*since, last_ok, "down since the last good answer: {reason}");
            assert!(reason.contains("timed out"), "{reason}");
        }
        other => panic!("a frozen node is not {other:?}"),
    }
}
