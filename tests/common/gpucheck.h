/* gpucheck.h — header-only helpers for the GPU op tests, in the style of ggml's test-backend-ops:
 * device tensors with guard bands (a byte pattern before and after every buffer, checked after
 * each op for out-of-bounds writes), NaN poisoning of outputs, FP32/BF16 upload and download, and
 * comparisons against the CPU reference that name the op, shape, worst error and first bad index.
 * Needs the CUDA runtime; only the GPU tests include it. */
#ifndef DW_GPUCHECK_H
#define DW_GPUCHECK_H

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/ops_cuda.h"
#include "opcheck.h"

#define DW_GC_GUARD 512 /* bytes before and after every buffer; keeps 256-byte alignment */
#define DW_GC_GUARD_BYTE 0xA5
#define DW_GC_MAX_TENSORS 64

/* Aborts the test binary with the failing call and its location: a CUDA error here is a broken
 * machine or a crashed kernel, after which no later check is meaningful. */
#define DW_GC_CUDA(stmt)                                                                       \
    do {                                                                                       \
        cudaError_t e_ = (stmt);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #stmt, __FILE__, __LINE__,         \
                    cudaGetErrorString(e_));                                                   \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* BF16 with round-to-nearest-even (NaN stays NaN), as __float2bfloat16_rn. */
static inline uint16_t dw_gc_f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float dw_gc_bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline const char *dw_gc_dtname(dw_act_dtype dt) { return dt == DW_ACT_BF16 ? "bf16" : "f32"; }

/* Set-up copies and memsets run on the legacy default stream, which does not order with the
 * tests' non-blocking stream: every helper that writes device memory synchronises the device
 * before returning, so an op never races with its own inputs or poison. */

/* A device tensor: n elements of FP32 or BF16 with guard bands; host holds the FP32 values the
 * device holds (for BF16, already rounded), so the CPU reference sees exactly the device input. */
typedef struct {
    const char *name;
    int64_t n;
    dw_act_dtype dt;
    float *host;
    unsigned char *base; /* device allocation including the guards */
    void *dev;           /* base + DW_GC_GUARD */
    size_t bytes;
} dw_gt;

static dw_gt *dw_gc_live[DW_GC_MAX_TENSORS];
static int dw_gc_nlive;

static inline dw_gt *dw_gt_new(const char *name, int64_t n, dw_act_dtype dt) {
    dw_gt *t = calloc(1, sizeof *t);
    if (!t || dw_gc_nlive >= DW_GC_MAX_TENSORS) abort();
    t->name = name;
    t->n = n;
    t->dt = dt;
    t->bytes = (size_t)n * (size_t)dw_act_size(dt);
    t->host = dw_oc_alloc(n);
    DW_GC_CUDA(cudaMalloc((void **)&t->base, t->bytes + 2 * DW_GC_GUARD));
    DW_GC_CUDA(cudaMemset(t->base, DW_GC_GUARD_BYTE, t->bytes + 2 * DW_GC_GUARD));
    t->dev = t->base + DW_GC_GUARD;
    dw_gc_live[dw_gc_nlive++] = t;
    DW_GC_CUDA(cudaDeviceSynchronize());
    return t;
}

