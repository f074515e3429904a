/* grouped.c — deepwell.h's dw_bench_grouped (`deepwell bench grouped`): times the grouped expert
 * GEMMs of the MoE linear layer (moe_linear: fprop y_e = x_e W_eᵀ, dgrad dx_e = dy_e W_e, wgrad
 * dW_e += dy_eᵀ x_e) at the MoE speed issue's shapes, with balanced and Zipf-skewed routing.
 * Every pass runs through dw_grouped_gemm with the kernel the grouped registry selects, as the
 * engine's would be (with explain: its account of every candidate): BF16 on a GPU (wgmma on
 * sm_90), the FP32 reference on the CPU; recipe fp8_block on E4M3 codes (grouped_fp8_case.c), the
 * quantisation of the pass's activation operands inside every timed call and also timed alone
 * (quant_ms). bench/grouped_anchor.py times torch._grouped_mm on the same shapes and routings.
 * Inputs are random, rows per expert come from the routing alone. Not a correctness test
 * (tests/gpu/test_ops_cuda_moe.c is). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/grouped_fp8_case.h"
#include "bench/lists.h"
#include "core/ctx.h"
#include "core/env.h"
#include "core/error.h"
#include "core/sized.h"
#include "formats/formats.h"
#include "gemm/gemm_dev.h"

/* rows (token-expert assignments), experts, K inputs, M outputs */
typedef struct {
    const char *name;
    int64_t rows, experts, k, m;
} gshape;

static const gshape SHAPES[] = {
    {"e8", 16384, 8, 4096, 14336},     /* Mixtral-8x7B-like w1 */
    {"e64", 32768, 64, 2048, 1408},    /* DeepSeek-MoE-like fine-grained experts */
    {"moe-e8", 32768, 8, 2048, 5632},  /* the preset's gate/up at B 8 T 2048, top-2 */
    {"moe-e8-down", 32768, 8, 5632, 2048},
    {"moe-e64", 65536, 64, 2048, 1024}, /* the preset's gate/up at B 4 T 2048, top-8 */
    {"moe-e64-down", 65536, 64, 1024, 2048},
};
enum { N_SHAPES = sizeof SHAPES / sizeof SHAPES[0] };
static const char *const ROUTINGS[] = {"balanced", "zipf"};
static const char *const PASSES[] = {"fprop", "dgrad", "wgrad"};
static const char *const RECIPES[] = {"bf16", "fp8_block"};

const char *dw_bench_grouped_shape_name(int i) { return i >= 0 && i < N_SHAPES ? SHAPES[i].name : NULL; }
const char *dw_bench_grouped_routing_name(int i) { return i >= 0 && i < 2 ? ROUTINGS[i] : NULL; }

static const dw_bench_grouped_opts GROUPED_DEFAULTS = {.size = sizeof(dw_bench_grouped_opts), .iters = 10,
                                                        .zipf_s = 1.0};

void dw_bench_grouped_opts_init(dw_bench_grouped_opts *o, size_t size) {
    if (o) dw_sized_init(o, size, &GROUPED_DEFAULTS, sizeof GROUPED_DEFAULTS);
}

