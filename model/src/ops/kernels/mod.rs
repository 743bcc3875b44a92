//! The inner loops: quantized dot products (the llama.cpp way), f32 dots, f16 rows.
//!
//! # Quantized matmul
//!
//! An activation row is quantized once per matmul input to 8-bit blocks of 32 ([`Q8Rows`]:
//! a scale `d = max|x| / 127`, the 32 `round(x × 127 / max|x|)` (ties to even), and
//! `s = d × Σq` for the formats with a min), exactly as ggml's `quantize_row_q8_0`/`q8_1`
//! do, `d` and `s` rounded to f16 included: den's 8-bit activations are llama.cpp's.
//! (Keeping them in f32 looked more precise but measured worse: against den's own f32
//! path, SmolLM2's top-1 probabilities moved by up to 0.32 instead of 0.10.) Where every
//! weight reading an input is a K-quant, the input is quantized as llama.cpp's Q8_K (one
//! f32 scale per 256, [`Q8Rows::per_256`]) and those dots run in `kdot/`, in llama.cpp's
//! order. The weight row is decoded block by block in registers
//! ([`Kernels::dot_rows`], AVX2: four activation rows per decoded block) or, in the
//! portable path, unpacked once ([`Unpacked`]) into one i8 per weight, a per-block scale,
//! and where the format has them a per-block min (Q4_1, Q4_K) or two 16-element integer
//! sub-scales (Q6_K); either way its dot with each activation row is
//!
//! ```text
//! Σ_blocks d_w × d_x × Σ_i w_i × x_i   (+ Σ_blocks m_w × s_x)
//! ```
//!
//! in integers within a block (AVX2: `maddubs`/`madd`, ggml's sign trick; with AVX-512
//! VNNI one `vpdpbusd`, the same integers), f32 across blocks. The scalar and AVX2 paths
//! compute the same integers; their f32 sums differ only in order.
//!
//! Measured (this 2-core VM; CPU ms per token at 1 thread, `bench_forward` in
//! `tests/it/forward_real.rs`): the integer path is several times faster than
//! dequantizing each weight row to f32 and taking an f32 dot
//! ([`crate::arch::MatmulMode::Exact`], kept as the reference the tests compare
//! against). Unpacking with scalar code cost 0.3–1.3 ns per weight, 15× the dot itself,
//! and made SmolLM2's decode 42 CPU ms/token against 6 for prefill; SIMD unpacking
//! brought it to about 20. Decoding in registers for four rows at a time and unpacking to
//! memory once per weight row measured the same within this machine's noise (prefill
//! 5.9 against 6.6 CPU ms/token, decode 20–25 both), so the fused kernel is the default
//! (it touches no buffer, and a row's result cannot depend on the batch); then two
//! accumulators per row (the fma chain's latency) and one call per run of weight rows
//! instead of per row ([`Kernels::dot_matrix`]) brought decode to 15.5 (SmolLM2) and
//! 24.6 (Gemma 3) CPU ms/token. `vpdpbusd` (where the CPU has it) and the K-quant dots
//! keeping a whole 256 in integers took Gemma 3's prefill from 394 to about 510 tokens/s
//! (2 threads; BENCHMARKS.md).

use crate::ggml_type::{GgmlType, QK_K};
use crate::quant::f16_to_f32;

/// Elements per activation block.
pub const QK: usize = 32;

/// Rows of activations quantized to 8-bit blocks of 32.
#[derive(Debug, Clone, Default)]
pub struct Q8Rows {
    /// Row length (a multiple of 32).
    pub n: usize,
    pub rows: usize,
    pub q: Vec<i8>,
    /// Per block: scale.
    pub d: Vec<f32>,
    /// Per block: scale × Σq.
    pub s: Vec<f32>,
    /// Quantized as ggml's `block_q8_K` (one scale per 256, see [`Q8Rows::quantize_as`]).
    pub per_256: bool,
    /// With `per_256`: Σq of each 16 (`block_q8_K::bsums`), what the K-quant dots
    /// (`ops::kdot`) subtract their offsets and mins with.
    pub bs: Vec<i16>,
}

