/* trainer.c — dw_train: the training loop over an engine (any backend). Data; then per optimizer
 * step: G/(B N) micro-batches of forward+backward on each of N ranks (gradients accumulated with
 * scale B N/G, then averaged over the ranks: train/dp.c), the AdamW step (global-norm clipping,
 * the scheduled learning rate), metrics, validation, samples and checkpoints. Resuming restores
 * weights, moments, step, data position and RNG exactly, so on the CPU the losses continue bit
 * for bit. With several ranks, rank 0 alone writes (metrics, checkpoints but for each rank's
 * shard of the moments, the run lock), samples and reports progress; every decision that changes what the ranks do next (stop, checkpoint) is
 * agreed by all. Not the CLI (tools/cmd_train.c). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "compile/program.h"
#include "runtime/engine.h"
#include "runtime/profile.h"
#if DW_HAVE_CUDA
#include "kernels/cuda/attn_packed.h"
#endif
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"
#include "io/tokenizer.h"
#include "train/ckpt.h"
#include "train/ckpt_shard.h"
#include "train/ckpt_shard_io.h"
#include "train/data.h"
#include "train/data_callback.h"
#include "train/dp.h"
#include "train/ep.h"
#include "train/guard.h"
#include "train/metrics.h"
#include "train/moe_bias.h"
#include "train/moe_routing.h"
#include "train/optim.h"
#include "train/resume_check.h"
#include "train/run_lock.h"
#include "train/sample.h"
#include "train/spike.h"
#include "train/amax_state.h"

_Static_assert((int)DW_LR_COSINE == (int)DW_SCHED_COSINE && (int)DW_LR_LINEAR == (int)DW_SCHED_LINEAR &&
                   (int)DW_LR_CONSTANT == (int)DW_SCHED_CONSTANT,
               "public and private schedule enums agree");

static volatile sig_atomic_t stop_flag;
void dw_train_request_stop(void) { stop_flag = 1; }
bool dw_train_stop_requested(void) { return stop_flag != 0; }

void dw_train_opts_init(dw_train_opts *opts, size_t size) {
    dw_train_opts d, *o = &d;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->steps = 100;
    o->batch = 8;
    o->seq = 64;
    o->global_batch = 8;
    o->lr = 1e-3;
    o->min_lr = 1e-4;
    o->warmup = 10;
    o->schedule = DW_LR_COSINE;
    o->weight_decay = 0.1;
    o->clip = 1.0;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->eval_every = 50;
    o->eval_batches = 8;
    o->sample_tokens = 64;
    o->sample_temperature = 0.8;
    o->keep = 3;
    o->seed = 1337;
    o->ckpt_minutes = 30;
    o->ep = 1;
    o->max_skips = 10;
    o->quant_check_every = 100;
    o->quant_fallback_after = 3;
    o->quant_overflow_max = 0.001;
    o->quant_underflow_max = -1;
    o->quant_counts_after = 3;
    o->quant_check_elements = 1 << 16;
    o->spike_window = 50;
    o->max_rollbacks = 3;
    memset(opts, 0, size);
    memcpy(opts, o, size < sizeof *o ? size : sizeof *o);
    opts->size = size;
}

typedef struct {
    dw_ctx *ctx;
    const dw_train_opts *o;
    dw_engine *eng;
    const dw_graph *g;
    dw_data *train, *val; /* NULL with the caller's callbacks (o->next_batch, o->val_batch) */
    int64_t batches_taken; /* next_batch: micro-batches taken, the data position checkpoints save */
    dw_tokenizer tok;
    char *sample_tok; /* the tokenizer samples go through (sample_tokenizer), found at the first */
    dw_rng rng;       /* sampling */
    uint64_t seed;
    dw_schedule sched;
    int64_t step;     /* optimizer steps done */
    int64_t tokens_seen;
    int64_t accum;    /* micro-batches per step */
    dw_moe_routing moe; /* the MoE layers' routing per step (no layers: none) */
    dw_moe_bias bias;   /* the routers' selection bias (no layers: off) */
    int32_t *x, *y;   /* (B,T) */
    FILE *metrics;
    int64_t ckpt_step; /* step of the newest checkpoint written by this process, -1: none */
    char *recipes_json; /* {linear node: recipe} for state.json (BF16 programs) */
    char *data_abs, *val_abs; /* the patterns made absolute (dw_abs_pattern); val_abs "" for none */
    dw_dp dp;         /* the ranks of a data-parallel job (one rank: the single-process path) */
    dw_guard_skips skips; /* non-finite steps (train/guard.h) */
    dw_qguard *qguard;    /* the quantised layers' checks and fallbacks, or NULL */
    dw_ep *ep;            /* expert parallelism (--ep > 1), or NULL */
    dw_spike spike;       /* loss spikes (train/spike.h; off: zscore 0) */
    dw_amax *amax;        /* fp8_tensor delayed scaling (precision/amax_history.h), or NULL */
    int64_t *ranges;      /* several ranks: (world, 2) every rank's [lo, hi) of the pools, for the
                             checkpoint's index (gathered at the first checkpoint) */
} run;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static dw_status check_opts(dw_ctx *ctx, const dw_graph *g, const dw_train_opts *o, int world) {
    if (!o->data && !o->next_batch) return dw_set_error(ctx, DW_ERR_INVALID, "no training data given (--data)");
    if (o->next_batch && (o->data || o->val))
        return dw_set_error(ctx, DW_ERR_INVALID, "train: give data and val or the next_batch callback, not both");
    if (o->val_batch && !o->next_batch)
        return dw_set_error(ctx, DW_ERR_INVALID, "train: val_batch needs next_batch (data from files has --val)");
    if (!o->out_dir) return dw_set_error(ctx, DW_ERR_INVALID, "no output directory given (--out)");
    if (o->steps < 1 || o->batch < 1 || o->seq < 1 || o->global_batch < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "--steps, --batch, --seq and --global-batch must be >= 1");
    if (world == 1 && o->global_batch % o->batch != 0)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "--global-batch %lld is not a multiple of --batch %lld (accumulation = G/B must be whole)",
                            (long long)o->global_batch, (long long)o->batch);
    if (o->global_batch % (o->batch * world) != 0)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "--global-batch %lld is not a multiple of --batch %lld x %d ranks (each rank's "
                            "accumulation G/(B x ranks) must be whole)",
                            (long long)o->global_batch, (long long)o->batch, world);
    if (!(o->lr > 0) || o->min_lr < 0 || o->min_lr > o->lr)
        return dw_set_error(ctx, DW_ERR_INVALID, "--lr must be > 0 and --min-lr in [0, lr]");
    if (o->warmup < 0 || o->weight_decay < 0 || o->clip < 0 || !(o->eps > 0))
        return dw_set_error(ctx, DW_ERR_INVALID, "--warmup, --weight-decay and --clip must be >= 0");
    if (!(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1))
        return dw_set_error(ctx, DW_ERR_INVALID, "--beta1 and --beta2 must be in [0, 1)");
    if ((unsigned)o->schedule > DW_LR_CONSTANT) return dw_set_error(ctx, DW_ERR_INVALID, "unknown schedule");
    if (o->batch > g->batch || o->seq > g->seq)
        return dw_set_error(ctx, DW_ERR_INVALID, "--batch %lld --seq %lld exceed the engine's capacity %lld x %lld",
                            (long long)o->batch, (long long)o->seq, (long long)g->batch, (long long)g->seq);
    if (!g->model.config_json)
        return dw_set_error(ctx, DW_ERR_INVALID, "the engine's graph carries no config.json to write into checkpoints");
    if (o->eval_every < 0 || o->sample_every < 0 || o->ckpt_every < 0 || o->keep < 0 ||
        o->eval_batches < 1 || o->sample_tokens < 0 || !(o->sample_temperature >= 0))
        return dw_set_error(ctx, DW_ERR_INVALID, "--eval-every, --sample-every, --ckpt-every, --keep, --sample-temp must be >= 0");
    if (!(o->ckpt_minutes >= 0 && o->ckpt_minutes <= 1e7))
        return dw_set_error(ctx, DW_ERR_INVALID, "--ckpt-minutes must be in [0, 1e7] (0: by steps only), got %g",
                            o->ckpt_minutes);
    if (o->max_skips < 0 || o->quant_check_every < 0 || o->quant_fallback_after < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "--max-skips %lld, --quant-check-every %lld and --quant-fallback-after "
                            "%lld must be >= 0", (long long)o->max_skips, (long long)o->quant_check_every,
                            (long long)o->quant_fallback_after);
    if (o->quant_check_elements < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "--quant-check-elements %lld must be >= 0 (0: whole tensors)",
                            (long long)o->quant_check_elements);
    if (!(o->quant_overflow_max <= 1) || !(o->quant_underflow_max <= 1) || o->quant_counts_after < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "--quant-overflow-max %g and --quant-underflow-max %g must be fractions "
                            "<= 1 (negative: off), --quant-counts-after %lld >= 0", o->quant_overflow_max,
                            o->quant_underflow_max, (long long)o->quant_counts_after);
    if (!(o->spike_zscore >= 0 && o->spike_zscore < INFINITY) || o->max_rollbacks < 0 ||
        (o->spike_zscore > 0 && o->spike_window < 2))
        return dw_set_error(ctx, DW_ERR_INVALID, "--spike-zscore %g must be a finite number >= 0 (0: off), "
                            "--spike-window %lld >= 2 and --max-rollbacks %lld >= 0", o->spike_zscore,
                            (long long)o->spike_window, (long long)o->max_rollbacks);
    if (o->fp8_amax_history < 0 || o->fp8_amax_history > (1 << 20))
        return dw_set_error(ctx, DW_ERR_INVALID, "--fp8-amax-history %lld: must be in [0, 1048576] (0: off)",
                            (long long)o->fp8_amax_history);
    return DW_OK;
}

