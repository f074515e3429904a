/* comm_mpi.c — the "mpi" communicator: CPU ranks of a job started by mpirun, over MPI_COMM_WORLD
 * or a split of it (Open MPI from Debian; built when CMake finds MPI, DW_HAVE_MPI). Errors return (MPI_ERRORS_RETURN)
 * with MPI's own message. MPI_Init is called unless the process did it already; MPI_Finalize only
 * on an orderly end (every rank finishing): a rank that fails exits without it, and mpirun then
 * stops the whole job instead of the others waiting in a collective. Averages are MPI's sum
 * divided by the world size on the host. Counts above INT_MAX are sent in pieces (all-reduce,
 * broadcast) or refused. Started collectives are MPI's nonblocking ones (MPI_Iallreduce,
 * MPI_Ireduce, MPI_Ibcast), advanced by MPI_Test. */
#include "comm/comm.h"
#include "core/error.h"

#if DW_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    bool we_initialised; /* MPI_Finalize is ours to call */
    MPI_Comm comm;       /* MPI_COMM_WORLD, or a split's (freed with it) */
} mpi_impl;

static MPI_Comm comm_of(const dw_comm *c) { return ((const mpi_impl *)c->impl)->comm; }

static MPI_Datatype mpi_type(dw_comm_type t) {
    switch (t) {
    case DW_COMM_F32: return MPI_FLOAT;
    case DW_COMM_F64: return MPI_DOUBLE;
    case DW_COMM_I64: return MPI_INT64_T;
    default: return MPI_UNSIGNED_CHAR;
    }
}

static dw_status mpi_fail(dw_ctx *ctx, const dw_comm *c, const char *what, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    return dw_set_error(ctx, DW_ERR_IO, "mpi rank %d: %s: %s", c->rank, what, msg);
}

#define MPI_TRY(ctx, c, what, call)                                                                    \
    do {                                                                                               \
        int mpi_rc_ = (call);                                                                          \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_fail(ctx, c, what, mpi_rc_);                            \
    } while (0)

static dw_status too_big(dw_ctx *ctx, const dw_comm *c, const char *what, int64_t n) {
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "mpi rank %d: %s of %lld elements per rank: above MPI's int count",
                        c->rank, what, (long long)n);
}

static dw_status mpi_all_reduce(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type t, dw_comm_op op) {
    const int es = dw_comm_type_size(t);
    for (int64_t off = 0; off < n; off += INT_MAX) {
        const int k = (int)(n - off < INT_MAX ? n - off : INT_MAX);
        MPI_TRY(ctx, c, "MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)off * (size_t)es, k,
                                                       mpi_type(t), MPI_SUM, comm_of(c)));
    }
    if (op == DW_COMM_AVG) dw_comm_divide_host(buf, n, t, c->world);
    return DW_OK;
}

static dw_status mpi_reduce_scatter(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type t,
                                    dw_comm_op op) {
    if (n_each > INT_MAX) return too_big(ctx, c, "reduce-scatter", n_each);
    /* in place, MPI puts this rank's block first; it belongs at rank x n_each */
    MPI_TRY(ctx, c, "MPI_Reduce_scatter_block",
            MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, (int)n_each, mpi_type(t), MPI_SUM, comm_of(c)));
    const size_t blk = (size_t)n_each * (size_t)dw_comm_type_size(t);
    char *mine = (char *)buf + (size_t)c->rank * blk;
    if (c->rank) memmove(mine, buf, blk);
    if (op == DW_COMM_AVG) dw_comm_divide_host(mine, n_each, t, c->world);
    return DW_OK;
}

static dw_status mpi_all_gather(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type t) {
    if (n_each > INT_MAX) return too_big(ctx, c, "all-gather", n_each);
    MPI_TRY(ctx, c, "MPI_Allgather",
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)n_each, mpi_type(t), comm_of(c)));
    return DW_OK;
}

static dw_status mpi_broadcast(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type t, int root) {
    const int es = dw_comm_type_size(t);
    for (int64_t off = 0; off < n; off += INT_MAX) {
        const int k = (int)(n - off < INT_MAX ? n - off : INT_MAX);
        MPI_TRY(ctx, c, "MPI_Bcast",
                MPI_Bcast((char *)buf + (size_t)off * (size_t)es, k, mpi_type(t), root, comm_of(c)));
    }
    return DW_OK;
}

