/* ops_nvfp4.cu — the NVFP4 training recipe's quantiser on the GPU (nvfp4_cuda.h): an amax pass over
 * the view (x or x^T, Hadamard-transformed per whole 1x16 block), a one-block reduction into
 * s_t, then one thread per block of 16 (or 16x16) computing the block scale and the codes with
 * formats/nvfp4_rules.h — the same FP32 operations as the CPU reference, so the same bits
 * (Philox counters from the view's element index). Transposed views map consecutive threads to
 * consecutive x columns, so their loads coalesce. Simple and exact, not tuned. */
#include "kernels/cuda/ops_common.cuh"

extern "C" {
#include "kernels/cuda/nvfp4_cuda.h"
}

#define DW_NV_THREADS 256
#define DW_NV_AMAX_BLOCKS DW_NVFP4_CUDA_AMAX_BLOCKS /* partial maxima; the amax kernel strides over the rest */

typedef struct {
    int64_t rows, cols; /* x */
    int64_t R, C;       /* the view */
    int64_t nb;         /* blocks of 16 per view row: ceil(C / 16) */
    bool trans, rht, sr;
    uint32_t signs, stream, step;
    uint64_t seed;
} dw_nv_args;

/* Loads view row i, columns [j0, j0 + n) into v (n <= 16), transformed when the block is whole. */
template <typename T>
static __device__ __forceinline__ int dw_nv_load(const T *x, const dw_nv_args &a, int64_t i, int64_t j0, float v[16]) {
    const int n = (int)(a.C - j0 < 16 ? a.C - j0 : 16);
    for (int t = 0; t < 16; t++)
        v[t] = t < n ? dw_ld(x, a.trans ? (j0 + t) * a.cols + i : i * a.cols + j0 + t) : 0.0f;
    if (a.rht && n == 16) dw_nvfp4_rht16(v, a.signs);
    return n;
}

/* Block k of the view's 1x16 blocks: transposed views walk i fastest (coalesced x columns). */
static __device__ __forceinline__ void dw_nv_block(const dw_nv_args &a, int64_t k, int64_t *i, int64_t *j0) {
    if (a.trans) *i = k % a.R, *j0 = k / a.R * 16;
    else *i = k / a.nb, *j0 = k % a.nb * 16;
}

static __device__ __forceinline__ uint32_t dw_nv_absmax(uint32_t m, float v) {
    uint32_t u = dw_rule_f2u(v) & 0x7FFFFFFFu;
    return u > m ? u : m;
}

/* partial[blockIdx.x] = max |view| bits over this CTA's blocks. */
template <typename T>
static __global__ void __launch_bounds__(DW_NV_THREADS) dw_nv_amax_kernel(const T *x, dw_nv_args a, uint32_t *partial) {
    __shared__ uint32_t red[DW_NV_THREADS];
    uint32_t m = 0;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < a.R * a.nb; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t i, j0;
        dw_nv_block(a, k, &i, &j0);
        float v[16];
        const int n = dw_nv_load(x, a, i, j0, v);
        for (int t = 0; t < n; t++) m = dw_nv_absmax(m, v[t]);
    }
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = DW_NV_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s && red[threadIdx.x + s] > red[threadIdx.x]) red[threadIdx.x] = red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = red[0];
}

/* *st = the NVFP4 tensor scale of max(partial[0..n)); *step = the SR step: st's bits (from_scale)
 * or `fixed`. One CTA. */
static __global__ void __launch_bounds__(DW_NV_THREADS)
dw_nv_tscale_kernel(const uint32_t *partial, int n, float *st, bool from_scale, uint32_t fixed, uint32_t *step) {
    __shared__ uint32_t red[DW_NV_THREADS];
    uint32_t m = 0;
    for (int k = threadIdx.x; k < n; k += blockDim.x) m = partial[k] > m ? partial[k] : m;
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = DW_NV_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s && red[threadIdx.x + s] > red[threadIdx.x]) red[threadIdx.x] = red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float t = dw_rule_nvfp4_tensor_scale(red[0]);
        *st = t;
        *step = from_scale ? dw_rule_f2u(t) : fixed;
    }
}

/* Codes of view row i, columns [j0, j0 + n), from v, with d = decode(b) s_t; two per byte. */
static __device__ __forceinline__ void dw_nv_store(const dw_nv_args &a, const float v[16], int n, int64_t i, int64_t j0,
                                                   float d, uint8_t *codes) {
    const int64_t rb = (a.C + 1) / 2;
    for (int t = 0; t < n; t += 2) {
        uint32_t c[2] = {0u, 0u};
        for (int h = 0; h < 2 && t + h < n; h++) {
            const uint64_t idx = (uint64_t)(i * a.C + j0 + t + h);
            const uint32_t bits = a.sr ? dw_nvfp4_sr_bits(a.seed, a.stream, a.step, idx) : 0u;
            c[h] = dw_nvfp4_elem_code(v[t + h], d, a.sr, bits);
        }
        codes[i * rb + (j0 + t) / 2] = (uint8_t)(c[0] | (c[1] << 4));
    }
}

