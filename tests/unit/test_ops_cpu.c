/* test_ops_cpu.c — CPU reference kernels: embedding, positions, rope, layernorm, rmsnorm, linear,
 * gelu, gelu_erf, relu, silu, swiglu, add. Forward against independent naive double formulas written here, and
 * backward against double central differences of those formulas, on fresh random inputs of small
 * odd sizes. Attention and cross-entropy: test_ops_cpu_attn.c; thread counts: test_ops_cpu_omp.c.
 *
 * Tolerances. The kernels compute in double and round once to FP32, so a forward value is within
 * 1 ulp (2^-23 relative) of the exact double formula: we allow rtol 2.4e-7 (2 ulp) plus a tiny
 * atol for values that are exact zeros/near-zeros. Gradients additionally read FP32 saved
 * statistics (mean, rstd), each off by <= 2^-24 relative, which moves results by a few 1e-8
 * relative; central differences with h = 1e-5 in double have truncation error ~h^2 f''' ~ 1e-9.
 * So gradients use rtol 1e-5 + atol 1e-6 * max|grad|: loose by ~50x over the error budget, yet a
 * wrong term (a missing 1/C, a sign, a transposed index) is off by O(1) and fails. */
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
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xC0FFEEull);
    return 0;
}

static double dot_g(const double *g, const double *y, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += g[i] * y[i];
    return s;
}

/* ---- embedding + positions --------------------------------------------------------------- */
typedef struct {
    int64_t N, C;
    const int32_t *tok;
    double *wte, *g;
} emb_st;
static double emb_obj(void *p) {
    emb_st *s = p;
    double L = 0.0;
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t c = 0; c < s->C; c++) L += s->g[n * s->C + c] * s->wte[s->tok[n] * s->C + c];
    return L;
}

static void test_embedding(void **state) {
    (void)state;
    const int64_t V = 11, N = 10, C = 7;
    int32_t tok[10];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(dw_test_next(&g_rng) % V);
    tok[7] = tok[3]; /* a repeated token: its gradient rows must add */
    tok[9] = tok[3];
    float *wte = dw_oc_alloc(V * C), *out = dw_oc_alloc(N * C), *g = dw_oc_alloc(N * C);
    float *dw = dw_oc_alloc(V * C), *prior = dw_oc_alloc(V * C);
    dw_oc_fill(&g_rng, wte, V * C, -1, 1);
    dw_oc_fill(&g_rng, g, N * C, -1, 1);
    dw_oc_fill(&g_rng, prior, V * C, -1, 1);
    memcpy(dw, prior, (size_t)(V * C) * sizeof(float));
    dw_cpu_embedding_fwd(out, tok, wte, N, C);
    for (int64_t n = 0; n < N; n++)
        assert_memory_equal(out + n * C, wte + tok[n] * C, (size_t)C * sizeof(float));
    dw_cpu_embedding_bwd(dw, g, tok, N, C);
    emb_st s = {N, C, tok, dw_oc_to_double(wte, V * C), dw_oc_to_double(g, N * C)};
    double *fd = dw_oc_dalloc(V * C);
    dw_oc_fd(emb_obj, &s, s.wte, V * C, DW_OC_FD_H, fd);
    assert_int_equal(dw_oc_grad_check("embedding", "dwte", dw, fd, prior, V * C), 0);
    free(s.wte), free(s.g), free(fd), free(wte), free(out), free(g), free(dw), free(prior);
}

typedef struct {
    int64_t B, T, C;
    double *x, *wpe, *g;
} pos_st;
static double pos_obj(void *p) {
    pos_st *s = p;
    double L = 0.0;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t t = 0; t < s->T; t++)
            for (int64_t c = 0; c < s->C; c++) {
                const int64_t i = (b * s->T + t) * s->C + c;
                L += s->g[i] * (s->x[i] + s->wpe[t * s->C + c]);
            }
    return L;
}

