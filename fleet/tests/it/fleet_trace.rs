//! Mooncake trace parsing, token expansion and block interning.

use den_fleet::trace::{MOONCAKE_BLOCK_TOKENS, block_token};
use den_fleet::{Trace, TraceError, TraceRequest, Workload, expand_tokens};
use den_protocol::chunk::plan_chunks;

fn req(ts: u64, input: u32, ids: &[u64]) -> TraceRequest {
    TraceRequest {
        timestamp: ts,
        input_length: input,
        output_length: 5,
        hash_ids: ids.to_vec(),
    }
}

#[test]
fn parses_good_lines_skips_blank_ones_and_replays_by_timestamp() {
    let text = concat!(
        r#"{"timestamp": 20, "input_length": 600, "output_length": 7, "hash_ids": [0, 1]}"#,
        "\n\n",
        r#"{"timestamp": 10, "input_length": 512, "output_length": 3, "hash_ids": [0], "extra": 1}"#,
        "\n",
        r#"{"timestamp": 20, "input_length": 1, "output_length": 1, "hash_ids": [9]}"#,
        "\n",
    );
    let trace = Trace::parse(text).unwrap();
    assert_eq!(trace.requests.len(), 3);
    // Sorted by timestamp, ties in file order; lines are 1-based file lines.
    assert_eq!(trace.lines, vec![3, 1, 4]);
    assert_eq!(
        trace.requests[0],
        TraceRequest {
            timestamp: 10,
            input_length: 512,
            output_length: 3,
            hash_ids: vec![0]
        }
    );
    assert_eq!(trace.requests[1].hash_ids, vec![0, 1]);
    assert_eq!(trace.requests[2].output_length, 1);
}

#[test]
fn bad_lines_are_typed_errors_with_their_line_number() {
    let good = r#"{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}"#;
    let cases = [
        (
            r#"{"timestamp": 0, "input_length": 10"#,
            2usize,
            "malformed",
        ),
        (
            r#"{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}"#,
            2,
            "malformed",
        ),
        (
            r#"{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}"#,
            2,
            "empty",
        ),
        (
            r#"{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1]}"#,
            2,
            "no-output",
        ),
        (
            r#"{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}"#,
            2,
            "blocks",
        ),
    ];
    for (bad, line, kind) in cases {
        let text = format!("{good}\n{bad}\n{good}\n");
        let err = Trace::parse(&text).unwrap_err();
        let got = match &err {
            TraceError::Malformed { line, .. } => (*line, "malformed"),
            TraceError::EmptyPrompt { line } => (*line, "empty"),
            TraceError::NoOutput { line } => (*line, "no-output"),
            TraceError::BlockCount {
                line,
                expected,
                found,
                ..
            } => {
                assert_eq!((*expected, *found), (3, 2));
                (*line, "blocks")
            }
            TraceError::Empty => (0, "none"),
        };
        assert_eq!(got, (line, kind), "{bad}");
        assert!(
            err.to_string().starts_with(&format!("trace line {line}:")),
            "{err}"
        );
    }
    assert_eq!(Trace::parse("\n  \n"), Err(TraceError::Empty));
}

#[test]
fn expansion_is_deterministic_truncated_and_prefix_stable() {
    let a = req(0, 1300, &[0, 7, 8]);
    let b = req(5, 1100, &[0, 7, 9]);
    let c = req(9, 1300, &[0, 3, 8]);
    let (ta, tb, tc) = (expand_tokens(&a), expand_tokens(&b), expand_tokens(&c));
    assert_eq!(ta.len(), 1300);
    assert_eq!(tb.len(), 1100);
    assert_eq!(expand_tokens(&a), ta, "same request, same tokens");
    let shared = 2 * MOONCAKE_BLOCK_TOKENS as usize;
    assert_eq!(
        ta[..shared],
        tb[..shared],
        "equal hash-id prefixes give equal token prefixes"
    );
    assert_ne!(
        ta[shared..1100],
        tb[shared..1100],
        "a different id gives different tokens"
    );
    assert_ne!(ta[512..1024], tc[512..1024]);
    // The block's tokens depend on its id only: the last block is a truncation.
    assert_eq!(ta[1024], block_token(8, 0));
    // den's own chunk identity agrees: chained hashes are equal over the shared prefix.
    let (ca, cb) = (plan_chunks(&ta, 256), plan_chunks(&tb, 256));
    assert_eq!(ca[..4], cb[..4]);
    assert_ne!(ca[4].hash, cb[4].hash);
}

#[test]
fn blocks_are_interned_by_their_chain_not_their_id() {
    let trace = Trace {
        requests: vec![
            req(0, 1024, &[0, 1]),
            req(1, 1100, &[0, 1, 2]),
            req(2, 1024, &[5, 1]),
        ],
        lines: vec![1, 2, 3],
    };
    let w = Workload::from_trace(&trace);
    let (r0, r1, r2) = (&w.requests[0], &w.requests[1], &w.requests[2]);
    assert_eq!(
        w.blocks(r1)[..2],
        *w.blocks(r0),
        "shared prefix, shared blocks"
    );
    assert_ne!(
        w.blocks(r2)[1],
        w.blocks(r0)[1],
        "id 1 under another parent is another block"
    );
    assert_eq!(w.block_count(), 5);
    assert_eq!(
        w.block_tokens(w.blocks(r1)[2]),
        1100 - 1024,
        "partial last block"
    );
    assert_eq!(r1.arrival_us, 1000);
    // Infinite-cache reuse: r1 finds r0's two blocks but the last block of a prompt is
    // always recomputed, so it reuses 1024; r0 and r2 find nothing.
    assert_eq!(w.ideal_reuse(), vec![0, 1024, 0]);
    let s = w.summary();
    assert_eq!((s.requests, s.unique_blocks), (3, 5));
    assert!((s.ideal_hit_rate - 1024.0 / 3148.0).abs() < 1e-12);
}
