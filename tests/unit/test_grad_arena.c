/* test_grad_arena.c — gradients in the activation arena (dw_compile_opts.grad_arena;
 * compile/grad_arena.c, arena.c, steps.c, runtime/engine_grad_arena.c):
 *   - the program: no gradient pool; every parameter's slice at grad_base + 4 x its pool offset,
 *     through the next parameter's offset; one ZERO_GRAD step per parameter, before every step
 *     that writes its gradient and after every step of the forward it does not write in — except
 *     a weight whose first writer is a BF16 program's linear layer or MoE linear layer (the
 *     experts' W): its wgrad writes the slice over (pgrad_set; the grouped GEMM's
 *     dw_grouped_args.overwrite) and only the padding, if any, is zeroed, so BF16 programs have fewer ZERO_GRAD
 *     steps than parameters and FP32 ones (whose reference wgrad adds) one each; no two buffers
 *     live at one time share bytes;
 *   - training is bit for bit the standing pool's: 3 AdamW steps of gpt2-tiny (tied head), llama-tiny,
 *     mixtral-tiny and olmoe-tiny, FP32 and BF16, the BF16 ones with the LM head fused too (its
 *     gradient written in the forward), and fp8_block, mxfp8 and full recompute on some of them:
 *     losses, every parameter, the routing counters; then one
 *     more backward's gradients, read before and after the step (bf16_arena: refused after it),
 *     the same bits, and a step on
 *     dw_engine_zero_grad's zeros (written only when read: the backward zeroes each slice itself);
 *   - the same with the BF16 working copies in the arena too (bf16_arena): each copy at
 *     bf16_base + 2 x its offset, live from the step's start through its readers; a forward after a
 *     backward without a step (or after zero_grad's zeros were written) reads copies made again;
 *     the fp8_block and mxfp8 experts' weight caches' codes in the rooms of the copies they do not keep
 *     (wcache_arena), made again alike; on moe-e8 and moe-e64 that takes more than 4 GiB off the
 *     workspace and leaves the arena's size;
 *   - a weight written over ignores what its slice held: the whole arena NaN before the backward,
 *     and the gradients (finite), the loss and the norm (padding included) are the pool's bits
 *     (dense and MoE — mixtral-tiny and olmoe-tiny, BF16, fp8_block (a rule's "bf16_passes": [])
 *     and mxfp8 with the experts' wgrad bound to the recipe, fp8_block's default with it BF16, every
 *     MoE layer's experts written over —, fused head);
 *   - the engine's rules: a second backward before the step (accumulation) is refused naming
 *     grad_arena, and so are the step and a gradient read after a forward; zero_grad clears both;
 *   - moe-e8 at 8 x 2048 and moe-e64 at 4 x 2048 (BF16, sm_90, fused head, as dryrun compiles them):
 *     the pools' total falls by more than 5 and 3.5 GiB (6 and 6.5 with the copies too), and the planner prices it only for one
 *     micro-batch a step under ZeRO 0/1 (DW_GRAD_ARENA=1; gradient accumulation keeps the pool). */
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
#include "capture/model_config.h"
#include "compile/bind_grouped.h"
#include "compile/passes.h"
#include "core/error.h"
#include "ir/ir.h"
#include "runtime/engine.h"
#include "test_plan_common.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)
#define GIB (1024.0 * 1024.0 * 1024.0)

/* A precision's name in messages: DW_TEST_FP8_WGRAD's is "fp8_block+wgrad" (NULL: "fp32"). */
static const char *label(const char *precision) {
    return !precision ? "fp32" : !strcmp(precision, DW_TEST_FP8_WGRAD) ? "fp8_block+wgrad" : precision;
}

/* Program (and engine) of config mc at B x T, precision NULL = FP32, with the gradients in the
 * arena or in their pool. */
static bool bf16_arena; /* the arena programs place the BF16 working copies there too */

static void build(const dw_model_config *mc, int64_t B, int64_t T, const char *precision, bool arena, bool fused,
                  int recompute, bool engine, dw_test_model *m) {
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(CTX, mc, B, T, &g), DW_OK);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.grad_arena = arena, o.fused_head = fused, o.recompute = recompute, o.bf16_arena = arena && bf16_arena;
    if (!engine) o.device = DW_DEVICE_CUDA, o.sm = 90;
    if (engine) {
        assert_int_equal(dw_test_model_build_opts(CTX, g, precision, &o, m), DW_OK);
        return;
    }
    memset(m, 0, sizeof *m);
    m->g = g;
    if (precision) assert_int_equal(dw_test_policy(CTX, precision, true, &m->pol), DW_OK);
    assert_int_equal(dw_compile(CTX, g, NULL, m->pol, &o, &m->c), DW_OK);
}

/* Whether step s writes parameter tensor t's gradient: a backward of a node reading it, or the
 * training forward of a node doing its backward there (the fused head). */
