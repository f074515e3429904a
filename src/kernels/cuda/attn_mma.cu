/* attn_mma.cu — causal GQA attention on the tensor cores (mma.sync.m16n8k16 BF16 -> FP32), for
 * BF16 activations and D = 64 or 128; FlashAttention-2 style tiles of 64 query rows x 64 keys,
 * 4 warps of 16 rows, online softmax in FP32 registers (ex2.approx), causal tiles above the
 * diagonal skipped; under a sliding window of W keys also the tiles below it (mistral, qwen2,
 * Gemma 2), and scores optionally soft-capped to cap tanh(s / cap) (Gemma 2). The probability (and
 * dS) operand of the second GEMM is split into two BF16 terms (hi + lo, ~16 bits) so results stay
 * within the reference kernels' BF16 tolerance. Backward
 * is two kernels without atomics (dQ over query tiles, computing delta = rowsum(dout * out) first;
 * dK, dV over key tiles looping over the group's heads): deterministic. Not the FP32 path or other
 * D (ops_attention.cu keeps those). */
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "kernels/cuda/attn_mma.h"

typedef __nv_bfloat16 am_bf16;
#include "kernels/cuda/attn_mma_ptx.cuh"

#define AM_ROWS 64 /* query rows (or keys) per block: 4 warps x 16 */
#define AM_THREADS 128
#define AM_LOG2E 1.4426950408889634f
#define AM_LN2 0.6931471805599453f

/* ---- fragments (the PTX primitives am_mma, am_ldsm, am_ldsm_t, am_cp16, am_commit, am_wait, am_exp2:
 * attn_mma_ptx.cuh) ------------------------------------------------------------------------------- */
static __device__ __forceinline__ uint32_t am_bits(__nv_bfloat162 v) { return *(uint32_t *)&v; }
/* x0, x1 (consecutive columns) -> BF16 pair hi and the pair of remainders lo (hi + lo ~ x). */
static __device__ __forceinline__ void am_split(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    hi = am_bits(h);
    lo = am_bits(__floats2bfloat162_rn(x0 - hf.x, x1 - hf.y));
}
/* A fragment (16 rows x 16 cols, row-major smem, stride LD) at (r0, c0): one ldmatrix.x4. */
template <int LD>
static __device__ __forceinline__ void am_frag_a(uint32_t a[4], const am_bf16 *s, int r0, int c0, int lane) {
    am_ldsm(a, s + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + c0 + (lane >> 4) * 8);
}
/* B fragments of n-tiles n0 and n0 + 8 (k = stored column c0..c0+15, n = stored row):
 * b[0], b[1] for n0; b[2], b[3] for n0 + 8. */
template <int LD>
static __device__ __forceinline__ void am_frag_b2(uint32_t b[4], const am_bf16 *s, int n0, int c0, int lane) {
    am_ldsm(b, s + (n0 + (lane & 7) + ((lane >> 4) & 1) * 8) * LD + c0 + ((lane >> 3) & 1) * 8);
}
/* The C fragments of n-tiles 2kk, 2kk+1 (16 x 16) as A fragments, split into hi and lo. */
static __device__ __forceinline__ void am_c_to_a(const float c0[4], const float c1[4], uint32_t hi[4], uint32_t lo[4]) {
    am_split(c0[0], c0[1], hi[0], lo[0]);
    am_split(c0[2], c0[3], hi[1], lo[1]);
    am_split(c1[0], c1[1], hi[2], lo[2]);
    am_split(c1[2], c1[3], hi[3], lo[3]);
}

/* Starts copying rows r0..r0+63 of head hd of a (B,T,heads,D) BF16 tensor whose token rows are rs
 * elements apart (heads*D, or more inside a packed qkv row) into smem [64][LD] (rows >= T zero);
 * complete after am_commit + am_wait + __syncthreads. */
template <int D, int LD>
static __device__ __forceinline__ void am_load_tile(am_bf16 *dst, const am_bf16 *src, int64_t b, int64_t r0,
                                                    int64_t hd, int64_t T, int64_t rs) {
    constexpr int VPR = D / 8, RPP = AM_THREADS / VPR; /* 16-byte vectors per row, rows per pass */
    const int rr = threadIdx.x / VPR, c = threadIdx.x % VPR;
    const am_bf16 *p = src + (b * T + r0 + rr) * rs + hd * D + c * 8; /* read only where row < T */
    am_bf16 *d = dst + rr * LD + c * 8;
#pragma unroll
    for (int i = 0; i < AM_ROWS / RPP; i++) {
        const bool ok = r0 + rr + i * RPP < T;
        am_cp16(d + i * RPP * LD, ok ? p + i * RPP * rs : src, ok);
    }
}
/* Both tiles (K and V, or Q and dout) of one pipeline stage: dst [2][64][LD]. */
template <int D, int LD>
static __device__ __forceinline__ void am_load_pair(am_bf16 *dst, const am_bf16 *x, const am_bf16 *y, int64_t b,
                                                    int64_t r0, int64_t hd, int64_t T, int64_t rx, int64_t ry) {
    am_load_tile<D, LD>(dst, x, b, r0, hd, T, rx);
    am_load_tile<D, LD>(dst + AM_ROWS * LD, y, b, r0, hd, T, ry);
}

