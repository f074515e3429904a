/* compile.h — private: dw_compile's result. The schedule (every node forward, then every node
 * backward in reverse), the kernel and precision bound to each node (with the policy's reason),
 * the parameter pools' layout and the activation arena planned by dw_memplan_assign over the
 * schedule's lifetimes. Pure planning: no device memory, works on a CPU-only machine. The CUDA
 * engine (runtime/engine_cuda*.c) executes a dw_compiled; `deepwell compile --report` prints one. */
#ifndef DW_COMPILE_COMPILE_H
#define DW_COMPILE_COMPILE_H

#include <stdbool.h>
#include <stdint.h>

#include "compile/memplan.h"
#include "formats/formats.h"
#include "ir/ir.h"
#include "precision/policy.h"

/* Per-node parts of the activation arena (byte offsets; -1: the node has none).
 * Saved for backward (aux): STAT0 = layernorm mean / rmsnorm rstd / attention lse (FP32),
 * STAT1 = layernorm rstd, Q/K/V = a packed qkv unpacked to (B,T,H,D), (B,T,Hkv,D) (act dtype).
 * Temporaries of the backward step (btmp): ACC0..2 = an input gradient to be added into an
 * already written one (act dtype, the input's size), DELTA = attention's (B,H,T) FP32 scratch,
 * GQ/GK/GV = packed attention's unpacked gradients. Temporary of the forward step (ftmp):
 * XENT = cross-entropy workspace. */
enum { DW_AUX_STAT0 = 0, DW_AUX_STAT1, DW_AUX_Q, DW_AUX_K, DW_AUX_V, DW_AUX_COUNT };
enum { DW_TMP_ACC0 = 0, DW_TMP_ACC1, DW_TMP_ACC2, DW_TMP_DELTA, DW_TMP_GQ, DW_TMP_GK, DW_TMP_GV,
       DW_TMP_XENT, DW_TMP_COUNT };

/* How a node's backward delivers the gradient of input slot s: not at all (a token input or a
 * parameter, whose gradient the kernel accumulates itself), written (first writer in the
 * backward order), or written to ACC<s> and added in (a tensor read by several nodes). */
typedef enum { DW_GRAD_NONE = 0, DW_GRAD_WRITE, DW_GRAD_ACCUM } dw_grad_mode;

typedef enum { DW_POOL_WEIGHTS = 0, DW_POOL_GRADS, DW_POOL_OPTIM, DW_POOL_ACT, DW_POOL_WORK,
               DW_POOL_COUNT } dw_pool_id;
const char *dw_pool_name(dw_pool_id p); /* "weights", ... */

/* Arena buffer kinds (for reports and tests). */
typedef enum { DW_BUF_VALUE = 0, DW_BUF_GRAD, DW_BUF_AUX, DW_BUF_FTMP, DW_BUF_BTMP } dw_buf_kind;
typedef struct {
    dw_buf_kind kind;
    int index; /* tensor (value, grad) or node (aux, ftmp, btmp) */
} dw_buf_info;

typedef struct {
    dw_recipe recipe;          /* linear: from the policy; other ops: BF16 (or FP32 mode) */
    dw_policy_reason reason;
    int rule;                  /* policy rule index for DW_POLICY_BY_RULE, else -1 */
    const char *kernel;        /* static: the kernel(s) the engine runs for this node */
    const char *kernel_why;    /* static: why that kernel */
    bool supported;            /* the CUDA engine can run it (else the engine refuses) */
    char *note;                /* owned, or NULL: quantised linear nodes: which of the three GEMMs
                                  run quantised on sm_90 at the planned shape, which fall back to
                                  BF16 and why */
} dw_node_binding;

