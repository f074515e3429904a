/* test_moe_mem.c — MoE activation memory (compile/recompute.c's rematerialisation, arena.c):
 *   - what a Mixtral block keeps from its forward to its backward, item by item at the first
 *     backward time, equals the formula of docs/moe.md ("Memory") at random shapes, capacities,
 *     FP32 and BF16; the MoE input norm's output, the dispatched rows and the experts' SwiGLU
 *     output are not among it, and without rematerialisation (dw_compile_opts.moe_remat off) a
 *     block keeps exactly a (R (C + F) + N C) + its rstd bytes more;
 *   - each rematerialised forward runs once, just before the first reader of its output in the
 *     backward sweep, after every later node's backward; no two live buffers share bytes;
 *   - training is bit for bit the program without it: 20 AdamW steps of mixtral-tiny (dropless and
 *     dropping by weight), olmoe-tiny (fine-grained), qwen2-moe-tiny (a shared expert reading the
 *     same x) and qwen3-moe-tiny, FP32 and BF16, losses, every parameter and the routing counters;
 *   - moe-e8 at 8 x 2048 and moe-e64 at 4 x 2048 (BF16, sm_90, the LM head fused, as dryrun and
 *     the planner compile them) keep their activation pools below the bounds measured when the
 *     rematerialisation landed, (L - 1) blocks' norm output, rows and SwiGLU below the program
 *     without it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "capture/model_config.h"
#include "compile/program.h"
#include "ir/ir.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define GIB (1024.0 * 1024.0 * 1024.0)

static int64_t align256(int64_t v) { return (v + 255) / 256 * 256; }

/* A program of config mc at B x T (precision NULL: FP32), rematerialising or not; with an engine
 * when engine is true. m owns the graph. */
static void build(const dw_model_config *mc, int64_t B, int64_t T, const char *precision, bool remat, bool engine,
                  bool cuda, dw_test_model *m) {
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(CTX, mc, B, T, &g), DW_OK);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.moe_remat = remat;
    if (cuda) o.device = DW_DEVICE_CUDA, o.sm = 90, o.fused_head = true;
    if (engine) {
        assert_int_equal(dw_test_model_build_opts(CTX, g, precision, &o, m), DW_OK);
    } else {
        memset(m, 0, sizeof *m);
        m->g = g;
        if (precision) assert_int_equal(dw_policy_from_precision(CTX, precision, true, &m->pol), DW_OK);
        assert_int_equal(dw_compile(CTX, g, NULL, m->pol, &o, &m->c), DW_OK);
    }
}

/* The block an arena item belongs to: its tensor's producer's, or its node's. */
static int item_block(const dw_compiled *c, int i) {
    const dw_graph *g = c->g;
    const dw_buf_info *in = &c->info[i];
    if (in->kind == DW_BUF_VALUE || in->kind == DW_BUF_GRAD) {
        const int p = g->tensors[in->index].producer;
        return p >= 0 ? g->nodes[p].block : -1;
    }
    return g->nodes[in->index].block;
}

/* Bytes of block b's values and saved parts live at the first backward time. */
static int64_t kept_bytes(const dw_compiled *c, int b) {
    const int t0 = c->g->n_nodes;
    int64_t s = 0;
    for (int i = 0; i < c->n_items; i++)
        if ((c->info[i].kind == DW_BUF_VALUE || c->info[i].kind == DW_BUF_AUX) && item_block(c, i) == b &&
            dw_mem_live_at(&c->items[i], t0))
            s += c->items[i].size;
    return s;
}

/* docs/moe.md's bytes a Mixtral block keeps for its backward: a-byte activations of N tokens,
 * R = the dispatch's rows (N K dropless). */
