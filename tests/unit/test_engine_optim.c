/* test_engine_optim.c — the engine's optimizer state in files (dw_engine_save_optimizer /
 * dw_engine_load_optimizer) on the CPU engine: the file holds NAME.exp_avg and NAME.exp_avg_sq
 * (F32, Deepwell's layout) equal to the moments of a host mirror of AdamW; weights plus moments
 * reloaded into a second engine continue bit-identically, fresh moments do not; files that lack
 * a tensor, have another shape, another dtype or another parameter set are refused naming the
 * file and tensor, with nothing changed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "testutil.h"

static const char *const presets[3] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};

typedef struct {
    int64_t B, T, V;
    int32_t tok[4][64], tgt[4][64]; /* four fixed micro-batches */
} batches;

static void make_batches(batches *d, int64_t B, int64_t T, int64_t V) {
    d->B = B, d->T = T, d->V = V;
    for (int k = 0; k < 4; k++)
        for (int64_t i = 0; i < B * T; i++) {
            d->tok[k][i] = (int32_t)dw_test_rnd(0, V - 1);
            d->tgt[k][i] = (int32_t)dw_test_rnd(0, V - 1);
        }
}

/* One optimizer step on micro-batch k (mirrored by r when not NULL, checked bit for bit). */
static void step(dw_engine *e, const batches *d, int k, int64_t t, dw_test_optref *r) {
    dw_adamw_opts o;
    dw_adamw_opts_init(&o, sizeof o);
    o.lr = 1e-2;
    o.clip = 0.5; /* clipping active at the first steps */
    double loss = 0, norm = 0;
    assert_int_equal(dw_engine_zero_grad(e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(e, d->tok[k], d->tgt[k], d->B, d->T, 1.0, &loss), DW_OK);
    assert_true(isfinite(loss));
    const double want = r ? dw_test_optref_step(r, e, &o, t) : 0;
    assert_int_equal(dw_engine_step(e, &o, t, &norm), DW_OK);
    if (!r) return;
    assert_memory_equal(&norm, &want, sizeof norm);
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        int64_t shape[4], n = 1;
        for (int q = dw_engine_param_shape(e, i, shape); q > 0; q--) n *= shape[q - 1];
        float *p = malloc((size_t)n * sizeof *p);
        assert_int_equal(dw_engine_param_read(e, i, p), DW_OK);
        assert_memory_equal(p, dw_test_optref_get(r, i, 0), (size_t)n * sizeof *p);
        free(p);
    }
}

static int64_t numel_of(dw_engine *e, int i, int64_t shape[4], int *nd) {
    *nd = dw_engine_param_shape(e, i, shape);
    int64_t n = 1;
    for (int q = 0; q < *nd; q++) n *= shape[q];
    return n;
}

/* Whether two engines hold bit-identical parameters. */
static bool same_params(dw_engine *a, dw_engine *b) {
    bool same = dw_engine_param_count(a) == dw_engine_param_count(b);
    for (int i = 0; same && i < dw_engine_param_count(a); i++) {
        int64_t shape[4];
        int nd;
        const int64_t n = numel_of(a, i, shape, &nd);
        float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
        assert_int_equal(dw_engine_param_read(a, i, x), DW_OK);
        assert_int_equal(dw_engine_param_read(b, i, y), DW_OK);
        same = memcmp(x, y, (size_t)n * 4) == 0;
        free(x), free(y);
    }
    return same;
}

static dw_graph *same_graph(const dw_graph *g) {
    dw_graph *h = dw_test_same_graph(dw_test_ctx, g, 0, 0);
    assert_non_null(h);
    return h;
}

