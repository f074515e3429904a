/* quant_adamw.cu — AdamW over a MoE layer's expert weights that also refreshes their fp8_block
 * cache in the same pass (adamw_cuda.h dw_cuda_adamw_quant): a CTA per 128x128 block of one
 * expert's [m, k] masters updates the block (adamw_step.cuh: the flat step's bits), takes its amax
 * and writes its codes row-wise and, through shared memory, transposed, with the block's scale in
 * both scale tables (quant_common.cuh's rule and encoder: quant_kernels.cuh's bits). The codes are made from
 * the masters read back (L2-resident: the block just wrote them), so no register holds the block.
 * The separate refresh read every master again from HBM: 7.9 ms of moe-e8's fp8_block step. */
#include <cuda_runtime.h>

#include "kernels/cuda/adamw_cuda.h"
#include "kernels/cuda/adamw_step.cuh"
#include "kernels/cuda/quant_common.cuh"

using namespace dwq;

#define QA_THREADS 256 /* 8 warps: a pass covers 8 rows of the block, a lane 4 columns */
#define QA_ROW_WORDS 33 /* the shared tile's row: 128 code bytes and one word of padding */

#define QA_AHEAD 4 /* rows a warp loads before it steps them: 16 loads of 16 bytes in flight a thread */

static __global__ void __launch_bounds__(QA_THREADS, 2)
aw_quant_kernel(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m, float *__restrict__ v,
                int64_t n_decay, const double *norm, const dw_adamw_args *ap, dw_adamw_quant_job j) {
    __shared__ uint32_t tile[TILE * QA_ROW_WORDS];
    __shared__ uint32_t red[QA_THREADS / 32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t tm_n = j.m / TILE, tk_n = j.k / TILE, per = tm_n * tk_n;
    const int64_t e = blockIdx.x / per, tm = blockIdx.x % per / tk_n, tk = blockIdx.x % tk_n;
    const double nrm = *norm;
    const dw_adamw_args a = *ap;
    const bool step = isfinite(nrm);
    const double scale = step ? aw_scale(nrm, a) : 1.0;
    const int64_t expert = e * j.m * j.k, at = (tm * TILE) * j.k + tk * TILE + 4 * lane; /* row 0, this lane */
    uint32_t am = 0;
    for (int ps0 = 0; ps0 < TILE / 8; ps0 += QA_AHEAD) { /* the step, rows 8 ps + w, QA_AHEAD at a time */
        float4 pp[QA_AHEAD], gg[QA_AHEAD], mm[QA_AHEAD], vv[QA_AHEAD];
#pragma unroll
        for (int r = 0; r < QA_AHEAD; r++) {
            const int64_t i = j.off + expert + at + (int64_t)(8 * (ps0 + r) + w) * j.k;
            pp[r] = *reinterpret_cast<const float4 *>(p + i);
            if (step) {
                gg[r] = *reinterpret_cast<const float4 *>(g + i);
                mm[r] = *reinterpret_cast<const float4 *>(m + i), vv[r] = *reinterpret_cast<const float4 *>(v + i);
            }
        }
#pragma unroll
        for (int r = 0; r < QA_AHEAD; r++) {
            const int64_t i = j.off + expert + at + (int64_t)(8 * (ps0 + r) + w) * j.k;
            if (step) {
                aw_one(pp[r].x, gg[r].x, mm[r].x, vv[r].x, i < n_decay ? a.weight_decay : 0.0, scale, a);
                aw_one(pp[r].y, gg[r].y, mm[r].y, vv[r].y, i + 1 < n_decay ? a.weight_decay : 0.0, scale, a);
                aw_one(pp[r].z, gg[r].z, mm[r].z, vv[r].z, i + 2 < n_decay ? a.weight_decay : 0.0, scale, a);
                aw_one(pp[r].w, gg[r].w, mm[r].w, vv[r].w, i + 3 < n_decay ? a.weight_decay : 0.0, scale, a);
                *reinterpret_cast<float4 *>(p + i) = pp[r];
                *reinterpret_cast<float4 *>(m + i) = mm[r];
                *reinterpret_cast<float4 *>(v + i) = vv[r];
            }
            am = max(max(am, max(abs_bits(pp[r].x), abs_bits(pp[r].y))), max(abs_bits(pp[r].z), abs_bits(pp[r].w)));
        }
    }
    am = group_max<32>(am);
    if (lane == 0) red[w] = am;
    __syncthreads();
    am = red[0];
#pragma unroll
    for (int k = 1; k < QA_THREADS / 32; k++) am = max(am, red[k]);
    const float s = dw_rule_fp8_scale(am, false); /* the block's scale, as fp8_block2d's quantiser */
    const Q q = fp8_q(s);
    if (threadIdx.x == 0) {
        j.scales[e * per + tm * tk_n + tk] = s;
        j.scales_t[e * per + tk * tm_n + tm] = s;
    }
    float4 pv[TILE / 8]; /* this thread's updated masters, read back (L2) all at once */
#pragma unroll
    for (int ps = 0; ps < TILE / 8; ps++)
        pv[ps] = *reinterpret_cast<const float4 *>(p + j.off + expert + at + (int64_t)(8 * ps + w) * j.k);
#pragma unroll
    for (int ps = 0; ps < TILE / 8; ps++) { /* W's codes */
        const int r = 8 * ps + w;
        const float vals[4] = {pv[ps].x, pv[ps].y, pv[ps].z, pv[ps].w};
        uint32_t word;
        encode_n<F_E4M3, 4>(q, vals, &word);
        *reinterpret_cast<uint32_t *>(j.codes + expert + at + (int64_t)r * j.k) = word;
        tile[r * QA_ROW_WORDS + lane] = word;
    }
    __syncthreads();
    /* W^T's row tk*128 + c (column c of the block), half `half` of its 128 bytes: 64 codes */
    const int c = threadIdx.x >> 1, half = threadIdx.x & 1, sh = 8 * (c & 3);
    uint32_t out[16];
#pragma unroll
    for (int q4 = 0; q4 < 16; q4++) {
        uint32_t word = 0;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const int r = 64 * half + 4 * q4 + b;
            word |= ((tile[r * QA_ROW_WORDS + (c >> 2)] >> sh) & 0xFFu) << (8 * b);
        }
        out[q4] = word;
    }
    uint4 *dst = reinterpret_cast<uint4 *>(j.codes_t + expert + (tk * TILE + c) * j.m + tm * TILE + 64 * half);
#pragma unroll
    for (int k = 0; k < 4; k++) dst[k] = make_uint4(out[4 * k], out[4 * k + 1], out[4 * k + 2], out[4 * k + 3]);
}

