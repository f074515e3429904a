/* cost.c — time of one configuration: per-virtual-stage forward/backward times of a micro-batch
 * (GEMMs at modelled/measured rates, flash attention, memory-bound elementwise work, TP/CP/EP
 * collectives that the schedule cannot hide), the pipeline event simulation, DP/ZeRO traffic
 * with the overlap the schedule allows, and the optimizer step. Constraints live here too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "plan/layout.h"

/* Flash attention (BF16): fraction of the BF16 peak reached by forward and backward at long
 * sequence (FlashAttention-2/3 class kernels); shorter sequences fall off as s/(s+256). */
#define ATTN_FWD_EFF 0.60
#define ATTN_BWD_EFF 0.45
#define HBM_EFF 0.75
/* Host-side optimizer when offloaded: PCIe per GPU (GB/s) and CPU Adam rate per GPU share. */
#define PCIE_GBPS 25.0
#define HOST_ADAM_PARAMS_PER_S 0.25e9

typedef struct {
    double fwd, bwd, tp, cp, ep, flops;
    double epf, epb;            /* of fwd and bwd, the EP all-to-all an overlapping schedule hides */
    double rc;                  /* of bwd, recomputation (forward again, or the re-derived inputs) */
} ltime;

static void gemm_time(const dw_plan_in *in, dw_recipe prec, double m, double n, double k, ltime *t) {
    if (m <= 0 || n <= 0 || k <= 0) return;
    double f = 2 * m * n * k;
    t->fwd += f / dw_plan_gemm_rate(in, prec, m, n, k);
    /* dgrad dX[m,k] = dY[m,n] W^T; wgrad dW[k,n] = X^T[k,m] dY[m,n] */
    t->bwd += f / dw_plan_gemm_rate(in, prec, m, k, n) + f / dw_plan_gemm_rate(in, prec, k, n, m);
    t->flops += 3 * f;
}

static double hbm_time(const dw_plan_in *in, double bytes) {
    return bytes / (in->hw->gpus[0].hbm_gbps * 1e9 * HBM_EFF);
}

static bool glu(const dw_plan_in *in) { return in->cfg->act != DW_ACT_GELU_TANH; }

/* The attention block's GEMMs (attn.c's shape) for T tokens under TP; *up (may be NULL) receives
 * the forward time of MLA's up-projections, which selective recomputation runs again. */
static void attn_gemms(const dw_plan_in *in, const dw_attn_shape *as, double T, double tp, ltime *gm, double *up) {
    for (int i = 0; i < as->n_gemm; i++) {
        const dw_attn_gemm *g = &as->gemm[i];
        ltime one = {0};
        gemm_time(in, in->job.recipe, T, g->shard == DW_SHARD_N ? g->n / tp : g->n,
                  g->shard == DW_SHARD_K ? g->k / tp : g->k, &one);
        gm->fwd += one.fwd, gm->bwd += one.bwd, gm->flops += one.flops;
        bool is_up = as->up_first >= 0 && g->shard == DW_SHARD_N && i >= as->up_first;
        if (up && is_up) *up += one.fwd;
    }
}

/* EP dispatch + combine of one micro-batch: forward and backward seconds. */
static void ep_time(const dw_plan_in *in, const dw_par *par, double tokens, double *fwd, double *bwd) {
    *fwd = *bwd = 0;
    if (par->ep <= 1) return;
    double d = (double)in->cfg->d_model, a = dw_plan_operand_bytes(in->job.recipe);
    double routed = (double)in->top_k * in->capacity;
    /* EP ranks sit outside the expert-TP group: tp cp apart, or etp cp apart when folded */
    int64_t stride = (int64_t)dw_par_etp(par) * par->cp;
    int64_t limit = dw_plan_node_limit(in, par->ep, stride);
    /* forward dispatch sends the quantised expert inputs (a bytes), the forward combine and both
     * backward all-to-alls send BF16 */
    double q = dw_plan_moe_a2a_time(in->hw, par->ep, stride, tokens, routed, a * d, limit);
    double h = dw_plan_moe_a2a_time(in->hw, par->ep, stride, tokens, routed, 2 * d, limit);
    *fwd = q + h, *bwd = 2 * h;
}

