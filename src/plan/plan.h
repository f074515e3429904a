/* plan.h — private: the autoplanner. A job (model shape, sequence, global batch, precision, MoE
 * options) on a machine (dw_hw) → ranked parallel plans (DP/TP/PP/EP/CP, micro-batch, schedule,
 * recompute, ZeRO, offload) with predicted step time, MFU and memory. Analytical only: it runs
 * no kernels. Formulas and assumptions: docs/planner.md. */
#ifndef DW_PLAN_PLAN_H
#define DW_PLAN_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "capture/model_config.h"
#include "deepwell.h"
#include "probe/hw.h"

/* ---- job ------------------------------------------------------------------------------------ */
/* The recipes the planner models (GEMM rates, memory, the engine's policy), in this order:
 * bf16, fp8_block, mxfp8, nvfp4 (dw_plan_supports_recipe in deepwell.h says the same). */
#define DW_PLAN_RECIPES 4
extern const dw_recipe dw_plan_recipes[DW_PLAN_RECIPES];

typedef struct {
    int64_t seq;            /* tokens per sequence */
    int64_t global_batch;   /* sequences per optimizer step */
    dw_recipe recipe;       /* one of dw_plan_recipes */
    /* MoE overrides; 0 = take from the model config (experts, top_k, capacity_factor; capacity
     * dropless → 1.0) */
    int64_t moe_experts, moe_top_k;
    double moe_capacity;
    double mem_headroom;    /* fraction of HBM kept free; default 0.10 */
} dw_job;

/* ---- a plan --------------------------------------------------------------------------------- */
/* dw_recompute and its names are public (deepwell.h). */
/* 1F1B (PipeDream-Flush), interleaved 1F1B with virtual stages (Megatron-LM), and DualPipe
 * (DeepSeek-V3: a bidirectional pipeline, micro-batches fed from both ends, rank s holding
 * stages s and pp-1-s; always with all-to-all overlap). */
typedef enum { DW_SCHED_1F1B = 0, DW_SCHED_INTERLEAVED, DW_SCHED_DUALPIPE } dw_sched;
const char *dw_sched_name(dw_sched s);

typedef struct {
    int dp, tp, pp, ep, cp;
    int vpp;                /* virtual stages per pipeline rank (1: plain 1F1B) */
    /* expert tensor parallelism: how many ranks split each expert's matrices, tp (0 means tp)
     * or 1 (Megatron-Core's MoE parallel folding: attention under TP, experts whole, the EP group
     * then spanning TP ranks too: ep must divide dp * tp / etp) */
    int etp;
    int64_t micro_batch;    /* sequences per micro-batch per DP rank */
    int64_t grad_accum;     /* micro-batches per step per DP rank = G / (dp * micro_batch) */
    dw_sched sched;
    /* EP all-to-all of one micro-batch overlapped with another's compute in the steady phase
     * (a backward merged with the next forward: Megatron-Core's 1F1B A2A overlap; DualPipe's
     * F&B chunks); only with ep > 1 */
    bool a2a_overlap;
    dw_recompute recompute;
    int zero;               /* 0..3 (3 = FSDP) */
    bool offload;           /* optimizer state + step on the host */
} dw_par;

/* The plan's expert tensor parallelism (etp 0 stands for tp), and the ranks that hold the same
 * expert shard (expert data parallelism): dp * cp * tp / (ep * etp). */
static inline int dw_par_etp(const dw_par *p) { return p->etp > 0 ? p->etp : p->tp; }
static inline double dw_par_expert_dp(const dw_par *p) {
    return (double)p->dp * p->cp * p->tp / ((double)p->ep * dw_par_etp(p));
}

/* Memory per GPU and step time: the public result structs (deepwell.h) are the planner's own. */
typedef dw_plan_mem dw_mem;
typedef dw_plan_cost dw_cost;

/* What the public cost struct does not carry (plan_json.c prints it). */
typedef struct {
    double ep_hidden;           /* EP all-to-all hidden under other compute (slowest stage) */
    double recompute;           /* recomputation inside the slowest stage's backward */
} dw_cost_extra;

