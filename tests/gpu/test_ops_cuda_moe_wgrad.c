/* test_ops_cuda_moe_wgrad.c — the grouped expert GEMM's wgrad (dW_e (+)= dy_e^T x_e, dW FP32) on
 * every CUDA kernel against the CPU reference (kernels/cpu/moe_cpu.c), added into a random dW and
 * with overwrite (dW poisoned with NaN: every element must be written, experts without rows get
 * zeros). Routings built from counts: empty experts, groups of one row, groups shorter than a K tile,
 * groups of more K tiles than the wgmma ring holds, more tiles than SMs (each persistent CTA takes
 * one, two or three tiles), M and K not multiples of the 128-tiles, and finite rows past
 * offsets[E] (the wgmma kernel zeroes the lines of the last K tile past a group). The wgmma kernel
 * runs with its default register epilogue and with its TMA epilogue (DW_MOE_WGRAD=tma: 128-column
 * tiles; DW_MOE_WGRAD=256: 256-column tiles; DW_MOE_WGRAD=old, the register epilogue). Written over,
 * each kernel also writes the sums of squares of dW's 64 x 128 blocks (dw_moe_gemm_args.sumsq: the
 * TMA epilogue from its registers, the others by the block kernel after), checked against the dW
 * it wrote. Needs a GPU (ctest
 * label "gpu"); the host emulator (tests/common/cuda_emu/run.sh) runs the FMA tiles only.
 * Tolerance: FP32 sums of L products of BF16 values against the double oracle, as
 * test_ops_cuda_moe.c's dW.
 * The public path too (dw_grouped_gemm with dw_grouped_args.overwrite, which grad_arena's first
 * writer of an expert weight sets; not under the emulator, which has no CUDA context): each BF16
 * grouped kernel by name (wgmma's default and 128-column TMA epilogues and its register one,
 * DW_MOE_WGRAD=old) and, on sm_90, grouped_fp8block_sm90 on
 * fp8_block operands; dW written over NaN equals dW added into zeros (values; the TMA store may
 * keep a -0 the add makes +0), experts without rows zeros, added into a random dW it is that dW
 * plus the zeros' result (one FP32 add, exact), and against the CPU reference written over NaN
 * (dw_cpu_moe_linear_wgrad, dw_cpu_moe_linear_fp8_wgrad with overwrite). */
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
#include "formats/formats.h"
#include "gemm/compute_capability.h"
#include "gemm/grouped_fp8.h"
#include "gpu_upload.h"
#include "gpucheck.h"
#include "kernels/cpu/moe_fp8_cpu.h"
#include "kernels/cpu/ops_cpu.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x36A0ull);
    return dw_gc_init(state);
}

enum { KERN_SIMT, KERN_MMA, KERN_WGMMA, KERN_WGMMA_TMA, KERN_WGMMA_256, KERN_WGMMA_OLD, N_KERN };
static const char *const kern_names[N_KERN] = {"simt", "mma", "wgmma", "wgmma(DW_MOE_WGRAD=tma)",
                                               "wgmma(DW_MOE_WGRAD=256)", "wgmma(DW_MOE_WGRAD=old)"};

/* The block sums of squares (dw_moe_gemm_args.sumsq, poisoned with NaN before) against the dW the
 * kernel wrote, summed here in double: within 1e-12 relative (the same squares in another order). */
static int64_t check_sumsq(const char *name, const void *ddW, const double *dsq, int64_t E, int64_t M, int64_t K) {
    const int64_t MB = (M + 63) / 64, KB = (K + 127) / 128, np = E * MB * KB;
    float *w = malloc((size_t)(E * M * K) * 4);
    double *got = malloc((size_t)np * 8);
    dw_test_from_dev(w, ddW, (size_t)(E * M * K) * 4);
    dw_test_from_dev(got, dsq, (size_t)np * 8);
    int64_t bad = 0;
    double worst = 0;
    for (int64_t b = 0; b < np; b++) {
        const int64_t kb = b % KB, mb = b / KB % MB, e = b / (KB * MB);
        double want = 0;
        for (int64_t i = mb * 64; i < M && i < mb * 64 + 64; i++)
            for (int64_t j = kb * 128; j < K && j < kb * 128 + 128; j++) {
                const double v = w[(e * M + i) * K + j];
                want += v * v;
            }
        const double err = fabs(got[b] - want);
        if (want > 0 && err / want > worst) worst = err / want;
        if (!(err <= 1e-12 * want) && bad++ < 5)
            fprintf(stderr, "%s: sumsq of block (expert %lld, rows %lld.., columns %lld..) %.17g, want %.17g\n", name,
                    (long long)e, (long long)(mb * 64), (long long)(kb * 128), got[b], want);
    }
    printf("%-64s sumsq of %lld blocks: worst rel %.2g%s\n", name, (long long)np, worst, bad ? "  FAILED" : "");
    free(w), free(got);
    return bad;
}

