/* arena.c — the activation pool: every activation's value and gradient and every node's saved
 * and temporary parts, each with its lifetime over the logical times (recompute.c: forward of node
 * i at i, then the backward sweep; a recomputed block's buffers live twice), placed by dw_memplan_assign so that buffers alive together never overlap.
 * Reads the gradient modes and aliases (grads.c), the fusion (fuse.c) and each op's flags. */
#include <stdlib.h>
#include <string.h>

#include "compile/passes.h"
#include "core/error.h"

typedef struct {
    dw_mem_item *items;
    dw_buf_info *info;
    int n, cap;
} item_list;

/* An item live over [first, last] and, when first2 > last, over [first2, last2] too. */
static int add_item2(item_list *l, int64_t size, int first, int last, int first2, int last2, dw_buf_kind kind,
                     int index) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        dw_mem_item *it = realloc(l->items, (size_t)cap * sizeof *it);
        if (!it) return -1;
        l->items = it;
        dw_buf_info *in = realloc(l->info, (size_t)cap * sizeof *in);
        if (!in) return -1;
        l->info = in;
        l->cap = cap;
    }
    l->items[l->n] = (dw_mem_item){.size = size, .first = first, .last = last, .align = 256,
                                   .first2 = first2 > last ? first2 : 0, .last2 = first2 > last ? last2 : 0};
    l->info[l->n] = (dw_buf_info){kind, index};
    return l->n++;
}

static int add_item(item_list *l, int64_t size, int first, int last, dw_buf_kind kind, int index) {
    return add_item2(l, size, first, last, 0, 0, kind, index);
}

/* grad_arena: every parameter's gradient slice at its fixed place (grad_arena.c). */
static bool add_grad_slices(item_list *l, const dw_compiled *c) {
    for (int k = 0; c->grad_arena && k < c->n_params; k++) {
        dw_mem_item it;
        dw_compile_grad_slice_item(c, k, &it);
        const int j = add_item(l, it.size, it.first, it.last, DW_BUF_PGRAD, k);
        if (j < 0) return false;
        l->items[j].fixed = true, l->items[j].offset = it.offset;
        if (!dw_compile_bf16_item(c, k, &it)) continue; /* bf16_arena: its BF16 copy too */
        const int b = add_item(l, it.size, it.first, it.last, DW_BUF_PBF16, k);
        if (b < 0) return false;
        l->items[b].fixed = true, l->items[b].offset = it.offset, l->items[b].align = it.align;
    }
    return true;
}

static void place_parts(const int64_t *sizes, int count, int64_t base, int64_t *offs) {
    int64_t o = base;
    for (int k = 0; k < count; k++) {
        offs[k] = sizes[k] ? o : -1;
        o += dw_align_up(sizes[k], 256);
    }
}

static int64_t parts_total(const int64_t *sizes, int count) {
    int64_t t = 0;
    for (int k = 0; k < count; k++) t += dw_align_up(sizes[k], 256);
    return t;
}

static int grad_root(const dw_compiled *c, int t) {
    while (c->tensor[t].grad_alias != t) t = c->tensor[t].grad_alias;
    return t;
}

/* Lifetime of activation t's value — [*vfirst, *vlast], and under recompute possibly a second
 * interval [*vfirst2, *vlast2] (else *vfirst2 = 0) — and the first backward time that writes its
 * gradient. */
