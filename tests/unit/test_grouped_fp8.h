/* test_grouped_fp8.h — helpers of the quantised grouped GEMMs' CPU tests (test_grouped_fp8.c,
 * test_grouped_fp8_wgrad.c, test_grouped_mxfp8.c, test_mxfp8_grouped_wgrad.c): random operands,
 * FORMATS.md's fp8_block scale rule written again, skewed routings, and wgrad's padded layout
 * (each expert's rows padded to the recipe's block: 128 or 32) written again. Static functions:
 * include once per test program. */
#ifndef DW_TEST_GROUPED_FP8_H
#define DW_TEST_GROUPED_FP8_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

/* Values spread over several binades, with an all-zero 128-block now and then. */
static float *randv(int64_t n, bool zero_blocks) {
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = dw_test_uniform(RNG, -1, 1) * ldexpf(1.0f, (int)dw_test_rnd(-6, 6));
    if (zero_blocks && n >= 128 && dw_test_rnd(0, 1)) memset(v + 128 * dw_test_rnd(0, n / 128 - 1), 0, 128 * sizeof *v);
    return v;
}

/* FORMATS.md's fp8_block scale of a block with this amax, written again. */
static float rule_scale(float amax) {
    const float s = amax / 448.0f;
    return s == 0.0f ? 1.0f : s;
}

/* Groups of R rows over E experts: 0 random, 1 all to one, 2 odd experts empty, 3 one row; some
 * rows left past the groups. */
static void route(int kind, int64_t E, int64_t R, int32_t *off) {
    const int64_t used = kind == 3 ? 1 : R - dw_test_rnd(0, R / 4), one = dw_test_rnd(0, E - 1);
    int64_t left = used;
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t n = kind == 1 || kind == 3 ? (e == one ? left : 0) : kind == 2 && e % 2 ? 0 : dw_test_rnd(0, left);
        if (e == E - 1 && !(kind == 1 || kind == 3) && !(kind == 2 && e % 2)) n = left;
        left -= n;
        off[e + 1] = (int32_t)(off[e] + n);
    }
}

/* wgrad's routings: 0..3 as route() (random, all to one, odd experts empty, one row); 4: every
 * group's size one of 0, 1, block - 1, block, block + 1, 2 block (blocks filled exactly, by one row
 * more or less). Returns R (some rows left past the groups). */
static inline int64_t wgrad_routing(int kind, int64_t E, int64_t block, int32_t *off) {
    const int64_t sizes[] = {0, 1, block - 1, block, block + 1, 2 * block};
    if (kind < 4) {
        const int64_t R = kind == 3 ? dw_test_rnd(1, 3) : dw_test_rnd(2, 400);
        route(kind, E, R, off);
        return R;
    }
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) off[e + 1] = (int32_t)(off[e] + sizes[dw_test_rnd(0, 5)]);
    return off[E] + dw_test_rnd(0, 5);
}

/* wgrad's padded layout, written again: the first column of each expert's rows, each group padded
 * to a multiple of block (E+1 values; free it). */
static inline int64_t *padded_starts(const int32_t *off, int64_t E, int64_t block) {
    int64_t *pad = malloc((size_t)(E + 1) * sizeof *pad);
    pad[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = off[e + 1] - off[e];
        pad[e + 1] = pad[e] + block * (n / block + (n % block != 0));
    }
    return pad;
}

/* A wgrad operand x (R, C) with NaN in the rows past the groups (the quantiser must not read them). */
static inline float *wgrad_operand(int64_t R, int64_t C, const int32_t *off, int64_t E) {
    float *x = randv(R * C, true);
    for (int64_t i = (int64_t)off[E] * C; i < R * C; i++) x[i] = NAN;
    return x;
}

#endif /* DW_TEST_GROUPED_FP8_H */
