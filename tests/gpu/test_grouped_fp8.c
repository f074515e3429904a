/* test_grouped_fp8.c (GPU) — the fp8_block grouped expert GEMM on an sm_90 device
 * (kernels/cuda/moe_gemm_fp8_sm90.cu through the registry entry grouped_fp8block_sm90, offered by
 * default: DW_MOE_FP8 unset) against the CPU reference of the same arithmetic (grouped_cpu_fp8_block) on
 * the same codes and scales, fprop and dgrad (each variant of the kernel — 128 columns in K-block
 * pairs or one block at a time, 192-column tiles — giving the default's bits), BF16 and FP32
 * outputs, with skewed routings: every row to one expert, empty experts, a single row, groups of
 * odd sizes and rows past the groups (which must come back 0); outputs poisoned with NaN before each run. wgrad on the transposed,
 * per-expert padded copies (grouped_fp8.h) with groups of 127, 128, 129 rows too, added into a dW
 * that holds values (experts without rows leave theirs bit for bit; K blocks in pairs and one at a
 * time giving the same bits). The GPU quantisers of the
 * grouped operands against the CPU's, bit for bit (wgrad's: offsets on the device, NaN in the rows
 * past the groups, which it must not read). Bound: 1e-3 relative Frobenius error for FP32
 * output, 5e-3 for BF16 (docs/gemm.md: the dense FP8 block kernel's, the same tensor-core
 * accumulation). Skipped (passes, saying so) on a device that is not sm_90. */
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
#include "gemm/grouped_fp8.h"
#include "grouped_gpu.h"
#include "testutil.h"

static float *randv(int64_t n) {
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = dw_test_uniform(&dw_test_group_rng, -1, 1);
    return v;
}

/* Routing 4: every group's size one of 0, 1, 127, 128, 129, 256 (wgrad's blocks filled exactly, by
 * one row more or less); the rows (some past the groups). Kinds 0..3: route()'s with R rows. */
static int64_t route_wgrad(int kind, int64_t E, int64_t R, int32_t *off) {
    static const int sizes[] = {0, 1, 127, 128, 129, 256};
    if (kind < 4) return route(kind, E, R, off), R;
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) off[e + 1] = off[e] + sizes[dw_test_rnd(0, 5)];
    return off[E] + dw_test_rnd(0, 5);
}

/* One wgrad case, dW holding random values first; returns the relative Frobenius error of what
 * the kernel added against what the reference added (infinite where an expert without rows
 * changed, or NaN). */
