/* test_recompute.c — activation recompute (src/compile/recompute.c, dw_compile_opts.recompute):
 * every dense and MoE preset family, in FP32, BF16 and fp8_block, trains on the CPU engine with
 * DW_RECOMPUTE_FULL (every block, or the first N) and with DW_RECOMPUTE_SELECTIVE to the very bits
 * of the same program without it (losses, and every parameter after the last AdamW step) and MoE
 * routing counters, from the same random weights and tokens; the recomputing program's activation
 * arena is smaller; under FULL its backward sweep runs each block's forwards again (every node of
 * a block but the auxiliary loss) before the block's first backward; under SELECTIVE exactly the
 * memory-bound GEMM inputs run again (every norm a linear layer reads, every MLP activation no
 * epilogue computes, the MoE layers' rematerialised nodes unless moe_remat is off), each once,
 * before the first backward reading its output, and no GEMM or attention; no live buffers of any
 * plan share bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/program.h"
#include "ir/ir.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx

/* dw_compile_opts.moe_remat of the programs build() makes (its default: on) */
static bool g_moe_remat = true;

/* A preset captured at batch x seq, its program (recompute as given) and CPU engine; m owns the graph. */
static void build(const char *preset, int64_t B, int64_t T, const char *precision, int recompute, int blocks,
                  dw_test_model *m) {
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, preset, &mc), DW_OK);
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(CTX, &mc, B, T, &g), DW_OK);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.recompute = recompute;
    o.recompute_blocks = blocks;
    o.moe_remat = g_moe_remat;
    assert_int_equal(dw_test_model_build_opts(CTX, g, precision, &o, m), DW_OK);
}

/* No two items of the plan are live at one time and overlap in bytes. */
static void assert_plan_disjoint(const dw_compiled *c) {
    int i, j, t;
    if (dw_test_plan_overlap(c, &i, &j, &t)) fail_msg("items %d and %d share bytes while both live at time %d", i, j, t);
}

/* The backward sweep of c: each recomputed node's forward exactly once, before its block's first
 * backward step and after the backward of every later block; returns how many it ran again. */
static int check_sweep(const dw_compiled *c) {
    const dw_graph *g = c->g;
    int again = 0, *seen = calloc((size_t)g->n_nodes, sizeof *seen);
    assert_non_null(seen);
    for (int s = c->phase[DW_PHASE_BACKWARD][0]; s < c->phase[DW_PHASE_BACKWARD][1]; s++) {
        const dw_step *st = &c->steps[s];
        if (st->kind == DW_STEP_FWD) {
            assert_int_equal(st->arg, 1);
            if (dw_compile_remat(c, st->node)) continue; /* a MoE output rematerialised: test_moe_mem.c */
            assert_true(g->nodes[st->node].block >= 0);
            assert_int_equal(seen[st->node]++, 0);
            again++;
        } else if (st->kind == DW_STEP_BWD && g->nodes[st->node].block >= 0) {
            /* every recomputable node of this block has run again already */
            for (int i = 0; i < g->n_nodes; i++)
                if (g->nodes[i].block == g->nodes[st->node].block && dw_compile_recomputed(c, i))
                    assert_int_equal(seen[i], 1);
        }
    }
    free(seen);
    return again;
}

/* Under SELECTIVE: the nodes that run again are memory-bound GEMM-input producers, each once, and
 * every norm a linear layer reads and every MLP activation that no epilogue computes is one of
 * them; returns how many ran again. */
static int check_selective(const dw_compiled *c) {
    const dw_graph *g = c->g;
    int again = 0, norms = 0, acts = 0, *seen = calloc((size_t)g->n_nodes, sizeof *seen);
    assert_non_null(seen);
    for (int s = c->phase[DW_PHASE_BACKWARD][0]; s < c->phase[DW_PHASE_BACKWARD][1]; s++) {
        const dw_step *st = &c->steps[s];
        if (st->kind != DW_STEP_FWD) continue;
        const dw_op op = g->nodes[st->node].op;
        if (op == DW_OP_LINEAR || op == DW_OP_MOE_LINEAR || op == DW_OP_ATTENTION)
            fail_msg("node %s (%s) runs again under selective recompute", g->nodes[st->node].name, dw_op_name(op));
        if (op == DW_OP_MOE_DISPATCH && !c->moe_remat) fail_msg("a dispatch runs again with moe_remat off");
        assert_true(dw_compile_remat(c, st->node));
        assert_int_equal(seen[st->node]++, 0);
        again++;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        bool feeds_linear = false, of_linear = false;
        for (int k = 0; k < g->n_nodes; k++)
            feeds_linear |= g->nodes[k].op == DW_OP_LINEAR && g->nodes[k].in[0] == n->out[0];
        const int p = n->n_in ? g->tensors[n->in[0]].producer : -1;
        of_linear = p >= 0 && g->nodes[p].op == DW_OP_LINEAR;
        const bool norm = n->op == DW_OP_RMSNORM || n->op == DW_OP_LAYERNORM;
        const bool act = n->op == DW_OP_SWIGLU || n->op == DW_OP_GEGLU || n->op == DW_OP_GELU || n->op == DW_OP_SILU;
        if (norm && feeds_linear) norms++, assert_true(dw_compile_remat(c, i));
        if (act && of_linear && !(c->node[i].fused & DW_FUSED_FWD)) acts++, assert_true(dw_compile_remat(c, i));
    }
    assert_true(norms >= 2 * (int)g->model.n_blocks); /* each block's two norms at least */
    assert_true(acts > 0 || c->fuse);                 /* GPT-2's GELU in its linear's epilogue (BF16) */
    free(seen);
    return again;
}

