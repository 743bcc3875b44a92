//! den's model files: what a worker needs to run a real model's weights.
//!
//! What exists:
//! - [`gguf`]: a GGUF v2/v3 reader. [`gguf::GgufFile::open`] memory-maps a file and parses
//!   its header, metadata (every value type, typed accessors such as
//!   `get_u32("llama.block_count")`) and tensor table; tensor data are `&[u8]` views into
//!   the map. [`gguf::Gguf::parse`] parses any byte slice (tests, fuzzing). Hostile input
//!   gets a one-line error naming the file, never a panic or an outsized allocation.
//! - [`quant`]: dequantizers to f32 for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K,
//!   whole tensors or one row at a time, bit-for-bit equal to ggml's reference
//!   dequantizers (checked against gguf-py on real tensors: `tests/it/dequant.rs`); block
//!   geometry and tensor byte sizes for every ggml type ([`GgmlType`]).
//! - [`fingerprint::weights_digest`]: SHA-256 over the tensor table and data.
//! - [`tokenizer`]: [`tokenizer::Tokenizer`] from a GGUF's vocabulary (SmolLM2's
//!   byte-level BPE, Gemma 3's SentencePiece) or a `tokenizer.json`, on the Hugging Face
//!   `tokenizers` crate, tokenizing exactly as llama.cpp does (`tests/it/tokenizer.rs`
//!   against `llama-tokenize`); decoding and streaming detokenization that never splits
//!   a UTF-8 character ([`tokenizer::Detokenizer`]).
//! - [`template`]: chat templates: the GGUF's Jinja `tokenizer.chat_template` (minijinja),
//!   or hand-written ChatML and Gemma turns that produce the same text.
//! - [`sample`]: greedy, temperature, top-k, top-p, min-p sampling with a seeded PRNG, and
//!   [`sample::Generation`], the sans-IO generation loop (stop strings across token
//!   boundaries, stop tokens, EOS, `max_tokens`).
//!
//! - [`arch`]: the CPU forward pass of `llama` (SmolLM2) and `gemma3`: [`Model::load`]
//!   maps and checks the tensors (weights stay encoded in the map), [`Runner`] runs
//!   [`Runner::prefill`], [`Runner::decode`] and the batched [`Runner::forward`] (rows of
//!   several sequences share each weight pass), on [`ops`]: integer dots of 8-bit
//!   activations with the quantized weights (AVX2, or portable), a persistent thread pool,
//!   paged attention with GQA and sliding windows. Checked against a naive reference on
//!   synthetic models (`tests/it/forward.rs`) and against llama.cpp on the real files
//!   (`tests/it/forward_real.rs`, `tests/golden/llamacpp_*.json`).
//! - [`kv`]: the KV cache in den's pages: one f16 row per token,
//!   `[layer][K|V][kv_head][head_dim]`, read through a sequence's page table
//!   ([`KvPages`], [`Sequence`], [`HostKvPages`]), named by [`kv::kv_fingerprint`] (the
//!   weights digest with the KV dtype and row layout).
//!
//! - `gpu` (feature `cuda`): the same forward pass on an NVIDIA GPU, K and V in den's
//!   page arena on the device.
//!
//! The real-model tests need `tests/fetch-models` (it prints the `DEN_TEST_MODELS` to set).

pub mod arch;
pub mod fingerprint;
pub mod ggml_type;
pub mod gguf;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod gpu_plan;
pub mod kv;
pub mod ops;
pub mod quant;
pub mod sample;
pub mod template;
pub mod tokenizer;

pub use arch::{BatchRow, Model, ModelError, Runner, RunnerOptions};
pub use fingerprint::weights_digest;
pub use ggml_type::GgmlType;
pub use gguf::{GgufError, GgufFile};
pub use kv::{HostKvPages, KvLayout, KvPages, Sequence};
