/* ops_moe_dispatch.cu — CUDA MoE data movement: dispatch (the (token, k) assignments sorted by
 * expert on the device: counts, group offsets and each assignment's row, then the gather of x's
 * rows) and combine (each token's weighted sum of its K expert rows), forward and backward; FP32
 * or BF16 storage, FP32 sums in a fixed order. No host synchronisation: the offsets stay on the
 * device for the grouped GEMMs (ops_moe_gemm.cu), so a recorded step replays with any routing.
 * Oracle: kernels/cpu/moe_cpu.c, which orders each group by (token, k) as the index kernel does.
 *
 * The index kernel is one block: its warps take contiguous segments of the assignments; pass 1
 * counts each segment's experts, a scan over (expert, segment) gives each segment's first row per
 * expert, and pass 2 hands out rows 32 assignments at a time, a lane's rank among the earlier
 * lanes with its expert found by __match_any_sync (no atomics: stable and deterministic). With a capacity
 * (cap rows per expert), an assignment whose rank within its expert reaches cap is dropped (row
 * -1) and the groups are clipped to cap: the first cap in (token, k) order stay, as on the CPU.
 * Dropping by weight instead, a block per expert first finds its cap heaviest assignments (a radix
 * select on the key (weight, -index), so equal weights keep the earlier (token, k), as the CPU's
 * sort) and writes pos = the expert for those and -1 for the rest; the index kernel then sorts pos
 * in place, dropless. */
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/quant_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#define DW_MOE_IDX_THREADS 1024
#define DW_MOE_IDX_SMEM_INTS 11264 /* 44 KiB: segments x experts counts, then the expert totals */
#define DW_MOE_ROW_THREADS 256

#define DW_MOE_IDX_AHEAD 8 /* chunks of 32 assignments whose experts a warp loads before ranking them */

/* A lane's expert e as loaded (-1: none, or past the end); of the 32 lanes' experts, how many lanes
 * before this one hold the same value, and how many in all: the lane's rank within its expert in
 * this chunk and the chunk's count of it. */
static __device__ __forceinline__ int dw_moe_rank(int e, int E, int lane, int &before, int &total) {
    if (e < 0 || e >= E) e = -1;
    const unsigned same = __match_any_sync(0xffffffffu, e); /* the lanes holding e */
    before = __popc(same & ((1u << lane) - 1u)), total = __popc(same);
    return e;
}

/* The experts of this lane's assignments in the DW_MOE_IDX_AHEAD chunks from base, loaded together
 * (a chunk past the segment's end hi or past A: -1), so that their latencies overlap: one load per
 * chunk, each waited for before the next, held the one-block index kernel at ~73 us for moe-e64's
 * 65536 assignments (bench/RESULTS.md session 32). */
static __device__ __forceinline__ void dw_moe_load_ahead(const int32_t *idx, int64_t base, int64_t hi, int64_t A,
                                                         int lane, int *ev) {
#pragma unroll
    for (int u = 0; u < DW_MOE_IDX_AHEAD; u++) {
        const int64_t a = base + 32 * u + lane;
        ev[u] = base + 32 * u < hi && a < A ? idx[a] : -1; /* (plain loads: the by-weight path sorts idx in place) */
    }
}

