/* quant_stats.h — private: what quantising one GEMM operand costs, for the run-time guardrails
 * (docs/precision.md, "Guardrails"): deepwell.h's dw_quant_stats sums (relative error, saturated
 * and flushed counts: io/safetensors_quant.c's, shared with `deepwell quant-report`) plus the same
 * error over each block's bulk — every element but the one of largest magnitude, which sets the
 * block's scale: one outlier dominates ||x|| and hides the loss of everything it squeezes. The
 * operand is quantised as the backends quantise GEMM operands: along its rows, or (trans) x^T
 * along x's columns. A tensor larger than the accumulator's cap is measured on a deterministic
 * sample of whole block rows (dw_qstats_sample). Also each recipe's default threshold. Not the trainer's bookkeeping
 * (train/guard_quant.c). */
#ifndef DW_PRECISION_QUANT_STATS_H
#define DW_PRECISION_QUANT_STATS_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"
#include "formats/formats.h"

/* Sums, so that measurements of several tensors (or ranks) add up before the ratio is taken. */
typedef struct {
    dw_quant_stats q;        /* n, sum_x2, sum_e2, max_abs, saturated, flushed, nonfinite: over the
                                elements measured (q.n of them) */
    double bulk_e2, bulk_x2; /* sum_e2 and sum_x2 over the finite elements other than each
                                block's (first) largest in magnitude */
    int64_t elements;        /* the tensors' elements, measured or not (q.n <= elements) */
    int64_t cap;             /* an operand of more elements than this is sampled (dw_qstats_sample);
                                0: every operand whole. An input, kept by the sums */
} dw_qstats;

/* A zeroed accumulator. */
dw_qstats dw_qstats_zero(void);
/* Quantises x [rows, cols] (FP32) in recipe r (not bf16) along its rows, or (trans) x^T
 * [cols, rows] along x's columns as the wgrad operands are, with the backends' options (RCEIL
 * MX scales, FP32 scales not rounded to powers of two), and adds the result to *s: all of it, or
 * when s->cap > 0 and rows * cols > s->cap the rows dw_qstats_sample picks. */
dw_status dw_qstats_measure(dw_ctx *ctx, dw_recipe r, const float *x, int64_t rows, int64_t cols, bool trans,
                            dw_qstats *s);
/* The sample a measurement of x [rows, cols] (or trans: x^T) in recipe r takes when it has more
 * than cap > 0 elements: whole block rows of the quantised layout [R, C] — groups of the recipe's
 * block_rows rows (1 for the row-wise and per-tensor recipes) across all C columns, so every
 * block is whole and its statistic the one a full measurement gives it — k = max(1, cap / (rows
 * of a group * C)) of the G groups, evenly spread (group[i] = i * G / k, the same every check),
 * except that the group holding the tensor's first element of largest magnitude replaces the
 * one whose stretch holds it: the amax is always measured, which a saturating outlier needs and
 * the tensor-scaled recipes (fp8_tensor, nvfp4's FP32 scale) need for the scale the whole tensor
 * gets. Writes *group_rows and group[k] (ascending; room for min(G, cap / C + 1)); returns k, or
 * 0 when the whole tensor is measured (cap <= 0, n <= cap, or k >= G). */
int64_t dw_qstats_sample(dw_recipe r, const float *x, int64_t rows, int64_t cols, bool trans, int64_t cap,
                         int64_t *group_rows, int64_t *group);
/* Whether a backend that can measure where the tensors live (runtime/backend.h qstats; the CUDA
 * backend's kernels/cuda/quant_check.cu) does so for the guard's check: yes unless DW_QCHECK_DEVICE=0
 * (tests/gpu/test_guard_check_cuda.c passed on an H100, session 19); then each tensor is read back
 * and measured with dw_qstats_measure. One decision for x, W (train/guard_quant.c)
 * and dy (runtime/cuda/guard_check_cuda.c). */
bool dw_qstats_on_device(void);
/* dw_qstats_sample in two halves, for a backend that finds the amax itself (runtime/cuda/
 * guard_check_cuda.c): the k it takes of the quantised layout [R, C] (0: whole) and *group_rows;
 * then group[k] placed for G groups with the amax in group a. */
int64_t dw_qstats_sample_size(dw_recipe r, int64_t R, int64_t C, int64_t cap, int64_t *group_rows);
void dw_qstats_sample_place(int64_t k, int64_t G, int64_t a, int64_t *group);
/* ||q(x) - x|| / ||x|| (dw_quant_stats_rel_err). */
double dw_qstats_rel_error(const dw_qstats *s);
/* The same over the blocks' bulk (0 when it is empty or all zero): what the guard compares with
 * the threshold. */
double dw_qstats_bulk_error(const dw_qstats *s);

/* The bulk relative error above which a tensor quantised in r counts as badly served
 * (docs/precision.md says why these numbers): 0.1 for the FP8 recipes (E4M3/E5M2), 0.25 for the
 * FP4 ones (E2M1); 0 (never) for bf16. */
double dw_qstats_default_threshold(dw_recipe r);

#endif /* DW_PRECISION_QUANT_STATS_H */