/* One block (dense or MoE) for one micro-batch on one rank. */
static void block_time(const dw_plan_in *in, const dw_par *par, bool moe, ltime *t) {
    const dw_model_config *c = in->cfg;
    const dw_gpu_info *g = &in->hw->gpus[0];
    dw_recipe pr = in->job.recipe;
    double tp = par->tp, cp = par->cp, s = (double)in->job.seq;
    double T = (double)par->micro_batch * s / cp;
    double d = (double)c->d_model, ff = (double)c->d_ff, mult = glu(in) ? 2 : 1;
    double a = dw_plan_operand_bytes(pr);
    dw_attn_shape as;
    dw_plan_attn_shape(in, &as);
    memset(t, 0, sizeof *t);
    ltime gm = {0};
    double up_fwd = 0; /* MLA's up-projections: re-run by selective recompute */
    attn_gemms(in, &as, T, tp, &gm, &up_fwd);
    /* flash attention, causal: each of the s/cp local queries sees s/2 keys on average; scores
     * over dqk channels, values over dv (dqk = dv = head_dim but for MLA) */
    double sl = s / cp;
    double af = 2.0 * (double)par->micro_batch * sl * (s / 2) * (as.dqk + as.dv) * as.H / tp;
    double shape = sl / (sl + 256);
    double attn_f = af / (g->peak_bf16_tflops * 1e12 * ATTN_FWD_EFF * shape);
    double attn_b = 2.5 * af / (g->peak_bf16_tflops * 1e12 * ATTN_BWD_EFF * shape);
    gm.flops += 3.5 * af;
    double elem = 20 * d + as.elem; /* norms, residual adds, RoPE (bytes/token) */
    double qin = d + as.qin;        /* GEMM inputs that get quantised */
    double rc_elem = 8 * d;         /* selective recompute: the norms */
    if (!moe) {
        gemm_time(in, pr, T, mult * ff / tp, d, &gm);
        gemm_time(in, pr, T, d, ff / tp, &gm);
        elem += (mult + 1) * 2 * ff;
        rc_elem += (mult + 1) * 2 * ff;
        qin += ff;
    } else {
        double E = (double)in->experts, fe = c->d_ff_expert > 0 ? (double)c->d_ff_expert : ff;
        double ep = par->ep, routed = (double)in->top_k * in->capacity, etp = dw_par_etp(par);
        gemm_time(in, DW_RECIPE_BF16, T, E, d, &gm); /* router stays BF16 */
        /* tokens per local expert: the rank's sequence-parallel shard T/tp gathered over the
         * expert-TP group, routed to E/ep local experts of the EP group; the busiest EP rank
         * (the layer waits for it) takes `load` times as long */
        double me = T * etp / tp * routed * ep / E, load = dw_plan_expert_load(in, par->ep);
        ltime ex = {0};
        gemm_time(in, pr, me, mult * fe / etp, d, &ex);
        gemm_time(in, pr, me, d, fe / etp, &ex);
        double local = E / ep;
        gm.fwd += local * load * ex.fwd, gm.bwd += local * load * ex.bwd, gm.flops += local * ex.flops;
        if (c->n_shared_experts > 0) {
            double fs = fe * (double)c->n_shared_experts;
            gemm_time(in, pr, T, mult * fs / tp, d, &gm);
            gemm_time(in, pr, T, d, fs / tp, &gm);
            elem += (mult + 1) * 2 * fs;
            qin += fs;
        }
        /* permute + unpermute (read + write d each), activation over routed copies (the
         * busiest rank's) */
        elem += routed * (8 * d + load * (mult + 1) * 2 * fe);
        rc_elem += routed * (mult + 1) * 2 * fe;
        qin += routed * (d + fe);
        ep_time(in, par, T / tp, &t->epf, &t->epb);
        t->ep = t->epf + t->epb;
    }
    if (pr != DW_RECIPE_BF16) elem += qin * (2 + a), rc_elem += qin * (2 + a);
    double elem_f = hbm_time(in, T * elem / tp);
    if (par->tp > 1) {
        double ag = dw_plan_coll_time(in->hw, DW_COLL_ALLGATHER, par->tp, 1, T * d * 2);
        /* sequence parallel: AG before QKV and MLP, RS after out-proj and down-proj (forward);
         * the mirror in backward plus re-gathering the two saved inputs for wgrad */
        t->tp = 4 * ag + 6 * ag;
    }
    if (par->cp > 1) {
        /* K and V of every local head; MLA gathers its per-head K (dqk) and V (dv) too */
        double kv = (double)par->micro_batch * s * (as.mla ? as.H * (as.dqk + as.dv) / 2 : as.kv_heads * as.dqk) * 2 / tp * 2;
        double ag = dw_plan_coll_time(in->hw, DW_COLL_ALLGATHER, par->cp, par->tp, kv);
        t->cp = ag + 2 * ag; /* Llama-3 style all-gather of K,V; backward: AG + RS of dK,dV */
    }
    double fwd_comm = (par->tp > 1 ? 0.4 * t->tp : 0) + t->cp / 3 + t->epf;
    t->fwd = gm.fwd + attn_f + elem_f + fwd_comm;
    t->bwd = gm.bwd + attn_b + 2 * elem_f + (t->tp + t->cp + t->ep - fwd_comm);
    t->flops = gm.flops;
    if (par->recompute == DW_RECOMPUTE_SELECTIVE) {
        /* the re-derived GEMM inputs; MLA also re-runs its up-projections from the kept latents */
        t->rc = hbm_time(in, T * rc_elem / tp) + up_fwd;
        t->bwd += t->rc;
    }
    if (par->recompute == DW_RECOMPUTE_FULL) {
        t->rc = t->fwd - fwd_comm; /* its communication counts under TP, CP and EP below */
        t->bwd += t->fwd;
        t->tp += 0.4 * t->tp, t->cp += t->cp / 3, t->ep += t->epf, t->epb += t->epf;
        t->flops += (gm.flops - 3.5 * af) / 3 + af; /* one more forward: GEMMs + attention */
    }
}

