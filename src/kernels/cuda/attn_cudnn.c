/* attn_cudnn.c — causal GQA attention (BF16) through cuDNN's backend graph API: the composite
 * flash-attention operation graphs that cuDNN 9's fused SDPA engines recognise (forward: Q·Kᵀ,
 * scale, causal mask, softmax with stats, P·V; backward: dQ, dK, dV from Q, K, V, O, dO, stats).
 * A sliding window adds the left-bound band after the causal mask (cuDNN >= 9.2; where no engine
 * takes that layout, one select on the AND of both compares is tried); soft-capped
 * scores (Gemma 2) add cap·tanh(S / cap) after the scale and its derivative before dS's scale, a
 * pattern only cuDNN's runtime-compiled engines take (>= 9.4, Hopper on). Graph layout learnt from
 * cudnn-frontend's sdpa nodes (diagonal band mask, Softcap score modifier); written here anew.
 * libcudnn is loaded with dlopen (no link-time dependency). Plans are built once per shape, mask and
 * direction, cached with their workspace, and never built during stream capture. Without the
 * cuDNN headers at build time this file is a stub that always declines. One cuDNN handle per
 * process: the plan cache is mutex-guarded, but executes from several threads at once are not
 * supported (cudnnSetStream then execute is not atomic). */
#include "core/env.h"
#include "kernels/cuda/attn_cudnn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if DW_HAVE_CUDA && DW_HAVE_CUDNN

#include <cuda_runtime_api.h>
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/log.h"

/* ---- the library, loaded once ----------------------------------------------------------------- */
typedef struct {
    size_t (*get_version)(void);
    const char *(*err_str)(cudnnStatus_t);
    void (*last_err)(char *, size_t);
    cudnnStatus_t (*create)(cudnnHandle_t *);
    cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*desc_create)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*desc_destroy)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*set_attr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                              int64_t, const void *);
    cudnnStatus_t (*get_attr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                              int64_t, int64_t *, void *);
    cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
} dn_api;

static pthread_mutex_t dn_mutex = PTHREAD_MUTEX_INITIALIZER;
static dn_api dn;
static int dn_state;              /* 0 not tried, 1 loaded with a handle, -1 unavailable */
static cudnnHandle_t dn_handle;
static int64_t dn_ver;
static char dn_why[512] = "cuDNN not tried yet";

#define DN_SYM(field, name)                                                                                    \
    do {                                                                                                       \
        *(void **)&dn.field = dlsym(lib, name); /* POSIX idiom for function symbols */                       \
        if (!dn.field) {                                                                                       \
            snprintf(dn_why, sizeof dn_why, "libcudnn.so.9 has no %s", name);                                 \
            return false;                                                                                      \
        }                                                                                                      \
    } while (0)

static bool dn_load_syms(void *lib) {
    DN_SYM(get_version, "cudnnGetVersion");
    DN_SYM(err_str, "cudnnGetErrorString");
    DN_SYM(last_err, "cudnnGetLastErrorString");
    DN_SYM(create, "cudnnCreate");
    DN_SYM(set_stream, "cudnnSetStream");
    DN_SYM(desc_create, "cudnnBackendCreateDescriptor");
    DN_SYM(desc_destroy, "cudnnBackendDestroyDescriptor");
    DN_SYM(finalize, "cudnnBackendFinalize");
    DN_SYM(set_attr, "cudnnBackendSetAttribute");
    DN_SYM(get_attr, "cudnnBackendGetAttribute");
    DN_SYM(execute, "cudnnBackendExecute");
    return true;
}

/* Loads libcudnn and creates the handle (outside capture: cudnnCreate allocates). dn_mutex held. */
static bool dn_init(void) {
    if (dn_state) return dn_state > 0;
    dn_state = -1;
    void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(dn_why, sizeof dn_why, "cuDNN not available: %s", dlerror());
        DW_LOGD("attention: %s", dn_why);
        return false;
    }
    if (!dn_load_syms(lib)) {
        DW_LOGW("attention: %s", dn_why);
        return false;
    }
    dn_ver = (int64_t)dn.get_version();
    if (dn_ver < 90000) {
        snprintf(dn_why, sizeof dn_why, "cuDNN %lld is older than 9.0", (long long)dn_ver);
        DW_LOGW("attention: %s", dn_why);
        return false;
    }
    cudnnStatus_t st = dn.create(&dn_handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(dn_why, sizeof dn_why, "cudnnCreate: %s", dn.err_str(st));
        DW_LOGW("attention: %s", dn_why);
        return false;
    }
    dn_state = 1;
    DW_LOGD("attention: cuDNN %lld loaded", (long long)dn_ver);
    return true;
}

/* ---- graph building ----------------------------------------------------------------------------
 * A builder owns every descriptor it creates (they stay alive as long as the plan) and records
 * the first failure with cuDNN's message. Virtual intermediates get UIDs from 100 up. */
enum { DN_MAX_DESC = 256, DN_MAX_OPS = 64 }; /* the capped, windowed GQA backward: 135, 35 */
enum { /* UIDs of the tensors the variant pack names */
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF, U_DO, U_DQ, U_DK, U_DV, U_SOFTSUM, U_DQACC, U_ONE,
    U_WINDOW, U_CAP
};

typedef struct {
    cudnnBackendDescriptor_t own[DN_MAX_DESC];
    int n_own;
    cudnnBackendDescriptor_t ops[DN_MAX_OPS];
    int n_ops;
    int64_t next_uid;
    int band; /* a window's mask layout: 0 its own select after the causal one, 1 one select on both */
    bool failed;
    char err[384];
} dn_builder;

static void dn_fail(dn_builder *b, const char *what, cudnnStatus_t st) {
    if (b->failed) return;
    b->failed = true;
    char last[256] = "";
    dn.last_err(last, sizeof last);
    snprintf(b->err, sizeof b->err, "%s: %s%s%s", what, dn.err_str(st), last[0] ? " — " : "", last);
}

