/* test_engine.c — the CPU engine through the public API (graph -> dw_compile -> dw_engine_create):
 * parameters (names, shapes, decay), the reference initialisation (deterministic, per tensor,
 * statistics, GPT-2's scaled projections, the same masters for every program), safetensors
 * save/load (exact round trip, HF layouts, tied head stored once, original GPT-2 names, shards;
 * a wrong shape, a missing or an unexpected tensor refused naming file and tensor with nothing
 * changed), the loss against an FP32 cross-entropy of the returned logits, gradients against
 * finite differences, accumulation and grad_scale (two half-batches equal one batch), ignored
 * targets, smaller batches, gradients added in through ACC temporaries, input errors, zero_grad,
 * dw_engine_step bit-exact against dw_cpu_adamw on the read-back values, a non-finite gradient
 * that changes nothing, the parity dump; BF16 and quantised programs (fp8_block, mxfp8, nvfp4)
 * training reproducibly; a program compiled for CUDA (sm_90) on the CPU engine; fewer rows than
 * the capacity; two engines over one program with different options. Whole-model numerics
 * against PyTorch are in tests/python/parity.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/program.h"
#include "io/safetensors.h"
#include "testutil.h"

static const char *const presets[3] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};

static dw_test_model build(dw_graph *g, const char *prec) {
    assert_non_null(g);
    dw_test_model m;
    if (dw_test_model_build(dw_test_ctx, g, prec, DW_DEVICE_AUTO, &m) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
    assert_string_equal(dw_engine_backend(m.e), "cpu");
    return m;
}

static dw_test_model small(const char *preset, int64_t B, int64_t T, const char *prec) {
    return build(dw_test_small_graph(dw_test_ctx, preset, B, T, &dw_test_group_rng), prec);
}

static int64_t pnumel(dw_engine *e, int i) {
    int64_t shape[4], n = 1;
    for (int d = dw_engine_param_shape(e, i, shape); d > 0; d--) n *= shape[d - 1];
    return n;
}

/* Parameter i's values (or gradients), malloc'd. */
static float *read_param(dw_engine *e, int i, bool grad) {
    float *p = malloc((size_t)pnumel(e, i) * sizeof *p);
    assert_non_null(p);
    assert_int_equal(grad ? dw_engine_grad_read(e, i, p) : dw_engine_param_read(e, i, p), DW_OK);
    return p;
}

static int find_param(dw_engine *e, const char *name) {
    for (int i = 0; i < dw_engine_param_count(e); i++)
        if (!strcmp(dw_engine_param_name(e, i), name)) return i;
    return -1;
}

/* Whether parameter i of a and j of b hold the same bits. */
static bool same_param(dw_engine *a, int i, dw_engine *b, int j) {
    if (pnumel(a, i) != pnumel(b, j)) return false;
    float *x = read_param(a, i, false), *y = read_param(b, j, false);
    bool same = !memcmp(x, y, (size_t)pnumel(a, i) * sizeof *x);
    free(x), free(y);
    return same;
}

static bool same_params(dw_engine *a, dw_engine *b) {
    bool same = dw_engine_param_count(a) == dw_engine_param_count(b);
    for (int i = 0; same && i < dw_engine_param_count(a); i++) same = same_param(a, i, b, i);
    return same;
}

/* Every parameter's values (one malloc'd block per parameter) and their comparison. */
static float **snapshot(dw_engine *e) {
    float **s = calloc((size_t)dw_engine_param_count(e), sizeof *s);
    for (int i = 0; i < dw_engine_param_count(e); i++) s[i] = read_param(e, i, false);
    return s;
}
static bool unchanged(dw_engine *e, float **s) {
    bool same = true;
    for (int i = 0; same && i < dw_engine_param_count(e); i++) {
        float *p = read_param(e, i, false);
        same = !memcmp(p, s[i], (size_t)pnumel(e, i) * sizeof *p);
        free(p);
    }
    return same;
}
static void snapshot_free(dw_engine *e, float **s) {
    for (int i = 0; i < dw_engine_param_count(e); i++) free(s[i]);
    free(s);
}

/* Norm weights near 1, everything else near 0, scale x N(0, 1). */
static void random_weights(dw_engine *e, float scale) {
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        int64_t shape[4];
        const int nd = dw_engine_param_shape(e, i, shape);
        const bool norm = nd == 1 && !strstr(dw_engine_param_name(e, i), ".bias");
        const int64_t n = pnumel(e, i);
        float *p = malloc((size_t)n * sizeof *p);
        for (int64_t k = 0; k < n; k++) p[k] = (norm ? 1.0f : 0.0f) + scale * dw_test_normal(&dw_test_group_rng);
        assert_int_equal(dw_engine_param_write(e, i, p), DW_OK);
        free(p);
    }
}

static void random_tokens(int32_t *t, int64_t n, int64_t V) {
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)dw_test_rnd(0, V - 1);
}

/* ---- parameters and initialisation ------------------------------------------------------------- */
static void test_params_and_init(void **state) {
    (void)state;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(dw_test_ctx, "gpt2-tiny", 1, 8, &g), DW_OK);
    dw_test_model a = build(g, NULL);
    dw_graph *g2 = NULL;
    assert_int_equal(dw_capture_hf_shape(dw_test_ctx, "gpt2-tiny", 1, 8, &g2), DW_OK);
    dw_test_model b = build(g2, NULL);
    const uint64_t seed = dw_test_next(&dw_test_group_rng);
    assert_int_equal(dw_engine_init_weights(a.e, seed), DW_OK);
    assert_int_equal(dw_engine_init_weights(b.e, seed), DW_OK);
    const int64_t L = a.g->model.n_blocks;
    int64_t total = 0;
    const int np = dw_engine_param_count(a.e);
    assert_int_equal(np, a.c->n_params);
    for (int i = 0; i < np; i++) {
        const char *name = dw_engine_param_name(a.e, i);
        const dw_ir_tensor *t = &a.g->tensors[a.c->param_tensor[i]];
        assert_non_null(name);
        assert_string_equal(name, t->name);
        for (int j = 0; j < i; j++) assert_string_not_equal(dw_engine_param_name(a.e, j), name);
        int64_t shape[4];
        const int nd = dw_engine_param_shape(a.e, i, shape);
        assert_int_equal(nd, t->ndim);
        for (int d = 0; d < nd; d++) assert_int_equal(shape[d], t->shape[d]);
        for (int d = nd; d < 4; d++) assert_int_equal(shape[d], 1);
        const int64_t n = pnumel(a.e, i);
        total += n;
        assert_true(same_param(a.e, i, b.e, i)); /* same seed, same values */
        float *p = read_param(a.e, i, false);
        if (nd == 1) { /* norms one, biases zero, not decayed */
            float want = strstr(name, ".bias") ? 0.0f : 1.0f;
            for (int64_t k = 0; k < n; k++) assert_true(p[k] == want);
            assert_false(t->decay);
            free(p);
            continue;
        }
        assert_true(t->decay); /* matrices decay */
        double s = 0, s2 = 0;
        for (int64_t k = 0; k < n; k++) {
            s += p[k];
            s2 += (double)p[k] * p[k];
        }
        double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
        double want = strstr(name, "c_proj.weight") ? 0.02 / sqrt(2.0 * (double)L) : 0.02;
        double tol = 5 * want / sqrt((double)n); /* 5 standard errors */
        if (fabs(mean) > tol || fabs(sd - want) > 2 * tol)
            fail_msg("%s: mean %g sd %g, want sd %g", name, mean, sd, want);
        free(p);
    }
    assert_int_equal(total, dw_graph_params(a.g)); /* tied head not a separate parameter */
    assert_int_equal(find_param(a.e, "lm_head.weight"), -1);
    /* out of range */
    int64_t shape[4];
    float dummy[1];
    assert_null(dw_engine_param_name(a.e, np));
    assert_null(dw_engine_param_name(a.e, -1));
    assert_int_equal(dw_engine_param_shape(a.e, np, shape), -1);
    assert_int_equal(dw_engine_param_read(a.e, np, dummy), DW_ERR_INVALID);
    assert_int_equal(dw_engine_grad_read(a.e, -1, dummy), DW_ERR_INVALID);
    assert_int_equal(dw_engine_param_write(a.e, np, dummy), DW_ERR_INVALID);
    /* another seed, other values */
    assert_int_equal(dw_engine_init_weights(b.e, seed + 1), DW_OK);
    const int fc = find_param(a.e, "transformer.h.0.mlp.c_fc.weight");
    assert_true(fc >= 0);
    assert_false(same_param(a.e, fc, b.e, fc));
    /* per tensor: a model with other blocks and a BF16 program holds the same values under the
     * same names (the seed and the name decide, not the order, the program or the block count) */
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(dw_test_ctx, "gpt2-tiny", &cfg), DW_OK);
    cfg.n_layers = 1 + (L % 3);
    dw_graph *g3 = NULL;
    assert_int_equal(dw_capture_config(dw_test_ctx, &cfg, 2, 4, &g3), DW_OK);
    dw_test_model c = build(g3, "bf16");
    assert_int_equal(dw_engine_init_weights(c.e, seed), DW_OK);
    int shared = 0;
    for (int i = 0; i < dw_engine_param_count(c.e); i++) {
        const int j = find_param(a.e, dw_engine_param_name(c.e, i));
        const char *nm = dw_engine_param_name(c.e, i);
        if (j < 0 || strstr(nm, "c_proj.weight")) continue; /* c_proj's std depends on the block count */
        assert_true(same_param(c.e, i, a.e, j));
        shared++;
    }
    assert_true(shared >= 6);
    dw_test_model_free(&a), dw_test_model_free(&b), dw_test_model_free(&c);
}