static void test_positions(void **state) {
    (void)state;
    const int64_t B = 2, T = 5, C = 7, maxT = 9, n = B * T * C;
    float *x = dw_oc_alloc(n), *wpe = dw_oc_alloc(maxT * C), *out = dw_oc_alloc(n);
    float *g = dw_oc_alloc(n), *dx = dw_oc_alloc(n), *dwpe = dw_oc_alloc(maxT * C);
    float *prior = dw_oc_alloc(maxT * C);
    dw_oc_fill(&g_rng, x, n, -1, 1);
    dw_oc_fill(&g_rng, wpe, maxT * C, -1, 1);
    dw_oc_fill(&g_rng, g, n, -1, 1);
    dw_oc_fill(&g_rng, prior, maxT * C, -1, 1);
    memcpy(dwpe, prior, (size_t)(maxT * C) * sizeof(float));
    for (int64_t i = 0; i < n; i++) dx[i] = NAN;
    dw_cpu_pos_fwd(out, x, wpe, B, T, C);
    for (int64_t i = 0; i < n; i++) assert_true(out[i] == x[i] + wpe[(i / C) % T * C + i % C]);
    dw_cpu_pos_bwd(dx, dwpe, g, B, T, C);
    assert_memory_equal(dx, g, (size_t)n * sizeof(float));
    pos_st s = {B, T, C, dw_oc_to_double(x, n), dw_oc_to_double(wpe, maxT * C), dw_oc_to_double(g, n)};
    double *fd = dw_oc_dalloc(maxT * C);
    dw_oc_fd(pos_obj, &s, s.wpe, maxT * C, DW_OC_FD_H, fd);
    assert_int_equal(dw_oc_grad_check("pos", "dwpe", dwpe, fd, prior, maxT * C), 0);
    /* rows t >= T of wpe are unused: their gradient stays exactly what it was */
    assert_memory_equal(dwpe + T * C, prior + T * C, (size_t)((maxT - T) * C) * sizeof(float));
    free(s.x), free(s.wpe), free(s.g), free(fd);
    free(x), free(wpe), free(out), free(g), free(dx), free(dwpe), free(prior);
}

/* ---- rope ---------------------------------------------------------------------------------- */
typedef struct {
    int64_t B, T, H, D;
    double theta;
    double *x, *g, *y;
} rope_st;
/* Hugging Face's formulation, written independently: inv_freq = 1/theta^(arange(0,D,2)/D),
 * emb = cat(freqs, freqs), y = x*cos(emb) + rotate_half(x)*sin(emb), rotate_half = cat(-x2, x1) */
static void rope_naive(rope_st *s) {
    const int64_t D = s->D, half = D / 2;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t t = 0; t < s->T; t++)
            for (int64_t h = 0; h < s->H; h++) {
                const double *xr = s->x + ((b * s->T + t) * s->H + h) * D;
                double *yr = s->y + ((b * s->T + t) * s->H + h) * D;
                for (int64_t d = 0; d < D; d++) {
                    const int64_t i = d % half;
                    const double emb = (double)t * (1.0 / pow(s->theta, (double)(2 * i) / (double)D));
                    const double rot = d < half ? -xr[d + half] : xr[d - half];
                    yr[d] = xr[d] * cos(emb) + rot * sin(emb);
                }
            }
}
static double rope_obj(void *p) {
    rope_st *s = p;
    rope_naive(s);
    return dot_g(s->g, s->y, s->B * s->T * s->H * s->D);
}

static void test_rope(void **state) {
    (void)state;
    const int64_t B = 2, T = 5, H = 3, D = 6, n = B * T * H * D;
    const double theta = 10000.0 * (0.5 + dw_test_uniform(&g_rng, 0, 1));
    float *x = dw_oc_alloc(n), *out = dw_oc_alloc(n), *g = dw_oc_alloc(n), *dx = dw_oc_alloc(n);
    dw_oc_fill(&g_rng, x, n, -1, 1);
    dw_oc_fill(&g_rng, g, n, -1, 1);
    for (int64_t i = 0; i < n; i++) out[i] = dx[i] = NAN;
    dw_cpu_rope_fwd(out, x, B, T, H, D, theta, NULL);
    rope_st s = {B, T, H, D, theta, dw_oc_to_double(x, n), dw_oc_to_double(g, n), dw_oc_dalloc(n)};
    rope_naive(&s);
    assert_int_equal(dw_oc_fwd_check("rope", "out", out, s.y, n), 0);
    /* position 0 is the identity */
    for (int64_t b = 0; b < B; b++)
        assert_memory_equal(out + b * T * H * D, x + b * T * H * D, (size_t)(H * D) * sizeof(float));
    dw_cpu_rope_bwd(dx, g, B, T, H, D, theta, NULL);
    double *fd = dw_oc_dalloc(n);
    dw_oc_fd(rope_obj, &s, s.x, n, DW_OC_FD_H, fd);
    assert_int_equal(dw_oc_grad_check("rope", "dx", dx, fd, NULL, n), 0);
    free(s.x), free(s.g), free(s.y), free(fd), free(x), free(out), free(g), free(dx);
}