static cudnnBackendDescriptor_t dn_new(dn_builder *b, cudnnBackendDescriptorType_t type, const char *what) {
    if (b->failed) return NULL;
    if (b->n_own == DN_MAX_DESC) {
        b->failed = true;
        snprintf(b->err, sizeof b->err, "%s: descriptor table full", what);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = dn.desc_create(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        dn_fail(b, what, st);
        return NULL;
    }
    b->own[b->n_own++] = d;
    return d;
}
static void dn_set(dn_builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                   cudnnBackendAttributeType_t t, int64_t n, const void *v, const char *what) {
    if (b->failed) return;
    cudnnStatus_t st = dn.set_attr(d, a, t, n, v);
    if (st != CUDNN_STATUS_SUCCESS) dn_fail(b, what, st);
}
static void dn_fin(dn_builder *b, cudnnBackendDescriptor_t d, const char *what) {
    if (b->failed) return;
    cudnnStatus_t st = dn.finalize(d);
    if (st != CUDNN_STATUS_SUCCESS) dn_fail(b, what, st);
}
static void dn_free(dn_builder *b) {
    for (int i = b->n_own - 1; i >= 0; i--) dn.desc_destroy(b->own[i]);
    b->n_own = b->n_ops = 0;
}

/* A 4-d tensor [n0,n1,n2,n3] with strides s. uid 0: a new virtual one. by_value: a host scalar. */
typedef struct {
    int64_t n[4], s[4];
} dn_dims;
static cudnnBackendDescriptor_t dn_tensor(dn_builder *b, int64_t uid, cudnnDataType_t dt, dn_dims d, bool by_value) {
    cudnnBackendDescriptor_t t = dn_new(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    const bool virt = uid == 0;
    if (virt) uid = b->next_uid++;
    const int64_t align = 16;
    dn_set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    dn_set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, d.n, "tensor dims");
    dn_set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, d.s, "tensor strides");
    dn_set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    dn_set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    dn_set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor virtual");
    if (by_value) dn_set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
    dn_fin(b, t, "tensor finalize");
    return t;
}
static cudnnBackendDescriptor_t dn_virt(dn_builder *b, cudnnDataType_t dt, dn_dims d) {
    return dn_tensor(b, 0, dt, d, false);
}
static void dn_add_op(dn_builder *b, cudnnBackendDescriptor_t op, const char *what) {
    dn_fin(b, op, what);
    if (b->failed) return;
    if (b->n_ops == DN_MAX_OPS) {
        b->failed = true;
        snprintf(b->err, sizeof b->err, "%s: too many operations", what);
        return;
    }
    b->ops[b->n_ops++] = op;
}

/* A pointwise operation of `mode` (math in `prec`, axis for GEN_INDEX, else < 0) whose tensors
 * the caller then sets and adds. */
