/* test_ops_cuda_gemma.c — Gemma 2's CUDA kernels against the CPU reference (kernels/cpu): softcap
 * (the embedding normaliser s x and the final logit cap c tanh(s x / c)), geglu (gelu_tanh(gate) *
 * up) and the offset RMSNorm (weight 1 + w), forward and backward; fresh random inputs, odd sizes
 * (the BF16 8-wide kernels' scalar tails, the norm's row-in-registers and block kernels), outputs
 * poisoned with NaN, guard bands, FP32 and BF16, the softcap gradient in place (dx = dout) and
 * the norm's gradient added onto a prior. Soft-capped attention scores: test_ops_cuda_attn.c.
 * Needs a GPU (ctest label "gpu"); tests/common/cuda_emu/run.sh runs it on the host emulator.
 *
 * Tolerances (|gpu - cpu| <= atol * max|cpu| + rtol * |cpu|) as test_ops_cuda.c: the oracle in
 * double, the GPU in FP32 (tanhf within 2 ulp): elementwise 1e-5 relative with a 1e-6 floor (gelu's
 * 1 + tanh cancels for x << 0), norms 1e-4 with atol 1e-5; BF16 outputs one rounding: rtol 8e-3. */
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
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x6E33A2ull);
    return dw_gc_init(state);
}

static const dw_act_dtype DTS[] = {DW_ACT_F32, DW_ACT_BF16};

/* ---- softcap: s x, or c tanh(s x / c); x up to 4 c / |s| so that the cap saturates ------------- */
static int64_t run_softcap(dw_act_dtype dt, int64_t n, double s, double c) {
    char name[128];
    snprintf(name, sizeof name, "softcap[%s n=%lld s=%g c=%g]", dw_gc_dtname(dt), (long long)n, s, c);
    int64_t bad = 0;
    dw_gc_tol tl = dw_gc_pick(dt, 1e-6, 1e-5);
    tl.abs = 1e-6;
    const float r = c > 0 ? (float)(4.0 * c / fabs(s)) : 8.0f;
    dw_gt *x = dw_gt_rand(&g_rng, "x", n, dt, -r, r), *g = dw_gt_rand(&g_rng, "dout", n, dt, -1, 1);
    dw_gt *gin = dw_gt_from("dout(in place)", g->host, n, dt);
    dw_gt *out = dw_gt_out("out", n, dt), *dx = dw_gt_out("dx", n, dt);
    float *want = dw_oc_alloc(n), *wdx = dw_oc_alloc(n);
    dw_cpu_softcap_fwd(want, x->host, n, s, c);
    dw_cpu_softcap_bwd(wdx, g->host, x->host, n, s, c);
    void *st = dw_gc_stream;
    DW_GC_OK(bad, name, dw_cuda_softcap_fwd(NULL, dt, out->dev, x->dev, n, s, c, st));
    DW_GC_OK(bad, name, dw_cuda_softcap_bwd(NULL, dt, dx->dev, g->dev, x->dev, n, s, c, st));
    DW_GC_OK(bad, name, dw_cuda_softcap_bwd(NULL, dt, gin->dev, gin->dev, x->dev, n, s, c, st));
    DW_GC_SYNC();
    DW_GC_CMP(bad, name, out, want, tl);
    DW_GC_CMP(bad, name, dx, wdx, tl);
    DW_GC_CMP(bad, name, gin, wdx, tl);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(want), free(wdx);
    return bad;
}

static void test_softcap(void **state) {
    (void)state;
    static const int64_t sizes[] = {1, 37, 4099, 300007};
    int64_t bad = 0;
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 4; i++) {
            const double s = dw_test_uniform(&g_rng, 0.5f, 40.0f) * (i == 2 ? -1 : 1);
            bad += run_softcap(DTS[d], sizes[i], s, 0.0);                                  /* embedding scale */
            bad += run_softcap(DTS[d], sizes[i], 1.0, dw_test_uniform(&g_rng, 5.0f, 50.0f)); /* final cap */
            bad += run_softcap(DTS[d], sizes[i], s, dw_test_uniform(&g_rng, 0.5f, 3.0f));
        }
    assert_int_equal(bad, 0);
}

