/* adamw_passes.c — the passes of a fused AdamW + BF16 cast step (adamw_passes.h). */
#include "kernels/adamw_passes.h"

int64_t dw_adamw_passes_first(int64_t n, int64_t lag) {
    int64_t f = (n >> 12) / 64 * 64;
    f = f < 1024 ? 1024 : f;
    const int64_t g = (4 * lag + 128 + 63) / 64 * 64;
    return f < g ? g : f;
}

void dw_adamw_plan_init(dw_adamw_plan *pl, int64_t n, const int64_t (*runs)[2], int n_runs, int64_t first,
                        int64_t lag) {
    const int64_t least = (2 * lag + 128 + 63) / 64 * 64; /* from it each cut is 64 past the one before */
    first = first > 0 && first < least ? least : first;
    *pl = (dw_adamw_plan){.n = n, .first = first, .lag = lag, .runs = runs, .n_runs = n_runs, .cut = first, .r = -1};
    while (pl->r + 1 < n_runs && runs[pl->r + 1][0] <= 0) pl->r++;
}

bool dw_adamw_pass_next(dw_adamw_plan *pl, dw_adamw_pass *out) {
    const int64_t(*runs)[2] = pl->runs;
    if (pl->lo < pl->n) { /* an update pass from lo to the next cut */
        const int64_t lo = pl->lo;
        int64_t hi = pl->n;
        if (pl->r + 1 < pl->n_runs && runs[pl->r + 1][0] < hi) hi = runs[pl->r + 1][0];
        if (pl->first > 0) {
            while (pl->cut <= lo) pl->cut = 2 * (pl->cut - pl->lag) / 64 * 64;
            if (pl->cut < hi) hi = pl->cut;
        }
        *out = (dw_adamw_pass){.lo = lo, .hi = hi, .c0 = lo, .c1 = lo, .update = true};
        if (pl->r >= 0 && !(pl->first > 0 && hi <= pl->first)) { /* below first, a behind plan's copies wait */
            const int64_t c0 = runs[pl->r][0] > lo ? runs[pl->r][0] : lo;
            const int64_t c1 = runs[pl->r][1] < hi ? runs[pl->r][1] : hi;
            if (c0 < c1) out->c0 = c0, out->c1 = c1;
        }
        pl->lo = hi;
        while (pl->r + 1 < pl->n_runs && runs[pl->r + 1][0] <= hi) pl->r++;
        return true;
    }
    for (; pl->first > 0 && pl->q < pl->n_runs && runs[pl->q][0] < pl->first; pl->q++) { /* the copies below first */
        const int64_t c0 = runs[pl->q][0], c1 = runs[pl->q][1] < pl->first ? runs[pl->q][1] : pl->first;
        if (c0 < c1) {
            *out = (dw_adamw_pass){.lo = c0, .hi = c1, .c0 = c0, .c1 = c1, .update = false};
            pl->q++;
            return true;
        }
    }
    return false;
}
