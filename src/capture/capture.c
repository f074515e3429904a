/* capture.c — model config -> graph IR, one block_<family> template per family of archs.def:
 * GPT-2 (learned positions, LayerNorm, packed c_attn, GELU MLP), the Llama family (RoPE,
 * RMSNorm, q/k/v/o projections with GQA, SwiGLU MLP), Mixtral and OLMoE (the Llama attention with a
 * mixture of SwiGLU experts), Qwen2-/Qwen3-MoE (MoE or dense layers, a gated shared expert,
 * per-head q/k norms), Qwen3 (Llama with per-head q/k norms), Gemma 2 (scaled embeddings, (1 + w)
 * norms around attention and MLP, GeGLU, soft-capped scores and logits) and Phi-3 (Llama); sliding
 * windows on the attention of the layers the config windows. Parameter tensors carry the Hugging Face
 * weight names and the reference initialisation; nodes the HF module names and their block. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "capture/capture.h"
#include "capture/model_config_impl.h"
#include "core/error.h"
#include "core/json.h"
#include "deepwell.h"

typedef struct {
    dw_ctx *ctx;
    dw_graph *g;
    const dw_model_config *c;
    dw_status st; /* first failure */
    int aux_sums, aux_counts; /* the load-balancing statistics of the MoE layers so far (-1: none yet) */
} builder;

/* A parameter tensor named printf-style; shape (d0[, d1]). */
static int param(builder *b, int64_t d0, int64_t d1, const char *fmt, ...) DW_PRINTF(4, 5);
static int param(builder *b, int64_t d0, int64_t d1, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t shape[2] = {d0, d1};
    int t = dw_graph_add_tensor(b->g, name, DW_TENSOR_PARAM, DW_IR_F32, d1 ? 2 : 1, shape);
    if (t < 0) {
        if (b->st == DW_OK) b->st = dw_set_error(b->ctx, DW_ERR_NOMEM, "capture: out of memory adding '%s'", name);
        return t;
    }
    /* as the Hugging Face reference initialises: matrices normal(0, initializer_range), GPT-2's
     * residual projections (c_proj) scaled by 1/sqrt(2 n_layer); norm weights 1 (Gemma's, applied
     * as 1 + w: 0), biases 0 */
    dw_ir_tensor *p = &b->g->tensors[t];
    size_t len = strlen(name);
    if (d1) {
        p->init = DW_INIT_NORMAL;
        p->init_std = b->c->init_std;
        if (b->c->arch == DW_ARCH_GPT2 && len >= 13 && !strcmp(name + len - 13, "c_proj.weight"))
            p->init_std /= sqrt(2.0 * (double)b->c->n_layers);
    } else {
        const bool bias = len >= 5 && !strcmp(name + len - 5, ".bias");
        p->init = bias || b->c->norm_offset ? DW_INIT_ZEROS : DW_INIT_ONES;
    }
    return t;
}

/* A stack of E matrices (E, d0, d1) named `name`, initialised as the model's matrices (the expert
 * weights: gate and up (E, F, C), down (E, C, F)). */
static int param3(builder *b, int64_t E, int64_t d0, int64_t d1, const char *name) {
    const int64_t shape[3] = {E, d0, d1};
    int t = dw_graph_add_tensor(b->g, name, DW_TENSOR_PARAM, DW_IR_F32, 3, shape);
    if (t < 0) {
        if (b->st == DW_OK) b->st = dw_set_error(b->ctx, DW_ERR_NOMEM, "capture: out of memory adding '%s'", name);
        return t;
    }
    b->g->tensors[t].init = DW_INIT_NORMAL;
    b->g->tensors[t].init_std = b->c->init_std;
    return t;
}

