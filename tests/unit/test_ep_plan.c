/* test_ep_plan.c — expert parallelism's index bookkeeping (train/ep_plan.c) against a brute-force
 * oracle, on fresh random layouts (world W, group G | W, E a multiple of G) and routings (each
 * rank a random number of rows per expert, empty experts and all-to-one-expert included). Every
 * row carries a tag (source rank, its row in the source's dispatch order); the all-to-alls of the
 * counts and of the rows are simulated in memory as comm.h defines them. Asserted exactly: the
 * owner of each expert is the one rank of the group whose range holds it; each owner's
 * expert-order rows are, expert by expert, source 0's rows of that expert then source 1's ...;
 * the expert-order offsets; perm and back are inverse; and the way back (gather by back, the
 * all-to-all with the counts swapped) returns every rank its own rows in its dispatch order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "train/ep_plan.h"

/* An all-to-all of int64 values among W simulated ranks: send[r] holds sc[r][d] values for each d
 * in rank order; recv[d] gets them from each s in rank order. rc[d][s] = sc[s][d]. */
static void all_to_all(int W, int64_t **send, int64_t **sc, int64_t **recv) {
    for (int d = 0; d < W; d++) {
        int64_t at = 0;
        for (int s = 0; s < W; s++) {
            int64_t from = 0;
            for (int q = 0; q < d; q++) from += sc[s][q];
            memcpy(recv[d] + at, send[s] + from, (size_t)sc[s][d] * sizeof(int64_t));
            at += sc[s][d];
        }
    }
}

static int64_t **rows_of(int W, int64_t n) {
    int64_t **p = calloc((size_t)W, sizeof *p);
    for (int r = 0; r < W; r++) p[r] = calloc((size_t)(n ? n : 1), sizeof **p);
    return p;
}
static void free_rows(int W, int64_t **p) {
    for (int r = 0; r < W; r++) free(p[r]);
    free(p);
}

static void one_case(int W, int G, int64_t E, int skew) {
    const int64_t El = E / G, cap = 40 * E; /* rows per rank at most (a dispatch's N x K) */
    int32_t **off = calloc((size_t)W, sizeof *off);
    int64_t **cnt = rows_of(W, E), **cs = rows_of(W, W), **srows = rows_of(W, W), **rcnt = rows_of(W, E);
    int64_t **rrows = rows_of(W, W), **tags = rows_of(W, cap), **recv = rows_of(W, (int64_t)W * cap);
    for (int r = 0; r < W; r++) { /* a routing: rows per expert, grouped in expert order */
        off[r] = calloc((size_t)E + 1, sizeof **off);
        const int64_t hot = dw_test_rnd(0, E - 1);
        for (int64_t e = 0; e < E; e++) {
            int64_t n = skew == 0 ? dw_test_rnd(0, 5) : skew == 1 ? (e == hot ? dw_test_rnd(1, 30) : 0)
                                                                  : (dw_test_rnd(0, 2) ? 0 : dw_test_rnd(1, 8));
            off[r][e + 1] = off[r][e] + (int32_t)n;
        }
        for (int64_t i = 0; i < off[r][E]; i++) tags[r][i] = (int64_t)r * cap + i;
        dw_ep_layout l = {.rank = r, .world = W, .group = G, .experts = E};
        for (int64_t e = 0; e < E; e++) { /* the owner: the one rank of the group whose range holds e */
            int owners = 0, who = -1;
            for (int q = r - r % G; q < r - r % G + G; q++) {
                dw_ep_layout m = {.rank = q, .world = W, .group = G, .experts = E};
                if (e >= dw_ep_first_expert(&m) && e < dw_ep_first_expert(&m) + El) owners++, who = q;
            }
            assert_int_equal(owners, 1);
            assert_int_equal(dw_ep_owner(&l, e), who);
        }
        dw_ep_send_plan(&l, off[r], srows[r], cnt[r], cs[r]);
        int64_t total = 0;
        for (int d = 0; d < W; d++) {
            assert_true(d / G == r / G || (srows[r][d] == 0 && cs[r][d] == 0)); /* nothing leaves the group */
            total += srows[r][d];
        }
        assert_int_equal(total, off[r][E]);
    }
    all_to_all(W, cnt, cs, rcnt);
    all_to_all(W, tags, srows, recv);
    for (int r = 0; r < W; r++) {
        dw_ep_layout l = {.rank = r, .world = W, .group = G, .experts = E};
        const int64_t lo = dw_ep_first_expert(&l);
        int32_t *eoff = calloc((size_t)E + 1, sizeof *eoff), *perm = calloc((size_t)W * cap + 1, sizeof *perm),
                *back = calloc((size_t)W * cap + 1, sizeof *back);
        const int64_t n = dw_ep_recv_plan(&l, rcnt[r], rrows[r], eoff, perm, back);
        /* oracle: expert by expert, the group's sources in rank order, each source's rows in order */
        int64_t at = 0;
        for (int64_t e = 0; e < E; e++) {
            assert_int_equal(eoff[e], at);
            if (e < lo || e >= lo + El) continue;
            for (int s = r - r % G; s < r - r % G + G; s++)
                for (int64_t i = off[s][e]; i < off[s][e + 1]; i++, at++)
                    assert_int_equal(recv[r][perm[at]], tags[s][i]);
        }
        assert_int_equal(eoff[E], at);
        assert_int_equal(n, at);
        for (int s = 0; s < W; s++) assert_int_equal(rrows[r][s], srows[s][r]);
        for (int64_t i = 0; i < n; i++) assert_int_equal(back[perm[i]], i);
        int64_t *ret = calloc((size_t)n + 1, sizeof *ret); /* the way back: expert order to source order */
        for (int64_t j = 0; j < n; j++) ret[j] = recv[r][perm[back[j]]];
        memcpy(recv[r], ret, (size_t)n * sizeof *ret);
        free(ret);
        free(eoff), free(perm), free(back);
    }
    int64_t **home = rows_of(W, cap);
    all_to_all(W, recv, rrows, home);
    for (int r = 0; r < W; r++)
        for (int64_t i = 0; i < off[r][E]; i++) assert_int_equal(home[r][i], tags[r][i]);
    free_rows(W, home);
    for (int r = 0; r < W; r++) free(off[r]);
    free(off);
    free_rows(W, cnt), free_rows(W, cs), free_rows(W, srows), free_rows(W, rcnt), free_rows(W, rrows);
    free_rows(W, tags), free_rows(W, recv);
}

