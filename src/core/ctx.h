/* ctx.h — private: the dw_ctx structure, CUDA streams and lazily created library handles.
 * CUDA types are kept as void* so that CPU-only translation units can include this header. */
#ifndef DW_CORE_CTX_H
#define DW_CORE_CTX_H

#include "deepwell.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DW_ERRMSG_CAP 2048

/* Library handles that are created on first use and destroyed with the context. */
/* DW_HANDLE_CUBLASLT holds the GEMM layer's cuBLASLt state (handle, workspace, algorithm cache). */
typedef enum { DW_HANDLE_CUBLASLT = 0, DW_HANDLE_CUDNN, DW_HANDLE_USER0, DW_HANDLE_COUNT } dw_handle_slot;

typedef void (*dw_handle_destroy_fn)(void *handle);

struct dw_ctx {
    dw_device_kind device;                  /* resolved: CPU or CUDA */
    int device_index;                       /* CUDA ordinal */
    void *stream;                           /* cudaStream_t, created lazily (NULL on CPU) */
    void *handles[DW_HANDLE_COUNT];         /* lazily created library handles */
    dw_handle_destroy_fn destroy[DW_HANDLE_COUNT];
    dw_status last_status;
    char errmsg[DW_ERRMSG_CAP];
};

/* The context's main CUDA stream (created on first call). NULL + error on CPU contexts. */
dw_status dw_ctx_stream(dw_ctx *ctx, void **stream_out);

/* Returns the handle in `slot`, creating it with create(ctx, &handle) on first use. */
typedef dw_status (*dw_handle_create_fn)(dw_ctx *ctx, void **handle_out);
dw_status dw_ctx_handle(dw_ctx *ctx, dw_handle_slot slot, dw_handle_create_fn create,
                        dw_handle_destroy_fn destroy, void **handle_out);

#ifdef __cplusplus
}
#endif

#endif /* DW_CORE_CTX_H */
