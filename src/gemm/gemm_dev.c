/* gemm_dev.c — device memory and CUDA-event timing for the GEMM bench (see gemm_dev.h). */
#include "gemm/gemm_dev.h"

#include "core/ctx.h"
#include "core/error.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"

dw_status dw_gemm_dev_alloc(dw_ctx *ctx, size_t bytes, void **out) {
    *out = NULL;
    if (cudaMalloc(out, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        return dw_set_error(ctx, DW_ERR_NOMEM, "cudaMalloc of %zu bytes failed", bytes);
    }
    return DW_OK;
}

void dw_gemm_dev_free(void *p) {
    if (p) cudaFree(p);
}

/* On the context's stream and waited for: a plain cudaMemcpy from pageable memory may return before
 * its DMA lands, and the context's stream (non-blocking) does not wait for it. */
dw_status dw_gemm_dev_upload(dw_ctx *ctx, void *dst, const void *src, size_t bytes) {
    void *s = NULL;
    DW_TRY(dw_ctx_stream(ctx, &s));
    DW_CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)s));
    DW_CUDA_CHECK(ctx, cudaStreamSynchronize((cudaStream_t)s));
    return DW_OK;
}

dw_status dw_gemm_dev_sync(dw_ctx *ctx) {
    void *s = NULL;
    DW_TRY(dw_ctx_stream(ctx, &s));
    DW_CUDA_CHECK(ctx, cudaStreamSynchronize((cudaStream_t)s));
    return DW_OK;
}

dw_status dw_gemm_dev_time(dw_ctx *ctx, int reps, dw_status (*fn)(void *arg, int i), void *arg, double *ms) {
    *ms = 0;
    void *s = NULL;
    DW_TRY(dw_ctx_stream(ctx, &s));
    cudaEvent_t e0, e1;
    DW_CUDA_CHECK(ctx, cudaEventCreate(&e0));
    DW_CUDA_CHECK(ctx, cudaEventCreate(&e1));
    dw_status st = DW_OK;
    cudaEventRecord(e0, (cudaStream_t)s);
    for (int i = 0; i < reps && st == DW_OK; i++) st = fn(arg, i);
    cudaEventRecord(e1, (cudaStream_t)s);
    cudaError_t ce = cudaEventSynchronize(e1);
    float t = 0;
    if (ce == cudaSuccess) ce = cudaEventElapsedTime(&t, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (st != DW_OK) return st;
    if (ce != cudaSuccess) return dw_set_error(ctx, DW_ERR_CUDA, "timing: %s", cudaGetErrorString(ce));
    *ms = t;
    return DW_OK;
}
#else
dw_status dw_gemm_dev_alloc(dw_ctx *ctx, size_t bytes, void **out) {
    (void)bytes;
    *out = NULL;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "this build has no CUDA");
}
void dw_gemm_dev_free(void *p) { (void)p; }
dw_status dw_gemm_dev_upload(dw_ctx *ctx, void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "this build has no CUDA");
}
dw_status dw_gemm_dev_sync(dw_ctx *ctx) { return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "this build has no CUDA"); }
dw_status dw_gemm_dev_time(dw_ctx *ctx, int reps, dw_status (*fn)(void *arg, int i), void *arg, double *ms) {
    (void)reps, (void)fn, (void)arg;
    *ms = 0;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "this build has no CUDA");
}
#endif
