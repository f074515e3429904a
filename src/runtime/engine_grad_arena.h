/* engine_grad_arena.h — private: what the engine (engine.c) asks before and after its calls when
 * the program keeps the gradients in the activation pool (program.h grad_arena). All no-ops for a
 * program with a standing gradient pool. */
#ifndef DW_RUNTIME_ENGINE_GRAD_ARENA_H
#define DW_RUNTIME_ENGINE_GRAD_ARENA_H

#include <stdbool.h>

#include "deepwell.h"

/* After the executor exists: DW_ERR_UNSUPPORTED when its gradients are a ZeRO-2/3 shard. */
dw_status dw_engine_arena_created(dw_engine *e);
/* Before a forward (without backward): the gradients are gone until the next backward; under
 * bf16_arena the BF16 copies are made again first if a backward took some of their memory. */
dw_status dw_engine_arena_forward(dw_engine *e);
/* Before a backward: with `accumulate` (dw_engine_forward_backward), DW_ERR_UNSUPPORTED when the
 * last backward's gradients still wait for the step; the BF16 copies made again as for a forward;
 * then the gradients are pending (and, bf16_arena, the copies taken until the step's refresh). */
dw_status dw_engine_arena_backward(dw_engine *e, bool accumulate);
/* Before the step or a gradient read: DW_ERR_UNSUPPORTED naming `what` when a forward took them;
 * the zeros dw_engine_zero_grad deferred are written first. */
dw_status dw_engine_arena_readable(dw_engine *e, const char *what);
/* After the step (and any other run of the optimizer phase, whose refresh remakes the copies). */
void dw_engine_arena_stepped(dw_engine *e);
/* dw_engine_zero_grad: true for a grad_arena program, whose zeros are then written only if read
 * (a step or gradient read before the next backward) — the backward's ZERO_GRAD steps zero every
 * slice anyway, so a training step writes no zeros twice; false: zero the pool now. */
bool dw_engine_arena_zero_later(dw_engine *e);

#endif /* DW_RUNTIME_ENGINE_GRAD_ARENA_H */
