/* test_grouped_mxfp8.c (GPU) — the MXFP8 grouped expert GEMM on an sm_80..99 device through the
 * registry entry grouped_mxfp8_dequant_bf16 (src/gemm/grouped_mxfp8.c: the dense mxfp8 recipe's
 * Hopper route — codes x UE8M0 scales dequantised exactly to BF16, then the BF16 grouped GEMM)
 * against the CPU reference (grouped_cpu_mxfp8) on the same codes and scales, fprop and dgrad,
 * with skewed routings: every row to one expert, empty experts, a single row, groups of odd sizes
 * and rows past the groups (which must come back 0), outputs poisoned with NaN first, and one
 * larger shape. Bound: 5e-3 relative Frobenius error (BF16 output: its rounding, 2^-9 relative,
 * dominates; the products are exact and summed in FP32). wgrad: the device quantisers
 * (src/gemm/grouped_mxfp8_quant.c: dy^T, x^T along each expert's 32-padded rows from BF16 values,
 * kernels/cuda/grouped_mxfp8_quant.cu; the rows and the weight cache through dw_quantize_cuda)
 * equal the CPU's byte for byte, and dW += dy^T x through the dequantising route (the codes back
 * into BF16 rows, then the BF16 grouped wgrad, FP32 out) against the CPU reference on the same
 * codes within 1e-4 relative Frobenius error of the added part (exact products, FP32 sums), dW
 * holding values first (it is added into), experts without rows untouched; with overwrite, dW NaN
 * first and written over (experts without rows zeros). Skipped (passes,
 * saying so) elsewhere. */
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
#include "gemm/grouped_mxfp8.h"
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
    void *dw_ = dw_test_to_dev(wc, (size_t)(E * N * L)), *dws = dw_test_to_dev(ws, (size_t)(E * N * L / 32));
    void *dac = dw_test_to_dev(ac, (size_t)(R * L)), *das = dw_test_to_dev(as, (size_t)(R * L / 32));
    void *doff = dw_test_to_dev(off, (size_t)(E + 1) * 4), *dout = dw_test_to_dev(NULL, (size_t)(R * N) * 2);
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
    dw_test_from_dev(host, dout, (size_t)(R * N) * 2);
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

/* n bytes on the device against the host's; the first difference printed. */
static int64_t same_dev(const char *what, const void *dev, const void *host, size_t n) {
    uint8_t *h = malloc(n + 1);
    dw_test_from_dev(h, dev, n);
    int64_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (h[i] != ((const uint8_t *)host)[i] && !bad++)
            fprintf(stderr, "%s: byte %zu is %u on the GPU, %u on the CPU\n", what, i, h[i], ((const uint8_t *)host)[i]);
    free(h);
    return bad;
}

/* v (n) rounded to BF16 values (FP32) and their BF16 codes. */
static uint16_t *to_bf16(float *v, int64_t n) {
    uint16_t *b = malloc((size_t)(n + 1) * 2);
    for (int64_t i = 0; i < n; i++) b[i] = dw_encode_bf16(v[i]), v[i] = dw_decode_bf16(b[i]);
    return b;
}

/* One wgrad case: the quantisers' bytes GPU vs CPU, then dW on both; the relative error (infinite
 * on a byte mismatch, NaN or a touched expert without rows). */
