/* kv_cache.c — decoding with a K/V cache (kv_cache.h). The executor runs every forward step of
 * the program for one token, except learned positions, RoPE and attention, which run here over
 * the cached positions. On the CPU engine all three run on the host (kernels/cpu/decode_cpu.h): in
 * FP32, from activations widened from BF16 in a BF16 program and rounded back to it once, as the
 * CPU backend's whole-sequence ops do (runtime/cpu/cpu.h), through the backend's download and
 * upload (plain copies there). On a CUDA engine the cache stays in device memory in the
 * activation type and attention runs there (runtime/cuda/decode_cuda.h: flash-decoding); learned
 * positions and RoPE still run on the host, one position's row crossing PCIe each way. */
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/error.h"
#include "formats/formats.h"
#include "kernels/cpu/decode_cpu.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/cuda/decode_cuda.h"
#include "runtime/exec.h"
#include "runtime/kv_cache.h"

struct dw_kv_cache {
    dw_engine *e;
    int64_t len, cap;  /* positions cached, the program's seq */
    float **k, **v;    /* per node: (cap, Hkv, D) for attention nodes, else NULL (host cache) */
    bool dev;          /* the cache and attention on the device (a CUDA engine) */
    void **kd, **vd;   /* dev: per node (cap, Hkv, D) in the activation type on the device */
    void *work;        /* dev: the decode attention's workspace (work_bytes) */
    size_t work_bytes;
    float *in, *out;   /* (row) one position's FP32 input and output of the ops run here */
    int32_t *tokens;   /* (cap) the tokens cached: a step that changes longrope's table re-runs them */
    int64_t row;       /* the widest row those ops read or write (the logits' V included) */
    void *raw;         /* (cap x row) activation bytes on their way from or to the backend */
};

static bool decodes_rowwise(dw_op op) {
    switch (op) {
    case DW_OP_EMBEDDING: case DW_OP_LAYERNORM: case DW_OP_RMSNORM: case DW_OP_LINEAR: case DW_OP_GELU:
    case DW_OP_SILU: case DW_OP_SWIGLU: case DW_OP_ADD: case DW_OP_HEAD_RMSNORM: case DW_OP_SIGMOID_GATE:
    case DW_OP_SOFTCAP: case DW_OP_GEGLU:
    case DW_OP_CROSS_ENTROPY: /* skipped without targets */
        return true;
    default: return false;
    }
}

/* A mixture of experts decodes token by token when no token is ever dropped (no capacity factor,
 * or one of E or more: every expert may take every assignment), so its dispatch, expert GEMMs and
 * combine are row-wise; its load-balancing statistics feed only the loss. */
static bool moe_rowwise(const dw_ir_node *n) {
    switch (n->op) {
    case DW_OP_MOE_DISPATCH:
        return !(n->attrs.capacity_factor > 0) || n->attrs.capacity_factor >= (double)n->attrs.experts;
    case DW_OP_MOE_ROUTER: case DW_OP_MOE_LINEAR: case DW_OP_MOE_COMBINE: case DW_OP_MOE_AUX_STATS:
    case DW_OP_MOE_AUX_LOSS:
        return true;
    default: return false;
    }
}

bool dw_kv_cache_supported(const dw_engine *e) {
    const dw_compiled *p = e->p;
    /* CUDA engines too since gpu_test_kv_cache_cuda passed on an H100 (session 17); DW_KV_CACHE=0
     * turns the cache off for both in the sampler (train/sample.c) */
    if (p->head_xent >= 0) return false; /* fused head: no logits */
    for (int s = p->phase[DW_PHASE_FORWARD][0]; s < p->phase[DW_PHASE_FORWARD][1]; s++) {
        const dw_step *st = &p->steps[s];
        if (st->kind != DW_STEP_FWD) return false;
        const dw_ir_node *n = &e->g->nodes[st->node];
        /* quantised GEMMs may scale by a whole tensor's amax: a row would depend on the others */
        if (p->bf16 && dw_compile_quant_recipe(p->node[st->node].bind.recipe) &&
            (n->op == DW_OP_LINEAR || n->op == DW_OP_MOE_LINEAR))
            return false;
        if (!decodes_rowwise(n->op) && !moe_rowwise(n) && n->op != DW_OP_POSITION && n->op != DW_OP_ROPE &&
            n->op != DW_OP_ATTENTION)
            return false;
    }
    return true;
}