typedef struct {
    dw_par par;
    dw_mem mem;
    dw_cost cost;
    dw_cost_extra x;
    bool runs;                  /* Deepwell's engine runs it as it is (dw_plan_engine_runnable): its
                                   time and memory are the engine's; ranked ahead of plans it does not */
} dw_plan_entry;

/* ---- rejection reasons ---------------------------------------------------------------------- */
#define DW_REJECT_LIST(X)                                                               \
    X(TP_HEADS, "heads_not_divisible_by_tp")                                           \
    X(TP_KV_HEADS, "kv_heads_not_divisible_by_tp")                                     \
    X(TP_DOMAIN, "tp_exceeds_nvlink_domain")                                           \
    X(PP_LAYERS, "layers_not_divisible_by_pp_x_virtual")                               \
    X(EP_EXPERTS, "experts_not_divisible_by_ep")                                       \
    X(EP_DP, "ep_does_not_divide_dp")                                                  \
    X(BATCH, "global_batch_not_divisible_by_dp_x_micro_batch")                         \
    X(CP_SEQ, "seq_not_divisible_by_2cp")                                              \
    X(INTERLEAVE_MB, "interleaved_needs_micro_batches_multiple_of_pp")                 \
    X(ZERO_PP, "zero2_3_with_pipeline")                                                \
    X(SCHEDULE, "schedule_needs_moe_or_even_stages")                                   \
    X(ENGINE, "one_gpu_engine_has_no_recompute_zero_offload")                          \
    X(MEMORY, "memory_exceeds_hbm_minus_headroom")                                     \
    X(SIM_SIZE, "micro_batches_x_stages_over_simulation_limit")                        \
    X(DOMINATED, "slower_than_kept_plans")
typedef enum {
#define X(id, name) DW_REJECT_##id,
    DW_REJECT_LIST(X)
#undef X
    DW_REJECT_COUNT
} dw_reject;
const char *dw_reject_name(dw_reject r);

#define DW_PLAN_EXAMPLE_LEN 360
/* Largest micro-batches x virtual stages the search simulates (memory ~ 16 bytes each). */
#define DW_PLAN_SIM_LIMIT (1 << 22)
#define DW_PLAN_EXAMPLES 3
typedef struct {
    int64_t count[DW_REJECT_COUNT];
    /* up to DW_PLAN_EXAMPLES examples per reason, with different (dp, tp, pp, cp, ep); the
     * first is example[r][0] */
    char example[DW_REJECT_COUNT][DW_PLAN_EXAMPLES][DW_PLAN_EXAMPLE_LEN];
    int n_examples[DW_REJECT_COUNT];
    int degrees[DW_REJECT_COUNT][DW_PLAN_EXAMPLES][5];
} dw_rejections;

/* ---- GEMM rates ----------------------------------------------------------------------------- */
/* Measured GEMM rates from a `deepwell bench gemm --json` file:
 * {"results": [{"m":4096,"n":4096,"k":4096,"recipe":"bf16","tflops":712.5}, ...]} (a bare array
 * of the same objects is accepted too). */
typedef struct {
    int64_t m, n, k;
    dw_recipe recipe;
    double tflops;
} dw_gemm_point;
typedef struct {
    dw_gemm_point *pts;
    int n;
} dw_gemm_table;
dw_status dw_gemm_table_load(dw_ctx *ctx, const char *path, dw_gemm_table *out);
void dw_gemm_table_free(dw_gemm_table *t);

/* ---- the context every cost function reads -------------------------------------------------- */
typedef struct dw_plan_in_s {
    const dw_model_config *cfg;
    const dw_hw *hw;
    dw_job job;                 /* with defaults filled in */
    const dw_gemm_table *gemm;  /* NULL: analytical curve only */
    /* derived: */
    int64_t n_gpus;             /* nodes * GPUs per node */
    int64_t experts, top_k;     /* effective MoE (0 experts: dense) */
    double capacity;
    int64_t moe_layers;         /* layers whose MLP is an MoE */
    /* Deepwell's CUDA engine (engine.c): whether it can run this model and job on one GPU
     * (a captured family, no MoE, seq within the positions); why not otherwise. */
    bool engine_model;
    char engine_why[200];
    /* PaLM model FLOPs per token of the captured graph at job.seq (ir/op_cost.c), when capture
     * builds the model; 0 otherwise (then the closed form of model.c stands in) */
    double graph_flops_per_token;
} dw_plan_in;

