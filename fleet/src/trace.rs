//! Mooncake-format traces: parsing, token expansion, and the interned block workload.
//!
//! One request per line: `{"timestamp", "input_length", "output_length", "hash_ids"}`
//! (`tests/fixtures/mooncake/README.md`). Timestamps are milliseconds from the start;
//! each hash id names one 512-token block of the prompt, the last block possibly partial.
//! Equal ids at equal positions under equal parents mean an equal, reusable KV prefix.
//!
//! The simulator never materialises tokens: it works on *blocks*, each identified by
//! the chain of hash ids from the root to it (so equal ids under different parents
//! never alias). [`expand_tokens`] gives the exact token sequence for code that needs
//! one, with the property the cache relies on: equal hash-id prefixes give equal token
//! prefixes.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use den_protocol::request::Token;

/// Tokens per hash id in the Mooncake traces.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// Vocabulary the expanded tokens are drawn from (Llama-3's 128,256 ids), so that an
/// expanded prompt is a plausible token sequence for an 8B-class model.
pub const EXPANSION_VOCAB: u32 = 128_256;

/// One request line of a Mooncake trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Arrival in milliseconds from the start of the trace.
    pub timestamp: u64,
    pub input_length: u32,
    pub output_length: u32,
    pub hash_ids: Vec<u64>,
}

/// A parsed trace: requests in replay order (by timestamp, then line), with the
/// 1-based line each came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    pub requests: Vec<TraceRequest>,
    pub lines: Vec<usize>,
}

/// A trace line that cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error(
        "trace line {line}: expected a JSON object with timestamp, input_length, output_length \
         and hash_ids ({message})"
    )]
    Malformed { line: usize, message: String },
    #[error("trace line {line}: input_length is 0; every request needs at least one prompt token")]
    EmptyPrompt { line: usize },
    #[error("trace line {line}: output_length is 0; every request generates at least one token")]
    NoOutput { line: usize },
    #[error(
        "trace line {line}: {found} hash ids for input_length {input_length}; at {block} tokens \
         per block that needs exactly {expected}"
    )]
    BlockCount {
        line: usize,
        input_length: u32,
        block: u32,
        found: usize,
        expected: u64,
    },
    #[error("trace has no request lines: give a file with one JSON request per line")]
    Empty,
}

impl Trace {
    /// Parses a whole trace. Blank lines are skipped; every other line must be a valid
    /// request. Requests are stably sorted by timestamp so that an unsorted file replays
    /// in arrival order.
    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        let mut rows = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            if raw.trim().is_empty() {
                continue;
            }
            rows.push((parse_line(raw, line)?, line));
        }
        if rows.is_empty() {
            return Err(TraceError::Empty);
        }
        rows.sort_by_key(|(r, line)| (r.timestamp, *line));
        let (requests, lines) = rows.into_iter().unzip();
        Ok(Trace { requests, lines })
    }

    /// The first `n` requests in replay order (a slice of the trace for quick runs).
    pub fn truncated(mut self, n: usize) -> Trace {
        self.requests.truncate(n);
        self.lines.truncate(n);
        self
    }
}

/// Parses one trace line (`line` is 1-based, for the error message).
pub fn parse_line(raw: &str, line: usize) -> Result<TraceRequest, TraceError> {
    let r: TraceRequest = serde_json::from_str(raw).map_err(|e| TraceError::Malformed {
        line,
        message: e.to_string(),
    })?;
    if r.input_length == 0 {
        return Err(TraceError::EmptyPrompt { line });
    }
    if r.output_length == 0 {
        return Err(TraceError::NoOutput { line });
    }
    let expected = (r.input_length as u64).div_ceil(MOONCAKE_BLOCK_TOKENS as u64);
    if r.hash_ids.len() as u64 != expected {
        return Err(TraceError::BlockCount {
            line,
            input_length: r.input_length,
            block: MOONCAKE_BLOCK_TOKENS,
            found: r.hash_ids.len(),
            expected,
        });
    }
    Ok(r)
}

