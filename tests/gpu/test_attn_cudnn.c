/* test_attn_cudnn.c — causal GQA attention through cuDNN (kernels/cuda/attn_cudnn.c, forced with
 * DW_ATTN=cudnn) against the CPU reference: fresh random BF16 inputs, GPT-2 (H=12, D=64) and
 * llama-like GQA (H=8, Hkv=2, D=64 and 128) shapes with T not a multiple of 64, separate and packed
 * qkv layouts, NaN-poisoned outputs, guard bands. Needs a GPU and libcudnn.so.9 (label "gpu").
 * With DW_ATTN_BENCH="B,T,H,Hkv,D,packed,iters" it only times the ops entries on the path the
 * outer DW_ATTN picks (cuDNN, mma, ref): bench/attn_cudnn_run.sh.
 *
 * Error bound, per output element (derivation). Both sides read the same BF16 inputs; the CPU
 * works in double. cuDNN forms the scores S = scale q·k in FP32 (exact BF16 products, FP32 sums of
 * D <= 128 terms: relative error ~1e-6 of sum|q k| scale, i.e. ~1e-5 on P = exp(S - lse) for the
 * ranges here), then rounds P (forward) and dS = P (dP - delta) scale (backward) to BF16 before the
 * second GEMMs, as every flash attention does: each product term carries a relative error <= 2^-8
 * (one BF16 rounding is <= 2^-9; 2^-8 leaves room for the FP32 exp/normalisation rounding). Summed
 * over the GEMM's terms this gives, with u = 2^-8:
 *   out[t,d]: u * sum_j P[t,j] |v[j,d]|        dv[j,d]: u * sum_t P[t,j] |dout[t,d]|
 *   dq[t,d]:  u * sum_j |dS[t,j]| |k[j,d]|     dk[j,d]: u * sum_t |dS[t,j]| |q[t,d]|
 * (dk, dv with GQA: the per-query-head partials may be rounded to BF16 before the group sum,
 * another u of the same sum: 2u). dS itself is FP32 on both sides before that rounding, but
 * dP - delta cancels: its FP32 error (~2^-22 of sum_d |dout v| + sum_d |dout out|) enters dS
 * through P scale and is added as that term times the same sums. Plus one BF16 rounding of the
 * output (u |ref|) and an absolute 1e-6 of max|ref| for FP32 accumulation order. lse stays FP32:
 * 1e-5 relative and of max|lse|. The test prints the largest |err| / bound per tensor: a bound
 * that is much too loose shows as a small ratio (reported in bench/RESULTS.md). */
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
#include "kernels/cuda/attn_cudnn.h"
#include "kernels/cuda/attn_packed.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;
static double g_worst[6]; /* largest err/bound seen: out, lse, dq, dk, dv, (unused) */
static const char *g_names[6] = {"out", "lse", "dq", "dk", "dv", ""};

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xC0D11Eull);
    return dw_gc_init(state);
}

