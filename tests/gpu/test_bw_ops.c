/* test_bw_ops.c — the bandwidth-bound CUDA ops (norms, rope, elementwise, embedding,
 * cross-entropy) at the training shapes of GPT-2 124M and Llama-3.2-1B (B*T = 16384 rows, BF16):
 * each output checked against the CPU reference (tolerances as test_ops_cuda.c); with
 * DW_BENCH_OPS=1 also timed: median of CUDA-event-timed launches over rotating buffer sets (each
 * set of an op at least ~256 MB together, so L2 does not serve them), as GB/s of the fewest
 * bytes the op must move and as a ratio to a device-to-device cudaMemcpy timed in the same run.
 * Needs a GPU (ctest label "gpu"); not a substitute for the odd-size tests in test_ops_cuda.c.
 * (Named outside test_ops_cuda*.c so that the host emulator, tests/common/cuda_emu/run.sh, does
 * not run these full-size shapes.) */
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
static int g_bench;       /* DW_BENCH_OPS=1: time every case */
static double g_copy_gbs; /* device-to-device copy, (read + write bytes) / s */

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xB3A7ull);
    const char *e = getenv("DW_BENCH_OPS");
    g_bench = e && strcmp(e, "1") == 0;
    return dw_gc_init(state);
}

#define BW_ROWS 16384 /* B*T of both bench shapes: 16 x 1024 (GPT-2), 8 x 2048 (Llama) */
#define BW_REPS 20

/* ---- timing ------------------------------------------------------------------------------ */
enum { BW_RMS_F, BW_RMS_B, BW_LN_F, BW_LN_B, BW_ROPE_F, BW_ROPE_B, BW_SWIGLU_F, BW_SWIGLU_B,
       BW_SILU_F, BW_SILU_B, BW_GELU_F, BW_GELU_B, BW_ADD, BW_EMB_F, BW_EMB_B, BW_XENT };

/* One op's arguments: device tensors t[i] (tb[i] bytes each, nset copies back to back) and
 * sizes. */
typedef struct {
    int op;
    const char *label;
    double bytes; /* the fewest bytes the op moves: each input read once, each output written once */
    int nt, nset;
    unsigned char *t[8];
    size_t tb[8];
    int64_t a, b, c, d; /* N, C (norms, embedding), B, T, H, D (rope), n (elementwise), N, V */
    int64_t e;
} bw_case;