/* Extra work of the first (embedding) and last (final norm, LM head, loss) virtual stage. */
static void ends_time(const dw_plan_in *in, const dw_par *par, const dw_vstage *st, ltime *t) {
    memset(t, 0, sizeof *t);
    double T = (double)par->micro_batch * (double)in->job.seq / par->cp, tp = par->tp;
    double d = (double)in->cfg->d_model, V = (double)in->cfg->vocab_size;
    if (st->embed) {
        t->fwd += hbm_time(in, T * d * 2 * 2 / tp);
        t->bwd += hbm_time(in, T * d * 2 * 3 / tp);
    }
    /* the LM head, and once more for each multi-token-prediction module (with its projection
     * of [h; embedding] from 2d to d) */
    for (int64_t k = 0; st->head && k <= st->mtp; k++) {
        gemm_time(in, DW_RECIPE_BF16, T, V / tp, d, t); /* LM head kept in BF16 */
        t->fwd += hbm_time(in, T * (V / tp * 4 + 4 * d / tp));
        t->bwd += hbm_time(in, T * (V / tp * 4 + 6 * d / tp));
        if (par->tp > 1) {
            double ag = dw_plan_coll_time(in->hw, DW_COLL_ALLGATHER, par->tp, 1, T * d * 2);
            t->fwd += ag, t->bwd += ag, t->tp += 2 * ag;
        }
        if (k > 0) gemm_time(in, in->job.recipe, T, d / tp, 2 * d, t);
    }
}


static const char *const reject_names[DW_REJECT_COUNT] = {
#define X(id, name) name,
    DW_REJECT_LIST(X)
#undef X
};
const char *dw_reject_name(dw_reject r) { return (r >= 0 && r < DW_REJECT_COUNT) ? reject_names[r] : "?"; }

