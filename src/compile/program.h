/* program.h — private: dw_compiled, the one executable program. What runs, in order (steps: op
 * forward and backward, optimizer phases; room for collectives and stream waits), where every
 * tensor lives (pools -> byte offsets, each tensor with its row extent), how each node's
 * backward delivers input gradients, and what was decided per node (recipe, kernels, fusion,
 * quantised operand slots). Made by dw_compile (compile.c) for a target (device, compute
 * capability); executed by runtime/exec.c on any backend — the same program on the CPU and on
 * CUDA. Pure data: no device memory, no backend code.
 * Byte offsets are into the pool named beside them; -1 means "none". Shapes are at capacity (the
 * graph's B x T); a call may run fewer rows (runtime: b x t), never more. */
#ifndef DW_COMPILE_PROGRAM_H
#define DW_COMPILE_PROGRAM_H

#include <stdbool.h>
#include <stdint.h>

#include "compile/memplan.h"
#include "formats/formats.h"
#include "ir/ir.h"
#include "precision/policy.h"

/* ---- steps ----------------------------------------------------------------------------------- */
typedef enum {
    DW_STEP_FWD = 0,     /* node's forward (its backward too for DW_OPF_BWD_IN_FWD ops in training);
                            arg 1: run again in the backward sweep (recompute), writing the same
                            values and saved parts to the same places */
    DW_STEP_BWD,         /* node's backward */
    DW_STEP_GRAD_NORM,   /* global L2 norm of every parameter gradient (workspace: norm) */
    DW_STEP_ADAMW,       /* AdamW over every parameter (arguments from workspace: adamw_args) */
    DW_STEP_CAST_BF16,   /* BF16 working copy of the FP32 masters over run `arg` (bf16_runs) */
    DW_STEP_QUANT_W,     /* node's weight cache: W and W^T quantised from the FP32 master */
    DW_STEP_COLLECTIVE,  /* a collective on the comm stream (multi-rank programs; none yet) */
    DW_STEP_WAIT,        /* a stream waits for another (multi-rank programs; none yet) */
    DW_STEP_ZERO_GRAD,   /* grad_arena programs: parameter `arg`'s gradient slice zeroed, just before
                            its first writer (node: that writer's node); training sweeps only */
    DW_STEP_KIND_COUNT
} dw_step_kind;
const char *dw_step_kind_name(dw_step_kind k);

typedef struct {
    uint8_t kind;  /* dw_step_kind */
    int32_t node;  /* FWD, BWD, QUANT_W: the node; else -1 */
    int32_t arg;   /* CAST_BF16: the run; else 0 */
} dw_step;

/* Ranges of steps [begin, end): a training micro-batch runs FORWARD then BACKWARD; an
 * optimizer step runs OPTIMIZER, which ends with REFRESH (the BF16 copies and the quantised
 * weights); loading weights runs REFRESH alone. */
typedef enum { DW_PHASE_FORWARD = 0, DW_PHASE_BACKWARD, DW_PHASE_OPTIMIZER, DW_PHASE_REFRESH, DW_PHASE_COUNT } dw_phase;

/* ---- memory ---------------------------------------------------------------------------------- */
typedef enum { DW_POOL_WEIGHTS = 0, DW_POOL_GRADS, DW_POOL_OPTIM, DW_POOL_ACT, DW_POOL_WORK,
               DW_POOL_COUNT } dw_pool_id;
const char *dw_pool_name(dw_pool_id p); /* "weights", ... */

/* Activation storage (kernels/cuda/ops_cuda.h's dw_act_dtype has the same values). */
typedef enum { DW_DT_ACT_F32 = 0, DW_DT_ACT_BF16 = 1 } dw_act_type;

/* One graph tensor in the program. Activations live in the activation pool; parameters in the
 * parameter pools at param_off (floats); inputs in the workspace (tokens, targets). */