/* Fills defaults and validates the job against model and hardware (message names the field). */
dw_status dw_plan_in_init(dw_ctx *ctx, const dw_model_config *cfg, const dw_hw *hw,
                          const dw_job *job, const dw_gemm_table *gemm, dw_plan_in *out);

/* ---- model arithmetic (model.c) -------------------------------------------------------------- */
typedef struct {
    double attn, mlp, norms;    /* one transformer block (dense MLP), all ranks together */
    double moe_experts;         /* one MoE block: all routed experts */
    double moe_shared, router;  /* shared experts, router */
    double embed, pos, lm_head, final_norm; /* lm_head 0 when tied */
    double total;               /* whole model, tied embeddings counted once */
    double active_per_token;    /* matmul params a token passes through (incl. LM head) */
} dw_param_counts;
void dw_plan_params(const dw_plan_in *in, dw_param_counts *out);
/* Model FLOPs per token for one training step (fwd+bwd, no recompute; PaLM/Megatron convention):
 * the op table's count over the captured graph (graph_flops_per_token) when capture builds the
 * model, else the closed form below. */
double dw_plan_model_flops_per_token(const dw_plan_in *in);
/* The closed form: 6 * active matmul params + 12 * L * H * head_dim * seq (attention scores,
 * counted non-causal), for models capture cannot build yet (MoE layers); the tests hold it equal
 * to the op table's count on every model capture builds. */
double dw_plan_formula_flops_per_token(const dw_plan_in *in);

/* ---- pieces of the cost model (cost.c, comm.c, memory.c) -------------------------------------- */
/* Achievable dense GEMM rate (FLOP/s) for C[m,n] = A[m,k] B[k,n] under a precision. */
double dw_plan_gemm_rate(const dw_plan_in *in, dw_recipe prec, double m, double n, double k);
/* Dense datasheet peak (FLOP/s) the precision's GEMMs run at: BF16, FP8 (fp8_block, mxfp8, and
 * nvfp4 emulated on Hopper), FP4 (nvfp4 on Blackwell). The basis of MFU and HFU. */
double dw_plan_peak_flops(const dw_gpu_info *g, dw_recipe prec);
/* Analytical efficiency (fraction of the precision's datasheet peak). */
double dw_plan_gemm_eff(const dw_gpu_info *g, dw_recipe prec, double m, double n, double k);

typedef enum { DW_COLL_ALLREDUCE = 0, DW_COLL_ALLGATHER, DW_COLL_REDUCESCATTER, DW_COLL_ALLTOALL,
               DW_COLL_P2P } dw_coll;
/* Seconds for a collective over `n` ranks spaced `stride` GPUs apart; `bytes` is the full
 * (gathered) buffer per rank for AG/RS/AR, the bytes each rank sends for all-to-all and p2p. */
double dw_plan_coll_time(const dw_hw *hw, dw_coll c, int64_t n, int64_t stride, double bytes);
/* MoE dispatch or combine: seconds for each of `ep` ranks (`stride` GPUs apart) to send `tokens`
 * tokens to top_k experts each, `row_bytes` per copy. max_nodes 0: a plain all-to-all (every copy
 * sent on its own); > 0: node-limited routing (a token reaches at most max_nodes nodes, crosses
 * the network once per remote node and is forwarded over NVLink inside it). */
double dw_plan_moe_a2a_time(const dw_hw *hw, int64_t ep, int64_t stride, double tokens, double top_k,
                            double row_bytes, int64_t max_nodes);
/* The node limit of the model's group-limited routing for an EP group (0: none): topk_group
 * groups, each spanning max(1, nodes / n_group) of the nodes the group covers. */
int64_t dw_plan_node_limit(const struct dw_plan_in_s *in, int64_t ep, int64_t stride);

/* The busiest EP rank's expert work over the balanced share, for `ep` ranks: 1 when a capacity
 * factor caps the experts (their padded capacity is priced as such), for one rank or a
 * bias-balanced router; for a dropless auxiliary-loss router
 * 1 + CV sqrt(2 ln ep) / sqrt(E / ep) with CV the per-expert share's relative deviation
 * (moe_load.c, docs/planner.md "Expert load"). */
