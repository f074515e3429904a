/* exec.c — the executor (exec.h): one walk of a program's steps for every backend. A step names
 * an op of ops.def and a node; the executor resolves the node's tensors to pointers in the pools
 * (program.h offsets), calls the backend's entry for the op, and adds gradients delivered
 * through ACC temporaries. Recording: a training step whose (b, t, dloss) was seen before is
 * recorded once and replayed, and so is the optimizer from its second call; a failed recording
 * is logged and the executor issues steps from then on. */
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/adamw_passes.h"
#include "runtime/exec.h"

dw_status dw_exec_create(const dw_compiled *p, dw_backend *be, bool record, bool quant_reuse,
                         const dw_exec_shard *shard, dw_exec **out) {
    *out = NULL;
    dw_exec *x = calloc(1, sizeof *x);
    if (!x) return dw_set_error(be->ctx, DW_ERR_NOMEM, "executor: out of memory");
    x->p = p;
    x->g = p->g;
    x->be = be;
    x->record = record && be->i->record_begin;
    x->quant_reuse = quant_reuse;
    x->fuse_cast = dw_env_flag("DW_FUSED_CAST", true);
    x->fuse_quant = x->fuse_cast && dw_env_flag("DW_FUSED_QUANT", true);
    x->fuse_norm = dw_env_flag("DW_FUSED_NORM", true);
    x->last_step = x->cast_fused_through = x->quant_fused_through = -1;
    x->wq_nodes = malloc((size_t)(p->n_steps ? p->n_steps : 1) * sizeof *x->wq_nodes);
    x->wq_fused = calloc((size_t)(p->n_steps ? p->n_steps : 1), sizeof *x->wq_fused);
    if (!x->wq_nodes || !x->wq_fused) {
        free(x->wq_nodes), free(x->wq_fused), free(x);
        return dw_set_error(be->ctx, DW_ERR_NOMEM, "executor: out of memory");
    }
    const int64_t pf = p->param_floats;
    const dw_exec_shard s0 = {0, pf, 0, pf, 0, pf}, *sh = shard ? shard : &s0;
    DW_ASSERT(0 <= sh->opt_lo && sh->opt_lo < sh->opt_hi && sh->opt_hi <= pf);
    DW_ASSERT(0 <= sh->grad_lo && sh->grad_lo < sh->grad_hi && sh->grad_hi <= pf);
    DW_ASSERT(0 <= sh->w_lo && sh->w_lo < sh->w_hi && sh->w_hi <= pf);
    const bool w_cut = sh->w_hi - sh->w_lo != pf; /* ZeRO-3: the masters' shard alone, no BF16 copies */
    for (int k = 0; k < DW_POOL_COUNT; k++) {
        void *mem = NULL;
        x->pool_bytes[k] = k == DW_POOL_OPTIM   ? 8 * (sh->opt_hi - sh->opt_lo) /* ZeRO: the shard's alone */
                           : k == DW_POOL_GRADS ? (p->grad_arena ? 0 : 4 * (sh->grad_hi - sh->grad_lo))
                           : k == DW_POOL_WEIGHTS && w_cut ? (4 * (sh->w_hi - sh->w_lo) + 255) / 256 * 256
                                                : p->pool_bytes[k];
        if (!x->pool_bytes[k]) continue; /* grad_arena: the gradients are in the activation pool */
        dw_status s = be->i->alloc(be, x->pool_bytes[k], &mem);
        if (s == DW_OK) s = be->i->zero(be, mem, (size_t)x->pool_bytes[k]); /* padding stays 0 through AdamW */
        x->pool[k] = mem;
        if (s != DW_OK) {
            dw_exec_free(x);
            return dw_prefix_error(be->ctx, s, "%s backend: the %s pool (%lld bytes)", be->i->name,
                                   dw_pool_name((dw_pool_id)k), (long long)x->pool_bytes[k]);
        }
    }
    x->w = (float *)x->pool[DW_POOL_WEIGHTS];
    x->wb = !p->bf16 || w_cut ? NULL
            : p->bf16_arena   ? (uint16_t *)(x->pool[DW_POOL_ACT] + p->bf16_base) /* in the arena */
                              : (uint16_t *)(x->w + pf);
    x->grad = p->grad_arena ? (float *)(x->pool[DW_POOL_ACT] + p->grad_base) : (float *)x->pool[DW_POOL_GRADS];
    x->grad_lo = sh->grad_lo, x->grad_hi = sh->grad_hi;
    x->m = (float *)x->pool[DW_POOL_OPTIM];
    x->v = x->m + (sh->opt_hi - sh->opt_lo);
    x->opt_lo = sh->opt_lo, x->opt_hi = sh->opt_hi;
    x->w_lo = sh->w_lo, x->w_hi = sh->w_hi;
    x->act = x->pool[DW_POOL_ACT];
    x->work = x->pool[DW_POOL_WORK];
    x->b = p->g->batch, x->t = p->g->seq;
    dw_status s = be->i->prepare ? be->i->prepare(be, x) : DW_OK;
    for (int i = 0; s == DW_OK && i < x->g->n_nodes; i++) { /* the ops' prepare entries */
        const dw_ir_node *n = &x->g->nodes[i];
        const dw_op_fn prep = be->i->ops[n->op].prepare;
        if (!prep) continue;
        dw_op_call c;
        dw_exec_resolve(x, i, true, 0.0, &c);
        s = prep(be, &c);
        if (s != DW_OK) s = dw_prefix_error(be->ctx, s, "%s backend: preparing node '%s'", be->i->name, n->name);
    }
    if (s == DW_OK) s = be->i->sync(be);
    if (s != DW_OK) {
        dw_exec_free(x);
        return s;
    }
    *out = x;
    return DW_OK;
}

