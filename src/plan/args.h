/* args.h — private: the job flags `deepwell plan` and `deepwell dryrun` share (model, hardware,
 * sequence, batch, precision, MoE, measured GEMM rates) and loading what they name. */
#ifndef DW_PLAN_ARGS_H
#define DW_PLAN_ARGS_H

#include <getopt.h>

#include "plan/plan.h"

typedef struct {
    const char *model, *hw, *gemm;
    long nodes;          /* 0: not given */
    long gpus;           /* GPUs per node, at most the description's; 0: not given */
    dw_job job;
    bool seq_given, batch_given;
} dw_plan_args;

/* getopt_long entries for the shared flags; values 0x100.. are reserved for them. */
#define DW_PLAN_ARG_OPTIONS                                                                    \
    {"hw", required_argument, 0, 0x100}, {"nodes", required_argument, 0, 0x101},              \
    {"seq", required_argument, 0, 0x102}, {"global-batch", required_argument, 0, 0x103},      \
    {"precision", required_argument, 0, 0x104}, {"moe", required_argument, 0, 0x105},         \
    {"gemm-rates", required_argument, 0, 0x106}, {"headroom", required_argument, 0, 0x107},   \
    {"gpus", required_argument, 0, 0x108}
#define DW_PLAN_ARG_FIRST 0x100
#define DW_PLAN_ARG_LAST 0x108

/* Handles one shared option (c in DW_PLAN_ARG_FIRST..DW_PLAN_ARG_LAST). DW_ERR_INVALID with a message naming the
 * flag for a bad value. */
dw_status dw_plan_args_opt(dw_ctx *ctx, int c, const char *arg, dw_plan_args *a);
/* Parses "experts=E,top_k=K,capacity=C" (any subset, any order) into the job. */
dw_status dw_plan_parse_moe(dw_ctx *ctx, const char *spec, dw_job *job);

typedef struct {
    dw_model_config cfg;
    dw_hw *hw;
    dw_gemm_table gemm;
    dw_plan_in in;
} dw_plan_setup;
/* Loads the model (preset or directory with config.json), the hardware ("probe": this machine;
 * a preset name; or a `deepwell probe --json` file; --nodes sets the node count) and the GEMM
 * rates. */
dw_status dw_plan_setup_load(dw_ctx *ctx, const dw_plan_args *a, dw_plan_setup *out);
void dw_plan_setup_free(dw_plan_setup *s);

#endif
