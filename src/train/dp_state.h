/* dp_state.h — private: the state of data parallelism (dp.h) that its parts share — the buckets,
 * the expert slices and the dw_dp struct — apart from the functions, so dp.c, dp_buckets.c,
 * dp_overlap.c, dp_experts.c and dp_range.c each reach it without reaching one another. */
#ifndef DW_TRAIN_DP_STATE_H
#define DW_TRAIN_DP_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "compile/grad_stage.h"
#include "deepwell.h"

/* One bucket of the flat pools. */
typedef struct {
    int64_t begin, end;   /* floats */
    int ready;            /* the program step after which its gradients are final: the last step
                             that writes any of its parameters' gradients (-1: none does) */
} dw_dp_bucket;

/* The buckets of a program's pools in the order they start (ready, then from the last floats to
 * the first): cut every bucket_floats (rounded up to 64) from the end. */
typedef struct {
    int n;
    dw_dp_bucket *b;      /* (n), owned */
} dw_dp_buckets;

/* An expert parameter's slice of one expert group: [begin, end) floats, group j's experts. */
typedef struct {
    int64_t begin, end;
    int j;
} dw_dp_slice;
typedef struct dw_ep dw_ep;

typedef struct {
    dw_ctx *ctx;
    dw_engine *eng;
    dw_comm *comm;        /* the engine's memory (nccl on a GPU) */
    dw_comm *host;        /* host values: losses, flags, norms */
    int rank, world;
    int zero;             /* 0, 1, 2 or 3 */
    int64_t floats;       /* of one parameter-shaped pool */
    int64_t block;        /* ZeRO-1/2: floats of each rank's shard, a multiple of 64; the last rank's
                             also holds the tail [world x block, floats) */
    int64_t lo, hi;       /* ZeRO-1/2: this rank's shard of the pools */
    dw_dp_buckets buckets;
    /* the reduction of the current micro-batch (dp_overlap.c) */
    bool overlap;         /* started from backward (the executor's after_step hook) */
    bool armed;           /* this micro-batch's backward reduces (the last one; ZeRO-2: each) */
    int started;          /* buckets started, in order */
    int n_async;          /* collectives started: a bucket's all-reduce (ZeRO-0), or a reduce to
                             each rank whose shard it overlaps (ZeRO-1/2) */
    dw_comm_async *async; /* (buckets x world) */
    int64_t overlapped;   /* buckets started during backward, over the run (the log's count) */
    double comm_s, exposed_s; /* this step's collectives' own seconds; seconds waited after backward */
    double *times;        /* (4 x world) dw_dp_report_times: gathered pairs, then comm and exposed */
    /* --ep K with ZeRO-0 (dp_experts.c): each expert parameter's slices of the K expert groups, by
     * begin; this rank's (group rank mod K) are reduced over `replicas`, the ranks holding the same
     * experts, and stepped here; the others are neither reduced nor stepped */
    int ep_k, ep_j;
    int n_slices;
    dw_dp_slice *slices;
    dw_comm *replicas;
    /* --ep K with ZeRO-0 or 1 (dp_ep_zero.h): the pools' cells by begin, each held by one rank; under
     * ZeRO-1 the rank's optimizer pool holds its cells' moments and the step is dp_ep_zero.c's */
    int n_cells;
    struct dw_dp_cell *cells;
    /* ZeRO-3 (dp_zero3.c): whether the weights pool is whole (the start unless made for ZeRO-3,
     * or after training) or the shard's; whether training asked for the shard; each parameter's
     * gather slot (bytes into the gather block, -1: never read) and the gathers due before each step */
    bool z3_whole, z3_want, z3_logged;
    bool z3_born;         /* the engine was made for ZeRO-3: its masters a shard from creation */
    int z3_wholes;        /* times the weights were made whole on this rank (dw_dp_z3_whole) */
    int64_t z3_peak_w;    /* the engine's weights pool at its largest since dw_dp_z3_init (bytes) */
    float *z3_host;       /* rank 0, after dw_dp_z3_checkpoint: every master (floats) in host memory */
    int64_t z3_gather_bytes;
    int64_t *z3_slot;     /* (n_params) */
    int64_t *z3_slot16;   /* (n_params) its BF16 working copy's bytes into the block, -1: none */
    int *z3_ev_at;        /* (n_steps + 1) z3_ev[z3_ev_at[s] .. z3_ev_at[s + 1]): step s's gathers */
    int *z3_ev;           /* parameters */
    /* the prefetch (dp_zero3_gather.c): each step's next event step in its sweep (-1: none), the
     * event step whose gathers are started (-1: none), the step that started them, their parts */
    bool z3_prefetch;     /* DW_Z3_PREFETCH (default on) */
    int *z3_next;         /* (n_steps) */
    int z3_pre, z3_pre_at;
    int z3_n_async, z3_async_cap;
    dw_comm_async *z3_async; /* (z3_async_cap) */
    /* ZeRO-2/3 with the engine's gradients sharded from creation (dp_stage.c): the staging plan
     * (its buckets are `buckets`, in the same order), its slots, each parameter's gradient in
     * them, the bucket whose slot each one takes over (-1: none), each bucket's collectives in
     * async (stage_async[2i] .. [2i + 1]) and whether it was added into the shard yet */
    dw_grad_stage stage;
    float *stage_mem;     /* (n_slots x slot_floats) backend memory, owned; NULL: not staged */
    float **grad_at;      /* (n_params) the executor's grad_at */
    int *stage_prev;      /* (stage.n) */
    int *stage_async;     /* (stage.n, 2) */
    bool *stage_done;     /* (stage.n) */
} dw_dp;

#endif /* DW_TRAIN_DP_STATE_H */
