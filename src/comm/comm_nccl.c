/* comm_nccl.c — the "nccl" communicator: GPU buffers of the context's device, one process per GPU.
 * libnccl.so.2 is loaded with dlopen (no link-time dependency), as cuDNN is (kernels/cuda/
 * attn_cudnn.c); its unique id goes from rank 0 to the others over the host communicator (mpi or
 * tcp). Collectives run on the communicator's own stream, ordered by events after what the
 * context's stream has issued and before what it issues next: no host synchronisation (a started
 * collective's wait synchronises the host with it, to time it). Without
 * CUDA or the NCCL header at build time this file only declines. Never run on a GPU in CI. */
#include "comm/comm.h"
#include "core/error.h"

#if DW_HAVE_CUDA && DW_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* nccl.h declares f() for f(void) */
#include <nccl.h>
#pragma GCC diagnostic pop
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/env.h"
#include "core/log.h"

typedef struct {
    ncclResult_t (*get_version)(int *);
    const char *(*err_str)(ncclResult_t);
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*abort)(ncclComm_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                   cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*premul_sum)(ncclRedOp_t *, void *, ncclDataType_t, ncclScalarResidence_t, ncclComm_t); /* or NULL */
    ncclResult_t (*op_destroy)(ncclRedOp_t, ncclComm_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
} nc_api;

static pthread_mutex_t nc_mutex = PTHREAD_MUTEX_INITIALIZER;
static nc_api nc;
static int nc_state; /* 0 not tried, 1 loaded, -1 unavailable */
static char nc_why[512] = "NCCL not tried yet";

#define NC_SYM(field, name)                                                                            \
    do {                                                                                               \
        *(void **)&nc.field = dlsym(lib, name); /* POSIX idiom for function symbols */               \
        if (!nc.field) {                                                                               \
            snprintf(nc_why, sizeof nc_why, "libnccl.so.2 has no %s", name);                          \
            return false;                                                                              \
        }                                                                                              \
    } while (0)

static bool nc_load_syms(void *lib) {
    NC_SYM(get_version, "ncclGetVersion");
    NC_SYM(err_str, "ncclGetErrorString");
    NC_SYM(get_unique_id, "ncclGetUniqueId");
    NC_SYM(init_rank, "ncclCommInitRank");
    NC_SYM(destroy, "ncclCommDestroy");
    NC_SYM(abort, "ncclCommAbort");
    NC_SYM(all_reduce, "ncclAllReduce");
    NC_SYM(reduce_scatter, "ncclReduceScatter");
    NC_SYM(all_gather, "ncclAllGather");
    NC_SYM(broadcast, "ncclBroadcast");
    NC_SYM(reduce, "ncclReduce");
    NC_SYM(send, "ncclSend");
    NC_SYM(recv, "ncclRecv");
    NC_SYM(group_start, "ncclGroupStart");
    NC_SYM(group_end, "ncclGroupEnd");
    *(void **)&nc.premul_sum = dlsym(lib, "ncclRedOpCreatePreMulSum"); /* NCCL 2.11: averages over other counts */
    *(void **)&nc.op_destroy = dlsym(lib, "ncclRedOpDestroy");
    return true;
}

static bool nc_load(void) {
    pthread_mutex_lock(&nc_mutex);
    if (!nc_state) {
        nc_state = -1;
        int v = 0;
        void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!lib) snprintf(nc_why, sizeof nc_why, "NCCL not available: %s", dlerror());
        else if (nc_load_syms(lib) && nc.get_version(&v) == ncclSuccess) {
            if (v < 21000) snprintf(nc_why, sizeof nc_why, "NCCL %d is older than 2.10 (no ncclAvg)", v);
            else nc_state = 1, DW_LOGD("comm: NCCL %d loaded", v);
        }
    }
    bool ok = nc_state > 0;
    pthread_mutex_unlock(&nc_mutex);
    return ok;
}

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;     /* the collectives' own stream */
    cudaEvent_t ready, done; /* compute -> comm, comm -> compute */
} nccl_impl;