void dw_bench_grouped_counts(int64_t rows, int64_t experts, int routing, double s, int64_t *counts) {
    if (routing == 0) { /* equal shares, the remainder one each to the first experts */
        for (int64_t e = 0; e < experts; e++) counts[e] = rows / experts + (e < rows % experts);
        return;
    }
    double sum = 0; /* Zipf: expert e's share proportional to 1 / (e + 1)^s, floors, the rest to expert 0 */
    for (int64_t e = 0; e < experts; e++) sum += pow((double)(e + 1), -s);
    int64_t given = 0;
    for (int64_t e = 0; e < experts; e++) given += counts[e] = (int64_t)floor((double)rows * pow((double)(e + 1), -s) / sum);
    counts[0] += rows - given;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Buffers of one case, host (CPU) or device (GPU): x (R,K), W (E,M,K), y/dy (R,M), dx (R,K),
 * dW (E,M,K) FP32, offsets (E+1). */
typedef struct {
    bool gpu;
    void *x, *w, *y, *dy, *dx, *dw, *off;
} bufs;

static void bufs_free(bufs *b) {
    void *all[] = {b->x, b->w, b->y, b->dy, b->dx, b->dw, b->off};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (b->gpu) dw_gemm_dev_free(all[i]);
        else free(all[i]);
    memset(b, 0, sizeof *b);
}

/* Random values in [-1, 1) as FP32 (CPU) or BF16 bits (GPU), n of them. */
static void *random_host(int64_t n, bool bf16, uint64_t *state) {
    void *h = malloc((size_t)(n > 0 ? n : 1) * (bf16 ? 2 : 4));
    if (!h) return NULL;
    for (int64_t i = 0; i < n; i++) {
        uint64_t x = *state += 0x9E3779B97F4A7C15ull;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull, x ^= x >> 27;
        const float f = (float)((double)(x >> 11) / 9007199254740992.0 * 2 - 1);
        if (bf16) ((uint16_t *)h)[i] = dw_encode_bf16(f);
        else ((float *)h)[i] = f;
    }
    return h;
}

/* One buffer of n elements of `bytes` each: random (or zeros when !fill), on the case's side. */
static dw_status buf_make(dw_ctx *ctx, bufs *b, void **out, int64_t n, int bytes, bool fill, uint64_t *state) {
    const size_t size = (size_t)(n > 0 ? n : 1) * (size_t)bytes;
    void *h = fill ? random_host(n, bytes == 2, state) : calloc(1, size);
    if (!h) return dw_set_error(ctx, DW_ERR_NOMEM, "bench grouped: out of host memory for %zu bytes", size);
    if (!b->gpu) {
        *out = h;
        return DW_OK;
    }
    dw_status st = dw_gemm_dev_alloc(ctx, size, out);
    if (st == DW_OK) st = dw_gemm_dev_upload(ctx, *out, h, size);
    free(h);
    return st;
}

typedef struct {
    dw_ctx *ctx;
    dw_grouped_args g;
    const bench_fp8 *f; /* fp8_block: the activation operands are quantised first in every call */
    bool quant_only;    /* ... and nothing else */
} call_args;

/* One pass over the case's buffers as dw_grouped_gemm takes it: BF16 on a GPU, FP32 on the CPU. */
static dw_grouped_args case_args(const bufs *b, const gshape *s, int pass) {
    return (dw_grouped_args){.pass = pass, .dtype = b->gpu ? DW_GROUPED_BF16 : DW_GROUPED_F32,
                             .recipe = DW_RECIPE_BF16, .rows = s->rows, .experts = s->experts, .k = s->k, .m = s->m,
                             .x = b->x, .w = b->w, .dy = b->dy, .offsets = b->off,
                             .out = pass == DW_GEMM_FPROP ? b->y : pass == DW_GEMM_DGRAD ? b->dx : b->dw};
}

static dw_status run_pass(void *arg, int i) {
    (void)i;
    const call_args *a = arg;
    if (a->f) DW_TRY(bench_fp8_quantize(a->f, a->g.pass));
    return a->quant_only ? DW_OK : dw_grouped_gemm(a->ctx, &a->g);
}

/* Milliseconds per call: the median of 5 batches of iters calls after 2 warm-up calls. */
static dw_status time_pass(dw_ctx *ctx, const call_args *a, int iters, double *ms) {
    double t[5];
    const bool gpu = dw_ctx_device(ctx) == DW_DEVICE_CUDA;
    for (int w = 0; w < 2 && !gpu; w++) DW_TRY(run_pass((void *)a, 0));
    if (gpu) DW_TRY(dw_gemm_dev_time(ctx, 2, run_pass, (void *)a, &t[0]));
    for (int r = 0; r < 5; r++) {
        if (gpu) {
            DW_TRY(dw_gemm_dev_time(ctx, iters, run_pass, (void *)a, &t[r]));
        } else {
            const double t0 = now_ms();
            for (int i = 0; i < iters; i++) DW_TRY(run_pass((void *)a, i));
            t[r] = now_ms() - t0;
        }
        t[r] /= iters;
    }
    qsort(t, 5, sizeof t[0], cmp_double);
    *ms = t[2];
    return DW_OK;
}

/* One case: routing r's offsets in b, pass p, in BF16/FP32 (f NULL) or fp8_block (f: the
 * activation operands quantised in every timed call, and timed alone for quant_ms). A case no
 * kernel can run is reported skipped, with the registry's reason. */
static dw_status bench_case(dw_ctx *ctx, const dw_bench_grouped_opts *o, const gshape *s, const bufs *b,
                            const bench_fp8 *f, int r, int p, int64_t most, dw_bench_grouped_fn fn, void *user) {
    dw_bench_grouped_case c = {.size = sizeof c, .shape = s->name, .routing = ROUTINGS[r], .pass = PASSES[p],
                               .rows = s->rows, .experts = s->experts, .k = s->k, .m = s->m, .max_rows = most,
                               .dtype = b->gpu ? "bf16" : "fp32", .recipe = RECIPES[f != NULL]};
    void *out = p == DW_GEMM_FPROP ? b->y : p == DW_GEMM_DGRAD ? b->dx : b->dw;
    call_args a = {.ctx = ctx, .g = f ? bench_fp8_args(f, p, out) : case_args(b, s, p), .f = f};
    const char *name = NULL;
    if (dw_grouped_select(ctx, &a.g, &name) != DW_OK) { /* e.g. fp8_block on sm_90 with DW_MOE_FP8=0 */
        c.skipped = dw_errmsg(ctx);
        if (fn) fn(&c, user);
        return DW_OK;
    }
    char *why = NULL, *why_ab = NULL;
    dw_status st = o->explain ? dw_grouped_explain(ctx, &a.g, &why) : DW_OK;
    c.explain = why;
    const char *wg = dw_env("DW_MOE_WGRAD"); /* the wgmma wgrad's A/B switch, said beside the choice */
    if (why && wg && p == DW_GEMM_WGRAD && !f) {
        const size_t n = strlen(why) + strlen(wg) + 96;
        if ((why_ab = malloc(n)))
            snprintf(why_ab, n, "%sDW_MOE_WGRAD=%s (grouped_wgmma_sm90's wgrad: tma or 256 the TMA epilogue, old the register one)\n",
                     why, wg);
        c.explain = why_ab ? why_ab : why;
    }
    if (st == DW_OK) st = time_pass(ctx, &a, o->iters, &c.ms); /* fp8_block: quantisation and GEMM */
    if (st == DW_OK && f) {
        call_args qa = a;
        qa.quant_only = true;
        st = time_pass(ctx, &qa, o->iters, &c.quant_ms);
    }
    c.timed = st == DW_OK;
    c.tflops = c.timed ? 2.0 * (double)s->rows * (double)s->k * (double)s->m / (c.ms * 1e9) : 0; /* unpadded rows */
    if (st == DW_OK && fn) fn(&c, user);
    dw_free_string(why);
    free(why_ab);
    return st;
}

static dw_status bench_shape(dw_ctx *ctx, const dw_bench_grouped_opts *o, const gshape *s, bool gpu,
                             dw_bench_grouped_fn fn, void *user) {
    bufs b = {.gpu = gpu};
    uint64_t state = o->seed ^ 0x6A09E667F3BCC909ull;
    const int el = gpu ? 2 : 4;
    int64_t *counts = malloc((size_t)s->experts * sizeof *counts);
    int32_t *off = malloc((size_t)(s->experts + 1) * sizeof *off);
    dw_status st = counts && off ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "bench grouped: out of memory");
    if (st == DW_OK) st = buf_make(ctx, &b, &b.x, s->rows * s->k, el, true, &state);
    if (st == DW_OK) st = buf_make(ctx, &b, &b.w, s->experts * s->m * s->k, el, true, &state);
    if (st == DW_OK) st = buf_make(ctx, &b, &b.dy, s->rows * s->m, el, true, &state);
    if (st == DW_OK) st = buf_make(ctx, &b, &b.y, s->rows * s->m, el, false, &state);
    if (st == DW_OK) st = buf_make(ctx, &b, &b.dx, s->rows * s->k, el, false, &state);
    if (st == DW_OK) st = buf_make(ctx, &b, &b.dw, s->experts * s->m * s->k, 4, false, &state);
    const char *recipes = o->recipes ? o->recipes : "bf16";
    bench_fp8 f8 = {0};
    if (st == DW_OK && dw_bench_list_has(recipes, "fp8_block"))
        st = bench_fp8_make(ctx, &f8, gpu, b.w, b.x, b.dy, s->rows, s->experts, s->k, s->m);
    for (int r = 0; r < 2 && st == DW_OK; r++) {
        if (!dw_bench_list_has(o->routings, ROUTINGS[r])) continue;
        dw_bench_grouped_counts(s->rows, s->experts, r, o->zipf_s, counts);
        int64_t most = 0;
        off[0] = 0;
        for (int64_t e = 0; e < s->experts; e++) {
            off[e + 1] = off[e] + (int32_t)counts[e];
            if (counts[e] > most) most = counts[e];
        }
        if (gpu) {
            dw_gemm_dev_free(b.off);
            b.off = NULL;
            st = dw_gemm_dev_alloc(ctx, (size_t)(s->experts + 1) * 4, &b.off);
            if (st == DW_OK) st = dw_gemm_dev_upload(ctx, b.off, off, (size_t)(s->experts + 1) * 4);
        } else {
            free(b.off);
            b.off = malloc((size_t)(s->experts + 1) * 4);
            if (!b.off) st = dw_set_error(ctx, DW_ERR_NOMEM, "bench grouped: out of memory");
            else memcpy(b.off, off, (size_t)(s->experts + 1) * 4);
        }
        f8.off = b.off;
        for (int q = 0; q < 2; q++)
            for (int p = 0; p < 3 && st == DW_OK && dw_bench_list_has(recipes, RECIPES[q]); p++) {
                if (!dw_bench_list_has(o->passes, PASSES[p])) continue;
                st = bench_case(ctx, o, s, &b, q ? &f8 : NULL, r, p, most, fn, user);
            }
    }
    bench_fp8_free(&f8);
    bufs_free(&b);
    free(counts), free(off);
    return st;
}