/* Rows per expert: pattern 0 random in [0, most] with about one expert in four empty; 1 skewed:
 * expert 0 takes `most`, the rest 0..3 rows; 2 every expert `most`. */
static void make_counts(int64_t *cnt, int64_t E, int64_t most, int pattern) {
    for (int64_t e = 0; e < E; e++) {
        const uint64_t v = dw_test_next(&g_rng);
        if (pattern == 2) cnt[e] = most;
        else if (pattern == 1) cnt[e] = e == 0 ? most : (int64_t)(v % 4);
        else cnt[e] = v % 4 == 0 ? 0 : (int64_t)(v / 4 % (uint64_t)(most + 1));
    }
}

/* One wgrad of E experts with these counts on kernel kern, overwrite or added into a random dW. */
static int64_t run_wgrad(int kern, int64_t E, int64_t M, int64_t K, const int64_t *cnt, bool overwrite) {
    int32_t *off = malloc((size_t)(E + 1) * sizeof *off);
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) off[e + 1] = off[e] + (int32_t)cnt[e];
    const int64_t R = off[E] + 1 + (int64_t)(dw_test_next(&g_rng) % 40); /* finite rows past the groups */
    char name[192];
    snprintf(name, sizeof name, "moe wgrad[%s E=%lld M=%lld K=%lld rows=%d R=%lld %s]", kern_names[kern],
             (long long)E, (long long)M, (long long)K, off[E], (long long)R, overwrite ? "overwrite" : "accumulate");
    const dw_act_dtype dt = kern == KERN_SIMT && dw_test_next(&g_rng) % 2 ? DW_ACT_F32 : DW_ACT_BF16;
    int64_t bad = 0;
    dw_gt *x = dw_gt_rand(&g_rng, "x", R * K, dt, -1, 1), *dy = dw_gt_rand(&g_rng, "dy", R * M, dt, -1, 1);
    dw_gt *goff = dw_gt_ints("offsets", off, E + 1);
    dw_gt *dW = overwrite ? dw_gt_out("dW", E * M * K, DW_ACT_F32) : dw_gt_rand(&g_rng, "dW", E * M * K, DW_ACT_F32, -1, 1);
    float *dW_ref = dw_oc_alloc(E * M * K);
    if (overwrite) memset(dW_ref, 0, (size_t)(E * M * K) * sizeof *dW_ref);
    else memcpy(dW_ref, dW->host, (size_t)(E * M * K) * sizeof *dW_ref);
    dw_cpu_moe_linear_bwd(NULL, dW_ref, dy->host, x->host, NULL, off, R, E, K, M);
    const dw_moe_kernel k = kern == KERN_SIMT ? DW_MOE_KERNEL_SIMT : kern == KERN_MMA ? DW_MOE_KERNEL_MMA
                                                                                        : DW_MOE_KERNEL_WGMMA;
    /* written over: the block sums of squares too, over NaN (every one must be written) */
    const int64_t np = E * ((M + 63) / 64) * ((K + 127) / 128);
    double *dsq = NULL;
    if (overwrite && (cudaMalloc((void **)&dsq, (size_t)np * 8) != cudaSuccess || cudaMemset(dsq, 0xff, (size_t)np * 8)))
        fail_msg("%s: no device memory for the sums of squares", name);
    const dw_moe_gemm_args a = {.pass = DW_MOE_WGRAD, .x = x->dev, .dy = dy->dev, .out = dW->dev,
                                .offsets = (const int32_t *)goff->dev, .R = R, .E = E, .K = K, .M = M, .kernel = k,
                                .overwrite = overwrite, .sumsq = dsq};
    const char *was = getenv("DW_MOE_WGRAD"); /* kernel WGMMA runs what the caller's environment says */
    char *saved = was ? strdup(was) : NULL;
    if (kern == KERN_WGMMA_TMA || kern == KERN_WGMMA_256 || kern == KERN_WGMMA_OLD)
        setenv("DW_MOE_WGRAD", kern == KERN_WGMMA_TMA ? "tma" : kern == KERN_WGMMA_256 ? "256" : "old", 1);
    DW_GC_OK(bad, name, dw_cuda_moe_gemm(NULL, dt, &a, dw_gc_stream));
    if (saved) setenv("DW_MOE_WGRAD", saved, 1);
    else unsetenv("DW_MOE_WGRAD");
    free(saved);
    DW_GC_SYNC();
    const dw_gc_tol tf = {1e-5, 1e-4, 0.0};
    DW_GC_CMP(bad, name, dW, dW_ref, tf);
    if (dsq) bad += check_sumsq(name, dW->dev, dsq, E, M, K), cudaFree(dsq);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(off), free(dW_ref);
    return bad;
}