/* ---- safetensors ------------------------------------------------------------------------------- */
/* Copies the tensors of src to dst, dropping `drop` (may be NULL), reshaping `reshape` (its
 * first dimension + 1 with the same data plus one row of zeros), adding `extra` (a tensor). */
static void rewrite(const char *src, const char *dst, const char *drop, const char *reshape, const char *extra) {
    dw_st_file *f = NULL;
    dw_st_writer *w = NULL;
    assert_int_equal(dw_st_open(dw_test_ctx, src, &f), DW_OK);
    assert_int_equal(dw_st_writer_create(dw_test_ctx, &w), DW_OK);
    void *grown = NULL;
    for (int i = 0; i < dw_st_count(f); i++) {
        const dw_st_tensor *t = dw_st_get(f, i);
        if (drop && !strcmp(t->name, drop)) continue;
        if (reshape && !strcmp(t->name, reshape)) {
            int64_t shape[DW_ST_MAX_DIMS];
            memcpy(shape, t->shape, sizeof shape);
            const size_t row = t->nbytes / (size_t)shape[0];
            shape[0]++;
            grown = calloc(1, t->nbytes + row);
            memcpy(grown, t->data, t->nbytes);
            assert_int_equal(
                dw_st_writer_add(dw_test_ctx, w, t->name, t->dtype, t->ndim, shape, grown, t->nbytes + row), DW_OK);
            continue;
        }
        assert_int_equal(dw_st_writer_add(dw_test_ctx, w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes),
                         DW_OK);
    }
    static const float one[4] = {1, 2, 3, 4};
    const int64_t shape[1] = {4};
    if (extra) assert_int_equal(dw_st_writer_add(dw_test_ctx, w, extra, DW_DT_F32, 1, shape, one, sizeof one), DW_OK);
    assert_int_equal(dw_st_writer_commit(dw_test_ctx, w, dst), DW_OK);
    dw_st_writer_free(w);
    dw_st_close(f);
    free(grown);
}

static void expect_refused(dw_engine *e, const char *path, const char *tensor, float **before) {
    dw_status s = dw_engine_load_weights(e, path);
    if (s != DW_ERR_FORMAT)
        fail_msg("%s: %s, want DW_ERR_FORMAT (%s)", path, dw_status_name(s), dw_errmsg(dw_test_ctx));
    const char *msg = dw_errmsg(dw_test_ctx);
    if (!strstr(msg, path) || !strstr(msg, tensor)) fail_msg("message '%s' lacks the file or '%s'", msg, tensor);
    assert_true(unchanged(e, before));
}

