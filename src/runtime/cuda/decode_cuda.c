/* decode_cuda.c — the device side of cached decoding on a CUDA engine (decode_cuda.h): cache rows
 * copied on the backend's stream, attention by dw_cuda_decode_attn. Nothing here synchronises. */
#include "core/error.h"
#include "runtime/cuda/decode_cuda.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/cuda/decode_attn.h"
#include "runtime/cuda/cuda.h"

size_t dw_cuda_decode_work_bytes(int64_t H, int64_t D, int64_t S) { return dw_cuda_decode_attn_work_bytes(1, H, D, S); }

dw_status dw_cuda_decode_keep(dw_backend *be, bool bf16, void *cache, int64_t pos, const void *src, int64_t rows,
                              int64_t stride, int64_t width) {
    const size_t es = bf16 ? 2 : 4;
    char *dst = (char *)cache + (size_t)(pos * width) * es;
    DW_CUDA_CHECK(be->ctx, cudaMemcpy2DAsync(dst, (size_t)width * es, src, (size_t)stride * es, (size_t)width * es,
                                             (size_t)rows, cudaMemcpyDeviceToDevice, DW_CUDA_STREAM(be)));
    return DW_OK;
}

dw_status dw_cuda_decode_attention(dw_backend *be, bool bf16, void *out, const void *q, const void *kc,
                                   const void *vc, int64_t n, int64_t S, int64_t H, int64_t Hkv, int64_t D, int64_t W,
                                   double cap, void *work, size_t work_bytes) {
    return dw_cuda_decode_attn(be->ctx, bf16 ? DW_ACT_BF16 : DW_ACT_F32, out, q, kc, vc, 1, S, n, H, Hkv, D, W, cap,
                               work, work_bytes, DW_CUDA_STREAM(be));
}

#else /* !DW_HAVE_CUDA */

size_t dw_cuda_decode_work_bytes(int64_t H, int64_t D, int64_t S) {
    (void)H, (void)D, (void)S;
    return 0;
}

dw_status dw_cuda_decode_keep(dw_backend *be, bool bf16, void *cache, int64_t pos, const void *src, int64_t rows,
                              int64_t stride, int64_t width) {
    (void)bf16, (void)cache, (void)pos, (void)src, (void)rows, (void)stride, (void)width;
    return dw_set_error(be->ctx, DW_ERR_UNSUPPORTED, "KV cache on the device: this build has no CUDA");
}

dw_status dw_cuda_decode_attention(dw_backend *be, bool bf16, void *out, const void *q, const void *kc,
                                   const void *vc, int64_t n, int64_t S, int64_t H, int64_t Hkv, int64_t D, int64_t W,
                                   double cap, void *work, size_t work_bytes) {
    (void)bf16, (void)out, (void)q, (void)kc, (void)vc, (void)n, (void)S, (void)H, (void)Hkv, (void)D, (void)W;
    (void)cap, (void)work, (void)work_bytes;
    return dw_set_error(be->ctx, DW_ERR_UNSUPPORTED, "KV cache on the device: this build has no CUDA");
}

#endif /* DW_HAVE_CUDA */
