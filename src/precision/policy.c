/* policy.c — precision policies: JSON load/save and per-node recipe resolution (see policy.h). */
#include <ctype.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "precision/policy.h"
#include "precision/thresholds.h"

void dw_policy_free(dw_policy *p) {
    if (!p) return;
    for (int i = 0; i < p->n_rules; i++) {
        free(p->rules[i].match);
        free(p->rules[i].op);
    }
    free(p->rules);
    free(p);
}

static dw_status parse_recipe(dw_ctx *ctx, const char *name, const char *where, dw_recipe *out) {
    if (dw_recipe_parse(name, out)) return DW_OK;
    char known[256] = "";
    for (int r = 0; r < DW_RECIPE_COUNT; r++) {
        strncat(known, r ? ", " : "", sizeof known - strlen(known) - 1);
        strncat(known, dw_recipe_name((dw_recipe)r), sizeof known - strlen(known) - 1);
    }
    return dw_set_error(ctx, DW_ERR_INVALID, "%s: unknown recipe '%s' (known: %s)", where, name,
                        known);
}

dw_status dw_policy_from_precision(dw_ctx *ctx, const char *recipe, bool fallback_safe,
                                   dw_policy **out) {
    *out = NULL;
    dw_recipe r;
    DW_TRY(parse_recipe(ctx, recipe ? recipe : "(null)", "--precision", &r));
    dw_policy *p = calloc(1, sizeof *p);
    if (!p) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    p->default_recipe = r;
    p->fallback = fallback_safe ? DW_FALLBACK_SAFE : DW_FALLBACK_HEAD;
    p->nvfp4 = dw_nvfp4_recipe_default();
    *out = p;
    return DW_OK;
}

static const char *const pass_names[3] = {"fprop", "dgrad", "wgrad"}; /* dw_qpass order */

bool dw_policy_keeps_bf16(unsigned mask, int rule, int pass, char *why, size_t why_len) {
    if (!(mask & (1u << pass))) return false;
    const char *name = pass >= 0 && pass < 3 ? pass_names[pass] : "?";
    if (why && why_len && (mask & DW_POLICY_PASSES_DEFAULT))
        snprintf(why, why_len, "fp8_block experts keep %s BF16 by default (the grouped FP8 %s is slower on sm_90; "
                 "a rule's \"bf16_passes\": [] quantises it)", name, name);
    else if (why && why_len)
        snprintf(why, why_len, "policy rule %d keeps %s BF16 (bf16_passes)", rule, name);
    return true;
}

unsigned dw_policy_bf16_passes(const dw_policy *p, int rule_index, const char *op_name, dw_recipe r) {
    if (p && rule_index >= 0 && rule_index < p->n_rules && p->rules[rule_index].passes_set)
        return p->rules[rule_index].bf16_passes;
    const bool fp8_experts = op_name && !strcmp(op_name, "moe_linear") &&
                             (r == DW_RECIPE_FP8_BLOCK || r == DW_RECIPE_FP8_BLOCK2D);
    return fp8_experts ? 1u << 2 | DW_POLICY_PASSES_DEFAULT : 0; /* wgrad (bench/RESULTS.md, session 21) */
}

/* A rule's "bf16_passes": an array of pass names, each at most once; *set whether the field is there. */
static dw_status parse_passes(dw_ctx *ctx, const json_t *v, const char *what, unsigned *mask, bool *set) {
    *mask = 0;
    *set = v != NULL;
    if (!v) return DW_OK;
    if (!json_is_array(v))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'bf16_passes': expected an array of \"fprop\", "
                            "\"dgrad\", \"wgrad\"", what);
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
        int p = 0;
        while (p < 3 && !(json_is_string(e) && !strcmp(json_string_value(e), pass_names[p]))) p++;
        if (p == 3)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'bf16_passes'[%zu]: expected \"fprop\", \"dgrad\" "
                                "or \"wgrad\"", what, i);
        if (*mask & (1u << p))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'bf16_passes': '%s' twice", what, pass_names[p]);
        *mask |= 1u << p;
    }
    return DW_OK;
}

