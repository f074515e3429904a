/* ep.c — expert parallelism (ep.h): the MoE layers of the compiled program found (dispatch, the
 * expert ops between it and the combine), buffers for the expert ops' rows sized for a whole group
 * (f x the rank's own rows, ep_buffers.h), and the executor hook that runs those steps with the all-to-alls:
 *   dispatch fwd: counts all-to-all (host), rows all-to-all (dispatch -> source order), gather into
 *                 expert order; the expert ops run on the group's rows with the rank's offsets;
 *   combine fwd:  expert order -> source order, all-to-all back into the dispatch-order rows;
 *   combine bwd:  its row gradients all-to-all to the owners, gathered into expert order;
 *   dispatch bwd: the expert ops' row gradients back to the rows' ranks before the gather-add.
 * Buffers are the backend's memory (host on the CPU, the GPU's with the NCCL communicator); the row
 * gathers are memcpy on the CPU and the combine kernel with weight 1 on a GPU. fp8_block experts
 * quantise the group's rows into operand slots of ep's own, and the weight-cache refresh covers
 * the rank's experts only (runtime/moe_fp8.h: the executor's moe_ep); the exchanged rows stay in
 * the activation dtype. While suspended every expert runs here: the other experts' caches are
 * quantised again before the first expert op, as they are when ep is freed. */
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/engine.h"
#include "runtime/moe_fp8.h"
#include "train/ep.h"
#include "train/ep_buffers.h"
#include "train/ep_plan.h"
#if DW_HAVE_CUDA
#include "core/ctx.h"
#include "kernels/cuda/ops_cuda.h"
#endif

typedef struct {
    int dispatch, combine;          /* nodes */
    int rows, offsets, y;           /* tensors: dispatch's rows and offsets, the combine's expert rows */
    int64_t *send_rows, *recv_rows; /* (W) rows to / from each rank, this step */
    int64_t total;                  /* rows received (expert order) */
    int32_t *offsets_h, *perm_h, *back_h; /* host: (E+1) expert-order groups, (cap) perm, (cap) back */
    void *offsets_d, *perm_d, *back_d;    /* the same in the backend's memory */
    bool in_bwd;                    /* the combine's backward ran and the dispatch's not yet */
} ep_layer;

struct dw_ep {
    dw_ctx *ctx;
    dw_engine *eng;
    dw_exec *x;
    dw_backend *be;
    dw_comm *comm, *host;
    dw_ep_layout l;
    size_t act;             /* bytes of an activation element (2: BF16 program, 4) */
    int n_layers;
    ep_layer *layer;
    dw_ep_map map;          /* the layers and the group's rows (ep_buffers.h); role, layer_of, cap are its */
    signed char *role;      /* (nodes) DW_EP_ROLE_* */
    int *layer_of;          /* (nodes) its layer, -1 */
    void **val, **grad;     /* (tensors) the expert ops' rows in expert order (cap rows), else NULL; the
                               gradients are pieces of grad_pool, which every layer's backward reuses */
    void *grad_pool;
    int64_t *cap;           /* (tensors) rows of val/grad: f x the program's B x T x top-k (ep_buffers.h) */
    void *acc;              /* an ACC temporary of the expert ops (the widest, cap rows) */
    void *stage;            /* rows in source order (the widest exchanged) */
    int64_t *counts, *count_send, *count_recv, *count_rc, *bytes_s, *bytes_r; /* (E), (W), (E), (W), (W), (W) */
    int64_t bytes;          /* of the buffers above, in the backend's memory */
    bool suspended;
    dw_ep_param *params;    /* (n_params) the expert ops' parameters */
    int n_params;
    dw_moe_fp8_ep fp8;      /* fp8_block experts: operand slots for the group's rows, the rank's experts */
    void *fp8_buf;          /* their memory; NULL: no expert op has an fp8_block pass */
    bool fp8_partial;       /* some weight caches hold the rank's experts only (suspended: refresh) */
};

