/* launch_env.c — which rank this process is, from the launcher's environment variables (mpirun,
 * torchrun or `deepwell launch`, Slurm's srun; comm.h says which and in what order), strictly
 * parsed: a malformed value is an error naming the variable, never a silent one-rank run. Also
 * the public dw_dist_env_get. Reads only; nothing is connected here. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

/* An integer in [lo, hi] from variable `name`; absent: *out = dflt when dflt_ok, else an error. */
static dw_status env_int(dw_ctx *ctx, const char *name, long lo, long hi, bool dflt_ok, long dflt, long *out) {
    const char *v = dw_env(name);
    if (!v) {
        if (dflt_ok) {
            *out = dflt;
            return DW_OK;
        }
        return dw_set_error(ctx, DW_ERR_INVALID, "%s is not set (the launcher's environment is incomplete)", name);
    }
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s=%s: expected an integer in [%ld, %ld]", name, v, lo, hi);
    *out = x;
    return DW_OK;
}

bool dw_slurm_first_host(const char *list, char *out, size_t cap) {
    /* "pre[003-006,010]post,..." -> "pre003post"; a plain "host1,host2" -> "host1" */
    size_t n = 0;
    const char *p = list;
    while (*p && *p != ',' && *p != '[') {
        if (n + 1 >= cap) return false;
        out[n++] = *p++;
    }
    if (*p == '[') {
        p++;
        while (*p && *p != '-' && *p != ',' && *p != ']') {
            if (n + 1 >= cap) return false;
            out[n++] = *p++;
        }
        p = strchr(p, ']');
        if (!p) return false;
        p++;
        while (*p && *p != ',' && *p != '[') {
            if (n + 1 >= cap) return false;
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
    return n > 0;
}

static dw_status read_mpirun(dw_ctx *ctx, dw_launch_env *e) {
    long r, w, lr, lw;
    DW_TRY(env_int(ctx, "OMPI_COMM_WORLD_SIZE", 1, 1 << 20, false, 0, &w));
    DW_TRY(env_int(ctx, "OMPI_COMM_WORLD_RANK", 0, w - 1, false, 0, &r));
    DW_TRY(env_int(ctx, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, w, true, 1, &lw));
    DW_TRY(env_int(ctx, "OMPI_COMM_WORLD_LOCAL_RANK", 0, lw - 1, true, 0, &lr));
    *e = (dw_launch_env){.rank = (int)r, .world = (int)w, .local_rank = (int)lr, .local_world = (int)lw,
                         .launcher = "mpirun"};
    /* MASTER_ADDR / MASTER_PORT are used only for a tcp transport (a build without MPI) */
    const char *a = dw_env("MASTER_ADDR");
    if (a) snprintf(e->master_addr, sizeof e->master_addr, "%s", a);
    long port;
    DW_TRY(env_int(ctx, "MASTER_PORT", 1, 65535, true, 0, &port));
    e->master_port = (int)port;
    return DW_OK;
}

static dw_status read_torchrun(dw_ctx *ctx, dw_launch_env *e) {
    long r, w, lr, lw, port;
    DW_TRY(env_int(ctx, "WORLD_SIZE", 1, 1 << 20, false, 0, &w));
    DW_TRY(env_int(ctx, "RANK", 0, w - 1, false, 0, &r));
    DW_TRY(env_int(ctx, "LOCAL_WORLD_SIZE", 1, w, true, w, &lw));
    DW_TRY(env_int(ctx, "LOCAL_RANK", 0, lw - 1, true, r < lw ? r : 0, &lr));
    *e = (dw_launch_env){.rank = (int)r, .world = (int)w, .local_rank = (int)lr, .local_world = (int)lw,
                         .launcher = "torchrun"};
    if (w == 1) return DW_OK;
    const char *a = dw_env("MASTER_ADDR");
    if (!a) return dw_set_error(ctx, DW_ERR_INVALID, "WORLD_SIZE=%ld but MASTER_ADDR is not set (rank 0's host)", w);
    snprintf(e->master_addr, sizeof e->master_addr, "%s", a);
    DW_TRY(env_int(ctx, "MASTER_PORT", 1, 65535, false, 0, &port));
    /* torchrun's agent may host its own store on MASTER_PORT: Deepwell's rendezvous takes the next */
    const char *agent = dw_env("TORCHELASTIC_USE_AGENT_STORE");
    if (agent && (!strcmp(agent, "True") || !strcmp(agent, "1"))) port = port % 65535 + 1;
    e->master_port = (int)port;
    return DW_OK;
}

static dw_status read_srun(dw_ctx *ctx, dw_launch_env *e) {
    long r, w, lr, job, port;
    DW_TRY(env_int(ctx, "SLURM_NTASKS", 1, 1 << 20, false, 0, &w));
    DW_TRY(env_int(ctx, "SLURM_PROCID", 0, w - 1, false, 0, &r));
    DW_TRY(env_int(ctx, "SLURM_LOCALID", 0, w - 1, true, 0, &lr));
    *e = (dw_launch_env){.rank = (int)r, .world = (int)w, .local_rank = (int)lr, .local_world = 0, .launcher = "srun"};
    long lw = 0;
    const char *tpn = dw_env("SLURM_NTASKS_PER_NODE"); /* "4" or "4(x2)": the first count is enough */
    if (tpn) lw = strtol(tpn, NULL, 10);
    e->local_world = lw > 0 ? (int)lw : 1;
    if (w == 1) return DW_OK;
    const char *a = dw_env("MASTER_ADDR"), *nodes = dw_env("SLURM_STEP_NODELIST");
    if (!nodes) nodes = dw_env("SLURM_JOB_NODELIST");
    if (a) snprintf(e->master_addr, sizeof e->master_addr, "%s", a);
    else if (!nodes || !dw_slurm_first_host(nodes, e->master_addr, sizeof e->master_addr))
        return dw_set_error(ctx, DW_ERR_INVALID, "srun: MASTER_ADDR is not set and SLURM_STEP_NODELIST (%s) names no "
                            "first host", nodes ? nodes : "unset");
    DW_TRY(env_int(ctx, "SLURM_JOB_ID", 0, 0x7fffffffL, true, 0, &job));
    DW_TRY(env_int(ctx, "MASTER_PORT", 1, 65535, true, 29500 + job % 1000, &port));
    e->master_port = (int)port;
    return DW_OK;
}

dw_status dw_launch_env_read(dw_ctx *ctx, dw_launch_env *out) {
    *out = (dw_launch_env){.rank = 0, .world = 1, .local_rank = 0, .local_world = 1, .launcher = "none"};
    dw_launch_env e;
    dw_status st = DW_OK;
    if (dw_env("OMPI_COMM_WORLD_SIZE")) st = read_mpirun(ctx, &e);
    else if (dw_env("WORLD_SIZE") || dw_env("RANK")) st = read_torchrun(ctx, &e);
    else if (dw_env("SLURM_PROCID") && dw_env("SLURM_STEP_ID")) st = read_srun(ctx, &e);
    else return DW_OK;
    if (st == DW_OK) *out = e;
    return st;
}

dw_status dw_dist_env_get(dw_dist_env *out) {
    dw_launch_env e;
    dw_status st = dw_launch_env_read(NULL, &e);
    *out = (dw_dist_env){.rank = e.rank, .world_size = e.world, .local_rank = e.local_rank,
                         .local_world_size = e.local_world, .launcher = e.launcher};
    if (st != DW_OK) *out = (dw_dist_env){.world_size = 1, .local_world_size = 1, .launcher = "none"};
    else dw_log_set_rank(e.rank, e.world);
    return st;
}