/* ---- geglu: gelu_tanh(gate) * up, gradients of both --------------------------------------------- */
static int64_t run_geglu(dw_act_dtype dt, int64_t n) {
    char name[128];
    snprintf(name, sizeof name, "geglu[%s n=%lld]", dw_gc_dtname(dt), (long long)n);
    int64_t bad = 0;
    dw_gc_tol tl = dw_gc_pick(dt, 1e-6, 1e-5);
    tl.abs = 1e-6;
    dw_gt *a = dw_gt_rand(&g_rng, "gate", n, dt, -6, 6), *b = dw_gt_rand(&g_rng, "up", n, dt, -2, 2);
    dw_gt *g = dw_gt_rand(&g_rng, "dout", n, dt, -1, 1);
    dw_gt *out = dw_gt_out("out", n, dt), *da = dw_gt_out("dgate", n, dt), *db = dw_gt_out("dup", n, dt);
    float *want = dw_oc_alloc(n), *wa = dw_oc_alloc(n), *wb = dw_oc_alloc(n);
    dw_cpu_geglu_fwd(want, a->host, b->host, n);
    dw_cpu_geglu_bwd(wa, wb, g->host, a->host, b->host, n);
    DW_GC_OK(bad, name, dw_cuda_geglu_fwd(NULL, dt, out->dev, a->dev, b->dev, n, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_geglu_bwd(NULL, dt, da->dev, db->dev, g->dev, a->dev, b->dev, n, dw_gc_stream));
    DW_GC_SYNC();
    DW_GC_CMP(bad, name, out, want, tl);
    DW_GC_CMP(bad, name, da, wa, tl);
    DW_GC_CMP(bad, name, db, wb, tl);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(want), free(wa), free(wb);
    return bad;
}

static void test_geglu(void **state) {
    (void)state;
    static const int64_t sizes[] = {1, 31, 4096, 1000003}; /* BF16: 8-wide kernel + scalar tail */
    int64_t bad = 0;
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 4; i++) bad += run_geglu(DTS[d], sizes[i]);
    assert_int_equal(bad, 0);
}

/* ---- rmsnorm with the weight applied as off + w (Gemma: 1 + w, w near 0) -------------------------
 * oracle: the CPU kernels with the weight (float)(off + w), as the CPU backend applies it */