static bool writes(const dw_compiled *c, int s, int t) {
    const dw_step *st = &c->steps[s];
    if (st->kind != DW_STEP_BWD && !(st->kind == DW_STEP_FWD && st->arg == 0)) return false;
    const dw_ir_node *n = dw_compile_node(c, st->node);
    if (st->kind == DW_STEP_FWD && !(dw_op_flags(n->op) & DW_OPF_BWD_IN_FWD)) return false;
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] == t) return true;
    return false;
}

/* Whether parameter k's first writer writes its gradient over the slice (pgrad_set), checked
 * against what may: a BF16 program's linear or MoE linear layer (not a fused head's; a MoE one's
 * wgrad BF16, fp8_block or mxfp8) with k as its weight (slot 1) alone; and every such first writer does. */
static bool written_over(const dw_compiled *c, int k) {
    const int i = c->grad_first[k];
    if (i < 0) return false;
    const dw_ir_node *n = dw_compile_node(c, i);
    bool set = false; /* the bit of the slot holding k */
    for (int s = 0; s < n->n_in; s++)
        if (n->in[s] == c->param_tensor[k] && (c->node[i].pgrad_set >> s & 1u)) set = true;
    const bool moe_ok = !c->node[i].bind.quantised[DW_QPASS_WGRAD] || dw_compile_moe_recipe(c, i) == DW_RECIPE_FP8_BLOCK ||
                        dw_compile_moe_recipe(c, i) == DW_RECIPE_MXFP8;
    bool may = c->bf16 && (n->op == DW_OP_LINEAR || (n->op == DW_OP_MOE_LINEAR && moe_ok)) && i != c->head_linear &&
               n->in[1] == c->param_tensor[k];
    for (int s = 0; s < n->n_in; s++)
        if (s != 1 && n->in[s] == c->param_tensor[k]) may = false;
    if (set != may) fail_msg("parameter %s: first writer %s (%s) %s its gradient over, expected %s",
                             c->g->tensors[c->param_tensor[k]].name, n->name, dw_op_name(n->op),
                             set ? "writes" : "adds", may ? "written over" : "added");
    return set;
}

/* wcache_arena: every MoE layer whose experts keep no BF16 copy and read a quantised cache holds
 * its codes in the copy's room — W at the room's first byte, W^T right after, the room exactly
 * their bytes, the workspace the scales alone — and no other node does; the count of such layers. */
static int check_wcache(const dw_compiled *c) {
    int n = 0;
    for (int i = 0; i < c->g->n_nodes; i++) {
        const dw_prog_node *pn = &c->node[i];
        const dw_ir_node *nd = dw_compile_node(c, i);
        const int k = nd->op == DW_OP_MOE_LINEAR ? c->tensor[nd->in[1]].param : -1;
        dw_mem_item it;
        const bool room = k >= 0 && c->bf16_lazy[k] && dw_compile_bf16_item(c, k, &it);
        const dw_recipe r = nd->op == DW_OP_MOE_LINEAR ? dw_compile_moe_recipe(c, i) : DW_RECIPE_BF16;
        const bool want = c->wcache_arena && room && pn->wq[0].off >= 0 &&
                          (r == DW_RECIPE_FP8_BLOCK || r == DW_RECIPE_MXFP8);
        if (!want) {
            if (pn->wq[0].codes_act >= 0 || pn->wq[1].codes_act >= 0) fail_msg("node %s: codes in the arena", nd->name);
            continue;
        }
        const int64_t numel = dw_ir_numel(&c->g->tensors[c->param_tensor[k]]);
        assert_true(c->bf16_arena && it.size == 2 * numel);
        assert_true(pn->wq[0].codes_act == it.offset && pn->wq[1].codes_act == it.offset + numel);
        assert_true(pn->wq[0].scales == 0 && pn->wq[1].scales == 0 && pn->wq[0].off != pn->wq[1].off);
        n++;
    }
    return n;
}

/* The program's ZERO_GRAD steps (returned) and, in *over, the parameters whose first writer
 * writes the slice over instead. */