static int64_t width_of(const dw_ep *ep, int t) { return ep->eng->p->tensor[t].width; }
static void *val_of(const dw_ep *ep, int t) { return ep->x->act + ep->eng->p->tensor[t].val_off; }
static void *grad_of(const dw_ep *ep, int t) {
    const int64_t o = ep->eng->p->tensor[t].grad_off;
    return o >= 0 ? ep->x->act + o : NULL;
}

/* ---- moving rows ------------------------------------------------------------------------------ */
/* dst row i = src row idx[i] for i < n (rows of width elements). */
static dw_status gather(dw_ep *ep, void *dst, const void *src, const int32_t *idx_h, const void *idx_d, int64_t n,
                        int64_t width) {
    if (n == 0) return DW_OK;
    const size_t rb = (size_t)width * ep->act;
    if (dw_ctx_device(ep->ctx) != DW_DEVICE_CUDA) {
        (void)idx_d;
        for (int64_t i = 0; i < n; i++) memcpy((char *)dst + (size_t)i * rb, (const char *)src + (size_t)idx_h[i] * rb, rb);
        return DW_OK;
    }
#if DW_HAVE_CUDA
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(ep->ctx, &stream));
    return dw_cuda_moe_combine_fwd(ep->ctx, ep->act == 2 ? DW_ACT_BF16 : DW_ACT_F32, dst, src, NULL,
                                   (const int32_t *)idx_d, n, width, 1, stream); /* out[i] = 1 x src[idx[i]] */
#else
    return dw_set_error(ep->ctx, DW_ERR_UNSUPPORTED, "expert parallelism: a CUDA context in a build without CUDA");
#endif
}

/* Rows [from, cap) of an expert-order buffer of tensor t zeroed (no stale rows past the received). */
static dw_status zero_tail(dw_ep *ep, void *buf, int t, int64_t from) {
    const size_t rb = (size_t)width_of(ep, t) * ep->act;
    return ep->be->i->zero(ep->be, (char *)buf + (size_t)from * rb, (size_t)(ep->cap[t] - from) * rb);
}

/* The rows all-to-all: send_rows[d] rows of width to each rank d, recv_rows[s] from each s. */
static dw_status exchange(dw_ep *ep, const void *send, const int64_t *send_rows, void *recv, const int64_t *recv_rows,
                          int64_t width) {
    const int64_t rb = width * (int64_t)ep->act;
    for (int r = 0; r < ep->l.world; r++) ep->bytes_s[r] = send_rows[r] * rb, ep->bytes_r[r] = recv_rows[r] * rb;
    return dw_comm_all_to_all(ep->ctx, ep->comm, send, ep->bytes_s, recv, ep->bytes_r, DW_COMM_BYTE);
}

/* The executor at the rows this rank's expert buffers hold for micro-batch x->b: a copy whose batch
 * is dw_ep_group_batch's ceil(f x b), at most G x b (the expert ops run on its rows). */
static dw_exec group_exec(const dw_ep *ep, const dw_exec *x) {
    dw_exec group = *x;
    group.b = dw_ep_group_batch(&ep->map, x->b);
    return group;
}

