/* test_bench_api.c — deepwell.h's benchmark entry points where no GPU is needed: options
 * (defaults, size), the shape and recipe names, dw_bench_gemm's explanations on a CPU context
 * against dw_gemm_explain (every case, in order, none timed), and the refusals: unknown names,
 * bad options, no GPU. The timings themselves run on a GPU (deepwell bench). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepwell.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

static void test_opts_and_names(void **state) {
    (void)state;
    dw_bench_quant_opts q;
    memset(&q, 0x5C, sizeof q);
    dw_bench_quant_opts_init(&q, sizeof q);
    assert_int_equal(q.size, sizeof q);
    assert_true(q.rows == 8192 && q.cols == 8192 && q.iters == 50 && q.batch == 10);
    assert_true(q.kernel == 0 && q.stages == 0 && q.ctas_per_sm == 0 && q.t_store == 0 && q.load == 0 &&
                q.group == 0 && q.tile_block == 0);
    dw_bench_gemm_opts g;
    memset(&g, 0x5C, sizeof g);
    dw_bench_gemm_opts_init(&g, sizeof g);
    assert_int_equal(g.size, sizeof g);
    assert_true(g.iters == 20 && !g.explain && !g.shapes && !g.recipes && !g.backend);
    unsigned char buf[sizeof(dw_bench_gemm_opts) + 8];
    memset(buf, 0x5C, sizeof buf);
    size_t old = offsetof(dw_bench_gemm_opts, backend);
    dw_bench_gemm_opts_init((dw_bench_gemm_opts *)(void *)buf, old);
    for (size_t i = old; i < sizeof buf; i++) assert_int_equal(buf[i], 0x5C);
    static const char *const shapes[] = {"square", "gpt2", "llama", "vocab"};
    static const char *const recipes[] = {"bf16", "fp8_tensor", "fp8_block", "fp8_block_1x128", "mxfp8"};
    for (int i = 0; i < 4; i++) assert_string_equal(dw_bench_gemm_shape_name(i), shapes[i]);
    for (int i = 0; i < 5; i++) assert_string_equal(dw_bench_gemm_recipe_name(i), recipes[i]);
    assert_null(dw_bench_gemm_shape_name(4));
    assert_null(dw_bench_gemm_recipe_name(5));
    assert_null(dw_bench_gemm_shape_name(-1));
}

/* What the callback heard: room for every case (4 shapes' 15 cases × 5 recipes = 75). */
enum { HEARD_MAX = 128 };
typedef struct {
    int n;
    int64_t m[HEARD_MAX], k[HEARD_MAX];
    char recipe[HEARD_MAX][24];
    int bad;
} heard;

static void on_case(const dw_bench_gemm_case *c, void *user) {
    heard *h = user;
    if (c->timed || c->skipped || !c->explain || h->n >= HEARD_MAX) {
        h->bad++;
        return;
    }
    /* the explanation is dw_gemm_explain's for this case's operands */
    if (!strstr(c->explain, "selected") && !strstr(c->explain, "no eligible")) h->bad++;
    h->m[h->n] = c->m, h->k[h->n] = c->k;
    snprintf(h->recipe[h->n], sizeof h->recipe[0], "%s", c->recipe);
    h->n++;
}

