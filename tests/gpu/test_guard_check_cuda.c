/* test_guard_check_cuda.c — the guard's quantisation-error check on the device (kernels/cuda/
 * quant_check.cu, dw_qcheck_cuda) against its definition, the CPU reference dw_qstats_measure
 * (precision/quant_stats.c), on the same tensors: fresh random values with planted outliers
 * (10^3 to 10^5 of the spread, which saturate or set their block's scale), tiny values (flushed)
 * and zeros, sometimes a NaN or an Inf; FP32 and BF16 inputs, row-wise and transposed, every
 * recipe; caps that take the whole tensor (0, or over its size) and caps that sample a few block
 * rows (the amax's always among them). Exact: the elements measured, the counts (saturated,
 * flushed, non-finite), max_abs and the tensor's elements; the four double sums (the same terms
 * added in another order) within the bound of that reordering (2 n 2^-53 relative). Each
 * accumulator takes two tensors, so the sums add as the reference's do. Some cases must sample
 * (measured < elements) and some must saturate and flush, or the test fails: it cannot pass by
 * measuring nothing. Label gpu; needs a real GPU (the quantiser's PTX conversions; its kernels
 * ran on the host emulator with the CPU reference standing in for dw_quantize_cuda). */
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
#include "kernels/cuda/quant_check.h"
#include "precision/quant_stats.h"
#include "testutil.h"

static void ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) fail_msg("%s: %s", what, cudaGetErrorString(e));
}

/* x [n]: spread x normal, with planted outliers, tiny values, zeros and (odd) one NaN or Inf. */
static void planted(dw_test_rng *rng, float *x, int64_t n, bool odd) {
    const float spread = ldexpf(1.0f, (int)dw_test_rnd(-20, 20));
    for (int64_t i = 0; i < n; i++) {
        const int64_t pick = dw_test_rnd(0, 200);
        x[i] = pick == 0   ? 0.0f
               : pick == 1 ? 1e-12f * spread
               : pick == 2 ? (float)dw_test_rnd(-1, 1) * ldexpf(spread, (int)dw_test_rnd(10, 17)) * 1.3f
                           : spread * dw_test_normal(rng);
    }
    if (odd) x[dw_test_rnd(0, n - 1)] = dw_test_rnd(0, 1) ? NAN : -INFINITY;
}

/* Two sums of the same n non-negative terms in other orders: each within (n - 1) u of the exact
 * sum (u = 2^-53), so within 2 n u of each other, relative. */
static bool close_rel(double a, double b, int64_t n) {
    return a == b || fabs(a - b) <= 2.0 * (double)n * 0x1p-53 * fmax(fabs(a), fabs(b));
}

/* The device's and the reference's accumulators agree (see the file's comment). */
static void agree(const dw_qstats *g, const dw_qstats *c, const char *what) {
    const bool same_max = (isnan(g->q.max_abs) && isnan(c->q.max_abs)) || g->q.max_abs == c->q.max_abs;
    if (g->q.n != c->q.n || g->elements != c->elements || g->q.saturated != c->q.saturated ||
        g->q.flushed != c->q.flushed || g->q.nonfinite != c->q.nonfinite || !same_max)
        fail_msg("%s: GPU n %lld of %lld, saturated %lld, flushed %lld, nonfinite %lld, max_abs %.17g; CPU n %lld of "
                 "%lld, saturated %lld, flushed %lld, nonfinite %lld, max_abs %.17g",
                 what, (long long)g->q.n, (long long)g->elements, (long long)g->q.saturated, (long long)g->q.flushed,
                 (long long)g->q.nonfinite, g->q.max_abs, (long long)c->q.n, (long long)c->elements,
                 (long long)c->q.saturated, (long long)c->q.flushed, (long long)c->q.nonfinite, c->q.max_abs);
    const int64_t n = c->q.n;
    if (!close_rel(g->q.sum_x2, c->q.sum_x2, n) || !close_rel(g->q.sum_e2, c->q.sum_e2, n) ||
        !close_rel(g->bulk_x2, c->bulk_x2, n) || !close_rel(g->bulk_e2, c->bulk_e2, n))
        fail_msg("%s: GPU sum_x2 %.17g sum_e2 %.17g bulk_x2 %.17g bulk_e2 %.17g; CPU %.17g %.17g %.17g %.17g", what,
                 g->q.sum_x2, g->q.sum_e2, g->bulk_x2, g->bulk_e2, c->q.sum_x2, c->q.sum_e2, c->bulk_x2, c->bulk_e2);
}

