/* moe_route.h — test helpers for token dropping (test_moe_capacity.c, test_moe_drop.c,
 * test_moe_counts.c, test_moe_memplan.c): random MoE routings as a router gives them (K distinct
 * experts per token), uniform or skewed, a dispatch's outputs against an oracle's, and mixtral-tiny's CPU engine with a capacity and drop policy. Include after
 * <cmocka.h>. */
#ifndef DW_TEST_MOE_ROUTE_H
#define DW_TEST_MOE_ROUTE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "testutil.h"

/* idx (N,K), malloc'd: each token's first K of a random permutation of the E <= 64 experts; skew 0
 * uniform, 1 expert 0 first in every token, 2 expert 0 first in about half the tokens. */
static inline int32_t *dw_test_moe_routing(dw_test_rng *r, int64_t N, int64_t K, int64_t E, int skew) {
    int32_t *idx = malloc((size_t)(N * K) * sizeof *idx);
    int32_t perm[64];
    if (!idx || E > 64) abort();
    for (int64_t n = 0; n < N; n++) {
        for (int64_t e = 0; e < E; e++) perm[e] = (int32_t)e;
        for (int64_t e = E - 1; e > 0; e--) { /* Fisher-Yates */
            const int64_t j = (int64_t)(dw_test_next(r) % (uint64_t)(e + 1));
            const int32_t t = perm[e];
            perm[e] = perm[j], perm[j] = t;
        }
        if (skew == 1 || (skew == 2 && dw_test_next(r) % 2))
            for (int64_t e = 0; e < E; e++)
                if (perm[e] == 0) perm[e] = perm[0], perm[0] = 0;
        memcpy(idx + n * K, perm, (size_t)K * sizeof *idx);
    }
    return idx;
}

/* A dispatch's outputs against an oracle's offsets woff (E+1) and rows wpos (N,K): offsets, rows,
 * each kept row a copy of its token's x (N,C), zeros past the kept up to the rows the dispatch holds
 * (min(N K, E cap)) and the NaN the caller poisoned xs with past those; the mismatches. */
static inline int64_t dw_test_moe_check_dispatch(const float *xs, const int32_t *off, const int32_t *pos,
                                                 const float *x, const int32_t *woff, const int32_t *wpos, int64_t N,
                                                 int64_t C, int64_t K, int64_t E, int64_t cap) {
    const int64_t A = N * K, R = E * cap < A ? E * cap : A;
    int64_t bad = 0, dropped = 0;
    for (int64_t e = 0; e <= E; e++) bad += off[e] != woff[e];
    for (int64_t a = 0; a < A; a++) {
        bad += pos[a] != wpos[a];
        dropped += wpos[a] < 0;
        if (wpos[a] >= 0) bad += memcmp(xs + (int64_t)wpos[a] * C, x + (a / K) * C, (size_t)C * 4) != 0;
    }
    for (int64_t i = (int64_t)woff[E] * C; i < A * C; i++) bad += i < R * C ? xs[i] != 0.0f : !isnan(xs[i]);
    return bad + (woff[E] + dropped != A);
}

/* mixtral-tiny captured at B x T with capacity factor and drop policy (by_weight: "probs"), every
 * dispatch node checked to carry them; its CPU engine with weights drawn from r. */
static inline void dw_test_moe_tiny(dw_ctx *ctx, double factor, bool by_weight, int64_t B, int64_t T, dw_test_rng r,
                                    dw_test_model *m) {
    dw_model_config c;
    assert_int_equal(dw_model_config_load(ctx, "mixtral-tiny", &c), DW_OK);
    c.capacity_factor = factor, c.drop_by_weight = by_weight;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(ctx, &c, B, T, &g), DW_OK);
    int dispatches = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == DW_OP_MOE_DISPATCH) {
            assert_true(g->nodes[i].attrs.capacity_factor == factor);
            assert_int_equal(g->nodes[i].n_in, by_weight && factor > 0 ? 3 : 2); /* the weights rank */
            dispatches++;
        }
    assert_int_equal(dispatches, c.n_layers);
    assert_int_equal(dw_test_model_build(ctx, g, NULL, DW_DEVICE_AUTO, m), DW_OK);
    dw_test_random_params(m->e, &r, 0.3f, NULL, 0.3f);
}

#endif /* DW_TEST_MOE_ROUTE_H */
