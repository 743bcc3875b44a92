//! ggml's tensor element types: ids as stored in GGUF, block geometry, byte sizes.
//!
//! The table mirrors `ggml_type` and `type_traits` in ggml (ids 4, 5, 31–33 and 36–38 were
//! removed from ggml and are unknown here). Every known type has a size so that the GGUF
//! reader can bound-check any tensor; only some can be dequantized ([`GgmlType::can_dequantize`]).

use std::fmt;

/// A ggml element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// Elements per block of the K-quants (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// (type, GGUF id, name, elements per block, bytes per block, dequantizable here)
const TABLE: &[(GgmlType, u32, &str, usize, usize, bool)] = &[
    (GgmlType::F32, 0, "F32", 1, 4, true),
    (GgmlType::F16, 1, "F16", 1, 2, true),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18, true),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20, true),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22, true),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24, false),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34, true),
    // ggml's block_q8_1 is two halves and 32 bytes (36); gguf-py's table says 40.
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36, false),
    (GgmlType::Q2_K, 10, "Q2_K", QK_K, 84, false),
    (GgmlType::Q3_K, 11, "Q3_K", QK_K, 110, false),
    (GgmlType::Q4_K, 12, "Q4_K", QK_K, 144, true),
    (GgmlType::Q5_K, 13, "Q5_K", QK_K, 176, false),
    (GgmlType::Q6_K, 14, "Q6_K", QK_K, 210, true),
    (GgmlType::Q8_K, 15, "Q8_K", QK_K, 292, false),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", QK_K, 66, false),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", QK_K, 74, false),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", QK_K, 98, false),
    (GgmlType::IQ1_S, 19, "IQ1_S", QK_K, 50, false),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18, false),
    (GgmlType::IQ3_S, 21, "IQ3_S", QK_K, 110, false),
    (GgmlType::IQ2_S, 22, "IQ2_S", QK_K, 82, false),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", QK_K, 136, false),
    (GgmlType::I8, 24, "I8", 1, 1, false),
    (GgmlType::I16, 25, "I16", 1, 2, false),
    (GgmlType::I32, 26, "I32", 1, 4, false),
    (GgmlType::I64, 27, "I64", 1, 8, false),
    (GgmlType::F64, 28, "F64", 1, 8, false),
    (GgmlType::IQ1_M, 29, "IQ1_M", QK_K, 56, false),
    (GgmlType::BF16, 30, "BF16", 1, 2, true),
    (GgmlType::TQ1_0, 34, "TQ1_0", QK_K, 54, false),
    (GgmlType::TQ2_0, 35, "TQ2_0", QK_K, 66, false),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17, false),
    (GgmlType::NVFP4, 40, "NVFP4", 64, 36, false),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 18, false),
];

impl GgmlType {
    /// Every known type, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|row| row.0)
    }

    /// The type stored in GGUF as `id`, or `None` when ggml has no such type (now).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.1 == id).map(|row| row.0)
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize, bool) {
        // The table lists every variant exactly once, in declaration order (a unit test
        // checks it), so the discriminant indexes it; `match` keeps this panic-free anyway.
        match TABLE.get(self as usize) {
            Some(row) if row.0 == self => row,
            _ => &TABLE[0],
        }
    }

    /// The GGUF id.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name for the type ("Q4_K").
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block (1 for plain types, 32 for the legacy quants, 256 for K-quants).
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn bytes_per_block(self) -> usize {
        self.row().4
    }

    /// Whether [`crate::quant::dequantize`] supports the type.
    pub fn can_dequantize(self) -> bool {
        self.row().5
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_declaration_order_with_unique_ids() {
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(row.0 as usize, i, "{}", row.2);
            assert_eq!(GgmlType::from_id(row.1), Some(row.0));
            assert_eq!(row.0.row().2, row.2);
            assert_eq!(format!("{:?}", row.0), row.2);
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "{id}");
        }
    }
}
