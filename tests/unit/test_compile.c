/* test_compile.c — dw_compile's program (compile/program.h) on real captured graphs (random
 * gpt2/llama/qwen2 shapes and batches, FP32, BF16 and every quantised recipe, CPU and CUDA
 * targets): the steps and phases (forward in graph order but for epilogue-fused GELUs, backward in
 * reverse but for ops.def's BWD_IN_FWD rows and backward-fused GELUs, the optimizer's norm, AdamW
 * and refresh of BF16 runs and weight caches); the activation arena (buffers live at the same
 * time never overlap, every offset aligned and inside, every buffer a step touches live at that
 * step: an oracle restating each op's accesses); gradient delivery (one writer, the first in
 * backward order; later readers add in through the op when its row has ACC_IN<s>, else through an
 * ACC<s> temporary); shared gradient buffers; parameter pools (aligned, decay first) and BF16
 * copies; the workspace and quantised slots; per-linear decisions against the GEMM registry
 * (dw_compile_linear_quantised; the CPU reference takes every shape; a registered kernel is
 * chosen by name); unsupported ops per target; refusals; engines for either target's program.
 * Every random graph is also compiled with full recompute and passes the same checks, the
 * forwards run again included (their accesses live at their times too). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/passes.h"
#include "gemm/compute_capability.h"
#include "precision/policy.h"
#include "testutil.h"

static dw_ctx *g_ctx;
static dw_test_rng g_rng;

static int setup(void **state) {
    (void)state;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xC0Cull); /* its own stream of the seed */
    return dw_ctx_create(&o, &g_ctx) == DW_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    dw_ctx_free(g_ctx);
    return 0;
}

static int64_t rnd(int64_t lo, int64_t hi) { return lo + (int64_t)(dw_test_next(&g_rng) % (uint64_t)(hi - lo + 1)); }

static dw_graph *random_graph(const char *preset) {
    dw_model_config c;
    assert_int_equal(dw_model_config_load(g_ctx, preset, &c), DW_OK);
    c.n_layers = rnd(1, 3);
    c.vocab_size = rnd(20, 300);
    c.d_ff = rnd(8, 64);
    c.max_seq = 64;
    c.n_kv_heads = rnd(1, 2);
    c.n_heads = c.arch == DW_ARCH_GPT2 ? c.n_kv_heads : c.n_kv_heads * rnd(1, 3);
    c.head_dim = 2 * rnd(1, 8);
    c.d_model = c.arch == DW_ARCH_GPT2 ? c.n_heads * c.head_dim : rnd(6, 48);
    c.tie_embeddings = rnd(0, 1);
    dw_graph *g = NULL;
    if (dw_capture_config(g_ctx, &c, rnd(1, 4), rnd(1, 64), &g) != DW_OK) fail_msg("%s", dw_errmsg(g_ctx));
    return g;
}

/* Compiles g for a target (DW_DEVICE_AUTO: the context's, the CPU), fusion as fuse says (-1: the
 * default). */
static int g_recompute = DW_RECOMPUTE_NONE; /* what compile_fused asks for */

static dw_compiled *compile_fused(const dw_graph *g, const dw_policy *p, dw_device_kind dev, int sm, int fuse) {
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.device = dev;
    o.sm = sm;
    o.recompute = g_recompute;
    if (fuse >= 0) o.fuse = fuse;
    dw_compiled *c = NULL;
    if (dw_compile(g_ctx, g, NULL, p, &o, &c) != DW_OK) fail_msg("%s", dw_errmsg(g_ctx));
    assert_non_null(c);
    assert_int_equal(c->target.device, dev == DW_DEVICE_AUTO ? DW_DEVICE_CPU : dev);
    assert_int_equal(c->target.sm, dev == DW_DEVICE_CUDA ? (sm ? sm : 90) : 0);
    assert_int_equal(c->fuse, o.fuse);
    return c;
}

static dw_compiled *compile_for(const dw_graph *g, const dw_policy *p, dw_device_kind dev, int sm) {
    return compile_fused(g, p, dev, sm, -1);
}

static int64_t numel(const dw_graph *g, int t) { return dw_ir_numel(&g->tensors[t]); }
static int64_t width(const dw_graph *g, int t) { return g->tensors[t].shape[g->tensors[t].ndim - 1]; }
static bool quant_linear(const dw_compiled *c, int i) {
    return c->g->nodes[i].op == DW_OP_LINEAR && c->bf16 && dw_compile_quant_recipe(c->node[i].bind.recipe);
}

/* The item of (kind, index), or -1. */
static int find_item(const dw_compiled *c, dw_buf_kind k, int index) {
    for (int i = 0; i < c->n_items; i++)
        if (c->info[i].kind == k && c->info[i].index == index) return i;
    return -1;
}

/* A value/gradient/aux buffer must exist and be live at logical time s. */
static void live_at(const dw_compiled *c, dw_buf_kind k, int index, int s, const char *why) {
    if (k == DW_BUF_GRAD) /* a gradient shared through a residual add lives in its root's buffer */
        while (c->tensor[index].grad_alias != index) index = c->tensor[index].grad_alias;
    int it = find_item(c, k, index);
    if (it < 0) fail_msg("%s: no buffer (kind %d, index %d)", why, (int)k, index);
    if (!dw_mem_live_at(&c->items[it], s))
        fail_msg("%s: buffer (kind %d, index %d) live [%d, %d] (then [%d, %d]), needed at time %d", why, (int)k,
                 index, c->items[it].first, c->items[it].last, c->items[it].first2, c->items[it].last2, s);
}

static bool reads_inputs_bwd(dw_op op) { /* restated from the ops' backward rules */
    switch (op) {
    case DW_OP_LAYERNORM: case DW_OP_RMSNORM: case DW_OP_LINEAR: case DW_OP_GELU: case DW_OP_SILU:
    case DW_OP_SWIGLU: case DW_OP_ATTENTION: case DW_OP_GELU_ERF: case DW_OP_RELU: return true;
    default: return false;
    }
}

/* 1. The steps and phases. */
static void check_steps(const dw_graph *g, const dw_compiled *c) {
    const int nn = g->n_nodes;
    int again = 0; /* recomputed forwards: times in the backward sweep, before their backward */
    for (int i = 0; i < nn; i++) {
        assert_int_equal(dw_compile_fwd_time(c, i), i);
        const int r = dw_compile_rc_time(c, i);
        assert_int_equal(r >= 0, dw_compile_recomputed(c, i));
        if (r >= 0) assert_true(r >= nn && r < dw_compile_bwd_time(c, i)), again++;
        if (i + 1 < nn) assert_true(dw_compile_bwd_time(c, i) > dw_compile_bwd_time(c, i + 1));
        if (!again) assert_int_equal(dw_compile_bwd_time(c, i), 2 * nn - 1 - i + (c->n_times - 2 * nn));
    }
    assert_int_equal(c->n_times, 2 * nn + again);
    if (c->recompute == DW_RECOMPUTE_NONE) assert_int_equal(again, 0);
    const int (*ph)[2] = c->phase;
    assert_int_equal(ph[DW_PHASE_FORWARD][0], 0);
    assert_int_equal(ph[DW_PHASE_FORWARD][1], ph[DW_PHASE_BACKWARD][0]);
    assert_int_equal(ph[DW_PHASE_BACKWARD][1], ph[DW_PHASE_OPTIMIZER][0]);
    assert_int_equal(ph[DW_PHASE_OPTIMIZER][1], c->n_steps);
    assert_int_equal(ph[DW_PHASE_REFRESH][0], ph[DW_PHASE_OPTIMIZER][0] + 2);
    assert_int_equal(ph[DW_PHASE_REFRESH][1], c->n_steps);
    /* forward: every node in graph order, but a GELU whose forward a linear's epilogue does */
    int s = ph[DW_PHASE_FORWARD][0];
    for (int i = 0; i < nn; i++) {
        if (c->node[i].fused & DW_FUSED_FWD) {
            const int L = c->node[i].partner_fwd;
            assert_int_equal(g->nodes[i].op, DW_OP_GELU);
            assert_true(L >= 0 && L < i && g->nodes[L].op == DW_OP_LINEAR && g->nodes[L].out[0] == g->nodes[i].in[0]);
            assert_int_equal(c->node[L].partner_fwd, i);
            continue;
        }
        assert_true(s < ph[DW_PHASE_FORWARD][1]);
        assert_int_equal(c->steps[s].kind, DW_STEP_FWD);
        assert_int_equal(c->steps[s].node, i);
        s++;
    }
    assert_int_equal(s, ph[DW_PHASE_FORWARD][1]);
    /* backward: reverse order, none where the forward does it (ops.def BWD_IN_FWD: cross-entropy)
     * or where a dgrad epilogue does it (a backward-fused GELU) */
    for (int i = nn - 1; i >= 0; i--) {
        const bool in_fwd = (dw_op_flags(g->nodes[i].op) & DW_OPF_BWD_IN_FWD) != 0;
        assert_int_equal(in_fwd, g->nodes[i].op == DW_OP_CROSS_ENTROPY);
        if (in_fwd || (c->node[i].fused & DW_FUSED_BWD)) continue;
        while (s < ph[DW_PHASE_BACKWARD][1] && c->steps[s].kind == DW_STEP_FWD) { /* a forward again */
            assert_int_equal(c->steps[s].arg, 1);
            assert_true(dw_compile_rc_time(c, c->steps[s].node) >= 0);
            assert_true(dw_compile_rc_time(c, c->steps[s].node) < dw_compile_bwd_time(c, i));
            s++;
        }
        assert_true(s < ph[DW_PHASE_BACKWARD][1]);
        assert_int_equal(c->steps[s].kind, DW_STEP_BWD);
        assert_int_equal(c->steps[s].node, i);
        s++;
    }
    assert_int_equal(s, ph[DW_PHASE_BACKWARD][1]);
    /* optimizer: the gradient norm, AdamW, then the refresh: one BF16 copy per run, one weight
     * cache per quantised node */
    assert_int_equal(c->steps[s].kind, DW_STEP_GRAD_NORM);
    assert_int_equal(c->steps[s++].node, -1);
    assert_int_equal(c->steps[s].kind, DW_STEP_ADAMW);
    assert_int_equal(c->steps[s++].node, -1);
    for (int r = 0; r < c->n_bf16_runs; r++, s++) {
        assert_int_equal(c->steps[s].kind, DW_STEP_CAST_BF16);
        assert_int_equal(c->steps[s].node, -1);
        assert_int_equal(c->steps[s].arg, r);
    }
    for (int i = 0; i < nn; i++) {
        const bool q = quant_linear(c, i);
        assert_int_equal(c->node[i].wq[0].off >= 0, q);
        assert_int_equal(c->node[i].wq[1].off >= 0, q);
        if (!q) continue;
        assert_int_equal(c->steps[s].kind, DW_STEP_QUANT_W);
        assert_int_equal(c->steps[s++].node, i);
    }
    assert_int_equal(s, c->n_steps);
    if (c->bf16) assert_true(c->n_bf16_runs >= 1); /* norm weights at least */
    else assert_int_equal(c->n_bf16_runs, 0);
}