static dw_status mpi_barrier(dw_ctx *ctx, dw_comm *c) {
    MPI_TRY(ctx, c, "MPI_Barrier", MPI_Barrier(comm_of(c)));
    return DW_OK;
}

static dw_status mpi_all_to_all(dw_ctx *ctx, dw_comm *c, const void *send, const int64_t *send_counts, void *recv,
                                const int64_t *recv_counts, dw_comm_type t) {
    const int W = c->world;
    int *ints = malloc((size_t)W * 4 * sizeof *ints); /* send counts, send offsets, recv counts, recv offsets */
    if (!ints) return dw_set_error(ctx, DW_ERR_NOMEM, "mpi all-to-all: out of memory");
    int64_t so = 0, ro = 0;
    for (int r = 0; r < W; r++) {
        if (send_counts[r] > INT_MAX || recv_counts[r] > INT_MAX || so > INT_MAX || ro > INT_MAX) {
            free(ints);
            return too_big(ctx, c, "all-to-all", send_counts[r] > recv_counts[r] ? send_counts[r] : recv_counts[r]);
        }
        ints[r] = (int)send_counts[r], ints[W + r] = (int)so, ints[2 * W + r] = (int)recv_counts[r];
        ints[3 * W + r] = (int)ro;
        so += send_counts[r], ro += recv_counts[r];
    }
    int rc = MPI_Alltoallv(send, ints, ints + W, mpi_type(t), recv, ints + 2 * W, ints + 3 * W, mpi_type(t),
                           comm_of(c));
    free(ints);
    return rc == MPI_SUCCESS ? DW_OK : mpi_fail(ctx, c, "MPI_Alltoallv", rc);
}

/* ---- started collectives: MPI_Iallreduce / MPI_Ireduce, the request in a->impl ---------------- */
_Static_assert(sizeof(MPI_Request) <= sizeof(((dw_comm_async *)0)->impl), "an MPI request fits dw_comm_async.impl");

static MPI_Request *request_of(dw_comm_async *a) { return (MPI_Request *)(void *)a->impl; }

static dw_status mpi_start(dw_ctx *ctx, dw_comm *c, dw_comm_async *a) {
    const bool reduce = a->kind == DW_COMM_ASYNC_REDUCE;
    if (a->n > INT_MAX)
        return too_big(ctx, c, a->kind == DW_COMM_ASYNC_BROADCAST ? "broadcast (started)"
                               : reduce                        ? "reduce (started)"
                                                               : "all-reduce (started)", a->n);
    MPI_Request *req = request_of(a);
    if (a->kind == DW_COMM_ASYNC_BROADCAST)
        MPI_TRY(ctx, c, "MPI_Ibcast", MPI_Ibcast(a->buf, (int)a->n, mpi_type(a->t), a->root, comm_of(c), req));
    else if (!reduce)
        MPI_TRY(ctx, c, "MPI_Iallreduce",
                MPI_Iallreduce(MPI_IN_PLACE, a->buf, (int)a->n, mpi_type(a->t), MPI_SUM, comm_of(c), req));
    else if (c->rank == a->root)
        MPI_TRY(ctx, c, "MPI_Ireduce", MPI_Ireduce(MPI_IN_PLACE, a->buf, (int)a->n, mpi_type(a->t), MPI_SUM, a->root,
                                                   comm_of(c), req));
    else
        MPI_TRY(ctx, c, "MPI_Ireduce",
                MPI_Ireduce(a->buf, NULL, (int)a->n, mpi_type(a->t), MPI_SUM, a->root, comm_of(c), req));
    return DW_OK;
}

/* After the request completed: the average where the result is. */
static void mpi_finish(dw_comm *c, dw_comm_async *a) {
    a->done = true;
    a->seconds = dw_comm_now() - a->started;
    if (a->op == DW_COMM_AVG && (a->kind == DW_COMM_ASYNC_ALL_REDUCE || c->rank == a->root))
        dw_comm_divide_host(a->buf, a->n, a->t, a->divide_by);
}

static dw_status mpi_test(dw_ctx *ctx, dw_comm *c, dw_comm_async *a) {
    int flag = 0;
    MPI_TRY(ctx, c, "MPI_Test", MPI_Test(request_of(a), &flag, MPI_STATUS_IGNORE));
    if (flag) mpi_finish(c, a);
    return DW_OK;
}

