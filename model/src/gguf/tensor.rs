//! The tensor table's entries and views of tensor data.

use std::ops::Range;

use super::error::{ErrorKind, GgufError};
use crate::ggml_type::GgmlType;
use crate::quant::{self, QuantError};

/// One entry of the tensor table, checked: known type, whole-block rows, no overflow,
/// aligned offset, data inside the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub(crate) name: String,
    pub(crate) dims: Vec<u64>,
    pub(crate) ty: GgmlType,
    pub(crate) offset: u64,
    pub(crate) n_elements: u64,
    pub(crate) n_bytes: u64,
    /// Absolute byte offset of the data in the file.
    pub(crate) start: usize,
}

impl TensorInfo {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shape in GGUF (ggml) order: `dims[0]` is the row length, the fastest-varying
    /// dimension (gguf-py's `ReaderTensor.shape` is the same order; numpy's is reversed).
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Offset from the start of the data section, as stored.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Offset from the start of the file.
    pub fn file_offset(&self) -> u64 {
        self.start as u64
    }

    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    pub fn n_bytes(&self) -> u64 {
        self.n_bytes
    }

    /// Elements per row (`dims[0]`; 1 for a scalar).
    pub fn ne0(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Rows (the product of the other dimensions; 0 for an empty tensor).
    pub fn rows(&self) -> u64 {
        self.n_elements.checked_div(self.ne0()).unwrap_or(0)
    }

    /// The byte range in the file (validated against the file's length at parse time).
    pub(crate) fn range(&self) -> Range<usize> {
        // n_bytes <= file length - start, checked when parsed.
        self.start..self.start + self.n_bytes as usize
    }
}

/// A tensor's info and its bytes (a slice of the file's map: nothing is copied).
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    pub(crate) file: &'a str,
    pub(crate) info: &'a TensorInfo,
    pub(crate) data: &'a [u8],
}

impl<'a> Tensor<'a> {
    pub fn info(&self) -> &'a TensorInfo {
        self.info
    }

    pub fn name(&self) -> &'a str {
        &self.info.name
    }

    pub fn ggml_type(&self) -> GgmlType {
        self.info.ty
    }

    pub fn dims(&self) -> &'a [u64] {
        &self.info.dims
    }

    /// The encoded bytes, `n_bytes` long.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    pub fn n_elements(&self) -> u64 {
        self.info.n_elements
    }

    /// Elements per row.
    pub fn ne0(&self) -> u64 {
        self.info.ne0()
    }

    pub fn rows(&self) -> u64 {
        self.info.rows()
    }

    /// The encoded bytes of one row.
    pub fn row(&self, row: usize) -> Option<&'a [u8]> {
        let n = usize::try_from(quant::row_bytes(self.info.ty, self.ne0()).ok()?).ok()?;
        let start = row.checked_mul(n)?;
        self.data.get(start..start.checked_add(n)?)
    }

    fn error(&self, source: QuantError) -> GgufError {
        GgufError::new(
            self.file,
            ErrorKind::Dequantize {
                name: self.info.name.clone(),
                ty: self.info.ty,
                source,
            },
        )
    }

    fn size(&self, n: u64) -> Result<usize, GgufError> {
        usize::try_from(n).map_err(|_| {
            self.error(QuantError::ShapeOverflow {
                ty: self.info.ty,
                dims: self.info.dims.clone(),
            })
        })
    }

    /// Dequantizes row `row` into `out` (exactly `ne0` long).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), GgufError> {
        let ne0 = self.size(self.ne0())?;
        quant::dequantize_row(self.info.ty, self.data, ne0, row, out).map_err(|e| self.error(e))
    }

    /// Dequantizes the whole tensor into `out` (exactly `n_elements` long).
    pub fn dequantize_into(&self, out: &mut [f32]) -> Result<(), GgufError> {
        let n = self.size(self.info.n_elements)?;
        quant::dequantize(self.info.ty, self.data, n, out).map_err(|e| self.error(e))
    }

    /// Dequantizes the whole tensor into a new vector.
    pub fn dequantize(&self) -> Result<Vec<f32>, GgufError> {
        if !self.info.ty.can_dequantize() {
            return Err(self.error(QuantError::Unsupported(self.info.ty)));
        }
        let mut out = vec![0.0; self.size(self.info.n_elements)?];
        self.dequantize_into(&mut out)?;
        Ok(out)
    }
}
