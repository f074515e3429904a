/* test_dp_zero3_plan.c — ZeRO-3's gather plan (src/train/dp_zero3.c) against a simulation of the
 * steps: on random dense and MoE FP32 programs, with and without full recompute (forwards run again
 * inside the backward sweep) and the fused LM head (its weight read by the loss's step), each sweep
 * (forward, backward) starts with no parameter gathered; before step s the plan's gathers for s land
 * in their slots, making every other parameter whose slot bytes they overlap stale, and those of the
 * next event step (the prefetch, dp_zero3_gather.c) start, making what shares their bytes stale
 * until that step; every parameter a step's node reads must then be current. FP32 and BF16 programs (a parameter's BF16 working
 * copy sits in its slot after the FP32 values). Slots lie inside the gather block, which is no
 * larger than every slot side by side (each 256-aligned) and, for a model of several blocks,
 * smaller than the parameters (FP32, plus BF16 in a BF16 program). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "compile/z3_slots.h"
#include "runtime/engine.h"
#include "testutil.h"
#include "train/dp.h"

#define CTX dw_test_ctx

static int64_t param_bytes(const dw_compiled *p, int k) {
    return dw_ir_numel(&p->g->tensors[p->param_tensor[k]]) * (int64_t)sizeof(float);
}

static void check_plan(dw_test_model *m, bool several_blocks) {
    const dw_compiled *p = m->c;
    const int np = p->n_params;
    dw_dp d;
    memset(&d, 0, sizeof d);
    d.ctx = CTX, d.eng = m->e, d.zero = 3, d.world = 2;
    assert_int_equal(dw_dp_z3_init(&d), DW_OK);
    assert_true(d.z3_whole);
    int64_t total = 0, slots = 0; /* every parameter's bytes; every slot's, 256-aligned as placed */
    for (int k = 0; k < np; k++) {
        total += param_bytes(p, k) * (p->bf16 ? 6 : 4) / 4;
        slots += (dw_z3_slot_bytes(p, k) + 255) / 256 * 256;
        if (d.z3_slot[k] < 0) continue;
        assert_int_equal(d.z3_slot[k] % 256, 0);
        assert_true(d.z3_slot[k] + param_bytes(p, k) <= d.z3_gather_bytes);
        if (!p->bf16) {
            assert_int_equal(d.z3_slot16[k], -1);
            continue;
        }
        /* the BF16 copy after the FP32 values, inside the same slot */
        assert_true(d.z3_slot16[k] >= d.z3_slot[k] + param_bytes(p, k));
        assert_true(d.z3_slot16[k] + param_bytes(p, k) / 2 <= d.z3_gather_bytes);
        assert_true(d.z3_slot16[k] - d.z3_slot[k] < param_bytes(p, k) + 256);
    }
    assert_true(d.z3_gather_bytes <= slots); /* at worst every slot apart (the prefetch overlaps more) */
    if (several_blocks) assert_true(d.z3_gather_bytes < total);
    bool *current = malloc((size_t)np * sizeof *current);
    assert_non_null(current);
    int gathers = 0, reads = 0;
    for (int ph = DW_PHASE_FORWARD; ph <= DW_PHASE_BACKWARD; ph++) {
        memset(current, 0, (size_t)np * sizeof *current); /* a sweep gathers what it reads itself */
        for (int s = p->phase[ph][0]; s < p->phase[ph][1]; s++) {
            /* step s's gathers land (k current); then the next event step's are started, whose data
             * may land any time until that step: what shares their bytes is overwritten from now */
            const int nx = d.z3_ev_at[s] < d.z3_ev_at[s + 1] ? d.z3_next[s] : -1;
            if (nx >= 0) assert_true(nx > s && nx < p->phase[ph][1] && d.z3_ev_at[nx] < d.z3_ev_at[nx + 1]);
            for (int e = d.z3_ev_at[s]; e < (nx >= 0 ? d.z3_ev_at[nx + 1] : d.z3_ev_at[s + 1]); e++) {
                if (e == d.z3_ev_at[s + 1]) e = d.z3_ev_at[nx]; /* on to nx's */
                const int k = d.z3_ev[e];
                const int64_t a = d.z3_slot[k], b = (d.z3_slot16[k] >= 0 ? d.z3_slot16[k] + param_bytes(p, k) / 2
                                                                          : a + param_bytes(p, k));
                assert_true(a >= 0);
                for (int j = 0; j < np; j++) /* what shares k's bytes is overwritten */
                    if (j != k && d.z3_slot[j] >= 0 && d.z3_slot[j] < b &&
                        a < (d.z3_slot16[j] >= 0 ? d.z3_slot16[j] + param_bytes(p, j) / 2 : d.z3_slot[j] + param_bytes(p, j)))
                        current[j] = false;
                current[k] = e < d.z3_ev_at[s + 1]; /* nx's: in flight until step nx */
                gathers += e < d.z3_ev_at[s + 1];
            }
            const dw_step *st = &p->steps[s];
            if (st->kind != DW_STEP_FWD && st->kind != DW_STEP_BWD) continue;
            const dw_ir_node *n = dw_compile_node(p, st->node);
            for (int i = 0; i < n->n_in; i++) {
                const dw_ir_tensor *t = &p->g->tensors[n->in[i]];
                if (t->kind != DW_TENSOR_PARAM) continue;
                const int k = p->tensor[n->in[i]].param;
                if (!current[k]) fail_msg("step %d (node '%s') reads parameter '%s', which is not gathered", s, n->name, t->name);
                reads++;
            }
        }
    }
    assert_true(reads > 0 && gathers >= np / 2);
    /* gathers only before steps of the forward and the backward sweep */
    for (int s = 0; s < p->n_steps; s++)
        if (s < p->phase[DW_PHASE_FORWARD][0] || s >= p->phase[DW_PHASE_BACKWARD][1])
            assert_int_equal(d.z3_ev_at[s + 1] - d.z3_ev_at[s], 0);
    free(current);
    dw_dp_z3_free(&d);
    assert_null(m->e->x->before_step);
}