static int64_t align256(int64_t v) { return (v + 255) / 256 * 256; }

static void drop(dw_exec *x, void **rec) {
    if (*rec) x->be->i->drop(x->be, *rec);
    *rec = NULL;
}

void dw_exec_free(dw_exec *x) {
    if (!x) return;
    drop(x, &x->rec_step);
    drop(x, &x->rec_opt);
    for (int k = 0; k < DW_POOL_COUNT; k++)
        if (x->pool[k]) x->be->i->release(x->be, x->pool[k]);
    free(x->param_at), free(x->param_bf16_at);
    free(x->opt_seg);
    free(x->wq_nodes), free(x->wq_fused);
    free(x);
}

void dw_exec_stop_recording(dw_exec *x) {
    drop(x, &x->rec_step);
    x->record = false;
}

void dw_exec_share_grads(dw_exec *x) {
    x->grads_shared = true;
    drop(x, &x->rec_step); /* recorded with the partials' writes */
    drop(x, &x->rec_opt);  /* and the norm that reads them */
    x->key_seen = x->opt_calls = 0;
}

dw_status dw_exec_shard_optimizer(dw_exec *x, int64_t lo, int64_t hi) {
    dw_backend *be = x->be;
    DW_ASSERT(0 <= lo && lo < hi && hi <= x->p->param_floats);
    const int64_t n = hi - lo, bytes = 2 * n * (int64_t)sizeof(float);
    void *mem = NULL;
    dw_status s = be->i->alloc(be, bytes, &mem);
    if (s == DW_OK) s = be->i->zero(be, mem, (size_t)bytes);
    if (s != DW_OK) {
        if (mem) be->i->release(be, mem);
        return dw_prefix_error(be->ctx, s, "%s backend: the optimizer pool's shard (%lld bytes)", be->i->name,
                               (long long)bytes);
    }
    drop(x, &x->rec_opt); /* it steps the whole pool's moments */
    be->i->release(be, x->pool[DW_POOL_OPTIM]);
    x->pool[DW_POOL_OPTIM] = mem;
    x->pool_bytes[DW_POOL_OPTIM] = bytes;
    x->m = (float *)mem, x->v = x->m + n;
    x->opt_lo = lo, x->opt_hi = hi;
    free(x->opt_seg);
    x->opt_seg = NULL, x->n_opt_seg = 0;
    return DW_OK;
}

