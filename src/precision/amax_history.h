/* amax_history.h — private: delayed scaling of the fp8_tensor recipe (docs/precision.md,
 * "Delayed scaling"; the rule: precision/amax_rules.h). Every linear layer whose recipe is
 * fp8_tensor keeps three histories, one per quantised operand: x (fprop x and wgrad x^T), dy
 * (dgrad dy and wgrad dy^T) and w (W and W^T of the weight cache). The state lives in the engine's
 * backend memory (device memory on a GPU: the quantisers read and write it in stream order, no
 * host sync), one block of n_slots x DW_AMAX_WORDS(N) words, attached to the executor
 * (dw_exec.amax) for the quantisers' call sites. The block recipes scale from each block's own
 * amax and have no history. The engine's histories, their roll and checkpoint JSON:
 * train/amax_state.h. */
#ifndef DW_PRECISION_AMAX_HISTORY_H
#define DW_PRECISION_AMAX_HISTORY_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"
#include "formats/formats.h"
#include "precision/amax_rules.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DW_AMAX_X = 0, DW_AMAX_DY, DW_AMAX_W, DW_AMAX_KINDS } dw_amax_kind;

typedef struct dw_amax {
    dw_engine *e;
    int64_t n;       /* N: steps of history */
    int n_slots;     /* DW_AMAX_KINDS per tracked layer */
    int *slot;       /* (nodes) the node's first slot (x; dy + 1, w + 2), -1: not tracked */
    uint32_t *state; /* backend memory: (n_slots, DW_AMAX_WORDS(N)) */
} dw_amax;

/* The state words of node's operand k (backend memory), NULL when not tracked (a NULL a too). */
uint32_t *dw_amax_slot(const dw_amax *a, int node, dw_amax_kind k);

/* The fp8_tensor quantisation of x [rows, cols] (trans: of x^T [cols, rows]) into q (sized for
 * it) under state h (host memory): the scale from dw_amax_pick, codes E4M3(x / s) saturating at
 * +-448; with record, x's amax noted. Exactly dw_quantize_cpu / dw_quantize_transposed_cpu's
 * fp8_tensor result while the history is empty. */
dw_status dw_amax_quantize_cpu(dw_ctx *ctx, uint32_t *h, bool record, const float *x, int64_t rows, int64_t cols,
                               bool trans, dw_qtensor *q);

/* amax_history.cu (CUDA builds): dw_amax_roll on every one of n_slots states of length n (device
 * memory), on `stream` (a cudaStream_t). */
dw_status dw_amax_roll_cuda(dw_ctx *ctx, uint32_t *state, int n_slots, int64_t n, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DW_PRECISION_AMAX_HISTORY_H */
