/* exec.h — private: the executor. Allocates a program's pools on a backend, takes a batch, and
 * runs the program's phases step by step through the backend's table (backend.h): it resolves
 * every step's tensors to pointers, delivers gradients that go through ACC temporaries, and,
 * where the backend can record, replays a recorded training step and optimizer step instead of
 * issuing them again. The same code for every backend; no device knowledge here. Not the public
 * engine (engine.c), which adds weights, the loss read-back and checks. */
#ifndef DW_RUNTIME_EXEC_H
#define DW_RUNTIME_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/backend.h"

/* One range of pool floats [lo, hi) whose moments the optimizer pool holds from float `at` of m and v
 * (dw_exec_shard_optimizer_segments). */
typedef struct {
    int64_t lo, hi, at;
} dw_exec_opt_seg;

struct dw_exec {
    const dw_compiled *p;
    const dw_graph *g;
    dw_backend *be;
    char *pool[DW_POOL_COUNT];  /* backend memory, one block per pool */
    int64_t pool_bytes[DW_POOL_COUNT]; /* as allocated: the program's, the optimizer's a shard's
                                          after dw_exec_shard_optimizer */
    float *w, *grad;            /* (param_floats) each: FP32 masters, gradients; ZeRO-3 sharded
                                   (from creation, dw_exec_shard_weights): w holds pool floats [w_lo, w_hi); ZeRO-2/3
                                   from creation (dw_exec_shard): grad holds [grad_lo, grad_hi) */
    int64_t w_lo, w_hi, grad_lo, grad_hi;
    float **grad_at;            /* (n_params) ZeRO-2/3 staging (train/dp_stage.c): where the backward
                                   writes each parameter's gradient, else NULL (grad + offset); not owned */
    float **param_at;           /* (n_params) ZeRO-3 sharded: where each parameter's values gathered
                                   for the current step are (train/dp_zero3.c), else NULL; owned */
    uint16_t **param_bf16_at;   /* (n_params) with it, in a BF16 program: each one's BF16 working copy
                                   made after its gather (NULL: it has none); owned */
    float *m, *v;               /* (opt_hi - opt_lo) each: AdamW moments of pool floats
                                   [opt_lo, opt_hi), float i at m[i - opt_lo] (dw_exec_moments);
                                   with segments, (the segments' floats) each, segment s's at opt_seg[s].at */
    int64_t opt_lo, opt_hi;     /* [0, param_floats), or a ZeRO rank's shard; with segments their bounds */
    int n_opt_seg;              /* 0: the one range [opt_lo, opt_hi); else the segments (EP x DP ZeRO-1:
                                   a rank's dense and expert cells, train/dp_ep_zero.c) */
    dw_exec_opt_seg *opt_seg;   /* (n_opt_seg) by lo, disjoint; owned */
    uint16_t *wb;               /* (param_floats) BF16 working copies (BF16 mode), else NULL */
    char *act, *work;           /* the activation arena, the workspace */
    int64_t b, t;               /* the current batch */
    bool has_targets;           /* the current batch has targets (the loss can run) */
    bool quant_reuse;           /* quantised layers reading the same x quantise it once per sweep */
    /* recorded replays (backends with record): one training step per (b, t, dloss), the optimizer */
    bool record;                /* false: always issue (DW_CUDA_GRAPH=0, or a recording failed) */
    void *rec_step;
    int64_t key_b, key_t;
    double key_scale;
    int key_seen;               /* calls with this key: the first runs eagerly (warm-up), then record */
    void *rec_opt;
    int opt_calls;
    /* expert parallelism (train/ep.c), NULL when off: asked first for every forward or backward op
     * step; it runs the steps of the MoE layers (exchanging rows with the other ranks) and sets
     * *done, or leaves the step to the executor */
    dw_status (*ep_step)(void *ep, dw_exec *x, int node, bool fwd, bool train, double dloss, bool *done);
    void *ep;
    /* with it, where the MoE experts run fp8_block: their operand slots for the group's rows and
     * the rank's experts (runtime/moe_fp8.h), NULL while it runs every expert locally */
    const struct dw_moe_fp8_ep *moe_ep;
    struct dw_amax *amax;       /* fp8_tensor delayed scaling (precision/amax_history.h), NULL: off */
    struct dw_qcounts *qcounts; /* the quantisers' counters (precision/quant_counts.h), NULL: off */
    /* data parallelism (train/dp_overlap.c), NULL when off: called after every step that ran, with
     * its index in the program, to start the collectives of the gradients that step finished */
    dw_status (*after_step)(void *user, dw_exec *x, int step);
    void *after_user;
    /* ZeRO-3 (train/dp_zero3.c), NULL when off: called before every step, to gather the parameters
     * the step is the first of its phase to read */
    dw_status (*before_step)(void *user, dw_exec *x, int step);
    void *before_user;
    /* the fused cast: AdamW's step writes the BF16 copies of the CAST_BF16 steps right after it
     * (fuse_cast: DW_FUSED_CAST, on unless 0), which are skipped when they follow it (last_step,
     * the last step run; cast_fused_through, the last one it covered, -1 once a cast ran itself)
     * and run otherwise (a refresh alone, data parallelism's shard step) */
    bool fuse_cast;
    int last_step, cast_fused_through;
    /* ... and the weight-cache refreshes (QUANT_W steps of the refresh phase) AdamW's pass makes
     * too where the backend can (dw_backend_i.adamw_quants; fuse_quant: with fuse_cast, and
     * DW_FUSED_QUANT on unless 0): their nodes (wq_nodes, n_wq) and steps (wq_fused, one flag a
     * step), skipped through quant_fused_through; both markers drop (-1) when a step does not
     * follow the last one run */
    bool fuse_quant;
    int *wq_nodes, n_wq, quant_fused_through;
    bool *wq_fused;
    /* the experts' wgrad writes its share of the gradient norm (compile/wgrad_sumsq.h; DW_FUSED_NORM
     * on unless 0): see dw_exec_wsumsq_on */
    bool fuse_norm;
    bool grads_shared; /* data parallelism (train/dp.c, several ranks): the gradients are reduced
                          between the backward and the norm */
};

