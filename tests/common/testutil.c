/* testutil.c — helpers shared by the tests (see testutil.h). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "capture/capture.h"
#include "comm/comm.h"
#include "core/error.h"
#include "compile/program.h"
#include "core/json.h"
#include "ir/ir.h"
#include "deepwell.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/engine.h"
#include "testutil.h"

uint64_t dw_test_seed(void) {
    static uint64_t seed = 0;
    static int have = 0;
    if (!have) {
        const char *env = getenv("DW_TEST_SEED");
        if (env && *env) {
            seed = strtoull(env, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
        }
        have = 1;
        fprintf(stderr, "test seed: DW_TEST_SEED=%llu\n", (unsigned long long)seed);
    }
    return seed;
}

void dw_test_rng_init(dw_test_rng *r, uint64_t seed) { r->s = seed; }

uint64_t dw_test_next(dw_test_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float dw_test_uniform(dw_test_rng *r, float lo, float hi) {
    double u = (double)(dw_test_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

float dw_test_normal(dw_test_rng *r) {
    double u1 = ((double)(dw_test_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (double)(dw_test_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

char *dw_test_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/dwtest.XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

void dw_test_rmtree(const char *path) {
    if (!path || !*path || strstr(path, "dwtest.") == NULL) return; /* only our own dirs */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

char *dw_test_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int dw_test_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

char *dw_test_model_dir(const char *dir, const char *config_json) {
    char *model = dw_test_path(dir, "model"), *cfg = dw_test_path(model, "config.json");
    const bool ok = mkdir(model, 0755) == 0 && dw_test_write(cfg, config_json, strlen(config_json)) == 0;
    free(cfg);
    if (ok) return model;
    free(model);
    return NULL;
}

int dw_test_train_fixture(dw_ctx **ctx, char **dir, char **model, int layers, int hidden, int ff) {
    char text[320];
    snprintf(text, sizeof text,
             "{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": %d, \"num_hidden_layers\": %d, "
             "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"intermediate_size\": %d, "
             "\"max_position_embeddings\": 32}",
             hidden, layers, ff);
    const char *dev = getenv("DW_TEST_DEVICE"); /* cuda: the same test on the CUDA engine (gpu-verify.sh) */
    dw_ctx_opts o = {.device = dev && !strcmp(dev, "cuda") ? DW_DEVICE_CUDA : DW_DEVICE_CPU};
    *ctx = NULL;
    *dir = dw_test_tmpdir();
    *model = *dir ? dw_test_model_dir(*dir, text) : NULL;
    return *model && dw_ctx_create(&o, ctx) == DW_OK ? 0 : -1;
}

void dw_test_train_fixture_close(dw_ctx *ctx, char *dir, char *model) {
    dw_ctx_free(ctx);
    if (dir) dw_test_rmtree(dir);
    free(dir);
    free(model);
}

dw_model *dw_test_open_model(dw_ctx *ctx, const char *model, uint64_t seed, const dw_policy *pol, int64_t batch,
                             int64_t seq) {
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = batch;
    mo.seq = seq;
    mo.weights = DW_WEIGHTS_RANDOM;
    mo.seed = seed;
    mo.policy = pol;
    dw_model *m = NULL;
    if (dw_model_open(ctx, model, &mo, &m) != DW_OK) fprintf(stderr, "dw_model_open %s: %s\n", model, dw_errmsg(ctx));
    return m;
}

int dw_test_param_index(dw_engine *e, const char *name) {
    for (int i = 0; i < dw_engine_param_count(e); i++)
        if (!strcmp(dw_engine_param_name(e, i), name)) return i;
    return -1;
}

dw_recipe dw_test_node_recipe(dw_engine *e, const char *name) {
    const dw_compiled *p = dw_engine_program(e);
    for (int i = 0; i < p->g->n_nodes; i++)
        if (!strcmp(p->g->nodes[i].name, name)) return p->node[i].bind.recipe;
    return DW_RECIPE_COUNT;
}

void *dw_test_json_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return fprintf(stderr, "cannot open %s\n", path), NULL;
    json_t *a = json_array();
    char buf[8192];
    while (a && fgets(buf, sizeof buf, f)) {
        json_error_t err;
        json_t *j = json_loads(buf, 0, &err);
        if (!j) fprintf(stderr, "%s: %s in %s", path, err.text, buf), json_decref(a), a = NULL;
        else json_array_append_new(a, j);
    }
    fclose(f);
    return a;
}

static const char *jstr(const json_t *j, const char *k) {
    const char *s = json_string_value(json_object_get(j, k));
    return s ? s : "";
}
static long long jint(const json_t *j, const char *k) { return (long long)json_integer_value(json_object_get(j, k)); }

/* Adds the counted kind's pairs at step to tot[2]; -1 when one of its layer's overflows, underflows
 * or elements differs from the sum of the layer's measured tensors t1 and t2 — the elements too,
 * so that a copy counted but never measured (or measured but never counted) is caught even when
 * it flushed and saturated nothing. */
