/* grouped_fp8_case.h — private: the fp8_block side of `deepwell bench grouped`
 * (bench/grouped_fp8_case.c): one case's E4M3 operands — W and W^T's copy quantised once (the engine
 * quantises weights once a step), the activation operands of a pass quantised inside every timed
 * call (x or dy row-wise for fprop/dgrad; dy^T and x^T padded per expert for wgrad) — and the
 * dw_grouped_args of a pass over them. Host buffers on the CPU, device buffers on a GPU. */
#ifndef DW_BENCH_GROUPED_FP8_CASE_H
#define DW_BENCH_GROUPED_FP8_CASE_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"

typedef struct {
    dw_ctx *ctx;
    bool gpu;                   /* device buffers, BF16 inputs (else host, FP32) */
    int64_t R, E, K, M, P;      /* P: wgrad's padded rows (grouped_fp8.h) */
    const void *x, *dy;         /* the case's inputs (R, K), (R, M) */
    const int32_t *off;         /* the routing's offsets (E+1), on the case's side */
    uint8_t *wc, *wct, *xc, *dyc, *xtc, *dytc; /* W (E,M,K), W^T (E,K,M), x (R,K), dy (R,M), x^T (K,P), dy^T (M,P) */
    float *ws, *wst, *xs, *dys, *xts, *dyts;    /* their scales */
} bench_fp8;

/* Allocates f's codes and scales and quantises W (E, M, K) into them. DW_ERR_INVALID naming K
 * or M when either is not a multiple of 128; DW_ERR_NOMEM. f is freed on error. */
dw_status bench_fp8_make(dw_ctx *ctx, bench_fp8 *f, bool gpu, const void *w, const void *x, const void *dy,
                         int64_t R, int64_t E, int64_t K, int64_t M);
void bench_fp8_free(bench_fp8 *f);
/* Quantises the activation operands pass reads from f->x / f->dy, with the offsets f->off. */
dw_status bench_fp8_quantize(const bench_fp8 *f, int pass);
/* The pass over f's codes, output out (y, dx in dtype; dW FP32). */
dw_grouped_args bench_fp8_args(const bench_fp8 *f, int pass, void *out);

#endif /* DW_BENCH_GROUPED_FP8_CASE_H */