static cudnnBackendDescriptor_t dn_pw_op(dn_builder *b, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
                                         const char *what) {
    cudnnBackendDescriptor_t pw = dn_new(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    dn_set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
    dn_set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
    if (axis >= 0) dn_set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
    dn_fin(b, pw, what);
    cudnnBackendDescriptor_t op = dn_new(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
    dn_set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, what);
    return op;
}
static void dn_pw_tensor(dn_builder *b, cudnnBackendDescriptor_t op, cudnnBackendAttributeName_t a,
                         cudnnBackendDescriptor_t t, const char *what) {
    if (t) dn_set(b, op, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, what);
}
/* y = mode(x[, bb[, t]]); math in `prec`; axis for GEN_INDEX (else < 0). */
static void dn_pw(dn_builder *b, cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                  cudnnBackendDescriptor_t bb, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis,
                  const char *what) {
    cudnnBackendDescriptor_t op = dn_pw_op(b, mode, prec, axis, what);
    dn_pw_tensor(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, what);
    dn_pw_tensor(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, bb, what);
    dn_pw_tensor(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, what);
    dn_pw_tensor(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, what);
    dn_add_op(b, op, what);
}
/* dx = mode'(x) · dy for an activation-backward mode (TANH_BWD), math in `prec` */
static void dn_pw_bwd(dn_builder *b, cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t dy, cudnnBackendDescriptor_t dx, const char *what) {
    cudnnBackendDescriptor_t op = dn_pw_op(b, mode, prec, -1, what);
    dn_pw_tensor(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, what);
    dn_pw_tensor(b, op, CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, dy, what);
    dn_pw_tensor(b, op, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, dx, what);
    dn_add_op(b, op, what);
}
/* c = a · b (batched over the first two dims, broadcasting KV heads over query heads), FP32 math */
static void dn_matmul(dn_builder *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bb,
                      cudnnBackendDescriptor_t c, const char *what) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = dn_new(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
    dn_set(b, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, what);
    dn_fin(b, mm, what);
    cudnnBackendDescriptor_t op = dn_new(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
    dn_set(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, what);
    dn_set(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bb, what);
    dn_set(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, what);
    dn_set(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, what);
    dn_add_op(b, op, what);
}
/* y = reduce(x) over the dims where y has extent 1 (or fewer heads: GQA head groups) */
static void dn_reduce(dn_builder *b, cudnnReduceTensorOp_t rop, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y, const char *what) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = dn_new(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
    dn_set(b, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &rop, what);
    dn_set(b, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, what);
    dn_fin(b, rd, what);
    cudnnBackendDescriptor_t op = dn_new(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
    dn_set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    dn_set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    dn_set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, what);
    dn_add_op(b, op, what);
}
static void dn_reshape(dn_builder *b, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, const char *what) {
    cudnnBackendDescriptor_t op = dn_new(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
    dn_set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    dn_set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    dn_add_op(b, op, what);
}

static dn_dims dn_d(int64_t n0, int64_t n1, int64_t n2, int64_t n3, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    return (dn_dims){{n0, n1, n2, n3}, {s0, s1, s2, s3}};
}

/* The tensors both directions share. q, o as [B,H,T,D]; k as Kᵀ [B,Hkv,D,T]; v as [B,Hkv,T,D]
 * (vt: as Vᵀ [B,Hkv,D,T]); stats [B,H,T,1]; scale and -inf as host scalars; the window W and the
 * cap as host scalars only when the shape has them (else NULL). */
typedef struct {
    cudnnBackendDescriptor_t q, kt, v, vt, o, stats, scale, neginf, window, cap;
} dn_io;
static dn_io dn_io_tensors(dn_builder *b, const dw_attn_cudnn_shape *s, bool vt) {
    const int64_t B = s->B, T = s->T, H = s->H, G = s->Hkv, D = s->D;
    const dn_dims one = dn_d(1, 1, 1, 1, 1, 1, 1, 1);
    dn_io io = {0};
    io.q = dn_tensor(b, U_Q, CUDNN_DATA_BFLOAT16, dn_d(B, H, T, D, T * s->rq, D, s->rq, 1), false);
    io.kt = dn_tensor(b, U_K, CUDNN_DATA_BFLOAT16, dn_d(B, G, D, T, T * s->rk, D, 1, s->rk), false);
    io.v = dn_tensor(b, U_V, CUDNN_DATA_BFLOAT16,
                     vt ? dn_d(B, G, D, T, T * s->rk, D, 1, s->rk) : dn_d(B, G, T, D, T * s->rk, D, s->rk, 1), false);
    io.o = dn_tensor(b, U_O, CUDNN_DATA_BFLOAT16, dn_d(B, H, T, D, T * H * D, D, H * D, 1), false);
    io.stats = dn_tensor(b, U_STATS, CUDNN_DATA_FLOAT, dn_d(B, H, T, 1, H * T, T, 1, 1), false);
    io.scale = dn_tensor(b, U_SCALE, CUDNN_DATA_FLOAT, one, true);
    io.neginf = dn_tensor(b, U_NEGINF, CUDNN_DATA_FLOAT, one, true);
    if (s->W > 0) io.window = dn_tensor(b, U_WINDOW, CUDNN_DATA_FLOAT, one, true);
    if (s->cap > 0) io.cap = dn_tensor(b, U_CAP, CUDNN_DATA_FLOAT, one, true);
    return io;
}

/* s = mask(x): keeps x where row (query) >= column (key), else -inf. x is [B,H,T,T] FP32. */
static cudnnBackendDescriptor_t dn_causal(dn_builder *b, cudnnBackendDescriptor_t x, dn_dims sd,
                                          cudnnBackendDescriptor_t neginf) {
    cudnnBackendDescriptor_t row = dn_virt(b, CUDNN_DATA_INT32, sd), col = dn_virt(b, CUDNN_DATA_INT32, sd);
    cudnnBackendDescriptor_t keep = dn_virt(b, CUDNN_DATA_BOOLEAN, sd), y = dn_virt(b, CUDNN_DATA_FLOAT, sd);
    dn_pw(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, row, 2, "causal row index");
    dn_pw(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, col, 3, "causal column index");
    dn_pw(b, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1, "causal compare");
    dn_pw(b, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neginf, keep, y, -1, "causal select");
    return y;
}

/* s = band(x): keeps x where column (key) + W > row (query), else -inf: the left bound of a
 * sliding window of W keys (the causal mask is the right bound). A second select after the causal
 * one, on its own row/column indices, W a host FP32 scalar: the layout cuDNN's fused engines take
 * for a window (cudnn-frontend's composite diagonal band, left bound). x is [B,H,T,T] FP32. */
static cudnnBackendDescriptor_t dn_window(dn_builder *b, cudnnBackendDescriptor_t x, dn_dims sd,
                                          cudnnBackendDescriptor_t window, cudnnBackendDescriptor_t neginf) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t row = dn_virt(b, CUDNN_DATA_INT32, sd), col = dn_virt(b, CUDNN_DATA_INT32, sd);
    cudnnBackendDescriptor_t colw = dn_virt(b, f32, sd), keep = dn_virt(b, CUDNN_DATA_BOOLEAN, sd);
    cudnnBackendDescriptor_t y = dn_virt(b, f32, sd);
    dn_pw(b, CUDNN_POINTWISE_GEN_INDEX, f32, x, NULL, NULL, row, 2, "window row index");
    dn_pw(b, CUDNN_POINTWISE_GEN_INDEX, f32, x, NULL, NULL, col, 3, "window column index");
    dn_pw(b, CUDNN_POINTWISE_ADD, f32, col, window, NULL, colw, -1, "window column + W");
    dn_pw(b, CUDNN_POINTWISE_CMP_GT, CUDNN_DATA_BOOLEAN, colw, row, NULL, keep, -1, "window compare");
    dn_pw(b, CUDNN_POINTWISE_BINARY_SELECT, f32, x, neginf, keep, y, -1, "window select");
    return y;
}

/* s = mask(x) with one select: keeps x where row >= column and column + W > row (the causal and
 * the band compares joined by LOGICAL_AND), else -inf. x is [B,H,T,T] FP32. */
static cudnnBackendDescriptor_t dn_causal_band(dn_builder *b, cudnnBackendDescriptor_t x, dn_dims sd,
                                               const dn_io *io) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, bl = CUDNN_DATA_BOOLEAN;
    cudnnBackendDescriptor_t row = dn_virt(b, CUDNN_DATA_INT32, sd), col = dn_virt(b, CUDNN_DATA_INT32, sd);
    cudnnBackendDescriptor_t colw = dn_virt(b, f32, sd), causal = dn_virt(b, bl, sd), band = dn_virt(b, bl, sd);
    cudnnBackendDescriptor_t keep = dn_virt(b, bl, sd), y = dn_virt(b, f32, sd);
    dn_pw(b, CUDNN_POINTWISE_GEN_INDEX, f32, x, NULL, NULL, row, 2, "band row index");
    dn_pw(b, CUDNN_POINTWISE_GEN_INDEX, f32, x, NULL, NULL, col, 3, "band column index");
    dn_pw(b, CUDNN_POINTWISE_CMP_GE, bl, row, col, NULL, causal, -1, "band causal compare");
    dn_pw(b, CUDNN_POINTWISE_ADD, f32, col, io->window, NULL, colw, -1, "band column + W");
    dn_pw(b, CUDNN_POINTWISE_CMP_GT, bl, colw, row, NULL, band, -1, "band window compare");
    dn_pw(b, CUDNN_POINTWISE_LOGICAL_AND, bl, causal, band, NULL, keep, -1, "band and");
    dn_pw(b, CUDNN_POINTWISE_BINARY_SELECT, f32, x, io->neginf, keep, y, -1, "band select");
    return y;
}

/* Both masks of the shape on x: causal, then the window's left bound when W > 0, in the builder's
 * layout (dn_get tries the two-select one first, then the single select). */
static cudnnBackendDescriptor_t dn_mask(dn_builder *b, cudnnBackendDescriptor_t x, dn_dims sd, const dn_io *io) {
    if (io->window && b->band == 1) return dn_causal_band(b, x, sd, io);
    cudnnBackendDescriptor_t y = dn_causal(b, x, sd, io->neginf);
    return io->window ? dn_window(b, y, sd, io->window, io->neginf) : y;
}

/* s = cap tanh(x / cap) when the shape caps its scores (else x itself); *pre receives x / cap,
 * the tanh's input, which the backward's derivative reads. x is [B,H,T,T] FP32. */
static cudnnBackendDescriptor_t dn_softcap(dn_builder *b, cudnnBackendDescriptor_t x, dn_dims sd, const dn_io *io,
                                           cudnnBackendDescriptor_t *pre) {
    if (!io->cap) return x;
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t u = dn_virt(b, f32, sd), th = dn_virt(b, f32, sd), y = dn_virt(b, f32, sd);
    dn_pw(b, CUDNN_POINTWISE_DIV, f32, x, io->cap, NULL, u, -1, "softcap divide");
    dn_pw(b, CUDNN_POINTWISE_TANH_FWD, f32, u, NULL, NULL, th, -1, "softcap tanh");
    dn_pw(b, CUDNN_POINTWISE_MUL, f32, th, io->cap, NULL, y, -1, "softcap multiply");
    if (pre) *pre = u;
    return y;
}

/* Forward: S = scale Q·Kᵀ (capped: cap tanh(S / cap)), causal mask (and window), stats = max +
 * log(sum exp(S - max)), P = exp(S - max) / sum (BF16), O = P·V. */
static void dn_graph_fwd(dn_builder *b, const dw_attn_cudnn_shape *s) {
    const int64_t B = s->B, T = s->T, H = s->H;
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    dn_io io = dn_io_tensors(b, s, false);
    const dn_dims sd = dn_d(B, H, T, T, H * T * T, T * T, T, 1), rd = dn_d(B, H, T, 1, H * T, T, 1, 1);
    cudnnBackendDescriptor_t s0 = dn_virt(b, f32, sd), s1 = dn_virt(b, f32, sd);
    dn_matmul(b, io.q, io.kt, s0, "fwd Q·Kᵀ");
    dn_pw(b, CUDNN_POINTWISE_MUL, f32, s0, io.scale, NULL, s1, -1, "fwd scale");
    cudnnBackendDescriptor_t s2 = dn_mask(b, dn_softcap(b, s1, sd, &io, NULL), sd, &io);
    cudnnBackendDescriptor_t mx = dn_virt(b, f32, rd), sub = dn_virt(b, f32, sd), ex = dn_virt(b, f32, sd);
    cudnnBackendDescriptor_t sum = dn_virt(b, f32, rd), lg = dn_virt(b, f32, rd);
    cudnnBackendDescriptor_t p = dn_virt(b, CUDNN_DATA_BFLOAT16, sd);
    dn_reduce(b, CUDNN_REDUCE_TENSOR_MAX, s2, mx, "fwd row max");
    dn_pw(b, CUDNN_POINTWISE_SUB, f32, s2, mx, NULL, sub, -1, "fwd sub max");
    dn_pw(b, CUDNN_POINTWISE_EXP, f32, sub, NULL, NULL, ex, -1, "fwd exp");
    dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, ex, sum, "fwd row sum");
    dn_pw(b, CUDNN_POINTWISE_LOG, f32, sum, NULL, NULL, lg, -1, "fwd log");
    dn_pw(b, CUDNN_POINTWISE_ADD, f32, mx, lg, NULL, io.stats, -1, "fwd stats");
    dn_pw(b, CUDNN_POINTWISE_DIV, f32, ex, sum, NULL, p, -1, "fwd normalise");
    dn_matmul(b, p, io.v, io.o, "fwd P·V");
}