/* Every kernel this device runs: sm_90 for wgmma; the emulator runs the FMA tiles only. */
static bool kernel_runs(int kern) {
#ifdef DW_CUDA_EMU
    return kern == KERN_SIMT;
#else
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev))
        return false;
    return kern < KERN_WGMMA || major == 9;
#endif
}

static void test_wgrad(void **state) {
    (void)state;
    int64_t bad = 0, cnt[64];
    for (int kern = 0; kern < N_KERN; kern++) {
        if (!kernel_runs(kern)) continue;
        for (int ow = 0; ow < 2; ow++) {
            make_counts(cnt, 8, 70, 0); /* empty and short groups, one or two K tiles */
            bad += run_wgrad(kern, 8, 40, 72, cnt, ow);
            make_counts(cnt, 3, 700, 1); /* one long group (11 K tiles > the ring), the rest 0-3 rows */
            bad += run_wgrad(kern, 3, 384, 264, cnt, ow);
            make_counts(cnt, 64, 50, 0); /* 64 experts x 2 x 2 tiles: more tiles than SMs */
            bad += run_wgrad(kern, 64, 200, 136, cnt, ow);
            make_counts(cnt, 64, 3, 2); /* 64 x 3 x 3 tiles: up to 5 a CTA, groups of 3 rows */
            bad += run_wgrad(kern, 64, 264, 328, cnt, ow);
            make_counts(cnt, 2, 300, 2); /* K = 392: a 256-tile and a partial one (8 columns past 384) */
            bad += run_wgrad(kern, 2, 136, 392, cnt, ow);
            make_counts(cnt, 5, 0, 2); /* no rows at all: overwrite writes zeros everywhere */
            bad += run_wgrad(kern, 5, 16, 24, cnt, ow);
            make_counts(cnt, 4, 129, 2); /* a group of two full K tiles and one row */
            bad += run_wgrad(kern, 4, 128, 128, cnt, ow);
        }
    }
    assert_int_equal(bad, 0);
}

#ifndef DW_CUDA_EMU
/* ---- the public path: dw_grouped_gemm with overwrite ------------------------------------------ */
/* a (device operands, the CUDA context's kernel `backend`) run three times: written over NaN, added
 * into zeros, added into random values; the three checked against each other and the first
 * against want (the CPU reference written over NaN) within rel (relative Frobenius error).
 * Returns the failures. */
