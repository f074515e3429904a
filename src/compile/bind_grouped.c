/* bind_grouped.c — the kernel decision of each MoE linear layer (moe_linear): per pass (fprop,
 * dgrad, wgrad) the grouped GEMM the registry selects for the target at the planned shape — the
 * registry entries (src/gemm/grouped_kernels.c, grouped_fp8.c) are the one home of the kernels'
 * rules — kept in the node's binding for the runtime to run, and the readable account of every
 * candidate for `deepwell compile --explain`. A node whose policy recipe is fp8_block (or
 * fp8_block2d) asks first for an fp8_block kernel per pass (1x128 activations, 128x128 expert
 * weights; for the wgrad only where a rule's "bf16_passes" says so, else it stays BF16 by default:
 * dw_policy_bf16_passes) and falls back to BF16 with the reasons the registry gave (a non-multiple
 * of 128, no fp8_block wgrad, the sm_90 kernel switched off by DW_MOE_FP8=0, another
 * architecture); an mxfp8 node asks for an mxfp8 kernel per pass the same way (1x32 UE8M0
 * blocks: x, dy along their rows, W along K, W^T along M, wgrad's dy^T, x^T along each expert's
 * 32-padded rows; K or M not a multiple of 32, or a target with no mxfp8 entry, falls back to BF16
 * with the reason); any other quantised recipe falls back to BF16 without asking (the engine's
 * expert operands are fp8_block's and mxfp8's). No kernel for a pass is a compile error naming the
 * node. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/bind_grouped.h"
#include "compile/passes.h"
#include "core/env.h"
#include "core/error.h"
#include "gemm/grouped.h"
#include "gemm/grouped_fp8.h"
#include "gemm/grouped_mxfp8.h"

dw_recipe dw_compile_moe_recipe(const dw_compiled *c, int i) {
    const dw_recipe r = c->node[i].bind.recipe;
    return c->bf16 && dw_compile_quant_recipe(r) ? dw_compile_quant_act_recipe(r) : DW_RECIPE_BF16;
}

/* Pass p of MoE linear node i as the engine issues it in recipe r: x [R,K] rows grouped by expert,
 * W [E,M,K]; FP32 on the CPU (its backend computes in FP32), else the program's activation type.
 * Pointers are placeholders (aligned). */
static dw_grouped_args node_args(const dw_compiled *c, int i, int p, dw_recipe r) {
    const dw_ir_node *n = &c->g->nodes[i];
    const dw_ir_tensor *w = &c->g->tensors[n->in[1]];
    const bool cuda = c->target.device == DW_DEVICE_CUDA;
    const void *ph = (const void *)(uintptr_t)4096;
    const float *sc = r == DW_RECIPE_BF16 ? NULL : (const float *)ph;
    return (dw_grouped_args){.pass = p, .dtype = cuda && c->bf16 ? DW_GROUPED_BF16 : DW_GROUPED_F32,
                             .recipe = r, .rows = c->tensor[n->in[0]].rows_cap, .experts = w->shape[0],
                             .m = w->shape[1], .k = w->shape[2], .x = ph, .w = ph, .dy = ph, .out = (void *)ph,
                             .offsets = (const int32_t *)ph, .x_scales = sc, .w_scales = sc, .dy_scales = sc};
}

/* Whether the registry's kernel `name` takes recipe r: the built-in and fp8_block entries by their
 * descriptions; a kernel registered by a user is assumed to (its reason is then shown). */
static bool takes_recipe(const char *name, int nl, dw_recipe r) {
    const dw_grouped_kernel_desc *d[64];
    int n = dw_grouped_builtin_kernels(d, 64);
    n += dw_grouped_fp8_kernels(d + n, 64 - n);
    n += dw_grouped_mxfp8_kernels(d + n, 64 - n);
    for (int i = 0; i < n; i++)
        if ((int)strlen(d[i]->name) == nl && !strncmp(d[i]->name, name, (size_t)nl))
            return d[i]->recipe < 0 || d[i]->recipe == (int32_t)r;
    return true;
}

/* From a registry account in recipe r (one "  name  prio N  eligible|rejected: why" line per
 * kernel), the reasons of the kernels that take r and run on this device ("name: why; ..."):
 * the others say nothing about the fallback. */
