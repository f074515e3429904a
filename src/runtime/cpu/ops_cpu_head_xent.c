/* ops_cpu_head_xent.c — the CPU backend's fused LM head + cross-entropy (ops.def head_xent, put in
 * place of the head linear and the loss by compile/fuse.c). For each chunk of the program's
 * head_chunk rows: the logits x_c W^T into the chunk buffer as the head linear computes them (FP32
 * reference linear, or the reference GEMM in BF16), each row's loss and, in a training step, the
 * logits' gradient over them (scale dloss / valid rows of the whole batch), dx_c = dlogits_c W,
 * and dW += dlogits_c^T x_c summed in double across the chunks and rounded once at the end as the
 * unfused wgrad does. Loss, dx and dW are the unfused program's bit for bit (test_head_xent.c). A
 * quantised head runs the head linear's own op on each chunk: loss and dx the unfused program's
 * bit for bit, dW its quantised wgrad's sums added chunk by chunk in FP32. */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/cpu/cpu.h"
#include "runtime/linear_args.h"

typedef struct {
    int64_t K, V;   /* x (N,K), W (V,K) */
    void *chunk;    /* (head_chunk, V) logits, act dtype */
    double scale;   /* dloss / valid rows; the gradient's factor */
    double sum;     /* the rows' losses so far, in row order */
    double *acc;    /* (V,K) dW so far; NULL: no gradient (not a training step) */
} head_run;

/* FP32 program: the reference linear's rows. */
static dw_status chunk_f32(dw_backend *be, const dw_op_call *c, head_run *h, int64_t r0, int64_t nc) {
    const int64_t K = h->K, V = h->V;
    const float *xc = (const float *)c->in[0] + r0 * K, *w = c->in[1];
    float *lg = h->chunk;
    dw_cpu_linear_fwd(lg, xc, w, NULL, nc, K, V);
    dw_cpu_head_xent_rows(h->acc ? lg : NULL, &h->sum, lg, (const int32_t *)c->in[2] + r0, nc, V, h->scale);
    if (!h->acc) return DW_OK;
    if (c->dx[0]) {
        float *dx = dw_cpu_scratch(be, CPU_S_DX0, nc * K);
        if (!dx) return DW_ERR_NOMEM;
        dw_cpu_linear_bwd(dx, NULL, NULL, lg, xc, w, nc, K, V);
        dw_cpu_put(c, (float *)c->dx[0] + r0 * K, dx, nc * K, c->dx_acc[0]);
    }
    dw_cpu_head_xent_wgrad(h->acc, lg, xc, nc, K, V);
    return DW_OK;
}

/* The chunk's BF16 logits through the cross-entropy's rows: their losses into h->sum and, in a
 * training step, their gradient stored as BF16 over them, as the unfused loss stores it over the
 * logits. */
static dw_status rows_bf16(dw_backend *be, const dw_op_call *c, head_run *h, int64_t r0, int64_t nc) {
    const int64_t V = h->V;
    float *f = (float *)dw_cpu_in(be, c, h->chunk, nc * V, CPU_S_OUT); /* scratch: ours to overwrite */
    if (!f) return DW_ERR_NOMEM;
    dw_cpu_head_xent_rows(c->train ? f : NULL, &h->sum, f, (const int32_t *)c->in[2] + r0, nc, V, h->scale);
    if (c->train) dw_cpu_put(c, h->chunk, f, nc * V, false);
    return DW_OK;
}