/* 2. The arena: no overlap among co-live buffers, alignment, inside; every item at its tensor's or
 * node's offsets; every activation's value and gradient inside the pool and aligned. */
static void check_arena(const dw_graph *g, const dw_compiled *c) {
    int64_t sum = 0;
    for (int i = 0; i < c->n_items; i++) {
        const dw_mem_item *a = &c->items[i];
        sum += (a->size + 255) / 256 * 256; /* each buffer starts 256-byte aligned */
        assert_int_equal(a->offset % 256, 0);
        assert_true(a->offset >= 0 && a->size > 0 && a->offset + a->size <= c->arena_bytes);
        assert_true(a->first >= 0 && a->first <= a->last && a->last < c->n_times);
        if (a->first2 > a->last) assert_true(a->first2 <= a->last2 && a->last2 < c->n_times);
        for (int j = i + 1; j < c->n_items; j++) {
            const dw_mem_item *b = &c->items[j];
            bool together = false;
            for (int t = 0; t < c->n_times && !together; t++) together = dw_mem_live_at(a, t) && dw_mem_live_at(b, t);
            bool overlap = a->offset < b->offset + b->size && b->offset < a->offset + a->size;
            if (together && overlap) fail_msg("arena buffers %d and %d are live together and overlap", i, j);
        }
        const int x = c->info[i].index;
        switch (c->info[i].kind) {
        case DW_BUF_VALUE:
            assert_int_equal(c->tensor[x].val_off, a->offset);
            assert_int_equal(a->size, numel(g, x) * c->act_size);
            break;
        case DW_BUF_GRAD:
            assert_int_equal(c->tensor[x].grad_alias, x); /* one item per alias root */
            assert_int_equal(c->tensor[x].grad_off, a->offset);
            break;
        case DW_BUF_AUX: case DW_BUF_BTMP: case DW_BUF_FTMP: {
            int64_t lo = INT64_MAX;
            const int64_t *offs = c->info[i].kind == DW_BUF_AUX ? c->node[x].aux_off : c->node[x].tmp_off;
            const int n = c->info[i].kind == DW_BUF_AUX ? DW_AUX_COUNT : DW_TMP_COUNT;
            for (int k = 0; k < n; k++) {
                const bool xent = c->info[i].kind != DW_BUF_AUX && k == DW_TMP_XENT;
                if (offs[k] < 0 || xent != (c->info[i].kind == DW_BUF_FTMP)) continue;
                assert_true(offs[k] >= a->offset && offs[k] < a->offset + a->size && offs[k] % 256 == 0);
                if (offs[k] < lo) lo = offs[k];
            }
            assert_int_equal(lo, a->offset);
            break;
        }
        default: fail_msg("item %d: unknown kind %d", i, (int)c->info[i].kind);
        }
    }
    assert_true(c->arena_bytes >= c->live_peak && c->live_peak > 0 && c->arena_bytes <= sum);
    for (int t = 0; t < g->n_tensors; t++) {
        const dw_ir_tensor *x = &g->tensors[t];
        const dw_prog_tensor *pt = &c->tensor[t];
        const bool act = x->kind == DW_TENSOR_ACT && t != g->loss;
        const int64_t bytes = numel(g, t) * c->act_size;
        assert_int_equal(pt->val_off >= 0, act); /* parameters and inputs live elsewhere, the loss in the workspace */
        if (act) assert_true(pt->val_off % 256 == 0 && pt->val_off + bytes <= c->arena_bytes);
        if (pt->grad_off >= 0) {
            assert_true(act);
            assert_true(pt->grad_off % 256 == 0 && pt->grad_off + bytes <= c->arena_bytes);
        }
        assert_int_equal(pt->param >= 0, x->kind == DW_TENSOR_PARAM);
        if (pt->param >= 0) assert_int_equal(c->param_tensor[pt->param], t);
        assert_int_equal(pt->count_off, -1); /* no data-dependent rows without MoE */
        if (x->kind == DW_TENSOR_ACT && x->ndim == 3) {
            assert_int_equal(pt->rows_cap, g->batch * g->seq);
            assert_int_equal(pt->width, width(g, t));
        }
    }
    /* the logits' gradient is written over them (ops.def DX0_OVER_X0) */
    assert_int_equal(c->tensor[g->logits].grad_off, c->tensor[g->logits].val_off);
}

/* 3. Every access of a step is to a live buffer (a fused GELU's accesses happen in its linear
 * neighbours' steps: its output written by the producer's fprop, its input gradient written by
 * the consumer's dgrad, which reads its input and no longer touches its output gradient). */