extern "C" dw_status dw_cuda_adamw_quant(dw_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n_decay,
                                         const double *norm, const dw_adamw_args *a, const dw_adamw_quant_job *jobs,
                                         int n_jobs, void *stream) {
    for (int k = 0; k < n_jobs; k++) {
        const dw_adamw_quant_job *j = &jobs[k];
        if (j->experts < 1 || j->m % TILE || j->k % TILE || j->off % 4 || ((uintptr_t)j->codes & 15) ||
            ((uintptr_t)j->codes_t & 15) || !j->scales || !j->scales_t)
            return dw_set_error(ctx, DW_ERR_INVALID, "adamw with the fp8_block weight cache: job %d needs experts >= 1, "
                                "m and k multiples of 128 (%lld, %lld), a 16-byte aligned pool offset and codes", k,
                                (long long)j->m, (long long)j->k);
        const int64_t blocks = j->experts * (j->m / TILE) * (j->k / TILE);
        if (blocks > 0x7FFFFFFF)
            return dw_set_error(ctx, DW_ERR_INVALID, "adamw with the fp8_block weight cache: %lld blocks", (long long)blocks);
        aw_quant_kernel<<<(unsigned)blocks, QA_THREADS, 0, (cudaStream_t)stream>>>(p, g, m, v, n_decay, norm, a, *j);
        DW_CUDA_CHECK_LAUNCH(ctx, "adamw with the fp8_block weight cache");
    }
    return DW_OK;
}
