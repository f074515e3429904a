/* test_plan_engine.c — the planner's view of Deepwell's CUDA engine: memory of a plan the engine
 * runs equals the engine's compiled pools (dw_compile, computed here independently) plus the
 * cuBLASLt workspace and the context allowance, on random presets, micro-batches, sequences and
 * recipes; plans the engine cannot run say why; the engine's time against hand counts; data
 * parallelism as the runtime runs it (train/dp.c) priced from the same engine, and ranked first;
 * expert parallelism as the runtime runs it (train/ep.c): the whole program eager on every rank
 * plus the exchanges, never less than the same plan without --ep. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/grad_stage.h"
#include "compile/passes.h"
#include "test_plan_common.h"
#include "testutil.h"

/* Pools of the CUDA engine (a program compiled for sm_90, as the planner's GPU) for cfg at b x s
 * under the planner's policy for prec (independent of src/plan: the policy is built here from the
 * recipe name and the safe-fallback rule), with the gradients and BF16 copies in the activation
 * arena or not (`deepwell train` keeps them there for one micro-batch a step under ZeRO 0/1). */
static int64_t compiled_pools(dw_ctx *ctx, const dw_model_config *cfg, int64_t b, int64_t s, const char *prec,
                              bool arenas, int64_t pools[DW_POOL_COUNT]) {
    dw_graph *g = NULL;
    dw_policy *pol = NULL;
    dw_compiled *c = NULL;
    assert_int_equal(dw_capture_config(ctx, cfg, b, s, &g), DW_OK);
    assert_int_equal(dw_policy_from_precision(ctx, prec, strcmp(prec, "bf16") != 0, &pol), DW_OK);
    dw_compile_opts o; /* the planner plans for the CUDA engine: the program for sm_90, as `deepwell train`
                          compiles it (the LM head fused with the loss) */
    dw_compile_opts_init(&o, sizeof o);
    o.device = DW_DEVICE_CUDA;
    o.sm = 90;
    o.fused_head = true;
    o.grad_arena = o.bf16_arena = arenas;
    assert_int_equal(dw_compile(ctx, g, NULL, pol, &o, &c), DW_OK);
    assert_int_equal(c->target.device, DW_DEVICE_CUDA);
    assert_int_equal(c->target.sm, 90);
    int64_t t = 0;
    for (int p = 0; p < DW_POOL_COUNT; p++) pools[p] = dw_compiled_pool_bytes(c, p), t += pools[p];
    dw_compiled_free(c);
    dw_policy_free(pol);
    dw_graph_free(g);
    return t;
}

static dw_hw *one_gpu(dw_ctx *ctx) {
    dw_hw *hw = plan_preset(ctx, "h200", 1);
    hw->n_gpus = 1; /* GPU 0 of the node alone (the planner reads gpus[0] and n_gpus) */
    hw->nvlink_domain = 1;
    return hw;
}