#define DW_PLAN_EXPERT_LOAD_CV 0.10
double dw_plan_expert_load(const struct dw_plan_in_s *in, int ep);

/* Evaluates one parallel configuration: memory, then (when `simulate`) timing. Returns false
 * and the reason when it violates a constraint (reason DW_REJECT_COUNT when valid). */
bool dw_plan_evaluate(const dw_plan_in *in, const dw_par *par, bool simulate, dw_plan_entry *out,
                      dw_reject *reason, char *detail, int detail_len);
/* Timing of a configuration that passed evaluation: fills out->cost. With prune_above set, skips
 * the simulation and returns false when the lower bound (busiest stage, no bubbles) is already
 * >= *prune_above (out->cost.step then holds that bound). */
bool dw_plan_time(const dw_plan_in *in, const dw_par *par, dw_plan_entry *out, const double *prune_above);
/* The event simulation's input for a plan (si points into the caller's arrays fw, bw, fc, bc of
 * pp*vpp model stages: forward/backward seconds of one micro-batch, and of them the EP
 * all-to-all; the p2p hop time; the schedule's overlap and DualPipe flags). */
struct dw_sim_in_s;
void dw_plan_sim_input(const dw_plan_in *in, const dw_par *par, double *fw, double *bw, double *fc, double *bc,
                       struct dw_sim_in_s *si);
/* The chunks a pipeline rank holds (vpp; DualPipe: 2) and the model stage (of pp*vpp pieces of
 * the layer stack, dw_plan_vstage's index) chunk ch of rank s holds: ch*pp + s; DualPipe: s for
 * chunk 0, pp-1-s for chunk 1. */
int dw_plan_chunks(const dw_par *p);
int dw_plan_chunk_stage(const dw_par *p, int s, int ch);
/* Memory per GPU for a configuration (worst stage). */
void dw_plan_memory(const dw_plan_in *in, const dw_par *par, dw_mem *out);
/* The same for every pipeline rank: ranks[pp] (worst_stage holds the rank's own index). */
void dw_plan_memory_ranks(const dw_plan_in *in, const dw_par *par, dw_mem *ranks);

/* ---- Deepwell's own CUDA engine (engine.c) -------------------------------------------------- */
/* A plan the engine runs as it is: one GPU (dp = tp = pp = cp = ep = 1, v = 1) without ZeRO, or
 * data parallelism alone (dp > 1, tp = pp = cp = ep = v = 1) with ZeRO 0-2 (train/dp.c), or ZeRO-3
 * of the BF16 recipe (train/dp_zero3.c gathers no quantised weight caches); any recompute, no
 * offload, and in->engine_model. Otherwise false with the first reason in `why` (may be NULL).
 * The planner's memory and time for such plans describe the engine, and on a one-GPU machine
 * with in->engine_model it plans for the engine alone: configurations with ZeRO or offload are
 * rejected (DW_REJECT_ENGINE). */
bool dw_plan_engine_runnable(const dw_plan_in *in, const dw_par *par, char *why, int why_len);
/* Whether the runtime runs this ep > 1 plan with --ep (train/ep.c: data x expert parallel, tp = pp =
 * cp = 1, any recompute, ZeRO 0-2, a model the engine builds): memory.c and cost.c then
 * price it as the runtime holds and runs it — the engine's program at ep 1 plus expert
 * parallelism's buffers and exchanges. */
bool dw_plan_runtime_ep(const dw_plan_in *in, const dw_par *par);
/* Data parallelism as the runtime runs it (runtime_dp.c) for a plan dw_plan_engine_runnable
 * accepts with dp > 1: seconds of collectives (*all; *exposed: the part the backward of `bwd`
 * seconds, one micro-batch's, does not hide when `overlap`, the runtime's default; all of it
 * without) and of the optimizer (*opt: engine_opt, the one-GPU engine's AdamW, or its 1/dp shard
 * under ZeRO-1/2/3). ZeRO-3 adds its gathers (dw_plan_engine_zero3), every micro-batch: with
 * `overlap`, prefetched (gather_exposed_s exposed); without, as under DW_Z3_PREFETCH=0, all exposed.
 * dp 1: zeros and engine_opt. */
