/* test_ops_cpu_omp.c — every CPU reference kernel, forward and backward, gives bit-identical
 * results with 1, 2, 3 and 7 OpenMP threads (sizes chosen so that rows split unevenly). The
 * kernels parallelise only over independent rows/heads and sum in a fixed order, so any
 * difference is a bug. Without OpenMP the test still runs the ops and checks repeatability. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/ops_cpu.h"
#include "opcheck.h"
#include "testutil.h"

enum { B = 3, T = 23, H = 4, HKV = 2, D = 8, C = 29, V = 41, M = 31, N = B * T };

typedef struct {
    float q[N * H * D], k[N * HKV * D], v[N * HKV * D], gq[N * H * D];
    float x[N * C], w[C], b[C], gx[N * C], wte[V * C], wpe[T * C], wl[M * C], bl[M], gl[N * M];
    float logits[N * V];
    int32_t tok[N], tgt[N];
} inputs;

/* Every output of every op, in one block so that a single memcmp compares them all. */
typedef struct {
    float att[N * H * D], lse[N * H], dq[N * H * D], dk[N * HKV * D], dv[N * HKV * D];
    float ln[N * C], mean[N], rstd[N], dx[N * C], dw[C], db[C];
    float rms[N * C], rrstd[N], rdx[N * C], rdw[C];
    float emb[N * C], dwte[V * C], pos[N * C], pdx[N * C], dwpe[T * C];
    float rope[N * H * D], drope[N * H * D];
    float lin[N * M], ldx[N * C], ldw[M * C], ldb[M];
    float gelu[N * C], dgelu[N * C], silu[N * C], dsilu[N * C], swi[N * C], dg[N * C], du[N * C];
    float add[N * C], dlogits[N * V];
    double loss;
} outputs;

static void run_all(const inputs *in, outputs *o) {
    memset(o, 0, sizeof *o); /* accumulated gradients start at 0 */
    dw_cpu_attention_fwd(o->att, o->lse, in->q, in->k, in->v, B, T, H, HKV, D);
    dw_cpu_attention_bwd(o->dq, o->dk, o->dv, in->gq, in->q, in->k, in->v, o->att, o->lse, B, T, H,
                         HKV, D);
    dw_cpu_layernorm_fwd(o->ln, o->mean, o->rstd, in->x, in->w, in->b, N, C, 1e-5);
    dw_cpu_layernorm_bwd(o->dx, o->dw, o->db, in->gx, in->x, in->w, o->mean, o->rstd, N, C);
    dw_cpu_rmsnorm_fwd(o->rms, o->rrstd, in->x, in->w, N, C, 1e-6);
    dw_cpu_rmsnorm_bwd(o->rdx, o->rdw, in->gx, in->x, in->w, o->rrstd, N, C);
    dw_cpu_embedding_fwd(o->emb, in->tok, in->wte, N, C);
    dw_cpu_embedding_bwd(o->dwte, in->gx, in->tok, N, C);
    dw_cpu_pos_fwd(o->pos, in->x, in->wpe, B, T, C);
    dw_cpu_pos_bwd(o->pdx, o->dwpe, in->gx, B, T, C);
    dw_cpu_rope_fwd(o->rope, in->q, B, T, H, D, 10000.0, NULL);
    dw_cpu_rope_bwd(o->drope, in->gq, B, T, H, D, 10000.0, NULL);
    dw_cpu_linear_fwd(o->lin, in->x, in->wl, in->bl, N, C, M);
    dw_cpu_linear_bwd(o->ldx, o->ldw, o->ldb, in->gl, in->x, in->wl, N, C, M);
    dw_cpu_gelu_fwd(o->gelu, in->x, N * C);
    dw_cpu_gelu_bwd(o->dgelu, in->gx, in->x, N * C);
    dw_cpu_silu_fwd(o->silu, in->x, N * C);
    dw_cpu_silu_bwd(o->dsilu, in->gx, in->x, N * C);
    dw_cpu_swiglu_fwd(o->swi, in->x, in->gx, N * C);
    dw_cpu_swiglu_bwd(o->dg, o->du, in->gx, in->x, in->gx, N * C);
    dw_cpu_add_fwd(o->add, in->x, in->gx, N * C);
    o->loss = dw_cpu_cross_entropy_fwd(in->logits, in->tgt, N, V);
    dw_cpu_cross_entropy_bwd(o->dlogits, in->logits, in->tgt, N, V, 1.0);
}

static void test_thread_counts_bit_identical(void **state) {
    (void)state;
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed() ^ 0x0A0A0Bull);
    inputs *in = calloc(1, sizeof *in);
    outputs *ref = malloc(sizeof *ref), *o = malloc(sizeof *o);
    assert_non_null(in), assert_non_null(ref), assert_non_null(o);
    float *all[] = {in->q, in->k, in->v, in->gq, in->x, in->w, in->b, in->gx,
                    in->wte, in->wpe, in->wl, in->bl, in->gl, in->logits};
    const int64_t len[] = {N * H * D, N * HKV * D, N * HKV * D, N * H * D, N * C, C, C, N * C,
                           V * C, T * C, M * C, M, N * M, N * V};
    for (size_t i = 0; i < sizeof len / sizeof len[0]; i++) dw_oc_fill(&r, all[i], len[i], -2, 2);
    for (int i = 0; i < N; i++) {
        in->tok[i] = (int32_t)(dw_test_next(&r) % 7); /* few distinct tokens: many repeats */
        in->tgt[i] = (i % 5 == 3) ? -100 : (int32_t)(dw_test_next(&r) % V);
    }
#ifdef _OPENMP
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
    run_all(in, ref);
    static const int counts[] = {2, 3, 7};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
#ifdef _OPENMP
        omp_set_num_threads(counts[i]);
#endif
        run_all(in, o);
        if (memcmp(ref, o, sizeof *ref) != 0) {
            const unsigned char *a = (const unsigned char *)ref, *b = (const unsigned char *)o;
            size_t at = 0;
            while (a[at] == b[at]) at++;
            fprintf(stderr, "results with %d threads differ from 1 thread at byte %zu of outputs\n",
                    counts[i], at);
            fail();
        }
    }
#ifdef _OPENMP
    omp_set_num_threads(saved);
#else
    fprintf(stderr, "built without OpenMP: checked repeatability only\n");
#endif
    free(in), free(ref), free(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_thread_counts_bit_identical)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