static dw_status bw_launch(const bw_case *k, int set) {
    void *p[8];
    for (int i = 0; i < k->nt; i++) p[i] = k->t[i] + (size_t)set * k->tb[i];
    const dw_act_dtype bf = DW_ACT_BF16;
    void *s = dw_gc_stream;
    switch (k->op) {
    case BW_RMS_F: return dw_cuda_rmsnorm_fwd(NULL, bf, p[1], p[2], p[0], p[3], k->a, k->b, 1e-5, s);
    case BW_RMS_B: /* as the engine runs it: one pass, dx added onto the other gradient of x */
        return dw_cuda_rmsnorm_bwd_ws(NULL, bf, p[4], p[5], p[1], p[0], p[3], p[2], k->a, k->b, true,
                                      p[6], k->tb[6], s);
    case BW_LN_F:
        return dw_cuda_layernorm_fwd(NULL, bf, p[1], p[2], (float *)p[2] + k->a, p[0], p[3],
                                     (float *)p[3] + k->b, k->a, k->b, 1e-5, s);
    case BW_LN_B:
        return dw_cuda_layernorm_bwd_ws(NULL, bf, p[4], p[5], (float *)p[5] + k->b, p[1], p[0],
                                        p[3], p[2], (float *)p[2] + k->a, k->a, k->b, true, p[6],
                                        k->tb[6], s);
    case BW_ROPE_F: return dw_cuda_rope_fwd(NULL, bf, p[1], p[0], k->a, k->b, k->c, k->d, 500000.0, NULL, s);
    case BW_ROPE_B: return dw_cuda_rope_bwd(NULL, bf, p[1], p[0], k->a, k->b, k->c, k->d, 500000.0, NULL, s);
    case BW_SWIGLU_F: return dw_cuda_swiglu_fwd(NULL, bf, p[2], p[0], p[1], k->a, s);
    case BW_SWIGLU_B: return dw_cuda_swiglu_bwd(NULL, bf, p[3], p[4], p[2], p[0], p[1], k->a, s);
    case BW_SILU_F: return dw_cuda_silu_fwd(NULL, bf, p[1], p[0], k->a, s);
    case BW_SILU_B: return dw_cuda_silu_bwd(NULL, bf, p[2], p[1], p[0], k->a, s);
    case BW_GELU_F: return dw_cuda_gelu_fwd(NULL, bf, p[1], p[0], k->a, s);
    case BW_GELU_B: return dw_cuda_gelu_bwd(NULL, bf, p[2], p[1], p[0], k->a, s);
    case BW_ADD: return dw_cuda_add_fwd(NULL, bf, p[2], p[0], p[1], k->a, s);
    case BW_EMB_F: return dw_cuda_embedding_fwd(NULL, bf, p[2], p[0], p[1], k->a, k->b, k->c, s);
    case BW_EMB_B: return dw_cuda_embedding_bwd(NULL, bf, p[1], p[2], p[0], k->a, k->b, k->c, s);
    default:
        return dw_cuda_cross_entropy(NULL, bf, p[2], NULL, p[0], p[0], p[1], k->a, k->b, 1.0f,
                                     p[3], s);
    }
}

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Median ms of BW_REPS launches (after 3 warm-up ones), cycling through the sets. */
static double bw_time(const bw_case *k) {
    cudaEvent_t ev[2 * BW_REPS];
    for (int i = 0; i < 2 * BW_REPS; i++) DW_GC_CUDA(cudaEventCreate(&ev[i]));
    int64_t bad = 0;
    for (int r = 0; r < 3; r++) DW_GC_OK(bad, k->label, bw_launch(k, r % k->nset));
    for (int r = 0; r < BW_REPS; r++) {
        DW_GC_CUDA(cudaEventRecord(ev[2 * r], dw_gc_stream));
        DW_GC_OK(bad, k->label, bw_launch(k, r % k->nset));
        DW_GC_CUDA(cudaEventRecord(ev[2 * r + 1], dw_gc_stream));
    }
    DW_GC_SYNC();
    double ms[BW_REPS];
    for (int r = 0; r < BW_REPS; r++) {
        float f = 0.0f;
        DW_GC_CUDA(cudaEventElapsedTime(&f, ev[2 * r], ev[2 * r + 1]));
        ms[r] = f;
    }
    for (int i = 0; i < 2 * BW_REPS; i++) cudaEventDestroy(ev[i]);
    assert_int_equal(bad, 0);
    qsort(ms, BW_REPS, sizeof ms[0], cmp_double);
    return 0.5 * (ms[BW_REPS / 2 - 1] + ms[BW_REPS / 2]);
}

/* Times case k whose set 0 is the checked tensors src[0..nt) (contents copied into the other
 * sets), prints a row, frees the extra sets. */
static void bw_run(bw_case *k, dw_gt *const *src) {
    if (!g_bench) return;
    size_t set_bytes = 0;
    for (int i = 0; i < k->nt; i++) set_bytes += k->tb[i];
    k->nset = (int)((256u << 20) / (set_bytes ? set_bytes : 1)) + 1;
    if (k->nset > 8) k->nset = 8;
    for (int i = 0; i < k->nt; i++) {
        DW_GC_CUDA(cudaMalloc((void **)&k->t[i], k->tb[i] * (size_t)k->nset));
        for (int j = 0; j < k->nset; j++)
            DW_GC_CUDA(cudaMemcpy(k->t[i] + (size_t)j * k->tb[i], src[i]->dev, k->tb[i],
                                  cudaMemcpyDeviceToDevice));
    }
    DW_GC_CUDA(cudaDeviceSynchronize());
    const double ms = bw_time(k), gbs = k->bytes / (ms * 1e6);
    printf("BW %-34s %9.4f ms %8.1f GB/s %6.3f of copy (%d sets)\n", k->label, ms, gbs,
           gbs / g_copy_gbs, k->nset);
    fflush(stdout);
    for (int i = 0; i < k->nt; i++) cudaFree(k->t[i]);
}