void dw_plan_runtime_dp(const dw_plan_in *in, const dw_par *par, double engine_opt, double bwd, bool overlap,
                        double *all, double *exposed, double *opt);
/* A broadcast of `bytes` from one rank to n (comm.c): a ring's bandwidth term without
 * all-gather's (n-1)/n, as NCCL pipelines it. */
double dw_plan_broadcast_time(const dw_hw *hw, int64_t n, double bytes);
/* ZeRO-3 as train/dp_zero3.c runs it, for a plan with dp > 1 at its micro-batch and recompute: the
 * gather block as the runtime plans it (compile/z3_slots.h over the compiled program's steps, then
 * dw_memplan_assign), each rank's FP32 masters (the largest shard, compile/shard.h, 256-aligned;
 * weights pool = shard + gather), and one micro-batch's gathers: every parameter a forward step
 * reads broadcast once before the forward, every one a backward step reads (recomputed forwards
 * too) once before the backward, each in parts from the ranks whose shards hold it, one after
 * another (gather_s). Prefetched (train/dp_zero3_gather.c), the gathers of an event step (the
 * first step of a sweep reading a parameter) start at the sweep's previous event step and run
 * under the compute of the steps from there to their own (the engine's kernel times, node by
 * node); gather_exposed_s sums, per sweep, the first event step's gathers whole and each later
 * one's max(0, gather - that compute). */
typedef struct {
    int64_t gather_bytes, shard_bytes;
    int64_t gathered_floats; /* floats broadcast in one micro-batch (both sweeps) */
    int64_t broadcasts;      /* broadcasts in one micro-batch */
    double gather_s;         /* their seconds */
    double gather_exposed_s; /* the part of them the prefetch leaves exposed (below) */
    double step_compute_s;   /* the forward and backward steps' compute, summed (what could hide them) */
    double cast_s;           /* BF16 programs: each gathered parameter cast to BF16 in its slot, a memory pass
                              * (4 + 2 bytes a float) and a launch per sweep, on the compute stream */
} dw_engine_zero3;
dw_status dw_plan_engine_zero3(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, dw_engine_zero3 *out);
/* One sweep's (steps [s0, s1)) gather seconds the prefetch leaves exposed: gather[s] > 0 marks an
 * event step and its gathers' seconds, step_s[s] the step's compute; the first event step's
 * gathers whole, each later one's max(0, gather[s] - the compute of the steps from the previous
 * event step to s). */
double dw_plan_z3_prefetch_exposed(int s0, int s1, const double *gather, const double *step_s);
/* ZeRO-2/3's gradient staging as train/dp_stage.c allocates it beside the gradients' shard, for a
 * plan with dp > 1 at its micro-batch and recompute: compile/grad_stage.h's slots over the compiled
 * program with the default bucket, reductions overlapped with backward. */
dw_status dw_plan_engine_grad_stage(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, int64_t *bytes);
/* Expert parallelism's buffers for the group's rows on each rank of a plan with ep > 1, as
 * train/ep.c allocates them (train/ep_buffers.h over the engine's program at the plan's
 * micro-batch and recompute, groups of par->ep): *bytes their total; 0 with DW_OK for ep 1. */
dw_status dw_plan_engine_ep_buffers(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, int64_t *bytes);
/* The precision policy the engine runs a planned recipe with: "bf16"; a quantised recipe with
 * the safe fallback (embedding, LM head, first and last block in BF16), as the cost model
 * assumes. Caller dw_policy_free. */
dw_status dw_plan_recipe_policy(dw_ctx *ctx, dw_recipe r, dw_policy **out);
/* The engine's device memory for one GPU at micro-batch b: the five pools of dw_compile's
 * static plan (weights, grads, optimizer, activations, workspace: the engine allocates exactly
 * these), the GEMM layer's cuBLASLt workspace, cuDNN attention's buffers and a CUDA-context
 * allowance. Computed by capturing and compiling the graph (no GPU). */