static int check_program(const dw_compiled *c, int *over) {
    assert_true(c->grad_arena);
    assert_int_equal(c->pool_bytes[DW_POOL_GRADS], 0);
    const int s0 = c->phase[DW_PHASE_FORWARD][0], s1 = c->phase[DW_PHASE_BACKWARD][1];
    int all_zeros = 0;
    *over = 0;
    for (int i = 0; i < c->g->n_nodes; i++) { /* only a weight's first writer writes it over */
        const dw_ir_node *n = dw_compile_node(c, i);
        if (!c->node[i].pgrad_set) continue;
        assert_true(c->node[i].pgrad_set == 2u && n->n_in > 1 && c->tensor[n->in[1]].param >= 0);
        assert_int_equal(c->grad_first[c->tensor[n->in[1]].param], i);
    }
    for (int k = 0; k < c->n_params; k++) {
        int zero = -1, zeros = 0, item = -1, first = -1;
        for (int s = s0; s < s1; s++)
            if (c->steps[s].kind == DW_STEP_ZERO_GRAD && c->steps[s].arg == k) zero = s, zeros++;
        for (int s = s0; s < s1 && first < 0; s++)
            if (writes(c, s, c->param_tensor[k])) first = s;
        const int64_t numel = dw_ir_numel(&c->g->tensors[c->param_tensor[k]]);
        const bool padded = dw_compile_grad_slice_end(c, k) > c->param_off[k] + numel;
        if (written_over(c, k)) { /* no zeroing unless of the padding; the first writer's backward writes */
            (*over)++;
            assert_true(first >= 0 && c->steps[first].kind == DW_STEP_BWD && c->steps[first].node == c->grad_first[k]);
            assert_int_equal(dw_compile_grad_zero_from(c, k), c->param_off[k] + numel);
            assert_int_equal(zeros, padded ? 1 : 0);
        } else {
            assert_int_equal(dw_compile_grad_zero_from(c, k), c->param_off[k]);
            assert_int_equal(zeros, 1);
        }
        all_zeros += zeros;
        for (int s = s0; s < s1; s++)
            if (zeros && writes(c, s, c->param_tensor[k]) && s < zero)
                fail_msg("parameter %d's gradient written at step %d, zeroed at %d", k, s, zero);
        for (int i = 0; i < c->n_items; i++)
            if (c->info[i].kind == DW_BUF_PGRAD && c->info[i].index == k) item = i;
        assert_true(item >= 0);
        const dw_mem_item *it = &c->items[item];
        assert_true(it->offset == c->grad_base + 4 * c->param_off[k]);
        assert_true(it->size == 4 * (dw_compile_grad_slice_end(c, k) - c->param_off[k]));
        assert_int_equal(it->last, c->n_times - 1);
        /* born at its first writer's time: no earlier than the forward's end unless the forward writes it */
        if (zero >= c->phase[DW_PHASE_BACKWARD][0]) assert_true(it->first >= c->g->n_nodes);
    }
    if (c->bf16_arena) { /* the copies: the weights pool holds the masters alone */
        assert_true(c->bf16 && c->pool_bytes[DW_POOL_WEIGHTS] == 4 * c->param_floats && c->bf16_base >= 0);
        int copies = 0;
        for (int i = 0; i < c->n_items; i++) {
            if (c->info[i].kind != DW_BUF_PBF16) continue;
            const int k = c->info[i].index;
            const dw_mem_item *it = &c->items[i];
            copies++;
            assert_true(it->offset == c->bf16_base + 2 * c->param_off[k] && it->first == 0);
            assert_true(it->size == 2 * dw_ir_numel(&c->g->tensors[c->param_tensor[k]]));
            for (int n = 0; n < c->g->n_nodes; n++) { /* live through every BF16 reader's forward and backward */
                const dw_ir_node *nd = dw_compile_node(c, n);
                const bool bf16_reader = DW_OP_IS(nd, DW_OPF_GEMM) || nd->op == DW_OP_MOE_LINEAR || nd->op == DW_OP_HEAD_XENT;
                for (int q = 0; bf16_reader && n != c->head_linear && q < nd->n_in; q++)
                    if (nd->in[q] == c->param_tensor[k])
                        assert_true(it->last >= dw_compile_fwd_time(c, n) && it->last >= dw_compile_bwd_time(c, n));
            }
        }
        assert_true(copies > 0);
    }
    check_wcache(c);
    int a, b, t; /* the fixed items (gradient slices, copies) included */
    if (dw_test_plan_overlap(c, &a, &b, &t)) fail_msg("items %d and %d share bytes while both live at time %d", a, b, t);
    return all_zeros;
}

/* Every parameter's gradient of a and b: the same bits (0), or 1 naming the first that differs. */
static int same_grads(dw_engine *a, dw_engine *b, const char *what) {
    for (int i = 0; i < dw_engine_param_count(a); i++) {
        const int64_t n = dw_test_param_numel(a, i);
        float *ga = malloc((size_t)n * 4), *gb = malloc((size_t)n * 4);
        assert_int_equal(dw_engine_grad_read(a, i, ga), DW_OK);
        assert_int_equal(dw_engine_grad_read(b, i, gb), DW_OK);
        const int differ = memcmp(ga, gb, (size_t)n * 4) != 0;
        free(ga), free(gb);
        if (differ) {
            fprintf(stderr, "%s: the gradient of %s differs\n", what, dw_engine_param_name(a, i));
            return 1;
        }
    }
    return 0;
}

static void refused(dw_status s, const char *needle) {
    assert_int_equal(s, DW_ERR_UNSUPPORTED);
    if (!strstr(dw_errmsg(CTX), needle)) fail_msg("message '%s' lacks '%s'", dw_errmsg(CTX), needle);
    dw_clear_error(CTX);
}

