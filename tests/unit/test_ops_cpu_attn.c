/* test_ops_cpu_attn.c — CPU reference attention (causal, GQA) and cross-entropy: forward against
 * an explicit T x T softmax matrix / log-softmax written here in double, backward against double
 * central differences of those formulas, and properties: causality, GQA with duplicated KV heads
 * equals MHA, ignore_index. Tolerances as in test_ops_cpu.c (FP32 rounding of double results:
 * forward 2 ulp; gradients rtol 1e-5 + 1e-6 * max|grad|, ~50x over the FP32-rounding and FD
 * truncation budget, since backward reads the FP32-saved out and lse). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops_cpu.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xA77E17ull);
    return 0;
}

/* ---- attention ------------------------------------------------------------------------------ */
typedef struct {
    int64_t B, T, H, Hkv, D;
    double *q, *k, *v, *g, *y, *lse;
} att_st;

/* Explicit: S = Q K^T / sqrt(D) with S[t,j] = -inf for j > t, P = softmax_rows(S), Y = P V, for
 * each (b, h) with the KV head h / (H/Hkv). */
static void att_naive(att_st *s) {
    const int64_t B = s->B, T = s->T, H = s->H, Hkv = s->Hkv, D = s->D;
    double *S = dw_oc_dalloc(T * T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t kh = h / (H / Hkv);
            for (int64_t t = 0; t < T; t++)
                for (int64_t j = 0; j < T; j++) {
                    double dot = 0.0;
                    for (int64_t d = 0; d < D; d++)
                        dot += s->q[((b * T + t) * H + h) * D + d] * s->k[((b * T + j) * Hkv + kh) * D + d];
                    S[t * T + j] = j > t ? -INFINITY : dot / sqrt((double)D);
                }
            for (int64_t t = 0; t < T; t++) {
                double mx = -INFINITY, z = 0.0;
                for (int64_t j = 0; j < T; j++) mx = fmax(mx, S[t * T + j]);
                for (int64_t j = 0; j < T; j++) z += exp(S[t * T + j] - mx);
                s->lse[(b * H + h) * T + t] = mx + log(z);
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < T; j++)
                        acc += exp(S[t * T + j] - mx) / z * s->v[((b * T + j) * Hkv + kh) * D + d];
                    s->y[((b * T + t) * H + h) * D + d] = acc;
                }
            }
        }
    free(S);
}
static double att_obj(void *p) {
    att_st *s = p;
    att_naive(s);
    double L = 0.0;
    for (int64_t i = 0; i < s->B * s->T * s->H * s->D; i++) L += s->g[i] * s->y[i];
    return L;
}

static void run_attention(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
    float *q = dw_oc_alloc(nq), *k = dw_oc_alloc(nk), *v = dw_oc_alloc(nk), *g = dw_oc_alloc(nq);
    float *out = dw_oc_alloc(nq), *lse = dw_oc_alloc(nl);
    float *dq = dw_oc_alloc(nq), *dk = dw_oc_alloc(nk), *dv = dw_oc_alloc(nk);
    dw_oc_fill(&g_rng, q, nq, -1.5f, 1.5f);
    dw_oc_fill(&g_rng, k, nk, -1.5f, 1.5f);
    dw_oc_fill(&g_rng, v, nk, -1, 1);
    dw_oc_fill(&g_rng, g, nq, -1, 1);
    for (int64_t i = 0; i < nq; i++) out[i] = dq[i] = NAN;
    for (int64_t i = 0; i < nk; i++) dk[i] = dv[i] = NAN;
    for (int64_t i = 0; i < nl; i++) lse[i] = NAN;
    att_st s = {B, T, H, Hkv, D, dw_oc_to_double(q, nq), dw_oc_to_double(k, nk),
                dw_oc_to_double(v, nk), dw_oc_to_double(g, nq), dw_oc_dalloc(nq), dw_oc_dalloc(nl)};
    att_naive(&s);
    dw_cpu_attention_fwd(out, lse, q, k, v, B, T, H, Hkv, D);
    assert_int_equal(dw_oc_fwd_check("attention", "out", out, s.y, nq), 0);
    assert_int_equal(dw_oc_fwd_check("attention", "lse", lse, s.lse, nl), 0);
    dw_cpu_attention_bwd(dq, dk, dv, g, q, k, v, out, lse, B, T, H, Hkv, D);
    double *fd = dw_oc_dalloc(nq);
    dw_oc_fd(att_obj, &s, s.q, nq, DW_OC_FD_H, fd);
    assert_int_equal(dw_oc_grad_check("attention", "dq", dq, fd, NULL, nq), 0);
    dw_oc_fd(att_obj, &s, s.k, nk, DW_OC_FD_H, fd);
    assert_int_equal(dw_oc_grad_check("attention", "dk", dk, fd, NULL, nk), 0);
    dw_oc_fd(att_obj, &s, s.v, nk, DW_OC_FD_H, fd);
    assert_int_equal(dw_oc_grad_check("attention", "dv", dv, fd, NULL, nk), 0);
    free(s.q), free(s.k), free(s.v), free(s.g), free(s.y), free(s.lse), free(fd);
    free(q), free(k), free(v), free(g), free(out), free(lse), free(dq), free(dk), free(dv);
}
static void test_attention_gqa(void **state) { (void)state; run_attention(2, 5, 4, 2, 6); }
static void test_attention_mha(void **state) { (void)state; run_attention(1, 7, 3, 3, 5); }
static void test_attention_mqa(void **state) { (void)state; run_attention(2, 6, 4, 1, 3); }

