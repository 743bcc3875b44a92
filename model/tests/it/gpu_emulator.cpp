// Runs den's CUDA kernels (model/src/gpu/kernels.cu) on the CPU, for tests on machines
// without a GPU (model/tests/it/gpu_emulated.rs). Not a CUDA implementation: just enough of
// the execution model for these kernels — every GPU thread of a block is an OS thread,
// blocks run one after another, `__shared__` is a static shared by the block's threads,
// `__syncthreads` is a barrier, and a warp shuffle is an exchange through a static array
// between two barriers (every kernel here shuffles with the whole block in step).
//
// The kernel source is included after this preamble (the test compiles them together with
// -DDEN_EMULATE). Commands on stdin, little-endian arrays in, results out on stdout.

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <thread>
#include <vector>

struct Dim {
    unsigned x = 1, y = 1, z = 1;
};
thread_local Dim threadIdx, blockIdx;
Dim blockDim, gridDim;
std::barrier<>* block_barrier = nullptr;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

inline void __syncthreads() { block_barrier->arrive_and_wait(); }

template <typename T> T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    static T slots[1024];
    const unsigned t = threadIdx.x;
    slots[t] = v;
    __syncthreads();
    const T r = slots[t ^ (unsigned)lane_mask];
    __syncthreads();
    return r;
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

template <typename T> T min(T a, T b) { return a < b ? a : b; }

inline float emulated_h2f(unsigned short h) {
    _Float16 x;
    std::memcpy(&x, &h, 2);
    return (float)x;
}

inline unsigned short emulated_f2h(float f) {
    const _Float16 x = (_Float16)f;  // round to nearest, ties to even
    unsigned short h;
    std::memcpy(&h, &x, 2);
    return h;
}

#include DEN_KERNELS

// Runs `kernel` over a grid of 1-D blocks.
template <typename... P, typename... A>
void launch(void (*kernel)(P...), Dim grid, unsigned threads, A... args) {
    blockDim = Dim{threads, 1, 1};
    gridDim = grid;
    for (unsigned by = 0; by < grid.y; ++by) {
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::barrier<> bar(threads);
            block_barrier = &bar;
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < threads; ++t) {
                ts.emplace_back([=] {
                    threadIdx = Dim{t, 0, 0};
                    blockIdx = Dim{bx, by, 0};
                    kernel(((P)args)...);
                });
            }
            for (auto& th : ts) th.join();
        }
    }
}

template <typename T> std::vector<T> read(size_t n) {
    std::vector<T> v(n);
    if (n && std::fread(v.data(), sizeof(T), n, stdin) != n) {
        std::fprintf(stderr, "short input\n");
        std::exit(2);
    }
    return v;
}

template <typename T> T one() { return read<T>(1)[0]; }

template <typename T> void write(const std::vector<T>& v) {
    std::fwrite(v.data(), sizeof(T), v.size(), stdout);
}

// --- the `pass` command: a plan of gpu_plan.rs, run step by step ----------------------

// Argument tags (gpu_emulated.rs writes them): a buffer pointer, null, i32, u64, f32.
enum Tag : unsigned { PTR = 0, NUL = 1, I32 = 2, U64 = 3, F32 = 4 };

struct RawArg {
    unsigned tag;
    unsigned long long value;  // a pointer's address once resolved, else the bits
};

// Converts a tagged argument to parameter type T, failing on a type the kernel does not
// take there (the plan's argument types are checked against the kernels' signatures).
template <typename T> T from_raw(const RawArg& a, const char* kernel, size_t i) {
    bool ok;
    if constexpr (std::is_pointer_v<T>) ok = a.tag == PTR || a.tag == NUL;
    else if constexpr (std::is_same_v<T, float>) ok = a.tag == F32;
    else if constexpr (std::is_same_v<T, int>) ok = a.tag == I32;
    else ok = a.tag == U64 && sizeof(T) == 8;
    if (!ok) {
        std::fprintf(stderr, "%s: argument %zu has tag %u, not the kernel's type\n", kernel, i,
                     a.tag);
        std::exit(3);
    }
    if constexpr (std::is_pointer_v<T>) {
        return reinterpret_cast<T>((uintptr_t)a.value);
    } else if constexpr (std::is_same_v<T, float>) {
        const unsigned bits = (unsigned)a.value;
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
    } else {
        return (T)a.value;
    }
}

template <typename... P, size_t... I>
void launch_tagged(void (*k)(P...), const char* name, Dim g, unsigned threads,
                   const std::vector<RawArg>& a, std::index_sequence<I...>) {
    launch(k, g, threads, from_raw<P>(a[I], name, I)...);
}

