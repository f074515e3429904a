/* test_ops_cuda_moe.c — the CUDA MoE data movement and grouped expert GEMMs against the CPU
 * reference (kernels/cpu/moe_cpu.c): dispatch (offsets and rows equal exactly, gathered rows bit
 * for bit), its backward, the grouped linear layer's fprop, dgrad and wgrad (FP32 programs; BF16 on
 * the tensor cores and on the FP32-FMA tiles), combine and its backward; the load-balancing
 * statistics of two chained layers (a block per expert, and over parts of the rows given the
 * scratch) and the loss (kernels/cpu/moe_aux_cpu.c); the routing counters, exactly. Routings: uniform, every
 * token to the same experts (the rest empty), one token, many experts with empty ones, assignments
 * outside [0,E) (rows past the assigned ones must come out zero); odd widths take the scalar paths.
 * The combine's backward writes every row without zeroing first where the dispatch was dropless
 * over valid experts (covered; poisoned rows would show). Dispatch with a capacity (token dropping)
 * and combine over the dropped rows, with the same
 * routings, a capacity of one row, and routings spread over many index-kernel segments.
 * Fresh random inputs, outputs poisoned with NaN, guard bands. Needs a GPU (ctest label "gpu"); the
 * host emulator (tests/common/cuda_emu/run.sh) runs it too, BF16 on the FMA tiles only.
 *
 * Tolerances as test_ops_cuda.c: BF16 outputs 2 BF16 ulps; FP32 sums of L terms differ from the
 * double oracle by FP32 rounding, within 1e-5 of the largest value + 1e-4 relative. */
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
#include "kernels/cpu/ops_cpu.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x30E5ull);
    return dw_gc_init(state);
}

enum { ROUTE_UNIFORM, ROUTE_SAME, ROUTE_INVALID };

/* Experts of N tokens, K each (distinct within a token, as a router gives them): uniform; every
 * token the experts 0..K-1; or uniform with about one in five set outside [0,E). */
static void route(int32_t *idx, int64_t N, int64_t K, int64_t E, int mode) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int32_t e;
            if (mode == ROUTE_SAME) {
                e = (int32_t)k;
            } else {
                bool dup;
                do { /* distinct within the token */
                    e = (int32_t)(dw_test_next(&g_rng) % (uint64_t)E);
                    dup = false;
                    for (int64_t j = 0; j < k; j++) dup |= idx[n * K + j] == e;
                } while (dup);
            }
            if (mode == ROUTE_INVALID && dw_test_next(&g_rng) % 5 == 0) e = dw_test_next(&g_rng) % 2 ? -1 : (int32_t)E;
            idx[n * K + k] = e;
        }
}

