/* engine_cpu.c — the CPU reference engine: captures the graph for a capacity B x T, carves one
 * block each for weights, gradients, activations (+ their gradients) and saved statistics, and
 * walks the nodes forward, then in reverse for backward. Per-op rules are in engine_ops.c,
 * weights (init, safetensors) in engine_weights.c. */
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "core/error.h"
#include "runtime/engine_cpu.h"
#include "runtime/engine_cuda.h"

static float *alloc_floats(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

void dw_engine_free(dw_engine *e) {
    if (!e) return;
    dw_engine_cuda_free(e->cuda);
    for (int i = 0; i < 4; i++) free(e->blocks[i]);
    for (int i = 0; i < DW_IR_MAX_INPUTS; i++) free(e->scratch[i]);
    free(e->val);
    free(e->grad);
    free(e->grad_ready);
    free(e->aux);
    free(e->params);
    dw_graph_free(e->g);
    free(e);
}

/* Sizes and carves every buffer; returns false when out of memory. */
static bool carve(dw_engine *e) {
    dw_graph *g = e->g;
    int nt = g->n_tensors;
    e->val = calloc((size_t)nt, sizeof *e->val);
    e->grad = calloc((size_t)nt, sizeof *e->grad);
    e->grad_ready = calloc((size_t)nt, sizeof *e->grad_ready);
    e->aux = calloc((size_t)g->n_nodes, sizeof *e->aux);
    if (!e->val || !e->grad || !e->grad_ready || !e->aux) return false;
    int64_t wsize = 0, asize = 0, xsize = 0, biggest = 1;
    for (int i = 0; i < nt; i++) {
        const dw_ir_tensor *t = &g->tensors[i];
        int64_t n = dw_ir_numel(t);
        if (t->kind == DW_TENSOR_PARAM) {
            wsize += n;
            e->n_params++;
        } else if (t->kind == DW_TENSOR_ACT) {
            asize += n;
            if (n > biggest) biggest = n;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) xsize += dw_engine_cpu_aux_size(g, &g->nodes[i]);
    e->blocks[0] = alloc_floats(wsize);
    e->blocks[1] = alloc_floats(wsize);
    e->blocks[2] = alloc_floats(2 * asize);
    e->blocks[3] = alloc_floats(xsize);
    e->params = calloc((size_t)(e->n_params ? e->n_params : 1), sizeof *e->params);
    for (int s = 0; s < DW_IR_MAX_INPUTS; s++) e->scratch[s] = alloc_floats(biggest);
    for (int i = 0; i < 4; i++)
        if (!e->blocks[i]) return false;
    for (int s = 0; s < DW_IR_MAX_INPUTS; s++)
        if (!e->scratch[s]) return false;
    if (!e->params) return false;
    float *w = e->blocks[0], *gw = e->blocks[1], *act = e->blocks[2], *aux = e->blocks[3];
    int p = 0;
    for (int i = 0; i < nt; i++) {
        const dw_ir_tensor *t = &g->tensors[i];
        int64_t n = dw_ir_numel(t);
        if (t->kind == DW_TENSOR_PARAM) {
            e->val[i] = w;
            e->grad[i] = gw;
            w += n;
            gw += n;
            dw_param *q = &e->params[p++];
            q->name = t->name;
            q->ndim = t->ndim;
            for (int d = 0; d < t->ndim; d++) q->shape[d] = t->shape[d];
            q->numel = n;
            q->data = e->val[i];
            q->grad = e->grad[i];
            q->decay = t->decay;
        } else if (t->kind == DW_TENSOR_ACT) {
            e->val[i] = act;
            e->grad[i] = act + n;
            act += 2 * n;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        e->aux[i] = aux;
        aux += dw_engine_cpu_aux_size(g, &g->nodes[i]);
    }
    return true;
}

dw_status dw_engine_create_cpu(dw_ctx *ctx, const dw_model_config *cfg, int64_t B, int64_t T,
                               dw_engine **out) {
    *out = NULL;
    dw_engine *e = calloc(1, sizeof *e);
    if (!e) return dw_set_error(ctx, DW_ERR_NOMEM, "engine: out of memory");
    e->ctx = ctx;
    e->cfg = *cfg;
    dw_status s = dw_capture_config(ctx, cfg, B, T, &e->g);
    if (s != DW_OK) {
        dw_engine_free(e);
        return s;
    }
    e->cap_b = e->b = B;
    e->cap_t = e->t = T;
    if (!carve(e)) {
        dw_engine_free(e);
        return dw_set_error(ctx, DW_ERR_NOMEM, "engine: out of memory allocating %s for batch %lld "
                            "x %lld", cfg->model_type, (long long)B, (long long)T);
    }
    *out = e;
    return DW_OK;
}

const dw_model_config *dw_engine_config(const dw_engine *e) { return &e->cfg; }
int dw_engine_param_count(const dw_engine *e) { return e->n_params; }
dw_param *dw_engine_param(dw_engine *e, int i) {
    DW_ASSERT(i >= 0 && i < e->n_params);
    return &e->params[i];
}
int64_t dw_engine_param_numel(const dw_engine *e) { return dw_graph_params(e->g); }

void dw_engine_zero_grad(dw_engine *e) {
    if (e->cuda) {
        dw_engine_cuda_zero_grad(e);
        return;
    }
    for (int i = 0; i < e->n_params; i++)
        memset(e->params[i].grad, 0, (size_t)e->params[i].numel * sizeof(float));
}

/* Checks the batch shape and token ranges; makes it current (the CUDA engine too). */
dw_status dw_engine_begin(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B,
                          int64_t T) {
    if (B < 1 || T < 1 || B > e->cap_b || T > e->cap_t)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: batch %lld x %lld exceeds the engine's "
                            "capacity %lld x %lld", (long long)B, (long long)T,
                            (long long)e->cap_b, (long long)e->cap_t);
    int64_t V = e->g->model.vocab;
    for (int64_t i = 0; i < B * T; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: token %lld at position %lld is "
                                "outside the vocabulary [0, %lld)", (long long)tokens[i],
                                (long long)i, (long long)V);
        if (targets && targets[i] >= V)
            return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: target %lld at position %lld is "
                                "outside the vocabulary [0, %lld)", (long long)targets[i],
                                (long long)i, (long long)V);
    }
    e->b = B;
    e->t = T;
    e->tokens = tokens;
    e->targets = targets;
    return DW_OK;
}

