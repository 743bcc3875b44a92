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

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    const std::string cmd = argv[1];
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
    } else if (cmd == "qk_rope") {
        // rows, n_head, n_kv, hd, n_rot, neox, base, scale, attn_scale, qk_norm, eps,
        // q, k, q_norm[hd], k_norm[hd], pos[rows]
        const int rows = one<int>(), nh = one<int>(), nkv = one<int>(), hd = one<int>();
        const int n_rot = one<int>(), neox = one<int>();
        const float base = one<float>(), scale = one<float>(), attn = one<float>();
        const int qk_norm = one<int>();
        const float eps = one<float>();
        auto q = read<float>((size_t)rows * nh * hd);
        auto k = read<float>((size_t)rows * nkv * hd);
        auto qn = read<float>(hd);
        auto kn = read<float>(hd);
        auto pos = read<unsigned>(rows);
        launch(den_qk_rope, Dim{(unsigned)rows, (unsigned)(nh + nkv), 1}, 128, q.data(), k.data(),
               qn.data(), kn.data(), pos.data(), nh, nkv, hd, n_rot, neox, base, scale, attn,
               qk_norm, eps);
        write(q);
        write(k);
    } else if (cmd == "attention") {
        // K/V rows of `len` positions appended through den_kv_append, then queries attend:
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
        const unsigned long long base = (unsigned long long)(uintptr_t)arena.data();
        launch(den_kv_append, Dim{(unsigned)len, 1, 1}, 256, k.data(), v.data(), base, seq.data(),
               pos.data(), pt_off.data(), pages.data(), kvd, row_bytes, page_size, k_off, v_off);
        std::vector<unsigned> qseq(rows, 0);
        std::vector<unsigned short> out((size_t)rows * nh * hd);
        launch(den_attention, Dim{(unsigned)rows, (unsigned)nh, 1}, 128, q.data(), out.data(), base,
               qseq.data(), qpos.data(), pt_off.data(), pages.data(), nh, nkv, hd, row_bytes,
               page_size, k_off, v_off, window);
        write(arena);
        write(out);
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
