//! A GGUF (v2, v3, little-endian) reader.
//!
//! Layout (all little-endian): magic `GGUF`, version u32, tensor count u64, metadata count
//! u64; the metadata entries (key string, value type u32, value); the tensor infos (name
//! string, dims count u32, dims u64 each, ggml type u32, offset u64 into the data
//! section); padding to `general.alignment` (default 32); the data section. A string is a
//! u64 length and UTF-8 bytes; an array is an element type u32, a count u64, the elements.
//!
//! [`Gguf::parse`] reads any byte slice; [`GgufFile`] holds the bytes (a memory map from
//! [`GgufFile::open`], or a `Vec` from [`GgufFile::from_bytes`]) and hands out
//! [`Tensor`] views that borrow them.

mod error;
mod file;
mod metadata;
mod parse;
mod reader;
mod tensor;

pub use error::{ErrorKind, GgufError};
pub use file::GgufFile;
pub use metadata::{Array, MAX_ARRAY_DEPTH, MetaError, Metadata, Value, ValueType};
pub use parse::{DEFAULT_ALIGNMENT, Gguf, MAX_DIMS};
pub use tensor::{Tensor, TensorInfo};
