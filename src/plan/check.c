/* check.c — the independent plan checker: re-derives every constraint of a plan from the model,
 * the machine and the job with its own arithmetic (not the search's filters), and re-computes
 * memory. Used by dryrun and by the randomised tests on every plan the search returns. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "plan/layout.h"

static void note(char *why, int len, int *n, const char *fmt, ...) DW_PRINTF(4, 5);
static void note(char *why, int len, int *n, const char *fmt, ...) {
    (*n)++;
    if (!why || len <= 0) return;
    size_t used = strlen(why);
    if ((int)used >= len - 1) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why + used, (size_t)(len - (int)used), fmt, ap);
    va_end(ap);
}

int dw_plan_check(const dw_plan_in *in, const dw_par *p, char *why, int why_len) {
    const dw_model_config *c = in->cfg;
    int n = 0;
    if (why && why_len > 0) why[0] = 0;
    if (p->dp < 1 || p->tp < 1 || p->pp < 1 || p->cp < 1 || p->ep < 1 || p->vpp < 1 ||
        p->micro_batch < 1 || p->grad_accum < 1 || p->zero < 0 || p->zero > 3) {
        note(why, why_len, &n, "%s: a degree is out of range (dp %lld, tp %lld)\n", "degrees", (long long)p->dp, (long long)p->tp);
        return n; /* nothing else is meaningful */
    }
    long long prod = (long long)p->dp * p->tp * p->pp * p->cp;
    if (prod != in->n_gpus)
        note(why, why_len, &n, "%s: dp*tp*pp*cp = %lld but the machine has %lld GPUs\n", "gpus", prod,
             (long long)in->n_gpus);
    if (p->tp > in->hw->nvlink_domain)
        note(why, why_len, &n, "%s: tp %lld exceeds the NVLink domain %lld\n", "tp", (long long)p->tp, (long long)in->hw->nvlink_domain);
    if (c->n_heads % p->tp)
        note(why, why_len, &n, "%s: %lld heads not divisible by tp %lld\n", "heads", (long long)c->n_heads, (long long)p->tp);
    if (c->n_kv_heads % p->tp)
        note(why, why_len, &n, "%s: %lld kv heads not divisible by tp %lld\n", "kv_heads", (long long)c->n_kv_heads, (long long)p->tp);
    /* the stack splits evenly, or the first and last stage hold fewer blocks: with n blocks on
     * every middle stage, the two ends together give up slots * n - L blocks, the last keeping one */
    long long mtp = in->experts == c->n_experts ? c->route.n_mtp_layers : 0, L = c->n_layers + mtp;
    long long slots = (long long)p->pp * p->vpp, per = (L + slots - 1) / slots;
    long long short_by = per * slots - L;
    bool layers_ok = (short_by == 0 || (slots >= 2 && short_by <= 2 * per - 1)) &&
                     (slots == 1 ? L : per - short_by / 2) >= mtp; /* the last stage has room for the MTP */
    if (!layers_ok)
        note(why, why_len, &n, "%s: %lld layers do not split over pp*v = %lld\n", "layers", (long long)c->n_layers, slots);
    long long E = in->experts;
    if ((E == 0 && p->ep != 1) || (E > 0 && E % p->ep))
        note(why, why_len, &n, "%s: %lld experts not divisible by ep %lld\n", "experts", (long long)E, (long long)p->ep);
    long long etp = p->etp > 0 ? p->etp : p->tp;
    if (etp != p->tp && (etp != 1 || E == 0))
        note(why, why_len, &n, "%s: expert tp %lld must be tp %lld, or 1 for a MoE model\n", "etp", etp, (long long)p->tp);
    else if (((long long)p->dp * (p->tp / etp)) % p->ep)
        note(why, why_len, &n, "%s: ep %lld does not divide dp %lld x tp/etp %lld\n", "ep", (long long)p->ep,
             (long long)p->dp, (long long)(p->tp / etp));
    if ((long long)p->dp * p->micro_batch * p->grad_accum != in->job.global_batch)
        note(why, why_len, &n, "%s: dp*micro_batch*grad_accum != global batch %lld (dp %lld)\n", "batch",
             (long long)in->job.global_batch, (long long)p->dp);
    if (p->cp > 1 && in->job.seq % (2 * p->cp))
        note(why, why_len, &n, "%s: seq %lld not divisible by 2*cp = %lld\n", "cp", (long long)in->job.seq, 2LL * p->cp);
    if (p->vpp > 1 && (p->pp == 1 || p->grad_accum % p->pp))
        note(why, why_len, &n, "%s: interleaving needs pp > 1 and micro-batches %lld divisible by pp %lld\n",
             "schedule", (long long)p->grad_accum, (long long)p->pp);
    if ((p->vpp > 1) != (p->sched == DW_SCHED_INTERLEAVED))
        note(why, why_len, &n, "%s: schedule does not match v = %lld\n", "schedule", (long long)p->vpp);
    if (p->a2a_overlap && p->ep == 1)
        note(why, why_len, &n, "%s: all-to-all overlap without expert parallelism\n", "schedule");
    if (p->sched == DW_SCHED_DUALPIPE && (!p->a2a_overlap || p->ep == 1 || p->pp % 2 || p->grad_accum % 2))
        note(why, why_len, &n, "%s: DualPipe needs expert parallelism with overlap, an even pp (%lld) and an even "
             "number of micro-batches (%lld)\n", "schedule", (long long)p->pp, (long long)p->grad_accum);
    if (p->zero >= 2 && p->pp > 1)
        note(why, why_len, &n, "%s: ZeRO-%lld cannot be combined with pp %lld\n", "zero", (long long)p->zero, (long long)p->pp);
    if (in->engine_model && in->n_gpus == 1 && (p->zero != 0 || p->offload))
        note(why, why_len, &n, "%s: one GPU runs Deepwell's engine, which has no ZeRO or offload there (plan: "
             "ZeRO-%lld%s)\n", "engine", (long long)p->zero, p->offload ? ", offload" : "");
    if (p->offload && p->zero < 1)
        note(why, why_len, &n, "%s: offload needs ZeRO >= 1 (zero %lld)\n", "offload", (long long)p->zero);
    if (n == 0) {
        dw_mem m;
        dw_plan_memory(in, p, &m);
        double limit = (double)in->hw->gpus[0].hbm_bytes * (1.0 - in->job.mem_headroom);
        if (!(m.total <= limit))
            note(why, why_len, &n, "%s: %lld MiB per GPU exceeds %lld MiB (HBM minus headroom)\n", "memory",
                 (long long)(m.total / 1048576), (long long)(limit / 1048576));
    }
    return n;
}
