//! A slice of a trace, scaled in time and in length, for replaying on real agents.
//!
//! Real agents run in real time, so an hour of trace at 12 k-token prompts is out of
//! reach of a validation run. A [`ScaledTrace`] keeps what routing depends on — which
//! requests share which prefixes, in which order, and the ratios between prompt lengths,
//! output lengths and arrival gaps — and shrinks the rest:
//!
//! - **time**: arrivals are measured from the slice's first request and divided by the
//!   time scale (`2` replays twice as fast);
//! - **length**: every 512-token hash block becomes `round(512 / length_scale)` tokens
//!   (the *scaled block*), a partial last block the same fraction of it (rounded up, so
//!   at least one token), and every output length the same fraction (at least one).
//!
//! Hash ids are kept as they are and expanded with [`expand_blocks`] at the scaled block
//! size, so equal hash-id prefixes still give equal token prefixes: the prefix sharing
//! of the slice is exactly the trace's. With the agents' chunk size equal to the scaled
//! block, one trace block is one chunk on the real cluster and one block in the fleet
//! simulator, so both reuse at the same boundaries.

use serde::{Deserialize, Serialize};

use super::trace::{BlockRequest, MOONCAKE_BLOCK_TOKENS, Trace, Workload, expand_blocks};
use den_protocol::request::Token;

/// Which requests of a trace to take, in replay order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SliceSpec {
    /// Skip requests that arrive before this many seconds into the trace.
    pub start_s: f64,
    /// Take at most this many requests.
    pub requests: Option<usize>,
    /// Take only requests arriving within this many seconds of `start_s`.
    pub window_s: Option<f64>,
}

/// How much to compress time and shorten lengths.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Scale {
    /// Arrival gaps are divided by this (> 0).
    pub time: f64,
    /// Block, prompt and output lengths are divided by this (1 ≤ it ≤ 512).
    pub length: f64,
}

/// A slice or scale that cannot be replayed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScaleError {
    #[error("time scale {0} is invalid: give a positive number (2 replays twice as fast)")]
    Time(f64),
    #[error(
        "length scale {0} is invalid: give a number from 1 to 512 (8 makes every 512-token block 64 tokens)"
    )]
    Length(f64),
    #[error("slice {what} = {value} is invalid: give a non-negative number")]
    Bound { what: &'static str, value: f64 },
    #[error(
        "the slice is empty: no request arrives at or after {start_s} s{window} (the trace ends at {end_s:.1} s)"
    )]
    Empty {
        start_s: f64,
        window: String,
        end_s: f64,
    },
}

/// One request of a scaled slice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaledRequest {
    /// The trace line it came from (1-based).
    pub line: usize,
    /// Arrival in microseconds from the slice's first request, after time scaling.
    pub arrival_us: u64,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// The trace's hash ids, unchanged (one per scaled block).
    pub hash_ids: Vec<u64>,
    /// Lengths before scaling.
    pub trace_input_tokens: u32,
    pub trace_output_tokens: u32,
}

/// A slice of a trace after scaling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaledTrace {
    pub scale: Scale,
    /// Tokens per hash block after scaling.
    pub block_tokens: u32,
    /// When the slice's first request arrives in the trace, ms.
    pub trace_start_ms: u64,
    pub requests: Vec<ScaledRequest>,
}

/// The requests of `trace` that `spec` selects, in replay order.
pub fn slice(trace: &Trace, spec: &SliceSpec) -> Result<Trace, ScaleError> {
    let bound = |what, v: f64| {
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(ScaleError::Bound { what, value: v })
        }
    };
    let start_ms = (bound("start", spec.start_s)? * 1000.0).round() as u64;
    let end_ms = match spec.window_s {
        Some(w) => Some(start_ms.saturating_add((bound("window", w)? * 1000.0).round() as u64)),
        None => None,
    };
    let take = spec.requests.unwrap_or(usize::MAX);
    let mut out = Trace {
        requests: Vec::new(),
        lines: Vec::new(),
    };
    for (r, &line) in trace.requests.iter().zip(&trace.lines) {
        if out.requests.len() >= take {
            break;
        }
        if r.timestamp < start_ms || end_ms.is_some_and(|e| r.timestamp >= e) {
            continue;
        }
        out.requests.push(r.clone());
        out.lines.push(line);
    }
    if out.requests.is_empty() {
        return Err(ScaleError::Empty {
            start_s: spec.start_s,
            window: spec
                .window_s
                .map(|w| format!(" within {w} s"))
                .unwrap_or_default(),
            end_s: trace.requests.last().map_or(0, |r| r.timestamp) as f64 / 1000.0,
        });
    }
    Ok(out)
}

