/* test_bench_grouped.c — deepwell.h's dw_bench_grouped where no GPU is needed: the routings' group
 * sizes (they add up, balanced within one row, Zipf non-increasing and more skewed for a larger
 * exponent: expert 0's share grows), the cases a CPU context times on random custom shapes (every
 * routing and pass, the largest group, TFLOP/s = 2 rows K M / time; with explain, the grouped
 * registry's account naming the CPU reference), the names, and the refusals. The GPU timings are `deepwell bench grouped` on the lent GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "deepwell.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

static void test_counts(void **state) {
    (void)state;
    for (int it = 0; it < 200; it++) {
        const int64_t E = 1 + (int64_t)(dw_test_next(RNG) % 100), R = (int64_t)(dw_test_next(RNG) % 100000);
        const double s = 0.25 + (double)(dw_test_next(RNG) % 300) / 100.0;
        int64_t *b = malloc((size_t)E * sizeof *b), *z = malloc((size_t)E * sizeof *z), *z2 = malloc((size_t)E * sizeof *z2);
        assert_non_null(b), assert_non_null(z), assert_non_null(z2);
        dw_bench_grouped_counts(R, E, 0, s, b);
        dw_bench_grouped_counts(R, E, 1, s, z);
        dw_bench_grouped_counts(R, E, 1, s + 1.0, z2);
        int64_t sb = 0, sz = 0, sz2 = 0, lo = INT64_MAX, hi = 0;
        for (int64_t e = 0; e < E; e++) {
            sb += b[e], sz += z[e], sz2 += z2[e];
            lo = b[e] < lo ? b[e] : lo, hi = b[e] > hi ? b[e] : hi;
            assert_true(z[e] >= 0 && (e < 1 || z[e] <= z[e - 1]));
        }
        assert_true(sb == R && sz == R && sz2 == R);
        assert_true(hi - lo <= 1);
        /* expert 0 gets at least its share R / sum (e+1)^-s, and its share grows with s */
        double Z = 0, Z2 = 0;
        for (int64_t e = 0; e < E; e++) Z += pow((double)(e + 1), -s), Z2 += pow((double)(e + 1), -s - 1);
        assert_true((double)z[0] >= floor((double)R / Z) && (double)z2[0] >= floor((double)R / Z2));
        assert_true(1 / Z2 >= 1 / Z);
        if (E > 1 && R >= 1000 * E) assert_true(z[0] > b[0]);
        free(b), free(z), free(z2);
    }
}

typedef struct {
    int n, skipped, timed;
    int64_t max_rows[2];
    bool bad, explain; /* explain: every case must carry the account */
} heard;

static void on_case(const dw_bench_grouped_case *c, void *user) {
    heard *h = user;
    h->n++;
    const int r = !strcmp(c->routing, "zipf");
    if (c->skipped) {
        h->skipped++, h->bad = true; /* the CPU reference runs every pass */
        return;
    }
    h->timed++;
    if (h->explain != (c->explain != NULL) ||
        (c->explain && (!strstr(c->explain, c->pass) || !strstr(c->explain, "selected: grouped_cpu_reference"))))
        h->bad = true;
    h->max_rows[r] = c->max_rows;
    const double flops = 2.0 * (double)c->rows * (double)c->k * (double)c->m;
    if (!c->timed || !(c->ms > 0) || fabs(c->tflops / (flops / (c->ms * 1e9)) - 1) > 1e-9 || strcmp(c->dtype, "fp32") ||
        strcmp(c->shape, "custom"))
        h->bad = true;
}