static void one(dw_graph *g, const char *precision, int recompute, bool fused_head, bool several_blocks) {
    assert_non_null(g);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.recompute = recompute;
    o.fused_head = fused_head;
    dw_test_model m;
    assert_int_equal(dw_test_model_build_opts(CTX, g, precision, &o, &m), DW_OK);
    check_plan(&m, several_blocks);
    dw_test_model_free(&m);
}

static void test_dense(void **state) {
    (void)state;
    static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};
    for (int i = 0; i < 6; i++) {
        dw_graph *g = dw_test_small_graph(CTX, presets[i % 3], 2, 8, &dw_test_group_rng);
        one(g, i % 4 < 2 ? NULL : "bf16", i % 2 ? DW_RECOMPUTE_FULL : DW_RECOMPUTE_NONE, i >= 3, false);
    }
}

static void test_moe(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++)
        one(dw_test_moe_graph(CTX, 2, 8, &dw_test_group_rng), i ? "bf16" : NULL, i ? DW_RECOMPUTE_FULL : DW_RECOMPUTE_NONE,
            false, false);
}

/* A model of four blocks, whose gather block holds less than its parameters. */
static void test_saves_memory(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    char *model = dw_test_model_dir(dir, "{\"model_type\": \"gpt2\", \"vocab_size\": 64, \"n_embd\": 32, \"n_layer\": 4, "
                                         "\"n_head\": 2, \"n_positions\": 16}");
    assert_non_null(model);
    dw_capture_opts co;
    dw_capture_opts_init(&co, sizeof co);
    co.batch = 2, co.seq = 8;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture(CTX, model, &co, &g), DW_OK);
    one(g, "bf16", DW_RECOMPUTE_NONE, true, true);
    dw_test_rmtree(dir);
    free(dir), free(model);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_saves_memory),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
