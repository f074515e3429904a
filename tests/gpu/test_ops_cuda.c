/* test_ops_cuda.c — CUDA ops against the CPU reference (kernels/cpu): elementwise, norms,
 * embeddings, positions, linear, the MoE router, argument validation. Fresh random inputs, odd sizes,
 * outputs poisoned with NaN, guard bands around every buffer, FP32 and BF16 activations.
 * Attention and cross-entropy: test_ops_cuda_attn.c; rope (every type, partial widths):
 * test_ops_cuda_rope.c. Needs a GPU (ctest label "gpu").
 *
 * Tolerances (|gpu - cpu| <= atol * max|cpu| + rtol * |cpu|): the CPU oracle computes in double,
 * the GPU in FP32, so FP32 results differ by FP32 rounding of the intermediate sums: ~1e-7
 * relative per operation, growing like sqrt(terms). Per op below: elementwise 1e-5 (tanhf/expf are
 * within 2 ulp, gelu's 1 + tanh cancels for x << 0), norms and reductions 1e-4 with atol 1e-5,
 * rope 1e-6 (the GPU also computes it in double). BF16: the inputs are the same BF16 values on
 * both sides, the GPU output is rounded once to BF16 (<= 2^-9 relative) and may land on the
 * neighbouring BF16 value after FP32 compute: rtol 8e-3 (2 BF16 ulps), atol 1e-4 of the max. */
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
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x6B0Cull);
    return dw_gc_init(state);
}

static const dw_act_dtype DTS[] = {DW_ACT_F32, DW_ACT_BF16};

/* ---- elementwise --------------------------------------------------------------------------- */
enum { EW_GELU, EW_SILU, EW_SWIGLU, EW_ADD, EW_GELU_ERF, EW_RELU, EW_COUNT };
static const char *EW_NAMES[] = {"gelu", "silu", "swiglu", "add", "gelu_erf", "relu"};

static int64_t run_ew(int op, dw_act_dtype dt, int64_t n) {
    char name[128];
    snprintf(name, sizeof name, "%s[%s n=%lld]", EW_NAMES[op], dw_gc_dtname(dt), (long long)n);
    int64_t bad = 0;
    dw_gc_tol tl = dw_gc_pick(dt, 1e-6, 1e-5);
    tl.abs = 1e-6; /* gelu/silu cancel for x << 0: error ~ |x| 2^-24, |x| <= 6 */
    dw_gt *a = dw_gt_rand(&g_rng, "a", n, dt, -6, 6), *b = dw_gt_rand(&g_rng, "b", n, dt, -2, 2);
    dw_gt *g = dw_gt_rand(&g_rng, "dout", n, dt, -1, 1);
    dw_gt *out = dw_gt_out("out", n, dt), *da = dw_gt_out("da", n, dt), *db = dw_gt_out("db", n, dt);
    float *want = dw_oc_alloc(n), *wa = dw_oc_alloc(n), *wb = dw_oc_alloc(n);
    void *s = dw_gc_stream;
    switch (op) {
    case EW_GELU:
        dw_cpu_gelu_fwd(want, a->host, n);
        dw_cpu_gelu_bwd(wa, g->host, a->host, n);
        DW_GC_OK(bad, name, dw_cuda_gelu_fwd(NULL, dt, out->dev, a->dev, n, s));
        DW_GC_OK(bad, name, dw_cuda_gelu_bwd(NULL, dt, da->dev, g->dev, a->dev, n, s));
        break;
    case EW_SILU:
        dw_cpu_silu_fwd(want, a->host, n);
        dw_cpu_silu_bwd(wa, g->host, a->host, n);
        DW_GC_OK(bad, name, dw_cuda_silu_fwd(NULL, dt, out->dev, a->dev, n, s));
        DW_GC_OK(bad, name, dw_cuda_silu_bwd(NULL, dt, da->dev, g->dev, a->dev, n, s));
        break;
    case EW_GELU_ERF:
        dw_cpu_gelu_erf_fwd(want, a->host, n);
        dw_cpu_gelu_erf_bwd(wa, g->host, a->host, n);
        DW_GC_OK(bad, name, dw_cuda_gelu_erf_fwd(NULL, dt, out->dev, a->dev, n, s));
        DW_GC_OK(bad, name, dw_cuda_gelu_erf_bwd(NULL, dt, da->dev, g->dev, a->dev, n, s));
        break;
    case EW_RELU:
        dw_cpu_relu_fwd(want, a->host, n);
        dw_cpu_relu_bwd(wa, g->host, a->host, n);
        DW_GC_OK(bad, name, dw_cuda_relu_fwd(NULL, dt, out->dev, a->dev, n, s));
        DW_GC_OK(bad, name, dw_cuda_relu_bwd(NULL, dt, da->dev, g->dev, a->dev, n, s));
        break;
    case EW_SWIGLU:
        dw_cpu_swiglu_fwd(want, a->host, b->host, n);
        dw_cpu_swiglu_bwd(wa, wb, g->host, a->host, b->host, n);
        DW_GC_OK(bad, name, dw_cuda_swiglu_fwd(NULL, dt, out->dev, a->dev, b->dev, n, s));
        DW_GC_OK(bad, name, dw_cuda_swiglu_bwd(NULL, dt, da->dev, db->dev, g->dev, a->dev, b->dev, n, s));
        break;
    default:
        dw_cpu_add_fwd(want, a->host, b->host, n);
        DW_GC_OK(bad, name, dw_cuda_add_fwd(NULL, dt, out->dev, a->dev, b->dev, n, s));
        break;
    }
    DW_GC_SYNC();
    DW_GC_CMP(bad, name, out, want, tl);
    if (op != EW_ADD) DW_GC_CMP(bad, name, da, wa, tl);
    if (op == EW_SWIGLU) DW_GC_CMP(bad, name, db, wb, tl);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(want), free(wa), free(wb);
    return bad;
}

