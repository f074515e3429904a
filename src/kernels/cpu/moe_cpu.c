/* moe_cpu.c — CPU reference for the MoE data movement and expert GEMMs (ops_cpu.h): dispatch (a
 * counting sort of the (token, k) assignments by expert, those past an expert's capacity dropped by
 * position or by weight, and its gradient gather), the grouped linear layer, and the weighted
 * combine; forward and backward, sums in double, one rounding per output; and the fp8_block grouped
 * products (moe_fp8_cpu.h: fprop/dgrad, and wgrad over 128-padded expert groups) and mxfp8's
 * (fprop/dgrad, 1x32 UE8M0 blocks). Threads split
 * independent rows or experts, so they cannot change results. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/formats.h"
#include "kernels/cpu/moe_fp8_cpu.h"
#include "kernels/cpu/ops_cpu.h"

/* One (weight, assignment) of an expert's group, for the drop by weight. */
typedef struct {
    float w;
    int32_t a;
} weighted;

/* Heavier first; equal weights: the earlier (token, k) first. */
static int heavier_first(const void *pa, const void *pb) {
    const weighted *x = pa, *y = pb;
    return x->w > y->w ? -1 : x->w < y->w ? 1 : (x->a > y->a) - (x->a < y->a);
}

/* keep[a] = idx[a] when assignment a is among its expert's cap heaviest (prio (A)), else -1: each
 * expert's members sorted by (weight descending, index ascending), the first cap kept. */
static void keep_heaviest(int32_t *keep, const int32_t *idx, const float *prio, int64_t A, int64_t E, int64_t cap) {
    weighted *m = malloc((size_t)(A ? A : 1) * sizeof *m);
    int64_t *start = calloc((size_t)E + 1, sizeof *start), *fill = calloc((size_t)E + 1, sizeof *fill);
    DW_ASSERT(m && start && fill);
    for (int64_t a = 0; a < A; a++)
        if (idx[a] >= 0 && idx[a] < E) start[idx[a] + 1]++;
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    for (int64_t a = 0; a < A; a++) {
        keep[a] = -1;
        if (idx[a] >= 0 && idx[a] < E) m[start[idx[a]] + fill[idx[a]]++] = (weighted){prio[a], (int32_t)a};
    }
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = start[e + 1] - start[e];
        qsort(m + start[e], (size_t)n, sizeof *m, heavier_first);
        for (int64_t r = 0; r < n && r < cap; r++) keep[m[start[e] + r].a] = (int32_t)e;
    }
    free(fill);
    free(start);
    free(m);
}

void dw_cpu_moe_dispatch_fwd(float *xs, int32_t *offsets, int32_t *pos, const float *x, const int32_t *idx,
                             const float *prio, int64_t N, int64_t C, int64_t K, int64_t E, int64_t cap) {
    DW_ASSERT(N >= 0 && C >= 1 && K >= 1 && E >= 1);
    if (cap <= 0 || cap > N * K) cap = N * K; /* dropless */
    const int64_t R = E * cap < N * K ? E * cap : N * K; /* the rows xs holds (dw_moe_routed_rows) */
    if (prio && cap < N * K) { /* by weight: pos holds the kept experts (-1 dropped), then sorted as dropless */
        keep_heaviest(pos, idx, prio, N * K, E, cap);
        idx = pos, cap = N * K;
    }
    int64_t *cursor = calloc((size_t)E + 1, sizeof *cursor), *seen = calloc((size_t)E, sizeof *seen);
    DW_ASSERT(cursor && seen);
    for (int64_t a = 0; a < N * K; a++)
        if (idx[a] >= 0 && idx[a] < E) cursor[idx[a] + 1]++;
    for (int64_t e = 0; e < E; e++) cursor[e + 1] = cursor[e] + (cursor[e + 1] < cap ? cursor[e + 1] : cap);
    for (int64_t e = 0; e <= E; e++) offsets[e] = (int32_t)cursor[e]; /* group starts, groups clipped to cap */
    for (int64_t a = 0; a < N * K; a++) { /* (token, k) order within each group; past the capacity: dropped */
        const int32_t e = idx[a]; /* read before pos[a] is written: idx may be pos */
        pos[a] = e >= 0 && e < E && seen[e]++ < cap ? (int32_t)cursor[e]++ : -1;
    }
    free(seen);
    free(cursor);
#pragma omp parallel for schedule(static)
    for (int64_t a = 0; a < N * K; a++)
        if (pos[a] >= 0) memcpy(xs + (int64_t)pos[a] * C, x + (a / K) * C, (size_t)C * sizeof *x);
    const int64_t used = offsets[E];
    memset(xs + used * C, 0, (size_t)((R - used) * C) * sizeof *xs);
}

