/* test_ops_cuda_moe_remat.c — what MoE rematerialisation (compile/recompute.c) asks of the CUDA
 * kernels: the dispatch, the experts' SwiGLU and the RMSNorm before the dispatch, run again in the
 * backward over the buffers their first run wrote (the offsets and positions kept, the rows, the
 * SwiGLU output, the norm's output and rstd reused by other buffers in between: poisoned here with
 * NaN), write the same bits as the first run. Dispatch
 * dropless, over capacity by position and by weight (its select kernel writes the positions
 * buffer as scratch), routings with assignments outside [0,E); FP32 and BF16; fresh random inputs,
 * guard bands. Needs a GPU (ctest label "gpu"); the host emulator (tests/common/cuda_emu/run.sh)
 * runs it too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucheck.h"
#include "ir/ir.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x4E3Aull);
    return dw_gc_init(state);
}

/* The bytes of device buffer t into a new host array. */
static unsigned char *bytes_of(const dw_gt *t) {
    unsigned char *h = malloc(t->bytes ? t->bytes : 1);
    if (!h) abort();
    DW_GC_CUDA(cudaMemcpy(h, t->dev, t->bytes, cudaMemcpyDeviceToHost));
    return h;
}

/* Whether t holds the bytes `was` (printing the first difference). */
static int64_t same_bytes(const char *name, const dw_gt *t, const unsigned char *was) {
    unsigned char *now = bytes_of(t);
    int64_t bad = 0;
    for (size_t i = 0; i < t->bytes && !bad; i++)
        if (now[i] != was[i]) printf("MISMATCH %s: %s byte %zu differs on the second run\n", name, t->name, i), bad++;
    free(now);
    return bad;
}

/* Dispatch of N tokens (K of E experts each, about one in six outside [0,E)), SwiGLU over R x F
 * rows and RMSNorm over the N x C tokens, each run twice; cap 0: dropless; by_weight: the router's
 * weights rank the assignments. */
