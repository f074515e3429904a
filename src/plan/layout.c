/* layout.c — layers → virtual pipeline stages, per-rank parameter shares and per-token
 * activation bytes (the memory side of the planner's model; formulas in docs/planner.md), and the
 * names of a layout's recompute and schedule choices. */
#include <string.h>

#include "plan/layout.h"

bool dw_plan_vstage(const dw_plan_in *in, int pp, int v, int vs, dw_vstage *out) {
    memset(out, 0, sizeof *out);
    /* DeepSeek-V3's multi-token-prediction modules take slots of the last stage, as a block does */
    int64_t mtp = in->experts == in->cfg->n_experts ? in->cfg->route.n_mtp_layers : 0;
    int64_t L = in->cfg->n_layers + mtp, P = (int64_t)pp * v, start, count;
    if (P < 1 || vs < 0 || vs >= P) return false;
    int64_t n = (L + P - 1) / P, short_by = n * P - L; /* blocks per middle stage; slots left empty */
    if (short_by == 0) {
        count = n;
        start = vs * n;
    } else if (P >= 2 && short_by <= 2 * n - 1) {
        /* the first stage gives up ceil(short_by / 2) blocks (it holds the embedding, and may hold
         * nothing else), the last the rest (it holds the LM head and at least one block): Llama
         * 3's layout is short_by = 2 */
        int64_t first = n - (short_by + 1) / 2, last = n - short_by / 2;
        count = vs == 0 ? first : vs == P - 1 ? last : n;
        start = vs == 0 ? 0 : first + (vs - 1) * n;
    } else {
        return false;
    }
    out->embed = vs == 0;
    out->head = vs == P - 1;
    if (out->head) out->mtp = mtp, count -= mtp;
    if (count < 0) return false;
    out->layers = count;
    if (in->experts > 0) {
        int64_t first_moe = in->cfg->n_layers - in->moe_layers, lo = start > first_moe ? start : first_moe;
        out->moe_layers = start + count > lo ? start + count - lo : 0;
    }
    return true;
}

static bool glu(const dw_plan_in *in) { return in->cfg->act != DW_ACT_GELU_TANH; }

/* Attention half of a block plus both norms' inputs: per token, bytes (attn.c's shape). */
static double attn_bytes(const dw_plan_in *in, dw_recompute rc) {
    dw_attn_shape a;
    dw_plan_attn_shape(in, &a);
    return dw_plan_attn_saved(&a, (double)in->cfg->d_model, dw_plan_operand_bytes(in->job.recipe), rc);
}

/* MLP of width ff seen by `tokens_mult` copies of each token:
 *   GEMM input a*d | activation input 2*ff (GELU) or 2*2ff (gate, up) | down input a*ff. */
static double mlp_bytes(const dw_plan_in *in, dw_recompute rc, double ff, double mult) {
    double d = (double)in->cfg->d_model, a = dw_plan_operand_bytes(in->job.recipe);
    double b = 2 * (glu(in) ? 2 : 1) * ff;
    if (rc == DW_RECOMPUTE_NONE) b += a * d + a * ff;
    return b * mult;
}

double dw_plan_act_bytes_dense(const dw_plan_in *in, dw_recompute rc) {
    if (rc == DW_RECOMPUTE_FULL) return 2.0 * (double)in->cfg->d_model; /* block input only */
    return attn_bytes(in, rc) + mlp_bytes(in, rc, (double)in->cfg->d_ff, 1);
}

double dw_plan_act_bytes_moe(const dw_plan_in *in, dw_recompute rc) {
    if (rc == DW_RECOMPUTE_FULL) return 2.0 * (double)in->cfg->d_model;
    const dw_model_config *c = in->cfg;
    double fe = c->d_ff_expert > 0 ? (double)c->d_ff_expert : (double)c->d_ff;
    double shared = c->n_shared_experts > 0 ? (double)c->n_shared_experts : 0;
    double routed = (double)in->top_k * in->capacity;
    /* router probabilities/indices: top_k * (4 + 4) bytes */
    return attn_bytes(in, rc) + mlp_bytes(in, rc, fe, routed) +
           (shared > 0 ? mlp_bytes(in, rc, fe * shared, 1) : 0) + 8.0 * (double)in->top_k;
}

