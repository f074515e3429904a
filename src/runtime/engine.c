/* engine.c — the public engine (deepwell.h dw_engine_*): a backend for the context's device, the
 * executor over the program (exec.c), batch checks, the loss and logits read back, the AdamW step
 * with its gradient-norm read back, parameter access, and the profiler's timed steps. No device
 * knowledge: everything device-specific is behind the backend table. Weights I/O is weights.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "comm/comm.h"
#include "compile/shard.h"
#include "core/error.h"
#include "core/log.h"
#include "formats/formats.h"
#include "ir/float_graph.h"
#include "runtime/engine.h"
#include "runtime/engine_grad_arena.h"

void dw_engine_opts_init(dw_engine_opts *o, size_t size) {
    dw_engine_opts d = {.size = sizeof d, .record = dw_env_flag("DW_CUDA_GRAPH", true),
                        .quant_reuse = dw_env_flag("DW_QUANT_REUSE", true)};
    memset(o, 0, size);
    memcpy(o, &d, size < sizeof d ? size : sizeof d);
    o->size = size;
}

void dw_adamw_opts_init(dw_adamw_opts *o, size_t size) {
    dw_adamw_opts d = {.size = sizeof d, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                       .clip = 1.0};
    memset(o, 0, size);
    memcpy(o, &d, size < sizeof d ? size : sizeof d);
    o->size = size;
}

/* The backend the context's device has. */
static dw_status backend_for(dw_ctx *ctx, dw_backend **be) {
    return dw_ctx_device(ctx) == DW_DEVICE_CUDA ? dw_backend_cuda_create(ctx, be) : dw_backend_cpu_create(ctx, be);
}

/* Whether backend be can run program c: every op has its entry; CUDA runs programs made for it. */
static dw_status check_program(dw_ctx *ctx, const dw_compiled *c, const dw_backend *be) {
    const dw_graph *g = c->g;
    for (int i = 0; i < g->n_nodes; i++)
        if (!dw_op_on_backend(g->nodes[i].op, be->device))
            return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s engine: op %s (node '%s') has no %s implementation",
                                be->i->name, dw_op_name(g->nodes[i].op), g->nodes[i].name, be->i->name);
    if (be->device == DW_DEVICE_CPU) return DW_OK; /* the reference runs any target's program */
    if (c->target.device != be->device)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s engine: the program was compiled for the %s (compile it for "
                            "this device)", be->i->name, c->target.device == DW_DEVICE_CPU ? "CPU" : "other device");
    if (c->target.sm != be->sm)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s engine: the program's kernels were chosen for sm_%d, the "
                            "device is sm_%d (compile it for this device)", be->i->name, c->target.sm, be->sm);
    return DW_OK;
}

/* dw_engine_opts.zero on several ranks (the launcher's environment, comm/comm.h): the rank's shard
 * of the optimizer state (ZeRO >= 1), of the gradients (ZeRO >= 2) and of the FP32 masters (ZeRO-3,
 * without the BF16 copies: train/dp_zero3.c makes each parameter's in its gather slot), by
 * compile/shard.h as train/dp.c steps them. */
static dw_status zero_shard(dw_engine *e, dw_exec_shard *out, bool *sharded) {
    const int64_t pf = e->p->param_floats;
    *out = (dw_exec_shard){.opt_lo = 0, .opt_hi = pf, .grad_lo = 0, .grad_hi = pf, .w_lo = 0, .w_hi = pf};
    *sharded = false;
    if (e->opts.zero < 0 || e->opts.zero > 3)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: ZeRO stage %d (dw_engine_opts.zero) is 0, 1, 2 or 3",
                            e->opts.zero);
    dw_launch_env env;
    if (e->opts.zero == 0) return DW_OK;
    DW_TRY(dw_launch_env_read(e->ctx, &env)); /* as dw_dist_env_get, the error on the context */
    int64_t lo, hi;
    dw_shard_range(pf, env.world, env.rank, &lo, &hi);
    if (env.world < 2 || hi <= lo) return DW_OK; /* one rank, or a model too small to cut */
    out->opt_lo = lo, out->opt_hi = hi;
    if (e->opts.zero >= 2) out->grad_lo = lo, out->grad_hi = hi;
    if (e->opts.zero == 3) out->w_lo = lo, out->w_hi = hi;
    *sharded = true;
    return DW_OK;
}

