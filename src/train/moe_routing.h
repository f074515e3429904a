/* moe_routing.h — private: the trainer's view of the MoE layers' routing counters
 * (dw_engine_moe_counts): what each optimizer step routed, summed over the data-parallel ranks —
 * assignments and those dropped past capacity, and each layer's load per expert. */
#ifndef DW_TRAIN_MOE_ROUTING_H
#define DW_TRAIN_MOE_ROUTING_H

#include <stdint.h>

#include "comm/comm.h"
#include "deepwell.h"

typedef struct {
    int64_t layers, experts; /* 0 layers: no MoE layer (every call a no-op) */
    int64_t *seen;           /* (layers x (2 + experts)) the counters at the last step's end */
    double *step;            /* the same shape: this step's share, summed over the ranks */
} dw_moe_routing;

/* Learns the engine's MoE layers; the counters start at the engine's (zero for a new engine). */
dw_status dw_moe_routing_init(dw_ctx *ctx, dw_engine *e, dw_moe_routing *m);
void dw_moe_routing_free(dw_moe_routing *m);

/* After an optimizer step: m->step = the counters' growth since the last call, summed over the
 * ranks of host (NULL: one rank); *assigned and *dropped its totals over the layers. */
dw_status dw_moe_routing_step(dw_ctx *ctx, dw_engine *e, dw_comm *host, dw_moe_routing *m, double *assigned,
                              double *dropped);

/* Layer l's load of expert x in this step (m->step). */
static inline double dw_moe_routing_load(const dw_moe_routing *m, int64_t l, int64_t x) {
    return m->step[l * (2 + m->experts) + 2 + x];
}

#endif /* DW_TRAIN_MOE_ROUTING_H */