static int counted_vs_measured(const json_t *qs, int64_t step, const char *kind, const char *t1, const char *t2,
                               long long tot[2], int *layers) {
    *layers = 0;
    for (size_t i = 0; i < json_array_size(qs); i++) {
        const json_t *c = json_array_get(qs, i);
        if (jint(c, "step") != step || strcmp(jstr(c, "counts"), kind)) continue;
        long long so = 0, su = 0, sn = 0;
        for (size_t k = 0; k < json_array_size(qs); k++) {
            const json_t *m = json_array_get(qs, k);
            if (jint(m, "step") != step || strcmp(jstr(m, "layer"), jstr(c, "layer"))) continue;
            if (strcmp(jstr(m, "tensor"), t1) && strcmp(jstr(m, "tensor"), t2)) continue;
            if (jint(m, "measured") != jint(m, "elements")) { /* the counters count every element */
                fprintf(stderr, "step %lld %s %s: measured on %lld of %lld elements (sampled: compare with "
                        "quant_check_elements 0 or above the tensor's size)\n", (long long)step, jstr(m, "layer"),
                        jstr(m, "tensor"), jint(m, "measured"), jint(m, "elements"));
                return -1;
            }
            so += jint(m, "overflow"), su += jint(m, "underflow"), sn += jint(m, "elements");
        }
        if (jint(c, "overflow") != so || jint(c, "underflow") != su || jint(c, "elements") != sn) {
            fprintf(stderr, "step %lld %s %s: counted %lld / %lld of %lld elements, measured %lld / %lld of %lld\n",
                    (long long)step, jstr(c, "layer"), kind, jint(c, "overflow"), jint(c, "underflow"),
                    jint(c, "elements"), so, su, sn);
            return -1;
        }
        tot[0] += so, tot[1] += su;
        ++*layers;
    }
    return 0;
}

int dw_test_quant_counts_check(const char *run_dir, int64_t step, int *layers, long long *w_under) {
    char *qp = dw_test_path(run_dir, "quant_stats.jsonl"), *mp = dw_test_path(run_dir, "metrics.jsonl");
    json_t *qs = dw_test_json_lines(qp), *met = dw_test_json_lines(mp);
    long long w[2] = {0}, dy[2] = {0}, x[2] = {0};
    int rc = qs && met ? 0 : -1, nw = 0, ndy = 0;
    if (rc == 0) rc = counted_vs_measured(qs, step, "w", "w", "w^T", w, &nw);
    if (rc == 0) rc = counted_vs_measured(qs, step, "dy", "dy", "dy^T", dy, &ndy);
    for (size_t i = 0; rc == 0 && i < json_array_size(qs); i++) { /* x: the step's forward, not the check's */
        const json_t *c = json_array_get(qs, i);
        if (jint(c, "step") == step && !strcmp(jstr(c, "counts"), "x")) x[0] += jint(c, "overflow"), x[1] += jint(c, "underflow");
    }
    const json_t *ml = NULL;
    for (size_t i = 0; rc == 0 && i < json_array_size(met); i++)
        if (jint(json_array_get(met, i), "step") == step) ml = json_array_get(met, i);
    if (rc == 0 && (!ml || nw != ndy || jint(ml, "quant_overflow") != w[0] + dy[0] + x[0] ||
                    jint(ml, "quant_underflow") != w[1] + dy[1] + x[1])) {
        fprintf(stderr, "step %lld: metrics.jsonl totals %lld / %lld, layers' sums %lld / %lld (%d, %d layers)\n",
                (long long)step, ml ? jint(ml, "quant_overflow") : -1, ml ? jint(ml, "quant_underflow") : -1,
                w[0] + dy[0] + x[0], w[1] + dy[1] + x[1], nw, ndy);
        rc = -1;
    }
    if (rc == 0)
        printf("step %lld: %d layers, counted w %lld/%lld, dy %lld/%lld, x %lld/%lld (overflow/underflow)\n",
               (long long)step, nw, w[0], w[1], dy[0], dy[1], x[0], x[1]);
    *layers = nw, *w_under = w[1];
    json_decref(qs), json_decref(met);
    free(qp), free(mp);
    return rc;
}

dw_ctx *dw_test_ctx;
dw_test_rng dw_test_group_rng;

int dw_test_group_setup(void **state) {
    (void)state;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    dw_test_rng_init(&dw_test_group_rng, dw_test_seed());
    return dw_ctx_create(&o, &dw_test_ctx) == DW_OK ? 0 : -1;
}

int dw_test_cpu_gpu_setup(dw_ctx **cpu, dw_ctx **gpu) {
    dw_ctx_opts c = {.device = DW_DEVICE_CPU}, g = {.device = DW_DEVICE_CUDA};
    *cpu = *gpu = NULL;
    if (dw_ctx_create(&c, cpu) != DW_OK) return -1;
    if (dw_ctx_create(&g, gpu) != DW_OK) {
        fprintf(stderr, "no CUDA device: %s\n", dw_errmsg(NULL));
        return -1;
    }
    return 0;
}

void dw_test_cpu_gpu_teardown(dw_ctx *cpu, dw_ctx *gpu) {
    dw_ctx_free(gpu);
    dw_ctx_free(cpu);
}

