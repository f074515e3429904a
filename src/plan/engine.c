/* engine.c — the planner's view of Deepwell's own CUDA engine: which plans it runs as they are
 * (one GPU, or data parallelism over several with ZeRO 0-3 (train/dp.c, dp_zero3.c); no offload; recompute
 * none, selective or full) and its exact device memory, taken from dw_compile's
 * static plan — the code the engine allocates from — so prediction and engine cannot drift.
 * Planning only: captures and compiles a graph of shapes, touches no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/bind_grouped.h"
#include "compile/grad_stage.h"
#include "compile/program.h"
#include "compile/shard.h"
#include "compile/wgrad_sumsq.h"
#include "compile/z3_slots.h"
#include "core/env.h"
#include "core/error.h"
#include "plan/layout.h"
#include "train/ep_buffers.h"

_Static_assert(DW_POOL_COUNT == 5, "dw_engine_mem.pool has one entry per pool");

static bool say(char *why, int len, const char *what) {
    if (why && len > 0) snprintf(why, (size_t)len, "%s", what);
    return false;
}

bool dw_plan_runtime_ep(const dw_plan_in *in, const dw_par *par) {
    return par->ep > 1 && par->tp == 1 && par->pp == 1 && par->cp == 1 && par->vpp == 1 && in->engine_model &&
           par->zero <= 2;
}

bool dw_plan_engine_runnable(const dw_plan_in *in, const dw_par *par, char *why, int why_len) {
    char buf[320];
    if (par->tp != 1 || par->pp != 1 || par->cp != 1 || par->ep != 1 || par->vpp != 1) {
        snprintf(buf, sizeof buf, "the plan uses %lld GPUs (dp %d tp %d pp %d cp %d ep %d); the engine runs "
                 "one GPU, or data parallelism over several (dp only)",
                 (long long)par->dp * par->tp * par->pp * par->cp, par->dp, par->tp, par->pp, par->cp, par->ep);
        return say(why, why_len, buf);
    }
    if (!in->engine_model) return say(why, why_len, in->engine_why);
    if (par->recompute < DW_RECOMPUTE_NONE || par->recompute >= DW_RECOMPUTE_COUNT) {
        snprintf(buf, sizeof buf, "recompute %d: not a recompute mode (none, selective, full)", (int)par->recompute);
        return say(why, why_len, buf);
    }
    if (par->dp == 1 && par->zero != 0) {
        snprintf(buf, sizeof buf, "ZeRO-%d on one GPU: the engine has no optimizer-state sharding there", par->zero);
        return say(why, why_len, buf);
    }
    if (par->zero == 3 && in->job.recipe != DW_RECIPE_BF16) {
        snprintf(buf, sizeof buf, "ZeRO-3 with recipe %s: the runtime gathers FP32 and BF16 weights only, not "
                 "quantised weight caches (src/train/dp_zero3.c)", dw_recipe_name(in->job.recipe));
        return say(why, why_len, buf);
    }
    if (par->zero > 3) {
        snprintf(buf, sizeof buf, "ZeRO-%d: there are stages 0 to 3", par->zero);
        return say(why, why_len, buf);
    }
    if (par->offload) return say(why, why_len, "offload: the engine keeps the optimizer on the GPU");
    return true;
}

dw_status dw_plan_recipe_policy(dw_ctx *ctx, dw_recipe r, dw_policy **out) {
    return dw_policy_from_precision(ctx, dw_recipe_name(r), r != DW_RECIPE_BF16, out);
}

/* The engine's compiled plan for the job at micro-batch b (free with release()). */
typedef struct {
    dw_graph *g;
    dw_policy *pol;
    dw_compiled *c;
} compiled_job;

bool dw_compile_opts_train_arenas(dw_compile_opts *o, int64_t grad_accum, int zero) {
    if (grad_accum != 1 || zero < 0 || zero > 1) return false; /* runtime/engine_grad_arena.c refuses these */
    o->grad_arena = dw_env_flag("DW_GRAD_ARENA", true);
    o->bf16_arena = dw_env_flag("DW_BF16_ARENA", true);
    return true;
}

/* The engine's program for the job at micro-batch b. train: NULL, the arenas as the environment
 * asks (dw_compile_opts_init: DW_GRAD_ARENA, DW_BF16_ARENA); else those a training run of that
 * configuration gets (dw_compile_opts_train_arenas), the standing pools where it allows none. */
