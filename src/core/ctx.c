/* ctx.c — dw_ctx: device choice, the lazily created stream and library handles, version. */
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/error.h"
#include "core/log.h"

#if DW_HAVE_CUDA
#include "core/cuda_check.h"
#endif

bool dw_built_with_cuda(void) { return DW_HAVE_CUDA != 0; }

#define DW_STR2(x) #x
#define DW_STR(x) DW_STR2(x)
const char *dw_version_string(void) {
    return DW_STR(DW_VERSION_MAJOR) "." DW_STR(DW_VERSION_MINOR) "." DW_STR(DW_VERSION_PATCH)
#if DW_HAVE_CUDA && defined(DW_CUDA_ARCHS_TEXT)
        " (cuda: " DW_CUDA_ARCHS_TEXT ")"; /* the build's DW_CUDA_ARCHS (CMakeLists.txt) */
#elif DW_HAVE_CUDA
        " (cuda)";
#else
        " (cpu-only build)";
#endif
}

/* Number of usable CUDA devices; 0 when the build has no CUDA or no driver/GPU is present. */
static int cuda_device_count(void) {
#if DW_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

dw_status dw_ctx_create(const dw_ctx_opts *opts, dw_ctx **out) {
    *out = NULL;
    dw_ctx_opts o = opts ? *opts : (dw_ctx_opts){.device = DW_DEVICE_AUTO, .device_index = 0};
    dw_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return dw_set_error(NULL, DW_ERR_NOMEM, "out of host memory creating a context");

    int ngpu = (o.device == DW_DEVICE_CPU) ? 0 : cuda_device_count();
    if (o.device == DW_DEVICE_CUDA) {
        if (!dw_built_with_cuda()) {
            free(ctx);
            return dw_set_error(NULL, DW_ERR_UNSUPPORTED,
                                "device cuda requested but this build has no CUDA (rebuild with nvcc)");
        }
        if (o.device_index < 0 || o.device_index >= ngpu) {
            free(ctx);
            return dw_set_error(NULL, DW_ERR_INVALID,
                                "CUDA device %d requested but %d usable GPU(s) found", o.device_index,
                                ngpu);
        }
    }
    if (o.device == DW_DEVICE_AUTO) o.device = ngpu > 0 ? DW_DEVICE_CUDA : DW_DEVICE_CPU;
    ctx->device = o.device;
    ctx->device_index = o.device == DW_DEVICE_CUDA ? o.device_index : -1;
#if DW_HAVE_CUDA
    if (ctx->device == DW_DEVICE_CUDA && cudaSetDevice(ctx->device_index) != cudaSuccess) {
        dw_status s = dw_set_error(NULL, DW_ERR_CUDA, "cudaSetDevice(%d) failed: %s",
                                   ctx->device_index, cudaGetErrorString(cudaGetLastError()));
        free(ctx);
        return s;
    }
#endif
    if (ctx->device == DW_DEVICE_CUDA) DW_LOGD("context on cuda:%d", ctx->device_index);
    else DW_LOGD("context on cpu");
    *out = ctx;
    return DW_OK;
}

void dw_ctx_free(dw_ctx *ctx) {
    if (!ctx) return;
    for (int i = 0; i < DW_HANDLE_COUNT; i++)
        if (ctx->handles[i] && ctx->destroy[i]) ctx->destroy[i](ctx->handles[i]);
#if DW_HAVE_CUDA
    if (ctx->stream) cudaStreamDestroy((cudaStream_t)ctx->stream);
#endif
    free(ctx);
}

dw_device_kind dw_ctx_device(const dw_ctx *ctx) { return ctx->device; }

dw_status dw_ctx_mem_info(dw_ctx *ctx, int64_t *free_bytes, int64_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    if (ctx->device != DW_DEVICE_CUDA)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "device memory: the context is on the CPU");
#if DW_HAVE_CUDA
    size_t f = 0, t = 0;
    DW_CUDA_CHECK(ctx, cudaMemGetInfo(&f, &t));
    *free_bytes = (int64_t)f, *total_bytes = (int64_t)t;
    return DW_OK;
#else
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "device memory: this build has no CUDA");
#endif
}
int dw_ctx_device_index(const dw_ctx *ctx) { return ctx->device_index; }

dw_status dw_ctx_stream(dw_ctx *ctx, void **stream_out) {
    *stream_out = NULL;
    if (ctx->device != DW_DEVICE_CUDA)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "a CUDA stream was requested on a CPU context");
#if DW_HAVE_CUDA
    if (!ctx->stream) {
        cudaStream_t s = NULL;
        DW_CUDA_CHECK(ctx, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        ctx->stream = s;
    }
    *stream_out = ctx->stream;
    return DW_OK;
#else
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "this build has no CUDA");
#endif
}

dw_status dw_ctx_handle(dw_ctx *ctx, dw_handle_slot slot, dw_handle_create_fn create,
                        dw_handle_destroy_fn destroy, void **handle_out) {
    DW_ASSERT(slot >= 0 && slot < DW_HANDLE_COUNT);
    *handle_out = NULL;
    if (!ctx->handles[slot]) {
        void *h = NULL;
        DW_TRY(create(ctx, &h));
        ctx->handles[slot] = h;
        ctx->destroy[slot] = destroy;
    }
    *handle_out = ctx->handles[slot];
    return DW_OK;
}
