/* test_compile.c — dw_compile on real captured graphs (random gpt2/llama/qwen2 shapes and
 * batches, FP32 and BF16 modes): arena buffers live at the same time never overlap; every buffer a
 * step reads or writes is live at that step (an oracle restating which values, gradients and
 * saved statistics each op's forward and backward touch); gradient delivery (exactly one writer,
 * the first in backward order); parameter pools (disjoint, decay first) and pool totals; policy
 * binding (rules, safe fallback, unsupported recipes); refusals; the engine functions' backend
 * dispatch without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/compile.h"
#include "precision/policy.h"
#include "runtime/engine.h"
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

/* The item of (kind, index), or -1. */
static int find_item(const dw_compiled *c, dw_buf_kind k, int index) {
    for (int i = 0; i < c->n_items; i++)
        if (c->info[i].kind == k && c->info[i].index == index) return i;
    return -1;
}

/* A value/gradient/aux buffer must exist and be live at step s. */
static void live_at(const dw_compiled *c, dw_buf_kind k, int index, int s, const char *why) {
    if (k == DW_BUF_GRAD) /* a gradient shared through a residual add lives in its root's buffer */
        while (c->grad_alias[index] != index) index = c->grad_alias[index];
    int it = find_item(c, k, index);
    if (it < 0) fail_msg("%s: no buffer (kind %d, index %d)", why, (int)k, index);
    if (c->items[it].first > s || c->items[it].last < s)
        fail_msg("%s: buffer (kind %d, index %d) live [%d, %d], needed at step %d", why, (int)k, index,
                 c->items[it].first, c->items[it].last, s);
}

static bool reads_inputs_bwd(dw_op op) { /* restated from the op rules (engine_ops.c) */
    switch (op) {
    case DW_OP_LAYERNORM: case DW_OP_RMSNORM: case DW_OP_LINEAR: case DW_OP_GELU: case DW_OP_SILU:
    case DW_OP_SWIGLU: case DW_OP_ATTENTION: return true;
    default: return false;
    }
}

