//! Decoding the frames a router receives on every request:
//! `cargo bench -p den-protocol --bench wire`.
//!
//! A publication carries the chunks a completed request left: 16 (an 8 k-token prompt in
//! 512-token chunks) and 512 (the most one frame carries). The chunks here are 16 tokens
//! long; a frame's size and decoding cost depend on how many chunks it holds, not on
//! their length (a few digits of `start` and `token_count`).
// A benchmark may unwrap, expect and panic: a broken set-up should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use divan::{Bencher, black_box};

use den_protocol::candidate::Tier;
use den_protocol::chunk::plan_chunks;
use den_protocol::chunk_catalog::ChunkEntry;
use den_protocol::ids::AssignmentId;
use den_protocol::wire::{
    DEFAULT_MAX_FRAME, Publish, PublishedChunk, Retract, RetractedChunk, ToRouter, TokenDelta,
    decode_for_router, encode_text,
};

/// The allocator den-agent runs with (`agent/src/lib.rs`), so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    divan::main();
}

fn chunks(n: usize) -> Vec<PublishedChunk> {
    let tokens: Vec<u32> = (0..(n * 16) as u32).collect();
    plan_chunks(&tokens, 16)
        .into_iter()
        .map(|d| PublishedChunk {
            entry: ChunkEntry {
                model: "llama-3.1-8b".into(),
                hash: d.hash,
                parent: d.parent,
                start: d.start,
                token_count: d.token_count,
                bytes: 64 * 1024,
                object: true,
            },
            tiers: vec![Tier::Ram, Tier::Ssd],
        })
        .collect()
}

fn decode(bencher: Bencher, frame: &ToRouter) {
    let text = encode_text(frame).unwrap();
    bencher.bench(|| decode_for_router(black_box(text.as_bytes()), DEFAULT_MAX_FRAME).unwrap());
}

#[divan::bench(args = [16, 512])]
fn publish(bencher: Bencher, n: usize) {
    decode(bencher, &ToRouter::Publish(Publish { chunks: chunks(n) }));
}

#[divan::bench(args = [16, 512])]
fn retract(bencher: Bencher, n: usize) {
    let chunks = chunks(n)
        .into_iter()
        .map(|c| RetractedChunk {
            model: c.entry.model,
            hash: c.entry.hash,
            tier: Tier::Ssd,
        })
        .collect();
    decode(bencher, &ToRouter::Retract(Retract { chunks }));
}

#[divan::bench]
fn token(bencher: Bencher) {
    let frame = ToRouter::Token(TokenDelta {
        assignment: AssignmentId::new("chatcmpl-5f0c2a", 1),
        token: 1234,
        index: 17,
    });
    decode(bencher, &frame);
}