template <typename... P>
void launch_args(void (*k)(P...), const char* name, Dim g, unsigned threads,
                 const std::vector<RawArg>& a) {
    if (a.size() != sizeof...(P)) {
        std::fprintf(stderr, "%s: %zu arguments for %zu parameters\n", name, a.size(),
                     sizeof...(P));
        std::exit(3);
    }
    launch_tagged(k, name, g, threads, a, std::index_sequence_for<P...>{});
}

void run_kernel(const std::string& name, Dim g, unsigned threads, const std::vector<RawArg>& a) {
    if (name == "den_embed") launch_args(den_embed, "den_embed", g, threads, a);
    else if (name == "den_rms_norm_h") launch_args(den_rms_norm_h, "den_rms_norm_h", g, threads, a);
    else if (name == "den_qk_rope_append")
        launch_args(den_qk_rope_append, "den_qk_rope_append", g, threads, a);
    else if (name == "den_attention") launch_args(den_attention, "den_attention", g, threads, a);
    else if (name == "den_add_norm_h") launch_args(den_add_norm_h, "den_add_norm_h", g, threads, a);
    else if (name == "den_glu") launch_args(den_glu, "den_glu", g, threads, a);
    else if (name == "den_argmax") launch_args(den_argmax, "den_argmax", g, threads, a);
    else {
        std::fprintf(stderr, "no kernel %s\n", name.c_str());
        std::exit(3);
    }
}

// cuBLAS's product as the runner calls it: out[r × m] (f32) = in[r × k] (f16) · wᵀ, f32
// accumulation.
void gemm(const unsigned short* in, const unsigned short* w, float* out, unsigned rows,
          unsigned m, unsigned k) {
    std::vector<float> a((size_t)k);
    for (unsigned r = 0; r < rows; ++r) {
        for (unsigned j = 0; j < k; ++j) a[j] = emulated_h2f(in[(size_t)r * k + j]);
        for (unsigned i = 0; i < m; ++i) {
            const unsigned short* wi = w + (size_t)i * k;
            float s = 0.0f;
            for (unsigned j = 0; j < k; ++j) s = std::fma(a[j], emulated_h2f(wi[j]), s);
            out[(size_t)r * m + i] = s;
        }
    }
}