static void check(const dw_graph *g, const dw_compiled *c) {
    /* 1. no overlap among co-live buffers, alignment, inside the arena */
    int64_t sum = 0;
    for (int i = 0; i < c->n_items; i++) {
        const dw_mem_item *a = &c->items[i];
        sum += (a->size + 255) / 256 * 256; /* each buffer starts 256-byte aligned */
        assert_int_equal(a->offset % 256, 0);
        assert_true(a->offset >= 0 && a->offset + a->size <= c->arena_bytes);
        for (int j = i + 1; j < c->n_items; j++) {
            const dw_mem_item *b = &c->items[j];
            bool together = !(a->last < b->first || b->last < a->first);
            bool overlap = a->offset < b->offset + b->size && b->offset < a->offset + a->size;
            if (together && overlap) fail_msg("arena buffers %d and %d are live together and overlap", i, j);
        }
    }
    assert_true(c->arena_bytes >= c->live_peak && c->live_peak > 0 && c->arena_bytes <= sum);
    /* 2. every access is to a live buffer (a fused GELU's accesses happen in its linear
     * neighbours' steps: its output written by the producer's fprop, its input gradient written
     * by the consumer's dgrad, which reads its input and no longer touches its output gradient) */
    char why[256];
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const dw_ir_node *n = &g->nodes[ni];
        int f = ni, b = c->n_steps - 1 - ni;
        const uint8_t fz = c->fused ? c->fused[ni] : 0;
        snprintf(why, sizeof why, "node %s forward", n->name);
        for (int s = 0; s < n->n_in; s++)
            if (g->tensors[n->in[s]].kind == DW_TENSOR_ACT) live_at(c, DW_BUF_VALUE, n->in[s], f, why);
        if (n->out != g->loss) live_at(c, DW_BUF_VALUE, n->out, f, why);
        if (fz & DW_FUSED_FWD) {
            int L = c->gelu_producer[ni];
            assert_true(L >= 0 && g->nodes[L].op == DW_OP_LINEAR && g->nodes[L].out == n->in[0]);
            snprintf(why, sizeof why, "GELU %s computed in %s's forward", n->name, g->nodes[L].name);
            live_at(c, DW_BUF_VALUE, n->out, L, why);
            live_at(c, DW_BUF_VALUE, n->in[0], L, why);
        }
        if (fz & DW_FUSED_BWD) {
            int P = c->gelu_consumer[ni], bp = c->n_steps - 1 - P;
            assert_true(P > ni && g->nodes[P].op == DW_OP_LINEAR && g->nodes[P].in[0] == n->out);
            assert_int_equal(c->grad_off[n->out], -1); /* never materialised */
            snprintf(why, sizeof why, "GELU %s backward in %s's dgrad", n->name, g->nodes[P].name);
            live_at(c, DW_BUF_VALUE, n->in[0], bp, why);
            live_at(c, DW_BUF_GRAD, n->in[0], bp, why);
            live_at(c, DW_BUF_GRAD, n->in[0], b, why); /* and until the producer's backward reads it */
            continue; /* G's own backward does nothing */
        }
        snprintf(why, sizeof why, "node %s backward", n->name);
        if (n->op == DW_OP_CROSS_ENTROPY) { /* fused: dlogits written in place in the forward step */
            assert_int_equal(c->grad_off[n->in[0]], c->val_off[n->in[0]]);
            continue;
        }
        if (n->out == g->logits) live_at(c, DW_BUF_VALUE, n->out, b, "dlogits (in place) read by the LM head");
        else live_at(c, DW_BUF_GRAD, n->out, b, why);
        if (n->op == DW_OP_ATTENTION) live_at(c, DW_BUF_VALUE, n->out, b, why);
        for (int s = 0; s < n->n_in; s++) {
            int t = n->in[s];
            if (g->tensors[t].kind != DW_TENSOR_ACT) continue;
            if (reads_inputs_bwd(n->op)) live_at(c, DW_BUF_VALUE, t, b, why);
            int pg = g->tensors[t].producer; /* a linear after a backward-fused GELU: checked above */
            if (!(s == 0 && g->nodes[pg].op == DW_OP_GELU && c->fused && (c->fused[pg] & DW_FUSED_BWD)))
                live_at(c, DW_BUF_GRAD, t, b, why);
            if (c->grad_mode[ni][s] == DW_GRAD_ACCUM) { /* a scratch to add from, or the GEMM adds (beta 1) */
                bool in_gemm = dw_compile_dgrad_accumulates(c, ni); /* quantised or BF16 GEMM alike */
                bool fused = c->fused && dw_compile_fused_gelu_bwd(c, ni) >= 0;
                assert_true(in_gemm == (s == 0 && n->op == DW_OP_LINEAR && c->bf16 && !fused));
                if (in_gemm) assert_int_equal(c->tmp_off[ni][DW_TMP_ACC0 + s], -1);
                else assert_true(c->tmp_off[ni][DW_TMP_ACC0 + s] >= 0);
            }
        }
        bool saves = n->op == DW_OP_LAYERNORM || n->op == DW_OP_RMSNORM || n->op == DW_OP_ATTENTION;
        if (saves) {
            live_at(c, DW_BUF_AUX, ni, f, why);
            live_at(c, DW_BUF_AUX, ni, b, why);
        }
    }
    /* 3. gradient delivery: per activation exactly one WRITE, by its last consumer */
    for (int t = 0; t < g->n_tensors; t++) {
        if (g->tensors[t].kind != DW_TENSOR_ACT || t == g->loss) continue;
        int writes = 0, last = -1, writer = -1;
        for (int ni = 0; ni < g->n_nodes; ni++)
            for (int s = 0; s < g->nodes[ni].n_in; s++)
                if (g->nodes[ni].in[s] == t) {
                    last = ni;
                    if (c->grad_mode[ni][s] == DW_GRAD_WRITE) writes++, writer = ni;
                }
        assert_int_equal(writes, 1);
        assert_int_equal(writer, last);
    }
    /* 3b. shared gradient buffers: only through an add whose backward writes that input first
     * (slot 1 also read by nothing else and, when slot 0 shares too, slot 0's other readers all
     * before slot 1's producer), sharing the add output's buffer, at the same offset */
    for (int t = 0; t < g->n_tensors; t++) {
        int r = c->grad_alias[t];
        if (r == t) continue;
        assert_true(c->grad_off[t] >= 0 && c->grad_off[t] == c->grad_off[r]);
        bool justified = false;
        for (int p = 0; p < g->n_nodes && !justified; p++) {
            const dw_ir_node *n = &g->nodes[p];
            if (n->op != DW_OP_ADD || c->grad_off[n->out] != c->grad_off[t]) continue;
            for (int s = 0; s < 2; s++) {
                if (n->in[s] != t || c->grad_mode[p][s] != DW_GRAD_WRITE) continue;
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
                if (alone && (c->grad_alias[a] == a || before)) justified = true;
            }
        }
        if (!justified) fail_msg("gradient of tensor %d shares a buffer without a residual add that allows it", t);
    }
    /* 4. parameter pools: disjoint, inside, decay first */
    int64_t total = 0;
    for (int p = 0; p < c->n_params; p++) {
        const dw_ir_tensor *t = &g->tensors[c->param_tensor[p]];
        int64_t lo = c->param_off[p], hi = lo + dw_ir_numel(t);
        total += dw_ir_numel(t);
        assert_int_equal(lo % 64, 0);
        assert_true(hi <= c->param_floats);
        if (t->decay) assert_true(hi <= c->decay_floats);
        else assert_true(lo >= c->decay_floats);
        for (int q = p + 1; q < c->n_params; q++) {
            int64_t lo2 = c->param_off[q], hi2 = lo2 + dw_ir_numel(&g->tensors[c->param_tensor[q]]);
            assert_false(lo < hi2 && lo2 < hi);
        }
    }
    assert_int_equal(total, dw_graph_params(g));
    assert_int_equal(c->pool_bytes[DW_POOL_WEIGHTS], c->param_floats * (c->bf16 ? 6 : 4));
    assert_int_equal(c->pool_bytes[DW_POOL_GRADS], c->param_floats * 4);
    assert_int_equal(c->pool_bytes[DW_POOL_OPTIM], c->param_floats * 8);
    assert_int_equal(c->pool_bytes[DW_POOL_ACT], c->arena_bytes);
    assert_true(c->pool_bytes[DW_POOL_WORK] >= 2 * 4 * g->batch * g->seq);
    /* 5. the report's total is the sum of the pools */
    char *text = NULL;
    assert_int_equal(dw_compiled_report(g_ctx, c, &text), DW_OK);
    const char *tl = strstr(text, "  total");
    assert_non_null(tl);
    long long reported = 0;
    assert_int_equal(sscanf(tl, " total %lld B", &reported), 1);
    int64_t pools = 0;
    for (int p = 0; p < DW_POOL_COUNT; p++) pools += dw_compiled_pool_bytes(c, p);
    assert_int_equal(reported, pools);
    dw_free_string(text);
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

