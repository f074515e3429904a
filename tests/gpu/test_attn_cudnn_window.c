/* test_attn_cudnn_window.c — sliding-window and soft-capped attention through cuDNN (issue 26:
 * attn_cudnn.c's band mask and tanh score cap, reached through dw_cuda_attention_window_*) and
 * through the mma kernels, each against the CPU reference (dw_cpu_attention_softcap_*, double):
 * fresh random BF16 inputs, a window shorter than T, windows of T and more (cuDNN's plain causal
 * plan), GQA, B > 1, forward and backward (the backward reads the CPU forward's out and lse, so each
 * direction is checked alone), NaN-poisoned outputs, guard bands. dw_attn_cudnn_calls says which
 * path ran: windowed cases must run on cuDNN (DW_ATTN=cudnn, a decline is an error); capped cases
 * run on cuDNN where the loaded version fuses the cap (runtime-compiled engines), else on the mma
 * kernels, and the test prints which. Needs a GPU and libcudnn.so.9 (label "gpu").
 *
 * Error bound per element: test_attn_cudnn.c's derivation (u = 2^-8 for each BF16-rounded P or dS
 * term of the second GEMMs, 2u for GQA's per-head dK/dV partials, 2^-22 for the FP32 cancellation
 * in dP - delta, plus u |ref| and 1e-6 max|ref|), summed over the keys inside the window only, dS
 * carrying the cap's derivative 1 - th^2 (th = s / cap). lse: 1e-5 relative and of max|lse|. A cap
 * adds the error of a fast hardware tanh (relative 2^-11, taken as 2^-10): each capped score s is
 * off by e = |s| 2^-10, so P by p e (the backward reads the exact lse), the forward's normalised P
 * by 2 p E (E the row's largest e) and lse by E; 1 - th^2 by 2 th^2 2^-10 in absolute terms.
 *
 * Timing mode: DW_ATTN_WINDOW_BENCH="B,T,H,Hkv,D,iters[,W...]" (windows default 1024,4096) times the
 * windowed forward and backward on the mma kernels and on cuDNN, one line per window and path, with
 * the path that really ran (scripts/gpu-verify.sh attnwin). */
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

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x5EEDB0Dull);
    return dw_gc_init(state);
}

/* One case: shape, window W (0: none), cap (0: none), input range qk of q and k. */
typedef struct {
    int64_t B, T, H, Hkv, D, W;
    double cap;
    float qk;
} wcase;

/* Host inputs and the CPU reference of a case (FP32 arrays of the BF16 values the GPU reads). */
typedef struct {
    float *q, *k, *v, *g;        /* q, g (B,T,H,D); k, v (B,T,Hkv,D) */
    float *out, *lse;            /* reference forward: out (B,T,H,D) rounded to BF16, lse (B,H,T) */
    float *dq, *dk, *dv;         /* reference backward from that out and lse */
    double *bout, *bdq, *bdk, *bdv; /* per-element bounds */
    double *blse;                   /* lse: the cap's part of its bound (0 without a cap) */
} wref;

static float bf16_round(float x) { return dw_gc_bf2f(dw_gc_f2bf(x)); }

/* Bounds (header) for out, dq, dk, dv, from the inputs and the reference lse, in one pass over the
 * keys each query sees: max(0, t-W+1)..t. */
