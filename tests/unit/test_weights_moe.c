/* test_weights_moe.c — mixture-of-experts weights in Hugging Face files (runtime/weights_layout.c):
 * a Mixtral's experts saved fused (transformers 5: mlp.experts.gate_up_proj [E,2F,C] with the gate
 * rows first, down_proj [E,C,F], router mlp.gate.weight) and per expert (block_sparse_moe.experts.
 * {e}.w1/w3 [F,C], w2 [C,F], router block_sparse_moe.gate.weight), each tensor checked against the
 * parameters it holds, and OLMoE's per-expert names (mlp.experts.{e}.gate_proj/up_proj/down_proj);
 * both load back bit-exact and save again in the layout they came in; broken
 * files (layouts mixed, an expert missing, one expert too many, a wrong shape) are refused naming
 * the file and the tensor, the engine's weights untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

typedef struct {
    dw_test_model m;
    int64_t E, F, C, L;
} mix;

/* mixtral-tiny (2 layers, 4 experts of 128, width 64) with random weights. */
static mix make(void) {
    mix x;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(CTX, "mixtral-tiny", 1, 8, &g), DW_OK);
    assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &x.m), DW_OK);
    dw_test_random_params(x.m.e, RNG, 1.0f, NULL, 0.0f);
    x.E = 4, x.F = 128, x.C = 64, x.L = 2;
    return x;
}

static void expect_tensor(const dw_st_file *f, const char *name, int ndim, const int64_t *shape) {
    const dw_st_tensor *t = dw_st_find(f, name);
    if (!t) fail_msg("%s: no tensor %s", dw_st_path(f), name);
    assert_int_equal(t->ndim, ndim);
    for (int d = 0; d < ndim; d++) assert_int_equal(t->shape[d], shape[d]);
}

static float *read_tensor(const dw_st_file *f, const char *name) {
    const dw_st_tensor *t = dw_st_find(f, name);
    assert_non_null(t);
    float *v = malloc((size_t)dw_st_numel(t) * 4);
    assert_int_equal(dw_st_read_f32(CTX, f, t, v), DW_OK);
    return v;
}

/* Every parameter of a equals b's, bit for bit. */
static void same_params(dw_engine *a, dw_engine *b) {
    assert_int_equal(dw_engine_param_count(a), dw_engine_param_count(b));
    for (int i = 0; i < dw_engine_param_count(a); i++) {
        float *x = dw_test_param_read(a, dw_engine_param_name(a, i), NULL);
        float *y = dw_test_param_read(b, dw_engine_param_name(a, i), NULL);
        assert_true(x && y);
        assert_memory_equal(x, y, (size_t)dw_test_param_numel(a, i) * 4);
        free(x), free(y);
    }
}

static void test_fused(void **state) {
    (void)state;
    mix x = make();
    char *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "fused.safetensors");
    assert_int_equal(dw_engine_save_weights(x.m.e, path), DW_OK); /* default: fused */
    dw_st_file *f = NULL;
    assert_int_equal(dw_st_open(CTX, path, &f), DW_OK);
    for (int l = 0; l < x.L; l++) {
        char n[128], gname[128], uname[128];
        const int64_t gu[3] = {x.E, 2 * x.F, x.C}, dn[3] = {x.E, x.C, x.F}, rt[2] = {x.E, x.C};
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", l);
        expect_tensor(f, n, 3, gu);
        float *fused = read_tensor(f, n);
        snprintf(gname, sizeof gname, "model.layers.%d.mlp.experts.gate_proj", l);
        snprintf(uname, sizeof uname, "model.layers.%d.mlp.experts.up_proj", l);
        float *g = dw_test_param_read(x.m.e, gname, NULL), *u = dw_test_param_read(x.m.e, uname, NULL);
        assert_true(g && u);
        for (int64_t e = 0; e < x.E; e++) { /* each expert: its gate rows, then its up rows */
            assert_memory_equal(fused + e * 2 * x.F * x.C, g + e * x.F * x.C, (size_t)(x.F * x.C) * 4);
            assert_memory_equal(fused + e * 2 * x.F * x.C + x.F * x.C, u + e * x.F * x.C, (size_t)(x.F * x.C) * 4);
        }
        free(fused), free(g), free(u);
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", l);
        expect_tensor(f, n, 3, dn);
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
        expect_tensor(f, n, 2, rt);
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_proj", l);
        assert_null(dw_st_find(f, n)); /* Deepwell's split names stay inside */
    }
    dw_st_close(f);
    mix y = make();
    assert_int_equal(dw_engine_load_weights(y.m.e, path), DW_OK);
    same_params(x.m.e, y.m.e);
    dw_test_rmtree(dir);
    free(path), free(dir);
    dw_test_model_free(&x.m), dw_test_model_free(&y.m);
}