static void check_liveness(const dw_graph *g, const dw_compiled *c) {
    char why[256];
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const dw_ir_node *n = &g->nodes[ni];
        const int f = dw_compile_fwd_time(c, ni), b = dw_compile_bwd_time(c, ni);
        const uint8_t fz = c->node[ni].fused;
        snprintf(why, sizeof why, "node %s forward", n->name);
        for (int s = 0; s < n->n_in; s++)
            if (g->tensors[n->in[s]].kind == DW_TENSOR_ACT) live_at(c, DW_BUF_VALUE, n->in[s], f, why);
        if (n->out[0] != g->loss) live_at(c, DW_BUF_VALUE, n->out[0], f, why);
        const int r = dw_compile_rc_time(c, ni);
        if (r >= 0) { /* the forward run again reads and writes what the first one did */
            snprintf(why, sizeof why, "node %s forward again", n->name);
            for (int s = 0; s < n->n_in; s++)
                if (g->tensors[n->in[s]].kind == DW_TENSOR_ACT) live_at(c, DW_BUF_VALUE, n->in[s], r, why);
            for (int o = 0; o < n->n_out; o++) live_at(c, DW_BUF_VALUE, n->out[o], r, why);
            if (find_item(c, DW_BUF_AUX, ni) >= 0) live_at(c, DW_BUF_AUX, ni, r, why);
            if (find_item(c, DW_BUF_FTMP, ni) >= 0) live_at(c, DW_BUF_FTMP, ni, r, why);
        }
        if (fz & DW_FUSED_FWD) {
            const int L = c->node[ni].partner_fwd, fl = dw_compile_fwd_time(c, L), rl = dw_compile_rc_time(c, L);
            snprintf(why, sizeof why, "GELU %s computed in %s's forward", n->name, g->nodes[L].name);
            live_at(c, DW_BUF_VALUE, n->out[0], fl, why);
            live_at(c, DW_BUF_VALUE, n->in[0], fl, why);
            if (rl >= 0) live_at(c, DW_BUF_VALUE, n->out[0], rl, why), live_at(c, DW_BUF_VALUE, n->in[0], rl, why);
        }
        if (fz & DW_FUSED_BWD) {
            const int P = c->node[ni].partner_bwd, bp = dw_compile_bwd_time(c, P);
            assert_true(P > ni && g->nodes[P].op == DW_OP_LINEAR && g->nodes[P].in[0] == n->out[0]);
            assert_int_equal(c->node[P].partner_bwd, ni);
            assert_true(c->node[P].bind.recipe == DW_RECIPE_BF16 || /* no quantised DGELU epilogue */
                        (c->node[P].bind.bf16_passes >> DW_QPASS_DGRAD & 1u));
            assert_int_equal(c->tensor[n->out[0]].grad_off, -1);         /* never materialised */
            snprintf(why, sizeof why, "GELU %s backward in %s's dgrad", n->name, g->nodes[P].name);
            live_at(c, DW_BUF_VALUE, n->in[0], bp, why);
            live_at(c, DW_BUF_GRAD, n->in[0], bp, why);
            live_at(c, DW_BUF_GRAD, n->in[0], b, why); /* and until the producer's backward reads it */
            continue; /* G's own backward does nothing */
        }
        if (n->op == DW_OP_CROSS_ENTROPY) { /* dlogits written over the logits in the forward step */
            assert_true(c->node[ni].tmp_off[DW_TMP_XENT] >= 0);
            live_at(c, DW_BUF_FTMP, ni, f, "cross-entropy workspace");
            continue;
        }
        snprintf(why, sizeof why, "node %s backward", n->name);
        if (n->out[0] == g->logits) live_at(c, DW_BUF_VALUE, n->out[0], b, "dlogits (in place) read by the LM head");
        else live_at(c, DW_BUF_GRAD, n->out[0], b, why);
        if (n->op == DW_OP_ATTENTION) live_at(c, DW_BUF_VALUE, n->out[0], b, why);
        for (int s = 0; s < n->n_in; s++) {
            const int t = n->in[s];
            if (g->tensors[t].kind != DW_TENSOR_ACT) continue;
            if (reads_inputs_bwd(n->op)) live_at(c, DW_BUF_VALUE, t, b, why);
            const int pg = g->tensors[t].producer; /* a linear after a backward-fused GELU: checked above */
            if (!(s == 0 && g->nodes[pg].op == DW_OP_GELU && (c->node[pg].fused & DW_FUSED_BWD)))
                live_at(c, DW_BUF_GRAD, t, b, why);
            if (c->node[ni].grad_mode[s] == DW_GRAD_ACCUM_TMP) live_at(c, DW_BUF_BTMP, ni, b, why);
        }
        const bool saves = n->op == DW_OP_LAYERNORM || n->op == DW_OP_RMSNORM || n->op == DW_OP_ATTENTION;
        if (saves) {
            live_at(c, DW_BUF_AUX, ni, f, why);
            live_at(c, DW_BUF_AUX, ni, b, why);
        }
    }
}

/* 4. Gradient modes: per activation one WRITE, by its last reader (the first backward to reach it);
 * the later ones ACCUM where the op's row has ACC_IN<s> (no temporary), else ACCUM_TMP with the
 * ACC<s> temporary planned in the node's backward scratch; NONE for tokens and parameters. */
static void check_grad_modes(const dw_graph *g, const dw_compiled *c) {
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const dw_ir_node *n = &g->nodes[ni];
        const dw_prog_node *pn = &c->node[ni];
        const int flags = dw_op_flags(n->op);
        for (int s = 0; s < DW_IR_MAX_INPUTS; s++) {
            const int64_t acc = pn->tmp_off[DW_TMP_ACC0 + s];
            if (s >= n->n_in || g->tensors[n->in[s]].kind != DW_TENSOR_ACT) {
                assert_int_equal(pn->grad_mode[s], DW_GRAD_NONE);
                assert_int_equal(acc, -1);
                continue;
            }
            switch ((dw_grad_mode)pn->grad_mode[s]) {
            case DW_GRAD_WRITE: assert_int_equal(acc, -1); break;
            case DW_GRAD_ACCUM:
                assert_true(flags & DW_OPF_ACC_IN(s));
                assert_int_equal(acc, -1);
                break;
            case DW_GRAD_ACCUM_TMP: {
                assert_false(flags & DW_OPF_ACC_IN(s));
                const int it = find_item(c, DW_BUF_BTMP, ni);
                assert_true(acc >= 0 && it >= 0);
                assert_true(acc + numel(g, n->in[s]) * c->act_size <= c->items[it].offset + c->items[it].size);
                break;
            }
            default: fail_msg("node %s slot %d: gradient mode %d for an activation", n->name, s, pn->grad_mode[s]);
            }
        }
    }
    for (int t = 0; t < g->n_tensors; t++) {
        if (g->tensors[t].kind != DW_TENSOR_ACT || t == g->loss) continue;
        int writes = 0, last = -1, writer = -1;
        for (int ni = 0; ni < g->n_nodes; ni++)
            for (int s = 0; s < g->nodes[ni].n_in; s++)
                if (g->nodes[ni].in[s] == t) {
                    last = ni;
                    if (c->node[ni].grad_mode[s] == DW_GRAD_WRITE) writes++, writer = ni;
                }
        assert_int_equal(writes, 1);
        assert_int_equal(writer, last);
    }
}

/* 5. Shared gradient buffers: only through an add whose backward writes that input first (slot 1
 * also read by nothing else and, when slot 0 shares too, slot 0's other readers all before slot
 * 1's producer), sharing the add output's buffer, at the same offset. */
static void check_grad_alias(const dw_graph *g, const dw_compiled *c) {
    for (int t = 0; t < g->n_tensors; t++) {
        const int r = c->tensor[t].grad_alias;
        if (r == t) continue;
        assert_true(c->tensor[t].grad_off >= 0 && c->tensor[t].grad_off == c->tensor[r].grad_off);
        bool justified = false;
        for (int p = 0; p < g->n_nodes && !justified; p++) {
            const dw_ir_node *n = &g->nodes[p];
            if (n->op != DW_OP_ADD || c->tensor[n->out[0]].grad_off != c->tensor[t].grad_off) continue;
            for (int s = 0; s < 2; s++) {
                if (n->in[s] != t || c->node[p].grad_mode[s] != DW_GRAD_WRITE) continue;
                if (s == 0) {
                    justified = true;
                    continue;
                }
                bool alone = true, before = true;
                const int a = n->in[0], pb = g->tensors[t].producer;
                for (int i = 0; i < g->n_nodes; i++)
                    for (int q = 0; q < g->nodes[i].n_in; q++) {
                        if (g->nodes[i].in[q] == t && i != p) alone = false;
                        if (g->nodes[i].in[q] == a && i != p && i >= pb) before = false;
                    }
                if (alone && (c->tensor[a].grad_alias == a || before)) justified = true;
            }
        }
        if (!justified) fail_msg("gradient of tensor %d shares a buffer without a residual add that allows it", t);
    }
}

/* 6. Parameter pools (disjoint, inside, 64-float aligned, decay first), the BF16 copies (a
 * parameter is converted on use only when quantised GEMMs alone read it; runs cover the others
 * and nothing else), pool totals, the report's total. */
