/* attn_bench.cu — times the tensor-core attention kernels (kernels/cuda/attn_mma.cu, compiled into
 * this file) at one shape: forward, delta, backward, for each tile configuration (DW_ATTN_TILES
 * values) and, when built with -DAM_OLD="path", the kernels of an older attn_mma.cu as the
 * "before" row; outputs of every configuration are compared with the first. CUDA events, median of
 * --iters. Not a correctness test (tests/gpu/test_ops_cuda_attn.c compares with the CPU reference).
 * Build (GPU machine): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
 *   --expt-relaxed-constexpr -Isrc [-DAM_OLD='"old.cu"'] bench/attn_bench.cu -o attn_bench
 * Usage: attn_bench B T H Hkv D packed(0|1) iters [profile]  (profile: the default kernels once, for ncu) */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#include "kernels/cuda/attn_mma.h"

namespace knew {
#include "kernels/cuda/attn_mma.cu"
}
#ifdef AM_OLD
#undef AM_ROWS
#undef AM_THREADS
#undef AM_LOG2E
#undef AM_LN2
namespace kold {
#include AM_OLD
}
#endif

#define CK(x)                                                                                       \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

typedef __nv_bfloat16 bf16;

static __global__ void fill_kernel(bf16 *x, int64_t n, uint64_t seed, float lo, float hi) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        x[i] = __float2bfloat16(lo + (hi - lo) * (float)(z >> 40) / 16777216.0f);
    }
}
/* delta (B,H,T) = rowsum(dout * out), one warp per row (as ops_attention.cu's reference kernel) */
static __global__ void delta_kernel(float *delta, const bf16 *dout, const bf16 *out, int64_t T, int64_t H, int64_t D,
                                    int64_t rows) {
    const int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int64_t b = row / (H * T), h = (row / T) % H, t = row % T, base = ((b * T + t) * H + h) * D;
    float s = 0.0f;
    for (int64_t d = lane; d < D; d += 32) s += __bfloat162float(dout[base + d]) * __bfloat162float(out[base + d]);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) delta[row] = s;
}

/* mma.sync m16n8k16 BF16 ceiling: each warp runs 8 independent accumulator chains on register
 * operands made from its thread index (not zeros), ITER steps; one float per thread written. */
static __global__ void mma_peak_kernel(float *sink, int iters) {
    uint32_t a[4], b0 = 0x3f803f81u ^ threadIdx.x, b1 = 0x3f7f3f82u + threadIdx.x;
    for (int i = 0; i < 4; i++) a[i] = 0x3f813f7eu + 77u * threadIdx.x + i;
    float c[8][4] = {};
    for (int it = 0; it < iters; it++)
#pragma unroll
        for (int j = 0; j < 8; j++) knew::am_mma(c[j], a, b0, b1);
    float t = 0.0f;
    for (int j = 0; j < 8; j++) t += c[j][0] + c[j][1] + c[j][2] + c[j][3];
    sink[blockIdx.x * blockDim.x + threadIdx.x] = t;
}