void dw_par_format(const dw_par *p, char *buf, int len) {
    char etp[16] = "";
    if (dw_par_etp(p) != p->tp) snprintf(etp, sizeof etp, " etp%d", dw_par_etp(p));
    snprintf(buf, (size_t)len, "dp%d tp%d pp%d v%d cp%d ep%d%s mb%lld ga%lld %s%s rc=%s zero%d%s", p->dp,
             p->tp, p->pp, p->vpp, p->cp, p->ep, etp, (long long)p->micro_batch, (long long)p->grad_accum,
             dw_sched_name(p->sched), p->a2a_overlap && p->sched != DW_SCHED_DUALPIPE ? "+a2a_overlap" : "",
             dw_recompute_name(p->recompute), p->zero, p->offload ? " offload" : "");
}

/* Structural constraints, in a fixed order; the first violated one is reported. */
static bool constraints(const dw_plan_in *in, const dw_par *p, dw_reject *why, char *det, int dl) {
    const dw_model_config *c = in->cfg;
#define FAIL(r, ...) do { *why = DW_REJECT_##r; snprintf(det, (size_t)dl, __VA_ARGS__); return false; } while (0)
    if (p->tp > in->hw->nvlink_domain) FAIL(TP_DOMAIN, "tp %d > NVLink domain %d", p->tp, in->hw->nvlink_domain);
    if (c->n_heads % p->tp) FAIL(TP_HEADS, "%lld heads %% tp %d != 0", (long long)c->n_heads, p->tp);
    if (c->n_kv_heads % p->tp) FAIL(TP_KV_HEADS, "%lld kv heads %% tp %d != 0", (long long)c->n_kv_heads, p->tp);
    if (p->cp > 1 && in->job.seq % (2 * p->cp))
        FAIL(CP_SEQ, "seq %lld %% (2 * cp %d) != 0", (long long)in->job.seq, p->cp);
    dw_vstage st;
    if (!dw_plan_vstage(in, p->pp, p->vpp, 0, &st) || !dw_plan_vstage(in, p->pp, p->vpp, p->pp * p->vpp - 1, &st)) {
        int64_t L = c->n_layers + (in->experts == c->n_experts ? c->route.n_mtp_layers : 0), P = (int64_t)p->pp * p->vpp;
        FAIL(PP_LAYERS, "%lld layers%s over pp %d x v %d: the first and last stage cannot give up the %lld missing "
             "slots", (long long)c->n_layers, L > c->n_layers ? " + MTP" : "", p->pp, p->vpp,
             (long long)((L + P - 1) / P * P - L));
    }
    if (in->experts > 0 ? in->experts % p->ep != 0 : p->ep != 1)
        FAIL(EP_EXPERTS, "%lld experts %% ep %d != 0", (long long)in->experts, p->ep);
    if (dw_par_etp(p) != p->tp && (dw_par_etp(p) != 1 || in->experts == 0))
        FAIL(EP_DP, "expert tp %d: 1 (folded) or tp %d, with experts", dw_par_etp(p), p->tp);
    if (((int64_t)p->dp * (p->tp / dw_par_etp(p))) % p->ep)
        FAIL(EP_DP, "dp %d x tp/etp %d %% ep %d != 0", p->dp, p->tp / dw_par_etp(p), p->ep);
    if (in->job.global_batch % ((int64_t)p->dp * p->micro_batch) ||
        p->grad_accum * p->dp * p->micro_batch != in->job.global_batch)
        FAIL(BATCH, "global batch %lld %% (dp %d * mb %lld) != 0", (long long)in->job.global_batch,
             p->dp, (long long)p->micro_batch);
    if (p->vpp > 1 && p->grad_accum % p->pp)
        FAIL(INTERLEAVE_MB, "%lld micro-batches %% pp %d != 0", (long long)p->grad_accum, p->pp);
    if (p->zero >= 2 && p->pp > 1) FAIL(ZERO_PP, "ZeRO-%d with pp %d", p->zero, p->pp);
    if (p->a2a_overlap && p->ep < 2) FAIL(SCHEDULE, "all-to-all overlap with ep %d (no all-to-all)", p->ep);
    if (p->sched == DW_SCHED_DUALPIPE &&
        (p->ep < 2 || !p->a2a_overlap || p->vpp != 1 || p->pp < 2 || p->pp % 2 || p->grad_accum % 2))
        FAIL(SCHEDULE, "DualPipe needs ep > 1 with overlap, v 1, even pp (%d) and even micro-batches (%lld)", p->pp,
             (long long)p->grad_accum);
    if (in->engine_model && in->n_gpus == 1 &&
        ((p->recompute != DW_RECOMPUTE_NONE && p->recompute != DW_RECOMPUTE_FULL) || p->zero || p->offload))
        FAIL(ENGINE, "one GPU runs Deepwell's engine: recompute %s, ZeRO-%d%s", dw_recompute_name(p->recompute),
             p->zero, p->offload ? ", offload" : "");
    /* the event simulation keeps two times per (micro-batch, virtual stage) */
    if (p->grad_accum * p->pp * p->vpp > DW_PLAN_SIM_LIMIT)
        FAIL(SIM_SIZE, "%lld micro-batches x %d virtual stages > %d", (long long)p->grad_accum, p->pp * p->vpp,
             DW_PLAN_SIM_LIMIT);
#undef FAIL
    return true;
}