/* The property rope exists for: after rotation, q_t . k_s depends only on t - s. Two vectors
 * placed at positions (t, s) and (t + 3, s + 3) give the same dot product (up to FP32 rounding
 * of the rotated values: 1e-6 relative to |q||k|). */
static void test_rope_relative_position(void **state) {
    (void)state;
    const int64_t T = 9, D = 8, shift = 3;
    float x[9 * 8], qr[9 * 8], kr[9 * 8], q[8], k[8];
    dw_oc_fill(&g_rng, q, D, -1, 1);
    dw_oc_fill(&g_rng, k, D, -1, 1);
    double qn = 0.0, kn = 0.0;
    for (int64_t d = 0; d < D; d++) qn += (double)q[d] * q[d], kn += (double)k[d] * k[d];
    for (int64_t t = 0; t < T; t++) memcpy(x + t * D, q, sizeof q);
    dw_cpu_rope_fwd(qr, x, 1, T, 1, D, 10000.0, NULL);
    for (int64_t t = 0; t < T; t++) memcpy(x + t * D, k, sizeof k);
    dw_cpu_rope_fwd(kr, x, 1, T, 1, D, 10000.0, NULL);
    for (int64_t t = 0; t + shift < T; t++)
        for (int64_t s = 0; s + shift < T; s++) {
            double a = 0.0, b = 0.0;
            for (int64_t d = 0; d < D; d++) {
                a += (double)qr[t * D + d] * kr[s * D + d];
                b += (double)qr[(t + shift) * D + d] * kr[(s + shift) * D + d];
            }
            assert_true(fabs(a - b) <= 1e-6 * sqrt(qn * kn));
        }
}

/* ---- layernorm, rmsnorm -------------------------------------------------------------------- */
typedef struct {
    int64_t N, C;
    double eps;
    int rms;
    double *x, *w, *b, *g, *y, *mean, *rstd;
} norm_st;
/* textbook: mean = sum x / C, var = sum (x-mean)^2 / C (biased); rms: ms = sum x^2 / C */
static void norm_naive(norm_st *s) {
    for (int64_t n = 0; n < s->N; n++) {
        const double *xr = s->x + n * s->C;
        double m = 0.0, v = 0.0;
        if (!s->rms) {
            for (int64_t c = 0; c < s->C; c++) m += xr[c];
            m /= (double)s->C;
        }
        for (int64_t c = 0; c < s->C; c++) v += (xr[c] - m) * (xr[c] - m);
        v /= (double)s->C;
        const double r = 1.0 / sqrt(v + s->eps);
        for (int64_t c = 0; c < s->C; c++)
            s->y[n * s->C + c] = (xr[c] - m) * r * s->w[c] + (s->rms ? 0.0 : s->b[c]);
        s->mean[n] = m;
        s->rstd[n] = r;
    }
}
static double norm_obj(void *p) {
    norm_st *s = p;
    norm_naive(s);
    return dot_g(s->g, s->y, s->N * s->C);
}

