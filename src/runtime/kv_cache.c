/* kv_cache.c — decoding with a K/V cache on the CPU reference engine (kv_cache.h). The executor
 * runs every forward step of the program for one token, except learned positions, RoPE and
 * attention, which run here on the cached positions (kernels/cpu/decode_cpu.h). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/decode_cpu.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/exec.h"
#include "runtime/kv_cache.h"

struct dw_kv_cache {
    dw_engine *e;
    int64_t len, cap;  /* positions cached, the program's seq */
    float **k, **v;    /* per node: (cap, Hkv, D) for attention nodes, else NULL */
};

static bool decodes_rowwise(dw_op op) {
    switch (op) {
    case DW_OP_EMBEDDING: case DW_OP_LAYERNORM: case DW_OP_RMSNORM: case DW_OP_LINEAR: case DW_OP_GELU:
    case DW_OP_SILU: case DW_OP_SWIGLU: case DW_OP_ADD: case DW_OP_HEAD_RMSNORM: case DW_OP_SIGMOID_GATE:
    case DW_OP_CROSS_ENTROPY: /* skipped without targets */
        return true;
    default: return false;
    }
}

bool dw_kv_cache_supported(const dw_engine *e) {
    const dw_compiled *p = e->p;
    if (e->be->device != DW_DEVICE_CPU || p->bf16) return false;
    for (int s = p->phase[DW_PHASE_FORWARD][0]; s < p->phase[DW_PHASE_FORWARD][1]; s++) {
        const dw_step *st = &p->steps[s];
        if (st->kind != DW_STEP_FWD) return false;
        const dw_op op = e->g->nodes[st->node].op;
        if (!decodes_rowwise(op) && op != DW_OP_POSITION && op != DW_OP_ROPE && op != DW_OP_ATTENTION) return false;
    }
    return true;
}

void dw_kv_cache_free(dw_kv_cache *kv) {
    if (!kv) return;
    for (int i = 0; kv->k && i < kv->e->g->n_nodes; i++) {
        free(kv->k[i]);
        free(kv->v[i]);
    }
    free(kv->k);
    free(kv->v);
    free(kv);
}

static int64_t kv_width(const dw_ir_node *n) { return n->attrs.kv_heads * n->attrs.head_dim; }

dw_status dw_kv_cache_create(dw_engine *e, dw_kv_cache **out) {
    *out = NULL;
    if (!dw_kv_cache_supported(e))
        return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "KV cache: the %s engine's program cannot decode with one",
                            e->be->i->name);
    const dw_graph *g = e->g;
    dw_kv_cache *kv = calloc(1, sizeof *kv);
    if (kv) kv->e = e, kv->cap = g->seq;
    if (kv) kv->k = calloc((size_t)g->n_nodes, sizeof *kv->k), kv->v = calloc((size_t)g->n_nodes, sizeof *kv->v);
    bool ok = kv && kv->k && kv->v;
    for (int i = 0; ok && i < g->n_nodes; i++) {
        if (g->nodes[i].op != DW_OP_ATTENTION) continue;
        const size_t bytes = (size_t)(kv->cap * kv_width(&g->nodes[i])) * sizeof(float);
        kv->k[i] = malloc(bytes), kv->v[i] = malloc(bytes);
        ok = kv->k[i] && kv->v[i];
    }
    if (!ok) {
        dw_kv_cache_free(kv);
        return dw_set_error(e->ctx, DW_ERR_NOMEM, "KV cache: out of memory");
    }
    *out = kv;
    return DW_OK;
}

int64_t dw_kv_cache_len(const dw_kv_cache *kv) { return kv->len; }

/* The FP32 value of tensor t: an activation (current batch rows) or a parameter's master. */
static float *value(const dw_exec *x, int t) {
    const dw_prog_tensor *pt = &x->p->tensor[t];
    if (x->g->tensors[t].kind == DW_TENSOR_PARAM) return x->w + x->p->param_off[pt->param];
    return (float *)(x->act + pt->val_off);
}

/* Rows [0, rows) of attention node n's keys and values (3 inputs, or one packed q|k|v) into the
 * cache at positions pos.. */
static void keep_kv(dw_kv_cache *kv, int node, int64_t pos, int64_t rows) {
    const dw_exec *x = kv->e->x;
    const dw_ir_node *n = &x->g->nodes[node];
    const int64_t dq = n->attrs.heads * n->attrs.head_dim, dkv = kv_width(n);
    const bool packed = n->n_in == 1;
    const float *k = packed ? value(x, n->in[0]) + dq : value(x, n->in[1]);
    const float *v = packed ? value(x, n->in[0]) + dq + dkv : value(x, n->in[2]);
    const int64_t stride = packed ? dq + 2 * dkv : dkv;
    for (int64_t r = 0; r < rows; r++) {
        memcpy(kv->k[node] + (pos + r) * dkv, k + r * stride, (size_t)dkv * sizeof(float));
        memcpy(kv->v[node] + (pos + r) * dkv, v + r * stride, (size_t)dkv * sizeof(float));
    }
}

static dw_status read_logits(const dw_kv_cache *kv, int64_t row, float *logits) {
    const dw_exec *x = kv->e->x;
    const int64_t V = x->g->model.vocab;
    memcpy(logits, value(x, x->g->logits) + row * V, (size_t)V * sizeof(float));
    return DW_OK;
}

dw_status dw_kv_cache_prefill(dw_kv_cache *kv, const int32_t *tokens, int64_t n, float *logits) {
    dw_engine *e = kv->e;
    if (n < 1 || n > kv->cap)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "KV cache: a prefill of %lld tokens (1 to %lld)", (long long)n,
                            (long long)kv->cap);
    kv->len = 0;
    DW_TRY(dw_engine_forward(e, tokens, NULL, 1, n, NULL, NULL));
    for (int i = 0; i < e->g->n_nodes; i++)
        if (kv->k[i]) keep_kv(kv, i, 0, n);
    kv->len = n;
    return read_logits(kv, n - 1, logits);
}

/* One forward step of node st->node for the token at position pos (b = t = 1). */
static dw_status decode_node(dw_kv_cache *kv, int node, int64_t pos) {
    const dw_exec *x = kv->e->x;
    const dw_ir_node *n = &x->g->nodes[node];
    const dw_ir_attrs *a = &n->attrs;
    float *y = value(x, n->out[0]);
    if (n->op == DW_OP_POSITION) {
        const int64_t C = x->p->tensor[n->out[0]].width;
        dw_cpu_pos_fwd(y, value(x, n->in[0]), value(x, n->in[1]) + pos * C, 1, 1, C);
    } else if (n->op == DW_OP_ROPE) {
        dw_cpu_rope_fwd_at(y, value(x, n->in[0]), pos, a->heads, a->head_dim, a->theta, &a->rope);
    } else { /* attention: this position's keys and values join the cache, its query reads them */
        keep_kv(kv, node, pos, 1);
        dw_cpu_attention_decode(y, value(x, n->in[0]), kv->k[node], kv->v[node], pos + 1, a->heads, a->kv_heads,
                                a->head_dim, a->window);
    }
    return DW_OK;
}

dw_status dw_kv_cache_step(dw_kv_cache *kv, int32_t token, float *logits) {
    dw_engine *e = kv->e;
    dw_exec *x = e->x;
    if (kv->len < 1 || kv->len >= kv->cap)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "KV cache: %lld of %lld positions held (prefill first; a full "
                            "cache takes no more)", (long long)kv->len, (long long)kv->cap);
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
