/* test_engine.c — the CPU engine: reference initialisation (determinism, statistics, GPT-2's
 * scaled projections), safetensors save/load (exact round trip, HF layouts, tied head stored
 * once, shards), gradients against finite differences, accumulation and grad_scale, ignored
 * targets, batches smaller than the capacity, and input errors. Whole-model numerics against
 * PyTorch are in tests/python/parity.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/model_config.h"
#include "io/safetensors.h"
#include "runtime/engine.h"
#include "deepwell.h"
#include "testutil.h"


/* A small model of the preset's family with random dimensions. */
static dw_model_config small(const char *preset) {
    dw_model_config c;
    assert_int_equal(dw_model_config_load(dw_test_ctx, preset, &c), DW_OK);
    c.n_layers = dw_test_rnd(1, 2);
    c.vocab_size = dw_test_rnd(20, 60);
    c.d_ff = dw_test_rnd(8, 40);
    c.max_seq = 32;
    if (c.arch == DW_ARCH_GPT2) {
        c.n_heads = c.n_kv_heads = dw_test_rnd(1, 3);
        c.head_dim = 2 * dw_test_rnd(1, 4);
        c.d_model = c.n_heads * c.head_dim;
    } else {
        c.n_kv_heads = dw_test_rnd(1, 2);
        c.n_heads = c.n_kv_heads * dw_test_rnd(1, 2);
        c.head_dim = 2 * dw_test_rnd(1, 4);
        c.d_model = dw_test_rnd(6, 24);
    }
    c.tie_embeddings = dw_test_rnd(0, 1);
    return c;
}

static dw_engine *make(const dw_model_config *c, int64_t B, int64_t T) {
    dw_engine *e = NULL;
    if (dw_engine_create_cpu(dw_test_ctx, c, B, T, &e) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
    return e;
}

static dw_param *find(dw_engine *e, const char *name) {
    for (int i = 0; i < dw_engine_param_count(e); i++)
        if (!strcmp(dw_engine_param(e, i)->name, name)) return dw_engine_param(e, i);
    return NULL;
}

static void test_init(void **state) {
    (void)state;
    dw_model_config c;
    assert_int_equal(dw_model_config_load(dw_test_ctx, "gpt2-tiny", &c), DW_OK);
    dw_engine *a = make(&c, 1, 8), *b = make(&c, 1, 8);
    uint64_t seed = dw_test_next(&dw_test_group_rng);
    assert_int_equal(dw_engine_init_weights(a, seed), DW_OK);
    assert_int_equal(dw_engine_init_weights(b, seed), DW_OK);
    assert_int_equal(dw_engine_param_numel(a), dw_model_config_params(&c));
    int64_t total = 0;
    for (int i = 0; i < dw_engine_param_count(a); i++) {
        dw_param *p = dw_engine_param(a, i), *q = dw_engine_param(b, i);
        total += p->numel;
        assert_memory_equal(p->data, q->data, (size_t)p->numel * sizeof(float));
        if (p->ndim == 1) { /* norms one, biases zero, not decayed */
            float want = strstr(p->name, ".bias") ? 0.0f : 1.0f;
            for (int64_t k = 0; k < p->numel; k++) assert_true(p->data[k] == want);
            assert_false(p->decay);
            continue;
        }
        assert_true(p->decay);
        double s = 0, s2 = 0;
        for (int64_t k = 0; k < p->numel; k++) {
            s += p->data[k];
            s2 += (double)p->data[k] * p->data[k];
        }
        double mean = s / (double)p->numel, sd = sqrt(s2 / (double)p->numel - mean * mean);
        double want = strstr(p->name, "c_proj.weight") ? 0.02 / sqrt(2.0 * (double)c.n_layers) : 0.02;
        double tol = 5 * want / sqrt((double)p->numel); /* 5 standard errors */
        if (fabs(mean) > tol || fabs(sd - want) > 2 * tol)
            fail_msg("%s: mean %g sd %g, want sd %g", p->name, mean, sd, want);
    }
    assert_int_equal(total, dw_model_config_params(&c)); /* tied head not a separate parameter */
    assert_null(find(a, "lm_head.weight"));
    assert_int_equal(dw_engine_init_weights(b, seed + 1), DW_OK);
    dw_param *w0 = find(a, "transformer.h.0.mlp.c_fc.weight"), *w1 = find(b, "transformer.h.0.mlp.c_fc.weight");
    assert_true(memcmp(w0->data, w1->data, (size_t)w0->numel * sizeof(float)) != 0);
    dw_engine_free(a);
    dw_engine_free(b);
    dw_engine_free(NULL);
}

static void random_weights(dw_engine *e, float scale) {
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        dw_param *p = dw_engine_param(e, i);
        for (int64_t k = 0; k < p->numel; k++)
            p->data[k] = (p->ndim == 1 && !strstr(p->name, ".bias") ? 1.0f : 0.0f) +
                         scale * dw_test_normal(&dw_test_group_rng);
    }
}

