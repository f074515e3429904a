/* ir.h — private: the graph IR. Tensors (inputs, parameters, activations) with names, shapes and
 * dtypes; nodes (one op each, one output) in topological order, named after the Hugging Face
 * module they stand for, each in a transformer block or outside them; the model facts the later
 * stages need (type, block count, vocabulary, each parameter's initialisation). Building,
 * verification (shape/dtype inference), the FLOP and byte model, JSON, printing.
 * Not the executor (runtime/) and not the config -> graph translation (capture/): the graph holds
 * the captured config.json only as opaque text. */
#ifndef DW_IR_IR_H
#define DW_IR_IR_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "deepwell.h"
#include "kernels/rope_freq.h"
#include "kernels/router_desc.h"

/* Op flags (ops.def's flags column). Per input slot s (s < DW_IR_MAX_INPUTS): READS_IN(s), the
 * backward reads input s's value (so it lives until then); ACC_IN(s), the backward can add into
 * input s's gradient instead of writing it. */
#define DW_OPF_READS_IN(s) (1u << (s))
#define DW_OPF_ACC_IN(s) (1u << (8 + (s)))
enum {
    DW_OPF_READS_IN0 = DW_OPF_READS_IN(0),
    DW_OPF_READS_IN1 = DW_OPF_READS_IN(1),
    DW_OPF_READS_IN2 = DW_OPF_READS_IN(2),
    DW_OPF_ACC_IN0 = DW_OPF_ACC_IN(0),
    DW_OPF_ACC_IN1 = DW_OPF_ACC_IN(1),
    DW_OPF_ACC_IN2 = DW_OPF_ACC_IN(2),
    DW_OPF_READS_OUT = 1u << 16,  /* backward reads the output values (every output) */
    DW_OPF_DX0_OVER_X0 = 1u << 17, /* backward writes input 0's gradient over its value */
    DW_OPF_BWD_IN_FWD = 1u << 18, /* a training step's forward does the backward too */
    DW_OPF_GEMM = 1u << 19,       /* a GEMM the policy binds a recipe to; input 1: weight (M,K) */
    DW_OPF_EPILOGUE = 1u << 20,   /* elementwise, applied by the GEMM epilogues GELU_AUX / DGELU */
    DW_OPF_GRAD_COPY = 1u << 21,  /* backward hands dy unchanged to every input */
    DW_OPF_FLASH = 1u << 22,      /* fused compute-bound kernel with library state per shape */
    DW_OPF_SIDE_LOSS = 1u << 23,  /* a loss of its own, added into the step's loss; backward starts its gradient */
};
/* Whether node n's op has flag f. */
#define DW_OP_IS(n, f) ((dw_op_flags((n)->op) & (f)) != 0)

typedef enum {
#define DW_OP(ID, name, min_in, max_in, outs, flags, cpu, cuda, summary) DW_OP_##ID,
#include "ir/ops.def"
#undef DW_OP
    DW_OP_COUNT
} dw_op;

const char *dw_op_name(dw_op op);         /* "linear"; "?" out of range */
bool dw_op_parse(const char *name, dw_op *out);
const char *dw_op_summary(dw_op op);
unsigned dw_op_flags(dw_op op);          /* DW_OPF_* */
int dw_op_outputs(dw_op op);             /* outputs of every node of the op (ops.def's outs) */
/* Whether a backend implements op (ops.def's cpu / cuda columns); device is a dw_device_kind. */
bool dw_op_on_backend(dw_op op, int device);

typedef enum { DW_IR_F32 = 0, DW_IR_BF16, DW_IR_I32, DW_IR_DTYPE_COUNT } dw_ir_dtype;
const char *dw_ir_dtype_name(dw_ir_dtype t); /* "f32", "bf16", "i32" */
bool dw_ir_dtype_parse(const char *name, dw_ir_dtype *out);

typedef enum { DW_TENSOR_INPUT = 0, DW_TENSOR_PARAM, DW_TENSOR_ACT, DW_TENSOR_KIND_COUNT } dw_tensor_kind;
const char *dw_tensor_kind_name(dw_tensor_kind k); /* "input", "param", "act" */

#define DW_IR_MAX_DIMS 4
#define DW_IR_MAX_INPUTS 8  /* the flags hold 8 slots */
#define DW_IR_MAX_OUTPUTS 4

/* How a parameter starts (the architecture's reference initialisation, set by capture). */
typedef enum { DW_INIT_NORMAL = 0, DW_INIT_ONES, DW_INIT_ZEROS } dw_init_kind;
const char *dw_init_name(dw_init_kind k); /* "normal", "ones", "zeros" */
bool dw_init_parse(const char *name, dw_init_kind *out);

