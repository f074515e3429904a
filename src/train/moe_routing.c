/* moe_routing.c — the MoE routing counters per optimizer step (moe_routing.h): the engine keeps
 * running totals over its training forwards; a step's share is their growth, summed over the ranks
 * (as doubles: exact below 2^53 assignments). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/moe_routing.h"

dw_status dw_moe_routing_init(dw_ctx *ctx, dw_engine *e, dw_moe_routing *m) {
    memset(m, 0, sizeof *m);
    DW_TRY(dw_engine_moe_counts(e, &m->layers, &m->experts, NULL));
    if (!m->layers) return DW_OK;
    const size_t n = (size_t)(m->layers * (2 + m->experts));
    m->seen = calloc(n, sizeof *m->seen);
    m->step = calloc(n, sizeof *m->step);
    if (!m->seen || !m->step) {
        dw_moe_routing_free(m);
        return dw_set_error(ctx, DW_ERR_NOMEM, "train: out of memory");
    }
    return dw_engine_moe_counts(e, NULL, NULL, m->seen);
}

void dw_moe_routing_free(dw_moe_routing *m) {
    free(m->seen);
    free(m->step);
    memset(m, 0, sizeof *m);
}

dw_status dw_moe_routing_step(dw_ctx *ctx, dw_engine *e, dw_comm *host, dw_moe_routing *m, double *assigned,
                              double *dropped) {
    *assigned = *dropped = 0;
    if (!m->layers) return DW_OK;
    const int64_t n = m->layers * (2 + m->experts);
    int64_t *now = malloc((size_t)n * sizeof *now);
    if (!now) return dw_set_error(ctx, DW_ERR_NOMEM, "train: out of memory");
    dw_status st = dw_engine_moe_counts(e, NULL, NULL, now);
    for (int64_t i = 0; st == DW_OK && i < n; i++) m->step[i] = (double)(now[i] - m->seen[i]), m->seen[i] = now[i];
    free(now);
    DW_TRY(st);
    if (host) DW_TRY(dw_comm_all_reduce(ctx, host, m->step, n, DW_COMM_F64, DW_COMM_SUM));
    for (int64_t l = 0; l < m->layers; l++)
        *assigned += m->step[l * (2 + m->experts)], *dropped += m->step[l * (2 + m->experts) + 1];
    return DW_OK;
}
