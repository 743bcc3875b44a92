//! The agent crate's one integration-test binary: a module per area, so the suite links
//! once per crate instead of once per file.
// A test may unwrap, expect and panic: a failure is the point. Clippy's allow-*-in-tests
// covers #[test] functions; this covers the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod ingress_common;

mod ingress_bad_bodies;
mod ingress_cancel;
mod ingress_http;
mod ingress_openai_client;
mod router_fallback;
#[cfg(feature = "cuda")]
mod serving_cuda;
// Without the feature the backend is absent: `memory/cuda_absent.rs` tests its error.
#[cfg(feature = "cuda")]
mod storage_cuda;
mod storage_restore;
mod storage_s3;
mod systemd_units;
