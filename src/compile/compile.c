/* compile.c — dw_compile: a graph, an optional one-GPU plan and a precision policy become the
 * program (program.h) for a target, in this order: decisions per node (bind.c), parameter pools
 * (params.c), gradient delivery (grads.c), fusion (fuse.c), shared gradients (grads.c), BF16
 * copies (params.c), the activation arena (arena.c), the workspace (workspace.c) and the step
 * list (steps.c). Planning only: nothing here touches
 * a device, so a machine without a GPU compiles CUDA programs. The report is compile_report.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/passes.h"
#include "core/env.h"
#include "core/error.h"
#include "gemm/compute_capability.h"
#include "ir/float_graph.h"

const char *dw_pool_name(dw_pool_id p) {
    static const char *names[DW_POOL_COUNT] = {"weights", "grads", "optimizer", "activations", "workspace"};
    return p >= 0 && p < DW_POOL_COUNT ? names[p] : "?";
}

void dw_compile_opts_init(dw_compile_opts *o, size_t size) {
    const char *chunk = dw_env("DW_HEAD_CHUNK");
    char *end = NULL;
    long long rows = chunk ? strtoll(chunk, &end, 10) : 0;
    if (chunk && (end == chunk || *end)) rows = -1; /* not a number: dw_compile refuses it */
    dw_compile_opts d = {.size = sizeof d, .device = DW_DEVICE_AUTO, .sm = 0, .fuse = dw_env_flag("DW_FUSE", true),
                         .fused_head = dw_env_flag("DW_FUSED_HEAD", false),
                         .head_chunk = rows, .moe_remat = dw_env_flag("DW_MOE_REMAT", true),
                         .grad_arena = dw_env_flag("DW_GRAD_ARENA", false),
                         .bf16_arena = dw_env_flag("DW_BF16_ARENA", false),
                         .wcache_arena = dw_env_flag("DW_WCACHE_ARENA", true)};
    memset(o, 0, size);
    memcpy(o, &d, size < sizeof d ? size : sizeof d);
    o->size = size;
}

void dw_compiled_free(dw_compiled *c) {
    if (!c) return;
    for (int i = 0; c->node && i < c->g->n_nodes; i++) free(c->node[i].bind.note);
    free(c->node);
    free(c->tensor);
    free(c->steps);
    free(c->bwd_t);
    free(c->rc_t);
    free(c->sweep);
    free(c->policy_json);
    free(c->param_tensor);
    free(c->param_off);
    free(c->grad_first);
    free(c->bf16_lazy);
    free(c->bf16_runs);
    free(c->items);
    free(c->info);
    free(c);
}

int64_t dw_compiled_head_chunk(const dw_compiled *c) { return c && c->head_xent >= 0 ? c->head_chunk : 0; }

int64_t dw_compiled_pool_bytes(const dw_compiled *c, int pool) {
    return c && pool >= 0 && pool < DW_POOL_COUNT ? c->pool_bytes[pool] : 0;
}

/* The options a caller built against this or an older header gave (defaults for the rest). */
static dw_compile_opts read_opts(const dw_compile_opts *opts) {
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    if (opts) memcpy(&o, opts, opts->size < sizeof o ? opts->size : sizeof o);
    return o;
}

static dw_status target_of(dw_ctx *ctx, const dw_compile_opts *o, dw_compile_target *t) {
    t->device = o->device == DW_DEVICE_AUTO ? (int)dw_ctx_device(ctx) : (int)o->device;
    if (t->device != DW_DEVICE_CPU && t->device != DW_DEVICE_CUDA)
        return dw_set_error(ctx, DW_ERR_INVALID, "compile: unknown target device %d", (int)o->device);
    t->sm = 0;
    if (t->device == DW_DEVICE_CUDA) {
        t->sm = o->sm ? o->sm : dw_ctx_device(ctx) == DW_DEVICE_CUDA ? dw_gemm_ctx_sm(ctx) : 90;
        if (t->sm < 50 || t->sm > 200)
            return dw_set_error(ctx, DW_ERR_INVALID, "compile: compute capability %d is not a GPU's (90 = sm_90)", t->sm);
    }
    return DW_OK;
}

/* A plan the one-device executor runs as it is: world size 1, no ZeRO or offload (ZeRO runs across
 * ranks), and a micro-batch of at most the graph's batch x seq; its recompute is taken unless the
 * options name one. */
static dw_status check_plan(dw_ctx *ctx, const dw_graph *g, const dw_plan *plan, int *recompute) {
    dw_plan_layout l;
    l.size = sizeof l;
    DW_TRY(dw_plan_get_layout(plan, &l));
    if (l.recompute && !*recompute) *recompute = l.recompute; /* the plan's, unless the options name one */
    const int world = dw_plan_world_size(plan);
    if (world != 1)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                            "compile: plan '%s' spans %d GPUs; the executor runs one device for now (pass a "
                            "one-GPU plan or none)", dw_plan_summary(plan), world);
    if (l.zero || l.offload)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                            "compile: plan '%s' asks for%s%s; the one-device executor has neither (ZeRO runs "
                            "across ranks: dw_train_opts.zero)", dw_plan_summary(plan), l.zero ? " ZeRO" : "",
                            l.offload ? " offload" : "");
    if (l.micro_batch > g->batch || l.seq > g->seq)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "compile: plan '%s' runs micro-batches of %lld x %lld tokens but the graph was captured "
                            "at %lld x %lld (capture at the plan's micro-batch and seq)", dw_plan_summary(plan),
                            (long long)l.micro_batch, (long long)l.seq, (long long)g->batch, (long long)g->seq);
    return DW_OK;
}