int dw_test_group_teardown(void **state) {
    (void)state;
    dw_ctx_free(dw_test_ctx);
    dw_test_ctx = NULL;
    return 0;
}

int64_t dw_test_rnd(int64_t lo, int64_t hi) {
    return lo + (int64_t)(dw_test_next(&dw_test_group_rng) % (uint64_t)(hi - lo + 1));
}

int64_t dw_test_differing(const void *a, const void *b, int64_t n, int64_t size) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp((const char *)a + i * size, (const char *)b + i * size, (size_t)size) != 0;
    return d;
}

/* ---- a model built by hand, the optimizer mirror -------------------------------------------- */
static int64_t rnd_in(dw_test_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(dw_test_next(r) % (uint64_t)(hi - lo + 1));
}

dw_graph *dw_test_small_graph(dw_ctx *ctx, const char *preset, int64_t batch, int64_t seq, dw_test_rng *r) {
    dw_model_config c;
    dw_graph *g = NULL;
    if (dw_model_config_load(ctx, preset, &c) != DW_OK) {
        fprintf(stderr, "dw_test_small_graph: %s\n", dw_errmsg(ctx));
        return NULL;
    }
    c.n_layers = rnd_in(r, 1, 2);
    c.vocab_size = rnd_in(r, 20, 60);
    c.d_ff = rnd_in(r, 8, 40);
    c.max_seq = 32;
    if (c.arch == DW_ARCH_GPT2) {
        c.n_heads = c.n_kv_heads = rnd_in(r, 1, 3);
        c.head_dim = 2 * rnd_in(r, 1, 4);
        c.d_model = c.n_heads * c.head_dim;
    } else {
        c.n_kv_heads = rnd_in(r, 1, 2);
        c.n_heads = c.n_kv_heads * rnd_in(r, 1, 2);
        c.head_dim = 2 * rnd_in(r, 1, 4);
        c.d_model = rnd_in(r, 6, 24);
    }
    c.tie_embeddings = rnd_in(r, 0, 1);
    if (dw_capture_config(ctx, &c, batch, seq, &g) != DW_OK)
        fprintf(stderr, "dw_test_small_graph: %s\n", dw_errmsg(ctx));
    return g;
}

dw_graph *dw_test_shared_graph(dw_ctx *ctx, int64_t batch, int64_t seq, dw_test_rng *r, int *node_gelu,
                               int *node_swiglu) {
    const int64_t C = 2 * rnd_in(r, 2, 6), V = rnd_in(r, 10, 30);
    dw_graph_model model = {.model_type = "custom", .n_blocks = 1, .vocab = V, .max_seq = seq};
    snprintf(model.summary, sizeof model.summary, "shared reads, width %lld, vocabulary %lld", (long long)C,
             (long long)V);
    dw_graph *g = dw_graph_new(&model, batch, seq);
    if (!g) return NULL;
    const int64_t bt[2] = {batch, seq}, vc[2] = {V, C}, cc[2] = {C, C}, c1[1] = {C};
    g->tokens = dw_graph_add_tensor(g, "tokens", DW_TENSOR_INPUT, DW_IR_I32, 2, bt);
    g->targets = dw_graph_add_tensor(g, "targets", DW_TENSOR_INPUT, DW_IR_I32, 2, bt);
    const int wte = dw_graph_add_tensor(g, "wte.weight", DW_TENSOR_PARAM, DW_IR_F32, 2, vc);
    const int w1 = dw_graph_add_tensor(g, "w1.weight", DW_TENSOR_PARAM, DW_IR_F32, 2, cc);
    const int gw = dw_graph_add_tensor(g, "norm.weight", DW_TENSOR_PARAM, DW_IR_F32, 1, c1);
    const int head = dw_graph_add_tensor(g, "head.weight", DW_TENSOR_PARAM, DW_IR_F32, 2, vc);
    const dw_ir_attrs norm = {.eps = 1e-5};
    int in[3] = {g->tokens, wte};
    const int x = dw_graph_add_node(ctx, g, DW_OP_EMBEDDING, "emb", in, 2, NULL, "x");
    in[0] = x;
    if (node_gelu) *node_gelu = g->n_nodes;
    const int h = dw_graph_add_node(ctx, g, DW_OP_GELU, "gelu", in, 1, NULL, "h");
    in[1] = x;
    if (node_swiglu) *node_swiglu = g->n_nodes;
    const int sw = dw_graph_add_node(ctx, g, DW_OP_SWIGLU, "swiglu", in, 2, NULL, "sw");
    in[1] = w1;
    const int y = dw_graph_add_node(ctx, g, DW_OP_LINEAR, "lin", in, 2, NULL, "y");
    in[0] = h, in[1] = sw;
    const int a = dw_graph_add_node(ctx, g, DW_OP_ADD, "add0", in, 2, NULL, "a");
    in[0] = a, in[1] = y;
    const int s = dw_graph_add_node(ctx, g, DW_OP_ADD, "add1", in, 2, NULL, "s");
    in[0] = s, in[1] = gw;
    const int z = dw_graph_add_node(ctx, g, DW_OP_RMSNORM, "norm", in, 2, &norm, "z");
    in[0] = z, in[1] = head;
    g->logits = dw_graph_add_node(ctx, g, DW_OP_LINEAR, "head", in, 2, NULL, "logits");
    in[0] = g->logits, in[1] = g->targets;
    g->loss = dw_graph_add_node(ctx, g, DW_OP_CROSS_ENTROPY, "loss", in, 2, NULL, "loss");
    if (x < 0 || h < 0 || sw < 0 || y < 0 || a < 0 || s < 0 || z < 0 || g->logits < 0 || g->loss < 0 ||
        dw_graph_verify(ctx, g) != DW_OK) {
        fprintf(stderr, "dw_test_shared_graph: %s\n", dw_errmsg(ctx));
        dw_graph_free(g);
        return NULL;
    }
    return g;
}

