/* test_guard_counts_passes.c — the weight counters of a layer some of whose GEMMs the target runs
 * in BF16 (issue 31): the weight cache quantises W and W^T after every update, but only a copy a
 * quantised GEMM reads is counted — W where the fprop runs quantised, W^T where the dgrad does —
 * since those are what the guard's check measures (w, w^T; train/guard_quant.c). On sm90 the
 * fp8_block GEMMs need k % 128 == 0, so llama's k/v projections of width 128 (M = 64) run their
 * dgrad in BF16: tests/gpu/test_quant_counts_cuda.c's training counted W^T there and measured
 * none ("counted 0 / 2, measured 0 / 1"). The CPU engine's reference GEMM takes every shape, so
 * here the program's bindings are set as such a target's registry sets them (both backends run a
 * pass bound to BF16 in BF16; DW_TEST_DEVICE=cuda runs this on the CUDA engine): each quantised
 * linear layer of a llama gets a random subset of its fprop, dgrad and wgrad bound to BF16
 * (layers with all three, none, and each alone occur over the recipes). With about 1 in 32 of
 * every weight planted at 1e-12 of its RMS (flushed by every recipe; a learning rate of 1e-9 keeps
 * them there), a check every step and no fallback, for fp8_block, mxfp8 and mxfp4 and each step
 * from 2 on: every layer's counted w and dy equal the check's w + w^T and dy + dy^T, overflows,
 * underflows and elements (testutil's dw_test_quant_counts_check); the quant_stats.jsonl lines of
 * each layer are those of its quantised passes (x and w: fprop, w^T and dy: dgrad, x^T and dy^T:
 * wgrad), and its counted w elements are M x K per copy read. Fresh random weights, data and
 * bindings per run (DW_TEST_SEED replays). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "deepwell.h"
#include "runtime/engine.h"
#include "testutil.h"

static dw_ctx *ctx;
static dw_test_rng rng;
static char *dir, *model;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&rng, dw_test_seed());
    return dw_test_train_fixture(&ctx, &dir, &model, 2, 32, 64);
}
static int teardown(void **state) {
    (void)state;
    dw_test_train_fixture_close(ctx, dir, model);
    return 0;
}

/* Each quantised linear layer's passes bound to BF16 at random (a third of the time each), as a
 * registry that refuses their shapes binds them; the mask of quantised passes per node in q. */
static void bind_passes(dw_engine *e, unsigned *q) {
    dw_compiled *p = (dw_compiled *)dw_engine_program(e); /* the guard's own fallback writes it alike */
    for (int i = 0; i < e->g->n_nodes; i++) {
        dw_node_binding *b = &p->node[i].bind;
        q[i] = 0;
        if (strcmp(dw_op_name(e->g->nodes[i].op), "linear") || !dw_compile_quant_recipe(b->recipe)) continue;
        for (int pass = 0; pass < DW_QPASS_COUNT; pass++) {
            if (b->quantised[pass] && dw_test_next(&rng) % 3 == 0) b->quantised[pass] = false;
            q[i] |= (unsigned)b->quantised[pass] << pass;
        }
    }
}

/* About 1 in 32 elements of every projection weight at 1e-12 of its value: flushed in every recipe. */
static void plant_flushed(dw_engine *e) {
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        if (!strstr(dw_engine_param_name(e, i), "_proj.weight")) continue;
        int64_t sh[4];
        dw_engine_param_shape(e, i, sh);
        float *w = malloc((size_t)(sh[0] * sh[1]) * sizeof *w);
        assert_int_equal(dw_engine_param_read(e, i, w), DW_OK);
        for (int64_t k = 0; k < sh[0] * sh[1]; k++)
            if (dw_test_next(&rng) % 32 == 0) w[k] *= 1e-12f;
        assert_int_equal(dw_engine_param_write(e, i, w), DW_OK);
        free(w);
    }
}

static const char *str(const json_t *j, const char *k) {
    const char *s = json_string_value(json_object_get(j, k));
    return s ? s : "";
}
static long long num(const json_t *j, const char *k) { return (long long)json_integer_value(json_object_get(j, k)); }

/* Step `step` of run `out`: each layer's measured tensors are those of its quantised passes
 * (q[node]) and its counted w elements M x K per copy read; *mixed counts the layers with a copy
 * of W read and one not. */