static void run_forward(dw_engine *e, bool with_loss) {
    for (int i = 0; i < e->g->n_nodes; i++) {
        const dw_ir_node *n = &e->g->nodes[i];
        if (n->op == DW_OP_CROSS_ENTROPY && !with_loss) continue;
        dw_engine_cpu_fwd(e, n);
    }
}

dw_status dw_engine_forward(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B,
                            int64_t T, float *logits, double *loss) {
    if (loss) *loss = 0;
    if (e->cuda) return dw_engine_cuda_forward(e, tokens, targets, B, T, logits, loss);
    DW_TRY(dw_engine_begin(e, tokens, targets, B, T));
    run_forward(e, targets != NULL);
    if (logits)
        memcpy(logits, e->val[e->g->logits], (size_t)(B * T * e->g->model.vocab) * sizeof(float));
    if (loss && targets) *loss = e->loss;
    e->tokens = e->targets = NULL;
    return DW_OK;
}

dw_status dw_engine_forward_backward(dw_engine *e, const int32_t *tokens, const int32_t *targets,
                                     int64_t B, int64_t T, double grad_scale, double *loss) {
    if (loss) *loss = 0;
    if (!targets) return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: backward needs targets");
    if (e->cuda) return dw_engine_cuda_forward_backward(e, tokens, targets, B, T, grad_scale, loss);
    DW_TRY(dw_engine_begin(e, tokens, targets, B, T));
    run_forward(e, true);
    memset(e->grad_ready, 0, (size_t)e->g->n_tensors * sizeof *e->grad_ready);
    for (int i = e->g->n_nodes - 1; i >= 0; i--) dw_engine_cpu_bwd(e, &e->g->nodes[i], grad_scale);
    if (loss) *loss = e->loss;
    e->tokens = e->targets = NULL;
    return DW_OK;
}

bool dw_engine_on_device(const dw_engine *e) { return e->cuda != NULL; }
dw_status dw_engine_sync_to_host(dw_engine *e, bool grads) {
    return e->cuda ? dw_engine_cuda_download(e, grads) : DW_OK;
}
dw_status dw_engine_sync_to_device(dw_engine *e) { return e->cuda ? dw_engine_cuda_upload(e) : DW_OK; }
const dw_compiled *dw_engine_compiled(const dw_engine *e) { return e->cuda ? dw_engine_cuda_plan(e) : NULL; }
dw_status dw_engine_adamw_step(dw_engine *e, double lr, double beta1, double beta2, double eps,
                               double weight_decay, double clip, int64_t step, double *grad_norm) {
    if (grad_norm) *grad_norm = 0;
    if (!e->cuda)
        return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "engine: the CPU engine has no built-in "
                            "optimizer; the CPU trainer steps with train/optstate");
    return dw_engine_cuda_adamw(e, lr, beta1, beta2, eps, weight_decay, clip, step, grad_norm);
}
dw_status dw_engine_adamw_moments(dw_engine *e, int i, float *m, float *v, bool to_device) {
    if (!e->cuda)
        return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "engine: the CPU engine keeps no optimizer "
                            "state (train/optstate does)");
    DW_ASSERT(i >= 0 && i < e->n_params);
    return dw_engine_cuda_moments(e, i, m, v, to_device);
}
