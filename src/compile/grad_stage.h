/* grad_stage.h — private: ZeRO-2/3's gradient staging (train/dp_stage.c runs it): the flat
 * gradient pool cut into buckets on parameter boundaries, each parameter's gradient written by the
 * backward into its bucket's staging slot, the slot reduce-scattered (a reduce to each rank of its
 * shard's part) once the bucket is final and then reused by a later bucket. One rule, read by the
 * runtime (allocation, the slot of each bucket) and by the planner (plan/memory.c prices the
 * gradients per rank as the shard plus these slots), so report and allocation cannot drift. Pure
 * arithmetic over a program: no device. Not the shard cut (shard.h). */
#ifndef DW_COMPILE_GRAD_STAGE_H
#define DW_COMPILE_GRAD_STAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "compile/program.h"

/* The steps each parameter's gradient is first and last written at (first[k], last[k]; -1 when no
 * step reads it): the backward steps of the nodes reading it and the forward steps of ops that do
 * their backward there. A reader without such a step (fused into another node's step) counts from
 * the forward's first step to the backward's last. */
dw_status dw_grad_writers(dw_ctx *ctx, const dw_compiled *p, int *first, int *last);

/* The default buckets (DW_DP_BUCKET_FLOATS overrides both: train/dp_buckets.c). ZeRO-2/3's are
 * staging slots, memory of their own: 16 MiB. ZeRO-0/1's are views of the gradient pool, free in
 * memory, and fewer, longer collectives disturb the backward less: 256 MiB (moe-e64 on 2 H100s
 * 97.9k -> 124.7k tokens/s against 16 MiB, llama-1b 119.6k -> 124.1k; bench/RESULTS.md, session 21). */
enum { DW_GRAD_BUCKET_FLOATS = 4 << 20, DW_GRAD_POOL_BUCKET_FLOATS = 64 << 20 };
static inline int64_t dw_grad_bucket_default(int zero) {
    return zero >= 2 ? DW_GRAD_BUCKET_FLOATS : DW_GRAD_POOL_BUCKET_FLOATS;
}

typedef struct {
    int64_t begin, end; /* floats of the flat pool: whole parameters (and the padding after them) */
    int first, ready;   /* the steps its gradients are first written at and final after (-1: none) */
    int slot;           /* its staging slot */
} dw_stage_bucket;

typedef struct {
    int n;                  /* buckets, in the order they start: by ready, then from the pool's end */
    dw_stage_bucket *b;     /* (n), owned */
    int n_slots;
    int64_t slot_floats;    /* each slot's floats: the largest bucket's, a multiple of 64 */
} dw_grad_stage;

/* The buckets of p: parameters gathered from the pool's end up to bucket_floats (a larger
 * parameter alone), each with its writers' steps. reuse (the reductions start during backward): a
 * bucket takes a slot whose last bucket was final before this one's first write (the one final
 * earliest), else a new slot; without it every bucket has its own (the whole pool again). */
dw_status dw_grad_stage_plan(dw_ctx *ctx, const dw_compiled *p, int64_t bucket_floats, bool reuse,
                             dw_grad_stage *out);
void dw_grad_stage_free(dw_grad_stage *s);
/* The staging's bytes: slots x slot floats x 4. */
int64_t dw_grad_stage_bytes(const dw_grad_stage *s);

#endif /* DW_COMPILE_GRAD_STAGE_H */