typedef struct {
    int64_t val_off;     /* activations: value, bytes into DW_POOL_ACT */
    int64_t grad_off;    /* activations: gradient (shared through grad_alias), bytes into DW_POOL_ACT */
    int grad_alias;      /* the tensor whose gradient buffer this one's shares (itself when own) */
    int param;           /* parameters: index into param_off, else -1 */
    /* extent: rows of `width` elements; rows_cap at capacity. Rows follow the call's b x t
     * unless count_off >= 0: then an int32 row count the device writes at that workspace offset
     * (data-dependent rows, e.g. MoE dispatch), never above rows_cap */
    int64_t rows_cap, width;
    int64_t count_off;
    /* MoE rows under a capacity factor below 1 (moe_rows.c; factor 0: not such a tensor): rows
     * dw_moe_routed_rows(factor, b t, top_k, experts) of the call, rows_cap at capacity */
    double moe_factor;
    int64_t moe_top_k, moe_experts;
} dw_prog_tensor;

/* Per-node parts of the activation pool (byte offsets; -1: none).
 * Saved for backward (aux): STAT0 = layernorm mean / rmsnorm rstd / attention lse (FP32),
 * STAT1 = layernorm rstd, Q/K/V = a packed qkv unpacked to (B,T,H,D), (B,T,Hkv,D) (act dtype).
 * Temporaries of the backward step (btmp): ACC<s> = input s's gradient to be added into an
 * already written one (act dtype, the input's size), DELTA = norm backward partial sums /
 * attention's (B,H,T) FP32 scratch, GQ/GK/GV = packed attention's unpacked gradients.
 * Temporary of the forward step (ftmp): XENT = cross-entropy workspace. */
enum { DW_AUX_STAT0 = 0, DW_AUX_STAT1, DW_AUX_Q, DW_AUX_K, DW_AUX_V, DW_AUX_COUNT };
enum { DW_TMP_ACC0 = 0, /* ACC<s> = DW_TMP_ACC0 + s, one per input slot */
       DW_TMP_DELTA = DW_TMP_ACC0 + DW_IR_MAX_INPUTS, DW_TMP_GQ, DW_TMP_GK, DW_TMP_GV, DW_TMP_XENT, DW_TMP_COUNT };

/* How a node's backward delivers the gradient of input slot s: not at all (a token input or a
 * parameter, whose gradient the op accumulates itself), written (first writer in the backward
 * order), added in by the op itself (the op's DW_OPF_ACC_IN flag), or written to the ACC<s>
 * temporary and added in by the executor after the op (a tensor read by several nodes). */
typedef enum { DW_GRAD_NONE = 0, DW_GRAD_WRITE, DW_GRAD_ACCUM, DW_GRAD_ACCUM_TMP } dw_grad_mode;

/* Arena buffer kinds (for reports and tests). */
typedef enum { DW_BUF_VALUE = 0, DW_BUF_GRAD, DW_BUF_AUX, DW_BUF_FTMP, DW_BUF_BTMP,
               DW_BUF_PGRAD, /* grad_arena: a parameter's gradient slice (index: the parameter) */
               DW_BUF_PBF16  /* bf16_arena: a parameter's BF16 working copy (index: the parameter) */ } dw_buf_kind;
typedef struct {
    dw_buf_kind kind;
    int index; /* tensor (value, grad) or node (aux, ftmp, btmp) */
} dw_buf_info;

/* One quantised operand's room in the workspace pool: codes at `off`, scales at off + scales, the
 * NVFP4 tensor scale (one float) at off + tscale; `bytes` in all. off -1: no such slot. codes_act
 * >= 0: the codes are in the activation pool at that byte instead (a MoE layer's cached expert
 * weights under wcache_arena), and the workspace holds the scales alone (scales 0). */
typedef struct {
    int64_t off, scales, tscale, bytes;
    int64_t codes_act;
} dw_qslot_layout;

#define DW_COMPILE_NORM_SEGS 128 /* the norm step's pool ranges at most (a launch argument of its kernel) */