static double wgrad_case(int kind, int64_t E, int64_t M, int64_t K, int64_t R0) {
    int32_t *off = malloc((size_t)(E + 1) * 4);
    const int64_t R = route_wgrad(kind, E, R0, off), P = dw_grouped_fp8_wgrad_cols(R, E), n = E * M * K;
    float *dy = randv(R * M), *x = randv(R * K), *dw0 = randv(n), *ref = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    uint8_t *dyc = malloc((size_t)(M * P)), *xc = malloc((size_t)(K * P));
    float *dys = malloc((size_t)(M * P / 128) * 4), *xs = malloc((size_t)(K * P / 128) * 4);
    assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(g_cpu, dy, off, R, E, M, dyc, dys), DW_OK);
    assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(g_cpu, x, off, R, E, K, xc, xs), DW_OK);
    memcpy(ref, dw0, (size_t)n * 4);
    dw_grouped_args a = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_FP8_BLOCK, .rows = R,
                         .experts = E, .k = K, .m = M, .x = xc, .x_scales = xs, .dy = dyc, .dy_scales = dys,
                         .offsets = off, .out = ref};
    assert_int_equal(dw_grouped_gemm(g_cpu, &a), DW_OK);
    void *ddyc = dw_test_to_dev(dyc, (size_t)(M * P)), *dxc = dw_test_to_dev(xc, (size_t)(K * P));
    void *ddys = dw_test_to_dev(dys, (size_t)(M * P / 128) * 4), *dxs = dw_test_to_dev(xs, (size_t)(K * P / 128) * 4);
    void *doff = dw_test_to_dev(off, (size_t)(E + 1) * 4), *dout = dw_test_to_dev(dw0, (size_t)n * 4);
    dw_grouped_args g = a;
    g.x = dxc, g.x_scales = dxs, g.dy = ddyc, g.dy_scales = ddys, g.offsets = doff, g.out = dout;
    const char *name = NULL;
    assert_int_equal(dw_grouped_select(g_gpu, &g, &name), DW_OK);
    assert_string_equal(name, "grouped_fp8block_sm90");
    if (dw_grouped_gemm(g_gpu, &g) != DW_OK) fail_msg("grouped_fp8block_sm90 wgrad: %s", dw_errmsg(g_gpu));
    dw_test_from_dev(got, dout, (size_t)n * 4);
    /* one K block at a time (DW_MOE_FP8_WGRAD_PIPE=1) adds the same bits as the default's pairs */
    float *one = malloc((size_t)n * 4);
    assert_int_equal(cudaMemcpy(dout, dw0, (size_t)n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    setenv("DW_MOE_FP8_WGRAD_PIPE", "1", 1);
    const dw_status st1 = dw_grouped_gemm(g_gpu, &g);
    unsetenv("DW_MOE_FP8_WGRAD_PIPE");
    if (st1 != DW_OK) fail_msg("grouped_fp8block_sm90 wgrad, DW_MOE_FP8_WGRAD_PIPE=1: %s", dw_errmsg(g_gpu));
    dw_test_from_dev(one, dout, (size_t)n * 4);
    const bool same = !memcmp(one, got, (size_t)n * 4);
    free(one);
    double err2 = same ? 0 : INFINITY, ref2 = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t e = i / (M * K);
        if (off[e] == off[e + 1] && memcmp(&got[i], &dw0[i], 4)) err2 = INFINITY; /* no rows: untouched */
        err2 += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        ref2 += ((double)ref[i] - dw0[i]) * ((double)ref[i] - dw0[i]);
    }
    const double rel = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    printf("wgrad routing %d E %lld M %lld K %lld R %lld rows %d: rel %.3g%s\n", kind, (long long)E, (long long)M,
           (long long)K, (long long)R, off[E], rel, same ? "" : ", one K block at a time differs from the pairs");
    cudaFree(ddyc), cudaFree(dxc), cudaFree(ddys), cudaFree(dxs), cudaFree(doff), cudaFree(dout);
    free(off), free(dy), free(x), free(dw0), free(ref), free(got), free(dyc), free(xc), free(dys), free(xs);
    return isnan(rel) ? INFINITY : rel;
}

/* Relative Frobenius error of a device output (BF16 or FP32) against the reference; infinite for NaN
 * or a non-zero value in the rows past the groups' (rows..R). */
static double out_rel(const void *host, bool bf16_out, const float *ref, int64_t rows, int64_t R, int64_t N) {
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < R * N; i++) {
        const double v =
            bf16_out ? (double)dw_decode_bf16(((const uint16_t *)host)[i]) : (double)((const float *)host)[i];
        if (i >= rows * N && v != 0.0) err2 = INFINITY; /* a row past the groups */
        err2 += (v - ref[i]) * (v - ref[i]), ref2 += (double)ref[i] * ref[i];
    }
    const double rel = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    return isnan(rel) ? INFINITY : rel;
}

/* One case; returns the relative Frobenius error (infinite for NaN, a non-zero row past the groups,
 * or a variant's bits differing from the default's). */
