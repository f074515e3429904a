/* plan_args.h — the job flags `deepwell plan` and `deepwell dryrun` share (model, hardware,
 * sequence, batch, precision, MoE, measured GEMM rates, headroom) and loading the hardware they
 * name. Flag parsing only: the planning is deepwell.h's. */
#ifndef DW_TOOLS_PLAN_ARGS_H
#define DW_TOOLS_PLAN_ARGS_H

#include <getopt.h>
#include <stdbool.h>

#include "deepwell.h"

typedef struct {
    const char *model, *hw;
    long nodes;          /* 0: not given */
    long gpus;           /* GPUs per node, at most the description's; 0: not given */
    dw_plan_job job;     /* gemm_rates: --gemm-rates */
    bool seq_given, batch_given;
} plan_args;

/* getopt_long entries for the shared flags; values 0x100.. are reserved for them. */
#define PLAN_ARG_OPTIONS                                                                       \
    {"hw", required_argument, 0, 0x100}, {"nodes", required_argument, 0, 0x101},              \
    {"seq", required_argument, 0, 0x102}, {"global-batch", required_argument, 0, 0x103},      \
    {"precision", required_argument, 0, 0x104}, {"moe", required_argument, 0, 0x105},         \
    {"gemm-rates", required_argument, 0, 0x106}, {"headroom", required_argument, 0, 0x107},   \
    {"gpus", required_argument, 0, 0x108}
#define PLAN_ARG_FIRST 0x100
#define PLAN_ARG_LAST 0x108

void plan_args_init(plan_args *a);
/* Handles one shared option (c in PLAN_ARG_FIRST..PLAN_ARG_LAST). False (the message, naming the
 * flag, printed for `cmd`) for a bad value: the caller exits with DW_EXIT_USAGE. */
bool plan_args_opt(const char *cmd, int c, const char *arg, plan_args *a);
/* Checks that MODEL, --hw, --seq and --global-batch were given and loads the hardware: "probe"
 * (this machine), a `deepwell probe --json` file, or a preset; --nodes and --gpus applied. On
 * failure prints the message for `cmd` and returns the exit code (DW_EXIT_OK on success). */
int plan_args_load_hw(const char *cmd, dw_ctx *ctx, const plan_args *a, dw_hw **out);

#endif /* DW_TOOLS_PLAN_ARGS_H */
