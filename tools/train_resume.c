/* train_resume.c — a resumed run set up from its record (train_resume.h). Options the library
 * checks against the checkpoint (data, batch shape, schedule, optimizer, eval and checkpoint
 * cadence) are only filled here; the seed, the model and the precision, which it does not check,
 * are compared here. */
#define _POSIX_C_SOURCE 200809L /* strdup, mkstemp */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "train_resume.h"

#define GIVEN(opt) (given[(opt) - O_FIRST])

static const char *const MAY_CHANGE = "a resumed run keeps what it recorded; only --steps, --keep, --device, "
                                      "--out, sampling (kept unless given) and logging may change";

bool train_resume_merge(const char *cmd, const run_record *r, const bool *given, dw_train_opts *o,
                        const char **device) {
    if (GIVEN(O_MODEL)) {
        cli_error(cmd, "--model: a resumed run's model is its checkpoint's (%s/config.json); drop --model",
                  r->ckpt_dir);
        return false;
    }
    if (GIVEN(O_SEED) && o->seed != r->seed) {
        cli_error(cmd, "%s was trained with --seed %llu; --seed %llu contradicts it (%s)", r->ckpt_dir,
                  (unsigned long long)r->seed, (unsigned long long)o->seed, MAY_CHANGE);
        return false;
    }
    if (!GIVEN(O_OUT) && !r->run_dir) {
        cli_error(cmd, "--out is needed: %s is not the newest checkpoint of a run directory, so resuming "
                  "it there would rewrite that run's later steps", r->ckpt_dir);
        return false;
    }
    o->seed = r->seed;
    if (!GIVEN(O_OUT)) o->out_dir = r->run_dir;
    if (!GIVEN(O_DATA)) o->data = r->data;
    if (!GIVEN(O_STEPS)) o->steps = r->total_steps;
    if (!GIVEN(O_BATCH)) o->batch = r->batch;
    if (!GIVEN(O_SEQ)) o->seq = r->seq;
    if (!GIVEN(O_GB)) o->global_batch = r->global_batch;
    if (!GIVEN(O_LR)) o->lr = r->lr;
    if (!GIVEN(O_MINLR)) o->min_lr = r->min_lr;
    if (!GIVEN(O_WARMUP)) o->warmup = r->warmup;
    if (!GIVEN(O_SCHED)) {
        static const char *names[] = {"cosine", "linear", "constant"};
        for (int i = 0; i < 3; i++)
            if (!strcmp(r->schedule, names[i])) o->schedule = (dw_lr_schedule)i;
    }
    if (!GIVEN(O_WD)) o->weight_decay = r->weight_decay;
    if (!GIVEN(O_CLIP)) o->clip = r->clip;
    if (!GIVEN(O_B1)) o->beta1 = r->beta1;
    if (!GIVEN(O_B2)) o->beta2 = r->beta2;
    if (!r->has_run) return true; /* an older record: the rest from the command line */
    if (!GIVEN(O_VAL)) o->val = *r->val ? r->val : NULL;
    if (!GIVEN(O_EVAL)) o->eval_every = r->eval_every;
    if (!GIVEN(O_EVALB)) o->eval_batches = r->eval_batches;
    if (!GIVEN(O_CKPT)) o->ckpt_every = r->ckpt_every;
    if (!GIVEN(O_KEEP)) o->keep = (int)r->keep;
    if (!GIVEN(O_DEVICE)) *device = r->device;
    if (!r->has_sampling) return true; /* a run from before sampling.json: the command line's */
    if (!GIVEN(O_SAMPLE)) o->sample_every = r->sample_every;
    if (!GIVEN(O_SAMPLEN)) o->sample_tokens = r->sample_tokens;
    if (!GIVEN(O_SAMPLET)) o->sample_temperature = r->sample_temp;
    if (!GIVEN(O_PROMPT)) o->sample_prompt = r->sample_prompt;
    return true;
}

/* A policy from JSON text, through a temporary file (dw_policy_load reads files). */
static dw_status policy_from_text(dw_ctx *ctx, const char *text, dw_policy **out) {
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/deepwell-policy-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) return DW_ERR_IO;
    size_t n = strlen(text);
    bool ok = write(fd, text, n) == (ssize_t)n;
    ok = close(fd) == 0 && ok;
    dw_status st = ok ? dw_policy_load(ctx, path, out) : DW_ERR_IO;
    unlink(path);
    return st;
}

static bool same_policy(dw_ctx *ctx, const dw_policy *p, const char *recorded) {
    char *text = NULL;
    if (!p || !recorded) return !p && !recorded;
    if (dw_policy_to_json(ctx, p, &text) != DW_OK) return false;
    json_t *a = json_loads(text, 0, NULL), *b = json_loads(recorded, 0, NULL);
    bool same = a && b && json_equal(a, b);
    json_decref(a), json_decref(b);
    dw_free_string(text);
    return same;
}