// Buffers (id, bytes), then passes: uploads into buffers, steps, and buffers to write out.
int run_passes() {
    std::map<unsigned, std::vector<unsigned char>> buffers;
    const unsigned n_buffers = one<unsigned>();
    for (unsigned i = 0; i < n_buffers; ++i) {
        const unsigned id = one<unsigned>();
        const unsigned long long len = one<unsigned long long>();
        buffers[id] = read<unsigned char>(len);
    }
    auto base = [&](unsigned id) -> unsigned char* {
        auto it = buffers.find(id);
        if (it == buffers.end()) {
            std::fprintf(stderr, "no buffer %u\n", id);
            std::exit(3);
        }
        return it->second.data();
    };
    const unsigned n_passes = one<unsigned>();
    for (unsigned p = 0; p < n_passes; ++p) {
        const unsigned n_up = one<unsigned>();
        for (unsigned i = 0; i < n_up; ++i) {
            const unsigned id = one<unsigned>();
            const unsigned long long len = one<unsigned long long>();
            auto bytes = read<unsigned char>(len);
            if (len > buffers[id].size()) {
                std::fprintf(stderr, "upload past buffer %u\n", id);
                std::exit(3);
            }
            std::memcpy(base(id), bytes.data(), len);
        }
        const unsigned n_steps = one<unsigned>();
        for (unsigned s = 0; s < n_steps; ++s) {
            const unsigned kind = one<unsigned>();
            if (kind == 0) {
                const unsigned len = one<unsigned>();
                auto chars = read<char>(len);
                const std::string name(chars.begin(), chars.end());
                const unsigned gx = one<unsigned>(), gy = one<unsigned>(), block = one<unsigned>();
                const unsigned n_args = one<unsigned>();
                std::vector<RawArg> args(n_args);
                for (auto& a : args) {
                    a.tag = one<unsigned>();
                    a.value = one<unsigned long long>();
                    if (a.tag == PTR) a.value = (unsigned long long)(uintptr_t)base((unsigned)a.value);
                    if (a.tag == NUL) a.value = 0;
                }
                run_kernel(name, Dim{gx, gy, 1}, block, args);
            } else {
                const unsigned in = one<unsigned>(), w = one<unsigned>(), out = one<unsigned>();
                const unsigned rows = one<unsigned>(), m = one<unsigned>(), k = one<unsigned>();
                gemm((const unsigned short*)base(in), (const unsigned short*)base(w),
                     (float*)base(out), rows, m, k);
            }
        }
        const unsigned n_out = one<unsigned>();
        for (unsigned i = 0; i < n_out; ++i) {
            const unsigned id = one<unsigned>();
            const unsigned long long len = one<unsigned long long>();
            std::fwrite(base(id), 1, len, stdout);
        }
    }
    return 0;
}

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    const std::string cmd = argv[1];
    if (cmd == "pass") return run_passes();
    if (cmd == "rms_norm_h") {
        // rows_in, rows_out, e, eps, x[rows_in × e], w[e], gather[rows_out] (u32; ~0u: none)
        const int rin = one<int>(), rout = one<int>(), e = one<int>();
        const float eps = one<float>();
        auto x = read<float>((size_t)rin * e);
        auto w = read<float>(e);
        auto g = read<unsigned>(rout);
        std::vector<unsigned short> y((size_t)rout * e);
        const unsigned* rows = g.empty() || g[0] == ~0u ? nullptr : g.data();
        launch(den_rms_norm_h, Dim{(unsigned)rout, 1, 1}, 256, x.data(), w.data(), y.data(),
               rows, e, eps);
        write(y);
    } else if (cmd == "qk_rope_append") {
        // rows, n_head, n_kv, hd, n_rot, neox, base, scale, attn_scale, qk_norm, eps,
        // q, k, v, q_norm[hd], k_norm[hd], pos[rows]; a one-layer arena of pages of 16 rows,
        // page i at arena page (i × 7) mod n_pages (n_pages prime to 7)
        const int rows = one<int>(), nh = one<int>(), nkv = one<int>(), hd = one<int>();
        const int n_rot = one<int>(), neox = one<int>();
        const float base = one<float>(), scale = one<float>(), attn = one<float>();
        const int qk_norm = one<int>();
        const float eps = one<float>();
        auto q = read<float>((size_t)rows * nh * hd);
        auto k = read<float>((size_t)rows * nkv * hd);
        auto v = read<float>((size_t)rows * nkv * hd);
        auto qn = read<float>(hd);
        auto kn = read<float>(hd);
        auto pos = read<unsigned>(rows);
        const int qd = nh * hd, kvd = nkv * hd, stride = qd + 2 * kvd;
        std::vector<float> qkv((size_t)rows * stride);
        for (int r = 0; r < rows; ++r) {
            std::memcpy(&qkv[(size_t)r * stride], &q[(size_t)r * qd], qd * 4);
            std::memcpy(&qkv[(size_t)r * stride + qd], &k[(size_t)r * kvd], kvd * 4);
            std::memcpy(&qkv[(size_t)r * stride + qd + kvd], &v[(size_t)r * kvd], kvd * 4);
        }
        unsigned top = 0;
        for (unsigned p : pos) top = p > top ? p : top;
        const unsigned page_size = 16;
        unsigned n_pages = top / page_size + 1;
        while (n_pages % 7 == 0) ++n_pages;
        std::vector<unsigned> pages(n_pages), seq(rows, 0), pt_off{0u, n_pages};
        for (unsigned i = 0; i < n_pages; ++i) pages[i] = (i * 7) % n_pages;
        const unsigned long long row_bytes = 2ull * kvd * 2;
        std::vector<unsigned char> arena((size_t)n_pages * page_size * row_bytes);
        unsigned char* base_ptr = arena.data();
        launch(den_qk_rope_append, Dim{(unsigned)rows, (unsigned)(nh + nkv), 1}, 128, qkv.data(),
               stride, qn.data(), kn.data(), pos.data(), nh, nkv, hd, n_rot, neox, base, scale,
               attn, qk_norm, eps, base_ptr, seq.data(), pt_off.data(), pages.data(), row_bytes,
               (int)page_size, 0ull, (unsigned long long)kvd * 2);
        // Rotated q and k, then each row's K|V as the page slot of its position holds them.
        for (int r = 0; r < rows; ++r) {
            std::memcpy(&q[(size_t)r * qd], &qkv[(size_t)r * stride], qd * 4);
            std::memcpy(&k[(size_t)r * kvd], &qkv[(size_t)r * stride + qd], kvd * 4);
        }
        write(q);
        write(k);
        for (int r = 0; r < rows; ++r) {
            const size_t slot = (size_t)pages[pos[r] / page_size] * page_size + pos[r] % page_size;
            std::vector<unsigned char> row(arena.begin() + slot * row_bytes,
                                           arena.begin() + (slot + 1) * row_bytes);
            write(row);
        }
    } else if (cmd == "attention") {
        // K/V rows of `len` positions appended through den_qk_rope_append (no rotation, no
        // query heads), then queries attend:
        // len, rows, n_head, n_kv, hd, layers, layer, page_size, n_pages, window,
        // pages[n_pages] (the sequence's page table), k[len × n_kv × hd], v[same],
        // q_pos[rows], q[rows × n_head × hd]
        const int len = one<int>(), rows = one<int>(), nh = one<int>(), nkv = one<int>();
        const int hd = one<int>(), layers = one<int>(), layer = one<int>();
        const int page_size = one<int>(), n_pages = one<int>(), window = one<int>();
        auto pages = read<unsigned>(n_pages);
        const int kvd = nkv * hd;
        auto k = read<float>((size_t)len * kvd);
        auto v = read<float>((size_t)len * kvd);
        auto qpos = read<unsigned>(rows);
        auto q = read<float>((size_t)rows * nh * hd);
        unsigned pages_total = 0;
        for (unsigned p : pages) pages_total = p + 1 > pages_total ? p + 1 : pages_total;
        const unsigned long long row_bytes = (unsigned long long)layers * 2 * kvd * 2;
        std::vector<unsigned char> arena((size_t)pages_total * page_size * row_bytes);
        const unsigned long long k_off = (unsigned long long)layer * 2 * kvd * 2;
        const unsigned long long v_off = k_off + (unsigned long long)kvd * 2;
        std::vector<unsigned> seq(len, 0), pos(len), pt_off{0u, (unsigned)n_pages};
        for (int i = 0; i < len; ++i) pos[i] = i;
        std::vector<float> kv((size_t)len * 2 * kvd);
        for (int t = 0; t < len; ++t) {
            std::memcpy(&kv[(size_t)t * 2 * kvd], &k[(size_t)t * kvd], kvd * 4);
            std::memcpy(&kv[(size_t)t * 2 * kvd + kvd], &v[(size_t)t * kvd], kvd * 4);
        }
        unsigned char* base = arena.data();
        std::vector<float> no_norm(hd, 1.0f);
        launch(den_qk_rope_append, Dim{(unsigned)len, (unsigned)nkv, 1}, 128, kv.data(),
               2 * kvd, no_norm.data(), no_norm.data(), pos.data(), 0, nkv, hd, 0, 0, 10000.0f,
               1.0f, 1.0f, 0, 1e-6f, base, seq.data(), pt_off.data(), pages.data(), row_bytes,
               page_size, k_off, v_off);
        std::vector<unsigned> qseq(rows, 0);
        std::vector<unsigned short> out((size_t)rows * nh * hd);
        launch(den_attention, Dim{(unsigned)rows, (unsigned)nh, 1}, 128, q.data(), nh * hd,
               out.data(), base, qseq.data(), qpos.data(), pt_off.data(), pages.data(), nh, nkv,
               hd, row_bytes, page_size, k_off, v_off, window);
        write(arena);
        write(out);
    } else if (cmd == "add_norm") {
        // rows, e, eps, has_post, has_norm, x[rows × e], o[rows × e], post[e], norm[e]
        const int rows = one<int>(), e = one<int>();
        const float eps = one<float>();
        const int has_post = one<int>(), has_norm = one<int>();
        auto x = read<float>((size_t)rows * e);
        auto o = read<float>((size_t)rows * e);
        auto post = read<float>(e);
        auto norm = read<float>(e);
        std::vector<unsigned short> h((size_t)rows * e);
        launch(den_add_norm_h, Dim{(unsigned)rows, 1, 1}, 256, x.data(), o.data(),
               has_post ? post.data() : nullptr, has_norm ? norm.data() : nullptr, h.data(), e,
               eps);
        write(x);
        write(h);
    } else if (cmd == "glu") {
        // rows, n_ff, gelu, gu[rows × 2 n_ff]
        const int rows = one<int>(), n_ff = one<int>(), gelu = one<int>();
        auto gu = read<float>((size_t)rows * 2 * n_ff);
        const unsigned long long n = (unsigned long long)rows * n_ff;
        std::vector<unsigned short> y(n);
        launch(den_glu, Dim{(unsigned)((n + 255) / 256), 1, 1}, 256, gu.data(), y.data(), n, n_ff,
               gelu);
        write(y);
    } else if (cmd == "argmax") {
        const int rows = one<int>(), vocab = one<int>();
        auto logits = read<float>((size_t)rows * vocab);
        std::vector<unsigned> out(rows);
        launch(den_argmax, Dim{(unsigned)rows, 1, 1}, 256, logits.data(), out.data(), vocab);
        write(out);
    } else {
        return 2;
    }
    return 0;
}
