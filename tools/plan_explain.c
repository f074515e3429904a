/* plan_explain.c — `deepwell plan --explain`: the kept candidates with their predicted step split
 * into compute, exposed communication (TP, CP, EP, DP), recomputation, bubble and optimizer, and
 * memory on their worst rank; why each runner-up lost (its largest excess over the best); the best
 * plan's memory per pipeline rank and layer layout; each family of configurations (pipeline
 * schedules, TP, CP, EP, ZeRO-3, ...) kept or why not; and the rejection counts by constraint.
 * Reads only deepwell.h. */
#include <stdio.h>
#include <string.h>

#include "plan_explain.h"

#define TRY(x) do { dw_status s_ = (x); if (s_ != DW_OK) return s_; } while (0)

static double gib(double b) { return b / (1024.0 * 1024 * 1024); }

#define TERMS 8
static const char *const term_label[TERMS] = {"compute", "exposed TP", "exposed CP", "exposed EP",
                                              "recompute", "bubble", "exposed DP", "optimizer"};
static void terms(const dw_plan_time_split *t, double v[TERMS]) {
    v[0] = t->compute, v[1] = t->tp_exposed, v[2] = t->cp_exposed, v[3] = t->ep_exposed;
    v[4] = t->recompute, v[5] = t->bubble, v[6] = t->dp_exposed, v[7] = t->optimizer;
}

