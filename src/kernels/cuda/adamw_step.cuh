/* adamw_step.cuh — private: one element of the CUDA AdamW step (kernels/adamw_args.h's contract,
 * in dw_cpu_adamw's order, in double), shared by adamw.cu's flat passes and quant_adamw.cu's
 * 128x128 tiles so that both give the same bits. */
#ifndef DW_KERNELS_CUDA_ADAMW_STEP_CUH
#define DW_KERNELS_CUDA_ADAMW_STEP_CUH

#include "kernels/adamw_args.h"

/* Element p, g, m, v with weight decay wd (0 past the decay parameters) and clipping scale. Every
 * operation rounds on its own (the _rn intrinsics are never contracted into FMAs), in the CPU
 * reference's order: the same bits as dw_cpu_adamw, and as each other wherever it is inlined (left
 * to the compiler, contraction differed between two kernels in ~0.1% of the first moments). */
static __device__ __forceinline__ void aw_one(float &p, float g, float &m, float &v, double wd, double scale,
                                              const dw_adamw_args &a) {
    const double gi = __dmul_rn((double)g, scale);
    double pi = (double)p;
    pi = __dsub_rn(pi, __dmul_rn(__dmul_rn(a.lr, wd), pi));
    const double mi = __dadd_rn(__dmul_rn(a.beta1, (double)m), __dmul_rn(__dsub_rn(1.0, a.beta1), gi));
    const double vi = __dadd_rn(__dmul_rn(a.beta2, (double)v), __dmul_rn(__dmul_rn(__dsub_rn(1.0, a.beta2), gi), gi));
    m = (float)mi;
    v = (float)vi;
    pi = __dsub_rn(pi, __ddiv_rn(__dmul_rn(a.lr, __ddiv_rn(mi, a.c1)), __dadd_rn(__dsqrt_rn(__ddiv_rn(vi, a.c2)), a.eps)));
    p = (float)pi;
}

/* The clipping factor from the global norm (finite). */
static __device__ __forceinline__ double aw_scale(double nrm, const dw_adamw_args &a) {
    return (a.max_norm > 0.0 && nrm > a.max_norm) ? a.max_norm / (nrm + 1e-6) : 1.0;
}

#endif /* DW_KERNELS_CUDA_ADAMW_STEP_CUH */
