/* adamw_step.cuh — private: one element of the CUDA AdamW step (kernels/adamw_args.h's contract,
 * in dw_cpu_adamw's order, in double), shared by adamw.cu's flat passes and quant_adamw.cu's
 * 128x128 tiles so that both give the same bits. */
#ifndef DW_KERNELS_CUDA_ADAMW_STEP_CUH
#define DW_KERNELS_CUDA_ADAMW_STEP_CUH

#include "kernels/adamw_args.h"

/* Element p, g, m, v with weight decay wd (0 past the decay parameters) and clipping scale. */
static __device__ __forceinline__ void aw_one(float &p, float g, float &m, float &v, double wd, double scale,
                                              const dw_adamw_args &a) {
    const double gi = (double)g * scale;
    double pi = (double)p;
    pi -= a.lr * wd * pi;
    const double mi = a.beta1 * (double)m + (1.0 - a.beta1) * gi;
    const double vi = a.beta2 * (double)v + (1.0 - a.beta2) * gi * gi;
    m = (float)mi;
    v = (float)vi;
    pi -= a.lr * (mi / a.c1) / (sqrt(vi / a.c2) + a.eps);
    p = (float)pi;
}

/* The clipping factor from the global norm (finite). */
static __device__ __forceinline__ double aw_scale(double nrm, const dw_adamw_args &a) {
    return (a.max_norm > 0.0 && nrm > a.max_norm) ? a.max_norm / (nrm + 1e-6) : 1.0;
}

#endif /* DW_KERNELS_CUDA_ADAMW_STEP_CUH */
