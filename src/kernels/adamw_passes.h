/* adamw_passes.h — private: the order in which one AdamW step writes the BF16 working copies in
 * its own pass (the fused cast; dw_cpu_adamw_cast and dw_cuda_adamw_cast run what this plans).
 *
 * The pool [0, n) is cut into passes run one after another, each over its elements in parallel:
 * a pass updates the masters [lo, hi) (update) and writes the copies of its runs' elements inside
 * [c0, c1). Cuts fall at the runs' starts (64-float aligned parameters: the 16-byte loads stay
 * aligned), so each pass meets at most one run.
 *
 * behind (first > 0): the copies lie on gradients the step has yet to read (bf16_arena: the copies
 * at byte 2 i of theirs, the gradients at byte 4 j of theirs, the two bases d bytes apart), copy i
 * on gradients j <= i / 2 + lag at most (lag 0 where the copies start at or below the gradients,
 * ceil(d / 4) above). Then cuts fall at first, and from each cut c at 2 (c - lag) (down to a
 * multiple of 64) too: a pass over [c, c') writes copies on gradients below c, all read by the
 * passes before it; the passes below `first` write no copy, and cast-only passes (update false)
 * make those at the end. */
#ifndef DW_KERNELS_ADAMW_PASSES_H
#define DW_KERNELS_ADAMW_PASSES_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t lo, hi; /* the elements of the pass */
    int64_t c0, c1; /* its copies: [c0, c1) inside [lo, hi) (c0 == c1: none) */
    bool update;    /* false: a cast alone (c0 = lo, c1 = hi) of masters already updated */
} dw_adamw_pass;

/* The first cut of a behind plan over n elements with lag: a multiple of 64, n / 4096 and at least
 * 1024 (the cast-only passes read 1/4096 of the masters again), and past 4 lag + 128 (the cuts
 * then grow by half at least). */
int64_t dw_adamw_passes_first(int64_t n, int64_t lag);

/* The plan over n elements of runs (n_runs, ascending, disjoint, within [0, n)) with first (0: the
 * copies meet no gradient) and lag, walked in order by dw_adamw_pass_next. */
typedef struct {
    int64_t n, first, lag;
    const int64_t (*runs)[2];
    int n_runs;
    int64_t lo, cut; /* the next update pass's start; the next doubling cut */
    int r, q;        /* the last run that starts at or below lo; the next cast-only run */
} dw_adamw_plan;

void dw_adamw_plan_init(dw_adamw_plan *pl, int64_t n, const int64_t (*runs)[2], int n_runs, int64_t first,
                        int64_t lag);
/* The next pass into *out: false when none is left. */
bool dw_adamw_pass_next(dw_adamw_plan *pl, dw_adamw_pass *out);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_ADAMW_PASSES_H */