dw_status dw_exec_shard_optimizer_segments(dw_exec *x, int n, const int64_t *segs) {
    DW_ASSERT(n > 0);
    int64_t total = 0;
    for (int s = 0; s < n; s++) {
        DW_ASSERT(segs[2 * s] < segs[2 * s + 1] && (s == 0 || segs[2 * s - 1] <= segs[2 * s]));
        total += segs[2 * s + 1] - segs[2 * s];
    }
    DW_ASSERT(segs[0] >= 0 && segs[2 * n - 1] <= x->p->param_floats);
    dw_exec_opt_seg *seg = malloc((size_t)n * sizeof *seg);
    if (!seg) return dw_set_error(x->be->ctx, DW_ERR_NOMEM, "executor: out of memory");
    for (int s = 0; s < n; s++) /* laid end to end */
        seg[s] = (dw_exec_opt_seg){.lo = segs[2 * s], .hi = segs[2 * s + 1],
                                   .at = s ? seg[s - 1].at + (seg[s - 1].hi - seg[s - 1].lo) : 0};
    /* one block of the segments' floats, as one range of that many would take */
    dw_status st = dw_exec_shard_optimizer(x, 0, total);
    if (st != DW_OK) {
        free(seg);
        return st;
    }
    x->opt_seg = seg, x->n_opt_seg = n;
    x->opt_lo = segs[0], x->opt_hi = segs[2 * n - 1];
    return DW_OK;
}

float *dw_exec_moments_seg(const dw_exec *x, int k, int64_t off, int64_t n, int64_t *skip, int64_t *count) {
    *skip = 0, *count = 0;
    for (int s = 0; s < x->n_opt_seg; s++) {
        const dw_exec_opt_seg *g = &x->opt_seg[s];
        const int64_t lo = off > g->lo ? off : g->lo, hi = off + n < g->hi ? off + n : g->hi;
        if (hi <= lo) continue;
        *skip = lo - off, *count = hi - lo;
        return (k ? x->v : x->m) + g->at + (lo - g->lo);
    }
    return NULL;
}

/* floats [lo, hi) of the weights pool through the host into dst (backend memory). */
static dw_status move_weights(dw_exec *x, float *dst, const float *src, int64_t n) {
    dw_backend *be = x->be;
    float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    if (!h) return dw_set_error(be->ctx, DW_ERR_NOMEM, "executor: out of memory");
    dw_status s = be->i->download(be, h, src, (size_t)n * sizeof *h);
    if (s == DW_OK) s = be->i->upload(be, dst, h, (size_t)n * sizeof *h);
    if (s == DW_OK) s = be->i->sync(be);
    free(h);
    return s;
}

