/* ep.h — private: expert parallelism for the trainer (train/ep.c). The world's ranks form groups of
 * K consecutive ranks; in a group each rank runs E/K of every MoE layer's experts
 * (ep_plan.h: which). After its dispatch a rank sends every routed row to the rank of its group
 * that owns the row's expert (the per-expert counts exchanged first), the owner runs its experts
 * as grouped GEMMs over all the rows it received, and sends the results back for the combine;
 * backward sends the gradients the same ways in reverse. Attached to the engine's executor as its
 * ep_step hook (runtime/exec.h); the rest of the model runs as before, data-parallel (train/dp.c).
 * Each rank's expert gradients come out of backward nonzero only for the experts it owns; the
 * data-parallel average over all ranks then gives every rank every expert's whole gradient. Not
 * the index bookkeeping (ep_plan.c) nor the communicator (comm/). */
#ifndef DW_TRAIN_EP_H
#define DW_TRAIN_EP_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "deepwell.h"

typedef struct dw_ep dw_ep;

/* Expert parallelism over groups of k ranks of comm (the engine's memory; its host communicator
 * carries the counts). k == 1: *out NULL, nothing attached. DW_ERR_INVALID naming --ep when k < 1,
 * k does not divide the ranks, the model has no MoE layer or its experts are not a multiple of k;
 * DW_ERR_UNSUPPORTED naming the node when an expert op needs a workspace sized for one rank's
 * rows. Recording (CUDA graphs) is turned off: the exchanges wait for the counts on the host. */
dw_status dw_ep_create(dw_engine *e, dw_comm *comm, int k, dw_ep **out);
/* The expert parameters (the weights of the expert ops, whose first dimension is the experts): n
 * of them, each [off, off + numel) in floats of the parameter pools, expert e's part the e-th of E
 * equal slices; the rank of local index j = rank mod K owns slices [j E/K, (j+1) E/K). *out owned
 * by ep. NULL ep: 0. */
typedef struct {
    int64_t off, numel;
} dw_ep_param;
int dw_ep_params(const dw_ep *ep, const dw_ep_param **out);
/* K, the ranks of a group (NULL: 1). */
int dw_ep_group_size(const dw_ep *ep);
/* Bytes of the buffers for the group's rows as allocated (ep_buffers.h's dw_ep_bytes total; NULL: 0). */
int64_t dw_ep_buffers_allocated(const dw_ep *ep);
/* Detaches from the executor and frees; NULL is harmless. */
void dw_ep_free(dw_ep *ep);
/* While suspended the MoE layers run all their experts locally (no exchange): for what one rank
 * does alone (samples, the profile), which the others would not join. Every rank holds every
 * expert's weights (the gradients are averaged whole), so the result is the same. NULL: nothing. */
void dw_ep_suspend(dw_ep *ep, bool suspended);

#endif /* DW_TRAIN_EP_H */
