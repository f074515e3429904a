/* moe_fp8_cuda.c — the CUDA backend's refresh of a MoE expert layer's quantised weight cache
 * (moe_fp8.h): W [E,M,K] and W^T [E,K,M] (fp8_block: 128x128 blocks per expert; mxfp8: 1x32 along
 * K and along M) from the FP32 masters, on
 * the backend's stream (no host synchronisation). Reached from the backend's weight-cache step
 * (qlinear_cuda.c), apart from the layer's entries (ops_cuda_moe.c) that read the cache. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include "gemm/grouped_fp8.h"
#include "gemm/grouped_mxfp8.h"
#include "runtime/moe_fp8.h"

dw_status dw_cuda_moe_quant_weight(dw_backend *be, const dw_exec *x, int node) {
    dw_moe_fp8_weight_job j;
    if (!dw_moe_fp8_weight_job_of(x, node, &j)) return DW_OK;
    if (j.recipe == DW_RECIPE_MXFP8)
        return dw_grouped_mxfp8_quantize_weights_cuda(be->ctx, j.w, j.experts, j.m, j.k, j.q.codes,
                                                      dw_moe_mx_scales(j.q), j.qt.codes, dw_moe_mx_scales(j.qt));
    return dw_grouped_fp8_quantize_weights_cuda(be->ctx, j.w, false, j.experts, j.m, j.k, j.q.codes, j.q.scales,
                                                j.qt.codes, j.qt.scales);
}
#endif /* DW_HAVE_CUDA */
