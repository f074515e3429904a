/* moe_fp8.h — private to runtime/: what the CPU and CUDA backends' MoE linear layer (moe_linear;
 * ops_cpu_moe.c, ops_cuda_moe.c) share (moe_fp8.c): a pass's grouped GEMM arguments in the
 * recipe the compiler bound (bind_grouped.c: fp8_block where the binding says quantised), the
 * workspace slots of its fp8_block operands — x and dy quantised per call, the node's cache of W
 * [E,M,K] and W^T [E,K,M] in 128x128 blocks per expert — and each backend's refresh of that cache
 * (DW_STEP_QUANT_W, from the FP32 masters, reached through the backend's weight-cache step). */
#ifndef DW_RUNTIME_MOE_FP8_H
#define DW_RUNTIME_MOE_FP8_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/backend.h"

/* Pass `pass` of call c as dw_grouped_gemm takes it: recipe, rows, experts, m, k, offsets, and the
 * kernel the compiler bound when the program was compiled for `device` (else NULL: the registry
 * picks, as a CPU engine running a CUDA program does). dtype and the operands are the caller's. */
dw_grouped_args dw_moe_linear_args(const dw_op_call *c, int pass, dw_device_kind device);

/* One quantised operand in the workspace: codes at slot l's offset, FP32 scales at l->scales. */
typedef struct {
    uint8_t *codes;
    float *scales;
} dw_moe_fp8_slot;
dw_moe_fp8_slot dw_moe_fp8_at(const dw_exec *x, const dw_qslot_layout *l);
/* DW_OK when R rows fit the operand slots planned for c's capacity; else DW_ERR_UNSUPPORTED naming
 * the node (expert parallelism's larger groups). */
dw_status dw_moe_fp8_check_rows(dw_ctx *ctx, const dw_op_call *c, int64_t R);
/* The node's cached W (t 0: fprop) or W^T (t 1: dgrad) with its scales into a. */
void dw_moe_fp8_cached_weight(const dw_op_call *c, int t, dw_grouped_args *a);

/* What a node's weight-cache refresh reads and writes: the FP32 masters w [E, M, K] and the cache's
 * W (q) and W^T (qt) slots. False when the node has no cache. */
typedef struct {
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
