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
//! - [`pool`]: page-pool accounting (routes, forks, copy-on-write, reservations, eviction);
//! - [`observation`]: heartbeat payloads; [`calibration`]: EWMA cost calibration.

pub mod calibration;
pub mod candidate;
pub mod candidates;
pub mod capacity;
pub mod chunk;
pub mod discovery;
pub mod ids;
pub mod observation;
pub mod pool;
pub mod request;
pub mod time;