/* acc[u][nt] (SUB subtiles of 16 rows x NT n-tiles of 8) += A_u . B^T, where A_u is 16 x D from smem
 * as at rows r0 + 64 u and B the NT*8 stored rows of bs from n0 (k = d). Each B fragment is loaded
 * once for all SUB subtiles (fewer ldmatrix per mma as SUB grows). */
template <int D, int LD, int SUB, int NT>
static __device__ __forceinline__ void am_gemm_nt(float (*acc)[NT][4], const am_bf16 *as, int r0, const am_bf16 *bs,
                                                  int n0, int lane) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[SUB][4];
#pragma unroll
        for (int u = 0; u < SUB; u++) am_frag_a<LD>(a[u], as, r0 + AM_ROWS * u, kk * 16, lane);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bb[4];
            am_frag_b2<LD>(bb, bs, n0 + np * 16, kk * 16, lane);
#pragma unroll
            for (int u = 0; u < SUB; u++) {
                am_mma(acc[u][2 * np], a[u], bb[0], bb[1]);
                am_mma(acc[u][2 * np + 1], a[u], bb[2], bb[3]);
            }
        }
    }
}
template <int SUB, int NT>
static __device__ __forceinline__ void am_zero(float (*acc)[NT][4]) {
#pragma unroll
    for (int u = 0; u < SUB; u++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[u][nt][0] = acc[u][nt][1] = acc[u][nt][2] = acc[u][nt][3] = 0.0f;
}
/* acc[u] (16 x D) += P_u (16 x 16 KT, C fragments p[u][2 KT][4]) . S (16 KT stored rows of s x D),
 * P split into hi + lo BF16 when SPLIT. */
template <int D, int LD, bool SPLIT, int SUB, int KT>
static __device__ __forceinline__ void am_gemm_pv(float (*acc)[D / 8][4], const float (*p)[2 * KT][4],
                                                  const am_bf16 *s, int lane) {
#pragma unroll
    for (int kk = 0; kk < KT; kk++) {
        uint32_t hi[SUB][4], lo[SUB][4];
#pragma unroll
        for (int u = 0; u < SUB; u++) am_c_to_a(p[u][2 * kk], p[u][2 * kk + 1], hi[u], lo[u]);
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t r[4];
            am_ldsm_t(r, s + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int u = 0; u < SUB; u++) {
                am_mma(acc[u][2 * dp], hi[u], r[0], r[1]);
                am_mma(acc[u][2 * dp + 1], hi[u], r[2], r[3]);
            }
            if (SPLIT)
#pragma unroll
                for (int u = 0; u < SUB; u++) {
                    am_mma(acc[u][2 * dp], lo[u], r[0], r[1]);
                    am_mma(acc[u][2 * dp + 1], lo[u], r[2], r[3]);
                }
        }
    }
}
/* Stores a 16 x D accumulator (rows rowA, rowA + 8) times mul into a (B,T,heads,D) tensor with
 * token rows rs elements apart. */
template <int D>
static __device__ __forceinline__ void am_store(am_bf16 *dst, const float acc[D / 8][4], float mul0, float mul1,
                                                int64_t b, int64_t rowA, int64_t hd, int64_t T, int64_t rs,
                                                int t4) {
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        const int c = nt * 8 + 2 * t4;
        if (rowA < T)
            *(__nv_bfloat162 *)(dst + (b * T + rowA) * rs + hd * D + c) =
                __floats2bfloat162_rn(acc[nt][0] * mul0, acc[nt][1] * mul0);
        if (rowA + 8 < T)
            *(__nv_bfloat162 *)(dst + (b * T + rowA + 8) * rs + hd * D + c) =
                __floats2bfloat162_rn(acc[nt][2] * mul1, acc[nt][3] * mul1);
    }
}

/* Sets s to -inf where key j0 + kc > row rb + rc (rb: the subtile's first row; kc, rc as in the C
 * fragment). Only called when the tile reaches past rb (j0 + 63 > rb). */
template <int NT>
static __device__ __forceinline__ void am_causal(float (*s)[4], int64_t j0, int64_t rb, int g, int t4) {
    const int off = (int)(j0 - rb); /* in (-63, 128) when called */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (off + nt * 8 + 2 * t4 + (e & 1) > g + (e < 2 ? 0 : 8)) s[nt][e] = -INFINITY;
}

/* Sets s to -inf where key j0 + kc < row rb + rc - W + 1 (before the window of W keys). Only called
 * when the tile reaches below some row's window (j0 + W <= rb + 15). */
template <int NT>
static __device__ __forceinline__ void am_window(float (*s)[4], int64_t j0, int64_t rb, int64_t W, int g, int t4) {
    const int64_t off = j0 - rb + W; /* key kc of row rc is outside when kc + off <= rc */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (off + nt * 8 + 2 * t4 + (e & 1) <= g + (e < 2 ? 0 : 8)) s[nt][e] = -INFINITY;
}
/* Raw scores (q.k, before the scale) soft-capped in the same units: s = (cap / scale) tanh(s scale / cap)
 * (cin = scale / cap, cout = cap / scale), so that the exponent stays s scale log2(e) and s cin is the
 * tanh, whose 1 - tanh^2 is the cap's derivative. */