static dw_status compile_job(dw_ctx *ctx, const dw_plan_in *in, int64_t b, int recompute, const dw_par *train,
                             compiled_job *j) {
    memset(j, 0, sizeof *j);
    DW_TRY(dw_capture_config(ctx, in->cfg, b, in->job.seq, &j->g));
    DW_TRY(dw_plan_recipe_policy(ctx, in->job.recipe, &j->pol));
    dw_compile_opts o; /* the engine's program for the planned GPU, whatever this machine is */
    dw_compile_opts_init(&o, sizeof o);
    o.device = DW_DEVICE_CUDA;
    o.sm = 90;
    o.recompute = recompute;
    o.fused_head = true; /* as `deepwell train` compiles it: the logits a chunk of rows at a time */
    if (train && !dw_compile_opts_train_arenas(&o, train->grad_accum, train->zero)) o.grad_arena = false;
    return dw_compile(ctx, j->g, NULL, j->pol, &o, &j->c);
}

static void release(compiled_job *j) {
    dw_compiled_free(j->c);
    dw_policy_free(j->pol);
    dw_graph_free(j->g);
}

int64_t dw_plan_cudnn_attention_bytes(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
    if (D % 8 || D > 128) return 0;
    const int64_t dq = B * H * T * D * 4;
    return dq + (Hkv < H ? dq : 0) + 512;
}

static dw_status engine_memory(dw_ctx *ctx, const dw_plan_in *in, int64_t micro_batch, int recompute,
                               const dw_par *train, dw_engine_mem *out) {
    memset(out, 0, sizeof *out);
    compiled_job j;
    dw_status s = compile_job(ctx, in, micro_batch, recompute, train, &j);
    if (s == DW_OK) {
        for (int p = 0; p < DW_POOL_COUNT; p++) out->pool[p] = j.c->pool_bytes[p], out->total += j.c->pool_bytes[p];
        out->cublaslt = DW_COMPILE_LT_WORKSPACE;
        out->context = DW_PLAN_CUDA_CONTEXT;
        const dw_graph *g = j.g;
        for (int i = 0; j.c->bf16 && i < g->n_nodes; i++) { /* one cuDNN set per attention shape: the first */
            const dw_ir_attrs *a = &g->nodes[i].attrs;
            if (!DW_OP_IS(&g->nodes[i], DW_OPF_FLASH)) continue;
            out->attention = dw_plan_cudnn_attention_bytes(g->batch, g->seq, a->heads, a->kv_heads, a->head_dim);
            break;
        }
        out->total += out->cublaslt + out->attention + out->context;
    }
    release(&j);
    return s;
}

dw_status dw_plan_engine_memory(dw_ctx *ctx, const dw_plan_in *in, int64_t micro_batch, int recompute,
                                dw_engine_mem *out) {
    return engine_memory(ctx, in, micro_batch, recompute, NULL, out);
}

dw_status dw_plan_engine_memory_par(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, dw_engine_mem *out) {
    return engine_memory(ctx, in, par->micro_batch, (int)par->recompute, par, out);
}

static void price(const dw_plan_in *in, const compiled_job *j, double launch_s, bool norm_parts, double *node_f,
                  double *node_b, dw_engine_time *out);

double dw_plan_z3_prefetch_exposed(int s0, int s1, const double *gather, const double *step_s) {
    double exposed = 0, hidden = -1; /* compute since the previous event step; -1: none yet */
    for (int s = s0; s < s1; s++) {
        if (gather[s] > 0) exposed += hidden < 0 ? gather[s] : fmax(0, gather[s] - hidden), hidden = 0;
        if (hidden >= 0) hidden += step_s[s];
    }
    return exposed;
}

/* A forward or backward step's compute from its nodes' (node_f, node_b): a forward step of an op
 * doing its backward in the forward (DW_OPF_BWD_IN_FWD) both, not when recomputed (arg 1); the
 * fused LM head's loss step the head linear's too (it has no steps of its own); others 0. */
