/* test_profile.c — the per-op profile: profile.json round trip with random rows, malformed files
 * named in the error; dw_engine_profile on the CPU engine (host-clock timers): one row per op and
 * direction the program runs and per node role, each table summing to the step's time, the
 * optimizer's rows, text and JSON forms, weights changed only when the optimizer is profiled;
 * dw_train's profile on the CPU writes profile.json. The CUDA timings are gpu_test_train_cuda's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compile/program.h"
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

/* "h.11.attn.c_proj" -> "h.#.attn.c_proj" (restated: every run of digits becomes '#'). */
static void role_of(const char *name, char *out, size_t cap) {
    size_t o = 0;
    for (const char *p = name; *p && o + 1 < cap; p++) {
        out[o++] = (*p >= '0' && *p <= '9') ? '#' : *p;
        while (*p >= '0' && *p <= '9' && p[1] >= '0' && p[1] <= '9') p++;
    }
    out[o] = 0;
}

/* The distinct keys of the program's forward and backward steps: "<op> <dir>" or "<role> <dir>". */
static int expected_keys(const dw_compiled *c, bool roles, char keys[][96], int cap) {
    int n = 0;
    for (int s = c->phase[DW_PHASE_FORWARD][0]; s < c->phase[DW_PHASE_BACKWARD][1]; s++) {
        const dw_step *st = &c->steps[s];
        assert_true(st->kind == DW_STEP_FWD || st->kind == DW_STEP_BWD);
        const dw_ir_node *node = &c->g->nodes[st->node];
        char key[96], role[80];
        role_of(node->name, role, sizeof role);
        snprintf(key, sizeof key, "%s %s", roles ? role : dw_op_name(node->op),
                 st->kind == DW_STEP_FWD ? "fwd" : "bwd");
        int k = 0;
        while (k < n && strcmp(keys[k], key)) k++;
        if (k == n) {
            assert_true(n < cap);
            snprintf(keys[n++], 96, "%s", key);
        }
    }
    return n;
}

/* Rows: exactly the expected keys, each once, non-negative, largest first, summing to total. */
static void check_rows(const dw_prof_row *rows, int n, char want[][96], int n_want, double total, const char *what) {
    if (n != n_want) fail_msg("%s: %d rows, the program has %d keys", what, n, n_want);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < n_want && strcmp(want[k], rows[i].key)) k++;
        if (k == n_want) fail_msg("%s: row '%s' is no step of the program", what, rows[i].key);
        want[k][0] = 0; /* each key once */
        assert_true(rows[i].ms >= 0 && isfinite(rows[i].ms));
        if (i) assert_true(rows[i].ms <= rows[i - 1].ms);
        sum += rows[i].ms;
    }
    if (!(fabs(sum - total) <= 1e-9 * total + 1e-12)) fail_msg("%s: rows sum to %.17g, total %.17g", what, sum, total);
}

static int64_t numel(dw_engine *e, int i) {
    int64_t shape[4], n = 1;
    for (int d = dw_engine_param_shape(e, i, shape); d > 0; d--) n *= shape[d - 1];
    return n;
}

/* Whether parameter 0..n of e still equal the saved copies. */
static bool weights_equal(dw_engine *e, float **saved) {
    bool same = true;
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        float *p = malloc((size_t)numel(e, i) * sizeof *p);
        assert_int_equal(dw_engine_param_read(e, i, p), DW_OK);
        same = same && !memcmp(p, saved[i], (size_t)numel(e, i) * sizeof *p);
        free(p);
    }
    return same;
}

