/* gemm.c — deepwell.h's dw_bench_gemm (`deepwell bench gemm`): times dw_gemm for the recipes and
 * shapes of the GEMM issue (8192^3, GPT-2 and Llama-style layer shapes, GPT-2's LM head at its
 * real vocabulary) and can explain every kernel selection. Inputs are random valid codes (never
 * zeros), rotated between several copies when they are small enough to sit in L2. Plain C: the
 * device memory and event timing are gemm_dev.h's. Not a correctness test (tests/gpu does that). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/sized.h"
#include "bench/lists.h"
#include "gemm/gemm_dev.h"

static const char *const SHAPES[] = {"square", "gpt2", "llama", "vocab"};
enum { R_BF16, R_FP8_TENSOR, R_FP8_BLOCK, R_FP8_BLOCK_1X128, R_MXFP8, R_COUNT };
static const char *const RECIPES[R_COUNT] = {"bf16", "fp8_tensor", "fp8_block", "fp8_block_1x128", "mxfp8"};
enum { N_SHAPES = sizeof SHAPES / sizeof SHAPES[0], MAX_SETS = 4 };

const char *dw_bench_gemm_shape_name(int i) { return i >= 0 && i < N_SHAPES ? SHAPES[i] : NULL; }
const char *dw_bench_gemm_recipe_name(int i) { return i >= 0 && i < R_COUNT ? RECIPES[i] : NULL; }

static const dw_bench_gemm_opts GEMM_DEFAULTS = {.size = sizeof(dw_bench_gemm_opts), .iters = 20};

void dw_bench_gemm_opts_init(dw_bench_gemm_opts *o, size_t size) {
    if (o) dw_sized_init(o, size, &GEMM_DEFAULTS, sizeof GEMM_DEFAULTS);
}

typedef struct {
    int64_t m, n, k;
} shape;

/* The shapes the list names, in the fixed order; returns their count (at most 16). */
static int shapes_of(const char *list, shape *s) {
    int ns = 0;
    if (dw_bench_list_has(list, "square")) s[ns++] = (shape){8192, 8192, 8192};
    if (dw_bench_list_has(list, "gpt2")) {
        const int64_t d[3] = {768, 2304, 3072};
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) s[ns++] = (shape){16384, d[i], d[j]};
    }
    if (dw_bench_list_has(list, "llama")) {
        s[ns++] = (shape){16384, 14336, 4096};
        s[ns++] = (shape){16384, 4096, 14336};
    }
    if (dw_bench_list_has(list, "vocab")) { /* the three LM-head GEMMs of GPT-2 at V = 50257, N = 16384 tokens */
        s[ns++] = (shape){16384, 50257, 768};
        s[ns++] = (shape){16384, 768, 50257};
        s[ns++] = (shape){50257, 768, 16384};
    }
    return ns;
}

/* Operand descriptor of recipe rc for a stored [rows, k] matrix at data/scales. */
static dw_gemm_operand operand(int rc, bool is_b, int64_t rows, int64_t k, const void *data, const void *scales) {
    dw_gemm_operand o = {.trans = is_b, .rows = rows, .cols = k, .data = data, .scales = scales, .tensor_scale = 1};
    switch (rc) {
    case R_BF16: o.recipe = DW_RECIPE_BF16, o.scales = NULL; break;
    case R_FP8_TENSOR: o.recipe = DW_RECIPE_FP8_TENSOR; break;
    case R_FP8_BLOCK: o.recipe = is_b ? DW_RECIPE_FP8_BLOCK2D : DW_RECIPE_FP8_BLOCK; break;
    case R_FP8_BLOCK_1X128: o.recipe = DW_RECIPE_FP8_BLOCK; break;
    default: o.recipe = DW_RECIPE_MXFP8; break;
    }
    return o;
}

/* Device inputs: a pool of random bytes valid both as E4M3 (|x| in [1, 4)) and as BF16 pairs
 * (finite), FP32 and UE8M0 scales, and the output. */
