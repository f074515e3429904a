/* graph.c — graph IR storage: op/dtype/kind name tables (from ops.def), adding tensors and
 * nodes, lookup, parameter and FLOP totals, freeing. Inference and verification are in infer.c,
 * JSON in graph_json.c, the listing in print.c. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ir/ir.h"

static const char *const op_names[] = {
#define DW_OP(ID, name, min_in, max_in, flags, cpu, cuda, summary) #name,
#include "ir/ops.def"
#undef DW_OP
};
static const char *const op_summaries[] = {
#define DW_OP(ID, name, min_in, max_in, flags, cpu, cuda, summary) summary,
#include "ir/ops.def"
#undef DW_OP
};
static const struct {
    int flags;
    bool cpu, cuda;
} op_facts[] = {
#define DW_OP(ID, name, min_in, max_in, flags, cpu, cuda, summary) {flags, cpu, cuda},
#include "ir/ops.def"
#undef DW_OP
};
_Static_assert(sizeof op_names / sizeof op_names[0] == DW_OP_COUNT, "op name table vs ops.def");
_Static_assert(DW_OP_COUNT == 12, "ops.def changed: update the op tests and docs/ir.md");

const char *dw_op_name(dw_op op) { return (unsigned)op < DW_OP_COUNT ? op_names[op] : "?"; }
const char *dw_op_summary(dw_op op) { return (unsigned)op < DW_OP_COUNT ? op_summaries[op] : "?"; }
int dw_op_flags(dw_op op) { return (unsigned)op < DW_OP_COUNT ? op_facts[op].flags : 0; }
bool dw_op_on_backend(dw_op op, int device) {
    if ((unsigned)op >= DW_OP_COUNT) return false;
    return device == DW_DEVICE_CPU ? op_facts[op].cpu : device == DW_DEVICE_CUDA ? op_facts[op].cuda : false;
}

bool dw_op_parse(const char *name, dw_op *out) {
    for (int i = 0; i < DW_OP_COUNT; i++)
        if (!strcmp(op_names[i], name)) {
            *out = (dw_op)i;
            return true;
        }
    return false;
}

static const char *const dtype_names[DW_IR_DTYPE_COUNT] = {"f32", "bf16", "i32"};
const char *dw_ir_dtype_name(dw_ir_dtype t) {
    return (unsigned)t < DW_IR_DTYPE_COUNT ? dtype_names[t] : "?";
}
bool dw_ir_dtype_parse(const char *name, dw_ir_dtype *out) {
    for (int i = 0; i < DW_IR_DTYPE_COUNT; i++)
        if (!strcmp(dtype_names[i], name)) {
            *out = (dw_ir_dtype)i;
            return true;
        }
    return false;
}

static const char *const init_names[] = {"normal", "ones", "zeros"};
const char *dw_init_name(dw_init_kind k) { return (unsigned)k <= DW_INIT_ZEROS ? init_names[k] : "?"; }
bool dw_init_parse(const char *name, dw_init_kind *out) {
    for (int i = 0; i <= DW_INIT_ZEROS; i++)
        if (!strcmp(init_names[i], name)) {
            *out = (dw_init_kind)i;
            return true;
        }
    return false;
}

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

int dw_graph_add_node(dw_ctx *ctx, dw_graph *g, dw_op op, const char *name, const int *in,
                      int n_in, const dw_ir_attrs *attrs, const char *out_name) {
    DW_ASSERT(n_in >= 0 && n_in <= DW_IR_MAX_INPUTS);
    if (!grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes, sizeof *g->nodes) ||
        !grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors, sizeof *g->tensors)) {
        dw_set_error(ctx, DW_ERR_NOMEM, "graph: out of memory adding node '%s'", name);
        return -1;
    }
    dw_ir_node n = {.op = op, .n_in = n_in, .out = -1, .block = g->cur_block};
    for (int i = 0; i < n_in; i++) n.in[i] = in[i];
    if (attrs) n.attrs = *attrs;
    n.name = (char *)name; /* borrowed for inference messages */
    dw_ir_tensor out;
    if (dw_ir_infer(ctx, g, &n, &out) != DW_OK) return -1;
    int t = dw_graph_add_tensor(g, out_name, DW_TENSOR_ACT, out.dtype, out.ndim, out.shape);
    n.name = strdup(name);
    if (t < 0 || !n.name) {
        free(n.name);
        dw_set_error(ctx, DW_ERR_NOMEM, "graph: out of memory adding node '%s'", name);
        return -1;
    }
    g->tensors[t].producer = g->n_nodes;
    n.out = t;
    g->nodes[g->n_nodes++] = n;
    return t;
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
