/* quant_counts.h — private: the per-step overflow and underflow counters of the quantisers that
 * feed GEMMs (docs/precision.md, "Guardrails"), and their one definition. For a finite element x
 * of a quantised operand whose exact dequantisation is y (codes x scales x tensor scale, in FP32):
 *   overflow  (saturated): x's code is the format's largest magnitude and |x| lies beyond the
 *             rounding boundary above the largest value (|x| > |y| x 464/448 for E4M3,
 *             61440/57344 for E5M2, 7/6 for E2M1): the value was clipped by the scale;
 *   underflow (flushed):   x != 0 and y == 0.
 * These are dw_quant_stats' `saturated` and `flushed` (io/safetensors_quant.c, shared with
 * quant_stats.h and `deepwell quant-report`); a non-finite x or y counts in neither.
 * The counters live in backend memory (device memory on a GPU), one (overflow, underflow) pair of
 * uint64 per counted linear layer and operand kind (x: fprop x and wgrad x^T; w: the weight
 * cache's W where the fprop runs quantised and W^T where the dgrad does — the copies the guard's
 * check measures; dy: dgrad dy and wgrad dy^T), attached to the executor (dw_exec.qcounts);
 * the quantisers add to them as they quantise, in stream order (no host sync): on the GPU inside
 * the quantiser kernels (kernels/cuda/quant*.cu through quant_counts.cuh; dw_quant_dev_out.counts),
 * by the separate pass below only where a kernel cannot count (quant.h says where); the trainer
 * reads them once per step (train/guard_counts.c), folding in the counts of reused x copies. The
 * same struct carries the guard's request to measure dy on a check step (train/guard_quant.c).
 * Not the counting of operands the NVFP4 recipe passes through the Hadamard transform (their
 * quantised values are of H x). */
#ifndef DW_PRECISION_QUANT_COUNTS_H
#define DW_PRECISION_QUANT_COUNTS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"
#include "formats/formats.h"
#include "formats/rules.h"
#include "precision/quant_stats.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DW_QC_X = 0, DW_QC_W, DW_QC_DY, DW_QC_KINDS } dw_qc_kind;
/* the words of one counter: overflows, underflows and the elements counted (all of each quantised
 * copy, non-finite ones too: the denominator of the guard's fractions) */
enum { DW_QC_OVER = 0, DW_QC_UNDER, DW_QC_N, DW_QC_WORDS };

/* ---- the definitions (host and device) ------------------------------------------------------- */
/* Element bits 4 or 8 and, for 8, whether it is E5M2: the largest magnitude code, its mask and
 * the ratio of the rounding boundary above the largest value to that value. */
DW_RULE void dw_qc_top(int elem_bits, bool e5m2, unsigned *mask, unsigned *top, double *ratio) {
    if (elem_bits == 4) *mask = 0x7u, *top = 0x7u, *ratio = 7.0 / 6.0;
    else if (e5m2) *mask = 0x7Fu, *top = 0x7Bu, *ratio = 61440.0 / 57344.0;
    else *mask = 0x7Fu, *top = 0x7Eu, *ratio = 464.0 / 448.0;
}
/* Overflow of x (finite) quantised to `code` whose dequantised value is y (finite). */
DW_RULE bool dw_qc_overflow(unsigned code, unsigned mask, unsigned top, double ratio, float x, float y) {
    return (code & mask) == top && fabs((double)x) > fabs((double)y) * ratio;
}
/* Underflow of x quantised to y (both finite). */
DW_RULE bool dw_qc_underflow(float x, float y) { return x != 0.0f && y == 0.0f; }

/* ---- the counters ------------------------------------------------------------------------------- */
typedef struct dw_qcounts {
    int n_layers;
    int *slot;      /* (nodes) the node's layer index, -1: not counted */
    uint64_t *dev;  /* backend memory: (n_layers, DW_QC_KINDS, DW_QC_WORDS) */
    /* GPU: x copies that siblings reuse (llama's q/k/v, gate/up read one quantisation of x). A
     * layer that quantises x's copy k (0: row-wise, fprop; 1: x^T, wgrad) itself counts it into
     * its own pair own[2 * layer + k] (backend memory, (n_layers, 2, DW_QC_WORDS) after dev);
     * src[k] is the layer whose own pair holds the counts of the copy now in the workspace (-1:
     * uncounted); from[2 * layer + k] (host) is the layer whose own pair k the layer's x counts
     * take when the counters are read (train/guard_counts.c folds them then: no kernel per
     * reusing layer), -1: none (counted straight into its slot, or not at all). Set as steps are
     * issued; a recorded step replays what its recording set. */
    uint64_t *own;
    int src[2];
    int *from;
    /* dy on a check step (train/guard_quant.c): while measure_dy, each counted layer's backward
     * adds its dy (dgrad operand, along M) and dy^T (wgrad operand, along the tokens), quantised
     * with the reference quantiser in the layer's activation recipe, to dy[2 * layer + 0 / 1] */
    bool measure_dy;
    dw_qstats *dy;  /* (n_layers, 2), host memory */
} dw_qcounts;

/* The counter (DW_QC_WORDS words) of node's operand kind k (backend memory), NULL when not counted
 * (c NULL too). */
uint64_t *dw_qcounts_slot(const dw_qcounts *c, int node, dw_qc_kind k);
/* node's dy statistics (2: dy, dy^T) when a check step asks for them, else NULL. */
dw_qstats *dw_qcounts_dy(const dw_qcounts *c, int node);
/* GPU: counted node's own pair of x copy k (0: row-wise, 1: x^T), backend memory, where the
 * quantiser of a copy siblings may reuse adds its counts. */
static inline uint64_t *dw_qcounts_own(const dw_qcounts *c, int node, int k) {
    return c->own + ((int64_t)c->slot[node] * 2 + k) * DW_QC_WORDS;
}
/* x copy k is now in the workspace: counted into node's own pair (counted) or not (c NULL: no
 * counters, nothing to note). */
static inline void dw_qcounts_note(dw_qcounts *c, int k, int node, bool counted) {
    if (c) c->src[k] = counted ? c->slot[node] : -1;
}

/* CPU: adds to cnt[DW_QC_WORDS] the overflows, underflows and elements of q, the quantisation of v [rows,
 * cols] (FP32, host) — q holds v itself, or (trans) v^T [cols, rows]. y: scratch of rows * cols
 * floats (q's exact dequantisation goes there). */
void dw_qcounts_add_cpu(const dw_qtensor *q, const float *v, bool trans, float *y, uint64_t *cnt);

/* quant_counts.cu (CUDA builds): the same on the device as a separate pass, in stream order: v [rows, cols] (FP32 or
 * BF16 codes, as the quantiser read it), q's codes, row-major scales and (nvfp4) device tensor
 * scale in `q` (a dw_quant_dev_out of kernels/cuda/quant.h: codes, scales, tensor_scale), recipe r;
 * one atomic add per CTA and counter, none for a zero count. `in`: 0 FP32, 1 BF16. */
dw_status dw_qcounts_add_cuda(dw_ctx *ctx, dw_recipe r, int in, const void *v, int64_t rows, int64_t cols,
                              bool trans, const uint8_t *codes, const void *scales, const float *tensor_scale,
                              uint64_t *cnt, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DW_PRECISION_QUANT_COUNTS_H */