bool dw_plan_evaluate(const dw_plan_in *in, const dw_par *par, bool simulate, dw_plan_entry *out,
                      dw_reject *reason, char *detail, int detail_len) {
    memset(out, 0, sizeof *out);
    out->par = *par;
    out->runs = dw_plan_engine_runnable(in, par, NULL, 0);
    *reason = DW_REJECT_COUNT;
    if (detail_len > 0) detail[0] = 0;
    DW_ASSERT((int64_t)par->dp * par->tp * par->pp * par->cp == in->n_gpus);
    DW_ASSERT(par->vpp >= 1 && par->ep >= 1 && par->micro_batch >= 1);
    if (!constraints(in, par, reason, detail, detail_len)) return false;
    dw_plan_memory(in, par, &out->mem);
    if (out->mem.total > out->mem.limit) {
        *reason = DW_REJECT_MEMORY;
        snprintf(detail, (size_t)detail_len, "%.1f GiB > %.1f GiB (stage %d)",
                 out->mem.total / (1 << 30), out->mem.limit / (1 << 30), out->mem.worst_stage);
        return false;
    }
    if (!simulate) return true;
    return dw_plan_time(in, par, out, NULL);
}

/* A --ep plan as the runtime runs it (train/ep.c): every rank runs the engine's whole program, eager
 * (no recorded step), its experts on the rows the group routes to them — the expert GEMMs' FLOPs of
 * data parallelism, but the layer waits for the busiest rank (block_time's load factor at ep
 * against ep 1) — plus, per MoE layer, the four row all-to-alls (ep_time) and the four gathers
 * that put the received rows in expert order and back (a read and a write of the rows each). */
static bool runtime_ep_time(const dw_plan_in *in, const dw_par *par, ltime *vt, double *engine_opt) {
    dw_par whole = *par;
    whole.ep = 1;
    dw_engine_time et;
    if (!dw_plan_runtime_ep(in, par) || !dw_plan_engine_runnable(in, &whole, NULL, 0) ||
        dw_plan_engine_time_par(NULL, in, &whole, &et) != DW_OK)
        return false;
    dw_vstage st;
    DW_ASSERT(dw_plan_vstage(in, 1, 1, 0, &st));
    ltime at_ep, at_one;
    block_time(in, par, true, &at_ep);
    block_time(in, &whole, true, &at_one);
    const double ml = (double)st.moe_layers, T = (double)par->micro_batch * (double)in->job.seq;
    const double rows = T * (double)in->top_k * in->capacity, gather = hbm_time(in, rows * (double)in->cfg->d_model * 4);
    const double skew_f = fmax(0, (at_ep.fwd - at_ep.epf) - (at_one.fwd - at_one.epf));
    const double skew_b = fmax(0, (at_ep.bwd - at_ep.epb) - (at_one.bwd - at_one.epb));
    vt[0] = (ltime){.fwd = et.fwd + ml * (skew_f + at_ep.epf + 2 * gather),
                    .bwd = et.bwd + ml * (skew_b + at_ep.epb + 2 * gather),
                    .ep = ml * at_ep.ep, .epf = ml * at_ep.epf, .epb = ml * at_ep.epb, .flops = et.flops};
    if (engine_opt) *engine_opt = et.optimizer;
    return true;
}

