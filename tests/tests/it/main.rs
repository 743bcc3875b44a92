//! The tests crate's one integration-test binary: a module per area, so the suite links
//! once per crate instead of once per file.
// A test may unwrap, expect and panic: a failure is the point. Clippy's allow-*-in-tests
// covers #[test] functions; this covers the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod agents_burst;
mod agents_cli;
mod agents_limits;
mod agents_openai_client;
mod agents_protocol;
mod agents_real_model;
mod agents_reconnect;
mod agents_s3;
mod agents_serving;
mod agents_soak;
mod agents_tls;
mod console_skulk_restart;
mod console_status;
mod console_tmux;
mod fault_matrix;
mod fault_matrix_frames;
mod fault_matrix_storage;
mod manage_api;
mod manage_console;
mod manage_downloads;
mod manage_real_model;
mod placement_workflow_runtime;
mod recording_cli;
mod recording_crash;
mod recording_defaults;
mod recording_fidelity;
mod recording_redaction;
mod validate_real_agents;
