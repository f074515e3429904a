/* memplan.h — private: the static memory plan. Buffers with known sizes and lifetimes (first and
 * last step of the schedule that touches them) get offsets in one arena so that buffers alive at
 * the same time never overlap. The step loop then allocates nothing. */
#ifndef DW_COMPILE_MEMPLAN_H
#define DW_COMPILE_MEMPLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"

typedef struct {
    int64_t size;   /* bytes (> 0) */
    int first, last;/* inclusive schedule steps during which the buffer is live */
    int64_t align;  /* power of two; 0 means 256 */
    int64_t offset; /* out: byte offset in the arena */
    int first2, last2; /* a second live interval after the first (first2 > last), as an activation
                          recomputed before its backward has; 0, 0: none */
    bool fixed;     /* offset given, not chosen: placed first, the others around it (a gradient
                       slice of the arena's flat gradient block, arena.c) */
} dw_mem_item;

/* Whether the item is live at step t (in either interval). */
static inline bool dw_mem_live_at(const dw_mem_item *it, int t) {
    return (it->first <= t && t <= it->last) || (it->first2 > it->last && it->first2 <= t && t <= it->last2);
}

/* Assigns offsets (greedy: largest first, lowest fitting offset among live-overlapping buffers;
 * fixed items keep theirs and are placed before the rest) and returns the arena size needed.
 * Deterministic for the same input. */
dw_status dw_memplan_assign(dw_ctx *ctx, dw_mem_item *items, int n, int64_t *arena_bytes);

/* Lower bound on any plan: the largest total size of buffers live at one step. */
int64_t dw_memplan_live_peak(const dw_mem_item *items, int n);

#endif /* DW_COMPILE_MEMPLAN_H */
