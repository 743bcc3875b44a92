//! A Skulk node that restarts under an open console (Skulk 1.3.0 makes a new node id at
//! every start): the real `den record` against the fixture server replaying runA's and
//! then runC's captures through one endpoint. The session follows the restart — the old
//! id leaves the Nodes panel, the new one is bound, and the Events say "restarted" —
//! instead of staying bound to an id nothing answers for.

use std::path::Path;

use den_console::replay::Replayer;
use den_tests::recording::den_record;
use den_tests::{FixtureServer, script_path};

const RUN_A_NODE: &str = "12D3KooWDWXLYXk5Q7ZmwcgDa8PJxjGMeKYXUNnkv3PfsMiTCo53";
const RUN_C_NODE: &str = "12D3KooWS5hbRfsg4cwEX7pKogLSmR1udPzi5g68xyrDuoCesy1L";

#[test]
fn a_skulk_restart_is_followed_by_the_recorded_session() {
    let server = FixtureServer::start_with(
        Path::new(env!("CARGO_BIN_EXE_skulk-fixture-server")),
        &script_path("skulk_restart.json"),
        &[],
    )
    .expect("fixture server");
    let dir = den_tests::temp_dir().expect("temp dir");
    let file = dir.path().join("restart.jsonl");
    den_record("7s", &["--skulk", &server.url()], &file, dir.path());

    let mut replay = Replayer::open(&file).expect("replay");
    let end = replay.end();
    replay.seek(end).expect("seek");
    let model = replay.model();
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
