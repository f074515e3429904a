/* test_wgrad_sumsq_plan.c — the plan of the experts' wgrad share of the gradient norm
 * (compile/wgrad_sumsq.c, workspace.c), on programs compiled for sm_90 here:
 *   - mixtral-tiny and olmoe-tiny in BF16 and fp8_block (the experts' wgrad BF16 by default), a
 *     random batch: every MoE linear layer writes partials, the only writer of its weight; their
 *     workspace ranges lie end to end in work.wsumsq, apart from every other workspace item; the
 *     norm's segments and the covered weights tile the gradient pool exactly once (a byte map),
 *     and dw_compile_wsumsq_floats counts the covered weights' floats (the planner's saving);
 *   - none where the rule does not hold: a CPU target, an FP32 program, no grad_arena, the experts'
 *     wgrad in fp8_block (a rule's "bf16_passes": [], experts widened to 128): then one segment,
 *     the whole pool;
 *   - a mixtral of 70 layers (140 MoE linear layers): the first 127 write partials, the segments
 *     stay within the norm kernel's 128.
 * The partials themselves and the norm are checked on an H100 (tests/gpu/test_ops_cuda_moe_wgrad.c,
 * test_engine_cuda.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "capture/model_config.h"
#include "compile/passes.h"
#include "compile/wgrad_sumsq.h"
#include "ir/ir.h"
#include "kernels/cuda/ops_cuda.h"
#include "testutil.h"

#define CTX dw_test_ctx

typedef struct {
    dw_graph *g;
    dw_policy *pol;
    dw_compiled *c;
} prog;

static void build(const char *preset, int layers, bool wide, const char *precision, dw_device_kind dev, bool arena,
                  prog *m) {
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, preset, &mc), DW_OK);
    if (layers) mc.n_layers = layers;
    if (wide) mc.d_model = 128, mc.head_dim = 32, mc.d_ff = 256, mc.d_ff_expert = 256;
    const int64_t B = dw_test_rnd(1, 3), T = 8 << dw_test_rnd(0, 1);
    memset(m, 0, sizeof *m);
    assert_int_equal(dw_capture_config(CTX, &mc, B, T, &m->g), DW_OK);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.grad_arena = arena, o.bf16_arena = arena && precision;
    o.device = dev;
    if (dev == DW_DEVICE_CUDA) o.sm = 90;
    if (precision) assert_int_equal(dw_test_policy(CTX, precision, true, &m->pol), DW_OK);
    assert_int_equal(dw_compile(CTX, m->g, NULL, m->pol, &o, &m->c), DW_OK);
}

static void drop(prog *m) {
    dw_compiled_free(m->c);
    dw_policy_free(m->pol);
    dw_graph_free(m->g);
}

/* The workspace items besides the partials, [off, off + bytes), that must not overlap them. */
static void apart_from_others(const dw_compiled *c) {
    const dw_work_layout *w = &c->work;
    const int64_t lo = w->wsumsq, hi = lo + w->wsumsq_parts * 8;
    const int64_t items[][2] = {{w->tokens, 4}, {w->targets, 4}, {w->loss, 4}, {w->norm, 8},
                                {w->partials, DW_COMPILE_NORM_BLOCKS * 8}, {w->adamw_args, DW_COMPILE_ADAMW_ARGS_BYTES},
                                {w->moe_aux, 8}, {w->moe_counts, 8}, {w->moe_bias, 4}, {w->bgrad, 4}};
    for (size_t i = 0; i < sizeof items / sizeof *items; i++)
        if (items[i][0] >= 0) assert_true(items[i][0] + items[i][1] <= lo || items[i][0] >= hi);
    assert_true(hi <= w->bytes);
}

/* The program's layers with partials (n_moe: its MoE linear layers); checks the layout and the
 * segments. Returns how many write partials. */