/* BF16 program: the head's BF16 GEMMs (linear_args.h) on the chunk's rows around rows_bf16. */
static dw_status chunk_bf16(dw_backend *be, const dw_op_call *c, head_run *h, int64_t r0, int64_t nc) {
    const int64_t K = h->K, V = h->V;
    const uint16_t *xc = (const uint16_t *)c->in[0] + r0 * K, *w = c->in_bf16[1];
    const dw_gemm_args fp = {.pass = DW_GEMM_FPROP, .m = nc, .n = V, .k = K, .a = dw_linear_bf16(xc, nc, K, false),
                             .b = dw_linear_bf16(w, V, K, true), .alpha = 1.0f, .d = h->chunk,
                             .out_type = DW_GEMM_OUT_BF16};
    DW_TRY(dw_gemm(be->ctx, &fp));
    DW_TRY(rows_bf16(be, c, h, r0, nc));
    if (!h->acc) return DW_OK;
    if (c->dx[0]) {
        void *dx = (uint16_t *)c->dx[0] + r0 * K;
        dw_gemm_args dg = {.pass = DW_GEMM_DGRAD, .m = nc, .n = K, .k = V, .a = dw_linear_bf16(h->chunk, nc, V, false),
                           .b = dw_linear_bf16(w, V, K, false), .alpha = 1.0f, .d = dx, .out_type = DW_GEMM_OUT_BF16};
        if (c->dx_acc[0]) dg.beta = 1.0f, dg.c = dx;
        DW_TRY(dw_gemm(be->ctx, &dg));
    }
    const float *dl = dw_cpu_in(be, c, h->chunk, nc * V, CPU_S_DOUT), *xf = dw_cpu_in(be, c, xc, nc * K, CPU_S_IN0);
    if (!dl || !xf) return DW_ERR_NOMEM;
    dw_cpu_head_xent_wgrad(h->acc, dl, xf, nc, K, V); /* the reference wgrad's products and order */
    return DW_OK;
}

/* Quantised head (fp8_block, ...: fuse.c): the head linear's own op on the chunk's rows
 * (linear_args.h dw_head_chunk_call), each GEMM quantised or kept BF16 as the unfused head's,
 * around rows_bf16. dW is added into by each chunk's wgrad. */
static dw_status chunk_quantised(dw_backend *be, const dw_op_call *c, head_run *h, int64_t r0, int64_t nc) {
    const dw_op_call l = dw_head_chunk_call(c, r0, nc, h->chunk);
    DW_TRY(dw_cpu_op_linear_fwd(be, &l));
    DW_TRY(rows_bf16(be, c, h, r0, nc));
    return c->train ? dw_cpu_op_linear_bwd(be, &l) : DW_OK;
}

dw_status dw_cpu_op_head_xent_fwd(dw_backend *be, const dw_op_call *c) {
    const dw_compiled *p = c->x->p;
    const int64_t N = c->rows, K = dw_cpu_width(c, c->n->in[0]), V = c->x->g->tensors[c->n->in[1]].shape[0];
    const int64_t nv = dw_count_valid(c->in[2], N, V);
    const bool quantised = dw_head_quantised(p);
    if (p->bf16 && !c->in_bf16[1] && !quantised)
        return dw_set_error(be->ctx, DW_ERR_INVALID, "cpu backend: the fused head's weight has no BF16 copy");
    head_run h = {.K = K, .V = V, .scale = nv > 0 ? c->dloss / (double)nv : 0.0,
                  .chunk = (char *)c->tmp[DW_TMP_XENT] + dw_compile_head_logits_off(p->g->batch * p->g->seq)};
    if (c->train && !quantised && !(h.acc = calloc((size_t)(V * K), sizeof *h.acc)))
        return dw_set_error(be->ctx, DW_ERR_NOMEM, "cpu backend: out of memory for the fused head's wgrad (%lld x %lld)",
                            (long long)V, (long long)K);
    dw_status st = DW_OK;
    for (int64_t r0 = 0; st == DW_OK && r0 < N; r0 += p->head_chunk) {
        const int64_t nc = N - r0 < p->head_chunk ? N - r0 : p->head_chunk;
        st = quantised ? chunk_quantised(be, c, &h, r0, nc)
             : p->bf16 ? chunk_bf16(be, c, &h, r0, nc)
                       : chunk_f32(be, c, &h, r0, nc);
    }
    if (st == DW_OK && h.acc) dw_cpu_head_xent_wgrad_end(c->pgrad[1], h.acc, V * K);
    free(h.acc);
    *(float *)c->out[0] = nv > 0 ? (float)(h.sum / (double)nv) : 0.0f;
    return st;
}

/* Done by the forward of the training step (ops.def BWD_IN_FWD): the program has no such step. */
dw_status dw_cpu_op_head_xent_bwd(dw_backend *be, const dw_op_call *c) {
    (void)c;
    return dw_set_error(be->ctx, DW_ERR_INVALID, "cpu backend: the fused head's backward runs in its forward");
}
