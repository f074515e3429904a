/* kern.cu — the CUDA backend's glue kernels: the BF16 working copy of the FP32 master weights,
 * and splitting a packed qkv activation (GPT-2's c_attn output) into the (B,T,H,D) q, k, v the
 * attention kernels take, and merging their gradients back. Not op kernels (kernels/cuda/ops_*.cu)
 * and not the optimizer (kernels/cuda/adamw.cu). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "runtime/cuda/kern.h"

#define EK_THREADS 256

static unsigned ek_blocks(int64_t n) {
    int64_t b = (n + EK_THREADS - 1) / EK_THREADS;
    if (b > (1 << 20)) b = 1 << 20; /* grid-stride loops cover the rest */
    return (unsigned)(b > 0 ? b : 1);
}

static __global__ void ek_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* element (r, c) of the packed row: c < wq -> q, < wq + wkv -> k, else v */
template <typename E>
static __global__ void ek_qkv_kernel(E *x, E *q, E *k, E *v, int64_t N, int64_t wq, int64_t wkv,
                                     bool merge) {
    const int64_t w = wq + 2 * wkv, n = N * w;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / w, c = i % w;
        E *p = c < wq ? q + r * wq + c : c < wq + wkv ? k + r * wkv + (c - wq) : v + r * wkv + (c - wq - wkv);
        if (merge)
            x[i] = *p;
        else
            *p = x[i];
    }
}

extern "C" {

int dw_cuda_be_to_bf16(uint16_t *dst, const float *src, int64_t n, void *stream) {
    if (n <= 0) return (int)cudaSuccess;
    ek_to_bf16_kernel<<<ek_blocks(n), EK_THREADS, 0, (cudaStream_t)stream>>>((__nv_bfloat16 *)dst, src, n);
    return (int)cudaGetLastError();
}

int dw_cuda_be_qkv(void *x, void *q, void *k, void *v, int64_t N, int64_t wq, int64_t wkv,
                       int esize, bool merge, void *stream) {
    const int64_t n = N * (wq + 2 * wkv);
    if (n <= 0) return (int)cudaSuccess;
    cudaStream_t s = (cudaStream_t)stream;
    if (esize == 2)
        ek_qkv_kernel<uint16_t><<<ek_blocks(n), EK_THREADS, 0, s>>>((uint16_t *)x, (uint16_t *)q,
                                                                    (uint16_t *)k, (uint16_t *)v, N, wq, wkv, merge);
    else
        ek_qkv_kernel<uint32_t><<<ek_blocks(n), EK_THREADS, 0, s>>>((uint32_t *)x, (uint32_t *)q,
                                                                    (uint32_t *)k, (uint32_t *)v, N, wq, wkv, merge);
    return (int)cudaGetLastError();
}

} /* extern "C" */