/* The quantised layers' workspace: every operand the engine quantises fits its slot (fprop x, W;
 * backward dy, dy^T, W^T, x^T and x's row-wise copy), each quantised node has its own W and W^T
 * cache, other nodes none, and no two regions of the workspace overlap. */
static void check_quant_layout(const dw_graph *g, const dw_compiled *c) {
    const dw_work_layout *w = &c->work;
    const int64_t N = g->batch * g->seq;
    int64_t lo[512], hi[512];
    int nr = 0;
#define REGION(o, b) (assert_true(nr < 512), lo[nr] = (o), hi[nr] = (o) + (b), nr++)
    REGION(w->tokens, N * 4), REGION(w->targets, N * 4), REGION(w->loss, 4), REGION(w->norm, 8);
    REGION(w->partials, DW_COMPILE_NORM_BLOCKS * 8), REGION(w->adamw_args, DW_COMPILE_ADAMW_ARGS_BYTES);
    bool any = false;
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        bool q = n->op == DW_OP_LINEAR && c->bf16 && dw_compile_quant_recipe(c->bind[i].recipe);
        if (!q) {
            assert_true(c->wq[i][0].off < 0 && c->wq[i][1].off < 0);
            continue;
        }
        any = true;
        const dw_ir_tensor *xt = &g->tensors[n->in[0]], *yt = &g->tensors[n->out];
        int64_t K = xt->shape[xt->ndim - 1], M = yt->shape[yt->ndim - 1];
        /* DESIGN.md's block recipe: 1x128 activations and gradients, 128x128 weights */
        const dw_recipe r = c->bind[i].recipe;
        const bool blk = r == DW_RECIPE_FP8_BLOCK || r == DW_RECIPE_FP8_BLOCK2D;
        const dw_recipe ra = blk ? DW_RECIPE_FP8_BLOCK : r, rw = blk ? DW_RECIPE_FP8_BLOCK2D : r;
        assert_int_equal(dw_compile_quant_act_recipe(r), ra);
        assert_int_equal(dw_compile_quant_weight_recipe(r), rw);
        slot_fits(&w->q_rows, ra, N, K, "x");
        slot_fits(&w->q_rows, ra, N, M, "dy");
        slot_fits(&w->q_dyt, ra, M, N, "dy^T");
        slot_fits(&w->q_xt, ra, K, N, "x^T");
        slot_fits(&c->wq[i][0], rw, M, K, "W");
        slot_fits(&c->wq[i][1], rw, K, M, "W^T");
        /* the weight cache is sized for W's own recipe, not a finer one (each node owns its cache) */
        assert_int_equal(c->wq[i][0].tscale - c->wq[i][0].scales,
                         (dw_quant_scales_bytes(rw, M, K) + 255) / 256 * 256);
        assert_int_equal(c->wq[i][1].tscale - c->wq[i][1].scales,
                         (dw_quant_scales_bytes(rw, K, M) + 255) / 256 * 256);
        REGION(c->wq[i][0].off, c->wq[i][0].bytes), REGION(c->wq[i][1].off, c->wq[i][1].bytes);
        assert_true(w->quant_ws >= 0 && w->quant_ws_bytes >= (1 + N + K) * 4 && w->quant_ws_bytes >= (1 + N + M) * 4);
    }
    if (any) {
        REGION(w->q_rows.off, w->q_rows.bytes), REGION(w->q_dyt.off, w->q_dyt.bytes);
        REGION(w->q_xt.off, w->q_xt.bytes), REGION(w->quant_ws, w->quant_ws_bytes);
    } else {
        assert_true(w->q_rows.off < 0 && w->q_dyt.off < 0 && w->q_xt.off < 0 && w->quant_ws < 0);
    }