typedef struct {
    char *name;          /* params: HF weight name ("model.layers.0.mlp.up_proj.weight") */
    dw_tensor_kind kind;
    dw_ir_dtype dtype;
    int ndim;            /* 0: scalar */
    int64_t shape[DW_IR_MAX_DIMS]; /* Deepwell layout (linear weights: out x in) */
    int producer;        /* node index, -1 for inputs and params */
    bool hf_transposed;  /* HF stores the transpose (GPT-2 Conv1D weights) */
    bool decay;          /* params: weight decay applies (matrices) */
    dw_init_kind init;   /* params: normal(0, init_std), ones or zeros */
    double init_std;     /* params, DW_INIT_NORMAL */
} dw_ir_tensor;

typedef struct {
    int64_t heads, kv_heads, head_dim; /* rope, attention */
    double eps;                        /* layernorm, rmsnorm */
    double theta;                      /* rope */
    dw_rope_scaling rope;              /* rope: the frequencies' type (kernels/rope_freq.h) */
    int64_t top_k;                     /* moe_router: experts per token */
    int64_t experts;                   /* moe_dispatch: experts (E) the indices refer to */
    double capacity_factor;            /* moe_dispatch: > 0 drops past dw_moe_capacity rows per expert */
    int64_t window;                    /* attention: query t sees keys t-window+1..t (sliding window,
                                          itself included); 0: every key up to t */
    int32_t score;                     /* moe_router: dw_router_score */
    bool norm_topk;                    /* moe_router: the K weights renormalised to sum 1 */
    int64_t n_group, topk_group;       /* moe_router: group-limited selection, the experts in n_group groups of
                                          which a token keeps topk_group (kernels/router_desc.h); 0: none */
    double coef, zcoef;                /* moe_aux_loss: the load-balancing and z-loss coefficients */
    double softcap;                    /* attention: scores soft-capped to softcap tanh(s / softcap) before the
                                          softmax; softcap: the output's cap (Gemma 2); 0: none */
    double scale;                      /* softcap: the factor applied to x first; moe_router: the routed
                                          scaling factor applied to the weights last (0: 1) */
    double offset;                     /* rmsnorm: the weight applied as offset + w (Gemma's 1 + w); 0: w */
    bool has_pad;                      /* embedding: row `pad` is the padding row, whose gradient from
                                          the lookup is zero (nn.Embedding's padding_idx); false: none */
    int64_t pad;                       /* embedding, with has_pad: the padding row, 0 <= pad < V */
} dw_ir_attrs;

/* How a router scores experts (attrs.score). */
typedef enum { DW_ROUTER_SOFTMAX = 0, DW_ROUTER_SIGMOID = 1 } dw_router_score;
#define DW_ROUTER_MAX_EXPERTS 4096 /* beyond any released model (DeepSeek-V3: 256) */
/* A router node's choice and weights as the kernels take them. */
static inline dw_router_desc dw_ir_router_desc(const dw_ir_attrs *a) {
    const dw_router_desc d = {.score = a->score, .renorm = a->norm_topk, .n_group = a->n_group,
                              .topk_group = a->topk_group, .scale = a->scale};
    return d;
}

/* moe_dispatch's rows per expert for N tokens of K assignments over E experts: ceil(factor N K / E)
 * as Megatron-Core's get_capacity rounds (at least 1), N K where that is no limit; factor <= 0:
 * N K (dropless). */
static inline int64_t dw_moe_capacity(double factor, int64_t N, int64_t K, int64_t E) {
    if (!(factor > 0) || E < 1) return N * K;
    const double want = ceil(factor * (double)(N * K) / (double)E);
    return want >= (double)(N * K) ? N * K : want < 1 ? 1 : (int64_t)want;
}

/* Rows moe_dispatch can fill for N tokens: every assignment (N K), or with a factor below 1 at most
 * E capacities (E dw_moe_capacity) — the rows its buffers and the expert ops hold. */
static inline int64_t dw_moe_routed_rows(double factor, int64_t N, int64_t K, int64_t E) {
    if (!(factor > 0 && factor < 1)) return N * K;
    const int64_t r = E * dw_moe_capacity(factor, N, K, E);
    return r < N * K ? r : N * K;
}

typedef struct {
    dw_op op;
    char *name;           /* "model.layers.3.mlp.down_proj", "transformer.h.0.attn" */
    int n_in, n_out;
    int in[DW_IR_MAX_INPUTS];   /* tensor indices */
    int out[DW_IR_MAX_OUTPUTS]; /* tensor indices; out[0] the main output (the one most ops have) */
    int block;                /* transformer block (0..n_blocks-1), -1 outside the blocks */
    dw_ir_attrs attrs;
} dw_ir_node;