static void test_memory_equals_compiled_pools(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = one_gpu(ctx);
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    static const char *const models[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "gpt2-124m", "llama-1b"};
    static const int64_t seqs[] = {64, 128, 256, 512, 1024};
    for (int it = 0; it < 12; it++) {
        const char *name = models[it < 5 ? it : (int)(dw_test_next(&rng) % 5)];
        dw_model_config cfg;
        assert_int_equal(dw_model_config_load(ctx, name, &cfg), DW_OK);
        int64_t s = seqs[dw_test_next(&rng) % 5];
        if (s > cfg.max_seq) s = cfg.max_seq;
        int64_t mb = (int64_t)1 << (dw_test_next(&rng) % 4), ga = 1 + (int64_t)(dw_test_next(&rng) % 3);
        dw_recipe pr = dw_plan_recipes[dw_test_next(&rng) % DW_PLAN_RECIPES];
        dw_job j = {.seq = s, .global_batch = mb * ga, .recipe = pr};
        dw_plan_in in;
        assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
        assert_true(in.engine_model);
        dw_par p = {.dp = 1, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = mb, .grad_accum = ga};
        char why[300];
        assert_true(dw_plan_engine_runnable(&in, &p, why, sizeof why));
        int64_t pools[DW_POOL_COUNT];
        int64_t sum = compiled_pools(ctx, &cfg, mb, s, dw_recipe_name(pr), ga == 1, pools);
        dw_mem m;
        dw_plan_memory(&in, &p, &m);
        print_message("%s s=%lld mb=%lld %s: predicted %.0f B, compiled pools %lld B\n", name, (long long)s,
                      (long long)mb, dw_recipe_name(pr), m.total, (long long)sum);
        /* cuDNN attention (BF16): the FP32 dQ accumulator, as much again for grouped K/V, 512 B */
        int64_t att = 0;
        if (cfg.head_dim % 8 == 0 && cfg.head_dim <= 128) { /* every planner precision runs BF16 attention */
            att = mb * cfg.n_heads * s * cfg.head_dim * 4;
            att += (cfg.n_kv_heads < cfg.n_heads ? att : 0) + 512;
        }
        assert_true(m.total == (double)(sum + DW_COMPILE_LT_WORKSPACE + att + DW_PLAN_CUDA_CONTEXT));
        assert_true(m.weights == (double)pools[DW_POOL_WEIGHTS]);
        assert_true(m.grads == (double)pools[DW_POOL_GRADS]);
        assert_true(m.optimizer == (double)pools[DW_POOL_OPTIM]);
        assert_true(m.activations == (double)pools[DW_POOL_ACT]);
        assert_true(m.workspace == (double)(pools[DW_POOL_WORK] + DW_COMPILE_LT_WORKSPACE + att + DW_PLAN_CUDA_CONTEXT));
        /* the parts add up and the padded parameter pools hold 18 bytes per parameter at least (12
         * with the gradients and BF16 copies in the arena) */
        assert_true(m.weights + m.grads + m.optimizer + m.activations + m.workspace + m.scales == m.total);
        dw_param_counts pc;
        dw_plan_params(&in, &pc);
        assert_true(m.weights + m.grads + m.optimizer >= (ga == 1 ? 12 : 18) * pc.total);
        /* the dryrun check and the search see the same figure */
        dw_plan_entry e;
        dw_reject r;
        char det[200];
        assert_true(dw_plan_evaluate(&in, &p, false, &e, &r, det, sizeof det));
        assert_true(e.mem.total == m.total);
        /* full and selective recompute: the engine runs them; their memory is the recomputing
         * program's (a smaller arena), their forward the same, their backward longer by the
         * forwards run again */
        dw_par f = p;
        f.recompute = DW_RECOMPUTE_FULL;
        assert_true(dw_plan_engine_runnable(&in, &f, why, sizeof why));
        dw_engine_mem em0, em1, em2;
        if (ga == 1) setenv("DW_GRAD_ARENA", "1", 1), setenv("DW_BF16_ARENA", "1", 1); /* as train runs it */
        assert_int_equal(dw_plan_engine_memory(ctx, &in, mb, DW_RECOMPUTE_NONE, &em0), DW_OK);
        assert_int_equal(dw_plan_engine_memory(ctx, &in, mb, DW_RECOMPUTE_FULL, &em1), DW_OK);
        assert_int_equal(dw_plan_engine_memory(ctx, &in, mb, DW_RECOMPUTE_SELECTIVE, &em2), DW_OK);
        unsetenv("DW_GRAD_ARENA"), unsetenv("DW_BF16_ARENA");
        assert_true(em1.pool[DW_POOL_ACT] < em0.pool[DW_POOL_ACT]);
        assert_true(em1.pool[DW_POOL_WEIGHTS] == em0.pool[DW_POOL_WEIGHTS]);
        dw_engine_time t0, t1;
        assert_int_equal(dw_plan_engine_time(ctx, &in, mb, DW_RECOMPUTE_NONE, &t0), DW_OK);
        assert_int_equal(dw_plan_engine_time(ctx, &in, mb, DW_RECOMPUTE_FULL, &t1), DW_OK);
        assert_true(t1.fwd == t0.fwd && t1.bwd > t0.bwd && t1.bwd < t0.bwd + t0.fwd);
        dw_plan_entry ef;
        assert_true(dw_plan_evaluate(&in, &f, false, &ef, &r, det, sizeof det));
        assert_true(ef.mem.total == (double)em1.total && ef.mem.total < e.mem.total);
        /* selective recompute: the engine runs it too; its arena between none's and full's (the
         * norms and MLP activations only), its backward longer by their forwards alone */
        dw_par sel = p;
        sel.recompute = DW_RECOMPUTE_SELECTIVE;
        assert_true(dw_plan_engine_runnable(&in, &sel, why, sizeof why));
        dw_engine_time t2;
        print_message("  activations: none %lld, selective %lld, full %lld B\n", (long long)em0.pool[DW_POOL_ACT],
                      (long long)em2.pool[DW_POOL_ACT], (long long)em1.pool[DW_POOL_ACT]);
        /* at most none's; at least full's where the gradients have a pool of their own. With the
         * gradients in the arena (ga 1) the peak sits at the end of the backward, where selective
         * may free more than full (qwen2-tiny s 64 fp8_block, DW_TEST_SEED=7765456607457553: live
         * peaks none 3482112, selective 3465472, full 3482112 B); test_recompute.c holds the
         * strict drop without them */
        assert_true(em2.pool[DW_POOL_ACT] <= em0.pool[DW_POOL_ACT]);
        if (ga != 1) assert_true(em2.pool[DW_POOL_ACT] >= em1.pool[DW_POOL_ACT]);
        assert_int_equal(dw_plan_engine_time(ctx, &in, mb, DW_RECOMPUTE_SELECTIVE, &t2), DW_OK);
        assert_true(t2.fwd == t0.fwd && t2.bwd > t0.bwd && t2.bwd < t1.bwd);
        assert_true(t2.gemm == t0.gemm && t2.attn == t0.attn); /* no GEMM or attention runs again */
        /* plans the engine does not run: reason given, analytical memory */
        dw_par q = p;
        q.zero = 1;
        assert_false(dw_plan_engine_runnable(&in, &q, why, sizeof why));
        assert_non_null(strstr(why, "ZeRO"));
        dw_plan_memory(&in, &q, &m);
        assert_true(m.workspace >= 1024.0 * 1024 * 1024); /* the analytical model's fixed 1 GiB */
    }
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_not_runnable_reasons(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw8 = plan_preset(ctx, "h200", 1);
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(ctx, "gpt2-124m", &cfg), DW_OK);
    dw_job j = {.seq = 1024, .global_batch = 16};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw8, &j, NULL, &in), DW_OK);
    dw_par p = {.dp = 4, .tp = 2, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 2, .grad_accum = 1};
    char why[300];
    assert_false(dw_plan_engine_runnable(&in, &p, why, sizeof why));
    assert_non_null(strstr(why, "8 GPUs"));
    /* data parallelism alone runs, with ZeRO 0-3 (ZeRO-3 of quantised recipes not:
     * test_plan_zero3.c); offload does not */
    p.dp = 8, p.tp = 1;
    for (int z = 0; z <= 3; z++) {
        p.zero = z;
        assert_true(dw_plan_engine_runnable(&in, &p, why, sizeof why));
    }
    p.zero = 1, p.offload = true;
    assert_false(dw_plan_engine_runnable(&in, &p, why, sizeof why));
    assert_non_null(strstr(why, "offload"));
    p.offload = false;
    /* planning-only and MoE models: the engine cannot build them, whatever the plan */
    dw_hw *hw = one_gpu(ctx);
    assert_int_equal(dw_model_config_load(ctx, "llama-8b", &cfg), DW_OK);
    j.seq = 2048, j.global_batch = 1;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    assert_false(in.engine_model);
    p = (dw_par){.dp = 1, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 1, .grad_accum = 1};
    assert_false(dw_plan_engine_runnable(&in, &p, why, sizeof why));
    assert_non_null(strstr(why, "planning-only"));
    assert_int_equal(dw_model_config_load(ctx, "gpt2-124m", &cfg), DW_OK);
    j.seq = 1024, j.moe_experts = 8, j.moe_top_k = 2;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    assert_false(dw_plan_engine_runnable(&in, &p, why, sizeof why));
    assert_non_null(strstr(why, "mixture-of-experts"));
    dw_hw_free(hw);
    dw_hw_free(hw8);
    dw_ctx_free(ctx);
}