dw_graph *dw_test_router_graph(dw_ctx *ctx, int64_t batch, int64_t seq, dw_test_rng *r, int score, bool renorm,
                               bool gemm_sizes, int *node_router) {
    int64_t C = 2 * rnd_in(r, 2, 6), V = rnd_in(r, 10, 30), E = rnd_in(r, 3, 9), K = rnd_in(r, 1, E);
    if (gemm_sizes) C = 8 * rnd_in(r, 1, 3), V = 8 * rnd_in(r, 2, 5), E = 8 * rnd_in(r, 2, 3), K = 8;
    dw_graph_model model = {.model_type = "custom", .n_blocks = 1, .vocab = V, .max_seq = seq};
    snprintf(model.summary, sizeof model.summary, "router: width %lld, %lld experts, top %lld", (long long)C,
             (long long)E, (long long)K);
    dw_graph *g = dw_graph_new(&model, batch, seq);
    if (!g) return NULL;
    const int64_t bt[2] = {batch, seq}, vc[2] = {V, C}, ec[2] = {E, C}, ck[2] = {C, K};
    g->tokens = dw_graph_add_tensor(g, "tokens", DW_TENSOR_INPUT, DW_IR_I32, 2, bt);
    g->targets = dw_graph_add_tensor(g, "targets", DW_TENSOR_INPUT, DW_IR_I32, 2, bt);
    const int wte = dw_graph_add_tensor(g, "wte.weight", DW_TENSOR_PARAM, DW_IR_F32, 2, vc);
    const int gate = dw_graph_add_tensor(g, "gate.weight", DW_TENSOR_PARAM, DW_IR_F32, 2, ec);
    const int up = dw_graph_add_tensor(g, "up.weight", DW_TENSOR_PARAM, DW_IR_F32, 2, ck);
    const int head = dw_graph_add_tensor(g, "head.weight", DW_TENSOR_PARAM, DW_IR_F32, 2, vc);
    const dw_ir_attrs ra = {.top_k = K, .score = score, .norm_topk = renorm};
    int in[2] = {g->tokens, wte}, ro[2] = {-1, -1};
    const int x = dw_graph_add_node(ctx, g, DW_OP_EMBEDDING, "emb", in, 2, NULL, "x");
    in[0] = x, in[1] = gate;
    const int z = dw_graph_add_node(ctx, g, DW_OP_LINEAR, "gate", in, 2, NULL, "z");
    if (node_router) *node_router = g->n_nodes;
    in[0] = z;
    const char *const names[2] = {"w", "experts"};
    dw_status st = z < 0 ? DW_ERR_INVALID : dw_graph_add_node_outs(ctx, g, DW_OP_MOE_ROUTER, "router", in, 1, &ra,
                                                                    names, ro);
    in[0] = ro[0], in[1] = up;
    const int y = st == DW_OK ? dw_graph_add_node(ctx, g, DW_OP_LINEAR, "up", in, 2, NULL, "y") : -1;
    in[0] = x, in[1] = y;
    const int s = y < 0 ? -1 : dw_graph_add_node(ctx, g, DW_OP_ADD, "add", in, 2, NULL, "s");
    in[0] = s, in[1] = head;
    g->logits = s < 0 ? -1 : dw_graph_add_node(ctx, g, DW_OP_LINEAR, "head", in, 2, NULL, "logits");
    in[0] = g->logits, in[1] = g->targets;
    g->loss = g->logits < 0 ? -1 : dw_graph_add_node(ctx, g, DW_OP_CROSS_ENTROPY, "loss", in, 2, NULL, "loss");
    if (x < 0 || g->loss < 0 || dw_graph_verify(ctx, g) != DW_OK) {
        fprintf(stderr, "dw_test_router_graph: %s\n", dw_errmsg(ctx));
        dw_graph_free(g);
        return NULL;
    }
    return g;
}

