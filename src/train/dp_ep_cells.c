/* dp_ep_cells.c — the cells of ZeRO-1 with expert parallelism (dp_ep_zero.h): the pool's dense
 * floats and each expert group's slices as spaces, each space sharded over the ranks that step it,
 * and every share mapped back to ranges of the pool. Pure arithmetic on host integers. */
#include <stdlib.h>

#include "compile/shard.h"
#include "train/dp_ep_zero.h"

typedef struct {
    int64_t begin, end;
    int j; /* -1: dense, else the expert group */
} member;

static int by_begin(const void *a, const void *b) {
    const member *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

static int cell_by_begin(const void *a, const void *b) {
    const dw_dp_cell *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/* Space j's part `part` of `parts` (members m, n, by begin) as cells appended to out[*k]. */
static void cut(const member *m, int n, int j, int parts, int k_group, dw_dp_cell *out, int *k) {
    int64_t len = 0;
    for (int i = 0; i < n; i++) len += m[i].j == j ? m[i].end - m[i].begin : 0;
    for (int p = 0; p < parts; p++) {
        int64_t lo, hi, at = 0; /* virtual floats [lo, hi) of the space; at: the member's first */
        dw_shard_range(len, parts, p, &lo, &hi);
        for (int i = 0; i < n && at < hi; i++) {
            if (m[i].j != j) continue;
            const int64_t size = m[i].end - m[i].begin, a = lo > at ? lo : at, b = hi < at + size ? hi : at + size;
            if (a < b)
                out[(*k)++] = (dw_dp_cell){.begin = m[i].begin + (a - at), .end = m[i].begin + (b - at), .j = j,
                                           .part = p, .rank = j < 0 ? p : p * k_group + j};
            at += size;
        }
    }
}

int dw_dp_ep_cells(int64_t floats, const dw_ep_param *pr, int n, int world, int k, dw_dp_cell **out) {
    *out = NULL;
    const int n_slices = n * k, cap_m = 2 * n_slices + 1;
    member *m = malloc((size_t)cap_m * sizeof *m);
    dw_dp_cell *c = malloc((size_t)(cap_m + 2 * world + 1) * sizeof *c);
    if (!m || !c) {
        free(m), free(c);
        return -1;
    }
    for (int i = 0; i < n; i++) /* the slices, then the dense gaps between them */
        for (int j = 0; j < k; j++)
            m[i * k + j] = (member){.begin = pr[i].off + j * (pr[i].numel / k),
                                    .end = pr[i].off + (j + 1) * (pr[i].numel / k), .j = j};
    qsort(m, (size_t)n_slices, sizeof *m, by_begin);
    int nm = n_slices;
    for (int i = 0; i <= n_slices; i++) {
        const int64_t next = i < n_slices ? m[i].begin : floats, from = i ? m[i - 1].end : 0;
        if (next > from) m[nm++] = (member){.begin = from, .end = next, .j = -1};
    }
    qsort(m, (size_t)nm, sizeof *m, by_begin);
    int nc = 0;
    cut(m, nm, -1, world, k, c, &nc);
    for (int j = 0; j < k; j++) cut(m, nm, j, world / k, k, c, &nc);
    qsort(c, (size_t)nc, sizeof *c, cell_by_begin);
    free(m);
    *out = c;
    return nc;
}

int64_t dw_dp_ep_cells_held(const dw_dp_cell *c, int n, int rank) {
    int64_t held = 0;
    for (int i = 0; i < n; i++) held += c[i].rank == rank ? c[i].end - c[i].begin : 0;
    return held;
}