static void test_save_load(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    for (int f = 0; f < 3; f++) {
        dw_test_model a = small(presets[f], 1, 4, NULL), b = build(dw_test_same_graph(dw_test_ctx, a.g, 0, 0), NULL);
        random_weights(a.e, 0.5f);
        char *path = dw_test_path(dir, "w.safetensors");
        assert_int_equal(dw_engine_save_weights(a.e, path), DW_OK);
        assert_int_equal(dw_engine_load_weights(b.e, path), DW_OK);
        assert_true(same_params(a.e, b.e));
        dw_st_file *sf = NULL;
        assert_int_equal(dw_st_open(dw_test_ctx, path, &sf), DW_OK);
        assert_int_equal(dw_st_count(sf), dw_engine_param_count(a.e));
        assert_true((dw_st_find(sf, "lm_head.weight") != NULL) == !a.g->model.tied_embeddings);
        for (int i = 0; i < dw_st_count(sf); i++) assert_int_equal(dw_st_get(sf, i)->dtype, DW_DT_F32);
        if (f == 0) { /* GPT-2 Conv1D: stored in x out, i.e. the transpose */
            const dw_st_tensor *t = dw_st_find(sf, "transformer.h.0.mlp.c_fc.weight");
            assert_non_null(t);
            const int pi = find_param(a.e, "transformer.h.0.mlp.c_fc.weight"); /* (F, C) */
            int64_t shape[4];
            dw_engine_param_shape(a.e, pi, shape);
            const int64_t F = shape[0], C = shape[1];
            assert_int_equal(t->shape[0], C);
            assert_int_equal(t->shape[1], F);
            float *hf = malloc((size_t)(F * C) * sizeof(float)), *p = read_param(a.e, pi, false);
            assert_int_equal(dw_st_read_f32(dw_test_ctx, sf, t, hf), DW_OK);
            for (int rep = 0; rep < 8; rep++) {
                int64_t r = dw_test_rnd(0, F - 1), k = dw_test_rnd(0, C - 1);
                assert_true(hf[k * F + r] == p[r * C + k]);
            }
            free(hf), free(p);
            /* original GPT-2 checkpoints: no "transformer." prefix, causal-mask buffers */
            dw_st_writer *w = NULL;
            assert_int_equal(dw_st_writer_create(dw_test_ctx, &w), DW_OK);
            for (int i = 0; i < dw_st_count(sf); i++) {
                const dw_st_tensor *x = dw_st_get(sf, i);
                const char *nm = strncmp(x->name, "transformer.", 12) ? x->name : x->name + 12;
                assert_int_equal(dw_st_writer_add(dw_test_ctx, w, nm, x->dtype, x->ndim, x->shape, x->data, x->nbytes),
                                 DW_OK);
            }
            static const float mask[4] = {1, 0, 1, 1};
            const int64_t mshape[4] = {1, 1, 2, 2};
            assert_int_equal(dw_st_writer_add(dw_test_ctx, w, "h.0.attn.bias", DW_DT_F32, 4, mshape, mask, sizeof mask),
                             DW_OK);
            char *op = dw_test_path(dir, "orig.safetensors");
            assert_int_equal(dw_st_writer_commit(dw_test_ctx, w, op), DW_OK);
            dw_st_writer_free(w);
            random_weights(b.e, 1.0f);
            if (dw_engine_load_weights(b.e, op) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
            assert_true(same_params(a.e, b.e));
            remove(op);
            free(op);
        }
        dw_st_close(sf);
        /* refusals, each naming the file and the tensor, changing nothing: the last parameter with
         * another shape or missing, an unexpected tensor */
        random_weights(b.e, 1.0f);
        float **before = snapshot(b.e);
        const char *last = dw_engine_param_name(a.e, dw_engine_param_count(a.e) - 1);
        char *bad = dw_test_path(dir, "bad.safetensors");
        rewrite(path, bad, NULL, last, NULL);
        expect_refused(b.e, bad, last, before);
        rewrite(path, bad, last, NULL, NULL);
        expect_refused(b.e, bad, last, before);
        rewrite(path, bad, NULL, NULL, "bogus.weight");
        expect_refused(b.e, bad, "bogus.weight", before);
        char *none = dw_test_path(dir, "none.safetensors");
        assert_int_equal(dw_engine_load_weights(b.e, none), DW_ERR_IO);
        assert_non_null(strstr(dw_errmsg(dw_test_ctx), none));
        assert_true(unchanged(b.e, before));
        snapshot_free(b.e, before);
        remove(bad);
        free(bad), free(none);
        /* a directory with model.safetensors loads too; saving to a directory writes that file */
        char *mp = dw_test_path(dir, "model.safetensors");
        assert_int_equal(dw_engine_save_weights(a.e, dir), DW_OK);
        random_weights(b.e, 1.0f);
        assert_int_equal(dw_engine_load_weights(b.e, dir), DW_OK);
        assert_true(same_params(a.e, b.e));
        remove(mp);
        remove(path);
        free(mp);
        free(path);
        dw_test_model_free(&a);
        dw_test_model_free(&b);
    }
    dw_test_rmtree(dir);
    free(dir);
}

/* Two shards + an index, written by hand from one engine's parameters. */
static void test_sharded(void **state) {
    (void)state;
    dw_test_model a = small("llama-tiny", 1, 4, NULL);
    dw_test_model b = build(dw_test_same_graph(dw_test_ctx, a.g, 0, 0), NULL);
    char *dir = dw_test_tmpdir();
    random_weights(a.e, 0.5f);
    dw_st_writer *w[2];
    char index[8192];
    size_t len = (size_t)snprintf(index, sizeof index, "{\"metadata\":{},\"weight_map\":{");
    for (int s = 0; s < 2; s++) assert_int_equal(dw_st_writer_create(dw_test_ctx, &w[s]), DW_OK);
    float **vals = snapshot(a.e);
    for (int i = 0; i < dw_engine_param_count(a.e); i++) {
        int64_t shape[4];
        const int nd = dw_engine_param_shape(a.e, i, shape);
        const char *name = dw_engine_param_name(a.e, i);
        int s = i % 2;
        assert_int_equal(dw_st_writer_add(dw_test_ctx, w[s], name, DW_DT_F32, nd, shape, vals[i],
                                          (size_t)pnumel(a.e, i) * sizeof(float)), DW_OK);
        len += (size_t)snprintf(index + len, sizeof index - len, "%s\"%s\":\"model-%05d-of-00002.safetensors\"",
                                i ? "," : "", name, s + 1);
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
    snapshot_free(a.e, vals);
    char *ip = dw_test_path(dir, "model.safetensors.index.json");
    assert_int_equal(dw_test_write(ip, index, strlen(index)), 0);
    if (dw_engine_load_weights(b.e, dir) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
    assert_true(same_params(a.e, b.e));
    free(ip);
    dw_test_rmtree(dir);
    free(dir);
    dw_test_model_free(&a);
    dw_test_model_free(&b);
}

/* ---- forward and backward ---------------------------------------------------------------------- */
/* The loss is the mean FP32 cross-entropy of the returned logits over the targets >= 0, computed
 * here in double (log-sum-exp), for FP32 and BF16 programs; the forward is deterministic. */
static void test_loss_reference(void **state) {
    (void)state;
    const char *precs[2] = {NULL, "bf16"};
    for (int f = 0; f < 6; f++) {
        const int64_t B = dw_test_rnd(1, 3), T = dw_test_rnd(1, 8);
        dw_test_model m = small(presets[f % 3], B, T, precs[f / 3]);
        random_weights(m.e, 0.3f);
        const int64_t V = dw_graph_vocab(m.g), N = B * T;
        int32_t tok[24], tgt[24];
        random_tokens(tok, N, V);
        random_tokens(tgt, N, V);
        tgt[dw_test_rnd(0, N - 1)] = -1; /* ignored (maybe all of them when N = 1) */
        float *logits = malloc((size_t)(N * V) * sizeof *logits);
        double loss = -1, again = -2;
        assert_int_equal(dw_engine_forward(m.e, tok, tgt, B, T, logits, &loss), DW_OK);
        double sum = 0;
        int64_t valid = 0;
        for (int64_t i = 0; i < N; i++) {
            const float *l = logits + i * V;
            for (int64_t v = 0; v < V; v++) assert_true(isfinite(l[v]));
            if (tgt[i] < 0) continue;
            double mx = l[0], z = 0;
            for (int64_t v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
            for (int64_t v = 0; v < V; v++) z += exp((double)l[v] - mx);
            sum += mx + log(z) - (double)l[tgt[i]];
            valid++;
        }
        const double want = valid ? sum / (double)valid : 0.0;
        if (!(fabs(loss - want) <= 1e-5 * fabs(want) + 1e-6))
            fail_msg("%s %s: loss %.9g, cross-entropy of the logits %.9g", presets[f % 3],
                     precs[f / 3] ? "bf16" : "fp32", loss, want);
        assert_int_equal(dw_engine_forward(m.e, tok, tgt, B, T, NULL, &again), DW_OK);
        assert_true(loss == again);
        free(logits);
        dw_test_model_free(&m);
    }
}

/* (L(w + h) - L(w - h)) / 2h for one weight, restored afterwards. */
static double central_difference(dw_engine *e, int i, int64_t k, float h, const int32_t *tok, const int32_t *tgt,
                                 int64_t B, int64_t T) {
    float *p = read_param(e, i, false);
    const float keep = p[k];
    double lp, lm;
    p[k] = keep + h;
    assert_int_equal(dw_engine_param_write(e, i, p), DW_OK);
    assert_int_equal(dw_engine_forward(e, tok, tgt, B, T, NULL, &lp), DW_OK);
    p[k] = keep - h;
    assert_int_equal(dw_engine_param_write(e, i, p), DW_OK);
    assert_int_equal(dw_engine_forward(e, tok, tgt, B, T, NULL, &lm), DW_OK);
    p[k] = keep;
    assert_int_equal(dw_engine_param_write(e, i, p), DW_OK);
    free(p);
    return (lp - lm) / (2.0 * (double)h);
}

/* Gradients of the FP32 program against central finite differences (double loss, FP32 weights)
 * for random entries of every parameter tensor. */
static void test_finite_differences(void **state) {
    (void)state;
    for (int f = 0; f < 3; f++) {
        int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(2, 6);
        dw_test_model m = small(presets[f], B, T, NULL);
        dw_engine *e = m.e;
        random_weights(e, 0.3f);
        int32_t tok[12], tgt[12];
        random_tokens(tok, B * T, dw_graph_vocab(m.g));
        random_tokens(tgt, B * T, dw_graph_vocab(m.g));
        tgt[0] = -1; /* ignored */
        assert_int_equal(dw_engine_zero_grad(e), DW_OK);
        double loss;
        assert_int_equal(dw_engine_forward_backward(e, tok, tgt, B, T, 1.0, &loss), DW_OK);
        for (int i = 0; i < dw_engine_param_count(e); i++) {
            float *g = read_param(e, i, true);
            for (int rep = 0; rep < 2; rep++) {
                int64_t k = dw_test_rnd(0, pnumel(e, i) - 1);
                /* Richardson-extrapolated central differences, (4 D(h/2) - D(h)) / 3: the O(h^2)
                 * term cancels. With random 0.3-scale weights the loss is curved enough that a
                 * plain central difference at h = 1e-2 can be 20% off a correct gradient. Where a
                 * LayerNorm row has almost no variance the loss bends on a scale of 1e-3 (seed
                 * 25516913343272816: a step of 0.04 within 2e-3 of the weight), so a mismatch is
                 * measured again at h / 8; a wrong gradient mismatches at both. */
                double fd = 0;
                for (float h = 4e-3f; h > 4e-4f; h /= 8) {
                    fd = (4.0 * central_difference(e, i, k, h / 2, tok, tgt, B, T) -
                          central_difference(e, i, k, h, tok, tgt, B, T)) / 3.0;
                    if (fabs(fd - g[k]) <= 2e-3 + 2e-2 * fabs(fd)) break;
                }
                if (fabs(fd - g[k]) > 2e-3 + 2e-2 * fabs(fd))
                    fail_msg("%s[%lld]: grad %g, finite difference %g", dw_engine_param_name(e, i), (long long)k, g[k],
                             fd);
            }
            free(g);
        }
        dw_test_model_free(&m);
    }
}

/* Every gradient of e, concatenated (malloc'd), and the count. */
static float *all_grads(dw_engine *e, int64_t *n) {
    *n = 0;
    for (int i = 0; i < dw_engine_param_count(e); i++) *n += pnumel(e, i);
    float *g = malloc((size_t)*n * sizeof *g);
    int64_t o = 0;
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        assert_int_equal(dw_engine_grad_read(e, i, g + o), DW_OK);
        o += pnumel(e, i);
    }
    return g;
}

/* One activation read by four slots (testutil's shared graph): its gradient written by the linear
 * and added in through ACC temporaries after the GELU and both SwiGLU slots. FP32 gradients against
 * finite differences; the BF16 program's against the FP32 ones. */
static void test_shared_reads(void **state) {
    (void)state;
    const int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(2, 6);
    int ng = -1, ns = -1;
    const dw_test_rng keep = dw_test_group_rng;
    dw_test_model m = build(dw_test_shared_graph(dw_test_ctx, B, T, &dw_test_group_rng, &ng, &ns), NULL);
    dw_test_rng again = keep;
    dw_test_model h = build(dw_test_shared_graph(dw_test_ctx, B, T, &again, NULL, NULL), "bf16");
    for (int k = 0; k < 2; k++) {
        const dw_compiled *c = k ? h.c : m.c;
        assert_int_equal(c->node[ng].grad_mode[0], DW_GRAD_ACCUM_TMP);
        assert_int_equal(c->node[ns].grad_mode[0], DW_GRAD_ACCUM_TMP);
        assert_int_equal(c->node[ns].grad_mode[1], DW_GRAD_ACCUM_TMP);
        assert_int_equal(c->node[ns + 1].grad_mode[0], DW_GRAD_WRITE); /* the linear */
    }
    dw_engine *e = m.e;
    random_weights(e, 0.5f);
    for (int i = 0; i < dw_engine_param_count(e); i++) { /* the same weights in both */
        float *p = read_param(e, i, false);
        assert_int_equal(dw_engine_param_write(h.e, i, p), DW_OK);
        free(p);
    }
    const int64_t V = dw_graph_vocab(m.g);
    int32_t tok[12], tgt[12];
    random_tokens(tok, B * T, V);
    random_tokens(tgt, B * T, V);
    double loss, loss16;
    assert_int_equal(dw_engine_zero_grad(e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(e, tok, tgt, B, T, 1.0, &loss), DW_OK);
    assert_int_equal(dw_engine_zero_grad(h.e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(h.e, tok, tgt, B, T, 1.0, &loss16), DW_OK);
    assert_true(fabs(loss16 - loss) <= 2e-2 * loss);
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        float *g = read_param(e, i, true), *g16 = read_param(h.e, i, true);
        double mx = 0;
        for (int64_t k = 0; k < pnumel(e, i); k++) mx = fmax(mx, fabs(g[k]));
        assert_true(mx > 0);
        for (int64_t k = 0; k < pnumel(e, i); k++)
            if (fabs(g16[k] - g[k]) > 5e-2 * mx)
                fail_msg("%s[%lld]: BF16 program %g, FP32 program %g (max %g)", dw_engine_param_name(e, i),
                         (long long)k, g16[k], g[k], mx);
        for (int rep = 0; rep < 3; rep++) {
            int64_t k = dw_test_rnd(0, pnumel(e, i) - 1);
            double fd = (4.0 * central_difference(e, i, k, 2e-3f, tok, tgt, B, T) -
                         central_difference(e, i, k, 4e-3f, tok, tgt, B, T)) / 3.0;
            if (fabs(fd - g[k]) > 2e-3 + 2e-2 * fabs(fd))
                fail_msg("%s[%lld]: grad %g, finite difference %g", dw_engine_param_name(e, i), (long long)k, g[k], fd);
        }
        free(g), free(g16);
    }
    dw_test_model_free(&m), dw_test_model_free(&h);
}

static void test_accumulate_and_shapes(void **state) {
    (void)state;
    const int64_t B = 2 * dw_test_rnd(1, 2), T = 8;
    dw_test_model m = small(presets[dw_test_rnd(0, 2)], B, T, NULL);
    dw_engine *e = m.e;
    random_weights(e, 0.3f);
    const int64_t V = dw_graph_vocab(m.g);
    int32_t tok[32], tgt[32];
    random_tokens(tok, B * T, V);
    random_tokens(tgt, B * T, V);
    double l1, l2, l3;
    int64_t n;
    assert_int_equal(dw_engine_zero_grad(e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(e, tok, tgt, B, T, 1.0, &l1), DW_OK);
    float *g1 = all_grads(e, &n);
    /* a second call with scale 0.5 adds half: 1.5 x */
    assert_int_equal(dw_engine_forward_backward(e, tok, tgt, B, T, 0.5, &l2), DW_OK);
    assert_true(l1 == l2);
    float *g15 = all_grads(e, &n);
    for (int64_t k = 0; k < n; k++)
        if (fabsf(g15[k] - 1.5f * g1[k]) > 1e-6f + 1e-5f * fabsf(g1[k]))
            fail_msg("gradient %lld: %g after 1 + 0.5, single %g", (long long)k, g15[k], g1[k]);
    /* two half-batches with grad_scale 0.5 give the full batch's gradient (equal token counts) */
    assert_int_equal(dw_engine_zero_grad(e), DW_OK);
    double h1, h2;
    assert_int_equal(dw_engine_forward_backward(e, tok, tgt, B / 2, T, 0.5, &h1), DW_OK);
    assert_int_equal(dw_engine_forward_backward(e, tok + B / 2 * T, tgt + B / 2 * T, B / 2, T, 0.5, &h2), DW_OK);
    assert_true(fabs((h1 + h2) / 2 - l1) <= 1e-6 * l1);
    float *gh = all_grads(e, &n);
    double scale = 0;
    for (int64_t k = 0; k < n; k++) scale = fmax(scale, fabs(g1[k]));
    for (int64_t k = 0; k < n; k++)
        if (fabsf(gh[k] - g1[k]) > 1e-6f * (float)scale + 1e-5f * fabsf(g1[k]))
            fail_msg("gradient %lld: %g from two halves, %g from the batch", (long long)k, gh[k], g1[k]);
    /* zero_grad clears; a forward alone leaves the gradients */
    assert_int_equal(dw_engine_zero_grad(e), DW_OK);
    assert_int_equal(dw_engine_forward(e, tok, tgt, B, T, NULL, &l3), DW_OK);
    assert_true(l3 == l1); /* forward-only loss equals */
    float *gz = all_grads(e, &n);
    for (int64_t k = 0; k < n; k++) assert_true(gz[k] == 0.0f);
    /* logits of a smaller batch equal the prefix of the full one */
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
    int32_t none[32];
    for (int i = 0; i < 32; i++) none[i] = -1;
    assert_int_equal(dw_engine_forward_backward(e, tok, none, B, T, 1.0, &l1), DW_OK);
    assert_true(l1 == 0.0);
    free(gz);
    gz = all_grads(e, &n);
    for (int64_t k = 0; k < n; k++) assert_true(gz[k] == 0.0f);
    free(g1), free(g15), free(gh), free(gz), free(full), free(part);
    dw_test_model_free(&m);
}

/* Fewer rows than the capacity: a sequence alone and truncated gives the rows it has in the full
 * batch (causal attention, row-wise operations and row-wise quantisation: exactly, in every
 * program whose activations are quantised per row), and its loss over them. */
static void test_smaller_batches(void **state) {
    (void)state;
    const char *precs[4] = {NULL, "bf16", "mxfp8", "fp8_block"};
    for (int k = 0; k < 4; k++) {
        const int64_t B = dw_test_rnd(2, 3), T = dw_test_rnd(4, 8);
        dw_test_model m = small(presets[dw_test_rnd(0, 2)], B, T, precs[k]);
        random_weights(m.e, 0.3f);
        const int64_t V = dw_graph_vocab(m.g), b = dw_test_rnd(1, B - 1), t = dw_test_rnd(1, T);
        int32_t tok[24];
        random_tokens(tok, B * T, V);
        float *full = malloc((size_t)(B * T * V) * sizeof *full);
        float *part = malloc((size_t)(b * t * V) * sizeof *part);
        assert_int_equal(dw_engine_forward(m.e, tok, NULL, B, T, full, NULL), DW_OK);
        int32_t sub[24]; /* the last b sequences, their first t tokens */
        for (int64_t s = 0; s < b; s++) memcpy(sub + s * t, tok + (B - b + s) * T, (size_t)t * sizeof *sub);
        assert_int_equal(dw_engine_forward(m.e, sub, NULL, b, t, part, NULL), DW_OK);
        for (int64_t s = 0; s < b; s++)
            for (int64_t i = 0; i < t * V; i++) {
                const float want = full[(B - b + s) * T * V + i], got = part[s * t * V + i];
                if (!(got == want || (!precs[k] && fabsf(got - want) <= 1e-5f * (1 + fabsf(want)))))
                    fail_msg("%s: sequence %lld logit %lld: %g alone, %g in the batch",
                             precs[k] ? precs[k] : "fp32", (long long)s, (long long)i, got, want);
            }
        free(full), free(part);
        dw_test_model_free(&m);
    }
}

static void test_errors(void **state) {
    (void)state;
    dw_test_model m = small("gpt2-tiny", 2, 4, NULL);
    dw_engine *e = m.e;
    const int64_t V = dw_graph_vocab(m.g);
    int32_t tok[8] = {0}, tgt[8] = {0};
    double loss = 7;
    assert_int_equal(dw_engine_forward(e, tok, tgt, 3, 4, NULL, &loss), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "capacity"));
    assert_true(loss == 0);
    assert_int_equal(dw_engine_forward(e, tok, tgt, 2, 5, NULL, &loss), DW_ERR_INVALID);
    assert_int_equal(dw_engine_forward_backward(e, tok, tgt, 1, 5, 1.0, &loss), DW_ERR_INVALID);
    assert_int_equal(dw_engine_forward(e, tok, tgt, 0, 4, NULL, &loss), DW_ERR_INVALID);
    tok[5] = (int32_t)V;
    assert_int_equal(dw_engine_forward(e, tok, tgt, 2, 4, NULL, &loss), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "position 5"));
    assert_int_equal(dw_engine_forward_backward(e, tok, tgt, 2, 4, 1.0, &loss), DW_ERR_INVALID);
    tok[5] = -3;
    assert_int_equal(dw_engine_forward(e, tok, NULL, 2, 4, NULL, NULL), DW_ERR_INVALID);
    tok[5] = 0;
    tgt[2] = (int32_t)V;
    assert_int_equal(dw_engine_forward(e, tok, tgt, 2, 4, NULL, &loss), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "target"));
    tgt[2] = 0;
    assert_int_equal(dw_engine_forward_backward(e, tok, NULL, 2, 4, 1.0, &loss), DW_ERR_INVALID);
    assert_int_equal(dw_engine_forward(e, NULL, tgt, 2, 4, NULL, &loss), DW_ERR_INVALID);
    assert_int_equal(dw_engine_load_weights(e, "/nonexistent/w.safetensors"), DW_ERR_IO);
    assert_int_equal(dw_engine_forward(e, tok, tgt, 2, 4, NULL, &loss), DW_OK); /* still usable */
    dw_test_model_free(&m);
    /* planning-only models cannot be captured, so never reach an engine */
    dw_graph *g = (dw_graph *)1;
    assert_int_equal(dw_capture(dw_test_ctx, "mixtral-8x7b", NULL, &g), DW_ERR_UNSUPPORTED);
    assert_null(g);
}

/* ---- the optimizer ------------------------------------------------------------------------------ */
static void compare_to_ref(dw_engine *e, const dw_test_optref *r) {
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        float *p = read_param(e, i, false);
        if (memcmp(p, dw_test_optref_get(r, i, 0), (size_t)pnumel(e, i) * sizeof *p))
            fail_msg("%s differs from dw_cpu_adamw's update", dw_engine_param_name(e, i));
        free(p);
    }
}

/* dw_engine_step equals dw_cpu_adamw applied to the read-back parameters and gradients, bit for
 * bit, over several steps (moments carried), with clipping on, off and not reached, for FP32 and
 * BF16 programs; bad arguments are refused and change nothing. */
static void test_step_reference(void **state) {
    (void)state;
    const char *precs[3] = {NULL, "bf16", "fp8_block"};
    for (int f = 0; f < 3; f++) {
        const int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(2, 8);
        dw_test_model m = small(presets[dw_test_rnd(0, 2)], B, T, precs[f]);
        assert_int_equal(dw_engine_init_weights(m.e, dw_test_next(&dw_test_group_rng)), DW_OK);
        dw_test_optref *r = dw_test_optref_create(m.e);
        assert_non_null(r);
        int32_t tok[16], tgt[16];
        for (int64_t t = 1; t <= 4; t++) {
            random_tokens(tok, B * T, dw_graph_vocab(m.g));
            random_tokens(tgt, B * T, dw_graph_vocab(m.g));
            assert_int_equal(dw_engine_zero_grad(m.e), DW_OK);
            assert_int_equal(dw_engine_forward_backward(m.e, tok, tgt, B, T, 1.0, NULL), DW_OK);
            dw_adamw_opts o;
            dw_adamw_opts_init(&o, sizeof o);
            assert_true(o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.95 && o.eps == 1e-8 && o.weight_decay == 0.1 &&
                        o.clip == 1.0);
            o.lr = dw_test_uniform(&dw_test_group_rng, 1e-4f, 3e-2f);
            o.weight_decay = dw_test_uniform(&dw_test_group_rng, 0.0f, 0.3f);
            o.beta1 = dw_test_uniform(&dw_test_group_rng, 0.8f, 0.95f);
            o.beta2 = dw_test_uniform(&dw_test_group_rng, 0.9f, 0.999f);
            o.clip = (double[3]){0.0, 1e-2, 1e6}[t % 3]; /* off, clipping, not reached */
            const double want = dw_test_optref_step(r, m.e, &o, t);
            double norm = -1;
            assert_int_equal(dw_engine_step(m.e, &o, t, &norm), DW_OK);
            assert_memory_equal(&norm, &want, sizeof norm);
            compare_to_ref(m.e, r);
            if (t == 2) { /* refused arguments change nothing */
                float **before = snapshot(m.e);
                dw_adamw_opts bad = o;
                norm = 5;
                assert_int_equal(dw_engine_step(m.e, &bad, 0, &norm), DW_ERR_INVALID);
                assert_true(norm == 0);
                bad.lr = -1;
                assert_int_equal(dw_engine_step(m.e, &bad, 3, &norm), DW_ERR_INVALID);
                bad = o, bad.beta1 = 1.0;
                assert_int_equal(dw_engine_step(m.e, &bad, 3, &norm), DW_ERR_INVALID);
                bad = o, bad.eps = 0;
                assert_int_equal(dw_engine_step(m.e, &bad, 3, &norm), DW_ERR_INVALID);
                assert_true(unchanged(m.e, before));
                snapshot_free(m.e, before);
            }
        }
        dw_test_optref_free(r);
        dw_test_model_free(&m);
    }
}

/* A non-finite gradient: dw_engine_step returns DW_ERR_NUMERIC with the norm, and changes no
 * parameter and no moment (the next finite step matches a mirror that never saw it). */
static void test_step_nonfinite(void **state) {
    (void)state;
    const int64_t B = 1, T = dw_test_rnd(2, 8);
    dw_test_model m = small(presets[dw_test_rnd(0, 2)], B, T, dw_test_rnd(0, 1) ? "bf16" : NULL);
    assert_int_equal(dw_engine_init_weights(m.e, dw_test_next(&dw_test_group_rng)), DW_OK);
    dw_test_optref *r = dw_test_optref_create(m.e);
    int32_t tok[8], tgt[8];
    random_tokens(tok, B * T, dw_graph_vocab(m.g));
    random_tokens(tgt, B * T, dw_graph_vocab(m.g));
    dw_adamw_opts o;
    dw_adamw_opts_init(&o, sizeof o);
    o.lr = 1e-2;
    assert_int_equal(dw_engine_zero_grad(m.e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(m.e, tok, tgt, B, T, 1.0, NULL), DW_OK);
    (void)dw_test_optref_step(r, m.e, &o, 1);
    assert_int_equal(dw_engine_step(m.e, &o, 1, NULL), DW_OK);
    compare_to_ref(m.e, r);
    /* NaN in one parameter: NaN loss, NaN gradients */
    const int victim = (int)dw_test_rnd(0, dw_engine_param_count(m.e) - 1);
    float *keep = read_param(m.e, victim, false), *nan_p = read_param(m.e, victim, false);
    for (int64_t k = 0; k < pnumel(m.e, victim); k++) nan_p[k] = NAN; /* whole: unused rows would not matter */
    assert_int_equal(dw_engine_param_write(m.e, victim, nan_p), DW_OK);
    float **before = snapshot(m.e);
    double loss = 0, norm = 0;
    assert_int_equal(dw_engine_zero_grad(m.e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(m.e, tok, tgt, B, T, 1.0, &loss), DW_OK);
    assert_true(isnan(loss));
    assert_int_equal(dw_engine_step(m.e, &o, 2, &norm), DW_ERR_NUMERIC);
    assert_false(isfinite(norm));
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "not finite"));
    assert_true(unchanged(m.e, before));
    /* restored: the next step is the mirror's second step (moments untouched by the refused one) */
    assert_int_equal(dw_engine_param_write(m.e, victim, keep), DW_OK);
    assert_int_equal(dw_engine_zero_grad(m.e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(m.e, tok, tgt, B, T, 1.0, NULL), DW_OK);
    const double want = dw_test_optref_step(r, m.e, &o, 2);
    assert_int_equal(dw_engine_step(m.e, &o, 2, &norm), DW_OK);
    assert_memory_equal(&norm, &want, sizeof norm);
    compare_to_ref(m.e, r);
    snapshot_free(m.e, before);
    free(keep), free(nan_p);
    dw_test_optref_free(r);
    dw_test_model_free(&m);
}

/* ---- programs: BF16, quantised, compiled for CUDA ------------------------------------------------ */
typedef struct {
    double loss[16];
    float **params;
} run_result;

/* steps optimizer steps on one fixed batch from init seed; losses and final parameters. */
static run_result train_fixed(dw_engine *e, uint64_t seed, const int32_t *tok, const int32_t *tgt, int64_t B, int64_t T,
                              int steps) {
    run_result r;
    assert_int_equal(dw_engine_init_weights(e, seed), DW_OK);
    dw_adamw_opts o;
    dw_adamw_opts_init(&o, sizeof o);
    o.lr = 1e-2;
    for (int s = 0; s < steps; s++) {
        assert_int_equal(dw_engine_zero_grad(e), DW_OK);
        assert_int_equal(dw_engine_forward_backward(e, tok, tgt, B, T, 1.0, &r.loss[s]), DW_OK);
        assert_true(isfinite(r.loss[s]));
        double norm = 0;
        assert_int_equal(dw_engine_step(e, &o, s + 1, &norm), DW_OK);
        assert_true(isfinite(norm) && norm > 0);
    }
    r.params = snapshot(e);
    return r;
}

/* A BF16 program and a program of every quantised recipe train on the CPU engine: a few steps on
 * one fixed batch lower the loss, every loss finite, two runs from the same seed bit-identical;
 * the trained weights saved and loaded into a fresh engine give the same loss. */
static void test_low_precision_training(void **state) {
    (void)state;
    const char *precs[DW_RECIPE_COUNT];
    for (int k = 0; k < DW_RECIPE_COUNT; k++) precs[k] = dw_recipe_name((dw_recipe)k);
    assert_string_equal(precs[0], "bf16");
    for (int k = 0; k < DW_RECIPE_COUNT; k++) {
        const int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(4, 8);
        const char *preset = presets[dw_test_rnd(0, 2)];
        dw_graph *g = dw_test_small_graph(dw_test_ctx, preset, B, T, &dw_test_group_rng);
        assert_non_null(g);
        dw_test_model a = build(g, precs[k]), b = build(dw_test_same_graph(dw_test_ctx, g, 0, 0), precs[k]);
        int quantised_linears = 0;
        for (int i = 0; i < a.g->n_nodes; i++)
            quantised_linears += DW_OP_IS(&a.g->nodes[i], DW_OPF_GEMM) && a.c->node[i].bind.quantised[DW_QPASS_FPROP];
        assert_int_equal(quantised_linears > 0, k > 0);
        int32_t tok[16], tgt[16];
        random_tokens(tok, B * T, dw_graph_vocab(g));
        random_tokens(tgt, B * T, dw_graph_vocab(g));
        const uint64_t seed = dw_test_next(&dw_test_group_rng);
        const int steps = 8;
        run_result r1 = train_fixed(a.e, seed, tok, tgt, B, T, steps);
        run_result r2 = train_fixed(b.e, seed, tok, tgt, B, T, steps);
        print_message("%s %s: loss %.4f -> %.4f\n", preset, precs[k], r1.loss[0], r1.loss[steps - 1]);
        /* a small random model over 8 steps: the loss usually falls by more than 0.05, but one draw
         * (seed 14686680127205167, gpt2-tiny fp8_block) fell by 0.049; a broken path does not fall,
         * or goes non-finite */
        if (!(r1.loss[steps - 1] < r1.loss[0] - 0.02))
            fail_msg("%s %s: loss %.6f -> %.6f did not fall", preset, precs[k], r1.loss[0], r1.loss[steps - 1]);
        assert_memory_equal(r1.loss, r2.loss, (size_t)steps * sizeof r1.loss[0]);
        for (int i = 0; i < dw_engine_param_count(a.e); i++)
            assert_memory_equal(r1.params[i], r2.params[i], (size_t)pnumel(a.e, i) * sizeof(float));
        /* the trained weights saved and loaded into a fresh engine of the program: the same loss
         * (the load refreshes the BF16 copies and the weight caches) */
        char *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "w.safetensors");
        assert_int_equal(dw_engine_save_weights(a.e, path), DW_OK);
        dw_test_model c = build(dw_test_same_graph(dw_test_ctx, g, 0, 0), precs[k]);
        assert_int_equal(dw_engine_load_weights(c.e, path), DW_OK);
        double la, lc;
        assert_int_equal(dw_engine_forward(a.e, tok, tgt, B, T, NULL, &la), DW_OK);
        assert_int_equal(dw_engine_forward(c.e, tok, tgt, B, T, NULL, &lc), DW_OK);
        assert_true(la == lc && la < r1.loss[0]);
        dw_test_rmtree(dir);
        free(path), free(dir);
        snapshot_free(a.e, r1.params);
        snapshot_free(b.e, r2.params);
        dw_test_model_free(&a), dw_test_model_free(&b), dw_test_model_free(&c);
    }
}

/* A program compiled for CUDA (sm_90) runs on the CPU engine: the same loss twice, finite
 * training steps; it mirrors the target's decisions (the CPU-target program's loss exactly where
 * every fprop is decided alike; within 5% where sm_90 keeps a layer's fprop in BF16 and the CPU
 * target quantises it). */
static void test_cuda_program_on_cpu(void **state) {
    (void)state;
    const char *precs[3] = {"bf16", "fp8_block", "mxfp8"};
    for (int k = 0; k < 3; k++) {
        const int64_t B = 1, T = dw_test_rnd(4, 16);
        dw_graph *g = dw_test_small_graph(dw_test_ctx, presets[dw_test_rnd(0, 2)], B, T, &dw_test_group_rng);
        assert_non_null(g);
        dw_test_model gpu, cpu;
        if (dw_test_model_build(dw_test_ctx, g, precs[k], DW_DEVICE_CUDA, &gpu) != DW_OK)
            fail_msg("%s", dw_errmsg(dw_test_ctx));
        assert_int_equal(gpu.c->target.device, DW_DEVICE_CUDA);
        assert_int_equal(gpu.c->target.sm, 90);
        assert_string_equal(dw_engine_backend(gpu.e), "cpu");
        cpu = build(dw_test_same_graph(dw_test_ctx, g, 0, 0), precs[k]);
        const uint64_t seed = dw_test_next(&dw_test_group_rng);
        assert_int_equal(dw_engine_init_weights(gpu.e, seed), DW_OK);
        assert_int_equal(dw_engine_init_weights(cpu.e, seed), DW_OK);
        int32_t tok[16], tgt[16];
        random_tokens(tok, B * T, dw_graph_vocab(g));
        random_tokens(tgt, B * T, dw_graph_vocab(g));
        double l1, l2, lc;
        assert_int_equal(dw_engine_forward(gpu.e, tok, tgt, B, T, NULL, &l1), DW_OK);
        assert_int_equal(dw_engine_forward(gpu.e, tok, tgt, B, T, NULL, &l2), DW_OK);
        assert_true(isfinite(l1) && l1 == l2);
        assert_int_equal(dw_engine_forward(cpu.e, tok, tgt, B, T, NULL, &lc), DW_OK);
        bool differs = false;
        for (int i = 0; i < g->n_nodes; i++)
            differs = differs ||
                      gpu.c->node[i].bind.quantised[DW_QPASS_FPROP] != cpu.c->node[i].bind.quantised[DW_QPASS_FPROP];
        /* where they differ the losses may still coincide (DW_TEST_SEED=28354835337105408's draw):
         * two quantisations of one model stay close */
        if (differs) assert_true(fabs(l1 - lc) <= 0.05 * fabs(lc));
        else assert_true(l1 == lc);
        /* and it trains: the same loss again after identical steps from the same start */
        dw_test_optref *r = dw_test_optref_create(gpu.e);
        for (int64_t t = 1; t <= 2; t++) {
            dw_adamw_opts o;
            dw_adamw_opts_init(&o, sizeof o);
            double loss = 0;
            assert_int_equal(dw_engine_zero_grad(gpu.e), DW_OK);
            assert_int_equal(dw_engine_forward_backward(gpu.e, tok, tgt, B, T, 1.0, &loss), DW_OK);
            assert_true(isfinite(loss));
            if (t == 1) assert_true(loss == l1);
            const double want = dw_test_optref_step(r, gpu.e, &o, t);
            double norm = 0;
            assert_int_equal(dw_engine_step(gpu.e, &o, t, &norm), DW_OK);
            assert_memory_equal(&norm, &want, sizeof norm);
            compare_to_ref(gpu.e, r);
        }
        dw_test_optref_free(r);
        dw_test_model_free(&gpu), dw_test_model_free(&cpu);
    }
}

/* Two engines over one program, with the options at their defaults and turned off (recording,
 * quantised-input reuse): the options change how steps are issued, never the numbers. */
static void test_engine_opts(void **state) {
    (void)state;
    const int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(2, 8);
    dw_test_model m = small("llama-tiny", B, T, "fp8_block");
    dw_engine_opts o;
    dw_engine_opts_init(&o, sizeof o);
    assert_int_equal(o.size, sizeof o);
    if (!getenv("DW_CUDA_GRAPH")) assert_true(o.record);
    if (!getenv("DW_QUANT_REUSE")) assert_true(o.quant_reuse);
    o.record = o.quant_reuse = false;
    dw_engine *e2 = NULL;
    assert_int_equal(dw_engine_create(dw_test_ctx, m.c, &o, &e2), DW_OK);
    const uint64_t seed = dw_test_next(&dw_test_group_rng);
    assert_int_equal(dw_engine_init_weights(m.e, seed), DW_OK);
    assert_int_equal(dw_engine_init_weights(e2, seed), DW_OK);
    int32_t tok[16], tgt[16];
    random_tokens(tok, B * T, dw_graph_vocab(m.g));
    random_tokens(tgt, B * T, dw_graph_vocab(m.g));
    dw_adamw_opts ao;
    dw_adamw_opts_init(&ao, sizeof ao);
    for (int64_t t = 1; t <= 3; t++) {
        double l1, l2, n1, n2;
        for (int k = 0; k < 2; k++) {
            dw_engine *e = k ? e2 : m.e;
            assert_int_equal(dw_engine_zero_grad(e), DW_OK);
            assert_int_equal(dw_engine_forward_backward(e, tok, tgt, B, T, 0.5, k ? &l2 : &l1), DW_OK);
            assert_int_equal(dw_engine_forward_backward(e, tok, tgt, B, T, 0.5, NULL), DW_OK);
            assert_int_equal(dw_engine_step(e, &ao, t, k ? &n2 : &n1), DW_OK);
        }
        assert_true(l1 == l2 && n1 == n2);
        assert_true(same_params(m.e, e2));
    }
    dw_engine_free(e2);
    dw_test_model_free(&m);
}

/* A program compiled for sm_90 on shapes its FP8 block kernels take (multiples of 128) run on the
 * CPU with fewer rows than planned: where the target would fall back to BF16 at that row count
 * (wgrad over 64 tokens) the CPU does too; training there is finite and deterministic. */
static void test_cuda_program_fewer_rows(void **state) {
    (void)state;
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(dw_test_ctx, "llama-tiny", &cfg), DW_OK);
    cfg.n_layers = 1, cfg.d_model = 128, cfg.d_ff = 256, cfg.max_seq = 128;
    cfg.n_heads = 2, cfg.n_kv_heads = 2, cfg.head_dim = 64;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(dw_test_ctx, &cfg, 1, 128, &g), DW_OK);
    dw_test_model m;
    if (dw_test_model_build(dw_test_ctx, g, "fp8_block", DW_DEVICE_CUDA, &m) != DW_OK)
        fail_msg("%s", dw_errmsg(dw_test_ctx));
    int lin = -1;
    for (int i = 0; i < g->n_nodes && lin < 0; i++)
        if (g->nodes[i].op == DW_OP_LINEAR && m.c->node[i].bind.quantised[DW_QPASS_WGRAD]) lin = i;
    assert_true(lin >= 0); /* quantised at the planned 128 tokens */
    assert_false(dw_compile_linear_quantised(m.c, lin, DW_QPASS_WGRAD, 64, NULL, NULL, 0));
    assert_int_equal(dw_engine_init_weights(m.e, dw_test_next(&dw_test_group_rng)), DW_OK);
    int32_t tok[128], tgt[128];
    random_tokens(tok, 128, dw_graph_vocab(g));
    random_tokens(tgt, 128, dw_graph_vocab(g));
    const int64_t T = 64;
    double l[2];
    int64_t n;
    float *gr[2];
    for (int k = 0; k < 2; k++) {
        assert_int_equal(dw_engine_zero_grad(m.e), DW_OK);
        assert_int_equal(dw_engine_forward_backward(m.e, tok, tgt, 1, T, 1.0, &l[k]), DW_OK);
        assert_true(isfinite(l[k]));
        gr[k] = all_grads(m.e, &n);
    }
    assert_true(l[0] == l[1]);
    assert_memory_equal(gr[0], gr[1], (size_t)n * sizeof(float));
    for (int64_t k = 0; k < n; k++) assert_true(isfinite(gr[0][k]));
    free(gr[0]), free(gr[1]);
    dw_test_model_free(&m);
}