impl Q8Rows {
    /// Room for `rows` rows of `n` (`n` a multiple of 32).
    pub fn with_capacity(rows: usize, n: usize) -> Q8Rows {
        let nb = n / QK;
        Q8Rows {
            n,
            rows: 0,
            q: vec![0; rows * n],
            d: vec![0.0; rows * nb],
            s: vec![0.0; rows * nb],
            per_256: false,
            bs: Vec::new(),
        }
    }

    /// Row `i`: quants, scales, scaled sums.
    pub fn row(&self, i: usize) -> (&[i8], &[f32], &[f32]) {
        let nb = self.n / QK;
        (
            &self.q[i * self.n..(i + 1) * self.n],
            &self.d[i * nb..(i + 1) * nb],
            &self.s[i * nb..(i + 1) * nb],
        )
    }

    /// Quantizes `rows` rows of `n` from `x` (row-major), growing the buffers if needed.
    pub fn quantize(&mut self, k: Kernels, x: &[f32], rows: usize, n: usize) {
        self.quantize_as(k, x, rows, n, false);
    }

    /// [`Q8Rows::quantize`], or with `per_256` (`n` a multiple of 256) as ggml's
    /// `block_q8_K`, the activations of its K-quant dots: one f32 scale per 256.
    pub fn quantize_as(&mut self, k: Kernels, x: &[f32], rows: usize, n: usize, per_256: bool) {
        let nb = n / QK;
        self.n = n;
        self.rows = rows;
        self.per_256 = per_256;
        if per_256 && self.bs.len() < rows * n / 16 {
            self.bs.resize(rows * n / 16, 0);
        }
        if self.q.len() < rows * n {
            self.q.resize(rows * n, 0);
        }
        if self.d.len() < rows * nb {
            self.d.resize(rows * nb, 0.0);
            self.s.resize(rows * nb, 0.0);
        }
        for i in 0..rows {
            if per_256 {
                super::ggml_round::quantize_row_q8k(
                    k,
                    &x[i * n..(i + 1) * n],
                    &mut self.q[i * n..(i + 1) * n],
                    &mut self.d[i * nb..(i + 1) * nb],
                    &mut self.s[i * nb..(i + 1) * nb],
                );
                let q = &self.q[i * n..(i + 1) * n];
                for (b, q) in self.bs[i * n / 16..(i + 1) * n / 16]
                    .iter_mut()
                    .zip(q.chunks_exact(16))
                {
                    *b = q.iter().map(|v| i16::from(*v)).sum();
                }
                continue;
            }
            k.quantize_row(
                &x[i * n..(i + 1) * n],
                &mut self.q[i * n..(i + 1) * n],
                &mut self.d[i * nb..(i + 1) * nb],
                &mut self.s[i * nb..(i + 1) * nb],
            );
        }
    }
}

/// A weight row unpacked for [`Kernels::dot_q8`].
#[derive(Debug, Clone, Default)]
pub struct Unpacked {
    /// Elements.
    pub n: usize,
    pub q: Vec<i8>,
    /// Per block of 32: scale.
    pub d: Vec<f32>,
    /// Per block of 32: the min, multiplied by the activation block's `s` (Q4_1, Q4_K).
    pub m: Vec<f32>,
    /// Per block of 32: integer scales of its two halves of 16 (Q6_K).
    pub sc: Vec<[i16; 2]>,
    pub has_min: bool,
    pub has_sub: bool,
}

impl Unpacked {
    pub fn with_capacity(n: usize) -> Unpacked {
        let nb = n.div_ceil(QK);
        Unpacked {
            n: 0,
            q: vec![0; nb * QK],
            d: vec![0.0; nb],
            m: vec![0.0; nb],
            sc: vec![[0; 2]; nb],
            has_min: false,
            has_sub: false,
        }
    }

    fn prepare(&mut self, n: usize) {
        let nb = n / QK;
        self.n = n;
        if self.q.len() < n {
            self.q.resize(n, 0);
        }
        if self.d.len() < nb {
            self.d.resize(nb, 0.0);
            self.m.resize(nb, 0.0);
            self.sc.resize(nb, [0; 2]);
        }
    }
}

/// Whether a weight type has a quantized dot product here (the others that dequantize are
/// multiplied in f32).
pub fn has_q8_dot(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q4_K
            | GgmlType::Q6_K
    )
}