static void test_gemm_explain_cpu(void **state) {
    (void)state;
    /* a random subset of the shapes and recipes, named in a random order */
    char shapes[64] = "", recipes[96] = "";
    int ns = 0, nr = 0;
    bool want_s[4] = {false}, want_r[5] = {false};
    for (int i = 3; i >= 0; i--)
        if (dw_test_next(RNG) % 2 || (i == 0 && !ns)) {
            snprintf(shapes + strlen(shapes), sizeof shapes - strlen(shapes), "%s%s", ns++ ? "," : "",
                     dw_bench_gemm_shape_name(i));
            want_s[i] = true;
        }
    for (int i = 4; i >= 0; i--)
        if (dw_test_next(RNG) % 2 || (i == 0 && !nr)) {
            snprintf(recipes + strlen(recipes), sizeof recipes - strlen(recipes), "%s%s", nr++ ? "," : "",
                     dw_bench_gemm_recipe_name(i));
            want_r[i] = true;
        }
    dw_bench_gemm_opts o;
    dw_bench_gemm_opts_init(&o, sizeof o);
    o.shapes = shapes, o.recipes = recipes, o.explain = true;
    heard h = {0};
    assert_int_equal(dw_bench_gemm(CTX, &o, on_case, &h), DW_OK);
    assert_int_equal(h.bad, 0);
    static const int per_shape[4] = {1, 9, 2, 3};
    int cases = 0, sel_r = 0;
    for (int i = 0; i < 4; i++) cases += want_s[i] ? per_shape[i] : 0;
    for (int i = 0; i < 5; i++) sel_r += want_r[i];
    assert_int_equal(h.n, cases * sel_r);
    /* fixed order: shapes as listed in the table, each with the recipes in table order */
    int r0 = 0;
    while (!want_r[r0]) r0++;
    assert_string_equal(h.recipe[0], dw_bench_gemm_recipe_name(r0));
    if (want_s[0]) assert_true(h.m[0] == 8192 && h.k[0] == 8192);
    else if (want_s[1]) assert_true(h.m[0] == 16384 && h.k[0] == 768);
    /* no callback is fine too */
    assert_int_equal(dw_bench_gemm(CTX, &o, NULL, NULL), DW_OK);
}

static void test_refusals(void **state) {
    (void)state;
    dw_bench_gemm_opts o;
    dw_bench_gemm_opts_init(&o, sizeof o);
    o.explain = true;
    o.shapes = "square,cube";
    assert_int_equal(dw_bench_gemm(CTX, &o, NULL, NULL), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "'cube'"));
    o.shapes = NULL, o.recipes = "bf16,fp9";
    assert_int_equal(dw_bench_gemm(CTX, &o, NULL, NULL), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "'fp9'"));
    o.recipes = NULL, o.iters = 0;
    assert_int_equal(dw_bench_gemm(CTX, &o, NULL, NULL), DW_ERR_INVALID);
    o.iters = 20, o.explain = false;
    assert_int_equal(dw_bench_gemm(CTX, &o, NULL, NULL), DW_ERR_UNSUPPORTED); /* a CPU context times nothing */
    assert_int_equal(dw_bench_gemm(CTX, NULL, NULL, NULL), DW_ERR_INVALID);
    dw_bench_gemm_opts unset = {0};
    assert_int_equal(dw_bench_gemm(CTX, &unset, NULL, NULL), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "dw_bench_gemm_opts_init"));

    dw_bench_quant_opts q;
    dw_bench_quant_opts_init(&q, sizeof q);
    q.rows = 70000, q.cols = 70000;
    assert_int_equal(dw_bench_quant(CTX, &q, NULL, NULL), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "[70000, 70000]"));
    q.rows = q.cols = 256, q.batch = 0;
    assert_int_equal(dw_bench_quant(CTX, &q, NULL, NULL), DW_ERR_INVALID);
    q.batch = 1;
    /* a CPU context: no GPU to time (or no CUDA in the build), said as such */
    assert_int_equal(dw_bench_quant(CTX, &q, NULL, NULL), DW_ERR_UNSUPPORTED);
    assert_true(strstr(dw_errmsg(CTX), "no CUDA GPU") || strstr(dw_errmsg(CTX), "no CUDA (configured"));
    assert_int_equal(dw_bench_quant(CTX, NULL, NULL, NULL), DW_ERR_INVALID);
    dw_bench_quant_opts qunset = {0};
    assert_int_equal(dw_bench_quant(CTX, &qunset, NULL, NULL), DW_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opts_and_names),
        cmocka_unit_test(test_gemm_explain_cpu),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
