/* engine_moe_bias.c — the routers' selection bias in the workspace (engine_moe_bias.h): an int32
 * switch, then a row of FP32 per router node. */
#include "runtime/engine_moe_bias.h"

#include "core/error.h"
#include "runtime/engine.h"

void dw_engine_moe_bias_shape(const dw_engine *e, int64_t *layers, int64_t *experts) {
    const dw_work_layout *w = &e->p->work;
    *layers = w->moe_bias >= 0 ? w->moe_bias_layers : 0;
    *experts = *layers ? w->moe_bias_experts : 0;
}

static dw_status no_router(dw_engine *e) {
    return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "engine: the model has no MoE router to bias");
}

dw_status dw_engine_moe_bias_set(dw_engine *e, const float *bias) {
    const dw_work_layout *w = &e->p->work;
    if (w->moe_bias < 0) return no_router(e);
    const int32_t on = bias != NULL;
    char *at = e->x->work + w->moe_bias;
    if (bias)
        DW_TRY(e->be->i->upload(e->be, at + DW_MOE_BIAS_ROWS, bias,
                                (size_t)(w->moe_bias_layers * w->moe_bias_experts) * sizeof *bias));
    return e->be->i->upload(e->be, at, &on, sizeof on);
}

dw_status dw_engine_moe_bias_get(dw_engine *e, float *bias, bool *on) {
    const dw_work_layout *w = &e->p->work;
    if (w->moe_bias < 0) return no_router(e);
    const char *at = e->x->work + w->moe_bias;
    int32_t flag = 0;
    DW_TRY(e->be->i->download(e->be, &flag, at, sizeof flag));
    if (on) *on = flag != 0;
    if (!bias) return DW_OK;
    return e->be->i->download(e->be, bias, at + DW_MOE_BIAS_ROWS,
                              (size_t)(w->moe_bias_layers * w->moe_bias_experts) * sizeof *bias);
}