static void make_bounds(const wcase *c, wref *r) {
    const int64_t B = c->B, T = c->T, H = c->H, G = c->Hkv, D = c->D, grp = H / G;
    const double u = 1.0 / 256.0, ufp = 1.0 / 4194304.0, scale = 1.0 / sqrt((double)D);
    const double ukv = grp > 1 ? 2 * u : u;
    const int64_t nq = B * T * H * D, nk = B * T * G * D;
    r->bout = dw_oc_dalloc(nq), r->bdq = dw_oc_dalloc(nq), r->bdk = dw_oc_dalloc(nk), r->bdv = dw_oc_dalloc(nk);
    r->blse = dw_oc_dalloc(B * H * T);
    memset(r->bout, 0, (size_t)nq * sizeof(double)), memset(r->bdq, 0, (size_t)nq * sizeof(double));
    memset(r->bdk, 0, (size_t)nk * sizeof(double)), memset(r->bdv, 0, (size_t)nk * sizeof(double));
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, h = bh % H, kvh = h / grp;
        for (int64_t t = 0; t < T; t++) {
            const int64_t row = (b * T + t) * H + h;
            const float *qt = r->q + row * D, *gt = r->g + row * D, *ot = r->out + row * D;
            double delta = 0, delta_abs = 0;
            for (int64_t d = 0; d < D; d++) delta += (double)gt[d] * ot[d], delta_abs += fabs((double)gt[d] * ot[d]);
            const int64_t first = c->W > 0 && t - c->W + 1 > 0 ? t - c->W + 1 : 0;
            double E = 0; /* the row's largest score error under a fast tanh */
            for (int64_t j = first; j <= t; j++) {
                const int64_t kr = (b * T + j) * G + kvh;
                const float *kj = r->k + kr * D, *vj = r->v + kr * D;
                double z = 0, dpv = 0, dpa = 0;
                for (int64_t d = 0; d < D; d++) {
                    z += (double)qt[d] * kj[d];
                    dpv += (double)gt[d] * vj[d], dpa += fabs((double)gt[d] * vj[d]);
                }
                double s = z * scale, th = 0, dcap = 1.0, e = 0;
                if (c->cap > 0) th = tanh(s / c->cap), s = c->cap * th, dcap = 1.0 - th * th, e = fabs(s) / 1024.0;
                E = fmax(E, e);
                const double p = exp(s - r->lse[bh * T + t]), dsc = fabs(p * (dpv - delta) * scale);
                /* dS's error: rounding and P's (u + e), the cap derivative's, FP32 cancellation */
                const double dse = dsc * (dcap * e + 2 * th * th / 1024.0) + p * scale * dcap * ufp * (dpa + delta_abs);
                for (int64_t d = 0; d < D; d++) {
                    r->bout[row * D + d] += p * fabs((double)vj[d]); /* times (u + 2E) below */
                    r->bdq[row * D + d] += (u * dsc * dcap + dse) * fabs((double)kj[d]);
                    r->bdk[kr * D + d] += (ukv * dsc * dcap + dse) * fabs((double)qt[d]);
                    r->bdv[kr * D + d] += (ukv + e) * p * fabs((double)gt[d]);
                }
            }
            for (int64_t d = 0; d < D; d++) r->bout[row * D + d] *= u + 2 * E;
            r->blse[bh * T + t] = E;
        }
    }
}

/* Fresh inputs (BF16 values) and the reference of case c. */
static wref make_ref(const wcase *c) {
    const int64_t nq = c->B * c->T * c->H * c->D, nk = c->B * c->T * c->Hkv * c->D, nl = c->B * c->H * c->T;
    wref r = {dw_oc_alloc(nq), dw_oc_alloc(nk), dw_oc_alloc(nk), dw_oc_alloc(nq), dw_oc_alloc(nq), dw_oc_alloc(nl),
              dw_oc_alloc(nq), dw_oc_alloc(nk), dw_oc_alloc(nk), NULL, NULL, NULL, NULL, NULL};
    for (int64_t i = 0; i < nq; i++) r.q[i] = bf16_round(dw_test_uniform(&g_rng, -c->qk, c->qk));
    for (int64_t i = 0; i < nk; i++) r.k[i] = bf16_round(dw_test_uniform(&g_rng, -c->qk, c->qk));
    for (int64_t i = 0; i < nk; i++) r.v[i] = bf16_round(dw_test_uniform(&g_rng, -1, 1));
    for (int64_t i = 0; i < nq; i++) r.g[i] = bf16_round(dw_test_uniform(&g_rng, -1, 1));
    dw_cpu_attention_softcap_fwd(r.out, r.lse, r.q, r.k, r.v, c->B, c->T, c->H, c->Hkv, c->D, c->W, c->cap);
    for (int64_t i = 0; i < nq; i++) r.out[i] = bf16_round(r.out[i]); /* what the backward reads */
    dw_cpu_attention_softcap_bwd(r.dq, r.dk, r.dv, r.g, r.q, r.k, r.v, r.out, r.lse, c->B, c->T, c->H, c->Hkv, c->D,
                                 c->W, c->cap);
    make_bounds(c, &r);
    return r;
}
static void free_ref(wref *r) {
    free(r->q), free(r->k), free(r->v), free(r->g), free(r->out), free(r->lse), free(r->dq), free(r->dk), free(r->dv);
    free(r->bout), free(r->bdq), free(r->bdk), free(r->bdv), free(r->blse);
}

/* Device tensor t against want within bound[i] + u |want| + 1e-6 max|want|, or for the lse
 * (is_lse) 1e-5 |want| + 1e-5 max|want| + bound[i]; NaN never passes. *worst: the largest
 * err / tolerance. */
