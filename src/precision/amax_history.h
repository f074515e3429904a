/* amax_history.h — private: delayed scaling of the fp8_tensor recipe (docs/precision.md,
 * "Delayed scaling"; the rule: precision/amax_rules.h). Every linear layer whose recipe is
 * fp8_tensor keeps three histories, one per quantised operand: x (fprop x and wgrad x^T), dy
 * (dgrad dy and wgrad dy^T) and w (W and W^T of the weight cache). The state lives in the engine's
 * backend memory (device memory on a GPU: the quantisers read and write it in stream order, no
 * host sync), one block of n_slots x DW_AMAX_WORDS(N) words, attached to the executor
 * (dw_exec.amax) for the quantisers' call sites. The block recipes scale from each block's own
 * amax and have no history. Not the trainer's use of it (train/trainer.c). */
#ifndef DW_PRECISION_AMAX_HISTORY_H
#define DW_PRECISION_AMAX_HISTORY_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/json.h"
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

/* Histories of length n for engine e's fp8_tensor linear layers, zeroed (empty), attached to its
 * executor; the weight caches are refreshed so that the weights' amaxes are noted. *out NULL
 * (nothing attached) when n is 0 or no layer is fp8_tensor. */
dw_status dw_amax_open(dw_ctx *ctx, dw_engine *e, int64_t n, dw_amax **out);
/* Detaches and frees (NULL: nothing). */
void dw_amax_free(dw_amax *a);

/* The state words of node's operand k (backend memory), NULL when not tracked (a NULL a too). */
uint32_t *dw_amax_slot(const dw_amax *a, int node, dw_amax_kind k);

/* Once per optimizer step, after the step's forwards and backwards and before the update: each
 * operand's pending amax (with several ranks, the largest over the ranks of host) goes into its
 * ring (dw_amax_roll). On a GPU one kernel in stream order; the ranks' exchange reads the pending
 * words back (one small copy per step, with several ranks only). */
dw_status dw_amax_step(dw_amax *a, dw_comm *host);

/* state.json's "fp8_amax_history": {"length": N, "operands": {"NODE": {"x"|"dy"|"w": {"amax":
 * [N hex floats, ring order], "pos": p, "pending": hex float}}}} (hex floats: exact). malloc'd;
 * NULL when out of memory or a copy failed (the error on ctx). */
char *dw_amax_state_json(dw_ctx *ctx, dw_amax *a);
/* Restores the state from that object (what: the file, for errors). A length other than a's, a
 * node or operand this engine does not track, or a malformed value: DW_ERR_FORMAT naming it. j
 * NULL (a checkpoint without history): every history empty. */
dw_status dw_amax_state_load(dw_ctx *ctx, dw_amax *a, const json_t *j, const char *what);

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