static double gpu_case(int pass, int kind, bool bf16_out, int64_t E, int64_t M, int64_t K, int64_t R) {
    const bool fprop = pass == DW_GEMM_FPROP;
    const int64_t L = fprop ? K : M, N = fprop ? M : K, blocks = E * (M / 128) * (K / 128);
    int32_t *off = malloc((size_t)(E + 1) * 4);
    route(kind, E, R, off);
    float *w = randv(E * M * K), *act = randv(R * L);
    for (int64_t r = off[E]; r < R; r++) memset(act + r * L, 0, (size_t)L * 4); /* as a dispatch leaves them */
    uint8_t *wc = malloc((size_t)(E * M * K)), *wct = malloc((size_t)(E * M * K)), *ac = malloc((size_t)(R * L));
    float *ws = malloc((size_t)blocks * 4), *wst = malloc((size_t)blocks * 4), *as = malloc((size_t)(R * L / 128) * 4);
    assert_int_equal(dw_grouped_fp8_quantize_weights_cpu(g_cpu, w, E, M, K, wc, ws, wct, wst), DW_OK);
    assert_int_equal(dw_grouped_fp8_quantize_rows_cpu(g_cpu, act, R, L, ac, as), DW_OK);
    float *ref = malloc((size_t)(R * N) * 4);
    dw_grouped_args a = {.pass = pass, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_FP8_BLOCK, .rows = R,
                         .experts = E, .k = K, .m = M, .w = fprop ? wc : wct, .w_scales = fprop ? ws : wst,
                         .offsets = off, .out = ref};
    if (fprop) a.x = ac, a.x_scales = as;
    else a.dy = ac, a.dy_scales = as;
    assert_int_equal(dw_grouped_gemm(g_cpu, &a), DW_OK);
    /* the same codes and scales on the device */
    const size_t es = bf16_out ? 2 : 4;
    void *dw_ = dw_test_to_dev(fprop ? wc : wct, (size_t)(E * M * K)), *dws = dw_test_to_dev(fprop ? ws : wst, (size_t)blocks * 4);
    void *dac = dw_test_to_dev(ac, (size_t)(R * L)), *das = dw_test_to_dev(as, (size_t)(R * L / 128) * 4);
    void *doff = dw_test_to_dev(off, (size_t)(E + 1) * 4), *dout = dw_test_to_dev(NULL, (size_t)(R * N) * es);
    assert_int_equal(cudaMemset(dout, 0xFF, (size_t)(R * N) * es), cudaSuccess); /* NaN in either type */
    dw_grouped_args g = a;
    g.dtype = bf16_out ? DW_GROUPED_BF16 : DW_GROUPED_F32, g.w = dw_, g.w_scales = dws, g.offsets = doff, g.out = dout;
    if (fprop) g.x = dac, g.x_scales = das;
    else g.dy = dac, g.dy_scales = das;
    const char *name = NULL;
    assert_int_equal(dw_grouped_select(g_gpu, &g, &name), DW_OK);
    assert_string_equal(name, "grouped_fp8block_sm90");
    if (dw_grouped_gemm(g_gpu, &g) != DW_OK) fail_msg("grouped_fp8block_sm90: %s", dw_errmsg(g_gpu));
    void *host = malloc((size_t)(R * N) * es), *other = malloc((size_t)(R * N) * es);
    dw_test_from_dev(host, dout, (size_t)(R * N) * es);
    /* every fprop/dgrad variant gives the default's bits (moe_gemm_fp8_sm90.cu's fprop_variant):
     * 128 columns one K block at a time, in pairs, and 192-column tiles; and the BF16 output
     * through the register epilogue instead of TMA (store_tma) */
    const char *const knob[4] = {"DW_MOE_FP8_PIPE", "DW_MOE_FP8_TILE", "DW_MOE_FP8_TILE", "DW_MOE_STORE"};
    const char *const val[4] = {"1", "128", "192", "reg"};
    bool same = true;
    for (int v = 0; v < 4; v++) {
        setenv(knob[v], val[v], 1);
        assert_int_equal(cudaMemset(dout, 0xFF, (size_t)(R * N) * es), cudaSuccess);
        const dw_status st = dw_grouped_gemm(g_gpu, &g);
        unsetenv(knob[v]);
        if (st != DW_OK) fail_msg("grouped_fp8block_sm90, %s=%s: %s", knob[v], val[v], dw_errmsg(g_gpu));
        dw_test_from_dev(other, dout, (size_t)(R * N) * es);
        if (memcmp(host, other, (size_t)(R * N) * es))
            same = false, printf("  %s=%s differs from the default\n", knob[v], val[v]);
    }
    const double rel = out_rel(host, bf16_out, ref, off[E], R, N);
    printf("%s routing %d %s E %lld M %lld K %lld R %lld rows %d: rel %.3g%s\n", fprop ? "fprop" : "dgrad", kind,
           bf16_out ? "bf16" : "fp32", (long long)E, (long long)M, (long long)K, (long long)R, off[E], rel,
           same ? ", every variant the same bits" : "");
    cudaFree(dw_), cudaFree(dws), cudaFree(dac), cudaFree(das), cudaFree(doff), cudaFree(dout);
    free(off), free(w), free(act), free(wc), free(wct), free(ac), free(ws), free(wst), free(as), free(ref);
    free(host), free(other);
    return same ? rel : INFINITY;
}

