//! Dequantizers: ggml blocks to `f32`, bit-for-bit what ggml's reference (and gguf-py's
//! numpy) dequantizers produce, since each value is the same one or two rounded f32
//! operations in the same order (`d * q`, `d * q + m`, `(d * sc) * q`, `(d * sc) * q - dmin * m`).
//!
//! Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 (blocks of 32) and Q4_K, Q6_K (blocks of
//! 256). The layouts are ggml's `block_*` structs, little-endian, `ggml_half` scales.
//!
//! A tensor is rows of `ne0` elements (its first GGUF dimension); each row is whole blocks,
//! so a row can be dequantized on its own ([`dequantize_row`]), which is what a matmul
//! over quantized weights needs.

mod float;
pub(crate) mod kquants;
mod legacy;
mod size;

pub use float::{bf16_to_f32, f16_to_f32};
pub use size::{element_count, row_bytes, tensor_bytes};

use crate::ggml_type::GgmlType;

/// Why a dequantization (or a size computation) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("dequantizing {0} is not supported")]
    Unsupported(GgmlType),
    #[error("{ty} shape {dims:?} overflows: more than 2^63 elements or bytes")]
    ShapeOverflow { ty: GgmlType, dims: Vec<u64> },
    #[error("{ty} shape {dims:?}: rows of {ne0} elements are not whole blocks of {block}")]
    PartialRow {
        ty: GgmlType,
        dims: Vec<u64>,
        ne0: u64,
        block: usize,
    },
    #[error("{ty}: {n_elements} elements are not whole blocks of {block}")]
    PartialBlock {
        ty: GgmlType,
        n_elements: usize,
        block: usize,
    },
    #[error("{ty}: {n_elements} elements take {expected} bytes, got {got}")]
    InputSize {
        ty: GgmlType,
        n_elements: usize,
        expected: u64,
        got: usize,
    },
    #[error("{ty}: the output holds {got} values, {n_elements} are dequantized")]
    OutputSize {
        ty: GgmlType,
        n_elements: usize,
        got: usize,
    },
    #[error("{ty}: row {row} is past the end ({rows} rows of {ne0} elements)")]
    RowOutOfRange {
        ty: GgmlType,
        row: usize,
        rows: usize,
        ne0: usize,
    },
}

/// Dequantizes `n_elements` values of type `ty` from `bytes` (exactly their encoded size)
/// into `out` (exactly `n_elements` long).
pub fn dequantize(
    ty: GgmlType,
    bytes: &[u8],
    n_elements: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    if !ty.can_dequantize() {
        return Err(QuantError::Unsupported(ty));
    }
    let block = ty.block_size();
    if !n_elements.is_multiple_of(block) {
        return Err(QuantError::PartialBlock {
            ty,
            n_elements,
            block,
        });
    }
    let expected = u64::try_from(n_elements / block)
        .ok()
        .and_then(|blocks| blocks.checked_mul(ty.bytes_per_block() as u64));
    if expected != Some(bytes.len() as u64) {
        return Err(QuantError::InputSize {
            ty,
            n_elements,
            expected: expected.unwrap_or(u64::MAX),
            got: bytes.len(),
        });
    }
    if out.len() != n_elements {
        return Err(QuantError::OutputSize {
            ty,
            n_elements,
            got: out.len(),
        });
    }
    match ty {
        GgmlType::F32 => float::f32s(bytes, out),
        GgmlType::F16 => float::f16s(bytes, out),
        GgmlType::BF16 => float::bf16s(bytes, out),
        GgmlType::Q4_0 => blocks(bytes, out, legacy::q4_0),
        GgmlType::Q4_1 => blocks(bytes, out, legacy::q4_1),
        GgmlType::Q5_0 => blocks(bytes, out, legacy::q5_0),
        GgmlType::Q8_0 => blocks(bytes, out, legacy::q8_0),
        GgmlType::Q4_K => blocks(bytes, out, kquants::q4_k),
        GgmlType::Q6_K => blocks(bytes, out, kquants::q6_k),
        _ => return Err(QuantError::Unsupported(ty)),
    }
    Ok(())
}

