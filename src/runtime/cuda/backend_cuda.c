/* backend_cuda.c — the CUDA backend's table (backend.h): pools by cudaMalloc, stream-ordered
 * copies on the context's stream (download synchronises), the op entries of ops.def's cuda
 * column, the optimizer steps, recording by stream capture into CUDA graphs, events as timers,
 * and the preparation at creation (cuBLASLt's handle and workspace, cuDNN's attention plans), so
 * that no step allocates. In a build without CUDA, creating it says so. */
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "gemm/compute_capability.h"
#include "kernels/cuda/attn_packed.h"
#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda/cuda.h"

#define STREAM(be) ((cudaStream_t)DW_CUDA_STREAM(be))

static dw_status cu_alloc(dw_backend *be, int64_t bytes, void **out) {
    cudaError_t ce = cudaMalloc(out, (size_t)(bytes > 0 ? bytes : 256));
    if (ce == cudaSuccess) return DW_OK;
    *out = NULL;
    (void)cudaGetLastError();
    return dw_set_error(be->ctx, DW_ERR_NOMEM, "cudaMalloc of %lld bytes: %s", (long long)bytes, cudaGetErrorString(ce));
}
static void cu_release(dw_backend *be, void *p) { (void)be, cudaFree(p); }
static dw_status cu_upload(dw_backend *be, void *dst, const void *src, size_t bytes) {
    DW_CUDA_CHECK(be->ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, STREAM(be)));
    return DW_OK;
}
static dw_status cu_download(dw_backend *be, void *dst, const void *src, size_t bytes) {
    DW_CUDA_CHECK(be->ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, STREAM(be)));
    DW_CUDA_CHECK(be->ctx, cudaStreamSynchronize(STREAM(be)));
    return DW_OK;
}
static dw_status cu_zero(dw_backend *be, void *dst, size_t bytes) {
    DW_CUDA_CHECK(be->ctx, cudaMemsetAsync(dst, 0, bytes, STREAM(be)));
    return DW_OK;
}
static dw_status cu_add(dw_backend *be, dw_act_type dt, void *dst, const void *src, int64_t n) {
    return dw_cuda_add_fwd(be->ctx, (dw_act_dtype)dt, dst, dst, src, n, DW_CUDA_STREAM(be));
}
static dw_status cu_sync(dw_backend *be) {
    DW_CUDA_CHECK(be->ctx, cudaStreamSynchronize(STREAM(be)));
    return DW_OK;
}

/* cuBLASLt's handle and workspace by one tiny GEMM on zeroed scratch, now rather than inside a
 * (recorded) step; the ops' own prepare entries (cuDNN attention plans) follow, from the executor. */
static dw_status cu_prepare(dw_backend *be, const dw_exec *x) {
    const dw_compiled *p = x->p;
    if (p->bf16) {
        void *scratch = x->work + p->work.partials; /* zeroed: 8 KiB */
        dw_gemm_args a = {.m = 16, .n = 16, .k = 16, .alpha = 1.0f, .d = (char *)scratch + 2048,
                          .out_type = DW_GEMM_OUT_F32};
        a.a = (dw_gemm_operand){.recipe = DW_RECIPE_BF16, .rows = 16, .cols = 16, .data = scratch, .tensor_scale = 1.0f};
        a.b = a.a, a.b.trans = true;
        DW_TRY(dw_gemm(be->ctx, &a));
    }
    return DW_OK;
}

static void cu_begin_phase(dw_backend *be, const dw_exec *x, dw_phase phase) {
    (void)x, (void)phase;
    dw_cuda_qlin_reset(be); /* a sweep starts: the quantisation slots hold nothing */
}