static int64_t pools_total(const dw_exec *x) {
    int64_t n = 0;
    for (int k = 0; k < DW_POOL_COUNT; k++) n += x->pool_bytes[k];
    return n;
}

dw_status dw_engine_create(dw_ctx *ctx, const dw_compiled *c, const dw_engine_opts *opts, dw_engine **out) {
    *out = NULL;
    if (!c) return dw_set_error(ctx, DW_ERR_INVALID, "engine: no program");
    dw_engine *e = calloc(1, sizeof *e);
    if (!e) return dw_set_error(ctx, DW_ERR_NOMEM, "engine: out of memory");
    e->ctx = ctx, e->p = c, e->g = c->g;
    dw_engine_opts_init(&e->opts, sizeof e->opts);
    if (opts) memcpy(&e->opts, opts, opts->size < sizeof e->opts ? opts->size : sizeof e->opts);
    e->opts.size = sizeof e->opts;
    e->layout = DW_WEIGHTS_LAYOUT_FUSED;
    dw_status s = backend_for(ctx, &e->be);
    if (s == DW_OK) s = check_program(ctx, c, e->be);
    dw_exec_shard shard;
    bool sharded = false;
    if (s == DW_OK) s = zero_shard(e, &shard, &sharded); /* ZeRO on several ranks: the shard's pools from the start */
    if (s == DW_OK) s = dw_exec_create(c, e->be, e->opts.record, e->opts.quant_reuse, sharded ? &shard : NULL, &e->x);
    if (s == DW_OK) s = dw_engine_arena_created(e); /* grad_arena: no ZeRO-2/3 shard of the gradients */
    if (s == DW_OK && sharded)
        DW_LOGI("engine: ZeRO-%d from creation: gradients of floats [%lld, %lld) (%lld bytes, %lld whole), optimizer "
                "state of [%lld, %lld) (%lld bytes, %lld whole); %lld bytes of pools in all", e->opts.zero,
                (long long)shard.grad_lo, (long long)shard.grad_hi, (long long)e->x->pool_bytes[DW_POOL_GRADS],
                (long long)c->pool_bytes[DW_POOL_GRADS], (long long)shard.opt_lo, (long long)shard.opt_hi,
                (long long)e->x->pool_bytes[DW_POOL_OPTIM], (long long)c->pool_bytes[DW_POOL_OPTIM],
                (long long)pools_total(e->x));
    if (s == DW_OK && sharded && shard.w_hi - shard.w_lo != c->param_floats)
        DW_LOGI("engine: ZeRO-3 from creation: FP32 masters of floats [%lld, %lld) (%lld bytes; the whole weights "
                "pool %lld)", (long long)shard.w_lo, (long long)shard.w_hi,
                (long long)e->x->pool_bytes[DW_POOL_WEIGHTS], (long long)c->pool_bytes[DW_POOL_WEIGHTS]);
    if (s != DW_OK) {
        dw_engine_free(e);
        return s;
    }
    *out = e;
    return DW_OK;
}

void dw_engine_free(dw_engine *e) {
    if (!e) return;
    dw_exec_free(e->x);
    dw_backend_free(e->be);
    free(e);
}

const dw_compiled *dw_engine_program(const dw_engine *e) { return e->p; }
const dw_graph *dw_engine_graph(const dw_engine *e) { return e->g; }
const char *dw_engine_backend(const dw_engine *e) { return e->be->i->name; }