static void run_norm(int rms) {
    const char *op = rms ? "rmsnorm" : "layernorm";
    const int64_t N = 10, C = 7, n = N * C;
    const double eps = 1e-5;
    float *x = dw_oc_alloc(n), *w = dw_oc_alloc(C), *b = dw_oc_alloc(C), *out = dw_oc_alloc(n);
    float *mean = dw_oc_alloc(N), *rstd = dw_oc_alloc(N), *g = dw_oc_alloc(n), *dx = dw_oc_alloc(n);
    float *dw = dw_oc_alloc(C), *db = dw_oc_alloc(C), *pw = dw_oc_alloc(C), *pb = dw_oc_alloc(C);
    dw_oc_fill(&g_rng, x, n, -2, 2);
    for (int64_t i = 0; i < n; i++) x[i] += (float)(i / C) * 0.3f; /* rows with non-zero means */
    dw_oc_fill(&g_rng, w, C, 0.5f, 1.5f);
    dw_oc_fill(&g_rng, b, C, -0.5f, 0.5f);
    dw_oc_fill(&g_rng, g, n, -1, 1);
    dw_oc_fill(&g_rng, pw, C, -1, 1);
    dw_oc_fill(&g_rng, pb, C, -1, 1);
    memcpy(dw, pw, (size_t)C * sizeof(float));
    memcpy(db, pb, (size_t)C * sizeof(float));
    for (int64_t i = 0; i < n; i++) out[i] = dx[i] = NAN;
    norm_st s = {N, C, eps, rms, dw_oc_to_double(x, n), dw_oc_to_double(w, C), dw_oc_to_double(b, C),
                 dw_oc_to_double(g, n), dw_oc_dalloc(n), dw_oc_dalloc(N), dw_oc_dalloc(N)};
    norm_naive(&s);
    if (rms) {
        dw_cpu_rmsnorm_fwd(out, rstd, x, w, N, C, eps);
    } else {
        dw_cpu_layernorm_fwd(out, mean, rstd, x, w, b, N, C, eps);
        assert_int_equal(dw_oc_fwd_check(op, "mean", mean, s.mean, N), 0);
    }
    assert_int_equal(dw_oc_fwd_check(op, "rstd", rstd, s.rstd, N), 0);
    assert_int_equal(dw_oc_fwd_check(op, "out", out, s.y, n), 0);
    if (rms)
        dw_cpu_rmsnorm_bwd(dx, dw, g, x, w, rstd, N, C);
    else
        dw_cpu_layernorm_bwd(dx, dw, db, g, x, w, mean, rstd, N, C);
    double *fd = dw_oc_dalloc(n);
    dw_oc_fd(norm_obj, &s, s.x, n, DW_OC_FD_H, fd);
    assert_int_equal(dw_oc_grad_check(op, "dx", dx, fd, NULL, n), 0);
    dw_oc_fd(norm_obj, &s, s.w, C, DW_OC_FD_H, fd);
    assert_int_equal(dw_oc_grad_check(op, "dw", dw, fd, pw, C), 0);
    if (!rms) {
        dw_oc_fd(norm_obj, &s, s.b, C, DW_OC_FD_H, fd);
        assert_int_equal(dw_oc_grad_check(op, "db", db, fd, pb, C), 0);
    }
    free(s.x), free(s.w), free(s.b), free(s.g), free(s.y), free(s.mean), free(s.rstd), free(fd);
    free(x), free(w), free(b), free(out), free(mean), free(rstd), free(g), free(dx);
    free(dw), free(db), free(pw), free(pb);
}
static void test_layernorm(void **state) { (void)state; run_norm(0); }
static void test_rmsnorm(void **state) { (void)state; run_norm(1); }

/* ---- linear ---------------------------------------------------------------------------------- */
typedef struct {
    int64_t N, K, M;
    double *x, *w, *b, *g, *y;
} lin_st;
static void lin_naive(lin_st *s) {
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t m = 0; m < s->M; m++) {
            double acc = s->b ? s->b[m] : 0.0;
            for (int64_t k = 0; k < s->K; k++) acc += s->x[n * s->K + k] * s->w[m * s->K + k];
            s->y[n * s->M + m] = acc;
        }
}
static double lin_obj(void *p) {
    lin_st *s = p;
    lin_naive(s);
    return dot_g(s->g, s->y, s->N * s->M);
}