/* What a rejection reason means, in words (the names are deepwell.h's dw_plan_reject_name). */
static const char *reason_words(const char *name) {
    static const struct { const char *name, *words; } w[] = {
        {"tp_exceeds_nvlink_domain", "tensor parallelism would leave the NVLink domain"},
        {"heads_not_divisible_by_tp", "attention heads do not split evenly over TP"},
        {"kv_heads_not_divisible_by_tp", "KV heads do not split evenly over TP"},
        {"layers_not_divisible_by_pp_x_virtual", "no layer layout over PP x virtual stages (even uneven)"},
        {"experts_not_divisible_by_ep", "experts do not split evenly over EP"},
        {"ep_does_not_divide_dp", "the EP group does not fit the data-parallel (x TP/ETP) ranks"},
        {"global_batch_not_divisible_by_dp_x_micro_batch", "the global batch does not split into DP x micro-batches"},
        {"seq_not_divisible_by_2cp", "the sequence does not split into 2 CP chunks per rank"},
        {"interleaved_needs_micro_batches_multiple_of_pp", "interleaving needs micro-batches in groups of PP"},
        {"zero2_3_with_pipeline", "ZeRO-2/3 shards gradients that pipeline accumulation needs whole"},
        {"schedule_needs_moe_or_even_stages", "all-to-all overlap / DualPipe without EP, or DualPipe's parity"},
        {"one_gpu_engine_has_no_recompute_zero_offload", "one GPU runs Deepwell's engine: no ZeRO or offload there"},
        {"memory_exceeds_hbm_minus_headroom", "does not fit in HBM minus the headroom"},
        {"micro_batches_x_stages_over_simulation_limit", "too many micro-batches x stages to simulate"},
        {"slower_than_kept_plans", "fits, but even with no bubble slower than the kept plans"},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        if (!strcmp(w[i].name, name)) return w[i].words;
    return "";
}

static dw_status print_candidates(dw_ctx *ctx, const dw_plan_set *set) {
    printf("candidates: predicted step (s) = compute + exposed TP + CP + EP + recompute + bubble + exposed DP"
           " + optimizer\n");
    printf("  %-3s %9s %9s %8s %8s %8s %8s %8s %8s %8s %9s  %s\n", "#", "step", "compute", "TP", "CP", "EP",
           "recomp", "bubble", "DP", "optim", "GiB/GPU", "layout");
    double best[TERMS] = {0}, best_step = 0;
    for (int i = 0; i < dw_plan_set_count(set); i++) {
        dw_plan *p = NULL;
        TRY(dw_plan_set_get(ctx, set, i, &p));
        dw_plan_cost c = {.size = sizeof c};
        dw_plan_mem m = {.size = sizeof m};
        dw_plan_time_split t = {.size = sizeof t};
        dw_status s = dw_plan_get_cost(p, &c);
        if (s == DW_OK) s = dw_plan_get_memory(p, &m);
        if (s == DW_OK) s = dw_plan_get_time_split(p, &t);
        if (s != DW_OK) {
            dw_plan_free(p);
            return s;
        }
        double v[TERMS];
        terms(&t, v);
        printf("  %-3d %9.4g", i + 1, c.step);
        for (int k = 0; k < TERMS; k++) printf(" %*.3g", k == 0 ? 9 : 8, v[k]);
        printf(" %9.1f  %s\n", gib(m.total), dw_plan_summary(p));
        if (i == 0) {
            for (int k = 0; k < TERMS; k++) best[k] = v[k];
            best_step = c.step;
            if (t.ep_hidden > 0) printf("      (all-to-all hidden under compute: %.3g s)\n", t.ep_hidden);
        } else {
            int worst = 0;
            for (int k = 1; k < TERMS; k++)
                if (v[k] - best[k] > v[worst] - best[worst]) worst = k;
            if (c.step - best_step <= 1e-9 * best_step)
                printf("      ties the best on time; ranked after it by the tie-break (lower ZeRO stage, no "
                       "offload, less memory)\n");
            else
                printf("      lost by %.3g s (%.1f%%): mostly %s (+%.3g s)\n", c.step - best_step,
                       100 * (c.step / best_step - 1), term_label[worst], v[worst] - best[worst]);
        }
        dw_plan_free(p);
    }
    return DW_OK;
}

/* The best plan's memory per pipeline rank and its layer layout. */
static dw_status print_best(dw_ctx *ctx, const dw_plan_set *set) {
    dw_plan *p = NULL;
    TRY(dw_plan_set_get(ctx, set, 0, &p));
    dw_plan_layout l = {.size = sizeof l};
    dw_status s = dw_plan_get_layout(p, &l);
    printf("\nbest plan: %s (schedule %s, expert TP %d%s)\n", dw_plan_summary(p), dw_plan_schedule(p), l.etp,
           l.a2a_overlap ? ", all-to-all overlapped" : "");
    printf("  memory per pipeline rank (GiB): weights + grads + optimizer + activations + other = total "
           "(other: workspace, scales, ep buffers)\n");
    for (int r = 0; s == DW_OK && r < l.pp; r++) {
        dw_plan_mem m = {.size = sizeof m};
        if ((s = dw_plan_get_rank_memory(p, r, &m)) != DW_OK) break;
        printf("    rank %-3d %7.2f %7.2f %7.2f %7.2f %7.2f = %7.2f of %.1f\n", r, gib(m.weights), gib(m.grads),
               gib(m.optimizer), gib(m.activations), gib(m.workspace + m.scales + m.ep_buffers), gib(m.total), gib(m.limit));
    }
    printf("  layer layout (model stages in stack order):\n");
    for (int i = 0; s == DW_OK && i < dw_plan_stage_count(p); i++) {
        dw_plan_stage st = {.size = sizeof st};
        if ((s = dw_plan_get_stage(p, i, &st)) != DW_OK) break;
        printf("    stage %-3d rank %-3d chunk %d: ", i, st.rank, st.chunk);
        if (st.layers) printf("blocks %lld-%lld (%lld dense, %lld MoE)", (long long)st.first_layer,
                              (long long)(st.first_layer + st.layers - 1), (long long)st.dense_layers,
                              (long long)st.moe_layers);
        else printf("no blocks");
        printf("%s%s", st.embedding ? " + embedding" : "", st.lm_head ? " + LM head" : "");
        if (st.mtp) printf(" + %lld MTP", (long long)st.mtp);
        printf("\n");
    }
    dw_plan_free(p);
    return s;
}

/* Each family: kept, or why not (its fastest member and what it lost by, a lower bound, or the
 * constraint that ruled most of it out). */
static void print_families(const dw_plan_set *set) {
    dw_plan_cost best = {.size = sizeof best};
    if (dw_plan_set_count(set) > 0) {
        dw_plan *p = NULL;
        if (dw_plan_set_get(NULL, set, 0, &p) == DW_OK) dw_plan_get_cost(p, &best);
        dw_plan_free(p);
    }
    printf("\nfamilies (a configuration belongs to each whose feature it has):\n");
    for (int k = 0; k < dw_plan_families(); k++) {
        dw_plan_family_info f = {.size = sizeof f};
        if (dw_plan_set_get_family(set, k, &f) != DW_OK) continue;
        printf("  %-42s ", f.name);
        /* no member is faster than its simulated best or the smallest bound of those never simulated */
        double floor = f.simulated && (f.lower_bound <= 0 || f.best_step < f.lower_bound) ? f.best_step : f.lower_bound;
        if (f.kept >= 0) printf("kept: #%d is one", f.kept + 1);
        else if (f.feasible > 0 && best.step > 0) {
            printf("none kept: %lld fit, none under %.4g s (+%.1f%%)", (long long)f.feasible, floor,
                   100 * (floor / best.step - 1));
            if (f.simulated)
                printf("; fastest simulated %.4g s, mostly %s (+%.3g s) [%s]", f.best_step,
                       f.largest_term >= 0 ? term_label[f.largest_term] : "?", f.largest_excess, f.best_summary);
        }
        else if (f.main_reason >= 0)
            printf("none feasible: %lld ruled out, %lld by %s", (long long)f.rejected, (long long)f.main_reason_count,
                   dw_plan_reject_name(f.main_reason));
        else printf("not searched on this machine and job");
        printf("\n");
    }
}

dw_status plan_explain_print(dw_ctx *ctx, const dw_plan_set *set) {
    printf("\n== why this plan (--explain) ==\n");
    if (dw_plan_set_count(set) > 0) {
        TRY(print_candidates(ctx, set));
        TRY(print_best(ctx, set));
    }
    print_families(set);
    printf("\nrejected configurations (by the first constraint each broke):\n");
    for (int k = 0; k < dw_plan_reject_reasons(); k++) {
        int examples = 0;
        int64_t n = dw_plan_set_rejected(set, k, &examples);
        if (!n) continue;
        printf("  %10lld  %s: %s\n", (long long)n, dw_plan_reject_name(k), reason_words(dw_plan_reject_name(k)));
        if (examples > 0) printf("              e.g. %s\n", dw_plan_set_reject_example(set, k, 0));
    }
    return DW_OK;
}