dw_status dw_compile(dw_ctx *ctx, const dw_graph *g, const dw_plan *plan, const dw_policy *policy,
                     const dw_compile_opts *opts, dw_compiled **out) {
    *out = NULL;
    if (!g) return dw_set_error(ctx, DW_ERR_INVALID, "compile: no graph");
    const dw_compile_opts o = read_opts(opts);
    int recompute = o.recompute;
    if (plan) DW_TRY(check_plan(ctx, g, plan, &recompute));
    if (o.head_chunk < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "compile: head_chunk %lld rows is negative or DW_HEAD_CHUNK is not a number of rows "
                            "(0: the compiler's choice)",
                            (long long)o.head_chunk);
    if (g->tokens < 0 || g->logits < 0 || (!dw_graph_float_input(g) && (g->loss < 0 || g->targets < 0)))
        return dw_set_error(ctx, DW_ERR_INVALID, "compile: the graph has no tokens/targets/logits/loss roles (nor "
                            "a feed-forward graph's input/output)");
    dw_compiled *c = calloc(1, sizeof *c);
    if (!c) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    c->g = g;
    dw_status st = target_of(ctx, &o, &c->target);
    c->bf16 = policy != NULL;
    c->fuse = o.fuse;
    c->fused_head = o.fused_head, c->head_chunk_want = o.head_chunk;
    c->moe_remat = o.moe_remat;
    c->grad_arena = o.grad_arena, c->grad_base = 0;
    c->bf16_arena = o.grad_arena && o.bf16_arena && policy, c->bf16_base = -1;
    c->wcache_arena = c->bf16_arena && o.wcache_arena;
    c->head_xent = c->head_linear = -1;
    c->act_size = c->bf16 ? 2 : 4;
    snprintf(c->precision, sizeof c->precision, "%s",
             !policy ? "fp32" : policy->n_rules ? "policy" : dw_recipe_name(policy->default_recipe));
    if (st == DW_OK && policy) st = dw_policy_to_json(ctx, policy, &c->policy_json);
    c->nvfp4 = policy ? policy->nvfp4 : dw_nvfp4_recipe_default();
    c->node = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof *c->node);
    c->tensor = calloc((size_t)(g->n_tensors ? g->n_tensors : 1), sizeof *c->tensor);
    if (st == DW_OK && (!c->node || !c->tensor)) st = dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    for (int t = 0; st == DW_OK && t < g->n_tensors; t++) { /* extents: rows follow the batch */
        const dw_ir_tensor *x = &g->tensors[t];
        c->tensor[t].rows_cap = x->ndim >= 2 && x->kind != DW_TENSOR_PARAM ? x->shape[0] * x->shape[1] : 1;
        c->tensor[t].width = x->ndim ? x->shape[x->ndim - 1] : 1;
        c->tensor[t].count_off = -1;
    }
    if (st == DW_OK) dw_compile_moe_rows(c);
    if (st == DW_OK) st = dw_compile_bind(ctx, c, policy);
    if (st == DW_OK) st = dw_compile_params(ctx, c);
    if (st == DW_OK) st = dw_compile_grad_modes(ctx, c);
    if (st == DW_OK) st = dw_compile_fuse(ctx, c);
    if (st == DW_OK) st = dw_compile_grad_alias(ctx, c);
    if (st == DW_OK) st = dw_compile_bf16_copies(ctx, c);
    if (st == DW_OK) st = dw_compile_times(ctx, c, recompute, o.recompute_blocks);
    if (st == DW_OK) st = dw_compile_grad_first(ctx, c);
    if (st == DW_OK) st = dw_compile_arena(ctx, c);
    if (st == DW_OK) st = dw_compile_workspace(ctx, c);
    if (st == DW_OK) st = dw_compile_steps(ctx, c);
    if (st != DW_OK) {
        dw_compiled_free(c);
        return st;
    }
    c->pool_bytes[DW_POOL_WEIGHTS] = c->param_floats * (4 + (c->bf16 && !c->bf16_arena ? 2 : 0));
    c->pool_bytes[DW_POOL_GRADS] = c->grad_arena ? 0 : c->param_floats * 4; /* else in the arena at grad_base */
    c->pool_bytes[DW_POOL_OPTIM] = c->param_floats * 8;
    c->pool_bytes[DW_POOL_ACT] = c->arena_bytes > 0 ? c->arena_bytes : 256;
    c->pool_bytes[DW_POOL_WORK] = c->work.bytes;
    *out = c;
    return DW_OK;
}