template <int NT>
static __device__ __forceinline__ void am_cap(float (*s)[4], float cin, float cout) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = cout * tanhf(s[nt][e] * cin);
}
/* The first key tile a block of query rows from i0 sees: 0, or the one holding key i0 - W + 1. */
static __device__ __forceinline__ int64_t am_first_tile(int64_t i0, int64_t W) {
    return W > 0 && i0 - W + 1 > 0 ? (i0 - W + 1) / AM_ROWS : 0;
}

/* ---- forward: grid (ceil(T / 64 SUB), H, B), query tiles heaviest first -------------------------
 * A block owns 64 SUB query rows; warp w's subtile u is rows 64 u + 16 w .. + 15, so every warp
 * sees the same causal shape. Key tiles of 64 stream through a two-stage cp.async pipeline. */
template <int D, bool SPLIT, int SUB>
static __global__ void __launch_bounds__(AM_THREADS, D == 64 ? (SUB == 1 ? 4 : 3) : 1)
am_fwd_kernel(am_bf16 *out, float *lse, const am_bf16 *q, const am_bf16 *k, const am_bf16 *v, int64_t T,
              int64_t H, int64_t Hkv, int64_t rq, int64_t rk, float sl2, int64_t W, float cin, float cout) {
    constexpr int LD = D + 8, BM = AM_ROWS * SUB, STAGE = 2 * AM_ROWS * LD; /* K and V tiles */
    extern __shared__ uint4 am_smem[];
    am_bf16 *Qs = (am_bf16 *)am_smem, *KV = Qs + BM * LD;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (H / Hkv);
    const int64_t i0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * BM;
    const int64_t last = min((T - 1) / AM_ROWS, (i0 + BM - 1) / AM_ROWS); /* last key tile */
    const int64_t first = am_first_tile(i0, W);                            /* first key tile */
    const bool cap = cout > 0.0f;
#pragma unroll
    for (int u = 0; u < SUB; u++) am_load_tile<D, LD>(Qs + u * AM_ROWS * LD, q, b, i0 + AM_ROWS * u, h, T, rq);
    am_load_pair<D, LD>(KV, k, v, b, first * AM_ROWS, kvh, T, rk, rk);
    am_commit();
    float o[SUB][D / 8][4], m[SUB][2], l[SUB][2];
    am_zero<SUB, D / 8>(o);
#pragma unroll
    for (int u = 0; u < SUB; u++) m[u][0] = m[u][1] = -INFINITY, l[u][0] = l[u][1] = 0.0f;
    for (int64_t jt = first; jt <= last; jt++) {
        const int64_t j0 = jt * AM_ROWS;
        const int st = (int)((jt - first) & 1);
        const am_bf16 *Ks = KV + st * STAGE, *Vs = Ks + AM_ROWS * LD;
        if (jt < last) { /* the next tile's stage was consumed in iteration jt - 1 */
            am_load_pair<D, LD>(KV + (st ^ 1) * STAGE, k, v, b, j0 + AM_ROWS, kvh, T, rk, rk);
            am_commit();
            am_wait<1>();
        } else {
            am_wait<0>();
        }
        __syncthreads();
        float s[SUB][8][4];
        am_zero<SUB, 8>(s);
        am_gemm_nt<D, LD, SUB, 8>(s, Qs, 16 * w, Ks, 0, lane);
#pragma unroll
        for (int u = 0; u < SUB; u++) {
            const int64_t rb = i0 + AM_ROWS * u + 16 * w;
            if (cap) am_cap<8>(s[u], cin, cout);
            if (j0 + AM_ROWS - 1 > rb) am_causal<8>(s[u], j0, rb, g, t4);
            if (W > 0 && j0 + W <= rb + 15) am_window<8>(s[u], j0, rb, W, g, t4);
            float xA = -INFINITY, xB = -INFINITY; /* raw score maxima (the scale is positive) */
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                xA = fmaxf(xA, fmaxf(s[u][nt][0], s[u][nt][1]));
                xB = fmaxf(xB, fmaxf(s[u][nt][2], s[u][nt][3]));
            }
            xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, 1));
            xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, 2));
            xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, 1));
            xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, 2));
            /* -inf while a row has seen no key (a window's first tiles): its exponents are then taken
             * from 0, so that p = 0 and alpha = 0 rather than NaN; the row's own key comes later */
            const float nA = fmaxf(m[u][0], xA * sl2), nB = fmaxf(m[u][1], xB * sl2);
            const float rA = nA == -INFINITY ? 0.0f : nA, rB = nB == -INFINITY ? 0.0f : nB;
            const float aA = am_exp2(m[u][0] - rA), aB = am_exp2(m[u][1] - rB);
            float sA = 0.0f, sB = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                s[u][nt][0] = am_exp2(fmaf(s[u][nt][0], sl2, -rA)), s[u][nt][1] = am_exp2(fmaf(s[u][nt][1], sl2, -rA));
                s[u][nt][2] = am_exp2(fmaf(s[u][nt][2], sl2, -rB)), s[u][nt][3] = am_exp2(fmaf(s[u][nt][3], sl2, -rB));
                sA += s[u][nt][0] + s[u][nt][1];
                sB += s[u][nt][2] + s[u][nt][3];
            }
            sA += __shfl_xor_sync(0xffffffffu, sA, 1);
            sA += __shfl_xor_sync(0xffffffffu, sA, 2);
            sB += __shfl_xor_sync(0xffffffffu, sB, 1);
            sB += __shfl_xor_sync(0xffffffffu, sB, 2);
            l[u][0] = l[u][0] * aA + sA, l[u][1] = l[u][1] * aB + sB;
            m[u][0] = nA, m[u][1] = nB;