/* The parity dump: the given logits and loss, and every parameter's gradient under its Hugging
 * Face name and layout (GPT-2's Conv1D transposed). */
static void test_dump(void **state) {
    (void)state;
    const int64_t B = 1, T = dw_test_rnd(2, 6);
    dw_test_model m = small("gpt2-tiny", B, T, NULL);
    random_weights(m.e, 0.3f);
    const int64_t V = dw_graph_vocab(m.g);
    int32_t tok[8], tgt[8];
    random_tokens(tok, B * T, V);
    random_tokens(tgt, B * T, V);
    float *logits = malloc((size_t)(B * T * V) * sizeof *logits);
    double loss;
    assert_int_equal(dw_engine_forward(m.e, tok, tgt, B, T, logits, &loss), DW_OK);
    assert_int_equal(dw_engine_zero_grad(m.e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(m.e, tok, tgt, B, T, 1.0, NULL), DW_OK);
    char *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "dump.safetensors");
    assert_int_equal(dw_engine_dump(m.e, path, logits, B, T, loss), DW_OK);
    dw_st_file *f = NULL;
    assert_int_equal(dw_st_open(dw_test_ctx, path, &f), DW_OK);
    assert_int_equal(dw_st_count(f), dw_engine_param_count(m.e) + 2);
    const dw_st_tensor *lt = dw_st_find(f, "loss"), *gt = dw_st_find(f, "logits");
    assert_non_null(lt);
    assert_non_null(gt);
    float l = 0;
    assert_int_equal(dw_st_read_f32(dw_test_ctx, f, lt, &l), DW_OK);
    assert_true(l == (float)loss);
    float *back = malloc((size_t)(B * T * V) * sizeof *back);
    assert_int_equal(dw_st_read_f32(dw_test_ctx, f, gt, back), DW_OK);
    assert_memory_equal(back, logits, (size_t)(B * T * V) * sizeof *back);
    for (int i = 0; i < dw_engine_param_count(m.e); i++) {
        const dw_st_tensor *t = dw_st_find(f, dw_engine_param_name(m.e, i));
        assert_non_null(t);
        int64_t shape[4];
        const int nd = dw_engine_param_shape(m.e, i, shape);
        const bool tr = m.g->tensors[m.c->param_tensor[i]].hf_transposed;
        float *g = read_param(m.e, i, true), *h = malloc((size_t)pnumel(m.e, i) * sizeof *h);
        assert_int_equal(dw_st_read_f32(dw_test_ctx, f, t, h), DW_OK);
        assert_int_equal(t->ndim, nd);
        for (int64_t k = 0; k < pnumel(m.e, i); k++) {
            const int64_t r = nd == 2 ? k / shape[1] : k, c = nd == 2 ? k % shape[1] : 0;
            assert_true(g[k] == (tr ? h[c * shape[0] + r] : h[k]));
        }
        free(g), free(h);
    }
    dw_st_close(f);
    free(back), free(logits);
    dw_test_rmtree(dir);
    free(path), free(dir);
    dw_test_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_and_init),
        cmocka_unit_test(test_save_load),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_loss_reference),
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_shared_reads),
        cmocka_unit_test(test_accumulate_and_shapes),
        cmocka_unit_test(test_smaller_batches),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_step_reference),
        cmocka_unit_test(test_step_nonfinite),
        cmocka_unit_test(test_low_precision_training),
        cmocka_unit_test(test_cuda_program_on_cpu),
        cmocka_unit_test(test_cuda_program_fewer_rows),
        cmocka_unit_test(test_engine_opts),
        cmocka_unit_test(test_dump),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