static void value_life(const dw_compiled *c, int t, int *vfirst, int *vlast, int *vfirst2, int *vlast2, int *gfirst,
                       bool *no_grad) {
    const dw_graph *g = c->g;
    const int p = g->tensors[t].producer, nn = g->n_nodes;
    int writer = p;
    *gfirst = c->n_times;
    /* fusion: a GELU computed by its linear's epilogue is written at that linear's time; the
     * gradient of a GELU's input written by the next linear's dgrad (DGELU) at its time, and
     * the GELU output's gradient then never exists */
    const bool gelu = DW_OP_IS(&g->nodes[p], DW_OPF_EPILOGUE);
    if (gelu && (c->node[p].fused & DW_FUSED_FWD)) writer = g->tensors[g->nodes[p].in[0]].producer;
    *no_grad = gelu && (c->node[p].fused & DW_FUSED_BWD);
    /* reads in the forward sweep (fwd_last) and in the backward sweep (bwd_first .. bwd_last):
     * backwards reading the value, forwards run again reading it, the producer's own backward */
    const int written_again = dw_compile_rc_time(c, writer);
    int fwd_last = dw_compile_fwd_time(c, p), bwd_first = c->n_times, bwd_last = -1;
#define BWD_USE(u) (bwd_first = (u) < bwd_first ? (u) : bwd_first, bwd_last = (u) > bwd_last ? (u) : bwd_last)
    if (dw_op_flags(g->nodes[p].op) & DW_OPF_READS_OUT) BWD_USE(dw_compile_bwd_time(c, p));
    for (int i = p + 1; i < nn; i++) {
        if (i == c->head_linear) continue; /* a fused LM head: its reads are the loss node's */
        const dw_ir_node *n = dw_compile_node(c, i);
        const unsigned flags = dw_op_flags(n->op);
        for (int s = 0; s < n->n_in; s++) {
            if (n->in[s] != t) continue;
            /* an op doing its backward in the forward (the fused head) writes input gradients then */
            int f = dw_compile_fwd_time(c, i), r = dw_compile_rc_time(c, i);
            int b = flags & DW_OPF_BWD_IN_FWD ? f : dw_compile_bwd_time(c, i);
            if (f > fwd_last) fwd_last = f;
            if (r >= 0) BWD_USE(r);
            if (flags & DW_OPF_READS_IN(s)) BWD_USE(b);
            /* a gradient written over this value (dlogits over the logits) keeps it to then */
            if (s == 0 && (flags & DW_OPF_DX0_OVER_X0)) BWD_USE(dw_compile_bwd_time(c, p)); /* the producer's backward reads it */
            if (b < *gfirst) *gfirst = b;
            if (DW_OP_IS(n, DW_OPF_EPILOGUE) && (c->node[i].fused & DW_FUSED_BWD)) { /* written by the dgrad */
                int f2 = dw_compile_bwd_time(c, c->node[i].partner_bwd);
                if (f2 < *gfirst) *gfirst = f2;
            }
        }
    }
#undef BWD_USE
    *vfirst = dw_compile_fwd_time(c, writer);
    *vfirst2 = *vlast2 = 0;
    if (written_again >= 0 && bwd_first >= written_again) { /* dropped after the forward, written again */
        *vlast = fwd_last;
        *vfirst2 = written_again;
        *vlast2 = bwd_last > written_again ? bwd_last : written_again;
        return;
    }
    *vlast = fwd_last > bwd_last ? fwd_last : bwd_last; /* kept; a forward run again rewrites it in place */
    if (written_again > *vlast) *vlast = written_again;
}

/* Whether t's gradient is written over its value (ops.def DX0_OVER_X0: the logits). */
static bool grad_over_value(const dw_compiled *c, int t) {
    const dw_graph *g = c->g;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].in[0] == t && (dw_op_flags(g->nodes[i].op) & DW_OPF_DX0_OVER_X0)) return true;
    return false;
}

