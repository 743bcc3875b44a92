// den-model's GPU kernels, compiled at run time by NVRTC (`gpu::kernels`).
//
// No headers: f16 goes through PTX's `cvt`, so the source compiles with any NVRTC and
// needs no CUDA include path. Every kernel works on f32 activations; the inputs of the
// matrix products (cuBLAS, outside this file) are written as f16, and K/V are stored as
// f16 in den's pages in the row layout the CPU path uses: a token's row is
// [layer][K|V][kv_head][head_dim], row `slot` of page `page` at
// `arena + (page × page_size + slot) × row_bytes`.
//
// Blocks are 1-D with a multiple of 32 threads (at most 1024); reductions are warp
// shuffles then one shared slot per warp.

typedef unsigned short half_t;
typedef unsigned int u32;
typedef unsigned long long u64;

#define DEN_INF __int_as_float(0x7f800000)

#ifndef DEN_EMULATE
__device__ __forceinline__ float h2f(half_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ half_t f2h(float f) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
// The CPU emulator of model/tests/it/gpu_emulator.cpp: the same conversions in software.
__device__ __forceinline__ float h2f(half_t h) { return emulated_h2f(h); }
__device__ __forceinline__ half_t f2h(float f) { return emulated_f2h(f); }
#endif

struct Sum {
    template <typename T> __device__ static T of(T a, T b) { return a + b; }
    template <typename T> __device__ static T identity() { return T(0); }
};

struct Max {
    __device__ static float of(float a, float b) { return fmaxf(a, b); }
    template <typename T> __device__ static T identity() { return -DEN_INF; }
};

// `Op` over `v` of every thread of the block, in every thread: a warp's lanes by shuffles,
// then the warps' results through `shared` (32 slots).
template <typename Op, typename T> __device__ T block_reduce(T v, T* shared) {
    for (int o = 16; o > 0; o >>= 1) v = Op::of(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // `shared` may still be read by a previous reduction
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    v = lane < warps ? shared[lane] : Op::template identity<T>();
    for (int o = 16; o > 0; o >>= 1) v = Op::of(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ double block_sum_d(double v, double* shared) { return block_reduce<Sum>(v, shared); }
__device__ float block_sum_f(float v, float* shared) { return block_reduce<Sum>(v, shared); }
__device__ float block_max_f(float v, float* shared) { return block_reduce<Max>(v, shared); }

// The address of row `t` of a sequence whose page table is `pt`.
__device__ __forceinline__ const unsigned char* kv_row(const unsigned char* arena, const u32* pt,
                                                        u32 t, u32 page_size, u64 row_bytes) {
    const u64 page = pt[t / page_size];
    return arena + (page * page_size + t % page_size) * row_bytes;
}

// x[r] = embedding[tokens[r]] × scale. Grid: rows.
extern "C" __global__ void den_embed(const half_t* table, const u32* tokens, float* x, int e,
                                     float scale) {
    const int r = blockIdx.x;
    const half_t* row = table + (u64)tokens[r] * e;
    float* out = x + (u64)r * e;
    for (int i = threadIdx.x; i < e; i += blockDim.x) out[i] = h2f(row[i]) * scale;
}

// y[r] = f16(x[src] / sqrt(mean(x[src]²) + eps) × w), src = rows ? rows[r] : r (the sum of
// squares in f64, as ggml sums). Grid: output rows.
extern "C" __global__ void den_rms_norm_h(const float* x, const float* w, half_t* y,
                                          const u32* rows, int e, float eps) {
    __shared__ double shared[32];
    const int r = blockIdx.x;
    const u64 src = rows ? rows[r] : (u32)r;
    const float* xr = x + src * e;
    double s = 0.0;
    for (int i = threadIdx.x; i < e; i += blockDim.x) {
        const float v = xr[i];
        s += (double)(v * v);
    }
    s = block_sum_d(s, shared);
    const float mean = (float)(s / e);
    const float scale = 1.0f / sqrtf(mean + eps);
    half_t* yr = y + (u64)r * e;
    for (int i = threadIdx.x; i < e; i += blockDim.x) yr[i] = f2h((xr[i] * scale) * w[i]);
}

// Per head of each row of `qkv` (row r: its query heads, then its K heads, then its V
// heads, `stride` floats apart): the optional RMS norm of the head (q_norm / k_norm), RoPE
// at the row's position (pairs (2i, 2i+1), or halves (i, i + n_rot/2) when `neox`), and the
// query scale. Angles as ggml computes them: pos × rope_scale × theta_scale^i, the power
// taken by repeated f32 multiplication. A K head's block then writes the head, and the V
// head of the same index, as f16 into the row's page slot (one launch instead of a
// separate append). Grid: (rows, n_head + n_kv).
extern "C" __global__ void den_qk_rope_append(float* qkv, int stride, const float* q_norm,
                                              const float* k_norm, const u32* pos, int n_head,
                                              int n_kv, int hd, int n_rot, int neox, float base,
                                              float rope_scale, float attn_scale, int qk_norm,
                                              float eps, unsigned char* arena,
                                              const u32* row_seq,
                                              const u32* pt_off, const u32* pages,
                                              u64 row_bytes, int page_size, u64 k_off,
                                              u64 v_off) {
    __shared__ double shared[32];
    __shared__ float buf[1024];
    const int r = blockIdx.x, h = blockIdx.y;
    const bool is_q = h < n_head;
    float* row = qkv + (u64)r * stride;
    float* v = row + (u64)h * hd;  // K heads follow the query heads
    for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = v[i];
    __syncthreads();
    if (qk_norm) {
        const float* w = is_q ? q_norm : k_norm;
        double s = 0.0;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) s += (double)(buf[i] * buf[i]);
        s = block_sum_d(s, shared);
        const float scale = 1.0f / sqrtf((float)(s / hd) + eps);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = (buf[i] * scale) * w[i];
        __syncthreads();
    }
    const int half = n_rot / 2;
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    const u32 p_r = pos[r];
    const float p = (float)p_r * rope_scale;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float theta = p;
        for (int j = 0; j < i; ++j) theta *= theta_scale;
        const float c = cosf(theta), s = sinf(theta);
        const int a = neox ? i : 2 * i;
        const int b = neox ? i + half : 2 * i + 1;
        const float x0 = buf[a], x1 = buf[b];
        buf[a] = fmaf(x0, c, -(x1 * s));
        buf[b] = fmaf(x0, s, x1 * c);
    }
    __syncthreads();
    const float out_scale = is_q ? attn_scale : 1.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = buf[i] * out_scale;
    if (is_q) return;
    const int kvh = h - n_head;
    const u32* pt = pages + pt_off[row_seq[r]];
    unsigned char* slot = (unsigned char*)kv_row(arena, pt, p_r, (u32)page_size, row_bytes);
    half_t* kd = (half_t*)(slot + k_off) + (u64)kvh * hd;
    half_t* vd = (half_t*)(slot + v_off) + (u64)kvh * hd;
    const float* vs = row + (u64)(n_head + n_kv + kvh) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        kd[i] = f2h(buf[i]);
        vd[i] = f2h(vs[i]);
    }
}

// The sum of `v` over a warp's lanes, in every lane.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Paged attention, one block per (row, query head): softmax(q · K) · V over the keys
// first..=pos of the row's sequence (first = pos + 1 − window with a sliding window),
// read from the pages through the sequence's page table; grouped-query heads share a KV
// head. The query is row r's head h of `qkv` (rows `q_stride` floats apart). Keys go in
// tiles of blockDim: the tile's row addresses are resolved once into shared memory; each
// warp scores keys warp, warp + warps, … with its lanes reading a key's dims in pairs, so
// a warp reads a key row contiguously (not a thread per key, whose reads are strided by
// the row size); an online softmax over the tiles; each thread accumulates output dims
// tid, tid + blockDim, … (head_dim ≤ 4 × blockDim) reading V rows contiguously across
// threads. Writes f16 (the next product's input). Needs an even head_dim.
extern "C" __global__ void den_attention(const float* qkv, int q_stride, half_t* out,
                                         const unsigned char* arena, const u32* row_seq,
                                         const u32* pos,
                                         const u32* pt_off, const u32* pages, int n_head,
                                         int n_kv, int hd, u64 row_bytes, int page_size,
                                         u64 k_off, u64 v_off, int window) {
    __shared__ float qs[1024];
    __shared__ float ps[1024];
    __shared__ u64 rowp[1024];
    __shared__ float red[32];
    const int r = blockIdx.x, h = blockIdx.y;
    const int kvh = h / (n_head / n_kv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float* qr = qkv + (u64)r * q_stride + (u64)h * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qr[i];
    const u32 p = pos[r];
    const u32 first = (window > 0 && p + 1 > (u32)window) ? p + 1 - (u32)window : 0u;
    const u32* pt = pages + pt_off[row_seq[r]];
    const u64 head = (u64)kvh * hd * 2;  // bytes into a layer's K (or V)
    const int pairs = hd / 2;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float m = -DEN_INF, l = 0.0f;
    for (u32 t0 = first; t0 <= p; t0 += blockDim.x) {
        const u32 count = min((u32)blockDim.x, p + 1 - t0);
        if (threadIdx.x < count)
            rowp[threadIdx.x] =
                (u64)kv_row(arena, pt, t0 + threadIdx.x, (u32)page_size, row_bytes);
        __syncthreads();
        // The same number of iterations in every warp: the shuffles need whole warps.
        for (u32 j = warp; j < blockDim.x; j += warps) {
            float d = 0.0f;
            if (j < count) {
                const u32* kr = (const u32*)(rowp[j] + k_off + head);
                for (int i = lane; i < pairs; i += 32) {
                    const u32 two = kr[i];
                    d = fmaf(qs[2 * i], h2f((half_t)(two & 0xffffu)), d);
                    d = fmaf(qs[2 * i + 1], h2f((half_t)(two >> 16)), d);
                }
            }
            d = warp_sum(d);
            if (lane == 0) ps[j] = j < count ? d : -DEN_INF;
        }
        __syncthreads();
        const float s = ps[threadIdx.x];
        const float tile_max = block_max_f(s, red);
        const float m_new = fmaxf(m, tile_max);
        const float e = threadIdx.x < count ? expf(s - m_new) : 0.0f;
        ps[threadIdx.x] = e;
        const float corr = m == -DEN_INF ? 0.0f : expf(m - m_new);
        // block_sum_f synchronises, so every thread sees the whole tile's `ps` after it.
        const float tile_sum = block_sum_f(e, red);
        l = l * corr + tile_sum;
        m = m_new;
        for (int j = 0; j < 4; ++j) {
            const int d = threadIdx.x + j * blockDim.x;
            if (d < hd) {
                float a = acc[j] * corr;
                for (u32 u = 0; u < count; ++u) {
                    const half_t* vr = (const half_t*)(rowp[u] + v_off + head);
                    a = fmaf(ps[u], h2f(vr[d]), a);
                }
                acc[j] = a;
            }
        }
        __syncthreads();
    }
    half_t* o = out + ((u64)r * n_head + h) * hd;
    for (int j = 0; j < 4; ++j) {
        const int d = threadIdx.x + j * blockDim.x;
        if (d < hd) o[d] = f2h(acc[j] / l);
    }
}

// x[r] += o[r], the optional post-norm `post` (Gemma's post_attention_norm /
// post_ffw_norm) applied to o first; then, with `norm`, the new row normed into h16 (the
// next product's input) as den_rms_norm_h does — one launch for the residual and the next
// sublayer's norm. Grid: rows.
extern "C" __global__ void den_add_norm_h(float* x, const float* o, const float* post,
                                          const float* norm, half_t* h16, int e, float eps) {
    __shared__ double shared[32];
    const int r = blockIdx.x;
    const float* orow = o + (u64)r * e;
    float* xr = x + (u64)r * e;
    float scale = 1.0f;
    if (post) {
        double s = 0.0;
        for (int i = threadIdx.x; i < e; i += blockDim.x) s += (double)(orow[i] * orow[i]);
        s = block_sum_d(s, shared);
        scale = 1.0f / sqrtf((float)(s / e) + eps);
    }
    double s2 = 0.0;
    for (int i = threadIdx.x; i < e; i += blockDim.x) {
        float v = orow[i];
        if (post) v = (v * scale) * post[i];
        const float nx = xr[i] + v;
        xr[i] = nx;
        s2 += (double)(nx * nx);
    }
    if (!norm) return;
    s2 = block_sum_d(s2, shared);
    const float nscale = 1.0f / sqrtf((float)(s2 / e) + eps);
    half_t* yr = h16 + (u64)r * e;
    for (int i = threadIdx.x; i < e; i += blockDim.x) yr[i] = f2h((xr[i] * nscale) * norm[i]);
}

// y = f16(act(gate) × up) over rows of `gu` = [gate (n_ff) | up (n_ff)] (one product
// for both), act = SiLU or GELU (tanh approximation). Grid: ceil(rows × n_ff / block).
extern "C" __global__ void den_glu(const float* gu, half_t* y, u64 n, int n_ff, int gelu) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const u64 r = i / (u64)n_ff, j = i % (u64)n_ff;
    const float* row = gu + r * 2 * (u64)n_ff;
    const float a = row[j];
    float act;
    if (gelu) {
        const float c = 0.7978845608028654f;  // sqrt(2 / pi)
        act = 0.5f * a * (1.0f + tanhf(c * (a + 0.044715f * a * a * a)));
    } else {
        act = a / (1.0f + expf(-a));
    }
    y[i] = f2h(act * row[n_ff + j]);
}

// The index of each row's largest logit (the lowest index among equals). Grid: rows;
// block: 256 threads.
extern "C" __global__ void den_argmax(const float* logits, u32* out, int vocab) {
    __shared__ float bv[256];
    __shared__ u32 bi[256];
    const float* row = logits + (u64)blockIdx.x * vocab;
    float best = -DEN_INF;
    u32 at = 0xffffffffu;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = row[i];
        if (v > best || (v == best && (u32)i < at)) {
            best = v;
            at = (u32)i;
        }
    }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = at;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float v = bv[threadIdx.x + s];
            const u32 j = bi[threadIdx.x + s];
            if (v > bv[threadIdx.x] || (v == bv[threadIdx.x] && j < bi[threadIdx.x])) {
                bv[threadIdx.x] = v;
                bi[threadIdx.x] = j;
            }
        }
        __syncthreads();
    }
    // 0xffffffff: every logit NaN, nothing to choose (the host says so).
    if (threadIdx.x == 0) out[blockIdx.x] = bi[0];
}