/* ---- the four exchanges of a layer ------------------------------------------------------------ */
/* After the dispatch: the counts, then the rows to their owners, in expert order. */
static dw_status dispatch_rows(dw_ep *ep, const dw_exec *x, ep_layer *L) {
    const int64_t E = ep->l.experts, G = ep->l.group, El = dw_ep_local(&ep->l);
    dw_backend *be = ep->be;
    DW_TRY(be->i->download(be, L->offsets_h, val_of(ep, L->offsets), (size_t)(E + 1) * sizeof(int32_t)));
    dw_ep_send_plan(&ep->l, L->offsets_h, L->send_rows, ep->counts, ep->count_send);
    for (int r = 0; r < ep->l.world; r++) ep->count_rc[r] = r / G == ep->l.rank / G ? El : 0;
    DW_TRY(dw_comm_all_to_all(ep->ctx, ep->host, ep->counts, ep->count_send, ep->count_recv, ep->count_rc, DW_COMM_I64));
    int64_t need = 0; /* the rows this rank's experts receive from the group */
    for (int64_t j = 0; j < G * El; j++) need += ep->count_recv[j];
    const dw_exec group = group_exec(ep, x); /* the expert ops' rows at this micro-batch (expert_step) */
    const int64_t room = dw_exec_rows(&group, L->rows);
    DW_ASSERT(room <= ep->cap[L->rows]);
    if (need > room)
        return dw_set_error(ep->ctx, DW_ERR_UNSUPPORTED, "expert parallel: MoE layer %d routed %lld rows to rank %d's "
                            "experts, more than its buffers hold (%lld rows: DW_EP_CAPACITY %.2f x its own share); "
                            "routing this skewed needs a larger DW_EP_CAPACITY (at most %lld, the --ep group): set it "
                            "and resume from the last checkpoint", (int)(L - ep->layer), (long long)need, ep->l.rank,
                            (long long)room, ep->map.capacity, (long long)G);
    L->total = dw_ep_recv_plan(&ep->l, ep->count_recv, L->recv_rows, L->offsets_h, L->perm_h, L->back_h);
    DW_ASSERT(L->total == need);
    DW_TRY(be->i->upload(be, L->offsets_d, L->offsets_h, (size_t)(E + 1) * sizeof(int32_t)));
    DW_TRY(be->i->upload(be, L->perm_d, L->perm_h, (size_t)L->total * sizeof(int32_t)));
    DW_TRY(be->i->upload(be, L->back_d, L->back_h, (size_t)L->total * sizeof(int32_t)));
    const int64_t C = width_of(ep, L->rows);
    DW_TRY(exchange(ep, val_of(ep, L->rows), L->send_rows, ep->stage, L->recv_rows, C));
    DW_TRY(gather(ep, ep->val[L->rows], ep->stage, L->perm_h, L->perm_d, L->total, C));
    return zero_tail(ep, ep->val[L->rows], L->rows, L->total);
}

/* Before the combine: the experts' outputs back to the rows' ranks, in their dispatch order. */
static dw_status return_rows(dw_ep *ep, ep_layer *L) {
    const int64_t C = width_of(ep, L->y);
    DW_TRY(gather(ep, ep->stage, ep->val[L->y], L->back_h, L->back_d, L->total, C));
    return exchange(ep, ep->stage, L->recv_rows, val_of(ep, L->y), L->send_rows, C);
}

/* After the combine's backward: its row gradients to the owners, in expert order. */
static dw_status send_grads(dw_ep *ep, ep_layer *L) {
    const int64_t C = width_of(ep, L->y);
    DW_TRY(exchange(ep, grad_of(ep, L->y), L->send_rows, ep->stage, L->recv_rows, C));
    DW_TRY(gather(ep, ep->grad[L->y], ep->stage, L->perm_h, L->perm_d, L->total, C));
    return zero_tail(ep, ep->grad[L->y], L->y, L->total);
}

/* Before the dispatch's backward: the gradients of the rows back to their ranks. */
static dw_status return_grads(dw_ep *ep, ep_layer *L) {
    const int64_t C = width_of(ep, L->rows);
    DW_TRY(gather(ep, ep->stage, ep->grad[L->rows], L->back_h, L->back_d, L->total, C));
    return exchange(ep, ep->stage, L->recv_rows, grad_of(ep, L->rows), L->send_rows, C);
}

/* An expert op (grouped linear, activation) on the rows this rank's buffers hold: the executor's
 * call with the rows scaled to them (group_exec: the received rows first, zeros after) and the
 * rows, their gradients and the offsets in this rank's buffers; an ACC temporary's gradient added
 * in here. */