static double wgrad_case(int kind, int64_t E, int64_t R, int64_t M, int64_t K, bool overwrite) {
    int32_t *off = malloc((size_t)(E + 1) * 4);
    route(kind, E, R, off);
    const int64_t P = dw_grouped_mxfp8_wgrad_cols(R, E);
    float *dy = randv(R * M), *x = randv(R * K), *w = randv(E * M * K);
    for (int64_t i = (int64_t)off[E] * M; i < R * M; i++) dy[i] = 0; /* as a dispatch leaves them */
    for (int64_t i = (int64_t)off[E] * K; i < R * K; i++) x[i] = 0;
    uint16_t *dyb = to_bf16(dy, R * M), *xb = to_bf16(x, R * K);
    uint8_t *dyc = malloc((size_t)(M * P)), *dys = malloc((size_t)(M * P / 32));
    uint8_t *xc = malloc((size_t)(K * P)), *xs = malloc((size_t)(K * P / 32));
    assert_int_equal(dw_grouped_mxfp8_quantize_cols_cpu(g_cpu, dy, off, R, E, M, dyc, dys), DW_OK);
    assert_int_equal(dw_grouped_mxfp8_quantize_cols_cpu(g_cpu, x, off, R, E, K, xc, xs), DW_OK);
    void *ddy = dw_test_to_dev(dyb, (size_t)(R * M) * 2), *dx = dw_test_to_dev(xb, (size_t)(R * K) * 2);
    void *doff = dw_test_to_dev(off, (size_t)(E + 1) * 4);
    void *ddyc = dw_test_to_dev(NULL, (size_t)(M * P)), *ddys = dw_test_to_dev(NULL, (size_t)(M * P / 32));
    void *dxc = dw_test_to_dev(NULL, (size_t)(K * P)), *dxs = dw_test_to_dev(NULL, (size_t)(K * P / 32));
    assert_int_equal(cudaMemset(ddyc, 0xAB, (size_t)(M * P)), cudaSuccess); /* every byte must be written */
    assert_int_equal(cudaMemset(ddys, 0xAB, (size_t)(M * P / 32)), cudaSuccess);
    assert_int_equal(dw_grouped_mxfp8_quantize_cols_cuda(g_gpu, ddy, true, doff, R, E, M, ddyc, ddys), DW_OK);
    assert_int_equal(dw_grouped_mxfp8_quantize_cols_cuda(g_gpu, dx, true, doff, R, E, K, dxc, dxs), DW_OK);
    int64_t bad = same_dev("dy^T codes", ddyc, dyc, (size_t)(M * P)) + same_dev("dy^T scales", ddys, dys, (size_t)(M * P / 32));
    bad += same_dev("x^T codes", dxc, xc, (size_t)(K * P)) + same_dev("x^T scales", dxs, xs, (size_t)(K * P / 32));
    { /* the rows (dy along M) and the weight cache (W along K, W^T along M) */
        uint8_t *c = malloc((size_t)(E * M * K + R * M)), *sc = malloc((size_t)(E * M * K + R * M) / 32 + 1);
        uint8_t *ct = malloc((size_t)(E * M * K)), *sct = malloc((size_t)(E * M * K / 32));
        void *dc = dw_test_to_dev(NULL, (size_t)(E * M * K + R * M)), *dsc = dw_test_to_dev(NULL, (size_t)(E * M * K + R * M) / 32 + 1);
        void *dct = dw_test_to_dev(NULL, (size_t)(E * M * K)), *dsct = dw_test_to_dev(NULL, (size_t)(E * M * K / 32));
        assert_int_equal(dw_grouped_mxfp8_quantize_rows_cpu(g_cpu, dy, R, M, c, sc), DW_OK);
        assert_int_equal(dw_grouped_mxfp8_quantize_rows_cuda(g_gpu, ddy, true, R, M, dc, dsc), DW_OK);
        bad += same_dev("dy codes", dc, c, (size_t)(R * M)) + same_dev("dy scales", dsc, sc, (size_t)(R * M / 32));
        void *dw_ = dw_test_to_dev(w, (size_t)(E * M * K) * 4);
        assert_int_equal(dw_grouped_mxfp8_quantize_weights_cpu(g_cpu, w, E, M, K, c, sc, ct, sct), DW_OK);
        assert_int_equal(dw_grouped_mxfp8_quantize_weights_cuda(g_gpu, dw_, E, M, K, dc, dsc, dct, dsct), DW_OK);
        bad += same_dev("W codes", dc, c, (size_t)(E * M * K)) + same_dev("W scales", dsc, sc, (size_t)(E * M * K / 32));
        bad += same_dev("W^T codes", dct, ct, (size_t)(E * M * K)) + same_dev("W^T scales", dsct, sct, (size_t)(E * M * K / 32));
        cudaFree(dc), cudaFree(dsc), cudaFree(dct), cudaFree(dsct), cudaFree(dw_);
        free(c), free(sc), free(ct), free(sct);
    }
    float *dw0 = randv(E * M * K), *ref = malloc((size_t)(E * M * K) * 4), *got = malloc((size_t)(E * M * K) * 4);
    memcpy(ref, dw0, (size_t)(E * M * K) * 4);
    if (overwrite) /* written over: the reference over zeros, the GPU's over NaN */
        for (int64_t i = 0; i < E * M * K; i++) ref[i] = 0.0f, dw0[i] = NAN;
    dw_grouped_args a = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_MXFP8, .rows = R,
                         .experts = E, .k = K, .m = M, .dy = dyc, .dy_scales = (const float *)(void *)dys, .x = xc,
                         .x_scales = (const float *)(void *)xs, .offsets = off, .out = ref, .overwrite = overwrite};
    assert_int_equal(dw_grouped_gemm(g_cpu, &a), DW_OK);
    void *dout = dw_test_to_dev(dw0, (size_t)(E * M * K) * 4);
    dw_grouped_args g = a;
    g.dtype = DW_GROUPED_BF16, g.dy = ddyc, g.dy_scales = ddys, g.x = dxc, g.x_scales = dxs, g.offsets = doff, g.out = dout;
    const char *name = NULL;
    assert_int_equal(dw_grouped_select(g_gpu, &g, &name), DW_OK);
    assert_string_equal(name, "grouped_mxfp8_dequant_bf16");
    if (dw_grouped_gemm(g_gpu, &g) != DW_OK) fail_msg("grouped_mxfp8_dequant_bf16 wgrad: %s", dw_errmsg(g_gpu));
    dw_test_from_dev(got, dout, (size_t)(E * M * K) * 4);
    double err2 = 0, ref2 = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = e * M * K; i < (e + 1) * M * K; i++) {
            if (off[e] == off[e + 1] && memcmp(&got[i], overwrite ? &ref[i] : &dw0[i], 4)) err2 = INFINITY; /* no rows */
            const double d = (double)got[i] - ref[i], add = (double)ref[i] - (overwrite ? 0.0 : dw0[i]);
            err2 += d * d, ref2 += add * add;
        }
    const double rel = bad ? INFINITY : ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    printf("wgrad%s routing %d E %lld R %lld M %lld K %lld rows %d: %lld bytes differ, rel %.3g\n",
           overwrite ? " (overwrite)" : "", kind, (long long)E, (long long)R, (long long)M, (long long)K, off[E],
           (long long)bad, rel);
    cudaFree(ddy), cudaFree(dx), cudaFree(doff), cudaFree(ddyc), cudaFree(ddys), cudaFree(dxc), cudaFree(dxs),
        cudaFree(dout);
    free(off), free(dy), free(x), free(w), free(dyb), free(xb), free(dyc), free(dys), free(xc), free(xs), free(dw0),
        free(ref), free(got);
    return isnan(rel) ? INFINITY : rel;
}

static void test_wgrad(void **state) {
    (void)state;
    if (g_sm < 80 || g_sm > 99) {
        printf("SKIP: sm_%d is outside the entry's sm_80..sm_99\n", g_sm);
        return;
    }
    int bad = 0;
    for (int kind = 0; kind < 4; kind++) {
        const int64_t E = kind == 3 ? 1 : dw_test_rnd(2, 9), R = kind == 3 ? 1 : dw_test_rnd(1, 700);
        bad += !(wgrad_case(kind, E, R, 32 * dw_test_rnd(1, 8), 32 * dw_test_rnd(1, 8), kind == 2) <= 1e-4);
    }
    bad += !(wgrad_case(0, 8, 4099, 256, 512, false) <= 1e-4); /* many row tiles per expert */
    bad += !(wgrad_case(1, 64, 2000, 64, 96, true) <= 1e-4);   /* every row to one of 64 experts, written over */
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_dequant_route), cmocka_unit_test(test_wgrad)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