/* Sets host values (rounded to the storage type) and uploads them. */
static inline void dw_gt_upload(dw_gt *t) {
    if (t->dt == DW_ACT_BF16) {
        uint16_t *h = malloc((size_t)(t->n > 0 ? t->n : 1) * 2);
        if (!h) abort();
        for (int64_t i = 0; i < t->n; i++) {
            h[i] = dw_gc_f2bf(t->host[i]);
            t->host[i] = dw_gc_bf2f(h[i]);
        }
        DW_GC_CUDA(cudaMemcpy(t->dev, h, t->bytes, cudaMemcpyHostToDevice));
        free(h);
    } else {
        DW_GC_CUDA(cudaMemcpy(t->dev, t->host, t->bytes, cudaMemcpyHostToDevice));
    }
    DW_GC_CUDA(cudaDeviceSynchronize());
}
static inline dw_gt *dw_gt_rand(dw_test_rng *r, const char *name, int64_t n, dw_act_dtype dt,
                                float lo, float hi) {
    dw_gt *t = dw_gt_new(name, n, dt);
    dw_oc_fill(r, t->host, n, lo, hi);
    dw_gt_upload(t);
    return t;
}
/* n int32 values (tokens, targets) in a guarded device buffer; host floats are unused. */
static inline dw_gt *dw_gt_ints(const char *name, const int32_t *v, int64_t n) {
    dw_gt *t = dw_gt_new(name, n, DW_ACT_F32); /* 4-byte elements */
    DW_GC_CUDA(cudaMemcpy(t->dev, v, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
    DW_GC_CUDA(cudaDeviceSynchronize());
    return t;
}
/* FP32 tensor holding a copy of values (a prior for accumulated gradients, a saved statistic). */
static inline dw_gt *dw_gt_from(const char *name, const float *v, int64_t n, dw_act_dtype dt) {
    dw_gt *t = dw_gt_new(name, n, dt);
    memcpy(t->host, v, (size_t)n * sizeof(float));
    dw_gt_upload(t);
    return t;
}
/* An output: device filled with 0xFF bytes (NaN in FP32 and BF16), host with NaN. */
static inline dw_gt *dw_gt_out(const char *name, int64_t n, dw_act_dtype dt) {
    dw_gt *t = dw_gt_new(name, n, dt);
    for (int64_t i = 0; i < n; i++) t->host[i] = NAN;
    DW_GC_CUDA(cudaMemset(t->dev, 0xFF, t->bytes));
    DW_GC_CUDA(cudaDeviceSynchronize());
    return t;
}
/* Device -> FP32 array dst (n elements). */
static inline void dw_gt_download(const dw_gt *t, float *dst) {
    if (t->dt == DW_ACT_BF16) {
        uint16_t *h = malloc((size_t)(t->n > 0 ? t->n : 1) * 2);
        if (!h) abort();
        DW_GC_CUDA(cudaMemcpy(h, t->dev, t->bytes, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < t->n; i++) dst[i] = dw_gc_bf2f(h[i]);
        free(h);
    } else {
        DW_GC_CUDA(cudaMemcpy(dst, t->dev, t->bytes, cudaMemcpyDeviceToHost));
    }
}

/* Checks the guard bands of every live tensor; prints the op, tensor and first corrupted byte. */
static inline int dw_gc_guards_ok(const char *op) {
    int ok = 1;
    unsigned char *h = malloc(DW_GC_GUARD);
    if (!h) abort();
    for (int i = 0; i < dw_gc_nlive; i++) {
        const dw_gt *t = dw_gc_live[i];
        for (int side = 0; side < 2; side++) {
            const unsigned char *src = side ? t->base + DW_GC_GUARD + t->bytes : t->base;
            DW_GC_CUDA(cudaMemcpy(h, src, DW_GC_GUARD, cudaMemcpyDeviceToHost));
            for (int b = 0; b < DW_GC_GUARD; b++)
                if (h[b] != DW_GC_GUARD_BYTE) {
                    fprintf(stderr, "OUT-OF-BOUNDS WRITE %s: tensor %s, guard %s the buffer, byte %d "
                                    "%s it (0x%02x)\n", op, t->name, side ? "after" : "before",
                            side ? b : DW_GC_GUARD - b, side ? "past the end of" : "before", h[b]);
                    ok = 0;
                    break;
                }
        }
    }
    free(h);
    return ok;
}

/* Frees every live tensor. */
static inline void dw_gc_free_all(void) {
    for (int i = 0; i < dw_gc_nlive; i++) {
        cudaFree(dw_gc_live[i]->base);
        free(dw_gc_live[i]->host);
        free(dw_gc_live[i]);
    }
    dw_gc_nlive = 0;
}

/* Tolerance of a comparison: |gpu - cpu| <= abs + atol * max|cpu| + rtol * |cpu|. `abs` is for
 * results that cancel (gelu's 1 + tanh for x << 0, a norm's dx = rstd (g - projection)): their
 * error scales with the terms, not with the result. BF16 activations: the same BF16 inputs on
 * both sides and one BF16 rounding of the output after FP32 compute, which may land on the
 * neighbouring BF16 value: 2 BF16 ulps relative, 1e-4 of the max absolute. */
typedef struct {
    double atol, rtol, abs;
} dw_gc_tol;
static const dw_gc_tol DW_GC_TOL_BF16 = {1e-4, 8e-3, 0.0};
static inline dw_gc_tol dw_gc_pick(dw_act_dtype dt, double atol, double rtol) {
    return dt == DW_ACT_BF16 ? DW_GC_TOL_BF16 : (dw_gc_tol){atol, rtol, 0.0};
}

/* Downloads t and compares it with want (FP32, n = t->n) within tl; a NaN on one side only fails.
 * Prints the NMSE with a mismatch. Returns the bad count. */
static inline int64_t dw_gc_compare(const char *op, const dw_gt *t, const float *want,
                                    dw_gc_tol tl) {
    float *got = dw_oc_alloc(t->n);
    dw_gt_download(t, got);
    double *w = dw_oc_to_double(want, t->n);
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < t->n; i++) {
        num += ((double)got[i] - w[i]) * ((double)got[i] - w[i]);
        den += w[i] * w[i];
    }
    const int64_t bad = dw_oc_compare(op, t->name, got, w, t->n,
                                      tl.abs + tl.atol * dw_oc_maxabs(w, t->n) + 1e-30, tl.rtol);
    if (bad) fprintf(stderr, "  %s %s: NMSE %.3g\n", op, t->name, den > 0 ? num / den : num);
    free(w);
    free(got);
    return bad;
}

/* The stream every GPU test runs its ops on (non-blocking, so a kernel that ignored the stream
 * argument would race with the checks). dw_gc_init: cmocka group setup; fails without a GPU. */
static cudaStream_t dw_gc_stream;
static inline int dw_gc_init(void **state) {
    (void)state;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "no CUDA device: the GPU op tests need one\n");
        return -1;
    }
    DW_GC_CUDA(cudaStreamCreateWithFlags(&dw_gc_stream, cudaStreamNonBlocking));
    return 0;
}
static inline int dw_gc_fini(void **state) {
    (void)state;
    cudaStreamDestroy(dw_gc_stream);
    return 0;
}

/* Runs a GPU entry; a non-OK status counts as a failure and prints the op and the message. */
#define DW_GC_OK(bad, name, call)                                                              \
    do {                                                                                       \
        dw_status s_ = (call);                                                                 \
        if (s_ != DW_OK) {                                                                     \
            fprintf(stderr, "%s: %s returned %s: %s\n", (name), #call, dw_status_name(s_),     \
                    dw_errmsg(NULL));                                                          \
            (bad)++;                                                                           \
        }                                                                                      \
    } while (0)
#define DW_GC_SYNC() DW_GC_CUDA(cudaStreamSynchronize(dw_gc_stream))
/* bad += mismatches of device tensor t against want with tolerance tl (a dw_gc_tol) */
#define DW_GC_CMP(bad, name, t, want, tl) ((bad) += dw_gc_compare((name), (t), (want), (tl)))

#endif /* DW_GPUCHECK_H */