static dw_status load_rules(dw_ctx *ctx, const json_t *rules, const char *path, dw_policy *p) {
    if (!rules) return DW_OK;
    if (!json_is_array(rules))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'rules': expected an array", path);
    size_t n = json_array_size(rules);
    p->rules = calloc(n ? n : 1, sizeof *p->rules);
    if (!p->rules) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char what[600];
        snprintf(what, sizeof what, "%s: rules[%zu]", path, i);
        const json_t *r = json_array_get(rules, i);
        if (!json_is_object(r)) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: expected an object", what);
        const char *match = NULL, *op = NULL, *recipe = NULL;
        DW_TRY(dw_json_get_str_opt(ctx, r, "match", what, &match));
        DW_TRY(dw_json_get_str_opt(ctx, r, "op", what, &op));
        DW_TRY(dw_json_get_str(ctx, r, "recipe", what, &recipe));
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)r, key, v) {
            if (strcmp(key, "match") && strcmp(key, "op") && strcmp(key, "recipe") && strcmp(key, "bf16_passes"))
                return dw_set_error(ctx, DW_ERR_FORMAT,
                                    "%s: unknown field '%s' (expected match, op, recipe, bf16_passes)", what, key);
        }
        if (!match && !op)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: a rule needs 'match' or 'op'", what);
        dw_policy_rule *rule = &p->rules[p->n_rules++];
        DW_TRY(parse_recipe(ctx, recipe, what, &rule->recipe));
        DW_TRY(parse_passes(ctx, json_object_get(r, "bf16_passes"), what, &rule->bf16_passes, &rule->passes_set));
        rule->match = match ? strdup(match) : NULL;
        rule->op = op ? strdup(op) : NULL;
        if ((match && !rule->match) || (op && !rule->op))
            return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    return DW_OK;
}

dw_status dw_policy_load(dw_ctx *ctx, const char *path, dw_policy **out) {
    *out = NULL;
    json_t *root = NULL;
    DW_TRY(dw_json_load_file(ctx, path, &root));
    dw_policy *p = calloc(1, sizeof *p);
    dw_status s = p ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    if (s == DW_OK && !json_is_object(root))
        s = dw_set_error(ctx, DW_ERR_FORMAT, "%s: expected a JSON object", path);
    if (p) p->nvfp4 = dw_nvfp4_recipe_default();
    const char *def = NULL, *fallback = "head";
    if (s == DW_OK) s = dw_json_get_str(ctx, root, "default", path, &def);
    if (s == DW_OK) s = parse_recipe(ctx, def, path, &p->default_recipe);
    if (s == DW_OK) s = dw_json_get_str_opt(ctx, root, "fallback", path, &fallback);
    if (s == DW_OK && !dw_policy_fallback_parse(fallback, &p->fallback))
        s = dw_set_error(ctx, DW_ERR_FORMAT,
                         "%s: field 'fallback': expected \"safe\", \"head\" or \"none\", got \"%s\"", path, fallback);
    if (s == DW_OK) s = load_rules(ctx, json_object_get(root, "rules"), path, p);
    if (s == DW_OK) s = dw_nvfp4_recipe_parse(ctx, json_object_get(root, "nvfp4"), path, &p->nvfp4);
    if (s == DW_OK) s = dw_thresholds_parse(ctx, json_object_get(root, "max_rel_error"), path, p->max_rel_error);
    if (s == DW_OK) {
        const char *key;
        json_t *v;
        json_object_foreach(root, key, v) {
            if (!strcmp(key, "nvfp4")) continue;
            if (strcmp(key, "default") && strcmp(key, "fallback") && strcmp(key, "rules") &&
                strcmp(key, "max_rel_error")) {
                s = dw_set_error(ctx, DW_ERR_FORMAT,
                                 "%s: unknown field '%s' (expected default, fallback, rules, max_rel_error, nvfp4)", path, key);
                break;
            }
        }
    }
    json_decref(root);
    if (s != DW_OK) {
        dw_policy_free(p);
        return s;
    }
    *out = p;
    return DW_OK;
}

