/* test_ops_cuda_gate.c — the CUDA entries of the two ops the Qwen MoE families added, against the
 * CPU reference: sigmoid_gate (y = sigmoid(g) * x, one gate logit per row; kernels/cpu/act_cpu.c)
 * forward, in place, backward written, added onto a prior, in place over dout, dg alone; and
 * head_rmsnorm (kernels/cuda/ops_norm.cu over N*H rows of D, as the CPU entry runs
 * dw_cpu_rmsnorm_*) forward, the two-pass backward and the one-pass backward with its workspace
 * adding dx onto a prior, the weight gradient summed over every head. Fresh random inputs, odd
 * sizes (scalar paths) and BF16 rows of C % 8 == 0 (16-byte paths), FP32 and BF16, outputs poisoned
 * with NaN, guard bands. Needs a GPU (ctest label "gpu"); the host emulator
 * (tests/common/cuda_emu/run.sh) runs it too.
 *
 * Tolerances as test_ops_cuda.c: elementwise FP32 1e-5 relative; sums (dg, the norms) 1e-4 with
 * atol 1e-5, plus, where a sum cancels (dg's dot product, the norm's dx), 1e-5 of its terms' size;
 * BF16 outputs 2 BF16 ulps and 1e-4 of the max. */
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
#include "kernels/cpu/ops_cpu.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x6A7Eull);
    return dw_gc_init(state);
}

static const dw_act_dtype DTS[] = {DW_ACT_F32, DW_ACT_BF16};

/* ---- sigmoid_gate ------------------------------------------------------------------------------ */
static int64_t run_gate(dw_act_dtype dt, int64_t N, int64_t C) {
    char name[96];
    snprintf(name, sizeof name, "sigmoid_gate[%s N=%lld C=%lld]", dw_gc_dtname(dt), (long long)N, (long long)C);
    int64_t bad = 0;
    void *s = dw_gc_stream;
    const int64_t n = N * C;
    dw_gt *x = dw_gt_rand(&g_rng, "x", n, dt, -2, 2), *g = dw_gt_rand(&g_rng, "g", N, dt, -6, 6);
    dw_gt *dy = dw_gt_rand(&g_rng, "dy", n, dt, -1, 1);
    float *y_ref = dw_oc_alloc(n), *dx_ref = dw_oc_alloc(n), *dg_ref = dw_oc_alloc(N);
    dw_cpu_sigmoid_gate_fwd(y_ref, x->host, g->host, N, C);
    dw_cpu_sigmoid_gate_bwd(dx_ref, dg_ref, dy->host, x->host, g->host, N, C);

    /* forward, then in place over a copy of x */
    dw_gt *y = dw_gt_out("y", n, dt), *yx = dw_gt_from("y=x", x->host, n, dt);
    DW_GC_OK(bad, name, dw_cuda_sigmoid_gate_fwd(NULL, dt, y->dev, x->dev, g->dev, N, C, s));
    DW_GC_OK(bad, name, dw_cuda_sigmoid_gate_fwd(NULL, dt, yx->dev, yx->dev, g->dev, N, C, s));

    /* backward: written; dx added onto a prior (no dg); dx over a copy of dy; dg alone */
    dw_gt *dx = dw_gt_out("dx", n, dt), *dg = dw_gt_out("dg", N, dt);
    float *prior = dw_oc_alloc(n);
    dw_oc_fill(&g_rng, prior, n, -1, 1);
    dw_gt *dxa = dw_gt_from("dx_acc", prior, n, dt);
    for (int64_t i = 0; i < n; i++) prior[i] = dxa->host[i] + dx_ref[i]; /* the prior as stored, plus dx */
    dw_gt *dxd = dw_gt_from("dx=dy", dy->host, n, dt), *dgd = dw_gt_out("dg(dx=dy)", N, dt);
    dw_gt *dg1 = dw_gt_out("dg(alone)", N, dt);
    DW_GC_OK(bad, name, dw_cuda_sigmoid_gate_bwd(NULL, dt, dx->dev, dg->dev, dy->dev, x->dev, g->dev, N, C, false, s));
    DW_GC_OK(bad, name, dw_cuda_sigmoid_gate_bwd(NULL, dt, dxa->dev, NULL, dy->dev, x->dev, g->dev, N, C, true, s));
    DW_GC_OK(bad, name,
             dw_cuda_sigmoid_gate_bwd(NULL, dt, dxd->dev, dgd->dev, dxd->dev, x->dev, g->dev, N, C, false, s));
    DW_GC_OK(bad, name, dw_cuda_sigmoid_gate_bwd(NULL, dt, NULL, dg1->dev, dy->dev, x->dev, g->dev, N, C, false, s));
    DW_GC_SYNC();

    const dw_gc_tol te = dw_gc_pick(dt, 1e-5, 1e-5);
    dw_gc_tol tg = dw_gc_pick(dt, 1e-5, 1e-4); /* dg = s (1 - s) dot: the dot cancels */
    for (int64_t r = 0; r < N; r++) {
        const double sg = 1.0 / (1.0 + exp(-(double)g->host[r]));
        double terms = 0.0;
        for (int64_t c = 0; c < C; c++) terms += fabs((double)dy->host[r * C + c] * x->host[r * C + c]);
        if (1e-5 * sg * (1.0 - sg) * terms > tg.abs) tg.abs = 1e-5 * sg * (1.0 - sg) * terms;
    }
    DW_GC_CMP(bad, name, y, y_ref, te);
    DW_GC_CMP(bad, name, yx, y_ref, te);
    DW_GC_CMP(bad, name, dx, dx_ref, te);
    DW_GC_CMP(bad, name, dg, dg_ref, tg);
    DW_GC_CMP(bad, name, dxa, prior, te);
    DW_GC_CMP(bad, name, dxd, dx_ref, te);
    DW_GC_CMP(bad, name, dgd, dg_ref, tg);
    DW_GC_CMP(bad, name, dg1, dg_ref, tg);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(y_ref), free(dx_ref), free(dg_ref), free(prior);
    return bad;
}