/* Causality: changing q, k, v at positions > t0 leaves out and lse at positions <= t0 bit-equal;
 * in backward, with dout zero at positions > t0, no gradient reaches k, v at positions > t0
 * (exact zeros: every contribution there is p * 0 or ds = p * (0 - 0)). */
static void test_attention_causal(void **state) {
    (void)state;
    const int64_t B = 2, T = 7, H = 4, Hkv = 2, D = 6, t0 = 3;
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
    float *q = dw_oc_alloc(nq), *k = dw_oc_alloc(nk), *v = dw_oc_alloc(nk);
    float *o1 = dw_oc_alloc(nq), *o2 = dw_oc_alloc(nq), *l1 = dw_oc_alloc(nl), *l2 = dw_oc_alloc(nl);
    dw_oc_fill(&g_rng, q, nq, -1, 1);
    dw_oc_fill(&g_rng, k, nk, -1, 1);
    dw_oc_fill(&g_rng, v, nk, -1, 1);
    dw_cpu_attention_fwd(o1, l1, q, k, v, B, T, H, Hkv, D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = t0 + 1; t < T; t++) {
            dw_oc_fill(&g_rng, q + (b * T + t) * H * D, H * D, -3, 3);
            dw_oc_fill(&g_rng, k + (b * T + t) * Hkv * D, Hkv * D, -3, 3);
            dw_oc_fill(&g_rng, v + (b * T + t) * Hkv * D, Hkv * D, -3, 3);
        }
    dw_cpu_attention_fwd(o2, l2, q, k, v, B, T, H, Hkv, D);
    for (int64_t b = 0; b < B; b++) {
        assert_memory_equal(o1 + b * T * H * D, o2 + b * T * H * D, (size_t)((t0 + 1) * H * D) * 4);
        for (int64_t h = 0; h < H; h++)
            assert_memory_equal(l1 + (b * H + h) * T, l2 + (b * H + h) * T, (size_t)(t0 + 1) * 4);
    }
    /* backward: with dout = 0 after t0, nothing flows into k, v after t0 */
    float *g = dw_oc_alloc(nq), *dq = dw_oc_alloc(nq), *dk = dw_oc_alloc(nk), *dv = dw_oc_alloc(nk);
    dw_oc_fill(&g_rng, g, nq, -1, 1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = (t0 + 1) * H * D; i < T * H * D; i++) g[b * T * H * D + i] = 0.0f;
    dw_cpu_attention_bwd(dq, dk, dv, g, q, k, v, o2, l2, B, T, H, Hkv, D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = (t0 + 1) * Hkv * D; i < T * Hkv * D; i++) {
            assert_true(dk[b * T * Hkv * D + i] == 0.0f);
            assert_true(dv[b * T * Hkv * D + i] == 0.0f);
        }
    free(q), free(k), free(v), free(o1), free(o2), free(l1), free(l2);
    free(g), free(dq), free(dk), free(dv);
}

