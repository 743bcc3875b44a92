use std::path::Path;

use den_protocol::recording::{Kind, decode_end, decode_header, peek};
use den_protocol::session::{SessionEvent, Stamped};
use den_protocol::time::Millis;

use super::*;
use crate::fixtures;
use crate::model::ModelConfig;

/// Record `events` with small snapshots (many of them) into `path`.
pub(crate) fn record_to(
    path: &Path,
    events: &[Stamped],
    tweak: impl FnOnce(&mut RecorderConfig),
) -> Closed {
    let mut config = RecorderConfig::new(path.to_path_buf(), ModelConfig::default(), Vec::new());
    config.snapshots.min_bytes = 16 * 1024;
    config.started_at_unix_ms = 1_750_000_000_000;
    tweak(&mut config);
    let recorder = Recorder::start(config).unwrap();
    for e in events {
        recorder.record(e);
    }
    let end = events.last().map_or(Millis::ZERO, |e| e.at);
    recorder.close(end).unwrap()
}

fn plain_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_recording_is_a_header_snapshots_events_and_an_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    let events = fixtures::scenario().unwrap();
    let closed = record_to(&path, &events, |_| {});
    assert_eq!(closed.events, events.len() as u64);
    assert_eq!(closed.dropped, 0);
    assert_eq!(closed.segments, vec![path.clone()]);
    let lines = plain_lines(&path);
    let header = decode_header(lines[0].as_bytes()).unwrap();
    assert_eq!(header.segment, 0);
    assert_eq!(header.redaction.policy, "den-redact-1");
    assert_eq!(header.console["model"]["stale_after_ms"], 10_000);
    let kinds: Vec<Kind> = lines[1..]
        .iter()
        .map(|l| peek(l.as_bytes()).unwrap().kind)
        .collect();
    assert_eq!(kinds[0], Kind::Snapshot { events: 0 });
    assert_eq!(kinds.last(), Some(&Kind::End));
    let snapshots = kinds
        .iter()
        .filter(|k| matches!(k, Kind::Snapshot { .. }))
        .count();
    assert!(snapshots >= 3, "{snapshots} snapshots");
    let event_lines = kinds.iter().filter(|k| **k == Kind::Event).count();
    assert_eq!(event_lines, events.len());
    // Times never go backwards.
    let times: Vec<Millis> = lines[1..]
        .iter()
        .map(|l| peek(l.as_bytes()).unwrap().at)
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    let end = decode_end(lines.last().unwrap().as_bytes()).unwrap();
    assert_eq!(
        (end.reason.as_str(), end.events, end.dropped),
        ("closed", events.len() as u64, 0)
    );
}

#[test]
fn rotation_starts_self_contained_segments_and_retention_deletes_the_oldest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let events = fixtures::scenario().unwrap();
    let closed = record_to(&path, &events, |c| {
        c.rotate_bytes = 40 * 1024;
        c.retention.max_total_bytes = u64::MAX;
    });
    assert!(closed.segments.len() >= 3, "{:?}", closed.segments);
    assert_eq!(closed.segments[1], dir.path().join("r.1.jsonl"));
    for (i, seg) in closed.segments.iter().enumerate() {
        let lines = plain_lines(seg);
        let header = decode_header(lines[0].as_bytes()).unwrap();
        assert_eq!(header.segment, i as u32);
        assert!(matches!(
            peek(lines[1].as_bytes()).unwrap().kind,
            Kind::Snapshot { .. }
        ));
        let end = decode_end(lines.last().unwrap().as_bytes()).unwrap();
        let last = i + 1 == closed.segments.len();
        assert_eq!(end.reason, if last { "closed" } else { "rotated" });
    }

    // The same with a total limit: older segments go, the newest stays.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let unrelated = dir.path().join("other.jsonl");
    std::fs::write(&unrelated, "keep me").unwrap();
    let closed = record_to(&path, &events, |c| {
        c.rotate_bytes = 40 * 1024;
        c.retention.max_total_bytes = 100 * 1024;
    });
    assert!(!closed.deleted.is_empty());
    assert!(!path.exists(), "the first segment was deleted");
    assert!(closed.segments.last().unwrap().exists());
    assert!(
        unrelated.exists(),
        "only this recording's segments are swept"
    );
    let kept: u64 = closed
        .segments
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    assert!(kept <= 100 * 1024 + 64 * 1024, "kept {kept} bytes");
}