dw_status dw_exec_shard_weights(dw_exec *x, int64_t lo, int64_t hi, int64_t gather_bytes, const int64_t *slot,
                                const int64_t *slot_bf16) {
    dw_backend *be = x->be;
    DW_ASSERT(!x->param_at && x->w_lo <= lo && lo <= hi && hi <= x->w_hi);
    const int np = x->p->n_params;
    const int64_t shard = align256((hi - lo) * (int64_t)sizeof(float)), bytes = shard + gather_bytes;
    float **at = calloc((size_t)(np ? np : 1), sizeof *at);
    uint16_t **at16 = x->p->bf16 ? calloc((size_t)(np ? np : 1), sizeof *at16) : NULL;
    if (!at || (x->p->bf16 && !at16)) {
        free(at), free(at16);
        return dw_set_error(be->ctx, DW_ERR_NOMEM, "executor: out of memory");
    }
    void *mem = NULL;
    dw_status s = be->i->alloc(be, bytes > 0 ? bytes : 256, &mem);
    if (s == DW_OK) s = be->i->zero(be, mem, (size_t)bytes);
    if (s == DW_OK) s = move_weights(x, mem, x->w + (lo - x->w_lo), hi - lo);
    if (s != DW_OK) {
        if (mem) be->i->release(be, mem);
        free(at), free(at16);
        return dw_prefix_error(be->ctx, s, "%s backend: the weights' shard (%lld bytes)", be->i->name, (long long)bytes);
    }
    be->i->release(be, x->pool[DW_POOL_WEIGHTS]);
    x->pool[DW_POOL_WEIGHTS] = mem;
    x->pool_bytes[DW_POOL_WEIGHTS] = bytes;
    x->w = (float *)mem, x->w_lo = lo, x->w_hi = hi, x->wb = NULL;
    char *gather = (char *)mem + shard;
    for (int k = 0; k < np; k++) {
        at[k] = slot[k] >= 0 ? (float *)(gather + slot[k]) : NULL;
        if (at16) at16[k] = slot_bf16[k] >= 0 ? (uint16_t *)(gather + slot_bf16[k]) : NULL;
    }
    x->param_at = at, x->param_bf16_at = at16;
    return DW_OK;
}

dw_status dw_exec_unshard_weights(dw_exec *x) {
    dw_backend *be = x->be;
    if (!x->param_at && x->w_hi - x->w_lo == x->p->param_floats) return DW_OK;
    const int64_t bytes = x->p->pool_bytes[DW_POOL_WEIGHTS];
    void *mem = NULL;
    dw_status s = be->i->alloc(be, bytes, &mem);
    if (s == DW_OK) s = be->i->zero(be, mem, (size_t)bytes);
    if (s == DW_OK) s = move_weights(x, (float *)mem + x->w_lo, x->w, x->w_hi - x->w_lo);
    if (s != DW_OK) {
        if (mem) be->i->release(be, mem);
        return dw_prefix_error(be->ctx, s, "%s backend: the weights pool (%lld bytes)", be->i->name, (long long)bytes);
    }
    be->i->release(be, x->pool[DW_POOL_WEIGHTS]);
    x->pool[DW_POOL_WEIGHTS] = mem;
    x->pool_bytes[DW_POOL_WEIGHTS] = bytes;
    x->w = (float *)mem, x->w_lo = 0, x->w_hi = x->p->param_floats;
    x->wb = x->p->bf16 ? (uint16_t *)(x->w + x->p->param_floats) : NULL;
    free(x->param_at), free(x->param_bf16_at);
    x->param_at = NULL, x->param_bf16_at = NULL;
    return DW_OK;
}

dw_status dw_exec_weights_whole(const dw_exec *x, const char *what) {
    if (!x->param_at && x->w_hi - x->w_lo == x->p->param_floats) return DW_OK;
    return dw_set_error(x->be->ctx, DW_ERR_UNSUPPORTED, "%s: the engine holds a ZeRO-3 shard of the weights (floats "
                        "[%lld, %lld)), gathered only around their use in a step", what, (long long)x->w_lo,
                        (long long)x->w_hi);
}

dw_status dw_exec_grads_whole(const dw_exec *x, const char *what) {
    if (x->grad_hi - x->grad_lo == x->p->param_floats) return DW_OK;
    return dw_set_error(x->be->ctx, DW_ERR_UNSUPPORTED, "%s: the engine holds the gradients of floats [%lld, %lld) "
                        "only (a ZeRO-2/3 shard, dw_engine_opts.zero): its backward runs under dw_train's data "
                        "parallelism, which stages the rest", what, (long long)x->grad_lo, (long long)x->grad_hi);
}