static double step_time(const dw_compiled *p, const dw_step *st, const double *node_f, const double *node_b) {
    const int i = st->node;
    if ((st->kind != DW_STEP_FWD && st->kind != DW_STEP_BWD) || i < 0 || i >= p->g->n_nodes) return 0;
    if (st->kind == DW_STEP_BWD) return node_b[i];
    const bool both = st->arg == 0 && (dw_op_flags(dw_compile_node(p, i)->op) & DW_OPF_BWD_IN_FWD);
    const int h = p->head_linear;
    return node_f[i] + (both ? node_b[i] : 0) + (i == p->head_xent && h >= 0 ? node_f[h] + (both ? node_b[h] : 0) : 0);
}

static double z3_cast_s(const dw_plan_in *in, int64_t n, int sweeps, double launch_s); /* below the engine's rates */

dw_status dw_plan_engine_zero3(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, dw_engine_zero3 *out) {
    memset(out, 0, sizeof *out);
    compiled_job j;
    dw_status s = compile_job(ctx, in, par->micro_batch, (int)par->recompute, par, &j); /* ZeRO-2/3: a pool */
    const dw_compiled *p = j.c;
    const int np = s == DW_OK ? p->n_params : 0, ns = s == DW_OK ? p->n_steps : 0, nn = s == DW_OK ? p->g->n_nodes : 0;
    dw_mem_item *items = calloc((size_t)np + 1, sizeof *items);
    int *item_of = malloc(((size_t)np + 1) * sizeof *item_of), *first = malloc((2 * (size_t)np + 1) * sizeof *first);
    double *gather = calloc((size_t)ns + 1, sizeof *gather), *step_s = calloc((size_t)ns + 1, sizeof *step_s);
    double *node_t = calloc(2 * (size_t)nn + 1, sizeof *node_t); /* (2, n_nodes): forward, backward */
    if (s == DW_OK && (!items || !item_of || !first || !gather || !step_s || !node_t))
        s = dw_set_error(ctx, DW_ERR_NOMEM, "planner: out of memory");
    if (s == DW_OK) s = dw_memplan_assign(ctx, items, dw_z3_slot_items(p, items, item_of, first), &out->gather_bytes);
    if (s == DW_OK) {
        const int world = par->dp;
        out->shard_bytes = (dw_shard_max_floats(p->param_floats, world) * 4 + 255) / 256 * 256;
        for (int k = 0; k < np; k++) { /* train/dp_zero3.c gather(): a part per rank whose shard holds some of k */
            const int sweeps = (first[2 * k] >= 0) + (first[2 * k + 1] >= 0);
            const int64_t a = p->param_off[k], n = dw_ir_numel(&p->g->tensors[p->param_tensor[k]]);
            if (p->bf16 && item_of[k] >= 0) /* dp_zero3_gather.c: the gathered FP32 cast into the slot's BF16 */
                out->cast_s += z3_cast_s(in, n, sweeps, DW_PLAN_LAUNCH_EAGER_S); /* ZeRO-3 never replays */
            for (int r = 0; item_of[k] >= 0 && r < world; r++) {
                int64_t rlo, rhi;
                dw_shard_range(p->param_floats, world, r, &rlo, &rhi);
                const int64_t lo = a > rlo ? a : rlo, hi = a + n < rhi ? a + n : rhi;
                if (hi <= lo) continue;
                const double t = dw_plan_broadcast_time(in->hw, world, 4.0 * (double)(hi - lo));
                out->gathered_floats += sweeps * (hi - lo), out->broadcasts += sweeps, out->gather_s += sweeps * t;
                for (int sw = 0; sw < 2; sw++) /* at the event step: the sweep's first reader of k */
                    if (first[2 * k + sw] >= 0) gather[first[2 * k + sw]] += t;
            }
        }
        dw_engine_time et; /* each step's compute with its launches eager, as ZeRO-3 issues them */
        price(in, &j, DW_PLAN_LAUNCH_EAGER_S, false, node_t, node_t + nn, &et);
        for (int t = 0; t < ns; t++) out->step_compute_s += step_s[t] = step_time(p, &p->steps[t], node_t, node_t + nn);
        for (int ph = DW_PHASE_FORWARD; ph <= DW_PHASE_BACKWARD; ph++)
            out->gather_exposed_s += dw_plan_z3_prefetch_exposed(p->phase[ph][0], p->phase[ph][1], gather, step_s);
    }
    free(items), free(item_of), free(first), free(gather), free(step_s), free(node_t);
    release(&j);
    return s;
}