/* Workspace pool layout (byte offsets). */
typedef struct {
    int64_t tokens, targets;   /* (cap N) int32 each; a feed-forward graph's input: (cap N, C_in) act dtype */
    int64_t loss;              /* FP32 scalar */
    int64_t moe_aux;           /* the MoE router losses' last values (-1: none): FP32 load-balancing loss
                                  and FP32 z-loss (both already in `loss`; NaN: not configured), then int32 assignments per
                                  expert summed over the MoE layers (moe_experts of them) */
    int64_t moe_experts;
    int64_t moe_aux_part;      /* the router-loss statistics' scratch (-1: none): DW_MOE_AUX_PART_BYTES of the
                                  widest statistics node (kernels/cuda/ops_cuda.h), used within one call */
    int64_t moe_counts;        /* int64 running totals of the training forwards' routing (-1: no MoE
                                  layer): per dispatch node in graph order (moe_layers of them), the
                                  assignments, those dropped, then the router's choices per expert
                                  (moe_count_experts of them); DW_MOE_COUNT_* */
    int64_t moe_layers, moe_count_experts;
    int64_t moe_bias;          /* the MoE routers' selection bias (-1: no router): an int32 switch (0: off,
                                  the choice by the logits), then at moe_bias + DW_MOE_BIAS_ROWS FP32
                                  (moe_bias_layers x moe_bias_experts), a row per router node in graph
                                  order (runtime/engine_moe_bias.h) */
    int64_t moe_bias_layers, moe_bias_experts;
    int64_t norm;              /* double: sum of squares of all gradients, then the norm */
    int64_t partials;          /* DW_COMPILE_NORM_BLOCKS doubles */
    int64_t adamw_args;        /* DW_COMPILE_ADAMW_ARGS_BYTES: the optimizer's hyper-parameters for
                                  this step, read by the kernel (so a CUDA graph replays it) */
    int64_t bgrad;             /* FP32 [widest biased linear output] (BF16 mode): the BF16 wgrad's
                                  bias-gradient epilogue writes here, then it is added to db */
    /* quantised linear layers (all off -1 when no node is quantised): the operands quantised per
     * step, each role in its own slot sized for the largest of its operands over every quantised
     * node; and the quantiser's scratch (amax) at quant_ws (quant_ws_bytes) */
    dw_qslot_layout q_rows;    /* row-wise activations: fprop x [N,K]; backward dy [N,M]; then,
                                  once dgrad has read dy, x's row-wise copy of the x^T pass */
    dw_qslot_layout q_dyt;     /* dy^T [M,N] (in dy's pass) */
    dw_qslot_layout q_xt;      /* x^T [K,N] */
    int64_t quant_ws, quant_ws_bytes;
    int64_t glu_scales, glu_scales_bytes; /* (-1, 0: none) the scales of a SwiGLU backward's fp8_block
                                  gradients (dw_compile_swiglu_bwd_quant): FP32 dgate [N,F/128],
                                  dgate^T [F,N/128], dup, dup^T, for the widest such SwiGLU */
    int64_t glu_rows, glu_rows_bytes; /* (-1, 0: none) an expert SwiGLU backward's fp8_block rows
                                  (dw_compile_swiglu_bwd_moe_rows): E4M3 dgate [R,F], dup [R,F],
                                  then FP32 scales [R,F/128] of each, every piece 256-aligned, R
                                  the rows' capacity, for the largest such SwiGLU; or a combine
                                  backward's dy rows for the down layer (dw_compile_combine_bwd_
                                  moe_rows): codes [R,C], then scales [R,C/128] */
    int64_t wsumsq;            /* the experts' wgrad share of the gradient norm (-1: none; compile/
                                  wgrad_sumsq.h): wsumsq_parts doubles, each eligible MoE linear
                                  layer's blocks in node order (node[].wsumsq_off) */
    int64_t wsumsq_parts;
    int n_norm_segs;           /* with partials: the gradient pool's ranges [lo, hi) they do not */
    int64_t norm_segs[DW_COMPILE_NORM_SEGS][2]; /* cover, ascending, for the norm step */
    int64_t bytes;
} dw_work_layout;
#define DW_COMPILE_NORM_BLOCKS 1024
/* A MoE layer's counters in work.moe_counts: int64 [assigned, dropped, per-expert load (E)]. */
enum { DW_MOE_COUNT_ASSIGNED = 0, DW_MOE_COUNT_DROPPED, DW_MOE_COUNT_LOAD };
/* Byte offset in the workspace of dispatch node `node`'s counters (-1: not a dispatch node). */
int64_t dw_compile_moe_counts_of(const dw_compiled *c, int node);
/* The selection bias's rows start this many bytes past work.moe_bias (its switch before them). */
#define DW_MOE_BIAS_ROWS 256
/* Byte offset in the workspace of router node `node`'s bias row (-1: not a router node). */
int64_t dw_compile_moe_bias_of(const dw_compiled *c, int node);
#define DW_COMPILE_ADAMW_ARGS_BYTES 64 /* sizeof(dw_cuda_adamw_args): 8 doubles */
/* Bytes of cuBLASLt workspace the GEMM layer allocates on first use (gemm_cublaslt.c). */
#define DW_COMPILE_LT_WORKSPACE ((int64_t)64 << 20)