/// Dequantizes row `row` of a tensor of type `ty` whose rows hold `ne0` elements and whose
/// encoded bytes are `tensor` (whole rows), into `out` (exactly `ne0` long).
pub fn dequantize_row(
    ty: GgmlType,
    tensor: &[u8],
    ne0: usize,
    row: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let row_len = row_bytes(ty, ne0 as u64)?;
    let row_len = usize::try_from(row_len).map_err(|_| QuantError::ShapeOverflow {
        ty,
        dims: vec![ne0 as u64],
    })?;
    let rows = tensor.len().checked_div(row_len).unwrap_or(0);
    let range = row
        .checked_mul(row_len)
        .and_then(|start| Some(start..start.checked_add(row_len)?));
    let bytes = range
        .and_then(|range| tensor.get(range))
        .ok_or(QuantError::RowOutOfRange { ty, row, rows, ne0 })?;
    dequantize(ty, bytes, ne0, out)
}

/// Runs `f` over each `B`-byte block and its `N` outputs; the caller has checked that the
/// input is whole blocks and the output exactly as long.
fn blocks<const B: usize, const N: usize>(
    bytes: &[u8],
    out: &mut [f32],
    f: impl Fn(&[u8; B], &mut [f32; N]),
) {
    let (src, _) = bytes.as_chunks::<B>();
    let (dst, _) = out.as_chunks_mut::<N>();
    for (block, values) in src.iter().zip(dst) {
        f(block, values);
    }
}

/// A little-endian `ggml_half` from its two bytes, as f32.
#[inline(always)]
fn half(lo: u8, hi: u8) -> f32 {
    f16_to_f32(u16::from_le_bytes([lo, hi]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_wrong_sizes_and_types() {
        let mut out = [0.0f32; 32];
        assert_eq!(
            dequantize(GgmlType::Q8_0, &[0; 33], 32, &mut out),
            Err(QuantError::InputSize {
                ty: GgmlType::Q8_0,
                n_elements: 32,
                expected: 34,
                got: 33
            })
        );
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0; 34], 31, &mut out[..31]),
            Err(QuantError::PartialBlock { .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0; 34], 32, &mut out[..16]),
            Err(QuantError::OutputSize { .. })
        ));
        assert_eq!(
            dequantize(GgmlType::Q5_1, &[0; 24], 32, &mut out),
            Err(QuantError::Unsupported(GgmlType::Q5_1))
        );
        assert!(matches!(
            dequantize_row(GgmlType::Q8_0, &[0; 68], 32, 2, &mut out),
            Err(QuantError::RowOutOfRange { rows: 2, .. })
        ));
        assert!(dequantize_row(GgmlType::Q8_0, &[0; 68], 32, 1, &mut out).is_ok());
        assert!(matches!(
            dequantize_row(GgmlType::Q8_0, &[0; 68], 32, usize::MAX, &mut out),
            Err(QuantError::RowOutOfRange { .. })
        ));
    }

    #[test]
    fn every_dequantizable_type_handles_zero_elements() {
        for ty in GgmlType::all().filter(|t| t.can_dequantize()) {
            assert_eq!(dequantize(ty, &[], 0, &mut []), Ok(()), "{ty}");
        }
    }

    #[test]
    fn q8_0_by_hand() {
        // d = 0.5 (f16 0x3800), q = -128, -1, 0, 1, 127, ...
        let mut block = [0u8; 34];
        block[0] = 0x00;
        block[1] = 0x38;
        block[2] = 0x80;
        block[3] = 0xff;
        block[5] = 1;
        block[6] = 127;
        let mut out = [1.0f32; 32];
        dequantize(GgmlType::Q8_0, &block, 32, &mut out).unwrap();
        assert_eq!(&out[..5], &[-64.0, -0.5, 0.0, 0.5, 63.5]);
        assert!(out[5..].iter().all(|v| *v == 0.0));
    }
}
