use std::path::{Path, PathBuf};

use den_protocol::recording::Redactor;
use den_protocol::session::Stamped;
use den_protocol::time::Millis;

use super::*;
use crate::app::{App, Panel};
use crate::fixtures;
use crate::model::Model;
use crate::record::tests::record_to;
use crate::testing;
use crate::theme::Theme;

/// Every panel drawn at `now`.
fn frames(model: &Model, now: Millis) -> Vec<String> {
    let theme = Theme::default();
    Panel::ALL
        .iter()
        .map(|p| {
            let mut app = App::focused(*p);
            testing::styled(&testing::draw(&mut app, model, &theme, now, 120, 40))
        })
        .collect()
}

/// The events as written: redacted, and stamped no earlier than the one before (the
/// fixtures are not quite in order; the recorder keeps its file ordered).
fn redacted(events: &[Stamped]) -> Vec<Stamped> {
    let r = Redactor::default();
    let mut last = Millis::ZERO;
    events
        .iter()
        .map(|e| {
            let mut v = serde_json::to_value(e).unwrap();
            r.redact(&mut v);
            let mut e: Stamped = serde_json::from_value(v).unwrap();
            e.at = e.at.max(last);
            last = e.at;
            e
        })
        .collect()
}

/// The model after every event stamped at or before `t`.
fn truth(events: &[Stamped], t: Millis) -> Model {
    let mut m = Model::default();
    for e in events.iter().filter(|e| e.at <= t) {
        m.apply(e);
    }
    m.settle();
    m
}

/// Times to look at: a spread over the recording, in a scrambled order.
fn moments(end: Millis) -> Vec<Millis> {
    let n = 23u64;
    let mut v: Vec<Millis> = (0..n)
        .map(|i| Millis(end.0 * ((i * 7) % n) / (n - 1)))
        .collect();
    v.extend([Millis(0), end, Millis(end.0 / 2), Millis(end.0 / 2 + 1)]);
    v
}

fn recordings(dir: &Path, events: &[Stamped]) -> Vec<PathBuf> {
    let plain = dir.join("p.jsonl");
    let whole = record_to(&plain, events, |_| {}).bytes;
    let zst = dir.join("z.jsonl.zst");
    let whole_zst = record_to(&zst, events, |_| {}).bytes;
    let rotated = dir.join("r.jsonl");
    let closed = record_to(&rotated, events, |c| c.rotate_bytes = whole / 4);
    assert!(closed.segments.len() > 2, "{closed:?}");
    let rotated_zst = dir.join("rz.jsonl.zst");
    let closed = record_to(&rotated_zst, events, |c| c.rotate_bytes = whole_zst / 4);
    assert!(closed.segments.len() > 2, "{closed:?}");
    // Open the rotated ones by their middle segment: every segment is found.
    vec![plain, zst, closed.segments[1].clone(), rotated]
}

#[test]
fn seeking_draws_what_playing_from_the_start_draws() {
    let dir = tempfile::tempdir().unwrap();
    for events in [
        fixtures::scenario().unwrap(),
        fixtures::run_c_scenario().unwrap(),
    ] {
        let written = redacted(&events);
        let end = events.last().unwrap().at;
        for path in recordings(dir.path(), &events) {
            let mut seeker = Replayer::open(&path).unwrap();
            assert_eq!(seeker.end(), end, "{}", path.display());
            let mut times = moments(end);
            for t in &times {
                seeker.seek(*t).unwrap();
                let now = t.saturating_add(0);
                assert_eq!(
                    frames(seeker.model(), now),
                    frames(&truth(&written, *t), now),
                    "{} at {t}",
                    path.display()
                );
            }
            // Playing forwards only, through the same moments.
            times.sort();
            let mut player = Replayer::open(&path).unwrap();
            for t in &times {
                player.seek(*t).unwrap();
                assert_eq!(
                    player.model().checkpoint_json().unwrap(),
                    truth(&written, *t).checkpoint_json().unwrap(),
                    "{} at {t}",
                    path.display()
                );
            }
            assert!(seeker.warnings().torn.is_empty());
            assert_eq!(seeker.warnings().skipped, 0);
        }
    }
}

#[test]
fn stepping_back_undoes_stepping_forward() {
    let dir = tempfile::tempdir().unwrap();
    let events = fixtures::scenario().unwrap();
    let written = redacted(&events);
    for path in recordings(dir.path(), &events) {
        let mut r = Replayer::open(&path).unwrap();
        r.seek(Millis(12_000)).unwrap();
        let here = r.model().checkpoint_json().unwrap();
        let ordinal = r.ordinal();
        assert_eq!(
            ordinal,
            written.iter().filter(|e| e.at <= Millis(12_000)).count() as u64
        );
        for _ in 0..40 {
            assert!(r.step_forward().unwrap());
        }
        assert_eq!(r.ordinal(), ordinal + 40);
        let expected = &written[..(ordinal + 40) as usize];
        assert_eq!(r.last_event(), expected.last());
        for _ in 0..40 {
            assert!(r.step_back().unwrap());
        }
        assert_eq!(r.ordinal(), ordinal);
        assert_eq!(r.model().checkpoint_json().unwrap(), here);
        // At the very start there is nothing to undo.
        r.seek(Millis(0)).unwrap();
        while r.step_back().unwrap() {}
        assert_eq!(r.ordinal(), 0);
    }
}