static void test_sigmoid_gate(void **state) {
    (void)state;
    /* odd widths: the scalar path; C % 8 == 0: BF16's 16-byte path (one group per lane up to 256,
     * several beyond); 3001 rows: 376 blocks of 8 warps, the last one partly empty */
    static const int64_t shapes[][2] = {{1, 1}, {37, 33}, {9, 8}, {129, 256}, {5, 2049}, {3, 2048}, {3001, 24}};
    int64_t bad = 0;
    for (size_t d = 0; d < 2; d++) {
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
            bad += run_gate(DTS[d], shapes[k][0], shapes[k][1]);
        bad += run_gate(DTS[d], 1 + (int64_t)(dw_test_next(&g_rng) % 300), 8 * (1 + (int64_t)(dw_test_next(&g_rng) % 40)));
        bad += run_gate(DTS[d], 1 + (int64_t)(dw_test_next(&g_rng) % 300), 1 + (int64_t)(dw_test_next(&g_rng) % 500));
    }
    assert_int_equal(bad, 0);
}

/* ---- head_rmsnorm: N rows of H heads x D channels, one weight (D) -------------------------------- */
static int64_t run_head_norm(dw_act_dtype dt, int64_t N, int64_t H, int64_t D) {
    char name[112];
    snprintf(name, sizeof name, "head_rmsnorm[%s N=%lld H=%lld D=%lld]", dw_gc_dtname(dt), (long long)N,
             (long long)H, (long long)D);
    int64_t bad = 0;
    void *s = dw_gc_stream;
    const double eps = 1e-6;
    const int64_t R = N * H, n = R * D; /* the reference's rows: one per (token, head) */
    dw_gt *x = dw_gt_new("x", n, dt);
    dw_oc_fill(&g_rng, x->host, n, -2, 2);
    for (int64_t i = 0; i < n; i++) x->host[i] *= 0.25f + 0.5f * (float)((i / D) % 5); /* heads of unlike size */
    dw_gt_upload(x);
    dw_gt *w = dw_gt_rand(&g_rng, "w", D, DW_ACT_F32, 0.5f, 1.5f), *dy = dw_gt_rand(&g_rng, "dy", n, dt, -1, 1);
    dw_gt *out = dw_gt_out("out", n, dt), *rstd = dw_gt_out("rstd", R, DW_ACT_F32);
    float *out_ref = dw_oc_alloc(n), *rstd_ref = dw_oc_alloc(R), *dx_ref = dw_oc_alloc(n);
    float *dw_ref = dw_oc_alloc(D), *dw2_ref = dw_oc_alloc(D), *dx2_ref = dw_oc_alloc(n);
    dw_oc_fill(&g_rng, dw_ref, D, -1, 1); /* priors: the weight gradients accumulate onto them */
    dw_oc_fill(&g_rng, dw2_ref, D, -1, 1);
    dw_oc_fill(&g_rng, dx2_ref, n, -1, 1);
    dw_gt *dw = dw_gt_from("dw", dw_ref, D, DW_ACT_F32), *dw2 = dw_gt_from("dw(ws)", dw2_ref, D, DW_ACT_F32);
    dw_gt *dx = dw_gt_out("dx", n, dt), *dx2 = dw_gt_from("dx(acc)", dx2_ref, n, dt);
    memcpy(dx2_ref, dx2->host, sizeof(float) * (size_t)n); /* the prior as stored */
    dw_cpu_rmsnorm_fwd(out_ref, rstd_ref, x->host, w->host, R, D, eps);
    dw_cpu_rmsnorm_bwd(dx_ref, dw_ref, dy->host, x->host, w->host, rstd_ref, R, D);
    dw_cpu_rmsnorm_bwd(NULL, dw2_ref, dy->host, x->host, w->host, rstd_ref, R, D);
    for (int64_t i = 0; i < n; i++) dx2_ref[i] += dx_ref[i];

    DW_GC_OK(bad, name, dw_cuda_head_rmsnorm_fwd(NULL, dt, out->dev, rstd->dev, x->dev, w->dev, N, H, D, eps, s));
    /* the backward reads the CPU's rstd, so that it is tested on its own */
    dw_gt *rstd_in = dw_gt_from("rstd_in", rstd_ref, R, DW_ACT_F32);
    DW_GC_OK(bad, name, dw_cuda_head_rmsnorm_bwd(NULL, dt, dx->dev, dw->dev, dy->dev, x->dev, w->dev, rstd_in->dev, N,
                                                 H, D, false, NULL, 0, s));
    const size_t wsb = dw_cuda_norm_bwd_ws_bytes(R, D);
    dw_gt *ws = dw_gt_new("ws", (int64_t)(wsb / 4), DW_ACT_F32);
    DW_GC_OK(bad, name, dw_cuda_head_rmsnorm_bwd(NULL, dt, dx2->dev, dw2->dev, dy->dev, x->dev, w->dev, rstd_in->dev,
                                                 N, H, D, true, ws->dev, wsb, s));
    DW_GC_SYNC();

    const dw_gc_tol tf = dw_gc_pick(dt, 1e-5, 1e-4), tstat = {1e-6, 1e-5, 0}, tparam = {1e-5, 1e-4, 0};
    dw_gc_tol tdx = tf; /* dx = rstd (g - projection) cancels: error of the size of rstd |w| |dy| */
    for (int64_t i = 0; i < R; i++)
        if (1e-5 * 1.5 * rstd_ref[i] > tdx.abs) tdx.abs = 1e-5 * 1.5 * rstd_ref[i];
    DW_GC_CMP(bad, name, out, out_ref, tf);
    DW_GC_CMP(bad, name, rstd, rstd_ref, tstat);
    DW_GC_CMP(bad, name, dx, dx_ref, tdx);
    DW_GC_CMP(bad, name, dw, dw_ref, tparam);
    DW_GC_CMP(bad, name, dx2, dx2_ref, tdx);
    DW_GC_CMP(bad, name, dw2, dw2_ref, tparam);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(out_ref), free(rstd_ref), free(dx_ref), free(dw_ref), free(dw2_ref), free(dx2_ref);
    return bad;
}