void dw_cpu_moe_count(int64_t *cnt, const int32_t *idx, const int32_t *offsets, int64_t A, int64_t E) {
    cnt[0] += A;
    cnt[1] += A - offsets[E];
    for (int64_t a = 0; a < A; a++)
        if (idx[a] >= 0 && idx[a] < E) cnt[2 + idx[a]]++;
}

/* Each token's sum of its rows' gradients: the combine with every weight 1. */
void dw_cpu_moe_dispatch_bwd(float *dx, const float *dxs, const int32_t *pos, int64_t N, int64_t C, int64_t K) {
    dw_cpu_moe_combine_fwd(dx, dxs, NULL, pos, N, C, K);
}

void dw_cpu_moe_linear_fwd(float *y, const float *x, const float *w, const int32_t *offsets, int64_t R, int64_t E,
                           int64_t K, int64_t M) {
    DW_ASSERT(R >= 0 && E >= 1 && K >= 1 && M >= 1 && offsets[E] <= R);
    for (int64_t e = 0; e < E; e++) {
        const float *we = w + e * M * K;
#pragma omp parallel for schedule(static)
        for (int64_t r = offsets[e]; r < offsets[e + 1]; r++)
            for (int64_t m = 0; m < M; m++) {
                double s = 0.0;
                for (int64_t k = 0; k < K; k++) s += (double)x[r * K + k] * we[m * K + k];
                y[r * M + m] = (float)s;
            }
    }
    memset(y + (int64_t)offsets[E] * M, 0, (size_t)((R - offsets[E]) * M) * sizeof *y);
}

/* dwe (M,K) [+]= dy_e^T x_e over rows [r0, r1): expert e's wgrad (overwrite: 0 + the sum, a zeroed
 * dW's bits). */
static void wgrad_expert(float *dwe, const float *dy, const float *x, int64_t r0, int64_t r1, int64_t K, int64_t M,
                         bool overwrite) {
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            double s = 0.0;
            for (int64_t r = r0; r < r1; r++) s += (double)dy[r * M + m] * x[r * K + k];
            dwe[m * K + k] = (float)((overwrite ? 0.0 : (double)dwe[m * K + k]) + s);
        }
}

void dw_cpu_moe_linear_wgrad(float *dw, const float *dy, const float *x, const int32_t *offsets, int64_t R, int64_t E,
                             int64_t K, int64_t M, bool overwrite) {
    DW_ASSERT(R >= 0 && E >= 1 && K >= 1 && M >= 1 && offsets[E] <= R);
    for (int64_t e = 0; e < E; e++) wgrad_expert(dw + e * M * K, dy, x, offsets[e], offsets[e + 1], K, M, overwrite);
}

void dw_cpu_moe_linear_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                           const int32_t *offsets, int64_t R, int64_t E, int64_t K, int64_t M) {
    DW_ASSERT(R >= 0 && E >= 1 && K >= 1 && M >= 1 && offsets[E] <= R);
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = offsets[e], r1 = offsets[e + 1];
        if (dx) {
            const float *we = w + e * M * K;
#pragma omp parallel for schedule(static)
            for (int64_t r = r0; r < r1; r++)
                for (int64_t k = 0; k < K; k++) {
                    double s = 0.0;
                    for (int64_t m = 0; m < M; m++) s += (double)dy[r * M + m] * we[m * K + k];
                    dx[r * K + k] = (float)s;
                }
        }
        if (dw) wgrad_expert(dw + e * M * K, dy, x, r0, r1, K, M, false);
    }
    if (dx) memset(dx + (int64_t)offsets[E] * K, 0, (size_t)((R - offsets[E]) * K) * sizeof *dx);
}

void dw_cpu_moe_combine_fwd(float *out, const float *ys, const float *wt, const int32_t *pos, int64_t N, int64_t C,
                            int64_t K) {
    DW_ASSERT(N >= 0 && C >= 1 && K >= 1);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const int32_t r = pos[n * K + k];
                if (r >= 0) s += (wt ? (double)wt[n * K + k] : 1.0) * ys[(int64_t)r * C + c];
            }
            out[n * C + c] = (float)s;
        }
}

void dw_cpu_moe_combine_bwd(float *dys, float *dwt, const float *dout, const float *ys, const float *wt,
                            const int32_t *pos, int64_t N, int64_t C, int64_t K, int64_t R) {
    DW_ASSERT(N >= 0 && C >= 1 && K >= 1);
    if (dys) memset(dys, 0, (size_t)(R * C) * sizeof *dys);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            const int32_t r = pos[n * K + k];
            double dot = 0.0;
            for (int64_t c = 0; c < C; c++) {
                if (r < 0) break;
                dot += (double)dout[n * C + c] * ys[(int64_t)r * C + c];
                if (dys) dys[(int64_t)r * C + c] = (float)((double)wt[n * K + k] * dout[n * C + c]);
            }
            if (dwt) dwt[n * K + k] = (float)dot;
        }
}