/* What the graph knows of the model it was captured from. */
typedef struct {
    char model_type[32];       /* Hugging Face model_type ("gpt2", "llama"): names capture's row */
    char summary[192];         /* one readable line: layers, width, heads, ffn, vocabulary */
    int64_t n_blocks;          /* transformer blocks */
    int64_t vocab;             /* token embedding rows (tokens must be below) */
    int64_t max_seq;           /* positions the model takes */
    bool tied_embeddings;      /* the LM head reads the token embedding */
    char *config_json;         /* owned: the config.json text it was captured from (NULL: none) */
} dw_graph_model;

struct dw_graph {
    dw_graph_model model;
    int64_t batch, seq;        /* shapes below are for this B x T */
    dw_ir_tensor *tensors;
    int n_tensors, cap_tensors;
    dw_ir_node *nodes;
    int n_nodes, cap_nodes;
    int cur_block;             /* block of nodes being added (dw_graph_set_block) */
    int tokens, targets;       /* input tensors */
    int logits, loss;          /* activations */
};

/* Building (capture, JSON load). Names and the model's config text are copied. Returns the
 * tensor index, or -1 when out of memory (the graph is then unusable; dw_graph_verify reports
 * it). New nodes are outside the blocks (block -1) until dw_graph_set_block. */
dw_graph *dw_graph_new(const dw_graph_model *model, int64_t batch, int64_t seq);
/* Nodes added from now on belong to block b (-1: outside the blocks). */
void dw_graph_set_block(dw_graph *g, int b);
int dw_graph_add_tensor(dw_graph *g, const char *name, dw_tensor_kind kind, dw_ir_dtype dtype,
                        int ndim, const int64_t *shape);
/* Adds a node of a one-output op computing a new activation `out_name` from `in`; its shape
 * comes from inference. Returns the output tensor index or -1 (message on ctx naming the node). */
int dw_graph_add_node(dw_ctx *ctx, dw_graph *g, dw_op op, const char *name, const int *in,
                      int n_in, const dw_ir_attrs *attrs, const char *out_name);
/* The same for any op: dw_op_outputs(op) new activations named out_names[k], their indices in
 * outs[k]. */
dw_status dw_graph_add_node_outs(dw_ctx *ctx, dw_graph *g, dw_op op, const char *name, const int *in, int n_in,
                                 const dw_ir_attrs *attrs, const char *const *out_names, int *outs);
int dw_graph_find_tensor(const dw_graph *g, const char *name); /* -1 if absent */

/* Records "node 'NAME' (op): message" as a DW_ERR_FORMAT error on ctx and returns it. */
dw_status dw_ir_node_error(dw_ctx *ctx, const dw_ir_node *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "(2,64,768)" into buf. */
void dw_ir_shape_str(const dw_ir_tensor *t, char *buf, size_t cap);
/* Shape/dtype inference of one node's outputs (out[0..dw_op_outputs(op))) from its inputs and
 * attributes. */
dw_status dw_ir_infer(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *out);
/* Checks the whole graph: indices, topological order, every node's inferred output equals the
 * stored one, unique names. Errors name the node or tensor. */
dw_status dw_graph_verify(dw_ctx *ctx, const dw_graph *g);
/* FLOPs of one node (forward, backward: input and parameter gradients) at the graph's shape;
 * causal attention counted as computed (the pairs at or below the diagonal). The planner, the
 * reports and the MFU of `bench step` all read this model (ir/op_cost.c). */
void dw_ir_flops(const dw_graph *g, const dw_ir_node *n, double *fwd, double *bwd);
/* The same node in PaLM's model-FLOPs convention (MFU): matmuls only, no biases, attention over
 * the full T x T square. */
void dw_ir_model_flops(const dw_graph *g, const dw_ir_node *n, double *fwd, double *bwd);
/* Memory traffic of one node: activation elements read or written, forward and backward, as the
 * engine's kernels run them; GEMMs and flash kernels count 0 here (their time is the GEMM's and
 * the attention kernel's). */
void dw_ir_traffic(const dw_graph *g, const dw_ir_node *n, double *fwd, double *bwd);
int64_t dw_ir_numel(const dw_ir_tensor *t);

/* JSON form (docs/ir.md): to a new object, and back (verified). */
json_t *dw_graph_json(const dw_graph *g);
dw_status dw_graph_from_json_obj(dw_ctx *ctx, const json_t *j, const char *what, dw_graph **out);

#endif /* DW_IR_IR_H */
