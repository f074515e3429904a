/* model_presets.c — built-in model shapes: tiny models that train in minutes on a CPU, real
 * shapes (gpt2-124m, llama-1b) and planning-only shapes (8B..405B, MoE) the planner sizes but
 * capture refuses. Figures follow the published config.json of each model; not a loader. */
#include <stdio.h>
#include <string.h>

#include "capture/model_config_impl.h"
#include "core/error.h"

/* Fields common to each family; presets override the shape. */
static dw_model_config gpt2_base(void) {
    dw_model_config c = {0};
    snprintf(c.model_type, sizeof c.model_type, "gpt2");
    c.arch = DW_ARCH_GPT2;
    c.act = DW_ACT_GELU_TANH;
    c.norm = DW_NORM_LAYERNORM;
    c.pos = DW_POS_LEARNED;
    c.norm_eps = 1e-5;
    c.rope_theta = 0;
    c.tie_embeddings = true;
    c.qkv_bias = true;
    c.linear_bias = true;
    c.mlp_bias = true;
    c.init_std = 0.02;
    return c;
}

static dw_model_config llama_base(const char *model_type, dw_arch arch) {
    dw_model_config c = {0};
    snprintf(c.model_type, sizeof c.model_type, "%s", model_type);
    c.arch = arch;
    c.act = DW_ACT_SILU_GLU;
    c.norm = DW_NORM_RMSNORM;
    c.pos = DW_POS_ROPE;
    c.norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.init_std = 0.02;
    return c;
}

static void shape(dw_model_config *c, int64_t V, int64_t d, int64_t L, int64_t H, int64_t Hkv,
                  int64_t F, int64_t maxT) {
    c->vocab_size = V;
    c->d_model = d;
    c->n_layers = L;
    c->n_heads = H;
    c->n_kv_heads = Hkv;
    c->head_dim = d / H;
    c->d_ff = F;
    c->max_seq = maxT;
}

typedef dw_model_config (*preset_fn)(void);