dw_status dw_exec_set_batch(dw_exec *x, const int32_t *tokens, const int32_t *targets, int64_t b, int64_t t) {
    dw_backend *be = x->be;
    const size_t bytes = (size_t)(b * t) * sizeof(int32_t);
    x->b = b, x->t = t;
    x->has_targets = targets != NULL;
    if (tokens) DW_TRY(be->i->upload(be, x->work + x->p->work.tokens, tokens, bytes)); /* NULL: a float input, uploaded apart */
    if (targets) DW_TRY(be->i->upload(be, x->work + x->p->work.targets, targets, bytes));
    return DW_OK;
}

/* ---- one op step: its tensors as pointers ------------------------------------------------ */
static void *at(char *base, int64_t off) { return off >= 0 ? base + off : NULL; }

/* The gradient buffer of activation t (NULL: it has none). */
static void *grad_of(const dw_exec *x, int t) { return at(x->act, x->p->tensor[t].grad_off); }

void dw_exec_resolve(const dw_exec *x, int node, bool train, double dloss, dw_op_call *c) {
    const dw_compiled *p = x->p;
    const dw_graph *g = x->g;
    const dw_ir_node *n = dw_compile_node(p, node); /* the program's: a fused LM head's loss is head_xent */
    const dw_prog_node *pn = &p->node[node];
    memset(c, 0, sizeof *c);
    c->x = x, c->node = node, c->n = n, c->train = train, c->dloss = dloss;
    c->b = x->b, c->t = x->t, c->rows = x->b * x->t;
    for (int s = 0; s < n->n_in; s++) {
        const int t = n->in[s];
        const dw_ir_tensor *ten = &g->tensors[t];
        if (ten->kind == DW_TENSOR_INPUT) {
            c->in[s] = x->work + (t == g->tokens ? p->work.tokens : p->work.targets);
        } else if (ten->kind == DW_TENSOR_PARAM) {
            const int64_t off = p->param_off[p->tensor[t].param];
            c->in[s] = x->param_at ? x->param_at[p->tensor[t].param] : x->w + off; /* ZeRO-3: gathered */
            c->in_bf16[s] = x->param_at ? (x->param_bf16_at ? x->param_bf16_at[p->tensor[t].param] : NULL)
                                        : x->wb ? x->wb + off : NULL;
            c->pgrad[s] = x->grad_at ? x->grad_at[p->tensor[t].param] : x->grad + off; /* ZeRO-2/3: staged */
            c->pgrad_set[s] = !x->grad_at && (pn->pgrad_set >> s & 1u); /* grad_arena's first writer */
        } else {
            c->in[s] = at(x->act, p->tensor[t].val_off);
            switch ((dw_grad_mode)pn->grad_mode[s]) {
            case DW_GRAD_WRITE: c->dx[s] = grad_of(x, t); break;
            case DW_GRAD_ACCUM: c->dx[s] = grad_of(x, t), c->dx_acc[s] = true; break;
            case DW_GRAD_ACCUM_TMP: c->dx[s] = at(x->act, pn->tmp_off[DW_TMP_ACC0 + s]); break;
            default: break;
            }
        }
    }
    for (int k = 0; k < n->n_out; k++) { /* the loss lives in the workspace */
        const int t = n->out[k];
        c->out[k] = t == g->loss ? x->work + p->work.loss : at(x->act, p->tensor[t].val_off);
        c->dout[k] = grad_of(x, t);
    }
    for (int k = 0; k < DW_AUX_COUNT; k++) c->aux[k] = at(x->act, pn->aux_off[k]);
    for (int k = 0; k < DW_TMP_COUNT; k++) c->tmp[k] = at(x->act, pn->tmp_off[k]);
    const bool gemm = DW_OP_IS(n, DW_OPF_GEMM); /* its partners: the epilogue ops (compile/fuse.c) */
    if (gemm && pn->partner_fwd >= 0)
        c->fuse_out = at(x->act, p->tensor[g->nodes[pn->partner_fwd].out[0]].val_off);
    if (gemm && pn->partner_bwd >= 0) {
        const int pre = g->nodes[pn->partner_bwd].in[0]; /* the GELU's input */
        c->fuse_x = at(x->act, p->tensor[pre].val_off);
        c->fuse_dx = grad_of(x, pre);
    }
}

