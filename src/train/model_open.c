/* model_open.c — dw_model (deepwell.h): the pipeline in one call for tools and quick starts. A
 * checkpoint or run directory (validated by train/ckpt.c), a model directory, a config.json or a
 * preset -> the graph at batch x seq -> a program for the context's device (FP32 on the CPU, BF16
 * on CUDA unless a policy says otherwise) -> an engine with the weights of `what`, of another
 * source (opts.weights_from: fine-tuning from a model directory or checkpoint) or from a seed.
 * A checkpoint's MoE selection bias (train/moe_bias.h) goes on its engine with its weights. A model
 * directory's text goes through its tokenizer.json when it has one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "capture/capture.h"
#include "core/error.h"
#include "train/ckpt.h"
#include "train/moe_bias.h"
#include "train/sample.h"

struct dw_model {
    dw_graph *g;
    dw_compiled *c;
    dw_policy *own_policy; /* the BF16 policy made for a CUDA context without one */
    dw_engine *e;
    bool trained;
    char *source; /* where the weights came from (NULL: seed or zero) */
    dw_tokenizer tok;
    char *tok_path; /* a model directory's tokenizer.json (wins over tok), else NULL */
};

void dw_model_opts_init(dw_model_opts *o, size_t size) {
    dw_model_opts d = {.size = sizeof d, .batch = 1, .seq = 0, .policy = NULL, .weights = DW_WEIGHTS_AUTO,
                       .seed = 1337};
    memset(o, 0, size);
    memcpy(o, &d, size < sizeof d ? size : sizeof d);
    o->size = size;
}

void dw_model_free(dw_model *m) {
    if (!m) return;
    dw_engine_free(m->e);
    dw_compiled_free(m->c);
    dw_policy_free(m->own_policy);
    dw_graph_free(m->g);
    free(m->source);
    free(m->tok_path);
    free(m);
}

dw_engine *dw_model_engine(const dw_model *m) { return m->e; }
const dw_graph *dw_model_graph(const dw_model *m) { return m->g; }
bool dw_model_trained(const dw_model *m) { return m->trained; }
const char *dw_model_weights_source(const dw_model *m) { return m->source; }
const char *dw_model_tokenizer(const dw_model *m) { return m->tok_path ? m->tok_path : dw_tokenizer_name(m->tok); }

static bool has_file(const char *dir, const char *name) {
    char *p = dw_path_join(dir, name);
    bool ok = p && access(p, F_OK) == 0;
    free(p);
    return ok;
}

/* Whether dir holds Hugging Face weights (model.safetensors or a sharded index). */
static bool has_weights(const char *dir) {
    return has_file(dir, "model.safetensors") || has_file(dir, "model.safetensors.index.json");
}

/* opts.weights_from resolved into what dw_engine_load_weights reads (*path, free()): a checkpoint
 * or run directory (validated; its newest checkpoint), a directory with weights, or a file. */
static dw_status weights_source(dw_ctx *ctx, const char *from, char **path) {
    *path = NULL;
    struct stat sb;
    if (!*from || stat(from, &sb) != 0)
        return dw_set_error(ctx, DW_ERR_IO, "weights '%s': no such file or directory", from);
    const bool dir = S_ISDIR(sb.st_mode);
    if (dir && (has_file(from, "state.json") || has_file(from, "latest"))) {
        dw_ckpt_state state;
        return dw_ckpt_open(ctx, from, path, &state);
    }
    if (dir && !has_weights(from))
        return dw_set_error(ctx, DW_ERR_IO, "weights '%s': a directory without model.safetensors or "
                            "model.safetensors.index.json (nor a checkpoint's state.json)", from);
    *path = strdup(from);
    return *path ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
}

