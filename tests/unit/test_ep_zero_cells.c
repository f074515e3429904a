/* test_ep_zero_cells.c — the cells of ZeRO-1 with expert parallelism (train/dp_ep_zero.h) and the
 * executor's optimizer pool of several ranges (runtime/exec.h segments). On random pools (random
 * expert parameters, numel a multiple of K, at random aligned offsets in random order), worlds of 2
 * to 8 ranks and every group size K dividing them, an oracle walks the pool float by float: a dense
 * float's index among the dense floats, an expert float's index among its group's slices (in pool
 * order), each put in its part by compile/shard.h's rule and so in a rank. The cells must tile the
 * pool, give every float that rank, and each rank's held count its floats. Then each rank's cells
 * as the optimizer pool's segments: for every parameter and random dense ranges, dw_exec_moments
 * gives exactly the floats that rank holds there, contiguous, at their place in m and v. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "compile/shard.h"
#include "runtime/exec.h"
#include "testutil.h"
#include "train/dp_ep_zero.h"

/* The part of virtual float v of a space of len floats over parts (dw_shard_range's blocks). */
static int part_of(int64_t v, int64_t len, int parts) {
    for (int p = 0; p < parts; p++) {
        int64_t lo, hi;
        dw_shard_range(len, parts, p, &lo, &hi);
        if (lo <= v && v < hi) return p;
    }
    fail_msg("virtual float %lld outside its space of %lld", (long long)v, (long long)len);
    return -1;
}