/* Per-element bounds of out, dq, dk, dv (see the header), from the inputs and the CPU lse. */
typedef struct {
    double *out, *dq, *dk, *dv;
} bounds;
static bounds make_bounds(const float *q, const float *k, const float *v, const float *dout, const float *out,
                          const float *lse, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
    const double u = 1.0 / 256.0, scale = 1.0 / sqrt((double)D), ufp = 1.0 / 4194304.0; /* 2^-22 */
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, grp = H / Hkv;
    bounds bd = {dw_oc_dalloc(nq), dw_oc_dalloc(nq), dw_oc_dalloc(nk), dw_oc_dalloc(nk)};
    memset(bd.out, 0, (size_t)nq * 8), memset(bd.dq, 0, (size_t)nq * 8);
    memset(bd.dk, 0, (size_t)nk * 8), memset(bd.dv, 0, (size_t)nk * 8);
    double *p = dw_oc_dalloc(T), *ds = dw_oc_dalloc(T), *dse = dw_oc_dalloc(T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / grp;
            for (int64_t t = 0; t < T; t++) {
                const float *qt = q + ((b * T + t) * H + h) * D, *gt = dout + ((b * T + t) * H + h) * D;
                const float *ot = out + ((b * T + t) * H + h) * D;
                double delta = 0, delta_abs = 0;
                for (int64_t d = 0; d < D; d++) delta += (double)gt[d] * ot[d], delta_abs += fabs((double)gt[d] * ot[d]);
                for (int64_t j = 0; j <= t; j++) {
                    const float *kj = k + ((b * T + j) * Hkv + g) * D, *vj = v + ((b * T + j) * Hkv + g) * D;
                    double s = 0, dp = 0, dp_abs = 0;
                    for (int64_t d = 0; d < D; d++) {
                        s += (double)qt[d] * kj[d];
                        dp += (double)gt[d] * vj[d], dp_abs += fabs((double)gt[d] * vj[d]);
                    }
                    p[j] = exp(s * scale - lse[(b * H + h) * T + t]);
                    ds[j] = fabs(p[j] * (dp - delta) * scale);
                    dse[j] = p[j] * scale * ufp * (dp_abs + delta_abs); /* cancellation in dP - delta */
                }
                double *bo = bd.out + ((b * T + t) * H + h) * D, *bq = bd.dq + ((b * T + t) * H + h) * D;
                for (int64_t j = 0; j <= t; j++) {
                    const float *kj = k + ((b * T + j) * Hkv + g) * D, *vj = v + ((b * T + j) * Hkv + g) * D;
                    double *bk = bd.dk + ((b * T + j) * Hkv + g) * D, *bv = bd.dv + ((b * T + j) * Hkv + g) * D;
                    const double gq = grp > 1 ? 2 * u : u;
                    for (int64_t d = 0; d < D; d++) {
                        bo[d] += u * p[j] * fabs((double)vj[d]);
                        bq[d] += (u * ds[j] + dse[j]) * fabs((double)kj[d]);
                        bk[d] += (gq * ds[j] + dse[j]) * fabs((double)qt[d]);
                        bv[d] += gq * p[j] * fabs((double)gt[d]);
                    }
                }
            }
        }
    free(p), free(ds), free(dse);
    return bd;
}

/* got (n values, FP32) vs want within bound[i] + u |want| + 1e-6 max|want| (bound NULL: lse's
 * relative 1e-5); NaN never passes. Tracks the worst err / bound under slot. */
static int64_t check(const char *name, const char *what, const float *got, const float *want, const double *bound,
                     int64_t n, int slot) {
    double mx = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)want[i]));
    int64_t bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double w = want[i], err = fabs((double)got[i] - w);
        const double tol = bound ? bound[i] + fabs(w) / 256.0 + 1e-6 * mx : 1e-5 * fabs(w) + 1e-5 * mx;
        if (!(err <= tol)) { /* NaN fails */
            if (bad < 5)
                fprintf(stderr, "MISMATCH %s %s[%lld]: got %.7g want %.7g (|err| %.3g > bound %.3g)\n", name, what,
                        (long long)i, (double)got[i], w, err, tol);
            bad++;
        }
        if (tol > 0 && err / tol > worst) worst = err / tol;
    }
    if (bad) fprintf(stderr, "  %s %s: %lld of %lld outside the bound\n", name, what, (long long)bad, (long long)n);
    if (worst > g_worst[slot]) g_worst[slot] = worst;
    return bad;
}

static void download(const dw_gt *t, float *dst) { dw_gt_download(t, dst); }

