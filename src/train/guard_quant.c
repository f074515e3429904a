/* guard_quant.c — the quantised layers' guard (guard.h): every K steps one forward of the step's
 * last micro-batch with the updated weights, then for each quantised linear layer the inputs its
 * quantised GEMMs read — x (fprop), x^T (wgrad), W (fprop), W^T (dgrad) — measured with the
 * reference quantiser (precision/quant_stats.c); and the gradient operands dy (dgrad) and dy^T
 * (wgrad) measured the same way by the check step's own backward (the linear op, asked through
 * dw_exec.qcounts: their values do not outlive it; that step runs unrecorded). A backend with a
 * qstats entry (the CUDA backend: runtime/cuda/guard_check_cuda.c) measures each tensor where it
 * lives, the same sample and sums, and only the sums come back. A tensor of more
 * than check_elements elements is measured on a sample of whole block rows, the same every check
 * and always holding its amax (quant_stats.h, dw_qstats_sample). x's and dy's sums
 * are all-reduced over the ranks (W is the same on all). A layer whose bulk error (quant_stats.h)
 * is over its threshold for one of its tensors in `after` checks in a row falls back to BF16:
 * its binding's recipe becomes bf16 (every backend's linear reads it per call) and its weight
 * cache is no longer refreshed; recorded CUDA-graph steps are dropped so they re-record. The
 * quantisers' counters give a second rule, every step (dw_qcount_rule): a layer whose overflow or
 * underflow fraction of x, w or dy (counts over elements, all ranks) is over its maximum in N
 * steps in a row falls back the same way.
 * Files (rank 0): DIR/quant_stats.jsonl, one line per measured tensor and check:
 *   {"step", "layer", "tensor": "x"|"x^T"|"w"|"w^T"|"dy"|"dy^T", "recipe", "rel_error", "bulk_error",
 *    "threshold", "overflow", "underflow", "elements", "measured"} (the errors and counts are over the
 *    "measured" elements, "elements" the tensor's)
 * and, every check step, the quantisers' counters summed since the last one (guard_counts.c).
 * DIR/precision_decisions.jsonl, one line per fallback:
 *   {"step", "layer", "tensor", "reason", "bulk_error", "threshold", "recipe", "to": "bf16"}, or by
 *   the counters' rule {"step", "layer", "tensor": "x"|"w"|"dy", "reason", "rule": "overflow"|
 *   "underflow", "fraction", "threshold", "steps", "recipe", "to": "bf16"} */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"
#include "precision/quant_stats.h"
#include "precision/thresholds.h"
#include "runtime/engine.h"
#include "train/ckpt.h"
#include "train/guard.h"
#include "train/metrics.h"

enum { T_X = 0, T_XT, T_W, T_WT, T_DY, T_DYT, T_COUNT };
static const char *const TENSOR[T_COUNT] = {"x", "x^T", "w", "w^T", "dy", "dy^T"};
/* the tensors whose sums differ per rank (all-reduced): x, x^T, dy, dy^T */
static const int RANKED[4] = {T_X, T_XT, T_DY, T_DYT};

typedef struct {
    int node;
    dw_recipe recipe;      /* the node's recipe before any fallback */
    bool measure[T_COUNT]; /* the tensor feeds a GEMM that runs quantised */
    int64_t over;          /* checks in a row over the threshold */
    int64_t run[DW_QC_KINDS][2]; /* steps in a row over the counters' maxima: [x, w, dy][overflow, underflow] */
    bool bf16;             /* fell back */
    int64_t fell_at;       /* the step it fell back at */
    dw_node_binding bind;  /* the compiled binding and weight cache slots, for a rollback */
    dw_qslot_layout wq[2];
} layer;