/* After a backward: gradients written to ACC<s> are added into the tensor's gradient. */
static dw_status deliver(dw_exec *x, const dw_op_call *c) {
    const dw_prog_node *pn = &x->p->node[c->node];
    for (int s = 0; s < c->n->n_in; s++) {
        if (pn->grad_mode[s] != DW_GRAD_ACCUM_TMP) continue;
        const int t = c->n->in[s];
        DW_TRY(x->be->i->add(x->be, x->p->bf16 ? DW_DT_ACT_BF16 : DW_DT_ACT_F32, grad_of(x, t), c->dx[s],
                             dw_exec_rows(x, t) * x->p->tensor[t].width));
    }
    return DW_OK;
}

/* Whether node reads the targets (the loss): skipped by a forward without targets. */
static bool reads_targets(const dw_exec *x, int node) {
    const dw_ir_node *n = dw_compile_node(x->p, node);
    for (int s = 0; s < n->n_in; s++)
        if (n->in[s] == x->g->targets) return true;
    return false;
}

dw_status dw_exec_call(dw_exec *x, bool fwd, const dw_op_call *c) {
    const dw_ir_node *n = c->n;
    const dw_op_fn fn = fwd ? x->be->i->ops[n->op].fwd : x->be->i->ops[n->op].bwd;
    dw_status s = fn(x->be, c);
    if (s == DW_OK && !fwd) s = deliver(x, c);
    if (s == DW_OK && fwd && c->train && (dw_op_flags(n->op) & DW_OPF_BWD_IN_FWD)) s = deliver(x, c);
    if (s != DW_OK) return dw_prefix_error(x->be->ctx, s, "%s of node '%s'", fwd ? "forward" : "backward", n->name);
    return DW_OK;
}

void dw_exec_cast_plan(const dw_exec *x, int64_t *first, int64_t *lag) {
    const dw_compiled *p = x->p;
    const int64_t n = p->param_floats, d = p->bf16_base - p->grad_base; /* copy i at byte d + 2 i of the gradients */
    *first = *lag = 0;
    if (!p->bf16_arena || d >= 4 * n || d + 2 * n <= 0) return; /* apart */
    *lag = d > 0 ? (d + 3) / 4 : 0;
    *first = dw_adamw_passes_first(n, *lag);
}

/* The CAST_BF16 steps right after AdamW's step, of bf16_runs 0, 1, ... in order, whose copies
 * AdamW's pass writes too (DW_FUSED_CAST, on unless 0): their count, 0 for none. Under bf16_arena
 * the copies may lie on gradients AdamW has yet to read (dw_exec_cast_plan: its passes read each
 * gradient before a copy takes its bytes). */
static int fused_casts(const dw_exec *x, int step) {
    const dw_compiled *p = x->p;
    int n = 0;
    while (x->fuse_cast && x->wb && step + 1 + n < p->n_steps &&
           p->steps[step + 1 + n].kind == DW_STEP_CAST_BF16 && p->steps[step + 1 + n].arg == n)
        n++;
    return n;
}

/* The QUANT_W steps of the refresh phase right after AdamW's step whose caches AdamW's pass
 * refreshes too (the backend's adamw_quants; fuse_quant): their nodes into
 * wq_nodes and flags into wq_fused; their count, 0 for none. */
static int fused_quants(dw_exec *x, int step) {
    const dw_compiled *p = x->p;
    x->n_wq = 0;
    memset(x->wq_fused, 0, (size_t)p->n_steps * sizeof *x->wq_fused);
    if (!x->fuse_quant || !x->be->i->adamw_quants || p->phase[DW_PHASE_REFRESH][0] != step + 1) return 0;
    for (int s = p->phase[DW_PHASE_REFRESH][0]; s < p->phase[DW_PHASE_REFRESH][1]; s++)
        if (p->steps[s].kind == DW_STEP_QUANT_W && x->be->i->adamw_quants(x->be, x, p->steps[s].node))
            x->wq_fused[s] = true, x->wq_nodes[x->n_wq++] = p->steps[s].node;
    return x->n_wq;
}