/* 1x16 blocks: one thread per block. */
template <typename T>
static __global__ void __launch_bounds__(DW_NV_THREADS)
dw_nv_quant_kernel(const T *x, dw_nv_args a, const float *st, const uint32_t *step, uint8_t *codes, uint8_t *scales) {
    const float s_t = *st;
    a.step = *step;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < a.R * a.nb; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t i, j0;
        dw_nv_block(a, k, &i, &j0);
        float v[16];
        const int n = dw_nv_load(x, a, i, j0, v);
        uint32_t m = 0;
        for (int t = 0; t < n; t++) m = dw_nv_absmax(m, v[t]);
        float d;
        scales[i * a.nb + j0 / 16] = (uint8_t)dw_nvfp4_block_scale(m, s_t, &d);
        dw_nv_store(a, v, n, i, j0, d, codes);
    }
}

/* 16x16 blocks: one thread per block, the amax over its rows first, then row by row. */
template <typename T>
static __global__ void __launch_bounds__(DW_NV_THREADS)
dw_nv_quant2d_kernel(const T *x, dw_nv_args a, const float *st, const uint32_t *step, uint8_t *codes,
                     uint8_t *scales) {
    const float s_t = *st;
    a.step = *step;
    const int64_t rblocks = (a.R + 15) / 16;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < rblocks * a.nb; k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i0 = (a.trans ? k % rblocks : k / a.nb) * 16, j0 = (a.trans ? k / rblocks : k % a.nb) * 16;
        const int64_t i1 = i0 + 16 < a.R ? i0 + 16 : a.R;
        float v[16];
        uint32_t m = 0;
        for (int64_t i = i0; i < i1; i++) {
            const int n = dw_nv_load(x, a, i, j0, v);
            for (int t = 0; t < n; t++) m = dw_nv_absmax(m, v[t]);
        }
        float d;
        const uint8_t b = (uint8_t)dw_nvfp4_block_scale(m, s_t, &d);
        for (int64_t i = i0; i < i1; i++) {
            const int n = dw_nv_load(x, a, i, j0, v);
            scales[i * a.nb + j0 / 16] = b;
            dw_nv_store(a, v, n, i, j0, d, codes);
        }
    }
}

static unsigned dw_nv_grid(int64_t work) {
    const int64_t b = (work + DW_NV_THREADS - 1) / DW_NV_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

template <typename T>
static void dw_nv_launch(const T *x, const dw_nv_args &a, bool block2d, bool from_scale, const dw_quant_dev_out *out,
                         uint32_t *ws, cudaStream_t s) {
    const int64_t blocks = a.R * a.nb;
    const unsigned ga = dw_nv_grid(blocks) < DW_NV_AMAX_BLOCKS ? dw_nv_grid(blocks) : DW_NV_AMAX_BLOCKS;
    uint32_t *step = ws + DW_NV_AMAX_BLOCKS;
    dw_nv_amax_kernel<T><<<ga, DW_NV_THREADS, 0, s>>>(x, a, ws);
    dw_nv_tscale_kernel<<<1, DW_NV_THREADS, 0, s>>>(ws, (int)ga, out->tensor_scale, from_scale, a.step, step);
    if (block2d)
        dw_nv_quant2d_kernel<T><<<dw_nv_grid((a.R + 15) / 16 * a.nb), DW_NV_THREADS, 0, s>>>(
            x, a, out->tensor_scale, step, out->codes, (uint8_t *)out->scales);
    else
        dw_nv_quant_kernel<T><<<dw_nv_grid(blocks), DW_NV_THREADS, 0, s>>>(x, a, out->tensor_scale, step, out->codes,
                                                                           (uint8_t *)out->scales);
}

extern "C" dw_status dw_nvfp4_quantize_cuda(dw_ctx *ctx, const dw_nvfp4_qopts *o, dw_quant_in in, const void *x,
                                            int64_t rows, int64_t cols, const dw_quant_dev_out *out, void *workspace,
                                            void *stream) {
    const char *op = "nvfp4 quantize (training recipe)";
    DW_OPS_REQUIRE(ctx, op, o && out && x && workspace);
    DW_OPS_REQUIRE(ctx, op, out->codes && out->scales && out->tensor_scale && !out->scales_swizzled);
    DW_OPS_REQUIRE(ctx, op, rows > 0 && cols > 0);
    DW_OPS_REQUIRE(ctx, op, in == DW_QUANT_IN_F32 || in == DW_QUANT_IN_BF16);
    if (o->rht && o->block2d)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: the Hadamard transform (rht) runs on 1x16 blocks, not with "
                            "16x16 weight blocks (block2d)", op);
    dw_nv_args a = {rows, cols, o->trans ? cols : rows, o->trans ? rows : cols, 0, o->trans, o->rht, o->sr,
                    dw_nvfp4_rht_signs(o->seed), o->stream, o->step, o->seed};
    a.nb = (a.C + 15) / 16;
    cudaStream_t s = (cudaStream_t)stream;
    const bool from_scale = o->sr && o->step_from_scale;
    if (in == DW_QUANT_IN_F32) dw_nv_launch((const float *)x, a, o->block2d, from_scale, out, (uint32_t *)workspace, s);
    else dw_nv_launch((const dw_bf16 *)x, a, o->block2d, from_scale, out, (uint32_t *)workspace, s);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}
