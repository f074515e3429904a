/* pipesim_dual.c — event simulation of DualPipe (DeepSeek-V3): a bidirectional pipeline. Half of
 * the m micro-batches enter at rank 0 and run model stages 0..p-1 on ranks 0..p-1 ("down"), the
 * other half enter at rank p-1 and run stages 0..p-1 on ranks p-1..0 ("up"), so rank s holds
 * stages s and p-1-s. Each rank keeps at most p-s (down) and s+1 (up) micro-batches in flight
 * (p+1 in all, DualPipe's activation memory) and runs, whenever it is free, the ready op that can
 * start first (backward before forward on ties); a backward and a forward that are both ready run
 * merged as one F&B chunk, each hiding the other's all-to-all (dw_pipe_merged). A list schedule
 * of DualPipe's structure, not its exact hand-written op order; the weight-gradient split of
 * zero-bubble schedules is not modelled. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "plan/plan.h"

typedef struct {
    int p, m2;          /* ranks; micro-batches per direction */
    double *fdone, *bdone; /* [2][m2][p] end time by direction, micro-batch, model stage; -1 not yet */
} dual_state;

static double *at(double *a, const dual_state *S, int dir, int mb, int stage) {
    return &a[((int64_t)dir * S->m2 + mb) * S->p + stage];
}

/* Model stage of rank s in direction dir, and the rank that runs stage `st` of that direction. */
static int stage_of(int p, int dir, int s) { return dir == 0 ? s : p - 1 - s; }

/* When the next forward (or backward) of direction dir on rank s could start its input; -1 when
 * the input is not known yet or the op does not exist. */
static double ready_f(const dual_state *S, const dw_sim_in *in, int dir, int s, int mb) {
    int st = stage_of(S->p, dir, s);
    if (st == 0) return 0;
    double t = *at(S->fdone, S, dir, mb, st - 1);
    return t < 0 ? -1 : t + in->p2p;
}
static double ready_b(const dual_state *S, const dw_sim_in *in, int dir, int s, int mb) {
    int st = stage_of(S->p, dir, s);
    if (*at(S->fdone, S, dir, mb, st) < 0) return -1;
    if (st == S->p - 1) return *at(S->fdone, S, dir, mb, st);
    double t = *at(S->bdone, S, dir, mb, st + 1);
    return t < 0 ? -1 : t + in->p2p;
}