typedef struct {
    void *pool, *fscales, *bscales, *d;
    size_t pool_bytes;
} inputs;

static void inputs_free(inputs *in) {
    dw_gemm_dev_free(in->pool);
    dw_gemm_dev_free(in->fscales);
    dw_gemm_dev_free(in->bscales);
    dw_gemm_dev_free(in->d);
}

static dw_status inputs_make(dw_ctx *ctx, const shape *list, int ns, inputs *in) {
    size_t max_set = 0, dmax = 0;
    int64_t max_scales = 0;
    for (int i = 0; i < ns; i++) {
        size_t s = (size_t)((list[i].m + list[i].n) * list[i].k) * 2, o = (size_t)(list[i].m * list[i].n) * 2;
        int64_t sc = (list[i].m + list[i].n) * (list[i].k / 32 + 1);
        if (s > max_set) max_set = s;
        if (o > dmax) dmax = o;
        if (sc > max_scales) max_scales = sc;
    }
    in->pool_bytes = max_set * 2 < ((size_t)1 << 30) ? (size_t)1 << 30 : max_set * 2;
    uint8_t *h = malloc(in->pool_bytes), *hb = malloc((size_t)max_scales);
    float *hf = malloc((size_t)max_scales * 4);
    dw_status st = DW_OK;
    if (!h || !hf || !hb) {
        st = dw_set_error(ctx, DW_ERR_NOMEM, "out of host memory for %zu bytes of inputs", in->pool_bytes);
    } else {
        uint64_t x = 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < in->pool_bytes; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            h[i] = (uint8_t)(0x38 + (x >> 40) % 9) | (uint8_t)((x >> 20) & 0x80);
        }
        for (int64_t i = 0; i < max_scales; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            hf[i] = 0.5f + (float)((x >> 11) % 1024) / 683.0f;
            hb[i] = (uint8_t)(125 + (x >> 30) % 5);
        }
        if ((st = dw_gemm_dev_alloc(ctx, in->pool_bytes, &in->pool)) == DW_OK &&
            (st = dw_gemm_dev_alloc(ctx, (size_t)max_scales * 4, &in->fscales)) == DW_OK &&
            (st = dw_gemm_dev_alloc(ctx, (size_t)max_scales, &in->bscales)) == DW_OK &&
            (st = dw_gemm_dev_upload(ctx, in->pool, h, in->pool_bytes)) == DW_OK &&
            (st = dw_gemm_dev_upload(ctx, in->fscales, hf, (size_t)max_scales * 4)) == DW_OK &&
            (st = dw_gemm_dev_upload(ctx, in->bscales, hb, (size_t)max_scales)) == DW_OK)
            st = dw_gemm_dev_alloc(ctx, dmax, &in->d);
    }
    free(h), free(hf), free(hb);
    return st;
}

typedef struct {
    dw_ctx *ctx;
    dw_gemm_args args[MAX_SETS];
    int nsets;
} run_arg;

