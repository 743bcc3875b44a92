//! den-model's one integration-test binary (the house rule: one per crate, a module per
//! area): the GGUF reader on bytes built here, and the dequantizers and reader against
//! gguf-py's golden data (`../golden/`) and, with `DEN_TEST_MODELS`, the real model files.
// A test may unwrap, expect and panic: a failure is the point. Clippy's allow-*-in-tests
// covers #[test] functions; this covers the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod attention;
mod dequant;
mod forward;
mod forward_real;
mod gguf_reader;
mod golden;
#[cfg(feature = "cuda")]
mod gpu;
mod gpu_emulated;
mod sample;
mod template;
mod tiny;
mod tokenizer;