static void check_params_and_pools(const dw_graph *g, const dw_compiled *c) {
    int64_t total = 0;
    int n_param_tensors = 0;
    for (int t = 0; t < g->n_tensors; t++) n_param_tensors += g->tensors[t].kind == DW_TENSOR_PARAM;
    assert_int_equal(c->n_params, n_param_tensors);
    for (int p = 0; p < c->n_params; p++) {
        const dw_ir_tensor *t = &g->tensors[c->param_tensor[p]];
        assert_int_equal(t->kind, DW_TENSOR_PARAM);
        assert_int_equal(c->tensor[c->param_tensor[p]].param, p);
        if (p) assert_true(c->param_tensor[p] > c->param_tensor[p - 1]); /* graph order */
        int64_t lo = c->param_off[p], hi = lo + dw_ir_numel(t);
        total += dw_ir_numel(t);
        assert_int_equal(lo % 64, 0);
        assert_true(lo >= 0 && hi <= c->param_floats);
        if (t->decay) assert_true(hi <= c->decay_floats);
        else assert_true(lo >= c->decay_floats);
        for (int q = p + 1; q < c->n_params; q++) {
            int64_t lo2 = c->param_off[q], hi2 = lo2 + dw_ir_numel(&g->tensors[c->param_tensor[q]]);
            assert_false(lo < hi2 && lo2 < hi);
        }
        /* BF16 copies */
        bool by_quant = false, by_bf16 = false;
        for (int i = 0; c->bf16 && i < g->n_nodes; i++) {
            const dw_ir_node *n = &g->nodes[i];
            if (n->op != DW_OP_LINEAR || n->in[1] != c->param_tensor[p]) continue;
            const dw_node_binding *b = &c->node[i].bind;
            if (!dw_compile_quant_recipe(b->recipe)) by_bf16 = true;
            else if (b->quantised[DW_QPASS_FPROP] && b->quantised[DW_QPASS_DGRAD]) by_quant = true;
        }
        assert_int_equal(c->bf16_lazy[p], by_quant && !by_bf16);
        int covering = 0;
        for (int r = 0; r < c->n_bf16_runs; r++) {
            const int64_t b0 = c->bf16_runs[r][0], b1 = c->bf16_runs[r][1];
            if (lo < b1 && b0 < hi) {
                assert_true(b0 <= lo && hi <= b1); /* inside one run, never cut */
                covering++;
            }
        }
        assert_int_equal(covering, c->bf16 && !c->bf16_lazy[p] ? 1 : 0);
    }
    for (int r = 0; r < c->n_bf16_runs; r++) {
        assert_true(c->bf16_runs[r][0] >= 0 && c->bf16_runs[r][0] < c->bf16_runs[r][1]);
        assert_true(c->bf16_runs[r][1] <= c->param_floats);
        if (r) assert_true(c->bf16_runs[r][0] >= c->bf16_runs[r - 1][1] + 64); /* closer runs are merged */
    }
    assert_int_equal(total, dw_graph_params(g));
    assert_int_equal(c->pool_bytes[DW_POOL_WEIGHTS], c->param_floats * (c->bf16 ? 6 : 4));
    assert_int_equal(c->pool_bytes[DW_POOL_GRADS], c->param_floats * 4);
    assert_int_equal(c->pool_bytes[DW_POOL_OPTIM], c->param_floats * 8);
    assert_int_equal(c->pool_bytes[DW_POOL_ACT], c->arena_bytes);
    assert_true(c->pool_bytes[DW_POOL_WORK] >= 2 * 4 * g->batch * g->seq);
    for (int p = 0; p < DW_POOL_COUNT; p++) assert_int_equal(dw_compiled_pool_bytes(c, p), c->pool_bytes[p]);
    assert_int_equal(dw_compiled_pool_bytes(c, DW_POOL_COUNT), 0);
    assert_int_equal(dw_compiled_pool_bytes(c, -1), 0);
    /* the report: the target, and a total that is the sum of the pools */
    char *text = NULL;
    assert_int_equal(dw_compiled_report(g_ctx, c, &text), DW_OK);
    char want[64];
    if (c->target.device == DW_DEVICE_CUDA)
        snprintf(want, sizeof want, "target: cuda, kernels chosen for sm_%d", c->target.sm);
    else snprintf(want, sizeof want, "target: cpu");
    assert_non_null(strstr(text, want));
    const char *tl = strstr(text, "  total");
    assert_non_null(tl);
    long long reported = 0;
    assert_int_equal(sscanf(tl, " total %lld B", &reported), 1);
    int64_t pools = 0;
    for (int p = 0; p < DW_POOL_COUNT; p++) pools += dw_compiled_pool_bytes(c, p);
    assert_int_equal(reported, pools);
    dw_free_string(text);
}

/* 7. Decisions per node: non-linear ops run in the activation type; FP32 linears use each
 * backend's FP32 reference; a BF16 program's linear passes agree with the registry's answer at the
 * planned rows (recomputed: dw_compile_linear_quantised with a reason buffer), a quantised pass
 * names its kernel, a fallback says why; on the CPU target every quantised GEMM is quantised at any
 * shape. No op of a compiled program is one ops.def says the target lacks. */
static void check_bind(const dw_graph *g, const dw_compiled *c) {
    const bool cpu = c->target.device == DW_DEVICE_CPU;
    for (int i = 0; i < g->n_nodes; i++) /* a compiled program has no op its target lacks */
        assert_true(dw_op_on_backend(g->nodes[i].op, c->target.device));
    if (!c->policy_json) assert_string_equal(c->precision, "fp32");
    assert_int_equal(c->policy_json != NULL, c->bf16);
    assert_int_equal(c->act_size, c->bf16 ? 2 : 4);
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        const dw_node_binding *b = &c->node[i].bind;
        if (n->op != DW_OP_LINEAR || !c->bf16) {
            if (n->op != DW_OP_LINEAR) {
                assert_int_equal(b->recipe, DW_RECIPE_BF16);
                assert_int_equal(b->reason, DW_POLICY_NOT_GEMM);
                assert_int_equal(b->rule, -1);
            }
            for (int p = 0; p < DW_QPASS_COUNT; p++) assert_true(!b->quantised[p] && !b->kernel[p]);
            assert_null(b->note);
            continue;
        }
        int64_t N, K, M;
        dw_compile_linear_dims(c, i, &N, &K, &M);
        assert_int_equal(N, g->batch * g->seq);
        assert_int_equal(K, width(g, n->in[0]));
        assert_int_equal(M, width(g, n->out[0]));
        const bool qr = dw_compile_quant_recipe(b->recipe);
        bool fallback = false;
        for (int p = 0; p < DW_QPASS_COUNT; p++) {
            const char *k = (const char *)b; /* must be overwritten */
            char why[256] = "x";
            const bool q = dw_compile_linear_quantised(c, i, (dw_qpass)p, N, &k, why, sizeof why);
            if (q != b->quantised[p])
                fail_msg("%s pass %d: bound %d, the registry now says %d (%s)", n->name, p, b->quantised[p], q, why);
            if (q) {
                assert_true(qr);
                assert_non_null(k);
                assert_non_null(b->kernel[p]);
                assert_string_equal(k, b->kernel[p]);
                assert_string_equal(why, "");
            } else {
                assert_null(k);
                assert_true(why[0] != '\0'); /* the reason (the node's recipe, or the nearest kernel's) */
                fallback = fallback || qr;
            }
            if (cpu) assert_non_null(b->kernel[p]); /* the reference runs BF16 and quantised GEMMs alike */
            if (cpu && qr && !(b->bf16_passes >> p & 1u)) { /* at every shape, but the passes a rule keeps BF16 */
                assert_true(q);
                assert_true(dw_compile_linear_quantised(c, i, (dw_qpass)p, 1 + rnd(0, N - 1), NULL, NULL, 0));
            }
        }
        if (qr) {
            assert_non_null(b->note);
            assert_int_equal(strstr(b->note, "BF16 FALLBACK") != NULL, fallback);
        } else {
            assert_null(b->note);
        }
    }
}

/* A slot holds (recipe, R, C): codes before the scales, scales before the tensor scale, inside. */
static void slot_fits(const dw_qslot_layout *l, dw_recipe r, int64_t R, int64_t C, const char *what) {
    if (l->off < 0) fail_msg("%s: no slot", what);
    int64_t codes = R * dw_quant_row_bytes(r, C), scales = (int64_t)dw_quant_scales_bytes(r, R, C);
    if (l->off % 256 || l->scales < codes || l->scales % 256 || l->tscale < l->scales + scales ||
        l->tscale % 4 || l->bytes < l->tscale + 4)
        fail_msg("%s [%lld, %lld] in %s does not fit its slot (codes %lld, scales at %lld, tscale at %lld, %lld bytes)",
                 what, (long long)R, (long long)C, dw_recipe_name(r), (long long)codes, (long long)l->scales,
                 (long long)l->tscale, (long long)l->bytes);
}

/* 8. The workspace: tokens, targets, loss, norm, partials, AdamW arguments, the bias-gradient row;
 * for quantised layers every operand the engine quantises fits its slot (fprop x, W; backward dy,
 * dy^T, W^T, x^T and x's row-wise copy), each quantised node has its own W and W^T cache, other
 * nodes none; no two regions overlap. */