impl Scale {
    /// Tokens per hash block after scaling: `round(512 / length)`, at least 1.
    pub fn block_tokens(&self) -> u32 {
        ((MOONCAKE_BLOCK_TOKENS as f64 / self.length).round() as u32).max(1)
    }

    fn check(&self) -> Result<(), ScaleError> {
        if !(self.time.is_finite() && self.time > 0.0) {
            return Err(ScaleError::Time(self.time));
        }
        if !(self.length.is_finite() && (1.0..=MOONCAKE_BLOCK_TOKENS as f64).contains(&self.length))
        {
            return Err(ScaleError::Length(self.length));
        }
        Ok(())
    }
}

impl ScaledTrace {
    /// Scales every request of `trace` (usually a [`fn@slice`]).
    pub fn new(trace: &Trace, scale: Scale) -> Result<ScaledTrace, ScaleError> {
        scale.check()?;
        let block = scale.block_tokens();
        let full = MOONCAKE_BLOCK_TOKENS;
        let t0 = trace.requests.first().map_or(0, |r| r.timestamp);
        let requests = trace
            .requests
            .iter()
            .zip(&trace.lines)
            .map(|(r, &line)| {
                let blocks = r.hash_ids.len() as u32;
                // A parsed trace has ceil(input / 512) ids, so the last block holds
                // 1..=512 tokens; it keeps its fraction of the scaled block.
                let last = r
                    .input_length
                    .saturating_sub(blocks.saturating_sub(1) * full)
                    .clamp(1, full);
                let last_scaled = (last as u64 * block as u64).div_ceil(full as u64) as u32;
                let input = blocks.saturating_sub(1) * block + last_scaled;
                let output =
                    ((r.output_length as f64 * block as f64 / full as f64).round() as u32).max(1);
                let gap_ms = r.timestamp.saturating_sub(t0) as f64;
                ScaledRequest {
                    line,
                    arrival_us: (gap_ms * 1000.0 / scale.time).round() as u64,
                    input_tokens: input.max(1),
                    output_tokens: output,
                    hash_ids: r.hash_ids.clone(),
                    trace_input_tokens: r.input_length,
                    trace_output_tokens: r.output_length,
                }
            })
            .collect();
        Ok(ScaledTrace {
            scale,
            block_tokens: block,
            trace_start_ms: t0,
            requests,
        })
    }

    /// The simulator's view of the slice (one block per scaled hash block).
    pub fn workload(&self) -> Workload {
        Workload::from_blocks(
            self.requests.iter().map(|r| BlockRequest {
                arrival_us: r.arrival_us,
                input_tokens: r.input_tokens,
                output_tokens: r.output_tokens,
                hash_ids: &r.hash_ids,
                line: r.line,
            }),
            self.block_tokens,
        )
    }

    /// The prompt tokens of request `i` (empty when out of range).
    pub fn tokens(&self, i: usize) -> Vec<Token> {
        self.requests.get(i).map_or_else(Vec::new, |r| {
            expand_blocks(&r.hash_ids, r.input_tokens, self.block_tokens)
        })
    }

    /// Seconds from the first arrival to the last, after scaling.
    pub fn duration_s(&self) -> f64 {
        self.requests.last().map_or(0, |r| r.arrival_us) as f64 / 1e6
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceRequest;

    fn req(timestamp: u64, input_length: u32, output_length: u32, ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp,
            input_length,
            output_length,
            hash_ids: ids.to_vec(),
        }
    }

    fn trace(requests: Vec<TraceRequest>) -> Trace {
        Trace {
            lines: (1..=requests.len()).collect(),
            requests,
        }
    }

    /// Two turns of one conversation and an unrelated request sharing the root block
    /// (whose last block is partial).
    fn conversation() -> Trace {
        trace(vec![
            req(1_000, 1536, 100, &[1, 2, 3]),
            req(1_500, 700, 7, &[1, 9]),
            req(3_000, 2100, 40, &[1, 2, 3, 4, 5]),
        ])
    }

