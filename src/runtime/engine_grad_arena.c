/* engine_grad_arena.c — the engine's rules for programs that keep the gradients in the activation
 * pool (dw_compile_opts.grad_arena, compile/grad_arena.c): one backward per optimizer step, no
 * step or gradient read once a forward has taken the gradients' memory, no ZeRO-2/3 shard of them.
 * Each call is a no-op (DW_OK) for a program with a standing gradient pool. */
#include "compile/program.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/engine_grad_arena.h"

#define WHY "the program keeps the gradients in the activation pool (dw_compile_opts.grad_arena, DW_GRAD_ARENA=1)"

dw_status dw_engine_arena_created(dw_engine *e) {
    if (!e->p->grad_arena || e->x->grad_hi - e->x->grad_lo == e->p->param_floats) return DW_OK;
    return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "engine: ZeRO-%d shards and stages the gradients, but %s; "
                        "compile without grad_arena (DW_GRAD_ARENA=0) for ZeRO-2/3", e->opts.zero, WHY);
}

/* bf16_arena: the BF16 copies again from the masters where a backward (or zeros) overwrote some —
 * the refresh phase's casts, and the quantisations of the MoE caches kept in the copies' rooms
 * (wcache_arena), alone. The masters have not changed since the last refresh (each change of them
 * refreshes and clears bf16_dirty: the step, dw_engine_refresh), so the other quantised weight
 * caches (workspace, not the arena) still hold them; quantising those again would add their counts
 * a second time to the step's w counters (precision/quant_counts.h) — the step after one the guard
 * skipped — and, under amax histories, requantise them under newer scales than the pools do. The
 * arena's MoE caches have neither: their scales (fp8_block's 128x128, mxfp8's 1x32) are the
 * masters' own, the same bits again, and no counter counts them. */
static bool arena_cache(const dw_compiled *p, const dw_step *st) {
    return st->kind == DW_STEP_QUANT_W && p->node[st->node].wq[0].codes_act >= 0;
}

static dw_status fresh_copies(dw_engine *e) {
    if (!e->bf16_dirty) return DW_OK;
    dw_exec *x = e->x;
    const dw_compiled *p = e->p;
    dw_exec_begin_phase(x, DW_PHASE_REFRESH);
    for (int s = p->phase[DW_PHASE_REFRESH][0]; s < p->phase[DW_PHASE_REFRESH][1]; s++)
        if (p->steps[s].kind == DW_STEP_CAST_BF16 || arena_cache(p, &p->steps[s])) DW_TRY(dw_exec_step(x, s, false, 1.0));
    e->bf16_dirty = false;
    return DW_OK;
}

dw_status dw_engine_arena_forward(dw_engine *e) {
    if (!e->p->grad_arena) return DW_OK;
    DW_TRY(fresh_copies(e));
    e->grads_stale = true; /* the forward's activations took the slices */
    e->grads_pending = e->grads_zero_due = false;
    return DW_OK;
}

dw_status dw_engine_arena_backward(dw_engine *e, bool accumulate) {
    if (!e->p->grad_arena) return DW_OK;
    if (accumulate && e->grads_pending)
        return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "engine: a second backward before dw_engine_step (gradient "
                            "accumulation over micro-batches) needs a standing gradient pool, but %s: step or "
                            "dw_engine_zero_grad first, or compile without grad_arena (DW_GRAD_ARENA=0)", WHY);
    DW_TRY(fresh_copies(e));
    e->grads_pending = true, e->grads_stale = e->grads_zero_due = false; /* its ZERO_GRAD steps zero them */
    e->bf16_dirty = e->p->bf16_arena; /* the backward takes the memory of copies it has read last */
    return DW_OK;
}

dw_status dw_engine_arena_readable(dw_engine *e, const char *what) {
    if (!e->p->grad_arena) return DW_OK;
    if (e->grads_zero_due) { /* dw_engine_zero_grad's zeros, made now that they are read */
        e->grads_zero_due = false;
        e->bf16_dirty = e->p->bf16_arena; /* the zeros may cover copies */
        DW_TRY(e->be->i->zero(e->be, e->x->grad, (size_t)e->p->param_floats * sizeof(float)));
        if (e->p->work.wsumsq < 0) return DW_OK; /* and the experts' squares the norm adds (wgrad_sumsq.h) */
        return e->be->i->zero(e->be, e->x->work + e->p->work.wsumsq, (size_t)e->p->work.wsumsq_parts * sizeof(double));
    }
    if (!e->grads_stale) return DW_OK;
    return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "%s: a forward ran after the last backward%s and reused the "
                        "gradients' memory, since %s; run the backward again (or dw_engine_zero_grad)", what,
                        e->p->bf16_arena ? " (or the step's BF16 copies, dw_compile_opts.bf16_arena)" : "", WHY);
}

void dw_engine_arena_stepped(dw_engine *e) {
    e->grads_pending = e->bf16_dirty = false; /* its refresh ran */
    if (e->p->bf16_arena) e->grads_stale = true; /* and wrote copies over some gradients */
}

bool dw_engine_arena_zero_later(dw_engine *e) {
    if (!e->p->grad_arena) return false;
    e->grads_pending = e->grads_stale = false;
    e->grads_zero_due = true;
    return true;
}
