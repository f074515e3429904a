/* comm.h — private: a communicator among the ranks (processes) of one job, as a table of
 * collectives in the spirit of runtime/backend.h. Backends: "self" (one process: every collective
 * is the identity), "mpi" (Open MPI, CPU ranks; comm_mpi.c), "tcp" (a star through rank 0 over
 * sockets, CPU ranks started by torchrun, srun or `deepwell launch`; comm_tcp.c) and "nccl"
 * (GPU memory, loaded with dlopen; comm_nccl.c, bootstrapped over a host communicator).
 * Which one a job gets is decided from the launcher's environment (launch_env.c, comm_world.c).
 * Not the trainer's data parallelism (train/dp.c), which is a client of this.
 *
 * Buffers are host memory, except for a communicator whose `device_memory` is set (NCCL: the
 * context's GPU; its operations are ordered after the work already issued on the context's
 * stream and before what is issued later, with no host synchronisation). Every rank calls every
 * collective in the same order with the same counts; errors come back as dw_status with the
 * message on the caller's context. */
#ifndef DW_COMM_COMM_H
#define DW_COMM_COMM_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"

typedef enum { DW_COMM_F32 = 0, DW_COMM_F64, DW_COMM_I64, DW_COMM_BYTE, DW_COMM_TYPE_COUNT } dw_comm_type;
typedef enum { DW_COMM_SUM = 0, DW_COMM_AVG } dw_comm_op; /* AVG: the sum divided by the world size
                                                             (floating types only) */

typedef struct dw_comm dw_comm;

/* A collective started now and finished later (dw_comm_start, dw_comm_test, dw_comm_wait), so that
 * it overlaps with compute: data parallelism starts a bucket's reduction as soon as backward has
 * written its gradients. The caller fills the first five fields, keeps the struct and leaves buf
 * alone until dw_comm_wait returns. The result is what the blocking call of the same kind would
 * give on this backend except on mpi, whose nonblocking algorithms may add in another order than
 * its blocking ones (both are fixed: the same call gives the same bits every time). */
typedef enum {
    DW_COMM_ASYNC_ALL_REDUCE = 0, /* every rank's buf: the reduction of all ranks' */
    DW_COMM_ASYNC_REDUCE,         /* root's buf: the reduction of all ranks' (the others' buf is left
                                     as it was, or holds the reduction too: tcp) */
    DW_COMM_ASYNC_BROADCAST       /* every rank's buf: root's (op and divide_by unused); ZeRO-3's
                                     gathers issued ahead of use (train/dp_zero3.c) */
} dw_comm_async_kind;
typedef struct {
    dw_comm_async_kind kind;
    void *buf;          /* n elements, in place */
    int64_t n;
    dw_comm_type t;
    dw_comm_op op;
    int root;           /* REDUCE: the rank that gets the result; BROADCAST: the one that sends */
    int divide_by;      /* AVG: the sum divided by this (0: the communicator's world; a split's
                           reduction may average over the whole job's ranks) */
    bool done;          /* finished: the result is in buf (on a GPU: for work issued from now on) */
    double started;     /* CLOCK_MONOTONIC seconds at the start */
    double seconds;     /* once done: how long it ran (nccl: between events on the comm stream;
                           mpi: from the start to when a test or the wait saw it finish, an upper
                           bound; the others: the blocking call) */
    uint64_t impl[4];   /* the backend's: an MPI request, NCCL events */
    dw_comm *on;        /* the communicator dw_comm_start started it on, which dw_comm_test and
                           dw_comm_wait use whatever they are passed (a split's collectives are
                           waited for beside the whole job's: its root is a rank of the split) */
} dw_comm_async;