/* One case: forward and backward through cuDNN, separate (packed = false) or packed qkv. */
static int64_t run_case(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, bool packed, float qk) {
    char name[160];
    snprintf(name, sizeof name, "cudnn attention[B=%lld T=%lld H=%lld Hkv=%lld D=%lld %s qk=%g]", (long long)B,
             (long long)T, (long long)H, (long long)Hkv, (long long)D, packed ? "packed" : "separate", (double)qk);
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T, W = (H + 2 * Hkv) * D;
    const dw_act_dtype bf = DW_ACT_BF16;
    int64_t bad = 0;
    /* inputs: a packed (B,T,(H+2Hkv)D) row or three tensors; host copies split for the reference */
    float *q = dw_oc_alloc(nq), *k = dw_oc_alloc(nk), *v = dw_oc_alloc(nk);
    dw_gt *x = NULL, *tq = NULL, *tk = NULL, *tv = NULL;
    if (packed) {
        x = dw_gt_new("qkv", B * T * W, bf);
        for (int64_t r = 0; r < B * T; r++)
            for (int64_t c = 0; c < W; c++)
                x->host[r * W + c] = dw_test_uniform(&g_rng, c < (H + Hkv) * D ? -qk : -1, c < (H + Hkv) * D ? qk : 1);
        dw_gt_upload(x);
        for (int64_t r = 0; r < B * T; r++) {
            memcpy(q + r * H * D, x->host + r * W, (size_t)(H * D) * 4);
            memcpy(k + r * Hkv * D, x->host + r * W + H * D, (size_t)(Hkv * D) * 4);
            memcpy(v + r * Hkv * D, x->host + r * W + (H + Hkv) * D, (size_t)(Hkv * D) * 4);
        }
    } else {
        tq = dw_gt_rand(&g_rng, "q", nq, bf, -qk, qk), tk = dw_gt_rand(&g_rng, "k", nk, bf, -qk, qk);
        tv = dw_gt_rand(&g_rng, "v", nk, bf, -1, 1);
        memcpy(q, tq->host, (size_t)nq * 4), memcpy(k, tk->host, (size_t)nk * 4), memcpy(v, tv->host, (size_t)nk * 4);
    }
    dw_gt *g = dw_gt_rand(&g_rng, "dout", nq, bf, -1, 1);
    dw_gt *out = dw_gt_out("out", nq, bf), *lse = dw_gt_out("lse", nl, DW_ACT_F32);
    float *wout = dw_oc_alloc(nq), *wlse = dw_oc_alloc(nl);
    dw_cpu_attention_fwd(wout, wlse, q, k, v, B, T, H, Hkv, D);
    if (packed)
        DW_GC_OK(bad, name, dw_cuda_attention_fwd_packed(NULL, out->dev, lse->dev, x->dev, B, T, H, Hkv, D, dw_gc_stream));
    else
        DW_GC_OK(bad, name, dw_cuda_attention_fwd(NULL, bf, out->dev, lse->dev, tq->dev, tk->dev, tv->dev, B, T, H,
                                                Hkv, D, dw_gc_stream));
    /* backward reads the CPU forward's out (rounded to BF16) and lse */
    dw_gt *out_in = dw_gt_from("out_in", wout, nq, bf), *lse_in = dw_gt_from("lse_in", wlse, nl, DW_ACT_F32);
    dw_gt *delta = dw_gt_out("delta", nl, DW_ACT_F32);
    dw_gt *dx = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    if (packed) {
        dx = dw_gt_out("dqkv", B * T * W, bf);
        DW_GC_OK(bad, name, dw_cuda_attention_bwd_packed(NULL, dx->dev, g->dev, x->dev, out_in->dev, lse_in->dev,
                                                       delta->dev, B, T, H, Hkv, D, dw_gc_stream));
    } else {
        dq = dw_gt_out("dq", nq, bf), dk = dw_gt_out("dk", nk, bf), dv = dw_gt_out("dv", nk, bf);
        DW_GC_OK(bad, name, dw_cuda_attention_bwd(NULL, bf, dq->dev, dk->dev, dv->dev, g->dev, tq->dev, tk->dev,
                                                tv->dev, out_in->dev, lse_in->dev, delta->dev, B, T, H, Hkv, D,
                                                dw_gc_stream));
    }
    DW_GC_SYNC();
    float *wdq = dw_oc_alloc(nq), *wdk = dw_oc_alloc(nk), *wdv = dw_oc_alloc(nk);
    dw_cpu_attention_bwd(wdq, wdk, wdv, g->host, q, k, v, out_in->host, lse_in->host, B, T, H, Hkv, D);
    bounds bd = make_bounds(q, k, v, g->host, out_in->host, wlse, B, T, H, Hkv, D);
    float *got = dw_oc_alloc(packed ? B * T * W : nq), *a = dw_oc_alloc(nq), *c = dw_oc_alloc(nk), *e = dw_oc_alloc(nk);
    download(out, got);
    bad += check(name, "out", got, wout, bd.out, nq, 0);
    download(lse, got);
    bad += check(name, "lse", got, wlse, NULL, nl, 1);
    if (packed) {
        download(dx, got);
        for (int64_t r = 0; r < B * T; r++) {
            memcpy(a + r * H * D, got + r * W, (size_t)(H * D) * 4);
            memcpy(c + r * Hkv * D, got + r * W + H * D, (size_t)(Hkv * D) * 4);
            memcpy(e + r * Hkv * D, got + r * W + (H + Hkv) * D, (size_t)(Hkv * D) * 4);
        }
    } else {
        download(dq, a), download(dk, c), download(dv, e);
    }
    bad += check(name, "dq", a, wdq, bd.dq, nq, 2);
    bad += check(name, "dk", c, wdk, bd.dk, nk, 3);
    bad += check(name, "dv", e, wdv, bd.dv, nk, 4);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(q), free(k), free(v), free(wout), free(wlse), free(wdq), free(wdk), free(wdv);
    free(bd.out), free(bd.dq), free(bd.dk), free(bd.dv), free(got), free(a), free(c), free(e);
    return bad;
}

