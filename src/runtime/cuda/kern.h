/* kern.h — private to runtime/cuda/: C-callable glue kernels of the CUDA backend (kern.cu): the
 * BF16 working copy of the weights, packed-qkv split/merge. Plain C types; streams as void*; each
 * returns a cudaError_t as int (0 = launched). */
#ifndef DW_RUNTIME_CUDA_KERN_H
#define DW_RUNTIME_CUDA_KERN_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
/* dst (n) BF16 = src (n) FP32, round to nearest even. */
int dw_cuda_be_to_bf16(uint16_t *dst, const float *src, int64_t n, void *stream);
/* x (N, Wq + 2 Wkv) <-> q (N, Wq), k (N, Wkv), v (N, Wkv); esize 2 or 4 bytes per element.
 * split: x -> q, k, v; merge: q, k, v -> x. */
int dw_cuda_be_qkv(void *x, void *q, void *k, void *v, int64_t N, int64_t wq, int64_t wkv,
                       int esize, bool merge, void *stream);
#ifdef __cplusplus
}
#endif

#endif /* DW_RUNTIME_CUDA_KERN_H */
