/* graph.c — graph IR storage: adding tensors and nodes, lookup, parameter and FLOP totals,
 * freeing. The name tables are in names.c, inference in op_infer.c, verification in verify.c,
 * JSON in graph_json.c, the listing in print.c. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ir/ir.h"

static const char *const kind_names[DW_TENSOR_KIND_COUNT] = {"input", "param", "act"};
const char *dw_tensor_kind_name(dw_tensor_kind k) {
    return (unsigned)k < DW_TENSOR_KIND_COUNT ? kind_names[k] : "?";
}

dw_graph *dw_graph_new(const dw_graph_model *model, int64_t batch, int64_t seq) {
    dw_graph *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    if (model) {
        g->model = *model;
        g->model.config_json = NULL;
        if (model->config_json && !(g->model.config_json = strdup(model->config_json))) {
            free(g);
            return NULL;
        }
    }
    g->batch = batch;
    g->seq = seq;
    g->cur_block = -1;
    g->tokens = g->targets = g->logits = g->loss = -1;
    return g;
}

void dw_graph_set_block(dw_graph *g, int b) { g->cur_block = b; }

void dw_graph_free(dw_graph *g) {
    if (!g) return;
    free(g->model.config_json);
    for (int i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    for (int i = 0; i < g->n_nodes; i++) free(g->nodes[i].name);
    free(g->tensors);
    free(g->nodes);
    free(g);
}

/* Grows an array of `size`-byte elements to hold one more. */
static bool grow(void **arr, int *cap, int n, size_t size) {
    if (n < *cap) return true;
    int nc = *cap ? 2 * *cap : 64;
    void *p = realloc(*arr, (size_t)nc * size);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

int dw_graph_add_tensor(dw_graph *g, const char *name, dw_tensor_kind kind, dw_ir_dtype dtype,
                        int ndim, const int64_t *shape) {
    DW_ASSERT(ndim >= 0 && ndim <= DW_IR_MAX_DIMS);
    if (!grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors, sizeof *g->tensors)) return -1;
    char *copy = strdup(name);
    if (!copy) return -1;
    dw_ir_tensor *t = &g->tensors[g->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = copy;
    t->kind = kind;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->producer = -1;
    t->decay = kind == DW_TENSOR_PARAM && ndim >= 2;
    t->init = ndim >= 2 ? DW_INIT_NORMAL : DW_INIT_ONES;
    t->init_std = 0.02;
    return g->n_tensors++;
}

dw_status dw_graph_add_node_outs(dw_ctx *ctx, dw_graph *g, dw_op op, const char *name, const int *in, int n_in,
                                 const dw_ir_attrs *attrs, const char *const *out_names, int *outs) {
    DW_ASSERT(n_in >= 0 && n_in <= DW_IR_MAX_INPUTS);
    const int n_out = dw_op_outputs(op);
    if (n_out < 1 || n_out > DW_IR_MAX_OUTPUTS)
        return dw_set_error(ctx, DW_ERR_FORMAT, "graph: node '%s': unknown op %d", name, (int)op);
    if (!grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes, sizeof *g->nodes))
        return dw_set_error(ctx, DW_ERR_NOMEM, "graph: out of memory adding node '%s'", name);
    dw_ir_node n = {.op = op, .n_in = n_in, .n_out = n_out, .block = g->cur_block};
    for (int i = 0; i < n_in; i++) n.in[i] = in[i];
    for (int k = 0; k < DW_IR_MAX_OUTPUTS; k++) n.out[k] = -1;
    if (attrs) n.attrs = *attrs;
    n.name = (char *)name; /* borrowed for inference messages */
    dw_ir_tensor o[DW_IR_MAX_OUTPUTS];
    DW_TRY(dw_ir_infer(ctx, g, &n, o));
    for (int k = 0; k < n_out; k++) { /* every name new, before anything is added */
        if (!out_names[k] || dw_graph_find_tensor(g, out_names[k]) >= 0)
            return dw_ir_node_error(ctx, &n, "output name '%s' is %s", out_names[k] ? out_names[k] : "(null)",
                                    out_names[k] ? "already used" : "missing");
        for (int j = 0; j < k; j++)
            if (!strcmp(out_names[j], out_names[k]))
                return dw_ir_node_error(ctx, &n, "output name '%s' is given twice", out_names[k]);
    }
    n.name = strdup(name);
    if (!n.name) return dw_set_error(ctx, DW_ERR_NOMEM, "graph: out of memory adding node '%s'", name);
    for (int k = 0; k < n_out; k++) {
        const int t = dw_graph_add_tensor(g, out_names[k], DW_TENSOR_ACT, o[k].dtype, o[k].ndim, o[k].shape);
        if (t < 0) {
            free(n.name);
            return dw_set_error(ctx, DW_ERR_NOMEM, "graph: out of memory adding node '%s'", name);
        }
        g->tensors[t].producer = g->n_nodes;
        n.out[k] = outs[k] = t;
    }
    g->nodes[g->n_nodes++] = n;
    return DW_OK;
}

int dw_graph_add_node(dw_ctx *ctx, dw_graph *g, dw_op op, const char *name, const int *in,
                      int n_in, const dw_ir_attrs *attrs, const char *out_name) {
    if (dw_op_outputs(op) != 1) {
        dw_set_error(ctx, DW_ERR_FORMAT, "graph: node '%s': op %s has %d outputs (dw_graph_add_node_outs)", name,
                     dw_op_name(op), dw_op_outputs(op));
        return -1;
    }
    int t = -1;
    return dw_graph_add_node_outs(ctx, g, op, name, in, n_in, attrs, &out_name, &t) == DW_OK ? t : -1;
}

int dw_graph_find_tensor(const dw_graph *g, const char *name) {
    for (int i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name)) return i;
    return -1;
}

int64_t dw_ir_numel(const dw_ir_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int64_t dw_graph_params(const dw_graph *g) {
    int64_t p = 0;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].kind == DW_TENSOR_PARAM) p += dw_ir_numel(&g->tensors[i]);
    return p;
}

static double per_token(const dw_graph *g, void (*fn)(const dw_graph *, const dw_ir_node *, double *, double *)) {
    double total = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        double f, b;
        fn(g, &g->nodes[i], &f, &b);
        total += f + b;
    }
    return total / (double)(g->batch * g->seq);
}

double dw_graph_flops_per_token(const dw_graph *g) { return per_token(g, dw_ir_flops); }
double dw_graph_model_flops_per_token(const dw_graph *g) { return per_token(g, dw_ir_model_flops); }

int dw_graph_node_count(const dw_graph *g) { return g->n_nodes; }
int64_t dw_graph_seq(const dw_graph *g) { return g->seq; }
int64_t dw_graph_batch(const dw_graph *g) { return g->batch; }
int64_t dw_graph_vocab(const dw_graph *g) { return g->model.vocab; }
const char *dw_graph_model_type(const dw_graph *g) { return g->model.model_type; }
const char *dw_graph_config_json(const dw_graph *g) { return g->model.config_json; }
