/* steps_cuda.c — the CUDA backend's optimizer steps over the program's pools: the gradient norm
 * (deterministic two-stage reduction into the workspace), AdamW reading its arguments and the norm
 * from the workspace (so a recorded optimizer replays with each step's values; with the BF16
 * copies of the updated masters in the same pass where the executor fuses the cast), and the BF16
 * working copies of the masters. Kernels in kernels/cuda/adamw.cu and kern.cu. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/cuda/adamw_cuda.h"
#include "runtime/cuda/cuda.h"
#include "runtime/cuda/kern.h"

dw_status dw_cuda_step_grad_norm(dw_backend *be, const dw_exec *x) {
    const dw_compiled *p = x->p;
    return dw_cuda_grad_norm(be->ctx, x->grad, p->param_floats, (double *)(x->work + p->work.partials),
                             DW_COMPILE_NORM_BLOCKS, (double *)(x->work + p->work.norm), DW_CUDA_STREAM(be));
}

dw_status dw_cuda_step_adamw(dw_backend *be, const dw_exec *x, int n_runs) {
    const dw_compiled *p = x->p;
    const double *norm = (const double *)(x->work + p->work.norm);
    const dw_adamw_args *a = (const dw_adamw_args *)(x->work + p->work.adamw_args);
    if (n_runs) { /* the BF16 copies of bf16_runs [0, n_runs) in the same pass (the fused cast) */
        int64_t first, lag;
        dw_exec_cast_plan(x, &first, &lag);
        return dw_cuda_adamw_cast(be->ctx, x->w, x->grad, x->m, x->v, p->param_floats, p->decay_floats, norm, a, x->wb,
                                  (const int64_t(*)[2])p->bf16_runs, n_runs, first, lag, DW_CUDA_STREAM(be));
    }
    return dw_cuda_adamw(be->ctx, x->w, x->grad, x->m, x->v, p->param_floats, p->decay_floats, norm, a,
                         DW_CUDA_STREAM(be));
}

dw_status dw_cuda_step_cast_bf16(dw_backend *be, const dw_exec *x, int64_t begin, int64_t end) {
    DW_CUDA_CHECK(be->ctx, (cudaError_t)dw_cuda_be_to_bf16(x->wb + begin, x->w + begin, end - begin, DW_CUDA_STREAM(be)));
    return DW_OK;
}
#endif /* DW_HAVE_CUDA */