static int64_t cmp_ints(const char *name, const char *what, const void *dev, const int32_t *want, int64_t n) {
    int32_t *got = malloc((size_t)(n > 0 ? n : 1) * 4);
    if (!got) abort();
    DW_GC_CUDA(cudaMemcpy(got, dev, (size_t)n * 4, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            if (!bad) printf("MISMATCH %s %s[%lld]: gpu %d cpu %d\n", name, what, (long long)i, got[i], want[i]);
            bad++;
        }
    free(got);
    return bad;
}

static const char *const kernel_names[] = {"auto", "simt", "mma", "wgmma"};

/* The whole chain with routing `mode`; factor > 0: dispatch with dw_moe_capacity's rows per expert
 * (the rest dropped), and the routing must drop something when want_drops. */
static int64_t run_moe_cap(dw_act_dtype dt, dw_moe_kernel kern, int64_t N, int64_t C, int64_t K, int64_t E, int64_t M,
                           int mode, double factor, bool want_drops) {
    const int64_t R = N * K, cap = factor > 0 ? dw_moe_capacity(factor, N, K, E) : 0;
    char name[192];
    snprintf(name, sizeof name, "moe[%s %s N=%lld C=%lld K=%lld E=%lld M=%lld route=%d cap=%lld]", dw_gc_dtname(dt),
             kernel_names[kern], (long long)N, (long long)C, (long long)K, (long long)E, (long long)M, mode,
             (long long)cap);
    int64_t bad = 0, dropped = 0;
    int32_t *idx = malloc((size_t)R * 4), *off = malloc((size_t)(E + 1) * 4), *pos = malloc((size_t)R * 4);
    route(idx, N, K, E, mode);

    /* dispatch */
    dw_gt *x = dw_gt_rand(&g_rng, "x", N * C, dt, -1, 1), *ix = dw_gt_ints("experts", idx, R);
    const int64_t Rk = cap > 0 && E * cap < R ? E * cap : R; /* the rows dispatch holds (dw_moe_routed_rows) */
    dw_gt *xs = dw_gt_out("xs", Rk * C, dt), *goff = dw_gt_out("offsets", E + 1, DW_ACT_F32);
    dw_gt *gpos = dw_gt_out("pos", R, DW_ACT_F32);
    /* The GEMMs below run on all R rows, as the engine did before buffers were sized by capacity;
     * dispatch writes only its Rk held rows, so the rows past them start zeroed, as the engine's
     * dispatch leaves its tail (ops_cuda.h: rows past offsets[E] must be finite). Left as malloc
     * gave them, they held whatever an earlier buffer left, NaN poison included, and the wgmma
     * wgrad's last K tile multiplies the lines past the last expert's rows by zeroed dy lines. */
    float *xs_ref = dw_oc_alloc(R * C);
    memset(xs_ref, 0, (size_t)(R * C) * sizeof *xs_ref);
    dw_cpu_moe_dispatch_fwd(xs_ref, off, pos, x->host, idx, NULL, N, C, K, E, cap);
    for (int64_t a = 0; a < R; a++) dropped += pos[a] < 0 && idx[a] >= 0 && idx[a] < E;
    if (want_drops && !dropped) bad++, printf("MISMATCH %s: the case drops nothing\n", name);
    DW_GC_OK(bad, name, dw_cuda_moe_dispatch_fwd(NULL, dt, xs->dev, (int32_t *)goff->dev, (int32_t *)gpos->dev, x->dev,
                                                 (const int32_t *)ix->dev, NULL, N, C, K, E, cap, dw_gc_stream));
    DW_GC_SYNC();
    bad += cmp_ints(name, "offsets", goff->dev, off, E + 1);
    bad += cmp_ints(name, "pos", gpos->dev, pos, R);
    const dw_gc_tol exact = {0, 0, 0};
    DW_GC_CMP(bad, name, xs, xs_ref, exact);
    if (cap > 0) { /* dropping by weight: eighths in [0, 1], exact in BF16, with ties */
        float *prio = malloc((size_t)R * sizeof *prio), *xs_w = dw_oc_alloc(R * C);
        int32_t *off_w = malloc((size_t)(E + 1) * 4), *pos_w = malloc((size_t)R * 4);
        for (int64_t a = 0; a < R; a++) prio[a] = (float)(dw_test_next(&g_rng) % 9) / 8.0f;
        dw_gt *gp = dw_gt_from("prio", prio, R, dt);
        dw_cpu_moe_dispatch_fwd(xs_w, off_w, pos_w, x->host, idx, prio, N, C, K, E, cap);
        DW_GC_OK(bad, name, dw_cuda_moe_dispatch_fwd(NULL, dt, xs->dev, (int32_t *)goff->dev, (int32_t *)gpos->dev,
                                                     x->dev, (const int32_t *)ix->dev, gp->dev, N, C, K, E, cap,
                                                     dw_gc_stream));
        DW_GC_SYNC();
        bad += cmp_ints(name, "offsets(by weight)", goff->dev, off_w, E + 1);
        bad += cmp_ints(name, "pos(by weight)", gpos->dev, pos_w, R);
        DW_GC_CMP(bad, name, xs, xs_w, exact);
        dw_cpu_moe_dispatch_fwd(xs_ref, off, pos, x->host, idx, NULL, N, C, K, E, cap); /* back to the chain's */
        DW_GC_OK(bad, name, dw_cuda_moe_dispatch_fwd(NULL, dt, xs->dev, (int32_t *)goff->dev, (int32_t *)gpos->dev,
                                                     x->dev, (const int32_t *)ix->dev, NULL, N, C, K, E, cap,
                                                     dw_gc_stream));
        free(prio), free(xs_w), free(off_w), free(pos_w);
    }
    /* the kernels below read the oracle's xs (equal to the device's when the above passed) */
    dw_gt *xsr = dw_gt_from("xs(cpu)", xs_ref, R * C, dt);

    /* dispatch backward: each token's sum of its rows' gradients */
    dw_gt *dxs = dw_gt_rand(&g_rng, "dxs", R * C, dt, -1, 1), *dx = dw_gt_out("dx", N * C, dt);
    float *dx_ref = dw_oc_alloc(N * C);
    dw_cpu_moe_dispatch_bwd(dx_ref, dxs->host, pos, N, C, K);
    DW_GC_OK(bad, name, dw_cuda_moe_combine_fwd(NULL, dt, dx->dev, dxs->dev, NULL, (const int32_t *)gpos->dev, N, C, K,
                                                dw_gc_stream));

    /* grouped linear: fprop, dgrad, wgrad */
    dw_gt *w = dw_gt_rand(&g_rng, "W", E * M * C, dt, -1, 1), *y = dw_gt_out("y", R * M, dt);
    dw_gt *dy = dw_gt_rand(&g_rng, "dy", R * M, dt, -1, 1), *dxl = dw_gt_out("dx(linear)", R * C, dt);
    dw_gt *dW = dw_gt_rand(&g_rng, "dW", E * M * C, DW_ACT_F32, -1, 1); /* accumulated into */
    float *y_ref = dw_oc_alloc(R * M), *dxl_ref = dw_oc_alloc(R * C), *dW_ref = dw_oc_alloc(E * M * C);
    memcpy(dW_ref, dW->host, (size_t)(E * M * C) * sizeof(float));
    dw_cpu_moe_linear_fwd(y_ref, xsr->host, w->host, off, R, E, C, M);
    dw_cpu_moe_linear_bwd(dxl_ref, dW_ref, dy->host, xsr->host, w->host, off, R, E, C, M);
    dw_moe_gemm_args a = {.pass = DW_MOE_FPROP, .x = xsr->dev, .w = w->dev, .out = y->dev,
                          .offsets = (const int32_t *)goff->dev, .R = R, .E = E, .K = C, .M = M, .kernel = kern};
    DW_GC_OK(bad, name, dw_cuda_moe_gemm(NULL, dt, &a, dw_gc_stream));
    a.pass = DW_MOE_DGRAD, a.dy = dy->dev, a.out = dxl->dev;
    DW_GC_OK(bad, name, dw_cuda_moe_gemm(NULL, dt, &a, dw_gc_stream));
    a.pass = DW_MOE_WGRAD, a.out = dW->dev;
    DW_GC_OK(bad, name, dw_cuda_moe_gemm(NULL, dt, &a, dw_gc_stream));

    /* combine and its backward, over rows of width M */
    dw_gt *ys = dw_gt_rand(&g_rng, "ys", R * M, dt, -1, 1), *wt = dw_gt_rand(&g_rng, "wt", R, dt, 0, 1);
    dw_gt *out = dw_gt_out("out", N * M, dt), *dout = dw_gt_rand(&g_rng, "dout", N * M, dt, -1, 1);
    dw_gt *dys = dw_gt_out("dys", R * M, dt), *dwt = dw_gt_out("dwt", R, dt);
    float *out_ref = dw_oc_alloc(N * M), *dys_ref = dw_oc_alloc(R * M), *dwt_ref = dw_oc_alloc(R);
    dw_cpu_moe_combine_fwd(out_ref, ys->host, wt->host, pos, N, M, K);
    dw_cpu_moe_combine_bwd(dys_ref, dwt_ref, dout->host, ys->host, wt->host, pos, N, M, K, R);
    DW_GC_OK(bad, name, dw_cuda_moe_combine_fwd(NULL, dt, out->dev, ys->dev, wt->dev, (const int32_t *)gpos->dev, N, M,
                                                K, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_moe_combine_bwd(NULL, dt, dys->dev, dwt->dev, dout->dev, ys->dev, wt->dev,
                                                (const int32_t *)gpos->dev, N, M, K, R, cap == 0 && mode != ROUTE_INVALID,
                                                dw_gc_stream));
    DW_GC_SYNC();

    const dw_gc_tol t = dw_gc_pick(dt, 1e-5, 1e-4), tf = {1e-5, 1e-4, 0.0};
    DW_GC_CMP(bad, name, dx, dx_ref, t);
    DW_GC_CMP(bad, name, y, y_ref, t);
    DW_GC_CMP(bad, name, dxl, dxl_ref, t);
    DW_GC_CMP(bad, name, dW, dW_ref, tf); /* FP32 output either way */
    DW_GC_CMP(bad, name, out, out_ref, t);
    DW_GC_CMP(bad, name, dys, dys_ref, t);
    DW_GC_CMP(bad, name, dwt, dwt_ref, t);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(idx), free(off), free(pos), free(xs_ref), free(dx_ref), free(y_ref), free(dxl_ref), free(dW_ref);
    free(out_ref), free(dys_ref), free(dwt_ref);
    return bad;
}

static int64_t run_moe(dw_act_dtype dt, dw_moe_kernel kern, int64_t N, int64_t C, int64_t K, int64_t E, int64_t M,
                       int mode) {
    return run_moe_cap(dt, kern, N, C, K, E, M, mode, 0.0, false);
}

static void test_moe_ops(void **state) {
    (void)state;
    int64_t bad = 0;
    /* FP32 on the FMA tiles; BF16 as the engine runs it (auto: wgmma on sm_90), and each BF16 kernel
     * asked for by name; wgmma once more with DW_MOE_DGRAD=128 (dgrad's 128-column tiles: the
     * default takes 256 for a dx at least that wide, the cases with C >= 256 below), and with
     * fprop's and dgrad's output through the register epilogue (DW_MOE_STORE=reg) instead of TMA */
    const struct {
        dw_act_dtype dt;
        dw_moe_kernel kern;
        const char *dgrad, *store;
    } modes[] = {{DW_ACT_F32, DW_MOE_KERNEL_SIMT, NULL, NULL},    {DW_ACT_BF16, DW_MOE_KERNEL_AUTO, NULL, NULL},
                 {DW_ACT_BF16, DW_MOE_KERNEL_MMA, NULL, NULL},    {DW_ACT_BF16, DW_MOE_KERNEL_SIMT, NULL, NULL},
                 {DW_ACT_BF16, DW_MOE_KERNEL_WGMMA, NULL, NULL},  {DW_ACT_BF16, DW_MOE_KERNEL_WGMMA, "128", NULL},
                 {DW_ACT_BF16, DW_MOE_KERNEL_WGMMA, NULL, "reg"}, {DW_ACT_BF16, DW_MOE_KERNEL_WGMMA, "128", "reg"}};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        const dw_act_dtype dt = modes[m].dt;
        const dw_moe_kernel k = modes[m].kern;
        if (modes[m].dgrad) setenv("DW_MOE_DGRAD", modes[m].dgrad, 1);
        else unsetenv("DW_MOE_DGRAD");
        if (modes[m].store) setenv("DW_MOE_STORE", modes[m].store, 1);
        else unsetenv("DW_MOE_STORE");
#ifdef DW_CUDA_EMU /* the host emulator cannot run the tensor-core kernels' PTX */
        if (k != DW_MOE_KERNEL_SIMT) continue;
#endif
        bad += run_moe(dt, k, 1 + (int64_t)(dw_test_next(&g_rng) % 300), 72, 2, 8, 40, ROUTE_UNIFORM);
        if (k != DW_MOE_KERNEL_WGMMA) /* widths not multiples of 8: the other kernels only */
            bad += run_moe(dt, k, 37, 33, 3, 5, 19, ROUTE_SAME); /* skewed, odd widths: scalar paths */
        bad += run_moe(dt, k, 1, 64, 1, 4, 64, ROUTE_UNIFORM);     /* a single token */
        bad += run_moe(dt, k, 200, 256, 8, 64, 136, ROUTE_UNIFORM); /* many experts, some empty */
        bad += run_moe(dt, k, 300, 384, 2, 4, 320, ROUTE_UNIFORM);  /* several 128-tiles and K tiles */
        bad += run_moe(dt, k, 90, 48, 2, 6, 24, ROUTE_INVALID);     /* tails past the assigned rows */
        if (dt == DW_ACT_BF16) { /* more K tiles than the wgmma ring's 6 slots, in every pass; skewed */
            bad += run_moe(dt, k, 700, 512, 2, 8, 448, ROUTE_SAME);
            /* 64 experts, top-8, every one with rows (moe-e64's router) */
            bad += run_moe(dt, k, 1500, 128, 8, 64, 64, ROUTE_UNIFORM);
            /* combine rows wider than one pass of the vectorised combines' block (2048 columns) */
            bad += run_moe(dt, k, 40, 64, 3, 4, 4104, ROUTE_UNIFORM);
        }
        /* token dropping: dispatch with a capacity, the chain over the kept rows; each case must drop
         * something unless its factor is too large to */
        bad += run_moe_cap(dt, k, 2 + (int64_t)(dw_test_next(&g_rng) % 300), 72, 2, 8, 40, ROUTE_UNIFORM, 0.5, true);
        if (k != DW_MOE_KERNEL_WGMMA) /* every token to experts 0..2, odd widths */
            bad += run_moe_cap(dt, k, 37, 33, 3, 5, 19, ROUTE_SAME, 1.0, true);
        bad += run_moe_cap(dt, k, 1, 64, 2, 4, 64, ROUTE_UNIFORM, 0.5, false);    /* a single token: capacity 1 */
        bad += run_moe_cap(dt, k, 90, 48, 2, 6, 24, ROUTE_INVALID, 0.75, true);   /* invalid and dropped together */
        bad += run_moe_cap(dt, k, 200, 16, 8, 64, 16, ROUTE_UNIFORM, 0.01, true); /* capacity 1, many experts */
        bad += run_moe_cap(dt, k, 2500, 8, 8, 64, 8, ROUTE_SAME, 1.25, true);    /* many index-kernel segments */
        bad += run_moe_cap(dt, k, 700, 24, 2, 8, 16, ROUTE_UNIFORM, 1000.0, false); /* drops nothing */
    }
    unsetenv("DW_MOE_DGRAD"), unsetenv("DW_MOE_STORE");
    assert_int_equal(bad, 0);
}

/* The router-loss statistics of two chained layers and the losses (load-balancing coef, z-loss
 * zcoef; either may be 0), forward and backward. */
static int64_t run_aux(dw_act_dtype dt, int64_t N, int64_t E, int64_t K, double coef, double zcoef, bool parts) {
    char name[128];
    snprintf(name, sizeof name, "moe_aux[%s N=%lld E=%lld K=%lld coef=%g zcoef=%g%s]", dw_gc_dtname(dt), (long long)N,
             (long long)E, (long long)K, coef, zcoef, parts ? " parts" : "");
    int64_t bad = 0;
    const int64_t S = E + 1; /* the sums: E softmax sums, then the squared log-sum-exps */
    int32_t *idx0 = malloc((size_t)(N * K) * 4), *idx1 = malloc((size_t)(N * K) * 4);
    int32_t *c0 = malloc((size_t)E * 4), *c1 = malloc((size_t)E * 4);
    route(idx0, N, K, E, ROUTE_UNIFORM);
    route(idx1, N, K, E, ROUTE_SAME);
    dw_gt *z0 = dw_gt_rand(&g_rng, "z0", N * E, dt, -3, 3), *z1 = dw_gt_rand(&g_rng, "z1", N * E, dt, -3, 3);
    dw_gt *i0 = dw_gt_ints("idx0", idx0, N * K), *i1 = dw_gt_ints("idx1", idx1, N * K);
    dw_gt *s0 = dw_gt_out("sums0", S, dt), *s1 = dw_gt_out("sums1", S, dt);
    dw_gt *n0 = dw_gt_out("counts0", E, DW_ACT_F32), *n1 = dw_gt_out("counts1", E, DW_ACT_F32);
    dw_gt *out = dw_gt_out("aux", 1, dt), *loss = dw_gt_from("loss", (float[]){1.5f}, 1, DW_ACT_F32);
    dw_gt *kept = dw_gt_out("kept", 2 + E, DW_ACT_F32), *ds = dw_gt_out("dsums", S, dt);
    dw_gt *g = dw_gt_rand(&g_rng, "g", S, dt, -1, 1), *dz = dw_gt_out("dz", N * E, dt);
    float *s0r = dw_oc_alloc(S), *s1r = dw_oc_alloc(S), *dsr = dw_oc_alloc(S), *dzr = dw_oc_alloc(N * E);
    dw_cpu_moe_aux_stats_fwd(s0r, c0, z0->host, idx0, NULL, NULL, N, E, K);
    dw_gt *s0in = dw_gt_from("sums0(cpu)", s0r, S, dt); /* the second layer reads the oracle's sums */
    dw_cpu_moe_aux_stats_fwd(s1r, c1, z1->host, idx1, s0in->host, c0, N, E, K);
    dw_gt *s1in = dw_gt_from("sums1(cpu)", s1r, S, dt);
    double zl = 0.0;
    const double aux = dw_cpu_moe_aux_loss(s1in->host, c1, E, K, N, coef, zcoef, &zl);
    const float outr = (float)(aux + zl), lossr = 1.5f + (float)(aux + zl);
    dw_cpu_moe_aux_loss_bwd(dsr, c1, E, K, N, coef, zcoef, 0.75);
    dw_cpu_moe_aux_stats_bwd(dzr, g->host, z1->host, N, E);
    dw_gt *c0in = dw_gt_ints("counts0(cpu)", c0, E), *c1in = dw_gt_ints("counts1(cpu)", c1, E);
    void *part = parts ? dw_gt_out("aux parts", DW_MOE_AUX_PART_BYTES(E) / 4, DW_ACT_F32)->dev : NULL;
    DW_GC_OK(bad, name, dw_cuda_moe_aux_stats_fwd(NULL, dt, s0->dev, (int32_t *)n0->dev, z0->dev,
                                                  (const int32_t *)i0->dev, NULL, NULL, N, E, K, part, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_moe_aux_stats_fwd(NULL, dt, s1->dev, (int32_t *)n1->dev, z1->dev,
                                                  (const int32_t *)i1->dev, s0in->dev, (const int32_t *)c0in->dev, N,
                                                  E, K, part, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_moe_aux_loss(NULL, dt, out->dev, (float *)loss->dev, (float *)kept->dev, NULL,
                                             s1in->dev, (const int32_t *)c1in->dev, E, K, N, coef, zcoef, 0.0,
                                             dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_moe_aux_loss(NULL, dt, NULL, NULL, NULL, ds->dev, NULL, (const int32_t *)c1in->dev, E,
                                             K, N, coef, zcoef, 0.75, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_moe_aux_stats_bwd(NULL, dt, dz->dev, g->dev, z1->dev, N, E, dw_gc_stream));
    DW_GC_SYNC();
    bad += cmp_ints(name, "counts0", n0->dev, c0, E);
    bad += cmp_ints(name, "counts1", n1->dev, c1, E);
    int32_t *kc = malloc((size_t)(2 + E) * 4);
    DW_GC_CUDA(cudaMemcpy(kc, kept->dev, (size_t)(2 + E) * 4, cudaMemcpyDeviceToHost));
    bad += memcmp(kc + 2, c1, (size_t)E * 4) != 0;
    float kl[2];
    memcpy(kl, kc, 8);
    const double want[2] = {aux, zl}, cf[2] = {coef, zcoef};
    for (int k = 0; k < 2; k++) /* each loss kept, or NaN when its coefficient is 0 */
        if (cf[k] > 0 ? !(fabs(kl[k] - want[k]) <= 1e-5 * fabs(want[k])) : !isnan(kl[k]))
            bad++, printf("MISMATCH %s kept loss %d: %g vs %g\n", name, k, kl[k], want[k]);
    const dw_gc_tol t = dw_gc_pick(dt, 1e-5, 1e-4), tf = {1e-6, 1e-5, 0.0};
    DW_GC_CMP(bad, name, s0, s0r, t);
    DW_GC_CMP(bad, name, s1, s1r, t);
    DW_GC_CMP(bad, name, out, &outr, t);
    DW_GC_CMP(bad, name, loss, &lossr, tf);
    DW_GC_CMP(bad, name, ds, dsr, t);
    DW_GC_CMP(bad, name, dz, dzr, t);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(idx0), free(idx1), free(c0), free(c1), free(kc), free(s0r), free(s1r), free(dsr), free(dzr);
    return bad;
}

static void test_moe_aux(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int d = 0; d < 2; d++) {
        const dw_act_dtype dt = d ? DW_ACT_BF16 : DW_ACT_F32;
        for (int pt = 0; pt < 2; pt++) { /* a block per expert; the parts (every row's softmax once) */
            bad += run_aux(dt, 1 + (int64_t)(dw_test_next(&g_rng) % 300), 8, 2, 0.01, 0.0, pt);
            bad += run_aux(dt, 77, 64, 8, 0.5, 1e-3, pt);
            bad += run_aux(dt, 5, 3, 3, 0.0, 0.1, pt);
            bad += run_aux(dt, pt ? 1100 : 150, 200, 6, 0.1, 1e-3, pt); /* 7 experts a lane; the parts: every
                                                                           part's 8 warps with rows, some two */
            bad += run_aux(dt, 40, 300, 4, 0.1, 0.0, pt);    /* past DW_MOE_AUX_PART_EXPERTS: a block per expert */
        }
    }
    assert_int_equal(bad, 0);
}

/* The routing counters (dw_cuda_moe_count, one per training forward): cnt += (assignments, dropped,
 * per-expert choices), over enough assignments for several blocks adding into cnt, with experts
 * outside [0,E) not counted; cnt holds values first (it accumulates). Exact integers. */
static void test_moe_count(void **state) {
    (void)state;
    const int64_t sizes[3] = {1, 20000 + (int64_t)(dw_test_next(&g_rng) % 5000), 65536};
    for (int c = 0; c < 3; c++) {
        const int64_t A = sizes[c], E = c == 1 ? 37 : 64;
        int32_t *idx = malloc((size_t)A * 4), off[65];
        long long *cnt = malloc((size_t)(E + 2) * 8), *want = malloc((size_t)(E + 2) * 8), *got = malloc((size_t)(E + 2) * 8);
        for (int64_t e = 0; e < E + 2; e++) want[e] = cnt[e] = (long long)(dw_test_next(&g_rng) % 1000);
        for (int64_t a = 0; a < A; a++) {
            const uint64_t r = dw_test_next(&g_rng) % (uint64_t)(E + 2);
            idx[a] = r == (uint64_t)E ? -1 : (int32_t)r; /* E + 1 and -1: outside [0,E) */
            if (idx[a] >= 0 && idx[a] < E) want[2 + idx[a]]++;
        }
        for (int64_t e = 0; e <= E; e++) off[e] = (int32_t)(e * (A / 2) / E); /* offsets[E]: half assigned */
        want[0] += A, want[1] += A - off[E];
        int32_t *didx = NULL, *doff = NULL;
        long long *dcnt = NULL;
        DW_GC_CUDA(cudaMalloc((void **)&didx, (size_t)A * 4));
        DW_GC_CUDA(cudaMalloc((void **)&doff, (size_t)(E + 1) * 4));
        DW_GC_CUDA(cudaMalloc((void **)&dcnt, (size_t)(E + 2) * 8));
        DW_GC_CUDA(cudaMemcpy(didx, idx, (size_t)A * 4, cudaMemcpyHostToDevice));
        DW_GC_CUDA(cudaMemcpy(doff, off, (size_t)(E + 1) * 4, cudaMemcpyHostToDevice));
        DW_GC_CUDA(cudaMemcpy(dcnt, cnt, (size_t)(E + 2) * 8, cudaMemcpyHostToDevice));
        assert_int_equal(dw_cuda_moe_count(NULL, (int64_t *)dcnt, didx, doff, A, E, dw_gc_stream), DW_OK);
        DW_GC_CUDA(cudaMemcpy(got, dcnt, (size_t)(E + 2) * 8, cudaMemcpyDeviceToHost));
        int64_t bad = 0;
        for (int64_t e = 0; e < E + 2; e++)
            if (got[e] != want[e]) bad++, printf("MISMATCH moe_count A=%lld E=%lld [%lld]: %lld vs %lld\n", (long long)A,
                                                 (long long)E, (long long)e, got[e], want[e]);
        printf("moe_count A=%lld E=%lld: %s\n", (long long)A, (long long)E, bad ? "differs" : "exact");
        cudaFree(didx), cudaFree(doff), cudaFree(dcnt);
        free(idx), free(cnt), free(want), free(got);
        assert_int_equal(bad, 0);
    }
}

static void test_moe_validation(void **state) {
    (void)state;
    float *p = NULL;
    DW_GC_CUDA(cudaMalloc((void **)&p, 1024));
    dw_moe_gemm_args a = {.pass = DW_MOE_FPROP, .x = p, .w = p, .out = p, .offsets = (const int32_t *)p, .R = 4,
                          .E = 0, .K = 4, .M = 4};
    assert_int_equal(dw_cuda_moe_gemm(NULL, DW_ACT_F32, &a, dw_gc_stream), DW_ERR_INVALID); /* no experts */
    assert_non_null(strstr(dw_errmsg(NULL), "moe_linear"));
    a.E = 2, a.pass = DW_MOE_DGRAD; /* dgrad without dy */
    assert_int_equal(dw_cuda_moe_gemm(NULL, DW_ACT_F32, &a, dw_gc_stream), DW_ERR_INVALID);
    a.pass = DW_MOE_FPROP, a.K = 33, a.kernel = DW_MOE_KERNEL_WGMMA; /* a width wgmma cannot take, asked of it */
    assert_int_equal(dw_cuda_moe_gemm(NULL, DW_ACT_BF16, &a, dw_gc_stream), DW_ERR_UNSUPPORTED);
    assert_non_null(strstr(dw_errmsg(NULL), "wgmma"));
    a.K = 4, a.kernel = DW_MOE_KERNEL_MMA; /* an FP32 program has no tensor-core kernel */
    assert_int_equal(dw_cuda_moe_gemm(NULL, DW_ACT_F32, &a, dw_gc_stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_moe_dispatch_fwd(NULL, DW_ACT_F32, p, (int32_t *)p, (int32_t *)p, p, (const int32_t *)p, NULL,
                                              2, 4, 1, 5000, 0, dw_gc_stream),
                     DW_ERR_INVALID); /* E > 4096 */
    assert_int_equal(dw_cuda_moe_combine_fwd(NULL, (dw_act_dtype)3, p, p, p, (const int32_t *)p, 1, 1, 1, dw_gc_stream),
                     DW_ERR_INVALID);
    cudaFree(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_moe_ops), cmocka_unit_test(test_moe_aux),
                                       cmocka_unit_test(test_moe_count), cmocka_unit_test(test_moe_validation)};
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