static int64_t within(const char *name, const dw_gt *t, const float *want, const double *bound, bool is_lse,
                      double *worst) {
    float *got = dw_oc_alloc(t->n);
    dw_gt_download(t, got);
    double mx = 0;
    for (int64_t i = 0; i < t->n; i++) mx = fmax(mx, fabs((double)want[i]));
    int64_t bad = 0;
    for (int64_t i = 0; i < t->n; i++) {
        const double w = want[i], err = fabs((double)got[i] - w);
        const double tol = is_lse ? 1e-5 * (fabs(w) + mx) + bound[i] : bound[i] + fabs(w) / 256.0 + 1e-6 * mx;
        if (tol > 0 && err / tol > *worst) *worst = err / tol;
        if (err <= tol) continue; /* NaN falls through */
        if (bad++ < 5)
            fprintf(stderr, "MISMATCH %s %s[%lld]: got %.7g want %.7g (|err| %.3g > %.3g)\n", name, t->name,
                    (long long)i, (double)got[i], w, err, tol);
    }
    if (bad) fprintf(stderr, "  %s %s: %lld of %lld outside the bound\n", name, t->name, (long long)bad, (long long)t->n);
    free(got);
    return bad;
}

/* cuDNN executes so far of the kind case c runs as: a window of T or more is the plain causal plan. */
static int64_t cudnn_calls(const wcase *c, bool bwd) {
    const bool masked = (c->W > 0 && c->W < c->T) || c->cap > 0;
    return dw_attn_cudnn_calls(bwd, masked);
}

/* Forward and backward of case c on DW_ATTN path `path` ("cudnn", "auto", "mma") against r.
 * *on_cudnn: both directions ran on cuDNN. Returns the failures; worst[5]: out, lse, dq, dk, dv. */
static int64_t run_path(const wcase *c, const wref *r, const char *path, bool *on_cudnn, double *worst) {
    char name[200];
    snprintf(name, sizeof name, "window attention[%s B=%lld T=%lld H=%lld Hkv=%lld D=%lld W=%lld cap=%g qk=%g]", path,
             (long long)c->B, (long long)c->T, (long long)c->H, (long long)c->Hkv, (long long)c->D, (long long)c->W,
             c->cap, (double)c->qk);
    const int64_t nq = c->B * c->T * c->H * c->D, nk = c->B * c->T * c->Hkv * c->D, nl = c->B * c->H * c->T;
    const dw_act_dtype bf = DW_ACT_BF16;
    dw_cuda_attention_use(path);
    dw_gt *q = dw_gt_from("q", r->q, nq, bf), *k = dw_gt_from("k", r->k, nk, bf), *v = dw_gt_from("v", r->v, nk, bf);
    dw_gt *g = dw_gt_from("dout", r->g, nq, bf), *oin = dw_gt_from("out_in", r->out, nq, bf);
    dw_gt *lin = dw_gt_from("lse_in", r->lse, nl, DW_ACT_F32);
    dw_gt *out = dw_gt_out("out", nq, bf), *lse = dw_gt_out("lse", nl, DW_ACT_F32), *dl = dw_gt_out("delta", nl, DW_ACT_F32);
    dw_gt *dq = dw_gt_out("dq", nq, bf), *dk = dw_gt_out("dk", nk, bf), *dv = dw_gt_out("dv", nk, bf);
    const int64_t f0 = cudnn_calls(c, false), b0 = cudnn_calls(c, true);
    int64_t bad = 0;
    DW_GC_OK(bad, name, dw_cuda_attention_window_fwd(NULL, bf, out->dev, lse->dev, q->dev, k->dev, v->dev, c->B, c->T,
                                                     c->H, c->Hkv, c->D, c->W, c->cap, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_attention_window_bwd(NULL, bf, dq->dev, dk->dev, dv->dev, g->dev, q->dev, k->dev,
                                                     v->dev, oin->dev, lin->dev, dl->dev, c->B, c->T, c->H, c->Hkv,
                                                     c->D, c->W, c->cap, dw_gc_stream));
    DW_GC_SYNC();
    *on_cudnn = cudnn_calls(c, false) == f0 + 1 && cudnn_calls(c, true) == b0 + 1;
    bad += within(name, out, r->out, r->bout, false, &worst[0]);
    bad += within(name, lse, r->lse, r->blse, true, &worst[1]);
    bad += within(name, dq, r->dq, r->bdq, false, &worst[2]);
    bad += within(name, dk, r->dk, r->bdk, false, &worst[3]);
    bad += within(name, dv, r->dv, r->bdv, false, &worst[4]);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    dw_cuda_attention_use(NULL);
    return bad;
}

static void test_cudnn_window(void **state) {
    (void)state;
    printf("cuDNN version %lld\n", (long long)dw_attn_cudnn_version());
    if (!dw_attn_cudnn_version()) fprintf(stderr, "cuDNN unavailable: %s\n", dw_attn_cudnn_why());
    assert_true(dw_attn_cudnn_version() > 0);
    static const wcase cases[] = {
        /* B, T, H, Hkv, D, W, cap, qk */
        {2, 200, 8, 2, 64, 64, 0, 1.5f},    /* window < T, GQA, B > 1, T not a multiple of 64 */
        {1, 130, 4, 4, 128, 3, 0, 1.5f},    /* a narrow window at D 128, no GQA */
        {2, 161, 8, 2, 64, 40, 0, 5.0f},    /* peaked scores */
        {2, 160, 8, 2, 64, 160, 0, 1.5f},   /* window = T: the causal plan */
        {1, 150, 4, 1, 64, 4096, 0, 1.5f},  /* window > T */
        {1, 150, 4, 2, 64, 0, 20.0, 5.0f},  /* capped scores (scores of tens: tanh bites) */
        {2, 140, 4, 2, 64, 48, 30.0, 5.0f}, /* Gemma 2's local layers: window and cap */
    };
    double worst[2][5] = {{0}};
    int64_t bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const wcase *c = &cases[i];
        wref r = make_ref(c);
        bool cudnn = false, mma_cudnn = false;
        /* windows must take cuDNN (DW_ATTN=cudnn: a decline fails the call); a cap may be declined */
        const char *path = c->cap > 0 ? "auto" : "cudnn";
        bad += run_path(c, &r, path, &cudnn, worst[0]);
        printf("B=%lld T=%lld H=%lld Hkv=%lld D=%lld W=%lld cap=%g: DW_ATTN=%s ran on %s\n", (long long)c->B,
               (long long)c->T, (long long)c->H, (long long)c->Hkv, (long long)c->D, (long long)c->W, c->cap, path,
               cudnn ? "cuDNN" : "the mma kernels");
        if (!cudnn) {
            printf("  cuDNN declined: %s\n", dw_attn_cudnn_why());
            if (c->cap == 0) {
                fprintf(stderr, "FAIL: the windowed case did not run on cuDNN\n");
                bad++;
            }
        }
        bad += run_path(c, &r, "mma", &mma_cudnn, worst[1]);
        if (mma_cudnn) {
            fprintf(stderr, "FAIL: DW_ATTN=mma ran cuDNN\n");
            bad++;
        }
        free_ref(&r);
    }
    static const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int p = 0; p < 2; p++)
        for (int s = 0; s < 5; s++)
            printf("worst |err| / bound %s %s: %.3f\n", p ? "mma" : "cuDNN", names[s], worst[p][s]);
    int np = 0;
    const size_t bytes = dw_attn_cudnn_device_bytes(&np);
    printf("cuDNN plans: %d, device bytes %zu\n", np, bytes);
    assert_int_equal(bad, 0);
}