static int64_t mixtral_block_bytes(const dw_model_config *mc, int64_t N, int64_t a, bool remat) {
    const int64_t C = mc->d_model, H = mc->n_heads, Hkv = mc->n_kv_heads, D = mc->head_dim;
    const int64_t E = mc->n_experts, K = mc->top_k, F = mc->d_ff_expert;
    const int64_t R = dw_moe_routed_rows(mc->capacity_factor, N, K, E);
    int64_t s = a * N * (3 * C + 2 * H * D + 2 * Hkv * D); /* norm 1 out, q, k, v, attention out, residual, block out */
    s += a * N * (E + K) + 4 * N * K + 4 * (E + 1) + 4 * N * K; /* router logits, weights, experts; offsets, positions */
    s += a * R * (2 * F + C);                                    /* gate, up, down */
    s += align256(4 * N) + align256(4 * N * H);                  /* norm 1's rstd, attention lse */
    if (!remat) s += a * R * (C + F) + a * N * C + align256(4 * N); /* the rows, SwiGLU out, norm 2 out and rstd */
    return s;
}

/* mixtral-tiny with random dimensions from the group's generator. */
static dw_model_config random_mixtral(void) {
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, "mixtral-tiny", &mc), DW_OK);
    mc.n_kv_heads = dw_test_rnd(1, 2);
    mc.n_heads = mc.n_kv_heads * dw_test_rnd(1, 3);
    mc.head_dim = 2 * dw_test_rnd(2, 6);
    mc.d_model = mc.n_heads * mc.head_dim;
    mc.n_layers = dw_test_rnd(2, 3);
    mc.n_experts = dw_test_rnd(2, 6);
    mc.top_k = dw_test_rnd(1, mc.n_experts);
    mc.d_ff_expert = dw_test_rnd(3, 40);
    mc.capacity_factor = dw_test_rnd(0, 1) ? (double)dw_test_rnd(2, 19) / 20.0 : 0.0;
    mc.drop_by_weight = dw_test_rnd(0, 1);
    return mc;
}

static void test_block_formula(void **state) {
    (void)state;
    for (int rep = 0; rep < 8; rep++) {
        const dw_model_config mc = random_mixtral();
        const int64_t B = dw_test_rnd(1, 3), T = dw_test_rnd(2, 24), N = B * T;
        const char *precision = rep % 2 ? "bf16" : NULL;
        const int64_t a = precision ? 2 : 4;
        dw_test_model r, k;
        build(&mc, B, T, precision, true, false, rep % 4 == 3, &r);
        build(&mc, B, T, precision, false, false, rep % 4 == 3, &k);
        for (int b = 0; b + 1 < mc.n_layers; b++) { /* the last block's also holds the router losses' totals */
            const int64_t want = mixtral_block_bytes(&mc, N, a, true), got = kept_bytes(r.c, b);
            const int64_t want_k = mixtral_block_bytes(&mc, N, a, false), got_k = kept_bytes(k.c, b);
            if (got != want || got_k != want_k)
                fail_msg("C %lld H %lld/%lld D %lld E %lld K %lld F %lld cap %g, %lld x %lld %s, block %d: keeps %lld "
                         "bytes (formula %lld); without rematerialisation %lld (formula %lld)",
                         (long long)mc.d_model, (long long)mc.n_heads, (long long)mc.n_kv_heads, (long long)mc.head_dim,
                         (long long)mc.n_experts, (long long)mc.top_k, (long long)mc.d_ff_expert, mc.capacity_factor,
                         (long long)B, (long long)T, precision ? precision : "fp32", b, (long long)got, (long long)want,
                         (long long)got_k, (long long)want_k);
        }
        if (r.c->arena_bytes >= k.c->arena_bytes)
            fail_msg("rematerialising arena %lld bytes, not below %lld", (long long)r.c->arena_bytes,
                     (long long)k.c->arena_bytes);
        dw_test_model_free(&r);
        dw_test_model_free(&k);
    }
}

/* Whether node i's backward reads tensor t (ops.def's READS flags), restated. */
static bool bwd_reads(const dw_graph *g, int i, int t) {
    const dw_ir_node *n = &g->nodes[i];
    const unsigned f = dw_op_flags(n->op);
    for (int s = 0; s < n->n_in; s++)
        if (n->in[s] == t && (f & DW_OPF_READS_IN(s))) return true;
    for (int k = 0; k < n->n_out && (f & DW_OPF_READS_OUT); k++)
        if (n->out[k] == t) return true;
    return false;
}

