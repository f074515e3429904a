/* amax_state.c — delayed scaling for an engine (amax_state.h): the histories of its fp8_tensor
 * linear layers in the engine's backend memory, attached to its executor for the quantisers, the
 * per-step roll (the CPU here, the GPU's kernel in precision/amax_history.cu), the ranks' exchange
 * and the checkpoint JSON. The rule and the quantiser: precision/amax_history.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/exec.h"
#include "train/amax_state.h"
#if DW_HAVE_CUDA
#include "runtime/cuda/cuda.h"
#endif

static const char *const KIND[DW_AMAX_KINDS] = {"x", "dy", "w"};

static size_t state_bytes(const dw_amax *a) { return (size_t)a->n_slots * DW_AMAX_WORDS(a->n) * sizeof(uint32_t); }

dw_status dw_amax_open(dw_ctx *ctx, dw_engine *e, int64_t n, dw_amax **out) {
    *out = NULL;
    const dw_compiled *p = e->p;
    if (n <= 0 || !p->bf16) return DW_OK;
    dw_amax *a = calloc(1, sizeof *a);
    if (!a || !(a->slot = malloc((size_t)p->g->n_nodes * sizeof *a->slot))) {
        free(a);
        return dw_set_error(ctx, DW_ERR_NOMEM, "amax history: out of memory");
    }
    a->e = e, a->n = n;
    for (int i = 0; i < p->g->n_nodes; i++) {
        const bool fp8t = !strcmp(dw_op_name(p->g->nodes[i].op), "linear") && p->node[i].bind.recipe == DW_RECIPE_FP8_TENSOR;
        a->slot[i] = fp8t ? a->n_slots : -1;
        a->n_slots += fp8t ? DW_AMAX_KINDS : 0;
    }
    if (!a->n_slots) {
        dw_amax_free(a);
        return DW_OK;
    }
    void *mem = NULL;
    dw_status st = e->be->i->alloc(e->be, (int64_t)state_bytes(a), &mem);
    a->state = mem;
    if (st == DW_OK) st = e->be->i->zero(e->be, mem, state_bytes(a));
    if (st == DW_OK) {
        e->x->amax = a;
        st = dw_engine_refresh(e); /* the weights quantised under the (empty) histories: their amaxes noted */
    }
    if (st != DW_OK) {
        dw_amax_free(a);
        return st;
    }
    *out = a;
    return DW_OK;
}

void dw_amax_free(dw_amax *a) {
    if (!a) return;
    if (a->e->x->amax == a) a->e->x->amax = NULL;
    if (a->state) a->e->be->i->release(a->e->be, a->state);
    free(a->slot);
    free(a);
}

static bool on_gpu(const dw_amax *a) { return dw_ctx_device(a->e->ctx) == DW_DEVICE_CUDA; }

/* Every rank's pending amaxes replaced by their largest over the ranks. */
static dw_status exchange(dw_ctx *ctx, dw_amax *a, dw_comm *host) {
    dw_backend *be = a->e->be;
    const size_t w = DW_AMAX_WORDS(a->n), bytes = state_bytes(a);
    uint32_t *h = malloc(bytes);
    int64_t *all = malloc((size_t)host->world * (size_t)a->n_slots * sizeof *all);
    dw_status st = h && all ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "amax history: out of memory");
    if (st == DW_OK) st = be->i->download(be, h, a->state, bytes);
    for (int s = 0; st == DW_OK && s < a->n_slots; s++) all[(size_t)host->rank * a->n_slots + s] = h[s * w + DW_AMAX_PENDING];
    if (st == DW_OK) st = dw_comm_all_gather(ctx, host, all, a->n_slots, DW_COMM_I64);
    for (int s = 0; st == DW_OK && s < a->n_slots; s++)
        for (int r = 0; r < host->world; r++) {
            const uint32_t v = (uint32_t)all[(size_t)r * a->n_slots + s];
            if (v > h[s * w + DW_AMAX_PENDING]) h[s * w + DW_AMAX_PENDING] = v;
        }
    if (st == DW_OK) st = be->i->upload(be, a->state, h, bytes);
    free(h);
    free(all);
    return st;
}

dw_status dw_amax_step(dw_amax *a, dw_comm *host) {
    if (!a) return DW_OK;
    dw_ctx *ctx = a->e->ctx;
    if (host && host->world > 1) DW_TRY(exchange(ctx, a, host));
    if (on_gpu(a)) {
#if DW_HAVE_CUDA
        return dw_amax_roll_cuda(ctx, a->state, a->n_slots, a->n, DW_CUDA_STREAM(a->e->be));
#else
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "amax history: a CUDA engine in a build without CUDA");
#endif
    }
    for (int s = 0; s < a->n_slots; s++) dw_amax_roll(a->state + (size_t)s * DW_AMAX_WORDS(a->n), (uint32_t)a->n);
    return DW_OK;
}

static json_t *hexf(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    char b[32];
    snprintf(b, sizeof b, "%a", (double)f);
    return json_string(b);
}