/* ---- decisions per node ------------------------------------------------------------------------ */
/* The three GEMMs of a linear layer y = x W^T: fprop y = x W^T, dgrad dx = dy W, wgrad
 * dW += dy^T x. */
typedef enum { DW_QPASS_FPROP = 0, DW_QPASS_DGRAD, DW_QPASS_WGRAD, DW_QPASS_COUNT } dw_qpass;

typedef struct {
    dw_recipe recipe;          /* linear: from the policy; other ops: BF16 (or FP32 mode) */
    dw_policy_reason reason;
    int rule;                  /* policy rule index for DW_POLICY_BY_RULE, else -1 */
    unsigned bf16_passes;      /* bit p (dw_qpass): the rule, or the default (DW_POLICY_PASSES_DEFAULT set:
                                  fp8_block experts' wgrad), keeps pass p BF16 in a quantised recipe */
    /* linear, per pass at the planned shape: quantised in the node's recipe, or BF16 (the
     * fallback; `why` says why), with the kernel the registry selects for the target */
    bool quantised[DW_QPASS_COUNT];
    const char *kernel[DW_QPASS_COUNT]; /* static registry names ("cublaslt_fp8_sm90") or NULL */
    char *note;                /* owned, or NULL: the readable account of the three GEMMs */
} dw_node_binding;

/* GEMM epilogue fusion (BF16 path, compile/fuse.c; DW_FUSE=0 turns it off):
 *   DW_FUSED_FWD  GELU G whose input is the output of a linear L (width % 8 == 0): L's fprop
 *                 writes G's output with the GELU_AUX epilogue (the pre-activation still goes to
 *                 L's output, G's input); G has no forward step.
 *   DW_FUSED_BWD  GELU G whose output only one BF16 linear P reads (as x) and whose input
 *                 gradient G alone writes: P's dgrad applies GELU' (DGELU epilogue, aux = G's
 *                 input) and writes G's input gradient; G has no backward step and G's output
 *                 has no gradient buffer. */
enum { DW_FUSED_FWD = 1, DW_FUSED_BWD = 2, DW_FUSED_HEAD = 4 /* the LM head linear and the loss: head_xent */ };

typedef struct {
    dw_node_binding bind;
    int64_t aux_off[DW_AUX_COUNT];
    int64_t tmp_off[DW_TMP_COUNT];
    uint8_t grad_mode[DW_IR_MAX_INPUTS]; /* dw_grad_mode per input slot */
    uint8_t fused;            /* DW_FUSED_* (GELU nodes; FUSED_HEAD: the head linear and the loss) */
    int partner_fwd;          /* fusion partner: for a linear, the GELU whose forward it does; for */
    int partner_bwd;          /* a fused GELU, the linear doing its forward / backward; -1 none */
    dw_qslot_layout wq[2];    /* quantised linear: W [M,K] along K and W^T [K,M] along M, in the
                                 workspace, refreshed after every weight update (DW_STEP_QUANT_W) */
    int64_t wsumsq_off;       /* a MoE linear layer whose wgrad writes its share of the gradient norm:
                                 its partials' byte offset in the workspace (compile/wgrad_sumsq.h),
                                 else -1 (set with the workspace's layout) */
    uint8_t pgrad_set;        /* grad_arena: bit s set when the backward writes input s's parameter
                                 gradient over its slice (beta 0) instead of adding into it: the
                                 parameter's first writer (grad_arena.c), no ZERO_GRAD before it */
} dw_prog_node;