template <typename F>
static float median_ms(F fn, int iters) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) fn();
    std::vector<float> ts;
    for (int i = 0; i < iters; i++) {
        CK(cudaEventRecord(a));
        fn();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

static std::vector<float> host(const void *d, int64_t n, bool isbf) {
    std::vector<float> h(n);
    if (isbf) {
        std::vector<bf16> t(n);
        CK(cudaMemcpy(t.data(), d, n * 2, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < n; i++) h[i] = __bfloat162float(t[i]);
    } else {
        CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    }
    return h;
}
/* max |a - b| / max |b|, NaN counted as a failure (returns inf) */
static double rel(const std::vector<float> &a, const std::vector<float> &b) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (!std::isfinite(a[i])) return INFINITY;
        md = std::max(md, (double)fabsf(a[i] - b[i]));
        mb = std::max(mb, (double)fabsf(b[i]));
    }
    return md / (mb > 0 ? mb : 1);
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: %s B T H Hkv D packed iters\n", argv[0]);
        return 2;
    }
    const int64_t B = atoll(argv[1]), T = atoll(argv[2]), H = atoll(argv[3]), Hkv = atoll(argv[4]), D = atoll(argv[5]);
    const bool packed = atoi(argv[6]) != 0;
    const int iters = atoi(argv[7]);
    const int64_t rq = packed ? (H + 2 * Hkv) * D : H * D, rk = packed ? rq : Hkv * D;
    const int64_t nx = packed ? B * T * rq : B * T * (H + 2 * Hkv) * D, no = B * T * H * D, nl = B * H * T;
    bf16 *x, *dx, *out, *dout;
    float *lse, *delta;
    CK(cudaMalloc(&x, nx * 2));
    CK(cudaMalloc(&dx, nx * 2));
    CK(cudaMalloc(&out, no * 2));
    CK(cudaMalloc(&dout, no * 2));
    CK(cudaMalloc(&lse, nl * 4));
    CK(cudaMalloc(&delta, nl * 4));
    const uint64_t seed = (uint64_t)time(NULL);
    fill_kernel<<<1024, 256>>>(x, nx, seed, -2.0f, 2.0f);
    fill_kernel<<<1024, 256>>>(dout, no, seed * 7 + 1, -1.0f, 1.0f);
    CK(cudaGetLastError());
    /* q, k, v views: packed rows [q | k | v] per token, or three separate tensors one after another */
    const bf16 *q = x, *k = packed ? x + H * D : x + B * T * H * D, *v = packed ? x + (H + Hkv) * D : k + B * T * Hkv * D;
    bf16 *dq = dx, *dk = packed ? dx + H * D : dx + B * T * H * D, *dv = packed ? dx + (H + Hkv) * D : dk + B * T * Hkv * D;
    const double flop_fwd = 4.0 * B * H * T * T * D / 2, flop_bwd = 2.5 * flop_fwd;
    printf("shape B=%lld T=%lld H=%lld Hkv=%lld D=%lld packed=%d: fwd %.3g GFLOP, bwd %.3g GFLOP (causal, useful)\n",
           (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D, (int)packed, flop_fwd / 1e9,
           flop_bwd / 1e9);
    struct cfg {
        const char *name;
        int f, qd, kv; /* f == 0: the old kernels */
    };
    std::vector<cfg> cfgs;
#ifdef AM_OLD
    cfgs.push_back({"before", 0, 0, 0});
#endif
    cfgs.push_back({"tiles 1,1,1", 1, 1, 1});
    cfgs.push_back({"tiles 2,1,1", 2, 1, 1});
    cfgs.push_back({"tiles 1,2,2", 1, 2, 2});
    if (argc > 8 && !strcmp(argv[8], "profile")) { /* the default kernels once each */
        knew::am_tiles();
        CK(knew::dw_attn_mma_fwd(out, lse, q, k, v, B, T, H, Hkv, D, rq, rk, 0));
        CK(knew::dw_attn_mma_bwd(dq, dk, dv, dout, q, k, v, out, lse, delta, B, T, H, Hkv, D, rq, rk, 0));
        CK(cudaDeviceSynchronize());
        return 0;
    }
    printf("%-12s %8s %7s %8s %8s %8s %8s %7s %8s  %s\n", "kernels", "fwd ms", "TFLOP/s", "delta ms", "dQ ms",
           "dKV ms", "bwd ms", "TFLOP/s", "fwd+bwd", "max rel diff to first row (out lse dqkv)");
    std::vector<std::vector<float>> ref;
    const int64_t rows = B * H * T;
    auto run_delta = [&] {
        delta_kernel<<<(unsigned)((rows + 7) / 8), 256>>>(delta, dout, out, T, H, D, rows);
    };
    for (const cfg &c : cfgs) {
        auto set = [&] {
            knew::am_tiles_cfg[0] = c.f, knew::am_tiles_cfg[1] = c.qd, knew::am_tiles_cfg[2] = c.kv;
        };
        auto fwd = [&] {
#ifdef AM_OLD
            if (!c.f) {
                CK(kold::dw_attn_mma_fwd(out, lse, q, k, v, B, T, H, Hkv, D, rq, rk, 0));
                return;
            }
#endif
            set();
            CK(knew::dw_attn_mma_fwd(out, lse, q, k, v, B, T, H, Hkv, D, rq, rk, 0));
        };
        auto bwd = [&] { /* new kernels: delta inside the dQ kernel */
#ifdef AM_OLD
            if (!c.f) {
                CK(kold::dw_attn_mma_bwd(dq, dk, dv, dout, q, k, v, lse, delta, B, T, H, Hkv, D, rq, rk, 0));
                return;
            }
#endif
            set();
            CK(knew::dw_attn_mma_bwd(dq, dk, dv, dout, q, k, v, out, lse, delta, B, T, H, Hkv, D, rq, rk, 0));
        };
        auto dqk = [&] {
            if (c.qd == 2)
                CK((knew::am_bwd_dq_launch<64, true, 2, 2>(dq, delta, dout, out, q, k, v, lse, B, T, H, Hkv, rq, rk, 0)));
            else
                CK((knew::am_bwd_dq_launch<64, true, 1, 1>(dq, delta, dout, out, q, k, v, lse, B, T, H, Hkv, rq, rk, 0)));
        };
        auto dkvk = [&] {
            if (c.kv == 2)
                CK((knew::am_bwd_dkv_launch<64, true, 2>(dk, dv, dout, q, k, v, lse, delta, B, T, H, Hkv, rq, rk, 0)));
            else
                CK((knew::am_bwd_dkv_launch<64, true, 1>(dk, dv, dout, q, k, v, lse, delta, B, T, H, Hkv, rq, rk, 0)));
        };
        /* outputs: fresh poison, one run, compare */
        CK(cudaMemset(out, 0xff, no * 2));
        CK(cudaMemset(dx, 0xff, nx * 2));
        CK(cudaMemset(delta, 0xff, nl * 4));
        fwd();
        if (!c.f) run_delta();
        bwd();
        CK(cudaDeviceSynchronize());
        std::vector<std::vector<float>> got;
        got.push_back(host(out, no, true));
        got.push_back(host(lse, nl, false));
        std::vector<float> g = host(dx, nx, true);
        got.push_back(g); /* dq, dk, dv interleaved (packed) or consecutive: one comparison */
        char diffs[160] = "-";
        if (ref.empty()) {
            ref = got;
            for (float f : g)
                if (!std::isfinite(f)) snprintf(diffs, sizeof diffs, "NOT FINITE (unwritten gradient?)");
        } else {
            snprintf(diffs, sizeof diffs, "%.2e %.2e %.2e", rel(got[0], ref[0]), rel(got[1], ref[1]),
                     rel(got[2], ref[2]));
        }
        const float tf = median_ms(fwd, iters), tb = median_ms(bwd, iters);
        const float td = c.f ? 0.0f : median_ms(run_delta, iters);
        const float tq = D == 64 && c.f && !knew::am_mode() ? median_ms(dqk, iters) : 0.0f;
        const float tk = D == 64 && c.f && !knew::am_mode() ? median_ms(dkvk, iters) : 0.0f;
        CK(cudaGetLastError());
        printf("%-12s %8.4f %7.1f %8.4f %8.4f %8.4f %8.4f %7.1f %8.4f  %s\n", c.name, tf, flop_fwd / tf / 1e9, td,
               tq, tk, tb + td, flop_bwd / (tb + td) / 1e9, tf + td + tb, diffs);
    }
    /* the mma.sync ceiling on this GPU */
    {
        int sms = 0;
        CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        const int blocks = sms * 8, piters = 4096;
        float *sink;
        CK(cudaMalloc(&sink, (size_t)blocks * 128 * 4));
        const float t = median_ms([&] { mma_peak_kernel<<<blocks, 128>>>(sink, piters); }, 10);
        CK(cudaGetLastError());
        printf("mma.sync m16n8k16 bf16 ceiling: %.1f TFLOP/s (%d blocks x 4 warps x 8 chains x %d)\n",
               (double)blocks * 4 * 8 * piters * 4096.0 / t / 1e9, blocks, piters);
    }
    return 0;
}
