/* ep_buffers.c — expert parallelism's MoE layers found in a compiled program and the group's
 * buffers sized (ep_buffers.h): one home for what train/ep.c allocates and plan/memory.c counts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/exec.h"
#include "runtime/moe_fp8.h"
#include "train/ep_buffers.h"

void dw_ep_map_free(dw_ep_map *m) {
    if (!m) return;
    free(m->layer), free(m->role), free(m->layer_of), free(m->cap), free(m->grad_at);
    memset(m, 0, sizeof *m);
}

/* From each dispatch, the ops that read its rows (transitively) up to the combine: the expert ops.
 * Checks what ep.c's hook relies on; all[t] (tensors, -1 before) = the layer of each expert-op tensor. */
static dw_status find_layers(dw_ctx *ctx, const dw_compiled *p, int k, dw_ep_map *m, int *all) {
    const dw_graph *g = p->g;
    bool *mark = calloc((size_t)g->n_tensors, sizeof *mark);
    if (!mark) return dw_set_error(ctx, DW_ERR_NOMEM, "expert parallelism: out of memory");
    dw_status st = DW_OK;
    for (int i = 0; i < g->n_nodes && st == DW_OK; i++) {
        const dw_ir_node *d = &g->nodes[i];
        if (d->op != DW_OP_MOE_DISPATCH) continue;
        if (m->n_layers == 0) m->experts = d->attrs.experts;
        if (d->attrs.experts != m->experts) {
            st = dw_set_error(ctx, DW_ERR_UNSUPPORTED, "--ep %d: MoE layers with %lld and %lld experts", k,
                              (long long)m->experts, (long long)d->attrs.experts);
            break;
        }
        dw_ep_layer_at *L = &m->layer[m->n_layers];
        *L = (dw_ep_layer_at){.dispatch = i, .combine = -1, .rows = d->out[0], .offsets = d->out[1], .y = -1};
        m->role[i] = DW_EP_ROLE_DISPATCH, m->layer_of[i] = m->n_layers;
        memset(mark, 0, (size_t)g->n_tensors * sizeof *mark);
        mark[d->out[0]] = true;
        for (int j = i + 1; j < g->n_nodes && L->combine < 0 && st == DW_OK; j++) {
            const dw_ir_node *n = &g->nodes[j];
            bool reads = false;
            for (int s = 0; s < n->n_in; s++) reads |= mark[n->in[s]];
            if (!reads) continue;
            if (n->op == DW_OP_MOE_COMBINE) {
                L->combine = j, L->y = n->in[0];
                m->role[j] = DW_EP_ROLE_COMBINE, m->layer_of[j] = m->n_layers;
                break;
            }
            const dw_prog_node *pn = &p->node[j];
            int accs = 0;
            bool work = (dw_op_flags(n->op) & DW_OPF_BWD_IN_FWD) != 0;
            for (int a = 0; a < DW_AUX_COUNT; a++) work |= pn->aux_off[a] >= 0;
            for (int t = DW_TMP_DELTA; t < DW_TMP_COUNT; t++) work |= pn->tmp_off[t] >= 0;
            for (int s = 0; s < n->n_in; s++) accs += pn->grad_mode[s] == DW_GRAD_ACCUM_TMP;
            if (work || accs > 1 || n->op == DW_OP_MOE_DISPATCH)
                st = dw_set_error(ctx, DW_ERR_UNSUPPORTED, "--ep %d: expert op '%s' (%s) keeps per-rank workspaces "
                                  "the expert-parallel rows do not fit", k, n->name, dw_op_name(n->op));
            m->role[j] = DW_EP_ROLE_EXPERT, m->layer_of[j] = m->n_layers;
            for (int o = 0; o < n->n_out; o++) mark[n->out[o]] = true;
        }
        if (st == DW_OK && (L->combine < 0 || !mark[L->y] || L->y == L->rows))
            st = dw_set_error(ctx, DW_ERR_UNSUPPORTED, "--ep %d: MoE layer '%s' has no expert ops between its "
                              "dispatch and a combine", k, d->name);
        for (int t = 0; st == DW_OK && t < g->n_tensors; t++)
            if (mark[t]) all[t] = m->n_layers; /* its layer */
        m->n_layers++;
    }
    free(mark);
    return st;
}

double dw_ep_capacity_factor(int g) {
    const char *v = dw_env("DW_EP_CAPACITY");
    char *end = NULL;
    double f = v ? strtod(v, &end) : (double)g;
    if (v && (end == v || *end || !(f > 0) || !isfinite(f))) {
        DW_LOGW("DW_EP_CAPACITY=%s is not a positive number; using the group size %d", v, g);
        f = (double)g;
    }
    return f < g ? f : g;
}

int64_t dw_ep_group_batch(const dw_ep_map *m, int64_t b) {
    const int64_t f = (int64_t)ceil(m->capacity * (double)b), all = (int64_t)m->group * b;
    return f < all ? f : all;
}

static int64_t act_bytes(const dw_compiled *p) { return p->bf16 ? 2 : 4; }

/* Each layer's gradient rows packed from offset 0 (256-aligned pieces): the layers share them. */
static bool place_grads(const dw_compiled *p, dw_ep_map *m, const int *layer) {
    int64_t *used = calloc((size_t)m->n_layers + 1, sizeof *used);
    if (!used) return false;
    for (int t = 0; t < p->g->n_tensors; t++) {
        m->grad_at[t] = -1;
        if (!dw_ep_tensor_has_grad(p, m, t)) continue;
        m->grad_at[t] = used[layer[t]];
        used[layer[t]] += (dw_ep_tensor_bytes(p, m, t) + 255) / 256 * 256;
        if (used[layer[t]] > m->grad_pool) m->grad_pool = used[layer[t]];
    }
    free(used);
    return true;
}

