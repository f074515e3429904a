/* quant.c — deepwell.h's dw_bench_quant (`deepwell bench quant`): times the CUDA quantisation
 * kernels (kernels/cuda/quant.h) on a random BF16 [rows, cols] tensor — mxfp8 and fp8_block,
 * without and with the transposed copy — against a device-to-device copy of the input timed the
 * same way in the same run. CUDA runtime calls only behind DW_HAVE_CUDA. Not a correctness test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/sized.h"
#include "formats/formats.h"

static const dw_bench_quant_opts QUANT_DEFAULTS = {.size = sizeof(dw_bench_quant_opts), .rows = 8192, .cols = 8192,
                                                   .iters = 50, .batch = 10};

void dw_bench_quant_opts_init(dw_bench_quant_opts *o, size_t size) {
    if (o) dw_sized_init(o, size, &QUANT_DEFAULTS, sizeof QUANT_DEFAULTS);
}

static dw_status read_opts(dw_ctx *ctx, const dw_bench_quant_opts *pub, dw_bench_quant_opts *o) {
    *o = QUANT_DEFAULTS;
    if (!pub) return dw_set_error(ctx, DW_ERR_INVALID, "bench quant: NULL options");
    if (!dw_sized_read(o, sizeof *o, pub))
        return dw_set_error(ctx, DW_ERR_INVALID, "bench quant: options size is 0 (call dw_bench_quant_opts_init)");
    if (o->rows < 1 || o->cols < 1 || (double)o->rows * (double)o->cols > 4e9)
        return dw_set_error(ctx, DW_ERR_INVALID, "bench quant: [%lld, %lld] is not 1 to 4e9 elements",
                            (long long)o->rows, (long long)o->cols);
    if (o->iters < 1 || o->batch < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "bench quant: iters %d and batch %d must be >= 1", o->iters,
                            o->batch);
    return DW_OK;
}

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/quant.h"

#define CK(stmt)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (stmt);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            st = dw_set_error(ctx, DW_ERR_CUDA, "%s failed: %s", #stmt, cudaGetErrorString(e_));  \
            goto out;                                                                             \
        }                                                                                         \
    } while (0)

/* What one timed call does: a copy (o == NULL) or a quantisation. */
typedef struct {
    const dw_quant_opts *o;
    const void *x;
    void *copy_dst;
    size_t copy_bytes;
    int64_t rows, cols;
    const dw_quant_dev_out *out, *out_t;
} job;

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds per call of `iters` batches of `batch` calls, after 5 warm-up batches. */
static dw_status time_job(dw_ctx *ctx, const job *j, int iters, int batch, double *ms_out) {
    dw_status st = DW_OK;
    cudaEvent_t ev[2] = {NULL, NULL};
    float *ms = malloc((size_t)iters * sizeof *ms);
    if (!ms) return dw_set_error(ctx, DW_ERR_NOMEM, "bench quant: out of memory");
    CK(cudaEventCreate(&ev[0]));
    CK(cudaEventCreate(&ev[1]));
    for (int i = -5; i < iters; i++) {
        CK(cudaEventRecord(ev[0], 0));
        for (int b = 0; b < batch; b++) {
            if (!j->o) CK(cudaMemcpyAsync(j->copy_dst, j->x, j->copy_bytes, cudaMemcpyDeviceToDevice, 0));
            else if ((st = dw_quantize_cuda(ctx, j->o, DW_QUANT_IN_BF16, j->x, j->rows, j->cols, j->out, j->out_t,
                                            NULL, NULL)) != DW_OK)
                goto out;
        }
        CK(cudaEventRecord(ev[1], 0));
        CK(cudaEventSynchronize(ev[1]));
        if (i >= 0) CK(cudaEventElapsedTime(&ms[i], ev[0], ev[1]));
    }
    qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
    *ms_out = ms[iters / 2] / batch;
out:
    free(ms);
    if (ev[0]) cudaEventDestroy(ev[0]);
    if (ev[1]) cudaEventDestroy(ev[1]);
    return st;
}

/* Random BF16 codes: random sign, exponents spread over 2^-8 .. 2^7, random mantissa (no NaN/Inf). */
static void fill_random_bf16(uint16_t *h, size_t n, uint64_t seed) {
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        unsigned sign = (unsigned)(s >> 63), e = 119 + (unsigned)((s >> 40) % 16), m = (unsigned)(s & 0x7F);
        h[i] = (uint16_t)(sign << 15 | e << 7 | m);
    }
}

/* The device buffers of a run. */
typedef struct {
    void *x, *copy, *codes, *scales, *codes_t, *scales_t;
} buffers;