/* What the program was compiled for: the kernel choices are the registry's for this device. */
typedef struct {
    int device;               /* dw_device_kind: CPU or CUDA */
    int sm;                   /* compute capability x10 (90 = sm_90); 0 on the CPU */
} dw_compile_target;

struct dw_compiled {
    const dw_graph *g;         /* borrowed: must outlive the dw_compiled */
    dw_compile_target target;
    bool bf16;                 /* BF16 activations + BF16 GEMMs; false: FP32 reference mode */
    bool fuse;                 /* GELU into GEMM epilogues (dw_compile_opts.fuse; fuse.c) */
    /* The fused LM head (dw_compile_opts.fused_head; fuse.c): the loss node head_xent runs as op
     * HEAD_XENT, head_node (x, the head's weight, the targets -> the loss), in place of the head
     * linear head_linear (no steps of its own) and the cross-entropy; the logits get no buffer and
     * the forward holds head_chunk rows of them at a time (DW_TMP_XENT). -1: not fused. */
    bool fused_head;
    int64_t head_chunk_want;   /* dw_compile_opts.head_chunk (0: the compiler's choice) */
    int head_xent, head_linear;
    dw_ir_node head_node;
    int64_t head_chunk;
    int act_size;              /* bytes per activation element (4 or 2) */
    char precision[32];        /* "fp32" (no policy), the policy's default recipe, or "policy"
                                  (a policy with rules): reports and checkpoints */
    char *policy_json;         /* the policy (dw_policy_to_json), or NULL in FP32 mode */
    dw_nvfp4_recipe nvfp4;     /* the policy's NVFP4 training recipe (nvfp4 nodes' quantisers) */

    dw_step *steps;
    int n_steps;
    int phase[DW_PHASE_COUNT][2]; /* [begin, end) into steps */
    int n_times;               /* logical times of the memory plan: every node's forward (time =
                                  node), then the backward sweep: each node's backward and, for a
                                  recomputed block, its nodes' forwards again just before it */
    int recompute;             /* dw_recompute: NONE, SELECTIVE or FULL (recompute.c) */
    int recompute_blocks;      /* FULL: blocks [0, recompute_blocks) recompute (all: n_blocks) */
    bool moe_remat;            /* a MoE layer's input norm, dispatch and expert SwiGLU run again
                                  before their outputs' backward instead of keeping them
                                  (recompute.c; dw_compile_opts.moe_remat) */
    int *bwd_t;                /* (n_nodes) backward time of each node */
    int *rc_t;                 /* (n_nodes) time of the node's forward run again in the backward
                                  sweep (a recomputed block's, or a rematerialised MoE
                                  node's), else -1 */
    int *sweep;                /* (n_times - n_nodes) the backward sweep in order: node, or
                                  -(node + 1) for a recomputed forward */

    dw_prog_tensor *tensor;    /* (n_tensors) */
    dw_prog_node *node;        /* (n_nodes) */

