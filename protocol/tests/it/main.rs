//! The protocol crate's one integration-test binary: a module per area, so the suite links
//! once per crate instead of once per file.
// A test may unwrap, expect and panic: a failure is the point. Clippy's allow-*-in-tests
// covers #[test] functions; this covers the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// The pure-core rule (protocol/clippy.toml) binds the library; its tests read fixtures.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod common;
mod pool_support;
mod skulk_support;

mod evidence_rules;
mod evidence_runc;
mod manage_protocol;
mod placement_outcomes;
mod placement_workflow;
mod pool_capacity;
mod pool_eviction;
mod pool_pages;
mod pool_props;
mod pool_worker;
mod properties;
mod router_records;
mod router_scenarios;
mod sim_scenarios;
mod skulk_dialect;
mod skulk_fixtures;
mod wire_codec;
mod worker_scenarios;
