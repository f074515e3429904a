/* swiglu_bwd_fp8.cu — the SwiGLU backward that writes its two gradients as the fp8_block operands
 * of the gate and up layers' backward (ops_cuda.h: dw_cuda_swiglu_bwd_fp8) instead of BF16: for
 * each of dgate and dup, the 1x128 rows their dgrad reads and the 128x1 blocks along the tokens
 * their wgrad reads (dy^T), the codes and scales dw_quantize_cuda writes for the BF16 gradients,
 * bit for bit (tests/gpu/test_swiglu_bwd_fp8.c). Without it the SwiGLU writes both gradients and
 * each layer reads its own back to quantise it: 8 bytes an element of traffic saved.
 * One CTA a 128x128 tile of [tokens, features]: pass 1, a half-warp per token row, computes the
 * gradients in act_math.cuh's arithmetic (ops_act.cu's), rounds them to BF16, writes their row
 * codes and keeps the BF16 values in shared memory; pass 2, a thread per feature column of one
 * gradient, takes the column's amax and encodes its 128 codes along the tokens, which leave
 * through shared memory as whole 128-byte rows of dy^T. Scales and
 * encodings are quant_common.cuh's; with counters, each copy's elements are counted as the
 * quantisers count (precision/quant_counts.cuh), both copies of a gradient into one counter. */
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/act_math.cuh"
#include "kernels/cuda/quant_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace {

constexpr int TILE = 128, THREADS = 256, ROWS = THREADS / 16;
constexpr size_t SMEM = 2 * TILE * TILE * sizeof(dw_bf16); /* dgate's and dup's BF16 tile */

struct GradOut { /* one gradient's two copies */
    uint8_t *codes, *codes_t;
    float *scales, *scales_t;
    unsigned long long *cnt;
};

/* dout, gate, up [N, F]; N and F multiples of 128; a 1-D grid of (N/128) (F/128) tiles, the
 * feature tiles of a token block in a row (flush's CTA 0 adds the elements once). */
template <bool CNT>
__global__ void __launch_bounds__(THREADS)
    swiglu_bwd_fp8_kernel(const dw_bf16 *__restrict__ dout, const dw_bf16 *__restrict__ gate,
                          const dw_bf16 *__restrict__ up, int64_t N, int64_t F, GradOut g0, GradOut g1) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    dw_bf16(*tile)[TILE][TILE] = reinterpret_cast<dw_bf16(*)[TILE][TILE]>(smem_raw);
    const int tid = threadIdx.x, half = tid >> 4, l = tid & 15;
    const int64_t tf = (int64_t)blockIdx.x % (F / TILE), tn = (int64_t)blockIdx.x / (F / TILE);
    const int64_t n0 = tn * TILE, f0 = tf * TILE;
    const GradOut go[2] = {g0, g1};
    dwqc::Acc acc[2] = {};
    constexpr dwqc::Fmt fmt{8, false};
    /* pass 1: rows n0 + half + ROWS i, features f0 + 8 l .. + 7; the next row's loads issued
     * before this one's arithmetic */
    const dw_bf16 *src[3] = {gate, dout, up};
    dw_bf16x8 raw[3], next[3];
#pragma unroll
    for (int a = 0; a < 3; a++) raw[a] = *reinterpret_cast<const dw_bf16x8 *>(src[a] + (n0 + half) * F + f0 + 8 * l);
    for (int i = 0; i < TILE / ROWS; i++) {
        const int r = half + ROWS * i;
        const int64_t at = (n0 + r) * F + f0 + 8 * l;
        if (i + 1 < TILE / ROWS)
#pragma unroll
            for (int a = 0; a < 3; a++) next[a] = *reinterpret_cast<const dw_bf16x8 *>(src[a] + at + (int64_t)ROWS * F);
        float v[2][8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float da, db;
            dw_ew_df<DW_EW_SWIGLU>(__bfloat162float(raw[0].v[k]), __bfloat162float(raw[1].v[k]),
                                   __bfloat162float(raw[2].v[k]), da, db);
            v[0][k] = __bfloat162float(__float2bfloat16_rn(da));
            v[1][k] = __bfloat162float(__float2bfloat16_rn(db));
        }
#pragma unroll
        for (int t = 0; t < 2; t++) {
            const uint32_t am = dwq::chunk_amax<TILE>(v[t]); /* the half-warp's row */
            const float s = dw_rule_fp8_scale(am, false);
            uint32_t w[2];
            dwq::encode8<dwq::F_E4M3>(dwq::fp8_q(s), v[t], w);
            *reinterpret_cast<uint2 *>(go[t].codes + at) = make_uint2(w[0], w[1]);
            if (l == 0) go[t].scales[(n0 + r) * (F / TILE) + tf] = s;
            if constexpr (CNT) dwqc::test_n<8>(fmt, false, v[t], w, s, 1.0f, acc[t]);
            dw_bf16x8 b;
#pragma unroll
            for (int k = 0; k < 8; k++) b.v[k] = __float2bfloat16_rn(v[t][k]); /* exact: BF16 values */
            *reinterpret_cast<dw_bf16x8 *>(&tile[t][r][8 * l]) = b;
        }
#pragma unroll
        for (int a = 0; a < 3; a++) raw[a] = next[a];
    }
    __syncthreads();
    /* pass 2: gradient t's feature column c over the tile's 128 tokens (a warp: 32 columns of one
     * gradient, so a row of the tile is read as 64 consecutive bytes); its 128 codes in registers */
    const int t = tid / TILE, c = tid % TILE;
    uint32_t am = 0;
    for (int r = 0; r < TILE; r++) am = max(am, dwq::abs_bits(__bfloat162float(tile[t][r][c])));
    const float s = dw_rule_fp8_scale(am, false);
    const dwq::Q q = dwq::fp8_q(s);
    uint32_t w[TILE / 4];