    /* parameters: FP32 master, grads, m, v at the same float offsets; decay params first */
    int n_params;
    int *param_tensor;         /* (n_params) graph tensor of each parameter, in graph order */
    int64_t *param_off;        /* (n_params) offset in floats, 64-float (256-byte) aligned */
    int64_t param_floats;      /* floats of one parameter-shaped pool, padding included */
    /* Gradients in the activation arena (dw_compile_opts.grad_arena; arena.c): no gradient pool;
     * the gradients keep the pool's flat layout in the arena from byte grad_base, parameter k's
     * slice [param_off[k], the next parameter's offset) taken from its first writer's time
     * (grad_first[k], node; -1: no writer, from the backward's start), zeroed by a ZERO_GRAD step
     * just before it (or, where that writer writes the slice over, node[].pgrad_set, its padding
     * alone), to the end of the sweep and on through the optimizer. One backward per
     * optimizer step: activations of the next forward take the slices again. */
    bool grad_arena;
    int64_t grad_base;
    int *grad_first;           /* (n_params) */
    /* bf16_arena (with grad_arena, BF16 programs; dw_compile_opts.bf16_arena): the BF16 working
     * copies' layout (params.c) in the arena from byte bf16_base, parameter k's copy live from
     * the step's start (the refresh after the previous optimizer step wrote it) to its last
     * reader's time (grad_arena.c); the weights pool then holds the FP32 masters alone */
    bool bf16_arena;
    int64_t bf16_base;
    /* wcache_arena (with bf16_arena; dw_compile_opts.wcache_arena): a MoE layer whose experts keep
     * no BF16 copy (bf16_lazy) and read a quantised cache (fp8_block, mxfp8) holds its codes, W [E,M,K] then
     * W^T [E,K,M] (one byte each: the copy's 2 bytes an element), in the copy's room in the arena
     * (wq[t].codes_act): written by the refresh after the optimizer, read through the layer's
     * backward, as the copy would be (workspace.c) */
    bool wcache_arena;
    int64_t decay_floats;      /* [0, decay_floats) holds the decay parameters */
    /* BF16 working copies (BF16 mode): in the weights pool after the FP32 masters, at the same
     * element offsets. A parameter keeps one standing unless only quantised linear layers read it
     * and both their fprop and dgrad run quantised (bf16_lazy: a BF16 GEMM falling back at a
     * smaller call shape converts it first); runs are the ranges the copy refreshes */
    bool *bf16_lazy;           /* (n_params) */
    int64_t (*bf16_runs)[2];   /* [begin, end) in floats */
    int n_bf16_runs;

    /* activation arena */
    int n_items;
    dw_mem_item *items;        /* (n_items) sizes, lifetimes, offsets */
    dw_buf_info *info;         /* (n_items) what each item is */
    int64_t arena_bytes, live_peak;

    dw_work_layout work;
    int64_t pool_bytes[DW_POOL_COUNT];
};

/* ---- queries (compile.c) ------------------------------------------------------------------------ */
/* Logical times of node i (the memory plan's lifetimes). */
static inline int dw_compile_fwd_time(const dw_compiled *c, int node) { (void)c; return node; }
static inline int dw_compile_bwd_time(const dw_compiled *c, int node) { return c->bwd_t[node]; }
/* The time node's forward runs again before its block's backward (recompute), or -1. */
static inline int dw_compile_rc_time(const dw_compiled *c, int node) { return c->rc_t[node]; }
/* Whether node i's forward runs again in the backward sweep under c->recompute (recompute.c): a
 * block's node with a forward step of its own, except one that adds to the loss or does its own
 * backward. */
bool dw_compile_recomputed(const dw_compiled *c, int i);
/* Whether node i's main output is rematerialised (recompute.c): dropped after the forward and
 * written again by its forward run again (rc_t) just before the first backward reading it. A MoE
 * dispatch, expert SwiGLU or the RMSNorm whose output a dispatch reads (c->moe_remat); under
 * DW_RECOMPUTE_SELECTIVE a norm feeding a linear layer and an MLP activation of a linear's
 * output. Never a node of a recomputed block. */
bool dw_compile_remat(const dw_compiled *c, int i);

/* grad_arena programs (grad_arena.c): the logical time parameter k's gradient slice is born (its
 * first writer's, or the backward sweep's start when no step writes it), and the float where the
 * slice ends (the next parameter's offset, or param_floats: its padding is in it). */
int dw_compile_grad_birth(const dw_compiled *c, int k);
int64_t dw_compile_grad_slice_end(const dw_compiled *c, int k);
/* wcache_arena: whether MoE node i's cached codes (in its weight's BF16 room) lie only on
 * gradients of elements below the weight's own, or on none: all read when an ascending AdamW pass
 * reaches the weight, which may then write the cache in its pass (steps_cuda.c); true for a cache
 * in the workspace. */
bool dw_compile_wcache_below(const dw_compiled *c, int i);
/* wcache_arena: how many MoE linear layers (gate, up, down nodes) hold their cache's codes in the arena. */
int dw_compile_wcache_layers(const dw_compiled *c);
/* The float where parameter k's ZERO_GRAD starts: its offset, or past its elements when its first
 * writer writes them over the slice (pgrad_set): then only the padding up to the slice's end is
 * zeroed, and no step at all when there is none. */
