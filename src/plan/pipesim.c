/* pipesim.c — event simulation of one training step of a pipeline schedule: 1F1B (PipeDream-
 * Flush) and interleaved 1F1B with virtual stages (Megatron-LM order). Each rank runs its ops in
 * schedule order; an op starts when its rank is free and its input (activation from the previous
 * virtual stage, gradient from the next) has arrived over a p2p hop. No closed forms here. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "plan/plan.h"

int dw_pipe_warmup(int p, int v, int m, int stage) {
    int w = v == 1 ? p - stage - 1 : (p - stage - 1) * 2 + (v - 1) * p;
    return w < m * v ? w : m * v;
}

int dw_pipe_inflight(int p, int v, int m, int stage) {
    int w = dw_pipe_warmup(p, v, m, stage) + 1;
    return w < m * v ? w : m * v;
}

/* The k-th forward (or backward) op of a rank: its micro-batch and chunk. */
static void kth(int p, int v, int k, bool bwd, int *mb, int *chunk) {
    if (v == 1) {
        *mb = k;
        *chunk = 0;
        return;
    }
    int group = k / (p * v), r = k % (p * v);
    *chunk = bwd ? v - 1 - r / p : r / p;
    *mb = group * p + r % p;
}

void dw_sim_out_free(dw_sim_out *o) {
    if (!o) return;
    free(o->busy);
    free(o->max_inflight);
    free(o->ops);
    memset(o, 0, sizeof *o);
}

dw_status dw_pipe_simulate(dw_ctx *ctx, const dw_sim_in *in, bool keep_ops, dw_sim_out *out) {
    memset(out, 0, sizeof *out);
    int p = in->p, v = in->v, m = in->m;
    if (p < 1 || v < 1 || m < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "pipeline: p, v, m must be positive (%d, %d, %d)", p, v, m);
    if (v > 1 && m % p)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "pipeline: interleaving needs micro-batches (%d) divisible by stages (%d)", m, p);
    int P = p * v;
    int64_t per_stage = 2 * (int64_t)m * v, total = per_stage * p;
    double *fdone = malloc(sizeof(double) * (size_t)m * (size_t)P);
    double *bdone = malloc(sizeof(double) * (size_t)m * (size_t)P);
    int64_t *next = calloc((size_t)p, sizeof *next);
    int *inflight = calloc((size_t)p, sizeof *inflight);
    double *free_at = calloc((size_t)p, sizeof *free_at);
    out->busy = calloc((size_t)p, sizeof *out->busy);
    out->max_inflight = calloc((size_t)p, sizeof *out->max_inflight);
    if (keep_ops) out->ops = malloc(sizeof *out->ops * (size_t)total);
    if (!fdone || !bdone || !next || !inflight || !free_at || !out->busy || !out->max_inflight ||
        (keep_ops && !out->ops)) {
        free(fdone), free(bdone), free(next), free(inflight), free(free_at);
        dw_sim_out_free(out);
        return dw_set_error(ctx, DW_ERR_NOMEM, "pipeline simulation: out of memory");
    }
    for (int64_t i = 0; i < (int64_t)m * P; i++) fdone[i] = bdone[i] = -1;
    int64_t done = 0;
    while (done < total) {
        bool progress = false;
        for (int s = 0; s < p; s++) {
            int w = dw_pipe_warmup(p, v, m, s);
            while (next[s] < per_stage) {
                /* op index i: warmup forwards, then (F, B) pairs, then cooldown backwards */
                int64_t i = next[s];
                bool bwd;
                int64_t k;
                if (i < w) bwd = false, k = i;
                else if (i < w + 2 * ((int64_t)m * v - w)) {
                    int64_t j = i - w;
                    bwd = j % 2 == 1;
                    k = bwd ? j / 2 : w + j / 2;
                } else bwd = true, k = i - ((int64_t)m * v);
                int mb, chunk;
                kth(p, v, (int)k, bwd, &mb, &chunk);
                int vs = chunk * p + s;
                double ready;
                if (!bwd) {
                    if (vs == 0) ready = 0;
                    else {
                        double t = fdone[(int64_t)mb * P + vs - 1];
                        if (t < 0) break;
                        ready = t + (p > 1 ? in->p2p : 0);
                    }
                } else if (vs == P - 1) {
                    ready = fdone[(int64_t)mb * P + vs];
                    if (ready < 0) break;
                } else {
                    double t = bdone[(int64_t)mb * P + vs + 1];
                    if (t < 0) break;
                    ready = t + (p > 1 ? in->p2p : 0);
                }
                double dur = bwd ? in->bwd[vs] : in->fwd[vs];
                double start = ready > free_at[s] ? ready : free_at[s];
                double end = start + dur;
                free_at[s] = end;
                out->busy[s] += dur;
                (bwd ? bdone : fdone)[(int64_t)mb * P + vs] = end;
                if (!bwd && ++inflight[s] > out->max_inflight[s]) out->max_inflight[s] = inflight[s];
                if (bwd) inflight[s]--;
                if (keep_ops)
                    out->ops[out->n_ops++] = (dw_sim_op){.stage = s, .chunk = chunk, .mb = mb,
                                                         .kind = bwd ? DW_OP_B : DW_OP_F,
                                                         .start = start, .end = end};
                if (end > out->makespan) out->makespan = end;
                next[s]++;
                done++;
                progress = true;
            }
        }
        DW_ASSERT_MSG(progress, "pipeline schedule deadlocked");
    }
    free(fdone), free(bdone), free(next), free(inflight), free(free_at);
    return DW_OK;
}