/* The config of preset; a name ending in "@128" widens it (d_model 128, heads of 32, d_ff and the
 * experts' 256) so that its experts' GEMMs take fp8_block's 128-blocks (the tiny ones stay BF16). */
static void load_config(const char *preset, dw_model_config *mc) {
    char name[64];
    snprintf(name, sizeof name, "%s", preset);
    char *wide = strstr(name, "@128");
    if (wide) *wide = '\0';
    assert_int_equal(dw_model_config_load(CTX, name, mc), DW_OK);
    if (wide) mc->d_model = 128, mc->head_dim = 32, mc->d_ff = 256, mc->d_ff_expert = 256;
}

/* Engines of preset at 2 x 16 with the gradients in the arena (a, its program checked) and in
 * their pool (p); the arena program's ZERO_GRAD steps returned, *over as check_program's. */
static int arena_and_pool(const char *preset, const char *precision, bool fused, int recompute, dw_model_config *mc,
                          dw_test_model *a, dw_test_model *p, int *over) {
    load_config(preset, mc);
    build(mc, 2, 16, precision, true, fused, recompute, true, a);
    build(mc, 2, 16, precision, false, fused, recompute, true, p);
    return check_program(a->c, over);
}

/* 3 steps with the gradients in the arena and in their pool: the same bits; then one more backward
 * (fresh tokens) whose gradients match before and after the step. */
static void same_bits_rc(const char *preset, const char *precision, bool fused, int recompute) {
    dw_model_config mc;
    const int64_t B = 2, T = 16;
    dw_test_model a, p;
    int over;
    const int zeros = arena_and_pool(preset, precision, fused, recompute, &mc, &a, &p, &over);
    assert_false(p.c->grad_arena);
    for (int i = 0; i < p.c->g->n_nodes; i++) assert_int_equal(p.c->node[i].pgrad_set, 0); /* the pool: as before */
    if (precision) { /* BF16 programs: the linear layers' weights are written over, fewer slices zeroed */
        assert_true(over > 0 && zeros < a.c->n_params);
    } else { /* FP32: the reference wgrad adds, every slice zeroed */
        assert_true(over == 0 && zeros == a.c->n_params);
    }
    char what[96];
    snprintf(what, sizeof what, "%s %s%s%s, gradients in the arena vs their pool", preset,
             label(precision), fused ? " fused head" : "", recompute ? " recompute" : "");
    double l0, l1;
    assert_int_equal(dw_test_same_training(&a, &p, B, T, 3, 1e-2, dw_test_next(RNG), what, &l0, &l1), 0);
    int32_t x[64], y[64];
    dw_test_random_tokens(x, B * T, mc.vocab_size, RNG);
    dw_test_random_tokens(y, B * T, mc.vocab_size, RNG);
    double la, lp, na, np;
    assert_int_equal(dw_engine_zero_grad(a.e), DW_OK);
    assert_int_equal(dw_engine_zero_grad(p.e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(a.e, x, y, B, T, 1.0, &la), DW_OK);
    assert_int_equal(dw_engine_forward_backward(p.e, x, y, B, T, 1.0, &lp), DW_OK);
    assert_true(la == lp);
    assert_int_equal(same_grads(a.e, p.e, what), 0);
    assert_int_equal(dw_engine_step(a.e, NULL, 4, &na), DW_OK);
    assert_int_equal(dw_engine_step(p.e, NULL, 4, &np), DW_OK);
    assert_true(na == np && na > 0);
    if (!a.c->bf16_arena) {
        assert_int_equal(same_grads(a.e, p.e, what), 0); /* still there after the step */
    } else { /* the step's refresh wrote copies over some of them */
        float *g = malloc((size_t)dw_test_param_numel(a.e, 0) * 4);
        refused(dw_engine_grad_read(a.e, 0, g), "grad_arena");
        free(g);
    }
    /* zero_grad then a step without backward: the arena's deferred zeros are written first */
    assert_int_equal(dw_engine_zero_grad(a.e), DW_OK);
    assert_int_equal(dw_engine_zero_grad(p.e), DW_OK);
    assert_int_equal(dw_engine_step(a.e, NULL, 5, &na), DW_OK);
    assert_int_equal(dw_engine_step(p.e, NULL, 5, &np), DW_OK);
    assert_true(na == 0 && np == 0);
    for (int i = 0; i < a.c->n_params; i++) {
        const char *name = a.g->tensors[a.c->param_tensor[i]].name;
        float *wa = dw_test_param_read(a.e, name, NULL), *wp = dw_test_param_read(p.e, name, NULL);
        if (memcmp(wa, wp, (size_t)dw_test_param_numel(a.e, i) * 4)) fail_msg("%s: %s differs after a step on zeros", what, name);
        free(wa), free(wp);
    }
    printf("  %-14s %-10s%s%s losses %.6f -> %.6f, %d of %d slices zeroed, arena %lld + grads %lld -> arena %lld "
           "bytes\n", preset, label(precision), fused ? " fused" : "      ", recompute ? " rc" : "   ", l0,
           l1, zeros, a.c->n_params,
           (long long)p.c->arena_bytes,
           (long long)p.c->pool_bytes[DW_POOL_GRADS], (long long)a.c->arena_bytes);
    dw_test_model_free(&a);
    dw_test_model_free(&p);
}

static void same_bits(const char *preset, const char *precision, bool fused) {
    same_bits_rc(preset, precision, fused, DW_RECOMPUTE_NONE);
}

static void test_same_bits(void **state) {
    (void)state;
    bf16_arena = false;
    static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "mixtral-tiny", "olmoe-tiny"};
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        same_bits(presets[i], NULL, false);
        same_bits(presets[i], "bf16", false);
        same_bits(presets[i], "bf16", true);
    }
    /* quantised recipes (the CPU runs the sm_90 program's choices) and full recompute */
    same_bits("llama-tiny", "fp8_block", true);
    same_bits("mixtral-tiny", "fp8_block", false);
    same_bits("olmoe-tiny@128", DW_TEST_FP8_WGRAD, false); /* the experts' passes fp8_block, wgrad written over */
    same_bits("gpt2-tiny", "mxfp8", false);
    same_bits_rc("llama-tiny", "bf16", true, DW_RECOMPUTE_FULL);
    same_bits_rc("mixtral-tiny", NULL, false, DW_RECOMPUTE_FULL);
    same_bits_rc("olmoe-tiny", "bf16", false, DW_RECOMPUTE_FULL); /* experts written over, rows rematerialised */
}