/// Asks the CPU to bring `bytes` into cache ahead of use: attention walks keys whose rows
/// lie a row (23 KB for SmolLM2) apart, a stride the hardware prefetchers do not follow.
#[inline(always)]
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is a hint: it reads nothing architecturally and cannot fault;
        // the address is inside `bytes`. SSE is part of x86_64.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast::<i8>(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// How far ahead of the weight bytes being read a product prefetches.
///
/// A one-row product (a decode step) streams each weight byte once, and on this pool's
/// machines the hardware prefetchers do not keep up with a sequential stream either:
/// prefetching `len` bytes this far ahead of every `len` read took SmolLM2's one-thread
/// decode from 47 to 70 tokens/s and Gemma 3's from 22.7 to 29.3 (1, 2, 3, 4 and 6 KiB
/// measured: 61 / 64 / 70 / 71 / 69 and 27.6 / 28.2 / 28.8 / 29.3 / 29.5).
pub(super) const WEIGHT_PREFETCH_BYTES: usize = 4096;

/// Prefetches `w[at + WEIGHT_PREFETCH_BYTES..][..len]`, what is inside `w` of it.
#[inline(always)]
pub(super) fn prefetch_weights(w: &[u8], at: usize, len: usize) {
    let lo = at.saturating_add(WEIGHT_PREFETCH_BYTES).min(w.len());
    let hi = lo.saturating_add(len).min(w.len());
    prefetch(&w[lo..hi]);
}

/// The kernels for this CPU: AVX2+FMA+F16C where detected, portable scalar code elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernels {
    avx2: bool,
    /// AVX2: decode weight blocks in registers for up to 4 activation rows at a time
    /// ([`Kernels::dot_rows`]) rather than unpacking the row to memory first.
    fused: bool,
    /// AVX-512 VNNI and VL: the fused dots through `vpdpbusd`.
    vnni: bool,
}