static void lines_follow_passes(dw_engine *e, const char *out, int64_t step, const unsigned *q, int *mixed) {
    static const char *const TENSOR[6] = {"x", "x^T", "w", "w^T", "dy", "dy^T"};
    static const int PASS[6] = {DW_QPASS_FPROP, DW_QPASS_WGRAD, DW_QPASS_FPROP, DW_QPASS_DGRAD, DW_QPASS_DGRAD,
                                DW_QPASS_WGRAD};
    char *qp = dw_test_path(out, "quant_stats.jsonl");
    json_t *qs = dw_test_json_lines(qp);
    assert_non_null(qs);
    int layers = 0;
    for (int i = 0; i < e->g->n_nodes; i++) {
        if (strcmp(dw_op_name(e->g->nodes[i].op), "linear")) continue;
        const char *name = e->g->nodes[i].name;
        long long w_elements = -1;
        int seen[6] = {0};
        for (size_t k = 0; k < json_array_size(qs); k++) {
            const json_t *j = json_array_get(qs, k);
            if (num(j, "step") != step || strcmp(str(j, "layer"), name)) continue;
            if (!strcmp(str(j, "counts"), "w")) w_elements = num(j, "elements");
            for (int t = 0; t < 6; t++) seen[t] += !strcmp(str(j, "tensor"), TENSOR[t]);
        }
        if (w_elements < 0) continue; /* not a counted layer (BF16 by the policy) */
        layers++;
        for (int t = 0; t < 6; t++)
            if (seen[t] != (int)((q[i] >> PASS[t]) & 1u))
                fail_msg("step %lld %s: %d %s lines, its %s runs %s", (long long)step, name, seen[t], TENSOR[t],
                         PASS[t] == DW_QPASS_FPROP ? "fprop" : PASS[t] == DW_QPASS_DGRAD ? "dgrad" : "wgrad",
                         (q[i] >> PASS[t]) & 1u ? "quantised" : "in BF16");
        int64_t N, K, M;
        dw_compile_linear_dims(e->p, i, &N, &K, &M);
        const int copies = (int)((q[i] >> DW_QPASS_FPROP) & 1u) + (int)((q[i] >> DW_QPASS_DGRAD) & 1u);
        if (w_elements != copies * M * K)
            fail_msg("step %lld %s: counted %lld w elements, %d copies of [%lld, %lld] read", (long long)step, name,
                     w_elements, copies, (long long)M, (long long)K);
        *mixed += copies == 1;
    }
    assert_int_equal(layers, 14);
    json_decref(qs);
    free(qp);
}

static void test_counts_follow_passes(void **state) {
    (void)state;
    const char *recipes[3] = {"fp8_block", "mxfp8", "mxfp4"};
    int mixed = 0;
    for (int r = 0; r < 3; r++) {
        dw_policy *pol = NULL;
        assert_int_equal(dw_policy_from_precision(ctx, recipes[r], false, &pol), DW_OK);
        dw_model *m = dw_test_open_model(ctx, model, dw_test_next(&rng), pol, 2, 16);
        assert_non_null(m);
        dw_engine *e = dw_model_engine(m);
        unsigned *q = calloc((size_t)e->g->n_nodes, sizeof *q);
        bind_passes(e, q);
        plant_flushed(e);
        char *out = dw_test_path(dir, recipes[r]);
        dw_train_opts o;
        dw_train_opts_init(&o, sizeof o);
        o.data = "builtin", o.out_dir = out, o.steps = 3, o.batch = 2, o.seq = 16, o.global_batch = 2;
        o.warmup = 2, o.lr = 1e-9, o.min_lr = 0, o.eval_every = 0, o.ckpt_minutes = 0;
        o.seed = dw_test_next(&rng) >> 1;
        o.quant_check_every = 1, o.quant_fallback_after = 0;
        if (dw_train(e, &o) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
        for (int64_t step = 2; step <= 3; step++) {
            int layers = 0;
            long long w_under = 0;
            if (dw_test_quant_counts_check(out, step, &layers, &w_under) != 0)
                fail_msg("%s: step %lld", recipes[r], (long long)step);
            assert_int_equal(layers, 14); /* 2 blocks x 7 linear layers */
            lines_follow_passes(e, out, step, q, &mixed);
        }
        free(q);
        dw_model_free(m);
        dw_policy_free(pol);
        free(out);
    }
    assert_true(mixed > 0); /* (42 layers, each reading one copy of W with probability 4/9) */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_follow_passes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