static void test_cpu_cases(void **state) {
    (void)state;
    dw_bench_grouped_opts o;
    memset(&o, 0x5C, sizeof o);
    dw_bench_grouped_opts_init(&o, sizeof o);
    assert_true(o.size == sizeof o && o.iters == 10 && o.zipf_s == 1.0 && !o.shapes && !o.routings && !o.passes);
    o.shapes = "custom", o.iters = 1;
    o.rows = 1 + (int64_t)(dw_test_next(RNG) % 200), o.experts = 1 + (int64_t)(dw_test_next(RNG) % 9);
    o.k = 1 + (int64_t)(dw_test_next(RNG) % 40), o.m = 1 + (int64_t)(dw_test_next(RNG) % 40);
    heard h = {0};
    assert_int_equal(dw_bench_grouped(CTX, &o, on_case, &h), DW_OK);
    assert_false(h.bad);
    assert_int_equal(h.n, 6);
    assert_int_equal(h.timed, 6);
    int64_t *cnt = malloc((size_t)o.experts * sizeof *cnt);
    assert_non_null(cnt);
    for (int r = 0; r < 2; r++) {
        dw_bench_grouped_counts(o.rows, o.experts, r, o.zipf_s, cnt);
        int64_t most = 0;
        for (int64_t e = 0; e < o.experts; e++) most = cnt[e] > most ? cnt[e] : most;
        assert_int_equal(h.max_rows[r], most);
    }
    free(cnt);
    /* lists narrow the cases */
    o.routings = "zipf", o.passes = "wgrad";
    memset(&h, 0, sizeof h);
    assert_int_equal(dw_bench_grouped(CTX, &o, on_case, &h), DW_OK);
    assert_true(h.n == 1 && h.timed == 1 && !h.bad);
    assert_int_equal(dw_bench_grouped(CTX, &o, NULL, NULL), DW_OK);
    o.explain = true, o.passes = NULL; /* every case with its account */
    memset(&h, 0, sizeof h);
    h.explain = true;
    assert_int_equal(dw_bench_grouped(CTX, &o, on_case, &h), DW_OK);
    assert_true(h.n == 3 && h.timed == 3 && !h.bad);
    /* names */
    static const char *const shapes[] = {"e8", "e64", "moe-e8", "moe-e8-down", "moe-e64", "moe-e64-down"};
    for (int i = 0; i < 6; i++) assert_string_equal(dw_bench_grouped_shape_name(i), shapes[i]);
    assert_null(dw_bench_grouped_shape_name(6));
    assert_null(dw_bench_grouped_shape_name(-1));
    assert_string_equal(dw_bench_grouped_routing_name(1), "zipf");
    assert_null(dw_bench_grouped_routing_name(2));
}

static void test_refusals(void **state) {
    (void)state;
    dw_bench_grouped_opts o;
    dw_bench_grouped_opts_init(&o, sizeof o);
    assert_int_equal(dw_bench_grouped(CTX, &o, NULL, NULL), DW_ERR_INVALID); /* the CPU needs shapes */
    assert_non_null(strstr(dw_errmsg(CTX), "name the shapes"));
    o.shapes = "custom";
    assert_int_equal(dw_bench_grouped(CTX, &o, NULL, NULL), DW_ERR_INVALID); /* no custom dimensions */
    assert_non_null(strstr(dw_errmsg(CTX), "--shapes custom needs"));
    o.rows = 8, o.experts = 2, o.k = 8, o.m = 8;
    o.shapes = "custom,e9";
    assert_int_equal(dw_bench_grouped(CTX, &o, NULL, NULL), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "'e9'"));
    o.shapes = "custom", o.routings = "uniform";
    assert_int_equal(dw_bench_grouped(CTX, &o, NULL, NULL), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "'uniform'"));
    o.routings = NULL, o.passes = "fprop,bprop";
    assert_int_equal(dw_bench_grouped(CTX, &o, NULL, NULL), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "'bprop'"));
    o.passes = NULL, o.iters = 0;
    assert_int_equal(dw_bench_grouped(CTX, &o, NULL, NULL), DW_ERR_INVALID);
    o.iters = 1, o.zipf_s = 0;
    assert_int_equal(dw_bench_grouped(CTX, &o, NULL, NULL), DW_ERR_INVALID);
    o.zipf_s = 1, o.experts = 5000;
    assert_int_equal(dw_bench_grouped(CTX, &o, NULL, NULL), DW_ERR_INVALID);
    assert_int_equal(dw_bench_grouped(CTX, NULL, NULL, NULL), DW_ERR_INVALID);
    dw_bench_grouped_opts unset = {0};
    assert_int_equal(dw_bench_grouped(CTX, &unset, NULL, NULL), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "dw_bench_grouped_opts_init"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_cpu_cases),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