/// Token `i` (0-based within its block) of the block named `hash_id`: a splitmix64 of
/// `(hash_id, i)` reduced to the vocabulary. Depends on nothing else, so equal ids give
/// equal tokens wherever they occur.
pub fn block_token(hash_id: u64, i: u32) -> Token {
    let mixed = splitmix64(splitmix64(hash_id) ^ (i as u64).wrapping_mul(0xd6e8_feb8_6659_fd93));
    (mixed % EXPANSION_VOCAB as u64) as Token
}

/// The `input_length` tokens of a request: every hash id expanded into 512 tokens, the
/// last block truncated.
pub fn expand_tokens(request: &TraceRequest) -> Vec<Token> {
    expand_blocks(
        &request.hash_ids,
        request.input_length,
        MOONCAKE_BLOCK_TOKENS,
    )
}

/// `input_tokens` tokens from `hash_ids` at `block_tokens` tokens per hash id, the last
/// block truncated: hash id `h` always expands to the first tokens of the same sequence
/// ([`block_token`]), so equal hash-id prefixes give equal token prefixes at any block
/// size (a scaled trace, [`super::scale`], keeps the trace's prefix sharing exactly).
pub fn expand_blocks(hash_ids: &[u64], input_tokens: u32, block_tokens: u32) -> Vec<Token> {
    let block = block_tokens.max(1) as usize;
    let mut out = Vec::with_capacity(input_tokens as usize);
    for &id in hash_ids {
        let left = (input_tokens as usize).saturating_sub(out.len());
        let take = left.min(block) as u32;
        out.extend((0..take).map(|i| block_token(id, i)));
    }
    out
}

/// The chain key of a block: its parent's key mixed with its own hash id. Keys of equal
/// id sequences are equal; a shared id under a different parent gets a different key.
pub fn chain_key(parent: u64, hash_id: u64) -> u64 {
    splitmix64(parent.rotate_left(29) ^ splitmix64(hash_id ^ 0x9e37_79b9_7f4a_7c15))
}

/// splitmix64 (Steele, Lea, Flood 2014): a fast, well-mixed 64-bit bijection.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One request of a [`Workload`], in replay order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkRequest {
    /// Arrival in microseconds from the start.
    pub arrival_us: u64,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// The trace line it came from (1-based).
    pub line: usize,
    blocks_start: u32,
    blocks_len: u32,
}

/// One request for [`Workload::from_blocks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRequest<'a> {
    /// Arrival in microseconds from the start.
    pub arrival_us: u64,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// One id per block of the prompt, root first.
    pub hash_ids: &'a [u64],
    /// The trace line it came from (1-based).
    pub line: usize,
}

/// Totals of a trace, for reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceSummary {
    pub requests: usize,
    pub duration_s: f64,
    pub mean_input_tokens: f64,
    pub mean_output_tokens: f64,
    pub unique_blocks: usize,
    /// Prompt tokens an infinite, shared, instantly available cache would serve: the
    /// upper bound on any policy's prefix hit rate.
    pub ideal_hit_rate: f64,
}

/// A trace with every block interned to a dense index: what the simulator replays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub requests: Vec<WorkRequest>,
    blocks: Vec<u32>,
    block_tokens: Vec<u16>,
}

impl Workload {
    /// Interns every block chain of `trace`. Block indices follow first appearance, so
    /// the result depends only on the trace.
    pub fn from_trace(trace: &Trace) -> Workload {
        Workload::from_blocks(
            trace
                .requests
                .iter()
                .zip(&trace.lines)
                .map(|(r, &line)| BlockRequest {
                    arrival_us: r.timestamp.saturating_mul(1000),
                    input_tokens: r.input_length,
                    output_tokens: r.output_length,
                    hash_ids: &r.hash_ids,
                    line,
                }),
            MOONCAKE_BLOCK_TOKENS,
        )
    }

