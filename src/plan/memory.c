/* memory.c — peak memory per GPU of a parallel configuration: weights (+ low-precision caches),
 * FP32 gradients, FP32 master + Adam moments by ZeRO stage and offload, activations by recompute
 * and the schedule's in-flight micro-batches, logits, workspace, quantisation scales, and under
 * expert parallelism the runtime's buffers for the group's rows (ep_buffers below). A plan
 * Deepwell's engine runs as it is (one GPU, or data parallelism over several: every rank allocates
 * the whole pools but, under ZeRO-1/2/3, its shard's moments only, under ZeRO-2/3 its shard's gradients
 * plus the staging slots, and under ZeRO-3 also its shard of the masters plus the gather block
 * instead of the whole weights) takes the engine's compiled pools
 * instead (engine.c, compile/shard.h, compile/z3_slots.h); so does a plan it runs with --ep (data x
 * expert parallel, ZeRO 0-2), whose ranks keep the whole model as data parallelism does, plus the
 * buffers for the group's rows. */
#include <string.h>

#include "compile/shard.h"
#include "plan/layout.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
/* CUDA context, cuBLAS(Lt) workspaces, NCCL channels, allocator slack: a fixed 1 GiB. */
#define FIXED_WORKSPACE (1.0 * GIB)

/* Deepwell's engine on one GPU or each data-parallel rank: its pools as dw_compile plans them
 * (engine.c). */
static bool engine_memory(const dw_plan_in *in, const dw_par *par, dw_mem *out) {
    dw_engine_mem em;
    if (!dw_plan_engine_runnable(in, par, NULL, 0) || dw_plan_engine_memory_par(NULL, in, par, &em) != DW_OK)
        return false;
    int64_t rank_pools[DW_POOL_COUNT]; /* each rank's: ZeRO-1/2/3 hold their shard's moments, ZeRO-2/3 their
                                          shard's gradients plus the staging slots (compile/shard.h, grad_stage.h) */
    dw_shard_pool_bytes(em.pool, em.pool[DW_POOL_OPTIM] / 8, par->dp, par->zero, rank_pools);
    int64_t stage = 0;
    if (par->zero >= 2 && par->dp > 1 && dw_plan_engine_grad_stage(NULL, in, par, &stage) != DW_OK) return false;
    rank_pools[DW_POOL_GRADS] += stage;
    for (int k = DW_POOL_GRADS; k <= DW_POOL_OPTIM; k++) em.total += rank_pools[k] - em.pool[k], em.pool[k] = rank_pools[k];
    if (par->zero == 3) { /* train/dp_zero3.c: the masters' largest shard, 256-aligned, then the gather block */
        dw_engine_zero3 z;
        if (dw_plan_engine_zero3(NULL, in, par, &z) != DW_OK) return false;
        em.total += z.shard_bytes + z.gather_bytes - em.pool[DW_POOL_WEIGHTS];
        em.pool[DW_POOL_WEIGHTS] = z.shard_bytes + z.gather_bytes;
    }
    out->weights = (double)em.pool[0];     /* FP32 master + BF16 working copy (ZeRO-3: shard + gather block) */
    out->grads = (double)em.pool[1];       /* FP32 (ZeRO-2/3: the shard's + the staging slots) */
    out->optimizer = (double)em.pool[2];   /* AdamW m, v (FP32): the rank's shard under ZeRO-1/2/3 */
    out->activations = (double)em.pool[3]; /* the static arena */
    out->workspace = (double)(em.pool[4] + em.cublaslt + em.attention + em.context);
    out->scales = 0;                       /* quantised operands live in the workspace slots */
    out->total = (double)em.total;
    out->inflight = 1;
    return true;
}

/* Expert parallelism's buffers for the group's rows (train/ep.c, sized by train/ep_buffers.h over
 * the engine's program): on every rank of a plan the runtime runs with --ep (dw_plan_runtime_ep);
 * 0 for ep 1 and for layouts the runtime refuses under --ep. */