struct dw_qguard {
    dw_ctx *ctx;
    dw_engine *e;
    dw_comm *host;
    bool lead;
    int64_t every, after;
    int64_t check_elements; /* elements measured per tensor at most (0: all) */
    dw_qcount_rule rule;
    int64_t *step_counts; /* (n, DW_QC_KINDS, DW_QC_WORDS) the last step's, all ranks (the rule on) */
    double thr[DW_RECIPE_COUNT];
    int n;
    layer *l;
    FILE *stats, *decisions;
    dw_qcounter *qc;  /* the quantisers' counters and the dy accumulators */
    int *nodes;       /* (n) each layer's node */
    bool *fell;       /* (n) each layer's bf16, for the counters' lines */
    bool armed;       /* this step's backward measures dy */
    bool record;      /* the executor's record flag while not armed */
    float *buf;
    size_t cap;
    char *last; /* the decisions of step last_step, for the progress line */
    int64_t last_step;
};

/* Adds item ("layer why") to step's decisions for the progress line (those of an earlier step go). */
static dw_status note(dw_qguard *g, int64_t step, const char *item) {
    if (g->last_step != step) free(g->last), g->last = NULL, g->last_step = step;
    const size_t had = g->last ? strlen(g->last) : 0, sep = had ? 2 : 0, n = strlen(item);
    char *grown = realloc(g->last, had + sep + n + 1);
    if (!grown) return dw_set_error(g->ctx, DW_ERR_NOMEM, "out of memory");
    memcpy(grown + had, ", ", sep);
    memcpy(grown + had + sep, item, n + 1);
    g->last = grown;
    return DW_OK;
}

/* The policy's "max_rel_error" (precision/thresholds.h) over the defaults. */
static dw_status thresholds(dw_qguard *g) {
    const char *pj = dw_engine_program(g->e)->policy_json;
    double set[DW_RECIPE_COUNT] = {0};
    if (pj) {
        json_t *root = NULL;
        DW_TRY(dw_json_load_string(g->ctx, pj, strlen(pj), "the program's policy", &root));
        dw_status st = dw_thresholds_parse(g->ctx, json_object_get(root, "max_rel_error"), "the program's policy", set);
        json_decref(root);
        DW_TRY(st);
    }
    for (int r = 0; r < DW_RECIPE_COUNT; r++) g->thr[r] = set[r] > 0 ? set[r] : dw_qstats_default_threshold((dw_recipe)r);
    return DW_OK;
}

/* A fallen-back layer: BF16 from the next call on, on every backend. The binding lives in the
 * program the engine borrows; the guard is the one writer, between steps. */
static void drop_recordings(dw_exec *x) {
    if (x->rec_step) x->be->i->drop(x->be, x->rec_step);
    if (x->rec_opt) x->be->i->drop(x->be, x->rec_opt);
    x->rec_step = x->rec_opt = NULL;
    x->key_seen = x->opt_calls = 0;
}

static void to_bf16(dw_qguard *g, layer *l, int64_t step) {
    dw_engine *e = g->e;
    dw_prog_node *pn = &((dw_compiled *)e->p)->node[l->node];
    pn->bind.recipe = DW_RECIPE_BF16; /* (reason and note keep the compiler's account) */
    for (int p = 0; p < DW_QPASS_COUNT; p++) pn->bind.quantised[p] = false, pn->bind.kernel[p] = NULL;
    pn->wq[0].off = pn->wq[1].off = -1; /* no weight cache refresh: the slots are sized for the old recipe */
    drop_recordings(e->x); /* recorded steps replay the old kernels: record them again */
    l->bf16 = true;
    l->fell_at = step;
}

/* The next step's backward measures dy (on) or not. Measuring reads dy back on a GPU: the step
 * is issued, not replayed, and not recorded (recording resumes after it). */
static void arm(dw_qguard *g, bool on) {
    dw_exec *x = g->e->x;
    if (on && !g->armed) {
        drop_recordings(x);
        g->record = x->record;
        x->record = false;
    } else if (!on && g->armed) {
        x->record = g->record;
    }
    g->armed = on;
    dw_qcounter_arm_dy(g->qc, on);
}

