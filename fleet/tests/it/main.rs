//! The fleet crate's one integration-test binary: a module per area, so the suite links
//! once per crate instead of once per file.
// A test may unwrap, expect and panic: a failure is the point. Clippy's allow-*-in-tests
// covers #[test] functions; this covers the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fleet_cache;
mod fleet_plan;
mod fleet_policies;
mod fleet_replay;
mod fleet_synthetic;
mod fleet_trace;