static double ep_buffers(const dw_plan_in *in, const dw_par *par) {
    int64_t bytes = 0;
    if (!dw_plan_runtime_ep(in, par)) return 0;
    return dw_plan_engine_ep_buffers(NULL, in, par, &bytes) == DW_OK ? (double)bytes : 0;
}

/* The worst pipeline rank into *out, and every rank into ranks[pp] when not NULL. */
static void memory_ranks(const dw_plan_in *in, const dw_par *par, dw_mem *out, dw_mem *ranks) {
    memset(out, 0, sizeof *out);
    dw_par whole = *par; /* --ep as the runtime runs it: every rank keeps the whole model as data */
    whole.ep = 1;        /* parallelism does (ZeRO-1 by cells shards as it does), plus the buffers */
    const double ep_buf = ep_buffers(in, par);
    const bool ep_run = ep_buf > 0;
    if (engine_memory(in, ep_run ? &whole : par, out)) {
        if (ep_run) out->ep_buffers = ep_buf, out->total += ep_buf;
        out->hbm = (double)in->hw->gpus[0].hbm_bytes;
        out->limit = (1.0 - in->job.mem_headroom) * out->hbm;
        if (ranks) ranks[0] = *out;
        return;
    }
    const dw_model_config *c = in->cfg;
    const dw_gpu_info *g = &in->hw->gpus[0];
    int64_t m = par->grad_accum;
    double T = (double)par->micro_batch * (double)in->job.seq / par->cp; /* tokens per rank */
    double tp = par->tp, d = (double)c->d_model;
    double dpn = (double)par->dp * par->cp, dpn_e = dw_par_expert_dp(par);
    double a = dw_plan_operand_bytes(in->job.recipe);
    bool lowp = in->job.recipe != DW_RECIPE_BF16;
    /* low-precision weight cache: row-wise and column-wise (transposed) copies for fprop/dgrad */
    double cache_b = lowp ? 2 * a : 0, cache_s = lowp ? 2 * dw_plan_weight_scale_bytes(in->job.recipe) : 0;
    double act_d = dw_plan_act_bytes_dense(in, par->recompute) / tp;
    double act_m = dw_plan_act_bytes_moe(in, par->recompute) / tp;
    double act_full_d = dw_plan_act_bytes_dense(in, DW_RECOMPUTE_NONE) / tp;
    double act_full_m = dw_plan_act_bytes_moe(in, DW_RECOMPUTE_NONE) / tp;
    /* quantised GEMM inputs saved per token per block (their scales ride along): QKV and
     * out-projection inputs, then the MLP's (dense) or each routed copy's and the shared
     * experts' (MoE) input and down-projection input */
    double q_dense = 0, q_moe = 0;
    if (lowp && par->recompute == DW_RECOMPUTE_NONE) {
        dw_attn_shape as;
        dw_plan_attn_shape(in, &as);
        double ff = (double)c->d_ff;
        double fe = c->d_ff_expert > 0 ? (double)c->d_ff_expert : ff;
        double fs = c->n_shared_experts > 0 ? fe * (double)c->n_shared_experts : 0;
        q_dense = (as.qin + d + ff) / tp;
        q_moe = (as.qin + (double)in->top_k * in->capacity * (d + fe) + (fs > 0 ? d + fs : 0)) / tp;
    }
    for (int s = 0; s < par->pp; s++) {
        double pd = 0, pe = 0, pm = 0, maxl = 0, chunk_act = 0, chunk_work = 0, q_chunk = 0;
        bool head = false;
        int64_t mtp = 0;
        for (int ch = 0; ch < dw_plan_chunks(par); ch++) {
            dw_vstage st;
            if (!dw_plan_vstage(in, par->pp, par->vpp, dw_plan_chunk_stage(par, s, ch), &st)) return;
            dw_local_params lp;
            dw_plan_local_params(in, par, &st, &lp);
            pd += lp.dense, pe += lp.expert, pm += lp.matmul;
            if (lp.max_layer > maxl) maxl = lp.max_layer;
            double dl = (double)(st.layers - st.moe_layers), ml = (double)st.moe_layers;
            if (in->experts > 0) ml += (double)st.mtp; /* multi-token prediction's blocks */
            else dl += (double)st.mtp;
            mtp = mtp > st.mtp ? mtp : st.mtp;
            double ca = T * (dl * act_d + ml * act_m);
            if (ca > chunk_act) chunk_act = ca;
            double work = T * (ml > 0 ? act_full_m : act_full_d);
            if (work > chunk_work) chunk_work = work;
            double qc = T * (dl * q_dense + ml * q_moe);
            if (qc > q_chunk) q_chunk = qc;
            head = head || st.head;
        }
        double p_all = pd + pe;
        dw_mem mm = {0};
        /* weights: BF16 working copy (+ caches); ZeRO-3 keeps a 1/dp shard and gathers two
         * blocks at a time (current + prefetch). */
        if (par->zero >= 3) {
            mm.weights = 2 * (pd / dpn + pe / dpn_e) + 2 * (2 + cache_b) * maxl;
            mm.scales = 2 * cache_s * maxl;
        } else {
            mm.weights = 2 * p_all + cache_b * pm;
            mm.scales = cache_s * pm;
        }
        /* gradients: FP32 accumulation buffer; ZeRO-2/3 keep the shard plus one block's bucket */
        mm.grads = par->zero >= 2 ? 4 * (pd / dpn + pe / dpn_e) + 4 * maxl : 4 * p_all;
        /* optimizer: FP32 master + Adam m + v = 12 bytes/param; ZeRO>=1 shards; offload: host */
        if (!par->offload) mm.optimizer = par->zero >= 1 ? 12 * (pd / dpn + pe / dpn_e) : 12 * p_all;
        /* DualPipe: p - s micro-batches in flight one way, s + 1 the other (p + 1 in all), each a
         * chunk's activations; the chunk counted is the larger one */
        int inflight = par->sched == DW_SCHED_DUALPIPE ? (int)(m < par->pp + 1 ? m : par->pp + 1)
                                                       : dw_pipe_inflight(par->pp, par->vpp, (int)m, s);
        mm.activations = inflight * chunk_act;
        /* full recompute re-materialises one block's activations during its backward */
        if (par->recompute == DW_RECOMPUTE_FULL) mm.activations += chunk_work;
        mm.scales += inflight * q_chunk * dw_plan_act_scale_bytes(in->job.recipe);
        /* logits on the last stage: BF16 logits + FP32 gradient of one micro-batch's tokens (once
         * more per multi-token-prediction module) */
        if (head) mm.activations += (double)(1 + mtp) * T * (double)c->vocab_size / tp * (2 + 4);
        /* workspace: fixed + two sequence-parallel all-gather buffers of a block input */
        mm.workspace = FIXED_WORKSPACE + (tp > 1 ? 2 * T * d * 2 : 0);
        mm.inflight = (double)inflight / (par->sched == DW_SCHED_DUALPIPE ? 1 : par->vpp);
        mm.ep_buffers = ep_buf;
        mm.total = mm.weights + mm.grads + mm.optimizer + mm.activations + mm.workspace + mm.scales + mm.ep_buffers;
        mm.worst_stage = s;
        mm.hbm = (double)g->hbm_bytes;
        mm.limit = (1.0 - in->job.mem_headroom) * mm.hbm;
        if (ranks) ranks[s] = mm;
        if (s == 0 || mm.total > out->total) {
            *out = mm;
            out->worst_stage = s;
        }
    }
    out->hbm = (double)g->hbm_bytes;
    out->limit = (1.0 - in->job.mem_headroom) * out->hbm;
}

void dw_plan_memory(const dw_plan_in *in, const dw_par *par, dw_mem *out) { memory_ranks(in, par, out, NULL); }

void dw_plan_memory_ranks(const dw_plan_in *in, const dw_par *par, dw_mem *ranks) {
    dw_mem worst;
    memory_ranks(in, par, &worst, ranks);
}