void dw_kv_cache_free(dw_kv_cache *kv) {
    if (!kv) return;
    dw_backend *be = kv->e->be;
    for (int i = 0; kv->k && i < kv->e->g->n_nodes; i++) {
        free(kv->k[i]);
        free(kv->v[i]);
    }
    for (int i = 0; kv->kd && i < kv->e->g->n_nodes; i++) {
        if (kv->kd[i]) be->i->release(be, kv->kd[i]);
        if (kv->vd[i]) be->i->release(be, kv->vd[i]);
    }
    if (kv->work) be->i->release(be, kv->work);
    free(kv->kd);
    free(kv->vd);
    free(kv->k);
    free(kv->v);
    free(kv->in);
    free(kv->out);
    free(kv->raw);
    free(kv->tokens);
    free(kv);
}

static int64_t kv_width(const dw_ir_node *n) { return n->attrs.kv_heads * n->attrs.head_dim; }

dw_status dw_kv_cache_create(dw_engine *e, dw_kv_cache **out) {
    *out = NULL;
    DW_TRY(dw_exec_weights_whole(e->x, "KV cache")); /* it reads the masters in place (ZeRO-3: gathered first) */
    if (!dw_kv_cache_supported(e))
        return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "KV cache: the %s engine's program cannot decode with one",
                            e->be->i->name);
    const dw_graph *g = e->g;
    dw_kv_cache *kv = calloc(1, sizeof *kv);
    if (kv) kv->e = e, kv->cap = g->seq;
    if (kv) kv->k = calloc((size_t)g->n_nodes, sizeof *kv->k), kv->v = calloc((size_t)g->n_nodes, sizeof *kv->v);
    if (kv) kv->kd = calloc((size_t)g->n_nodes, sizeof *kv->kd), kv->vd = calloc((size_t)g->n_nodes, sizeof *kv->vd);
    if (kv) kv->dev = e->be->device != DW_DEVICE_CPU;
    bool ok = kv && kv->k && kv->v && kv->kd && kv->vd;
    dw_status st = DW_OK;
    for (int i = 0; ok && i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        if (n->op == DW_OP_POSITION || n->op == DW_OP_ROPE || n->op == DW_OP_ATTENTION)
            for (int j = 0; j < n->n_in; j++)
                if (e->p->tensor[n->in[j]].width > kv->row) kv->row = e->p->tensor[n->in[j]].width;
        if (n->op != DW_OP_ATTENTION) continue;
        if (kv->dev) { /* (cap, Hkv, D) keys and values in the activation type, one workspace for all nodes */
            const int64_t bytes = kv->cap * kv_width(n) * (e->p->bf16 ? 2 : 4);
            const size_t wb = dw_cuda_decode_work_bytes(n->attrs.heads, n->attrs.head_dim, kv->cap);
            if (wb > kv->work_bytes) kv->work_bytes = wb;
            st = e->be->i->alloc(e->be, bytes, &kv->kd[i]);
            if (st == DW_OK) st = e->be->i->alloc(e->be, bytes, &kv->vd[i]);
            ok = st == DW_OK;
            continue;
        }
        const size_t bytes = (size_t)(kv->cap * kv_width(n)) * sizeof(float);
        kv->k[i] = malloc(bytes), kv->v[i] = malloc(bytes);
        ok = kv->k[i] && kv->v[i];
    }
    if (ok && kv->dev) {
        st = e->be->i->alloc(e->be, (int64_t)kv->work_bytes, &kv->work);
        ok = st == DW_OK;
    }
    for (int i = 0; ok && i < g->n_nodes; i++) /* the prefill downloads an attention input's rows at once */
        if (g->nodes[i].op == DW_OP_ATTENTION)
            for (int j = 0; j < g->nodes[i].n_in; j++)
                if (e->p->tensor[g->nodes[i].in[j]].width > kv->row) kv->row = e->p->tensor[g->nodes[i].in[j]].width;
    if (g->model.vocab > kv->row) kv->row = g->model.vocab;
    if (ok) kv->in = malloc((size_t)kv->row * sizeof(float)), kv->out = malloc((size_t)kv->row * sizeof(float));
    if (ok) kv->raw = malloc((size_t)(kv->cap * kv->row) * sizeof(float));
    if (ok) kv->tokens = malloc((size_t)kv->cap * sizeof *kv->tokens);
    ok = ok && kv->in && kv->out && kv->raw && kv->tokens;
    if (!ok) {
        dw_kv_cache_free(kv);
        return st != DW_OK ? st : dw_set_error(e->ctx, DW_ERR_NOMEM, "KV cache: out of memory");
    }
    *out = kv;
    return DW_OK;
}

int64_t dw_kv_cache_len(const dw_kv_cache *kv) { return kv->len; }

/* Activation t's storage on the backend (FP32 or BF16 elements, the program's). */
static char *act(const dw_exec *x, int t) { return x->act + x->p->tensor[t].val_off; }

