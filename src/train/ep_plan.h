/* ep_plan.h — private: the index bookkeeping of expert parallelism (train/ep.c), on host integers
 * and without communication: which rank owns which expert, what a rank sends each peer after its
 * dispatch, and where the rows it receives go. The world's W ranks form groups of G consecutive
 * ranks; in a group the rank of local index j = rank mod G owns experts [j E/G, (j+1) E/G).
 * Rows move in three layouts:
 *   dispatch order: a rank's own rows grouped by expert (offsets (E+1), moe_dispatch's output), so
 *                   the rows bound for peer j are the one block [offsets[j E/G], offsets[(j+1) E/G]);
 *   source order:   what the all-to-all delivers to an owner, the block of each source rank of its
 *                   group in rank order, each block grouped by the owner's experts;
 *   expert order:   the same rows grouped by expert (each group: source 0's rows, then source 1's,
 *                   ...), which the grouped GEMM reads. perm maps expert order to source order. */
#ifndef DW_TRAIN_EP_PLAN_H
#define DW_TRAIN_EP_PLAN_H

#include <stdint.h>

typedef struct {
    int rank, world; /* this rank of the world */
    int group;       /* G: ranks per expert-parallel group, dividing world */
    int64_t experts; /* E: a multiple of group */
} dw_ep_layout;

/* E/G, the first rank of this rank's group, this rank's first expert. */
static inline int64_t dw_ep_local(const dw_ep_layout *l) { return l->experts / l->group; }
static inline int dw_ep_group_start(const dw_ep_layout *l) { return l->rank - l->rank % l->group; }
static inline int64_t dw_ep_first_expert(const dw_ep_layout *l) { return (int64_t)(l->rank % l->group) * dw_ep_local(l); }
/* The world rank in this rank's group that owns expert e (0 <= e < E). */
static inline int dw_ep_owner(const dw_ep_layout *l, int64_t e) {
    return dw_ep_group_start(l) + (int)(e / dw_ep_local(l));
}

/* After this rank's dispatch (offsets (E+1), group starts in dispatch order): send_rows (W) the
 * rows for each world rank (0 outside the group), counts (E) each expert's rows and count_send (W)
 * how many of those counts go to each rank (E/G to each member of the group, in expert order,
 * which is the counts' order: the counts all-to-all sends counts itself). */
void dw_ep_send_plan(const dw_ep_layout *l, const int32_t *offsets, int64_t *send_rows, int64_t *counts,
                     int64_t *count_send);

/* From the counts received (G x E/G: source s of the group's counts of this rank's experts, in
 * rank order): recv_rows (W) the rows from each world rank (0 outside the group), offsets (E+1)
 * the expert-order groups of the received rows over all E experts (the others empty), perm
 * (total) for each expert-order row its source-order row, back (total) the inverse. Returns the
 * total rows received. */
int64_t dw_ep_recv_plan(const dw_ep_layout *l, const int64_t *recv_counts, int64_t *recv_rows, int32_t *offsets,
                        int32_t *perm, int32_t *back);

#endif /* DW_TRAIN_EP_PLAN_H */
