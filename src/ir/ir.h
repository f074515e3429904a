/* ir.h — private: the graph IR. Tensors (inputs, parameters, activations) with names, shapes and
 * dtypes; nodes (one op each, one output) in topological order, named after the Hugging Face
 * module they stand for. Building, verification (shape/dtype inference), FLOPs, JSON, printing.
 * Not the executor (runtime/) and not the config -> graph translation (capture/). */
#ifndef DW_IR_IR_H
#define DW_IR_IR_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "capture/model_config.h"
#include "deepwell.h"

typedef enum {
#define DW_OP(ID, name, min_in, max_in, summary) DW_OP_##ID,
#include "ir/ops.def"
#undef DW_OP
    DW_OP_COUNT
} dw_op;

const char *dw_op_name(dw_op op);         /* "linear"; "?" out of range */
bool dw_op_parse(const char *name, dw_op *out);
const char *dw_op_summary(dw_op op);

typedef enum { DW_IR_F32 = 0, DW_IR_BF16, DW_IR_I32, DW_IR_DTYPE_COUNT } dw_ir_dtype;
const char *dw_ir_dtype_name(dw_ir_dtype t); /* "f32", "bf16", "i32" */
bool dw_ir_dtype_parse(const char *name, dw_ir_dtype *out);

typedef enum { DW_TENSOR_INPUT = 0, DW_TENSOR_PARAM, DW_TENSOR_ACT, DW_TENSOR_KIND_COUNT } dw_tensor_kind;
const char *dw_tensor_kind_name(dw_tensor_kind k); /* "input", "param", "act" */

#define DW_IR_MAX_DIMS 4
#define DW_IR_MAX_INPUTS 3

typedef struct {
    char *name;          /* params: HF weight name ("model.layers.0.mlp.up_proj.weight") */
    dw_tensor_kind kind;
    dw_ir_dtype dtype;
    int ndim;            /* 0: scalar */
    int64_t shape[DW_IR_MAX_DIMS]; /* Deepwell layout (linear weights: out x in) */
    int producer;        /* node index, -1 for inputs and params */
    bool hf_transposed;  /* HF stores the transpose (GPT-2 Conv1D weights) */
    bool decay;          /* params: weight decay applies (matrices) */
} dw_ir_tensor;

typedef struct {
    int64_t heads, kv_heads, head_dim; /* rope, attention */
    double eps;                        /* layernorm, rmsnorm */
    double theta;                      /* rope */
} dw_ir_attrs;

typedef struct {
    dw_op op;
    char *name;           /* "model.layers.3.mlp.down_proj", "transformer.h.0.attn" */
    int n_in;
    int in[DW_IR_MAX_INPUTS]; /* tensor indices */
    int out;                  /* tensor index */
    dw_ir_attrs attrs;
} dw_ir_node;

struct dw_graph {
    dw_model_config cfg;
    int64_t batch, seq;        /* shapes below are for this B x T */
    dw_ir_tensor *tensors;
    int n_tensors, cap_tensors;
    dw_ir_node *nodes;
    int n_nodes, cap_nodes;
    int tokens, targets;       /* input tensors */
    int logits, loss;          /* activations */
};

/* Building (capture, JSON load). Names are copied. Returns the tensor index, or -1 when out of
 * memory (the graph is then unusable; dw_graph_verify reports it). */
dw_graph *dw_graph_new(const dw_model_config *cfg, int64_t batch, int64_t seq);
int dw_graph_add_tensor(dw_graph *g, const char *name, dw_tensor_kind kind, dw_ir_dtype dtype,
                        int ndim, const int64_t *shape);
/* Adds a node computing a new activation `out_name` from `in`; its shape comes from inference.
 * Returns the output tensor index or -1 (message on ctx naming the node). */
int dw_graph_add_node(dw_ctx *ctx, dw_graph *g, dw_op op, const char *name, const int *in,
                      int n_in, const dw_ir_attrs *attrs, const char *out_name);
int dw_graph_find_tensor(const dw_graph *g, const char *name); /* -1 if absent */

/* Shape/dtype inference of one node's output from its inputs and attributes. */
dw_status dw_ir_infer(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *out);
/* Checks the whole graph: indices, topological order, every node's inferred output equals the
 * stored one, unique names. Errors name the node or tensor. */
dw_status dw_graph_verify(dw_ctx *ctx, const dw_graph *g);
/* FLOPs of one node (forward, backward: input and parameter gradients). */
void dw_ir_flops(const dw_graph *g, const dw_ir_node *n, double *fwd, double *bwd);
int64_t dw_ir_numel(const dw_ir_tensor *t);

/* JSON form (docs/ir.md): to a new object, and back (verified). */
json_t *dw_graph_json(const dw_graph *g);
dw_status dw_graph_from_json_obj(dw_ctx *ctx, const json_t *j, const char *what, dw_graph **out);

#endif /* DW_IR_IR_H */