static dw_model_config p_gpt2_tiny(void) {
    dw_model_config c = gpt2_base();
    shape(&c, 256, 128, 4, 4, 4, 512, 256);
    return c;
}
static dw_model_config p_gpt2_124m(void) {
    dw_model_config c = gpt2_base();
    shape(&c, 50257, 768, 12, 12, 12, 3072, 1024);
    return c;
}
static dw_model_config p_llama_tiny(void) {
    dw_model_config c = llama_base("llama", DW_ARCH_LLAMA);
    shape(&c, 256, 128, 4, 4, 2, 384, 256);
    return c;
}
static dw_model_config p_llama_1b(void) { /* Llama-3.2-1B, with its llama3 rope_scaling */
    dw_model_config c = llama_base("llama", DW_ARCH_LLAMA);
    shape(&c, 128256, 2048, 16, 32, 8, 8192, 131072);
    c.rope_theta = 500000.0;
    c.rope_scaling = (dw_rope_scaling){.type = DW_ROPE_LLAMA3, .factor = 32.0, .low_freq_factor = 1.0,
                                       .high_freq_factor = 4.0, .original_max = 8192};
    c.tie_embeddings = true;
    return c;
}
static dw_model_config p_qwen2_tiny(void) {
    dw_model_config c = llama_base("qwen2", DW_ARCH_QWEN2);
    shape(&c, 256, 128, 4, 4, 2, 384, 256);
    c.norm_eps = 1e-6;
    c.rope_theta = 1000000.0;
    c.qkv_bias = true;
    c.tie_embeddings = true;
    return c;
}
static dw_model_config p_llama_8b(void) { /* Llama-3.1-8B */
    dw_model_config c = llama_base("llama", DW_ARCH_LLAMA);
    shape(&c, 128256, 4096, 32, 32, 8, 14336, 131072);
    c.rope_theta = 500000.0;
    c.planning_only = true;
    return c;
}
static dw_model_config p_llama_70b(void) { /* Llama-3.1-70B */
    dw_model_config c = llama_base("llama", DW_ARCH_LLAMA);
    shape(&c, 128256, 8192, 80, 64, 8, 28672, 131072);
    c.rope_theta = 500000.0;
    c.planning_only = true;
    return c;
}
static dw_model_config p_llama_405b(void) { /* Llama-3.1-405B */
    dw_model_config c = llama_base("llama", DW_ARCH_LLAMA);
    shape(&c, 128256, 16384, 126, 128, 8, 53248, 131072);
    c.rope_theta = 500000.0;
    c.planning_only = true;
    return c;
}
static dw_model_config mixtral_base(int64_t E, int64_t K) {
    dw_model_config c = llama_base("mixtral", DW_ARCH_MIXTRAL);
    c.n_experts = E, c.top_k = K, c.norm_topk = true, c.router_aux_loss_coef = 0.001;
    c.aux_loss = true; /* trained as transformers trains it: output_router_logits */
    return c;
}
static dw_model_config p_mixtral_8x7b(void) { /* Mixtral-8x7B-v0.1: every layer is MoE */
    dw_model_config c = mixtral_base(8, 2);
    shape(&c, 32000, 4096, 32, 32, 8, 14336, 32768);
    c.rope_theta = 1000000.0;
    c.d_ff_expert = 14336;
    c.planning_only = true;
    return c;
}
/* A tiny Mixtral that trains on the built-in data on a CPU: 4 experts of 128, top 2. */
static dw_model_config p_mixtral_tiny(void) {
    dw_model_config c = mixtral_base(4, 2);
    shape(&c, 256, 64, 2, 4, 2, 128, 256);
    c.d_ff_expert = 128;
    return c;
}
/* A tiny fine-grained OLMoE for CI: 8 experts of 32, top 4, not renormalised, q/k norms. */
static dw_model_config p_olmoe_tiny(void) {
    dw_model_config c = llama_base("olmoe", DW_ARCH_OLMOE);
    shape(&c, 256, 64, 2, 4, 4, 32, 256);
    c.n_experts = 8, c.top_k = 4, c.d_ff_expert = 32, c.norm_topk = false, c.qk_norm = true;
    c.router_aux_loss_coef = 0.01, c.aux_loss = true;
    return c;
}
/* The Qwen MoE families' tiny shape for CI: vocab 256, d 64, L layers, 4 heads (2 KV), dense MLPs
 * of 96, 8 experts of 32, top K, renormalised or not, every step-th layer MoE. */
static dw_model_config qwen_moe_tiny(const char *type, dw_arch arch, int64_t L, int64_t K, bool norm_topk,
                                     int64_t step) {
    dw_model_config c = llama_base(type, arch);
    shape(&c, 256, 64, L, 4, 2, 96, 256);
    c.norm_eps = 1e-6;
    c.n_experts = 8, c.top_k = K, c.d_ff_expert = 32, c.norm_topk = norm_topk, c.router_aux_loss_coef = 0.001;
    c.aux_loss = true;
    c.sparse_step = step;
    return c;
}
/* A tiny Qwen2-MoE: 3 layers, layer 1 dense (mlp_only_layers [1]), the others top 4 not
 * renormalised with a gated shared expert of 48; q, k, v biases. */
static dw_model_config p_qwen2_moe_tiny(void) {
    dw_model_config c = qwen_moe_tiny("qwen2_moe", DW_ARCH_QWEN2_MOE, 3, 4, false, 1);
    c.d_ff_shared = 48, c.shared_gate = true, c.qkv_bias = true;
    c.mlp_only[0] = (uint64_t)1 << 1;
    return c;
}
/* A tiny Qwen3-MoE for CI: 2 layers, decoder_sparse_step 2 (layer 0 dense of 96, layer 1 8 experts
 * of 32, top 2 renormalised), explicit head_dim 24 (4 x 24 != 64), per-head q/k norms. */