static void run_linear(int with_bias) {
    const int64_t N = 10, K = 7, M = 9;
    float *x = dw_oc_alloc(N * K), *w = dw_oc_alloc(M * K), *b = dw_oc_alloc(M);
    float *out = dw_oc_alloc(N * M), *g = dw_oc_alloc(N * M), *dx = dw_oc_alloc(N * K);
    float *dw = dw_oc_alloc(M * K), *db = dw_oc_alloc(M), *pw = dw_oc_alloc(M * K), *pb = dw_oc_alloc(M);
    dw_oc_fill(&g_rng, x, N * K, -1, 1);
    dw_oc_fill(&g_rng, w, M * K, -1, 1);
    dw_oc_fill(&g_rng, b, M, -1, 1);
    dw_oc_fill(&g_rng, g, N * M, -1, 1);
    dw_oc_fill(&g_rng, pw, M * K, -1, 1);
    dw_oc_fill(&g_rng, pb, M, -1, 1);
    memcpy(dw, pw, (size_t)(M * K) * sizeof(float));
    memcpy(db, pb, (size_t)M * sizeof(float));
    for (int64_t i = 0; i < N * M; i++) out[i] = NAN;
    for (int64_t i = 0; i < N * K; i++) dx[i] = NAN;
    lin_st s = {N, K, M, dw_oc_to_double(x, N * K), dw_oc_to_double(w, M * K),
                with_bias ? dw_oc_to_double(b, M) : NULL, dw_oc_to_double(g, N * M), dw_oc_dalloc(N * M)};
    lin_naive(&s);
    dw_cpu_linear_fwd(out, x, w, with_bias ? b : NULL, N, K, M);
    assert_int_equal(dw_oc_fwd_check("linear", "out", out, s.y, N * M), 0);
    dw_cpu_linear_bwd(dx, dw, with_bias ? db : NULL, g, x, w, N, K, M);
    double *fd = dw_oc_dalloc(M * K > N * K ? M * K : N * K);
    dw_oc_fd(lin_obj, &s, s.x, N * K, DW_OC_FD_H, fd);
    assert_int_equal(dw_oc_grad_check("linear", "dx", dx, fd, NULL, N * K), 0);
    dw_oc_fd(lin_obj, &s, s.w, M * K, DW_OC_FD_H, fd);
    assert_int_equal(dw_oc_grad_check("linear", "dW", dw, fd, pw, M * K), 0);
    if (with_bias) {
        dw_oc_fd(lin_obj, &s, s.b, M, DW_OC_FD_H, fd);
        assert_int_equal(dw_oc_grad_check("linear", "db", db, fd, pb, M), 0);
    } else {
        assert_memory_equal(db, pb, (size_t)M * sizeof(float)); /* untouched */
    }
    /* dx may be NULL: parameter gradients still accumulate */
    memcpy(dw, pw, (size_t)(M * K) * sizeof(float));
    float *dw2 = dw_oc_alloc(M * K);
    memcpy(dw2, pw, (size_t)(M * K) * sizeof(float));
    dw_cpu_linear_bwd(NULL, dw2, NULL, g, x, w, N, K, M);
    dw_cpu_linear_bwd(dx, dw, NULL, g, x, w, N, K, M);
    assert_memory_equal(dw2, dw, (size_t)(M * K) * sizeof(float));
    free(s.x), free(s.w), free(s.b), free(s.g), free(s.y), free(fd), free(dw2);
    free(x), free(w), free(b), free(out), free(g), free(dx), free(dw), free(db), free(pw), free(pb);
}
static void test_linear(void **state) { (void)state; run_linear(1); }
static void test_linear_nobias(void **state) { (void)state; run_linear(0); }

/* ---- elementwise ----------------------------------------------------------------------------- */
enum { EW_GELU, EW_SILU, EW_SWIGLU, EW_ADD, EW_GELU_ERF, EW_RELU };
typedef struct {
    int op;
    int64_t n;
    double *a, *b, *g;
} ew_st;
/* GPT-2 / HF gelu_new: 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))); silu x/(1+e^-x) */
static double ew_gelu(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * pow(x, 3.0))));
}
static double ew_silu(double x) { return x / (1.0 + exp(-x)); }
/* torch's nn.GELU(): x Phi(x) with Phi the normal CDF, written through erfc; relu max(x, 0) */
static double ew_gelu_erf(double x) { return x * 0.5 * erfc(-x / sqrt(2.0)); }
static double ew_val(const ew_st *s, int64_t i) {
    switch (s->op) {
    case EW_GELU: return ew_gelu(s->a[i]);
    case EW_SILU: return ew_silu(s->a[i]);
    case EW_SWIGLU: return ew_silu(s->a[i]) * s->b[i];
    case EW_GELU_ERF: return ew_gelu_erf(s->a[i]);
    case EW_RELU: return s->a[i] > 0 ? s->a[i] : 0.0;
    default: return s->a[i] + s->b[i];
    }
}
static double ew_obj(void *p) {
    ew_st *s = p;
    double L = 0.0;
    for (int64_t i = 0; i < s->n; i++) L += s->g[i] * ew_val(s, i);
    return L;
}