impl Kernels {
    /// The best kernels this CPU runs.
    pub fn detect() -> Kernels {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                return Kernels {
                    avx2: true,
                    fused: true,
                    vnni: std::is_x86_feature_detected!("avx512vnni")
                        && std::is_x86_feature_detected!("avx512vl"),
                };
            }
        }
        Kernels::scalar()
    }

    /// The portable kernels (the reference the SIMD ones are tested against).
    pub fn scalar() -> Kernels {
        Kernels {
            avx2: false,
            fused: false,
            vnni: false,
        }
    }

    /// These kernels with the fused multi-row dot on or off (SIMD only; for measuring).
    pub fn with_fused(self, fused: bool) -> Kernels {
        Kernels {
            fused: fused && self.avx2,
            ..self
        }
    }

    /// These kernels without AVX-512 VNNI (tests compare both paths on a CPU with it).
    #[cfg(test)]
    pub(in crate::ops) fn without_vnni(self) -> Kernels {
        Kernels {
            vnni: false,
            ..self
        }
    }

    /// Whether [`Kernels::dot_rows`] is in use.
    pub fn is_fused(&self) -> bool {
        self.fused
    }

    /// Whether these are the AVX2 kernels.
    pub fn is_simd(&self) -> bool {
        self.avx2
    }

    /// Quantizes `x` (a multiple of 32 long) into `q`, per-block scales `d` and `s`.
    pub fn quantize_row(&self, x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: `avx2` is only set by `detect` after checking AVX2, FMA and F16C.
            return unsafe { avx2::quantize_row(x, q, d, s) };
        }
        quantize_row_body(x, q, d, s);
    }

    /// Unpacks one encoded row of `ty` (`bytes`, whole blocks). False when `ty` has no
    /// quantized dot ([`has_q8_dot`]).
    pub fn unpack(&self, ty: GgmlType, bytes: &[u8], u: &mut Unpacked) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: as in `quantize_row`.
            return unsafe { avx2::unpack(ty, bytes, u) };
        }
        unpack_body::<SoftHalf>(ty, bytes, u)
    }

    /// The dot of an unpacked weight row with one quantized activation row.
    pub fn dot_q8(&self, w: &Unpacked, xq: &[i8], xd: &[f32], xs: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: as in `quantize_row`.
            return unsafe { avx2::dot_q8(w, xq, xd, xs) };
        }
        dot_q8_scalar(w, xq, xd, xs)
    }

    /// `out[i] = w · x[i]` for each of `rows` quantized activation rows, straight from the
    /// encoded weight row `w` of type `ty`: each weight block is decoded once into
    /// registers and multiplied with up to 4 rows. Only with [`Kernels::is_fused`]; false
    /// (nothing written) otherwise or for a type without a quantized dot. The value for a
    /// row does not depend on how many rows are computed with it.
    pub fn dot_rows(
        &self,
        ty: GgmlType,
        w: &[u8],
        x: &Q8Rows,
        rows: usize,
        out: &mut [f32],
    ) -> bool {
        self.dot_matrix(ty, w, w.len(), x, rows, out)
    }

    /// [`Kernels::dot_rows`] for `out.len() / rows` consecutive weight rows of
    /// `row_bytes` each (`w`), column-major: `out[j × rows + i] = w_j · x[i]`. One call
    /// per run of rows keeps the per-row overhead to a loop iteration.
    pub fn dot_matrix(
        &self,
        ty: GgmlType,
        w: &[u8],
        row_bytes: usize,
        x: &Q8Rows,
        rows: usize,
        out: &mut [f32],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self.fused {
            // SAFETY: `fused` is only set with `avx2`, and `vnni` with AVX-512 VNNI and
            // VL, after detection.
            return unsafe {
                if self.vnni {
                    avx2::dot_matrix_vnni(ty, w, row_bytes, x, rows, out)
                } else {
                    avx2::dot_matrix(ty, w, row_bytes, x, rows, out)
                }
            };
        }
        let _ = (ty, w, row_bytes, x, rows, out);
        false
    }

    /// Σ a_i × b_i over equal-length slices.
    pub fn dot_f32(&self, a: &[f32], b: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: as in `quantize_row`.
            return unsafe { avx2::dot_f32(a, b) };
        }
        dot_f32_body(a, b)
    }

    /// y += a × x.
    pub fn axpy(&self, a: f32, x: &[f32], y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: as in `quantize_row`.
            return unsafe { avx2::axpy(a, x, y) };
        }
        axpy_body(a, x, y);
    }

    /// `C += A · B` for row-major `A` (`m × k`), `B` (`k × n`) and `C` (`m × n`): each
    /// element of `C` adds its products in `k` order, one FMA each on SIMD (the order of
    /// ggml's `simd_gemm`). Attention's tiles: scores from queries and a transposed key
    /// tile, then the V sum from the probabilities.
    pub fn gemm_acc(&self, c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
        let (c, a, b) = (&mut c[..m * n], &a[..m * k], &b[..k * n]);
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: as in `quantize_row`; the slices are exactly the shapes.
            return unsafe { avx2::gemm_acc(c, a, b, m, k, n) };
        }
        gemm_acc_body(c, a, b, m, k, n, 0);
    }

    /// Little-endian f16 bytes to f32 (`dst.len()` values from `2 × dst.len()` bytes).
    pub fn f16_to_f32(&self, src: &[u8], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: as in `quantize_row`.
            return unsafe { avx2::f16_to_f32(src, dst) };
        }
        for (b, y) in src.as_chunks::<2>().0.iter().zip(dst) {
            *y = f16_to_f32(u16::from_le_bytes(*b));
        }
    }

    /// f32 to little-endian f16 bytes, rounding to nearest even.
    pub fn f32_to_f16(&self, src: &[f32], dst: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: as in `quantize_row`.
            return unsafe { avx2::f32_to_f16(src, dst) };
        }
        for (x, b) in src.iter().zip(dst.as_chunks_mut::<2>().0) {
            *b = super::half::f32_to_f16(*x).to_le_bytes();
        }
    }
}

// --- bodies shared by both paths (inlined into the AVX2 functions, where they vectorize) --

/// How a path turns a `ggml_half` into f32.
trait Half {
    fn h2f(lo: u8, hi: u8) -> f32;
}

struct SoftHalf;

impl Half for SoftHalf {
    #[inline(always)]
    fn h2f(lo: u8, hi: u8) -> f32 {
        f16_to_f32(u16::from_le_bytes([lo, hi]))
    }
}

#[inline(always)]
fn quantize_row_body(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((x, q), d), s) in x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(QK))
        .zip(d.iter_mut())
        .zip(s.iter_mut())
    {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (x, q) in x.iter().zip(q.iter_mut()) {
            let v = (x * inv).round_ties_even() as i8;
            *q = v;
            sum += i32::from(v);
        }
        *d = f16_round(scale);
        *s = f16_round(scale * sum as f32);
    }
}

