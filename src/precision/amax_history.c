/* amax_history.c — delayed scaling's per-operand state (amax_history.h): where a node's operand
 * keeps its history, and the CPU quantiser under a history (the GPU's in kernels/cuda/quant_kernels.cuh,
 * the roll kernel in amax_history.cu). The engine's use of it — the slots of its fp8_tensor
 * layers, the per-step roll, the ranks' exchange, the checkpoint JSON — is train/amax_state.c. */
#include "core/error.h"
#include "precision/amax_history.h"

uint32_t *dw_amax_slot(const dw_amax *a, int node, dw_amax_kind k) {
    if (!a || a->slot[node] < 0) return NULL;
    return a->state + (size_t)(a->slot[node] + (int)k) * DW_AMAX_WORDS(a->n);
}

dw_status dw_amax_quantize_cpu(dw_ctx *ctx, uint32_t *h, bool record, const float *x, int64_t rows, int64_t cols,
                               bool trans, dw_qtensor *q) {
    if (!h || !x || !q || !q->codes || !q->scales || rows <= 0 || cols <= 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize fp8_tensor (amax history): bad arguments");
    uint32_t cur = 0;
    for (int64_t i = 0; i < rows * cols; i++) {
        const uint32_t v = dw_rule_f2u(x[i]) & 0x7FFFFFFFu;
        cur = v > cur ? v : cur;
    }
    const uint32_t pick = dw_amax_pick(h, cur);
    const float s = dw_rule_fp8_scale(pick, false);
    const bool bad = dw_rule_nonfinite(pick);
    q->recipe = DW_RECIPE_FP8_TENSOR;
    q->rows = trans ? cols : rows;
    q->cols = trans ? rows : cols;
    q->tensor_scale = 1.0f;
    ((float *)q->scales)[0] = s;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            q->codes[trans ? c * rows + r : r * cols + c] = bad ? 0x7Fu : dw_encode_e4m3(x[r * cols + c] / s);
    if (record) dw_amax_note(h, cur);
    return DW_OK;
}
