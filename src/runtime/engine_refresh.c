/* engine_refresh.c — dw_engine_refresh (engine.h): what derives from the FP32 masters (BF16 copies,
 * quantised weight caches) made again after the masters changed outside the optimizer (weights
 * loaded, a rollback) or after bf16_arena's backward took some copies' memory (engine_grad_arena.c).
 * Apart from engine.c so that the engine and its gradient-arena rules both call it without calling
 * each other. */
#include "core/error.h"
#include "runtime/engine.h"

dw_status dw_engine_refresh(dw_engine *e) {
    if (e->x->w_hi - e->x->w_lo != e->p->param_floats) return DW_OK; /* ZeRO-3 shard: made on each gather */
    DW_TRY(dw_exec_phase(e->x, DW_PHASE_REFRESH, false, 1.0));
    e->bf16_dirty = false; /* bf16_arena: the copies whole again */
    return e->be->i->sync(e->be);
}
