/* guard.c — non-finite steps (guard.h): the reason a step is skipped and the count of skips in a
 * row. The trainer leaves the optimizer alone on such a step (the AdamW kernels skip a non-finite
 * norm themselves; a non-finite loss never reaches them). */
#include <math.h>

#include "core/log.h"
#include "train/guard.h"

const char *dw_guard_nonfinite(double loss, double norm) {
    if (!isfinite(loss)) return "nonfinite loss";
    if (!isfinite(norm)) return "nonfinite grad";
    return NULL;
}

bool dw_guard_count(dw_guard_skips *g, int64_t step, const char *why, double loss, double norm) {
    if (!why) {
        g->consecutive = 0;
        return false;
    }
    g->consecutive++;
    g->total++;
    DW_LOGW("step %lld skipped: %s (loss %g, gradient norm %g); weights and optimizer state unchanged (%lld in a "
            "row, --max-skips %lld)", (long long)step, why, loss, norm, (long long)g->consecutive,
            (long long)g->max_skips);
    return g->consecutive >= g->max_skips;
}