    #[test]
    fn lengths_and_times_scale_and_the_last_block_keeps_its_fraction() {
        let s = ScaledTrace::new(
            &conversation(),
            Scale {
                time: 2.0,
                length: 8.0,
            },
        )
        .unwrap();
        assert_eq!(s.block_tokens, 64);
        let r = &s.requests;
        // Three full blocks; 100 / 8 = 12.5 rounds to 13.
        assert_eq!((r[0].input_tokens, r[0].output_tokens), (192, 13));
        // 700 = 512 + 188 → 64 + ceil(188 / 8) = 88; 7 / 8 rounds to 1 (never 0).
        assert_eq!((r[1].input_tokens, r[1].output_tokens), (88, 1));
        assert_eq!(r[2].input_tokens, 4 * 64 + 7);
        // Arrivals from the slice start, compressed 2×.
        let at: Vec<u64> = r.iter().map(|r| r.arrival_us).collect();
        assert_eq!(at, [0, 250_000, 1_000_000]);
        assert_eq!(s.trace_start_ms, 1_000);
        assert!((s.duration_s() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn scaling_keeps_prefix_sharing_exactly() {
        for length in [1.0, 4.0, 8.0, 32.0, 512.0] {
            let s = ScaledTrace::new(&conversation(), Scale { time: 1.0, length }).unwrap();
            let b = s.block_tokens as usize;
            let (t0, t1, t2) = (s.tokens(0), s.tokens(1), s.tokens(2));
            assert_eq!(t0.len() as u32, s.requests[0].input_tokens);
            assert_eq!(t2.len() as u32, s.requests[2].input_tokens);
            // The second turn starts with the whole first turn (ids 1, 2, 3), then goes on.
            let shared =
                |a: &[Token], c: &[Token]| a.iter().zip(c).take_while(|(x, y)| x == y).count();
            assert_eq!(shared(&t0, &t2), t0.len(), "length {length}");
            assert!(t2.len() > t0.len());
            // The other request shares exactly the root block, then differs.
            assert_eq!(shared(&t0, &t1), b.min(t1.len()), "length {length}");
            // The simulator sees the same sharing, block for block.
            let w = s.workload();
            let blocks: Vec<&[u32]> = w.requests.iter().map(|r| w.blocks(r)).collect();
            assert_eq!(blocks[2][..3], blocks[0][..]);
            assert_eq!(blocks[1][0], blocks[0][0]);
            assert_ne!(blocks[1][1], blocks[0][1]);
            let tokens: Vec<u32> = w.requests.iter().map(|r| r.input_tokens).collect();
            let expected: Vec<u32> = s.requests.iter().map(|r| r.input_tokens).collect();
            assert_eq!(tokens, expected);
            let in_blocks: u32 = blocks[0].iter().map(|&x| w.block_tokens(x)).sum();
            assert_eq!(in_blocks, s.requests[0].input_tokens);
        }
    }

    #[test]
    fn slices_select_by_start_count_and_window() {
        let t = conversation();
        let all = SliceSpec {
            start_s: 0.0,
            requests: None,
            window_s: None,
        };
        assert_eq!(slice(&t, &all).unwrap().requests.len(), 3);
        let later = SliceSpec {
            start_s: 1.2,
            ..all
        };
        assert_eq!(slice(&t, &later).unwrap().lines, vec![2, 3]);
        let one = SliceSpec {
            requests: Some(1),
            ..later
        };
        assert_eq!(slice(&t, &one).unwrap().lines, vec![2]);
        let window = SliceSpec {
            window_s: Some(1.6),
            ..all
        };
        assert_eq!(slice(&t, &window).unwrap().lines, vec![1, 2]);
        let e = slice(
            &t,
            &SliceSpec {
                start_s: 10.0,
                ..all
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("ends at 3.0 s"), "{e}");
        assert!(
            slice(
                &t,
                &SliceSpec {
                    start_s: -1.0,
                    ..all
                }
            )
            .is_err()
        );
    }

    #[test]
    fn bad_scales_are_refused_with_what_to_give() {
        let t = conversation();
        for (time, length) in [(0.0, 8.0), (f64::NAN, 8.0), (1.0, 0.5), (1.0, 1000.0)] {
            let e = ScaledTrace::new(&t, Scale { time, length }).unwrap_err();
            assert!(e.to_string().contains("give a"), "{e}");
        }
    }
}