static __global__ void __launch_bounds__(DW_MOE_IDX_THREADS)
dw_moe_index_kernel(int32_t *offsets, int32_t *pos, const int32_t *idx, int64_t A, int E, int S, int32_t cap) {
    __shared__ int32_t sh[DW_MOE_IDX_SMEM_INTS];
    int32_t *seg = sh, *tot = sh + (int64_t)S * E; /* seg[s*E + e]: segment s's count, then first rank */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t L = ((A + S - 1) / S + 31) / 32 * 32; /* segment length, whole chunks */
    const int64_t lo = w * L, hi = (w + 1) * L < A ? (w + 1) * L : A; /* this warp's segment */
    for (int i = threadIdx.x; i < S * E; i += blockDim.x) seg[i] = 0;
    __syncthreads();
    if (w < S) /* pass 1: counts */
        for (int64_t base = lo; base < hi; base += 32 * DW_MOE_IDX_AHEAD) {
            int ev[DW_MOE_IDX_AHEAD];
            dw_moe_load_ahead(idx, base, hi, A, lane, ev);
#pragma unroll
            for (int u = 0; u < DW_MOE_IDX_AHEAD; u++) {
                int before, total;
                const int e = dw_moe_rank(ev[u], E, lane, before, total);
                if (e >= 0 && before == 0) seg[w * E + e] += total; /* one leader per expert and chunk */
                __syncwarp();
            }
        }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) { /* each segment's first rank within its expert */
        int32_t run = 0;
        for (int s = 0; s < S; s++) {
            const int32_t c = seg[s * E + e];
            seg[s * E + e] = run;
            run += c;
        }
        tot[e] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* group offsets: exclusive scan of the totals clipped to the capacity */
        int32_t run = 0;
        for (int e = 0; e < E; e++) {
            offsets[e] = run;
            const int32_t c = tot[e] < cap ? tot[e] : cap;
            tot[e] = run;
            run += c;
        }
        offsets[E] = run;
    }
    __syncthreads();
    if (w < S) /* pass 2: rows, in (token, k) order within each expert; ranks past cap dropped */
        for (int64_t base = lo; base < hi; base += 32 * DW_MOE_IDX_AHEAD) {
            int ev[DW_MOE_IDX_AHEAD];
            dw_moe_load_ahead(idx, base, hi, A, lane, ev);
#pragma unroll
            for (int u = 0; u < DW_MOE_IDX_AHEAD; u++) {
                const int64_t a = base + 32 * u + lane;
                int before, total;
                const int e = dw_moe_rank(ev[u], E, lane, before, total);
                const int32_t first = e >= 0 ? seg[w * E + e] : 0, rank = first + before;
                if (base + 32 * u < hi && a < A) pos[a] = e >= 0 && rank < cap ? tot[e] + rank : -1;
                __syncwarp();
                if (e >= 0 && before == 0) seg[w * E + e] = first + total;
                __syncwarp();
            }
        }
}

#define DW_MOE_SEL_THREADS 256

/* The select key of assignment a: the weight's bits in an order that sorts as the floats do (-0 as
 * +0), then ~a, so a larger key is a heavier weight or an equal one earlier. */
template <typename T>
static __device__ __forceinline__ uint64_t dw_moe_key(const T *w, int64_t a) {
    float f = dw_ld(w, a);
    if (f == 0.0f) f = 0.0f;
    uint32_t u = __float_as_uint(f);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint32_t)~(uint32_t)a;
}

/* Block e: keep[a] = e for the cap largest keys among the assignments with idx[a] == e, -1 for its
 * others; block 0 also writes -1 for experts outside [0, E). MSB-first radix select, 8 bits a pass:
 * after pass p the top 8(p+1) bits of the cap-th largest key are known. */
