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
//! - [`fleet`]: routing policies compared on a production trace in a fleet simulator.

pub mod calibration;
pub mod candidate;
pub mod capacity;
pub mod chunk;
pub mod fleet;
pub mod ids;
pub mod observation;
pub mod request;
pub mod time;
