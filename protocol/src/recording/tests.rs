use serde_json::json;

use super::*;
use crate::feed::FeedMessage;
use crate::observation::Observation;
use crate::session::SessionEvent;

fn header() -> Header {
    Header::new(
        "0.1.0",
        "rec-1",
        0,
        1_750_000_000_000,
        "host-a",
        vec![SourceInfo {
            source: "router".into(),
            kind: SourceKind::DenRouter,
            url: "http://127.0.0.1:7000".into(),
        }],
        Redactor::default().policy(),
        json!({"stale_after_ms": 10000}),
    )
}

#[test]
fn header_round_trips_and_peeks_as_header() {
    let h = header();
    let line = encode_header(&h);
    assert!(line.starts_with("{\"format\":\"den-recording\""), "{line}");
    assert!(!line.contains('\n'));
    assert_eq!(decode_header(line.as_bytes()).unwrap(), h);
    assert_eq!(peek(line.as_bytes()).unwrap().kind, Kind::Header);
}

#[test]
fn same_major_is_accepted_with_unknown_keys_and_other_majors_are_refused() {
    let mut v: Value = serde_json::to_value(header()).unwrap();
    v["version"] = json!("1.7");
    v["future_key"] = json!({"x": 1});
    let h = decode_header(v.to_string().as_bytes()).unwrap();
    assert_eq!(h.version, "1.7");
    assert_eq!(h.extra.get("future_key"), Some(&json!({"x": 1})));

    v["version"] = json!("2.0");
    let err = decode_header(v.to_string().as_bytes()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "recording format 2.0 is newer than this den (reads 1.x): upgrade den"
    );
    v["version"] = json!("0.9");
    assert!(matches!(
        decode_header(v.to_string().as_bytes()),
        Err(FormatError::Older(_))
    ));
    v["version"] = json!("x");
    assert!(matches!(
        decode_header(v.to_string().as_bytes()),
        Err(FormatError::Malformed(_))
    ));
    assert_eq!(
        decode_header(b"{\"at\":1,\"event\":\"note\",\"text\":\"x\"}"),
        Err(FormatError::NotARecording)
    );
    assert_eq!(decode_header(b"GIF89a"), Err(FormatError::NotARecording));
}

#[test]
fn event_lines_start_with_their_time_and_kind() {
    let events = [
        SessionEvent::Note { text: "hi".into() },
        SessionEvent::Feed {
            source: "router".into(),
            message: FeedMessage::Worker {
                at: Millis(3),
                observation: Box::new(Observation::new("w1", "n1")),
            },
        },
    ];
    for (i, event) in events.into_iter().enumerate() {
        let stamped = Stamped::new(Millis(1000 + i as u64), event);
        let line = encode_event(&stamped);
        let p = peek(line.as_bytes()).unwrap();
        assert_eq!(p.at, stamped.at);
        assert_eq!(p.kind, Kind::Event, "{line}");
        assert_eq!(decode_event(line.as_bytes()).unwrap(), stamped);
        // The same line through a JSON value (the redaction path).
        let value = serde_json::to_value(&stamped).unwrap();
        let again = encode_event_value(&value).unwrap();
        assert_eq!(peek(again.as_bytes()).unwrap().kind, Kind::Event);
        assert_eq!(decode_event(again.as_bytes()).unwrap(), stamped);
    }
}

#[test]
fn snapshot_gap_and_end_lines_peek_and_decode() {
    let snap = encode_snapshot(Millis(9100), 812, "{\"a\":[1,2]}");
    assert_eq!(
        peek(snap.as_bytes()),
        Some(Peek {
            at: Millis(9100),
            kind: Kind::Snapshot { events: 812 }
        })
    );
    let (at, events, state): (Millis, u64, Value) = decode_snapshot(snap.as_bytes()).unwrap();
    assert_eq!(
        (at, events, state),
        (Millis(9100), 812, json!({"a": [1, 2]}))
    );

    let gap = encode_gap(Millis(5), 3);
    assert_eq!(peek(gap.as_bytes()).unwrap().kind, Kind::Gap { dropped: 3 });

    let end = End {
        reason: "rotated".into(),
        events: 10,
        dropped: 0,
        bytes: 1234,
        next: Some("x.1.jsonl".into()),
    };
    let line = encode_end(Millis(7), &end);
    assert_eq!(peek(line.as_bytes()).unwrap().kind, Kind::End);
    assert_eq!(decode_end(line.as_bytes()).unwrap(), end);

    assert_eq!(
        peek(b"{\"at\":5,\"bookmark\":{}}").unwrap().kind,
        Kind::Other("bookmark".into())
    );
}

#[test]
fn torn_and_foreign_lines_do_not_peek() {
    let line = encode_event(&Stamped::new(
        Millis(123456),
        SessionEvent::Note { text: "x".into() },
    ));
    // Any prefix that stops inside the time or the key is not a line.
    for cut in 0..14 {
        assert_eq!(peek(&line.as_bytes()[..cut]), None, "cut at {cut}");
    }
    assert!(decode_event(&line.as_bytes()[..line.len() - 1]).is_err());
    assert_eq!(peek(b"{\"at\":-1,\"event\":\"x\"}"), None);
    assert_eq!(peek(b"hello"), None);
}

#[test]
fn offsets_parse_in_the_forms_users_type_and_print_back() {
    for (text, ms) in [
        ("90s", 90_000),
        ("1m30s", 90_000),
        ("1:30", 90_000),
        ("1:02:03", 3_723_000),
        ("1500ms", 1_500),
        ("90", 90_000),
        ("2.5", 2_500),
        ("1h", 3_600_000),
    ] {
        assert_eq!(parse_offset(text), Ok(Millis(ms)), "{text}");
    }
    for bad in ["", "abc", "1x", "-5", "1m30", "::"] {
        assert!(parse_offset(bad).is_err(), "{bad}");
    }
    assert_eq!(Offset(Millis(90_250)).to_string(), "01:30.250");
    assert_eq!(Offset(Millis(3_723_000)).to_string(), "1:02:03.000");
}
