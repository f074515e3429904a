/* resume_check.c — a resumed run's options must agree with what its checkpoint recorded
 * (resume_check.h); each refusal names the option and both values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/resume_check.h"

static const char *const TAIL = "a resumed run keeps what it recorded; only --steps, --keep, --device, "
                                "--out, sampling and logging may change";

/* The shortest "%g" text that reads back as v. */
static void fmt_num(char *b, size_t n, double v) {
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(b, n, "%.*g", prec, v);
        if (strtod(b, NULL) == v) return;
    }
}

static dw_status contradicts(dw_ctx *ctx, const char *cdir, const char *flag, const char *was, const char *now) {
    return dw_set_error(ctx, DW_ERR_INVALID, "%s was trained with %s %s; %s %s contradicts it (%s)", cdir, flag,
                        *was ? was : "(none)", flag, *now ? now : "(none)", TAIL);
}

static dw_status same_i64(dw_ctx *ctx, const char *cdir, const char *flag, int64_t was, int64_t now) {
    if (was == now) return DW_OK;
    char a[32], b[32];
    snprintf(a, sizeof a, "%lld", (long long)was);
    snprintf(b, sizeof b, "%lld", (long long)now);
    return contradicts(ctx, cdir, flag, a, b);
}

static dw_status same_num(dw_ctx *ctx, const char *cdir, const char *flag, double was, double now) {
    if (was == now) return DW_OK;
    char a[40], b[40];
    fmt_num(a, sizeof a, was);
    fmt_num(b, sizeof b, now);
    return contradicts(ctx, cdir, flag, a, b);
}

static dw_status same_str(dw_ctx *ctx, const char *cdir, const char *flag, const char *was, const char *now) {
    return strcmp(was, now) ? contradicts(ctx, cdir, flag, was, now) : DW_OK;
}

dw_status dw_resume_check(dw_ctx *ctx, const char *cdir, const dw_ckpt_state *s, const dw_train_opts *o,
                          const char *data_abs, const char *val_abs) {
    char *was_data = dw_abs_pattern(s->data); /* records before absolute patterns: as the cwd reads them */
    if (!was_data) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    dw_status st = same_str(ctx, cdir, "--data", was_data, data_abs);
    free(was_data);
    DW_TRY(st);
    DW_TRY(same_i64(ctx, cdir, "--batch", s->batch, o->batch));
    DW_TRY(same_i64(ctx, cdir, "--seq", s->seq, o->seq));
    DW_TRY(same_i64(ctx, cdir, "--global-batch", s->global_batch, o->global_batch));
    DW_TRY(same_str(ctx, cdir, "--schedule", dw_schedule_name(s->schedule.kind),
                    dw_schedule_name((dw_schedule_kind)o->schedule)));
    DW_TRY(same_num(ctx, cdir, "--lr", s->schedule.lr, o->lr));
    DW_TRY(same_num(ctx, cdir, "--min-lr", s->schedule.min_lr, o->min_lr));
    DW_TRY(same_i64(ctx, cdir, "--warmup", s->schedule.warmup, o->warmup));
    DW_TRY(same_num(ctx, cdir, "--weight-decay", s->weight_decay, o->weight_decay));
    DW_TRY(same_num(ctx, cdir, "--clip", s->clip, o->clip));
    DW_TRY(same_num(ctx, cdir, "--beta1", s->beta1, o->beta1));
    DW_TRY(same_num(ctx, cdir, "--beta2", s->beta2, o->beta2));
    DW_TRY(same_num(ctx, cdir, "eps", s->eps, o->eps));
    if (!s->has_run) return DW_OK; /* written before the run record: the rest is the caller's */
    DW_TRY(same_str(ctx, cdir, "--val", s->val, val_abs));
    DW_TRY(same_i64(ctx, cdir, "--eval-every", s->eval_every, o->eval_every));
    DW_TRY(same_i64(ctx, cdir, "--eval-batches", s->eval_batches, o->eval_batches));
    DW_TRY(same_i64(ctx, cdir, "--ckpt-every", s->ckpt_every, o->ckpt_every));
    return DW_OK;
}
