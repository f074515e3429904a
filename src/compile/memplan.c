/* memplan.c — static memory plan: lifetimes → offsets (see memplan.h).
 * Greedy by decreasing size; each buffer takes the lowest aligned offset that does not collide
 * with an already placed buffer whose lifetime overlaps. O(n^2 log n), fine for graph sizes. */
#include <stdlib.h>

#include "compile/memplan.h"
#include "core/error.h"

typedef struct {
    int64_t lo, hi; /* [lo, hi) occupied */
} interval;

static const dw_mem_item *sort_base;

static int by_size_desc(const void *a, const void *b) {
    const dw_mem_item *x = &sort_base[*(const int *)a], *y = &sort_base[*(const int *)b];
    if (x->fixed != y->fixed) return x->fixed ? -1 : 1; /* given offsets first */
    if (x->size != y->size) return x->size < y->size ? 1 : -1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return *(const int *)a - *(const int *)b; /* stable: deterministic order */
}

static int by_lo(const void *a, const void *b) {
    const interval *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

static int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) & ~(a - 1); }

static bool has_second(const dw_mem_item *x) { return x->first2 > x->last; }

static bool meet(int a0, int a1, int b0, int b1) { return !(a1 < b0 || b1 < a0); }

/* Whether two buffers are ever live at the same step (each has one or two intervals). */
static bool lifetimes_overlap(const dw_mem_item *x, const dw_mem_item *y) {
    if (meet(x->first, x->last, y->first, y->last)) return true;
    if (has_second(y) && meet(x->first, x->last, y->first2, y->last2)) return true;
    if (!has_second(x)) return false;
    return meet(x->first2, x->last2, y->first, y->last) ||
           (has_second(y) && meet(x->first2, x->last2, y->first2, y->last2));
}

dw_status dw_memplan_assign(dw_ctx *ctx, dw_mem_item *items, int n, int64_t *arena_bytes) {
    *arena_bytes = 0;
    if (n < 0) return dw_set_error(ctx, DW_ERR_INVALID, "memory plan: negative buffer count %d", n);
    for (int i = 0; i < n; i++) {
        int64_t a = items[i].align ? items[i].align : 256;
        if (items[i].size <= 0 || items[i].first > items[i].last || (a & (a - 1)) != 0 ||
            (has_second(&items[i]) && items[i].first2 > items[i].last2) ||
            (items[i].fixed && (items[i].offset < 0 || items[i].offset % a)))
            return dw_set_error(ctx, DW_ERR_INVALID,
                                "memory plan: buffer %d has size %lld, lifetime [%d, %d] (then [%d, %d]), align %lld%s",
                                i, (long long)items[i].size, items[i].first, items[i].last, items[i].first2,
                                items[i].last2, (long long)a, items[i].fixed ? ", a fixed offset off its alignment" : "");
    }
    size_t cap = n > 0 ? (size_t)n : 1;
    int *order = malloc(sizeof(int) * cap);
    int *placed = malloc(sizeof(int) * cap);
    interval *busy = malloc(sizeof(interval) * cap);
    if (!order || !placed || !busy) {
        free(order);
        free(placed);
        free(busy);
        return dw_set_error(ctx, DW_ERR_NOMEM, "memory plan: out of memory");
    }
    for (int i = 0; i < n; i++) order[i] = i;
    sort_base = items;
    qsort(order, (size_t)n, sizeof *order, by_size_desc);
    int n_placed = 0;
    int64_t top = 0;
    for (int oi = 0; oi < n; oi++) {
        dw_mem_item *it = &items[order[oi]];
        int64_t a = it->align ? it->align : 256;
        if (it->fixed) { /* given (the caller keeps fixed items apart from each other) */
            if (it->offset + it->size > top) top = it->offset + it->size;
            placed[n_placed++] = order[oi];
            continue;
        }
        int nb = 0;
        for (int p = 0; p < n_placed; p++) {
            const dw_mem_item *q = &items[placed[p]];
            if (!lifetimes_overlap(q, it)) continue;
            busy[nb++] = (interval){q->offset, q->offset + q->size};
        }
        qsort(busy, (size_t)nb, sizeof *busy, by_lo);
        int64_t off = 0;
        for (int b = 0; b < nb; b++) {
            if (align_up(off, a) + it->size <= busy[b].lo) break; /* fits in the gap below */
            if (busy[b].hi > off) off = busy[b].hi;
        }
        it->offset = align_up(off, a);
        if (it->offset + it->size > top) top = it->offset + it->size;
        placed[n_placed++] = order[oi];
    }
    free(order);
    free(placed);
    free(busy);
    *arena_bytes = top;
    return DW_OK;
}

int64_t dw_memplan_live_peak(const dw_mem_item *items, int n) {
    int64_t peak = 0;
    for (int i = 0; i < 2 * n; i++) { /* the peak is reached at the start of some interval */
        const dw_mem_item *it = &items[i / 2];
        if (i % 2 && !has_second(it)) continue;
        const int t = i % 2 ? it->first2 : it->first;
        int64_t live = 0;
        for (int j = 0; j < n; j++)
            if (dw_mem_live_at(&items[j], t)) live += items[j].size;
        if (live > peak) peak = live;
    }
    return peak;
}