/* Quantised linear layers (runtime/engine_cuda_quant.c): the three GEMMs of y = x W^T. */
typedef enum { DW_QPASS_FPROP = 0, DW_QPASS_DGRAD, DW_QPASS_WGRAD, DW_QPASS_COUNT } dw_qpass;
/* Whether the CUDA engine runs a linear layer's recipe quantised (every recipe but bf16). */
bool dw_compile_quant_recipe(dw_recipe r);
/* A quantised layer's recipes under the node's recipe r. fp8_block is DESIGN.md's block recipe
 * (DeepSeek-V3's): 1x128 blocks (FORMATS.md's tensor recipe fp8_block) for the activations and
 * gradients x, x^T, dy, dy^T, and 128x128 blocks (tensor recipe fp8_block2d) for the weight W, W^T;
 * fp8_block2d as a node recipe names the same pairing. cuBLASLt pairs a 128x128 operand only with a
 * 1x128 one, so fprop and dgrad run 1x128 x 128x128 and wgrad 1x128 x 1x128. Every other recipe
 * quantises all four operands in r itself. */
dw_recipe dw_compile_quant_act_recipe(dw_recipe r);
dw_recipe dw_compile_quant_weight_recipe(dw_recipe r);
/* Whether the sm_90 GEMM for recipe r accepts GEMM (m, n, k) of `pass` (output BF16 for fprop
 * and dgrad, FP32 for wgrad; operands K-major): mirrors the registry's predicates (cuBLASLt FP8:
 * k % 16, block scaling k % 128 and m % 16, 16-byte output rows; MX/NVFP4 through BF16
 * dequantisation: any shape). false with *why when that GEMM must fall back to BF16. */
bool dw_compile_quant_gemm_ok(dw_recipe r, dw_qpass pass, int64_t m, int64_t n, int64_t k, const char **why);
/* The GEMM shape (m, n, k) of `pass` for a linear layer of N tokens, K inputs, M outputs. */
void dw_compile_quant_shape(dw_qpass pass, int64_t N, int64_t K, int64_t M, int64_t *m, int64_t *n, int64_t *k);
/* dw_compile_quant_gemm_ok at that layer's GEMM shape for `pass` (the reason dropped). */
bool dw_compile_quant_pass_ok(dw_recipe r, dw_qpass pass, int64_t N, int64_t K, int64_t M);

/* One quantised operand's room in the workspace pool: codes at `off`, scales at off + scales, the
 * NVFP4 tensor scale (one float) at off + tscale; `bytes` in all. off -1: no such slot. */
typedef struct {
    int64_t off, scales, tscale, bytes;
} dw_qslot_layout;

/* Workspace pool layout (byte offsets). */
typedef struct {
    int64_t tokens, targets;   /* (cap N) int32 each */
    int64_t loss;              /* FP32 scalar */
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
    int64_t bytes;
} dw_work_layout;
#define DW_COMPILE_NORM_BLOCKS 1024
#define DW_COMPILE_ADAMW_ARGS_BYTES 64 /* sizeof(dw_cuda_adamw_args): 8 doubles */
/* Bytes of cuBLASLt workspace the GEMM layer allocates on first use (gemm_cublaslt.c). */
#define DW_COMPILE_LT_WORKSPACE ((int64_t)64 << 20)

struct dw_compiled {
    const dw_graph *g;         /* borrowed: must outlive the dw_compiled */
    bool bf16;                 /* BF16 activations + BF16 GEMMs; false: FP32 reference mode */
    int act_size;              /* bytes per activation element (4 or 2) */
    char precision[32];        /* "fp32" or the policy's default recipe, for reports */
    int n_steps;               /* 2 * n_nodes: step s < n is node s forward, else node 2n-1-s backward */
    dw_node_binding *bind;     /* (n_nodes) */
    char *unsupported;         /* why the CUDA engine cannot run this (NULL: it can) */

    /* parameters: FP32 master, grads, m, v at the same float offsets; decay params first */
    int n_params;
    int *param_tensor;         /* (n_params) graph tensor of each parameter, in graph order */
    int64_t *param_off;        /* (n_params) offset in floats, 64-float (256-byte) aligned */
    int64_t param_floats;      /* floats of one parameter-shaped pool, padding included */
    int64_t decay_floats;      /* [0, decay_floats) holds the decay parameters */