static void test_save_load(void **state) {
    (void)state;
    const char *presets[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};
    char *dir = dw_test_tmpdir();
    for (int f = 0; f < 3; f++) {
        dw_model_config c = small(presets[f]);
        dw_engine *a = make(&c, 1, 4), *b = make(&c, 1, 4);
        random_weights(a, 0.5f);
        char *path = dw_test_path(dir, "w.safetensors");
        assert_int_equal(dw_engine_save_weights(a, path), DW_OK);
        assert_int_equal(dw_engine_load_weights(b, path), DW_OK);
        for (int i = 0; i < dw_engine_param_count(a); i++)
            assert_memory_equal(dw_engine_param(a, i)->data, dw_engine_param(b, i)->data,
                                (size_t)dw_engine_param(a, i)->numel * sizeof(float));
        dw_st_file *sf = NULL;
        assert_int_equal(dw_st_open(dw_test_ctx, path, &sf), DW_OK);
        assert_int_equal(dw_st_count(sf), dw_engine_param_count(a));
        assert_true((dw_st_find(sf, "lm_head.weight") != NULL) == !c.tie_embeddings);
        if (f == 0) { /* GPT-2 Conv1D: stored in x out, i.e. the transpose */
            const dw_st_tensor *t = dw_st_find(sf, "transformer.h.0.mlp.c_fc.weight");
            assert_non_null(t);
            assert_int_equal(t->shape[0], c.d_model);
            assert_int_equal(t->shape[1], c.d_ff);
            dw_param *p = find(a, "transformer.h.0.mlp.c_fc.weight"); /* (F, C) */
            float *hf = malloc((size_t)p->numel * sizeof(float));
            assert_int_equal(dw_st_read_f32(dw_test_ctx, sf, t, hf), DW_OK);
            int64_t r = dw_test_rnd(0, c.d_ff - 1), k = dw_test_rnd(0, c.d_model - 1);
            assert_true(hf[k * c.d_ff + r] == p->data[r * c.d_model + k]);
            free(hf);
            /* original GPT-2 checkpoints: no "transformer." prefix, causal-mask buffers */
            dw_st_writer *w = NULL;
            assert_int_equal(dw_st_writer_create(dw_test_ctx, &w), DW_OK);
            for (int i = 0; i < dw_st_count(sf); i++) {
                const dw_st_tensor *x = dw_st_get(sf, i);
                const char *nm = strncmp(x->name, "transformer.", 12) ? x->name : x->name + 12;
                assert_int_equal(dw_st_writer_add(dw_test_ctx, w, nm, x->dtype, x->ndim, x->shape, x->data,
                                                  x->nbytes), DW_OK);
            }
            static const float mask[4] = {1, 0, 1, 1};
            const int64_t mshape[4] = {1, 1, 2, 2};
            assert_int_equal(dw_st_writer_add(dw_test_ctx, w, "h.0.attn.bias", DW_DT_F32, 4, mshape, mask,
                                              sizeof mask), DW_OK);
            char *op = dw_test_path(dir, "orig.safetensors");
            assert_int_equal(dw_st_writer_commit(dw_test_ctx, w, op), DW_OK);
            dw_st_writer_free(w);
            random_weights(b, 1.0f);
            if (dw_engine_load_weights(b, op) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
            for (int i = 0; i < dw_engine_param_count(a); i++)
                assert_memory_equal(dw_engine_param(a, i)->data, dw_engine_param(b, i)->data,
                                    (size_t)dw_engine_param(a, i)->numel * sizeof(float));
            remove(op);
            free(op);
        }
        dw_st_close(sf);
        /* a directory with model.safetensors loads too */
        char *mp = dw_test_path(dir, "model.safetensors");
        assert_int_equal(dw_engine_save_weights(a, dir), DW_OK);
        random_weights(b, 1.0f);
        assert_int_equal(dw_engine_load_weights(b, dir), DW_OK);
        dw_param *pa = dw_engine_param(a, 0), *pb = dw_engine_param(b, 0);
        assert_memory_equal(pa->data, pb->data, (size_t)pa->numel * sizeof(float));
        remove(mp);
        remove(path);
        free(mp);
        free(path);
        dw_engine_free(a);
        dw_engine_free(b);
    }
    dw_test_rmtree(dir);
    free(dir);
}

/* Two shards + an index, written by hand from one engine's parameters. */
static void test_sharded(void **state) {
    (void)state;
    dw_model_config c = small("llama-tiny");
    dw_engine *a = make(&c, 1, 4), *b = make(&c, 1, 4);
    random_weights(a, 0.5f);
    char *dir = dw_test_tmpdir();
    dw_st_writer *w[2];
    char index[8192];
    size_t len = (size_t)snprintf(index, sizeof index, "{\"metadata\":{},\"weight_map\":{");
    for (int s = 0; s < 2; s++) assert_int_equal(dw_st_writer_create(dw_test_ctx, &w[s]), DW_OK);
    for (int i = 0; i < dw_engine_param_count(a); i++) {
        dw_param *p = dw_engine_param(a, i);
        int s = i % 2;
        assert_int_equal(dw_st_writer_add(dw_test_ctx, w[s], p->name, DW_DT_F32, p->ndim, p->shape, p->data,
                                          (size_t)p->numel * sizeof(float)), DW_OK);
        len += (size_t)snprintf(index + len, sizeof index - len, "%s\"%s\":\"model-%05d-of-00002.safetensors\"",
                                i ? "," : "", p->name, s + 1);
    }
    snprintf(index + len, sizeof index - len, "}}");
    for (int s = 0; s < 2; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-00002.safetensors", s + 1);
        char *p = dw_test_path(dir, name);
        assert_int_equal(dw_st_writer_commit(dw_test_ctx, w[s], p), DW_OK);
        dw_st_writer_free(w[s]);
        free(p);
    }
    char *ip = dw_test_path(dir, "model.safetensors.index.json");
    assert_int_equal(dw_test_write(ip, index, strlen(index)), 0);
    if (dw_engine_load_weights(b, dir) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
    for (int i = 0; i < dw_engine_param_count(a); i++)
        assert_memory_equal(dw_engine_param(a, i)->data, dw_engine_param(b, i)->data,
                            (size_t)dw_engine_param(a, i)->numel * sizeof(float));
    free(ip);
    dw_test_rmtree(dir);
    free(dir);
    dw_engine_free(a);
    dw_engine_free(b);
}

static void random_tokens(int32_t *t, int64_t n, int64_t V) {
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)dw_test_rnd(0, V - 1);
}

/* (L(w + h) - L(w - h)) / 2h for one weight, restored afterwards. */
static double central_difference(dw_engine *e, dw_param *p, int64_t k, float h, const int32_t *tok,
                                 const int32_t *tgt, int64_t B, int64_t T) {
    float keep = p->data[k];
    double lp, lm;
    p->data[k] = keep + h;
    assert_int_equal(dw_engine_forward(e, tok, tgt, B, T, NULL, &lp), DW_OK);
    p->data[k] = keep - h;
    assert_int_equal(dw_engine_forward(e, tok, tgt, B, T, NULL, &lm), DW_OK);
    p->data[k] = keep;
    return (lp - lm) / (2.0 * (double)h);
}

/* Gradients against central finite differences (double loss, FP32 weights) for random entries
 * of every parameter tensor. */
static void test_finite_differences(void **state) {
    (void)state;
    const char *presets[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};
    for (int f = 0; f < 3; f++) {
        dw_model_config c = small(presets[f]);
        int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(2, 6);
        dw_engine *e = make(&c, B, T);
        random_weights(e, 0.3f);
        int32_t tok[12], tgt[12];
        random_tokens(tok, B * T, c.vocab_size);
        random_tokens(tgt, B * T, c.vocab_size);
        tgt[0] = -1; /* ignored */
        dw_engine_zero_grad(e);
        double loss;
        assert_int_equal(dw_engine_forward_backward(e, tok, tgt, B, T, 1.0, &loss), DW_OK);
        for (int i = 0; i < dw_engine_param_count(e); i++) {
            dw_param *p = dw_engine_param(e, i);
            for (int rep = 0; rep < 2; rep++) {
                int64_t k = dw_test_rnd(0, p->numel - 1);
                /* Richardson-extrapolated central differences, (4 D(h/2) - D(h)) / 3: the O(h^2)
                 * term cancels. With random 0.3-scale weights the loss is curved enough that a
                 * plain central difference at h = 1e-2 can be 20% off a correct gradient. */
                double fd = (4.0 * central_difference(e, p, k, 2e-3f, tok, tgt, B, T) -
                             central_difference(e, p, k, 4e-3f, tok, tgt, B, T)) / 3.0;
                double g = p->grad[k];
                if (fabs(fd - g) > 2e-3 + 2e-2 * fabs(fd))
                    fail_msg("%s[%lld]: grad %g, finite difference %g", p->name, (long long)k, g, fd);
            }
        }
        dw_engine_free(e);
    }
}

static void test_accumulate_and_shapes(void **state) {
    (void)state;
    dw_model_config c = small("llama-tiny");
    int64_t B = 3, T = 8;
    dw_engine *e = make(&c, B, T);
    random_weights(e, 0.3f);
    int32_t tok[24], tgt[24];
    random_tokens(tok, B * T, c.vocab_size);
    random_tokens(tgt, B * T, c.vocab_size);
    int np = dw_engine_param_count(e);
    double l1, l2, l3;
    dw_engine_zero_grad(e);
    assert_int_equal(dw_engine_forward_backward(e, tok, tgt, B, T, 1.0, &l1), DW_OK);
    float **g1 = calloc((size_t)np, sizeof *g1);
    for (int i = 0; i < np; i++) {
        dw_param *p = dw_engine_param(e, i);
        g1[i] = malloc((size_t)p->numel * sizeof(float));
        memcpy(g1[i], p->grad, (size_t)p->numel * sizeof(float));
    }
    /* a second call with scale 0.5 adds half: 1.5 x */
    assert_int_equal(dw_engine_forward_backward(e, tok, tgt, B, T, 0.5, &l2), DW_OK);
    assert_true(l1 == l2);
    for (int i = 0; i < np; i++) {
        dw_param *p = dw_engine_param(e, i);
        for (int64_t k = 0; k < p->numel; k++)
            if (fabsf(p->grad[k] - 1.5f * g1[i][k]) > 1e-6f + 1e-5f * fabsf(g1[i][k]))
                fail_msg("%s[%lld]: %g after 1 + 0.5, single %g", p->name, (long long)k, p->grad[k], g1[i][k]);
    }
    /* forward-only loss equals; logits of a smaller batch equal the prefix of the full one */
    assert_int_equal(dw_engine_forward(e, tok, tgt, B, T, NULL, &l3), DW_OK);
    assert_true(l3 == l1);
    int64_t V = c.vocab_size;
    float *full = malloc((size_t)(B * T * V) * sizeof(float)), *part = malloc((size_t)(T * V) * sizeof(float));
    assert_int_equal(dw_engine_forward(e, tok, NULL, B, T, full, NULL), DW_OK);
    /* sequence 1 alone, truncated to T-3 tokens: causal, so its logits are the same rows */
    int64_t t2 = T - 3;
    int32_t one[8];
    memcpy(one, tok + T, (size_t)t2 * sizeof(int32_t));
    assert_int_equal(dw_engine_forward(e, one, NULL, 1, t2, part, NULL), DW_OK);
    for (int64_t i = 0; i < t2 * V; i++)
        if (fabsf(part[i] - full[T * V + i]) > 1e-5f * (1 + fabsf(full[T * V + i])))
            fail_msg("logit %lld: %g alone, %g in the batch", (long long)i, part[i], full[T * V + i]);
    /* all targets ignored: zero loss and no gradient */
    int32_t none[24];
    for (int i = 0; i < 24; i++) none[i] = -1;
    dw_engine_zero_grad(e);
    assert_int_equal(dw_engine_forward_backward(e, tok, none, B, T, 1.0, &l1), DW_OK);
    assert_true(l1 == 0.0);
    for (int i = 0; i < np; i++) {
        dw_param *p = dw_engine_param(e, i);
        for (int64_t k = 0; k < p->numel; k++) assert_true(p->grad[k] == 0.0f);
        free(g1[i]);
    }
    free(g1);
    free(full);
    free(part);
    dw_engine_free(e);
}

static void test_errors(void **state) {
    (void)state;
    dw_model_config c = small("gpt2-tiny");
    dw_engine *e = make(&c, 2, 4);
    int32_t tok[8] = {0}, tgt[8] = {0};
    double loss;
    assert_int_equal(dw_engine_forward(e, tok, tgt, 3, 4, NULL, &loss), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "capacity"));
    tok[5] = (int32_t)c.vocab_size;
    assert_int_equal(dw_engine_forward(e, tok, tgt, 2, 4, NULL, &loss), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "position 5"));
    assert_int_equal(dw_engine_forward_backward(e, tok, NULL, 2, 4, 1.0, &loss), DW_ERR_INVALID);
    assert_int_equal(dw_engine_load_weights(e, "/nonexistent/w.safetensors"), DW_ERR_IO);
    dw_engine_free(e);
    dw_model_config big;
    assert_int_equal(dw_model_config_load(dw_test_ctx, "mixtral-8x7b", &big), DW_OK);
    e = (dw_engine *)1;
    assert_int_equal(dw_engine_create_cpu(dw_test_ctx, &big, 1, 4, &e), DW_ERR_UNSUPPORTED);
    assert_null(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init),          cmocka_unit_test(test_save_load),
        cmocka_unit_test(test_sharded),       cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_accumulate_and_shapes), cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