#pragma unroll
            for (int i = 0; i < D / 8; i++) o[u][i][0] *= aA, o[u][i][1] *= aA, o[u][i][2] *= aB, o[u][i][3] *= aB;
        }
        am_gemm_pv<D, LD, SPLIT, SUB, 4>(o, s, Vs, lane);
        __syncthreads(); /* this stage is consumed */
    }
#pragma unroll
    for (int u = 0; u < SUB; u++) {
        const int64_t rowA = i0 + AM_ROWS * u + 16 * w + g, rowB = rowA + 8;
        am_store<D>(out, o[u], 1.0f / l[u][0], 1.0f / l[u][1], b, rowA, h, T, H * D, t4);
        if (t4 == 0) {
            if (rowA < T) lse[(b * H + h) * T + rowA] = (m[u][0] + log2f(l[u][0])) * AM_LN2;
            if (rowB < T) lse[(b * H + h) * T + rowB] = (m[u][1] + log2f(l[u][1])) * AM_LN2;
        }
    }
}

/* ---- backward dQ: grid (ceil(T / 64 SUB), H, B), rows as in the forward -------------------------
 * first delta = rowsum(dout * out) for the block's rows (written for the dK/dV kernel), then
 * per 16 rows x 64/NH keys: s = q k^T, p = exp(s*scale - lse), dp = dout v^T, ds = p (dp - delta),
 * dq += ds k; dq *= scale at the end. NH splits each 64-key tile into NH chunks (registers). */
template <int D, bool SPLIT, int SUB, int NH>
static __global__ void __launch_bounds__(AM_THREADS, D == 64 ? (SUB == 1 ? 4 : 2) : 1)
am_bwd_dq_kernel(am_bf16 *dq, float *delta, const am_bf16 *dout, const am_bf16 *o, const am_bf16 *q,
                 const am_bf16 *k, const am_bf16 *v, const float *lse, int64_t T, int64_t H, int64_t Hkv, int64_t rq,
                 int64_t rk, float sl2, float scale, int64_t W, float cin, float cout) {
    constexpr int LD = D + 8, BM = AM_ROWS * SUB, STAGE = 2 * AM_ROWS * LD, NT = 8 / NH, VPR = D / 8;
    extern __shared__ uint4 am_smem[];
    am_bf16 *Qs = (am_bf16 *)am_smem, *Gs = Qs + BM * LD, *KV = Gs + BM * LD;
    float *Ds = (float *)(KV + 2 * STAGE); /* [BM] delta of the block's rows */
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (H / Hkv);
    const int64_t i0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * BM;
    const int64_t last = min((T - 1) / AM_ROWS, (i0 + BM - 1) / AM_ROWS), first = am_first_tile(i0, W);
    const bool cap = cout > 0.0f;
#pragma unroll
    for (int u = 0; u < SUB; u++) {
        am_load_tile<D, LD>(Qs + u * AM_ROWS * LD, q, b, i0 + AM_ROWS * u, h, T, rq);
        am_load_tile<D, LD>(Gs + u * AM_ROWS * LD, dout, b, i0 + AM_ROWS * u, h, T, H * D);
    }
    am_commit();
    am_load_pair<D, LD>(KV, k, v, b, first * AM_ROWS, kvh, T, rk, rk);
    am_commit();
    am_wait<1>(); /* Q and dout tiles */
    __syncthreads();
    /* delta: VPR consecutive threads share a row, one 16-byte vector of out and dout each */
#pragma unroll
    for (int it = 0; it < BM * VPR / AM_THREADS; it++) {
        const int e = it * AM_THREADS + threadIdx.x, rr = e / VPR, c = e % VPR;
        const int64_t row = i0 + rr;
        float acc = 0.0f;
        if (row < T) {
            const uint4 ov = *(const uint4 *)(o + (b * T + row) * H * D + h * D + c * 8);
            const uint4 gv = *(const uint4 *)(Gs + rr * LD + c * 8);
            const __nv_bfloat162 *op = (const __nv_bfloat162 *)&ov, *gp = (const __nv_bfloat162 *)&gv;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float2 of = __bfloat1622float2(op[i]), gf = __bfloat1622float2(gp[i]);
                acc = fmaf(of.x, gf.x, acc);
                acc = fmaf(of.y, gf.y, acc);
            }
        }
#pragma unroll
        for (int m = 1; m < VPR; m <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
        if (c == 0) {
            Ds[rr] = acc;
            if (row < T) delta[(b * H + h) * T + row] = acc;
        }
    }
    __syncthreads();
    float L[SUB][2], Dl[SUB][2], acc[SUB][D / 8][4];
#pragma unroll
    for (int u = 0; u < SUB; u++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int rr = AM_ROWS * u + 16 * w + g + 8 * r;
            L[u][r] = i0 + rr < T ? lse[(b * H + h) * T + i0 + rr] * AM_LOG2E : 0.0f;
            Dl[u][r] = Ds[rr];
        }
    am_zero<SUB, D / 8>(acc);
    for (int64_t jt = first; jt <= last; jt++) {
        const int64_t j0 = jt * AM_ROWS;
        const int st = (int)((jt - first) & 1);
        const am_bf16 *Ks = KV + st * STAGE, *Vs = Ks + AM_ROWS * LD;
        if (jt < last) {
            am_load_pair<D, LD>(KV + (st ^ 1) * STAGE, k, v, b, j0 + AM_ROWS, kvh, T, rk, rk);
            am_commit();
            am_wait<1>();
        } else {
            am_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int hh = 0; hh < NH; hh++) {
            const int n0 = hh * 8 * NT; /* first key of this chunk in the tile */
            float s[SUB][NT][4], dp[SUB][NT][4];
            am_zero<SUB, NT>(s);
            am_zero<SUB, NT>(dp);
            am_gemm_nt<D, LD, SUB, NT>(s, Qs, 16 * w, Ks, n0, lane);
            am_gemm_nt<D, LD, SUB, NT>(dp, Gs, 16 * w, Vs, n0, lane);
#pragma unroll
            for (int u = 0; u < SUB; u++) {
                const int64_t rb = i0 + AM_ROWS * u + 16 * w;
                if (cap) am_cap<NT>(s[u], cin, cout);
                if (j0 + n0 + 8 * NT - 1 > rb) am_causal<NT>(s[u], j0 + n0, rb, g, t4);
                if (W > 0 && j0 + n0 + W <= rb + 15) am_window<NT>(s[u], j0 + n0, rb, W, g, t4);
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1; /* exp2(-inf) = 0 where masked */
                        const float p = am_exp2(fmaf(s[u][nt][e], sl2, -L[u][r]));
                        float ds = p * (dp[u][nt][e] - Dl[u][r]);
                        if (cap) { /* d capped / d raw = 1 - tanh^2 (masked: p = 0, s = -inf) */
                            const float th = s[u][nt][e] * cin;
                            ds *= p > 0.0f ? 1.0f - th * th : 0.0f;
                        }
                        s[u][nt][e] = ds;
                    }
            }
            am_gemm_pv<D, LD, SPLIT, SUB, NT / 2>(acc, s, Ks + n0 * LD, lane);
        }
        __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < SUB; u++)
        am_store<D>(dq, acc[u], scale, scale, b, i0 + AM_ROWS * u + 16 * w + g, h, T, rq, t4);
}