dw_status dw_plan_engine_grad_stage(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, int64_t *bytes) {
    *bytes = 0;
    compiled_job j;
    dw_status s = compile_job(ctx, in, par->micro_batch, (int)par->recompute, par, &j); /* ZeRO-2/3: a pool */
    dw_grad_stage st;
    if (s == DW_OK) s = dw_grad_stage_plan(ctx, j.c, DW_GRAD_BUCKET_FLOATS, true, &st);
    if (s == DW_OK) *bytes = dw_grad_stage_bytes(&st), dw_grad_stage_free(&st);
    release(&j);
    return s;
}

dw_status dw_plan_engine_ep_buffers(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, int64_t *bytes) {
    *bytes = 0;
    if (par->ep <= 1) return DW_OK;
    compiled_job j;
    dw_status s = compile_job(ctx, in, par->micro_batch, (int)par->recompute, par, &j);
    dw_ep_map map;
    if (s == DW_OK) s = dw_ep_map_build(ctx, j.c, par->ep, &map);
    if (s == DW_OK) {
        dw_ep_bytes b;
        dw_ep_buffer_bytes(j.c, &map, &b);
        *bytes = b.total;
        dw_ep_map_free(&map);
    }
    release(&j);
    return s;
}

/* ---- time --------------------------------------------------------------------------------- */
/* The engine's kernels, as fractions of the GPU's datasheet BF16 peak and HBM bandwidth;
 * derivations in docs/planner.md ("Deepwell's engine"): attention through cuDNN's fused flash
 * attention (the BF16 default) from its times measured on the H200 at GPT-2 B16 T1024 and
 * Llama-1B B8 T2048 (bench/RESULTS.md "Attention through cuDNN": 0.091 / 0.284 and 0.341 / 1.115
 * ms per layer forward / backward; the fit is within 14% of each); memory-bound kernels and AdamW
 * from one H100's moe-e8 and moe-e64 profiles (bench/RESULTS.md "Session 24", call B, and "Session
 * 25", call D): their non-GEMM, non-attention time over the bytes counted below (0.69 and 0.79),
 * and AdamW's 30 bytes a parameter in 25.2 and 28.1 ms (0.87). */
#define ENGINE_ATTN_FWD_EFF 0.40
#define ENGINE_ATTN_BWD_EFF 0.32
#define ENGINE_MEM_EFF 0.70
#define ENGINE_ADAMW_EFF 0.85
/* AdamW per parameter float: read weight, grad, m, v (16 B), write weight, m, v (12 B) and the
 * BF16 working copy (2 B), plus the gradient-norm pass reading the grads (4 B; not those of the
 * experts whose wgrad summed their squares, compile/wgrad_sumsq.h, on one rank). */
#define ENGINE_ADAMW_BYTES 34.0
/* What a kernel launch costs beyond its work: DW_PLAN_LAUNCH_REPLAYED_S inside a replayed CUDA
 * graph, DW_PLAN_LAUNCH_EAGER_S issued step by step (plan.h; which, dw_plan_runtime_replays). What
 * a micro-batch costs beyond its kernels (tokens copied in, the loss read back, a host sync, the
 * graph launch): ENGINE_MICROBATCH_S below. */

/* ZeRO-3's cast of one gathered parameter of n floats to BF16 in its slot, in each of `sweeps`
 * sweeps (train/dp_zero3_gather.c): a memory pass reading 4 and writing 2 bytes a float, and a
 * launch of launch_s. */
static double z3_cast_s(const dw_plan_in *in, int64_t n, int sweeps, double launch_s) {
    return sweeps * ((double)n * 6.0 / (in->hw->gpus[0].hbm_gbps * 1e9 * ENGINE_MEM_EFF) + launch_s);
}
/* The grouped expert GEMM (moe_linear: kernels/cuda/moe_gemm_sm90.cu and moe_gemm_fp8_sm90.cu on
 * Hopper). Each expert's rows are tiled by 128 (MW_BM) on their own, so a group's last tile is on
 * average half empty: the kernel computes R/E + 64 rows per expert. Against a dense GEMM of that
 * padded shape at the pass's recipe every pass runs at ENGINE_GROUPED_REL, fitted on one H100
 * (bench/RESULTS.md "Session 24", call B, `--profile`, bf16): expert forward 29.72 ms on moe-e8 B8
 * and 9.90 ms on moe-e64 B4, predicted 30.6 and 9.6 at 0.86; the backward (57.68 and 23.05) as
 * dgrad and wgrad at that share plus the wgrad's FP32 dW written, 65.0 and 23.2 predicted. */