static ncclDataType_t nc_type(dw_comm_type t) {
    return t == DW_COMM_F32 ? ncclFloat32 : t == DW_COMM_F64 ? ncclFloat64 : t == DW_COMM_I64 ? ncclInt64 : ncclUint8;
}

#define NC_TRY(ctx, c, what, call)                                                                     \
    do {                                                                                               \
        ncclResult_t nc_rc_ = (call);                                                                  \
        if (nc_rc_ != ncclSuccess)                                                                     \
            return dw_set_error(ctx, DW_ERR_CUDA, "nccl rank %d: %s: %s", (c)->rank, what, nc.err_str(nc_rc_)); \
    } while (0)

#define CU_TRY(ctx, c, what, call)                                                                     \
    do {                                                                                               \
        cudaError_t cu_rc_ = (call);                                                                   \
        if (cu_rc_ != cudaSuccess)                                                                     \
            return dw_set_error(ctx, DW_ERR_CUDA, "nccl rank %d: %s: %s", (c)->rank, what, cudaGetErrorString(cu_rc_)); \
    } while (0)

/* The comm stream waits for the context's stream (before a collective). */
static dw_status enter(dw_ctx *ctx, dw_comm *c) {
    nccl_impl *m = c->impl;
    void *cs = NULL;
    DW_TRY(dw_ctx_stream(ctx, &cs));
    CU_TRY(ctx, c, "cudaEventRecord", cudaEventRecord(m->ready, (cudaStream_t)cs));
    CU_TRY(ctx, c, "cudaStreamWaitEvent", cudaStreamWaitEvent(m->stream, m->ready, 0));
    return DW_OK;
}

/* The context's stream waits for the collective (after it). */
static dw_status leave(dw_ctx *ctx, dw_comm *c) {
    nccl_impl *m = c->impl;
    void *cs = NULL;
    DW_TRY(dw_ctx_stream(ctx, &cs));
    CU_TRY(ctx, c, "cudaEventRecord", cudaEventRecord(m->done, m->stream));
    CU_TRY(ctx, c, "cudaStreamWaitEvent", cudaStreamWaitEvent((cudaStream_t)cs, m->done, 0));
    return DW_OK;
}

static dw_status nccl_all_reduce(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type t, dw_comm_op op) {
    nccl_impl *m = c->impl;
    DW_TRY(enter(ctx, c));
    NC_TRY(ctx, c, "ncclAllReduce", nc.all_reduce(buf, buf, (size_t)n, nc_type(t), op == DW_COMM_AVG ? ncclAvg : ncclSum,
                                                  m->comm, m->stream));
    return leave(ctx, c);
}

static dw_status nccl_reduce_scatter(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type t,
                                     dw_comm_op op) {
    nccl_impl *m = c->impl;
    char *mine = (char *)buf + (size_t)c->rank * (size_t)n_each * (size_t)dw_comm_type_size(t); /* in place */
    DW_TRY(enter(ctx, c));
    NC_TRY(ctx, c, "ncclReduceScatter", nc.reduce_scatter(buf, mine, (size_t)n_each, nc_type(t),
                                                          op == DW_COMM_AVG ? ncclAvg : ncclSum, m->comm, m->stream));
    return leave(ctx, c);
}

static dw_status nccl_all_gather(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type t) {
    nccl_impl *m = c->impl;
    const char *mine = (char *)buf + (size_t)c->rank * (size_t)n_each * (size_t)dw_comm_type_size(t); /* in place */
    DW_TRY(enter(ctx, c));
    NC_TRY(ctx, c, "ncclAllGather", nc.all_gather(mine, buf, (size_t)n_each, nc_type(t), m->comm, m->stream));
    return leave(ctx, c);
}

static dw_status nccl_broadcast(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type t, int root) {
    nccl_impl *m = c->impl;
    DW_TRY(enter(ctx, c));
    NC_TRY(ctx, c, "ncclBroadcast", nc.broadcast(buf, buf, (size_t)n, nc_type(t), root, m->comm, m->stream));
    return leave(ctx, c);
}