static void test_elementwise(void **state) {
    (void)state;
    static const int64_t sizes[] = {1, 31, 4096, 1000003}; /* BF16: 8-wide kernel + scalar tail */
    int64_t bad = 0;
    for (int op = 0; op < EW_COUNT; op++)
        for (int d = 0; d < 2; d++)
            for (int i = 0; i < 4; i++) bad += run_ew(op, DTS[d], sizes[i]);
    assert_int_equal(bad, 0);
}

/* ---- layernorm, rmsnorm ---------------------------------------------------------------------- */
static int64_t run_norm(int rms, dw_act_dtype dt, int64_t N, int64_t C) {
    char name[128];
    snprintf(name, sizeof name, "%s[%s N=%lld C=%lld]", rms ? "rmsnorm" : "layernorm",
             dw_gc_dtname(dt), (long long)N, (long long)C);
    int64_t bad = 0;
    const double eps = 1e-5;
    const dw_gc_tol tf = dw_gc_pick(dt, 1e-5, 1e-4), tstat = {1e-6, 1e-5, 0}, tparam = {1e-5, 1e-4, 0};
    dw_gt *x = dw_gt_new("x", N * C, dt);
    dw_oc_fill(&g_rng, x->host, N * C, -2, 2);
    for (int64_t i = 0; i < N * C; i++) x->host[i] += 0.25f * (float)((i / C) % 7); /* row means */
    dw_gt_upload(x);
    dw_gt *w = dw_gt_rand(&g_rng, "w", C, DW_ACT_F32, 0.5f, 1.5f);
    dw_gt *b = dw_gt_rand(&g_rng, "b", C, DW_ACT_F32, -0.5f, 0.5f);
    dw_gt *g = dw_gt_rand(&g_rng, "dout", N * C, dt, -1, 1);
    dw_gt *out = dw_gt_out("out", N * C, dt), *mean = dw_gt_out("mean", N, DW_ACT_F32);
    dw_gt *rstd = dw_gt_out("rstd", N, DW_ACT_F32), *dx = dw_gt_out("dx", N * C, dt);
    float *wout = dw_oc_alloc(N * C), *wmean = dw_oc_alloc(N), *wrstd = dw_oc_alloc(N);
    for (int64_t i = 0; i < N; i++) wmean[i] = 0.0f; /* rmsnorm has no mean */
    float *wdx = dw_oc_alloc(N * C), *wdw = dw_oc_alloc(C), *wdb = dw_oc_alloc(C);
    dw_oc_fill(&g_rng, wdw, C, -1, 1); /* priors: the gradients accumulate onto them */
    dw_oc_fill(&g_rng, wdb, C, -1, 1);
    dw_gt *dw = dw_gt_from("dw", wdw, C, DW_ACT_F32), *db = dw_gt_from("db", wdb, C, DW_ACT_F32);
    void *s = dw_gc_stream;
    if (rms) {
        dw_cpu_rmsnorm_fwd(wout, wrstd, x->host, w->host, N, C, eps);
        DW_GC_OK(bad, name, dw_cuda_rmsnorm_fwd(NULL, dt, out->dev, rstd->dev, x->dev, w->dev, N, C, eps, s));
    } else {
        dw_cpu_layernorm_fwd(wout, wmean, wrstd, x->host, w->host, b->host, N, C, eps);
        DW_GC_OK(bad, name, dw_cuda_layernorm_fwd(NULL, dt, out->dev, mean->dev, rstd->dev, x->dev,
                                                w->dev, b->dev, N, C, eps, s));
    }
    /* backward reads the CPU's statistics, so that it is tested on its own */
    dw_gt *mean_in = dw_gt_from("mean_in", wmean, N, DW_ACT_F32);
    dw_gt *rstd_in = dw_gt_from("rstd_in", wrstd, N, DW_ACT_F32);
    if (rms) {
        dw_cpu_rmsnorm_bwd(wdx, wdw, g->host, x->host, w->host, wrstd, N, C);
        DW_GC_OK(bad, name, dw_cuda_rmsnorm_bwd(NULL, dt, dx->dev, dw->dev, g->dev, x->dev, w->dev,
                                              rstd_in->dev, N, C, s));
    } else {
        dw_cpu_layernorm_bwd(wdx, wdw, wdb, g->host, x->host, w->host, wmean, wrstd, N, C);
        DW_GC_OK(bad, name, dw_cuda_layernorm_bwd(NULL, dt, dx->dev, dw->dev, db->dev, g->dev, x->dev,
                                                w->dev, mean_in->dev, rstd_in->dev, N, C, s));
    }
    DW_GC_SYNC();
    DW_GC_CMP(bad, name, out, wout, tf);
    DW_GC_CMP(bad, name, rstd, wrstd, tstat);
    if (!rms) DW_GC_CMP(bad, name, mean, wmean, tstat);
    /* dx = rstd (g - projection) cancels (to ~0 for C = 1): its error scales with the terms
     * rstd * |w| * |dout| <= max rstd * 1.5, not with the result */
    dw_gc_tol tdx = tf;
    for (int64_t i = 0; i < N; i++)
        if (1e-5 * 1.5 * wrstd[i] > tdx.abs) tdx.abs = 1e-5 * 1.5 * wrstd[i];
    DW_GC_CMP(bad, name, dx, wdx, tdx);
    DW_GC_CMP(bad, name, dw, wdw, tparam);
    DW_GC_CMP(bad, name, db, wdb, tparam); /* rmsnorm: db untouched, equal to its prior */
    /* the one-pass form with its workspace, dx added onto a prior (BF16 rows with C % 8 == 0 and
     * C <= 4096: the fused kernel; otherwise the two-pass form with an accumulating dx) */
    float *wdx2 = dw_oc_alloc(N * C), *wdw2 = dw_oc_alloc(C), *wdb2 = dw_oc_alloc(C);
    dw_oc_fill(&g_rng, wdx2, N * C, -1, 1);
    dw_oc_fill(&g_rng, wdw2, C, -1, 1);
    dw_oc_fill(&g_rng, wdb2, C, -1, 1);
    dw_gt *dx2 = dw_gt_from("dx_acc", wdx2, N * C, dt);
    memcpy(wdx2, dx2->host, sizeof(float) * (size_t)(N * C)); /* the prior as stored */
    dw_gt *dw2 = dw_gt_from("dw_ws", wdw2, C, DW_ACT_F32), *db2 = dw_gt_from("db_ws", wdb2, C, DW_ACT_F32);
    const size_t wsb = dw_cuda_norm_bwd_ws_bytes(N, C);
    dw_gt *ws = dw_gt_new("ws", (int64_t)(wsb / 4), DW_ACT_F32);
    if (rms) {
        dw_cpu_rmsnorm_bwd(wdx, wdw2, g->host, x->host, w->host, wrstd, N, C);
        DW_GC_OK(bad, name, dw_cuda_rmsnorm_bwd_ws(NULL, dt, dx2->dev, dw2->dev, g->dev, x->dev, w->dev,
                                                 rstd_in->dev, N, C, true, ws->dev, wsb, s));
    } else {
        dw_cpu_layernorm_bwd(wdx, wdw2, wdb2, g->host, x->host, w->host, wmean, wrstd, N, C);
        DW_GC_OK(bad, name, dw_cuda_layernorm_bwd_ws(NULL, dt, dx2->dev, dw2->dev, db2->dev, g->dev,
                                                   x->dev, w->dev, mean_in->dev, rstd_in->dev, N, C,
                                                   true, ws->dev, wsb, s));
    }
    for (int64_t i = 0; i < N * C; i++) wdx2[i] += wdx[i];
    DW_GC_SYNC();
    DW_GC_CMP(bad, name, dx2, wdx2, tdx);
    DW_GC_CMP(bad, name, dw2, wdw2, tparam);
    DW_GC_CMP(bad, name, db2, wdb2, tparam);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(wout), free(wmean), free(wrstd), free(wdx), free(wdw), free(wdb);
    free(wdx2), free(wdw2), free(wdb2);
    return bad;
}