typedef dw_plan_engine_mem dw_engine_mem; /* the public result struct (deepwell.h) */
/* What BF16 attention through cuDNN (the engine's default, kernels/cuda/attn_cudnn.c) holds for
 * one (B, T, H, Hkv, D) shape, shared by every layer of that shape: the backward's FP32 dQ
 * accumulator B*H*T*D*4, as much again of workspace when K/V heads are grouped (Hkv < H), and
 * 512 B of forward/backward workspace. 0 where cuDNN does not run it (D % 8 or D > 128). */
int64_t dw_plan_cudnn_attention_bytes(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D);
/* CUDA context and kernel images resident before the engine allocates (an allowance, checked
 * against cudaMemGetInfo by `deepwell dryrun --run`). */
#define DW_PLAN_CUDA_CONTEXT ((int64_t)512 << 20)
dw_status dw_plan_engine_memory(dw_ctx *ctx, const dw_plan_in *in, int64_t micro_batch, int recompute,
                                dw_engine_mem *out);
/* The same for configuration par, as `deepwell train` runs it: the gradients and BF16 copies in
 * the activation pool (dw_compile_opts.grad_arena, bf16_arena) where par runs one micro-batch a
 * step under ZeRO 0 or 1 (dw_compile_opts_train_arenas; DW_GRAD_ARENA=0 / DW_BF16_ARENA=0 turn
 * them off), the pools elsewhere; dw_plan_engine_memory takes the library's default (the pools
 * unless DW_GRAD_ARENA=1) whatever the plan. */
dw_status dw_plan_engine_memory_par(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, dw_engine_mem *out);
/* The engine's time for one micro-batch (forward, backward) and one AdamW step, walking the
 * compiled graph node by node: each linear node's three GEMMs at their own shapes and recipes
 * (a GEMM the quantised kernel refuses runs in BF16, as the engine does) through
 * dw_plan_gemm_rate (so --gemm-rates applies), the quantisation of both operands of every
 * quantised GEMM, attention at the engine kernel's rate, and every other op by the bytes its
 * kernels move; under recompute (selective or full) each node whose forward runs again
 * in the backward sweep is counted again there. Rates and byte counts: docs/planner.md
 * ("Deepwell's engine"). */
typedef dw_plan_engine_cost dw_engine_time; /* the public result struct (deepwell.h) */
dw_status dw_plan_engine_time(dw_ctx *ctx, const dw_plan_in *in, int64_t micro_batch, int recompute,
                              dw_engine_time *out);
/* What a kernel launch costs beyond its work. Replayed: inside the recorded CUDA graph the
 * one-GPU engine replays from a shape's second step (the gap between kernels, ramp-up and tail of
 * short grids), fitted on the H200 (docs/planner.md: gpt2-124m at micro-batch 1 x 16
 * accumulations, 97.5 ms measured against 48.3 ms of modelled work over 16 x ~340 launches).
 * Eager: each step issued by the host as it comes: the replayed gap plus the host's issue of the
 * launch (the executor's dispatch and cudaLaunchKernel), measured on an H100 (bench/RESULTS.md,
 * session 19 call D: gpt2-124m B1 T1024, 5.620 ms a step replayed, 6.229 ms with DW_CUDA_GRAPH=0,
 * 0.61 ms over ~350 launches: 1.8 us more each). dw_plan_engine_time prices launches replayed. */
#define DW_PLAN_LAUNCH_REPLAYED_S 6.0e-6
#define DW_PLAN_LAUNCH_EAGER_S 7.8e-6
/* Whether the runtime replays a recorded training step for plan par: one GPU, yes; several ranks
 * only without overlap and below ZeRO-3, since overlapped reductions (train/dp_overlap.c) and
 * ZeRO-3's gathers (train/dp_zero3.c) run between the executor's steps, which stop recording. */
bool dw_plan_runtime_replays(const dw_par *par, bool overlap);
/* The engine's time for plan par's micro-batch and recompute as the runtime runs it with overlap
 * (the search's assumption): launches replayed or eager as dw_plan_runtime_replays says. */
dw_status dw_plan_engine_time_par(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, dw_engine_time *out);