/* Whether the backward is deterministic (reported, not required): two runs, bit comparison. */
static void report_determinism(void **state) {
    (void)state;
    const int64_t B = 2, T = 257, H = 8, Hkv = 2, D = 64, nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
    dw_gt *q = dw_gt_rand(&g_rng, "q", nq, DW_ACT_BF16, -1.5f, 1.5f), *k = dw_gt_rand(&g_rng, "k", nk, DW_ACT_BF16, -1.5f, 1.5f);
    dw_gt *v = dw_gt_rand(&g_rng, "v", nk, DW_ACT_BF16, -1, 1), *g = dw_gt_rand(&g_rng, "dout", nq, DW_ACT_BF16, -1, 1);
    dw_gt *o = dw_gt_out("out", nq, DW_ACT_BF16), *l = dw_gt_out("lse", nl, DW_ACT_F32), *dl = dw_gt_out("delta", nl, DW_ACT_F32);
    dw_gt *d[2][3];
    for (int r = 0; r < 2; r++)
        d[r][0] = dw_gt_out("dq", nq, DW_ACT_BF16), d[r][1] = dw_gt_out("dk", nk, DW_ACT_BF16),
        d[r][2] = dw_gt_out("dv", nk, DW_ACT_BF16);
    int64_t bad = 0;
    DW_GC_OK(bad, "determinism", dw_cuda_attention_fwd(NULL, DW_ACT_BF16, o->dev, l->dev, q->dev, k->dev, v->dev, B,
                                                      T, H, Hkv, D, dw_gc_stream));
    for (int r = 0; r < 2; r++)
        DW_GC_OK(bad, "determinism", dw_cuda_attention_bwd(NULL, DW_ACT_BF16, d[r][0]->dev, d[r][1]->dev, d[r][2]->dev,
                                                          g->dev, q->dev, k->dev, v->dev, o->dev, l->dev, dl->dev, B,
                                                          T, H, Hkv, D, dw_gc_stream));
    DW_GC_SYNC();
    for (int i = 0; i < 3; i++) {
        unsigned char *h0 = malloc(d[0][i]->bytes), *h1 = malloc(d[1][i]->bytes);
        DW_GC_CUDA(cudaMemcpy(h0, d[0][i]->dev, d[0][i]->bytes, cudaMemcpyDeviceToHost));
        DW_GC_CUDA(cudaMemcpy(h1, d[1][i]->dev, d[1][i]->bytes, cudaMemcpyDeviceToHost));
        printf("cuDNN backward %s: %s across two runs\n", d[0][i]->name,
               memcmp(h0, h1, d[0][i]->bytes) ? "NOT bit-identical" : "bit-identical");
        free(h0), free(h1);
    }
    dw_gc_free_all();
    assert_int_equal(bad, 0);
}