/* Backward (cuDNN 9's SDPA backward pattern):
 *   softsum = rowsum(dO ∘ O) (FP32, non-virtual: the caller's delta), E = exp(mask(cap(scale Q·Kᵀ) - stats))
 *   dV = Eᵀ·dO, dS = scale E ∘ (dO·Vᵀ - softsum) [∘ (1 - tanh²(S / cap)) when capped], dK = dSᵀ·Q, dQ = dS·K
 * GQA: dK, dV are computed per query head ([B,H,T,D]) and summed over each KV head's group.
 * dQ goes through an FP32 accumulator (U_DQACC, non-virtual) unless direct_dq. */
static void dn_graph_bwd(dn_builder *b, const dw_attn_cudnn_shape *s, bool direct_dq) {
    const int64_t B = s->B, T = s->T, H = s->H, G = s->Hkv, D = s->D;
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, bf = CUDNN_DATA_BFLOAT16;
    dn_io io = dn_io_tensors(b, s, true);
    const dn_dims sd = dn_d(B, H, T, T, H * T * T, T * T, T, 1), rd = dn_d(B, H, T, 1, H * T, T, 1, 1);
    const dn_dims sdt = dn_d(B, H, T, T, H * T * T, T * T, 1, T); /* [.., key, query] view */
    const dn_dims qd = dn_d(B, H, T, D, T * s->rq, D, s->rq, 1), kd = dn_d(B, G, T, D, T * s->rk, D, s->rk, 1);
    const dn_dims full = dn_d(B, H, T, D, H * T * D, T * D, D, 1);
    cudnnBackendDescriptor_t d_o = dn_tensor(b, U_DO, bf, dn_d(B, H, T, D, T * H * D, D, H * D, 1), false);
    cudnnBackendDescriptor_t dq = dn_tensor(b, U_DQ, bf, qd, false);
    cudnnBackendDescriptor_t dk = dn_tensor(b, U_DK, bf, kd, false), dv = dn_tensor(b, U_DV, bf, kd, false);
    cudnnBackendDescriptor_t one = dn_tensor(b, U_ONE, f32, dn_d(1, 1, 1, 1, 1, 1, 1, 1), true);
    /* softsum = rowsum(dO ∘ O) · 1 */
    cudnnBackendDescriptor_t doo = dn_virt(b, f32, dn_d(B, H, T, D, H * T * D, T * D, H * D, 1));
    cudnnBackendDescriptor_t dsum = dn_virt(b, f32, rd), softsum = dn_tensor(b, U_SOFTSUM, f32, rd, false);
    dn_pw(b, CUDNN_POINTWISE_MUL, f32, d_o, io.o, NULL, doo, -1, "bwd dO∘O");
    dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, doo, dsum, "bwd rowsum dO∘O");
    dn_pw(b, CUDNN_POINTWISE_MUL, f32, dsum, one, NULL, softsum, -1, "bwd softmax sum");
    /* E = exp(mask(scale Q·Kᵀ - stats)) */
    cudnnBackendDescriptor_t s0 = dn_virt(b, f32, sd), s1 = dn_virt(b, f32, sd), s2 = dn_virt(b, f32, sd);
    cudnnBackendDescriptor_t pre = NULL; /* S / cap, when capped */
    dn_matmul(b, io.q, io.kt, s0, "bwd Q·Kᵀ");
    dn_pw(b, CUDNN_POINTWISE_MUL, f32, s0, io.scale, NULL, s1, -1, "bwd scale");
    /* capped: the masks follow the cap before the stats, where cudnn-frontend's score modifiers
     * (which carry their own masks) sit; else after them, as cuDNN's plain SDPA pattern has it */
    cudnnBackendDescriptor_t sc = dn_softcap(b, s1, sd, &io, &pre);
    if (io.cap) sc = dn_mask(b, sc, sd, &io);
    dn_pw(b, CUDNN_POINTWISE_SUB, f32, sc, io.stats, NULL, s2, -1, "bwd sub stats");
    cudnnBackendDescriptor_t s3 = io.cap ? s2 : dn_mask(b, s2, sd, &io), e = dn_virt(b, f32, sd);
    dn_pw(b, CUDNN_POINTWISE_EXP, f32, s3, NULL, NULL, e, -1, "bwd exp");
    /* dV = Eᵀ·dO */
    cudnnBackendDescriptor_t et = dn_virt(b, bf, sdt);
    dn_reshape(b, e, et, "bwd Eᵀ");
    if (H == G) {
        dn_matmul(b, et, d_o, dv, "bwd Eᵀ·dO");
    } else {
        cudnnBackendDescriptor_t dvf = dn_virt(b, bf, full);
        dn_matmul(b, et, d_o, dvf, "bwd Eᵀ·dO");
        dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, dvf, dv, "bwd dV head sum");
    }
    /* dS = scale E ∘ (dO·Vᵀ - softsum); capped: the tanh's derivative first, as
     * (cap (E ∘ (...))) tanh'(S / cap) / cap */
    cudnnBackendDescriptor_t dp = dn_virt(b, f32, sd), dp1 = dn_virt(b, f32, sd), dp2 = dn_virt(b, f32, sd);
    cudnnBackendDescriptor_t ds = dn_virt(b, f32, sd);
    dn_matmul(b, d_o, io.v, dp, "bwd dO·Vᵀ");
    dn_pw(b, CUDNN_POINTWISE_SUB, f32, dp, softsum, NULL, dp1, -1, "bwd sub softmax sum");
    dn_pw(b, CUDNN_POINTWISE_MUL, f32, dp1, e, NULL, dp2, -1, "bwd mul E");
    if (io.cap) {
        cudnnBackendDescriptor_t m = dn_virt(b, f32, sd), dt = dn_virt(b, f32, sd), dc = dn_virt(b, f32, sd);
        dn_pw(b, CUDNN_POINTWISE_MUL, f32, dp2, io.cap, NULL, m, -1, "bwd softcap multiply");
        dn_pw_bwd(b, CUDNN_POINTWISE_TANH_BWD, f32, pre, m, dt, "bwd softcap tanh'");
        dn_pw(b, CUDNN_POINTWISE_DIV, f32, dt, io.cap, NULL, dc, -1, "bwd softcap divide");
        dp2 = dc;
    }
    dn_pw(b, CUDNN_POINTWISE_MUL, f32, dp2, io.scale, NULL, ds, -1, "bwd dS scale");
    /* dK = dSᵀ·Q */
    cudnnBackendDescriptor_t dst = dn_virt(b, bf, sdt);
    dn_reshape(b, ds, dst, "bwd dSᵀ");
    if (H == G) {
        dn_matmul(b, dst, io.q, dk, "bwd dSᵀ·Q");
    } else {
        cudnnBackendDescriptor_t dkf = dn_virt(b, bf, full);
        dn_matmul(b, dst, io.q, dkf, "bwd dSᵀ·Q");
        dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, dkf, dk, "bwd dK head sum");
    }
    /* dQ = dS·K (K back from Kᵀ through a reshape) */
    cudnnBackendDescriptor_t k = dn_virt(b, bf, kd);
    dn_reshape(b, io.kt, k, "bwd K");
    if (direct_dq) {
        dn_matmul(b, ds, k, dq, "bwd dS·K");
    } else {
        cudnnBackendDescriptor_t acc = dn_tensor(b, U_DQACC, f32, full, false);
        dn_matmul(b, ds, k, acc, "bwd dS·K");
        dn_pw(b, CUDNN_POINTWISE_IDENTITY, f32, acc, NULL, NULL, dq, -1, "bwd dQ convert");
    }
}