static void test_cpu_profile(void **state) {
    (void)state;
    static const char *const presets[3] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};
    static const char *const precs[3] = {NULL, "bf16", "mxfp8"};
    for (int rep = 0; rep < 3; rep++) {
        const int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(2, 8);
        dw_graph *g = dw_test_small_graph(dw_test_ctx, presets[dw_test_rnd(0, 2)], B, T, &dw_test_group_rng);
        assert_non_null(g);
        dw_test_model m;
        assert_int_equal(dw_test_model_build(dw_test_ctx, g, precs[rep], DW_DEVICE_AUTO, &m), DW_OK);
        assert_int_equal(dw_engine_init_weights(m.e, dw_test_next(&dw_test_group_rng)), DW_OK);
        int32_t tok[16], tgt[16];
        for (int64_t i = 0; i < B * T; i++) {
            tok[i] = (int32_t)dw_test_rnd(0, dw_graph_vocab(g) - 1);
            tgt[i] = (int32_t)dw_test_rnd(0, dw_graph_vocab(g) - 1);
        }
        const int np = dw_engine_param_count(m.e);
        float **saved = calloc((size_t)np, sizeof *saved);
        for (int i = 0; i < np; i++) {
            saved[i] = malloc((size_t)numel(m.e, i) * sizeof(float));
            assert_int_equal(dw_engine_param_read(m.e, i, saved[i]), DW_OK);
        }
        /* refusals first: nothing timed, nothing returned */
        dw_profile *p = (dw_profile *)saved;
        assert_int_equal(dw_engine_profile(m.e, tok, tgt, B, T, 0, false, &p), DW_ERR_INVALID);
        assert_null(p);
        p = (dw_profile *)saved;
        assert_int_equal(dw_engine_profile(m.e, tok, tgt, B + 1 + dw_graph_batch(g), T, 1, false, &p), DW_ERR_INVALID);
        assert_null(p);
        /* the forward/backward alone leaves the weights */
        const int steps = (int)dw_test_rnd(1, 3);
        assert_int_equal(dw_engine_profile(m.e, tok, tgt, B, T, steps, false, &p), DW_OK);
        assert_true(weights_equal(m.e, saved));
        char *text = dw_profile_text(p, 0);
        assert_non_null(text);
        assert_non_null(strstr(text, "per op"));
        assert_null(strstr(text, "optimizer step"));
        dw_free_string(text);
        dw_profile_free(p);
        /* with the optimizer: tables, text, JSON, file */
        assert_int_equal(dw_engine_profile(m.e, tok, tgt, B, T, steps, true, &p), DW_OK);
        assert_false(weights_equal(m.e, saved));
        const double total = dw_profile_step_ms(p);
        assert_true(total > 0 && isfinite(total));
        char *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "profile.json");
        assert_int_equal(dw_profile_save(dw_test_ctx, p, path), DW_OK);
        dw_prof_summary s;
        assert_int_equal(dw_prof_read_json(dw_test_ctx, path, &s), DW_OK);
        assert_int_equal(s.steps, steps);
        assert_true(s.total_ms == total);
        const dw_compiled *c = dw_engine_program(m.e);
        char (*keys)[96] = calloc(256, sizeof *keys);
        int nk = expected_keys(c, false, keys, 256);
        check_rows(s.ops, s.n_ops, keys, nk, total, "per op");
        nk = expected_keys(c, true, keys, 256);
        check_rows(s.roles, s.n_roles, keys, nk, total, "per role");
        /* text: both tables and the optimizer's; JSON fields: the same rows and the optimizer's */
        text = dw_profile_text(p, 0);
        assert_non_null(text);
        assert_non_null(strstr(text, "per op"));
        assert_non_null(strstr(text, "per node role"));
        assert_non_null(strstr(text, "optimizer step"));
        for (int i = 0; i < s.n_ops; i++) assert_non_null(strstr(text, s.ops[i].key));
        dw_free_string(text);
        char *fields = dw_profile_json_fields(p);
        assert_non_null(fields);
        size_t len = strlen(fields) + 3;
        char *obj = malloc(len);
        snprintf(obj, len, "{%s}", fields);
        json_t *j = json_loads(obj, 0, NULL);
        if (!j) fail_msg("dw_profile_json_fields is not JSON inside braces: %s", fields);
        assert_true(fabs(json_number_value(json_object_get(j, "profile_eager_ms")) - total) <= 1e-4 + 1e-6 * total);
        assert_int_equal(json_array_size(json_object_get(j, "per_op")), s.n_ops);
        assert_int_equal(json_array_size(json_object_get(j, "per_role")), s.n_roles);
        const json_t *opt = json_object_get(j, "optimizer");
        assert_true(json_is_array(opt));
        /* the optimizer's rows: zeroing, then each step kind of its phase once, in program order */
        const char *want[8] = {"zero grad"};
        int nw = 1;
        for (int k = c->phase[DW_PHASE_OPTIMIZER][0]; k < c->phase[DW_PHASE_OPTIMIZER][1]; k++) {
            const char *name = dw_step_kind_name((dw_step_kind)c->steps[k].kind);
            int q = 1;
            while (q < nw && strcmp(want[q], name)) q++;
            if (q == nw) want[nw++] = name;
        }
        assert_int_equal(json_array_size(opt), nw);
        for (int q = 0; q < nw; q++) {
            const json_t *row = json_array_get(opt, (size_t)q);
            assert_string_equal(json_string_value(json_object_get(row, "name")), want[q]);
            assert_true(json_number_value(json_object_get(row, "ms")) >= 0);
        }
        json_decref(j);
        free(obj);
        dw_free_string(fields);
        /* the file loads back as a profile of the same step time */
        dw_profile *back = NULL;
        assert_int_equal(dw_profile_load(dw_test_ctx, path, &back), DW_OK);
        assert_true(dw_profile_step_ms(back) == total);
        dw_profile_free(back);
        dw_profile_free(p);
        dw_prof_free(&s);
        free(keys);
        for (int i = 0; i < np; i++) free(saved[i]);
        free(saved);
        dw_test_model_free(&m);
        dw_test_rmtree(dir);
        free(path), free(dir);
    }
}

