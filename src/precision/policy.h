/* policy.h — private: precision policies. A policy is a default recipe plus ordered rules matched
 * on node names (glob) and op types; `fallback` keeps nodes in BF16 after the rules: "safe" the
 * fragile ones, "head" (the default) the LM head alone, "none" nothing. It decides the recipe of
 * every linear node; other ops compute in BF16/FP32 whatever the policy says.
 * JSON: {"default": "fp8_block", "fallback": "safe"|"head"|"none",
 *        "rules": [{"match": "*.self_attn.*", "op": "linear", "recipe": "bf16"},
 *                  {"op": "moe_linear", "recipe": "fp8_block", "bf16_passes": []}, ...],
 *        "max_rel_error": 0.2 | {"nvfp4": 0.25, ...}} (optional: precision/thresholds.h),
 *        "nvfp4": {"rht": true, ...} (optional: precision/nvfp4_recipe.h) */
#ifndef DW_PRECISION_POLICY_H
#define DW_PRECISION_POLICY_H

#include "deepwell.h"
#include "formats/formats.h"
#include "precision/nvfp4_recipe.h"

typedef struct {
    char *match;      /* fnmatch(3) glob on the node name; NULL matches every name */
    char *op;         /* op name ("linear"); NULL matches every op */
    dw_recipe recipe;
    /* The GEMMs of the matched nodes that stay BF16 in a quantised recipe (Transformer Engine's
     * override_linear_precision): bit 0 fprop, 1 dgrad, 2 wgrad (compile/program.h's dw_qpass). */
    unsigned bf16_passes;
    /* The rule has the field "bf16_passes", even []: its passes replace the default's
     * (dw_policy_bf16_passes); false: the default applies to the nodes it binds. */
    bool passes_set;
} dw_policy_rule;

/* What the fallback keeps in BF16 when no rule names a node: nothing, the LM head (the default, as
 * torchao and torchtitan keep it), or every fragile node (dw_policy_is_fragile). */
typedef enum { DW_FALLBACK_NONE = 0, DW_FALLBACK_HEAD, DW_FALLBACK_SAFE } dw_policy_fallback;

struct dw_policy {
    dw_recipe default_recipe;
    dw_policy_fallback fallback;
    int n_rules;
    dw_policy_rule *rules;
    dw_nvfp4_recipe nvfp4; /* the NVFP4 training recipe (nvfp4_recipe.h): used where a node gets nvfp4 */
    double max_rel_error[DW_RECIPE_COUNT]; /* the guard's thresholds (thresholds.h); 0: the default */
};

/* Why a node got its recipe (for `deepwell compile --report`). */
typedef enum {
    DW_POLICY_BY_RULE = 0, /* an explicit rule matched (index in *rule_index) */
    DW_POLICY_BY_SAFE,     /* fallback "safe": embeddings, LM head, routers, first/last block */
    DW_POLICY_BY_DEFAULT,  /* nothing else applied */
    DW_POLICY_NOT_GEMM,    /* the op has no low-precision form: computed in BF16/FP32 */
    DW_POLICY_MOE_GATE,    /* a MoE router or shared-expert gate: BF16 under every policy */
    DW_POLICY_NVFP4_BF16,  /* nvfp4 by default, kept BF16 by the recipe: LM head, last blocks */
    DW_POLICY_BY_HEAD      /* fallback "head" (the default): the LM head stays BF16 */
} dw_policy_reason;

/* Which node names are fragile under "safe": embeddings (wte, wpe, embed_tokens), the LM head
 * (lm_head), the MoE gates (below), and every node of the first and last block (layer index from
 * "...h.N." or "...layers.N."). n_layers is the model's block count. */
bool dw_policy_is_fragile(const char *node_name, int64_t n_layers);
/* Whether a node is a MoE router (*.mlp.gate, *.block_sparse_moe.gate, *.router) or Qwen2-MoE's
 * *.shared_expert_gate: small GEMMs whose outputs pick experts or scale a whole branch, where a
 * quantisation error changes the routing; dw_policy_resolve keeps them BF16 under every policy. */
bool dw_policy_is_moe_gate(const char *node_name);

/* The recipe for a node. op_name is the IR op's name ("linear", "moe_linear", "rmsnorm", ...):
 * linear and moe_linear (a MoE layer's experts, one grouped GEMM; a rule with "op": "moe_linear"
 * or a match on their names keeps them BF16) get the policy's recipe, every other op BF16. A node that
 * would get nvfp4 by default (no rule) stays BF16 where the NVFP4 recipe keeps it (the LM head,
 * the last blocks: dw_nvfp4_keeps_bf16); a rule naming nvfp4 wins over that. */
dw_recipe dw_policy_resolve(const dw_policy *p, const char *node_name, const char *op_name,
                            int64_t n_layers, dw_policy_reason *reason, int *rule_index);
const char *dw_policy_reason_text(dw_policy_reason r);
/* Set in a mask of dw_policy_bf16_passes when the passes are the default's, not a rule's. */
#define DW_POLICY_PASSES_DEFAULT (1u << 3)
/* The passes a node of op op_name (dw_policy_resolve's) bound in recipe r by rule `rule_index`
 * (-1: none) keeps BF16, bit p for dw_qpass p: the rule's "bf16_passes" where it has the field
 * (passes_set, even []); else the default, with DW_POLICY_PASSES_DEFAULT: wgrad for a MoE layer's
 * experts (moe_linear) in fp8_block or fp8_block2d (the same grouped fp8_block kernels: the grouped
 * FP8 wgrad costs more than it saves on sm_90, docs/precision.md), nothing for any other node. */
unsigned dw_policy_bf16_passes(const dw_policy *p, int rule_index, const char *op_name, dw_recipe r);
/* Whether a node bound by rule `rule` with bf16_passes `mask` (dw_policy_bf16_passes) keeps pass i
 * BF16; if so and why is given, why names the rule and the pass, or says the default keeps it
 * (compile --report, --explain). */
bool dw_policy_keeps_bf16(unsigned mask, int rule, int pass, char *why, size_t why_len);
/* "safe" | "head" | "none" to the fallback; false for any other name. */
bool dw_policy_fallback_parse(const char *name, dw_policy_fallback *out);
const char *dw_policy_fallback_name(dw_policy_fallback f);

#endif /* DW_PRECISION_POLICY_H */