static void check_workspace(const dw_graph *g, const dw_compiled *c) {
    const dw_work_layout *w = &c->work;
    const int64_t N = g->batch * g->seq;
    int64_t lo[512], hi[512];
    int nr = 0;
#define REGION(o, b) (assert_true(nr < 512), lo[nr] = (o), hi[nr] = (o) + (b), nr++)
    REGION(w->tokens, N * 4), REGION(w->targets, N * 4), REGION(w->loss, 4), REGION(w->norm, 8);
    REGION(w->partials, DW_COMPILE_NORM_BLOCKS * 8), REGION(w->adamw_args, DW_COMPILE_ADAMW_ARGS_BYTES);
    int64_t widest = 0;
    for (int i = 0; c->bf16 && i < g->n_nodes; i++)
        if (g->nodes[i].op == DW_OP_LINEAR && g->nodes[i].n_in == 3 && width(g, g->nodes[i].out[0]) > widest)
            widest = width(g, g->nodes[i].out[0]);
    if (widest) REGION(w->bgrad, widest * 4);
    else assert_int_equal(w->bgrad, -1);
    bool any = false;
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        const dw_prog_node *pn = &c->node[i];
        if (!quant_linear(c, i)) {
            assert_true(pn->wq[0].off < 0 && pn->wq[1].off < 0);
            continue;
        }
        any = true;
        const int64_t K = width(g, n->in[0]), M = width(g, n->out[0]);
        /* DESIGN.md's block recipe: 1x128 activations and gradients, 128x128 weights */
        const dw_recipe r = pn->bind.recipe;
        const bool blk = r == DW_RECIPE_FP8_BLOCK || r == DW_RECIPE_FP8_BLOCK2D;
        const dw_recipe ra = blk ? DW_RECIPE_FP8_BLOCK : r, rw = blk ? DW_RECIPE_FP8_BLOCK2D : r;
        assert_int_equal(dw_compile_quant_act_recipe(r), ra);
        assert_int_equal(dw_compile_quant_weight_recipe(r), rw);
        slot_fits(&w->q_rows, ra, N, K, "x");
        slot_fits(&w->q_rows, ra, N, M, "dy");
        slot_fits(&w->q_dyt, ra, M, N, "dy^T");
        slot_fits(&w->q_xt, ra, K, N, "x^T");
        slot_fits(&pn->wq[0], rw, M, K, "W");
        slot_fits(&pn->wq[1], rw, K, M, "W^T");
        /* the weight cache is sized for W's own recipe, not a finer one (each node owns its cache) */
        assert_int_equal(pn->wq[0].tscale - pn->wq[0].scales, (dw_quant_scales_bytes(rw, M, K) + 255) / 256 * 256);
        assert_int_equal(pn->wq[1].tscale - pn->wq[1].scales, (dw_quant_scales_bytes(rw, K, M) + 255) / 256 * 256);
        REGION(pn->wq[0].off, pn->wq[0].bytes), REGION(pn->wq[1].off, pn->wq[1].bytes);
        assert_true(w->quant_ws >= 0 && w->quant_ws_bytes >= (1 + N + K) * 4 && w->quant_ws_bytes >= (1 + N + M) * 4);
    }
    /* SwiGLU backwards that write their gradients as fp8_block operands (dw_compile_swiglu_bwd_quant):
     * each input made by a dense layer whose dgrad and wgrad run in fp8_block, on CUDA, whole
     * 128-row and 128-column blocks; their four scale arrays in a region of their own */
    int64_t glu = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        int L[2];
        if (!dw_compile_swiglu_bwd_quant(c, i, N, L)) continue;
        const int64_t F = width(g, g->nodes[i].out[0]);
        assert_true(g->nodes[i].op == DW_OP_SWIGLU && c->target.device == DW_DEVICE_CUDA && N % 128 == 0 && F % 128 == 0);
        for (int k = 0; k < 2; k++) {
            const dw_node_binding *b = &c->node[L[k]].bind;
            assert_int_equal(g->tensors[g->nodes[i].in[k]].producer, L[k]);
            assert_int_equal(g->nodes[L[k]].op, DW_OP_LINEAR);
            assert_int_equal(dw_compile_quant_act_recipe(b->recipe), DW_RECIPE_FP8_BLOCK);
            assert_true(b->quantised[DW_QPASS_DGRAD] && b->quantised[DW_QPASS_WGRAD]);
        }
        if (4 * (N / 128) * F * 4 > glu) glu = 4 * (N / 128) * F * 4;
    }
    if (glu) {
        assert_true(w->glu_scales_bytes >= glu);
        REGION(w->glu_scales, w->glu_scales_bytes);
    } else {
        assert_true(w->glu_scales < 0 && w->glu_scales_bytes == 0);
    }
    if (w->glu_rows >= 0) REGION(w->glu_rows, w->glu_rows_bytes); /* MoE only: tests/unit/test_moe_fp8_engine.c */
    else assert_int_equal(w->glu_rows_bytes, 0);
    if (any) {
        REGION(w->q_rows.off, w->q_rows.bytes), REGION(w->q_dyt.off, w->q_dyt.bytes);
        REGION(w->q_xt.off, w->q_xt.bytes), REGION(w->quant_ws, w->quant_ws_bytes);
    } else {
        assert_true(w->q_rows.off < 0 && w->q_dyt.off < 0 && w->q_xt.off < 0 && w->quant_ws < 0);
    }
#undef REGION
    for (int a = 0; a < nr; a++) {
        assert_true(lo[a] >= 0 && lo[a] % 256 == 0 && hi[a] <= w->bytes);
        for (int b = a + 1; b < nr; b++)
            if (lo[a] < hi[b] && lo[b] < hi[a]) fail_msg("workspace regions %d and %d overlap", a, b);
    }
    assert_int_equal(c->pool_bytes[DW_POOL_WORK], w->bytes);
}

static void check(const dw_graph *g, const dw_compiled *c) {
    assert_true(c->g == g);
    check_steps(g, c);
    check_arena(g, c);
    check_liveness(g, c);
    check_grad_modes(g, c);
    check_grad_alias(g, c);
    check_params_and_pools(g, c);
    check_bind(g, c);
    check_workspace(g, c);
}

static void test_random_graphs(void **state) {
    (void)state;
    const char *presets[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};
    /* FP32, BF16 and every quantised recipe (with and without the safe fallbacks) */
    const char *prec[] = {"bf16", "fp8_tensor", "fp8_row", "fp8_block", "fp8_block2d", "mxfp8", "mxfp8_e5m2",
                          "mxfp4", "nvfp4"};
    const int sms[] = {90, 100};
    for (int trial = 0; trial < 24; trial++) {
        dw_graph *g = random_graph(presets[trial % 3]);
        dw_policy *p = NULL;
        const char *pname = trial % 3 ? prec[rnd(0, 8)] : NULL;
        if (pname) assert_int_equal(dw_policy_from_precision(g_ctx, pname, rnd(0, 1), &p), DW_OK);
        /* the same graph and policy for the CPU (the context's device) and a CUDA GPU */
        dw_compiled *cpu = compile_for(g, p, rnd(0, 1) ? DW_DEVICE_AUTO : DW_DEVICE_CPU, 0);
        dw_compiled *gpu = compile_for(g, p, DW_DEVICE_CUDA, sms[rnd(0, 1)]);
        for (int k = 0; k < 2; k++) {
            const dw_compiled *c = k ? gpu : cpu;
            assert_int_equal(c->bf16, p != NULL);
            assert_string_equal(c->precision, pname ? pname : "fp32");
            check(g, c);
        }
        g_recompute = DW_RECOMPUTE_FULL; /* the same graph with every block recomputed */
        dw_compiled *rc = compile_for(g, p, trial % 2 ? DW_DEVICE_CPU : DW_DEVICE_CUDA, 90);
        g_recompute = DW_RECOMPUTE_NONE;
        assert_int_equal(rc->recompute, DW_RECOMPUTE_FULL);
        assert_true(rc->n_times > 2 * g->n_nodes);
        check(g, rc);
        assert_true(rc->pool_bytes[DW_POOL_ACT] <= cpu->pool_bytes[DW_POOL_ACT]);
        dw_compiled_free(rc);
        /* one program for both: the same layout; only kernel choices (and so BF16 copies) differ */
        for (int q = 0; q < DW_POOL_COUNT; q++) assert_int_equal(cpu->pool_bytes[q], gpu->pool_bytes[q]);
        assert_int_equal(cpu->phase[DW_PHASE_BACKWARD][1], gpu->phase[DW_PHASE_BACKWARD][1]);
        for (int k = 0; k < cpu->phase[DW_PHASE_BACKWARD][1]; k++)
            assert_true(cpu->steps[k].kind == gpu->steps[k].kind && cpu->steps[k].node == gpu->steps[k].node);
        assert_memory_equal(cpu->param_off, gpu->param_off, (size_t)cpu->n_params * sizeof *cpu->param_off);
        dw_compiled_free(cpu);
        dw_compiled_free(gpu);
        dw_policy_free(p);
        dw_graph_free(g);
    }
}

/* A tensor read by ops that cannot add into its gradient (testutil's shared graph): ACCUM_TMP with
 * ACC temporaries, in every mode and for both targets. */
static void test_shared_reads(void **state) {
    (void)state;
    int ng = -1, ns = -1;
    dw_graph *g = dw_test_shared_graph(g_ctx, rnd(1, 4), rnd(1, 32), &g_rng, &ng, &ns);
    assert_non_null(g);
    const char *prec[3] = {NULL, "bf16", "mxfp8"};
    for (int k = 0; k < 6; k++) {
        dw_policy *p = NULL;
        if (prec[k % 3]) assert_int_equal(dw_policy_from_precision(g_ctx, prec[k % 3], false, &p), DW_OK);
        dw_compiled *c = k < 3 ? compile_for(g, p, DW_DEVICE_AUTO, 0) : compile_for(g, p, DW_DEVICE_CUDA, 90);
        check(g, c);
        assert_int_equal(c->node[ng].grad_mode[0], DW_GRAD_ACCUM_TMP);
        assert_int_equal(c->node[ns].grad_mode[0], DW_GRAD_ACCUM_TMP);
        assert_int_equal(c->node[ns].grad_mode[1], DW_GRAD_ACCUM_TMP);
        assert_true(c->node[ns].tmp_off[DW_TMP_ACC0] >= 0 && c->node[ns].tmp_off[(DW_TMP_ACC0 + 1)] >= 0);
        assert_true(c->node[ns].tmp_off[DW_TMP_ACC0] != c->node[ns].tmp_off[(DW_TMP_ACC0 + 1)]);
        assert_int_equal(c->node[ns + 1].grad_mode[0], DW_GRAD_WRITE);
        dw_compiled_free(c);
        dw_policy_free(p);
    }
    dw_graph_free(g);
}