/* Whether any node can get nvfp4: the default or a rule (the recipe is written out only then). */
static bool uses_nvfp4(const dw_policy *p) {
    bool any = p->default_recipe == DW_RECIPE_NVFP4;
    for (int i = 0; i < p->n_rules; i++) any = any || p->rules[i].recipe == DW_RECIPE_NVFP4;
    return any;
}

dw_status dw_policy_to_json(dw_ctx *ctx, const dw_policy *p, char **out) {
    *out = NULL;
    json_t *rules = json_array();
    for (int i = 0; i < p->n_rules; i++) {
        json_t *r = json_object();
        if (p->rules[i].match) json_object_set_new(r, "match", json_string(p->rules[i].match));
        if (p->rules[i].op) json_object_set_new(r, "op", json_string(p->rules[i].op));
        json_object_set_new(r, "recipe", json_string(dw_recipe_name(p->rules[i].recipe)));
        if (p->rules[i].passes_set) { /* [] too: it turns the default off */
            json_t *passes = json_array();
            for (int k = 0; k < 3; k++)
                if (p->rules[i].bf16_passes & (1u << k)) json_array_append_new(passes, json_string(pass_names[k]));
            json_object_set_new(r, "bf16_passes", passes);
        }
        json_array_append_new(rules, r);
    }
    json_t *root = json_pack("{s:s,s:s,s:o}", "default", dw_recipe_name(p->default_recipe),
                             "fallback", dw_policy_fallback_name(p->fallback), "rules", rules);
    json_t *thr = dw_thresholds_json(p->max_rel_error);
    if (root && thr) json_object_set_new(root, "max_rel_error", thr);
    if (root && uses_nvfp4(p)) json_object_set_new(root, "nvfp4", dw_nvfp4_recipe_json(&p->nvfp4));
    char *s = root ? dw_json_dump(root, false) : NULL;
    json_decref(root);
    if (!s) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    *out = s;
    return DW_OK;
}

/* Layer index of a block-level node name ("transformer.h.3.attn.c_attn" → 3,
 * "model.layers.11.mlp.up_proj" → 11), or -1 for nodes outside the blocks. */
static long layer_index(const char *name) {
    static const char *const markers[] = {".h.", ".layers.", "h.", "layers."};
    for (size_t m = 0; m < sizeof markers / sizeof markers[0]; m++) {
        const char *s = strstr(name, markers[m]);
        if (!s) continue;
        if (m >= 2 && s != name) continue; /* bare prefixes only at the start */
        s += strlen(markers[m]);
        if (!isdigit((unsigned char)*s)) continue;
        return strtol(s, NULL, 10);
    }
    return -1;
}

bool dw_policy_is_moe_gate(const char *name) {
    /* Mixtral's block_sparse_moe.gate, mlp.gate as transformers 5 and Qwen/OLMoE name it */
    static const char *const globs[] = {"*.mlp.gate", "*.mlp.gate.*", "*.block_sparse_moe.gate",
                                        "*.block_sparse_moe.gate.*", "*.router", "*.router.*",
                                        "*.shared_expert_gate", "*.shared_expert_gate.*"};
    for (size_t i = 0; i < sizeof globs / sizeof globs[0]; i++)
        if (fnmatch(globs[i], name, 0) == 0) return true;
    return false;
}

bool dw_policy_is_fragile(const char *name, int64_t n_layers) {
    static const char *const globs[] = {"*wte*", "*wpe*", "*embed_tokens*", "*lm_head*"};
    for (size_t i = 0; i < sizeof globs / sizeof globs[0]; i++)
        if (fnmatch(globs[i], name, 0) == 0) return true;
    if (dw_policy_is_moe_gate(name)) return true;
    long l = layer_index(name);
    return l >= 0 && (l == 0 || l == n_layers - 1);
}

