//! Crash safety: `den record` killed with SIGKILL while it writes; the file replays up to
//! its last complete event and reports a torn tail when there is one.

use std::process::Command;
use std::time::Duration;

use den_console::replay::Replayer;
use den_protocol::feed::{FEED_VERSION, FeedMessage};
use den_protocol::observation::Observation;
use den_protocol::recording::{Kind, peek};
use den_protocol::time::Millis;
use den_tests::recording::{den_binary, recording_bytes};
use den_tests::{ChildGuard, RouterStub, wait_until_async};

/// Complete event lines in `bytes`, and whether a partial line follows them.
fn complete_events(bytes: &[u8]) -> (u64, bool) {
    let mut events = 0;
    let mut rest = bytes;
    while let Some(i) = rest.iter().position(|b| *b == b'\n') {
        let (line, after) = rest.split_at(i);
        if peek(line).is_some_and(|p| p.kind == Kind::Event) {
            events += 1;
        }
        rest = &after[1..];
    }
    (events, !rest.is_empty())
}

async fn record_then_kill(name: &str) {
    let dir = den_tests::temp_dir().expect("temp dir");
    let file = dir.path().join(name);
    let hello = FeedMessage::Hello {
        feed_version: FEED_VERSION,
        router: "den-router-1".into(),
        started_at_unix_ms: 0,
    };
    let router = RouterStub::start("n1", "{}".into(), vec![hello])
        .await
        .expect("stub");
    let mut cmd = Command::new(den_binary());
    cmd.arg("record")
        .arg("--router")
        .arg(router.url())
        .arg(&file)
        .env_remove("DEN_CONFIG")
        .env("XDG_CONFIG_HOME", dir.path());
    let mut den = ChildGuard::spawn(cmd, "den record").expect("den record");
    assert!(
        den.wait_for_stderr(Duration::from_secs(20), |l| l.contains("recording to"))
            .is_some(),
        "{}",
        den.stderr_tail(20)
    );
    // Heartbeats as fast as the feed takes them, until a good part is on disk.
    let pusher = {
        let router = std::sync::Arc::new(router);
        let r = router.clone();
        let task = tokio::spawn(async move {
            let mut seq = 0u64;
            loop {
                seq += 1;
                let mut o = Observation::new(format!("w{}", seq % 8), "n1");
                o.sequence = seq;
                o.pool.total_pages = 1024;
                o.pool.free = (seq % 1024) as u32;
                r.push(&FeedMessage::Worker {
                    at: Millis(seq),
                    observation: Box::new(o),
                });
                tokio::time::sleep(Duration::from_micros(300)).await;
            }
        });
        (router, task)
    };
    let grown = wait_until_async(Duration::from_secs(30), || {
        complete_events(&recording_bytes(&file)).0 > 2_000
    })
    .await;
    assert!(grown, "the recording did not grow: {}", den.stderr_tail(20));
    den.kill();
    pusher.1.abort();

    let bytes = recording_bytes(&file);
    let (events, partial) = complete_events(&bytes);
    assert!(
        !String::from_utf8_lossy(&bytes).contains("\"end\":{"),
        "a killed recorder writes no end line"
    );
    let mut replay = Replayer::open(&file).expect("the file replays");
    let end = replay.end();
    replay.seek(end).expect("seek to the end");
    assert_eq!(
        replay.ordinal(),
        events,
        "{name}: every complete event replays"
    );
    assert_eq!(replay.warnings().skipped, 0);
    if partial {
        assert_eq!(
            replay.warnings().torn.len(),
            1,
            "{name}: the torn tail is reported"
        );
    }
    assert!(!replay.model().views().pages.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_recorder_leaves_a_file_that_replays_to_its_last_complete_event() {
    record_then_kill("crash.jsonl").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_compressing_recorder_leaves_a_file_that_replays_to_its_last_complete_event() {
    record_then_kill("crash.jsonl.zst").await;
}
