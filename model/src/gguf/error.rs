//! The reader's errors: one line, naming the file and the problem.

use std::fmt;

use crate::ggml_type::GgmlType;
use crate::quant::QuantError;

/// A GGUF file could not be read or used: `{file}: {kind}`.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {kind}")]
pub struct GgufError {
    /// The file as the caller named it (a path, or the name given to `from_bytes`).
    pub file: String,
    pub kind: ErrorKind,
}

impl GgufError {
    pub(crate) fn new(file: &str, kind: ErrorKind) -> GgufError {
        GgufError {
            file: file.to_owned(),
            kind,
        }
    }
}

/// Where in the file a read was.
#[derive(Debug, Clone, Copy)]
pub(crate) enum At<'a> {
    Header,
    Key(u64),
    Value(&'a str),
    TensorName(u64),
    Tensor(&'a str),
    TensorTable,
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Header => write!(f, "the header"),
            At::Key(i) => write!(f, "the key of metadata entry #{i}"),
            At::Value(key) => write!(f, "the value of metadata {key:?}"),
            At::TensorName(i) => write!(f, "the name of tensor #{i}"),
            At::Tensor(name) => write!(f, "the info of tensor {name:?}"),
            At::TensorTable => write!(f, "the tensor table"),
        }
    }
}

/// What was wrong.
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    #[error("{0}")]
    Io(std::io::Error),
    #[error("not a GGUF file: it starts with \"{}\", not \"GGUF\"", .found.escape_ascii())]
    BadMagic { found: [u8; 4] },
    #[error("big-endian GGUF (version {0} byte-swapped) is not supported")]
    BigEndian(u32),
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("truncated: {what} ends at byte {end} but the file has {len} bytes")]
    Truncated { what: String, end: u128, len: usize },
    #[error(
        "{what}: {count} {items} cannot fit in the {remaining} bytes that follow (each takes at least {min})"
    )]
    CountTooLarge {
        what: String,
        items: &'static str,
        count: u64,
        remaining: usize,
        min: usize,
    },
    #[error("{what}: unknown metadata value type {id}")]
    BadValueType { what: String, id: u32 },
    #[error("{what}: a string that is not UTF-8")]
    BadUtf8 { what: String },
    #[error("{what}: a bool byte of {byte}, expected 0 or 1")]
    BadBool { what: String, byte: u8 },
    #[error("{what}: arrays nested more than {max} deep")]
    TooDeep { what: String, max: usize },
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("general.alignment must be a u32 power of two, found {0}")]
    BadAlignment(String),
    #[error("tensor {name:?} has {n_dims} dimensions, at most {max} are supported")]
    TooManyDims { name: String, n_dims: u32, max: u32 },
    #[error("tensor {name:?} has unknown ggml type {id}")]
    UnknownType { name: String, id: u32 },
    #[error("tensor {name:?}: {source}")]
    BadShape { name: String, source: QuantError },
    #[error("tensor {name:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error(
        "tensor {name:?}: its {n_bytes} bytes at data offset {offset} end at byte {end} but the file has {len} bytes"
    )]
    DataOutOfBounds {
        name: String,
        offset: u64,
        n_bytes: u64,
        end: u128,
        len: usize,
    },
    #[error("tensor name {0:?} appears twice")]
    DuplicateTensor(String),
    #[error("no tensor named {0:?}")]
    NoTensor(String),
    #[error("missing metadata key {0:?}")]
    MissingKey(String),
    #[error("metadata {key:?} is {found}, expected {expected}")]
    WrongType {
        key: String,
        found: String,
        expected: &'static str,
    },
    #[error("tensor {name:?} ({ty}): {source}")]
    Dequantize {
        name: String,
        ty: GgmlType,
        source: QuantError,
    },
}