dw_graph *dw_test_moe_graph(dw_ctx *ctx, int64_t batch, int64_t seq, dw_test_rng *r) {
    const int64_t C = 2 * rnd_in(r, 2, 6), F = rnd_in(r, 2, 9), E = rnd_in(r, 2, 6), K = rnd_in(r, 1, E);
    const int64_t V = rnd_in(r, 10, 30);
    dw_graph_model model = {.model_type = "custom", .n_blocks = 1, .vocab = V, .max_seq = seq};
    snprintf(model.summary, sizeof model.summary, "moe: width %lld, %lld experts of %lld, top %lld", (long long)C,
             (long long)E, (long long)F, (long long)K);
    dw_graph *g = dw_graph_new(&model, batch, seq);
    if (!g) return NULL;
    const int64_t bt[2] = {batch, seq}, vc[2] = {V, C}, ec[2] = {E, C}, efc[3] = {E, F, C}, ecf[3] = {E, C, F};
    g->tokens = dw_graph_add_tensor(g, "tokens", DW_TENSOR_INPUT, DW_IR_I32, 2, bt);
    g->targets = dw_graph_add_tensor(g, "targets", DW_TENSOR_INPUT, DW_IR_I32, 2, bt);
    const int wte = dw_graph_add_tensor(g, "wte.weight", DW_TENSOR_PARAM, DW_IR_F32, 2, vc);
    const int gate = dw_graph_add_tensor(g, "gate.weight", DW_TENSOR_PARAM, DW_IR_F32, 2, ec);
    const int w1 = dw_graph_add_tensor(g, "experts.w1", DW_TENSOR_PARAM, DW_IR_F32, 3, efc);
    const int w3 = dw_graph_add_tensor(g, "experts.w3", DW_TENSOR_PARAM, DW_IR_F32, 3, efc);
    const int w2 = dw_graph_add_tensor(g, "experts.w2", DW_TENSOR_PARAM, DW_IR_F32, 3, ecf);
    const int head = dw_graph_add_tensor(g, "head.weight", DW_TENSOR_PARAM, DW_IR_F32, 2, vc);
    const dw_ir_attrs ra = {.top_k = K, .score = 0, .norm_topk = true}, da = {.experts = E};
    int in[3] = {g->tokens, wte}, ro[2] = {-1, -1}, dout[3] = {-1, -1, -1};
    dw_status st = DW_OK;
    const int x = dw_graph_add_node(ctx, g, DW_OP_EMBEDDING, "emb", in, 2, NULL, "x");
    in[0] = x, in[1] = gate;
    const int z = x < 0 ? -1 : dw_graph_add_node(ctx, g, DW_OP_LINEAR, "gate", in, 2, NULL, "z");
    const char *const rn[2] = {"w", "experts"}, *const dn[3] = {"xs", "offsets", "rows"};
    in[0] = z;
    if (z < 0 || (st = dw_graph_add_node_outs(ctx, g, DW_OP_MOE_ROUTER, "router", in, 1, &ra, rn, ro)) != DW_OK) goto fail;
    in[0] = x, in[1] = ro[1];
    if ((st = dw_graph_add_node_outs(ctx, g, DW_OP_MOE_DISPATCH, "dispatch", in, 2, &da, dn, dout)) != DW_OK) goto fail;
    in[0] = dout[0], in[1] = w1, in[2] = dout[1];
    const int gg = dw_graph_add_node(ctx, g, DW_OP_MOE_LINEAR, "experts.w1", in, 3, NULL, "g");
    in[1] = w3;
    const int u = dw_graph_add_node(ctx, g, DW_OP_MOE_LINEAR, "experts.w3", in, 3, NULL, "u");
    in[0] = gg, in[1] = u;
    const int a = gg < 0 || u < 0 ? -1 : dw_graph_add_node(ctx, g, DW_OP_SWIGLU, "swiglu", in, 2, NULL, "a");
    in[0] = a, in[1] = w2, in[2] = dout[1];
    const int y = a < 0 ? -1 : dw_graph_add_node(ctx, g, DW_OP_MOE_LINEAR, "experts.w2", in, 3, NULL, "y");
    in[0] = y, in[1] = ro[0], in[2] = dout[2];
    const int o = y < 0 ? -1 : dw_graph_add_node(ctx, g, DW_OP_MOE_COMBINE, "combine", in, 3, NULL, "o");
    in[0] = x, in[1] = o;
    const int s = o < 0 ? -1 : dw_graph_add_node(ctx, g, DW_OP_ADD, "add", in, 2, NULL, "s");
    in[0] = s, in[1] = head;
    g->logits = s < 0 ? -1 : dw_graph_add_node(ctx, g, DW_OP_LINEAR, "head", in, 2, NULL, "logits");
    in[0] = g->logits, in[1] = g->targets;
    g->loss = g->logits < 0 ? -1 : dw_graph_add_node(ctx, g, DW_OP_CROSS_ENTROPY, "loss", in, 2, NULL, "loss");
    if (g->loss >= 0 && dw_graph_verify(ctx, g) == DW_OK) return g;
fail:
    fprintf(stderr, "dw_test_moe_graph: %s\n", dw_errmsg(ctx));
    dw_graph_free(g);
    return NULL;
}

int64_t dw_test_param_numel(dw_engine *e, int i) {
    int64_t s[4], n = 1;
    const int nd = dw_engine_param_shape(e, i, s);
    for (int d = 0; d < nd; d++) n *= s[d];
    return n;
}