/* The anchor: a 1 GiB device-to-device copy, median of BW_REPS. */
static void test_copy_anchor(void **state) {
    (void)state;
    if (!g_bench) {
        g_copy_gbs = 1.0;
        return;
    }
    const size_t n = (size_t)1 << 30;
    unsigned char *a, *b;
    DW_GC_CUDA(cudaMalloc((void **)&a, n));
    DW_GC_CUDA(cudaMalloc((void **)&b, n));
    DW_GC_CUDA(cudaMemset(a, 0x3C, n));
    cudaEvent_t e0, e1;
    DW_GC_CUDA(cudaEventCreate(&e0));
    DW_GC_CUDA(cudaEventCreate(&e1));
    double ms[BW_REPS];
    for (int r = -3; r < BW_REPS; r++) {
        DW_GC_CUDA(cudaEventRecord(e0, dw_gc_stream));
        DW_GC_CUDA(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, dw_gc_stream));
        DW_GC_CUDA(cudaEventRecord(e1, dw_gc_stream));
        DW_GC_SYNC();
        float f = 0.0f;
        DW_GC_CUDA(cudaEventElapsedTime(&f, e0, e1));
        if (r >= 0) ms[r] = f;
    }
    qsort(ms, BW_REPS, sizeof ms[0], cmp_double);
    const double med = 0.5 * (ms[BW_REPS / 2 - 1] + ms[BW_REPS / 2]);
    g_copy_gbs = 2.0 * (double)n / (med * 1e6);
    printf("BW %-34s %9.4f ms %8.1f GB/s  1.000 of copy\n", "copy D2D 1 GiB (anchor)", med, g_copy_gbs);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b);
}

