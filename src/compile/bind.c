/* bind.c — the decisions per node: its recipe from the precision policy (linear layers; every
 * other op runs in the activation type), and for linear layers which of the three GEMMs run
 * quantised on the target and with which kernel — asked of the GEMM registry, the one home of
 * the kernels' rules — with a readable note. An op the target's backend lacks (ops.def's column
 * 0) is refused here, naming the op, the node and the backend. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/bind_grouped.h"
#include "compile/passes.h"
#include "core/error.h"
#include "gemm/registry.h"

void dw_compile_quant_shape(dw_qpass pass, int64_t N, int64_t K, int64_t M, int64_t *m, int64_t *n, int64_t *k) {
    switch (pass) {
    case DW_QPASS_FPROP: *m = N, *n = M, *k = K; break; /* y [N,M] = x [N,K] . W^T */
    case DW_QPASS_DGRAD: *m = N, *n = K, *k = M; break; /* dx [N,K] = dy [N,M] . W */
    default: *m = M, *n = K, *k = N; break;             /* dW [M,K] = dy^T [M,N] . x */
    }
}

void dw_compile_linear_dims(const dw_compiled *c, int i, int64_t *N, int64_t *K, int64_t *M) {
    const dw_ir_node *n = &c->g->nodes[i];
    const dw_ir_tensor *x = &c->g->tensors[n->in[0]], *y = &c->g->tensors[n->out[0]];
    *N = c->g->batch * c->g->seq;
    *K = x->shape[x->ndim - 1];
    *M = y->shape[y->ndim - 1];
}

const char *dw_compile_target_pick(const dw_compiled *c, const dw_gemm_args *args) {
    return dw_gemm_registry_pick((dw_device_kind)c->target.device, c->target.sm, args, NULL, 0);
}

/* The GEMM of `pass` as the engine issues it: quantised operands K-major (A stored [m,k], B
 * stored [n,k]); BF16 ones as the BF16 path lays them out. Pointers are placeholders (aligned). */
static dw_gemm_args pass_args(const dw_compiled *c, int i, dw_qpass pass, int64_t rows, bool quant) {
    int64_t N = rows, K, M, m, n, k, cap;
    dw_compile_linear_dims(c, i, &cap, &K, &M);
    dw_compile_quant_shape(pass, N, K, M, &m, &n, &k);
    const dw_recipe r = c->node[i].bind.recipe;
    const dw_recipe ra = quant ? dw_compile_quant_act_recipe(r) : DW_RECIPE_BF16;
    const dw_recipe rb = quant && pass != DW_QPASS_WGRAD ? dw_compile_quant_weight_recipe(r) : ra;
    const void *p = (const void *)(uintptr_t)4096;
    dw_gemm_args a = {.pass = (int32_t)pass, .m = m, .n = n, .k = k, .alpha = 1.0f, .d = (void *)(uintptr_t)4096,
                      .out_type = pass == DW_QPASS_WGRAD ? DW_GEMM_OUT_F32 : DW_GEMM_OUT_BF16};
    a.a = (dw_gemm_operand){.recipe = ra, .rows = m, .cols = k, .data = p, .scales = quant ? p : NULL,
                            .tensor_scale = 1.0f};
    a.b = (dw_gemm_operand){.recipe = rb, .trans = true, .rows = n, .cols = k, .data = p, .scales = quant ? p : NULL,
                            .tensor_scale = 1.0f};
    if (!quant && pass == DW_QPASS_DGRAD) a.b = (dw_gemm_operand){.recipe = rb, .rows = k, .cols = n, .data = p,
                                                                   .tensor_scale = 1.0f}; /* W [M,K] as stored */
    if (!quant && pass == DW_QPASS_WGRAD) { /* dy^T [M,N] from dy [N,M]; x [N,K] as stored */
        a.a = (dw_gemm_operand){.recipe = ra, .trans = true, .rows = k, .cols = m, .data = p, .tensor_scale = 1.0f};
        a.b = (dw_gemm_operand){.recipe = rb, .rows = k, .cols = n, .data = p, .tensor_scale = 1.0f};
    }
    if (pass == DW_QPASS_WGRAD) a.beta = 1.0f, a.c = p; /* accumulated into the FP32 gradient */
    return a;
}

bool dw_compile_linear_quantised(const dw_compiled *c, int i, dw_qpass pass, int64_t rows, const char **kernel,
                                 char *why, size_t why_len) {
    const dw_node_binding *b = &c->node[i].bind;
    if (kernel) *kernel = NULL;
    if (why && why_len) why[0] = '\0';
    if (!c->bf16 || !dw_compile_quant_recipe(b->recipe)) {
        if (why && why_len) snprintf(why, why_len, "the node's recipe is %s", c->bf16 ? "bf16" : "fp32");
        return false;
    }
    if (dw_policy_keeps_bf16(b->bf16_passes, b->rule, pass, why, why_len)) return false;
    int64_t cap, K, M;
    dw_compile_linear_dims(c, i, &cap, &K, &M);
    if (rows == cap && b->kernel[pass] && !why) { /* decided at compile time */
        if (kernel && b->quantised[pass]) *kernel = b->kernel[pass];
        return b->quantised[pass];
    }
    dw_gemm_args a = pass_args(c, i, pass, rows, true);
    const char *k = dw_gemm_registry_pick((dw_device_kind)c->target.device, c->target.sm, &a, why, why_len);
    if (kernel) *kernel = k;
    return k != NULL;
}

