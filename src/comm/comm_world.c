/* comm_world.c — the process's communicator, made once from the launcher's environment
 * (launch_env.c): self for one rank; mpi under mpirun when built with MPI, else tcp to
 * MASTER_ADDR:MASTER_PORT; for a GPU context nccl bootstrapped over that. Kept until
 * dw_dist_shutdown (deepwell.h), which ends it in order (MPI_Finalize) or, after a failure, without
 * waiting for the others. Not thread-safe: made by the thread that trains. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

static dw_comm *world_host; /* host-memory collectives of the job */
static dw_comm *world_dev;  /* GPU collectives (nccl over world_host), made for the first CUDA context */

double dw_comm_timeout_s(void) {
    const char *v = dw_env("DW_COMM_TIMEOUT");
    char *end = NULL;
    double s = v ? strtod(v, &end) : 0;
    if (v && (end == v || *end || !(s > 0))) {
        DW_LOGW("DW_COMM_TIMEOUT=%s is not a positive number of seconds; using 300", v);
        s = 0;
    }
    return s > 0 ? s : 300;
}

static dw_status make_host(dw_ctx *ctx) {
    dw_launch_env e;
    DW_TRY(dw_launch_env_read(ctx, &e));
    dw_log_set_rank(e.rank, e.world);
    if (e.world == 1) return dw_comm_self_create(ctx, &world_host);
    if (!strcmp(e.launcher, "mpirun") && dw_comm_mpi_built()) DW_TRY(dw_comm_mpi_create(ctx, &e, &world_host));
    else if (!e.master_addr[0] || !e.master_port)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s started %d ranks, but this build has no MPI and MASTER_ADDR / "
                            "MASTER_PORT (rank 0's host and a free port) are not both set for a tcp rendezvous",
                            e.launcher, e.world);
    else DW_TRY(dw_comm_tcp_create(ctx, e.rank, e.world, e.local_rank, e.master_addr, e.master_port,
                                   dw_comm_timeout_s(), &world_host));
    DW_LOGI("rank %d of %d (%s, local rank %d): %s communicator", e.rank, e.world, e.launcher, e.local_rank,
            world_host->i->name);
    return DW_OK;
}

dw_status dw_comm_world(dw_ctx *ctx, dw_comm **out) {
    *out = NULL;
    if (!world_host) DW_TRY(make_host(ctx));
    if (dw_ctx_device(ctx) != DW_DEVICE_CUDA || world_host->world == 1) {
        *out = world_host;
        return DW_OK;
    }
    if (!world_dev) DW_TRY(dw_comm_nccl_create(ctx, world_host, &world_dev));
    *out = world_dev;
    return DW_OK;
}

void dw_dist_shutdown(bool ok) {
    if (!world_host) return;
    if (ok) { /* nobody leaves while another still talks to it */
        dw_status st = dw_comm_barrier(NULL, world_host);
        if (st != DW_OK) DW_LOGW("shutdown: %s", dw_errmsg(NULL)), ok = false;
    }
    if (world_dev) dw_comm_free(world_dev, ok); /* and its host */
    else dw_comm_free(world_host, ok);
    world_dev = world_host = NULL;
}