/* ---- norms: (N, C) rows, BF16 --------------------------------------------------------------- */
static void bw_norm(int rms, int64_t N, int64_t C) {
    char name[96];
    snprintf(name, sizeof name, "%s N=%lld C=%lld", rms ? "rmsnorm" : "layernorm", (long long)N,
             (long long)C);
    const dw_act_dtype dt = DW_ACT_BF16;
    const int64_t n = N * C;
    int64_t bad = 0;
    dw_gt *x = dw_gt_rand(&g_rng, "x", n, dt, -2, 2), *g = dw_gt_rand(&g_rng, "dout", n, dt, -1, 1);
    dw_gt *out = dw_gt_out("out", n, dt), *dx = dw_gt_rand(&g_rng, "dx_prior", n, dt, -1, 1);
    dw_gt *stat = dw_gt_out("mean_rstd", 2 * N, DW_ACT_F32);
    const size_t wsb = dw_cuda_norm_bwd_ws_bytes(N, C);
    dw_gt *ws = dw_gt_new("ws", (int64_t)(wsb / 4), DW_ACT_F32);
    float *wdx = dw_oc_alloc(n);
    memcpy(wdx, dx->host, sizeof(float) * (size_t)n); /* the prior dx, as stored */
    dw_gt *wb = dw_gt_rand(&g_rng, "w_b", 2 * C, DW_ACT_F32, 0.5f, 1.5f);
    dw_gt *dwb = dw_gt_new("dw_db", 2 * C, DW_ACT_F32);
    memset(dwb->host, 0, sizeof(float) * (size_t)(2 * C));
    dw_gt_upload(dwb);
    bw_case f = {.op = rms ? BW_RMS_F : BW_LN_F, .nt = 4, .a = N, .b = C};
    f.t[0] = x->dev, f.t[1] = out->dev, f.t[2] = stat->dev, f.t[3] = wb->dev;
    f.nset = 1;
    DW_GC_OK(bad, name, bw_launch(&f, 0));
    bw_case b = {.op = rms ? BW_RMS_B : BW_LN_B, .nt = 7, .a = N, .b = C};
    for (int i = 0; i < 4; i++) b.t[i] = f.t[i];
    b.t[1] = g->dev, b.t[4] = dx->dev, b.t[5] = dwb->dev, b.t[6] = ws->dev, b.nset = 1;
    b.tb[6] = wsb;
    DW_GC_OK(bad, name, bw_launch(&b, 0));
    DW_GC_SYNC();
    float *wout = dw_oc_alloc(n), *tdxv = dw_oc_alloc(n), *wm = dw_oc_alloc(N), *wr = dw_oc_alloc(N);
    float *wdw = dw_oc_alloc(2 * C);
    memset(wdw, 0, sizeof(float) * (size_t)(2 * C));
    if (rms) {
        dw_cpu_rmsnorm_fwd(wout, wr, x->host, wb->host, N, C, 1e-5);
        dw_cpu_rmsnorm_bwd(tdxv, wdw, g->host, x->host, wb->host, wr, N, C);
    } else {
        dw_cpu_layernorm_fwd(wout, wm, wr, x->host, wb->host, wb->host + C, N, C, 1e-5);
        dw_cpu_layernorm_bwd(tdxv, wdw, wdw + C, g->host, x->host, wb->host, wm, wr, N, C);
    }
    for (int64_t i = 0; i < n; i++) wdx[i] += tdxv[i];
    dw_gc_tol tdx = DW_GC_TOL_BF16;
    for (int64_t i = 0; i < N; i++)
        if (1e-5 * 1.5 * wr[i] > tdx.abs) tdx.abs = 1e-5 * 1.5 * wr[i];
    DW_GC_CMP(bad, name, out, wout, DW_GC_TOL_BF16);
    DW_GC_CMP(bad, name, dx, wdx, tdx);
    const dw_gc_tol tparam = {1e-5, 1e-4, 0};
    DW_GC_CMP(bad, name, dwb, wdw, tparam);
    if (!dw_gc_guards_ok(name)) bad++;
    assert_int_equal(bad, 0);
    /* timing: f reads x, writes out (+ stats); b reads dout, x, dx, writes dx (+ dw, db) */
    const size_t ab = (size_t)n * 2;
    char lf[160], lb[160];
    snprintf(lf, sizeof lf, "%s fwd", name);
    snprintf(lb, sizeof lb, "%s bwd (dx +=, dw%s)", name, rms ? "" : ", db");
    f.label = lf, f.bytes = 2.0 * (double)ab;
    f.tb[0] = ab, f.tb[1] = ab, f.tb[2] = (size_t)(2 * N) * 4, f.tb[3] = (size_t)(2 * C) * 4;
    dw_gt *fs[4] = {x, out, stat, wb};
    bw_run(&f, fs);
    b.label = lb, b.bytes = 4.0 * (double)ab;
    b.tb[0] = ab, b.tb[1] = ab, b.tb[2] = f.tb[2], b.tb[3] = f.tb[3], b.tb[4] = ab;
    b.tb[5] = (size_t)(2 * C) * 4;
    dw_gt *bs[7] = {x, g, stat, wb, dx, dwb, ws};
    bw_run(&b, bs);
    dw_gc_free_all();
    free(wout), free(wdx), free(tdxv), free(wm), free(wr), free(wdw);
}

static void test_norms(void **state) {
    (void)state;
    bw_norm(1, BW_ROWS, 2048); /* Llama-3.2-1B */
    bw_norm(0, BW_ROWS, 768);  /* GPT-2 124M */
}

