/* test_gemm.c — the CPU reference GEMM against an independent dense oracle for every recipe,
 * transpose and epilogue (fresh random inputs, shapes off the tile grid, poisoned outputs, NaN
 * never passing), the registry (selection, priorities, predicates, user kernels, explain) and
 * the Blackwell 128x4 scale-tile layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepwell.h"
#include "gemm/gemm_args.h"
#include "gemm/kernels.h"
#include "test_gemm_util.h"
#include "testutil.h"

static dw_ctx *cpu_ctx(void) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    assert_int_equal(dw_ctx_create(&o, &ctx), DW_OK);
    return ctx;
}

/* Runs one case on the CPU reference and checks it against tg_expect. */
static void run_case(dw_ctx *ctx, dw_test_rng *r, int32_t ra, int32_t rb, bool ta, bool tb, int32_t out, int epi,
                     int64_t m, int64_t n, int64_t k, float beta) {
    tg_operand oa, ob;
    tg_make(r, &oa, ra, ta ? k : m, ta ? m : k, ta);
    tg_make(r, &ob, rb, tb ? n : k, tb ? k : n, tb);
    size_t es = tg_out_size(out);
    void *d = malloc((size_t)(m * n) * es), *c = malloc((size_t)(m * n) * es), *bias = malloc((size_t)n * es);
    void *aux = malloc((size_t)(m * n) * es), *bgrad = malloc((size_t)m * es);
    double *cd = malloc((size_t)(m * n) * sizeof(double)), *bd = malloc((size_t)n * sizeof(double));
    tg_fill_out(r, c, out, m * n, cd);
    tg_fill_out(r, bias, out, n, bd);
    memset(d, 0xff, (size_t)(m * n) * es); /* poison: NaN in both output types */
    double *auxd = malloc((size_t)(m * n) * sizeof(double));
    if (epi & DW_EPI_DGELU) tg_fill_out(r, aux, out, m * n, auxd); /* an input: the pre-activation */
    else memset(aux, 0xff, (size_t)(m * n) * es);
    memset(bgrad, 0xff, (size_t)m * es);
    dw_gemm_args a = {.m = m, .n = n, .k = k, .a = oa.op, .b = ob.op, .alpha = dw_test_uniform(r, 0.5f, 1.5f),
                      .beta = beta, .c = c, .d = d, .out_type = out, .epilogue = epi, .bias = bias, .aux = aux,
                      .bgrad = bgrad};
    const char *name = NULL;
    if (dw_gemm_select(ctx, &a, &name) != DW_OK) fail_msg("select: %s", dw_errmsg(ctx));
    assert_string_equal(name, "cpu_reference");
    assert_int_equal(dw_gemm(ctx, &a), DW_OK);

    double *ed = malloc((size_t)(m * n) * sizeof(double)), *eaux = malloc((size_t)(m * n) * sizeof(double));
    double *eb = malloc((size_t)m * sizeof(double)), *got = malloc((size_t)(m * n) * sizeof(double));
    tg_expect(&a, &oa, &ob, cd, bd, auxd, ed, eaux, eb);
    /* the reference rounds once from double: FP32 output within 2^-24 relative, BF16 within 2^-8 */
    double tol = out == DW_GEMM_OUT_BF16 ? 4e-3 : 1e-6;
    tg_to_double(d, out, m * n, got);
    double err = tg_rel_err(got, ed, m * n);
    if (!(err <= tol))
        fail_msg("A=%s%s B=%s%s out=%d epi=%d %lldx%lldx%lld: rel err %.3g > %.3g",
                 dw_recipe_name((dw_recipe)ra), ta ? "^T" : "", dw_recipe_name((dw_recipe)rb), tb ? "^T" : "", out,
                 epi, (long long)m, (long long)n, (long long)k, err, tol);
    /* element-wise too: every output written and close. GELU and GELU' are evaluated in FP32 by
     * the library; their absolute error scales with the pre-activation (eaux), not the result, which
     * cancels near GELU's tail and GELU''s zero (seed 19386185630625355: DGELU, rel 9.4e-6) */
    bool act = (epi & (DW_EPI_GELU | DW_EPI_DGELU)) != 0;
    for (int64_t i = 0; i < m * n; i++)
        assert_true(fabs(got[i] - ed[i]) <= tol * 4 * (fabs(ed[i]) + (act ? fabs(eaux[i]) : 0) + 1e-3 * sqrt((double)k)));
    if (epi & DW_EPI_GELU_AUX) {
        tg_to_double(aux, out, m * n, got);
        assert_true(tg_rel_err(got, eaux, m * n) <= tol);
    }
    if (epi & DW_EPI_BGRAD) {
        tg_to_double(bgrad, out, m, got);
        assert_true(tg_rel_err(got, eb, m) <= tol);
    }
    free(ed), free(eaux), free(eb), free(got), free(cd), free(bd), free(auxd);
    free(d), free(c), free(bias), free(aux), free(bgrad);
    tg_free(&oa);
    tg_free(&ob);
}