/* GQA equals MHA on KV heads duplicated per group: out, lse, dq bit-equal (the same sums in the
 * same order); dk, dv of a KV head equal the sum of the duplicated heads' gradients (one extra
 * FP32 rounding per head added: rtol 4.8e-7). */
static void test_attention_gqa_equals_mha(void **state) {
    (void)state;
    const int64_t B = 2, T = 5, H = 4, Hkv = 2, D = 6, G = H / Hkv;
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
    float *q = dw_oc_alloc(nq), *k = dw_oc_alloc(nk), *v = dw_oc_alloc(nk), *g = dw_oc_alloc(nq);
    float *kx = dw_oc_alloc(nq), *vx = dw_oc_alloc(nq);
    dw_oc_fill(&g_rng, q, nq, -1, 1);
    dw_oc_fill(&g_rng, k, nk, -1, 1);
    dw_oc_fill(&g_rng, v, nk, -1, 1);
    dw_oc_fill(&g_rng, g, nq, -1, 1);
    for (int64_t bt = 0; bt < B * T; bt++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = 0; d < D; d++) {
                kx[(bt * H + h) * D + d] = k[(bt * Hkv + h / G) * D + d];
                vx[(bt * H + h) * D + d] = v[(bt * Hkv + h / G) * D + d];
            }
    float *o1 = dw_oc_alloc(nq), *o2 = dw_oc_alloc(nq), *l1 = dw_oc_alloc(nl), *l2 = dw_oc_alloc(nl);
    float *dq1 = dw_oc_alloc(nq), *dq2 = dw_oc_alloc(nq), *dk1 = dw_oc_alloc(nk), *dv1 = dw_oc_alloc(nk);
    float *dk2 = dw_oc_alloc(nq), *dv2 = dw_oc_alloc(nq);
    dw_cpu_attention_fwd(o1, l1, q, k, v, B, T, H, Hkv, D);
    dw_cpu_attention_fwd(o2, l2, q, kx, vx, B, T, H, H, D);
    assert_int_equal(dw_oc_bitequal("attention gqa-vs-mha", "out", o1, o2, nq), 0);
    assert_int_equal(dw_oc_bitequal("attention gqa-vs-mha", "lse", l1, l2, nl), 0);
    dw_cpu_attention_bwd(dq1, dk1, dv1, g, q, k, v, o1, l1, B, T, H, Hkv, D);
    dw_cpu_attention_bwd(dq2, dk2, dv2, g, q, kx, vx, o2, l2, B, T, H, H, D);
    assert_int_equal(dw_oc_bitequal("attention gqa-vs-mha", "dq", dq1, dq2, nq), 0);
    double *wk = dw_oc_dalloc(nk), *wv = dw_oc_dalloc(nk);
    for (int64_t bt = 0; bt < B * T; bt++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = 0; d < D; d++) {
                wk[(bt * Hkv + h / G) * D + d] += dk2[(bt * H + h) * D + d];
                wv[(bt * Hkv + h / G) * D + d] += dv2[(bt * H + h) * D + d];
            }
    assert_int_equal(dw_oc_compare("attention gqa-vs-mha", "dk", dk1, wk, nk,
                                   1e-7 * dw_oc_maxabs(wk, nk), 4.8e-7), 0);
    assert_int_equal(dw_oc_compare("attention gqa-vs-mha", "dv", dv1, wv, nk,
                                   1e-7 * dw_oc_maxabs(wv, nk), 4.8e-7), 0);
    free(q), free(k), free(v), free(g), free(kx), free(vx), free(o1), free(o2), free(l1), free(l2);
    free(dq1), free(dq2), free(dk1), free(dv1), free(dk2), free(dv2), free(wk), free(wv);
}

/* ---- cross-entropy -------------------------------------------------------------------------- */
typedef struct {
    int64_t N, V;
    const int32_t *tgt;
    double *x, dloss;
} ce_st;
/* mean over valid rows of -log_softmax(x)[target], times dloss */
static double ce_obj(void *p) {
    ce_st *s = p;
    double L = 0.0;
    int64_t nv = 0;
    for (int64_t n = 0; n < s->N; n++) {
        if (s->tgt[n] < 0) continue;
        const double *x = s->x + n * s->V;
        double mx = -INFINITY, z = 0.0;
        for (int64_t i = 0; i < s->V; i++) mx = fmax(mx, x[i]);
        for (int64_t i = 0; i < s->V; i++) z += exp(x[i] - mx);
        L += -(x[s->tgt[n]] - mx - log(z));
        nv++;
    }
    return nv ? s->dloss * L / (double)nv : 0.0;
}