void dw_cpu_moe_linear_fp8(float *out, const uint8_t *a, const float *sa, const uint8_t *b, const float *sb,
                           const int32_t *offsets, int64_t R, int64_t E, int64_t L, int64_t N) {
    DW_ASSERT(R >= 0 && E >= 1 && L % 128 == 0 && N % 128 == 0 && offsets[E] <= R);
    float dec[256];
    for (int c = 0; c < 256; c++) dec[c] = dw_decode_e4m3((uint8_t)c);
    const int64_t LB = L / 128;
    for (int64_t e = 0; e < E; e++) {
#pragma omp parallel for schedule(static)
        for (int64_t r = offsets[e]; r < offsets[e + 1]; r++)
            for (int64_t j = 0; j < N; j++) {
                const uint8_t *ar = a + r * L, *bj = b + (e * N + j) * L;
                double acc = 0.0;
                for (int64_t kb = 0; kb < LB; kb++) {
                    double part = 0.0;
                    for (int64_t l = kb * 128; l < kb * 128 + 128; l++) part += (double)dec[ar[l]] * dec[bj[l]];
                    const float s = sa[r * LB + kb] * sb[(e * (N / 128) + j / 128) * LB + kb];
                    acc += part * s;
                }
                out[r * N + j] = (float)acc;
            }
    }
    memset(out + (int64_t)offsets[E] * N, 0, (size_t)((R - offsets[E]) * N) * sizeof *out);
}

void dw_cpu_moe_linear_mxfp8(float *out, const uint8_t *a, const uint8_t *sa, const uint8_t *b, const uint8_t *sb,
                             const int32_t *offsets, int64_t R, int64_t E, int64_t L, int64_t N) {
    DW_ASSERT(R >= 0 && E >= 1 && L % 32 == 0 && offsets[E] <= R);
    double dec[256], sc[256];
    for (int c = 0; c < 256; c++) dec[c] = dw_decode_e4m3((uint8_t)c), sc[c] = dw_decode_ue8m0((uint8_t)c);
    const int64_t LB = L / 32;
    for (int64_t e = 0; e < E; e++) {
#pragma omp parallel for schedule(static)
        for (int64_t r = offsets[e]; r < offsets[e + 1]; r++)
            for (int64_t j = 0; j < N; j++) {
                const uint8_t *ar = a + r * L, *bj = b + (e * N + j) * L, *sar = sa + r * LB, *sbj = sb + (e * N + j) * LB;
                double acc = 0.0;
                for (int64_t kb = 0; kb < LB; kb++) {
                    double part = 0.0;
                    for (int64_t l = kb * 32; l < kb * 32 + 32; l++) part += dec[ar[l]] * dec[bj[l]];
                    acc += part * (sc[sar[kb]] * sc[sbj[kb]]);
                }
                out[r * N + j] = (float)acc;
            }
    }
    memset(out + (int64_t)offsets[E] * N, 0, (size_t)((R - offsets[E]) * N) * sizeof *out);
}

void dw_cpu_moe_pad_offsets(int64_t *pad, const int32_t *offsets, int64_t E, int64_t block) {
    pad[0] = 0;
    for (int64_t e = 0; e < E; e++) pad[e + 1] = pad[e] + (offsets[e + 1] - offsets[e] + block - 1) / block * block;
}

void dw_cpu_moe_linear_fp8_wgrad(float *dw, const uint8_t *a, const float *sa, const uint8_t *b, const float *sb,
                                 const int32_t *offsets, int64_t E, int64_t M, int64_t K, int64_t P, bool overwrite) {
    DW_ASSERT(E >= 1 && P % 128 == 0);
    int64_t *pad = malloc((size_t)(E + 1) * sizeof *pad);
    DW_ASSERT(pad);
    dw_cpu_moe_pad_offsets(pad, offsets, E, 128);
    DW_ASSERT(pad[E] <= P);
    float dec[256];
    for (int c = 0; c < 256; c++) dec[c] = dw_decode_e4m3((uint8_t)c);
    const int64_t PB = P / 128;
    for (int64_t e = 0; e < E; e++) {
        if (pad[e + 1] == pad[e] && !overwrite) continue; /* no rows: nothing added (written over: zeros) */
#pragma omp parallel for schedule(static)
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) {
                const uint8_t *am = a + m * P, *bk = b + k * P;
                double acc = 0.0;
                for (int64_t pb = pad[e] / 128; pb < pad[e + 1] / 128; pb++) {
                    double part = 0.0;
                    for (int64_t l = pb * 128; l < pb * 128 + 128; l++) part += (double)dec[am[l]] * dec[bk[l]];
                    const float s = sa[m * PB + pb] * sb[k * PB + pb];
                    acc += part * s;
                }
                float *d = dw + (e * M + m) * K + k;
                *d = (float)((overwrite ? 0.0 : (double)*d) + acc); /* 0 + acc: a zeroed dW's bits */
            }
    }
    free(pad);
}
