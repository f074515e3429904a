/* model_config.h — private: a transformer's architecture as parsed from a Hugging Face
 * config.json or a preset. Capture turns it into a graph; the planner reads it directly.
 * CONTRACT HEADER: shared by capture (which fills it), the planner and the trainer. */
#ifndef DW_CAPTURE_MODEL_CONFIG_H
#define DW_CAPTURE_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "capture/arch.h"
#include "capture/model_config_mla.h"
#include "deepwell.h"
#include "kernels/rope_freq.h"

typedef enum { DW_ACT_GELU_TANH = 0, DW_ACT_SILU_GLU /* SwiGLU */, DW_ACT_GELU_GLU } dw_activation;
typedef enum { DW_NORM_LAYERNORM = 0, DW_NORM_RMSNORM } dw_norm_kind;
typedef enum { DW_POS_LEARNED = 0, DW_POS_ROPE } dw_pos_kind;

#define DW_MODEL_MAX_LAYERS 10000 /* beyond any released model (dw_model_config_check's bound) */

typedef struct dw_model_config_s {
    char model_type[32];   /* as in config.json: "gpt2", "llama", ... */
    dw_arch arch;          /* its row of capture/archs.def */
    int64_t vocab_size;
    int64_t d_model;       /* hidden_size / n_embd */
    int64_t n_layers;
    int64_t n_heads;
    int64_t n_kv_heads;    /* == n_heads without GQA */
    int64_t head_dim;      /* d_model / n_heads unless the config says otherwise */
    int64_t d_ff;          /* intermediate_size / n_inner (4*d for gpt2 default) */
    int64_t max_seq;       /* max_position_embeddings / n_positions */
    dw_activation act;
    dw_norm_kind norm;
    dw_pos_kind pos;
    double norm_eps;
    double rope_theta;
    dw_rope_scaling rope_scaling; /* the rope type of rope_scaling / rope_parameters (all zero: default) */
    bool tie_embeddings;
    bool has_pad;          /* pad_token_id names a row: the Llama-like families build nn.Embedding with
                            * padding_idx = pad_token_id, so the lookup gives that row no gradient */
    int64_t pad_token;     /* pad_token_id, 0 <= pad_token < vocab_size (with has_pad) */
    bool qkv_bias;         /* qwen2: true; gpt2: biases everywhere (see `linear_bias`) */
    bool linear_bias;      /* gpt2: every linear has a bias */
    bool mlp_bias;
    bool qk_norm;          /* OLMoE: RMSNorm over the whole q and k projections before RoPE */
    bool qk_norm_heads;    /* Qwen3: RMSNorm over each head's head_dim channels of q and k before RoPE */
    int64_t sliding_window; /* keys a windowed layer's query sees (itself included); 0: no window */
    uint64_t window_layers[DW_MODEL_MAX_LAYERS / 64 + 1]; /* bit l set: layer l's attention is windowed */
    double init_std;       /* initializer_range (0.02) */
    /* Gemma 2 (all zero elsewhere) */
    double embed_scale;    /* the embeddings multiplied by it (sqrt(hidden_size)); 0: not scaled */
    double norm_offset;    /* RMSNorm weights applied as norm_offset + w (1); 0: w */
    bool sandwich_norms;   /* norms after attention and MLP too (post_attention_layernorm, pre_ and
                            * post_feedforward_layernorm) */
    double query_pre_attn_scalar; /* attention scores scaled by its -1/2 (0: head_dim's) */
    double attn_softcap, final_softcap; /* attn_logit_softcapping, final_logit_softcapping (0: none) */
    /* mixture of experts */
    int64_t n_experts;     /* 0: dense */
    int64_t top_k;
    bool norm_topk;        /* the top-k weights renormalised to sum 1 (Mixtral: always) */
    double router_aux_loss_coef; /* transformers' load-balancing loss weight (config.json) */
    bool aux_loss;         /* the load-balancing loss joins the training loss (output_router_logits) */
    double router_z_loss_coef; /* ST-MoE's router z-loss weight (0: none; a Deepwell key in config.json) */
    double capacity_factor; /* > 0: each expert keeps ceil(factor·tokens·top_k / experts) assignments, the
                             * rest dropped (dw_moe_capacity); 0: dropless (a Deepwell key in config.json) */
    bool drop_by_weight;   /* over capacity, an expert keeps its heaviest assignments, not its first
                            * (config.json moe_token_drop_policy "probs"; default "position") */
    double moe_bias_speed; /* > 0: auxiliary-loss-free balancing's bias update speed γ (config.json
                            * moe_bias_update_speed, a Deepwell key; 0.001 under topk_method "noaux_tc"); 0: off */
    int64_t d_ff_expert;   /* expert intermediate size */
    int64_t n_shared_experts;
    int64_t first_dense_layers; /* DeepSeek-V3: first k layers dense */
    int64_t d_ff_shared;   /* Qwen2-MoE: the shared expert's width (shared_expert_intermediate_size; 0: none) */
    bool shared_gate;      /* Qwen2-MoE: the shared expert scaled by sigmoid(shared_expert_gate(x)) per token */
    int64_t sparse_step;   /* Qwen-MoE decoder_sparse_step: layer l is MoE when (l+1) % step == 0 (0, 1: all) */
    uint64_t mlp_only[DW_MODEL_MAX_LAYERS / 64 + 1]; /* Qwen-MoE mlp_only_layers: bit l set = layer l dense */
    dw_mla_dims mla;       /* DeepSeek-V3: multi-head latent attention (kv_lora_rank 0: none) */
    dw_group_routing route; /* DeepSeek-V3: group-limited routing, router bias, MTP modules */
    bool planning_only;    /* a shape for the planner; capture/train refuse it */
} dw_model_config;

/* Parses <dir>/config.json, or a preset name when `model` is not a directory. Errors name the
 * file and field; unsupported model_types name the supported list. */
dw_status dw_model_config_load(dw_ctx *ctx, const char *model, dw_model_config *out);
/* Writes the config as a Hugging Face config.json (so `transformers` loads checkpoints). */
dw_status dw_model_config_save(dw_ctx *ctx, const dw_model_config *cfg, const char *path);
int dw_model_preset_count(void);
const char *dw_model_preset_name(int i);
/* Parameter count (embeddings counted once when tied) and training FLOPs per token are derived
 * from the graph in capture; the planner uses these closed forms: */
int64_t dw_model_config_params(const dw_model_config *cfg);
/* Whether decoder layer l's MLP is the mixture of experts (else the dense MLP of width d_ff): the
 * model has experts, l is past first_dense_layers, not in mlp_only, and (l+1) a multiple of
 * sparse_step (transformers' Qwen2-MoE / Qwen3-MoE rule). */
bool dw_model_config_moe_layer(const dw_model_config *cfg, int64_t l);
/* Whether decoder layer l attends through the sliding window of cfg->sliding_window keys
 * (model_config_window.c: mistral's sliding_window, the Qwen families' use_sliding_window and
 * max_window_layers, layer_types). */
bool dw_model_config_windowed(const dw_model_config *cfg, int64_t l);

#endif /* DW_CAPTURE_MODEL_CONFIG_H */