dw_status dw_qguard_rewind(dw_qguard *g, const char *dir, int64_t step) {
    if (!g) return DW_OK;
    DW_TRY(dw_qcounter_discard(g->qc));
    arm(g, dw_qguard_due(g, step + 1));
    for (int i = 0; i < g->n; i++) {
        layer *l = &g->l[i];
        l->over = 0;
        memset(l->run, 0, sizeof l->run);
        if (!l->bf16 || l->fell_at <= step) continue;
        dw_prog_node *pn = &((dw_compiled *)g->e->p)->node[l->node];
        pn->bind = l->bind, pn->wq[0] = l->wq[0], pn->wq[1] = l->wq[1];
        l->bf16 = false;
        drop_recordings(g->e->x);
        DW_LOGI("precision: %s runs %s again (its fallback at step %lld is rolled back)",
                g->e->g->nodes[l->node].name, dw_recipe_name(l->recipe), (long long)l->fell_at);
    }
    if (!g->lead) return DW_OK;
    fclose(g->stats), fclose(g->decisions);
    g->stats = g->decisions = NULL;
    DW_TRY(dw_jsonl_open(g->ctx, dir, "quant_stats.jsonl", step, &g->stats));
    return dw_jsonl_open(g->ctx, dir, "precision_decisions.jsonl", step, &g->decisions);
}

static layer *find_layer(dw_qguard *g, const char *name) {
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->e->g->nodes[g->l[i].node].name, name)) return &g->l[i];
    return NULL;
}

/* The kept decisions of a resumed run, applied again (every rank reads the file). */
static dw_status replay(dw_qguard *g, const char *dir, int64_t upto) {
    char *path = dw_path_join(dir, "precision_decisions.jsonl"), *text = NULL;
    size_t n = 0;
    if (!path) return dw_set_error(g->ctx, DW_ERR_NOMEM, "out of memory");
    if (dw_read_file(g->ctx, path, &text, &n) != DW_OK) { /* none yet: nothing fell back */
        dw_clear_error(g->ctx);
        free(path);
        return DW_OK;
    }
    dw_status st = DW_OK;
    for (char *p = text; st == DW_OK && p < text + n;) {
        char *nl = memchr(p, '\n', (size_t)(text + n - p));
        if (!nl) break; /* a partial last line: dropped by the rewrite too */
        json_t *j = NULL;
        long long step = 0;
        const char *name = NULL;
        st = dw_json_load_string(g->ctx, p, (size_t)(nl - p), path, &j);
        if (st == DW_OK) st = dw_json_get_int(g->ctx, j, "step", path, &step);
        if (st == DW_OK) st = dw_json_get_str(g->ctx, j, "layer", path, &name);
        if (st == DW_OK && step <= upto) {
            layer *l = find_layer(g, name);
            if (!l)
                st = dw_set_error(g->ctx, DW_ERR_FORMAT, "%s: layer '%s' (step %lld) is not a quantised linear layer "
                                  "of this model", path, name, step);
            else if (!l->bf16) {
                to_bf16(g, l, step);
                DW_LOGI("precision: %s stays in bf16 (fell back at step %lld; %s)", name, step, path);
            }
        }
        json_decref(j);
        if (step > upto) break;
        p = nl + 1;
    }
    free(text);
    free(path);
    return st;
}