/* ---- backward dK, dV: grid (nT, Hkv, B), key tiles heaviest first; MASK: a window or a cap (their
 * registers spill the D = 128 kernel, so the plain one is compiled without them) ----------------
 * per 16 keys x 64/NH queries: sT = k q^T, pT = exp(sT*scale - lse), dpT = v dout^T,
 * dsT = pT (dpT - delta); dv += pT dout, dk += dsT q; summed over the group's heads. NH = 2 halves
 * the score registers so the kernel fits 128 registers (4 blocks per SM). */
/* Issues one dK/dV step's stage: the Q and dout tiles of query head h at rows i0.., and their
 * lse * log2(e) and delta. */
template <int D, int LD>
static __device__ __forceinline__ void am_dkv_issue(am_bf16 *QG, float *LDl, int64_t h, int64_t i0,
                                                    const am_bf16 *q, const am_bf16 *dout, const float *lse,
                                                    const float *delta, int64_t b, int64_t T, int64_t H, int64_t rq) {
    am_load_pair<D, LD>(QG, q, dout, b, i0, h, T, rq, H * D);
    am_commit();
    if (threadIdx.x < AM_ROWS) {
        const int64_t tq = i0 + threadIdx.x;
        LDl[threadIdx.x] = tq < T ? lse[(b * H + h) * T + tq] * AM_LOG2E : 0.0f;
        LDl[AM_ROWS + threadIdx.x] = tq < T ? delta[(b * H + h) * T + tq] : 0.0f;
    }
}

