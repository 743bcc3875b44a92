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
//! - [`observation`]: heartbeat payloads; [`calibration`]: EWMA cost calibration;
//! - [`skulk`]: the Skulk-compatible management API types (both dialects);
//! - [`evidence`]: the evidence reducer and readiness verdicts;
//! - [`placement`]: the exact-placement workflow (fence, submit, reconcile, probe).

pub mod calibration;
pub mod candidate;
pub mod capacity;
pub mod chunk;
pub mod evidence;
pub mod ids;
pub mod observation;
pub mod placement;
pub mod request;
pub mod skulk;
pub mod time;