/* The engine's time for GPT-2 (gpt2-tiny at a random micro-batch and sequence, BF16, analytical
 * GEMM curve) against hand counts from the architecture: per block ln_1, c_attn (d -> 3d),
 * attention, c_proj, add, ln_2, c_fc (d -> f), GELU, c_proj (f -> d), add, all linears biased;
 * around them embedding, position, ln_f, the tied LM head (d -> V) and cross-entropy. */
/* Quantised nodes against BF16 on the same job (llama-tiny with 5 blocks: the safe fallback keeps
 * the first and last block and the LM head in BF16, so 3 blocks run mxfp8): the extra memory
 * time is exactly the activations' quantisation, 3 bytes per element (read BF16, write FP8),
 * with q/k/v and gate/up quantising their shared x once (and x^T once); the extra launches are one
 * per distinct x forward, one per dgrad (dy) and one per distinct x backward; the optimizer adds
 * each quantised weight's cache refresh, 6 bytes per weight (FP32 read, W and W^T written) and one
 * launch per node. */
static void test_engine_time_quantised(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = one_gpu(ctx);
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x78);
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(ctx, "llama-tiny", &cfg), DW_OK);
    cfg.n_layers = 5;
    const double B = (double)(1 + dw_test_next(&rng) % 4), T = (double)(16 << (dw_test_next(&rng) % 4));
    dw_engine_time et[2];
    for (int k = 0; k < 2; k++) {
        dw_job j = {.seq = (int64_t)T, .global_batch = (int64_t)B, .recipe = k ? DW_RECIPE_MXFP8 : DW_RECIPE_BF16};
        dw_plan_in in;
        assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
        assert_int_equal(dw_plan_engine_time(ctx, &in, (int64_t)B, DW_RECOMPUTE_NONE, &et[k]), DW_OK);
    }
    const double d = (double)cfg.d_model, f = (double)cfg.d_ff, q = (double)(cfg.n_heads * cfg.head_dim);
    const double kv = (double)(cfg.n_kv_heads * cfg.head_dim), N = B * T, Lq = cfg.n_layers - 2;
    const double bw = hw->gpus[0].hbm_gbps * 1e9;
    const double x_el = N * (d + q + d + f);                       /* distinct x: attn in, o in, mlp in, down in */
    const double dy_el = N * (q + 2 * kv + d + 2 * f + d);         /* q, k, v, o, gate, up, down outputs */
    const double qbytes = Lq * 3 * (x_el + dy_el + dy_el + x_el);  /* fprop x; dgrad dy; wgrad dy^T and x^T */
    const double wel = q * d + 2 * kv * d + d * q + 2 * f * d + d * f;
    const double opt = Lq * (wel * 6 / (bw * 0.70) + 7 * 6e-6);
    print_message("llama-tiny x5 B %.0f T %.0f mxfp8 vs bf16: memory +%.4g s (hand %.4g), launches +%.0f (hand %.0f), "
                  "optimizer +%.4g s (hand %.4g)\n", B, T, et[1].mem - et[0].mem, qbytes / (bw * 0.70),
                  et[1].launches - et[0].launches, Lq * 15, et[1].optimizer - et[0].optimizer, opt);
    assert_true(fabs((et[1].mem - et[0].mem) / (qbytes / (bw * 0.70)) - 1) < 1e-9);
    assert_true(et[1].launches - et[0].launches == Lq * (4 + 7 + 4));
    assert_true(fabs((et[1].optimizer - et[0].optimizer) / opt - 1) < 1e-9);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_engine_time_hand_count(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = one_gpu(ctx);
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x77);
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(ctx, "gpt2-tiny", &cfg), DW_OK);
    const double B = (double)(1 + dw_test_next(&rng) % 4), T = (double)(16 << (dw_test_next(&rng) % 4));
    dw_job j = {.seq = (int64_t)T, .global_batch = (int64_t)B};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    dw_engine_time et;
    assert_int_equal(dw_plan_engine_time(ctx, &in, (int64_t)B, DW_RECOMPUTE_NONE, &et), DW_OK);
    const double d = (double)cfg.d_model, f = (double)cfg.d_ff, V = (double)cfg.vocab_size, L = (double)cfg.n_layers;
    const double H = (double)cfg.n_heads, D = (double)cfg.head_dim, N = B * T;
    const double peak = hw->gpus[0].peak_bf16_tflops * 1e12, bw = hw->gpus[0].hbm_gbps * 1e9;
    /* GEMMs: 3 per linear (fprop N x M x K, dgrad N x K x M, wgrad M x K x N) */
    const double lin[5][2] = {{d, 3 * d}, {d, d}, {d, f}, {f, d}, {d, V}}; /* (K, M); the last is the head */
    double flops = 0, tg = 0;
    for (int i = 0; i < 5; i++) {
        double K = lin[i][0], M = lin[i][1], reps = i < 4 ? L : 1, fl = 2 * N * K * M;
        flops += reps * 3 * fl;
        tg += reps * fl * (1 / dw_plan_gemm_rate(&in, DW_RECIPE_BF16, N, M, K) + 1 / dw_plan_gemm_rate(&in, DW_RECIPE_BF16, N, K, M) +
                           1 / dw_plan_gemm_rate(&in, DW_RECIPE_BF16, M, K, N));
    }
    /* attention: causal 4 B T (T/2) D H forward, 2.5x backward, at 0.40 / 0.32 of peak x T/(T+256) */
    const double af = 4 * B * T * (T / 2) * D * H, shape = T / (T + 256);
    const double ta = L * (af / (peak * 0.40 * shape) + 2.5 * af / (peak * 0.32 * shape));
    flops += L * 3.5 * af;
    /* memory-bound passes of 2-byte elements, forward / backward (docs/planner.md); the GELU
     * costs none: it runs in c_fc's and c_proj's GEMM epilogues (compile/fuse.c), and neither do
     * the bias gradients: they come out of the BF16 wgrad's epilogue */
    const double fwd_el = 2 * d + 3 * d + L * (2 * (2 * d) + 2 * (3 * d)) + 2 * d + 3 * V;
    const double bwd_el = 5 * d + 3 * d + L * (2 * (5 * d) + 2 * (4 * d)) + 5 * d;
    const double tm = N * 2 * (fwd_el + bwd_el) / (bw * 0.70);
    print_message("gpt2-tiny B %.0f T %.0f: gemm %.4g s (hand %.4g), attention %.4g (%.4g), memory %.4g (%.4g)\n", B,
                  T, et.gemm, tg, et.attn, ta, et.mem, tm);
    assert_true(fabs(et.flops / flops - 1) < 1e-12);
    assert_true(fabs(et.gemm / tg - 1) < 1e-12);
    assert_true(fabs(et.attn / ta - 1) < 1e-12);
    assert_true(fabs(et.mem / tm - 1) < 1e-12);
    /* launches per block: forward ln_1, c_attn, attention, c_proj, add, ln_2, c_fc, (GELU fused),
     * c_proj, add = 9; backward norms 1 each, adds 1 each, attention 2, each biased linear dgrad +
     * wgrad + the bias-gradient add = 3 each: 18; around them embedding, position, ln_f, the LM
     * head (1 / 2: no bias) and cross-entropy (forward only): 5 / 5. 6 us each, 50 us a micro-batch */
    const double launches = L * (9 + 18) + 10;
    assert_true(et.launches == launches);
    assert_true(fabs(et.overhead / (launches * 6e-6 + 50e-6) - 1) < 1e-12);
    assert_true(fabs((et.fwd + et.bwd) / (et.gemm + et.attn + et.mem + et.overhead) - 1) < 1e-12);
    /* AdamW: 34 bytes per padded parameter float at 0.85 of HBM bandwidth */
    int64_t pools[DW_POOL_COUNT];
    compiled_pools(ctx, &cfg, (int64_t)B, (int64_t)T, "bf16", false, pools); /* the gradient pool: its floats */
    assert_true(fabs(et.optimizer / ((double)pools[DW_POOL_GRADS] / 4 * 34 / (bw * 0.85)) - 1) < 1e-12);
    /* the search's step for this one-GPU job: grad_accum x (fwd + bwd) + AdamW */
    dw_par p = {.dp = 1, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = (int64_t)B, .grad_accum = 1};
    dw_plan_entry e;
    dw_plan_time(&in, &p, &e, NULL);
    assert_true(fabs(e.cost.step / (et.fwd + et.bwd + et.optimizer) - 1) < 1e-9);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