template <int D, bool SPLIT, int NH, bool MASK>
static __global__ void __launch_bounds__(AM_THREADS, D == 64 ? (NH == 1 ? 3 : 4) : 1)
am_bwd_dkv_kernel(am_bf16 *dk, am_bf16 *dv, const am_bf16 *dout, const am_bf16 *q, const am_bf16 *k,
                  const am_bf16 *v, const float *lse, const float *delta, int64_t T, int64_t H, int64_t Hkv,
                  int64_t rq, int64_t rk, float sl2, float scale, int64_t W, float cin, float cout) {
    constexpr int LD = D + 8, STAGE = 2 * AM_ROWS * LD, NT = 8 / NH;
    extern __shared__ uint4 am_smem[];
    am_bf16 *Ks = (am_bf16 *)am_smem, *Vs = Ks + AM_ROWS * LD, *QG = Vs + AM_ROWS * LD;
    float *LDl = (float *)(QG + 2 * STAGE); /* per stage: lse * log2(e) [64], delta [64] */
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t b = blockIdx.z, kvh = blockIdx.y, group = H / Hkv, nT = gridDim.x;
    const int64_t jt = blockIdx.x, j0 = jt * AM_ROWS;
    const int64_t keyA = j0 + 16 * w + g; /* this thread's rows: keyA, keyA + 8 */
    if (!MASK) W = 0; /* MASK false: no window, no cap (registers of the plain kernel) */
    /* query tiles that see the tile's keys: jt .. the one holding query j0 + 63 + W - 1 (window) */
    const int64_t iend = W > 0 && (j0 + AM_ROWS - 2 + W) / AM_ROWS + 1 < nT ? (j0 + AM_ROWS - 2 + W) / AM_ROWS + 1 : nT;
    const int64_t cnt = iend - jt, total = group * cnt; /* steps: (query head, query tile in [jt, iend)) */
    const bool cap = MASK && cout > 0.0f;
    am_load_pair<D, LD>(Ks, k, v, b, j0, kvh, T, rk, rk); /* Ks, Vs */
    /* step n = (query head h, query tile it in [jt, iend)), it fastest; (hn, itn) is step n + 1 */
    int64_t h = kvh * group, it = jt, hn = it + 1 < iend ? h : h + 1, itn = it + 1 < iend ? it + 1 : jt;
    am_dkv_issue<D, LD>(QG, LDl, h, j0, q, dout, lse, delta, b, T, H, rq);
    float ak[1][D / 8][4], av[1][D / 8][4];
    am_zero<1, D / 8>(ak);
    am_zero<1, D / 8>(av);
    for (int64_t n = 0; n < total; n++) {
        const int64_t i0 = it * AM_ROWS;
        const bool diag = it == jt;
        const int lim = T - i0 < AM_ROWS ? (int)(T - i0) : AM_ROWS; /* queries < T */
        const bool win = W > 0 && i0 + AM_ROWS - 1 - j0 >= W;      /* some query past some key's window */
        const int wo = win ? (int)(i0 - j0 - W) : 0; /* query c of key kc is past its window: c - kc + wo >= 0 */
        const int st = (int)(n & 1);
        const am_bf16 *Qs = QG + st * STAGE, *Gs = Qs + AM_ROWS * LD;
        const float *Ls = LDl + st * 2 * AM_ROWS, *Dl = Ls + AM_ROWS;
        if (n + 1 < total) {
            const int ns = (int)((n + 1) & 1);
            am_dkv_issue<D, LD>(QG + ns * STAGE, LDl + ns * 2 * AM_ROWS, hn, itn * AM_ROWS, q, dout, lse, delta, b,
                                T, H, rq);
            am_wait<1>();
        } else {
            am_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int hh = 0; hh < NH; hh++) {
            const int c0 = hh * 8 * NT; /* first query of this chunk in the tile */
            if (diag && c0 + 8 * NT - 1 < 16 * w) continue; /* every query before this warp's keys */
            float s[1][NT][4], dp[1][NT][4];
            am_zero<1, NT>(s);
            am_zero<1, NT>(dp);
            am_gemm_nt<D, LD, 1, NT>(s, Ks, 16 * w, Qs, c0, lane);
            am_gemm_nt<D, LD, 1, NT>(dp, Vs, 16 * w, Gs, c0, lane);
            if (cap) am_cap<NT>(s[0], cin, cout);
            /* query tq = i0 + c >= key, tq < T and tq < key + W: only the diagonal tile, the last one and
             * those reaching past a window compare */
            if (diag || lim < AM_ROWS || win)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int ce = c0 + nt * 8 + 2 * t4 + (e & 1), kc = 16 * w + g + (e < 2 ? 0 : 8);
                        if ((diag && ce < kc) || ce >= lim || (win && ce - kc + wo >= 0)) s[0][nt][e] = -INFINITY;
                    }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int c = c0 + nt * 8 + 2 * t4;
                const float2 lc = *(const float2 *)(Ls + c), dc = *(const float2 *)(Dl + c);
#pragma unroll
                for (int e = 0; e < 4; e++) { /* exp2(-inf) = 0 where masked */
                    const float p = am_exp2(fmaf(s[0][nt][e], sl2, -(e & 1 ? lc.y : lc.x)));
                    float ds = p * (dp[0][nt][e] - (e & 1 ? dc.y : dc.x));
                    if (cap) { /* d capped / d raw = 1 - tanh^2 (masked: p = 0, s = -inf) */
                        const float th = s[0][nt][e] * cin;
                        ds *= p > 0.0f ? 1.0f - th * th : 0.0f;
                    }
                    s[0][nt][e] = p;
                    dp[0][nt][e] = ds;
                }
            }
            am_gemm_pv<D, LD, SPLIT, 1, NT / 2>(av, s, Gs + c0 * LD, lane);
            am_gemm_pv<D, LD, SPLIT, 1, NT / 2>(ak, dp, Qs + c0 * LD, lane);
        }
        __syncthreads(); /* this stage is consumed */
        h = hn, it = itn;
        if (++itn == iend) itn = jt, hn++;
    }
    am_store<D>(dk, ak[0], scale, scale, b, keyA, kvh, T, rk, t4);
    am_store<D>(dv, av[0], 1.0f, 1.0f, b, keyA, kvh, T, rk, t4);
}

/* ---- launchers --------------------------------------------------------------------------------
 * dw_attn_mode (attn_mma.h) is the one reader of DW_ATTN. am_tiles: forward rows per block / 64 (SUB),
 * dQ rows per block / 64, dK/dV query chunks per tile
 * (NH), 1 or 2 each, D = 64 only, from DW_ATTN_TILES="F,Q,K" (an experiment knob; default 1,1,1,
 * the fastest measured at the GPT-2 and llama-1b shapes: bench/RESULTS.md). */