dw_status dw_ep_map_build(dw_ctx *ctx, const dw_compiled *p, int k, dw_ep_map *out) {
    memset(out, 0, sizeof *out);
    const dw_graph *g = p->g;
    int n_dispatch = 0;
    for (int i = 0; i < g->n_nodes; i++) n_dispatch += g->nodes[i].op == DW_OP_MOE_DISPATCH;
    if (!n_dispatch) return dw_set_error(ctx, DW_ERR_INVALID, "--ep %d: the model has no mixture-of-experts layer", k);
    out->group = k;
    out->layer = calloc((size_t)n_dispatch, sizeof *out->layer);
    out->role = calloc((size_t)g->n_nodes, sizeof *out->role);
    out->layer_of = malloc((size_t)g->n_nodes * sizeof *out->layer_of);
    out->cap = calloc((size_t)g->n_tensors, sizeof *out->cap);
    out->grad_at = malloc((size_t)g->n_tensors * sizeof *out->grad_at);
    int *layer = malloc((size_t)g->n_tensors * sizeof *layer);
    dw_status st = out->layer && out->role && out->layer_of && out->cap && out->grad_at && layer
                       ? DW_OK
                       : dw_set_error(ctx, DW_ERR_NOMEM, "expert parallelism: out of memory");
    for (int i = 0; st == DW_OK && i < g->n_nodes; i++) out->layer_of[i] = -1;
    for (int t = 0; st == DW_OK && t < g->n_tensors; t++) layer[t] = -1;
    if (st == DW_OK) st = find_layers(ctx, p, k, out, layer);
    if (st == DW_OK && out->experts % k)
        st = dw_set_error(ctx, DW_ERR_INVALID, "--ep %d: the model's %lld experts do not split over %d ranks (the "
                          "experts must be a multiple of --ep)", k, (long long)out->experts, k);
    if (st == DW_OK) { /* the rows of ceil(f x B) sequences, at most the whole group's (G x B) */
        out->capacity = dw_ep_capacity_factor(k);
        dw_exec rows;
        memset(&rows, 0, sizeof rows);
        rows.p = p, rows.g = g, rows.b = dw_ep_group_batch(out, g->batch), rows.t = g->seq;
        for (int t = 0; t < g->n_tensors; t++)
            if (layer[t] >= 0) out->cap[t] = dw_exec_rows(&rows, t);
        if (!place_grads(p, out, layer)) st = dw_set_error(ctx, DW_ERR_NOMEM, "expert parallelism: out of memory");
    }
    free(layer);
    if (st != DW_OK) dw_ep_map_free(out);
    return st;
}

int64_t dw_ep_tensor_bytes(const dw_compiled *p, const dw_ep_map *m, int t) {
    return m->cap[t] * p->tensor[t].width * act_bytes(p);
}

bool dw_ep_tensor_has_grad(const dw_compiled *p, const dw_ep_map *m, int t) {
    return m->cap[t] > 0 && p->tensor[t].grad_off >= 0;
}

int64_t dw_ep_acc_bytes(const dw_compiled *p, const dw_ep_map *m) {
    int64_t widest = 0;
    for (int t = 0; t < p->g->n_tensors; t++) {
        const int64_t b = m->cap[t] ? dw_ep_tensor_bytes(p, m, t) : 0;
        widest = b > widest ? b : widest;
    }
    return widest;
}

int64_t dw_ep_stage_bytes(const dw_compiled *p, const dw_ep_map *m) {
    int64_t stage = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const dw_ep_layer_at *L = &m->layer[i];
        const int64_t a = dw_ep_tensor_bytes(p, m, L->rows), b = dw_ep_tensor_bytes(p, m, L->y);
        stage = a > stage ? a : stage;
        stage = b > stage ? b : stage;
    }
    return stage;
}

int64_t dw_ep_offsets_bytes(const dw_ep_map *m) { return (m->experts + 1) * 4; }
int64_t dw_ep_perm_bytes(const dw_ep_map *m, int layer) { return m->cap[m->layer[layer].rows] * 4; }

void dw_ep_fp8_fit(const dw_compiled *p, const dw_ep_map *m, dw_moe_fp8_ep *fp8) {
    for (int i = 0; i < p->g->n_nodes; i++)
        if (m->role[i] == DW_EP_ROLE_EXPERT && p->g->nodes[i].op == DW_OP_MOE_LINEAR)
            dw_moe_fp8_ep_fit(p, i, m->cap[p->g->nodes[i].in[0]], fp8);
}

void dw_ep_buffer_bytes(const dw_compiled *p, const dw_ep_map *m, dw_ep_bytes *out) {
    memset(out, 0, sizeof *out);
    for (int t = 0; t < p->g->n_tensors; t++)
        if (m->cap[t]) out->rows += dw_ep_tensor_bytes(p, m, t);
    out->rows += m->grad_pool;
    for (int i = 0; i < m->n_layers; i++) out->index += dw_ep_offsets_bytes(m) + 2 * dw_ep_perm_bytes(m, i);
    out->acc = dw_ep_acc_bytes(p, m);
    out->stage = dw_ep_stage_bytes(p, m);
    dw_moe_fp8_ep fp8 = {0};
    dw_ep_fp8_fit(p, m, &fp8);
    out->fp8 = dw_moe_fp8_ep_bytes(&fp8);
    out->total = out->rows + out->index + out->acc + out->stage + out->fp8;
}