static void test_per_expert(void **state) {
    (void)state;
    mix x = make();
    char *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "per.safetensors"), *again = dw_test_path(dir, "again.safetensors");
    assert_int_equal(dw_engine_save_weights_layout(x.m.e, path, DW_WEIGHTS_LAYOUT_PER_EXPERT), DW_OK);
    dw_st_file *f = NULL;
    assert_int_equal(dw_st_open(CTX, path, &f), DW_OK);
    const int64_t fc[2] = {x.F, x.C}, cf[2] = {x.C, x.F}, rt[2] = {x.E, x.C};
    for (int l = 0; l < x.L; l++) {
        char n[160], pn[128];
        snprintf(pn, sizeof pn, "model.layers.%d.mlp.experts.down_proj", l);
        float *down = dw_test_param_read(x.m.e, pn, NULL);
        assert_non_null(down);
        for (int64_t e = 0; e < x.E; e++) {
            snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.experts.%lld.w1.weight", l, (long long)e);
            expect_tensor(f, n, 2, fc);
            snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.experts.%lld.w3.weight", l, (long long)e);
            expect_tensor(f, n, 2, fc);
            snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.experts.%lld.w2.weight", l, (long long)e);
            expect_tensor(f, n, 2, cf);
            float *w2 = read_tensor(f, n);
            assert_memory_equal(w2, down + e * x.C * x.F, (size_t)(x.C * x.F) * 4);
            free(w2);
        }
        free(down);
        snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.gate.weight", l);
        expect_tensor(f, n, 2, rt);
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
        assert_null(dw_st_find(f, n));
    }
    dw_st_close(f);
    mix y = make();
    assert_int_equal(dw_engine_load_weights(y.m.e, path), DW_OK);
    same_params(x.m.e, y.m.e);
    assert_int_equal(dw_engine_save_weights(y.m.e, again), DW_OK); /* as loaded: per expert */
    assert_int_equal(dw_st_open(CTX, again, &f), DW_OK);
    assert_non_null(dw_st_find(f, "model.layers.1.block_sparse_moe.experts.3.w2.weight"));
    assert_null(dw_st_find(f, "model.layers.1.mlp.experts.down_proj"));
    dw_st_close(f);
    dw_test_rmtree(dir);
    free(path), free(again), free(dir);
    dw_test_model_free(&x.m), dw_test_model_free(&y.m);
}

/* Copies src into dst with tensor `drop` left out (NULL: none), `add` (a copy of tensor `like`
 * under a new name; NULL: none) added, and tensor `reshape` (NULL: none) given one row less. */
static void rewrite(const char *src, const char *dst, const char *drop, const char *add, const char *like,
                    const char *reshape) {
    dw_st_file *f = NULL;
    assert_int_equal(dw_st_open(CTX, src, &f), DW_OK);
    dw_st_writer *w = NULL;
    assert_int_equal(dw_st_writer_create(CTX, &w), DW_OK);
    for (int i = 0; i < dw_st_count(f); i++) {
        const dw_st_tensor *t = dw_st_get(f, i);
        if (drop && !strcmp(t->name, drop)) continue;
        int64_t shape[8];
        memcpy(shape, t->shape, (size_t)t->ndim * sizeof shape[0]);
        size_t bytes = t->nbytes;
        if (reshape && !strcmp(t->name, reshape)) bytes -= bytes / (size_t)shape[0], shape[0]--;
        assert_int_equal(dw_st_writer_add(CTX, w, t->name, t->dtype, t->ndim, shape, t->data, bytes), DW_OK);
        if (add && !strcmp(t->name, like))
            assert_int_equal(dw_st_writer_add(CTX, w, add, t->dtype, t->ndim, t->shape, t->data, t->nbytes), DW_OK);
    }
    assert_int_equal(dw_st_writer_commit(CTX, w, dst), DW_OK);
    dw_st_writer_free(w);
    dw_st_close(f);
}

static void expect_refused(mix *y, const char *path, const char *n1, const char *n2) {
    float *before = dw_test_param_read(y->m.e, "model.layers.0.mlp.experts.up_proj", NULL);
    assert_non_null(before);
    assert_int_equal(dw_engine_load_weights(y->m.e, path), DW_ERR_FORMAT);
    const char *msg = dw_errmsg(CTX);
    if (!strstr(msg, path) || !strstr(msg, n1) || (n2 && !strstr(msg, n2))) fail_msg("message: %s", msg);
    float *after = dw_test_param_read(y->m.e, "model.layers.0.mlp.experts.up_proj", NULL);
    assert_non_null(after);
    assert_memory_equal(before, after, (size_t)(y->E * y->F * y->C) * 4); /* nothing half-loaded */
    free(before), free(after);
}