static dw_status expert_step(dw_ep *ep, dw_exec *x, int node, bool fwd, bool train, double dloss) {
    const dw_ir_node *n = &x->g->nodes[node];
    const dw_prog_node *pn = &x->p->node[node];
    const ep_layer *L = &ep->layer[ep->layer_of[node]];
    dw_exec group = group_exec(ep, x);
    dw_op_call c;
    dw_exec_resolve(&group, node, train, dloss, &c);
    int acc = -1;
    for (int s = 0; s < n->n_in; s++) {
        const int t = n->in[s];
        if (t == L->offsets) c.in[s] = L->offsets_d;
        if (!ep->val[t]) continue;
        c.in[s] = ep->val[t];
        if (c.dx[s]) c.dx[s] = pn->grad_mode[s] == DW_GRAD_ACCUM_TMP ? (acc = s, ep->acc) : ep->grad[t];
    }
    for (int k = 0; k < n->n_out; k++) {
        c.out[k] = ep->val[n->out[k]];
        c.dout[k] = c.dout[k] ? ep->grad[n->out[k]] : NULL;
    }
    const dw_op_fn fn = fwd ? ep->be->i->ops[n->op].fwd : ep->be->i->ops[n->op].bwd;
    dw_status s = fn(ep->be, &c);
    if (s == DW_OK && !fwd && acc >= 0) {
        const int t = n->in[acc];
        s = ep->be->i->add(ep->be, x->p->bf16 ? DW_DT_ACT_BF16 : DW_DT_ACT_F32, ep->grad[t], ep->acc,
                           dw_exec_rows(&group, t) * width_of(ep, t));
    }
    if (s != DW_OK)
        return dw_prefix_error(ep->ctx, s, "%s of node '%s' (expert parallel)", fwd ? "forward" : "backward", n->name);
    return DW_OK;
}

/* Every fp8_block expert layer's weight cache quantised whole (x->moe_ep unset: all experts). */
static dw_status refresh_all_experts(dw_ep *ep) {
    for (int i = 0; i < ep->eng->g->n_nodes; i++)
        if (ep->role[i] == DW_EP_ROLE_EXPERT && ep->eng->g->nodes[i].op == DW_OP_MOE_LINEAR)
            DW_TRY(ep->be->i->quant_weight(ep->be, ep->x, i));
    ep->fp8_partial = false;
    return DW_OK;
}

/* The executor's hook (exec.h ep_step). */
static dw_status ep_step(void *arg, dw_exec *x, int node, bool fwd, bool train, double dloss, bool *done) {
    dw_ep *ep = arg;
    *done = false;
    if (ep->suspended && ep->fp8_partial && ep->role[node] == DW_EP_ROLE_EXPERT) return refresh_all_experts(ep);
    if (ep->suspended || ep->role[node] == DW_EP_ROLE_NONE) return DW_OK;
    *done = true;
    ep_layer *L = &ep->layer[ep->layer_of[node]];
    /* a MoE forward run again inside the layer's backward (compile/recompute.c's rematerialised rows
     * and SwiGLU): this layer's rows live in ep's own buffers, kept, so there is nothing to redo */
    if (fwd && L->in_bwd) return DW_OK;
    dw_op_call c;
    switch (ep->role[node]) {
    case DW_EP_ROLE_DISPATCH:
        L->in_bwd = false;
        if (!fwd) DW_TRY(return_grads(ep, L));
        dw_exec_resolve(x, node, train, dloss, &c);
        DW_TRY(dw_exec_call(x, fwd, &c));
        return fwd ? dispatch_rows(ep, x, L) : DW_OK;
    case DW_EP_ROLE_COMBINE:
        L->in_bwd = !fwd;
        if (fwd) DW_TRY(return_rows(ep, L));
        dw_exec_resolve(x, node, train, dloss, &c);
        DW_TRY(dw_exec_call(x, fwd, &c));
        return fwd ? DW_OK : send_grads(ep, L);
    default: return expert_step(ep, x, node, fwd, train, dloss);
    }
}