/* A node of several outputs named `name` + suffixes[k]; their indices into outs. */
static void node_outs(builder *b, dw_op op, const char *name, const int *in, int n_in, const dw_ir_attrs *attrs,
                      const char *const *suffixes, int *outs) {
    char names[DW_IR_MAX_OUTPUTS][160];
    const char *np[DW_IR_MAX_OUTPUTS];
    for (int k = 0; k < dw_op_outputs(op); k++) {
        snprintf(names[k], sizeof names[k], "%s%s", name, suffixes[k]);
        np[k] = names[k];
        outs[k] = -1;
    }
    if (b->st != DW_OK) return;
    b->st = dw_graph_add_node_outs(b->ctx, b->g, op, name, in, n_in, attrs, np, outs);
}

/* A node named `name` (its output activation has the same name). */
static int node(builder *b, dw_op op, const char *name, int a0, int a1, int a2,
                const dw_ir_attrs *attrs) {
    if (b->st != DW_OK) return -1;
    int in[3] = {a0, a1, a2};
    int n = a2 >= 0 ? 3 : a1 >= 0 ? 2 : 1;
    int t = dw_graph_add_node(b->ctx, b->g, op, name, in, n, attrs, name);
    if (t < 0) b->st = DW_ERR_INVALID; /* message set by inference (names the node) */
    return t;
}

/* linear `<name>` with weight `<name>.weight` (out x in) and optional bias `<name>.bias`. */
static int linear(builder *b, const char *name, int x, int64_t in, int64_t out, bool bias,
                  bool hf_transposed) {
    int w = param(b, out, in, "%s.weight", name);
    if (w >= 0) b->g->tensors[w].hf_transposed = hf_transposed;
    int bi = bias ? param(b, out, 0, "%s.bias", name) : -1;
    return node(b, DW_OP_LINEAR, name, x, w, bi, NULL);
}

/* The model's norm over the last dimension of x, width wide (the residual stream's: d_model). */
static int norm_w(builder *b, const char *name, int x, int64_t width) {
    const dw_model_config *c = b->c;
    dw_ir_attrs a = {.eps = c->norm_eps, .offset = c->norm_offset}; /* Gemma: (1 + w) */
    int w = param(b, width, 0, "%s.weight", name);
    if (c->norm == DW_NORM_RMSNORM) return node(b, DW_OP_RMSNORM, name, x, w, -1, &a);
    int bi = param(b, width, 0, "%s.bias", name);
    return node(b, DW_OP_LAYERNORM, name, x, w, bi, &a);
}
static int norm(builder *b, const char *name, int x) { return norm_w(b, name, x, b->c->d_model); }

static void block_gpt2(builder *b, int i, int *x) {
    const dw_model_config *c = b->c;
    int64_t C = c->d_model;
    char p[64], nm[128];
    snprintf(p, sizeof p, "transformer.h.%d", i);
    dw_ir_attrs at = {.heads = c->n_heads, .kv_heads = c->n_heads, .head_dim = c->head_dim};
#define NAME(suffix) (snprintf(nm, sizeof nm, "%s.%s", p, suffix), nm)
    int h = norm(b, NAME("ln_1"), *x);
    h = linear(b, NAME("attn.c_attn"), h, C, 3 * C, true, true);
    h = node(b, DW_OP_ATTENTION, NAME("attn.sdpa"), h, -1, -1, &at);
    h = linear(b, NAME("attn.c_proj"), h, C, C, true, true);
    *x = node(b, DW_OP_ADD, NAME("attn_residual"), *x, h, -1, NULL);
    h = norm(b, NAME("ln_2"), *x);
    h = linear(b, NAME("mlp.c_fc"), h, C, c->d_ff, true, true);
    h = node(b, DW_OP_GELU, NAME("mlp.act"), h, -1, -1, NULL);
    h = linear(b, NAME("mlp.c_proj"), h, c->d_ff, C, true, true);
    *x = node(b, DW_OP_ADD, NAME("mlp_residual"), *x, h, -1, NULL);
}

/* The Llama family's attention sub-block: x += o_proj(attention(rope(q), rope(k), v)) of the
 * input-normed x, through layer i's sliding window if it has one. p: "model.layers.<i>". */