/* On one GPU the search plans for the engine: every returned plan is one it runs, the others are
 * counted under their own reason, and the accounting still adds up. */
static void test_search_plans_for_the_engine(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = one_gpu(ctx);
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x99);
    static const char *const models[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "gpt2-124m"};
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(ctx, models[dw_test_next(&rng) % 4], &cfg), DW_OK);
    dw_job j = {.seq = 64 << (dw_test_next(&rng) % 3), .global_batch = 1 + (int64_t)(dw_test_next(&rng) % 24),
                .recipe = dw_plan_recipes[dw_test_next(&rng) % DW_PLAN_RECIPES]};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    dw_plan_result r;
    assert_int_equal(dw_plan_search(ctx, &in, 5, &r), DW_OK);
    assert_true(r.n_plans >= 1);
    for (int i = 0; i < r.n_plans; i++) {
        char why[300];
        assert_true(dw_plan_engine_runnable(&in, &r.plans[i].par, why, sizeof why));
        assert_int_equal(dw_plan_check(&in, &r.plans[i].par, NULL, 0), 0);
        dw_engine_mem em; /* one micro-batch a step (ZeRO 0 on one GPU): the arenas, as train runs it */
        const bool arenas = r.plans[i].par.grad_accum == 1;
        if (arenas) setenv("DW_GRAD_ARENA", "1", 1), setenv("DW_BF16_ARENA", "1", 1);
        assert_int_equal(dw_plan_engine_memory(ctx, &in, r.plans[i].par.micro_batch, (int)r.plans[i].par.recompute, &em), DW_OK);
        unsetenv("DW_GRAD_ARENA"), unsetenv("DW_BF16_ARENA");
        assert_true(r.plans[i].mem.total == (double)em.total);
    }
    assert_true(r.rej.count[DW_REJECT_ENGINE] > 0);
    int64_t rejected = 0;
    for (int k = 0; k < DW_REJECT_COUNT; k++) rejected += r.rej.count[k];
    assert_true(r.evaluated == rejected + r.feasible - r.rej.count[DW_REJECT_DOMINATED]);
    dw_plan_result_free(&r);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