/* Whether this step's backward writes the eligible MoE layers' partials of the gradient norm and
 * the norm step reads them instead of those gradients: fuse_norm, a program with partials, and the
 * whole gradient pool written by this rank's backward alone and read by the norm as it left it
 * (no data parallelism, expert parallelism or ZeRO staging). Backends that write the partials
 * (CUDA) ask it in both places; the others read the whole pool. */
bool dw_exec_wsumsq_on(const dw_exec *x);

/* The fused cast's plan (kernels/adamw_passes.h): where bf16_arena's copies lie on the gradients,
 * its first cut (dw_adamw_passes_first) and lag; both 0 where the two are apart. */
void dw_exec_cast_plan(const dw_exec *x, int64_t *first, int64_t *lag);

/* What a data-parallel rank allocates of the parameter-shaped pools from the start (ZeRO,
 * runtime/engine.c from dw_engine_opts.zero by compile/shard.h): the moments of pool floats
 * [opt_lo, opt_hi) and the gradients of [grad_lo, grad_hi) (ZeRO-2/3: the shard's accumulator;
 * the backward then writes through grad_at, which train/dp_stage.c points into its staging), and
 * the FP32 masters of [w_lo, w_hi) (ZeRO-3: the shard's alone, 256-aligned, no BF16 copies; the
 * gather block comes with train/dp_zero3.c's dw_exec_shard_weights). */
typedef struct {
    int64_t opt_lo, opt_hi, grad_lo, grad_hi, w_lo, w_hi;
} dw_exec_shard;

/* Allocates the pools of p on be (zeroed; shard NULL: whole, else the optimizer, gradient and
 * weights pools of its ranges only) and lets the backend prepare (handles, plans). record: replay recorded steps
 * where the backend can; quant_reuse: as dw_engine_opts. p must outlive it. */
dw_status dw_exec_create(const dw_compiled *p, dw_backend *be, bool record, bool quant_reuse,
                         const dw_exec_shard *shard, dw_exec **out);