template <typename T>
static __global__ void __launch_bounds__(DW_MOE_SEL_THREADS)
dw_moe_select_kernel(int32_t *keep, const int32_t *idx, const T *w, int64_t A, int E, int64_t cap) {
    __shared__ int64_t hist[256];
    __shared__ uint64_t prefix_sh;
    __shared__ int64_t want_sh;
    const int e = blockIdx.x;
    uint64_t prefix = 0;
    int64_t want = cap; /* the rank (1-based) of the threshold among the keys matching the prefix */
    for (int pass = 0; pass < 8; pass++) {
        const int shift = 56 - 8 * pass;
        const uint64_t mask = pass ? ~0ull << (shift + 8) : 0ull;
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int64_t a = threadIdx.x; a < A; a += blockDim.x)
            if (idx[a] == e) {
                const uint64_t k = dw_moe_key(w, a);
                if ((k & mask) == prefix) atomicAdd((unsigned long long *)&hist[(k >> shift) & 255], 1ull);
            }
        __syncthreads();
        if (threadIdx.x == 0) {
            int64_t above = 0;
            int d = 255;
            if (pass == 0) { /* the whole group fits: keep it all */
                int64_t n = 0;
                for (int i = 0; i < 256; i++) n += hist[i];
                if (n <= cap) want = 0;
            }
            if (want > 0) {
                while (d > 0 && above + hist[d] < want) above += hist[d--];
                want -= above;
                prefix |= (uint64_t)d << shift;
            }
            prefix_sh = prefix, want_sh = want;
        }
        __syncthreads();
        prefix = prefix_sh, want = want_sh;
        if (want == 0) break;
    }
    /* want 0: all kept (threshold 0); else prefix is the cap-th largest key itself (keys differ) */
    const uint64_t thr = want == 0 ? 0ull : prefix;
    for (int64_t a = threadIdx.x; a < A; a += blockDim.x) {
        const int32_t ea = idx[a];
        if (ea == e) keep[a] = dw_moe_key(w, a) >= thr ? e : -1;
        else if (e == 0 && (ea < 0 || ea >= E)) keep[a] = -1;
    }
}

/* cnt (2+E) int64 += the A assignments, those dropped, the choices per expert: each block counts
 * its stride of the assignments in shared memory, then adds its counts into cnt (integer atomics:
 * the sums are exact in any order); block 0 adds the totals. One block took ~29 us for moe-e64's
 * 65536 assignments, its loads one latency each (bench/RESULTS.md session 32). */
static __global__ void __launch_bounds__(DW_MOE_IDX_THREADS)
dw_moe_count_kernel(long long *cnt, const int32_t *idx, const int32_t *offsets, int64_t A, int E) {
    __shared__ int32_t load[4096];
    for (int e = threadIdx.x; e < E; e += blockDim.x) load[e] = 0;
    __syncthreads();
    for (int64_t a = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; a < A; a += (int64_t)gridDim.x * blockDim.x) {
        const int32_t e = idx[a];
        if (e >= 0 && e < E) atomicAdd(&load[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (load[e]) atomicAdd((unsigned long long *)&cnt[2 + e], (unsigned long long)load[e]);
    if (blockIdx.x == 0 && threadIdx.x == 0) cnt[0] += A, cnt[1] += A - offsets[E];
}

/* One row of C values, 16 bytes at a time where both rows allow it. */
template <typename T>
static __device__ __forceinline__ void dw_moe_copy_row(T *dst, const T *src, int64_t C) {
    if (((uintptr_t)dst & 15u) == 0 && ((uintptr_t)src & 15u) == 0 && (C * (int64_t)sizeof(T)) % 16 == 0) {
        const int64_t nv = C * (int64_t)sizeof(T) / 16;
        for (int64_t v = threadIdx.x; v < nv; v += blockDim.x)
            reinterpret_cast<uint4 *>(dst)[v] = reinterpret_cast<const uint4 *>(src)[v];
    } else {
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
    }
}

/* xs[pos[a]] = x[a / K], a block per assignment. */
template <typename T>
static __global__ void __launch_bounds__(DW_MOE_ROW_THREADS)
dw_moe_gather_kernel(T *xs, const T *x, const int32_t *pos, int64_t A, int64_t C, int64_t K) {
    for (int64_t a = blockIdx.x; a < A; a += gridDim.x) {
        const int32_t r = pos[a];
        if (r >= 0) dw_moe_copy_row(xs + (int64_t)r * C, x + (a / K) * C, C);
    }
}

/* The same where rows are whole 16-byte pieces (nv of them) and both bases 16-byte aligned: a warp
 * per assignment, each lane four pieces in flight (loads before stores). */
static __global__ void __launch_bounds__(DW_MOE_ROW_THREADS)
dw_moe_gather16_kernel(uint4 *__restrict__ xs, const uint4 *__restrict__ x, const int32_t *__restrict__ pos,
                       int64_t A, int64_t nv, int64_t K) {
    const int lane = threadIdx.x & 31, warps = DW_MOE_ROW_THREADS / 32;
    for (int64_t a = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5); a < A; a += (int64_t)gridDim.x * warps) {
        const int32_t r = pos[a];
        if (r < 0) continue;
        uint4 *dst = xs + (int64_t)r * nv;
        const uint4 *src = x + (a / K) * nv;
        for (int64_t v0 = lane; v0 < nv; v0 += 128) {
            uint4 t[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (v0 + 32 * j < nv) t[j] = src[v0 + 32 * j];
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (v0 + 32 * j < nv) dst[v0 + 32 * j] = t[j];
        }
    }
}

/* Rows [offsets[E], R) of y set to zero: the capacity beyond the assigned rows. */
template <typename T>
static __global__ void __launch_bounds__(DW_MOE_ROW_THREADS)
dw_moe_zero_tail_kernel(T *y, const int32_t *offsets, int E, int64_t R, int64_t C) {
    const int64_t used = offsets[E];
    for (int64_t r = used + blockIdx.x; r < R; r += gridDim.x)
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw_st(y, r * C + c, 0.0f);
}

/* out[n] = sum_k w[n,k] ys[pos[n,k]] (w NULL: weights 1), k ascending; a block per token. */
template <typename T>
static __global__ void __launch_bounds__(DW_MOE_ROW_THREADS)
dw_moe_combine_kernel(T *out, const T *ys, const T *wt, const int32_t *pos, int64_t N, int64_t C, int64_t K) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x)
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                const int32_t r = pos[n * K + k];
                if (r >= 0) s += (wt ? dw_ld(wt, n * K + k) : 1.0f) * dw_ld(ys, (int64_t)r * C + c);
            }
            dw_st(out, n * C + c, s);
        }
}