static void test_presets_reuse(void **state) { /* the arena is far below the sum of all buffers */
    (void)state;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(g_ctx, "llama-tiny", 2, 128, &g), DW_OK);
    dw_compiled *c = NULL;
    assert_int_equal(dw_compile(g_ctx, g, NULL, NULL, NULL, &c), DW_OK); /* opts NULL: the context's device */
    assert_int_equal(c->target.device, DW_DEVICE_CPU);
    check(g, c);
    int64_t sum = 0;
    for (int i = 0; i < c->n_items; i++) sum += c->items[i].size;
    assert_true(c->arena_bytes < sum / 2);
    dw_compiled_free(c);
    dw_graph_free(g);
}

/* GELU fusion on GPT-2 shapes: every GELU of a BF16 model fused both ways (widths % 8 == 0), with
 * its linear neighbours recorded; the plan stays valid and no larger; fuse off (the option, whose
 * default DW_FUSE=0 turns off) and the FP32 mode fuse nothing; a quantised c_proj keeps the GELU's
 * backward (no quantised DGELU epilogue), unless a policy rule keeps its dgrad BF16. */
static void test_gelu_fusion(void **state) {
    (void)state;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(g_ctx, "gpt2-tiny", 2, rnd(8, 64), &g), DW_OK);
    dw_policy *p = NULL;
    assert_int_equal(dw_policy_from_precision(g_ctx, "bf16", false, &p), DW_OK);
    dw_compiled *c = compile_fused(g, p, DW_DEVICE_CUDA, 90, 1), *fp32 = compile_fused(g, NULL, DW_DEVICE_CUDA, 90, 1);
    dw_compiled *off = compile_fused(g, p, DW_DEVICE_CUDA, 90, 0);
    /* the option's default: on, unless the environment says DW_FUSE=0 */
    const char *env = getenv("DW_FUSE");
    char *saved = env ? strdup(env) : NULL;
    dw_compile_opts o;
    setenv("DW_FUSE", "0", 1);
    dw_compile_opts_init(&o, sizeof o);
    assert_false(o.fuse);
    unsetenv("DW_FUSE");
    dw_compile_opts_init(&o, sizeof o);
    assert_true(o.fuse);
    if (saved) setenv("DW_FUSE", saved, 1);
    free(saved);
    int gelus = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        assert_int_equal(off->node[i].fused, 0);
        assert_int_equal(fp32->node[i].fused, 0);
        if (n->op != DW_OP_GELU) {
            assert_int_equal(c->node[i].fused, 0);
            continue;
        }
        gelus++;
        assert_int_equal(c->node[i].fused, DW_FUSED_FWD | DW_FUSED_BWD);
        int L = c->node[i].partner_fwd, P = c->node[i].partner_bwd;
        assert_true(strstr(g->nodes[L].name, "c_fc") && strstr(g->nodes[P].name, "c_proj"));
        assert_int_equal(dw_compile_fused_gelu_fwd(c, L), i);
        assert_int_equal(dw_compile_fused_gelu_bwd(c, P), i);
        assert_int_equal(dw_compile_fused_gelu_fwd(c, P), -1);
        assert_int_equal(dw_compile_fused_gelu_bwd(c, L), -1);
        assert_int_not_equal(off->tensor[n->out[0]].grad_off, -1);
    }
    assert_int_equal(gelus, g->model.n_blocks);
    check(g, c);
    check(g, off);
    check(g, fp32);
    assert_true(c->arena_bytes <= off->arena_bytes);
    /* fused GELUs have neither step */
    assert_int_equal(off->n_steps - c->n_steps, 2 * gelus);
    dw_compiled_free(c), dw_compiled_free(off), dw_compiled_free(fp32);
    dw_policy_free(p);
    /* fp8_block with the safe fallback: every GELU's forward moves to its producing linear (the
     * backends run it in a quantised GEMM's epilogue when a kernel has one, else right after it);
     * its backward only into a BF16 consumer's dgrad */
    assert_int_equal(dw_policy_from_precision(g_ctx, "fp8_block", true, &p), DW_OK);
    for (int k = 0; k < 2; k++) {
        c = k ? compile_fused(g, p, DW_DEVICE_CUDA, 90, 1) : compile_fused(g, p, DW_DEVICE_AUTO, 0, 1);
        int quantised = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            if (g->nodes[i].op != DW_OP_GELU) continue;
            assert_true(c->node[i].fused & DW_FUSED_FWD);
            int P = -1;
            for (int j = 0; j < g->n_nodes; j++)
                if (g->nodes[j].op == DW_OP_LINEAR && g->nodes[j].in[0] == g->nodes[i].out[0]) P = j;
            assert_true(P >= 0);
            bool bf16 = c->node[P].bind.recipe == DW_RECIPE_BF16;
            quantised += !bf16;
            assert_int_equal((c->node[i].fused & DW_FUSED_BWD) != 0, bf16);
        }
        assert_true(quantised > 0);
        check(g, c);
        dw_compiled_free(c);
    }
    dw_policy_free(p);
    /* a rule keeping the quantised c_proj's dgrad BF16 (its fprop and wgrad quantised): every
     * GELU's backward goes into that dgrad's DGELU epilogue, on both targets and at any rows */
    static const char rule[] = "{\"default\": \"fp8_block\", \"rules\": [{\"match\": \"*.mlp.c_proj\", "
                               "\"op\": \"linear\", \"recipe\": \"fp8_block\", \"bf16_passes\": [\"dgrad\"]}]}";
    assert_int_equal(dw_test_policy(g_ctx, rule, false, &p), DW_OK);
    for (int k = 0; k < 2; k++) {
        c = k ? compile_fused(g, p, DW_DEVICE_CUDA, 90, 1) : compile_fused(g, p, DW_DEVICE_AUTO, 0, 1);
        int fused = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            if (g->nodes[i].op != DW_OP_GELU) continue;
            assert_int_equal(c->node[i].fused, DW_FUSED_FWD | DW_FUSED_BWD);
            const int P = c->node[i].partner_bwd;
            assert_true(strstr(g->nodes[P].name, "c_proj") != NULL);
            assert_int_equal(c->node[P].bind.recipe, DW_RECIPE_FP8_BLOCK);
            assert_false(dw_compile_linear_quantised(c, P, DW_QPASS_DGRAD, 1, NULL, NULL, 0));
            assert_false(dw_compile_linear_quantised(c, P, DW_QPASS_DGRAD, dw_graph_batch(g) * dw_graph_seq(g), NULL,
                                                     NULL, 0));
            fused++;
        }
        assert_int_equal(fused, g->model.n_blocks);
        check(g, c);
        dw_compiled_free(c);
    }
    dw_policy_free(p);
    dw_graph_free(g);
}

static int node_named(const dw_graph *g, const char *name) {
    for (int i = 0; i < g->n_nodes; i++)
        if (!strcmp(g->nodes[i].name, name)) return i;
    fail_msg("no node %s", name);
    return -1;
}