/* Rows [r0, r0 + rows) of activation t (rows of `stride` elements) downloaded to kv->raw. */
static dw_status fetch(dw_kv_cache *kv, int t, int64_t r0, int64_t rows, int64_t stride) {
    const dw_exec *x = kv->e->x;
    const size_t es = x->p->bf16 ? 2 : 4;
    return x->be->i->download(x->be, kv->raw, act(x, t) + (size_t)(r0 * stride) * es, (size_t)(rows * stride) * es);
}

/* Elements [off, off + n) of row r of rows fetched into raw (rows of `stride` elements) as FP32. */
static void widen(const dw_exec *x, const void *raw, int64_t r, int64_t stride, int64_t off, int64_t n, float *out) {
    const int64_t at = r * stride + off;
    if (!x->p->bf16) {
        memcpy(out, (const float *)raw + at, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *h = (const uint16_t *)raw + at;
    for (int64_t i = 0; i < n; i++) out[i] = dw_decode_bf16(h[i]);
}

/* Row 0 of activation t (n elements) from FP32 y, rounded once in a BF16 program, uploaded. */
static dw_status store(dw_kv_cache *kv, int t, const float *y, int64_t n) {
    const dw_exec *x = kv->e->x;
    if (!x->p->bf16) return x->be->i->upload(x->be, act(x, t), y, (size_t)n * sizeof(float));
    uint16_t *h = kv->raw;
    for (int64_t i = 0; i < n; i++) h[i] = dw_encode_bf16(y[i]);
    return x->be->i->upload(x->be, act(x, t), h, (size_t)n * 2);
}

/* Row `row` of a parameter's FP32 master (what the backends' position op reads in either mode). */
static dw_status param_row(dw_kv_cache *kv, int t, int64_t row, int64_t n, float *out) {
    const dw_exec *x = kv->e->x;
    const float *w = x->w + x->p->param_off[x->p->tensor[t].param] + row * n;
    return x->be->i->download(x->be, out, w, (size_t)n * sizeof(float));
}

/* Rows [0, rows) of attention node n's keys and values (3 inputs, or one packed q|k|v) into the
 * cache at positions pos.. (on the device: copied there, in the activation type) */
static dw_status keep_kv(dw_kv_cache *kv, int node, int64_t pos, int64_t rows) {
    const dw_exec *x = kv->e->x;
    const dw_ir_node *n = &x->g->nodes[node];
    const int64_t dq = n->attrs.heads * n->attrs.head_dim, dkv = kv_width(n);
    const bool packed = n->n_in == 1;
    const int64_t stride = packed ? dq + 2 * dkv : dkv;
    for (int which = 0; which < 2; which++) { /* keys, then values */
        const int t = packed ? n->in[0] : n->in[1 + which];
        if (kv->dev) {
            const char *src = act(x, t) + (size_t)(packed ? dq + which * dkv : 0) * (x->p->bf16 ? 2 : 4);
            DW_TRY(dw_cuda_decode_keep(x->be, x->p->bf16, which ? kv->vd[node] : kv->kd[node], pos, src, rows,
                                       stride, dkv));
            continue;
        }
        DW_TRY(fetch(kv, t, 0, rows, stride));
        float *cache = which ? kv->v[node] : kv->k[node];
        for (int64_t r = 0; r < rows; r++)
            widen(x, kv->raw, r, stride, packed ? dq + which * dkv : 0, dkv, cache + (pos + r) * dkv);
    }
    return DW_OK;
}

static dw_status read_logits(dw_kv_cache *kv, int64_t row, float *logits) {
    const dw_exec *x = kv->e->x;
    const int64_t V = x->g->model.vocab;
    DW_TRY(fetch(kv, x->g->logits, row, 1, V));
    widen(x, kv->raw, 0, V, 0, V, logits);
    return DW_OK;
}

/* The prefill's observer (dw_engine_forward_each): an attention node's keys and values into the
 * cache right after its step, while they are in memory (under full recompute a block's inner
 * values are gone once the block's forward has read them). */
typedef struct {
    dw_kv_cache *kv;
    int64_t rows;
} prefill_pass;
static dw_status keep_after_step(void *user, int step) {
    const prefill_pass *pp = user;
    const dw_exec *x = pp->kv->e->x;
    const dw_step *st = &x->p->steps[step];
    if (st->kind != DW_STEP_FWD || x->g->nodes[st->node].op != DW_OP_ATTENTION) return DW_OK;
    return keep_kv(pp->kv, st->node, 0, pp->rows);
}

dw_status dw_kv_cache_prefill(dw_kv_cache *kv, const int32_t *tokens, int64_t n, float *logits) {
    dw_engine *e = kv->e;
    if (n < 1 || n > kv->cap)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "KV cache: a prefill of %lld tokens (1 to %lld)", (long long)n,
                            (long long)kv->cap);
    kv->len = 0;
    if (tokens != kv->tokens) memcpy(kv->tokens, tokens, (size_t)n * sizeof *tokens);
    prefill_pass pp = {kv, n};
    DW_TRY(dw_engine_forward_each(e, tokens, NULL, 1, n, keep_after_step, &pp, NULL));
    kv->len = n;
    return read_logits(kv, n - 1, logits);
}

/* One forward step of node st->node for the token at position pos (b = t = 1): inputs as FP32
 * (kv->in), the result (kv->out) stored once. */
static dw_status decode_node(dw_kv_cache *kv, int node, int64_t pos) {
    const dw_exec *x = kv->e->x;
    const dw_ir_node *n = &x->g->nodes[node];
    const dw_ir_attrs *a = &n->attrs;
    const int64_t w_in = x->p->tensor[n->in[0]].width, w_out = x->p->tensor[n->out[0]].width;
    if (n->op == DW_OP_ATTENTION) DW_TRY(keep_kv(kv, node, pos, 1)); /* this position's keys and values */
    if (n->op == DW_OP_ATTENTION && kv->dev) /* the query (a packed row's first H D) against the device cache */
        return dw_cuda_decode_attention(x->be, x->p->bf16, act(x, n->out[0]), act(x, n->in[0]), kv->kd[node],
                                        kv->vd[node], pos + 1, kv->cap, a->heads, a->kv_heads, a->head_dim, a->window,
                                        a->softcap, kv->work, kv->work_bytes);
    DW_TRY(fetch(kv, n->in[0], 0, 1, w_in));
    const void *raw = kv->raw;
    if (n->op == DW_OP_POSITION) {
        widen(x, raw, 0, w_in, 0, w_in, kv->in);
        DW_TRY(param_row(kv, n->in[1], pos, w_out, kv->out)); /* wpe[pos] */
        dw_cpu_pos_fwd(kv->out, kv->in, kv->out, 1, 1, w_out);
    } else if (n->op == DW_OP_ROPE) {
        widen(x, raw, 0, w_in, 0, w_in, kv->in);
        dw_cpu_rope_fwd_at(kv->out, kv->in, pos, a->heads, a->head_dim, a->theta, &a->rope);
    } else { /* attention: the query (the first H D of a packed row) against the cache */
        widen(x, raw, 0, w_in, 0, a->heads * a->head_dim, kv->in);
        dw_cpu_attention_decode(kv->out, kv->in, kv->k[node], kv->v[node], pos + 1, a->heads, a->kv_heads,
                                a->head_dim, a->window, a->softcap);
    }
    return store(kv, n->out[0], kv->out, w_out);
}

/* Whether a longrope node rotates a run of len + 1 positions with another table than one of len
 * (kernels/rope_freq.h: the long factors past original_max_position_embeddings). */
static bool rope_table_changes(const dw_kv_cache *kv) {
    const dw_graph *g = kv->e->g;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == DW_OP_ROPE &&
            dw_rope_long(&g->nodes[i].attrs.rope, kv->len) != dw_rope_long(&g->nodes[i].attrs.rope, kv->len + 1))
            return true;
    return false;
}

