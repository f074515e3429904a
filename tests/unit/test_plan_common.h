/* test_plan_common.h — helpers shared by the planner tests: a CPU context, hand-built model
 * configs, a DGX A100 machine (not a preset: Megatron-LM's published runs used it), a random
 * data-parallel machine for an engine-built model. */
#ifndef DW_TEST_PLAN_COMMON_H
#define DW_TEST_PLAN_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/model_config.h"
#include "plan/plan.h"
#include "testutil.h"

static inline dw_ctx *plan_ctx(void) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    if (dw_ctx_create(&o, &ctx) != DW_OK) return NULL;
    return ctx;
}

/* A hardware preset; aborts the test (non-zero exit) when the preset cannot be built. */
static inline dw_hw *plan_preset(dw_ctx *ctx, const char *name, int nodes) {
    dw_hw *hw = NULL;
    if (dw_hw_preset(ctx, name, nodes, &hw) != DW_OK) {
        fprintf(stderr, "preset %s x %d: %s\n", name, nodes, dw_errmsg(ctx));
        abort();
    }
    return hw;
}

/* A random engine-built model (gpt2-tiny, llama-tiny, qwen2-tiny or gpt2-124m) into *cfg, and an
 * H200 machine of *dp GPUs (2, 4 or 8) in one NVLink domain, drawn in that order from rng. */
static inline dw_hw *plan_random_dp(dw_ctx *ctx, dw_test_rng *rng, dw_model_config *cfg, int *dp) {
    static const char *const models[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "gpt2-124m"};
    if (dw_model_config_load(ctx, models[dw_test_next(rng) % 4], cfg) != DW_OK) {
        fprintf(stderr, "model config: %s\n", dw_errmsg(ctx));
        abort();
    }
    *dp = 2 << (dw_test_next(rng) % 3);
    dw_hw *hw = plan_preset(ctx, "h200", 1);
    hw->n_gpus = *dp, hw->nvlink_domain = *dp;
    return hw;
}

/* A random data-parallel job on plan_random_dp's machine, drawn after it from rng: micro-batch
 * 1-3, accumulation 1-3, recompute none or full, seq 64, 128 or 256, global batch dp x mb x ga;
 * in planned for it (in.cfg and in.hw point into t: keep t in place). Free t->hw. */
typedef struct {
    dw_model_config cfg;
    dw_hw *hw;
    int dp, rc;
    int64_t mb, ga;
    dw_job job;
    dw_plan_in in;
} plan_dp_job;
static inline void plan_random_dp_job(dw_ctx *ctx, dw_test_rng *rng, plan_dp_job *t) {
    memset(t, 0, sizeof *t);
    t->hw = plan_random_dp(ctx, rng, &t->cfg, &t->dp);
    t->mb = 1 + (int64_t)(dw_test_next(rng) % 3), t->ga = 1 + (int64_t)(dw_test_next(rng) % 3);
    t->rc = dw_test_next(rng) % 2 ? DW_RECOMPUTE_FULL : DW_RECOMPUTE_NONE;
    t->job = (dw_job){.seq = 64 << (dw_test_next(rng) % 3), .global_batch = t->dp * t->mb * t->ga};
    if (dw_plan_in_init(ctx, &t->cfg, t->hw, &t->job, NULL, &t->in) != DW_OK || !t->in.engine_model) {
        fprintf(stderr, "plan input: %s\n", dw_errmsg(ctx));
        abort();
    }
}

/* A GPT (Megatron-LM 2021 style): GELU MLP 4h, LayerNorm, learned positions, biases, tied. */
static inline dw_model_config plan_gpt(int64_t V, int64_t d, int64_t L, int64_t H, int64_t maxT) {
    dw_model_config c;
    memset(&c, 0, sizeof c);
    strcpy(c.model_type, "gpt2");
    c.arch = DW_ARCH_GPT2;
    c.vocab_size = V, c.d_model = d, c.n_layers = L, c.n_heads = H, c.n_kv_heads = H;
    c.head_dim = d / H, c.d_ff = 4 * d, c.max_seq = maxT;
    c.act = DW_ACT_GELU_TANH, c.norm = DW_NORM_LAYERNORM, c.pos = DW_POS_LEARNED;
    c.tie_embeddings = true, c.qkv_bias = true, c.linear_bias = true, c.mlp_bias = true;
    return c;
}

/* A Llama (SwiGLU, RMSNorm, RoPE, untied, no biases). */
static inline dw_model_config plan_llama(int64_t V, int64_t d, int64_t L, int64_t H, int64_t Hkv, int64_t ff) {
    dw_model_config c;
    memset(&c, 0, sizeof c);
    strcpy(c.model_type, "llama");
    c.arch = DW_ARCH_LLAMA;
    c.vocab_size = V, c.d_model = d, c.n_layers = L, c.n_heads = H, c.n_kv_heads = Hkv;
    c.head_dim = d / H, c.d_ff = ff, c.max_seq = 8192;
    c.act = DW_ACT_SILU_GLU, c.norm = DW_NORM_RMSNORM, c.pos = DW_POS_ROPE;
    return c;
}

/* DGX A100 80GB (Selene): 8 GPUs, 312 TFLOP/s dense BF16, 2039 GB/s HBM2e, NVLink 3 at
 * 300 GB/s per direction, 8 x 200 Gb/s HDR InfiniBand per node = 25 GB/s per GPU. */
static inline dw_hw *plan_dgx_a100(int nodes) {
    dw_hw *hw = dw_hw_alloc(8);
    if (!hw) return NULL;
    strcpy(hw->source, "file");
    hw->nodes = nodes;
    hw->nvlink_gbps = 300;
    hw->nvlink_domain = 8;
    hw->internode_gbps = 25;
    for (int i = 0; i < 8; i++) {
        dw_gpu_info *g = &hw->gpus[i];
        strcpy(g->name, "NVIDIA A100-SXM4-80GB");
        g->cc_major = 8, g->cc_minor = 0, g->sms = 108;
        g->hbm_bytes = 81920ULL * 1024 * 1024; /* nvidia-smi: 81920 MiB */
        g->peak_bf16_tflops = 312;
        g->hbm_gbps = 2039;
        dw_gpu_derive_features(g);
    }
    return hw;
}

#endif
