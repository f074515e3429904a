/* steps_cpu.c — the CPU backend's optimizer steps over the program's pools: the gradient norm
 * into the workspace (double), AdamW with the workspace's arguments (kernels/cpu/optim_cpu.c;
 * with the BF16 copies of the updated masters in the same pass where the executor fuses the cast),
 * and the BF16 working copies of the masters (round to nearest even). */
#include <math.h>

#include "core/error.h"
#include "formats/formats.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/cpu/cpu.h"

dw_status dw_cpu_step_grad_norm(dw_backend *be, const dw_exec *x) {
    (void)be;
    *(double *)(x->work + x->p->work.norm) = sqrt(dw_cpu_sumsq(x->grad, x->p->param_floats));
    return DW_OK;
}

dw_status dw_cpu_step_adamw(dw_backend *be, const dw_exec *x, int n_runs, const int *quant_nodes, int n_quant) {
    (void)quant_nodes;
    if (n_quant) /* no adamw_quants on the CPU: never asked */
        return dw_set_error(be->ctx, DW_ERR_UNSUPPORTED, "cpu backend: AdamW does not refresh weight caches");
    const dw_compiled *p = x->p;
    const dw_adamw_args *a = (const dw_adamw_args *)(x->work + p->work.adamw_args);
    const double norm = *(const double *)(x->work + p->work.norm);
    if (n_runs) { /* the BF16 copies of bf16_runs [0, n_runs) in the same pass (the fused cast) */
        int64_t first, lag;
        dw_exec_cast_plan(x, &first, &lag);
        dw_cpu_adamw_cast(x->w, x->grad, x->m, x->v, p->param_floats, p->decay_floats, norm, a, x->wb,
                          (const int64_t(*)[2])p->bf16_runs, n_runs, first, lag);
    } else dw_cpu_adamw(x->w, x->grad, x->m, x->v, p->param_floats, p->decay_floats, norm, a);
    return DW_OK;
}

dw_status dw_cpu_step_cast_bf16(dw_backend *be, const dw_exec *x, int64_t begin, int64_t end) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int64_t i = begin; i < end; i++) x->wb[i] = dw_encode_bf16(x->w[i]);
    return DW_OK;
}