static int64_t over_vs_add(dw_ctx *gpu, dw_grouped_args a, const int32_t *off, const float *want, double rel,
                           const char *what) {
    const int64_t E = a.experts, n = E * a.m * a.k;
    float *h[3], *base = malloc((size_t)n * 4);
    void *d[3];
    for (int64_t i = 0; i < n; i++) base[i] = dw_test_uniform(&g_rng, -1, 1);
    for (int r = 0; r < 3; r++) {
        h[r] = malloc((size_t)n * 4);
        if (r == 0) memset(h[r], 0xff, (size_t)n * 4); /* NaN */
        else if (r == 1) memset(h[r], 0, (size_t)n * 4);
        else memcpy(h[r], base, (size_t)n * 4);
        d[r] = dw_test_to_dev(h[r], (size_t)n * 4);
        a.out = d[r], a.overwrite = r == 0;
        if (dw_grouped_gemm(gpu, &a) != DW_OK) fail_msg("%s: %s", what, dw_errmsg(gpu));
        dw_test_from_dev(h[r], d[r], (size_t)n * 4);
        cudaFree(d[r]);
    }
    int64_t bad = 0;
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t e = i / (a.m * a.k);
        const float over = h[0][i], zero = h[1][i], added = h[2][i];
        if (!(over == zero) || (off[e] == off[e + 1] && over != 0.0f) || memcmp(&(float){base[i] + zero}, &added, 4)) {
            if (bad++ < 5)
                fprintf(stderr, "%s: dW[%lld] (expert %lld, %d rows) written over NaN %.9g, added into zeros %.9g, "
                        "into %.9g: %.9g\n", what, (long long)i, (long long)e, off[e + 1] - off[e], over, zero,
                        base[i], added);
        }
        err2 += ((double)over - want[i]) * ((double)over - want[i]), ref2 += (double)want[i] * want[i];
    }
    const double r = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    if (!(r <= rel)) bad++, fprintf(stderr, "%s: written over NaN vs the CPU reference: rel %.3g > %.3g\n", what, r, rel);
    printf("%-44s E %lld M %lld K %lld rows %d: overwrite = add into zeros, rel %.3g vs the CPU%s\n", what,
           (long long)E, (long long)a.m, (long long)a.k, off[E], r, bad ? "  FAILED" : "");
    for (int k = 0; k < 3; k++) free(h[k]);
    free(base);
    return bad;
}

/* off (E+1) of make_counts' pattern 0 (up to `most` rows an expert, some empty); the rows R
 * returned, 1 to 40 past the groups. */
static int64_t routing(int32_t *off, int64_t E, int64_t most) {
    int64_t cnt[64];
    make_counts(cnt, E, most, 0);
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) off[e + 1] = off[e] + (int32_t)cnt[e];
    return off[E] + 1 + (int64_t)(dw_test_next(&g_rng) % 40);
}

/* BF16 operands x [R, K], dy [R, M] through kernel `backend` (DW_MOE_WGRAD=epi for the wgmma one's
 * epilogue: old, tma; NULL: the default). */
static int64_t bf16_case(dw_ctx *gpu, const char *backend, const char *epi, int64_t E, int64_t M, int64_t K) {
    int32_t *off = malloc((size_t)(E + 1) * 4);
    const int64_t R = routing(off, E, 150), n = E * M * K;
    float *x = malloc((size_t)(R * K) * 4), *dy = malloc((size_t)(R * M) * 4), *want = malloc((size_t)n * 4);
    uint16_t *xb = malloc((size_t)(R * K) * 2), *dyb = malloc((size_t)(R * M) * 2);
    for (int64_t i = 0; i < R * K; i++) xb[i] = dw_encode_bf16(dw_test_uniform(&g_rng, -1, 1)), x[i] = dw_decode_bf16(xb[i]);
    for (int64_t i = 0; i < R * M; i++) dyb[i] = dw_encode_bf16(dw_test_uniform(&g_rng, -1, 1)), dy[i] = dw_decode_bf16(dyb[i]);
    memset(want, 0xff, (size_t)n * 4);
    dw_cpu_moe_linear_wgrad(want, dy, x, off, R, E, K, M, true);
    void *dx = dw_test_to_dev(xb, (size_t)(R * K) * 2), *ddy = dw_test_to_dev(dyb, (size_t)(R * M) * 2), *doff = dw_test_to_dev(off, (size_t)(E + 1) * 4);
    const dw_grouped_args a = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_BF16, .recipe = DW_RECIPE_BF16, .rows = R,
                               .experts = E, .k = K, .m = M, .x = dx, .dy = ddy, .offsets = doff, .backend = backend};
    char what[96];
    snprintf(what, sizeof what, "%s%s%s%s", backend, epi ? " (DW_MOE_WGRAD=" : "", epi ? epi : "", epi ? ")" : "");
    if (epi) setenv("DW_MOE_WGRAD", epi, 1);
    const int64_t bad = over_vs_add(gpu, a, off, want, 1e-4, what);
    if (epi) unsetenv("DW_MOE_WGRAD");
    cudaFree(dx), cudaFree(ddy), cudaFree(doff);
    free(off), free(x), free(dy), free(want), free(xb), free(dyb);
    return bad;
}