/* ---- timing mode (DW_ATTN_WINDOW_BENCH) ------------------------------------------------------ */
static int by_value(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Times `iters` rounds of forward then backward on the current path; *fwd_ms, *bwd_ms the medians.
 * Three untimed rounds first (plans are built there). DW_OK or the first failure. */
typedef struct {
    int64_t B, T, H, Hkv, D, W;
    dw_gt *q, *k, *v, *g, *out, *lse, *delta, *dq, *dk, *dv;
} wbench;
static dw_status time_rounds(const wbench *w, int iters, cudaStream_t s, float *fwd_ms, float *bwd_ms) {
    cudaEvent_t ev[3];
    for (int i = 0; i < 3; i++) DW_GC_CUDA(cudaEventCreate(&ev[i]));
    float *tf = malloc((size_t)iters * sizeof *tf), *tb = malloc((size_t)iters * sizeof *tb);
    dw_status st = DW_OK;
    for (int i = -3; i < iters && st == DW_OK; i++) {
        cudaEventRecord(ev[0], s);
        st = dw_cuda_attention_window_fwd(NULL, DW_ACT_BF16, w->out->dev, w->lse->dev, w->q->dev, w->k->dev, w->v->dev,
                                          w->B, w->T, w->H, w->Hkv, w->D, w->W, 0.0, s);
        cudaEventRecord(ev[1], s);
        if (st == DW_OK)
            st = dw_cuda_attention_window_bwd(NULL, DW_ACT_BF16, w->dq->dev, w->dk->dev, w->dv->dev, w->g->dev, w->q->dev,
                                              w->k->dev, w->v->dev, w->out->dev, w->lse->dev, w->delta->dev, w->B, w->T,
                                              w->H, w->Hkv, w->D, w->W, 0.0, s);
        cudaEventRecord(ev[2], s);
        DW_GC_CUDA(cudaEventSynchronize(ev[2]));
        if (i >= 0) cudaEventElapsedTime(&tf[i], ev[0], ev[1]), cudaEventElapsedTime(&tb[i], ev[1], ev[2]);
    }
    if (st == DW_OK) {
        qsort(tf, (size_t)iters, sizeof *tf, by_value), qsort(tb, (size_t)iters, sizeof *tb, by_value);
        *fwd_ms = tf[iters / 2], *bwd_ms = tb[iters / 2];
    }
    for (int i = 0; i < 3; i++) cudaEventDestroy(ev[i]);
    free(tf), free(tb);
    return st;
}

static int run_bench(const char *spec) {
    long long B, T, H, Hkv, D, iters;
    int used = 0;
    if (sscanf(spec, "%lld,%lld,%lld,%lld,%lld,%lld%n", &B, &T, &H, &Hkv, &D, &iters, &used) != 6 || iters < 1 ||
        B < 1 || T < 1 || H < 1 || Hkv < 1 || H % Hkv || D < 1) {
        fprintf(stderr, "DW_ATTN_WINDOW_BENCH=B,T,H,Hkv,D,iters[,W...] (got '%s')\n", spec);
        return 2;
    }
    long long windows[8] = {1024, 4096};
    int nw = 2;
    if (spec[used] == ',') {
        nw = 0;
        for (const char *p = spec + used; *p == ',' && nw < 8;) {
            char *end;
            windows[nw] = strtoll(p + 1, &end, 10);
            if (end == p + 1 || windows[nw] < 0) {
                fprintf(stderr, "DW_ATTN_WINDOW_BENCH: bad window list in '%s'\n", spec);
                return 2;
            }
            nw++, p = end;
        }
    }
    cudaStream_t s;
    DW_GC_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed());
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
    const dw_act_dtype bf = DW_ACT_BF16;
    wbench w = {B, T, H, Hkv, D, 0, dw_gt_rand(&r, "q", nq, bf, -1.5f, 1.5f), dw_gt_rand(&r, "k", nk, bf, -1.5f, 1.5f),
                dw_gt_rand(&r, "v", nk, bf, -1, 1), dw_gt_rand(&r, "dout", nq, bf, -1, 1), dw_gt_out("out", nq, bf),
                dw_gt_out("lse", nl, DW_ACT_F32), dw_gt_out("delta", nl, DW_ACT_F32), dw_gt_out("dq", nq, bf),
                dw_gt_out("dk", nk, bf), dw_gt_out("dv", nk, bf)};
    static const char *paths[] = {"mma", "cudnn"};
    int rc = 0;
    for (int i = 0; i < nw; i++) {
        w.W = windows[i];
        double keys = 0; /* (query, key) pairs under the window: FLOPs = 4 B H D keys (fwd), 2.5x that (bwd) */
        for (int64_t t = 0; t < T; t++) keys += (double)(w.W > 0 && w.W < t + 1 ? w.W : t + 1);
        const double fl = 4.0 * B * H * D * keys;
        for (int p = 0; p < 2; p++) {
            dw_cuda_attention_use(paths[p]);
            const int64_t c0 = dw_attn_cudnn_calls(true, true) + dw_attn_cudnn_calls(true, false);
            float tf = 0, tb = 0;
            const dw_status st = time_rounds(&w, (int)iters, s, &tf, &tb);
            const bool cudnn = dw_attn_cudnn_calls(true, true) + dw_attn_cudnn_calls(true, false) > c0;
            if (st != DW_OK) {
                printf("BENCH window=%lld path=%s: failed: %s\n", windows[i], paths[p], dw_errmsg(NULL));
                rc = 1;
                continue;
            }
            printf("BENCH window=%lld path=%s ran=%s B=%lld T=%lld H=%lld Hkv=%lld D=%lld: fwd %.3f ms (%.0f TFLOP/s) "
                   "bwd %.3f ms (%.0f TFLOP/s) fwd+bwd %.3f ms\n",
                   windows[i], paths[p], cudnn ? "cudnn" : "mma", B, T, H, Hkv, D, tf, fl / tf / 1e9, tb,
                   2.5 * fl / tb / 1e9, tf + tb);
        }
    }
    dw_cuda_attention_use(NULL);
    dw_gc_free_all();
    cudaStreamDestroy(s);
    return rc;
}

int main(void) {
    const char *bench = getenv("DW_ATTN_WINDOW_BENCH");
    if (bench) return run_bench(bench);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cudnn_window),
    };
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