static dw_status mkdirs(dw_ctx *ctx, const char *path) {
    char *p = strdup(path);
    if (!p) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                dw_status st = dw_set_error(ctx, DW_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
                free(p);
                return st;
            }
            *s = c;
            if (!c) break;
        }
    }
    free(p);
    return DW_OK;
}

/* {linear node: recipe} of a BF16 program, for state.json. */
static dw_status describe_recipes(run *r) {
    const dw_compiled *cp = dw_engine_program(r->eng);
    if (!cp->bf16) return DW_OK;
    free(r->recipes_json); /* again after a guardrail fallback */
    r->recipes_json = NULL;
    json_t *rec = json_object();
    for (int i = 0; rec && i < cp->g->n_nodes; i++)
        if (DW_OP_IS(&cp->g->nodes[i], DW_OPF_GEMM))
            json_object_set_new(rec, cp->g->nodes[i].name, json_string(dw_recipe_name(cp->node[i].bind.recipe)));
    r->recipes_json = rec ? json_dumps(rec, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(rec);
    return r->recipes_json ? DW_OK : dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
}

/* config.json: the text the graph was captured from, ending in a newline. */
static dw_status write_config(dw_ctx *ctx, const dw_graph *g, const char *path) {
    const char *text = g->model.config_json;
    size_t n = strlen(text);
    char *line = malloc(n + 2);
    if (!line) return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", path);
    memcpy(line, text, n);
    if (!n || line[n - 1] != '\n') line[n++] = '\n';
    dw_status s = dw_write_file_atomic(ctx, path, line, n);
    free(line);
    return s;
}

/* One rank: config, weights, moments. Several (dw_ckpt_save_ranks): rank 0 the config, the
 * weights (every rank holds them whole) and the index; every rank its shard of the moments, the
 * range of the pools it steps (train/ckpt_shard_io.h). */
static dw_status write_ckpt_files(dw_ctx *ctx, const char *dir, void *user) {
    run *r = user;
    const dw_dp *d = &r->dp;
    char *c = dw_path_join(dir, dw_ckpt_files[0]), *m = dw_path_join(dir, dw_ckpt_files[1]),
         *o = dw_path_join(dir, dw_ckpt_files[2]);
    dw_status st = (c && m && o) ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    if (st == DW_OK && d->rank == 0) st = write_config(ctx, r->g, c);
    if (st == DW_OK && d->rank == 0) st = dw_dp_save_weights(&r->dp, m); /* ZeRO-3: its gathered copy */
    if (st == DW_OK && d->world == 1) st = dw_engine_save_optimizer(r->eng, o);
    if (st == DW_OK && d->world > 1) st = dw_dp_write_moments(&r->dp, dir, r->ranges); /* --ep: by cells */
    free(c);
    free(m);
    free(o);
    return st;
}

static dw_status save_ckpt(run *r, char **path_out) {
    *path_out = NULL;
    DW_TRY(dw_dp_check_weights(&r->dp, r->step)); /* the ranks' weights one; each writes its moments */
    if (r->dp.world > 1 && !r->ranges) {
        if (!(r->ranges = malloc((size_t)r->dp.world * 2 * sizeof *r->ranges)))
            return dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
        r->ranges[2 * r->dp.rank] = r->dp.lo, r->ranges[2 * r->dp.rank + 1] = r->dp.hi;
        DW_TRY(dw_comm_all_gather(r->ctx, r->dp.host, r->ranges, 2, DW_COMM_I64));
    }
    dw_ckpt_state s;
    memset(&s, 0, sizeof s);
    const dw_train_opts *o = r->o;
    s.step = r->step;
    s.total_steps = o->steps;
    s.tokens_seen = r->tokens_seen;
    s.data_position = r->train ? dw_data_position(r->train) : (uint64_t)r->batches_taken;
    s.seed = r->seed;
    s.rng_state = r->rng.s;
    s.schedule = r->sched;
    s.beta1 = o->beta1;
    s.beta2 = o->beta2;
    s.eps = o->eps;
    s.weight_decay = o->weight_decay;
    s.clip = o->clip;
    if ((s.moe_bias_json = dw_moe_bias_json(&r->bias)) == NULL && r->bias.layers) /* NULL: off */
        return dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
    s.batch = o->batch;
    s.seq = o->seq;
    s.global_batch = o->global_batch;
    snprintf(s.data, sizeof s.data, "%s", r->data_abs);
    s.has_run = true;
    snprintf(s.val, sizeof s.val, "%s", r->val_abs);
    s.eval_every = o->eval_every;
    s.eval_batches = o->eval_batches;
    s.ckpt_every = o->ckpt_every;
    s.keep = o->keep;
    snprintf(s.device, sizeof s.device, "%s", dw_ctx_device(r->ctx) == DW_DEVICE_CUDA ? "cuda" : "cpu");
    snprintf(s.tokenizer, sizeof s.tokenizer, "%s", dw_tokenizer_name(r->tok));
    const dw_compiled *cp = dw_engine_program(r->eng);
    snprintf(s.precision, sizeof s.precision, "%s", cp->precision);
    s.policy_json = cp->policy_json;
    s.recipes_json = r->recipes_json;
    char *spike = dw_spike_state_json(&r->spike), *amax = r->amax ? dw_amax_state_json(r->ctx, r->amax) : NULL;
    s.spike_json = spike;
    s.amax_json = amax;
    dw_status st = r->spike.zscore > 0 && !spike ? dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory") : DW_OK;
    if (r->amax && !amax) st = DW_ERR_NOMEM; /* (the message is on ctx) */
    /* said before and after: a large model's checkpoint takes a while (llama-1b's 13 GB: ~90 s on
     * the lent H100 machine's disk), and the step's progress line comes only once it is written */
    const double gb = (double)cp->param_floats * 12 / 1e9, t_save = now_s(); /* FP32 weights, AdamW's two moments */
    if (r->dp.rank == 0)
        DW_LOGI("checkpoint: writing step %lld (%.1f GB of weights and moments) under %s", (long long)r->step, gb,
                o->out_dir);
    if (st == DW_OK) st = dw_ckpt_save_ranks(r->ctx, r->dp.host, o->out_dir, &s, write_ckpt_files, r, o->keep, path_out);
    const double took = now_s() - t_save;
    if (st == DW_OK && r->dp.rank == 0)
        DW_LOGI("checkpoint: step %lld written in %.1f s (%.2f GB/s)", (long long)r->step, took, gb / fmax(took, 1e-9));
    free(spike);
    free(amax);
    DW_TRY(st);
    r->ckpt_step = r->step;
    return DW_OK;
}

/* validate() over the caller's val_batch: up to eval_batches micro-batches from its index 0. */
static dw_status validate_callback(run *r, double *out) {
    const dw_train_opts *o = r->o;
    double sum = 0.0;
    int64_t nb = 0;
    for (bool ended = false; nb < o->eval_batches; nb++) {
        double loss = 0.0;
        DW_TRY(dw_batch_call(r->ctx, o->val_batch, o->batch_user, "val_batch", nb, r->x, r->y, o->batch, o->seq,
                             r->g->model.vocab, &ended));
        if (ended) break;
        DW_TRY(dw_engine_forward(r->eng, r->x, r->y, o->batch, o->seq, NULL, &loss));
        sum += loss;
    }
    if (!nb) return dw_set_error(r->ctx, DW_ERR_INVALID, "val_batch gave no micro-batch (it returned 1 at index 0)");
    sum /= (double)nb;
    DW_TRY(dw_comm_all_reduce(r->ctx, r->dp.host, &sum, 1, DW_COMM_F64, DW_COMM_AVG));
    *out = sum;
    return DW_OK;
}

/* Mean loss over eval_batches micro-batches of the validation data, from its start (each of
 * B x ranks windows, every rank its part; the mean over the ranks). */
static dw_status validate(run *r, double *out) {
    const int64_t B = r->o->batch, T = r->o->seq;
    if (!r->val) return validate_callback(r, out);
    int64_t nb = dw_data_windows(r->val) / (B * r->dp.world);
    if (nb > r->o->eval_batches) nb = r->o->eval_batches;
    if (nb < 1) nb = 1;
    dw_data_seek(r->val, 0);
    double sum = 0.0;
    for (int64_t i = 0; i < nb; i++) {
        double loss = 0.0;
        dw_data_next_rank(r->val, B, r->dp.rank, r->dp.world, r->x, r->y);
        DW_TRY(dw_engine_forward(r->eng, r->x, r->y, B, T, NULL, &loss));
        sum += loss;
    }
    sum /= (double)nb;
    DW_TRY(dw_comm_all_reduce(r->ctx, r->dp.host, &sum, 1, DW_COMM_F64, DW_COMM_AVG));
    *out = sum;
    return DW_OK;
}

/* The tokenizer samples go through: token-id shards with a run tokenizer.json that the library
 * decodes (dw_run_set_tokenizer, before the run starts) go through it, as `deepwell sample RUN`
 * does; else the data's ("bytes" or "ids": batches from a callback stay ids, which Python's
 * Trainer decodes itself). Looked for once, at the first sample (r->sample_tok, freed with r). */
static const char *sample_tokenizer(run *r) {
    if (r->sample_tok) return r->sample_tok;
    if (r->tok != DW_TOK_IDS || !r->train || dw_data_get_kind(r->train) != DW_DATA_SHARDS)
        return dw_tokenizer_name(r->tok);
    char *p = dw_path_join(r->o->out_dir, DW_CKPT_TOKENIZER);
    dw_hf_tokenizer *t = NULL;
    if (p && access(p, R_OK) == 0 && dw_hf_tokenizer_open(r->ctx, p, &t) == DW_OK) {
        dw_hf_tokenizer_free(t);
        return r->sample_tok = p;
    }
    dw_clear_error(r->ctx); /* none, or one the library cannot decode: ids */
    free(p);
    r->sample_tok = strdup(dw_tokenizer_name(r->tok)); /* NULL (out of memory): looked for again */
    return dw_tokenizer_name(r->tok);
}

static dw_status make_sample(run *r, char **text_out) {
    *text_out = NULL;
    const dw_train_opts *o = r->o;
    int32_t *ids = NULL;
    int64_t np = 0;
    const char *tk = sample_tokenizer(r);
    if (o->sample_prompt) {
        DW_TRY(dw_tokenize(r->ctx, tk, o->sample_prompt, r->g->model.vocab, &ids, &np));
    } else { /* the start of the last batch's first sequence: a context like the data's */
        np = o->seq / 4 < 16 ? (o->seq / 4 > 0 ? o->seq / 4 : 1) : 16;
        ids = malloc((size_t)np * sizeof *ids);
        if (ids) memcpy(ids, r->x, (size_t)np * sizeof *ids);
    }
    int32_t *all = ids && np >= 1 ? realloc(ids, (size_t)(np + o->sample_tokens) * sizeof *all) : NULL;
    dw_status st = all ? DW_OK
                   : ids && np < 1 ? dw_set_error(r->ctx, DW_ERR_INVALID, "the sample prompt is empty")
                                   : dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
    if (!all) free(ids);
    if (st == DW_OK) st = dw_engine_generate(r->eng, all, np, o->sample_tokens, o->sample_temperature, 0, &r->rng.s);
    if (st == DW_OK) {
        *text_out = dw_detokenize(tk, all, np + o->sample_tokens);
        if (!*text_out) st = dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
    }
    free(all);
    return st;
}

/* A checkpoint file's path inside cdir, loaded by fn into the engine. The moments of a checkpoint
 * written by several ranks (its index present; dw_ckpt_open checked its files) from their shards,
 * whatever this job's world size and stage (train/ckpt_shard_io.h). */
static dw_status load_into(run *r, const char *cdir, int file, dw_status (*fn)(dw_engine *, const char *)) {
    char *index = file == 2 ? dw_path_join(cdir, DW_CKPT_INDEX) : NULL;
    const bool sharded = index && access(index, F_OK) == 0;
    free(index);
    if (sharded) return dw_ckpt_shards_load(r->eng, cdir);
    char *p = dw_path_join(cdir, dw_ckpt_files[file]);
    dw_status st = p ? fn(r->eng, p) : dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
    free(p);
    return st;
}

/* The training state of checkpoint cdir (state: its state.json) into the run: weights, moments,
 * step, tokens, RNG, data position (the data's own seek is the caller's), the spike window. */
static dw_status restore(run *r, const char *cdir, const dw_ckpt_state *state) {
    DW_TRY(load_into(r, cdir, 1, dw_engine_load_weights));
    DW_TRY(load_into(r, cdir, 2, dw_engine_load_optimizer));
    r->seed = state->seed;
    r->step = state->step;
    r->tokens_seen = state->tokens_seen;
    r->rng.s = state->rng_state;
    r->batches_taken = (int64_t)state->data_position;
    json_t *spike = NULL, *amax = NULL;
    if (r->spike.zscore > 0) DW_TRY(dw_guard_state_key(r->ctx, cdir, "spike", &spike));
    dw_status st = dw_spike_state_load(r->ctx, &r->spike, spike, cdir);
    if (st == DW_OK) st = dw_guard_state_key(r->ctx, cdir, "fp8_amax_history", &amax);
    if (st == DW_OK && amax && !r->amax)
        st = dw_set_error(r->ctx, DW_ERR_INVALID, "%s was trained with --fp8-amax-history %lld (delayed scaling): "
                          "resume it with the same", cdir, (long long)json_integer_value(json_object_get(amax, "length")));
    if (st == DW_OK && r->amax) st = dw_amax_state_load(r->ctx, r->amax, amax, cdir);
    if (st == DW_OK && r->amax) st = dw_engine_refresh(r->eng); /* the weight caches under the histories restored */
    json_decref(spike);
    json_decref(amax);
    return st;
}

/* Everything before the first step: resume state (weights, moments, position, RNG), data, metrics. */
static dw_status setup(run *r) {
    dw_ctx *ctx = r->ctx;
    const dw_train_opts *o = r->o;
    dw_ckpt_state state;
    char *cdir = NULL;
    r->seed = o->seed;
    r->ckpt_step = -1;
    const char *vp = o->val ? o->val : o->data && !strcmp(o->data, "builtin") ? "builtin" : "";
    r->data_abs = dw_abs_pattern(o->next_batch ? DW_DATA_CALLBACK : o->data);
    r->val_abs = dw_abs_pattern(o->val_batch ? DW_DATA_CALLBACK : vp);
    if (!r->data_abs || !r->val_abs) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    DW_TRY(dw_spike_init(ctx, &r->spike, o->spike_zscore, o->spike_window, o->max_rollbacks));
    DW_TRY(dw_amax_open(ctx, r->eng, o->fp8_amax_history, &r->amax)); /* before a resume's weights load */
    if (o->fp8_amax_history > 0 && !r->amax)
        DW_LOGW("--fp8-amax-history %lld: the program has no fp8_tensor linear layer (the block recipes scale from "
                "each block): nothing to delay", (long long)o->fp8_amax_history);
    if (o->resume) {
        DW_TRY(dw_ckpt_open(ctx, o->resume, &cdir, &state));
        dw_status st = dw_resume_check(ctx, cdir, &state, o, r->data_abs, r->val_abs);
        if (st == DW_OK && state.step > o->steps)
            st = dw_set_error(ctx, DW_ERR_INVALID, "%s is at step %lld, beyond --steps %lld", cdir,
                              (long long)state.step, (long long)o->steps);
        if (st == DW_OK) st = restore(r, cdir, &state);
        if (st != DW_OK) {
            free(cdir);
            return st;
        }
    } else {
        r->rng.s = dw_rng_derive(r->seed, 2, 0);
        char *latest = dw_path_join(o->out_dir, "latest");
        bool taken = r->dp.rank == 0 && latest && access(latest, F_OK) == 0;
        free(latest);
        if (taken)
            return dw_set_error(ctx, DW_ERR_INVALID,
                                "%s already holds a run (it has a `latest` checkpoint): resume it with --resume %s or choose another --out",
                                o->out_dir, o->out_dir);
    }
    dw_status st = describe_recipes(r);
    if (st == DW_OK && o->data) {
        dw_data_opts d = {.pattern = o->data, .T = o->seq, .vocab_size = r->g->model.vocab,
                          .shuffle = true, .seed = dw_rng_derive(r->seed, 1, 0)};
        st = dw_data_open(ctx, &d, &r->train);
        if (st == DW_OK && cdir) dw_data_seek(r->train, state.data_position);
    }
    if (st == DW_OK) {
        if (*vp) {
            dw_data_opts d = {.pattern = vp, .val_split = !strcmp(vp, "builtin"), .T = o->seq,
                              .vocab_size = r->g->model.vocab, .shuffle = false, .seed = 0};
            st = dw_data_open(ctx, &d, &r->val);
        }
        r->tok = !r->train || dw_data_get_kind(r->train) == DW_DATA_SHARDS ? DW_TOK_IDS : DW_TOK_BYTES;
    }
    if (st == DW_OK) st = dw_dp_broadcast_weights(&r->dp); /* the ranks start identical */
    if (st == DW_OK) {
        r->accum = o->global_batch / (o->batch * r->dp.world);
        /* a resumed run keeps its schedule's horizon: --steps beyond it run at min_lr */
        r->sched = cdir ? state.schedule
                        : (dw_schedule){.kind = (dw_schedule_kind)o->schedule, .lr = o->lr, .min_lr = o->min_lr,
                                        .warmup = o->warmup, .total = o->steps};
        r->x = malloc((size_t)(o->batch * o->seq) * sizeof *r->x);
        r->y = malloc((size_t)(o->batch * o->seq) * sizeof *r->y);
        if (!r->x || !r->y) st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    if (st == DW_OK && r->dp.rank == 0) st = dw_metrics_open(ctx, o->out_dir, r->step, &r->metrics);
    r->skips.max_skips = o->max_skips;
    if (st == DW_OK) /* a resumed run's fallbacks are applied again before its first step */
        st = dw_qguard_open(ctx, r->eng, r->dp.host, r->dp.rank == 0, o->out_dir, o->quant_check_every,
                            o->quant_fallback_after, o->quant_check_elements,
                            &(dw_qcount_rule){o->quant_overflow_max, o->quant_underflow_max, o->quant_counts_after},
                            cdir ? r->step : 0, &r->qguard);
    if (st == DW_OK && r->qguard) st = describe_recipes(r);
    if (st == DW_OK) st = dw_moe_bias_init(ctx, r->eng, o->moe_bias_update, cdir, &r->bias); /* the checkpoint's b */
    if (st == DW_OK && cdir)
        DW_LOGI("resumed from %s at step %lld of %lld", cdir, (long long)r->step, (long long)o->steps);
    const dw_compiled *cp = dw_engine_program(r->eng);
    const int wcache = cp->grad_arena ? dw_compile_wcache_layers(cp) : 0;
    char caches[96] = "";
    if (wcache)
        snprintf(caches, sizeof caches, ", with the quantised weight caches of %d expert linear layer%s", wcache,
                 wcache == 1 ? "" : "s");
    if (st == DW_OK && cp->grad_arena && r->dp.rank == 0) /* where the memory went (deepwell train's default) */
        DW_LOGI("memory: the FP32 gradients%s in the activation arena%s (dw_compile_opts.grad_arena%s%s)",
                cp->bf16_arena ? " and the BF16 weight copies" : "", caches, cp->bf16_arena ? ", bf16_arena" : "",
                wcache ? ", wcache_arena" : "");
    free(cdir);
    return st;
}

/* One optimizer step: accumulation over G/(B x ranks) micro-batches, the gradients averaged over
 * the ranks, clipping, AdamW. The loss is the mean over the ranks (all saw as many tokens). A loss
 * or gradient norm that is not finite (the same on every rank: both are global) skips the update
 * (*skipped says why); the step still counts: its data is consumed, the schedule moves on and
 * AdamW's bias correction uses the step number, so a resumed run needs no count of skips. */
static dw_status train_step(run *r, double *loss_out, double *norm_out, double *lr_out, const char **skipped) {
    const dw_train_opts *o = r->o;
    DW_TRY(dw_engine_zero_grad(r->eng));
    double sum = 0.0;
    for (int64_t a = 0; a < r->accum; a++) {
        double loss = 0.0;
        if (r->train)
            dw_data_next_rank(r->train, o->batch, r->dp.rank, r->dp.world, r->x, r->y);
        else
            DW_TRY(dw_batch_call(r->ctx, o->next_batch, o->batch_user, "next_batch", r->batches_taken++, r->x, r->y,
                                 o->batch, o->seq, r->g->model.vocab, NULL));
        dw_dp_before_backward(&r->dp, a == r->accum - 1); /* the gradients reduce from its backward */
        DW_TRY(dw_engine_forward_backward(r->eng, r->x, r->y, o->batch, o->seq, dw_dp_grad_scale(&r->dp, r->accum),
                                          &loss));
        DW_TRY(dw_dp_after_backward(&r->dp)); /* the reductions waited for */
        sum += loss;
    }
    double loss = sum / (double)r->accum, lr = dw_schedule_lr(&r->sched, r->step), norm = NAN;
    DW_TRY(dw_comm_all_reduce(r->ctx, r->dp.host, &loss, 1, DW_COMM_F64, DW_COMM_AVG));
    DW_TRY(dw_amax_step(r->amax, r->dp.host)); /* the step's amaxes into the fp8_tensor histories */
    dw_adamw_opts ao = {.size = sizeof ao, .lr = lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
                        .weight_decay = o->weight_decay, .clip = o->clip};
    /* gradients averaged, norm, clipping and AdamW on the engine's device; a non-finite norm
     * changes nothing */
    dw_status st = isfinite(loss) ? dw_dp_step(&r->dp, &ao, r->step + 1, &norm) : DW_OK;
    *skipped = dw_guard_nonfinite(loss, norm);
    if (st == DW_ERR_NUMERIC && *skipped) dw_clear_error(r->ctx), st = DW_OK;
    DW_TRY(st);
    r->step++;
    r->tokens_seen += o->global_batch * o->seq;
    *loss_out = loss;
    *norm_out = norm;
    *lr_out = lr;
    return DW_OK;
}

/* --profile: the last micro-batch timed op by op (3 eager steps after a warm-up) into
 * out_dir/profile.json. After the final checkpoint: the gradients it accumulates are never used. */
static dw_status profile(run *r) {
    const dw_train_opts *o = r->o;
    dw_prof_summary s;
    DW_TRY(dw_prof_run(r->ctx, r->eng, r->x, r->y, o->batch, o->seq, 3, &s));
    char *path = dw_path_join(o->out_dir, "profile.json");
    dw_status st = path ? dw_prof_write_json(r->ctx, &s, path) : dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
    if (st == DW_OK) DW_LOGI("profile: %s (one eager step: %.2f ms)", path, s.total_ms);
    free(path);
    dw_prof_free(&s);
    return st;
}

/* The step's router losses and expert load: the most loaded expert's assignments over the mean
 * (NaN for models without router losses; each loss NaN when not configured); the assignments
 * dropped past capacity over the step's micro-batches and ranks (NaN without MoE layers). */
static dw_status moe_stats(run *r, dw_train_progress *p) {
    p->moe_aux_loss = p->moe_z_loss = p->expert_load = p->moe_dropped = p->moe_dropped_frac = NAN;
    double assigned = 0, dropped = 0;
    DW_TRY(dw_moe_routing_step(r->ctx, r->eng, r->dp.host, &r->moe, &assigned, &dropped));
    if (!p->skipped) DW_TRY(dw_moe_bias_step(r->ctx, r->eng, &r->moe, &r->bias)); /* the global batch's loads */
    p->moe_bias_max = dw_moe_bias_max_abs(&r->bias);
    if (assigned > 0) p->moe_dropped = dropped, p->moe_dropped_frac = dropped / assigned;
    const int64_t E = dw_engine_moe_experts(r->eng);
    if (!E) return DW_OK;
    int64_t *counts = malloc((size_t)E * sizeof *counts);
    if (!counts) return dw_set_error(r->ctx, DW_ERR_NOMEM, "train: out of memory");
    dw_status st = dw_engine_moe_stats(r->eng, &p->moe_aux_loss, &p->moe_z_loss, counts);
    int64_t max = 0, sum = 0;
    for (int64_t e = 0; st == DW_OK && e < E; e++) max = counts[e] > max ? counts[e] : max, sum += counts[e];
    if (sum > 0) p->expert_load = (double)max * (double)E / (double)sum;
    free(counts);
    return st;
}

/* Stop and checkpoint-by-time, agreed by every rank (a signal may reach only some; the clock is
 * rank 0's), so that all of them take the same path. */
static dw_status agree(run *r, bool *stop, bool *due) {
    double f[2] = {*stop ? 1 : 0, *due && r->dp.rank == 0 ? 1 : 0};
    DW_TRY(dw_comm_all_reduce(r->ctx, r->dp.host, f, 2, DW_COMM_F64, DW_COMM_SUM));
    *stop = f[0] > 0, *due = f[1] > 0;
    return DW_OK;
}

/* --max-skips steps in a row were not finite: a checkpoint of the last good state (the skipped
 * steps changed no weight or moment; the step and data position are past them), then the error.
 * written: the checkpoint this step already wrote (rank 0's path), or NULL. */
static dw_status give_up(run *r, const char *written) {
    char *path = NULL;
    if (r->ckpt_step != r->step) DW_TRY(save_ckpt(r, &path));
    const char *at = written ? written : path;
    dw_status st = dw_set_error(r->ctx, DW_ERR_NUMERIC, "step %lld: %lld steps in a row skipped (loss or gradients "
                                "not finite; --max-skips %lld): stopping. %s%s holds the last good weights",
                                (long long)r->step, (long long)r->skips.consecutive, (long long)r->o->max_skips,
                                at ? "checkpoint " : "the checkpoint of this step", at ? at : "");
    free(path);
    return st;
}

/* The data position: windows consumed, or the caller's micro-batches taken. */
static uint64_t data_pos(const run *r) { return r->train ? dw_data_position(r->train) : (uint64_t)r->batches_taken; }
static void data_seek(run *r, uint64_t pos) {
    if (r->train) dw_data_seek(r->train, pos);
    r->batches_taken = (int64_t)pos;
}

/* Step r->step's loss spiked (z; its batch at data positions [from, to)): back to the newest
 * checkpoint this run wrote, that batch to be skipped when the data reaches it again; or, with no
 * checkpoint or after --max-rollbacks, the error that stops the run. */
static dw_status rollback(run *r, double loss, double z, uint64_t from, uint64_t to) {
    dw_ctx *ctx = r->ctx;
    const dw_train_opts *o = r->o;
    const int64_t at = r->step;
    char what[200], name[48];
    snprintf(what, sizeof what, "step %lld: loss spike (loss %.6g, z-score %.3g > --spike-zscore %g over the last %lld "
             "steps)", (long long)at, loss, z, o->spike_zscore, (long long)o->spike_window);
    snprintf(name, sizeof name, "ckpt-%lld", (long long)r->ckpt_step);
    char *path = dw_path_join(o->out_dir, name), *cdir = NULL;
    if (!path) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    dw_status st = DW_OK;
    if (r->ckpt_step < 0)
        st = dw_set_error(ctx, DW_ERR_NUMERIC, "%s: this run wrote no checkpoint to roll back to (--ckpt-every K "
                          "writes them): stopping", what);
    else if (r->spike.rollbacks >= o->max_rollbacks)
        st = dw_set_error(ctx, DW_ERR_NUMERIC, "%s after %lld rollbacks (--max-rollbacks %lld): stopping. %s holds the "
                          "last good state", what, (long long)r->spike.rollbacks, (long long)o->max_rollbacks, path);
    dw_ckpt_state state;
    if (st == DW_OK) st = dw_ckpt_open(ctx, path, &cdir, &state);
    if (st == DW_OK) st = dw_qguard_rewind(r->qguard, o->out_dir, state.step); /* before the weights' refresh */
    if (st == DW_OK) st = restore(r, cdir, &state);
    if (st == DW_OK) st = dw_moe_bias_reload(ctx, r->eng, cdir, &r->bias); /* the routers' selection bias */
    if (st == DW_OK) data_seek(r, state.data_position);
    if (st == DW_OK) st = dw_spike_add_skip(ctx, &r->spike, from, to);
    if (st == DW_OK && r->qguard) st = describe_recipes(r);
    if (st == DW_OK) st = dw_dp_broadcast_weights(&r->dp);
    if (st == DW_OK && r->dp.rank == 0) { /* metrics.jsonl: back to the checkpoint's step, then the rollback */
        fclose(r->metrics);
        r->metrics = NULL;
        st = dw_metrics_open(ctx, o->out_dir, state.step, &r->metrics);
        char zs[40];
        snprintf(zs, sizeof zs, isfinite(z) ? "%.17g" : "null", z);
        if (st == DW_OK && (fprintf(r->metrics, "{\"step\": %lld, \"rollback\": {\"step\": %lld, \"loss\": %.17g, \"z\": %s, "
                                    "\"checkpoint\": \"%s\", \"skip\": [%llu, %llu]}}\n", (long long)state.step,
                                    (long long)at, loss, zs, cdir, (unsigned long long)from,
                                    (unsigned long long)to) < 0 || fflush(r->metrics) != 0))
            st = dw_set_error(ctx, DW_ERR_IO, "%s/metrics.jsonl: write failed", o->out_dir);
    }
    if (st == DW_OK) {
        r->spike.rollbacks++;
        r->skips.consecutive = 0;
        DW_LOGW("%s: rolled back to %s (step %lld); its batch (data position %llu) will be skipped (rollback %lld, "
                "--max-rollbacks %lld)", what, cdir, (long long)state.step, (unsigned long long)from,
                (long long)r->spike.rollbacks, (long long)o->max_rollbacks);
    }
    free(path);
    free(cdir);
    return st;
}

static dw_status loop(run *r) {
    const dw_train_opts *o = r->o;
    const double t0 = now_s();
    double t_ckpt = t0; /* the end of the last checkpoint written (or the start) */
    int64_t first = r->step;
    while (r->step < o->steps) {
        double ts = now_s(), loss = 0, norm = 0, lr = 0;
        const char *skipped = NULL;
        uint64_t from = data_pos(r), to = 0;
        while (dw_spike_take_skip(&r->spike, from, &to)) { /* a batch that spiked the loss before a rollback */
            DW_LOGI("step %lld: skipping the batch at data position %llu (it spiked the loss)", (long long)r->step + 1,
                    (unsigned long long)from);
            data_seek(r, to);
            from = to;
        }
        DW_TRY(train_step(r, &loss, &norm, &lr, &skipped));
        double z = NAN;
        if (!skipped && dw_spike_test(&r->spike, loss, &z)) { /* every rank alike: the loss is their mean */
            DW_TRY(rollback(r, loss, z, from, data_pos(r)));
            if (r->step < first) first = r->step;
            continue;
        }
        if (!skipped) dw_spike_push(&r->spike, loss);
        const bool give_up_now = dw_guard_count(&r->skips, r->step, skipped, loss, norm); /* after reporting it */
        bool changed = false;
        if (!skipped && dw_qguard_due(r->qguard, r->step)) {
            DW_TRY(dw_qguard_check(r->qguard, r->step, r->x, r->y, o->batch, o->seq, &changed));
            if (changed) DW_TRY(describe_recipes(r)); /* the checkpoints' state.json shows the new recipes */
        }
        double t1 = now_s();
        bool last = r->step == o->steps;
        dw_train_progress p = {.step = r->step, .total = o->steps, .loss = loss, .val_loss = NAN,
                               .lr = lr, .grad_norm = norm,
                               .tokens_per_s = (double)(o->global_batch * o->seq) / (t1 - ts),
                               .elapsed_s = t1 - t0, .skipped = skipped,
                               .precision_change = changed ? dw_qguard_last_decisions(r->qguard) : NULL};
        p.eta_s = (t1 - t0) / (double)(r->step - first) * (double)(o->steps - r->step);
        bool fell = false; /* the counters' rule (after the check: its decisions join the check's) */
        DW_TRY(dw_qguard_step_end(r->qguard, r->step, &p.quant_overflow, &p.quant_underflow, &fell));
        if (fell) {
            DW_TRY(describe_recipes(r));
            p.precision_change = dw_qguard_last_decisions(r->qguard);
        }
        DW_TRY(moe_stats(r, &p));
        DW_TRY(dw_dp_report_times(&r->dp, &p)); /* several ranks: each one's communication */
        if ((r->val || o->val_batch) && o->eval_every > 0 && (r->step % o->eval_every == 0 || last))
            DW_TRY(validate(r, &p.val_loss));
        const bool lead = r->dp.rank == 0; /* writes, samples and reports */
        if (lead) DW_TRY(dw_metrics_write(r->ctx, r->metrics, &p, r->tokens_seen));
        char *sample = NULL, *ckpt = NULL;
        dw_status st = DW_OK;
        const bool sample_now = o->sample_every > 0 && o->sample_tokens > 0 && (r->step % o->sample_every == 0 || last);
        if (sample_now) st = dw_dp_gather_experts(&r->dp); /* every rank: rank 0 samples with every expert */
        /* rank 0 alone, or (ZeRO-3's shards, gathered by each forward) every rank, rank 0's kept */
        if (st == DW_OK && (lead || dw_dp_z3_samples_everywhere(&r->dp)) && sample_now) {
            dw_ep_suspend(r->ep, true); /* rank 0 alone: every expert here (ep.h) */
            st = make_sample(r, &sample);
            dw_ep_suspend(r->ep, false);
            if (!lead) free(sample), sample = NULL;
        }
        bool stop = dw_train_stop_requested(); /* also when it came during validation or sampling */
        bool due = o->ckpt_minutes > 0 && now_s() - t_ckpt >= o->ckpt_minutes * 60;
        if (st == DW_OK) st = agree(r, &stop, &due);
        if (st == DW_OK && ((o->ckpt_every > 0 && r->step % o->ckpt_every == 0) || last || stop || due)) {
            st = save_ckpt(r, &ckpt);
            t_ckpt = now_s();
        }
        p.sample = sample;
        p.checkpoint = ckpt;
        if (st == DW_OK && lead && o->progress) o->progress(&p, o->progress_user);
        if (st == DW_OK && give_up_now) st = give_up(r, ckpt);
        free(sample);
        free(ckpt);
        if (st != DW_OK) return st;
        /* one rank: also a request that came during the progress callback (several: the next step's
         * agreement takes it) */
        if (stop || (r->dp.world == 1 && dw_train_stop_requested())) {
            if (r->ckpt_step != r->step) {
                char *path = NULL;
                DW_TRY(save_ckpt(r, &path));
                if (path) DW_LOGI("checkpoint: %s", path);
                free(path);
            }
            DW_LOGI("stopped on request after step %lld of %lld", (long long)r->step, (long long)o->steps);
            break;
        }
    }
    return DW_OK;
}

dw_status dw_train(dw_engine *e, const dw_train_opts *opts) {
    stop_flag = 0;
    dw_ctx *ctx = e->ctx;
    dw_train_opts o;
    dw_train_opts_init(&o, sizeof o);
    if (!opts) return dw_set_error(ctx, DW_ERR_INVALID, "train: no options");
    memcpy(&o, opts, opts->size < sizeof o ? opts->size : sizeof o);
    run r;
    memset(&r, 0, sizeof r);
    DW_TRY(dw_dp_init(&r.dp, e, o.zero, !o.no_overlap)); /* the job's ranks (one: a plain run) */
    dw_status st = check_opts(ctx, e->g, &o, r.dp.world);
    if (st != DW_OK) {
        dw_dp_free(&r.dp);
        return st;
    }
    r.ctx = ctx;
    r.o = &o;
    r.eng = e;
    r.g = e->g;
#if DW_HAVE_CUDA
    if (o.deterministic && dw_ctx_device(ctx) == DW_DEVICE_CUDA) {
        dw_cuda_attention_use("mma"); /* cuDNN's backward is not bit-reproducible */
        DW_LOGI("deterministic: attention through the tensor-core kernels (DW_ATTN=mma)");
    }
#endif
    int lock = -1; /* one run per directory, taken (by rank 0) before anything in it is read or written */
    st = dw_ep_create(e, r.dp.comm, o.ep, &r.ep); /* --ep > 1: the MoE layers' hook */
    if (st == DW_OK) st = dw_dp_set_experts(&r.dp, r.ep); /* ZeRO-0: each rank steps its own experts */
    if (st == DW_OK && r.dp.rank == 0) st = mkdirs(ctx, o.out_dir);
    if (st == DW_OK && r.dp.rank == 0) st = dw_run_lock(ctx, o.out_dir, &lock);
    if (st == DW_OK) st = setup(&r);
    if (st == DW_OK) st = dw_moe_routing_init(ctx, e, &r.moe);
    if (st == DW_OK) st = loop(&r);
    if (st == DW_OK) st = dw_dp_z3_end(&r.dp, o.profile); /* ZeRO-3: whole again unless made for it */
    if (st == DW_OK && o.profile && r.step == o.steps && !dw_train_stop_requested() && r.dp.rank == 0) {
        dw_ep_suspend(r.ep, true); /* rank 0 alone */
        st = profile(&r);
    }
    dw_ep_free(r.ep);
    dw_dp_free(&r.dp);
    if (r.metrics) fclose(r.metrics);
    dw_moe_routing_free(&r.moe);
    dw_moe_bias_free(&r.bias);
    dw_qguard_free(r.qguard);
    dw_spike_free(&r.spike);
    dw_amax_free(r.amax);
    dw_data_free(r.train);
    dw_data_free(r.val);
    free(r.recipes_json);
    free(r.sample_tok);
    free(r.ranges);
    free(r.data_abs);
    free(r.val_abs);
    free(r.x);
    free(r.y);
    dw_run_unlock(o.out_dir, lock);
#if DW_HAVE_CUDA
    if (o.deterministic && dw_ctx_device(ctx) == DW_DEVICE_CUDA) dw_cuda_attention_use(NULL); /* DW_ATTN again */
#endif
    return st;
}