static dw_status nccl_barrier(dw_ctx *ctx, dw_comm *c) {
    void *cs = NULL;
    DW_TRY(dw_ctx_stream(ctx, &cs));
    CU_TRY(ctx, c, "cudaStreamSynchronize", cudaStreamSynchronize((cudaStream_t)cs));
    return dw_comm_barrier(ctx, c->host);
}

static dw_status nccl_all_to_all(dw_ctx *ctx, dw_comm *c, const void *send, const int64_t *send_counts, void *recv,
                                 const int64_t *recv_counts, dw_comm_type t) {
    nccl_impl *m = c->impl;
    const size_t es = (size_t)dw_comm_type_size(t);
    DW_TRY(enter(ctx, c));
    NC_TRY(ctx, c, "ncclGroupStart", nc.group_start());
    size_t so = 0, ro = 0;
    ncclResult_t rc = ncclSuccess;
    for (int r = 0; r < c->world && rc == ncclSuccess; r++) {
        if (send_counts[r]) rc = nc.send((const char *)send + so * es, (size_t)send_counts[r], nc_type(t), r, m->comm, m->stream);
        if (rc == ncclSuccess && recv_counts[r])
            rc = nc.recv((char *)recv + ro * es, (size_t)recv_counts[r], nc_type(t), r, m->comm, m->stream);
        so += (size_t)send_counts[r], ro += (size_t)recv_counts[r];
    }
    ncclResult_t end = nc.group_end(); /* always closes the group */
    NC_TRY(ctx, c, "ncclSend/ncclRecv", rc);
    NC_TRY(ctx, c, "ncclGroupEnd", end);
    return leave(ctx, c);
}

/* ---- started collectives: issued on the comm stream between two timing events (a->impl), which
 * the wait synchronises on and the context's stream then waits for ------------------------------- */
typedef struct {
    cudaEvent_t begin, end;
} nccl_async;
_Static_assert(sizeof(nccl_async) <= sizeof(((dw_comm_async *)0)->impl), "two events fit dw_comm_async.impl");

static nccl_async *events_of(dw_comm_async *a) { return (nccl_async *)(void *)a->impl; }

static void drop_events(nccl_async *ev) {
    if (ev->begin) cudaEventDestroy(ev->begin);
    if (ev->end) cudaEventDestroy(ev->end);
    ev->begin = ev->end = NULL;
}