#define DW_MOE_VEC_K 16 /* the vectorised combines' most assignments per token */

/* The same sum over BF16 rows whose C is a multiple of 8 (16-byte aligned bases): each thread
 * 8 columns at a time, k ascending as above (the same values). */
static __global__ void __launch_bounds__(DW_MOE_ROW_THREADS)
dw_moe_combine8_kernel(dw_bf16 *out, const dw_bf16 *ys, const dw_bf16 *wt, const int32_t *pos, int64_t N, int64_t C,
                       int64_t K) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        int32_t r[DW_MOE_VEC_K];
        float w[DW_MOE_VEC_K];
#pragma unroll
        for (int k = 0; k < DW_MOE_VEC_K; k++)
            if (k < K) r[k] = pos[n * K + k], w[k] = wt ? dw_ld(wt, n * K + k) : 1.0f;
        for (int64_t c = 8 * (int64_t)threadIdx.x; c < C; c += 8 * DW_MOE_ROW_THREADS) {
            float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
            for (int k = 0; k < DW_MOE_VEC_K; k++) {
                if (k >= K || r[k] < 0) continue;
                float y[8];
                dw_ld8(ys, (int64_t)r[k] * C + c, y);
#pragma unroll
                for (int i = 0; i < 8; i++) s[i] += w[k] * y[i];
            }
            dw_st8(out, n * C + c, s);
        }
    }
}

/* The backward over such rows: each thread 8 columns at a time, dys written as it goes, the K dots'
 * partial sums kept and summed over the block once per token (warp sums, then the warps in order).
 * Q (C % 128 == 0): each dys row's fp8_block rows too, codes [R, C] and scales [R, C/128] (the
 * down layer's dgrad dy: dw_cuda_moe_combine_bwd_rows_fp8); the column loop then runs whole warps
 * (a 1x128 block is 16 lanes' shuffles), the lanes past C computing zeros and storing nothing. */
