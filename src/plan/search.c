/* search.c — exhaustive, deterministic search over DP/TP/PP/CP/EP degrees, virtual stages,
 * micro-batch, recompute, ZeRO stage and optimizer offload. Every configuration is counted:
 * kept (top K by predicted step time), rejected with a reason, or pruned because its lower
 * bound (busiest stage without bubbles) is already slower than the K kept plans. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "plan/plan.h"

typedef struct {
    dw_plan_result *r;
    int top_k;
    const dw_plan_in *in;
} searcher;

static void reject(searcher *S, dw_reject why, const dw_par *p, const char *detail) {
    dw_rejections *rj = &S->r->rej;
    rj->count[why]++;
    int n = rj->n_examples[why];
    if (n == DW_PLAN_EXAMPLES) return;
    const int deg[5] = {p->dp, p->tp, p->pp, p->cp, p->ep};
    for (int i = 0; i < n; i++)
        if (!memcmp(rj->degrees[why][i], deg, sizeof deg)) return; /* same degrees: not new */
    memcpy(rj->degrees[why][n], deg, sizeof deg);
    char buf[160];
    dw_par_format(p, buf, sizeof buf);
    snprintf(rj->example[why][n], DW_PLAN_EXAMPLE_LEN, "%s: %s", buf, detail);
    rj->n_examples[why] = n + 1;
}

/* Ranking: plans Deepwell's engine runs as they are first (their times are the engine's own; the
 * others' come from the analytical model and need parallelism the runtime does not have), then
 * faster first; step times within 1e-9 of each other (e.g. ZeRO traffic fully hidden) prefer the
 * simpler plan (lower ZeRO stage, no offload), then lower peak memory. */
static bool better(const dw_plan_entry *a, const dw_plan_entry *b) {
    if (a->runs != b->runs) return a->runs;
    double tol = 1e-9 * (a->cost.step > b->cost.step ? a->cost.step : b->cost.step);
    if (a->cost.step < b->cost.step - tol) return true;
    if (a->cost.step > b->cost.step + tol) return false;
    if (a->par.zero != b->par.zero) return a->par.zero < b->par.zero;
    if (a->par.offload != b->par.offload) return !a->par.offload;
    return a->mem.total < b->mem.total;
}

/* The families' accounts: a rejection, or a timed member (exact when simulated, else its bound). */
static void family_rejected(searcher *S, unsigned mask, dw_reject why) {
    for (int f = 0; f < DW_FAMILY_COUNT; f++)
        if (mask >> f & 1) S->r->fam[f].rejected[why]++;
}
static void family_timed(searcher *S, unsigned mask, const dw_plan_entry *e, bool exact) {
    for (int f = 0; f < DW_FAMILY_COUNT; f++) {
        dw_family_stats *st = &S->r->fam[f];
        if (!(mask >> f & 1)) continue;
        st->feasible++;
        if (exact && (!st->simulated || better(e, &st->best))) {
            st->best = *e, st->simulated = true;
            dw_par_format(&e->par, st->best_summary, sizeof st->best_summary);
        }
        if (!exact && (st->lower_bound == 0 || e->cost.step < st->lower_bound)) st->lower_bound = e->cost.step;
    }
}

static void consider(searcher *S, const dw_par *p) {
    dw_plan_result *r = S->r;
    dw_plan_entry e;
    dw_reject why;
    char detail[160];
    unsigned mask = dw_family_mask(p);
    r->evaluated++;
    if (!dw_plan_evaluate(S->in, p, false, &e, &why, detail, sizeof detail)) {
        reject(S, why, p, detail);
        family_rejected(S, mask, why);
        return;
    }
    r->feasible++;
    bool full = r->n_plans == S->top_k;
    double bound = full ? r->plans[S->top_k - 1].cost.step : 0;
    /* a plan the engine runs outranks a kept one it does not, however slow: not pruned by time */
    bool prune = full && (!e.runs || r->plans[S->top_k - 1].runs);
    bool exact = dw_plan_time(S->in, p, &e, prune ? &bound : NULL);
    family_timed(S, mask, &e, exact);
    if (!exact) {
        snprintf(detail, sizeof detail, "lower bound %.4g s >= top-%d cut-off %.4g s", e.cost.step,
                 S->top_k, bound);
        reject(S, DW_REJECT_DOMINATED, p, detail);
        return;
    }
    if (full && !better(&e, &r->plans[S->top_k - 1])) {
        snprintf(detail, sizeof detail, "%.4g s >= top-%d cut-off %.4g s", e.cost.step, S->top_k, bound);
        reject(S, DW_REJECT_DOMINATED, p, detail);
        return;
    }
    /* the displaced K-th plan becomes a dominated alternative */
    if (full) reject(S, DW_REJECT_DOMINATED, &r->plans[S->top_k - 1].par, "displaced from the top K");
    int pos = r->n_plans < S->top_k ? r->n_plans : S->top_k - 1;
    while (pos > 0 && better(&e, &r->plans[pos - 1])) {
        r->plans[pos] = r->plans[pos - 1];
        pos--;
    }
    r->plans[pos] = e;
    if (r->n_plans < S->top_k) r->n_plans++;
}