void dw_test_random_params(dw_engine *e, dw_test_rng *r, float sd, const char *wide, float sd_wide) {
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        const int64_t n = dw_test_param_numel(e, i);
        const float s = wide && !strcmp(dw_engine_param_name(e, i), wide) ? sd_wide : sd;
        float *v = malloc((size_t)n * sizeof *v);
        if (!v) abort();
        for (int64_t k = 0; k < n; k++) v[k] = s * dw_test_normal(r);
        if (dw_engine_param_write(e, i, v) != DW_OK) abort();
        free(v);
    }
}

float *dw_test_param_read(dw_engine *e, const char *name, int *index) {
    for (int i = 0; i < dw_engine_param_count(e); i++)
        if (!strcmp(dw_engine_param_name(e, i), name)) {
            float *v = malloc((size_t)dw_test_param_numel(e, i) * sizeof *v);
            if (!v || dw_engine_param_read(e, i, v) != DW_OK) abort();
            if (index) *index = i;
            return v;
        }
    return NULL;
}

float *dw_test_act_grad_read(const dw_engine *e, int t, int64_t n) {
    const dw_compiled *p = e->p;
    if (p->tensor[t].grad_off < 0) abort();
    const char *src = e->x->act + p->tensor[t].grad_off;
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    if (!out) abort();
    for (int64_t i = 0; i < n; i++)
        out[i] = p->act_size == 2 ? dw_decode_bf16(((const uint16_t *)src)[i]) : ((const float *)src)[i];
    return out;
}

int64_t dw_test_fd_param(dw_engine *e, const char *name, const int32_t *x, const int32_t *y, int64_t B, int64_t T,
                         int watch, float h, double atol, double rel, double *gmax, int64_t *compared) {
    int p = -1;
    float *v = dw_test_param_read(e, name, &p);
    if (!v) return -1;
    const int64_t n = dw_test_param_numel(e, p);
    const int64_t nw = watch >= 0 ? dw_ir_numel(&dw_engine_graph(e)->tensors[watch]) : 1;
    float *gr = malloc((size_t)n * sizeof *gr), *w0 = calloc((size_t)nw, sizeof *w0), *w1 = calloc((size_t)nw, sizeof *w1);
    if (!gr || !w0 || !w1) abort();
    int64_t bad = 0;
    double loss, lp = 0, lm = 0;
    *compared = 0, *gmax = 0;
    if (dw_engine_grad_read(e, p, gr) != DW_OK || dw_engine_forward(e, x, y, B, T, NULL, &loss) != DW_OK ||
        (watch >= 0 && dw_engine_read_value(e, watch, w0) != DW_OK))
        bad = -1;
    for (int64_t i = 0; bad >= 0 && i < n; i++) *gmax = fmax(*gmax, fabs(gr[i]));
    for (int64_t i = 0; bad >= 0 && i < n; i++) {
        const float v0 = v[i];
        bool same = true;
        for (int sgn = 1; bad >= 0 && sgn >= -1; sgn -= 2) {
            v[i] = v0 + (float)sgn * h;
            if (dw_engine_param_write(e, p, v) != DW_OK || dw_engine_forward(e, x, y, B, T, NULL, sgn > 0 ? &lp : &lm) != DW_OK ||
                (watch >= 0 && dw_engine_read_value(e, watch, w1) != DW_OK))
                bad = -1;
            else if (watch >= 0) same &= !memcmp(w0, w1, (size_t)nw * sizeof *w0);
        }
        v[i] = v0;
        if (bad < 0 || !same) continue;
        ++*compared;
        const double fd = (lp - lm) / (2.0 * (double)h);
        if (fabs(fd - gr[i]) > atol + rel * *gmax && bad++ == 0)
            fprintf(stderr, "%s[%lld]: engine %.6g, differences %.6g (max |grad| %.3g)\n", name, (long long)i, gr[i], fd,
                    *gmax);
    }
    if (dw_engine_param_write(e, p, v) != DW_OK) bad = -1;
    free(v), free(gr), free(w0), free(w1);
    return bad;
}

void dw_test_random_tokens(int32_t *t, int64_t n, int64_t V, dw_test_rng *r) {
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(dw_test_next(r) % (uint64_t)V);
}

dw_status dw_test_train_fixed(dw_engine *e, const int32_t *x, const int32_t *y, int64_t B, int64_t T, int steps,
                              double lr, double *first, double *last) {
    dw_adamw_opts o;
    dw_adamw_opts_init(&o, sizeof o);
    o.lr = lr;
    for (int s = 1; s <= steps; s++) {
        double loss = 0, norm = 0;
        DW_TRY(dw_engine_zero_grad(e));
        DW_TRY(dw_engine_forward_backward(e, x, y, B, T, 1.0, &loss));
        DW_TRY(dw_engine_step(e, &o, s, &norm));
        if (!isfinite(loss) || !isfinite(norm)) return DW_ERR_NUMERIC;
        if (s == 1) *first = loss;
        *last = loss;
    }
    return DW_OK;
}

