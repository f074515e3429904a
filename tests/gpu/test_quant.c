/* test_quant.c — the CUDA quantisation kernels (kernels/cuda/quant.h) against the CPU reference
 * (formats.h), byte for byte: every recipe and scale-rounding option, FP32 and BF16 input, with and
 * without the transposed copy and the swizzled scales, ragged shapes, special values (NaN, Inf,
 * zero blocks, subnormals, exact ties, values next to E4M3 rounding boundaries), unaligned input,
 * several depths of the tile kernel's shared-memory ring and grids small enough that each CTA
 * loops over many tiles; outputs poisoned first and guard bands checked for stray writes. Needs a
 * GPU (label gpu); fails without one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "kernels/cuda/quant.h"
#include "testutil.h"

#define POISON 0xA5
#define GUARD 256

static void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) fail_msg("%s: %s", what, cudaGetErrorString(e));
}

/* A device buffer of n bytes plus a guard band, poisoned. */
static void *dev_poisoned(size_t n) {
    void *p = NULL;
    cuda_ok(cudaMalloc(&p, n + GUARD), "cudaMalloc");
    cuda_ok(cudaMemset(p, POISON, n + GUARD), "cudaMemset");
    return p;
}

/* Copies n bytes back and checks that the guard band after them is untouched. */
static uint8_t *fetch(const void *d, size_t n, const char *what, const char *label) {
    uint8_t *h = malloc(n + GUARD);
    cuda_ok(cudaMemcpy(h, d, n + GUARD, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t i = n; i < n + GUARD; i++)
        if (h[i] != POISON) fail_msg("%s: %s: write past the end (byte %zu of the guard)", label, what, i - n);
    return h;
}

static int compare(const char *label, const char *what, const uint8_t *got, const uint8_t *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            fprintf(stderr, "MISMATCH %s: %s byte %zu of %zu: cuda %#04x, cpu %#04x\n", label, what, i, n,
                    got[i], want[i]);
            return 1;
        }
    return 0;
}

/* Kind 3's FP8 scale: fresh per case, never a power of two. */
static float g_s0 = 1.0f;

/* Test data: kind 0 wide-range normals, 1 with specials, 2 exact ties on small grids, 3 values
 * within a few ulps of s0 times the midpoints between E4M3 codes, with +-448 s0 at every row and
 * column multiple of 128 so that FP8 block scales come out near s0 (stresses x / s). */
static float sample(dw_test_rng *rng, int kind, int64_t i, int64_t j) {
    if (kind == 3) {
        float sign = (dw_test_next(rng) & 1) ? -1.0f : 1.0f;
        if (i % 128 == 0 || j % 128 == 0) return sign * 448.0f * g_s0;
        int m = (int)(dw_test_next(rng) % 8), e = (int)(dw_test_next(rng) % 17) - 9;
        float mid = ldexpf(1.0f + (float)(2 * m + 1) / 16.0f, e); /* halfway between two E4M3 codes */
        if (e < -6) mid = ldexpf((float)(2 * (int)(dw_test_next(rng) % 8) + 1), -10); /* subnormal codes */
        return sign * g_s0 * mid * (1.0f + ldexpf((float)((int)(dw_test_next(rng) % 9) - 4), -23));
    }
    if (kind == 2) {
        int k = (int)(dw_test_next(rng) % 129) - 64;
        return ldexpf((float)k, (int)(dw_test_next(rng) % 9) - 6);
    }
    float v = dw_test_normal(rng) * ldexpf(1.0f, (int)(dw_test_next(rng) % 24) - 12);
    if (kind == 1) {
        uint64_t u = dw_test_next(rng) % 1000;
        if (u == 0) return NAN;
        if (u == 1) return (u & 1) ? -INFINITY : INFINITY;
        if (u < 20) return ldexpf(1.0f, -140) * (float)(u - 10); /* FP32 subnormals */
        if (u < 40) return 0.0f;
        if (u < 45) return -0.0f;
        if ((i / 7 + j / 40) % 5 == 0) return 0.0f * v; /* whole zero regions (keep the sign) */
    }
    return v;
}