/* Data parallelism as the runtime runs it (train/dp.c, dp_overlap.c, dp_stage.c), on a random
 * engine-built model, dp and micro-batches: memory per rank is the one-GPU engine's but for
 * ZeRO-1/2's optimizer pool, the largest rank's shard of it, and ZeRO-2's gradients, that shard's
 * plus the staging slots; the step is the one-GPU compute (its launches eager: the overlapped
 * runtime replays no recorded step, test_plan_zero3_launch.c) plus the exposed collectives (4 bytes a parameter)
 * plus the AdamW, whole under ZeRO-0 and a 1/dp shard under ZeRO-1/2. Without overlap every
 * collective is exposed; with it, at most one backward's worth is hidden per reduction, never the
 * last bucket nor ZeRO-1/2's all-gather; ZeRO-2 repeats ZeRO-1's reduction per micro-batch. The
 * search ranks such plans ahead of faster-priced ones the runtime cannot run. */
static void test_data_parallel_runtime(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0xD9);
    dw_model_config cfg;
    int dp;
    dw_hw *hw = plan_random_dp(ctx, &rng, &cfg, &dp);
    const int64_t mb = 1 + (int64_t)(dw_test_next(&rng) % 4), ga = 1 + (int64_t)(dw_test_next(&rng) % 3);
    dw_job j = {.seq = 64 << (dw_test_next(&rng) % 3), .global_batch = dp * mb * ga};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    assert_true(in.engine_model);
    dw_engine_mem ep, ea; /* the pools; the arenas, as train runs one micro-batch a step under ZeRO 0/1 */
    dw_engine_time et;
    assert_int_equal(dw_plan_engine_memory(ctx, &in, mb, DW_RECOMPUTE_NONE, &ep), DW_OK);
    setenv("DW_GRAD_ARENA", "1", 1), setenv("DW_BF16_ARENA", "1", 1);
    assert_int_equal(dw_plan_engine_memory(ctx, &in, mb, DW_RECOMPUTE_NONE, &ea), DW_OK);
    unsetenv("DW_GRAD_ARENA"), unsetenv("DW_BF16_ARENA");
    const dw_par eager = {.dp = dp, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = mb, .grad_accum = ga};
    assert_int_equal(dw_plan_engine_time_par(ctx, &in, &eager, &et), DW_OK); /* overlapped: launches eager */
    dw_param_counts pc;
    dw_plan_params(&in, &pc);
    const double bytes = 4 * pc.total, ag = dw_plan_coll_time(hw, DW_COLL_ALLGATHER, dp, 1, bytes);
    double all[3];
    for (int z = 0; z <= 2; z++) {
        dw_par p = {.dp = dp, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = mb, .grad_accum = ga,
                    .zero = z};
        dw_plan_entry e;
        dw_reject why;
        char det[200];
        assert_true(dw_plan_evaluate(&in, &p, true, &e, &why, det, sizeof det));
        assert_true(e.runs);
        /* ZeRO-1/2: each rank's moments of its shard alone, the last (largest) rank's: 64-float blocks of
         * floats / dp rounded down, the last rank's holding the rest */
        const dw_engine_mem em = ga == 1 && z < 2 ? ea : ep;
        const int64_t floats = em.pool[2] / 8, block = floats / (dp * 64) * 64;
        const int64_t opt = z ? 8 * (floats - (dp - 1) * block) : em.pool[2];
        int64_t grads = em.pool[1], stage = 0; /* ZeRO-2: the shard's gradients + the staging slots */
        if (z == 2) assert_int_equal(dw_plan_engine_grad_stage(ctx, &in, &p, &stage), DW_OK);
        if (z == 2) grads = 4 * (floats - (dp - 1) * block) + stage;
        if (z == 2) assert_true(stage > 0);
        assert_true(e.mem.total == (double)(em.total - em.pool[2] + opt - em.pool[1] + grads) &&
                    e.mem.optimizer == (double)opt && e.mem.grads == (double)grads);
        if (z) assert_true(opt * dp >= em.pool[2] && opt * dp < em.pool[2] + 8 * 64 * dp * dp);
        assert_true(fabs(e.cost.compute / ((double)ga * (et.fwd + et.bwd)) - 1) < 1e-9);
        const double opt_s = z == 0 ? et.optimizer : et.optimizer / dp;
        assert_true(fabs(e.cost.optimizer / opt_s - 1) < 1e-12);
        assert_true(fabs(e.cost.step / (e.cost.pipeline + e.cost.dp_exposed + e.cost.optimizer) - 1) < 1e-12);
        /* the search's figures are the overlapped runtime's, with one micro-batch's backward */
        double a1, x1, o1, a0, x0, o0, aw, xw, ow, ai, xi, oi;
        dw_plan_runtime_dp(&in, &p, et.optimizer, et.bwd, true, &a1, &x1, &o1);
        assert_true(e.cost.dp_comm == a1 && e.cost.dp_exposed == x1);
        dw_plan_runtime_dp(&in, &p, et.optimizer, et.bwd, false, &a0, &x0, &o0);
        assert_true(a0 == a1 && x0 == a0 && o0 == o1 && a0 > 0);
        assert_true(x1 <= x0 && a0 - x1 <= (z == 2 ? (double)ga : 1.0) * et.bwd * (1 + 1e-12));
        dw_plan_runtime_dp(&in, &p, et.optimizer, 0, true, &aw, &xw, &ow);
        assert_true(xw == aw); /* nothing to hide under */
        dw_plan_runtime_dp(&in, &p, et.optimizer, 1e9, true, &ai, &xi, &oi);
        /* the last bucket (and the all-gather) stay exposed; one bucket in all hides nothing */
        assert_true(xi > 0 && xi <= ai && (bytes <= 4.0 * (double)dw_grad_bucket_default(z) || xi < ai));
        if (z) assert_true(xi > ag * (1 - 1e-12));
        if (z == 0) assert_true(a0 >= dw_plan_coll_time(hw, DW_COLL_ALLREDUCE, dp, 1, bytes) * (1 - 1e-12));
        all[z] = a0;
    }
    /* ZeRO-2 reduces on every micro-batch what ZeRO-1 reduces once: the same when both cut one bucket,
     * more when ZeRO-2's smaller buckets (grad_stage.h) pay more latencies */
    if (bytes <= 4.0 * DW_GRAD_BUCKET_FLOATS) assert_true(fabs(all[2] - ag - (double)ga * (all[1] - ag)) <= 1e-9 * all[2]);
    else assert_true(all[2] - ag >= (double)ga * (all[1] - ag) * (1 - 1e-9));
    /* the search: every kept plan the runtime runs comes before every one it does not */
    dw_plan_result r;
    assert_int_equal(dw_plan_search(ctx, &in, 8, &r), DW_OK);
    assert_true(r.n_plans >= 1 && r.plans[0].runs);
    for (int i = 1; i < r.n_plans; i++) assert_true(r.plans[i - 1].runs || !r.plans[i].runs);
    dw_plan_result_free(&r);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

