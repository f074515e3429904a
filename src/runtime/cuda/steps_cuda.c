/* steps_cuda.c — the CUDA backend's optimizer steps over the program's pools: the gradient norm
 * (deterministic two-stage reduction into the workspace; the pool less the experts' gradients whose
 * squares their wgrad summed, where dw_exec_wsumsq_on), AdamW reading its arguments and the norm
 * from the workspace (so a recorded optimizer replays with each step's values; with the BF16
 * copies of the updated masters in the same pass where the executor fuses the cast, and MoE
 * experts' fp8_block weight caches where it fuses their refresh), and the BF16 working copies of
 * the masters. Kernels in kernels/cuda/adamw.cu, quant_adamw.cu and kern.cu. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <stdlib.h>

#include "compile/wgrad_sumsq.h"
#include "core/cuda_check.h"
#include "kernels/cuda/adamw_cuda.h"
#include "runtime/cuda/cuda.h"
#include "runtime/cuda/kern.h"
#include "runtime/exec.h"
#include "runtime/moe_fp8.h"

_Static_assert(DW_CUDA_NORM_SEGS >= DW_COMPILE_NORM_SEGS, "the norm kernel takes every segment");

dw_status dw_cuda_step_grad_norm(dw_backend *be, const dw_exec *x) {
    const dw_compiled *p = x->p;
    double *partials = (double *)(x->work + p->work.partials), *norm = (double *)(x->work + p->work.norm);
    if (!dw_exec_wsumsq_on(x))
        return dw_cuda_grad_norm(be->ctx, x->grad, p->param_floats, partials, DW_COMPILE_NORM_BLOCKS, norm,
                                 DW_CUDA_STREAM(be));
    /* the experts' gradients' squares came with their wgrad (ops_cuda_moe.c): the rest of the pool */
    return dw_cuda_grad_norm_segs(be->ctx, x->grad, (const int64_t(*)[2])p->work.norm_segs, p->work.n_norm_segs,
                                  (const double *)(x->work + p->work.wsumsq), p->work.wsumsq_parts, partials,
                                  DW_COMPILE_NORM_BLOCKS, norm, DW_CUDA_STREAM(be));
}

/* Whether AdamW's pass can refresh node's weight cache (dw_cuda_adamw_quant): a MoE layer's experts
 * under fp8_block (128x128 blocks; both dimensions whole blocks, the codes 16-byte aligned), every
 * expert and every pool on this rank, the weight without a BF16 copy. A cache in the arena
 * (wcache_arena) lies on gradients: only where all of them are of elements below the layer's,
 * which the pass has read when it reaches the layer (dw_cuda_adamw_cast); else the refresh's own
 * step quantises it after the whole step. */
bool dw_cuda_adamw_quants(dw_backend *be, const dw_exec *x, int node) {
    (void)be;
    const dw_compiled *p = x->p;
    dw_moe_fp8_weight_job j;
    if (x->g->nodes[node].op != DW_OP_MOE_LINEAR || x->moe_ep || !dw_moe_fp8_weight_job_of(x, node, &j)) return false;
    if (j.recipe != DW_RECIPE_FP8_BLOCK || j.m % 128 || j.k % 128 || ((uintptr_t)j.q.codes & 15) ||
        ((uintptr_t)j.qt.codes & 15))
        return false;
    const int64_t pf = p->param_floats, off = j.w - x->w, end = off + j.experts * j.m * j.k;
    if (x->opt_lo || x->opt_hi != pf || x->grad_lo || x->grad_hi != pf || x->w_lo || x->w_hi != pf || off % 4)
        return false;
    for (int r = 0; r < p->n_bf16_runs; r++)
        if (p->bf16_runs[r][0] < end && off < p->bf16_runs[r][1]) return false;
    return dw_compile_wcache_below(p, node);
}

static int by_start(const void *a, const void *b) {
    const int64_t x = ((const dw_adamw_quant_job *)a)->off, y = ((const dw_adamw_quant_job *)b)->off;
    return (x > y) - (x < y);
}

dw_status dw_cuda_step_adamw(dw_backend *be, const dw_exec *x, int n_runs, const int *quant_nodes, int n_quant) {
    const dw_compiled *p = x->p;
    const double *norm = (const double *)(x->work + p->work.norm);
    const dw_adamw_args *a = (const dw_adamw_args *)(x->work + p->work.adamw_args);
    if (!n_runs && !n_quant)
        return dw_cuda_adamw(be->ctx, x->w, x->grad, x->m, x->v, p->param_floats, p->decay_floats, norm, a,
                             DW_CUDA_STREAM(be));
    int64_t first, lag;
    dw_exec_cast_plan(x, &first, &lag);
    dw_adamw_quant_job *jobs = n_quant ? malloc((size_t)n_quant * sizeof *jobs) : NULL;
    if (n_quant && !jobs) return dw_set_error(be->ctx, DW_ERR_NOMEM, "cuda adamw: out of memory");
    for (int k = 0; k < n_quant; k++) {
        dw_moe_fp8_weight_job j;
        if (!dw_moe_fp8_weight_job_of(x, quant_nodes[k], &j)) DW_ASSERT(0 && "adamw_quants accepted a node without a cache");
        jobs[k] = (dw_adamw_quant_job){.off = j.w - x->w, .experts = j.experts, .m = j.m, .k = j.k, .codes = j.q.codes,
                                       .codes_t = j.qt.codes, .scales = j.q.scales, .scales_t = j.qt.scales};
    }
    if (n_quant) qsort(jobs, (size_t)n_quant, sizeof *jobs, by_start); /* each where the passes reach it */
    /* with the BF16 copies of bf16_runs [0, n_runs) (the fused cast) */
    const dw_status st = dw_cuda_adamw_cast(be->ctx, x->w, x->grad, x->m, x->v, p->param_floats, p->decay_floats, norm, a,
                                            x->wb, (const int64_t(*)[2])p->bf16_runs, n_runs, first, lag, jobs, n_quant,
                                            DW_CUDA_STREAM(be));
    free(jobs);
    return st;
}

dw_status dw_cuda_step_cast_bf16(dw_backend *be, const dw_exec *x, int64_t begin, int64_t end) {
    DW_CUDA_CHECK(be->ctx, (cudaError_t)dw_cuda_be_to_bf16(x->wb + begin, x->w + begin, end - begin, DW_CUDA_STREAM(be)));
    return DW_OK;
}
#endif /* DW_HAVE_CUDA */