void dw_plan_result_free(dw_plan_result *r) {
    if (!r) return;
    free(r->plans);
    memset(r, 0, sizeof *r);
}

dw_status dw_plan_search(dw_ctx *ctx, const dw_plan_in *in, int top_k, dw_plan_result *out) {
    memset(out, 0, sizeof *out);
    if (top_k < 1 || top_k > 100000) /* every plan of a search (bench/plan_vs_measured.py looks one up) */
        return dw_set_error(ctx, DW_ERR_INVALID, "top_k must be between 1 and 100000, got %d", top_k);
    out->plans = calloc((size_t)top_k, sizeof *out->plans);
    if (!out->plans) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    searcher S = {.r = out, .top_k = top_k, .in = in};
    int64_t N = in->n_gpus, L = in->cfg->n_layers, G = in->job.global_batch;
    int64_t dom = in->hw->nvlink_domain > 1 ? in->hw->nvlink_domain : 1;
    static const int cps[] = {1, 2, 4, 8, 16, 32};
    static const int vpps[] = {1, 2, 3, 4, 6, 8};
    static const struct { int zero; bool off; } zs[] = {{0, false}, {1, false}, {1, true}, {2, false},
                                                         {2, true},  {3, false}, {3, true}};
    for (int64_t tp = 1; tp <= N && tp <= 2 * dom; tp++) {
        if (N % tp) continue;
        for (size_t ci = 0; ci < sizeof cps / sizeof cps[0]; ci++) {
            int64_t cp = cps[ci];
            if ((N / tp) % cp || cp > in->job.seq) continue;
            for (int64_t pp = 1; pp <= N / (tp * cp) && pp <= L + 2; pp++) {
                if ((N / (tp * cp)) % pp) continue;
                int64_t dp = N / (tp * cp * pp);
                /* ep over the divisors of the expert count (1 for dense models) */
                for (int64_t ep = 1; ep <= (in->experts > 0 ? in->experts : 1); ep++) {
                    if (in->experts > 0 && in->experts % ep) continue;
                    /* schedules: 1F1B or interleaved by v; with EP also their all-to-all
                     * overlap, and DualPipe (v 1, even pp) */
                    int n_sched = ep > 1 ? (int)(sizeof vpps / sizeof vpps[0]) * 2 + 1 : (int)(sizeof vpps / sizeof vpps[0]);
                    for (int si = 0; si < n_sched; si++) {
                        bool dual = si == n_sched - 1 && ep > 1, ovl = ep > 1 && (dual || si % 2 == 1);
                        int v = dual ? 1 : vpps[ep > 1 ? si / 2 : si];
                        if (v > 1 && pp == 1) continue;
                        if (dual && (pp < 2 || pp % 2)) continue;
                        dw_par p = {.dp = (int)dp, .tp = (int)tp, .pp = (int)pp, .ep = (int)ep,
                                    .cp = (int)cp, .vpp = v, .a2a_overlap = ovl,
                                    .sched = dual ? DW_SCHED_DUALPIPE : v > 1 ? DW_SCHED_INTERLEAVED : DW_SCHED_1F1B};
                        if (G % dp) { /* no micro-batch size can work */
                            p.micro_batch = 1;
                            p.grad_accum = 0;
                            out->evaluated++;
                            char det[96];
                            snprintf(det, sizeof det, "global batch %lld %% dp %lld != 0", (long long)G,
                                     (long long)dp);
                            reject(&S, DW_REJECT_BATCH, &p, det);
                            family_rejected(&S, dw_family_mask(&p), DW_REJECT_BATCH);
                            continue;
                        }
                        /* expert TP: tp, or 1 (folded) for MoE models under TP */
                        for (int fold = 0; fold < (in->experts > 0 && tp > 1 ? 2 : 1); fold++)
                            for (int64_t mb = 1; mb <= G / dp && mb <= 32; mb++) {
                                if ((G / dp) % mb) continue;
                                p.etp = fold ? 1 : (int)tp;
                                p.micro_batch = mb;
                                p.grad_accum = G / (dp * mb);
                                for (int rc = 0; rc < DW_RECOMPUTE_COUNT; rc++)
                                    for (size_t zi = 0; zi < sizeof zs / sizeof zs[0]; zi++) {
                                        p.recompute = (dw_recompute)rc;
                                        p.zero = zs[zi].zero;
                                        p.offload = zs[zi].off;
                                        consider(&S, &p);
                                    }
                            }
                    }
                }
            }
        }
    }
    return DW_OK;
}