/* ---- rope: (B, T, H, D), BF16 --------------------------------------------------------------- */
static void bw_rope(int64_t B, int64_t T, int64_t H, int64_t D) {
    char name[96];
    snprintf(name, sizeof name, "rope B=%lld T=%lld H=%lld D=%lld", (long long)B, (long long)T,
             (long long)H, (long long)D);
    const dw_act_dtype dt = DW_ACT_BF16;
    const int64_t n = B * T * H * D;
    int64_t bad = 0;
    dw_gt *x = dw_gt_rand(&g_rng, "x", n, dt, -2, 2), *g = dw_gt_rand(&g_rng, "dout", n, dt, -1, 1);
    dw_gt *out = dw_gt_out("out", n, dt), *dx = dw_gt_out("dx", n, dt);
    bw_case f = {.op = BW_ROPE_F, .nt = 2, .nset = 1, .a = B, .b = T, .c = H, .d = D};
    f.t[0] = x->dev, f.t[1] = out->dev;
    DW_GC_OK(bad, name, bw_launch(&f, 0));
    bw_case b = f;
    b.op = BW_ROPE_B, b.t[0] = g->dev, b.t[1] = dx->dev;
    DW_GC_OK(bad, name, bw_launch(&b, 0));
    DW_GC_SYNC();
    float *wout = dw_oc_alloc(n), *wdx = dw_oc_alloc(n);
    dw_cpu_rope_fwd(wout, x->host, B, T, H, D, 500000.0, NULL);
    dw_cpu_rope_bwd(wdx, g->host, B, T, H, D, 500000.0, NULL);
    DW_GC_CMP(bad, name, out, wout, DW_GC_TOL_BF16);
    DW_GC_CMP(bad, name, dx, wdx, DW_GC_TOL_BF16);
    if (!dw_gc_guards_ok(name)) bad++;
    assert_int_equal(bad, 0);
    char lf[160], lb[160];
    snprintf(lf, sizeof lf, "%s fwd", name);
    snprintf(lb, sizeof lb, "%s bwd", name);
    f.label = lf, b.label = lb;
    f.bytes = b.bytes = 4.0 * (double)n;
    f.tb[0] = f.tb[1] = b.tb[0] = b.tb[1] = (size_t)n * 2;
    dw_gt *fs[2] = {x, out}, *bs[2] = {g, dx};
    bw_run(&f, fs);
    bw_run(&b, bs);
    dw_gc_free_all();
    free(wout), free(wdx);
}

static void test_rope(void **state) {
    (void)state;
    bw_rope(8, 2048, 32, 64); /* Llama-3.2-1B q */
    bw_rope(8, 2048, 8, 64);  /* and k */
}