static void test_kernel(void **state) {
    (void)state;
    if (g_sm != 90) {
        printf("SKIP: sm_%d is not sm_90 (the kernel is sm_90a only)\n", g_sm);
        return;
    }
    int bad = 0;
    for (int kind = 0; kind < 4; kind++)
        for (int pass = 0; pass < 2; pass++)
            for (int b = 0; b < 2; b++) {
                const int64_t E = kind == 3 ? 1 : dw_test_rnd(2, 9), M = 128 * dw_test_rnd(1, 4), K = 128 * dw_test_rnd(1, 4);
                const int64_t R = kind == 3 ? 1 : dw_test_rnd(1, 700);
                const double rel = gpu_case(pass, kind, b, E, M, K, R);
                bad += !(rel <= (b ? 5e-3 : 1e-3));
            }
    /* a larger shape: many tiles per expert, several K blocks, every SM busy */
    bad += !(gpu_case(DW_GEMM_FPROP, 0, false, 8, 1024, 2048, 4099) <= 1e-3);
    bad += !(gpu_case(DW_GEMM_DGRAD, 1, true, 8, 1024, 2048, 4099) <= 5e-3);
    bad += !(gpu_case(DW_GEMM_FPROP, 2, true, 8, 640, 1408, 3001) <= 5e-3); /* 11 K blocks: the last pair's spare */
    for (int kind = 0; kind < 5; kind++) { /* wgrad: FP32 dW, the fprop bound */
        const int64_t E = kind == 3 ? 1 : dw_test_rnd(2, 9), M = 128 * dw_test_rnd(1, 4), K = 128 * dw_test_rnd(1, 4);
        bad += !(wgrad_case(kind, E, M, K, kind == 3 ? 1 : dw_test_rnd(1, 700)) <= 1e-3);
    }
    bad += !(wgrad_case(0, 8, 1024, 2048, 4099) <= 1e-3); /* long K loops per expert */
    assert_int_equal(bad, 0);
}

/* The device quantisers against the CPU's, bit for bit (BF16 input: the engine's). */
static void test_quantisers(void **state) {
    (void)state;
    const int64_t E = dw_test_rnd(1, 4), M = 128 * dw_test_rnd(1, 3), K = 128 * dw_test_rnd(1, 3), R = dw_test_rnd(1, 300);
    const int64_t n = E * M * K, blocks = E * (M / 128) * (K / 128);
    float *w = randv(n), *x = randv(R * K);
    uint16_t *wb = malloc((size_t)n * 2), *xb = malloc((size_t)(R * K) * 2);
    for (int64_t i = 0; i < n; i++) wb[i] = dw_encode_bf16(w[i]), w[i] = dw_decode_bf16(wb[i]);
    for (int64_t i = 0; i < R * K; i++) xb[i] = dw_encode_bf16(x[i]), x[i] = dw_decode_bf16(xb[i]);
    uint8_t *c = malloc((size_t)n), *ct = malloc((size_t)n), *xc = malloc((size_t)(R * K));
    float *s = malloc((size_t)blocks * 4), *st = malloc((size_t)blocks * 4), *xs = malloc((size_t)(R * K / 128) * 4);
    assert_int_equal(dw_grouped_fp8_quantize_weights_cpu(g_cpu, w, E, M, K, c, s, ct, st), DW_OK);
    assert_int_equal(dw_grouped_fp8_quantize_rows_cpu(g_cpu, x, R, K, xc, xs), DW_OK);
    void *dw_ = dw_test_to_dev(wb, (size_t)n * 2), *dx = dw_test_to_dev(xb, (size_t)(R * K) * 2);
    void *dc = dw_test_to_dev(NULL, (size_t)n), *dct = dw_test_to_dev(NULL, (size_t)n), *dxc = dw_test_to_dev(NULL, (size_t)(R * K));
    void *ds = dw_test_to_dev(NULL, (size_t)blocks * 4), *dst = dw_test_to_dev(NULL, (size_t)blocks * 4), *dxs = dw_test_to_dev(NULL, (size_t)(R * K / 128) * 4);
    assert_int_equal(dw_grouped_fp8_quantize_weights_cuda(g_gpu, dw_, true, E, M, K, dc, ds, dct, dst), DW_OK);
    assert_int_equal(dw_grouped_fp8_quantize_rows_cuda(g_gpu, dx, true, R, K, dxc, dxs), DW_OK);
    uint8_t *hc = malloc((size_t)n), *hct = malloc((size_t)n), *hxc = malloc((size_t)(R * K));
    float *hs = malloc((size_t)blocks * 4), *hst = malloc((size_t)blocks * 4), *hxs = malloc((size_t)(R * K / 128) * 4);
    dw_test_from_dev(hc, dc, (size_t)n), dw_test_from_dev(hct, dct, (size_t)n), dw_test_from_dev(hxc, dxc, (size_t)(R * K));
    dw_test_from_dev(hs, ds, (size_t)blocks * 4), dw_test_from_dev(hst, dst, (size_t)blocks * 4), dw_test_from_dev(hxs, dxs, (size_t)(R * K / 128) * 4);
    assert_memory_equal(hc, c, (size_t)n);
    assert_memory_equal(hct, ct, (size_t)n);
    assert_memory_equal(hs, s, (size_t)blocks * 4);
    assert_memory_equal(hst, st, (size_t)blocks * 4);
    assert_memory_equal(hxc, xc, (size_t)(R * K));
    assert_memory_equal(hxs, xs, (size_t)(R * K / 128) * 4);
    cudaFree(dw_), cudaFree(dx), cudaFree(dc), cudaFree(dct), cudaFree(dxc), cudaFree(ds), cudaFree(dst), cudaFree(dxs);
    free(w), free(x), free(wb), free(xb), free(c), free(ct), free(xc), free(s), free(st), free(xs);
    free(hc), free(hct), free(hxc), free(hs), free(hst), free(hxs);
}