void dw_exec_free(dw_exec *x);
/* Recording off and the recorded training step dropped: hooks that run collectives between the
 * steps (train/dp_overlap.c, dp_zero3.c) need every step issued. */
void dw_exec_stop_recording(dw_exec *x);
/* Data parallelism over several ranks (train/dp.c): the gradients are reduced between the backward
 * and the norm, so the norm reads them all (grads_shared; dw_exec_wsumsq_on false from now); the
 * recordings made before are dropped. */
void dw_exec_share_grads(dw_exec *x);
/* ZeRO-1/2 (train/dp.c): the optimizer pool replaced by one holding only the moments of pool floats
 * [lo, hi) (zeroed; the whole one released, the recorded optimizer dropped). The engine's own
 * optimizer step then refuses to run (engine.c): the shard's step is data parallelism's. */
dw_status dw_exec_shard_optimizer(dw_exec *x, int64_t lo, int64_t hi);
/* The same for several ranges: segs (n, 2) = [lo, hi) of pool floats, ascending and disjoint, their
 * moments laid end to end (EP x DP ZeRO-1: a rank's share of the dense floats over every rank and of
 * its experts over the ranks holding them). Bytes: 8 x their floats. */
dw_status dw_exec_shard_optimizer_segments(dw_exec *x, int n, const int64_t *segs);
/* Whether the optimizer pool holds every float's moments (not a ZeRO shard, one range or several). */
static inline bool dw_exec_moments_whole(const dw_exec *x) {
    return !x->n_opt_seg && x->opt_lo == 0 && x->opt_hi == x->p->param_floats;
}

/* Makes (b, t) current and copies tokens and targets (b x t int32; targets may be NULL) to the
 * workspace. The caller has checked shapes and token ranges. */
dw_status dw_exec_set_batch(dw_exec *x, const int32_t *tokens, const int32_t *targets, int64_t b, int64_t t);

/* Tells the backend a phase starts (dw_exec_phase does; callers issuing single steps do it first). */
void dw_exec_begin_phase(dw_exec *x, dw_phase phase);
/* Issues one step of the program (the profiler times them one by one). */
dw_status dw_exec_step(dw_exec *x, int step, bool train, double dloss);
/* Issues the steps of a phase, in order (forward without targets skips the loss). */
dw_status dw_exec_phase(dw_exec *x, dw_phase phase, bool train, double dloss);
/* Called after each step dw_exec_phase_each issues (step: its index in the program), in stream
 * order: a value a step wrote can be read there before the arena gives its memory to another. A
 * status other than DW_OK stops the phase and is returned. */
typedef dw_status (*dw_exec_after_step)(void *user, int step);
/* dw_exec_phase with after(user, step) after every step (after NULL: dw_exec_phase). */
dw_status dw_exec_phase_each(dw_exec *x, dw_phase phase, bool train, double dloss, dw_exec_after_step after,
                             void *user);
/* Forward and backward of the current batch, gradients accumulated (+=) with scale dloss;
 * replayed from a recording from the second call with the same (b, t, dloss). */
dw_status dw_exec_train_step(dw_exec *x, double dloss);
/* The optimizer phase with these arguments (staged to the workspace first); replayed from a
 * recording from the second call. Issued only: the caller reads the norm back. */
dw_status dw_exec_optimizer(dw_exec *x, const dw_adamw_args *a);

/* The op call of node as the executor makes it (tensors resolved to the pools), and running it:
 * the backend's forward or backward entry, then the gradients that go through ACC temporaries
 * delivered. For hooks (ep_step) that run a step with exchanges before or after it. */
void dw_exec_resolve(const dw_exec *x, int node, bool train, double dloss, dw_op_call *c);
dw_status dw_exec_call(dw_exec *x, bool fwd, const dw_op_call *c);

/* Rows of tensor t in the current batch: its capacity rows (shape[0] x shape[1]) scaled to (b, t):
 * b x t for (B,T,...) tensors, b x t x K for the (B,T*K,...) rows MoE dispatch makes (under a
 * capacity factor below 1 at most the experts' capacities: dw_moe_routed_rows); 1 for a tensor of
 * rank below 2 (the per-expert offsets, the loss). */