static dw_status nccl_start(dw_ctx *ctx, dw_comm *c, dw_comm_async *a) {
    nccl_impl *m = c->impl;
    nccl_async *ev = events_of(a);
    if (cudaEventCreate(&ev->begin) != cudaSuccess || cudaEventCreate(&ev->end) != cudaSuccess) {
        drop_events(ev);
        return dw_set_error(ctx, DW_ERR_CUDA, "nccl rank %d: timing events: %s", c->rank,
                            cudaGetErrorString(cudaGetLastError()));
    }
    ncclRedOp_t op = a->op == DW_COMM_AVG ? ncclAvg : ncclSum;
    float scale_f = 1.0f / (float)a->divide_by;
    double scale_d = 1.0 / (double)a->divide_by;
    ncclResult_t rc = ncclSuccess;
    bool premul = a->op == DW_COMM_AVG && a->divide_by != c->world; /* x / divide_by summed */
    if (premul && (!nc.premul_sum || !nc.op_destroy || (a->t != DW_COMM_F32 && a->t != DW_COMM_F64))) {
        drop_events(ev);
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "nccl rank %d: an average over %d of %d ranks needs "
                            "ncclRedOpCreatePreMulSum (NCCL 2.11)", c->rank, a->divide_by, c->world);
    }
    if (premul) rc = nc.premul_sum(&op, a->t == DW_COMM_F32 ? (void *)&scale_f : (void *)&scale_d, nc_type(a->t),
                                   ncclScalarHostImmediate, m->comm);
    const bool made_op = premul && rc == ncclSuccess;
    dw_status st = rc == ncclSuccess ? enter(ctx, c)
                                     : dw_set_error(ctx, DW_ERR_CUDA, "nccl rank %d: ncclRedOpCreatePreMulSum: %s",
                                                    c->rank, nc.err_str(rc));
    if (st == DW_OK && cudaEventRecord(ev->begin, m->stream) != cudaSuccess)
        st = dw_set_error(ctx, DW_ERR_CUDA, "nccl rank %d: cudaEventRecord", c->rank);
    if (st == DW_OK && a->kind == DW_COMM_ASYNC_BROADCAST)
        rc = nc.broadcast(a->buf, a->buf, (size_t)a->n, nc_type(a->t), a->root, m->comm, m->stream);
    else if (st == DW_OK && a->kind == DW_COMM_ASYNC_REDUCE)
        rc = nc.reduce(a->buf, a->buf, (size_t)a->n, nc_type(a->t), op, a->root, m->comm, m->stream);
    else if (st == DW_OK)
        rc = nc.all_reduce(a->buf, a->buf, (size_t)a->n, nc_type(a->t), op, m->comm, m->stream);
    if (st == DW_OK && rc != ncclSuccess)
        st = dw_set_error(ctx, DW_ERR_CUDA, "nccl rank %d: %s (started): %s", c->rank,
                          a->kind == DW_COMM_ASYNC_BROADCAST ? "ncclBroadcast"
                          : a->kind == DW_COMM_ASYNC_REDUCE  ? "ncclReduce"
                                                             : "ncclAllReduce",
                          nc.err_str(rc));
    if (st == DW_OK && cudaEventRecord(ev->end, m->stream) != cudaSuccess)
        st = dw_set_error(ctx, DW_ERR_CUDA, "nccl rank %d: cudaEventRecord", c->rank);
    if (made_op) nc.op_destroy(op, m->comm); /* the enqueued collective keeps it */
    if (st != DW_OK) drop_events(ev);
    return st;
}

static dw_status nccl_finish(dw_ctx *ctx, dw_comm *c, dw_comm_async *a) {
    nccl_async *ev = events_of(a);
    float ms = 0;
    dw_status st = leave(ctx, c);
    if (st == DW_OK && cudaEventElapsedTime(&ms, ev->begin, ev->end) != cudaSuccess)
        st = dw_set_error(ctx, DW_ERR_CUDA, "nccl rank %d: cudaEventElapsedTime", c->rank);
    drop_events(ev);
    a->done = st == DW_OK;
    a->seconds = 1e-3 * (double)ms;
    return st;
}

static dw_status nccl_test(dw_ctx *ctx, dw_comm *c, dw_comm_async *a) {
    const cudaError_t rc = cudaEventQuery(events_of(a)->end);
    if (rc == cudaErrorNotReady) return DW_OK;
    CU_TRY(ctx, c, "cudaEventQuery (started collective)", rc);
    return nccl_finish(ctx, c, a);
}

static dw_status nccl_wait(dw_ctx *ctx, dw_comm *c, dw_comm_async *a) {
    CU_TRY(ctx, c, "cudaEventSynchronize (started collective)", cudaEventSynchronize(events_of(a)->end));
    return nccl_finish(ctx, c, a);
}

static void nccl_destroy(dw_comm *c, bool orderly) {
    nccl_impl *m = c->impl;
    if (m) {
        if (m->comm) orderly ? nc.destroy(m->comm) : nc.abort(m->comm);
        if (m->ready) cudaEventDestroy(m->ready);
        if (m->done) cudaEventDestroy(m->done);
        if (m->stream) cudaStreamDestroy(m->stream);
    }
    free(m);
    free(c);
}

/* A split: the host communicator split alike, and a new NCCL communicator over it (which owns it). */
static dw_status nccl_split(dw_ctx *ctx, dw_comm *c, int color, int sub_rank, int sub_world, dw_comm **out) {
    (void)sub_rank, (void)sub_world;
    dw_comm *host = NULL;
    DW_TRY(dw_comm_split(ctx, c->host, color, &host));
    dw_status st = dw_comm_nccl_create(ctx, host, out);
    if (st != DW_OK) dw_comm_free(host, false);
    return st;
}