/* wgrad's quantiser (offsets on the device) against the CPU's, bit for bit, FP32 and BF16 input,
 * every routing; NaN in the rows past the groups, which neither may read. */
static void test_quantiser_cols(void **state) {
    (void)state;
    for (int kind = 0; kind < 5; kind++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const int64_t E = kind == 3 ? 1 : dw_test_rnd(1, 9), C = 128 * dw_test_rnd(1, 3);
            int32_t *off = malloc((size_t)(E + 1) * 4);
            const int64_t R = route_wgrad(kind, E, kind == 3 ? 1 : dw_test_rnd(1, 600), off);
            const int64_t P = dw_grouped_fp8_wgrad_cols(R, E), nc = C * P, ns = C * P / 128;
            float *x = randv(R * C);
            uint16_t *xb = malloc((size_t)(R * C > 0 ? R * C : 1) * 2);
            for (int64_t i = 0; i < R * C; i++) {
                if (i >= (int64_t)off[E] * C) x[i] = NAN;
                xb[i] = dw_encode_bf16(x[i]), x[i] = bf16 ? dw_decode_bf16(xb[i]) : x[i];
            }
            uint8_t *c = malloc((size_t)nc), *hc = malloc((size_t)nc);
            float *s = malloc((size_t)ns * 4), *hs = malloc((size_t)ns * 4);
            assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(g_cpu, x, off, R, E, C, c, s), DW_OK);
            void *dx = bf16 ? dw_test_to_dev(xb, (size_t)(R * C) * 2) : dw_test_to_dev(x, (size_t)(R * C) * 4);
            void *doff = dw_test_to_dev(off, (size_t)(E + 1) * 4), *dc = dw_test_to_dev(NULL, (size_t)nc), *ds = dw_test_to_dev(NULL, (size_t)ns * 4);
            assert_int_equal(cudaMemset(dc, 0xAB, (size_t)nc), cudaSuccess); /* poisoned */
            assert_int_equal(cudaMemset(ds, 0xFF, (size_t)ns * 4), cudaSuccess);
            assert_int_equal(dw_grouped_fp8_quantize_cols_cuda(g_gpu, dx, bf16, doff, R, E, C, dc, ds), DW_OK);
            dw_test_from_dev(hc, dc, (size_t)nc), dw_test_from_dev(hs, ds, (size_t)ns * 4);
            printf("wgrad quantiser routing %d %s E %lld C %lld R %lld rows %d\n", kind, bf16 ? "bf16" : "fp32",
                   (long long)E, (long long)C, (long long)R, off[E]);
            assert_memory_equal(hc, c, (size_t)nc);
            assert_memory_equal(hs, s, (size_t)ns * 4);
            cudaFree(dx), cudaFree(doff), cudaFree(dc), cudaFree(ds);
            free(off), free(x), free(xb), free(c), free(hc), free(s), free(hs);
        }
}

int main(void) {
    unsetenv("DW_MOE_FP8"); /* the default offers the entry; DW_MOE_FP8=0 would withdraw it */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantisers),
        cmocka_unit_test(test_quantiser_cols),
        cmocka_unit_test(test_kernel),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