dw_status dw_qguard_open(dw_ctx *ctx, dw_engine *e, dw_comm *host, bool lead, const char *dir, int64_t every,
                         int64_t after, int64_t check_elements, const dw_qcount_rule *rule, int64_t resumed_step,
                         dw_qguard **out) {
    *out = NULL;
    const dw_compiled *p = dw_engine_program(e);
    const dw_graph *gr = p->g;
    dw_qguard *g = calloc(1, sizeof *g);
    if (!g || !(g->l = calloc((size_t)gr->n_nodes, sizeof *g->l))) {
        free(g);
        return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    *g = (dw_qguard){.ctx = ctx, .e = e, .host = host, .lead = lead, .every = every, .after = after, .l = g->l,
                     .check_elements = check_elements,
                     .rule = *rule, .last_step = -1};
    for (int i = 0; p->bf16 && i < gr->n_nodes; i++) {
        const dw_node_binding *b = &p->node[i].bind;
        if (strcmp(dw_op_name(gr->nodes[i].op), "linear") || !dw_compile_quant_recipe(b->recipe)) continue;
        layer *l = &g->l[g->n++];
        *l = (layer){.node = i, .recipe = b->recipe, .bind = *b, .wq = {p->node[i].wq[0], p->node[i].wq[1]}};
        l->measure[T_X] = l->measure[T_W] = b->quantised[DW_QPASS_FPROP];
        l->measure[T_XT] = b->quantised[DW_QPASS_WGRAD];
        l->measure[T_WT] = b->quantised[DW_QPASS_DGRAD];
        l->measure[T_DY] = b->quantised[DW_QPASS_DGRAD];
        l->measure[T_DYT] = b->quantised[DW_QPASS_WGRAD];
    }
    if (g->n && (!(g->nodes = malloc((size_t)g->n * sizeof *g->nodes)) || !(g->fell = calloc((size_t)g->n, 1)) ||
                 !(g->step_counts = malloc((size_t)g->n * DW_QC_KINDS * DW_QC_WORDS * sizeof *g->step_counts)))) {
        dw_qguard_free(g);
        return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < g->n; i++) g->nodes[i] = g->l[i].node;
    dw_status st = g->n ? thresholds(g) : DW_OK;
    if (st == DW_OK && g->n && lead) st = dw_jsonl_open(ctx, dir, "quant_stats.jsonl", resumed_step, &g->stats);
    if (st == DW_OK && g->n && lead)
        st = dw_jsonl_open(ctx, dir, "precision_decisions.jsonl", resumed_step, &g->decisions);
    if (st == DW_OK && g->n && resumed_step > 0) st = replay(g, dir, resumed_step);
    if (st == DW_OK && g->n) st = dw_qcounter_open(ctx, e, g->nodes, g->n, check_elements, &g->qc);
    if (st == DW_OK && g->n) drop_recordings(e->x); /* steps recorded before the counters count nothing */
    if (st == DW_OK && g->n) arm(g, dw_qguard_due(g, resumed_step + 1));
    if (st != DW_OK || !g->n) {
        dw_qguard_free(g);
        return st;
    }
    *out = g;
    return DW_OK;
}

void dw_qguard_free(dw_qguard *g) {
    if (!g) return;
    if (g->stats) fclose(g->stats);
    if (g->decisions) fclose(g->decisions);
    if (g->qc) arm(g, false);
    dw_qcounter_free(g->qc);
    free(g->nodes);
    free(g->fell);
    free(g->step_counts);
    free(g->l);
    free(g->buf);
    free(g->last);
    free(g);
}

bool dw_qguard_due(const dw_qguard *g, int64_t step) { return g && g->every > 0 && step % g->every == 0; }
const char *dw_qguard_last_decisions(const dw_qguard *g) { return g ? g->last : NULL; }

static float *room(dw_qguard *g, int64_t n) {
    if ((size_t)n > g->cap) {
        float *b = realloc(g->buf, (size_t)n * sizeof *b);
        if (!b) return NULL;
        g->buf = b, g->cap = (size_t)n;
    }
    return g->buf;
}

/* The pair (v, v^T) of v [rows, cols] in recipe r into s[0], s[1] where want[0], want[1]: dev (in
 * backend memory, bf16: BF16 codes) measured there by the backend, else host (FP32) with the
 * reference. */
static dw_status measure_pair(dw_qguard *g, dw_recipe r, bool bf16, const void *dev, const float *host, int64_t rows,
                              int64_t cols, const bool want[2], dw_qstats s[2]) {
    dw_backend *be = g->e->be;
    for (int k = 0; k < 2; k++) {
        if (!want[k]) continue;
        if (dev) DW_TRY(be->i->qstats(be, r, bf16, dev, rows, cols, k == 1, &s[k]));
        else DW_TRY(dw_qstats_measure(g->ctx, r, host, rows, cols, k == 1, &s[k]));
    }
    return DW_OK;
}

/* Whether the backend measures where the tensors live (its qstats entry: a few words back per
 * tensor) and dw_qstats_on_device() says so; else they are read back and measured with the
 * reference on the host. */
static bool device_measures(const dw_qguard *g) { return g->e->be->i->qstats != NULL && dw_qstats_on_device(); }

/* Layer l's x and x^T (where it quantises them) into s[T_X], s[T_XT]: from x's value, which is
 * live right after l's forward step (a value recompute drops is gone by the end of the forward). */
static dw_status measure_x(dw_qguard *g, const layer *l, dw_qstats s[T_COUNT]) {
    dw_engine *e = g->e;
    const bool on_device = device_measures(g);
    const dw_compiled *p = e->p;
    const dw_ir_node *n = &p->g->nodes[l->node];
    const dw_recipe ra = dw_compile_quant_act_recipe(l->recipe);
    if (l->measure[T_X] || l->measure[T_XT]) { /* x [rows, K] as the GEMM reads it (BF16 values) */
        const int t = n->in[0];
        const int64_t rows = dw_exec_rows(e->x, t), K = p->tensor[t].width;
        float *x = NULL;
        if (on_device && p->tensor[t].val_off < 0)
            return dw_set_error(g->ctx, DW_ERR_INVALID, "quant check: %s's input has no value in the program",
                                e->g->nodes[l->node].name);
        if (!on_device && !(x = room(g, rows * K))) return dw_set_error(g->ctx, DW_ERR_NOMEM, "quant check: out of memory");
        if (!on_device) DW_TRY(dw_engine_read_value(e, t, x));
        DW_TRY(measure_pair(g, ra, p->bf16, on_device ? e->x->act + p->tensor[t].val_off : NULL, x, rows, K,
                            &l->measure[T_X], &s[T_X]));
    }
    return DW_OK;
}

/* Layer l's W and W^T (where it quantises them) into s[T_W], s[T_WT]. */
static dw_status measure_w(dw_qguard *g, const layer *l, dw_qstats s[T_COUNT]) {
    if (!l->measure[T_W] && !l->measure[T_WT]) return DW_OK;
    dw_engine *e = g->e; /* W [M, K] from the FP32 master */
    int64_t N, K, M;
    dw_compile_linear_dims(e->p, l->node, &N, &K, &M);
    const int pi = e->p->tensor[e->g->nodes[l->node].in[1]].param;
    float *w = NULL;
    if (device_measures(g)) {
        DW_TRY(dw_exec_weights_whole(e->x, "quant check"));
    } else {
        if (!(w = room(g, M * K))) return dw_set_error(g->ctx, DW_ERR_NOMEM, "quant check: out of memory");
        DW_TRY(dw_engine_param_read(e, pi, w));
    }
    return measure_pair(g, dw_compile_quant_weight_recipe(l->recipe), false, w ? NULL : e->x->w + e->p->param_off[pi],
                        w, M, K, &l->measure[T_W], &s[T_W]);
}

static dw_recipe tensor_recipe(const layer *l, int t) {
    return t == T_W || t == T_WT ? dw_compile_quant_weight_recipe(l->recipe) : dw_compile_quant_act_recipe(l->recipe);
}

/* Whether tensor t of l was measured at this check (dy: only by an armed backward). */
static bool measured(const dw_qguard *g, const layer *l, int t) {
    return l->measure[t] && (g->armed || (t != T_DY && t != T_DYT));
}

static dw_status write_stats(dw_qguard *g, int64_t step, const layer *l, const dw_qstats s[T_COUNT]) {
    for (int t = 0; t < T_COUNT; t++) {
        if (!measured(g, l, t)) continue;
        const dw_recipe r = tensor_recipe(l, t);
        if (fprintf(g->stats,
                    "{\"step\": %lld, \"layer\": \"%s\", \"tensor\": \"%s\", \"recipe\": \"%s\", \"rel_error\": %.17g, "
                    "\"bulk_error\": %.17g, \"threshold\": %.15g, \"overflow\": %lld, \"underflow\": %lld, "
                    "\"elements\": %lld, \"measured\": %lld}\n",
                    (long long)step, g->e->g->nodes[l->node].name, TENSOR[t], dw_recipe_name(r),
                    dw_qstats_rel_error(&s[t]), dw_qstats_bulk_error(&s[t]), g->thr[r], (long long)s[t].q.saturated,
                    (long long)s[t].q.flushed, (long long)s[t].elements, (long long)s[t].q.n) < 0)
            return dw_set_error(g->ctx, DW_ERR_IO, "quant_stats.jsonl: write failed");
    }
    return fflush(g->stats) == 0 ? DW_OK : dw_set_error(g->ctx, DW_ERR_IO, "quant_stats.jsonl: write failed");
}

/* The tensor of l furthest over its threshold (relative to it), -1 when none is over. */
static int worst(const dw_qguard *g, const layer *l, const dw_qstats s[T_COUNT]) {
    int w = -1;
    double most = 1.0;
    for (int t = 0; t < T_COUNT; t++) {
        const double thr = g->thr[tensor_recipe(l, t)];
        if (!measured(g, l, t) || !(thr > 0)) continue;
        const double ratio = dw_qstats_bulk_error(&s[t]) / thr;
        if (ratio > most) most = ratio, w = t;
    }
    return w;
}

static dw_status decide(dw_qguard *g, int64_t step, layer *l, const dw_qstats s[T_COUNT], bool *changed) {
    const int t = worst(g, l, s);
    l->over = t < 0 ? 0 : l->over + 1;
    if (t < 0 || g->after <= 0 || l->over < g->after) return DW_OK;
    const char *name = g->e->g->nodes[l->node].name;
    const dw_recipe r = tensor_recipe(l, t);
    const double err = dw_qstats_bulk_error(&s[t]);
    char reason[160];
    snprintf(reason, sizeof reason, "relative quantisation error (bulk) over %g in %lld checks in a row (%s)", g->thr[r],
             (long long)l->over, TENSOR[t]);
    to_bf16(g, l, step);
    *changed = true;
    DW_LOGW("precision: step %lld: %s falls back to bf16: %s %s error %.4g > %g (%lld checks in a row)", (long long)step,
            name, TENSOR[t], dw_recipe_name(r), err, g->thr[r], (long long)l->over);
    char item[600];
    snprintf(item, sizeof item, "%s %s %.3g > %g", name, TENSOR[t], err, g->thr[r]);
    DW_TRY(note(g, step, item));
    if (!g->lead) return DW_OK;
    if (fprintf(g->decisions,
                "{\"step\": %lld, \"layer\": \"%s\", \"tensor\": \"%s\", \"reason\": \"%s\", \"bulk_error\": %.17g, "
                "\"threshold\": %.15g, \"recipe\": \"%s\", \"to\": \"bf16\"}\n",
                (long long)step, name, TENSOR[t], reason, err, g->thr[r], dw_recipe_name(l->recipe)) < 0 ||
        fflush(g->decisions) != 0)
        return dw_set_error(g->ctx, DW_ERR_IO, "precision_decisions.jsonl: write failed");
    return DW_OK;
}

/* The check forward's observer (dw_engine_forward_each): after a live layer's own forward step,
 * its x and x^T into s while x is in memory. */
typedef struct {
    dw_qguard *g;
    dw_qstats *s; /* (n, T_COUNT) */
    bool *done;   /* (n) x measured */
} x_pass;
static dw_status x_after_step(void *user, int step) {
    x_pass *xp = user;
    dw_qguard *g = xp->g;
    const dw_step *st = &g->e->p->steps[step];
    if (st->kind != DW_STEP_FWD) return DW_OK;
    for (int i = 0; i < g->n; i++)
        if (g->l[i].node == st->node && !g->l[i].bf16 && !xp->done[i]) {
            xp->done[i] = true;
            return measure_x(g, &g->l[i], &xp->s[i * T_COUNT]);
        }
    return DW_OK;
}

dw_status dw_qguard_check(dw_qguard *g, int64_t step, const int32_t *tokens, const int32_t *targets, int64_t B,
                          int64_t T, bool *changed) {
    *changed = false;
    free(g->last);
    g->last = NULL, g->last_step = step;
    int live = 0;
    for (int i = 0; i < g->n; i++) live += !g->l[i].bf16;
    if (!live) return DW_OK;
    dw_qstats *s = calloc((size_t)g->n * T_COUNT, sizeof *s);
    enum { V = 8 }; /* x, x^T, dy, dy^T: sum_e2, sum_x2, bulk_e2, bulk_x2, n, saturated, flushed, elements */
    double *sum = calloc((size_t)g->n * 4 * V, sizeof *sum);
    bool *done = calloc((size_t)g->n, sizeof *done);
    if (!s || !sum || !done) {
        free(s), free(sum), free(done);
        return dw_set_error(g->ctx, DW_ERR_NOMEM, "quant check: out of memory");
    }
    for (int i = 0; i < g->n * T_COUNT; i++) s[i] = dw_qstats_zero(), s[i].cap = g->check_elements;
    /* each layer's x measured right after its forward step, the rest (a layer whose forward runs in
     * another node's step: the fused LM head) after the forward */
    x_pass xp = {g, s, done};
    double loss = 0;
    dw_status st = dw_engine_forward_each(g->e, tokens, targets, B, T, x_after_step, &xp, &loss);
    const dw_qstats *dy = dw_qcounter_counts(g->qc)->dy; /* (n, 2): this step's backward, when armed */
    for (int i = 0; st == DW_OK && i < g->n; i++) {
        if (g->l[i].bf16) continue;
        if (!done[i]) st = measure_x(g, &g->l[i], &s[i * T_COUNT]);
        if (st == DW_OK) st = measure_w(g, &g->l[i], &s[i * T_COUNT]);
        if (g->armed) s[i * T_COUNT + T_DY] = dy[2 * i], s[i * T_COUNT + T_DYT] = dy[2 * i + 1];
        for (int t = 0; t < 4 && st == DW_OK; t++) {
            const dw_qstats *q = &s[i * T_COUNT + RANKED[t]];
            double *d = &sum[(i * 4 + t) * V];
            d[0] = q->q.sum_e2, d[1] = q->q.sum_x2, d[2] = q->bulk_e2, d[3] = q->bulk_x2, d[4] = (double)q->q.n,
            d[5] = (double)q->q.saturated, d[6] = (double)q->q.flushed, d[7] = (double)q->elements;
        }
    }
    if (st == DW_OK) st = dw_comm_all_reduce(g->ctx, g->host, sum, (int64_t)g->n * 4 * V, DW_COMM_F64, DW_COMM_SUM);
    for (int i = 0; st == DW_OK && i < g->n; i++) {
        layer *l = &g->l[i];
        if (l->bf16) continue;
        for (int t = 0; t < 4; t++) {
            const double *d = &sum[(i * 4 + t) * V];
            dw_qstats *q = &s[i * T_COUNT + RANKED[t]];
            q->q.sum_e2 = d[0], q->q.sum_x2 = d[1], q->bulk_e2 = d[2], q->bulk_x2 = d[3], q->q.n = (int64_t)d[4];
            q->q.saturated = (int64_t)d[5], q->q.flushed = (int64_t)d[6], q->elements = (int64_t)d[7];
        }
        if (g->lead) st = write_stats(g, step, l, &s[i * T_COUNT]);
        if (st == DW_OK) st = decide(g, step, l, &s[i * T_COUNT], changed);
    }
    free(s);
    free(sum);
    free(done);
    return st;
}

/* The counters' rule after step `step` (guard.h): each live layer's runs of steps over a maximum,
 * and the fallback of a layer with a run of rule.after steps (the counter furthest over its
 * maximum, relative to it). */
static dw_status count_rule(dw_qguard *g, int64_t step, bool *fell) {
    static const char *const KIND[DW_QC_KINDS] = {"x", "w", "dy"}, *const WHAT[2] = {"overflow", "underflow"};
    const double max[2] = {g->rule.overflow_max, g->rule.underflow_max};
    if (g->rule.after <= 0 || (max[0] < 0 && max[1] < 0)) return DW_OK;
    DW_TRY(dw_qcounter_step_all(g->qc, g->host, g->step_counts));
    for (int i = 0; i < g->n; i++) {
        layer *l = &g->l[i];
        if (l->bf16) continue;
        int bk = -1, bw = -1;
        double bfrac = 0, most = 0;
        for (int k = 0; k < DW_QC_KINDS; k++) {
            const int64_t *c = g->step_counts + ((size_t)i * DW_QC_KINDS + k) * DW_QC_WORDS;
            for (int w = 0; w < 2; w++) {
                const double frac = c[DW_QC_N] > 0 ? (double)c[w] / (double)c[DW_QC_N] : 0.0;
                const bool over = max[w] >= 0 && frac > max[w];
                l->run[k][w] = over ? l->run[k][w] + 1 : 0;
                const double ratio = max[w] > 0 ? frac / max[w] : INFINITY;
                if (l->run[k][w] >= g->rule.after && (bk < 0 || ratio > most)) bk = k, bw = w, bfrac = frac, most = ratio;
            }
        }
        if (bk < 0) continue;
        const char *name = g->e->g->nodes[l->node].name;
        char reason[160], item[600];
        snprintf(reason, sizeof reason, "%s %s %.3g%% > %.3g%% for %lld steps", WHAT[bw], KIND[bk], 100 * bfrac,
                 100 * max[bw], (long long)l->run[bk][bw]);
        to_bf16(g, l, step);
        *fell = true;
        DW_LOGW("precision: step %lld: %s falls back to bf16: %s", (long long)step, name, reason);
        snprintf(item, sizeof item, "%s %s", name, reason);
        DW_TRY(note(g, step, item));
        if (!g->lead) continue;
        if (fprintf(g->decisions,
                    "{\"step\": %lld, \"layer\": \"%s\", \"tensor\": \"%s\", \"reason\": \"%s\", \"rule\": \"%s\", "
                    "\"fraction\": %.17g, \"threshold\": %.17g, \"steps\": %lld, \"recipe\": \"%s\", \"to\": \"bf16\"}\n",
                    (long long)step, name, KIND[bk], reason, WHAT[bw], bfrac, max[bw], (long long)l->run[bk][bw],
                    dw_recipe_name(l->recipe)) < 0 ||
            fflush(g->decisions) != 0)
            return dw_set_error(g->ctx, DW_ERR_IO, "precision_decisions.jsonl: write failed");
    }
    return DW_OK;
}

dw_status dw_qguard_step_end(dw_qguard *g, int64_t step, int64_t *overflow, int64_t *underflow, bool *fell) {
    *overflow = *underflow = -1;
    *fell = false;
    if (!g) return DW_OK;
    DW_TRY(dw_qcounter_read(g->qc, g->host, overflow, underflow));
    DW_TRY(count_rule(g, step, fell));
    for (int i = 0; i < g->n; i++) /* a layer fallen back at this step's check or rule counted x until now */
        if (g->l[i].bf16) dw_qcounter_forget(g->qc, i);
    if (dw_qguard_due(g, step)) {
        for (int i = 0; i < g->n; i++) g->fell[i] = g->l[i].bf16;
        DW_TRY(dw_qcounter_write(g->qc, g->host, g->lead ? g->stats : NULL, step, g->fell));
    }
    arm(g, dw_qguard_due(g, step + 1));
    return DW_OK;
}