static void test_random_layouts(void **state) {
    (void)state;
    static const int layouts[][2] = {{1, 1}, {2, 1}, {2, 2}, {4, 2}, {4, 4}, {6, 3}, {8, 4}, {8, 2}};
    for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++)
        for (int skew = 0; skew < 3; skew++) {
            const int W = layouts[k][0], G = layouts[k][1];
            one_case(W, G, (int64_t)G * dw_test_rnd(1, 4), skew);
        }
}

/* A hand-worked case: 2 ranks, 4 experts; rank 0 routes 1,2,0,3 rows, rank 1 2,0,1,1. */
static void test_hand_case(void **state) {
    (void)state;
    const int32_t off0[5] = {0, 1, 3, 3, 6}, off1[5] = {0, 2, 2, 3, 4};
    dw_ep_layout l0 = {.rank = 0, .world = 2, .group = 2, .experts = 4}, l1 = l0;
    l1.rank = 1;
    int64_t s[2], c[4], cs[2];
    dw_ep_send_plan(&l0, off0, s, c, cs);
    assert_int_equal(s[0], 3), assert_int_equal(s[1], 3), assert_int_equal(cs[0], 2);
    dw_ep_send_plan(&l1, off1, s, c, cs);
    assert_int_equal(s[0], 2), assert_int_equal(s[1], 2);
    /* rank 1 owns experts 2, 3: counts (0, 3) from rank 0, (1, 1) from rank 1 */
    const int64_t rc[4] = {0, 3, 1, 1};
    int64_t rr[2];
    int32_t off[5], perm[5], back[5];
    assert_int_equal(dw_ep_recv_plan(&l1, rc, rr, off, perm, back), 5);
    assert_int_equal(rr[0], 3), assert_int_equal(rr[1], 2);
    const int32_t want_off[5] = {0, 0, 0, 1, 5}, want_perm[5] = {3, 0, 1, 2, 4};
    assert_memory_equal(off, want_off, sizeof off);
    assert_memory_equal(perm, want_perm, sizeof perm);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_hand_case), cmocka_unit_test(test_random_layouts)};
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