static void run_elementwise(int op) {
    static const char *names[] = {"gelu", "silu", "swiglu", "add", "gelu_erf", "relu"};
    const int64_t n = 67;
    float *a = dw_oc_alloc(n), *b = dw_oc_alloc(n), *out = dw_oc_alloc(n), *g = dw_oc_alloc(n);
    float *da = dw_oc_alloc(n), *db = dw_oc_alloc(n);
    dw_oc_fill(&g_rng, a, n, -5, 5); /* covers the saturated tails of tanh and the sigmoid */
    dw_oc_fill(&g_rng, b, n, -2, 2);
    dw_oc_fill(&g_rng, g, n, -1, 1);
    a[0] = 0.0f;
    for (int64_t i = 1; op == EW_RELU && i < n; i++) /* finite differences need no kink within reach */
        if (fabsf(a[i]) < 1e-2f) a[i] = 0.5f;
    for (int64_t i = 0; i < n; i++) out[i] = da[i] = db[i] = NAN;
    ew_st s = {op, n, dw_oc_to_double(a, n), dw_oc_to_double(b, n), dw_oc_to_double(g, n)};
    double *want = dw_oc_dalloc(n), *fd = dw_oc_dalloc(n);
    for (int64_t i = 0; i < n; i++) want[i] = ew_val(&s, i);
    switch (op) {
    case EW_GELU: dw_cpu_gelu_fwd(out, a, n); dw_cpu_gelu_bwd(da, g, a, n); break;
    case EW_SILU: dw_cpu_silu_fwd(out, a, n); dw_cpu_silu_bwd(da, g, a, n); break;
    case EW_SWIGLU: dw_cpu_swiglu_fwd(out, a, b, n); dw_cpu_swiglu_bwd(da, db, g, a, b, n); break;
    case EW_GELU_ERF: dw_cpu_gelu_erf_fwd(out, a, n); dw_cpu_gelu_erf_bwd(da, g, a, n); break;
    case EW_RELU: dw_cpu_relu_fwd(out, a, n); dw_cpu_relu_bwd(da, g, a, n); break;
    default: dw_cpu_add_fwd(out, a, b, n); break;
    }
    assert_int_equal(dw_oc_fwd_check(names[op], "out", out, want, n), 0);
    if (op == EW_ADD) { /* a+b of two floats is exactly rounded either way */
        for (int64_t i = 0; i < n; i++) assert_true(out[i] == a[i] + b[i]);
    } else {
        dw_oc_fd(ew_obj, &s, s.a, n, DW_OC_FD_H, fd);
        if (op == EW_RELU) fd[0] = 0; /* at the kink: torch's gradient 0, finite differences 1/2 */
        assert_int_equal(dw_oc_grad_check(names[op], "dx/dgate", da, fd, NULL, n), 0);
    }
    if (op == EW_SWIGLU) {
        dw_oc_fd(ew_obj, &s, s.b, n, DW_OC_FD_H, fd);
        assert_int_equal(dw_oc_grad_check(names[op], "dup", db, fd, NULL, n), 0);
    }
    free(s.a), free(s.b), free(s.g), free(want), free(fd);
    free(a), free(b), free(out), free(g), free(da), free(db);
}
static void test_gelu(void **state) { (void)state; run_elementwise(EW_GELU); }
static void test_silu(void **state) { (void)state; run_elementwise(EW_SILU); }
static void test_swiglu(void **state) { (void)state; run_elementwise(EW_SWIGLU); }
static void test_add(void **state) { (void)state; run_elementwise(EW_ADD); }
static void test_gelu_erf(void **state) { (void)state; run_elementwise(EW_GELU_ERF); }
static void test_relu(void **state) { (void)state; run_elementwise(EW_RELU); }

/* Known values: gelu_new(1) = 0.5*(1+tanh(sqrt(2/pi)*1.044715)) = 0.8411919906082768 (the
 * tanh approximation; the erf GELU would give 0.8413447460685429), silu(1) = 1/(1+e^-1). */
static void test_known_values(void **state) {
    (void)state;
    float x = 1.0f, y;
    dw_cpu_gelu_fwd(&y, &x, 1);
    assert_true(fabs(y - 0.8411919906082768) < 1e-7);
    dw_cpu_silu_fwd(&y, &x, 1);
    assert_true(fabs(y - 0.7310585786300049) < 1e-7);
    dw_cpu_gelu_erf_fwd(&y, &x, 1);
    assert_true(fabs(y - 0.8413447460685429) < 1e-7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding), cmocka_unit_test(test_positions),
        cmocka_unit_test(test_rope),      cmocka_unit_test(test_rope_relative_position),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_rmsnorm),   cmocka_unit_test(test_linear),
        cmocka_unit_test(test_linear_nobias), cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_silu),      cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_add),       cmocka_unit_test(test_gelu_erf),
        cmocka_unit_test(test_relu),      cmocka_unit_test(test_known_values),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
