/* engine_float.c — dw_engine_forward_float: a feed-forward graph's forward on float activations
 * (ir/float_graph.h). The input goes where a token graph's tokens go (the workspace's input slot,
 * (B*T, C_in) in the activations' dtype), the forward phase runs, and the output activation
 * (B*T, C_out) comes back as FP32. Not the token path (engine.c). */
#include <stdlib.h>

#include "core/error.h"
#include "formats/formats.h"
#include "ir/float_graph.h"
#include "runtime/engine.h"

/* x (N, C_in) FP32 into the input slot: as it is in an FP32 program, as BF16 codes in a BF16 one. */
static dw_status upload_input(dw_engine *e, const float *x, int64_t n) {
    void *dst = e->x->work + e->p->work.tokens;
    if (!e->p->bf16) return e->be->i->upload(e->be, dst, x, (size_t)n * sizeof(float));
    uint16_t *h = malloc((size_t)n * sizeof *h);
    if (!h) return dw_set_error(e->ctx, DW_ERR_NOMEM, "engine: out of memory for %lld BF16 inputs", (long long)n);
    for (int64_t i = 0; i < n; i++) h[i] = dw_encode_bf16(x[i]);
    const dw_status s = e->be->i->upload(e->be, dst, h, (size_t)n * sizeof *h);
    free(h);
    return s;
}

/* The output activation (N, C_out) as FP32 into y (BF16 codes widened in place from the end). */
static dw_status download_output(dw_engine *e, float *y, int64_t n) {
    const void *src = e->x->act + e->p->tensor[e->g->logits].val_off;
    if (!e->p->bf16) return e->be->i->download(e->be, y, src, (size_t)n * sizeof(float));
    uint16_t *h = (uint16_t *)y + n;
    DW_TRY(e->be->i->download(e->be, h, src, (size_t)n * 2));
    for (int64_t i = 0; i < n; i++) y[i] = dw_decode_bf16(h[i]);
    return DW_OK;
}

dw_status dw_engine_forward_float(dw_engine *e, const float *x, int64_t B, int64_t T, float *y) {
    if (!e) return DW_ERR_INVALID;
    const dw_graph *g = e->g;
    if (!dw_graph_float_input(g))
        return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "engine: the model (%s) takes token ids, not float "
                            "activations: call dw_engine_forward", g->model.model_type);
    if (!x || !y) return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: forward_float needs an input and an output buffer");
    if (B < 1 || T < 1 || B > g->batch || T > g->seq)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "engine: batch %lld x %lld is outside the engine's capacity 1..%lld x "
                            "1..%lld", (long long)B, (long long)T, (long long)g->batch, (long long)g->seq);
    DW_TRY(dw_exec_set_batch(e->x, NULL, NULL, B, T));
    DW_TRY(upload_input(e, x, B * T * dw_graph_input_width(g)));
    DW_TRY(dw_exec_phase(e->x, DW_PHASE_FORWARD, false, 1.0));
    DW_TRY(download_output(e, y, B * T * dw_graph_output_width(g)));
    return e->be->i->sync(e->be);
}
