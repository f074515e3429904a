/* engine_moe_bias.c — the routers' selection bias in the workspace (engine_moe_bias.h): an int32
 * switch, then a row of FP32 per router node; and its tensor names in a weights file. */
#include "runtime/engine_moe_bias.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "runtime/engine.h"

void dw_engine_moe_bias_shape(const dw_engine *e, int64_t *layers, int64_t *experts) {
    const dw_work_layout *w = &e->p->work;
    *layers = w->moe_bias >= 0 ? w->moe_bias_layers : 0;
    *experts = *layers ? w->moe_bias_experts : 0;
}

static dw_status no_router(dw_engine *e) {
    return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "engine: the model has no MoE router to bias");
}

dw_status dw_engine_moe_bias_set(dw_engine *e, const float *bias) {
    const dw_work_layout *w = &e->p->work;
    if (w->moe_bias < 0) return no_router(e);
    const int32_t on = bias != NULL;
    char *at = e->x->work + w->moe_bias;
    if (bias)
        DW_TRY(e->be->i->upload(e->be, at + DW_MOE_BIAS_ROWS, bias,
                                (size_t)(w->moe_bias_layers * w->moe_bias_experts) * sizeof *bias));
    return e->be->i->upload(e->be, at, &on, sizeof on);
}

dw_status dw_engine_moe_bias_get(dw_engine *e, float *bias, bool *on) {
    const dw_work_layout *w = &e->p->work;
    if (w->moe_bias < 0) return no_router(e);
    const char *at = e->x->work + w->moe_bias;
    int32_t flag = 0;
    DW_TRY(e->be->i->download(e->be, &flag, at, sizeof flag));
    if (on) *on = flag != 0;
    if (!bias) return DW_OK;
    return e->be->i->download(e->be, bias, at + DW_MOE_BIAS_ROWS,
                              (size_t)(w->moe_bias_layers * w->moe_bias_experts) * sizeof *bias);
}

/* The weight name of the linear layer that computes router node r's logits, or NULL. */
static const char *gate_weight(const dw_graph *g, const dw_ir_node *r) {
    const int p = g->tensors[r->in[0]].producer;
    if (p < 0 || g->nodes[p].op != DW_OP_LINEAR || g->nodes[p].n_in < 2) return NULL;
    return g->tensors[g->nodes[p].in[1]].name;
}

char *dw_engine_moe_bias_name(const dw_engine *e, int64_t row) {
    int64_t j = 0;
    for (int i = 0; i < e->g->n_nodes; i++) {
        const dw_ir_node *n = &e->g->nodes[i];
        if (n->op != DW_OP_MOE_ROUTER || j++ != row) continue;
        const char *w = gate_weight(e->g, n), *dot = w ? strrchr(w, '.') : NULL;
        const int stem = dot ? (int)(dot - w) : (int)strlen(n->name); /* "<gate>" of "<gate>.weight" */
        const size_t len = (size_t)stem + sizeof DW_MOE_BIAS_TENSOR + 1;
        char *name = malloc(len);
        if (name) snprintf(name, len, "%.*s.%s", stem, dot ? w : n->name, DW_MOE_BIAS_TENSOR);
        return name;
    }
    return NULL;
}

int64_t dw_engine_moe_bias_row(const dw_engine *e, const char *name) {
    int64_t L = 0, E = 0;
    dw_engine_moe_bias_shape(e, &L, &E);
    if (!dw_moe_bias_tensor_name(name)) return -1;
    for (int64_t l = 0; l < L; l++) {
        char *n = dw_engine_moe_bias_name(e, l);
        const bool same = n && !strcmp(n, name);
        free(n);
        if (same) return l;
    }
    return -1;
}

bool dw_engine_moe_bias_is_tensor(const dw_engine *e) { return e->moe_bias_tensor; }

dw_status dw_engine_moe_bias_load(dw_engine *e, const float *rows) {
    e->moe_bias_tensor = rows != NULL;
    return rows ? dw_engine_moe_bias_set(e, rows) : DW_OK;
}