static dw_status mpi_wait(dw_ctx *ctx, dw_comm *c, dw_comm_async *a) {
    MPI_TRY(ctx, c, "MPI_Wait", MPI_Wait(request_of(a), MPI_STATUS_IGNORE));
    mpi_finish(c, a);
    return DW_OK;
}

static void mpi_destroy(dw_comm *c, bool orderly) {
    mpi_impl *m = c->impl;
    int done = 0;
    if (m->comm != MPI_COMM_WORLD && orderly && MPI_Finalized(&done) == MPI_SUCCESS && !done) MPI_Comm_free(&m->comm);
    if (orderly && m->we_initialised && MPI_Finalized(&done) == MPI_SUCCESS && !done) MPI_Finalize();
    free(m);
    free(c);
}

static const dw_comm_i mpi_i;

static dw_status mpi_split(dw_ctx *ctx, dw_comm *c, int color, int sub_rank, int sub_world, dw_comm **out) {
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_TRY(ctx, c, "MPI_Comm_split", MPI_Comm_split(comm_of(c), color, c->rank, &sub));
    MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
    int rank = -1, world = 0;
    MPI_Comm_rank(sub, &rank);
    MPI_Comm_size(sub, &world);
    mpi_impl *m = calloc(1, sizeof *m);
    dw_comm *s = calloc(1, sizeof *s);
    if (!m || !s || rank != sub_rank || world != sub_world) {
        free(m), free(s);
        MPI_Comm_free(&sub);
        return m && s ? dw_set_error(ctx, DW_ERR_IO, "mpi rank %d: MPI_Comm_split made rank %d of %d, expected %d of "
                                     "%d", c->rank, rank, world, sub_rank, sub_world)
                      : dw_set_error(ctx, DW_ERR_NOMEM, "mpi: out of memory");
    }
    m->comm = sub;
    *s = (dw_comm){.i = &mpi_i, .rank = rank, .world = world, .local_rank = c->local_rank, .host = s, .impl = m};
    *out = s;
    return DW_OK;
}

static const dw_comm_i mpi_i = {
    .name = "mpi", .all_reduce = mpi_all_reduce, .reduce_scatter = mpi_reduce_scatter, .all_gather = mpi_all_gather,
    .broadcast = mpi_broadcast, .barrier = mpi_barrier, .all_to_all = mpi_all_to_all, .destroy = mpi_destroy,
    .start = mpi_start, .test = mpi_test, .wait = mpi_wait, .split = mpi_split};

bool dw_comm_mpi_built(void) { return true; }

dw_status dw_comm_mpi_create(dw_ctx *ctx, const dw_launch_env *env, dw_comm **out) {
    *out = NULL;
    int init = 0, rank = 0, world = 0;
    mpi_impl *m = calloc(1, sizeof *m);
    dw_comm *c = calloc(1, sizeof *c);
    if (!m || !c) {
        free(m);
        free(c);
        return dw_set_error(ctx, DW_ERR_NOMEM, "mpi: out of memory");
    }
    MPI_Initialized(&init);
    if (!init && MPI_Init(NULL, NULL) != MPI_SUCCESS) {
        free(m);
        free(c);
        return dw_set_error(ctx, DW_ERR_IO, "mpi: MPI_Init failed (launched by mpirun?)");
    }
    m->we_initialised = !init;
    m->comm = MPI_COMM_WORLD;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    *c = (dw_comm){.i = &mpi_i, .rank = rank, .world = world, .local_rank = env->local_rank, .host = c, .impl = m};
    if (rank != env->rank || world != env->world) {
        dw_status st = dw_set_error(ctx, DW_ERR_INVALID, "mpi: MPI says rank %d of %d, the environment (%s) rank %d of "
                                    "%d", rank, world, env->launcher, env->rank, env->world);
        mpi_destroy(c, false);
        return st;
    }
    *out = c;
    return DW_OK;
}

#else /* no MPI in this build */

bool dw_comm_mpi_built(void) { return false; }

dw_status dw_comm_mpi_create(dw_ctx *ctx, const dw_launch_env *env, dw_comm **out) {
    (void)env;
    *out = NULL;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "this build has no MPI (install libopenmpi-dev: scripts/deps.sh, "
                        "then reconfigure)");
}

#endif /* DW_HAVE_MPI */