dw_status dw_engine_check_batch(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T) {
    const dw_graph *g = e->g;
    if (dw_graph_float_input(g))
        return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "engine: the model takes float activations (B,T,%lld), not "
                            "tokens: call dw_engine_forward_float", (long long)dw_graph_input_width(g));
    if (!tokens) return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: no tokens");
    if (B < 1 || T < 1 || B > g->batch || T > g->seq)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: batch %lld x %lld exceeds the engine's capacity %lld x %lld",
                            (long long)B, (long long)T, (long long)g->batch, (long long)g->seq);
    const int64_t V = g->model.vocab;
    for (int64_t i = 0; i < B * T; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: token %lld at position %lld is outside the "
                                "vocabulary [0, %lld)", (long long)tokens[i], (long long)i, (long long)V);
        if (targets && targets[i] >= V)
            return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: target %lld at position %lld is outside the "
                                "vocabulary [0, %lld)", (long long)targets[i], (long long)i, (long long)V);
    }
    return DW_OK;
}

static dw_status read_loss(dw_engine *e, double *loss) {
    float l = 0;
    DW_TRY(e->be->i->download(e->be, &l, e->x->work + e->p->work.loss, sizeof l));
    *loss = (double)l;
    return DW_OK;
}

/* A forward reads every master: whole, or ZeRO-3's gathered around their use (train/dp_zero3.c). */
static dw_status readable_weights(const dw_engine *e, const char *what) {
    return e->x->param_at ? DW_OK : dw_exec_weights_whole(e->x, what);
}

static dw_status forward(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                         dw_exec_after_step after, void *user, float *logits, double *loss) {
    if (loss) *loss = 0;
    DW_TRY(readable_weights(e, "engine: forward"));
    if (logits && e->p->head_xent >= 0)
        return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "engine: the program fuses the LM head into the loss "
                            "(dw_compile_opts.fused_head), so it has no logits to read; compile without it (deepwell "
                            "train/bench step: --no-fused-head) to read logits");
    DW_TRY(dw_engine_check_batch(e, tokens, targets, B, T));
    DW_TRY(dw_exec_set_batch(e->x, tokens, targets, B, T));
    DW_TRY(dw_engine_arena_forward(e)); /* grad_arena: the forward takes the gradients' memory */
    DW_TRY(dw_exec_phase_each(e->x, DW_PHASE_FORWARD, false, 1.0, after, user));
    if (logits) {
        const int64_t n = B * T * e->g->model.vocab;
        const void *src = e->x->act + e->p->tensor[e->g->logits].val_off;
        if (!e->p->bf16) {
            DW_TRY(e->be->i->download(e->be, logits, src, (size_t)n * sizeof(float)));
        } else { /* BF16 codes into the upper halves, then widened in place from the end */
            uint16_t *h = (uint16_t *)logits + n;
            DW_TRY(e->be->i->download(e->be, h, src, (size_t)n * 2));
            for (int64_t i = 0; i < n; i++) logits[i] = dw_decode_bf16(h[i]);
        }
    }
    if (targets && loss) return read_loss(e, loss);
    return e->be->i->sync(e->be);
}

dw_status dw_engine_forward(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                            float *logits, double *loss) {
    return forward(e, tokens, targets, B, T, NULL, NULL, logits, loss);
}

dw_status dw_engine_forward_each(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                                 dw_exec_after_step after, void *user, double *loss) {
    return forward(e, tokens, targets, B, T, after, user, NULL, loss);
}

dw_status dw_engine_forward_backward(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B,
                                     int64_t T, double grad_scale, double *loss) {
    if (loss) *loss = 0;
    if (!targets) return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: backward needs targets");
    DW_TRY(readable_weights(e, "engine: backward"));
    DW_TRY(dw_engine_check_batch(e, tokens, targets, B, T));
    if (!e->x->grad_at) DW_TRY(dw_exec_grads_whole(e->x, "engine: backward")); /* ZeRO-2/3: dw_train stages */
    DW_TRY(dw_engine_arena_backward(e, true)); /* grad_arena: one backward per step */
    DW_TRY(dw_exec_set_batch(e->x, tokens, targets, B, T));
    DW_TRY(dw_exec_train_step(e->x, grad_scale));
    return loss ? read_loss(e, loss) : DW_OK;
}

