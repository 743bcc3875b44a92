//! Q4_K and Q6_K weight rows times activations quantized as ggml's `block_q8_K` (one f32
//! scale per 256, [`Q8Rows::per_256`]), added in the order llama.cpp's x86 build adds
//! them, so a dot has its bits:
//!
//! - **Q4_K** as the repacked `block_q4_Kx8` kernels (`ggml_gemv_q4_K_8x8_q8_K` and
//!   `ggml_gemm_q4_K_8x8_q8_K`, which llama.cpp uses for every Q4_K matrix whose row count
//!   is a multiple of 8 on an AVX2 CPU): per 256, one integer `Σ_j sc_j·Σ q·x` and one
//!   `Σ_j m_j·Σ x`, each added to its own f32 accumulator by FMA with `d_w·d_x` and
//!   `dmin_w·d_x`; the dot is the first accumulator minus the second.
//! - **Q6_K** below 8 activation rows as `ggml_vec_dot_q6_K_q8_K` (AVX2; x86 has no
//!   repacked Q6_K): eight i32 lanes per 256 (lane k: elements 4k..4k+3 of each 32, times
//!   their 16-element scale, with the 6-bit quants unsigned), minus `32 × Σ sc·bsum` of
//!   the k-th 32 in lane k, converted and added lane by lane by FMA with `d_w·d_x`; the
//!   lanes are summed at the end. From 8 rows on, as llama.cpp's tiled K-quant matmul
//!   (`ggml-cpu/tiled`, its AVX-512 VNNI microkernel): the whole 256 as one integer,
//!   times `d_w`, added by FMA with `d_x`.
//!
//! So, as in llama.cpp, a row's value depends on the batch it is computed in (which group
//! of 4 it falls in for Q4_K, whether the batch has 8 rows for Q6_K); the differences are
//! in the last bits.
//!
//! Keeping the whole 256 in integers is also cheaper than the per-32 float steps the other
//! formats take: one conversion and FMA per 256 instead of eight.
//!
//! Only with [`Q8Rows::per_256`] activations (which the forward pass uses where every
//! weight reading an input is a K-quant); otherwise the per-32 kernels in `kernels/`
//! run, as before.

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;

#[cfg(test)]
mod tests;