static void test_reference_all_recipes(void **state) {
    (void)state;
    dw_ctx *ctx = cpu_ctx();
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed());
    for (int32_t rec = 0; rec < DW_RECIPE_COUNT; rec++)
        for (int t = 0; t < 4; t++) {
            int64_t m = 37 + (int64_t)(dw_test_next(&r) % 100), n = 29 + (int64_t)(dw_test_next(&r) % 100);
            int64_t k = 32 * (1 + (int64_t)(dw_test_next(&r) % 9)); /* MX blocks whole; 128-blocks ragged */
            run_case(ctx, &r, rec, rec, t & 1, (t >> 1) & 1, (int32_t)(dw_test_next(&r) % 2), 0, m, n, k, 0.0f);
        }
    /* mixed pairs: activations 1x128 with 128x128 weights; e5m2 with e4m3 */
    run_case(ctx, &r, DW_RECIPE_FP8_BLOCK, DW_RECIPE_FP8_BLOCK2D, false, true, DW_GEMM_OUT_BF16, 0, 130, 257, 300, 0);
    run_case(ctx, &r, DW_RECIPE_MXFP8_E5M2, DW_RECIPE_MXFP8, false, true, DW_GEMM_OUT_F32, 0, 65, 33, 96, 0);
    dw_ctx_free(ctx);
}

static void test_reference_epilogues(void **state) {
    (void)state;
    dw_ctx *ctx = cpu_ctx();
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed() ^ 1);
    const int epis[] = {DW_EPI_BIAS, DW_EPI_GELU, DW_EPI_BIAS | DW_EPI_GELU, DW_EPI_BIAS | DW_EPI_GELU | DW_EPI_GELU_AUX,
                        DW_EPI_BGRAD, DW_EPI_DGELU};
    for (size_t e = 0; e < sizeof epis / sizeof epis[0]; e++)
        for (int out = 0; out < 2; out++) {
            run_case(ctx, &r, DW_RECIPE_BF16, DW_RECIPE_BF16, e == 4, false, out, epis[e], 45, 70, 50,
                     e % 2 ? 0.5f : 0.0f);
            run_case(ctx, &r, DW_RECIPE_MXFP8, DW_RECIPE_MXFP8, false, true, out, epis[e], 33, 40, 64, 0.0f);
        }
    dw_ctx_free(ctx);
}

/* Properties of the arithmetic that do not depend on the oracle's code: MX with unit scales equals
 * FP8 tensorwise with scale 1; a NaN scale poisons exactly its rows; scaling one block scales its
 * contribution. */