static dw_status run_one(void *p, int i) {
    run_arg *r = p;
    return dw_gemm(r->ctx, &r->args[i % r->nsets]);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One shape and recipe: the arguments of each input copy, explained, selected and timed. */
static dw_status bench_case(dw_ctx *ctx, const dw_bench_gemm_opts *o, const inputs *in, shape s, int r,
                            dw_bench_gemm_fn fn, void *user) {
    bool gpu = in->pool != NULL;
    size_t esz = r == R_BF16 ? 2 : 1, set = (size_t)((s.m + s.n) * s.k) * esz;
    run_arg ra = {.ctx = ctx, .nsets = 1};
    if (gpu) ra.nsets = (int)(in->pool_bytes / set) > MAX_SETS ? MAX_SETS : (int)(in->pool_bytes / set);
    const void *sc = r == R_MXFP8 ? in->bscales : in->fscales;
    for (int q = 0; q < ra.nsets; q++) {
        const uint8_t *base = (const uint8_t *)in->pool + (size_t)q * set;
        dw_gemm_args a = {.m = s.m, .n = s.n, .k = s.k, .alpha = 1, .d = in->d, .out_type = DW_GEMM_OUT_BF16,
                          .backend = o->backend};
        a.a = operand(r, false, s.m, s.k, base, sc);
        a.b = operand(r, true, s.n, s.k, base + (size_t)(s.m * s.k) * esz, sc);
        /* on a CPU context (explanations only) any non-NULL pointers do: nothing runs */
        if (!gpu) a.a.data = a.b.data = a.a.scales = a.b.scales = &ra, a.d = &ra;
        if (r == R_BF16) a.a.scales = a.b.scales = NULL;
        ra.args[q] = a;
    }
    dw_bench_gemm_case c = {.m = s.m, .n = s.n, .k = s.k, .recipe = RECIPES[r]};
    char *ex = NULL, skipped[1024];
    if (o->explain) DW_TRY(dw_gemm_explain(ctx, &ra.args[0], &ex));
    c.explain = ex;
    dw_status st = DW_OK;
    if (gpu && dw_gemm_select(ctx, &ra.args[0], &c.backend) != DW_OK) {
        snprintf(skipped, sizeof skipped, "%s", dw_errmsg(ctx));
        c.skipped = skipped;
    } else if (gpu) {
        double ms[5], t;
        st = dw_gemm_dev_time(ctx, 3, run_one, &ra, &t); /* warm-up (and autotuning, when on) */
        if (st == DW_OK) st = dw_gemm_select(ctx, &ra.args[0], &c.backend);
        for (int b = 0; b < 5 && st == DW_OK; b++) {
            st = dw_gemm_dev_time(ctx, o->iters, run_one, &ra, &t);
            ms[b] = t / (double)o->iters;
        }
        if (st == DW_OK) {
            qsort(ms, 5, sizeof ms[0], cmp_double);
            c.timed = true;
            c.ms = ms[2];
            c.tflops = 2.0 * (double)s.m * (double)s.n * (double)s.k / (ms[2] * 1e-3) / 1e12;
        }
    }
    if (fn) fn(&c, user); /* on a failed timing too: its explanation */
    dw_free_string(ex);
    return st;
}

dw_status dw_bench_gemm(dw_ctx *ctx, const dw_bench_gemm_opts *opts, dw_bench_gemm_fn fn, void *user) {
    dw_bench_gemm_opts o = GEMM_DEFAULTS;
    if (!ctx || !opts) return dw_set_error(ctx, DW_ERR_INVALID, "bench gemm: NULL argument");
    if (!dw_sized_read(&o, sizeof o, opts))
        return dw_set_error(ctx, DW_ERR_INVALID, "bench gemm: options size is 0 (call dw_bench_gemm_opts_init)");
    DW_TRY(dw_bench_list_check(ctx, "", o.shapes, SHAPES, N_SHAPES));
    DW_TRY(dw_bench_list_check(ctx, "", o.recipes, RECIPES, R_COUNT));
    if (o.iters < 1) return dw_set_error(ctx, DW_ERR_INVALID, "bench gemm: iters %d must be >= 1", o.iters);
    bool gpu = dw_ctx_device(ctx) == DW_DEVICE_CUDA;
    if (!gpu && !o.explain)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "no CUDA GPU in this build or machine: only explanations");
    shape list[16];
    int ns = shapes_of(o.shapes, list);
    inputs in = {0};
    dw_status st = gpu ? inputs_make(ctx, list, ns, &in) : DW_OK;
    for (int si = 0; si < ns && st == DW_OK; si++)
        for (int r = 0; r < R_COUNT && st == DW_OK; r++)
            if (dw_bench_list_has(o.recipes, RECIPES[r])) st = bench_case(ctx, &o, &in, list[si], r, fn, user);
    inputs_free(&in);
    return st;
}