static void attention_llama(builder *b, int i, const char *p, int *x) {
    const dw_model_config *c = b->c;
    int64_t C = c->d_model, q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    char nm[128];
    dw_ir_attrs aq = {.heads = c->n_heads, .head_dim = c->head_dim, .theta = c->rope_theta, .rope = c->rope_scaling};
    dw_ir_attrs ak = {.heads = c->n_kv_heads, .head_dim = c->head_dim, .theta = c->rope_theta, .rope = c->rope_scaling};
    dw_ir_attrs at = {.heads = c->n_heads, .kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                      .window = dw_model_config_windowed(c, i) ? c->sliding_window : 0, .softcap = c->attn_softcap};
    int h = norm(b, NAME("input_layernorm"), *x);
    int hq = linear(b, NAME("self_attn.q_proj"), h, C, q, c->qkv_bias, false);
    int hk = linear(b, NAME("self_attn.k_proj"), h, C, kv, c->qkv_bias, false);
    int hv = linear(b, NAME("self_attn.v_proj"), h, C, kv, c->qkv_bias, false);
    if (c->qk_norm) { /* OLMoE: over the whole projections, before RoPE */
        hq = norm_w(b, NAME("self_attn.q_norm"), hq, q);
        hk = norm_w(b, NAME("self_attn.k_norm"), hk, kv);
    }
    if (c->qk_norm_heads) { /* Qwen3: over each head's head_dim channels, one weight for all heads */
        const dw_ir_attrs hn = {.eps = c->norm_eps, .head_dim = c->head_dim};
        int wq = param(b, c->head_dim, 0, "%s.self_attn.q_norm.weight", p);
        hq = node(b, DW_OP_HEAD_RMSNORM, NAME("self_attn.q_norm"), hq, wq, -1, &hn);
        int wk = param(b, c->head_dim, 0, "%s.self_attn.k_norm.weight", p);
        hk = node(b, DW_OP_HEAD_RMSNORM, NAME("self_attn.k_norm"), hk, wk, -1, &hn);
    }
    hq = node(b, DW_OP_ROPE, NAME("self_attn.rope_q"), hq, -1, -1, &aq);
    hk = node(b, DW_OP_ROPE, NAME("self_attn.rope_k"), hk, -1, -1, &ak);
    const double qpas = c->query_pre_attn_scalar;
    if (qpas > 0 && qpas != (double)c->head_dim) { /* Gemma 2: scores times qpas^-1/2, not head_dim's */
        const dw_ir_attrs qs = {.scale = sqrt((double)c->head_dim / qpas)};
        hq = node(b, DW_OP_SOFTCAP, NAME("self_attn.q_scale"), hq, -1, -1, &qs);
    }
    h = node(b, DW_OP_ATTENTION, NAME("self_attn.sdpa"), hq, hk, hv, &at);
    h = linear(b, NAME("self_attn.o_proj"), h, q, C, dw_model_config_o_bias(c), false);
    if (c->sandwich_norms) h = norm(b, NAME("post_attention_layernorm"), h); /* Gemma 2 */
    *x = node(b, DW_OP_ADD, NAME("attn_residual"), *x, h, -1, NULL);
}

/* A gated MLP of width F over h: down_proj(act(gate_proj(h)) * up_proj(h)), act silu (SwiGLU) or
 * for Gemma tanh GELU (GeGLU). p: its module ("model.layers.<i>.mlp", "....mlp.shared_expert"). */
static int swiglu_mlp(builder *b, const char *p, int h, int64_t F) {
    const dw_model_config *c = b->c;
    const int64_t C = c->d_model;
    char nm[160];
    int gate = linear(b, NAME("gate_proj"), h, C, F, c->mlp_bias, false);
    int up = linear(b, NAME("up_proj"), h, C, F, c->mlp_bias, false);
    h = node(b, c->act == DW_ACT_GELU_GLU ? DW_OP_GEGLU : DW_OP_SWIGLU, NAME("act"), gate, up, -1, NULL);
    return linear(b, NAME("down_proj"), h, F, C, c->mlp_bias, false);
}

/* The dense gated MLP of width d_ff: x += mlp(post_attention_layernorm(x)); Gemma 2:
 * x += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x))). p: "model.layers.<i>". */
