/* engine_refresh.c — dw_engine_refresh (engine.h): what derives from the FP32 masters (BF16 copies,
 * quantised weight caches) made again after the masters changed outside the optimizer (weights
 * loaded, a rollback, a ZeRO or expert-parallel step's gathered masters: train/dp*.c). Apart from
 * engine.c so that the engine, weights.c and the data-parallel runtimes share it; the copies a
 * bf16_arena backward took are made again by engine_grad_arena.c, which casts alone (the masters
 * did not change, so the quantised caches are still current). */
#include "core/error.h"
#include "runtime/engine.h"

dw_status dw_engine_refresh(dw_engine *e) {
    if (e->x->w_hi - e->x->w_lo != e->p->param_floats) return DW_OK; /* ZeRO-3 shard: made on each gather */
    DW_TRY(dw_exec_phase(e->x, DW_PHASE_REFRESH, false, 1.0));
    e->bf16_dirty = false; /* bf16_arena: the copies whole again */
    return e->be->i->sync(e->be);
}