void dw_plan_local_params(const dw_plan_in *in, const dw_par *par, const dw_vstage *st,
                          dw_local_params *o) {
    dw_param_counts pc;
    dw_plan_params(in, &pc);
    const dw_model_config *c = in->cfg;
    double tp = par->tp, ep = par->ep, etp = dw_par_etp(par);
    dw_attn_shape as;
    dw_plan_attn_shape(in, &as);
    double d = (double)c->d_model;
    double mats = glu(in) ? 3 : 2, mlp_w = mats * d * (double)c->d_ff;
    double dense_layers = (double)(st->layers - st->moe_layers), moe = (double)st->moe_layers;
    memset(o, 0, sizeof *o);
    /* TP shards every matrix (and the biases with them) but MLA's down-projections; norms are
     * replicated. */
    double attn = (pc.attn - as.replicated) / tp + as.replicated;
    double attn_w = (as.matmul - as.replicated) / tp + as.replicated;
    o->dense = dense_layers * (attn + pc.mlp / tp + pc.norms) +
               moe * (attn + pc.moe_shared / tp + pc.router + pc.norms);
    o->expert = moe * pc.moe_experts / (ep * etp);
    o->matmul = dense_layers * (attn_w + mlp_w / tp) + moe * (attn_w + pc.moe_shared / tp) + o->expert;
    double dense_block = attn + pc.mlp / tp + pc.norms;
    double moe_block = attn + pc.moe_shared / tp + pc.router + pc.norms + pc.moe_experts / (ep * etp);
    o->max_layer = st->moe_layers > 0 ? moe_block : 0;
    if (dense_layers > 0 && dense_block > o->max_layer) o->max_layer = dense_block;
    if (st->embed) o->dense += (pc.embed + pc.pos) / tp;
    if (st->mtp > 0) { /* each module: a block like the last, eh_proj [2d, d], enorm, hnorm, its norm */
        double k = (double)st->mtp;
        bool last_moe = in->experts > 0;
        o->dense += k * (last_moe ? attn + pc.moe_shared / tp + pc.router + pc.norms : attn + pc.mlp / tp + pc.norms) +
                    k * (2 * d * d / tp + 3 * d);
        o->expert += last_moe ? k * pc.moe_experts / (ep * etp) : 0;
        o->matmul += k * (attn_w + (last_moe ? pc.moe_shared / tp + pc.moe_experts / (ep * etp) : mlp_w / tp) + 2 * d * d / tp);
    }
    if (st->head) {
        o->dense += pc.lm_head / tp + pc.final_norm;
        /* tied embeddings on a different pipeline rank need their own copy of the matrix */
        if (c->tie_embeddings && par->pp > 1) o->dense += pc.embed / tp;
    }
}

static const char *const rc_names[DW_RECOMPUTE_COUNT] = {"none", "selective", "full"};
const char *dw_recompute_name(dw_recompute r) { return (r >= 0 && r < DW_RECOMPUTE_COUNT) ? rc_names[r] : "?"; }
const char *dw_sched_name(dw_sched s) {
    return s == DW_SCHED_INTERLEAVED ? "interleaved_1f1b" : s == DW_SCHED_DUALPIPE ? "dualpipe" : "1f1b";
}

int dw_plan_chunks(const dw_par *p) { return p->sched == DW_SCHED_DUALPIPE ? 2 : p->vpp; }

int dw_plan_chunk_stage(const dw_par *p, int s, int ch) {
    if (p->sched == DW_SCHED_DUALPIPE) return ch == 0 ? s : p->pp - 1 - s;
    return ch * p->pp + s;
}