static int check_plan(const dw_compiled *c, int *n_moe) {
    const dw_graph *g = c->g;
    int n = 0;
    int64_t at = c->work.wsumsq, parts = 0, covered = 0;
    *n_moe = 0;
    unsigned char *map = calloc((size_t)c->param_floats, 1); /* times each pool float is covered */
    assert_non_null(map);
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op == DW_OP_MOE_LINEAR) ++*n_moe;
        const int64_t o = dw_compile_wsumsq_of(c, i);
        assert_int_equal(o >= 0, dw_compile_wsumsq_node(c, i));
        if (o < 0) continue;
        assert_int_equal(g->nodes[i].op, DW_OP_MOE_LINEAR);
        assert_true(c->node[i].pgrad_set >> 1 & 1u);
        assert_false(c->node[i].bind.quantised[DW_QPASS_WGRAD]);
        const dw_ir_tensor *w = &g->tensors[g->nodes[i].in[1]];
        const int k = c->tensor[g->nodes[i].in[1]].param;
        assert_int_equal(c->grad_first[k], i);
        for (int j = 0; j < g->n_nodes; j++) /* the weight's one reader */
            for (int s = 0; s < g->nodes[j].n_in; s++)
                if (c->tensor[g->nodes[j].in[s]].param == k) assert_true(j == i && s == 1);
        assert_int_equal(o, at); /* end to end, in node order */
        const int64_t np = dw_moe_sumsq_parts(w->shape[0], w->shape[1], w->shape[2]);
        assert_int_equal(np, w->shape[0] * ((w->shape[1] + 63) / 64) * ((w->shape[2] + 127) / 128));
        at += np * 8, parts += np, n++, covered += dw_ir_numel(w);
        for (int64_t f = c->param_off[k]; f < c->param_off[k] + dw_ir_numel(w); f++) map[f]++;
    }
    assert_int_equal(parts, c->work.wsumsq_parts);
    assert_int_equal(covered, dw_compile_wsumsq_floats(c)); /* the planner's saving */
    if (n) apart_from_others(c);
    else assert_int_equal(c->work.wsumsq, -1);
    int64_t segs[DW_COMPILE_NORM_SEGS][2];
    const int ns = dw_compile_norm_segments(c, segs, DW_COMPILE_NORM_SEGS);
    assert_true(ns >= 1 && ns <= DW_COMPILE_NORM_SEGS && ns <= n + 1);
    for (int s = 0; s < ns; s++) {
        assert_true(0 <= segs[s][0] && segs[s][0] < segs[s][1] && segs[s][1] <= c->param_floats);
        if (s) assert_true(segs[s - 1][1] < segs[s][0]); /* apart: a covered weight between */
        for (int64_t f = segs[s][0]; f < segs[s][1]; f++) map[f]++;
    }
    for (int64_t f = 0; f < c->param_floats; f++)
        if (map[f] != 1) fail_msg("pool float %lld covered %d times", (long long)f, map[f]);
    free(map);
    return n;
}

static void test_every_expert_layer(void **state) {
    (void)state;
    static const char *const presets[] = {"mixtral-tiny", "olmoe-tiny"};
    static const char *const precisions[] = {"bf16", "fp8_block"};
    for (int p = 0; p < 2; p++)
        for (int r = 0; r < 2; r++) {
            prog m;
            build(presets[p], 0, r == 1, precisions[r], DW_DEVICE_CUDA, true, &m);
            int n_moe = 0;
            const int n = check_plan(m.c, &n_moe);
            assert_true(n_moe > 0);
            assert_int_equal(n, n_moe);
            print_message("%s %s: %d MoE linear layers, %lld partials\n", presets[p], precisions[r], n, (long long)m.c->work.wsumsq_parts);
            drop(&m);
        }
}

static void test_none(void **state) {
    (void)state;
    struct {
        const char *precision;
        dw_device_kind dev;
        bool arena, wide;
    } cases[] = {{"bf16", DW_DEVICE_CPU, true, false},
                 {NULL, DW_DEVICE_CUDA, true, false},
                 {"bf16", DW_DEVICE_CUDA, false, false},
                 {DW_TEST_FP8_WGRAD, DW_DEVICE_CUDA, true, true}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        prog m;
        build("mixtral-tiny", 0, cases[i].wide, cases[i].precision, cases[i].dev, cases[i].arena, &m);
        int n_moe = 0;
        assert_int_equal(check_plan(m.c, &n_moe), 0);
        assert_true(n_moe > 0);
        int64_t segs[DW_COMPILE_NORM_SEGS][2];
        assert_int_equal(dw_compile_norm_segments(m.c, segs, DW_COMPILE_NORM_SEGS), 1);
        assert_true(segs[0][0] == 0 && segs[0][1] == m.c->param_floats);
        drop(&m);
    }
}

static void test_cap(void **state) {
    (void)state;
    prog m;
    build("mixtral-tiny", 70, false, "bf16", DW_DEVICE_CUDA, true, &m);
    int n_moe = 0;
    assert_int_equal(check_plan(m.c, &n_moe), DW_COMPILE_NORM_SEGS - 1);
    assert_true(n_moe > DW_COMPILE_NORM_SEGS);
    drop(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_expert_layer),
        cmocka_unit_test(test_none),
        cmocka_unit_test(test_cap),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
