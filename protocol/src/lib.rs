//! den's pure core.
//!
//! Everything in this crate can be decided without I/O: no tokio, no sockets, no clocks,
//! no GPU. State machines take the current logical time as an argument and return effects;
//! runtimes (the agent, the console, the simulator) interpret those effects.
//!
//! Map:
//! - [`ids`], [`time`], [`request`]: identities, logical time, validated requests;
//! - [`candidate`]: candidates, estimates (predicted TTFT) and ranking;
//! - [`chunk`]: chained prefix hashes at a fixed chunk size;
//! - [`chunk_catalog`]: the chunk catalog (published chunks and their replicas);
//! - [`candidate_generation`]: a request's candidates from observations and the chunk
//!   catalog;
//! - [`discovery`]: the discovery registry and connection-bound routes;
//! - [`pool`]: page-pool accounting (routes, forks, copy-on-write, reservations, eviction);
//! - [`observation`]: heartbeat payloads; [`calibration`]: EWMA cost calibration;
//! - [`capacity`]: the seam between the worker machine and page accounting;
//! - [`wire`]: control-channel frames and their codec;
//! - [`router`], [`worker`]: the router and worker state machines; [`decision`]: the
//!   router's decision records;
//! - [`router_node`]: the whole router — the router machine, discovery, the chunk
//!   catalog, candidates, in-flight work, speculative prefixes, pinning, fencing — as one
//!   machine with one `handle`;
//! - [`sim`]: the deterministic simulator that drives both machines;
//! - [`skulk`]: the Skulk-compatible management API types (both dialects);
//! - [`evidence`]: the evidence reducer and readiness verdicts;
//! - [`placement`]: the exact-placement workflow (fence, submit, reconcile, probe);
//! - [`feed`]: the console feed a den router streams to consoles;
//! - [`session`]: the console's stamped input events (what recordings store);
//! - [`recording`]: the recording file format (header, lines, version policy, redaction).
//!
//! The fleet study (routing policies compared on production traces) reads this crate
//! but is not part of what runs; it is the `den-fleet` crate.

pub mod calibration;
pub mod candidate;
pub mod candidate_generation;
pub mod capacity;
pub mod chunk;
pub mod chunk_catalog;
pub mod decision;
pub mod discovery;
pub mod engine_plan;
pub mod evidence;
pub mod feed;
pub mod ids;
pub mod observation;
pub mod placement;
pub mod pool;
pub mod recording;
pub mod request;
pub mod router;
pub mod router_node;
pub mod session;
pub mod sim;
pub mod skulk;
pub mod text;
pub mod time;
pub mod wire;
pub mod worker;