/* A --ep plan the runtime runs (tp = pp = cp = 1): the engine's whole program on every rank, eager,
 * plus per MoE layer the row all-to-alls and gathers; its compute is the same plan's at ep 1 (the
 * same eager engine) plus at least those all-to-alls, and its memory carries the buffers. */
static void test_expert_parallel_runtime(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(ctx, "mixtral-tiny", &cfg), DW_OK);
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    const int dp = (int)hw->n_gpus;
    dw_job j = {.seq = 64, .global_batch = dp * 2};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    assert_true(in.engine_model);
    for (int ep = 2; ep <= 4; ep *= 2) {
        const dw_par p = {.dp = dp, .tp = 1, .pp = 1, .cp = 1, .ep = ep, .vpp = 1, .micro_batch = 2, .grad_accum = 1};
        dw_par p1 = p;
        p1.ep = 1;
        dw_plan_entry e, e1;
        dw_reject why;
        char det[200];
        assert_true(dw_plan_evaluate(&in, &p, true, &e, &why, det, sizeof det));
        assert_true(dw_plan_evaluate(&in, &p1, true, &e1, &why, det, sizeof det));
        assert_true(e.cost.ep_comm > 0 && e.mem.ep_buffers > 0);
        if (!(e.cost.compute >= (e1.cost.compute + e.cost.ep_comm) * (1 - 1e-12)))
            fail_msg("ep %d: compute %.6g s, the plan at ep 1 %.6g s + all-to-alls %.6g s", ep, e.cost.compute,
                     e1.cost.compute, e.cost.ep_comm);
        assert_true(e.cost.optimizer == e1.cost.optimizer); /* every rank steps the whole model */
    }
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_equals_compiled_pools),
        cmocka_unit_test(test_not_runnable_reasons),
        cmocka_unit_test(test_engine_time_hand_count),
        cmocka_unit_test(test_engine_time_quantised),
        cmocka_unit_test(test_search_plans_for_the_engine),
        cmocka_unit_test(test_data_parallel_runtime),
        cmocka_unit_test(test_expert_parallel_runtime),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