/* ---- plans ------------------------------------------------------------------------------------- */
typedef struct {
    bool used, ok, bwd, direct_dq;
    dw_attn_cudnn_shape sh;
    dn_builder *b; /* owns every descriptor, including the plan's */
    cudnnBackendDescriptor_t plan;
    void *ws;      /* cuDNN workspace */
    int64_t ws_bytes;
    float *dqacc;  /* backward: FP32 dQ accumulator [B,H,T,D] */
    int64_t engine;
} dn_plan;

enum { DN_MAX_PLANS = 64 }; /* no eviction: a captured CUDA graph may hold a plan's workspace */
static dn_plan dn_plans[DN_MAX_PLANS];

static bool dn_direct_dq(void) {
    const char *env = dw_env("DW_ATTN_CUDNN_DQ");
    return env && !strcmp(env, "direct");
}

/* Finalizes the operation graph and the first engine config of the heuristics (mode A, then the
 * fallback list) that gives a plan. */
static void dn_make_plan(dn_builder *b, dn_plan *p) {
    cudnnBackendDescriptor_t g = dn_new(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    dn_set(b, g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &dn_handle, "operation graph handle");
    dn_set(b, g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b->n_ops, b->ops, "operation graph ops");
    dn_fin(b, g, "operation graph finalize");
    static const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    char tried[384] = "";
    for (int m = 0; m < 2 && !b->failed; m++) {
        cudnnBackendDescriptor_t h = dn_new(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
        dn_set(b, h, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g, "heuristics graph");
        dn_set(b, h, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m], "heuristics mode");
        dn_fin(b, h, "heuristics finalize");
        enum { NCFG = 8 };
        cudnnBackendDescriptor_t cfg[NCFG];
        for (int i = 0; i < NCFG; i++) cfg[i] = dn_new(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
        if (b->failed) return;
        int64_t n = 0;
        cudnnStatus_t st = dn.get_attr(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, NCFG, &n, cfg);
        if (st != CUDNN_STATUS_SUCCESS) {
            snprintf(tried + strlen(tried), sizeof tried - strlen(tried), "[heuristics %d: %s] ", m, dn.err_str(st));
            continue;
        }
        for (int64_t i = 0; i < n; i++) {
            cudnnBackendDescriptor_t plan = NULL;
            if (dn.desc_create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS) break;
            st = dn.set_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &dn_handle);
            if (st == CUDNN_STATUS_SUCCESS)
                st = dn.set_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &cfg[i]);
            if (st == CUDNN_STATUS_SUCCESS) st = dn.finalize(plan);
            int64_t ws = 0, cnt = 0;
            if (st == CUDNN_STATUS_SUCCESS)
                st = dn.get_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &ws);
            if (st != CUDNN_STATUS_SUCCESS) {
                char last[160] = "";
                dn.last_err(last, sizeof last);
                snprintf(tried + strlen(tried), sizeof tried - strlen(tried), "[config %d.%lld: %s %s] ", m,
                         (long long)i, dn.err_str(st), last);
                dn.desc_destroy(plan);
                continue;
            }
            /* the engine's global index, for the log */
            cudnnBackendDescriptor_t eng = NULL;
            if (dn.desc_create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
                if (dn.get_attr(cfg[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt, &eng) ==
                    CUDNN_STATUS_SUCCESS)
                    dn.get_attr(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, &p->engine);
                dn.desc_destroy(eng);
            }
            if (b->n_own < DN_MAX_DESC) b->own[b->n_own++] = plan; /* else kept for the process */
            p->plan = plan;
            p->ws_bytes = ws;
            return;
        }
    }
    if (!b->failed) {
        b->failed = true;
        snprintf(b->err, sizeof b->err, "no engine takes the graph: %s", tried[0] ? tried : "heuristics gave none");
    }
}

