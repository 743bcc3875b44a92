//! End-to-end test helpers: start den's real binaries on loopback.

pub mod agents;