static void test_reference_properties(void **state) {
    (void)state;
    dw_ctx *ctx = cpu_ctx();
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed() ^ 2);
    int64_t m = 20, n = 24, k = 96;
    tg_operand oa, ob;
    tg_make(&r, &oa, DW_RECIPE_MXFP8, m, k, false);
    tg_make(&r, &ob, DW_RECIPE_MXFP8, n, k, true);
    memset((void *)oa.op.scales, 127, oa.scale_bytes);
    memset((void *)ob.op.scales, 127, ob.scale_bytes);
    float *d1 = malloc((size_t)(m * n) * 4), *d2 = malloc((size_t)(m * n) * 4);
    dw_gemm_args a = {.m = m, .n = n, .k = k, .a = oa.op, .b = ob.op, .alpha = 1, .d = d1, .out_type = DW_GEMM_OUT_F32};
    assert_int_equal(dw_gemm(ctx, &a), DW_OK);
    float one = 1.0f;
    dw_gemm_args t = a;
    t.a.recipe = t.b.recipe = DW_RECIPE_FP8_TENSOR;
    t.a.scales = t.b.scales = &one;
    t.d = d2;
    assert_int_equal(dw_gemm(ctx, &t), DW_OK);
    assert_memory_equal(d1, d2, (size_t)(m * n) * 4);
    /* doubling block (row 3, k-block 1) of A adds exactly that block's contribution once more */
    ((uint8_t *)oa.op.scales)[3 * (k / 32) + 1] = 128;
    a.a = oa.op;
    assert_int_equal(dw_gemm(ctx, &a), DW_OK);
    double *A = tg_dense(&oa), *B = tg_dense(&ob);
    for (int64_t j = 0; j < n; j++) {
        double extra = 0;
        for (int64_t p = 32; p < 64; p++) extra += A[3 * k + p] / 2 * B[p * n + j];
        /* d1, d2 are FP32 roundings (2^-24 relative each): bound by both magnitudes, since d1 can
         * be small where d2 and extra nearly cancel (seen: d2 259.7, extra -260.05, d1 -0.31) */
        double e1 = d1[3 * n + j], e2 = d2[3 * n + j];
        assert_true(fabs(e1 - (e2 + extra)) <= 1e-6 * (1 + fabs(e1) + fabs(e2)));
        assert_true(d1[4 * n + j] == d2[4 * n + j]);
    }
    free(A), free(B);
    /* NaN scale: row 5 of D is NaN, every other row finite */
    ((uint8_t *)oa.op.scales)[5 * (k / 32)] = 0xFF;
    a.a = oa.op;
    assert_int_equal(dw_gemm(ctx, &a), DW_OK);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) assert_true(isnan(d1[i * n + j]) == (i == 5));
    free(d1), free(d2);
    tg_free(&oa);
    tg_free(&ob);
    dw_ctx_free(ctx);
}

static void test_validation(void **state) {
    (void)state;
    dw_ctx *ctx = cpu_ctx();
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed() ^ 3);
    tg_operand oa, ob;
    tg_make(&r, &oa, DW_RECIPE_BF16, 8, 16, false);
    tg_make(&r, &ob, DW_RECIPE_BF16, 16, 12, false);
    float d[96];
    dw_gemm_args a = {.m = 8, .n = 12, .k = 16, .a = oa.op, .b = ob.op, .alpha = 1, .d = d, .out_type = DW_GEMM_OUT_F32};
    assert_int_equal(dw_gemm(ctx, &a), DW_OK);
    dw_gemm_args bad = a;
    bad.k = 15;
    assert_int_equal(dw_gemm(ctx, &bad), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "op(A)"));
    bad = a;
    bad.b.trans = true;
    assert_int_equal(dw_gemm(ctx, &bad), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "op(B)"));
    bad = a;
    bad.beta = 1;
    assert_int_equal(dw_gemm(ctx, &bad), DW_ERR_INVALID);
    bad = a;
    bad.epilogue = DW_EPI_GELU_AUX;
    assert_int_equal(dw_gemm(ctx, &bad), DW_ERR_INVALID);
    bad = a;
    bad.epilogue = DW_EPI_DGELU; /* no aux */
    assert_int_equal(dw_gemm(ctx, &bad), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "DGELU"));
    bad.aux = bad.d;
    bad.epilogue = DW_EPI_DGELU | DW_EPI_BIAS;
    assert_int_equal(dw_gemm(ctx, &bad), DW_ERR_INVALID);
    bad = a;
    bad.a.recipe = DW_RECIPE_MXFP8; /* quantised without scales */
    assert_int_equal(dw_gemm(ctx, &bad), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "scales"));
    bad = a;
    bad.backend = "no_such_kernel";
    assert_int_equal(dw_gemm(ctx, &bad), DW_ERR_UNSUPPORTED);
    assert_non_null(strstr(dw_errmsg(ctx), "cpu_reference"));
    tg_free(&oa);
    tg_free(&ob);
    dw_ctx_free(ctx);
}