bool train_resume_policy(const char *cmd, dw_ctx *ctx, const run_record *r, const bool *given, const char *flags,
                         dw_policy **pol) {
    if (!GIVEN(O_PRECISION) && !GIVEN(O_POLICY) && !GIVEN(O_FALLBACK)) {
        if (!r->policy_json && dw_ctx_device(ctx) == DW_DEVICE_CUDA) /* FP32 trains on the CPU engine only */
            fprintf(stderr, "deepwell %s: note: %s was trained in fp32 on the %s; the CUDA engine trains in bf16, "
                    "so the run continues in bf16 (--device cpu keeps fp32)\n",
                    cmd, r->ckpt_dir, r->device ? r->device : "cpu");
        if (!r->policy_json) return true; /* FP32, or BF16 on CUDA (dw_model_open's default there) */
        dw_status st = policy_from_text(ctx, r->policy_json, pol);
        if (st != DW_OK) cli_error(cmd, "%s/state.json: its policy: %s", r->ckpt_dir, dw_errmsg(ctx));
        return st == DW_OK;
    }
    if (same_policy(ctx, *pol, r->policy_json)) return true;
    cli_error(cmd, "%s was trained in precision %s%s%s; %s contradicts it (%s)", r->ckpt_dir, r->precision,
              r->policy_json ? ", policy " : "", r->policy_json ? r->policy_json : "",
              flags, MAY_CHANGE);
    return false;
}

void train_resume_print(const char *cmd, const run_record *r, const bool *given, const dw_train_opts *o,
                        const char *device) {
    static const char *names[] = {"cosine", "linear", "constant"};
    const char *kind = names[o->schedule];
    fprintf(stderr,
            "deepwell %s: resuming %s at step %lld of %lld with what it recorded:\n"
            "  data %s, validation %s; batch %lld x seq %lld, global batch %lld; seed %llu\n"
            "  schedule %s: lr %g -> min-lr %g, warmup %lld, ends at step %lld; AdamW weight decay %g, clip %g, "
            "betas %g/%g\n"
            "  precision %s; device %s%s; eval every %lld (%lld batches); checkpoint every %lld, keep %d%s; out %s\n",
            cmd, r->ckpt_dir, (long long)r->step, (long long)r->total_steps, o->data, o->val ? o->val : "none",
            (long long)o->batch, (long long)o->seq, (long long)o->global_batch, (unsigned long long)o->seed, kind,
            o->lr, o->min_lr, (long long)o->warmup, (long long)r->horizon, o->weight_decay, o->clip, o->beta1,
            o->beta2, r->precision, device, GIVEN(O_DEVICE) ? " (given)" : "", (long long)o->eval_every,
            (long long)o->eval_batches, (long long)o->ckpt_every, o->keep, GIVEN(O_KEEP) ? " (given)" : "",
            o->out_dir);
    if (o->sample_every > 0)
        fprintf(stderr, "  samples every %lld steps: %lld tokens at temperature %g, prompt %s%s\n",
                (long long)o->sample_every, (long long)o->sample_tokens, o->sample_temperature,
                o->sample_prompt ? o->sample_prompt : "(default)",
                GIVEN(O_SAMPLE) || GIVEN(O_SAMPLEN) || GIVEN(O_SAMPLET) || GIVEN(O_PROMPT) ? " (given)" : "");
    else
        fprintf(stderr, "  samples: none%s\n", GIVEN(O_SAMPLE) ? " (given)" : "");
    const long long n = o->steps, h = r->horizon;
    if (n > h && o->schedule != DW_LR_CONSTANT)
        fprintf(stderr, "  steps: to %lld, beyond the schedule's end: it keeps its shape (ending at step %lld) and "
                        "steps %lld-%lld run at min-lr %g\n", n, h, h + 1, n, o->min_lr);
    else if (n > h)
        fprintf(stderr, "  steps: to %lld, beyond the schedule's end at %lld: the constant lr %g continues\n", n, h,
                o->lr);
    else if (n < h)
        fprintf(stderr, "  steps: to %lld, stopping before the schedule ends at step %lld\n", n, h);
    else
        fprintf(stderr, "  steps: to %lld, where the schedule ends\n", n);
    if (n <= r->step) fprintf(stderr, "  nothing to run: the run is at step %lld already (extend it with --steps N)\n", n);
    if (!r->has_run)
        fprintf(stderr, "  note: %s was written before runs recorded validation, eval and checkpoint cadence, "
                        "--keep and the device: they come from this command line\n", r->ckpt_dir);
}