/* The same with the BF16 working copies in the arena too (bf16_arena; FP32 programs have none). */
static void test_same_bits_bf16(void **state) {
    (void)state;
    bf16_arena = true;
    static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "mixtral-tiny", "olmoe-tiny"};
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        same_bits(presets[i], "bf16", false);
        same_bits(presets[i], "bf16", true);
    }
    same_bits("llama-tiny", "fp8_block", true);
    same_bits("mixtral-tiny", "fp8_block", false);
    same_bits("mixtral-tiny@128", "fp8_block", false); /* the experts' caches' codes in the arena too */
    same_bits("olmoe-tiny@128", "fp8_block", false);
    same_bits("mixtral-tiny", "mxfp8", false); /* mxfp8's codes there too (1x32 scales in the workspace) */
    same_bits("olmoe-tiny", "mxfp8", false);
    same_bits_rc("llama-tiny", "bf16", true, DW_RECOMPUTE_FULL);
    bf16_arena = false;
}

/* The same random weights in a and p, and random tokens x, targets y (n of each). */
static void same_start(dw_test_model *a, dw_test_model *p, int64_t vocab, int32_t *x, int32_t *y, int64_t n) {
    const uint64_t seed = dw_test_next(RNG);
    assert_int_equal(dw_engine_init_weights(a->e, seed), DW_OK);
    assert_int_equal(dw_engine_init_weights(p->e, seed), DW_OK);
    dw_test_random_tokens(x, n, vocab, RNG);
    dw_test_random_tokens(y, n, vocab, RNG);
}

/* bf16_arena: a forward after a backward without a step (the backward took copies' memory), and
 * after zero_grad's zeros were written, reads copies made again: the pool program's loss (under
 * fp8_block the experts' caches in the copies' rooms are made again too: wcache_arena). */
static void bf16_remade(const char *preset, const char *precision) {
    dw_model_config mc;
    load_config(preset, &mc);
    const int64_t B = 2, T = 16;
    bf16_arena = true;
    dw_test_model a, p;
    build(&mc, B, T, precision, true, false, DW_RECOMPUTE_NONE, true, &a);
    build(&mc, B, T, precision, false, false, DW_RECOMPUTE_NONE, true, &p);
    bf16_arena = false;
    assert_true(a.c->bf16_arena);
    const int cached = check_wcache(a.c);
    assert_true(strcmp(precision, "bf16") ? cached > 0 : cached == 0);
    int32_t x[64], y[64];
    same_start(&a, &p, mc.vocab_size, x, y, B * T);
    double la, lp;
    float *g = malloc((size_t)dw_test_param_numel(a.e, 0) * 4);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(dw_engine_forward_backward(a.e, x, y, B, T, 1.0, &la), DW_OK);
        assert_int_equal(dw_engine_forward_backward(p.e, x, y, B, T, 1.0, &lp), DW_OK);
        assert_true(la == lp);
        if (round) { /* zeros written into the gradients' (and copies') memory, then read */
            assert_int_equal(dw_engine_zero_grad(a.e), DW_OK);
            assert_int_equal(dw_engine_grad_read(a.e, 0, g), DW_OK);
        }
        assert_int_equal(dw_engine_forward(a.e, x, y, B, T, NULL, &la), DW_OK);
        assert_int_equal(dw_engine_forward(p.e, x, y, B, T, NULL, &lp), DW_OK);
        if (la != lp) fail_msg("round %d: forward after a backward %.9g, the pool program's %.9g", round, la, lp);
        assert_int_equal(dw_engine_zero_grad(a.e), DW_OK);
        assert_int_equal(dw_engine_zero_grad(p.e), DW_OK);
    }
    free(g);
    dw_test_model_free(&a);
    dw_test_model_free(&p);
}