template <bool Q>
static __global__ void __launch_bounds__(DW_MOE_ROW_THREADS)
dw_moe_combine8_bwd_kernel(dw_bf16 *dys, dw_bf16 *dwt, const dw_bf16 *dout, const dw_bf16 *ys, const dw_bf16 *wt,
                           const int32_t *pos, int64_t N, int64_t C, int64_t K, uint8_t *codes, float *scales) {
    __shared__ float red[DW_MOE_ROW_THREADS / 32][DW_MOE_VEC_K];
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int64_t cend = Q ? (C / 8 + 31) / 32 * 32 * 8 : C;
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        int32_t r[DW_MOE_VEC_K];
        float w[DW_MOE_VEC_K], dot[DW_MOE_VEC_K];
#pragma unroll
        for (int k = 0; k < DW_MOE_VEC_K; k++) {
            dot[k] = 0.0f;
            if (k < K) r[k] = pos[n * K + k], w[k] = dw_ld(wt, n * K + k);
        }
        for (int64_t c = 8 * (int64_t)threadIdx.x; c < cend; c += 8 * DW_MOE_ROW_THREADS) {
            const bool in = c < C;
            float g[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (in) dw_ld8(dout, n * C + c, g);
#pragma unroll
            for (int k = 0; k < DW_MOE_VEC_K; k++) {
                if (k >= K || r[k] < 0) continue; /* the same for every thread of the block */
                const int64_t o = (int64_t)r[k] * C + c;
                if (dwt && in) {
                    float y[8];
                    dw_ld8(ys, o, y);
#pragma unroll
                    for (int i = 0; i < 8; i++) dot[k] += g[i] * y[i];
                }
                if (dys) {
                    float d[8];
#pragma unroll
                    for (int i = 0; i < 8; i++) d[i] = w[k] * g[i];
                    if (in) dw_st8(dys, o, d);
                    if constexpr (Q) {
#pragma unroll
                        for (int i = 0; i < 8; i++) d[i] = __bfloat162float(__float2bfloat16_rn(d[i])); /* as stored */
                        const float sc = dw_rule_fp8_scale(dwq::chunk_amax<128>(d), false);
                        uint32_t wd[2];
                        dwq::encode8<dwq::F_E4M3>(dwq::fp8_q(sc), d, wd);
                        if (in) {
                            *reinterpret_cast<uint2 *>(codes + o) = make_uint2(wd[0], wd[1]);
                            if (c % 128 == 0) scales[o / 128] = sc;
                        }
                    }
                }
            }
        }
        if (!dwt) continue;
#pragma unroll
        for (int k = 0; k < DW_MOE_VEC_K; k++)
            if (k < K) dot[k] = dw_warp_sum(dot[k]);
        __syncthreads(); /* the previous token's readers are done with red */
        if (lane == 0)
#pragma unroll
            for (int k = 0; k < DW_MOE_VEC_K; k++)
                if (k < K) red[wp][k] = dot[k];
        __syncthreads();
        if (threadIdx.x < K) {
            float t = 0.0f;
            for (int q = 0; q < DW_MOE_ROW_THREADS / 32; q++) t += red[q][threadIdx.x];
            dw_st(dwt, n * K + threadIdx.x, t); /* 0 for a dropped assignment */
        }
    }
}

/* dys[pos[n,k]] = w[n,k] dout[n] and dw[n,k] = dout[n] . ys[pos[n,k]] (either output may be NULL);
 * a block per token, the dot a fixed-order block sum. */