#undef REGION
    for (int a = 0; a < nr; a++) {
        assert_true(lo[a] >= 0 && hi[a] <= w->bytes);
        for (int b = a + 1; b < nr; b++)
            if (lo[a] < hi[b] && lo[b] < hi[a]) fail_msg("workspace regions %d and %d overlap", a, b);
    }
    assert_int_equal(c->pool_bytes[DW_POOL_WORK], w->bytes);
}

static void test_random_graphs(void **state) {
    (void)state;
    const char *presets[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};
    /* FP32, BF16 and every quantised recipe (with and without the safe fallbacks) */
    const char *prec[] = {"bf16", "fp8_tensor", "fp8_row", "fp8_block", "fp8_block2d", "mxfp8", "mxfp8_e5m2",
                          "mxfp4", "nvfp4"};
    for (int trial = 0; trial < 24; trial++) {
        dw_graph *g = random_graph(presets[trial % 3]);
        dw_policy *p = NULL;
        if (trial % 2)
            assert_int_equal(dw_policy_from_precision(g_ctx, prec[rnd(0, 8)], rnd(0, 1), &p), DW_OK);
        dw_compiled *c = NULL;
        assert_int_equal(dw_compile(g_ctx, g, NULL, p, &c), DW_OK);
        assert_int_equal(c->bf16, p != NULL);
        assert_null(c->unsupported);
        check(g, c);
        check_quant_layout(g, c);
        dw_compiled_free(c);
        dw_policy_free(p);
        dw_graph_free(g);
    }
}

static void test_presets_reuse(void **state) { /* the arena is far below the sum of all buffers */
    (void)state;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(g_ctx, "llama-tiny", 2, 128, &g), DW_OK);
    dw_compiled *c = NULL;
    assert_int_equal(dw_compile(g_ctx, g, NULL, NULL, &c), DW_OK);
    check(g, c);
    int64_t sum = 0;
    for (int i = 0; i < c->n_items; i++) sum += c->items[i].size;
    assert_true(c->arena_bytes < sum / 2);
    dw_compiled_free(c);
    dw_graph_free(g);
}

/* GELU fusion on GPT-2 shapes: every GELU of a BF16 model fused both ways (widths % 8 == 0),
 * with its linear neighbours recorded; the plan stays valid and no larger; DW_FUSE=0 and the FP32
 * mode fuse nothing; a quantised c_fc / c_proj keeps the GELU (no FP8 GELU epilogue). */
