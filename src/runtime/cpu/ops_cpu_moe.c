/* ops_cpu_moe.c — the CPU backend's mixture-of-experts entries: the router (logits -> top-k
 * weights, stored in the program's activation dtype, and int32 experts). Its backward recomputes
 * the scores from the logits and reads the experts the forward chose (ops.def READS_IN0,
 * READS_OUT); weights without a gradient (no consumer sent one) count as zeros. */
#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/cpu/cpu.h"

dw_status dw_cpu_op_moe_router_fwd(dw_backend *be, const dw_op_call *c) {
    const dw_ir_attrs *a = &c->n->attrs;
    const int64_t N = c->rows, E = dw_cpu_width(c, c->n->in[0]), K = a->top_k;
    const float *z = dw_cpu_in(be, c, c->in[0], N * E, CPU_S_IN0);
    float *w = dw_cpu_out(be, c, c->out[0], N * K, CPU_S_OUT);
    if (!z || !w) return DW_ERR_NOMEM;
    dw_cpu_moe_router_fwd(w, (int32_t *)c->out[1], z, N, E, K, a->score, a->norm_topk);
    dw_cpu_put(c, c->out[0], w, N * K, false);
    return DW_OK;
}

dw_status dw_cpu_op_moe_router_bwd(dw_backend *be, const dw_op_call *c) {
    if (!c->dx[0]) return DW_OK;
    const dw_ir_attrs *a = &c->n->attrs;
    const int64_t N = c->rows, E = dw_cpu_width(c, c->n->in[0]), K = a->top_k;
    const float *z = dw_cpu_in(be, c, c->in[0], N * E, CPU_S_IN0);
    const float *dw = c->dout[0] ? dw_cpu_in(be, c, c->dout[0], N * K, CPU_S_DOUT) : NULL;
    float *dz = dw_cpu_scratch(be, CPU_S_DX0, N * E);
    if (!z || !dz || (c->dout[0] && !dw)) return DW_ERR_NOMEM;
    dw_cpu_moe_router_bwd(dz, dw, z, (const int32_t *)c->out[1], N, E, K, a->score, a->norm_topk);
    dw_cpu_deliver(c, 0, dz, N * E);
    return DW_OK;
}