/* ---- elementwise over n, BF16 ------------------------------------------------------------- */
enum { EW_SWIGLU, EW_SILU, EW_GELU, EW_ADD };
static void bw_ew(int op, int64_t n) {
    static const char *names[] = {"swiglu", "silu", "gelu", "add"};
    char name[96];
    snprintf(name, sizeof name, "%s n=%lld", names[op], (long long)n);
    const dw_act_dtype dt = DW_ACT_BF16;
    int64_t bad = 0;
    dw_gt *a = dw_gt_rand(&g_rng, "a", n, dt, -6, 6), *b = dw_gt_rand(&g_rng, "b", n, dt, -2, 2);
    dw_gt *g = dw_gt_rand(&g_rng, "dout", n, dt, -1, 1);
    dw_gt *out = dw_gt_out("out", n, dt), *da = dw_gt_out("da", n, dt), *db = dw_gt_out("db", n, dt);
    float *want = dw_oc_alloc(n), *wa = dw_oc_alloc(n), *wb = dw_oc_alloc(n);
    bw_case f = {.nset = 1, .a = n}, k = {.nset = 1, .a = n};
    const size_t ab = (size_t)n * 2;
    dw_gt *fs[3], *ks[5];
    if (op == EW_SWIGLU) {
        f.op = BW_SWIGLU_F, f.nt = 3, fs[0] = a, fs[1] = b, fs[2] = out;
        k.op = BW_SWIGLU_B, k.nt = 5, ks[0] = a, ks[1] = b, ks[2] = g, ks[3] = da, ks[4] = db;
        f.bytes = 3.0 * (double)ab, k.bytes = 5.0 * (double)ab;
        dw_cpu_swiglu_fwd(want, a->host, b->host, n);
        dw_cpu_swiglu_bwd(wa, wb, g->host, a->host, b->host, n);
    } else if (op == EW_ADD) {
        f.op = BW_ADD, f.nt = 3, fs[0] = a, fs[1] = b, fs[2] = out;
        f.bytes = 3.0 * (double)ab;
        dw_cpu_add_fwd(want, a->host, b->host, n);
    } else {
        f.op = op == EW_SILU ? BW_SILU_F : BW_GELU_F, f.nt = 2, fs[0] = a, fs[1] = out;
        k.op = op == EW_SILU ? BW_SILU_B : BW_GELU_B, k.nt = 3, ks[0] = a, ks[1] = g, ks[2] = da;
        f.bytes = 2.0 * (double)ab, k.bytes = 3.0 * (double)ab;
        if (op == EW_SILU) {
            dw_cpu_silu_fwd(want, a->host, n);
            dw_cpu_silu_bwd(wa, g->host, a->host, n);
        } else {
            dw_cpu_gelu_fwd(want, a->host, n);
            dw_cpu_gelu_bwd(wa, g->host, a->host, n);
        }
    }
    for (int i = 0; i < f.nt; i++) f.t[i] = fs[i]->dev, f.tb[i] = ab;
    DW_GC_OK(bad, name, bw_launch(&f, 0));
    if (op != EW_ADD) {
        for (int i = 0; i < k.nt; i++) k.t[i] = ks[i]->dev, k.tb[i] = ab;
        DW_GC_OK(bad, name, bw_launch(&k, 0));
    }
    DW_GC_SYNC();
    DW_GC_CMP(bad, name, out, want, DW_GC_TOL_BF16);
    if (op != EW_ADD) DW_GC_CMP(bad, name, da, wa, DW_GC_TOL_BF16);
    if (op == EW_SWIGLU) DW_GC_CMP(bad, name, db, wb, DW_GC_TOL_BF16);
    if (!dw_gc_guards_ok(name)) bad++;
    assert_int_equal(bad, 0);
    char lf[160], lb[160];
    snprintf(lf, sizeof lf, "%s fwd", name);
    snprintf(lb, sizeof lb, "%s bwd", name);
    f.label = lf, k.label = lb;
    bw_run(&f, fs);
    if (op != EW_ADD) bw_run(&k, ks);
    dw_gc_free_all();
    free(want), free(wa), free(wb);
}

static void test_elementwise(void **state) {
    (void)state;
    bw_ew(EW_SWIGLU, (int64_t)BW_ROWS * 8192); /* Llama-3.2-1B MLP */
    bw_ew(EW_SILU, (int64_t)BW_ROWS * 8192);
    bw_ew(EW_ADD, (int64_t)BW_ROWS * 2048);    /* Llama residual */
    bw_ew(EW_GELU, (int64_t)BW_ROWS * 3072);   /* GPT-2 MLP */
    bw_ew(EW_ADD, (int64_t)BW_ROWS * 768);     /* GPT-2 residual */
}

/* ---- embedding (V, C) FP32 table, cross-entropy (N, V) BF16 logits: forward outputs checked
 * (the backward passes: test_ops_cuda.c, test_ops_cuda_attn.c) ----------------------------- */
