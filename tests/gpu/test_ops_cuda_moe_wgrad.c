/* test_ops_cuda_moe_wgrad.c — the grouped expert GEMM's wgrad (dW_e (+)= dy_e^T x_e, dW FP32) on
 * every CUDA kernel against the CPU reference (kernels/cpu/moe_cpu.c), added into a random dW and
 * with overwrite (dW poisoned with NaN: every element must be written, experts without rows get
 * zeros). Routings built from counts: empty experts, groups of one row, groups shorter than a K tile,
 * groups of more K tiles than the wgmma ring holds, more tiles than SMs (each persistent CTA takes
 * one, two or three tiles), M and K not multiples of the 128-tiles, and finite rows past
 * offsets[E] (the wgmma kernel zeroes the lines of the last K tile past a group). The wgmma kernel
 * runs with its default register epilogue and with its TMA epilogue (DW_MOE_WGRAD=tma: 128-column
 * tiles; DW_MOE_WGRAD=256: 256-column tiles). Needs a GPU (ctest
 * label "gpu"); the host emulator (tests/common/cuda_emu/run.sh) runs the FMA tiles only.
 * Tolerance: FP32 sums of L products of BF16 values against the double oracle, as
 * test_ops_cuda_moe.c's dW. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucheck.h"
#include "kernels/cpu/ops_cpu.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x36A0ull);
    return dw_gc_init(state);
}

enum { KERN_SIMT, KERN_MMA, KERN_WGMMA, KERN_WGMMA_TMA, KERN_WGMMA_256, N_KERN };
static const char *const kern_names[N_KERN] = {"simt", "mma", "wgmma", "wgmma(DW_MOE_WGRAD=tma)",
                                               "wgmma(DW_MOE_WGRAD=256)"};

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
    const dw_moe_gemm_args a = {.pass = DW_MOE_WGRAD, .x = x->dev, .dy = dy->dev, .out = dW->dev,
                                .offsets = (const int32_t *)goff->dev, .R = R, .E = E, .K = K, .M = M, .kernel = k,
                                .overwrite = overwrite};
    const char *was = getenv("DW_MOE_WGRAD"); /* kernel WGMMA runs what the caller's environment says */
    char *saved = was ? strdup(was) : NULL;
    if (kern == KERN_WGMMA_TMA || kern == KERN_WGMMA_256)
        setenv("DW_MOE_WGRAD", kern == KERN_WGMMA_TMA ? "tma" : "256", 1);
    DW_GC_OK(bad, name, dw_cuda_moe_gemm(NULL, dt, &a, dw_gc_stream));
    if (saved) setenv("DW_MOE_WGRAD", saved, 1);
    else unsetenv("DW_MOE_WGRAD");
    free(saved);
    DW_GC_SYNC();
    const dw_gc_tol tf = {1e-5, 1e-4, 0.0};
    DW_GC_CMP(bad, name, dW, dW_ref, tf);
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

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_wgrad)};
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
