/* pipesim.c — event simulation of one training step of a pipeline schedule: 1F1B (PipeDream-
 * Flush) and interleaved 1F1B with virtual stages (Megatron-LM order), optionally with a steady
 * backward merged with the next forward so each hides the other's all-to-all. Each rank runs its
 * ops in schedule order; an op starts when its rank is free and its input (activation from the
 * previous virtual stage, gradient from the next) has arrived over a p2p hop. No closed forms.
 * DualPipe is pipesim_dual.c's; the output buffers and a merged chunk's time, pipesim_common.c's. */
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

/* The op at schedule position i of a rank with w warm-up forwards: kind and its k-th index. */
static void op_at(int64_t i, int w, int64_t mv, bool *bwd, int64_t *k) {
    if (i < w) *bwd = false, *k = i;
    else if (i < w + 2 * (mv - w)) {
        int64_t j = i - w;
        *bwd = j % 2 == 1;
        *k = *bwd ? j / 2 : w + j / 2;
    } else *bwd = true, *k = i - mv;
}

dw_status dw_pipe_simulate(dw_ctx *ctx, const dw_sim_in *in, bool keep_ops, dw_sim_out *out) {
    memset(out, 0, sizeof *out);
    if (in->dual) return dw_pipe_simulate_dual(ctx, in, keep_ops, out);
    int p = in->p, v = in->v, m = in->m;
    if (p < 1 || v < 1 || m < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "pipeline: p, v, m must be positive (%d, %d, %d)", p, v, m);
    if (v > 1 && m % p)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "pipeline: interleaving needs micro-batches (%d) divisible by stages (%d)", m, p);
    int P = p * v;
    int64_t per_stage = 2 * (int64_t)m * v, total = per_stage * p, mv = (int64_t)m * v;
    double *fdone = malloc(sizeof(double) * (size_t)m * (size_t)P);
    double *bdone = malloc(sizeof(double) * (size_t)m * (size_t)P);
    int64_t *next = calloc((size_t)p, sizeof *next);
    int *inflight = calloc((size_t)p, sizeof *inflight);
    double *free_at = calloc((size_t)p, sizeof *free_at);
    if (!fdone || !bdone || !next || !inflight || !free_at ||
        dw_sim_out_alloc(ctx, p, total, keep_ops, out) != DW_OK) {
        free(fdone), free(bdone), free(next), free(inflight), free(free_at);
        return dw_set_error(ctx, DW_ERR_NOMEM, "pipeline simulation: out of memory");
    }
    for (int64_t i = 0; i < (int64_t)m * P; i++) fdone[i] = bdone[i] = -1;
    int64_t done = 0;
    while (done < total) {
        bool progress = false;
        for (int s = 0; s < p; s++) {
            int w = dw_pipe_warmup(p, v, m, s);
            while (next[s] < per_stage) {
                /* op index i: warmup forwards, then (F, B) pairs, then cooldown backwards; with
                 * overlap a steady backward runs merged with the forward after it */
                int64_t i = next[s], k;
                bool bwd;
                op_at(i, w, mv, &bwd, &k);
                int n_ops = in->overlap && bwd && i >= w && i + 1 < w + 2 * (mv - w) ? 2 : 1;
                int mbs[2], vss[2];
                bool kinds[2];
                double ready = 0;
                bool ok = true;
                for (int o = 0; o < n_ops && ok; o++) {
                    bool b = bwd;
                    int64_t kk = k;
                    if (o == 1) op_at(i + 1, w, mv, &b, &kk);
                    int mb, chunk;
                    kth(p, v, (int)kk, b, &mb, &chunk);
                    int vs = chunk * p + s;
                    double r;
                    if (!b) {
                        if (vs == 0) r = 0;
                        else {
                            double t = fdone[(int64_t)mb * P + vs - 1];
                            r = t < 0 ? -1 : t + (p > 1 ? in->p2p : 0);
                        }
                    } else if (vs == P - 1) {
                        r = fdone[(int64_t)mb * P + vs];
                    } else {
                        double t = bdone[(int64_t)mb * P + vs + 1];
                        r = t < 0 ? -1 : t + (p > 1 ? in->p2p : 0);
                    }
                    if (r < 0) ok = false;
                    if (r > ready) ready = r;
                    mbs[o] = mb, vss[o] = vs, kinds[o] = b;
                }
                if (!ok) break;
                double start = ready > free_at[s] ? ready : free_at[s], dur, ex, hid = 0;
                if (n_ops == 2) {
                    /* ops[0] is the backward, ops[1] the forward */
                    double fc = in->fcomm ? in->fcomm[vss[1]] : 0, bc = in->bcomm ? in->bcomm[vss[0]] : 0;
                    dur = dw_pipe_merged(in->fwd[vss[1]], fc, in->bwd[vss[0]], bc, &ex, &hid);
                } else {
                    double *cm = kinds[0] ? (double *)in->bcomm : (double *)in->fcomm;
                    dur = kinds[0] ? in->bwd[vss[0]] : in->fwd[vss[0]];
                    ex = cm ? cm[vss[0]] : 0;
                }
                double end = start + dur;
                free_at[s] = end;
                out->busy[s] += dur;
                out->comm_exposed[s] += ex, out->comm_hidden[s] += hid;
                double op_start = start;
                for (int o = 0; o < n_ops; o++) {
                    bool b = kinds[o];
                    (b ? bdone : fdone)[(int64_t)mbs[o] * P + vss[o]] = end;
                    if (!b && ++inflight[s] > out->max_inflight[s]) out->max_inflight[s] = inflight[s];
                    if (b) inflight[s]--;
                    /* a merged pair is drawn as its two halves in proportion to their work;
                     * both results count as ready at its end */
                    double part = n_ops == 1 ? dur
                                             : dur * (b ? in->bwd[vss[o]] : in->fwd[vss[o]]) /
                                                   (in->bwd[vss[0]] + in->fwd[vss[1]]);
                    if (keep_ops)
                        out->ops[out->n_ops++] = (dw_sim_op){.stage = s, .chunk = vss[o] / p, .mb = mbs[o],
                                                             .kind = b ? DW_OP_B : DW_OP_F,
                                                             .start = op_start, .end = o == n_ops - 1 ? end : op_start + part};
                    op_start += part;
                }
                if (end > out->makespan) out->makespan = end;
                next[s] += n_ops;
                done += n_ops;
                progress = true;
            }
        }
        DW_ASSERT_MSG(progress, "pipeline schedule deadlocked");
    }
    free(fdone), free(bdone), free(next), free(inflight), free(free_at);
    return DW_OK;
}