static void test_policy_binding(void **state) {
    (void)state;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(g_ctx, "gpt2-tiny", 1, 16, &g), DW_OK);
    dw_policy *p = NULL;
    assert_int_equal(dw_policy_from_precision(g_ctx, "fp8_block", true, &p), DW_OK);
    const int lm = node_named(g, "lm_head"), mid = node_named(g, "transformer.h.1.mlp.c_fc");
    for (int k = 0; k < 2; k++) {
        dw_compiled *c = k ? compile_for(g, p, DW_DEVICE_CUDA, 90) : compile_for(g, p, DW_DEVICE_AUTO, 0);
        assert_string_equal(c->precision, "fp8_block");
        assert_int_equal(c->node[lm].bind.recipe, DW_RECIPE_BF16);
        assert_int_equal(c->node[lm].bind.reason, DW_POLICY_BY_SAFE);
        assert_int_equal(c->node[mid].bind.recipe, DW_RECIPE_FP8_BLOCK);
        assert_int_equal(c->node[mid].bind.reason, DW_POLICY_BY_DEFAULT);
        assert_non_null(c->node[mid].bind.note);
        if (k) { /* sm_90 at 16 tokens: wgrad's K (the tokens) is no multiple of 128: BF16, noted */
            assert_false(c->node[mid].bind.quantised[DW_QPASS_WGRAD]);
            assert_non_null(strstr(c->node[mid].bind.note, "BF16 FALLBACK"));
        } else { /* the CPU reference quantises every pass */
            for (int q = 0; q < DW_QPASS_COUNT; q++) assert_true(c->node[mid].bind.quantised[q]);
            assert_null(strstr(c->node[mid].bind.note, "BF16 FALLBACK"));
        }
        assert_true(c->work.q_rows.off >= 0 && c->node[mid].wq[0].off >= 0);
        check(g, c);
        dw_compiled_free(c);
    }
    /* fp8_block2d names the same pairing: W in 128x128 blocks, x and dy in 1x128 */
    dw_policy *p2 = NULL;
    assert_int_equal(dw_policy_from_precision(g_ctx, "fp8_block2d", true, &p2), DW_OK);
    dw_compiled *c = compile_for(g, p2, DW_DEVICE_CUDA, 90);
    assert_int_equal(c->node[mid].bind.recipe, DW_RECIPE_FP8_BLOCK2D);
    assert_int_equal(dw_compile_quant_act_recipe(DW_RECIPE_FP8_BLOCK2D), DW_RECIPE_FP8_BLOCK);
    assert_int_equal(dw_compile_quant_weight_recipe(DW_RECIPE_FP8_BLOCK), DW_RECIPE_FP8_BLOCK2D);
    assert_int_equal(dw_compile_quant_weight_recipe(DW_RECIPE_FP8_BLOCK2D), DW_RECIPE_FP8_BLOCK2D);
    assert_int_equal(dw_compile_quant_act_recipe(DW_RECIPE_MXFP8), DW_RECIPE_MXFP8);
    assert_int_equal(dw_compile_quant_weight_recipe(DW_RECIPE_MXFP8), DW_RECIPE_MXFP8);
    assert_false(dw_compile_quant_recipe(DW_RECIPE_BF16));
    assert_true(dw_compile_quant_recipe(DW_RECIPE_NVFP4));
    check(g, c);
    dw_compiled_free(c);
    dw_policy_free(p2);
    /* plans: a one-GPU plan that fits the graph compiles to the same program as none; a larger
     * micro-batch, a multi-rank plan and a one-GPU plan with recompute are refused */
    dw_plan *plan = NULL;
    assert_int_equal(dw_plan_single(g_ctx, g->batch, g->seq, &plan), DW_OK);
    c = NULL;
    assert_int_equal(dw_compile(g_ctx, g, plan, p, NULL, &c), DW_OK);
    dw_compiled *c0 = NULL;
    assert_int_equal(dw_compile(g_ctx, g, NULL, p, NULL, &c0), DW_OK);
    assert_int_equal(c->n_steps, c0->n_steps);
    for (int k = 0; k < DW_POOL_COUNT; k++) assert_int_equal(c->pool_bytes[k], c0->pool_bytes[k]);
    dw_compiled_free(c0);
    dw_compiled_free(c);
    dw_plan_free(plan);
    assert_int_equal(dw_plan_single(g_ctx, g->batch + 1, g->seq, &plan), DW_OK);
    c = (dw_compiled *)g;
    assert_int_equal(dw_compile(g_ctx, g, plan, p, NULL, &c), DW_ERR_INVALID);
    assert_null(c);
    assert_non_null(strstr(dw_errmsg(g_ctx), "capture at the plan's micro-batch"));
    dw_plan_free(plan);
    dw_hw *hw = NULL;
    assert_int_equal(dw_hw_preset(g_ctx, "h100-sxm", 1, &hw), DW_OK);
    dw_plan_job j;
    dw_plan_job_init(&j, sizeof j);
    j.seq = g->seq, j.global_batch = 8;
    const char *dp2 = "{\"parallel\": {\"dp\": 2, \"tp\": 1, \"pp\": 1, \"ep\": 1, \"cp\": 1}, \"micro_batch\": 1}";
    assert_int_equal(dw_plan_from_json(g_ctx, dp2, strlen(dp2), "dp2", "gpt2-tiny", hw, &j, &plan), DW_OK);
    c = (dw_compiled *)g;
    assert_int_equal(dw_compile(g_ctx, g, plan, p, NULL, &c), DW_ERR_UNSUPPORTED);
    assert_null(c);
    assert_non_null(strstr(dw_errmsg(g_ctx), "spans 2 GPUs"));
    dw_plan_free(plan);
    const char *rc = "{\"parallel\": {\"dp\": 1, \"tp\": 1, \"pp\": 1, \"ep\": 1, \"cp\": 1}, \"micro_batch\": 1, "
                     "\"recompute\": \"full\"}";
    assert_int_equal(dw_plan_from_json(g_ctx, rc, strlen(rc), "rc", "gpt2-tiny", hw, &j, &plan), DW_OK);
    assert_int_equal(dw_compile(g_ctx, g, plan, p, NULL, &c), DW_OK); /* the plan's recompute is taken */
    assert_int_equal(c->recompute, DW_RECOMPUTE_FULL);
    int again = 0;
    for (int s = c->phase[DW_PHASE_BACKWARD][0]; s < c->phase[DW_PHASE_BACKWARD][1]; s++)
        again += c->steps[s].kind == DW_STEP_FWD;
    assert_true(again > 0);
    dw_compiled_free(c);
    dw_plan_free(plan);
    dw_hw_free(hw);
    /* refusals: a target that is no device, a GPU that is none */
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    assert_int_equal(o.device, DW_DEVICE_AUTO);
    assert_int_equal(o.sm, 0);
    o.device = (dw_device_kind)7;
    c = (dw_compiled *)g;
    assert_int_equal(dw_compile(g_ctx, g, NULL, p, &o, &c), DW_ERR_INVALID);
    assert_null(c);
    o.device = DW_DEVICE_CUDA;
    o.sm = 7;
    assert_int_equal(dw_compile(g_ctx, g, NULL, p, &o, &c), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(g_ctx), "compute capability"));
    assert_int_equal(dw_compile(g_ctx, NULL, NULL, p, NULL, &c), DW_ERR_INVALID);
    /* options from an older header (only `size`): the fields beyond it take their defaults */
    o.size = offsetof(dw_compile_opts, device);
    c = NULL;
    assert_int_equal(dw_compile(g_ctx, g, NULL, p, &o, &c), DW_OK);
    assert_int_equal(c->target.device, DW_DEVICE_CPU);
    dw_compiled_free(c);
    /* a CUDA target without sm on a CPU context: sm_90 */
    dw_compile_opts_init(&o, sizeof o);
    o.device = DW_DEVICE_CUDA;
    assert_int_equal(dw_compile(g_ctx, g, NULL, p, &o, &c), DW_OK);
    assert_int_equal(c->target.sm, 90);
    dw_compiled_free(c);
    dw_compiled_free(NULL);
    dw_policy_free(p);
    dw_graph_free(g);
}

/* Per-linear decisions on shapes where sm_90's quantised kernels apply (widths and token counts
 * multiples of 128) and where they do not, for several recipes; and a kernel registered by a user
 * is what the program names (the compiler asks the registry). */
static dw_graph *llama_graph(int64_t d, int64_t f, int64_t B, int64_t T) {
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(g_ctx, "llama-tiny", &cfg), DW_OK);
    cfg.n_layers = 2, cfg.d_model = d, cfg.d_ff = f, cfg.vocab_size = 256, cfg.max_seq = 256;
    cfg.n_heads = 2, cfg.n_kv_heads = 1, cfg.head_dim = 64;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(g_ctx, &cfg, B, T, &g), DW_OK);
    return g;
}

static bool any_run(const dw_gemm_args *a, void *user, const char **why) {
    (void)a, (void)user, (void)why;
    return true;
}
static dw_status no_run(dw_ctx *ctx, const dw_gemm_args *a, void *user) {
    (void)ctx, (void)a, (void)user;
    return DW_ERR_UNSUPPORTED;
}