static void test_bf16_remade(void **state) {
    (void)state;
    bf16_remade("mixtral-tiny", "bf16");
    bf16_remade("mixtral-tiny@128", "fp8_block");
    bf16_remade("olmoe-tiny", "mxfp8");
}

/* A linear layer's weight written over by its first writer ignores what the slice held: the whole
 * activation arena NaN (all-ones bytes) before the backward's step, and the gradients, loss and
 * gradient norm (padding included) are finite and the pool program's bits. */
static void poisoned(const char *preset, const char *precision, bool fused) {
    dw_model_config mc;
    const int64_t B = 2, T = 16;
    dw_test_model a, p;
    int over;
    arena_and_pool(preset, precision, fused, DW_RECOMPUTE_NONE, &mc, &a, &p, &over);
    assert_true(over > 0);
    int moe = 0, moe_over = 0, moe_q = 0; /* MoE linear layers, those writing their experts' dW over, quantised */
    for (int i = 0; i < a.c->g->n_nodes; i++) {
        if (dw_compile_node(a.c, i)->op != DW_OP_MOE_LINEAR) continue;
        moe++, moe_over += a.c->node[i].pgrad_set == 2u, moe_q += a.c->node[i].bind.quantised[DW_QPASS_WGRAD];
    }
    assert_int_equal(moe_over, moe); /* every expert weight's first writer is its own layer */
    /* mxfp8 and a rule's "bf16_passes": [] bind every wgrad to the recipe; fp8_block's default keeps it BF16 */
    const int want_q = !strcmp(precision, "fp8_block") ? 0 : moe;
    if ((!strcmp(precision, "fp8_block") || !strcmp(precision, "mxfp8") || !strcmp(precision, DW_TEST_FP8_WGRAD)) &&
        moe_q != want_q)
        fail_msg("%s %s: %d of %d MoE layers' wgrad quantised, want %d", preset, label(precision), moe_q, moe, want_q);
    int32_t x[64], y[64];
    same_start(&a, &p, mc.vocab_size, x, y, B * T);
    memset(a.e->x->act, 0xff, (size_t)a.e->x->pool_bytes[DW_POOL_ACT]); /* the CPU backend's host memory */
    double la, lp, na, np;
    assert_int_equal(dw_engine_forward_backward(a.e, x, y, B, T, 1.0, &la), DW_OK);
    assert_int_equal(dw_engine_forward_backward(p.e, x, y, B, T, 1.0, &lp), DW_OK);
    char what[96];
    snprintf(what, sizeof what, "%s %s%s on a NaN arena", preset, label(precision), fused ? " fused head" : "");
    if (!(la == lp)) fail_msg("%s: loss %.9g, the pool program's %.9g", what, la, lp);
    for (int i = 0; i < dw_engine_param_count(a.e); i++) {
        const int64_t n = dw_test_param_numel(a.e, i);
        float *g = malloc((size_t)n * 4);
        assert_int_equal(dw_engine_grad_read(a.e, i, g), DW_OK);
        for (int64_t j = 0; j < n; j++)
            if (!isfinite(g[j])) fail_msg("%s: %s's gradient [%lld] = %g", what, dw_engine_param_name(a.e, i), (long long)j, g[j]);
        free(g);
    }
    assert_int_equal(same_grads(a.e, p.e, what), 0);
    assert_int_equal(dw_engine_step(a.e, NULL, 1, &na), DW_OK);
    assert_int_equal(dw_engine_step(p.e, NULL, 1, &np), DW_OK);
    if (!(na == np && isfinite(na))) fail_msg("%s: gradient norm %.9g, the pool program's %.9g", what, na, np);
    printf("  %-14s %-10s%s NaN arena: %d weights written over (%d MoE experts'), loss %.6f, norm %.6f as the "
           "pool's\n", preset, label(precision), fused ? " fused" : "      ", over, moe_over, la, na);
    dw_test_model_free(&a);
    dw_test_model_free(&p);
}