char *dw_amax_state_json(dw_ctx *ctx, dw_amax *a) {
    dw_backend *be = a->e->be;
    const size_t w = DW_AMAX_WORDS(a->n);
    uint32_t *h = malloc(state_bytes(a));
    if (!h) return dw_set_error(ctx, DW_ERR_NOMEM, "amax history: out of memory"), NULL;
    if (be->i->download(be, h, a->state, state_bytes(a)) != DW_OK) {
        free(h);
        return NULL;
    }
    json_t *ops = json_object();
    for (int i = 0; ops && i < a->e->g->n_nodes; i++) {
        if (a->slot[i] < 0) continue;
        json_t *node = json_object();
        for (int k = 0; node && k < DW_AMAX_KINDS; k++) {
            const uint32_t *s = h + (size_t)(a->slot[i] + k) * w;
            json_t *ring = json_array();
            for (int64_t r = 0; ring && r < a->n; r++) json_array_append_new(ring, hexf(s[DW_AMAX_RING + r]));
            json_object_set_new(node, KIND[k], json_pack("{s:o,s:I,s:o}", "amax", ring, "pos",
                                                         (json_int_t)s[DW_AMAX_POS], "pending", hexf(s[DW_AMAX_PENDING])));
        }
        json_object_set_new(ops, a->e->g->nodes[i].name, node);
    }
    json_t *j = json_pack("{s:I,s:o}", "length", (json_int_t)a->n, "operands", ops);
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    free(h);
    if (!text) dw_set_error(ctx, DW_ERR_NOMEM, "amax history: out of memory");
    return text;
}

/* A finite, non-negative hex float as FP32 bits, exactly. */
static dw_status parse_amax(dw_ctx *ctx, const json_t *v, const char *what, const char *node, uint32_t *out) {
    const char *t = json_string_value(v);
    char *end = NULL;
    errno = 0;
    const float f = t ? strtof(t, &end) : 0.0f;
    if (!t || !*t || *end || errno || !(f >= 0.0f) || f > 3.4e38f)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: fp8_amax_history: %s: expected a finite amax >= 0 as a hex float "
                            "string (\"0x1.8p+3\"), got %s", what, node, t ? t : "a non-string");
    memcpy(out, &f, sizeof *out);
    return DW_OK;
}

static int node_of(const dw_amax *a, const char *name) {
    for (int i = 0; i < a->e->g->n_nodes; i++)
        if (a->slot[i] >= 0 && !strcmp(a->e->g->nodes[i].name, name)) return i;
    return -1;
}

dw_status dw_amax_state_load(dw_ctx *ctx, dw_amax *a, const json_t *j, const char *what) {
    dw_backend *be = a->e->be;
    const size_t w = DW_AMAX_WORDS(a->n);
    if (!j) return be->i->zero(be, a->state, state_bytes(a));
    const json_t *len = json_object_get(j, "length"), *ops = json_object_get(j, "operands");
    if (!json_is_integer(len) || !json_is_object(ops))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: fp8_amax_history needs \"length\" and \"operands\"", what);
    if (json_integer_value(len) != a->n)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: its fp8 amax histories are %lld steps long, this run's "
                            "--fp8-amax-history is %lld: resume with --fp8-amax-history %lld", what,
                            (long long)json_integer_value(len), (long long)a->n, (long long)json_integer_value(len));
    uint32_t *h = calloc(1, state_bytes(a));
    if (!h) return dw_set_error(ctx, DW_ERR_NOMEM, "amax history: out of memory");
    dw_status st = DW_OK;
    const char *name;
    const json_t *node;
    json_object_foreach((json_t *)ops, name, node) {
        const int i = node_of(a, name);
        if (i < 0) {
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: fp8_amax_history: '%s' is not an fp8_tensor linear layer of "
                              "this model", what, name);
            break;
        }
        for (int k = 0; st == DW_OK && k < DW_AMAX_KINDS; k++) {
            uint32_t *s = h + (size_t)(a->slot[i] + k) * w;
            const json_t *o = json_object_get(node, KIND[k]), *ring = json_object_get(o, "amax");
            const json_t *pos = json_object_get(o, "pos");
            if (!json_is_array(ring) || json_array_size(ring) != (size_t)a->n || !json_is_integer(pos) ||
                json_integer_value(pos) < 0 || json_integer_value(pos) >= a->n) {
                st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: fp8_amax_history: %s.%s needs \"amax\" (%lld values), "
                                  "\"pos\" (0..%lld) and \"pending\"", what, name, KIND[k], (long long)a->n,
                                  (long long)a->n - 1);
                break;
            }
            s[DW_AMAX_POS] = (uint32_t)json_integer_value(pos);
            st = parse_amax(ctx, json_object_get(o, "pending"), what, name, &s[DW_AMAX_PENDING]);
            for (int64_t r = 0; st == DW_OK && r < a->n; r++) {
                st = parse_amax(ctx, json_array_get(ring, (size_t)r), what, name, &s[DW_AMAX_RING + r]);
                if (s[DW_AMAX_RING + r] > s[DW_AMAX_HIST]) s[DW_AMAX_HIST] = s[DW_AMAX_RING + r];
            }
        }
        if (st != DW_OK) break;
    }
    if (st == DW_OK) st = be->i->upload(be, a->state, h, state_bytes(a));
    free(h);
    return st;
}