dw_status dw_test_model_train_random(dw_test_model *m, int64_t B, int64_t T, int steps, double lr, dw_test_rng *r,
                                     double *first, double *last) {
    DW_TRY(dw_engine_init_weights(m->e, dw_test_next(r)));
    int32_t x[4096], y[4096];
    if (B * T > 4096) return DW_ERR_INVALID;
    dw_test_random_tokens(x, B * T, dw_graph_vocab(m->g), r);
    dw_test_random_tokens(y, B * T, dw_graph_vocab(m->g), r);
    return dw_test_train_fixed(m->e, x, y, B, T, steps, lr, first, last);
}

/* The routing counters of e (layers x (2 + experts) int64) in a new array, their count in *n. */
static int64_t *moe_counts(dw_engine *e, int64_t *n) {
    int64_t L = 0, E = 0;
    if (dw_engine_moe_counts(e, &L, &E, NULL) != DW_OK) return NULL;
    *n = L * (2 + E);
    int64_t *c = calloc((size_t)(*n ? *n : 1), sizeof *c);
    if (c && *n && dw_engine_moe_counts(e, NULL, NULL, c) != DW_OK) free(c), c = NULL;
    return c;
}

int dw_test_same_training(dw_test_model *a, dw_test_model *b, int64_t B, int64_t T, int steps, double lr,
                          uint64_t seed, const char *what, double *first, double *last) {
    dw_test_rng ra, rb;
    dw_test_rng_init(&ra, seed);
    dw_test_rng_init(&rb, seed);
    double b0, b1;
    if (dw_test_model_train_random(a, B, T, steps, lr, &ra, first, last) != DW_OK ||
        dw_test_model_train_random(b, B, T, steps, lr, &rb, &b0, &b1) != DW_OK)
        return -1;
    if (*first != b0 || *last != b1) {
        fprintf(stderr, "%s: losses %.17g %.17g, then %.17g %.17g\n", what, *first, *last, b0, b1);
        return 1;
    }
    for (int i = 0; i < a->c->n_params; i++) {
        const char *name = a->g->tensors[a->c->param_tensor[i]].name;
        float *pa = dw_test_param_read(a->e, name, NULL), *pb = dw_test_param_read(b->e, name, NULL);
        const bool same = pa && pb && !memcmp(pa, pb, (size_t)dw_test_param_numel(a->e, i) * sizeof *pa);
        free(pa), free(pb);
        if (!same) {
            fprintf(stderr, "%s: parameter %s differs after %d steps\n", what, name, steps);
            return 1;
        }
    }
    int64_t na = 0, nb = 0, *ca = moe_counts(a->e, &na), *cb = moe_counts(b->e, &nb);
    const int rc = !ca || !cb ? -1 : na != nb || memcmp(ca, cb, (size_t)na * sizeof *ca) || (na && !ca[0]) ? 1 : 0;
    if (rc > 0) fprintf(stderr, "%s: the MoE routing counters differ or counted nothing\n", what);
    free(ca), free(cb);
    return rc;
}

dw_graph *dw_test_same_graph(dw_ctx *ctx, const dw_graph *g, int64_t batch, int64_t seq) {
    dw_graph *h = NULL;
    char *dir = dw_test_tmpdir(), *cfg = dir ? dw_test_path(dir, "config.json") : NULL;
    const char *text = dw_graph_config_json(g);
    if (cfg && text && dw_test_write(cfg, text, strlen(text)) == 0 &&
        dw_capture_hf_shape(ctx, dir, batch ? batch : dw_graph_batch(g), seq ? seq : dw_graph_seq(g), &h) != DW_OK)
        fprintf(stderr, "dw_test_same_graph: %s\n", dw_errmsg(ctx));
    dw_test_rmtree(dir);
    free(cfg), free(dir);
    return h;
}

void dw_test_model_free(dw_test_model *m) {
    dw_engine_free(m->e);
    dw_compiled_free(m->c);
    dw_policy_free(m->pol);
    dw_graph_free(m->g);
    memset(m, 0, sizeof *m);
}

dw_status dw_test_model_build(dw_ctx *ctx, dw_graph *g, const char *precision, dw_device_kind target,
                              dw_test_model *m) {
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.device = target;
    if (target == DW_DEVICE_CUDA) o.sm = 90;
    return dw_test_model_build_opts(ctx, g, precision, &o, m);
}

dw_status dw_test_policy(dw_ctx *ctx, const char *spec, bool fallback_safe, dw_policy **out) {
    *out = NULL;
    if (spec[0] != '{') return dw_policy_from_precision(ctx, spec, fallback_safe, out);
    char *dir = dw_test_tmpdir(), *path = dir ? dw_test_path(dir, "policy.json") : NULL;
    dw_status s = path && dw_test_write(path, spec, strlen(spec)) == 0 ? dw_policy_load(ctx, path, out) : DW_ERR_IO;
    if (s == DW_OK && fallback_safe) s = dw_policy_set_fallback(ctx, *out, "safe");
    if (s != DW_OK) dw_policy_free(*out), *out = NULL;
    if (dir) dw_test_rmtree(dir);
    free(path), free(dir);
    return s;
}