dw_recipe dw_policy_resolve(const dw_policy *p, const char *name, const char *op,
                            int64_t n_layers, dw_policy_reason *reason, int *rule_index) {
    if (rule_index) *rule_index = -1;
    if (strcmp(op, "linear") != 0 && strcmp(op, "moe_linear") != 0) { /* only GEMMs have low-precision forms
                                                                        (a MoE layer's experts: moe_linear) */
        if (reason) *reason = DW_POLICY_NOT_GEMM;
        return DW_RECIPE_BF16;
    }
    if (dw_policy_is_moe_gate(name)) { /* before any rule: issue-level guarantee, not a default */
        if (reason) *reason = DW_POLICY_MOE_GATE;
        return DW_RECIPE_BF16;
    }
    for (int i = 0; i < p->n_rules; i++) {
        const dw_policy_rule *r = &p->rules[i];
        if (r->match && fnmatch(r->match, name, 0) != 0) continue;
        if (r->op && strcmp(r->op, op) != 0) continue;
        if (reason) *reason = DW_POLICY_BY_RULE;
        if (rule_index) *rule_index = i;
        return r->recipe;
    }
    if (p->fallback == DW_FALLBACK_SAFE && dw_policy_is_fragile(name, n_layers)) {
        if (reason) *reason = DW_POLICY_BY_SAFE;
        return DW_RECIPE_BF16;
    }
    if (p->default_recipe == DW_RECIPE_NVFP4 && dw_nvfp4_keeps_bf16(&p->nvfp4, name, layer_index(name), n_layers)) {
        if (reason) *reason = DW_POLICY_NVFP4_BF16;
        return DW_RECIPE_BF16;
    }
    /* the NVFP4 recipe has its own switch for the head (nvfp4.bf16_head), checked above */
    if (p->fallback == DW_FALLBACK_HEAD && p->default_recipe != DW_RECIPE_NVFP4 && fnmatch("*lm_head*", name, 0) == 0) {
        if (reason) *reason = DW_POLICY_BY_HEAD;
        return DW_RECIPE_BF16;
    }
    if (reason) *reason = DW_POLICY_BY_DEFAULT;
    return p->default_recipe;
}

const char *dw_policy_reason_text(dw_policy_reason r) {
    switch (r) {
    case DW_POLICY_BY_RULE: return "rule";
    case DW_POLICY_BY_SAFE: return "fallback safe (embedding, LM head, MoE gate, first or last block)";
    case DW_POLICY_BY_DEFAULT: return "default";
    case DW_POLICY_NOT_GEMM: return "not a GEMM (BF16/FP32)";
    case DW_POLICY_MOE_GATE: return "MoE router or shared-expert gate (BF16 under every policy)";
    case DW_POLICY_NVFP4_BF16: return "nvfp4 recipe: the LM head and the last blocks stay BF16 (nvfp4.bf16_head, bf16_last_blocks)";
    case DW_POLICY_BY_HEAD: return "fallback head (the default): the LM head stays BF16";
    }
    return "?";
}

static const char *const fallback_names[] = {"none", "head", "safe"}; /* dw_policy_fallback order */

bool dw_policy_fallback_parse(const char *name, dw_policy_fallback *out) {
    for (int f = 0; f < 3; f++)
        if (name && !strcmp(name, fallback_names[f])) {
            *out = (dw_policy_fallback)f;
            return true;
        }
    return false;
}

const char *dw_policy_fallback_name(dw_policy_fallback f) {
    return f >= DW_FALLBACK_NONE && f <= DW_FALLBACK_SAFE ? fallback_names[f] : "?";
}

dw_status dw_policy_set_fallback(dw_ctx *ctx, dw_policy *p, const char *fallback) {
    if (!p) return dw_set_error(ctx, DW_ERR_INVALID, "dw_policy_set_fallback: NULL policy");
    if (!dw_policy_fallback_parse(fallback, &p->fallback))
        return dw_set_error(ctx, DW_ERR_INVALID, "--fallback: expected safe, head or none, got '%s'",
                            fallback ? fallback : "(null)");
    return DW_OK;
}