/* Whether node j is one the program rematerialises: a dispatch, an expert SwiGLU, the RMSNorm a
 * dispatch reads. */
static bool rematerialised(const dw_graph *g, int j) {
    const dw_ir_node *n = &g->nodes[j];
    if (n->op == DW_OP_MOE_DISPATCH) return true;
    if (n->op == DW_OP_SWIGLU) return g->nodes[g->tensors[n->in[0]].producer].op == DW_OP_MOE_LINEAR;
    for (int k = j + 1; k < g->n_nodes && n->op == DW_OP_RMSNORM; k++)
        if (g->nodes[k].op == DW_OP_MOE_DISPATCH && g->nodes[k].in[0] == n->out[0]) return true;
    return false;
}

/* Every dispatch, expert SwiGLU and the norm before a dispatch runs again once, before its
 * output's first reader in the backward sweep (a backward reading it, or a consumer run again) and
 * after the backward of every node past the last node whose backward reads it; nothing else does;
 * its output's value is dead from the end of the forward to the rerun; no live buffers share bytes. */
static void check_schedule(const dw_test_model *m) {
    const dw_compiled *c = m->c;
    const dw_graph *g = m->g;
    int again = 0, moe = 0;
    for (int s = c->phase[DW_PHASE_BACKWARD][0]; s < c->phase[DW_PHASE_BACKWARD][1]; s++)
        again += c->steps[s].kind == DW_STEP_FWD;
    for (int j = 0; j < g->n_nodes; j++) {
        const dw_ir_node *n = &g->nodes[j];
        const bool is_moe = rematerialised(g, j);
        assert_int_equal(dw_compile_remat(c, j), is_moe);
        if (!is_moe) {
            assert_int_equal(dw_compile_rc_time(c, j), -1);
            continue;
        }
        moe++;
        const int r = dw_compile_rc_time(c, j), t = n->out[0];
        int reader = -1; /* the first node in the sweep reading t: a backward, or the one a consumer runs again before */
        for (int i = g->n_nodes - 1; i > j && reader < 0; i--)
            if (bwd_reads(g, i, t)) reader = i;
        for (int k = j + 1; k < g->n_nodes; k++)
            for (int s = 0; s < g->nodes[k].n_in; s++)
                if (g->nodes[k].in[s] == t && dw_compile_rc_time(c, k) >= 0) {
                    if (!(r < dw_compile_rc_time(c, k)))
                        fail_msg("%s runs again at %d, after its consumer %s (%d)", n->name, r, g->nodes[k].name,
                                 dw_compile_rc_time(c, k));
                    int next = -1; /* the backward right after k's rerun */
                    for (int i = 0; i < g->n_nodes; i++)
                        if (dw_compile_bwd_time(c, i) > dw_compile_rc_time(c, k) &&
                            (next < 0 || dw_compile_bwd_time(c, i) < dw_compile_bwd_time(c, next)))
                            next = i;
                    if (next > reader) reader = next;
                }
        assert_true(reader > j && r > dw_compile_fwd_time(c, g->n_nodes - 1));
        if (!(r < dw_compile_bwd_time(c, reader) && (reader + 1 == g->n_nodes || r > dw_compile_bwd_time(c, reader + 1))))
            fail_msg("%s runs again at %d; its first reader %s's backward at %d", n->name, r, g->nodes[reader].name,
                     dw_compile_bwd_time(c, reader));
        for (int i = 0; i < c->n_items; i++) /* the value: written by the forward, then from the rerun */
            if (c->info[i].kind == DW_BUF_VALUE && c->info[i].index == t) {
                const dw_mem_item *it = &c->items[i];
                assert_true(it->last < g->n_nodes && it->first2 == r && it->last2 >= dw_compile_bwd_time(c, reader));
            }
    }
    assert_int_equal(again, moe);
    int a, b, t;
    if (dw_test_plan_overlap(c, &a, &b, &t)) fail_msg("items %d and %d share bytes while both live at time %d", a, b, t);
}

