/* adamw_cuda.h — private: the CUDA optimizer over one flat parameter pool (the CUDA engine keeps
 * weights, gradients, m and v as four pools with identical offsets, decay parameters first):
 * the global gradient norm (deterministic two-stage reduction in double) and one AdamW step
 * with the CPU trainer's formula (train/optim.h), clipping factor computed on the device.
 * Pointers are device pointers; launches on `stream` (a cudaStream_t), no synchronisation. */
#ifndef DW_KERNELS_ADAMW_CUDA_H
#define DW_KERNELS_ADAMW_CUDA_H

#include <stdint.h>

#include "deepwell.h"
#include "kernels/adamw_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* *norm = sqrt(sum g[i]^2) over n floats, summed in double: nblk block partials in a fixed order
 * (partials: nblk doubles of scratch), then one block adds them in ascending order. */
dw_status dw_cuda_grad_norm(dw_ctx *ctx, const float *g, int64_t n, double *partials, int nblk,
                            double *norm, void *stream);
/* The same over the segments [segs[s][0], segs[s][1]) of g (n_segs <= DW_CUDA_NORM_SEGS, host
 * memory, ascending and disjoint) plus n_parts sums of squares already made (parts, device; the
 * experts' wgrad's, compile/wgrad_sumsq.h): each block adds its share of the segments' squares,
 * then of parts, in a fixed order. */
#define DW_CUDA_NORM_SEGS 128
dw_status dw_cuda_grad_norm_segs(dw_ctx *ctx, const float *g, const int64_t (*segs)[2], int n_segs,
                                 const double *parts, int64_t n_parts, double *partials, int nblk, double *norm,
                                 void *stream);

/* For i < n (weight decay only for i < n_decay), in double as dw_adamw_step_cpu:
 *   g' = g * scale;  p -= lr*wd*p;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2;
 *   p -= lr * (m / c1) / (sqrt(v / c2) + eps)
 * scale comes from *norm (device). A non-finite *norm leaves p, m, v unchanged. The arguments
 * a are in device memory and read when the kernel runs (a CUDA graph replays the launch with the
 * values of each step); the caller validates them (c1, c2, eps > 0). */
dw_status dw_cuda_adamw(dw_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n,
                        int64_t n_decay, const double *norm, const dw_adamw_args *a,
                        void *stream);
/* A MoE layer's expert weights in the pool and their fp8_block cache (gemm/grouped_fp8.h's layout):
 * masters at pool offset off, [experts, m, k] (m, k multiples of 128, off of 4); codes [experts,
 * m, k] with scales [experts, m/128, k/128], and W^T's codes_t [experts, k, m] with scales_t
 * [experts, k/128, m/128] (16-byte aligned codes). */
typedef struct {
    int64_t off, experts, m, k;
    uint8_t *codes, *codes_t;
    float *scales, *scales_t;
} dw_adamw_quant_job;

/* The same step writing, in the same pass, the BF16 copy wb[i] = bf16_rn(p[i]) (the cast kernel's
 * rounding, bit for bit) of each updated master in runs (n_runs >= 0, host memory) [begin, end),
 * ascending and disjoint within [0, n); wb (n, device) elsewhere untouched. One launch per pass
 * of kernels/adamw_passes.h (cut at the runs' 64-float aligned starts, which keep the 16-byte
 * loads; first > 0: wb lies on g, copy i on g[j] for j <= i / 2 + lag at most, and the passes'
 * growing cuts from first read each gradient before its bytes take a copy). jobs (n_jobs, host
 * memory, ascending by off, disjoint, apart from the runs): their elements are
 * dw_cuda_adamw_quant's, each job run where the passes first reach it — after every element below
 * it, before any above — so a job whose cache lies on gradients below its own (wcache_arena) finds
 * them read, and the copies above it find its gradients read.
 * A non-finite *norm leaves p, m, v and still writes the copies. */
dw_status dw_cuda_adamw_cast(dw_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n, int64_t n_decay,
                             const double *norm, const dw_adamw_args *a, uint16_t *wb, const int64_t (*runs)[2],
                             int n_runs, int64_t first, int64_t lag, const dw_adamw_quant_job *jobs, int n_jobs,
                             void *stream);

/* The AdamW step of each job's masters (dw_cuda_adamw's bits: the same element function, decay
 * for pool offsets below n_decay) and, from the updated masters, their cache: every 128x128 block
 * quantised as dw_grouped_fp8_quantize_weights_cuda does it (bit for bit), W and W^T, in one pass
 * a block (quant_adamw.cu); a non-finite *norm leaves p, m, v and still writes the cache. */
dw_status dw_cuda_adamw_quant(dw_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n_decay,
                              const double *norm, const dw_adamw_args *a, const dw_adamw_quant_job *jobs, int n_jobs,
                              void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_ADAMW_CUDA_H */