static void test_linear_decisions(void **state) {
    (void)state;
    const char *prec[] = {"fp8_block", "mxfp8", "nvfp4", "fp8_tensor"};
    int quantised = 0, fallback = 0;
    for (int trial = 0; trial < 6; trial++) {
        const bool aligned = trial % 2 == 0;
        const int64_t d = aligned ? 128 * rnd(1, 2) : 96, f = aligned ? 128 * rnd(1, 3) : 200;
        const int64_t B = rnd(1, 2), T = aligned ? 128 : rnd(4, 40);
        dw_graph *g = llama_graph(d, f, B, T);
        dw_policy *p = NULL;
        const char *pn = aligned ? prec[rnd(0, 3)] : "fp8_block"; /* fp8_block needs multiples of 128 */
        assert_int_equal(dw_policy_from_precision(g_ctx, pn, false, &p), DW_OK);
        dw_compiled *c = compile_for(g, p, DW_DEVICE_CUDA, 90);
        check(g, c);
        int qq[3] = {0};
        for (int i = 0; i < g->n_nodes; i++)
            for (int q = 0; q < DW_QPASS_COUNT && g->nodes[i].op == DW_OP_LINEAR; q++)
                qq[q] += c->node[i].bind.quantised[q];
        print_message("%s d %lld f %lld N %lld: quantised fprop %d dgrad %d wgrad %d\n", pn, (long long)d,
                      (long long)f, (long long)(B * T), qq[0], qq[1], qq[2]);
        for (int i = 0; i < g->n_nodes; i++)
            for (int q = 0; q < DW_QPASS_COUNT && g->nodes[i].op == DW_OP_LINEAR; q++) {
                quantised += c->node[i].bind.quantised[q];
                fallback += !c->node[i].bind.quantised[q];
                /* at other row counts the answer exists too (a quantised pass names its kernel);
                 * at the planned rows it is the binding's */
                const char *k = NULL;
                const int64_t rows = 1 + rnd(0, B * T - 1);
                const bool at = dw_compile_linear_quantised(c, i, (dw_qpass)q, rows, &k, NULL, 0);
                if (at) assert_non_null(k);
                if (rows < B * T) assert_int_equal(at, k != NULL);
                else assert_int_equal(at, c->node[i].bind.quantised[q]);
            }
        dw_compiled_free(c);
        dw_policy_free(p);
        dw_graph_free(g);
    }
    assert_true(quantised > 0 && fallback > 0);
    /* the SwiGLU's backward writes the gate and up layers' fp8_block dy (check_workspace checks its
     * conditions): for each of llama's SwiGLUs on CUDA at 128 tokens; not at 64 tokens (dy^T's blocks
     * are 128 tokens), not for the CPU target, not under mxfp8. And the norms' forward fusion. */
    for (int k = 0; k < 4; k++) {
        dw_graph *gg = llama_graph(128, 128 * rnd(1, 3), 1, k == 1 ? 64 : 128);
        dw_policy *pp = NULL;
        assert_int_equal(dw_policy_from_precision(g_ctx, k == 3 ? "mxfp8" : "fp8_block", false, &pp), DW_OK);
        dw_compiled *cc = compile_for(gg, pp, k == 2 ? DW_DEVICE_AUTO : DW_DEVICE_CUDA, k == 2 ? 0 : 90);
        check(gg, cc);
        int swiglus = 0, fused = 0, L[2];
        for (int i = 0; i < gg->n_nodes; i++) {
            swiglus += gg->nodes[i].op == DW_OP_SWIGLU;
            fused += dw_compile_swiglu_bwd_quant(cc, i, gg->batch * gg->seq, L);
        }
        assert_int_equal(swiglus, 2);
        assert_int_equal(fused, k == 0 ? 2 : 0);
        /* each block's two RMSNorms write the rows of q, k, v and of gate, up (any token count);
         * not the final norm (the BF16 LM head reads it), not for the CPU target, not under mxfp8 */
        int norms = 0, writing = 0;
        for (int i = 0; i < gg->n_nodes; i++) {
            norms += gg->nodes[i].op == DW_OP_RMSNORM;
            const int q = dw_compile_norm_quant_reader(cc, i, gg->batch * gg->seq);
            if (q < 0) continue;
            writing++;
            assert_int_equal(gg->nodes[q].op, DW_OP_LINEAR);
            assert_int_equal(gg->nodes[q].in[0], gg->nodes[i].out[0]);
            for (int j = 0; j < q; j++) /* the first reader */
                for (int s = 0; s < gg->nodes[j].n_in; s++) assert_true(gg->nodes[j].in[s] != gg->nodes[i].out[0]);
            assert_int_equal(dw_compile_quant_act_recipe(cc->node[q].bind.recipe), DW_RECIPE_FP8_BLOCK);
        }
        assert_int_equal(norms, 5);
        assert_int_equal(writing, k >= 2 ? 0 : 4);
        dw_compiled_free(cc);
        dw_policy_free(pp);
        dw_graph_free(gg);
    }
    /* a user kernel for sm_90 that takes everything, at the highest priority: every pass of every
     * quantised layer names it; gone again once unregistered */
    dw_kernel_desc kd = {.name = "test_compile_any_sm90", .op = DW_KOP_GEMM, .recipe_a = -1, .recipe_b = -1,
                         .device = DW_DEVICE_CUDA, .sm_min = 90, .sm_max = 90, .priority = 1 << 20,
                         .eligible = any_run, .run = no_run};
    assert_int_equal(dw_kernel_register(&kd), DW_OK);
    dw_graph *g = llama_graph(96, 200, 1, rnd(4, 40));
    dw_policy *p = NULL;
    assert_int_equal(dw_policy_from_precision(g_ctx, "mxfp8", false, &p), DW_OK);
    assert_int_equal(dw_policy_set_fallback(g_ctx, p, "none"), DW_OK); /* the LM head quantised too */
    dw_compiled *c = compile_for(g, p, DW_DEVICE_CUDA, 90);
    dw_compiled *other = compile_for(g, p, DW_DEVICE_CUDA, 100); /* not its arch */
    const bool removed = dw_kernel_unregister("test_compile_any_sm90");
    int named = 0;
    for (int i = 0; i < g->n_nodes; i++)
        for (int q = 0; q < DW_QPASS_COUNT && g->nodes[i].op == DW_OP_LINEAR; q++) {
            assert_true(c->node[i].bind.quantised[q]);
            assert_string_equal(c->node[i].bind.kernel[q], "test_compile_any_sm90");
            const char *k = other->node[i].bind.kernel[q];
            assert_true(!k || strcmp(k, "test_compile_any_sm90"));
            named++;
        }
    assert_true(removed && named > 0);
    dw_compiled_free(c);
    dw_compiled_free(other);
    c = compile_for(g, p, DW_DEVICE_CUDA, 90);
    for (int i = 0; i < g->n_nodes; i++)
        for (int q = 0; q < DW_QPASS_COUNT && g->nodes[i].op == DW_OP_LINEAR; q++)
            assert_true(!c->node[i].bind.kernel[q] || strcmp(c->node[i].bind.kernel[q], "test_compile_any_sm90"));
    check(g, c);
    dw_compiled_free(c);
    dw_policy_free(p);
    dw_graph_free(g);
}

/* Engines for either target's program: the CPU engine runs a program compiled for CUDA (its exact
 * oracle) as well as its own; a missing program is refused; a CUDA engine (where a GPU is usable)
 * refuses a program compiled for the CPU or for another compute capability. */
static void test_engine_targets(void **state) {
    (void)state;
    dw_graph *g = random_graph("llama-tiny");
    dw_policy *p = NULL;
    assert_int_equal(dw_policy_from_precision(g_ctx, "fp8_block", false, &p), DW_OK);
    dw_compiled *cpu = compile_for(g, p, DW_DEVICE_AUTO, 0), *gpu = compile_for(g, p, DW_DEVICE_CUDA, 90);
    for (int k = 0; k < 2; k++) {
        dw_engine *e = NULL;
        assert_int_equal(dw_engine_create(g_ctx, k ? gpu : cpu, NULL, &e), DW_OK);
        assert_string_equal(dw_engine_backend(e), "cpu");
        assert_true(dw_engine_program(e) == (k ? gpu : cpu));
        assert_true(dw_engine_graph(e) == g);
        dw_engine_free(e);
    }
    dw_engine *e = (dw_engine *)g;
    assert_int_equal(dw_engine_create(g_ctx, NULL, NULL, &e), DW_ERR_INVALID);
    assert_null(e);
    dw_engine_free(NULL);
    dw_ctx *cuda = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CUDA};
    if (dw_ctx_create(&co, &cuda) == DW_OK) {
        e = (dw_engine *)g;
        assert_int_equal(dw_engine_create(cuda, cpu, NULL, &e), DW_ERR_UNSUPPORTED);
        assert_null(e);
        const int sm = dw_gemm_ctx_sm(cuda) == 90 ? 100 : 90; /* another GPU's program */
        dw_compiled *wrong = compile_for(g, p, DW_DEVICE_CUDA, sm);
        char want[16];
        snprintf(want, sizeof want, "sm_%d", sm);
        assert_int_equal(dw_engine_create(cuda, wrong, NULL, &e), DW_ERR_UNSUPPORTED);
        assert_non_null(strstr(dw_errmsg(cuda), want));
        dw_compiled_free(wrong);
        dw_ctx_free(cuda);
    } else {
        assert_null(cuda);
    }
    dw_compiled_free(cpu);
    dw_compiled_free(gpu);
    dw_policy_free(p);
    dw_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_graphs),
        cmocka_unit_test(test_shared_reads),
        cmocka_unit_test(test_presets_reuse),
        cmocka_unit_test(test_gelu_fusion),
        cmocka_unit_test(test_policy_binding),
        cmocka_unit_test(test_linear_decisions),
        cmocka_unit_test(test_engine_targets),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