template <typename T>
static __global__ void __launch_bounds__(DW_MOE_ROW_THREADS)
dw_moe_combine_bwd_kernel(T *dys, T *dwt, const T *dout, const T *ys, const T *wt, const int32_t *pos, int64_t N,
                          int64_t C, int64_t K) {
    __shared__ float red[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x)
        for (int64_t k = 0; k < K; k++) {
            const int32_t r = pos[n * K + k];
            if (r < 0) {
                if (dwt && threadIdx.x == 0) dw_st(dwt, n * K + k, 0.0f);
                continue;
            }
            const float wk = dw_ld(wt, n * K + k);
            float dot = 0.0f;
            for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
                const float g = dw_ld(dout, n * C + c);
                if (dwt) dot += g * dw_ld(ys, (int64_t)r * C + c);
                if (dys) dw_st(dys, (int64_t)r * C + c, wk * g);
            }
            if (dwt) {
                dot = dw_block_sum(dot, red);
                if (threadIdx.x == 0) dw_st(dwt, n * K + k, dot);
            }
        }
}

static unsigned dw_moe_blocks(int64_t n) { return (unsigned)(n < 1 ? 1 : n > (1 << 20) ? (1 << 20) : n); }
/* The zero-tail kernel's grid: it strides over the rows past offsets[E], mostly none (dropless). */
static unsigned dw_moe_tail_blocks(int64_t R) { return dw_moe_blocks(R < 1024 ? R : 1024); }