static void dense_mlp(builder *b, const char *p, int *x) {
    char nm[128], m[96];
    const bool sandwich = b->c->sandwich_norms;
    int h = norm(b, sandwich ? NAME("pre_feedforward_layernorm") : NAME("post_attention_layernorm"), *x);
    snprintf(m, sizeof m, "%s.mlp", p);
    h = swiglu_mlp(b, m, h, b->c->d_ff);
    if (sandwich) h = norm(b, NAME("post_feedforward_layernorm"), h);
    *x = node(b, DW_OP_ADD, NAME("mlp_residual"), *x, h, -1, NULL);
}

static void block_llama(builder *b, int i, int *x) {
    char p[64];
    snprintf(p, sizeof p, "model.layers.%d", i);
    attention_llama(b, i, p, x);
    dense_mlp(b, p, x);
}

/* A mixture of SwiGLU experts in the MLP's place (transformers 5's module names, "mlp.*"): router
 * logits mlp.gate (E x C), top-k with softmax weights (renormalised as the config says), dispatch by
 * expert, the experts' gate/up/down GEMMs over their rows (parameters mlp.experts.{gate,up,down}_proj,
 * (E,F,C) and (E,C,F)), the weighted combine; x += the result. p: "model.layers.<i>". */
static void moe_mlp(builder *b, const char *p, int *x) {
    const dw_model_config *c = b->c;
    const int64_t C = c->d_model, E = c->n_experts, F = c->d_ff_expert;
    char nm[128];
    int h = norm(b, NAME("post_attention_layernorm"), *x);
    const int z = linear(b, NAME("mlp.gate"), h, C, E, false, false);
    const dw_group_routing *rt = &c->route; /* DeepSeek-V3's variants; plain routing leaves them 0 */
    const bool grouped = rt->n_group > 1 && rt->topk_group < rt->n_group;
    const dw_ir_attrs ra = {.top_k = c->top_k, .score = rt->sigmoid ? DW_ROUTER_SIGMOID : DW_ROUTER_SOFTMAX,
                            .norm_topk = c->norm_topk, .n_group = grouped ? rt->n_group : 0,
                            .topk_group = grouped ? rt->topk_group : 0,
                            .scale = rt->routed_scale != 1.0 ? rt->routed_scale : 0.0};
    const dw_ir_attrs da = {.experts = E, .capacity_factor = c->capacity_factor};
    static const char *const router_out[2] = {".weights", ".experts"}, *const dispatch_out[3] = {".rows", ".offsets",
                                                                                                ".positions"};
    int in[3] = {z}, r[2], d[3];
    node_outs(b, DW_OP_MOE_ROUTER, NAME("mlp.router"), in, 1, &ra, router_out, r);
    if (c->aux_loss || c->router_z_loss_coef > 0) { /* the router losses' statistics, added to the layers' before */
        static const char *const stats_out[2] = {".sums", ".counts"};
        int si[4] = {z, r[1], b->aux_sums, b->aux_counts}, so[2];
        node_outs(b, DW_OP_MOE_AUX_STATS, NAME("mlp.aux_stats"), si, b->aux_sums >= 0 ? 4 : 2, NULL, stats_out, so);
        b->aux_sums = so[0], b->aux_counts = so[1];
    }
    in[0] = h, in[1] = r[1], in[2] = r[0]; /* the weights rank the assignments when dropping by weight */
    const bool by_weight = c->capacity_factor > 0 && c->drop_by_weight;
    node_outs(b, DW_OP_MOE_DISPATCH, NAME("mlp.dispatch"), in, by_weight ? 3 : 2, &da, dispatch_out, d);
    const int wg = param3(b, E, F, C, NAME("mlp.experts.gate_proj"));
    const int wu = param3(b, E, F, C, NAME("mlp.experts.up_proj"));
    const int wd = param3(b, E, C, F, NAME("mlp.experts.down_proj"));
    const int g = node(b, DW_OP_MOE_LINEAR, NAME("mlp.experts.gate"), d[0], wg, d[1], NULL);
    const int u = node(b, DW_OP_MOE_LINEAR, NAME("mlp.experts.up"), d[0], wu, d[1], NULL);
    const int a = node(b, DW_OP_SWIGLU, NAME("mlp.experts.act"), g, u, -1, NULL);
    const int y = node(b, DW_OP_MOE_LINEAR, NAME("mlp.experts.down"), a, wd, d[1], NULL);
    const int routed = node(b, DW_OP_MOE_COMBINE, NAME("mlp.combine"), y, r[0], d[2], NULL);
    int out = routed;
    if (c->d_ff_shared) { /* Qwen2-MoE: + a shared SwiGLU expert, gated per token by sigmoid(C -> 1) */
        char m[96];
        snprintf(m, sizeof m, "%s.mlp.shared_expert", p);
        int s = swiglu_mlp(b, m, h, c->d_ff_shared);
        if (c->shared_gate) {
            const int gl = linear(b, NAME("mlp.shared_expert_gate"), h, C, 1, false, false);
            s = node(b, DW_OP_SIGMOID_GATE, NAME("mlp.shared_expert_gated"), s, gl, -1, NULL);
        }
        out = node(b, DW_OP_ADD, NAME("mlp.shared_add"), routed, s, -1, NULL);
    }
    *x = node(b, DW_OP_ADD, NAME("mlp_residual"), *x, out, -1, NULL);
}

