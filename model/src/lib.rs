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
//!
//! What is next (not here yet): the architectures (llama for SmolLM2, gemma3) mapping
//! tensor names and hyperparameters to a forward pass; quantized matmul over rows; the KV
//! cache in den's pages, named by the weights digest with the KV dtype and row layout;
//! tokenizers from the GGUF vocabulary.
//!
//! The real-model tests need `tests/fetch-models` (it prints the `DEN_TEST_MODELS` to set).

pub mod fingerprint;
pub mod ggml_type;
pub mod gguf;
pub mod quant;

pub use fingerprint::weights_digest;
pub use ggml_type::GgmlType;
pub use gguf::{GgufError, GgufFile};
