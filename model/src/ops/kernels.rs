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
//! f32 scale per 256, [`Q8Rows::per_256`]) and those dots run in `kdot.rs`, in llama.cpp's
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
    /// ([`super::kdot`]) subtract their offsets and mins with.
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

/// Q4_K's 6-bit scale and min of sub-block `j` (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(super) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
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
                let scales = &b[4..16];
                let qs = &b[16..144];
                for c in 0..4 {
                    let (s1, m1) = scale_min_k4(2 * c, scales);
                    let (s2, m2) = scale_min_k4(2 * c + 1, scales);
                    d[2 * c] = dd * f32::from(s1);
                    m[2 * c] = -(dmin * f32::from(m1));
                    d[2 * c + 1] = dd * f32::from(s2);
                    m[2 * c + 1] = -(dmin * f32::from(m2));
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
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Half, Q8Rows, QK, Unpacked};
    use crate::ggml_type::GgmlType;

    struct F16cHalf;

    impl Half for F16cHalf {
        #[inline(always)]
        fn h2f(lo: u8, hi: u8) -> f32 {
            let bits = i32::from(u16::from_le_bytes([lo, hi]));
            // SAFETY: F16cHalf is only used by the functions below, which run only after
            // `Kernels::detect` found F16C.
            unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits))) }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
        super::quantize_row_body(x, q, d, s);
    }

    /// 32 bytes at `p`.
    ///
    /// # Safety
    /// `p` must be valid for reading 32 bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn load32(p: *const u8) -> __m256i {
        // SAFETY: the caller's contract; unaligned load.
        unsafe { _mm256_loadu_si256(p.cast::<__m256i>()) }
    }

    /// 16 packed nibble bytes at `p` as 32 bytes: low nibbles (elements 0..16), then high.
    ///
    /// # Safety
    /// `p` must be valid for reading 16 bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        // SAFETY: the caller's contract; unaligned load.
        let x = unsafe { _mm_loadu_si128(p.cast::<__m128i>()) };
        let m4 = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(x, m4);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), m4);
        _mm256_set_m128i(hi, lo)
    }

    /// Bit `i` of `bits` as byte `i`: 0xff where set, 0 where clear (ggml's
    /// `bytes_from_bits_32`).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn bytes_from_bits(bits: u32) -> __m256i {
        let shuf = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
        let mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
        _mm256_cmpeq_epi8(_mm256_or_si256(bytes, mask), _mm256_set1_epi64x(-1))
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    fn store(q: &mut [i8; QK], v: __m256i) {
        // SAFETY: 32 bytes; unaligned store.
        unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast::<__m256i>(), v) }
    }

    /// The same values as `unpack_body`, 32 at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn unpack(ty: GgmlType, bytes: &[u8], u: &mut Unpacked) -> bool {
        if !super::has_q8_dot(ty) {
            return false;
        }
        let n = bytes.len() / ty.bytes_per_block() * ty.block_size();
        u.prepare(n);
        let nb = n / QK;
        u.has_min = false;
        u.has_sub = false;
        let (q, _) = u.q[..n].as_chunks_mut::<QK>();
        let d = &mut u.d[..nb];
        let h = F16cHalf::h2f;
        let m4 = _mm256_set1_epi8(0x0f);
        match ty {
            GgmlType::Q8_0 => {
                for ((b, q), d) in bytes.as_chunks::<34>().0.iter().zip(q).zip(d) {
                    *d = h(b[0], b[1]);
                    // SAFETY: bytes 2..34 of a 34-byte block.
                    store(q, unsafe { load32(b.as_ptr().add(2)) });
                }
            }
            GgmlType::Q4_0 => {
                let eight = _mm256_set1_epi8(8);
                for ((b, q), d) in bytes.as_chunks::<18>().0.iter().zip(q).zip(d) {
                    *d = h(b[0], b[1]);
                    // SAFETY: bytes 2..18 of an 18-byte block.
                    let v = unsafe { nibbles(b.as_ptr().add(2)) };
                    store(q, _mm256_sub_epi8(v, eight));
                }
            }
            GgmlType::Q4_1 => {
                u.has_min = true;
                let m = &mut u.m[..nb];
                for (((b, q), d), m) in bytes.as_chunks::<20>().0.iter().zip(q).zip(d).zip(m) {
                    *d = h(b[0], b[1]);
                    *m = h(b[2], b[3]);
                    // SAFETY: bytes 4..20 of a 20-byte block.
                    store(q, unsafe { nibbles(b.as_ptr().add(4)) });
                }
            }
            GgmlType::Q5_0 => {
                let f0 = _mm256_set1_epi8(0xf0u8 as i8);
                for ((b, q), d) in bytes.as_chunks::<22>().0.iter().zip(q).zip(d) {
                    *d = h(b[0], b[1]);
                    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                    // SAFETY: bytes 6..22 of a 22-byte block.
                    let v = unsafe { nibbles(b.as_ptr().add(6)) };
                    // (nibble | bit << 4) - 16: where the bit is clear, nibble | 0xf0.
                    let hi = _mm256_andnot_si256(bytes_from_bits(qh), f0);
                    store(q, _mm256_or_si256(v, hi));
                }
            }
            GgmlType::Q4_K => {
                u.has_min = true;
                let m = &mut u.m[..nb];
                for (((b, q), d), m) in bytes
                    .as_chunks::<144>()
                    .0
                    .iter()
                    .zip(q.chunks_exact_mut(8))
                    .zip(d.chunks_exact_mut(8))
                    .zip(m.chunks_exact_mut(8))
                {
                    let dd = h(b[0], b[1]);
                    let dmin = h(b[2], b[3]);
                    let scales = &b[4..16];
                    for j in 0..8 {
                        let (sc, mn) = super::scale_min_k4(j, scales);
                        d[j] = dd * f32::from(sc);
                        m[j] = -(dmin * f32::from(mn));
                    }
                    for c in 0..4 {
                        // SAFETY: bytes 16 + 32c .. 48 + 32c of a 144-byte block, c < 4.
                        let raw = unsafe { load32(b.as_ptr().add(16 + 32 * c)) };
                        store(&mut q[2 * c], _mm256_and_si256(raw, m4));
                        store(
                            &mut q[2 * c + 1],
                            _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4),
                        );
                    }
                }
            }
            GgmlType::Q6_K => {
                u.has_sub = true;
                let sc = &mut u.sc[..nb];
                let m2 = _mm256_set1_epi8(3);
                let k32 = _mm256_set1_epi8(32);
                for (((b, q), d), sc) in bytes
                    .as_chunks::<210>()
                    .0
                    .iter()
                    .zip(q.chunks_exact_mut(8))
                    .zip(d.chunks_exact_mut(8))
                    .zip(sc.chunks_exact_mut(8))
                {
                    d.fill(h(b[208], b[209]));
                    for n in 0..2 {
                        // SAFETY: ql at 64n .. 64n + 64 and qh at 128 + 32n .. 160 + 32n of
                        // a 210-byte block, n < 2.
                        let (ql0, ql1, qh) = unsafe {
                            (
                                load32(b.as_ptr().add(64 * n)),
                                load32(b.as_ptr().add(64 * n + 32)),
                                load32(b.as_ptr().add(128 + 32 * n)),
                            )
                        };
                        let hb =
                            |shift: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(shift, m2));
                        let q0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), hb(qh));
                        let q1 = _mm256_or_si256(
                            _mm256_and_si256(ql1, m4),
                            hb(_mm256_srli_epi16::<2>(qh)),
                        );
                        let q2 = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                            hb(_mm256_srli_epi16::<4>(qh)),
                        );
                        let q3 = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                            hb(_mm256_srli_epi16::<6>(qh)),
                        );
                        for (k, v) in [q0, q1, q2, q3].into_iter().enumerate() {
                            store(&mut q[4 * n + k], _mm256_sub_epi8(v, k32));
                            sc[4 * n + k] = [
                                i16::from(b[192 + 8 * n + 2 * k] as i8),
                                i16::from(b[192 + 8 * n + 2 * k + 1] as i8),
                            ];
                        }
                    }
                }
            }
            _ => return false,
        }
        true
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<0x55>(s, s));
        _mm_cvtss_f32(s)
    }

    /// 32 i8 weights times 32 i8 activations: eight i32 partial sums (ggml's sign trick:
    /// |w| as u8 times x with w's sign, `maddubs` then `madd` by `scale`, i16 lanes).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn block_dot(w: &[i8; QK], x: &[i8; QK], scale: __m256i) -> __m256i {
        // SAFETY: both arrays are 32 bytes; unaligned loads.
        let (w, x) = unsafe {
            (
                _mm256_loadu_si256(w.as_ptr().cast::<__m256i>()),
                _mm256_loadu_si256(x.as_ptr().cast::<__m256i>()),
            )
        };
        let aw = _mm256_sign_epi8(w, w);
        let sx = _mm256_sign_epi8(x, w);
        let p16 = _mm256_maddubs_epi16(aw, sx);
        _mm256_madd_epi16(p16, scale)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn dot_q8(w: &Unpacked, xq: &[i8], xd: &[f32], xs: &[f32]) -> f32 {
        let n = w.n;
        let nb = n / QK;
        let (wq, _) = w.q[..n].as_chunks::<QK>();
        let (xq, _) = xq[..n].as_chunks::<QK>();
        let wd = &w.d[..nb];
        let xd = &xd[..nb];
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        if w.has_sub {
            let sc = &w.sc[..nb];
            for (((wq, x), sc), d) in wq.iter().zip(xq).zip(sc).zip(wd.iter().zip(xd)) {
                let s = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
                let p = _mm256_cvtepi32_ps(block_dot(wq, x, s));
                acc0 = _mm256_fmadd_ps(p, _mm256_set1_ps(d.0 * d.1), acc0);
            }
        } else {
            let ones = _mm256_set1_epi16(1);
            let mut it = wq.iter().zip(xq).zip(wd.iter().zip(xd));
            loop {
                match (it.next(), it.next()) {
                    (Some(((w0, x0), d0)), Some(((w1, x1), d1))) => {
                        let p0 = _mm256_cvtepi32_ps(block_dot(w0, x0, ones));
                        let p1 = _mm256_cvtepi32_ps(block_dot(w1, x1, ones));
                        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(d0.0 * d0.1), acc0);
                        acc1 = _mm256_fmadd_ps(p1, _mm256_set1_ps(d1.0 * d1.1), acc1);
                    }
                    (Some(((w0, x0), d0)), None) => {
                        let p0 = _mm256_cvtepi32_ps(block_dot(w0, x0, ones));
                        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(d0.0 * d0.1), acc0);
                        break;
                    }
                    _ => break,
                }
            }
        }
        let mut sum = hsum(_mm256_add_ps(acc0, acc1));
        if w.has_min {
            sum += dot_f32(&w.m[..nb], &xs[..nb]);
        }
        sum
    }

    /// One decoded 32-weight block: the weights, their scale, their min (times the
    /// activation block's Σ), and the `madd` multipliers (ones, or Q6_K's sub-scales).
    #[derive(Clone, Copy)]
    struct Dec {
        q: __m256i,
        d: f32,
        m: f32,
        sc: __m256i,
    }

    impl Dec {
        // SAFETY: all-zero bytes are valid __m256i values.
        const ZERO: Dec = Dec {
            q: unsafe { std::mem::transmute::<[u8; 32], __m256i>([0; 32]) },
            d: 0.0,
            m: 0.0,
            sc: unsafe { std::mem::transmute::<[u8; 32], __m256i>([0; 32]) },
        };
    }

    /// A weight format decoded a block at a time. `decode` fills `SUB` entries of `out`
    /// from one encoded block of `BYTES` bytes.
    trait Decoder {
        const BYTES: usize;
        const SUB: usize;
        const MIN: bool;
        /// Every entry's `sc` is 1 (the scale is in `d`).
        const UNIT_SCALE: bool = true;
        /// Every quant is non-negative (nibbles with a min term): the unsigned × signed
        /// byte product takes the weights as they are, without the sign trick signed
        /// weights need — the same integers, two instructions fewer a block.
        const UNSIGNED: bool = false;
        /// # Safety
        /// `b` must be valid for reading `BYTES` bytes, and the CPU must have AVX2 and
        /// F16C (only called from the `#[target_feature]` functions below).
        unsafe fn decode(b: *const u8, out: &mut [Dec; 8]) {
            // SAFETY: the same contract.
            out[0] = unsafe { Self::one(b) };
        }
        /// The block's only entry, for `SUB == 1`.
        ///
        /// # Safety
        /// As [`Decoder::decode`].
        unsafe fn one(b: *const u8) -> Dec;
    }

    /// # Safety
    /// `p` valid for 2 bytes; F16C.
    #[inline(always)]
    unsafe fn h_at(p: *const u8) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { F16cHalf::h2f(*p, *p.add(1)) }
    }

    struct DQ8_0;
    impl Decoder for DQ8_0 {
        const BYTES: usize = 34;
        const SUB: usize = 1;
        const MIN: bool = false;
        #[inline(always)]
        unsafe fn one(b: *const u8) -> Dec {
            // SAFETY: the trait's contract: 34 readable bytes, AVX2.
            unsafe {
                Dec {
                    q: load32(b.add(2)),
                    d: h_at(b),
                    m: 0.0,
                    sc: _mm256_set1_epi16(1),
                }
            }
        }
    }

    struct DQ4_0;
    impl Decoder for DQ4_0 {
        const BYTES: usize = 18;
        const SUB: usize = 1;
        const MIN: bool = false;
        #[inline(always)]
        unsafe fn one(b: *const u8) -> Dec {
            // SAFETY: the trait's contract: 18 readable bytes, AVX2.
            unsafe {
                Dec {
                    q: _mm256_sub_epi8(nibbles(b.add(2)), _mm256_set1_epi8(8)),
                    d: h_at(b),
                    m: 0.0,
                    sc: _mm256_set1_epi16(1),
                }
            }
        }
    }

    struct DQ4_1;
    impl Decoder for DQ4_1 {
        const BYTES: usize = 20;
        const SUB: usize = 1;
        const MIN: bool = true;
        const UNSIGNED: bool = true;
        #[inline(always)]
        unsafe fn one(b: *const u8) -> Dec {
            // SAFETY: the trait's contract: 20 readable bytes, AVX2.
            unsafe {
                Dec {
                    q: nibbles(b.add(4)),
                    d: h_at(b),
                    m: h_at(b.add(2)),
                    sc: _mm256_set1_epi16(1),
                }
            }
        }
    }

    struct DQ5_0;
    impl Decoder for DQ5_0 {
        const BYTES: usize = 22;
        const SUB: usize = 1;
        const MIN: bool = false;
        #[inline(always)]
        unsafe fn one(b: *const u8) -> Dec {
            // SAFETY: the trait's contract: 22 readable bytes, AVX2.
            unsafe {
                let qh = u32::from_le_bytes([*b.add(2), *b.add(3), *b.add(4), *b.add(5)]);
                let hi = _mm256_andnot_si256(bytes_from_bits(qh), _mm256_set1_epi8(0xf0u8 as i8));
                Dec {
                    q: _mm256_or_si256(nibbles(b.add(6)), hi),
                    d: h_at(b),
                    m: 0.0,
                    sc: _mm256_set1_epi16(1),
                }
            }
        }
    }

    struct DQ4K;
    impl Decoder for DQ4K {
        const BYTES: usize = 144;
        const SUB: usize = 8;
        const MIN: bool = true;
        const UNSIGNED: bool = true;
        unsafe fn one(_: *const u8) -> Dec {
            Dec::ZERO
        }
        #[inline(always)]
        unsafe fn decode(b: *const u8, out: &mut [Dec; 8]) {
            // SAFETY: the trait's contract: 144 readable bytes, AVX2.
            unsafe {
                let dd = h_at(b);
                let dmin = h_at(b.add(2));
                let scales = &*b.add(4).cast::<[u8; 12]>();
                let m4 = _mm256_set1_epi8(0x0f);
                let ones = _mm256_set1_epi16(1);
                for c in 0..4 {
                    let raw = load32(b.add(16 + 32 * c));
                    for (j, q) in [
                        (2 * c, _mm256_and_si256(raw, m4)),
                        (2 * c + 1, _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4)),
                    ] {
                        let (sc, mn) = super::scale_min_k4(j, scales);
                        out[j] = Dec {
                            q,
                            d: dd * f32::from(sc),
                            m: -(dmin * f32::from(mn)),
                            sc: ones,
                        };
                    }
                }
            }
        }
    }

    struct DQ6K;
    impl Decoder for DQ6K {
        const BYTES: usize = 210;
        const SUB: usize = 8;
        const MIN: bool = false;
        const UNIT_SCALE: bool = false;
        unsafe fn one(_: *const u8) -> Dec {
            Dec::ZERO
        }
        #[inline(always)]
        unsafe fn decode(b: *const u8, out: &mut [Dec; 8]) {
            // SAFETY: the trait's contract: 210 readable bytes, AVX2.
            unsafe {
                let d = h_at(b.add(208));
                let m4 = _mm256_set1_epi8(0x0f);
                let m2 = _mm256_set1_epi8(3);
                let k32 = _mm256_set1_epi8(32);
                for n in 0..2 {
                    let ql0 = load32(b.add(64 * n));
                    let ql1 = load32(b.add(64 * n + 32));
                    let qh = load32(b.add(128 + 32 * n));
                    let hb = |x: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(x, m2));
                    let qs = [
                        _mm256_or_si256(_mm256_and_si256(ql0, m4), hb(qh)),
                        _mm256_or_si256(_mm256_and_si256(ql1, m4), hb(_mm256_srli_epi16::<2>(qh))),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                            hb(_mm256_srli_epi16::<4>(qh)),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                            hb(_mm256_srli_epi16::<6>(qh)),
                        ),
                    ];
                    for (k, q) in qs.into_iter().enumerate() {
                        let s0 = i16::from(*b.add(192 + 8 * n + 2 * k) as i8);
                        let s1 = i16::from(*b.add(192 + 8 * n + 2 * k + 1) as i8);
                        out[4 * n + k] = Dec {
                            q: _mm256_sub_epi8(q, k32),
                            d,
                            m: 0.0,
                            sc: _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0)),
                        };
                    }
                }
            }
        }
    }

    /// Weight block `$dw` (a `Dec` of decoder `$D`) dotted with 32 activation bytes `$xv`:
    /// the block's integer sums as f32 lanes. Non-negative quants enter the unsigned ×
    /// signed byte product as they are; signed ones through the sign trick. A macro, not a
    /// function: it expands inside the `#[target_feature]` function that uses it, so its
    /// intrinsics inline (with VNNI's `vpdpbusd` where that function has it).
    macro_rules! block_dot {
        ($D:ty, $vnni:expr, $dw:expr, $xv:expr) => {{
            let dw: &Dec = $dw;
            let xv: __m256i = $xv;
            let (aw, sx) = if <$D>::UNSIGNED {
                (dw.q, xv)
            } else {
                (_mm256_sign_epi8(dw.q, dw.q), _mm256_sign_epi8(xv, dw.q))
            };
            let i = if $vnni && <$D>::UNIT_SCALE {
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx)
            } else {
                _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), dw.sc)
            };
            _mm256_cvtepi32_ps(i)
        }};
    }

    /// `NR` rows starting at `r0`: one accumulator per row, blocks in order (so a row's
    /// value is the same whatever `NR` it was computed in).
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `w` whole blocks of `D`, `x` rows of at least `w`'s width.
    #[inline(always)]
    unsafe fn fused<D: Decoder, const NR: usize, const VNNI: bool>(
        w: &[u8],
        x: &Q8Rows,
        r0: usize,
        out: &mut [f32],
    ) {
        let n = x.n;
        let nb = n / QK;
        let blocks = w.len() / D::BYTES;
        // SAFETY: the caller's contract (CPU features); every pointer below is checked by
        // the slicing that makes it.
        unsafe {
            // One accumulator per row, block by block, and the min term by FMA: ggml's
            // float order, so the same bits as its dots (`model/src/ops/ggml_round.rs`).
            let mut acc = [_mm256_setzero_ps(); NR];
            let mut accm = [0.0f32; NR];
            // Row starts; the caller checked `x` holds rows r0..r0 + NR of n.
            let xq: [*const i8; NR] = std::array::from_fn(|r| x.q.as_ptr().add((r0 + r) * n));
            let xd: [*const f32; NR] = std::array::from_fn(|r| x.d.as_ptr().add((r0 + r) * nb));
            let xs: [*const f32; NR] = std::array::from_fn(|r| x.s.as_ptr().add((r0 + r) * nb));
            // A macro, not a closure: a closure would not inherit the target features, and
            // its intrinsics would be calls.
            macro_rules! block {
                ($b:expr, $dw:expr) => {{
                    let b: usize = $b;
                    let dw: &Dec = $dw;
                    for r in 0..NR {
                        let xv = load32(xq[r].add(b * QK).cast::<u8>());
                        let p = block_dot!(D, VNNI, dw, xv);
                        acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw.d * *xd[r].add(b)), acc[r]);
                        if D::MIN {
                            accm[r] = dw.m.mul_add(*xs[r].add(b), accm[r]);
                        }
                    }
                }};
            }
            let blocks = blocks.min(nb / D::SUB);
            if D::SUB == 1 {
                for b in 0..blocks {
                    block!(b, &D::one(w.as_ptr().add(b * D::BYTES)));
                }
            } else {
                let mut dec = [Dec::ZERO; 8];
                for bi in 0..blocks {
                    D::decode(w.as_ptr().add(bi * D::BYTES), &mut dec);
                    for (s, dw) in dec.iter().enumerate().take(D::SUB) {
                        block!(bi * D::SUB + s, dw);
                    }
                }
            }
            for r in 0..NR {
                out[r0 + r] = hsum(acc[r]) + accm[r];
            }
        }
    }

    /// `MW` weight rows against activation row `r0`, for one-block decoders: each weight
    /// row's blocks in [`fused`]'s order and arithmetic (the same bits), the rows' chains
    /// interleaved. A one-row decode is otherwise one serial chain of FMAs per weight row,
    /// each block waiting for the last; `MW` independent chains hide that latency, and
    /// the activation block is loaded once for all of them.
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `D::SUB == 1`; each `w[m]` whole blocks of `D`, `x` a row `r0` of at
    /// least their width; `out` at least `MW` long.
    #[inline(always)]
    unsafe fn fused_wide<D: Decoder, const MW: usize, const VNNI: bool>(
        w: [&[u8]; MW],
        x: &Q8Rows,
        r0: usize,
        out: &mut [f32],
    ) {
        let n = x.n;
        let nb = n / QK;
        let blocks = w
            .iter()
            .map(|r| r.len() / D::BYTES)
            .min()
            .unwrap_or(0)
            .min(nb);
        // SAFETY: the caller's contract; every pointer is within the slices checked by
        // the caller (`matrix_of`).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); MW];
            let mut accm = [0.0f32; MW];
            let xq = x.q.as_ptr().add(r0 * n);
            let xd = x.d.as_ptr().add(r0 * nb);
            let xs = x.s.as_ptr().add(r0 * nb);
            for b in 0..blocks {
                let xv = load32(xq.add(b * QK).cast::<u8>());
                let (xdb, xsb) = (*xd.add(b), *xs.add(b));
                for m in 0..MW {
                    let dw = D::one(w[m].as_ptr().add(b * D::BYTES));
                    let p = block_dot!(D, VNNI, &dw, xv);
                    acc[m] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw.d * xdb), acc[m]);
                    if D::MIN {
                        accm[m] = dw.m.mul_add(xsb, accm[m]);
                    }
                }
            }
            for m in 0..MW {
                out[m] = hsum(acc[m]) + accm[m];
            }
        }
    }

    /// # Safety
    /// AVX2, FMA, F16C.
    #[inline(always)]
    unsafe fn matrix_of<D: Decoder, const VNNI: bool>(
        w: &[u8],
        row_bytes: usize,
        x: &Q8Rows,
        rows: usize,
        out: &mut [f32],
    ) -> bool {
        if row_bytes == 0
            || !row_bytes.is_multiple_of(D::BYTES)
            || (row_bytes / D::BYTES) * D::SUB * QK != x.n
            || !w.len().is_multiple_of(row_bytes)
            || x.q.len() < rows * x.n
            || x.d.len() < rows * (x.n / QK)
            || x.s.len() < rows * (x.n / QK)
            || out.len() < rows * (w.len() / row_bytes)
        {
            return false;
        }
        // SAFETY: the caller's contract; sizes checked above.
        unsafe {
            if rows == 1 && D::SUB == 1 {
                // A one-row decode: four weight rows' chains at a time.
                let mut ws = w.chunks_exact(row_bytes);
                let mut outs = out.chunks_exact_mut(4);
                let whole = (w.len() / row_bytes) / 4;
                for _ in 0..whole {
                    let (Some(a), Some(b), Some(c), Some(d), Some(o)) =
                        (ws.next(), ws.next(), ws.next(), ws.next(), outs.next())
                    else {
                        break;
                    };
                    fused_wide::<D, 4, VNNI>([a, b, c, d], x, 0, o);
                }
                let done = whole * 4;
                for (wr, o) in ws.zip(out[done..].chunks_exact_mut(1)) {
                    fused::<D, 1, VNNI>(wr, x, 0, o);
                }
                return true;
            }
            for (wr, out) in w
                .chunks_exact(row_bytes)
                .zip(out.chunks_exact_mut(rows.max(1)))
            {
                let mut r = 0;
                while r + 4 <= rows {
                    fused::<D, 4, VNNI>(wr, x, r, out);
                    r += 4;
                }
                if r + 2 <= rows {
                    fused::<D, 2, VNNI>(wr, x, r, out);
                    r += 2;
                }
                if r < rows {
                    fused::<D, 1, VNNI>(wr, x, r, out);
                }
            }
        }
        true
    }

    /// # Safety
    /// AVX2, FMA, F16C, and with `VNNI` AVX-512 VNNI and VL.
    #[inline(always)]
    unsafe fn dot_matrix_body<const VNNI: bool>(
        ty: GgmlType,
        w: &[u8],
        row_bytes: usize,
        x: &Q8Rows,
        rows: usize,
        out: &mut [f32],
    ) -> bool {
        // SAFETY: the caller's contract.
        unsafe {
            if x.per_256 && matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
                return super::super::kdot::avx2::matrix(ty, w, row_bytes, x, rows, out);
            }
            match ty {
                GgmlType::Q8_0 => matrix_of::<DQ8_0, VNNI>(w, row_bytes, x, rows, out),
                GgmlType::Q4_0 => matrix_of::<DQ4_0, VNNI>(w, row_bytes, x, rows, out),
                GgmlType::Q4_1 => matrix_of::<DQ4_1, VNNI>(w, row_bytes, x, rows, out),
                GgmlType::Q5_0 => matrix_of::<DQ5_0, VNNI>(w, row_bytes, x, rows, out),
                GgmlType::Q4_K => matrix_of::<DQ4K, VNNI>(w, row_bytes, x, rows, out),
                GgmlType::Q6_K => matrix_of::<DQ6K, VNNI>(w, row_bytes, x, rows, out),
                _ => false,
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn dot_matrix(
        ty: GgmlType,
        w: &[u8],
        row_bytes: usize,
        x: &Q8Rows,
        rows: usize,
        out: &mut [f32],
    ) -> bool {
        // SAFETY: this function's target features are the body's contract.
        unsafe { dot_matrix_body::<false>(ty, w, row_bytes, x, rows, out) }
    }

    /// [`dot_matrix`] with AVX-512 VNNI's `vpdpbusd` for the block dots (the same
    /// integers as `maddubs` then `madd`, in one instruction, as llama.cpp's `updot` with
    /// `__AVX512VNNI__`).
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    pub(super) fn dot_matrix_vnni(
        ty: GgmlType,
        w: &[u8],
        row_bytes: usize,
        x: &Q8Rows,
        rows: usize,
        out: &mut [f32],
    ) -> bool {
        // SAFETY: this function's target features are the body's contract.
        unsafe { dot_matrix_body::<true>(ty, w, row_bytes, x, rows, out) }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let (ac, ar) = a.as_chunks::<16>();
        let (bc, br) = b.as_chunks::<16>();
        for (x, y) in ac.iter().zip(bc) {
            // SAFETY: each chunk is 16 f32s; unaligned loads of 8 at offsets 0 and 8.
            unsafe {
                let x0 = _mm256_loadu_ps(x.as_ptr());
                let x1 = _mm256_loadu_ps(x.as_ptr().add(8));
                let y0 = _mm256_loadu_ps(y.as_ptr());
                let y1 = _mm256_loadu_ps(y.as_ptr().add(8));
                acc0 = _mm256_fmadd_ps(x0, y0, acc0);
                acc1 = _mm256_fmadd_ps(x1, y1, acc1);
            }
        }
        let mut sum = hsum(_mm256_add_ps(acc0, acc1));
        for (x, y) in ar.iter().zip(br) {
            sum += x * y;
        }
        sum
    }

    /// Six rows of `C` by 16 columns in twelve registers, `k` FMAs each; the rows left
    /// over one at a time, the columns past a multiple of 16 in the portable body.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn gemm_acc(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
        let n16 = n / 16 * 16;
        let mut i = 0;
        while i + 6 <= m {
            // SAFETY: rows i..i + 6 are in range; `gemm_block` reads A's rows and B's
            // first `n16` columns and writes C's within the slices' shapes.
            unsafe { gemm_block::<6>(c, a, b, i, k, n, n16) };
            i += 6;
        }
        while i < m {
            // SAFETY: as above, row i alone.
            unsafe { gemm_block::<1>(c, a, b, i, k, n, n16) };
            i += 1;
        }
        super::gemm_acc_body(c, a, b, m, k, n, n16);
    }

    /// Rows `i..i + R` of `C`, columns `0..n16`.
    ///
    /// # Safety
    /// `i + R <= m`, `n16 <= n`, a multiple of 16, and `c`, `a`, `b` hold `m × n`,
    /// `m × k`, `k × n` values.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_block<const R: usize>(
        c: &mut [f32],
        a: &[f32],
        b: &[f32],
        i: usize,
        k: usize,
        n: usize,
        n16: usize,
    ) {
        let (cp, ap, bp) = (c.as_mut_ptr(), a.as_ptr(), b.as_ptr());
        let mut j = 0;
        while j < n16 {
            // SAFETY: every offset below is within the shapes of the contract.
            unsafe {
                let mut acc = [[_mm256_setzero_ps(); 2]; R];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let p = cp.add((i + r) * n + j);
                    acc[0] = _mm256_loadu_ps(p);
                    acc[1] = _mm256_loadu_ps(p.add(8));
                }
                for kk in 0..k {
                    let q = bp.add(kk * n + j);
                    let b0 = _mm256_loadu_ps(q);
                    let b1 = _mm256_loadu_ps(q.add(8));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let av = _mm256_set1_ps(*ap.add((i + r) * k + kk));
                        acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
                        acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
                    }
                }
                for (r, acc) in acc.iter().enumerate() {
                    let p = cp.add((i + r) * n + j);
                    _mm256_storeu_ps(p, acc[0]);
                    _mm256_storeu_ps(p.add(8), acc[1]);
                }
            }
            j += 16;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let (x, y) = (&x[..n], &mut y[..n]);
        let va = _mm256_set1_ps(a);
        let (xc, xr) = x.as_chunks::<8>();
        let (yc, yr) = y.as_chunks_mut::<8>();
        for (x, y) in xc.iter().zip(yc) {
            // SAFETY: 8 f32s each; unaligned loads and store.
            unsafe {
                let v =
                    _mm256_fmadd_ps(va, _mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr()));
                _mm256_storeu_ps(y.as_mut_ptr(), v);
            }
        }
        for (x, y) in xr.iter().zip(yr) {
            *y += a * x;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
        let n = dst.len().min(src.len() / 2);
        let (sc, sr) = src[..2 * n].as_chunks::<16>();
        let (dc, dr) = dst[..n].as_chunks_mut::<8>();
        for (s, d) in sc.iter().zip(dc) {
            // SAFETY: 16 bytes in, 8 f32s out; unaligned.
            unsafe {
                let h = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
        for (s, d) in sr.as_chunks::<2>().0.iter().zip(dr) {
            *d = F16cHalf::h2f(s[0], s[1]);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn f32_to_f16(src: &[f32], dst: &mut [u8]) {
        let n = src.len().min(dst.len() / 2);
        let (sc, sr) = src[..n].as_chunks::<8>();
        let (dc, dr) = dst[..2 * n].as_chunks_mut::<16>();
        for (s, d) in sc.iter().zip(dc) {
            // SAFETY: 8 f32s in, 16 bytes out; unaligned.
            unsafe {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
                _mm_storeu_si128(d.as_mut_ptr().cast::<__m128i>(), h);
            }
        }
        for (s, d) in sr.iter().zip(dr.as_chunks_mut::<2>().0) {
            *d = super::super::half::f32_to_f16(*s).to_le_bytes();
        }
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
pub(super) mod tests {
    use super::*;
    use crate::quant::dequantize;

    /// xorshift64, for the kernel tests here and in `kdot.rs`.
    pub(in crate::ops) struct Rng(pub(in crate::ops) u64);
    impl Rng {
        pub(in crate::ops) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub(in crate::ops) fn f(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// Random blocks of `ty` with sane f16 scales.
    pub(in crate::ops) fn random_row(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
        let nb = n / ty.block_size();
        let mut out = Vec::new();
        for _ in 0..nb {
            let mut b: Vec<u8> = (0..ty.bytes_per_block())
                .map(|_| rng.next() as u8)
                .collect();
            let h = |rng: &mut Rng| super::super::half::f32_to_f16(rng.f() * 0.05).to_le_bytes();
            match ty {
                GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => {
                    b[..2].copy_from_slice(&h(rng));
                }
                GgmlType::Q4_1 | GgmlType::Q4_K => {
                    b[..2].copy_from_slice(&h(rng));
                    b[2..4].copy_from_slice(&h(rng));
                }
                GgmlType::Q6_K => b[208..210].copy_from_slice(&h(rng)),
                _ => unreachable!(),
            }
            out.extend(b);
        }
        out
    }

    #[test]
    fn quantized_dot_matches_dequantized_dot() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let n = 512;
        let x: Vec<f32> = (0..n).map(|_| rng.f()).collect();
        for k in [Kernels::scalar(), Kernels::detect()] {
            let mut xq = Q8Rows::default();
            xq.quantize(k, &x, 1, n);
            let (q, d, s) = xq.row(0);
            // The quantized activations are within half a step of x, plus the f16
            // rounding of the scale (at most 2^-11 relative, times |q| <= 127).
            for (i, v) in x.iter().enumerate() {
                let back = f32::from(q[i]) * d[i / QK];
                assert!((back - v).abs() <= d[i / QK] * (0.5 + 127.0 / 2048.0) + 1e-7);
            }
            // d and s are what ggml stores: f16 values.
            for (d, s) in d.iter().zip(s) {
                assert_eq!(f16_round(*d), *d);
                assert_eq!(f16_round(*s), *s);
            }
            for ty in [
                GgmlType::Q8_0,
                GgmlType::Q4_0,
                GgmlType::Q4_1,
                GgmlType::Q5_0,
                GgmlType::Q4_K,
                GgmlType::Q6_K,
            ] {
                let w = random_row(ty, n, &mut rng);
                let mut wf = vec![0.0; n];
                dequantize(ty, &w, n, &mut wf).unwrap();
                let mut u = Unpacked::with_capacity(16);
                assert!(k.unpack(ty, &w, &mut u));
                let mut us = Unpacked::with_capacity(n);
                assert!(Kernels::scalar().unpack(ty, &w, &mut us));
                let nb = n / QK;
                assert_eq!(u.q[..n], us.q[..n], "{ty}");
                assert_eq!(u.d[..nb], us.d[..nb], "{ty}");
                assert_eq!((u.has_min, u.has_sub), (us.has_min, us.has_sub), "{ty}");
                if u.has_min {
                    assert_eq!(u.m[..nb], us.m[..nb], "{ty}");
                }
                if u.has_sub {
                    assert_eq!(u.sc[..nb], us.sc[..nb], "{ty}");
                }
                // The unpacked row is the dequantized row, value for value.
                for i in 0..n {
                    let b = i / QK;
                    let sc = if u.has_sub {
                        f32::from(u.sc[b][usize::from(i % QK >= 16)])
                    } else {
                        1.0
                    };
                    let m = if u.has_min { u.m[b] } else { 0.0 };
                    let v = u.d[b] * sc * f32::from(u.q[i]) + m;
                    assert!((v - wf[i]).abs() <= 1e-6 * (1.0 + wf[i].abs()), "{ty} {i}");
                }
                // Dot with the quantized activation equals the exact dot of the
                // dequantized weights with the dequantized activations...
                let xback: Vec<f32> = (0..n).map(|i| f32::from(q[i]) * d[i / QK]).collect();
                let exact: f64 = wf
                    .iter()
                    .zip(&xback)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let got = k.dot_q8(&u, q, d, s);
                let mag: f64 = wf
                    .iter()
                    .zip(&xback)
                    .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                    .sum();
                assert!(
                    (f64::from(got) - exact).abs() <= 1e-5 * mag + 1e-6,
                    "{ty} {k:?}: {got} vs {exact}"
                );
                // ...and the scalar path.
                let scalar = Kernels::scalar().dot_q8(&u, q, d, s);
                assert!((got - scalar).abs() <= 1e-5 * mag as f32 + 1e-6, "{ty}");
            }
        }
    }

    /// The fused kernels of this CPU, or `None` (the test says it skipped) without AVX2.
    fn fused_kernels() -> Option<Kernels> {
        let k = Kernels::detect();
        if !k.is_fused() {
            eprintln!("skipped: no AVX2 here");
            return None;
        }
        Some(k)
    }

    /// `rows` rows of `n` of `x` quantized for the fused dots.
    fn q8(k: Kernels, x: &[f32], rows: usize, n: usize) -> Q8Rows {
        let mut q = Q8Rows::default();
        q.quantize(k, x, rows, n);
        q
    }

    /// Every weight type the fused dots take.
    const FUSED_TYPES: [GgmlType; 6] = [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];

    /// The fused multi-row dot: the unpacked dot's value (to f32 rounding), and the same
    /// bits for a row whether computed alone or with 6 others.
    #[test]
    fn fused_rows_match_unpacked_and_ignore_the_batch() {
        let Some(k) = fused_kernels() else {
            return;
        };
        let mut rng = Rng(99);
        let n = 512;
        let rows = 7;
        let x: Vec<f32> = (0..n * rows).map(|_| rng.f()).collect();
        let xq = q8(k, &x, rows, n);
        for ty in FUSED_TYPES {
            let w = random_row(ty, n, &mut rng);
            let mut all = vec![0.0; rows];
            assert!(k.dot_rows(ty, &w, &xq, rows, &mut all));
            let mut u = Unpacked::with_capacity(n);
            assert!(k.unpack(ty, &w, &mut u));
            for i in 0..rows {
                let (q, d, s) = xq.row(i);
                let want = k.with_fused(false).dot_q8(&u, q, d, s);
                assert!(
                    (all[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{ty} row {i}"
                );
            }
            let mut one = vec![0.0; 1];
            assert!(k.dot_rows(ty, &w, &xq, 1, &mut one));
            assert_eq!(one[0].to_bits(), all[0].to_bits(), "{ty}");
            let mut three = vec![0.0; 3];
            assert!(k.dot_rows(ty, &w, &xq, 3, &mut three));
            assert_eq!(three, all[..3], "{ty}");
        }
        assert!(!k.dot_rows(GgmlType::F16, &[0; 64], &xq, 1, &mut [0.0]));
    }

    /// A one-row decode's matrix (weight rows in fours, then the rest) gives each weight
    /// row the bits that row gets alone and in a batch, and so does a batch's matrix:
    /// with and without VNNI.
    #[test]
    fn one_row_matrix_equals_each_weight_row_alone() {
        let Some(k) = fused_kernels() else {
            return;
        };
        let mut rng = Rng(7);
        let n = 256;
        let x: Vec<f32> = (0..n * 7).map(|_| rng.f()).collect();
        let (x1, xq, x7) = (q8(k, &x, 1, n), q8(k, &x, 4, n), q8(k, &x, 7, n));
        for ty in FUSED_TYPES {
            let rows: Vec<Vec<u8>> = (0..11).map(|_| random_row(ty, n, &mut rng)).collect();
            let w: Vec<u8> = rows.concat();
            for kk in [k, Kernels { vnni: false, ..k }] {
                let mut got = vec![0.0; rows.len()];
                assert!(kk.dot_matrix(ty, &w, rows[0].len(), &x1, 1, &mut got));
                for (j, r) in rows.iter().enumerate() {
                    let mut alone = [0.0];
                    assert!(kk.dot_rows(ty, r, &x1, 1, &mut alone));
                    let mut batch = [0.0; 4];
                    assert!(kk.dot_rows(ty, r, &xq, 4, &mut batch));
                    assert_eq!(got[j].to_bits(), alone[0].to_bits(), "{ty} row {j}");
                    assert_eq!(got[j].to_bits(), batch[0].to_bits(), "{ty} row {j}");
                }
                // A batch of seven activation rows over the same matrix: each weight
                // row's column has the bits of that row alone.
                let mut got = vec![0.0; rows.len() * 7];
                assert!(kk.dot_matrix(ty, &w, rows[0].len(), &x7, 7, &mut got));
                for (j, r) in rows.iter().enumerate() {
                    let mut alone = [0.0; 7];
                    assert!(kk.dot_rows(ty, r, &x7, 7, &mut alone));
                    let got: Vec<u32> = got[j * 7..(j + 1) * 7]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    let want: Vec<u32> = alone.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{ty} weight row {j} over 7 rows");
                }
            }
        }
    }

    #[test]
    fn f32_dot_axpy_and_f16_rows_agree_across_paths() {
        let mut rng = Rng(77);
        let a: Vec<f32> = (0..259).map(|_| rng.f()).collect();
        let b: Vec<f32> = (0..259).map(|_| rng.f()).collect();
        let s = Kernels::scalar();
        let k = Kernels::detect();
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        for k in [s, k] {
            assert!((f64::from(k.dot_f32(&a, &b)) - want).abs() < 1e-5);
            let mut y = b.clone();
            k.axpy(0.5, &a, &mut y);
            for i in 0..259 {
                assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
            }
        }
        let xs: Vec<f32> = (0..1000).map(|_| rng.f() * 100.0).collect();
        let mut h1 = vec![0u8; 2000];
        let mut h2 = vec![0u8; 2000];
        s.f32_to_f16(&xs, &mut h1);
        k.f32_to_f16(&xs, &mut h2);
        assert_eq!(h1, h2);
        let mut f1 = vec![0.0; 1000];
        let mut f2 = vec![0.0; 1000];
        s.f16_to_f32(&h1, &mut f1);
        k.f16_to_f32(&h1, &mut f2);
        assert_eq!(f1, f2);
    }

    #[test]
    fn gemm_acc_adds_the_product_on_every_path_and_shape() {
        let mut rng = Rng(91);
        // Rows past a multiple of six and columns past a multiple of 16 take the
        // remainder paths; C starts non-zero (it accumulates).
        for (m, k, n) in [(13, 64, 64), (1, 7, 16), (6, 64, 40), (2, 3, 5)] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.f()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.f()).collect();
            let c0: Vec<f32> = (0..m * n).map(|_| rng.f()).collect();
            for kern in [Kernels::scalar(), Kernels::detect()] {
                let mut c = c0.clone();
                kern.gemm_acc(&mut c, &a, &b, m, k, n);
                for i in 0..m {
                    for j in 0..n {
                        let want = f64::from(c0[i * n + j])
                            + (0..k)
                                .map(|t| f64::from(a[i * k + t]) * f64::from(b[t * n + j]))
                                .sum::<f64>();
                        let got = f64::from(c[i * n + j]);
                        assert!(
                            (got - want).abs() < 1e-5,
                            "{m}x{k}x{n} ({i}, {j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