/* One micro-batch through each virtual stage: vt[vs] for vs in [0, pp*vpp). A plan Deepwell's
 * engine runs as it is takes the engine's node-by-node time (engine.c), its launches eager where
 * the runtime replays no recorded step (several ranks: dw_plan_runtime_replays); *engine_opt (may
 * be NULL) then receives its AdamW time, else -1. */
static void vstage_times(const dw_plan_in *in, const dw_par *par, ltime *vt, double *engine_opt) {
    dw_engine_time et;
    if (engine_opt) *engine_opt = -1;
    if (runtime_ep_time(in, par, vt, engine_opt)) return;
    if (dw_plan_engine_runnable(in, par, NULL, 0) && dw_plan_engine_time_par(NULL, in, par, &et) == DW_OK) {
        vt[0] = (ltime){.fwd = et.fwd, .bwd = et.bwd, .flops = et.flops};
        if (engine_opt) *engine_opt = et.optimizer;
        return;
    }
    ltime dense, moe;
    block_time(in, par, false, &dense);
    if (in->experts > 0) block_time(in, par, true, &moe);
    else memset(&moe, 0, sizeof moe);
    for (int vs = 0; vs < par->pp * par->vpp; vs++) {
        dw_vstage st;
        DW_ASSERT(dw_plan_vstage(in, par->pp, par->vpp, vs, &st));
        ltime e;
        ends_time(in, par, &st, &e);
        /* multi-token prediction on the last stage: its blocks (MoE like the model's last) */
        double dl = (double)(st.layers - st.moe_layers), ml = (double)st.moe_layers;
        if (in->experts > 0) ml += (double)st.mtp;
        else dl += (double)st.mtp;
        vt[vs] = (ltime){.fwd = dl * dense.fwd + ml * moe.fwd + e.fwd,
                         .bwd = dl * dense.bwd + ml * moe.bwd + e.bwd,
                         .tp = dl * dense.tp + ml * moe.tp + e.tp,
                         .cp = dl * dense.cp + ml * moe.cp,
                         .ep = ml * moe.ep, .epf = ml * moe.epf, .epb = ml * moe.epb,
                         .rc = dl * dense.rc + ml * moe.rc,
                         .flops = dl * dense.flops + ml * moe.flops + e.flops};
    }
}

/* p2p: one micro-batch's activations (sequence-parallel shard) between pipeline ranks */
static double p2p_time(const dw_plan_in *in, const dw_par *par) {
    double T = (double)par->micro_batch * (double)in->job.seq / par->cp;
    double bytes = T * (double)in->cfg->d_model * 2 / par->tp;
    int64_t stride = (int64_t)par->tp * par->cp * par->dp;
    return par->pp > 1 ? dw_plan_coll_time(in->hw, DW_COLL_P2P, 2, stride, bytes) : 0;
}

static void sim_input(const dw_plan_in *in, const dw_par *par, const ltime *vt, double *fw, double *bw, double *fc,
                      double *bc, dw_sim_in *si) {
    for (int vs = 0; vs < par->pp * par->vpp; vs++)
        fw[vs] = vt[vs].fwd, bw[vs] = vt[vs].bwd, fc[vs] = vt[vs].epf, bc[vs] = vt[vs].epb;
    *si = (dw_sim_in){.p = par->pp, .v = par->vpp, .m = (int)par->grad_accum, .fwd = fw, .bwd = bw,
                      .p2p = p2p_time(in, par), .fcomm = fc, .bcomm = bc,
                      .overlap = par->a2a_overlap && par->sched != DW_SCHED_DUALPIPE,
                      .dual = par->sched == DW_SCHED_DUALPIPE};
}

void dw_plan_sim_input(const dw_plan_in *in, const dw_par *par, double *fw, double *bw, double *fc, double *bc,
                       dw_sim_in *si) {
    int P = par->pp * par->vpp;
    ltime *vt = calloc((size_t)P, sizeof *vt);
    DW_ASSERT(vt);
    vstage_times(in, par, vt, NULL);
    sim_input(in, par, vt, fw, bw, fc, bc, si);
    free(vt);
}