static dw_status alloc_buf(dw_ep *ep, int64_t bytes, void **out) {
    DW_TRY(ep->be->i->alloc(ep->be, bytes > 0 ? bytes : 1, out));
    ep->bytes += bytes;
    return ep->be->i->zero(ep->be, *out, (size_t)(bytes > 0 ? bytes : 1));
}

static dw_status alloc_all(dw_ep *ep) {
    const dw_compiled *p = ep->eng->p;
    const int64_t E = ep->l.experts, W = ep->l.world;
    for (int t = 0; t < p->g->n_tensors; t++) {
        if (!ep->cap[t]) continue;
        DW_TRY(alloc_buf(ep, dw_ep_tensor_bytes(p, &ep->map, t), &ep->val[t]));
    }
    DW_TRY(alloc_buf(ep, ep->map.grad_pool, &ep->grad_pool));
    for (int t = 0; t < p->g->n_tensors; t++)
        if (ep->map.grad_at[t] >= 0) ep->grad[t] = (char *)ep->grad_pool + ep->map.grad_at[t];
    for (int i = 0; i < ep->n_layers; i++) {
        ep_layer *L = &ep->layer[i];
        const int64_t cap = ep->cap[L->rows];
        L->send_rows = calloc((size_t)W, sizeof(int64_t));
        L->recv_rows = calloc((size_t)W, sizeof(int64_t));
        L->offsets_h = calloc((size_t)E + 1, sizeof(int32_t));
        L->perm_h = calloc((size_t)cap + 1, sizeof(int32_t));
        L->back_h = calloc((size_t)cap + 1, sizeof(int32_t));
        if (!L->send_rows || !L->recv_rows || !L->offsets_h || !L->perm_h || !L->back_h)
            return dw_set_error(ep->ctx, DW_ERR_NOMEM, "expert parallelism: out of memory");
        DW_TRY(alloc_buf(ep, dw_ep_offsets_bytes(&ep->map), &L->offsets_d));
        DW_TRY(alloc_buf(ep, dw_ep_perm_bytes(&ep->map, i), &L->perm_d));
        DW_TRY(alloc_buf(ep, dw_ep_perm_bytes(&ep->map, i), &L->back_d));
    }
    DW_TRY(alloc_buf(ep, dw_ep_acc_bytes(p, &ep->map), &ep->acc));
    return alloc_buf(ep, dw_ep_stage_bytes(p, &ep->map), &ep->stage);
}

/* fp8_block expert ops: operand slots for the group's rows (moe_fp8.h), in ep's buffers. */
static dw_status alloc_fp8(dw_ep *ep) {
    ep->fp8 = (dw_moe_fp8_ep){.first = dw_ep_first_expert(&ep->l), .count = dw_ep_local(&ep->l)};
    dw_ep_fp8_fit(ep->eng->p, &ep->map, &ep->fp8);
    const int64_t bytes = dw_moe_fp8_ep_bytes(&ep->fp8);
    if (!bytes) return DW_OK;
    DW_TRY(alloc_buf(ep, bytes, &ep->fp8_buf));
    dw_moe_fp8_ep_place(&ep->fp8, ep->fp8_buf);
    return DW_OK;
}