dw_status dw_compile_arena(dw_ctx *ctx, dw_compiled *c) {
    const dw_graph *g = c->g;
    const int nn = g->n_nodes, nt = g->n_tensors;
    int *vitem = malloc((size_t)nt * sizeof *vitem), *gitem = malloc((size_t)nt * sizeof *gitem);
    int *aitem = malloc((size_t)nn * sizeof *aitem), *titem = malloc((size_t)nn * sizeof *titem);
    int *fitem = malloc((size_t)nn * sizeof *fitem);
    int *gf = malloc((size_t)nt * sizeof *gf), *gl = malloc((size_t)nt * sizeof *gl);
    int64_t *gb = calloc((size_t)(nt ? nt : 1), sizeof *gb); /* gradient lifetimes and bytes */
    item_list l = {0};
    dw_status st = DW_OK;
    if (!vitem || !gitem || !aitem || !titem || !fitem || !gf || !gl || !gb) goto nomem;
    const int last_time = c->n_times - 1;
    for (int t = 0; t < nt; t++) gf[t] = last_time + 1, gl[t] = -1;
    for (int t = 0; t < nt; t++) {
        c->tensor[t].val_off = c->tensor[t].grad_off = -1;
        vitem[t] = gitem[t] = -1;
        const dw_ir_tensor *ten = &g->tensors[t];
        if (ten->kind != DW_TENSOR_ACT || t == g->loss) continue; /* the loss lives in workspace */
        if (dw_compile_absorbed(c, t)) continue;                  /* a fused head's logits: none */
        int vfirst, vlast, vfirst2, vlast2, gfirst;
        bool no_grad, over = grad_over_value(c, t);
        value_life(c, t, &vfirst, &vlast, &vfirst2, &vlast2, &gfirst, &no_grad);
        int64_t bytes = dw_compile_act_numel(c, t) * dw_compile_elem_bytes(c, t);
        vitem[t] = add_item2(&l, bytes, vfirst, vlast, vfirst2, vlast2, DW_BUF_VALUE, t);
        if (vitem[t] < 0) goto nomem;
        if (!over && gfirst <= last_time && !no_grad && dw_compile_has_grad(g, t)) { /* lifetime; the item once per alias root */
            const int r = grad_root(c, t), glast = dw_compile_bwd_time(c, ten->producer);
            if (gfirst < gf[r]) gf[r] = gfirst;
            if (glast > gl[r]) gl[r] = glast;
            if (bytes > gb[r]) gb[r] = bytes;
            if (bytes > gb[t]) gb[t] = bytes; /* t has a gradient */
        }
    }
    for (int t = nt - 1; t >= 0; t--) { /* one item per alias root, over its members' joint lifetime */
        if (gb[t] <= 0 || grad_root(c, t) != t) continue;
        gitem[t] = add_item(&l, gb[t], gf[t], gl[t], DW_BUF_GRAD, t);
        if (gitem[t] < 0) goto nomem;
    }
    for (int t = 0; t < nt; t++)
        if (gb[t] > 0 && gitem[t] < 0) gitem[t] = gitem[grad_root(c, t)];
    for (int i = 0; i < nn; i++) {
        int64_t aux[DW_AUX_COUNT], tmp[DW_TMP_COUNT];
        dw_compile_node_parts(c, i, aux, tmp);
        int64_t a = parts_total(aux, DW_AUX_COUNT), ft = tmp[DW_TMP_XENT];
        int64_t bt = parts_total(tmp, DW_TMP_COUNT) - dw_align_up(ft, 256);
        aitem[i] = titem[i] = fitem[i] = -1;
        /* a recomputed node's saved parts: written by the forward (read by nothing until the
         * forward runs again), then from its second forward to its backward */
        const int f = dw_compile_fwd_time(c, i), r = dw_compile_rc_time(c, i), b = dw_compile_bwd_time(c, i);
        if (a && (aitem[i] = r >= 0 ? add_item2(&l, a, f, f, r, b, DW_BUF_AUX, i) : add_item(&l, a, f, b, DW_BUF_AUX, i)) < 0)
            goto nomem;
        if (ft && (fitem[i] = add_item2(&l, ft, f, f, r, r, DW_BUF_FTMP, i)) < 0) /* r = -1: one interval */
            goto nomem;
        if (bt && (titem[i] = add_item(&l, bt, dw_compile_bwd_time(c, i), dw_compile_bwd_time(c, i),
                                       DW_BUF_BTMP, i)) < 0)
            goto nomem;
    }
    st = dw_compile_arena_bases(ctx, c);
    if (st != DW_OK) goto done;
    if (!add_grad_slices(&l, c)) goto nomem;
    st = dw_memplan_assign(ctx, l.items, l.n, &c->arena_bytes);
    if (st != DW_OK) goto done;
    c->live_peak = dw_memplan_live_peak(l.items, l.n);
    for (int t = 0; t < nt; t++) {
        if (vitem[t] >= 0) c->tensor[t].val_off = l.items[vitem[t]].offset;
        if (gitem[t] >= 0) c->tensor[t].grad_off = l.items[gitem[t]].offset;
        if (vitem[t] >= 0 && grad_over_value(c, t)) c->tensor[t].grad_off = c->tensor[t].val_off;
    }
    for (int i = 0; i < nn; i++) {
        int64_t aux[DW_AUX_COUNT], tmp[DW_TMP_COUNT];
        dw_compile_node_parts(c, i, aux, tmp);
        place_parts(aux, DW_AUX_COUNT, aitem[i] >= 0 ? l.items[aitem[i]].offset : 0, c->node[i].aux_off);
        int64_t xent = tmp[DW_TMP_XENT];
        tmp[DW_TMP_XENT] = 0;
        place_parts(tmp, DW_TMP_COUNT, titem[i] >= 0 ? l.items[titem[i]].offset : 0, c->node[i].tmp_off);
        c->node[i].tmp_off[DW_TMP_XENT] = fitem[i] >= 0 && xent ? l.items[fitem[i]].offset : -1;
    }
    c->items = l.items;
    c->info = l.info;
    c->n_items = l.n;
    l.items = NULL;
    l.info = NULL;
    goto done;
nomem:
    st = dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
done:
    free(l.items);
    free(l.info);
    free(vitem);
    free(gitem);
    free(aitem);
    free(titem);
    free(fitem);
    free(gf);
    free(gl);
    free(gb);
    return st;
}