static int am_mode_cfg = -1; /* -1: not read yet */
int dw_attn_mode_parse(const char *v) {
    return !v || !*v || !strcmp(v, "auto") ? DW_ATTN_AUTO
           : !strcmp(v, "ref")             ? DW_ATTN_REF
           : !strcmp(v, "nosplit")         ? DW_ATTN_NOSPLIT
           : !strcmp(v, "mma")             ? DW_ATTN_MMA
           : !strcmp(v, "cudnn")           ? DW_ATTN_CUDNN
                                           : DW_ATTN_AUTO;
}
void dw_attn_mode_set(int mode) { am_mode_cfg = mode; }
int dw_attn_mode(void) {
    if (am_mode_cfg < 0) am_mode_cfg = dw_attn_mode_parse(dw_env("DW_ATTN"));
    return am_mode_cfg;
}
static int am_tiles_cfg[3] = {0, 0, 0}; /* 0: not read yet */
static const int *am_tiles(void) {
    if (!am_tiles_cfg[0]) {
        int f = 1, qd = 1, kv = 1;
        const char *env = dw_env("DW_ATTN_TILES");
        if (env && sscanf(env, "%d,%d,%d", &f, &qd, &kv) != 3) f = qd = kv = 1;
        am_tiles_cfg[0] = f == 2 ? 2 : 1, am_tiles_cfg[1] = qd == 2 ? 2 : 1, am_tiles_cfg[2] = kv == 2 ? 2 : 1;
    }
    return am_tiles_cfg;
}

/* The launchers' mask: a window of W keys (0: none) and the cap's factors (am_cap; cout 0: no cap). */
typedef struct {
    int64_t W;
    float cin, cout;
} am_mask;