static void test_cross_entropy(void **state) {
    (void)state;
    const int64_t N = 9, V = 13;
    int32_t tgt[9];
    for (int i = 0; i < N; i++) tgt[i] = (int32_t)(dw_test_next(&g_rng) % V);
    tgt[2] = -100; /* torch's default ignore_index */
    tgt[6] = -1;
    float *x = dw_oc_alloc(N * V), *dx = dw_oc_alloc(N * V);
    dw_oc_fill(&g_rng, x, N * V, -4, 4);
    for (int64_t i = 0; i < N * V; i++) dx[i] = NAN;
    const double dloss = dw_test_uniform(&g_rng, 0.5f, 2.0f);
    ce_st s = {N, V, tgt, dw_oc_to_double(x, N * V), 1.0};
    const double want = ce_obj(&s);
    const double got = dw_cpu_cross_entropy_fwd(x, tgt, N, V);
    /* both are double computations on the same inputs: agree to ~1e-15 relative */
    assert_true(fabs(got - want) <= 1e-12 * fabs(want));
    dw_cpu_cross_entropy_bwd(dx, x, tgt, N, V, dloss);
    s.dloss = dloss;
    double *fd = dw_oc_dalloc(N * V);
    dw_oc_fd(ce_obj, &s, s.x, N * V, DW_OC_FD_H, fd);
    assert_int_equal(dw_oc_grad_check("cross_entropy", "dlogits", dx, fd, NULL, N * V), 0);
    /* ignored rows: exactly zero gradient */
    for (int64_t i = 0; i < V; i++) assert_true(dx[2 * V + i] == 0.0f && dx[6 * V + i] == 0.0f);
    /* ignore_index equals dropping the rows: loss and the valid rows' gradients bit-equal */
    float *xc = dw_oc_alloc(N * V), *dxc = dw_oc_alloc(N * V);
    int32_t tc[9];
    int64_t m = 0;
    for (int64_t n = 0; n < N; n++)
        if (tgt[n] >= 0) {
            memcpy(xc + m * V, x + n * V, (size_t)V * sizeof(float));
            tc[m++] = tgt[n];
        }
    assert_true(dw_cpu_cross_entropy_fwd(xc, tc, m, V) == got);
    dw_cpu_cross_entropy_bwd(dxc, xc, tc, m, V, dloss);
    for (int64_t n = 0, r = 0; n < N; n++)
        if (tgt[n] >= 0) assert_memory_equal(dx + n * V, dxc + (r++) * V, (size_t)V * sizeof(float));
    /* all rows ignored: loss 0 and gradient 0 (documented; torch would return NaN) */
    int32_t none[9];
    for (int i = 0; i < N; i++) none[i] = -100;
    assert_true(dw_cpu_cross_entropy_fwd(x, none, N, V) == 0.0);
    dw_cpu_cross_entropy_bwd(dx, x, none, N, V, 1.0);
    for (int64_t i = 0; i < N * V; i++) assert_true(dx[i] == 0.0f);
    free(s.x), free(fd), free(x), free(dx), free(xc), free(dxc);
}

/* Large logits: the max-subtraction keeps the loss finite and exact (log(V) for equal logits). */
static void test_cross_entropy_large_logits(void **state) {
    (void)state;
    const int64_t V = 17;
    float x[17];
    for (int i = 0; i < V; i++) x[i] = 1000.0f;
    int32_t t = 5;
    const double l = dw_cpu_cross_entropy_fwd(x, &t, 1, V);
    assert_true(fabs(l - log((double)V)) < 1e-12);
    float dx[17];
    dw_cpu_cross_entropy_bwd(dx, x, &t, 1, V, 1.0);
    for (int i = 0; i < V; i++)
        assert_true(fabs(dx[i] - (1.0 / V - (i == t))) < 1e-7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_mha),
        cmocka_unit_test(test_attention_mqa),
        cmocka_unit_test(test_attention_causal),
        cmocka_unit_test(test_attention_gqa_equals_mha),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_cross_entropy_large_logits),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