dw_status dw_engine_zero_grad(dw_engine *e) { /* ZeRO-2/3: the shard's accumulator (the staging is dw_train's) */
    if (dw_engine_arena_zero_later(e)) return DW_OK; /* grad_arena: the backward zeroes each slice */
    return e->be->i->zero(e->be, e->x->grad, (size_t)(e->x->grad_hi - e->x->grad_lo) * sizeof(float));
}

dw_status dw_engine_adamw_args(dw_engine *e, const dw_adamw_opts *opts, int64_t step, dw_adamw_args *a) {
    dw_adamw_opts o;
    dw_adamw_opts_init(&o, sizeof o);
    if (opts) memcpy(&o, opts, opts->size < sizeof o ? opts->size : sizeof o);
    if (step < 1 || !(o.eps > 0) || !(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1) ||
        !(o.lr >= 0) || !(o.weight_decay >= 0) || !(o.clip >= 0))
        return dw_set_error(e->ctx, DW_ERR_INVALID, "adamw: step %lld, lr %g, betas %g/%g, eps %g, weight decay %g, "
                            "clip %g out of range", (long long)step, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.clip);
    *a = (dw_adamw_args){.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay,
                         .c1 = 1.0 - pow(o.beta1, (double)step), .c2 = 1.0 - pow(o.beta2, (double)step),
                         .max_norm = o.clip};
    return DW_OK;
}

/* The engine's own optimizer step needs the whole moments and gradients (not ZeRO shards). */
static dw_status whole_optimizer(dw_engine *e) {
    if (!dw_exec_moments_whole(e->x)) /* ZeRO-1/2/3 (train/dp.c) */
        return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "adamw: the engine holds the optimizer state of floats "
                            "[%lld, %lld) only (a ZeRO shard): its step is the data-parallel runtime's",
                            (long long)e->x->opt_lo, (long long)e->x->opt_hi);
    return dw_exec_grads_whole(e->x, "adamw");
}

dw_status dw_engine_step(dw_engine *e, const dw_adamw_opts *opts, int64_t step, double *grad_norm) {
    if (grad_norm) *grad_norm = 0;
    DW_TRY(whole_optimizer(e));
    DW_TRY(dw_engine_arena_readable(e, "adamw"));
    dw_adamw_args a;
    DW_TRY(dw_engine_adamw_args(e, opts, step, &a));
    dw_engine_arena_stepped(e);
    DW_TRY(dw_exec_optimizer(e->x, &a));
    double norm = 0;
    DW_TRY(e->be->i->download(e->be, &norm, e->x->work + e->p->work.norm, sizeof norm));
    if (grad_norm) *grad_norm = norm;
    if (!isfinite(norm))
        return dw_set_error(e->ctx, DW_ERR_NUMERIC, "adamw step %lld: gradient norm %g is not finite; parameters "
                            "left unchanged", (long long)step, norm);
    return DW_OK;
}

/* ---- parameters ---------------------------------------------------------------------------- */
static const dw_ir_tensor *param_tensor(const dw_engine *e, int i) { return &e->g->tensors[e->p->param_tensor[i]]; }

int dw_engine_param_count(const dw_engine *e) { return e->p->n_params; }
const char *dw_engine_param_name(const dw_engine *e, int i) {
    return i >= 0 && i < e->p->n_params ? param_tensor(e, i)->name : NULL;
}
int dw_engine_param_shape(const dw_engine *e, int i, int64_t shape[4]) {
    if (i < 0 || i >= e->p->n_params) return -1;
    const dw_ir_tensor *t = param_tensor(e, i);
    for (int d = 0; d < 4; d++) shape[d] = d < t->ndim ? t->shape[d] : 1;
    return t->ndim;
}

static dw_status param_copy(dw_engine *e, int i, float *base, float *host, bool in) {
    if (base == e->x->w) DW_TRY(dw_exec_weights_whole(e->x, "engine: parameter access"));
    if (base == e->x->grad) DW_TRY(dw_exec_grads_whole(e->x, "engine: gradient access"));
    if (base == e->x->grad) DW_TRY(dw_engine_arena_readable(e, "engine: gradient access"));
    if (i < 0 || i >= e->p->n_params)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: parameter %d of %d", i, e->p->n_params);
    float *dev = base + e->p->param_off[i];
    const size_t bytes = (size_t)dw_ir_numel(param_tensor(e, i)) * sizeof(float);
    return in ? e->be->i->upload(e->be, dev, host, bytes) : e->be->i->download(e->be, host, dev, bytes);
}