static bool dn_same(const dw_attn_cudnn_shape *a, const dw_attn_cudnn_shape *b) {
    return a->B == b->B && a->T == b->T && a->H == b->H && a->Hkv == b->Hkv && a->D == b->D && a->rq == b->rq &&
           a->rk == b->rk && a->W == b->W && a->cap == b->cap;
}

static bool dn_masked(const dw_attn_cudnn_shape *sh) { return sh->W > 0 || sh->cap > 0; }

/* "B=.. T=.. H=.. Hkv=.. D=..[ window W][ cap c]" for messages */
static const char *dn_shape_str(const dw_attn_cudnn_shape *sh, char *buf, size_t n) {
    int k = snprintf(buf, n, "B=%lld T=%lld H=%lld Hkv=%lld D=%lld", (long long)sh->B, (long long)sh->T,
                     (long long)sh->H, (long long)sh->Hkv, (long long)sh->D);
    if (sh->W > 0 && k > 0 && (size_t)k < n) k += snprintf(buf + k, n - (size_t)k, " window %lld", (long long)sh->W);
    if (sh->cap > 0 && k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, " cap %g", (double)sh->cap);
    return buf;
}

/* The cached plan of (shape, direction), building it when allowed. NULL (reason in dn_why) when
 * it cannot run. dn_mutex held. */
static dn_plan *dn_get(const dw_attn_cudnn_shape *sh, bool bwd, bool may_build) {
    const bool direct = bwd && dn_direct_dq();
    for (int i = 0; i < DN_MAX_PLANS; i++) {
        dn_plan *p = &dn_plans[i];
        if (p->used && p->bwd == bwd && p->direct_dq == direct && dn_same(&p->sh, sh)) {
            if (!p->ok) snprintf(dn_why, sizeof dn_why, "cuDNN %s plan failed earlier: %s", bwd ? "backward" : "forward",
                                 p->b ? p->b->err : "?");
            return p->ok ? p : NULL;
        }
    }
    if (!may_build) {
        snprintf(dn_why, sizeof dn_why, "cuDNN plan not built and the stream is capturing");
        return NULL;
    }
    dn_plan *p = NULL;
    for (int i = 0; i < DN_MAX_PLANS && !p; i++)
        if (!dn_plans[i].used) p = &dn_plans[i];
    if (!p) {
        snprintf(dn_why, sizeof dn_why, "cuDNN plan cache full (%d shapes)", DN_MAX_PLANS);
        return NULL;
    }
    memset(p, 0, sizeof *p);
    p->used = true, p->bwd = bwd, p->direct_dq = direct, p->sh = *sh, p->engine = -1;
    p->b = calloc(1, sizeof *p->b);
    if (!p->b) {
        snprintf(dn_why, sizeof dn_why, "out of host memory building a cuDNN plan");
        p->used = false;
        return NULL;
    }
    dn_builder *b = p->b;
    /* a window: the two-select layout (cudnn-frontend's), then the single AND select */
    char err0[sizeof b->err] = "";
    for (int band = 0; band < (sh->W > 0 ? 2 : 1); band++) {
        if (band) {
            snprintf(err0, sizeof err0, "%s", b->err);
            dn_free(b);
            memset(b, 0, sizeof *b);
        }
        b->next_uid = 100, b->band = band;
        if (bwd) dn_graph_bwd(b, sh, direct);
        else dn_graph_fwd(b, sh);
        if (!b->failed) dn_make_plan(b, p);
        if (!b->failed) break;
    }
    const size_t acc = bwd && !direct ? (size_t)(sh->B * sh->H * sh->T * sh->D) * sizeof(float) : 0;
    if (!b->failed && p->ws_bytes > 0 && cudaMalloc(&p->ws, (size_t)p->ws_bytes) != cudaSuccess) {
        b->failed = true;
        snprintf(b->err, sizeof b->err, "cudaMalloc of a %lld-byte workspace failed", (long long)p->ws_bytes);
    }
    if (!b->failed && acc && cudaMalloc((void **)&p->dqacc, acc) != cudaSuccess) {
        b->failed = true;
        snprintf(b->err, sizeof b->err, "cudaMalloc of a %zu-byte dQ accumulator failed", acc);
    }
    const char *dir = bwd ? "backward" : "forward";
    if (b->failed) {
        (void)cudaGetLastError();
        if (p->ws) cudaFree(p->ws);
        if (p->dqacc) cudaFree(p->dqacc);
        p->ws = NULL, p->dqacc = NULL;
        dn_free(b); /* keeps b->err */
        char shs[160];
        snprintf(dn_why, sizeof dn_why, "cuDNN %lld %s plan (%s): %s%s%s", (long long)dn_ver, dir,
                 dn_shape_str(sh, shs, sizeof shs), err0[0] ? "window as two selects: " : "", err0,
                 err0[0] ? "; as one select: " : "");
        snprintf(dn_why + strlen(dn_why), sizeof dn_why - strlen(dn_why), "%s", b->err);
        /* a masked graph this cuDNN does not fuse is an expected decline (the mma kernels run it) */
        if (dn_masked(sh)) DW_LOGD("attention: %s", dn_why);
        else DW_LOGW("attention: %s", dn_why);
        return NULL;
    }
    p->ok = true;
    char shs[160];
    DW_LOGI("attention: cuDNN %lld %s plan (%s%s%s): engine %lld, workspace %lld bytes, dQ accumulator %zu bytes",
            (long long)dn_ver, dir, dn_shape_str(sh, shs, sizeof shs), direct ? ", direct dQ" : "",
            sh->W > 0 ? (b->band ? ", window as one select" : ", window as two selects") : "", (long long)p->engine,
            (long long)p->ws_bytes, acc);
    return p;
}