static void test_gelu_fusion(void **state) {
    (void)state;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(g_ctx, "gpt2-tiny", 2, rnd(8, 64), &g), DW_OK);
    dw_policy *p = NULL;
    assert_int_equal(dw_policy_from_precision(g_ctx, "bf16", false, &p), DW_OK);
    dw_compiled *c = NULL, *off = NULL, *fp32 = NULL;
    assert_int_equal(dw_compile(g_ctx, g, NULL, p, &c), DW_OK);
    setenv("DW_FUSE", "0", 1);
    assert_int_equal(dw_compile(g_ctx, g, NULL, p, &off), DW_OK);
    unsetenv("DW_FUSE");
    assert_int_equal(dw_compile(g_ctx, g, NULL, NULL, &fp32), DW_OK);
    int gelus = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        assert_int_equal(off->fused[i], 0);
        assert_int_equal(fp32->fused[i], 0);
        if (n->op != DW_OP_GELU) {
            assert_int_equal(c->fused[i], 0);
            continue;
        }
        gelus++;
        assert_int_equal(c->fused[i], DW_FUSED_FWD | DW_FUSED_BWD);
        int L = c->gelu_producer[i], P = c->gelu_consumer[i];
        assert_true(strstr(g->nodes[L].name, "c_fc") && strstr(g->nodes[P].name, "c_proj"));
        assert_int_equal(dw_compile_fused_gelu_fwd(c, L), i);
        assert_int_equal(dw_compile_fused_gelu_bwd(c, P), i);
        assert_int_equal(dw_compile_fused_gelu_fwd(c, P), -1);
        assert_int_not_equal(off->grad_off[n->out], -1);
    }
    assert_int_equal(gelus, g->model.n_blocks);
    check(g, c);
    check(g, off);
    assert_true(c->arena_bytes <= off->arena_bytes);
    dw_compiled_free(c), dw_compiled_free(off), dw_compiled_free(fp32);
    dw_policy_free(p);
    /* fp8_block with the safe fallback: every GELU's forward moves to its producing linear (the
     * engine runs it in a quantised GEMM's epilogue when a kernel has one, else right after it);
     * its backward only into a BF16 consumer's dgrad (no quantised DGELU epilogue) */
    assert_int_equal(dw_policy_from_precision(g_ctx, "fp8_block", true, &p), DW_OK);
    assert_int_equal(dw_compile(g_ctx, g, NULL, p, &c), DW_OK);
    int quantised = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != DW_OP_GELU) continue;
        assert_true(c->fused[i] & DW_FUSED_FWD);
        int P = -1;
        for (int j = 0; j < g->n_nodes; j++)
            if (g->nodes[j].op == DW_OP_LINEAR && g->nodes[j].in[0] == g->nodes[i].out) P = j;
        assert_true(P >= 0);
        bool bf16 = c->bind[P].recipe == DW_RECIPE_BF16;
        quantised += !bf16;
        assert_int_equal((c->fused[i] & DW_FUSED_BWD) != 0, bf16);
    }
    assert_true(quantised > 0);
    check(g, c);
    dw_compiled_free(c);
    dw_policy_free(p);
    dw_graph_free(g);
}

