/* engine_grad_arena.h — private: what the engine (engine.c) asks before and after its calls when
 * the program keeps the gradients in the activation pool (program.h grad_arena). All no-ops for a
 * program with a standing gradient pool. */
#ifndef DW_RUNTIME_ENGINE_GRAD_ARENA_H
#define DW_RUNTIME_ENGINE_GRAD_ARENA_H

#include <stdbool.h>

#include "deepwell.h"

/* After the executor exists: DW_ERR_UNSUPPORTED when its gradients are a ZeRO-2/3 shard. */
dw_status dw_engine_arena_created(dw_engine *e);
/* A forward (without backward) ran: the gradients are gone until the next backward. */
void dw_engine_arena_forward(dw_engine *e);
/* Before a backward: with `accumulate` (dw_engine_forward_backward), DW_ERR_UNSUPPORTED when the
 * last backward's gradients still wait for the step; then they are pending. */
dw_status dw_engine_arena_backward(dw_engine *e, bool accumulate);
/* Before the step or a gradient read: DW_ERR_UNSUPPORTED naming `what` when a forward took them. */
dw_status dw_engine_arena_readable(dw_engine *e, const char *what);
/* After the step; after dw_engine_zero_grad (the gradients are zeros, readable). */
void dw_engine_arena_stepped(dw_engine *e);
void dw_engine_arena_zeroed(dw_engine *e);

#endif /* DW_RUNTIME_ENGINE_GRAD_ARENA_H */