#define ENGINE_GROUPED_TILE_ROWS 128.0
#define ENGINE_GROUPED_REL 0.86
#define ENGINE_MICROBATCH_S 50e-6

/* The planned recipe whose GEMM rate a node's recipe runs at. */
static dw_recipe rate_recipe(int r) {
    switch (r) {
    case DW_RECIPE_BF16: return DW_RECIPE_BF16;
    case DW_RECIPE_MXFP8: return DW_RECIPE_MXFP8;
    case DW_RECIPE_NVFP4: return DW_RECIPE_NVFP4;
    default: return DW_RECIPE_FP8_BLOCK; /* the other FP8 recipes run on FP8 tensor cores too */
    }
}

/* The engine's time for the compiled job j (dw_engine_time), each kernel launch costing launch_s,
 * and where node_f/node_b are given (n_nodes each) each node's share: its forward (run again in
 * the backward sweep when recomputed) and its backward, kernels, memory passes and launches; the
 * micro-batch's overhead in neither. */
static void price(const dw_plan_in *in, const compiled_job *j, double launch_s, bool norm_parts, double *node_f,
                  double *node_b, dw_engine_time *out) {
    memset(out, 0, sizeof *out);
    const dw_graph *g = j->g;
    const dw_compiled *c = j->c;
    const dw_gpu_info *gpu = &in->hw->gpus[0];
    const double peak = gpu->peak_bf16_tflops * 1e12, bw = gpu->hbm_gbps * 1e9;
    const double N = (double)(g->batch * g->seq), as = c->act_size;
    double mem_f = 0, mem_b = 0; /* bytes */
    double kf = 0, kb = 0;       /* kernel launches, forward / backward */
    double wq_bytes = 0, wq_launches = 0; /* quantised weights' refresh after the optimizer step */
    int prev_x = -1;                      /* x tensor of the last quantised linear node, its recipe */
    int prev_moe_x = -1;                  /* x tensor of the last MoE linear node with a quantised fprop */
    dw_recipe prev_ra = DW_RECIPE_BF16;
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        const dw_ir_tensor *y = &g->tensors[n->out[0]];
        const double fwd0 = out->fwd, memf0 = mem_f, kf0 = kf; /* this node's forward: what it adds */
        const double bwd0 = out->bwd, memb0 = mem_b, kb0 = kb;
        if (DW_OP_IS(n, DW_OPF_GEMM)) {
            kf += 1, kb += 2; /* fprop | dgrad, wgrad */
            const dw_ir_tensor *x = &g->tensors[n->in[0]];
            int64_t K = x->shape[x->ndim - 1], M = y->shape[y->ndim - 1];
            int r = c->node[i].bind.recipe;
            bool qrec = c->bf16 && dw_compile_quant_recipe(r);
            /* elements each pass quantises: x | dy | dy^T, x^T (W and W^T: once per update, below);
             * a node reading the same x as the previous quantised one (q/k/v, gate/up) reuses its
             * x and x^T codes, as the engine does (runtime/cuda/qlinear_cuda.c) */
            const dw_recipe ra = dw_compile_quant_act_recipe(r);
            const bool same_x = qrec && n->in[0] == prev_x && ra == prev_ra;
            if (qrec) prev_x = n->in[0], prev_ra = ra;
            const double xq = same_x ? 0 : N * K;
            const double opnd[DW_QPASS_COUNT] = {xq, N * M, N * M + xq};
            if (qrec) { /* the weight cache: FP32 W read, W and W^T codes written, after each update */
                dw_recipe wp = rate_recipe(r);
                wq_bytes += (double)M * K * (4 + 2 * dw_plan_operand_bytes(wp));
                wq_launches += 1;
            }
            bool wgrad_q = false;
            for (int p = 0; p < DW_QPASS_COUNT; p++) {
                int64_t m, nn, k;
                dw_compile_quant_shape((dw_qpass)p, (int64_t)N, K, M, &m, &nn, &k);
                bool q = qrec && c->node[i].bind.quantised[p]; /* the registry's answer at the planned shape */
                dw_recipe pr = q ? rate_recipe(r) : DW_RECIPE_BF16;
                double f = 2.0 * (double)m * (double)nn * (double)k, t = f / dw_plan_gemm_rate(in, pr, m, nn, k);
                double qb = q ? opnd[p] * (2 + dw_plan_operand_bytes(pr)) : 0; /* read BF16, write codes */
                out->gemm += t, out->flops += f;
                if (p == DW_QPASS_FPROP) out->fwd += t, mem_f += qb, kf += q && !same_x ? 1 : 0;
                else out->bwd += t, mem_b += qb, kb += q && !(p == DW_QPASS_WGRAD && same_x) ? 1 : 0;
                if (p == DW_QPASS_WGRAD) wgrad_q = q;
            }
            /* bias gradient: in the BF16 wgrad's epilogue (then added to db), else a column sum of dy */
            if (n->n_in == 3 && (wgrad_q || !c->bf16)) mem_b += N * (double)M * as;
            if (n->n_in == 3) kb += 1;
        } else if (n->op == DW_OP_MOE_LINEAR) {
            /* E GEMMs over the grouped rows (B,R,K) x (E,M,K)^T, routing assumed balanced: R/E rows
             * per expert, padded by half a tile; each pass at its bound recipe's rate (fp8_block or
             * mxfp8 where bind_grouped.c quantised it, else BF16) times the grouped kernels' share.
             * dgrad as fprop; wgrad as fprop plus writing dW (FP32, written over). A quantised pass
             * quantises its activations per call (BF16 read, codes written): x once for the gate
             * and up layers reading the same rows (the engine reuses it), dy per layer, and an
             * fp8 wgrad's dy^T and x^T again. */
            const dw_ir_tensor *x = &g->tensors[n->in[0]], *w = &g->tensors[n->in[1]];
            const double E = (double)w->shape[0], M = (double)w->shape[1], K = (double)w->shape[2];
            const double R = (double)dw_ir_numel(x) / K, me = R / E + ENGINE_GROUPED_TILE_ROWS / 2;
            const double f = 2 * R * M * K, fp = 2 * E * me * M * K; /* done, computed */
            const dw_node_binding *b = &c->node[i].bind;
            const dw_recipe mr = c->bf16 && dw_compile_quant_recipe(b->recipe) ? rate_recipe(dw_compile_moe_recipe(c, i))
                                                                              : DW_RECIPE_BF16;
            const bool moe_same_x = mr != DW_RECIPE_BF16 && n->in[0] == prev_moe_x;
            if (b->quantised[DW_QPASS_FPROP]) prev_moe_x = n->in[0];
            double t[DW_QPASS_COUNT], qb[DW_QPASS_COUNT];
            const double shape[DW_QPASS_COUNT][3] = {{me, M, K}, {me, K, M}, {K, M, me}};
            const double opnd[DW_QPASS_COUNT] = {moe_same_x ? 0 : R * K, R * M, R * (M + K)};
            for (int p = 0; p < DW_QPASS_COUNT; p++) {
                const dw_recipe pr = mr != DW_RECIPE_BF16 && b->quantised[p] ? mr : DW_RECIPE_BF16;
                t[p] = fp / (dw_plan_gemm_rate(in, pr, shape[p][0], shape[p][1], shape[p][2]) * ENGINE_GROUPED_REL);
                qb[p] = pr != DW_RECIPE_BF16 ? opnd[p] * (2 + dw_plan_operand_bytes(pr)) : 0;
            }
            const double tf = t[DW_QPASS_FPROP], tb = t[DW_QPASS_DGRAD] + t[DW_QPASS_WGRAD];
            mem_f += qb[DW_QPASS_FPROP], mem_b += qb[DW_QPASS_DGRAD] + qb[DW_QPASS_WGRAD] + E * M * K * 4;
            out->fwd += tf, out->bwd += tb, out->gemm += tf + tb, out->flops += 3 * f;
            kf += 1 + (qb[DW_QPASS_FPROP] > 0), kb += 2 + (qb[DW_QPASS_DGRAD] > 0) + 2 * (qb[DW_QPASS_WGRAD] > 0);
        } else if (DW_OP_IS(n, DW_OPF_FLASH)) {
            /* af: the causal half of the forward matmuls (PaLM's full-square count / 2) */
            double pf, pb, T = (double)g->seq;
            dw_ir_model_flops(g, n, &pf, &pb);
            double af = pf / 2, shape = T / (T + 256);
            double tf = af / (peak * ENGINE_ATTN_FWD_EFF * shape), tb = 2.5 * af / (peak * ENGINE_ATTN_BWD_EFF * shape);
            out->fwd += tf, out->bwd += tb, out->attn += tf + tb, out->flops += 3.5 * af;
            kf += 1, kb += 2;
        } else {
            double ef, eb; /* elements moved */
            dw_ir_traffic(g, n, &ef, &eb);
            if (c->node[i].fused & DW_FUSED_FWD) ef = 0; /* in the GEMM epilogues (compile/fuse.c) */
            if (c->node[i].fused & DW_FUSED_BWD) eb = 0;
            mem_f += ef * as, mem_b += eb * as;
            kf += ef > 0, kb += eb > 0;
        }
        if (node_f) node_f[i] = out->fwd - fwd0 + (kf - kf0) * launch_s + (mem_f - memf0) / (bw * ENGINE_MEM_EFF);
        if (node_b) node_b[i] = out->bwd - bwd0 + (kb - kb0) * launch_s + (mem_b - memb0) / (bw * ENGINE_MEM_EFF);
        if (dw_compile_rc_time(c, i) >= 0) /* recompute: the forward runs again in the backward sweep */
            out->bwd += out->fwd - fwd0, mem_b += mem_f - memf0, kb += kf - kf0;
    }
    out->launches = kf + kb;
    out->overhead = (kf + kb) * launch_s + ENGINE_MICROBATCH_S;
    out->fwd += kf * launch_s + ENGINE_MICROBATCH_S, out->bwd += kb * launch_s;
    double tf = mem_f / (bw * ENGINE_MEM_EFF), tb = mem_b / (bw * ENGINE_MEM_EFF);
    out->fwd += tf, out->bwd += tb, out->mem = tf + tb;
    /* one rank alone: the experts' wgrad summed their gradients' squares, which the norm skips */
    const double norm_skips = norm_parts ? (double)dw_compile_wsumsq_floats(c) : 0.0;
    out->optimizer = ((double)c->param_floats * ENGINE_ADAMW_BYTES - 4.0 * norm_skips) / (bw * ENGINE_ADAMW_EFF) +
                     wq_bytes / (bw * ENGINE_MEM_EFF) + wq_launches * launch_s;
}