/* ---- pipeline event simulation (pipesim.c) ---------------------------------------------------- */
typedef enum { DW_OP_F = 0, DW_OP_B } dw_op_kind;
typedef struct {
    int stage, chunk, mb;
    dw_op_kind kind;
    double start, end;
} dw_sim_op;
typedef struct dw_sim_in_s {
    int p, v, m;
    /* durations [p*v] indexed by virtual stage vs = chunk * p + stage (DualPipe: [p] by model
     * stage; rank s runs stage s for the first m/2 micro-batches, stage p-1-s for the others) */
    const double *fwd, *bwd;
    double p2p;                 /* seconds per activation/gradient hop between ranks */
    /* of fwd/bwd, the EP all-to-all that overlap can hide ([p*v]; NULL: none) */
    const double *fcomm, *bcomm;
    bool overlap;               /* merge a backward with the next forward (1F1B, interleaved) */
    bool dual;                  /* DualPipe (v == 1, p and m even; always overlapped) */
} dw_sim_in;
/* While hidden all-to-all runs, its kernels hold this share of the SMs (DeepSeek-V3: 20 of
 * 132), so the overlapped compute stretches by this fraction of the hidden time. */
#define DW_PLAN_A2A_SM_SHARE (20.0 / 132.0)
typedef struct {
    double makespan;
    double *busy;               /* [p] busy seconds per stage */
    double *comm_exposed;       /* [p] all-to-all seconds not hidden (in busy) */
    double *comm_hidden;        /* [p] all-to-all seconds hidden under other compute */
    int *max_inflight;          /* [p] max forward chunks outstanding (F done, B not) */
    dw_sim_op *ops;             /* [2*m*v*p] when kept; each stage's ops appear in its schedule order */
    int64_t n_ops;
} dw_sim_out;
/* Simulates one step of 1F1B (v == 1), interleaved 1F1B (v > 1, needs m % p == 0), either with
 * all-to-all overlap, or DualPipe (pipesim_dual.c).
 * Returns DW_ERR_INVALID for bad shapes, DW_ERR_NOMEM on allocation failure. */
dw_status dw_pipe_simulate(dw_ctx *ctx, const dw_sim_in *in, bool keep_ops, dw_sim_out *out);
void dw_sim_out_free(dw_sim_out *o);
/* DualPipe's event simulation (pipesim_dual.c); dw_pipe_simulate calls it for in->dual. */
dw_status dw_pipe_simulate_dual(dw_ctx *ctx, const dw_sim_in *in, bool keep_ops, dw_sim_out *out);
/* Allocates out's per-rank arrays (and ops when keep_ops) for p ranks and n ops (pipesim_common.c). */
dw_status dw_sim_out_alloc(dw_ctx *ctx, int p, int64_t n_ops, bool keep_ops, dw_sim_out *out);
/* Seconds of a backward merged with a forward: both compute parts, the all-to-all neither hides,
 * and the SM share of the hidden part; *exposed and *hidden receive the two all-to-all parts. */
double dw_pipe_merged(double f, double fc, double b, double bc, double *exposed, double *hidden);
/* Schedule shape (closed forms of the op order, used by memory before any simulation):
 * forward chunks a rank runs before its first backward, and the most forward chunks it holds
 * (activations in flight). 1F1B: min(p - s, m); interleaved: min(2(p-s-1) + (v-1)p + 1, m v). */
int dw_pipe_warmup(int p, int v, int m, int stage);
int dw_pipe_inflight(int p, int v, int m, int stage);

/* ---- families of configurations (family.c) ----------------------------------------------------- */
/* What `--explain` accounts for beyond the kept plans: for each family (a configuration may be
 * in several), how many were feasible, why the others were rejected, and its fastest member. */
#define DW_FAMILY_LIST(X)                                                                       \
    X(NO_PIPELINE, "no pipeline (pp 1)")                                                       \
    X(PIPELINE_1F1B, "pipeline, 1F1B (pp > 1, v 1)")                                           \
    X(INTERLEAVED, "pipeline, interleaved 1F1B (v > 1)")                                       \
    X(DUALPIPE, "pipeline, DualPipe")                                                          \
    X(A2A_OVERLAP, "all-to-all overlap (1F1B or interleaved)")                                 \
    X(TP, "tensor parallel (tp > 1)")                                                          \
    X(CP, "context parallel (cp > 1)")                                                         \
    X(EP, "expert parallel (ep > 1)")                                                          \
    X(ETP_FOLDED, "experts out of TP (etp 1 < tp)")                                            \
    X(ZERO3, "ZeRO-3 (FSDP)")                                                                  \
    X(OFFLOAD, "optimizer offload")                                                            \
    X(FULL_RECOMPUTE, "full recompute")
