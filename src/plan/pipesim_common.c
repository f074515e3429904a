/* pipesim_common.c — what both pipeline simulations (pipesim.c, pipesim_dual.c) share: the
 * dw_sim_out buffers (per rank busy time, exposed and hidden communication, peak in-flight
 * micro-batches; the op list when kept) and the time of a backward merged with a forward. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "plan/plan.h"

void dw_sim_out_free(dw_sim_out *o) {
    if (!o) return;
    free(o->busy);
    free(o->comm_exposed);
    free(o->comm_hidden);
    free(o->max_inflight);
    free(o->ops);
    memset(o, 0, sizeof *o);
}

dw_status dw_sim_out_alloc(dw_ctx *ctx, int p, int64_t n_ops, bool keep_ops, dw_sim_out *out) {
    memset(out, 0, sizeof *out);
    out->busy = calloc((size_t)p, sizeof *out->busy);
    out->comm_exposed = calloc((size_t)p, sizeof *out->comm_exposed);
    out->comm_hidden = calloc((size_t)p, sizeof *out->comm_hidden);
    out->max_inflight = calloc((size_t)p, sizeof *out->max_inflight);
    if (keep_ops) out->ops = malloc(sizeof *out->ops * (size_t)n_ops);
    if (!out->busy || !out->comm_exposed || !out->comm_hidden || !out->max_inflight || (keep_ops && !out->ops)) {
        dw_sim_out_free(out);
        return dw_set_error(ctx, DW_ERR_NOMEM, "pipeline simulation: out of memory");
    }
    return DW_OK;
}

double dw_pipe_merged(double f, double fc, double b, double bc, double *exposed, double *hidden) {
    double cf = f - fc, cb = b - bc;
    *exposed = (fc > cb ? fc - cb : 0) + (bc > cf ? bc - cf : 0);
    *hidden = fc + bc - *exposed;
    return cf + cb + *exposed + DW_PLAN_A2A_SM_SHARE * *hidden;
}