static int64_t run_rms_offset(dw_act_dtype dt, int64_t N, int64_t C, double off) {
    char name[128];
    snprintf(name, sizeof name, "rmsnorm offset[%s N=%lld C=%lld off=%g]", dw_gc_dtname(dt), (long long)N,
             (long long)C, off);
    int64_t bad = 0;
    const double eps = 1e-6;
    const dw_gc_tol tf = dw_gc_pick(dt, 1e-5, 1e-4), tstat = {1e-6, 1e-5, 0}, tparam = {1e-5, 1e-4, 0};
    dw_gt *x = dw_gt_rand(&g_rng, "x", N * C, dt, -2, 2), *g = dw_gt_rand(&g_rng, "dout", N * C, dt, -1, 1);
    dw_gt *w = dw_gt_rand(&g_rng, "w", C, DW_ACT_F32, -0.5f, 0.5f);
    float *w1 = dw_oc_alloc(C);
    for (int64_t c = 0; c < C; c++) w1[c] = (float)(off + (double)w->host[c]);
    dw_gt *out = dw_gt_out("out", N * C, dt), *rstd = dw_gt_out("rstd", N, DW_ACT_F32);
    float *wout = dw_oc_alloc(N * C), *wrstd = dw_oc_alloc(N), *wdx = dw_oc_alloc(N * C);
    float *wdx2 = dw_oc_alloc(N * C), *wdw = dw_oc_alloc(C);
    dw_oc_fill(&g_rng, wdw, C, -1, 1); /* priors: dw and the second dx accumulate onto them */
    dw_oc_fill(&g_rng, wdx2, N * C, -1, 1);
    dw_gt *dw = dw_gt_from("dw", wdw, C, DW_ACT_F32), *dx2 = dw_gt_from("dx_acc", wdx2, N * C, dt);
    memcpy(wdx2, dx2->host, sizeof(float) * (size_t)(N * C)); /* the prior as stored */
    dw_gt *dx = dw_gt_out("dx", N * C, dt);
    void *s = dw_gc_stream;
    dw_cpu_rmsnorm_fwd(wout, wrstd, x->host, w1, N, C, eps);
    DW_GC_OK(bad, name, dw_cuda_rmsnorm_fwd_offset(NULL, dt, out->dev, rstd->dev, x->dev, w->dev, off, N, C, eps, s));
    dw_gt *rstd_in = dw_gt_from("rstd_in", wrstd, N, DW_ACT_F32);
    const size_t wsb = dw_cuda_norm_bwd_ws_bytes(N, C);
    dw_gt *ws = dw_gt_new("ws", (int64_t)(wsb / 4), DW_ACT_F32);
    dw_cpu_rmsnorm_bwd(wdx, wdw, g->host, x->host, w1, wrstd, N, C);
    /* written dx (two-pass form: no workspace), then added onto a prior with the workspace */
    DW_GC_OK(bad, name, dw_cuda_rmsnorm_bwd_offset(NULL, dt, dx->dev, NULL, g->dev, x->dev, w->dev, off, rstd_in->dev,
                                                   N, C, false, NULL, 0, s));
    DW_GC_OK(bad, name, dw_cuda_rmsnorm_bwd_offset(NULL, dt, dx2->dev, dw->dev, g->dev, x->dev, w->dev, off,
                                                   rstd_in->dev, N, C, true, ws->dev, wsb, s));
    for (int64_t i = 0; i < N * C; i++) wdx2[i] += wdx[i];
    DW_GC_SYNC();
    DW_GC_CMP(bad, name, out, wout, tf);
    DW_GC_CMP(bad, name, rstd, wrstd, tstat);
    dw_gc_tol tdx = tf; /* dx cancels: its error scales with rstd |1 + w| |dout| */
    for (int64_t i = 0; i < N; i++)
        if (1e-5 * (fabs(off) + 0.5) * wrstd[i] > tdx.abs) tdx.abs = 1e-5 * (fabs(off) + 0.5) * wrstd[i];
    DW_GC_CMP(bad, name, dx, wdx, tdx);
    DW_GC_CMP(bad, name, dx2, wdx2, tdx);
    DW_GC_CMP(bad, name, dw, wdw, tparam);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(w1), free(wout), free(wrstd), free(wdx), free(wdx2), free(wdw);
    return bad;
}

static void test_rmsnorm_offset(void **state) {
    (void)state;
    /* {1, 1}, odd C (block kernels), C % 8 == 0 (BF16 rows in registers, 1 to 8 warps a row; the
     * one-pass backward up to C = 4096), rows over several blocks */
    static const int64_t shapes[][2] = {{1, 1}, {37, 7}, {53, 129}, {9, 8}, {77, 768}, {6, 1032}, {3, 2056},
                                        {4100, 16}, {5, 4104}};
    int64_t bad = 0;
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            bad += run_rms_offset(DTS[d], shapes[i][0], shapes[i][1], 1.0);
            if (i % 3 == 0) bad += run_rms_offset(DTS[d], shapes[i][0], shapes[i][1], dw_test_uniform(&g_rng, -2, 2));
        }
    assert_int_equal(bad, 0);
}

/* Bad arguments are refused with DW_ERR_INVALID naming the op, before any launch. */
static void test_invalid(void **state) {
    (void)state;
    void *p = (void *)(uintptr_t)256, *s = dw_gc_stream;
    assert_int_equal(dw_cuda_softcap_fwd(NULL, DW_ACT_F32, p, p, 4, 0.0, 1.0, s), DW_ERR_INVALID); /* s = 0 */
    assert_int_equal(dw_cuda_softcap_fwd(NULL, DW_ACT_F32, p, p, 4, 1.0, -1.0, s), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_softcap_bwd(NULL, DW_ACT_F32, p, p, p, 4, 1.0, NAN, s), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_geglu_bwd(NULL, DW_ACT_F32, p, NULL, p, p, p, 4, s), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_rmsnorm_fwd_offset(NULL, DW_ACT_F32, p, p, p, p, INFINITY, 1, 4, 1e-6, s),
                     DW_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_geglu),
        cmocka_unit_test(test_rmsnorm_offset),
        cmocka_unit_test(test_invalid),
    };
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