dw_status dw_test_model_build_opts(dw_ctx *ctx, dw_graph *g, const char *precision, const dw_compile_opts *o,
                                   dw_test_model *m) {
    memset(m, 0, sizeof *m);
    m->g = g;
    dw_status s = g ? DW_OK : DW_ERR_INVALID;
    if (s == DW_OK && precision) s = dw_test_policy(ctx, precision, false, &m->pol);
    if (s == DW_OK) s = dw_compile(ctx, g, NULL, m->pol, o, &m->c);
    if (s == DW_OK) s = dw_engine_create(ctx, m->c, NULL, &m->e);
    if (s != DW_OK) {
        fprintf(stderr, "dw_test_model_build (%s): %s\n", precision ? precision : "fp32", dw_errmsg(ctx));
        dw_test_model_free(m);
    }
    return s;
}

struct dw_test_optref {
    int n;
    int64_t *numel;
    float **val[3]; /* values, m, v per parameter */
};

void dw_test_optref_free(dw_test_optref *r) {
    if (!r) return;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; r->val[k] && i < r->n; i++) free(r->val[k][i]);
        free(r->val[k]);
    }
    free(r->numel);
    free(r);
}

dw_test_optref *dw_test_optref_create(dw_engine *e) {
    dw_test_optref *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->n = dw_engine_param_count(e);
    r->numel = calloc((size_t)r->n + 1, sizeof *r->numel);
    for (int k = 0; k < 3; k++) r->val[k] = calloc((size_t)r->n + 1, sizeof *r->val[k]);
    bool ok = r->numel && r->val[0] && r->val[1] && r->val[2];
    for (int i = 0; ok && i < r->n; i++) {
        int64_t shape[4];
        int nd = dw_engine_param_shape(e, i, shape);
        r->numel[i] = 1;
        for (int d = 0; d < nd; d++) r->numel[i] *= shape[d];
        for (int k = 0; k < 3 && ok; k++) ok = (r->val[k][i] = calloc((size_t)r->numel[i], sizeof(float))) != NULL;
        ok = ok && dw_engine_param_read(e, i, r->val[0][i]) == DW_OK;
    }
    if (!ok) {
        dw_test_optref_free(r);
        return NULL;
    }
    return r;
}

double dw_test_optref_step(dw_test_optref *r, dw_engine *e, const dw_adamw_opts *o, int64_t step) {
    const dw_compiled *c = dw_engine_program(e);
    const dw_graph *g = dw_engine_graph(e);
    /* the engine's gradient pool: parameters at their offsets, zeros between them */
    float *pool = calloc((size_t)c->param_floats, sizeof(float));
    if (!pool) return NAN;
    for (int i = 0; i < r->n; i++)
        if (dw_engine_grad_read(e, i, pool + c->param_off[i]) != DW_OK) {
            free(pool);
            return NAN;
        }
    const double norm = sqrt(dw_cpu_sumsq(pool, c->param_floats));
    const dw_adamw_args a = {.lr = o->lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
                             .weight_decay = o->weight_decay, .c1 = 1.0 - pow(o->beta1, (double)step),
                             .c2 = 1.0 - pow(o->beta2, (double)step), .max_norm = o->clip};
    for (int i = 0; i < r->n; i++) {
        const bool decay = g->tensors[c->param_tensor[i]].decay;
        dw_cpu_adamw(r->val[0][i], pool + c->param_off[i], r->val[1][i], r->val[2][i], r->numel[i],
                     decay ? r->numel[i] : 0, norm, &a);
    }
    free(pool);
    return norm;
}

const float *dw_test_optref_get(const dw_test_optref *r, int i, int what) { return r->val[what][i]; }

bool dw_test_plan_overlap(const dw_compiled *c, int *a, int *b, int *t) {
    for (int i = 0; i < c->n_items; i++)
        for (int j = i + 1; j < c->n_items; j++) {
            const dw_mem_item *x = &c->items[i], *y = &c->items[j];
            if (x->offset + x->size <= y->offset || y->offset + y->size <= x->offset) continue;
            for (int k = 0; k < c->n_times; k++)
                if (dw_mem_live_at(x, k) && dw_mem_live_at(y, k)) {
                    *a = i, *b = j, *t = k;
                    return true;
                }
        }
    return false;
}

int dw_test_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    const bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
                    getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    if (fd >= 0) close(fd);
    return ok ? ntohs(a.sin_port) : -1;
}

dw_comm *dw_test_mpi_world(dw_ctx *ctx, int world, const char *test, uint64_t *seed) {
    dw_comm *c = NULL;
    if (dw_comm_world(ctx, &c) != DW_OK || c->world != world || strcmp(c->i->name, "mpi") != 0) {
        fprintf(stderr, "%s --mpi: needs mpirun -np %d (%s)\n", test, world, c ? c->i->name : dw_errmsg(ctx));
        return NULL;
    }
    *seed = dw_test_seed();
    if (dw_comm_broadcast(ctx, c, seed, 8, DW_COMM_BYTE, 0) != DW_OK) {
        fprintf(stderr, "%s --mpi: the seed's broadcast: %s\n", test, dw_errmsg(ctx));
        return NULL;
    }
    return c;
}