static void test_norms(void **state) {
    (void)state;
    /* {2311, 45} and {700, 1031} spread their rows over all 8 blocks of a column-sum cluster;
     * C % 8 == 0, C <= 8192: BF16 takes the row-in-registers kernels (1, 2, 4, 8 warps a row) */
    static const int64_t shapes[][2] = {{1, 1},    {37, 7},    {53, 129},  {19, 777},
                                        {5, 4099}, {2311, 45}, {700, 1031}, {9, 8},
                                        {77, 768}, {530, 1024}, {3, 264},
                                        /* 2, 4, 8 warps per row (C <= 2048, 4096, 8192) */
                                        {13, 2048}, {6, 1032}, {9, 4096}, {3, 2056},
                                        {5, 8192}, {2, 6152}, {3, 8200},
                                        /* one-pass backward: blocks over several row groups */
                                        {4100, 16}, {1500, 520}};
    const int ns = (int)(sizeof shapes / sizeof shapes[0]);
    int64_t bad = 0;
    for (int rms = 0; rms < 2; rms++)
        for (int d = 0; d < 2; d++)
            for (int i = 0; i < ns; i++) bad += run_norm(rms, DTS[d], shapes[i][0], shapes[i][1]);
    assert_int_equal(bad, 0);
}

/* ---- embedding, positions ------------------------------------------------------------------- */
static int64_t run_embedding(dw_act_dtype dt, int64_t V, int64_t N, int64_t C) {
    char name[128];
    snprintf(name, sizeof name, "embedding[%s V=%lld N=%lld C=%lld]", dw_gc_dtname(dt),
             (long long)V, (long long)N, (long long)C);
    int64_t bad = 0;
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    for (int64_t n = 0; n < N; n++) /* every other row from the first 5 tokens: many repeats */
        tok[n] = (int32_t)(dw_test_next(&g_rng) % (uint64_t)(n % 2 && V > 5 ? 5 : V));
    tok[N - 1] = (int32_t)V; /* out of range: the GPU writes a NaN row and skips it in backward */
    dw_gt *tk = dw_gt_ints("tok", tok, N);
    dw_gt *wte = dw_gt_rand(&g_rng, "wte", V * C, DW_ACT_F32, -1, 1);
    dw_gt *g = dw_gt_rand(&g_rng, "dout", N * C, dt, -1, 1);
    dw_gt *out = dw_gt_out("out", N * C, dt);
    float *wout = dw_oc_alloc(N * C), *wd = dw_oc_alloc(V * C);
    dw_oc_fill(&g_rng, wd, V * C, -1, 1);
    dw_gt *dwte = dw_gt_from("dwte", wd, V * C, DW_ACT_F32);
    dw_cpu_embedding_fwd(wout, tok, wte->host, N - 1, C); /* the CPU oracle takes valid tokens only */
    for (int64_t c = 0; c < C; c++) wout[(N - 1) * C + c] = NAN;
    if (dt == DW_ACT_BF16) /* the stored activation is the BF16 rounding of the FP32 table */
        for (int64_t i = 0; i < N * C; i++) wout[i] = dw_gc_bf2f(dw_gc_f2bf(wout[i]));
    dw_cpu_embedding_bwd(wd, g->host, tok, N - 1, C);
    DW_GC_OK(bad, name, dw_cuda_embedding_fwd(NULL, dt, out->dev, tk->dev, wte->dev, N, C, V, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_embedding_bwd(NULL, dt, dwte->dev, g->dev, tk->dev, N, C, V, dw_gc_stream));
    DW_GC_SYNC();
    const dw_gc_tol exact = {0, 0, 0}, tparam = {1e-6, 1e-5, 0};
    DW_GC_CMP(bad, name, out, wout, exact);
    DW_GC_CMP(bad, name, dwte, wd, tparam);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(tok), free(wout), free(wd);
    return bad;
}

static int64_t run_pos(dw_act_dtype dt, int64_t B, int64_t T, int64_t C, int64_t maxT) {
    char name[128];
    snprintf(name, sizeof name, "pos[%s B=%lld T=%lld C=%lld]", dw_gc_dtname(dt), (long long)B,
             (long long)T, (long long)C);
    int64_t bad = 0;
    const int64_t n = B * T * C;
    dw_gt *x = dw_gt_rand(&g_rng, "x", n, dt, -1, 1), *g = dw_gt_rand(&g_rng, "dout", n, dt, -1, 1);
    dw_gt *wpe = dw_gt_rand(&g_rng, "wpe", maxT * C, DW_ACT_F32, -1, 1);
    dw_gt *out = dw_gt_out("out", n, dt), *dx = dw_gt_out("dx", n, dt);
    float *wout = dw_oc_alloc(n), *wdx = dw_oc_alloc(n), *wd = dw_oc_alloc(maxT * C);
    dw_oc_fill(&g_rng, wd, maxT * C, -1, 1);
    dw_gt *dwpe = dw_gt_from("dwpe", wd, maxT * C, DW_ACT_F32);
    dw_cpu_pos_fwd(wout, x->host, wpe->host, B, T, C);
    dw_cpu_pos_bwd(wdx, wd, g->host, B, T, C);
    DW_GC_OK(bad, name, dw_cuda_pos_fwd(NULL, dt, out->dev, x->dev, wpe->dev, B, T, C, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_pos_bwd(NULL, dt, dx->dev, dwpe->dev, g->dev, B, T, C, dw_gc_stream));
    DW_GC_SYNC();
    const dw_gc_tol exact = {0, 0, 0}, tparam = {1e-6, 1e-5, 0};
    DW_GC_CMP(bad, name, out, wout, dt == DW_ACT_F32 ? exact : DW_GC_TOL_BF16); /* x + wpe: one rounding */
    DW_GC_CMP(bad, name, dx, wdx, exact);
    DW_GC_CMP(bad, name, dwpe, wd, tparam);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(wout), free(wdx), free(wd);
    return bad;
}

static void test_embeddings(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int d = 0; d < 2; d++) {
        bad += run_embedding(DTS[d], 97, 53, 67);
        bad += run_embedding(DTS[d], 3, 301, 129); /* V < buckets, many repeats */
        bad += run_embedding(DTS[d], 1031, 1200, 7);
        bad += run_embedding(DTS[d], 2053, 777, 1100); /* > 1 column block and token chunk */
        bad += run_pos(DTS[d], 3, 19, 67, 23);
        bad += run_pos(DTS[d], 1, 1, 1, 1);
        bad += run_pos(DTS[d], 40, 33, 5, 33);
        bad += run_pos(DTS[d], 600, 3, 11, 5); /* >= 512 rows: the cluster column sum */
    }
    assert_int_equal(bad, 0);
}

/* ---- linear --------------------------------------------------------------------------------- */
static int64_t run_linear(int64_t N, int64_t K, int64_t M, int with_bias) {
    char name[128];
    snprintf(name, sizeof name, "linear[f32 N=%lld K=%lld M=%lld bias=%d]", (long long)N,
             (long long)K, (long long)M, with_bias);
    int64_t bad = 0;
    const dw_gc_tol tl = {1e-5, 1e-4, 0};
    dw_gt *x = dw_gt_rand(&g_rng, "x", N * K, DW_ACT_F32, -1, 1);
    dw_gt *w = dw_gt_rand(&g_rng, "w", M * K, DW_ACT_F32, -1, 1);
    dw_gt *b = dw_gt_rand(&g_rng, "b", M, DW_ACT_F32, -1, 1);
    dw_gt *g = dw_gt_rand(&g_rng, "dout", N * M, DW_ACT_F32, -1, 1);
    dw_gt *out = dw_gt_out("out", N * M, DW_ACT_F32), *dx = dw_gt_out("dx", N * K, DW_ACT_F32);
    float *wout = dw_oc_alloc(N * M), *wdx = dw_oc_alloc(N * K), *wdw = dw_oc_alloc(M * K);
    float *wdb = dw_oc_alloc(M);
    dw_oc_fill(&g_rng, wdw, M * K, -1, 1);
    dw_oc_fill(&g_rng, wdb, M, -1, 1);
    dw_gt *dw = dw_gt_from("dW", wdw, M * K, DW_ACT_F32), *db = dw_gt_from("db", wdb, M, DW_ACT_F32);
    const float *bias = with_bias ? b->host : NULL;
    dw_cpu_linear_fwd(wout, x->host, w->host, bias, N, K, M);
    dw_cpu_linear_bwd(wdx, wdw, with_bias ? wdb : NULL, g->host, x->host, w->host, N, K, M);
    DW_GC_OK(bad, name, dw_cuda_linear_fwd(NULL, out->dev, x->dev, w->dev, with_bias ? b->dev : NULL,
                                         N, K, M, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_linear_bwd(NULL, dx->dev, false, dw->dev, with_bias ? db->dev : NULL, g->dev,
                                         x->dev, w->dev, N, K, M, dw_gc_stream));
    DW_GC_SYNC();
    DW_GC_CMP(bad, name, out, wout, tl);
    DW_GC_CMP(bad, name, dx, wdx, tl);
    DW_GC_CMP(bad, name, dw, wdw, tl);
    DW_GC_CMP(bad, name, db, wdb, tl);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(wout), free(wdx), free(wdw), free(wdb);
    return bad;
}

static void test_linear(void **state) {
    (void)state;
    int64_t bad = 0;
    bad += run_linear(37, 71, 45, 1);
    bad += run_linear(37, 71, 45, 0);
    bad += run_linear(1, 1, 1, 1);
    bad += run_linear(129, 17, 300, 1);
    bad += run_linear(16, 32, 48, 1);
    bad += run_linear(601, 9, 70, 1); /* bias rows over several column-sum blocks */
    assert_int_equal(bad, 0);
}

/* ---- argument validation: bad shapes are refused with DW_ERR_INVALID, nothing launched ------ */
/* ---- MoE router -------------------------------------------------------------------------------
 * The experts must equal the CPU's exactly (both select by the stored logits; ties in BF16 go to
 * the lower expert on both sides); weights and dlogits within the elementwise tolerances. */
static int64_t run_router(dw_act_dtype dt, int64_t N, int64_t E, int64_t K, int score, int renorm, bool ties) {
    char name[128];
    snprintf(name, sizeof name, "moe_router[%s %s%s N=%lld E=%lld K=%lld]", dw_gc_dtname(dt),
             score ? "sigmoid" : "softmax", renorm ? " renorm" : "", (long long)N, (long long)E, (long long)K);
    int64_t bad = 0;
    dw_gt *z = dw_gt_new("logits", N * E, dt);
    dw_oc_fill(&g_rng, z->host, N * E, -4, 4);
    if (ties)
        for (int64_t n = 0; n < N && E > 1; n++) z->host[n * E + E - 1] = z->host[n * E + (n % (E - 1))];
    dw_gt_upload(z);
    dw_gt *g = dw_gt_rand(&g_rng, "dweights", N * K, dt, -1, 1);
    dw_gt *w = dw_gt_out("weights", N * K, dt), *ix = dw_gt_out("experts", N * K, DW_ACT_F32);
    dw_gt *dz = dw_gt_out("dlogits", N * E, dt), *dz0 = dw_gt_out("dlogits(no dw)", N * E, dt);
    float *ww = dw_oc_alloc(N * K), *wdz = dw_oc_alloc(N * E), *zeros = dw_oc_alloc(N * E);
    int32_t *widx = malloc((size_t)(N * K) * 4), *gidx = malloc((size_t)(N * K) * 4);
    dw_cpu_moe_router_fwd(ww, widx, z->host, N, E, K, score, renorm);
    dw_cpu_moe_router_bwd(wdz, g->host, z->host, widx, N, E, K, score, renorm);
    for (int64_t i = 0; i < N * E; i++) zeros[i] = 0.0f;
    DW_GC_OK(bad, name, dw_cuda_moe_router_fwd(NULL, dt, w->dev, (int32_t *)ix->dev, z->dev, N, E, K, score, renorm, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_moe_router_bwd(NULL, dt, dz->dev, g->dev, z->dev, (const int32_t *)ix->dev, N, E, K, score, renorm,
                                               dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_moe_router_bwd(NULL, dt, dz0->dev, NULL, z->dev, (const int32_t *)ix->dev, N, E, K, score, renorm,
                                               dw_gc_stream));
    DW_GC_SYNC();
    DW_GC_CUDA(cudaMemcpy(gidx, ix->dev, (size_t)(N * K) * 4, cudaMemcpyDeviceToHost));
    if (memcmp(gidx, widx, (size_t)(N * K) * 4)) {
        bad++;
        for (int64_t i = 0; i < N * K; i++)
            if (gidx[i] != widx[i]) {
                printf("MISMATCH %s experts[%lld]: gpu %d cpu %d\n", name, (long long)i, gidx[i], widx[i]);
                break;
            }
    }
    const dw_gc_tol t = dw_gc_pick(dt, 1e-6, 1e-5);
    DW_GC_CMP(bad, name, w, ww, t);
    /* dz cancels where the weights cannot move (one renormalised expert weighs 1): the error then
     * scales with the terms, a few FP32 ulps of |dw| */
    dw_gc_tol tz = dw_gc_pick(dt, 1e-5, 1e-4);
    tz.abs = 4e-7;
    DW_GC_CMP(bad, name, dz, wdz, tz);
    const dw_gc_tol exact = {0, 0, 0};
    DW_GC_CMP(bad, name, dz0, zeros, exact);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(ww), free(wdz), free(zeros), free(widx), free(gidx);
    return bad;
}

static void test_router(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int d = 0; d < 2; d++)
        for (int score = 0; score < 2; score++)
            for (int renorm = 0; renorm < 2; renorm++) {
                bad += run_router(DTS[d], 1 + (int64_t)(dw_test_next(&g_rng) % 300), 8, 2, score, renorm, false);
                bad += run_router(DTS[d], 37, 64, 8, score, renorm, true);   /* 64 experts over two lane passes */
                bad += run_router(DTS[d], 5, 3, 3, score, renorm, false);    /* every expert */
                bad += run_router(DTS[d], 9, 1, 1, score, renorm, false);
                bad += run_router(DTS[d], 3, 257, 40, score, renorm, true);  /* odd E, large K */
            }
    assert_int_equal(bad, 0);
}

static void test_validation(void **state) {
    (void)state;
    float *p = NULL;
    DW_GC_CUDA(cudaMalloc((void **)&p, 1024));
    assert_int_equal(dw_cuda_gelu_fwd(NULL, (dw_act_dtype)7, p, p, 4, dw_gc_stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_gelu_fwd(NULL, DW_ACT_F32, p, p, -1, dw_gc_stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_gelu_fwd(NULL, DW_ACT_F32, NULL, p, 4, dw_gc_stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_gelu_fwd(NULL, DW_ACT_F32, p, p, 0, dw_gc_stream), DW_OK);
    assert_int_equal(dw_cuda_layernorm_fwd(NULL, DW_ACT_F32, p, p, p, p, p, p, 2, 0, 1e-5, dw_gc_stream),
                     DW_ERR_INVALID);
    assert_int_equal(dw_cuda_attention_fwd(NULL, DW_ACT_F32, p, p, p, p, p, 1, 2, 3, 2, 4, dw_gc_stream),
                     DW_ERR_INVALID); /* H % Hkv != 0 */
    assert_int_equal(dw_cuda_attention_fwd(NULL, DW_ACT_F32, p, p, p, p, p, 1, 2, 2, 1, 257, dw_gc_stream),
                     DW_ERR_INVALID); /* D > 256 */
    assert_int_equal(dw_cuda_cross_entropy(NULL, DW_ACT_F32, p, NULL, NULL, p, (int32_t *)p, 2, 3,
                                           1.0f, NULL, dw_gc_stream), DW_ERR_INVALID); /* no ws */
    assert_non_null(strstr(dw_errmsg(NULL), "cross_entropy"));
    cudaFree(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise), cmocka_unit_test(test_norms),
        cmocka_unit_test(test_embeddings),
        cmocka_unit_test(test_linear),      cmocka_unit_test(test_router),
        cmocka_unit_test(test_validation),
    };
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