dw_status dw_kv_cache_step(dw_kv_cache *kv, int32_t token, float *logits) {
    dw_engine *e = kv->e;
    dw_exec *x = e->x;
    if (kv->len < 1 || kv->len >= kv->cap)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "KV cache: %lld of %lld positions held (prefill first; a full "
                            "cache takes no more)", (long long)kv->len, (long long)kv->cap);
    kv->tokens[kv->len] = token;
    if (rope_table_changes(kv)) /* the cached keys were rotated by the short table: all again, as transformers does */
        return dw_kv_cache_prefill(kv, kv->tokens, kv->len + 1, logits);
    DW_TRY(dw_engine_check_batch(e, &token, NULL, 1, 1));
    DW_TRY(dw_exec_set_batch(x, &token, NULL, 1, 1));
    dw_exec_begin_phase(x, DW_PHASE_FORWARD);
    const dw_compiled *p = e->p;
    for (int s = p->phase[DW_PHASE_FORWARD][0]; s < p->phase[DW_PHASE_FORWARD][1]; s++) {
        const int node = p->steps[s].node;
        const dw_op op = e->g->nodes[node].op;
        if (op == DW_OP_POSITION || op == DW_OP_ROPE || op == DW_OP_ATTENTION) DW_TRY(decode_node(kv, node, kv->len));
        else DW_TRY(dw_exec_step(x, s, false, 1.0));
    }
    kv->len++;
    return read_logits(kv, 0, logits);
}