static void fallback_reasons(const char *log, dw_recipe r, char *out, size_t n) {
    size_t used = 0;
    out[0] = '\0';
    for (const char *l = log; *l;) {
        const char *e = strchr(l, '\n'), *end = e ? e : l + strlen(l);
        const char *rj = strstr(l, "rejected: ");
        if (rj && rj < end) {
            const char *why = rj + strlen("rejected: ");
            const int wl = (int)(end - why);
            while (*l == ' ') l++;
            const int nl = (int)strcspn(l, " ");
            const bool other = !takes_recipe(l, nl, r) || !strncmp(why, "CUDA kernel, CPU target", 23) ||
                               !strncmp(why, "CPU kernel, CUDA target", 23);
            if (!other && used + 1 < n) {
                const int w = snprintf(out + used, n - used, "%s%.*s: %.*s", used ? "; " : "", nl, l, wl, why);
                if (w > 0) used = used + (size_t)w < n ? used + (size_t)w : n - 1;
            }
        }
        l = e ? e + 1 : end;
    }
    if (!out[0]) snprintf(out, n, "no registered grouped kernel takes %s (the grouped GEMMs are bf16, fp8_block and mxfp8)",
                          dw_recipe_name(r));
}

/* DW_MOE_GEMM (core/env.h) on a CUDA target: the built-in kernel asked for (NULL: auto, unset or
 * another target); *bad for a value it does not know. */
static const char *forced_backend(const dw_compiled *c, const char **bad) {
    const char *v = dw_env("DW_MOE_GEMM");
    *bad = NULL;
    if (!v || !strcmp(v, "auto") || c->target.device != DW_DEVICE_CUDA) return NULL;
    static const char *const knob[][2] = {
        {"simt", "grouped_cuda_simt"}, {"mma", "grouped_mma_sm80"}, {"wgmma", "grouped_wgmma_sm90"}};
    for (size_t i = 0; i < sizeof knob / sizeof knob[0]; i++)
        if (!strcmp(v, knob[i][0])) return knob[i][1];
    *bad = v;
    return NULL;
}

static const char *const pass_names[DW_QPASS_COUNT] = {"fprop", "dgrad", "wgrad"};

/* Why a quantised recipe other than fp8_block and mxfp8 keeps the experts BF16: the MoE linear
 * layer's operands and weight cache (runtime/moe_fp8.h) are those two recipes'. */
static const char engine_recipes[] = "the MoE layers run their experts quantised in fp8_block and mxfp8 only";

/* Whether the engine runs experts in recipe r (the registry is then asked for a kernel). */
static bool engine_recipe(dw_recipe r) { return r == DW_RECIPE_FP8_BLOCK || r == DW_RECIPE_MXFP8; }

/* Node i's note (compile --report): per pass quantised with its kernel, or the BF16 fallback and why. */
static dw_status grouped_note(dw_ctx *ctx, dw_compiled *c, int i, char why[DW_QPASS_COUNT][1024]) {
    const dw_node_binding *b = &c->node[i].bind;
    char buf[3600];
    size_t used = 0;
    for (int p = 0; p < DW_QPASS_COUNT; p++) {
        const int w = snprintf(buf + used, sizeof buf - used, "%s%s %s%s (%s)", p ? "; " : "", pass_names[p],
                               b->quantised[p] ? "quantised" : "BF16 FALLBACK: ", b->quantised[p] ? "" : why[p],
                               b->kernel[p]);
        if (w > 0 && (size_t)w < sizeof buf - used) used += (size_t)w;
    }
    free(c->node[i].bind.note);
    c->node[i].bind.note = strdup(buf);
    return c->node[i].bind.note ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
}

dw_status dw_compile_bind_grouped(dw_ctx *ctx, dw_compiled *c, int i) {
    const char *bad = NULL, *forced = forced_backend(c, &bad);
    if (bad) return dw_set_error(ctx, DW_ERR_INVALID, "compile: DW_MOE_GEMM must be auto, wgmma, mma or simt, not '%s'", bad);
    dw_node_binding *b = &c->node[i].bind;
    const dw_recipe rq = dw_compile_moe_recipe(c, i);
    char why[DW_QPASS_COUNT][1024];
    for (int p = 0; p < DW_QPASS_COUNT; p++) {
        b->quantised[p] = false;
        why[p][0] = '\0';
        if (rq != DW_RECIPE_BF16 && !engine_recipe(rq)) { /* no engine path for its operands */
            snprintf(why[p], sizeof why[p], "%s", engine_recipes);
        } else if (rq != DW_RECIPE_BF16 && !dw_policy_keeps_bf16(b->bf16_passes, b->rule, p, why[p], sizeof why[p])) {
            /* the policy's recipe first (unless its rule keeps the pass BF16: why[p] says so);
             * DW_MOE_GEMM names BF16 kernels only */
            dw_grouped_args q = node_args(c, i, p, rq);
            b->kernel[p] = dw_grouped_registry_pick((dw_device_kind)c->target.device, c->target.sm, &q, NULL, 0);
            if ((b->quantised[p] = b->kernel[p] != NULL)) continue;
            char log[3072] = "";
            dw_grouped_registry_pick((dw_device_kind)c->target.device, c->target.sm, &q, log, sizeof log);
            fallback_reasons(log, rq, why[p], sizeof why[p]);
        }
        dw_grouped_args a = node_args(c, i, p, DW_RECIPE_BF16);
        a.backend = forced;
        b->kernel[p] = dw_grouped_registry_pick((dw_device_kind)c->target.device, c->target.sm, &a, NULL, 0);
        if (b->kernel[p]) continue;
        char log[3072] = "";
        dw_grouped_registry_pick((dw_device_kind)c->target.device, c->target.sm, &a, log, sizeof log);
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "compile: node '%s' (moe_linear): no grouped kernel runs its %s "
                            "(%lld experts, K %lld, M %lld) on %s sm_%d%s:\n%s", c->g->nodes[i].name, pass_names[p],
                            (long long)a.experts, (long long)a.k, (long long)a.m,
                            c->target.device == DW_DEVICE_CUDA ? "cuda" : "cpu", c->target.sm,
                            forced ? " (DW_MOE_GEMM asks for one)" : "", log);
    }
    return rq != DW_RECIPE_BF16 ? grouped_note(ctx, c, i, why) : DW_OK;
}