static void test_refusals(void **state) {
    (void)state;
    mix x = make(), y = make();
    char *dir = dw_test_tmpdir(), *fused = dw_test_path(dir, "fused.safetensors"), *per = dw_test_path(dir, "per.safetensors");
    char *bad = dw_test_path(dir, "bad.safetensors");
    assert_int_equal(dw_engine_save_weights(x.m.e, fused), DW_OK);
    assert_int_equal(dw_engine_save_weights_layout(x.m.e, per, DW_WEIGHTS_LAYOUT_PER_EXPERT), DW_OK);
    /* an expert missing */
    rewrite(per, bad, "model.layers.1.block_sparse_moe.experts.2.w3.weight", NULL, NULL, NULL);
    expect_refused(&y, bad, "missing tensor", "model.layers.1.block_sparse_moe.experts.2.w3.weight");
    /* one expert more than the config's */
    rewrite(per, bad, NULL, "model.layers.0.block_sparse_moe.experts.4.w1.weight",
            "model.layers.0.block_sparse_moe.experts.0.w1.weight", NULL);
    expect_refused(&y, bad, "unexpected tensor", "experts.4.w1.weight");
    /* the layouts mixed */
    rewrite(per, bad, NULL, "model.layers.0.mlp.experts.down_proj", "model.layers.0.block_sparse_moe.experts.0.w2.weight",
            NULL);
    expect_refused(&y, bad, "mixes the per-expert layout", "mlp.experts.down_proj");
    /* a fused tensor of the wrong shape */
    rewrite(fused, bad, NULL, NULL, NULL, "model.layers.1.mlp.experts.gate_up_proj");
    expect_refused(&y, bad, "model.layers.1.mlp.experts.gate_up_proj", "has shape [3,256,64], expected [4,256,64]");
    assert_int_equal(dw_engine_save_weights_layout(x.m.e, bad, (dw_weights_layout)9), DW_ERR_INVALID);
    dw_test_rmtree(dir);
    free(fused), free(per), free(bad), free(dir);
    dw_test_model_free(&x.m), dw_test_model_free(&y.m);
}

/* OLMoE's per-expert names: mlp.experts.{e}.gate_proj / up_proj / down_proj, router mlp.gate. */
static void test_olmoe_names(void **state) {
    (void)state;
    dw_graph *g = NULL;
    dw_test_model a, b;
    assert_int_equal(dw_capture_hf_shape(CTX, "olmoe-tiny", 1, 8, &g), DW_OK);
    assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &a), DW_OK);
    assert_int_equal(dw_capture_hf_shape(CTX, "olmoe-tiny", 1, 8, &g), DW_OK);
    assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &b), DW_OK);
    dw_test_random_params(a.e, RNG, 1.0f, NULL, 0.0f);
    char *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "olmoe.safetensors");
    assert_int_equal(dw_engine_save_weights_layout(a.e, path, DW_WEIGHTS_LAYOUT_PER_EXPERT), DW_OK);
    dw_st_file *f = NULL;
    assert_int_equal(dw_st_open(CTX, path, &f), DW_OK);
    const int64_t fc[2] = {32, 64}, cf[2] = {64, 32}, rt[2] = {8, 64}, qn[1] = {64};
    expect_tensor(f, "model.layers.1.mlp.experts.7.gate_proj.weight", 2, fc);
    expect_tensor(f, "model.layers.1.mlp.experts.7.up_proj.weight", 2, fc);
    expect_tensor(f, "model.layers.0.mlp.experts.0.down_proj.weight", 2, cf);
    expect_tensor(f, "model.layers.0.mlp.gate.weight", 2, rt);
    expect_tensor(f, "model.layers.0.self_attn.q_norm.weight", 1, qn);
    assert_null(dw_st_find(f, "model.layers.0.block_sparse_moe.gate.weight"));
    dw_st_close(f);
    assert_int_equal(dw_engine_load_weights(b.e, path), DW_OK);
    same_params(a.e, b.e);
    dw_test_rmtree(dir);
    free(path), free(dir);
    dw_test_model_free(&a), dw_test_model_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused),
        cmocka_unit_test(test_per_expert),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_olmoe_names),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