/* Mixtral: the Llama attention, then the mixture of experts (renormalised top-k). */
static void block_mixtral(builder *b, int i, int *x) {
    char p[64];
    snprintf(p, sizeof p, "model.layers.%d", i);
    attention_llama(b, i, p, x);
    moe_mlp(b, p, x);
}

/* OLMoE: the Llama attention with q/k norms (config qk_norm), then the mixture of experts. */
static void block_olmoe(builder *b, int i, int *x) { block_mixtral(b, i, x); }

/* Qwen2-MoE: the Llama attention (q, k, v biases), then the mixture of experts with its gated
 * shared expert, or a dense MLP in the layers decoder_sparse_step and mlp_only_layers leave dense. */
static void block_qwen2_moe(builder *b, int i, int *x) {
    char p[64];
    snprintf(p, sizeof p, "model.layers.%d", i);
    attention_llama(b, i, p, x);
    if (dw_model_config_moe_layer(b->c, i)) moe_mlp(b, p, x);
    else dense_mlp(b, p, x);
}

/* Qwen3-MoE: the Llama attention with per-head q/k norms (config qk_norm_heads), then as Qwen2-MoE
 * (no shared expert: d_ff_shared 0). */
static void block_qwen3_moe(builder *b, int i, int *x) { block_qwen2_moe(b, i, x); }

/* Qwen3: the Llama block with per-head q/k norms (config qk_norm_heads). */
static void block_qwen3(builder *b, int i, int *x) { block_llama(b, i, x); }

/* Gemma 2: the Llama block with (1 + w) norms after attention and around the MLP (config
 * sandwich_norms, norm_offset), GeGLU, q scaled to query_pre_attn_scalar, soft-capped scores. */
static void block_gemma2(builder *b, int i, int *x) { block_llama(b, i, x); }

/* Phi-3: the Llama block (its fused checkpoint tensors are split by runtime/weights_layout.c). */
static void block_phi3(builder *b, int i, int *x) { block_llama(b, i, x); }
#undef NAME

/* Each architecture's block template (archs.def's family column). */
typedef void (*block_fn)(builder *b, int i, int *x);
static const block_fn blocks[DW_ARCH_COUNT] = {
#define DW_ARCH(ID, type, cls, fam, reads_config, trains, prefix, ignorable, experts, fused) block_##fam,
#include "capture/archs.def"
#undef DW_ARCH
};