/* dw_train with profile on the CPU: after the last step, out_dir/profile.json. */
static void test_train_profile(void **state) {
    (void)state;
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = 1;
    mo.seq = 8;
    mo.weights = DW_WEIGHTS_RANDOM;
    dw_model *model = NULL;
    assert_int_equal(dw_model_open(dw_test_ctx, "llama-tiny", &mo, &model), DW_OK);
    char *dir = dw_test_tmpdir(), *out = dw_test_path(dir, "run"), *pj = dw_test_path(out, "profile.json");
    dw_train_opts o;
    dw_train_opts_init(&o, sizeof o);
    o.data = "builtin";
    o.out_dir = out;
    o.steps = 2;
    o.batch = 1;
    o.seq = 8;
    o.global_batch = 1;
    o.eval_every = 0;
    o.profile = true;
    assert_int_equal(dw_train(dw_model_engine(model), &o), DW_OK);
    dw_profile *p = NULL;
    assert_int_equal(dw_profile_load(dw_test_ctx, pj, &p), DW_OK);
    assert_true(dw_profile_step_ms(p) > 0);
    dw_prof_summary s;
    assert_int_equal(dw_prof_read_json(dw_test_ctx, pj, &s), DW_OK);
    assert_int_equal(s.steps, 3);
    char (*keys)[96] = calloc(256, sizeof *keys);
    int nk = expected_keys(dw_engine_program(dw_model_engine(model)), false, keys, 256);
    check_rows(s.ops, s.n_ops, keys, nk, s.total_ms, "per op");
    free(keys);
    dw_prof_free(&s);
    dw_profile_free(p);
    dw_model_free(model);
    dw_test_rmtree(dir);
    free(pj), free(out), free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_json_round_trip), cmocka_unit_test(test_malformed_files),
                                       cmocka_unit_test(test_cpu_profile), cmocka_unit_test(test_train_profile)};
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
