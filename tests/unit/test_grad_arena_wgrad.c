/* test_grad_arena_wgrad.c — dw_grouped_args.overwrite, the grouped expert wgrad's "write dW over"
 * that grad_arena's first writer of an expert weight uses (compile/grad_arena.c), on the CPU
 * references the registry picks (grouped_cpu_reference: FP32; the fp8_block one on 1x128-blocked
 * dy^T and x^T), with fresh random sizes and routing, an expert without rows and rows past the
 * groups every time:
 *   - overwrite into dW full of NaN gives the bits that adding into zeros gives (every expert,
 *     the one without rows zeros);
 *   - overwrite false (a zeroed struct's) still adds: into a random dW, each element is base + the
 *     zeros' result within two FP32 ulps (the kernel rounds the sum once), the empty expert's base
 *     kept bit for bit.
 * tests/gpu/test_ops_cuda_moe_wgrad.c checks the CUDA kernels the same way on a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepwell.h"
#include "gemm/grouped_fp8.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

/* offsets (E+1) over R rows (R > E): random group sizes, at least one row for every expert but
 * `empty`, which has none, and 1 to 3 rows past the last group. */
static void random_offsets(int32_t *off, int64_t E, int64_t R, int64_t empty) {
    const int64_t last = empty == E - 1 ? E - 2 : E - 1; /* the last expert with rows takes what is left */
    int64_t left = R - dw_test_rnd(1, 3) - (E - 1); /* rows beyond one for each expert with rows */
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t extra = e == empty ? 0 : e == last ? left : dw_test_rnd(0, left / 2);
        left -= extra;
        off[e + 1] = (int32_t)(off[e] + (e == empty ? 0 : 1 + extra));
    }
}

static float *random_floats(int64_t n, float lo, float hi) {
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = dw_test_uniform(RNG, lo, hi);
    return v;
}

/* dW of a (its out set here) written over NaN and added into zeros: the same bits; added into
 * base: base + the zeros' result. Returns how many elements were compared. */
static int64_t check_wgrad(dw_grouped_args a, int64_t E, int64_t M, int64_t K, const char *what) {
    const int64_t n = E * M * K;
    float *over = malloc((size_t)n * 4), *zeros = calloc((size_t)n, 4), *base = random_floats(n, -2.0f, 2.0f);
    float *added = malloc((size_t)n * 4);
    assert_true(over && zeros && added);
    memset(over, 0xff, (size_t)n * 4); /* NaN */
    memcpy(added, base, (size_t)n * 4);
    const char *name = NULL;
    a.overwrite = true, a.out = over;
    assert_int_equal(dw_grouped_select(CTX, &a, &name), DW_OK);
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
    a.overwrite = false, a.out = zeros;
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
    a.out = added;
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
    int64_t nonzero = 0, with_rows = 0; /* elements of experts with rows: not all zeros */
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&over[i], &zeros[i], 4))
            fail_msg("%s (%s): dW[%lld] written over NaN is %.9g, added into zeros %.9g", what, name, (long long)i,
                     over[i], zeros[i]);
        const double want = (double)base[i] + zeros[i]; /* the sum in double, rounded once: within an ulp or two */
        if (fabs(added[i] - want) > 2 * FLT_EPSILON * fmax(fabs(want), fabs(zeros[i])))
            fail_msg("%s (%s): dW[%lld] added into %.9g is %.9g, expected %.9g", what, name, (long long)i, base[i],
                     added[i], want);
    }
    for (int64_t e = 0; e < E; e++) { /* the expert without rows: zeros written, nothing added */
        if (a.offsets[e + 1] != a.offsets[e]) {
            with_rows += M * K;
            for (int64_t i = e * M * K; i < (e + 1) * M * K; i++) nonzero += zeros[i] != 0.0f;
            continue;
        }
        for (int64_t i = e * M * K; i < (e + 1) * M * K; i++)
            if (!(zeros[i] == 0.0f && added[i] == base[i]))
                fail_msg("%s: expert %lld has no rows, yet dW[%lld] = %g (added: %g, base %g)", what, (long long)e,
                         (long long)i, zeros[i], added[i], base[i]);
    }
    if (with_rows == 0 || nonzero < with_rows * 9 / 10)
        fail_msg("%s: only %lld of the %lld dW elements of experts with rows non-zero", what, (long long)nonzero,
                 (long long)with_rows);
    printf("  %-10s %-28s E %lld, M %lld, K %lld, rows %d of %lld: overwrite = add into zeros, bit for bit\n", what,
           name, (long long)E, (long long)M, (long long)K, a.offsets[E], (long long)a.rows);
    free(over), free(zeros), free(base), free(added);
    return n;
}

static void test_bf16_reference(void **state) {
    (void)state;
    for (int rep = 0; rep < 4; rep++) {
        const int64_t E = dw_test_rnd(2, 6), M = dw_test_rnd(1, 24), K = dw_test_rnd(1, 24), R = dw_test_rnd(E + 4, 60);
        int32_t off[8];
        random_offsets(off, E, R, dw_test_rnd(0, E - 1));
        float *x = random_floats(R * K, -1.0f, 1.0f), *dy = random_floats(R * M, -1.0f, 1.0f);
        const dw_grouped_args a = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_BF16,
                                   .rows = R, .experts = E, .k = K, .m = M, .x = x, .dy = dy, .offsets = off};
        check_wgrad(a, E, M, K, "bf16");
        free(x), free(dy);
    }
}

static void test_fp8_block_reference(void **state) {
    (void)state;
    for (int rep = 0; rep < 2; rep++) {
        const int64_t E = dw_test_rnd(2, 4), M = 128 * dw_test_rnd(1, 2), K = 128, R = dw_test_rnd(E + 4, 300);
        int32_t off[8];
        random_offsets(off, E, R, dw_test_rnd(0, E - 1));
        float *x = random_floats(R * K, -1.0f, 1.0f), *dy = random_floats(R * M, -1e-3f, 1e-3f);
        const int64_t P = dw_grouped_fp8_wgrad_cols(R, E);
        uint8_t *xc = malloc((size_t)(K * P)), *dyc = malloc((size_t)(M * P));
        float *xs = malloc((size_t)(K * P / 128) * 4), *dys = malloc((size_t)(M * P / 128) * 4);
        assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(CTX, x, off, R, E, K, xc, xs), DW_OK);
        assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(CTX, dy, off, R, E, M, dyc, dys), DW_OK);
        const dw_grouped_args a = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_FP8_BLOCK,
                                   .rows = R, .experts = E, .k = K, .m = M, .x = xc, .dy = dyc, .offsets = off,
                                   .x_scales = xs, .dy_scales = dys};
        check_wgrad(a, E, M, K, "fp8_block");
        free(x), free(dy), free(xc), free(dyc), free(xs), free(dys);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_reference),
        cmocka_unit_test(test_fp8_block_reference),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