/* The expert ops' parameters with the experts as their first dimension, each once. */
static dw_status find_params(dw_ep *ep) {
    const dw_graph *g = ep->eng->g;
    const dw_compiled *p = ep->eng->p;
    ep->params = calloc((size_t)p->n_params + 1, sizeof *ep->params);
    if (!ep->params) return dw_set_error(ep->ctx, DW_ERR_NOMEM, "expert parallelism: out of memory");
    for (int i = 0; i < g->n_nodes; i++) {
        if (ep->role[i] != DW_EP_ROLE_EXPERT) continue;
        const dw_ir_node *n = &g->nodes[i];
        for (int s = 0; s < n->n_in; s++) {
            const dw_ir_tensor *t = &g->tensors[n->in[s]];
            if (t->kind != DW_TENSOR_PARAM || t->ndim < 2 || t->shape[0] != ep->l.experts) continue;
            const int64_t off = p->param_off[p->tensor[n->in[s]].param];
            bool seen = false;
            for (int k = 0; k < ep->n_params; k++) seen |= ep->params[k].off == off;
            if (!seen) ep->params[ep->n_params++] = (dw_ep_param){.off = off, .numel = dw_ir_numel(t)};
        }
    }
    return DW_OK;
}

int dw_ep_params(const dw_ep *ep, const dw_ep_param **out) {
    *out = ep ? ep->params : NULL;
    return ep ? ep->n_params : 0;
}

int dw_ep_group_size(const dw_ep *ep) { return ep ? ep->l.group : 1; }

int64_t dw_ep_buffers_allocated(const dw_ep *ep) { return ep ? ep->bytes : 0; }

/* ---- lifetime --------------------------------------------------------------------------------- */
dw_status dw_ep_create(dw_engine *e, dw_comm *comm, int k, dw_ep **out) {
    *out = NULL;
    if (k < 1) return dw_set_error(e->ctx, DW_ERR_INVALID, "--ep %d: the expert-parallel group size is at least 1", k);
    if (k == 1) return DW_OK;
    if (comm->world % k)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "--ep %d: groups of %d do not divide the job's %d rank%s (--ep "
                            "must divide the number of ranks)", k, k, comm->world, comm->world == 1 ? "" : "s");
    const dw_graph *g = e->g;
    dw_ep_map map;
    DW_TRY(dw_ep_map_build(e->ctx, e->p, k, &map)); /* the layers, the group's rows (ep_buffers.h) */
    dw_ep *ep = calloc(1, sizeof *ep);
    if (!ep) {
        dw_ep_map_free(&map);
        return dw_set_error(e->ctx, DW_ERR_NOMEM, "expert parallelism: out of memory");
    }
    *ep = (dw_ep){.ctx = e->ctx, .eng = e, .x = e->x, .be = e->be, .comm = comm, .host = comm->host,
                  .l = {.rank = comm->rank, .world = comm->world, .group = k, .experts = map.experts},
                  .act = e->p->bf16 ? 2 : 4, .map = map, .role = map.role, .layer_of = map.layer_of, .cap = map.cap,
                  .n_layers = map.n_layers};
    const int W = comm->world;
    ep->layer = calloc((size_t)map.n_layers, sizeof *ep->layer);
    ep->val = calloc((size_t)g->n_tensors, sizeof *ep->val);
    ep->grad = calloc((size_t)g->n_tensors, sizeof *ep->grad);
    dw_status st = ep->layer && ep->val && ep->grad ? DW_OK
                                                   : dw_set_error(e->ctx, DW_ERR_NOMEM, "expert parallelism: out of memory");
    for (int i = 0; st == DW_OK && i < map.n_layers; i++) {
        const dw_ep_layer_at *at = &map.layer[i];
        ep->layer[i] = (ep_layer){.dispatch = at->dispatch, .combine = at->combine, .rows = at->rows,
                                  .offsets = at->offsets, .y = at->y};
    }
    if (st == DW_OK) {
        const int64_t E = ep->l.experts;
        ep->counts = calloc((size_t)E, sizeof(int64_t)), ep->count_recv = calloc((size_t)E, sizeof(int64_t));
        ep->count_send = calloc((size_t)W, sizeof(int64_t)), ep->count_rc = calloc((size_t)W, sizeof(int64_t));
        ep->bytes_s = calloc((size_t)W, sizeof(int64_t)), ep->bytes_r = calloc((size_t)W, sizeof(int64_t));
        if (!ep->counts || !ep->count_recv || !ep->count_send || !ep->count_rc || !ep->bytes_s || !ep->bytes_r)
            st = dw_set_error(e->ctx, DW_ERR_NOMEM, "expert parallelism: out of memory");
    }
    if (st == DW_OK) st = alloc_all(ep); /* the map's sizes become buffers */
    if (st == DW_OK) st = find_params(ep);
    if (st == DW_OK) st = alloc_fp8(ep);
    if (st != DW_OK) {
        dw_ep_free(ep);
        return st;
    }
    dw_exec *x = e->x;
    if (x->rec_step) x->be->i->drop(x->be, x->rec_step); /* a recorded step would bypass the hook */
    x->rec_step = NULL;
    x->record = false;
    x->ep_step = ep_step, x->ep = ep;
    if (ep->fp8_buf) x->moe_ep = &ep->fp8, ep->fp8_partial = true; /* refreshes from now on: this rank's experts */
    DW_LOGI("expert parallel: groups of %d ranks, rank %d runs experts %lld-%lld of %lld in %d MoE layers (%.1f MiB "
            "of buffers for up to %.2f x its own rows, DW_EP_CAPACITY)", k, comm->rank, (long long)dw_ep_first_expert(&ep->l),
            (long long)(dw_ep_first_expert(&ep->l) + dw_ep_local(&ep->l) - 1), (long long)ep->l.experts, ep->n_layers,
            (double)ep->bytes / (1 << 20), ep->map.capacity);
    *out = ep;
    return DW_OK;
}