static void test_policy_binding(void **state) {
    (void)state;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(g_ctx, "gpt2-tiny", 1, 16, &g), DW_OK);
    dw_policy *p = NULL;
    assert_int_equal(dw_policy_from_precision(g_ctx, "fp8_block", true, &p), DW_OK);
    dw_compiled *c = NULL;
    assert_int_equal(dw_compile(g_ctx, g, NULL, p, &c), DW_OK);
    assert_null(c->unsupported); /* fp8_block: quantised linear layers run on the engine */
    int lm = -1, mid = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        if (!strcmp(g->nodes[i].name, "lm_head")) lm = i;
        if (!strcmp(g->nodes[i].name, "transformer.h.1.mlp.c_fc")) mid = i;
    }
    assert_true(lm >= 0 && mid >= 0);
    assert_int_equal(c->bind[lm].recipe, DW_RECIPE_BF16);
    assert_int_equal(c->bind[lm].reason, DW_POLICY_BY_SAFE);
    assert_true(c->bind[lm].supported);
    assert_int_equal(c->bind[mid].recipe, DW_RECIPE_FP8_BLOCK);
    assert_int_equal(c->bind[mid].reason, DW_POLICY_BY_DEFAULT);
    assert_true(c->bind[mid].supported);
    /* gpt2-tiny's widths are not multiples of 128: cuBLASLt block scaling refuses, BF16 fallback noted */
    assert_non_null(c->bind[mid].note);
    assert_non_null(strstr(c->bind[mid].note, "BF16 FALLBACK"));
    assert_true(c->work.q_rows.off >= 0 && c->wq[mid][0].off >= 0);
    check_quant_layout(g, c);
    check(g, c);
    dw_compiled_free(c);
    /* fp8_block2d names the same pairing: W in 128x128 blocks, x and dy in 1x128 */
    dw_policy *p2 = NULL;
    assert_int_equal(dw_policy_from_precision(g_ctx, "fp8_block2d", true, &p2), DW_OK);
    assert_int_equal(dw_compile(g_ctx, g, NULL, p2, &c), DW_OK);
    assert_null(c->unsupported);
    assert_true(c->bind[mid].supported);
    assert_int_equal(c->bind[mid].recipe, DW_RECIPE_FP8_BLOCK2D);
    assert_int_equal(dw_compile_quant_act_recipe(DW_RECIPE_FP8_BLOCK2D), DW_RECIPE_FP8_BLOCK);
    assert_int_equal(dw_compile_quant_weight_recipe(DW_RECIPE_FP8_BLOCK), DW_RECIPE_FP8_BLOCK2D);
    assert_int_equal(dw_compile_quant_weight_recipe(DW_RECIPE_FP8_BLOCK2D), DW_RECIPE_FP8_BLOCK2D);
    assert_int_equal(dw_compile_quant_act_recipe(DW_RECIPE_MXFP8), DW_RECIPE_MXFP8);
    assert_int_equal(dw_compile_quant_weight_recipe(DW_RECIPE_MXFP8), DW_RECIPE_MXFP8);
    check_quant_layout(g, c);
    check(g, c);
    dw_compiled_free(c);
    dw_policy_free(p2);
    /* parallel plans are refused */
    assert_int_equal(dw_compile(g_ctx, g, "plan.json", p, &c), DW_ERR_UNSUPPORTED);
    assert_null(c);
    assert_non_null(strstr(dw_errmsg(g_ctx), "plan.json"));
    dw_policy_free(p);
    dw_graph_free(g);
}

/* The engine functions dispatch on the backend: on a CPU context (or a CPU-only build) the CUDA
 * engine is refused with a message, and the CPU engine answers the CUDA-only calls plainly. */
static void test_engine_dispatch(void **state) {
    (void)state;
    dw_model_config c;
    assert_int_equal(dw_model_config_load(g_ctx, "llama-tiny", &c), DW_OK);
    dw_engine *e = (dw_engine *)&c; /* must be overwritten with NULL */
    dw_status s = dw_engine_create_cuda(g_ctx, &c, 1, 8, NULL, &e);
    assert_int_equal(s, dw_built_with_cuda() ? DW_ERR_INVALID : DW_ERR_UNSUPPORTED);
    assert_null(e);
    assert_non_null(strstr(dw_errmsg(g_ctx), "cuda engine"));
    assert_int_equal(dw_engine_create_cpu(g_ctx, &c, 1, 8, &e), DW_OK);
    assert_false(dw_engine_on_device(e));
    assert_null(dw_engine_compiled(e));
    assert_int_equal(dw_engine_sync_to_host(e, true), DW_OK);
    assert_int_equal(dw_engine_sync_to_device(e), DW_OK);
    double gn = 1;
    assert_int_equal(dw_engine_adamw_step(e, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0, 1, &gn), DW_ERR_UNSUPPORTED);
    assert_true(gn == 0.0);
    float m = 0, v = 0;
    assert_int_equal(dw_engine_adamw_moments(e, 0, &m, &v, false), DW_ERR_UNSUPPORTED);
    dw_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_graphs),
        cmocka_unit_test(test_presets_reuse),
        cmocka_unit_test(test_gelu_fusion),
        cmocka_unit_test(test_policy_binding),
        cmocka_unit_test(test_engine_dispatch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