dw_status dw_engine_param_read(dw_engine *e, int i, float *values) { return param_copy(e, i, e->x->w, values, false); }
dw_status dw_engine_grad_read(dw_engine *e, int i, float *grads) { return param_copy(e, i, e->x->grad, grads, false); }
dw_status dw_engine_param_write(dw_engine *e, int i, const float *values) {
    DW_TRY(param_copy(e, i, e->x->w, (float *)values, true));
    return dw_engine_refresh(e);
}

dw_status dw_engine_read_value(dw_engine *e, int t, float *out) {
    const dw_prog_tensor *pt = &e->p->tensor[t];
    if (t < 0 || t >= e->g->n_tensors || pt->val_off < 0)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: tensor %d has no value in the program", t);
    const int64_t n = dw_exec_rows(e->x, t) * pt->width;
    const void *src = e->x->act + pt->val_off;
    if (e->g->tensors[t].dtype == DW_IR_I32) { /* int32 data (router experts), exact as floats below 2^24 */
        DW_TRY(e->be->i->download(e->be, out, src, (size_t)n * 4));
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, &out[i], 4);
            out[i] = (float)v;
        }
        return DW_OK;
    }
    if (!e->p->bf16) return e->be->i->download(e->be, out, src, (size_t)n * sizeof(float));
    uint16_t *h = (uint16_t *)out + n; /* BF16 codes into the upper halves, widened from the start */
    DW_TRY(e->be->i->download(e->be, h, src, (size_t)n * 2));
    for (int64_t i = 0; i < n; i++) out[i] = dw_decode_bf16(h[i]);
    return DW_OK;
}

dw_status dw_engine_write_value(dw_engine *e, int t, const float *in) {
    const dw_prog_tensor *pt = &e->p->tensor[t];
    if (t < 0 || t >= e->g->n_tensors || pt->val_off < 0)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: tensor %d has no value in the program", t);
    const int64_t n = dw_exec_rows(e->x, t) * pt->width;
    void *dst = e->x->act + pt->val_off;
    const bool i32 = e->g->tensors[t].dtype == DW_IR_I32, bf16 = !i32 && e->p->bf16;
    void *h = malloc((size_t)n * (bf16 ? 2 : 4));
    if (!h) return dw_set_error(e->ctx, DW_ERR_NOMEM, "engine: out of memory");
    for (int64_t i = 0; i < n; i++) {
        if (i32) ((int32_t *)h)[i] = (int32_t)in[i];
        else if (bf16) ((uint16_t *)h)[i] = dw_encode_bf16(in[i]);
        else ((float *)h)[i] = in[i];
    }
    dw_status st = e->be->i->upload(e->be, dst, h, (size_t)n * (bf16 ? 2 : 4));
    free(h);
    return st;
}

/* ---- mixture-of-experts statistics ------------------------------------------------------------- */
int64_t dw_engine_moe_experts(const dw_engine *e) { return e && e->p->work.moe_aux >= 0 ? e->p->work.moe_experts : 0; }

dw_status dw_engine_moe_stats(dw_engine *e, double *aux_loss, double *z_loss, int64_t *counts) {
    const int64_t E = dw_engine_moe_experts(e);
    if (!E) return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "engine: the model has no router loss");
    float *kept = malloc((size_t)(2 + E) * 4); /* the two losses, then E int32 counts (program.h) */
    if (!kept) return dw_set_error(e->ctx, DW_ERR_NOMEM, "engine: out of memory");
    dw_status st = e->be->i->download(e->be, kept, e->x->work + e->p->work.moe_aux, (size_t)(2 + E) * 4);
    if (st == DW_OK) {
        if (aux_loss) *aux_loss = kept[0];
        if (z_loss) *z_loss = kept[1];
        for (int64_t i = 0; counts && i < E; i++) {
            int32_t v;
            memcpy(&v, &kept[2 + i], 4);
            counts[i] = v;
        }
    }
    free(kept);
    return st;
}