static void test_poisoned(void **state) {
    (void)state;
    bf16_arena = false;
    poisoned("llama-tiny", "bf16", false);
    poisoned("gpt2-tiny", "bf16", true);
    poisoned("olmoe-tiny", "bf16", false);
    poisoned("mixtral-tiny", "bf16", false);
    poisoned("mixtral-tiny@128", DW_TEST_FP8_WGRAD, false);
    poisoned("olmoe-tiny@128", DW_TEST_FP8_WGRAD, false);
    poisoned("olmoe-tiny@128", "fp8_block", false); /* the default: fp8_block experts, their wgrad BF16 */
    poisoned("mixtral-tiny", "mxfp8", false);
    poisoned("olmoe-tiny", "mxfp8", false);
    poisoned("llama-tiny", "fp8_block", true);
}

static void test_rules(void **state) {
    (void)state;
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, "mixtral-tiny", &mc), DW_OK);
    const int64_t B = 2, T = 16;
    dw_test_model a;
    build(&mc, B, T, "bf16", true, false, DW_RECOMPUTE_NONE, true, &a);
    assert_int_equal(dw_engine_init_weights(a.e, dw_test_next(RNG)), DW_OK);
    int32_t x[64], y[64];
    dw_test_random_tokens(x, B * T, mc.vocab_size, RNG);
    dw_test_random_tokens(y, B * T, mc.vocab_size, RNG);
    float *g = malloc((size_t)dw_test_param_numel(a.e, 0) * 4);
    double loss, norm;
    assert_int_equal(dw_engine_forward_backward(a.e, x, y, B, T, 1.0, &loss), DW_OK);
    refused(dw_engine_forward_backward(a.e, x, y, B, T, 1.0, &loss), "grad_arena"); /* accumulation */
    assert_int_equal(dw_engine_grad_read(a.e, 0, g), DW_OK);
    assert_int_equal(dw_engine_forward(a.e, x, y, B, T, NULL, &loss), DW_OK); /* takes the gradients' memory */
    refused(dw_engine_step(a.e, NULL, 1, &norm), "grad_arena");
    refused(dw_engine_grad_read(a.e, 0, g), "grad_arena");
    assert_int_equal(dw_engine_forward_backward(a.e, x, y, B, T, 1.0, &loss), DW_OK);
    assert_int_equal(dw_engine_step(a.e, NULL, 1, &norm), DW_OK);
    assert_int_equal(dw_engine_grad_read(a.e, 0, g), DW_OK);
    assert_int_equal(dw_engine_zero_grad(a.e), DW_OK); /* zeros, readable */
    assert_int_equal(dw_engine_grad_read(a.e, 0, g), DW_OK);
    for (int64_t i = 0; i < dw_test_param_numel(a.e, 0); i++) assert_true(g[i] == 0.0f);
    assert_int_equal(dw_engine_forward_backward(a.e, x, y, B, T, 1.0, &loss), DW_OK);
    assert_int_equal(dw_engine_zero_grad(a.e), DW_OK); /* thrown away: a backward may follow */
    assert_int_equal(dw_engine_forward_backward(a.e, x, y, B, T, 1.0, &loss), DW_OK);
    free(g);
    dw_test_model_free(&a);
}

/* The benchmark presets as dryrun compiles them: the pools' total falls by more than `fall` GiB. */
static void check_preset(const char *preset, int64_t B, int64_t T, double fall, bool copies) {
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, preset, &mc), DW_OK);
    dw_test_model a, p;
    bf16_arena = copies;
    build(&mc, B, T, "bf16", true, true, DW_RECOMPUTE_NONE, false, &a);
    build(&mc, B, T, "bf16", false, true, DW_RECOMPUTE_NONE, false, &p);
    bf16_arena = false;
    int64_t ta = 0, tp = 0;
    for (int k = 0; k < DW_POOL_COUNT; k++) ta += a.c->pool_bytes[k], tp += p.c->pool_bytes[k];
    printf("  %-8s %lld x %lld: pools %.2f GiB (activations %.2f) with the gradients%s in the arena, %.2f (activations "
           "%.2f + gradients %.2f) without\n", preset, (long long)B, (long long)T, ta / GIB,
           a.c->pool_bytes[DW_POOL_ACT] / GIB, copies ? " and BF16 copies" : "", tp / GIB, p.c->pool_bytes[DW_POOL_ACT] / GIB,
           p.c->pool_bytes[DW_POOL_GRADS] / GIB);
    if ((double)(tp - ta) / GIB <= fall) fail_msg("%s: the pools fall by %.3f GiB only", preset, (double)(tp - ta) / GIB);
    assert_true(a.c->pool_bytes[DW_POOL_ACT] >= 4 * a.c->param_floats); /* the gradients are in it */
    dw_test_model_free(&a);
    dw_test_model_free(&p);
}

static void test_presets(void **state) {
    (void)state;
    check_preset("moe-e8", 8, 2048, 5.0, false);
    check_preset("moe-e64", 4, 2048, 3.5, false);
    check_preset("moe-e8", 8, 2048, 6.0, true);
    check_preset("moe-e64", 4, 2048, 6.5, true);
}