#pragma unroll
    for (int j = 0; j < TILE / 16; j++) {
        float v[16];
#pragma unroll
        for (int k = 0; k < 16; k++) v[k] = __bfloat162float(tile[t][16 * j + k][c]);
        dwq::encode8<dwq::F_E4M3>(q, v, w + 4 * j);
        dwq::encode8<dwq::F_E4M3>(q, v + 8, w + 4 * j + 2);
        if constexpr (CNT) dwqc::test_n<16>(fmt, false, v, w + 4 * j, s, 1.0f, acc[t]);
    }
    go[t].scales_t[(f0 + c) * (N / TILE) + tn] = s;
    /* the codes leave through shared memory (over the tile, once everyone has read it) as whole
     * 128-byte rows of dy^T: stage[t][c] is column c's codes, its 16-byte pieces swizzled (piece j
     * at j ^ (c & 7)) so that neither the writes nor the reads meet in a bank */
    __syncthreads();
    uint8_t(*stage)[TILE][TILE] = reinterpret_cast<uint8_t(*)[TILE][TILE]>(smem_raw);
#pragma unroll
    for (int j = 0; j < TILE / 16; j++)
        *reinterpret_cast<uint4 *>(&stage[t][c][16 * (j ^ (c & 7))]) =
            make_uint4(w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 2 * TILE * (TILE / 16) / THREADS; k++) { /* 8 lanes a row */
        const int p = tid + THREADS * k, rt = p / (TILE / 16) / TILE, rc = p / (TILE / 16) % TILE, j = p % (TILE / 16);
        uint8_t *dst = (rt ? g1.codes_t : g0.codes_t) + (f0 + rc) * N + n0 + 16 * j;
        *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(&stage[rt][rc][16 * (j ^ (rc & 7))]);
    }
    if constexpr (CNT) { /* both copies of gradient t into go[t].cnt */
        __shared__ unsigned long long qsh[4 * (THREADS / 32)];
        unsigned long long *const pairs[2] = {g0.cnt, g1.cnt};
        dwqc::flush<THREADS / 32>(acc, pairs, (unsigned long long)(2 * N * F), qsh, tid >> 5, tid & 31,
                                  [] { __syncthreads(); });
    }
}

template <bool CNT>
dw_status launch(dw_ctx *ctx, const void *dout, const void *gate, const void *up, int64_t rows, int64_t cols,
                 const GradOut (&o)[2], cudaStream_t st) {
    DW_CUDA_CHECK(ctx, cudaFuncSetAttribute(swiglu_bwd_fp8_kernel<CNT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)SMEM));
    swiglu_bwd_fp8_kernel<CNT><<<(unsigned)(rows / TILE * (cols / TILE)), THREADS, SMEM, st>>>(
        (const dw_bf16 *)dout, (const dw_bf16 *)gate, (const dw_bf16 *)up, rows, cols, o[0], o[1]);
    return DW_OK;
}

} // namespace

extern "C" dw_status dw_cuda_swiglu_bwd_fp8(dw_ctx *ctx, const void *dout, const void *gate, const void *up, int64_t rows,
                                           int64_t cols, const dw_cuda_fp8_grad *dgate, const dw_cuda_fp8_grad *dup,
                                           void *stream) {
    const char *op = "swiglu_bwd_fp8";
    DW_OPS_REQUIRE(ctx, op, rows >= 0 && cols >= 0 && rows % TILE == 0 && cols % TILE == 0);
    if (rows == 0 || cols == 0) return DW_OK;
    DW_OPS_REQUIRE(ctx, op, dout && gate && up && dgate && dup);
    DW_OPS_REQUIRE(ctx, op, dw_aligned16(dout) && dw_aligned16(gate) && dw_aligned16(up));
    const dw_cuda_fp8_grad *g[2] = {dgate, dup};
    GradOut o[2];
    for (int t = 0; t < 2; t++) {
        DW_OPS_REQUIRE(ctx, op, g[t]->codes && g[t]->codes_t && g[t]->scales && g[t]->scales_t);
        DW_OPS_REQUIRE(ctx, op, ((uintptr_t)g[t]->codes & 7u) == 0 && ((uintptr_t)g[t]->codes_t & 15u) == 0 &&
                                    ((uintptr_t)g[t]->scales & 3u) == 0 && ((uintptr_t)g[t]->scales_t & 3u) == 0);
        o[t] = GradOut{g[t]->codes, g[t]->codes_t, g[t]->scales, g[t]->scales_t, (unsigned long long *)g[t]->counts};
    }
    DW_OPS_REQUIRE(ctx, op, !o[0].cnt == !o[1].cnt); /* both counted or neither */
    DW_OPS_REQUIRE(ctx, op, rows / TILE * (cols / TILE) <= 0x7FFFFFFF);
    DW_TRY(o[0].cnt ? launch<true>(ctx, dout, gate, up, rows, cols, o, (cudaStream_t)stream)
                    : launch<false>(ctx, dout, gate, up, rows, cols, o, (cudaStream_t)stream));
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