/* One preset at one precision: both programs from the same weights and tokens, bit for bit; the
 * recomputing one (mode FULL or SELECTIVE) recomputes every block, or (FULL, blocks > 0) the first
 * `blocks`. */
static void same_bits(const char *preset, const char *precision, int mode, int blocks) {
    const int64_t B = 2, T = 16;
    dw_test_model a, r;
    build(preset, B, T, precision, DW_RECOMPUTE_NONE, 0, &a);
    build(preset, B, T, precision, mode, blocks, &r);
    const dw_graph *g = a.g;
    for (int i = 0; i < g->n_nodes; i++) /* blocks past the first `blocks` run once (but MoE rematerialisation) */
        if (blocks && g->nodes[i].block >= blocks && !dw_compile_remat(r.c, i))
            assert_int_equal(dw_compile_rc_time(r.c, i), -1);
    assert_plan_disjoint(a.c);
    assert_plan_disjoint(r.c);
    assert_int_equal(check_sweep(a.c), 0);
    const int again = mode == DW_RECOMPUTE_SELECTIVE ? check_selective(r.c) : check_sweep(r.c);
    assert_true(again > 0);
    const int64_t arena_a = dw_compiled_pool_bytes(a.c, 3), arena_r = dw_compiled_pool_bytes(r.c, 3);
    if (arena_r >= arena_a) fail_msg("%s %s: recompute arena %lld bytes, not below %lld", preset,
                                     precision ? precision : "fp32", (long long)arena_r, (long long)arena_a);

    char what[96];
    snprintf(what, sizeof what, "%s %s, without and with recompute %s", preset, precision ? precision : "fp32",
             dw_recompute_name((dw_recompute)mode));
    double r0, r1;
    assert_int_equal(dw_test_same_training(&r, &a, B, T, 3, 1e-2, dw_test_next(&dw_test_group_rng), what, &r0, &r1), 0);
    printf("  %-15s %-9s %-9s %d blocks: %3d forwards again, arena %8lld -> %8lld bytes (%.2fx), losses %.6f %.6f\n",
           preset, precision ? precision : "fp32", dw_recompute_name((dw_recompute)mode),
           blocks ? blocks : (int)g->model.n_blocks, again, (long long)arena_a, (long long)arena_r,
           (double)arena_r / (double)arena_a, r0, r1);
    dw_test_model_free(&a);
    dw_test_model_free(&r);
}

static void test_dense_same_bits(void **state) {
    (void)state;
    static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};
    static const char *const precisions[] = {NULL, "bf16", "fp8_block"};
    for (size_t p = 0; p < sizeof presets / sizeof *presets; p++)
        for (size_t q = 0; q < sizeof precisions / sizeof *precisions; q++) {
            same_bits(presets[p], precisions[q], DW_RECOMPUTE_FULL, 0);
            same_bits(presets[p], precisions[q], DW_RECOMPUTE_SELECTIVE, 0);
        }
    same_bits("llama-tiny", "bf16", DW_RECOMPUTE_FULL, 1); /* the first block of four */
    same_bits("gpt2-tiny", NULL, DW_RECOMPUTE_FULL, 3);
}

static void test_moe_same_bits(void **state) {
    (void)state;
    static const char *const presets[] = {"mixtral-tiny", "olmoe-tiny", "qwen2-moe-tiny", "qwen3-moe-tiny"};
    static const char *const precisions[] = {NULL, "bf16"};
    for (size_t p = 0; p < sizeof presets / sizeof *presets; p++)
        for (size_t q = 0; q < sizeof precisions / sizeof *precisions; q++) {
            same_bits(presets[p], precisions[q], DW_RECOMPUTE_FULL, 0);
            same_bits(presets[p], precisions[q], DW_RECOMPUTE_SELECTIVE, 0);
        }
    same_bits("qwen2-moe-tiny", "bf16", DW_RECOMPUTE_FULL, 2); /* two blocks of three */
    g_moe_remat = false; /* selective's dense part alone: the MoE layers keep their outputs */
    same_bits("mixtral-tiny", "bf16", DW_RECOMPUTE_SELECTIVE, 0);
    same_bits("qwen2-moe-tiny", NULL, DW_RECOMPUTE_SELECTIVE, 0);
    g_moe_remat = true;
}

/* recompute_blocks belongs to full recompute: refused with selective, by name. */
static void test_blocks_need_full(void **state) {
    (void)state;
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, "llama-tiny", &mc), DW_OK);
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(CTX, &mc, 1, 8, &g), DW_OK);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.recompute = DW_RECOMPUTE_SELECTIVE;
    o.recompute_blocks = 1 + (int)(dw_test_next(&dw_test_group_rng) % 3);
    dw_compiled *c = NULL;
    assert_int_equal(dw_compile(CTX, g, NULL, NULL, &o, &c), DW_ERR_INVALID);
    assert_null(c);
    assert_non_null(strstr(dw_errmsg(CTX), "needs recompute full"));
    o.recompute = DW_RECOMPUTE_COUNT, o.recompute_blocks = 0;
    assert_int_equal(dw_compile(CTX, g, NULL, NULL, &o, &c), DW_ERR_INVALID);
    assert_null(c);
    dw_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_same_bits),
        cmocka_unit_test(test_moe_same_bits),
        cmocka_unit_test(test_blocks_need_full),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