/* 20 steps from the same weights and tokens with and without rematerialisation: the same bits. */
static void same_bits(const dw_model_config *mc, const char *name, const char *precision) {
    const int64_t B = 2, T = 16;
    dw_test_model r, k;
    build(mc, B, T, precision, true, true, false, &r);
    build(mc, B, T, precision, false, true, false, &k);
    check_schedule(&r);
    for (int i = 0; i < k.g->n_nodes; i++) assert_int_equal(dw_compile_rc_time(k.c, i), -1); /* the old program */
    char what[96];
    snprintf(what, sizeof what, "%s %s, rematerialising vs keeping", name, precision ? precision : "fp32");
    double r0, r1;
    assert_int_equal(dw_test_same_training(&r, &k, B, T, 20, 1e-2, dw_test_next(&dw_test_group_rng), what, &r0, &r1), 0);
    int64_t layers = 0; /* the counters compared are there */
    assert_int_equal(dw_engine_moe_counts(r.e, &layers, NULL, NULL), DW_OK);
    assert_true(layers > 0);
    printf("  %-22s %-5s losses %.6f -> %.6f, arena %lld -> %lld bytes\n", name, precision ? precision : "fp32", r0, r1,
           (long long)k.c->arena_bytes, (long long)r.c->arena_bytes);
    dw_test_model_free(&r);
    dw_test_model_free(&k);
}

static void test_same_bits(void **state) {
    (void)state;
    static const char *const presets[] = {"mixtral-tiny", "olmoe-tiny", "qwen2-moe-tiny", "qwen3-moe-tiny"};
    for (size_t p = 0; p < sizeof presets / sizeof *presets; p++) {
        dw_model_config mc;
        assert_int_equal(dw_model_config_load(CTX, presets[p], &mc), DW_OK);
        same_bits(&mc, presets[p], NULL);
        same_bits(&mc, presets[p], "bf16");
    }
    dw_model_config mc; /* over capacity, dropping the lightest: the rerun selects the same rows */
    assert_int_equal(dw_model_config_load(CTX, "mixtral-tiny", &mc), DW_OK);
    mc.capacity_factor = 0.5, mc.drop_by_weight = true;
    same_bits(&mc, "mixtral-tiny cap 0.5", "bf16");
}

/* The benchmark presets as dryrun compiles them: activation pool below the bound (GiB) and below
 * the program without rematerialisation by at least (L - 1) blocks' norm, rows and SwiGLU outputs. */
static void check_preset(const char *preset, int64_t B, int64_t T, double bound) {
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, preset, &mc), DW_OK);
    dw_test_model r, k;
    build(&mc, B, T, "bf16", true, false, true, &r);
    build(&mc, B, T, "bf16", false, false, true, &k);
    const int64_t N = B * T, saved = 2 * N * (mc.top_k * (mc.d_model + mc.d_ff_expert) + mc.d_model) * (mc.n_layers - 1);
    const double act = (double)r.c->pool_bytes[DW_POOL_ACT] / GIB, kept = (double)k.c->pool_bytes[DW_POOL_ACT] / GIB;
    printf("  %-8s %lld x %lld: activations %.2f GiB (%.2f without rematerialisation; bound %.2f)\n", preset,
           (long long)B, (long long)T, act, kept, bound);
    if (act > bound || k.c->pool_bytes[DW_POOL_ACT] - r.c->pool_bytes[DW_POOL_ACT] < saved)
        fail_msg("%s: activations %.3f GiB (bound %.2f), %.3f GiB without rematerialisation (want %.3f GiB less)", preset,
                 act, bound, kept, (double)saved / GIB);
    dw_test_model_free(&r);
    dw_test_model_free(&k);
}

static void test_presets(void **state) {
    (void)state;
    check_preset("moe-e8", 8, 2048, 10.5);
    check_preset("moe-e64", 4, 2048, 4.9);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_formula),
        cmocka_unit_test(test_same_bits),
        cmocka_unit_test(test_presets),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