dw_status dw_model_open(dw_ctx *ctx, const char *what, const dw_model_opts *opts, dw_model **out) {
    *out = NULL;
    if (!what || !*what) return dw_set_error(ctx, DW_ERR_INVALID, "no model given");
    dw_model_opts o;
    dw_model_opts_init(&o, sizeof o);
    if (opts) memcpy(&o, opts, opts->size < sizeof o ? opts->size : sizeof o);
    if (o.batch < 1 || o.seq < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "model: batch %lld, seq %lld out of range", (long long)o.batch,
                            (long long)o.seq);
    struct stat sb;
    const bool is_dir = stat(what, &sb) == 0 && S_ISDIR(sb.st_mode);
    const bool is_ckpt = is_dir && (has_file(what, "state.json") || has_file(what, "latest"));
    char *cdir = NULL;
    dw_ckpt_state state;
    if (is_ckpt) DW_TRY(dw_ckpt_open(ctx, what, &cdir, &state));
    const char *dir = is_ckpt ? cdir : what;
    dw_model *m = calloc(1, sizeof *m);
    dw_status st = m ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    dw_capture_opts co;
    dw_capture_opts_init(&co, sizeof co);
    co.moe_drop = o.moe_drop;
    if (st == DW_OK) st = dw_capture(ctx, dir, &co, &m->g); /* to learn the model's positions */
    if (st == DW_OK) {
        co.batch = o.batch, co.seq = o.seq ? o.seq : m->g->model.max_seq < 1024 ? m->g->model.max_seq : 1024;
        m->tok = m->g->model.vocab == 256 ? DW_TOK_BYTES : DW_TOK_IDS;
        dw_graph_free(m->g);
        m->g = NULL;
        st = dw_capture(ctx, dir, &co, &m->g);
    }
    const dw_policy *pol = o.policy;
    if (st == DW_OK && !pol && dw_ctx_device(ctx) == DW_DEVICE_CUDA) {
        st = dw_policy_from_precision(ctx, "bf16", false, &m->own_policy);
        pol = m->own_policy;
    }
    dw_compile_opts cpo;
    dw_compile_opts_init(&cpo, sizeof cpo);
    cpo.recompute = o.recompute, cpo.recompute_blocks = o.recompute_blocks;
    cpo.fused_head = o.fused_head;
    if (o.grad_arena) dw_compile_opts_train_arenas(&cpo, 1, o.zero); /* ZeRO-2/3: the pools */
    if (st == DW_OK) st = dw_compile(ctx, m->g, NULL, pol, &cpo, &m->c);
    dw_engine_opts eo;
    dw_engine_opts_init(&eo, sizeof eo);
    eo.zero = o.zero; /* ZeRO on several ranks: the rank's shards only, from the start */
    if (st == DW_OK) st = dw_engine_create(ctx, m->c, &eo, &m->e);
    const bool file = is_dir && has_weights(dir);
    const bool other = o.weights_from && (o.weights == DW_WEIGHTS_AUTO || o.weights == DW_WEIGHTS_FILE);
    if (st == DW_OK && o.weights == DW_WEIGHTS_FILE && !file && !other)
        st = dw_set_error(ctx, DW_ERR_IO, "%s: no weights (model.safetensors or model.safetensors.index.json)", dir);
    if (st == DW_OK && o.weights == DW_WEIGHTS_NONE) {
        /* left at zero for the caller */
    } else if (st == DW_OK && (other || (file && o.weights != DW_WEIGHTS_RANDOM))) {
        if (other) st = weights_source(ctx, o.weights_from, &m->source);
        else if (!(m->source = strdup(dir))) st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        if (st == DW_OK) st = dw_engine_load_weights(m->e, m->source);
        m->trained = st == DW_OK;
    } else if (st == DW_OK) {
        st = dw_engine_init_weights(m->e, o.seed);
    }
    if (st == DW_OK && is_ckpt && m->trained && !other) { /* the routers' selection bias it trained with */
        dw_moe_bias b;
        st = dw_moe_bias_init(ctx, m->e, 0, cdir, &b);
        dw_moe_bias_free(&b);
    }
    if (st == DW_OK && is_ckpt && !dw_tokenizer_parse(state.tokenizer, &m->tok))
        st = dw_set_error(ctx, DW_ERR_FORMAT, "%s/state.json: unknown tokenizer '%s'", cdir, state.tokenizer);
    if (st == DW_OK && is_dir && (is_ckpt ? state.has_tokenizer : has_file(dir, DW_CKPT_TOKENIZER)) &&
        !(m->tok_path = dw_path_join(dir, DW_CKPT_TOKENIZER))) /* a checkpoint's: dw_run_set_tokenizer */
        st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    free(cdir);
    if (st != DW_OK) {
        dw_model_free(m);
        return st;
    }
    *out = m;
    return DW_OK;
}