dw_status dw_engine_moe_counts(dw_engine *e, int64_t *layers, int64_t *experts, int64_t *counts) {
    const dw_work_layout *w = &e->p->work;
    const int64_t L = w->moe_counts >= 0 ? w->moe_layers : 0, E = L ? w->moe_count_experts : 0;
    if (layers) *layers = L;
    if (experts) *experts = E;
    if (!counts || !L) return DW_OK;
    DW_TRY(e->be->i->sync(e->be));
    return e->be->i->download(e->be, counts, e->x->work + w->moe_counts, (size_t)(L * (DW_MOE_COUNT_LOAD + E)) * 8);
}

/* ---- profiling ------------------------------------------------------------------------------- */
dw_status dw_engine_time_steps(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                               double grad_scale, double *ms) {
    const dw_backend_i *bi = e->be->i;
    if (!bi->timers) return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "%s engine: no timers", bi->name);
    DW_TRY(readable_weights(e, "engine: timed steps"));
    DW_TRY(dw_engine_check_batch(e, tokens, targets, B, T));
    if (!e->x->grad_at) DW_TRY(dw_exec_grads_whole(e->x, "engine: timed backward"));
    DW_TRY(dw_engine_arena_backward(e, false)); /* grad_arena: each timed step's gradients anew */
    DW_TRY(dw_exec_set_batch(e->x, tokens, targets, B, T));
    const int first = e->p->phase[DW_PHASE_FORWARD][0], last = e->p->phase[DW_PHASE_BACKWARD][1];
    DW_TRY(bi->timers(e->be, last - first + 1));
    for (int ph = DW_PHASE_FORWARD; ph <= DW_PHASE_BACKWARD; ph++) {
        dw_exec_begin_phase(e->x, (dw_phase)ph);
        for (int s = e->p->phase[ph][0]; s < e->p->phase[ph][1]; s++) {
            bi->mark(e->be, s - first);
            DW_TRY(dw_exec_step(e->x, s, true, grad_scale));
        }
    }
    bi->mark(e->be, last - first);
    DW_TRY(bi->sync(e->be));
    for (int s = first; s < last; s++) ms[s] = bi->elapsed_ms(e->be, s - first, s - first + 1);
    return DW_OK;
}

dw_status dw_engine_time_optimizer(dw_engine *e, const dw_adamw_opts *o, int64_t step, double *ms, double *ms_zero) {
    const dw_backend_i *bi = e->be->i;
    if (!bi->timers) return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "%s engine: no timers", bi->name);
    DW_TRY(whole_optimizer(e)); /* the program's AdamW steps the whole pools */
    dw_adamw_args a;
    DW_TRY(dw_engine_adamw_args(e, o, step, &a));
    DW_TRY(bi->upload(e->be, e->x->work + e->p->work.adamw_args, &a, sizeof a));
    const int first = e->p->phase[DW_PHASE_OPTIMIZER][0], last = e->p->phase[DW_PHASE_OPTIMIZER][1];
    DW_TRY(bi->timers(e->be, last - first + 2));
    bi->mark(e->be, 0);
    DW_TRY(dw_engine_zero_grad(e));
    DW_TRY(dw_engine_arena_readable(e, "engine: timed optimizer")); /* grad_arena: the zeros, now */
    dw_exec_begin_phase(e->x, DW_PHASE_OPTIMIZER);
    for (int s = first; s < last; s++) {
        bi->mark(e->be, s - first + 1);
        DW_TRY(dw_exec_step(e->x, s, false, 1.0));
    }
    bi->mark(e->be, last - first + 1);
    DW_TRY(bi->sync(e->be));
    dw_engine_arena_stepped(e); /* bf16_arena: its refresh remade the copies */
    *ms_zero = bi->elapsed_ms(e->be, 0, 1);
    for (int s = first; s < last; s++) ms[s] = bi->elapsed_ms(e->be, s - first + 1, s - first + 2);
    return DW_OK;
}
