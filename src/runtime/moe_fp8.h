/* moe_fp8.h — private to runtime/: what the CPU and CUDA backends' MoE linear layer (moe_linear;
 * ops_cpu_moe.c, ops_cuda_moe.c) share (moe_fp8.c): a pass's grouped GEMM arguments in the
 * recipe the compiler bound (bind_grouped.c: fp8_block or mxfp8 where the binding says quantised),
 * the workspace slots of its quantised operands — x and dy quantised per call, the node's cache of
 * W [E,M,K] and W^T [E,K,M] (fp8_block: 128x128 blocks per expert; mxfp8: 1x32 along K and along
 * M) — and each backend's refresh of that cache (DW_STEP_QUANT_W, from the FP32 masters, reached
 * through the backend's weight-cache step). */
#ifndef DW_RUNTIME_MOE_FP8_H
#define DW_RUNTIME_MOE_FP8_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/backend.h"

/* Pass `pass` of call c as dw_grouped_gemm takes it: recipe, rows, experts, m, k, offsets, and the
 * kernel the compiler bound when the program was compiled for `device` (else NULL: the registry
 * picks, as a CPU engine running a CUDA program does). dtype and the operands are the caller's. */
dw_grouped_args dw_moe_linear_args(const dw_op_call *c, int pass, dw_device_kind device);

/* The recipe of node's quantised passes: fp8_block (a policy of fp8_block or fp8_block2d) or mxfp8. */
dw_recipe dw_moe_quant_recipe(const dw_compiled *p, int node);

/* One quantised operand in the workspace: codes at slot l's offset, scales at l->scales (FP32 for
 * fp8_block; UE8M0 bytes for mxfp8, read through dw_moe_mx_scales). */
typedef struct {
    uint8_t *codes;
    float *scales;
} dw_moe_fp8_slot;
dw_moe_fp8_slot dw_moe_fp8_at(const dw_exec *x, const dw_qslot_layout *l);
static inline uint8_t *dw_moe_mx_scales(dw_moe_fp8_slot s) { return (uint8_t *)(void *)s.scales; }

/* The per-call operands: x and dy [R, C] along their rows (fprop, dgrad), and wgrad's dy^T [M, P]
 * and x^T [K, P] with each expert's rows padded to the block (fp8_block 128: grouped_fp8.h;
 * mxfp8 32: grouped_mxfp8.h). */
typedef enum { DW_MOE_FP8_ROWS = 0, DW_MOE_FP8_DYT, DW_MOE_FP8_XT, DW_MOE_FP8_ROLES } dw_moe_fp8_role;

/* Expert parallelism's fp8_block experts (train/ep.c), on the executor as x->moe_ep while it runs
 * the MoE layers on its group's rows: operand slots sized for those rows (the program's are sized
 * for one rank's), and the rank's experts [first, first + count), the only ones whose weight
 * cache a refresh then quantises (the other experts' slices are left as they are: no row of theirs
 * reaches this rank). */
typedef struct dw_moe_fp8_ep {
    int64_t first, count;
    dw_moe_fp8_slot slot[DW_MOE_FP8_ROLES];
    int64_t codes[DW_MOE_FP8_ROLES], scales[DW_MOE_FP8_ROLES]; /* bytes of each slot's codes, scales */
} dw_moe_fp8_ep;
/* Grows ep's slot sizes (codes, scales; zero first) to hold node's quantised operands for R rows;
 * nothing for a node without a quantised pass. */
void dw_moe_fp8_ep_fit(const dw_compiled *p, int node, int64_t R, dw_moe_fp8_ep *ep);
/* Bytes of one block holding every slot, and the slots carved from base (256-aligned pieces). */
int64_t dw_moe_fp8_ep_bytes(const dw_moe_fp8_ep *ep);
void dw_moe_fp8_ep_place(dw_moe_fp8_ep *ep, char *base);

/* Call c's slot for operand `role` of R rows (x, dy: width C; dy^T, x^T: C of them, padded): the
 * expert-parallel one where the executor has it, else the program's. DW_ERR_UNSUPPORTED naming the
 * node when the operand does not fit. */
dw_status dw_moe_fp8_operand(dw_ctx *ctx, const dw_op_call *c, dw_moe_fp8_role role, int64_t R, int64_t C,
                             dw_moe_fp8_slot *out);
/* The node's cached W (t 0: fprop) or W^T (t 1: dgrad) with its scales into a. */
void dw_moe_fp8_cached_weight(const dw_op_call *c, int t, dw_grouped_args *a);

/* What a node's weight-cache refresh reads and writes: the FP32 masters w [E, M, K] and the cache's
 * W (q) and W^T (qt) slots in `recipe`; under expert parallelism (x->moe_ep) the rank's experts
 * only: w, q and qt start at expert `first`, `experts` of them. False when the node has no cache. */
typedef struct {
    dw_recipe recipe;
    const float *w;
    int64_t experts, m, k;
    dw_moe_fp8_slot q, qt;
} dw_moe_fp8_weight_job;
bool dw_moe_fp8_weight_job_of(const dw_exec *x, int node, dw_moe_fp8_weight_job *j);

/* Node's weight cache from the FP32 masters: on the host, and on the CUDA device in the backend's
 * stream order (no host synchronisation). DW_OK with nothing done when the node has no cache. */
dw_status dw_cpu_moe_quant_weight(dw_backend *be, const dw_exec *x, int node);
dw_status dw_cuda_moe_quant_weight(dw_backend *be, const dw_exec *x, int node);

#endif /* DW_RUNTIME_MOE_FP8_H */
