/* ep_plan.c — expert parallelism's index bookkeeping (ep_plan.h): send counts from a dispatch's
 * offsets, and the received rows' expert-order offsets and permutation. Host integers only. */
#include <string.h>

#include "core/error.h"
#include "train/ep_plan.h"

void dw_ep_send_plan(const dw_ep_layout *l, const int32_t *offsets, int64_t *send_rows, int64_t *counts,
                     int64_t *count_send) {
    const int64_t El = dw_ep_local(l);
    const int g0 = dw_ep_group_start(l);
    DW_ASSERT(l->group >= 1 && l->world % l->group == 0 && l->experts % l->group == 0);
    memset(send_rows, 0, (size_t)l->world * sizeof *send_rows);
    memset(count_send, 0, (size_t)l->world * sizeof *count_send);
    for (int64_t e = 0; e < l->experts; e++) counts[e] = offsets[e + 1] - offsets[e];
    for (int j = 0; j < l->group; j++) {
        send_rows[g0 + j] = offsets[(j + 1) * El] - offsets[j * El];
        count_send[g0 + j] = El;
    }
}

int64_t dw_ep_recv_plan(const dw_ep_layout *l, const int64_t *recv_counts, int64_t *recv_rows, int32_t *offsets,
                        int32_t *perm, int32_t *back) {
    const int64_t El = dw_ep_local(l), lo = dw_ep_first_expert(l), G = l->group;
    const int g0 = dw_ep_group_start(l);
    memset(recv_rows, 0, (size_t)l->world * sizeof *recv_rows);
    for (int64_t s = 0; s < G; s++)
        for (int64_t k = 0; k < El; k++) recv_rows[g0 + s] += recv_counts[s * El + k];
    /* expert-order offsets over all E experts: the ones before this rank's start at 0, after: total */
    int64_t at = 0;
    for (int64_t e = 0; e <= l->experts; e++) {
        if (e > lo && e <= lo + El)
            for (int64_t s = 0; s < G; s++) at += recv_counts[s * El + (e - 1 - lo)];
        offsets[e] = (int32_t)at;
    }
    /* walk the source order: source s's block, in it expert k's rows, each to its expert-order slot */
    int64_t src = 0;
    for (int64_t s = 0; s < G; s++)
        for (int64_t k = 0; k < El; k++) {
            int64_t dst = offsets[lo + k]; /* expert-order start of (k, s): the sources before s first */
            for (int64_t q = 0; q < s; q++) dst += recv_counts[q * El + k];
            for (int64_t i = 0; i < recv_counts[s * El + k]; i++, src++, dst++) {
                perm[dst] = (int32_t)src;
                back[src] = (int32_t)dst;
            }
        }
    return at;
}