static void test_file_and_continuation(void **state) {
    (void)state;
    for (int f = 0; f < 3; f++) {
        const char *prec = dw_test_rnd(0, 1) ? "bf16" : NULL;
        const int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(2, 8);
        dw_test_model a, b, c;
        dw_graph *g = dw_test_small_graph(dw_test_ctx, presets[f], B, T, &dw_test_group_rng);
        assert_non_null(g);
        assert_int_equal(dw_test_model_build(dw_test_ctx, g, prec, DW_DEVICE_AUTO, &a), DW_OK);
        assert_int_equal(dw_engine_init_weights(a.e, dw_test_next(&dw_test_group_rng)), DW_OK);
        batches d;
        make_batches(&d, B, T, dw_graph_vocab(a.g));
        dw_test_optref *r = dw_test_optref_create(a.e);
        assert_non_null(r);
        for (int t = 1; t <= 3; t++) step(a.e, &d, t - 1, t, r);
        char *dir = dw_test_tmpdir(), *opath = dw_test_path(dir, "optimizer.safetensors"),
             *wpath = dw_test_path(dir, "model.safetensors");
        assert_int_equal(dw_engine_save_optimizer(a.e, opath), DW_OK);
        assert_int_equal(dw_engine_save_weights(a.e, wpath), DW_OK);
        /* the file: two F32 tensors per parameter, the parameter's (Deepwell) shape, the mirror's moments */
        dw_st_file *sf = NULL;
        assert_int_equal(dw_st_open(dw_test_ctx, opath, &sf), DW_OK);
        const int np = dw_engine_param_count(a.e);
        assert_int_equal(dw_st_count(sf), 2 * np);
        assert_string_equal(dw_st_metadata(sf, "deepwell.optimizer"), "adamw");
        for (int i = 0; i < np; i++) {
            int64_t shape[4];
            int nd;
            const int64_t n = numel_of(a.e, i, shape, &nd);
            for (int k = 0; k < 2; k++) {
                char name[256];
                snprintf(name, sizeof name, "%s%s", dw_engine_param_name(a.e, i), k ? ".exp_avg_sq" : ".exp_avg");
                const dw_st_tensor *x = dw_st_find(sf, name);
                if (!x) fail_msg("%s: no tensor %s", opath, name);
                assert_int_equal(x->dtype, DW_DT_F32);
                assert_int_equal(x->ndim, nd);
                for (int q = 0; q < nd; q++) assert_int_equal(x->shape[q], shape[q]);
                assert_int_equal(x->nbytes, (size_t)n * 4);
                float *got = malloc((size_t)n * 4);
                assert_int_equal(dw_st_read_f32(dw_test_ctx, sf, x, got), DW_OK);
                assert_memory_equal(got, dw_test_optref_get(r, i, 1 + k), (size_t)n * 4);
                free(got);
            }
        }
        dw_st_close(sf);
        /* b: the weights and the moments; c: the weights alone (fresh moments) */
        assert_int_equal(dw_test_model_build(dw_test_ctx, same_graph(a.g), prec, DW_DEVICE_AUTO, &b), DW_OK);
        assert_int_equal(dw_test_model_build(dw_test_ctx, same_graph(a.g), prec, DW_DEVICE_AUTO, &c), DW_OK);
        assert_int_equal(dw_engine_load_weights(b.e, wpath), DW_OK);
        assert_int_equal(dw_engine_load_optimizer(b.e, opath), DW_OK);
        assert_int_equal(dw_engine_load_weights(c.e, wpath), DW_OK);
        assert_true(same_params(a.e, b.e) && same_params(a.e, c.e));
        for (int t = 4; t <= 6; t++) {
            step(a.e, &d, t % 4, t, r);
            step(b.e, &d, t % 4, t, NULL);
            step(c.e, &d, t % 4, t, NULL);
        }
        assert_true(same_params(a.e, b.e));
        assert_false(same_params(a.e, c.e)); /* the moments matter: the load did something */
        dw_test_optref_free(r);
        dw_test_model_free(&a), dw_test_model_free(&b), dw_test_model_free(&c);
        dw_test_rmtree(dir);
        free(opath), free(wpath), free(dir);
    }
}

/* Copies the tensors of src to dst (metadata too), changing the one named `victim`: renamed to
 * "bogus.exp_avg" (how 'n'), its shape changed, same elements (how 's': [n] -> [n,1], else
 * flattened), or stored as F16 (how 'd'). */