static void test_cudnn_attention(void **state) {
    (void)state;
    printf("cuDNN version %lld\n", (long long)dw_attn_cudnn_version());
    if (!dw_attn_cudnn_version()) fprintf(stderr, "cuDNN unavailable: %s\n", dw_attn_cudnn_why());
    assert_true(dw_attn_cudnn_version() > 0);
    static const int64_t shapes[][5] = {
        /* B, T, H, Hkv, D: GPT-2 heads, llama-like GQA at D 64 and 128, T not a multiple of 64 */
        {2, 200, 12, 12, 64},
        {2, 153, 8, 2, 64},
        {1, 130, 8, 2, 128},
        {1, 77, 4, 1, 32},
    };
    int64_t bad = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int packed = 0; packed < 2; packed++) {
            if (packed && shapes[i][4] != 64 && shapes[i][4] != 128) continue; /* packed: D 64 / 128 only */
            bad += run_case(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], packed, 1.5f);
        }
    bad += run_case(1, 161, 4, 1, 64, false, 5.0f); /* peaked scores */
    for (int s = 0; s < 5; s++) printf("worst |err| / bound %s: %.3f\n", g_names[s], g_worst[s]);
    int np = 0;
    const size_t bytes = dw_attn_cudnn_device_bytes(&np);
    printf("cuDNN plans: %d, device bytes %zu\n", np, bytes);
    assert_int_equal(bad, 0);
}