/* ---- registry ---- */
static int g_user_runs;
static dw_status user_run(dw_ctx *ctx, const dw_gemm_args *a, void *user) {
    (void)a;
    g_user_runs += *(int *)user;
    return dw_gemm_ref_run(ctx, a, NULL);
}
static bool user_eligible(const dw_gemm_args *a, void *user, const char **why) {
    (void)user;
    if (a->m % 16) return *why = "m must be a multiple of 16", false;
    return true;
}

static void test_registry(void **state) {
    (void)state;
    dw_ctx *ctx = cpu_ctx();
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed() ^ 4);
    tg_operand oa, ob;
    tg_make(&r, &oa, DW_RECIPE_BF16, 32, 16, false);
    tg_make(&r, &ob, DW_RECIPE_BF16, 16, 8, false);
    float d[256];
    dw_gemm_args a = {.m = 32, .n = 8, .k = 16, .a = oa.op, .b = ob.op, .alpha = 1, .d = d, .out_type = DW_GEMM_OUT_F32};
    int inc = 1;
    dw_kernel_desc k = {.name = "user_bf16", .op = DW_KOP_GEMM, .recipe_a = DW_RECIPE_BF16, .recipe_b = DW_RECIPE_BF16,
                        .device = DW_DEVICE_CPU, .priority = 5, .eligible = user_eligible, .run = user_run, .user = &inc};
    assert_int_equal(dw_kernel_register(&k), DW_OK);
    const char *name = NULL;
    assert_int_equal(dw_gemm_select(ctx, &a, &name), DW_OK);
    assert_string_equal(name, "user_bf16");
    g_user_runs = 0;
    assert_int_equal(dw_gemm(ctx, &a), DW_OK);
    assert_int_equal(g_user_runs, 1);
    /* the predicate rejects m = 31 (A [31, 16]); the reference takes over, and explain says why */
    dw_gemm_args b = a;
    b.m = 31;
    b.a.rows = 31;
    assert_int_equal(dw_gemm_select(ctx, &b, &name), DW_OK);
    assert_string_equal(name, "cpu_reference");
    char *ex = NULL;
    assert_int_equal(dw_gemm_explain(ctx, &b, &ex), DW_OK);
    assert_non_null(strstr(ex, "m must be a multiple of 16"));
    assert_non_null(strstr(ex, "selected: cpu_reference"));
    dw_free_string(ex);
    /* CUDA kernels never win on a CPU context; the explanation names the reason */
    assert_int_equal(dw_gemm_explain(ctx, &a, &ex), DW_OK);
    if (dw_built_with_cuda()) assert_non_null(strstr(ex, "CUDA kernel, CPU context"));
    dw_free_string(ex);
    /* autotuning applies to CUDA contexts only: on the CPU the choice stays by priority */
    dw_gemm_set_autotune(true);
    assert_int_equal(dw_gemm(ctx, &b), DW_OK);
    assert_int_equal(dw_gemm_select(ctx, &b, &name), DW_OK);
    assert_string_equal(name, "cpu_reference");
    dw_gemm_set_autotune(false);
    /* forcing a backend by name */
    b = a;
    b.backend = "cpu_reference";
    assert_int_equal(dw_gemm_select(ctx, &b, &name), DW_OK);
    assert_string_equal(name, "cpu_reference");
    /* re-registering replaces; a lower priority loses to the reference's tie-break? no: 0 vs -1 */
    k.priority = -1;
    assert_int_equal(dw_kernel_register(&k), DW_OK);
    assert_int_equal(dw_gemm_select(ctx, &a, &name), DW_OK);
    assert_string_equal(name, "cpu_reference");
    /* bad registrations */
    dw_kernel_desc bad = k;
    bad.run = NULL;
    assert_int_equal(dw_kernel_register(&bad), DW_ERR_INVALID);
    bad = k;
    bad.name = "";
    assert_int_equal(dw_kernel_register(&bad), DW_ERR_INVALID);
    assert_true(dw_kernel_unregister("user_bf16"));
    assert_false(dw_kernel_unregister("user_bf16"));
    /* no CPU kernel at all: UNSUPPORTED with the list */
    assert_true(dw_kernel_unregister("cpu_reference"));
    assert_int_equal(dw_gemm(ctx, &a), DW_ERR_UNSUPPORTED);
    assert_non_null(strstr(dw_errmsg(ctx), "no kernel"));
    dw_kernel_desc ref = {.name = "cpu_reference", .op = DW_KOP_GEMM, .recipe_a = -1, .recipe_b = -1,
                          .device = DW_DEVICE_CPU, .run = dw_gemm_ref_run};
    assert_int_equal(dw_kernel_register(&ref), DW_OK);
    assert_int_equal(dw_gemm(ctx, &a), DW_OK);
    tg_free(&oa);
    tg_free(&ob);
    dw_ctx_free(ctx);
}