/* fp8_block operands: dy^T and x^T quantised on the host (grouped_fp8.h's padded layout). */
static int64_t fp8_case(dw_ctx *cpu, dw_ctx *gpu, int64_t E, int64_t M, int64_t K) {
    int32_t *off = malloc((size_t)(E + 1) * 4);
    const int64_t R = routing(off, E, 300), n = E * M * K;
    const int64_t P = dw_grouped_fp8_wgrad_cols(R, E);
    float *x = malloc((size_t)(R * K) * 4), *dy = malloc((size_t)(R * M) * 4), *want = malloc((size_t)n * 4);
    for (int64_t i = 0; i < R * K; i++) x[i] = dw_test_uniform(&g_rng, -1, 1);
    for (int64_t i = 0; i < R * M; i++) dy[i] = dw_test_uniform(&g_rng, -1, 1);
    uint8_t *xc = malloc((size_t)(K * P)), *dyc = malloc((size_t)(M * P));
    float *xs = malloc((size_t)(K * P / 128) * 4), *dys = malloc((size_t)(M * P / 128) * 4);
    assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(cpu, x, off, R, E, K, xc, xs), DW_OK);
    assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(cpu, dy, off, R, E, M, dyc, dys), DW_OK);
    memset(want, 0xff, (size_t)n * 4);
    dw_cpu_moe_linear_fp8_wgrad(want, dyc, dys, xc, xs, off, E, M, K, P, true);
    void *dxc = dw_test_to_dev(xc, (size_t)(K * P)), *ddyc = dw_test_to_dev(dyc, (size_t)(M * P)), *dxs = dw_test_to_dev(xs, (size_t)(K * P / 128) * 4);
    void *ddys = dw_test_to_dev(dys, (size_t)(M * P / 128) * 4), *doff = dw_test_to_dev(off, (size_t)(E + 1) * 4);
    const dw_grouped_args a = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_FP8_BLOCK,
                               .rows = R, .experts = E, .k = K, .m = M, .x = dxc, .x_scales = dxs, .dy = ddyc,
                               .dy_scales = ddys, .offsets = doff, .backend = "grouped_fp8block_sm90"};
    const int64_t bad = over_vs_add(gpu, a, off, want, 1e-3, "grouped_fp8block_sm90"); /* test_grouped_fp8.c's bound */
    cudaFree(dxc), cudaFree(ddyc), cudaFree(dxs), cudaFree(ddys), cudaFree(doff);
    free(off), free(x), free(dy), free(want), free(xc), free(dyc), free(xs), free(dys);
    return bad;
}
#endif

static void test_grouped_overwrite(void **state) {
    (void)state;
#ifdef DW_CUDA_EMU
    printf("SKIP: the public grouped GEMM needs a CUDA context (not emulated)\n");
#else
    dw_ctx *cpu = NULL, *gpu = NULL;
    if (dw_test_cpu_gpu_setup(&cpu, &gpu)) fail_msg("no CUDA context");
    const int sm = dw_gemm_ctx_sm(gpu);
    const bool moe_fp8 = getenv("DW_MOE_FP8") == NULL; /* DW_MOE_FP8=0 withdraws the fp8 entry */
    unsetenv("DW_MOE_WGRAD");
    int64_t bad = 0;
    bad += bf16_case(gpu, "grouped_cuda_simt", NULL, 8, 40, 72);
    if (sm >= 80) bad += bf16_case(gpu, "grouped_mma_sm80", NULL, 8, 200, 136);
    if (sm == 90) {
        bad += bf16_case(gpu, "grouped_wgmma_sm90", NULL, 8, 200, 136); /* the default: TMA, 256 columns */
        bad += bf16_case(gpu, "grouped_wgmma_sm90", "tma", 8, 200, 392);
        bad += bf16_case(gpu, "grouped_wgmma_sm90", "old", 64, 264, 328); /* the register epilogue */
        if (moe_fp8) {
            bad += fp8_case(cpu, gpu, 8, 256, 384);
            bad += fp8_case(cpu, gpu, 3, 128, 128);
        }
    }
    dw_test_cpu_gpu_teardown(cpu, gpu);
    assert_int_equal(bad, 0);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_wgrad), cmocka_unit_test(test_grouped_overwrite)};
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