typedef struct {
    dw_quant_in in;
    dw_quant_opts o;
    bool trans, swz, misalign;
    bool t_only; /* the transposed copy alone (out NULL) where the kernel allows it */
    int64_t rows, cols;
    int kind;
    dw_quant_tuning tune; /* ring depth and grid cap of the persistent tile kernel */
} qcase;

/* One output's device buffers and their CPU twins. */
typedef struct {
    dw_quant_dev_out d;
    size_t codes_n, scales_n, swz_n;
} dev_out;

static dev_out alloc_out(dw_recipe r, int64_t R, int64_t C, bool swz) {
    dev_out o = {0};
    int64_t sr, sc;
    dw_quant_scale_shape(r, R, C, &sr, &sc);
    o.codes_n = dw_quant_codes_bytes(r, R, C);
    o.scales_n = dw_quant_scales_bytes(r, R, C);
    o.d.codes = dev_poisoned(o.codes_n);
    o.d.scales = dev_poisoned(o.scales_n);
    if (swz) {
        o.swz_n = dw_scale_swizzled_bytes(sr, sc);
        o.d.scales_swizzled = dev_poisoned(o.swz_n);
    }
    if (r == DW_RECIPE_NVFP4) o.d.tensor_scale = dev_poisoned(sizeof(float));
    return o;
}

static void free_out(dev_out *o) {
    cudaFree(o->d.codes);
    cudaFree(o->d.scales);
    cudaFree(o->d.scales_swizzled);
    cudaFree(o->d.tensor_scale);
}

/* Compares one device output with the CPU reference q; returns the number of mismatching parts. */
static int check_out(const char *label, const char *which, const dev_out *o, const dw_qtensor *q) {
    char what[64];
    int bad = 0;
    uint8_t *h = fetch(o->d.codes, o->codes_n, which, label);
    snprintf(what, sizeof what, "%s codes", which);
    bad += compare(label, what, h, q->codes, o->codes_n);
    free(h);
    h = fetch(o->d.scales, o->scales_n, which, label);
    snprintf(what, sizeof what, "%s scales", which);
    bad += compare(label, what, h, q->scales, o->scales_n);
    free(h);
    if (o->d.scales_swizzled) {
        int64_t sr, sc;
        dw_quant_scale_shape(q->recipe, q->rows, q->cols, &sr, &sc);
        uint8_t *want = malloc(o->swz_n);
        dw_scale_swizzle_cpu(q->scales, sr, sc, want);
        h = fetch(o->d.scales_swizzled, o->swz_n, which, label);
        snprintf(what, sizeof what, "%s swizzled scales", which);
        bad += compare(label, what, h, want, o->swz_n);
        free(h);
        free(want);
    }
    if (o->d.tensor_scale) {
        h = fetch(o->d.tensor_scale, sizeof(float), which, label);
        snprintf(what, sizeof what, "%s tensor scale", which);
        bad += compare(label, what, h, (const uint8_t *)&q->tensor_scale, sizeof(float));
        free(h);
    }
    return bad;
}

