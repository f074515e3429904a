/* gemm_dev.h — private: device-memory and event-timing helpers for GEMM tools and tests that
 * must not include CUDA headers (the bench command). Plain C; DW_ERR_UNSUPPORTED without CUDA. */
#ifndef DW_GEMM_GEMM_DEV_H
#define DW_GEMM_GEMM_DEV_H

#include <stddef.h>

#include "deepwell.h"

dw_status dw_gemm_dev_alloc(dw_ctx *ctx, size_t bytes, void **out);
void dw_gemm_dev_free(void *p);
dw_status dw_gemm_dev_upload(dw_ctx *ctx, void *dst, const void *src, size_t bytes);
dw_status dw_gemm_dev_sync(dw_ctx *ctx);
/* Milliseconds of `reps` calls fn(arg, i) (i = 0..reps-1) on the context's stream, measured with
 * CUDA events around the whole batch (the first failing call's status is returned). */
dw_status dw_gemm_dev_time(dw_ctx *ctx, int reps, dw_status (*fn)(void *arg, int i), void *arg, double *ms);

#endif /* DW_GEMM_GEMM_DEV_H */