/* ---- recording: stream capture into a CUDA graph --------------------------------------------- */
static dw_status cu_record_begin(dw_backend *be) {
    DW_CUDA_CHECK(be->ctx, cudaStreamBeginCapture(STREAM(be), cudaStreamCaptureModeThreadLocal));
    return DW_OK;
}
static dw_status cu_record_end(dw_backend *be, void **graph) {
    *graph = NULL;
    cudaGraph_t g = NULL;
    cudaError_t ce = cudaStreamEndCapture(STREAM(be), &g);
    if (ce != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return dw_set_error(be->ctx, DW_ERR_CUDA, "CUDA graph capture: %s", cudaGetErrorString(ce));
    }
    cudaGraphExec_t exec = NULL;
    ce = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return dw_set_error(be->ctx, DW_ERR_CUDA, "CUDA graph instantiation: %s", cudaGetErrorString(ce));
    }
    *graph = exec;
    return DW_OK;
}
static dw_status cu_replay(dw_backend *be, void *graph) {
    DW_CUDA_CHECK(be->ctx, cudaGraphLaunch((cudaGraphExec_t)graph, STREAM(be)));
    return DW_OK;
}
static void cu_drop(dw_backend *be, void *graph) {
    (void)be;
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

/* ---- timers: events on the stream -------------------------------------------------------------- */
static void drop_events(dw_cuda_state *s) {
    for (int k = 0; k < s->n_events; k++) cudaEventDestroy((cudaEvent_t)s->events[k]);
    free(s->events);
    s->events = NULL, s->n_events = 0;
}
static dw_status cu_timers(dw_backend *be, int count) {
    dw_cuda_state *s = DW_CUDA_ST(be);
    if (s->n_events >= count) return DW_OK;
    drop_events(s);
    s->events = calloc((size_t)count, sizeof *s->events);
    if (!s->events) return dw_set_error(be->ctx, DW_ERR_NOMEM, "cuda backend: out of memory");
    for (; s->n_events < count; s->n_events++)
        DW_CUDA_CHECK(be->ctx, cudaEventCreate((cudaEvent_t *)&s->events[s->n_events]));
    return DW_OK;
}
static void cu_mark(dw_backend *be, int k) {
    dw_cuda_state *s = DW_CUDA_ST(be);
    if (k >= 0 && k < s->n_events) cudaEventRecord((cudaEvent_t)s->events[k], STREAM(be));
}
static double cu_elapsed(dw_backend *be, int a, int b) {
    float ms = 0;
    cudaEventElapsedTime(&ms, (cudaEvent_t)DW_CUDA_ST(be)->events[a], (cudaEvent_t)DW_CUDA_ST(be)->events[b]);
    return ms;
}

static void cu_destroy(dw_backend *be) {
    dw_cuda_state *s = DW_CUDA_ST(be);
    if (s) drop_events(s);
    free(s);
}

#define CUDA_ENTRY_2(name) {dw_cuda_op_##name##_fwd, dw_cuda_op_##name##_bwd, dw_cuda_op_##name##_prepare}
#define CUDA_ENTRY_1(name) {dw_cuda_op_##name##_fwd, dw_cuda_op_##name##_bwd, NULL}
#define CUDA_ENTRY_0(name) {NULL, NULL, NULL}
#define CUDA_ENTRY(flag, name) CUDA_ENTRY_##flag(name)
static const dw_op_entry cuda_ops[DW_OP_COUNT] = {
#define DW_OP(ID, name, min_in, max_in, outs, flags, cpu, cuda, summary) CUDA_ENTRY(cuda, name),
#include "ir/ops.def"
#undef DW_OP
};

static const dw_backend_i cuda_iface = {
    .name = "cuda",
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .release = cu_release,
    .upload = cu_upload,
    .download = cu_download,
    .zero = cu_zero,
    .add = cu_add,
    .sync = cu_sync,
    .prepare = cu_prepare,
    .begin_phase = cu_begin_phase,
    .grad_norm = dw_cuda_step_grad_norm,
    .adamw = dw_cuda_step_adamw,
    .adamw_quants = dw_cuda_adamw_quants,
    .cast_bf16 = dw_cuda_step_cast_bf16,
    .quant_weight = dw_cuda_step_quant_weight,
    .qstats = dw_cuda_qstats,
    .record_begin = cu_record_begin,
    .record_end = cu_record_end,
    .replay = cu_replay,
    .drop = cu_drop,
    .timers = cu_timers,
    .mark = cu_mark,
    .elapsed_ms = cu_elapsed,
    .ops = cuda_ops,
};

dw_status dw_backend_cuda_create(dw_ctx *ctx, dw_backend **out) {
    *out = NULL;
    if (dw_ctx_device(ctx) != DW_DEVICE_CUDA)
        return dw_set_error(ctx, DW_ERR_INVALID, "cuda backend: the context's device is not CUDA");
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(ctx, &stream));
    dw_backend *be = calloc(1, sizeof *be);
    dw_cuda_state *s = calloc(1, sizeof *s);
    if (!be || !s) {
        free(be), free(s);
        return dw_set_error(ctx, DW_ERR_NOMEM, "cuda backend: out of memory");
    }
    s->stream = stream;
    s->rows_tensor = s->xt_tensor = -1;
    s->dy_fp8_node[0] = s->dy_fp8_node[1] = -1;
    *be = (dw_backend){.i = &cuda_iface, .ctx = ctx, .device = DW_DEVICE_CUDA, .sm = dw_gemm_ctx_sm(ctx), .impl = s};
    *out = be;
    return DW_OK;
}

#else /* !DW_HAVE_CUDA */

dw_status dw_backend_cuda_create(dw_ctx *ctx, dw_backend **out) {
    *out = NULL;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "cuda engine: this build has no CUDA (configure with -DDW_CUDA=ON "
                        "on a machine with nvcc)");
}

#endif /* DW_HAVE_CUDA */
