/* plan_handle.h — private to plan/: what deepwell.h's planner handles hold. A dw_plan is one
 * layout with the model, machine and job it was made for, its predictions and its checks; a
 * dw_plan_set a search's candidates and rejections. plan_api.c makes and reads them;
 * plan_handle.c answers the layout questions the compiler asks of a plan (dw_plan_get_layout,
 * dw_plan_world_size, dw_plan_summary) without the planner's machinery. */
#ifndef DW_PLAN_PLAN_HANDLE_H
#define DW_PLAN_PLAN_HANDLE_H

#include "plan/plan.h"

/* What predictions are computed against. `in` points at cfg, hw and gemm of the same struct,
 * so an env is built in place and never moved. */
typedef struct {
    char *model;
    dw_model_config cfg;
    dw_hw *hw;
    dw_gemm_table gemm;
    bool has_gemm;
    dw_plan_in in;
} plan_env;

struct dw_plan {
    bool bound;          /* false: dw_plan_single's layout only, no env */
    plan_env env;
    dw_par par;
    int64_t seq, global_batch;
    dw_recipe recipe;
    char summary[200];
    int violations;      /* structural constraints broken (memory not counted) */
    char why[2048];      /* one line each */
    dw_plan_entry e;     /* memory and cost, when violations == 0 */
    bool engine_ok;
    char engine_why[400];
};

struct dw_plan_set {
    plan_env env;
    dw_plan_result r;
};

/* DW_OK when p has predictions (a model, a machine, no broken constraint); else why not, naming
 * the caller `fn` (plan_api.c). */
dw_status dw_plan_predicted(const char *fn, const dw_plan *p);

#endif /* DW_PLAN_PLAN_HANDLE_H */
