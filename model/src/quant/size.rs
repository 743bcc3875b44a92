//! Byte sizes of tensors from their shapes, with every product checked.

use super::QuantError;
use crate::ggml_type::GgmlType;

/// ggml keeps sizes in `int64_t`/`size_t`: nothing may exceed `i64::MAX`.
const LIMIT: u64 = i64::MAX as u64;

fn overflow(ty: GgmlType, dims: &[u64]) -> QuantError {
    QuantError::ShapeOverflow {
        ty,
        dims: dims.to_vec(),
    }
}

/// The number of elements of a tensor of shape `dims` (GGUF order, `dims[0]` = row length).
/// A shape with no dimensions is a scalar (one element).
pub fn element_count(ty: GgmlType, dims: &[u64]) -> Result<u64, QuantError> {
    dims.iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d).filter(|n| *n <= LIMIT))
        .ok_or_else(|| overflow(ty, dims))
}

/// The bytes of one row of `ne0` elements: whole blocks only.
pub fn row_bytes(ty: GgmlType, ne0: u64) -> Result<u64, QuantError> {
    let block = ty.block_size() as u64;
    if !ne0.is_multiple_of(block) {
        return Err(QuantError::PartialRow {
            ty,
            dims: vec![ne0],
            ne0,
            block: ty.block_size(),
        });
    }
    (ne0 / block)
        .checked_mul(ty.bytes_per_block() as u64)
        .filter(|n| *n <= LIMIT)
        .ok_or_else(|| overflow(ty, &[ne0]))
}

/// The encoded bytes of a tensor of type `ty` and shape `dims` (GGUF order): rows of
/// `dims[0]` elements, each whole blocks.
pub fn tensor_bytes(ty: GgmlType, dims: &[u64]) -> Result<u64, QuantError> {
    let n = element_count(ty, dims)?;
    let ne0 = dims.first().copied().unwrap_or(1);
    let row = row_bytes(ty, ne0).map_err(|e| match e {
        QuantError::PartialRow { ne0, block, .. } => QuantError::PartialRow {
            ty,
            dims: dims.to_vec(),
            ne0,
            block,
        },
        _ => overflow(ty, dims),
    })?;
    let rows = n.checked_div(ne0).unwrap_or(0);
    rows.checked_mul(row)
        .filter(|n| *n <= LIMIT)
        .ok_or_else(|| overflow(ty, dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(tensor_bytes(GgmlType::F32, &[576]), Ok(2304));
        assert_eq!(tensor_bytes(GgmlType::Q8_0, &[576, 49152]), Ok(30081024));
        assert_eq!(tensor_bytes(GgmlType::Q4_1, &[1536, 576]), Ok(552960));
        assert_eq!(tensor_bytes(GgmlType::Q6_K, &[2048, 640]), Ok(1075200));
        assert_eq!(tensor_bytes(GgmlType::Q4_K, &[1024, 640]), Ok(368640));
        assert_eq!(tensor_bytes(GgmlType::Q5_0, &[640, 256]), Ok(112640));
        assert_eq!(tensor_bytes(GgmlType::F16, &[]), Ok(2));
        assert_eq!(tensor_bytes(GgmlType::Q4_0, &[0, u64::MAX]), Ok(0));
        assert_eq!(row_bytes(GgmlType::Q4_K, 512), Ok(288));
    }

    #[test]
    fn overflow_and_partial_blocks_are_errors() {
        assert!(matches!(
            tensor_bytes(GgmlType::F32, &[1 << 32, 1 << 32]),
            Err(QuantError::ShapeOverflow { .. })
        ));
        // Element count fits, bytes do not.
        assert!(matches!(
            tensor_bytes(GgmlType::F32, &[1 << 31, 1 << 31]),
            Err(QuantError::ShapeOverflow { .. })
        ));
        assert!(matches!(
            tensor_bytes(GgmlType::F32, &[u64::MAX]),
            Err(QuantError::ShapeOverflow { .. })
        ));
        assert_eq!(
            tensor_bytes(GgmlType::Q4_K, &[300, 2]),
            Err(QuantError::PartialRow {
                ty: GgmlType::Q4_K,
                dims: vec![300, 2],
                ne0: 300,
                block: 256
            })
        );
        assert_eq!(
            tensor_bytes(GgmlType::Q4_K, &[300, 2])
                .unwrap_err()
                .to_string(),
            "Q4_K shape [300, 2]: rows of 300 elements are not whole blocks of 256"
        );
    }
}