void dw_ep_suspend(dw_ep *ep, bool suspended) {
    if (!ep) return;
    ep->suspended = suspended;
    if (!ep->fp8_buf) return;
    ep->x->moe_ep = suspended ? NULL : &ep->fp8; /* suspended: whole caches (the hook refreshes them) */
    if (!suspended) ep->fp8_partial = true;      /* refreshes from now on: this rank's experts again */
}

void dw_ep_free(dw_ep *ep) {
    if (!ep) return;
    dw_backend *be = ep->be;
    if (ep->x->ep == ep) {
        ep->x->ep_step = NULL, ep->x->ep = NULL, ep->x->moe_ep = NULL;
        ep->x->record = ep->eng->opts.record && be->i->record_begin;
        if (ep->fp8_partial && refresh_all_experts(ep) != DW_OK) /* every expert runs here again */
            DW_LOGW("expert parallelism: the fp8_block weight caches of the other ranks' experts were not "
                    "refreshed (%s)", dw_errmsg(ep->ctx));
    }
    const dw_graph *g = ep->eng->g;
    for (int t = 0; ep->val && t < g->n_tensors; t++) {
        if (ep->val[t]) be->i->release(be, ep->val[t]);
    }
    if (ep->grad_pool) be->i->release(be, ep->grad_pool);
    for (int i = 0; ep->layer && i < ep->n_layers; i++) {
        ep_layer *L = &ep->layer[i];
        free(L->send_rows), free(L->recv_rows), free(L->offsets_h), free(L->perm_h), free(L->back_h);
        if (L->offsets_d) be->i->release(be, L->offsets_d);
        if (L->perm_d) be->i->release(be, L->perm_d);
        if (L->back_d) be->i->release(be, L->back_d);
    }
    if (ep->acc) be->i->release(be, ep->acc);
    if (ep->stage) be->i->release(be, ep->stage);
    if (ep->fp8_buf) be->i->release(be, ep->fp8_buf);
    free(ep->counts), free(ep->count_recv), free(ep->count_send), free(ep->count_rc), free(ep->bytes_s), free(ep->bytes_r);
    free(ep->layer), free(ep->val), free(ep->grad);
    dw_ep_map_free(&ep->map);
    free(ep->params);
    free(ep);
}