static dw_status run_step(dw_exec *x, int step, bool train, double dloss) {
    const dw_step *st = &x->p->steps[step];
    dw_backend *be = x->be;
    const dw_backend_i *bi = be->i;
    switch ((dw_step_kind)st->kind) {
    case DW_STEP_FWD:
    case DW_STEP_BWD: {
        const dw_ir_node *n = dw_compile_node(x->p, st->node);
        const bool fwd = st->kind == DW_STEP_FWD;
        if (!(fwd ? bi->ops[n->op].fwd : bi->ops[n->op].bwd))
            return dw_set_error(be->ctx, DW_ERR_UNSUPPORTED, "%s backend: op %s has no %s entry (node '%s')",
                                bi->name, dw_op_name(n->op), fwd ? "forward" : "backward", n->name);
        if (fwd && !x->has_targets && reads_targets(x, st->node)) return DW_OK;
        if (x->ep_step) { /* expert parallelism (train/ep.c): the MoE layers' steps are its own */
            bool done = false;
            DW_TRY(x->ep_step(x->ep, x, st->node, fwd, train, dloss, &done));
            if (done) return DW_OK;
        }
        dw_op_call c;
        dw_exec_resolve(x, st->node, train, dloss, &c);
        c.recompute = fwd && st->arg == 1;
        return dw_exec_call(x, fwd, &c);
    }
    case DW_STEP_GRAD_NORM: return bi->grad_norm(be, x);
    case DW_STEP_ADAMW: {
        const int casts = fused_casts(x, step), quants = fused_quants(x, step);
        x->cast_fused_through = step + casts;
        x->quant_fused_through = quants ? x->p->phase[DW_PHASE_REFRESH][1] - 1 : -1;
        return bi->adamw(be, x, casts, x->wq_nodes, quants);
    }
    case DW_STEP_CAST_BF16: /* skipped right after an AdamW pass that made its copies (phase REFRESH alone: made) */
        if (step <= x->cast_fused_through) return DW_OK; /* dw_exec_step drops it off AdamW's sequence */
        x->cast_fused_through = -1; /* a cast of its own: the casts after it too */
        return bi->cast_bf16(be, x, x->p->bf16_runs[st->arg][0], x->p->bf16_runs[st->arg][1]);
    case DW_STEP_QUANT_W: /* skipped where the AdamW pass just before made the cache */
        if (x->wq_fused[step] && step <= x->quant_fused_through) return DW_OK;
        return bi->quant_weight(be, x, st->node);
    case DW_STEP_ZERO_GRAD: { /* grad_arena: the slice its first writer accumulates into, or the padding
                                  past what it writes over (training only) */
        if (!train) return DW_OK;
        const int64_t off = dw_compile_grad_zero_from(x->p, st->arg);
        return bi->zero(be, x->grad + off, (size_t)(dw_compile_grad_slice_end(x->p, st->arg) - off) * sizeof(float));
    }
    default:
        return dw_set_error(be->ctx, DW_ERR_UNSUPPORTED, "%s backend: %s steps need the multi-rank runtime",
                            bi->name, dw_step_kind_name((dw_step_kind)st->kind));
    }
}

dw_status dw_exec_step(dw_exec *x, int step, bool train, double dloss) {
    if (x->last_step != step - 1) x->cast_fused_through = x->quant_fused_through = -1; /* not after AdamW's */
    if (x->before_step) DW_TRY(x->before_step(x->before_user, x, step)); /* ZeRO-3's gathers */
    DW_TRY(run_step(x, step, train, dloss));
    x->last_step = step;
    return x->after_step ? x->after_step(x->after_user, x, step) : DW_OK; /* data parallelism's hook */
}

void dw_exec_begin_phase(dw_exec *x, dw_phase phase) {
    if (x->be->i->begin_phase) x->be->i->begin_phase(x->be, x, phase);
}