/* dw_plan_engine_time with each kernel launch costing launch_s. */
static dw_status engine_time(dw_ctx *ctx, const dw_plan_in *in, int64_t micro_batch, int recompute, double launch_s,
                             bool norm_parts, dw_engine_time *out) {
    memset(out, 0, sizeof *out);
    compiled_job j;
    dw_status s = compile_job(ctx, in, micro_batch, recompute, NULL, &j);
    if (s == DW_OK) price(in, &j, launch_s, norm_parts, NULL, NULL, out);
    release(&j);
    return s;
}

dw_status dw_plan_engine_time(dw_ctx *ctx, const dw_plan_in *in, int64_t micro_batch, int recompute,
                              dw_engine_time *out) {
    return engine_time(ctx, in, micro_batch, recompute, DW_PLAN_LAUNCH_REPLAYED_S, true, out);
}

bool dw_plan_runtime_replays(const dw_par *par, bool overlap) { return par->dp <= 1 || (!overlap && par->zero < 3); }

dw_status dw_plan_engine_time_par(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, dw_engine_time *out) {
    const double launch_s = dw_plan_runtime_replays(par, true) ? DW_PLAN_LAUNCH_REPLAYED_S : DW_PLAN_LAUNCH_EAGER_S;
    const bool alone = par->dp <= 1 && par->tp <= 1 && par->pp <= 1 && par->cp <= 1 && par->ep <= 1;
    return engine_time(ctx, in, par->micro_batch, (int)par->recompute, launch_s, alone, out);
}