    /// Interns requests whose hash ids name `block_tokens`-token blocks (the last one
    /// possibly partial), in the order given (replay order). [`Workload::from_trace`] is
    /// this at 512 tokens per block; a scaled trace ([`super::scale`]) uses a shorter one.
    pub fn from_blocks<'a>(
        requests: impl IntoIterator<Item = BlockRequest<'a>>,
        block_tokens: u32,
    ) -> Workload {
        // Blocks longer than u16 tokens are never produced: traces use 512.
        let block_size = block_tokens.clamp(1, u16::MAX as u32);
        let mut index: HashMap<u64, u32> = HashMap::new();
        let mut blocks = Vec::new();
        let mut block_tokens: Vec<u16> = Vec::new();
        let mut out = Vec::new();
        for r in requests {
            let start = blocks.len() as u32;
            let mut parent = 0u64;
            let mut left = r.input_tokens;
            for &id in r.hash_ids {
                let key = chain_key(parent, id);
                parent = key;
                let tokens = left.min(block_size) as u16;
                left -= tokens as u32;
                let next = block_tokens.len() as u32;
                let b = *index.entry(key).or_insert(next);
                if b == next {
                    block_tokens.push(tokens);
                } else if let Some(t) = block_tokens.get_mut(b as usize) {
                    // A block that is partial in one request and full in a later one
                    // (only possible with a hash collision in the trace): keep the larger.
                    *t = (*t).max(tokens);
                }
                blocks.push(b);
            }
            out.push(WorkRequest {
                arrival_us: r.arrival_us,
                input_tokens: r.input_tokens,
                output_tokens: r.output_tokens,
                line: r.line,
                blocks_start: start,
                blocks_len: blocks.len() as u32 - start,
            });
        }
        Workload {
            requests: out,
            blocks,
            block_tokens,
        }
    }

    /// The first `n` requests only (a prefix of the replay).
    pub fn truncated(&self, n: usize) -> Workload {
        let mut w = self.clone();
        w.requests.truncate(n);
        w
    }

    /// The block indices of request `r`, root first.
    pub fn blocks(&self, r: &WorkRequest) -> &[u32] {
        let start = r.blocks_start as usize;
        self.blocks
            .get(start..start + r.blocks_len as usize)
            .unwrap_or(&[])
    }

    /// Distinct blocks in the whole trace (the size of per-block state arrays).
    pub fn block_count(&self) -> usize {
        self.block_tokens.len()
    }

    /// Tokens in block `b` (512 except a partial last block).
    pub fn block_tokens(&self, b: u32) -> u32 {
        self.block_tokens.get(b as usize).copied().unwrap_or(0) as u32
    }

    /// For each request, the prompt tokens an infinite cache shared by all workers would
    /// hold when it arrives: its longest block prefix seen in any earlier request, capped
    /// so the last block is recomputed (as every worker does).
    pub fn ideal_reuse(&self) -> Vec<u32> {
        let mut seen = vec![false; self.block_count()];
        let mut out = Vec::with_capacity(self.requests.len());
        for r in &self.requests {
            let chain = self.blocks(r);
            let cap = chain.len().saturating_sub(1);
            let mut matched = 0u32;
            for &b in chain.iter().take(cap) {
                if !seen.get(b as usize).is_some_and(|s| *s) {
                    break;
                }
                matched += self.block_tokens(b);
            }
            out.push(matched);
            for &b in chain {
                if let Some(s) = seen.get_mut(b as usize) {
                    *s = true;
                }
            }
        }
        out
    }

    pub fn summary(&self) -> TraceSummary {
        let n = self.requests.len();
        let first = self.requests.first().map_or(0, |r| r.arrival_us);
        let last = self.requests.last().map_or(0, |r| r.arrival_us);
        let input: u64 = self.requests.iter().map(|r| r.input_tokens as u64).sum();
        let output: u64 = self.requests.iter().map(|r| r.output_tokens as u64).sum();
        let reusable: u64 = self.ideal_reuse().iter().map(|&t| t as u64).sum();
        let mut seen = vec![false; self.block_count()];
        let mut unique = 0usize;
        for r in &self.requests {
            for &b in self.blocks(r) {
                if let Some(s) = seen.get_mut(b as usize)
                    && !*s
                {
                    *s = true;
                    unique += 1;
                }
            }
        }
        let per = |x: u64| if n == 0 { 0.0 } else { x as f64 / n as f64 };
        TraceSummary {
            requests: n,
            duration_s: (last - first) as f64 / 1e6,
            mean_input_tokens: per(input),
            mean_output_tokens: per(output),
            unique_blocks: unique,
            ideal_hit_rate: if input == 0 {
                0.0
            } else {
                reusable as f64 / input as f64
            },
        }
    }
}