dw_status dw_exec_phase_each(dw_exec *x, dw_phase phase, bool train, double dloss, dw_exec_after_step after,
                             void *user) {
    dw_exec_begin_phase(x, phase);
    for (int s = x->p->phase[phase][0]; s < x->p->phase[phase][1]; s++) {
        DW_TRY(dw_exec_step(x, s, train, dloss));
        if (after) DW_TRY(after(user, s));
    }
    return DW_OK;
}

dw_status dw_exec_phase(dw_exec *x, dw_phase phase, bool train, double dloss) {
    return dw_exec_phase_each(x, phase, train, dloss, NULL, NULL);
}

static dw_status issue_train_step(dw_exec *x, double dloss) {
    DW_TRY(dw_exec_phase(x, DW_PHASE_FORWARD, true, dloss));
    return dw_exec_phase(x, DW_PHASE_BACKWARD, true, dloss);
}

/* Records what issue() issues into *rec; false (with the reason logged) when it cannot, and the
 * executor stops recording. Nothing runs: the caller replays. */
static bool record(dw_exec *x, void **rec, dw_status (*issue)(dw_exec *, const void *), const void *arg,
                   const char *what) {
    dw_backend *be = x->be;
    if (be->i->record_begin(be) != DW_OK) {
        DW_LOGW("%s backend: recording unavailable (%s); issuing steps", be->i->name, dw_errmsg(be->ctx));
        return x->record = false;
    }
    dw_status s = issue(x, arg);
    dw_status e = be->i->record_end(be, rec);
    if (s != DW_OK || e != DW_OK) {
        DW_LOGW("%s backend: recording %s failed (%s); issuing steps from now on", be->i->name, what,
                dw_errmsg(be->ctx));
        drop(x, rec);
        return x->record = false;
    }
    DW_LOGD("%s backend: recorded %s (batch %lld x %lld)", be->i->name, what, (long long)x->b, (long long)x->t);
    return true;
}

static dw_status issue_train(dw_exec *x, const void *dloss) { return issue_train_step(x, *(const double *)dloss); }

dw_status dw_exec_train_step(dw_exec *x, double dloss) {
    if (!(x->key_b == x->b && x->key_t == x->t && x->key_scale == dloss)) {
        drop(x, &x->rec_step);
        x->key_b = x->b, x->key_t = x->t, x->key_scale = dloss, x->key_seen = 0;
    }
    x->key_seen++;
    if (x->record && !x->rec_step && x->key_seen >= 2) record(x, &x->rec_step, issue_train, &dloss, "a training step");
    if (x->rec_step) return x->be->i->replay(x->be, x->rec_step);
    return issue_train_step(x, dloss); /* the first call of a shape warms up the libraries */
}

static dw_status issue_optimizer(dw_exec *x, const void *unused) {
    (void)unused;
    return dw_exec_phase(x, DW_PHASE_OPTIMIZER, false, 1.0);
}

dw_status dw_exec_optimizer(dw_exec *x, const dw_adamw_args *a) {
    /* the steps read the arguments from the workspace: one recording serves every step */
    DW_TRY(x->be->i->upload(x->be, x->work + x->p->work.adamw_args, a, sizeof *a));
    if (x->record && !x->rec_opt && ++x->opt_calls >= 2) record(x, &x->rec_opt, issue_optimizer, NULL, "the optimizer step");
    if (x->rec_opt) return x->be->i->replay(x->be, x->rec_opt);
    return issue_optimizer(x, NULL);
}

bool dw_exec_wsumsq_on(const dw_exec *x) {
    const int64_t pf = x->p->param_floats;
    return x->fuse_norm && !x->grads_shared && x->p->work.wsumsq >= 0 && !x->after_step && !x->before_step &&
           !x->ep_step && !x->moe_ep && !x->grad_at && x->grad_lo == 0 && x->grad_hi == pf;
}