static dw_model_config p_qwen3_moe_tiny(void) {
    dw_model_config c = qwen_moe_tiny("qwen3_moe", DW_ARCH_QWEN3_MOE, 2, 2, true, 2);
    c.head_dim = 24, c.qk_norm_heads = true;
    return c;
}
/* moe-e8, Mixtral-like, for benchmarks: 8 experts of 5632, top 2, 2,446,493,696 parameters. */
static dw_model_config p_moe_e8(void) {
    dw_model_config c = mixtral_base(8, 2);
    shape(&c, 32000, 2048, 8, 16, 8, 5632, 4096);
    c.d_ff_expert = 5632;
    return c;
}
/* moe-e64, OLMoE-like (fine-grained) for benchmarks: 6 layers of 2048, 16 heads, 64 experts of 1024,
 * top 8 not renormalised, untied, without OLMoE's q/k norms: 2,723,440,640 parameters. OLMoE's
 * config.json has no key for leaving the norms out: this shape is a preset, not a Hugging Face model. */
static dw_model_config p_moe_e64(void) {
    dw_model_config c = llama_base("olmoe", DW_ARCH_OLMOE);
    shape(&c, 50304, 2048, 6, 16, 16, 1024, 4096);
    c.n_experts = 64, c.top_k = 8, c.d_ff_expert = 1024, c.norm_topk = false, c.router_aux_loss_coef = 0.01;
    c.aux_loss = true;
    return c;
}
/* DeepSeek-V3 (its config.json; src/capture/model_config_mla.c reads one): multi-head latent
 * attention (q rank 1536, kv rank 512, heads of 128 + 64 RoPE channels, values of 128); 3 dense
 * layers then 256 routed experts (top 8 of 4 groups out of 8, router bias) + 1 shared expert;
 * 671,026,419,200 parameters without the multi-token-prediction module. */
static dw_model_config p_deepseek_v3(void) {
    dw_model_config c = llama_base("deepseek_v3", DW_ARCH_DEEPSEEK_V3);
    shape(&c, 129280, 7168, 61, 128, 128, 18432, 163840);
    c.head_dim = 192;
    c.mla = (dw_mla_dims){.q_lora_rank = 1536, .kv_lora_rank = 512, .qk_nope_head_dim = 128,
                          .qk_rope_head_dim = 64, .v_head_dim = 128};
    c.route = (dw_group_routing){.n_group = 8, .topk_group = 4, .sigmoid = true, .routed_scale = 2.5,
                                 .expert_bias = true, .n_mtp_layers = 1};
    c.norm_topk = true;
    c.norm_eps = 1e-6;
    c.n_experts = 256;
    c.top_k = 8;
    c.d_ff_expert = 2048;
    c.n_shared_experts = 1;
    c.first_dense_layers = 3;
    c.planning_only = true;
    return c;
}

static const struct {
    const char *name;
    preset_fn fn;
} presets[] = {
    {"gpt2-tiny", p_gpt2_tiny},       {"gpt2-124m", p_gpt2_124m},     {"llama-tiny", p_llama_tiny},
    {"llama-1b", p_llama_1b},         {"qwen2-tiny", p_qwen2_tiny},   {"llama-8b", p_llama_8b},
    {"llama-70b", p_llama_70b},       {"llama-405b", p_llama_405b},   {"mixtral-8x7b", p_mixtral_8x7b},
    {"mixtral-tiny", p_mixtral_tiny}, {"moe-e8", p_moe_e8},         {"moe-e64", p_moe_e64},
    {"olmoe-tiny", p_olmoe_tiny},     {"qwen2-moe-tiny", p_qwen2_moe_tiny}, {"qwen3-moe-tiny", p_qwen3_moe_tiny},
    {"deepseek-v3", p_deepseek_v3},
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

int dw_model_preset_count(void) { return N_PRESETS; }

const char *dw_model_preset_name(int i) { return i >= 0 && i < N_PRESETS ? presets[i].name : NULL; }

bool dw_model_preset_find(const char *name, dw_model_config *out) {
    for (int i = 0; i < N_PRESETS; i++)
        if (!strcmp(presets[i].name, name)) {
            *out = presets[i].fn();
            return true;
        }
    return false;
}

void dw_model_preset_list(char *buf, size_t n) {
    buf[0] = '\0';
    for (int i = 0; i < N_PRESETS; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s", i ? ", " : "", presets[i].name);
    }
}