/* The graph's model facts: type, a readable summary, blocks, vocabulary, the config as text. */
static dw_status model_facts(dw_ctx *ctx, const dw_model_config *c, dw_graph_model *m) {
    memset(m, 0, sizeof *m);
    snprintf(m->model_type, sizeof m->model_type, "%s", c->model_type);
    snprintf(m->summary, sizeof m->summary,
             "%lld layers, d_model %lld, %lld heads (%lld KV) x %lld, ffn %lld, vocab %lld%s",
             (long long)c->n_layers, (long long)c->d_model, (long long)c->n_heads, (long long)c->n_kv_heads,
             (long long)c->head_dim, (long long)c->d_ff, (long long)c->vocab_size,
             c->tie_embeddings ? ", tied embeddings" : "");
    if (c->n_experts) {
        const size_t len = strlen(m->summary);
        snprintf(m->summary + len, sizeof m->summary - len, ", %lld experts of %lld (top %lld)%s",
                 (long long)c->n_experts, (long long)c->d_ff_expert, (long long)c->top_k,
                 c->d_ff_shared ? " + a shared expert" : "");
    }
    m->n_blocks = c->n_layers;
    m->vocab = c->vocab_size;
    m->max_seq = c->max_seq;
    m->tied_embeddings = c->tie_embeddings;
    json_t *j = dw_model_config_to_json(c);
    m->config_json = j ? dw_json_dump(j, true) : NULL;
    json_decref(j);
    return m->config_json ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "capture: out of memory");
}

dw_status dw_capture_config(dw_ctx *ctx, const dw_model_config *c, int64_t batch, int64_t seq,
                            dw_graph **out) {
    *out = NULL;
    if (c->planning_only)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                            "model_type '%s' with %.1f B parameters%s is a planning-only preset: "
                            "the planner sizes it, but capture, eval and training refuse it",
                            c->model_type, (double)dw_model_config_params(c) / 1e9,
                            c->n_experts ? " in mixture-of-experts layers" : "");
    const dw_hf_arch *arch = dw_hf_arch_get(c->arch);
    if (!arch || !arch->trains) {
        char list[256];
        dw_hf_arch_list(list, sizeof list);
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "model_type '%s' is not supported yet "
                            "(supported: %s)", c->model_type, list);
    }
    DW_TRY(dw_model_config_check(ctx, c, c->model_type));
    if (batch < 1 || seq < 1 || seq > c->max_seq)
        return dw_set_error(ctx, DW_ERR_INVALID, "capture: batch %lld, sequence %lld: need batch "
                            ">= 1 and 1 <= sequence <= %lld (max positions)", (long long)batch,
                            (long long)seq, (long long)c->max_seq);
    dw_graph_model m;
    DW_TRY(model_facts(ctx, c, &m));
    dw_graph *g = dw_graph_new(&m, batch, seq);
    free(m.config_json);
    if (!g) return dw_set_error(ctx, DW_ERR_NOMEM, "capture: out of memory");
    builder b = {ctx, g, c, DW_OK, -1, -1};
    bool gpt2 = c->arch == DW_ARCH_GPT2;
    int64_t bt[2] = {batch, seq};
    g->tokens = dw_graph_add_tensor(g, "tokens", DW_TENSOR_INPUT, DW_IR_I32, 2, bt);
    g->targets = dw_graph_add_tensor(g, "targets", DW_TENSOR_INPUT, DW_IR_I32, 2, bt);
    int wte = param(&b, c->vocab_size, c->d_model, gpt2 ? "transformer.wte.weight"
                                                        : "model.embed_tokens.weight");
    const dw_ir_attrs pad = {.has_pad = c->has_pad, .pad = c->pad_token}; /* padding_idx (llama-like only) */
    int x = node(&b, DW_OP_EMBEDDING, gpt2 ? "transformer.wte" : "model.embed_tokens", g->tokens,
                 wte, -1, &pad);
    if (c->embed_scale) { /* Gemma: times sqrt(hidden_size), rounded to FP32 as transformers' normalizer */
        const dw_ir_attrs es = {.scale = (double)(float)c->embed_scale};
        x = node(&b, DW_OP_SOFTCAP, "model.embed_tokens.scale", x, -1, -1, &es);
    }
    if (gpt2) {
        int wpe = param(&b, c->max_seq, c->d_model, "transformer.wpe.weight");
        x = node(&b, DW_OP_POSITION, "transformer.wpe", x, wpe, -1, NULL);
    }
    for (int i = 0; i < c->n_layers && b.st == DW_OK; i++) {
        dw_graph_set_block(g, i);
        blocks[c->arch](&b, i, &x);
    }
    dw_graph_set_block(g, -1);
    x = norm(&b, gpt2 ? "transformer.ln_f" : "model.norm", x);
    int head = c->tie_embeddings ? wte : param(&b, c->vocab_size, c->d_model, "lm_head.weight");
    g->logits = node(&b, DW_OP_LINEAR, "lm_head", x, head, -1, NULL);
    if (c->final_softcap > 0) { /* Gemma 2: tanh(logits / cap) cap */
        const dw_ir_attrs fc = {.scale = 1.0, .softcap = c->final_softcap};
        g->logits = node(&b, DW_OP_SOFTCAP, "lm_head.softcap", g->logits, -1, -1, &fc);
    }
    g->loss = node(&b, DW_OP_CROSS_ENTROPY, "loss", g->logits, g->targets, -1, NULL);
    if (b.aux_sums >= 0) { /* transformers' load-balancing loss and the router z-loss over all MoE layers */
        const dw_ir_attrs la = {.top_k = c->top_k, .coef = c->aux_loss ? c->router_aux_loss_coef : 0,
                                .zcoef = c->router_z_loss_coef};
        node(&b, DW_OP_MOE_AUX_LOSS, "moe_aux_loss", b.aux_sums, b.aux_counts, -1, &la);
    }
    if ((g->tokens < 0 || g->targets < 0) && b.st == DW_OK)
        b.st = dw_set_error(ctx, DW_ERR_NOMEM, "capture: out of memory");
    dw_status s = b.st != DW_OK ? b.st : dw_graph_verify(ctx, g);
    if (s != DW_OK) {
        dw_graph_free(g);
        return s;
    }
    *out = g;
    return DW_OK;
}