/* One backend. n counts elements of the type. reduce_scatter and all_gather work in place on one
 * buffer of world x n_each elements, rank r's block at r x n_each:
 *   reduce_scatter: in: every rank's full buffer; out: block `rank` holds the reduction of all
 *                   ranks' blocks `rank` (the other blocks are left undefined);
 *   all_gather:     in: block `rank` of each rank; out: every block, on every rank.
 * all_to_all: send holds send_counts[d] elements for rank d, back to back in rank order; recv
 * gets recv_counts[s] elements from rank s, in rank order (the counts are agreed beforehand, e.g.
 * by an all_to_all of the counts themselves). */
typedef struct {
    const char *name;
    bool device_memory;
    dw_status (*all_reduce)(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type t, dw_comm_op op);
    dw_status (*reduce_scatter)(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type t, dw_comm_op op);
    dw_status (*all_gather)(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type t);
    dw_status (*broadcast)(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type t, int root);
    dw_status (*barrier)(dw_ctx *ctx, dw_comm *c);
    dw_status (*all_to_all)(dw_ctx *ctx, dw_comm *c, const void *send, const int64_t *send_counts, void *recv,
                            const int64_t *recv_counts, dw_comm_type t);
    void (*destroy)(dw_comm *c, bool orderly); /* orderly: every rank is finishing (MPI_Finalize) */
    /* started collectives (dw_comm_start below); NULL: the backend runs them to completion at the
     * start. test sets a->done when the collective has finished; wait returns when it has. */
    dw_status (*start)(dw_ctx *ctx, dw_comm *c, dw_comm_async *a);
    dw_status (*test)(dw_ctx *ctx, dw_comm *c, dw_comm_async *a);
    dw_status (*wait)(dw_ctx *ctx, dw_comm *c, dw_comm_async *a);
    /* dw_comm_split of a communicator of several ranks, called on every rank (it may exchange over
     * c): this rank's communicator among those of its color, where it is sub_rank of sub_world */
    dw_status (*split)(dw_ctx *ctx, dw_comm *c, int color, int sub_rank, int sub_world, dw_comm **out);
} dw_comm_i;

struct dw_comm {
    const dw_comm_i *i;
    int rank, world;        /* 0 <= rank < world */
    int local_rank;         /* rank among the processes of this node (the GPU it uses) */
    dw_comm *host;          /* host-memory collectives of the same ranks: itself, or for a
                               device_memory communicator the one that bootstrapped it */
    void *impl;
};

/* Bytes of one element. */
int dw_comm_type_size(dw_comm_type t);

/* The collectives, checked (counts >= 0, root in range, AVG only on floating types) and passed to
 * the backend; a host world of one returns at once (a device one still calls its library). */
dw_status dw_comm_all_reduce(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type t, dw_comm_op op);
dw_status dw_comm_reduce_scatter(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type t, dw_comm_op op);
dw_status dw_comm_all_gather(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type t);
dw_status dw_comm_broadcast(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type t, int root);
dw_status dw_comm_barrier(dw_ctx *ctx, dw_comm *c);
dw_status dw_comm_all_to_all(dw_ctx *ctx, dw_comm *c, const void *send, const int64_t *send_counts, void *recv,
                             const int64_t *recv_counts, dw_comm_type t);

/* Started collectives: dw_comm_start checks a's fields and starts it (a world of one host rank, or
 * n 0: done at once). nccl: on the communicator's stream after what the context's stream has issued;
 * mpi: MPI_Iallreduce / MPI_Ireduce / MPI_Ibcast, which advance only inside MPI calls, so call
 * dw_comm_test now and then; tcp and self: run to completion here (tcp reduces as an all-reduce).
 * dw_comm_test advances it
 * and sets a->done once finished; dw_comm_wait returns when it has finished and, on a GPU, orders
 * the context's stream after it. Every rank starts the same collectives in the same order, and
 * may call the blocking collectives in between (in the same order too). */