static inline int64_t dw_exec_rows(const dw_exec *x, int t) {
    const dw_ir_tensor *ten = &x->g->tensors[t];
    const dw_prog_tensor *pt = &x->p->tensor[t];
    if (pt->moe_factor > 0) return dw_moe_routed_rows(pt->moe_factor, x->b * x->t, pt->moe_top_k, pt->moe_experts);
    return ten->ndim < 2 ? 1 : x->b * x->t * (ten->shape[1] / x->g->seq);
}

/* ZeRO-3: the weights pool replaced by one block of the FP32 masters of pool floats [lo, hi) (read
 * from the pool, whole or a shard holding [lo, hi)) followed by `gather_bytes` for the parameters gathered around their use:
 * parameter k at byte slot[k] of those (-1: never read by a step) and its BF16 working copy at
 * slot_bf16[k] (-1: none), which param_at and param_bf16_at (allocated here, n_params) then tell
 * the executor; the pool's own BF16 copies are gone (wb NULL). dw_exec_unshard_weights: the whole
 * pool again, holding the shard's floats at [lo, hi) and zeros elsewhere (the caller gathers the
 * rest and refreshes the BF16 copies). Both leave the pools as they were on failure. */
dw_status dw_exec_shard_weights(dw_exec *x, int64_t lo, int64_t hi, int64_t gather_bytes, const int64_t *slot,
                                const int64_t *slot_bf16);
dw_status dw_exec_unshard_weights(dw_exec *x);
/* Whether every parameter's FP32 master is in the weights pool at its offset (not ZeRO-3 sharded,
 * from creation or by dw_exec_shard_weights); DW_ERR_UNSUPPORTED naming `what` otherwise. */
dw_status dw_exec_weights_whole(const dw_exec *x, const char *what);

/* Whether the gradient pool is whole (not a ZeRO-2/3 shard from creation); DW_ERR_UNSUPPORTED naming
 * `what` otherwise. A backward also runs on a shard whose staging is attached (grad_at). */
dw_status dw_exec_grads_whole(const dw_exec *x, const char *what);

/* The part of pool floats [off, off + n) whose moments the optimizer pool holds (all of it unless
 * sharded): moment k's (0: m, 1: v) pointer to its first float, *skip floats after off, *count
 * floats (0, and NULL, when the shard holds none of them). With segments (_seg), the first segment
 * that meets the range: a parameter's range meets at most one. */
float *dw_exec_moments_seg(const dw_exec *x, int k, int64_t off, int64_t n, int64_t *skip, int64_t *count);
static inline float *dw_exec_moments(const dw_exec *x, int k, int64_t off, int64_t n, int64_t *skip, int64_t *count) {
    if (x->n_opt_seg) return dw_exec_moments_seg(x, k, off, n, skip, count); /* several ranges */
    const int64_t lo = off > x->opt_lo ? off : x->opt_lo, hi = off + n < x->opt_hi ? off + n : x->opt_hi;
    *skip = lo - off, *count = hi > lo ? hi - lo : 0;
    return *count ? (k ? x->v : x->m) + (lo - x->opt_lo) : NULL;
}

/* The part of pool floats [off, off + n) whose FP32 masters the weights pool holds (all of it unless
 * ZeRO-3 sharded): its pointer, *skip floats after off, *count floats (0, and NULL, when none). */
static inline float *dw_exec_masters(const dw_exec *x, int64_t off, int64_t n, int64_t *skip, int64_t *count) {
    const int64_t lo = off > x->w_lo ? off : x->w_lo, hi = off + n < x->w_hi ? off + n : x->w_hi;
    *skip = lo - off, *count = hi > lo ? hi - lo : 0;
    return *count ? x->w + (lo - x->w_lo) : NULL;
}

/* The parameter pools' pointers of parameter k (FP32 master, gradient, m, v). */
static inline int64_t dw_exec_param_off(const dw_exec *x, int k) { return x->p->param_off[k]; }

#endif /* DW_RUNTIME_EXEC_H */