/* ---- timing mode (DW_ATTN_BENCH) ------------------------------------------------------------- */
static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}
static float median_ms(cudaEvent_t *ev, int n) {
    float *ms = malloc((size_t)n * sizeof *ms);
    for (int i = 0; i < n; i++) cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]);
    qsort(ms, (size_t)n, sizeof *ms, cmp_f);
    const float m = ms[n / 2];
    free(ms);
    return m;
}
/* Host copies of up to three device tensors (the backward's outputs), after syncing s. */
static void snapshot(const dw_gt *a, const dw_gt *b, const dw_gt *c, unsigned char **dst, cudaStream_t s) {
    const dw_gt *t[3] = {a, b, c};
    DW_GC_CUDA(cudaStreamSynchronize(s));
    for (int i = 0; i < 3; i++) {
        if (!t[i]) continue;
        dst[i] = malloc(t[i]->bytes);
        DW_GC_CUDA(cudaMemcpy(dst[i], t[i]->dev, t[i]->bytes, cudaMemcpyDeviceToHost));
    }
}
static int run_bench(const char *spec) {
    long long B, T, H, Hkv, D, packed, iters;
    if (sscanf(spec, "%lld,%lld,%lld,%lld,%lld,%lld,%lld", &B, &T, &H, &Hkv, &D, &packed, &iters) != 7 || iters < 1) {
        fprintf(stderr, "DW_ATTN_BENCH=B,T,H,Hkv,D,packed,iters (got %s)\n", spec);
        return 2;
    }
    cudaStream_t s;
    DW_GC_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int64_t W = (H + 2 * Hkv) * D, nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed());
    dw_gt *x = dw_gt_rand(&r, "qkv", B * T * W, DW_ACT_BF16, -1.5f, 1.5f);
    dw_gt *q = dw_gt_rand(&r, "q", nq, DW_ACT_BF16, -1.5f, 1.5f), *k = dw_gt_rand(&r, "k", nk, DW_ACT_BF16, -1.5f, 1.5f);
    dw_gt *v = dw_gt_rand(&r, "v", nk, DW_ACT_BF16, -1, 1), *g = dw_gt_rand(&r, "dout", nq, DW_ACT_BF16, -1, 1);
    dw_gt *o = dw_gt_out("out", nq, DW_ACT_BF16), *l = dw_gt_out("lse", nl, DW_ACT_F32);
    dw_gt *dl = dw_gt_out("delta", nl, DW_ACT_F32), *dx = dw_gt_out("dqkv", B * T * W, DW_ACT_BF16);
    dw_gt *dq = dw_gt_out("dq", nq, DW_ACT_BF16), *dk = dw_gt_out("dk", nk, DW_ACT_BF16), *dv = dw_gt_out("dv", nk, DW_ACT_BF16);
    unsigned char *first[3] = {NULL, NULL, NULL};
    cudaEvent_t *ev = malloc((size_t)(4 * iters) * sizeof *ev);
    for (long long i = 0; i < 4 * iters; i++) DW_GC_CUDA(cudaEventCreate(&ev[i]));
    dw_status st = DW_OK;
    for (long long i = -3; i < iters && st == DW_OK; i++) { /* 3 warm-up rounds (plans built there) */
        if (i >= 0) cudaEventRecord(ev[2 * i], s);
        st = packed ? dw_cuda_attention_fwd_packed(NULL, o->dev, l->dev, x->dev, B, T, H, Hkv, D, s)
                    : dw_cuda_attention_fwd(NULL, DW_ACT_BF16, o->dev, l->dev, q->dev, k->dev, v->dev, B, T, H, Hkv, D, s);
        if (i >= 0) cudaEventRecord(ev[2 * i + 1], s), cudaEventRecord(ev[2 * (iters + i)], s);
        if (st == DW_OK)
            st = packed ? dw_cuda_attention_bwd_packed(NULL, dx->dev, g->dev, x->dev, o->dev, l->dev, dl->dev, B, T, H,
                                                       Hkv, D, s)
                        : dw_cuda_attention_bwd(NULL, DW_ACT_BF16, dq->dev, dk->dev, dv->dev, g->dev, q->dev, k->dev,
                                                v->dev, o->dev, l->dev, dl->dev, B, T, H, Hkv, D, s);
        if (i >= 0) cudaEventRecord(ev[2 * (iters + i) + 1], s);
        if (i == 0 && st == DW_OK) snapshot(packed ? dx : dq, packed ? NULL : dk, packed ? NULL : dv, first, s);
    }
    DW_GC_CUDA(cudaStreamSynchronize(s));
    unsigned char *last[3] = {NULL, NULL, NULL};
    if (st == DW_OK) snapshot(packed ? dx : dq, packed ? NULL : dk, packed ? NULL : dv, last, s);
    bool same = true;
    for (int i = 0; i < 3; i++) {
        const dw_gt *t = i == 0 ? (packed ? dx : dq) : i == 1 ? dk : dv;
        if (first[i] && last[i] && memcmp(first[i], last[i], t->bytes)) same = false;
        free(first[i]), free(last[i]);
    }
    if (st != DW_OK) {
        fprintf(stderr, "bench failed: %s\n", dw_errmsg(NULL));
        return 1;
    }
    const float tf = median_ms(ev, (int)iters), tb = median_ms(ev + 2 * iters, (int)iters);
    const double fl = 4.0 * B * H * (double)T * (T + 1) / 2 * D; /* causal: two GEMMs over half the scores */
    const char *path = getenv("DW_ATTN");
    int np = 0;
    const size_t bytes = dw_attn_cudnn_device_bytes(&np);
    printf("BENCH path=%s B=%lld T=%lld H=%lld Hkv=%lld D=%lld packed=%lld: fwd %.3f ms (%.0f TFLOP/s) bwd %.3f ms "
           "(%.0f TFLOP/s) cudnn_plans=%d cudnn_bytes=%zu bwd_repeat=%s\n",
           path ? path : "auto", B, T, H, Hkv, D, packed, tf, fl / tf / 1e9, tb, 2.5 * fl / tb / 1e9, np, bytes,
           same ? "bit-identical" : "DIFFERS");
    dw_gc_free_all();
    return 0;
}

int main(void) {
    const char *bench = getenv("DW_ATTN_BENCH");
    if (bench) return run_bench(bench);
    setenv("DW_ATTN", "cudnn", 1); /* before the first attention call reads it */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cudnn_attention),
        cmocka_unit_test(report_determinism),
    };
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