static int run_case(dw_test_rng *rng, const qcase *c) {
    dw_recipe r = c->o.recipe;
    int64_t n = c->rows * c->cols;
    char label[256];
    snprintf(label, sizeof label,
             "%s%s%s in=%s [%lld,%lld] kind=%d%s%s%s stages=%d ctas/sm=%d max_ctas=%d t_store=%d kernel=%d load=%d "
             "group=%d tile_block=%d",
             dw_recipe_name(r),
             c->o.rounding == DW_SCALE_FLOOR ? "/floor" : "", c->o.pow2 ? "/pow2" : "",
             c->in == DW_QUANT_IN_BF16 ? "bf16" : "f32", (long long)c->rows, (long long)c->cols, c->kind,
             c->trans ? (c->t_only ? " T only" : " +T") : "", c->swz ? " +swz" : "", c->misalign ? " misaligned" : "", c->tune.stages,
             c->tune.ctas_per_sm, c->tune.max_ctas, c->tune.t_store, c->tune.kernel, c->tune.load, c->tune.group,
             c->tune.tile_block);
    if (dw_quantize_cuda_set_tuning(NULL, &c->tune) != DW_OK) fail_msg("%s: set_tuning: %s", label, dw_errmsg(NULL));
    g_s0 = ldexpf(1.0f + (float)(1 + dw_test_next(rng) % 0x7FFFFE) * 0x1p-23f, (int)(dw_test_next(rng) % 40) - 20);
    float *x = malloc((size_t)n * sizeof *x);
    uint16_t *xb = malloc((size_t)n * sizeof *xb);
    for (int64_t i = 0; i < c->rows; i++)
        for (int64_t j = 0; j < c->cols; j++) {
            float v = sample(rng, c->kind, i, j);
            xb[i * c->cols + j] = dw_encode_bf16(v);
            x[i * c->cols + j] = c->in == DW_QUANT_IN_BF16 ? dw_decode_bf16(xb[i * c->cols + j]) : v;
        }
    /* CPU reference */
    dw_qtensor q = {.codes = malloc(dw_quant_codes_bytes(r, c->rows, c->cols) + 1),
                    .scales = malloc(dw_quant_scales_bytes(r, c->rows, c->cols) + 4)};
    dw_qtensor qt = {.codes = malloc(dw_quant_codes_bytes(r, c->cols, c->rows) + 1),
                     .scales = malloc(dw_quant_scales_bytes(r, c->cols, c->rows) + 4)};
    assert_int_equal(dw_quantize_cpu(NULL, &c->o, x, c->rows, c->cols, &q), DW_OK);
    if (c->trans) assert_int_equal(dw_quantize_transposed_cpu(NULL, &c->o, x, c->rows, c->cols, &qt), DW_OK);
    /* device */
    size_t esz = c->in == DW_QUANT_IN_BF16 ? 2 : 4, off = c->misalign ? esz : 0;
    uint8_t *dx = NULL;
    cuda_ok(cudaMalloc((void **)&dx, (size_t)n * esz + 16), "cudaMalloc x");
    cuda_ok(cudaMemcpy(dx + off, c->in == DW_QUANT_IN_BF16 ? (void *)xb : (void *)x, (size_t)n * esz,
                       cudaMemcpyHostToDevice), "cudaMemcpy x");
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess); /* a pageable upload may land after cudaMemcpy returns */
    dev_out o = alloc_out(r, c->rows, c->cols, c->swz);
    dev_out t = {0};
    if (c->trans) t = alloc_out(r, c->cols, c->rows, c->swz);
    size_t wsn = dw_quantize_cuda_workspace_bytes(r, c->rows, c->cols);
    void *ws = wsn ? dev_poisoned(wsn) : NULL;
    dw_status s = dw_quantize_cuda(NULL, &c->o, c->in, dx + off, c->rows, c->cols, c->t_only ? NULL : &o.d,
                                   c->trans ? &t.d : NULL, ws, NULL);
    if (s != DW_OK) fail_msg("%s: dw_quantize_cuda: %s", label, dw_errmsg(NULL));
    cuda_ok(cudaDeviceSynchronize(), label);
    int bad = c->t_only ? 0 : check_out(label, "row-wise", &o, &q);
    if (c->trans) bad += check_out(label, "transposed", &t, &qt);
    free_out(&o);
    if (c->trans) free_out(&t);
    cudaFree(ws);
    cudaFree(dx);
    free(q.codes);
    free(q.scales);
    free(qt.codes);
    free(qt.scales);
    free(x);
    free(xb);
    return bad;
}