/* A random pool: n expert parameters (numel a multiple of k) with dense gaps, in random order. */
static int64_t random_pool(int k, dw_ep_param *pr, int *n_out) {
    const int n = (int)dw_test_rnd(1, 6);
    int64_t at = 64 * dw_test_rnd(0, 20), order[6];
    dw_ep_param tmp[6];
    for (int i = 0; i < n; i++) {
        const int64_t numel = k * dw_test_rnd(1, 900);
        tmp[i] = (dw_ep_param){.off = at, .numel = numel};
        at = (at + numel + 63) / 64 * 64 + 64 * dw_test_rnd(0, 30); /* padding and dense parameters between */
        order[i] = i;
    }
    for (int i = n - 1; i > 0; i--) { /* dw_ep_params need not be in pool order */
        const int64_t j = dw_test_rnd(0, i), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    for (int i = 0; i < n; i++) pr[i] = tmp[order[i]];
    *n_out = n;
    return at + dw_test_rnd(0, 3000);
}

/* The oracle's rank of every float of the pool (floats), by the rule the header states. */
static void oracle(int64_t floats, const dw_ep_param *pr, int n, int world, int k, int *rank) {
    int *grp = malloc((size_t)floats * sizeof *grp); /* -1 dense, else the group */
    assert_non_null(grp);
    for (int64_t i = 0; i < floats; i++) grp[i] = -1;
    for (int q = 0; q < n; q++)
        for (int64_t e = 0; e < pr[q].numel; e++) grp[pr[q].off + e] = (int)(e / (pr[q].numel / k));
    for (int j = -1; j < k; j++) {
        int64_t len = 0, v = 0;
        for (int64_t i = 0; i < floats; i++) len += grp[i] == j;
        const int parts = j < 0 ? world : world / k;
        for (int64_t i = 0; i < floats; i++) {
            if (grp[i] != j) continue;
            const int p = part_of(v++, len, parts);
            rank[i] = j < 0 ? p : p * k + j;
        }
    }
    free(grp);
}

static void check_moments(const dw_dp_cell *c, int nc, int r, const int *rank, int64_t floats, const dw_ep_param *pr,
                          int n) {
    int64_t *seg = malloc((size_t)(2 * nc + 2) * sizeof *seg);
    dw_exec_opt_seg *os = malloc((size_t)(nc + 1) * sizeof *os);
    assert_true(seg && os);
    int ns = 0;
    for (int i = 0; i < nc; i++)
        if (c[i].rank == r) {
            if (ns && seg[2 * ns - 1] == c[i].begin) seg[2 * ns - 1] = c[i].end;
            else seg[2 * ns] = c[i].begin, seg[2 * ns + 1] = c[i].end, ns++;
        }
    const int64_t held = dw_dp_ep_cells_held(c, nc, r);
    float *m = malloc((size_t)(2 * held + 1) * sizeof *m);
    assert_non_null(m);
    for (int s = 0, at = 0; s < ns; s++) { /* m: each float's pool index, v: its negative */
        os[s] = (dw_exec_opt_seg){.lo = seg[2 * s], .hi = seg[2 * s + 1], .at = at};
        for (int64_t i = seg[2 * s]; i < seg[2 * s + 1]; i++, at++) m[at] = (float)i, m[held + at] = -(float)i;
    }
    dw_exec x;
    memset(&x, 0, sizeof x);
    x.m = m, x.v = m + held, x.opt_seg = os, x.n_opt_seg = ns;
    for (int t = 0; t < n + 40; t++) { /* every expert parameter, then random ranges in one dense gap */
        int64_t off, len;
        if (t < n) {
            off = pr[t].off, len = pr[t].numel;
        } else {
            off = dw_test_rnd(0, floats - 1), len = 1;
            while (off + len < floats && (rank[off] < 0) == (rank[off + len] < 0) && dw_test_rnd(0, 50)) len++;
            bool expert = false;
            for (int q = 0; q < n; q++) expert |= off < pr[q].off + pr[q].numel && pr[q].off < off + len;
            if (expert) continue;
        }
        int64_t first = -1, count = 0;
        for (int64_t i = off; i < off + len; i++)
            if (rank[i] == r) {
                if (first < 0) first = i;
                assert_int_equal(i, first + count); /* the rank's floats of one parameter: contiguous */
                count++;
            }
        for (int k = 0; k < 2; k++) {
            int64_t skip = -1, got = -1;
            const float *p = dw_exec_moments(&x, k, off, len, &skip, &got);
            assert_int_equal(got, count);
            if (!count) {
                assert_null(p);
                continue;
            }
            assert_int_equal(off + skip, first);
            for (int64_t i = 0; i < count; i++) assert_true(p[i] == (k ? -1.0f : 1.0f) * (float)(first + i));
        }
    }
    free(seg), free(os), free(m);
}

static void test_cells(void **state) {
    (void)state;
    for (int trial = 0; trial < 60; trial++) {
        const int world = (int)dw_test_rnd(1, 4) * 2;
        int k;
        do k = (int)dw_test_rnd(1, world);
        while (world % k);
        dw_ep_param pr[6];
        int n = 0;
        const int64_t floats = random_pool(k, pr, &n);
        int *rank = malloc((size_t)floats * sizeof *rank);
        assert_non_null(rank);
        oracle(floats, pr, n, world, k, rank);
        dw_dp_cell *c = NULL;
        const int nc = dw_dp_ep_cells(floats, pr, n, world, k, &c);
        assert_true(nc > 0);
        int64_t at = 0;
        for (int i = 0; i < nc; i++) { /* tiling, each float's rank the oracle's */
            assert_int_equal(c[i].begin, at);
            assert_true(c[i].end > c[i].begin);
            assert_int_equal(c[i].rank, c[i].j < 0 ? c[i].part : c[i].part * k + c[i].j);
            for (int64_t f = c[i].begin; f < c[i].end; f++)
                if (rank[f] != c[i].rank) fail_msg("float %lld: cell rank %d, oracle %d", (long long)f, c[i].rank, rank[f]);
            at = c[i].end;
        }
        assert_int_equal(at, floats);
        int64_t total = 0;
        for (int r = 0; r < world; r++) {
            int64_t want = 0;
            for (int64_t f = 0; f < floats; f++) want += rank[f] == r;
            assert_int_equal(dw_dp_ep_cells_held(c, nc, r), want);
            total += want;
            check_moments(c, nc, r, rank, floats, pr, n);
        }
        assert_int_equal(total, floats);
        free(c), free(rank);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cells),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