/* The shape as plans are keyed: a window of at least T keys is the causal mask alone. */
static dw_attn_cudnn_shape dn_key(const dw_attn_cudnn_shape *sh) {
    dw_attn_cudnn_shape k = *sh;
    if (k.W >= k.T || k.W < 0) k.W = 0;
    if (!(k.cap > 0)) k.cap = 0;
    return k;
}

/* Whether cuDNN can take this shape and these pointers at all (before any plan); the loaded
 * version must fuse its mask: a window from 9.2 (the left-bound band), a cap from 9.4 (score
 * modifiers, runtime-compiled engines). Declines are logged at debug. */
static bool dn_shape_ok(const dw_attn_cudnn_shape *sh, const void *const *ptrs, int n) {
    if (sh->D > 128 || sh->D % 8 || sh->rq % 8 || sh->rk % 8 || sh->H % sh->Hkv) {
        snprintf(dn_why, sizeof dn_why, "cuDNN attention needs D <= 128 and D, strides multiples of 8 (D=%lld)",
                 (long long)sh->D);
        return false;
    }
    const int64_t need = sh->cap > 0 ? 90400 : sh->W > 0 ? 90200 : 0;
    if (dn_ver < need) {
        snprintf(dn_why, sizeof dn_why, "cuDNN %lld cannot fuse %s (needs %lld.%lld)", (long long)dn_ver,
                 sh->cap > 0 ? "soft-capped scores" : "a sliding window", (long long)need / 10000,
                 (long long)need / 100 % 100);
        DW_LOGD("attention: %s: the mma kernels run it", dn_why);
        return false;
    }
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ptrs[i] % 16) {
            snprintf(dn_why, sizeof dn_why, "cuDNN attention needs 16-byte aligned tensors");
            return false;
        }
    return true;
}

/* The plan for a call: library loaded, shape ok, plan cached or buildable (not capturing). sh is
 * already the key (dn_key). */
static dn_plan *dn_for_call(const dw_attn_cudnn_shape *sh, bool bwd, const void *const *ptrs, int n, void *stream) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        cs = cudaStreamCaptureStatusActive; /* unknown: do not build */
    }
    pthread_mutex_lock(&dn_mutex);
    dn_plan *p = NULL;
    if (cs == cudaStreamCaptureStatusNone ? dn_init() : dn_state > 0) {
        if (dn_shape_ok(sh, ptrs, n)) p = dn_get(sh, bwd, cs == cudaStreamCaptureStatusNone);
    } else if (!dn_state) {
        snprintf(dn_why, sizeof dn_why, "cuDNN not loaded yet and the stream is capturing");
    }
    pthread_mutex_unlock(&dn_mutex);
    return p;
}

