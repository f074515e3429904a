/* test_grouped_mxfp8.c (GPU) — the MXFP8 grouped expert GEMM on an sm_80..99 device through the
 * registry entry grouped_mxfp8_dequant_bf16 (src/gemm/grouped_mxfp8.c: the dense mxfp8 recipe's
 * Hopper route — codes x UE8M0 scales dequantised exactly to BF16, then the BF16 grouped GEMM)
 * against the CPU reference (grouped_cpu_mxfp8) on the same codes and scales, fprop and dgrad,
 * with skewed routings: every row to one expert, empty experts, a single row, groups of odd sizes
 * and rows past the groups (which must come back 0), outputs poisoned with NaN first, and one
 * larger shape. Bound: 5e-3 relative Frobenius error (BF16 output: its rounding, 2^-9 relative,
 * dominates; the products are exact and summed in FP32). Skipped (passes, saying so) elsewhere. */
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

#include "deepwell.h"
#include "formats/formats.h"
#include "gemm/compute_capability.h"
#include "grouped_gpu.h"
#include "testutil.h"

/* Values over several binades, so the 32-blocks' scales differ. */
static float *randv(int64_t n) {
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = dw_test_uniform(&dw_test_group_rng, -1, 1) * ldexpf(1.0f, (int)dw_test_rnd(-4, 4));
    return v;
}

/* x [rows, cols] in mxfp8 along its rows: codes and UE8M0 bytes (the library's CPU quantiser). */
static void mx_quant(const float *x, int64_t rows, int64_t cols, uint8_t *codes, uint8_t *scales) {
    const dw_quant_opts o = {.recipe = DW_RECIPE_MXFP8};
    dw_qtensor q = {.recipe = DW_RECIPE_MXFP8, .rows = rows, .cols = cols, .codes = codes, .scales = scales,
                    .tensor_scale = 1.0f};
    assert_int_equal(dw_quantize_cpu(g_cpu, &o, x, rows, cols, &q), DW_OK);
}

/* One case (L the reduction, N the output columns); the relative Frobenius error (infinite for
 * NaN or a non-zero row past the groups). */
static double gpu_case(int pass, int kind, int64_t E, int64_t R, int64_t L, int64_t N) {
    const bool fprop = pass == DW_GEMM_FPROP;
    int32_t *off = malloc((size_t)(E + 1) * 4);
    route(kind, E, R, off);
    float *w = randv(E * N * L), *act = randv(R * L);
    for (int64_t r = off[E]; r < R; r++) memset(act + r * L, 0, (size_t)L * 4); /* as a dispatch leaves them */
    uint8_t *wc = malloc((size_t)(E * N * L)), *ws = malloc((size_t)(E * N * L / 32));
    uint8_t *ac = malloc((size_t)(R * L) + 1), *as = malloc((size_t)(R * L / 32) + 1);
    mx_quant(w, E * N, L, wc, ws); /* fprop: W [E, N, L]; dgrad: W^T's copy [E, N = K, L = M] */
    mx_quant(act, R, L, ac, as);
    float *ref = malloc((size_t)(R * N + 1) * 4);
    dw_grouped_args a = {.pass = pass, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_MXFP8, .rows = R, .experts = E,
                         .k = fprop ? L : N, .m = fprop ? N : L, .w = wc, .w_scales = (const float *)(void *)ws,
                         .offsets = off, .out = ref};
    if (fprop) a.x = ac, a.x_scales = (const float *)(void *)as;
    else a.dy = ac, a.dy_scales = (const float *)(void *)as;
    assert_int_equal(dw_grouped_gemm(g_cpu, &a), DW_OK);
    void *dw_ = to_dev(wc, (size_t)(E * N * L)), *dws = to_dev(ws, (size_t)(E * N * L / 32));
    void *dac = to_dev(ac, (size_t)(R * L)), *das = to_dev(as, (size_t)(R * L / 32));
    void *doff = to_dev(off, (size_t)(E + 1) * 4), *dout = to_dev(NULL, (size_t)(R * N) * 2);
    assert_int_equal(cudaMemset(dout, 0xFF, (size_t)(R * N) * 2), cudaSuccess); /* NaN */
    dw_grouped_args g = a;
    g.dtype = DW_GROUPED_BF16, g.w = dw_, g.w_scales = dws, g.offsets = doff, g.out = dout;
    if (fprop) g.x = dac, g.x_scales = das;
    else g.dy = dac, g.dy_scales = das;
    const char *name = NULL;
    assert_int_equal(dw_grouped_select(g_gpu, &g, &name), DW_OK);
    assert_string_equal(name, "grouped_mxfp8_dequant_bf16");
    if (dw_grouped_gemm(g_gpu, &g) != DW_OK) fail_msg("grouped_mxfp8_dequant_bf16: %s", dw_errmsg(g_gpu));
    uint16_t *host = malloc((size_t)(R * N + 1) * 2);
    from_dev(host, dout, (size_t)(R * N) * 2);
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < R * N; i++) {
        const double v = dw_decode_bf16(host[i]);
        if (i >= (int64_t)off[E] * N && v != 0.0) err2 = INFINITY; /* a row past the groups */
        err2 += (v - ref[i]) * (v - ref[i]), ref2 += (double)ref[i] * ref[i];
    }
    const double rel = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    printf("%s routing %d E %lld R %lld L %lld N %lld rows %d: rel %.3g\n", fprop ? "fprop" : "dgrad", kind,
           (long long)E, (long long)R, (long long)L, (long long)N, off[E], rel);
    cudaFree(dw_), cudaFree(dws), cudaFree(dac), cudaFree(das), cudaFree(doff), cudaFree(dout);
    free(off), free(w), free(act), free(wc), free(ws), free(ac), free(as), free(ref), free(host);
    return isnan(rel) ? INFINITY : rel;
}

static void test_dequant_route(void **state) {
    (void)state;
    if (g_sm < 80 || g_sm > 99) {
        printf("SKIP: sm_%d is outside the entry's sm_80..sm_99\n", g_sm);
        return;
    }
    int bad = 0;
    for (int kind = 0; kind < 4; kind++)
        for (int pass = DW_GEMM_FPROP; pass <= DW_GEMM_DGRAD; pass++) {
            const int64_t E = kind == 3 ? 1 : dw_test_rnd(2, 9), R = kind == 3 ? 1 : dw_test_rnd(1, 700);
            bad += !(gpu_case(pass, kind, E, R, 32 * dw_test_rnd(1, 12), 32 * dw_test_rnd(1, 12)) <= 5e-3);
        }
    bad += !(gpu_case(DW_GEMM_FPROP, 0, 8, 4099, 2048, 1024) <= 5e-3); /* many tiles per expert */
    bad += !(gpu_case(DW_GEMM_DGRAD, 1, 8, 4099, 1024, 2048) <= 5e-3);
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_dequant_route)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