int64_t dw_compile_grad_zero_from(const dw_compiled *c, int k);

/* Whether the program runs linear layers quantised in recipe r (every recipe but bf16). */
bool dw_compile_quant_recipe(dw_recipe r);
/* A quantised layer's recipes under the node's recipe r. fp8_block is DESIGN.md's block recipe
 * (DeepSeek-V3's): 1x128 blocks (FORMATS.md's tensor recipe fp8_block) for the activations and
 * gradients x, x^T, dy, dy^T, and 128x128 blocks (fp8_block2d) for the weight W, W^T; fp8_block2d
 * as a node recipe names the same pairing. Every other recipe quantises all four operands in r. */
dw_recipe dw_compile_quant_act_recipe(dw_recipe r);
dw_recipe dw_compile_quant_weight_recipe(dw_recipe r);
/* The GEMM shape (m, n, k) of `pass` for a linear layer of N tokens, K inputs, M outputs. */
void dw_compile_quant_shape(dw_qpass pass, int64_t N, int64_t K, int64_t M, int64_t *m, int64_t *n, int64_t *k);
/* Whether linear node i's GEMM `pass` runs quantised at `rows` tokens on the program's target:
 * the GEMM registry has a kernel for it there (operands K-major, output BF16 for fprop and dgrad,
 * FP32 for wgrad, no epilogue); false: it runs in BF16. The same answer on every backend, so the
 * CPU mirrors what the target does. *kernel (may be NULL): the registry's name (static); why
 * (may be NULL): the reason it cannot, or "". At the planned rows the answer is the binding's. */
bool dw_compile_linear_quantised(const dw_compiled *c, int i, dw_qpass pass, int64_t rows, const char **kernel,
                                 char *why, size_t why_len);
/* Whether linear node `linear`, whose GELU the forward fuses (DW_FUSED_FWD), takes it in its
 * fprop's epilogue at `rows` tokens: where that fprop runs in BF16 always; quantised, where the
 * registry picks the same kernel with the GELU_AUX epilogue as without, else the GELU runs as a
 * pass right after the GEMM (fp8_block on sm_90: cuBLASLt has no FP8 GELU epilogue). The one rule
 * for the backends (runtime/cuda/qlinear_cuda.c) and compile --report. */
bool dw_compile_gelu_epilogue(const dw_compiled *c, int linear, int64_t rows);
/* The GEMM registry's choice for args on the program's target (NULL: none eligible). */
const char *dw_compile_target_pick(const dw_compiled *c, const dw_gemm_args *args);
/* Node i as the program runs it: the graph's, or for the fused loss node (fuse.c) head_node. */
static inline const dw_ir_node *dw_compile_node(const dw_compiled *c, int i) {
    return i == c->head_xent ? &c->head_node : &c->g->nodes[i];
}
/* Whether the program gives activation t no buffer: the logits of a fused LM head. */
static inline bool dw_compile_absorbed(const dw_compiled *c, int t) {
    return c->head_linear >= 0 && c->g->nodes[c->head_linear].out[0] == t;
}
/* The fused head's forward scratch (DW_TMP_XENT) for N rows: the loss reduction's (16 + 4 N bytes:
 * the valid-row count, each row's loss) rounded up to 256, then head_chunk rows of V logits. */
static inline int64_t dw_compile_head_logits_off(int64_t N) { return (16 + 4 * N + 255) / 256 * 256; }
/* The fused GELU of linear node i (forward / backward), -1 none. */
int dw_compile_fused_gelu_fwd(const dw_compiled *c, int linear);
int dw_compile_fused_gelu_bwd(const dw_compiled *c, int linear);
/* The linear layer whose fp8_block rows SwiGLU node i can write as it computes them, or -1: a
 * BF16 program compiled for CUDA, i's output (width a multiple of 128) read by that one layer
 * alone, as its x, with its fprop quantised in fp8_block at `rows` tokens (a MoE layer: bound so;
 * a dense one: at those rows). The CUDA backend does it with quant_reuse
 * (runtime/cuda/act_quant_cuda.c); the report names it. */