extern "C" dw_status dw_cuda_moe_dispatch_fwd(dw_ctx *ctx, dw_act_dtype dt, void *xs, int32_t *offsets, int32_t *pos,
                                              const void *x, const int32_t *idx, const void *prio, int64_t N,
                                              int64_t C, int64_t K, int64_t E, int64_t cap, void *stream) {
    const char *op = "moe_dispatch";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && C >= 1 && K >= 1 && E >= 1 && E <= 4096 && N * K <= INT32_MAX);
    DW_OPS_REQUIRE(ctx, op, xs && offsets && pos && (N == 0 || (x && idx)));
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t A = N * K;
    if (cap <= 0 || cap > A) cap = A; /* dropless */
    const int64_t R = E * cap < A ? E * cap : A; /* the rows xs holds (dw_moe_routed_rows) */
    if (prio && cap < A) { /* by weight: pos = the kept experts, then sorted in place, dropless */
        if (dt == DW_ACT_F32)
            dw_moe_select_kernel<float><<<(unsigned)E, DW_MOE_SEL_THREADS, 0, s>>>(pos, idx, (const float *)prio, A,
                                                                                   (int)E, cap);
        else
            dw_moe_select_kernel<dw_bf16><<<(unsigned)E, DW_MOE_SEL_THREADS, 0, s>>>(pos, idx, (const dw_bf16 *)prio,
                                                                                     A, (int)E, cap);
        DW_CUDA_CHECK_LAUNCH(ctx, op);
        idx = pos, cap = A;
    }
    int S = (int)((DW_MOE_IDX_SMEM_INTS - E) / E);
    if (S > 32) S = 32;
    dw_moe_index_kernel<<<1, DW_MOE_IDX_THREADS, 0, s>>>(offsets, pos, idx, A, (int)E, S, (int32_t)cap);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    if (A == 0) return DW_OK;
    const int64_t es = dw_act_size(dt), warps = DW_MOE_ROW_THREADS / 32;
    if ((C * es) % 16 == 0 && dw_aligned16(xs) && dw_aligned16(x))
        dw_moe_gather16_kernel<<<dw_moe_blocks((A + warps - 1) / warps), DW_MOE_ROW_THREADS, 0, s>>>(
            (uint4 *)xs, (const uint4 *)x, pos, A, C * es / 16, K);
    else if (dt == DW_ACT_F32)
        dw_moe_gather_kernel<float><<<dw_moe_blocks(A), DW_MOE_ROW_THREADS, 0, s>>>((float *)xs, (const float *)x, pos,
                                                                                   A, C, K);
    else
        dw_moe_gather_kernel<dw_bf16><<<dw_moe_blocks(A), DW_MOE_ROW_THREADS, 0, s>>>((dw_bf16 *)xs, (const dw_bf16 *)x,
                                                                                     pos, A, C, K);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    if (dt == DW_ACT_F32)
        dw_moe_zero_tail_kernel<float><<<dw_moe_tail_blocks(R), DW_MOE_ROW_THREADS, 0, s>>>((float *)xs, offsets, (int)E,
                                                                                         R, C);
    else
        dw_moe_zero_tail_kernel<dw_bf16><<<dw_moe_tail_blocks(R), DW_MOE_ROW_THREADS, 0, s>>>((dw_bf16 *)xs, offsets,
                                                                                           (int)E, R, C);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" dw_status dw_cuda_moe_zero_tail(dw_ctx *ctx, dw_act_dtype dt, void *y, const int32_t *offsets, int64_t E,
                                           int64_t R, int64_t C, void *stream) {
    const char *op = "moe zero tail";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, R >= 0 && C >= 1 && E >= 1 && (R == 0 || (y && offsets)));
    if (R == 0) return DW_OK;
    cudaStream_t s = (cudaStream_t)stream;
    if (dt == DW_ACT_F32)
        dw_moe_zero_tail_kernel<float><<<dw_moe_tail_blocks(R), DW_MOE_ROW_THREADS, 0, s>>>((float *)y, offsets, (int)E,
                                                                                         R, C);
    else
        dw_moe_zero_tail_kernel<dw_bf16><<<dw_moe_tail_blocks(R), DW_MOE_ROW_THREADS, 0, s>>>((dw_bf16 *)y, offsets, (int)E,
                                                                                       R, C);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" dw_status dw_cuda_moe_combine_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *ys, const void *wt,
                                             const int32_t *pos, int64_t N, int64_t C, int64_t K, void *stream) {
    const char *op = wt ? "moe_combine" : "moe_dispatch backward";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && C >= 1 && K >= 1 && (N == 0 || (out && pos)));
    if (N == 0) return DW_OK;
    cudaStream_t s = (cudaStream_t)stream;
    if (!ys) { /* no gradient reached the rows: none leaves */
        DW_CUDA_CHECK(ctx, cudaMemsetAsync(out, 0, (size_t)(N * C) * (size_t)dw_act_size(dt), s));
        return DW_OK;
    }
    if (dt == DW_ACT_BF16 && C % 8 == 0 && K <= DW_MOE_VEC_K && dw_aligned16(out) && dw_aligned16(ys))
        dw_moe_combine8_kernel<<<dw_moe_blocks(N), DW_MOE_ROW_THREADS, 0, s>>>(
            (dw_bf16 *)out, (const dw_bf16 *)ys, (const dw_bf16 *)wt, pos, N, C, K);
    else if (dt == DW_ACT_F32)
        dw_moe_combine_kernel<float><<<dw_moe_blocks(N), DW_MOE_ROW_THREADS, 0, s>>>(
            (float *)out, (const float *)ys, (const float *)wt, pos, N, C, K);
    else
        dw_moe_combine_kernel<dw_bf16><<<dw_moe_blocks(N), DW_MOE_ROW_THREADS, 0, s>>>(
            (dw_bf16 *)out, (const dw_bf16 *)ys, (const dw_bf16 *)wt, pos, N, C, K);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" dw_status dw_cuda_moe_combine_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dys, void *dwt, const void *dout,
                                             const void *ys, const void *wt, const int32_t *pos, int64_t N, int64_t C,
                                             int64_t K, int64_t R, bool covered, void *stream) {
    const char *op = "moe_combine backward";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && C >= 1 && K >= 1 && R >= 0 && (!covered || R == N * K));
    DW_OPS_REQUIRE(ctx, op, !dout || N == 0 || (ys && wt && pos));
    cudaStream_t s = (cudaStream_t)stream;
    const size_t es = (size_t)dw_act_size(dt);
    /* rows no assignment points at (a dropped or invalid one) get zeros; covered: there are none
     * unless no gradient comes (moe-e64: 0.09 ms a layer of memset saved) */
    if (dys && R > 0 && (!covered || !dout || N == 0))
        DW_CUDA_CHECK(ctx, cudaMemsetAsync(dys, 0, (size_t)(R * C) * es, s));
    if (!dout || N == 0) {
        if (dwt && N > 0) DW_CUDA_CHECK(ctx, cudaMemsetAsync(dwt, 0, (size_t)(N * K) * es, s));
        return DW_OK;
    }
    if (!dys && !dwt) return DW_OK;
    if (dt == DW_ACT_BF16 && C % 8 == 0 && K <= DW_MOE_VEC_K && dw_aligned16(dout) && dw_aligned16(ys) &&
        (!dys || dw_aligned16(dys)))
        dw_moe_combine8_bwd_kernel<false><<<dw_moe_blocks(N), DW_MOE_ROW_THREADS, 0, s>>>(
            (dw_bf16 *)dys, (dw_bf16 *)dwt, (const dw_bf16 *)dout, (const dw_bf16 *)ys, (const dw_bf16 *)wt, pos, N, C,
            K, nullptr, nullptr);
    else if (dt == DW_ACT_F32)
        dw_moe_combine_bwd_kernel<float><<<dw_moe_blocks(N), DW_MOE_ROW_THREADS, 0, s>>>(
            (float *)dys, (float *)dwt, (const float *)dout, (const float *)ys, (const float *)wt, pos, N, C, K);
    else
        dw_moe_combine_bwd_kernel<dw_bf16><<<dw_moe_blocks(N), DW_MOE_ROW_THREADS, 0, s>>>(
            (dw_bf16 *)dys, (dw_bf16 *)dwt, (const dw_bf16 *)dout, (const dw_bf16 *)ys, (const dw_bf16 *)wt, pos, N,
            C, K);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" dw_status dw_cuda_moe_combine_bwd_rows_fp8(dw_ctx *ctx, void *dys, void *dwt, const void *dout,
                                                      const void *ys, const void *wt, const int32_t *pos, int64_t N,
                                                      int64_t C, int64_t K, uint8_t *codes, float *scales,
                                                      void *stream) {
    const char *op = "moe_combine backward (fp8_block rows)";
    DW_OPS_REQUIRE(ctx, op, N >= 0 && C >= 128 && C % 128 == 0 && K >= 1 && K <= DW_MOE_VEC_K);
    if (N == 0) return DW_OK;
    DW_OPS_REQUIRE(ctx, op, dys && dout && ys && wt && pos && codes && scales);
    DW_OPS_REQUIRE(ctx, op, dw_aligned16(dys) && dw_aligned16(dout) && dw_aligned16(ys) &&
                                ((uintptr_t)codes & 7u) == 0 && ((uintptr_t)scales & 3u) == 0);
    dw_moe_combine8_bwd_kernel<true><<<dw_moe_blocks(N), DW_MOE_ROW_THREADS, 0, (cudaStream_t)stream>>>(
        (dw_bf16 *)dys, (dw_bf16 *)dwt, (const dw_bf16 *)dout, (const dw_bf16 *)ys, (const dw_bf16 *)wt, pos, N, C, K,
        codes, scales);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" dw_status dw_cuda_moe_count(dw_ctx *ctx, int64_t *cnt, const int32_t *idx, const int32_t *offsets,
                                       int64_t A, int64_t E, void *stream) {
    const char *op = "moe_dispatch counters";
    DW_OPS_REQUIRE(ctx, op, cnt && offsets && A >= 0 && E >= 1 && E <= 4096 && (A == 0 || idx));
    const int64_t blocks = (A + 4 * DW_MOE_IDX_THREADS - 1) / (4 * DW_MOE_IDX_THREADS); /* ~4 assignments a thread */
    dw_moe_count_kernel<<<(unsigned)(blocks < 1 ? 1 : blocks > 264 ? 264 : blocks), DW_MOE_IDX_THREADS, 0,
                          (cudaStream_t)stream>>>((long long *)cnt, idx, offsets, A, (int)E);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}