static dw_status measure(dw_ctx *ctx, const dw_bench_quant_opts *o, const char *device, const buffers *d,
                         dw_bench_quant_fn fn, void *user) {
    size_t in_bytes = (size_t)(o->rows * o->cols) * 2;
    job copy = {.x = d->x, .copy_dst = d->copy, .copy_bytes = in_bytes};
    double copy_ms = 0;
    DW_TRY(time_job(ctx, &copy, o->iters, o->batch, &copy_ms));
    dw_bench_quant_row anchor = {.device = device, .recipe = -1, .ms = copy_ms, .bytes = 2.0 * (double)in_bytes,
                                 .gbps = 2.0 * (double)in_bytes / (copy_ms * 1e6), .ratio_to_copy = 1};
    if (fn) fn(&anchor, user);
    static const struct { dw_recipe recipe; bool trans; } variants[4] = {
        {DW_RECIPE_MXFP8, false}, {DW_RECIPE_MXFP8, true}, {DW_RECIPE_FP8_BLOCK, false}, {DW_RECIPE_FP8_BLOCK, true}};
    for (int k = 0; k < 4; k++) {
        dw_quant_opts q = {.recipe = variants[k].recipe};
        dw_quant_dev_out out = {.codes = d->codes, .scales = d->scales};
        dw_quant_dev_out out_t = {.codes = d->codes_t, .scales = d->scales_t};
        job j = {.o = &q, .x = d->x, .rows = o->rows, .cols = o->cols, .out = &out,
                 .out_t = variants[k].trans ? &out_t : NULL};
        dw_bench_quant_row r = {.device = device, .recipe = (int32_t)q.recipe, .transposed = variants[k].trans};
        DW_TRY(time_job(ctx, &j, o->iters, o->batch, &r.ms));
        r.bytes = (double)in_bytes + (double)dw_quant_codes_bytes(q.recipe, o->rows, o->cols) +
                  (double)dw_quant_scales_bytes(q.recipe, o->rows, o->cols);
        if (r.transposed)
            r.bytes += (double)dw_quant_codes_bytes(q.recipe, o->cols, o->rows) +
                       (double)dw_quant_scales_bytes(q.recipe, o->cols, o->rows);
        r.gbps = r.bytes / (r.ms * 1e6);
        r.ratio_to_copy = r.gbps / anchor.gbps;
        if (fn) fn(&r, user);
    }
    return DW_OK;
}

dw_status dw_bench_quant(dw_ctx *ctx, const dw_bench_quant_opts *opts, dw_bench_quant_fn fn, void *user) {
    dw_bench_quant_opts o;
    DW_TRY(read_opts(ctx, opts, &o));
    if (!ctx || dw_ctx_device(ctx) != DW_DEVICE_CUDA)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "no CUDA GPU found: this benchmark needs one");
    dw_status st = DW_OK;
    buffers d = {0};
    uint16_t *hx = NULL;
    size_t n = (size_t)(o.rows * o.cols), in_bytes = n * 2;
    size_t scale_max = dw_quant_scales_bytes(DW_RECIPE_MXFP8, o.rows, o.cols) +
                       dw_quant_scales_bytes(DW_RECIPE_FP8_BLOCK, o.cols, o.rows);
    struct cudaDeviceProp prop;
    CK(cudaSetDevice(dw_ctx_device_index(ctx)));
    CK(cudaGetDeviceProperties(&prop, dw_ctx_device_index(ctx)));
    dw_quant_tuning tune = {.stages = o.stages, .ctas_per_sm = o.ctas_per_sm, .t_store = o.t_store,
                            .kernel = o.kernel, .load = o.load, .group = o.group, .tile_block = o.tile_block};
    if ((st = dw_quantize_cuda_set_tuning(ctx, &tune)) != DW_OK) goto out;
    hx = malloc(in_bytes);
    if (!hx) {
        st = dw_set_error(ctx, DW_ERR_NOMEM, "out of host memory for [%lld, %lld]", (long long)o.rows,
                          (long long)o.cols);
        goto out;
    }
    fill_random_bf16(hx, n, 0x9E3779B97F4A7C15ull ^ (uint64_t)o.rows << 32 ^ (uint64_t)o.cols);
    if (cudaMalloc(&d.x, in_bytes) != cudaSuccess || cudaMalloc(&d.copy, in_bytes) != cudaSuccess ||
        cudaMalloc(&d.codes, n) != cudaSuccess || cudaMalloc(&d.codes_t, n) != cudaSuccess ||
        cudaMalloc(&d.scales, scale_max) != cudaSuccess || cudaMalloc(&d.scales_t, scale_max) != cudaSuccess ||
        cudaMemcpy(d.x, hx, in_bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) { /* a pageable upload may land after cudaMemcpy returns */
        (void)cudaGetLastError();
        st = dw_set_error(ctx, DW_ERR_NOMEM, "device allocation or upload failed for [%lld, %lld]",
                          (long long)o.rows, (long long)o.cols);
        goto out;
    }
    st = measure(ctx, &o, prop.name, &d, fn, user);
out:
    cudaFree(d.x);
    cudaFree(d.copy);
    cudaFree(d.codes);
    cudaFree(d.codes_t);
    cudaFree(d.scales);
    cudaFree(d.scales_t);
    free(hx);
    dw_quantize_cuda_set_tuning(NULL, NULL); /* the defaults again */
    return st;
}
#else
dw_status dw_bench_quant(dw_ctx *ctx, const dw_bench_quant_opts *opts, dw_bench_quant_fn fn, void *user) {
    (void)fn, (void)user;
    dw_bench_quant_opts o;
    DW_TRY(read_opts(ctx, opts, &o));
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                        "this build has no CUDA (configured without nvcc): it needs a CUDA build and a GPU");
}
#endif