static void test_all_recipes_bit_identical(void **state) {
    (void)state;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) fail_msg("no CUDA GPU: this test needs one");
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    /* whole 128x128 tiles ({128,128}, {512,1024}, {1152,640}, {2304,2560}) take the bulk-copy
     * kernel for BF16 transposed mxfp8 / mxfp8_e5m2 / fp8_block unless tune.kernel = 1; row-wise
     * BF16 of those recipes takes the bulk-copy ring with tune.kernel = 2 (partial last stage:
     * {300,96}) */
    const int64_t shapes[][2] = {{128, 128}, {256, 384}, {1, 33}, {130, 7}, {129, 257}, {300, 96},
                                 {17, 1000}, {1000, 17}, {0, 0}, {0, 0}, {512, 1024}, {1152, 640},
                                 {2304, 2560}};
    int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    int cases = 0, bad = 0, t_only = 0;
    for (int ri = 1; ri < DW_RECIPE_COUNT; ri++) {
        dw_recipe r = (dw_recipe)ri;
        bool one_byte = dw_recipe_scale_bytes(r) == 1;
        for (int si = 0; si < nshapes; si++) {
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            if (rows == 0) { /* fresh random shapes, ragged in both dimensions */
                rows = 1 + (int64_t)(dw_test_next(&rng) % 400);
                cols = 1 + (int64_t)(dw_test_next(&rng) % 400);
            }
            /* the large shape runs the row-wise kernel's grid-stride loop more than once, and
             * the bulk kernel over more tiles than CTAs (variants 0, 1, 5 only: F32, BF16, BF16 +T) */
            const bool large = rows * cols > 4000000;
            for (int variant = 0; variant < 8; variant++) {
                if (large && variant != 0 && variant != 1 && variant != 5) continue;
                qcase c = {.in = (variant & 1) ? DW_QUANT_IN_BF16 : DW_QUANT_IN_F32,
                           .o = {.recipe = r,
                                 .rounding = (variant & 2) ? DW_SCALE_FLOOR : DW_SCALE_RCEIL,
                                 .pow2 = (variant & 2) != 0},
                           .trans = (variant & 4) != 0,
                           .swz = one_byte && ((variant >> 1) & 1) != (variant >> 2),
                           .misalign = si == 1 && (variant & 1),
                           .rows = rows, .cols = cols,
                           .kind = (int)((si + variant) % 4)};
                /* vary the tile ring's depth (2..6 for BF16 tiles, 2..3 for FP32's twice larger
                 * ones), CTAs per SM, and sometimes cap the grid at 1..3 CTAs, so that each CTA
                 * wraps around its ring many times; both tile kernels where both apply */
                c.tune.stages = 2 + (int)(dw_test_next(&rng) % (c.in == DW_QUANT_IN_BF16 ? 5 : 2));
                c.tune.ctas_per_sm = (int)(dw_test_next(&rng) % 4); /* 3: the bulk kernel built for 3 */
                c.tune.max_ctas = (dw_test_next(&rng) % 2) ? 1 + (int)(dw_test_next(&rng) % 3) : 0;
                /* every transposed-store path: cp.async kernel 1, 2 (3 acts as 2); bulk kernel 1
                 * registers, 2 staged + bulk copies, 3 staged + 16-byte stores, 4 staged + tensor
                 * stores, 5 the same from a staging buffer of its own; 0 the defaults */
                c.tune.t_store = (int)(dw_test_next(&rng) % 6);
                c.tune.load = (int)(dw_test_next(&rng) % 3); /* bulk kernel: 1 row copies, 2/0 tensor map */
                c.tune.group = (int)(dw_test_next(&rng) % 6); /* bulk kernel tile bands (0 the default) */
                /* bulk kernel: units of 1, 2 or 4 tiles square with staged scale runs (0 the default;
                 * {1152, 640} and {2304, 2560} leave partial units at the edges) */
                c.tune.tile_block = (int[]){0, 1, 2, 4}[dw_test_next(&rng) % 4];
                /* t_store 5 (0: the bulk kernel's default) keeps a 32 KiB staging beside the ring:
                 * 6 stages do not fit beside it and the kernel's static shared memory */
                if ((c.tune.t_store == 5 || c.tune.t_store == 0) && c.tune.stages > 5) c.tune.stages = 5;
                c.tune.kernel = (int)(dw_test_next(&rng) % 3);
                /* transposed cases that allow it write x^T alone (a wgrad's x): all of variant 7,
                 * half of variant 5 (the other half keeps both copies) */
                c.t_only = c.trans && !c.misalign && c.tune.kernel != 1 && (r == DW_RECIPE_MXFP8 ||
                           r == DW_RECIPE_MXFP8_E5M2 || r == DW_RECIPE_FP8_BLOCK) && c.in == DW_QUANT_IN_BF16 &&
                           rows % 128 == 0 && cols % 128 == 0 && (variant == 7 || dw_test_next(&rng) % 2);
                bad += run_case(&rng, &c);
                t_only += c.t_only;
                cases++;
            }
        }
    }
    dw_quantize_cuda_set_tuning(NULL, NULL);
    fprintf(stderr, "test_quant: %d cases (%d with the transposed copy alone), %d mismatching\n", cases, t_only, bad);
    if (t_only == 0) fail_msg("no case wrote the transposed copy alone");
    assert_int_equal(bad, 0);
}

