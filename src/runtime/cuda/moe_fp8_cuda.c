/* moe_fp8_cuda.c — the CUDA backend's refresh of a MoE expert layer's fp8_block weight cache
 * (moe_fp8.h): W [E,M,K] and W^T [E,K,M] in 128x128 blocks per expert from the FP32 masters, on
 * the backend's stream (no host synchronisation). Reached from the backend's weight-cache step
 * (qlinear_cuda.c), apart from the layer's entries (ops_cuda_moe.c) that read the cache. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include "gemm/grouped_fp8.h"
#include "runtime/exec.h"
#include "runtime/moe_fp8.h"

dw_status dw_cuda_moe_quant_weight(dw_backend *be, const dw_exec *x, int node) {
    const dw_prog_node *pn = &x->p->node[node];
    if (pn->wq[0].off < 0) return DW_OK;
    const int wt = x->g->nodes[node].in[1];
    const int64_t *sh = x->g->tensors[wt].shape; /* [E, M, K] */
    const dw_moe_fp8_slot q = dw_moe_fp8_at(x, &pn->wq[0]), qt = dw_moe_fp8_at(x, &pn->wq[1]);
    return dw_grouped_fp8_quantize_weights_cuda(be->ctx, x->w + x->p->param_off[x->p->tensor[wt].param], false, sh[0],
                                                sh[1], sh[2], q.codes, q.scales, qt.codes, qt.scales);
}
#endif /* DW_HAVE_CUDA */