/* The registry's lines of log, indented under a pass. */
static void indent_log(const char *log, FILE *f) {
    for (const char *l = log; *l;) {
        const char *e = strchr(l, '\n');
        const int n = e ? (int)(e - l) : (int)strlen(l);
        fprintf(f, "     %.*s\n", n, l);
        l += n + (e != NULL);
    }
}

void dw_compile_explain_grouped(const dw_compiled *c, int i, FILE *f) {
    const char *bad = NULL, *forced = forced_backend(c, &bad);
    const dw_node_binding *b = &c->node[i].bind;
    const dw_recipe rq = dw_compile_moe_recipe(c, i);
    if (rq != DW_RECIPE_BF16)
        fprintf(f, "     recipe %s (policy: %s)%s; the router stays BF16/FP32\n", dw_recipe_name(b->recipe),
                b->reason == DW_POLICY_BY_RULE ? "rule" : dw_policy_reason_text(b->reason),
                rq == DW_RECIPE_FP8_BLOCK ? ": where a pass runs in fp8_block, x and dy are quantised 1x128 per call "
                                            "and W, W^T 128x128 per expert once per weight update"
                : rq == DW_RECIPE_MXFP8 ? ": where a pass runs in mxfp8, x and dy (wgrad: dy^T, x^T along each "
                                          "expert's 32-padded rows) are quantised 1x32 per call and W, W^T 1x32 "
                                          "once per weight update" : "");
    else if (c->bf16 && b->reason != DW_POLICY_BY_DEFAULT) /* a quantised program keeps these experts BF16 */
        fprintf(f, "     recipe bf16 (policy: %s)\n", dw_policy_reason_text(b->reason));
    for (int p = 0; p < DW_QPASS_COUNT; p++) {
        dw_grouped_args a = node_args(c, i, p, DW_RECIPE_BF16);
        fprintf(f, "     %s: rows %lld, %lld experts, K %lld -> M %lld, %s%s\n", pass_names[p], (long long)a.rows,
                (long long)a.experts, (long long)a.k, (long long)a.m, a.dtype == DW_GROUPED_BF16 ? "bf16" : "fp32",
                forced ? " (DW_MOE_GEMM asks for one)" : "");
        if (rq != DW_RECIPE_BF16) {
            char log[3072] = "";
            dw_grouped_args q = node_args(c, i, p, rq);
            dw_grouped_registry_pick((dw_device_kind)c->target.device, c->target.sm, &q, log, sizeof log);
            fprintf(f, "       in %s:\n", dw_recipe_name(rq));
            indent_log(log, f);
            if (b->quantised[p]) {
                fprintf(f, "       selected: %s (%s)\n", b->kernel[p] ? b->kernel[p] : "(none)", dw_recipe_name(rq));
                continue;
            }
            char why[1024];
            if (!dw_policy_keeps_bf16(b->bf16_passes, b->rule, p, why, sizeof why)) { /* else why names the rule */
                if (engine_recipe(rq)) fallback_reasons(log, rq, why, sizeof why);
                else snprintf(why, sizeof why, "%s", engine_recipes);
            }
            fprintf(f, "       BF16 fallback: %s\n       in bf16:\n", why);
        }
        char log[3072] = "";
        a.backend = forced;
        dw_grouped_registry_pick((dw_device_kind)c->target.device, c->target.sm, &a, log, sizeof log);
        indent_log(log, f);
        fprintf(f, "       selected: %s%s\n", b->kernel[p] ? b->kernel[p] : "(none)",
                rq != DW_RECIPE_BF16 ? " (bf16 fallback)" : "");
    }
}
