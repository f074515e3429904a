/* schedule.c — learning-rate schedules: linear warmup, then cosine, linear or constant. */
#include <math.h>
#include <string.h>

#include "train/optim.h"

static const char *const names[DW_SCHED_COUNT] = {"cosine", "linear", "constant"};

const char *dw_schedule_name(dw_schedule_kind k) {
    return (unsigned)k < DW_SCHED_COUNT ? names[k] : "?";
}

bool dw_schedule_parse(const char *name, dw_schedule_kind *out) {
    for (int i = 0; i < DW_SCHED_COUNT; i++)
        if (name && !strcmp(name, names[i])) {
            *out = (dw_schedule_kind)i;
            return true;
        }
    return false;
}

double dw_schedule_lr(const dw_schedule *s, int64_t step) {
    if (step < s->warmup) return s->lr * (double)(step + 1) / (double)s->warmup;
    if (s->kind == DW_SCHED_CONSTANT) return s->lr;
    int64_t span = s->total - 1 - s->warmup;
    double p = span > 0 ? (double)(step - s->warmup) / (double)span : 1.0;
    if (p > 1.0) p = 1.0;
    if (s->kind == DW_SCHED_LINEAR) return s->lr + (s->min_lr - s->lr) * p;
    return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}
