//! Parsing a GGUF file's bytes into its layout: header, metadata, tensor table, data offset.
//!
//! Independent of where the bytes live (a memory map, a `Vec`, a fuzzer's slice). Every
//! read is bounds-checked, every size is checked arithmetic, and every count is bounded by
//! the bytes left before anything is allocated for it, so hostile input gets an error,
//! never a panic or an allocation much larger than itself.

use std::collections::HashMap;

use super::error::{At, ErrorKind, GgufError};
use super::metadata::{Metadata, Value};
use super::reader::{Reader, Short};
use super::tensor::TensorInfo;
use crate::ggml_type::GgmlType;
use crate::quant;

/// `general.alignment` when absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// The fewest bytes a metadata entry takes: key length, value type, one byte of value.
const MIN_KV_BYTES: usize = 8 + 4 + 1;
/// The fewest bytes a tensor info takes: name length, dims count, type, offset.
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8;

pub(crate) struct Parser<'a> {
    pub r: Reader<'a>,
}

pub(crate) fn truncated(s: Short, len: usize, at: At<'_>) -> ErrorKind {
    ErrorKind::Truncated {
        what: at.to_string(),
        end: s.end,
        len,
    }
}

impl Parser<'_> {
    pub fn truncated(&self, s: Short, at: At<'_>) -> ErrorKind {
        truncated(s, self.r.len(), at)
    }

    /// `count` items of at least `min` bytes each, refused unless they fit in what is left.
    pub fn count(
        &self,
        count: u64,
        min: usize,
        items: &'static str,
        at: At<'_>,
    ) -> Result<usize, ErrorKind> {
        let remaining = self.r.remaining();
        match usize::try_from(count) {
            Ok(n) if n <= remaining / min => Ok(n),
            _ => Err(ErrorKind::CountTooLarge {
                what: at.to_string(),
                items,
                count,
                remaining,
                min,
            }),
        }
    }

    /// A GGUF string: u64 length, UTF-8 bytes.
    pub fn string(&mut self, at: At<'_>) -> Result<String, ErrorKind> {
        let n = self.r.u64().map_err(|s| self.truncated(s, at))?;
        let bytes = self.r.take(n).map_err(|s| self.truncated(s, at))?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(ErrorKind::BadUtf8 {
                what: at.to_string(),
            }),
        }
    }
}

/// A parsed GGUF file, without its bytes: what the header, metadata and tensor table say,
/// all checked against the length of the bytes it was parsed from.
#[derive(Debug, Clone)]
pub struct Gguf {
    version: u32,
    alignment: u32,
    data_offset: u64,
    len: usize,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl Gguf {
    /// Parses `bytes`, the whole file; `file` names it in errors.
    pub fn parse(file: &str, bytes: &[u8]) -> Result<Gguf, GgufError> {
        parse(bytes).map_err(|kind| GgufError::new(file, kind))
    }

    /// 2 or 3 (3 added big-endian files, which are refused here; the layouts are the same).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// `general.alignment`, or 32.
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Where the data section starts: the end of the tensor table, aligned up.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The length of the bytes this was parsed from.
    pub fn file_len(&self) -> usize {
        self.len
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }
}

fn parse(bytes: &[u8]) -> Result<Gguf, ErrorKind> {
    let mut p = Parser {
        r: Reader::new(bytes),
    };
    let header = |p: &Parser<'_>, s| p.truncated(s, At::Header);

    let magic: [u8; 4] = p.r.array().map_err(|s| header(&p, s))?;
    if magic != *b"GGUF" {
        return Err(ErrorKind::BadMagic { found: magic });
    }
    let version = p.r.u32().map_err(|s| header(&p, s))?;
    match version {
        2 | 3 => {}
        v if v & 0xffff == 0 && (1..=3).contains(&v.swap_bytes()) => {
            return Err(ErrorKind::BigEndian(v.swap_bytes()));
        }
        v => return Err(ErrorKind::UnsupportedVersion(v)),
    }
    let tensor_count = p.r.u64().map_err(|s| header(&p, s))?;
    let kv_count = p.r.u64().map_err(|s| header(&p, s))?;

    let mut metadata = Metadata::default();
    let n_kv = p.count(kv_count, MIN_KV_BYTES, "metadata entries", At::Header)?;
    for i in 0..n_kv {
        let key = p.string(At::Key(i as u64))?;
        let at = At::Value(&key);
        let ty = p.r.u32().map_err(|s| p.truncated(s, at))?;
        let value = p.value(ty, at)?;
        metadata
            .insert(key, value)
            .map_err(ErrorKind::DuplicateKey)?;
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => *a,
        Some(v) => return Err(ErrorKind::BadAlignment(v.describe())),
    };

    let n_tensors = p.count(
        tensor_count,
        MIN_TENSOR_INFO_BYTES,
        "tensor infos",
        At::TensorTable,
    )?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut by_name = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = p.string(At::TensorName(i as u64))?;
        let at = At::Tensor(&name);
        let n_dims = p.r.u32().map_err(|s| p.truncated(s, at))?;
        if n_dims > MAX_DIMS {
            return Err(ErrorKind::TooManyDims {
                name,
                n_dims,
                max: MAX_DIMS,
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(p.r.u64().map_err(|s| p.truncated(s, at))?);
        }
        let type_id = p.r.u32().map_err(|s| p.truncated(s, at))?;
        let offset = p.r.u64().map_err(|s| p.truncated(s, at))?;
        let Some(ty) = GgmlType::from_id(type_id) else {
            return Err(ErrorKind::UnknownType { name, id: type_id });
        };
        let shape = |source| ErrorKind::BadShape {
            name: name.clone(),
            source,
        };
        let n_elements = quant::element_count(ty, &dims).map_err(shape)?;
        let n_bytes = quant::tensor_bytes(ty, &dims).map_err(shape)?;
        if !offset.is_multiple_of(u64::from(alignment)) {
            return Err(ErrorKind::Misaligned {
                name,
                offset,
                alignment: alignment.into(),
            });
        }
        if by_name.contains_key(&name) {
            return Err(ErrorKind::DuplicateTensor(name));
        }
        by_name.insert(name.clone(), tensors.len());
        tensors.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
            n_elements,
            n_bytes,
            start: 0,
        });
    }

    // The data section starts at the end of the table, aligned up; every tensor must lie
    // inside the file. u128 cannot overflow: each term is below 2^64.
    let len = bytes.len();
    let table_end = p.r.pos() as u128;
    let align = u128::from(alignment);
    let data_offset = table_end.div_ceil(align) * align;
    for t in &mut tensors {
        let start = data_offset + u128::from(t.offset);
        let end = start + u128::from(t.n_bytes);
        if end > len as u128 {
            return Err(ErrorKind::DataOutOfBounds {
                name: t.name.clone(),
                offset: t.offset,
                n_bytes: t.n_bytes,
                end,
                len,
            });
        }
        // start <= end <= len, so it fits a usize.
        t.start = start as usize;
    }

    Ok(Gguf {
        version,
        alignment,
        // table_end <= len and the alignment is at most 2^31: fits a u64.
        data_offset: data_offset as u64,
        len,
        metadata,
        tensors,
        by_name,
    })
}