/* Builds the variant pack and executes. */
static dw_status dn_run(dw_ctx *ctx, dn_plan *p, const int64_t *uids, void *const *ptrs, int n, void *stream,
                        const char *op) {
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t st = dn.set_stream(dn_handle, (cudaStream_t)stream);
    if (st == CUDNN_STATUS_SUCCESS) st = dn.desc_create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = dn.set_attr(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = dn.set_attr(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = dn.set_attr(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &p->ws);
    if (st == CUDNN_STATUS_SUCCESS) st = dn.finalize(vp);
    if (st == CUDNN_STATUS_SUCCESS) st = dn.execute(dn_handle, p->plan, vp);
    if (vp) dn.desc_destroy(vp);
    if (st != CUDNN_STATUS_SUCCESS) {
        char last[256] = "";
        dn.last_err(last, sizeof last);
        char shs[160];
        return dw_set_error(ctx, DW_ERR_CUDA, "%s (cuDNN, %s): %s %s", op, dn_shape_str(&p->sh, shs, sizeof shs),
                            dn.err_str(st), last);
    }
    return DW_OK;
}

/* -inf for the mask; cuDNN before 9.10 wants the lowest finite float instead */
static float dn_neginf(void) { return dn_ver < 91000 ? -3.402823466e38f : -INFINITY; }

/* executes that ran: [bwd][masked] */
static int64_t dn_calls[2][2];

/* The host scalars both directions pass: scale, -inf, and the window and cap where the plan has
 * them, appended to uids/ptrs from *n on. vals must outlive the execute. */
typedef struct {
    float scale, ninf, window, cap, one;
} dn_scalars;
static void dn_add_scalars(const dw_attn_cudnn_shape *sh, dn_scalars *vals, int64_t *uids, void **ptrs, int *n) {
    vals->scale = (float)(1.0 / sqrt((double)sh->D)), vals->ninf = dn_neginf();
    vals->window = (float)sh->W, vals->cap = sh->cap, vals->one = 1.0f;
    uids[*n] = U_SCALE, ptrs[(*n)++] = &vals->scale;
    uids[*n] = U_NEGINF, ptrs[(*n)++] = &vals->ninf;
    if (sh->W > 0) uids[*n] = U_WINDOW, ptrs[(*n)++] = &vals->window;
    if (sh->cap > 0) uids[*n] = U_CAP, ptrs[(*n)++] = &vals->cap;
}

dw_status dw_attn_cudnn_fwd(dw_ctx *ctx, bool *ran, void *out, float *lse, const void *q, const void *k,
                            const void *v, const dw_attn_cudnn_shape *shape, void *stream) {
    *ran = false;
    const dw_attn_cudnn_shape key = dn_key(shape), *sh = &key;
    const void *ptrs[] = {out, lse, q, k, v};
    dn_plan *p = dn_for_call(sh, false, ptrs, 5, stream);
    if (!p) return DW_OK;
    dn_scalars vals;
    int64_t uids[9] = {U_Q, U_K, U_V, U_O, U_STATS};
    void *dp[9] = {(void *)q, (void *)k, (void *)v, out, lse};
    int n = 5;
    dn_add_scalars(sh, &vals, uids, dp, &n);
    DW_TRY(dn_run(ctx, p, uids, dp, n, stream, "attention_fwd"));
    dn_calls[0][dn_masked(sh)]++;
    *ran = true;
    return DW_OK;
}

dw_status dw_attn_cudnn_bwd(dw_ctx *ctx, bool *ran, void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const void *out, const float *lse, float *delta,
                            const dw_attn_cudnn_shape *shape, void *stream) {
    *ran = false;
    const dw_attn_cudnn_shape key = dn_key(shape), *sh = &key;
    const void *ptrs[] = {dq, dk, dv, dout, q, k, v, out, lse, delta};
    dn_plan *p = dn_for_call(sh, true, ptrs, 10, stream);
    if (!p) return DW_OK;
    if (p->dqacc && dn_ver < 90600) /* older cuDNN leaves zeroing the accumulator to the caller */
        DW_CUDA_CHECK(ctx, cudaMemsetAsync(p->dqacc, 0, (size_t)(sh->B * sh->H * sh->T * sh->D) * sizeof(float),
                                           (cudaStream_t)stream));
    dn_scalars vals;
    int64_t uids[16] = {U_Q, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV, U_SOFTSUM, U_ONE};
    void *dp[16] = {(void *)q, (void *)k, (void *)v, (void *)out, (void *)lse, (void *)dout, dq, dk, dv, delta,
                    &vals.one};
    int n = 11;
    dn_add_scalars(sh, &vals, uids, dp, &n);
    if (p->dqacc) uids[n] = U_DQACC, dp[n++] = p->dqacc;
    DW_TRY(dn_run(ctx, p, uids, dp, n, stream, "attention_bwd"));
    dn_calls[1][dn_masked(sh)]++;
    *ran = true;
    return DW_OK;
}

bool dw_attn_cudnn_prepare(const dw_attn_cudnn_shape *shape) {
    const dw_attn_cudnn_shape key = dn_key(shape), *sh = &key;
    pthread_mutex_lock(&dn_mutex);
    bool ok = dn_init() && dn_shape_ok(sh, NULL, 0) && dn_get(sh, false, true) && dn_get(sh, true, true);
    pthread_mutex_unlock(&dn_mutex);
    return ok;
}

int64_t dw_attn_cudnn_calls(bool bwd, bool masked) { return dn_calls[bwd][masked]; }

const char *dw_attn_cudnn_why(void) { return dn_why; }

int64_t dw_attn_cudnn_version(void) {
    pthread_mutex_lock(&dn_mutex);
    dn_init();
    pthread_mutex_unlock(&dn_mutex);
    return dn_state > 0 ? dn_ver : 0;
}

size_t dw_attn_cudnn_device_bytes(int *n_plans) {
    size_t bytes = 0;
    int n = 0;
    pthread_mutex_lock(&dn_mutex);
    for (int i = 0; i < DN_MAX_PLANS; i++) {
        const dn_plan *p = &dn_plans[i];
        if (!p->used || !p->ok) continue;
        n++;
        bytes += (size_t)p->ws_bytes;
        if (p->dqacc) bytes += (size_t)(p->sh.B * p->sh.H * p->sh.T * p->sh.D) * sizeof(float);
    }
    pthread_mutex_unlock(&dn_mutex);
    if (n_plans) *n_plans = n;
    return bytes;
}

#else /* no cuDNN headers (or no CUDA) at build time: always decline */

static const char *dn_stub_why = "cuDNN not built in (no cudnn_graph.h at configure time)";

dw_status dw_attn_cudnn_fwd(dw_ctx *ctx, bool *ran, void *out, float *lse, const void *q, const void *k,
                            const void *v, const dw_attn_cudnn_shape *sh, void *stream) {
    (void)ctx, (void)out, (void)lse, (void)q, (void)k, (void)v, (void)sh, (void)stream;
    *ran = false;
    return DW_OK;
}
dw_status dw_attn_cudnn_bwd(dw_ctx *ctx, bool *ran, void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const void *out, const float *lse, float *delta,
                            const dw_attn_cudnn_shape *sh, void *stream) {
    (void)ctx, (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse;
    (void)delta, (void)sh, (void)stream;
    *ran = false;
    return DW_OK;
}
bool dw_attn_cudnn_prepare(const dw_attn_cudnn_shape *sh) {
    (void)sh;
    return false;
}
const char *dw_attn_cudnn_why(void) { return dn_stub_why; }
int64_t dw_attn_cudnn_version(void) { return 0; }
int64_t dw_attn_cudnn_calls(bool bwd, bool masked) {
    (void)bwd, (void)masked;
    return 0;
}
size_t dw_attn_cudnn_device_bytes(int *n_plans) {
    if (n_plans) *n_plans = 0;
    return 0;
}

#endif