dw_status dw_comm_start(dw_ctx *ctx, dw_comm *c, dw_comm_async *a);
dw_status dw_comm_test(dw_ctx *ctx, dw_comm *c, dw_comm_async *a);
dw_status dw_comm_wait(dw_ctx *ctx, dw_comm *c, dw_comm_async *a);
/* The ranks of c split by color: every rank of c calls it at the same point with a color >= 0, and
 * *out is the communicator of the ranks of this rank's color, in c's rank order (mpi:
 * MPI_Comm_split; tcp: a star through the color's first rank, on a port of its own; nccl: a new
 * NCCL communicator over the host communicator split alike; one rank of a color: self, or for
 * nccl a one-rank NCCL communicator). The caller frees *out (before c). A negative color:
 * DW_ERR_INVALID on that rank, and the others fail or time out in the exchange. */
dw_status dw_comm_split(dw_ctx *ctx, dw_comm *c, int color, dw_comm **out);

/* CLOCK_MONOTONIC in seconds (the started / seconds fields). */
double dw_comm_now(void);

/* Element-wise dst op= src over n elements (the host reduction of the tcp backend and the
 * average of the mpi one): SUM adds; divide_by > 0 then divides dst by it. */
void dw_comm_reduce_host(void *dst, const void *src, int64_t n, dw_comm_type t);
void dw_comm_divide_host(void *buf, int64_t n, dw_comm_type t, int divide_by);

/* ---- where the ranks come from (launch_env.c) ------------------------------------------------ */
typedef struct {
    int rank, world, local_rank, local_world;
    const char *launcher;   /* "none", "mpirun", "torchrun", "srun" (static) */
    char master_addr[256];  /* torchrun / srun / launch: rank 0's host ("" for mpirun, none) */
    int master_port;        /* its rendezvous port (0 when unknown) */
} dw_launch_env;

/* Reads the launcher's variables: mpirun (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE),
 * torchrun and `deepwell launch` (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT), Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, with SLURM_STEP_ID
 * present: a batch script itself is no job step; MASTER_ADDR defaults to the first host of
 * SLURM_STEP_NODELIST, MASTER_PORT to 29500 + SLURM_JOB_ID mod 1000), in that order of precedence;
 * none of them: one rank. A malformed or contradictory value: DW_ERR_INVALID naming the variable
 * (message on ctx, which may be NULL). */
dw_status dw_launch_env_read(dw_ctx *ctx, dw_launch_env *out);
/* The first host of a Slurm node list ("gpu[003-006,010],cpu1" -> "gpu003"); false if malformed. */
bool dw_slurm_first_host(const char *list, char *out, size_t cap);

/* ---- the backends (each file's constructor) -------------------------------------------------- */
dw_status dw_comm_self_create(dw_ctx *ctx, dw_comm **out);
/* mpi: MPI_Init unless the process did it already; DW_ERR_UNSUPPORTED in a build without MPI. */
dw_status dw_comm_mpi_create(dw_ctx *ctx, const dw_launch_env *env, dw_comm **out);
bool dw_comm_mpi_built(void);
/* tcp: rank 0 listens on port (all interfaces), the others connect to addr:port; each waits at
 * most timeout_s for the rendezvous and for every later message. */
dw_status dw_comm_tcp_create(dw_ctx *ctx, int rank, int world, int local_rank, const char *addr, int port,
                             double timeout_s, dw_comm **out);
/* nccl: the context's GPU; the unique id broadcast over host (mpi or tcp), which it keeps. */
dw_status dw_comm_nccl_create(dw_ctx *ctx, dw_comm *host, dw_comm **out);
void dw_comm_free(dw_comm *c, bool orderly); /* NULL is harmless; frees a device comm's host too */

/* ---- the job's communicator (comm_world.c) --------------------------------------------------- */
/* The process's communicator for ctx's device, made on first use from the launcher's environment
 * and kept until dw_dist_shutdown: self for one rank; for CPU contexts mpi under mpirun (when
 * built with it), else tcp; for CUDA contexts nccl over that. *out stays owned by the library. */
dw_status dw_comm_world(dw_ctx *ctx, dw_comm **out);
/* Seconds a tcp rank waits for its peers (DW_COMM_TIMEOUT, default 300). */
double dw_comm_timeout_s(void);

#endif /* DW_COMM_COMM_H */
