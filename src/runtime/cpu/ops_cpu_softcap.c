/* ops_cpu_softcap.c — the CPU backend's softcap op (Gemma 2's embedding normaliser and final logit
 * soft-capping): y = s x, or c tanh(s x / c) when c > 0 (attrs.scale, attrs.softcap), over the
 * output's N rows of C. Widens, runs the reference kernel (kernels/cpu/softcap_cpu.c), stores. */
#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/cpu/cpu.h"

dw_status dw_cpu_op_softcap_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t n = dw_exec_rows(c->x, c->n->out[0]) * dw_cpu_width(c, c->n->out[0]);
    const float *x = dw_cpu_in(be, c, c->in[0], n, CPU_S_IN0);
    float *y = dw_cpu_out(be, c, c->out[0], n, CPU_S_OUT);
    if (!x || !y) return DW_ERR_NOMEM;
    dw_cpu_softcap_fwd(y, x, n, c->n->attrs.scale, c->n->attrs.softcap);
    dw_cpu_put(c, c->out[0], y, n, false);
    return DW_OK;
}

dw_status dw_cpu_op_softcap_bwd(dw_backend *be, const dw_op_call *c) {
    const int64_t n = dw_exec_rows(c->x, c->n->out[0]) * dw_cpu_width(c, c->n->out[0]);
    if (!c->dx[0]) return DW_OK;
    const float *x = dw_cpu_in(be, c, c->in[0], n, CPU_S_IN0);
    const float *dy = dw_cpu_in(be, c, c->dout[0], n, CPU_S_DOUT);
    float *dx = dw_cpu_scratch(be, CPU_S_DX0, n);
    if (!x || !dy || !dx) return DW_ERR_NOMEM;
    dw_cpu_softcap_bwd(dx, dy, x, n, c->n->attrs.scale, c->n->attrs.softcap);
    dw_cpu_deliver(c, 0, dx, n);
    return DW_OK;
}
