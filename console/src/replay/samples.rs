//! The sample recordings of `recordings/` replay, and the incident's summary tells the
//! story the sample was made for.

use std::path::PathBuf;

use den_protocol::time::Millis;

use super::{Replayer, summary};

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../recordings/synthetic")
        .join(name)
}

#[test]
fn incident_summary_names_the_killed_worker_the_failed_request_and_the_fallback() {
    let s = summary::summarise(&sample("incident.jsonl")).unwrap();
    let gone = s
        .workers
        .iter()
        .find(|w| !w.left.is_empty())
        .expect("a worker left");
    assert_eq!(gone.worker.as_str(), "gpu-a");
    assert!(gone.left[0].1.contains("disconnected"), "{:?}", gone.left);

    let failed: Vec<_> = s.requests.iter().filter(|q| q.failed).collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].request.as_str(), "request-7");
    assert!(failed[0].outcome.contains("gpu-a became unavailable after"));

    let fell_back = s
        .requests
        .iter()
        .find(|q| q.fallback.is_some())
        .expect("a fallback");
    assert_eq!(fell_back.request.as_str(), "request-8");
    assert_eq!(fell_back.fallback.as_ref().unwrap().as_str(), "gpu-b");
    assert_eq!(fell_back.outcome, "completed");

    let placement = s
        .commands
        .iter()
        .find(|c| c.placement)
        .expect("a placement");
    assert!(placement.progress.len() >= 5);
    assert!(
        placement
            .outcome
            .as_ref()
            .is_some_and(|(_, status, _)| status.as_str() == "failed")
    );
    assert!(!s.readiness.is_empty());
    let worst = s.page_pressure.first().expect("page pools");
    assert_eq!(worst.worker.as_str(), "gpu-b");
    assert!(s.problems.torn.is_empty() && s.problems.skipped_lines == 0);

    let text = summary::text(&s);
    for needle in [
        "worker gpu-a gone: disconnected",
        "request request-7 failed",
        "request request-8 falls back to gpu-b",
        "place mlx-community/Llama-3.2-1B-Instruct-4bit",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["requests"][0]["request"], "request-7");
}

#[test]
fn samples_replay_to_their_end_without_warnings() {
    for name in ["demo.jsonl", "incident.jsonl"] {
        let mut r = Replayer::open(&sample(name)).unwrap();
        assert!(r.end() > Millis(9_000), "{name}");
        let end = r.end();
        r.seek(end).unwrap();
        assert!(r.ordinal() > 100, "{name}: {} events", r.ordinal());
        assert_eq!(r.warnings(), &super::Warnings::default(), "{name}");
        assert!(!r.model().routes().is_empty(), "{name}");
    }
}

/// The real samples (a `den demo` session and the incident made by den-agent
/// processes): compressed, they replay to their end without warnings.
#[test]
fn real_samples_replay_to_their_end_without_warnings() {
    for name in ["demo.jsonl.zst", "incident.jsonl.zst"] {
        let path = sample("../").join(name);
        let mut r = Replayer::open(&path).unwrap();
        assert!(r.end() > Millis(4_000), "{name}");
        let end = r.end();
        r.seek(end).unwrap();
        assert!(r.ordinal() > 50, "{name}: {} events", r.ordinal());
        assert_eq!(r.warnings(), &super::Warnings::default(), "{name}");
        assert!(!r.model().routes().is_empty(), "{name}");
        // Back to the middle and forward again: the same model as a straight replay.
        r.seek(Millis(end.0 / 2)).unwrap();
        r.seek(end).unwrap();
        assert_eq!(r.warnings(), &super::Warnings::default(), "{name}");
    }
}

#[test]
fn at_prints_every_panel_as_it_was() {
    let text = summary::at(&sample("incident.jsonl"), Millis(12_500), false).unwrap();
    for needle in [
        "NODES",
        "DOWNLOADS",
        "INSTANCES",
        "PAGES",
        "ROUTES",
        "EVENTS",
        "request-7",
        "gone",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    assert!(text.starts_with("den recording synthetic-incident at 00:12.500"));
    let before = summary::at(&sample("incident.jsonl"), Millis(8_000), false).unwrap();
    assert!(
        !before.contains("request-7 "),
        "request-7 is submitted at 9 s"
    );
    let json = summary::at(&sample("incident.jsonl"), Millis(12_500), true).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["at_ms"], 12_500);
    assert!(
        v["panels"]["routes"]
            .as_array()
            .is_some_and(|r| r.len() == 8)
    );
}