static int64_t run_case(dw_act_dtype dt, int64_t N, int64_t C, int64_t K, int64_t E, int64_t F, double factor,
                        bool by_weight) {
    const int64_t A = N * K, cap = factor > 0 ? dw_moe_capacity(factor, N, K, E) : 0;
    const int64_t R = dw_moe_routed_rows(factor, N, K, E);
    char name[160];
    snprintf(name, sizeof name, "moe remat[%s N=%lld C=%lld K=%lld E=%lld F=%lld cap=%lld%s]", dw_gc_dtname(dt),
             (long long)N, (long long)C, (long long)K, (long long)E, (long long)F, (long long)cap,
             by_weight ? " by weight" : "");
    int32_t *idx = malloc((size_t)A * 4);
    float *prio = malloc((size_t)A * sizeof *prio);
    if (!idx || !prio) abort();
    for (int64_t a = 0; a < A; a++) {
        const uint64_t r = dw_test_next(&g_rng);
        idx[a] = r % 6 == 0 ? (r % 12 == 0 ? -1 : (int32_t)E) : (int32_t)(r % (uint64_t)E);
        prio[a] = (float)(dw_test_next(&g_rng) % 9) / 8.0f; /* ties: the earlier (token, k) stays */
    }
    int64_t bad = 0;
    dw_gt *x = dw_gt_rand(&g_rng, "x", N * C, dt, -1, 1), *ix = dw_gt_ints("experts", idx, A);
    dw_gt *w = by_weight ? dw_gt_from("weights", prio, A, dt) : NULL;
    dw_gt *xs = dw_gt_out("rows", R * C, dt), *off = dw_gt_out("offsets", E + 1, DW_ACT_F32);
    dw_gt *pos = dw_gt_out("positions", A, DW_ACT_F32);
    unsigned char *firsts[3] = {NULL, NULL, NULL};
    for (int run = 0; run < 2; run++) {
        if (run) DW_GC_CUDA(cudaMemsetAsync(xs->dev, 0xFF, xs->bytes, dw_gc_stream)); /* the rows' memory reused in between */
        DW_GC_OK(bad, name, dw_cuda_moe_dispatch_fwd(NULL, dt, xs->dev, (int32_t *)off->dev, (int32_t *)pos->dev, x->dev,
                                                     (const int32_t *)ix->dev, w ? w->dev : NULL, N, C, K, E, cap,
                                                     dw_gc_stream));
        DW_GC_SYNC();
        dw_gt *outs[3] = {xs, off, pos};
        for (int o = 0; o < 3; o++) {
            if (!run) firsts[o] = bytes_of(outs[o]);
            else bad += same_bytes(name, outs[o], firsts[o]), free(firsts[o]);
        }
    }
    dw_gt *g = dw_gt_rand(&g_rng, "gate", R * F, dt, -4, 4), *u = dw_gt_rand(&g_rng, "up", R * F, dt, -2, 2);
    dw_gt *act = dw_gt_out("act", R * F, dt);
    unsigned char *first = NULL;
    for (int run = 0; run < 2; run++) {
        if (run) DW_GC_CUDA(cudaMemsetAsync(act->dev, 0xFF, act->bytes, dw_gc_stream));
        DW_GC_OK(bad, name, dw_cuda_swiglu_fwd(NULL, dt, act->dev, g->dev, u->dev, R * F, dw_gc_stream));
        DW_GC_SYNC();
        if (!run) first = bytes_of(act);
        else bad += same_bytes(name, act, first);
    }
    free(first);
    /* the RMSNorm whose output the dispatch reads: its output and rstd (FP32 weight, offset 0) */
    dw_gt *nw = dw_gt_rand(&g_rng, "norm weight", C, DW_ACT_F32, -2, 2), *h = dw_gt_out("norm out", N * C, dt);
    dw_gt *rstd = dw_gt_out("rstd", N, DW_ACT_F32);
    unsigned char *firsts_n[2] = {NULL, NULL};
    for (int run = 0; run < 2; run++) {
        if (run) {
            DW_GC_CUDA(cudaMemsetAsync(h->dev, 0xFF, h->bytes, dw_gc_stream));
            DW_GC_CUDA(cudaMemsetAsync(rstd->dev, 0xFF, rstd->bytes, dw_gc_stream));
        }
        DW_GC_OK(bad, name, dw_cuda_rmsnorm_fwd_offset(NULL, dt, h->dev, (float *)rstd->dev, x->dev, (const float *)nw->dev,
                                                       0.0, N, C, 1e-5, dw_gc_stream));
        DW_GC_SYNC();
        dw_gt *outs[2] = {h, rstd};
        for (int o = 0; o < 2; o++) {
            if (!run) firsts_n[o] = bytes_of(outs[o]);
            else bad += same_bytes(name, outs[o], firsts_n[o]), free(firsts_n[o]);
        }
    }
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(idx), free(prio);
    return bad;
}

static void test_rerun_same_bits(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int d = 0; d < 2; d++) {
        const dw_act_dtype dt = d ? DW_ACT_BF16 : DW_ACT_F32;
        for (int rep = 0; rep < 3; rep++) {
            const int64_t E = 2 + (int64_t)(dw_test_next(&g_rng) % 15), K = 1 + (int64_t)(dw_test_next(&g_rng) % 4);
            const int64_t N = 1 + (int64_t)(dw_test_next(&g_rng) % 300), C = 1 + (int64_t)(dw_test_next(&g_rng) % 70);
            const int64_t F = 1 + (int64_t)(dw_test_next(&g_rng) % 50);
            const int64_t k = K < E ? K : E;
            bad += run_case(dt, N, C, k, E, F, 0.0, false);
            bad += run_case(dt, N, C, k, E, F, 0.6, false);
            bad += run_case(dt, N, C, k, E, F, 0.6, true);
        }
    }
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rerun_same_bits)};
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