template <int D, bool SPLIT, int SUB>
static cudaError_t am_fwd_launch(void *out, float *lse, const void *q, const void *k, const void *v, int64_t B,
                                 int64_t T, int64_t H, int64_t Hkv, int64_t rq, int64_t rk, am_mask mk,
                                 cudaStream_t s) {
    const size_t tile = AM_ROWS * (D + 8) * sizeof(am_bf16), smem = (SUB + 4) * tile;
    cudaError_t e =
        cudaFuncSetAttribute(am_fwd_kernel<D, SPLIT, SUB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const int64_t BM = AM_ROWS * SUB;
    const dim3 grid((unsigned)((T + BM - 1) / BM), (unsigned)H, (unsigned)B);
    const float sl2 = (float)(1.0 / sqrt((double)D)) * AM_LOG2E;
    am_fwd_kernel<D, SPLIT, SUB><<<grid, AM_THREADS, smem, s>>>((am_bf16 *)out, lse, (const am_bf16 *)q,
                                                               (const am_bf16 *)k, (const am_bf16 *)v, T, H, Hkv,
                                                               rq, rk, sl2, mk.W, mk.cin, mk.cout);
    return cudaGetLastError();
}

template <int D, bool SPLIT, int SUB, int NH>
static cudaError_t am_bwd_dq_launch(void *dq, float *delta, const void *dout, const void *out, const void *q,
                                    const void *k, const void *v, const float *lse, int64_t B, int64_t T, int64_t H,
                                    int64_t Hkv, int64_t rq, int64_t rk, am_mask mk, cudaStream_t s) {
    const int64_t BM = AM_ROWS * SUB;
    const size_t tile = AM_ROWS * (D + 8) * sizeof(am_bf16), smem = (2 * SUB + 4) * tile + BM * sizeof(float);
    cudaError_t e = cudaFuncSetAttribute(am_bwd_dq_kernel<D, SPLIT, SUB, NH>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const float scale = (float)(1.0 / sqrt((double)D)), sl2 = scale * AM_LOG2E;
    am_bwd_dq_kernel<D, SPLIT, SUB, NH><<<dim3((unsigned)((T + BM - 1) / BM), (unsigned)H, (unsigned)B),
                                          AM_THREADS, smem, s>>>(
        (am_bf16 *)dq, delta, (const am_bf16 *)dout, (const am_bf16 *)out, (const am_bf16 *)q, (const am_bf16 *)k,
        (const am_bf16 *)v, lse, T, H, Hkv, rq, rk, sl2, scale, mk.W, mk.cin, mk.cout);
    return cudaGetLastError();
}

template <int D, bool SPLIT, int NH>
static cudaError_t am_bwd_dkv_launch(void *dk, void *dv, const void *dout, const void *q, const void *k,
                                     const void *v, const float *lse, const float *delta, int64_t B, int64_t T,
                                     int64_t H, int64_t Hkv, int64_t rq, int64_t rk, am_mask mk, cudaStream_t s) {
    const size_t tile = AM_ROWS * (D + 8) * sizeof(am_bf16), smem = 6 * tile + 2 * 2 * AM_ROWS * sizeof(float);
    const bool masked = mk.W > 0 || mk.cout > 0.0f;
    cudaError_t e = cudaFuncSetAttribute(masked ? am_bwd_dkv_kernel<D, SPLIT, NH, true> : am_bwd_dkv_kernel<D, SPLIT, NH, false>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const float scale = (float)(1.0 / sqrt((double)D)), sl2 = scale * AM_LOG2E;
    const dim3 grid((unsigned)((T + AM_ROWS - 1) / AM_ROWS), (unsigned)Hkv, (unsigned)B);
    if (masked)
        am_bwd_dkv_kernel<D, SPLIT, NH, true><<<grid, AM_THREADS, smem, s>>>(
            (am_bf16 *)dk, (am_bf16 *)dv, (const am_bf16 *)dout, (const am_bf16 *)q, (const am_bf16 *)k,
            (const am_bf16 *)v, lse, delta, T, H, Hkv, rq, rk, sl2, scale, mk.W, mk.cin, mk.cout);
    else
        am_bwd_dkv_kernel<D, SPLIT, NH, false><<<grid, AM_THREADS, smem, s>>>(
            (am_bf16 *)dk, (am_bf16 *)dv, (const am_bf16 *)dout, (const am_bf16 *)q, (const am_bf16 *)k,
            (const am_bf16 *)v, lse, delta, T, H, Hkv, rq, rk, sl2, scale, 0, 0.0f, 0.0f);
    return cudaGetLastError();
}

/* D = 128 keeps the 64-row, single-chunk kernels (its register budget has no room for more). */
template <int D, bool SPLIT>
static cudaError_t am_fwd_pick(void *out, float *lse, const void *q, const void *k, const void *v, int64_t B,
                               int64_t T, int64_t H, int64_t Hkv, int64_t rq, int64_t rk, am_mask mk,
                               cudaStream_t s) {
    if constexpr (D == 64)
        if (am_tiles()[0] == 2) return am_fwd_launch<D, SPLIT, 2>(out, lse, q, k, v, B, T, H, Hkv, rq, rk, mk, s);
    return am_fwd_launch<D, SPLIT, 1>(out, lse, q, k, v, B, T, H, Hkv, rq, rk, mk, s);
}
template <int D, bool SPLIT>
static cudaError_t am_bwd_pick(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                               const void *v, const void *out, const float *lse, float *delta, int64_t B, int64_t T,
                               int64_t H, int64_t Hkv, int64_t rq, int64_t rk, am_mask mk, cudaStream_t s) {
    cudaError_t e = cudaSuccess;
    if constexpr (D == 64) {
        e = am_tiles()[1] == 2
                ? am_bwd_dq_launch<D, SPLIT, 2, 2>(dq, delta, dout, out, q, k, v, lse, B, T, H, Hkv, rq, rk, mk, s)
                : am_bwd_dq_launch<D, SPLIT, 1, 1>(dq, delta, dout, out, q, k, v, lse, B, T, H, Hkv, rq, rk, mk, s);
        if (e != cudaSuccess) return e;
        return am_tiles()[2] == 2
                   ? am_bwd_dkv_launch<D, SPLIT, 2>(dk, dv, dout, q, k, v, lse, delta, B, T, H, Hkv, rq, rk, mk, s)
                   : am_bwd_dkv_launch<D, SPLIT, 1>(dk, dv, dout, q, k, v, lse, delta, B, T, H, Hkv, rq, rk, mk, s);
    }
    e = am_bwd_dq_launch<D, SPLIT, 1, 1>(dq, delta, dout, out, q, k, v, lse, B, T, H, Hkv, rq, rk, mk, s);
    if (e != cudaSuccess) return e;
    return am_bwd_dkv_launch<D, SPLIT, 1>(dk, dv, dout, q, k, v, lse, delta, B, T, H, Hkv, rq, rk, mk, s);
}

bool dw_attn_mma_eligible(int64_t D, const void *const *ptrs, int n) {
    if (dw_attn_mode() == DW_ATTN_REF || (D != 64 && D != 128)) return false;
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ptrs[i] % 16) return false;
    return true;
}

/* The mask of a window W (one of at least T is none) and a cap (0: none) for head dimension D. */
static am_mask am_mask_of(int64_t T, int64_t D, int64_t W, float cap) {
    const double scale = 1.0 / sqrt((double)D);
    am_mask mk = {W > 0 && W < T ? W : 0, 0.0f, 0.0f};
    if (cap > 0.0f) mk.cin = (float)(scale / cap), mk.cout = (float)(cap / scale);
    return mk;
}

cudaError_t dw_attn_mma_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int64_t B,
                            int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t rq, int64_t rk, int64_t W, float cap,
                            cudaStream_t s) {
    const bool split = dw_attn_mode() != DW_ATTN_NOSPLIT;
    const am_mask mk = am_mask_of(T, D, W, cap);
    return D == 64
               ? (split ? am_fwd_pick<64, true> : am_fwd_pick<64, false>)(out, lse, q, k, v, B, T, H, Hkv, rq, rk, mk, s)
               : (split ? am_fwd_pick<128, true> : am_fwd_pick<128, false>)(out, lse, q, k, v, B, T, H, Hkv, rq, rk, mk,
                                                                            s);
}

cudaError_t dw_attn_mma_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                            const void *v, const void *out, const float *lse, float *delta, int64_t B, int64_t T,
                            int64_t H, int64_t Hkv, int64_t D, int64_t rq, int64_t rk, int64_t W, float cap,
                            cudaStream_t s) {
    const bool split = dw_attn_mode() != DW_ATTN_NOSPLIT;
    const am_mask mk = am_mask_of(T, D, W, cap);
    return D == 64 ? (split ? am_bwd_pick<64, true> : am_bwd_pick<64, false>)(dq, dk, dv, dout, q, k, v, out, lse,
                                                                            delta, B, T, H, Hkv, rq, rk, mk, s)
                   : (split ? am_bwd_pick<128, true> : am_bwd_pick<128, false>)(dq, dk, dv, dout, q, k, v, out, lse,
                                                                              delta, B, T, H, Hkv, rq, rk, mk, s);
}