static void bw_embed_xent(int64_t N, int64_t C, int64_t V, int64_t NX) {
    char name[96];
    int64_t bad = 0;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)N);
    if (!tok) abort();
    for (int64_t i = 0; i < N; i++)
        tok[i] = (int32_t)(dw_test_uniform(&g_rng, 0, 1) * (float)V) % (int32_t)V;
    dw_gt *tk = dw_gt_ints("tok", tok, N);
    dw_gt *wte = dw_gt_rand(&g_rng, "wte", V * C, DW_ACT_F32, -1, 1);
    dw_gt *out = dw_gt_out("out", N * C, DW_ACT_BF16);
    dw_gt *g = dw_gt_rand(&g_rng, "dout", N * C, DW_ACT_BF16, -1, 1);
    dw_gt *dwte = dw_gt_rand(&g_rng, "dwte", V * C, DW_ACT_F32, -1, 1);
    snprintf(name, sizeof name, "embedding N=%lld C=%lld V=%lld", (long long)N, (long long)C,
             (long long)V);
    bw_case f = {.op = BW_EMB_F, .nt = 3, .nset = 1, .a = N, .b = C, .c = V};
    f.t[0] = tk->dev, f.t[1] = wte->dev, f.t[2] = out->dev;
    DW_GC_OK(bad, name, bw_launch(&f, 0));
    DW_GC_SYNC();
    float *want = dw_oc_alloc(N * C);
    dw_cpu_embedding_fwd(want, tok, wte->host, N, C);
    DW_GC_CMP(bad, name, out, want, DW_GC_TOL_BF16);
    assert_int_equal(bad, 0);
    char lf[160], lb[160];
    snprintf(lf, sizeof lf, "%s fwd", name);
    snprintf(lb, sizeof lb, "%s bwd", name);
    f.label = lf, f.bytes = (double)N * (double)C * 6.0; /* read FP32 rows, write BF16 */
    f.tb[0] = (size_t)N * 4, f.tb[1] = (size_t)(V * C) * 4, f.tb[2] = (size_t)(N * C) * 2;
    dw_gt *fs[3] = {tk, wte, out};
    bw_run(&f, fs);
    bw_case b = {.op = BW_EMB_B, .nt = 3, .nset = 1, .a = N, .b = C, .c = V, .label = lb};
    b.bytes = (double)N * (double)C * 10.0; /* read dout, read + write an FP32 row per token */
    b.tb[0] = f.tb[0], b.tb[1] = f.tb[1], b.tb[2] = f.tb[2];
    dw_gt *bs[3] = {tk, dwte, g};
    bw_run(&b, bs);
    dw_gc_free_all();
    free(want);
    /* cross-entropy on the first NX rows (the host copy of all N rows of logits would take
     * 8 GB), gradient written in place over the logits, as the engine does */
    snprintf(name, sizeof name, "cross-entropy N=%lld V=%lld", (long long)NX, (long long)V);
    dw_gt *lg = dw_gt_rand(&g_rng, "logits", NX * V, DW_ACT_BF16, -4, 4);
    dw_gt *tg = dw_gt_ints("targets", tok, NX);
    dw_gt *loss = dw_gt_out("loss", 1, DW_ACT_F32);
    const size_t wsb = dw_cuda_cross_entropy_ws_bytes(NX);
    dw_gt *ws = dw_gt_new("ws", (int64_t)(wsb + 3) / 4, DW_ACT_F32);
    bw_case x = {.op = BW_XENT, .nt = 4, .nset = 1, .a = NX, .b = V};
    x.t[0] = lg->dev, x.t[1] = tg->dev, x.t[2] = loss->dev, x.t[3] = ws->dev;
    const double want_loss = dw_cpu_cross_entropy_fwd(lg->host, tok, NX, V);
    DW_GC_OK(bad, name, bw_launch(&x, 0));
    DW_GC_SYNC();
    const dw_gc_tol tl = {1e-5, 1e-4, 0};
    float wlf = (float)want_loss;
    DW_GC_CMP(bad, name, loss, &wlf, tl);
    assert_int_equal(bad, 0);
    snprintf(lf, sizeof lf, "%s (loss + dlogits in place)", name);
    x.label = lf, x.bytes = 4.0 * (double)NX * (double)V;
    x.tb[0] = (size_t)(NX * V) * 2, x.tb[1] = (size_t)NX * 4, x.tb[2] = 4, x.tb[3] = wsb;
    dw_gt *xs[4] = {lg, tg, loss, ws};
    bw_run(&x, xs);
    dw_gc_free_all();
    free(tok);
}

static void test_embed_xent(void **state) {
    (void)state;
    bw_embed_xent(BW_ROWS, 2048, 128256, 2048); /* Llama-3.2-1B */
    bw_embed_xent(BW_ROWS, 768, 50304, 4096);   /* GPT-2 124M, padded vocabulary */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_anchor), cmocka_unit_test(test_norms),
        cmocka_unit_test(test_rope),        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_embed_xent),
    };
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
