/* moe_load.c — how much more than its share of routed tokens the busiest expert-parallel rank
 * computes in one MoE layer. Dropless routing does not cap an expert's load, and the layer waits
 * for its slowest rank (the combine all-to-all); under a capacity factor every expert computes
 * its padded capacity, which the cost model already prices (factor 1 here). Derivation and sources: docs/planner.md ("Expert load"). */
#include <math.h>

#include "plan/plan.h"

double dw_plan_expert_load(const dw_plan_in *in, int ep) {
    const dw_model_config *c = in->cfg;
    if (in->job.moe_capacity > 0 || (c->capacity_factor > 0 && in->experts == c->n_experts))
        return 1.0; /* capped and padded: every expert computes its capacity (the cost's rows) */
    if (ep < 2 || in->experts <= 0) return 1.0; /* one rank computes every expert's rows */
    /* a router balanced by per-expert biases every step (DeepSeek-V3's auxiliary-loss-free
     * strategy, or any family's moe_bias_update_speed; Megatron-Bridge's benchmarks force balance
     * too): shares as planned */
    if ((c->route.expert_bias || c->moe_bias_speed > 0) && in->experts == c->n_experts) return 1.0;
    /* an auxiliary-loss router: each expert's share deviates by DW_PLAN_EXPERT_LOAD_CV of the mean;
     * a rank sums E/ep of them (the deviation shrinks by sqrt(E/ep)), and the busiest of ep ranks
     * sits sqrt(2 ln ep) deviations above the mean (the expected maximum of ep normals) */
    double local = (double)in->experts / ep;
    return 1.0 + DW_PLAN_EXPERT_LOAD_CV * sqrt(2.0 * log((double)ep)) / sqrt(local);
}
