/* amax_rules.h — private: the rule of delayed scaling (amax history) for the fp8_tensor recipe,
 * as inline functions shared by the CPU quantiser (precision/amax_history.c) and the CUDA
 * quantiser's scale kernel (kernels/cuda/quant_kernels.cuh), so both pick the same amax. One quantised
 * operand's state is DW_AMAX_WORDS(N) uint32 words: amax values as FP32 bit patterns of |x|.
 *   [DW_AMAX_HIST]     the largest amax in the ring (0: nothing recorded yet)
 *   [DW_AMAX_PENDING]  the largest finite amax of the current step's quantisations so far
 *   [DW_AMAX_POS]      the ring slot the next step's amax goes to
 *   [DW_AMAX_RING..]   the last N steps' amaxes
 * A quantisation of a tensor whose own amax is `cur` scales from dw_amax_pick (the history's
 * largest; its own amax while the history is empty, or when cur is not finite so that NaN/Inf
 * still give NaN codes) and, in training, notes cur (dw_amax_note). Once per optimizer step
 * dw_amax_roll moves the pending amax into the ring. Not the scale rule itself (formats/rules.h). */
#ifndef DW_PRECISION_AMAX_RULES_H
#define DW_PRECISION_AMAX_RULES_H

#include <stdint.h>

#include "formats/rules.h"

enum { DW_AMAX_HIST = 0, DW_AMAX_PENDING, DW_AMAX_POS, DW_AMAX_RING };
#define DW_AMAX_WORDS(n) (DW_AMAX_RING + (n))

/* The amax the scale comes from (dw_rule_fp8_scale of it). */
DW_RULE uint32_t dw_amax_pick(const uint32_t *h, uint32_t cur) {
    return h[DW_AMAX_HIST] > 0 && !dw_rule_nonfinite(cur) ? h[DW_AMAX_HIST] : cur;
}

/* A training quantisation's own amax into the step's pending one (non-finite ones never: a
 * skipped step must not poison the next N steps' scales). */
DW_RULE void dw_amax_note(uint32_t *h, uint32_t cur) {
    if (!dw_rule_nonfinite(cur) && cur > h[DW_AMAX_PENDING]) h[DW_AMAX_PENDING] = cur;
}

/* The step's pending amax (0 when nothing was quantised) into the ring, replacing the oldest;
 * HIST becomes the ring's largest; pending starts again at 0. */
DW_RULE void dw_amax_roll(uint32_t *h, uint32_t n) {
    uint32_t pos = h[DW_AMAX_POS], m = 0;
    h[DW_AMAX_RING + pos] = h[DW_AMAX_PENDING];
    h[DW_AMAX_POS] = pos + 1 == n ? 0 : pos + 1;
    h[DW_AMAX_PENDING] = 0;
    for (uint32_t i = 0; i < n; i++) m = h[DW_AMAX_RING + i] > m ? h[DW_AMAX_RING + i] : m;
    h[DW_AMAX_HIST] = m;
}

#endif /* DW_PRECISION_AMAX_RULES_H */
