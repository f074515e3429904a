/* test_profile.c — the per-op profile's file and refusals on the CPU: profile.json round trip
 * with random rows, malformed files named in the error, the CPU engine and a CPU training run
 * refused before anything is written. The timing itself runs on the GPU (gpu_test_train_cuda). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "capture/model_config.h"
#include "deepwell.h"
#include "runtime/profile.h"
#include "testutil.h"

static void random_rows(dw_prof_row *rows, int n, double *sum) {
    for (int i = 0; i < n; i++) {
        snprintf(rows[i].key, sizeof rows[i].key, "op%lld %s", (long long)dw_test_rnd(0, 1000000),
                 dw_test_rnd(0, 1) ? "fwd" : "bwd");
        rows[i].ms = dw_test_uniform(&dw_test_group_rng, 0.001f, 50.0f) * (double)dw_test_rnd(1, 7);
        *sum += rows[i].ms;
    }
}

static void test_json_round_trip(void **state) {
    (void)state;
    dw_prof_summary s = {.steps = (int)dw_test_rnd(1, 9)};
    s.n_ops = (int)dw_test_rnd(1, 40);
    s.n_roles = (int)dw_test_rnd(1, 80);
    s.ops = calloc((size_t)s.n_ops, sizeof *s.ops);
    s.roles = calloc((size_t)s.n_roles, sizeof *s.roles);
    double sum_ops = 0, sum_roles = 0;
    random_rows(s.ops, s.n_ops, &sum_ops);
    random_rows(s.roles, s.n_roles, &sum_roles);
    s.total_ms = sum_ops;
    char *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "profile.json");
    assert_int_equal(dw_prof_write_json(dw_test_ctx, &s, path), DW_OK);
    dw_prof_summary r;
    assert_int_equal(dw_prof_read_json(dw_test_ctx, path, &r), DW_OK);
    assert_int_equal(r.steps, s.steps);
    assert_int_equal(r.n_ops, s.n_ops);
    assert_int_equal(r.n_roles, s.n_roles);
    assert_true(r.total_ms == s.total_ms); /* 17 significant digits: exact */
    for (int i = 0; i < s.n_ops; i++) {
        assert_string_equal(r.ops[i].key, s.ops[i].key);
        assert_true(r.ops[i].ms == s.ops[i].ms);
    }
    for (int i = 0; i < s.n_roles; i++) {
        assert_string_equal(r.roles[i].key, s.roles[i].key);
        assert_true(r.roles[i].ms == s.roles[i].ms);
    }
    /* the printed table: every shown row, then the rest summed */
    char *txt = dw_test_path(dir, "table.txt");
    FILE *f = fopen(txt, "w");
    assert_non_null(f);
    dw_prof_print(f, &r, 3);
    fclose(f);
    f = fopen(txt, "r");
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    assert_non_null(strstr(buf, r.ops[0].key));
    assert_non_null(strstr(buf, r.roles[0].key));
    if (r.n_ops > 3 || r.n_roles > 3) assert_non_null(strstr(buf, "(the other rows)"));
    else assert_null(strstr(buf, "(the other rows)"));
    dw_prof_free(&r);
    dw_prof_free(&s);
    dw_test_rmtree(dir);
    free(txt), free(path), free(dir);
}

static void expect_bad(const char *dir, const char *name, const char *text, const char *needle) {
    char *path = dw_test_path(dir, name);
    assert_int_equal(dw_test_write(path, text, strlen(text)), 0);
    dw_prof_summary r;
    dw_status st = dw_prof_read_json(dw_test_ctx, path, &r);
    if (st == DW_OK) fail_msg("%s: accepted", name);
    const char *msg = dw_errmsg(dw_test_ctx);
    if (!strstr(msg, name) || !strstr(msg, needle)) fail_msg("%s: message '%s' lacks the file or '%s'", name, msg, needle);
    assert_null(r.ops);
    free(path);
}

static void test_malformed_files(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    expect_bad(dir, "notjson.json", "{\"steps\": 3, ", "notjson.json");
    expect_bad(dir, "nosteps.json", "{\"step_ms\": 1, \"per_op\": [], \"per_role\": []}", "steps");
    expect_bad(dir, "noarray.json", "{\"steps\": 3, \"step_ms\": 1, \"per_op\": 5, \"per_role\": []}", "per_op");
    expect_bad(dir, "badrow.json",
               "{\"steps\": 3, \"step_ms\": 1, \"per_op\": [{\"name\": \"a\", \"ms\": 1}], "
               "\"per_role\": [{\"name\": \"b\"}]}",
               "ms");
    dw_test_rmtree(dir);
    free(dir);
}

static void test_cpu_refused(void **state) {
    (void)state;
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(dw_test_ctx, "llama-tiny", &cfg), DW_OK);
    dw_engine *e = NULL;
    assert_int_equal(dw_engine_create_cpu(dw_test_ctx, &cfg, 1, 8, &e), DW_OK);
    int32_t tok[9] = {0};
    dw_prof_summary s;
    assert_int_equal(dw_prof_run(dw_test_ctx, e, tok, tok + 1, 1, 8, 3, &s), DW_ERR_UNSUPPORTED);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "CUDA engine"));
    assert_null(s.ops);
    dw_engine_free(e);
    /* a CPU training run with profile is refused before the run directory exists */
    char *dir = dw_test_tmpdir(), *out = dw_test_path(dir, "run");
    dw_train_opts o;
    dw_train_opts_default(&o);
    o.model = "llama-tiny";
    o.data = "builtin";
    o.out_dir = out;
    o.steps = 1;
    o.profile = true;
    assert_int_equal(dw_train(dw_test_ctx, &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "--profile"));
    struct stat st;
    assert_int_not_equal(stat(out, &st), 0);
    dw_test_rmtree(dir);
    free(out), free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_json_round_trip), cmocka_unit_test(test_malformed_files),
                                       cmocka_unit_test(test_cpu_refused)};
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