int dw_compile_swiglu_quant_reader(const dw_compiled *c, int i, int64_t rows);
/* The first (in node order) of the linear layers whose fp8_block rows norm node i (rmsnorm or
 * layernorm) can write as it computes its output, or -1: a BF16 program compiled for CUDA, i's
 * output (width a multiple of 128, at most 8192) read only by dense linear layers, each as its x
 * with its fprop quantised in fp8_block at `rows` tokens; the first quantises x for all of them
 * (dw_engine_opts.quant_reuse), and the norm does it in its place (runtime/cuda/act_quant_cuda.c). */
int dw_compile_norm_quant_reader(const dw_compiled *c, int i, int64_t rows);
/* The same for GELU node i where the linear layer producing its input runs it (fused forward,
 * dw_compile_fused_gelu_fwd) as a pass after its GEMM (the quantised GEMMs have no GELU epilogue on
 * sm_90): i's output, width a multiple of 128, read only by dense fp8_block linear layers (GPT-2's
 * c_proj). The GELU then writes their rows too (runtime/cuda/act_quant_cuda.c). */
int dw_compile_gelu_quant_reader(const dw_compiled *c, int i, int64_t rows);
/* Whether SwiGLU node i's backward can write its two gradients only as the fp8_block operands of
 * the backward of the layers producing its inputs (layers[0] gate, layers[1] up): a BF16 program
 * compiled for CUDA, `rows` and i's width multiples of 128, each input made by a dense linear
 * layer without bias and read by i alone, its gradient written by i into its own buffer, and that
 * layer's dgrad (with a dx to make) and wgrad quantised in fp8_block at `rows` tokens. The codes go
 * into the gradients' own BF16 buffers (dy at the start, dy^T after it: 2 bytes an element), the
 * scales into work.glu_scales (runtime/cuda/act_quant_cuda.c). */
bool dw_compile_swiglu_bwd_quant(const dw_compiled *c, int i, int64_t rows, int layers[2]);
/* Whether SwiGLU node i's backward can also write its two BF16 gradients' fp8_block rows for the
 * dgrad of the MoE experts' layers producing its inputs (layers[0] gate, layers[1] up): a BF16
 * program compiled for CUDA, i's width a multiple of 128, each input made by a moe_linear layer
 * and read by i alone, its gradient written by i into its own buffer, and that layer's dgrad
 * (with a dx to make) quantised in fp8_block. The codes and scales go to work.glu_rows; the BF16
 * gradients stay for the wgrad (runtime/cuda/act_quant_cuda.c). */
bool dw_compile_swiglu_bwd_moe_rows(const dw_compiled *c, int i, int layers[2]);
/* One gradient's pieces in work.glu_rows for R rows of C columns: its E4M3 codes [R, C] and its
 * FP32 scales [R, C/128], each in bytes rounded up to 256 (workspace.c sizes the region with it,
 * the CUDA backend places the pieces with it). */
static inline void dw_compile_glu_rows_piece(int64_t R, int64_t C, int64_t *codes, int64_t *scales) {
    *codes = (R * C + 255) / 256 * 256, *scales = (R * (C / 128) * 4 + 255) / 256 * 256;
}
/* The MoE experts' layer whose dgrad dy MoE combine node i's backward can also write as fp8_block
 * rows beside the BF16 gradient of the expert rows, or -1: a BF16 program compiled for CUDA, the
 * rows (width a multiple of 128) made by that moe_linear layer and read by i alone, their gradient
 * written by i into its own buffer, and the layer's dgrad (with a dx to make) quantised in
 * fp8_block. The codes and scales go to work.glu_rows (its SwiGLU's backward writes there after
 * the layer has read them; runtime/cuda/ops_cuda_moe.c); the dispatch dropless (no capacity). */
int dw_compile_combine_bwd_moe_rows(const dw_compiled *c, int i);
/* The linear node's dims: N rows at capacity, K inputs, M outputs. */
void dw_compile_linear_dims(const dw_compiled *c, int i, int64_t *N, int64_t *K, int64_t *M);

#endif /* DW_COMPILE_PROGRAM_H */