static void test_head_rmsnorm(void **state) {
    (void)state;
    /* head_dim 64 and 128 as Qwen3 (BF16: the row kernels, one warp per row, the fused backward);
     * odd D: the block-per-row kernels; 150 x 4 rows spread the weight's column sum over a cluster */
    static const int64_t shapes[][3] = {{1, 1, 1}, {37, 3, 7}, {9, 4, 16}, {53, 2, 128}, {150, 4, 64}, {5, 3, 33}};
    int64_t bad = 0;
    for (size_t d = 0; d < 2; d++) {
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
            bad += run_head_norm(DTS[d], shapes[k][0], shapes[k][1], shapes[k][2]);
        bad += run_head_norm(DTS[d], 1 + (int64_t)(dw_test_next(&g_rng) % 100), 1 + (int64_t)(dw_test_next(&g_rng) % 6),
                             8 * (1 + (int64_t)(dw_test_next(&g_rng) % 16)));
    }
    assert_int_equal(bad, 0);
}

/* ---- argument checks: DW_ERR_INVALID naming the op --------------------------------------------- */
static void test_gate_validation(void **state) {
    (void)state;
    float *p = NULL;
    DW_GC_CUDA(cudaMalloc((void **)&p, 1024));
    assert_int_equal(dw_cuda_sigmoid_gate_fwd(NULL, (dw_act_dtype)3, p, p, p, 2, 4, dw_gc_stream), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(NULL), "sigmoid_gate"));
    assert_int_equal(dw_cuda_sigmoid_gate_fwd(NULL, DW_ACT_F32, p, p, p, 2, 0, dw_gc_stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_sigmoid_gate_fwd(NULL, DW_ACT_F32, p, NULL, p, 2, 4, dw_gc_stream), DW_ERR_INVALID);
    /* adding into dx over dout would count dout twice */
    assert_int_equal(dw_cuda_sigmoid_gate_bwd(NULL, DW_ACT_F32, p, p + 16, p, p + 64, p + 128, 2, 4, true, dw_gc_stream),
                     DW_ERR_INVALID);
    assert_int_equal(dw_cuda_sigmoid_gate_bwd(NULL, DW_ACT_F32, NULL, NULL, p, p, p, 0, 4, false, dw_gc_stream), DW_OK);
    assert_int_equal(dw_cuda_head_rmsnorm_fwd(NULL, DW_ACT_F32, p, p, p, p, 2, 0, 4, 1e-6, dw_gc_stream),
                     DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(NULL), "head_rmsnorm"));
    assert_int_equal(dw_cuda_head_rmsnorm_bwd(NULL, DW_ACT_BF16, p, p, p, p, p, NULL, 2, 3, 4, false, NULL, 0,
                                              dw_gc_stream),
                     DW_ERR_INVALID); /* no rstd */
    cudaFree(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sigmoid_gate), cmocka_unit_test(test_head_rmsnorm),
                                       cmocka_unit_test(test_gate_validation)};
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