dw_status dw_pipe_simulate_dual(dw_ctx *ctx, const dw_sim_in *in, bool keep_ops, dw_sim_out *out) {
    memset(out, 0, sizeof *out);
    int p = in->p, m = in->m;
    if (p < 2 || p % 2 || m < 2 || m % 2 || in->v != 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "DualPipe: needs an even number of stages (%d) and of "
                            "micro-batches (%d), one chunk per direction (v %d)", p, m, in->v);
    dual_state S = {.p = p, .m2 = m / 2};
    int64_t cells = 2 * (int64_t)S.m2 * p, total = 2 * (int64_t)m * p;
    S.fdone = malloc(sizeof(double) * (size_t)cells);
    S.bdone = malloc(sizeof(double) * (size_t)cells);
    /* per rank and direction: next forward, next backward, in flight */
    int *nf = calloc((size_t)(2 * p), sizeof *nf), *nb = calloc((size_t)(2 * p), sizeof *nb);
    int *fly = calloc((size_t)(2 * p), sizeof *fly), *tot = calloc((size_t)p, sizeof *tot);
    double *free_at = calloc((size_t)p, sizeof *free_at);
    if (!S.fdone || !S.bdone || !nf || !nb || !fly || !tot || !free_at ||
        dw_sim_out_alloc(ctx, p, total, keep_ops, out) != DW_OK) {
        free(S.fdone), free(S.bdone), free(nf), free(nb), free(fly), free(tot), free(free_at);
        return dw_set_error(ctx, DW_ERR_NOMEM, "DualPipe simulation: out of memory");
    }
    for (int64_t i = 0; i < cells; i++) S.fdone[i] = S.bdone[i] = -1;
    for (int64_t done = 0; done < total;) {
        /* every rank's best candidate; the one starting first is committed (causal order: any op
         * that could feed it starts earlier and is already committed) */
        int best_s = -1, best_dir = 0;
        bool best_b = false;
        double best_start = 0;
        for (int s = 0; s < p; s++)
            for (int b = 1; b >= 0; b--)
                for (int dir = 0; dir < 2; dir++) {
                    int k = 2 * s + dir, cap = dir == 0 ? p - s : s + 1;
                    double r;
                    if (b) r = nb[k] < nf[k] ? ready_b(&S, in, dir, s, nb[k]) : -1;
                    else r = nf[k] < S.m2 && fly[k] < cap ? ready_f(&S, in, dir, s, nf[k]) : -1;
                    if (r < 0) continue;
                    double st = r > free_at[s] ? r : free_at[s];
                    if (best_s < 0 || st < best_start) best_s = s, best_dir = dir, best_b = b, best_start = st;
                }
        DW_ASSERT_MSG(best_s >= 0, "DualPipe schedule deadlocked");
        int s = best_s;
        /* its partner of the other kind, ready by then, to merge with */
        int pdir = -1;
        for (int dir = 0; dir < 2 && pdir < 0; dir++) {
            int k = 2 * s + dir, cap = dir == 0 ? p - s : s + 1;
            double r = -1;
            if (best_b) r = nf[k] < S.m2 && fly[k] < cap ? ready_f(&S, in, dir, s, nf[k]) : -1;
            else r = nb[k] < nf[k] ? ready_b(&S, in, dir, s, nb[k]) : -1;
            if (r >= 0 && r <= best_start) pdir = dir;
        }
        int dirs[2] = {best_dir, pdir};
        bool kinds[2] = {best_b, !best_b};
        int n_ops = pdir >= 0 ? 2 : 1;
        if (n_ops == 2 && !best_b) { /* keep the backward first */
            dirs[0] = pdir, dirs[1] = best_dir, kinds[0] = true, kinds[1] = false;
        }
        int stg[2], mbs[2];
        for (int o = 0; o < n_ops; o++) {
            int k = 2 * s + dirs[o];
            stg[o] = stage_of(p, dirs[o], s);
            mbs[o] = kinds[o] ? nb[k] : nf[k];
        }
        double dur, ex, hid = 0;
        if (n_ops == 2) {
            double fc = in->fcomm ? in->fcomm[stg[1]] : 0, bc = in->bcomm ? in->bcomm[stg[0]] : 0;
            dur = dw_pipe_merged(in->fwd[stg[1]], fc, in->bwd[stg[0]], bc, &ex, &hid);
        } else {
            const double *cm = kinds[0] ? in->bcomm : in->fcomm;
            dur = kinds[0] ? in->bwd[stg[0]] : in->fwd[stg[0]];
            ex = cm ? cm[stg[0]] : 0;
        }
        double end = best_start + dur, t0 = best_start;
        free_at[s] = end;
        out->busy[s] += dur;
        out->comm_exposed[s] += ex, out->comm_hidden[s] += hid;
        for (int o = 0; o < n_ops; o++) {
            int k = 2 * s + dirs[o];
            *at(kinds[o] ? S.bdone : S.fdone, &S, dirs[o], mbs[o], stg[o]) = end;
            if (kinds[o]) nb[k]++, fly[k]--, tot[s]--;
            else {
                nf[k]++, fly[k]++;
                if (++tot[s] > out->max_inflight[s]) out->max_inflight[s] = tot[s];
            }
            double part = n_ops == 1 ? dur
                                     : dur * (kinds[o] ? in->bwd[stg[o]] : in->fwd[stg[o]]) /
                                           (in->bwd[stg[0]] + in->fwd[stg[1]]);
            if (keep_ops)
                out->ops[out->n_ops++] = (dw_sim_op){.stage = s, .chunk = dirs[o], .mb = mbs[o] + dirs[o] * S.m2,
                                                     .kind = kinds[o] ? DW_OP_B : DW_OP_F, .start = t0,
                                                     .end = o == n_ops - 1 ? end : t0 + part};
            t0 += part;
        }
        if (end > out->makespan) out->makespan = end;
        done += n_ops;
    }
    free(S.fdone), free(S.bdone), free(nf), free(nb), free(fly), free(tot), free(free_at);
    return DW_OK;
}