dw_status dw_bench_grouped(dw_ctx *ctx, const dw_bench_grouped_opts *opts, dw_bench_grouped_fn fn, void *user) {
    dw_bench_grouped_opts o = GROUPED_DEFAULTS;
    if (!opts || !dw_sized_read(&o, sizeof o, opts))
        return dw_set_error(ctx, DW_ERR_INVALID, "dw_bench_grouped: options not initialised (dw_bench_grouped_opts_init)");
    const char *shape_names[N_SHAPES + 1];
    for (int i = 0; i < N_SHAPES; i++) shape_names[i] = SHAPES[i].name;
    shape_names[N_SHAPES] = "custom";
    DW_TRY(dw_bench_list_check(ctx, "--shapes: ", o.shapes, shape_names, N_SHAPES + 1));
    DW_TRY(dw_bench_list_check(ctx, "--routing: ", o.routings, ROUTINGS, 2));
    DW_TRY(dw_bench_list_check(ctx, "--passes: ", o.passes, PASSES, 3));
    DW_TRY(dw_bench_list_check(ctx, "--recipe: ", o.recipes, RECIPES, 2));
    if (o.iters < 1) return dw_set_error(ctx, DW_ERR_INVALID, "--iters %d: at least 1", o.iters);
    if (!(o.zipf_s > 0) || o.zipf_s > 8) return dw_set_error(ctx, DW_ERR_INVALID, "--zipf %g: in (0, 8]", o.zipf_s);
    const bool custom = o.shapes && dw_bench_list_has(o.shapes, "custom");
    if (custom && (o.rows < 1 || o.experts < 1 || o.k < 1 || o.m < 1 || o.experts > 4096 || o.rows > ((int64_t)1 << 30)))
        return dw_set_error(ctx, DW_ERR_INVALID, "--shapes custom needs rows >= 1, 1 <= experts <= 4096, k and m >= 1 "
                            "(got rows %lld, experts %lld, k %lld, m %lld)", (long long)o.rows, (long long)o.experts,
                            (long long)o.k, (long long)o.m);
    const bool gpu = dw_ctx_device(ctx) == DW_DEVICE_CUDA;
    if (!gpu && !o.shapes)
        return dw_set_error(ctx, DW_ERR_INVALID, "dw_bench_grouped on the CPU: name the shapes (--shapes custom with "
                            "--rows, --experts, --k, --m, or a named one): the default shapes are sized for a GPU");
    if (gpu && custom && (o.k % 8 || o.m % 8))
        return dw_set_error(ctx, DW_ERR_INVALID, "--shapes custom on a GPU: k and m multiples of 8 (BF16 rows of 16 bytes)");
    if (custom && o.recipes && dw_bench_list_has(o.recipes, "fp8_block") && (o.k % 128 || o.m % 128))
        return dw_set_error(ctx, DW_ERR_INVALID, "--recipe fp8_block: --k %lld and --m %lld must be multiples of 128 "
                            "(128x128 weight blocks)", (long long)o.k, (long long)o.m);
    for (int i = 0; i < N_SHAPES; i++)
        if (dw_bench_list_has(o.shapes, SHAPES[i].name)) DW_TRY(bench_shape(ctx, &o, &SHAPES[i], gpu, fn, user));
    if (custom) {
        const gshape s = {"custom", o.rows, o.experts, o.k, o.m};
        DW_TRY(bench_shape(ctx, &o, &s, gpu, fn, user));
    }
    return DW_OK;
}
