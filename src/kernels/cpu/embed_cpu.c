/* embed_cpu.c — CPU reference for token embeddings and learned positional embeddings, forward
 * and backward (see ops_cpu.h). Not the GPU path (kernels/cuda/ops_embed.cu).
 * Gradient sums are formed per destination row in double, in ascending n, for any thread count. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"

/* out (N,C) = wte[tok[n], :]    wte (V,C); V is not known here, callers validate tok < V. */
void dw_cpu_embedding_fwd(float *out, const int32_t *tok, const float *wte, int64_t N, int64_t C) {
    DW_ASSERT(N >= 0 && C >= 0);
    for (int64_t n = 0; n < N; n++) DW_ASSERT(tok[n] >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        memcpy(out + n * C, wte + (int64_t)tok[n] * C, (size_t)C * sizeof(float));
}

typedef struct {
    int32_t tok;
    int64_t n;
} dw_tok_pos;

static int dw_tok_pos_cmp(const void *a, const void *b) {
    const dw_tok_pos *x = a, *y = b;
    if (x->tok != y->tok) return x->tok < y->tok ? -1 : 1;
    return (x->n > y->n) - (x->n < y->n);
}

/* dwte[v,:] += sum over n with tok[n]==v of dout[n,:]  (accumulated). Rows are grouped by token
 * (sorted by (tok, n)), each group summed in double in ascending n and added once. */
void dw_cpu_embedding_bwd(float *dwte, const float *dout, const int32_t *tok, int64_t N, int64_t C) {
    dw_cpu_embedding_bwd_pad(dwte, dout, tok, N, C, -1);
}

/* The same with row pad left alone: positions holding pad are not gathered (pad -1: none). */
void dw_cpu_embedding_bwd_pad(float *dwte, const float *dout, const int32_t *tok, int64_t N, int64_t C,
                              int64_t pad) {
    DW_ASSERT(N >= 0 && C >= 0 && pad >= -1);
    if (N == 0 || C == 0) return;
    dw_tok_pos *order = malloc((size_t)N * sizeof *order);
    int64_t *starts = malloc((size_t)(N + 1) * sizeof *starts);
    DW_ASSERT_MSG(order && starts, "out of memory in dw_cpu_embedding_bwd");
    int64_t kept = 0;
    for (int64_t n = 0; n < N; n++) {
        DW_ASSERT(tok[n] >= 0);
        if (tok[n] != pad) order[kept++] = (dw_tok_pos){tok[n], n};
    }
    N = kept;
    qsort(order, (size_t)N, sizeof *order, dw_tok_pos_cmp);
    int64_t groups = 0;
    for (int64_t i = 0; i < N; i++)
        if (i == 0 || order[i].tok != order[i - 1].tok) starts[groups++] = i;
    starts[groups] = N;
#pragma omp parallel
    {
        double *acc = malloc((size_t)C * sizeof *acc);
        DW_ASSERT_MSG(acc, "out of memory in dw_cpu_embedding_bwd");
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) {
            for (int64_t c = 0; c < C; c++) acc[c] = 0.0;
            for (int64_t i = starts[g]; i < starts[g + 1]; i++) {
                const float *row = dout + order[i].n * C;
                for (int64_t c = 0; c < C; c++) acc[c] += row[c];
            }
            float *dst = dwte + (int64_t)order[starts[g]].tok * C;
            for (int64_t c = 0; c < C; c++) dst[c] = (float)((double)dst[c] + acc[c]);
        }
        free(acc);
    }
    free(starts);
    free(order);
}

/* out (B,T,C) = x + wpe[t,:]   wpe (maxT,C), rows 0..T-1 used */
void dw_cpu_pos_fwd(float *out, const float *x, const float *wpe, int64_t B, int64_t T, int64_t C) {
    DW_ASSERT(B >= 0 && T >= 0 && C >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const float *p = wpe + (bt % T) * C;
        for (int64_t c = 0; c < C; c++) out[bt * C + c] = x[bt * C + c] + p[c];
    }
}

/* dx (B,T,C) = dout (written; dx may be NULL or alias dout); dwpe[t,:] += sum_b dout[b,t,:] */
void dw_cpu_pos_bwd(float *dx, float *dwpe, const float *dout, int64_t B, int64_t T, int64_t C) {
    DW_ASSERT(B >= 0 && T >= 0 && C >= 0);
    if (dx && dx != dout) memcpy(dx, dout, (size_t)(B * T * C) * sizeof(float));
    if (!dwpe) return;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        for (int64_t c = 0; c < C; c++) {
            double acc = 0.0;
            for (int64_t b = 0; b < B; b++) acc += dout[(b * T + t) * C + c];
            dwpe[t * C + c] = (float)((double)dwpe[t * C + c] + acc);
        }
    }
}