/// `x` rounded to the nearest f16.
#[inline(always)]
fn f16_round(x: f32) -> f32 {
    f16_to_f32(super::half::f32_to_f16(x))
}

/// The 8 scales and mins of a 144-byte Q4_K block (its bytes 4..16).
#[inline(always)]
pub(super) fn q4k_scales(block: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut s = [0u8; 12];
    s.copy_from_slice(&block[4..16]);
    crate::quant::kquants::scales_mins(&s)
}

/// An unpacked Q4_K block's per-32 factors: `d[j] = d·scale_j`, `m[j] = −dmin·min_j`.
#[inline(always)]
pub(super) fn q4k_factors(block: &[u8], dd: f32, dmin: f32, d: &mut [f32], m: &mut [f32]) {
    let (scales, mins) = q4k_scales(block);
    for ((d, m), (sc, mn)) in d.iter_mut().zip(m).zip(scales.into_iter().zip(mins)) {
        *d = dd * f32::from(sc);
        *m = -(dmin * f32::from(mn));
    }
}

#[inline(always)]
fn unpack_body<H: Half>(ty: GgmlType, bytes: &[u8], u: &mut Unpacked) -> bool {
    if !has_q8_dot(ty) {
        return false;
    }
    let bpb = ty.bytes_per_block();
    let n = bytes.len() / bpb * ty.block_size();
    u.prepare(n);
    let nb = n / QK;
    let q = &mut u.q[..n];
    let d = &mut u.d[..nb];
    u.has_min = false;
    u.has_sub = false;
    match ty {
        GgmlType::Q8_0 => {
            for ((b, q), d) in bytes.chunks_exact(34).zip(q.chunks_exact_mut(QK)).zip(d) {
                *d = H::h2f(b[0], b[1]);
                for (q, b) in q.iter_mut().zip(&b[2..34]) {
                    *q = *b as i8;
                }
            }
        }
        GgmlType::Q4_0 => {
            for ((b, q), d) in bytes.chunks_exact(18).zip(q.chunks_exact_mut(QK)).zip(d) {
                *d = H::h2f(b[0], b[1]);
                let (lo, hi) = q.split_at_mut(16);
                for ((lo, hi), b) in lo.iter_mut().zip(hi).zip(&b[2..18]) {
                    *lo = (b & 0x0f) as i8 - 8;
                    *hi = (b >> 4) as i8 - 8;
                }
            }
        }
        GgmlType::Q4_1 => {
            u.has_min = true;
            let m = &mut u.m[..nb];
            for (((b, q), d), m) in bytes
                .chunks_exact(20)
                .zip(q.chunks_exact_mut(QK))
                .zip(d)
                .zip(m)
            {
                *d = H::h2f(b[0], b[1]);
                *m = H::h2f(b[2], b[3]);
                let (lo, hi) = q.split_at_mut(16);
                for ((lo, hi), b) in lo.iter_mut().zip(hi).zip(&b[4..20]) {
                    *lo = (b & 0x0f) as i8;
                    *hi = (b >> 4) as i8;
                }
            }
        }
        GgmlType::Q5_0 => {
            for ((b, q), d) in bytes.chunks_exact(22).zip(q.chunks_exact_mut(QK)).zip(d) {
                *d = H::h2f(b[0], b[1]);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let (lo, hi) = q.split_at_mut(16);
                for (j, ((lo, hi), b)) in lo.iter_mut().zip(hi).zip(&b[6..22]).enumerate() {
                    let h0 = (((qh >> j) & 1) << 4) as u8;
                    let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
                    *lo = ((b & 0x0f) | h0) as i8 - 16;
                    *hi = ((b >> 4) | h1) as i8 - 16;
                }
            }
        }
        GgmlType::Q4_K => {
            u.has_min = true;
            let m = &mut u.m[..nb];
            for (((b, q), d), m) in bytes
                .chunks_exact(144)
                .zip(q.chunks_exact_mut(QK_K))
                .zip(d.chunks_exact_mut(8))
                .zip(m.chunks_exact_mut(8))
            {
                let dd = H::h2f(b[0], b[1]);
                let dmin = H::h2f(b[2], b[3]);
                q4k_factors(b, dd, dmin, d, m);
                let qs = &b[16..144];
                for c in 0..4 {
                    let (lo, hi) = q[64 * c..64 * c + 64].split_at_mut(32);
                    for ((lo, hi), b) in lo.iter_mut().zip(hi).zip(&qs[32 * c..32 * c + 32]) {
                        *lo = (b & 0x0f) as i8;
                        *hi = (b >> 4) as i8;
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            u.has_sub = true;
            let sc = &mut u.sc[..nb];
            for (((b, q), d), sc) in bytes
                .chunks_exact(210)
                .zip(q.chunks_exact_mut(QK_K))
                .zip(d.chunks_exact_mut(8))
                .zip(sc.chunks_exact_mut(8))
            {
                let dd = H::h2f(b[208], b[209]);
                d.fill(dd);
                let scales = &b[192..208];
                for n in 0..2 {
                    let ql = &b[64 * n..64 * n + 64];
                    let qh = &b[128 + 32 * n..128 + 32 * n + 32];
                    let y = &mut q[128 * n..128 * n + 128];
                    let (y01, y23) = y.split_at_mut(64);
                    let (y0, y1) = y01.split_at_mut(32);
                    let (y2, y3) = y23.split_at_mut(32);
                    for l in 0..32 {
                        let h = qh[l];
                        y0[l] = ((ql[l] & 0x0f) | ((h & 3) << 4)) as i8 - 32;
                        y1[l] = ((ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4)) as i8 - 32;
                        y2[l] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                        y3[l] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                    }
                    for k in 0..4 {
                        sc[4 * n + k] = [
                            i16::from(scales[8 * n + 2 * k] as i8),
                            i16::from(scales[8 * n + 2 * k + 1] as i8),
                        ];
                    }
                }
            }
        }
        _ => return false,
    }
    true
}

fn dot_q8_scalar(w: &Unpacked, xq: &[i8], xd: &[f32], xs: &[f32]) -> f32 {
    let n = w.n;
    let nb = n / QK;
    let mut acc = 0.0f32;
    for (b, (wq, x)) in w.q[..n]
        .chunks_exact(QK)
        .zip(xq.chunks_exact(QK))
        .enumerate()
    {
        let isum = if w.has_sub {
            let lo: i32 = wq[..16]
                .iter()
                .zip(&x[..16])
                .map(|(a, b)| i32::from(*a) * i32::from(*b))
                .sum();
            let hi: i32 = wq[16..]
                .iter()
                .zip(&x[16..])
                .map(|(a, b)| i32::from(*a) * i32::from(*b))
                .sum();
            i32::from(w.sc[b][0]) * lo + i32::from(w.sc[b][1]) * hi
        } else {
            wq.iter()
                .zip(x)
                .map(|(a, b)| i32::from(*a) * i32::from(*b))
                .sum()
        };
        acc += (w.d[b] * xd[b]) * isum as f32;
    }
    if w.has_min {
        for (m, s) in w.m[..nb].iter().zip(xs) {
            acc += m * s;
        }
    }
    acc
}

/// Eight lanes, summed pairwise at the end: vectorizes without reassociation.
#[inline(always)]
fn dot_f32_body(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, ar) = a.as_chunks::<8>();
    let (bc, br) = b.as_chunks::<8>();
    for (x, y) in ac.iter().zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    let s4 = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (s4[0] + s4[2]) + (s4[1] + s4[3]) + tail
}

/// [`Kernels::gemm_acc`] for the columns from `from` on.
#[inline(always)]
fn gemm_acc_body(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize, from: usize) {
    if from >= n {
        return;
    }
    for (ci, ai) in c.chunks_exact_mut(n).zip(a.chunks_exact(k)).take(m) {
        for (av, bk) in ai.iter().zip(b.chunks_exact(n)) {
            for (y, x) in ci[from..].iter_mut().zip(&bk[from..]) {
                *y += av * x;
            }
        }
    }
}

#[inline(always)]
fn axpy_body(a: f32, x: &[f32], y: &mut [f32]) {
    for (x, y) in x.iter().zip(y.iter_mut()) {
        *y += a * x;
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
pub(super) mod tests;
