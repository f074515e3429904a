/* amax_state.h — private: delayed scaling's histories for an engine (precision/amax_history.h
 * has the rule, the slots and the quantisers): opened on the engine's fp8_tensor linear layers and
 * attached to its executor, rolled once per optimizer step (the ranks' pending amaxes made alike
 * first), and carried in state.json. */
#ifndef DW_TRAIN_AMAX_STATE_H
#define DW_TRAIN_AMAX_STATE_H

#include "comm/comm.h"
#include "core/json.h"
#include "deepwell.h"
#include "precision/amax_history.h"

/* Histories of length n for engine e's fp8_tensor linear layers, zeroed (empty), attached to its
 * executor; the weight caches are refreshed so that the weights' amaxes are noted. *out NULL
 * (nothing attached) when n is 0 or no layer is fp8_tensor. */
dw_status dw_amax_open(dw_ctx *ctx, dw_engine *e, int64_t n, dw_amax **out);
/* Detaches and frees (NULL: nothing). */
void dw_amax_free(dw_amax *a);

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

#endif /* DW_TRAIN_AMAX_STATE_H */