static void rewrite(const char *src, const char *dst, const char *victim, char how) {
    dw_st_file *f = NULL;
    dw_st_writer *w = NULL;
    assert_int_equal(dw_st_open(dw_test_ctx, src, &f), DW_OK);
    assert_int_equal(dw_st_writer_create(dw_test_ctx, &w), DW_OK);
    assert_int_equal(dw_st_writer_set_metadata(dw_test_ctx, w, "deepwell.optimizer", "adamw"), DW_OK);
    for (int i = 0; i < dw_st_count(f); i++) {
        const dw_st_tensor *t = dw_st_get(f, i);
        int64_t shape[DW_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        int nd = t->ndim;
        const char *name = t->name;
        dw_dtype dt = t->dtype;
        size_t nbytes = t->nbytes;
        if (!strcmp(name, victim)) {
            if (how == 'n') name = "bogus.exp_avg";
            if (how == 's' && nd == 1) shape[1] = 1, nd = 2;
            else if (how == 's') shape[0] = dw_st_numel(t), nd = 1;
            if (how == 'd') dt = DW_DT_F16, nbytes /= 2;
        }
        assert_int_equal(dw_st_writer_add(dw_test_ctx, w, name, dt, nd, shape, t->data, nbytes), DW_OK);
    }
    assert_int_equal(dw_st_writer_commit(dw_test_ctx, w, dst), DW_OK);
    dw_st_writer_free(w);
    dw_st_close(f);
}

static void expect_refused(dw_engine *e, const char *path, dw_status want, const char *needle) {
    dw_status s = dw_engine_load_optimizer(e, path);
    if (s != want)
        fail_msg("%s: status %s, want %s (%s)", path, dw_status_name(s), dw_status_name(want), dw_errmsg(dw_test_ctx));
    const char *msg = dw_errmsg(dw_test_ctx);
    if (!strstr(msg, path)) fail_msg("message '%s' does not name the file %s", msg, path);
    if (needle && !strstr(msg, needle)) fail_msg("message '%s' does not name %s", msg, needle);
}

static void test_refusals(void **state) {
    (void)state;
    const int64_t B = 1, T = dw_test_rnd(2, 6);
    dw_test_model a, b, other;
    dw_graph *g = dw_test_small_graph(dw_test_ctx, presets[dw_test_rnd(0, 2)], B, T, &dw_test_group_rng);
    assert_non_null(g);
    assert_int_equal(dw_test_model_build(dw_test_ctx, g, NULL, DW_DEVICE_AUTO, &a), DW_OK);
    assert_int_equal(dw_engine_init_weights(a.e, dw_test_next(&dw_test_group_rng)), DW_OK);
    batches d;
    make_batches(&d, B, T, dw_graph_vocab(a.g));
    for (int t = 1; t <= 2; t++) step(a.e, &d, t - 1, t, NULL);
    char *dir = dw_test_tmpdir(), *good = dw_test_path(dir, "good.safetensors");
    char *w = dw_test_path(dir, "w.safetensors"), *bad = dw_test_path(dir, "bad.safetensors");
    assert_int_equal(dw_engine_save_optimizer(a.e, good), DW_OK);
    assert_int_equal(dw_engine_save_weights(a.e, w), DW_OK);
    assert_int_equal(dw_test_model_build(dw_test_ctx, same_graph(a.g), NULL, DW_DEVICE_AUTO, &b), DW_OK);
    assert_int_equal(dw_engine_load_weights(b.e, w), DW_OK);
    assert_int_equal(dw_engine_load_optimizer(b.e, good), DW_OK);
    /* the victim: the last parameter's tensors, so a load that changed things before checking
     * everything would have changed all the others */
    const int last = dw_engine_param_count(a.e) - 1;
    char m_name[256], v_name[256];
    snprintf(m_name, sizeof m_name, "%s.exp_avg", dw_engine_param_name(a.e, last));
    snprintf(v_name, sizeof v_name, "%s.exp_avg_sq", dw_engine_param_name(a.e, last));
    rewrite(good, bad, m_name, 'n');
    expect_refused(b.e, bad, DW_ERR_FORMAT, m_name);
    rewrite(good, bad, v_name, 's');
    expect_refused(b.e, bad, DW_ERR_FORMAT, v_name);
    rewrite(good, bad, v_name, 'd');
    expect_refused(b.e, bad, DW_ERR_FORMAT, v_name);
    /* another family's moments (other names, maybe another count), and no file at all */
    const bool gpt2 = !strcmp(dw_graph_model_type(a.g), "gpt2");
    dw_graph *g2 = dw_test_small_graph(dw_test_ctx, gpt2 ? "llama-tiny" : "gpt2-tiny", B, T, &dw_test_group_rng);
    assert_int_equal(dw_test_model_build(dw_test_ctx, g2, NULL, DW_DEVICE_AUTO, &other), DW_OK);
    assert_int_equal(dw_engine_save_optimizer(other.e, bad), DW_OK);
    expect_refused(b.e, bad, DW_ERR_FORMAT, NULL);
    char *none = dw_test_path(dir, "none.safetensors");
    assert_int_equal(dw_engine_load_optimizer(b.e, none), DW_ERR_IO);
    /* nothing changed: a and b still continue identically */
    for (int t = 3; t <= 4; t++) {
        step(a.e, &d, t % 4, t, NULL);
        step(b.e, &d, t % 4, t, NULL);
    }
    assert_true(same_params(a.e, b.e));
    dw_test_model_free(&a), dw_test_model_free(&b), dw_test_model_free(&other);
    dw_test_rmtree(dir);
    free(good), free(w), free(bad), free(none), free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_and_continuation),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