bool dw_plan_time(const dw_plan_in *in, const dw_par *par, dw_plan_entry *out, const double *prune_above) {
    int P = par->pp * par->vpp, m = (int)par->grad_accum, chunks = dw_plan_chunks(par);
    double *fw = calloc((size_t)P, sizeof *fw), *bw = calloc((size_t)P, sizeof *bw);
    double *fc = calloc((size_t)P, sizeof *fc), *bc = calloc((size_t)P, sizeof *bc);
    ltime *vt = calloc((size_t)P, sizeof *vt);
    double *busy = calloc((size_t)par->pp, sizeof *busy), *lb = calloc((size_t)par->pp, sizeof *lb);
    ltime *rank = calloc((size_t)par->pp, sizeof *rank);
    DW_ASSERT(fw && bw && fc && bc && vt && busy && lb && rank);
    double engine_opt;
    vstage_times(in, par, vt, &engine_opt);
    dw_sim_in si;
    sim_input(in, par, vt, fw, bw, fc, bc, &si);
    double exec = 0, stage_busy_max = 0, lower_max = 0;
    bool hides = si.overlap || si.dual;
    dw_cost *c = &out->cost;
    int slow = 0;
    /* each rank's work: its chunks' stages, m micro-batches each (DualPipe: m/2 through each) */
    double per = par->sched == DW_SCHED_DUALPIPE ? m / 2.0 : (double)m;
    for (int s = 0; s < par->pp; s++)
        for (int ch = 0; ch < chunks; ch++) {
            const ltime *v = &vt[dw_plan_chunk_stage(par, s, ch)];
            busy[s] += per * (v->fwd + v->bwd);
            /* a lower bound on the rank's time: overlap can hide at most its all-to-all */
            lb[s] += per * (v->fwd + v->bwd - (hides ? v->epf + v->epb : 0));
            rank[s].tp += per * v->tp, rank[s].cp += per * v->cp, rank[s].ep += per * v->ep;
            rank[s].rc += per * v->rc;
            exec += per * v->flops;
        }
    for (int s = 0; s < par->pp; s++) {
        if (busy[s] > stage_busy_max) stage_busy_max = busy[s], slow = s;
        if (lb[s] > lower_max) lower_max = lb[s];
    }
    c->compute = stage_busy_max;
    c->tp_comm = rank[slow].tp, c->cp_comm = rank[slow].cp, c->ep_comm = rank[slow].ep;
    out->x.recompute = rank[slow].rc;
    /* DP / ZeRO traffic and optimizer: a plan the engine runs as the runtime runs it; otherwise per
     * pipeline rank, the worst rank counting. */
    double dpn = (double)par->dp * par->cp, dpn_e = dw_par_expert_dp(par), opt = 0, dp_exp = 0, dp_all = 0;
    if (engine_opt >= 0) dw_plan_runtime_dp(in, par, engine_opt, bw[0], true, &dp_all, &dp_exp, &opt);
    for (int s = 0; engine_opt < 0 && s < par->pp; s++) {
        double pd = 0, pe = 0, maxl = 0, win_f = 0, win_b = 0;
        for (int ch = 0; ch < chunks; ch++) {
            int vs = dw_plan_chunk_stage(par, s, ch);
            dw_vstage st;
            dw_plan_vstage(in, par->pp, par->vpp, vs, &st);
            dw_local_params lp;
            dw_plan_local_params(in, par, &st, &lp);
            pd += lp.dense, pe += lp.expert;
            if (lp.max_layer > maxl) maxl = lp.max_layer;
            win_f += fw[vs], win_b += bw[vs];
        }
        int64_t sd = par->tp, se = (int64_t)dw_par_etp(par) * par->ep;
        double rs = 0, ag = 0, ar = 0;
        if (dpn > 1) {
            rs += dw_plan_coll_time(in->hw, DW_COLL_REDUCESCATTER, (int64_t)dpn, sd, 4 * pd);
            ag += dw_plan_coll_time(in->hw, DW_COLL_ALLGATHER, (int64_t)dpn, sd, 2 * pd);
            ar += dw_plan_coll_time(in->hw, DW_COLL_ALLREDUCE, (int64_t)dpn, sd, 4 * pd);
        }
        if (dpn_e > 1 && pe > 0) {
            rs += dw_plan_coll_time(in->hw, DW_COLL_REDUCESCATTER, (int64_t)dpn_e, se, 4 * pe);
            ag += dw_plan_coll_time(in->hw, DW_COLL_ALLGATHER, (int64_t)dpn_e, se, 2 * pe);
            ar += dw_plan_coll_time(in->hw, DW_COLL_ALLREDUCE, (int64_t)dpn_e, se, 4 * pe);
        }
        double exp_s, all_s;
        switch (par->zero) {
        case 0: /* all-reduce after the last micro-batch, bucketed under its backward */
            all_s = ar, exp_s = fmax(0, ar - win_b);
            break;
        case 1: /* reduce-scatter under the last backward; param all-gather under next forward */
            all_s = rs + ag, exp_s = fmax(0, rs - win_b) + fmax(0, ag - win_f);
            break;
        case 2: /* gradients reduce-scattered every micro-batch */
            all_s = m * rs + ag, exp_s = m * fmax(0, rs - win_b) + fmax(0, ag - win_f);
            break;
        default: { /* ZeRO-3: gather weights for forward and again for backward, every micro-batch */
            double ag_w = ag; /* the same bytes as the parameter all-gather */
            all_s = m * (2 * ag_w + rs);
            exp_s = m * (fmax(0, ag_w - win_f) + fmax(0, ag_w + rs - win_b));
        }
        }
        double shard = par->zero >= 1 ? pd / dpn + pe / dpn_e : pd + pe;
        double o = par->offload
                       ? shard * (4 + 2) / (PCIE_GBPS * 1e9) + shard / HOST_ADAM_PARAMS_PER_S
                       : hbm_time(in, shard * 32); /* read grad, m, v, master; write m, v, master, param */
        if (exp_s + o > dp_exp + opt) dp_exp = exp_s, opt = o, dp_all = all_s;
    }
    c->dp_comm = dp_all, c->dp_exposed = dp_exp, c->optimizer = opt;
    c->pp_comm = par->pp > 1 ? 2.0 * m * si.p2p * par->vpp : 0;
    bool ok = true;
    double lower = lower_max + dp_exp + opt;
    if (prune_above && lower > *prune_above * (1 + 1e-9)) {
        c->step = lower;
        ok = false;
    } else {
        dw_sim_out so;
        dw_status st = dw_pipe_simulate(NULL, &si, false, &so);
        DW_ASSERT(st == DW_OK);
        c->pipeline = so.makespan;
        if (hides) { /* the simulation knows what the overlap hid */
            slow = 0;
            for (int s = 1; s < par->pp; s++)
                if (so.busy[s] > so.busy[slow]) slow = s;
            c->compute = so.busy[slow];
            c->ep_comm = so.comm_exposed[slow];
            out->x.ep_hidden = so.comm_hidden[slow];
            c->tp_comm = rank[slow].tp, c->cp_comm = rank[slow].cp, out->x.recompute = rank[slow].rc;
        }
        c->bubble_frac = so.makespan > 0 ? 1.0 - so.busy[slow] / so.makespan : 0;
        dw_sim_out_free(&so);
        c->step = c->pipeline + dp_exp + opt;
    }
    double G = (double)in->job.global_batch, seq = (double)in->job.seq;
    double peak = dw_plan_peak_flops(&in->hw->gpus[0], in->job.recipe) * (double)in->n_gpus;
    c->tokens_per_s = G * seq / c->step;
    c->model_flops = dw_plan_model_flops_per_token(in) * G * seq;
    c->mfu = c->model_flops / (c->step * peak);
    /* executed FLOPs: every rank of a stage does the same; sum over the machine */
    exec *= (double)par->dp * par->tp * par->cp;
    c->hfu = exec / (c->step * peak);
    free(fw), free(bw), free(fc), free(bc), free(vt), free(busy), free(lb), free(rank);
    return ok;
}
