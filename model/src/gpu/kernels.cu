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
__device__ __forceinline__ const unsigned char* kv_row(u64 arena, const u32* pt, u32 t,
                                                        u32 page_size, u64 row_bytes) {
    const u64 page = pt[t / page_size];
    return (const unsigned char*)arena + (page * page_size + t % page_size) * row_bytes;
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

// Per head of each row: the optional RMS norm of the head (q_norm / k_norm), RoPE at the
// row's position (pairs (2i, 2i+1), or halves (i, i + n_rot/2) when `neox`), and the
// query scale. Angles as ggml computes them: pos × rope_scale × theta_scale^i, the power
// taken by repeated f32 multiplication. Grid: (rows, n_head + n_kv).
extern "C" __global__ void den_qk_rope(float* q, float* k, const float* q_norm,
                                       const float* k_norm, const u32* pos, int n_head,
                                       int n_kv, int hd, int n_rot, int neox, float base,
                                       float rope_scale, float attn_scale, int qk_norm,
                                       float eps) {
    __shared__ double shared[32];
    __shared__ float buf[1024];
    const int r = blockIdx.x, h = blockIdx.y;
    const bool is_q = h < n_head;
    float* v = is_q ? q + ((u64)r * n_head + h) * hd : k + ((u64)r * n_kv + (h - n_head)) * hd;
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
    const float p = (float)pos[r] * rope_scale;
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
}

// K and V of each row, as f16, into its page slot. Grid: rows.
extern "C" __global__ void den_kv_append(const float* k, const float* v, u64 arena,
                                         const u32* row_seq, const u32* pos, const u32* pt_off,
                                         const u32* pages, int kvd, u64 row_bytes,
                                         int page_size, u64 k_off, u64 v_off) {
    const int r = blockIdx.x;
    const u32 p = pos[r];
    const u32* pt = pages + pt_off[row_seq[r]];
    unsigned char* row = (unsigned char*)kv_row(arena, pt, p, (u32)page_size, row_bytes);
    half_t* kd = (half_t*)(row + k_off);
    half_t* vd = (half_t*)(row + v_off);
    const float* kr = k + (u64)r * kvd;
    const float* vr = v + (u64)r * kvd;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        kd[i] = f2h(kr[i]);
        vd[i] = f2h(vr[i]);
    }
}

// Paged attention, one block per (row, query head): softmax(q · K) · V over the keys
// first..=pos of the row's sequence (first = pos + 1 − window with a sliding window),
// read from the pages through the sequence's page table; grouped-query heads share a KV
// head. Online softmax over tiles of blockDim keys; each thread owns output dims tid,
// tid + blockDim, … (head_dim ≤ 4 × blockDim). Writes f16 (the next product's input).
extern "C" __global__ void den_attention(const float* q, half_t* out, u64 arena,
                                         const u32* row_seq, const u32* pos, const u32* pt_off,
                                         const u32* pages, int n_head, int n_kv, int hd,
                                         u64 row_bytes, int page_size, u64 k_off, u64 v_off,
                                         int window) {
    __shared__ float qs[1024];
    __shared__ float ps[1024];
    __shared__ float red[32];
    const int r = blockIdx.x, h = blockIdx.y;
    const int kvh = h / (n_head / n_kv);
    const float* qr = q + ((u64)r * n_head + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qr[i];
    __syncthreads();
    const u32 p = pos[r];
    const u32 first = (window > 0 && p + 1 > (u32)window) ? p + 1 - (u32)window : 0u;
    const u32* pt = pages + pt_off[row_seq[r]];
    const u64 head = (u64)kvh * hd * 2;  // bytes into a layer's K (or V)
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float m = -DEN_INF, l = 0.0f;
    for (u32 t0 = first; t0 <= p; t0 += blockDim.x) {
        const u32 t = t0 + threadIdx.x;
        float s = -DEN_INF;
        if (t <= p) {
            const half_t* kr = (const half_t*)(kv_row(arena, pt, t, (u32)page_size, row_bytes) +
                                               k_off + head);
            float d = 0.0f;
            for (int i = 0; i < hd; ++i) d = fmaf(qs[i], h2f(kr[i]), d);
            s = d;
        }
        const float tile_max = block_max_f(s, red);
        const float m_new = fmaxf(m, tile_max);
        const float e = t <= p ? expf(s - m_new) : 0.0f;
        ps[threadIdx.x] = e;
        const float corr = m == -DEN_INF ? 0.0f : expf(m - m_new);
        // block_sum_f synchronises, so every thread sees the whole tile's `ps` after it.
        const float tile_sum = block_sum_f(e, red);
        l = l * corr + tile_sum;
        m = m_new;
        const u32 count = min((u32)blockDim.x, p + 1 - t0);
        for (int j = 0; j < 4; ++j) {
            const int d = threadIdx.x + j * blockDim.x;
            if (d < hd) {
                float a = acc[j] * corr;
                for (u32 u = 0; u < count; ++u) {
                    const half_t* vr =
                        (const half_t*)(kv_row(arena, pt, t0 + u, (u32)page_size, row_bytes) +
                                        v_off + head);
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

// x[r] += o[r], the optional post-norm (Gemma's post_attention_norm / post_ffw_norm)
// applied to o first. Grid: rows.
extern "C" __global__ void den_post_add(float* x, const float* o, const float* w, int e,
                                        float eps) {
    __shared__ double shared[32];
    const int r = blockIdx.x;
    const float* orow = o + (u64)r * e;
    float* xr = x + (u64)r * e;
    float scale = 1.0f;
    if (w) {
        double s = 0.0;
        for (int i = threadIdx.x; i < e; i += blockDim.x) s += (double)(orow[i] * orow[i]);
        s = block_sum_d(s, shared);
        scale = 1.0f / sqrtf((float)(s / e) + eps);
    }
    for (int i = threadIdx.x; i < e; i += blockDim.x) {
        float v = orow[i];
        if (w) v = (v * scale) * w[i];
        xr[i] += v;
    }
}

// y = f16(act(gate) × up), act = SiLU or GELU (tanh approximation). Grid: ceil(n / block).
extern "C" __global__ void den_glu(const float* gate, const float* up, half_t* y, u64 n,
                                   int gelu) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float a = gate[i];
    float act;
    if (gelu) {
        const float c = 0.7978845608028654f;  // sqrt(2 / pi)
        act = 0.5f * a * (1.0f + tanhf(c * (a + 0.044715f * a * a * a)));
    } else {
        act = a / (1.0f + expf(-a));
    }
    y[i] = f2h(act * up[i]);
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
    if (threadIdx.x == 0) out[blockIdx.x] = bi[0] == 0xffffffffu ? 0u : bi[0];
}