#[test]
fn events_the_writer_cannot_take_are_counted_and_marked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.jsonl");
    let events = fixtures::scenario().unwrap();
    // A channel of one: the UI side outruns the writer and must drop.
    let mut config = RecorderConfig::new(path.clone(), ModelConfig::default(), Vec::new());
    config.channel = 1;
    let recorder = Recorder::start(config).unwrap();
    let sent = events.len() as u64 * 4;
    for _ in 0..4 {
        for e in &events {
            recorder.record(e);
        }
    }
    let dropped_at_handle = recorder.dropped();
    let closed = recorder.close(Millis(25_000)).unwrap();
    assert_eq!(closed.events + closed.dropped, sent);
    assert_eq!(closed.dropped, dropped_at_handle);
    let lines = plain_lines(&path);
    let gaps: u64 = lines
        .iter()
        .filter_map(|l| match peek(l.as_bytes())?.kind {
            Kind::Gap { dropped } => Some(dropped),
            _ => None,
        })
        .sum();
    assert_eq!(gaps, closed.dropped);
    let end = decode_end(lines.last().unwrap().as_bytes()).unwrap();
    assert_eq!(end.dropped, closed.dropped);
}

#[test]
fn secrets_and_payloads_never_reach_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let token = "tok-4f9c2e7d-very-secret";
    let prompt = "Summarise the merger memo for Project Nightingale";
    let mut state = fixtures::skulk_state("derived/state_two_nodes_running.json").unwrap();
    let task: den_protocol::skulk::Task = serde_json::from_value(serde_json::json!({
        "TextGeneration": {
            "taskId": "t-1",
            "commandId": "c-1",
            "instanceId": "i-1",
            "taskStatus": "Running",
            "taskParams": {
                "model": "llama",
                "messages": [{"role": "user", "content": prompt}],
                "api_key": token,
            }
        }
    }))
    .unwrap();
    state.tasks.insert("t-1".into(), task);
    let events = vec![
        Stamped::new(
            Millis(1),
            SessionEvent::SkulkState {
                source: "mgmt".into(),
                state: Box::new(state),
                latency_ms: 3,
                received_unix_ms: None,
            },
        ),
        Stamped::new(
            Millis(2),
            SessionEvent::Disconnected {
                source: "mgmt".into(),
                reason: format!("GET http://op:{token}@10.0.0.2/state?token={token}: 401"),
            },
        ),
        Stamped::new(
            Millis(3),
            SessionEvent::Note {
                text: format!("server echoed Bearer {token}"),
            },
        ),
    ];
    for name in ["s.jsonl", "s.jsonl.zst"] {
        let path = dir.path().join(name);
        record_to(&path, &events, |c| c.secrets = vec![token.to_owned()]);
        let bytes = read_all(&path);
        for needle in [token, prompt, "Nightingale", "op:"] {
            assert!(!contains(&bytes, needle.as_bytes()), "{needle} in {name}");
        }
        // Ids and timings stay.
        assert!(contains(&bytes, b"t-1"));
        assert!(contains(&bytes, b"\"latency_ms\":3"));
    }
}

pub(crate) fn read_all(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap();
    if path.to_string_lossy().ends_with(".zst") {
        let mut out = Vec::new();
        let mut d = zstd::stream::read::Decoder::new(raw.as_slice()).unwrap();
        let _ = std::io::Read::read_to_end(&mut d, &mut out);
        out
    } else {
        raw
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn an_unwritable_path_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "x").unwrap();
    let config = RecorderConfig::new(
        blocker.join("sub/r.jsonl"),
        ModelConfig::default(),
        Vec::new(),
    );
    let err = Recorder::start(config).err().unwrap().to_string();
    assert!(err.starts_with("cannot record to "), "{err}");
}