/* ---- Blackwell 128x4 scale tiles ----
 * Emulates what an sm_100 block-scaled GEMM computes when it reads its scales from the tiled
 * buffer the cuBLASLt backend builds (dw_scale_swizzle_cpu, the host twin of the device swizzle),
 * locating each scale through its own reading of the tile ([32][4][4] bytes: row%32, row/32 within
 * the tile, col%4), and compares with the reference, for MXFP8 and NVFP4 on ragged shapes. */
static double tiled_scale(const uint8_t *tiled, int64_t r, int64_t c, int64_t scols, int32_t recipe) {
    int64_t ct = (scols + 3) / 4;
    const uint8_t *tile = tiled + ((r / 128) * ct + c / 4) * 512;
    uint8_t code = tile[(r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4)];
    return recipe == DW_RECIPE_NVFP4 ? dw_decode_ue4m3(code) : dw_decode_ue8m0(code);
}

static double elem(const tg_operand *o, int64_t r, int64_t c) {
    const uint8_t *d = o->op.data;
    if (o->op.recipe == DW_RECIPE_NVFP4)
        return dw_decode_e2m1((uint8_t)((d[r * ((o->op.cols + 1) / 2) + c / 2] >> (4 * (c & 1))) & 15));
    return dw_decode_e4m3(d[r * o->op.cols + c]);
}

static void test_scale_tiles_emulated_gemm(void **state) {
    (void)state;
    dw_ctx *ctx = cpu_ctx();
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed() ^ 5);
    for (int t = 0; t < 6; t++) {
        int32_t rec = t % 2 ? DW_RECIPE_NVFP4 : DW_RECIPE_MXFP8;
        int64_t m = 1 + (int64_t)(dw_test_next(&r) % 260), n = 1 + (int64_t)(dw_test_next(&r) % 140);
        int64_t k = 16 * (1 + (int64_t)(dw_test_next(&r) % 20));
        tg_operand oa, ob;
        tg_make(&r, &oa, rec, m, k, false);
        tg_make(&r, &ob, rec, n, k, true);
        uint8_t *ta = malloc(dw_scale_swizzled_bytes(oa.srows, oa.scols));
        uint8_t *tb = malloc(dw_scale_swizzled_bytes(ob.srows, ob.scols));
        dw_scale_swizzle_cpu(oa.op.scales, oa.srows, oa.scols, ta);
        dw_scale_swizzle_cpu(ob.op.scales, ob.srows, ob.scols, tb);
        int blk = rec == DW_RECIPE_NVFP4 ? 16 : 32;
        float *d = malloc((size_t)(m * n) * 4);
        dw_gemm_args a = {.m = m, .n = n, .k = k, .a = oa.op, .b = ob.op, .alpha = 1, .d = d,
                          .out_type = DW_GEMM_OUT_F32};
        assert_int_equal(dw_gemm(ctx, &a), DW_OK);
        double ts = rec == DW_RECIPE_NVFP4 ? (double)oa.op.tensor_scale * ob.op.tensor_scale : 1.0;
        if (rec == DW_RECIPE_NVFP4) { /* the same tensor scales read through tensor_scale_ptr */
            float tsa = oa.op.tensor_scale, tsb = ob.op.tensor_scale, *d2 = malloc((size_t)(m * n) * 4);
            dw_gemm_args a2 = a;
            a2.a.tensor_scale = a2.b.tensor_scale = NAN; /* must not be read */
            a2.a.tensor_scale_ptr = &tsa;
            a2.b.tensor_scale_ptr = &tsb;
            a2.d = d2;
            assert_int_equal(dw_gemm(ctx, &a2), DW_OK);
            assert_memory_equal(d, d2, (size_t)(m * n) * 4);
            free(d2);
        }
        double *got = malloc((size_t)(m * n) * sizeof(double)), *emu = malloc((size_t)(m * n) * sizeof(double));
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++)
                    s += elem(&oa, i, p) * tiled_scale(ta, i, p / blk, oa.scols, rec) * elem(&ob, j, p) *
                         tiled_scale(tb, j, p / blk, ob.scols, rec);
                emu[i * n + j] = s * ts;
                got[i * n + j] = d[i * n + j];
            }
        double err = tg_rel_err(got, emu, m * n);
        if (!(err <= 1e-6)) fail_msg("%s %lldx%lldx%lld: tiled-scale emulation differs, rel err %.3g",
                                     dw_recipe_name((dw_recipe)rec), (long long)m, (long long)n, (long long)k, err);
        free(got), free(emu), free(d), free(ta), free(tb);
        tg_free(&oa);
        tg_free(&ob);
    }
    dw_ctx_free(ctx);
}