    /* activation arena */
    int n_items;
    dw_mem_item *items;        /* (n_items) sizes, lifetimes, offsets */
    dw_buf_info *info;         /* (n_items) what each item is */
    int64_t *val_off, *grad_off;   /* (n_tensors) byte offsets, -1 none */
    /* (n_tensors) the tensor whose gradient buffer t's gradient shares (t itself when it has its
     * own): an add's backward passes dy through unchanged, so an input whose gradient the add
     * writes first takes the output's gradient buffer instead of a copy (see compile.c,
     * plan_grad_alias, for when both inputs may) */
    int *grad_alias;
    int64_t (*aux_off)[DW_AUX_COUNT]; /* (n_nodes) */
    int64_t (*tmp_off)[DW_TMP_COUNT]; /* (n_nodes) */
    uint8_t (*grad_mode)[DW_IR_MAX_INPUTS]; /* (n_nodes) dw_grad_mode per input slot */
    /* fusion (compile/fuse.c): per GELU node, DW_FUSED_* and its linear neighbours */
    uint8_t *fused;            /* (n_nodes) DW_FUSED_FWD / DW_FUSED_BWD bits, 0 for unfused nodes */
    int *gelu_producer;        /* (n_nodes) for a GELU: the linear producing its input, else -1 */
    int *gelu_consumer;        /* (n_nodes) for a GELU: the one linear reading its output, else -1 */
    int64_t arena_bytes, live_peak;

    dw_work_layout work;
    /* (n_nodes) a quantised linear node's weight quantised once per weight update (the engine's
     * refresh after the optimizer step and uploads), in the workspace pool: [0] W [M,K] along K
     * (fprop), [1] W^T [K,M] along M (dgrad), both from one quantiser pass over the FP32 master
     * weight; off -1 for every other node */
    dw_qslot_layout (*wq)[2];
    int64_t pool_bytes[DW_POOL_COUNT];
};

/* GEMM epilogue fusion (BF16 path, compile/fuse.c; DW_FUSE=0 turns it off):
 *   DW_FUSED_FWD  GELU G whose input is the output of a BF16 linear L (width % 8 == 0): L's fprop
 *                 writes G's output with the GELU_AUX epilogue (the pre-activation still goes to
 *                 L's output, G's input); G's forward does nothing.
 *   DW_FUSED_BWD  GELU G whose output only one BF16 linear P reads (as x) and whose input
 *                 gradient G alone writes: P's dgrad applies GELU' (DGELU epilogue, aux = G's
 *                 input) and writes G's input gradient; G's backward does nothing and G's output
 *                 has no gradient buffer. */
enum { DW_FUSED_FWD = 1, DW_FUSED_BWD = 2 };
dw_status dw_compile_fuse(dw_ctx *ctx, dw_compiled *c);
/* The GELU whose forward linear node i computes (-1 none), and the GELU whose backward linear
 * node i's dgrad computes (-1 none). */
int dw_compile_fused_gelu_fwd(const dw_compiled *c, int linear);
int dw_compile_fused_gelu_bwd(const dw_compiled *c, int linear);

/* Whether linear node i's dgrad adds dx into its input's gradient inside the GEMM (beta = 1,
 * C = D = the gradient, BF16) instead of writing an ACC temporary that a separate kernel adds:
 * BF16 mode, the input's gradient is accumulated (a later reader wrote it first: llama's k/v
 * after q, up after gate), and no GELU is fused into the dgrad. Quantised or BF16 alike (every
 * GEMM backend takes beta with a BF16 C), so the answer holds at every batch shape. The arena
 * then has no ACC0 temporary for the node. */
bool dw_compile_dgrad_accumulates(const dw_compiled *c, int i);

/* Step numbers of node i. */
static inline int dw_compile_fwd_step(const dw_compiled *c, int node) { (void)c; return node; }
static inline int dw_compile_bwd_step(const dw_compiled *c, int node) { return c->n_steps - 1 - node; }

#endif /* DW_COMPILE_COMPILE_H */
