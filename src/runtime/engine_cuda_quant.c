/* engine_cuda_quant.c — the CUDA engine's quantised linear layers (see engine_cuda_quant.h).
 * Every operand is quantised from the current values (scales from the current amax; no delayed
 * scaling), all three in the node's recipe (fp8_block and fp8_block2d: W, W^T in 128x128 blocks, x
 * and dy in 1x128, DESIGN.md's block recipe, DeepSeek-V3's; compile.h): fprop x and W along K;
 * dgrad dy along M and W^T along M; wgrad dy^T and x^T along the tokens (dy and dy^T in one quantiser pass). W and W^T are
 * quantised once per weight update (dw_qlin_quantize_weight, in one pass) into the node's cache,
 * not per GEMM: micro-batches and both passes read the same codes. Gradients dy use the
 * node's element format too (E4M3 for fp8_*, as DeepSeek-V3's block recipe). NVFP4's tensor scale
 * stays on the device (dw_gemm_operand.tensor_scale_ptr): no host sync, CUDA-graph safe.
 * Not the BF16 path, not the quantiser kernels. */
#include <string.h>

#include "core/error.h"
#include "runtime/engine_cuda_quant.h"

void dw_qlin_reset(dw_qlin *q) { q->rows_tensor = q->xt_tensor = -1; }

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/quant.h"

/* One quantised operand in a slot of the workspace: device codes, scales, tensor scale. */
typedef dw_quant_dev_out qslot;

static qslot slot(const dw_qlin *q, const dw_qslot_layout *l) {
    char *base = q->work + l->off;
    qslot o = {.codes = (uint8_t *)base, .scales = base + l->scales, .tensor_scale = (float *)(base + l->tscale)};
    return o;
}

/* Quantises x [rows, cols] into a (and x^T into t when not NULL; a NULL: x^T alone). */
static dw_status quant(const dw_qlin *q, dw_recipe r, dw_quant_in in, const void *x, int64_t rows, int64_t cols,
                       qslot *a, qslot *t) {
    dw_quant_opts o = {.recipe = r, .rounding = DW_SCALE_RCEIL, .pow2 = false};
    return dw_quantize_cuda(q->ctx, &o, in, x, rows, cols, a, t, q->work + q->cp->work.quant_ws, q->stream);
}

static dw_gemm_operand op(dw_recipe r, const qslot *s, int64_t rows, int64_t cols, bool trans) {
    dw_gemm_operand o = {.recipe = r, .trans = trans, .rows = rows, .cols = cols, .data = s->codes,
                         .scales = s->scales, .tensor_scale = 1.0f,
                         .tensor_scale_ptr = r == DW_RECIPE_NVFP4 ? s->tensor_scale : NULL};
    return o;
}

/* The recipes of x, dy and of W under the node's recipe r (fp8_block*: 1x128 for x and dy,
 * 128x128 for W). */
static dw_recipe act(dw_recipe r) { return dw_compile_quant_act_recipe(r); }
static dw_recipe wrec(dw_recipe r) { return dw_compile_quant_weight_recipe(r); }

static bool ok(dw_recipe r, dw_qpass p, int64_t N, int64_t K, int64_t M) {
    return dw_compile_quant_pass_ok(r, p, N, K, M);
}

dw_status dw_qlin_quantize_weight(const dw_qlin *q, int node, const float *w, int64_t K, int64_t M) {
    const dw_qslot_layout *l = q->cp->wq[node];
    if (l[0].off < 0) return DW_OK;
    qslot ws = slot(q, &l[0]), wt = slot(q, &l[1]);
    return quant(q, wrec(q->cp->bind[node].recipe), DW_QUANT_IN_F32, w, M, K, &ws, &wt); /* W^T [K,M] along M */
}

/* The graph tensor a linear node reads as x. */
static int x_tensor(const dw_qlin *q, int node) { return q->cp->g->nodes[node].in[0]; }

dw_status dw_qlin_fprop(dw_qlin *q, int node, void *y, void *gelu_out, const void *x, const void *bias, int64_t N,
                        int64_t K, int64_t M, bool *done) {
    *done = false;
    const dw_recipe r = q->cp->bind[node].recipe;
    if (!ok(r, DW_QPASS_FPROP, N, K, M)) return DW_OK;
    qslot xs = slot(q, &q->cp->work.q_rows), ws = slot(q, &q->cp->wq[node][0]);
    const int xi = x_tensor(q, node);
    if (!q->reuse || q->rows_tensor != xi || q->rows_recipe != act(r)) { /* else a sibling quantised this x already */
        DW_TRY(quant(q, act(r), DW_QUANT_IN_BF16, x, N, K, &xs, NULL));
        q->rows_tensor = xi, q->rows_recipe = act(r);
    }
    dw_gemm_args a = {.pass = DW_GEMM_FPROP, .m = N, .n = M, .k = K, .a = op(act(r), &xs, N, K, false),
                      .b = op(wrec(r), &ws, M, K, true), .alpha = 1.0f, .d = y, .out_type = DW_GEMM_OUT_BF16};
    if (bias) {
        a.epilogue = DW_EPI_BIAS;
        a.bias = bias;
    }
    if (gelu_out) { /* GELU in the epilogue when the kernel this GEMM gets anyway has it, else a pass after */
        dw_gemm_args g = a;
        const char *plain = NULL, *fused = NULL;
        g.epilogue |= DW_EPI_GELU | DW_EPI_GELU_AUX;
        g.aux = y;
        g.d = gelu_out;
        if (dw_gemm_select(q->ctx, &a, &plain) == DW_OK && dw_gemm_select(q->ctx, &g, &fused) == DW_OK &&
            !strcmp(plain, fused)) { /* (a slower kernel for the sake of the epilogue is not a fusion) */
            DW_TRY(dw_gemm(q->ctx, &g));
            *done = true;
            return DW_OK;
        }
        dw_clear_error(q->ctx);
    }
    DW_TRY(dw_gemm(q->ctx, &a));
    if (gelu_out) DW_TRY(dw_cuda_gelu_fwd(q->ctx, DW_ACT_BF16, gelu_out, y, N * M, q->stream));
    *done = true;
    return DW_OK;
}