/* wcache_arena on the benchmark presets under fp8_block (sm_90, fused head, the copies in the
 * arena): every MoE layer's codes in its experts' BF16 room; against the same program with the
 * codes in the workspace (wcache_arena false), the arena keeps its size and the workspace falls by
 * at least the codes' bytes (2 an expert weight), more than `fall` GiB. */
static void check_wcache_preset(const char *preset, int64_t B, int64_t T, double fall) {
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, preset, &mc), DW_OK);
    dw_test_model m[2];
    for (int w = 0; w < 2; w++) {
        dw_graph *g = NULL;
        assert_int_equal(dw_capture_config(CTX, &mc, B, T, &g), DW_OK);
        dw_compile_opts o;
        dw_compile_opts_init(&o, sizeof o);
        o.grad_arena = o.bf16_arena = o.fused_head = true, o.wcache_arena = w == 0;
        o.device = DW_DEVICE_CUDA, o.sm = 90;
        memset(&m[w], 0, sizeof m[w]);
        m[w].g = g;
        assert_int_equal(dw_test_policy(CTX, "fp8_block", false, &m[w].pol), DW_OK);
        assert_int_equal(dw_compile(CTX, g, NULL, m[w].pol, &o, &m[w].c), DW_OK);
    }
    int64_t codes = 0, layers = 0, below = 0; /* below: AdamW's pass may write them (dw_compile_wcache_below) */
    for (int i = 0; i < m[0].g->n_nodes; i++)
        if (m[0].g->nodes[i].op == DW_OP_MOE_LINEAR)
            codes += 2 * dw_ir_numel(&m[0].g->tensors[m[0].g->nodes[i].in[1]]), layers++,
                below += dw_compile_wcache_below(m[0].c, i);
    assert_int_equal(check_wcache(m[0].c), layers);
    assert_int_equal(check_wcache(m[1].c), 0);
    const int64_t drop = m[1].c->pool_bytes[DW_POOL_WORK] - m[0].c->pool_bytes[DW_POOL_WORK];
    printf("  %-8s fp8_block %lld x %lld: %lld MoE layers' codes (%.2f GiB) in the arena (%lld on lower gradients "
           "alone): workspace %.2f -> %.2f GiB, arena %.2f GiB both\n", preset, (long long)B, (long long)T,
           (long long)layers, codes / GIB, (long long)below,
           m[1].c->pool_bytes[DW_POOL_WORK] / GIB, m[0].c->pool_bytes[DW_POOL_WORK] / GIB, m[0].c->pool_bytes[DW_POOL_ACT] / GIB);
    assert_true(m[0].c->pool_bytes[DW_POOL_ACT] == m[1].c->pool_bytes[DW_POOL_ACT]);
    assert_true(drop >= codes && (double)drop / GIB > fall);
    for (int w = 0; w < 2; w++) dw_test_model_free(&m[w]);
}

static void test_wcache_presets(void **state) {
    (void)state;
    check_wcache_preset("moe-e8", 8, 2048, 4.0);
    check_wcache_preset("moe-e64", 4, 2048, 4.4);
}

/* The planner: with DW_GRAD_ARENA=1 a one-micro-batch ZeRO-0/1 plan is priced without the gradient
 * pool, accumulation or ZeRO-2 with it (as the engine runs them). */
static void test_planner(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h200", 1);
    hw->n_gpus = 1, hw->nvlink_domain = 1;
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(ctx, "llama-tiny", &cfg), DW_OK);
    dw_job j = {.seq = 64, .global_batch = 4, .recipe = DW_RECIPE_BF16};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    dw_par one = {.dp = 1, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 2, .grad_accum = 1};
    dw_par acc = one;
    acc.grad_accum = 2;
    dw_engine_mem m1, m2, m0;
    setenv("DW_GRAD_ARENA", "1", 1);
    assert_int_equal(dw_plan_engine_memory_par(ctx, &in, &one, &m1), DW_OK);
    assert_int_equal(dw_plan_engine_memory_par(ctx, &in, &acc, &m2), DW_OK);
    unsetenv("DW_GRAD_ARENA");
    assert_int_equal(dw_plan_engine_memory(ctx, &in, 2, DW_RECOMPUTE_NONE, &m0), DW_OK); /* the default: the pool */
    assert_true(m1.pool[DW_POOL_GRADS] == 0 && m0.pool[DW_POOL_GRADS] > 0);
    for (int k = 0; k < DW_POOL_COUNT; k++) assert_true(m2.pool[k] == m0.pool[k]);
    assert_true(m1.pool[DW_POOL_ACT] > m0.pool[DW_POOL_ACT] && m1.total < m0.total);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits),
        cmocka_unit_test(test_same_bits_bf16),
        cmocka_unit_test(test_bf16_remade),
        cmocka_unit_test(test_poisoned),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_wcache_presets),
        cmocka_unit_test(test_planner),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