/* The shared eligibility checks of Deepwell's own sm_90a kernels (MXFP8: k % 32, FP8 block: k % 128):
 * K-major operands only, k on the scale grid, dimensions under 2^31, no BGRAD / DGELU; random shapes. */
static void test_sm90_own_checks(void **state) {
    (void)state;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 5);
    const int64_t kmuls[2] = {32, 128};
    for (int t = 0; t < 200; t++) {
        const int64_t kmul = kmuls[t & 1];
        int64_t m = 1 + (int64_t)(dw_test_next(&rng) % 5000), n = 1 + (int64_t)(dw_test_next(&rng) % 5000);
        int64_t k = kmul * (1 + (int64_t)(dw_test_next(&rng) % 64));
        dw_gemm_args a = {.m = m, .n = n, .k = k};
        a.a = (dw_gemm_operand){.rows = m, .cols = k};
        a.b = (dw_gemm_operand){.trans = true, .rows = n, .cols = k};
        const char *why = NULL;
        assert_true(dw_gemm_sm90_own_eligible(&a, kmul, &why));
        a.epilogue = (int32_t)(dw_test_next(&rng) % 2 ? DW_EPI_BIAS : DW_EPI_BIAS | DW_EPI_GELU | DW_EPI_GELU_AUX);
        assert_true(dw_gemm_sm90_own_eligible(&a, kmul, &why));
        dw_gemm_args b = a; /* A stored [k, m] */
        b.a.trans = true;
        assert_false(dw_gemm_sm90_own_eligible(&b, kmul, &why));
        assert_non_null(strstr(why, "K-major"));
        b = a; /* B stored [k, n] */
        b.b.trans = false;
        assert_false(dw_gemm_sm90_own_eligible(&b, kmul, &why));
        b = a; /* k off the scale grid */
        b.k = k + 1 + (int64_t)(dw_test_next(&rng) % (uint64_t)(kmul - 1));
        assert_false(dw_gemm_sm90_own_eligible(&b, kmul, &why));
        char want[48];
        snprintf(want, sizeof want, "multiple of %lld", (long long)kmul);
        assert_non_null(strstr(why, want));
        b = a;
        b.epilogue = dw_test_next(&rng) % 2 ? DW_EPI_BGRAD : DW_EPI_DGELU;
        assert_false(dw_gemm_sm90_own_eligible(&b, kmul, &why));
        assert_non_null(strstr(why, "gradient"));
        b = a;
        b.m = (int64_t)INT32_MAX + 1 + (int64_t)(dw_test_next(&rng) % 1000);
        assert_false(dw_gemm_sm90_own_eligible(&b, kmul, &why));
        assert_non_null(strstr(why, "2^31"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_all_recipes), cmocka_unit_test(test_reference_epilogues),
        cmocka_unit_test(test_reference_properties),  cmocka_unit_test(test_validation),
        cmocka_unit_test(test_registry),              cmocka_unit_test(test_scale_tiles_emulated_gemm),
        cmocka_unit_test(test_sm90_own_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