bool dw_compile_gelu_epilogue(const dw_compiled *c, int linear, int64_t rows) {
    if (!dw_compile_linear_quantised(c, linear, DW_QPASS_FPROP, rows, NULL, NULL, 0))
        return true; /* the BF16 GEMM's GELU_AUX epilogue */
    dw_gemm_args a = pass_args(c, linear, DW_QPASS_FPROP, rows, true);
    if (c->g->nodes[linear].n_in == 3) a.epilogue = DW_EPI_BIAS, a.bias = (const void *)(uintptr_t)4096;
    dw_gemm_args g = a;
    g.epilogue |= DW_EPI_GELU | DW_EPI_GELU_AUX;
    g.aux = (void *)(uintptr_t)4096;
    const char *plain = dw_compile_target_pick(c, &a), *fused = dw_compile_target_pick(c, &g);
    return plain && fused && !strcmp(plain, fused);
}

/* Node i's note: per GEMM at the planned shape, quantised or the BF16 fallback and why. */
static dw_status linear_note(dw_ctx *ctx, dw_compiled *c, int i, char why[DW_QPASS_COUNT][768]) {
    int64_t N, K, M;
    dw_compile_linear_dims(c, i, &N, &K, &M);
    static const char *names[DW_QPASS_COUNT] = {"fprop", "dgrad", "wgrad"};
    const dw_node_binding *b = &c->node[i].bind;
    char buf[3072];
    size_t used = 0;
    for (int p = 0; p < DW_QPASS_COUNT; p++) {
        int64_t m, nn, k;
        dw_compile_quant_shape((dw_qpass)p, N, K, M, &m, &nn, &k);
        int w = snprintf(buf + used, sizeof buf - used, "%s%s %lldx%lldx%lld %s%s%s (%s)", p ? "; " : "", names[p],
                         (long long)m, (long long)nn, (long long)k, b->quantised[p] ? "quantised" : "BF16 FALLBACK: ",
                         b->quantised[p] ? "" : why[p], "", b->kernel[p] ? b->kernel[p] : "no kernel");
        if (w > 0 && (size_t)w < sizeof buf - used) used += (size_t)w;
    }
    c->node[i].bind.note = strdup(buf);
    return c->node[i].bind.note ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
}

static dw_status bind_linear(dw_ctx *ctx, dw_compiled *c, int i) {
    dw_node_binding *b = &c->node[i].bind;
    if (!c->bf16) return DW_OK; /* FP32 mode: the FP32 reference linear of each backend */
    int64_t N, K, M;
    dw_compile_linear_dims(c, i, &N, &K, &M);
    char why[DW_QPASS_COUNT][768];
    for (int p = 0; p < DW_QPASS_COUNT; p++) {
        why[p][0] = '\0';
        b->quantised[p] = dw_compile_linear_quantised(c, i, (dw_qpass)p, N, &b->kernel[p], why[p], sizeof why[p]);
        if (!b->quantised[p]) { /* BF16: the kernel the registry picks for the BF16 GEMM */
            dw_gemm_args a = pass_args(c, i, (dw_qpass)p, N, false);
            b->kernel[p] = dw_compile_target_pick(c, &a);
        }
    }
    return dw_compile_quant_recipe(b->recipe) ? linear_note(ctx, c, i, why) : DW_OK;
}

dw_status dw_compile_bind(dw_ctx *ctx, dw_compiled *c, const dw_policy *policy) {
    const dw_graph *g = c->g;
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        dw_node_binding *b = &c->node[i].bind;
        b->rule = -1;
        b->recipe = DW_RECIPE_BF16;
        b->reason = DW_POLICY_NOT_GEMM;
        if (!dw_op_on_backend(n->op, c->target.device)) {
            const bool cuda = c->target.device == DW_DEVICE_CUDA;
            return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                                "compile: op %s (node '%s') has no %s implementation yet (ops.def's %s column is 0); "
                                "compile for the %s", dw_op_name(n->op), n->name, cuda ? "CUDA" : "CPU",
                                cuda ? "cuda" : "cpu", cuda ? "CPU (--device cpu)" : "GPU");
        }
        if (n->op == DW_OP_MOE_LINEAR) { /* the grouped GEMM kind, its recipe the policy's: bind_grouped.c */
            if (policy && c->bf16)
                b->recipe = dw_policy_resolve(policy, n->name, dw_op_name(n->op), g->model.n_blocks, &b->reason, &b->rule);
            b->bf16_passes = dw_policy_bf16_passes(policy, b->rule, dw_op_name(n->op), b->recipe);
            DW_TRY(dw_compile_bind_grouped(ctx, c, i));
            continue;
        }
        if (!DW_OP_IS(n, DW_OPF_GEMM)) continue;
        if (policy)
            b->recipe = dw_policy_resolve(policy, n->name, dw_op_name(n->op), g->model.n_blocks, &b->reason, &b->rule);
        b->bf16_passes = dw_policy_bf16_passes(policy, b->rule, dw_op_name(n->op), b->recipe);
        DW_TRY(bind_linear(ctx, c, i));
    }
    return DW_OK;
}