#[test]
fn a_torn_last_line_replays_up_to_the_last_complete_event() {
    let dir = tempfile::tempdir().unwrap();
    let events = fixtures::scenario().unwrap();
    let written = redacted(&events);
    for name in ["t.jsonl", "t.jsonl.zst"] {
        let path = dir.path().join(name);
        record_to(&path, &events, |_| {});
        let mut bytes = std::fs::read(&path).unwrap();
        if name.ends_with(".zst") {
            // Cut the compressed stream two thirds in: a crash mid-write.
            bytes.truncate(bytes.len() * 2 / 3);
        } else {
            // Cut the last event line in the middle.
            let text = String::from_utf8(bytes.clone()).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            let last_event_line = lines
                .iter()
                .rposition(|l| l.contains(",\"event\":"))
                .unwrap();
            let offset: usize = lines[..last_event_line].iter().map(|l| l.len() + 1).sum();
            bytes.truncate(offset + 20);
        }
        let torn = dir.path().join(format!("torn-{name}"));
        std::fs::write(&torn, &bytes).unwrap();
        let mut r = Replayer::open(&torn).unwrap();
        let end = r.end();
        r.seek(end).unwrap();
        let applied = r.ordinal() as usize;
        assert!(applied > 0 && applied < written.len(), "{name}: {applied}");
        if name == "t.jsonl" {
            assert_eq!(applied, written.len() - 1, "all but the torn event");
        }
        assert_eq!(
            r.model().checkpoint_json().unwrap(),
            {
                let mut m = Model::default();
                for e in &written[..applied] {
                    m.apply(e);
                }
                m.settle();
                m.checkpoint_json().unwrap()
            },
            "{name}"
        );
        assert_eq!(r.warnings().torn.len(), 1, "{name}: {:?}", r.warnings());
    }
}

#[test]
fn a_newer_major_version_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.jsonl");
    record_to(&path, &fixtures::run_c_scenario().unwrap(), |_| {});
    let text = std::fs::read_to_string(&path).unwrap();
    let newer = text.replacen("\"version\":\"1.0\"", "\"version\":\"2.0\"", 1);
    assert_ne!(newer, text);
    std::fs::write(&path, newer).unwrap();
    let err = Replayer::open(&path).err().unwrap().to_string();
    assert!(
        err.ends_with("recording format 2.0 is newer than this den (reads 1.x): upgrade den"),
        "{err}"
    );
    std::fs::write(&path, "hello\n").unwrap();
    let err = Replayer::open(&path).err().unwrap().to_string();
    assert!(err.contains("not a den recording"), "{err}");
}

/// A file whose first "line" is huge is refused after a bounded read, with one line
/// that says it is not a recording (a 1 GB file used to be read whole first).
#[test]
fn a_file_with_an_endless_first_line_is_refused_after_a_bounded_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.jsonl");
    let f = std::fs::File::create(&path).unwrap();
    // Sparse: 1 GiB of zero bytes without a newline, no disk used.
    f.set_len(1 << 30).unwrap();
    let err = match crate::replay::Replayer::open(&path) {
        Ok(_) => panic!("opened a non-recording"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("longer than 64 MiB"), "{err}");
    assert!(!err.contains('\n'));
}

/// A recording whose only snapshot is damaged is refused, whatever time it is stamped
/// with: the fallback to earlier snapshots once looped forever when the damaged one was
/// stamped after 0 ms with no event before it (found by the `recording` fuzz target).
#[test]
fn a_damaged_first_snapshot_is_refused_not_retried_forever() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.jsonl");
    record_to(&path, &fixtures::run_c_scenario().unwrap(), |_| {});
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let snapshot = lines
        .iter()
        .position(|l| l.contains("\"snapshot\":0"))
        .expect("the first snapshot");
    // Stamped at 5 ms, and its state cut short: still indexed, no longer decodable.
    let line = lines[snapshot].replacen("\"at\":0,", "\"at\":5,", 1);
    let cut = line.find("\"state\":").expect("a state") + 20;
    lines[snapshot] = format!("{}\"}}}}", &line[..cut]);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let _ = tx.send(Replayer::open(&p).err().map(|e| e.to_string()));
    });
    let err = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("open returns")
        .expect("a damaged recording is refused");
    assert!(err.contains("snapshot"), "{err}");
}