dw_status dw_qlin_bwd(dw_qlin *q, int node, void *dx, float *dw, const void *dy, const void *x, int64_t N,
                      int64_t K, int64_t M, bool *dgrad_done, bool *wgrad_done) {
    *dgrad_done = *wgrad_done = false;
    const dw_recipe r = q->cp->bind[node].recipe;
    /* where the plan has this dgrad add into its input's gradient (dx is then that gradient, no
     * scratch), the quantised GEMM adds too (beta = 1) */
    bool dg = dx && ok(r, DW_QPASS_DGRAD, N, K, M);
    bool wg = ok(r, DW_QPASS_WGRAD, N, K, M);
    if (!dg && !wg) return DW_OK;
    const dw_work_layout *l = &q->cp->work;
    qslot rows = slot(q, &l->q_rows), dyt = slot(q, &l->q_dyt), xt = slot(q, &l->q_xt);
    DW_TRY(quant(q, act(r), DW_QUANT_IN_BF16, dy, N, M, &rows, wg ? &dyt : NULL)); /* along M; dy^T along N */
    q->rows_tensor = -1;
    if (dg) {
        qslot wt = slot(q, &q->cp->wq[node][1]); /* W^T [K,M] along M, from the last weight refresh */
        dw_gemm_args a = {.pass = DW_GEMM_DGRAD, .m = N, .n = K, .k = M, .a = op(act(r), &rows, N, M, false),
                          .b = op(wrec(r), &wt, K, M, true), .alpha = 1.0f, .d = dx, .out_type = DW_GEMM_OUT_BF16};
        if (dw_compile_dgrad_accumulates(q->cp, node)) a.beta = 1.0f, a.c = dx; /* dx += dy W: a sibling wrote it */
        DW_TRY(dw_gemm(q->ctx, &a));
        *dgrad_done = true;
    }
    if (wg) { /* x^T [K,N] along N, alone where the kernel allows (the wgrad reads nothing else), else
               * with x's row-wise copy where dy was (dgrad has read it, stream order) */
        const int xi = x_tensor(q, node);
        if (!q->reuse || q->xt_tensor != xi || q->xt_recipe != act(r)) { /* else a sibling's backward left it there */
            const bool alone = dw_quantize_cuda_transposed_only_ok(act(r), DW_QUANT_IN_BF16, N, K);
            DW_TRY(quant(q, act(r), DW_QUANT_IN_BF16, x, N, K, alone ? NULL : &rows, &xt));
            q->rows_tensor = alone ? -1 : xi, q->xt_tensor = xi, q->rows_recipe = q->xt_recipe = act(r);
        }
        dw_gemm_args a = {.pass = DW_GEMM_WGRAD, .m = M, .n = K, .k = N, .a = op(act(r), &dyt, M, N, false),
                          .b = op(act(r), &xt, K, N, true), .alpha = 1.0f, .beta = 1.0f, .c = dw, .d = dw,
                          .out_type = DW_GEMM_OUT_F32};
        DW_TRY(dw_gemm(q->ctx, &a));
        *wgrad_done = true;
    }
    return DW_OK;
}

#else /* !DW_HAVE_CUDA: the engine itself refuses to be created */

static dw_status no_cuda(const dw_qlin *q) {
    return dw_set_error(q->ctx, DW_ERR_UNSUPPORTED, "quantised linear: this build has no CUDA");
}
dw_status dw_qlin_quantize_weight(const dw_qlin *q, int node, const float *w, int64_t K, int64_t M) {
    (void)node, (void)w, (void)K, (void)M;
    return no_cuda(q);
}
dw_status dw_qlin_fprop(dw_qlin *q, int node, void *y, void *gelu_out, const void *x, const void *bias, int64_t N,
                        int64_t K, int64_t M, bool *done) {
    (void)node, (void)y, (void)gelu_out, (void)x, (void)bias, (void)N, (void)K, (void)M;
    *done = false;
    return no_cuda(q);
}
dw_status dw_qlin_bwd(dw_qlin *q, int node, void *dx, float *dw, const void *dy, const void *x, int64_t N,
                      int64_t K, int64_t M, bool *dgrad_done, bool *wgrad_done) {
    (void)node, (void)dx, (void)dw, (void)dy, (void)x, (void)N, (void)K, (void)M;
    *dgrad_done = *wgrad_done = false;
    return no_cuda(q);
}

#endif /* DW_HAVE_CUDA */