static void test_against_cpu(void **state) {
    (void)state;
#ifndef DW_CUDA_EMU
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) skip();
#endif
    dw_ctx *ctx = dw_test_ctx;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    int64_t sampled = 0, saturated = 0, flushed = 0, cases = 0;
    for (int r = 0; r < DW_RECIPE_COUNT; r++) {
        if (r == DW_RECIPE_BF16) continue;
        int br, bc;
        dw_recipe_block((dw_recipe)r, &br, &bc);
        for (int variant = 0; variant < 12; variant++) {
            const bool trans = variant & 1, bf16 = variant & 2, odd = variant == 11;
            const int capk = variant / 4; /* 0: whole (cap 0 or over the size), 1, 2: sampled */
            /* rows of the layout: several groups of block rows (128 for fp8_block2d) */
            const int64_t R = br > 1 ? dw_test_rnd(300, 700) : dw_test_rnd(40, 400), C = dw_test_rnd(1, 300);
            const int64_t rows = trans ? C : R, cols = trans ? R : C, n = rows * cols;
            const int64_t group = (br > 1 ? br : 1) * C;
            const int64_t cap = capk == 0 ? (dw_test_rnd(0, 1) ? 0 : n + dw_test_rnd(0, 100))
                                          : group * dw_test_rnd(1, 2) + dw_test_rnd(0, group - 1);
            float *x[2], *xf[2];
            void *dx[2];
            dw_qstats gs = dw_qstats_zero(), cs = dw_qstats_zero();
            gs.cap = cs.cap = cap;
            for (int t = 0; t < 2; t++) { /* two tensors of the same shape into one accumulator */
                x[t] = malloc((size_t)n * sizeof *x[t]);
                xf[t] = malloc((size_t)n * sizeof *xf[t]);
                uint16_t *xb = malloc((size_t)n * sizeof *xb);
                planted(&rng, x[t], n, odd && t == 1);
                for (int64_t i = 0; i < n; i++) xb[i] = dw_encode_bf16(x[t][i]), xf[t][i] = bf16 ? dw_decode_bf16(xb[i]) : x[t][i];
                const size_t bytes = (size_t)n * (bf16 ? 2 : 4);
                ok(cudaMalloc(&dx[t], bytes), "cudaMalloc");
                ok(cudaMemcpy(dx[t], bf16 ? (void *)xb : (void *)x[t], bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
                assert_int_equal(cudaDeviceSynchronize(), cudaSuccess); /* a pageable upload may land after cudaMemcpy returns */
                free(xb);
                if (dw_qcheck_cuda(ctx, (dw_recipe)r, bf16 ? DW_QUANT_IN_BF16 : DW_QUANT_IN_F32, dx[t], rows, cols, trans,
                                   &gs, NULL) != DW_OK)
                    fail_msg("%s", dw_errmsg(ctx));
                if (dw_qstats_measure(ctx, (dw_recipe)r, xf[t], rows, cols, trans, &cs) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
            }
            char what[200];
            snprintf(what, sizeof what, "%s%s%s [%lld, %lld] cap %lld", dw_recipe_name((dw_recipe)r), trans ? " transposed" : "",
                     bf16 ? " bf16" : "", (long long)rows, (long long)cols, (long long)cap);
            agree(&gs, &cs, what);
            cases++;
            sampled += cs.q.n < cs.elements;
            saturated += cs.q.saturated > 0;
            flushed += cs.q.flushed > 0;
            for (int t = 0; t < 2; t++) cudaFree(dx[t]), free(x[t]), free(xf[t]);
        }
    }
    print_message("%lld cases: %lld sampled, %lld with saturated elements, %lld with flushed ones\n", (long long)cases,
                  (long long)sampled, (long long)saturated, (long long)flushed);
    assert_true(sampled >= cases / 3); /* capk 1 and 2 sample every recipe */
    assert_true(saturated > 0 && flushed > 0);
}

/* Bad arguments get an error, not a launch. */
static void test_errors(void **state) {
    (void)state;
    dw_ctx *ctx = dw_test_ctx;
    dw_qstats s = dw_qstats_zero();
    float one = 1.0f;
    assert_int_equal(dw_qcheck_cuda(ctx, DW_RECIPE_BF16, DW_QUANT_IN_F32, &one, 1, 1, false, &s, NULL), DW_ERR_INVALID);
    assert_int_equal(dw_qcheck_cuda(ctx, DW_RECIPE_COUNT, DW_QUANT_IN_F32, &one, 1, 1, false, &s, NULL), DW_ERR_INVALID);
    assert_int_equal(dw_qcheck_cuda(ctx, DW_RECIPE_MXFP8, DW_QUANT_IN_F32, NULL, 1, 1, false, &s, NULL), DW_ERR_INVALID);
    assert_int_equal(dw_qcheck_cuda(ctx, DW_RECIPE_MXFP8, DW_QUANT_IN_F32, &one, 1 << 20, 1 << 14, false, &s, NULL),
                     DW_ERR_UNSUPPORTED);
    assert_true(s.q.n == 0 && s.elements == 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_cpu),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