static const dw_comm_i nccl_i = {
    .name = "nccl", .device_memory = true, .all_reduce = nccl_all_reduce, .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather, .broadcast = nccl_broadcast, .barrier = nccl_barrier,
    .all_to_all = nccl_all_to_all, .destroy = nccl_destroy, .start = nccl_start, .test = nccl_test,
    .wait = nccl_wait, .split = nccl_split};

dw_status dw_comm_nccl_create(dw_ctx *ctx, dw_comm *host, dw_comm **out) {
    *out = NULL;
    if (dw_ctx_device(ctx) != DW_DEVICE_CUDA)
        return dw_set_error(ctx, DW_ERR_INVALID, "nccl: the context is not on a GPU");
    /* every rank learns whether every rank could load NCCL, so none waits for the others in init */
    int64_t missing = nc_load() ? 0 : 1;
    DW_TRY(dw_comm_all_reduce(ctx, host, &missing, 1, DW_COMM_I64, DW_COMM_SUM));
    if (missing)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "nccl: %lld rank(s) cannot load NCCL (here: %s)",
                            (long long)missing, nc_state > 0 ? "loaded" : nc_why);
    ncclUniqueId id;
    if (host->rank == 0 && nc.get_unique_id(&id) != ncclSuccess) memset(&id, 0, sizeof id); /* caught below */
    DW_TRY(dw_comm_broadcast(ctx, host, &id, (int64_t)sizeof id, DW_COMM_BYTE, 0));
    dw_comm *c = calloc(1, sizeof *c);
    nccl_impl *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        return dw_set_error(ctx, DW_ERR_NOMEM, "nccl: out of memory");
    }
    *c = (dw_comm){.i = &nccl_i, .rank = host->rank, .world = host->world, .local_rank = host->local_rank,
                   .host = host, .impl = m};
    dw_status st = DW_OK;
    /* DW_NCCL_HIGH_PRIORITY=1: the collectives' stream at the device's highest priority, so their
     * blocks are scheduled ahead of the compute kernels' waiting ones (an experiment for issue 29:
     * moe-e64's gradient reduction slowed backward by as long as it ran; off by default, as
     * PyTorch's TORCH_NCCL_HIGH_PRIORITY is) */
    int least = 0, greatest = 0;
    if (!dw_env_flag("DW_NCCL_HIGH_PRIORITY", false) ||
        cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess)
        greatest = 0;
    if (cudaStreamCreateWithPriority(&m->stream, cudaStreamNonBlocking, greatest) != cudaSuccess ||
        cudaEventCreateWithFlags(&m->ready, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&m->done, cudaEventDisableTiming) != cudaSuccess)
        st = dw_set_error(ctx, DW_ERR_CUDA, "nccl rank %d: stream or events: %s", c->rank,
                          cudaGetErrorString(cudaGetLastError()));
    ncclResult_t rc = st == DW_OK ? nc.init_rank(&m->comm, c->world, id, c->rank) : ncclSuccess;
    if (st == DW_OK && rc != ncclSuccess) {
        m->comm = NULL;
        st = dw_set_error(ctx, DW_ERR_CUDA, "nccl rank %d of %d: ncclCommInitRank: %s", c->rank, c->world,
                          nc.err_str(rc));
    }
    if (st != DW_OK) {
        c->host = c; /* the caller keeps host */
        nccl_destroy(c, false);
        return st;
    }
    int v = 0, dev = -1;
    nc.get_version(&v);
    cudaGetDevice(&dev);
    DW_LOGI("rank %d of %d: nccl communicator on cuda:%d (NCCL %d)", c->rank, c->world, dev, v);
    *out = c;
    return DW_OK;
}

#else /* no CUDA or no NCCL header in this build */

dw_status dw_comm_nccl_create(dw_ctx *ctx, dw_comm *host, dw_comm **out) {
    (void)host;
    *out = NULL;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "this build has no NCCL support (a CUDA build with nccl.h): GPU "
                        "ranks cannot communicate");
}

#endif