static void test_rejects_bad_arguments(void **state) {
    (void)state;
    dw_quant_opts o = {.recipe = DW_RECIPE_FP8_BLOCK};
    dw_quant_dev_out out = {0};
    float dummy = 0.0f;
    assert_int_equal(dw_quantize_cuda(NULL, &o, DW_QUANT_IN_F32, &dummy, 4, 4, &out, NULL, NULL, NULL),
                     DW_ERR_INVALID);
    out.codes = (uint8_t *)&dummy;
    out.scales = &dummy;
    out.scales_swizzled = (uint8_t *)&dummy;
    assert_int_equal(dw_quantize_cuda(NULL, &o, DW_QUANT_IN_F32, &dummy, 4, 4, &out, NULL, NULL, NULL),
                     DW_ERR_INVALID); /* FP32 scales have no swizzled layout */
    o.recipe = DW_RECIPE_NVFP4;
    out.scales_swizzled = NULL;
    assert_int_equal(dw_quantize_cuda(NULL, &o, DW_QUANT_IN_F32, &dummy, 4, 16, &out, NULL, NULL, NULL),
                     DW_ERR_INVALID); /* no tensor_scale */
    dw_quant_tuning bad_stages = {.stages = 7}, bad_ctas = {.max_ctas = -1}, bad_kernel = {.kernel = 3},
                    bad_store = {.t_store = 6}, bad_load = {.load = 3}, bad_group = {.group = 65},
                    bad_tblock = {.tile_block = 3};
    assert_int_equal(dw_quantize_cuda_set_tuning(NULL, &bad_tblock), DW_ERR_INVALID);
    assert_int_equal(dw_quantize_cuda_set_tuning(NULL, &bad_group), DW_ERR_INVALID);
    assert_int_equal(dw_quantize_cuda_set_tuning(NULL, &bad_load), DW_ERR_INVALID);
    assert_int_equal(dw_quantize_cuda_set_tuning(NULL, &bad_store), DW_ERR_INVALID);
    assert_int_equal(dw_quantize_cuda_set_tuning(NULL, &bad_stages), DW_ERR_INVALID);
    assert_int_equal(dw_quantize_cuda_set_tuning(NULL, &bad_ctas), DW_ERR_INVALID);
    assert_int_equal(dw_quantize_cuda_set_tuning(NULL, &bad_kernel), DW_ERR_INVALID);
    o.recipe = DW_RECIPE_BF16;
    assert_int_equal(dw_quantize_cuda(NULL, &o, DW_QUANT_IN_F32, &dummy, 4, 4, &out, NULL, NULL, NULL),
                     DW_ERR_UNSUPPORTED);
    /* the transposed copy alone: not without any output, not from FP32, not for ragged tiles */
    o.recipe = DW_RECIPE_FP8_BLOCK;
    out.scales_swizzled = NULL;
    assert_int_equal(dw_quantize_cuda(NULL, &o, DW_QUANT_IN_BF16, &dummy, 128, 128, NULL, NULL, NULL, NULL),
                     DW_ERR_INVALID);
    assert_false(dw_quantize_cuda_transposed_only_ok(DW_RECIPE_FP8_BLOCK, DW_QUANT_IN_F32, 128, 128));
    assert_false(dw_quantize_cuda_transposed_only_ok(DW_RECIPE_FP8_BLOCK, DW_QUANT_IN_BF16, 128, 130));
    assert_false(dw_quantize_cuda_transposed_only_ok(DW_RECIPE_FP8_BLOCK2D, DW_QUANT_IN_BF16, 128, 128));
    assert_true(dw_quantize_cuda_transposed_only_ok(DW_RECIPE_FP8_BLOCK, DW_QUANT_IN_BF16, 256, 128));
    assert_int_equal(dw_quantize_cuda(NULL, &o, DW_QUANT_IN_F32, &dummy, 128, 128, NULL, &out, NULL, NULL),
                     DW_ERR_UNSUPPORTED);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_recipes_bit_identical),
        cmocka_unit_test(test_rejects_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