typedef enum {
#define X(id, name) DW_FAMILY_##id,
    DW_FAMILY_LIST(X)
#undef X
    DW_FAMILY_COUNT
} dw_family;
const char *dw_family_name(dw_family f);
/* The families p belongs to, one bit each. */
unsigned dw_family_mask(const dw_par *p);
typedef struct {
    int64_t feasible;                   /* passed every constraint and fit in memory */
    int64_t rejected[DW_REJECT_COUNT];  /* by reason (slower_than_kept_plans: feasible, not kept) */
    bool simulated;                     /* `best` was simulated (its step is exact) */
    dw_plan_entry best;                 /* the fastest simulated member */
    char best_summary[160];             /* its dw_par_format */
    double lower_bound;                 /* the smallest lower bound of a member never simulated
                                           (busiest stage, no bubble); 0: none */
} dw_family_stats;

/* ---- search, checker, output (search.c, check.c, plan_out.c) ---------------------------------- */
typedef struct {
    dw_plan_entry *plans;       /* best first, up to top_k */
    int n_plans;
    dw_rejections rej;
    dw_family_stats fam[DW_FAMILY_COUNT];
    int64_t evaluated;          /* configurations considered */
    int64_t feasible;           /* configurations that passed every constraint */
} dw_plan_result;
dw_status dw_plan_search(dw_ctx *ctx, const dw_plan_in *in, int top_k, dw_plan_result *out);
void dw_plan_result_free(dw_plan_result *r);
/* Family `family`'s account in r as deepwell.h's dw_plan_family_info (plan_explain.c). */
void dw_family_info(const dw_plan_result *r, int family, dw_plan_family_info *out);

/* Independent re-check of a plan's constraints (divisibility, domain, memory re-derived). Writes
 * one line per failed check into `why` (may be NULL). Returns the number of failed checks. */
int dw_plan_check(const dw_plan_in *in, const dw_par *par, char *why, int why_len);

/* A human-readable one-liner: "dp8 tp8 pp16 v1 cp1 ep1 mb1 ga16 1f1b rc=none zero1". */
void dw_par_format(const dw_par *p, char *buf, int len);

/* A plan's step split into terms that add up to it (plan_explain.c): compute (the slowest rank's
 * busy time less the communication and recomputation inside it), exposed TP, CP, EP,
 * recomputation, bubble and p2p waits (pipeline - busy), exposed DP/ZeRO, optimizer; with their
 * JSON names. */
#define DW_PLAN_TIME_TERMS 8
extern const char *const dw_plan_time_term_names[DW_PLAN_TIME_TERMS];
void dw_plan_time_terms(const dw_plan_entry *e, double t[DW_PLAN_TIME_TERMS]);

/* JSON of a plan entry / whole result (jansson objects; caller json_decref). */
struct json_t;
struct json_t *dw_plan_entry_json(const dw_plan_in *in, const dw_plan_entry *e);
/* The layout fields of a plan object ("summary" .. "offload"), and the predictions added to one. */
struct json_t *dw_par_json(const dw_par *p);
void dw_plan_entry_add_predictions(struct json_t *o, const dw_plan_entry *e);
struct json_t *dw_plan_result_json(const dw_plan_in *in, const dw_plan_result *r);
/* Reads a plan's parallel settings from a JSON object (the "best" object, an alternative, or a
 * whole `deepwell plan --json` document, whose "best" is taken). */
dw_status dw_par_from_json(dw_ctx *ctx, const struct json_t *j, const char *what, dw_par *out);

/* SVG timeline of one step of the plan's pipeline, written atomically (dw_plan_write_svg). */
dw_status dw_pipe_write_svg(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, const char *path);

#endif /* DW_PLAN_PLAN_H */