void dw_capture_opts_init(dw_capture_opts *o, size_t size) {
    dw_capture_opts d = {.size = sizeof d, .batch = 1, .seq = 0, .vocab = 0};
    memset(o, 0, size);
    memcpy(o, &d, size < sizeof d ? size : sizeof d);
    o->size = size;
}

dw_status dw_capture(dw_ctx *ctx, const char *model, const dw_capture_opts *opts, dw_graph **out) {
    *out = NULL;
    dw_capture_opts o;
    dw_capture_opts_init(&o, sizeof o);
    if (opts) memcpy(&o, opts, opts->size < sizeof o ? opts->size : sizeof o);
    if (o.vocab < 0) return dw_set_error(ctx, DW_ERR_INVALID, "capture: vocabulary %lld", (long long)o.vocab);
    dw_model_config c;
    DW_TRY(dw_model_config_load(ctx, model, &c));
    if (o.vocab) c.vocab_size = o.vocab;
    if (c.has_pad && c.pad_token >= c.vocab_size) c.has_pad = false; /* no token can be that row */
    if (o.moe_drop != DW_MOE_DROP_CONFIG) c.drop_by_weight = o.moe_drop == DW_MOE_DROP_PROBS;
    int64_t seq = o.seq > 0 ? o.seq : c.max_seq < 2048 ? c.max_seq : 2048;
    return dw_capture_config(ctx, &c, o.batch, seq, out);
}

dw_status dw_capture_hf_shape(dw_ctx *ctx, const char *model, int64_t batch, int64_t seq, dw_graph **out) {
    dw_capture_opts o;
    dw_capture_opts_init(&o, sizeof o);
    o.batch = batch, o.seq = seq;
    return dw_capture(ctx, model, &o, out);
}

dw_status dw_capture_hf(dw_ctx *ctx, const char *model, dw_graph **out) {
    return dw_capture_hf_shape(ctx, model, 1, 0, out);
}
